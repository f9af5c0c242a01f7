"""Layer nd: array creation with MXNet 1.x's signatures (``ctx=``, ``dtype=``, float32 by default).

Imports runtime. MXNet's ``nd.array`` makes float32 from anything but an NDArray (a float64 numpy array too);
``dnnbind.array`` keeps numpy's dtype. Both spellings of the device are taken: ``ctx=`` (MXNet) and ``device=``.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math
import numbers

import numpy as np

import importlib

_rt = importlib.import_module("dnnbind.runtime.array")  # the module (dnnbind.runtime.array is also a function)
from ..runtime.array import NDArray
from ..runtime.device import as_device
from ..ops.args import check_fits
from ._params import into, reject

_F32 = np.dtype(np.float32)


def as_dtype(dtype, default=_F32) -> np.dtype:
    """A creation function's ``dtype=`` as a numpy dtype (``default`` for None: float32, as in MXNet)."""
    if dtype is None:
        return default
    try:
        return np.dtype(dtype)
    except TypeError:
        raise DnnbindTypeError(f"not a dtype: {dtype!r} (use 'float32', 'int32', np.float64, ...)") from None


def as_shape(op: str, shape) -> tuple:
    """A creation function's ``shape=`` (an int or a sequence of non-negative ints) as a tuple of ints."""
    if isinstance(shape, (numbers.Integral, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, (numbers.Integral, np.integer)) and not isinstance(s, (bool, np.bool_)) for s in shape):
        raise DnnbindTypeError(f"{op}: shape must be an int or a tuple of ints, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise DnnbindValueError(f"{op}: shape {shape} has a negative dimension")
    return shape


def _ctx(ctx, device):
    return as_device(ctx if ctx is not None else device)


def array(source_array, ctx=None, dtype=None, device=None) -> NDArray:
    """``nd.array``: float32 unless ``dtype`` says otherwise (an NDArray source keeps its dtype)."""
    if isinstance(source_array, NDArray):
        dt = source_array.dtype if dtype is None else as_dtype(dtype)
        dev = _ctx(ctx, device) if (ctx is not None or device is not None) else source_array.device
        moved = source_array.to(dev, dt)
        return moved.copy() if moved is source_array else moved  # always a new array, like MXNet
    dt = as_dtype(dtype)
    try:
        host = np.asarray(source_array, dtype=dt)
    except (TypeError, ValueError) as exc:
        raise DnnbindTypeError(f"array: cannot make an array of {type(source_array).__name__}: {exc}") from None
    return _rt.array(host, device=_ctx(ctx, device), dtype=dt)


def check_array_fits(op: str, shape: tuple, dtype: np.dtype, dev) -> tuple:
    """``shape`` unless the array would be larger than the device's (or the host's) whole memory (a ValueError,
    before numpy's MemoryError or a failed device allocation)."""
    check_fits(op, dev, dtype, "the array", shape, cudnn=False)
    return shape


def _stype(op: str, stype) -> None:
    if stype not in (None, "default"):
        if stype in ("row_sparse", "csr"):
            raise NotImplementedError(f"{op}: sparse storage (stype={stype!r}) is not supported by dnnbind")
        raise DnnbindValueError(f"{op}: stype must be 'default', 'row_sparse' or 'csr', got {stype!r}")


def empty(shape, ctx=None, dtype=None, stype=None, device=None) -> NDArray:
    """``nd.empty``: an uninitialized array, float32 unless ``dtype`` says otherwise (``stype`` 'default' only)."""
    _stype("empty", stype)
    shape, dtype, dev = as_shape("empty", shape), as_dtype(dtype), _ctx(ctx, device)
    return _rt.empty(check_array_fits("empty", shape, dtype, dev), dtype, dev)


def _no_attrs(kwargs: dict) -> dict:
    """The keywords less MXNet's node attributes (``__layout__``, ``__init__``): an operator call takes those and
    keeps them on a symbol's node; an eager call has no node to keep them on."""
    if any(k.startswith("__") and k.endswith("__") for k in kwargs):
        return {k: v for k, v in kwargs.items() if not (k.startswith("__") and k.endswith("__"))}
    return kwargs


def zeros(shape, ctx=None, dtype=None, stype=None, device=None, out=None, name=None, **kwargs) -> NDArray:
    """``nd.zeros`` (MXNet's operator ``_zeros``): float32 unless ``dtype`` says otherwise; ``out`` takes the
    zeros; an unknown keyword (a misspelled ``dtype``) is refused; ``name`` and attributes (``__layout__``, which
    Gluon's RNN cells pass) are ignored, as MXNet ignores them."""
    kwargs = _no_attrs(kwargs)
    if kwargs:
        reject("_zeros", kwargs)
    _stype("zeros", stype)
    shape, dtype, dev = as_shape("zeros", shape), as_dtype(dtype), _ctx(ctx, device)
    return into(out, _rt.zeros(check_array_fits("zeros", shape, dtype, dev), dtype, dev))


def ones(shape, ctx=None, dtype=None, device=None, out=None, name=None, **kwargs) -> NDArray:
    """``nd.ones`` (MXNet's operator ``_ones``), as ``zeros``."""
    kwargs = _no_attrs(kwargs)
    if kwargs:
        reject("_ones", kwargs)
    shape, dtype, dev = as_shape("ones", shape), as_dtype(dtype), _ctx(ctx, device)
    return into(out, _rt.full(check_array_fits("ones", shape, dtype, dev), 1, dtype, dev))


def full(shape, val, ctx=None, dtype=None, device=None, out=None) -> NDArray:
    """``nd.full``: ``val`` (a real number) everywhere, float32 unless ``dtype`` says otherwise."""
    if not isinstance(val, (numbers.Real, np.number, np.bool_)):
        raise DnnbindTypeError(f"full: val must be a number, got {type(val).__name__} {val!r}")
    shape, dtype, dev = as_shape("full", shape), as_dtype(dtype), _ctx(ctx, device)
    if dtype.kind in "iu":  # numpy would overflow (an OverflowError, or a wrapped value)
        info = np.iinfo(dtype)
        if (isinstance(val, (float, np.floating)) and not math.isfinite(val)) or not info.min <= val <= info.max:
            raise DnnbindValueError(f"full: val {val!r} does not fit dtype {dtype.name}")
    return into(out, _rt.full(check_array_fits("full", shape, dtype, dev), val, dtype, dev))


def _like(op: str, data) -> NDArray:
    if not isinstance(data, NDArray):
        raise DnnbindTypeError(f"{op}: data must be an NDArray, got {type(data).__name__}")
    return data


def zeros_like(data) -> NDArray:
    """MXNet's zeros_like: zeros of data's shape, type and device (MXNet declares no parameters)."""
    data = _like("zeros_like", data)
    return _rt.zeros(data.shape, data.dtype, data.device)


def ones_like(data) -> NDArray:
    """MXNet's ones_like: ones of data's shape, type and device (MXNet declares no parameters)."""
    data = _like("ones_like", data)
    return _rt.full(data.shape, 1, data.dtype, data.device)


def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None, dtype=None, device=None) -> NDArray:
    """``nd.arange(start, stop, step, repeat)``: like numpy, each value repeated ``repeat`` times (>= 1); float32.
    ``infer_range`` is accepted and ignored."""
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if (v is not None or name != "stop") and (not isinstance(v, (numbers.Real, np.number))
                                                  or isinstance(v, (bool, np.bool_))):
            raise DnnbindTypeError(f"arange: {name} must be a number, got {type(v).__name__} {v!r}")
    if not isinstance(repeat, (numbers.Integral, np.integer)) or isinstance(repeat, (bool, np.bool_)):
        raise DnnbindTypeError(f"arange: repeat must be an int, got {type(repeat).__name__} {repeat!r}")
    if repeat < 1:
        raise DnnbindValueError(f"arange: repeat must be > 0, got {repeat}")
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise DnnbindValueError("arange: step must not be 0")
    if not all(math.isfinite(float(v)) for v in (start, stop, step)):
        raise DnnbindValueError(f"arange: start, stop and step must be finite, got {start}, {stop}, {step}")
    dtype, dev = as_dtype(dtype), _ctx(ctx, device)
    check_array_fits("arange", (max(0, math.ceil((stop - start) / step)) * int(repeat),), dtype, dev)
    values = np.arange(start, stop, step, dtype=np.float64)
    if int(repeat) > 1:
        values = np.repeat(values, int(repeat))
    return _rt.array(values.astype(dtype), device=dev)


