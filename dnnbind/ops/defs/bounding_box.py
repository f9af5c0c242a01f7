"""MXNet's bounding-box operators (src/operator/contrib/bounding_box.cc): ``_contrib_box_nms`` (alias
``_contrib_box_non_maximum_suppression``), ``_contrib_box_iou``, ``_contrib_box_encode``, ``_contrib_box_decode``,
``_contrib_bipartite_matching``.

- box_nms: (..., n, width) rows [.., score, .., x4 coords, ..]; per batch the rows above ``valid_thresh`` (and not of
  ``background_id`` with an ``id_index``), best first (stable), at most ``topk``, suppressed in order where the IoU
  with a kept row of the same class (any class with ``force_suppress``) exceeds ``overlap_thresh``; the kept rows
  first, -1 after. topk = 0 returns the data as it is. MXNet's node has a hidden second output (the record of each
  output row's source, kept here for the backward): 2 outputs, ``output0`` visible. The gradient of an output row
  goes to its source row as it is (MXNet's backward, also under a format change).
- box_iou: lhs (..., 4) against rhs (..., 4) -> lhs.shape[:-1] + rhs.shape[:-1].
- box_encode: (targets, masks), MXNet's two visible outputs. box_decode: corner boxes from offsets and anchors.
- bipartite_matching: (..., R, C) scores -> (row markers, column markers); topk = k gives k + 1 matches, as MXNet.

Gradients as MXNet: box_nms's as above; box_iou, box_encode, box_decode and bipartite_matching give every input a
zero gradient (MXNet's backward writes zeros). Those zero backwards are their own defined gradient, not the
derivative of the forward, so the entries are marked ``loss`` (the registry tests then skip central differences;
tests/test_box_ops.py checks the zeros against MXNet's).

cpu: the numpy twin (ops/reference/bounding_box.py). gpu: box_iou, box_encode and box_decode are compositions of the
table's element-wise ops (``ops.opdef.table``); box_nms and bipartite_matching are one NVRTC kernel launch each
(ops/_box_kernels.py: one block per batch, the suppression sequential as MXNet's). Nothing is read back, so each
records in a hybridized Block's CUDA graph. float32 and float64 on the GPU (float16 is refused there).
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import NDArray, array, empty, full, zeros
from ...runtime.stream import current_stream
from .. import _box_kernels as K
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import bounding_box as ref

_F64 = np.dtype(np.float64)
_GPU_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _float(op: str, name: str, a, shapes: str) -> None:
    if a.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: {name} must be a floating-point array, got {a.dtype} ({shapes})")
    if a.device.kind == "gpu" and a.dtype not in _GPU_TYPES:
        raise DnnbindTypeError(f"{op}: the GPU lowering takes float32 or float64, got {name} {a.dtype} ({shapes}); "
                               f"cast it, or run on the cpu")


def _zero_grads(c, saved, grads, dy):
    """MXNet's backward of box_iou/encode/decode/bipartite_matching: zeros for every input that wants one."""
    return tuple(zeros(s, dt, dev) if need else None for need, (s, dt, dev) in zip(grads.needs, saved))


def _cpu_zero_grads(c, saved, grads, dy):
    return tuple(np.zeros(s, dt) if need else None for need, (s, dt, _) in zip(grads.needs, saved))


def _metas(*arrays):
    return tuple((a.shape, a.dtype, a.device if isinstance(a, NDArray) else None) for a in arrays)


# -- box_nms -------------------------------------------------------------------------------------------------------

class NMSGeometry:
    __slots__ = ("shape", "batches", "n", "width", "topk")


