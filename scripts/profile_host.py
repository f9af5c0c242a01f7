"""Host time of each library call in one SimpleCNN training step: the step is recorded once
(dnnbind.graph.RecordedStep), then every recorded cuDNN/cuBLAS call and kernel launch is timed on its own
over many replays. Also prints the replayed step and the eager step per step, in the same process.

    python scripts/profile_host.py                 # conv calls may use backend-API plans (the default)
    python scripts/profile_host.py --compare       # and the same with the legacy conv API only
"""

import argparse
import os
import sys
import time
from collections import Counter, defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from dnnbind.graph import RecordedStep  # noqa: E402
from models.simple_cnn import SimpleCNN  # noqa: E402


def profile(dev, batch: int, replays: int, backend: bool, fuse_relu: bool) -> None:
    mx.set_conv_algo_policy("time", backend=backend)
    np.random.seed(0)
    net = SimpleCNN(fuse_relu=fuse_relu)
    net.initialize(mx.init.TorchDefault(), ctx=dev)
    net(mx.zeros((2, 1, 28, 28), device=dev))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.array(np.random.rand(batch, 1, 28, 28).astype(np.float32), device=dev)
    y = mx.array(np.random.randint(0, 10, batch).astype(np.int32), device=dev)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
        return loss

    rec = RecordedStep(step, inputs=[x, y], preserve=trainer.state_arrays())
    stream = mx.current_stream(dev)

    def per_step(fn, n):
        for _ in range(20):
            fn()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        stream.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    replayed, eager = per_step(rec, replays), per_step(step, replays // 2)
    print(f"\nconv API: {'backend plans + legacy' if backend else 'legacy only'}, fuse_relu={fuse_relu}: "
          f"{len(rec.calls)} calls per step")
    print(f"  recorded step replayed: {replayed:6.0f} us/step   eager step: {eager:6.0f} us/step")
    host, count = defaultdict(float), Counter()
    for _ in range(replays):
        for (fn, args, _), name in zip(rec._rec._calls, rec.calls):
            t0 = time.perf_counter()
            fn(*args)
            host[name] += time.perf_counter() - t0
        count.update(rec.calls)
        stream.synchronize()  # the GPU never falls behind, so each call's time is its host work
    print(f"  host time of the library calls: {sum(host.values()) / replays * 1e6:.0f} us/step")
    for name, t in sorted(host.items(), key=lambda kv: -kv[1]):
        n = count[name] // replays
        print(f"    {name:<42}{n:>3} x {t / count[name] * 1e6:6.1f} us = {t / replays * 1e6:6.1f} us")
    rec.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--replays", type=int, default=300)
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--unfused", action="store_true", help="SimpleCNN(fuse_relu=False): conv, bias, relu apart")
    p.add_argument("--compare", action="store_true", help="also profile with the legacy conv API only")
    args = p.parse_args()
    if mx.num_gpus() == 0:
        raise SystemExit(f"profile_host.py needs a GPU: {mx.runtime.gpu_status()[1]}")
    mx.set_math_mode("tf32" if args.tf32 else "fp32")
    dev = mx.gpu(0)
    for backend in ((True, False) if args.compare else (True,)):
        profile(dev, args.batch, args.replays, backend, not args.unfused)
    mx.set_conv_algo_policy("time", backend=True)


if __name__ == "__main__":
    main()
