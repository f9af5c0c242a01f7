"""MXNet's ``Flatten``: (N, ...) -> (N, prod(...)) as a view of the same memory; 1-D (N,) -> (N, 1). Its gradient
is the same view of dy, back to the data's shape. No library call: the entry gives it MXNet's parameters, shape
inference and a place in symbol graphs."""

from __future__ import annotations

import math

from ..._lib.errors import DnnbindValueError
from ..opdef import Lowering, OpDef, define, view


def _prepare(p, data):
    if data.ndim == 0:
        raise DnnbindValueError("Flatten: data must have at least one axis, got a 0-d array")
    return (data.shape[0], math.prod(data.shape[1:])), data.shape


def _infer(p, shapes):
    return list(shapes), [(shapes[0][0], math.prod(shapes[0][1:]))]


def _cpu_forward(c, x):
    return x.reshape(c.geo[0]), None


def _cpu_backward(c, saved, grads, dy):
    return (dy.reshape(c.geo[1]),)


def _gpu_forward(c, x):
    return view(x, c.geo[0]), None


def _gpu_backward(c, saved, grads, dy):
    return (view(dy, c.geo[1]),)


def _samples(rng):
    yield {"data": rng.standard_normal((2, 3, 4))}, {}
    yield {"data": rng.standard_normal((5,))}, {}


define(OpDef("Flatten", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="MXNet's Flatten: (N, ...) -> (N, prod(...)), a view."))