def _prepare_nms(p, data):
    op = "box_nms"
    shapes = f"data {data.shape}"
    _float(op, "data", data, shapes)
    if data.ndim < 2:
        raise DnnbindValueError(f"{op}: data must have at least 2 dims (..., num_boxes, box_width), got shape "
                                f"{data.shape}")
    w = data.shape[-1]
    need = 6 if p["id_index"] >= 0 else 5
    if w < need:
        raise DnnbindValueError(f"{op}: the last dim of data (box_width) must be at least {need} (score and 4 "
                                f"coordinates{' and a class id' if need == 6 else ''}), got {w} ({shapes})")
    cs, si, ii = p["coord_start"], p["score_index"], p["id_index"]
    if not 0 <= cs <= w - 4:
        raise DnnbindValueError(f"{op}: coord_start {cs} leaves no 4 coordinates in box_width {w} ({shapes})")
    if not 0 <= si < w or cs <= si <= cs + 3:
        raise DnnbindValueError(f"{op}: score_index {si} must be in [0, {w}) and outside the coordinates "
                                f"[{cs}, {cs + 3}] ({shapes})")
    if ii >= 0 and (ii >= w or cs <= ii <= cs + 3 or ii == si):
        raise DnnbindValueError(f"{op}: id_index {ii} must be in [0, {w}), outside the coordinates [{cs}, {cs + 3}] "
                                f"and not score_index {si} ({shapes})")
    g = NMSGeometry()
    g.shape, g.n, g.width = tuple(data.shape), data.shape[-2], w
    g.batches = math.prod(data.shape[:-2])
    g.topk = g.n if p["topk"] < 0 else min(g.n, p["topk"])
    return g


def _infer_nms(p, shapes):
    return [tuple(shapes[0])], [tuple(shapes[0])]


def _nms_args(p):
    return dict(overlap_thresh=p["overlap_thresh"], valid_thresh=p["valid_thresh"], topk=p["topk"],
                coord_start=p["coord_start"], score_index=p["score_index"], id_index=p["id_index"],
                background_id=p["background_id"], force_suppress=p["force_suppress"], in_format=p["in_format"],
                out_format=p["out_format"])


def _cpu_nms_forward(c, data):
    out, record = ref.box_nms(data, **_nms_args(c.p))
    return out, record


def _cpu_nms_backward(c, record, grads, dy):
    return (ref.box_nms_backward(dy, record),)


