"""Numpy twin of pooling (max, avg counting padding, avg excluding padding): 2-D (N, C, H, W) and 3-D (N, C, D, H, W).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Both directions loop over the window's taps (kh*kw, or kd*kh*kw), each touching one strided slice of the padded
input for every output position at once. Within one tap the output positions read distinct input elements, so
`+=` on the slice accumulates overlapping windows correctly without np.add.at. Channels-last data (``layout``
"NHWC": x (N, H, W, C); 5-D x (N, D, H, W, C)) is checked in its own shapes and computed on the channels-first
transpose. 2-D calls are checked by ops._check, 5-D ones by pool3d_params here.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindValueError
from .. import _check
from .conv import as_nchw, as_nhwc

CHANNELS_FIRST_3D = ("NCHW", "NCDHW")  # the ops' layout names for 5-D data: channels first ...
CHANNELS_LAST_3D = ("NHWC", "NDHWC")  # ... or last (MXNet 1.9.1 pools NDHWC data on its CPU)


def _taps(window, stride, out):
    """Per window tap (row-major order), the slices of the padded input it reads for all output positions."""
    for tap in np.ndindex(*window):
        yield tuple(slice(t, t + s * (o - 1) + 1, s) for t, s, o in zip(tap, stride, out))


def _inner(padding, size) -> tuple:
    return tuple(slice(q, q + s) for q, s in zip(padding, size))


def _pad(x: np.ndarray, padding, value: float) -> np.ndarray:
    if not any(padding):
        return x
    size = x.shape[2:]
    xp = np.full(x.shape[:2] + tuple(s + 2 * q for s, q in zip(size, padding)), value, dtype=x.dtype)
    xp[(slice(None), slice(None)) + _inner(padding, size)] = x
    return xp


def _crop(xp: np.ndarray, padding, x_shape) -> np.ndarray:
    return np.ascontiguousarray(xp[(slice(None), slice(None)) + _inner(padding, x_shape[2:])])


def _every(taps: tuple) -> tuple:
    return (slice(None), slice(None)) + taps


def _divisor(mode: str, x_shape, window, stride, padding, out, dtype) -> np.ndarray | float:
    """What each window's sum is divided by: its area (avg) or its count of real elements (avg_exclude_pad)."""
    if mode == "avg" or not any(padding):
        return float(np.prod(window))
    real = _pad(np.ones((1, 1) + tuple(x_shape[2:]), dtype=dtype), padding, 0.0)[0, 0]
    count = np.zeros(tuple(out), dtype=dtype)
    for taps in _taps(window, stride, out):
        count += real[taps]
    return count


def _max(xp: np.ndarray, window, stride, out) -> np.ndarray:
    # NOTE: a running np.maximum over the taps is ~40x faster than x.reshape(..., kh, ..., kw).max(axis),
    # which numpy reduces element by element over the strided axes.
    y = None
    for taps in _taps(window, stride, out):
        y = xp[_every(taps)].copy() if y is None else np.maximum(y, xp[_every(taps)], out=y)
    return y


def _channels_first(a: np.ndarray) -> np.ndarray:
    """(N, D, H, W, C) -> (N, C, D, H, W) view."""
    return a.transpose(0, 4, 1, 2, 3)


def _channels_last(a: np.ndarray) -> np.ndarray:
    """(N, C, D, H, W) -> contiguous (N, D, H, W, C)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1))


def pool3d_params(op: str, x_shape, mode="max", window=2, stride=None, padding=0, layout="NCDHW") -> tuple:
    """Validate 3-D pooling as ops._check.pool_params does 2-D; returns (window, stride, padding, y_shape in
    ``layout``). x is (N, C, D, H, W), or (N, D, H, W, C) channels last; stride None means window."""
    _check.pooling_mode(op, mode)
    last = layout in CHANNELS_LAST_3D
    if not last and layout not in CHANNELS_FIRST_3D:
        raise DnnbindValueError(f"{op}: unknown layout {layout!r} for 5-D data; expected 'NCDHW' or 'NDHWC'")
    x_shape = _check.check_ndim(op, "x", x_shape, (5,), "5-D (N, D, H, W, C) (layout NDHWC)" if last else
                                "5-D (N, C, D, H, W)")
    window = _check.as_tuple(window, 3, op, "window", 1)
    stride = window if stride is None else _check.as_tuple(stride, 3, op, "stride", 1)
    padding = _check.as_tuple(padding, 3, op, "padding", 0)
    size = x_shape[1:4] if last else x_shape[2:]
    # NOTE: padding < window keeps at least one real element in every window, so max never sees only pad.
    if any(q >= k for q, k in zip(padding, window)):
        raise DnnbindValueError(f"{op}: padding {padding} must be smaller than window {window}: x {x_shape}")
    padded = tuple(s + 2 * q for s, q in zip(size, padding))
    if any(k > s for k, s in zip(window, padded)):
        raise DnnbindValueError(f"{op}: window {window} is larger than the padded input {padded} (padding "
                                f"{padding}): x {x_shape}")
    out = tuple((s - k) // st + 1 for s, k, st in zip(padded, window, stride))
    n, c = x_shape[0], x_shape[4] if last else x_shape[1]
    return window, stride, padding, (n,) + out + (c,) if last else (n, c) + out


def pool3d_grad_params(op: str, x_shape, y_shape, dy_shape, mode="max", window=2, stride=None, padding=0,
                       layout="NCDHW") -> tuple:
    """pool3d_params, plus y and dy must have the forward output's shape."""
    out = pool3d_params(op, x_shape, mode, window, stride, padding, layout)
    for name, shape in (("y", y_shape), ("dy", dy_shape)):
        if tuple(shape) != out[3]:
            raise DnnbindValueError(f"{op}: {name} has shape {tuple(shape)} but pooling x {tuple(x_shape)} with "
                                    f"window {out[0]}, stride {out[1]}, padding {out[2]} gives {out[3]}")
    return out


