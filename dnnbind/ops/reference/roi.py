"""Layer ops (numpy twins): MXNet's region pooling over (N, C, H, W) features and (R, 5) regions ``[batch, x1, y1, x2,
y2]``: ``_contrib_ROIAlign``, ``ROIPooling`` and ``_contrib_PSROIPooling``, forward and backward. Imports numpy only.

Arithmetic is in the data's type, with MXNet's roundings (``std::round``: half away from zero; ``static_cast<int>``:
toward zero). A region whose batch index (truncated toward zero) is outside [0, N) is ignored: its output is 0 and it
passes no gradient (MXNet's ROIPooling rule, applied to all three: MXNet's ROIAlign zeroes one element only for a
negative index and reads outside the data for one past N; PSROIPooling checks nothing).
"""

from __future__ import annotations

import numpy as np


def round_half_away(v):
    """C's round(): halves away from zero (numpy's round goes to even)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def batch_index(rois: np.ndarray, n: int) -> np.ndarray:
    """Each region's batch index (truncated toward zero), -1 where it is outside [0, n)."""
    b = np.trunc(rois[:, 0]).astype(np.int64)
    return np.where((b >= 0) & (b < n), b, -1)


# ROIAlign ---------------------------------------------------------------------------------------------------------

def _align_axis(start, bin_size, pooled: int, grid: int, size: int, t):
    """The sample positions along one axis of one region, (pooled, grid) each: (low, high, w_low, w_high), the
    weights 0 where the sample falls outside [-1, size] (MXNet's bilinear_interpolate rules)."""
    p = np.arange(pooled, dtype=t)[:, None]
    i = (np.arange(grid) + np.float32(0.5)).astype(t)[None, :]  # static_cast<T>(iy + .5f)
    v = start + p * bin_size + i * bin_size / t.type(grid)
    outside = (v < -1.0) | (v > size)
    v = np.where(v <= 0, t.type(0), v)
    low = v.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    v = np.where(edge, low.astype(t), v)
    frac = (v - low).astype(t)
    w_high = np.where(outside, t.type(0), frac).astype(t)
    w_low = np.where(outside, t.type(0), t.type(1) - frac).astype(t)
    low, high = np.where(outside, 0, low), np.where(outside, 0, high)
    return low, high, w_low, w_high


def align_region(roi, p: dict, shape: tuple, t):
    """One region's geometry: (yl, yh, wyl, wyh), (xl, xh, wxl, wxh) of shape (PH, gh) and (PW, gw), and count."""
    _, _, h, w = shape
    ph, pw = p["pooled_size"]
    scale = t.type(np.float32(p["spatial_scale"]))
    offset = t.type(0.5) if p["aligned"] else t.type(0)
    x1, y1, x2, y2 = (roi[k] * scale - offset for k in range(1, 5))
    rw, rh = x2 - x1, y2 - y1
    if not p["aligned"]:  # MXNet's backward compatibility: at least one pixel
        rw, rh = max(rw, t.type(1)), max(rh, t.type(1))
    bh, bw = rh / t.type(ph), rw / t.type(pw)
    r = p["sample_ratio"]
    gh = r if r > 0 else int(np.ceil(rh / t.type(ph)))
    gw = r if r > 0 else int(np.ceil(rw / t.type(pw)))
    return (_align_axis(y1, bh, ph, gh, h, t), _align_axis(x1, bw, pw, gw, w, t), t.type(gh * gw))


def _align_channels(p: dict, c_out: int):
    """The input channel each output (c, ph, pw) reads, shaped (C_out, PH, 1, PW, 1) for broadcasting."""
    ph, pw = p["pooled_size"]
    c = np.arange(c_out)[:, None, None, None, None]
    if p["position_sensitive"]:
        return c * ph * pw + np.arange(ph)[None, :, None, None, None] * pw + np.arange(pw)[None, None, None, :, None]
    return c


