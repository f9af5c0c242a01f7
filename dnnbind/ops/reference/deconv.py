"""Numpy twin of the transposed convolution (MXNet's Deconvolution): 2-D (N, C, H, W) and 3-D (N, C, D, H, W).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check (and its sibling conv twin) only.

The forward is a direct scatter, written independently of conv's im2col: each input pixel adds w[c, f] times
its value into the output window it maps to (stride apart, dilated taps), into an output padded by ``padding``
on both sides and ``adj`` more at the end, then cropped. The backward twins are the convolution's own twins
with roles swapped, as on the GPU: dx = conv(dy, w), dw = conv's filter gradient with x and dy exchanged.
2-D calls are checked by ops._check, 5-D ones by deconv3d_params here.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindValueError
from .. import _check
from .conv import check_groups, conv_backward_filter, conv_forward, shapes_text


def deconv3d_params(op: str, x_shape, w_shape, b_shape=None, stride=1, padding=0, dilation=1, groups=1, adj=0
                    ) -> tuple:
    """Validate a 3-D transposed convolution as ops._check.deconv_params does 2-D; returns (stride, padding,
    dilation, groups, adj, y_shape). x (N, C, D, H, W), w (C, F/groups, T, R, S), b (F,), 0 <= adj < stride."""
    x_shape = _check.check_ndim(op, "x", x_shape, (5,), "5-D (N, C, D, H, W)")
    w_shape = _check.check_ndim(op, "w", w_shape, (5,), "5-D (C, F/groups, T, R, S)")
    shapes = shapes_text(x=x_shape, w=w_shape)
    stride = _check.as_tuple(stride, 3, op, "stride", 1)
    padding = _check.as_tuple(padding, 3, op, "padding", 0)
    dilation = _check.as_tuple(dilation, 3, op, "dilation", 1)
    adj = _check.as_tuple(adj, 3, op, "adj", 0)
    groups = check_groups(op, groups)
    n, c = x_shape[:2]
    if w_shape[0] != c:
        raise DnnbindValueError(f"{op}: x has {c} channels but w expects {w_shape[0]} (w is (in_channels, "
                                f"num_filter/groups, T, R, S)): {shapes}")
    f = w_shape[1] * groups
    if b_shape is not None and tuple(b_shape) != (f,):
        raise DnnbindValueError(f"{op}: b has shape {tuple(b_shape)} but w gives {f} output channels (w.shape[1] * "
                                f"groups); expected b ({f},): {shapes}")
    if any(a >= s for a, s in zip(adj, stride)):
        raise DnnbindValueError(f"{op}: adj {adj} must be smaller than stride {stride}: {shapes}")
    out = tuple((i - 1) * s - 2 * q + d * (k - 1) + 1 + a
                for i, s, q, d, k, a in zip(x_shape[2:], stride, padding, dilation, w_shape[2:], adj))
    if min(out) <= 0:
        raise DnnbindValueError(f"{op}: padding {padding} removes the whole output {out} (stride {stride}, dilation "
                                f"{dilation}, adj {adj}): {shapes}")
    if c % groups:
        raise DnnbindValueError(f"{op}: x has {c} channels, not divisible by groups={groups}: {shapes}")
    return stride, padding, dilation, groups, adj, (n, f) + out


def deconv3d_grad_params(op: str, x_shape, w_shape, dy_shape, stride=1, padding=0, dilation=1, groups=1) -> tuple:
    """deconv3d_params with dy its output for some adj in [0, stride) (read off dy's shape and returned)."""
    stride, padding, dilation, groups, _, base = deconv3d_params(op, x_shape, w_shape, None, stride, padding,
                                                                 dilation, groups, 0)
    dy_shape = _check.check_ndim(op, "dy", dy_shape, (5,), "5-D (N, F, O, P, Q)")
    adj = tuple(d - b for d, b in zip(dy_shape[2:], base[2:]))
    if dy_shape[:2] != base[:2] or not all(0 <= a < s for a, s in zip(adj, stride)):
        raise DnnbindValueError(f"{op}: dy has shape {dy_shape} but the transposed convolution gives {base} (plus "
                                f"adj 0 to stride-1 per axis): {shapes_text(x=x_shape, w=w_shape, dy=dy_shape)} "
                                f"(stride {stride}, padding {padding}, dilation {dilation}, groups {groups})")
    return stride, padding, dilation, groups, adj, dy_shape


def deconv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride=1, padding=0, dilation=1,
                   groups: int = 1, adj=0) -> np.ndarray:
    """y_padded[n, f, i*sh + r*dh, j*sw + s*dw] += x[n, c, i, j] * w[c, f - g*F/groups, r, s] for c in f's group
    g, then y = y_padded cropped by ``padding`` at the start (what is left past it at the end is ``adj``)."""
    x, w = np.asarray(x), np.asarray(w)
    b = None if b is None else np.asarray(b)
    op = "deconv_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, w=w, b=b)
    check = deconv3d_params if x.ndim == 5 else _check.deconv_params
    stride, padding, dilation, groups, adj, y_shape = check(
        op, x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups, adj)
    n, c = x.shape[:2]
    size, fg, kernel = x.shape[2:], w.shape[1], w.shape[2:]
    cg = c // groups
    full = tuple((i - 1) * s + d * (k - 1) + 1 + a for i, s, d, k, a in zip(size, stride, dilation, kernel, adj))
    yp = np.zeros((n, fg * groups) + full, dtype=x.dtype)
    back = (0, len(size) + 1) + tuple(range(1, len(size) + 1))  # (N, *size, Fg) -> (N, Fg, *size)
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        for tap in np.ndindex(*kernel):
            # (N, Cg, *size) x (Cg, Fg) -> (N, *size, Fg): every input pixel's contribution through this tap
            t = np.tensordot(xg, w[(slice(g * cg, (g + 1) * cg), slice(None)) + tap], axes=([1], [0]))
            window = tuple(slice(k * d, k * d + s * (i - 1) + 1, s)
                           for k, d, s, i in zip(tap, dilation, stride, size))
            yp[(slice(None), slice(g * fg, (g + 1) * fg)) + window] += t.transpose(back)
    y = yp[(slice(None), slice(None)) + tuple(slice(q, q + o) for q, o in zip(padding, y_shape[2:]))]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * len(size))
    return np.ascontiguousarray(y)


