"""Initializers (mx.init), metrics (mx.metric / gluon.metric) and gluon.utils on the CPU: exact draws from numpy's
global generator, MXNet's shape rules and name dispatch, metrics against hand-computed values and MXNet 1.9.1
fixtures, split_data/split_and_load and clip_global_norm against float64 numpy.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _helpers import assert_close

from dnnbind import cpu, initializer, nd
from dnnbind.gluon import Parameter, metric, nn, utils
from dnnbind.initializer import InitDesc

init = initializer


def _filled(ini, name, shape, seed=0, attrs=None):
    arr = nd.zeros(shape)
    np.random.seed(seed)
    ini(InitDesc(name, attrs), arr)
    return arr.numpy()


def _fans(shape):
    rf = float(np.prod(shape[2:])) if len(shape) > 2 else 1.0
    return shape[1] * rf, shape[0] * rf


# -- initializers -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2, 2), (7, 6, 3)])
def test_uniform_normal_constant_draw_exactly_from_numpy(shape):
    np.random.seed(3)
    want = np.random.uniform(-0.3, 0.3, shape).astype(np.float32)
    np.testing.assert_array_equal(_filled(init.Uniform(0.3), "fc_weight", shape, seed=3), want)
    np.random.seed(4)
    want = np.random.normal(0, 0.2, shape).astype(np.float32)
    np.testing.assert_array_equal(_filled(init.Normal(0.2), "fc_weight", shape, seed=4), want)
    np.testing.assert_array_equal(_filled(init.Constant(1.5), "fc_weight", shape), np.full(shape, 1.5, np.float32))
    np.testing.assert_array_equal(_filled(init.One(), "fc_weight", shape), np.ones(shape, np.float32))
    np.testing.assert_array_equal(_filled(init.Zero(), "fc_weight", shape), np.zeros(shape, np.float32))


@pytest.mark.parametrize("shape", [(6, 4), (8, 3, 3, 3), (5, 2, 4)])
@pytest.mark.parametrize("rnd_type", ["uniform", "gaussian"])
@pytest.mark.parametrize("factor_type", ["avg", "in", "out"])
def test_xavier_scale_from_fans(shape, rnd_type, factor_type):
    fan_in, fan_out = _fans(shape)
    factor = {"avg": (fan_in + fan_out) / 2, "in": fan_in, "out": fan_out}[factor_type]
    scale = math.sqrt(2.34 / factor)
    np.random.seed(1)
    want = (np.random.uniform(-scale, scale, shape) if rnd_type == "uniform"
            else np.random.normal(0, scale, shape)).astype(np.float32)
    got = _filled(init.Xavier(rnd_type, factor_type, 2.34), "conv_weight", shape, seed=1)
    assert_close(got, want, rtol=1e-6, atol=0, name="xavier")
    if rnd_type == "uniform":
        assert np.abs(got).max() <= scale


def test_xavier_statistics_and_msra():
    got = _filled(init.Xavier(), "w_weight", (200, 300), seed=2)
    assert np.abs(got).max() <= math.sqrt(3 / 250) and abs(got.var() - 2 / 500) < 2e-4  # Glorot's variance
    slope = 0.1
    got = _filled(init.MSRAPrelu("in", slope), "w_weight", (100, 50, 3, 3), seed=5)
    assert abs(got.std() - math.sqrt(2 / (1 + slope ** 2) / 450)) < 2e-3 and abs(got.mean()) < 2e-3
    with pytest.raises(ValueError, match="fan_in"):
        _filled(init.Xavier(), "v_weight", (7,))
    with pytest.raises(ValueError, match="rnd_type"):
        init.Xavier(rnd_type="cauchy")


@pytest.mark.parametrize("shape", [(4, 6), (6, 4), (3, 2, 2, 2), (5, 5)])
@pytest.mark.parametrize("rand_type", ["uniform", "normal"])
def test_orthogonal_is_orthogonal(shape, rand_type):
    w = _filled(init.Orthogonal(scale=1.7, rand_type=rand_type), "w_weight", shape, seed=6).astype(np.float64)
    m = w.reshape(shape[0], -1)
    gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    assert_close(gram, 1.7 ** 2 * np.eye(gram.shape[0]), rtol=0, atol=2e-5, name="gram")
    assert not np.allclose(m, _filled(init.Orthogonal(1.7, rand_type), "w_weight", shape, seed=7).reshape(m.shape))


def test_bilinear_kernel():
    w = _filled(init.Bilinear(), "up_weight", (2, 1, 4, 4))
    want = np.zeros(32)
    f = math.ceil(4 / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    for i in range(32):  # MXNet's element loop, written out
        x, y = i % 4, (i // 4) % 4
        want[i] = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
    assert_close(w.ravel(), want, rtol=1e-6, atol=1e-7, name="bilinear")


def test_name_dispatch_and_explicit_init():
    u = init.Uniform(0.5)
    shape = (3, 4)
    assert np.abs(_filled(u, "dense0_weight", shape)).max() > 0
    for name, value in [("dense0_bias", 0), ("bn_gamma", 1), ("bn_beta", 0), ("bn_running_mean", 0),
                        ("bn_running_var", 1), ("bn_moving_var", 1), ("q_min", 0), ("q_max", 1)]:
        np.testing.assert_array_equal(_filled(u, name, shape), np.full(shape, value, np.float32), err_msg=name)
    # A Parameter's own initializer (InitDesc attrs['__init__']) wins whatever the name, as in MXNet.
    np.testing.assert_array_equal(_filled(u, "dense0_bias", shape, attrs={"__init__": "ones"}), np.ones(shape))
    np.testing.assert_array_equal(_filled(u, "dense0_bias", shape, attrs={"__init__": init.Constant(3)}),
                                  np.full(shape, 3.0))


def test_mixed_dispatch_by_pattern():
    mixed = init.Mixed(["dense.*", ".*bias", "conv.*"], [init.Constant(2.0), init.Zero(), init.Uniform(0.1)])
    np.testing.assert_array_equal(_filled(mixed, "dense1_weight", (3,)), np.full(3, 2.0))
    # The chosen initializer still dispatches on the name, as in MXNet: Constant fills weights, biases stay 0.
    np.testing.assert_array_equal(_filled(mixed, "dense1_bias", (3,)), np.zeros(3))
    np.testing.assert_array_equal(_filled(mixed, "conv1_bias", (3,)), np.zeros(3))
    np.random.seed(9)
    want = np.random.uniform(-0.1, 0.1, (2, 3)).astype(np.float32)
    np.testing.assert_array_equal(_filled(mixed, "conv1_weight", (2, 3), seed=9), want)
    strict = init.Mixed(["conv.*"], [init.One()])
    with pytest.raises(ValueError, match="did not match"):
        _filled(strict, "dense_weight", (2,))
    with pytest.raises(ValueError, match="patterns"):
        init.Mixed(["a", "b"], [init.One()])


class _MyInit(init.Initializer):
    """The computation chapter's custom initializer: overrides _init_weight only, writes with nd ops."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _init_weight(self, name, data):
        self.seen.append((str(name), data.shape))
        data[:] = nd.random.uniform(low=-10, high=10, shape=data.shape)
        data *= data.abs() >= 5


