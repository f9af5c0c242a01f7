"""Layer 2 (ops): spatial batch normalization through cuDNN's legacy BN calls. Imports _lib, runtime and ops.

x is (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W), channels on axis 1 (descriptors.as4d views it as
NCHW; spatial mode normalizes over everything but C). float32 and float64, with gamma, beta and the
statistics in x's dtype; and float16 data with float32 parameters and statistics (cuDNN wants double parameters
for double data, float otherwise), which is what mixed precision needs. ``layout="NHWC"``: 4-D x (N, H, W, C),
channels last, given to cuDNN as a CUDNN_TENSOR_NHWC descriptor (the derived (1, C, 1, 1) parameter descriptor is
the same); nd.BatchNorm uses it for axis=3 of 4-D data. Other channel axes are nd.BatchNorm's business (a
transpose).

Semantics are MXNet 1.x's (see ops/reference/batchnorm.py): running = momentum * running + (1 - momentum) *
batch, with the BIASED batch variance. NOTE: cuDNN's resultRunningVariance averages the UNBIASED variance
(Bessel's m / (m - 1), m = N * spatial size); MXNet's own kernels (batch_norm.cc, batch_norm.cu, the MKLDNN
one) store the biased one, only its cuDNN path the unbiased one. dnnbind stores the biased one on both
backends: cuDNN averages into a scratch copy of running_var scaled by m / (m - 1), which is scaled back by
(m - 1) / m afterwards; the result is (1 - f) * running_var + f * biased_var exactly, f = 1 - momentum.
"""

from __future__ import annotations

import math

import numpy as np

from .._lib.errors import DnnbindValueError

from .._lib import cudnn
from .._lib.errors import CudnnError
from . import _check
from . import descriptors as D
from ..runtime.array import empty_parts
from ..runtime.exec_context import exec_context
from ._common import dnn, out_like, out_or_new, with_context, workspace
from ._dispatch import op
from .reference import batchnorm as reference
from .reference.batchnorm import bn_dtypes, bn_scalars, bn_shapes, items_per_channel

L = cudnn.lib
SPATIAL = cudnn.CUDNN_BATCHNORM_SPATIAL
_MODES = {"spatial": SPATIAL, "persistent": cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT}
# The mode of the training forward and backward (they must agree); inference is SPATIAL. MXNet 1.x's cuDNN
# BatchNorm trains in CUDNN_BATCHNORM_SPATIAL_PERSISTENT (cudnn_batch_norm-inl.h, cuDNN >= 7.0.2), and so does dnnbind.
TRAIN_MODE = cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT


def set_batchnorm_mode(mode: str = "persistent") -> str:
    """cuDNN's algorithm for training-mode BatchNorm (forward and backward); returns the previous one.

    "persistent" (default, as in MXNet 1.x): CUDNN_BATCHNORM_SPATIAL_PERSISTENT, which on an H100 takes d2l's
    ResNet-18 step (batch 256) from 8.4 to 6.4 ms in float16 and from 11.2 to 9.6 ms in TF32 (docs/benchmarks.md).
    cuDNN reduces in scaled integers there: data of a very large range can overflow to inf/NaN (cuDNN's
    documentation), and PyTorch keeps it to channels_last after accuracy losses in some NCHW models (ResNeXt-101,
    R(2+1)D). "spatial": CUDNN_BATCHNORM_SPATIAL, plain floating-point reductions; switch to it if a model's
    BatchNorm outputs turn inf/NaN or its accuracy falls short of another framework's."""
    global TRAIN_MODE
    if mode not in _MODES:
        raise DnnbindValueError(f"set_batchnorm_mode: mode must be one of {sorted(_MODES)}, got {mode!r}")
    previous = next(k for k, v in _MODES.items() if v == TRAIN_MODE)
    TRAIN_MODE = _MODES[mode]
    return previous

__all__ = ["batchnorm_backward", "batchnorm_forward_inference", "batchnorm_forward_training", "set_batchnorm_mode"]


@op(reference.batchnorm_forward_training, "x", "gamma", "beta", "running_mean", "running_var")
def batchnorm_forward_training(x, gamma, beta, running_mean, running_var, momentum=0.9, eps=1e-5, layout="NCHW"):
    """Batch statistics: ``cudnnBatchNormalizationForwardTraining`` (spatial). Updates running_mean and
    running_var IN PLACE with MXNet's convention; returns (y, save_mean, save_inv_std)."""
    name = "batchnorm_forward_training"
    dtype, pdtype = bn_dtypes(name, {"x": x}, {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                                               "running_var": running_var})
    bn_shapes(name, x.shape, layout, gamma=gamma.shape, beta=beta.shape, running_mean=running_mean.shape,
              running_var=running_var.shape)
    eps, momentum = bn_scalars(name, eps, momentum)
    items_per_channel(name, x.shape, layout)
    return forward_training_on(exec_context(x.device), x, gamma, beta, running_mean, running_var, momentum, eps,
                               layout)


