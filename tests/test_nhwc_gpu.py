"""Channels-last (NHWC) convolution, pooling and BatchNorm on the GPU (marker ``gpu``; skipped without one).

Every result is held to an independent reference: the float64 numpy NCHW ops (ops.reference) run on transposed
copies of the same values, transposed back. The GPU's NHWC path shares nothing with it (cuDNN on
CUDNN_TENSOR_NHWC descriptors or backend-API plans with channels-last strides, no transposes).

Tolerances: float32 under strict FP32 (the default math mode): 1e-4 relative, and 1e-4 of the reference's
largest magnitude absolute (test_gpu_ops.py's). float16 (half data, float accumulation): HALF = 1e-2 relative
and 1e-2 of the largest magnitude: the reference is computed from the same half-rounded inputs, so what remains
is the rounding of the half outputs (~5e-4 relative) and of half intermediates (max/avg pooling, BatchNorm).
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.gluon import nn
from dnnbind.ops import batchnorm as B
from dnnbind.ops import reference as R
from dnnbind.ops.reference import batchnorm as RB
from tests._helpers import assert_close
from tests.test_nhwc import CONV_CASES, nchw, nhwc

pytestmark = pytest.mark.gpu
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
HALF = 1e-2


def tol(ref, dtype):
    k = HALF if np.dtype(dtype) == F16 else 1e-4
    return k, k * max(1.0, float(np.abs(ref).max()))


def rnd(shape, seed, dtype=F32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def g(a, dtype=None):
    return nd.array(a, ctx=mx.gpu(0), dtype=dtype or a.dtype)


def f64(a):
    return np.asarray(a, np.float64)


def conv_refs(x, w, b, dy, case):
    """float64 NCHW references of y, dx, dw, db for NHWC x, OHWI w, NHWC dy (returned in NHWC / OHWI)."""
    _, ws, stride, pad, dil, groups = case
    xc, wc, dyc = nchw(f64(x)), nchw(f64(w)), nchw(f64(dy))
    return (nhwc(R.conv_forward(xc, wc, f64(b), stride, pad, dil, groups)),
            nhwc(R.conv_backward_data(wc, dyc, xc.shape, stride, pad, dil, groups)),
            nhwc(R.conv_backward_filter(xc, dyc, ws, stride, pad, dil, groups)), dyc.sum(axis=(0, 2, 3)))


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_gpu_conv_nhwc_ops_and_autograd_match_float64(case, dtype):
    """conv fwd (+ bias), bwd data, bwd filter, bias (cudnnConvolutionBackwardBias and the gemv path), as ops and
    through nd.Convolution's autograd (dw straight into the grad buffer, db by gemv)."""
    xs, ws, stride, pad, dil, groups = case
    x, w, b = nhwc(rnd(xs, 1, dtype)), nhwc(rnd(ws, 2, dtype)), rnd((ws[0],), 3, dtype)
    y_ref = nhwc(R.conv_forward(nchw(f64(x)), nchw(f64(w)), f64(b), stride, pad, dil, groups))
    dy = rnd(y_ref.shape, 4, dtype)
    refs = conv_refs(x, w, b, dy, case)
    got = (mx.ops.conv_forward(g(x), g(w), g(b), stride, pad, dil, groups, layout="NHWC"),
           mx.ops.conv_backward_data(g(w), g(dy), x.shape, stride, pad, dil, groups, layout="NHWC"),
           mx.ops.conv_backward_filter(g(x), g(dy), w.shape, stride, pad, dil, groups, layout="NHWC"),
           mx.ops.conv_backward_bias(g(dy), layout="NHWC"))
    names = ("y", "dx", "dw", "db")
    for a, e, name in zip(got, refs, names):
        assert a.dtype == dtype and a.shape == e.shape, (name, a.shape, e.shape)
        assert_close(a, e, *tol(e, dtype), name=f"ops {name}")
    from dnnbind.ops.conv import conv_backward_bias_gemv
    assert_close(conv_backward_bias_gemv(g(dy), layout="NHWC"), refs[3], *tol(refs[3], dtype), name="db gemv")
    arrs = [g(a) for a in (x, w, b)]
    for a in arrs:
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(*arrs, kernel=ws[2:], stride=stride, pad=pad, dilate=dil, num_filter=ws[0],
                           num_group=groups, layout="NHWC")
    y.backward(g(dy))
    for a, e, name in zip([y] + [v.grad for v in arrs], refs, names):
        assert_close(a, e, *tol(e, dtype), name=f"autograd {name}")


