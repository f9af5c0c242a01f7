"""Layer 1 (runtime): device memory from CUDA's stream-ordered pool. Imports _lib and runtime.

We do not write an allocator: ``cudaMallocAsync``/``cudaFreeAsync`` on the device's default pool *is* CUDA's
caching allocator. Its release threshold is raised to "never trim" so freed blocks are reused instead of
being handed back to the driver at every synchronize; this is what makes an allocation a few microseconds
and what lets allocations happen inside CUDA graph capture.
"""

from __future__ import annotations

import atexit
import warnings
import weakref

from .._lib import cudart
from .._lib.errors import CudaDriverError, CudaError
from .._lib.hooks import DEFERRING, RECORDING
from ._arena import Arena
from ._vmm import Region
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
        if stream is None:
            stream = current_stream(device)
        self._allocate(nbytes if type(nbytes) is int else int(nbytes), device, stream)

    @classmethod
    def _on_current(cls, nbytes: int, device: Device, stream: Stream) -> "DeviceBuffer":
        """``nbytes`` (an int) on ``stream`` of ``device``, which the caller has made current and whose pool is set
        up (allocate_current): __init__ without those two checks."""
        self = object.__new__(cls)
        self._allocate(nbytes, device, stream)
        return self

    def _allocate(self, nbytes: int, device: Device, stream: Stream) -> None:
        self.nbytes, self.device, self.stream, self.ptr = nbytes, device, stream, 0
        if nbytes:
            if _holds:  # a recording: a piece of its family's arena (see Hold)
                self.ptr = _holds[-1].allocate(nbytes, device, stream)
                return
            # NOTE: cuda-python directly, not cudart.call: this runs for every array a step makes (~150 in an
            # eager ResNet-18 step).
            err, ptr = cudart.rt().cudaMallocAsync(nbytes, stream.handle)
            if err:  # cudaSuccess is 0; again through cudart.call: it raises CudaError with CUDA's text
                ptr = cudart.call("cudaMallocAsync", nbytes, stream.handle)
            self.ptr = int(ptr)

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


def allocate_current(nbytes: int, device: Device, stream: Stream) -> DeviceBuffer:
    """A DeviceBuffer of ``nbytes`` on ``stream``, for a caller that has made ``device`` current already (an op
    running under runtime.exec_context): the hot path of every op's outputs."""
    if device.index not in _pools_ready:
        return DeviceBuffer(nbytes, device, stream)
    return DeviceBuffer._on_current(nbytes, device, stream)


def _free(ptr: int, stream: Stream, raising: bool = True) -> None:
    """cudaFreeAsync, its status checked: CudaError, or where raising is impossible (``__del__``) a warning."""
    if _shutting_down:
        return  # at exit the driver frees everything; CUDA may already be torn down
    if _holds or _pieces or _pinned:  # a recorded step may still use this memory: its Hold frees it (see Hold)
        owner = _owner(ptr)
        if owner is not None:
            owner.defer(ptr, stream)
            return
        arena = _pieces.pop(ptr, None)
        if arena is not None:  # a piece, back into its family's arena; its range too if the family is gone
            gone = arena.release(ptr)
            if gone is not None:
                _release_region(*gone, raising=raising)
            return
    stream.device.activate()  # a stream-ordered free is queued on the stream: its device must be current
    # NOTE: cuda-python directly, not cudart.call: this runs for every buffer freed.
    result = cudart.rt().cudaFreeAsync(ptr, stream.handle)
    err = result[0] if type(result) is tuple else result
    if err:  # cudaSuccess is 0
        exc = CudaError(int(err), "cudaFreeAsync", f"{getattr(err, 'name', err)} - {cudart.error_string(err)}",
                        f"freeing {ptr:#x} on {stream!r}")
        if raising:
            raise exc
        _warn_once(exc)


def _owner(ptr: int):
    """The Hold a free of ``ptr`` must be deferred to, or None to free it now (see Hold)."""
    owners = _pinned.get(ptr)
    if owners:  # another family's recorded calls use it
        return owners[-1]
    arena = _pieces.get(ptr)
    if arena is not None and _holds and _holds[-1].arena is arena:
        return None  # freed while its own family records: back into the arena, for the family's later pieces
    if _holds:  # the running recording may have read it
        return _holds[-1]
    if arena is not None and arena.holds:  # its family's replays use it: not reused after the recording
        return arena.holds[-1]
    return None


_warned: list = []


def _warn_once(exc: CudaError) -> None:
    """A failed free inside __del__ (or a garbage collection) cannot raise: say so once per process."""
    if not _warned:
        _warned.append(exc)
        warnings.warn(f"{exc} (device memory may leak; later failures of cudaFreeAsync are not reported)",
                      RuntimeWarning, stacklevel=2)


_shutting_down = False
_holds: list = []  # Holds now recording, innermost last
_pinned: dict = {}  # device pointer -> the Holds whose recorded calls use it (not their own family's pieces)
_pieces: dict = {}  # pointer of a recording's piece of memory -> its family's Arena, while the piece is allocated
_arenas = weakref.WeakSet()  # the live families' Arenas (recordings_reserved)


