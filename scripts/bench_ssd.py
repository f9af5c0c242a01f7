"""Benchmark SSD-512 with a ResNet-50 v1 base on VOC (20 classes): GluonCV 0.10.5's ``ssd_512_resnet50_v1_voc`` run
unchanged on dnnbind through the mxnet alias, against a faithful PyTorch port of the same network and loss, one GPU,
one process. Times one training step (forward + SSDMultiBoxLoss + backward + SGD) and inference (forward + box
decoding + per-class NMS, as GluonCV's predict mode returns it). Prints a table and writes JSON.

    python scripts/bench_ssd.py                                   # all modes, batch 8, 512x512, TF32
    python scripts/bench_ssd.py --modes dnnbind-train-hybrid torch-train torch-train-amp
    python scripts/bench_ssd.py --math fp32                       # strict FP32 for both frameworks
    python scripts/bench_ssd.py --device cpu --batch 2 --size 128 --steps 1  # CPU smoke run (timings meaningless)

Training needs 2 or more images: the last expander map is 1x1, and a training BatchNorm over 1 value per channel is
refused by torch, and by dnnbind (MXNet returns beta there); --batch 1 runs, with the training modes failed.

Layer: script; imports dnnbind, bench_timing.py (clocks, memory, measure()), bench.py (versions), GluonCV (through
dnnbind's mxnet alias) and torch if installed: each side runs without the other, --help without either.

What is compared (GluonCV's scripts/detection/ssd/train_ssd.py, one GPU of its 4 x 8 setting):
- dnnbind: ``model_zoo.get_model("ssd_512_resnet50_v1_voc", pretrained_base=False)``, He-normal init (the
  predictor and expander layers keep their own Xavier initializers), trained with ``gluoncv.loss.SSDMultiBoxLoss``
  inside ``autograd.record()``, ``autograd.backward(sum_loss)``, ``trainer.step(1)``; SGD lr 1e-3, momentum 0.9,
  wd 5e-4. train_ssd.py hybridizes the network before its loop: dnnbind-train-hybrid is its setting. Targets come from ``SSDTargetGenerator(iou_thresh=0.5, negative_mining_ratio=-1)`` as
  SSDDefaultTrainTransform makes them in the data pipeline: here once, for one fixed synthetic batch (random
  normalized pixels, NBOX random boxes per image), so the timed step starts from device-resident images and targets.
- PyTorch: TorchSSD below, written from gluoncv/model_zoo/ssd/{ssd,presets,anchor}.py, gluoncv/nn/feature.py
  (FeatureExpander) and gluoncv/model_zoo/resnet.py (BottleneckV1: the stride sits on the first 1x1 conv, which,
  like the last 1x1, has a bias; torchvision's ResNet-50 puts the stride on the 3x3 and has no conv biases, so it
  is not used). Same layers, channels, strides, anchors, heads, BatchNorm epsilons (1e-5 in the base, 1e-3 and
  fix_gamma in the expander, MXNet's symbol BatchNorm defaults) and the same loss and optimizer. The parameter
  counts are printed and must agree; where GluonCV loads, its initial weights are copied into the port and the
  first loss of both is printed (the "weights check").
NOTE: GluonCV's loss reads the number of positives back to the host every step (``asscalar()``), part of the
workload it defines; the port keeps that count on the device, as a PyTorch user would write it.

Timed: per mode, warm-up steps, then N steps with a CUDA event after each and one synchronize at the end; ms/step is
the median event interval (bench_timing.measure). Ratios: against PyTorch in the same task and the same math, and
against PyTorch's fastest mode of the same task (train or inference).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import itertools
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]  # the checkout (dnnbind) and scripts/ (bench_timing, bench)
from bench_timing import clock_for, guarded, measure, memory_for, save_json

import dnnbind as mx

MODEL = "ssd_512_resnet50_v1_voc"
SIZE, CLASSES = 512, 20            # input side; VOC's foreground classes
BATCH = 8                          # per GPU: GluonCV trains SSD-512 with batch 32 on 4 GPUs
LR, MOMENTUM, WD = 1e-3, 0.9, 5e-4  # train_ssd.py's defaults
NBOX = 3                           # ground-truth boxes per synthetic image (VOC averages about 2.4)
WARMUP, STEPS = 5, 30              # per mode: untimed steps, then timed steps
SEED = 0
STDS = (0.1, 0.1, 0.2, 0.2)        # box-coding deviations (SSD's and SSDTargetGenerator's defaults)
# ssd_512_resnet50_v1_voc (gluoncv/model_zoo/ssd/presets.py)
FILTERS = (512, 512, 256, 256)
SIZES = (51.2, 102.4, 189.4, 276.4, 363.52, 450.6, 492)
RATIOS = ((1, 2, 0.5),) + ((1, 2, 0.5, 3, 1.0 / 3),) * 3 + ((1, 2, 0.5),) * 2
STEPS_PX = (16, 32, 64, 128, 256, 512)
NMS_THRESH, NMS_TOPK, POST_NMS, SCORE_THRESH = 0.45, 400, 100, 0.01  # SSD's predict-mode defaults


@dataclass(frozen=True)
class Mode:
    label: str
    framework: str  # "dnnbind" or "torch"
    task: str       # "train" or "infer"
    kind: str       # "eager" or "hybrid" (dnnbind: net.hybridize(static_alloc=True, static_shape=True))
    amp: bool = False  # torch: autocast bf16 with channels_last


MODES = {
    "dnnbind-train": Mode("dnnbind train, eager", "dnnbind", "train", "eager"),
    "dnnbind-train-hybrid": Mode("dnnbind train, hybridize(static)", "dnnbind", "train", "hybrid"),
    "dnnbind-infer": Mode("dnnbind inference, eager", "dnnbind", "infer", "eager"),
    "dnnbind-infer-hybrid": Mode("dnnbind inference, hybridize(static)", "dnnbind", "infer", "hybrid"),
    "torch-train": Mode("PyTorch train, eager", "torch", "train", "eager"),
    "torch-train-amp": Mode("PyTorch train, AMP bf16 + ch_last", "torch", "train", "eager", True),
    "torch-infer": Mode("PyTorch inference, eager", "torch", "infer", "eager"),
    "torch-infer-amp": Mode("PyTorch inference, AMP bf16 + ch_last", "torch", "infer", "eager", True),
}


# ---- GluonCV on dnnbind -------------------------------------------------------------------------------------------

def import_gluoncv():
    """GluonCV through dnnbind's mxnet alias -> the gluoncv module, or raise ImportError saying why.

    NOTE: GluonCV 0.10's __init__ also probes torch and raises RuntimeError (not ImportError) for torch >= 2.0
    ("Legacy torch detected"), which would stop the import on any machine with a current torch. Its MXNet half never
    uses torch, so torch is hidden (sys.modules["torch"] = None: `import torch` raises ImportError) while it loads.
    """
    mx.install_mxnet_alias()
    missing = object()
    saved = sys.modules.get("torch", missing)
    sys.modules["torch"] = None
    try:
        import gluoncv
        from gluoncv import loss, model_zoo  # noqa: F401  (GluonCV swallows these errors: name the real one)
        from gluoncv.model_zoo.ssd import target  # noqa: F401
    finally:
        if saved is missing:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return gluoncv


def gluoncv_error() -> str | None:
    """None if GluonCV imports on dnnbind, else the reason (for the tests' skip and the JSON)."""
    try:
        import_gluoncv()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}" + (_gluoncv_cause() or "")


