"""Multi-process state: which rank this process is, how many there are, and how they meet.

Layer: distributed (below gluon); imports runtime at import. dnnbind._lib.nccl is imported lazily, by
nccl_unique_id() and the communicators (comm.py), so this package works (and init() works) on a machine without
NCCL. ``communicator()`` gives this process's rank of the world's NCCL clique.

The environment is torchrun's, as set by `python -m dnnbind.launch`: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT. With none of them set, init() makes a single-process world of size 1.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import os

from ._rendezvous import SECRET_ENV, RendezvousError, barrier, exchange, secret_from_env
from .comm import Communicator, group  # imports NCCL only when a communicator is made

__all__ = ["SECRET_ENV", "Communicator", "RendezvousError", "barrier", "communicator", "exchange", "group", "init",
           "is_initialized", "local_rank", "master", "nccl_unique_id", "rank", "secret_from_env", "shutdown",
           "world_size"]

_state: dict | None = None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DnnbindValueError(f"environment variable {name}={value!r} is not an integer") from None


def init(timeout: float = 300.0, barrier_on_init: bool = True) -> None:
    """Read the launcher's environment and remember this process's place in the world.

    With world_size > 1 and barrier_on_init, waits (up to `timeout` seconds) until every rank has called init,
    so a worker that never started is reported here (naming the missing ranks) rather than as a hang later.
    """
    global _state
    ws = _env_int("WORLD_SIZE", 1)
    r = _env_int("RANK", 0)
    lr = _env_int("LOCAL_RANK", r)
    addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = _env_int("MASTER_PORT", 29500)
    if ws < 1 or not 0 <= r < ws:
        raise DnnbindValueError(f"RANK={r} must be in [0, WORLD_SIZE={ws}); start workers with python -m dnnbind.launch")
    secret = secret_from_env()  # python -m dnnbind.launch makes one per job: strangers can't join
    state = {"rank": r, "world_size": ws, "local_rank": lr, "addr": addr, "port": port, "timeout": timeout,
             "secret": secret}
    if ws > 1 and barrier_on_init:
        barrier(r, ws, addr, port, timeout, secret)
    _state = state


def shutdown() -> None:
    """Forget the world (init may be called again)."""
    global _state
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
    addr, port = master()
    return exchange(blob, r, ws, addr, port, _get("timeout") if timeout is None else timeout, _get("secret"))


def communicator(device=None, timeout: float | None = None) -> Communicator:
    """This process's rank of the world's NCCL clique, on ``device`` (default: gpu(LOCAL_RANK)), after init():
    the unique id goes through the rendezvous, then ``ncclCommInitRank``."""
    from ..runtime.device import gpu
    uid = nccl_unique_id(timeout)
    return Communicator.from_unique_id(uid, rank(), world_size(), gpu(local_rank()) if device is None else device)
