"""Layer 2 (ops): matrix products and vector updates through cuBLAS. Imports _lib, runtime and ops.

NOTE: cuBLAS is column-major. A row-major (M, N) matrix is the column-major (N, M) matrix of the same bytes,
so row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: the operands swap places
and keep their own transpose flags (FACTS.md: Y = X W^T is Sgemm(OP_T, OP_N, N, M, K, W, K, X, K, Y, N)).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from .._lib import cublas
from ..runtime.array import NDArray, empty
from ..runtime.memory import D2D, memcpy
from ..runtime.stream import current_stream
from . import _check, _kernels, reference
from . import descriptors as D
from ._common import blas, float_dtype, out_like
from ._dispatch import op

C = cublas.lib
_GEMM = {np.dtype(np.float32): "cublasSgemm_v2", np.dtype(np.float64): "cublasDgemm_v2"}
_GEMV = {np.dtype(np.float32): "cublasSgemv_v2", np.dtype(np.float64): "cublasDgemv_v2"}
_AXPY = {np.dtype(np.float32): "cublasSaxpy_v2", np.dtype(np.float64): "cublasDaxpy_v2"}
_SCAL = {np.dtype(np.float32): "cublasSscal_v2", np.dtype(np.float64): "cublasDscal_v2"}


def gemm_into(h, a_ptr, b_ptr, c_ptr, m, n, k, trans_a, trans_b, alpha, beta, dtype) -> None:
    """Row-major C[m, n] = alpha op(A) op(B) + beta C on raw pointers (the swap explained above). float16:
    ``cublasGemmEx`` with half A, B, C and float accumulation (alpha, beta are then float)."""
    lda = m if trans_a else k
    ldb = k if trans_b else n
    if dtype == np.float16:
        f32, half = np.float32, cublas.CUDA_R_16F
        C.cublasGemmEx(h, int(trans_b), int(trans_a), n, m, k, D.scalar_ptr(alpha, f32), b_ptr, half, ldb, a_ptr,
                       half, lda, D.scalar_ptr(beta, f32), c_ptr, half, n, cublas.CUBLAS_COMPUTE_32F,
                       cublas.CUBLAS_GEMM_DEFAULT)
        return
    getattr(C, _GEMM[dtype])(h, int(trans_b), int(trans_a), n, m, k, D.scalar_ptr(alpha, dtype), b_ptr, ldb,
                             a_ptr, lda, D.scalar_ptr(beta, dtype), c_ptr, n)


def sum_rows_into(h, a_ptr, ones_ptr, out_ptr, rows, cols, alpha, beta, dtype) -> None:
    """out[cols] = alpha * sum over rows of A[rows, cols] + beta * out: one gemv against a ones vector."""
    if dtype == np.float16:  # no half gemv in cuBLAS: the (1, rows) x (rows, cols) product, float accumulation
        gemm_into(h, ones_ptr, a_ptr, out_ptr, 1, cols, rows, False, False, alpha, beta, dtype)
        return
    # Column-major view: A^T is (cols x rows) with ld = cols; out = A^T . ones.
    getattr(C, _GEMV[dtype])(h, cublas.CUBLAS_OP_N, cols, rows, D.scalar_ptr(alpha, dtype), a_ptr, cols,
                             ones_ptr, 1, D.scalar_ptr(beta, dtype), out_ptr, 1)


def row_sums_into(h, a_ptr, ones_ptr, out_ptr, rows, cols, alpha, beta, dtype) -> None:
    """out[rows] = alpha * sum over columns of A[rows, cols] + beta * out (gemv, transposed view)."""
    if dtype == np.float16:
        gemm_into(h, a_ptr, ones_ptr, out_ptr, rows, 1, cols, False, False, alpha, beta, dtype)
        return
    getattr(C, _GEMV[dtype])(h, cublas.CUBLAS_OP_T, cols, rows, D.scalar_ptr(alpha, dtype), a_ptr, cols,
                             ones_ptr, 1, D.scalar_ptr(beta, dtype), out_ptr, 1)


_ones: dict = {}


def ones_vector(device, n: int, dtype) -> NDArray:
    """A cached device vector of ones, at least n long (for gemv-based reductions)."""
    key = (device, np.dtype(dtype))
    v = _ones.get(key)
    if v is None or v.size < n:
        v = _ones[key] = empty((max(n, 1024),), dtype, device)
        v.copy_(np.ones(v.shape, dtype))
    return v


@op(reference.gemm, "a", "b", "c")
def gemm(a, b, c=None, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """alpha op(a) @ op(b) + beta c: ``cublasSgemm_v2`` (``cublasDgemm_v2`` for float64)."""
    dtype = float_dtype("gemm", _check.FLOAT32_64, a=a, b=b, c=c)
    m, n, k = _check.gemm_params("gemm", a.shape, b.shape, None if c is None else c.shape, trans_a, trans_b,
                               beta=beta)
    out = c.copy() if (c is not None and beta != 0) else out_like((m, n), dtype, a.device)
    gemm_into(blas(a), a.ptr, b.ptr, out.ptr, m, n, k, trans_a, trans_b, alpha,
              beta if c is not None else 0.0, dtype)
    return out


@op(reference.linear_forward, "x", "w", "b")
def linear_forward(x, w, b=None):
    """y = x w^T + b (Dense): the bias written as y's rows (a one-line kernel), then one Sgemm adding x w^T."""
    dtype = float_dtype("linear_forward", _check.FLOAT_DTYPES, x=x, w=w, b=b)
    n, units = _check.linear_params("linear_forward", x.shape, w.shape, None if b is None else b.shape)
    k = x.shape[1]
    y = out_like((n, units), dtype, x.device)
    h = blas(x)
    beta = 0.0
    if b is not None and n * units:
        _kernels.kernel(f"bias_rows_{np.dtype(dtype).itemsize}").launch(
            _kernels.grid_for(n * units), 256, (y, b, np.int64(n * units), np.int32(units)),
            stream=current_stream(x.device))
        beta = 1.0
    gemm_into(h, x.ptr, w.ptr, y.ptr, n, units, k, False, True, 1.0, beta, dtype)
    return y


