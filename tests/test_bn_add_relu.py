"""BatchNormAddRelu, relu(BatchNorm(x) + z) (NVIDIA MXNet's fused op): ops.batchnorm_fused and its numpy twin,
nd.BatchNormAddRelu and gluon.nn.BatchNormAddRelu.

CPU: the twin against a float64 formula and central differences; the prototypes against cuDNN's header; the nd op
against the separate ops (nd.BatchNorm + add + relu: bitwise, since it composes them), its gradients by central
differences, its fused path (routed to the twin) against the composed one; the Gluon block against nn.BatchNorm;
errors before any library call. GPU (marker ``gpu``): cuDNN's fused NHWC float16 op against the twin in float64
(y within 2e-3 relative + 4e-3 of max|y|, FACTS.md measured ~3e-3 against FP32), the composed paths, the calls the
fused path makes (dnnbind.trace) and a hybridized Block against eager.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.nd import _bn_fused
from dnnbind.ops import batchnorm_fused as B
from dnnbind.ops.reference import batchnorm_fused as R
from tests._helpers import assert_close, c_param_kind, ctypes_arg_kind, cudnn_ops_header, numerical_grad

CPU = mx.cpu()
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def _inputs(shape, dtype, axis=-1, seed=0):
    """x (channel offsets so the statistics matter), z, gamma, beta, running mean and var; parameters float32 for
    float16 data."""
    rs = np.random.RandomState(seed)
    ax = axis % len(shape)
    c = shape[ax]
    bshape = [1] * len(shape)
    bshape[ax] = c
    pdtype = F32 if np.dtype(dtype) == F16 else dtype
    x = (rs.randn(*shape) * 2 + rs.randn(*bshape) * 3).astype(dtype)
    z = rs.randn(*shape).astype(dtype)
    gamma, beta = rs.uniform(0.5, 2, c).astype(pdtype), (rs.randn(c) * 0.5).astype(pdtype)
    rm, rv = rs.randn(c).astype(pdtype), rs.uniform(0.5, 2, c).astype(pdtype)
    return x, z, gamma, beta, rm, rv


def _formula(x, z, gamma, beta, eps, axis=-1, mean=None, var=None):
    """float64 relu(BN(x) + z); batch statistics (biased variance) unless mean/var are given."""
    ax = axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != ax)
    shape = [1] * x.ndim
    shape[ax] = -1
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes) if mean is None else np.asarray(mean, np.float64)
    var = x64.var(axis=axes) if var is None else np.asarray(var, np.float64)
    bn = (x64 - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)
    return np.maximum(bn + z, 0.0)


def _a(v, dtype=None, ctx=CPU):
    v = np.asarray(v)
    return nd.array(v, ctx=ctx, dtype=dtype or v.dtype)


# -- the numpy twin -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 3, 4), (1, 4, 5, 8), (3, 2, 2, 64)])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_twin_forward_and_running_stats(shape, dtype):
    x0, z, gamma, beta, rm, rv = _inputs(shape, dtype)
    exp_rm, exp_rv = rm.astype(np.float64), rv.astype(np.float64)
    tol = 1e-5 if dtype == F32 else 1e-12
    for step in range(2):
        x = (x0 * (1 + step) - step).astype(dtype)
        y, sm, si, reserve = R.batchnorm_add_relu_forward_training(x, z, gamma, beta, rm, rv, 0.8, 1e-4)
        assert y.dtype == sm.dtype == dtype and reserve.dtype == np.uint8 and reserve.shape == (0,)
        assert_close(y, _formula(x, z, gamma, beta, 1e-4), tol, tol, "y")
        x64 = x.astype(np.float64)
        assert_close(sm, x64.mean(axis=(0, 1, 2)), tol, tol, "save_mean")
        assert_close(si, 1 / np.sqrt(x64.var(axis=(0, 1, 2)) + 1e-4), tol, tol, "save_inv_std")
        exp_rm = 0.8 * exp_rm + 0.2 * x64.mean(axis=(0, 1, 2))
        exp_rv = 0.8 * exp_rv + 0.2 * x64.var(axis=(0, 1, 2))  # biased, MXNet's convention
        assert_close(rm, exp_rm, tol, tol, "running_mean")
        assert_close(rv, exp_rv, tol, tol, "running_var")


@pytest.mark.parametrize("shape", [(2, 2, 3, 4), (1, 3, 2, 8)])
def test_twin_backward_by_central_differences(shape):
    x, z, gamma, beta, rm, rv = _inputs(shape, F64, seed=2)
    dy = np.random.RandomState(3).randn(*shape)
    eps = 1e-3
    y, sm, si, reserve = R.batchnorm_add_relu_forward_training(x, z, gamma, beta, rm, rv, 0.9, eps)
    dx, dz, dg, db = R.batchnorm_add_relu_backward(x, y, dy, gamma, beta, sm, si, reserve, eps)
    assert_close(dz, np.where(y > 0, dy, 0.0), 0, 0, "dz is dy masked by the ReLU")

    def f(xv=x, zv=z, g=gamma, b=beta):
        return R.batchnorm_add_relu_forward_training(xv, zv, g, b, rm.copy(), rv.copy(), 0.9, eps)[0]

    for got, name, arg in ((dx, "dx", "xv"), (dz, "dz", "zv"), (dg, "dgamma", "g"), (db, "dbeta", "b")):
        point = {"xv": x, "zv": z, "g": gamma, "b": beta}[arg]
        assert_close(got, numerical_grad(lambda v: f(**{arg: v}), point, dy), 1e-6, 1e-7, name)


def test_twin_float16_data_with_float32_parameters():
    x, z, gamma, beta, rm, rv = _inputs((4, 3, 3, 8), F16, seed=4)
    y, sm, si, _ = R.batchnorm_add_relu_forward_training(x, z, gamma, beta, rm, rv)
    assert y.dtype == F16 and sm.dtype == si.dtype == F32
    expect = _formula(x, z.astype(np.float64), gamma, beta, 1e-5)
    assert_close(y, expect, 2e-3, 1e-3 * np.abs(expect).max(), "y")


def test_twin_errors_name_the_op_and_the_argument():
    x, z, gamma, beta, rm, rv = _inputs((2, 3, 3, 4), F32)
    fwd, bwd = R.batchnorm_add_relu_forward_training, R.batchnorm_add_relu_backward
    with pytest.raises(ValueError, match=r"batchnorm_add_relu_forward_training: z has shape \(2, 3, 3, 5\) but x "
                                         r"has shape \(2, 3, 3, 4\)"):
        fwd(x, np.zeros((2, 3, 3, 5), F32), gamma, beta, rm, rv)
    with pytest.raises(ValueError, match=r"x must be 4-D channels-last \(N, H, W, C\)"):
        fwd(x[0], z[0], gamma, beta, rm, rv)
    with pytest.raises(ValueError, match=r"gamma has shape \(3,\) but x of shape \(2, 3, 3, 4\) has 4 channels"):
        fwd(x, z, gamma[:3], beta, rm, rv)
    with pytest.raises(ValueError, match="more than one value per channel"):
        fwd(x[:1, :1, :1], z[:1, :1, :1], gamma, beta, rm, rv)
    with pytest.raises(TypeError, match="dtypes differ"):
        fwd(x, z.astype(F64), gamma, beta, rm, rv)
    y, sm, si, reserve = fwd(x, z, gamma, beta, rm, rv)
    with pytest.raises(ValueError, match=r"batchnorm_add_relu_backward: dy has shape"):
        bwd(x, y, y[:1], gamma, beta, sm, si, reserve)
    with pytest.raises(TypeError, match="reserve has dtype float32"):
        bwd(x, y, y, gamma, beta, sm, si, sm)


# -- the cuDNN binding, host side (no GPU needed) -------------------------------------------------------------

DECLARED = ["cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
            "cudnnGetBatchNormalizationBackwardExWorkspaceSize", "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
            "cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationBackwardEx"]


# -- the cuDNN binding, host side (no GPU needed) -------------------------------------------------------------

DECLARED = ["cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
            "cudnnGetBatchNormalizationBackwardExWorkspaceSize", "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
            "cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationBackwardEx"]


@pytest.mark.parametrize("name", DECLARED)
def test_prototypes_match_cudnn_ops_header(name):
    text = cudnn_ops_header()
    found = re.findall(rf"\b{name}\s*\(([^()]*)\)\s*;", text)
    assert len(found) == 1, f"{name}: {len(found)} prototypes in cudnn_ops.h"
    params = [p for p in found[0].split(",") if p.strip()]
    from dnnbind._lib import cudnn
    restype, argtypes = cudnn._TABLE[name]
    assert restype.__name__ == "STATUS" and len(argtypes) == len(params), (name, params)
    for i, (p, t) in enumerate(zip(params, argtypes)):
        assert ctypes_arg_kind(t) == c_param_kind(p), f"{name} parameter {i} {p!r}: argtype {t.__name__}"
    assert (cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, cudnn.CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION) == (2, 2)
    assert re.search(r"CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION\s*=\s*2\b", text)
    assert re.search(r"CUDNN_BATCHNORM_SPATIAL_PERSISTENT\s*=\s*2\b", text)


def test_nhwc_derived_descriptor_and_what_the_gpu_op_takes():
    from dnnbind._lib import cudnn
    from dnnbind.ops import descriptors
    try:
        bnd = descriptors.batchnorm((2, 5, 5, 8), F16, "NHWC")[1]
    except OSError as exc:  # the library itself is not loadable here
        pytest.skip(f"cuDNN not loadable: {exc}")
    dt, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    cudnn.lib.cudnnGetTensorNdDescriptor(bnd, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
    assert dt.value == cudnn.CUDNN_DATA_FLOAT and tuple(dims[:nb.value]) == (1, 8, 1, 1)
    assert B.fusable((2, 5, 5, 8), F16, F32) and B.fusable((1, 1, 2, 4), F16, F32)
    for shape, dt_, pdt in (((2, 5, 5, 6), F16, F32), ((2, 5, 5, 8), F32, F32), ((2, 5, 5, 8), F16, F16),
                            ((2, 5, 8), F16, F32), ((1, 1, 1, 8), F16, F32)):
        assert not B.fusable(shape, dt_, pdt), shape
    # the GPU implementation refuses what cuDNN does not fuse before any library call (cpu arrays: no GPU needed)
    for dtype, c, err, msg in ((F32, 8, TypeError, "float16 data only"), (F16, 6, ValueError, "multiple of 4")):
        x, z, *params = (_a(a) for a in _inputs((2, 3, 3, c), dtype))
        with mx.trace() as t, pytest.raises(err, match="batchnorm_add_relu_forward_training: .*" + msg):
            B.batchnorm_add_relu_forward_training.gpu(x, z, *params)
        assert t.records == []


# -- nd.BatchNormAddRelu: the composed path is the separate ops --------------------------------------------------

CASES = [((2, 4, 3, 3), 1), ((2, 3, 3, 4), -1), ((2, 3, 3, 8), 3), ((4, 64, 2, 2), 1), ((1, 5, 5, 64), -1),
         ((1, 4, 6), 1), ((3, 2, 2, 8), 3)]


def _run(op, shape, axis, fix_gamma, seed=5, dtype=F32, noncontiguous=False, **kw):
    """Forward (recording) and backward; returns outputs, moving stats, gamma and the four gradients."""
    x, z, gamma, beta, rm, rv = _inputs(shape, dtype, axis=axis, seed=seed)
    xs = [_a(v) for v in (x, z, gamma, beta)]
    for a in xs:
        a.attach_grad()
    mm, mv = _a(rm), _a(rv)
    dy = _a(np.random.RandomState(seed + 1).randn(*shape).astype(dtype))
    with autograd.record():
        y = op(*xs, mm, mv, axis=axis, fix_gamma=fix_gamma, **kw)
    y.backward(dy)
    out = [y, mm, mv, xs[2]] + [a.grad for a in xs]
    if noncontiguous:  # the same addend as a non-contiguous numpy view: forward only, same values
        zt = np.ascontiguousarray(np.swapaxes(z, 1, 2)).swapaxes(1, 2)
        assert not zt.flags.c_contiguous
        with autograd.train_mode():
            y2 = op(xs[0], zt, _a(gamma), _a(beta), _a(rm), _a(rv), axis=axis, fix_gamma=fix_gamma, **kw)
        out.append(y2)
    return [o.asnumpy() for o in out]


def _separate(x, z, gamma, beta, mm, mv, **kw):
    return nd.relu(nd.BatchNorm(x, gamma, beta, mm, mv, **kw) + z)


@pytest.mark.parametrize("shape, axis", CASES)
@pytest.mark.parametrize("fix_gamma", [False, True])
def test_nd_equals_the_separate_ops(shape, axis, fix_gamma):
    got = _run(nd.BatchNormAddRelu, shape, axis, fix_gamma, noncontiguous=True)
    want = _run(_separate, shape, axis, fix_gamma, noncontiguous=True)
    names = ["y", "moving_mean", "moving_var", "gamma", "d data", "d addend", "d gamma", "d beta", "y (view addend)"]
    for g, w, name in zip(got, want, names):
        assert np.array_equal(g, w), name
    if fix_gamma:
        assert np.array_equal(got[3], np.ones(shape[axis])) and not got[6].any(), "fix_gamma: gamma 1, gradient 0"
    x, z, gamma, beta, _, _ = _inputs(shape, F32, axis=axis, seed=5)
    g = np.ones_like(gamma) if fix_gamma else gamma
    assert_close(got[0], _formula(x, z, g, beta, 1e-3, axis), 1e-5, 1e-5, "y against float64")


@pytest.mark.parametrize("shape, axis", [((2, 3, 3, 4), -1), ((2, 4, 2, 3), 1)])
def test_nd_gradients_by_central_differences(shape, axis):
    x, z, gamma, beta, rm, rv = _inputs(shape, F64, axis=axis, seed=8)

    def fn(*arrays):
        return nd.BatchNormAddRelu(*arrays, _a(rm), _a(rv), fix_gamma=False, axis=axis)

    xs = [_a(v) for v in (x, z, gamma, beta)]
    for a in xs:
        a.attach_grad()
    w = np.random.RandomState(9).uniform(0.5, 1.5, shape)
    with autograd.record():
        y = fn(*xs)
    y.backward(_a(w))
    for i, name in enumerate(("data", "addend", "gamma", "beta")):
        def f(v, i=i):
            with autograd.train_mode():
                return fn(*(_a(v if j == i else a) for j, a in enumerate((x, z, gamma, beta)))).asnumpy()
        assert_close(xs[i].grad, numerical_grad(f, (x, z, gamma, beta)[i], w), 1e-5, 1e-7, f"d {name}")


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """nd.BatchNormAddRelu's fused path for cpu NHWC data of any float dtype: the ops route it to the numpy twin,
    so the fused path's own code (record_op, its backward, fix_gamma, the statistics) runs without a GPU."""
    monkeypatch.setattr(_bn_fused, "_fusable", lambda data, pdtype: data.ndim == 4)


