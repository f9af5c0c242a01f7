"""Numpy twin of 2-D pooling (max, avg counting padding, avg excluding padding).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Both directions loop over the window's kh*kw taps, each touching one strided slice of the padded input
for every output position at once. Within one tap the output positions read distinct input elements, so
`+=` on the slice accumulates overlapping windows correctly without np.add.at. ``layout="NHWC"`` (x (N, H, W, C))
is checked in its own shapes and computed on the NCHW transpose.
"""

from __future__ import annotations

import numpy as np

from .. import _check
from .conv import _nchw, _nhwc


def _taps(window, stride, p: int, q: int):
    """(rows, cols) slices of the padded input that each window tap reads, taps in row-major order."""
    for i in range(window[0]):
        for j in range(window[1]):
            yield (slice(i, i + stride[0] * (p - 1) + 1, stride[0]),
                   slice(j, j + stride[1] * (q - 1) + 1, stride[1]))


def _pad(x: np.ndarray, padding, value: float) -> np.ndarray:
    if padding == (0, 0):
        return x
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * padding[0], w + 2 * padding[1]), value, dtype=x.dtype)
    xp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w] = x
    return xp


def _crop(xp: np.ndarray, padding, x_shape) -> np.ndarray:
    h, w = x_shape[2:]
    return np.ascontiguousarray(xp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w])


def _divisor(mode: str, x_shape, window, stride, padding, p: int, q: int, dtype) -> np.ndarray | float:
    """What each window's sum is divided by: its area (avg) or its count of real elements (avg_exclude_pad)."""
    if mode == "avg" or padding == (0, 0):
        return float(window[0] * window[1])
    real = _pad(np.ones((1, 1) + tuple(x_shape[2:]), dtype=dtype), padding, 0.0)[0, 0]
    count = np.zeros((p, q), dtype=dtype)
    for si, sj in _taps(window, stride, p, q):
        count += real[si, sj]
    return count


def _max(xp: np.ndarray, window, stride, p: int, q: int) -> np.ndarray:
    # NOTE: a running np.maximum over the taps is ~40x faster than x.reshape(..., kh, ..., kw).max(axis),
    # which numpy reduces element by element over the strided axes.
    y = None
    for si, sj in _taps(window, stride, p, q):
        y = xp[:, :, si, sj].copy() if y is None else np.maximum(y, xp[:, :, si, sj], out=y)
    return y


@_check.float16_via_float32
def pooling_forward(x: np.ndarray, mode: str = "max", window=2, stride=None, padding=0,
                    layout: str = "NCHW") -> np.ndarray:
    """y (N, C, P, Q) with P = floor((H + 2*pad - window) / stride) + 1, like cuDNN ((N, P, Q, C) for NHWC)."""
    x = np.asarray(x)
    op = "pooling_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x)
    mode = _check.pooling_mode(op, mode)
    window, stride, padding, y_shape = _check.pool_params(op, x.shape, mode, window, stride, padding, layout)
    if layout == "NHWC":
        return _nhwc(pooling_forward(_nchw(x), mode, window, stride, padding))
    p, q = y_shape[2:]
    if mode == "max":
        return _max(_pad(x, padding, -np.inf), window, stride, p, q)
    xp = _pad(x, padding, 0.0)
    total = np.zeros(x.shape[:2] + (p, q), dtype=x.dtype)
    for si, sj in _taps(window, stride, p, q):
        total += xp[:, :, si, sj]
    return (total / _divisor(mode, x.shape, window, stride, padding, p, q, x.dtype)).astype(x.dtype, copy=False)


@_check.float16_via_float32
def pooling_backward(y: np.ndarray, dy: np.ndarray, x: np.ndarray, mode: str = "max", window=2, stride=None,
                     padding=0, layout: str = "NCHW") -> np.ndarray:
    """dx: max routes each window's dy to the window's first maximal x; avg spreads dy / divisor evenly."""
    y, dy, x = np.asarray(y), np.asarray(dy), np.asarray(x)
    op = "pooling_backward"
    _check.check_dtype(op, _check.FLOAT32_64, y=y, dy=dy, x=x)
    mode = _check.pooling_mode(op, mode)
    window, stride, padding, y_shape = _check.pool_grad_params(
        op, x.shape, y.shape, dy.shape, mode, window, stride, padding, layout)
    if layout == "NHWC":
        return _nhwc(pooling_backward(_nchw(y), _nchw(dy), _nchw(x), mode, window, stride, padding))
    p, q = y_shape[2:]
    if mode == "max":
        xp = _pad(x, padding, -np.inf)
        # NOTE: the maximum is recomputed from x rather than read from y, so a y that was rounded or
        # computed elsewhere cannot silently drop gradient; `taken` keeps ties from counting twice. A window
        # holding a NaN has a NaN maximum, which equals no x: it passes no gradient. dy is routed, not multiplied
        # by the mask, so a non-finite dy reaches its tap only (as the GPU kernel of ops.pooling does).
        ymax = _max(xp, window, stride, p, q)
        dxp = np.zeros_like(xp)
        taken = np.zeros(ymax.shape, dtype=bool)
        for si, sj in _taps(window, stride, p, q):
            hit = xp[:, :, si, sj] == ymax
            hit &= ~taken
            taken |= hit
            dxp[:, :, si, sj] += np.where(hit, dy, 0)
        return _crop(dxp, padding, x.shape)
    g = (dy / _divisor(mode, x.shape, window, stride, padding, p, q, x.dtype)).astype(x.dtype, copy=False)
    dxp = np.zeros((x.shape[0], x.shape[1], x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]),
                   dtype=x.dtype)
    for si, sj in _taps(window, stride, p, q):
        dxp[:, :, si, sj] += g
    return _crop(dxp, padding, x.shape)
