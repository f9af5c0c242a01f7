"""PyTorch's side of scripts/bench_scaling.py: the same d2l ResNet-18 (or AlexNet) training step under
DistributedDataParallel, one process per GPU, started by torchrun. Rank 0 writes images/s and ms/step as JSON.

    python -m torch.distributed.run --standalone --nproc-per-node 4 scripts/bench_ddp_torch.py \\
        --model resnet18 --batch 256 --warmup 30 --steps 50 --tf32 --json runs/ddp_4.json
    python -m torch.distributed.run --standalone --nproc-per-node 1 scripts/bench_ddp_torch.py --tf32   # DDP, 1 GPU
    python scripts/bench_ddp_torch.py --no-ddp --tf32     # one GPU, no DDP wrapper, no process group

Layer: script; imports torch, and d2l_compare.py for the model (its torch.nn build of the d2l architecture, the one
bench_models.py and d2l_compare.py compare against; importing it imports dnnbind, which touches no GPU) and
bench_scaling.py for the settings both frameworks share.

The same run as bench_scaling.py's dnnbind runs: d2l_compare's model (ResNet-18 7x7 stem, 1x96x96, 10 classes), batch
--batch per GPU, NCHW (dnnbind's layout for it), float32 with TF32 math under --tf32 (cuBLAS and cuDNN),
cudnn.benchmark on, SGD lr 0.05 momentum 0.9 on the mean softmax cross entropy (DDP averages the gradients over the
ranks: the mean over the global batch, as dnnbind's trainer.step(batch * world)), a pool of fixed random batches
resident on each GPU drawn as bench_scaling draws them (seed + rank), cycled. Weights are torch's default
initialization (the same on every rank: DDP broadcasts rank 0's); the speed does not depend on them.

Timed as bench_scaling times dnnbind: --warmup steps, a barrier, then --steps steps between two synchronizes of the
device; ms/step is rank 0's wall time over the timed steps (the slowest rank's and CUDA-event times are written too).
DDP is torch's default: buckets of 25 MB all-reduced while the backward runs, BatchNorm buffers broadcast from rank
0 each forward. NCCL_NVLS_ENABLE=0 is set unless the environment sets it (NVLink multicast off, FACTS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]  # the checkout (dnnbind) and scripts/ (d2l_compare, bench_scaling)

from bench_scaling import LR, MODELS, MOMENTUM, POOL  # noqa: E402  (one place for the settings both sides share)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--batch", type=int, default=None, help="per GPU (default: the book's, ResNet-18 256)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps (cudnn.benchmark's search, compiling)")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tf32", action="store_true", help="TF32 math in cuBLAS and cuDNN (else strict FP32)")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP-wrapped model")
    p.add_argument("--no-ddp", action="store_true", help="one GPU, the bare model: no DDP wrapper, no process group")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the process group's collectives")
    p.add_argument("--json", default=None, help="rank 0 writes its result here")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be >= 1")
    return args


def build_model(torch, spec, seed: int):
    """d2l_compare's torch.nn model, its lazy layers materialized on the host (DDP needs real parameters)."""
    torch.manual_seed(seed)
    net = spec.build_torch().eval()  # predict mode for the shape-inferring forward: BatchNorm statistics untouched
    with torch.no_grad():
        net(torch.zeros(2, 1, spec.size, spec.size))
    return net.train()


def make_pool(torch, spec, batch: int, device, seed: int):
    """bench_scaling._pool's batches: POOL images then POOL label vectors from default_rng(seed), on the device."""
    rng = np.random.default_rng(seed)
    xs = [torch.from_numpy(rng.random((batch, 1, spec.size, spec.size), dtype=np.float32)).to(device)
          for _ in range(POOL)]
    ys = [torch.from_numpy(rng.integers(0, 10, batch).astype(np.int64)).to(device) for _ in range(POOL)]
    return xs, ys


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before NCCL starts
    import d2l_compare as d2l  # the model builder; installs dnnbind's mxnet alias, touches no GPU
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    spec = d2l.SPECS[MODELS[args.model]]
    args.batch = args.batch or spec.batch_size
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if args.no_ddp and world != 1:
        raise SystemExit(f"bench_ddp_torch.py --no-ddp runs on one GPU; WORLD_SIZE is {world}")
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
        raise SystemExit(f"bench_ddp_torch.py: rank {rank} needs GPU {local_rank}; torch sees "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    # NOTE: cuDNN's allow_tf32 is True by default in torch: set both flags either way, as bench_models.py does.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    ddp = not args.no_ddp
    if ddp:  # env:// from torchrun; device_id binds the group to this GPU and starts NCCL now
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout), device_id=device)
        world, rank = dist.get_world_size(), dist.get_rank()

    net = build_model(torch, spec, args.seed).to(device)  # NCHW, contiguous: dnnbind's layout for this model
    model = DistributedDataParallel(net, device_ids=[local_rank]) if ddp else net
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    xs, ys = make_pool(torch, spec, args.batch, device, args.seed + rank)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[i % POOL]), ys[i % POOL])
        loss.backward()  # DDP: the bucketed all-reduce (average over ranks) overlaps the backward
        opt.step()
        return loss

    first = step(0).item()  # the first step's loss, before any update (a sanity value, ~ln 10)
    for i in range(1, args.warmup):
        step(i)
    torch.cuda.synchronize()
    if ddp:  # every rank starts the timed steps together
        dist.barrier(device_ids=[local_rank])
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for i in range(args.steps):
        loss = step(i)
    end.record()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    event_ms = start.elapsed_time(end) / args.steps
    slowest = seconds
    if ddp:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        slowest = float(t.item())
    nccl = torch.cuda.nccl.version()
    result = {"status": "ok", "framework": "torch", "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(),
              "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
              "gpu_name": torch.cuda.get_device_name(device), "model": args.model, "gpus": world,
              "ddp": ddp, "compile": args.compile, "tf32": args.tf32, "layout": "NCHW", "batch_per_gpu": args.batch,
              "lr": LR, "momentum": MOMENTUM, "pool_batches": POOL, "warmup_steps": args.warmup,
              "timed_steps": args.steps, "ms_per_step": seconds * 1e3 / args.steps,
              "images_per_s": args.batch * world * args.steps / seconds,
              "ms_per_step_slowest_rank": slowest * 1e3 / args.steps, "event_ms_per_step": event_ms,
              "first_loss": first, "final_loss": loss.item(),
              "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if rank == 0:
        what = f"DDP{' + torch.compile' if args.compile else ''}" if ddp else "no DDP"
        print(f"torch {what}, {world} GPU(s): {result['ms_per_step']:.2f} ms/step (slowest rank "
              f"{result['ms_per_step_slowest_rank']:.2f}, events {event_ms:.2f}), {result['images_per_s']:,.0f} "
              f"images/s; loss first {first:.4f} last {result['final_loss']:.4f}", flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if ddp:
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
