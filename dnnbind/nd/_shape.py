"""Layer nd: shape ops (reshape codes, transpose, broadcast, concat/stack/split, tile/repeat, flip).

Imports numpy and nd._registry/_lower. NDArrays are C-contiguous: reshape, expand_dims, squeeze and flatten are
views (taped as reshapes); everything else writes a new array through one strided-copy kernel on the GPU
(cudnnTransformTensor for float transposes). Compositions (swapaxes, stack, split, tile, repeat,
broadcast_like) need no gradient code of their own.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError, reject_unknown

import math

import numpy as np

from ..runtime.array import NDArray, check_size, empty
from . import _lower
from ._params import shape_arg
from ..ops.opdef import typed
from ._registry import as_array, broadcast_shape, call, composite, func, norm_axes


def _arr(op: str, data, name: str = "data") -> NDArray:
    """The composite ops' one check of their array argument (TypeError naming the op for None, a str, ...)."""
    return data if type(data) is NDArray else as_array(op, name, data)

# -- reshape with MXNet's special codes ----------------------------------------------------------------------------


def infer_reshape(op: str, shape: tuple, spec, reverse: bool = False) -> tuple:
    """MXNet's reshape codes: 0 copy a dim, -1 infer one, -2 copy the rest, -3 merge two, -4 split one in two."""
    if isinstance(spec, (int, np.integer)):
        spec = (int(spec),)
    spec = tuple(int(s) for s in spec)
    src = tuple(reversed(shape)) if reverse else tuple(shape)
    if reverse:
        spec = _reverse_spec(spec)
    out, i, k = [], 0, 0
    size = math.prod(shape)
    while k < len(spec):
        s = spec[k]
        if s > 0:
            out.append(s)
            i += 1
        elif s == 0:
            if i >= len(src):
                raise DnnbindValueError(f"{op}: code 0 at position {k} has no input dim to copy (shape {shape}, {spec})")
            out.append(src[i])
            i += 1
        elif s == -1:
            out.append(-1)
            i += 1
        elif s == -2:
            out.extend(src[i:])
            i = len(src)
        elif s == -3:
            if i + 1 >= len(src):
                raise DnnbindValueError(f"{op}: code -3 needs two input dims (shape {shape}, {spec})")
            out.append(src[i] * src[i + 1])
            i += 2
        elif s == -4:
            if k + 2 >= len(spec) or i >= len(src):
                raise DnnbindValueError(f"{op}: code -4 needs two values after it and an input dim (shape {shape}, {spec})")
            d0, d1, d = spec[k + 1], spec[k + 2], src[i]
            if d0 == -1:
                d0 = d // d1 if d1 > 0 else -1
            if d1 == -1:
                d1 = d // d0 if d0 > 0 else -1
            if d0 * d1 != d:
                raise DnnbindValueError(f"{op}: -4 split {spec[k + 1]}, {spec[k + 2]} does not divide dim {d} "
                                 f"(shape {shape})")
            out.extend((d0, d1))
            i += 1
            k += 2
        else:
            raise DnnbindValueError(f"{op}: invalid reshape code {s} in {spec}")
        k += 1
    if out.count(-1) > 1:
        raise DnnbindValueError(f"{op}: at most one dim can be inferred, got {spec} for shape {shape}")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or size % rest:
            raise DnnbindValueError(f"{op}: cannot reshape {shape} into {spec}")
        out[out.index(-1)] = size // rest
    if reverse:
        out = out[::-1]
    if math.prod(out) != size:
        raise DnnbindValueError(f"{op}: cannot reshape array of shape {shape} (size {size}) into {tuple(out)}")
    return tuple(out)


def _reverse_spec(spec):
    # -4 takes its two following values; reversing keeps each group together.
    groups, k = [], 0
    while k < len(spec):
        if spec[k] == -4:
            groups.append((-4, spec[k + 2], spec[k + 1]))
            k += 3
        else:
            groups.append((spec[k],))
            k += 1
    return tuple(v for grp in reversed(groups) for v in grp)


def reshape(data, *shape, reverse=False, **kwargs):
    data = _arr("reshape", data)
    reject_unknown("Reshape", kwargs, ("shape", "reverse", "target_shape", "keep_highest"))
    if "target_shape" in kwargs or "keep_highest" in kwargs:
        raise DnnbindValueError("Reshape: target_shape and keep_highest are deprecated in MXNet 1.x and not "
                                "supported; use shape=")
    if "shape" in kwargs:
        shape = (kwargs.pop("shape"),)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return _view(data, infer_reshape("reshape", data.shape, shape, reverse))


_BASE_RESHAPE = NDArray.reshape  # the runtime's view (taped by autograd); nd installs the MXNet-codes version


def _view(x: NDArray, new: tuple) -> NDArray:
    return _BASE_RESHAPE(x, new) if new != x.shape else x


