"""MXNet's ``Activation``: ``act_type`` relu, sigmoid, tanh, softrelu (log(1 + e^x)) or softsign (x / (1 + |x|)),
element-wise on float data.

On a GPU each is the table's element-wise op of that name (a generated kernel, or cuDNN's activation where the table
picks it: nd/_table.py), and the gradient the table's backward ops, composed untaped through ``ops.opdef.table``:
the op is one entry here (MXNet's parameters, shape inference, a node in a symbol graph) without a second kernel.
The cpu twin is numpy.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError
from .. import reference
from ..opdef import Lowering, OpDef, define, table


def _prepare(p, data):
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"Activation: data must be a floating-point array, got {data.dtype} (shape "
                               f"{data.shape}); use .astype('float32')")
    return p["act_type"]


def _infer(p, shapes):
    return [shapes[0]], [shapes[0]]


_CUDNN_MODES = ("relu", "sigmoid", "tanh")  # the twin of cuDNN's modes is ops/reference/activation.py


def _softrelu(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _cpu_forward(c, x):
    kind = c.geo
    if kind in _CUDNN_MODES:
        y = reference.activation_forward(x, kind)
    else:
        y = (_softrelu(x) if kind == "softrelu" else x / (1 + np.abs(x))).astype(x.dtype, copy=False)
    return y, (x, y)


def _cpu_backward(c, saved, grads, dy):
    x, y = saved
    kind = c.geo
    if kind in _CUDNN_MODES:
        return (reference.activation_backward(y, dy, x, kind),)
    if kind == "softrelu":  # d/dx log(1 + e^x) = sigmoid(x)
        dx = dy * reference.activation_forward(x, "sigmoid")
    else:  # d/dx x / (1 + |x|) = 1 / (1 + |x|)^2
        dx = dy / np.square(1 + np.abs(x))
    return (dx.astype(x.dtype, copy=False),)


def _gpu_forward(c, x):
    y = table(c.geo, x)
    return y, (x if c.geo in ("softrelu", "softsign") else None, y)


def _gpu_backward(c, saved, grads, dy):
    x, y = saved
    kind = c.geo
    if kind in ("relu", "sigmoid", "tanh"):
        return (table(f"_{kind}_backward", dy, y),)
    if kind == "softrelu":
        return (table("multiply", dy, table("sigmoid", x)),)
    return (table("divide", dy, table("square", table("add", table("abs", x), 1.0))),)


def _samples(rng):
    for kind in ("relu", "sigmoid", "tanh", "softrelu", "softsign"):
        yield {"data": rng.standard_normal((3, 4)) * 2}, {"act_type": kind}
    yield {"data": rng.standard_normal((2, 3, 2, 2))}, {"act_type": "relu"}


define(OpDef("Activation", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="MXNet's Activation: relu, sigmoid, tanh, softrelu, softsign, element-wise."))
