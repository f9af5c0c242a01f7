"""Eager replay (dnnbind.eager_replay): a non-hybridized Block's call replays its recording only where the call is
proven to repeat the recorded one op for op, and otherwise runs exactly as eager.

CPU tests drive the engine's two parts directly (``OpCapture`` notes a forward's ops, ``OpCheck`` defers a later
forward's ops against them) on cpu arrays, where every deferred op materializes: the results, gradients and autograd
graph must be eager's whatever the forward does (a different op, parameter, scalar or operand, reading a deferred
array, keeping one, raising). GPU tests run the Block API end to end: replays happen in the plain eager loop, the
losses, gradients and weights follow the loop with eager replay off (float64 numpy for a small MLP), and each
fallback keeps the eager result.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind._lib.hooks import DEFERRING
from dnnbind.eager_replay import OpCapture, OpCheck, Pending
from dnnbind.gluon import nn

gpu = pytest.mark.gpu


# -- the engine on cpu arrays -----------------------------------------------------------------------------------

class Branchy(nn.Block):
    """A forward whose ops depend on Python state (``self.mode``) and that can read or keep its arrays."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = nn.Conv2D(4, 3, padding=1)
        self.bn = nn.BatchNorm()
        self.dense = nn.Dense(5)
        self.mode, self.scale, self.kept = "plain", 2.0, None

    def forward(self, x):
        y = nd.relu(self.bn(self.conv(x)))
        if self.mode == "read":
            y = y * float(y.sum().asscalar() > -1e30)  # a host read of a deferred array
        elif self.mode == "keep":
            self.kept = y  # an intermediate that outlives the forward
        elif self.mode == "other-op":
            y = nd.sigmoid(y)
        elif self.mode == "raise":
            raise ValueError("raised inside the forward")
        y = y * self.scale
        z = self.dense(y.reshape((0, -1)))
        return z, y


def _branchy(seed=0):
    np.random.seed(seed)
    net = Branchy()
    net.initialize(mx.init.Xavier())
    net(nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    return net


def _capture(net, x):
    cap = OpCapture([x])
    DEFERRING.append(cap)
    try:
        out = net.forward(x)
    finally:
        DEFERRING.remove(cap)
    return cap.finish(out), cap


def _checked(net, trace, x):
    """The forward under an OpCheck; a proven call is materialized here (what a GPU replay would compute)."""
    check = OpCheck(trace, (x,))
    DEFERRING.append(check)
    try:
        out = net.forward(x)
    except BaseException:
        check.materialize("raised")
        raise
    finally:
        if check.active:
            DEFERRING.remove(check)
    proven = check.active and check.compare(out, trace) is None
    if check.active:
        check.materialize("test")
    return out, proven, check.why


def _eager_twin(net):
    twin = _branchy(seed=99)
    for p, q in zip(net.collect_params().values(), twin.collect_params().values()):
        q.set_data(p.data().copy())
    twin.mode, twin.scale = net.mode, net.scale
    return twin


@pytest.mark.parametrize("mode,scale,proven", [("plain", 2.0, True), ("plain", 3.0, False), ("other-op", 2.0, False),
                                               ("read", 2.0, False), ("keep", 2.0, True)])
def test_checked_forward_is_eager(mode, scale, proven):
    """Whatever the forward does differently from the captured one, the checked call's outputs and gradients are
    eager's, in float64 agreement with a twin network run eagerly."""
    net = _branchy()
    x0 = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    with autograd.record():
        trace, cap = _capture(net, x0)
    assert cap.refused is None and len(trace.entries) >= 6  # conv, bn, relu, mul, reshape, dense
    net.mode, net.scale = mode, scale
    twin = _eager_twin(net)
    x = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    with autograd.record():
        (z, y), was_proven, why = _checked(net, trace, x)
        loss = (z * z).sum() + y.sum()
    assert was_proven is proven, why
    loss.backward()
    with autograd.record():
        tz, ty = twin(x)
        tloss = (tz * tz).sum() + ty.sum()
    tloss.backward()
    assert type(z) is nd.NDArray and type(y) is nd.NDArray  # no Pending escapes
    np.testing.assert_allclose(z.asnumpy(), tz.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.asnumpy(), ty.asnumpy(), rtol=1e-5, atol=1e-6)
    for p, q in zip(net.collect_params().values(), twin.collect_params().values()):
        if p.grad_req != "null":
            np.testing.assert_allclose(p.grad().asnumpy(), q.grad().asnumpy(), rtol=1e-4, atol=1e-5)
    if mode == "keep":
        assert type(net.kept) is nd.NDArray
        np.testing.assert_allclose(net.kept.asnumpy(), ty.asnumpy() / scale, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,scale,expect", [
    ("plain", 2.0, None), ("plain", 3.0, "op 3 (multiply): an operand differs"),
    ("other-op", 2.0, "made multiply here"),
    ("read", 2.0, "op 3 (sum): the recorded forward made multiply"), ("keep", 2.0, None)])
