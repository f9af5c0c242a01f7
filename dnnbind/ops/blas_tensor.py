"""Layer 2 (ops): the cuBLAS "tensor" calls the nd op table lowers to: geam (2-d transpose/add), strided-batched
gemm (batch_dot), a 2-d matmul with ``out=``, dot and nrm2 with results left in device memory. Row-major on top
of column-major cuBLAS (see ops/blas.py). Imports _lib, runtime and ops (tensor_ops' checks and tables).

Split from ops/tensor_ops.py (the cuDNN half), which re-exports these names.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import ctypes

from .._lib import cublas
from .._lib.errors import CublasError
from ..runtime.array import NDArray, empty
from . import _check
from . import descriptors as D
from ._common import blas, with_context
from .blas import gemm_into
from .tensor_ops import (BLAS_FLOATS, CUBLAS_GEAM, F32, F64, INT_MAX, C, check_gpu_arrays, out_or_empty, real_scalar,
                         scale_tensor)

_BATCHED = {F32: "cublasSgemmStridedBatched", F64: "cublasDgemmStridedBatched"}
_DOT = {F32: "cublasSdot_v2", F64: "cublasDdot_v2"}
_NRM2 = {F32: "cublasSnrm2_v2", F64: "cublasDnrm2_v2"}


def _ints(op: str, **dims) -> None:
    big = {k: v for k, v in dims.items() if v > INT_MAX}
    if big:
        raise DnnbindValueError(f"{op}: {big} exceed cuBLAS's int range (2**31 - 1)")


def _matrix(op: str, name: str, a: NDArray, ndim: int, trans: bool) -> tuple:
    if a.ndim != ndim:
        raise DnnbindValueError(f"{op}: {name} must have {ndim} dims, got shape {a.shape}")
    return a.shape[:-2] + a.shape[:-3:-1] if trans else a.shape


def geam(a: NDArray, b: NDArray | None = None, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, out: NDArray | None = None) -> NDArray:
    """out = alpha op(a) + beta op(b) for 2-d row-major arrays (cublasSgeam/Dgeam); b None (beta 0) makes
    ``geam(a, trans_a=True)`` a transpose in one call. out may be a (or b) only where its op is no transpose."""
    dtype = check_gpu_arrays("geam", BLAS_FLOATS, a=a, b=b, out=out)
    trans_a, trans_b = _check.check_flag("geam", "trans_a", trans_a), _check.check_flag("geam", "trans_b", trans_b)
    alpha, beta = real_scalar("geam", "alpha", alpha), real_scalar("geam", "beta", beta)
    m, n = _matrix("geam", "a", a, 2, trans_a)
    if b is None:
        if beta != 0:
            raise DnnbindValueError(f"geam: beta={beta} needs b; pass b or beta=0")
        b, trans_b = a, trans_a  # NOTE: cuBLAS needs a valid B; with beta 0 it contributes nothing
    elif _matrix("geam", "b", b, 2, trans_b) != (m, n):
        raise DnnbindValueError(f"geam: op(a) is {(m, n)} but op(b) is {_matrix('geam', 'b', b, 2, trans_b)} "
                         f"(a {a.shape}, b {b.shape}, trans_a={trans_a}, trans_b={trans_b})")
    if out is None:
        out = empty((m, n), dtype, a.device)
    elif out.shape != (m, n):
        raise DnnbindValueError(f"geam: out has shape {out.shape}; expected {(m, n)}")
    if (out.ptr == a.ptr and trans_a) or (out.ptr == b.ptr and trans_b):
        raise DnnbindValueError("geam: out may share memory with a or b only where that operand is not transposed")
    if out.size == 0:
        return out
    lda, ldb = (m if trans_a else n), (m if trans_b else n)
    try:
        getattr(C, CUBLAS_GEAM[dtype])(blas(a), int(trans_a), int(trans_b), n, m, D.scalar_ptr(alpha, dtype),
                                       a.ptr, lda, D.scalar_ptr(beta, dtype), b.ptr, ldb, out.ptr, n)
    except CublasError as exc:
        raise with_context(exc, op="geam", a=a.shape, b=b.shape, trans_a=trans_a, trans_b=trans_b) from None
    return out


def gemm_strided_batched(a: NDArray, b: NDArray, trans_a: bool = False, trans_b: bool = False,
                         alpha: float = 1.0, beta: float = 0.0, out: NDArray | None = None) -> NDArray:
    """batch_dot: out[i] = alpha op(a[i]) @ op(b[i]) + beta out[i], a (B, M, K) or (B, K, M) if trans_a,
    b (B, K, N) or (B, N, K) if trans_b, out (B, M, N), row-major (cublasSgemmStridedBatched/Dgemm...)."""
    dtype = check_gpu_arrays("gemm_strided_batched", BLAS_FLOATS, a=a, b=b, out=out)
    op = "gemm_strided_batched"
    trans_a, trans_b = _check.check_flag(op, "trans_a", trans_a), _check.check_flag(op, "trans_b", trans_b)
    alpha, beta = real_scalar(op, "alpha", alpha), real_scalar(op, "beta", beta)
    batch, m, k = _matrix(op, "a", a, 3, trans_a)
    batch_b, kb, n = _matrix(op, "b", b, 3, trans_b)
    if batch_b != batch or kb != k:
        raise DnnbindValueError(f"{op}: op(a) is {(batch, m, k)} but op(b) is {(batch_b, kb, n)} (a {a.shape}, "
                         f"b {b.shape}, trans_a={trans_a}, trans_b={trans_b}); batch and inner dims must agree")
    out = out_or_empty(op, out, (batch, m, n), dtype, a.device, beta)
    _ints(op, m=m, n=n, k=k, batch=batch)
    if out.size == 0:
        return out
    if k == 0:  # nothing to multiply: out = beta out
        return scale_tensor(out, beta) if beta != 0 else out.zero_()
    lda, ldb = (m if trans_a else k), (k if trans_b else n)
    try:  # column-major C^T = op(B)^T op(A)^T: operands swap places, each keeps its flag
        getattr(C, _BATCHED[dtype])(blas(a), int(trans_b), int(trans_a), n, m, k, D.scalar_ptr(alpha, dtype),
                                    b.ptr, ldb, k * n, a.ptr, lda, m * k, D.scalar_ptr(beta, dtype), out.ptr,
                                    n, m * n, batch)
    except CublasError as exc:
        raise with_context(exc, op=op, a=a.shape, b=b.shape, trans_a=trans_a, trans_b=trans_b) from None
    return out


def matmul2d(a: NDArray, b: NDArray, trans_a: bool = False, trans_b: bool = False, out: NDArray | None = None,
             alpha: float = 1.0, beta: float = 0.0) -> NDArray:
    """out = alpha op(a) @ op(b) + beta out for 2-d row-major arrays: (M, K) x (K, N) -> (M, N) (Sgemm/Dgemm).
    nd.dot of any ranks reshapes to this: (..., K) x (K, ...) is (prod(...), K) x (K, prod(...))."""
    dtype = check_gpu_arrays("matmul2d", BLAS_FLOATS, a=a, b=b, out=out)
    m, n, k = _check.gemm_params("matmul2d", a.shape, b.shape, None, trans_a, trans_b)
    alpha, beta = real_scalar("matmul2d", "alpha", alpha), real_scalar("matmul2d", "beta", beta)
    out = out_or_empty("matmul2d", out, (m, n), dtype, a.device, beta)
    _ints("matmul2d", m=m, n=n, k=k)
    if out.size == 0:
        return out
    try:
        gemm_into(blas(a), a.ptr, b.ptr, out.ptr, m, n, k, bool(trans_a), bool(trans_b), alpha, beta, dtype)
    except CublasError as exc:
        raise with_context(exc, op="matmul2d", a=a.shape, b=b.shape, trans_a=trans_a, trans_b=trans_b) from None
    return out


def _device_result(op: str, x: NDArray, fn_name: str, args: tuple, out: NDArray | None) -> NDArray:
    """Run a cuBLAS reduction whose result goes to device memory (no host synchronization)."""
    if out is None:
        out = empty((1,), x.dtype, x.device)
    elif out.size != 1:
        raise DnnbindValueError(f"{op}: out must have one element, got shape {out.shape}")
    if x.size == 0:
        return out.zero_()
    h = blas(x)
    mode = ctypes.c_int()
    # NOTE: the handle is shared with calls passing host alpha/beta: switch it to device mode for this call
    # only, and restore it even if the call fails. A recorded step replays the two Set calls in order.
    C.cublasGetPointerMode_v2(h, ctypes.byref(mode))
    C.cublasSetPointerMode_v2(h, cublas.CUBLAS_POINTER_MODE_DEVICE)
    try:
        getattr(C, fn_name)(h, *args, out.ptr)
    except CublasError as exc:
        raise with_context(exc, op=op, x=x.shape) from None
    finally:
        C.cublasSetPointerMode_v2(h, mode.value)
    return out


def dot(x: NDArray, y: NDArray, out: NDArray | None = None) -> NDArray:
    """sum(x * y) over all elements into a 1-element device array (cublasSdot_v2/Ddot_v2, device result)."""
    dtype = check_gpu_arrays("dot", BLAS_FLOATS, x=x, y=y, out=out)
    if x.size != y.size:
        raise DnnbindValueError(f"dot: x {x.shape} and y {y.shape} have different sizes")
    _ints("dot", n=x.size)
    return _device_result("dot", x, _DOT[dtype], (x.size, x.ptr, 1, y.ptr, 1), out)


def nrm2(x: NDArray, out: NDArray | None = None) -> NDArray:
    """sqrt(sum(x**2)) over all elements into a 1-element device array (cublasSnrm2_v2/Dnrm2_v2)."""
    dtype = check_gpu_arrays("nrm2", BLAS_FLOATS, x=x, out=out)
    _ints("nrm2", n=x.size)
    return _device_result("nrm2", x, _NRM2[dtype], (x.size, x.ptr, 1), out)
