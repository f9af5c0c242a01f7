"""MXNet's ``Convolution``: cuDNN's convolution forward and backward (ops/conv.py) on a GPU, ops/reference/conv.py on
the cpu; 1-D, 2-D and 3-D, NCHW and NHWC (2-D only), groups, dilation; a fused ReLU with dnnbind's
``act_type='relu'``.

MXNet 1.9.1 declares the parameters (kernel and num_filter required; stride, dilate 1 and pad 0 on every axis by
default; weight (num_filter, C/num_group, *kernel), a bias (num_filter,) unless ``no_bias``). ``workspace``,
``cudnn_tune`` and ``cudnn_off`` are parsed and ignored: dnnbind times and caches algorithms per shape (ops.algos).
1-D data (N, C, W) runs the 2-D path on (N, C, 1, W) views. 3-D data (N, C, D, H, W) (weight (num_filter,
C/num_group, kd, kh, kw)) runs cuDNN's N-d descriptors, channels first only: MXNet 1.9.1 parses layout='NDHWC' but its
CPU kernels fail on it, so dnnbind refuses it. ``layout='NHWC'``: data (N, H, W, C), weight (num_filter, kh, kw,
C/num_group), run by cuDNN on channels-last descriptors.

``act_type='relu'`` (dnnbind's addition: what Gluon's ``Conv2D(activation='relu')`` passes) fuses the ReLU. The GPU
lowering's tactics live here, beside the library calls:
- forward: one cudnnConvolutionBiasActivationForward or backend plan (ops.conv_bias_relu_forward; a first layer's
  few taps by an NVRTC kernel). Where cuDNN has no fused engine (some float16 or NHWC shapes) the refusal is
  remembered (``UNFUSED``) and the conv, then the ReLU, run instead;
- backward: the ReLU's mask with the bias gradient in one kernel pass over y and dy (ops.bias_relu_backward,
  ``RELU_BIAS_KERNEL``), then cuDNN's data and filter gradients; a first layer (no data gradient, at most 32 taps)
  takes dw and db from one kernel pass instead (ops.bias_relu_wgrad, ``SMALL_WGRAD_KERNEL``), where cuDNN's
  backward-filter is slow at 1-3 input channels. The bias gradient of an unfused conv is two cuBLAS gemvs
  (ops.conv.conv_backward_bias_gemv: cudnnConvolutionBackwardBias is slow, FACTS.md). Gradients are written straight
  into a Parameter's grad buffer where autograd offers one (``grads.into``).
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import CudnnError, DnnbindTypeError, DnnbindValueError
from ..._lib.hooks import TRACING
from ...runtime import config
from .. import bias_relu as _bias_relu
from .. import conv as _conv
from .. import pointwise as _pointwise
from .. import reference
from ..args import bias_matches, check_fits, spatial
from ..opdef import Lowering, OpDef, define, view

RELU_BIAS_KERNEL = True  # False: a fused conv's backward takes cudnnActivationBackward + gemv (tests compare)
SMALL_WGRAD_KERNEL = True  # False: a first layer's dw, db take bias_relu_backward + cuDNN as well (tests compare)
UNFUSED: set = set()  # float16 or NHWC geometries cuDNN could not fuse (the legacy call refused, no backend plan)
_FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class Geometry:
    """A checked call's geometry: the 2-D shapes cuDNN sees (1-D data as (N, C, 1, W)), stride, pad, dilate,
    groups, layout, whether there is a ReLU and whether it may be fused (2-D only), the number of spatial axes, and
    the output's shape as the caller sees it."""
    __slots__ = ("x_shape", "w_shape", "y_shape", "out_shape", "stride", "pad", "dilate", "groups", "layout",
                 "relu", "fusable", "dims", "key", "plans")

    def conv_args(self) -> tuple:
        return self.stride, self.pad, self.dilate, self.groups

    def plan(self, opname: str, dtype, b_shape=None):
        """ops.conv's checked plan of this call for ``opname`` under the current math mode, made once per
        geometry (a geometry is cached per call signature, so a warm call is two dict lookups)."""
        key = (opname, config.math_mode())
        plan = self.plans.get(key)
        if plan is None:
            dy_shape = self.y_shape if opname in ("conv_backward_data", "conv_backward_filter") else None
            plan = self.plans[key] = _conv.conv_plan(opname, self.x_shape, self.w_shape, self.stride, self.pad,
                                                     self.dilate, self.groups, dtype, b_shape=b_shape,
                                                     dy_shape=dy_shape, layout=self.layout)
        return plan


