"""Numpy twin of MXNet 1.9.1's bounding-box operators (src/operator/contrib/bounding_box-inl.h): box_nms, box_iou,
box_encode, box_decode, bipartite_matching. Layer: ops. Imports numpy only.

Arrays arrive already checked (ops/defs/bounding_box.py owns the checks and their messages). Arithmetic stays in the
data's dtype, as MXNet's kernels (templated on DType) do, so float32 results match MXNet's bit for bit where the
order of operations is kept; sorts are stable (MXNet's CPU SortByKey is ``std::stable_sort``), so equal scores keep
index order.
"""

from __future__ import annotations

import numpy as np

CORNER, CENTER = "corner", "center"


# -- shared geometry -----------------------------------------------------------------------------------------------

def _intersect_1d(a_lo, a_hi, b_lo, b_hi, fmt: str):
    """Overlap along one axis; in the center format ``lo`` is the center and ``hi`` the extent (MXNet's Intersect)."""
    if fmt == CENTER:
        aw, bw = a_hi / 2, b_hi / 2
        a_lo, a_hi, b_lo, b_hi = a_lo - aw, a_lo + aw, b_lo - bw, b_lo + bw
    w = np.minimum(a_hi, b_hi) - np.maximum(a_lo, b_lo)
    return np.where(w > 0, w, np.zeros_like(w))


def area(box: np.ndarray, fmt: str) -> np.ndarray:
    """(..., 4) boxes -> areas; a box with a negative width or height has area 0 (MXNet's BoxArea)."""
    if fmt == CORNER:
        w, h = box[..., 2] - box[..., 0], box[..., 3] - box[..., 1]
    else:
        w, h = box[..., 2], box[..., 3]
    return np.where((w < 0) | (h < 0), np.zeros_like(w), w * h)


def intersection(a: np.ndarray, b: np.ndarray, fmt: str) -> np.ndarray:
    """Broadcast (..., 4) against (..., 4): the intersection areas."""
    return (_intersect_1d(a[..., 0], a[..., 2], b[..., 0], b[..., 2], fmt)
            * _intersect_1d(a[..., 1], a[..., 3], b[..., 1], b[..., 3], fmt))


# -- box_iou -------------------------------------------------------------------------------------------------------

def box_iou(lhs: np.ndarray, rhs: np.ndarray, fmt: str) -> np.ndarray:
    """lhs (..., 4), rhs (..., 4) -> lhs.shape[:-1] + rhs.shape[:-1]; 0 where the boxes do not intersect."""
    a = lhs.reshape(-1, 1, 4)
    b = rhs.reshape(1, -1, 4)
    inter = intersection(a, b, fmt)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (area(a, fmt) + area(b, fmt) - inter)
    iou = np.where(inter <= 0, np.zeros_like(iou), iou)
    return iou.astype(lhs.dtype, copy=False).reshape(lhs.shape[:-1] + rhs.shape[:-1])


# -- box_nms -------------------------------------------------------------------------------------------------------

def nms_order(x: np.ndarray, valid_thresh: float, topk: int, score_index: int, id_index: int,
              background_id: int) -> np.ndarray:
    """One batch (n, width): the candidates of the suppression, best first, at most topk (ties in index order)."""
    s = x[:, score_index]
    valid = s > x.dtype.type(np.float32(valid_thresh))  # MXNet's parameter is a float
    if id_index >= 0:
        valid &= x[:, id_index] != x.dtype.type(background_id)
    idx = np.flatnonzero(valid)
    order = idx[np.argsort(-s[idx], kind="stable")]
    return order[:topk]


