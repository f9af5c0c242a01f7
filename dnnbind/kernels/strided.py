"""Layer kernels: one NVRTC generator for strided element-wise, reduction, gather/scatter, sort and random kernels.

Imports its siblings (_strided_base, _strided_src, launch, elementwise for the grid constants) and
dnnbind._lib; never dnnbind.runtime: everything here works on raw device pointers, numpy dtypes, element
strides and a stream (a dnnbind Stream or an int handle), so the op table above can call it from any layer.

    from dnnbind.kernels.strided import Ref, strided_map
    strided_map("a + b", Ref(c.ptr, c.dtype, (128, 1)), [Ref(a.ptr, a.dtype, (128, 1)),
                Ref(b.ptr, b.dtype, (0, 1))], shape=(64, 128))          # b broadcast over the rows

Each call: coalesce the dimensions of all operands (drop size-1 dims, merge dims that are contiguous for every
operand), look the kernel up by (kind, expression, dtypes, rank after coalescing, scalar types, device), pack
pointers, shapes, strides and scalars into ONE by-value struct argument, and launch through ``Kernel._launch``
(so step recording and launch hooks see it). Shapes travel as arguments: one compiled kernel serves every
shape of its rank. The source text of every kernel comes from ``generate(key)`` in ``_strided_src.py`` (pure
Python, tested on the CPU); Ref, coalescing and the variant cache are in ``_strided_base.py``.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math
from collections.abc import Sequence
from typing import Any

from dnnbind._lib import cudart

from . import _strided_base
from ._strided_base import (
    CONTIGUOUS_LAYOUTS,
    GRID_CAPS,
    VARIANTS,
    Ref,
    check_rank,
    check_strides,
    coalesce,
    compile_variant,
    contiguous_layout,
    generate,
    grid_cap,
    launch_variant,
    normalize_axis,
    resolve_stream,
    scalar_signature,
    variant,
)
from ._strided_src import INPUT_NAMES, MAX_DIMS, RBLOCK, c_types
from .elementwise import BLOCK
from .devices import make_current
from .launch import multiprocessor_count

__all__ = ["MAX_DIMS", "Ref", "coalesce", "gather", "generate", "random_fill", "scatter_add", "sort_along",
           "strided_map", "strided_reduce"]

REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin")
DISTRIBUTIONS = ("uniform", "normal", "randint", "bernoulli")
_SPLIT_SLOTS = 65536  # partial results a split reduction may park per (device, stream): 1 MB of scratch
_SPLIT_COUNTERS = 4096  # one arrival counter per output block of a split reduction
_VEC = 4  # elements per thread and operand in the vectorized contiguous map (needs 4 * 8-byte alignment)
_MIN_PER_THREAD = 32  # a reduction is split over several blocks only when each thread still gets this many


_GEOMETRY: dict[tuple, tuple] = {}  # (shape, *strides) -> () if contiguous, else (shape, flat shape + strides)


def _map_geometry(geometry: tuple) -> tuple:
    """Coalesce a strided_map's operands (cached: a training loop repeats the same few geometries)."""
    shape, *strides = geometry
    for k, st in enumerate(strides):
        if len(st) != len(shape):
            what = "out" if k == 0 else f"input {INPUT_NAMES[k - 1]}"
            raise DnnbindValueError(f"strided_map: {what} has {len(st)} strides {st} for shape {shape}")
    sh, st = coalesce(shape, strides)
    check_rank("strided_map", sh)
    extra: tuple = ()
    if len(sh) != 1 or any(s[0] != 1 for s in st):  # else it coalesced to contiguous after all
        extra = (sh, [*sh, *(v for s in st for v in s)])
    if len(_GEOMETRY) < 4096:
        _GEOMETRY[geometry] = extra
    return extra


# --- element-wise --------------------------------------------------------------------------------------

