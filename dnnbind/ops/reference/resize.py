"""Layer ops (numpy twins): MXNet's ``_contrib_BilinearResize2D`` and ``_contrib_AdaptiveAvgPooling2D`` over
(N, C, H, W) arrays, forward and backward. Imports numpy only.

Both are separable: each output row (column) reads a few input rows (columns) with weights that depend on the sizes
only. ``bilinear_taps`` and ``adaptive_taps`` give those per axis as (K, O) index and weight tables, which the GPU
lowering uploads once; the twins below compute with MXNet's own arithmetic order so that they match its results.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def bilinear_axis(n_in: int, n_out: int, align_corners: bool, dtype) -> tuple:
    """(i0, i1, l0, l1) per output position along one axis: the two source positions and their weights.

    As MXNet computes them: the scale and the source position in float32 whatever the data's type (its
    ``area_pixel_compute_scale<float>``), a negative source position clamped to 0 (align_corners False), the
    fraction l1 rounded to float32 before it becomes the data's type, l0 = 1 - l1 in the data's type. The last
    input position takes itself as its neighbour."""
    dtype = np.dtype(dtype)
    if n_out > 1:
        scale = _F32(n_in - 1) / _F32(n_out - 1) if align_corners else _F32(n_in) / _F32(n_out)
    else:
        scale = _F32(0)
    d = np.arange(n_out, dtype=_F32)
    if align_corners:
        r = scale * d
    else:
        r = np.maximum(scale * (d + _F32(0.5)) - _F32(0.5), _F32(0))
    i0 = r.astype(np.int64)  # r >= 0: truncation is floor
    i1 = i0 + (i0 < n_in - 1)
    l1 = (r - i0.astype(_F32)).astype(dtype)
    l0 = (dtype.type(1) - l1).astype(dtype)
    return i0, i1, l0, l1


def bilinear_taps(n_in: int, n_out: int, align_corners: bool, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(index (2, O), weight (2, O)) of one axis, for the GPU's gather-and-weight lowering."""
    i0, i1, l0, l1 = bilinear_axis(n_in, n_out, align_corners, dtype)
    return np.stack([i0, i1]), np.stack([l0, l1])


def bilinear_resize(x: np.ndarray, out_hw: tuple, align_corners: bool) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = out_hw
    if (oh, ow) == (h, w):  # MXNet copies (the weights would be exact anyway)
        return x.copy()
    h0, h1, a0, a1 = bilinear_axis(h, oh, align_corners, x.dtype)
    w0, w1, b0, b1 = bilinear_axis(w, ow, align_corners, x.dtype)
    top, bottom = x[:, :, h0, :], x[:, :, h1, :]
    # h0 * (w0 * x00 + w1 * x01) + h1 * (w0 * x10 + w1 * x11): MXNet's order of operations
    row0 = b0 * top[..., w0] + b1 * top[..., w1]
    row1 = b0 * bottom[..., w0] + b1 * bottom[..., w1]
    return (a0[:, None] * row0 + a1[:, None] * row1).astype(x.dtype)


def bilinear_resize_backward(dy: np.ndarray, in_shape: tuple, align_corners: bool) -> np.ndarray:
    n, c, h, w = in_shape
    oh, ow = dy.shape[2:]
    if (oh, ow) == (h, w):
        return dy.copy()
    h0, h1, a0, a1 = bilinear_axis(h, oh, align_corners, dy.dtype)
    w0, w1, b0, b1 = bilinear_axis(w, ow, align_corners, dy.dtype)
    # the adjoint, one axis at a time: spread along W into (N, C, OH, W), then along H
    rows = np.zeros((n, c, oh, w), dy.dtype)
    np.add.at(rows, (slice(None), slice(None), slice(None), w0), dy * b0)
    np.add.at(rows, (slice(None), slice(None), slice(None), w1), dy * b1)
    dx = np.zeros(in_shape, dy.dtype)
    np.add.at(dx, (slice(None), slice(None), h0), rows * a0[:, None])
    np.add.at(dx, (slice(None), slice(None), h1), rows * a1[:, None])
    return dx