def forward_training_on(ctx, x, gamma, beta, running_mean, running_var, momentum: float, eps: float,
                        layout: str = "NCHW"):
    """batchnorm_forward_training on arrays its checks (or the BatchNorm operator's) accepted, on ExecContext ``ctx``
    (their device, made current): no check or lookup is repeated."""
    name = "batchnorm_forward_training"
    dtype, pdtype, shape = x.dtype, gamma.dtype, x.shape
    c = shape[3] if layout == "NHWC" else shape[1]
    m = math.prod(shape) // c
    y = ctx.empty(shape, dtype)
    save_mean, save_inv_std = empty_parts(((c,), (c,)), pdtype, ctx.device)  # one allocation for both
    xd, bnd = D.batchnorm(shape, dtype, layout)
    h = ctx.dnn()
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
    # the running variance's unbiased stand-in lives only during this call: the stream's shared scratch
    scratch_ptr = workspace(ctx.device, c * pdtype.itemsize, ctx.stream)[0]
    if m == 1:
        _forward_training_one_value(h, x, gamma, beta, running_mean, running_var, y, save_mean, save_inv_std,
                                    scratch_ptr, momentum, eps, xd, bnd, dtype, pdtype, c)
        return y, save_mean, save_inv_std
    # NOTE: cached host scalars (D.scalar_ptr), not locals: a recorded step or hybridized Block replays this call
    # with these addresses after the function returned.
    up, down = D.scalar_ptr(m / (m - 1), pdtype), D.scalar_ptr((m - 1) / m, pdtype)
    try:
        # scratch = running_var * m / (m - 1): cuDNN's unbiased average into it is the biased one scaled.
        L.cudnnTransformTensor(h, up, bnd, running_var.ptr, zero, bnd, scratch_ptr)
        L.cudnnBatchNormalizationForwardTraining(h, TRAIN_MODE, one, zero, xd, x.ptr, xd, y.ptr, bnd, gamma.ptr,
                                                 beta.ptr, 1.0 - momentum, running_mean.ptr, scratch_ptr, eps,
                                                 save_mean.ptr, save_inv_std.ptr)
        L.cudnnTransformTensor(h, down, bnd, scratch_ptr, zero, bnd, running_var.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dtype=dtype.name, layout=layout) from None
    return y, save_mean, save_inv_std


def _forward_training_one_value(h, x, gamma, beta, running_mean, running_var, y, save_mean, save_inv_std,
                                scratch_ptr, momentum, eps, xd, bnd, dtype, pdtype, c) -> None:
    """One value per channel (x is C values): the batch mean is x, the biased variance 0, y = beta, as MXNet
    computes it. cuDNN's training call would divide by m - 1 for its running variance, so this composes cuDNN's
    tensor calls instead: save_mean = x (in the statistics' type), y from the inference call with that mean and a
    zero variance, running_mean = momentum * running_mean + (1 - momentum) * x, running_var *= momentum."""
    name = "batchnorm_forward_training"
    flat = D.tensor((1, c, 1, 1), dtype)  # x's C values (NCHW or NHWC: the same order) as the parameters' shape
    zero_p = D.scalar_ptr(0, pdtype)
    try:
        L.cudnnTransformTensor(h, D.scalar_ptr(1, dtype), flat, x.ptr, D.scalar_ptr(0, dtype), bnd, save_mean.ptr)
        L.cudnnSetTensor(h, bnd, scratch_ptr, zero_p)
        L.cudnnBatchNormalizationForwardInference(h, SPATIAL, D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype), xd,
                                                  x.ptr, xd, y.ptr, bnd, gamma.ptr, beta.ptr, save_mean.ptr,
                                                  scratch_ptr, eps)
        L.cudnnAddTensor(h, D.scalar_ptr(1.0 - momentum, pdtype), bnd, save_mean.ptr, D.scalar_ptr(momentum, pdtype),
                         bnd, running_mean.ptr)
        L.cudnnScaleTensor(h, bnd, running_var.ptr, D.scalar_ptr(momentum, pdtype))
        L.cudnnSetTensor(h, bnd, save_inv_std.ptr, D.scalar_ptr(1.0 / math.sqrt(eps), pdtype))
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dtype=dtype.name) from None