def test_check_says_why(mode, scale, expect):
    net = _branchy()
    x0 = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    trace, _ = _capture(net, x0)
    net.mode, net.scale = mode, scale
    x = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    _, proven, why = _checked(net, trace, x)
    if expect is None:
        assert proven and why == "test"
    else:
        assert not proven and expect in why, why


def test_scalar_of_another_type_is_another_call():
    """``x * 2`` and ``x * 2.0`` are compared with their types: an int scalar is not the recorded float."""
    net = _branchy()
    trace, _ = _capture(net, nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    net.scale = 2
    _, proven, why = _checked(net, trace, nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    assert not proven and "operand differs" in why


def test_an_exception_keeps_the_ops_before_it():
    """A forward that raises after some deferred ops: those ops ran (BatchNorm's running statistics moved as in
    an eager call), and the exception reaches the caller."""
    net = _branchy()
    trace, _ = _capture(net, nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    twin = _eager_twin(net)
    net.mode = twin.mode = "raise"
    x = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    with autograd.record():
        with pytest.raises(ValueError, match="raised inside"):
            _checked(net, trace, x)
        with pytest.raises(ValueError, match="raised inside"):
            twin(x)
    np.testing.assert_allclose(net.bn.running_mean.data().asnumpy(), twin.bn.running_mean.data().asnumpy(),
                               rtol=1e-6, atol=1e-7)
    assert np.abs(net.bn.running_mean.data().asnumpy()).max() > 0  # it did move


def test_pending_knows_only_its_metadata():
    net = _branchy()
    trace, _ = _capture(net, nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    x = nd.array(np.random.rand(2, 3, 6, 6).astype("f"))
    check = OpCheck(trace, (x,))
    DEFERRING.append(check)
    try:
        y = net.conv(x)
        assert type(y) is Pending and y.shape == (2, 4, 6, 6) and y.dtype == np.float32 and check.active
        values = y.asnumpy()  # reading it materializes the deferred call: the eager conv's values
        assert not check.active and type(y) is nd.NDArray and "conv" not in check.why
    finally:
        if check.active:
            DEFERRING.remove(check)
    ref = nd.Convolution(x, net.conv.weight.data(), net.conv.bias.data(), kernel=(3, 3), pad=(1, 1), num_filter=4)
    np.testing.assert_allclose(values, ref.asnumpy(), rtol=1e-6, atol=1e-6)


def test_gradient_through_a_materialized_call_matches_central_differences():
    """A checked call materialized mid-forward ("read") must tape the same graph as eager: its input gradient
    against float64 central differences of the same forward."""
    net = _branchy()
    trace, _ = _capture(net, nd.array(np.random.rand(2, 3, 6, 6).astype("f")))
    net.mode = "read"
    rng = np.random.default_rng(3)
    x = nd.array(rng.random((1, 3, 6, 6)).astype("f"))
    x.attach_grad()
    with autograd.record():
        z, _ = _checked(net, trace, x)[0]
        loss = (z * z).sum()
    loss.backward()
    g = x.grad.asnumpy()

    def f(v):
        with autograd.record():  # batch statistics, as above
            z, _ = net(nd.array(v.astype("f")))
        return float((z.asnumpy().astype(np.float64) ** 2).sum())
    base = x.asnumpy().astype(np.float64)
    for idx in [(0, 0, 1, 2), (0, 1, 3, 3), (0, 2, 5, 0)]:
        e = np.zeros_like(base)
        e[idx] = 1e-3  # BatchNorm over one image is strongly curved: a small step
        num = (f(base + e) - f(base - e)) / 2e-3
        assert abs(num - g[idx]) <= 2e-2 * max(1.0, abs(num)), (idx, num, g[idx])


# -- the Block API on the GPU -----------------------------------------------------------------------------------

def _mlp(dev, seed):
    nd.random.seed(seed)
    np.random.seed(seed)
    net = nn.Sequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(16, activation="tanh"), nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=dev)
    return net


def _cnn(dev, seed):
    nd.random.seed(seed)
    np.random.seed(seed)
    net = nn.Sequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2),
            nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.Flatten(), nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=dev)
    return net


def _loop(net, batches, dev, steps_lr=0.1):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": steps_lr, "momentum": 0.9})
    losses = []
    for x, y in batches:
        x, y = nd.array(x, ctx=dev), nd.array(y, ctx=dev)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        losses.append(loss.asnumpy())
    return losses, loss_fn


@pytest.fixture
def replay_on(monkeypatch):
    """Eager replay on, and the process's record of retained graphs cleared (another test may have set it)."""
    prev = mx.eager_replay_enabled()
    mx.set_eager_replay(True)
    monkeypatch.setattr(autograd, "_kept_graphs", [False])
    yield
    mx.set_eager_replay(prev)


@gpu
def test_mlp_loop_matches_float64_numpy(gpu, replay_on):
    """Eight SGD steps of a 3-layer MLP in the plain eager loop: the replayed steps' losses and final weights
    against the same loop in float64 numpy."""
    net = _mlp(gpu, 0)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((16, 10)).astype("f"), rng.integers(0, 4, 16).astype("f")) for _ in range(8)]
    net(nd.array(batches[0][0], ctx=gpu))
    ws = [p.data().asnumpy().astype(np.float64) for p in net.collect_params().values()]
    losses, loss_fn = _loop(net, batches, gpu, steps_lr=0.1)
    assert net.__dict__["_auto"].replays >= 5 and loss_fn.__dict__["_auto"].replays >= 5

    W1, b1, W2, b2, W3, b3 = ws
    vel = [np.zeros_like(w) for w in ws]
    for (x, y), got in zip(batches, losses):
        x = x.astype(np.float64)
        h1p = x @ W1.T + b1
        h1 = np.maximum(h1p, 0)
        h2 = np.tanh(h1 @ W2.T + b2)
        z = h2 @ W3.T + b3
        zs = z - z.max(1, keepdims=True)
        p = np.exp(zs) / np.exp(zs).sum(1, keepdims=True)
        yi = y.astype(int)
        loss = -np.log(p[np.arange(len(yi)), yi])
        np.testing.assert_allclose(got, loss, rtol=2e-4, atol=2e-5)
        dz = p.copy()
        dz[np.arange(len(yi)), yi] -= 1
        dz /= len(yi)  # trainer.step(batch) rescales the summed gradient
        gW3, gb3 = dz.T @ h2, dz.sum(0)
        dh2 = dz @ W3 * (1 - h2 ** 2)
        gW2, gb2 = dh2.T @ h1, dh2.sum(0)
        dh1 = dh2 @ W2 * (h1p > 0)
        gW1, gb1 = dh1.T @ x, dh1.sum(0)
        for i, g in enumerate((gW1, gb1, gW2, gb2, gW3, gb3)):
            vel[i] = 0.9 * vel[i] - 0.1 * g
            ws[i] = ws[i] + vel[i]
        W1, b1, W2, b2, W3, b3 = ws
    for p, w in zip(net.collect_params().values(), ws):
        np.testing.assert_allclose(p.data().asnumpy(), w, rtol=2e-4, atol=2e-5)