def adaptive_bins(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each output bin along one axis: floor(o * I / O), ceil((o + 1) * I / O), as MXNet's
    START_IND/END_IND (computed in float32 there; exact in integers here for any size it can hold)."""
    o = np.arange(n_out)
    return (o * n_in) // n_out, -((-(o + 1) * n_in) // n_out)


def adaptive_taps(n_in: int, n_out: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(index (K, O), weight (K, O)) of one axis: bin o reads positions start..end-1, each with weight 1 / (end -
    start); K is the widest bin, the narrower ones padded with index start and weight 0."""
    start, end = adaptive_bins(n_in, n_out)
    k = int((end - start).max()) if n_out else 0
    t = np.arange(k)[:, None]
    inside = t < (end - start)[None, :]
    index = np.where(inside, start[None, :] + t, start[None, :])
    weight = np.where(inside, 1.0 / (end - start)[None, :], 0.0).astype(dtype)
    return index, weight


def adaptive_avg_pool(x: np.ndarray, out_hw: tuple) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = out_hw
    hs, he = adaptive_bins(h, oh)
    ws, we = adaptive_bins(w, ow)
    y = np.empty((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            s = x[:, :, hs[i]:he[i], ws[j]:we[j]].sum(axis=(2, 3))
            y[:, :, i, j] = s / x.dtype.type(we[j] - ws[j]) / x.dtype.type(he[i] - hs[i])  # MXNet: sum / kW / kH
    return y


def adaptive_avg_pool_backward(dy: np.ndarray, in_shape: tuple) -> np.ndarray:
    n, c, h, w = in_shape
    oh, ow = dy.shape[2:]
    hs, he = adaptive_bins(h, oh)
    ws, we = adaptive_bins(w, ow)
    dx = np.zeros(in_shape, dy.dtype)
    for i in range(oh):
        for j in range(ow):
            share = dy[:, :, i, j] / dy.dtype.type(he[i] - hs[i]) / dy.dtype.type(we[j] - ws[j])
            dx[:, :, hs[i]:he[i], ws[j]:we[j]] += share[:, :, None, None]
    return dx


def out_size_of(p: dict, h: int, w: int, like_hw: tuple | None) -> tuple[int, int]:
    """BilinearResize2D's output (height, width) for data of spatial size (h, w), as MXNet's shape inference: its
    int16 arithmetic included (a size past 32767 wraps, refused by the caller). 'size' takes ``height``/``width``
    or the input size times ``scale_height``/``scale_width``, each axis on its own."""
    mode = p["mode"]
    sh, sw = p["scale_height"], p["scale_width"]
    if mode == "size":
        # NOTE: MXNet decides both axes on scale_height alone: scale_width without scale_height is ignored (the
        # width parameter is used); scale_height without scale_width fails there, and is refused by the caller.
        if sh is not None:
            oh, ow = int(_F32(sh) * _F32(h)), int(_F32(sw) * _F32(w))
        else:
            oh, ow = p["height"], p["width"]
    elif mode == "odd_scale":
        oh = int(_F32(h) * _F32(sh)) if h % 2 == 0 else int(_F32(h - 1) * _F32(sh)) + 1
        ow = int(_F32(w) * _F32(sw)) if w % 2 == 0 else int(_F32(w - 1) * _F32(sw)) + 1
    elif mode == "like":
        oh, ow = like_hw
    else:
        want_even = mode.startswith("to_even")
        step = -1 if mode.endswith("down") else 1

        def fix(v):
            return v if (v % 2 == 0) == want_even else v + step
        oh, ow = fix(h), fix(w)
    return oh, ow


__all__ = ["adaptive_avg_pool", "adaptive_avg_pool_backward", "adaptive_bins", "adaptive_taps", "bilinear_axis",
           "bilinear_resize", "bilinear_resize_backward", "bilinear_taps", "out_size_of"]
