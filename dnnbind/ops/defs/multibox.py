"""MXNet's SSD operators (src/operator/contrib/multibox_{prior,target,detection}.cc): ``_contrib_MultiBoxPrior``,
``_contrib_MultiBoxTarget``, ``_contrib_MultiBoxDetection``, with MXNet 1.9.1's CPU results (quirks listed in
ops/reference/multibox.py).

- MultiBoxPrior: data (N, C, H, W) -> (1, H*W*(len(sizes)+len(ratios)-1), 4) corner anchors; only the shape of
  data is read. gpu: the anchors depend on the shape and parameters only, so the twin's anchors are uploaded once
  per (shape, parameters, dtype, device) and cached (a constant, like sequence.py's index arrays); each call
  returns a copy (MXNet's output is its own array).
- MultiBoxTarget: (anchor (1, A, 4), label (B, L, >=5), cls_pred (B, classes, A)) -> (loc_target (B, A*4),
  loc_mask (B, A*4), cls_target (B, A)). gpu: one NVRTC launch, one block per batch (ops/_box_kernels.py).
- MultiBoxDetection: (cls_prob (B, classes, A), loc_pred (B, A*4), anchor (1, A, 4)) -> (B, A, 6). gpu: one NVRTC
  launch, one block per batch.

No gradients: MXNet's backwards of these write zeros into every input, and nothing trains through them (the SSD
losses take the targets as labels), so the entries have no backward and every input is ``nograd``.
On the GPU a value-dependent failure MXNet reports (a malformed padding label row, too few negatives to mine)
cannot be reported without reading values back: the kernel goes on (the row ends the labels; every candidate
becomes a negative). The cpu twin refuses both.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import array, empty
from ...runtime.stream import current_stream
from .. import _box_kernels as K
from ..opdef import Lowering, OpDef, define
from ..reference import multibox as ref

_GPU_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _float(op: str, arrays: dict, shapes: str) -> None:
    for name, a in arrays.items():
        if a.dtype.kind != "f":
            raise DnnbindTypeError(f"{op}: {name} must be a floating-point array, got {a.dtype} ({shapes})")
        if a.device.kind == "gpu" and a.dtype not in _GPU_TYPES:
            raise DnnbindTypeError(f"{op}: the GPU lowering takes float32 or float64, got {name} {a.dtype} "
                                   f"({shapes}); cast it, or run on the cpu")


def _variances(op: str, p, shapes: str) -> tuple:
    v = tuple(p["variances"])
    if len(v) != 4:
        raise DnnbindValueError(f"{op}: variances must hold 4 values (x, y, w, h), got {v} ({shapes})")
    return v


# -- MultiBoxPrior -------------------------------------------------------------------------------------------------

def _prior_params(op: str, p, shape) -> tuple:
    sizes, ratios, steps, offsets = (tuple(p[k]) for k in ("sizes", "ratios", "steps", "offsets"))
    where = f"data {tuple(shape)}"
    if len(shape) < 4 or shape[2] <= 0 or shape[3] <= 0:
        raise DnnbindValueError(f"{op}: data must be (batch, channel, height, width) with height and width > 0, got "
                                f"{where}")
    if not sizes or not ratios:
        raise DnnbindValueError(f"{op}: sizes and ratios must each hold at least one value, got sizes {sizes}, "
                                f"ratios {ratios} ({where})")
    if len(steps) != 2 or len(offsets) != 2:
        raise DnnbindValueError(f"{op}: steps and offsets must be (y, x) pairs, got steps {steps}, offsets "
                                f"{offsets} ({where})")
    if steps[0] * steps[1] < 0:
        raise DnnbindValueError(f"{op}: give both steps or neither (MXNet: must specify both step_y and step_x), "
                                f"got {steps} ({where})")
    if not all(0 <= o <= 1 for o in offsets):
        raise DnnbindValueError(f"{op}: offsets must be in [0, 1], got {offsets} ({where})")
    return shape[2], shape[3], sizes, ratios, steps, offsets, bool(p["clip"])


def _prepare_prior(p, data):
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"MultiBoxPrior: data must be a floating-point array, got {data.dtype} (data "
                               f"{data.shape})")
    return _prior_params("MultiBoxPrior", p, data.shape)


def _infer_prior(p, shapes):
    d = tuple(shapes[0])
    h, w, sizes, ratios = _prior_params("MultiBoxPrior", p, d)[:4]
    return [d], [(1, h * w * (len(sizes) + len(ratios) - 1), 4)]


def _cpu_prior_forward(c, data):
    return ref.multibox_prior(*c.geo, data.dtype), None


_PRIORS: dict = {}


def _gpu_prior_forward(c, data):
    key = (c.geo, data.dtype, data.device)
    a = _PRIORS.get(key)
    if a is None:  # a constant of the shape and parameters: computed and uploaded once (never trimmed, as sequence)
        a = _PRIORS[key] = array(ref.multibox_prior(*c.geo, data.dtype), device=data.device)
    return a.copy(), None


def _prior_samples(rng):
    yield {"data": rng.standard_normal((1, 2, 3, 4))}, {}
    yield {"data": rng.standard_normal((2, 1, 4, 4))}, {"sizes": (0.5, 0.25, 0.1), "ratios": (1, 2, 0.5),
                                                        "clip": True}
    yield {"data": rng.standard_normal((1, 1, 2, 3))}, {"sizes": (0.3,), "steps": (0.4, 0.25),
                                                        "offsets": (0.2, 0.7)}


# -- MultiBoxDetection ---------------------------------------------------------------------------------------------

def _prepare_detect(p, cls_prob, loc_pred, anchor):
    op = "MultiBoxDetection"
    shapes = f"cls_prob {cls_prob.shape}, loc_pred {loc_pred.shape}, anchor {anchor.shape}"
    _float(op, {"cls_prob": cls_prob, "loc_pred": loc_pred, "anchor": anchor}, shapes)
    if cls_prob.ndim != 3 or loc_pred.ndim != 2 or anchor.ndim != 3:
        raise DnnbindValueError(f"{op}: cls_prob must be (B, classes, A), loc_pred (B, A*4) and anchor (1, A, 4), "
                                f"got {shapes}")
    b, _, na = cls_prob.shape
    if anchor.shape[1] != na or anchor.shape[2] != 4 or na == 0:
        raise DnnbindValueError(f"{op}: anchor must be (1, A = {na}, 4) as cls_prob's A > 0 anchors, got {shapes}")
    if loc_pred.shape != (b, na * 4):
        raise DnnbindValueError(f"{op}: loc_pred must be (B, A*4) = ({b}, {na * 4}), got {shapes}")
    _variances(op, p, shapes)
    return b, cls_prob.shape[1], na


def _infer_detect(p, shapes):
    c = tuple(shapes[0])
    return [c, (c[0], c[2] * 4), (1, c[2], 4)], [(c[0], c[2], 6)]


def _detect_args(p):
    return dict(clip=p["clip"], threshold=p["threshold"], background_id=p["background_id"],
                nms_threshold=p["nms_threshold"], force_suppress=p["force_suppress"], variances=tuple(p["variances"]),
                nms_topk=p["nms_topk"])


def _cpu_detect_forward(c, cls_prob, loc_pred, anchor):
    return ref.multibox_detection(cls_prob, loc_pred, anchor, **_detect_args(c.p)), None


def _gpu_detect_forward(c, cls_prob, loc_pred, anchor):
    b, nc, na = c.geo
    p, dt = c.p, cls_prob.dtype
    t = dt.type
    out = empty((b, na, 6), dt, cls_prob.device)
    if b == 0:
        return out, None
    rows = empty((b, na, 6), dt, cls_prob.device)
    order = empty((b * na,), np.int32, cls_prob.device)
    pos = empty((b * na,), np.int32, cls_prob.device)
    nms = np.float32(p["nms_threshold"])
    v = [t(np.float32(x)) for x in p["variances"]]
    K.kernel("dn_mbox_detect", dt).launch(
        b, K.BLOCK, (cls_prob, loc_pred, anchor, out, rows, order, pos, np.int32(nc), np.int32(na),
                     np.int32(bool(p["clip"])), t(np.float32(p["threshold"])), t(nms), np.int32(0 < nms <= 1),
                     np.int32(bool(p["force_suppress"])), *v, np.int32(p["nms_topk"])),
        stream=current_stream(cls_prob.device))
    return out, None


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _anchors(rng, na):
    lo = rng.uniform(0, 0.7, (1, na, 2))
    return np.concatenate([lo, lo + rng.uniform(0.15, 0.3, (1, na, 2))], axis=-1)


def _detect_samples(rng):
    yield ({"cls_prob": _softmax(rng.standard_normal((2, 3, 6)) * 2, 1), "loc_pred": rng.standard_normal((2, 24)) * 0.3,
            "anchor": _anchors(rng, 6)}, {})
    yield ({"cls_prob": _softmax(rng.standard_normal((1, 4, 8)) * 2, 1), "loc_pred": rng.standard_normal((1, 32)) * 0.3,
            "anchor": _anchors(rng, 8)}, {"nms_topk": 3, "force_suppress": True, "threshold": 0.2, "clip": False})


# -- MultiBoxTarget ------------------------------------------------------------------------------------------------

def _prepare_target(p, anchor, label, cls_pred):
    op = "MultiBoxTarget"
    shapes = f"anchor {anchor.shape}, label {label.shape}, cls_pred {cls_pred.shape}"
    _float(op, {"anchor": anchor, "label": label, "cls_pred": cls_pred}, shapes)
    if anchor.ndim != 3 or anchor.shape[0] != 1 or anchor.shape[2] != 4 or anchor.shape[1] == 0:
        raise DnnbindValueError(f"{op}: anchor must be (1, A, 4) with A > 0 (anchors shared by the batch), got "
                                f"{shapes}")
    if label.ndim != 3 or label.shape[1] == 0 or label.shape[2] < 5:
        raise DnnbindValueError(f"{op}: label must be (B, L, width) with L > 0 and width >= 5 ([class, xmin, ymin, "
                                f"xmax, ymax, ...]), got {shapes}")
    if cls_pred.ndim != 3 or cls_pred.shape[2] != anchor.shape[1] or cls_pred.shape[0] != label.shape[0]:
        raise DnnbindValueError(f"{op}: cls_pred must be (B = {label.shape[0]}, classes, A = {anchor.shape[1]}), "
                                f"got {shapes}")
    _variances(op, p, shapes)
    if p["negative_mining_ratio"] > 0 and p["negative_mining_thresh"] <= 0:
        raise DnnbindValueError(f"{op}: negative mining needs negative_mining_thresh > 0, got "
                                f"{p['negative_mining_thresh']} ({shapes})")
    return label.shape[0], anchor.shape[1], label.shape[1], label.shape[2], cls_pred.shape[1], shapes


def _infer_target(p, shapes):
    a, lab = tuple(shapes[0]), tuple(shapes[1])
    na = a[1]
    return [a, lab, tuple(shapes[2]) if shapes[2] else (lab[0], 0, na)], \
        [(lab[0], na * 4), (lab[0], na * 4), (lab[0], na)]


def _cpu_target_forward(c, anchor, label, cls_pred):
    p = c.p
    where = f"MultiBoxTarget ({c.geo[-1]})"
    try:
        out = ref.multibox_target(anchor, label, cls_pred, p["overlap_threshold"], p["ignore_label"],
                                  p["negative_mining_ratio"], p["negative_mining_thresh"], tuple(p["variances"]),
                                  where)
    except ValueError as e:
        raise DnnbindValueError(str(e)) from None
    return out, None


def _gpu_target_forward(c, anchor, label, cls_pred):
    b, na, nl, lw, nc, _ = c.geo
    p, dt, dev = c.p, anchor.dtype, anchor.device
    loc_t, loc_m, cls_t = empty((b, na * 4), dt, dev), empty((b, na * 4), dt, dev), empty((b, na), dt, dev)
    if b == 0:
        return (loc_t, loc_m, cls_t), None
    iou = empty((b * na * nl,), np.float32, dev)
    flags, best_gt = empty((b * na,), np.int32, dev), empty((b * na,), np.int32, dev)
    best_iou, prob = empty((b * na,), np.float32, dev), empty((b * na,), np.float32, dev)
    gt_done = empty((b * nl,), np.int32, dev)
    v = [np.float32(x) for x in p["variances"]]
    K.kernel("dn_mbox_target", dt).launch(
        b, K.BLOCK, (anchor, label, cls_pred, loc_t, loc_m, cls_t, iou, flags, best_gt, best_iou, gt_done, prob,
                     np.int32(na), np.int32(nl), np.int32(lw), np.int32(nc), np.float32(p["overlap_threshold"]),
                     dt.type(np.float32(p["ignore_label"])), np.float32(p["negative_mining_ratio"]),
                     np.float32(p["negative_mining_thresh"]), *v),
        stream=current_stream(dev))
    return (loc_t, loc_m, cls_t), None


def _target_samples(rng):
    anchor = _anchors(rng, 8)
    label = np.array([[[0, 0.1, 0.1, 0.4, 0.4], [1, 0.5, 0.5, 0.9, 0.8], [-1, -1, -1, -1, -1]],
                      [[2, 0.2, 0.3, 0.6, 0.7], [-1, -1, -1, -1, -1], [-1, -1, -1, -1, -1]]])
    yield {"anchor": anchor, "label": label, "cls_pred": rng.standard_normal((2, 3, 8))}, {}
    yield ({"anchor": anchor, "label": label, "cls_pred": rng.standard_normal((2, 3, 8))},
           {"negative_mining_ratio": 2.0, "overlap_threshold": 0.3, "ignore_label": -2.0})


_NONE = Lowering  # (no backward: see the module docstring)

define(OpDef("_contrib_MultiBoxPrior", prepare=_prepare_prior, infer=_infer_prior, samples=_prior_samples,
             nograd=("data",), cpu=_NONE(_cpu_prior_forward), gpu=_NONE(_gpu_prior_forward),
             doc="MXNet's MultiBoxPrior: SSD prior (anchor) boxes of a feature map's shape."))
define(OpDef("_contrib_MultiBoxDetection", prepare=_prepare_detect, infer=_infer_detect, samples=_detect_samples,
             nograd=("cls_prob", "loc_pred", "anchor"), cpu=_NONE(_cpu_detect_forward),
             gpu=_NONE(_gpu_detect_forward),
             doc="MXNet's MultiBoxDetection: decoded, thresholded and suppressed SSD detections, (B, A, 6)."))
define(OpDef("_contrib_MultiBoxTarget", prepare=_prepare_target, infer=_infer_target, samples=_target_samples,
             nograd=("anchor", "label", "cls_pred"), cpu=_NONE(_cpu_target_forward), gpu=_NONE(_gpu_target_forward),
             outputs=lambda p: (3, ["loc_target", "loc_mask", "cls_target"]),
             doc="MXNet's MultiBoxTarget: SSD training targets (loc_target, loc_mask, cls_target)."))
