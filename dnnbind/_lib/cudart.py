"""Layer 0 (_lib): the CUDA runtime through cuda-python's ``cuda.bindings.runtime``. Imports only _lib.errors.

cuda-python returns ``(err, *values)`` tuples and never raises; ``call`` turns a non-success ``err`` into
``CudaError`` naming the function and CUDA's own error string, and unwraps the values. The module is
imported on first use so ``import dnnbind`` works without cuda-python's runtime being usable.
"""

from __future__ import annotations

import functools

from .errors import CudaError, LibraryNotFoundError


@functools.lru_cache(maxsize=None)
def rt():
    try:
        from cuda.bindings import runtime
    except ImportError:  # cuda-python < 12.6 spells it cuda.cudart
        try:
            from cuda import cudart as runtime
        except ImportError as exc:
            raise LibraryNotFoundError("the CUDA runtime (cuda-python)",
                                       "Install it: `pip install 'cuda-python>=12.6'`.", str(exc)) from None
    return runtime


def error_string(err) -> str:
    try:
        e, s = rt().cudaGetErrorString(err)
        return s.decode() if isinstance(s, bytes) else str(s)
    except Exception:
        return ""


_fns: dict = {}


def call(name: str, *args):
    """``call("cudaMallocAsync", n, stream)`` -> the value(s) after the status; raises CudaError."""
    fn = _fns.get(name)
    if fn is None:
        fn = _fns[name] = getattr(rt(), name)
    result = fn(*args)
    err = result[0] if type(result) is tuple else result
    if err != 0:
        raise CudaError(int(err), name, f"{getattr(err, 'name', err)} - {error_string(err)}")
    if not isinstance(result, tuple) or len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def device_count() -> tuple[int, str]:
    """(number of GPUs, why none): never raises, so it can answer 'is there a GPU?' anywhere."""
    try:
        result = rt().cudaGetDeviceCount()
    except Exception as exc:
        return 0, f"cuda-python is unusable: {exc}"
    err, count = result[0], result[1]
    if int(err) != 0:
        return 0, f"cudaGetDeviceCount: {getattr(err, 'name', err)} - {error_string(err)}"
    if count == 0:
        return 0, "no CUDA device found"
    return int(count), ""
