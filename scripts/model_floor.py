"""The compute and memory-traffic floor of one training step of a d2l-zh model or of ResNet-50 v1.5, from its
layers' shapes.

    python scripts/model_floor.py --model resnet18     # and alexnet, resnet50 (3x224x224, batch 256); no GPU needed

Layer: script; imports dnnbind and d2l_compare (the models). One forward on the host with hooks on every leaf
Block gives each layer's input and output shape and weight count. Then, for the benchmark's batch:
- FLOPs: each Conv2D and Dense costs 2 * MACs forward, the same for the weight gradient, and the same for the data
  gradient except in the first layer (its input needs none);
- bytes: a lower bound on DRAM traffic: each leaf layer's output written and read once forward, its gradient
  written and read once backward (activation bytes: 4 in TF32, 2 in float16), plus the SGD-momentum update
  reading weight, gradient and momentum and writing weight and momentum in float32. Fused ops (conv+bias+ReLU,
  BatchNorm-add-ReLU) and cache reuse can go below this per-layer count, elementwise ops between Blocks
  (the residual add and ReLU of d2l's Residual and of ResNet-50's Bottleneck are nd calls, not Blocks) add to it;
- the floor: FLOPs at the GPU's dense tensor-core peak, bytes at its memory bandwidth (H100 SXM by default).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
import d2l_compare as d2l  # noqa: E402

import dnnbind as mx  # noqa: E402
from dnnbind.gluon import nn  # noqa: E402

MODELS = {"resnet18": "resnet", "alexnet": "alexnet", "resnet50": "resnet50"}  # -> d2l_compare.SPECS/ZOO_SPECS
# H100 SXM5 (NVIDIA's datasheet): dense tensor-core TFLOPS and HBM3 bandwidth
PEAK_NAME = "H100 SXM5: 495 dense TFLOPS tf32, 989 fp16/bf16, 3.35 TB/s"
PEAK = {"tf32": 494.7e12, "fp16": 989.4e12}
BANDWIDTH = 3.35e12


def spec_for(model: str):
    """The d2l_compare Spec of --model."""
    return {**d2l.SPECS, **d2l.ZOO_SPECS}[MODELS[model]]


def layer_shapes(spec) -> list[dict]:
    """[{kind, in, out, weights, macs}] per leaf Block, in call order, for one image."""
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=mx.cpu())
    rows = []

    def hook(block, inputs, out):
        w = getattr(block, "weight", None)
        weights = int(np.prod(w.shape)) if w is not None else 0
        per_out = 0
        if isinstance(block, nn.Conv2D):  # MACs per output element: in_channels/groups * kh * kw
            per_out = int(np.prod(w.shape[1:]))
            macs = per_out * int(np.prod(out.shape[1:]))
        elif isinstance(block, nn.Dense):
            macs = weights
        else:
            macs = 0
        rows.append({"kind": type(block).__name__, "in": tuple(inputs[0].shape[1:]), "out": tuple(out.shape[1:]),
                     "weights": weights + sum(int(np.prod(p.shape)) for n, p in block.params.items()
                                              if not n.endswith("weight") and "running" not in n),
                     "macs": macs})

    layers = (nn.Conv2D, nn.Dense)  # with activation=..., these hold an Activation child: counted as one layer
    inner = {id(c) for b in _blocks(net) if isinstance(b, layers) for c in b._children.values()}
    for b in _blocks(net):
        if isinstance(b, layers) or (not b._children and id(b) not in inner):
            b.register_forward_hook(hook)
    net(mx.nd.zeros((1, spec.channels, spec.size, spec.size)))
    return rows


def _blocks(net) -> list:
    out = []
    net.apply(out.append)
    return out


def floor(rows: list[dict], batch: int, math: str) -> dict:
    act_bytes = 4 if math == "tf32" else 2
    macs = sum(r["macs"] for r in rows)
    first = next((r["macs"] for r in rows if r["macs"]), 0)
    flops = batch * 2 * (3 * macs - first)
    acts = batch * sum(int(np.prod(r["out"])) for r in rows)
    params = sum(r["weights"] for r in rows)
    traffic = 4 * acts * act_bytes + 5 * 4 * params
    return {"gflop": flops / 1e9, "activation_mib": acts * act_bytes / 2**20, "params_m": params / 1e6,
            "traffic_mib": traffic / 2**20, "compute_ms": 1e3 * flops / PEAK[math],
            "memory_ms": 1e3 * traffic / BANDWIDTH}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--batch", type=int, default=None,
                   help="default: the book's (ResNet-18 256, AlexNet 128); ResNet-50 256")
    args = p.parse_args(argv)
    spec = spec_for(args.model)
    batch = args.batch or spec.batch_size
    rows = layer_shapes(spec)
    out = {}
    print(f"{args.model}: {len(rows)} leaf layers, batch {batch}, {spec.channels}x{spec.size}x{spec.size}")
    for math in ("tf32", "fp16"):
        f = out[math] = floor(rows, batch, math)
        print(f"  {math}: {f['gflop']:.0f} GFLOP -> {f['compute_ms']:.2f} ms at {PEAK[math] / 1e12:.0f} TFLOPS; "
              f"{f['traffic_mib']:.0f} MiB moved ({f['activation_mib']:.0f} MiB of layer outputs, "
              f"{f['params_m']:.1f} M parameters) -> {f['memory_ms']:.2f} ms at {BANDWIDTH / 1e12:.2f} TB/s; "
              f"floor {max(f['compute_ms'], f['memory_ms']):.2f} ms")
    return out


if __name__ == "__main__":
    main()