@pytest.mark.parametrize("fix_gamma", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 3, 4), (1, 4, 4, 8)])
def test_nd_fused_path_matches_the_composed_one(fused_on_cpu, shape, fix_gamma):
    with mx.trace() as t:
        got = _run(nd.BatchNormAddRelu, shape, 3, fix_gamma, dtype=F64)
    ops_run = {r.op for r in t.records}
    assert {"batchnorm_add_relu_forward_training", "batchnorm_add_relu_backward"} <= ops_run, ops_run
    want = _run(_separate, shape, 3, fix_gamma, dtype=F64)
    names = ["y", "moving_mean", "moving_var", "gamma", "d data", "d addend", "d gamma", "d beta"]
    for g, w, name in zip(got, want, names):
        assert_close(g, w, 1e-10, 1e-10, name)
    with autograd.train_mode():  # output_mean_var: BatchNorm's batch mean and inverse std
        x, z, gamma, beta, rm, rv = (_a(a) for a in _inputs(shape, F64))
        y, mean, inv_std = nd.BatchNormAddRelu(x, z, gamma, beta, rm, rv, axis=-1, output_mean_var=True)
    x64 = x.asnumpy()
    assert_close(mean, x64.mean(axis=(0, 1, 2)), 1e-12, 1e-12, "mean")
    eps = float(np.float32(1e-3))  # the default eps: MXNet's declared 1e-3, a C float (nd.BatchNorm's too)
    assert_close(inv_std, 1 / np.sqrt(x64.var(axis=(0, 1, 2)) + eps), 1e-12, 1e-12, "inverse std")


