"""Where the participants of a synchronized operator meet: SyncBatchNorm's devices exchanging their per-channel
statistics (forward) and gradient sums (backward). Layer: ops; imports runtime. ``dnnbind.kvstore`` and
``dnnbind.distributed`` sit above ops and are imported lazily, inside the functions that need them.

``all_gather(op, key, ndev, phase, local, device)`` returns every participant's ``local`` stacked along a new
axis 0, in the same order for every participant (so each computes the same bits from it). Who participates:

- **launched processes** (``python -m dnnbind.launch``, ``dnnbind.distributed.init()`` with world size > 1): every
  rank of the world, one GPU each, through the world's NCCL communicator (``dnnbind.kvstore.world_communicator``,
  made once per device and shared with the KVStore). Every rank calls the layers in the same order, so the
  collectives pair up on the GPU; no host barrier.
- **one process, several contexts, one thread each** (what ``gluoncv.utils.parallel`` does with ``sync=True``): the
  ``ndev`` calls of one ``(key, phase)`` meet at a barrier. GPUs then all-gather through NCCL, one communicator
  per device of one clique (``ncclCommInitAll``, made by the last to arrive, kept per set of devices), each thread
  on its own communicator; the cpu (and GPUs with DNNBIND_SYNC_TRANSPORT=host) exchange numpy arrays at the
  barrier itself, as MXNet's own SyncBatchNorm does through host memory.

MXNet's engine runs each device's work on its own threads, so MXNet accepts the ``ndev`` calls one after another
from one Python thread; dnnbind's calls run when made, and the first would wait forever for the others. A call
from the main thread (where gluoncv's sequential loops and ``autograd.backward(losses)`` run) is therefore refused
at once with an error naming the op, ndev and the two supported ways; any other wait ends after ``timeout()``
seconds (DNNBIND_SYNC_TIMEOUT, default 120) in an error naming who came and who did not: never a hang.

A recording (hybridize()'s, a RecordedStep's) is refused: its replay re-issues library calls only, neither this
meeting nor the NCCL call, so a Block holding a synchronized SyncBatchNorm stays eager.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from .._lib.errors import DnnbindError, DnnbindValueError
from .._lib.hooks import RECORDING
from ..runtime.array import NDArray, array
from .opdef import view

__all__ = ["SyncTimeoutError", "all_gather", "participants", "set_timeout", "timeout"]

_TIMEOUT = float(os.environ.get("DNNBIND_SYNC_TIMEOUT", "120"))


class SyncTimeoutError(DnnbindError, RuntimeError):
    """The participants of a synchronized op did not all arrive in time (or one of them gave up)."""


def timeout() -> float:
    """Seconds a participant waits for the others at the barrier before raising SyncTimeoutError."""
    return _TIMEOUT


def set_timeout(seconds: float) -> float:
    """Set the barrier's wait (also DNNBIND_SYNC_TIMEOUT); returns the previous value."""
    global _TIMEOUT
    seconds = float(seconds)
    if not seconds > 0:
        raise DnnbindValueError(f"set_timeout: seconds must be > 0, got {seconds!r}")
    previous, _TIMEOUT = _TIMEOUT, seconds
    return previous


def _transport() -> str:
    t = os.environ.get("DNNBIND_SYNC_TRANSPORT", "nccl")
    if t not in ("nccl", "host"):
        raise DnnbindValueError(f"DNNBIND_SYNC_TRANSPORT must be 'nccl' or 'host', got {t!r}")
    return t


def _world_size() -> int:
    from .. import distributed  # lazy: distributed sits above ops
    return distributed.world_size() if distributed.is_initialized() else 1


def participants(ndev: int) -> str:
    """How the ``ndev`` participants of a call meet: "single" (ndev 1: nothing to meet), "world" (launched
    processes) or "threads" (one process, a thread per context)."""
    if ndev == 1:
        return "single"
    return "world" if _world_size() > 1 else "threads"


_WAYS = ("Synchronized BatchNorm runs in two ways: (1) one process per GPU, launched with `python -m dnnbind.launch` "
         "(dnnbind.distributed.init(), world size > 1); (2) one process with several contexts, each context's "
         "forward AND backward in its own thread (gluoncv.utils.parallel.parallel_apply(..., sync=True) or "
         "Parallel(..., serial_init=False), or a threading.Thread per context running net(x) and loss.backward()). "
         "With a single device per model copy use ndev=1 (SyncBatchNorm(num_devices=1)), which is plain BatchNorm.")


def _sequential_error(op: str, key: str, ndev: int, phase: str, device, why: str) -> DnnbindValueError:
    return DnnbindValueError(
        f"{op} (key {key!r}, ndev={ndev}): the {phase} on {device!r} {why}; the {ndev} participants must run at the "
        f"same time, but called one after another from one thread the first would wait for the others forever "
        f"(MXNet's asynchronous engine allowed that, dnnbind runs each call when it is made). {_WAYS}")


# -- launched processes ------------------------------------------------------------------------------------------

def _world_gather(op: str, key: str, ndev: int, local, device):
    from .. import distributed
    from ..kvstore import world_communicator  # lazy: kvstore sits above ops; it keeps one communicator per device
    ws = distributed.world_size()
    if device.kind != "gpu" or not isinstance(local, NDArray):
        raise DnnbindValueError(f"{op} (key {key!r}, ndev={ndev}): this process is rank {distributed.rank()} of {ws} "
                                f"(dnnbind.distributed.init()); the ranks synchronize through NCCL, which needs the "
                                f"data on gpu(dnnbind.distributed.local_rank()), got it on {device!r}")
    comm = world_communicator(device, op)
    out = comm.all_gather(local)  # (ws * k, ...) in rank order
    return view(out, (ws,) + tuple(local.shape))


