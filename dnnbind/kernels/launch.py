"""Layer kernels: load compiled code on a device and launch its kernels.

Imports dnnbind._lib (cudart, errors), numpy, and cuda.bindings.driver on first use; dnnbind.runtime
lazily, only for dnnbind's current device and stream (without it: the CUDA runtime's current device and
the legacy default stream). Nothing here runs at import: a machine without a GPU can import
this module, pack arguments and validate launch configurations; only ``Kernel.launch`` needs a device.

The hot path of ``Kernel.launch`` is: normalize dims, one dict lookup for the per-device CUfunction, one
ctypes object per argument plus their addresses packed as a void*[], one ``cuLaunchKernel``. Everything
that needs a driver query (the module load, the kernel's thread limit and parameter sizes) happens once
per device.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from dnnbind._lib import cudart
from dnnbind._lib.cfunc import RECORDING
from dnnbind._lib.errors import CudaDriverError, CudaError, LibraryNotFoundError

__all__ = [
    "Dim3",
    "Kernel",
    "compute_capability",
    "current_device",
    "multiprocessor_count",
    "pack_args",
    "stream_handle",
]

Dim3 = tuple[int, int, int]

# hook(kernel_name, grid, block, stream_handle), called after each successful launch. The tracer appends
# here; with no hooks the whole cost is one truthiness test of this list.
_launch_hooks: list[Callable[[str, Dim3, Dim3, int], Any]] = []

_HINT = "Install cuda-python: `pip install cuda-bindings` (12.6+ or 13.x, matching your driver)."

# Hardware limits shared by every NVIDIA GPU since compute capability 3.0 (CUDA C Programming Guide,
# "Technical Specifications per Compute Capability"), checked before any driver call so that a bad
# configuration is reported with the kernel's name even on a machine without a GPU.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
# Above this much dynamic shared memory a kernel must opt in with cuFuncSetAttribute (sm_70+).
_DEFAULT_SMEM_LIMIT = 48 * 1024

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


def _driver():
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise LibraryNotFoundError("cuda.bindings", _HINT, str(exc)) from None
        _drv = driver
    return _drv


def _driver_error_text(status: int) -> str:
    try:
        text = _driver().CUresult(status).name
    except (ValueError, LibraryNotFoundError):  # an unknown code: the number is still in the error
        text = "unknown CUresult"
    hint = _DRIVER_HINTS.get(status)
    return f"{text} ({hint})" if hint else text


def _drv_call(function: str, *args: Any, context: str = "") -> Any:
    """Call cuda.bindings.driver.<function>, raising CudaDriverError; returns the value(s) after status."""
    result = getattr(_driver(), function)(*args)
    status = int(result[0])
    if status != CUDA_SUCCESS:
        raise CudaDriverError(status, function, _driver_error_text(status), context)
    return result[1] if len(result) == 2 else tuple(result[1:]) or None


# --- devices -------------------------------------------------------------------------------------------

_UNRESOLVED = object()
_runtime_module: Any = _UNRESOLVED
_cc: dict[int, int] = {}
_sms: dict[int, int] = {}
_gpu_devices: dict[int, Any] = {}  # index -> dnnbind Device, to skip its constructor on every launch


def _dnnbind_runtime() -> Any:
    """dnnbind.runtime when it imports, else None; looked up once, lazily, so that kernels work (on the CUDA
    runtime's current device and the legacy stream) even where dnnbind.runtime is unavailable."""
    global _runtime_module
    mod = _runtime_module
    if mod is _UNRESOLVED:
        try:
            import dnnbind.runtime as mod
            mod.default_device, mod.current_stream, mod.Device  # noqa: B018 - all must exist to be used
        except (ImportError, AttributeError):
            mod = None
        _runtime_module = mod
    return mod


def current_device() -> int:
    """The device a launch goes to: dnnbind's default device when it is a GPU (made current here, as the
    runtime's own ops do, so ``with dnnbind.gpu(1):`` applies to kernels too), else the CUDA runtime's
    current device. Raises CudaError when there is no usable GPU."""
    rt = _runtime_module if _runtime_module is not _UNRESOLVED else _dnnbind_runtime()
    if rt is not None:
        dev = rt.default_device()
        if dev.kind == "gpu":
            dev.activate()
            return dev.index
    err, dev = cudart.rt().cudaGetDevice()
    if err:
        raise CudaError(int(err), "cudaGetDevice", f"{getattr(err, 'name', err)} - {cudart.error_string(err)}",
                        "launching a kernel needs a GPU and the NVIDIA driver")
    return dev


def _stream_device(stream: Any) -> int:
    """A dnnbind Stream knows its device: launch there, whatever the default device is."""
    dev = getattr(stream, "device", None)
    if dev is not None and getattr(dev, "kind", None) == "gpu":
        dev.activate()
        return dev.index
    return current_device()


def current_device_or_none() -> int | None:
    """Like current_device(), but None without a GPU, a driver or cuda.bindings (compile-only use)."""
    try:
        return current_device()
    except (CudaError, LibraryNotFoundError):
        return None


def compute_capability(device: int) -> int:
    """10 * major + minor, e.g. 90 for an H100; cached per device."""
    cc = _cc.get(device)
    if cc is None:
        attr = cudart.rt().cudaDeviceAttr
        major = cudart.call("cudaDeviceGetAttribute", attr.cudaDevAttrComputeCapabilityMajor, device)
        minor = cudart.call("cudaDeviceGetAttribute", attr.cudaDevAttrComputeCapabilityMinor, device)
        cc = _cc[device] = 10 * int(major) + int(minor)
    return cc


def multiprocessor_count(device: int) -> int:
    n = _sms.get(device)
    if n is None:
        attr = cudart.rt().cudaDeviceAttr.cudaDevAttrMultiProcessorCount
        n = _sms[device] = int(cudart.call("cudaDeviceGetAttribute", attr, device))
    return n


# --- streams -------------------------------------------------------------------------------------------

def _default_stream_handle(device: int) -> int:
    """dnnbind's current stream on ``device`` when dnnbind.runtime is there, else 0 (legacy default)."""
    rt = _runtime_module if _runtime_module is not _UNRESOLVED else _dnnbind_runtime()
    if rt is None:
        return 0
    dev = _gpu_devices.get(device)
    if dev is None:
        dev = _gpu_devices[device] = rt.Device("gpu", device)
    return rt.current_stream(dev).handle


def stream_handle(stream: Any, device: int = 0) -> int:
    """An int cudaStream_t from None (dnnbind's current stream on ``device``), an int, a dnnbind stream
    (``.handle``), a torch stream (``.cuda_stream``), a CuPy stream (``.ptr``) or a cuda.bindings
    CUstream/cudaStream_t."""
    if stream is None:
        return _default_stream_handle(device)
    if type(stream) is int:
        return stream
    for attr in ("handle", "cuda_stream", "ptr"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(h)
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError(f"cannot use {type(stream).__name__} as a CUDA stream: pass an int handle or an"
                        " object with .handle") from None


# --- arguments -----------------------------------------------------------------------------------------

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
    raise TypeError("a numpy array lives in host memory; copy it to the GPU first"
                    " (dnnbind.array(x, device='gpu'))")


def _same(a: Any) -> Any:
    return a  # a ctypes value: the caller chose the exact C type


def _null(a: None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None)  # a NULL pointer, for optional pointer parameters


def _ptr_attr(a: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ptr)  # dnnbind NDArray (its .ptr raises, clearly, on a cpu array)


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
            raise TypeError(f"numpy {a.dtype} scalars cannot be passed to a kernel")
        conv = ctype
    elif issubclass(t, np.ndarray):
        conv = _host_array
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
        raise TypeError(f"cannot pass {t.__module__}.{t.__name__} to a kernel; use an array with .ptr or"
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


# --- launch configuration ------------------------------------------------------------------------------

def _dim3(dims: Any, what: str, kernel: str) -> Dim3:
    if type(dims) is int:
        return (dims, 1, 1)
    try:
        if not isinstance(dims, Sequence):
            return (operator.index(dims), 1, 1)
        if 1 <= len(dims) <= 3:
            d = tuple(operator.index(v) for v in dims)
            return d + (1,) * (3 - len(d))  # type: ignore[return-value]
    except TypeError:
        pass
    raise TypeError(f"kernel '{kernel}': {what} must be an int or a tuple of 1 to 3 ints, got {dims!r}")


def _check_config(kernel: str, grid: Dim3, block: Dim3, shared_mem: int,
                  max_threads: int = MAX_THREADS_PER_BLOCK) -> None:
    """Reject what the driver would reject, with the kernel's name and configuration in the message."""
    gx, gy, gz = grid
    bx, by, bz = block
    if (0 < bx <= 1024 and 0 < by <= 1024 and 0 < bz <= 64 and bx * by * bz <= max_threads
            and 0 < gx <= 2**31 - 1 and 0 < gy <= 65535 and 0 < gz <= 65535 and shared_mem >= 0):
        return  # the common case, in one expression: this runs on every launch
    threads = bx * by * bz
    if min(grid) < 1 or min(block) < 1:
        problem = "every grid and block dimension must be at least 1 (skip the launch when there is no work)"
    elif any(b > m for b, m in zip(block, MAX_BLOCK_DIM, strict=True)):
        problem = f"block dimensions may be at most {MAX_BLOCK_DIM}"
    elif threads > MAX_THREADS_PER_BLOCK:
        problem = f"a block of {threads} threads exceeds the limit of {MAX_THREADS_PER_BLOCK}"
    elif threads > max_threads:
        problem = (f"a block of {threads} threads exceeds this kernel's limit of {max_threads} (its register"
                   " use); use smaller blocks or __launch_bounds__")
    elif any(g > m for g, m in zip(grid, MAX_GRID_DIM, strict=True)):
        problem = f"grid dimensions may be at most {MAX_GRID_DIM}"
    else:
        problem = "shared_mem must be >= 0"
    raise ValueError(f"cannot launch kernel '{kernel}' with grid {grid}, block {block}: {problem}")


# --- kernels -------------------------------------------------------------------------------------------

class _Function:
    """What one device knows about one kernel: its CUfunction and the limits queried once at load."""

    __slots__ = ("handle", "max_threads", "param_sizes", "smem_optin")

    def __init__(self, handle: Any, max_threads: int, param_sizes: tuple[int, ...] | None):
        self.handle = handle
        self.max_threads = max_threads
        self.param_sizes = param_sizes
        self.smem_optin = _DEFAULT_SMEM_LIMIT


def _param_sizes(handle: Any) -> tuple[int, ...] | None:
    """Byte size of each kernel parameter (cuFuncGetParamInfo, CUDA 12.4+), or None where unavailable.

    NOTE: cuLaunchKernel copies as many bytes as the *kernel* declares from each pointer we give it, so a
    Python int (4 bytes) passed to a `long long` parameter would read 4 bytes of garbage. Knowing the sizes
    lets us refuse that mismatch instead.
    """
    get = getattr(_driver(), "cuFuncGetParamInfo", None)
    if get is None:
        return None
    sizes = []
    try:
        for index in range(4096):
            err, _offset, size = get(handle, index)
            if int(err) == CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                break
            if int(err) != CUDA_SUCCESS:
                return None
            sizes.append(int(size))
    except RuntimeError:  # bindings newer than the driver: the symbol is missing at call time
        return None
    return tuple(sizes)


class Kernel:
    """A compiled ``__global__`` function, launchable on any device its code supports.

    ``kernel.launch(grid, block, args)``, ``kernel(grid, block, args)`` (CuPy's RawKernel spelling) and
    ``kernel[grid, block](*args)`` (Numba's) are the same launch. grid and block are ints or 1-3 tuples.
    """

    def __init__(self, module: Any, name: str, lowered_name: str):
        self.module = module
        self.name = name  # what the user asked for: "add2_kernel", "scale<float>"
        self.lowered_name = lowered_name  # the symbol in the code: "add2_kernel", "_Z5scaleIfEvPT_S0_i"
        self._functions: dict[int, _Function] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<dnnbind.kernels.Kernel {self.name!r} ({self.module.kind} for {self.module.arch})>"

    def _function(self, device: int) -> _Function:
        with self._lock:
            fn = self._functions.get(device)
            if fn is None:
                handle = self.module._get_function(self.lowered_name, device, self.name)
                attr = _driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
                max_threads = int(_drv_call("cuFuncGetAttribute", attr, handle))
                fn = self._functions[device] = _Function(handle, max_threads, _param_sizes(handle))
            return fn

    def max_threads_per_block(self, device: int | None = None) -> int:
        """The largest block this kernel can run with on ``device`` (default: the current one)."""
        return self._function(current_device() if device is None else device).max_threads

    def launch(self, grid: Any, block: Any, args: Sequence[Any] = (), stream: Any = None,
               shared_mem: int = 0) -> None:
        """Enqueue the kernel on ``stream`` (None: dnnbind's current stream, else the legacy default).

        The device is the stream's when it is a dnnbind Stream, else dnnbind's default device (else the
        CUDA runtime's current one). Array arguments must live on that device.
        """
        g = _dim3(grid, "grid", self.name)
        b = _dim3(block, "block", self.name)
        _check_config(self.name, g, b, shared_mem)
        self._launch(_stream_device(stream) if stream is not None else current_device(), g, b, args, stream,
                     shared_mem)

    __call__ = launch

    def _launch(self, device: int, g: Dim3, b: Dim3, args: Sequence[Any], stream: Any, shared_mem: int) -> None:
        """launch() after its checks: for callers (elementwise) whose configuration is valid by construction."""
        name = self.name
        holders, params = pack_args(args)
        fn = self._functions.get(device) or self._function(device)
        if b[0] * b[1] * b[2] > fn.max_threads:  # below 1024 only for kernels heavy on registers
            _check_config(name, g, b, shared_mem, fn.max_threads)
        sizes = fn.param_sizes
        if sizes is not None:
            _check_arg_sizes(name, holders, sizes)
        if shared_mem > fn.smem_optin:
            self._opt_in_shared_mem(fn, shared_mem, g, b)
        h = stream_handle(stream, device)
        drv = _drv or _driver()
        err, = drv.cuLaunchKernel(fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, h,
                                  params or None, 0)
        if err:
            if int(err) == CUDA_ERROR_INVALID_CONTEXT:
                # A thread that never touched the runtime has no current context; the runtime makes the
                # device's primary context current on its first call there, so retry once after one.
                cudart.call("cudaFree", 0)
                err, = drv.cuLaunchKernel(fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, h,
                                          params or None, 0)
            if err:
                raise CudaDriverError(int(err), "cuLaunchKernel", _driver_error_text(int(err)),
                                      f"kernel '{name}', grid {g}, block {b}, shared_mem {shared_mem},"
                                      f" stream {h:#x}, device {device}")
        if RECORDING:  # a step being recorded for host replay: keep the packed launch (holders keep params valid)
            RECORDING[-1].launch(name, drv.cuLaunchKernel,
                                 (fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, h, params or None, 0),
                                 holders)
        if _launch_hooks:
            for hook in tuple(_launch_hooks):
                hook(name, g, b, h)

    def __getitem__(self, config: Any) -> Callable[..., None]:
        """``kernel[grid, block]`` or ``kernel[grid, block, stream]`` or ``[..., stream, shared_mem]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise TypeError(f"kernel '{self.name}': use kernel[grid, block] or kernel[grid, block, stream]"
                            " or kernel[grid, block, stream, shared_mem]")
        grid, block = config[0], config[1]
        cfg_stream = config[2] if len(config) > 2 else None
        cfg_smem = config[3] if len(config) > 3 else 0

        def launcher(*args: Any, stream: Any = None, shared_mem: int | None = None) -> None:
            self.launch(grid, block, args, stream if stream is not None else cfg_stream,
                        cfg_smem if shared_mem is None else shared_mem)

        return launcher

    def _opt_in_shared_mem(self, fn: _Function, shared_mem: int, grid: Dim3, block: Dim3) -> None:
        attr = _driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _drv_call("cuFuncSetAttribute", fn.handle, attr, int(shared_mem),
                  context=f"kernel '{self.name}', grid {grid}, block {block}, shared_mem {shared_mem}")
        fn.smem_optin = shared_mem


def _check_arg_sizes(name: str, holders: list[Any], sizes: tuple[int, ...]) -> None:
    got = tuple(map(ctypes.sizeof, holders))
    if got == sizes:
        return
    if len(holders) != len(sizes):
        raise TypeError(f"kernel '{name}' takes {len(sizes)} arguments, got {len(holders)}")
    i = next(i for i, (g, s) in enumerate(zip(got, sizes, strict=True)) if g != s)
    raise TypeError(
        f"kernel '{name}' argument {i}: the kernel expects {sizes[i]} bytes, got {type(holders[i]).__name__}"
        f" ({got[i]} bytes); Python ints go as int32 and floats as float32, so pass a numpy scalar"
        " (np.int64, np.float64, ...) or a ctypes value of the right size")
