"""MXNet's ``LeakyReLU`` family, element-wise on float data, by ``act_type``:

- 'leaky': x for x > 0, ``slope`` * x otherwise;
- 'prelu': the same with learned slopes ``gamma``: one per channel (axis 1, shape (C,) or any shape of C elements)
  or one for all (size 1). gamma is an input only for prelu (a symbol node of another act_type has none; its
  variable gets MXNet's Constant(0.25) init), and it gets a gradient: sum of x * dy over x <= 0, per channel;
- 'elu': ``slope`` * (exp(x) - 1) below 0; 'selu': lambda * (x, or alpha * (exp(x) - 1) below 0) with
  Klambauer et al.'s constants; 'gelu': x * (1 + erf(x / sqrt 2)) / 2 (MXNet 1.9.1's exact, erf form);
- 'rrelu': in train mode a slope per element drawn uniformly from [``lower_bound``, ``upper_bound``], in predict
  mode their mean. Its node has a second, visible output, ``mask``: the slopes used (MXNet fills it with the draws
  in train mode and leaves it unwritten in predict mode; here it holds the mean slope there). The draws come from
  dnnbind's one random state (runtime/rng.py), so ``mx.random.seed(n)`` repeats them; like nd.random's, they are
  refused inside a recorded step (a replay would repeat them), and so is a range no uniform draw has (not finite,
  or lower_bound > upper_bound; lower_bound == upper_bound draws that one slope).

On a GPU each mode is composed of the table's element-wise ops through ``ops.opdef.table`` ('leaky' is the table's
one-kernel ``_leaky_relu``) and rrelu's slopes are drawn by the counter-based uniform kernel nd.random uses; the
cpu twin is numpy. The backward is written out from the saved input (and rrelu's slopes), never taped: the
derivatives of the forward. MXNet 1.9.1's gradients differ in two places, taken as its bugs: its selu_grad scales
the negative branch by lambda twice (lambda * (alpha + y) where the derivative is y + lambda * alpha;
tests/test_opdefs_nn_extra.py shows it on MXNet's numbers), and it picks the branch by the output's sign, wrong where
a negative slope makes a negative input's output positive (here by x > 0, as the forward picks it). A gamma given
with an act_type other than prelu is refused, as MXNet refuses it ("expects 1 inputs, but got 2"), naming the
act_type.
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ..._lib.hooks import RECORDING
from ...runtime import rng
from ...runtime.array import empty, full
from ..opdef import Lowering, OpDef, define, table, view

# MXNet's constants (src/operator/mshadow_op.h)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_np(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(x), dtype=np.float64)  # (frompyfunc gives objects, and a bare float for 0-d input)


class Geometry:
    __slots__ = ("kind", "slope", "lower", "upper", "gview", "gaxes", "gshape")


def _prepare(p, data, gamma):
    op, kind = "LeakyReLU", p["act_type"]
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    g = Geometry()
    g.kind, g.slope, g.lower, g.upper = kind, p["slope"], p["lower_bound"], p["upper_bound"]
    g.gview = g.gaxes = g.gshape = None
    if kind != "prelu":
        if gamma is not None:
            raise DnnbindValueError(f"{op}: gamma {gamma.shape} was given but act_type='{kind}' takes data only "
                                    "(gamma is prelu's learned slopes); drop it or use act_type='prelu'")
        return g
    if gamma is None:
        raise DnnbindValueError(f"{op}(act_type='prelu'): needs gamma, the learned slopes (shape (1,) or (C,)) "
                                f"(data {data.shape})")
    if gamma.dtype != data.dtype:
        raise DnnbindTypeError(f"{op}(act_type='prelu'): gamma is {gamma.dtype} but data is {data.dtype}; both must "
                               "share one dtype")
    if gamma.size == 1:  # one slope for every element: seen with data's rank, so the result keeps data's shape
        g.gview, g.gaxes = (1,) * data.ndim, tuple(range(data.ndim))
    elif data.ndim >= 2 and gamma.size == data.shape[1]:  # one per channel, axis 1
        g.gview = (1, gamma.size) + (1,) * (data.ndim - 2)
        g.gaxes = (0,) + tuple(range(2, data.ndim))
    else:
        raise DnnbindValueError(f"{op}(act_type='prelu'): gamma has shape {gamma.shape}; expected (1,) or "
                                f"({data.shape[1] if data.ndim > 1 else 1},) for data of shape {data.shape}")
    g.gshape = gamma.shape
    return g


def _infer(p, shapes):
    data = shapes[0]
    outs = [data, data] if p["act_type"] == "rrelu" else [data]  # rrelu: its mask too
    if p["act_type"] != "prelu":
        return [data], outs
    # MXNet keeps a gamma of known shape as it is (prepare checks it) and makes an unknown one (C,)
    gamma = shapes[1] if len(shapes) > 1 and shapes[1] is not None and all(d > 0 for d in shapes[1]) else None
    return [data, gamma if gamma is not None else (data[1],)], outs


def _draw_bounds(c) -> tuple[float, float]:
    """rrelu's draw range, refused where no uniform draw exists (as nd.random.uniform refuses it)."""
    lo, hi = c.geo.lower, c.geo.upper
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise DnnbindValueError(f"LeakyReLU(act_type='rrelu'): lower_bound ({lo}) and upper_bound ({hi}) must be "
                                "finite, lower_bound <= upper_bound")
    return lo, hi


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, gamma=None):
    g = c.geo
    kind = g.kind
    pos = x > 0
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "leaky":
            return np.where(pos, x, x * x.dtype.type(g.slope)), x
        if kind == "prelu":
            return np.where(pos, x, x * gamma.reshape(g.gview)), (x, gamma)
        if kind in ("elu", "selu"):
            # expm1 of min(x, 0): the branch not taken never overflows (0 * inf would make the gradient NaN)
            alpha, scale = (g.slope, 1.0) if kind == "elu" else (SELU_ALPHA, SELU_LAMBDA)
            y = np.where(pos, x, alpha * np.expm1(np.minimum(x, 0))) * scale
            return y.astype(x.dtype, copy=False), x
        if kind == "gelu":
            xf = x.astype(np.float64)
            return (0.5 * xf * (1.0 + _erf_np(xf * _INV_SQRT2))).astype(x.dtype), x
        if c.training:  # rrelu
            lo, hi = _draw_bounds(c)
            slopes = rng.host_rng().uniform(lo, hi, x.shape).astype(x.dtype)
        else:
            slopes = np.full(x.shape, (g.lower + g.upper) / 2.0, x.dtype)
        return (np.where(pos, x, x * slopes), slopes), (x, slopes)


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    kind = g.kind
    if kind == "prelu":
        x, gamma = saved
        pos = x > 0
        dx = np.where(pos, dy, dy * gamma.reshape(g.gview)) if grads.needs[0] else None
        dgamma = None
        if grads.needs[1]:
            dgamma = np.where(pos, 0, x * dy).sum(axis=g.gaxes, keepdims=True).reshape(g.gshape)
            dgamma = dgamma.astype(gamma.dtype, copy=False)
        return dx, dgamma
    x, slopes = saved if kind == "rrelu" else (saved, None)
    pos = x > 0
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "leaky":
            dx = np.where(pos, dy, dy * dy.dtype.type(g.slope))
        elif kind == "rrelu":
            dx = np.where(pos, dy, dy * slopes)
        elif kind in ("elu", "selu"):
            alpha, scale = (g.slope, 1.0) if kind == "elu" else (SELU_ALPHA, SELU_LAMBDA)
            dx = np.where(pos, dy, dy * (alpha * np.exp(np.minimum(x, 0)))) * scale
        else:  # gelu: (1 + erf(x / sqrt 2)) / 2 + x * exp(-x^2 / 2) / sqrt(2 pi)
            xf = x.astype(np.float64)
            d = 0.5 * (1.0 + _erf_np(xf * _INV_SQRT2)) + xf * np.exp(-0.5 * xf * xf) * _INV_SQRT_2PI
            dx = dy * d
    return dx.astype(x.dtype, copy=False), None


