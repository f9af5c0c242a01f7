"""Layer nd: ``sort``, ``argsort``, ``topk`` along an axis. Imports numpy, nd._registry/_lower/_indexing.

One table op, ``_sortk``, returns the first k values or indices of each lane, stable (ties keep their order);
on the GPU a generated rank-and-scatter kernel (kernels.strided.sort_along). The gradient of the values
scatters g back to where each value came from (a sum over a one-hot ``where``, so it is itself made of table
ops, and an inf in g stays at its own position).
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import numpy as np

from ..runtime.array import NDArray, empty
from . import _lower
from ..ops.opdef import typed
from ._registry import as_array, call, composite, func, norm_axes


def _check(x, axis=-1, k=0, is_ascend=True, ret="value", dtype="float32"):
    if x.ndim == 0:
        raise DnnbindValueError("sort/topk: needs an array of at least 1 dimension")
    a = norm_axes("topk", x.ndim, axis)[0]
    n = x.shape[a]
    k = n if k is None or k < 1 else int(k)  # MXNet: k < 1 sorts the whole axis
    if not 1 <= k <= n and k:
        raise DnnbindValueError(f"topk: k={k} must be in [1, {n}] for axis {a} of shape {x.shape}")
    if ret not in ("value", "indices"):
        raise DnnbindValueError(f"topk: ret_typ must be 'value', 'indices', 'both' or 'mask', got {ret!r}")
    return a, k, x.shape[:a] + (k,) + x.shape[a + 1:]


def _order(x, a, ascend):
    v = x if ascend else (-x if x.dtype.kind in "fi" else x.max() - x)
    return np.argsort(v, axis=a, kind="stable")


def _cpu(meta, x, axis=-1, k=0, is_ascend=True, ret="value", dtype="float32"):
    a, k, shape = meta
    idx = np.take(_order(x._data, a, is_ascend), np.arange(k), axis=a)
    if ret == "indices":
        return NDArray._from_numpy(np.asarray(idx.astype(dtype), order="C"))
    return NDArray._from_numpy(np.asarray(np.take_along_axis(x._data, idx, axis=a), order="C"))


def _gpu(meta, x, axis=-1, k=0, is_ascend=True, ret="value", dtype="float32"):
    a, k, shape = meta
    out = empty(shape, x.dtype if ret == "value" else np.dtype(dtype), x.device)
    if out.size:
        from ..runtime.stream import current_stream
        st = _lower.strided()
        st.sort_along(_lower.ref(x), x.shape, a, _lower.ref(out) if ret == "value" else None,
                      _lower.ref(out) if ret == "indices" else None, descending=not is_ascend, k=k,
                      stream=current_stream(x.device), device=x.device.index)
    return out


def _grad(g, y, x, axis=-1, k=0, is_ascend=True, ret="value", dtype="float32"):
    if ret != "value":
        return None
    from ._indexing import one_hot
    a, k, _ = _check(x, axis, k, is_ascend, ret)
    # int32 positions (float16 ones stop counting at 2048); a where, not a product (inf * 0 would be NaN)
    idx = call("_sortk", x, axis=a, k=k, is_ascend=is_ascend, ret="indices", dtype=np.dtype(np.int32))
    n = x.shape[a]
    hot = one_hot(_swap_last(idx, a), n, dtype=x.dtype)                 # (..., k, n)
    gl = _swap_last(g, a)                                               # (..., k)
    spread = call("sum", call("where", hot, gl.reshape(gl.shape + (1,)), 0.0), axis=-2)   # (..., n)
    return _swap_last(spread, a, inverse=True)


func("_sortk", _check, _cpu, _gpu, _grad, nd=(), params=("axis", "k", "is_ascend", "ret", "dtype"))


def _last_perm(nd, a, inverse):
    perm = [i for i in range(nd) if i != a] + [a]
    return tuple(np.argsort(perm)) if inverse else tuple(perm)


def _swap_last(x, axis=0, inverse=False):
    return call("transpose", x, axes=_last_perm(x.ndim, axis, inverse)) if axis != x.ndim - 1 else x



def sort(data, axis=-1, is_ascend=True):
    data = as_array("sort", "data", data)
    if axis is None:
        data, axis = data.reshape((data.size,)), 0
    return call("_sortk", data, axis=axis, k=0, is_ascend=is_ascend, ret="value")


def argsort(data, axis=-1, is_ascend=True, dtype="float32"):
    data = as_array("argsort", "data", data)
    if axis is None:
        data, axis = data.reshape((data.size,)), 0
    return call("_sortk", data, axis=axis, k=0, is_ascend=is_ascend, ret="indices", dtype=dtype)


def topk(data, axis=-1, k=1, ret_typ="indices", is_ascend=False, dtype="float32"):
    data = as_array("topk", "data", data)
    if axis is None:
        data, axis = data.reshape((data.size,)), 0
    if ret_typ == "both":
        return [topk(data, axis, k, "value", is_ascend, dtype), topk(data, axis, k, "indices", is_ascend, dtype)]
    if ret_typ == "mask":
        idx = topk(data, axis, k, "indices", is_ascend, data.dtype)
        from ._indexing import one_hot
        a = norm_axes("topk", data.ndim, axis)[0]
        hot = one_hot(_swap_last(idx, a), data.shape[a], dtype=data.dtype)
        return _swap_last(call("sum", hot, axis=-2), a, inverse=True)
    return call("_sortk", data, axis=axis, k=k, is_ascend=is_ascend, ret=ret_typ, dtype=dtype)


def _topk_types(p, t):
    idx = np.dtype(p["dtype"])
    return {"value": [t], "indices": [idx], "both": [t, idx], "mask": [t]}[p["ret_typ"]]


composite("sort", sort)
composite("argsort", argsort, dtype=typed(out=lambda p, t: [np.dtype(p["dtype"])]))
composite("topk", topk, dtype=typed(out=_topk_types))
