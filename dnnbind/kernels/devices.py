"""Layer kernels: which device and stream a launch goes to, and the device attributes launches need.

Imports dnnbind._lib (cudart, errors) and dnnbind.runtime (dnnbind's default device and current stream: a layer
above this one, so the kernels follow ``with dnnbind.gpu(1):`` and ``with stream:`` like every op). Nothing here
runs at import.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError

from typing import Any

from dnnbind._lib import cudart
from dnnbind._lib.errors import CudaError, LibraryNotFoundError
from dnnbind.runtime.device import Device, default_device, gpu
from dnnbind.runtime.stream import current_stream

_cc: dict[int, int] = {}
_sms: dict[int, int] = {}
_gpu_devices: dict[int, Device] = {}  # index -> dnnbind Device, to skip its constructor on every launch


def current_device() -> int:
    """The device a launch goes to: dnnbind's default device when it is a GPU (made current here, as the
    runtime's own ops do, so ``with dnnbind.gpu(1):`` applies to kernels too), else the CUDA runtime's
    current device. Raises CudaError when there is no usable GPU."""
    dev = default_device()
    if dev.kind == "gpu":
        dev.activate()
        return dev.index
    err, index = cudart.rt().cudaGetDevice()
    if err:
        raise CudaError(int(err), "cudaGetDevice", f"{getattr(err, 'name', err)} - {cudart.error_string(err)}",
                        "launching a kernel needs a GPU and the NVIDIA driver")
    return index


def make_current(device: int) -> None:
    """Make GPU ``device`` (an index) current on this thread unless it is: every launch calls this with the device
    its stream belongs to, so no launch relies on which device happens to be current."""
    dev = _gpu_devices.get(device)
    if dev is None:
        dev = _gpu_devices[device] = gpu(device)
    dev.activate()


def stream_device(stream: Any) -> int:
    """A dnnbind Stream knows its device: launch there, whatever the default device is. (The launch itself makes
    it current, ``make_current``: once per launch, not here as well.)"""
    dev = getattr(stream, "device", None)
    if dev is not None and getattr(dev, "kind", None) == "gpu":
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


def stream_handle(stream: Any, device: int = 0) -> int:
    """An int cudaStream_t from None (dnnbind's current stream on ``device``), an int, a dnnbind stream
    (``.handle``), a torch stream (``.cuda_stream``), a CuPy stream (``.ptr``) or a cuda.bindings
    CUstream/cudaStream_t."""
    if stream is None:
        dev = _gpu_devices.get(device)
        if dev is None:
            dev = _gpu_devices[device] = gpu(device)
        return current_stream(dev).handle
    if type(stream) is int:
        return stream
    for attr in ("handle", "cuda_stream", "ptr"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(h)
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise DnnbindTypeError(f"cannot use {type(stream).__name__} as a CUDA stream: pass an int handle or an"
                        " object with .handle") from None