# gpu: the table's element-wise ops -----------------------------------------------------------------------------

def _draw_gpu(c, x):
    """rrelu's slopes on the GPU: the counter-based uniform kernel nd.random draws with, from the shared state."""
    from ...kernels import strided
    from ...runtime.array import contiguous_strides
    from ...runtime.stream import current_stream
    lo, hi = _draw_bounds(c)
    if RECORDING:  # the seed and offset are host values baked into the launch: a replay would repeat them
        RECORDING[-1].refuse("LeakyReLU(act_type='rrelu') draws its slopes from a host-side counter that a replay "
                             "cannot advance")
    slopes = empty(x.shape, x.dtype, x.device)
    s, off = rng.take(slopes.size)
    if slopes.size:
        strided.random_fill(strided.Ref(slopes.ptr, x.dtype, contiguous_strides(x.shape)), slopes.size,
                            "uniform", s, off, lo, hi, stream=current_stream(x.device), device=x.device.index)
    return slopes


def _gpu_forward(c, x, gamma=None):
    g = c.geo
    kind = g.kind
    if kind == "leaky":
        return table("_leaky_relu", x, slope=g.slope), x
    if kind == "gelu":
        e = table("erf", table("multiply", x, _INV_SQRT2))
        return table("multiply", table("multiply", x, table("add", e, 1.0)), 0.5), x
    pos = table("greater", x, 0.0)
    if kind == "prelu":
        return table("where", pos, x, table("multiply", x, view(gamma, g.gview))), (x, gamma)
    if kind in ("elu", "selu"):
        alpha, scale = (g.slope, 1.0) if kind == "elu" else (SELU_ALPHA, SELU_LAMBDA)
        y = table("where", pos, x, table("multiply", table("expm1", table("minimum", x, 0.0)), alpha))
        return (y if kind == "elu" else table("multiply", y, scale)), x
    if c.training:  # rrelu
        slopes = _draw_gpu(c, x)
        y = table("where", pos, x, table("multiply", x, slopes))
    else:
        slopes = full(x.shape, (g.lower + g.upper) / 2.0, x.dtype, x.device)
        y = table("_leaky_relu", x, slope=(g.lower + g.upper) / 2.0)
    return (y, slopes), (x, slopes)


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    kind = g.kind
    if kind == "prelu":
        x, gamma = saved
        pos = table("greater", x, 0.0)
        dx = table("where", pos, dy, table("multiply", dy, view(gamma, g.gview))) if grads.needs[0] else None
        dgamma = None
        if grads.needs[1]:
            t = table("where", pos, 0.0, table("multiply", x, dy))
            dgamma = view(table("sum", t, axis=g.gaxes, keepdims=True), g.gshape)
        return dx, dgamma
    x, slopes = saved if kind == "rrelu" else (saved, None)
    if kind == "gelu":
        e = table("add", table("erf", table("multiply", x, _INV_SQRT2)), 1.0)
        bump = table("multiply", table("multiply", x, table("exp", table("multiply", table("square", x), -0.5))),
                     _INV_SQRT_2PI)
        return table("multiply", dy, table("add", table("multiply", e, 0.5), bump)), None
    pos = table("greater", x, 0.0)
    if kind == "leaky":
        neg = table("multiply", dy, g.slope)
    elif kind == "rrelu":
        neg = table("multiply", dy, slopes)
    else:
        alpha, scale = (g.slope, 1.0) if kind == "elu" else (SELU_ALPHA, SELU_LAMBDA)
        neg = table("multiply", dy, table("multiply", table("exp", table("minimum", x, 0.0)), alpha))
        if kind == "selu":
            return table("multiply", table("where", pos, dy, neg), scale), None
    return table("where", pos, dy, neg), None