def _prepare(p, data, weight, bias):
    op = "Convolution"
    kernel, num_filter, num_group, no_bias, layout = (p["kernel"], p["num_filter"], p["num_group"], p["no_bias"],
                                                      p["layout"])
    for name in ("num_filter", "num_group"):
        if p[name] < 1:
            raise DnnbindValueError(f"value {p[name]} for Parameter {name} should be greater equal to 1, in operator "
                                    f"{op}")
    if not kernel:
        raise DnnbindValueError(f"{op}: kernel must give the filter's size on each spatial axis, got {kernel!r} "
                                f"(data {data.shape})")
    dims = len(kernel)
    if dims not in (1, 2, 3) or data.ndim != dims + 2:
        axes = {1: "W", 2: "H, W", 3: "D, H, W"}.get(dims, "...")
        raise DnnbindValueError(f"{op}: kernel {kernel} has {dims} spatial axes, so data must be {dims + 2}-D (N, C, "
                                f"{axes}); got data {data.shape}")
    if dims == 3:
        if layout not in (None, "NCDHW"):  # MXNet 1.9.1: NDHWC passes shape inference, then its CPU kernels fail
            raise DnnbindValueError(f"{op}: layout must be 'NCDHW' for 5-D data {data.shape}, got {layout!r} "
                                    "(channels-last 3-D convolution is not supported; MXNet 1.9.1's CPU kernels "
                                    "refuse it too)")
        layout = "NCHW"  # channels first: what ops.conv calls it for 4-D and 5-D data alike
    elif dims == 1:
        if layout not in (None, "NCW"):
            kind = NotImplementedError if layout == "NWC" else DnnbindValueError
            raise kind(f"{op}: layout must be 'NCW' for 3-D data {data.shape}, got {layout!r}")
        layout = "NCHW"
    elif layout not in (None, "NCHW", "NHWC"):
        raise DnnbindValueError(f"{op}: layout must be 'NCHW' or 'NHWC' (data {data.shape}), got {layout!r}")
    layout = layout or "NCHW"
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and a.dtype != data.dtype:
            raise DnnbindTypeError(f"{op}: {name} is {a.dtype} but data is {data.dtype}; every array must share one dtype")
    if min(kernel) < 1:
        raise DnnbindValueError(f"{op}: kernel must be >= 1 on every axis, got {kernel} (data {data.shape})")
    stride = spatial(op, "stride", p["stride"], dims, 1, 1, data.shape)
    dilate = spatial(op, "dilate", p["dilate"], dims, 1, 1, data.shape)
    pad = spatial(op, "pad", p["pad"], dims, 0, 0, data.shape)
    bias_matches(op, bias, no_bias, num_filter)
    nhwc = layout == "NHWC"
    c = data.shape[-1] if nhwc else data.shape[1]
    if c % num_group or num_filter % num_group:
        raise DnnbindValueError(f"{op}: num_group {num_group} must divide the data's {c} channels and num_filter "
                                f"{num_filter} (data {data.shape})")
    want = (num_filter,) + kernel + (c // num_group,) if nhwc else (num_filter, c // num_group) + kernel
    wc = (weight.shape[-1] if nhwc else weight.shape[1]) if weight.ndim == dims + 2 else None
    if wc is not None and wc * num_group != c:
        raise DnnbindValueError(f"{op}: data has {c} channels but weight {weight.shape} expects {wc * num_group} "
                                f"(num_group {num_group}, layout {layout}): data {data.shape}; expected weight {want}")
    if weight.shape != want:
        raise DnnbindValueError(f"{op}: weight has shape {weight.shape} but data {data.shape} with kernel {kernel}, "
                                f"num_filter {num_filter}, num_group {num_group} (layout {layout}) needs {want}")
    if bias is not None and bias.shape != (num_filter,):
        raise DnnbindValueError(f"{op}: bias has shape {bias.shape}; expected ({num_filter},) (num_filter)")
    size = data.shape[1:-1] if nhwc else data.shape[2:]
    padded = tuple(s + 2 * q for s, q in zip(size, pad))
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilate, kernel))
    if any(e > s for e, s in zip(span, padded)):
        raise DnnbindValueError(f"{op}: kernel {kernel} with dilate {dilate} spans {span}, more than the padded input "
                                f"{padded} (data {data.shape}, pad {pad})")
    spatial_out = tuple((s - e) // st + 1 for s, e, st in zip(padded, span, stride))
    out_shape = (data.shape[0],) + (spatial_out + (num_filter,) if nhwc else (num_filter,) + spatial_out)
    context = f" (data {data.shape}, weight {weight.shape}, stride {stride}, pad {pad}, dilate {dilate})"
    check_fits(op, data.device, data.dtype, "the output", out_shape, context)
    n = data.shape[0]
    check_fits(op, data.device, data.dtype, "the padded input", (n,) + padded + (c,) if nhwc else (n, c) + padded,
               context)
    g = Geometry()
    g.plans = {}
    if dims == 1:  # (N, C, W) as (N, C, 1, W), the weight (F, C/g, k) as (F, C/g, 1, k)
        g.x_shape, g.w_shape = (n, c, 1, size[0]), weight.shape[:2] + (1,) + weight.shape[2:]
        g.y_shape = (n, num_filter, 1, spatial_out[0])
        stride, pad, dilate = (1,) + stride, (0,) + pad, (1,) + dilate
    else:
        g.x_shape, g.w_shape, g.y_shape = data.shape, weight.shape, out_shape
    g.out_shape, g.stride, g.pad, g.dilate, g.groups, g.layout = out_shape, stride, pad, dilate, num_group, layout
    g.relu = p["act_type"] == "relu"
    g.fusable = g.relu and dims != 3  # cuDNN's fused conv+bias+ReLU (and dnnbind's kernels for it) are 4-D only
    g.dims = dims
    g.key = (g.x_shape, g.w_shape, data.dtype, stride, pad, dilate, num_group, layout)
    return g


def _infer(p, shapes):
    data = shapes[0]
    k = tuple(p["kernel"])
    n = len(k)
    last = bool(p["layout"]) and p["layout"].endswith("C")
    c = data[-1] if last else data[1]
    g, f = p["num_group"], p["num_filter"]
    weight = (f, *k, c // g) if last else (f, c // g, *k)
    s = spatial("Convolution", "stride", p["stride"], n, 1, 1, data)
    pad = spatial("Convolution", "pad", p["pad"], n, 0, 0, data)
    d = spatial("Convolution", "dilate", p["dilate"], n, 1, 1, data)
    sp = data[1:-1] if last else data[2:]
    out_sp = tuple((sp[i] + 2 * pad[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(n))
    out = (data[0], *out_sp, f) if last else (data[0], f, *out_sp)
    return [data, weight, (f,)], [out]


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, w, b):
    g = c.geo
    x4, w4 = x.reshape(g.x_shape), w.reshape(g.w_shape)
    y = reference.conv_forward(x4, w4, b, *g.conv_args(), layout=g.layout)
    if g.relu:
        y = np.maximum(y, 0)
    # the output is the saved array itself (2-D), so a backward that drops it lets its memory go
    return (y if y.shape == g.out_shape else y.reshape(g.out_shape)), [x4, w4, y if g.relu else None]


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    x4, w4 = saved[0], saved[1]
    dy = dy.reshape(g.y_shape)
    if g.relu:
        dy = dy * (saved[2] > 0)
        if grads.frees:  # as on the GPU: y goes before the convolution's backward allocates
            saved[2] = None
    dx = reference.conv_backward_data(w4, dy, g.x_shape, *g.conv_args(), layout=g.layout) if grads.needs[0] \
        else None
    dw = reference.conv_backward_filter(x4, dy, g.w_shape, *g.conv_args(), layout=g.layout) if grads.needs[1] \
        else None
    db = reference.conv_backward_bias(dy, layout=g.layout) if grads.needs[2] else None
    if len(g.out_shape) == 3:  # back to the 1-D shapes
        dx = None if dx is None else dx.reshape(_x_shape_1d(g))
        dw = None if dw is None else dw.reshape(_w_shape_1d(g))
    return dx, dw, db


# gpu: cuDNN, cuBLAS and the bias/ReLU kernels --------------------------------------------------------------------

def _gpu_forward(c, x, w, b):
    g = c.geo
    if g.dims == 3:
        return _gpu_forward_3d(g, x, w, b)
    if TRACING:  # the checked entry points, which name ops.conv's calls in the trace
        return _gpu_forward_traced(g, x, w, b)
    one_d = len(g.out_shape) == 3
    if one_d:
        x, w = view(x, g.x_shape), view(w, g.w_shape)
    ctx = c.ctx()
    y = None
    if g.fusable and b is not None and x.dtype in _FUSED_DTYPES and g.key not in UNFUSED:
        try:
            y = _conv.bias_relu_forward_on(ctx, g.plan("conv_bias_relu_forward", x.dtype, b.shape), x, w, b)
        except CudnnError:  # float16 or NHWC: where cuDNN has no fused engine for the shape, the two calls
            # NOTE: cuDNN documents the legacy fused call for NCHW float32; NHWC float32 may have no engine.
            if x.dtype != np.float16 and g.layout == "NCHW":
                raise
            UNFUSED.add(g.key)
    if y is None:
        y = _conv.forward_on(ctx, g.plan("conv_forward", x.dtype, None if b is None else b.shape), x, w, b)
        if g.relu:
            y = _pointwise.activation_forward.gpu(y, "relu")
    saved = [x, w, b, y if g.relu else None]
    return (view(y, g.out_shape) if one_d else y), saved


def _gpu_forward_traced(g, x, w, b):
    one_d = len(g.out_shape) == 3
    if one_d:
        x, w = view(x, g.x_shape), view(w, g.w_shape)
    y = None
    if g.fusable and b is not None and x.dtype in _FUSED_DTYPES and g.key not in UNFUSED:
        try:
            y = _conv.conv_bias_relu_forward.gpu(x, w, b, *g.conv_args(), layout=g.layout)
        except CudnnError:
            if x.dtype != np.float16 and g.layout == "NCHW":
                raise
            UNFUSED.add(g.key)
    if y is None:
        y = _conv.conv_forward.gpu(x, w, b, *g.conv_args(), layout=g.layout)
        if g.relu:
            y = _pointwise.activation_forward.gpu(y, "relu")
    saved = [x, w, b, y if g.relu else None]
    return (view(y, g.out_shape) if one_d else y), saved


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    if g.dims == 3:
        return _gpu_backward_3d(g, saved, grads, dy)
    x, w, b, out = saved
    needs = grads.needs
    into_w, into_b = grads.into[1], grads.into[2]
    one_d = len(g.out_shape) == 3
    if one_d:
        dy = view(dy, g.y_shape)
        if into_w is not None:  # the Parameter's buffer has the 1-D shape: written through a 2-D view of it
            into_w = view(into_w, g.w_shape)
    bias_grad = b is not None and needs[2]
    db = None
    if g.relu:  # relu'(z) from its output: y > 0 exactly where z > 0
        if grads.frees:  # nothing reads y after this: its memory returns before the conv's backward allocates
            saved[3] = None
        if (SMALL_WGRAD_KERNEL and bias_grad and needs[1] and not needs[0] and g.groups == 1
                and _bias_relu.wgrad_fits(x, out, g.w_shape, g.layout)):
            dw, db = _bias_relu.bias_relu_wgrad.gpu(x, out, dy, g.w_shape, g.stride, g.pad, g.dilate, g.layout, into_w, into_b)
            return None, (_back_1d(dw, _w_shape_1d(g), grads.into[1]) if one_d else dw), db
        if bias_grad and RELU_BIAS_KERNEL:
            dy, db = _bias_relu.bias_relu_backward.gpu(out, dy, layout=g.layout, out=into_b)
        else:
            dy = _pointwise.activation_backward.gpu(out, dy, out, "relu")
        del out
    if TRACING:  # the checked entry points, which name ops.conv's calls in the trace
        dx = _conv.conv_backward_data.gpu(w, dy, g.x_shape, *g.conv_args(), layout=g.layout) if needs[0] else None
        dw = _conv.conv_backward_filter.gpu(x, dy, g.w_shape, *g.conv_args(), out=into_w, layout=g.layout) \
            if needs[1] else None
        if bias_grad and db is None:
            db = _conv.conv_backward_bias_gemv(dy, out=into_b, layout=g.layout)
    else:
        ctx = grads.ctx(dy)
        dx = _conv.backward_data_on(ctx, g.plan("conv_backward_data", dy.dtype), w, dy) if needs[0] else None
        dw = _conv.backward_filter_on(ctx, g.plan("conv_backward_filter", dy.dtype), x, dy, into_w) \
            if needs[1] else None
        if bias_grad and db is None:
            db = _conv.backward_bias_on(ctx, dy, into_b, g.layout)
    if one_d:
        dx = None if dx is None else view(dx, _x_shape_1d(g))
        dw = None if dw is None else _back_1d(dw, _w_shape_1d(g), grads.into[1])
    return dx, dw, db


def _gpu_forward_3d(g, x, w, b):
    """5-D data: cuDNN's convolution on N-d descriptors, then the ReLU (if any) as its own call."""
    y = _conv.conv_forward.gpu(x, w, b, *g.conv_args())
    if g.relu:
        y = _pointwise.activation_forward.gpu(y, "relu")
    return y, [x, w, b, y if g.relu else None]


def _gpu_backward_3d(g, saved, grads, dy):
    x, w, b, out = saved
    needs = grads.needs
    if g.relu:
        if grads.frees:
            saved[3] = None
        dy = _pointwise.activation_backward.gpu(out, dy, out, "relu")
        del out
    dx = _conv.conv_backward_data.gpu(w, dy, g.x_shape, *g.conv_args()) if needs[0] else None
    dw = _conv.conv_backward_filter.gpu(x, dy, g.w_shape, *g.conv_args(), out=grads.into[1]) if needs[1] else None
    db = None
    if b is not None and needs[2]:  # the per-channel sum of dy, seen as (N, K, O*P*Q, 1): the gemvs are 4-D
        n, k = g.y_shape[:2]
        db = _conv.conv_backward_bias_gemv(view(dy, (n, k, math.prod(g.y_shape[2:]), 1)), out=grads.into[2])
    return dx, dw, db


def _x_shape_1d(g) -> tuple:
    return g.x_shape[:2] + g.x_shape[3:]


def _w_shape_1d(g) -> tuple:
    return g.w_shape[:2] + g.w_shape[3:]


def _back_1d(dw, shape, into):
    """A 1-D conv's weight gradient in the weight's shape: the Parameter's own buffer where it was written there
    (so autograd sees it is written), else a view."""
    return into if into is not None else view(dw, shape)


def _samples(rng):
    x = rng.standard_normal
    yield {"data": x((2, 3, 7, 6)), "weight": x((4, 3, 3, 3)), "bias": x((4,))}, {"kernel": (3, 3), "num_filter": 4}
    yield ({"data": x((2, 4, 9, 8)), "weight": x((6, 2, 3, 2)), "bias": x((6,))},
           {"kernel": (3, 2), "num_filter": 6, "num_group": 2, "stride": (2, 1), "pad": (1, 0), "dilate": (1, 2)})
    yield {"data": x((1, 2, 5, 5)), "weight": x((3, 2, 1, 1))}, {"kernel": (1, 1), "num_filter": 3, "no_bias": True}
    yield ({"data": x((2, 6, 5, 3)), "weight": x((4, 3, 3, 3)), "bias": x((4,))},
           {"kernel": (3, 3), "num_filter": 4, "pad": (1, 1), "layout": "NHWC"})
    yield ({"data": x((2, 3, 11)), "weight": x((5, 3, 3)), "bias": x((5,))},
           {"kernel": (3,), "num_filter": 5, "stride": (2,), "pad": (1,)})
    yield ({"data": x((2, 3, 6, 6)), "weight": x((4, 3, 3, 3)), "bias": x((4,))},
           {"kernel": (3, 3), "num_filter": 4, "pad": (1, 1), "act_type": "relu"})
    yield ({"data": x((2, 4, 4, 5, 3)), "weight": x((6, 2, 2, 3, 1)), "bias": x((6,))},
           {"kernel": (2, 3, 1), "num_filter": 6, "num_group": 2, "stride": (1, 2, 1), "pad": (1, 0, 1),
            "dilate": (2, 1, 1)})
    yield ({"data": x((1, 2, 3, 4, 4)), "weight": x((3, 2, 1, 3, 3))},
           {"kernel": (1, 3, 3), "num_filter": 3, "pad": (0, 1, 1), "no_bias": True, "act_type": "relu"})


define(OpDef("Convolution", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             extra=(("act_type", "{None, 'relu'},optional, default='None'"),),
             optional={"bias": lambda p: not p["no_bias"]},
             doc="y = conv(x, w) + b (MXNet's Convolution): cuDNN's convolution forward, backward data, filter; "
                 "the bias gradient by cuBLAS."))