def _align_corners(ys, xs):
    """The four corners as (row index, column index, weight) over (PH, gh, PW, gw)."""
    yl, yh, wyl, wyh = (a[:, :, None, None] for a in ys)
    xl, xh, wxl, wxh = (a[None, None, :, :] for a in xs)
    return ((yl, xl, wyl * wxl), (yl, xh, wyl * wxh), (yh, xl, wyh * wxl), (yh, xh, wyh * wxh))


def roi_align(x: np.ndarray, rois: np.ndarray, p: dict) -> np.ndarray:
    t = x.dtype
    n, c, h, w = x.shape
    ph, pw = p["pooled_size"]
    c_out = c // (ph * pw) if p["position_sensitive"] else c
    y = np.zeros((rois.shape[0], c_out, ph, pw), t)
    chan = _align_channels(p, c_out)
    for r, b in enumerate(batch_index(rois, n)):
        if b < 0:
            continue
        ys, xs, count = align_region(rois[r], p, x.shape, t)
        acc = 0
        for rows, cols, wt in _align_corners(ys, xs):
            acc = acc + wt * x[b][chan, rows, cols]  # (C_out, PH, gh, PW, gw)
        y[r] = (acc.sum(axis=(2, 4)) / count).astype(t)
    return y


def roi_align_backward(dy: np.ndarray, rois: np.ndarray, p: dict, shape: tuple) -> np.ndarray:
    t = dy.dtype
    dx = np.zeros(shape, t)
    c_out = dy.shape[1]
    chan = _align_channels(p, c_out)
    for r, b in enumerate(batch_index(rois, shape[0])):
        if b < 0:
            continue
        ys, xs, count = align_region(rois[r], p, shape, t)
        g = dy[r][:, :, None, :, None]  # (C_out, PH, 1, PW, 1)
        for rows, cols, wt in _align_corners(ys, xs):
            val = g * wt / count
            np.add.at(dx[b], np.broadcast_arrays(chan, rows, cols), val)
    return dx


# ROIPooling -------------------------------------------------------------------------------------------------------

def roi_pool_bins(roi, pooled: tuple, scale, shape: tuple, t):
    """One region's bins: (hstart, hend) of shape (PH,) and (wstart, wend) of shape (PW,), clipped to the data."""
    _, _, h, w = shape
    x1, y1, x2, y2 = (int(round_half_away(roi[k] * scale)) for k in range(1, 5))
    rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
    bh, bw = t.type(rh) / t.type(pooled[0]), t.type(rw) / t.type(pooled[1])

    def edges(n, size, start, bin_size):
        k = np.arange(n).astype(t)
        lo = np.floor(k * bin_size).astype(np.int64) + start
        hi = np.ceil((k + t.type(1)) * bin_size).astype(np.int64) + start
        return np.clip(lo, 0, size), np.clip(hi, 0, size)
    return edges(pooled[0], h, y1, bh), edges(pooled[1], w, x1, bw)


