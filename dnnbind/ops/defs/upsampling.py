"""MXNet's ``UpSampling`` of (N, C, H, W) data by an integer ``scale``: ``sample_type`` 'nearest' (each pixel
repeated scale x scale times) or 'bilinear' (a learned depthwise transposed convolution).

- nearest: the table's broadcast_to on a (N, C, H, 1, W, 1) view on a GPU (one copy kernel), its gradient the sum
  over each scale x scale block (the table's sum); numpy on the cpu. MXNet's input is a list of ``num_args`` arrays:
  the output is (N, ., H0 * scale, W0 * scale) for the first input's H0, W0, every input is upsampled to that size
  (input i by (H0 * scale) / H_i, which must divide exactly and be the same on both axes), then concatenated along
  the channels (``multi_input_mode`` 'concat', the default) or added ('sum', every input with the same channels).
- bilinear: exactly two inputs, the data and a weight (C, 1, k, k), k = 2 * scale - scale % 2: MXNet's
  Deconvolution with that kernel, stride scale, pad ceil((scale - 1) / 2), num_group = num_filter = C and no bias,
  so the output is (N, C, H * scale, W * scale). It runs Deconvolution's own lowerings (ops/defs/deconvolution.py:
  cuDNN on a GPU), with Deconvolution's gradients of the data and of the weight. ``num_filter`` must be C (MXNet
  1.9.1 crashes on its default 0 and fails on any other value); ``num_args`` is not read (MXNet's symbol API writes
  1, its nd API 2). A symbol's weight variable carries MXNet's ``["bilinear", {}]`` initializer.

The dispatch (nd/_registry.py ``_lib_call``) passes UpSampling's variadic ``data`` (MXNet's
``NDArray-or-Symbol[]``) as every array given, and fills ``num_args`` from their count when it is left out, as
MXNet's frontend does.

Refused as MXNet refuses: scale or num_args below 1, a count of inputs other than num_args (nearest) or 2
(bilinear), data that is not 4-D, not floating-point, or of mixed dtypes, an input whose size does not divide the
output's, inputs of different channels in 'sum' mode, a weight of another shape. Also refused where MXNet fails at
run time: inputs of different batch sizes, an input upsampled by different factors on the two axes, an input with an
empty spatial axis. float16 bilinear runs on a GPU only (Deconvolution's numpy twin computes float32 and float64).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ..args import check_fits
from ..opdef import DEFS, Call, Grads, Lowering, OpDef, define, table, view

NAME = "UpSampling"


class Geometry(NamedTuple):
    """A checked call. Nearest: ``shapes`` the inputs' shapes, ``scales`` each input's factor, ``add`` whether the
    upsampled inputs are added (else concatenated along the channels). Bilinear: ``deconv`` Deconvolution's call
    (its geometry and parameters). ``out_shape`` the output's."""
    out_shape: tuple
    shapes: tuple = ()
    scales: tuple = ()
    add: bool = False
    deconv: Call | None = None


def _lower_bound(name: str, value: int) -> None:
    if value < 1:  # MXNet's own message (set_lower_bound(1))
        raise DnnbindValueError(f"value {value} for Parameter {name} should be greater equal to 1, in operator {NAME}")


