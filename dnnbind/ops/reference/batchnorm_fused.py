"""Numpy twin of the fused BatchNorm + residual add + ReLU ops (ops/batchnorm_fused.py), and the argument checks
both backends share.

Layer: dnnbind/ops. Imports numpy, dnnbind.ops._check and the batch-norm twin's checks (reference/batchnorm.py).

``y = relu(BN(x) + z)`` over 4-D channels-last data (N, H, W, C), z of x's shape: statistics per channel over N, H
and W, with the semantics of ops/reference/batchnorm.py (MXNet 1.x): the BIASED batch variance, also in the running
average ``running = momentum * running + (1 - momentum) * batch``, updated IN PLACE; ``save_inv_std`` is
1 / sqrt(var + eps). Data float16 (gamma, beta and the statistics float32: the case cuDNN fuses), float32 or
float64 (parameters in the data's dtype). Statistics and the sum BN(x) + z are computed in float64 and rounded once.

The reserve: cuDNN's is an opaque byte buffer its backward reads; the twin's is an empty uint8 array, because its
backward takes the ReLU mask from y (relu'(v) = 1 exactly where y > 0).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from .. import _check
from . import batchnorm as _plain
from .batchnorm import bn_dtypes, bn_scalars

_AXES = (0, 1, 2)  # N, H, W: everything but the channels (last)


def fused_shapes(op: str, x_shape: tuple, same: dict, params: dict) -> tuple[int, int]:
    """x is 4-D (N, H, W, C); every array of ``same`` (name -> shape) has x's shape, every one of ``params`` is
    (C,); batch statistics need m = N * H * W > 1. Returns (C, m)."""
    x_shape = tuple(x_shape)
    if len(x_shape) != 4:
        raise DnnbindValueError(f"{op}: x must be 4-D channels-last (N, H, W, C), got shape {x_shape}")
    for name, shape in same.items():
        if tuple(shape) != x_shape:
            raise DnnbindValueError(f"{op}: {name} has shape {tuple(shape)} but x has shape {x_shape}; expected the same "
                             "shape")
    c = x_shape[3]
    for name, shape in params.items():
        if tuple(shape) != (c,):
            raise DnnbindValueError(f"{op}: {name} has shape {tuple(shape)} but x of shape {x_shape} has {c} channels "
                             f"(axis 3, channels last); expected {name} of shape ({c},)")
    m = x_shape[0] * x_shape[1] * x_shape[2]
    if m < 2:
        raise DnnbindValueError(f"{op}: batch statistics need more than one value per channel, got x of shape {x_shape} "
                         f"({m} per channel); use a larger batch or inference mode")
    return c, m


def batchnorm_add_relu_forward_training(x: np.ndarray, z: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                                        running_mean: np.ndarray, running_var: np.ndarray, momentum: float = 0.9,
                                        eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """y = relu(gamma * (x - mean) / sqrt(var + eps) + beta + z) with batch statistics over N, H, W;
    running_mean/var updated IN PLACE. Returns (y, save_mean, save_inv_std, reserve)."""
    op = "batchnorm_add_relu_forward_training"
    x, z, gamma, beta = (np.asarray(a) for a in (x, z, gamma, beta))
    dtype, pdtype = bn_dtypes(op, {"x": x, "z": z}, {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                                                     "running_var": running_var})
    fused_shapes(op, x.shape, {"z": z.shape}, {"gamma": gamma.shape, "beta": beta.shape,
                                               "running_mean": np.shape(running_mean),
                                               "running_var": np.shape(running_var)})
    eps, momentum = bn_scalars(op, eps, momentum)
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        if not isinstance(a, np.ndarray) or not a.flags.writeable:
            raise DnnbindTypeError(f"{op}: {name} must be a writable array (it is updated in place), got "
                            f"{type(a).__name__}")
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=_AXES)
    var = np.square(x64 - mean).mean(axis=_AXES)  # biased, as MXNet
    inv_std = 1.0 / np.sqrt(var + eps)
    y = (x64 - mean) * (inv_std * gamma.astype(np.float64)) + beta.astype(np.float64) + z.astype(np.float64)
    running_mean[...] = momentum * running_mean + (1.0 - momentum) * mean
    running_var[...] = momentum * running_var + (1.0 - momentum) * var
    return np.maximum(y, 0.0).astype(dtype), mean.astype(pdtype), inv_std.astype(pdtype), np.zeros(0, np.uint8)


def batchnorm_add_relu_backward(x: np.ndarray, y: np.ndarray, dy: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                                save_mean: np.ndarray, save_inv_std: np.ndarray, reserve: np.ndarray,
                                eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of the training forward: (dx, dz, dgamma, dbeta).

    dz = dy * (y > 0) (the ReLU's gradient; the add passes it on), then batch norm's backward on dz: with
    xhat = (x - mean) * inv_std, dbeta = sum(dz), dgamma = sum(dz * xhat),
    dx = gamma * inv_std * (dz - dbeta / m - xhat * dgamma / m). ``beta``, ``reserve`` and ``eps`` are unused here
    (y holds the mask, save_inv_std the eps) but kept so the signature matches cudnnBatchNormalizationBackwardEx's."""
    op = "batchnorm_add_relu_backward"
    x, y, dy, gamma, beta, save_mean, save_inv_std = (np.asarray(a) for a in (x, y, dy, gamma, beta, save_mean,
                                                                               save_inv_std))
    dtype, pdtype = bn_dtypes(op, {"x": x, "y": y, "dy": dy}, {"gamma": gamma, "beta": beta, "save_mean": save_mean,
                                                               "save_inv_std": save_inv_std})
    _, m = fused_shapes(op, x.shape, {"y": y.shape, "dy": dy.shape},
                        {"gamma": gamma.shape, "beta": beta.shape, "save_mean": save_mean.shape,
                         "save_inv_std": save_inv_std.shape})
    bn_scalars(op, eps)
    _check.check_dtype(op, (np.dtype(np.uint8),), reserve=np.asarray(reserve))
    inv = save_inv_std.astype(np.float64)
    xhat = (x.astype(np.float64) - save_mean.astype(np.float64)) * inv
    g = np.where(y > 0, dy.astype(np.float64), 0.0)
    dbeta = g.sum(axis=_AXES)
    dgamma = (g * xhat).sum(axis=_AXES)
    dx = gamma.astype(np.float64) * inv * (g - dbeta / m - xhat * (dgamma / m))
    return dx.astype(dtype), g.astype(dtype), dgamma.astype(pdtype), dbeta.astype(pdtype)