def test_nd_shape_cudnn_refuses_is_composed_from_then_on(fused_on_cpu, monkeypatch):
    from dnnbind._lib.errors import CudnnNotSupported
    calls = []

    def refuse(*args):
        calls.append(args)
        raise CudnnNotSupported(3000, "cudnnBatchNormalizationForwardTrainingEx", "CUDNN_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(_bn_fused._fused, "batchnorm_add_relu_forward_training", refuse)
    monkeypatch.setattr(_bn_fused, "_UNFUSED", set())
    for _ in range(2):
        got = _run(nd.BatchNormAddRelu, (2, 3, 3, 4), 3, False, dtype=F64)
        want = _run(_separate, (2, 3, 3, 4), 3, False, dtype=F64)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert len(calls) == 1 and _bn_fused._UNFUSED == {((2, 3, 3, 4), F64)}


@pytest.mark.parametrize("axis", [1, -1])
def test_nd_inference_and_use_global_stats(axis):
    shape = (2, 4, 3, 4)
    x, z, gamma, beta, rm, rv = _inputs(shape, F32, axis=axis, seed=11)
    mm, mv = _a(rm), _a(rv)
    y = nd.BatchNormAddRelu(_a(x), _a(z), _a(gamma), _a(beta), mm, mv, axis=axis, fix_gamma=False)
    expect = _formula(x, z, gamma, beta, 1e-3, axis, mean=rm, var=rv)
    assert_close(y, expect, 1e-5, 1e-6, "predict mode: the moving statistics")
    assert np.array_equal(mm.asnumpy(), rm) and np.array_equal(mv.asnumpy(), rv), "moving stats untouched"
    got = _run(nd.BatchNormAddRelu, shape, axis, False, seed=11, use_global_stats=True)
    want = _run(_separate, shape, axis, False, seed=11, use_global_stats=True)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    assert_close(got[0], expect, 1e-5, 1e-6, "use_global_stats in training")
    assert np.array_equal(got[2], rv), "use_global_stats leaves moving_var"


def test_nd_keyword_spelling_and_errors_before_any_library_call():
    x, z, gamma, beta, rm, rv = (_a(a) for a in _inputs((2, 3, 3, 4), F32))
    y = nd.BatchNormAddRelu(data=x, addend=z, gamma=gamma, beta=beta, moving_mean=rm, moving_var=rv, eps=1e-3,
                            momentum=0.9, fix_gamma=True, use_global_stats=False, axis=3, cudnn_off=False)
    assert y.shape == (2, 3, 3, 4)
    gamma2 = _a(np.full(4, 2.0, F32))
    bad = [(dict(addend=_a(np.zeros((2, 3, 3, 5), F32))), ValueError,
            r"BatchNormAddRelu: addend has shape \(2, 3, 3, 5\) but data has shape \(2, 3, 3, 4\)"),
           (dict(addend=_a(np.zeros((1, 3, 3, 4), F32))), ValueError, "addend has shape"),
           (dict(addend=_a(z.asnumpy(), F64)), TypeError, "BatchNormAddRelu: dtypes differ"),
           (dict(beta=_a(np.zeros(3, F32))), ValueError, r"BatchNormAddRelu: beta has shape \(3,\) but data"),
           (dict(axis=1), ValueError, r"gamma has shape \(4,\) but data of shape \(2, 3, 3, 4\) has 3 channels"),
           (dict(act_type="sigmoid"), ValueError, "act_type must be 'relu'")]
    for change, err, msg in bad:
        kw = dict(data=x, addend=z, gamma=gamma2, beta=beta, moving_mean=rm, moving_var=rv, axis=-1)
        kw.update(change)
        before = [a.asnumpy() for a in (rm, rv)]
        with mx.trace() as t, autograd.record(), pytest.raises(err, match=msg):
            nd.BatchNormAddRelu(**kw)
        assert t.records == [], f"{msg}: a library call before the error"
        assert np.array_equal(gamma2.asnumpy(), np.full(4, 2.0)), "gamma untouched (fix_gamma) by a refused call"
        assert all(np.array_equal(a.asnumpy(), b) for a, b in zip((rm, rv), before))


# -- gluon.nn.BatchNormAddRelu ---------------------------------------------------------------------------------

class _Separate(gluon.nn.Block):
    def __init__(self, **kw):
        super().__init__()
        self.bn = gluon.nn.BatchNorm(**kw)

    def forward(self, x, z):
        return nd.relu(self.bn(x) + z)


@pytest.mark.parametrize("axis", [1, -1])
def test_gluon_block_equals_batchnorm_then_relu_add(axis, tmp_path):
    fused, ref = gluon.nn.BatchNormAddRelu(axis=axis, momentum=0.8), _Separate(axis=axis, momentum=0.8)
    assert fused.name.startswith("batchnormaddrelu")
    fused.initialize(ctx=CPU)
    ref.initialize(ctx=CPU)
    for step in range(2):
        x, z, *_ = _inputs((4, 3, 2, 6) if axis == -1 else (4, 6, 3, 2), F32, axis=axis, seed=20 + step)
        outs = []
        for net in (fused, ref):
            with autograd.record():
                y = net(_a(x), _a(z))
            y.backward()
            outs.append(y.asnumpy())
        assert np.array_equal(*outs), step
    bn = ref.bn
    for name in ("gamma", "beta", "running_mean", "running_var"):
        p, q = getattr(fused, name), getattr(bn, name)
        assert p.shape == q.shape == (6,) and p.grad_req == q.grad_req, name
        assert np.array_equal(p.data().asnumpy(), q.data().asnumpy()), name
        if p.grad_req != "null":
            assert np.array_equal(p.grad().asnumpy(), q.grad().asnumpy()), name
    assert np.array_equal(fused(_a(x), _a(z)).asnumpy(), ref(_a(x), _a(z)).asnumpy()), "predict mode"
    assert repr(fused).startswith(f"BatchNormAddRelu(axis={axis}, eps=1e-05, momentum=0.8, fix_gamma=False")
    path = str(tmp_path / "bn.params")
    fused.save_parameters(path)
    assert set(nd.load(path)) == {"gamma", "beta", "running_mean", "running_var"}
    plain = gluon.nn.BatchNorm(axis=axis)
    plain.load_parameters(path, ctx=CPU)  # weights load interchangeably
    assert np.array_equal(plain.running_var.data().asnumpy(), fused.running_var.data().asnumpy())


def test_gluon_cast_float16_keeps_parameters_float32():
    net = gluon.nn.BatchNormAddRelu(axis=-1, in_channels=8)
    net.initialize(ctx=CPU)
    net.cast("float16")
    assert all(getattr(net, n).data().dtype == F32 for n in ("gamma", "beta", "running_mean", "running_var"))
    x, z, *_ = _inputs((4, 3, 3, 8), F16, seed=30)
    with autograd.record():
        y = net(_a(x), _a(z))
    y.backward()
    assert y.dtype == F16 and net.gamma.grad().dtype == F32
    expect = _formula(x, z.astype(np.float64), np.ones(8), np.zeros(8), 1e-5)
    assert_close(y, expect, 2e-3, 2e-3 * np.abs(expect).max(), "float16 output")