@op(reference.batchnorm_forward_inference, "x", "gamma", "beta", "mean", "var")
def batchnorm_forward_inference(x, gamma, beta, mean, var, eps=1e-5, layout="NCHW"):
    """Given statistics: ``cudnnBatchNormalizationForwardInference`` (spatial)."""
    name = "batchnorm_forward_inference"
    dtype, _ = bn_dtypes(name, {"x": x}, {"gamma": gamma, "beta": beta, "mean": mean, "var": var})
    bn_shapes(name, x.shape, layout, gamma=gamma.shape, beta=beta.shape, mean=mean.shape, var=var.shape)
    eps, _ = bn_scalars(name, eps)
    y = out_like(x.shape, dtype, x.device)
    if not x.size:
        return y
    xd, bnd = D.batchnorm(x.shape, dtype, layout)
    try:
        L.cudnnBatchNormalizationForwardInference(dnn(x), SPATIAL, D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype),
                                                  xd, x.ptr, xd, y.ptr, bnd, gamma.ptr, beta.ptr, mean.ptr,
                                                  var.ptr, eps)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dtype=dtype.name, layout=layout) from None
    return y


@op(reference.batchnorm_backward, "x", "dy", "gamma", "save_mean", "save_inv_std")
def batchnorm_backward(x, dy, gamma, save_mean, save_inv_std, eps=1e-5, layout="NCHW", out_dgamma=None,
                       out_dbeta=None):
    """Gradients of the training-mode forward: ``cudnnBatchNormalizationBackward`` (spatial) with the saved
    statistics; returns (dx, dgamma, dbeta). ``out_dgamma``/``out_dbeta`` (GPU only): (C,) arrays of the
    parameters' dtype the gradients are written into (a Parameter's grad buffer: no allocation, no copy after)."""
    name = "batchnorm_backward"
    dtype, pdtype = bn_dtypes(name, {"x": x, "dy": dy}, {"gamma": gamma, "save_mean": save_mean,
                                                         "save_inv_std": save_inv_std})
    _check.check_same_shape(name, x=x, dy=dy)
    c = bn_shapes(name, x.shape, layout, gamma=gamma.shape, save_mean=save_mean.shape,
                  save_inv_std=save_inv_std.shape)
    eps, _ = bn_scalars(name, eps)
    items_per_channel(name, x.shape, layout)
    for arg, out in (("out_dgamma", out_dgamma), ("out_dbeta", out_dbeta)):
        if out is not None:  # checked here: backward_on writes into them as given
            out_or_new(name, arg, out, (c,), pdtype, x.device)
    return backward_on(exec_context(x.device), x, dy, gamma, save_mean, save_inv_std, eps, layout, out_dgamma,
                       out_dbeta)


def backward_on(ctx, x, dy, gamma, save_mean, save_inv_std, eps: float, layout: str = "NCHW", out_dgamma=None,
                out_dbeta=None):
    """batchnorm_backward on checked arrays (see forward_training_on); ``out_dgamma``/``out_dbeta``, when given,
    are (C,) arrays of the parameters' dtype on ctx's device (checked by the caller)."""
    name = "batchnorm_backward"
    dtype, pdtype, shape = x.dtype, gamma.dtype, x.shape
    c = shape[3] if layout == "NHWC" else shape[1]
    m = math.prod(shape) // c
    dx = ctx.empty(shape, dtype)
    dgamma = out_dgamma if out_dgamma is not None else ctx.empty((c,), pdtype)
    dbeta = out_dbeta if out_dbeta is not None else ctx.empty((c,), pdtype)
    xd, bnd = D.batchnorm(shape, dtype, layout)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
    h = ctx.dnn()
    if m == 1:  # one value per channel: xhat is 0, so dx = 0, dgamma = 0 and dbeta = dy (the reference's formula)
        try:
            L.cudnnSetTensor(h, xd, dx.ptr, D.scalar_ptr(0, np.float32))  # zero bits: 0 in any float type
            L.cudnnSetTensor(h, bnd, dgamma.ptr, D.scalar_ptr(0, pdtype))
            L.cudnnTransformTensor(h, one, D.tensor((1, c, 1, 1), dtype), dy.ptr, zero, bnd, dbeta.ptr)
        except CudnnError as exc:
            raise with_context(exc, op=name, x=x.shape, dtype=dtype.name) from None
        return dx, dgamma, dbeta
    try:
        L.cudnnBatchNormalizationBackward(h, TRAIN_MODE, one, zero, one, zero, xd, x.ptr, xd, dy.ptr, xd,
                                          dx.ptr, bnd, gamma.ptr, dgamma.ptr, dbeta.ptr, eps, save_mean.ptr,
                                          save_inv_std.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dy=dy.shape, dtype=dtype.name, layout=layout) from None
    return dx, dgamma, dbeta
