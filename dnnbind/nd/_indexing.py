"""Layer nd: indexing. ``x[key]``, ``x[key] = v``, slice/slice_axis/flip, take, pick, one_hot.

Imports numpy and nd._registry/_lower/_shape. MXNet 1.x's rule, which dnnbind keeps: an int or a step-1 slice on
the first axis (``x[2]``, ``x[1:3]``) is a view sharing memory; every other key gives a copy. Basic keys (ints,
slices with any step, None, Ellipsis, on any axis) are one strided copy on the GPU; writing ``x[key] = v`` is the
same kernel with the output strided, v broadcast. Integer-array keys gather (``take``); a general advanced key
is turned into flat positions on the host and gathered on the device. Writing through an advanced key on the
GPU goes through the host (documented; rare in MXNet programs).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math
import numbers

import numpy as np

from .. import autograd
from ..runtime.array import NDArray, check_size, empty, zeros
from . import _lower
from ._params import int_arg
from ..ops.opdef import typed
from ._registry import as_array, call, check_int_scalar, composite, func, norm_axes


class NDIndexError(IndexError, ValueError):
    """An index out of range or malformed: an IndexError (Python's protocols) and a ValueError (dnnbind's rule)."""


def _is_int(k) -> bool:
    return isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, (bool, np.bool_))


def is_basic(key) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return all(_is_int(k) or isinstance(k, slice) or k is None or k is Ellipsis for k in items)


def is_view_key(key) -> bool:
    if isinstance(key, tuple):
        if len(key) != 1:
            return False
        key = key[0]
    return _is_int(key) or (isinstance(key, slice) and key.step in (None, 1))


def basic_index(op: str, shape: tuple, key) -> tuple[int, tuple, tuple]:
    """(offset, strides, out_shape), in elements, of ``key`` applied to a C-contiguous array of ``shape``."""
    items = key if isinstance(key, tuple) else (key,)
    n_real = sum(1 for k in items if k is not None and k is not Ellipsis)
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise NDIndexError(f"{op}: an index can only have a single Ellipsis, got {key!r}")
    if n_real > len(shape):
        raise NDIndexError(f"{op}: too many indices ({n_real}) for an array of shape {shape}")
    expanded = []
    for k in items:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (len(shape) - sum(1 for k in expanded if k is not None)))
    own = _lower.contiguous_strides(shape)
    offset, strides, out, axis = 0, [], [], 0
    for k in expanded:
        if k is None:
            out.append(1)
            strides.append(0)
            continue
        dim, st = shape[axis], own[axis]
        if _is_int(k):
            i = int(k)
            if not -dim <= i < dim:
                raise NDIndexError(f"{op}: index {i} is out of bounds for axis {axis} with size {dim} "
                                   f"(shape {shape})")
            offset += (i % dim) * st
        elif isinstance(k, slice):
            if k.step == 0:
                raise NDIndexError(f"{op}: slice step cannot be zero (axis {axis})")
            start, stop, step = k.indices(dim)
            n = len(range(start, stop, step))
            if n:
                offset += start * st
            out.append(n)
            strides.append(st * step)
        else:
            raise DnnbindTypeError(f"{op}: unsupported index {k!r} of type {type(k).__name__} (ints, slices, None, "
                            "Ellipsis, NDArrays and lists of ints are supported)")
        axis += 1
    return offset, tuple(strides), tuple(out)


# -- basic slicing as a table op (copy), with its gradient ------------------------------------------------------------

def _slice_check(x, key=None):
    return basic_index("slice", x.shape, key)


func("_basic_index", _slice_check,
     lambda meta, x, key=None: NDArray._from_numpy(np.array(x._data[key], order="C")),
     lambda meta, x, key=None: _lower.copy_strided(x, meta[1], meta[0], meta[2]),
     lambda g, y, x, key=None: call("_basic_index_backward", g, shape=x.shape, key=key), nd=(), params=("key",))


def _bwd_cpu(meta, g, shape=None, key=None):
    out = np.zeros(shape, g.dtype)
    out[key] = g._data.reshape(out[key].shape)
    return NDArray._from_numpy(out)


def _bwd_gpu(meta, g, shape=None, key=None):
    off, strides, sub = meta
    out = zeros(shape, g.dtype, g.device)
    _lower.copy_strided(g, _lower.contiguous_strides(sub), 0, sub, out=out, out_strides=strides, out_offset=off)
    return out


func("_basic_index_backward", lambda g, shape=None, key=None: basic_index("slice", shape, key), _bwd_cpu, _bwd_gpu,
     lambda gg, y, g, shape=None, key=None: call("_basic_index", gg, key=key), nd=(), params=("shape", "key"))


def slice_op(data, begin, end, step=None):
    """``nd.slice(data, begin=(..), end=(..), step=(..))``: None entries mean the whole axis."""
    data = as_array("slice", "data", data)
    step = step or (None,) * len(begin)
    if not (len(begin) == len(end) == len(step)) or len(begin) > data.ndim:
        raise DnnbindValueError(f"slice: begin {begin}, end {end}, step {step} must have equal lengths <= ndim "
                         f"{data.ndim}")
    return getitem(data, tuple(slice(b, e, s) for b, e, s in zip(begin, end, step)))


def slice_axis(data, axis, begin, end):
    data = as_array("slice_axis", "data", data)
    a = norm_axes("slice_axis", data.ndim, axis)[0]
    key = (slice(None),) * a + (slice(begin, end),)
    return call("_basic_index", data, key=key)


def flip(data, axis):
    data = as_array("flip", "data", data)
    axes = norm_axes("flip", data.ndim, axis)
    return call("_basic_index", data, key=tuple(slice(None, None, -1) if i in axes else slice(None)
                                                 for i in range(data.ndim)))


# -- getitem / setitem ---------------------------------------------------------------------------------------------

def getitem(x: NDArray, key):
    if is_view_key(key) and not isinstance(key, tuple) or (isinstance(key, tuple) and is_view_key(key)):
        k = key[0] if isinstance(key, tuple) else key
        if x.ndim == 0:
            raise NDIndexError(f"getitem: cannot index a 0-d array with {key!r}")
        if _is_int(k) and not -x.shape[0] <= int(k) < x.shape[0]:
            raise NDIndexError(f"getitem: index {int(k)} is out of bounds for axis 0 with size {x.shape[0]}")
        return _view_index(x, k)
    if is_basic(key):
        return call("_basic_index", x, key=key)
    return _advanced(x, key)


def _view_index(x: NDArray, k) -> NDArray:
    """MXNet's views: x[i] and x[a:b] share x's memory; taped as slices so gradients flow."""
    n = x.shape[0]
    if _is_int(k):
        start, stop, shape = int(k) % n, int(k) % n + 1, x.shape[1:]
    else:
        start, stop, _ = k.indices(n)
        stop = max(stop, start)
        shape = (stop - start,) + x.shape[1:]
    row = math.prod(x.shape[1:])
    if not x.on_gpu:  # a view (x._data[i] of a 1-d array would be a numpy scalar, not a view)
        out = NDArray._from_numpy(x._data[start:stop].reshape(shape))
    else:
        out = NDArray._from_ptr(x.ptr + start * row * x.dtype.itemsize, shape, x.dtype, x.device, x._owner)
    if autograd.is_recording():
        if autograd.needs_grad(x):
            xshape = x.shape
            autograd.record_op("slice", out, (x,),
                               lambda g: (call("_basic_index_backward", g, shape=xshape, key=k),))
        else:
            autograd.hold(out, (x,))  # a view of an array in the graph is in the graph (MXNet)
    return out


def _index_arrays(key):
    items = key if isinstance(key, tuple) else (key,)
    out = []
    for k in items:
        if isinstance(k, NDArray):
            k = k.numpy()
        if isinstance(k, (list, np.ndarray)):
            k = np.asarray(k)
            if k.dtype.kind == "f":
                k = k.astype(np.int64)
            elif k.dtype.kind not in "iub":
                raise DnnbindTypeError(f"getitem: index arrays must be integers, got {k.dtype}")
        out.append(k)
    return tuple(out)


def _advanced(x: NDArray, key):
    items = key if isinstance(key, tuple) else (key,)
    # The common case, x[idx] with an integer NDArray/list on the first axis: one gather, no host round trip.
    if len(items) == 1 and isinstance(items[0], (NDArray, list, np.ndarray)):
        idx = items[0] if isinstance(items[0], NDArray) else as_array("getitem", "key", np.asarray(items[0]), x)
        if idx.dtype.kind == "b":
            raise DnnbindTypeError("getitem: boolean masks are not supported (MXNet 1.x has none); use nd.where or "
                            "contrib.boolean_mask")
        return call("take", x, idx, axis=0, mode="raise" if not x.on_gpu else "clip")
    host_key = _index_arrays(key)
    try:
        positions = np.arange(x.size, dtype=np.int64).reshape(x.shape)[host_key]
    except IndexError as exc:
        raise NDIndexError(f"getitem: {exc} (shape {x.shape})") from None
    flat = _lower_flat(x)
    from ..runtime.array import array
    return call("take", flat, array(positions, device=x.device), axis=0)


def _lower_flat(x):
    return x.reshape((x.size,))


def _drop_leading_ones(v: np.ndarray, ndim: int) -> np.ndarray:
    """MXNet accepts a value with extra leading size-1 dims (``y[i, j] = x.sum()``, a shape-(1,) array)."""
    while v.ndim > ndim and v.shape[0] == 1:
        v = v.reshape(v.shape[1:])
    return v


def setitem(x: NDArray, key, value) -> None:
    if isinstance(value, NDArray) and value.device is not x.device:
        value = value.as_in_context(x.device)
    if autograd.thread_state.__dict__.get("recording") and autograd.check_write(x, value, lambda: _covers(x.shape, key)):
        _write(x, key, value)
        _record_assign(x, value)
    else:
        _write(x, key, value)


def _covers(shape: tuple, key) -> bool:
    """Whether ``x[key]`` is all of x, in order (x[:], x[...], x[0:n], x[:, :]): MXNet tapes such an assignment
    as a copy; any other write with a value from the graph is refused."""
    items = key if isinstance(key, tuple) else (key,)
    if not all(isinstance(k, slice) or k is Ellipsis for k in items) or sum(k is Ellipsis for k in items) > 1:
        return False
    cut = items.index(Ellipsis) if Ellipsis in items else len(items)
    before, after = items[:cut], items[cut + 1:]
    if len(before) + len(after) > len(shape):
        return False
    pairs = list(zip(before, shape)) + list(zip(after, shape[len(shape) - len(after):]))
    return all(k.step in (None, 1) and k.indices(d)[:2] == (0, d) for k, d in pairs)


def _record_assign(x: NDArray, value: NDArray) -> None:
    """Tape ``x[:] = value``: value's gradient is x's, summed over the broadcast axes (and cast back)."""
    vshape, dtype = value.shape, value.dtype
    src = vshape
    while len(src) > x.ndim and src[0] == 1:
        src = src[1:]

    def backward(g):
        from ._registry import unbroadcast
        g = unbroadcast(g, src).reshape(vshape)
        return (g if g.dtype == dtype else g.astype(dtype),)

    autograd.record_copy(value, x, backward)


def _write(x: NDArray, key, value) -> None:
    if x.dtype.kind in "iu":
        check_int_scalar("setitem", "value", value, x.dtype)
    if not x.on_gpu:
        k = key if is_basic(key) else _index_arrays(key)
        v = value._data if isinstance(value, NDArray) else value
        try:
            if isinstance(v, (np.ndarray, list, tuple)):
                v = _drop_leading_ones(np.asarray(v), x._data[k].ndim)
            x._data[k] = v
        except IndexError as exc:
            raise NDIndexError(f"setitem: {exc} (shape {x.shape})") from None
        except ValueError as exc:
            raise DnnbindValueError(f"setitem: {exc} (array shape {x.shape}, key {key!r})") from None
        return
    if not is_basic(key):
        host = x.numpy()  # GPU write through an advanced index: via the host (see module docstring)
        k = _index_arrays(key)
        v = value.numpy() if isinstance(value, NDArray) else value
        host[k] = _drop_leading_ones(np.asarray(v), host[k].ndim) if not np.isscalar(v) else v
        x.copy_(host)
        return
    off, strides, shape = basic_index("setitem", x.shape, key)
    if isinstance(value, (numbers.Number, np.number, np.bool_)):
        _lower.fill_strided(x, value, strides, off, shape)
        return
    v = value if isinstance(value, NDArray) else as_array("setitem", "value", np.asarray(value, dtype=x.dtype), x)
    if v.dtype != x.dtype:
        v = v.astype(x.dtype)
    src_shape = v.shape
    while len(src_shape) > len(shape) and src_shape[0] == 1:
        src_shape = src_shape[1:]
    try:
        from ._registry import broadcast_shape
        if broadcast_shape("setitem", [src_shape, shape], ["value", "target"]) != shape:
            raise ValueError
    except ValueError:
        raise DnnbindValueError(f"setitem: value of shape {v.shape} cannot be broadcast to the indexed region "
                         f"{shape} (array shape {x.shape}, key {key!r})") from None
    _lower.copy_strided(v, _lower.broadcast_strides(src_shape, shape), 0, shape, out=x, out_strides=strides,
                        out_offset=off)


# -- take / pick / one_hot ------------------------------------------------------------------------------------------

def _take_check(a, indices, axis=0, mode="clip"):
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):  # MXNet: "expect int"
        raise DnnbindTypeError(f"take: axis must be an int, got {axis!r} (data {a.shape}, indices {indices.shape})")
    if mode not in ("clip", "wrap", "raise"):
        raise DnnbindValueError(f"take: mode must be 'clip', 'wrap' or 'raise', got {mode!r}")
    ax = norm_axes("take", a.ndim, axis)[0]
    if a.shape[ax] == 0:
        raise DnnbindValueError(f"take: cannot take from an empty axis {ax} (shape {a.shape})")
    return ax, a.shape[:ax] + indices.shape + a.shape[ax + 1:]


def _take_cpu(meta, a, indices, axis=0, mode="clip"):
    ax = meta[0]
    idx = indices._data
    idx = np.trunc(idx).astype(np.int64) if idx.dtype.kind == "f" else idx.astype(np.int64)
    n = a.shape[ax]
    if mode == "raise" and ((idx < -n) | (idx >= n)).any():
        raise NDIndexError(f"take: an index is out of range for axis {ax} with size {n}")
    idx = np.mod(idx, n) if mode in ("wrap", "raise") else np.clip(idx, 0, n - 1)
    return NDArray._from_numpy(np.asarray(np.take(a._data, idx, axis=ax), order="C"))


def _take_gpu(meta, a, indices, axis=0, mode="clip"):
    ax, shape = meta
    out = empty(shape, a.dtype, a.device)
    if out.size:
        st = _lower.strided()
        st.gather(_lower.ref(a), a.shape, _lower.ref(indices), indices.shape, ax, _lower.ref(out),
                  mode="wrap" if mode == "wrap" else "clip", stream=_stream(a), device=a.device.index)
    return out


def _stream(a):
    from ..runtime.stream import current_stream
    return current_stream(a.device)


func("take", _take_check, _take_cpu, _take_gpu,
     lambda g, y, a, indices, axis=0, mode="clip": (call("_take_backward", g, indices, shape=a.shape, axis=axis,
                                                          mode=mode), None),
     methods=("take",), arity=2, params=("axis", "mode"), dtype=typed(own=(1,)))


def _take_bwd_check(g, indices, shape=None, axis=0, mode="clip"):
    return norm_axes("take", len(shape), axis)[0]


def _take_bwd_cpu(ax, g, indices, shape=None, axis=0, mode="clip"):
    idx = indices._data
    idx = np.trunc(idx).astype(np.int64) if idx.dtype.kind == "f" else idx.astype(np.int64)
    n = shape[ax]
    idx = np.mod(idx, n) if mode in ("wrap", "raise") else np.clip(idx, 0, n - 1)
    out = np.zeros(shape, g.dtype)
    gm = np.moveaxis(g._data.reshape(shape[:ax] + (idx.size,) + shape[ax + 1:]), ax, 0)
    np.add.at(np.moveaxis(out, ax, 0), idx.reshape(-1), gm)
    return NDArray._from_numpy(out)


def _take_bwd_gpu(ax, g, indices, shape=None, axis=0, mode="clip"):
    out = zeros(shape, g.dtype, g.device)
    if g.size:
        st = _lower.strided()
        st.scatter_add(_lower.ref(g), _lower.ref(indices), indices.shape, ax, _lower.ref(out), shape,
                       mode="wrap" if mode == "wrap" else "clip", stream=_stream(g), device=g.device.index)
    return out


func("_take_backward", _take_bwd_check, _take_bwd_cpu, _take_bwd_gpu, None, nd=(), arity=2,
     params=("shape", "axis", "mode"))


def one_hot(indices, depth, on_value=1.0, off_value=0.0, dtype="float32"):
    """Composite: expand_dims(indices, -1) == arange(depth), scaled to on/off values. Float indices truncate toward
    zero (MXNet casts them; 1.7 marks 1) and are compared in float64 (a float16 arange cannot count past 2048; NaN
    marks nothing, where a cast to an integer would give 0 on the GPU). An index outside [0, depth) marks nothing."""
    indices = as_array("one_hot", "indices", indices)
    depth = int_arg("one_hot", "depth", depth)
    if depth < 0:
        raise DnnbindValueError(f"one_hot: depth must be >= 0, got {depth} (indices shape {indices.shape})")
    check_size("one_hot", indices.shape + (depth,), dtype, indices.device)
    check_size("one_hot", (depth,), np.float64, indices.device, f"the classes of depth {depth}")
    if indices.dtype.kind == "f":
        indices = call("trunc", call("cast", indices, dtype=np.dtype(np.float64)))
    elif indices.dtype not in (np.int32, np.int64):
        indices = call("cast", indices, dtype=np.dtype(np.int64))
    classes = _classes(depth, indices.dtype, indices.device)
    hit = call("equal", indices.reshape(indices.shape + (1,)), classes)
    hit = hit.astype(dtype) if np.dtype(dtype) != hit.dtype else hit
    if on_value == 1.0 and off_value == 0.0:
        return hit
    return hit * (float(on_value) - float(off_value)) + float(off_value)


_CLASSES: dict = {}  # (depth, dtype, device) -> 0..depth-1 on the device, never written


def _classes(depth: int, dtype, device):
    """one_hot's class ids, uploaded once per (depth, dtype, device): a copy from the host at every call would
    stop a hybridized Block that one-hot encodes its input (a language model) from being recorded."""
    key = (depth, dtype, device)
    classes = _CLASSES.get(key)
    if classes is None:
        from ._creation import arange
        if len(_CLASSES) >= 64:
            _CLASSES.clear()
        classes = _CLASSES[key] = arange(depth, ctx=device, dtype=dtype)
    return classes


def pick(data, index, axis=-1, keepdims=False, mode="clip"):
    """``nd.pick``: data[..., index[...], ...] along ``axis``, a gather (never a product with a one-hot, which
    turns an inf elsewhere in the row into NaN). Float indices truncate toward zero; 'clip' clamps them into
    range, 'wrap' takes them modulo the axis length."""
    data = as_array("pick", "data", data)
    index = as_array("pick", "index", index, data)
    return call("_pick", data, index, axis=axis, keepdims=keepdims, mode=mode)


def _pick_check(data, index, axis=-1, keepdims=False, mode="clip"):
    if axis is None:
        raise DnnbindValueError("pick: axis=None is not supported by pick yet. Must specify an axis.")
    if mode not in ("clip", "wrap"):
        raise DnnbindValueError(f"pick: mode must be 'clip' or 'wrap', got {mode!r}")
    a = norm_axes("pick", data.ndim, axis)[0]
    expect = data.shape[:a] + data.shape[a + 1:]
    kept = data.shape[:a] + (1,) + data.shape[a + 1:]
    if index.shape != expect and index.shape != kept:
        raise DnnbindValueError(f"pick: index shape {index.shape} must be data's shape without axis {a}: {expect} "
                                f"(data shape {data.shape})")
    if data.shape[a] == 0 and math.prod(expect):
        raise DnnbindValueError(f"pick: cannot pick from axis {a} of length 0 (data shape {data.shape})")
    return a, expect, kept if keepdims else expect


def _pick_positions(index: NDArray, expect: tuple, n: int, mode: str) -> np.ndarray:
    idx = index._data.reshape(expect)
    with np.errstate(invalid="ignore"):
        idx = np.trunc(idx).astype(np.int64) if idx.dtype.kind == "f" else idx.astype(np.int64)
    return np.clip(idx, 0, n - 1) if mode == "clip" else np.mod(idx, n)


def pick_geometry(shape: tuple, a: int) -> tuple:
    """A pick as the gather kernel of kernels.strided sees it (its scatter_add the same for the gradient): the
    iteration space is ``shape`` without axis ``a``, over which the output (scatter: the gradient), the data and
    the index advance together; the picked position is ``index * axis_stride`` from the data's offset.
    Returns (space, [out, data, index] element strides, axis length, axis stride)."""
    own = _lower.contiguous_strides(shape)
    space = shape[:a] + shape[a + 1:]
    flat = _lower.contiguous_strides(space)
    return space, [flat, own[:a] + own[a + 1:], flat], shape[a], own[a]


def _pick_launch(kind: str, shape: tuple, a: int, mode: str, refs: tuple, device) -> None:
    space, strides, length, axis_stride = pick_geometry(shape, a)
    # NOTE: the gather/scatter_add kernel variants themselves, given a pick's geometry (kernels.strided.gather
    # spans the index over an axis of its own, which a pick's index does not).
    from ..runtime.stream import current_stream
    _lower.strided().launch_take(kind, mode, space, strides, refs, length, axis_stride, current_stream(device),
                                 device.index)


def _pick_cpu(meta, data, index, axis=-1, keepdims=False, mode="clip"):
    a, expect, out_shape = meta
    idx = _pick_positions(index, expect, data.shape[a], mode)
    got = np.take_along_axis(data._data, np.expand_dims(idx, a), axis=a) if data.size else \
        np.zeros(out_shape, data.dtype)
    return NDArray._from_numpy(np.array(got.reshape(out_shape), order="C"))  # (ascontiguousarray makes 0-d 1-d)


def _pick_gpu(meta, data, index, axis=-1, keepdims=False, mode="clip"):
    a, expect, out_shape = meta
    out = empty(out_shape, data.dtype, data.device)
    if out.size:
        _pick_launch("gather", data.shape, a, mode, (_lower.ref(out), _lower.ref(data), _lower.ref(index)),
                     data.device)
    return out


func("_pick", _pick_check, _pick_cpu, _pick_gpu,
     lambda g, y, data, index, axis=-1, keepdims=False, mode="clip":
     (call("_pick_backward", g, index, shape=data.shape, axis=axis, mode=mode), None),
     nd=(), arity=2, params=("axis", "keepdims", "mode"))


def _pick_bwd_check(g, index, shape=None, axis=-1, mode="clip"):
    a = norm_axes("pick", len(shape), axis)[0]
    return a, shape[:a] + shape[a + 1:]


def _pick_bwd_cpu(meta, g, index, shape=None, axis=-1, mode="clip"):
    a, expect = meta
    out = np.zeros(shape, g.dtype)
    if out.size:
        idx = np.expand_dims(_pick_positions(index, expect, shape[a], mode), a)
        np.put_along_axis(out, idx, g._data.reshape(idx.shape), axis=a)
    return NDArray._from_numpy(out)


def _pick_bwd_gpu(meta, g, index, shape=None, axis=-1, mode="clip"):
    a, _ = meta
    wide = g if g.dtype in (np.float32, np.float64, np.int32, np.int64) else g.astype(np.float32)  # no half atomicAdd
    out = zeros(shape, wide.dtype, g.device)
    if g.size:
        _pick_launch("scatter_add", shape, a, mode, (_lower.ref(wide), _lower.ref(out), _lower.ref(index)), g.device)
    return out if out.dtype == g.dtype else out.astype(g.dtype)


func("_pick_backward", _pick_bwd_check, _pick_bwd_cpu, _pick_bwd_gpu,
     lambda gg, y, g, index, shape=None, axis=-1, mode="clip":
     (call("_pick", gg, index, axis=axis, keepdims=False, mode=mode).reshape(g.shape), None),
     nd=(), arity=2, params=("shape", "axis", "mode"))


# -- the composites' registry entries ---------------------------------------------------------------------------

composite("slice", slice_op)
composite("slice_axis", slice_axis)
composite("flip", flip, nd=("flip", "reverse"))
composite("one_hot", one_hot, dtype=typed(own=(0,), out=lambda p, t: [np.dtype(p["dtype"])]))
composite("pick", pick, dtype=typed(own=(1,)))  # the index keeps its own type