def test_custom_initializer_in_a_network():
    net = nn.Sequential()
    net.add(nn.Dense(8, activation="relu"), nn.Dense(3))
    my = _MyInit()
    net.initialize(my)
    net(nd.array(np.random.RandomState(0).rand(2, 5).astype(np.float32)))
    assert [s for _, s in my.seen] == [(8, 5), (3, 8)] and all(n.endswith("weight") for n, _ in my.seen)
    w = net[0].weight.data().numpy()
    assert ((np.abs(w) >= 5) | (w == 0)).all() and (np.abs(w) >= 5).any() and np.abs(w).max() <= 10
    np.testing.assert_array_equal(net[0].bias.data().numpy(), np.zeros(8))  # biases keep MXNet's zeros


def test_default_initializer_is_uniform_007_and_create():
    p = Parameter("dense9_weight", shape=(30, 40))
    np.random.seed(12)
    p.initialize()
    np.random.seed(12)
    np.testing.assert_array_equal(p.data().numpy(), np.random.uniform(-0.07, 0.07, (30, 40)).astype(np.float32))
    assert isinstance(init.create("xavier"), init.Xavier) and isinstance(init.create("zeros"), init.Zero)
    assert isinstance(init.create("orthogonal"), init.Orthogonal) and isinstance(init.create("bilinear"), init.Bilinear)
    assert init.Xavier(factor_type="in", magnitude=2.34).dumps() == \
        '["xavier", {"rnd_type": "uniform", "factor_type": "in", "magnitude": 2.34}]'
    assert init.Normal(0.5) == init.Normal(0.5) and init.Normal(0.5) != init.Normal(0.4)
    with pytest.raises(ValueError, match="unknown initializer"):
        init.create("glorot_typo")