def expand_dims(data, axis):
    data = _arr("expand_dims", data)
    nd = data.ndim + 1
    if not -nd <= int(axis) < nd:
        raise DnnbindValueError(f"expand_dims: axis {axis} out of range for a result of {nd} dimensions")
    a = int(axis) % nd
    return _view(data, data.shape[:a] + (1,) + data.shape[a:])


def squeeze(data, axis=None):
    data = _arr("squeeze", data)
    if axis is None:
        return _view(data, tuple(d for d in data.shape if d != 1)) if data.ndim else data
    axes = norm_axes("squeeze", data.ndim, axis)
    for a in axes:
        if data.shape[a] != 1:
            raise DnnbindValueError(f"squeeze: axis {a} has size {data.shape[a]}, not 1 (shape {data.shape})")
    return _view(data, tuple(d for i, d in enumerate(data.shape) if i not in axes))


def flatten(data):
    data = _arr("flatten", data)
    return _view(data, (data.shape[0], -1) if data.ndim else (1, 1)) if data.ndim != 2 else data


# -- cast -------------------------------------------------------------------------------------------------------------

def _cast_cpu(dt, x, dtype=None):
    with np.errstate(invalid="ignore"):  # NaN/inf to an integer: whatever the cast gives, as on the GPU
        return NDArray._from_numpy(x._data.astype(dt))


def _cast_check(x, dtype=None):
    """MXNet's Cast takes a numeric dtype, required."""
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biuf":
        raise DnnbindTypeError(f"cast: dtype must be a numeric dtype (float16, float32, float64, uint8, int8, int32, "
                               f"int64, bool), got {dtype!r} (data {x.shape})")
    return dt


func("cast", _cast_check, _cast_cpu,
     lambda dt, x, dtype=None: _lower.copy_strided(x, _lower.contiguous_strides(x.shape), 0, x.shape, dtype=dt),
     lambda g, y, x, dtype=None: call("cast", g, dtype=x.dtype) if x.dtype.kind == "f" else None,
     nd=("cast", "Cast"), params=("dtype",), dtype=typed(out=lambda p, t: [np.dtype(p["dtype"])]))


# -- transpose ------------------------------------------------------------------------------------------------------

def _perm(x, axes=None):
    axes = shape_arg("transpose", "axes", axes)  # MXNet's Shape(tuple): None or () reverse the axes
    if axes is None:
        return tuple(reversed(range(x.ndim)))
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise DnnbindValueError(f"transpose: axes {axes} are not a permutation of {x.ndim} dims (shape {x.shape})")
    return tuple(a % x.ndim for a in axes)


def _transpose_gpu(perm, x, axes=None):
    shape = tuple(x.shape[p] for p in perm)
    own = _lower.contiguous_strides(x.shape)
    strides = tuple(own[p] for p in perm)
    if x.dtype in (np.float32, np.float64) and 2 <= x.ndim <= 8 and perm != tuple(range(x.ndim)) and x.size:
        from ..ops import tensor_ops  # cudnnTransformTensor where cuDNN takes the layout
        if tensor_ops.can_transform(shape, strides, x.dtype):
            return tensor_ops.transpose(x, perm)
    return _lower.copy_strided(x, strides, 0, shape)


func("transpose", _perm, lambda perm, x, axes=None: NDArray._from_numpy(np.array(x._data.transpose(perm), order="C")),
     _transpose_gpu, lambda g, y, x, axes=None: call("transpose", g, axes=tuple(np.argsort(_perm(x, axes)))),
     methods=("transpose",), params=("axes",))


def swapaxes(data, dim1=0, dim2=0):
    data = _arr("swapaxes", data)
    perm = list(range(data.ndim))
    a, b = norm_axes("swapaxes", data.ndim, dim1)[0], norm_axes("swapaxes", data.ndim, dim2)[0]
    perm[a], perm[b] = perm[b], perm[a]
    return call("transpose", data, axes=tuple(perm))


# -- broadcast ------------------------------------------------------------------------------------------------------

def _bcast_check(x, shape=None):
    shape = shape_arg("broadcast_to", "shape", shape)
    if shape is None:
        raise DnnbindTypeError(f"broadcast_to: shape is required (data {x.shape})")
    if len(shape) < x.ndim:
        raise DnnbindValueError(f"broadcast_to: cannot broadcast shape {x.shape} to fewer dims {shape}")
    lead = len(shape) - x.ndim
    shape = tuple(x.shape[i - lead] if s == 0 and i >= lead else s for i, s in enumerate(shape))
    if broadcast_shape("broadcast_to", [x.shape, shape], ["data", "shape"]) != shape:
        raise DnnbindValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    check_size("broadcast_to", shape, x.dtype, x.device)
    return shape