def _gluoncv_cause() -> str | None:
    """GluonCV's __init__ turns any ImportError of its MXNet half into "missing `mxnet` & `torch`": import its
    subpackages under a bare package object to name the first real error (diagnostic only; undone afterwards)."""
    import importlib
    import importlib.util
    import types
    spec = importlib.util.find_spec("gluoncv")
    if spec is None:
        return " (gluoncv is not installed)"
    saved = {k: v for k, v in sys.modules.items() if k == "gluoncv" or k.startswith("gluoncv.")}
    pkg = types.ModuleType("gluoncv")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["gluoncv"], torch_mod = pkg, sys.modules.get("torch")
    sys.modules["torch"] = None
    try:
        for sub in ("data", "model_zoo", "nn", "utils", "loss"):
            importlib.import_module(f"gluoncv.{sub}")
    except Exception as exc:  # noqa: BLE001
        return f" (first error: importing gluoncv.{sub}: {type(exc).__name__}: {exc})"
    finally:
        for k in [k for k in sys.modules if k == "gluoncv" or k.startswith("gluoncv.")]:
            del sys.modules[k]
        sys.modules.update(saved)
        if torch_mod is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = torch_mod
    return None


def build_gluoncv_ssd(gcv, ctx, seed, size):
    """GluonCV's network, initialized from `seed`, deferred shapes resolved -> (net, anchors (1, A, 4) center)."""
    import mxnet
    net = gcv.model_zoo.get_model(MODEL, pretrained_base=False)
    mxnet.random.seed(seed)
    # He-normal for the base (train_ssd.py loads ImageNet weights there; a plain Uniform(0.07) base overflows in
    # predict mode); ConvPredictor and the expander's convs keep their own Xavier initializers
    net.initialize(mxnet.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctx)
    # as train_ssd.py gets its anchors (this also resolves deferred shapes), from 2 images, not 1: the last
    # expander layer is 1x1, and dnnbind's training BatchNorm refuses 1 value per channel (MXNet returns beta)
    with mxnet.autograd.train_mode():
        _, _, anchors = net(mxnet.nd.zeros((2, 3, size, size), ctx=ctx))
    return net, anchors


def gluoncv_targets(gcv, anchors, boxes, ids):
    """SSDDefaultTrainTransform's targets, image by image on the CPU: (cls (B, A), box (B, A, 4)) numpy."""
    import mxnet
    from gluoncv.model_zoo.ssd.target import SSDTargetGenerator
    gen = SSDTargetGenerator(iou_thresh=0.5, stds=STDS, negative_mining_ratio=-1)
    a = anchors.as_in_context(mxnet.cpu())
    cls, box = [], []
    for b, i in zip(boxes, ids):
        ct, bt, _ = gen(a, None, mxnet.nd.array(b[None]), mxnet.nd.array(i[None, :, None].astype(np.float32)))
        cls.append(ct[0].asnumpy())
        box.append(bt[0].asnumpy())
    return np.stack(cls).astype(np.float32), np.stack(box).astype(np.float32)


