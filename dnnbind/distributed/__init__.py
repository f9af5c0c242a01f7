"""Multi-process state: which rank this process is, how many there are, and how they meet.

Layer: distributed (below gluon); imports runtime at import. dnnbind._lib.nccl is imported lazily, by
nccl_unique_id() and the communicators (comm.py), so this package works (and init() works) on a machine without
NCCL. ``communicator()`` gives this process's rank of the world's NCCL clique.

The rank, world size and local rank come from the launcher that started the process (launchers.py): torchrun's
variables, as `python -m dnnbind.launch` sets them, or Open MPI's, MPICH's (PMI) or Slurm's. With none of them set,
init() makes a single-process world of size 1. Under an MPI launcher with mpi4py importable, the NCCL id and the
barriers go through MPI; otherwise through the TCP rendezvous at MASTER_ADDR:MASTER_PORT.

With world_size > 1, init() also starts the watchdog (_watchdog.py): a rank that dies makes the others exit with
an error naming it (RankFailedError) instead of hanging in NCCL, whatever launcher started them.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import os

from . import _watchdog
from ._rendezvous import SECRET_ENV, RendezvousError, barrier, connect, exchange, secret_from_env
from ._watchdog import RankFailedError
from .comm import Communicator, group  # imports NCCL only when a communicator is made
from .launchers import MPI_LAUNCHERS, first_host, placement

__all__ = ["SECRET_ENV", "Communicator", "RankFailedError", "RendezvousError", "barrier", "communicator", "connect",
           "exchange", "group", "init", "is_initialized", "launcher", "local_rank", "master", "nccl_unique_id", "rank",
           "secret_from_env", "shutdown", "world_size", "first_host", "placement"]

_state: dict | None = None


def init(timeout: float = 300.0, barrier_on_init: bool = True, watchdog: bool | None = None) -> None:
    """Read the launcher's environment and remember this process's place in the world.

    With world_size > 1 and barrier_on_init, waits (up to `timeout` seconds) until every rank has called init,
    so a worker that never started is reported here (naming the missing ranks) rather than as a hang later.

    ``watchdog`` (None: on unless DNNBIND_WATCHDOG=0): with world_size > 1, a daemon thread makes this rank exit
    with an error naming the failed rank when another rank dies or NCCL reports an error (docs/distributed.md,
    "When a rank dies"). It watches the other ranks through connections the TCP barrier leaves open, so without
    barrier_on_init, or under mpirun with mpi4py, it watches only NCCL's errors.
    """
    global _state
    _watchdog.stop()  # init() again without shutdown(): the previous world's watchdog says goodbye
    where = placement()
    r, ws = where.rank, where.world_size
    secret = secret_from_env()  # python -m dnnbind.launch makes one per job: strangers can't join
    mpi = _mpi_world() if where.launcher in MPI_LAUNCHERS and ws > 1 else None
    watch = ws > 1 and _watchdog.enabled(watchdog)
    limits = _watchdog.settings() if watch else None  # a bad DNNBIND_WATCHDOG_* fails before the barrier
    state = {"rank": r, "world_size": ws, "local_rank": where.local_rank, "addr": where.addr, "port": where.port,
             "timeout": timeout, "secret": secret, "launcher": where.launcher, "mpi": mpi}
    links: dict = {}
    if ws > 1 and barrier_on_init:
        if mpi is not None:
            mpi.Barrier()
        elif watch:  # the same barrier, leaving each rank > 0 connected to rank 0 for the watchdog
            links = connect(r, ws, where.addr, where.port, timeout, secret)
        else:
            barrier(r, ws, where.addr, where.port, timeout, secret)
    if watch:
        _watchdog.start(r, links, *limits)
    _state = state


def _mpi_world():
    """MPI's COMM_WORLD when mpi4py is importable (the job was started by mpirun), else None: the TCP rendezvous
    is used instead."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def shutdown() -> None:
    """Forget the world (init may be called again). The watchdog says goodbye to the other ranks (this rank
    finishing is not a death) and stops."""
    global _state
    _watchdog.stop()
    _state = None


def is_initialized() -> bool:
    return _state is not None


def _get(key: str):
    if _state is None:
        raise RuntimeError(f"dnnbind.distributed.{key}() called before dnnbind.distributed.init()")
    return _state[key]


def rank() -> int:
    return _get("rank")


def world_size() -> int:
    return _get("world_size")


def local_rank() -> int:
    return _get("local_rank")


def launcher() -> str:
    """Which launcher started this process: torchrun, openmpi, mpich, slurm, or none."""
    return _get("launcher")


def master() -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) as init() read them."""
    return _get("addr"), _get("port")


# -- NCCL: kept apart so everything above works without it -------------------------------------------------------

def nccl_unique_id(timeout: float | None = None) -> bytes:
    """Rank 0 makes an ncclUniqueId and every rank returns the same 128 bytes (the input of ncclCommInitRank).

    ``communicator()`` below makes the communicator from it; this is only the exchange.
    """
    import importlib
    try:  # lazy (importing opens nothing); through sys.modules, so a blocked import is seen as one
        nccl = importlib.import_module("dnnbind._lib.nccl")
    except ImportError as e:
        raise NotImplementedError("dnnbind.distributed.nccl_unique_id needs NCCL bindings (dnnbind._lib.nccl), "
                                  "which are not available") from e
    r, ws = rank(), world_size()
    blob = None
    if r == 0:
        uid = nccl.get_unique_id()
        blob = uid if isinstance(uid, bytes) else bytes(uid)  # a ctypes struct gives its raw bytes
    mpi = _get("mpi")
    if mpi is not None:  # started by mpirun with mpi4py: MPI carries the id, no port to open
        return bytes(mpi.bcast(blob, root=0))
    addr, port = master()
    return exchange(blob, r, ws, addr, port, _get("timeout") if timeout is None else timeout, _get("secret"))


def communicator(device=None, timeout: float | None = None) -> Communicator:
    """This process's rank of the world's NCCL clique, on ``device`` (default: gpu(LOCAL_RANK)), after init():
    the unique id goes through the rendezvous, then ``ncclCommInitRank``."""
    from ..runtime.device import gpu
    uid = nccl_unique_id(timeout)
    return Communicator.from_unique_id(uid, rank(), world_size(), gpu(local_rank()) if device is None else device)
