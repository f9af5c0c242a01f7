"""Layer kernels: kernel arguments -> the ctypes values and the void*[] cuLaunchKernel reads.

Imports numpy and ctypes only. One dict lookup per argument on the hot path (the converter of its type), so
packing costs about a microsecond per launch; ``check_arg_sizes`` compares the packed sizes with the kernel's
declared parameter sizes where the driver reports them.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError

import ctypes
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# numpy scalars keep their exact C type. float16 has no ctypes twin: its 16 bits go as a uint16, which is
# what a __half parameter holds.
_NUMPY_CTYPES: dict[type, type] = {
    np.float32: ctypes.c_float, np.float64: ctypes.c_double,
    np.int8: ctypes.c_int8, np.int16: ctypes.c_int16, np.int32: ctypes.c_int32, np.int64: ctypes.c_int64,
    np.uint8: ctypes.c_uint8, np.uint16: ctypes.c_uint16, np.uint32: ctypes.c_uint32,
    np.uint64: ctypes.c_uint64, np.bool_: ctypes.c_bool,
}
# C long / long long numpy aliases (np.longlong, np.intc...) are the same classes on Linux, but map any
# numpy integer type we did not list by its size, so no platform alias falls through.
_CTYPE_BY_KIND_SIZE = {("i", 1): ctypes.c_int8, ("i", 2): ctypes.c_int16, ("i", 4): ctypes.c_int32,
                       ("i", 8): ctypes.c_int64, ("u", 1): ctypes.c_uint8, ("u", 2): ctypes.c_uint16,
                       ("u", 4): ctypes.c_uint32, ("u", 8): ctypes.c_uint64, ("f", 4): ctypes.c_float,
                       ("f", 8): ctypes.c_double, ("b", 1): ctypes.c_bool}


def _int32(a: int) -> ctypes.c_int32:
    if not _INT32_MIN <= a <= _INT32_MAX:
        raise OverflowError(
            f"Python int {a} does not fit in int32, which is what a Python int becomes; pass np.int64(...)"
            " or np.uint64(...) for a 64-bit parameter, or ctypes.c_void_p(ptr) (or an array object) for a"
            " device pointer")
    return ctypes.c_int32(a)


def _half(a: np.float16) -> ctypes.c_uint16:
    return ctypes.c_uint16(int(a.view(np.uint16)))


def _host_array(a: np.ndarray) -> Any:
    raise DnnbindTypeError("a numpy array lives in host memory; copy it to the GPU first"
                    " (dnnbind.array(x, device='gpu'))")


def _same(a: Any) -> Any:
    return a  # a ctypes value: the caller chose the exact C type


def _null(a: None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None)  # a NULL pointer, for optional pointer parameters


def _ptr_attr(a: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ptr)  # an array object of another library with an int .ptr


def _nd_array(a: Any) -> ctypes.c_void_p:
    if a.on_gpu:  # a dnnbind NDArray: its .ptr is 0 on the cpu, which must not become a NULL argument
        return ctypes.c_void_p(a.ptr)
    raise DnnbindTypeError(f"an NDArray {a.shape} on the cpu lives in host memory; move it to the GPU first"
                           " (.to('gpu'))")


def _cai(a: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.__cuda_array_interface__["data"][0])  # CuPy, torch, numba, ...


def _handle(a: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(a))  # cuda.bindings CUdeviceptr and friends


# type -> converter. Filled on first sight of each type, so a launch does one dict lookup per argument
# instead of a chain of isinstance tests.
_CONVERTERS: dict[type, Callable[[Any], Any]] = {
    int: _int32, float: ctypes.c_float, bool: ctypes.c_bool, type(None): _null, np.ndarray: _host_array,
    np.float16: _half,
    **_NUMPY_CTYPES,
}


def _converter(a: Any) -> Callable[[Any], Any]:
    """Choose how to pass an argument of a type not seen before (the slow path, once per type)."""
    t = type(a)
    if issubclass(t, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union)):
        conv: Callable[[Any], Any] = _same
    elif issubclass(t, np.generic):
        ctype = _CTYPE_BY_KIND_SIZE.get((a.dtype.kind, a.dtype.itemsize))
        if ctype is None:
            raise DnnbindTypeError(f"numpy {a.dtype} scalars cannot be passed to a kernel")
        conv = ctype
    elif issubclass(t, np.ndarray):
        conv = _host_array
    elif type(getattr(a, "on_gpu", None)) is bool:  # a dnnbind NDArray
        conv = _nd_array
    elif type(getattr(a, "ptr", None)) is int:
        conv = _ptr_attr
    elif getattr(a, "__cuda_array_interface__", None) is not None:
        conv = _cai
    elif issubclass(t, bool):
        conv = ctypes.c_bool
    elif issubclass(t, int):  # IntEnum and other int subclasses
        def conv(v: Any) -> ctypes.c_int32:
            return _int32(int(v))
    elif issubclass(t, float):
        conv = ctypes.c_float
    elif t.__name__ in ("CUdeviceptr", "CUstream", "cudaStream_t"):
        conv = _handle
    else:
        raise DnnbindTypeError(f"cannot pass {t.__module__}.{t.__name__} to a kernel; use an array with .ptr or"
                        " __cuda_array_interface__, a number, a numpy scalar or a ctypes value")
    _CONVERTERS[t] = conv
    return conv


_POINTER_ARRAYS: dict[int, struct.Struct] = {}  # n -> the layout of a void*[n]


def pack_args(args: Iterable[Any]) -> tuple[list[Any], bytes]:
    """Kernel arguments -> (the ctypes values, a packed void*[] of their addresses) for cuLaunchKernel.

    Python int -> int32 (range-checked), float -> float32, bool -> bool, numpy scalar -> its exact type
    (float16 as its 16 bits), ctypes value -> itself, None -> NULL, an array with an int ``.ptr`` or
    ``__cuda_array_interface__`` -> its device pointer. The caller must keep both results alive until
    cuLaunchKernel returns: the driver copies the parameter bytes during the call.
    """
    holders: list[Any] = []
    append = holders.append
    get = _CONVERTERS.get
    try:
        for a in args:
            conv = get(type(a)) or _converter(a)
            append(conv(a))
    except (TypeError, OverflowError) as exc:
        raise type(exc)(f"kernel argument {len(holders)}: {exc}") from None
    n = len(holders)
    layout = _POINTER_ARRAYS.get(n)
    if layout is None:
        layout = _POINTER_ARRAYS[n] = struct.Struct(f"{n}P")
    # NOTE: bytes rather than a ctypes array: cuda.bindings reads kernelParams through the buffer protocol
    # (every version since 11.x), and struct.pack is ~1 us cheaper per launch than building a ctypes array.
    return holders, layout.pack(*map(ctypes.addressof, holders))


def check_arg_sizes(name: str, holders: list[Any], sizes: tuple[int, ...]) -> None:
    got = tuple(map(ctypes.sizeof, holders))
    if got == sizes:
        return
    if len(holders) != len(sizes):
        raise DnnbindTypeError(f"kernel '{name}' takes {len(sizes)} arguments, got {len(holders)}")
    i = next(i for i, (g, s) in enumerate(zip(got, sizes, strict=True)) if g != s)
    raise DnnbindTypeError(
        f"kernel '{name}' argument {i}: the kernel expects {sizes[i]} bytes, got {type(holders[i]).__name__}"
        f" ({got[i]} bytes); Python ints go as int32 and floats as float32, so pass a numpy scalar"
        " (np.int64, np.float64, ...) or a ctypes value of the right size")