def dnnbind_counts(net) -> dict:
    """Element counts of GluonCV's parameters: trainable, BatchNorm statistics, anchor constants."""
    counts = {"trainable": 0, "bn_stats": 0, "anchors": 0}
    for name, p in net.collect_params().items():
        n = int(np.prod(p.shape))
        key = "trainable" if p.grad_req != "null" else ("anchors" if "anchor" in name else "bn_stats")
        counts[key] += n
    return counts


def dnnbind_step(mode, gcv, ctx, data, args):
    """step(i) -> the step's per-sample loss (train) or detection scores (infer)."""
    from mxnet import autograd, gluon
    net, _ = build_gluoncv_ssd(gcv, ctx, args.seed, args.size)
    if mode.kind == "hybrid":
        net.hybridize(static_alloc=True, static_shape=True)
    x, cls_t, box_t = data["mx"]
    if mode.task == "infer":
        def infer(i):
            # Eager, GluonCV's class decoder makes F.arange(classes) on the default device: MXNet (and dnnbind)
            # refuse mixing it with the GPU's arrays unless the GPU is the default, as here. A hybridized Block
            # runs on its input's device by itself, as MXNet's bound graph does.
            with ctx:
                _, scores, _ = net(x)  # predict mode: decoded boxes after per-class NMS
            return scores
        return infer
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "wd": WD,
                                                          "momentum": MOMENTUM})
    mbox_loss = gcv.loss.SSDMultiBoxLoss()

    def train(i):  # train_ssd.py's loop body, one device
        with autograd.record():
            cls_pred, box_pred, _ = net(x)
            sum_loss, _, _ = mbox_loss([cls_pred], [box_pred], [cls_t], [box_t])  # sum, class, box
            autograd.backward(sum_loss)
        trainer.step(1)  # the loss is already normalized by the number of positives
        return sum_loss[0]
    return train


# ---- the PyTorch port -----------------------------------------------------------------------------------------------

def ssd_anchors(index: int, sizes, ratios, step, alloc: int) -> np.ndarray:
    """SSDAnchorGenerator._generate_anchors: (1, 1, alloc, alloc, depth * 4) in (cx, cy, w, h) pixels."""
    s = (sizes[0], math.sqrt(sizes[0] * sizes[1]))
    cy, cx = np.meshgrid((np.arange(alloc) + 0.5) * step, (np.arange(alloc) + 0.5) * step, indexing="ij")
    whs = [(s[0], s[0]), (s[1], s[1])] + [(s[0] * math.sqrt(r), s[0] / math.sqrt(r)) for r in ratios[1:]]
    a = np.stack([np.stack([cx, cy, np.full_like(cx, w), np.full_like(cx, h)], -1) for w, h in whs], 2)
    return a.reshape(1, 1, alloc, alloc, -1)


