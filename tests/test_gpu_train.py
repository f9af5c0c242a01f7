"""Training on the GPU (marker ``gpu``): Blocks on the GPU, per-step parity with PyTorch, a full epoch's
accuracy, and the captured (CUDA graph) step against the eager one."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon
from dnnbind.graph import CapturedStep, CaptureError, RecordedStep

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from models.simple_cnn import SimpleCNN, to_torch  # noqa: E402


def _mnist(train=True):
    from dnnbind.gluon.data.vision import MNIST
    try:
        ds = MNIST(train=train)
    except FileNotFoundError as exc:
        pytest.skip(f"MNIST not available: {exc}")
    return ds.data.transpose(0, 3, 1, 2).astype(np.float32) / 255.0, ds.label.astype(np.int32)


def _net(dev, seed=0):
    np.random.seed(seed)
    net = SimpleCNN()
    net.initialize(mx.init.TorchDefault(), ctx=dev)
    net(mx.zeros((2, 1, 28, 28), device=dev))
    return net


def test_block_forward_backward_on_gpu_matches_cpu():
    x = np.random.default_rng(0).random((8, 1, 28, 28), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 8).astype(np.int32)
    grads = {}
    for dev in (mx.cpu(), mx.gpu(0)):
        net = _net(dev)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        with autograd.record():
            loss = loss_fn(net(mx.array(x, device=dev)), mx.array(y, device=dev))
        loss.backward()
        paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
        grads[dev.kind] = {k: p.grad().numpy() for k, p in paths}
        grads[dev.kind + "_loss"] = loss.numpy()
    np.testing.assert_allclose(grads["gpu_loss"], grads["cpu_loss"], rtol=1e-4, atol=1e-5)
    for k in grads["cpu"]:
        np.testing.assert_allclose(grads["gpu"][k], grads["cpu"][k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_parity_with_pytorch_50_steps():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x_all, y_all = _mnist()
    dev = mx.gpu(0)
    net = _net(dev, seed=3)
    tnet = to_torch(net)
    params = net.collect_params()
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    topt = torch.optim.SGD(tnet.parameters(), lr=0.01, momentum=0.9)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    for step in range(50):
        idx = rng.integers(0, len(y_all), 64)
        xb, yb = x_all[idx], y_all[idx]
        with autograd.record():
            loss = loss_fn(net(mx.array(xb, device=dev)), mx.array(yb, device=dev))
        loss.backward()
        trainer.step(64)
        ours = float(loss.mean().item())
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(xb).cuda()), torch.from_numpy(yb).long().cuda())
        tl.backward()
        topt.step()
        assert abs(ours - tl.item()) <= 1e-4 * abs(tl.item()), f"step {step}: dnnbind {ours} torch {tl.item()}"


def _train_epoch(net, x_all, y_all, dev, seed=1):
    from dnnbind.gluon.data import DeviceDataLoader
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    loader = DeviceDataLoader((x_all * 255).round().astype(np.uint8).transpose(0, 2, 3, 1), y_all, 64, dev,
                              seed=seed)
    loader.reset(1)
    for data, label in loader:
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(64)
    return trainer


def _accuracy(net, dev):
    x, y = _mnist(train=False)
    correct = 0
    for i in range(0, len(y), 1000):
        correct += int((net(mx.array(x[i:i + 1000], device=dev)).numpy().argmax(1) == y[i:i + 1000]).sum())
    return correct / len(y)


def test_full_epoch_reaches_accuracy():
    x_all, y_all = _mnist()
    dev = mx.gpu(0)
    net = _net(dev, seed=1)
    _train_epoch(net, x_all, y_all, dev)
    acc = _accuracy(net, dev)
    print(f"accuracy after 1 epoch: {100 * acc:.2f}%")
    assert acc >= 0.975


def _sgd_setup(dev, seed, batch, data_seed):
    """SimpleCNN, an SGD Trainer, the loss and one random batch resident on ``dev``."""
    net = _net(dev, seed=seed)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    rng = np.random.default_rng(data_seed)
    x = mx.array(rng.random((batch, 1, 28, 28), dtype=np.float32), device=dev)
    y = mx.array(rng.integers(0, 10, batch).astype(np.int32), device=dev)
    return net, trainer, gluon.loss.SoftmaxCrossEntropyLoss(), x, y


def _step_fn(net, trainer, loss_fn, x, y):
    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        return loss
    return step


@pytest.mark.parametrize("replay", [CapturedStep, RecordedStep])
def test_replayed_step_matches_eager_and_refuses_shape_change(tmp_path, replay):
    """A captured (CUDA graph) or recorded (host-replayed) step gives what the eager steps give."""
    from dnnbind.ops.algos import optimize_for
    mx.set_conv_algo_policy("time", deterministic=True)
    # The eager run chooses conv algorithms for the objective the replay uses (a CUDA graph: GPU time; a
    # recorded step: eager wall time), so both runs execute the same deterministic kernels.
    try:
        with optimize_for("graph" if replay is CapturedStep else "eager"):
            dev = mx.gpu(0)
            rng = np.random.default_rng(5)
            batches = [(rng.random((64, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 64).astype(np.int32))
                       for _ in range(5)]
            results = []
            for captured in (False, True):
                net = _net(dev, seed=7)
                trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
                loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
                x, y = mx.empty((64, 1, 28, 28), device=dev), mx.empty((64,), np.int32, device=dev)
                step = _step_fn(net, trainer, loss_fn, x, y)
                if captured:
                    step = replay(step, inputs=[x, y], preserve=trainer.state_arrays())
                losses = []
                for xb, yb in batches:
                    x.copy_(xb)
                    y.copy_(yb)
                    losses.append(step().numpy().copy())
                paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
                results.append(({k: p.data().numpy() for k, p in paths}, losses))
            (pe, le), (pc, lc) = results
            for a, b in zip(le, lc):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
            for k in pe:
                np.testing.assert_allclose(pe[k], pc[k], rtol=1e-6, atol=1e-7, err_msg=k)
            # replay after load_parameters uses the loaded weights (load copies into the captured buffers)
            path = str(tmp_path / "w.params")
            net.save_parameters(path)
            saved = {k: p.data().numpy() for k, p in net.collect_params().items()}
            step()  # the weights move on
            net.load_parameters(path, ctx=dev)
            for k, p in net.collect_params().items():
                np.testing.assert_array_equal(p.data().numpy(), saved[k])
            expected = loss_fn(net(x), y).numpy()  # eager forward from the loaded weights
            np.testing.assert_allclose(step().numpy(), expected, rtol=1e-6, atol=1e-7)
            # a changed input shape is refused before launch
            step.inputs[0] = mx.empty((32, 1, 28, 28), device=dev)
            with pytest.raises(CaptureError, match="shape changed"):
                step()
    finally:
        mx.set_conv_algo_policy("time", deterministic=False)


def test_traced_training_step_lists_the_library_calls_in_order():
    dev = mx.gpu(0)
    net, trainer, loss_fn, x, y = _sgd_setup(dev, seed=2, batch=64, data_seed=0)
    step = _step_fn(net, trainer, loss_fn, x, y)
    for _ in range(3):
        step()
    mx.synchronize(dev)
    start, end = mx.Event(dev), mx.Event(dev)

    def timed(traced: bool):
        start.record()
        if traced:
            with mx.trace() as tr:
                step()
        else:
            tr = None
            step()
        end.record()
        end.synchronize()
        return end.elapsed_ms(start) * 1e3, tr

    plain_us = min(timed(False)[0] for _ in range(3))  # the step as it runs untraced
    step_us, t = timed(True)  # tracing adds host work between calls (events; CUPTI when installed)
    calls = [r for r in t.records if r.library in ("cudnn", "cublas", "kernel")]
    fns = [r.function for r in calls]
    # A conv runs either its legacy call or a backend-API plan (cudnnBackendExecute), whichever was faster:
    # two forward convs before the softmax, backward data once and backward filter twice after it
    conv_fns = ("cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter",
                "cudnnBackendExecute")
    convs = [i for i, f in enumerate(fns) if f in conv_fns]
    softmax = fns.index("cudnnSoftmaxForward")
    assert len(convs) == 5 and convs[1] < softmax < convs[2], [fns[i] for i in convs]
    assert [calls[i].op for i in convs[:2]] == ["conv_forward"] * 2 and calls[convs[2]].op == "conv_backward_data"
    ops = [r.op for r in calls]
    # nd.relu is the table's relu: a generated kernel by default, cudnnActivationForward with
    # DNNBIND_ND_LIBRARY=cudnn; either way the trace names the op
    relu_ops = ("relu", "activation_forward")
    forward = [("relu" if op in relu_ops else op) for i, op in enumerate(ops)
               if op in ("conv_forward", "pooling_forward", *relu_ops) and (i == 0 or ops[i - 1] != op)]
    assert forward[:6] == ["conv_forward", "relu", "pooling_forward"] * 2, forward  # one entry per op
    for expected in ("cudnnSoftmaxForward", "cublasSgemm_v2", "cublasSgemv_v2"):
        assert expected in fns, f"{expected} missing from {fns}"
    # 2x2 max pooling runs ops.pooling's NVRTC kernels (cuDNN for other windows)
    assert any(f.startswith("dn_maxpool_bwd<") for f in fns) and "pooling_backward" in ops, (fns, ops)
    assert fns[-1] == "sgd_mom_f32", fns  # SGD with momentum: one fused kernel over the flat buffers, last
    assert "cudnnActivationBackward" in fns or "_relu_backward" in ops, (fns, ops)
    assert convs[-1] < len(fns) - 1  # the optimizer update comes last
    # every call that queues GPU work has a GPU time (its kernels' with CUPTI), and the CUDA-event times around
    # the calls (event_us, kept either way) account for the step
    gpu = [r.gpu_us for r in t.records if r.library in ("cudnn", "cublas", "kernel") and r.gpu_us is not None]
    assert gpu and all(v > 0 for v in gpu)
    events = [r.event_us for r in t.records if r.library in ("cudnn", "cublas", "kernel") and r.event_us is not None]
    # the event times account for much of an untraced step, and cannot add up to more than the traced one
    assert 0.2 * plain_us <= sum(events) <= 1.05 * step_us, (sum(events), plain_us, step_us)
    assert sum(gpu) <= sum(events) * 1.01  # kernel time is inside the event windows
    assert "simplecnn" in str(t) and "conv1" in str(t)


@pytest.mark.parametrize("replay", [CapturedStep, RecordedStep])
def test_custom_kernel_inside_a_replayed_step_replays(replay):
    from dnnbind import kernels
    add2 = kernels.compile(r'''
extern "C" __global__ void add2_kernel(float* c, const float* a, const float* b, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) c[i] = a[i] + b[i];
}''', "add2_kernel")
    dev = mx.gpu(0)
    n = 1000
    a, b = mx.zeros((n,), device=dev), mx.ones((n,), device=dev)

    def step():
        c = mx.empty((n,), device=dev)
        add2.launch((n + 255) // 256, 256, (c, a, b, n))
        return c

    captured = replay(step, inputs=[a, b], warmup=1)
    for k in range(3):
        host = np.random.default_rng(k).random(n, dtype=np.float32)
        a.copy_(host)
        np.testing.assert_allclose(captured().numpy(), host + 1.0, rtol=0, atol=0)


@pytest.mark.parametrize("grad_req", ["write", "add"])
def test_shared_parameters_and_grad_req_on_gpu_match_cpu(grad_req):
    """A layer used twice gets the sum of both gradients (no direct write); 'add' accumulates across passes."""
    from dnnbind.gluon import nn
    x = np.random.default_rng(3).random((5, 1, 6, 6), dtype=np.float32)
    out = {}
    for dev in (mx.cpu(), mx.gpu(0)):
        np.random.seed(4)
        conv = nn.Conv2D(1, kernel_size=3, padding=1)
        dense = nn.Dense(4)
        conv.initialize(mx.init.TorchDefault(), ctx=dev)
        dense.initialize(mx.init.TorchDefault(), ctx=dev)
        xa = mx.array(x, device=dev)
        conv(xa), dense(xa.reshape((5, -1)))
        params = list(conv.collect_params().values()) + list(dense.collect_params().values())
        for p in params:
            p.grad_req = grad_req
        for _ in range(2):
            with autograd.record():
                y = dense(conv(conv(xa)).reshape((5, -1)))  # conv applied twice: shared weights
                loss = (y * y).sum()
            loss.backward()
        out[dev.kind] = [p.grad().numpy() for p in params]
    for a, b in zip(out["cpu"], out["gpu"]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_fused_conv_bias_relu_matches_separate_ops():
    """SimpleCNN(fuse_relu=True) (cudnnConvolutionBiasActivationForward) = the seed's conv, bias, relu."""
    dev = mx.gpu(0)
    x = np.random.default_rng(8).random((16, 1, 28, 28), dtype=np.float32)
    y = np.random.default_rng(9).integers(0, 10, 16).astype(np.int32)
    res = []
    for fuse in (False, True):
        np.random.seed(11)
        net = SimpleCNN(fuse_relu=fuse)
        net.initialize(mx.init.TorchDefault(), ctx=dev)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        with autograd.record():
            loss = loss_fn(net(mx.array(x, device=dev)), mx.array(y, device=dev))
        loss.backward()
        paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
        res.append((loss.numpy(), {k: p.grad().numpy() for k, p in paths}))
    np.testing.assert_allclose(res[1][0], res[0][0], rtol=1e-5, atol=1e-6)
    for k in res[0][1]:
        np.testing.assert_allclose(res[1][1][k], res[0][1][k], rtol=1e-4, atol=1e-6, err_msg=k)
    from dnnbind.ops import reference as R
    xa, w, b = (np.random.default_rng(s).standard_normal(sh).astype(np.float32)
                for s, sh in ((1, (4, 3, 9, 9)), (2, (5, 3, 3, 3)), (3, (5,))))
    ref = R.activation_forward(R.conv_forward(xa.astype(float), w.astype(float), b.astype(float), padding=1), "relu")
    got = mx.conv_bias_relu_forward(mx.array(xa, device=dev), mx.array(w, device=dev), mx.array(b, device=dev),
                                    padding=1)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_recorded_step_lists_its_calls_and_refuses_host_copies():
    dev = mx.gpu(0)
    net, trainer, loss_fn, x, y = _sgd_setup(dev, seed=2, batch=16, data_seed=9)
    step = RecordedStep(_step_fn(net, trainer, loss_fn, x, y), inputs=[x, y], preserve=trainer.state_arrays())
    calls = step.calls
    convs = [c for c in calls if c.startswith("cudnnConvolution") or c == "cudnnBackendExecute"]
    assert len(convs) == 5, calls  # 2 forward, 1 backward data (not for the first layer), 2 backward filter
    assert any(c.startswith("cublasSgemm") for c in calls)
    assert not any("Get" in c or "Create" in c for c in calls)
    w0 = {k: p.data().numpy() for k, p in net.collect_params().items()}
    losses = [step().numpy().copy() for _ in range(3)]
    assert all(np.isfinite(v).all() for v in losses) and not np.array_equal(losses[0], losses[2])
    assert any(not np.array_equal(w0[k], p.data().numpy()) for k, p in net.collect_params().items())
    with mx.trace() as t:  # a replay inside a trace lists the recorded library calls, with GPU times
        step()
    traced = [r.function for r in t.records if r.library in ("cudnn", "cublas")]
    assert traced == [c for c in calls if c.startswith(("cudnn", "cublas"))], traced
    assert all(r.gpu_us is not None for r in t.records if r.function.startswith("cublasSgemm"))
    step.close()

    def bad():
        loss = loss_fn(net(x), y)
        loss.numpy()  # a host copy cannot be replayed (its numpy buffer is gone by then)
        return loss
    with pytest.raises(CaptureError, match="host"):
        RecordedStep(bad, inputs=[x, y], warmup=1)


