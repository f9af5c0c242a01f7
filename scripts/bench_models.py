"""Benchmark one training step of d2l-zh v1.0.0's ResNet-18 or AlexNet, or of ResNet-50 v1.5, dnnbind against PyTorch
on one GPU, in one process, from the same initial weights, on the same synthetic batches. Prints a table, the
model's FLOP and memory-traffic floor (scripts/model_floor.py), and writes JSON.

    python scripts/bench.py --model resnet18 --json runs/bench_resnet18.json
    python scripts/bench.py --model alexnet --skip-compile
    python scripts/bench.py --model resnet50 --compile-budget 540   # room for torch.compile's max-autotune
    python scripts/bench_models.py --model resnet18 --modes torch-compile torch-compile-amp   # a subset of modes
    python scripts/bench_models.py --model alexnet --device cpu --batch 2 --warmup 1 --steps 2  # CPU smoke run
    python scripts/bench_models.py --model resnet50 --modes dnnbind-amp-nhwc-captured --data rec  # fed by real data

Layer: script; imports dnnbind, scripts/d2l_compare.py (the models), bench_timing.py (clocks, memory, measure()),
bench.py (versions), and torch if installed: --help and the dnnbind modes run without it.

Models: d2l_compare.py's, written once for Gluon and torch.nn: resnet.md's ResNet-18 (7x7 stem), 1x96x96, batch
256; alexnet.md's AlexNet with its two Dropout(0.5), 1x224x224, batch 128; 10 classes. Its build_pair initializes
the dnnbind model (Xavier) and copies every parameter and BatchNorm statistic into torch's, shape for shape; every
mode starts from these weights. SGD lr 0.05 momentum 0.9, mean softmax cross entropy, dropout active in both.
ResNet-50 v1.5 (d2l_compare.resnet50: MXNet model zoo's resnet50_v1 with the stride on the 3x3 conv, torchvision's
25,557,032 parameters, printed and checked), 3x224x224, 1000 classes, batch 256, SGD lr 0.1 momentum 0.9; its
default modes are those the ImageNet comparison needs (DEFAULT_MODES), without the strict-FP32 and NCHW-fp16 ones.

Timed: the training step alone, on a pool of 8 fixed random batches (pixels in [0, 1), labels in [0, classes))
resident on the device, cycled. Per mode:
warm-up steps (algorithm search, recording, compilation), then N steps with a CUDA event recorded after each and
one synchronize at the end; ms/step is the median event interval (host-bound waits included). Peak memory over
the timed steps, each framework's own allocator (weights, optimizer state, data pool included):
torch.cuda.max_memory_allocated; for dnnbind the high watermarks of CUDA's default pool plus CUDA-graph memory.
With 3 input channels (ResNet-50) the channels-last modes of both frameworks hold a converted copy of the pool (torch's
.contiguous(memory_format=channels_last), dnnbind's NHWC transpose; 1.2 GiB at batch 256), counted in their peak.
--data rec: each dnnbind mode also runs fed by mx.io.ImageRecordIter over a .rec of generated JPEGs (bench_image_iter's
make_rec, ImageNet-sized; written once under --rec-dir: batch * (warm-up + timed steps) images, at most REC_IMAGES,
cycled by resetting the iterator): random crop to the model's input, mirror, ImageNet mean/std, --rec-threads
decoding threads; each step takes the next batch, copies it to the device (as_in_context) and, for the NHWC modes,
transposes it there as the synthetic pool is (bench_nhwc.to_nhwc); fp16 modes cast it in the step, as the pool's.
Labels are the records' modulo the model's classes. Printed per mode: images/s fed by the iterator and synthetic
(both from the wall clock over the timed steps, as the iterator's stalls are not in a median), their ratio, and what
bounds it: the iterator alone over the same .rec (no training), the host-to-device copy alone, the synthetic step.
NOTE: a recorded or captured dnnbind step replays its recording's calls: its dropout masks change between steps
only if dropout's RNG state lives on the device (cuDNN's), not if the recording froze a host-drawn seed.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]  # the checkout (dnnbind, models) and scripts/ (d2l_compare, bench)
from bench_timing import BudgetExceeded, clock_for, guarded, measure, memory_for, save_json  # noqa: E402

import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from dnnbind.graph import training_step  # noqa: E402

LR, MOMENTUM = 0.05, 0.9  # the setting for both models (the book trains AlexNet at 0.01, no momentum)
MODEL_LR = {"resnet50": 0.1}  # per-model default lr where it is not LR (ResNet-50: torchvision's recipe, 0.1 at 256)
POOL = 8                  # fixed random batches resident on the device, cycled
WARMUP, STEPS = 10, 50    # per mode: untimed steps, then timed steps
COMPILE_BUDGET = 180      # seconds a torch.compile mode may spend in its warm-up (compiling) before it is dropped
SEED = 0
REC_DIR = "/tmp/bench_imgrec"  # --data rec: where the generated .rec is written once and reused
REC_IMAGES = 4096         # --data rec: at most this many JPEGs in it (~94 KB each; more steps cycle through them)
REC_PREFETCH = 4          # --data rec: the iterator's prefetch_buffer (batches decoded ahead of the step)
IMAGENET_NORM = dict(mean_r=123.68, mean_g=116.28, mean_b=103.53, std_r=58.395, std_g=57.12, std_b=57.375)
MODELS = {"resnet18": ("resnet", "ResNet-18 (d2l-zh v1.0.0 resnet.md)"),  # --model -> (d2l_compare.SPECS key, title)
          "alexnet": ("alexnet", "AlexNet (d2l-zh v1.0.0 alexnet.md)"),
          "resnet50": ("resnet50", "ResNet-50 v1.5 (MXNet zoo resnet50_v1, stride on the 3x3)")}


@dataclass(frozen=True)
class Mode:
    label: str
    framework: str  # "dnnbind" or "torch"
    math: str       # "fp32" strict, "tf32", "bf16" (torch: AMP bf16 with channels_last) or "fp16" (dnnbind:
    #                 net.cast('float16') with float32 master weights, MXNet's mixed precision; NCHW)
    kind: str       # "eager", "hybrid" (the eager loop after net.hybridize()), "host" (dnnbind's recorded step),
    #                 "graph" (whole step in a CUDA graph), "compile"
    layout: str = "NCHW"  # dnnbind "NHWC": the model's channels-last twin with fused BatchNorm-add-ReLU (bench_nhwc)
    compile_mode: str | None = None  # torch.compile(mode=...): None is its default, "max-autotune" searches kernels


MODES = {
    "dnnbind-fp32": Mode("dnnbind eager, fp32 strict", "dnnbind", "fp32", "eager"),
    "dnnbind-tf32": Mode("dnnbind eager, tf32", "dnnbind", "tf32", "eager"),
    "dnnbind-recorded": Mode("dnnbind recorded step, tf32", "dnnbind", "tf32", "host"),
    "dnnbind-captured": Mode("dnnbind captured step, tf32", "dnnbind", "tf32", "graph"),
    "dnnbind-hybrid": Mode("dnnbind hybridize(), tf32", "dnnbind", "tf32", "hybrid"),
    "dnnbind-amp-hybrid": Mode("dnnbind AMP fp16, hybridize()", "dnnbind", "fp16", "hybrid"),
    "dnnbind-amp": Mode("dnnbind AMP fp16 (net.cast), eager", "dnnbind", "fp16", "eager"),
    "dnnbind-amp-captured": Mode("dnnbind AMP fp16, captured step", "dnnbind", "fp16", "graph"),
    "dnnbind-nhwc-hybrid": Mode("dnnbind NHWC+BNAddRelu, hybridize(), tf32", "dnnbind", "tf32", "hybrid", "NHWC"),
    "dnnbind-amp-nhwc-hybrid": Mode("dnnbind AMP fp16 NHWC+BNAddRelu, hybridize()", "dnnbind", "fp16", "hybrid",
                                    "NHWC"),
    "dnnbind-amp-nhwc": Mode("dnnbind AMP fp16 NHWC+BNAddRelu, eager", "dnnbind", "fp16", "eager", "NHWC"),
    "dnnbind-amp-nhwc-captured": Mode("dnnbind AMP fp16 NHWC+BNAddRelu captured", "dnnbind", "fp16", "graph",
                                      "NHWC"),
    "torch-fp32": Mode("PyTorch eager, fp32 strict", "torch", "fp32", "eager"),
    "torch-tf32": Mode("PyTorch eager, tf32", "torch", "tf32", "eager"),
    "torch-amp": Mode("PyTorch eager, AMP bf16 + ch_last", "torch", "bf16", "eager"),
    "torch-graph": Mode("PyTorch CUDA graph, tf32", "torch", "tf32", "graph"),
    "torch-amp-graph": Mode("PyTorch CUDA graph, AMP bf16 + ch_last", "torch", "bf16", "graph"),
    "torch-compile": Mode("PyTorch torch.compile, tf32", "torch", "tf32", "compile"),
    "torch-compile-amp": Mode("PyTorch compile, AMP bf16 + ch_last", "torch", "bf16", "compile"),
    # after the default compile, so a max-autotune that overruns --compile-budget still leaves a compiled result
    "torch-compile-amp-max": Mode("PyTorch max-autotune, AMP bf16 + ch_last", "torch", "bf16", "compile",
                                  compile_mode="max-autotune"),
}
# --model's modes when --modes is not given (default: all of MODES). ResNet-50 at batch 256: the TF32 and mixed
# precision modes the ImageNet comparison asks for; strict FP32 and dnnbind's NCHW fp16 are left to --modes.
DEFAULT_MODES = {
    "resnet50": ["dnnbind-tf32", "dnnbind-hybrid", "dnnbind-recorded", "dnnbind-captured", "dnnbind-amp-nhwc",
                 "dnnbind-amp-nhwc-hybrid", "dnnbind-amp-nhwc-captured", "torch-tf32", "torch-amp", "torch-graph",
                 "torch-amp-graph", "torch-compile-amp", "torch-compile-amp-max"],
}
# the same-math reference; dnnbind's fp16 mixed precision is compared with torch's AMP (bf16, channels_last)
TORCH_EAGER = {"fp32": "torch-fp32", "tf32": "torch-tf32", "bf16": "torch-amp", "fp16": "torch-amp"}


# ---- one training step, per framework and mode ---------------------------------------------------------------------

def make_mx(d2l, spec, ctx, seed):
    """The dnnbind model as build_pair makes it (same seed, same draws: the weights torch got)."""
    d2l.mx.random.seed(seed)
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=ctx)
    net(mx.zeros((2, spec.channels, spec.size, spec.size), device=ctx))  # predict mode: finishes deferred init
    return net


def dnnbind_step(mode, d2l, spec, ctx, data, args, feed=None):
    """step(i) -> loss for batch i of the pool (or, with ``feed``, for the batch feed(nhwc) returns), and close()."""
    half = mode.math == "fp16"
    mx.set_math_mode("tf32" if half else mode.math)  # fp16: what stays float32 (BatchNorm's statistics) in TF32
    xs, ys = data["mx"]
    net = make_mx(d2l, spec, ctx, args.seed)
    if mode.layout == "NHWC":
        import bench_nhwc
        net, xs = bench_nhwc.build(spec, net, ctx), [bench_nhwc.to_nhwc(x) for x in xs]
        gc.collect()  # the NCHW model it was built from (85 MiB of parameters and gradients) sits in a cycle
    cast = (lambda x: x) if not half else (lambda x: x.astype("float16"))
    if feed is None:
        def batch(i):
            return xs[i % len(xs)], ys[i % len(xs)]
    else:  # real data: the pool only gives the shapes (training_step's); each step takes the iterator's next batch
        def batch(i):
            return feed(mode.layout == "NHWC")
    if half:  # MXNet's mixed precision: the network in float16, float32 master weights in the Trainer
        net.cast("float16")
        # NOTE: each batch is cast in the step, as torch's autocast casts its float32 input: both hold the same
        # float32 pool, and the float16 copy is a transient of the step (counted in its peak), not a second pool.
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": MOMENTUM,
                                                          "multi_precision": half})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if mode.kind == "hybrid":
        net.hybridize()  # the user's loop below, unchanged: forward and backward replay their recorded calls
    if mode.kind in ("eager", "hybrid"):
        def step(i):
            x, y = batch(i)
            with autograd.record():
                loss = loss_fn(net(cast(x)), y)
            loss.backward()
            trainer.step(xs[0].shape[0])  # rescales by 1/batch: the mean loss's gradient, as torch's
            return loss
        return step, lambda: None
    recorded = training_step(net, loss_fn, trainer, xs[0].shape, replay=mode.kind, device=ctx,
                             data_dtype=np.float16 if half else xs[0].dtype)

    def replay(i):
        x, y = batch(i)
        return recorded(cast(x), y)
    return replay, getattr(recorded.replay, "close", lambda: None)


def set_torch_math(torch, math: str) -> None:
    tf32 = math != "fp32"  # AMP's fp32 leftovers run in TF32 too
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def torch_step(mode, torch, tnet0, data, args, dev):
    set_torch_math(torch, mode.math)
    F = torch.nn.functional
    amp = mode.math == "bf16"
    fmt = torch.channels_last if amp else torch.contiguous_format
    tnet = copy.deepcopy(tnet0).to(dev, memory_format=fmt).train()
    xs, ys = data["torch"]
    xs = [x.contiguous(memory_format=fmt) for x in xs]
    opt = torch.optim.SGD(tnet.parameters(), lr=args.lr, momentum=MOMENTUM)
    model = torch.compile(tnet, mode=mode.compile_mode) if mode.kind == "compile" else tnet
    # NOTE: autocast's cast-weight cache must be off while a CUDA graph is captured (torch's CUDA-graphs notes)
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=mode.kind != "graph")) if amp
                else contextlib.nullcontext)

    def train(x, y):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    if mode.kind != "graph":
        return (lambda i: train(xs[i % len(xs)], ys[i % len(xs)])), lambda: None
    # As bench.py: warm up on a side stream (cudnn.benchmark's search, and the momentum buffers must exist before
    # capture, else the graph holds SGD's first-step branch), then capture forward, backward and update.
    sx, sy = xs[0].clone(), ys[0].clone()
    state = {k: v.clone() for k, v in tnet.state_dict().items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with autocast():
            static_loss = F.cross_entropy(tnet(sx), sy)
        static_loss.backward()
        opt.step()
    with torch.no_grad():  # undo the warm-up: initial weights, zero momentum (in place: the graph keeps addresses)
        tnet.load_state_dict(state)
        for p in tnet.parameters():
            opt.state[p]["momentum_buffer"].zero_()

    def replay(i):
        sx.copy_(xs[i % len(xs)])
        sy.copy_(ys[i % len(xs)])
        graph.replay()
        return static_loss
    return replay, lambda: None


def profile_kernels(step, torch, clock, top: int, steps: int = 10) -> dict:
    """GPU time per step by kernel name over ``steps`` steps, from torch.profiler (Kineto/CUPTI sees every kernel
    in the process, cuDNN's and cuBLAS's for dnnbind too): the ``top`` largest, the rest summed, and the total."""
    from torch.profiler import ProfilerActivity, profile
    clock.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        clock.sync()
    totals: dict = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time > 0:
            totals[ev.name] = totals.get(ev.name, 0.0) + ev.device_time / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return {"total_us": sum(totals.values()), "top": [[name, us] for name, us in ranked[:top]],
            "other_us": sum(us for _, us in ranked[top:])}


def print_kernels(runs: dict) -> None:
    for key, r in runs.items():
        prof = r.get("kernels")
        if not prof:
            continue
        print(f"\n{MODES[key].label}: {prof['total_us'] / 1e3:.2f} ms of kernels per step")
        for name, us in prof["top"]:
            print(f"  {us:9.1f} us {100 * us / prof['total_us']:5.1f}%  {name[:110]}")
        print(f"  {prof['other_us']:9.1f} us {100 * prof['other_us'] / prof['total_us']:5.1f}%  (the rest)")


def run_mode(key, ctx, torch, d2l, spec, tnet0, data, args, feed=None) -> dict:
    mode = MODES[key]
    if mode.framework == "torch" and torch is None:
        return {"status": "skipped", "reason": "torch is not installed"}
    if not ctx.is_gpu and (mode.math != "fp32" or mode.kind != "eager"):
        return {"status": "skipped", "reason": "needs a GPU"}
    if mode.layout == "NHWC":
        import bench_nhwc
        if spec.arch.__name__ not in bench_nhwc.MODELS:
            return {"status": "skipped", "reason": "no NHWC twin of this model (scripts/bench_nhwc.py)"}
    clock, memory = clock_for(mode.framework, ctx, torch), memory_for(mode.framework, ctx, torch)
    close, compiling = None, mode.kind == "compile"
    try:
        clock.sync()
        guarded(memory.reset, [])
        t0 = time.perf_counter()
        if mode.framework == "dnnbind":
            step, close = dnnbind_step(mode, d2l, spec, ctx, data, args, feed)
        else:
            step, close = torch_step(mode, torch, tnet0, data, args, "cuda" if ctx.is_gpu else "cpu")
        clock.sync()
        setup = time.perf_counter() - t0
        budget = args.compile_budget if compiling else None
        result = {"status": "ok", "setup_s": setup, **measure(step, clock, memory, args, budget, mode.label)}
        if args.profile and torch is not None and ctx.is_gpu:
            result["kernels"] = profile_kernels(step, torch, clock, args.profile)
        return result
    except (Exception, BudgetExceeded) as exc:  # noqa: BLE001  (a mode's failure is a result)
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}".strip(),
                "traceback": traceback.format_exc(limit=-6)}
    finally:  # free this mode's model, step and graph before the next mode
        with contextlib.suppress(Exception):
            close and close()
        step = close = None
        gc.collect()
        with contextlib.suppress(Exception):
            clock.sync()
        if torch is not None and mode.framework == "torch":
            if mode.kind == "compile":
                torch._dynamo.reset()
            if ctx.is_gpu:
                torch.cuda.empty_cache()


# ---- real data (--data rec) ------------------------------------------------------------------------------------------

def make_rec_file(args) -> tuple:
    """(path, images) of --rec-dir's .rec of generated JPEGs, written on the first run."""
    import bench_image_iter  # scripts/: make_rec, the JPEGs of bench_image_iter.py (same file names, reusable)
    n = max(args.batch, min(args.batch * (args.warmup + args.steps), args.rec_images))
    os.makedirs(args.rec_dir, exist_ok=True)
    path = os.path.join(args.rec_dir, f"synthetic_{n}.rec")
    if not os.path.exists(path) or not os.path.exists(path[:-4] + ".idx"):
        t = time.perf_counter()
        bench_image_iter.make_rec(path, n)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB, {n} JPEGs) in {time.perf_counter() - t:.1f} s",
              flush=True)
    return path, n


