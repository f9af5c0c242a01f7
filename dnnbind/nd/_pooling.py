"""Layer nd: MXNet's ``Pooling`` (max, avg, sum, lp; 'valid' and 'full' conventions; 1-D and 2-D, NCHW and NHWC)
as cuDNN's pooling forward/backward pairs, with the modes cuDNN lacks composed around them. Imports ops, autograd,
runtime.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from .._lib.errors import DnnbindValueError
from ..autograd import is_recording, record_op
from ..runtime.array import NDArray, array
from ._params import (ParsedCalls, array_arg, bool_arg, check_fits, choice_arg, int_arg, into, layout_arg, reject,
                      shape_arg, spatial)
from ._registry import call

__all__ = ["Pooling", "pool_full"]


_POOL_TYPES = ("avg", "lp", "max", "sum")
_POOL_CONVENTIONS = ("full", "same", "valid")


def Pooling(data=None, kernel=None, pool_type="max", global_pool=False, cudnn_off=False, pooling_convention="valid",
            stride=None, pad=None, p_value=None, count_include_pad=None, layout=None, out=None, name=None, **kwargs):
    """MXNet's Pooling over the spatial axes of 3-D (N, C, W) or 4-D data: cudnnPoolingForward, backward
    cudnnPoolingBackward. MXNet's defaults: stride 1 and pad 0 on every axis; ``kernel`` required unless
    ``global_pool`` (the whole input, pad 0); ``count_include_pad`` None means True (avg divides by the whole window,
    padding included). ``pool_type`` 'max', 'avg', 'sum' (avg times the window) or 'lp' (``p_value`` p:
    (sum x^p)^(1/p) over the window, signed for odd p). ``pooling_convention`` 'valid' (floor) or 'full' (ceil:
    ``pool_full``); 'same' is not supported. ``layout='NHWC'``: 4-D data (N, H, W, C) pooled over H and W
    by cuDNN on channels-last descriptors. 1-D data runs the 2-D path on an (N, C, 1, W) view; 3-D pooling is not
    supported. ``cudnn_off`` is checked and ignored, as is ``name``."""
    if kwargs:
        reject("Pooling", kwargs)
    try:  # the hot path: a call seen before (ParsedCalls says how it is keyed)
        key = (data._shape, data._dtype, data._device, id(kernel), id(stride), id(pad), id(global_pool),
               id(cudnn_off), id(count_include_pad), id(p_value), pool_type, pooling_convention, layout)
        parsed = _POOL_ARGS.get(key)
    except (AttributeError, TypeError):  # not an NDArray, or an unhashable string argument
        key = parsed = None
    if parsed is None:
        data, parsed = _pool_args(data, kernel, pool_type, global_pool, cudnn_off, pooling_convention, stride, pad,
                                  p_value, count_include_pad, layout)
        if key is not None:
            _POOL_ARGS.put(key, parsed, (kernel, stride, pad, global_pool, cudnn_off, count_include_pad, p_value))
    one_d, kernel, stride, pad, pool_type, convention, cip, layout, p_value = parsed
    if one_d:  # (N, C, W) as (N, C, 1, W): a recorded view
        n, c, w = data.shape
        y = _pool(data.reshape((n, c, 1, w)), kernel, stride, pad, pool_type, convention, cip, layout, p_value)
        return into(out, y.reshape((n, c, y.shape[3])))
    return into(out, _pool(data, kernel, stride, pad, pool_type, convention, cip, layout, p_value))


_POOL_ARGS = ParsedCalls()  # a call's data shape and its parameters -> the parsed arguments


def _pool_args(data, kernel, pool_type, global_pool, cudnn_off, pooling_convention, stride, pad, p_value,
               count_include_pad, layout):
    """Every check of nd.Pooling's arguments; returns the data and (one_d, kernel, stride, pad, pool_type,
    convention, count_include_pad, layout, p_value) for the 2-D path."""
    op = "Pooling"
    pool_type = choice_arg(op, "pool_type", pool_type, _POOL_TYPES)
    convention = choice_arg(op, "pooling_convention", pooling_convention, _POOL_CONVENTIONS)
    global_pool, _ = bool_arg(op, "global_pool", global_pool), bool_arg(op, "cudnn_off", cudnn_off)
    cip = True if count_include_pad is None else bool_arg(op, "count_include_pad", count_include_pad)
    kernel, stride, pad = shape_arg(op, "kernel", kernel), shape_arg(op, "stride", stride), shape_arg(op, "pad", pad)
    if p_value is not None:
        p_value = int_arg(op, "p_value", p_value, 1)
    data = array_arg(op, "data", data)
    dims = data.ndim - 2
    if dims == 3:
        raise NotImplementedError(f"Pooling: 3-D pooling (data {data.shape}) is not supported by dnnbind")
    if dims not in (1, 2):
        raise DnnbindValueError(f"Pooling: data must be 3-D (N, C, W) or 4-D (N, C, H, W), got shape {data.shape}")
    if dims == 1:
        if layout not in (None, "NCW"):
            raise DnnbindValueError(f"Pooling: layout must be 'NCW' for 3-D data {data.shape} (channels-last 1-D "
                                    f"pooling is not supported), got {layout!r}")
        layout = "NCHW"
    else:
        layout = layout_arg(op, layout, data)
    if convention == "same":  # MXNet 1.9.1 has it for 1-D max pooling only
        if dims != 1 or pool_type != "max":
            raise DnnbindValueError(f"Pooling: pooling_convention='same' is for 1-D max pooling only (3-D data "
                                    f"(N, C, W)); got pool_type {pool_type!r}, data {data.shape}")
        raise NotImplementedError(f"Pooling: pooling_convention='same' is not supported by dnnbind (data "
                                  f"{data.shape})")
    if pool_type == "lp" and p_value is None:
        raise DnnbindValueError(f"Pooling: pool_type='lp' needs p_value (data {data.shape})")
    size = data.shape[1:3] if layout == "NHWC" else data.shape[2:]
    if global_pool:  # MXNet: the kernel is the whole input, stride 1, no padding; the convention does not matter
        kernel, stride, pad, convention = tuple(size), (1,) * dims, (0,) * dims, "valid"
    elif kernel is None:
        raise DnnbindValueError(f"Pooling: kernel is required unless global_pool=True (data {data.shape})")
    elif len(kernel) != dims:
        raise DnnbindValueError(f"Pooling: kernel {kernel} has {len(kernel)} axes but data {data.shape} has {dims} "
                                "spatial axes")
    elif min(kernel) < 1:
        raise DnnbindValueError(f"Pooling: kernel must be >= 1 on every axis, got {kernel} (data {data.shape})")
    stride = spatial(op, "stride", stride, dims, 1, 1, data.shape)
    pad = spatial(op, "pad", pad, dims, 0, 0, data.shape)
    spatial(op, "kernel", kernel, dims, 1, 1, data.shape)
    if any(p >= k for p, k in zip(pad, kernel)):
        raise DnnbindValueError(f"Pooling: pad {pad} must be smaller than kernel {kernel} on every axis (data "
                                f"{data.shape})")
    padded = tuple(s + 2 * p for s, p in zip(size, pad))
    if any(k > s for k, s in zip(kernel, padded)):
        raise DnnbindValueError(f"Pooling: kernel {kernel} is larger than the padded input {padded} (data "
                                f"{data.shape}, pad {pad})")
    check_fits(op, data._device, data.dtype, "the padded input", data.shape[:-dims] + padded if layout == "NCHW"
               else (data.shape[0],) + padded + (data.shape[3],), f" (data {data.shape}, pad {pad})")
    if dims == 1:
        kernel, stride, pad = (1,) + kernel, (1,) + stride, (0,) + pad
    return data, (dims == 1, kernel, stride, pad, pool_type, convention, cip, layout, p_value)


def _pool(data, window, stride, pad, pool_type, convention, cip, layout, p_value=None):
    """4-D pooling of parsed arguments: sum and lp composed of avg pooling and table ops (their gradients come
    with them), 'full' through pool_full, the rest one cuDNN call."""
    if pool_type == "lp":
        powered = data if p_value == 1 else call("power", data, float(p_value))
        s = _pool(powered, window, stride, pad, "sum", convention, cip, layout)
        if p_value == 1:
            return s
        if p_value == 2:
            return call("sqrt", s)
        root = call("power", call("abs", s), 1.0 / p_value)
        return root * call("sign", s) if p_value % 2 else root
    if convention == "full":
        return pool_full(data, window, stride, pad, pool_type, cip, layout)
    if pool_type == "sum":  # the window's sum, padding counted as zeros: the padded average times the window
        return _pool_valid(data, window, stride, pad, "avg", layout) * float(window[0] * window[1])
    return _pool_valid(data, window, stride, pad, "avg" if pool_type == "avg" and cip else
                       "avg_exclude_pad" if pool_type == "avg" else "max", layout)


def _pool_valid(data, window, stride, pad, mode, layout):
    """cudnnPoolingForward ('valid': floor) with mode 'max', 'avg' or 'avg_exclude_pad', taped."""
    y = ops.pooling_forward(data, mode, window, stride, pad, layout=layout)
    if is_recording():
        record_op("Pooling", y, (data,),
                  lambda dy: (ops.pooling_backward(y, dy, data, mode, window, stride, pad, layout=layout),))
    return y


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


def pool_full(data, window, strides, pads, pool_type, count_include_pad, layout):
    """4-D ``nd.Pooling`` with ``pooling_convention='full'`` (output 1 + ceil((H + 2p - k) / s)), its arguments
    parsed by nd.Pooling: cuDNN pools with floor, so the input gets extra rows/columns on the high side (the lowest
    finite value for max, zeros for avg and sum) and avg is rescaled to MXNet's divisor. ``pool_type`` 'max', 'avg'
    or 'sum'; ``layout`` 'NCHW' or 'NHWC'."""
    nhwc = layout == "NHWC"
    h_axis = 1 if nhwc else 2  # H, then W
    size = data.shape[h_axis:h_axis + 2]
    out = tuple(1 + -(-(size[d] + 2 * pads[d] - window[d]) // strides[d]) for d in range(2))
    extra = [max(0, (out[d] - 1) * strides[d] + window[d] - size[d] - 2 * pads[d]) for d in range(2)]
    avg_mode = "avg" if count_include_pad or pool_type == "sum" else "avg_exclude_pad"
    if not any(extra):
        if pool_type == "max":
            return _pool_valid(data, window, strides, pads, "max", layout)
        y = _pool_valid(data, window, strides, pads, avg_mode, layout)
        return y * float(window[0] * window[1]) if pool_type == "sum" else y
    fill = float(np.finfo(data.dtype).min) if pool_type == "max" else 0.0
    x = data
    for d in range(2):  # extra rows (d = 0), then columns, on the high side
        if extra[d]:
            shape = list(x.shape)
            shape[h_axis + d] = extra[d]
            x = call("concat", x, _const(tuple(shape), fill, data), dim=h_axis + d)
    if pool_type == "max":
        return _pool_valid(x, window, strides, pads, "max", layout)
    y = _pool_valid(x, window, strides, pads, "avg", layout)
    if pool_type == "sum":  # the extra rows are zeros: the padded average times the window is the sum
        return y * float(window[0] * window[1])
    return y * _full_divisor_scale(size, window, strides, pads, out, count_include_pad, data.dtype, data.device,
                                   layout)


def _const(shape, value: float, like: NDArray) -> NDArray:
    from ._creation import full
    return full(shape, value, ctx=like.device, dtype=like.dtype)
