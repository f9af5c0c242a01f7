"""MXNet's detection box operators (dnnbind/ops/defs/bounding_box.py, multibox.py): the numpy twin against the real
MXNet 1.9.1 (tests/fixtures/mxnet_boxes, written by make_mxnet_boxes.py), outputs and input gradients; bad inputs
refused naming the op, the argument and the shapes; the GPU lowerings against the twin; box_nms in a hybridized
Block replaying. The registry-wide checks (shape inference, the symbol executor, central differences of box_nms)
run from tests/test_opdefs.py over each entry's samples.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from tests._helpers import assert_close

_FIX = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_boxes", "boxes.npz")


def _cases():
    f = np.load(_FIX)
    out = []
    for k in range(int(f["count"])):
        names = str(f[f"names{k}"]).split(",")
        n_out = sum(1 for key in f.files if key.startswith(f"out{k}_"))
        out.append((str(f[f"op{k}"]), eval(str(f[f"params{k}"])), names,
                    [f[f"in{k}_{i}"] for i in range(len(names))], [f[f"out{k}_{j}"] for j in range(n_out)],
                    f[f"dy{k}"] if f"dy{k}" in f.files else None,
                    [f[f"grad{k}_{i}"] for i in range(len(names))] if f"dy{k}" in f.files else None))
    return out


CASES = _cases()


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_mxnet(k, ctx, request):
    op, params, names, inputs, outs, dy, grads = CASES[k]
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    xs = [nd.array(v, ctx=device) for v in inputs]
    if dy is not None:
        for x in xs:
            x.attach_grad()
    with autograd.record():
        y = getattr(nd.contrib, op)(**dict(zip(names, xs)), **params)
    ys = y if isinstance(y, (list, tuple)) else [y]
    assert len(ys) == len(outs), f"{op}: {len(ys)} outputs, MXNet has {len(outs)}"
    if dy is not None:
        ys[0].backward(nd.array(dy, ctx=device))
    for j, (got, want) in enumerate(zip(ys, outs)):
        assert_close(got, want, rtol=1e-5, atol=1e-6, name=f"{op} {params} output {j}")
    if grads is not None:
        for name, x, g in zip(names, xs, grads):
            assert_close(x.grad, g, rtol=1e-5, atol=1e-6, name=f"{op} {params} gradient of {name}")


def test_symbol_outputs_are_mxnets():
    v = sym.var
    assert sym.contrib.box_nms(v("data"), name="n").list_outputs() == ["n_output0"]
    assert sym.contrib.box_non_maximum_suppression(v("data"), name="n").list_outputs() == ["n_output0"]
    assert sym.contrib.box_encode(*[v(k) for k in "abcdef"], name="e").list_outputs() == ["e_output0", "e_output1"]
    assert sym.contrib.bipartite_matching(v("d"), threshold=0.5, name="m").list_outputs() == \
        ["m_output0", "m_output1"]
    assert sym.contrib.MultiBoxTarget(v("a"), v("l"), v("c"), name="t").list_outputs() == \
        ["t_loc_target", "t_loc_mask", "t_cls_target"]
    s = sym.contrib.MultiBoxPrior(v("data"), sizes=(0.5, 0.25), ratios=(1, 2, 0.5), name="p")
    assert s.infer_shape(data=(1, 3, 4, 5))[1] == [(1, 4 * 5 * 4, 4)]


def test_alias_and_contrib_names():
    x = nd.array(np.array([[[0, 0.9, 0, 0, 1, 1], [0, 0.8, 0, 0, 1, 1]]], np.float32))
    a = nd.contrib.box_nms(x, coord_start=2, score_index=1)
    b = nd.contrib.box_non_maximum_suppression(x, coord_start=2, score_index=1)
    assert_close(a, b, rtol=0, atol=0)
    assert a.numpy()[0, 1, 0] == -1  # the duplicate is suppressed


@pytest.mark.parametrize("call,match", [
    (lambda: nd.contrib.box_nms(nd.ones((4, 5))), r"box_nms: coord_start 2 leaves no 4 coordinates.*data \(4, 5\)"),
    (lambda: nd.contrib.box_nms(nd.ones((4, 6)), id_index=3), r"box_nms: id_index 3 must be .*outside the coord"),
    (lambda: nd.contrib.box_nms(nd.ones((4,))), r"box_nms: data must have at least 2 dims.*\(4,\)"),
    (lambda: nd.contrib.box_nms(nd.ones((4, 6)), score_index=3), r"box_nms: score_index 3"),
    (lambda: nd.contrib.box_iou(nd.ones((3, 4)), nd.ones((2, 5))), r"box_iou: rhs must be \(\.\.\., 4\).*\(2, 5\)"),
    (lambda: nd.contrib.box_decode(nd.ones((2, 3, 4)), nd.ones((1, 2, 4))),
     r"box_decode: anchors must be .*N = 3.*\(1, 2, 4\)"),
    (lambda: nd.contrib.box_encode(nd.ones((1, 2)), nd.zeros((1, 3)), nd.ones((1, 2, 4)), nd.ones((1, 2, 4)),
                                   nd.zeros((4,)), nd.ones((4,))), r"box_encode: samples and matches must be"),
    (lambda: nd.contrib.box_encode(nd.ones((1, 2)), nd.array([[0, 5.0]]), nd.ones((1, 2, 4)), nd.ones((1, 2, 4)),
                                   nd.zeros((4,)), nd.ones((4,))), r"box_encode: a positive sample matches ref 5"),
    (lambda: nd.contrib.bipartite_matching(nd.ones((3,)), threshold=0.1), r"bipartite_matching: data must be"),
    (lambda: nd.contrib.MultiBoxPrior(nd.ones((1, 3, 4))), r"MultiBoxPrior: data must be \(batch, channel, height"),
    (lambda: nd.contrib.MultiBoxPrior(nd.ones((1, 3, 4, 4)), offsets=(0.5, 1.5)), r"MultiBoxPrior: offsets must"),
    (lambda: nd.contrib.MultiBoxPrior(nd.ones((1, 3, 4, 4)), steps=(-1, 0.5)), r"MultiBoxPrior: give both steps"),
    (lambda: nd.contrib.MultiBoxDetection(nd.ones((1, 3, 4)), nd.ones((1, 12)), nd.ones((1, 4, 4))),
     r"MultiBoxDetection: loc_pred must be \(B, A\*4\) = \(1, 16\).*loc_pred \(1, 12\)"),
    (lambda: nd.contrib.MultiBoxDetection(nd.ones((1, 3, 4)), nd.ones((1, 16)), nd.ones((1, 5, 4))),
     r"MultiBoxDetection: anchor must be \(1, A = 4, 4\)"),
    (lambda: nd.contrib.MultiBoxTarget(nd.ones((2, 4, 4)), nd.ones((1, 2, 5)), nd.ones((1, 3, 4))),
     r"MultiBoxTarget: anchor must be \(1, A, 4\).*anchor \(2, 4, 4\)"),
    (lambda: nd.contrib.MultiBoxTarget(nd.ones((1, 4, 4)), nd.ones((1, 2, 4)), nd.ones((1, 3, 4))),
     r"MultiBoxTarget: label must be \(B, L, width\).*label \(1, 2, 4\)"),
    (lambda: nd.contrib.MultiBoxTarget(nd.ones((1, 4, 4)), nd.array([[[-1, 0, 0, 1, 1.0]]]), nd.ones((1, 3, 4))),
     r"MultiBoxTarget.*label row 0 starts with the padding id -1"),
    (lambda: nd.contrib.MultiBoxTarget(nd.ones((1, 4, 4)), nd.ones((1, 2, 5)), nd.ones((1, 3, 5))),
     r"MultiBoxTarget: cls_pred must be \(B = 1, classes, A = 4\)"),
])
def test_bad_inputs_are_refused(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_integer_data_is_refused():
    with pytest.raises(TypeError, match=r"box_nms: data must be a floating-point array, got int32"):
        nd.contrib.box_nms(nd.array(np.ones((3, 6)), dtype="int32"))


def test_zero_gradients_as_mxnet():
    """box_iou, box_encode, box_decode and bipartite_matching give zero gradients (MXNet's backward), also when the
    output feeds a larger graph."""
    a = nd.array(np.array([[0, 0, 1, 1], [0.5, 0.5, 2, 2]], np.float32))
    a.attach_grad()
    with autograd.record():
        y = (nd.contrib.box_iou(a, a) * 3).sum()
    y.backward()
    assert not a.grad.numpy().any()


# -- the GPU against the twin ---------------------------------------------------------------------------------------

def _rows(rng, b, n, classes=3, ties=False):
    x = np.zeros((b, n, 6))
    x[..., 0] = rng.integers(0, classes, (b, n))
    x[..., 1] = rng.uniform(0, 1, (b, n)).round(1) if ties else rng.uniform(0, 1, (b, n))
    lo = rng.uniform(0, 1, (b, n, 2))
    x[..., 2:4], x[..., 4:6] = lo, lo + rng.uniform(0.1, 0.5, (b, n, 2))
    return x


def _both(gpu, fn, arrays, dtype, grad=False):
    res = []
    for ctx in (dnnbind.cpu(), gpu):
        xs = [nd.array(a, ctx=ctx, dtype=dtype) for a in arrays]
        if grad:
            for x in xs:
                x.attach_grad()
        with autograd.record():
            y = fn(*xs)
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        if grad:
            ys[0].backward(nd.array(np.arange(ys[0].size).reshape(ys[0].shape) % 7 + 1.0, ctx=ctx, dtype=dtype))
        res.append(([o.numpy() for o in ys], [x.grad.numpy() for x in xs] if grad else []))
    return res


NMS_PARAMS = [
    {"coord_start": 2, "score_index": 1, "id_index": 0},
    {"coord_start": 2, "score_index": 1, "id_index": 0, "force_suppress": True, "topk": 50, "valid_thresh": 0.3},
    {"coord_start": 2, "score_index": 1, "id_index": 0, "background_id": 0, "out_format": "center"},
    {"coord_start": 2, "score_index": 1, "in_format": "center", "overlap_thresh": 0.3},
    {"coord_start": 2, "score_index": 1, "topk": 0},
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("params", NMS_PARAMS, ids=range(len(NMS_PARAMS)))
def test_gpu_box_nms_matches_the_twin(params, ties, dtype, gpu):
    x = _rows(np.random.default_rng(3), 3, 700, ties=ties)  # more boxes than a block has threads
    (yc, gc), (yg, gg) = _both(gpu, lambda d: nd.contrib.box_nms(d, **params), [x], dtype, grad=True)
    assert_close(yg[0], yc[0], rtol=1e-6, atol=1e-6, name=f"box_nms {params}")
    assert_close(gg[0], gc[0], rtol=0, atol=0, name=f"box_nms gradient {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("params", [{"threshold": 0.2}, {"threshold": 0.6, "is_ascend": True, "topk": 3}])
def test_gpu_bipartite_matching_matches_the_twin(params, dtype, gpu):
    x = np.random.default_rng(4).uniform(0, 1, (3, 30, 20)).round(2)  # ties included
    (yc, _), (yg, _) = _both(gpu, lambda d: nd.contrib.bipartite_matching(d, **params), [x], dtype)
    for a, b in zip(yg, yc):
        assert_close(a, b, rtol=0, atol=0, name=f"bipartite_matching {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("params", [{}, {"nms_topk": 40, "force_suppress": True}, {"nms_threshold": 1.5},
                                    {"clip": False, "threshold": 0.4}])
def test_gpu_multibox_detection_matches_the_twin(params, dtype, gpu):
    rng = np.random.default_rng(5)
    a = 600
    p = rng.standard_normal((2, 4, a)) * 2
    p = np.exp(p) / np.exp(p).sum(axis=1, keepdims=True)
    lo = rng.uniform(0, 0.8, (1, a, 2))
    anchor = np.concatenate([lo, lo + rng.uniform(0.05, 0.3, (1, a, 2))], axis=-1)
    loc = rng.standard_normal((2, a * 4)) * 0.3
    (yc, _), (yg, _) = _both(gpu, lambda c, l, an: nd.contrib.MultiBoxDetection(c, l, an, **params),
                             [p, loc, anchor], dtype)
    assert_close(yg[0], yc[0], rtol=1e-5, atol=1e-6, name=f"MultiBoxDetection {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("params", [{}, {"negative_mining_ratio": 3.0, "ignore_label": -2.0},
                                    {"overlap_threshold": 0.0, "negative_mining_ratio": 1.0}])
def test_gpu_multibox_target_matches_the_twin(params, dtype, gpu):
    rng = np.random.default_rng(6)
    a = 500
    lo = rng.uniform(0, 0.8, (1, a, 2))
    anchor = np.concatenate([lo, lo + rng.uniform(0.05, 0.3, (1, a, 2))], axis=-1)
    label = np.full((3, 6, 5), -1.0)
    for b, n in enumerate((4, 1, 0)):
        lo = rng.uniform(0, 0.6, (n, 2))
        label[b, :n] = np.concatenate([rng.integers(0, 5, (n, 1)), lo, lo + rng.uniform(0.1, 0.4, (n, 2))], axis=1)
    cls_pred = rng.standard_normal((3, 6, a))
    (yc, _), (yg, _) = _both(gpu, lambda an, lb, cp: nd.contrib.MultiBoxTarget(an, lb, cp, **params),
                             [anchor, label, cls_pred], dtype)
    for j, (g, c) in enumerate(zip(yg, yc)):
        assert_close(g, c, rtol=1e-5, atol=1e-6, name=f"MultiBoxTarget {params} output {j}")


@pytest.mark.gpu
def test_gpu_box_nms_in_a_hybridized_block_replays(gpu):
    """No host copy in the gpu lowering: a hybridized Block with box_nms records and replays, values and gradient
    equal to the eager call's."""
    from dnnbind import gluon

    class Suppress(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return F.contrib.box_nms(x * 1.0, coord_start=2, score_index=1, id_index=0, overlap_thresh=0.4)

    eager, block = Suppress(), Suppress()
    block.hybridize()
    rng = np.random.default_rng(9)
    for step in range(5):
        x = _rows(rng, 2, 300).astype(np.float32)
        got = []
        for net in (eager, block):
            xa = nd.array(x, ctx=gpu)
            xa.attach_grad()
            with autograd.record():
                y = net(xa)
            y.backward(nd.ones(y.shape, ctx=gpu) * 2)
            got.append((y.asnumpy(), xa.grad.asnumpy()))
        assert_close(got[1][0], got[0][0], rtol=0, atol=0, name=f"step {step}")
        assert_close(got[1][1], got[0][1], rtol=0, atol=0, name=f"step {step} gradient")
    assert block._cached.replays >= 2 and not block._cached.eager_reasons, block._cached.eager_reasons
