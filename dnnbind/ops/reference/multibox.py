"""Numpy twin of MXNet 1.9.1's SSD operators (src/operator/contrib/multibox_{prior,target,detection}.cc, the CPU
code): MultiBoxPrior, MultiBoxTarget, MultiBoxDetection. Layer: ops. Imports numpy only.

Where MXNet computes in C ``float`` whatever the data's type (the prior boxes, the target encoding, IoUs compared as
float), so does the twin, so results match MXNet's to the last bit for float32 data. Sorts are stable, as MXNet's
``std::stable_sort``. Inputs arrive checked by ops/defs/multibox.py; what only the values can break (a label row
after the first padding row that is not padding) is reported by raising ``ValueError`` with ``where`` in it.
"""

from __future__ import annotations

import numpy as np

_F = np.float32


# -- MultiBoxPrior -------------------------------------------------------------------------------------------------

def multibox_prior(h: int, w: int, sizes, ratios, steps, offsets, clip: bool, dtype) -> np.ndarray:
    """(1, h * w * (len(sizes) + len(ratios) - 1), 4) corner anchors, per location (row-major): every size with the
    first ratio, then every further ratio with the first size. Computed in float32 (MXNet's float)."""
    step_y, step_x = _F(steps[0]), _F(steps[1])
    if steps[0] <= 0 or steps[1] <= 0:  # auto: one step per feature-map cell, in normalized coordinates
        step_y, step_x = _F(1) / _F(h), _F(1) / _F(w)
    sizes, ratios = [_F(s) for s in sizes], [_F(r) for r in ratios]
    r0 = np.sqrt(ratios[0])
    shapes = [(s, r0) for s in sizes] + [(sizes[0], np.sqrt(r)) for r in ratios[1:]]
    # MXNet's float expressions, in its order: w = size * H / W * ratio / 2, h = size / ratio / 2
    half_w = np.array([s * _F(h) / _F(w) * r / _F(2) for s, r in shapes], _F)
    half_h = np.array([s / r / _F(2) for s, r in shapes], _F)
    cy = (np.arange(h, dtype=_F) + _F(offsets[0])) * step_y
    cx = (np.arange(w, dtype=_F) + _F(offsets[1])) * step_x
    cy, cx = cy[:, None, None], cx[None, :, None]
    out = np.stack(np.broadcast_arrays(cx - half_w, cy - half_h, cx + half_w, cy + half_h), axis=-1)
    if clip:
        out = np.clip(out, _F(0), _F(1))
    return out.reshape(1, -1, 4).astype(dtype)


# -- MultiBoxDetection ---------------------------------------------------------------------------------------------

def _decode(anchors, loc, clip: bool, variances):
    """MXNet's TransformLocations on (A, 4) anchors and (A, 4) predictions, in the data's dtype."""
    t = anchors.dtype.type
    vx, vy, vw, vh = (t(_F(v)) for v in variances)
    al, at, ar, ab = (anchors[:, i] for i in range(4))
    aw, ah = ar - al, ab - at
    ax, ay = (al + ar) / t(2), (at + ab) / t(2)
    ox = loc[:, 0] * vx * aw + ax
    oy = loc[:, 1] * vy * ah + ay
    with np.errstate(over="ignore"):
        ow = np.exp(loc[:, 2] * vw) * aw / t(2)
        oh = np.exp(loc[:, 3] * vh) * ah / t(2)
    box = np.stack([ox - ow, oy - oh, ox + ow, oy + oh], axis=-1)
    return np.clip(box, t(0), t(1)) if clip else box


def _overlap(a, b):
    """MXNet's CalculateOverlap for corner boxes a (4,) and b (k, 4): 0 where the union is not positive."""
    w = np.maximum(0, np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]))
    h = np.maximum(0, np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]))
    i = w * h
    u = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - i
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(u <= 0, np.zeros_like(i), i / u)


