"""Layer nd: MXNet's layer operators that compose registered ops (L2Normalization, SoftmaxActivation, softmin, Pad),
one registry entry each. They have no kernels or gradients of their own: the table ops and library-backed ops they
call check, run on either backend and tape themselves. Imports numpy and nd._registry.
"""

from __future__ import annotations

import numpy as np

from .._lib.errors import DnnbindValueError
from ..runtime.array import NDArray
from ._registry import REGISTRY, as_array, call, composite, invoke


def _data(op: str, data) -> NDArray:
    return data if type(data) is NDArray else as_array(op, "data", data)


def l2_normalization(data, eps=1e-10, mode="instance"):
    """MXNet's L2Normalization: ``x / sqrt(sum(x^2) + eps)`` over every axis but the first ('instance'), over
    axis 1 ('channel') or over the axes after 1 ('spatial')."""
    data = _data("L2Normalization", data)
    if mode == "instance":
        axes = tuple(range(1, data.ndim))
    elif mode == "channel":
        axes = (1,)
    elif mode == "spatial":
        axes = tuple(range(2, data.ndim))
    else:
        raise DnnbindValueError(f"L2Normalization: mode must be 'instance', 'channel' or 'spatial', got {mode!r}")
    if mode != "instance" and data.ndim < 3:
        raise DnnbindValueError(f"L2Normalization: At least 3 dimensions required in {mode} mode, got data "
                                f"{data.shape}")
    if data.ndim < 2:
        raise DnnbindValueError(f"L2Normalization: data must have at least 2 dimensions, got {data.shape}")
    ss = call("sum", call("square", data), axis=axes, keepdims=True)
    return data * call("rsqrt", ss + float(eps))


def softmax_activation(data, mode="instance"):
    """MXNet's (deprecated) SoftmaxActivation: softmax over the flattened trailing axes ('instance') or over axis 1
    ('channel')."""
    data = _data("SoftmaxActivation", data)
    softmax = REGISTRY["softmax"]
    if mode == "channel":
        if data.ndim < 2:
            raise DnnbindValueError(f"SoftmaxActivation: channel mode needs data of at least 2 dimensions, got "
                                    f"{data.shape}")
        return invoke(softmax, (data,), {"axis": 1})
    if mode != "instance":
        raise DnnbindValueError(f"SoftmaxActivation: mode must be 'instance' or 'channel', got {mode!r}")
    flat = data.reshape((data.shape[0], -1)) if data.ndim != 2 else data
    out = invoke(softmax, (flat,), {"axis": -1})
    return out.reshape(data.shape) if data.ndim != 2 else out


def softmin(data, axis=-1, temperature=None, dtype=None, use_length=False):
    """MXNet's softmin: softmax of ``-data`` (the same library call, on the negated input). MXNet 1.9.1 declares
    ``use_length`` but gives softmin no length input, so it must stay False."""
    data = _data("softmin", data)
    if use_length:
        raise DnnbindValueError(f"softmin: use_length=True needs a length input, which MXNet's softmin does not "
                                f"take (data {data.shape}); use softmax(-data, length, use_length=True)")
    params = {"axis": axis, "temperature": temperature, "dtype": dtype}
    return invoke(REGISTRY["softmax"], (call("negative", data),), params)


def pad(data, mode="constant", pad_width=None, constant_value=0.0):
    """MXNet's Pad on 4-D or 5-D data: ``pad_width`` is (before, after) for every axis, the first two axes 0.
    'constant' fills with ``constant_value``, 'edge' repeats the border, 'reflect' mirrors without repeating it.
    Built of concat, slices and broadcasts, so it runs and differentiates on either backend."""
    data = _data("Pad", data)
    if pad_width is None:
        raise DnnbindValueError("Pad: Required parameter pad_width of Shape(tuple) is not presented")
    if mode not in ("constant", "edge", "reflect"):
        raise DnnbindValueError(f"Pad: mode must be 'constant', 'edge' or 'reflect', got {mode!r}")
    widths = tuple(int(w) for w in pad_width)
    if data.ndim not in (4, 5):
        raise DnnbindValueError(f"Pad: Current implementation only supports 4-D or 5-D input, got data {data.shape}")
    if len(widths) != 2 * data.ndim:
        raise DnnbindValueError(f"Pad: Input shape vs padding spec mismatch: data {data.shape} takes "
                                f"{2 * data.ndim} pad widths, got {widths}")
    if any(widths[:4]) or any(w < 0 for w in widths):
        raise DnnbindValueError(f"Pad: Current implementation expects padding on the first two axes to be zero and "
                                f"no negative width, got pad_width {widths} (data {data.shape})")
    out = data
    for a in range(2, data.ndim):
        before, after = widths[2 * a], widths[2 * a + 1]
        if not before and not after:
            continue
        n = out.shape[a]
        if mode == "reflect" and (before >= n or after >= n):
            raise DnnbindValueError(f"Pad: Current implementation of reflection padding only supports padding sizes "
                                    f"smaller than the input size, got {before}, {after} for axis {a} of size {n} "
                                    f"(data {data.shape})")
        parts = []
        for width, at_start in ((before, True), (after, False)):
            if not width:
                parts.append(None)
                continue
            shape = out.shape[:a] + (width,) + out.shape[a + 1:]
            if mode == "constant":
                piece = call("broadcast_to", _filled(out, float(constant_value)), shape=shape)
            elif mode == "edge":
                edge = call("slice_axis", out, axis=a, begin=0, end=1) if at_start else \
                    call("slice_axis", out, axis=a, begin=n - 1, end=n)
                piece = call("broadcast_to", edge, shape=shape)
            else:
                piece = call("slice_axis", out, axis=a, begin=1, end=width + 1) if at_start else \
                    call("slice_axis", out, axis=a, begin=n - 1 - width, end=n - 1)
                piece = call("flip", piece, axis=a)
            parts.append(piece)
        pieces = [p for p in (parts[0], out, parts[1]) if p is not None]
        out = call("concat", *pieces, dim=a)
    return out


def _filled(like: NDArray, value: float) -> NDArray:
    """A one-element array of ``value`` in ``like``'s type and device, shaped to broadcast against it."""
    from ..runtime.array import array
    return array(np.full((1,) * like.ndim, value, dtype=like.dtype), device=like.device)


composite("L2Normalization", l2_normalization)
composite("SoftmaxActivation", softmax_activation)
composite("softmin", softmin)
composite("Pad", pad, nd=("Pad", "pad"))
