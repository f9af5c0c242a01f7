"""Layer kernels: launch compiled kernels. ``Kernel`` is one ``__global__`` function of a compiled module.

Imports dnnbind._lib (cudart, errors, hooks), numpy, cuda.bindings.driver on first use (driver.py) and
dnnbind.runtime (for dnnbind's current device and stream, devices.py). Nothing here runs at import: a machine
without a GPU can import this module, pack arguments and validate launch configurations; only ``Kernel.launch``
needs a device. The module's parts: driver.py (the driver API and its errors), devices.py (which device and stream
a launch goes to; device attributes), args.py (argument packing), and here the launch checks and ``Kernel``;
their names stay importable from here.

The hot path of ``Kernel.launch`` is: normalize dims, one dict lookup for the per-device CUfunction, one
ctypes object per argument plus their addresses packed as a void*[], one ``cuLaunchKernel``. Everything
that needs a driver query (the module load, the kernel's thread limit and parameter sizes) happens once
per device. Interception: dnnbind.trace wraps ``Kernel._launch`` while a trace is active (it must record an event
before the launch); a step being recorded (``hooks.RECORDING``) is handed each packed launch after it.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import operator
import struct
import threading
from ctypes import addressof
from collections.abc import Callable, Sequence
from typing import Any

from dnnbind._lib import cudart
from dnnbind._lib.errors import CudaDriverError
from dnnbind._lib.hooks import DEFERRING, RECORDING, TRACING

from .args import check_arg_sizes, pack_args
from .devices import (
    compute_capability,
    current_device,
    current_device_or_none,
    make_current,
    multiprocessor_count,
    stream_device,
    stream_handle,
)
from .driver import (
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_SUCCESS,
    cuda_driver,
    driver_call,
    driver_error_text,
)

__all__ = [
    "Dim3",
    "Kernel",
    "compute_capability",
    "current_device",
    "current_device_or_none",
    "multiprocessor_count",
    "pack_args",
    "stream_handle",
]

Dim3 = tuple[int, int, int]

# Hardware limits shared by every NVIDIA GPU since compute capability 3.0 (CUDA C Programming Guide,
# "Technical Specifications per Compute Capability"), checked before any driver call so that a bad
# configuration is reported with the kernel's name even on a machine without a GPU.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
# Above this much dynamic shared memory a kernel must opt in with cuFuncSetAttribute (sm_70+).
_DEFAULT_SMEM_LIMIT = 48 * 1024


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
    raise DnnbindTypeError(f"kernel '{kernel}': {what} must be an int or a tuple of 1 to 3 ints, got {dims!r}")


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
    raise DnnbindValueError(f"cannot launch kernel '{kernel}' with grid {grid}, block {block}: {problem}")


_ONE_POINTER = struct.Struct("P")  # the void*[1] of a one-argument launch
_cu_launch_fn: list = []


def _cu_launch() -> Callable[..., Any]:
    if not _cu_launch_fn:
        _cu_launch_fn.append(cuda_driver().cuLaunchKernel)
    return _cu_launch_fn[0]


# --- kernels -------------------------------------------------------------------------------------------

class _Function:
    """What one device knows about one kernel: its CUfunction and the limits queried once at load."""

    __slots__ = ("handle", "max_threads", "param_sizes", "smem_optin", "struct_type")

    def __init__(self, handle: Any, max_threads: int, param_sizes: tuple[int, ...] | None):
        self.handle = handle
        self.max_threads = max_threads
        self.param_sizes = param_sizes
        self.smem_optin = _DEFAULT_SMEM_LIMIT
        self.struct_type: type | None = None  # the one struct argument launch_struct() has checked


def _param_sizes(handle: Any) -> tuple[int, ...] | None:
    """Byte size of each kernel parameter (cuFuncGetParamInfo, CUDA 12.4+), or None where unavailable.

    NOTE: cuLaunchKernel copies as many bytes as the *kernel* declares from each pointer we give it, so a
    Python int (4 bytes) passed to a `long long` parameter would read 4 bytes of garbage. Knowing the sizes
    lets us refuse that mismatch instead.
    """
    get = getattr(cuda_driver(), "cuFuncGetParamInfo", None)
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
                attr = cuda_driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
                max_threads = int(driver_call("cuFuncGetAttribute", attr, handle))
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
        self._launch(stream_device(stream) if stream is not None else current_device(), g, b, args, stream,
                     shared_mem)

    __call__ = launch

    def _launch(self, device: int, g: Dim3, b: Dim3, args: Sequence[Any], stream: Any, shared_mem: int) -> None:
        """launch() after its checks: for callers (elementwise) whose configuration is valid by construction."""
        if DEFERRING:  # device work beside an eager Block call's deferred ops: they run first (eager_replay)
            DEFERRING[-1].device_work()
        name = self.name
        make_current(device)
        holders, params = pack_args(args)
        fn = self._functions.get(device) or self._function(device)
        if b[0] * b[1] * b[2] > fn.max_threads:  # below 1024 only for kernels heavy on registers
            _check_config(name, g, b, shared_mem, fn.max_threads)
        sizes = fn.param_sizes
        if sizes is not None:
            check_arg_sizes(name, holders, sizes)
        if shared_mem > fn.smem_optin:
            self._opt_in_shared_mem(fn, shared_mem, g, b)
        h = stream_handle(stream, device)
        drv = cuda_driver()
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
                raise CudaDriverError(int(err), "cuLaunchKernel", driver_error_text(int(err)),
                                      f"kernel '{name}', grid {g}, block {b}, shared_mem {shared_mem},"
                                      f" stream {h:#x}, device {device}")
        if RECORDING:  # a step being recorded for host replay: keep the packed launch (holders keep params valid)
            RECORDING[-1].launch(name, drv.cuLaunchKernel,
                                 (fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, h, params or None, 0),
                                 holders, device)

    def launch_struct(self, device: int, grid_x: int, block_x: int, arg: Any, h: int, current: bool = False) -> None:
        """The generated kernels' hot path: ONE by-value ctypes Structure argument, 1-D grid and block, no
        dynamic shared memory, a stream handle (int). Skips what _launch re-derives every call (argument
        conversion, the size check, once done for this Structure type); while a trace or a step recording
        watches launches, and on any driver error, it goes through _launch, which reports and retries.
        """
        if not current:  # ``current``: the caller made ``device`` current (an op under runtime.exec_context)
            make_current(device)
        fn = self._functions.get(device)
        if fn is None or fn.struct_type is not type(arg) or TRACING or RECORDING or DEFERRING or block_x > fn.max_threads:
            self._launch(device, (grid_x, 1, 1), (block_x, 1, 1), (arg,), h, 0)
            self._functions[device].struct_type = type(arg)  # _launch checked its size against the kernel's
            return
        err, = _cu_launch()(fn.handle, grid_x, 1, 1, block_x, 1, 1, 0, h, _ONE_POINTER.pack(addressof(arg)), 0)
        if err:  # nothing was launched: _launch redoes it with the context retry and the error text
            self._launch(device, (grid_x, 1, 1), (block_x, 1, 1), (arg,), h, 0)

    def __getitem__(self, config: Any) -> Callable[..., None]:
        """``kernel[grid, block]`` or ``kernel[grid, block, stream]`` or ``[..., stream, shared_mem]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise DnnbindTypeError(f"kernel '{self.name}': use kernel[grid, block] or kernel[grid, block, stream]"
                            " or kernel[grid, block, stream, shared_mem]")
        grid, block = config[0], config[1]
        cfg_stream = config[2] if len(config) > 2 else None
        cfg_smem = config[3] if len(config) > 3 else 0

        def launcher(*args: Any, stream: Any = None, shared_mem: int | None = None) -> None:
            self.launch(grid, block, args, stream if stream is not None else cfg_stream,
                        cfg_smem if shared_mem is None else shared_mem)

        return launcher

    def _opt_in_shared_mem(self, fn: _Function, shared_mem: int, grid: Dim3, block: Dim3) -> None:
        attr = cuda_driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver_call("cuFuncSetAttribute", fn.handle, attr, int(shared_mem),
                  context=f"kernel '{self.name}', grid {grid}, block {block}, shared_mem {shared_mem}")
        fn.smem_optin = shared_mem
