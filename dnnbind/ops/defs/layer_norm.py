"""MXNet's ``LayerNorm``, ``InstanceNorm`` and ``GroupNorm``: normalization over axes of each sample, then gamma and
beta. On a GPU each is composed of the table's reductions and element-wise ops (``ops.opdef.table``): cuDNN's legacy
API normalizes per channel over the batch only (its batch normalization), so no library call computes these. The cpu
twin is numpy.

The three are one computation on a 3-D view (A, P, B) of the data, the statistics over one of its axes and gamma and
beta along P:

- ``LayerNorm(axis)``: (outer, C, inner) with C the data's ``axis``, the statistics over C, gamma and beta (C,);
- ``InstanceNorm``: (N, C, rest), the statistics over the rest, gamma and beta (C,);
- ``GroupNorm(num_groups=G)``: (N, G, C/G * rest), the statistics over each group's channels and the rest, gamma
  and beta (G,): per group, as MXNet 1.9.1 declares them (MXNet 2 makes them per channel).

``mean = mean(x)``, ``std = sqrt(mean((x - mean)^2) + eps)`` (the biased variance), ``y = (x - mean) / std * gamma +
beta``. The gradient is MXNet's: with ``xhat = (x - mean) / std`` and ``w = dy * gamma / std``, ``dx = w - mean(w) -
xhat * mean(w * xhat)``, ``dgamma = sum(dy * xhat)`` and ``dbeta = sum(dy)`` over the axes other than P. Like MXNet's,
it takes the first output's gradient only (the mean and std outputs carry none).

Outputs: a node has three (MXNet's). LayerNorm's and GroupNorm's mean and std are visible with ``output_mean_var``,
LayerNorm's of the data's shape with 1 at ``axis``, GroupNorm's (N, G); InstanceNorm's mean and variance stay hidden
(MXNet gives it no output_mean_var).

Refused, before any work, where MXNet refuses or fails: data that is not floating-point, gamma or beta of another
dtype than the data (MXNet's "Incompatible attr") or of the wrong shape, ``axis`` out of range, empty data (MXNet
fails on it), InstanceNorm and GroupNorm data of fewer than 3 axes, a ``num_groups`` below 1 (MXNet 1.9.1 crashes on
0) or not dividing the channels. Beyond MXNet: InstanceNorm takes float16 and float64 as well (MXNet 1.9.1 computes
float32 only). float16 data is computed in float32 and the results rounded.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ..opdef import Lowering, OpDef, define, table, view


class Geometry(NamedTuple):
    """A checked call: ``view`` the data as (A, P, B), ``red`` the axis of that view the statistics are taken over
    (1 for LayerNorm, 2 for the others), ``stat`` the shape of the mean and std outputs, ``shape`` the data's,
    ``eps`` as a float."""
    view: tuple
    red: int
    stat: tuple
    shape: tuple
    eps: float


def _check_arrays(op: str, data, gamma, beta, size: int, what: str) -> None:
    """gamma and beta against the data: its dtype, shape (``size``,) (``what`` says where that size comes from)."""
    for name, a in (("gamma", gamma), ("beta", beta)):
        if a.dtype != data.dtype:
            raise DnnbindTypeError(f"{op}: {name} is {a.dtype} but data is {data.dtype}; data, gamma and beta must "
                                   "share one dtype")
        if tuple(a.shape) != (size,):
            raise DnnbindValueError(f"{op}: {name} has shape {tuple(a.shape)}; expected ({size},) ({what}) for data "
                                    f"of shape {tuple(data.shape)}")
    if data.size == 0:  # statistics of nothing (MXNet fails on it too)
        raise DnnbindValueError(f"{op}: data is empty (shape {tuple(data.shape)})")


def _floats(op: str, data) -> None:
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape "
                               f"{tuple(data.shape)}); use .astype('float32')")


def _layer_axis(p, ndim: int, shape) -> int:
    axis = p["axis"]
    if not -ndim <= axis < ndim:
        raise DnnbindValueError(f"LayerNorm: axis {axis} is out of range for data of shape {tuple(shape)} (MXNet: "
                                f"Channel axis out of range)")
    return axis % ndim


def _prepare_layer(p, data, gamma, beta):
    _floats("LayerNorm", data)
    shape = tuple(data.shape)
    ax = _layer_axis(p, data.ndim, shape)
    c = shape[ax]
    _check_arrays("LayerNorm", data, gamma, beta, c, f"the data's axis {p['axis']}")
    stat = shape[:ax] + (1,) + shape[ax + 1:]
    return Geometry((math.prod(shape[:ax]), c, math.prod(shape[ax + 1:])), 1, stat, shape, float(p["eps"]))


def _at_least_3d(op: str, data) -> None:
    if data.ndim < 3:
        raise DnnbindValueError(f"{op}: data must have at least 3 axes (N, C, ...), got shape {tuple(data.shape)} "
                                f"(MXNet: {op} only supports input tensors of rank >= 3)")


def _prepare_instance(p, data, gamma, beta):
    _floats("InstanceNorm", data)
    _at_least_3d("InstanceNorm", data)
    shape = tuple(data.shape)
    n, c = shape[:2]
    _check_arrays("InstanceNorm", data, gamma, beta, c, "the data's channels, axis 1")
    return Geometry((n, c, math.prod(shape[2:])), 2, (n, c), shape, float(p["eps"]))


def _prepare_group(p, data, gamma, beta):
    _floats("GroupNorm", data)
    _at_least_3d("GroupNorm", data)
    shape = tuple(data.shape)
    n, c = shape[:2]
    g = p["num_groups"]
    if g < 1:
        raise DnnbindValueError(f"GroupNorm: num_groups must be at least 1, got {g} (data {shape})")
    if c % g:
        raise DnnbindValueError(f"GroupNorm: data has {c} channels, not divisible by num_groups {g} (data {shape})")
    _check_arrays("GroupNorm", data, gamma, beta, g, "num_groups: MXNet 1.9.1's gamma and beta are per group")
    return Geometry((n, g, c // g * math.prod(shape[2:])), 2, (n, g), shape, float(p["eps"]))


def _infer_layer(p, shapes):
    data = tuple(shapes[0])
    ax = _layer_axis(p, len(data), data)
    stat = data[:ax] + (1,) + data[ax + 1:]
    return [data, (data[ax],), (data[ax],)], [data, stat, stat]


def _infer_instance(p, shapes):
    data = tuple(shapes[0])
    return [data, (data[1],), (data[1],)], [data, data[:2], data[:2]]


def _infer_group(p, shapes):
    data, g = tuple(shapes[0]), p["num_groups"]
    return [data, (g,), (g,)], [data, (data[0], g), (data[0], g)]


def _mean_std_outputs(p):
    """Three outputs (MXNet's node); the mean and std visible with output_mean_var."""
    return 3, (["output", "mean", "std"] if p.get("output_mean_var") else ["output"])


def _result(c, y, mean, std):
    return (y, mean, std) if c.p.get("output_mean_var") else y


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _acc(dtype) -> type:
    """The dtype computed in: float64 for float64, float32 otherwise (float16 through float32)."""
    return np.float64 if dtype == np.float64 else np.float32


def _cpu_forward(c, x, gamma, beta):
    g = c.geo
    acc = _acc(x.dtype)
    x3 = x.reshape(g.view).astype(acc, copy=False)
    pshape = (1, g.view[1], 1)
    mean = x3.mean(axis=g.red, keepdims=True)
    xc = x3 - mean
    std = np.sqrt((xc * xc).mean(axis=g.red, keepdims=True) + acc(g.eps))
    xhat = xc / std
    gam = gamma.astype(acc, copy=False).reshape(pshape)
    y = (xhat * gam + beta.astype(acc, copy=False).reshape(pshape)).astype(x.dtype, copy=False).reshape(g.shape)
    mean_out = std_out = None
    if c.p.get("output_mean_var"):
        mean_out, std_out = mean.astype(x.dtype).reshape(g.stat), std.astype(x.dtype).reshape(g.stat)
    return _result(c, y, mean_out, std_out), (xhat, std, gam)


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    xhat, std, gam = saved
    need = grads.needs
    dtype = dy.dtype
    dy3 = dy.reshape(g.view).astype(xhat.dtype, copy=False)
    dx = dgamma = dbeta = None
    if need[0]:
        w = dy3 * gam / std
        dx = w - w.mean(axis=g.red, keepdims=True) - xhat * (w * xhat).mean(axis=g.red, keepdims=True)
        dx = dx.astype(dtype, copy=False).reshape(g.shape)
    if need[1]:
        dgamma = (dy3 * xhat).sum(axis=(0, 2)).astype(dtype, copy=False)
    if need[2]:
        dbeta = dy3.sum(axis=(0, 2)).astype(dtype, copy=False)
    return dx, dgamma, dbeta


# gpu: the table's ops -----------------------------------------------------------------------------------------

def _gpu_forward(c, x, gamma, beta):
    g = c.geo
    half = x.dtype == np.float16
    x3 = view(x, g.view)
    pshape = (1, g.view[1], 1)
    gam, bet = view(gamma, pshape), view(beta, pshape)
    if half:  # computed in float32, the results rounded
        x3, gam, bet = (table("cast", a, dtype=np.float32) for a in (x3, gam, bet))
    mean = table("mean", x3, axis=g.red, keepdims=True)
    xc = table("subtract", x3, mean)
    std = table("sqrt", table("add", table("mean", table("square", xc), axis=g.red, keepdims=True), g.eps))
    xhat = table("divide", xc, std)
    y = table("add", table("multiply", xhat, gam), bet)
    mean_out = std_out = None
    if c.p.get("output_mean_var"):
        mean_out, std_out = view(mean, g.stat), view(std, g.stat)
    if half:
        y = table("cast", y, dtype=np.float16)
        if mean_out is not None:
            mean_out, std_out = table("cast", mean_out, dtype=np.float16), table("cast", std_out, dtype=np.float16)
    # NOTE: saves xhat (one array of the data's size, float32 for float16 data), not x: the backward then needs
    # neither x nor mean, and no recomputation
    return _result(c, view(y, g.shape), mean_out, std_out), (xhat, std, gam)


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    xhat, std, gam = saved
    need = grads.needs
    dtype = dy.dtype
    dy3 = view(dy, g.view)
    if dy3.dtype != xhat.dtype:
        dy3 = table("cast", dy3, dtype=xhat.dtype)
    dx = dgamma = dbeta = None
    if need[0]:
        w = table("divide", table("multiply", dy3, gam), std)
        wx = table("mean", table("multiply", w, xhat), axis=g.red, keepdims=True)
        dx = table("subtract", table("subtract", w, table("mean", w, axis=g.red, keepdims=True)),
                   table("multiply", xhat, wx))
        if dx.dtype != dtype:
            dx = table("cast", dx, dtype=dtype)
        dx = view(dx, g.shape)
    if need[1]:
        dgamma = table("sum", table("multiply", dy3, xhat), axis=(0, 2))
    if need[2]:
        dbeta = table("sum", dy3, axis=(0, 2))
    if dtype != xhat.dtype:
        dgamma = None if dgamma is None else table("cast", dgamma, dtype=dtype)
        dbeta = None if dbeta is None else table("cast", dbeta, dtype=dtype)
    return dx, dgamma, dbeta


# the entries --------------------------------------------------------------------------------------------------

def _affine(rng, shape, size):
    return {"data": rng.standard_normal(shape) * 2 + 0.5, "gamma": rng.uniform(0.5, 1.5, size),
            "beta": rng.standard_normal(size)}


def _samples_layer(rng):
    yield _affine(rng, (2, 3, 5), 5), {}
    yield _affine(rng, (2, 4, 3), 4), {"axis": 1, "eps": 1e-3}
    yield _affine(rng, (3, 2, 2, 4), 2), {"axis": -2, "eps": 0.1, "output_mean_var": True}
    yield _affine(rng, (4, 6), 4), {"axis": 0}
    yield _affine(rng, (7,), 7), {"output_mean_var": True}


def _samples_instance(rng):
    yield _affine(rng, (2, 3, 5), 3), {}
    yield _affine(rng, (2, 3, 4, 5), 3), {"eps": 1e-5}
    yield _affine(rng, (1, 2, 3, 2, 2), 2), {"eps": 0.01}


def _samples_group(rng):
    yield _affine(rng, (2, 6, 4), 3), {"num_groups": 3}
    yield _affine(rng, (2, 4, 3, 3), 2), {"num_groups": 2, "eps": 1e-3, "output_mean_var": True}
    yield _affine(rng, (3, 4, 5), 1), {}


_LOWERINGS = {"cpu": Lowering(_cpu_forward, _cpu_backward), "gpu": Lowering(_gpu_forward, _gpu_backward)}

define(OpDef("LayerNorm", prepare=_prepare_layer, infer=_infer_layer, samples=_samples_layer,
             outputs=_mean_std_outputs, **_LOWERINGS,
             doc="Layer normalization (MXNet's LayerNorm) over ``axis`` (default the last) of each sample, then gamma "
                 "and beta along that axis; ``output_mean_var`` also returns the mean and std. Composed of the "
                 "table's reductions on a GPU."))
define(OpDef("InstanceNorm", prepare=_prepare_instance, infer=_infer_instance, samples=_samples_instance,
             outputs=lambda p: (3, ["output"]), **_LOWERINGS,  # its mean and variance are hidden outputs
             doc="Instance normalization (MXNet's InstanceNorm) of (N, C, ...) data: per sample and channel over the "
                 "remaining axes, then gamma and beta per channel. Composed of the table's reductions on a GPU."))
define(OpDef("GroupNorm", prepare=_prepare_group, infer=_infer_group, samples=_samples_group,
             outputs=_mean_std_outputs, **_LOWERINGS,
             doc="Group normalization (MXNet's GroupNorm) of (N, C, ...) data: per sample over each of "
                 "``num_groups`` groups of channels, then gamma and beta per group (MXNet 1.9.1's shapes); "
                 "``output_mean_var`` also returns the mean and std, (N, num_groups). Composed of the table's "
                 "reductions on a GPU."))