@op(reference.linear_backward, "x", "w", "dy")
def linear_backward(x, w, dy, bias=True):
    """(dx, dw, db): dx = dy w, dw = dy^T x (two Sgemm), db = column sums of dy (Sgemv with ones)."""
    dtype = float_dtype("linear_backward", _check.FLOAT_DTYPES, x=x, w=w, dy=dy)
    _check.linear_grad_params("linear_backward", x.shape, w.shape, dy.shape)
    n, k = x.shape
    units = w.shape[0]
    h = blas(x)
    dx = out_like((n, k), dtype, x.device)
    dw = out_like((units, k), dtype, x.device)
    gemm_into(h, dy.ptr, w.ptr, dx.ptr, n, k, units, False, False, 1.0, 0.0, dtype)
    gemm_into(h, dy.ptr, x.ptr, dw.ptr, units, k, n, True, False, 1.0, 0.0, dtype)
    db = None
    if bias:
        db = out_like((units,), dtype, x.device)
        sum_rows_into(h, dy.ptr, ones_vector(x.device, n, dtype).ptr, db.ptr, n, units, 1.0, 0.0, dtype)
    return dx, dw, db


# -- in-place vector updates (the Trainer's flat buffers) ---------------------------------------------------

def _inplace_check(opname, **arrays):
    items = [(k, v) for k, v in arrays.items() if v is not None]
    for name, a in items:
        if not isinstance(a, NDArray):
            raise DnnbindTypeError(f"{opname}: {name} must be a dnnbind NDArray (updated in place), got {type(a).__name__}")
    devices = {a.device for _, a in items}
    if len(devices) > 1:
        raise DnnbindValueError(f"{opname}: all arrays must be on one device, got "
                         + ", ".join(f"{k} on {a.device}" for k, a in items))
    return items[0][1]


def axpy(alpha, x, y):
    """y += alpha x in place: ``cublasSaxpy_v2``."""
    _inplace_check("axpy", x=x, y=y)
    _check.check_same_shape("axpy", x=x, y=y)
    dtype = float_dtype("axpy", _check.FLOAT32_64, x=x, y=y)
    if not y.on_gpu:
        reference.axpy(alpha, x._data, y._data)
    elif y.size:
        getattr(C, _AXPY[dtype])(blas(y), y.size, D.scalar_ptr(alpha, dtype), x.ptr, 1, y.ptr, 1)
    return y


def scal(alpha, x):
    """x *= alpha in place: ``cublasSscal_v2``."""
    _inplace_check("scal", x=x)
    dtype = float_dtype("scal", _check.FLOAT32_64, x=x)
    if not x.on_gpu:
        reference.scal(alpha, x._data)
    elif x.size:
        getattr(C, _SCAL[dtype])(blas(x), x.size, D.scalar_ptr(alpha, dtype), x.ptr, 1)
    return x


def fill(x, value):
    """x[...] = value in place: ``cudaMemsetAsync`` for 0, a one-line kernel otherwise."""
    _inplace_check("fill", x=x)
    if not x.on_gpu:
        reference.fill(x._data, value)
    elif value == 0 or x.size == 0:
        x.zero_()
    else:
        dtype = float_dtype("fill", _check.FLOAT32_64, x=x)
        name = "fill_f64" if dtype == np.float64 else "fill_f32"
        val = np.float64(value) if dtype == np.float64 else np.float32(value)
        _kernels.kernel(name).launch(_kernels.grid_for(x.size), 256, (x, val, np.int64(x.size)),
                                     stream=current_stream(x.device))
    return x


def copy(src, dst):
    """dst[...] = src in place: ``cudaMemcpyAsync`` (src may be numpy)."""
    _inplace_check("copy", dst=dst)
    if isinstance(src, NDArray) and src.device is dst.device and dst.on_gpu:
        _check.check_same_shape("copy", src=src, dst=dst)
        memcpy(dst.ptr, src.ptr, dst.nbytes, D2D, current_stream(dst.device))
        return dst
    return dst.copy_(src)