def make_rec_iter(path: str, spec, args, dtype: str):
    """An ImageRecordIter over ``path`` with training's augmentation at the model's input size, batches of
    ``dtype``."""
    from dnnbind import io as mxio
    norm = IMAGENET_NORM if spec.channels == 3 else dict(mean_r=117.0, std_r=58.0)
    return mxio.ImageRecordIter(path_imgrec=path, path_imgidx=path[:-4] + ".idx",
                                data_shape=(spec.channels, spec.size, spec.size), batch_size=args.batch,
                                rand_crop=True, rand_mirror=True, preprocess_threads=args.rec_threads,
                                prefetch_buffer=REC_PREFETCH, dtype=dtype, **norm)


def next_batch(it):
    """The iterator's next batch; at the end of the .rec, the first of its next pass (NOTE: its prefetch restarts
    there, so one step in images / batch waits for a whole batch's decoding, as at an epoch's end in training)."""
    try:
        return it.next()
    except StopIteration:
        it.reset()
        return it.next()


class RecFeed:
    """feed(nhwc) -> (x, y) on the device: the iterator's next batch, copied (as_in_context), NHWC-transposed there
    for the channels-last modes (bench_nhwc.to_nhwc, as the synthetic pool), labels modulo the classes as int32."""

    def __init__(self, it, ctx, classes: int):
        self.it, self.ctx, self.classes = it, ctx, classes

    def __call__(self, nhwc: bool = False):
        b = next_batch(self.it)
        x = b.data[0].as_in_context(self.ctx)
        y = mx.array(b.label[0].numpy().astype(np.int32) % self.classes, device=self.ctx)
        if nhwc:
            import bench_nhwc
            x = bench_nhwc.to_nhwc(x)
        return x, y


