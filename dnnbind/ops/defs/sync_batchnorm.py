"""MXNet's ``_contrib_SyncBatchNorm`` (``nd.contrib.SyncBatchNorm``, gluon.contrib.nn.SyncBatchNorm's op): BatchNorm
whose batch statistics are those of every participating device's batch together (Zhang et al., "Context Encoding
for Semantic Segmentation", CVPR 2018; MXNet's src/operator/contrib/sync_batch_norm-inl.h).

Parameters are MXNet 1.9.1's: eps 1e-3, momentum 0.9, fix_gamma True, use_global_stats False, output_mean_var False,
ndev 1 (the number of participating devices), key (required: the participants of one layer share it; Gluon passes
the Block's prefix). The channels are on axis 1 (no ``axis`` parameter); data of 2 to 5 axes is lowered as it is,
more axes as (N, C, rest).

- ndev == 1, inference, or ``use_global_stats``: BatchNorm itself. The call is handed to the BatchNorm entry's own
  lowerings (ops/defs/batchnorm.py: cuDNN on a GPU, its numpy twin on the cpu) with BatchNorm's geometry, so the
  results, gradients and the in-place moving-statistics update are BatchNorm's bit for bit.
- ndev > 1 in training: the participants (sync_meeting.py: launched ranks, or one thread per context) exchange
  each device's count, mean and sum of squared deviations per channel and combine them (Chan's update, float64),
  so every device normalizes with the global batch's mean and biased variance (cuDNN's inference call with those
  statistics on a GPU). The backward exchanges sum(dy) and sum(dy * xhat) and gives
  dx = gamma * inv_std * (dy - sum(dy) / N - xhat * sum(dy * xhat) / N) over the global count N; dgamma and dbeta
  are each device's own sums (the Trainer adds the devices' parameter gradients, as MXNet's kvstore does).
  The moving statistics are updated with the global ones, the same on every device.

Departures from MXNet, where MXNet's kernel is approximate: MXNet averages the devices' means (right only for
equal per-device batches) and takes E[x^2] - E[x]^2 in float32; dnnbind weighs each device by its count and combines
deviations, so unequal batches get the global batch's exact statistics. MXNet updates the moving statistics in the
backward pass, dnnbind in the forward (as its BatchNorm; after forward + backward they agree). With
``output_mean_var`` the outputs are the mean and the (biased) VARIANCE, as MXNet's SyncBatchNorm gives (BatchNorm
gives the inverse standard deviation); outside training MXNet leaves them unwritten, dnnbind gives the moving
statistics (and the backward of a predict-mode recording, where MXNet's reads those unwritten outputs, is
BatchNorm's affine one). fix_gamma sets gamma to 1 in place and gives it a zero gradient, as BatchNorm. A hybridized
Block or recorded step holding a synchronized call stays eager (sync_meeting.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindValueError
from ...runtime.array import full, zeros
from .. import batchnorm as _bn
from .. import sync_meeting
from ..blas import copy, fill
from ..opdef import DEFS, Call, Lowering, OpDef, define, float32_params, table, view
from ..reference.sync_batchnorm import combine_moments, global_dx, local_grad_sums, local_moments
from . import batchnorm as _bn_def

__all__ = ["Geometry"]

NAME = "_contrib_SyncBatchNorm"


class Geometry(NamedTuple):
    """``bn``: BatchNorm's geometry of the data as lowered (its check); ``bn_p``: BatchNorm's parameters for the
    call (axis 1); ``shape``: the (N, C, rest) view of data with more than 5 axes, else None; ``ndev``, ``key``."""
    bn: _bn_def.Geometry
    bn_p: dict
    shape: tuple | None
    ndev: int
    key: str


def _prepare(p, data, gamma, beta, moving_mean, moving_var) -> Geometry:
    shape = tuple(data.shape)
    if data.ndim < 2:
        raise DnnbindValueError(f"{NAME}: data must have at least 2 axes (N, C, ...), got shape {shape}")
    if p["ndev"] < 1:
        raise DnnbindValueError(f"{NAME}: ndev must be >= 1 (the number of participating devices), got {p['ndev']}")
    if not p["key"]:
        raise DnnbindValueError(f"{NAME}: key must be a non-empty string shared by the participants of one layer "
                                f"(gluon.contrib.nn.SyncBatchNorm passes its prefix)")
    low = None
    if data.ndim > 5:
        low = shape[:2] + (math.prod(shape[2:]),)
        data = SimpleNamespace(shape=low, ndim=3, dtype=data.dtype)
    bn_p = {"eps": p["eps"], "momentum": p["momentum"], "fix_gamma": p["fix_gamma"],
            "use_global_stats": p["use_global_stats"], "output_mean_var": p["output_mean_var"], "axis": 1}
    geo = _bn_def.check(NAME, bn_p, data, gamma, beta, moving_mean, moving_var)
    return Geometry(geo, bn_p, low, int(p["ndev"]), p["key"])


def _infer(p, shapes):
    data = shapes[0]
    c = data[1]
    return [data] + [(c,)] * 4, [data, (c,), (c,)]  # output, mean, var


def _outputs(p):
    """MXNet's node has three outputs; mean and var are visible with output_mean_var."""
    return 3, (["output", "mean", "var"] if p.get("output_mean_var") else ["output"])