def multibox_detection(cls_prob, loc_pred, anchor, clip: bool, threshold: float, background_id: int,
                       nms_threshold: float, force_suppress: bool, variances, nms_topk: int) -> np.ndarray:
    """(B, A, 6) rows [class id, score, xmin, ymin, xmax, ymax]. MXNet's CPU algorithm, quirks kept:

    - the class is the best non-background class (class 0 is the background whatever ``background_id`` says: MXNet
      declares the parameter and never reads it); below ``threshold`` the anchor is dropped;
    - the kept rows are packed to the front in anchor order, the rest of the rows are -1;
    - unless ``nms_threshold`` is outside (0, 1], the packed rows are sorted by score (stable); with ``nms_topk``
      only the first nms_topk are sorted in, and the rows after them keep their unsorted contents with id -1;
    - suppression (IoU >= nms_threshold, same class unless force_suppress) sets a row's id to -1 and keeps its values.
    """
    t = cls_prob.dtype.type
    nb, nc, na = cls_prob.shape
    anchors = anchor.reshape(-1)[:na * 4].reshape(na, 4)
    out = np.full((nb, na, 6), -1, cls_prob.dtype)
    thr, nms = _F(threshold), _F(nms_threshold)
    for b in range(nb):
        p = cls_prob[b]
        if nc > 1:
            best = np.argmax(p[1:], axis=0)  # the first of equal maxima, as MXNet's strict ``>`` scan
            score = p[1:][best, np.arange(na)]
            cls = np.where(score > t(-1), best + 1, 0)  # MXNet's scan starts from score -1
            score = np.where(score > t(-1), score, t(-1))
        else:
            cls, score = np.zeros(na, np.int64), np.full(na, t(-1))
        cls = np.where((cls > 0) & (score < thr), 0, cls)
        rows = np.concatenate([(cls - 1).astype(cls_prob.dtype)[:, None], score[:, None],
                               _decode(anchors, loc_pred[b].reshape(na, 4), clip, variances)], axis=1)
        rows = rows[cls > 0]
        nv = len(rows)
        out[b, :nv] = rows
        if nv < 1 or nms <= 0 or nms > 1:
            continue
        order = np.argsort(-rows[:, 1], kind="stable")
        nkeep = nms_topk if 0 < nms_topk < nv else nv
        o = out[b]
        o[nkeep:nv, 0] = -1
        o[:nkeep] = rows[order[:nkeep]]
        for i in range(nkeep):
            if o[i, 0] < 0:
                continue
            j = np.arange(i + 1, nkeep)
            j = j[o[j, 0] >= 0]
            if not force_suppress:
                j = j[o[j, 0] == o[i, 0]]
            if j.size:
                iou = _overlap(o[i, 2:], o[j, 2:])
                o[j[iou >= nms], 0] = -1
    return out


# -- MultiBoxTarget ------------------------------------------------------------------------------------------------

def overlaps(anchors, labels):
    """(A, 4) anchors against (L, 5+) labels' boxes -> (A, L) IoUs in the data's dtype, 0 over an empty union
    (MXNet's safe_divide)."""
    a, g = anchors[:, None, :], labels[None, :, 1:5]
    zero = anchors.dtype.type(0)
    inter = (np.maximum(zero, np.minimum(a[..., 2], g[..., 2]) - np.maximum(a[..., 0], g[..., 0]))
             * np.maximum(zero, np.minimum(a[..., 3], g[..., 3]) - np.maximum(a[..., 1], g[..., 1])))
    union = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1]) + (g[..., 2] - g[..., 0]) * (g[..., 3] - g[..., 1]) \
        - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union == 0, zero, inter / union)


def valid_labels(label: np.ndarray, where: str) -> int:
    """The number of ground truths before the first padding row (class id -1); that row must be all -1 (MXNet
    checks its first five values)."""
    ids = label[:, 0].astype(_F)
    pad = np.flatnonzero(ids == -1)
    if not pad.size:
        return len(label)
    k = int(pad[0])
    if np.any(label[k, 1:5].astype(_F) != -1):
        raise ValueError(f"{where}: label row {k} starts with the padding id -1 but is {label[k, :5].tolist()}, "
                         f"not all -1 (MXNet: a padding label row is [-1, -1, -1, -1, -1])")
    return k


def _loc_targets(anchors, gts, variances):
    """MXNet's AssignLocTargets in float32: center offsets over the anchor size and log size ratios, / variances."""
    a, g = anchors.astype(_F), gts.astype(_F)
    aw, ah = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
    ax, ay = (a[:, 0] + a[:, 2]) * _F(0.5), (a[:, 1] + a[:, 3]) * _F(0.5)
    gw, gh = g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
    gx, gy = (g[:, 0] + g[:, 2]) * _F(0.5), (g[:, 1] + g[:, 3]) * _F(0.5)
    vx, vy, vw, vh = (_F(v) for v in variances)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.stack([(gx - ax) / aw / vx, (gy - ay) / ah / vy, np.log(gw / aw) / vw, np.log(gh / ah) / vh],
                        axis=-1)


