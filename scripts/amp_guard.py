"""Issue 26's accuracy guard: ResNet-50 v1.5 trained in mixed precision (MXNet's recipe: ``net.cast('float16')``,
float32 master weights through ``gluon.Trainer(..., {'multi_precision': True})``, as bench_models.py's fp16 modes)
reaches the test accuracy of the same training in TF32, within seed-to-seed noise, on a generated CIFAR-100.

    python scripts/amp_guard.py                      # GPU: tf32, fp16, fp16-nhwc, 2 seeds each -> runs/amp_guard.json
    python scripts/amp_guard.py --modes tf32 fp16 fp32 --seeds 3
    python scripts/amp_guard.py --device cpu --epochs 1 --train-size 256 --test-size 128 --batch 32 \\
        --stages 1 1 1 1 --width 4 --modes tf32 fp16 --eager   # CPU smoke run: a bottleneck ResNet-14, 1/16 width
    python scripts/amp_guard.py --generate-only      # write the data set and stop

Layer: script; imports dnnbind (through d2l_compare's mxnet alias), numpy, scripts/d2l_compare.py (ResNet-50's
Bottleneck and stage table) and, for fp16-nhwc, scripts/bench_nhwc.py.

Data: no ImageNet or CIFAR here, so the script writes CIFAR-100 files of its own in the real binary layout that MXNet's
``gluon.data.vision.CIFAR100`` reads (train.bin and test.bin in root; each record a coarse label byte, a fine label
byte, then 1024 red, 1024 green, 1024 blue bytes), and reads them back through
``dnnbind.gluon.data.vision.CIFAR100(root, fine_label=True)``. 100 classes in 20 super-classes (coarse = fine // 5),
500 training and 100 test images per class at the default sizes, deterministic from --data-seed. Each class is a
fixed smooth colour pattern (a random 6x6x3 grid, bilinearly upsampled to 40x40; the five classes of a super-class
share 60% of their grid, so they are the ones confused); an image is a random 32x32 window of it (a shift of up to 4
pixels each way), flipped half the time, blended with a random other class's pattern (weight up to 0.45), plus a
random smooth pattern of its own (the nuisance), white noise, random contrast and brightness. See CALIBRATION.

Model: ResNet-50 v1.5 as d2l_compare.resnet50 builds it (its Bottleneck, stages [3, 4, 6, 3], 256-2048 channels), with
the stem CIFAR ResNets use for 32x32 inputs: one 3x3 stride-1 convolution, no max pool (d2l_compare.resnet50's stem
and 1000-way head are fixed, so the model is written out here over the same layer set); Dense(100).
23,705,252 parameters. --stages and --width shrink it for CPU runs.

Training, the same in every mode: SGD momentum 0.9, weight decay 5e-4, lr --lr per 256 images, linear warm-up over
the first epoch then cosine to 0, per step; softmax cross entropy on float32 logits (MXNet's fp16 recipe casts the
last layer's output to float32 before the loss), trainer.step(batch); random crop with 4 pixels of zero padding and
random horizontal flip on the host (numpy, uint8), per-channel normalization on the device; the last partial batch of
an epoch dropped.
The network is hybridize()d (--eager: not). For a given seed every mode starts from the same initial weights and sees
the same batches in the same order with the same augmentation, so the modes' runs are paired; only the arithmetic
differs.

Modes (--modes):
  tf32       float32 data and weights, TF32 tensor-core math (mx.set_math_mode('tf32')): the reference.
  fp16       net.cast('float16'), float32 master weights (multi_precision); what stays float32 (BatchNorm's statistics
             and parameters) in TF32, as bench_models.dnnbind_step.
  fp16-nhwc  fp16 in the channels-last twin of bench_nhwc.build (NHWC, BatchNormAddRelu ending each Bottleneck).
  fp32       strict FP32 (set_math_mode('fp32')): not in the default list (about 2-3x TF32's time).
No loss scaling (as bench_models' fp16 modes; --loss-scale S multiplies the loss by S and divides the update by S).

Verdict: for each mode other than the reference (tf32, else fp32), |mean test accuracy - the reference's| against
max(2 x the larger of the two modes' seed-to-seed standard deviations, 1.0 percentage point); pass if within.

GPU time: ResNet-50 with this stem is ~2.6 GFLOP per 32x32 image forward (a third of ImageNet's 224x224), ~7.8 per
training image. At the throughput of PyTorch's ImageNet ResNet-50 on an H100 (FACTS.md: TF32 ~46 TFLOP/s effective,
AMP ~98), that is ~5,900 images/s TF32 and ~12,500 fp16. Default run: 5 epochs x 49,920 images x 2 seeds x 3 modes =
1.5M training images (+ 10,000 test images per epoch, a third of the cost each) ~ 90 (tf32) + 45 (fp16) + 35
(fp16-nhwc) s, plus set-up (data ~10 s once, each run's recording and algorithm search), if dnnbind's hybridized step
is as fast as PyTorch eager (on d2l's ResNet-18 it is faster: docs/benchmarks.md); twice that if half as fast.
--time-limit (default 450 s) stops starting new runs past it: runs are ordered seed by seed
(every mode of seed 0, then of seed 1), so a cut run keeps paired results, and a run is not started if its mode's
previous run (or, for a mode's first, the longest run so far) says it would end past the limit.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]  # the checkout (dnnbind) and scripts/ (d2l_compare, bench_nhwc)
import d2l_compare as d2l  # noqa: E402  (installs the mxnet alias)

import dnnbind  # noqa: E402
from dnnbind import autograd, gluon, nd  # noqa: E402
from dnnbind.gluon.data.vision import CIFAR100  # noqa: E402
from dnnbind.gluon.data.vision.idx import atomic_write  # noqa: E402
from dnnbind.runtime.device import gpu_properties  # noqa: E402

ROOT = ".data/cifar100_generated"  # gitignored (/.data/)
JSON = "runs/amp_guard.json"
TRAIN_SIZE, TEST_SIZE = 50_000, 10_000  # the real CIFAR-100's
EPOCHS = 5
SEEDS = 2              # training seeds per mode (0, 1, ...)
DATA_SEED = 0          # the generated data set
BATCH = 256
LR = 0.2               # per 256 images (scaled linearly with --batch), the peak after warm-up
WARMUP_EPOCHS = 1.0
MOMENTUM, WD = 0.9, 5e-4
MODES = ("tf32", "fp16", "fp16-nhwc")  # default; "fp32" (strict) on request
ALL_MODES = ("tf32", "fp16", "fp16-nhwc", "fp32")
TIME_LIMIT = 450.0     # seconds: no new run starts past this (the lead's device budget)
MIN_TOL_PP = 1.0       # the verdict's floor, percentage points
CLASSES, PER_COARSE = 100, 5
PAD = 4                # augmentation's zero padding (and the generator's shift range)

# The generator's knobs and the calibration behind their defaults (this repo's 2-core CPU machine, 2026-11-27).
# A matched filter that knows the 100 patterns (the largest normalized correlation over every shift and flip), on
# 2,000 test images: 97.6% at nuisance 1.0 / noise 0.5; 90.3% at 1.5 / 0.8; 83.0% at 1.75 / 0.8; 72.5% at 2.0 / 0.8;
# 61.3% at 2.25 / 0.8 (the default); 51.3% at 2.5 / 0.8 (not a ceiling: it ignores the nuisance's statistics, which
# a trained model can learn). A 4-block CNN (32-256 channels, BatchNorm; SGD momentum 0.9, wd 5e-4, cosine from lr
# 0.1, batch 128, no augmentation) trained on 50,048 generated images for 2 epochs reached 43.5% -> 72.0% test
# accuracy at 1.75, and 22.0% -> 43.4% at 2.25; on 10,240 of them for 4 epochs, 47.9% at 1.5 and 34.4% at 1.75.
# Nearest class mean: 42% at 1.5, 22% at 2.25. ResNet-50 for 5 epochs (2.5x the passes, with augmentation) is
# expected above the small CNN's 43%, inside the issue's 50-85%; not measured here. --nuisance moves it (lower is
# easier) if a GPU run says otherwise.
GEN = {"grid": 6, "share": 0.6, "alpha_max": 0.45, "nuisance": 2.25, "noise": 0.8, "contrast": (0.6, 1.4),
       "brightness": (-0.4, 0.4)}
GEN_VERSION = 1  # bump when the generator changes: cached files with another version are rewritten


# ---- the data set: CIFAR-100 files, generated ----------------------------------------------------------------------

def _upsample(grid: np.ndarray, out: int) -> np.ndarray:
    """(..., g, g) -> (..., out, out), bilinear with the corners aligned."""
    g = grid.shape[-1]
    pos = np.linspace(0, g - 1, out)
    lo = np.floor(pos).astype(int).clip(0, g - 2)
    w = pos - lo
    m = np.zeros((out, g))
    m[np.arange(out), lo] = 1 - w
    m[np.arange(out), lo + 1] += w
    m = m.astype(grid.dtype)
    return m @ grid @ m.T  # batched matmuls (BLAS), not einsum's loops


def class_patterns(rng: np.random.Generator, knobs: dict) -> np.ndarray:
    """(100, 3, 40, 40) float32, each pattern zero-mean unit-variance; a super-class's five share ``share`` of
    their grid (so fine classes are confused within a super-class, as in the real CIFAR-100)."""
    g = knobs["grid"]
    coarse = rng.standard_normal((CLASSES // PER_COARSE, 3, g, g))
    own = rng.standard_normal((CLASSES, 3, g, g))
    s = knobs["share"]
    grid = s * coarse[np.arange(CLASSES) // PER_COARSE] + math.sqrt(1 - s * s) * own
    t = _upsample(grid, 32 + 2 * PAD)
    t -= t.mean(axis=(1, 2, 3), keepdims=True)
    t /= t.std(axis=(1, 2, 3), keepdims=True)
    return t.astype(np.float32)


def _windows(patterns: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random 32x32 window of pattern idx[i] (shifted up to PAD each way), flipped half the time: (n, 3, 32, 32)."""
    n = len(idx)
    views = np.lib.stride_tricks.sliding_window_view(patterns, (32, 32), axis=(2, 3))  # (100, 3, 9, 9, 32, 32)
    dy, dx = rng.integers(0, 2 * PAD + 1, n), rng.integers(0, 2 * PAD + 1, n)
    out = views[idx, :, dy, dx]  # (n, 3, 32, 32), a copy
    flip = rng.random(n) < 0.5
    out[flip] = out[flip, :, :, ::-1]
    return out


