"""Layer ops (numpy twins): MXNet's deformable convolutions over (N, C, H, W) data, forward and backward:
``_contrib_DeformableConvolution`` (DCN v1) and ``_contrib_ModulatedDeformableConvolution`` (DCN v2, a mask per
tap). Imports numpy only.

Each output pixel (ho, wo) reads, for kernel tap k = i * kw + j, the point
``(ho * stride_h - pad_h + i * dilate_h + dy, wo * stride_w - pad_w + j * dilate_w + dx)`` of its channels, where
(dy, dx) are offset channels (2k, 2k + 1) of its deformable group (channels are split into ``num_deformable_group``
consecutive groups, each with its own 2 * kh * kw offset channels, y first). The point is read by bilinear
interpolation, with each version's boundary rule (MXNet's deformable_im2col.h and modulated_deformable_im2col.h):

- v1: a point is read only where 0 <= y < H and 0 <= x < W (0 elsewhere, also between -1 and 0); on the last row
  (or column), y in [H - 1, H) reads row H - 1 alone (no fading toward the border).
- v2: a point is read where -1 < y < H and -1 < x < W, the corners outside the data counting as zeros; the value is
  then multiplied by the tap's mask (mask channel k of the group).

The sampled columns then meet the weight as in a grouped convolution (``num_group``), plus the bias. The backward is
MXNet's: the exact derivative of the forward within each cell of the pixel grid (at a whole-pixel position, the
cell above and to the right, as floor picks), so the data gradient is the adjoint of the sampling, the offset
gradient the slope of the bilinear surface times the column gradient, the mask gradient the unmasked sample times
the column gradient. Arithmetic is in the data's type (float16 in float32).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Geometry(NamedTuple):
    """What the twins and the kernels read: the data's (N, C, H, W), the output's (Ho, Wo), the kernel, stride, pad,
    dilate (pairs), num_group, num_deformable_group, num_filter, and whether a mask modulates the taps (v2)."""
    data_shape: tuple
    out_hw: tuple
    kernel: tuple
    stride: tuple
    pad: tuple
    dilate: tuple
    groups: int
    deformable_groups: int
    num_filter: int
    modulated: bool


class Taps(NamedTuple):
    """Per (n, deformable group, kernel tap, output pixel): the 4 corners' flat indices into H * W (shape
    (N, dg, 4, K, L), corners in the order (y0, x0), (y0, x1), (y1, x0), (y1, x1)), their bilinear weights, and the
    weights whose sums with the corner values give d(sample)/dy and d(sample)/dx. Weights are 0 where a corner is
    not read."""
    index: np.ndarray
    weight: np.ndarray
    dweight_y: np.ndarray
    dweight_x: np.ndarray


def _compute_type(dtype) -> np.dtype:
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def positions(g: Geometry, offset: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    """The sampling points (y, x), each (N, dg, K, Ho, Wo) in type ``t``: the integer grid position plus the offset,
    one rounding (as MXNet adds the offset to the integer position)."""
    n = offset.shape[0]
    kh, kw = g.kernel
    ho, wo = g.out_hw
    off = offset.astype(t, copy=False).reshape(n, g.deformable_groups, kh * kw, 2, ho, wo)
    base_y = (np.arange(ho)[None, :] * g.stride[0] - g.pad[0] + np.arange(kh)[:, None] * g.dilate[0])  # (kh, ho)
    base_x = (np.arange(wo)[None, :] * g.stride[1] - g.pad[1] + np.arange(kw)[:, None] * g.dilate[1])  # (kw, wo)
    by = np.repeat(base_y, kw, axis=0)[:, :, None].astype(t)  # tap k = i * kw + j -> row i
    bx = np.tile(base_x, (kh, 1))[:, None, :].astype(t)
    return by + off[:, :, :, 0], bx + off[:, :, :, 1]


def taps(g: Geometry, offset: np.ndarray, t) -> Taps:
    """The corners and weights of every sampling point under the version's boundary rule (module docstring)."""
    h, w = g.data_shape[2:]
    py, px = positions(g, offset, t)
    one = t.type(1)
    y0, x0 = np.floor(py).astype(np.int64), np.floor(px).astype(np.int64)
    if g.modulated:
        inside = (py > -1) & (px > -1) & (py < h) & (px < w)
        y1, x1 = y0 + 1, x0 + 1
        ly, lx = py - y0.astype(t), px - x0.astype(t)
        ok_y0, ok_y1, ok_x0, ok_x1 = y0 >= 0, y1 <= h - 1, x0 >= 0, x1 <= w - 1
    else:
        inside = (py >= 0) & (px >= 0) & (py < h) & (px < w)
        # the last row (column): both corners are that row, the fraction 0 (MXNet's im2col_bilinear)
        edge_y, edge_x = y0 >= h - 1, x0 >= w - 1
        y1, x1 = np.where(edge_y, y0, y0 + 1), np.where(edge_x, x0, x0 + 1)
        ly = np.where(edge_y, t.type(0), py - y0.astype(t))
        lx = np.where(edge_x, t.type(0), px - x0.astype(t))
        ok_y0 = ok_y1 = ok_x0 = ok_x1 = np.ones(py.shape, bool)
    hy, hx = one - ly, one - lx
    corners = ((y0, x0, ok_y0 & ok_x0, hy * hx, -hx, -hy), (y0, x1, ok_y0 & ok_x1, hy * lx, -lx, hy),
               (y1, x0, ok_y1 & ok_x0, ly * hx, hx, -ly), (y1, x1, ok_y1 & ok_x1, ly * lx, lx, ly))
    index, weight, dwy, dwx = [], [], [], []
    for yy, xx, ok, wt, wy, wx in corners:
        ok = ok & inside
        index.append(np.where(ok, np.clip(yy, 0, h - 1) * w + np.clip(xx, 0, w - 1), 0))
        zero = t.type(0)
        weight.append(np.where(ok, wt, zero))
        dwy.append(np.where(ok, wy, zero))
        dwx.append(np.where(ok, wx, zero))
    stack = lambda a: np.stack(a, axis=2).reshape(a[0].shape[:2] + (4,) + a[0].shape[2:3] + (-1,))  # noqa: E731
    return Taps(stack(index), stack(weight).astype(t, copy=False), stack(dwy).astype(t, copy=False),
                stack(dwx).astype(t, copy=False))


