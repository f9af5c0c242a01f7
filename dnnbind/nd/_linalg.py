"""Layer nd: ``dot`` and ``batch_dot`` on cuBLAS (Sgemm/Dgemm, gemmStridedBatched). Imports ops, nd._registry.

MXNet 1.x's ``dot`` of N-d arrays: the lhs is read as a matrix (prod(shape[:-1]), shape[-1]) — or
(shape[0], prod(shape[1:])) with ``transpose_a`` — the rhs as (shape[0], prod(shape[1:])) — or
(prod(shape[:-1]), shape[-1]) with ``transpose_b`` — and the result has the lhs's free dims then the rhs's;
two vectors give a shape-(1,) inner product. Gradients are dots too, so they run on cuBLAS.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math

import numpy as np

from ..runtime.array import NDArray, empty, zeros
from ._registry import call, func

_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


def _mat(shape, trans: bool) -> tuple:
    if len(shape) == 1:
        return (shape[0], 1) if trans else (1, shape[0])
    return (shape[0], math.prod(shape[1:])) if trans else (math.prod(shape[:-1]), shape[-1])


def _rmat(shape, trans: bool) -> tuple:
    if len(shape) == 1:
        return (1, shape[0]) if trans else (shape[0], 1)
    return (math.prod(shape[:-1]), shape[-1]) if trans else (shape[0], math.prod(shape[1:]))


def _dense_only(op: str, forward_stype) -> None:
    """MXNet's ``forward_stype`` picks a sparse output storage; dnnbind's arrays are dense only."""
    if forward_stype not in (None, "default"):
        raise DnnbindValueError(f"{op}: forward_stype {forward_stype!r} (sparse storage) is not supported by dnnbind; "
                                f"leave it None or 'default'")


def _dot_check(a, b, transpose_a=False, transpose_b=False, forward_stype=None):
    _dense_only("dot", forward_stype)
    if a.ndim == 0 or b.ndim == 0:
        raise DnnbindValueError(f"dot: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise DnnbindTypeError(f"dot: dtypes differ ({a.dtype} and {b.dtype})")
    if a.dtype not in _BLAS:
        raise DnnbindTypeError(f"dot: float32 or float64 arrays only (cuBLAS), got {a.dtype}")
    ta, tb = bool(transpose_a), bool(transpose_b)
    am, bm = _mat(a.shape, ta), _rmat(b.shape, tb)
    m, k = (am[1], am[0]) if ta else am
    k2, n = (bm[1], bm[0]) if tb else bm
    if k != k2:
        raise DnnbindValueError(f"dot: shapes {a.shape} and {b.shape} do not align (transpose_a={ta}, transpose_b={tb}: "
                         f"inner dims {k} and {k2})")
    free_a = () if a.ndim == 1 else (a.shape[1:] if ta else a.shape[:-1])
    free_b = () if b.ndim == 1 else (b.shape[:-1] if tb else b.shape[1:])
    return am, bm, m, n, k, (free_a + free_b) or (1,)


def _dot_cpu(meta, a, b, transpose_a=False, transpose_b=False, **_):
    am, bm, m, n, k, shape = meta
    x = a._data.reshape(am)
    y = b._data.reshape(bm)
    r = (x.T if transpose_a else x) @ (y.T if transpose_b else y)
    return NDArray._from_numpy(np.asarray(r.reshape(shape).astype(a.dtype, copy=False), order="C"))


def _dot_gpu(meta, a, b, transpose_a=False, transpose_b=False, **_):
    from ..ops._common import blas
    from ..ops.blas import gemm_into
    am, bm, m, n, k, shape = meta
    if k == 0:
        return zeros(shape, a.dtype, a.device)
    out = empty(shape, a.dtype, a.device)
    if out.size:
        gemm_into(blas(a), a.ptr, b.ptr, out.ptr, m, n, k, bool(transpose_a), bool(transpose_b), 1.0, 0.0,
                  a.dtype)
    return out


def _dot_grad(g, y, a, b, transpose_a=False, transpose_b=False, **_):
    am, bm, m, n, k, _shape = _dot_check(a, b, transpose_a, transpose_b)
    g2 = g.reshape((m, n))
    a2, b2 = a.reshape(am), b.reshape(bm)
    ta, tb = bool(transpose_a), bool(transpose_b)
    da = call("dot", b2, g2, transpose_a=tb, transpose_b=True) if ta else \
        call("dot", g2, b2, transpose_b=not tb)
    db = call("dot", g2, a2, transpose_a=True, transpose_b=ta) if tb else \
        call("dot", a2, g2, transpose_a=not ta)
    return da.reshape(a.shape), db.reshape(b.shape)


func("dot", _dot_check, _dot_cpu, _dot_gpu, _dot_grad, methods=("dot",), arity=2,
     params=("transpose_a", "transpose_b", "forward_stype"))


def _bdot_check(a, b, transpose_a=False, transpose_b=False, forward_stype=None):
    _dense_only("batch_dot", forward_stype)
    if a.ndim != 3 or b.ndim != 3:
        raise DnnbindValueError(f"batch_dot: operands must be 3-D (batch, rows, cols), got {a.shape} and {b.shape}")
    if a.dtype != b.dtype or a.dtype not in _BLAS:
        raise DnnbindTypeError(f"batch_dot: float32 or float64 operands of one dtype, got {a.dtype} and {b.dtype}")
    m, k = (a.shape[2], a.shape[1]) if transpose_a else a.shape[1:]
    k2, n = (b.shape[2], b.shape[1]) if transpose_b else b.shape[1:]
    if a.shape[0] != b.shape[0] or k != k2:
        raise DnnbindValueError(f"batch_dot: shapes {a.shape} and {b.shape} do not align (transpose_a={transpose_a}, "
                         f"transpose_b={transpose_b})")
    return (a.shape[0], m, n), k


def _bdot_cpu(meta, a, b, transpose_a=False, transpose_b=False, **_):
    x = np.swapaxes(a._data, 1, 2) if transpose_a else a._data
    y = np.swapaxes(b._data, 1, 2) if transpose_b else b._data
    return NDArray._from_numpy(np.asarray(np.matmul(x, y).astype(a.dtype, copy=False), order="C"))


def _bdot_gpu(meta, a, b, transpose_a=False, transpose_b=False, **_):
    shape, k = meta
    if k == 0 or 0 in shape:
        return zeros(shape, a.dtype, a.device)
    from ..ops import blas_tensor
    return blas_tensor.gemm_strided_batched(a, b, bool(transpose_a), bool(transpose_b))


def _bdot_grad(g, y, a, b, transpose_a=False, transpose_b=False, **_):
    ta, tb = bool(transpose_a), bool(transpose_b)
    da = call("batch_dot", b, g, transpose_a=tb, transpose_b=True) if ta else \
        call("batch_dot", g, b, transpose_b=not tb)
    db = call("batch_dot", g, a, transpose_a=True, transpose_b=ta) if tb else \
        call("batch_dot", a, g, transpose_a=not ta)
    return da, db


func("batch_dot", _bdot_check, _bdot_cpu, _bdot_gpu, _bdot_grad, arity=2,
     params=("transpose_a", "transpose_b", "forward_stype"))
