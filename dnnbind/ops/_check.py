"""Argument normalization and validation shared by the GPU ops and their numpy twins.

Layer: dnnbind/ops. Imports numpy and the standard library only, nothing of dnnbind, so both backends
(and their tests) can call it without touching a GPU.

Every function takes the op's public name first and raises ValueError (bad shape or value) or TypeError
(bad type or dtype) whose message starts with that name, shows the shapes involved and says what was
expected. Because the GPU op and its numpy twin call the same function before any work, a bad call fails
the same way on both backends. Arrays are anything with `.shape` and `.dtype` (numpy or NDArray); shape
arguments are tuples. Only `check_label_values` reads array contents, and only the CPU path calls it
(reading labels back from the GPU would cost a synchronization).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers
from typing import Any

import numpy as np

# The float dtypes, named once for every op and its twin.
# FLOAT_DTYPES: every float dtype an NDArray holds; what the cuDNN ops take (float16 computes in float32).
# FLOAT32_64: where float16 has no path: cuBLAS's S/D routines, the NVRTC loss kernels, the numpy twins.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
FLOAT32_64 = (np.dtype(np.float32), np.dtype(np.float64))

ACTIVATION_MODES = ("relu", "sigmoid", "tanh", "clipped_relu", "elu")
POOLING_MODES = ("max", "avg", "avg_exclude_pad")
SOFTMAX_ALGORITHMS = ("accurate", "log")
SOFTMAX_MODES = ("instance", "channel")

Pair = tuple[int, int]


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(a) if isinstance(a, (tuple, list)) else tuple(a.shape)


def _fmt(**shapes: Any) -> str:
    return ", ".join(f"{name} {_shape(s)}" for name, s in shapes.items() if s is not None)


def _is_int(v: Any) -> bool:
    # bool is an int subclass, but stride=True is always a mistake. `type(v) is int` first: the hot path.
    return type(v) is int or (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)))


def as_tuple(value: Any, n: int = 2, op: str = "", name: str = "value", minimum: int | None = None
             ) -> tuple[int, ...]:
    """An int (repeated ``n`` times) or a tuple/list of ``n`` ints, as a tuple of ints, each at least ``minimum``
    (if given). TypeError for anything else (floats, bools, strings, another length), ValueError below minimum.
    ``op`` and ``name`` start the message: "conv_forward: stride must be ..."."""
    if type(value) is tuple and len(value) == n:  # the hot path: ops call this with normalized tuples
        for v in value:
            if type(v) is not int or (minimum is not None and v < minimum):
                break
        else:
            return value
    if _is_int(value):
        out = (int(value),) * n
    elif isinstance(value, (tuple, list)) and len(value) == n and all(_is_int(v) for v in value):
        out = tuple(int(v) for v in value)
    else:
        what = "an (h, w) pair of ints" if n == 2 else f"a tuple of {n} ints"
        raise DnnbindTypeError(f"{op + ': ' if op else ''}{name} must be an int or {what}, got {value!r}")
    if minimum is not None and min(out) < minimum:
        raise DnnbindValueError(f"{op + ': ' if op else ''}{name} must be >= {minimum}, got {value!r}")
    return out


def scalar(op: str, name: str, value: Any) -> float:
    """A finite real number (alpha, beta, coef, fill value)."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"{op}: {name} must be a real number, got {value!r}")
    if not np.isfinite(value):
        raise DnnbindValueError(f"{op}: {name} must be finite, got {value!r}")
    return float(value)


