"""``Block.hybridize()`` (dnnbind.hybrid): recorded forward/backward replayed per call.

GPU tests (marker ``gpu``) compare a hybridized network with an eager twin holding the same weights, on the same
random batches: bitwise in strict FP32 with deterministic conv algorithms (both run the same calls in the same
order), re-recording on a new shape and after Parameters move, loaded Parameters used, the eager fallbacks.
The cpu tests check that hybridize() changes nothing where there is nothing to record.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.gluon import nn

gpu = pytest.mark.gpu


class Residual(nn.Block):
    """d2l-zh v1's residual unit: a plain Block with Python in its forward (hybridize() must record it too)."""

    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = nn.Conv2D(channels, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2D(channels, kernel_size=3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm(), nn.BatchNorm()

    def forward(self, x):
        y = nd.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nd.relu(y + x)


def _net(dev, seed, dropout=0.0):
    nd.random.seed(seed)
    np.random.seed(seed)
    net = nn.Sequential()
    net.add(nn.Conv2D(8, kernel_size=3, padding=1), nn.BatchNorm(), nn.Activation("relu"), Residual(8),
            nn.MaxPool2D(2), nn.Flatten(), nn.Dense(16, activation="relu"))
    if dropout:
        net.add(nn.Dropout(dropout))
    net.add(nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=dev)
    net(mx.nd.zeros((2, 3, 12, 12), ctx=dev))
    return net


def _twin(net, dev, seed, dropout=0.0):
    other = _net(dev, seed + 100, dropout)
    for (k, p), q in zip(net.collect_params().items(), other.collect_params().values()):
        q.set_data(p.data())
    return other


def _batches(n, batch=16, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 12, 12)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(n)]


def _train(net, dev, batches, grad_req=None):
    if grad_req:
        for p in net.collect_params().values():
            if p.grad_req != "null":
                p.grad_req = grad_req
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for xb, yb in batches:
        x, y = mx.nd.array(xb, ctx=dev), mx.nd.array(yb, ctx=dev, dtype=np.int32)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(xb))
        losses.append(loss.asnumpy())
    return losses


def _params(net):
    """By path (``0.weight``): two instances' collect_params() names differ (MXNet's global counters)."""
    return {k: p.data().asnumpy() for k, p in net._collect_params_with_prefix().items()}


@pytest.fixture
def deterministic():
    mx.set_conv_algo_policy("time", deterministic=True)
    yield
    mx.set_conv_algo_policy("time", deterministic=False)


@gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graph", "call-by-call"])
def test_hybridized_training_is_bitwise_the_eager_training(deterministic, graphs):
    from dnnbind.hybrid import set_replay_graphs
    dev = mx.gpu(0)
    eager = _net(dev, 1)
    hybrid = _twin(eager, dev, 1)
    set_replay_graphs(graphs)
    try:
        hybrid.hybridize()
        batches = _batches(7)
        le, lh = _train(eager, dev, batches), _train(hybrid, dev, batches)
    finally:
        set_replay_graphs(True)
    sig = next(iter(hybrid._cached._sigs.values()))
    assert (sig.fwd._exec is not None) == graphs and (sig.bwd._exec is not None) == graphs
    assert hybrid._cached.replays >= 3, "the later steps must be replays"
    for a, b in zip(le, lh):
        assert np.array_equal(a, b), (a, b)
    pe, ph = _params(eager), _params(hybrid)
    for k in pe:  # weights, biases and BatchNorm's running statistics
        assert np.array_equal(pe[k], ph[k]), k
    assert not np.array_equal(pe["0.weight"], _params(_net(dev, 1))["0.weight"]), "training changed nothing"


@gpu
def test_grad_req_add_accumulates_like_eager(deterministic):
    dev = mx.gpu(0)
    eager = _net(dev, 2)
    hybrid = _twin(eager, dev, 2)
    hybrid.hybridize()
    grads = []
    for net in (eager, hybrid):
        for p in net.collect_params().values():
            if p.grad_req != "null":
                p.grad_req = "add"
        net.collect_params().zero_grad()
        for xb, yb in _batches(4, seed=3):
            with autograd.record():
                loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.array(xb, ctx=dev)), mx.nd.array(yb, ctx=dev))
            loss.backward()
        paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
        grads.append({k: p.grad().asnumpy() for k, p in paths if p.grad_req != "null"})
    for k in grads[0]:
        assert np.array_equal(grads[0][k], grads[1][k]), k
        assert np.abs(grads[0][k]).max() > 0, k


