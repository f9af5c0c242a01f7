"""Layer kernels: element-wise kernels from a parameter list and a loop body (CuPy's ElementwiseKernel).

Imports numpy and its siblings compiler.py and launch.py (hence dnnbind._lib); dnnbind.runtime only
through launch.py's lazy stream lookup.

    add2 = elementwise("add2", "const float* a, const float* b, float* c", "c[i] = a[i] + b[i];")
    add2(a, b, c)            # c has n elements; n and the grid are chosen for you

The generated kernel is ``extern "C" __global__ void add2(<params>, long long n)`` running ``body`` in a
grid-stride loop over ``long long i`` in [0, n): one launch covers any n with a grid capped at
32 blocks per SM, and 64-bit indices keep arrays past 2**31 elements correct.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .compiler import compile as compile_kernel
from .launch import Kernel, current_device, multiprocessor_count

__all__ = ["ElementwiseKernel", "elementwise"]

BLOCK = 256  # a multiple of the warp size that keeps every SM full at any occupancy limit we hit
BLOCKS_PER_SM = 32  # grid cap: enough resident blocks to hide latency; the loop covers the rest

# C parameter type (qualifiers and '*' removed) -> (numpy dtype of the elements, ctypes type of a scalar).
_C_TYPES: dict[str, tuple[Any, Any]] = {
    "float": (np.float32, ctypes.c_float), "double": (np.float64, ctypes.c_double),
    "__half": (np.float16, None), "half": (np.float16, None),
    "bool": (np.bool_, ctypes.c_bool),
    "char": (np.int8, ctypes.c_int8), "signed char": (np.int8, ctypes.c_int8), "int8_t": (np.int8, ctypes.c_int8),
    "unsigned char": (np.uint8, ctypes.c_uint8), "uint8_t": (np.uint8, ctypes.c_uint8),
    "short": (np.int16, ctypes.c_int16), "int16_t": (np.int16, ctypes.c_int16),
    "unsigned short": (np.uint16, ctypes.c_uint16), "uint16_t": (np.uint16, ctypes.c_uint16),
    "int": (np.int32, ctypes.c_int32), "int32_t": (np.int32, ctypes.c_int32),
    "unsigned": (np.uint32, ctypes.c_uint32), "unsigned int": (np.uint32, ctypes.c_uint32),
    "uint32_t": (np.uint32, ctypes.c_uint32),
    "long long": (np.int64, ctypes.c_int64), "long long int": (np.int64, ctypes.c_int64),
    "int64_t": (np.int64, ctypes.c_int64), "ptrdiff_t": (np.int64, ctypes.c_int64),
    "unsigned long long": (np.uint64, ctypes.c_uint64), "uint64_t": (np.uint64, ctypes.c_uint64),
    "size_t": (np.uint64, ctypes.c_uint64),
}
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict)\b|\*")
_PARAM = re.compile(r"^(?P<type>.*?)\b(?P<name>[A-Za-z_]\w*)\s*$", re.DOTALL)


@dataclass(frozen=True)
class _Param:
    name: str
    pointer: bool
    const: bool
    dtype: np.dtype | None  # element type for pointers, value type for scalars; None when unknown
    ctype: Any  # ctypes type for scalars we know; None passes the argument through as given


def _parse_params(params: str) -> list[_Param]:
    out = []
    for piece in params.split(","):
        m = _PARAM.match(piece.strip())
        if not m or not m.group("type").strip():
            raise DnnbindValueError(f"cannot parse parameter {piece.strip()!r}: write 'type name', e.g. 'const float* x'")
        ctype_text, name = m.group("type"), m.group("name")
        if name in ("i", "n"):
            raise DnnbindValueError(f"parameter name {name!r} is taken: the loop index is i and the size is n")
        base = " ".join(_QUALIFIERS.sub(" ", ctype_text).split())
        dtype, scalar = _C_TYPES.get(base, (None, None))
        pointer = "*" in ctype_text
        const = re.search(r"\bconst\b", ctype_text.split("*")[0]) is not None
        out.append(_Param(name, pointer, const, None if dtype is None else np.dtype(dtype),
                          None if pointer else scalar))
    return out


def _size_of(a: Any) -> int | None:
    shape = getattr(a, "shape", None)
    if isinstance(shape, tuple):  # NDArray, CuPy, torch (torch.Size is a tuple); cheaper than .size
        return math.prod(shape)
    size = getattr(a, "size", None)
    if type(size) is int:
        return size
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(np.prod(cai["shape"], dtype=np.int64))
    return None


def _dtype_of(a: Any) -> np.dtype | None:
    dtype = getattr(a, "dtype", None)
    if isinstance(dtype, np.dtype):
        return dtype
    cai = getattr(a, "__cuda_array_interface__", None)
    return np.dtype(cai["typestr"]) if cai is not None else None


class ElementwiseKernel:
    """``kernel(*args, n=None, stream=None)`` runs ``body`` for i in [0, n).

    n defaults to the size of the output: the last non-const pointer parameter. Array arguments must be
    on the GPU (dnnbind NDArray, CuPy, torch, anything with ``__cuda_array_interface__``), hold the
    declared element type, and, with ``check_sizes`` on, have n elements. Scalars are converted to the
    declared C type, so ``double alpha`` receives a double from a Python float.
    """

    def __init__(self, name: str, params: str, body: str, preamble: str = "",
                 options: Sequence[str] = (), block: int = BLOCK, check_sizes: bool = True):
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise DnnbindValueError(f"kernel name must be a C identifier, got {name!r}")
        self.name = name
        self.params = _parse_params(params)
        self.block = int(block)
        if not 1 <= self.block <= 1024:
            raise DnnbindValueError(f"{name}: block must be 1..1024 threads, got {block}")
        self.options = tuple(options)
        self.check_sizes = check_sizes
        outputs = [k for k, p in enumerate(self.params) if p.pointer and not p.const]
        self._out = outputs[-1] if outputs else None
        self.source = (
            f"{preamble}\n"
            f'extern "C" __global__ void {name}({params}, long long n) {{\n'
            f"    const long long stride = (long long)gridDim.x * blockDim.x;\n"
            f"    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{\n"
            f"        {body}\n"
            f"    }}\n"
            f"}}\n")
        self._kernels: dict[int, Kernel] = {}  # device -> kernel compiled for its arch

    def __repr__(self) -> str:
        return f"<dnnbind.kernels.ElementwiseKernel {self.name}>"

    def kernel(self, arch: Any = None) -> Kernel:
        """Compile (cached) for ``arch``, by default the current GPU's; useful to warm up or inspect."""
        return compile_kernel(self.source, self.name, self.options, arch)

    def __call__(self, *args: Any, n: int | None = None, stream: Any = None) -> None:
        params = self.params
        if len(args) != len(params):
            raise DnnbindTypeError(f"{self.name} takes {len(params)} arguments"
                            f" ({', '.join(p.name for p in params)}), got {len(args)}")
        if n is None and (self._out is None or (n := _size_of(args[self._out])) is None):
            raise DnnbindTypeError(f"{self.name}: pass n=... (no output array whose size is known)")
        values = []
        for p, a in zip(params, args):
            if p.pointer:
                if p.dtype is not None:
                    dtype = _dtype_of(a)
                    if dtype is not None and dtype != p.dtype:
                        raise DnnbindTypeError(f"{self.name}: {p.name} is declared {p.dtype} but got a {dtype} array")
                if self.check_sizes:
                    size = _size_of(a)
                    if size is not None and size != n:
                        raise DnnbindValueError(f"{self.name}: {p.name} has {size} elements, expected n = {n}")
                values.append(a)
            elif p.ctype is not None and not isinstance(a, ctypes._SimpleCData):
                values.append(p.ctype(a))
            else:
                values.append(a)
        if n <= 0:
            return
        values.append(ctypes.c_int64(n))
        device = current_device()
        kernel = self._kernels.get(device)
        if kernel is None:
            kernel = self._kernels[device] = self.kernel()
        grid = min(-(-n // self.block), multiprocessor_count(device) * BLOCKS_PER_SM)
        kernel._launch(device, (grid, 1, 1), (self.block, 1, 1), values, stream, 0)


def elementwise(name: str, params: str, body: str, preamble: str = "", options: Sequence[str] = (),
                block: int = BLOCK, check_sizes: bool = True) -> ElementwiseKernel:
    """An element-wise kernel: ``body`` runs for each ``i < n`` with ``params`` in scope.

    Compiles lazily, on the first call on each device (so defining one at import costs nothing).
    ``preamble`` goes before the kernel (helpers, ``#include``s).
    """
    return ElementwiseKernel(name, params, body, preamble, options, block, check_sizes)
