"""MXNet's ``Deconvolution`` (transposed convolution): ops/deconv.py on a GPU (cudnnConvolutionBackwardData forward,
cudnnConvolutionForward for the data gradient, cudnnConvolutionBackwardFilter for the weight's), ops/reference/
deconv.py on the cpu; 1-D, 2-D and 3-D data, NCW/NCHW/NCDHW, groups, dilation.

MXNet 1.9.1 declares the parameters (kernel and num_filter required; stride, dilate 1 and pad, adj 0 on every axis
by default; no_bias True, unlike Convolution). The weight is (in_channels, num_filter/num_group, *kernel); per
spatial axis the output is (in-1)*stride - 2*pad + dilate*(kernel-1) + 1 + adj, with 0 <= adj < stride (a larger
adj is the transpose of no convolution). ``target_shape`` (not all zero) replaces pad and adj as MXNet's
DeconvolutionParam::InferPad does: with t = stride*(in-1) + dilate*(kernel-1) + 1 - target, pad = ceil(t/2) and
adj = t % 2. ``workspace``, ``cudnn_tune`` and ``cudnn_off`` are parsed and ignored: dnnbind times and caches
algorithms per shape (ops.algos). 1-D data (N, C, W) runs the 2-D path on (N, C, 1, W) views, the weight
(C, F/g, k) as (C, F/g, 1, k); gradients come back in the caller's shapes. 3-D data (N, C, D, H, W) runs on
cuDNN's N-d descriptors (ops.conv's 3-D path). Refused where dnnbind has no kernel: channels-last layouts (MXNet's
cpu build has none for Deconvolution either).

The bias gradient is two cuBLAS gemvs (ops.conv.conv_backward_bias_gemv), as for Convolution: cudnnConvolution-
BackwardBias is slow (FACTS.md). The weight and bias gradients are written straight into a Parameter's grad buffer
where autograd offers one (``grads.into``).
"""

from __future__ import annotations

import math

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import deconv as _deconv
from .. import reference
from ..args import check_fits, spatial
from ..conv import conv_backward_bias_gemv
from ..opdef import Lowering, OpDef, define, view

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


class Geometry:
    """A checked call's geometry: the 2-D shapes cuDNN sees (1-D data as (N, C, 1, W)), the 2-D stride, pad,
    dilate, groups and adj (pad and adj from target_shape where it is set), and the output's shape as the caller
    sees it."""
    __slots__ = ("x_shape", "w_shape", "y_shape", "out_shape", "stride", "pad", "dilate", "groups", "adj")

    def conv_args(self) -> tuple:
        return self.stride, self.pad, self.dilate, self.groups

    @property
    def one_d(self) -> bool:
        return len(self.out_shape) == 3