# -- metrics ----------------------------------------------------------------------------------------------------
def _mx_inputs():
    """The arrays of the MXNet fixture script (numpy's legacy RandomState(3) stream is version-stable)."""
    rs = np.random.RandomState(3)
    p1 = rs.rand(6, 4).astype(np.float32)
    l1 = np.array([0, 3, 1, 1, 2, 0], np.float32)
    p2 = rs.rand(5, 4).astype(np.float32)
    l2 = np.array([2, 2, 3, 0, 1], np.float32)
    b1 = rs.rand(6, 2).astype(np.float32)
    bl1 = np.array([0, 1, 1, 0, 1, 1], np.float32)
    b2 = rs.rand(4, 2).astype(np.float32)
    bl2 = np.array([1, 0, 0, 1], np.float32)
    r1, rl1 = rs.rand(6).astype(np.float32), rs.rand(6).astype(np.float32)
    r2, rl2 = rs.rand(3, 2).astype(np.float32), rs.rand(3, 2).astype(np.float32)
    s1, s2 = p1 / p1.sum(1, keepdims=True), p2 / p2.sum(1, keepdims=True)
    return {"cls": [(l1, p1), (l2, p2)], "prob": [(l1, s1), (l2, s2)], "bin": [(bl1, b1), (bl2, b2)],
            "reg": [(rl1, r1), (rl2, r2)]}


# MXNet 1.9.1 (CPU wheel, /tmp/mx38) with the inputs above, each pair passed as update([label], [pred]):
MXNET_METRICS = [
    (lambda: metric.Accuracy(), "cls", ("accuracy", 0.2727272727272727)),
    (lambda: metric.TopKAccuracy(top_k=3), "cls", ("top_k_accuracy_3", 0.8181818181818182)),
    (lambda: metric.CrossEntropy(), "prob", ("cross-entropy", 1.6388053894042969)),
    (lambda: metric.F1(), "bin", ("f1", 0.5666666666666667)),
    (lambda: metric.F1(average="micro"), "bin", ("f1", 0.5454545454545454)),
    (lambda: metric.MAE(), "reg", ("mae", 0.39255841076374054)),
    (lambda: metric.MSE(), "reg", ("mse", 0.19243761152029037)),
    (lambda: metric.RMSE(), "reg", ("rmse", 0.4343985915184021)),
    (lambda: metric.Loss(), "reg", ("loss", 0.29028486212094623)),
]


@pytest.mark.parametrize("make,data,want", MXNET_METRICS, ids=[w[0] + str(i) for i, (_, _, w) in
                                                                enumerate(MXNET_METRICS)])
