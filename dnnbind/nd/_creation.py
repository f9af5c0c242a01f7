"""Layer nd: array creation with MXNet 1.x's signatures (``ctx=``, ``dtype=``, float32 by default).

Imports runtime. MXNet's ``nd.array`` makes float32 from anything but an NDArray (a float64 numpy array too);
``dnnbind.array`` keeps numpy's dtype. Both spellings of the device are taken: ``ctx=`` (MXNet) and ``device=``.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers

import numpy as np

import importlib

_rt = importlib.import_module("dnnbind.runtime.array")  # the module (dnnbind.runtime.array is also a function)
from ..runtime.array import NDArray
from ..runtime.device import as_device

_F32 = np.dtype(np.float32)


def _dtype(dtype, default=_F32) -> np.dtype:
    if dtype is None:
        return default
    try:
        return np.dtype(dtype)
    except TypeError:
        raise DnnbindTypeError(f"not a dtype: {dtype!r} (use 'float32', 'int32', np.float64, ...)") from None


def _shape(op: str, shape) -> tuple:
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise DnnbindTypeError(f"{op}: shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise DnnbindValueError(f"{op}: shape {shape} has a negative dimension")
    return shape


def _ctx(ctx, device):
    return as_device(ctx if ctx is not None else device)


def array(source_array, ctx=None, dtype=None, device=None) -> NDArray:
    """``nd.array``: float32 unless ``dtype`` says otherwise (an NDArray source keeps its dtype)."""
    if isinstance(source_array, NDArray):
        dt = source_array.dtype if dtype is None else _dtype(dtype)
        dev = _ctx(ctx, device) if (ctx is not None or device is not None) else source_array.device
        moved = source_array.to(dev, dt)
        return moved.copy() if moved is source_array else moved  # always a new array, like MXNet
    dt = _dtype(dtype)
    try:
        host = np.asarray(source_array, dtype=dt)
    except (TypeError, ValueError) as exc:
        raise DnnbindTypeError(f"array: cannot make an array of {type(source_array).__name__}: {exc}") from None
    return _rt.array(host, device=_ctx(ctx, device), dtype=dt)


def empty(shape, ctx=None, dtype=None, device=None) -> NDArray:
    return _rt.empty(_shape("empty", shape), _dtype(dtype), _ctx(ctx, device))


def zeros(shape, ctx=None, dtype=None, device=None, **_ignored) -> NDArray:
    return _rt.zeros(_shape("zeros", shape), _dtype(dtype), _ctx(ctx, device))


def ones(shape, ctx=None, dtype=None, device=None, **_ignored) -> NDArray:
    return _rt.full(_shape("ones", shape), 1, _dtype(dtype), _ctx(ctx, device))


def full(shape, val, ctx=None, dtype=None, device=None, out=None) -> NDArray:
    r = _rt.full(_shape("full", shape), val, _dtype(dtype), _ctx(ctx, device))
    if out is not None:
        out[:] = r
        return out
    return r


def zeros_like(data, ctx=None, dtype=None) -> NDArray:
    return _rt.zeros(data.shape, _dtype(dtype, data.dtype), data.device if ctx is None else as_device(ctx))


def ones_like(data, ctx=None, dtype=None) -> NDArray:
    return _rt.full(data.shape, 1, _dtype(dtype, data.dtype), data.device if ctx is None else as_device(ctx))


def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None, dtype=None, device=None) -> NDArray:
    """``nd.arange(start, stop, step, repeat)``: like numpy, each value repeated ``repeat`` times; float32."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise DnnbindValueError("arange: step must not be 0")
    values = np.arange(start, stop, step, dtype=np.float64)
    if int(repeat) > 1:
        values = np.repeat(values, int(repeat))
    return _rt.array(values.astype(_dtype(dtype)), device=_ctx(ctx, device))


def linspace(start, stop, num, endpoint=True, ctx=None, dtype=None, device=None) -> NDArray:
    values = np.linspace(start, stop, int(num), endpoint=endpoint, dtype=np.float64)
    return _rt.array(values.astype(_dtype(dtype)), device=_ctx(ctx, device))


def eye(N, M=0, k=0, ctx=None, dtype=None, device=None) -> NDArray:
    values = np.eye(int(N), int(M) or None, int(k), dtype=_dtype(dtype))
    return _rt.array(values, device=_ctx(ctx, device))
