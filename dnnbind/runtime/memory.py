"""Layer 1 (runtime): device memory from CUDA's stream-ordered pool. Imports _lib and runtime.

We do not write an allocator: ``cudaMallocAsync``/``cudaFreeAsync`` on the device's default pool *is* CUDA's
caching allocator. Its release threshold is raised to "never trim" so freed blocks are reused instead of
being handed back to the driver at every synchronize; this is what makes an allocation a few microseconds
and what lets allocations happen inside CUDA graph capture.
"""

from __future__ import annotations

import atexit
import warnings

from .._lib import cudart
from .._lib.errors import CudaError
from .._lib.hooks import RECORDING
from .device import Device
from .stream import Stream, current_stream

_pools_ready: set[int] = set()

# cudaMemcpyKind
H2D, D2H, D2D = 1, 2, 3


def _prepare_pool(index: int) -> None:
    rt = cudart.rt()
    pool = cudart.call("cudaDeviceGetDefaultMemPool", index)
    from cuda.bindings import driver  # the cuuint64_t value type lives in the driver module
    threshold = driver.cuuint64_t(0xFFFFFFFFFFFFFFFF)
    cudart.call("cudaMemPoolSetAttribute", pool, rt.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold, threshold)
    _pools_ready.add(index)
    if len(_pools_ready) == 1:
        # Registered after cuda-python set up its own exit teardown, so (LIFO) ours runs first.
        atexit.register(_at_exit)


class DeviceBuffer:
    """``nbytes`` of device memory, freed (stream-ordered, on the stream it was made on) when unreferenced."""

    __slots__ = ("ptr", "nbytes", "device", "stream", "__weakref__")

    def __init__(self, nbytes: int, device: Device, stream: Stream | None = None):
        device.activate()
        if device.index not in _pools_ready:
            _prepare_pool(device.index)
        stream = stream or current_stream(device)
        self.nbytes, self.device, self.stream = int(nbytes), device, stream
        self.ptr = 0
        if self.nbytes and _holds:  # a recording: reuse a block it allocated and freed itself, if one fits
            self.ptr = _holds[-1].reuse(self.nbytes, stream)
            if self.ptr:
                return
        if self.nbytes:
            # NOTE: cuda-python directly, not cudart.call: this runs ~20 times per training step.
            err, ptr = cudart.rt().cudaMallocAsync(self.nbytes, stream.handle)
            if err != 0:  # again through cudart.call: it raises CudaError with CUDA's text (or succeeds)
                ptr = cudart.call("cudaMallocAsync", self.nbytes, stream.handle)
            self.ptr = int(ptr)
            if _holds:  # a recording is running: its calls may point into this buffer (see Hold)
                _holds[-1].note(self.ptr, self.nbytes)

    # NOTE: __del__ rather than weakref.finalize: a training step makes ~30 buffers and finalize costs
    # microseconds each. The buffer holds its stream, so the stream outlives every buffer made on it.
    def __del__(self):
        ptr = getattr(self, "ptr", 0)  # 0 also when __init__ failed before allocating
        self.ptr = 0
        if ptr:
            _free(ptr, self.stream, raising=False)  # an exception in __del__ would only be printed

    def free(self) -> None:
        """Free now (stream-ordered); raises CudaError if CUDA refuses."""
        ptr = getattr(self, "ptr", 0)
        self.ptr = 0
        if ptr:
            _free(ptr, self.stream)

    def __repr__(self) -> str:
        return f"DeviceBuffer(0x{self.ptr:x}, {self.nbytes} bytes, {self.device!r})"


def _free(ptr: int, stream: Stream, raising: bool = True) -> None:
    """cudaFreeAsync, its status checked: CudaError, or where raising is impossible (``__del__``) a warning."""
    if _shutting_down:
        return  # at exit the driver frees everything; CUDA may already be torn down
    if _holds or _pinned:  # a recorded step may still use this memory: its Hold frees it (see Hold)
        owners = _pinned.get(ptr)
        owner = owners[-1] if owners else (_holds[-1] if _holds else None)
        if owner is not None:
            owner.defer(ptr, stream, recording=not owners)
            return
    # NOTE: cuda-python directly, not cudart.call: this runs for every buffer freed.
    result = cudart.rt().cudaFreeAsync(ptr, stream.handle)
    err = result[0] if type(result) is tuple else result
    if err:  # cudaSuccess is 0
        exc = CudaError(int(err), "cudaFreeAsync", f"{getattr(err, 'name', err)} - {cudart.error_string(err)}",
                        f"freeing {ptr:#x} on {stream!r}")
        if raising:
            raise exc
        _warn_once(exc)


_warned: list = []


def _warn_once(exc: CudaError) -> None:
    """A failed free inside __del__ (or a garbage collection) cannot raise: say so once per process."""
    if not _warned:
        _warned.append(exc)
        warnings.warn(f"{exc} (device memory may leak; later failures of cudaFreeAsync are not reported)",
                      RuntimeWarning, stacklevel=2)


_shutting_down = False
_holds: list = []  # Holds now recording: every free meanwhile is deferred to the innermost
_pinned: dict = {}  # device pointer -> the Holds whose recorded calls use it


