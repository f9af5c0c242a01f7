"""MXNet's indexing operators: ``gather_nd``, ``scatter_nd`` (``nd.gather_nd``, ``nd.scatter_nd``),
``_contrib_boolean_mask`` and ``_contrib_index_copy`` (``nd.contrib.boolean_mask``, ``nd.contrib.index_copy``).

- gather_nd(data, indices): indices (M, ...) index the first M axes of data; the output is indices.shape[1:] +
  data.shape[M:]. A negative index counts from the end (-size <= i < size, MXNet's ``(i + size) % size``); on the
  cpu an index outside that range is refused (MXNet's bound check), on a GPU it is clamped (no host read). The
  gradient adds dy's rows into the gathered rows (repeated rows accumulate, MXNet's _backward_gather_nd).
- scatter_nd(data, indices, shape): zeros of ``shape`` with data's rows written at the indexed rows; the inverse
  layout of gather_nd. Negative indices are not wrapped (MXNet writes outside the output there): refused on the
  cpu, clamped on a GPU. Repeated rows are undefined in MXNet: the cpu keeps the last write (MXNet's cpu loop), a
  GPU adds them (its scatter is an atomic add). The gradient is gather_nd of dy (MXNet's).
- boolean_mask(data, index, axis=0): the rows of data (axis 0 only, as MXNet) where the 1-D ``index`` is nonzero.
  The output's size depends on the mask's values, which MXNet reads on the host: so does dnnbind, on both backends.
  On a GPU that copy SYNCHRONIZES the stream and cannot be recorded by hybridize() (a recorded graph would replay a
  stale count); use ``nd.where`` with a broadcast mask where the shape must stay fixed. The gradient puts dy's rows
  back at the kept rows, zeros elsewhere. Shape inference cannot know the count: it gives 0 (MXNet's unknown).
- index_copy(old_tensor, index_vector, new_tensor): old_tensor with row index_vector[i] replaced by new_tensor[i].
  The gradients: old_tensor's is dy with the copied rows zeroed, new_tensor's dy's copied rows (MXNet's backward).
  Indices outside [0, rows) are refused on the cpu (MXNet copies outside the data), clamped on a GPU; repeated
  indices are undefined in MXNet (the cpu keeps the last write; a GPU gives some mix).

Index inputs take no gradient and may be of any numeric type; float indices are truncated toward zero.

gpu (no host copy except boolean_mask's count): each indexed row becomes a flat row number, computed as float64 by
the table's element-wise ops (exact up to 2**53), then the table's ``take`` (a gather) and ``_take_backward`` (a
scatter-add with atomics) move whole rows of the data seen as (rows, K).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import array, zeros
from ..args import check_fits
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import gather_scatter as ref

GATHER, SCATTER, MASK, COPY = "gather_nd", "scatter_nd", "_contrib_boolean_mask", "_contrib_index_copy"
_MAX_M = 10  # MXNet's Shape<10>


class Geometry(NamedTuple):
    data_shape: tuple
    out_shape: tuple
    m: int = 0  # gather/scatter: the indexed axes
    rows: int = 0  # the indexed axes' product
    k: int = 0  # elements per row
    n: int = 0  # index columns


def _numeric(op: str, name: str, a) -> None:
    if a.dtype.kind not in "biuf":
        raise DnnbindTypeError(f"{op}: {name} must be numeric, got {a.dtype} (shape {tuple(a.shape)})")


def _index_shape(op: str, ishape: tuple, target: tuple, what: str) -> int:
    if len(ishape) < 2:
        raise DnnbindValueError(f"{op}: {op} requires index tensor to have at least 2 dimensions, (M, ...) with M "
                                f"the indexed axes; got indices of shape {ishape} ({what} {target})")
    m = ishape[0]
    if not 1 <= m <= min(len(target), _MAX_M):
        raise DnnbindValueError(f"{op}: indices {ishape} index M = {m} axes, but {what} {target} has {len(target)} "
                                f"(and at most {_MAX_M} are supported)")
    return m


def _flat_geometry(shape: tuple, m: int, ishape: tuple, out_shape: tuple, data_shape: tuple) -> Geometry:
    return Geometry(data_shape, out_shape, m, math.prod(shape[:m]), math.prod(shape[m:]), math.prod(ishape[1:]))


# gather_nd -----------------------------------------------------------------------------------------------------------

def _gather_out(dshape: tuple, ishape: tuple) -> tuple:
    m = _index_shape(GATHER, ishape, dshape, "data")
    return tuple(ishape[1:]) + tuple(dshape[m:])


def _gather_prepare(p, data, indices):
    _numeric(GATHER, "indices", indices)
    dshape, ishape = tuple(data.shape), tuple(indices.shape)
    out = _gather_out(dshape, ishape)
    check_fits(GATHER, data.device, data.dtype, "the output", out, f" (data {dshape}, indices {ishape})",
               cudnn=False)
    if 0 in dshape[:ishape[0]] and math.prod(ishape[1:]):
        raise DnnbindValueError(f"{GATHER}: cannot gather from an empty axis (data {dshape}, indices {ishape})")
    return _flat_geometry(dshape, ishape[0], ishape, out, dshape)


def _gather_infer(p, shapes):
    d, i = tuple(shapes[0]), tuple(shapes[1])
    return [d, i], [_gather_out(d, i)]


def _check_range(op: str, indices: np.ndarray, shape: tuple, lo_wraps: bool, what: str) -> None:
    """Refuse an index outside [-size, size) (gather) or [0, size) (scatter, index_copy), naming the first."""
    m = indices.shape[0] if indices.ndim > 1 else 1
    cols = indices.reshape(m, -1)
    for j in range(m):
        size = shape[j]
        v = cols[j].astype(np.float64)  # gather_nd compares the raw value, the others the truncated one
        v = v if lo_wraps else np.trunc(v)
        low = -size if lo_wraps else 0
        bad = np.flatnonzero(~((v >= low) & (v <= size - 1)))
        if bad.size:
            i = int(bad[0])
            raise DnnbindValueError(f"{op}: index {cols[j][i]} (indices[{j}], column {i}) is out of bounds for axis "
                                    f"{j} of size {size}: allowed [{low}, {size - 1}] ({what} {shape}, indices "
                                    f"{tuple(indices.shape)})")


def _gather_cpu_forward(c, x, indices):
    _check_range(GATHER, indices, x.shape, True, "data")
    return ref.gather_nd(x, indices), indices


def _gather_cpu_backward(c, indices, grads, dy):
    return ref.gather_nd_backward(dy, indices, c.geo.data_shape), None


def _flat_rows(indices, shape: tuple, m: int, wrap: bool):
    """(N,) float64 flat row numbers on the device: per axis trunc(i (+ size)) (mod size), clamped into the axis."""
    n = indices.size // m
    idx = view(table("cast", indices, dtype="float64"), (m, n))
    flat = None
    for j in range(m):
        size = float(shape[j])
        k = table("slice_axis", idx, axis=0, begin=j, end=j + 1)
        if wrap:  # MXNet: (static_cast<index_t>(i + size)) % size
            k = table("modulo", table("trunc", table("add", k, size)), size)
        else:
            k = table("trunc", k)
        k = table("clip", k, a_min=0.0, a_max=size - 1)
        flat = k if flat is None else table("add", table("multiply", flat, size), k)
    return view(flat, (n,))


def _gather_gpu_forward(c, x, indices):
    g = c.geo
    if g.n == 0 or g.k == 0:
        return zeros(g.out_shape, x.dtype, x.device), None
    rows = _flat_rows(indices, g.data_shape, g.m, True)
    return view(table("take", view(x, (g.rows, g.k)), rows, axis=0, mode="clip"), g.out_shape), rows


def _gather_gpu_backward(c, rows, grads, dy):
    g = c.geo
    if rows is None:
        return zeros(g.data_shape, dy.dtype, dy.device), None
    dx = table("_take_backward", view(dy, (g.n, g.k)), rows, shape=(g.rows, g.k), axis=0, mode="clip")
    return view(dx, g.data_shape), None


def _gather_samples(rng):
    x = rng.standard_normal
    yield {"data": x((3, 4, 2)), "indices": np.array([[0, 2, -1], [1, 3, 0]], np.float64)}, {}
    yield {"data": x((5, 3)), "indices": np.array([[4, 0, 4, -5]], np.float64)}, {}
    yield {"data": x((2, 3)), "indices": np.array([[[1, 0], [0, 1]], [[2, 0], [-1, 1]]], np.float64)}, {}


define(OpDef(GATHER, prepare=_gather_prepare, infer=_gather_infer, samples=_gather_samples, nograd=("indices",),
             cpu=Lowering(_gather_cpu_forward, _gather_cpu_backward),
             gpu=Lowering(_gather_gpu_forward, _gather_gpu_backward),
             doc="gather_nd: the elements (or slices) of data at the (M, ...) indices of its first M axes."))


# scatter_nd ----------------------------------------------------------------------------------------------------------

def _scatter_check(dshape: tuple, ishape: tuple, oshape: tuple) -> int:
    m = _index_shape(SCATTER, ishape, oshape, "the output shape")
    want = tuple(ishape[1:]) + tuple(oshape[m:])
    if dshape != want:
        raise DnnbindValueError(f"{SCATTER}: Invalid data, indices, and output shape combination for scatter_nd: "
                                f"data {dshape}, indices {ishape}, shape {oshape}; data must be {want} "
                                f"(indices.shape[1:] + shape[M:])")
    return m


def _scatter_prepare(p, data, indices):
    _numeric(SCATTER, "indices", indices)
    oshape = tuple(p["shape"])
    dshape, ishape = tuple(data.shape), tuple(indices.shape)
    _scatter_check(dshape, ishape, oshape)
    check_fits(SCATTER, data.device, data.dtype, "the output", oshape, f" (data {dshape}, indices {ishape})",
               cudnn=False)
    return _flat_geometry(oshape, ishape[0], ishape, oshape, dshape)


def _scatter_infer(p, shapes):
    d, i = tuple(shapes[0]), tuple(shapes[1])
    oshape = tuple(p["shape"])
    _scatter_check(d, i, oshape)
    return [d, i], [oshape]


def _scatter_cpu_forward(c, x, indices):
    _check_range(SCATTER, indices, c.geo.out_shape, False, "output shape")
    return ref.scatter_nd(x, indices, c.geo.out_shape), indices


def _scatter_cpu_backward(c, indices, grads, dy):
    return ref.scatter_nd_backward(dy, indices), None


def _scatter_gpu_forward(c, x, indices):
    g = c.geo
    if g.n == 0 or g.k == 0 or g.rows == 0:
        return zeros(g.out_shape, x.dtype, x.device), None
    rows = _flat_rows(indices, g.out_shape, g.m, False)
    y = table("_take_backward", view(x, (g.n, g.k)), rows, shape=(g.rows, g.k), axis=0, mode="clip")
    return view(y, g.out_shape), rows


def _scatter_gpu_backward(c, rows, grads, dy):
    g = c.geo
    if rows is None:
        return zeros(g.data_shape, dy.dtype, dy.device), None
    return view(table("take", view(dy, (g.rows, g.k)), rows, axis=0, mode="clip"), g.data_shape), None


def _scatter_samples(rng):
    x = rng.standard_normal
    yield {"data": x((3, 2)), "indices": np.array([[0, 2, 1], [1, 3, 0]], np.float64)}, {"shape": (3, 4, 2)}
    yield {"data": x((2,)), "indices": np.array([[1, 3]], np.float64)}, {"shape": (5,)}
    yield {"data": x((2, 2)), "indices": np.array([[[1, 0], [0, 2]], [[2, 0], [1, 1]]], np.float64)}, \
        {"shape": (3, 3)}


define(OpDef(SCATTER, prepare=_scatter_prepare, infer=_scatter_infer, samples=_scatter_samples, nograd=("indices",),
             cpu=Lowering(_scatter_cpu_forward, _scatter_cpu_backward),
             gpu=Lowering(_scatter_gpu_forward, _scatter_gpu_backward),
             doc="scatter_nd: zeros of ``shape`` with data written at the (M, ...) indices of its first M axes."))


# boolean_mask --------------------------------------------------------------------------------------------------------

def _mask_check(p, dshape: tuple, ishape: tuple) -> None:
    if p["axis"] != 0:
        raise DnnbindValueError(f"{MASK}: axis must be 0 (MXNet: Not supported yet), got {p['axis']} (data "
                                f"{dshape})")
    if len(dshape) < 1:
        raise DnnbindValueError(f"{MASK}: data must have at least one axis, got shape {dshape}")
    if len(ishape) != 1 or ishape[0] != dshape[0]:
        raise DnnbindValueError(f"{MASK}: index must be 1-D with one entry per row of data, ({dshape[0]},); got "
                                f"shape {ishape} (data {dshape})")


def _mask_prepare(p, data, index):
    _numeric(MASK, "index", index)
    _mask_check(p, tuple(data.shape), tuple(index.shape))
    return Geometry(tuple(data.shape), (0,) + tuple(data.shape[1:]))  # the count is the mask's, known at run time


def _mask_infer(p, shapes):
    d, i = tuple(shapes[0]), tuple(shapes[1])
    _mask_check(p, d, i)
    return [d, i], [(0,) + d[1:]]  # 0: unknown until the mask is read, as MXNet's (dynamic shape) inference


def _mask_cpu_forward(c, x, index):
    keep = ref.mask_positions(index)
    return x[keep], keep


def _mask_cpu_backward(c, keep, grads, dy):
    dx = np.zeros(c.geo.data_shape, dy.dtype)
    dx[keep] = dy
    return dx, None


def _mask_gpu_forward(c, x, index):
    # NOTE: a host copy of the mask (it synchronizes); the output's size is the count of its nonzero entries
    keep = ref.mask_positions(index.numpy())
    rest = c.geo.data_shape[1:]
    if keep.size == 0 or x.size == 0:
        return zeros((keep.size,) + rest, x.dtype, x.device), None
    pos = array(keep.astype(np.float64), device=x.device)
    return table("take", x, pos, axis=0, mode="clip"), pos


def _mask_gpu_backward(c, pos, grads, dy):
    if pos is None:
        return zeros(c.geo.data_shape, dy.dtype, dy.device), None
    return table("_take_backward", dy, pos, shape=c.geo.data_shape, axis=0, mode="clip"), None


def _mask_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3)), "index": np.array([0.0, 1, 1, 0])}, {}
    yield {"data": x((3, 2, 2)), "index": np.array([1.0, 0, 2])}, {"axis": 0}
    yield {"data": x((5,)), "index": np.array([0.0, 0, 0.5, 0, -1])}, {}


define(OpDef(MASK, prepare=_mask_prepare, infer=_mask_infer, samples=_mask_samples, nograd=("index",),
             cpu=Lowering(_mask_cpu_forward, _mask_cpu_backward), gpu=Lowering(_mask_gpu_forward, _mask_gpu_backward),
             doc="boolean_mask: the rows of data where the 1-D index is nonzero. Reads the mask on the host "
                 "(synchronizes on a GPU; not recordable by hybridize())."))


# index_copy ----------------------------------------------------------------------------------------------------------

def _copy_check(oshape: tuple, ishape: tuple, nshape: tuple) -> None:
    context = f" (old_tensor {oshape}, index_vector {ishape}, new_tensor {nshape})"
    if len(ishape) != 1:
        raise DnnbindValueError(f"{COPY}: index_vector must be 1-D{context}")
    if len(oshape) < 1 or len(oshape) != len(nshape):
        raise DnnbindValueError(f"{COPY}: old_tensor and new_tensor must have the same number of axes (at least 1)"
                                f"{context}")
    if nshape[0] != ishape[0]:
        raise DnnbindValueError(f"{COPY}: new_tensor must have one row per index, {ishape[0]}{context}")
    if oshape[0] < nshape[0] or oshape[1:] != nshape[1:]:
        raise DnnbindValueError(f"{COPY}: new_tensor's rows must have old_tensor's shape {oshape[1:]} and be no more "
                                f"than its {oshape[0]} rows{context}")


def _copy_prepare(p, old, index, new):
    _numeric(COPY, "index_vector", index)
    if new.dtype != old.dtype:
        raise DnnbindTypeError(f"{COPY}: new_tensor is {new.dtype} but old_tensor is {old.dtype}; they must share a "
                               "dtype")
    _copy_check(tuple(old.shape), tuple(index.shape), tuple(new.shape))
    return Geometry(tuple(old.shape), tuple(old.shape), n=index.shape[0])


def _copy_infer(p, shapes):
    o, i, n = (tuple(s) for s in shapes)
    _copy_check(o, i, n)
    return [o, i, n], [o]


def _copy_cpu_forward(c, old, index, new):
    if index.size:
        _check_range(COPY, index, old.shape, False, "old_tensor")
    return ref.index_copy(old, index, new), index


def _copy_cpu_backward(c, index, grads, dy):
    d_old, d_new = ref.index_copy_backward(dy, index)
    return (d_old if grads.needs[0] else None), None, (d_new if grads.needs[2] else None)


_STEPS: dict = {}  # (n, device) -> 1..n as float64 on the device, uploaded once


def _counting(n: int, device):
    a = _STEPS.get((n, device))
    if a is None:
        a = _STEPS[(n, device)] = array(np.arange(1, n + 1, dtype=np.float64), device=device)
    return a


def _copy_gpu_forward(c, old, index, new):
    g = c.geo
    if g.n == 0 or old.size == 0:
        return old.copy(), None
    rows = g.data_shape[0]
    idx = table("clip", table("trunc", table("cast", index, dtype="float64")), a_min=0.0, a_max=float(rows - 1))
    # src[r] = 1 + the position j of the new row copied to row r, 0 where none is (a scatter of 1..K)
    src = table("_take_backward", _counting(g.n, old.device), idx, shape=(rows,), axis=0, mode="clip")
    covered = view(table("greater", src, 0.0), (rows,) + (1,) * (len(g.data_shape) - 1))
    picked = table("take", new, table("clip", table("subtract", src, 1.0), a_min=0.0, a_max=float(g.n - 1)),
                   axis=0, mode="clip")
    return table("where", covered, picked, old), (idx, covered)


def _copy_gpu_backward(c, saved, grads, dy):
    if saved is None:
        return dy.copy() if grads.needs[0] else None, None, None
    idx, covered = saved
    d_old = table("where", covered, 0.0, dy) if grads.needs[0] else None
    d_new = table("take", dy, idx, axis=0, mode="clip") if grads.needs[2] else None
    return d_old, None, d_new


def _copy_samples(rng):
    x = rng.standard_normal
    yield {"old_tensor": x((5, 3)), "index_vector": np.array([0.0, 4, 2]), "new_tensor": x((3, 3))}, {}
    yield {"old_tensor": x((4, 2, 2)), "index_vector": np.array([3.0]), "new_tensor": x((1, 2, 2))}, {}
    yield {"old_tensor": x((3,)), "index_vector": np.array([2.0, 0, 1]), "new_tensor": x((3,))}, {}


define(OpDef(COPY, prepare=_copy_prepare, infer=_copy_infer, samples=_copy_samples, nograd=("index_vector",),
             cpu=Lowering(_copy_cpu_forward, _copy_cpu_backward), gpu=Lowering(_copy_gpu_forward, _copy_gpu_backward),
             doc="index_copy: old_tensor with row index_vector[i] replaced by new_tensor[i]."))
