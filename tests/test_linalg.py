"""``nd.linalg`` / ``sym.linalg`` (MXNet's ``_linalg_*`` operators, ops/defs/linalg.py).

tests/test_opdefs.py runs every entry's samples (shape inference, the symbol executor, central differences, the
GPU against the twin); here:

- the real MXNet 1.9.1's outputs and autograd gradients (tests/fixtures/mxnet_linalg, made by
  make_mxnet_linalg.py), on the cpu and the GPU: which triangle each op reads, potrf's symmetric gradient, det's
  zero gradient for a singular matrix;
- the twins against independent float64 identities (L L^T = A, A A^-1 = I, op(A) X = alpha B, ...) over batch
  shapes with size-1 axes; potrf's gradient by symmetric central differences;
- MXNet's refusals: dtypes other than float32/float64, shapes, axis, a matrix potrf cannot factor or inverse cannot
  invert;
- the GPU (cuBLAS, cuSOLVER) against the twin at float32 and float64 over several batch shapes and sizes, forward and
  every input gradient; cuSOLVER missing -> an error naming the library.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from tests._helpers import assert_close, numerical_grad

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_linalg", "linalg.npz")


def _fixture_cases():
    f = np.load(FIXTURE)
    cases = []
    for k in range(int(f["count"])):
        names = str(f[f"names{k}"]).split(",")
        outs = []
        j = 0
        while f"out{k}_{j}" in f:
            outs.append(f[f"out{k}_{j}"])
            j += 1
        cases.append((str(f[f"op{k}"]), eval(str(f[f"params{k}"])), [f[f"in{k}_{i}"] for i in range(len(names))],
                      outs, f[f"dy{k}"], [f[f"grad{k}_{i}"] for i in range(len(names))]))
    return cases


CASES = _fixture_cases()


def _run(op, params, inputs, dy, device):
    xs = [nd.array(v, ctx=device, dtype=v.dtype) for v in inputs]
    for x in xs:
        x.attach_grad()
    with autograd.record():
        y = getattr(nd.linalg, op)(*xs, **params)
    outs = y if isinstance(y, tuple) else (y,)
    head = outs[1] if op == "slogdet" else outs[0]
    head.backward(nd.array(dy, ctx=device, dtype=dy.dtype))
    return [o.numpy() for o in outs], [x.grad.numpy() for x in xs]


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_mxnet(k, ctx, request):
    op, params, inputs, outs_mx, dy, grads_mx = CASES[k]
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    outs, grads = _run(op, params, inputs, dy, device)
    tol = 1e-5 if inputs[0].dtype == np.float32 else 1e-10
    assert len(outs) == len(outs_mx)
    for j, (o, e) in enumerate(zip(outs, outs_mx)):
        assert o.dtype == e.dtype, (o.dtype, e.dtype)
        assert_close(o, e, rtol=tol, atol=tol, name=f"{op} {params} output {j}")
    for i, (g, e) in enumerate(zip(grads, grads_mx)):
        assert_close(g, e, rtol=tol * 10, atol=tol * 10, name=f"{op} {params} gradient of input {i}")


REQUIRED = ("gemm", "gemm2", "potrf", "potri", "trsm", "trmm", "syrk", "sumlogdiag", "inverse", "det")


def test_every_required_op_is_in_nd_and_sym_linalg():
    for op in REQUIRED:
        assert getattr(nd.linalg, op) is nd.OPERATORS["_linalg_" + op][1]
        assert callable(getattr(sym.linalg, op))
        assert hasattr(nd, "linalg_" + op)  # MXNet's alias


# -- the twins against independent identities ------------------------------------------------------------------------

BATCHES = [(), (1,), (3,), (2, 1)]
rng = np.random.default_rng(5)


def _spd(shape):
    x = rng.standard_normal(shape)
    return np.matmul(x, np.swapaxes(x, -1, -2)) / shape[-1] + np.eye(shape[-1])


def _tri(shape):
    x = rng.standard_normal(shape) * 0.3
    n = shape[-1]
    x[..., np.arange(n), np.arange(n)] = rng.uniform(1.0, 2.0, shape[:-1])
    return x


def _np(x):
    return x.numpy()


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("n", [1, 4])
def test_potrf_potri_inverse_det_identities(batch, n):
    s = _spd(batch + (n, n))
    for lower in (True, False):
        f = _np(nd.linalg.potrf(nd.array(s, dtype="float64"), lower=lower))
        mat = np.matmul(f, np.swapaxes(f, -1, -2)) if lower else np.matmul(np.swapaxes(f, -1, -2), f)
        assert_close(mat, s, 1e-12, 1e-12, name="L L^T")
        assert np.all((np.triu(f, 1) if lower else np.tril(f, -1)) == 0)
        assert_close(nd.linalg.potri(nd.array(f, dtype="float64"), lower=lower), np.linalg.inv(s), 1e-10, 1e-10,
                     name="potri")
    a = s + rng.standard_normal(s.shape) * 0.2
    assert_close(np.matmul(_np(nd.linalg.inverse(nd.array(a, dtype="float64"))), a),
                 np.broadcast_to(np.eye(n), a.shape), 1e-10, 1e-10, name="A^-1 A")
    d = _np(nd.linalg.det(nd.array(a, dtype="float64")))
    assert d.shape == (batch or (1,))
    assert_close(d, np.linalg.det(a).reshape(batch or (1,)), 1e-10, 1e-12, name="det")
    sld = _np(nd.linalg.sumlogdiag(nd.array(s, dtype="float64")))
    assert_close(sld, np.log(np.diagonal(s, axis1=-2, axis2=-1)).sum(-1).reshape(batch or (1,)), 1e-12, 1e-12)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("rightside,transpose,lower", [(False, False, True), (True, False, True),
                                                       (False, True, False), (True, True, False)])
def test_trsm_trmm_identities(batch, rightside, transpose, lower):
    n, m = 3, 5
    a = _tri(batch + (n, n))
    tri = np.tril(a) if lower else np.triu(a)
    op = np.swapaxes(tri, -1, -2) if transpose else tri
    b = rng.standard_normal(batch + ((m, n) if rightside else (n, m)))
    kw = dict(rightside=rightside, transpose=transpose, lower=lower, alpha=0.5)
    x = _np(nd.linalg.trsm(nd.array(a, dtype="float64"), nd.array(b, dtype="float64"), **kw))
    assert_close(np.matmul(x, op) if rightside else np.matmul(op, x), 0.5 * b, 1e-12, 1e-12, name="trsm")
    y = _np(nd.linalg.trmm(nd.array(a, dtype="float64"), nd.array(b, dtype="float64"), **kw))
    assert_close(y, 0.5 * (np.matmul(b, op) if rightside else np.matmul(op, b)), 1e-12, 1e-12, name="trmm")


@pytest.mark.parametrize("batch", BATCHES)
def test_gemm_syrk_identities(batch):
    a, b, c = (rng.standard_normal(batch + s) for s in ((3, 4), (5, 4), (3, 5)))
    y = nd.linalg.gemm(nd.array(a, dtype="float64"), nd.array(b, dtype="float64"), nd.array(c, dtype="float64"),
                       transpose_b=True, alpha=2.0, beta=-0.5)
    assert_close(y, 2.0 * np.matmul(a, np.swapaxes(b, -1, -2)) - 0.5 * c, 1e-12, 1e-12, name="gemm")
    y = nd.linalg.syrk(nd.array(a, dtype="float64"), transpose=True, alpha=0.3)
    assert_close(y, 0.3 * np.matmul(np.swapaxes(a, -1, -2), a), 1e-12, 1e-12, name="syrk")
    assert np.array_equal(y.numpy(), np.swapaxes(y.numpy(), -1, -2))  # mirrored: exactly symmetric
    if batch:
        # axis: the rows on a leading axis, the other axes a batch
        a4, b4 = rng.standard_normal((3,) + batch + (4,)), rng.standard_normal((4,) + batch + (2,))
        y = nd.linalg.gemm2(nd.array(a4, dtype="float64"), nd.array(b4, dtype="float64"), axis=0)
        want = np.moveaxis(np.matmul(np.moveaxis(a4, 0, -2), np.moveaxis(b4, 0, -2)), -2, 0)
        assert_close(y, want, 1e-12, 1e-12, name="gemm2 axis=0")


@pytest.mark.parametrize("lower", [True, False])
def test_potrf_gradient_is_the_symmetric_one(lower):
    """MXNet's potrf gradient is d/dA for symmetric A: perturbing A[i, j] and A[j, i] together (e) changes the
    output by <grad, e>."""
    s = _spd((2, 3, 3))
    x = nd.array(s, dtype="float64")
    x.attach_grad()
    w = rng.uniform(0.5, 1.5, s.shape)
    with autograd.record():
        y = nd.linalg.potrf(x, lower=lower)
    y.backward(nd.array(w, dtype="float64"))
    g = x.grad.numpy()
    assert_close(g, np.swapaxes(g, -1, -2), 1e-12, 1e-12, name="symmetric gradient")

    def f(v):
        sym_v = (v + np.swapaxes(v, -1, -2)) / 2  # the forward sees only symmetric matrices
        return nd.linalg.potrf(nd.array(sym_v, dtype="float64"), lower=lower).numpy()
    assert_close(g, numerical_grad(f, s, w), 1e-6, 1e-8, name="potrf gradient")


# -- refusals --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "int32", "int64", "uint8"])
def test_only_float32_and_float64(dtype):
    a = nd.array(np.eye(3) * 2, dtype=dtype)
    for fn in (lambda: nd.linalg.potrf(a), lambda: nd.linalg.det(a), lambda: nd.linalg.inverse(a),
               lambda: nd.linalg.gemm2(a, a), lambda: nd.linalg.trsm(a, a), lambda: nd.linalg.syrk(a),
               lambda: nd.linalg.gemm(a, a, a), lambda: nd.linalg.sumlogdiag(a)):
        with pytest.raises(TypeError, match="only supports 32-bit and 64-bit floating point"):
            fn()


def test_inputs_must_share_a_dtype():
    with pytest.raises(TypeError, match="expected float32, got float64"):
        nd.linalg.gemm2(nd.ones((2, 2)), nd.ones((2, 2), dtype="float64"))


@pytest.mark.parametrize("call,message", [
    (lambda: nd.linalg.gemm2(nd.ones((3, 4)), nd.ones((3, 5))), "Incompatible matrix dimensions"),
    (lambda: nd.linalg.gemm2(nd.ones((2, 3, 4)), nd.ones((3, 4, 5))), "must be the same, except on row/col axis"),
    (lambda: nd.linalg.gemm2(nd.ones((4,)), nd.ones((4,))), "at least 2 dimensions"),
    (lambda: nd.linalg.gemm2(nd.ones((2, 3, 4)), nd.ones((4, 5))), "same number of dimensions"),
    (lambda: nd.linalg.gemm2(nd.ones((3, 2, 4)), nd.ones((4, 2, 5)), axis=-1), r"Invalid row axis \(-1\)"),
    (lambda: nd.linalg.gemm2(nd.ones((3, 2, 4)), nd.ones((4, 2, 5)), axis=2), r"Invalid row axis \(2\)"),
    (lambda: nd.linalg.gemm(nd.ones((2, 3, 4)), nd.ones((2, 4, 5)), nd.ones((3, 5))), "Shape inconsistent"),
    (lambda: nd.linalg.trsm(nd.ones((3, 4)), nd.ones((3, 4))), "square matrices"),
    (lambda: nd.linalg.trsm(nd.ones((3, 3)), nd.ones((4, 3))), "Incompatible matrix dimensions"),
    (lambda: nd.linalg.trmm(nd.ones((2, 3, 3)), nd.ones((3, 3, 2))), "except on last two dimensions"),
    (lambda: nd.linalg.inverse(nd.ones((3, 4))), "last two dimensions must be equal"),
    (lambda: nd.linalg.sumlogdiag(nd.ones((3, 4))), "last two dimensions must be equal"),
    (lambda: nd.linalg.potrf(nd.ones((0, 3, 3))), "zero-size"),
    (lambda: nd.linalg.det(nd.ones((2, 0, 0))), "zero-size"),
])
def test_bad_shapes_are_refused_as_mxnet_does(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_gemm_needs_c_as_mxnet():
    with pytest.raises(TypeError):
        nd.linalg.gemm(nd.ones((2, 2)), nd.ones((2, 2)))


def test_cpu_refuses_what_lapack_cannot_factor():
    with pytest.raises(ValueError, match="not symmetric or not positive definite"):
        nd.linalg.potrf(nd.array(-np.eye(3) * 2))
    with pytest.raises(ValueError, match="non-convertible"):
        nd.linalg.inverse(nd.zeros((2, 3, 3)))
    assert nd.linalg.det(nd.zeros((3, 3))).numpy().tolist() == [0.0]  # det of a singular matrix is 0


def test_sumlogdiag_of_a_non_positive_diagonal_is_nan_or_inf_as_mxnet():
    y = nd.linalg.sumlogdiag(nd.array(np.diag([1.0, -1.0, 2.0]))).numpy()
    assert np.isnan(y[0])
    assert nd.linalg.sumlogdiag(nd.array(np.diag([1.0, 0.0]))).numpy()[0] == -np.inf


# -- symbols ---------------------------------------------------------------------------------------------------------

def test_symbols_infer_shapes_and_keep_mxnets_hidden_outputs():
    a, b, c = sym.var("a"), sym.var("b"), sym.var("c")
    s = sym.linalg.gemm(a, b, c, transpose_a=True, name="g")
    assert s.infer_shape(a=(2, 4, 3), b=(2, 4, 5), c=(2, 3, 5))[1] == [(2, 3, 5)]
    s = sym.linalg.trsm(a, b, rightside=True, name="t")
    assert s.infer_shape(a=(3, 3), b=(4, 3))[1] == [(4, 3)]
    d = sym.linalg.det(a, name="det0")
    assert d.list_outputs() == ["det0_output0"]
    assert '"node_row_ptr": [0, 1, 4]' in d.tojson()  # MXNet's det node keeps LU and pivots as hidden outputs
    assert d.infer_shape(a=(2, 5, 3, 3))[1] == [(2, 5)]
    assert sym.linalg.sumlogdiag(a).infer_shape(a=(3, 3))[1] == [(1,)]


def test_symbol_executor_runs_a_chain_with_gradients():
    """trsm(potrf(A), B): the Cholesky solve, forward and backward through the executor, against nd."""
    s0 = _spd((2, 3, 3))
    b0 = rng.standard_normal((2, 3, 2))
    a, b = sym.var("a"), sym.var("b")
    out = sym.linalg.trsm(sym.linalg.potrf(a), b)
    args = {"a": nd.array(s0, dtype="float64"), "b": nd.array(b0, dtype="float64")}
    grads = {k: nd.zeros(v.shape, dtype="float64") for k, v in args.items()}
    ex = out.bind(dnnbind.cpu(), args, args_grad=grads)
    y = ex.forward(is_train=True)[0]
    assert_close(y, np.linalg.solve(np.linalg.cholesky(s0), b0), 1e-12, 1e-12)
    ex.backward(nd.ones(y.shape, dtype="float64"))
    xa, xb = nd.array(s0, dtype="float64"), nd.array(b0, dtype="float64")
    xa.attach_grad()
    xb.attach_grad()
    with autograd.record():
        z = nd.linalg.trsm(nd.linalg.potrf(xa), xb)
    z.backward(nd.ones(z.shape, dtype="float64"))
    assert_close(ex.grad_dict["a"], xa.grad, 1e-12, 1e-12)
    assert_close(ex.grad_dict["b"], xb.grad, 1e-12, 1e-12)


# -- cuSOLVER binding ------------------------------------------------------------------------------------------------

def test_cusolver_errors_name_the_function_status_and_meaning():
    from dnnbind._lib import cusolver
    err = cusolver.CusolverError(3, "cusolverDnSpotrf", "CUSOLVER_STATUS_INVALID_VALUE - an unsupported value")
    assert "cusolverDnSpotrf failed with cuSOLVER status 3: CUSOLVER_STATUS_INVALID_VALUE" in str(err)
    import pickle
    assert str(pickle.loads(pickle.dumps(err))) == str(err)

    class Fn:
        __name__ = "cusolverDnDgetrf"
    with pytest.raises(cusolver.CusolverError, match="cusolverDnDgetrf failed .*status 7: "
                                                     "CUSOLVER_STATUS_INTERNAL_ERROR"):
        cusolver._errcheck(7, Fn(), ())


def test_missing_cusolver_is_a_clear_error_naming_it():
    """In a fresh process with cuSOLVER pointed at nothing: the first cuSOLVER call raises LibraryNotFoundError
    naming cusolver and how to install it (import never fails)."""
    code = ("import dnnbind\n"
            "from dnnbind._lib import cusolver\n"
            "from dnnbind._lib.errors import LibraryNotFoundError\n"
            "try:\n"
            "    cusolver.lib.cusolverDnCreate\n"
            "except LibraryNotFoundError as e:\n"
            "    print('MISSING', e)\n")
    env = dict(os.environ, DNNBIND_CUSOLVER_PATH="/nonexistent/libcusolver.so.12")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "MISSING could not load cusolver" in out.stdout, out.stdout + out.stderr
    assert "nvidia-cusolver" in out.stdout


@pytest.mark.gpu
def test_gpu_without_cusolver_fails_cleanly():
    code = ("import numpy as np, dnnbind\n"
            "from dnnbind import nd\n"
            "from dnnbind._lib.errors import LibraryNotFoundError\n"
            "a = nd.array(np.eye(3) * 2, ctx=dnnbind.gpu(0))\n"
            "print('GEMM', float(nd.linalg.gemm2(a, a).numpy()[0, 0]))\n"
            "try:\n"
            "    nd.linalg.potrf(a).numpy()\n"
            "except LibraryNotFoundError as e:\n"
            "    print('MISSING', e)\n")
    env = dict(os.environ, DNNBIND_CUSOLVER_PATH="/nonexistent/libcusolver.so.12")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "GEMM 4.0" in out.stdout, out.stdout + out.stderr  # cuBLAS ops still run
    assert "MISSING could not load cusolver" in out.stdout, out.stdout + out.stderr


# -- the GPU against the twin ----------------------------------------------------------------------------------------

def _gpu_cases():
    """(op, params, inputs) over batch shapes and matrix sizes: what the lead runs on the device."""
    cases = []
    for batch in [(), (1,), (5,), (2, 3)]:
        for n in (1, 4, 17):
            sh = batch + (n, n)
            cases += [
                ("gemm", {"alpha": 0.7, "beta": -0.3}, [rng.standard_normal(batch + (n, 3)),
                                                        rng.standard_normal(batch + (3, 2)),
                                                        rng.standard_normal(batch + (n, 2))]),
                ("gemm2", {"transpose_a": True, "transpose_b": True}, [rng.standard_normal(batch + (3, n)),
                                                                       rng.standard_normal(batch + (2, 3))]),
                ("potrf", {}, [_spd(sh)]),
                ("potrf", {"lower": False}, [_spd(sh)]),
                ("potri", {}, [_tri(sh)]),
                ("potri", {"lower": False}, [_tri(sh)]),
                ("trsm", {"alpha": 1.5}, [_tri(sh), rng.standard_normal(batch + (n, 3))]),
                ("trsm", {"rightside": True, "transpose": True, "lower": False},
                 [_tri(sh), rng.standard_normal(batch + (2, n))]),
                ("trmm", {"transpose": True}, [_tri(sh), rng.standard_normal(batch + (n, 3))]),
                ("trmm", {"rightside": True, "lower": False, "alpha": -0.5},
                 [_tri(sh), rng.standard_normal(batch + (2, n))]),
                ("syrk", {"alpha": 0.5}, [rng.standard_normal(batch + (n, 3))]),
                ("syrk", {"transpose": True}, [rng.standard_normal(batch + (3, n))]),
                ("sumlogdiag", {}, [_spd(sh)]),
                ("inverse", {}, [_spd(sh) + rng.standard_normal(sh) * 0.2]),
                ("det", {}, [_tri(sh) + rng.standard_normal(sh) * 0.1]),
                ("slogdet", {}, [_tri(sh) * rng.choice([-1.0, 1.0], sh) + rng.standard_normal(sh) * 0.1]),
                ("extractdiag", {"offset": -(n // 2)}, [rng.standard_normal(sh)]),
                ("makediag", {"offset": 1}, [rng.standard_normal(batch + (n,))]),
                ("extracttrian", {"lower": False}, [rng.standard_normal(sh)]),
                ("maketrian", {"offset": -1}, [rng.standard_normal(batch + (n * (n + 1) // 2,))]),
            ]
        if batch:
            cases.append(("gemm2", {"axis": 0}, [rng.standard_normal((4,) + batch + (3,)),
                                                 rng.standard_normal((3,) + batch + (2,))]))
    return cases


GPU_CASES = _gpu_cases()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", range(len(GPU_CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(GPU_CASES)])
def test_gpu_matches_the_twin(k, dtype, gpu):
    op, params, inputs = GPU_CASES[k]
    inputs = [v.astype(dtype) for v in inputs]
    results = {}
    for device in (dnnbind.cpu(), gpu):
        xs = [nd.array(v, ctx=device, dtype=dtype) for v in inputs]
        for x in xs:
            x.attach_grad()
        with autograd.record():
            y = getattr(nd.linalg, op)(*xs, **params)
        if op == "slogdet":  # (sign, log|det|): the gradient flows from log|det|
            sign, y = y
        dy = np.random.default_rng(k).uniform(0.5, 1.5, y.shape).astype(dtype)
        y.backward(nd.array(dy, ctx=device, dtype=dtype))
        results[device.kind] = (y.numpy(), [x.grad.numpy() for x in xs])
        if op == "slogdet":
            results[device.kind + "-sign"] = sign.numpy()
    if op == "slogdet":
        assert np.array_equal(results["gpu-sign"], results["cpu-sign"])
    (yg, gg), (yc, gc) = results["gpu"], results["cpu"]
    tol = 1e-4 if dtype == "float32" else 1e-10
    scale = max(1.0, float(np.max(np.abs(yc))))
    assert yg.dtype == yc.dtype
    assert_close(yg, yc, rtol=tol, atol=tol * scale, name=f"{op} {params} forward")
    for i, (a, b) in enumerate(zip(gg, gc)):
        gscale = max(1.0, float(np.max(np.abs(b))))
        assert_close(a, b, rtol=tol * 10, atol=tol * 10 * gscale, name=f"{op} {params} gradient of input {i}")


@pytest.mark.gpu
def test_gpu_det_of_a_singular_matrix_is_zero_with_zero_gradient(gpu):
    x = nd.array(np.array([[[1.0, 2.0], [2.0, 4.0]], [[2.0, 0.0], [0.0, 3.0]]]), ctx=gpu, dtype="float64")
    x.attach_grad()
    with autograd.record():
        y = nd.linalg.det(x)
    y.backward(nd.ones((2,), ctx=gpu, dtype="float64"))
    assert_close(y, [0.0, 6.0], 1e-12, 1e-12)
    assert_close(x.grad, np.array([[[0.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [0.0, 2.0]]]), 1e-12, 1e-12)


@pytest.mark.gpu
def test_gpu_is_called_in_a_loop_on_one_stream_without_leaking_handles(gpu):
    """Repeated calls reuse one cuSOLVER handle per stream."""
    from dnnbind.ops.defs import linalg as L
    a = nd.array(_spd((3, 5, 5)), ctx=gpu, dtype="float64")
    for _ in range(3):
        nd.linalg.potrf(a).numpy()
        nd.linalg.inverse(a).numpy()
    assert len(L._solvers) == 1


# -- the GPU lowerings on a faked device (cpu): the column-major mapping without a GPU -------------------------------

def _colmajor(ptr, ld, rows, cols, dtype):
    """The column-major (rows, cols) matrix with leading dimension ``ld`` at host address ``ptr`` (a writable view)."""
    ct = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    buf = np.ctypeslib.as_array((ct * (ld * cols)).from_address(ptr))
    return buf.reshape(cols, ld).T[:rows, :]


def _ints(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_int * n).from_address(ptr))


class _FakeCublas:
    """cublas<t>trsm_v2 as its documentation states it, column-major, on host addresses."""

    def _trsm(self, dtype, h, side, uplo, trans, diag, m, n, alpha_p, a, lda, b, ldb):
        alpha = (ctypes.c_double if dtype == np.float64 else ctypes.c_float).from_address(alpha_p).value
        k = m if side == 0 else n
        am = _colmajor(a, lda, k, k, dtype)
        t = np.tril(am) if uplo == 0 else np.triu(am)
        op = t.T if trans else t
        bm = _colmajor(b, ldb, m, n, dtype)
        bm[...] = np.linalg.solve(op, alpha * bm) if side == 0 else np.linalg.solve(op.T, alpha * bm.T).T

    def cublasStrsm_v2(self, *args):
        self._trsm(np.float32, *args)

    def cublasDtrsm_v2(self, *args):
        self._trsm(np.float64, *args)


class _FakeCusolver:
    """cusolverDn<t>potrf / getrf / getrs (LAPACK's semantics: column-major, 1-based pivots) on host addresses."""

    def __getattr__(self, name):
        dtype = np.float64 if name[len("cusolverDn")] == "D" else np.float32
        return lambda *args: getattr(self, "_" + name[len("cusolverDn") + 1:])(dtype, *args)

    def _potrf_bufferSize(self, dtype, h, uplo, n, a, lda, lwork):
        lwork._obj.value = 3

    _getrf_bufferSize = _potrf_bufferSize

    def _potrf(self, dtype, h, uplo, n, a, lda, work, lwork, info):
        m = _colmajor(a, lda, n, n, dtype)
        if uplo == 0:
            f, idx = np.linalg.cholesky(np.tril(m) + np.tril(m, -1).T), np.tril_indices(n)
        else:
            f, idx = np.linalg.cholesky(np.triu(m) + np.triu(m, 1).T).T, np.triu_indices(n)
        m[idx] = f[idx]

    def _getrf(self, dtype, h, rows, n, a, lda, work, ipiv, info):
        m, piv = _colmajor(a, lda, n, n, dtype), _ints(ipiv, n)
        for j in range(n):
            p = j + int(np.argmax(np.abs(m[j:, j])))
            piv[j] = p + 1
            m[[j, p], :] = m[[p, j], :]
            if m[j, j] != 0:
                m[j + 1:, j] /= m[j, j]
                m[j + 1:, j + 1:] -= np.outer(m[j + 1:, j], m[j, j + 1:])

    def _getrs(self, dtype, h, trans, n, nrhs, a, lda, ipiv, b, ldb, info):
        assert trans == 0
        m, rhs, piv = _colmajor(a, lda, n, n, dtype), _colmajor(b, ldb, n, nrhs, dtype), _ints(ipiv, n)
        for j in range(n):
            rhs[[j, piv[j] - 1], :] = rhs[[piv[j] - 1, j], :]
        rhs[...] = np.linalg.solve(np.triu(m), np.linalg.solve(np.tril(m, -1) + np.eye(n), rhs))


@pytest.fixture
def faked_gpu(monkeypatch):
    """cpu NDArrays at their real host addresses, the library calls replaced by the fakes above, cuBLAS's
    (tested) strided-batched gemm by numpy: the GPU lowerings then run on the cpu."""
    from dnnbind._lib import cublas, cusolver
    from dnnbind.ops.defs import linalg as L
    from dnnbind.runtime.array import NDArray
    from_numpy = NDArray._from_numpy.__func__

    def addressed(cls, data):
        a = from_numpy(cls, data)
        a.ptr = data.ctypes.data if data.flags.c_contiguous and data.size else 0
        return a

    def gemm(a, b, ta=False, tb=False, alpha=1.0, beta=0.0, out=None):
        r = alpha * np.matmul(np.swapaxes(a._data, 1, 2) if ta else a._data,
                              np.swapaxes(b._data, 1, 2) if tb else b._data)
        if out is not None:
            out._data[...] = r + beta * out._data
            return out
        return NDArray._from_numpy(np.ascontiguousarray(r.astype(a.dtype)))

    monkeypatch.setattr(NDArray, "_from_numpy", classmethod(addressed))
    monkeypatch.setattr(cublas, "lib", _FakeCublas())
    monkeypatch.setattr(cusolver, "lib", _FakeCusolver())
    monkeypatch.setattr(L, "gemm_strided_batched", gemm)
    monkeypatch.setattr(L, "blas", lambda x: 1)
    monkeypatch.setattr(L, "solver_handle", lambda device: 1)
    monkeypatch.setattr(L, "workspace", lambda device, nbytes: (0, 0))
    monkeypatch.setattr(L, "_clone", lambda x: NDArray._from_numpy(x._data.copy()))
    return L


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_lowerings_on_a_faked_device_match_the_twin(faked_gpu, dtype):
    """Every GPU case's forward and gradients, through ops/defs/linalg.py's gpu lowerings with the faked libraries,
    against the nd (cpu twin) results: checks the row-major/column-major mapping (uplo, side, leading dimensions,
    pointer offsets per matrix, pivots) that the device runs."""
    from dnnbind.ops.opdef import Call, Grads
    tol = 1e-4 if dtype == "float32" else 1e-9
    for k, (op, params, inputs) in enumerate(GPU_CASES):
        entry = nd.REGISTRY["_linalg_" + op]
        want = [nd.array(v.astype(dtype), dtype=dtype) for v in inputs]
        for x in want:
            x.attach_grad()
        with autograd.record():
            y = getattr(nd.linalg, op)(*want, **params)
        y = y[1] if op == "slogdet" else y
        dy = np.random.default_rng(k).uniform(0.5, 1.5, y.shape).astype(dtype)
        y.backward(nd.array(dy, dtype=dtype))

        p = entry.schema.parse(params)
        xs = [nd.array(v.astype(dtype), dtype=dtype) for v in inputs]
        c = Call(entry.opdef.prepare(p, *xs), p, dnnbind.cpu(), True)
        out, saved = entry.opdef.gpu.forward(c, *xs)
        head = nd.array(dy, dtype=dtype)
        if op == "slogdet":
            out, head = out[1], (nd.zeros(dy.shape, dtype=dtype), head)
        grads = entry.opdef.gpu.backward(c, saved, Grads((True,) * len(xs), (None,) * len(xs), False), head)
        assert out.shape == y.shape and out.dtype == y.dtype, (op, out.shape, y.shape, out.dtype)
        scale = max(1.0, float(np.max(np.abs(y.numpy()))))
        assert_close(out, y, tol, tol * scale, name=f"case {k} {op} {params} forward")
        for i, (g, x) in enumerate(zip(grads, want)):
            assert g.shape == x.shape, (op, i, g.shape, x.shape)
            gscale = max(1.0, float(np.max(np.abs(x.grad.numpy()))))
            assert_close(g, x.grad, tol * 10, tol * 10 * gscale, name=f"case {k} {op} {params} gradient {i}")