def iterator_rate(it, batches: int) -> float:
    """Images/s of the iterator alone (no training, nothing copied), over ``batches`` batches after two."""
    for _ in range(2):
        next_batch(it)
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        b = next_batch(it)
        n += b.data[0].shape[0] - b.pad
    return n / (time.perf_counter() - t)


def copy_rate(it, ctx, clock, copies: int) -> float:
    """Images/s of the host-to-device copy alone: one of the iterator's batches copied ``copies`` times."""
    b = next_batch(it)
    x = b.data[0]
    x.as_in_context(ctx)
    clock.sync()
    t = time.perf_counter()
    for _ in range(copies):
        x.as_in_context(ctx)
    clock.sync()
    return copies * x.shape[0] / (time.perf_counter() - t)


def rec_limit(real: float, it: float, copy: float, step: float) -> tuple:
    """(the stage that bounds a step fed by the iterator, the rate the copy and the step allow in series). The copy
    is in series with the step (NDArray.copy_ from pageable host memory synchronizes the device's stream), the
    iterator runs beside both in its threads: 'iterator' when it alone is slower than copy + step, 'host-to-device
    copy' when copy + step stays under 90% of the step alone, else 'step' when real data reaches 90% of it, else
    'host contention' (decoding threads and the step's own host work share the cores and the GIL)."""
    serial = 1 / (1 / copy + 1 / step)
    if it < serial:
        return "iterator", serial
    if serial < 0.9 * step:
        return "host-to-device copy", serial
    return ("step" if real >= 0.9 * step else "host contention"), serial


