"""Layer kernels: the plumbing under strided.py: Ref, dimension coalescing, scalar signatures, ``generate``
(variant key -> CUDA source), the cache of compiled variants, and the launch of the one by-value argument
struct through ``Kernel._launch`` (which step recording and launch hooks see).

Imports numpy, ctypes, its siblings (_strided_src, _reduce_src, compiler, launch, elementwise) and nothing of
dnnbind.runtime (launch.py finds dnnbind's current device and stream lazily).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import functools
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._reduce_src import reduce_source
from ._strided_src import MAX_DIMS, map_source, random_source, sort_source, take_source
from .compiler import compile as compile_kernel
from .elementwise import BLOCKS_PER_SM
from .launch import Kernel, compute_capability, current_device, multiprocessor_count, stream_handle


class Ref:
    """A view of device memory: element (i0..ik) is at ptr + (offset + sum(i_d * strides[d])) * itemsize.

    Strides are in elements and may be 0 (broadcast) or negative (reversed slices).
    """

    __slots__ = ("addr", "dtype", "offset", "ptr", "strides")

    def __init__(self, ptr: int, dtype: Any, strides: Sequence[int], offset: int = 0):
        self.ptr = ptr
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.strides = strides if type(strides) is tuple else tuple(strides)
        self.offset = offset
        self.addr = ptr + offset * self.dtype.itemsize  # the first element; the kernels see only this

    def __repr__(self) -> str:
        return f"Ref(0x{self.ptr:x}, {self.dtype}, strides={self.strides}, offset={self.offset})"


# --- shapes --------------------------------------------------------------------------------------------

# shape -> (C-contiguous strides, size): the fast path's lookup. strided_map and nd's map ops read the dict
# directly (``CONTIGUOUS_LAYOUTS.get(shape) or contiguous_layout(shape)``): one dict lookup per call on a hit.
CONTIGUOUS_LAYOUTS: dict[tuple, tuple[tuple, int]] = {}


def contiguous_layout(shape: tuple) -> tuple[tuple, int]:
    info = CONTIGUOUS_LAYOUTS.get(shape)
    if info is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        info = (tuple(reversed(strides)), math.prod(shape))
        if len(CONTIGUOUS_LAYOUTS) < 4096:  # bounded: a program with endless shapes must not grow this forever
            CONTIGUOUS_LAYOUTS[shape] = info
    return info


def coalesce(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], list[tuple]]:
    """Drop size-1 dims and merge dims d, d+1 wherever stride[d] == stride[d+1] * shape[d+1] for EVERY
    operand. The row-major linear index over the result equals the one over ``shape``.

    >>> coalesce((2, 3, 4), [(12, 4, 1), (0, 0, 1)])
    ((6, 4), [(4, 1), (0, 1)])
    """
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out_shape and all(o[-1] == s[d] * size for o, s in zip(out_strides, strides)):
            out_shape[-1] *= size
            for o, s in zip(out_strides, strides):
                o[-1] = s[d]
        else:
            out_shape.append(size)
            for o, s in zip(out_strides, strides):
                o.append(s[d])
    return tuple(out_shape), [tuple(o) for o in out_strides]


def check_rank(what: str, shape: tuple) -> None:
    if len(shape) > MAX_DIMS:
        raise DnnbindValueError(f"{what}: {len(shape)} dimensions remain after coalescing {shape}; the generated kernels"
                         f" support at most MAX_DIMS = {MAX_DIMS}")


def normalize_axis(what: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise DnnbindValueError(f"{what}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def check_strides(what: str, name: str, ref: Ref, ndim: int) -> None:
    if len(ref.strides) != ndim:
        raise DnnbindValueError(f"{what}: {name} has {len(ref.strides)} strides {ref.strides} for {ndim} dimensions")


# --- scalars -------------------------------------------------------------------------------------------

# Python/numpy type -> (C type the expression sees, struct code of its 8-byte slot in the argument struct)
_SCALAR_TYPES: dict[type, tuple[str, str]] = {
    float: ("double", "d"), int: ("long long", "q"), bool: ("bool", "q"),
    np.float64: ("double", "d"), np.float32: ("float", "d"), np.float16: ("float", "d"),
    np.int64: ("long long", "q"), np.int32: ("int", "q"), np.int16: ("short", "q"), np.int8: ("signed char", "q"),
    np.uint8: ("unsigned char", "q"), np.uint16: ("unsigned short", "q"), np.uint32: ("unsigned int", "q"),
    np.bool_: ("bool", "q"),
}


_SIGS: dict[tuple, tuple] = {}  # ((name, type), ...) -> (sig, whether a value needs int())


def scalar_signature(what: str, scalars: Sequence[tuple[str, Any]]) -> tuple[tuple[tuple[str, str, str], ...], list]:
    """((name, C type, struct code), ...) and the values, in order (struct.pack converts numpy scalars)."""
    names_types = tuple([(name, type(value)) for name, value in scalars])
    entry = _SIGS.get(names_types)
    if entry is None:
        for name, t in names_types:
            if t not in _SCALAR_TYPES:
                raise DnnbindTypeError(f"{what}: scalar {name!r} is a {t.__name__}; pass a Python or numpy number")
        # struct.pack("q") takes Python bools and numpy ints, but not numpy bools
        entry = _SIGS[names_types] = (tuple((name, *_SCALAR_TYPES[t]) for name, t in names_types),
                                      any(t is np.bool_ for _, t in names_types))
    if entry[1]:
        return entry[0], [int(value) if type(value) is np.bool_ else value for _, value in scalars]
    return entry[0], [value for _, value in scalars]


# --- compiled variants ---------------------------------------------------------------------------------

_BUILDERS = {"map": map_source, "reduce": reduce_source, "gather": lambda *k: take_source("gather", *k),
             "scatter_add": lambda *k: take_source("scatter_add", *k), "sort": sort_source, "random": random_source}


@functools.lru_cache(maxsize=1024)
def generate(key: tuple) -> tuple[str, str, str]:
    """(CUDA source, kernel name, struct format of its one argument) for a variant key:

    ("map", name, expr, out dtype, input dtypes, ndim, scalar sig, vector width)
    ("reduce", name, op, map_expr, post_expr, x dtype, out dtype, kept ndim, reduced ndim, scalar sig)
    ("gather" | "scatter_add", mode, (operand dtypes), ndim)
    ("sort", descending, x dtype, values dtype | None, indices dtype | None, lane ndim)
    ("random", dist, out dtype)

    A scalar sig is ((name, C type, "d" or "q"), ...).
    """
    return _BUILDERS[key[0]](*key[1:])


_HOLDERS: dict[int, type] = {}  # argument struct size in bytes -> a ctypes Structure class of that size
VARIANTS: dict[tuple, tuple[struct.Struct, type, dict[int, Kernel]]] = {}  # key -> packer, holder, kernels
GRID_CAPS: dict[int, int] = {}


def _holder(nbytes: int) -> type:
    cls = _HOLDERS.get(nbytes)
    if cls is None:
        # Any Structure of the right size works: cuLaunchKernel copies sizeof(param) bytes from its address,
        # and Kernel._launch compares sizeof with the kernel's own parameter size.
        cls = _HOLDERS[nbytes] = type(f"dn_args{nbytes}", (ctypes.Structure,),
                                      {"_fields_": [("w", ctypes.c_int64 * (nbytes // 8))]})
    return cls


def variant(key: tuple) -> tuple[struct.Struct, type, dict[int, Kernel]]:
    """The argument packer and holder of the kernel ``key`` describes; generating its source validates the
    dtypes and names, so a TypeError/ValueError comes before any library call."""
    v = VARIANTS.get(key)
    if v is None:
        _, _, fmt = generate(key)
        packer = struct.Struct("=" + fmt)
        v = VARIANTS[key] = (packer, _holder(packer.size), {})
    return v


def compile_variant(key: tuple, device: int) -> Kernel:
    """Compile (memory and disk cached) the kernel ``key`` describes for ``device``'s architecture."""
    source, name, _ = generate(key)
    kernel = VARIANTS[key][2][device] = compile_kernel(source, name, (), compute_capability(device))
    return kernel