def check_ndim(op: str, name: str, shape: Any, ndims: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """Require len(shape) in `ndims` and every dimension > 0; `layout` names the expected axes."""
    shape = _shape(shape)
    if len(shape) not in ndims:
        raise DnnbindValueError(f"{op}: {name} must be {layout}, got shape {shape}")
    if any(d <= 0 for d in shape):
        raise DnnbindValueError(f"{op}: {name} has an empty dimension: {name} {shape}")
    return shape


def check_shape_arg(op: str, name: str, shape: Any) -> tuple[int, ...]:
    """A shape passed as an argument (x_shape, w_shape): a tuple or list of ints."""
    if not isinstance(shape, (tuple, list)) or not all(_is_int(d) for d in shape):
        raise DnnbindTypeError(f"{op}: {name} must be a tuple of ints, got {shape!r}")
    return tuple(int(d) for d in shape)


def check_dtype(op: str, allowed: tuple = FLOAT32_64, **arrays: Any) -> np.dtype:
    """All given arrays (None skipped) share one dtype from `allowed`; returns it."""
    first = None
    for a in arrays.values():  # hot path: every array already has the same allowed dtype
        if a is None:
            continue
        if first is None:
            first = a.dtype
            if first not in allowed:
                break
        elif a.dtype != first:
            break
    else:
        if first is not None:
            return first
    allowed = tuple(np.dtype(d) for d in allowed)
    given = {name: np.dtype(a.dtype) for name, a in arrays.items() if a is not None}
    for name, dt in given.items():
        if dt not in allowed:
            names = ", ".join(d.name for d in allowed)
            raise DnnbindTypeError(f"{op}: {name} has dtype {dt.name}; expected one of {names}")
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{name} {dt.name}" for name, dt in given.items())
        raise DnnbindTypeError(f"{op}: dtypes differ ({listed}); all inputs must have the same dtype")
    return next(iter(given.values()))


def check_same_shape(op: str, **arrays: Any) -> tuple[int, ...]:
    """All given arrays (or shapes) have one shape; returns it."""
    shapes = {name: _shape(a) for name, a in arrays.items() if a is not None}
    if len(set(shapes.values())) > 1:
        raise DnnbindValueError(f"{op}: shapes differ ({_fmt(**shapes)}); expected the same shape")
    return next(iter(shapes.values()))


def _out_size(size: int, pad: int, extent: int, stride: int) -> int:
    """floor((size + 2*pad - extent) / stride) + 1, or 0 when the window does not fit at all."""
    span = size + 2 * pad - extent
    return span // stride + 1 if span >= 0 else 0


# -- convolution ------------------------------------------------------------------------------------------

def conv_layout(op: str, layout: Any) -> str:
    """'NCHW', or 'NHWC' (channels last: data (N, H, W, C), conv weight (K, R, S, C/groups), MXNet's "OHWI")."""
    if layout == "NCHW" or layout == "NHWC":
        return layout
    if not isinstance(layout, str):
        raise DnnbindTypeError(f"{op}: layout must be a string, 'NCHW' or 'NHWC'; got {layout!r}")
    raise DnnbindValueError(f"{op}: unknown layout {layout!r}; expected 'NCHW' or 'NHWC'")


def to_nchw(shape: tuple, layout: str) -> tuple:
    """A 4-D shape in ``layout`` as (N, C, H, W) (a weight (K, R, S, C) as (K, C, R, S))."""
    return tuple(shape) if layout == "NCHW" else (shape[0], shape[3], shape[1], shape[2])


def from_nchw(shape: tuple, layout: str) -> tuple:
    """The inverse of to_nchw: (N, C, H, W) in ``layout``."""
    return tuple(shape) if layout == "NCHW" else (shape[0], shape[2], shape[3], shape[1])


def _axes_text(layout: str, nchw: str, nhwc: str) -> str:
    return f"4-D {nchw}" if layout == "NCHW" else f"4-D {nhwc} (layout NHWC)"


def _conv_geometry(op: str, stride: Any, padding: Any, dilation: Any, groups: Any) -> tuple[Pair, Pair, Pair, int]:
    """stride, padding, dilation as pairs and groups as an int >= 1: shared by conv_params and deconv_params."""
    stride = as_tuple(stride, 2, op, "stride", 1)
    padding = as_tuple(padding, 2, op, "padding", 0)
    dilation = as_tuple(dilation, 2, op, "dilation", 1)
    if not _is_int(groups):
        raise DnnbindTypeError(f"{op}: groups must be an int, got {groups!r}")
    groups = int(groups)
    if groups < 1:
        raise DnnbindValueError(f"{op}: groups must be >= 1, got {groups}")
    return stride, padding, dilation, groups


def conv_params(op: str, x_shape: Any, w_shape: Any, b_shape: Any = None, stride: Any = 1,
                padding: Any = 0, dilation: Any = 1, groups: Any = 1, layout: Any = "NCHW"
                ) -> tuple[Pair, Pair, Pair, int, tuple[int, int, int, int]]:
    """Validate a 2-D convolution; returns (stride, padding, dilation, groups, y_shape), y_shape in ``layout``."""
    layout = conv_layout(op, layout)
    x_shape = check_ndim(op, "x", x_shape, (4,), _axes_text(layout, "(N, C, H, W)", "(N, H, W, C)"))
    w_shape = check_ndim(op, "w", w_shape, (4,), _axes_text(layout, "(K, C/groups, R, S)", "(K, R, S, C/groups)"))
    shapes = _fmt(x=x_shape, w=w_shape) + ("" if layout == "NCHW" else " (layout NHWC: w is (K, R, S, C/groups))")
    stride, padding, dilation, groups = _conv_geometry(op, stride, padding, dilation, groups)
    n, c, h, w = to_nchw(x_shape, layout)
    k, cg, r, s = to_nchw(w_shape, layout)
    if c % groups:
        raise DnnbindValueError(f"{op}: x has {c} channels, not divisible by groups={groups}: {shapes}")
    if k % groups:
        raise DnnbindValueError(f"{op}: w has {k} output channels, not divisible by groups={groups}: {shapes}")
    if cg * groups != c:
        raise DnnbindValueError(f"{op}: x has {c} channels but w expects {cg * groups} (groups={groups}): {shapes}")
    if b_shape is not None:
        b_shape = _shape(b_shape)
        if b_shape != (k,):
            raise DnnbindValueError(f"{op}: b has shape {b_shape} but w has {k} output channels; expected b ({k},): "
                             f"{shapes}")
    eff = (dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1)
    ho = _out_size(h, padding[0], eff[0], stride[0])
    wo = _out_size(w, padding[1], eff[1], stride[1])
    if ho <= 0 or wo <= 0:
        raise DnnbindValueError(f"{op}: kernel ({r}, {s}) with dilation {dilation} spans {eff}, larger than the padded "
                         f"input ({h + 2 * padding[0]}, {w + 2 * padding[1]}) (padding {padding}): {shapes}")
    return stride, padding, dilation, groups, from_nchw((n, k, ho, wo), layout)


def conv_grad_params(op: str, x_shape: Any, w_shape: Any, dy_shape: Any, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: Any = 1, layout: Any = "NCHW"
                     ) -> tuple[Pair, Pair, Pair, int, tuple[int, int, int, int]]:
    """Validate a convolution backward pass: conv_params, plus dy must have the forward output's shape."""
    out = conv_params(op, x_shape, w_shape, None, stride, padding, dilation, groups, layout)
    dy_shape = check_ndim(op, "dy", dy_shape, (4,), _axes_text(layout, "(N, K, P, Q)", "(N, P, Q, K)"))
    if dy_shape != out[4]:
        raise DnnbindValueError(f"{op}: dy has shape {dy_shape} but the convolution gives {out[4]}: "
                         f"{_fmt(x=x_shape, w=w_shape, dy=dy_shape)} (stride {out[0]}, padding {out[1]}, "
                         f"dilation {out[2]}, groups {out[3]}, layout {layout})")
    return out


def deconv_params(op: str, x_shape: Any, w_shape: Any, b_shape: Any = None, stride: Any = 1, padding: Any = 0,
                  dilation: Any = 1, groups: Any = 1, adj: Any = 0
                  ) -> tuple[Pair, Pair, Pair, int, Pair, tuple[int, int, int, int]]:
    """Validate a 2-D transposed convolution (MXNet's Deconvolution); returns (stride, padding, dilation, groups,
    adj, y_shape). x (N, C, H, W); w (C, F/groups, R, S), the filter of the convolution from F to C channels that
    this op transposes; y (N, F, (H-1)*sh - 2*ph + dh*(R-1) + 1 + adj_h, ...); 0 <= adj < stride (MXNet's rule:
    a larger adj would not be the transpose of any convolution)."""
    x_shape = check_ndim(op, "x", x_shape, (4,), "4-D (N, C, H, W)")
    w_shape = check_ndim(op, "w", w_shape, (4,), "4-D (C, F/groups, R, S)")
    shapes = _fmt(x=x_shape, w=w_shape)
    stride, padding, dilation, groups = _conv_geometry(op, stride, padding, dilation, groups)
    adj = as_tuple(adj, 2, op, "adj", 0)
    n, c, h, w = x_shape
    cw, fg, r, s = w_shape
    if cw != c:
        raise DnnbindValueError(f"{op}: x has {c} channels but w expects {cw} (w is (in_channels, num_filter/groups, R, "
                         f"S)): {shapes}")
    if c % groups:
        raise DnnbindValueError(f"{op}: x has {c} channels, not divisible by groups={groups}: {shapes}")
    f = fg * groups
    if b_shape is not None:
        b_shape = _shape(b_shape)
        if b_shape != (f,):
            raise DnnbindValueError(f"{op}: b has shape {b_shape} but w gives {f} output channels (w.shape[1] * groups); "
                             f"expected b ({f},): {shapes}")
    if adj[0] >= stride[0] or adj[1] >= stride[1]:
        raise DnnbindValueError(f"{op}: adj {adj} must be smaller than stride {stride}: {shapes}")
    ho = (h - 1) * stride[0] - 2 * padding[0] + dilation[0] * (r - 1) + 1 + adj[0]
    wo = (w - 1) * stride[1] - 2 * padding[1] + dilation[1] * (s - 1) + 1 + adj[1]
    if ho <= 0 or wo <= 0:
        raise DnnbindValueError(f"{op}: padding {padding} removes the whole output ({ho}, {wo}) (stride {stride}, "
                         f"dilation {dilation}, adj {adj}): {shapes}")
    return stride, padding, dilation, groups, adj, (n, f, ho, wo)


def deconv_grad_params(op: str, x_shape: Any, w_shape: Any, dy_shape: Any, stride: Any = 1, padding: Any = 0,
                       dilation: Any = 1, groups: Any = 1
                       ) -> tuple[Pair, Pair, Pair, int, Pair, tuple[int, int, int, int]]:
    """A transposed convolution's backward: deconv_params, with dy its output for some adj in [0, stride) (the
    adj is read off dy's shape and returned)."""
    stride, padding, dilation, groups, _, base = deconv_params(op, x_shape, w_shape, None, stride, padding,
                                                                dilation, groups, 0)
    dy_shape = check_ndim(op, "dy", dy_shape, (4,), "4-D (N, F, P, Q)")
    adj = (dy_shape[2] - base[2], dy_shape[3] - base[3])
    if dy_shape[:2] != base[:2] or not (0 <= adj[0] < stride[0] and 0 <= adj[1] < stride[1]):
        last = (base[2] + stride[0] - 1, base[3] + stride[1] - 1)
        raise DnnbindValueError(f"{op}: dy has shape {dy_shape} but the transposed convolution gives {base[:2]} by "
                         f"{base[2:]} to {last} (adj 0 to stride-1): {_fmt(x=x_shape, w=w_shape, dy=dy_shape)} "
                         f"(stride {stride}, padding {padding}, dilation {dilation}, groups {groups})")
    return stride, padding, dilation, groups, adj, dy_shape


def conv_bias_params(op: str, dy_shape: Any, layout: Any = "NCHW") -> int:
    """conv_backward_bias: dy is (N, K, P, Q), or (N, P, Q, K) for NHWC; returns K."""
    layout = conv_layout(op, layout)
    dy_shape = check_ndim(op, "dy", dy_shape, (4,), _axes_text(layout, "(N, K, P, Q)", "(N, P, Q, K)"))
    return dy_shape[1 if layout == "NCHW" else 3]


def add_tensor_params(op: str, x_shape: Any, b_shape: Any) -> tuple[int, ...]:
    """b is (C,), (1, C, 1, ...) or x's shape; returns b's shape broadcast-ready against x."""
    x_shape = check_ndim(op, "x", x_shape, tuple(range(1, 9)), "1-D to 8-D")
    b_shape = _shape(b_shape)
    if b_shape == x_shape:
        return b_shape
    if len(x_shape) >= 2:
        per_channel = (1, x_shape[1]) + (1,) * (len(x_shape) - 2)
        if b_shape in ((x_shape[1],), per_channel):
            return per_channel
    per_channel = f"({x_shape[1]},) (one value per channel) or " if len(x_shape) >= 2 else ""
    raise DnnbindValueError(f"{op}: b has shape {b_shape}; expected {per_channel}x's shape: {_fmt(x=x_shape, b=b_shape)}")


# -- activation, pooling, softmax -------------------------------------------------------------------------

def _choice(op: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise DnnbindTypeError(f"{op}: {name} must be a string, one of {', '.join(choices)}; got {value!r}")
    if value.lower() not in choices:
        raise DnnbindValueError(f"{op}: unknown {name} {value!r}; expected one of {', '.join(choices)}")
    return value.lower()


def activation_mode(op: str, mode: Any, coef: Any = 0.0) -> tuple[str, float]:
    """Returns (mode, coef). clipped_relu needs coef > 0 (its ceiling); elu's coef is alpha."""
    mode = _choice(op, "activation mode", mode, ACTIVATION_MODES)
    coef = scalar(op, "coef", coef)
    if mode == "clipped_relu" and coef <= 0:
        raise DnnbindValueError(f"{op}: clipped_relu needs coef > 0 (the ceiling), got {coef}")
    return mode, coef


def pooling_mode(op: str, mode: Any) -> str:
    return _choice(op, "pooling mode", mode, POOLING_MODES)


def pool_params(op: str, x_shape: Any, mode: Any = "max", window: Any = 2, stride: Any = None, padding: Any = 0,
                layout: Any = "NCHW") -> tuple[Pair, Pair, Pair, tuple[int, int, int, int]]:
    """Validate 2-D pooling; returns (window, stride, padding, y_shape in ``layout``). stride None means window."""
    pooling_mode(op, mode)
    layout = conv_layout(op, layout)
    x_shape = check_ndim(op, "x", x_shape, (4,), _axes_text(layout, "(N, C, H, W)", "(N, H, W, C)"))
    window = as_tuple(window, 2, op, "window", 1)
    stride = window if stride is None else as_tuple(stride, 2, op, "stride", 1)
    padding = as_tuple(padding, 2, op, "padding", 0)
    n, c, h, w = to_nchw(x_shape, layout)
    # NOTE: padding < window keeps at least one real element in every window, so max never sees only pad.
    if padding[0] >= window[0] or padding[1] >= window[1]:
        raise DnnbindValueError(f"{op}: padding {padding} must be smaller than window {window}: x {x_shape}")
    ho = _out_size(h, padding[0], window[0], stride[0])
    wo = _out_size(w, padding[1], window[1], stride[1])
    if ho <= 0 or wo <= 0:
        raise DnnbindValueError(f"{op}: window {window} is larger than the padded input ({h + 2 * padding[0]}, "
                         f"{w + 2 * padding[1]}) (padding {padding}): x {x_shape}")
    return window, stride, padding, from_nchw((n, c, ho, wo), layout)


def pool_grad_params(op: str, x_shape: Any, y_shape: Any, dy_shape: Any, mode: Any = "max", window: Any = 2,
                     stride: Any = None, padding: Any = 0, layout: Any = "NCHW"
                     ) -> tuple[Pair, Pair, Pair, tuple[int, int, int, int]]:
    """pool_params, plus y and dy must have the forward output's shape."""
    out = pool_params(op, x_shape, mode, window, stride, padding, layout)
    for name, shape in (("y", y_shape), ("dy", dy_shape)):
        if _shape(shape) != out[3]:
            raise DnnbindValueError(f"{op}: {name} has shape {_shape(shape)} but pooling x {_shape(x_shape)} with window "
                             f"{out[0]}, stride {out[1]}, padding {out[2]} gives {out[3]}")
    return out


def softmax_params(op: str, x_shape: Any, algorithm: Any = "accurate", mode: Any = "instance"
                   ) -> tuple[str, str]:
    """x is (N, C) or (N, C, H, W); returns (algorithm, mode)."""
    algorithm = _choice(op, "softmax algorithm", algorithm, SOFTMAX_ALGORITHMS)
    mode = _choice(op, "softmax mode", mode, SOFTMAX_MODES)
    check_ndim(op, "x", x_shape, (2, 4), "(N, C) or (N, C, H, W)")
    return algorithm, mode


# -- gemm, linear, losses ---------------------------------------------------------------------------------

def check_flag(op: str, name: str, value: Any) -> bool:
    """A bool (Python's or numpy's) as a Python bool; TypeError for anything else, 0 and 1 included."""
    if not isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"{op}: {name} must be a bool, got {value!r}")
    return bool(value)


def gemm_params(op: str, a_shape: Any, b_shape: Any, c_shape: Any = None, trans_a: Any = False,
                trans_b: Any = False, beta: float = 0.0) -> tuple[int, int, int]:
    """C[m, n] = op(A)[m, k] @ op(B)[k, n]; returns (m, n, k). beta != 0 needs c."""
    trans_a = check_flag(op, "trans_a", trans_a)
    trans_b = check_flag(op, "trans_b", trans_b)
    a_shape = check_ndim(op, "a", a_shape, (2,), "2-D")
    b_shape = check_ndim(op, "b", b_shape, (2,), "2-D")
    m, ka = a_shape[::-1] if trans_a else a_shape
    kb, n = b_shape[::-1] if trans_b else b_shape
    if ka != kb:
        raise DnnbindValueError(f"{op}: inner dimensions differ: op(a) is ({m}, {ka}), op(b) is ({kb}, {n}) "
                         f"(trans_a={trans_a}, trans_b={trans_b}): {_fmt(a=a_shape, b=b_shape)}")
    if c_shape is not None and _shape(c_shape) != (m, n):
        raise DnnbindValueError(f"{op}: c has shape {_shape(c_shape)}; expected ({m}, {n}): "
                         f"{_fmt(a=a_shape, b=b_shape, c=c_shape)}")
    if c_shape is None and beta != 0:
        raise DnnbindValueError(f"{op}: beta={beta} needs c; pass c or beta=0")
    return m, n, ka


def linear_params(op: str, x_shape: Any, w_shape: Any, b_shape: Any = None) -> tuple[int, int]:
    """x (N, in), w (units, in), b (units,); returns y's shape (N, units)."""
    x_shape = check_ndim(op, "x", x_shape, (2,), "2-D (N, in_units)")
    w_shape = check_ndim(op, "w", w_shape, (2,), "2-D (units, in_units)")
    if x_shape[1] != w_shape[1]:
        raise DnnbindValueError(f"{op}: x has {x_shape[1]} features but w expects {w_shape[1]}: "
                         f"{_fmt(x=x_shape, w=w_shape)}")
    if b_shape is not None and _shape(b_shape) != (w_shape[0],):
        raise DnnbindValueError(f"{op}: b has shape {_shape(b_shape)}; expected ({w_shape[0]},): "
                         f"{_fmt(x=x_shape, w=w_shape, b=b_shape)}")
    return x_shape[0], w_shape[0]


def linear_grad_params(op: str, x_shape: Any, w_shape: Any, dy_shape: Any) -> tuple[int, int]:
    y_shape = linear_params(op, x_shape, w_shape)
    if _shape(dy_shape) != y_shape:
        raise DnnbindValueError(f"{op}: dy has shape {_shape(dy_shape)}; expected {y_shape}: "
                         f"{_fmt(x=x_shape, w=w_shape, dy=dy_shape)}")
    return y_shape


def loss_params(op: str, scores: Any, labels: Any, dloss: Any = None, scores_name: str = "logits") -> int:
    """scores (N, C) float, labels (N,) integer, dloss (N,) like scores; returns C."""
    check_dtype(op, FLOAT32_64, **{scores_name: scores}, **({} if dloss is None else {"dloss": dloss}))
    s_shape = check_ndim(op, scores_name, scores, (2,), "2-D (N, C)")
    if np.dtype(labels.dtype).kind not in "iu":
        raise DnnbindTypeError(f"{op}: labels must have an integer dtype (class ids), got {np.dtype(labels.dtype).name}")
    shapes = _fmt(**{scores_name: scores, "labels": labels, "dloss": dloss})
    if _shape(labels) != (s_shape[0],):
        raise DnnbindValueError(f"{op}: labels must be ({s_shape[0]},), one class id per row: {shapes}")
    if dloss is not None and _shape(dloss) != (s_shape[0],):
        raise DnnbindValueError(f"{op}: dloss must be ({s_shape[0]},), one value per row: {shapes}")
    return s_shape[1]


def check_label_values(op: str, labels: np.ndarray, num_classes: int) -> None:
    """Every label in [0, num_classes). Reads the values, so the CPU path only."""
    labels = np.asarray(labels)
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DnnbindValueError(f"{op}: labels must be in [0, {num_classes}); labels[{i}] = {int(labels[i])} "
                         f"({int(bad.sum())} out of range)")


def float16_via_float32(fn):
    """A numpy twin that takes float16 as the GPU op does (float16 data, float32 arithmetic): float16 array
    arguments are computed on in float32 and float32 results rounded back to float16. Other dtypes pass through."""
    import functools

    def up(a):
        return a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float16 else a

    def down(r):
        return r.astype(np.float16) if isinstance(r, np.ndarray) and r.dtype == np.float32 else r

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not any(isinstance(a, np.ndarray) and a.dtype == np.float16 for a in (*args, *kwargs.values())):
            return fn(*args, **kwargs)
        out = fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        return tuple(map(down, out)) if isinstance(out, tuple) else down(out)
    return wrapper