def test_metrics_match_mxnet(make, data, want):
    m = make()
    for label, pred in _mx_inputs()[data]:
        m.update([nd.array(label)], [nd.array(pred)])
    name, value = m.get()
    assert name == want[0] and value == pytest.approx(want[1], rel=1e-6)
    m.reset()
    assert math.isnan(m.get()[1])


def test_metrics_hand_computed():
    rs = np.random.RandomState(21)
    pred = rs.rand(8, 5).astype(np.float32)
    label = rs.randint(0, 5, 8)
    acc = metric.Accuracy()
    acc.update(nd.array(label), nd.array(pred))  # single arrays, not lists
    acc.update([nd.array(label[:3])], [nd.array(pred[:3].argmax(1))])  # class-id predictions
    hits = (pred.argmax(1) == label).sum() + (pred[:3].argmax(1) == label[:3]).sum()
    assert acc.get()[1] == pytest.approx(hits / 11)
    top = metric.create("top_k_acc", top_k=2)
    top.update([nd.array(label)], [nd.array(pred)])
    order = np.argsort(-pred, axis=1)[:, :2]
    assert top.get() == ("top_k_accuracy_2", pytest.approx((order == label[:, None]).any(1).mean()))
    probs = pred / pred.sum(1, keepdims=True)
    ce = metric.create("ce")
    ce.update([nd.array(label)], [nd.array(probs)])
    assert ce.get()[1] == pytest.approx(-np.log(probs[np.arange(8), label].astype(np.float64) + 1e-12).mean(), rel=1e-6)
    y, yhat = rs.rand(4, 3), rs.rand(4, 3)
    for name, fn in [("mae", lambda d: np.abs(d).mean()), ("mse", lambda d: (d ** 2).mean()),
                     ("rmse", lambda d: np.sqrt((d ** 2).mean()))]:
        m = metric.create(name)
        m.update([nd.array(y)], [nd.array(yhat)])
        m.update([nd.array(y[:2])], [nd.array(yhat[:2])])
        want = (fn(y - yhat) + fn(y[:2] - yhat[:2])) / 2  # the mean of per-batch values, as MXNet
        assert m.get() == (name, pytest.approx(want, rel=1e-5))
    f1 = metric.F1()
    f1.update([nd.array([0, 1, 1])], [nd.array([[0.3, 0.7], [0.0, 1.0], [0.4, 0.6]])])
    assert f1.get() == ("f1", pytest.approx(0.8))  # MXNet's docstring example
    loss = metric.Loss()
    loss.update(None, [nd.array([1.0, 2.0]), nd.array([[3.0]])])
    assert loss.get() == ("loss", 2.0)
    with pytest.raises(ValueError, match="labels"):
        metric.Accuracy().update([nd.array(label)], [nd.array(pred), nd.array(pred)])
    with pytest.raises(ValueError, match="binary"):
        metric.F1().update([nd.array([0, 1, 2])], [nd.array(np.eye(3)[:, :2])])


def test_composite_create_and_custom():
    comp = metric.create(["acc", "ce", lambda label, pred: float(np.abs(label - pred.argmax(1)).sum())])
    assert isinstance(comp, metric.CompositeEvalMetric) and len(comp.metrics) == 3
    label = np.array([0, 1, 1], np.float32)
    pred = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]], np.float32)
    comp.update([nd.array(label)], [nd.array(pred)])
    names, values = comp.get()
    assert names == ["accuracy", "cross-entropy", "custom(<lambda>)"]
    assert values == pytest.approx([2 / 3, -np.mean(np.log([0.9, 0.8, 0.3])), 1.0], rel=1e-6)
    assert comp.get_name_value()[0] == ("accuracy", pytest.approx(2 / 3))
    comp.add(metric.Loss())
    comp.reset()
    assert all(math.isnan(v) for v in comp.get()[1])
    import dnnbind.mxnet  # noqa: F401
    from dnnbind.mxnet import _finder
    assert _finder.TARGETS["mxnet.metric"] == ("dnnbind.gluon.metric",)
    with pytest.raises(ValueError, match="unknown metric"):
        metric.create("accuracyy")


