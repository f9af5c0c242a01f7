"""Data-parallel scaling of d2l-zh v1.0.0's ResNet-18 (or AlexNet) training from 1 to N GPUs: images/s and the
scaling efficiency, both ways dnnbind trains on several GPUs.

    python scripts/bench.py --model resnet18 --gpus 2          # both modes
    python scripts/bench_scaling.py --model resnet18 --gpus 2 --modes single
    python scripts/bench_scaling.py --model resnet18 --gpus 1  # the code paths on one GPU (no all-reduce)

- ``single``: one process, MXNet's way (d2l's multiple-gpus-gluon): ``net.initialize(ctx=[gpu(0), ..])``, one batch
  of --batch per GPU, a forward/backward per device inside one ``autograd.record()``, ``trainer.step`` summing the
  gradients with one NCCL all-reduce per device over its flat gradient buffer.
- ``launch``: one process per GPU under ``python -m dnnbind.launch``; each rank trains on its own batch of --batch
  and its Trainer all-reduces across processes.
The 1-GPU reference is the single-process loop on gpu(0). The network is hybridized (``--eager`` for the plain
loop). Batches are fixed random pools resident on each device, as in bench_models.py. Writes JSON.

Layer: script; imports dnnbind, scripts/d2l_compare.py (the models) and bench.py (versions).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]

import dnnbind as mx  # noqa: E402
from dnnbind import autograd, distributed, gluon  # noqa: E402

MODELS = {"resnet18": "resnet", "alexnet": "alexnet"}
POOL, LR, MOMENTUM = 4, 0.05, 0.9


def _net(d2l, spec, ctx, args):
    d2l.mx.random.seed(args.seed)
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=ctx)
    for c in ctx if isinstance(ctx, list) else [ctx]:
        net(mx.zeros((2, 1, spec.size, spec.size), device=c))  # finishes deferred init on every device
    if not args.eager:
        net.hybridize()
    return net


def _pool(spec, batch, device, seed):
    rng = np.random.default_rng(seed)
    xs = [mx.array(rng.random((batch, 1, spec.size, spec.size), dtype=np.float32), device=device)
          for _ in range(POOL)]
    ys = [mx.array(rng.integers(0, 10, batch).astype(np.int32), device=device) for _ in range(POOL)]
    return xs, ys


def _time(step, devices, warmup, steps) -> float:
    """Seconds per step: warm-up steps, then ``steps`` steps between two synchronizes of every device."""
    for i in range(warmup):
        step(i)
    for d in devices:
        mx.current_stream(d).synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    for d in devices:
        mx.current_stream(d).synchronize()
    return (time.perf_counter() - t0) / steps


def single_process(d2l, spec, n: int, args) -> dict:
    """One process, n GPUs (MXNet's multi-device Gluon): images/s."""
    devices = [mx.gpu(i) for i in range(n)]
    net = _net(d2l, spec, devices if n > 1 else devices[0], args)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    pools = [_pool(spec, args.batch, d, args.seed + i) for i, d in enumerate(devices)]

    def step(i):
        with autograd.record():
            losses = [loss_fn(net(xs[i % POOL]), ys[i % POOL]) for xs, ys in pools]
        autograd.backward(losses)
        trainer.step(args.batch * n)
    seconds = _time(step, devices, args.warmup, args.steps)
    return {"gpus": n, "ms_per_step": seconds * 1e3, "images_per_s": args.batch * n / seconds}


def launched_worker(d2l, spec, args) -> None:
    """One rank of ``python -m dnnbind.launch``: its own batch on gpu(LOCAL_RANK); rank 0 writes the result."""
    distributed.init(timeout=args.timeout)
    world, device = distributed.world_size(), mx.gpu(distributed.local_rank())
    net = _net(d2l, spec, device, args)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xs, ys = _pool(spec, args.batch, device, args.seed + distributed.rank())

    def step(i):
        with autograd.record():
            loss = loss_fn(net(xs[i % POOL]), ys[i % POOL])
        loss.backward()
        trainer.step(args.batch * world)  # MXNet's dist kvstore: the sum over ranks, divided by the global batch
    seconds = _time(step, [device], args.warmup, args.steps)
    distributed.barrier(distributed.rank(), world, *distributed.master(), args.timeout,
                        distributed.secret_from_env())
    if distributed.rank() == 0:
        with open(args.result, "w") as f:
            json.dump({"gpus": world, "ms_per_step": seconds * 1e3, "images_per_s": args.batch * world / seconds}, f)


def launched(n: int, args) -> dict:
    """Run this script under ``python -m dnnbind.launch --nproc-per-node n`` and read rank 0's result."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", str(n), "--master-port",
               str(args.master_port), os.path.abspath(__file__), "--worker", "--result", result, "--model",
               args.model, "--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps),
               "--seed", str(args.seed), "--timeout", str(args.timeout)] + (["--eager"] if args.eager else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(_HERE),
                                                                        os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the launched run failed (exit {proc.returncode}): {' '.join(cmd)}")
        with open(result) as f:
            return json.load(f)


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--gpus", type=int, default=2, help="GPUs to scale to (the reference is 1)")
    p.add_argument("--modes", nargs="+", choices=("single", "launch"), default=["single", "launch"])
    p.add_argument("--batch", type=int, default=None, help="per GPU (default: the book's, ResNet-18 256)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eager", action="store_true", help="do not hybridize the network")
    p.add_argument("--timeout", type=float, default=120.0, help="rendezvous timeout of the launched ranks")
    p.add_argument("--master-port", type=int, default=29511)
    p.add_argument("--json", default=None, help="default: runs/bench_scaling_<model>.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import d2l_compare as d2l  # the models; it installs the mxnet alias at import
    spec = d2l.SPECS[MODELS[args.model]]
    args.batch = args.batch or spec.batch_size
    mx.set_math_mode("tf32")
    if args.worker:
        launched_worker(d2l, spec, args)
        return None
    have = mx.num_gpus()
    if args.gpus < 1 or have < args.gpus:
        raise SystemExit(f"bench_scaling.py --gpus {args.gpus}: this machine has {have} GPU(s)")
    import bench
    out = {"model": args.model, "batch_per_gpu": args.batch, "hybridized": not args.eager, "math": "tf32",
           **bench.environment(None), "runs": {}}
    base = single_process(d2l, spec, 1, args)
    out["runs"]["1 GPU"] = base
    for mode in args.modes:
        r = single_process(d2l, spec, args.gpus, args) if mode == "single" else launched(args.gpus, args)
        r["scaling"] = r["images_per_s"] / base["images_per_s"]
        r["efficiency"] = r["scaling"] / args.gpus
        out["runs"][f"{mode}, {args.gpus} GPUs"] = r
    print(f"\n{args.model}, batch {args.batch} per GPU, TF32, {'hybridized' if not args.eager else 'eager'}")
    print(f"{'run':<22}{'ms/step':>10}{'images/s':>12}{'scaling':>10}{'efficiency':>12}")
    for name, r in out["runs"].items():
        print(f"{name:<22}{r['ms_per_step']:>10.2f}{r['images_per_s']:>12,.0f}{r.get('scaling', 1.0):>9.2f}x"
              f"{100 * r.get('efficiency', 1.0):>11.0f}%")
    path = args.json or f"runs/bench_scaling_{args.model}.json"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {path}")
    return out


if __name__ == "__main__":
    main()