def _gpu_nms_forward(c, data):
    g, p = c.geo, c.p
    if data.size == 0 or g.topk < 1:  # topk 0: the data unchanged (MXNet), the gradient the identity
        return data.copy(), None
    t = data.dtype.type
    out = empty(g.shape, data.dtype, data.device)
    record = empty((g.batches * g.n,), np.int32, data.device)
    order = empty((g.batches * g.n,), np.int32, data.device)
    keep = empty((g.batches * g.n,), np.int32, data.device)
    convert = 0 if p["in_format"] == p["out_format"] else (1 if p["out_format"] == "center" else 2)
    stream = current_stream(data.device)
    K.kernel("dn_box_nms_rank", data.dtype).launch(
        ((g.n + K.RANK_TILE - 1) // K.RANK_TILE, g.batches, 1), K.RANK_TILE,
        (data, order, np.int32(g.n), np.int32(g.width), np.int32(g.topk), np.int32(p["score_index"]),
         np.int32(p["id_index"]), t(np.float32(p["valid_thresh"])), t(p["background_id"])), stream=stream)
    K.kernel("dn_box_nms", data.dtype).launch(
        g.batches, K.BLOCK,
        (data, out, record, order, keep, np.int32(g.n), np.int32(g.width), np.int32(g.topk),
         np.int32(p["score_index"]), np.int32(p["id_index"]), np.int32(p["coord_start"]),
         t(np.float32(p["valid_thresh"])), t(p["background_id"]), t(np.float32(p["overlap_thresh"])),
         np.int32(bool(p["force_suppress"])), np.int32(p["in_format"] == "center"), np.int32(convert)),
        stream=stream)
    return out, record


def _gpu_nms_backward(c, record, grads, dy):
    if record is None:
        return (dy.copy(),)
    g = c.geo
    dx = zeros(g.shape, dy.dtype, dy.device)
    rows = g.batches * g.n
    K.kernel("dn_box_nms_bwd", dy.dtype).launch(K.grid_for(rows), K.BLOCK,
                                                 (dy, record, dx, np.int32(rows), np.int32(g.width)),
                                                 stream=current_stream(dy.device))
    return (dx,)


def _nms_samples(rng):
    # well separated scores and boxes: the kept set does not change under the central differences' steps
    def boxes(n, width, ids=None):
        x = np.zeros((n, width))
        lo = rng.uniform(0, 4, (n, 2))
        x[:, 2:4], x[:, 4:6] = lo, lo + rng.uniform(1, 2, (n, 2))
        x[:, 1] = rng.permutation(n) / n + 0.05
        if ids is not None:  # mid-way between whole numbers: a finite-difference step leaves the class (trunc) alone
            x[:, 0] = ids + 0.5
        return x
    yield {"data": boxes(6, 6)[None]}, {"coord_start": 2, "score_index": 1, "overlap_thresh": 0.3}
    yield {"data": boxes(7, 6, rng.integers(0, 2, 7))}, {"coord_start": 2, "score_index": 1, "id_index": 0,
                                                          "overlap_thresh": 0.2, "valid_thresh": 0.2}
    yield {"data": np.stack([boxes(5, 6), boxes(5, 6)])}, {"coord_start": 2, "score_index": 1, "topk": 3,
                                                            "force_suppress": True, "id_index": 0}
    x = boxes(5, 7)
    x[:, [2, 3, 4, 5, 6]] = x[:, [6, 2, 3, 4, 5]]  # score at 1, coords at 3..6, an extra column at 2
    yield {"data": x[None, None]}, {"coord_start": 3, "score_index": 1, "overlap_thresh": 0.1}


# -- box_iou -------------------------------------------------------------------------------------------------------

def _prepare_iou(p, lhs, rhs):
    shapes = f"lhs {lhs.shape}, rhs {rhs.shape}"
    for name, a in (("lhs", lhs), ("rhs", rhs)):
        _float("box_iou", name, a, shapes)
        if a.ndim < 2 or a.shape[-1] != 4:
            raise DnnbindValueError(f"box_iou: {name} must be (..., 4) boxes with at least 2 dims, got {a.shape} "
                                    f"({shapes})")
    return tuple(lhs.shape[:-1]) + tuple(rhs.shape[:-1])


def _infer_iou(p, shapes):
    lhs, rhs = tuple(shapes[0]), tuple(shapes[1])
    return [lhs, rhs], [lhs[:-1] + rhs[:-1]]


def _cpu_iou_forward(c, lhs, rhs):
    return ref.box_iou(lhs, rhs, c.p["format"]), _metas(lhs, rhs)


def _columns(x: NDArray, shape: tuple) -> list:
    """The 4 coordinates of (..., 4) boxes, each as an array of ``shape`` (same size as the boxes' count)."""
    rows = view(x, (x.size // 4, 4))
    return [view(table("slice_axis", rows, axis=1, begin=i, end=i + 1), shape) for i in range(4)]


def _g_area(a0, a1, a2, a3, center: bool):
    w, h = (a2, a3) if center else (table("subtract", a2, a0), table("subtract", a3, a1))
    neg = table("logical_or", table("lesser", w, 0.0), table("lesser", h, 0.0))
    return table("where", neg, 0.0, table("multiply", w, h))


def _g_isect(a1, a2, b1, b2, center: bool):
    if center:
        aw, bw = table("divide", a2, 2.0), table("divide", b2, 2.0)
        a1, a2, b1, b2 = (table("subtract", a1, aw), table("add", a1, aw), table("subtract", b1, bw),
                          table("add", b1, bw))
    w = table("subtract", table("minimum", a2, b2), table("maximum", a1, b1))
    return table("where", table("greater", w, 0.0), w, 0.0)


def _gpu_iou_forward(c, lhs, rhs):
    center = c.p["format"] == "center"
    nl, nr = lhs.size // 4, rhs.size // 4
    a, b = _columns(lhs, (nl, 1)), _columns(rhs, (1, nr))
    inter = table("multiply", _g_isect(a[0], a[2], b[0], b[2], center), _g_isect(a[1], a[3], b[1], b[3], center))
    union = table("subtract", table("add", _g_area(*a, center), _g_area(*b, center)), inter)
    iou = table("where", table("lesser_equal", inter, 0.0), 0.0, table("divide", inter, union))
    return view(iou, c.geo), _metas(lhs, rhs)


def _iou_samples(rng):
    def boxes(*lead):
        lo = rng.uniform(0, 3, lead + (2,))
        return np.concatenate([lo, lo + rng.uniform(0.5, 2, lead + (2,))], axis=-1)
    yield {"lhs": boxes(3), "rhs": boxes(4)}, {}
    yield {"lhs": boxes(2, 3), "rhs": boxes(5)}, {"format": "center"}
    yield {"lhs": boxes(1, 2), "rhs": boxes(2, 2)}, {}


# -- box_encode ----------------------------------------------------------------------------------------------------

def _prepare_encode(p, samples, matches, anchors, refs, means, stds):
    shapes = (f"samples {samples.shape}, matches {matches.shape}, anchors {anchors.shape}, refs {refs.shape}, "
              f"means {means.shape}, stds {stds.shape}")
    for name, a in (("samples", samples), ("matches", matches), ("anchors", anchors), ("refs", refs),
                    ("means", means), ("stds", stds)):
        _float("box_encode", name, a, shapes)
    if anchors.ndim != 3 or anchors.shape[2] != 4:
        raise DnnbindValueError(f"box_encode: anchors must be (B, N, 4), got {anchors.shape} ({shapes})")
    b, n = anchors.shape[:2]
    if samples.shape != (b, n) or matches.shape != (b, n):
        raise DnnbindValueError(f"box_encode: samples and matches must be (B, N) = ({b}, {n}) as anchors, got "
                                f"{samples.shape} and {matches.shape} ({shapes})")
    if refs.ndim != 3 or refs.shape[0] != b or refs.shape[2] != 4:
        raise DnnbindValueError(f"box_encode: refs must be (B = {b}, M, 4), got {refs.shape} ({shapes})")
    if means.shape != (4,) or stds.shape != (4,):
        raise DnnbindValueError(f"box_encode: means and stds must be (4,), got {means.shape} and {stds.shape} "
                                f"({shapes})")
    return b, n, refs.shape[1]


def _infer_encode(p, shapes):
    a = tuple(shapes[2])
    return [(a[0], a[1]), (a[0], a[1]), a, tuple(shapes[3]), (4,), (4,)], [a, a]


def _cpu_encode_forward(c, samples, matches, anchors, refs, means, stds):
    b, n, m = c.geo
    valid = samples > 0.5
    mt = np.trunc(matches[valid])
    bad = np.flatnonzero((mt < 0) | (mt >= m))
    if bad.size:  # MXNet reads outside refs there
        raise DnnbindValueError(f"box_encode: a positive sample matches ref {mt[bad[0]]}, outside [0, {m}) (refs "
                                f"{refs.shape})")
    return ref.box_encode(samples, matches, anchors, refs, means, stds), _metas(samples, matches, anchors, refs,
                                                                                 means, stds)


_ARANGE: dict = {}


def _arange(n: int, device) -> NDArray:
    """0 .. n-1 as float64 on ``device``, uploaded once and cached (a recording may hold its pointer)."""
    key = (n, device)
    a = _ARANGE.get(key)
    if a is None:
        a = _ARANGE[key] = array(np.arange(n, dtype=_F64), device=device)
    return a


def _gpu_encode_forward(c, samples, matches, anchors, refs, means, stds):
    b, n, m = c.geo
    valid = table("greater", samples, 0.5)
    # the matched ref's row of refs seen as (B * M, 4): b * M + trunc(match), clamped into the refs (the GPU cannot
    # refuse an out-of-range match without reading it back)
    idx = table("trunc", table("cast", matches, dtype="float64"))
    idx = table("clip", table("where", valid, idx, 0.0), a_min=0.0, a_max=float(m - 1))
    rows = table("add", idx, table("multiply", view(_arange(b, samples.device), (b, 1)), float(m)))
    ref_rows = table("take", view(refs, (b * m, 4)), view(rows, (b * n,)), axis=0, mode="clip")
    r, a = _columns(ref_rows, (b, n)), _columns(anchors, (b, n))
    mu = [table("slice_axis", means, axis=0, begin=i, end=i + 1) for i in range(4)]
    sd = [table("slice_axis", stds, axis=0, begin=i, end=i + 1) for i in range(4)]
    rw, rh = table("subtract", r[2], r[0]), table("subtract", r[3], r[1])
    rx, ry = table("add", r[0], table("multiply", rw, 0.5)), table("add", r[1], table("multiply", rh, 0.5))
    aw, ah = table("subtract", a[2], a[0]), table("subtract", a[3], a[1])
    ax, ay = table("add", a[0], table("multiply", aw, 0.5)), table("add", a[1], table("multiply", ah, 0.5))
    enc = [table("divide", table("subtract", table("divide", table("subtract", rx, ax), aw), mu[0]), sd[0]),
           table("divide", table("subtract", table("divide", table("subtract", ry, ay), ah), mu[1]), sd[1]),
           table("divide", table("subtract", table("log", table("divide", rw, aw)), mu[2]), sd[2]),
           table("divide", table("subtract", table("log", table("divide", rh, ah)), mu[3]), sd[3])]
    targets = table("where", view(valid, (b, n, 1)), table("stack", *enc, axis=2), 0.0)
    masks = table("broadcast_to", view(table("cast", valid, dtype=anchors.dtype.name), (b, n, 1)), shape=(b, n, 4))
    return (targets, masks), _metas(samples, matches, anchors, refs, means, stds)


def _encode_samples(rng):
    lo = rng.uniform(0, 3, (2, 4, 2))
    anchors = np.concatenate([lo, lo + rng.uniform(0.5, 2, (2, 4, 2))], axis=-1)
    lo = rng.uniform(0, 3, (2, 3, 2))
    refs = np.concatenate([lo, lo + rng.uniform(0.5, 2, (2, 3, 2))], axis=-1)
    samples = np.array([[1.0, 0, 1, -1], [1, 1, 0, 1]])
    matches = np.array([[0.0, 1, 2, 0], [2, 1, 0, 1]])
    yield {"samples": samples, "matches": matches, "anchors": anchors, "refs": refs,
           "means": np.array([0.0, 0, 0, 0]), "stds": np.array([0.1, 0.1, 0.2, 0.2])}, {}


# -- box_decode ----------------------------------------------------------------------------------------------------

def _prepare_decode(p, data, anchors):
    shapes = f"data {data.shape}, anchors {anchors.shape}"
    _float("box_decode", "data", data, shapes)
    _float("box_decode", "anchors", anchors, shapes)
    if data.ndim != 3 or data.shape[2] != 4:
        raise DnnbindValueError(f"box_decode: data must be (B, N, 4), got {data.shape} ({shapes})")
    if anchors.ndim < 3 or anchors.shape[-1] != 4 or anchors.size < data.shape[1] * 4:
        raise DnnbindValueError(f"box_decode: anchors must be (..., N, 4) holding at least N = {data.shape[1]} boxes "
                                f"(MXNet reads the first N), got {anchors.shape} ({shapes})")
    return tuple(data.shape)


def _infer_decode(p, shapes):
    d = tuple(shapes[0])
    return [d, tuple(shapes[1]) if shapes[1] else (1, d[1], 4)], [d]


def _std(p):
    return tuple(p[f"std{i}"] for i in range(4))


def _cpu_decode_forward(c, data, anchors):
    return ref.box_decode(data, anchors, _std(c.p), c.p["clip"], c.p["format"]), _metas(data, anchors)


def _gpu_decode_forward(c, data, anchors):
    b, n, _ = c.geo
    x = _columns(data, (b, n))
    a = _columns(view(table("slice_axis", view(anchors, (anchors.size // 4, 4)), axis=0, begin=0, end=n), (n, 4)),
                 (1, n))
    ax, ay, aw, ah = a
    if c.p["format"] == "corner":
        aw, ah = table("subtract", aw, ax), table("subtract", ah, ay)
        ax, ay = table("add", ax, table("multiply", aw, 0.5)), table("add", ay, table("multiply", ah, 0.5))
    s = [float(np.float32(v)) for v in _std(c.p)]
    ox = table("add", table("multiply", table("multiply", x[0], s[0]), aw), ax)
    oy = table("add", table("multiply", table("multiply", x[1], s[1]), ah), ay)
    dw, dh = table("multiply", x[2], s[2]), table("multiply", x[3], s[3])
    if c.p["clip"] > 0:
        clip = float(np.float32(c.p["clip"]))
        dw, dh = table("minimum", dw, clip), table("minimum", dh, clip)
    ow = table("multiply", table("multiply", table("exp", dw), aw), 0.5)
    oh = table("multiply", table("multiply", table("exp", dh), ah), 0.5)
    out = table("stack", table("subtract", ox, ow), table("subtract", oy, oh), table("add", ox, ow),
                table("add", oy, oh), axis=2)
    return out, _metas(data, anchors)


def _decode_samples(rng):
    lo = rng.uniform(0, 3, (1, 4, 2))
    corner = np.concatenate([lo, lo + rng.uniform(0.5, 2, (1, 4, 2))], axis=-1)
    yield {"data": rng.standard_normal((2, 4, 4)) * 0.5, "anchors": corner}, {"format": "corner"}
    yield {"data": rng.standard_normal((1, 4, 4)) * 0.5, "anchors": corner}, {"std0": 0.1, "std1": 0.1, "std2": 0.2,
                                                                            "std3": 0.2, "clip": 0.3}


# -- bipartite_matching --------------------------------------------------------------------------------------------

def _prepare_match(p, data):
    _float("bipartite_matching", "data", data, f"data {data.shape}")
    if data.ndim < 2:
        raise DnnbindValueError(f"bipartite_matching: data must be (..., rows, cols) scores with at least 2 dims, "
                                f"got {data.shape}")
    return tuple(data.shape)


def _infer_match(p, shapes):
    d = tuple(shapes[0])
    return [d], [d[:-1], d[:-2] + (d[-1],)]


def _cpu_match_forward(c, data):
    p = c.p
    return ref.bipartite_matching(data, p["is_ascend"], p["threshold"], p["topk"]), _metas(data)


def _gpu_match_forward(c, data):
    shape = c.geo
    r, cc = shape[-2], shape[-1]
    nb = math.prod(shape[:-2])
    if data.size == 0:  # no score: every marker -1
        return (full(shape[:-1], -1, data.dtype, data.device),
                full(shape[:-2] + (cc,), -1, data.dtype, data.device)), _metas(data)
    rows = empty(shape[:-1], data.dtype, data.device)
    cols = empty(shape[:-2] + (cc,), data.dtype, data.device)
    order = empty((nb * r * cc,), np.int32, data.device)
    t = data.dtype.type
    K.kernel("dn_bipartite", data.dtype).launch(
        nb, K.BLOCK, (data, rows, cols, order, np.int32(r), np.int32(cc), t(np.float32(c.p["threshold"])),
                      np.int32(bool(c.p["is_ascend"])), np.int32(c.p["topk"])), stream=current_stream(data.device))
    return (rows, cols), _metas(data)


def _match_samples(rng):
    yield {"data": rng.permutation(12).reshape(3, 4) / 12.0}, {"threshold": 0.1}
    yield {"data": rng.permutation(24).reshape(2, 3, 4) / 24.0}, {"threshold": 0.5, "is_ascend": True, "topk": 1}


# -- the entries ---------------------------------------------------------------------------------------------------

_NMS_DOC = "MXNet's box_nms: non-maximum suppression of (..., n, width) box rows, kept rows first, -1 after."
define(OpDef("_contrib_box_nms", prepare=_prepare_nms, infer=_infer_nms, samples=_nms_samples,
             cpu=Lowering(_cpu_nms_forward, _cpu_nms_backward), gpu=Lowering(_gpu_nms_forward, _gpu_nms_backward),
             outputs=lambda p: (2, ["output0"]),  # MXNet's hidden second output: each row's source, for backward
             nd=("_contrib_box_nms", "_contrib_box_non_maximum_suppression"), doc=_NMS_DOC))
define(OpDef("_contrib_box_iou", prepare=_prepare_iou, infer=_infer_iou, samples=_iou_samples, loss=True,
             cpu=Lowering(_cpu_iou_forward, _cpu_zero_grads), gpu=Lowering(_gpu_iou_forward, _zero_grads),
             doc="MXNet's box_iou: the IoU of every lhs box with every rhs box."))
define(OpDef("_contrib_box_encode", prepare=_prepare_encode, infer=_infer_encode, samples=_encode_samples,
             loss=True, cpu=Lowering(_cpu_encode_forward, _cpu_zero_grads),
             gpu=Lowering(_gpu_encode_forward, _zero_grads), outputs=lambda p: (2, ["output0", "output1"]),
             doc="MXNet's box_encode: (targets, masks) of matched reference boxes against anchors."))
define(OpDef("_contrib_box_decode", prepare=_prepare_decode, infer=_infer_decode, samples=_decode_samples,
             loss=True, cpu=Lowering(_cpu_decode_forward, _cpu_zero_grads),
             gpu=Lowering(_gpu_decode_forward, _zero_grads),
             doc="MXNet's box_decode: corner boxes from encoded offsets and anchors."))
define(OpDef("_contrib_bipartite_matching", prepare=_prepare_match, infer=_infer_match, samples=_match_samples,
             loss=True, cpu=Lowering(_cpu_match_forward, _cpu_zero_grads),
             gpu=Lowering(_gpu_match_forward, _zero_grads), outputs=lambda p: (2, ["output0", "output1"]),
             doc="MXNet's bipartite_matching: greedy row/column matching of a score matrix."))
