"""Layer nd: ``nd.contrib`` (MXNet's ``mx.nd.contrib``): the contrib operators dnnbind has. Imports runtime and nd's
creation helpers.

So far ``arange_like`` (MXNet's ``_contrib_arange_like``). The rest of MXNet's contrib namespace is not here; a
name it lacks raises AttributeError (with the MXNet alias installed, its message says dnnbind lacks it).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._lib.errors import DnnbindTypeError, DnnbindValueError

from ..runtime.array import NDArray, array as _array
from ..runtime.device import as_device
from ._creation import check_array_fits
from ._params import into

__all__ = ["arange_like"]


def _number(name: str, v) -> float:
    if isinstance(v, str):  # MXNet's frontend takes parameter values as strings too
        try:
            return float(v)
        except ValueError:
            raise DnnbindValueError(f"arange_like: {name} must be a number, got {v!r}") from None
    if not isinstance(v, (numbers.Real, np.number)) or isinstance(v, (bool, np.bool_)):
        raise DnnbindTypeError(f"arange_like: {name} must be a number, got {type(v).__name__} {v!r}")
    return float(v)


def _values(n: int, start: float, step: float, repeat: int, dtype: np.dtype) -> np.ndarray:
    """``start + (i // repeat) * step`` for i < n, computed as MXNet's kernel does: start and step converted to the
    output's dtype first (an int dtype truncates 0.7 to 0), then the arithmetic in that dtype (float16 in float32,
    rounded once at the end, as mshadow's half type does; integers wrap)."""
    k = np.arange(n, dtype=np.int64) // repeat
    if dtype == np.float16:
        s, d = np.float32(np.float16(start)), np.float32(np.float16(step))
        return (s + k.astype(np.float32) * d).astype(np.float16)
    if dtype.kind == "f":
        return dtype.type(start) + k.astype(dtype) * dtype.type(step)
    with np.errstate(over="ignore"):
        s, d = np.array(start).astype(dtype), np.array(step).astype(dtype)
        return (k.astype(dtype) * d + s).astype(dtype)


def arange_like(data, start=0.0, step=1.0, repeat=1, ctx=None, axis=None, out=None, name=None) -> NDArray:
    """``nd.contrib.arange_like``: ``start, start + step, ...`` (each ``repeat`` times) in the shape of ``data``, or
    along ``axis`` of it (a 1-D result of that axis's length; negative counts from the end). The result has
    ``data``'s dtype and is on ``ctx`` (default: ``data``'s device). It depends on ``data``'s shape only: no
    gradient flows to ``data``."""
    if not isinstance(data, NDArray):
        raise DnnbindTypeError(f"arange_like: data must be an NDArray, got {type(data).__name__}")
    start, step = _number("start", start), _number("step", step)
    if isinstance(repeat, str):
        repeat = int(repeat) if repeat.lstrip("-").isdigit() else repeat
    if not isinstance(repeat, (numbers.Integral, np.integer)) or isinstance(repeat, (bool, np.bool_)):
        raise DnnbindTypeError(f"arange_like: repeat must be an int, got {type(repeat).__name__} {repeat!r}")
    if repeat < 1:  # MXNet divides by it (0 kills the process with SIGFPE, a negative counts down)
        raise DnnbindValueError(f"arange_like: repeat must be >= 1, got {repeat} (data {data.shape})")
    if isinstance(axis, str):
        axis = None if axis == "None" else int(axis)
    if axis is None:
        shape = data.shape
    else:
        if not isinstance(axis, (numbers.Integral, np.integer)) or isinstance(axis, (bool, np.bool_)):
            raise DnnbindTypeError(f"arange_like: axis must be an int or None, got {axis!r}")
        if not -data.ndim <= axis < data.ndim:
            raise DnnbindValueError(f"arange_like: cannot handle axis {axis} for data of shape {data.shape}")
        shape = (data.shape[axis % data.ndim],)
    dev = data.device if ctx is None or ctx == "" else as_device(ctx)
    check_array_fits("arange_like", shape, data.dtype, dev)
    n = int(np.prod(shape, dtype=np.int64))
    result = _array(_values(n, start, step, int(repeat), data.dtype).reshape(shape), device=dev)
    return result if out is None else into(out, result)


def __getattr__(name: str):
    """``nd.contrib.<Op>``: the registry entry MXNet names ``_contrib_<Op>`` (box_nms, ROIAlign, BilinearResize2D,
    ...), once it has one; each op module that defines such an entry needs no line here."""
    from . import OPERATORS
    found = OPERATORS.get("_contrib_" + name)
    if found is None:
        raise AttributeError(f"module 'dnnbind.nd.contrib' has no attribute {name!r}")
    return found[1]