def _prepare(p, *arrays):
    s, n = p["scale"], p["num_args"]
    _lower_bound("scale", s)
    _lower_bound("num_args", n)
    bilinear = p["sample_type"] == "bilinear"
    want = 2 if bilinear else n
    if len(arrays) != want:
        what = "data and weight, for bilinear upsampling" if bilinear else f"num_args={n}"
        raise DnnbindValueError(f"{NAME}: expects {want} inputs ({what}), but got {len(arrays)}")
    names = ("data", "weight") if bilinear else ("data",) if n == 1 else tuple(f"data[{i}]" for i in range(n))
    data = arrays[0]
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{NAME}: data must be a floating-point array, got {data.dtype} (shape "
                               f"{tuple(data.shape)}); use .astype('float32')")
    for name, a in zip(names, arrays):
        if a.dtype != data.dtype:
            raise DnnbindTypeError(f"{NAME}: {name} is {a.dtype} but {names[0]} is {data.dtype}; every input must "
                                   "share one dtype")
        if a.ndim != 4 and name != "weight":
            raise DnnbindValueError(f"{NAME}: {name} must be 4-D (N, C, H, W), got shape {tuple(a.shape)}")
    nb, c, h, w = data.shape
    out_hw = (h * s, w * s)
    context = f" (scale {s}, inputs {', '.join(str(tuple(a.shape)) for a in arrays)})"
    if bilinear:
        return _prepare_bilinear(p, data, arrays[1], context)
    add = p["multi_input_mode"] == "sum" and n > 1
    scales = []
    for name, a in zip(names, arrays):
        if a.shape[0] != nb:
            raise DnnbindValueError(f"{NAME}: {name} has batch size {a.shape[0]} but {names[0]} has {nb}{context}")
        if 0 in a.shape[2:]:
            raise DnnbindValueError(f"{NAME}: {name} has an empty spatial axis, shape {tuple(a.shape)}{context}")
        for axis, o, i in (("height", out_hw[0], a.shape[2]), ("width", out_hw[1], a.shape[3])):
            if o % i:  # MXNet's check
                raise DnnbindValueError(f"{NAME}: input {axis} of {i} ({name}) does not divide output {axis} of "
                                        f"{o}{context}")
        if out_hw[0] // a.shape[2] != out_hw[1] // a.shape[3]:  # MXNet takes the height's factor for both axes
            raise DnnbindValueError(f"{NAME}: {name} would be upsampled {out_hw[0] // a.shape[2]}x in height but "
                                    f"{out_hw[1] // a.shape[3]}x in width; an input must take one factor on both "
                                    f"axes{context}")
        if add and a.shape[1] != c:
            raise DnnbindValueError(f"{NAME}: number of channels must be the same when multi_input_mode==sum, "
                                    f"{name} has {a.shape[1]} and {names[0]} {c}{context}")
        scales.append(out_hw[0] // a.shape[2])
    channels = c if add else sum(a.shape[1] for a in arrays)
    out_shape = (nb, channels) + out_hw
    check_fits(NAME, data.device, data.dtype, "the output", out_shape, context, cudnn=False)
    return Geometry(out_shape, tuple(tuple(a.shape) for a in arrays), tuple(scales), add)


def _prepare_bilinear(p, data, weight, context):
    s, c = p["scale"], data.shape[1]
    k = 2 * s - s % 2
    if p["num_filter"] != c:
        raise DnnbindValueError(f"{NAME}: bilinear upsampling needs num_filter equal to the data's channels, {c}; got "
                                f"num_filter={p['num_filter']}{context}")
    if tuple(weight.shape) != (c, 1, k, k):
        raise DnnbindValueError(f"{NAME}: weight has shape {tuple(weight.shape)}; expected {(c, 1, k, k)} (channels, "
                                f"1, kernel 2 * scale - scale % 2 on both axes){context}")
    if data.dtype == np.float16 and data.device.kind == "cpu":
        raise DnnbindTypeError(f"{NAME}: float16 bilinear upsampling runs on a GPU only; on the cpu use float32 or "
                               f"float64{context}")
    # MXNet's GetDeconvolutionParam; pad ceil((s - 1) / 2) is s // 2
    dp = {"kernel": (k, k), "stride": (s, s), "pad": (s // 2, s // 2), "dilate": (1, 1), "adj": (0, 0),
          "target_shape": (), "num_filter": c, "num_group": c, "no_bias": True, "layout": None}
    deconv = DEFS["Deconvolution"]
    geo = deconv.prepare(dp, data, weight, None)
    return Geometry(geo.out_shape, deconv=Call(geo, dp, data.device, False))


def _infer(p, shapes):
    data, s = tuple(shapes[0]), p["scale"]
    out_hw = (data[2] * s, data[3] * s)
    if p["sample_type"] == "bilinear":
        k = 2 * s - s % 2
        return [data, (data[1], 1, k, k)], [data[:2] + out_hw]
    c = data[1] if p["multi_input_mode"] == "sum" or len(shapes) == 1 else sum(x[1] for x in shapes)
    return [tuple(x) for x in shapes], [(data[0], c) + out_hw]


def _deconv_call(c) -> Call:
    d = c.geo.deconv
    return Call(d.geo, d.p, c.device, c.training)


def _deconv_grads(grads) -> Grads:
    """The weight is Deconvolution's weight; it has no bias."""
    return Grads(tuple(grads.needs) + (False,), tuple(grads.into) + (None,), grads.frees, grads.device)


def _offsets(g) -> list:
    """Each input's first channel in a concatenated output."""
    out, at = [], 0
    for shape in g.shapes:
        out.append(at)
        at += shape[1]
    return out


# cpu: the numpy twin (bilinear: Deconvolution's) -------------------------------------------------------------

def _cpu_up(x, s: int):
    n, c, h, w = x.shape
    return np.broadcast_to(x[:, :, :, None, :, None], (n, c, h, s, w, s)).reshape(n, c, h * s, w * s)


def _cpu_down(dy, shape, s: int):
    n, c, h, w = shape
    return dy.reshape(n, c, h, s, w, s).sum(axis=(3, 5))


def _cpu_forward(c, *xs):
    g = c.geo
    if g.deconv is not None:
        y, saved = DEFS["Deconvolution"].cpu.forward(_deconv_call(c), xs[0], xs[1], None)
        return y, saved
    ups = [_cpu_up(x, s) for x, s in zip(xs, g.scales)]
    if len(ups) == 1:
        y = np.array(ups[0], order="C")  # a copy even at scale 1 (MXNet's output is a new array)
    elif g.add:
        y = ups[0] + ups[1]
        for u in ups[2:]:
            y += u
    else:
        y = np.concatenate(ups, axis=1)
    return y, None


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    if g.deconv is not None:
        return DEFS["Deconvolution"].cpu.backward(_deconv_call(c), saved, _deconv_grads(grads), dy)[:2]
    out = []
    for need, shape, s, at in zip(grads.needs, g.shapes, g.scales, _offsets(g)):
        part = dy if g.add or len(g.shapes) == 1 else dy[:, at:at + shape[1]]
        out.append(np.ascontiguousarray(_cpu_down(part, shape, s)) if need else None)
    return tuple(out)


# gpu: the table's broadcast_to and sum (bilinear: Deconvolution's cuDNN lowering) -----------------------------

def _gpu_up(x, s: int):
    n, c, h, w = x.shape
    y = table("broadcast_to", view(x, (n, c, h, 1, w, 1)), shape=(n, c, h, s, w, s))  # a copy, also at scale 1
    return view(y, (n, c, h * s, w * s))


def _gpu_forward(c, *xs):
    g = c.geo
    if g.deconv is not None:
        return DEFS["Deconvolution"].gpu.forward(_deconv_call(c), xs[0], xs[1], None)
    if len(xs) == 1:
        return _gpu_up(xs[0], g.scales[0]), None
    # an input at its own size (factor 1) goes into the concatenation or the sum as it is
    ups = [x if s == 1 else _gpu_up(x, s) for x, s in zip(xs, g.scales)]
    if not g.add:
        return table("concat", *ups, dim=1), None
    y = table("add", ups[0], ups[1])
    for u in ups[2:]:
        y = table("add", y, u)
    return y, None


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    if g.deconv is not None:
        return DEFS["Deconvolution"].gpu.backward(_deconv_call(c), saved, _deconv_grads(grads), dy)[:2]
    out = []
    for need, (n, ch, h, w), s, at in zip(grads.needs, g.shapes, g.scales, _offsets(g)):
        if not need:
            out.append(None)
            continue
        part = dy
        if not g.add and len(g.shapes) > 1:  # this input's channels of the concatenation (a copy)
            part = table("_basic_index", dy, key=(slice(None), slice(at, at + ch)))
        # the sum over each s x s block; at factor 1 too, so that no two inputs get the same array
        out.append(table("sum", view(part, (n, ch, h, s, w, s)), axis=(3, 5)))
    return tuple(out)


def _samples(rng):
    x = rng.standard_normal
    yield {"data": x((2, 3, 4, 5))}, {"scale": 2, "sample_type": "nearest", "num_args": 1}
    yield {"data": x((1, 2, 3, 2))}, {"scale": 3, "sample_type": "nearest", "num_args": 1}
    yield {"data": x((2, 1, 2, 3))}, {"scale": 1, "sample_type": "nearest", "num_args": 1, "multi_input_mode": "sum"}


define(OpDef(NAME, prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             init={"weight": '["bilinear", {}]'},  # bilinear's weight variable, as MXNet's symbol API makes it
             doc="Upsampling of (N, C, H, W) data by ``scale`` (MXNet's UpSampling): 'nearest' repeats each pixel "
                 "(several inputs concatenated or summed), 'bilinear' is a depthwise Deconvolution with the given "
                 "weight."))