func("broadcast_to", _bcast_check,
     lambda tgt, x, **_: NDArray._from_numpy(np.array(np.broadcast_to(x._data, tgt), order="C")),
     lambda tgt, x, **_: _lower.copy_strided(x, _lower.broadcast_strides(x.shape, tgt), 0, tgt),
     lambda g, y, x, **_: g, methods=("broadcast_to",), params=("shape",))


def broadcast_like(lhs, rhs, lhs_axes=None, rhs_axes=None):
    lhs, rhs = _arr("broadcast_like", lhs, "lhs"), _arr("broadcast_like", rhs, "rhs")
    if lhs_axes is not None or rhs_axes is not None:
        shape = list(lhs.shape)
        for la, ra in zip(norm_axes("broadcast_like", lhs.ndim, lhs_axes), norm_axes("broadcast_like", rhs.ndim,
                                                                                         rhs_axes)):
            shape[la] = rhs.shape[ra]
        return call("broadcast_to", lhs, shape=tuple(shape))
    return call("broadcast_to", lhs, shape=rhs.shape)


def broadcast_axis(data, axis=(), size=()):
    data = _arr("broadcast_axis", data)
    axes = norm_axes("broadcast_axis", data.ndim, axis)
    sizes = size if isinstance(size, (tuple, list)) else (size,)
    shape = list(data.shape)
    for a, s in zip(axes, sizes):
        shape[a] = int(s)
    return call("broadcast_to", data, shape=tuple(shape))


def _slice_axis(x, axis, begin, end):
    from ._indexing import slice_axis
    return slice_axis(x, axis, begin, end)


# -- concat / stack / split ---------------------------------------------------------------------------------------

def _concat_check(*xs, dim=1, num_args=None):
    if not xs:
        raise DnnbindValueError("concat: needs at least one array")
    nd0 = xs[0].ndim
    axis = norm_axes("concat", nd0, dim)[0]
    for i, x in enumerate(xs):
        if x.ndim != nd0 or any(x.shape[d] != xs[0].shape[d] for d in range(nd0) if d != axis):
            raise DnnbindValueError(f"concat: data[{i}] has shape {x.shape}, incompatible with data[0] {xs[0].shape} "
                             f"along dim {axis}")
        if x.dtype != xs[0].dtype:
            raise DnnbindTypeError(f"concat: data[{i}] has dtype {x.dtype}, data[0] {xs[0].dtype}")
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return axis, tuple(shape)


def _concat_gpu(meta, *xs, **_):
    axis, shape = meta
    out = empty(shape, xs[0].dtype, xs[0].device)
    out_strides = _lower.contiguous_strides(shape)
    pos = 0
    for x in xs:
        _lower.copy_strided(x, _lower.contiguous_strides(x.shape), 0, x.shape, out=out, out_strides=out_strides,
                            out_offset=pos * out_strides[axis])
        pos += x.shape[axis]
    return out


def _concat_grad(g, y, *xs, dim=1, **_):
    axis = norm_axes("concat", xs[0].ndim, dim)[0]
    grads, pos = [], 0
    for x in xs:
        grads.append(_slice_axis(g, axis, pos, pos + x.shape[axis]))
        pos += x.shape[axis]
    return tuple(grads)


func("concat", _concat_check,
     lambda meta, *xs, **_: NDArray._from_numpy(np.concatenate([x._data for x in xs], axis=meta[0])),
     _concat_gpu, _concat_grad, arity=None, nd=("concat", "Concat"))


def stack(*data, axis=0, num_args=None):
    if not data:
        raise DnnbindValueError("stack: needs at least one array")
    data = tuple(_arr("stack", x, f"data[{i}]") for i, x in enumerate(data))
    a = norm_axes("stack", data[0].ndim + 1, axis)[0]
    return call("concat", *[expand_dims(x, a) for x in data], dim=a)


def split(data, num_outputs, axis=1, squeeze_axis=False):
    data = _arr("split", data)
    a = norm_axes("split", data.ndim, axis)[0]
    n = int(num_outputs)
    if n <= 0 or data.shape[a] % n:
        raise DnnbindValueError(f"split: axis {a} of size {data.shape[a]} cannot be split into {num_outputs} equal parts")
    step = data.shape[a] // n
    parts = [_slice_axis(data, a, i * step, (i + 1) * step) for i in range(n)]
    if squeeze_axis:
        parts = [squeeze(p, axis=a) for p in parts]
    return parts[0] if n == 1 else parts


# -- tile / repeat: reshape + broadcast + reshape (no kernels or gradients of their own) --------------------------