def anchor_alloc_sizes(n: int, first: int = 128) -> list[int]:
    """SSD.__init__: anchor maps of 128x128, then halved per layer but never under 16x16."""
    out, asz = [], first
    for _ in range(n):
        out.append(asz)
        asz = max(asz // 2, 16)
    return out


def build_torch_ssd(torch, classes: int = CLASSES):
    """The PyTorch port of ssd_512_resnet50_v1_voc (an nn.Module; parameters in GluonCV's order)."""
    nn, F = torch.nn, torch.nn.functional

    class FixGammaBN(nn.BatchNorm2d):
        """mx.sym.BatchNorm's defaults in FeatureExpander: eps 1e-3, fix_gamma=True (gamma is a parameter that the
        forward pass reads as 1; MXNet gives it a zero gradient, weight decay still moves it)."""
        def __init__(self, c):
            super().__init__(c, eps=1e-3, momentum=0.1)
            # the scale the forward reads: ones, not a parameter (weight=None with a bias fails cuDNN's backward:
            # "NativeBatchNormBackward0 returned an invalid gradient at index 2")
            self.register_buffer("unit_scale", torch.ones(c), persistent=False)

        def forward(self, x):
            return F.batch_norm(x, self.running_mean, self.running_var, self.unit_scale, self.bias,
                                self.training, self.momentum, self.eps)

    class Bottleneck(nn.Module):  # gluoncv/model_zoo/resnet.py BottleneckV1
        def __init__(self, cin, cout, stride):
            super().__init__()
            mid = cout // 4
            self.conv1 = nn.Conv2d(cin, mid, 1, stride)  # the stride is here, with a bias (Gluon's default)
            self.bn1 = nn.BatchNorm2d(mid)
            self.conv2 = nn.Conv2d(mid, mid, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(mid)
            self.conv3 = nn.Conv2d(mid, cout, 1)
            self.bn3 = nn.BatchNorm2d(cout)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if cin != cout else None)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return F.relu(y + (self.downsample(x) if self.downsample is not None else x))

    class TorchSSD(nn.Module):
        def __init__(self):
            super().__init__()
            # resnet50_v1 up to stage4 (its pooling and classifier are not in SSD's FeatureExpander)
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            stages, cin = [], 64
            for i, (n, c) in enumerate(zip((3, 4, 6, 3), (256, 512, 1024, 2048))):
                blocks = [Bottleneck(cin, c, 1 if i == 0 else 2)] + [Bottleneck(c, c, 1) for _ in range(n - 1)]
                stages.append(nn.Sequential(*blocks))
                cin = c
            self.stage1, self.stage2, self.stage3, self.stage4 = stages
            # FeatureExpander: 1x1 transition (max(min_depth 128, f) channels) and a 3x3 stride-2 conv per filter
            expand, cin = [], 2048
            for f in FILTERS:
                expand.append(nn.Sequential(nn.Conv2d(cin, f, 1, bias=False), FixGammaBN(f), nn.ReLU(),
                                            nn.Conv2d(f, f, 3, 2, 1, bias=False), FixGammaBN(f), nn.ReLU()))
                cin = f
            self.expand = nn.ModuleList(expand)
            depths = [2 + len(r) - 1 for r in RATIOS]  # SSDAnchorGenerator.num_depth
            chans = (1024, 2048) + FILTERS
            self.class_predictors = nn.ModuleList(nn.Conv2d(c, d * (classes + 1), 3, 1, 1) for c, d in zip(chans, depths))
            self.box_predictors = nn.ModuleList(nn.Conv2d(c, d * 4, 3, 1, 1) for c, d in zip(chans, depths))
            sizes = list(itertools.pairwise(SIZES))
            for i, (s, r, st, alloc) in enumerate(zip(sizes, RATIOS, STEPS_PX, anchor_alloc_sizes(len(RATIOS)))):
                # (alloc, alloc, depth * 4): 3-D, so .to(memory_format=channels_last) leaves it alone (it refuses 5-D)
                self.register_buffer(f"anchor_{i}", torch.from_numpy(ssd_anchors(i, s, r, st, alloc)[0, 0]).float())
            self.classes = classes

        def features(self, x):
            x = self.stage2(self.stage1(self.stem(x)))
            c3 = self.stage3(x)  # stage3_activation5
            y = self.stage4(c3)  # stage4_activation2
            out = [c3, y]
            for block in self.expand:
                y = block(y)
                out.append(y)
            return out

        def forward(self, x):
            """-> (cls_preds (B, A, classes + 1), box_preds (B, A, 4), anchors (1, A, 4)): SSD's training outputs."""
            feats = self.features(x)
            flat = lambda t: t.permute(0, 2, 3, 1).flatten(1)
            cls = torch.cat([flat(p(f)) for f, p in zip(feats, self.class_predictors)], 1)
            box = torch.cat([flat(p(f)) for f, p in zip(feats, self.box_predictors)], 1)
            anchors = torch.cat([getattr(self, f"anchor_{i}")[:f.shape[2], :f.shape[3]].reshape(1, -1)
                                 for i, f in enumerate(feats)], 1)
            return (cls.reshape(x.shape[0], -1, self.classes + 1), box.reshape(x.shape[0], -1, 4),
                    anchors.reshape(1, -1, 4))

        def detect(self, x):
            """SSD's predict mode -> (ids, scores, bboxes), each (B, POST_NMS, .)."""
            cls, box, anchors = self(x)
            bboxes = decode_boxes(torch, box.float(), anchors)
            scores = torch.softmax(cls.float(), -1)[..., 1:]                     # MultiPerClassDecoder
            mask = scores > SCORE_THRESH
            ids = torch.arange(self.classes, device=x.device, dtype=scores.dtype).expand_as(scores)
            ids, scores = torch.where(mask, ids, -1.0), torch.where(mask, scores, 0.0)
            b, n, c = scores.shape  # per-class rows, class-major as SSD concatenates them: (B, C * A, 6)
            result = torch.cat([ids.transpose(1, 2).reshape(b, c * n, 1), scores.transpose(1, 2).reshape(b, c * n, 1),
                                bboxes.unsqueeze(1).expand(b, c, n, 4).reshape(b, c * n, 4)], -1)
            result = box_nms(torch, result)
            return result[..., 0:1], result[..., 1:2], result[..., 2:6]

    return TorchSSD()


def decode_boxes(torch, box, anchors):
    """NormalizedBoxCenterDecoder (center anchors, no clip) -> corner boxes."""
    ax, ay, aw, ah = anchors.unbind(-1)
    ox, oy = box[..., 0] * STDS[0] * aw + ax, box[..., 1] * STDS[1] * ah + ay
    ow, oh = torch.exp(box[..., 2] * STDS[2]) * aw / 2, torch.exp(box[..., 3] * STDS[3]) * ah / 2
    return torch.stack([ox - ow, oy - oh, ox + ow, oy + oh], -1)


def box_nms(torch, result):
    """contrib.box_nms(overlap_thresh 0.45, topk 400, valid_thresh 0.01, id_index 0, force_suppress False), then the
    first POST_NMS rows: valid rows by score, the NMS_TOPK best kept for suppression within their class, survivors
    first in score order, the rest -1. Greedy NMS is computed as Cluster-NMS (Zheng et al., 2020: iterate
    keep = valid & no kept higher-scored box of its class overlaps it, to a fixed point): the same boxes survive."""
    score = result[..., 1]
    k = min(NMS_TOPK, score.shape[1])
    top, idx = torch.where(score > SCORE_THRESH, score, -1.0).topk(k, dim=1)
    cand = result.gather(1, idx.unsqueeze(-1).expand(-1, -1, 6))
    valid = top > SCORE_THRESH
    x1, y1, x2, y2 = cand[..., 2:6].unbind(-1)
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    iw = (torch.minimum(x2[:, :, None], x2[:, None]) - torch.maximum(x1[:, :, None], x1[:, None])).clamp(min=0)
    ih = (torch.minimum(y2[:, :, None], y2[:, None]) - torch.maximum(y1[:, :, None], y1[:, None])).clamp(min=0)
    inter = iw * ih
    iou = inter / (area[:, :, None] + area[:, None] - inter).clamp(min=1e-12)
    earlier = torch.ones(k, k, dtype=torch.bool, device=result.device).triu(1)  # [i, j]: i scores above j
    suppress = (iou > NMS_THRESH) & earlier & (cand[..., 0][:, :, None] == cand[..., 0][:, None])
    suppress &= valid[:, :, None] & valid[:, None]
    keep = valid
    for _ in range(k):
        new = valid & ~(suppress & keep[:, :, None]).any(1)
        if torch.equal(new, keep):
            break
        keep = new
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # survivors first, in score order
    out = torch.where(keep.unsqueeze(-1), cand, torch.full_like(cand, -1.0)).gather(
        1, order.unsqueeze(-1).expand(-1, -1, 6))
    return out[:, :POST_NMS]


def ssd_loss(torch, cls_pred, box_pred, cls_t, box_t, ratio=3.0, rho=1.0, lambd=1.0):
    """SSDMultiBoxLoss (min_hard_negatives 0) for one device -> the per-sample sum loss (B,)."""
    pos = cls_t > 0
    num_pos = pos.sum().clamp(min=1).float()  # max(1, positives over the whole batch)
    cls_loss = -torch.log_softmax(cls_pred, -1).gather(-1, cls_t.long().unsqueeze(-1)).squeeze(-1)
    rank = (cls_loss * (pos.float() - 1)).argsort(1).argsort(1)  # hardest negatives first, positives last
    hard_negative = rank < (pos.sum(1) * ratio).unsqueeze(-1)
    cls_loss = torch.where(pos | hard_negative, cls_loss, torch.zeros_like(cls_loss)).sum(1) / num_pos
    diff = (box_pred - box_t).abs()
    box_loss = torch.where(diff > rho, diff - 0.5 * rho, (0.5 / rho) * diff * diff) * pos.unsqueeze(-1)
    return cls_loss + lambd * box_loss.sum((1, 2)) / num_pos


def torch_counts(tnet) -> dict:
    return {"trainable": sum(p.numel() for p in tnet.parameters()),
            "bn_stats": sum(b.numel() for n, b in tnet.named_buffers() if n.endswith(("running_mean", "running_var"))),
            "anchors": sum(b.numel() for n, b in tnet.named_buffers() if "anchor" in n)}


def set_torch_math(torch, math_mode: str) -> None:
    tf32 = math_mode != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def torch_step(mode, torch, tnet0, data, args, dev):
    set_torch_math(torch, args.math)  # AMP's float32 leftovers in the same math as the plain mode
    fmt = torch.channels_last if mode.amp else torch.contiguous_format
    tnet = copy.deepcopy(tnet0).to(dev, memory_format=fmt)
    x, cls_t, box_t = data["torch"]
    x = x.contiguous(memory_format=fmt)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if mode.amp else contextlib.nullcontext
    if mode.task == "infer":
        tnet.eval()

        def infer(i):
            with torch.no_grad(), autocast():
                return tnet.detect(x)[1]
        return infer
    tnet.train()
    # Gluon's SGD applies weight decay to every parameter, as torch's does; momentum 0.9: the same update
    opt = torch.optim.SGD([p for p in tnet.parameters() if p.requires_grad], lr=args.lr, momentum=MOMENTUM,
                          weight_decay=WD)

    def train(i):
        opt.zero_grad(set_to_none=True)
        with autocast():
            cls_pred, box_pred, _ = tnet(x)
        sum_loss = ssd_loss(torch, cls_pred.float(), box_pred.float(), cls_t, box_t)
        sum_loss.sum().backward()  # autograd.backward(sum_loss): a head gradient of ones per sample
        opt.step()
        return sum_loss
    return train


# ---- targets without GluonCV (a torch-only run) and the weight copy ------------------------------------------------

def numpy_targets(anchors, boxes, ids, iou_thresh=0.5):
    """SSDTargetGenerator(negative_mining_ratio=-1) in numpy, for runs without GluonCV: bipartite matching
    (share_max=False), then maximum matching at iou_thresh; class targets id + 1 or 0, NormalizedBoxCenterEncoder."""
    a = np.concatenate([anchors[:, :2] - anchors[:, 2:] / 2, anchors[:, :2] + anchors[:, 2:] / 2], 1)
    cls_out, box_out = [], []
    for g, gid in zip(boxes, ids):
        lt, rb = np.maximum(a[:, None, :2], g[None, :, :2]), np.minimum(a[:, None, 2:], g[None, :, 2:])
        inter = np.prod(np.clip(rb - lt, 0, None), -1)
        area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
        iou = inter / (area(a)[:, None] + area(g)[None] - inter)
        match = np.full(len(a), -1)
        rows, cols = np.zeros(len(a), bool), np.zeros(len(g), bool)
        for flat in np.argsort(-iou, axis=None, kind="stable"):
            r, c = divmod(int(flat), len(g))
            if iou[r, c] <= 1e-12 or cols.all():
                break
            if not rows[r] and not cols[c]:
                match[r], rows[r], cols[c] = c, True, True
        best, best_iou, col_max = iou.argmax(1), iou.max(1), iou.max(0)
        match = np.where(match < 0, np.where(best_iou + 1e-12 >= col_max[best], best, -1), match)
        match = np.where(match >= 0, match, np.where(best_iou >= iou_thresh, best, -1))
        pos = match >= 0
        m = g[np.maximum(match, 0)]
        gc_, gs = (m[:, :2] + m[:, 2:]) / 2, m[:, 2:] - m[:, :2]
        ac, as_ = (a[:, :2] + a[:, 2:]) / 2, a[:, 2:] - a[:, :2]
        t = np.concatenate([(gc_ - ac) / as_ / STDS[:2], np.log(gs / as_) / STDS[2:]], 1)
        cls_out.append(np.where(pos, gid[np.maximum(match, 0)] + 1, 0))
        box_out.append(np.where(pos[:, None], t, 0))
    return np.stack(cls_out).astype(np.float32), np.stack(box_out).astype(np.float32)


def copy_weights(net, tnet, torch) -> int:
    """GluonCV's parameters into the port, pairing them in order (trainable, then BatchNorm statistics) and checking
    every shape -> the number of arrays copied. Raises ValueError on the first mismatch."""
    params = list(net.collect_params().items())
    mine = [p for _, p in params if p.grad_req != "null"]
    stats = [p for n, p in params if p.grad_req == "null" and "anchor" not in n]
    theirs = list(tnet.parameters())
    tstats = [b for n, b in tnet.named_buffers() if n.endswith(("running_mean", "running_var"))]
    if len(mine) != len(theirs) or len(stats) != len(tstats):
        raise ValueError(f"{len(mine)}+{len(stats)} GluonCV arrays vs {len(theirs)}+{len(tstats)} in the port")
    for (src, dst) in list(zip(mine, theirs)) + list(zip(stats, tstats)):
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"{src.name} {tuple(src.shape)} pairs with a port array of {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(torch.from_numpy(src.data().asnumpy()))
    return len(mine) + len(stats)


def weights_check(gcv, net, tnet, torch, data, ctx) -> dict:
    """Strict FP32, training mode (batch statistics): both networks' raw outputs and first loss on the batch."""
    import mxnet
    mx.set_math_mode("fp32")
    set_torch_math(torch, "fp32")
    x, cls_t, box_t = data["mx"]
    with mxnet.autograd.train_mode():
        cp, bp, anc = net(x)
        loss = gcv.loss.SSDMultiBoxLoss()([cp], [bp], [cls_t], [box_t])[0][0]
    t = copy.deepcopy(tnet).train().to(data["torch"][0].device)
    with torch.no_grad():
        tcp, tbp, tanc = t(data["torch"][0])
        tloss = ssd_loss(torch, tcp, tbp, data["torch"][1], data["torch"][2])
    rel = lambda a, b: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    return {"cls_max_rel_diff": rel(cp.asnumpy(), tcp.cpu().numpy()),
            "box_max_rel_diff": rel(bp.asnumpy(), tbp.cpu().numpy()),
            "anchors_max_abs_diff": float(np.abs(anc.asnumpy() - tanc.cpu().numpy()).max()),
            "loss_dnnbind": float(loss.asnumpy().mean()), "loss_torch": float(tloss.mean())}


# ---- driver ---------------------------------------------------------------------------------------------------------

def run_mode(key, ctx, torch, gcv, tnet0, data, args) -> dict:
    mode = MODES[key]
    if mode.framework == "torch" and torch is None:
        return {"status": "skipped", "reason": "torch is not installed"}
    if mode.framework == "torch" and tnet0 is None:
        return {"status": "skipped", "reason": "no targets for the port (see targets_note)"}
    if mode.framework == "dnnbind" and gcv is None:
        return {"status": "skipped", "reason": f"GluonCV does not import on dnnbind: {args.gluoncv_error}"}
    if not ctx.is_gpu and mode.amp:
        return {"status": "skipped", "reason": "needs a GPU"}
    clock, memory = clock_for(mode.framework, ctx, torch), memory_for(mode.framework, ctx, torch)
    step = None
    try:
        clock.sync()
        guarded(memory.reset, [])
        t0 = time.perf_counter()
        if mode.framework == "dnnbind":
            mx.set_math_mode(args.math)
            step = dnnbind_step(mode, gcv, ctx, data, args)
        else:
            step = torch_step(mode, torch, tnet0, data, args, "cuda" if ctx.is_gpu else "cpu")
        clock.sync()
        setup = time.perf_counter() - t0
        return {"status": "ok", "setup_s": setup, **measure(step, clock, memory, args, None, mode.label)}
    except Exception as exc:  # noqa: BLE001  (a mode's failure is a result)
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}".strip(),
                "traceback": traceback.format_exc(limit=-8)}
    finally:  # free this mode's model before the next one
        step = None
        gc.collect()
        with contextlib.suppress(Exception):
            clock.sync()
        if torch is not None and mode.framework == "torch" and ctx.is_gpu:
            torch.cuda.empty_cache()


