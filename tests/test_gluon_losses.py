"""Gluon losses with MXNet 1.x semantics (issue 11): forward against float64 numpy references written here from
the documented formulas (weight, sample_weight broadcasting, mean over all but the batch axis, KLDivLoss's sum),
several shapes, gradients by central differences, and fixtures produced by MXNet 1.9.1 itself.

``MXNET`` below: outputs of ``mxnet.gluon.loss`` 1.9.1 (the CPU wheel on Python 3.8) for the inputs ``_inputs()``
builds with ``np.random.RandomState(seed).uniform(lo, hi, shape).astype(float32)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_close, nd_gradcheck

import dnnbind
from dnnbind import autograd, nd
from dnnbind.gluon import loss as gloss

CPU = dnnbind.cpu()


def _rand(seed, shape, lo=-2.0, hi=2.0):
    return np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


MXNET = {
    "sce": [1.3262494, 0.67118341, 2.2106369],
    "sce_w_sw": [0.97553408, 0.56762207, 1.2238822],
    "sce_dense": [1.2893975, 2.1050615, 1.2810019],
    "sce_axis1": [2.0846624, 1.4684176],
    "l2": [2.9575315, 1.7634826, 0.16450582],
    "l2_ba1": [2.1968117, 1.0602015],
    "l1_sw": [4.8947835, 3.1468437, 0.7886132],
    "bce": [0.8747943, 0.59719318, 0.79918426],
    "bce_pw": [0.54565054, 0.59719318, 0.99559599],
    "bce_fs": [0.87479436, 0.59719318, 0.79918426],
    "kl": [0.068001658, 1.3793609, 0.17805037],
    "kl_nl": [0.068001658, 1.3793609, 0.17805037],
    "huber": [2.0790792, 1.1081775, 0.27510542],
    "hinge": [1.1263235, 0.79367685, 1.113088],
    "sqhinge": [1.7044144, 0.29724166, 0.72018242],
    "logistic": [0.8747943, 0.59719318, 0.79918426],
    "logistic_bin": [0.8747943, 0.59719318, 0.79918426],
}


def _inputs():
    p = _rand(2, (3, 4))
    lab = np.array([0, 3, 1], dtype=np.float32)
    sw = _rand(3, (3, 1), 0.5, 1.5)
    dl = np.random.RandomState(4).dirichlet(np.ones(4), 3).astype(np.float32)
    p3, lab3 = _rand(5, (2, 4, 3)), np.array([[0, 2, 1], [3, 3, 0]], dtype=np.float32)
    q, t = _rand(6, (3, 2, 2)), _rand(7, (3, 2, 2))
    b = (_rand(8, (3, 2, 2)) > 0).astype(np.float32)
    return p, lab, sw, dl, p3, lab3, q, t, b, b * 2 - 1


def _mxnet_cases(device=CPU):
    p, lab, sw, dl, p3, lab3, q, t, b, sgn = (nd.array(a, ctx=device) for a in _inputs())
    sig = nd.sigmoid(q)
    return {
        "sce": lambda: gloss.SoftmaxCrossEntropyLoss()(p, lab),
        "sce_w_sw": lambda: gloss.SoftmaxCrossEntropyLoss(weight=0.7)(p, lab, sw),
        "sce_dense": lambda: gloss.SoftmaxCrossEntropyLoss(sparse_label=False)(p, dl),
        "sce_axis1": lambda: gloss.SoftmaxCrossEntropyLoss(axis=1)(p3, lab3),
        "l2": lambda: gloss.L2Loss()(q, t),
        "l2_ba1": lambda: gloss.L2Loss(batch_axis=1)(q, t),
        "l1_sw": lambda: gloss.L1Loss(weight=2.0)(q, t, sw.reshape((3, 1, 1))),
        "bce": lambda: gloss.SigmoidBCELoss()(q, b),
        "bce_pw": lambda: gloss.SigmoidBCELoss()(q, b, None, nd.array(np.array([1.5, 0.5], dtype=np.float32), ctx=device)),
        "bce_fs": lambda: gloss.SigmoidBCELoss(from_sigmoid=True)(sig, b),
        "kl": lambda: gloss.KLDivLoss()(nd.log_softmax(p), dl),
        "kl_nl": lambda: gloss.KLDivLoss(from_logits=False)(p, dl),
        "huber": lambda: gloss.HuberLoss(rho=0.5)(q, t),
        "hinge": lambda: gloss.HingeLoss()(q, sgn),
        "sqhinge": lambda: gloss.SquaredHingeLoss(margin=0.5)(q, sgn),
        "logistic": lambda: gloss.LogisticLoss()(q, sgn),
        "logistic_bin": lambda: gloss.LogisticLoss(label_format="binary")(q, b),
    }


@pytest.mark.parametrize("key", sorted(MXNET))
def test_matches_mxnet_1_9_1(key):
    assert_close(_mxnet_cases()[key](), np.array(MXNET[key]), 1e-5, 1e-6, name=key)


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(MXNET))
def test_gpu_matches_cpu(key, gpu):
    assert_close(_mxnet_cases(gpu)[key](), _mxnet_cases(CPU)[key](), 1e-5, 1e-6, name=key)


# name: (pred's index in _inputs(), label's index, loss)
GRAD_CASES = {
    "sce": (0, 1, lambda: gloss.SoftmaxCrossEntropyLoss()),
    "sce_axis1": (4, 5, lambda: gloss.SoftmaxCrossEntropyLoss(axis=1)),
    "sce_dense": (0, 3, lambda: gloss.SoftmaxCrossEntropyLoss(sparse_label=False)),
    "bce": (6, 8, lambda: gloss.SigmoidBCELoss()),
    "kl_nl": (0, 3, lambda: gloss.KLDivLoss(from_logits=False)),
    "huber": (6, 7, lambda: gloss.HuberLoss(rho=0.5)),
    "l2_ba1": (6, 7, lambda: gloss.L2Loss(batch_axis=1)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gpu_gradients_match_cpu(case, gpu):
    pi, li, make = GRAD_CASES[case]
    grads = []
    for device in (CPU, gpu):
        inputs = _inputs()
        x, label = nd.array(inputs[pi], ctx=device), nd.array(inputs[li], ctx=device)
        x.attach_grad()
        with autograd.record():
            out = make()(x, label)
        out.backward()
        grads.append(x.grad.numpy())
    assert_close(grads[1], grads[0], 1e-5, 1e-6, name=f"{case} grad")


def test_facts_reference_value():
    # FACTS.md: SoftmaxCrossEntropyLoss [[1, 2, 3]] with label 2 -> 0.40760383 (MXNet 1.9.1).
    out = gloss.SoftmaxCrossEntropyLoss()(nd.array(np.array([[1.0, 2.0, 3.0]], dtype=np.float32)), nd.array([2]))
    assert out.shape == (1,)
    assert_close(out, np.array([0.40760383]), 1e-5, 0)


# -- numpy references -----------------------------------------------------------------------------------------

def np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def per_sample(loss, batch_axis=0, reduce="mean"):
    moved = np.moveaxis(loss, batch_axis, 0).reshape(loss.shape[batch_axis], -1)
    return moved.mean(axis=1) if reduce == "mean" else moved.sum(axis=1)


def np_softrelu(x):
    return np.logaddexp(0.0, x)


SHAPES = [(4, 3), (3, 2, 5), (2, 3, 2, 2)]


def _pair(shape, seed):
    return _rand(seed, shape).astype(np.float64), _rand(seed + 1, shape).astype(np.float64)


def _sw_shape(shape, batch_axis=0):
    s = [1] * len(shape)
    s[batch_axis] = shape[batch_axis]
    return tuple(s)


# (name, loss factory, reference(pred, label) -> element-wise loss, label kind, reduce)
ELEMENTWISE = [
    ("l2", lambda **k: gloss.L2Loss(**k), lambda p, y: 0.5 * (p - y) ** 2, "real", "mean"),
    ("l1", lambda **k: gloss.L1Loss(**k), lambda p, y: np.abs(p - y), "real", "mean"),
    ("huber", lambda **k: gloss.HuberLoss(rho=0.7, **k),
     lambda p, y: np.where(np.abs(p - y) > 0.7, np.abs(p - y) - 0.35, np.square(p - y) / 1.4), "real", "mean"),
    ("hinge", lambda **k: gloss.HingeLoss(margin=1.2, **k), lambda p, y: np.maximum(1.2 - p * y, 0), "sign", "mean"),
    ("sqhinge", lambda **k: gloss.SquaredHingeLoss(**k), lambda p, y: np.maximum(1 - p * y, 0) ** 2, "sign", "mean"),
    ("logistic", lambda **k: gloss.LogisticLoss(**k), lambda p, y: np.log1p(np.exp(-p * y)), "sign", "mean"),
    ("bce", lambda **k: gloss.SigmoidBinaryCrossEntropyLoss(**k),
     lambda p, y: -(y * np.log(1 / (1 + np.exp(-p))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-p)))), "binary", "mean"),
    ("kl", lambda **k: gloss.KLDivLoss(**k), lambda p, y: y * (np.log(y + 1e-12) - p), "prob", "sum"),
]


def _label(kind, shape, seed):
    r = _rand(seed, shape).astype(np.float64)
    if kind == "sign":
        return np.where(r > 0, 1.0, -1.0)
    if kind == "binary":
        return (r > 0).astype(np.float64)
    if kind == "prob":
        return (r + 2.5) / 10
    return r


@pytest.mark.parametrize("case", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_losses_forward(case, shape):
    name, make, ref, kind, reduce = case
    pred, _ = _pair(shape, 10)
    label = _label(kind, shape, 11)
    out = make()(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32)))
    assert out.shape == (shape[0],)
    assert_close(out, per_sample(ref(pred, label), 0, reduce), 2e-5, 1e-5, name=name)
    # weight, sample_weight of shape (N, 1, ...) broadcast over the rest, and batch_axis=1
    sw = _rand(12, _sw_shape(shape), 0.5, 1.5).astype(np.float64)
    weight = 0.7 if name != "l2" else 1.4  # L2Loss scales by weight / 2
    out = make(weight=weight)(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32)),
                              nd.array(sw.astype(np.float32)))
    assert_close(out, per_sample(ref(pred, label) * sw * 0.7 * (2 if name == "l2" else 1), 0, reduce), 2e-5, 1e-5,
                 name=f"{name} weighted")
    out = make(batch_axis=1)(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32)))
    assert_close(out, per_sample(ref(pred, label), 1, reduce), 2e-5, 1e-5, name=f"{name} batch_axis=1")


@pytest.mark.parametrize("case", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_losses_gradients(case):
    _, make, _, kind, _ = case
    label = _label(kind, (3, 2, 2), 13)
    sw = _rand(14, (3, 1, 1), 0.5, 1.5)
    nd_gradcheck(lambda p: make(weight=1.3)(p, label, sw), [_rand(15, (3, 2, 2))], CPU)


def test_bce_from_sigmoid_and_pos_weight():
    pred, label = _rand(16, (4, 3)).astype(np.float64), _label("binary", (4, 3), 17)
    pw = _rand(18, (3,), 0.5, 2.0).astype(np.float64)
    sig = 1 / (1 + np.exp(-pred))
    ref = -(pw * label * np.log(sig) + (1 - label) * np.log(1 - sig))
    out = gloss.SigmoidBCELoss()(nd.array(pred), nd.array(label), None, nd.array(pw))
    assert_close(out, ref.mean(axis=1), 1e-6, 1e-6, name="pos_weight")
    out = gloss.SigmoidBCELoss(from_sigmoid=True)(nd.array(sig), nd.array(label), None, nd.array(pw))
    assert_close(out, ref.mean(axis=1), 1e-6, 1e-6, name="from_sigmoid pos_weight")
    nd_gradcheck(lambda p: gloss.SigmoidBCELoss()(p, label, None, pw), [pred], CPU)
    nd_gradcheck(lambda p: gloss.SigmoidBCELoss(from_sigmoid=True)(p, label), [sig], CPU, rtol=1e-4)


# -- softmax cross-entropy --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis", [((5, 4), -1), ((5, 4), 1), ((3, 4, 2), 1), ((2, 3, 5), -1),
                                        ((2, 3, 2, 4), 1)])
@pytest.mark.parametrize("from_logits", [False, True])
def test_softmax_ce_sparse(shape, axis, from_logits):
    pred = _rand(20, shape).astype(np.float64)
    a = axis % len(shape)
    lab_shape = shape[:a] + shape[a + 1:]
    label = np.random.RandomState(21).randint(0, shape[a], lab_shape).astype(np.float64)
    logp = pred if from_logits else np_log_softmax(pred, a)
    picked = np.take_along_axis(logp, np.expand_dims(label.astype(int), a), axis=a)
    loss = gloss.SoftmaxCrossEntropyLoss(axis=axis, from_logits=from_logits)
    assert_close(loss(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32))),
                 per_sample(-picked), 2e-5, 1e-5, name="sparse")
    sw = _rand(22, (shape[0],) + (1,) * (len(shape) - 1), 0.5, 1.5).astype(np.float64)
    loss = gloss.SoftmaxCrossEntropyLoss(axis=axis, from_logits=from_logits, weight=0.5)
    assert_close(loss(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32)), nd.array(sw)),
                 per_sample(-picked * sw * 0.5), 2e-5, 1e-5, name="sparse weighted")
    nd_gradcheck(lambda p: loss(p, label, sw), [pred], CPU)


@pytest.mark.parametrize("shape,axis", [((5, 4), -1), ((3, 4, 2), 1), ((2, 3, 5), -1)])
def test_softmax_ce_dense_labels(shape, axis):
    pred = _rand(23, shape).astype(np.float64)
    a = axis % len(shape)
    label = np.random.RandomState(24).dirichlet(np.ones(shape[a]), int(np.prod(shape)) // shape[a])
    label = np.moveaxis(label.reshape(shape[:a] + shape[a + 1:] + (shape[a],)), -1, a)
    ref = -(np_log_softmax(pred, a) * label).sum(axis=a, keepdims=True)
    loss = gloss.SoftmaxCrossEntropyLoss(axis=axis, sparse_label=False)
    assert_close(loss(nd.array(pred.astype(np.float32)), nd.array(label.astype(np.float32))), per_sample(ref), 2e-5,
                 1e-5, name="dense")
    nd_gradcheck(lambda p: loss(p, label), [pred], CPU)


def test_softmax_ce_fast_path_gradient_and_sample_weight_shapes():
    pred = _rand(25, (6, 5)).astype(np.float64)
    label = np.random.RandomState(26).randint(0, 5, (6, 1)).astype(np.int32)
    ref = -np.take_along_axis(np_log_softmax(pred, 1), label, axis=1)[:, 0]
    loss = gloss.SoftmaxCrossEntropyLoss()
    x64 = nd.array(pred, dtype="float64")
    assert_close(loss(x64, nd.array(label)), ref, 1e-10, 1e-12, name="fast path")
    for sw_shape in ((6,), (6, 1)):  # MXNet broadcasts (N,) and (N, 1) weights against the (N, 1) loss
        sw = _rand(27, sw_shape, 0.5, 1.5).astype(np.float64)
        out = loss(x64, nd.array(label), nd.array(sw, dtype="float64"))
        expect = (ref[:, None] * sw).mean(axis=1) if sw.ndim == 1 else ref * sw[:, 0]
        assert_close(out, expect, 1e-10, 1e-12, name=f"sample_weight {sw_shape}")
    nd_gradcheck(lambda p: loss(p, label.reshape(-1)), [pred], CPU)
    x = nd.array(pred.astype(np.float32))
    x.attach_grad()
    with autograd.record():
        out = loss(x, nd.array(label))
    out.backward()
    p = np.exp(np_log_softmax(pred, 1))
    p[np.arange(6), label[:, 0]] -= 1
    assert_close(x.grad, p, 1e-5, 1e-6, name="fast path grad")


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="does not match"):
        gloss.L2Loss()(nd.ones((3, 2)), nd.ones((3, 3)))
    with pytest.raises(ValueError, match="label"):
        gloss.SoftmaxCrossEntropyLoss(sparse_label=False)(nd.ones((3, 2)), nd.ones((3, 3)))
    with pytest.raises(ValueError, match="label_format"):
        gloss.LogisticLoss(label_format="pm")
    with pytest.raises(TypeError, match="weight"):
        gloss.L1Loss(weight="big")
    with pytest.raises(ValueError, match="batch_axis"):
        gloss.L1Loss(batch_axis=3)(nd.ones((3, 2)), nd.ones((3, 2)))
    with pytest.raises(ValueError, match="axis"):
        gloss.SoftmaxCrossEntropyLoss(axis=2)(nd.ones((3, 2)), nd.ones((3,)))
