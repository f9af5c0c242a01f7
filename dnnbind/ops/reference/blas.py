"""Numpy twin of gemm, the linear (dense) layer and the in-place helpers axpy, scal, fill, copy.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError

import numpy as np

from .. import _check


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, trans_a: bool = False,
         trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """alpha * op(a) @ op(b) + beta * c, op = transpose when trans_*; returns a new array."""
    a, b = np.asarray(a), np.asarray(b)
    c = None if c is None else np.asarray(c)
    op = "gemm"
    dtype = _check.check_dtype(op, _check.FLOAT32_64, a=a, b=b, c=c)
    alpha = _check.scalar(op, "alpha", alpha)
    beta = _check.scalar(op, "beta", beta)
    _check.gemm_params(op, a.shape, b.shape, None if c is None else c.shape, trans_a, trans_b, beta)
    out = (a.T if trans_a else a) @ (b.T if trans_b else b)
    if alpha != 1.0:
        out *= dtype.type(alpha)
    # NOTE: like cuBLAS, beta == 0 means c is not read at all (it may hold NaN or garbage).
    if c is not None and beta != 0.0:
        out += dtype.type(beta) * c
    return out


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """y = x @ w.T + b, x (N, in), w (units, in), b (units,)."""
    x, w = np.asarray(x), np.asarray(w)
    b = None if b is None else np.asarray(b)
    op = "linear_forward"
    dtype = _check.check_dtype(op, _check.FLOAT_DTYPES, x=x, w=w, b=b)
    _check.linear_params(op, x.shape, w.shape, None if b is None else b.shape)
    acc = _accumulator(dtype)
    y = x.astype(acc) @ w.T.astype(acc)
    if b is not None:
        y += b
    return y.astype(dtype, copy=False)


def _accumulator(dtype) -> np.dtype:
    """float16 products accumulate in float32 (as cublasGemmEx with CUBLAS_COMPUTE_32F); others in their own."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def linear_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray, bias: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dx, dw, db) = (dy @ w, dy.T @ x, dy summed over rows, or None when bias is False)."""
    x, w, dy = np.asarray(x), np.asarray(w), np.asarray(dy)
    op = "linear_backward"
    dtype = _check.check_dtype(op, _check.FLOAT_DTYPES, x=x, w=w, dy=dy)
    _check.linear_grad_params(op, x.shape, w.shape, dy.shape)
    acc = _accumulator(dtype)
    x, w, dy = x.astype(acc, copy=False), w.astype(acc, copy=False), dy.astype(acc, copy=False)
    return tuple(None if r is None else r.astype(dtype, copy=False)
                 for r in (dy @ w, dy.T @ x, (dy.sum(axis=0) if bias else None)))


def _target(op: str, name: str, a) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise DnnbindTypeError(f"{op}: {name} is updated in place and must be a numpy array, got {type(a).__name__}")
    return a


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y += alpha * x in place; returns y."""
    op = "axpy"
    x, y = np.asarray(x), _target(op, "y", y)
    alpha = _check.scalar(op, "alpha", alpha)
    dtype = _check.check_dtype(op, _check.FLOAT32_64, x=x, y=y)
    _check.check_same_shape(op, x=x, y=y)
    y += dtype.type(alpha) * x
    return y


def scal(alpha: float, x: np.ndarray) -> np.ndarray:
    """x *= alpha in place; returns x."""
    op = "scal"
    x = _target(op, "x", x)
    alpha = _check.scalar(op, "alpha", alpha)
    dtype = _check.check_dtype(op, _check.FLOAT32_64, x=x)
    x *= dtype.type(alpha)
    return x


def fill(x: np.ndarray, value: float) -> np.ndarray:
    """x[...] = value in place; returns x."""
    op = "fill"
    x = _target(op, "x", x)
    value = _check.scalar(op, "value", value)
    _check.check_dtype(op, _check.FLOAT32_64, x=x)
    x[...] = value
    return x


def copy(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst[...] = src in place (same shape and dtype); returns dst."""
    op = "copy"
    src, dst = np.asarray(src), _target(op, "dst", dst)
    _check.check_dtype(op, _check.FLOAT32_64, src=src, dst=dst)
    _check.check_same_shape(op, src=src, dst=dst)
    dst[...] = src
    return dst
