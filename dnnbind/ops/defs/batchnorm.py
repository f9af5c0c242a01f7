"""MXNet's ``BatchNorm`` (spatial batch normalization over one channel axis): cudnnBatchNormalization* on a GPU
(ops/batchnorm.py, and ops/batchnorm_fused.py's Ex calls for channels-last float16), ops/reference/batchnorm.py on
the cpu.

``y = gamma * (x - mean) / sqrt(var + eps) + beta`` per channel of ``axis``. MXNet 1.9.1 declares eps 1e-3,
momentum 0.9, fix_gamma True, use_global_stats False, output_mean_var False, axis 1; ``cudnn_off`` and the
quantization calibration ``min_calib_range``/``max_calib_range`` are accepted and ignored.

- Training (autograd's train mode and not ``use_global_stats``): the batch statistics, and ``moving_mean`` and
  ``moving_var`` updated IN PLACE, ``moving = momentum * moving + (1 - momentum) * batch`` with the biased batch
  variance (MXNet's kernels). NOTE: MXNet's CPU/CUDA kernels update them in the backward pass, its cuDNN path in
  the forward; dnnbind updates in the forward (so also under ``train_mode()`` without ``record()``). After forward
  + backward the values agree with MXNet's. Needs more than one value per channel (MXNet would divide by a
  variance of 0), refused in the forward before anything is written.
- Otherwise the moving statistics (cudnnBatchNormalizationForwardInference). The forward cannot know whether a
  gradient will be asked for, so it always runs the inference call; the backward is the plain affine one,
  dx = dy * gamma * inv_std, dgamma = sum(dy * xhat), dbeta = sum(dy), composed of table ops (MXNet's gradient
  with use_global_stats).
- ``fix_gamma``: gamma is set to 1 IN PLACE (as MXNet does) and its gradient is 0.
- ``output_mean_var``: also the mean and the INVERSE standard deviation used (the batch's in training, the moving
  ones otherwise), MXNet's outputs ``mean`` and ``var``.
- The auxiliary states get no gradient (MXNet gives them zeros).

The channel axis is 1 or, on 4-D data, the last (MXNet's channels-last ``axis=3``/``-1``, given to cuDNN as an NHWC
descriptor); any other axis is moved to 1 by a transpose, and the result moved back.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._lib.errors import CudnnBadParam, CudnnNotSupported, DnnbindTypeError, DnnbindValueError
from ..._lib.hooks import TRACING
from ...runtime.array import zeros
from .. import batchnorm as _bn
from .. import batchnorm_fused as _bn_ex
from ..blas import copy, fill
from .._common import out_like
from ..opdef import Lowering, OpDef, define, float32_params, table, view
from ..reference.batchnorm import (batchnorm_backward, batchnorm_forward_inference, batchnorm_forward_training,
                                   bn_dtypes, bn_scalars, bn_shapes, items_per_channel)

__all__ = ["Geometry", "check"]

NAME = "BatchNorm"


class Geometry(NamedTuple):
    """A call's layout: the channel axis ``axis``; ``layout`` what cuDNN is given (NCHW, or NHWC for the last axis
    of 4-D data); ``perm`` the transpose that moves another axis to 1 (None when none is needed) and ``inv`` its
    inverse; ``shape`` the data's shape as lowered; ``bshape`` and ``axes`` a per-channel array's broadcast shape
    and the reduced axes in that shape; ``eps`` and ``momentum`` as floats."""
    axis: int
    layout: str
    perm: tuple | None
    inv: tuple | None
    shape: tuple
    bshape: tuple
    axes: tuple
    eps: float
    momentum: float


def check(op: str, p: dict, data, gamma, beta, moving_mean, moving_var) -> Geometry:
    """Every check of BatchNorm's arrays against its parsed parameters ``p``, before any library call or in-place
    write (ValueError/TypeError naming ``op``, the argument and the shapes); the Geometry of the call. Shared with
    nd.BatchNormAddRelu, which takes BatchNorm's arrays and parameters."""
    shape, ndim = tuple(data.shape), data.ndim
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {shape})")
    if not 2 <= ndim <= 5:
        raise DnnbindValueError(f"{op}: data must have 2 to 5 axes (N, C, ...), got shape {shape}")
    axis = p["axis"]
    if not -ndim <= axis < ndim:
        raise DnnbindValueError(f"{op}: axis {axis} is out of range for data of shape {shape}")
    ax = axis % ndim
    arrays = {"gamma": gamma, "beta": beta, "moving_mean": moving_mean, "moving_var": moving_var}
    layout, perm, inv = ("NHWC" if ax == 3 and ndim == 4 else "NCHW"), None, None
    if ax != 1 and layout == "NCHW":
        # channels to axis 1 and back; the per-channel arrays are checked here against the data as given, so the
        # message names its shape and axis, not the transposed ones
        c = shape[ax]
        for name, a in arrays.items():
            if tuple(a.shape) != (c,):
                raise DnnbindValueError(f"{op}: {name} has shape {tuple(a.shape)} but data of shape {shape} has {c} "
                                        f"channels (axis {axis}); expected {name} of shape ({c},)")
        perm = tuple(i for i in range(ndim) if i != ax)
        perm = perm[:1] + (ax,) + perm[1:]
        inv = tuple(int(i) for i in np.argsort(perm))
        shape = tuple(shape[i] for i in perm)
    c = bn_shapes(op, shape, layout, **{k: tuple(a.shape) for k, a in arrays.items()})
    bn_dtypes(op, {"data": data}, arrays)
    eps, momentum = bn_scalars(op, p["eps"], p["momentum"])
    ch = 3 if layout == "NHWC" else 1
    bshape = tuple(c if i == ch else 1 for i in range(len(shape)))
    axes = tuple(i for i in range(len(shape)) if i != ch)
    return Geometry(ax, layout, perm, inv, shape, bshape, axes, eps, momentum)