@gpu
def test_cnn_loop_follows_the_loop_without_replay(gpu, replay_on):
    """A CNN with BatchNorm, pooling and a view: the same loop with eager replay off and on, from the same
    weights on the same batches: losses and weights agree (TF32 off), and the replayed run replayed."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((8, 3, 12, 12)).astype("f"), rng.integers(0, 10, 8).astype("f"))
               for _ in range(6)]
    results = []
    for on in (False, True):
        mx.set_eager_replay(on)
        net = _cnn(gpu, 5)
        net(nd.array(batches[0][0], ctx=gpu))
        losses, _ = _loop(net, batches, gpu)
        results.append((losses, [p.data().asnumpy() for p in net.collect_params().values()], net))
    (l0, w0, n0), (l1, w1, n1) = results
    assert "_auto" not in n0.__dict__ and n1.__dict__["_auto"].replays >= 3
    for a, b in zip(l0, l1):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(w0, w1):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


class _Stochastic(nn.Block):
    """Stochastic depth written with Python's random: which ops run changes from call to call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.a, self.b = nn.Dense(8), nn.Dense(8)

    def forward(self, x):
        y = self.a(x)
        if random.random() < 0.5:
            y = y + self.b(y)
        return nd.relu(y)


@gpu
def test_python_control_flow_is_followed(gpu, replay_on):
    random.seed(0)
    net = _Stochastic()
    net.initialize(mx.init.Xavier(), ctx=gpu)
    x = nd.array(np.random.default_rng(0).standard_normal((4, 8)).astype("f"), ctx=gpu)
    for _ in range(12):
        state = random.getstate()
        got = net(x).asnumpy()
        random.setstate(state)
        with_b = random.random() < 0.5
        random.setstate(state)
        mx.set_eager_replay(False)
        want = net(x).asnumpy()  # the same branch, eagerly
        mx.set_eager_replay(True)
        random.setstate(state)
        random.random()
        y = net.a(x).asnumpy()
        assert np.allclose(want, got, rtol=1e-5, atol=1e-6), with_b
        if not with_b:
            np.testing.assert_allclose(got, np.maximum(y, 0), rtol=1e-5, atol=1e-6)
    auto = net.__dict__["_auto"]
    assert auto.misses >= 1 and any("differ" in r for r in auto.eager_reasons.values())


