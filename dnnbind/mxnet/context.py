"""``mxnet.context``: MXNet's Context is dnnbind's Device. Layer: top (the MXNet alias); imports runtime.

``Context`` *is* ``dnnbind.Device`` (interned values), so arrays, Parameters and user code share one class:
``isinstance(x.context, mx.Context)`` holds, ``mx.gpu(0) == Context("gpu", 0)`` and ``hash`` agree, and
``with mx.gpu(1):`` makes it the default device for the block. ``repr`` is MXNet's (``gpu(0)``, ``cpu(0)``);
``str`` and ``repr`` are MXNet's (``gpu(0)``, ``cpu(0)``). There is one cpu: ``cpu(i)`` is
``cpu(0)``, and MXNet's ``cpu_pinned``/``cpu_shared`` contexts are the cpu.

Unlike MXNet, whose default context is always ``cpu(0)``, dnnbind's default is ``gpu(0)`` when a GPU is
usable: code that passes no ``ctx`` runs on the GPU.
"""

from __future__ import annotations

from ..runtime import device as _device
from ..runtime.device import Device as Context

__all__ = ["Context", "cpu", "cpu_pinned", "current_context", "gpu", "gpu_memory_info", "num_gpus"]


def cpu(device_id: int = 0) -> Context:
    return _device.cpu(device_id)


def cpu_pinned(device_id: int = 0) -> Context:
    """MXNet's page-locked host context; dnnbind's cpu (host copies are staged by the runtime)."""
    return _device.cpu(device_id)


def gpu(device_id: int = 0) -> Context:
    """``gpu(i)``; making it touches no GPU, the first array on it does (and raises MXNetError without one)."""
    return _device.gpu(device_id)


def num_gpus() -> int:
    """Number of usable GPUs; 0 without a GPU or driver (never raises)."""
    return _device.num_gpus()


def current_context() -> Context:
    """The default device: the one a ``with ctx:`` block selected, else gpu(0) with a GPU, else cpu(0)."""
    return _device.default_device()


def gpu_memory_info(device_id: int = 0) -> tuple[int, int]:
    """(free, total) bytes of GPU ``device_id`` (cudaMemGetInfo)."""
    from .._lib import cudart
    _device.gpu(device_id).activate()
    free, total = cudart.call("cudaMemGetInfo")
    return int(free), int(total)
