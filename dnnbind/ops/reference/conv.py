"""Numpy twin of the convolution ops and add_tensor.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Convolution is im2col + one matmul per group. The column buffer is laid out (C, R, S, N, P, Q) so that each
group's slice is a single (C/g*R*S, N*P*Q) matrix: one large GEMM instead of N small ones, which is what
makes CPU training of the MNIST CNN practical. Both im2col and col2im loop over the R*S kernel taps and copy
or add one strided slice each (np.add.at would be ~100x slower).

``layout="NHWC"`` (channels last: x (N, H, W, C), w (K, R, S, C/groups), y (N, P, Q, K)) is checked in its own
shapes, then computed on NCHW transposes (w OHWI -> OIHW) and transposed back.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

import numpy as np

from .. import _check


def _tap_slices(r: int, s: int, stride, dilation, p: int, q: int) -> tuple[slice, slice]:
    """Input rows/cols that kernel tap (r, s) reads for all P x Q output positions (padded coordinates)."""
    h0, w0 = r * dilation[0], s * dilation[1]
    return (slice(h0, h0 + stride[0] * (p - 1) + 1, stride[0]),
            slice(w0, w0 + stride[1] * (q - 1) + 1, stride[1]))


def _im2col(x: np.ndarray, r: int, s: int, stride, padding, dilation, p: int, q: int) -> np.ndarray:
    """x (N, C, H, W) -> columns (C, R, S, N, P, Q)."""
    n, c, h, w = x.shape
    xt = x.transpose(1, 0, 2, 3)
    if padding != (0, 0):
        xp = np.zeros((c, n, h + 2 * padding[0], w + 2 * padding[1]), dtype=x.dtype)
        xp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w] = xt
    else:
        xp = np.ascontiguousarray(xt)
    cols = np.empty((c, r, s, n, p, q), dtype=x.dtype)
    for i in range(r):
        for j in range(s):
            si, sj = _tap_slices(i, j, stride, dilation, p, q)
            cols[:, i, j] = xp[:, :, si, sj]
    return cols


def _col2im(cols: np.ndarray, x_shape, stride, padding, dilation) -> np.ndarray:
    """Adjoint of _im2col: columns (C, R, S, N, P, Q) -> x (N, C, H, W), overlapping taps summed."""
    n, c, h, w = x_shape
    _, r, s, _, p, q = cols.shape
    xp = np.zeros((c, n, h + 2 * padding[0], w + 2 * padding[1]), dtype=cols.dtype)
    for i in range(r):
        for j in range(s):
            si, sj = _tap_slices(i, j, stride, dilation, p, q)
            xp[:, :, si, sj] += cols[:, i, j]
    xp = xp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
    return np.ascontiguousarray(xp.transpose(1, 0, 2, 3))


def _nchw(a: np.ndarray) -> np.ndarray:
    """(N, H, W, C) -> (N, C, H, W) view; a weight (K, R, S, C) -> (K, C, R, S)."""
    return a.transpose(0, 3, 1, 2)


def _nhwc(a: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> contiguous (N, H, W, C); a weight (K, C, R, S) -> (K, R, S, C)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _dy_matrix(dy: np.ndarray, groups: int) -> np.ndarray:
    """dy (N, K, P, Q) -> (groups, K/groups, N*P*Q), the layout of the forward GEMM's output."""
    n, k, p, q = dy.shape
    return np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(groups, k // groups, n * p * q)


@_check.float16_via_float32
def conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride=1, padding=0, dilation=1,
                 groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """y[n, k] = sum over c in k's group, r, s of x_padded[n, c, p*sh + r*dh, q*sw + s*dw] * w[k, c, r, s] + b[k]."""
    x, w = np.asarray(x), np.asarray(w)
    b = None if b is None else np.asarray(b)
    _check.check_dtype("conv_forward", _check.FLOAT32_64, x=x, w=w, b=b)
    stride, padding, dilation, groups, y_shape = _check.conv_params(
        "conv_forward", x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups, layout)
    if layout == "NHWC":
        return _nhwc(conv_forward(_nchw(x), _nchw(w), b, stride, padding, dilation, groups))
    n, k, p, q = y_shape
    _, cg, r, s = w.shape
    cols = _im2col(x, r, s, stride, padding, dilation, p, q).reshape(groups, cg * r * s, n * p * q)
    y = np.matmul(w.reshape(groups, k // groups, cg * r * s), cols)
    y = y.reshape(k, n, p, q).transpose(1, 0, 2, 3)
    if b is not None:
        y = y + b.reshape(1, k, 1, 1)
    return np.ascontiguousarray(y)


@_check.float16_via_float32
def conv_backward_data(w: np.ndarray, dy: np.ndarray, x_shape, stride=1, padding=0, dilation=1,
                       groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """dx = the adjoint of conv_forward in x, applied to dy."""
    w, dy = np.asarray(w), np.asarray(dy)
    op = "conv_backward_data"
    _check.check_dtype(op, _check.FLOAT32_64, w=w, dy=dy)
    x_shape = _check.check_shape_arg(op, "x_shape", x_shape)
    stride, padding, dilation, groups, _ = _check.conv_grad_params(
        op, x_shape, w.shape, dy.shape, stride, padding, dilation, groups, layout)
    if layout == "NHWC":
        return _nhwc(conv_backward_data(_nchw(w), _nchw(dy), _check.to_nchw(x_shape, layout), stride, padding,
                                        dilation, groups))
    n, k, p, q = dy.shape
    _, cg, r, s = w.shape
    wg = w.reshape(groups, k // groups, cg * r * s)
    dcols = np.matmul(wg.transpose(0, 2, 1), _dy_matrix(dy, groups))
    return _col2im(dcols.reshape(cg * groups, r, s, n, p, q), x_shape, stride, padding, dilation)


@_check.float16_via_float32
def conv_backward_filter(x: np.ndarray, dy: np.ndarray, w_shape, stride=1, padding=0, dilation=1,
                         groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] * x_padded[n, c, p*sh + r*dh, q*sw + s*dw]."""
    x, dy = np.asarray(x), np.asarray(dy)
    op = "conv_backward_filter"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, dy=dy)
    w_shape = _check.check_shape_arg(op, "w_shape", w_shape)
    stride, padding, dilation, groups, _ = _check.conv_grad_params(
        op, x.shape, w_shape, dy.shape, stride, padding, dilation, groups, layout)
    if layout == "NHWC":
        return _nhwc(conv_backward_filter(_nchw(x), _nchw(dy), _check.to_nchw(w_shape, layout), stride, padding,
                                          dilation, groups))
    n, _, p, q = dy.shape
    _, cg, r, s = w_shape
    cols = _im2col(x, r, s, stride, padding, dilation, p, q).reshape(groups, cg * r * s, n * p * q)
    dw = np.matmul(_dy_matrix(dy, groups), cols.transpose(0, 2, 1))
    return np.ascontiguousarray(dw.reshape(w_shape))


@_check.float16_via_float32
def conv_backward_bias(dy: np.ndarray, layout: str = "NCHW") -> np.ndarray:
    """db[k] = sum of dy[:, k] (of dy[..., k] for NHWC)."""
    dy = np.asarray(dy)
    _check.check_dtype("conv_backward_bias", _check.FLOAT32_64, dy=dy)
    _check.conv_bias_params("conv_backward_bias", dy.shape, layout)
    return dy.sum(axis=(0, 2, 3) if layout == "NCHW" else (0, 1, 2))


@_check.float16_via_float32
def bias_relu_backward(y: np.ndarray, dy: np.ndarray, layout: str = "NCHW") -> tuple[np.ndarray, np.ndarray]:
    """The backward of y = relu(z + b) (a fused convolution's bias and ReLU) up to z: (dz, db), dz = dy where
    y > 0 and 0 elsewhere (a NaN y counts as not positive, and a NaN dy where y <= 0 is dropped: dy is routed,
    not multiplied), db = conv_backward_bias(dz)."""
    y, dy = np.asarray(y), np.asarray(dy)
    op = "bias_relu_backward"
    _check.check_dtype(op, _check.FLOAT32_64, y=y, dy=dy)
    _check.conv_bias_params(op, dy.shape, layout)
    _check.check_same_shape(op, y=y, dy=dy)
    dz = np.where(y > 0, dy, dy.dtype.type(0))
    return dz, dz.sum(axis=(0, 2, 3) if layout == "NCHW" else (0, 1, 2))


WGRAD_MAX_TAPS = 32  # bias_relu_wgrad: at most this many filter taps C*R*S (the GPU kernel keeps one sum per tap)


def bias_relu_wgrad_params(op: str, x_shape, w_shape, y_shape, dy_shape, stride=1, padding=0, dilation=1,
                           layout="NCHW"):
    """Validate bias_relu_wgrad (shared by the GPU op and this twin); returns (stride, padding, dilation,
    w_shape, taps). x, w as conv_forward's (groups == 1 only); y and dy the convolution's output shape."""
    w_shape = _check.check_shape_arg(op, "w_shape", w_shape)
    layout = _check.conv_layout(op, layout)
    nhwc = layout == "NHWC"
    x_shape = _check.check_ndim(op, "x", x_shape, (4,), "4-D (N, H, W, C) (layout NHWC)" if nhwc else
                                "4-D (N, C, H, W)")
    w_shape = _check.check_ndim(op, "w_shape", w_shape, (4,), "4-D (K, R, S, C) (layout NHWC)" if nhwc else
                                "4-D (K, C, R, S)")
    k, cw, r, s = _check.to_nchw(w_shape, layout)
    c = _check.to_nchw(x_shape, layout)[1]
    if cw != c:  # the one place a grouped convolution's weight would pass the other checks
        raise DnnbindValueError(f"{op}: x has {c} channels but w_shape {w_shape} has {cw}; only ungrouped convolutions "
                         f"(groups=1) are supported: x {x_shape}, w_shape {w_shape} (layout {layout})")
    stride, padding, dilation, _, want = _check.conv_params(op, x_shape, w_shape, None, stride, padding, dilation,
                                                            1, layout)
    axes = "(N, P, Q, K) (layout NHWC)" if nhwc else "(N, K, P, Q)"
    y_shape = _check.check_ndim(op, "y", y_shape, (4,), f"4-D {axes}")
    dy_shape = _check.check_ndim(op, "dy", dy_shape, (4,), f"4-D {axes}")
    _check.check_same_shape(op, y=y_shape, dy=dy_shape)
    if y_shape != want:
        raise DnnbindValueError(f"{op}: y has shape {y_shape} but the convolution gives {want}: x {x_shape}, w_shape "
                         f"{w_shape}, y {y_shape} (stride {stride}, padding {padding}, dilation {dilation}, "
                         f"layout {layout})")
    taps = c * r * s
    if taps > WGRAD_MAX_TAPS:
        raise DnnbindValueError(f"{op}: w_shape {w_shape} has C*R*S = {c}*{r}*{s} = {taps} taps; at most "
                         f"{WGRAD_MAX_TAPS} (use conv_backward_filter and conv_backward_bias)")
    return stride, padding, dilation, w_shape, taps


@_check.float16_via_float32
def bias_relu_wgrad(x: np.ndarray, y: np.ndarray, dy: np.ndarray, w_shape, stride=1, padding=0, dilation=1,
                    layout: str = "NCHW") -> tuple[np.ndarray, np.ndarray]:
    """The weight and bias gradients of y = relu(conv(x, w) + b) (groups 1): dz = dy where y > 0 else 0 (the
    rules of bias_relu_backward), dw = conv_backward_filter(x, dz), db = the per-channel sum of dz. At most
    WGRAD_MAX_TAPS filter taps, as the GPU op (the same checks, so a call fails alike on both backends)."""
    x, y, dy = np.asarray(x), np.asarray(y), np.asarray(dy)
    op = "bias_relu_wgrad"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, y=y, dy=dy)
    stride, padding, dilation, w_shape, _ = bias_relu_wgrad_params(op, x.shape, w_shape, y.shape, dy.shape, stride,
                                                                   padding, dilation, layout)
    dz = np.where(y > 0, dy, dy.dtype.type(0))
    dw = conv_backward_filter(x, dz, w_shape, stride, padding, dilation, 1, layout)
    return dw, dz.sum(axis=(0, 2, 3) if layout == "NCHW" else (0, 1, 2))


@_check.float16_via_float32
def add_tensor(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x + b, b (C,) broadcast over x (N, C, ...) or b the same shape as x. Returns a new array."""
    x, b = np.asarray(x), np.asarray(b)
    _check.check_dtype("add_tensor", _check.FLOAT32_64, x=x, b=b)
    b_shape = _check.add_tensor_params("add_tensor", x.shape, b.shape)
    return x + b.reshape(b_shape)
