"""NCCL communicators and collectives on dnnbind arrays. Layer: distributed; imports _lib.nccl (opened on first
use), runtime.

A :class:`Communicator` is one NCCL communicator: this rank's place among ``size`` ranks, on one GPU. Two ways to
make them, as NCCL offers:

- one process per GPU (``python -m dnnbind.launch``): ``Communicator.from_unique_id(uid, rank, size, device)``,
  with ``uid`` from :func:`dnnbind.distributed.nccl_unique_id` (rank 0 makes it, the TCP rendezvous hands it out),
  or simply :func:`dnnbind.distributed.communicator` after ``init()``;
- one process driving several GPUs (MXNet's ``ctx=[gpu(0), gpu(1)]``): ``Communicator.for_devices(devices)``,
  ``ncclCommInitAll``, one communicator per device; collectives over them go inside ``with group():``.

Collectives run on the current stream of the array's device, like every other dnnbind call, so they order with
the step's kernels, can be captured into a CUDA graph (NCCL calls are graph-capturable) and are traced like any
library call. Arguments are checked before NCCL is called: TypeError/ValueError naming the collective, the
argument and the shapes. NCCL's own failures raise NcclError with ncclGetErrorString and ncclGetLastError text.

Every communicator of the process is kept in a weak registry (``live_communicators()``) so the watchdog
(_watchdog.py) can poll ``ncclCommGetAsyncError`` on each and abort them all when a rank dies. ``check``, ``abort``
and ``close`` hold the communicator's lock, as they may run on the watchdog's thread; the collectives do not (they
must never wait on a lock an abort holds, and the hot path takes none).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import contextlib
import ctypes
import threading
import weakref

from ..runtime.array import NDArray, empty
from ..runtime.device import as_device
from ..runtime.stream import current_stream

__all__ = ["Communicator", "group", "live_communicators"]

_registry: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
_registry_lock = threading.Lock()


def live_communicators() -> list:
    """Every Communicator of this process that is neither closed nor aborted."""
    with _registry_lock:
        return [c for c in _registry if c.handle]


def _nccl():
    from .._lib import nccl  # lazy: importing dnnbind.distributed must not need NCCL
    return nccl


@contextlib.contextmanager
def group():
    """``ncclGroupStart`` ... ``ncclGroupEnd``: collectives issued inside run as one (required when one thread
    drives several communicators of one clique, as after for_devices)."""
    nccl = _nccl()
    nccl.lib.ncclGroupStart()
    try:
        yield
    finally:
        nccl.lib.ncclGroupEnd()


class Communicator:
    """One rank of an NCCL clique on one GPU. ``close()`` destroys it; ``abort()`` tears it down without waiting
    for outstanding work (what a rank does when a peer died)."""

    def __init__(self, handle: int, rank: int, size: int, device):
        self.handle, self.rank, self.size, self.device = handle, int(rank), int(size), as_device(device)
        self._lock = threading.Lock()  # check/abort/close: the watchdog's thread may call them
        self._failure: BaseException | None = None  # raised by every later call once aborted for a reason
        with _registry_lock:
            _registry.add(self)

    # -- making communicators -----------------------------------------------------------------------------------
    @classmethod
    def from_unique_id(cls, uid: bytes, rank: int, size: int, device) -> "Communicator":
        """``ncclCommInitRank``: every rank of the clique calls this with the same 128-byte ``uid``."""
        nccl = _nccl()
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != nccl.NCCL_UNIQUE_ID_BYTES:
            raise DnnbindValueError(f"Communicator.from_unique_id: uid must be {nccl.NCCL_UNIQUE_ID_BYTES} bytes "
                             f"(dnnbind.distributed.nccl_unique_id()), got {type(uid).__name__} of "
                             f"{len(uid) if hasattr(uid, '__len__') else '?'}")
        if not 0 <= int(rank) < int(size):
            raise DnnbindValueError(f"Communicator.from_unique_id: rank {rank} must be in [0, size={size})")
        device = _gpu("Communicator.from_unique_id", device)
        device.activate()
        comm = ctypes.c_void_p()
        nccl.lib.ncclCommInitRank(ctypes.byref(comm), int(size), nccl.ncclUniqueId.from_buffer_copy(bytes(uid)),
                                  int(rank))
        return cls(comm.value, rank, size, device)

    @classmethod
    def for_devices(cls, devices) -> list:
        """``ncclCommInitAll``: one communicator per device of ``devices`` (GPUs of this process), rank i on
        devices[i]."""
        devices = [_gpu("Communicator.for_devices", d) for d in devices]
        if not devices or len({d.index for d in devices}) != len(devices):
            raise DnnbindValueError(f"Communicator.for_devices: needs distinct GPUs, got {devices}")
        nccl = _nccl()
        comms = (ctypes.c_void_p * len(devices))()
        devlist = (ctypes.c_int * len(devices))(*[d.index for d in devices])
        nccl.lib.ncclCommInitAll(comms, len(devices), devlist)
        return [cls(comms[i], i, len(devices), d) for i, d in enumerate(devices)]

    # -- collectives ----------------------------------------------------------------------------------------------
    def all_reduce(self, x: NDArray, out: NDArray | None = None, op: str = "sum") -> NDArray:
        """out = op over ranks of x (``ncclAllReduce``); ``out=x`` reduces in place. Returns out."""
        nccl = _nccl()
        dtype = self._check("all_reduce", x)
        out = self._out("all_reduce", out, x.shape, x)
        nccl.lib.ncclAllReduce(x.ptr, out.ptr, x.size, dtype, nccl.nccl_op(op, x.dtype), self.handle,
                               self._stream())
        return out

    def broadcast(self, x: NDArray, root: int = 0, out: NDArray | None = None) -> NDArray:
        """out = root's x on every rank (``ncclBroadcast``); ``out=x`` in place."""
        nccl = _nccl()
        dtype = self._check("broadcast", x)
        if not 0 <= int(root) < self.size:
            raise DnnbindValueError(f"broadcast: root {root} must be in [0, size={self.size})")
        out = self._out("broadcast", out, x.shape, x)
        nccl.lib.ncclBroadcast(x.ptr, out.ptr, x.size, dtype, int(root), self.handle, self._stream())
        return out

    def all_gather(self, x: NDArray, out: NDArray | None = None) -> NDArray:
        """out = every rank's x stacked along axis 0, rank order: shape (size * x.shape[0], ...)."""
        nccl = _nccl()
        dtype = self._check("all_gather", x)
        shape = (self.size * x.shape[0],) + tuple(x.shape[1:]) if x.ndim else (self.size,)
        out = self._out("all_gather", out, shape, x)
        nccl.lib.ncclAllGather(x.ptr, out.ptr, x.size, dtype, self.handle, self._stream())
        return out

    def reduce_scatter(self, x: NDArray, out: NDArray | None = None, op: str = "sum") -> NDArray:
        """Rank r's out = op over ranks of x's r-th slice along axis 0: x.shape[0] must divide by size."""
        nccl = _nccl()
        dtype = self._check("reduce_scatter", x)
        if x.ndim == 0 or x.shape[0] % self.size:
            raise DnnbindValueError(f"reduce_scatter: x's first axis must divide by size={self.size}, got shape {x.shape}")
        out = self._out("reduce_scatter", out, (x.shape[0] // self.size,) + tuple(x.shape[1:]), x)
        nccl.lib.ncclReduceScatter(x.ptr, out.ptr, out.size, dtype, nccl.nccl_op(op, x.dtype), self.handle,
                                   self._stream())
        return out

    # -- health and teardown --------------------------------------------------------------------------------------
    def check(self, wait: bool = True) -> None:
        """Raise NcclError if the communicator hit an asynchronous error (``ncclCommGetAsyncError``), e.g. a peer
        that died; a rank that sees one should ``abort()``. ``wait=False`` (the watchdog's poll) returns at once,
        checking nothing, while another thread is closing or aborting the communicator."""
        nccl = _nccl()
        err = ctypes.c_int()
        if not self._lock.acquire(blocking=wait):
            return
        try:
            nccl.lib.ncclCommGetAsyncError(self._live("check"), ctypes.byref(err))
        finally:
            self._lock.release()
        if err.value not in (nccl.ncclSuccess, nccl.ncclInProgress):
            raise nccl.NcclError(err.value, "ncclCommGetAsyncError", nccl.error_message(err.value, self.handle))

    def abort(self, reason: BaseException | None = None) -> None:
        """``ncclCommAbort``: tear the communicator down without waiting for its outstanding work; NCCL kernels
        blocked on a dead peer exit. With ``reason``, every later call on this communicator raises it.
        NOTE: may be called from another thread while this one waits on the GPU (what the watchdog does)."""
        if reason is not None and self._failure is None:
            self._failure = reason  # before the handle goes: a collective racing the abort still sees why
        with self._lock:
            if self.handle:
                h, self.handle = self.handle, None
                self.device.activate()  # per thread: the watchdog's thread starts on device 0
                _nccl().lib.ncclCommAbort(h)

    def close(self) -> None:
        with self._lock:
            if self.handle:
                h, self.handle = self.handle, None
                self.device.activate()
                _nccl().lib.ncclCommDestroy(h)

    def __repr__(self) -> str:
        return f"Communicator(rank {self.rank} of {self.size} on {self.device!r}{'' if self.handle else ', closed'})"

    # -- helpers --------------------------------------------------------------------------------------------------
    def _live(self, what: str) -> int:
        if not self.handle:
            if self._failure is not None:
                raise self._failure
            raise RuntimeError(f"{what}: the communicator is closed")
        return self.handle

    def _stream(self) -> int:
        """The collective's stream: its device's current one, with the device made current (NCCL enqueues on it)."""
        self.device.activate()
        return current_stream(self.device).handle

    def _check(self, what: str, x) -> int:
        self._live(what)
        if not isinstance(x, NDArray):
            raise DnnbindTypeError(f"{what}: x must be a dnnbind NDArray, got {type(x).__name__}")
        if x.device is not self.device:
            raise DnnbindValueError(f"{what}: x (shape {x.shape}) is on {x.device!r}, this communicator's rank is on "
                             f"{self.device!r}")
        return _nccl().nccl_dtype(x.dtype)

    def _out(self, what: str, out, shape: tuple, x: NDArray) -> NDArray:
        if out is None:
            return empty(shape, x.dtype, self.device)
        if not isinstance(out, NDArray):
            raise DnnbindTypeError(f"{what}: out must be a dnnbind NDArray, got {type(out).__name__}")
        if out.shape != tuple(shape) or out.dtype != x.dtype or out.device is not self.device:
            raise DnnbindValueError(f"{what}: out has shape {out.shape}, {out.dtype} on {out.device!r}; expected "
                             f"{tuple(shape)}, {x.dtype} on {self.device!r}")
        return out


def _gpu(what: str, device):
    d = as_device(device)
    if d.kind != "gpu":
        raise DnnbindValueError(f"{what}: NCCL communicates between GPUs, got {d!r}")
    return d
