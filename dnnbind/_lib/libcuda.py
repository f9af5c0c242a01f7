"""Layer 0 (_lib): the three CUDA driver calls a Python training loop makes per op, through ctypes.

Imports the standard library only. Everything else in dnnbind reaches CUDA through cuda-python
(``cuda.bindings``): it is the maintained binding and gives every call's status as an enum. But its per-call
cost (~3 us for cuLaunchKernel, ~2-3 us for cudaMallocAsync/cudaFreeAsync: argument objects, buffer walks,
the status enum) is paid about three times for every small op, where PyTorch's whole op costs ~6 us. libcuda's
own functions through ctypes cost well under a microsecond each. They are the same driver entry points the
bindings reach: cuda.bindings dlopens libcuda.so.1, so the CDLL below is that same library; the runtime's
cudaMallocAsync/cudaFreeAsync are cuMemAllocAsync/cuMemFreeAsync on the current context's device.

Each function returns the CUresult as an int and never raises; the callers redo a failed call through
cuda.bindings (which raises with CUDA's error text) or raise with ``driver.CUresult``'s name. Where
libcuda.so.1 cannot be opened by that name (not Linux), ``available()`` is False and callers use the bindings.
"""

from __future__ import annotations

import ctypes
import threading

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False

launch_kernel = None  # (CUfunction, gx, gy, gz, bx, by, bz, shared_mem, CUstream, void** params, extra) -> int
mem_alloc_async = None  # (CUdeviceptr*, size_t, CUstream) -> int
mem_free_async = None  # (CUdeviceptr, CUstream) -> int


def available() -> bool:
    """Open libcuda.so.1 and declare the functions (once); False where it cannot be opened."""
    global _lib, _tried, launch_kernel, mem_alloc_async, mem_free_async
    if _tried:
        return _lib is not None
    with _lock:
        if not _tried:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                u, p, sz = ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t
                f = lib.cuLaunchKernel
                # params as c_char_p: a bytes object of packed pointers is passed as its buffer's address
                f.argtypes = [p, u, u, u, u, u, u, u, p, ctypes.c_char_p, p]
                f.restype = ctypes.c_int
                a = lib.cuMemAllocAsync
                a.argtypes = [ctypes.POINTER(ctypes.c_uint64), sz, p]
                a.restype = ctypes.c_int
                fr = lib.cuMemFreeAsync
                fr.argtypes = [ctypes.c_uint64, p]
                fr.restype = ctypes.c_int
                launch_kernel, mem_alloc_async, mem_free_async, _lib = f, a, fr, lib
            except (OSError, AttributeError):  # no such library, or a driver older than CUDA 11.2
                _lib = None
            _tried = True
    return _lib is not None
