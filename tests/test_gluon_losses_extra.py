"""TripletLoss, PoissonNLLLoss, CosineEmbeddingLoss and CTCLoss with MXNet 1.x semantics: fixtures printed by MXNet
1.9.1 itself (the CPU wheel on Python 3.8) for inputs built with ``np.random.RandomState(seed).uniform(lo, hi,
shape).astype(float32)``, float64 numpy references written here (CTC: by enumerating every alignment path), several
shapes, gradients by central differences, and the errors for bad input.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _helpers import assert_close, nd_gradcheck

import dnnbind
from dnnbind import autograd, nd
from dnnbind.gluon import loss as gloss

CPU = dnnbind.cpu()


def _rand(seed, shape, lo=-2.0, hi=2.0):
    return np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


def A(x, device=CPU):
    return nd.array(np.asarray(x, dtype=np.float32), ctx=device)


# ---- MXNet 1.9.1's own numbers -----------------------------------------------------------------------------------

MXNET = {
    "triplet": [11.498638153076172, 0.0, 0.0],
    "triplet_m": [0.0, 2.3441033363342285],
    "poisson": [2.595221996307373],
    "poisson_sw": [6.182157516479492],
    "poisson_nl": [1.1929426193237305],
    "poisson_full2": [4.0340046882629395],
    "cos": [[1.185782551765442], [0.5451647639274597], [0.8646624088287354], [0.0]],
    "cos_m": [[2.2612648010253906], [0.26961785554885864], [1.470334529876709], [0.0]],
    "ctc": [8.232077598571777, 7.16380500793457],
    "ctc_len": [9.092387199401855, 7.16380500793457],
    "ctc_tnc": [8.232077598571777, 7.16380500793457],
    "ctc_w": [4.116038799285889, 7.16380500793457],
    "ctc_empty": [14.412073135375977, 4.680488586425781],
    "ctc_impossible": [0.0],
}
# d(sum of CTCLoss()(x, lab)) / dx, its first 10 entries, from MXNet 1.9.1 (warp-ctc):
MXNET_CTC_GRAD = [0.06221892684698105, -0.6055703163146973, 0.19295454025268555, 0.5496690273284912,
                  -0.19927115738391876, -0.02745804935693741, -0.10496640205383301, 0.0794982984662056,
                  0.4895447790622711, -0.43661707639694214]


def _ctc_inputs():
    return _rand(11, (2, 6, 5)), np.array([[1, 0, -1], [2, 2, 3]], np.float32)


def _mxnet_cases(device=CPU):
    def A(x):  # the module's A, on ``device``
        return nd.array(np.asarray(x, dtype=np.float32), ctx=device)

    p, pos, neg = _rand(1, (3, 2, 2)), _rand(2, (3, 4)), _rand(3, (3, 2, 2))
    pr, tg = _rand(4, (3, 4)), np.random.RandomState(5).randint(0, 5, (3, 4)).astype(np.float32)
    sw, pp = _rand(6, (3, 1), 0.5, 1.5), _rand(7, (3, 4), 0.1, 3.0)
    a, b, lab = _rand(8, (4, 5)), _rand(9, (4, 5)), np.array([1, -1, 1, -1], np.float32)
    x, clab = _ctc_inputs()
    return {
        "triplet": lambda: gloss.TripletLoss()(A(p), A(pos), A(neg)),
        "triplet_m": lambda: gloss.TripletLoss(margin=3.0, weight=0.5, batch_axis=1)(A(p), A(pos.reshape(3, 2, 2)),
                                                                                    A(neg)),
        "poisson": lambda: gloss.PoissonNLLLoss()(A(pr), A(tg)),
        "poisson_sw": lambda: gloss.PoissonNLLLoss(weight=2.0)(A(pr), A(tg), A(sw)),
        "poisson_nl": lambda: gloss.PoissonNLLLoss(from_logits=False)(A(pp), A(tg)),
        "poisson_full2": lambda: gloss.PoissonNLLLoss(compute_full=True)(A(pr), A(tg + 1)),
        "cos": lambda: gloss.CosineEmbeddingLoss()(A(a), A(b), A(lab)),
        "cos_m": lambda: gloss.CosineEmbeddingLoss(margin=0.2, weight=1.5)(A(a), A(b), A(lab),
                                                                           A(_rand(10, (4, 1), 0.5, 1.5))),
        "ctc": lambda: gloss.CTCLoss()(A(x), A(clab)),
        "ctc_len": lambda: gloss.CTCLoss()(A(x), A(clab), A([5, 6]), A([1, 3])),
        "ctc_tnc": lambda: gloss.CTCLoss(layout="TNC", label_layout="TN")(A(x.transpose(1, 0, 2)), A(clab.T)),
        "ctc_w": lambda: gloss.CTCLoss(weight=0.5)(A(x), A(clab), None, None, A([1.0, 2.0])),
        "ctc_empty": lambda: gloss.CTCLoss()(A(x), A([[-1, -1, -1], [0, 1, 2]])),
        "ctc_impossible": lambda: gloss.CTCLoss()(A(_rand(12, (1, 3, 5))), A([[1, 1, 1]])),
    }


@pytest.mark.parametrize("key", sorted(MXNET))
def test_matches_mxnet_1_9_1(key):
    out = _mxnet_cases()[key]()
    assert_close(out, np.array(MXNET[key]), 1e-5, 1e-5, name=key)


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(MXNET))
def test_gpu_matches_cpu(key, gpu):
    assert_close(_mxnet_cases(gpu)[key](), _mxnet_cases(CPU)[key](), 1e-5, 1e-5, name=key)


@pytest.mark.gpu
def test_gpu_ctc_gradient_matches_cpu(gpu):
    x, lab = _ctc_inputs()
    grads = []
    for device in (CPU, gpu):
        xg = A(x, device)
        xg.attach_grad()
        with autograd.record():
            out = gloss.CTCLoss()(xg, A(lab, device), A([5, 6], device))
        out.backward()
        grads.append(xg.grad.numpy())
    assert_close(grads[1], grads[0], 1e-5, 1e-6, name="ctc grad gpu")


def test_ctc_gradient_matches_mxnet_1_9_1():
    x, lab = _ctc_inputs()
    xg = A(x)
    xg.attach_grad()
    with autograd.record():
        out = gloss.CTCLoss()(xg, A(lab))
    out.backward()
    assert_close(xg.grad.numpy().reshape(-1)[:10], np.array(MXNET_CTC_GRAD), 1e-4, 1e-5, name="ctc grad")


# ---- float64 references on random inputs -------------------------------------------------------------------------

SHAPES = [(1, 1), (3, 4), (2, 3, 2), (4, 1, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch_axis", [0, 1])
def test_triplet_against_float64(shape, batch_axis):
    if batch_axis >= len(shape):
        pytest.skip("no such axis")
    p, q, r = (_rand(s, shape).astype(np.float64) for s in (20, 21, 22))
    axes = tuple(i for i in range(len(shape)) if i != batch_axis)
    want = np.maximum(((q - p) ** 2 - (r - p) ** 2).sum(axis=axes) + 0.7, 0) * 1.5
    sw = _rand(23, (shape[batch_axis],), 0.5, 1.5)
    out = gloss.TripletLoss(margin=0.7, weight=1.5, batch_axis=batch_axis)(A(p), A(q.reshape(-1)), A(r), A(sw))
    assert_close(out, want * sw, 1e-5, 1e-5, name="triplet")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("compute_full", [False, True])
def test_poisson_against_float64(shape, from_logits, compute_full):
    pred = _rand(30, shape, 0.1, 2.0).astype(np.float64)
    target = np.random.RandomState(31).randint(0, 6, shape).astype(np.float64)
    sw = _rand(32, (shape[0],) + (1,) * (len(shape) - 1), 0.5, 1.5)
    loss = np.exp(pred) - target * pred if from_logits else pred - target * np.log(pred + 1e-8)
    if compute_full:
        big = target > 1
        t = np.where(big, target, 2.0)
        loss = loss + np.where(big, t * np.log(t) - t + 0.5 * np.log(2 * np.pi * t), 0.0)
    want = np.array([np.mean(loss * sw * 0.8)])
    out = gloss.PoissonNLLLoss(weight=0.8, from_logits=from_logits, compute_full=compute_full)(A(pred), A(target),
                                                                                             A(sw))
    assert out.shape == (1,)
    assert_close(out, want, 1e-5, 1e-6, name="poisson")


@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (5, 4)])
@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_cosine_embedding_against_float64(shape, margin):
    a, b = _rand(40, shape).astype(np.float64), _rand(41, shape).astype(np.float64)
    label = np.resize(np.array([1.0, -1.0, 1.0, -1.0, 0.0]), shape[0])
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
    want = np.where(label == 1, 1 - cos, np.where(label == -1, np.maximum(cos - margin, 0), 0.0))[:, None]
    out = gloss.CosineEmbeddingLoss(margin=margin)(A(a), A(b), A(label))
    assert out.shape == (shape[0], 1)
    assert_close(out, want, 1e-5, 1e-6, name="cosine")


def _ctc_brute_force(pred, labels, lengths=None):
    """-log of the summed probability of every path over the classes that collapses (merge repeats, drop
    blanks = last class) to the label; float64, for tiny T and C. Impossible labels give 0 (as MXNet)."""
    n, t, c = pred.shape
    out = []
    for i in range(n):
        steps = t if lengths is None else lengths[i]
        z = pred[i, :steps] - pred[i, :steps].max(-1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        target = [int(v) for v in labels[i] if v >= 0]
        total = 0.0
        for path in itertools.product(range(c), repeat=steps):
            collapsed = [k for j, k in enumerate(path) if k != c - 1 and (j == 0 or k != path[j - 1])]
            if collapsed == target:
                total += math.prod(prob[j, k] for j, k in enumerate(path))
        out.append(-math.log(total) if total > 0 else 0.0)
    return np.array(out)


CTC_CASES = [  # (N, T, C, labels, pred_lengths)
    (1, 1, 2, [[0]], None),
    (1, 1, 3, [[-1]], None),
    (2, 4, 3, [[0, 1], [1, -1]], None),
    (3, 5, 4, [[0, 0, 2], [2, 1, -1], [-1, -1, -1]], [5, 3, 2]),
    (2, 5, 3, [[1, 1, 1], [0, 1, 0]], [4, 5]),  # the first cannot fit in 4 steps (needs 5)
]


@pytest.mark.parametrize("case", range(len(CTC_CASES)))
def test_ctc_against_brute_force_path_sums(case):
    n, t, c, labels, lengths = CTC_CASES[case]
    pred = _rand(50 + case, (n, t, c), -3, 3).astype(np.float64)
    labels = np.array(labels, np.float64)
    want = _ctc_brute_force(pred, labels, lengths)
    out = gloss.CTCLoss()(A(pred), A(labels), None if lengths is None else A(lengths))
    assert_close(out, want, 1e-5, 1e-5, name="ctc")
    out64 = gloss.CTCLoss()(nd.array(pred, dtype="float64"), labels, lengths)
    assert_close(out64, want, 1e-10, 1e-10, name="ctc float64")


# ---- gradients -------------------------------------------------------------------------------------------------

def test_gradients_by_central_differences():
    p, q, r = (_rand(s, (3, 2, 2)) for s in (60, 61, 62))
    nd_gradcheck(lambda a, b, c: gloss.TripletLoss(margin=2.0, weight=0.5)(a, b, c), [p, q, r], CPU)
    tg = np.random.RandomState(63).randint(0, 5, (3, 4)).astype(np.float64)
    sw = _rand(64, (3, 1), 0.5, 1.5)
    nd_gradcheck(lambda a: gloss.PoissonNLLLoss(compute_full=True)(a, tg, sw), [_rand(65, (3, 4))], CPU)
    nd_gradcheck(lambda a: gloss.PoissonNLLLoss(from_logits=False)(a, tg), [_rand(66, (3, 4), 0.2, 2.0)], CPU)
    lab = np.array([1, -1, -1, 1], np.float64)
    nd_gradcheck(lambda a, b: gloss.CosineEmbeddingLoss(margin=-0.5)(a, b, lab), [_rand(67, (4, 3)),
                                                                                 _rand(68, (4, 3))], CPU)


@pytest.mark.parametrize("case", [2, 3, 4])
def test_ctc_gradient_by_central_differences(case):
    n, t, c, labels, lengths = CTC_CASES[case]
    labels = np.array(labels, np.float64)
    nd_gradcheck(lambda p: gloss.CTCLoss()(p, labels, lengths), [_rand(70 + case, (n, t, c))], CPU,
                 rtol=1e-5, atol=1e-6)
    tnc = gloss.CTCLoss(layout="TNC", label_layout="TN")
    nd_gradcheck(lambda p: tnc(p, labels.T, lengths), [_rand(80 + case, (t, n, c))], CPU)


# ---- errors ------------------------------------------------------------------------------------------------------

def test_bad_inputs_raise():
    x3 = A(np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"TripletLoss: positive shape \(3, 5\) does not match pred shape \(3, 4\)"):
        gloss.TripletLoss()(x3, A(np.zeros((3, 5))), x3)
    with pytest.raises(TypeError, match=r"\(TripletLoss\): the input x must be an NDArray, got ndarray"):
        gloss.TripletLoss()(np.zeros((3, 4)), x3, x3)
    with pytest.raises(ValueError, match=r"PoissonNLLLoss: target shape \(2,\) does not match pred shape \(3, 4\)"):
        gloss.PoissonNLLLoss()(x3, A([1, 2]))
    with pytest.raises(ValueError, match="CosineEmbeddingLoss: 2 labels for 3 vector pairs"):
        gloss.CosineEmbeddingLoss()(x3, x3, A([1, -1]))
    with pytest.raises(ValueError, match=r"CosineEmbeddingLoss: input1 shape \(4, 4\) does not match input2"):
        gloss.CosineEmbeddingLoss()(A(np.zeros((4, 4))), x3, A([1, 1, 1]))
    with pytest.raises(ValueError, match="CTCLoss: layout must be 'NTC' or 'TNC', got 'NCT'"):
        gloss.CTCLoss(layout="NCT")
    with pytest.raises(ValueError, match="CTCLoss: label_layout must be"):
        gloss.CTCLoss(label_layout="NC")
    pred = A(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="CTCLoss: labels of length 4 cannot fit in 3 time steps"):
        gloss.CTCLoss()(pred, A(np.zeros((2, 4))))
    # the label values and lengths are the CTCLoss operator's checks (ops/defs/ctc_loss.py), in its words
    with pytest.raises(ValueError, match=r"CTCLoss: label\[0, 1\] is 3, but labels must be in \[0, 2\] with "
                                         r"blank_label 'last'"):
        gloss.CTCLoss()(pred, A([[0, 3], [0, -1]]))
    with pytest.raises(ValueError, match=r"CTCLoss: label_lengths\[1\] is 3, but each must be in \[0, 2\]"):
        gloss.CTCLoss()(pred, A([[0, 1], [0, 1]]), None, A([1, 3]))
    with pytest.raises(ValueError, match=r"CTCLoss: data_lengths\[1\] is 4, but each must be in \[0, 3\]"):
        gloss.CTCLoss()(pred, A([[0, 1], [0, 1]]), A([0, 4]))
    with pytest.raises(ValueError, match=r"CTCLoss: label shape \(3, 2\) \(NT\) has 3 samples but pred has 2"):
        gloss.CTCLoss()(pred, A(np.zeros((3, 2))))
    with pytest.raises(ValueError, match=r"CTCLoss: pred must be 3-D \(NTC\), got shape \(3, 4\)"):
        gloss.CTCLoss()(x3, A(np.zeros((3, 2))))


def test_exported_where_mxnet_has_them():
    dnnbind.install_mxnet_alias()
    import mxnet as mx
    from mxnet.gluon.loss import CosineEmbeddingLoss, CTCLoss, PoissonNLLLoss, TripletLoss
    assert (TripletLoss, PoissonNLLLoss, CosineEmbeddingLoss, CTCLoss) == (
        gloss.TripletLoss, gloss.PoissonNLLLoss, gloss.CosineEmbeddingLoss, gloss.CTCLoss)
    assert mx.gluon.loss.Loss is gloss.Loss and isinstance(CTCLoss(), mx.gluon.loss.Loss)
    for name in ("TripletLoss", "PoissonNLLLoss", "CosineEmbeddingLoss", "CTCLoss", "SquaredHingeLoss",
                 "LogisticLoss"):
        assert name in gloss.__all__