def make_batch(args):
    """One fixed synthetic batch: normalized pixels, NBOX boxes (corner pixels, 32-320 px a side) and class ids."""
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32)
    wh = rng.uniform(32, min(320, args.size), (args.batch, NBOX, 2))
    xy = rng.uniform(0, 1, (args.batch, NBOX, 2)) * (args.size - wh)
    boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
    ids = rng.integers(0, CLASSES, (args.batch, NBOX)).astype(np.float32)
    return x, boxes, ids


def add_ratios(results: dict) -> None:
    ok = {k: r for k, r in results.items() if r.get("status") == "ok"}
    for k, r in ok.items():
        task = MODES[k].task
        same = ok.get(f"torch-{task}")  # the torch mode of this task in the same math (--math)
        best = min((q["ms"] for j, q in ok.items() if MODES[j].framework == "torch" and MODES[j].task == task),
                   default=None)
        r["vs_torch_same_math"] = r["ms"] / same["ms"] if same else None
        r["vs_torch_best"] = r["ms"] / best if best else None


def print_table(results: dict, title: str, math_mode: str) -> None:
    x = lambda v: f"{v:.2f}x" if v else "-"
    print(f"\n{title}")
    print(f"{'mode':<40}{'ms/step':>9}{'p10-p90':>18}{'images/s':>10}{'peak MiB':>10}{'vs torch ' + math_mode:>14}"
          f"{'vs best':>9}")
    for k, r in results.items():
        if r.get("status") != "ok":
            print(f"{MODES[k].label:<40}  {r['status']}: {r.get('reason', '')[:150]}")
            continue
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"
        spread = f"{r['ms_p10']:.2f}-{r['ms_p90']:.2f}"
        print(f"{MODES[k].label:<40}{r['ms']:>9.2f}{spread:>18}{r['images_per_s']:>10,.1f}{peak:>10}"
              f"{x(r['vs_torch_same_math']):>14}{x(r['vs_torch_best']):>9}")
    print(f"ratios: ms/step over PyTorch eager in {math_mode} (the dnnbind modes' math) and over PyTorch's fastest "
          "mode, each of the same task (train or inference); below 1 is faster")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: a smoke run on the host (dnnbind's numpy backend; timings meaningless)")
    p.add_argument("--batch", type=int, default=BATCH, help="images per step (GluonCV: 8 per GPU)")
    p.add_argument("--size", type=int, default=SIZE, help="input side (SSD-512: 512)")
    p.add_argument("--math", choices=("tf32", "fp32"), default="tf32",
                   help="both frameworks' float32 math (dnnbind.set_math_mode; torch allow_tf32)")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=None, help=f"untimed steps per mode (default {WARMUP}; cpu: 1)")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), metavar="MODE",
                   help=f"modes to run, in this order (default: all): {' '.join(MODES)}")
    p.add_argument("--json", default="runs/bench_ssd.json")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.warmup = max(args.warmup if args.warmup is not None else (WARMUP if args.device == "gpu" else 1), 1)
    args.steps = max(args.steps, 1)
    if args.device == "gpu" and mx.num_gpus() == 0:
        raise SystemExit(f"bench_ssd.py needs a GPU (or --device cpu): {mx.runtime.gpu_status()[1]}")
    args.gluoncv_error = gluoncv_error()
    gcv = import_gluoncv() if args.gluoncv_error is None else None
    try:
        import torch
    except ImportError:
        torch = None
    import bench  # scripts/bench.py: versions and GPU
    ctx = mx.gpu(0) if args.device == "gpu" else mx.cpu()
    env = bench.environment(torch)
    out = {"model": MODEL, "input": [3, args.size, args.size], "classes": CLASSES, "batch": args.batch,
           "boxes_per_image": NBOX, "math": args.math, "lr": args.lr, "momentum": MOMENTUM, "wd": WD,
           "warmup_steps": args.warmup, "timed_steps": args.steps, "device": args.device,
           "gluoncv": getattr(gcv, "__version__", None), "gluoncv_error": args.gluoncv_error, **env, "runs": {}}
    if torch is not None:
        torch.manual_seed(args.seed)
        torch.backends.cudnn.benchmark = True
        out["torch_gpu"] = torch.cuda.get_device_name(0) if ctx.is_gpu else None
    x, boxes, ids = make_batch(args)
    tnet0 = build_torch_ssd(torch) if torch is not None else None
    counts = {"torch": torch_counts(tnet0) if tnet0 is not None else None, "dnnbind": None}
    anchors = None
    if tnet0 is not None:
        with torch.no_grad():  # predict mode: batch statistics of one image's 1x1 map are refused in training
            anchors = tnet0.eval()(torch.zeros(1, 3, args.size, args.size))[2][0].numpy()
    cls_t = box_t = net = None
    if gcv is not None:  # GluonCV's anchors and targets; the weights the port starts from
        net, g_anchors = build_gluoncv_ssd(gcv, ctx, args.seed, args.size)
        counts["dnnbind"] = dnnbind_counts(net)
        try:
            cls_t, box_t = gluoncv_targets(gcv, g_anchors, boxes, ids)
            out["targets"] = "gluoncv SSDTargetGenerator"
        except Exception as exc:  # noqa: BLE001
            out["targets_note"] = f"SSDTargetGenerator failed on dnnbind ({type(exc).__name__}: {exc}): numpy port"
        g_anchors = g_anchors.asnumpy()[0]
        if anchors is not None:
            out["anchors_max_abs_diff"] = float(np.abs(anchors - g_anchors).max())
        anchors = g_anchors
        if tnet0 is not None:
            try:
                out["copied_arrays"] = copy_weights(net, tnet0, torch)
            except Exception as exc:  # noqa: BLE001
                out["copy_error"] = f"{type(exc).__name__}: {exc}"
                print(f"weights not copied into the port: {out['copy_error']}", flush=True)
    if anchors is not None:
        n_cls, n_box = numpy_targets(anchors, boxes, ids)
        if cls_t is None:
            cls_t, box_t = n_cls, n_box
            out.setdefault("targets", "numpy port of SSDTargetGenerator")
        else:  # the port of the target generator against GluonCV's own
            out["numpy_targets_agree"] = {"cls": float((n_cls == cls_t).mean()),
                                          "box_max_abs_diff": float(np.abs(n_box - box_t).max())}
        out["positives_per_image"] = float((cls_t > 0).sum() / args.batch)
    print(f"parameters (elements): {json.dumps(counts)}", flush=True)
    out["parameter_counts"] = counts
    if counts["torch"] and counts["dnnbind"] and counts["torch"] != counts["dnnbind"]:
        print("WARNING: the port's parameter counts differ from GluonCV's", flush=True)
    data = {}
    if gcv is not None and cls_t is not None:
        data["mx"] = (mx.array(x, device=ctx), mx.array(cls_t, device=ctx), mx.array(box_t, device=ctx))
    if torch is not None and cls_t is not None:
        dev = "cuda" if ctx.is_gpu else "cpu"
        data["torch"] = tuple(torch.from_numpy(a).to(dev) for a in (x, cls_t, box_t))
    if "copied_arrays" in out and "mx" in data:
        try:
            out["weights_check"] = weights_check(gcv, net, tnet0, torch, data, ctx)
        except Exception as exc:  # noqa: BLE001
            out["weights_check"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{out['copied_arrays']} arrays copied into the port; weights check: {out['weights_check']}",
              flush=True)
    net = None  # the reference network: device memory every mode would count
    gc.collect()
    if cls_t is None:
        tnet0 = None
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    for k in args.modes:
        print(f"{MODES[k].label} ...", end=" ", flush=True)
        r = out["runs"][k] = run_mode(k, ctx, torch, gcv, tnet0, data, args)
        print(f"{r['ms']:.2f} ms/step, setup {r['setup_s']:.1f} s, warm-up {r['warmup_s']:.1f} s, first "
              f"{r['first_loss']:.6g} last {r['final_loss']:.6g}" if r["status"] == "ok"
              else f"{r['status']}: {r.get('reason', '')}", flush=True)
        if r["status"] == "failed":
            print(r["traceback"], flush=True)
        save_json(args.json, out)  # after every mode: a run cut short still leaves its numbers
    mx.set_math_mode("fp32")
    add_ratios(out["runs"])
    gpu = (env["gpu"].get("devices") or [{}])[0].get("name", "cpu") if ctx.is_gpu else "cpu"
    print_table(out["runs"], f"{MODEL}, 3x{args.size}x{args.size}, batch {args.batch}, {args.math}, SGD lr {args.lr} "
                             f"momentum {MOMENTUM} wd {WD}, median of {args.steps} steps after {args.warmup}; {gpu}",
                args.math)
    save_json(args.json, out)
    print(f"\nwrote {args.json}")
    return out


if __name__ == "__main__":
    main()