def _prepare(p, data, gamma, beta, moving_mean, moving_var):
    return check(NAME, p, data, gamma, beta, moving_mean, moving_var)


def _infer(p, shapes):
    data = shapes[0]
    axis = p["axis"]
    c = data[axis if axis >= 0 else len(data) + axis]
    return [data] + [(c,)] * 4, [data, (c,), (c,)]  # output, mean, var


def _outputs(p):
    """MXNet's node has three outputs; mean and var are visible with output_mean_var."""
    return 3, (["output", "mean", "var"] if p.get("output_mean_var") else ["output"])


def _training(c) -> bool:
    """Batch statistics (and the moving ones updated), or the moving statistics."""
    if c.training and not c.p["use_global_stats"]:
        # refused before gamma or the moving statistics are written
        items_per_channel(NAME, c.geo.shape, c.geo.layout)
        return True
    return False


def _result(c, y, mean, inv_std):
    return (y, mean, inv_std) if c.p["output_mean_var"] else y


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, gamma, beta, moving_mean, moving_var):
    g = c.geo
    train = _training(c)
    if g.perm is not None:
        x = np.ascontiguousarray(x.transpose(g.perm))
    if c.p["fix_gamma"]:
        gamma[...] = 1
    if train:
        y, mean, inv_std = batchnorm_forward_training(x, gamma, beta, moving_mean, moving_var, g.momentum, g.eps,
                                                      layout=g.layout)
        saved = (True, x, gamma, mean, inv_std)
    else:
        y = batchnorm_forward_inference(x, gamma, beta, moving_mean, moving_var, g.eps, layout=g.layout)
        mean = inv_std = None
        if c.p["output_mean_var"]:
            mean = moving_mean.copy()
            inv_std = (1.0 / np.sqrt(moving_var.astype(np.float64) + g.eps)).astype(moving_var.dtype)
        saved = (False, x, gamma, moving_mean, moving_var)
    if g.perm is not None:
        y = y.transpose(g.inv)
    return _result(c, y, mean, inv_std), saved


def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    train, x, gamma, a, b = saved
    if g.perm is not None:
        dy = np.ascontiguousarray(dy.transpose(g.perm))
    if train:
        dx, dgamma, dbeta = batchnorm_backward(x, dy, gamma, a, b, g.eps, layout=g.layout)
    else:  # the affine map of the moving statistics a, b
        inv_std = 1.0 / np.sqrt(b.astype(np.float64) + g.eps)
        dy64 = dy.astype(np.float64)
        dx = (dy64 * (gamma * inv_std).reshape(g.bshape)).astype(x.dtype)
        dbeta = dy64.sum(axis=g.axes).astype(gamma.dtype)
        xhat = (x.astype(np.float64) - a.astype(np.float64).reshape(g.bshape)) * inv_std.reshape(g.bshape)
        dgamma = (dy64 * xhat).sum(axis=g.axes).astype(gamma.dtype)
    if c.p["fix_gamma"]:
        dgamma = np.zeros_like(dgamma)
    if g.perm is not None:
        dx = dx.transpose(g.inv)
    need = grads.needs
    return dx if need[0] else None, dgamma if need[1] else None, dbeta if need[2] else None, None, None