def multibox_target(anchor, label, cls_pred, overlap_threshold: float, ignore_label: float,
                    negative_mining_ratio: float, negative_mining_thresh: float, variances, where: str
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loc_target (B, A*4), loc_mask (B, A*4), cls_target (B, A)). MXNet's CPU algorithm:

    1. greedy bipartite matching: repeatedly the (anchor, ground truth) pair of highest IoU (> 1e-6) among the
       unmatched ones, until every ground truth is matched or no pair overlaps;
    2. with overlap_threshold > 0, every other anchor whose best IoU exceeds it is matched to that ground truth;
    3. negatives: with negative_mining_ratio > 0, the ratio * positives unmatched anchors of best IoU below
       negative_mining_thresh with the lowest background probability (softmax of cls_pred), else every unmatched
       anchor; the remaining anchors are ignored (cls_target = ignore_label, as is every anchor of a batch with no
       ground truth). ``minimum_negative_samples`` is declared by MXNet and never read.
    """
    nb, na = label.shape[0], anchor.shape[1]
    anchors = anchor.reshape(-1)[:na * 4].reshape(na, 4)
    dt = anchor.dtype
    loc_t = np.zeros((nb, na, 4), dt)
    loc_m = np.zeros((nb, na, 4), dt)
    cls_t = np.full((nb, na), dt.type(_F(ignore_label)), dt)
    eps = _F(1e-6)
    for b in range(nb):
        ng = valid_labels(label[b], where)
        if ng == 0:
            continue
        gts = label[b, :ng]
        iou = overlaps(anchors, gts).astype(_F)  # MXNet compares the IoUs as float
        flags = np.full(na, -1, np.int8)
        best_iou = np.full(na, _F(-1))
        best_gt = np.full(na, -1, np.int64)
        gt_done = np.zeros(ng, bool)
        positives = 0
        while not gt_done.all():
            m = np.where((flags[:, None] == 1) | gt_done[None, :], -np.inf, iou)
            flat = int(np.argmax(m))  # the first of equal maxima in (anchor, gt) order, as MXNet's strict scan
            if not m.flat[flat] > eps:
                break
            j, k = divmod(flat, ng)
            best_iou[j], best_gt[j] = iou[j, k], k
            positives += 1
            gt_done[k], flags[j] = True, 1
        free = flags != 1
        row_best = np.argmax(iou, axis=1)
        row_max = iou[np.arange(na), row_best]
        has = row_max > _F(-1)
        if overlap_threshold > 0:
            upd = free & has
            best_iou[upd], best_gt[upd] = row_max[upd], row_best[upd]
            pos = upd & (row_max > _F(overlap_threshold))
            positives += int(pos.sum())
            gt_done[row_best[pos]] = True
            flags[pos] = 1
        if negative_mining_ratio > 0:
            n_neg = int(_F(positives) * _F(negative_mining_ratio))
            n_neg = min(n_neg, na - positives)
            if n_neg > 0:
                free = flags != 1
                upd = free & (best_iou < 0) & has
                best_iou[upd], best_gt[upd] = row_max[upd], row_best[upd]
                cand = np.flatnonzero(free & (best_iou < _F(negative_mining_thresh)) & (flags == -1))
                if len(cand) < n_neg:
                    raise ValueError(f"{where}: negative mining wants {n_neg} negatives (negative_mining_ratio "
                                     f"{negative_mining_ratio} x {positives} positives) but only {len(cand)} "
                                     f"anchors have an IoU below negative_mining_thresh {negative_mining_thresh} "
                                     f"(MXNet fails its check here)")
                p = cls_pred[b][:, cand]
                mx = p.max(axis=0)
                prob = (np.exp(p[0] - mx) / np.exp(p - mx).sum(axis=0)).astype(_F)
                order = np.argsort(prob, kind="stable")  # the lowest background probability first (hardest)
                flags[cand[order[:n_neg]]] = 0
        else:
            flags[flags != 1] = 0
        pos = np.flatnonzero(flags == 1)
        cls_t[b, pos] = gts[best_gt[pos], 0] + 1
        loc_m[b, pos] = 1
        loc_t[b, pos] = _loc_targets(anchors[pos], gts[best_gt[pos], 1:5], variances).astype(dt)
        cls_t[b, flags == 0] = 0
    return loc_t.reshape(nb, na * 4), loc_m.reshape(nb, na * 4), cls_t