def _ints(op: str, name: str, v, kind: str) -> tuple:
    """MXNet's parsing of an int (or tuple-of-ints) parameter: a float, a str or None is refused, not truncated."""
    items = v if isinstance(v, (tuple, list)) and kind == "Shape(tuple)" else (v,)
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in items):
        raise DnnbindTypeError(f"Invalid Parameter format for {name} expect {kind} but value={v!r}, in operator {op}")
    return tuple(int(i) for i in items)


def tile(data, reps):
    data = _arr("tile", data)
    reps = _ints("tile", "reps", reps, "Shape(tuple)")
    nd = max(data.ndim, len(reps))
    shape = (1,) * (nd - data.ndim) + data.shape
    reps = (1,) * (nd - len(reps)) + reps
    if any(r < 0 for r in reps):
        raise DnnbindValueError(f"tile: reps {reps} has a negative entry (data shape {data.shape})")
    check_size("tile", tuple(r * s for r, s in zip(reps, shape)), data.dtype, data.device,
               f"tiling {data.shape} by {reps}")
    inter = tuple(v for s in shape for v in (1, s))
    target = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    x = call("broadcast_to", _view(data, inter), shape=target)
    return _view(x, tuple(r * s for r, s in zip(reps, shape)))


def repeat(data, repeats, axis=None):
    data = _arr("repeat", data)
    r = _ints("repeat", "repeats", repeats, "int")[0]
    if axis is None:
        data, a = _view(data, (data.size,)), 0
    else:
        a = norm_axes("repeat", data.ndim, axis)[0]
    if r < 0:
        raise DnnbindValueError(f"repeat: repeats cannot be a negative number, got {r} (data shape {data.shape})")
    check_size("repeat", data.shape[:a] + (data.shape[a] * r,) + data.shape[a + 1:], data.dtype, data.device,
               f"repeating {data.shape} {r} times along axis {a}")
    inter = data.shape[:a + 1] + (1,) + data.shape[a + 1:]
    target = data.shape[:a + 1] + (r,) + data.shape[a + 1:]
    x = call("broadcast_to", _view(data, inter), shape=target)
    return _view(x, data.shape[:a] + (data.shape[a] * r,) + data.shape[a + 1:])


# -- the composites' registry entries (nd.*, NDArray methods, MXNet's parameter parsing, the symbol executor) ------

composite("reshape", reshape, nd=("reshape", "Reshape"))
composite("expand_dims", expand_dims)
composite("squeeze", squeeze)
composite("flatten", flatten)
composite("swapaxes", swapaxes, nd=("swapaxes", "SwapAxis"))
composite("broadcast_like", broadcast_like)
composite("broadcast_axis", broadcast_axis, nd=("broadcast_axis", "broadcast_axes"))
composite("stack", stack)
composite("split", split, nd=("split", "SliceChannel"))
composite("tile", tile)


def rnn_param_concat(*data, num_args=None, dim=1):
    """MXNet's ``_rnn_param_concat``: what an exported Gluon RNN layer writes to join its parameters into the fused
    operator's vector; Concat, whose inputs' deferred shapes MXNet infers from the RNN node."""
    return call("concat", *data, dim=dim)


composite("_rnn_param_concat", rnn_param_concat, nd=())
composite("repeat", repeat)


def shape_array(data):
    """MXNet's shape_array: the shape as an int64 array on the data's device (no gradient)."""
    from ..runtime.array import array
    data = _arr("shape_array", data)
    return array(np.array(data.shape, dtype=np.int64), device=data.device)


def size_array(data):
    """MXNet's size_array: the element count as a 1-element int64 array on the data's device."""
    from ..runtime.array import array
    data = _arr("size_array", data)
    return array(np.array([data.size], dtype=np.int64), device=data.device)


def slice_like(data, shape_like, axes=()):
    """MXNet's slice_like: ``data`` cut to ``shape_like``'s extent on ``axes`` (all axes when empty), from 0."""
    data, like = _arr("slice_like", data), _arr("slice_like", shape_like, "shape_like")
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    if not axes:
        if like.ndim != data.ndim:
            raise DnnbindValueError(f"slice_like: data {data.shape} and shape_like {like.shape} must have the same "
                                    f"number of dimensions when axes is empty")
        axes = tuple(range(data.ndim))
    key = [slice(None)] * data.ndim
    for a in axes:
        ax = norm_axes("slice_like", data.ndim, a)[0]
        la = norm_axes("slice_like", like.ndim, a)[0]
        if like.shape[la] > data.shape[ax]:
            raise DnnbindValueError(f"slice_like: shape_like {like.shape} is larger than data {data.shape} on axis {a}")
        key[ax] = slice(0, like.shape[la])
    return call("_basic_index", data, key=tuple(key))


_INT64 = typed(out=lambda p, t: [np.dtype(np.int64)])
composite("shape_array", shape_array, dtype=_INT64)
composite("size_array", size_array, dtype=_INT64)
composite("slice_like", slice_like, dtype=typed(own=(1,)))
