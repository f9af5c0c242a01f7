"""The plain eager loop with eager replay off and on, per d2l-zh chapter 5 model: step time and what replayed.

    python scripts/eager_replay_check.py                      # resnet nin densenet lenet googlenet
    python scripts/eager_replay_check.py --models vgg --steps 50

For each model (d2l_compare.py's definitions and batch sizes, random batches resident on the GPU, TF32) it trains
``--steps`` SGD steps twice in one process, once with ``dnnbind.set_eager_replay(False)`` and once with it on, reading
the loss with ``.asscalar()`` every step as d2l's loops do, and prints the median and best step time of the steps
after the first 10, and each Block's replays, misses and reasons (dnnbind/eager_replay.py).

Layer: script; imports dnnbind and d2l_compare (beside it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import d2l_compare as d2l  # noqa: E402  (installs the mxnet alias; the models)

import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon, nd  # noqa: E402


def run(name: str, replay: bool, steps: int, ctx) -> dict:
    spec = d2l.SPECS[name]
    mx.set_eager_replay(replay)
    mx.set_math_mode("tf32")
    nd.random.seed(0)
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=ctx)
    b = spec.batch_size
    rng = np.random.default_rng(0)
    x = nd.array(rng.random((b, spec.channels, spec.size, spec.size)).astype("f"), ctx=ctx)
    y = nd.array(rng.integers(0, spec.classes, b).astype("f"), ctx=ctx)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": spec.lr, "momentum": 0.9})
    times, loss = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(b)
        loss.mean().asscalar()
        times.append(time.perf_counter() - t0)
    rest = sorted(times[10:])
    blocks = {k: blk.__dict__.get("_auto") for k, blk in (("net", net), ("loss", loss_fn))}
    return {"median_ms": 1e3 * rest[len(rest) // 2], "best_ms": 1e3 * rest[0],
            "blocks": {k: (a.replays, a.misses, list(a.eager_reasons.values())) for k, a in blocks.items()
                       if a is not None}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=list(d2l.SPECS),
                   default=["resnet", "nin", "densenet", "lenet", "googlenet"])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    if args.steps <= 11:
        raise SystemExit("--steps must be more than 11 (the first 10 are warm-up)")
    if mx.num_gpus() == 0:
        raise SystemExit(f"eager_replay_check.py needs a GPU: {mx.runtime.gpu_status()[1]}")
    ctx = mx.gpu(0)
    for name in args.models:
        for replay in (False, True):
            r = run(name, replay, args.steps, ctx)
            print(f"{name:<10} replay {'on ' if replay else 'off'}: median {r['median_ms']:.2f} ms, best "
                  f"{r['best_ms']:.2f} ms", flush=True)
            for k, (replays, misses, reasons) in r["blocks"].items():
                print(f"    {k}: {replays} replays, {misses} misses" + (f"; {reasons}" if reasons else ""))


if __name__ == "__main__":
    main()