def _backend_plans(direction, case, dtype, math):
    from dnnbind.ops import _check, conv_backend as cb
    from dnnbind.runtime.handles import cudnn_handle
    xs, ws, stride, pad, dil, _ = case
    xs, ws = _check.from_nchw(xs, "NHWC"), _check.from_nchw(ws, "NHWC")
    ys = _check.conv_params("t", xs, ws, None, stride, pad, dil, 1, "NHWC")[4]
    skipped = []
    plans = cb.candidates(cudnn_handle(mx.gpu(0)), direction, xs, ws, ys, stride, pad, dil, dtype, math,
                          limit=3, skipped=skipped, layout="NHWC")
    return plans, (xs, ws, ys), skipped


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_gpu_backend_plans_for_nhwc_shapes(direction, dtype):
    """ops.conv_backend builds NHWC graphs (channels-last strides); every plan (up to 3, strict fp32 and TF32 for
    float32) is executed against the reference. At least one math mode must yield plans."""
    from dnnbind.ops._common import workspace
    from dnnbind.runtime.handles import cudnn_handle
    case = ((8, 16, 10, 10), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    found = 0
    for math in (["fp32", "tf32"] if dtype == F32 else ["fp32"]):
        plans, (xs, ws, ys), skipped = _backend_plans(direction, case, dtype, math)
        found += len(plans)
        x, w, dy = rnd(xs, 5, dtype), rnd(ws, 6, dtype), rnd(ys, 7, dtype)
        ref = {"fwd": lambda: conv_refs(x, w, np.zeros(ws[0]), dy, case)[0],
               "bwd_data": lambda: conv_refs(x, w, np.zeros(ws[0]), dy, case)[1],
               "bwd_filter": lambda: conv_refs(x, w, np.zeros(ws[0]), dy, case)[2]}[direction]()
        ins = {"fwd": (x, w), "bwd_data": (w, dy), "bwd_filter": (x, dy)}[direction]
        k = 5e-3 if math == "tf32" else tol(ref, dtype)[0]
        arrays, h = [g(v) for v in ins], cudnn_handle(mx.gpu(0))
        for plan in plans:
            out = g(np.full(ref.shape, np.nan, dtype))
            plan.execute(h, tuple(a.ptr for a in arrays) + (out.ptr,), workspace(mx.gpu(0), plan.workspace_size)[0])
            assert_close(out, ref, k, k * max(1.0, float(np.abs(ref).max())), name=f"{direction} {math} {plan.name}")
    assert found, f"no backend plan for NHWC {direction} {dtype} (skipped: {skipped})"


def test_gpu_conv_nhwc_through_chosen_backend_plans(monkeypatch):
    """The conv ops forced onto backend plans wherever any exist for the NHWC shape: same results, and the
    algorithm table names NHWC keys apart from NCHW ones of the same shape tuples."""
    from dnnbind.ops import algo_cache, algos

    def first_backend(cands, run, device, target="graph"):
        return next(((a, ws) for a, ws, _ in cands if a >= algos.BACKEND), cands[0][:2])

    monkeypatch.setitem(algos._policy, "backend", True)
    monkeypatch.setattr(algos, "_time_candidates", first_backend)
    monkeypatch.setattr(algo_cache, "lookup", lambda *a: None)
    monkeypatch.setattr(algo_cache, "store", lambda *a: None)
    saved = algos.forget_choices()
    try:
        _check_nhwc_backend_plans(algos)
    finally:
        algos.restore_choices(saved)


def _check_nhwc_backend_plans(algos):
    case = ((4, 8, 8, 8), (8, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1)  # x's shape tuple is the same in both layouts
    x, w, b = nhwc(rnd(case[0], 8)), nhwc(rnd(case[1], 9)), rnd((8,), 10)
    dy = rnd((4, 8, 8, 8), 11)
    refs = conv_refs(x, w, b, dy, case)
    assert_close(mx.ops.conv_forward(g(x), g(w), g(b), 1, 1, layout="NHWC"), refs[0], *tol(refs[0], F32))
    assert_close(mx.ops.conv_backward_data(g(w), g(dy), x.shape, 1, 1, layout="NHWC"), refs[1], *tol(refs[1], F32))
    assert_close(mx.ops.conv_backward_filter(g(x), g(dy), w.shape, 1, 1, layout="NHWC"), refs[2],
                 *tol(refs[2], F32))
    fused = np.maximum(refs[0], 0)
    assert_close(mx.ops.conv_bias_relu_forward(g(x), g(w), g(b), 1, 1, layout="NHWC"), fused, *tol(fused, F32))
    xc = rnd(x.shape, 12)  # the same shape tuple as NCHW: another convolution, another table entry
    y_nchw = mx.ops.conv_forward(g(xc), g(nchw(w)), None, 1, 1)
    assert_close(y_nchw, R.conv_forward(f64(xc), nchw(f64(w)), None, 1, 1), *tol(refs[0], F32))
    chosen = algos.chosen("eager")
    layouts = {k[-2] for k in chosen if k[1] == x.shape}  # keys end (..., layout, pointer alignment)
    assert layouts == {"NCHW", "NHWC"}, chosen
    nhwc_names = [name for k, (name, _) in chosen.items() if k[-2] == "NHWC"]
    assert any(name.startswith("backend") for name in nhwc_names), nhwc_names


@pytest.mark.parametrize("shape", [(16, 16, 14, 14), (3, 8, 9, 7)], ids=["resnet-like", "odd"])
def test_gpu_fused_conv_bias_relu_float16_nhwc(shape):
    """act_type='relu' in float16 NHWC runs fused (one legacy call or backend plan; the shape never lands in
    ops.defs.convolution.UNFUSED) and matches relu(conv + b) and its gradients."""
    from dnnbind.ops.defs import convolution as conv_def
    n, c, h, wd = shape
    case = (shape, (32, c, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    x, w = nhwc(rnd(shape, 13, F16)), nhwc(rnd(case[1], 14, F16))
    conv = nhwc(R.conv_forward(nchw(f64(x)), nchw(f64(w)), None, 1, 1))
    b = (rnd((32,), 15, np.float64) * conv.std()).astype(F16)  # moves many outputs across zero
    ref = np.maximum(conv + f64(b), 0)
    assert 0.1 < float(np.mean(ref == 0)) < 0.9
    dy = rnd(ref.shape, 16, F16)
    arrs = [g(a) for a in (x, w, b)]
    for a in arrs:
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(*arrs, kernel=(3, 3), pad=(1, 1), num_filter=32, act_type="relu", layout="NHWC")
    y.backward(g(dy))
    key = (x.shape, w.shape, F16, (1, 1), (1, 1), (1, 1), 1, "NHWC")
    assert key not in conv_def.UNFUSED, "cuDNN refused the fused conv+bias+ReLU in float16 NHWC"
    assert_close(y, ref, *tol(ref, F16), name="fused y")
    dz = f64(dy) * (y.asnumpy() > 0)  # ReLU's gradient at the GPU's own output (a near-zero z may round either way)
    _, dx, dw, db = conv_refs(x, w, b, dz, case)
    for a, e, name in zip((arrs[0].grad, arrs[1].grad, arrs[2].grad), (dx, dw, db), ("dx", "dw", "db")):
        assert_close(a, e, *tol(e, F16), name=f"fused {name}")


POOL_CASES = [  # x NCHW (<= 2048 elements: distinct values, exact in float16, so max has no ties), arguments
    ((2, 3, 7, 9), dict(kernel=(3, 3), pool_type="max", stride=(2, 2), pad=(1, 1))),
    ((2, 4, 8, 8), dict(kernel=(2, 2), pool_type="avg")),
    ((2, 3, 7, 7), dict(kernel=(3, 2), pool_type="avg", stride=(2, 1), pad=(1, 1), count_include_pad=False)),
    ((2, 5, 6, 7), dict(pool_type="max", global_pool=True)),
    ((2, 5, 6, 7), dict(pool_type="avg", global_pool=True)),
    ((2, 3, 7, 9), dict(kernel=(2, 2), pool_type="avg", stride=(2, 2), pooling_convention="full")),
]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_gpu_pooling_nhwc_matches_float64(case, dtype):
    xs, kw = case
    size = int(np.prod(xs))
    x = (np.random.default_rng(20).permutation(size).reshape(xs) - size // 2) / 256.0  # distinct, exact in half
    x = x.astype(dtype)
    ref_pool = nd.Pooling(nd.array(f64(x), ctx=mx.cpu(), dtype="float64"), **kw)
    dy = rnd(ref_pool.shape, 21, dtype)
    xa = nd.array(f64(x), ctx=mx.cpu(), dtype="float64")
    xa.attach_grad()
    with autograd.record():
        ref = nd.Pooling(xa, **kw)
    ref.backward(nd.array(f64(dy), ctx=mx.cpu(), dtype="float64"))
    xg = g(nhwc(x))
    xg.attach_grad()
    with autograd.record():
        y = nd.Pooling(xg, layout="NHWC", **kw)
    y.backward(g(nhwc(dy)))
    assert_close(y, nhwc(ref.asnumpy()), *tol(ref.asnumpy(), dtype), name="pooling y")
    assert_close(xg.grad, nhwc(xa.grad.asnumpy()), *tol(xa.grad.asnumpy(), dtype), name="pooling dx")


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("mode", ["persistent", "spatial"])
def test_gpu_batchnorm_nhwc_training_and_inference(dtype, mode):
    """cuDNN BN on an NHWC descriptor (both training modes): y, saved and running statistics over two steps,
    dx/dgamma/dbeta, inference; float16 data keeps float32 parameters and statistics."""
    shape = (8, 6, 5, 12)  # NHWC, C = 12
    rs = np.random.RandomState(30)
    x = (rs.randn(*shape) * 2 + rs.randn(1, 1, 1, 12) * 3).astype(dtype)
    gamma, beta = rs.uniform(0.5, 2, 12).astype(F32), rs.randn(12).astype(F32)
    rm, rv, dy = rs.randn(12).astype(F32), rs.uniform(0.5, 2, 12).astype(F32), rs.randn(*shape).astype(dtype)
    dev = {k: g(v) for k, v in dict(x=x, g=gamma, b=beta, rm=rm, rv=rv, dy=dy).items()}
    rm64, rv64 = f64(rm), f64(rv)
    k = HALF if dtype == F16 else 1e-4
    previous = mx.set_batchnorm_mode(mode)
    try:
        for step in range(2):
            y, sm, si = B.batchnorm_forward_training(dev["x"], dev["g"], dev["b"], dev["rm"], dev["rv"], 0.9, 1e-5,
                                                     layout="NHWC")
            ey, esm, esi = RB.batchnorm_forward_training(nchw(f64(x)), f64(gamma), f64(beta), rm64, rv64, 0.9, 1e-5)
            assert y.dtype == dtype and sm.dtype == F32
            assert_close(y, nhwc(ey), k, k * np.abs(ey).max(), f"y step {step}")
            for a, e, name in ((sm, esm, "save_mean"), (si, esi, "save_inv_std"), (dev["rm"], rm64, "running_mean"),
                               (dev["rv"], rv64, "running_var")):
                assert_close(a, e, 1e-4, 1e-4, name)
        dx, dg, db = B.batchnorm_backward(dev["x"], dev["dy"], dev["g"], sm, si, 1e-5, layout="NHWC")
        edx, edg, edb = RB.batchnorm_backward(nchw(f64(x)), nchw(f64(dy)), f64(gamma), esm, esi, 1e-5)
        for a, e, name in ((dx, nhwc(edx), "dx"), (dg, edg, "dgamma"), (db, edb, "dbeta")):
            assert_close(a, e, k, k * max(1.0, float(np.abs(e).max())), name)
    finally:
        mx.set_batchnorm_mode(previous)
    y = B.batchnorm_forward_inference(dev["x"], dev["g"], dev["b"], dev["rm"], dev["rv"], 1e-3, layout="NHWC")
    ey = RB.batchnorm_forward_inference(nchw(f64(x)), f64(gamma), f64(beta), rm64, rv64, 1e-3)
    assert_close(y, nhwc(ey), k, k * np.abs(ey).max(), "inference")


def test_gpu_nd_batchnorm_axis3_matches_cpu():
    x = rnd((4, 5, 6, 3), 40)
    params = [np.array([0.5, 1.0, 1.5], F32), np.array([0.1, -0.2, 0.3], F32), rnd((3,), 41), np.ones(3, F32)]
    dy = rnd(x.shape, 42)
    out = []
    for ctx in (mx.gpu(0), mx.cpu()):
        a, gm, bt = (nd.array(v, ctx=ctx) for v in (x, *params[:2]))
        mm, mv = (nd.array(v, ctx=ctx) for v in params[2:])
        for v in (a, gm, bt):
            v.attach_grad()
        with autograd.record():
            y = nd.BatchNorm(a, gm, bt, mm, mv, eps=1e-5, fix_gamma=False, axis=3)
        y.backward(nd.array(dy, ctx=ctx))
        out.append([v.asnumpy() for v in (y, mm, mv, a.grad, gm.grad, bt.grad,
                                          nd.BatchNorm(a, gm, bt, mm, mv, eps=1e-5, fix_gamma=False, axis=3))])
    for got, want, name in zip(*out, ("y", "mm", "mv", "dx", "dgamma", "dbeta", "predict")):
        assert_close(got, want, 1e-4, 1e-4 * max(1.0, float(np.abs(want).max())), name)


@pytest.mark.parametrize("mode", ["persistent", "spatial"])
def test_gpu_nd_batchnorm_axis3_float16_takes_the_nhwc_kernels(mode):
    """Channels-last float16 BatchNorm (C % 4 == 0) in the persistent mode goes through cudnnBatchNormalization*Ex
    (the NHWC kernels; the legacy call's NHWC kernel is 50-100x slower), in the spatial mode through the legacy
    calls; both match float64 (outputs, moving statistics, gradients)."""
    x = rnd((6, 5, 7, 16), 50, F16)
    params = [rnd((16,), 51) + 1.0, rnd((16,), 52), rnd((16,), 53), np.abs(rnd((16,), 54)) + 0.5]
    dy = rnd(x.shape, 55, F16)
    want_mm, want_mv = params[2].astype(F64), params[3].astype(F64)
    want = RB.batchnorm_forward_training(x.astype(F64), *(p.astype(F64) for p in params[:2]), want_mm, want_mv,
                                         0.9, 1e-5, layout="NHWC")
    wdx, wdg, wdb = RB.batchnorm_backward(x.astype(F64), dy.astype(F64), params[0].astype(F64), want[1], want[2],
                                          1e-5, layout="NHWC")
    previous = mx.set_batchnorm_mode(mode)
    try:
        dev = mx.gpu(0)
        a = nd.array(x, ctx=dev, dtype="float16")
        gm, bt, mm, mv = (nd.array(v, ctx=dev) for v in params)
        for v in (a, gm, bt):
            v.attach_grad()
        with mx.trace() as t:
            with autograd.record():
                y = nd.BatchNorm(a, gm, bt, mm, mv, eps=1e-5, momentum=0.9, fix_gamma=False, axis=3)
            y.backward(nd.array(dy, ctx=dev, dtype="float16"))
    finally:
        mx.set_batchnorm_mode(previous)
    calls = [r.function for r in t.records if r.function.startswith("cudnnBatchNormalization")]
    ex = ["cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationBackwardEx"]
    assert calls == (ex if mode == "persistent" else ["cudnnBatchNormalizationForwardTraining",
                                                      "cudnnBatchNormalizationBackward"]), calls
    for got, ref, name in ((y, want[0], "y"), (a.grad, wdx, "dx")):
        assert_close(got.asnumpy().astype(F64), ref, 1e-2, 1e-2 * float(np.abs(ref).max()), name)
    for got, ref, name in ((mm, want_mm, "moving_mean"), (mv, want_mv, "moving_var")):
        assert_close(got.asnumpy(), ref, 1e-3, 1e-3, name)
    for got, ref, name in ((gm.grad, wdg, "dgamma"), (bt.grad, wdb, "dbeta")):
        assert_close(got.asnumpy(), ref, 2e-3, 2e-3 * float(np.abs(ref).max()), name)


def _nhwc_net(dev, seed):
    net = nn.Sequential()
    net.add(nn.Conv2D(8, 3, padding=1, layout="NHWC", activation="relu"), nn.BatchNorm(axis=3),
            nn.Conv2D(16, 3, strides=2, layout="NHWC", groups=2), nn.BatchNorm(axis=-1), nn.Activation("relu"),
            nn.MaxPool2D(2, layout="NHWC"), nn.GlobalAvgPool2D(layout="NHWC"), nn.Dense(10))
    nd.random.seed(seed)
    net.initialize(mx.init.Xavier(), ctx=dev)
    net(nd.zeros((2, 12, 12, 3), ctx=dev))
    return net


@pytest.fixture
def deterministic():
    mx.set_conv_algo_policy("time", deterministic=True)
    yield
    mx.set_conv_algo_policy("time", deterministic=False)


def test_gpu_hybridized_nhwc_block_equals_eager(deterministic):
    dev = mx.gpu(0)
    eager, hybrid = _nhwc_net(dev, 1), _nhwc_net(dev, 2)
    for p, q in zip(eager.collect_params().values(), hybrid.collect_params().values()):
        q.set_data(p.data())
    hybrid.hybridize()
    rng = np.random.default_rng(50)
    batches = [(rng.standard_normal((16, 12, 12, 3)).astype(F32), rng.integers(0, 10, 16)) for _ in range(5)]
    losses = []
    for net in (eager, hybrid):
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        loss_fn, seen = gluon.loss.SoftmaxCrossEntropyLoss(), []
        for xb, yb in batches:
            with autograd.record():
                loss = loss_fn(net(nd.array(xb, ctx=dev)), nd.array(yb, ctx=dev, dtype=np.int32))
            loss.backward()
            trainer.step(len(xb))
            seen.append(loss.asnumpy())
        losses.append(seen)
    assert hybrid._cached.replays >= 3, "the later steps must be replays"
    for a, b in zip(*losses):
        assert_close(b, a, 1e-5, 1e-6, "loss")
    for (k, p), q in zip(eager.collect_params().items(), hybrid.collect_params().values()):
        assert_close(q.data(), p.data(), 1e-5, 1e-6, k)  # weights, biases, running statistics
    x = nd.array(batches[0][0], ctx=dev)
    assert_close(hybrid(x), eager(x), 1e-5, 1e-6, "predict-mode output")