def strided_map(expr: str, out: Ref, inputs: Sequence[Ref], shape: tuple[int, ...],
                scalars: Sequence[tuple[str, Any]] = (), stream: Any = None, device: int | None = None,
                name: str = "dn_map", current: bool = False) -> None:
    """For every index I of ``shape``: out[I] = (out type)(expr), the inputs named a, b, c, ... in order.

    Each input is loaded as its own C type (float16 as float); scalars are declared ``double`` for a Python
    float, ``long long`` for an int, ``bool`` for a bool, and a numpy scalar's own type. ``name`` names the
    kernel (traces show it). ``current``: the caller made ``device`` current (an op under
    runtime.exec_context; with an int ``stream`` and ``device``). Nothing launches for a size-0 shape; rank 0 is one
    element.
    """
    if type(shape) is not tuple:
        shape = tuple(shape)
    strides, n = CONTIGUOUS_LAYOUTS.get(shape) or contiguous_layout(shape)
    if n == 0:
        return
    # The hot path (a + b on same-shape contiguous arrays) is spelled out for one and two inputs: every
    # avoided comprehension is a few hundred ns of the ~5 us a small op may cost.
    nin = len(inputs)
    if nin == 2:
        a, b = inputs
        dtypes: tuple = (a.dtype, b.dtype)
        contiguous = out.strides == strides and a.strides == strides and b.strides == strides
        values = [out.addr, a.addr, b.addr, n]
        bits = out.addr | a.addr | b.addr
    elif nin == 1:
        a = inputs[0]
        dtypes = (a.dtype,)
        contiguous = out.strides == strides and a.strides == strides
        values = [out.addr, a.addr, n]
        bits = out.addr | a.addr
    else:
        if nin > len(INPUT_NAMES):
            raise DnnbindValueError(f"strided_map: at most {len(INPUT_NAMES)} inputs ({', '.join(INPUT_NAMES)}),"
                             f" got {nin}")
        dtypes = tuple([r.dtype for r in inputs])
        contiguous = out.strides == strides and all(r.strides == strides for r in inputs)
        values = [out.addr, *[r.addr for r in inputs], n]
        bits = out.addr
        for r in inputs:
            bits |= r.addr
    ndim = 0
    if not contiguous:
        geometry = (shape, out.strides, *[r.strides for r in inputs])
        extra = _GEOMETRY.get(geometry)
        if extra is None:
            extra = _map_geometry(geometry)
        if extra:
            ndim = len(extra[0])
            values += extra[1]
    # Contiguous with every pointer 32-byte aligned (any allocation, most views): each thread moves 4
    # elements per operand with one wide load and store, as PyTorch's vectorized kernels do.
    vec = _VEC if ndim == 0 and not bits & (_VEC * 8 - 1) else 1
    if scalars:
        sig, svalues = scalar_signature("strided_map", scalars)
        values[nin + 2:nin + 2] = svalues  # the scalars follow n in the argument struct
    else:
        sig = ()
    key = ("map", name, expr, out.dtype, dtypes, ndim, sig, vec)
    packer, holder, kernels = VARIANTS.get(key) or variant(key)
    if device is None or type(stream) is not int:
        device, stream = resolve_stream(stream, device)
        current = False  # resolved here, not made current by the caller
    kernel = kernels.get(device) or compile_variant(key, device)
    grid = -(-n // (BLOCK * vec))
    cap = GRID_CAPS.get(device) or grid_cap(device)
    kernel.launch_struct(device, min(cap, grid), BLOCK, holder.from_buffer_copy(packer.pack(*values)), stream,
                         current)


# --- reductions ----------------------------------------------------------------------------------------

_scratch: dict[tuple[int, int], tuple[int, int, int]] = {}


def _split_scratch(device: int, h: int) -> tuple[int, int, int] | None:
    """(values, indices, counters) pointers for split reductions on (device, stream), allocated once (on the
    current device) and never freed (1 MB). None while the stream is being captured and nothing was allocated
    before: the reduction then runs unsplit, which is correct, only slower. One buffer per stream: launches on
    one stream run in order, so they never share it at the same time."""
    key = (device, h)
    s = _scratch.get(key)
    if s is None:
        if int(cudart.call("cudaStreamIsCapturing", h)):
            return None
        nbytes = _SPLIT_SLOTS * 16 + _SPLIT_COUNTERS * 4
        make_current(device)  # the scratch lives on the stream's device, and the memset is queued on that stream
        ptr = int(cudart.call("cudaMalloc", nbytes))
        # The counters must start at zero; each split launch leaves them at zero again when it finishes.
        cudart.call("cudaMemsetAsync", ptr + _SPLIT_SLOTS * 16, 0, _SPLIT_COUNTERS * 4, h)
        s = _scratch[key] = (ptr, ptr + _SPLIT_SLOTS * 8, ptr + _SPLIT_SLOTS * 16)
    return s


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def reduce_layout(n_out: int, n_red: int, red_fast: bool, sms: int) -> tuple[int, int, int]:
    """(threads per output ``rt``, outputs per block ``ot``, splits): how a reduction is spread.

    ``red_fast``: the reduced elements are the closer ones in memory (a row reduction): the ``rt`` threads of
    an output are adjacent lanes. Otherwise (a column reduction) adjacent lanes take adjacent outputs.
    ``splits`` > 1 spreads each output over that many blocks (few outputs, many elements each).
    """
    if red_fast:
        rt = min(RBLOCK, _pow2(n_red))
        ot = max(1, min(RBLOCK // rt, _pow2(n_out)))
    elif n_red <= 1 or n_out >= 4 * sms * RBLOCK:  # enough outputs for one thread each
        rt, ot = 1, min(RBLOCK, _pow2(n_out))
    else:
        ot = min(32, _pow2(n_out))
        rt = min(RBLOCK // ot, _pow2(n_red))
    blocks = -(-n_out // ot)
    target = sms * (2048 // RBLOCK)  # enough resident blocks to fill every SM: memory latency needs them
    splits = 1
    if blocks < target and n_red >= 2 * rt * _MIN_PER_THREAD and blocks <= _SPLIT_COUNTERS:
        splits = min(-(-target // blocks), n_red // (rt * _MIN_PER_THREAD), 65535, _SPLIT_SLOTS // n_out)
        splits = max(splits, 1)
    return rt, ot, splits


def strided_reduce(op: str, x: Ref, shape: tuple[int, ...], axes: Sequence[int], out: Ref, map_expr: str = "a",
                   post_expr: str = "acc", scalars: Sequence[tuple[str, Any]] = (), stream: Any = None,
                   device: int | None = None, name: str | None = None) -> None:
    """out = post(reduce_op(map(a) over ``axes``)); out is contiguous with ``shape`` minus ``axes``.

    op: sum, prod, max, min (NaN propagates), argmax, argmin (index along the flattened reduced axes, first
    occurrence on ties, the first NaN wins; written in out's dtype; post_expr is not applied). The
    accumulator type follows map(a): float for float16/float32, double for float64, long long for integers
    and bools. post_expr sees ``acc`` and the scalars. An empty reduction gives sum 0 and prod 1; the others
    need at least one element.
    """
    if op not in REDUCE_OPS:
        raise DnnbindValueError(f"strided_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
    geometry = (shape if type(shape) is tuple else tuple(shape), x.strides,
                axes if type(axes) is tuple else tuple(axes))
    geo = _REDUCE_GEOMETRY.get(geometry) or _reduce_geometry(geometry)  # validates before any library call
    n_out, n_red, rk, rr, dims, red_fast = geo
    if n_out == 0:
        return
    if n_red == 0 and op not in ("sum", "prod"):
        raise DnnbindValueError(f"strided_reduce: {op} over zero elements (shape {shape}, axes {axes})")
    if scalars:
        sig, svalues = scalar_signature("strided_reduce", scalars)
    else:
        sig, svalues = (), []
    key = ("reduce", name or _OP_NAMES[op], op, map_expr, post_expr, x.dtype, out.dtype, rk, rr, sig)
    if key not in VARIANTS:
        variant(key)  # validates dtypes and names before any library call
    device, h = resolve_stream(stream, device)
    rt, ot, splits, chunk, grid_x = _REDUCE_LAYOUTS.get((geo[:2], red_fast, device)) or _layout(geo, device)
    scratch = (0, 0, 0)
    if splits > 1:
        scratch = _scratch.get((device, h)) or _split_scratch(device, h)
        if scratch is None:  # capturing with no scratch yet: run unsplit (correct, only slower)
            splits, chunk, scratch = 1, n_red, (0, 0, 0)
            grid_x = min(-(-n_out // ot), grid_cap(device))
    launch_variant(key, device, h, (grid_x, splits, 1), rt * ot,
            [x.addr, out.addr, *scratch, n_out, n_red, chunk, rt, ot, red_fast, *svalues, *dims])


_OP_NAMES = {op: f"dn_{op}" for op in REDUCE_OPS}
_REDUCE_GEOMETRY: dict[tuple, tuple] = {}  # (shape, x strides, axes) -> coalesced dims
_REDUCE_LAYOUTS: dict[tuple, tuple] = {}  # ((n_out, n_red), red_fast, device) -> launch layout


def _reduce_geometry(geometry: tuple) -> tuple:
    """Coalesce the kept and the reduced dims separately (cached: loops repeat their shapes)."""
    shape, strides, axes = geometry
    nd = len(shape)
    if len(strides) != nd:
        raise DnnbindValueError(f"strided_reduce: x has {len(strides)} strides {strides} for shape {shape}")
    axset = sorted({normalize_axis("strided_reduce", a, nd) for a in axes})
    kept = [d for d in range(nd) if d not in axset]
    n_out = math.prod(shape[d] for d in kept)
    n_red = math.prod(shape[d] for d in axset)
    ksh, (kst,) = coalesce([shape[d] for d in kept], [[strides[d] for d in kept]])
    rsh, (rst,) = coalesce([shape[d] for d in axset], [[strides[d] for d in axset]]) if n_red else ((), [()])
    check_rank("strided_reduce", ksh)
    check_rank("strided_reduce", rsh)
    # Row or column: are the reduced elements the ones closer together in memory?
    red_fast = not kst or bool(rst) and min(map(abs, rst)) <= min(map(abs, kst))
    geo = (n_out, n_red, len(ksh), len(rsh), [*ksh, *kst, *rsh, *rst], int(red_fast))
    if len(_REDUCE_GEOMETRY) < 4096:
        _REDUCE_GEOMETRY[geometry] = geo
    return geo


def _layout(geo: tuple, device: int) -> tuple:
    n_out, n_red, red_fast = geo[0], geo[1], geo[5]
    rt, ot, splits = reduce_layout(n_out, n_red, bool(red_fast), multiprocessor_count(device))
    chunk = -(-n_red // splits) if n_red else 0
    if splits > 1:
        splits = -(-n_red // chunk)
    blocks = -(-n_out // ot)
    layout = (rt, ot, splits, chunk, blocks if splits > 1 else min(blocks, grid_cap(device)))
    if len(_REDUCE_LAYOUTS) < 4096:
        _REDUCE_LAYOUTS[(geo[:2], red_fast, device)] = layout
    return layout


# --- gather / scatter ----------------------------------------------------------------------------------

def _take_geometry(what: str, data_shape: tuple, axis: int, idx_shape: tuple, data: Ref, idx: Ref, it: Ref,
                   mode: str) -> tuple[int, tuple, list, tuple]:
    """Shared by gather and scatter_add: the iteration space is data_shape with ``axis`` replaced by idx_shape;
    ``it`` is the operand that spans it (gather's out, scatter's src)."""
    if mode not in ("clip", "wrap"):
        raise DnnbindValueError(f"{what}: mode must be 'clip' or 'wrap', got {mode!r}")
    nd = len(data_shape)
    axis = normalize_axis(what, axis, nd)
    space = data_shape[:axis] + idx_shape + data_shape[axis + 1:]
    check_strides(what, "data", data, nd)
    check_strides(what, "indices", idx, len(idx_shape))
    check_strides(what, "out" if what == "gather" else "src", it, len(space))
    if data_shape[axis] == 0 and math.prod(space):
        raise DnnbindValueError(f"{what}: cannot index into axis {axis} of length 0 (shape {data_shape})")
    ni = len(idx_shape)
    data_st = data.strides[:axis] + (0,) * ni + data.strides[axis + 1:]
    idx_st = (0,) * axis + idx.strides + (0,) * (nd - axis - 1)
    return axis, space, [it.strides, data_st, idx_st], (data_shape[axis], data.strides[axis])


def gather(x: Ref, x_shape: tuple[int, ...], indices: Ref, idx_shape: tuple[int, ...], axis: int, out: Ref,
           mode: str = "clip", stream: Any = None, device: int | None = None) -> None:
    """numpy.take(x, indices, axis, mode): out has shape x_shape[:axis] + idx_shape + x_shape[axis+1:].

    Float indices are truncated toward zero; "clip" clamps into range, "wrap" takes Python's modulo.
    """
    x_shape, idx_shape = tuple(x_shape), tuple(idx_shape)
    if out.dtype != x.dtype:
        raise DnnbindTypeError(f"gather: out is {out.dtype} but x is {x.dtype}; they must match")
    axis, space, strides, (length, axis_stride) = _take_geometry("gather", x_shape, axis, idx_shape, x, indices,
                                                                 out, mode)
    launch_take("gather", mode, space, strides, (out, x, indices), length, axis_stride, stream, device)


def scatter_add(src: Ref, idx: Ref, idx_shape: tuple[int, ...], axis: int, out: Ref, out_shape: tuple[int, ...],
                mode: str = "clip", stream: Any = None, device: int | None = None) -> None:
    """The adjoint of gather: out[..., k(j), ...] += src[..., j, ...] with atomicAdd (out is not zeroed here).

    src has shape out_shape[:axis] + idx_shape + out_shape[axis+1:]; out may be float32/64 or int32/64.
    """
    out_shape, idx_shape = tuple(out_shape), tuple(idx_shape)
    axis, space, strides, (length, axis_stride) = _take_geometry("scatter_add", out_shape, axis, idx_shape, out,
                                                                 idx, src, mode)
    launch_take("scatter_add", mode, space, strides, (src, out, idx), length, axis_stride, stream, device)


def launch_take(kind: str, mode: str, space: tuple, strides: list, refs: tuple, length: int, axis_stride: int,
                stream: Any, device: int | None) -> None:
    """Launch the ``kind`` ("gather" or "scatter_add") kernel over an iteration space given directly: ``refs``
    and ``strides`` are (out, data, index) for gather and (src, out, index) for scatter_add, the picked element is
    ``index * axis_stride`` from the data's offset, indices clipped or wrapped into ``length``. gather and
    scatter_add call this after _take_geometry; nd's pick calls it with a geometry of its own."""
    n = math.prod(space)
    if n == 0:
        return
    sh, st = coalesce(space, strides)
    check_rank(kind, sh)
    key = (kind, mode, tuple(r.dtype for r in refs), len(sh))
    values = [r.addr for r in refs] + [n, length, axis_stride, *sh]
    for s in st:
        values += s
    if key not in VARIANTS:
        variant(key)  # validates dtypes and names before any library call
    device, h = resolve_stream(stream, device)
    launch_variant(key, device, h, (min(-(-n // BLOCK), grid_cap(device)), 1, 1), BLOCK, values)


# --- sort ----------------------------------------------------------------------------------------------

def sort_along(x: Ref, shape: tuple[int, ...], axis: int, values_out: Ref | None, indices_out: Ref | None,
               descending: bool = False, k: int | None = None, stream: Any = None, device: int | None = None) -> None:
    """Stable sort of every lane along ``axis``, keeping the first ``k`` (all by default; topk).

    values_out (x's dtype) and indices_out (any int or float dtype) are contiguous with ``shape`` but ``axis``
    of length k. NaN sorts as the largest value (last ascending, first descending), ties keep index order.
    Each element counts the lane elements that sort before it (O(n) per element), stopping once k of them do: a
    full sort costs n * n compares per lane (meant for lanes up to a few thousand elements), a topk about
    k * n * log(n) (an element of rank r stops after about k * n / r).
    """
    shape = tuple(shape)
    nd = len(shape)
    axis = normalize_axis("sort_along", axis, nd)
    check_strides("sort_along", "x", x, nd)
    length = shape[axis]
    k = length if k is None else int(k)
    if not 0 <= k <= length:
        raise DnnbindValueError(f"sort_along: k must be in [0, {length}] for axis {axis} of shape {shape}, got {k}")
    if values_out is None and indices_out is None:
        raise DnnbindValueError("sort_along: give values_out, indices_out or both")
    if values_out is not None and values_out.dtype != x.dtype:
        raise DnnbindTypeError(f"sort_along: values_out is {values_out.dtype} but x is {x.dtype}; they must match")
    n = math.prod(shape)
    if n == 0 or k == 0:
        return
    out_st, _ = contiguous_layout(shape[:axis] + (k,) + shape[axis + 1:])
    lanes = [d for d in range(nd) if d != axis]
    sh, st = coalesce([shape[d] for d in lanes], [[x.strides[d] for d in lanes], [out_st[d] for d in lanes]])
    check_rank("sort_along", sh)
    key = ("sort", bool(descending), x.dtype, None if values_out is None else values_out.dtype,
           None if indices_out is None else indices_out.dtype, len(sh))
    values = [x.addr, 0 if values_out is None else values_out.addr, 0 if indices_out is None else indices_out.addr,
              n, length, x.strides[axis], k, out_st[axis], *sh, *st[0], *st[1]]
    if key not in VARIANTS:
        variant(key)  # validates dtypes and names before any library call
    device, h = resolve_stream(stream, device)
    launch_variant(key, device, h, (min(-(-n // BLOCK), grid_cap(device)), 1, 1), BLOCK, values)


# --- random --------------------------------------------------------------------------------------------

def random_fill(out: Ref, n: int, dist: str, seed: int, offset: int, p0: float, p1: float, stream: Any = None,
                device: int | None = None) -> None:
    """Fill n contiguous elements at out: uniform U[p0, p1), normal N(p0, p1**2), randint in [p0, p1), or
    bernoulli (1 with probability p0, else 0).

    Counter-based (Philox4x32-10 keyed by ``seed``, counter ``offset + i``): element i depends only on
    (seed, offset, i), so results reproduce, continue a sequence when ``offset`` advances by n, and stay
    valid inside CUDA graphs.
    """
    if dist not in DISTRIBUTIONS:
        raise DnnbindValueError(f"random_fill: dist must be one of {DISTRIBUTIONS}, got {dist!r}")
    c_types(out.dtype, "random_fill")  # TypeError for an unsupported dtype, before anything else
    if dist in ("uniform", "normal") and out.dtype.kind != "f":
        raise DnnbindTypeError(f"random_fill: {dist} needs a float out, got {out.dtype}")
    i0 = i1 = 0
    if dist == "randint":
        i0, i1 = int(p0), int(p1)
        if i1 <= i0:
            raise DnnbindValueError(f"random_fill: randint needs low < high, got [{i0}, {i1})")
    if n <= 0:
        return
    key = ("random", dist, out.dtype)
    mask = (1 << 64) - 1
    values = [out.addr, n, seed & mask, offset & mask, float(p0), float(p1), i0, i1]
    if key not in VARIANTS:
        variant(key)  # validates dtypes and names before any library call
    device, h = resolve_stream(stream, device)
    launch_variant(key, device, h, (min(-(-n // BLOCK), grid_cap(device)), 1, 1), BLOCK, values)


def clear_cache() -> None:
    """Forget compiled variants and launch plans held here (compiler.clear_memory_cache() forgets the code)."""
    _strided_base.clear_cache()
    _REDUCE_LAYOUTS.clear()
