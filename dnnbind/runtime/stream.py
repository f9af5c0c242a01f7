"""Layer 1 (runtime): streams and events. Imports dnnbind._lib and runtime.device.

Every device gets one dnnbind stream, created on first use. It is a *blocking* stream (flag
cudaStreamDefault), so work a user puts on the legacy default stream with another library (torch, CuPy)
stays ordered with ours; and it is not the legacy stream itself, which CUDA graphs cannot capture.
"""

from __future__ import annotations

import threading
import weakref

from .._lib import cudart
from .device import Device, as_device


class Stream:
    """A CUDA stream owned by dnnbind (``handle`` is the cudaStream_t as an int)."""

    __slots__ = ("device", "handle", "exec_context", "_obj", "_finalizer", "__weakref__")

    def __init__(self, device=None, *, handle: int | None = None):
        self.device = as_device(device)
        self.exec_context = None  # runtime.exec_context.ExecContext, made on first use
        self.device.activate()
        if handle is None:
            obj = cudart.call("cudaStreamCreateWithFlags", 0)  # cudaStreamDefault: blocking, see above
            self._obj = obj
            self.handle = int(obj)
            self._finalizer = weakref.finalize(self, _destroy_stream, obj)
            self._finalizer.atexit = False  # at exit the driver frees everything; CUDA may be gone
        else:  # a foreign stream (torch/CuPy): borrowed, never destroyed by us
            self._obj, self.handle, self._finalizer = None, int(handle), None

    def synchronize(self) -> None:
        cudart.call("cudaStreamSynchronize", self.handle)

    def __repr__(self) -> str:
        return f"Stream({self.device!r}, handle=0x{self.handle:x})"

    def __enter__(self):
        _tls.stack = getattr(_tls, "stack", [])
        _tls.stack.append(_current_override().get(self.device))
        _current_override()[self.device] = self
        return self

    def __exit__(self, *exc):
        prev = _tls.stack.pop()
        if prev is None:
            _current_override().pop(self.device, None)
        else:
            _current_override()[self.device] = prev


def _destroy_stream(obj) -> None:
    try:
        cudart.rt().cudaStreamDestroy(obj)
    except Exception:  # interpreter shutdown: CUDA may be gone already
        pass


_tls = threading.local()
_default_streams: dict[Device, Stream] = {}
_lock = threading.Lock()


def _current_override() -> dict:
    d = getattr(_tls, "override", None)
    if d is None:
        d = _tls.override = {}
    return d


def default_stream(device: Device) -> Stream:
    s = _default_streams.get(device)
    if s is None:
        with _lock:
            s = _default_streams.get(device)
            if s is None:
                s = _default_streams[device] = Stream(device)
    return s


def current_stream(device=None) -> Stream:
    """The stream dnnbind launches on for ``device``: ``with stream:`` selects one, else the device's own."""
    # Hot path (every op, every allocation): a Device with no ``with stream:`` active is two lookups.
    if type(device) is not Device:
        device = as_device(device)
    over = _tls.__dict__.get("override")
    if over:
        s = over.get(device)
        if s is not None:
            return s
    s = _default_streams.get(device)
    return s if s is not None else default_stream(device)


def synchronize(device=None) -> None:
    """Wait for everything dnnbind queued on ``device``'s current stream."""
    device = as_device(device)
    if device.is_gpu:
        current_stream(device).synchronize()


class Event:
    """A CUDA event; ``end.elapsed_ms(start)`` times GPU work between two records."""

    __slots__ = ("device", "_obj", "handle", "_finalizer", "__weakref__")

    def __init__(self, device=None, timing: bool = True):
        self.device = as_device(device)
        self.device.activate()
        flags = 0 if timing else 2  # cudaEventDisableTiming
        self._obj = cudart.call("cudaEventCreateWithFlags", flags)
        self.handle = int(self._obj)
        self._finalizer = weakref.finalize(self, _destroy_event, self._obj)
        self._finalizer.atexit = False  # at exit the driver frees everything; CUDA may be gone

    def record(self, stream: Stream | None = None) -> "Event":
        stream = stream or current_stream(self.device)
        stream.device.activate()
        cudart.call("cudaEventRecord", self._obj, stream.handle)
        return self

    def synchronize(self) -> None:
        cudart.call("cudaEventSynchronize", self._obj)

    def elapsed_ms(self, start: "Event") -> float:
        return float(cudart.call("cudaEventElapsedTime", start._obj, self._obj))


_order_events: dict = {}  # producer Stream -> a timing-free Event re-recorded by each wait_for


def wait_for(waiter: Stream, producer: Stream) -> None:
    """Make ``waiter`` wait (on the GPU, no host sync) for the work queued on ``producer`` so far: an event recorded
    on ``producer`` and ``cudaStreamWaitEvent`` on ``waiter``. The streams may belong to different GPUs. One event
    per producer is reused: a wait takes the event's state at the time it is queued, so re-recording is safe."""
    if waiter is producer:
        return
    ev = _order_events.get(producer)
    if ev is None:
        ev = _order_events[producer] = Event(producer.device, timing=False)
    ev.record(producer)
    waiter.device.activate()
    cudart.call("cudaStreamWaitEvent", waiter.handle, ev.handle, 0)


def _destroy_event(obj) -> None:
    try:
        cudart.rt().cudaEventDestroy(obj)
    except Exception:
        pass
