"""Mixed precision the MXNet way: ``net.cast('float16')`` (BatchNorm stays float32), the Trainer keeping float32
master weights (``multi_precision``), float16 Dense (cublasGemmEx) and a float32 loss; on the CPU (numpy twins) and,
marker ``gpu``, on the GPU (cuDNN half convolutions, cuDNN's half-data BatchNorm)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import autograd, gluon, init, nd

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _ctx(device):
    import dnnbind
    return dnnbind.gpu(0) if device == "gpu" else dnnbind.cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_master_weights_keep_updates_float16_would_lose(device):
    """lr * grad = 1e-4 is a fifth of float16's spacing at 1.0 (2^-10): updated in float16 the weight would never
    move. The float32 master copy accumulates the ten updates, and the float16 weight shows them (0.999)."""
    ctx = _ctx(device)
    p = gluon.Parameter("w", shape=(4,))
    p.initialize(init=init.One(), ctx=ctx)
    p.cast("float16")
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 1e-4, "multi_precision": True})
    ones = nd.ones((4,), ctx=ctx, dtype="float16")
    for _ in range(10):
        with autograd.record():
            y = (p.data() * ones).sum()
        y.backward()
        trainer.step(1)
    w = p.data().asnumpy()
    assert w.dtype == np.float16
    np.testing.assert_allclose(w.astype(np.float64), 0.999, atol=2.5e-4)  # float16(0.999) = 0.99902


def _mlp():
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(16), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dense(5))
    return net


def _cnn():  # conv (+bias, fused relu), BatchNorm, pooling, a residual add, global pooling, Dense
    class Net(gluon.nn.Block):
        def __init__(self):
            super().__init__()
            self.c1 = gluon.nn.Conv2D(8, 3, padding=1, activation="relu")
            self.c2 = gluon.nn.Conv2D(8, 3, padding=1, use_bias=False)
            self.bn = gluon.nn.BatchNorm()
            self.pool = gluon.nn.MaxPool2D(2)
            self.gap = gluon.nn.GlobalAvgPool2D()
            self.out = gluon.nn.Dense(5)

        def forward(self, x):
            y = self.c1(x)
            y = nd.relu(self.bn(self.c2(y)) + y)
            return self.out(self.gap(self.pool(y)))
    return Net()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build, shape", [(_mlp, (8, 12)), (_cnn, (4, 3, 8, 8))], ids=["mlp", "cnn"])
def test_cast_network_trains_like_its_float64_twin(device, build, shape):
    """A network cast to float16, SGD with momentum, 3 steps: every float16 weight within float16 rounding of the
    same training run in float64 (from the same weights, on the same batches); BatchNorm's parameters and
    statistics stay float32 and follow too; the loss is float32."""
    ctx = _ctx(device)
    rng = np.random.default_rng(0)

    half, ref = build(), build()
    half.initialize(init.Xavier(), ctx=ctx)
    ref.initialize(init.Xavier(), ctx=ctx)
    x0 = rng.standard_normal(shape)
    half(nd.array(x0, ctx=ctx))
    ref(nd.array(x0, ctx=ctx))
    for ph, pr in zip(half.collect_params().values(), ref.collect_params().values()):
        pr.set_data(ph.data().astype("float64"))
    half.cast("float16")
    ref.cast("float64")
    kinds = {k.rsplit(".", 1)[-1] if "running" not in k else "stat": p.data().dtype
             for k, p in half._collect_params_with_prefix().items()}
    assert kinds["weight"] == np.float16 and kinds["gamma"] == np.float32 and kinds["stat"] == np.float32
    # the float64 run starts from the float16-rounded weights, as the half run does
    for ph, pr in zip(half.collect_params().values(), ref.collect_params().values()):
        pr.set_data(ph.data().astype("float64"))
    opts = {"learning_rate": 0.1, "momentum": 0.9, "multi_precision": True}
    th, tr = gluon.Trainer(half.collect_params(), "sgd", opts), gluon.Trainer(ref.collect_params(), "sgd", opts)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(3):
        x, y = rng.standard_normal(shape), rng.integers(0, 5, shape[0])
        for net, trainer, dt in ((half, th, "float16"), (ref, tr, "float64")):
            with autograd.record():
                loss = loss_fn(net(nd.array(x, ctx=ctx, dtype=dt)), nd.array(y, ctx=ctx))
            loss.backward()
            trainer.step(shape[0])
            if dt == "float16":
                assert loss.dtype == np.float32
    for (name, ph), pr in zip(half.collect_params().items(), ref.collect_params().values()):
        got, want = ph.data().asnumpy().astype(np.float64), pr.data().asnumpy()
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * scale, err_msg=name)
        assert np.abs(got - want).max() > 0 or ph.data().dtype != np.float16  # not trivially equal


def test_trainer_refuses_other_dtype_mixtures():
    a, b = gluon.Parameter("a", shape=(2,)), gluon.Parameter("b", shape=(2,))
    a.initialize()
    b.initialize()
    a.cast("float64")
    with pytest.raises(ValueError, match="Trainer: all trainable Parameters must share one dtype"):
        gluon.Trainer([a, b], "sgd", {"learning_rate": 0.1})


@pytest.mark.parametrize("device", DEVICES)
def test_loss_scaling_unscales_and_skips_overflowed_steps(device):
    """amp.scale_loss multiplies the loss by the scale; the Trainer divides it back out (the update equals the
    unscaled one); a step whose gradients hold an inf is skipped and halves the scale; scale_window clean steps
    double it."""
    from dnnbind import amp
    ctx = _ctx(device)
    p = gluon.Parameter("w", shape=(3,))
    p.initialize(init=init.Constant(0.5), ctx=ctx)
    p.cast("float16")
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 0.25, "multi_precision": True})
    scaler = amp.init_trainer(trainer, amp.LossScaler(init_scale=1024.0, scale_window=2))
    c = np.array([1.0, -2.0, 0.5], np.float16)

    def step(coef):
        with autograd.record():
            loss = (p.data() * nd.array(coef, ctx=ctx, dtype="float16")).sum()
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        np.testing.assert_allclose(p.grad().asnumpy(), coef.astype(np.float32) * scaler.loss_scale, rtol=1e-3)
        trainer.step(1)

    step(c)
    np.testing.assert_allclose(p.data().asnumpy(), 0.5 - 0.25 * c, rtol=1e-3)
    assert scaler.loss_scale == 1024.0
    before = p.data().asnumpy()
    step(np.array([np.inf, 1.0, 1.0], np.float16))  # overflow: skipped, scale halved
    np.testing.assert_array_equal(p.data().asnumpy(), before)
    assert scaler.loss_scale == 512.0 and scaler.skipped == 1
    step(c)
    step(c)  # two clean steps in a row: doubled
    assert scaler.loss_scale == 1024.0
    np.testing.assert_allclose(p.data().asnumpy(), before - 0.5 * c, rtol=1e-3)


def test_loss_scaler_arguments_and_use_before_init():
    from dnnbind import amp
    with pytest.raises(ValueError, match="LossScaler: need init_scale > 0"):
        amp.LossScaler(scale_factor=1.0)
    p = gluon.Parameter("w", shape=(2,))
    p.initialize()
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 0.1})
    with pytest.raises(RuntimeError, match="amp.init_trainer"):
        with amp.scale_loss(nd.ones((1,)), trainer):
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 64, 24, 24), (3, 5, 7, 1), (1, 2, 1, 1)])
def test_float16_conv_bias_gradient_through_gemmex(shape):
    """The conv bias gradient (dy summed over N, H, W) for float16 dy: two cublasGemmEx products against ones with
    float accumulation, within half rounding of the float64 sum."""
    import dnnbind
    from dnnbind.ops.conv import conv_backward_bias_gemv
    dy = np.random.default_rng(7).standard_normal(shape).astype(np.float16)
    got = conv_backward_bias_gemv(nd.array(dy, ctx=dnnbind.gpu(0), dtype="float16")).asnumpy()
    want = dy.astype(np.float64).sum((0, 2, 3))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_mxnet_contrib_amp_is_dnnbind_amp_and_init_says_what_to_do():
    """Through the alias, ``from mxnet.contrib import amp`` and ``import mxnet.contrib.amp`` give dnnbind.amp, while
    the rest of mxnet.contrib stays a stand-in; amp.init() refuses with the recipe that works."""
    import importlib
    import sys

    import dnnbind
    from dnnbind import amp
    from dnnbind.mxnet import _finder
    meta, mods = list(sys.meta_path), dict(sys.modules)
    dnnbind.install_mxnet_alias()
    try:
        contrib = importlib.import_module("mxnet.contrib")
        assert contrib.amp is amp
        assert importlib.import_module("mxnet.contrib.amp") is amp
        with pytest.raises(NotImplementedError, match=r"net.cast\('float16'\)"):
            contrib.amp.init()
        with pytest.raises(NotImplementedError, match="mxnet.contrib.onnx"):
            contrib.onnx.export_model()
    finally:
        _finder.uninstall_mxnet_alias()
        sys.meta_path[:] = meta
        for name in [n for n in sys.modules if n not in mods and (n == "mxnet" or n.startswith("mxnet."))]:
            del sys.modules[name]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.float16, np.float32), (np.float32, np.float64),
                                     (np.float64, np.float32)])
def test_copy_between_dtypes_converts_in_place(device, src, dst):
    """``out.copy_(x)`` across dtypes (the Trainer's float16 <-> float32 master copies): numpy's rounding, into a
    view of a larger buffer, the rest of it untouched."""
    ctx = _ctx(device)
    x = (np.random.default_rng(3).standard_normal((37, 5)) * 50).astype(src)
    out = nd.array(np.full((40, 5), 7, dtype=dst), ctx=ctx, dtype=dst)
    out[2:39].copy_(nd.array(x, ctx=ctx, dtype=src))
    got = out.asnumpy()
    assert got.dtype == dst
    np.testing.assert_array_equal(got[2:39], x.astype(dst))
    assert (got[:2] == 7).all() and (got[39:] == 7).all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape,kernel,stride,pad", [((8, 3, 17, 17), 3, 1, 1), ((4, 6, 30, 30), 5, 2, 2),
                                                     ((2, 1, 12, 12), 3, 1, 0)])
def test_float16_conv_with_relu_fused_matches_float64(shape, kernel, stride, pad):
    """Conv2D(activation='relu') in float16 (d2l's AlexNet cast to float16): one fused cuDNN call where cuDNN has
    an engine, three calls where not; either way within float16's rounding of the float64 result, and its
    gradients those of conv then relu."""
    from dnnbind.ops import reference as R
    ctx = _ctx("gpu")
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float16)
    w = (rng.standard_normal((8, shape[1], kernel, kernel)) / kernel).astype(np.float16)
    conv = R.conv_forward(x.astype(np.float64), w.astype(np.float64), None, (stride,) * 2, (pad,) * 2, (1, 1))
    b = (rng.standard_normal(8) * conv.std()).astype(np.float16)  # moves many outputs across zero
    z = conv + b.astype(np.float64).reshape(1, -1, 1, 1)
    args = dict(kernel=(kernel,) * 2, stride=(stride,) * 2, pad=(pad,) * 2, num_filter=8)
    got, grads = {}, {}
    for fused in (True, False):
        xs, ws, bs = (nd.array(a, ctx=ctx, dtype="float16") for a in (x, w, b))
        for a in (xs, ws, bs):
            a.attach_grad()
        with autograd.record():
            y = nd.Convolution(xs, ws, bs, act_type="relu", **args) if fused else \
                nd.relu(nd.Convolution(xs, ws, bs, **args))
        y.backward()
        got[fused] = y.asnumpy()
        grads[fused] = [a.grad.asnumpy().astype(np.float64) for a in (xs, ws, bs)]
    scale = np.abs(z).max()
    for fused in (True, False):
        np.testing.assert_allclose(got[fused].astype(np.float64), np.maximum(z, 0), atol=2e-3 * scale, rtol=2e-3)
    assert 0.1 < float(np.mean(got[True] == 0)) < 0.9
    # The gradients: relu's mask from the op's own output (where float16 rounding decides a near-zero z, the
    # two paths may differ), then the convolution's backward, in float64.
    dz = (got[True] > 0).astype(np.float64)
    f64 = (stride,) * 2, (pad,) * 2, (1, 1)
    want = [R.conv_backward_data(w.astype(np.float64), dz, x.shape, *f64),
            R.conv_backward_filter(x.astype(np.float64), dz, w.shape, *f64), dz.sum(axis=(0, 2, 3))]
    for name, a, ref in zip("xwb", grads[True], want):
        np.testing.assert_allclose(a, ref, atol=1e-2 * np.abs(ref).max(), rtol=1e-2, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fused_half_update_equals_cast_update_cast(device, momentum, monkeypatch):
    """The Trainer's one-pass float16 update (float16 gradients read, float16 weights written) gives bitwise the
    weights of the three-pass form (cast the gradients to float32, update the master weights, cast back)."""
    ctx = _ctx(device)
    rng = np.random.default_rng(int(momentum * 10) + 7)
    batches = [(rng.standard_normal((6, 5)).astype(np.float16), rng.integers(0, 3, 6)) for _ in range(4)]
    results, calls = [], []
    original = gluon.optimizer.SGD.update_flat_mixed
    monkeypatch.setattr(gluon.optimizer.SGD, "update_flat_mixed",
                        lambda self, *a: calls.append(1) or original(self, *a))
    for fused in (True, False):
        if not fused:
            assert len(calls) == len(batches)  # the fused run took the one-pass update every step
            monkeypatch.setattr(gluon.Trainer, "_fused_half", lambda self, fresh: False)
        np.random.seed(3)
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(7, activation="relu"), gluon.nn.Dense(3))
        net.initialize(init.Xavier(), ctx=ctx)
        net(nd.ones((1, 5), ctx=ctx))
        net.cast("float16")
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": momentum,
                                                               "wd": 1e-3, "multi_precision": True})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for x, y in batches:
            with autograd.record():
                loss = loss_fn(net(nd.array(x, ctx=ctx, dtype="float16")), nd.array(y, ctx=ctx, dtype="int32"))
            loss.backward()
            trainer.step(6)
        results.append(([p.data().asnumpy() for p in net.collect_params().values()],
                        trainer._flat_data.asnumpy().copy()))
    (w_fused, m_fused), (w_plain, m_plain) = results
    assert all(a.dtype == np.float16 for a in w_fused)
    for a, b in zip(w_fused, w_plain):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(m_fused, m_plain)
    assert not np.array_equal(m_fused, 0) and len(calls) == len(batches)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_gradients_of_float16_parameters_only_when_an_update_reads_them(device, monkeypatch):
    """The one-pass float16 update reads float16 gradients, so the Trainer keeps no float32 gradient range for
    float16 Parameters; a step that needs one (here clip_gradient set between steps) packs again with it and goes on
    with the same weights and momentum as a Trainer that had it from the start."""
    ctx = _ctx(device)
    rng = np.random.default_rng(11)
    batches = [(rng.standard_normal((6, 5)).astype(np.float16), rng.integers(0, 3, 6)) for _ in range(5)]
    results = []
    for always in (False, True):
        if always:
            monkeypatch.setattr(gluon.Trainer, "_fused_half", lambda self, fresh: False)
        np.random.seed(5)
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(7), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dense(3))
        net.initialize(init.Xavier(), ctx=ctx)
        net(nd.ones((2, 5), ctx=ctx))
        net.cast("float16")  # BatchNorm's gamma and beta stay float32: their gradient range is kept either way
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9,
                                                               "multi_precision": True})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        bases = []
        for k, (x, y) in enumerate(batches):
            if k == 3:
                trainer._optimizer.clip_gradient = 1e6  # clipping reads float32 gradients; too wide to clip
            with autograd.record():
                loss = loss_fn(net(nd.array(x, ctx=ctx, dtype="float16")), nd.array(y, ctx=ctx, dtype="int32"))
            loss.backward()
            trainer.step(6)
            b = trainer._bufs[0]
            bases.append((b.grad_base, b.grad.size, b.data.size, trainer._half_end))
        results.append(([p.data().asnumpy() for p in net.collect_params().values()], trainer._states[0].asnumpy()))
        if not always:
            half_end = bases[0][3]
            assert half_end > 0 and bases[0][:3] == (half_end, bases[0][2] - half_end, bases[0][2])
            assert [g for g, *_ in bases] == [half_end] * 3 + [0, 0]  # packed again at the clipped step
            assert bases[-1][1] == bases[-1][2]
    (w_lazy, s_lazy), (w_full, s_full) = results
    for a, b in zip(w_lazy, w_full):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(s_lazy, s_full)
    assert not np.array_equal(s_lazy, 0)
