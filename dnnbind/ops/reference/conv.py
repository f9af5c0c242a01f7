"""Numpy twin of the convolution ops and add_tensor: 2-D (N, C, H, W) and 3-D (N, C, D, H, W).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Convolution is im2col + one matmul per group. The column buffer is laid out (C, R, S, N, P, Q) so that each
group's slice is a single (C/g*R*S, N*P*Q) matrix: one large GEMM instead of N small ones, which is what
makes CPU training of the MNIST CNN practical. Both im2col and col2im loop over the kernel taps (R*S, or T*R*S for
3-D data) and copy or add one strided slice each (np.add.at would be ~100x slower). 2-D calls are checked by
ops._check; 5-D data (3-D convolution, channels first only) by conv3d_params here.

``layout="NHWC"`` (channels last: x (N, H, W, C), w (K, R, S, C/groups), y (N, P, Q, K)) is checked in its own
shapes, then computed on NCHW transposes (w OHWI -> OIHW) and transposed back.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from .. import _check


def _tap_slices(tap: tuple, stride, dilation, out) -> tuple:
    """Input slices (one per spatial axis, padded coordinates) that kernel tap ``tap`` reads for all output
    positions ``out``."""
    return tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, s, d, o in zip(tap, stride, dilation, out))


def _pad_channels_first(xt: np.ndarray, padding) -> np.ndarray:
    """(C, N, *S) -> (C, N, *(S + 2 pad)), zeros around (a contiguous copy either way)."""
    if not any(padding):
        return np.ascontiguousarray(xt)
    size = xt.shape[2:]
    xp = np.zeros(xt.shape[:2] + tuple(s + 2 * q for s, q in zip(size, padding)), dtype=xt.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(q, q + s) for q, s in zip(padding, size))] = xt
    return xp


def _im2col(x: np.ndarray, kernel: tuple, stride, padding, dilation, out: tuple) -> np.ndarray:
    """x (N, C, *S) -> columns (C, *kernel, N, *out): (C, R, S, N, P, Q) in 2-D, (C, T, R, S, N, O, P, Q) in 3-D."""
    n, c = x.shape[:2]
    xp = _pad_channels_first(x.swapaxes(0, 1), padding)
    cols = np.empty((c,) + tuple(kernel) + (n,) + tuple(out), dtype=x.dtype)
    every = (slice(None), slice(None))
    for tap in np.ndindex(*kernel):
        cols[(slice(None),) + tap] = xp[every + _tap_slices(tap, stride, dilation, out)]
    return cols


def _col2im(cols: np.ndarray, x_shape, stride, padding, dilation) -> np.ndarray:
    """Adjoint of _im2col: columns (C, *kernel, N, *out) -> x (N, C, *S), overlapping taps summed."""
    n, c = x_shape[:2]
    size = tuple(x_shape[2:])
    dims = len(size)
    kernel, out = cols.shape[1:1 + dims], cols.shape[2 + dims:]
    xp = np.zeros((c, n) + tuple(s + 2 * q for s, q in zip(size, padding)), dtype=cols.dtype)
    every = (slice(None), slice(None))
    for tap in np.ndindex(*kernel):
        xp[every + _tap_slices(tap, stride, dilation, out)] += cols[(slice(None),) + tap]
    xp = xp[every + tuple(slice(q, q + s) for q, s in zip(padding, size))]
    return np.ascontiguousarray(xp.swapaxes(0, 1))


def as_nchw(a: np.ndarray) -> np.ndarray:
    """(N, H, W, C) -> (N, C, H, W) view; a weight (K, R, S, C) -> (K, C, R, S)."""
    return a.transpose(0, 3, 1, 2)


def as_nhwc(a: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> contiguous (N, H, W, C); a weight (K, C, R, S) -> (K, R, S, C)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _dy_matrix(dy: np.ndarray, groups: int) -> np.ndarray:
    """dy (N, K, *out) -> (groups, K/groups, N*prod(out)), the layout of the forward GEMM's output."""
    k = dy.shape[1]
    return np.ascontiguousarray(dy.swapaxes(0, 1)).reshape(groups, k // groups, -1)


# -- 3-D (N, C, D, H, W): checked here (ops._check covers 2-D), computed by the same N-d code --------------------

LAYOUTS_3D = ("NCHW", "NCDHW")  # the ops' default layout names channels first; 3-D data is channels first only


def conv3d_layout(op: str, layout) -> None:
    """3-D convolution is channels first only: MXNet 1.9.1 parses layout='NDHWC' but its CPU kernels fail on it
    ("could not create a descriptor for a dilated convolution forward propagation primitive")."""
    if layout not in LAYOUTS_3D:
        raise DnnbindValueError(f"{op}: 3-D convolution takes layout 'NCDHW' (data (N, C, D, H, W)), got {layout!r}; "
                                "channels-last 3-D convolution is not supported (MXNet 1.9.1's CPU kernels refuse "
                                "it too)")


def shapes_text(**shapes) -> str:
    """The given shapes for an error message, None skipped: ``x (2, 3, 8, 8), w (4, 3, 3, 3)``."""
    return ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items() if v is not None)