def _corner_values(g: Geometry, x: np.ndarray, tp: Taps) -> np.ndarray:
    """The data at every corner: (N, dg, C/dg, 4, K, L)."""
    n, c, h, w = x.shape
    dg = g.deformable_groups
    xg = x.reshape(n, dg, c // dg, h * w)
    idx = tp.index.reshape(n, dg, 1, -1)
    return np.take_along_axis(xg, idx, axis=3).reshape(n, dg, c // dg, *tp.index.shape[2:])


def _bilinear(v: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """sum over the 4 corners of wt * v, left to right as MXNet adds them; v (..., C/dg, 4, K, L), wt (..., 4, K, L)."""
    wt = wt[:, :, None]
    return ((wt[:, :, :, 0] * v[:, :, :, 0] + wt[:, :, :, 1] * v[:, :, :, 1]) + wt[:, :, :, 2] * v[:, :, :, 2]) \
        + wt[:, :, :, 3] * v[:, :, :, 3]


def _mask(g: Geometry, mask: np.ndarray, t) -> np.ndarray:
    """(N, dg, 1, K, L): broadcast over a group's channels."""
    n = mask.shape[0]
    return mask.astype(t, copy=False).reshape(n, g.deformable_groups, 1, g.kernel[0] * g.kernel[1], -1)


def im2col(g: Geometry, x: np.ndarray, offset: np.ndarray, mask, t):
    """(columns (N, C, K, L) masked, taps, corner values, unmasked samples (N, dg, C/dg, K, L))."""
    tp = taps(g, offset, t)
    v = _corner_values(g, x.astype(t, copy=False), tp)
    s = _bilinear(v, tp.weight)
    col = s * _mask(g, mask, t) if g.modulated else s
    n, c = x.shape[:2]
    return col.reshape(n, c, col.shape[-2], col.shape[-1]), tp, v, s


def _grouped(g: Geometry, weight: np.ndarray, t) -> np.ndarray:
    """The weight (F, C/G, kh, kw) as (G, F/G, C/G * K)."""
    f = weight.shape[0]
    return weight.astype(t, copy=False).reshape(g.groups, f // g.groups, -1)


def forward(g: Geometry, x, offset, mask, weight, bias):
    """(y (N, F, Ho, Wo) in x's type, saved for the backward)."""
    t = _compute_type(x.dtype)
    col, tp, v, s = im2col(g, x, offset, mask, t)
    n = x.shape[0]
    cols = col.reshape(n, g.groups, -1, col.shape[-1])  # (N, G, C/G * K, L)
    y = np.matmul(_grouped(g, weight, t), cols).reshape(n, g.num_filter, *g.out_hw)
    if bias is not None:
        y = y + bias.astype(t, copy=False).reshape(1, -1, 1, 1)
    return y.astype(x.dtype, copy=False), (x, offset, mask, weight, cols, tp, v, s)


def backward(g: Geometry, saved, dy, needs):
    """One gradient per input (data, offset, mask (v2), weight, bias), None where ``needs`` says no (``needs`` in
    that order, the mask's entry only for v2)."""
    x, offset, mask, weight, cols, tp, v, s = saved
    t = _compute_type(x.dtype)
    n, c, h, w = x.shape
    dg, f = g.deformable_groups, g.num_filter
    need = dict(zip(("data", "offset", "mask", "weight", "bias") if g.modulated else
                    ("data", "offset", "weight", "bias"), needs))
    dyg = dy.astype(t, copy=False).reshape(n, g.groups, f // g.groups, -1)  # (N, G, M, L)
    out = dict.fromkeys(need)
    if need["weight"]:
        dw = np.matmul(dyg, np.swapaxes(cols, 2, 3)).sum(axis=0)  # (G, M, C/G * K)
        out["weight"] = dw.reshape(weight.shape).astype(weight.dtype, copy=False)
    if need.get("bias"):
        out["bias"] = dy.astype(t, copy=False).sum(axis=(0, 2, 3)).astype(dy.dtype, copy=False)
    if need["data"] or need["offset"] or need.get("mask"):
        dcol = np.matmul(np.swapaxes(_grouped(g, weight, t), 1, 2), dyg)  # (N, G, C/G * K, L)
        dcol = dcol.reshape(n, dg, c // dg, *tp.index.shape[3:])  # (N, dg, C/dg, K, L)
        dmasked = dcol * _mask(g, mask, t) if g.modulated else dcol
        if need["data"]:
            # each corner's share, scattered back (np.bincount sums the repeats)
            share = dmasked[:, :, :, None] * tp.weight[:, :, None]  # (N, dg, C/dg, 4, K, L)
            plane = (np.arange(n * c).reshape(n, dg, c // dg, 1, 1, 1)) * (h * w)
            flat = (plane + tp.index[:, :, None]).reshape(-1)
            dx = np.bincount(flat, weights=share.reshape(-1).astype(np.float64), minlength=n * c * h * w)
            out["data"] = dx.reshape(x.shape).astype(x.dtype)
        if need["offset"]:
            gy = (dmasked * _bilinear(v, tp.dweight_y)).sum(axis=2)  # (N, dg, K, L)
            gx = (dmasked * _bilinear(v, tp.dweight_x)).sum(axis=2)
            out["offset"] = np.stack([gy, gx], axis=3).reshape(offset.shape).astype(offset.dtype, copy=False)
        if need.get("mask"):
            out["mask"] = (dcol * s).sum(axis=2).reshape(mask.shape).astype(mask.dtype, copy=False)
    return tuple(out[k] for k in need)
