"""MXNet's ``_contrib_BilinearResize2D`` and ``_contrib_AdaptiveAvgPooling2D`` over (N, C, H, W) data
(``nd.contrib.BilinearResize2D``, ``nd.contrib.AdaptiveAvgPooling2D``).

- BilinearResize2D: the output size by ``mode``: 'size' (``height``/``width``, or the input size times
  ``scale_height``/``scale_width``: MXNet decides both axes on ``scale_height`` alone, so a lone ``scale_width`` is
  ignored and a lone ``scale_height`` refused, as MXNet fails on it), 'odd_scale' ((size - 1) * scale + 1 for an odd
  size, size * scale for an even one; both scales required), 'like' (the second input's H and W; that input gets a
  zero gradient, as in MXNet), 'to_even_down'/'to_even_up'/'to_odd_down'/'to_odd_up' (the size moved by one to the
  wanted parity). Sizes are truncated toward zero after a float32 product, as MXNet's shape inference does; an
  output size outside [1, 32767] is refused (MXNet computes it in int16 and wraps). ``align_corners`` True maps
  the corner pixels onto each other (scale (in - 1) / (out - 1)); False maps pixel areas (scale in / out, source
  (o + 0.5) * scale - 0.5 clamped at 0). The source positions and weights are computed in float32 as MXNet does,
  whatever the data's type.
- AdaptiveAvgPooling2D: ``output_size`` () is 1x1, (s,) is s x s, (h, w); output bin o along an axis of size I
  averages positions floor(o * I / O) to ceil((o + 1) * I / O) - 1 (bins may overlap).

Both are separable with weights that depend on the sizes only. The GPU lowering therefore takes, per axis, a (K, O)
table of source positions and weights (K = 2 taps for bilinear, the widest bin for adaptive pooling, the narrower
bins padded with weight 0), uploaded once per (sizes, dtype, device) and cached, and composes the table's ``take``
(gather of rows, then of columns), ``multiply`` and ``sum``; the backward is the adjoint: weights, then the table's
``_take_backward`` (scatter-add) along W and then H. No host copy, so a hybridized Block records it. The cpu twin
(ops/reference/resize.py) computes in MXNet's own order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import array, zeros
from ..args import check_fits
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import resize as ref

BILINEAR, ADAPTIVE = "_contrib_BilinearResize2D", "_contrib_AdaptiveAvgPooling2D"
_INT16_MAX = 32767


class Geometry(NamedTuple):
    in_shape: tuple
    out_shape: tuple
    align: bool = True
    like_shape: tuple | None = None


def _check_data(op: str, data) -> None:
    if data.ndim != 4:
        raise DnnbindValueError(f"{op}: data must be 4-D (N, C, H, W), got shape {tuple(data.shape)}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape "
                               f"{tuple(data.shape)}); use .astype('float32')")


# BilinearResize2D --------------------------------------------------------------------------------------------------

def _bilinear_hw(p, dshape: tuple, like_shape: tuple | None) -> tuple[int, int]:
    mode = p["mode"]
    for name in ("height", "width"):
        if p[name] < 1:  # MXNet's set_lower_bound(1)
            raise DnnbindValueError(f"value {p[name]} for Parameter {name} should be greater equal to 1, in "
                                    f"operator {BILINEAR}")
    if mode == "size" and p["scale_height"] is not None and p["scale_width"] is None:
        raise DnnbindValueError(f"{BILINEAR}: mode 'size' with scale_height={p['scale_height']} needs scale_width "
                                f"too (MXNet fails with 'bad optional access'); data {dshape}")
    if mode == "odd_scale" and (p["scale_height"] is None or p["scale_width"] is None):
        raise DnnbindValueError(f"{BILINEAR}: mode 'odd_scale' needs scale_height and scale_width; data {dshape}")
    if mode == "like":
        if like_shape is None:
            raise DnnbindTypeError(f"{BILINEAR}: mode 'like' needs the second input, like (its H and W are the "
                                   f"output's); data {dshape}")
        if len(like_shape) != 4:
            raise DnnbindValueError(f"{BILINEAR}: like must be 4-D (N, C, H, W), got shape {like_shape}")
    oh, ow = ref.out_size_of(p, dshape[2], dshape[3], None if like_shape is None else like_shape[2:])
    if not (1 <= oh <= _INT16_MAX and 1 <= ow <= _INT16_MAX):
        raise DnnbindValueError(f"{BILINEAR}: the output would be {oh} x {ow} (mode {mode!r}, data {dshape}); each "
                                f"side must be in [1, {_INT16_MAX}] (MXNet holds it in int16)")
    return oh, ow


def _bilinear_prepare(p, data, like=None):
    _check_data(BILINEAR, data)
    if like is not None and p["mode"] != "like":
        raise DnnbindTypeError(f"{BILINEAR}: got a second input (like, shape {tuple(like.shape)}) but mode is "
                               f"{p['mode']!r}; MXNet takes it in mode 'like' only")
    like_shape = None if like is None else tuple(like.shape)
    if like is not None and like.dtype != data.dtype:
        raise DnnbindTypeError(f"{BILINEAR}: like is {like.dtype} but data is {data.dtype}; they must share a dtype")
    oh, ow = _bilinear_hw(p, tuple(data.shape), like_shape)
    out = tuple(data.shape[:2]) + (oh, ow)
    check_fits(BILINEAR, data.device, data.dtype, "the output", out, f" (data {tuple(data.shape)})", cudnn=False)
    return Geometry(tuple(data.shape), out, bool(p["align_corners"]), like_shape)


def _bilinear_infer(p, shapes):
    data = tuple(shapes[0])
    like = tuple(shapes[1]) if len(shapes) > 1 else None
    out = data[:2] + _bilinear_hw(p, data, like)
    return [tuple(s) for s in shapes], [out]


def _bilinear_cpu_forward(c, x, like=None):
    g = c.geo
    return ref.bilinear_resize(x, g.out_shape[2:], g.align), None


def _bilinear_cpu_backward(c, saved, grads, dy):
    g = c.geo
    dx = ref.bilinear_resize_backward(dy, g.in_shape, g.align) if grads.needs[0] else None
    if g.like_shape is None:
        return (dx,)
    return dx, (np.zeros(g.like_shape, dy.dtype) if grads.needs[1] else None)


# the GPU: gather-and-weight along each axis with cached (K, O) tables ------------------------------------------------

_TAPS: dict = {}  # (kind, n_in, n_out, align, dtype, device) -> (index float64 (K, O), weight (K, O)) on the device


def _taps(kind: str, n_in: int, n_out: int, align: bool, dtype, device):
    """One axis's source positions and weights, uploaded the first time and cached (never trimmed: a few KB per
    distinct size, and a recording may hold the pointers)."""
    key = (kind, n_in, n_out, align, np.dtype(dtype), device)
    t = _TAPS.get(key)
    if t is None:
        idx, w = (ref.bilinear_taps(n_in, n_out, align, dtype) if kind == "bilinear"
                  else ref.adaptive_taps(n_in, n_out, dtype))
        t = _TAPS[key] = (array(idx.astype(np.float64), device=device), array(w.astype(dtype), device=device))
    return t


def _separable_forward(x, th, tw):
    """y[n, c, o, q] = sum_a wh[a, o] * sum_b ww[b, q] * x[n, c, ih[a, o], iw[b, q]] (the W sum first, as MXNet)."""
    n, ch, h, w = x.shape
    (ih, wh), (iw, ww) = th, tw
    kh, oh = ih.shape
    kw, ow = iw.shape
    t = table("take", x, ih, axis=2, mode="clip")  # (N, C, Kh, Oh, W)
    t = table("take", t, iw, axis=4, mode="clip")  # (N, C, Kh, Oh, Kw, Ow)
    t = table("sum", table("multiply", t, ww), axis=4)  # (N, C, Kh, Oh, Ow)
    return table("sum", table("multiply", t, view(wh, (kh, oh, 1))), axis=2)


def _separable_backward(dy, shape, th, tw):
    n, ch, h, w = shape
    (ih, wh), (iw, ww) = th, tw
    kh, oh = ih.shape
    kw, ow = iw.shape
    g = table("multiply", view(dy, (n, ch, 1, oh, ow)), view(wh, (kh, oh, 1)))  # (N, C, Kh, Oh, Ow)
    g = table("multiply", view(g, (n, ch, kh, oh, 1, ow)), ww)  # (N, C, Kh, Oh, Kw, Ow)
    g = table("_take_backward", g, iw, shape=(n, ch, kh, oh, w), axis=4, mode="clip")
    return table("_take_backward", g, ih, shape=shape, axis=2, mode="clip")


def _bilinear_gpu_taps(c, dtype, device):
    g = c.geo
    (h, w), (oh, ow) = g.in_shape[2:], g.out_shape[2:]
    return (_taps("bilinear", h, oh, g.align, dtype, device), _taps("bilinear", w, ow, g.align, dtype, device))


def _bilinear_gpu_forward(c, x, like=None):
    g = c.geo
    if g.out_shape == g.in_shape or x.size == 0:
        return (x.copy() if x.size else zeros(g.out_shape, x.dtype, x.device)), None
    return _separable_forward(x, *_bilinear_gpu_taps(c, x.dtype, x.device)), None


def _bilinear_gpu_backward(c, saved, grads, dy):
    g = c.geo
    dx = None
    if grads.needs[0]:
        if g.out_shape == g.in_shape or dy.size == 0:
            dx = dy.copy() if dy.size else zeros(g.in_shape, dy.dtype, dy.device)
        else:
            dx = _separable_backward(dy, g.in_shape, *_bilinear_gpu_taps(c, dy.dtype, dy.device))
    if g.like_shape is None:
        return (dx,)
    return dx, (zeros(g.like_shape, dy.dtype, dy.device) if grads.needs[1] else None)


def _bilinear_samples(rng):
    x = rng.standard_normal
    yield {"data": x((2, 3, 4, 5))}, {"height": 7, "width": 3}
    yield {"data": x((1, 2, 5, 4))}, {"height": 3, "width": 8, "align_corners": False}
    yield {"data": x((1, 2, 3, 5))}, {"scale_height": 2.0, "scale_width": 0.6, "align_corners": False}
    yield {"data": x((2, 1, 5, 4))}, {"scale_height": 1.5, "scale_width": 2.0, "mode": "odd_scale"}
    yield {"data": x((1, 2, 3, 4)), "like": x((1, 1, 6, 2))}, {"mode": "like"}
    yield {"data": x((1, 2, 5, 5))}, {"mode": "to_even_up", "align_corners": False}
    yield {"data": x((1, 1, 4, 1))}, {"height": 1, "width": 3}


define(OpDef(BILINEAR, prepare=_bilinear_prepare, infer=_bilinear_infer, samples=_bilinear_samples,
             optional={"like": lambda p: p["mode"] == "like"},
             cpu=Lowering(_bilinear_cpu_forward, _bilinear_cpu_backward),
             gpu=Lowering(_bilinear_gpu_forward, _bilinear_gpu_backward),
             doc="Bilinear resizing of (N, C, H, W) data (MXNet's contrib BilinearResize2D): the output size by "
                 "``mode``, corners aligned or not."))


# AdaptiveAvgPooling2D ----------------------------------------------------------------------------------------------

def _adaptive_hw(p, dshape: tuple) -> tuple[int, int]:
    size = tuple(p["output_size"] or ())
    if len(size) > 2:
        raise DnnbindValueError(f"{ADAPTIVE}: output_size must be () (1 x 1), (size,) or (height, width), got "
                                f"{size} (data {dshape})")
    hw = (1, 1) if not size else (size[0], size[0]) if len(size) == 1 else size
    if min(hw) < 1:
        raise DnnbindValueError(f"{ADAPTIVE}: output_size must be positive, got {size} (data {dshape})")
    return tuple(int(v) for v in hw)


def _adaptive_prepare(p, data):
    _check_data(ADAPTIVE, data)
    if 0 in data.shape[2:]:
        raise DnnbindValueError(f"{ADAPTIVE}: data has an empty spatial axis, shape {tuple(data.shape)}: no bin "
                                "to average")
    out = tuple(data.shape[:2]) + _adaptive_hw(p, tuple(data.shape))
    check_fits(ADAPTIVE, data.device, data.dtype, "the output", out, f" (data {tuple(data.shape)})", cudnn=False)
    return Geometry(tuple(data.shape), out)


def _adaptive_infer(p, shapes):
    data = tuple(shapes[0])
    return [data], [data[:2] + _adaptive_hw(p, data)]


def _adaptive_cpu_forward(c, x):
    return ref.adaptive_avg_pool(x, c.geo.out_shape[2:]), None


def _adaptive_cpu_backward(c, saved, grads, dy):
    return (ref.adaptive_avg_pool_backward(dy, c.geo.in_shape),)


def _adaptive_gpu_taps(c, dtype, device):
    g = c.geo
    (h, w), (oh, ow) = g.in_shape[2:], g.out_shape[2:]
    return (_taps("adaptive", h, oh, False, dtype, device), _taps("adaptive", w, ow, False, dtype, device))


def _adaptive_gpu_forward(c, x):
    if x.size == 0:
        return zeros(c.geo.out_shape, x.dtype, x.device), None
    return _separable_forward(x, *_adaptive_gpu_taps(c, x.dtype, x.device)), None


def _adaptive_gpu_backward(c, saved, grads, dy):
    if dy.size == 0:
        return (zeros(c.geo.in_shape, dy.dtype, dy.device),)
    return (_separable_backward(dy, c.geo.in_shape, *_adaptive_gpu_taps(c, dy.dtype, dy.device)),)


def _adaptive_samples(rng):
    x = rng.standard_normal
    yield {"data": x((2, 3, 5, 7))}, {"output_size": (2, 3)}
    yield {"data": x((1, 2, 4, 4))}, {}
    yield {"data": x((1, 2, 3, 5))}, {"output_size": (4,)}
    yield {"data": x((2, 1, 7, 6))}, {"output_size": (3, 4)}


define(OpDef(ADAPTIVE, prepare=_adaptive_prepare, infer=_adaptive_infer, samples=_adaptive_samples,
             cpu=Lowering(_adaptive_cpu_forward, _adaptive_cpu_backward),
             gpu=Lowering(_adaptive_gpu_forward, _adaptive_gpu_backward),
             doc="Adaptive average pooling of (N, C, H, W) data to ``output_size`` (MXNet's contrib "
                 "AdaptiveAvgPooling2D): bin o of an axis averages floor(o * I / O) .. ceil((o + 1) * I / O) - 1."))
