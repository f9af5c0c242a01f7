"""Layer 0 (_lib): NVRTC, the CUDA C++ run-time compiler, through ``cuda.bindings.nvrtc``.

Imports nothing of dnnbind but ``_lib.errors``. Unlike cudnn.py/cublas.py there are no ctypes prototypes
here: cuda-python already declares every NVRTC function (12.6+ and 13.x spell them the same), so this
module only turns its ``(status, *values)`` tuples into values or an ``NvrtcError``. Importing it loads
nothing; ``cuda.bindings`` is imported by the first call, which says what to install when it is missing.
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import LibraryNotFoundError, NvrtcError

__all__ = ["NvrtcError", "bindings", "call", "supported_archs", "version"]

NVRTC_SUCCESS = 0
NVRTC_ERROR_COMPILATION = 6

_HINT = ("Install cuda-python (`pip install cuda-bindings`) and NVRTC: `pip install nvidia-cuda-nvrtc-cu12`"
         " (CUDA 12) or `pip install nvidia-cuda-nvrtc` (CUDA 13).")

_nvrtc = None


def bindings():
    """The ``cuda.bindings.nvrtc`` module, imported on first use."""
    global _nvrtc
    if _nvrtc is None:
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:
            raise LibraryNotFoundError("nvrtc", _HINT, f"import cuda.bindings.nvrtc: {exc}") from None
        _nvrtc = nvrtc
    return _nvrtc


def error_name(status: int) -> str:
    """``NVRTC_ERROR_COMPILATION`` for 6; needs no library call, so it works while raising anything."""
    try:
        return bindings().nvrtcResult(int(status)).name
    except (ValueError, LibraryNotFoundError):  # an unknown code or no cuda.bindings: still say something
        return f"NVRTC status {int(status)}"


def call(function: str, *args: Any) -> Any:
    """Call ``cuda.bindings.nvrtc.<function>(*args)`` and check its status.

    Returns None, the single value, or a tuple of values (the binding's tuple minus the status).
    Raises NvrtcError(status, function, name) on failure; LibraryNotFoundError when NVRTC cannot be
    loaded (cuda.bindings finds it through cuda.pathfinder and raises its own errors, which we translate).
    """
    fn = getattr(bindings(), function)
    try:
        result = fn(*args)
    except (OSError, RuntimeError) as exc:  # dlopen failures surface here, on the first call
        if "nvrtc" in str(exc).lower() or "dynamiclib" in type(exc).__name__.lower():
            raise LibraryNotFoundError("nvrtc", _HINT, str(exc)) from None
        raise
    status = int(result[0])
    if status != NVRTC_SUCCESS:
        raise NvrtcError(status, function, error_name(status))
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return tuple(result[1:])


@functools.cache
def version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library actually loaded (not of cuda-python)."""
    major, minor = call("nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The SM numbers (e.g. 90 for sm_90) this NVRTC can emit CUBIN for, ascending."""
    return tuple(sorted(int(a) for a in call("nvrtcGetSupportedArchs")))
