"""Layer 1 (runtime): host-to-device uploads through pinned staging buffers. Imports _lib and runtime.

A copy from ordinary (pageable) numpy memory cannot overlap the GPU's work: CUDA stages it through its own pinned
buffer and may wait for the stream to do so, and dnnbind then waited for the stream as well, since the numpy array
may be a temporary freed as soon as the call returns. Each upload therefore made the host wait for everything queued
before it: a training loop copying each batch in (``x.as_in_context(mx.gpu())``) ran the copy and the previous step
in series, and could not queue the next step's work meanwhile. MXNet's iterators hand out batches in pinned memory
(``cpu_pinned``) for this reason.

``upload`` copies the data into one of ``STAGES`` pinned buffers per device (cudaHostAlloc, kept and grown to the
largest upload), queues cudaMemcpyAsync from it and records an event after the copy. A buffer is reused once its event
has passed, so the host waits at most for the copy made ``STAGES`` uploads earlier (and the work queued before it),
never for the work queued since. Small uploads (below ``MIN_BYTES``: a staging copy costs more than it saves), very
large ones (above ``MAX_BYTES``: pinned memory is taken from the OS's pageable pool), and uploads while a step is
being recorded or captured (a replay would read the reused buffer) keep the plain path.
"""

from __future__ import annotations

import atexit
import ctypes
import threading

import numpy as np

from .._lib import cudart
from .._lib.hooks import RECORDING
from .device import Device
from .memory import H2D, memcpy
from .stream import Event, Stream

STAGES = 2
MIN_BYTES = 1 << 20
MAX_BYTES = 1 << 30
_ROUND = 2 << 20


class _Stage:
    """One pinned buffer: its pointer, a uint8 numpy view of it, and the event recorded after its last copy."""

    __slots__ = ("ptr", "view", "event")

    def __init__(self, nbytes: int, device: Device):
        device.activate()  # cudaHostAlloc's memory is portable only with the flag; made on the device it serves
        self.ptr = int(cudart.call("cudaHostAlloc", nbytes, 0))
        self.view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.ptr))
        self.event = None


_stages: dict = {}  # Device -> [list of _Stage or None, index of the next one]
_lock = threading.Lock()
_exit_registered: list = []


def upload(dst_ptr: int, host: np.ndarray, stream: Stream) -> bool:
    """Queue the copy of C-contiguous ``host`` to device pointer ``dst_ptr`` on ``stream`` through a pinned buffer
    (see the module docstring); False, having done nothing, where the caller must take the plain path."""
    n = host.nbytes
    if n < MIN_BYTES or n > MAX_BYTES or RECORDING or _capturing(stream):
        return False
    device = stream.device
    with _lock:
        entry = _stages.get(device)
        if entry is None:
            entry = _stages[device] = [[None] * STAGES, 0]
            if not _exit_registered:
                _exit_registered.append(True)
                atexit.register(_release_all)
        stages, i = entry
        entry[1] = (i + 1) % STAGES
        stage = stages[i]
        if stage is not None and stage.event is not None:
            stage.event.synchronize()  # the copy out of this buffer, STAGES uploads ago, has been made
        if stage is None or stage.view.nbytes < n:
            if stage is not None:
                _free_host(stage.ptr)
            stage = stages[i] = _Stage(-(-n // _ROUND) * _ROUND, device)
        np.copyto(stage.view[:n], host.reshape(-1).view(np.uint8))
        memcpy(dst_ptr, stage.ptr, n, H2D, stream)
        if stage.event is None:
            stage.event = Event(device, timing=False)
        stage.event.record(stream)
    return True


def _capturing(stream: Stream) -> bool:
    return bool(int(cudart.call("cudaStreamIsCapturing", stream.handle)))


def _free_host(ptr: int) -> None:
    cudart.call("cudaFreeHost", ptr)


def _release_all() -> None:
    """At exit: nothing is freed (the driver releases pinned memory with the process; CUDA may be torn down)."""
    _stages.clear()