def render(patterns: np.ndarray, labels: np.ndarray, rng: np.random.Generator, knobs: dict) -> np.ndarray:
    """uint8 (n, 3, 32, 32) images of classes ``labels``."""
    n = len(labels)
    other = (labels + rng.integers(1, CLASSES, n)) % CLASSES  # the distractor: any other class
    a = rng.uniform(0, knobs["alpha_max"], n).astype(np.float32)[:, None, None, None]
    x = (1 - a) * _windows(patterns, labels, rng) + a * _windows(patterns, other, rng)
    g = knobs["grid"]
    nuisance = _upsample(rng.standard_normal((n, 3, g, g), dtype=np.float32), 32 + 2 * PAD)
    x += knobs["nuisance"] * nuisance[:, :, PAD:-PAD, PAD:-PAD]
    x += knobs["noise"] * rng.standard_normal(x.shape, dtype=np.float32)
    contrast = rng.uniform(*knobs["contrast"], n).astype(np.float32)[:, None, None, None]
    bright = rng.uniform(*knobs["brightness"], n).astype(np.float32)[:, None, None, None]
    return np.clip(np.rint(128 + 40 * (contrast * x + bright)), 0, 255).astype(np.uint8)


def _split(patterns, n: int, rng: np.random.Generator, knobs: dict, chunk: int = 5000) -> tuple:
    """n images, the classes balanced (n // 100 each, the rest spread) and shuffled, as CIFAR-100's files."""
    fine = rng.permutation(np.arange(n) % CLASSES).astype(np.uint8)
    seeds = rng.spawn((n + chunk - 1) // chunk)  # one stream per chunk: memory stays bounded
    images = np.concatenate([render(patterns, fine[i * chunk:(i + 1) * chunk], s, knobs)
                             for i, s in enumerate(seeds)]) if n else np.zeros((0, 3, 32, 32), np.uint8)
    return images, fine


def records(images: np.ndarray, fine: np.ndarray) -> bytes:
    """CIFAR-100's binary layout: per image <coarse label byte><fine label byte><3072 pixel bytes, planes R, G, B>."""
    rows = np.empty((len(fine), 2 + 3072), np.uint8)
    rows[:, 0] = fine // PER_COARSE
    rows[:, 1] = fine
    rows[:, 2:] = images.reshape(len(fine), 3072)
    return rows.tobytes()


def _jsonable(knobs: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in knobs.items()}


def generate(root: str, train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE, seed: int = DATA_SEED,
             knobs: dict | None = None) -> dict:
    """Write train.bin, test.bin (and amp_guard_meta.json, what they hold) into root; return the meta. ``knobs``
    override GEN's."""
    knobs = dict(GEN, **(knobs or {}))
    rng = np.random.default_rng(seed)
    r_patterns, r_train, r_test = rng.spawn(3)
    patterns = class_patterns(r_patterns, knobs)
    for name, n, r in (("train.bin", train_size, r_train), ("test.bin", test_size, r_test)):
        atomic_write(os.path.join(root, name), records(*_split(patterns, n, r, knobs)))
    meta = {"version": GEN_VERSION, "seed": seed, "train_size": train_size, "test_size": test_size,
            "knobs": _jsonable(knobs)}
    atomic_write(os.path.join(root, "amp_guard_meta.json"), json.dumps(meta, indent=1).encode())
    return meta


def ensure_data(root: str, train_size: int, test_size: int, seed: int, knobs: dict | None = None) -> dict:
    """The generated files in root: reused when this generator version wrote them with this seed and these knobs
    and they hold at least the sizes asked for (the first train_size / test_size records are used), else written."""
    knobs = dict(GEN, **(knobs or {}))
    try:
        with open(os.path.join(root, "amp_guard_meta.json")) as f:
            meta = json.load(f)
        want = {"version": GEN_VERSION, "seed": seed, "knobs": _jsonable(knobs)}
        if (all(meta.get(k) == v for k, v in want.items()) and meta["train_size"] >= train_size
                and meta["test_size"] >= test_size
                and all(os.path.isfile(os.path.join(root, n)) for n in ("train.bin", "test.bin"))):
            return dict(meta, generated=False)
    except (OSError, ValueError, KeyError):
        pass
    t0 = time.perf_counter()
    meta = generate(root, train_size, test_size, seed, knobs)
    return dict(meta, generated=True, generate_s=time.perf_counter() - t0)


def load(root: str, train: bool, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n images (uint8 (n, 32, 32, 3)) and fine labels (int32) of a split, through dnnbind's CIFAR100."""
    ds = CIFAR100(root=root, fine_label=True, train=train)
    if len(ds) < n:
        raise SystemExit(f"{root}: the {'train' if train else 'test'} split has {len(ds)} images, {n} asked for")
    return ds.data[:n], np.asarray(ds.label[:n])


# ---- the model ----------------------------------------------------------------------------------------------------

def cifar_resnet50(stages=(3, 4, 6, 3), width: int = 64, classes: int = CLASSES):
    """ResNet-50 v1.5 over a layer set L (d2l_compare's convention) with the CIFAR stem; ``stages`` bottlenecks per
    stage, ``width`` the first stage's 3x3 channels (64: ResNet-50's 256-2048 outputs)."""
    def resnet50(L):  # NOTE: bench_nhwc.build makes NHWC twins of the architectures it lists by name; this is
        #                 ResNet-50 written over the same layer set and Bottleneck, so its twin is well-formed
        stem = [L.conv(width, 3, 1, 1, bias=False), L.bn(), L.act("relu")]  # 32x32 in, no max pool
        body = [L.seq(L.Bottleneck(channels * width // 64, strides, downsample=True),
                      *[L.Bottleneck(channels * width // 64) for _ in range(n - 1)])
                for n, (_, channels, strides) in zip(stages, d2l.RESNET50_STAGES, strict=True) if n > 0]
        return L.seq(*stem, *body, L.gap(), L.dense(classes))
    return resnet50


def spec_for(args) -> d2l.Spec:
    name = "ResNet-50 v1.5, CIFAR stem" if tuple(args.stages) == (3, 4, 6, 3) and args.width == 64 else \
        f"bottleneck ResNet, stages {list(args.stages)}, width {args.width}, CIFAR stem"
    return d2l.Spec(name, cifar_resnet50(args.stages, args.width), 32, args.lr, args.batch, 3, CLASSES)


# ---- one training run -----------------------------------------------------------------------------------------------

class Batches:
    """Host-side augmentation, on the uint8 pixels: a random 32x32 window of the image zero-padded by PAD, mirrored
    half the time, in the model's layout. The draws depend only on (seed, epoch), so every mode of a seed sees the
    same batches. Normalization and the float conversion run on the device (Normalize): a quarter of the bytes to
    copy and no float passes on the host."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        padded = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))  # (N, 40, 40, 3) uint8
        # NOTE: a mirrored copy kept alongside: each window is then a plain slice, copied ~5x faster than numpy's
        # fancy indexing or a negative-stride copy (which would bound the fp16 modes' step on the host)
        self.padded = np.stack([padded, np.ascontiguousarray(padded[:, :, ::-1])])
        self.labels = labels

    def epoch(self, seed: int, epoch: int, batch: int, layout: str):
        """(uint8 (batch, 3, 32, 32) or (batch, 32, 32, 3), int32 labels) per step; the last partial batch dropped."""
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(len(self.labels))
        side = 2 * PAD
        for i in range(0, len(perm) - batch + 1, batch):
            idx = perm[i:i + batch]
            dy, dx = rng.integers(0, side + 1, batch), rng.integers(0, side + 1, batch)
            flip = (rng.random(batch) < 0.5).astype(np.intp)
            x0 = np.where(flip == 1, side - dx, dx)  # window dx of the image is window side - dx of its mirror
            x = np.empty((batch, 32, 32, 3), np.uint8)
            for j, (f, k, a, c) in enumerate(zip(flip.tolist(), idx.tolist(), dy.tolist(), x0.tolist())):
                x[j] = self.padded[f, k, a:a + 32, c:c + 32]
            yield (x if layout == "NHWC" else np.ascontiguousarray(x.transpose(0, 3, 1, 2))), self.labels[idx]


class Normalize:
    """uint8 batch on the host -> (x - mean) / std per channel on the device, in the mode's dtype (float16 inputs
    are the float32 ones rounded, so every mode sees the same images)."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, layout: str, dtype, ctx):
        shape = (1, 1, 1, 3) if layout == "NHWC" else (1, 3, 1, 1)
        self.mean = nd.array(mean.reshape(shape), ctx=ctx)
        self.scale = nd.array((1 / std).reshape(shape), ctx=ctx)
        self.dtype, self.ctx = np.dtype(dtype), ctx

    def __call__(self, x_u8: np.ndarray):
        x = (nd.array(x_u8, ctx=self.ctx, dtype=np.uint8).astype("float32") - self.mean) * self.scale
        return x.astype(self.dtype.name) if self.dtype != np.float32 else x


def lr_at(step: int, steps: int, warmup: int, peak: float) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine to 0 at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def build_net(spec, mode: str, ctx, seed: int, hybrid: bool):
    """The model of ``spec`` initialized from ``seed`` (d2l's Xavier, as bench_models.make_mx), in ``mode``."""
    d2l.mx.random.seed(seed)  # also numpy's global generator, which the initializers draw from
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=ctx)
    net(nd.zeros((2, 3, 32, 32), ctx=ctx))  # predict mode: finishes deferred init
    if mode == "fp16-nhwc":
        import bench_nhwc
        net = bench_nhwc.build(spec, net, ctx)  # the same values, transposed, in the channels-last twin
        gc.collect()  # the NCHW model it was built from sits in a cycle (as bench_models.dnnbind_step)
    if mode.startswith("fp16"):
        net.cast("float16")  # BatchNorm stays float32
    if hybrid:
        net.hybridize()
    return net


def evaluate(net, x_u8: np.ndarray, y: np.ndarray, normalize: Normalize, batch: int, layout: str) -> float:
    """Test accuracy in predict mode; the last batch is padded to full size (one recorded shape when hybridized)."""
    correct = 0
    for i in range(0, len(y), batch):
        xb = x_u8[i:i + batch]  # (n, 32, 32, 3)
        n = len(xb)
        if n < batch:
            xb = np.concatenate([xb, np.zeros((batch - n, *xb.shape[1:]), xb.dtype)])
        xb = xb if layout == "NHWC" else np.ascontiguousarray(xb.transpose(0, 3, 1, 2))
        logits = net(normalize(xb)).asnumpy()
        correct += int((logits[:n].argmax(1) == y[i:i + n]).sum())
    return correct / max(1, len(y))


def train_run(mode: str, seed: int, spec, data: dict, args, ctx) -> dict:
    layout = "NHWC" if mode == "fp16-nhwc" else "NCHW"
    dtype = np.float16 if mode.startswith("fp16") else np.float32
    dnnbind.set_math_mode("fp32" if mode == "fp32" else "tf32")  # fp16: its float32 remainder in TF32
    net = build_net(spec, mode, ctx, seed, not args.eager)
    peak = args.lr * args.batch / 256
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": peak, "momentum": MOMENTUM, "wd": WD,
                                                          "multi_precision": dtype == np.float16})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    per_epoch = len(data["train_y"]) // args.batch
    steps, warmup = args.epochs * per_epoch, max(1, round(WARMUP_EPOCHS * per_epoch))
    scale = args.loss_scale
    normalize = Normalize(data["mean"], data["std"], layout, dtype, ctx)
    epochs, step, t_run = [], 0, time.perf_counter()
    for epoch in range(args.epochs):
        t0, sums = time.perf_counter(), []
        for x, y in data["batches"].epoch(seed, epoch, args.batch, layout):
            trainer.set_learning_rate(lr_at(step, steps, warmup, peak))
            X, Y = normalize(x), nd.array(y, ctx=ctx, dtype=np.int32)
            with autograd.record():
                loss = loss_fn(net(X).astype("float32"), Y)  # float32 logits into the loss (MXNet's fp16 recipe)
                scaled = loss * scale if scale != 1 else loss
            scaled.backward()
            trainer.step(args.batch * scale)  # 1/(batch * scale): the mean loss's gradient
            sums.append(loss.sum())  # read once per epoch: no synchronization in the loop
            step += 1
        train_loss = float(sum(float(s.asscalar()) for s in sums) / max(1, len(sums) * args.batch))
        secs = time.perf_counter() - t0
        acc = evaluate(net, data["test_x"], data["test_y"], normalize, args.batch, layout)
        epochs.append({"epoch": epoch + 1, "train_loss": train_loss, "test_acc": acc, "train_s": secs,
                       "images_per_s": per_epoch * args.batch / secs, "lr_end": trainer.learning_rate})
        print(f"  {mode:<10} seed {seed} epoch {epoch + 1}/{args.epochs}: loss {train_loss:.4f}, test acc "
              f"{100 * acc:.2f}%, {secs:.1f} s ({per_epoch * args.batch / secs:,.0f} images/s)", flush=True)
        if not math.isfinite(train_loss):
            break
    dnnbind.set_math_mode("fp32")
    last = epochs[-1]
    return {"mode": mode, "seed": seed, "status": "ok", "test_acc": last["test_acc"],
            "train_loss": last["train_loss"], "seconds": time.perf_counter() - t_run, "epochs": epochs}


# ---- summary and verdict --------------------------------------------------------------------------------------------

def summarize(runs: list[dict], modes: list[str]) -> dict:
    out = {}
    for m in modes:
        ok = [r for r in runs if r["mode"] == m and r["status"] == "ok"]
        if not ok:
            continue
        acc = np.array([100 * r["test_acc"] for r in ok])
        loss = np.array([r["train_loss"] for r in ok])
        out[m] = {"n": len(ok), "seeds": [r["seed"] for r in ok], "acc_pp": acc.tolist(),
                  "mean_acc_pp": float(acc.mean()), "std_acc_pp": float(acc.std(ddof=1)) if len(ok) > 1 else 0.0,
                  "mean_train_loss": float(loss.mean()),
                  "std_train_loss": float(loss.std(ddof=1)) if len(ok) > 1 else 0.0}
    return out


def verdict(summary: dict, runs: list[dict], min_tol: float = MIN_TOL_PP) -> dict:
    """Each mode against the reference (tf32, else fp32): |mean diff| <= max(2 x the larger std, min_tol) pp."""
    ref = next((m for m in ("tf32", "fp32") if m in summary), None)
    rows = []
    for m, s in summary.items():
        if ref is None or m == ref:
            continue
        r = summary[ref]
        diff = s["mean_acc_pp"] - r["mean_acc_pp"]
        tol = max(2 * max(s["std_acc_pp"], r["std_acc_pp"]), min_tol)
        acc = {(x["mode"], x["seed"]): 100 * x["test_acc"] for x in runs if x["status"] == "ok"}
        paired = [acc[(m, k)] - acc[(ref, k)] for k in s["seeds"] if (ref, k) in acc]  # same seed: same data, init
        rows.append({"mode": m, "reference": ref, "diff_pp": diff, "tol_pp": tol, "paired_diffs_pp": paired,
                     "loss_diff": s["mean_train_loss"] - r["mean_train_loss"], "pass": bool(abs(diff) <= tol)})
    return {"reference": ref, "rule": f"|mean acc - reference's| <= max(2 x larger within-mode std, {min_tol} pp)",
            "comparisons": rows, "pass": all(r["pass"] for r in rows) if rows else None}  # None: nothing compared


def print_table(summary: dict, runs: list[dict], ver: dict, title: str) -> None:
    print(f"\n{title}")
    print(f"{'mode':<11}{'seeds':>6}{'test acc % per seed':>28}{'mean':>8}{'std':>7}{'train loss':>12}"
          f"{'images/s':>10}")
    for m, s in summary.items():
        ips = np.mean([r["epochs"][-1]["images_per_s"] for r in runs if r["mode"] == m and r["status"] == "ok"])
        print(f"{m:<11}{s['n']:>6}{' '.join(f'{a:.2f}' for a in s['acc_pp']):>28}{s['mean_acc_pp']:>8.2f}"
              f"{s['std_acc_pp']:>7.2f}{s['mean_train_loss']:>12.4f}{ips:>10,.0f}")
    for r in ver["comparisons"]:
        paired = ", ".join(f"{d:+.2f}" for d in r["paired_diffs_pp"])
        print(f"{r['mode']} - {r['reference']}: {r['diff_pp']:+.2f} pp (per seed {paired}), tolerance "
              f"{r['tol_pp']:.2f} pp, train loss {r['loss_diff']:+.4f}: {'PASS' if r['pass'] else 'FAIL'}")
    word = {True: "PASS", False: "FAIL", None: "none (fewer than two modes finished)"}[ver["pass"]]
    print(f"verdict: {word} ({ver['rule']})")


def expected_seconds(runs: list[dict], mode: str) -> float:
    """A run's duration as its mode's last run took; a mode not yet run, as the longest run so far (0 if none)."""
    done = [r["seconds"] for r in runs if r["status"] == "ok"]
    same = [r["seconds"] for r in runs if r["status"] == "ok" and r["mode"] == mode]
    return same[-1] if same else max(done, default=0.0)


# ---- driver ---------------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--modes", nargs="+", choices=ALL_MODES, default=list(MODES))
    p.add_argument("--seeds", type=int, default=SEEDS, help="training seeds per mode: 0 .. seeds-1")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--lr", type=float, default=LR, help="peak lr per 256 images (scaled with --batch)")
    p.add_argument("--loss-scale", type=float, default=1.0, help="static loss scale (1: none, as bench_models)")
    p.add_argument("--train-size", type=int, default=TRAIN_SIZE)
    p.add_argument("--test-size", type=int, default=TEST_SIZE)
    p.add_argument("--root", default=ROOT, help="where the generated CIFAR-100 files are (written if missing)")
    p.add_argument("--data-seed", type=int, default=DATA_SEED)
    p.add_argument("--nuisance", type=float, default=GEN["nuisance"],
                   help="the generator's difficulty: amplitude of each image's own smooth random pattern (CALIBRATION)")
    p.add_argument("--noise", type=float, default=GEN["noise"], help="the generator's white noise amplitude")
    p.add_argument("--generate-only", action="store_true", help="write the data set, load it back, and stop")
    p.add_argument("--stages", type=int, nargs=4, default=[3, 4, 6, 3], metavar="N",
                   help="bottlenecks per stage (ResNet-50: 3 4 6 3)")
    p.add_argument("--width", type=int, default=64, help="first stage's 3x3 channels (ResNet-50: 64)")
    p.add_argument("--eager", action="store_true", help="do not hybridize()")
    p.add_argument("--bn-mode", choices=("persistent", "spatial"), default="persistent",
                   help="dnnbind's training BatchNorm algorithm (dnnbind.set_batchnorm_mode)")
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT,
                   help="seconds; a run that would end past this (as its mode's last run took) is skipped "
                        "(0: no limit)")
    p.add_argument("--json", default=JSON)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.device == "gpu" and dnnbind.num_gpus() == 0 and not args.generate_only:
        raise SystemExit(f"amp_guard.py needs a GPU (or --device cpu): {dnnbind.runtime.gpu_status()[1]}")
    meta = ensure_data(args.root, args.train_size, args.test_size, args.data_seed,
                       {"nuisance": args.nuisance, "noise": args.noise})
    train_x, train_y = load(args.root, True, args.train_size)
    test_x, test_y = load(args.root, False, args.test_size)
    print(f"CIFAR-100 (generated, seed {args.data_seed}) in {args.root}: {len(train_y):,} train / {len(test_y):,} "
          f"test images{' written in %.1f s' % meta['generate_s'] if meta['generated'] else ''}", flush=True)
    if args.generate_only:
        return {"data": meta}
    ctx = dnnbind.gpu(0) if args.device == "gpu" else dnnbind.cpu()
    dnnbind.set_batchnorm_mode(args.bn_mode)
    mean = train_x.reshape(-1, 3).mean(0).astype(np.float32)
    std = train_x.reshape(-1, 3).std(0).astype(np.float32)
    data = {"batches": Batches(train_x, train_y), "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "mean": mean, "std": std}
    spec = spec_for(args)
    params = d2l.num_trainable(build_net(spec, "tf32", ctx, 0, False))
    out = {"config": {k: v for k, v in vars(args).items()}, "model": spec.notebook, "parameters": params,
           "momentum": MOMENTUM, "wd": WD, "warmup_epochs": WARMUP_EPOCHS, "data": meta,
           "python": platform.python_version(), "numpy": np.__version__,
           "gpu": gpu_properties(0)[0] if args.device == "gpu" else None, "runs": []}
    print(f"{spec.notebook}: {params:,} parameters; {args.epochs} epochs of {len(train_y) // args.batch} batches of "
          f"{args.batch}, lr {args.lr * args.batch / 256:g} (warm-up {WARMUP_EPOCHS:g} epoch, cosine), modes "
          f"{' '.join(args.modes)}, seeds 0..{args.seeds - 1}, {'eager' if args.eager else 'hybridize()'}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    for seed in range(args.seeds):  # seed by seed: a run cut by --time-limit still leaves paired results
        for mode in args.modes:
            elapsed = time.perf_counter() - t_start
            need = expected_seconds(out["runs"], mode)
            if args.time_limit and elapsed + need > args.time_limit:
                why = f"--time-limit {args.time_limit:g} s: {elapsed:.0f} s gone, this run would take ~{need:.0f} s"
                out["runs"].append({"mode": mode, "seed": seed, "status": "skipped", "reason": why})
                print(f"  {mode} seed {seed}: skipped, {why}", flush=True)
                continue
            try:
                out["runs"].append(train_run(mode, seed, spec, data, args, ctx))
                print(f"  {mode} seed {seed}: {out['runs'][-1]['seconds']:.1f} s; "
                      f"{time.perf_counter() - t_start:.0f} s since the start", flush=True)
            except Exception as exc:  # noqa: BLE001  (a mode's failure is a result; the others still run)
                import traceback
                out["runs"].append({"mode": mode, "seed": seed, "status": "failed",
                                    "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
                print(f"  {mode} seed {seed}: FAILED {type(exc).__name__}: {exc}", flush=True)
            finally:
                dnnbind.set_math_mode("fp32")
                gc.collect()  # the run's model, its recordings and the NCHW model an NHWC twin was built from
            # after every run: a run cut short still leaves its numbers (atomically: a kill mid-write keeps the last)
            atomic_write(args.json, json.dumps(out, indent=1).encode())
    out["summary"] = summarize(out["runs"], args.modes)
    out["verdict"] = verdict(out["summary"], out["runs"])
    out["total_s"] = time.perf_counter() - t_start
    print_table(out["summary"], out["runs"], out["verdict"],
                f"{spec.notebook} on generated CIFAR-100, {args.device}, {args.epochs} epochs, "
                f"{len(train_y):,} train / {len(test_y):,} test images, {out['total_s']:.0f} s in all")
    atomic_write(args.json, json.dumps(out, indent=1).encode())
    print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