class _Keeper(nn.Block):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.a, self.b = nn.Dense(8), nn.Dense(3)
        self.kept = []

    def forward(self, x):
        h = nd.tanh(self.a(x))
        self.kept.append(h)
        return self.b(h)


@gpu
def test_a_kept_intermediate_holds_its_own_call_values(gpu, replay_on):
    """A forward that stores an intermediate: each call's stored array keeps that call's values (a replay
    would rewrite one shared buffer), so those calls run eagerly."""
    net = _Keeper()
    net.initialize(mx.init.Xavier(), ctx=gpu)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 5)).astype("f") for _ in range(5)]
    for x in xs:
        net(nd.array(x, ctx=gpu))
    W, b = net.a.weight.data().asnumpy(), net.a.bias.data().asnumpy()
    for x, h in zip(xs, net.kept):
        np.testing.assert_allclose(h.asnumpy(), np.tanh(x @ W.T + b), rtol=1e-5, atol=1e-6)
    assert net.__dict__["_auto"].replays == 0


@gpu
def test_host_read_in_forward_stays_eager(gpu, replay_on):
    class Reader(nn.Block):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.a = nn.Dense(4)

        def forward(self, x):
            y = self.a(x)
            return y * 2 if y.sum().asscalar() > 0 else y * -1

    net = Reader()
    net.initialize(mx.init.Xavier(), ctx=gpu)
    rng = np.random.default_rng(2)
    for _ in range(5):
        x = rng.standard_normal((3, 6)).astype("f")
        got = net(nd.array(x, ctx=gpu)).asnumpy()
        y = x @ net.a.weight.data().asnumpy().T + net.a.bias.data().asnumpy()
        np.testing.assert_allclose(got, y * 2 if y.sum() > 0 else -y, rtol=1e-5, atol=1e-5)
    auto = net.__dict__["_auto"]
    assert auto.replays == 0 and any("host" in r for r in auto.eager_reasons.values())