@gpu
def test_input_gradient_and_head_gradient_match_eager(deterministic):
    dev = mx.gpu(0)
    eager = _net(dev, 3)
    hybrid = _twin(eager, dev, 3)
    hybrid.hybridize()
    rng = np.random.default_rng(4)
    for step in range(4):
        xb = rng.standard_normal((5, 3, 12, 12)).astype(np.float32)
        head = rng.standard_normal((5, 10)).astype(np.float32)
        got = []
        for net in (eager, hybrid):
            x = mx.nd.array(xb, ctx=dev)
            x.attach_grad()
            with autograd.record():
                out = net(x)
            out.backward(mx.nd.array(head, ctx=dev))
            got.append((out.asnumpy(), x.grad.asnumpy(), net[0].weight.grad().asnumpy()))
        for a, b in zip(*got):
            assert np.array_equal(a, b), step
    assert hybrid._cached.replays >= 2


@gpu
def test_new_shape_records_again_and_inference_uses_running_statistics(deterministic):
    dev = mx.gpu(0)
    eager = _net(dev, 4)
    hybrid = _twin(eager, dev, 4)
    hybrid.hybridize()
    _train(eager, dev, _batches(4, batch=16) + _batches(3, batch=6, seed=1))
    _train(hybrid, dev, _batches(4, batch=16) + _batches(3, batch=6, seed=1))
    for batch in (16, 6, 1):  # predict mode: a signature of its own per shape
        xb = np.random.default_rng(batch).standard_normal((batch, 3, 12, 12)).astype(np.float32)
        for _ in range(3):
            a = eager(mx.nd.array(xb, ctx=dev)).asnumpy()
            b = hybrid(mx.nd.array(xb, ctx=dev)).asnumpy()
            assert np.array_equal(a, b), batch
    assert len(hybrid._cached._sigs) >= 4  # train 16, train 6, predict 16, 6, 1
    pe, ph = _params(eager), _params(hybrid)
    for k in pe:
        assert np.array_equal(pe[k], ph[k]), k


@gpu
def test_parameters_loaded_after_hybridize_are_used(tmp_path):
    dev = mx.gpu(0)
    net = _net(dev, 5)
    net.hybridize()
    x = mx.nd.array(np.random.default_rng(5).standard_normal((4, 3, 12, 12)).astype(np.float32), ctx=dev)
    for _ in range(3):
        before = net(x).asnumpy()
    other = _net(dev, 6)
    path = str(tmp_path / "other.params")
    other.save_parameters(path)
    net.load_parameters(path, ctx=dev)
    after = net(x).asnumpy()
    np.testing.assert_allclose(after, other(x).asnumpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(after, before)
    assert net._cached.replays >= 2


@gpu
def test_two_outputs_awaiting_backward_and_the_active_switch(deterministic):
    """net(a); net(b); one backward: the second call cannot reuse the static activations, so it runs eagerly."""
    dev = mx.gpu(0)
    eager = _net(dev, 7)
    hybrid = _twin(eager, dev, 7)
    hybrid.hybridize()
    (xa, _), (xb, _) = _batches(2, batch=4, seed=7)
    grads = []
    for net in (eager, hybrid):
        for _ in range(3):
            with autograd.record():
                loss = (net(mx.nd.array(xa, ctx=dev)) * net(mx.nd.array(xb, ctx=dev))).sum()
            loss.backward()
        grads.append(net[0].weight.grad().asnumpy())
    assert np.array_equal(grads[0], grads[1])
    hybrid.hybridize(active=False)
    assert "_cached" not in hybrid.__dict__ and "_cached" not in hybrid[0].__dict__


@gpu
def test_host_reads_and_random_draws_fall_back_to_eager():
    dev = mx.gpu(0)

    class HostRead(nn.Block):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm()
            self.dense = nn.Dense(4)

        def forward(self, x):
            y = self.bn(x)
            if y.sum().asscalar() > 0:  # data-dependent Python: cannot be replayed
                y = y * 2
            return self.dense(y)

    class Noisy(nn.Block):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4)

        def forward(self, x):
            return self.dense(x + nd.random.normal(shape=x.shape, ctx=x.context))

    for cls in (HostRead, Noisy):
        nd.random.seed(0)
        net, twin = cls(), cls()
        for n in (net, twin):
            n.initialize(mx.init.Xavier(), ctx=dev)
            n(mx.nd.ones((3, 5), ctx=dev))
        for p, q in zip(net.collect_params().values(), twin.collect_params().values()):
            q.set_data(p.data())
        twin.hybridize()
        rng = np.random.default_rng(8)
        outs = []
        for i in range(4):
            x = mx.nd.array(rng.standard_normal((3, 5)).astype(np.float32) + (2 if i % 2 else -2), ctx=dev)
            seed = 100 + i
            pair = []
            for n in (net, twin):
                nd.random.seed(seed)
                with autograd.record():
                    pair.append(n(x).asnumpy())
            outs.append(pair)
        for a, b in outs:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        assert twin._cached.eager_reasons, cls.__name__
        assert twin._cached.replays == 0
        pe, ph = _params(net), _params(twin)
        for k in pe:  # running statistics updated once per call, not twice
            np.testing.assert_allclose(pe[k], ph[k], rtol=1e-6, atol=1e-7, err_msg=k)