def roi_pool(x: np.ndarray, rois: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """(output, argmax): argmax the flat index into x of each output's maximum (the first in row-major order), -1
    for an empty bin or an ignored region (output 0). The maximum starts at -FLT_MAX, as MXNet's."""
    t = x.dtype
    n, c, h, w = x.shape
    ph, pw = p["pooled_size"]
    scale = t.type(np.float32(p["spatial_scale"]))
    r_n = rois.shape[0]
    y = np.zeros((r_n, c, ph, pw), t)
    arg = np.full((r_n, c, ph, pw), -1, np.int64)
    lowest = t.type(-np.finfo(np.float32).max)
    base = np.arange(c)[:, None] * (h * w)
    for r, b in enumerate(batch_index(rois, n)):
        if b < 0:
            continue
        (hs, he), (ws, we) = roi_pool_bins(rois[r], (ph, pw), scale, x.shape, t)
        for i in range(ph):
            for j in range(pw):
                if he[i] <= hs[i] or we[j] <= ws[j]:
                    continue
                win = x[b, :, hs[i]:he[i], ws[j]:we[j]].reshape(c, -1)
                k = np.argmax(np.where(np.isnan(win), -np.inf, win), axis=1)
                best = win[np.arange(c), k]
                hit = best > lowest  # MXNet's strict '>' against its -FLT_MAX start
                rows, cols = np.divmod(k, we[j] - ws[j])
                flat = b * c * h * w + base[:, 0] + (rows + hs[i]) * w + cols + ws[j]
                y[r, :, i, j] = np.where(hit, best, lowest)
                arg[r, :, i, j] = np.where(hit, flat, -1)
    return y, arg


def roi_pool_backward(dy: np.ndarray, arg: np.ndarray, shape: tuple) -> np.ndarray:
    dx = np.zeros(int(np.prod(shape)), dy.dtype)
    keep = arg >= 0
    np.add.at(dx, arg[keep], dy[keep])
    return dx.reshape(shape)


# PSROIPooling -----------------------------------------------------------------------------------------------------

def psroi_bins(roi, p: dict, shape: tuple, t):
    """One region's bins (hstart, hend) (P,), (wstart, wend) (P,) clipped to the data, and the group (gh, gw) of
    each bin row and column."""
    _, _, h, w = shape
    ps, gs = p["pooled_size"], p["group_size"]
    scale = t.type(np.float32(p["spatial_scale"]))
    x1, y1 = (t.type(round_half_away(roi[k])) * scale for k in (1, 2))
    x2, y2 = ((t.type(round_half_away(roi[k])) + t.type(1)) * scale for k in (3, 4))
    rw, rh = max(x2 - x1, t.type(0.1)), max(y2 - y1, t.type(0.1))
    bh, bw = rh / t.type(ps), rw / t.type(ps)
    k = np.arange(ps).astype(t)
    hs = np.clip(np.floor(k * bh + y1).astype(np.int64), 0, h)
    he = np.clip(np.ceil((k + 1) * bh + y1).astype(np.int64), 0, h)
    ws = np.clip(np.floor(k * bw + x1).astype(np.int64), 0, w)
    we = np.clip(np.ceil((k + 1) * bw + x1).astype(np.int64), 0, w)
    g = np.clip(np.floor(k * t.type(gs) / t.type(ps)).astype(np.int64), 0, gs - 1)
    return (hs, he), (ws, we), g


def psroi_pool(x: np.ndarray, rois: np.ndarray, p: dict) -> np.ndarray:
    t = x.dtype
    n = x.shape[0]
    ps, gs, dim = p["pooled_size"], p["group_size"], p["output_dim"]
    y = np.zeros((rois.shape[0], dim, ps, ps), t)
    ctop = np.arange(dim)
    for r, b in enumerate(batch_index(rois, n)):
        if b < 0:
            continue
        (hs, he), (ws, we), g = psroi_bins(rois[r], p, x.shape, t)
        for i in range(ps):
            for j in range(ps):
                area = (he[i] - hs[i]) * (we[j] - ws[j])
                if he[i] <= hs[i] or we[j] <= ws[j]:
                    continue
                chan = (ctop * gs + g[i]) * gs + g[j]
                y[r, :, i, j] = x[b, chan, hs[i]:he[i], ws[j]:we[j]].sum(axis=(1, 2)) / t.type(area)
    return y


def psroi_pool_backward(dy: np.ndarray, rois: np.ndarray, p: dict, shape: tuple) -> np.ndarray:
    t = dy.dtype
    dx = np.zeros(shape, t)
    ps, gs, dim = p["pooled_size"], p["group_size"], p["output_dim"]
    ctop = np.arange(dim)
    for r, b in enumerate(batch_index(rois, shape[0])):
        if b < 0:
            continue
        (hs, he), (ws, we), g = psroi_bins(rois[r], p, shape, t)
        for i in range(ps):
            for j in range(ps):
                if he[i] <= hs[i] or we[j] <= ws[j]:
                    continue
                area = t.type((he[i] - hs[i]) * (we[j] - ws[j]))
                chan = (ctop * gs + g[i]) * gs + g[j]
                dx[b, chan, hs[i]:he[i], ws[j]:we[j]] += (dy[r, :, i, j] / area)[:, None, None]
    return dx
