"""Layer nd: MXNet's ``LeakyReLU`` family, ``Embedding`` and the pooling cases cuDNN has no mode for (1-D input,
``pooling_convention='full'``). Imports numpy, autograd, runtime and nd's own modules.

Everything here is a composition of registered ops (where, expm1, erf, take, concat, multiply), so each gets
its gradient and its GPU lowering from the table; nothing has hand-written backward code.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import math

import numpy as np

from .. import autograd
from ..runtime.array import NDArray, array
from ._registry import as_array, call

__all__ = ["Embedding", "LeakyReLU", "pooling_ext"]

# MXNet's constants (src/operator/mshadow_op.h).
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _neg_expm1(x: NDArray, scale: float) -> NDArray:
    """scale * expm1(min(x, 0)): the negative branch of ELU/SELU. The min keeps exp from overflowing where the
    positive branch is taken (an inf there would turn the masked gradient 0 * inf into NaN)."""
    return call("expm1", call("minimum", x, 0.0)) * scale


def LeakyReLU(data, gamma=None, act_type: str = "leaky", slope: float = 0.25, lower_bound: float = 0.125,
              upper_bound: float = 0.334, **_ignored) -> NDArray:
    """MXNet's ``nd.LeakyReLU``: act_type 'leaky' (x or slope*x), 'prelu' (learned ``gamma`` per channel, axis 1),
    'elu' (slope*(exp(x)-1) below 0), 'selu', 'gelu' (erf form), 'rrelu' (random slope in [lower, upper] while
    training, their mean otherwise)."""
    data = as_array("LeakyReLU", "data", data)
    pos = data > 0
    if act_type == "leaky":
        return call("_leaky_relu", data, slope=float(slope))
    if act_type == "prelu":
        if gamma is None:
            raise DnnbindValueError("LeakyReLU(act_type='prelu'): needs gamma, the learned slopes (shape (1,) or (C,))")
        gamma = as_array("LeakyReLU", "gamma", gamma, data)
        if gamma.size != 1:
            if data.ndim < 2 or gamma.size != data.shape[1]:
                raise DnnbindValueError(f"LeakyReLU(act_type='prelu'): gamma has shape {gamma.shape}; expected (1,) or "
                                 f"({data.shape[1] if data.ndim > 1 else 1},) for data of shape {data.shape}")
            gamma = gamma.reshape((1, gamma.size) + (1,) * (data.ndim - 2))
        return call("where", pos, data, data * gamma)
    if act_type == "elu":
        return call("where", pos, data, _neg_expm1(data, float(slope)))
    if act_type == "selu":
        return call("where", pos, data, _neg_expm1(data, SELU_ALPHA)) * SELU_LAMBDA
    if act_type == "gelu":
        return data * (call("erf", data * _INV_SQRT2) + 1.0) * 0.5
    if act_type == "rrelu":
        if not autograd.is_training():
            return call("_leaky_relu", data, slope=(lower_bound + upper_bound) / 2.0)
        from .random import uniform
        slopes = uniform(lower_bound, upper_bound, shape=data.shape, dtype=data.dtype, ctx=data.device)
        return call("where", pos, data, data * slopes)
    raise DnnbindValueError(f"LeakyReLU: unknown act_type {act_type!r}; expected one of leaky, prelu, elu, selu, gelu, "
                     "rrelu")


def Embedding(data, weight, input_dim: int | None = None, output_dim: int | None = None, dtype=None,
              sparse_grad: bool = False, **_ignored) -> NDArray:
    """weight[data]: (d0, ..., dk) indices -> (d0, ..., dk, output_dim); indices are clipped to the table like
    MXNet. The gradient reaches ``weight`` through ``take``'s backward (a scatter-add); ``sparse_grad`` is
    accepted and gives a dense gradient."""
    weight = as_array("Embedding", "weight", weight)
    if weight.ndim != 2:
        raise DnnbindValueError(f"Embedding: weight must be 2-D (input_dim, output_dim), got shape {weight.shape}")
    if input_dim is not None and weight.shape[0] != int(input_dim) or \
            output_dim is not None and weight.shape[1] != int(output_dim):
        raise DnnbindValueError(f"Embedding: weight shape {weight.shape} does not match input_dim={input_dim}, "
                         f"output_dim={output_dim}")
    data = as_array("Embedding", "data", data, weight)
    return call("take", weight, data, axis=0, mode="clip")


# -- pooling beyond cuDNN's modes ------------------------------------------------------------------------------

_scales: dict = {}


def _full_divisor_scale(size, window, stride, pad, out, include_pad: bool, dtype, device,
                        layout: str = "NCHW") -> NDArray:
    """(1, 1, P, Q) factors ((1, P, Q, 1) for NHWC) turning cuDNN's sum/(kh*kw) into MXNet's average in 'full' mode
    (pool.h): the divisor of a window counting padding stops at H + pad, so the extra high-side rows ceil mode
    adds never count; without padding only real elements count."""
    key = (tuple(size), window, stride, pad, out, include_pad, np.dtype(dtype).str, device, layout)
    scale = _scales.get(key)
    if scale is None:
        counts = []
        for d in range(2):
            start = np.arange(out[d]) * stride[d] - pad[d]
            if include_pad:
                cnt = np.minimum(start + window[d], size[d] + pad[d]) - start
            else:
                cnt = np.minimum(start + window[d], size[d]) - np.maximum(start, 0)
            counts.append(np.maximum(cnt, 1).astype(np.float64))
        host = (window[0] * window[1]) / np.outer(counts[0], counts[1])
        shape = (1, 1) + host.shape if layout == "NCHW" else (1,) + host.shape + (1,)
        scale = _scales[key] = array(host.reshape(shape).astype(dtype), device=device)
    return scale


def _tuple(v, n: int, name: str, arg: str) -> tuple:
    t = tuple(int(i) for i in v) if isinstance(v, (tuple, list)) else (int(v),) * n
    if len(t) != n:
        raise DnnbindValueError(f"{name}: {arg} must have {n} entries for this input, got {v!r}")
    return t


def pooling_ext(pool, data, kernel, pool_type, stride, pad, global_pool, convention, count_include_pad,
                layout=None):
    """``nd.Pooling`` for 1-D input (N, C, W) through the 2-d path (H = 1) and for ``pooling_convention='full'``
    (output 1 + ceil((H + 2p - k) / s)): cuDNN pools with floor, so the input gets extra rows/columns on the
    high side (the lowest finite value for max, zeros for avg) and avg is rescaled to MXNet's divisor.
    ``pool`` is nd.Pooling itself, called back for the plain 4-D 'valid' case. ``layout``: None, 'NCW' for
    3-D data; None, 'NCHW' or 'NHWC' for 4-D data."""
    if convention not in ("valid", "full"):
        raise DnnbindValueError(f"Pooling: pooling_convention must be 'valid' or 'full', got {convention!r}")
    if data.ndim == 3:
        if layout not in (None, "NCW"):
            raise DnnbindValueError(f"Pooling: layout must be 'NCW' for 3-D data {data.shape} (channels-last 1-D pooling "
                             f"is not supported), got {layout!r}")
        n, c, w = data.shape
        # nd.Pooling's signature defaults are 2-D: read them as their 1-D equivalents.
        kernel, pad = (1 if kernel == (1, 1) else kernel), (0 if pad == (0, 0) else pad)
        k1 = _tuple(kernel, 1, "Pooling", "kernel") if not global_pool else (w,)
        s1 = _tuple(stride if stride is not None else k1, 1, "Pooling", "stride")
        p1 = _tuple(pad, 1, "Pooling", "pad")
        y = pool(data.reshape((n, c, 1, w)), kernel=(1,) + k1, pool_type=pool_type, stride=(1,) + s1,
                 pad=(0,) + p1, global_pool=global_pool, pooling_convention=convention,
                 count_include_pad=count_include_pad)
        return y.reshape((n, c, y.shape[3]))
    if data.ndim != 4:
        raise DnnbindValueError(f"Pooling: data must be 3-D (N, C, W) or 4-D (N, C, H, W), got shape {data.shape}")
    if global_pool:
        return pool(data, kernel, pool_type, stride, pad, True, "valid", count_include_pad, layout)
    nhwc = layout == "NHWC"
    window = _tuple(kernel, 2, "Pooling", "kernel")
    strides = _tuple(stride if stride is not None else window, 2, "Pooling", "stride")
    pads = _tuple(pad, 2, "Pooling", "pad")
    h_axis = 1 if nhwc else 2  # H, then W
    size = data.shape[h_axis:h_axis + 2]
    if any(size[d] + 2 * pads[d] < window[d] for d in range(2)) or min(strides) < 1:
        raise DnnbindValueError(f"Pooling: kernel {window} with pad {pads} and stride {strides} does not fit input "
                         f"{data.shape}")
    out = tuple(1 + -(-(size[d] + 2 * pads[d] - window[d]) // strides[d]) for d in range(2))
    extra = [max(0, (out[d] - 1) * strides[d] + window[d] - size[d] - 2 * pads[d]) for d in range(2)]
    if not any(extra):
        return pool(data, window, pool_type, strides, pads, False, "valid", count_include_pad, layout)
    fill = float(np.finfo(data.dtype).min) if pool_type == "max" else 0.0
    x = data
    for d in range(2):  # extra rows (d = 0), then columns, on the high side
        if extra[d]:
            shape = list(x.shape)
            shape[h_axis + d] = extra[d]
            x = call("concat", x, _const(tuple(shape), fill, data), dim=h_axis + d)
    if pool_type == "max":
        return pool(x, window, "max", strides, pads, False, "valid", True, layout)
    if pool_type != "avg":
        raise DnnbindValueError(f"Pooling: pool_type must be 'max' or 'avg', got {pool_type!r}")
    y = pool(x, window, "avg", strides, pads, False, "valid", True, layout)
    return y * _full_divisor_scale(size, window, strides, pads, out, count_include_pad, data.dtype, data.device,
                                   "NHWC" if nhwc else "NCHW")


def _const(shape, value: float, like: NDArray) -> NDArray:
    from ._creation import full
    return full(shape, value, ctx=like.device, dtype=like.dtype)
