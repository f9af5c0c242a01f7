"""Where the host time of an eager training step goes: cProfile over N steps, or the host time of each op kind.

    python scripts/profile_step.py --steps 300                       # SimpleCNN, cProfile (tottime order)
    python scripts/profile_step.py --model resnet18 --per-op         # d2l's ResNet-18 at batch 256: per op kind
    python scripts/profile_step.py --device cpu --steps 3 --per-op   # the same on the cpu backend
    python scripts/profile_step.py --model resnet18 --per-op --math fp16-nhwc   # its mixed-precision NHWC twin

``--per-op`` times every operator call of the step with ``time.perf_counter`` around it (no profiler, so the numbers
are the real host cost, the timer's ~0.1 us aside): the forward calls by op name (the registry's dispatch of lib,
map, reduce and func ops; an op that calls others counts them again under their names) and the backward by the
taped node's name, then the step's three phases (forward under ``record()``, ``backward()``, ``trainer.step()``).
On a GPU an eager step is all host when the host is slower than the GPU, which these numbers show. This is
measurement code: it wraps the registry's dispatch functions (nd._registry) for the timed steps and puts them back.
"""

import argparse
import cProfile
import contextlib
import os
import pstats
import sys
import time
from collections import defaultdict

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from dnnbind.nd import _registry  # noqa: E402  (measurement: the dispatch functions are wrapped below)
from models.simple_cnn import SimpleCNN  # noqa: E402


def build(model: str, dev, batch: int, math: str = "tf32"):
    """(net, x, y) for ``model`` on ``dev``: SimpleCNN on 1x28x28, or d2l's ResNet-18 on 1x96x96. ``math``
    "fp16-nhwc": ResNet-18's channels-last twin with BatchNormAddRelu (bench_nhwc, as bench_models.py's
    dnnbind-amp-nhwc mode), cast to float16, its input float16."""
    if math == "fp16-nhwc" and model != "resnet18":
        raise SystemExit("profile_step: --math fp16-nhwc needs --model resnet18 (the model with an NHWC twin)")
    rng = np.random.default_rng(0)
    if model == "simplecnn":
        net, size = SimpleCNN(fuse_relu=True), 28
        net.initialize(mx.init.TorchDefault(), ctx=dev)
    else:
        import d2l_compare as d2l  # scripts/: the book's models (installs the mxnet alias, as the book's code runs)
        net, size = d2l.SPECS["resnet"].build_mx(), 96
        net.initialize(d2l.INIT(), ctx=dev)
    net(mx.zeros((2, 1, size, size), device=dev))
    x = mx.array(rng.random((batch, 1, size, size), dtype=np.float32), device=dev)
    y = mx.array(rng.integers(0, 10, batch).astype(np.float32), device=dev)
    if math == "fp16-nhwc":
        import d2l_compare as d2l
        import bench_nhwc
        net, x = bench_nhwc.build(d2l.SPECS["resnet"], net, dev), bench_nhwc.to_nhwc(x)
        net.cast("float16")
        x = x.astype("float16")
    return net, x, y


@contextlib.contextmanager
def per_op_timers(forward: dict, backward: dict):
    """Time every op call of the registry's dispatch (forward[name] = [calls, seconds]) and every taped backward
    node (backward[name] likewise) while inside; the originals are put back after."""
    saved = {name: getattr(_registry, name) for name in ("_lib_call", "_map", "_reduce", "_func")}
    record_op = autograd.record_op

    def timed_dispatch(fn):
        def call(op, *args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(op, *args, **kwargs)
            finally:
                entry = forward[op.name]
                entry[0] += 1
                entry[1] += time.perf_counter() - t
        return call

    def timed_record_op(name, output, inputs, node_backward):
        def timed(g):
            t = time.perf_counter()
            try:
                return node_backward(g)
            finally:
                entry = backward[name]
                entry[0] += 1
                entry[1] += time.perf_counter() - t
        return record_op(name, output, inputs, timed)

    for name, fn in saved.items():
        setattr(_registry, name, timed_dispatch(fn))
    autograd.record_op = timed_record_op
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(_registry, name, fn)
        autograd.record_op = record_op


def print_per_op(title: str, table: dict, steps: int) -> None:
    print(f"{title}: op, calls per step, host us per call, host ms per step")
    for name, (calls, seconds) in sorted(table.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:28s} {calls / steps:6.1f} {seconds / calls * 1e6:9.1f} {seconds / steps * 1e3:9.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("simplecnn", "resnet18"), default="simplecnn")
    p.add_argument("--batch", type=int, default=None, help="default: 64 (SimpleCNN), 256 (ResNet-18)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--per-op", action="store_true", help="host time per op kind instead of cProfile")
    p.add_argument("--math", choices=("fp32", "tf32", "fp16-nhwc"), default="tf32",
                   help="fp16-nhwc: mixed precision, channels-last (ResNet-18 only; float32 master weights)")
    p.add_argument("--device", choices=("gpu", "cpu"), default=None, help="default: the default device")
    p.add_argument("--top", type=int, default=35)
    args = p.parse_args(argv)
    dev = mx.default_device() if args.device is None else (mx.gpu(0) if args.device == "gpu" else mx.cpu())
    half = args.math == "fp16-nhwc"
    mx.set_math_mode("tf32" if half else args.math)  # fp16: what stays float32 (BatchNorm's statistics) in TF32
    batch = args.batch or (64 if args.model == "simplecnn" else 256)
    net, x, y = build(args.model, dev, batch, args.math)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9,
                                                          "multi_precision": half})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    phases = np.zeros(3)

    def step():
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        trainer.step(batch)
        phases[:] += (t1 - t0, t2 - t1, time.perf_counter() - t2)

    for _ in range(args.warmup):
        step()
    mx.synchronize(dev)
    phases[:] = 0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    mx.synchronize(dev)
    per_step = (time.perf_counter() - t0) / args.steps
    print(f"{args.model}, batch {batch}, {args.math}, {dev}: {per_step * 1e3:.2f} ms per step (wall); host: forward "
          f"{phases[0] / args.steps * 1e3:.2f} ms, backward {phases[1] / args.steps * 1e3:.2f} ms, trainer.step "
          f"{phases[2] / args.steps * 1e3:.2f} ms")
    if args.per_op:
        forward, backward = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
        with per_op_timers(forward, backward):
            for _ in range(args.steps):
                step()
            mx.synchronize(dev)
        print_per_op("forward (with autograd recording)", forward, args.steps)
        print_per_op("backward nodes", backward, args.steps)
        return forward, backward
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    mx.synchronize(dev)
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"{stats.total_calls / args.steps:.0f} Python calls per step")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
