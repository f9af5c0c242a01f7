"""Check that every rank of a launched world reaches the others through NCCL, and how fast.

    python -m dnnbind.launch --nproc-per-node 2 scripts/allreduce_check.py
    # two machines: on each, the same command with --nnodes 2 --node-rank R --master-addr <rank-0 host>

Each rank joins the rendezvous (dnnbind.distributed.init: a TCP exchange with MASTER_ADDR:MASTER_PORT), makes its
NCCL communicator on gpu(LOCAL_RANK), all-reduces a buffer holding its rank + 1 and checks that every element is
1 + 2 + ... + world_size. Then it times all-reduces of --mib MiB and rank 0 prints the bus bandwidth (NCCL's
"busbw": data moved per link, 2 (n - 1) / n of the buffer per all-reduce). Run with NCCL_DEBUG=INFO to see which
transport (NVLink/P2P, shared memory, sockets, InfiniBand) NCCL picked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import dnnbind as mx  # noqa: E402
from dnnbind import distributed  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=64.0, help="size of the timed all-reduce, MiB of float32")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every rank at the rendezvous")
    args = p.parse_args(argv)
    distributed.init(timeout=args.timeout)
    rank, world = distributed.rank(), distributed.world_size()
    if mx.num_gpus() == 0:
        raise SystemExit(f"rank {rank}: allreduce_check needs a GPU per rank: {mx.runtime.gpu_status()[1]}")
    dev = mx.gpu(distributed.local_rank())
    comm = distributed.communicator(dev, timeout=args.timeout)
    x = mx.array(np.full((1024,), rank + 1, np.float32), device=dev)
    comm.all_reduce(x, out=x)
    want = world * (world + 1) / 2
    got = x.numpy()
    if not np.all(got == want):
        raise SystemExit(f"rank {rank}: all_reduce gave {got[:4]}..., expected {want} everywhere")
    n = max(int(args.mib * 2**20) // 4, 1)
    buf = mx.array(np.ones((n,), np.float32), device=dev)
    stream = mx.current_stream(dev)
    for _ in range(3):
        comm.all_reduce(buf, out=buf)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        comm.all_reduce(buf, out=buf)
    stream.synchronize()
    seconds = (time.perf_counter() - t0) / args.iters
    if rank == 0:
        bus = 2 * (world - 1) / world * n * 4 / seconds / 1e9 if world > 1 else float("nan")
        print(f"all_reduce ok on {world} rank(s): sum {want:g} everywhere; {args.mib:g} MiB in "
              f"{seconds * 1e3:.3f} ms, bus bandwidth {bus:.1f} GB/s")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