def nms_keep(x: np.ndarray, cand: np.ndarray, overlap_thresh: float, coord_start: int, id_index: int,
             force_suppress: bool, fmt: str) -> np.ndarray:
    """MXNet's suppression in sorted order: each box still kept removes the later ones of its class (any class with
    force_suppress) whose IoU with it is above ``overlap_thresh``. Returns the kept candidates, in order."""
    boxes = x[cand, coord_start:coord_start + 4]
    areas = area(boxes, fmt)
    ids = np.trunc(x[cand, id_index]).astype(np.int64) if id_index >= 0 and not force_suppress else None
    keep = np.ones(len(cand), bool)
    thresh = np.float32(overlap_thresh)  # MXNet passes it as float
    with np.errstate(divide="ignore", invalid="ignore"):
        for r in range(len(cand)):
            if not keep[r]:
                continue
            rest = np.arange(r + 1, len(cand))
            rest = rest[keep[rest]]
            if ids is not None:
                rest = rest[ids[rest] == ids[r]]
            if rest.size == 0:
                continue
            inter = intersection(boxes[r], boxes[rest], fmt)
            iou = inter / (areas[r] + areas[rest] - inter)
            keep[rest[iou > thresh]] = False  # (NaN, 0 / 0, suppresses nothing)
    return cand[keep]


def convert_format(rows: np.ndarray, coord_start: int, to: str) -> None:
    """In place, MXNet's corner_to_center / center_to_corner: a row whose first coordinate is negative is left as it
    is (MXNet's kernels skip it, so the -1 padding stays -1, and so does a real box left of the origin)."""
    c = rows[..., coord_start:coord_start + 4]
    go = c[..., 0] >= 0
    a, b, p, q = (c[..., i].copy() for i in range(4))
    if to == CENTER:
        new = ((a + p) / 2, (b + q) / 2, p - a, q - b)
    else:
        new = (a - p / 2, b - q / 2, a + p / 2, b + q / 2)
    for i in range(4):
        c[..., i] = np.where(go, new[i], c[..., i])


def box_nms(data: np.ndarray, overlap_thresh: float, valid_thresh: float, topk: int, coord_start: int,
            score_index: int, id_index: int, background_id: int, force_suppress: bool, in_format: str,
            out_format: str) -> tuple[np.ndarray, np.ndarray]:
    """(output like data, record (batches, n) int64): the kept boxes first in each batch, best first, the rest of the
    rows -1; ``record`` holds each output row's source row (flat over the batches) or -1, for the backward.
    topk = 0 returns the data unchanged (MXNet: no sort, no format change) with the identity record."""
    n, w = data.shape[-2], data.shape[-1]
    x = data.reshape(-1, n, w)
    nb = x.shape[0]
    k = n if topk < 0 else min(n, topk)
    if k < 1:
        return data.copy(), np.arange(nb * n, dtype=np.int64).reshape(nb, n)
    out = np.full_like(x, -1)
    record = np.full((nb, n), -1, np.int64)
    for b in range(nb):
        cand = nms_order(x[b], valid_thresh, k, score_index, id_index, background_id)
        kept = nms_keep(x[b], cand, overlap_thresh, coord_start, id_index, force_suppress, in_format)
        out[b, :len(kept)] = x[b, kept]
        record[b, :len(kept)] = kept + b * n
    if in_format != out_format:
        convert_format(out, coord_start, out_format)
    return out.reshape(data.shape), record


def box_nms_backward(dy: np.ndarray, record: np.ndarray) -> np.ndarray:
    """MXNet's backward: each output row's gradient goes back to its source row as it is (no Jacobian of a format
    change); suppressed and filtered rows get 0."""
    w = dy.shape[-1]
    flat = dy.reshape(-1, w)
    dx = np.zeros_like(flat)
    rec = record.reshape(-1)
    hit = rec >= 0
    dx[rec[hit]] = flat[hit]
    return dx.reshape(dy.shape)


# -- box_encode / box_decode ---------------------------------------------------------------------------------------

