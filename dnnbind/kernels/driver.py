"""Layer kernels: the CUDA driver API (cuda.bindings.driver), imported on first use, and its errors.

Imports dnnbind._lib.errors only. ``driver_call`` turns a non-success CUresult into CudaDriverError with the
driver's name for the code and, for the codes a kernel user meets, what to do about it.
"""

from __future__ import annotations

from typing import Any

from dnnbind._lib.errors import CudaDriverError, LibraryNotFoundError

_HINT = "Install cuda-python: `pip install cuda-bindings` (12.9+ runs on CUDA 12 and 13 drivers, 13.x needs a CUDA 13 driver)."

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201

_DRIVER_HINTS = {
    201: "no CUDA context is current on this thread (select a device with dnnbind first)",
    209: "the code was compiled for another GPU architecture; compile with arch=None on this GPU",
    218: "the PTX is for a newer GPU architecture than this one",
    222: "the PTX came from an NVRTC newer than the driver; update the driver or use a CUBIN arch"
         " this NVRTC supports",
    500: "no kernel of that name in the module: declare it extern \"C\" or pass its name expression",
    701: "too many resources requested (registers x threads, or shared memory); use smaller blocks",
}

_drv = None


def cuda_driver() -> Any:
    """cuda.bindings.driver; LibraryNotFoundError (saying what to install) where cuda-python is missing."""
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise LibraryNotFoundError("cuda.bindings", _HINT, str(exc)) from None
        _drv = driver
    return _drv


def driver_error_text(status: int) -> str:
    try:
        text = cuda_driver().CUresult(status).name
    except (ValueError, LibraryNotFoundError):  # an unknown code: the number is still in the error
        text = "unknown CUresult"
    hint = _DRIVER_HINTS.get(status)
    return f"{text} ({hint})" if hint else text


def driver_call(function: str, *args: Any, context: str = "") -> Any:
    """Call cuda.bindings.driver.<function>, raising CudaDriverError; returns the value(s) after status."""
    result = getattr(cuda_driver(), function)(*args)
    status = int(result[0])
    if status != CUDA_SUCCESS:
        raise CudaDriverError(status, function, driver_error_text(status), context)
    return result[1] if len(result) == 2 else tuple(result[1:]) or None