class Hold:
    """Keeps the memory a recorded step's calls point at allocated for as long as the step exists.

    A recording (recording.CallRecording) holds raw device pointers. While it records (``with hold:``):
    - every allocation is a piece of its family's Arena (runtime._arena), and a free of one goes back into the
      arena at once: the family's later allocations reuse it, in the order a replay repeats (a temporary, or a
      forward's activation that its backward has read);
    - every other free (an array from before the recording, which a recorded call may read) is deferred to the
      hold.
    After the recording a free of the family's piece is deferred to the family (its replays still use it), and
    ``pin`` names the other pointers its calls use (parameters, a shared workspace, another recording's buffers):
    a later free of one of those (a workspace that grew, a parameter buffer that was replaced) is deferred too.
    ``release()`` frees what was deferred, stream-ordered; the arena's ranges go with the family's last Hold.

    ``parent``: a recording always replayed just before this one (a hybridized Block's forward before its
    backward); the child allocates from the parent's arena, so it reuses what the parent's activations leave.
    """

    def __init__(self, parent: Hold | None = None):
        if _graveyard:
            _reap()
        if parent is not None and parent.arena is not None:
            self.arena = parent.arena
        else:
            self.arena = Arena()
            _arenas.add(self.arena)
        self.arena.holds.append(self)
        self.deferred: dict = {}  # pointer -> the Stream to free it on

    def allocate(self, nbytes: int, device: Device, stream: Stream) -> int:
        ptr = self.arena.allocate(nbytes, stream, lambda: Region(device.index))
        _pieces[ptr] = self.arena
        return ptr

    def defer(self, ptr: int, stream: Stream) -> None:
        """Keep ``ptr`` allocated until release()."""
        self.deferred[ptr] = stream

    def __enter__(self) -> Hold:
        _holds.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _holds.remove(self)

    def pin(self, pointers) -> None:
        arena = self.arena
        for p in pointers:
            if _pieces.get(p) is arena:  # the family's own piece: deferred to the family anyway (see _owner)
                continue
            owners = _pinned.setdefault(p, [])
            if self not in owners:
                owners.append(self)

    def release(self) -> None:
        for p in [p for p, owners in _pinned.items() if self in owners]:
            _pinned[p].remove(self)
            if not _pinned[p]:
                del _pinned[p]
        deferred, self.deferred = self.deferred, {}
        arena, self.arena = self.arena, None
        regions = []
        if arena is not None:
            arena.holds.remove(self)
            if not arena.holds:  # the family is gone: its empty ranges now, the others with their last piece
                regions = arena.close()
        failed = None
        for p, stream in deferred.items():
            try:
                _free(p, stream)  # passed on to another Hold if one still pins it
            except (CudaError, CudaDriverError) as exc:  # free the rest, then report the first failure
                failed = failed or exc
        for region, stream in regions:
            try:
                _release_region(region, stream)
            except (CudaError, CudaDriverError) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


_graveyard: list = []  # (Region, Stream) whose release waits for a stream capture to end


def _release_region(region: Region, stream: Stream, raising: bool = True) -> None:
    """Unmap a family's range once the work queued on its stream (replays) is done. While that stream is being
    captured into a CUDA graph nothing can wait for it: the range waits for the next recording (``_reap``)."""
    if _shutting_down:
        return
    try:
        capturing = cudart.call("cudaStreamIsCapturing", stream.handle)
        if int(capturing):  # cudaStreamCaptureStatusActive (or invalidated): no synchronizing now
            _graveyard.append((region, stream))
            return
        stream.synchronize()
        region.release()
    except (CudaError, CudaDriverError) as exc:
        if raising:
            raise
        _warn_once(exc)


def _reap() -> None:
    pending = _graveyard[:]
    _graveyard.clear()
    for region, stream in pending:
        _release_region(region, stream)


def recordings_reserved() -> int:
    """Bytes of device memory the live recordings (hybridized Blocks, recorded steps) keep mapped for their
    arenas: outside CUDA's default pool, so not in its used bytes."""
    return sum(a.reserved() for a in list(_arenas))


def _at_exit() -> None:
    global _shutting_down
    _shutting_down = True


def memcpy(dst: int, src: int, nbytes: int, kind: int, stream: Stream) -> None:
    if nbytes:
        if DEFERRING:  # device work beside an eager Block call's deferred ops: they run first (eager_replay)
            DEFERRING[-1].device_work()
        # NOTE: CUDA refuses (cudaErrorInvalidValue) an async copy or memset on a stream of a device that is not
        # the current one: the stream carries its device, which is made current here, whatever was current before.
        stream.device.activate()
        cudart.call("cudaMemcpyAsync", dst, src, nbytes, kind, stream.handle)
        if RECORDING:
            RECORDING[-1].runtime("cudaMemcpyAsync", (dst, src, nbytes, kind, stream.handle))


def memset(ptr: int, value: int, nbytes: int, stream: Stream) -> None:
    if nbytes:
        if DEFERRING:  # (see memcpy)
            DEFERRING[-1].device_work()
        stream.device.activate()  # (see memcpy)
        cudart.call("cudaMemsetAsync", ptr, value, nbytes, stream.handle)
        if RECORDING:
            RECORDING[-1].runtime("cudaMemsetAsync", (ptr, value, nbytes, stream.handle))


def pool_stats(device: Device) -> dict:
    """Bytes the default pool holds (reserved) and hands out (used), and what the live recordings keep mapped
    beside it (``recordings``: hybridized Blocks' and recorded steps' static memory), for show_config and
    benchmarks."""
    rt = cudart.rt()
    pool = cudart.call("cudaDeviceGetDefaultMemPool", device.index)
    out = {}
    for key, attr in (("reserved", "cudaMemPoolAttrReservedMemCurrent"), ("used", "cudaMemPoolAttrUsedMemCurrent")):
        value = cudart.call("cudaMemPoolGetAttribute", pool, getattr(rt.cudaMemPoolAttr, attr))
        out[key] = int(value)
    out["recordings"] = recordings_reserved()
    return out