@gpu
def test_weights_changed_in_place_are_read_by_the_replay(gpu, replay_on):
    net = _mlp(gpu, 3)
    x = nd.array(np.random.default_rng(4).standard_normal((5, 7)).astype("f"), ctx=gpu)
    for _ in range(3):
        net(x)
    w = net[0].weight
    w.set_data(w.data() * 0.5)
    got = net(x).asnumpy()
    mx.set_eager_replay(False)
    want = net(x).asnumpy()
    mx.set_eager_replay(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert net.__dict__["_auto"].replays >= 2


@gpu
def test_off_switch_and_hybridize_take_precedence(gpu, replay_on):
    net = _mlp(gpu, 1)
    x = nd.array(np.ones((2, 3), "f"), ctx=gpu)
    mx.set_eager_replay(False)
    for _ in range(4):
        net(x)
    assert "_auto" not in net.__dict__
    mx.set_eager_replay(True)
    for _ in range(4):
        net(x)
    assert net.__dict__["_auto"].replays >= 2
    net.hybridize()
    assert "_auto" not in net.__dict__  # hybridize() drops eager replay's recordings: its own take over
    for _ in range(4):
        net(x)
    assert net._cached.replays >= 2 and "_auto" not in net.__dict__


class _Elementwise(nn.Block):
    """tanh(x * w) + x: element-wise ops, whose gradients are themselves differentiable."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.w = self.params.get("w", shape=(5,), init=mx.init.Uniform(1.0))

    def forward(self, x):
        return nd.tanh(x * self.w.data()) + x


@gpu
def test_retained_and_differentiated_graphs_stay_eager(gpu, replay_on):
    """Two losses backpropagated one after the other through one forward (retain_graph=True), then a gradient
    penalty (create_graph=True): every step works and matches the same loop with eager replay off."""
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((6, 5)).astype("f") for _ in range(5)]
    grads, nets = [], []
    for on in (True, False):  # replay on first: the program's first retain_graph is in its first step
        mx.set_eager_replay(on)
        nd.random.seed(7)
        net = _Elementwise()
        net.initialize(ctx=gpu)
        nets.append(net)
        got = []
        for x in xs:
            x = nd.array(x, ctx=gpu)
            x.attach_grad()
            with autograd.record():
                out = net(x)
                l1, l2 = (out * out).sum(), out.sum()
            l1.backward(retain_graph=True)
            g1 = net.w.grad().asnumpy().copy()
            l2.backward()
            with autograd.record():
                out = net(x)
                gx = autograd.grad(out.sum(), [x], create_graph=True)[0]
                penalty = (gx * gx).sum()
            penalty.backward()
            got.append((g1, net.w.grad().asnumpy().copy(), gx.asnumpy()))
        grads.append(got)
    assert autograd.keeps_graphs() and nets[0].__dict__["_auto"].replays == 0
    for a, b in zip(*grads):
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


class _Peeker(nn.Block):
    """Reads BatchNorm's running mean on the host only when asked: a host read a recording never saw."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense, self.bn = nn.Dense(6), nn.BatchNorm()
        self.peek, self.seen = False, None

    def forward(self, x):
        y = self.bn(self.dense(x))
        if self.peek:
            self.seen = self.bn.running_mean.data().asnumpy()
        return nd.relu(y)


@gpu
def test_a_host_read_beside_deferred_ops_sees_them_done(gpu, replay_on):
    """Calls 1-3 replay; call 4 reads a Parameter the deferred BatchNorm updates: the read must see the update
    (the deferred ops run first), as the same loop with replay off does."""
    rng = np.random.default_rng(6)
    xs = [nd.array(rng.standard_normal((8, 4)).astype("f"), ctx=gpu) for _ in range(4)]
    seen = []
    for on in (True, False):
        mx.set_eager_replay(on)
        nd.random.seed(3)
        net = _Peeker()
        net.initialize(mx.init.Xavier(), ctx=gpu)
        for i, x in enumerate(xs):
            net.peek = i == 3
            with autograd.record():
                net(x).sum().backward()
        seen.append((net.seen, net.bn.running_mean.data().asnumpy()))
        if on:
            assert net.__dict__["_auto"].replays >= 1
    (a, a_end), (b, b_end) = seen
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a, a_end, rtol=1e-6, atol=1e-7)  # the read came after this call's update
    np.testing.assert_allclose(a_end, b_end, rtol=1e-6, atol=1e-7)


# -- several GPUs in one process ----------------------------------------------------------------------------------

@gpu
def test_two_gpus_in_one_process_follow_the_loop_without_replay(replay_on):
    """MXNet's multi-device loop (``ctx=[gpu(0), gpu(1)]``, one loss per device, ``autograd.backward``, one
    ``trainer.step``): each device's calls replay as their own signature, and the losses, the weights and the two
    copies follow the same loop with replay off. The replayed run is made with gpu(1) current, on purpose."""
    if mx.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {mx.num_gpus()}")
    gpus = [mx.gpu(0), mx.gpu(1)]
    rng = np.random.default_rng(7)
    batches = [(rng.standard_normal((16, 3, 12, 12)).astype("f"), rng.integers(0, 10, 16).astype("f"))
               for _ in range(6)]
    old = mx.set_math_mode("fp32")
    results = []
    try:
        for on in (False, True):
            mx.set_eager_replay(on)
            with gpus[int(on)]:
                net = _cnn(gpus, 5)
                for g in gpus:
                    net(nd.array(batches[0][0][:2], ctx=g))
                loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
                trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
                losses = []
                for x, y in batches:
                    xs = gluon.utils.split_and_load(nd.array(x), gpus)
                    ys = gluon.utils.split_and_load(nd.array(y), gpus)
                    with autograd.record():
                        ls = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
                    autograd.backward(ls)
                    trainer.step(len(x))
                    losses.append(np.concatenate([l.asnumpy() for l in ls]))
                copies = [(p.grad_req, [c.asnumpy() for c in p.list_data()]) for p in net.collect_params().values()]
            results.append((losses, copies, net))
    finally:
        mx.set_math_mode(old)
    (l0, c0, n0), (l1, c1, n1) = results
    assert "_auto" not in n0.__dict__
    assert n1.__dict__["_auto"].replays >= 2 * 3, n1.__dict__["_auto"].eager_reasons  # steps 3-6 on each GPU
    for a, b in zip(l0, l1):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for (req, p0), (_, p1) in zip(c0, c1):
        if req != "null":  # BatchNorm's running statistics are each device's own (its half of the batch)
            assert np.array_equal(p1[0], p1[1]), "the GPUs' copies differ"
        for a, b in zip(p0, p1):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