def box_encode(samples, matches, anchors, refs, means, stds) -> tuple[np.ndarray, np.ndarray]:
    """samples, matches (B, N); anchors (B, N, 4) and refs (B, M, 4) corner boxes; means, stds (4,). Returns
    (targets, masks), both (B, N, 4): the center offsets and log sizes of each positive sample's matched ref against
    its anchor, normalized; 0 (and mask 0) where ``samples <= 0.5``."""
    t = anchors.dtype.type
    valid = samples > 0.5
    m = np.trunc(matches).astype(np.int64)
    m = np.where(valid, m, 0)  # an unused match is never read (MXNet reads it and throws the value away)
    ref = np.take_along_axis(refs, m[..., None], axis=1)
    half = t(0.5)
    rw, rh = ref[..., 2] - ref[..., 0], ref[..., 3] - ref[..., 1]
    rx, ry = ref[..., 0] + rw * half, ref[..., 1] + rh * half
    aw, ah = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    ax, ay = anchors[..., 0] + aw * half, anchors[..., 1] + ah * half
    with np.errstate(divide="ignore", invalid="ignore"):
        enc = np.stack([((rx - ax) / aw - means[0]) / stds[0], ((ry - ay) / ah - means[1]) / stds[1],
                        (np.log(rw / aw) - means[2]) / stds[2], (np.log(rh / ah) - means[3]) / stds[3]], axis=-1)
    v = valid[..., None]
    targets = np.where(v, enc, np.zeros_like(enc)).astype(anchors.dtype, copy=False)
    masks = np.broadcast_to(v, anchors.shape).astype(anchors.dtype)
    return targets, masks


def box_decode(data, anchors, std: tuple, clip: float, fmt: str) -> np.ndarray:
    """data (B, N, 4) encoded offsets; anchors: the first N boxes of the array (MXNet reads (1, N, 4) whatever the
    anchors' leading dims). Returns corner boxes (B, N, 4); ``clip`` > 0 caps the log sizes before exp."""
    t = data.dtype.type
    n = data.shape[1]
    a = anchors.reshape(-1)[:n * 4].reshape(1, n, 4)
    ax, ay, aw, ah = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    if fmt == CORNER:
        aw, ah = aw - ax, ah - ay
        ax, ay = ax + aw * t(0.5), ay + ah * t(0.5)
    s0, s1, s2, s3 = (t(np.float32(v)) for v in std)
    ox = data[..., 0] * s0 * aw + ax
    oy = data[..., 1] * s1 * ah + ay
    dw, dh = data[..., 2] * s2, data[..., 3] * s3
    if clip > 0:
        c = t(np.float32(clip))
        dw, dh = np.where(dw < c, dw, c), np.where(dh < c, dh, c)
    with np.errstate(over="ignore"):
        ow, oh = np.exp(dw) * aw * t(0.5), np.exp(dh) * ah * t(0.5)
    return np.stack([ox - ow, oy - oh, ox + ow, oy + oh], axis=-1).astype(data.dtype, copy=False)


# -- bipartite_matching --------------------------------------------------------------------------------------------

def bipartite_matching(data: np.ndarray, is_ascend: bool, threshold: float, topk: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """data (..., R, C) scores -> (row markers (..., R), column markers (..., C)): greedy matching in score order
    (stable), each pair taken while both its row and column are free; the first free pair whose score fails the
    threshold ends the batch. MXNet's count check runs after a match is made, so topk = k yields k + 1 matches
    (kept: it is what MXNet returns)."""
    r, c = data.shape[-2], data.shape[-1]
    x = data.reshape(-1, r * c)
    rows = np.full((x.shape[0], r), -1, data.dtype)
    cols = np.full((x.shape[0], c), -1, data.dtype)
    thr = np.float32(threshold)
    for b in range(x.shape[0]):
        s = x[b]
        order = np.argsort(s if is_ascend else -s, kind="stable")
        count = 0
        for idx in order:
            i, j = divmod(int(idx), c)
            if rows[b, i] != -1 or cols[b, j] != -1:
                continue
            if (s[idx] < thr) if is_ascend else (s[idx] > thr):
                rows[b, i], cols[b, j] = j, i
                count += 1
                if 0 < topk < count:
                    break
            else:
                break
    return rows.reshape(data.shape[:-1]), cols.reshape(data.shape[:-2] + (c,))