@gpu
def test_dropout_masks_differ_between_replays_and_trace_lists_the_calls():
    dev = mx.gpu(0)
    net = _net(dev, 9, dropout=0.5)
    net.hybridize()
    x = mx.nd.array(np.random.default_rng(9).standard_normal((8, 3, 12, 12)).astype(np.float32), ctx=dev)
    outs = []
    for _ in range(4):
        with autograd.record():
            out = net(x)
        out.backward()
        outs.append(out.asnumpy())
    assert net._cached.replays >= 2
    assert not np.array_equal(outs[2], outs[3]), "a replay must draw a new dropout mask"
    with mx.trace() as t:
        with autograd.record():
            out = net(x)
        out.backward()
    names = [r.function for r in t.records]
    assert any(n.startswith("cudnnConvolutionForward") or n == "cudnnBackendExecute" for n in names), names
    assert any(n.startswith("cudnnConvolutionBackward") or n == "cudnnBackendExecute" for n in names), names


@gpu
def test_trainer_repacking_records_again_and_training_step_of_a_hybridized_net(deterministic):
    """The Trainer moves Parameters into flat buffers at its first step: the recording made before points at the
    old arrays and must be dropped (else the update would not reach what the replay reads)."""
    from dnnbind.graph import training_step
    dev = mx.gpu(0)
    eager = _net(dev, 10)
    hybrid = _twin(eager, dev, 10)
    hybrid.hybridize()
    hybrid(mx.nd.ones((16, 3, 12, 12), ctx=dev))  # predict-mode signature recorded before the Trainer exists
    for net in (eager, hybrid):
        _train(net, dev, _batches(3, seed=11))
    x = mx.nd.array(_batches(1, seed=12)[0][0], ctx=dev)
    for _ in range(2):
        assert np.array_equal(eager(x).asnumpy(), hybrid(x).asnumpy())
    trainer = gluon.Trainer(hybrid.collect_params(), "sgd", {"learning_rate": 0.05})
    step = training_step(hybrid, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, (16, 3, 12, 12), replay="host")
    xb, yb = _batches(1, seed=13)[0]
    loss = step(mx.nd.array(xb, ctx=dev), mx.nd.array(yb, ctx=dev, dtype=np.int32)).asnumpy()
    assert np.isfinite(loss).all()


def test_hybridize_on_the_cpu_changes_nothing():
    dev = mx.cpu()
    eager = _net(dev, 11)
    hybrid = _twin(eager, dev, 11)
    hybrid.hybridize(static_alloc=True, static_shape=True)
    assert "_cached" in hybrid.__dict__ and "_cached" in hybrid[3].__dict__  # children too, as in MXNet
    batches = _batches(3, batch=4)
    le, lh = _train(eager, dev, batches), _train(hybrid, dev, batches)
    for a, b in zip(le, lh):
        assert np.array_equal(a, b)
    assert hybrid._cached.replays == 0
    hybrid.hybridize(active=False)
    assert "_cached" not in hybrid.__dict__