def _samples(rng_):
    def x(*shape):
        return rng_.standard_normal(shape) * 2

    yield {"data": x(3, 4)}, {}
    yield {"data": x(2, 3, 2, 2)}, {"act_type": "leaky", "slope": 0.1}
    yield {"data": x(2, 3, 4), "gamma": rng_.uniform(0.05, 0.5, (3,))}, {"act_type": "prelu"}
    yield {"data": x(2, 5), "gamma": rng_.uniform(0.05, 0.5, (1,))}, {"act_type": "prelu"}
    yield {"data": x(2, 3, 4)}, {"act_type": "elu", "slope": 0.7}
    yield {"data": x(4, 5)}, {"act_type": "selu"}
    yield {"data": x(3, 2, 3)}, {"act_type": "gelu"}
    # rrelu draws new slopes per call in train mode: no central differences there, unless the range is one point
    # (the draw is then that slope, in either mode); tests/test_opdefs_nn_extra.py checks the random draws
    yield {"data": x(3, 4)}, {"act_type": "rrelu", "lower_bound": 0.2, "upper_bound": 0.2}


def _outputs(p):
    return (2, ["output", "mask"]) if p["act_type"] == "rrelu" else (1, ["output"])


define(OpDef("LeakyReLU", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             optional={"gamma": lambda p: p["act_type"] == "prelu"},
             init={"gamma": '["Constant", {"value": 0.25}]'},
             outputs=_outputs,
             doc="MXNet's LeakyReLU: leaky, prelu (learned gamma), elu, selu, gelu, rrelu (random slopes in "
                 "training), element-wise."))