# gpu: cuDNN ---------------------------------------------------------------------------------------------------

_NO_EX: set = set()  # (shape, dtype) the Ex call refused: the legacy call from then on


def _nhwc_ex(x, gamma, layout: str) -> bool:
    """Whether training takes cuDNN's Ex call (ops.batchnorm_fused.batchnorm_nhwc_*): channels-last float16 data in
    the persistent mode, where the legacy call's NHWC kernel is 50-100x slower (ResNet-18 float16 on an H100: 16 ms
    of a 21 ms step). Other cases keep the legacy call."""
    return (layout == "NHWC" and _bn.TRAIN_MODE == _bn_ex.MODE and _bn_ex.fusable(x.shape, x.dtype, gamma.dtype)
            and (x.shape, x.dtype) not in _NO_EX)


def _gpu_forward(c, x, gamma, beta, moving_mean, moving_var):
    g = c.geo
    train = _training(c)
    if g.perm is not None:
        x = table("transpose", x, axes=g.perm)
    if c.p["fix_gamma"]:
        fill(gamma, 1.0)
    if train:
        ex = _nhwc_ex(x, gamma, g.layout)
        if ex:
            try:
                y, mean, inv_std, reserve = _bn_ex.batchnorm_nhwc_forward_training.gpu(
                    x, gamma, beta, moving_mean, moving_var, g.momentum, g.eps)
            except (CudnnNotSupported, CudnnBadParam):  # refused before any work: the legacy call from now on
                _NO_EX.add((x.shape, x.dtype))
                ex = False
        if not ex:
            reserve = None
            if TRACING:  # the checked entry point, which names its library calls in the trace
                y, mean, inv_std = _bn.batchnorm_forward_training.gpu(x, gamma, beta, moving_mean, moving_var,
                                                                      g.momentum, g.eps, layout=g.layout)
            else:  # checked by prepare already (check())
                y, mean, inv_std = _bn.forward_training_on(c.ctx(), x, gamma, beta,
                                                           moving_mean, moving_var, g.momentum, g.eps, g.layout)
        saved = ("ex" if ex else "train", x, gamma, beta, mean, inv_std, reserve)
    else:
        y = _bn.batchnorm_forward_inference.gpu(x, gamma, beta, moving_mean, moving_var, g.eps, layout=g.layout)
        mean = inv_std = None
        if c.p["output_mean_var"]:
            mean = copy(moving_mean, out_like(moving_mean.shape, moving_mean.dtype, moving_mean.device))
            inv_std = table("rsqrt", table("add", moving_var, g.eps))
        # NOTE: the moving statistics themselves, not copies (the inference call writes none): the backward, if
        # one runs, reads them as they are then, as a graph composed of table ops would
        saved = ("infer", x, gamma, beta, moving_mean, moving_var, None)
    if g.perm is not None:
        y = table("transpose", y, axes=g.inv)
    return _result(c, y, mean, inv_std), saved


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    kind, x, gamma, beta, a, b, reserve = saved
    need = grads.needs
    if g.perm is not None:
        dy = table("transpose", dy, axes=g.perm)
    # dgamma and dbeta straight into the Parameters' grad buffers where autograd offers them (no copy after); not
    # when fix_gamma zeroes dgamma below
    into_g = grads.into[1] if need[1] and not c.p["fix_gamma"] else None
    into_b = grads.into[2] if need[2] else None
    if kind == "ex":
        dx, dgamma, dbeta = _bn_ex.batchnorm_nhwc_backward.gpu(x, dy, gamma, beta, a, b, reserve, g.eps,
                                                               out_dgamma=into_g, out_dbeta=into_b)
    elif kind == "train" and TRACING:
        dx, dgamma, dbeta = _bn.batchnorm_backward.gpu(x, dy, gamma, a, b, g.eps, layout=g.layout,
                                                       out_dgamma=into_g, out_dbeta=into_b)
    elif kind == "train":  # the grad buffers autograd offers have the parameters' shape, dtype and device
        dx, dgamma, dbeta = _bn.backward_on(grads.ctx(dy), x, dy, gamma, a, b, g.eps,
                                            g.layout, into_g, into_b)
    else:
        dx, dgamma, dbeta = _affine_backward(c, x, gamma, a, b, dy, need)
    if need[1] and c.p["fix_gamma"]:
        dgamma = zeros(gamma.shape, gamma.dtype, gamma.device)
    if need[0] and g.perm is not None:
        dx = table("transpose", dx, axes=g.inv)
    return dx if need[0] else None, dgamma if need[1] else None, dbeta if need[2] else None, None, None


