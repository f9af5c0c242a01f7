"""MXNet's ``FullyConnected``: y = x w^T + b by cuBLAS (ops/blas.py) on a GPU, ops/reference/blas.py on the cpu.

MXNet 1.9.1's parameters: ``num_hidden`` required, weight (num_hidden, in), a bias (num_hidden,) unless ``no_bias``.
``flatten=True`` (the default) views (N, ...) data as (N, -1); ``flatten=False`` applies the layer to the last axis,
(..., in) -> (..., num_hidden). The GPU backward makes only the gradients asked for (a first layer skips dx: 1-3
cuBLAS calls), writing dw and db straight into the Parameters' grad buffers where autograd offers them.
"""

from __future__ import annotations

import math

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import blas as _blas
from .. import reference
from .._common import blas as blas_handle
from ..args import bias_matches, check_fits
from ..opdef import Lowering, OpDef, define, view
from ...runtime.array import empty


def _prepare(p, data, weight, bias):
    op = "FullyConnected"
    num_hidden, no_bias, flatten = p["num_hidden"], p["no_bias"], p["flatten"]
    if num_hidden < 1:
        raise DnnbindValueError(f"value {num_hidden} for Parameter num_hidden should be greater equal to 1, in "
                                f"operator {op}")
    bias_matches(op, bias, no_bias, num_hidden)
    if data.ndim == 0:
        raise DnnbindValueError(f"{op}: data must have at least one axis, got a 0-d array")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and a.dtype != data.dtype:
            raise DnnbindTypeError(f"{op}: {name} is {a.dtype} but data is {data.dtype}; every array must share one "
                                   "dtype")
    shape = data.shape
    if flatten:
        in_units = math.prod(shape[1:]) if data.ndim > 1 else 1
        x_shape, y_shape = (shape[0], in_units), (shape[0], num_hidden)
    else:
        in_units = shape[-1]
        x_shape, y_shape = (math.prod(shape[:-1]), in_units), shape[:-1] + (num_hidden,)
    if weight.ndim == 2 and weight.shape[0] == num_hidden and weight.shape[1] != in_units:
        raise DnnbindValueError(f"{op}: data {shape} has {in_units} features (flatten={flatten}) but weight "
                                f"{weight.shape} expects {weight.shape[1]}")
    if weight.shape != (num_hidden, in_units):
        raise DnnbindValueError(f"{op}: weight has shape {weight.shape} but data {shape} (flatten={flatten}) with "
                                f"num_hidden {num_hidden} needs ({num_hidden}, {in_units})")
    if bias is not None and bias.shape != (num_hidden,):
        raise DnnbindValueError(f"{op}: bias has shape {bias.shape}; expected ({num_hidden},) (num_hidden)")
    check_fits(op, data.device, data.dtype, "the output", y_shape, f" (data {shape}, weight {weight.shape})")
    return x_shape, y_shape, shape


def _infer(p, shapes):
    data, h = shapes[0], p["num_hidden"]
    if p["flatten"]:
        inputs, out = math.prod(data[1:]), (data[0], h)
    else:
        inputs, out = data[-1], (*data[:-1], h)
    return [data, (h, inputs), (h,)], [out]


def _cpu_forward(c, x, w, b):
    x_shape, y_shape, _ = c.geo
    x2 = x.reshape(x_shape)
    return reference.linear_forward(x2, w, b).reshape(y_shape), (x2, w)


def _cpu_backward(c, saved, grads, dy):
    x_shape, y_shape, data_shape = c.geo
    x2, w = saved
    dx, dw, db = reference.linear_backward(x2, w, dy.reshape(x_shape[0], -1), bias=grads.needs[2])
    return (dx.reshape(data_shape) if grads.needs[0] else None), (dw if grads.needs[1] else None), db


def _gpu_forward(c, x, w, b):
    x_shape, y_shape, data_shape = c.geo
    x2 = view(x, x_shape) if data_shape != x_shape else x
    y = _blas.linear_forward.gpu(x2, w, b)
    return (view(y, y_shape) if y.shape != y_shape else y), (x2, w)


def _gpu_backward(c, saved, grads, dy):
    x_shape, y_shape, data_shape = c.geo
    x, w = saved
    n, k = x_shape
    units, dtype, h = w.shape[0], x.dtype, blas_handle(x)
    if dy.shape != (n, units):
        dy = view(dy, (n, units))
    dx = dw = db = None
    if grads.needs[0]:
        dx = empty((n, k), dtype, x.device)
        _blas.gemm_into(h, dy.ptr, w.ptr, dx.ptr, n, k, units, False, False, 1.0, 0.0, dtype)
        if data_shape != x_shape:
            dx = view(dx, data_shape)
    if grads.needs[1]:
        dw = grads.into[1]
        if dw is None:
            dw = empty((units, k), dtype, x.device)
        _blas.gemm_into(h, dy.ptr, x.ptr, dw.ptr, units, k, n, True, False, 1.0, 0.0, dtype)
    if grads.needs[2]:
        db = grads.into[2]
        if db is None:
            db = empty((units,), dtype, x.device)
        _blas.sum_rows_into(h, dy.ptr, _blas.ones_vector(x.device, n, dtype).ptr, db.ptr, n, units, 1.0, 0.0,
                            dtype)
    return dx, dw, db


def _samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3, 2)), "weight": x((5, 6)), "bias": x((5,))}, {"num_hidden": 5}
    yield {"data": x((2, 3, 4)), "weight": x((6, 4)), "bias": x((6,))}, {"num_hidden": 6, "flatten": False}
    yield {"data": x((3, 7)), "weight": x((2, 7))}, {"num_hidden": 2, "no_bias": True}
    yield {"data": x((5,)), "weight": x((3, 1)), "bias": x((3,))}, {"num_hidden": 3}


define(OpDef("FullyConnected", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             optional={"bias": lambda p: not p["no_bias"]},
             doc="y = x w^T + b (MXNet's FullyConnected): cublasSgemm_v2 (GemmEx for float16)."))
