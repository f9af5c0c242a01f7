"""Layer trace: readable C++ kernel names. CUPTI reports a kernel by its symbol (``_ZN5cudnn20pooling_fw_4d_...``);
``demangle`` turns it into ``cudnn::pooling_fw_4d_kernel<float, float, ...>(...)`` with the C++ runtime's own
demangler, ``__cxa_demangle`` from libstdc++, called through ctypes (no demangler of our own to keep in step with
the compilers' mangling). Imports nothing of dnnbind.

Never raises: a name that is not an Itanium-mangled symbol (NVRTC's ``extern "C"`` kernels such as ``fill_f32``,
names already readable), a name the demangler rejects, or a process without libstdc++ gives the name back as is.
"""
# ruff: noqa: BLE001  (a demangling failure leaves the name as it was, never an exception)

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_MISSING = ()  # the loaded functions once tried: (demangle, free), or empty where the library is missing


@functools.cache
def _functions() -> tuple:
    """(``__cxa_demangle``, libc ``free``), bound once on first use; () when either cannot be loaded."""
    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++"), ctypes.util.find_library("c++abi")):
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            continue
        if lib is None or not hasattr(lib, "__cxa_demangle"):
            continue
        fn = lib.__cxa_demangle
        # char* __cxa_demangle(const char* mangled_name, char* output_buffer, size_t* length, int* status)
        # NOTE: restype c_void_p, not c_char_p: the result is malloc'ed and must reach free() as the same pointer.
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_int)]
        try:
            free = ctypes.CDLL(None).free  # the process's malloc/free, the pair __cxa_demangle allocates with
        except (OSError, AttributeError):
            free = ctypes.CDLL(ctypes.util.find_library("c")).free
        free.restype, free.argtypes = None, [ctypes.c_void_p]  # void free(void* ptr)
        return fn, free
    return _MISSING


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """``name`` demangled (``"_ZN3foo3barEv"`` -> ``"foo::bar()"``); any other name unchanged.

    Only names starting with ``_Z`` are symbols: ``__cxa_demangle`` also reads a bare type encoding, so without
    that check a kernel named ``i`` or ``f`` would come back as ``int`` or ``float``.
    """
    if not name.startswith("_Z"):
        return name
    try:
        fns = _functions()
        if not fns:
            return name
        fn, free = fns
        status = ctypes.c_int(-1)
        ptr = fn(name.encode(), None, None, ctypes.byref(status))
        if not ptr:
            return name
        try:
            text = ctypes.string_at(ptr).decode(errors="replace")
        finally:
            free(ptr)
        return text if status.value == 0 and text else name
    except Exception:
        return name