def check_groups(op: str, groups) -> int:
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, (int, np.integer)):
        raise DnnbindTypeError(f"{op}: groups must be an int, got {groups!r}")
    if groups < 1:
        raise DnnbindValueError(f"{op}: groups must be >= 1, got {groups}")
    return int(groups)


def conv3d_params(op: str, x_shape, w_shape, b_shape=None, stride=1, padding=0, dilation=1, groups=1,
                  layout="NCDHW") -> tuple:
    """Validate a 3-D convolution; returns (stride, padding, dilation, groups, y_shape) as conv_params (ops._check)
    does for 2-D. x (N, C, D, H, W), w (K, C/groups, T, R, S), b (K,), y (N, K, O, P, Q)."""
    conv3d_layout(op, layout)
    x_shape = _check.check_ndim(op, "x", x_shape, (5,), "5-D (N, C, D, H, W)")
    w_shape = _check.check_ndim(op, "w", w_shape, (5,), "5-D (K, C/groups, T, R, S)")
    shapes = shapes_text(x=x_shape, w=w_shape)
    stride = _check.as_tuple(stride, 3, op, "stride", 1)
    padding = _check.as_tuple(padding, 3, op, "padding", 0)
    dilation = _check.as_tuple(dilation, 3, op, "dilation", 1)
    groups = check_groups(op, groups)
    n, c = x_shape[:2]
    k, cg = w_shape[:2]
    if c % groups:
        raise DnnbindValueError(f"{op}: x has {c} channels, not divisible by groups={groups}: {shapes}")
    if k % groups:
        raise DnnbindValueError(f"{op}: w has {k} output channels, not divisible by groups={groups}: {shapes}")
    if cg * groups != c:
        raise DnnbindValueError(f"{op}: x has {c} channels but w expects {cg * groups} (groups={groups}): {shapes}")
    if b_shape is not None and tuple(b_shape) != (k,):
        raise DnnbindValueError(f"{op}: b has shape {tuple(b_shape)} but w has {k} output channels; expected b "
                                f"({k},): {shapes}")
    span = tuple(d * (r - 1) + 1 for d, r in zip(dilation, w_shape[2:]))
    padded = tuple(s + 2 * q for s, q in zip(x_shape[2:], padding))
    if any(e > s for e, s in zip(span, padded)):
        raise DnnbindValueError(f"{op}: kernel {w_shape[2:]} with dilation {dilation} spans {span}, larger than the "
                                f"padded input {padded} (padding {padding}): {shapes}")
    out = tuple((s - e) // st + 1 for s, e, st in zip(padded, span, stride))
    return stride, padding, dilation, groups, (n, k) + out


def conv3d_grad_params(op: str, x_shape, w_shape, dy_shape, stride=1, padding=0, dilation=1, groups=1,
                       layout="NCDHW") -> tuple:
    """conv3d_params, plus dy must have the forward output's shape."""
    out = conv3d_params(op, x_shape, w_shape, None, stride, padding, dilation, groups, layout)
    dy_shape = _check.check_ndim(op, "dy", dy_shape, (5,), "5-D (N, K, O, P, Q)")
    if dy_shape != out[4]:
        raise DnnbindValueError(f"{op}: dy has shape {dy_shape} but the convolution gives {out[4]}: "
                                f"{shapes_text(x=x_shape, w=w_shape, dy=dy_shape)} (stride {out[0]}, padding "
                                f"{out[1]}, dilation {out[2]}, groups {out[3]})")
    return out


def conv3d_bias_params(op: str, dy_shape, layout="NCDHW") -> int:
    """conv_backward_bias of a 3-D convolution: dy is (N, K, O, P, Q); returns K."""
    conv3d_layout(op, layout)
    return _check.check_ndim(op, "dy", dy_shape, (5,), "5-D (N, K, O, P, Q)")[1]


# -- the ops: 2-D (NCHW, NHWC) checked by ops._check, 3-D (NCDHW) by conv3d_params; one N-d computation ----------

def _forward(x, w, b, stride, padding, dilation, groups, y_shape) -> np.ndarray:
    n, k = y_shape[:2]
    out = y_shape[2:]
    cg, kernel = w.shape[1], w.shape[2:]
    taps = cg * int(np.prod(kernel))
    cols = _im2col(x, kernel, stride, padding, dilation, out).reshape(groups, taps, -1)
    y = np.matmul(w.reshape(groups, k // groups, taps), cols)
    y = y.reshape((k, n) + tuple(out)).swapaxes(0, 1)
    if b is not None:
        y = y + b.reshape((1, k) + (1,) * len(out))
    return np.ascontiguousarray(y)


@_check.float16_via_float32
def conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride=1, padding=0, dilation=1,
                 groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """y[n, k] = sum over c in k's group, r, s of x_padded[n, c, p*sh + r*dh, q*sw + s*dw] * w[k, c, r, s] + b[k]
    (the same over (t, r, s) for 5-D x (N, C, D, H, W))."""
    x, w = np.asarray(x), np.asarray(w)
    b = None if b is None else np.asarray(b)
    _check.check_dtype("conv_forward", _check.FLOAT32_64, x=x, w=w, b=b)
    b_shape = None if b is None else b.shape
    if x.ndim == 5:
        stride, padding, dilation, groups, y_shape = conv3d_params(
            "conv_forward", x.shape, w.shape, b_shape, stride, padding, dilation, groups, layout)
        return _forward(x, w, b, stride, padding, dilation, groups, y_shape)
    stride, padding, dilation, groups, y_shape = _check.conv_params(
        "conv_forward", x.shape, w.shape, b_shape, stride, padding, dilation, groups, layout)
    if layout == "NHWC":
        return as_nhwc(conv_forward(as_nchw(x), as_nchw(w), b, stride, padding, dilation, groups))
    return _forward(x, w, b, stride, padding, dilation, groups, y_shape)


@_check.float16_via_float32
def conv_backward_data(w: np.ndarray, dy: np.ndarray, x_shape, stride=1, padding=0, dilation=1,
                       groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """dx = the adjoint of conv_forward in x, applied to dy."""
    w, dy = np.asarray(w), np.asarray(dy)
    op = "conv_backward_data"
    _check.check_dtype(op, _check.FLOAT32_64, w=w, dy=dy)
    x_shape = _check.check_shape_arg(op, "x_shape", x_shape)
    if len(x_shape) == 5:
        stride, padding, dilation, groups, _ = conv3d_grad_params(op, x_shape, w.shape, dy.shape, stride, padding,
                                                                  dilation, groups, layout)
    else:
        stride, padding, dilation, groups, _ = _check.conv_grad_params(
            op, x_shape, w.shape, dy.shape, stride, padding, dilation, groups, layout)
        if layout == "NHWC":
            return as_nhwc(conv_backward_data(as_nchw(w), as_nchw(dy), _check.to_nchw(x_shape, layout), stride,
                                              padding, dilation, groups))
    k, cg = w.shape[:2]
    kernel = w.shape[2:]
    wg = w.reshape(groups, k // groups, -1)
    dcols = np.matmul(wg.transpose(0, 2, 1), _dy_matrix(dy, groups))
    cols_shape = (cg * groups,) + tuple(kernel) + (dy.shape[0],) + tuple(dy.shape[2:])
    return _col2im(dcols.reshape(cols_shape), x_shape, stride, padding, dilation)


@_check.float16_via_float32
def conv_backward_filter(x: np.ndarray, dy: np.ndarray, w_shape, stride=1, padding=0, dilation=1,
                         groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] * x_padded[n, c, p*sh + r*dh, q*sw + s*dw] (and over
    o of the depth axis for 5-D x)."""
    x, dy = np.asarray(x), np.asarray(dy)
    op = "conv_backward_filter"
    _check.check_dtype(op, _check.FLOAT32_64, x=x, dy=dy)
    w_shape = _check.check_shape_arg(op, "w_shape", w_shape)
    if x.ndim == 5:
        stride, padding, dilation, groups, _ = conv3d_grad_params(op, x.shape, w_shape, dy.shape, stride, padding,
                                                                  dilation, groups, layout)
    else:
        stride, padding, dilation, groups, _ = _check.conv_grad_params(
            op, x.shape, w_shape, dy.shape, stride, padding, dilation, groups, layout)
        if layout == "NHWC":
            return as_nhwc(conv_backward_filter(as_nchw(x), as_nchw(dy), _check.to_nchw(w_shape, layout), stride,
                                                padding, dilation, groups))
    cg, kernel = w_shape[1], w_shape[2:]
    cols = _im2col(x, kernel, stride, padding, dilation, dy.shape[2:]).reshape(groups, cg * int(np.prod(kernel)),
                                                                               -1)
    dw = np.matmul(_dy_matrix(dy, groups), cols.transpose(0, 2, 1))
    return np.ascontiguousarray(dw.reshape(w_shape))


@_check.float16_via_float32
def conv_backward_bias(dy: np.ndarray, layout: str = "NCHW") -> np.ndarray:
    """db[k] = sum of dy[:, k] (of dy[..., k] for NHWC)."""
    dy = np.asarray(dy)
    _check.check_dtype("conv_backward_bias", _check.FLOAT32_64, dy=dy)
    if dy.ndim == 5:  # (N, K, O, P, Q)
        conv3d_bias_params("conv_backward_bias", dy.shape, layout)
        return dy.sum(axis=(0, 2, 3, 4))
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
