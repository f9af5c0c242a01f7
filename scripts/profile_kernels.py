"""Each GPU kernel's share of one captured training step, from the CUDA graph replayed under
torch.profiler (its Kineto/CUPTI collects kernel names and durations; PyTorch is used only as the profiler).

    python scripts/profile_kernels.py --replays 50
"""

import argparse
import os
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from dnnbind.graph import CapturedStep  # noqa: E402
from models.simple_cnn import SimpleCNN  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--fp16", action="store_true", help="MXNet's mixed precision: net.cast('float16'), float32 master "
                   "weights in the Trainer (TF32 for what stays float32)")
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    mx.set_math_mode("tf32" if args.tf32 or args.fp16 else "fp32")
    dev = mx.gpu(0)
    net = SimpleCNN(fuse_relu=True)
    net.initialize(mx.init.TorchDefault(), ctx=dev)
    net(mx.zeros((2, 1, 28, 28), device=dev))
    if args.fp16:
        net.cast("float16")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9,
                                                          "multi_precision": args.fp16})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = mx.array(rng.random((64, 1, 28, 28), dtype=np.float32).astype(np.float16 if args.fp16 else np.float32),
                 device=dev)
    y = mx.array(rng.integers(0, 10, 64).astype(np.int32), device=dev)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(64)
        return loss

    captured = CapturedStep(step, inputs=[x, y], preserve=trainer.state_arrays())
    print(f"graph nodes: {captured.num_nodes()}")
    for _ in range(20):
        captured()
    mx.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(200):
        captured()
    mx.synchronize(dev)
    wall = (time.perf_counter() - t0) / 200 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            captured()
        mx.synchronize(dev)
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in per.values()) / args.replays
    print(f"replayed step: {wall:.1f} us wall per step; kernels and copies sum to {total:.1f} us per step "
          f"({total / wall:.0%}); the rest is launch gaps between graph nodes")
    print(f"{'us/step':>8} {'share':>6} {'n/step':>6}  kernel")
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / args.replays:8.1f} {us / args.replays / total:6.1%} {n / args.replays:6.1f}  {name[:110]}")
    del torch


if __name__ == "__main__":
    main()