class Hold:
    """Keeps the memory a recorded step's calls point at allocated for as long as the step exists.

    A step recorded for host replay (dnnbind.graph.RecordedStep) holds raw device pointers. While it records,
    every free is deferred to the hold, so no temporary's address is handed out again, and every allocation is
    noted (``allocated``); afterwards ``pin`` names the pointers its calls use (and the allocations, so a view
    at an offset into one is covered too), and freeing one of those (a workspace that grew, a parameter buffer
    that was replaced) is deferred too. ``release()`` frees what was deferred, stream-ordered.
    """

    def __init__(self, parent: Hold | None = None):
        self.parent = parent  # a recording replayed right after the parent's: it may reuse what the parent frees
        self.deferred: dict = {}  # pointer -> the Stream to free it on
        self.allocated: list = []  # pointers allocated while it was recording (pinned by the recorder)
        self._sizes: dict = {}  # pointer -> bytes, for what it allocated
        self._free: dict = {}  # (bytes, stream handle) -> pointers it allocated and freed while recording
        self.spare: dict = {}  # what was still in _free when its recording ended: its child's to reuse
        if parent is not None:  # dead after their last use in the parent's calls, which replay first
            self._free, parent.spare = parent.spare, {}

    def note(self, ptr: int, nbytes: int) -> None:
        self.allocated.append(ptr)
        self._sizes[ptr] = nbytes

    def defer(self, ptr: int, stream: Stream, recording: bool = False) -> None:
        """Keep ``ptr`` allocated until release(). While recording, a block this Hold allocated itself may be
        handed out again to a later allocation that fits, in the same recording (``reuse``): the calls
        that used it came before the free in stream order, and a replay repeats that order, so the recording's
        temporaries share memory as an eager run's do."""
        self.deferred[ptr] = stream
        if recording and ptr in self._sizes:
            self._free.setdefault((self._sizes[ptr], stream.handle), []).append(ptr)
        elif _holds and _holds[-1].parent is self and ptr in self._sizes:
            # Freed while the child records (a hybridized Block's activation, released by its backward): the
            # child may reuse it, as an eager backward reuses activations for gradients. The parent keeps it.
            _holds[-1]._free.setdefault((self._sizes[ptr], stream.handle), []).append(ptr)

    def reuse(self, nbytes: int, stream: Stream) -> int:
        """A freed block for ``nbytes``: the smallest that fits (best fit, as the pool itself would), else 0."""
        ptrs = self._free.get((nbytes, stream.handle))
        if not ptrs:
            fits = [k for k, v in self._free.items() if v and k[1] == stream.handle and k[0] > nbytes]
            if not fits:
                return 0
            ptrs = self._free[min(fits)]
        ptr = ptrs.pop()
        if self.deferred.pop(ptr, None) is None and self.parent is not None:
            self.parent.deferred.pop(ptr, None)  # the parent's block, in use again (it still pins it)
        return ptr

    def __enter__(self) -> Hold:
        _holds.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _holds.remove(self)
        self.spare, self._free = self._free, {}  # the recording is over: nothing more is handed out here

    def pin(self, pointers) -> None:
        for p in pointers:
            owners = _pinned.setdefault(p, [])
            if self not in owners:
                owners.append(self)

    def release(self) -> None:
        for p in [p for p, owners in _pinned.items() if self in owners]:
            _pinned[p].remove(self)
            if not _pinned[p]:
                del _pinned[p]
        deferred, self.deferred = self.deferred, {}
        failed = None
        for p, stream in deferred.items():
            try:
                _free(p, stream)  # passed on to another Hold if one still pins it
            except CudaError as exc:  # free the rest, then report the first failure
                failed = failed or exc
        if failed is not None:
            raise failed


def _at_exit() -> None:
    global _shutting_down
    _shutting_down = True


def memcpy(dst: int, src: int, nbytes: int, kind: int, stream: Stream) -> None:
    if nbytes:
        cudart.call("cudaMemcpyAsync", dst, src, nbytes, kind, stream.handle)
        if RECORDING:
            RECORDING[-1].runtime("cudaMemcpyAsync", (dst, src, nbytes, kind, stream.handle))


def memset(ptr: int, value: int, nbytes: int, stream: Stream) -> None:
    if nbytes:
        cudart.call("cudaMemsetAsync", ptr, value, nbytes, stream.handle)
        if RECORDING:
            RECORDING[-1].runtime("cudaMemsetAsync", (ptr, value, nbytes, stream.handle))


def pool_stats(device: Device) -> dict:
    """Bytes the default pool holds (reserved) and hands out (used), for show_config and benchmarks."""
    rt = cudart.rt()
    pool = cudart.call("cudaDeviceGetDefaultMemPool", device.index)
    out = {}
    for key, attr in (("reserved", "cudaMemPoolAttrReservedMemCurrent"), ("used", "cudaMemPoolAttrUsedMemCurrent")):
        value = cudart.call("cudaMemPoolGetAttribute", pool, getattr(rt.cudaMemPoolAttr, attr))
        out[key] = int(value)
    return out