def add_rec_ratios(out: dict) -> None:
    """Per mode fed by the iterator: its images/s (wall clock, mean over the timed steps) against the synthetic
    run's, and the stage that bounds it (rec_limit)."""
    for k, r in out["runs_rec"].items():
        syn = out["runs"].get(k, {})
        if r.get("status") != "ok" or syn.get("status") != "ok":
            continue
        r["images_per_s_wall"] = out["batch"] * 1e3 / r["ms_wall_mean"]
        r["synthetic_images_per_s_wall"] = out["batch"] * 1e3 / syn["ms_wall_mean"]
        r["vs_synthetic"] = r["images_per_s_wall"] / r["synthetic_images_per_s_wall"]
        r["limit"], r["copy_and_step_images_per_s"] = rec_limit(r["images_per_s_wall"], r["iterator_images_per_s"],
                                                                r["copy_images_per_s"],
                                                                r["synthetic_images_per_s_wall"])


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def print_rec_table(out: dict) -> None:
    rec = out["rec"]
    print(f"\nfed by mx.io.ImageRecordIter ({rec['path']}, {rec['images']} JPEGs, {rec['threads']} decoding "
          f"threads, decoder {rec['decoder']}): " + "; ".join(
              f"{dt} batches: iterator alone {_rate(v['iterator_images_per_s'])} images/s, host-to-device copy alone "
              f"{_rate(v['copy_images_per_s'])} images/s" for dt, v in rec["dtypes"].items()))
    print(f"{'mode':<48}{'batches':>8}{'real img/s':>12}{'synthetic':>11}{'ratio':>7}{'copy+step':>11}"
          f"{'median real':>13}  limit")
    for k, r in out["runs_rec"].items():
        if "vs_synthetic" not in r:
            print(f"{MODES[k].label:<48}  {r.get('status')}: {r.get('reason', 'no synthetic run to compare')[:120]}")
            continue
        print(f"{MODES[k].label:<48}{r['iterator_dtype']:>8}{_rate(r['images_per_s_wall']):>12}"
              f"{_rate(r['synthetic_images_per_s_wall']):>11}{r['vs_synthetic']:>7.2f}"
              f"{_rate(r['copy_and_step_images_per_s']):>11}{_rate(r['images_per_s']):>13}  {r['limit']}")
    print("images/s from the wall clock over the timed steps (synthetic: the same mode's run above; median real: from "
          "the median step); copy+step: the rate of the copy alone and the synthetic step in series; limit: "
          "bench_models.rec_limit")


