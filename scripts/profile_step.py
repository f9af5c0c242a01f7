"""Where the host time of an eager training step goes: cProfile over N steps of the SimpleCNN on the GPU.

    python scripts/profile_step.py --steps 300
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from models.simple_cnn import SimpleCNN  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--top", type=int, default=35)
    args = p.parse_args()
    dev = mx.default_device()
    net = SimpleCNN(fuse_relu=True)
    net.initialize(mx.init.TorchDefault(), ctx=dev)
    net(mx.zeros((2, 1, 28, 28), device=dev))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = mx.array(rng.random((64, 1, 28, 28), dtype=np.float32), device=dev)
    y = mx.array(rng.integers(0, 10, 64).astype(np.int32), device=dev)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(64)

    for _ in range(20):
        step()
    mx.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    mx.synchronize(dev)
    print(f"{(time.perf_counter() - t0) / args.steps * 1e6:.0f} us per step (wall, {dev})")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    mx.synchronize(dev)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