def _prepare(p, data, weight, bias):
    op = "Deconvolution"
    kernel, num_filter, num_group, no_bias, layout = (p["kernel"], p["num_filter"], p["num_group"], p["no_bias"],
                                                      p["layout"])
    for name in ("num_filter", "num_group"):  # MXNet's lower bound (num_group 0 crashes MXNet 1.9.1 itself)
        if p[name] < 1:
            raise DnnbindValueError(f"value {p[name]} for Parameter {name} should be greater equal to 1, in operator "
                                    f"{op}")
    dims = data.ndim - 2
    if dims not in _LAYOUTS:
        raise DnnbindValueError(f"{op}: data must be 3-D (N, C, W), 4-D (N, C, H, W) or 5-D (N, C, D, H, W), got "
                                f"shape {data.shape}")
    if not kernel:
        raise DnnbindValueError(f"{op}: kernel must give the filter's size on each spatial axis, got {kernel!r} "
                                f"(data {data.shape})")
    if len(kernel) != dims:
        raise DnnbindValueError(f"{op}: kernel {kernel} has {len(kernel)} spatial axes but data {data.shape} has "
                                f"{dims}")
    for name in ("stride", "dilate", "pad", "adj", "target_shape"):  # MXNet: one value per axis of the kernel
        v = p[name]
        if v and len(v) != dims:
            raise DnnbindValueError(f"{op}: {name} {v} has {len(v)} value(s) but the kernel {kernel} has {dims}; "
                                    "give one per spatial axis")
    if layout is not None and layout != _LAYOUTS[dims]:
        raise NotImplementedError(f"{op}: only layout={_LAYOUTS[dims]!r} is supported for {data.ndim}-D data "
                                  f"(cuDNN's native layout), got {layout!r}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    if data.dtype.itemsize == 2 and data.device.kind == "cpu":  # the numpy twin computes float32 and float64
        raise DnnbindTypeError(f"{op}: float16 runs on a GPU only; on the cpu use float32 or float64 (data "
                               f"{data.shape})")
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and a.dtype != data.dtype:
            raise DnnbindTypeError(f"{op}: {name} is {a.dtype} but data is {data.dtype}; every array must share one "
                                   "dtype")
    _check_weight(data, weight, kernel, num_filter, num_group, dims)
    if min(kernel) < 1:
        raise DnnbindValueError(f"{op}: kernel must be >= 1 on every axis, got {kernel} (data {data.shape})")
    if no_bias and bias is not None:
        raise DnnbindValueError(f"{op}: a bias was given but no_bias=True (MXNet's default for Deconvolution); pass "
                                "no_bias=False to add it")
    if not no_bias and bias is None:
        raise DnnbindValueError(f"{op}: no_bias=False needs a bias ({num_filter},)")
    if bias is not None and bias.shape != (num_filter,):
        raise DnnbindValueError(f"{op}: bias has shape {bias.shape}; expected ({num_filter},) (num_filter)")
    stride = spatial(op, "stride", p["stride"], dims, 1, 1, data.shape)
    dilate = spatial(op, "dilate", p["dilate"], dims, 1, 1, data.shape)
    pad = spatial(op, "pad", p["pad"], dims, 0, 0, data.shape)
    adj = spatial(op, "adj", p["adj"], dims, 0, 0, data.shape)
    if dims == 3 and dilate != (1, 1, 1):  # MXNet 1.9.1's shape inference refuses it (cuDNN could run it)
        raise DnnbindValueError(f"{op}: Dilate is not supported in 3d deconvolution (MXNet 1.9.1); got dilate "
                                f"{dilate} (data {data.shape})")
    if any(p["target_shape"]):  # MXNet: all zeros (its default) is unset
        target = spatial(op, "target_shape", p["target_shape"], dims, 0, 1, data.shape)
        pad, adj = _infer_pad(data.shape[2:], kernel, stride, dilate, target)
    if any(a >= s for a, s in zip(adj, stride)):
        raise DnnbindValueError(f"{op}: adj {adj} must be smaller than stride {stride} (MXNet's rule; data "
                                f"{data.shape})")
    spatial_out = tuple((i - 1) * s - 2 * q + d * (k - 1) + 1 + a
                        for i, s, q, d, k, a in zip(data.shape[2:], stride, pad, dilate, kernel, adj))
    context = f" (data {data.shape}, weight {weight.shape}, stride {stride}, pad {pad}, dilate {dilate}, adj {adj})"
    if min(spatial_out) < 1:
        raise DnnbindValueError(f"{op}: pad {pad} removes the whole output {spatial_out}{context}")
    out_shape = (data.shape[0], num_filter) + spatial_out
    check_fits(op, data.device, data.dtype, "the output", out_shape, context)
    g = Geometry()
    g.out_shape, g.groups = out_shape, num_group
    if dims == 1:  # (N, C, W) as (N, C, 1, W); the weight (C, F/g, k) as (C, F/g, 1, k)
        g.x_shape, g.w_shape = data.shape[:2] + (1,) + data.shape[2:], weight.shape[:2] + (1,) + weight.shape[2:]
        g.y_shape = out_shape[:2] + (1,) + out_shape[2:]
        stride, pad, dilate, adj = (1,) + stride, (0,) + pad, (1,) + dilate, (0,) + adj
    else:
        g.x_shape, g.w_shape, g.y_shape = data.shape, weight.shape, out_shape
    g.stride, g.pad, g.dilate, g.adj = stride, pad, dilate, adj
    return g


def _check_weight(data, weight, kernel, num_filter, num_group, dims) -> None:
    """The weight against the data and the parameters (messages in the caller's shapes, 1-D included)."""
    op = "Deconvolution"
    layout = "(in_channels, num_filter/num_group, " + {1: "k)", 2: "kh, kw)", 3: "kd, kh, kw)"}[dims]
    if weight.ndim != dims + 2:
        raise DnnbindValueError(f"{op}: weight must be {dims + 2}-D {layout} for {dims + 2}-D data; got weight "
                                f"{weight.shape}, data {data.shape}")
    if weight.shape[0] != data.shape[1]:
        raise DnnbindValueError(f"{op}: data has {data.shape[1]} channels but weight {weight.shape} expects "
                                f"{weight.shape[0]} (weight is {layout}); data {data.shape}")
    if tuple(kernel) != weight.shape[2:]:
        raise DnnbindValueError(f"{op}: kernel {kernel} but weight {weight.shape} has kernel {weight.shape[2:]}")
    if num_filter != weight.shape[1] * num_group:
        raise DnnbindValueError(f"{op}: num_filter {num_filter} but weight {weight.shape} with num_group {num_group} "
                                f"gives {weight.shape[1] * num_group} (weight is {layout})")
    if data.shape[1] % num_group:
        raise DnnbindValueError(f"{op}: data has {data.shape[1]} channels, not divisible by num_group {num_group} "
                                f"(data {data.shape}, weight {weight.shape})")


def _infer_pad(spatial_in, kernel, stride, dilate, target) -> tuple[tuple, tuple]:
    """MXNet's DeconvolutionParam::InferPad: the pad and adj that give ``target``."""
    pad, adj = [], []
    for i, t in enumerate(target):
        total = stride[i] * (spatial_in[i] - 1) + dilate[i] * (kernel[i] - 1) + 1 - t
        if total < 0:
            raise DnnbindValueError(f"Deconvolution: target_shape {target} is too big: at most {t + total} on axis "
                                    f"{i} for input {tuple(spatial_in)}")
        pad.append((total + 1) // 2)
        adj.append(total % 2)
    return tuple(pad), tuple(adj)


def _infer(p, shapes):
    data = shapes[0]
    k = tuple(p["kernel"])
    n = len(k)
    c, g, f = data[1], p["num_group"], p["num_filter"]

    def axes(key, default):  # unset (MXNet's ()) or of another length than the kernel: the default
        v = p[key] or ()
        return tuple(v) if len(v) == n else (default,) * n

    s, pad, d, adj = axes("stride", 1), axes("pad", 0), axes("dilate", 1), axes("adj", 0)
    target = p["target_shape"] or ()
    out_sp = tuple(target) if len(target) == n and all(target) else tuple(
        (data[2 + i] - 1) * s[i] - 2 * pad[i] + d[i] * (k[i] - 1) + 1 + adj[i] for i in range(n))
    return [data, (c, f // g, *k), (f,)], [(data[0], f, *out_sp)]


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, w, b):
    g = c.geo
    x4, w4 = x.reshape(g.x_shape), w.reshape(g.w_shape)
    y = reference.deconv_forward(x4, w4, b, *g.conv_args(), g.adj)
    return y.reshape(g.out_shape), (x4, w4)


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    x4, w4 = saved
    needs = grads.needs
    dy = dy.reshape(g.y_shape)
    dx = reference.deconv_backward_data(w4, dy, g.x_shape, *g.conv_args()) if needs[0] else None
    dw = reference.deconv_backward_filter(x4, dy, g.w_shape, *g.conv_args()) if needs[1] else None
    db = reference.conv_backward_bias(dy) if needs[2] else None
    if g.one_d:  # back to the caller's 1-D shapes
        dx = None if dx is None else dx.reshape(_drop_h(g.x_shape))
        dw = None if dw is None else dw.reshape(_drop_h(g.w_shape))
    return dx, dw, db


# gpu: cuDNN (ops/deconv.py on conv's machinery) and cuBLAS for the bias gradient --------------------------------

def _gpu_forward(c, x, w, b):
    g = c.geo
    if g.one_d:
        x, w = view(x, g.x_shape), view(w, g.w_shape)
    y = _deconv.deconv_forward.gpu(x, w, b, *g.conv_args(), g.adj)
    return (view(y, g.out_shape) if g.one_d else y), (x, w)


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    x, w = saved
    needs, into_w, into_b = grads.needs, grads.into[1], grads.into[2]
    if len(g.y_shape) == 5:
        return _gpu_backward_3d(g, x, w, needs, into_w, into_b, dy)
    if g.one_d:
        dy = view(dy, g.y_shape)
        if into_w is not None:  # the Parameter's buffer has the 1-D shape: written through a 2-D view of it
            into_w = view(into_w, g.w_shape)
    dx = _deconv.deconv_backward_data.gpu(w, dy, g.x_shape, *g.conv_args()) if needs[0] else None
    dw = _deconv.deconv_backward_filter.gpu(x, dy, g.w_shape, *g.conv_args(), out=into_w) if needs[1] else None
    db = conv_backward_bias_gemv(dy, out=into_b) if needs[2] else None
    if g.one_d:
        dx = None if dx is None else view(dx, _drop_h(g.x_shape))
        if dw is not None:  # the Parameter's own buffer where it was written there (autograd then skips a copy)
            dw = grads.into[1] if grads.into[1] is not None else view(dw, _drop_h(g.w_shape))
    return dx, dw, db


def _gpu_backward_3d(g, x, w, needs, into_w, into_b, dy):
    dx = _deconv.deconv_backward_data.gpu(w, dy, g.x_shape, *g.conv_args()) if needs[0] else None
    dw = _deconv.deconv_backward_filter.gpu(x, dy, g.w_shape, *g.conv_args(), out=into_w) if needs[1] else None
    db = None
    if needs[2]:  # the per-channel sum of dy, seen as (N, F, O*P*Q, 1): the gemvs are 4-D
        n, f = g.y_shape[:2]
        db = conv_backward_bias_gemv(view(dy, (n, f, math.prod(g.y_shape[2:]), 1)), out=into_b)
    return dx, dw, db


def _drop_h(shape: tuple) -> tuple:
    return shape[:2] + shape[3:]


def _samples(rng):
    x = rng.standard_normal
    yield ({"data": x((2, 3, 4, 5)), "weight": x((3, 2, 3, 3)), "bias": x((2,))},
           {"kernel": (3, 3), "num_filter": 2, "no_bias": False})
    yield ({"data": x((1, 4, 3, 3)), "weight": x((4, 1, 3, 2)), "bias": x((2,))},
           {"kernel": (3, 2), "num_filter": 2, "num_group": 2, "stride": (2, 2), "pad": (1, 0), "adj": (1, 1),
            "dilate": (1, 2), "no_bias": False})
    yield ({"data": x((1, 2, 3, 3)), "weight": x((2, 3, 3, 3))},  # pad (1, 1), adj (0, 1) from the target
           {"kernel": (3, 3), "num_filter": 3, "stride": (2, 2), "target_shape": (5, 6)})
    yield ({"data": x((1, 6, 3, 2)), "weight": x((6, 1, 2, 2))},
           {"kernel": (2, 2), "num_filter": 3, "num_group": 3, "stride": (3, 2), "adj": (2, 1)})
    yield ({"data": x((2, 3, 5)), "weight": x((3, 2, 3)), "bias": x((2,))},
           {"kernel": (3,), "num_filter": 2, "stride": (2,), "pad": (1,), "adj": (1,), "dilate": (2,),
            "no_bias": False})
    yield ({"data": x((1, 4, 2, 3, 3)), "weight": x((4, 1, 2, 3, 2)), "bias": x((2,))},
           {"kernel": (2, 3, 2), "num_filter": 2, "num_group": 2, "stride": (2, 1, 2), "pad": (0, 1, 1),
            "adj": (1, 0, 0), "no_bias": False})


define(OpDef("Deconvolution", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             optional={"bias": lambda p: not p["no_bias"]},
             doc="y = conv_transpose(x, w) + b (MXNet's Deconvolution): cudnnConvolutionBackwardData, its "
                 "gradients by cudnnConvolutionForward and cudnnConvolutionBackwardFilter, the bias's by cuBLAS."))