def _count(op: str, name: str, value) -> int:
    if not isinstance(value, (numbers.Integral, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise DnnbindValueError(f"{op}: {name} must be >= 0, got {value}")
    return int(value)


def linspace(start, stop, num, endpoint=True, ctx=None, dtype=None, device=None) -> NDArray:
    for name, v in (("start", start), ("stop", stop)):
        if not isinstance(v, (numbers.Real, np.number)) or isinstance(v, (bool, np.bool_)):
            raise DnnbindTypeError(f"linspace: {name} must be a number, got {type(v).__name__} {v!r}")
    num, dtype, dev = _count("linspace", "num", num), as_dtype(dtype), _ctx(ctx, device)
    check_array_fits("linspace", (num,), dtype, dev)
    values = np.linspace(start, stop, num, endpoint=endpoint, dtype=np.float64)
    return _rt.array(values.astype(dtype), device=dev)


def eye(N, M=0, k=0, ctx=None, dtype=None, device=None) -> NDArray:
    """``nd.eye``: N x M (M = 0: N) ones on diagonal ``k``, float32 unless ``dtype`` says otherwise."""
    n, m = _count("eye", "N", N), _count("eye", "M", M)
    if not isinstance(k, (numbers.Integral, np.integer)) or isinstance(k, (bool, np.bool_)):
        raise DnnbindTypeError(f"eye: k must be an int, got {type(k).__name__} {k!r}")
    dtype, dev = as_dtype(dtype), _ctx(ctx, device)
    check_array_fits("eye", (n, m or n), dtype, dev)
    return _rt.array(np.eye(n, m or None, int(k), dtype=dtype), device=dev)


# -- the creation operators' registry entries ---------------------------------------------------------------------
# A symbol graph writes ``F.zeros(shape)`` as an ``_zeros`` node with no inputs (``ctx`` '' for the default device);
# ``zeros_like``/``ones_like`` are nd functions and nodes alike.

def _node_ctx(ctx):
    return None if ctx in ("", None) else ctx


def _zeros_node(shape=(), ctx=None, dtype="float32"):
    return zeros(shape, _node_ctx(ctx), dtype)


def _ones_node(shape=(), ctx=None, dtype="float32"):
    return ones(shape, _node_ctx(ctx), dtype)


def _full_node(shape=None, ctx=None, dtype="float32", value=None):
    return full(shape, value, _node_ctx(ctx), dtype)


def _arange_node(start=None, stop=None, step=1.0, repeat=1, infer_range=False, ctx=None, dtype="float32"):
    return arange(start, stop, step, repeat, infer_range, _node_ctx(ctx), dtype)


def _composites() -> None:
    from ._registry import composite
    composite("zeros_like", zeros_like)
    composite("ones_like", ones_like)
    composite("_zeros", _zeros_node, nd=())
    composite("_ones", _ones_node, nd=())
    composite("_full", _full_node, nd=())
    composite("_arange", _arange_node, nd=())


_composites()