# ---- driver ---------------------------------------------------------------------------------------------------------

def make_data(spec, batch, ctx, torch, args) -> dict:
    """A pool of fixed random batches (pixels in [0, 1), labels in [0, classes)), one copy per framework on the
    device."""
    rng = np.random.default_rng(args.seed)
    x = rng.random((args.pool, batch, spec.channels, spec.size, spec.size), dtype=np.float32)
    y = rng.integers(0, spec.classes, (args.pool, batch))
    data = {"np": (x[0], y[0]),
            "mx": ([mx.array(b, device=ctx) for b in x], [mx.array(b.astype(np.int32), device=ctx) for b in y])}
    if torch is not None:
        dev = "cuda" if ctx.is_gpu else "cpu"
        data["torch"] = ([torch.from_numpy(b).to(dev) for b in x], [torch.from_numpy(b).to(dev) for b in y])
    return data


def weights_check(d2l, net, tnet0, torch, data, ctx) -> dict:
    """Strict FP32, predict mode: both models' logits on the first batch (the copied weights agree)."""
    mx.set_math_mode("fp32")
    set_torch_math(torch, "fp32")
    x, y = data["np"]
    lm = net(mx.array(x, device=ctx)).numpy()
    tnet = copy.deepcopy(tnet0).eval().to("cuda" if ctx.is_gpu else "cpu")
    with torch.no_grad():
        lt = tnet(data["torch"][0][0]).cpu().numpy()
    return {"loss_dnnbind": d2l.mean_xent(lm, y), "loss_torch": d2l.mean_xent(lt, y),
            "logits_max_rel_diff": float(np.abs(lm - lt).max() / max(np.abs(lt).max(), 1e-30))}


