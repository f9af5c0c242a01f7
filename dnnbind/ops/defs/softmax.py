"""MXNet's ``softmax`` and ``log_softmax`` over ``axis``: cudnnSoftmaxForward/Backward (ACCURATE or LOG) over the
last axis, or axis 1 of 4-D data (cuDNN's instance and channel modes); any other axis is composed of the table's
max, exp and sum (untaped, with its own composed gradient). ``temperature`` divides the data first; ``dtype``
(float16/32/64) is the output's dtype. MXNet's ``use_length`` masking is not supported (NotImplementedError).
The cpu twin is numpy, in the data's dtype (float16 through float32).
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import pointwise as _pointwise
from ..opdef import Lowering, OpDef, define, table, view


class Geometry:
    __slots__ = ("axis", "log", "temperature", "dtype", "mode", "rows", "shape")


def _prepare_for(log: bool):
    name = "log_softmax" if log else "softmax"

    def prepare(p, data, length=None):
        if p["use_length"] or length is not None:
            raise NotImplementedError(f"{name}: use_length/length (masking by per-row lengths) is not supported by "
                                      "dnnbind")
        if data.dtype.kind != "f":
            raise DnnbindTypeError(f"{name}: data must be a floating-point array, got {data.dtype} (shape "
                                   f"{data.shape}); use .astype('float32')")
        axis = p["axis"]
        if not -max(data.ndim, 1) <= axis < max(data.ndim, 1):
            raise DnnbindValueError(f"{name}: axis {axis} is out of range for an array of {data.ndim} dimensions")
        g = Geometry()
        g.axis, g.log, g.shape = axis % max(data.ndim, 1), log, data.shape
        t = p["temperature"]
        g.temperature = None if t is None or t == 1.0 else float(t)
        g.dtype = None if p["dtype"] is None or np.dtype(p["dtype"]) == data.dtype else np.dtype(p["dtype"])
        g.mode = g.rows = None
        if data.ndim == 4 and g.axis == 1:
            g.mode = "channel"
        elif data.ndim >= 2 and g.axis == data.ndim - 1:
            g.mode, g.rows = "instance", (int(np.prod(data.shape[:-1])), data.shape[-1])
        return g
    return prepare


def _infer(p, shapes):
    return [shapes[0]], [shapes[0]]


# cpu: numpy ---------------------------------------------------------------------------------------------------

def _cpu_forward(c, x, length=None):
    g = c.geo
    xf = x.astype(np.float32) if x.dtype == np.float16 else x
    if g.temperature is not None:
        xf = xf / xf.dtype.type(g.temperature)
    shifted = xf - xf.max(axis=g.axis, keepdims=True)
    if g.log:
        y = shifted - np.log(np.exp(shifted).sum(axis=g.axis, keepdims=True))
    else:
        e = np.exp(shifted)
        y = e / e.sum(axis=g.axis, keepdims=True)
    y = y.astype(x.dtype)
    return (y if g.dtype is None else y.astype(g.dtype)), y


def _cpu_backward(c, y, grads, dy):
    g = c.geo
    dy = dy.astype(y.dtype)
    if g.log:
        dx = dy - np.exp(y) * dy.sum(axis=g.axis, keepdims=True)
    else:
        dx = y * (dy - (dy * y).sum(axis=g.axis, keepdims=True))
    if g.temperature is not None:
        dx = dx / dx.dtype.type(g.temperature)
    return dx.astype(y.dtype, copy=False), None


# gpu: cuDNN, or the table's ops -------------------------------------------------------------------------------

def _gpu_forward(c, x, length=None):
    g = c.geo
    if g.temperature is not None:
        x = table("divide", x, g.temperature)
    algo = "log" if g.log else "accurate"
    if g.mode is not None:
        xv = view(x, g.rows) if g.rows is not None and g.rows != x.shape else x
        y = _pointwise.softmax_forward.gpu(xv, algo, g.mode)
        if y.shape != g.shape:
            y = view(y, g.shape)
    else:  # any other axis: max, exp, sum
        shifted = table("subtract", x, table("max", x, axis=g.axis, keepdims=True))
        if g.log:
            y = table("subtract", shifted, table("log", table("sum", table("exp", shifted), axis=g.axis,
                                                              keepdims=True)))
        else:
            e = table("exp", shifted)
            y = table("divide", e, table("sum", e, axis=g.axis, keepdims=True))
    return (y if g.dtype is None else table("cast", y, dtype=g.dtype)), y


def _gpu_backward(c, y, grads, dy):
    g = c.geo
    if dy.dtype != y.dtype:
        dy = table("cast", dy, dtype=y.dtype)
    algo = "log" if g.log else "accurate"
    if g.mode is not None:
        shape = g.rows if g.rows is not None else y.shape
        dx = _pointwise.softmax_backward.gpu(view(y, shape), view(dy, shape), algo, g.mode)
        if dx.shape != g.shape:
            dx = view(dx, g.shape)
    elif g.log:
        dx = table("subtract", dy, table("multiply", table("exp", y), table("sum", dy, axis=g.axis, keepdims=True)))
    else:
        dx = table("multiply", y, table("subtract", dy, table("sum", table("multiply", dy, y), axis=g.axis,
                                                              keepdims=True)))
    if g.temperature is not None:
        dx = table("divide", dx, g.temperature)
    return dx, None


def _samples(rng):
    x = rng.standard_normal
    yield {"data": x((3, 5))}, {}
    yield {"data": x((2, 3, 4, 2))}, {"axis": 1}
    yield {"data": x((2, 3, 4))}, {"axis": 1, "temperature": 2.0}
    yield {"data": x((2, 4))}, {"axis": 0}
    yield {"data": x((2, 3, 4))}, {"axis": -1, "temperature": 0.5}


def _dtype(p, types, n_out):
    """The output is the ``dtype`` parameter where one is given (float32 softmax of float16 data), else the data's
    type; ``length`` (use_length) keeps its own integer type."""
    t = types[0]
    out = np.dtype(p["dtype"]) if p.get("dtype") is not None else t
    return [t] + list(types[1:]), [out]


for _log in (False, True):
    define(OpDef("log_softmax" if _log else "softmax", prepare=_prepare_for(_log), infer=_infer, samples=_samples,
                 dtype=_dtype,
                 cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
                 optional={"length": lambda p: bool(p.get("use_length"))},
                 doc=f"MXNet's {'log_softmax' if _log else 'softmax'} over ``axis``: cudnnSoftmaxForward"
                     f"({'LOG' if _log else 'ACCURATE'}) where cuDNN's modes fit, the table's ops elsewhere."))