# -- one process, a thread per context -----------------------------------------------------------------------------

class _Round:
    """One meeting of the ndev participants: who came (thread id -> (device, shape, local)), and how it ended."""
    __slots__ = ("slots", "done", "error", "comms", "order")

    def __init__(self):
        self.slots: dict = {}
        self.done = False
        self.error: BaseException | None = None
        self.comms = None
        self.order: list = []


class _Meeting:
    __slots__ = ("cond", "round")

    def __init__(self):
        self.cond = threading.Condition()
        self.round = _Round()


_meetings: dict = {}
_meetings_lock = threading.Lock()
_clique_comms: dict = {}  # tuple of devices -> [Communicator] (ncclCommInitAll), made once


def _clique(devices: tuple) -> list:
    comms = _clique_comms.get(devices)
    if comms is None or not all(c.handle for c in comms):
        from ..distributed.comm import Communicator  # lazy: distributed sits above ops
        comms = _clique_comms[devices] = Communicator.for_devices(list(devices))
    return comms


def _meeting(key: str, phase: str, ndev: int) -> _Meeting:
    k = (key, phase, ndev)
    with _meetings_lock:
        m = _meetings.get(k)
        if m is None:
            m = _meetings[k] = _Meeting()
        return m


def _close(r: _Round, gpu_nccl: bool) -> None:
    """The last participant is in: fix the order (by GPU index on GPUs, by arrival on the cpu) and, for NCCL,
    the communicators. Runs under the meeting's lock."""
    items = list(r.slots.items())
    if gpu_nccl or items[0][1][0].kind == "gpu":
        items.sort(key=lambda kv: kv[1][0].index)
    r.order = [t for t, _ in items]
    if gpu_nccl:
        r.comms = _clique(tuple(r.slots[t][0] for t in r.order))


def _thread_gather(op: str, key: str, ndev: int, phase: str, local, device):
    me = threading.current_thread()
    if me is threading.main_thread():
        raise _sequential_error(op, key, ndev, phase, device, "was called from the main thread")
    gpu = device.kind == "gpu"
    nccl = gpu and _transport() == "nccl"
    shape = tuple(local.shape)
    payload = None if nccl else (local.numpy() if isinstance(local, NDArray) else np.asarray(local))
    m = _meeting(key, phase, ndev)
    wait = _TIMEOUT
    with m.cond:
        r = m.round
        other = next((s for _, s, _ in r.slots.values()), shape)
        bad = None
        if any(gpu and d is device for d, _, _ in r.slots.values()):
            bad = DnnbindValueError(f"{op} (key {key!r}, ndev={ndev}): two participants of one {phase} are on "
                                    f"{device!r}; each of the ndev threads must run on its own GPU")
        elif other != shape:
            bad = DnnbindValueError(f"{op} (key {key!r}, ndev={ndev}): the participants' {phase} statistics have "
                                    f"shapes {other} and {shape}: every device must hold the same number of channels")
        if bad is not None:  # the round is over for everyone in it: those waiting raise the same error now
            r.error, r.done = bad, True
            m.round = _Round()
            m.cond.notify_all()
            raise bad
        r.slots[me.ident] = (device, shape, payload)
        if len(r.slots) == ndev:
            m.round = _Round()
            try:
                _close(r, nccl)
            except BaseException as e:  # every participant learns why (a failed ncclCommInitAll)
                r.error = e
            r.done = True
            m.cond.notify_all()
        elif not m.cond.wait_for(lambda: r.done, wait):
            came = [f"{d!r}" for d, _, _ in r.slots.values()]
            r.error = SyncTimeoutError(
                f"{op} (key {key!r}, ndev={ndev}): only {len(r.slots)} of {ndev} participants reached the {phase} "
                f"within {wait:g} s (arrived: {', '.join(came)}); the others never came. Check ndev (num_devices) "
                f"against the number of contexts, and that every context runs in its own thread; "
                f"DNNBIND_SYNC_TIMEOUT sets the wait. {_WAYS}")
            r.done = True
            if m.round is r:
                m.round = _Round()
            m.cond.notify_all()
        if r.error is not None:
            raise r.error
    if nccl:
        rank = r.order.index(me.ident)
        out = r.comms[rank].all_gather(local)  # on this thread's device and stream: NCCL pairs the threads up
        return view(out, (ndev,) + shape)
    stacked = np.stack([r.slots[t][2] for t in r.order])
    return array(stacked, device=device) if gpu else stacked


def all_gather(op: str, key: str, ndev: int, phase: str, local, device):
    """Every participant's ``local`` ((k, C) numpy on the cpu, an NDArray on a GPU) stacked as (P, k, C), the same
    order for all; ``phase`` ("forward", "backward") keeps a layer's two meetings apart. ndev must be > 1."""
    if RECORDING:  # a hybridized Block's or RecordedStep's replay would skip the meeting and the NCCL call
        RECORDING[-1].refuse(f"{op} exchanges statistics between devices at every call (key {key!r}, ndev={ndev}): "
                             "a replay of the recorded calls would not")
    if participants(ndev) == "world":
        return _world_gather(op, key, ndev, local, device)
    return _thread_gather(op, key, ndev, phase, local, device)