def add_ratios(results: dict) -> None:
    ok = {k: r for k, r in results.items() if r.get("status") == "ok"}
    best = min((r["ms"] for k, r in ok.items() if MODES[k].framework == "torch"), default=None)
    for k, r in ok.items():
        ref, graph = ok.get(TORCH_EAGER[MODES[k].math]), ok.get("torch-graph")
        r["vs_torch_eager_same_math"] = r["ms"] / ref["ms"] if ref else None
        r["vs_torch_graph"] = r["ms"] / graph["ms"] if graph else None
        r["vs_torch_best"] = r["ms"] / best if best else None


def parameters_line(d2l, model: str, out: dict) -> str:
    """The model's parameter count (both frameworks' where torch built its twin), against torchvision's for
    ResNet-50."""
    line = f"{out['parameters']:,} trainable parameters (dnnbind)"
    if "parameters_torch" in out:
        line += f", {out['parameters_torch']:,} (torch)"
    if model == "resnet50":
        want = d2l.TORCHVISION_RESNET50_PARAMS
        same = out["parameters"] == want and out.get("parameters_torch", want) == want
        line += f"; torchvision resnet50: {want:,} [{'same' if same else 'MISMATCH'}]"
    return line


def floor_for(spec, batch: int) -> dict:
    """scripts/model_floor.py's floor of one training step at this batch: {"tf32": {...}, "fp16": {...}}."""
    import model_floor
    rows = model_floor.layer_shapes(spec)
    return {math: model_floor.floor(rows, batch, math) for math in ("tf32", "fp16")}


FLOOR_MATH = {"fp32": "tf32", "tf32": "tf32", "bf16": "fp16", "fp16": "fp16"}  # a mode's math -> its floor's


def add_floor_ratios(results: dict, floors: dict) -> None:
    """ms/step over the floor of the mode's math (strict FP32 against the TF32 floor: it has no tensor-core peak)."""
    for k, r in results.items():
        if r.get("status") == "ok":
            f = floors[FLOOR_MATH[MODES[k].math]]
            r["vs_floor"] = r["ms"] / max(f["compute_ms"], f["memory_ms"])


def print_floor(floors: dict, batch: int) -> None:
    import model_floor
    print(f"floor (scripts/model_floor.py; {model_floor.PEAK_NAME}): FLOPs at the dense tensor-core peak, bytes at "
          f"the memory bandwidth; the larger bounds a step")
    for math, f in floors.items():
        ms = max(f["compute_ms"], f["memory_ms"])
        print(f"  {math}: {f['gflop']:,.0f} GFLOP -> {f['compute_ms']:.2f} ms; {f['traffic_mib']:,.0f} MiB moved -> "
              f"{f['memory_ms']:.2f} ms; floor {ms:.2f} ms/step = {batch * 1e3 / ms:,.0f} images/s")


def print_table(results: dict, title: str) -> None:
    x = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731
    print(f"\n{title}")
    print(f"{'mode':<40}{'ms/step':>9}{'p10-p90':>18}{'images/s':>10}{'peak MiB':>10}"
          f"{'vs torch eager':>16}{'vs graph':>10}{'vs best':>9}{'vs floor':>10}")
    for k, r in results.items():
        if r.get("status") != "ok":
            print(f"{MODES[k].label:<40}  {r['status']}: {r.get('reason', '')[:150]}")
            continue
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"
        spread = f"{r['ms_p10']:.2f}-{r['ms_p90']:.2f}"
        print(f"{MODES[k].label:<40}{r['ms']:>9.2f}{spread:>18}{r['images_per_s']:>10,.0f}"
              f"{peak:>10}{x(r['vs_torch_eager_same_math']):>16}{x(r['vs_torch_graph']):>10}{x(r['vs_torch_best']):>9}"
              f"{x(r.get('vs_floor')):>10}")
    print("ms/step ratios against PyTorch eager in the same math, PyTorch's CUDA graph (tf32), PyTorch's best mode "
          "and the floor of the mode's math (below)")