def batchnorm_nhwc_forward_training(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, running_mean: np.ndarray,
                                    running_var: np.ndarray, momentum: float = 0.9,
                                    eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """BatchNorm of channels-last x with batch statistics, the Ex call's returns: (y, save_mean, save_inv_std,
    reserve), the reserve empty. The statistics are reference/batchnorm.py's."""
    op = "batchnorm_nhwc_forward_training"
    fused_shapes(op, np.shape(x), {}, {"gamma": np.shape(gamma), "beta": np.shape(beta),
                                       "running_mean": np.shape(running_mean), "running_var": np.shape(running_var)})
    y, mean, inv_std = _plain.batchnorm_forward_training(x, gamma, beta, running_mean, running_var, momentum, eps,
                                                         layout="NHWC")
    return y, mean, inv_std, np.zeros(0, np.uint8)


def batchnorm_nhwc_backward(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                            save_mean: np.ndarray, save_inv_std: np.ndarray, reserve: np.ndarray,
                            eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of batchnorm_nhwc_forward_training: (dx, dgamma, dbeta) (``beta`` and ``reserve`` unused)."""
    op = "batchnorm_nhwc_backward"
    fused_shapes(op, np.shape(x), {"dy": np.shape(dy)}, {"gamma": np.shape(gamma), "beta": np.shape(beta),
                                                         "save_mean": np.shape(save_mean),
                                                         "save_inv_std": np.shape(save_inv_std)})
    _check.check_dtype(op, (np.dtype(np.uint8),), reserve=np.asarray(reserve))
    return _plain.batchnorm_backward(x, dy, gamma, save_mean, save_inv_std, eps, layout="NHWC")
