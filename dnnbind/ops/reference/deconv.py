"""Numpy twin of the transposed convolution (MXNet's Deconvolution).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check (and its sibling conv twin) only.

The forward is a direct scatter, written independently of conv's im2col: each input pixel adds w[c, f] times
its value into the output window it maps to (stride apart, dilated taps), into an output padded by ``padding``
on both sides and ``adj`` more at the end, then cropped. The backward twins are the convolution's own twins
with roles swapped, as on the GPU: dx = conv(dy, w), dw = conv's filter gradient with x and dy exchanged.
"""

from __future__ import annotations

import numpy as np

from .. import _check
from .conv import conv_backward_filter, conv_forward


def deconv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride=1, padding=0, dilation=1,
                   groups: int = 1, adj=0) -> np.ndarray:
    """y_padded[n, f, i*sh + r*dh, j*sw + s*dw] += x[n, c, i, j] * w[c, f - g*F/groups, r, s] for c in f's group
    g, then y = y_padded cropped by ``padding`` at the start (what is left past it at the end is ``adj``)."""
    x, w = np.asarray(x), np.asarray(w)
    b = None if b is None else np.asarray(b)
    op = "deconv_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, w=w, b=b)
    stride, padding, dilation, groups, adj, y_shape = _check.deconv_params(
        op, x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups, adj)
    n, c, h, wd = x.shape
    _, fg, r, s = w.shape
    cg = c // groups
    full = ((h - 1) * stride[0] + dilation[0] * (r - 1) + 1 + adj[0],
            (wd - 1) * stride[1] + dilation[1] * (s - 1) + 1 + adj[1])
    yp = np.zeros((n, fg * groups) + full, dtype=x.dtype)
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        for i in range(r):
            for j in range(s):
                # (N, Cg, H, W) x (Cg, Fg) -> (N, H, W, Fg): every input pixel's contribution through tap (i, j)
                t = np.tensordot(xg, w[g * cg:(g + 1) * cg, :, i, j], axes=([1], [0]))
                h0, w0 = i * dilation[0], j * dilation[1]
                yp[:, g * fg:(g + 1) * fg, h0:h0 + stride[0] * (h - 1) + 1:stride[0],
                   w0:w0 + stride[1] * (wd - 1) + 1:stride[1]] += t.transpose(0, 3, 1, 2)
    y = yp[:, :, padding[0]:padding[0] + y_shape[2], padding[1]:padding[1] + y_shape[3]]
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return np.ascontiguousarray(y)


def deconv_backward_data(w: np.ndarray, dy: np.ndarray, x_shape, stride=1, padding=0, dilation=1,
                         groups: int = 1) -> np.ndarray:
    """dx = conv(dy, w): the convolution that deconv_forward transposes."""
    w, dy = np.asarray(w), np.asarray(dy)
    op = "deconv_backward_data"
    _check.check_dtype(op, _check.FLOAT32_64, w=w, dy=dy)
    x_shape = _check.check_shape_arg(op, "x_shape", x_shape)
    stride, padding, dilation, groups, _, _ = _check.deconv_grad_params(
        op, x_shape, w.shape, dy.shape, stride, padding, dilation, groups)
    return conv_forward(dy, w, None, stride, padding, dilation, groups)


def deconv_backward_filter(x: np.ndarray, dy: np.ndarray, w_shape, stride=1, padding=0, dilation=1,
                           groups: int = 1) -> np.ndarray:
    """dw[c, f, r, s] = sum over n, i, j of x[n, c, i, j] * dy_padded[n, f, i*sh + r*dh, j*sw + s*dw]: conv's
    filter gradient with dy as its input and x as its output gradient."""
    x, dy = np.asarray(x), np.asarray(dy)
    op = "deconv_backward_filter"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, dy=dy)
    w_shape = _check.check_shape_arg(op, "w_shape", w_shape)
    stride, padding, dilation, groups, _, _ = _check.deconv_grad_params(
        op, x.shape, w_shape, dy.shape, stride, padding, dilation, groups)
    return conv_backward_filter(dy, x, w_shape, stride, padding, dilation, groups)