def _forward(x: np.ndarray, mode: str, window, stride, padding, out) -> np.ndarray:
    if mode == "max":
        return _max(_pad(x, padding, -np.inf), window, stride, out)
    xp = _pad(x, padding, 0.0)
    total = np.zeros(x.shape[:2] + tuple(out), dtype=x.dtype)
    for taps in _taps(window, stride, out):
        total += xp[_every(taps)]
    return (total / _divisor(mode, x.shape, window, stride, padding, out, x.dtype)).astype(x.dtype, copy=False)


def _backward(dy: np.ndarray, x: np.ndarray, mode: str, window, stride, padding, out) -> np.ndarray:
    if mode == "max":
        xp = _pad(x, padding, -np.inf)
        # NOTE: the maximum is recomputed from x rather than read from y, so a y that was rounded or
        # computed elsewhere cannot silently drop gradient; `taken` keeps ties from counting twice. A window
        # holding a NaN has a NaN maximum, which equals no x: it passes no gradient. dy is routed, not multiplied
        # by the mask, so a non-finite dy reaches its tap only (as the GPU kernel of ops.pooling does).
        ymax = _max(xp, window, stride, out)
        dxp = np.zeros_like(xp)
        taken = np.zeros(ymax.shape, dtype=bool)
        for taps in _taps(window, stride, out):
            hit = xp[_every(taps)] == ymax
            hit &= ~taken
            taken |= hit
            dxp[_every(taps)] += np.where(hit, dy, 0)
        return _crop(dxp, padding, x.shape)
    g = (dy / _divisor(mode, x.shape, window, stride, padding, out, x.dtype)).astype(x.dtype, copy=False)
    dxp = np.zeros(x.shape[:2] + tuple(s + 2 * q for s, q in zip(x.shape[2:], padding)), dtype=x.dtype)
    for taps in _taps(window, stride, out):
        dxp[_every(taps)] += g
    return _crop(dxp, padding, x.shape)


@_check.float16_via_float32
def pooling_forward(x: np.ndarray, mode: str = "max", window=2, stride=None, padding=0,
                    layout: str = "NCHW") -> np.ndarray:
    """y (N, C, P, Q) with P = floor((H + 2*pad - window) / stride) + 1, like cuDNN ((N, P, Q, C) for NHWC; 5-D x
    (N, C, D, H, W) likewise on three axes)."""
    x = np.asarray(x)
    op = "pooling_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x)
    mode = _check.pooling_mode(op, mode)
    if x.ndim == 5:
        window, stride, padding, y_shape = pool3d_params(op, x.shape, mode, window, stride, padding, layout)
        if layout in CHANNELS_LAST_3D:
            return _channels_last(_forward(_channels_first(x), mode, window, stride, padding, y_shape[1:4]))
        return _forward(x, mode, window, stride, padding, y_shape[2:])
    window, stride, padding, y_shape = _check.pool_params(op, x.shape, mode, window, stride, padding, layout)
    if layout == "NHWC":
        return as_nhwc(pooling_forward(as_nchw(x), mode, window, stride, padding))
    return _forward(x, mode, window, stride, padding, y_shape[2:])


@_check.float16_via_float32
def pooling_backward(y: np.ndarray, dy: np.ndarray, x: np.ndarray, mode: str = "max", window=2, stride=None,
                     padding=0, layout: str = "NCHW") -> np.ndarray:
    """dx: max routes each window's dy to the window's first maximal x; avg spreads dy / divisor evenly."""
    y, dy, x = np.asarray(y), np.asarray(dy), np.asarray(x)
    op = "pooling_backward"
    _check.check_dtype(op, _check.FLOAT32_64, y=y, dy=dy, x=x)
    mode = _check.pooling_mode(op, mode)
    if x.ndim == 5:
        window, stride, padding, y_shape = pool3d_grad_params(op, x.shape, y.shape, dy.shape, mode, window, stride,
                                                              padding, layout)
        if layout in CHANNELS_LAST_3D:
            return _channels_last(_backward(_channels_first(dy), _channels_first(x), mode, window, stride, padding,
                                            y_shape[1:4]))
        return _backward(dy, x, mode, window, stride, padding, y_shape[2:])
    window, stride, padding, y_shape = _check.pool_grad_params(
        op, x.shape, y.shape, dy.shape, mode, window, stride, padding, layout)
    if layout == "NHWC":
        return as_nhwc(pooling_backward(as_nchw(y), as_nchw(dy), as_nchw(x), mode, window, stride, padding))
    return _backward(dy, x, mode, window, stride, padding, y_shape[2:])
