"""Where this process sits in the job, read from the launcher that started it: torchrun (and
``python -m dnnbind.launch``), Open MPI's ``mpirun``, MPICH/Intel MPI (PMI), or Slurm's ``srun``.

Layer: distributed; stdlib only, imports nothing of dnnbind but its error classes.

Each launcher names the same three numbers differently (the first one whose variables are present wins, in the
order of LAUNCHERS):

    launcher     rank                   world size             local rank
    torchrun     RANK                   WORLD_SIZE             LOCAL_RANK
    Open MPI     OMPI_COMM_WORLD_RANK   OMPI_COMM_WORLD_SIZE   OMPI_COMM_WORLD_LOCAL_RANK
    MPICH (PMI)  PMI_RANK               PMI_SIZE               MPI_LOCALRANKID
    Slurm        SLURM_PROCID           SLURM_NTASKS           SLURM_LOCALID

The rendezvous address is MASTER_ADDR/MASTER_PORT where set. Under Slurm without MASTER_ADDR it is the first host
of SLURM_JOB_NODELIST (SLURM_NODELIST), which runs rank 0 with srun's default block distribution. Under MPI the
NCCL id can go through MPI itself (``mpi4py``), so no address is needed at all (distributed.nccl_unique_id).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from .._lib.errors import DnnbindValueError

# (name, rank, world size, local rank): the variables of each launcher, most specific first. torchrun is first so
# that a torchrun started inside a Slurm allocation (SLURM_* are inherited) is read as torchrun.
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)
MPI_LAUNCHERS = ("openmpi", "mpich")


class Placement(NamedTuple):
    launcher: str  # one of LAUNCHERS' names, or "none" for a single process
    rank: int
    world_size: int
    local_rank: int
    addr: str
    port: int


def _int(env, name: str, default: int | None = None) -> int:
    value = env.get(name, "")
    if value == "":
        if default is None:
            raise DnnbindValueError(f"environment variable {name} is missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise DnnbindValueError(f"environment variable {name}={value!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``; ``a1,a2`` -> ``a1``."""
    text = nodelist.strip()
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", text)
    if not m or not m.group(1):
        raise DnnbindValueError(f"cannot read the first host of SLURM_NODELIST={nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]  # zero padding is part of the name: keep it as written
    return prefix + first


def placement(env=None) -> Placement:
    """Read the launcher's variables from ``env`` (default os.environ); a world of one when there are none."""
    env = os.environ if env is None else env
    for name, r_var, ws_var, lr_var in LAUNCHERS:
        if r_var in env and ws_var in env:
            r, ws = _int(env, r_var), _int(env, ws_var)
            lr = _int(env, lr_var, r)
            break
    else:
        name, r, ws, lr, r_var, ws_var = "none", 0, 1, 0, "RANK", "WORLD_SIZE"
    if ws < 1 or not 0 <= r < ws:
        raise DnnbindValueError(f"{r_var}={r} must be in [0, {ws_var}={ws}) ({name}'s variables); start workers "
                                f"with python -m dnnbind.launch, torchrun, mpirun or srun")
    addr = env.get("MASTER_ADDR", "")
    if not addr and name == "slurm":
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        addr = first_host(nodelist) if nodelist else ""
    return Placement(name, r, ws, lr, addr or "127.0.0.1", _int(env, "MASTER_PORT", 29500))