@gpu
def test_shared_parameter_autograd_grad_and_retain_graph(deterministic):
    """A Parameter used inside and outside the hybridized Block gets both parts; autograd.grad() leaves .grad
    alone; a second backward through one call is refused (its activations' memory was reused)."""
    dev = mx.gpu(0)
    eager = _net(dev, 12)
    hybrid = _twin(eager, dev, 12)
    hybrid.hybridize()
    rng = np.random.default_rng(12)
    for step in range(3):
        xb = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
        got = []
        for net in (eager, hybrid):
            w = net[-1].weight
            with autograd.record():
                loss = net(mx.nd.array(xb, ctx=dev)).sum() + (w.data() * w.data()).sum()
            loss.backward()
            paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
            before = {k: p.grad().asnumpy() for k, p in paths if p.grad_req != "null"}
            x = mx.nd.array(xb, ctx=dev)
            x.attach_grad()
            with autograd.record():
                total = net(x).sum()
            dx = autograd.grad(total, [x])[0].asnumpy()
            after = {k: p.grad().asnumpy() for k, p in paths if p.grad_req != "null"}
            for k in before:
                assert np.array_equal(before[k], after[k]), k  # grad() wrote no .grad
            got.append((before, dx))
        (ge, dxe), (gh, dxh) = got
        assert np.array_equal(dxe, dxh), step
        for k in ge:
            assert np.array_equal(ge[k], gh[k]), (step, k)
    x = mx.nd.array(rng.standard_normal((4, 3, 12, 12)).astype(np.float32), ctx=dev)
    with autograd.record():
        loss = hybrid(x).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


@gpu
def test_traced_replay_names_the_scopes_an_eager_step_names():
    """Inside dnnbind.trace() a replay goes call by call, each call under the Block path and op it was recorded
    in: the cuDNN/cuBLAS calls of a hybridized step read as an eager step's (same functions, same scopes)."""
    from dnnbind.recording import _QUERY
    dev = mx.gpu(0)
    eager = _net(dev, 13)
    hybrid = _twin(eager, dev, 13)
    hybrid.hybridize()
    xb, yb = _batches(1, batch=8, seed=13)[0]
    x, y = mx.nd.array(xb, ctx=dev), mx.nd.array(yb, ctx=dev, dtype=np.int32)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rows = []
    for net in (eager, hybrid):
        for _ in range(3):  # warm, record, replay
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
        with mx.trace() as t:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
        rows.append([(r.scope, r.function) for r in t.records
                     if r.library in ("cudnn", "cublas", "kernel") and not _QUERY.match(r.function)])
    assert hybrid._cached.replays >= 2
    assert rows[0] == rows[1], "\n".join(f"{a} | {b}" for a, b in zip(*rows) if a != b)
    scopes = [scope for scope, _ in rows[1]]
    assert len(scopes) > 10 and any("backward" in sc for sc in scopes) and len({sc.count("/") for sc in scopes}) > 1


def test_summary_of_a_hybridized_block_lists_its_layers(capsys):
    """summary() runs the forward eagerly (a replay would skip the children whose hooks make the rows) and leaves
    the Block hybridized."""
    net = _net(mx.cpu(), 14)
    net.hybridize()
    net.summary(mx.nd.ones((2, 3, 12, 12), ctx=mx.cpu()))
    out = capsys.readouterr().out
    assert "Conv2D-1" in out and "Dense" in out and "Total params" in out
    assert "_cached" in net.__dict__ and "_cached" in net[0].__dict__


@gpu
def test_an_unused_parameter_stays_stale_as_in_eager():
    """A layer the forward never calls gets no gradient: the Trainer reports it (eagerly and hybridized alike)."""
    from dnnbind.gluon.trainer import StaleGradientError
    dev = mx.gpu(0)

    class Partial(nn.Block):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Dense(4), nn.Dense(4)

        def forward(self, x):
            return self.used(x)

    for hybrid in (False, True):
        net = Partial()
        net.initialize(mx.init.Xavier(), ctx=dev)
        net(mx.nd.ones((2, 3), ctx=dev))
        net.unused(mx.nd.ones((2, 3), ctx=dev))
        if hybrid:
            net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        for step in range(3):  # warm, record, replay
            with autograd.record():
                loss = net(mx.nd.ones((2, 3), ctx=dev)).sum()
            loss.backward()
            with pytest.raises(StaleGradientError, match="unused"):
                trainer.step(2)
            trainer.step(2, ignore_stale_grad=True)


