"""Inference speed of a model loaded from MXNet's files (``SymbolBlock.imports``) against the same network as a
Gluon Block, and against PyTorch (torchvision's ResNet-18: the same architecture), on one GPU, in one process.

    python scripts/bench_symbolblock.py                    # ResNet-18, 3x224x224, batch 64, TF32
    python scripts/bench_symbolblock.py --batch 256 --no-compile --json runs/symbolblock.json

The network is ResNet-18 written as MXNet 1.x code writes it (a ``HybridBlock`` with ``hybrid_forward(F, x)``:
d2l-zh's Residual, resnet.md's stem), exported with ``export()`` and imported back with ``SymbolBlock.imports``.
Rows: the Block hybridized, the SymbolBlock eager and hybridized; torch eager and (unless --no-compile)
``torch.compile``. Each is timed with CUDA events over --steps calls after --warmup, in predict mode / no_grad.

Layer: script; imports dnnbind (and torch when importable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon, nd  # noqa: E402
from dnnbind.gluon import nn  # noqa: E402
from dnnbind.runtime.device import gpu_properties  # noqa: E402


class Residual(gluon.HybridBlock):
    """d2l-zh's Residual (resnet.md), as MXNet 1.x code writes it."""

    def __init__(self, channels, use_1x1conv=False, strides=1, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = nn.Conv2D(channels, 3, padding=1, strides=strides)
            self.conv2 = nn.Conv2D(channels, 3, padding=1)
            self.conv3 = nn.Conv2D(channels, 1, strides=strides) if use_1x1conv else None
            self.bn1, self.bn2 = nn.BatchNorm(), nn.BatchNorm()

    def hybrid_forward(self, F, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.conv3(x) if self.conv3 is not None else x))


def resnet18(classes=1000):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, 7, strides=2, padding=3), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(pool_size=3, strides=2, padding=1))
    for channels, first in ((64, True), (128, False), (256, False), (512, False)):
        net.add(Residual(channels, use_1x1conv=not first, strides=1 if first else 2), Residual(channels))
    net.add(nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(classes))
    return net


def time_calls(fn, warmup, steps, sync):
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile (minutes of compiling)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if mx.num_gpus() == 0:
        raise SystemExit("bench_symbolblock.py needs a GPU")
    dev = mx.gpu(0)
    mx.set_math_mode("tf32")
    np.random.seed(0)
    x_host = np.random.default_rng(0).standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    x = nd.array(x_host, ctx=dev)
    sync = lambda: nd.waitall()  # noqa: E731
    rows = {}

    net = resnet18()
    net.initialize(mx.init.Xavier(), ctx=dev)
    with autograd.predict_mode():
        ref = net(x).asnumpy()
    folder = tempfile.mkdtemp(prefix="dnnbind-symbolblock-")
    sym_file, param_file = net.export(os.path.join(folder, "resnet18"))
    net.hybridize()
    with autograd.predict_mode():
        rows["dnnbind Block, hybridize()"] = time_calls(lambda: net(x), args.warmup, args.steps, sync)

    sb = gluon.SymbolBlock.imports(sym_file, ["data"], param_file, ctx=dev)
    with autograd.predict_mode():
        got = sb(x).asnumpy()
        rows["dnnbind SymbolBlock.imports, eager"] = time_calls(lambda: sb(x), args.warmup, args.steps, sync)
        sb.hybridize()
        rows["dnnbind SymbolBlock.imports, hybridize()"] = time_calls(lambda: sb(x), args.warmup, args.steps, sync)
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))

    try:
        import torch
        import torchvision
    except ImportError as exc:
        print(f"PyTorch/torchvision not importable ({exc}): its rows are left out")
        torch = None
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet18(num_classes=1000).cuda().eval()
        tx = torch.from_numpy(x_host).cuda()
        tsync = torch.cuda.synchronize
        with torch.no_grad():
            rows["PyTorch eager"] = time_calls(lambda: model(tx), args.warmup, args.steps, tsync)
            if not args.no_compile:
                compiled = torch.compile(model)
                t0 = time.perf_counter()
                compiled(tx)
                tsync()
                print(f"torch.compile took {time.perf_counter() - t0:.0f} s")
                rows["PyTorch torch.compile"] = time_calls(lambda: compiled(tx), args.warmup, args.steps, tsync)

    best_torch = min((v for k, v in rows.items() if k.startswith("PyTorch")), default=None)
    print(f"ResNet-18, batch {args.batch}, 3x{args.size}x{args.size}, TF32, inference "
          f"({gpu_properties(0)[0]}); SymbolBlock vs Block relative difference {err:.1e}")
    print(f"{'run':45s} {'ms/batch':>9s} {'images/s':>10s} {'vs best PyTorch':>16s}")
    for k, v in rows.items():
        ratio = f"{v / best_torch:.2f}x" if best_torch else "-"
        print(f"{k:45s} {v:9.2f} {args.batch / v * 1e3:10,.0f} {ratio:>16s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "size": args.size, "ms": rows, "rel_err": err,
                       "gpu": gpu_properties(0)[0], "date": time.strftime("%Y-%m-%d")}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
