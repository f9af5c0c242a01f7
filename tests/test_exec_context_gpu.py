"""Every family of GPU call runs on its own device whatever device is current (needs 2 GPUs).

Before each call the *other* GPU is made current behind dnnbind's back, with a raw ``cudaSetDevice`` (what
torch.cuda.set_device or another library does). Each family then runs on gpu(d) and its result is compared with the
same computation on the cpu (float64 numpy or dnnbind's cpu backend): allocation, host and peer copies, memset,
NVRTC kernels (element-wise, reductions, a user kernel), cuDNN, cuBLAS, NCCL, a hybridized Block's replay and a
captured training step. The CPU half, tests/test_exec_context.py, checks the source for the same rule.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind._lib import cudart
from dnnbind.gluon import nn

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(mx.num_gpus() < 2, reason="needs 2 GPUs (the other one is made current)")]

RNG = np.random.default_rng(2026)
DEVICES = [0, 1]


def other_current(d: int) -> None:
    """Make the GPU that is not ``d`` current with the CUDA runtime directly, as foreign code would."""
    other = 1 - d
    cudart.call("cudaSetDevice", other)
    assert int(cudart.call("cudaGetDevice")) == other


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("d", DEVICES)
def test_allocation_host_copies_and_memset(d):
    dev = mx.gpu(d)
    h = rand(3, 5)
    other_current(d)
    x = nd.array(h, ctx=dev)                  # allocation + host -> device copy
    assert x.device is dev
    other_current(d)
    np.testing.assert_array_equal(x.asnumpy(), h)  # device -> host
    other_current(d)
    z = nd.zeros((4, 7), ctx=dev)             # memset
    other_current(d)
    np.testing.assert_array_equal(z.asnumpy(), np.zeros((4, 7), np.float32))
    other_current(d)
    x[:] = 0                                  # memset of an existing array
    np.testing.assert_array_equal(x.asnumpy(), np.zeros_like(h))


@pytest.mark.parametrize("d", DEVICES)
def test_peer_copies_both_ways(d):
    h = rand(6, 2)
    x = nd.array(h, ctx=mx.gpu(d))
    other_current(d)
    y = x.as_in_context(mx.gpu(1 - d))        # queued on the destination's stream
    other_current(1 - d)
    back = y.as_in_context(mx.gpu(d))
    np.testing.assert_array_equal(y.asnumpy(), h)
    np.testing.assert_array_equal(back.asnumpy(), h)


@pytest.mark.parametrize("d", DEVICES)
def test_nvrtc_kernels(d):
    dev = mx.gpu(d)
    a, b = rand(33, 17), rand(1, 17)          # a broadcast operand
    x, y = nd.array(a, ctx=dev), nd.array(b, ctx=dev)
    other_current(d)
    np.testing.assert_allclose((x + y).asnumpy(), a + b, rtol=1e-6)
    other_current(d)
    np.testing.assert_allclose(nd.relu(x).asnumpy(), np.maximum(a, 0))
    other_current(d)
    big = rand(4096, 600)                     # large enough for a split reduction (its scratch and memset)
    got = nd.array(big, ctx=dev).sum().asscalar()
    assert abs(got - big.astype(np.float64).sum()) < 1e-3 * np.abs(big).sum() / np.sqrt(big.size)
    other_current(d)
    t = x.T                                   # a non-contiguous view copied by a strided kernel
    np.testing.assert_array_equal(t.asnumpy(), a.T)


@pytest.mark.parametrize("d", DEVICES)
def test_a_user_kernel_on_a_stream_of_its_device(d):
    from dnnbind import kernels
    from dnnbind.runtime.stream import current_stream
    dev = mx.gpu(d)
    k = kernels.compile(r'''
extern "C" __global__ void twice_plus(float* y, const float* x, float c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + c;
}''', "twice_plus")
    h = rand(1000)
    x = nd.array(h, ctx=dev)
    y = nd.empty((1000,), ctx=dev)
    other_current(d)
    k.launch(4, 256, (y, x, np.float32(0.5), 1000), stream=current_stream(dev))
    np.testing.assert_allclose(y.asnumpy(), 2 * h + 0.5, rtol=1e-6)


@pytest.mark.parametrize("d", DEVICES)
def test_cudnn_convolution_forward_and_backward(d):
    dev = mx.gpu(d)
    xs, ws, bs = rand(2, 3, 9, 9), rand(4, 3, 3, 3), rand(4)
    grads = {}
    for ctx in (mx.cpu(), dev):
        x, w, b = (nd.array(a, ctx=ctx) for a in (xs, ws, bs))
        for a in (x, w, b):
            a.attach_grad()
        if ctx is dev:
            other_current(d)
        with autograd.record():
            y = nd.Convolution(x, w, b, kernel=(3, 3), num_filter=4, pad=(1, 1))
            loss = (y * y).sum()
        if ctx is dev:
            other_current(d)
        loss.backward()
        grads[ctx] = [y.asnumpy()] + [a.grad.asnumpy() for a in (x, w, b)]
    for ref, got in zip(grads[mx.cpu()], grads[dev]):
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


@pytest.mark.parametrize("d", DEVICES)
def test_cublas_gemm(d):
    dev = mx.gpu(d)
    a, b = rand(37, 64), rand(64, 19)
    x, y = nd.array(a, ctx=dev), nd.array(b, ctx=dev)
    other_current(d)
    got = nd.dot(x, y).asnumpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    other_current(d)
    dense = nn.Dense(5, in_units=64)
    dense.initialize(ctx=dev)
    other_current(d)
    out = dense(x).asnumpy()
    wt, bias = dense.weight.data().asnumpy(), dense.bias.data().asnumpy()
    np.testing.assert_allclose(out, a.astype(np.float64) @ wt.T + bias, rtol=1e-4, atol=1e-4)


def test_nccl_all_reduce_over_both_gpus_from_either_current_device():
    from dnnbind.distributed import Communicator, group
    comms = Communicator.for_devices([mx.gpu(0), mx.gpu(1)])
    try:
        for current in (0, 1):
            hs = [rand(1000), rand(1000)]
            xs = [nd.array(h, ctx=mx.gpu(i)) for i, h in enumerate(hs)]
            cudart.call("cudaSetDevice", current)
            with group():
                for c, x in zip(comms, xs):
                    c.all_reduce(x, out=x)
            for i, x in enumerate(xs):
                other_current(i)
                np.testing.assert_allclose(x.asnumpy(), hs[0] + hs[1], rtol=1e-6)
    finally:
        for c in comms:
            c.close()


def _net(ctx):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, padding=1, in_channels=2, activation="relu"), nn.Flatten(), nn.Dense(3, in_units=4 * 36))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    return net


@pytest.mark.parametrize("d", DEVICES)
def test_hybridized_replay(d):
    dev = mx.gpu(d)
    ref_net, net = _net(mx.cpu()), _net(dev)
    for p_ref, p in zip(ref_net.collect_params().values(), net.collect_params().values()):
        p.set_data(p_ref.data().as_in_context(dev))
    net.hybridize()
    for i in range(4):                        # record, then replays (a CUDA graph after the first where possible)
        h = rand(5, 2, 6, 6)
        expect = ref_net(nd.array(h, ctx=mx.cpu())).asnumpy()
        other_current(d)
        x = nd.array(h, ctx=dev)
        other_current(d)
        with autograd.record():
            y = net(x)
        other_current(d)
        y.backward()
        np.testing.assert_allclose(y.asnumpy(), expect, rtol=1e-4, atol=1e-4, err_msg=f"call {i}")


@pytest.mark.parametrize("d", DEVICES)
@pytest.mark.parametrize("replay", ["host", "graph"])
def test_captured_training_step(d, replay):
    from dnnbind.graph import training_step
    dev = mx.gpu(d)
    batches = [(rand(8, 2, 6, 6), RNG.integers(0, 3, 8).astype(np.int32)) for _ in range(3)]
    losses = {}
    for mode in (None, replay):
        np.random.seed(5)
        net = _net(dev)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        out = []
        if mode is None:
            for xb, yb in batches:
                x, y = nd.array(xb, ctx=dev), nd.array(yb, ctx=dev)
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(8)
                out.append(loss.asnumpy().copy())
        else:
            other_current(d)
            step = training_step(net, loss_fn, trainer, (8, 2, 6, 6), replay=mode, device=dev)
            for xb, yb in batches:
                x = nd.array(xb, ctx=dev)
                other_current(d)
                out.append(step(x, yb).asnumpy().copy())
        losses[mode] = out
    for a, b in zip(losses[None], losses[replay]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
    assert not np.allclose(losses[None][0], losses[None][-1])  # the weights moved
