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
                                       "Install it: `pip install 'cuda-python>=12.9,<13'`.", str(exc)) from None
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
    if int(err) == 0 and count > 0:
        return int(count), ""
    return 0, explain_no_gpu(_version("cudaDriverGetVersion"), _version("cudaRuntimeGetVersion"),
                             _bindings_version(), int(err),
                             f"{getattr(err, 'name', err)} - {error_string(err)}" if int(err) else "")


def _version(name: str) -> int:
    try:
        err, value = getattr(rt(), name)()
        return int(value) if int(err) == 0 else 0
    except Exception:
        return 0


def _bindings_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "cuda-python"


def _cuda(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


# NOTE: a CUDA runtime runs on any driver of its own major version or newer (CUDA's minor-version
# compatibility), never on an older major one. cuda-bindings 13.x carries the CUDA 13 runtime (driver R580+);
# cuda-bindings 12.x carries CUDA 12's, which CUDA 12 and CUDA 13 drivers both run. That is why the default
# install pins cuda-python below 13 (pyproject.toml).
FIX_OLD_DRIVER = "pip install 'cuda-python>=12.9,<13'"


def explain_no_gpu(driver: int, runtime: int, bindings: str, err: int, err_text: str) -> str:
    """Why no GPU is usable, from what was found: ``driver`` and ``runtime`` are CUDA versions as the runtime
    reports them (12040 = 12.4; a driver of 0 means no driver library could be loaded), ``bindings`` names the
    cuda-python package, ``err``/``err_text`` are cudaGetDeviceCount's status (0 when it counted no device).
    A pure function: tests feed it each case on a machine without a GPU."""
    if driver == 0:
        return "no NVIDIA driver found (libcuda.so.1 could not be loaded; install one to use a GPU)"
    if runtime and driver // 1000 < runtime // 1000:
        return (f"the NVIDIA driver supports CUDA {_cuda(driver)}, older than the CUDA {_cuda(runtime)} runtime "
                f"of the installed {bindings}, which needs a CUDA {runtime // 1000} driver. Fix: {FIX_OLD_DRIVER} "
                f"(its CUDA 12 runtime runs on CUDA 12 and 13 drivers), or update the driver")
    if err in (0, 100):  # counted none, or cudaErrorNoDevice
        return f"no CUDA device found (driver CUDA {_cuda(driver)}, runtime CUDA {_cuda(runtime)})"
    return (f"cudaGetDeviceCount: {err_text} (driver CUDA {_cuda(driver)}, runtime CUDA {_cuda(runtime)}, "
            f"{bindings})")


# -- which CUDA context is current on this thread ----------------------------------------------------------------
# Device.activate() asks this before every stream-taking call: CUDA refuses a copy, a launch or a library call on a
# stream of another device, and the current device is per-thread state that other code (torch.cuda.set_device,
# CuPy, a raw cudaSetDevice) may change behind dnnbind's back. cuCtxGetCurrent through ctypes costs ~0.2 us; the
# cuda.bindings wrapper would cost several times that on a path taken by every op.
_ctx_get: list = []
_ctx_out = None


def current_context() -> int:
    """The CUcontext current on this thread as an int; 0 when none is, or there is no driver."""
    global _ctx_out
    if not _ctx_get:
        import ctypes
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent
        except OSError:  # no driver: no context can be current (Device.activate reports the missing GPU itself)
            return 0
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p]
        _ctx_out = ctypes.c_void_p()
        _ctx_get.append((fn, ctypes.addressof(_ctx_out)))
    fn, out = _ctx_get[0]
    if fn(out):
        return 0
    return _ctx_out.value or 0


_ctx_set: list = []


def use_context(ctx: int) -> None:
    """Make CUcontext ``ctx`` (from current_context()) current on this thread unless it is (cuCtxSetCurrent): a
    replayed recording restores the device each of its calls was recorded on."""
    if not ctx or current_context() == ctx:
        return
    if not _ctx_set:
        import ctypes
        fn = ctypes.CDLL("libcuda.so.1").cuCtxSetCurrent
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p]
        _ctx_set.append(fn)
    err = _ctx_set[0](ctx)
    if err:
        from .errors import CudaDriverError
        raise CudaDriverError(int(err), "cuCtxSetCurrent", f"CUresult {err}", f"restoring context {ctx:#x}")