def _affine_backward(c, x, gamma, mean, var, dy, need) -> tuple:
    """The gradients of y = (x - mean) * gamma * inv_std + beta with given statistics, composed of table ops (no
    library call computes them); the per-channel sums in the parameters' dtype (float32 for float16 data)."""
    g = c.geo
    pdtype = gamma.dtype
    inv_std = table("rsqrt", table("add", var, g.eps))
    dx = dgamma = dbeta = None
    if need[0]:
        scale = table("multiply", gamma, inv_std)
        if scale.dtype != dy.dtype:
            scale = table("cast", scale, dtype=dy.dtype)
        dx = table("multiply", dy, view(scale, g.bshape))
    want_dgamma = need[1] and not c.p["fix_gamma"]
    if need[2] or want_dgamma:
        dyp = dy if dy.dtype == pdtype else table("cast", dy, dtype=pdtype)
        if need[2]:
            dbeta = table("sum", dyp, axis=g.axes)
        if want_dgamma:
            xp = x if x.dtype == pdtype else table("cast", x, dtype=pdtype)
            xhat = table("multiply", table("subtract", xp, view(mean, g.bshape)), view(inv_std, g.bshape))
            dgamma = table("sum", table("multiply", dyp, xhat), axis=g.axes)
    return dx, dgamma, dbeta


def _samples(rng):
    def arrays(shape, axis=1):
        c = shape[axis]
        return {"data": rng.standard_normal(shape) * 2 + rng.standard_normal(c).reshape(
                    [c if i == axis % len(shape) else 1 for i in range(len(shape))]),
                "gamma": rng.uniform(0.5, 2.0, c), "beta": rng.standard_normal(c),
                "moving_mean": rng.standard_normal(c), "moving_var": rng.uniform(0.5, 2.0, c)}

    yield arrays((3, 2, 2, 3)), {"fix_gamma": False, "eps": 1e-3, "momentum": 0.8}
    yield arrays((2, 3, 2, 2)), {}  # MXNet's defaults: fix_gamma
    yield arrays((2, 3, 4)), {"fix_gamma": False, "use_global_stats": True, "eps": 1e-5}
    yield arrays((3, 2, 3)), {"fix_gamma": False, "output_mean_var": True}
    yield arrays((2, 2, 3, 3), -1), {"fix_gamma": False, "axis": -1}  # channels last: NHWC descriptors
    yield arrays((2, 3, 2, 4), 3), {"axis": 3, "use_global_stats": True, "fix_gamma": False}
    yield arrays((2, 2, 3, 2), 2), {"axis": 2, "fix_gamma": False}  # a middle axis: transposes
    yield arrays((5, 3)), {"fix_gamma": False, "momentum": 0.5}  # (N, C)
    yield arrays((2, 3, 2, 2, 2)), {"fix_gamma": False, "output_mean_var": True}


define(OpDef(NAME, prepare=_prepare, infer=_infer, samples=_samples, outputs=_outputs, dtype=float32_params,
             aux=("moving_mean", "moving_var"), init={"moving_mean": '["zero", {}]', "moving_var": '["one", {}]'},
             mutates=("gamma", "moving_mean", "moving_var"),
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="Batch normalization (MXNet's BatchNorm) over ``axis``: batch statistics in training, with "
                 "``moving_mean``/``moving_var`` updated in place; the moving statistics otherwise. ``fix_gamma`` "
                 "sets gamma to 1 in place (gradient 0); ``output_mean_var`` also returns the mean and the "
                 "inverse standard deviation. cudnnBatchNormalization* on a GPU."))