def deconv_backward_data(w: np.ndarray, dy: np.ndarray, x_shape, stride=1, padding=0, dilation=1,
                         groups: int = 1) -> np.ndarray:
    """dx = conv(dy, w): the convolution that deconv_forward transposes."""
    w, dy = np.asarray(w), np.asarray(dy)
    op = "deconv_backward_data"
    _check.check_dtype(op, _check.FLOAT32_64, w=w, dy=dy)
    x_shape = _check.check_shape_arg(op, "x_shape", x_shape)
    check = deconv3d_grad_params if len(x_shape) == 5 else _check.deconv_grad_params
    stride, padding, dilation, groups, _, _ = check(op, x_shape, w.shape, dy.shape, stride, padding, dilation, groups)
    return conv_forward(dy, w, None, stride, padding, dilation, groups)


def deconv_backward_filter(x: np.ndarray, dy: np.ndarray, w_shape, stride=1, padding=0, dilation=1,
                           groups: int = 1) -> np.ndarray:
    """dw[c, f, r, s] = sum over n, i, j of x[n, c, i, j] * dy_padded[n, f, i*sh + r*dh, j*sw + s*dw]: conv's
    filter gradient with dy as its input and x as its output gradient."""
    x, dy = np.asarray(x), np.asarray(dy)
    op = "deconv_backward_filter"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, dy=dy)
    w_shape = _check.check_shape_arg(op, "w_shape", w_shape)
    check = deconv3d_grad_params if x.ndim == 5 else _check.deconv_grad_params
    stride, padding, dilation, groups, _, _ = check(op, x.shape, w_shape, dy.shape, stride, padding, dilation, groups)
    return conv_backward_filter(dy, x, w_shape, stride, padding, dilation, groups)