def _synchronized(c) -> bool:
    """Whether this call meets the other devices: batch statistics (training, not use_global_stats) with ndev > 1."""
    return c.geo.ndev > 1 and c.training and not c.p["use_global_stats"]


def _bn_call(c) -> Call:
    return Call(c.geo.bn, c.geo.bn_p, c.device, c.training)


def _samples(rng):
    def arrays(shape):
        c = shape[1]
        return {"data": rng.standard_normal(shape) * 2 + rng.standard_normal(c).reshape(
                    [c if i == 1 else 1 for i in range(len(shape))]),
                "gamma": rng.uniform(0.5, 2.0, c), "beta": rng.standard_normal(c),
                "moving_mean": rng.standard_normal(c), "moving_var": rng.uniform(0.5, 2.0, c)}

    yield arrays((3, 2, 2, 3)), {"key": "s0", "fix_gamma": False, "eps": 1e-3, "momentum": 0.8}
    yield arrays((2, 3, 2, 2)), {"key": "s1"}  # MXNet's defaults: fix_gamma
    yield arrays((2, 3, 4)), {"key": "s2", "fix_gamma": False, "use_global_stats": True, "eps": 1e-5}
    yield arrays((3, 2, 3)), {"key": "s3", "fix_gamma": False, "output_mean_var": True}
    yield arrays((5, 3)), {"key": "s4", "fix_gamma": False, "momentum": 0.5, "ndev": 1}
    yield arrays((2, 2, 1, 2, 1, 2)), {"key": "s5", "fix_gamma": False}  # 6 axes: lowered as (N, C, rest)


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, gamma, beta, moving_mean, moving_var):
    g = c.geo
    shape = x.shape
    if g.shape is not None:
        x = x.reshape(g.shape)
    if not _synchronized(c):
        out, saved = DEFS["BatchNorm"].cpu.forward(_bn_call(c), x, gamma, beta, moving_mean, moving_var)
        if c.p["output_mean_var"]:
            y, mean, _ = out
            if c.training and not c.p["use_global_stats"]:
                var = local_moments(x)[2] / (x.size // x.shape[1])
            else:
                mean, var = moving_mean.copy(), moving_var
            out = (y.reshape(shape), mean, var.astype(gamma.dtype))
        else:
            out = out.reshape(shape)
        return out, ("bn", saved)
    eps, momentum = g.bn.eps, g.bn.momentum
    if c.p["fix_gamma"]:
        gamma[...] = 1
    stacked = sync_meeting.all_gather(NAME, g.key, g.ndev, "forward", local_moments(x), c.device)
    n, mean, var = combine_moments(stacked)
    inv_std = 1.0 / np.sqrt(var + eps)
    bshape = g.bn.bshape
    y = (x.astype(np.float64) - mean.reshape(bshape)) * (inv_std * gamma).reshape(bshape) \
        + beta.astype(np.float64).reshape(bshape)
    moving_mean[...] = momentum * moving_mean + (1.0 - momentum) * mean
    moving_var[...] = momentum * moving_var + (1.0 - momentum) * var
    y = y.astype(x.dtype).reshape(shape)
    out = (y, mean.astype(gamma.dtype), var.astype(gamma.dtype)) if c.p["output_mean_var"] else y
    return out, ("sync", x, gamma, mean, inv_std, n)


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    shape = dy.shape
    if g.shape is not None:
        dy = dy.reshape(g.shape)
    if saved[0] == "bn":
        dx, dgamma, dbeta, _, _ = DEFS["BatchNorm"].cpu.backward(_bn_call(c), saved[1], grads, dy)
    else:
        _, x, gamma, mean, inv_std, n = saved
        local = local_grad_sums(x, dy, mean, inv_std)
        # every participant meets, whatever it needs: the others wait for its sums
        total = sync_meeting.all_gather(NAME, g.key, g.ndev, "backward", local, c.device).sum(axis=0)
        dx = global_dx(x, dy, gamma, mean, inv_std, total, n).astype(x.dtype) if grads.needs[0] else None
        dgamma = (np.zeros_like(gamma) if c.p["fix_gamma"] else local[1].astype(gamma.dtype)) \
            if grads.needs[1] else None
        dbeta = local[0].astype(gamma.dtype) if grads.needs[2] else None
    if dx is not None:
        dx = dx.reshape(shape)
    return dx, dgamma, dbeta, None, None


# gpu: BatchNorm's cuDNN calls, and table ops for the synchronized statistics ---------------------------------

def _as(x, dtype):
    return x if x.dtype == dtype else table("cast", x, dtype=dtype)


def _row(stacked, i: int, c: int):
    """Row i of each participant's (k, C) block of stacked (P, k, C): (P, C)."""
    return view(table("slice_axis", stacked, axis=1, begin=i, end=i + 1), (stacked.shape[0], c))


def _gpu_forward(c, x, gamma, beta, moving_mean, moving_var):
    g = c.geo
    shape = x.shape
    if g.shape is not None:
        x = view(x, g.shape)
    if not _synchronized(c):
        out, saved = DEFS["BatchNorm"].gpu.forward(_bn_call(c), x, gamma, beta, moving_mean, moving_var)
        if c.p["output_mean_var"]:
            y, mean, inv_std = out
            if c.training and not c.p["use_global_stats"]:
                # the variance from cuDNN's inverse standard deviation, in float64: 1 / inv_std^2 - eps
                inv64 = _as(inv_std, np.float64)
                var = _as(table("subtract", table("reciprocal", table("square", inv64)), g.bn.eps), gamma.dtype)
            else:
                var = copy(moving_var, zeros(moving_var.shape, moving_var.dtype, moving_var.device))
            out = (view(y, shape), mean, var)
        else:
            out = view(out, shape)
        return out, ("bn", saved)
    eps, momentum = g.bn.eps, g.bn.momentum
    pdtype = gamma.dtype
    ch = g.bn.shape[1]
    if c.p["fix_gamma"]:
        fill(gamma, 1.0)
    # this device's count, mean and sum of squared deviations per channel (reductions in the parameters' dtype,
    # as cuDNN's; the (3, C) result in float64 for the exchange and the combination)
    xp = _as(x, pdtype)
    mean_i = table("mean", xp, axis=g.bn.axes)
    m2_i = table("sum", table("square", table("subtract", xp, view(mean_i, g.bn.bshape))), axis=g.bn.axes)
    count = full((ch,), float(x.size // ch), np.float64, x.device)
    local = table("stack", count, _as(mean_i, np.float64), _as(m2_i, np.float64), axis=0)
    stacked = sync_meeting.all_gather(NAME, g.key, g.ndev, "forward", local, c.device)  # (P, 3, C)
    n_i, mu_i, m2s = (_row(stacked, i, ch) for i in range(3))
    n = table("sum", n_i, axis=0)
    mean = table("divide", table("sum", table("multiply", n_i, mu_i), axis=0), n)
    spread = table("multiply", n_i, table("square", table("subtract", mu_i, view(mean, (1, ch)))))
    var = table("divide", table("add", table("sum", m2s, axis=0), table("sum", spread, axis=0)), n)
    mean_p, var_p = _as(mean, pdtype), _as(var, pdtype)
    # normalize with the global statistics: cuDNN's inference call takes them as given
    y = _bn.batchnorm_forward_inference.gpu(x, gamma, beta, mean_p, var_p, eps, layout=g.bn.layout)
    copy(table("add", table("multiply", moving_mean, momentum), table("multiply", mean_p, 1.0 - momentum)),
         moving_mean)
    copy(table("add", table("multiply", moving_var, momentum), table("multiply", var_p, 1.0 - momentum)),
         moving_var)
    inv_std = table("rsqrt", table("add", var, eps))  # float64
    y = view(y, shape)
    out = (y, mean_p, var_p) if c.p["output_mean_var"] else y
    return out, ("sync", x, gamma, mean, inv_std, n)


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    shape = dy.shape
    if g.shape is not None:
        dy = view(dy, g.shape)
    need = grads.needs
    if saved[0] == "bn":
        dx, dgamma, dbeta, _, _ = DEFS["BatchNorm"].gpu.backward(_bn_call(c), saved[1], grads, dy)
    else:
        _, x, gamma, mean, inv_std, n = saved
        pdtype = gamma.dtype
        ch = g.bn.shape[1]
        bshape = g.bn.bshape
        dyp, xp = _as(dy, pdtype), _as(x, pdtype)
        mean_p, inv_p = _as(mean, pdtype), _as(inv_std, pdtype)
        xhat = table("multiply", table("subtract", xp, view(mean_p, bshape)), view(inv_p, bshape))
        sdy = table("sum", dyp, axis=g.bn.axes)
        sdyx = table("sum", table("multiply", dyp, xhat), axis=g.bn.axes)
        local = table("stack", _as(sdy, np.float64), _as(sdyx, np.float64), axis=0)
        # every participant meets, whatever it needs: the others wait for its sums
        total = table("sum", sync_meeting.all_gather(NAME, g.key, g.ndev, "backward", local, c.device), axis=0)
        dx = dgamma = dbeta = None
        if need[0]:
            a = _as(table("divide", view(table("slice_axis", total, axis=0, begin=0, end=1), (ch,)), n), pdtype)
            b = _as(table("divide", view(table("slice_axis", total, axis=0, begin=1, end=2), (ch,)), n), pdtype)
            t = table("subtract", table("subtract", dyp, view(a, bshape)), table("multiply", xhat, view(b, bshape)))
            dx = _as(table("multiply", t, view(table("multiply", gamma, inv_p), bshape)), x.dtype)
        if need[1]:
            dgamma = zeros(gamma.shape, pdtype, gamma.device) if c.p["fix_gamma"] else sdyx
        if need[2]:
            dbeta = sdy
    if dx is not None:
        dx = view(dx, shape)
    return dx, dgamma, dbeta, None, None


define(OpDef(NAME, prepare=_prepare, infer=_infer, samples=_samples, outputs=_outputs, dtype=float32_params,
             aux=("moving_mean", "moving_var"), init={"moving_mean": '["zero", {}]', "moving_var": '["one", {}]'},
             mutates=("gamma", "moving_mean", "moving_var"),
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="Synchronized batch normalization (MXNet's contrib SyncBatchNorm): BatchNorm over channel axis 1 "
                 "whose training statistics are the global batch's, every participating device's together "
                 "(``ndev`` devices meeting under ``key``: launched ranks or one thread per context). ndev=1 is "
                 "BatchNorm. ``output_mean_var`` also returns the mean and the variance."))