def resolve_stream(stream: Any, device: int | None) -> tuple[int, int]:
    """(device, stream handle): a dnnbind Stream's own device, else dnnbind's current one (made current)."""
    if device is None:
        dev = getattr(stream, "device", None)
        if dev is not None and getattr(dev, "kind", None) == "gpu":
            dev.activate()
            device = dev.index
        else:
            device = current_device()
    return device, stream if type(stream) is int else stream_handle(stream, device)


def grid_cap(device: int) -> int:
    cap = GRID_CAPS.get(device)
    if cap is None:
        cap = GRID_CAPS[device] = multiprocessor_count(device) * BLOCKS_PER_SM
    return cap


def launch_variant(key: tuple, device: int, h: int, grid: tuple, block: int, values: Sequence[Any]) -> None:
    """Launch the variant (``variant(key)`` was called before the device was resolved)."""
    packer, holder, kernels = VARIANTS[key]
    kernel = kernels.get(device) or compile_variant(key, device)
    if grid[1] == 1 and grid[2] == 1:
        kernel.launch_struct(device, grid[0], block, holder.from_buffer_copy(packer.pack(*values)), h)
    else:
        kernel._launch(device, grid, (block, 1, 1), (holder.from_buffer_copy(packer.pack(*values)),), h, 0)


def clear_cache() -> None:
    """Forget compiled variants held here (compiler.clear_memory_cache() forgets the code itself)."""
    VARIANTS.clear()
    generate.cache_clear()