class _StatefulCell(gluon.HybridBlock):
    """A recurrent step in d2l's shape: (output, [state]) from (inputs, [state]): tuples and lists of arrays in and
    out, the final state fed back by the caller (a language model's loop)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.i2h = nn.Dense(6, flatten=False, in_units=5)
            self.h2h = nn.Dense(6, flatten=False, in_units=6)
            self.out = nn.Dense(3, flatten=False, in_units=6)

    def hybrid_forward(self, F, x, state):
        h = state[0]
        ys = []
        for t in range(x.shape[0]):
            h = F.tanh(self.i2h(x[t]) + self.h2h(h))
            ys.append(self.out(h))
        return F.stack(*ys), [h]


@gpu
@pytest.mark.parametrize("use_state", [True, False])
def test_a_block_of_several_outputs_and_list_inputs_replays_like_eager(use_state):
    """Replays of a Block taking a list of states and returning (output, [state]): values and every gradient as
    the eager twin's, step after step with the state carried over, whether or not the loss reads the state."""
    dev = mx.gpu(0)
    nets = []
    for hybrid in (False, True):
        net = _StatefulCell()
        net.initialize(mx.init.Xavier(), ctx=dev)
        if nets:
            for p, q in zip(nets[0].collect_params().values(), net.collect_params().values()):
                q.set_data(p.data())
        if hybrid:
            net.hybridize()
        nets.append(net)
    rng = np.random.default_rng(3)
    states = [[nd.zeros((4, 6), ctx=dev)] for _ in nets]
    for step in range(5):
        x = nd.array(rng.standard_normal((7, 4, 5)).astype(np.float32), ctx=dev)
        got = []
        for k, net in enumerate(nets):
            st = [s.detach() for s in states[k]]
            with autograd.record():
                y, new = net(x, st)
                loss = (y * y).sum() + ((new[0] * 3).sum() if use_state else 0)
            loss.backward()
            states[k] = new
            got.append((y.asnumpy(), new[0].asnumpy(), _grads(net)))
        (ye, he, ge), (yh, hh, gh) = got
        np.testing.assert_allclose(yh, ye, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hh, he, rtol=1e-5, atol=1e-6)
        for name in ge:
            np.testing.assert_allclose(gh[name], ge[name], rtol=1e-4, atol=1e-6, err_msg=f"step {step} {name}")
    assert nets[1]._cached.replays >= 2 and not nets[1]._cached.eager_reasons


def _grads(net):
    return {k: p.grad().asnumpy() for k, p in net._collect_params_with_prefix().items()}


@gpu
def test_a_hybridized_gru_layer_with_states_replays_like_eager():
    from dnnbind.gluon import rnn
    dev = mx.gpu(0)
    layers = []
    for hybrid in (False, True):
        layer = rnn.GRU(8, num_layers=2, input_size=5)
        layer.initialize(mx.init.Xavier(), ctx=dev)
        if layers:
            for p, q in zip(layers[0].collect_params().values(), layer.collect_params().values()):
                q.set_data(p.data())
        if hybrid:
            layer.hybridize()
        layers.append(layer)
    rng = np.random.default_rng(4)
    for step in range(4):
        x = nd.array(rng.standard_normal((6, 3, 5)).astype(np.float32), ctx=dev)
        h0 = nd.array(rng.standard_normal((2, 3, 8)).astype(np.float32), ctx=dev)
        got = []
        for layer in layers:
            with autograd.record():
                y, (h,) = layer(x, [h0])
                loss = (y * y).sum() + (h * h).sum()
            loss.backward()
            got.append((y.asnumpy(), h.asnumpy(), _grads(layer)))
        (ye, he, ge), (yh, hh, gh) = got
        np.testing.assert_allclose(yh, ye, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hh, he, rtol=1e-5, atol=1e-6)
        for name in ge:
            np.testing.assert_allclose(gh[name], ge[name], rtol=1e-4, atol=1e-6, err_msg=f"step {step} {name}")
    assert layers[1]._cached.replays >= 2 and not layers[1]._cached.eager_reasons