def test_training_step_helper_replays_like_eager_and_refuses_other_shapes():
    """graph.training_step (the Block-API helper train.py --graph/--record use): host and graph replays give
    the eager losses; the conv algorithms may differ between objectives, hence the tolerance."""
    from dnnbind.graph import training_step
    dev = mx.gpu(0)
    rng = np.random.default_rng(11)
    batches = [(rng.random((32, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 32).astype(np.int32))
               for _ in range(4)]
    losses = {}
    for replay in (None, "host", "graph"):
        net = _net(dev, seed=3)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        if replay is None:
            out = []
            for xb, yb in batches:
                x, y = mx.array(xb, device=dev), mx.array(yb, device=dev)
                out.append(_step_fn(net, trainer, loss_fn, x, y)().numpy().copy())
        else:
            step = training_step(net, loss_fn, trainer, (32, 1, 28, 28), replay=replay, device=dev)
            out = [step(mx.array(xb, device=dev), yb).numpy().copy() for xb, yb in batches]
            with pytest.raises(CaptureError, match="recorded for"):
                step(mx.array(batches[0][0][:16], device=dev), batches[0][1][:16])
        losses[replay] = out
    for replay in ("host", "graph"):
        for a, b in zip(losses[None], losses[replay]):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5, err_msg=replay)
    assert not np.allclose(losses[None][0], losses[None][-1])  # the weights did move


@pytest.mark.parametrize("flag", ["--graph", "--record"])
def test_train_script_with_a_recorded_step_learns(tmp_path, flag):
    import subprocess
    _mnist()  # skips without MNIST
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), flag, "--device", "gpu", "--epochs", "1",
           "--limit", "12800", "--no-progress", "--out-dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recorded the training step" in r.stdout
    import json
    with open(tmp_path / "metrics.json") as f:
        history = json.load(f)
    assert history[-1]["test_acc"] > 0.85, (history, r.stdout[-2000:])  # 200 steps of SGD reach ~94%
