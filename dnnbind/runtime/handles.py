"""Layer 1 (runtime): cuDNN and cuBLAS handles, one per (device, stream). Imports _lib and runtime.

Handles are created lazily, bound to their stream (cudnnSetStream / cublasSetStream_v2) once, and looked
up by key on the hot path. They are destroyed at interpreter exit, after a device synchronize, and never
while a CUDA graph is being captured (cudnnDestroy synchronizes, which would invalidate the capture).
"""

from __future__ import annotations

import atexit
import ctypes
import threading

from .._lib import cublas, cudnn
from . import config
from .device import Device
from .memory import DeviceBuffer
from .stream import Stream, current_stream

CUBLAS_WORKSPACE_BYTES = 32 << 20  # NOTE: cuBLAS needs a fixed user workspace to be capturable in a CUDA graph


class CudnnHandle:
    __slots__ = ("device", "stream", "handle")

    def __init__(self, device: Device, stream: Stream):
        device.activate()
        h = ctypes.c_void_p()
        cudnn.lib.cudnnCreate(ctypes.byref(h))
        cudnn.lib.cudnnSetStream(h, stream.handle)
        self.device, self.stream, self.handle = device, stream, h.value

    def close(self) -> None:
        if self.handle:
            h, self.handle = self.handle, None
            cudnn.lib.cudnnDestroy(h)


class CublasHandle:
    __slots__ = ("device", "stream", "handle", "workspace", "math_version")

    def __init__(self, device: Device, stream: Stream):
        device.activate()
        h = ctypes.c_void_p()
        cublas.lib.cublasCreate_v2(ctypes.byref(h))
        self.device, self.stream, self.handle = device, stream, h.value
        cublas.lib.cublasSetStream_v2(h, stream.handle)
        self.workspace = DeviceBuffer(CUBLAS_WORKSPACE_BYTES, device, stream)
        cublas.lib.cublasSetWorkspace_v2(h, self.workspace.ptr, self.workspace.nbytes)
        self.math_version = -1
        self.sync_math()

    def sync_math(self) -> None:
        mode = cublas.CUBLAS_TF32_TENSOR_OP_MATH if config.math_mode() == "tf32" else cublas.CUBLAS_DEFAULT_MATH
        cublas.lib.cublasSetMathMode(self.handle, mode)
        self.math_version = config.math_version()

    def close(self) -> None:
        if self.handle:
            h, self.handle = self.handle, None
            cublas.lib.cublasDestroy_v2(h)


_cudnn: dict = {}
_cublas: dict = {}
# Creation is locked, lookups are not (the hot path): two threads asking for a new stream's handle at once must
# not both create one (the loser's would never be destroyed). As runtime.stream does for default streams.
_lock = threading.Lock()


def _create(table: dict, cls, device: Device, stream: Stream):
    with _lock:
        h = table.get(stream)
        if h is None:
            _register_exit()
            h = table[stream] = cls(device, stream)
    return h


def cudnn_handle(device: Device, stream: Stream | None = None) -> int:
    """The cuDNN handle bound to ``stream`` (default: ``device``'s current one), with ``device`` made current: cuDNN
    and cuBLAS run a call on the current device, which must be the handle's (their docs' rule for several GPUs)."""
    device.activate()
    stream = stream or current_stream(device)
    h = _cudnn.get(stream)
    if h is None:
        h = _create(_cudnn, CudnnHandle, device, stream)
    return h.handle


def cublas_handle(device: Device, stream: Stream | None = None) -> int:
    """The cuBLAS handle bound to ``stream``, with ``device`` made current (see cudnn_handle)."""
    device.activate()
    stream = stream or current_stream(device)
    h = _cublas.get(stream)
    if h is None:
        h = _create(_cublas, CublasHandle, device, stream)
    elif h.math_version != config.math_version():
        h.sync_math()
    return h.handle


def handle_streams() -> dict:
    """{raw handle: Stream} for every cuDNN and cuBLAS handle made so far: which stream a library call that names a
    handle runs on (dnnbind.trace times each call on its stream)."""
    return {h.handle: stream for table in (_cudnn, _cublas) for stream, h in list(table.items())}


_exit_registered = []


def _register_exit() -> None:
    # NOTE: registered at the first handle, i.e. after cuda-python has registered its own teardown; atexit
    # runs handlers last-in first-out, so ours runs while the CUDA runtime is still alive.
    if not _exit_registered:
        atexit.register(_release_all)
        _exit_registered.append(True)


def _release_all() -> None:
    """atexit: destroy every handle (cudnnDestroy/cublasDestroy wait for their streams' work themselves).
    Errors are swallowed: at exit a failing destroy must never mask the program's own result."""
    with _lock:
        for table in (_cudnn, _cublas):
            for h in list(table.values()):
                try:
                    h.close()
                except Exception:
                    pass
            table.clear()