def default_modes(model: str, device: str) -> list[str]:
    """The modes a run without --modes times: DEFAULT_MODES[model] or all of MODES; on the cpu those of them that run
    there (fp32 eager, run_mode's rule), so that a CPU smoke run of ResNet-50 still runs its dnnbind step."""
    if device == "cpu":
        return [k for k, m in MODES.items() if m.math == "fp32" and m.kind == "eager"]
    return list(DEFAULT_MODES.get(model, MODES))


def run_rec(out, modes, ctx, torch, d2l, spec, data, args) -> None:
    """--data rec: per batch dtype the modes use, the iterator and the copy alone; then each dnnbind mode fed by the
    iterator (out["runs_rec"])."""
    from dnnbind import imagecodec
    path, n = make_rec_file(args)
    clock = clock_for("dnnbind", ctx, torch)
    out["data"] = "rec"
    out["rec"] = {"path": path, "images": n, "threads": args.rec_threads, "decoder": imagecodec.backend(),
                  "rec_dtype": args.rec_dtype, "dtypes": {}}
    out["runs_rec"] = {}
    iters = {}
    try:
        for k in modes:
            if MODES[k].framework != "dnnbind":
                continue
            # NOTE: --rec-dtype model: fp16 modes take float16 batches (MXNet's train_imagenet --dtype float16 sets
            # the iterator's dtype): half the bytes to copy; the step's cast then only copies on the device
            dtype = "float16" if args.rec_dtype == "model" and MODES[k].math == "fp16" else "float32"
            if dtype not in iters:
                it = iters[dtype] = make_rec_iter(path, spec, args, dtype)
                rates = out["rec"]["dtypes"][dtype] = {
                    "iterator_images_per_s": iterator_rate(it, max(args.steps, 4)),
                    "copy_images_per_s": copy_rate(it, ctx, clock, max(args.steps, 4))}
                print(f"{dtype} batches: iterator alone {_rate(rates['iterator_images_per_s'])} images/s; "
                      f"host-to-device copy alone {_rate(rates['copy_images_per_s'])} images/s", flush=True)
            print(f"{MODES[k].label}, fed by the iterator ({dtype}) ...", end=" ", flush=True)
            r = run_mode(k, ctx, torch, d2l, spec, None, data, args, RecFeed(iters[dtype], ctx, spec.classes))
            out["runs_rec"][k] = r = {**r, "iterator_dtype": dtype, **out["rec"]["dtypes"][dtype]}
            print(f"{r['ms_wall_mean']:.2f} ms/step (wall), loss first {r['first_loss']:.6g} last "
                  f"{r['final_loss']:.4g}" if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')}",
                  flush=True)
            if r["status"] == "failed":
                print(r["traceback"], flush=True)
            save_json(args.json, out)
    finally:
        for it in iters.values():
            it.close()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: a smoke run of the fp32 eager modes on the host (timings meaningless; without "
                        "--modes, only the modes that run there)")
    p.add_argument("--batch", type=int, default=None,
                   help="default: the book's (ResNet-18 256, AlexNet 128); ResNet-50 256")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed steps per mode (at least 1); default {WARMUP}, on the cpu 1")
    p.add_argument("--pool", type=int, default=POOL, help="distinct random batches on the device, cycled")
    p.add_argument("--lr", type=float, default=None, help=f"default: {LR}; ResNet-50 {MODEL_LR['resnet50']}")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=None, metavar="MODE",
                   help=f"modes to run, in this order (default: all; for resnet50 "
                        f"{' '.join(DEFAULT_MODES['resnet50'])}): {' '.join(MODES)}")
    p.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile modes")
    p.add_argument("--bn-mode", choices=("persistent", "spatial"), default="persistent",
                   help="dnnbind's training BatchNorm algorithm (dnnbind.set_batchnorm_mode)")
    p.add_argument("--compile-budget", type=float, default=COMPILE_BUDGET,
                   help="seconds a torch.compile mode may spend warming up (compiling); 0: no limit. A mode over "
                        "it is reported as failed (torch-compile-amp-max, max-autotune, needs the most)")
    p.add_argument("--json", default=None, help="default: runs/bench_<model>.json")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="after timing, profile 10 steps per mode (torch.profiler) and print its K largest kernels")
    p.add_argument("--data", choices=("synthetic", "rec"), default="synthetic",
                   help="rec: also run each dnnbind mode fed by mx.io.ImageRecordIter over generated JPEGs, and "
                        "time the iterator and the host-to-device copy alone")
    p.add_argument("--rec-dir", default=REC_DIR, help="--data rec: where the .rec is written once and reused")
    p.add_argument("--rec-images", type=int, default=REC_IMAGES,
                   help="--data rec: at most this many JPEGs (batch * (warm-up + steps) when fewer)")
    p.add_argument("--rec-dtype", choices=("float32", "model"), default="float32",
                   help="--data rec: the iterator's dtype; model: float16 for the fp16 modes (MXNet's train_imagenet "
                        "--dtype float16 does so), float32 for the others")
    p.add_argument("--rec-threads", type=int, default=os.cpu_count(),
                   help="--data rec: the iterator's preprocess_threads (default: the host's cores)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.warmup = WARMUP if args.warmup is None and args.device == "gpu" else max(args.warmup or 1, 1)
    args.steps = max(args.steps, 1)
    args.json = args.json or f"runs/bench_{args.model}.json"
    args.lr = args.lr if args.lr is not None else MODEL_LR.get(args.model, LR)
    args.modes = args.modes or default_modes(args.model, args.device)
    modes = [k for k in args.modes if not (args.skip_compile and MODES[k].kind == "compile")]
    if args.device == "gpu" and mx.num_gpus() == 0:
        raise SystemExit(f"bench_models.py needs a GPU (or --device cpu): {mx.runtime.gpu_status()[1]}")
    import bench  # scripts/bench.py: versions and GPU, as in its own JSON
    import d2l_compare as d2l  # the models; it installs the mxnet alias at import
    try:
        import torch
    except ImportError:
        torch = None
    key, title = MODELS[args.model]
    spec = {**d2l.SPECS, **d2l.ZOO_SPECS}[key]
    args.batch = args.batch or spec.batch_size
    ctx = mx.gpu(0) if args.device == "gpu" else mx.cpu()
    env = bench.environment(torch)
    mx.set_batchnorm_mode(args.bn_mode)
    out = {"model": args.model, "book": title, "bn_mode": args.bn_mode,
           "input": [spec.channels, spec.size, spec.size], "classes": spec.classes,
           "batch": args.batch, "lr": args.lr, "momentum": MOMENTUM, "pool_batches": args.pool,
           "warmup_steps": args.warmup, "timed_steps": args.steps, "device": args.device, **env, "runs": {}}
    if torch is not None:
        torch.manual_seed(args.seed)  # torch's dropout masks
        torch.backends.cudnn.benchmark = True
        out["torch_gpu"] = torch.cuda.get_device_name(0) if ctx.is_gpu else None
    data = make_data(spec, args.batch, ctx, torch, args)
    tnet0 = None
    if torch is not None and any(MODES[k].framework == "torch" for k in modes):
        net, tnet0, pairs = d2l.build_pair(spec, ctx, args.seed)  # raises unless every shape pairs 1:1
        out["paired_tensors"] = len(pairs)
        out["weights_check"] = weights_check(d2l, net, tnet0, torch, data, ctx)
        out["parameters_torch"] = int(sum(p.numel() for p in tnet0.parameters()))
        del pairs  # they hold the reference model's Parameters
        print(f"{out['paired_tensors']} tensors copied into the torch model; predict-mode check on batch 0: "
              + ", ".join(f"{k} {v:.6g}" for k, v in out["weights_check"].items()), flush=True)
    else:
        net = make_mx(d2l, spec, ctx, args.seed)
    out["parameters"] = d2l.num_trainable(net)
    del net  # the reference model's Parameters: device memory every mode would count
    gc.collect()
    print(parameters_line(d2l, args.model, out), flush=True)
    out["floor"] = floor_for(spec, args.batch)  # a host forward of the model: its layers' shapes
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    for k in modes:
        print(f"{MODES[k].label} ...", end=" ", flush=True)
        r = out["runs"][k] = run_mode(k, ctx, torch, d2l, spec, tnet0, data, args)
        print(f"{r['ms']:.2f} ms/step, setup {r['setup_s']:.1f} s, warm-up {r['warmup_s']:.1f} s, loss first "
              f"{r['first_loss']:.6g} last {r['final_loss']:.4g}" if r["status"] == "ok"
              else f"{r['status']}: {r.get('reason', '')}", flush=True)
        if r["status"] == "failed":
            print(r["traceback"], flush=True)
        save_json(args.json, out)  # after every mode: a run cut short still leaves its numbers
    if args.data == "rec":
        run_rec(out, modes, ctx, torch, d2l, spec, data, args)
    mx.set_math_mode("fp32")
    add_ratios(out["runs"])
    gpu = (env["gpu"].get("devices") or [{}])[0].get("name", "cpu") if ctx.is_gpu else "cpu"
    add_floor_ratios(out["runs"], out["floor"])
    print_table(out["runs"], f"{title}, {spec.channels}x{spec.size}x{spec.size}, {spec.classes} classes, batch "
                             f"{args.batch}, SGD lr {args.lr} momentum {MOMENTUM}, median of {args.steps} steps "
                             f"after {args.warmup}; {gpu}")
    print_floor(out["floor"], args.batch)
    print_kernels(out["runs"])
    if args.data == "rec":
        add_rec_ratios(out)
        print_rec_table(out)
    save_json(args.json, out)
    print(f"\nwrote {args.json}")
    return out


if __name__ == "__main__":
    main()