# -- gluon.utils ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis,n", [((7, 3), 0, 3), ((2, 10), 1, 4), ((4, 5, 6), 2, 6), ((8, 2), 0, 4)])
def test_split_data_and_split_and_load(shape, axis, n):
    x = np.random.RandomState(1).rand(*shape).astype(np.float32)
    parts = utils.split_data(nd.array(x), n, batch_axis=axis, even_split=False)
    size = shape[axis]
    sizes = [size // n + (1 if i < size % n else 0) for i in range(n)]  # MXNet: the first slices take the extras
    assert [p.shape[axis] for p in parts] == sizes
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts], axis=axis), x)
    if size % n:
        with pytest.raises(ValueError, match="evenly"):
            utils.split_data(nd.array(x), n, batch_axis=axis)
    loaded = utils.split_and_load(x, [cpu(0)] * n, batch_axis=axis, even_split=False)
    assert len(loaded) == n and all(p.context == cpu(0) for p in loaded)
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in loaded], axis=axis), x)
    one = utils.split_and_load(nd.array(x), [cpu(0)])
    np.testing.assert_array_equal(one[0].numpy(), x)


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 100.0])
def test_clip_global_norm(max_norm):
    rs = np.random.RandomState(2)
    host = [rs.standard_normal(s) for s in [(3, 4), (5,), (2, 2, 2)]]
    arrays = [nd.array(h.astype(np.float32)) for h in host]
    norm = utils.clip_global_norm(arrays, max_norm)
    want = math.sqrt(sum((h ** 2).sum() for h in host))
    assert isinstance(norm, np.float32) and norm == pytest.approx(want, rel=1e-5)  # MXNet's asscalar()
    scale = min(max_norm / (want + 1e-8), 1.0)
    for a, h in zip(arrays, host):
        assert_close(a, h * scale, rtol=1e-5, atol=1e-6, name="clipped")
    lazy = utils.clip_global_norm([nd.array(host[0].astype(np.float32))], max_norm, check_isfinite=False)
    assert lazy.shape == (1,)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        utils.clip_global_norm([nd.array(np.array([np.inf, 1.0], np.float32))], 1.0)
    assert any("nan or inf" in str(w.message) for w in caught)


def test_clip_global_norm_mxnet_fixture():
    # MXNet 1.9.1: clip_global_norm([P1, P2], 1.5) of the metric inputs returned 3.532474 and left
    # P1.sum() == 4.326 (printed to float32 precision).
    rs = np.random.RandomState(3)
    arrays = [nd.array(rs.rand(6, 4).astype(np.float32)), nd.array(rs.rand(5, 4).astype(np.float32))]
    assert utils.clip_global_norm(arrays, 1.5) == pytest.approx(3.532474, rel=1e-6)
    assert float(arrays[0].numpy().sum()) == pytest.approx(4.326, abs=5e-4)


def test_check_sha1_and_download_offline(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(b"dnnbind" * 1000)
    import hashlib
    digest = hashlib.sha1(f.read_bytes()).hexdigest()
    assert utils.check_sha1(f, digest) and not utils.check_sha1(f, "0" * 40)
    # A good local copy is returned without any network access.
    assert utils.download("http://invalid.invalid/data.bin", path=str(f), sha1_hash=digest) == str(f)
    with pytest.raises(OSError, match="could not fetch"):
        utils.download("http://invalid.invalid/data.bin", path=str(tmp_path / "sub") + "/", retries=1)
    assert not list((tmp_path).glob("sub/*"))  # nothing half-written
    with pytest.raises(ValueError, match="retries"):
        utils.download("http://invalid.invalid/x", path=str(tmp_path), retries=-1)
