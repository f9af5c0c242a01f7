"""Numpy twin of the batch-normalization ops, and the argument checks both backends share.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Spatial batch norm over axis 1 of (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W): statistics per channel
over every other axis. The semantics are MXNet 1.x's (src/operator/nn/batch_norm.cc):
- the batch variance is the *biased* one (sum / m, m = N * spatial size), also in the running average:
  ``running = momentum * running + (1 - momentum) * batch`` (batch_norm.cc, BatchNormBackwardImpl, the
  ``runningVarDataPtr[channel] * param_.momentum + variance * (1 - momentum)`` lines);
- ``save_inv_std`` is 1 / sqrt(var + eps), what cuDNN's ``resultSaveInvVariance`` holds too.
Statistics are accumulated in float64 and rounded to the data's dtype (the parameters' dtype for the
per-channel results: float32 for float16 data). ``layout="NHWC"``: 4-D x (N, H, W, C), channels on axis 3 (what
cuDNN takes as an NHWC descriptor); checked in its own shapes, computed on the NCHW transpose.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

import math

import numpy as np

from .. import _check


def bn_dtypes(op: str, data: dict, params: dict) -> tuple:
    """(data dtype, parameter dtype). The data arrays (x, dy) share float16, float32 or float64; the per-channel
    arrays share the data's dtype, or float32 for float16 data (cuDNN's mixed mode: half data, float scale, bias
    and statistics, as MXNet keeps BatchNorm's parameters in float32 under net.cast('float16'))."""
    dtype = _check.check_dtype(op, _check.FLOAT_DTYPES, **data)
    pdtype = _check.check_dtype(op, _check.FLOAT32_64, **params)
    want = np.dtype(np.float32) if dtype == np.float16 else dtype
    if pdtype != want:
        names = ", ".join(k for k, v in params.items() if v is not None)
        raise DnnbindTypeError(f"{op}: {names} have dtype {pdtype.name} but the data is {dtype.name}; expected {want.name}"
                        + (" (float16 data takes float32 parameters and statistics)" if dtype == np.float16 else ""))
    return dtype, pdtype


def bn_shapes(op: str, x_shape: tuple, layout: str = "NCHW", **params) -> int:
    """Check x is (N, C, ...) with 2 to 5 axes, or (N, H, W, C) for layout NHWC, and every per-channel array is
    (C,); returns C."""
    x_shape = tuple(x_shape)
    axis = 3 if _check.conv_layout(op, layout) == "NHWC" else 1
    if axis == 3 and len(x_shape) != 4:
        raise DnnbindValueError(f"{op}: layout NHWC needs 4-D x (N, H, W, C), got shape {x_shape}")
    if not 2 <= len(x_shape) <= 5:
        raise DnnbindValueError(f"{op}: x must have 2 to 5 axes (N, C, ...) with channels on axis 1, got shape {x_shape}")
    c = x_shape[axis]
    for name, shape in params.items():
        if shape is not None and tuple(shape) != (c,):
            raise DnnbindValueError(f"{op}: {name} has shape {tuple(shape)} but x of shape {x_shape} has {c} channels "
                             f"(axis {axis}); expected {name} of shape ({c},)")
    return c


def bn_scalars(op: str, eps, momentum=None) -> tuple:
    """eps >= 0 (cuDNN's CUDNN_BN_MIN_EPSILON is 0) and 0 <= momentum <= 1, as floats."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)) or not eps >= 0:
        raise DnnbindValueError(f"{op}: eps must be a number >= 0, got {eps!r}")
    if momentum is not None:
        ok = not isinstance(momentum, bool) and isinstance(momentum, (int, float, np.floating, np.integer))
        if not ok or not 0 <= momentum <= 1:
            raise DnnbindValueError(f"{op}: momentum must be a number in [0, 1], got {momentum!r}")
        momentum = float(momentum)
    return float(eps), momentum


def items_per_channel(op: str, x_shape: tuple, layout: str = "NCHW") -> int:
    """m = N * spatial size; batch statistics need m >= 1. With m == 1 (a batch of one 1x1 map: GluonCV's SSD
    probes its anchors so, in training mode) the mean is x itself and the (biased) variance 0, so y is beta and
    x gets no gradient, as in MXNet 1.9.1."""
    c = x_shape[3 if layout == "NHWC" else 1]
    m = math.prod(x_shape) // c if c else 0  # (math.prod: exact ints, and a fraction of np.prod's cost per call)
    if m < 1:
        raise DnnbindValueError(f"{op}: batch statistics need at least one value per channel, got x of shape "
                                f"{tuple(x_shape)}; use inference mode")
    return m


def _axes(x: np.ndarray) -> tuple:
    return (0,) + tuple(range(2, x.ndim))


def _bcast(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _nchw(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 3, 1, 2)


def _nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def batchnorm_forward_training(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, running_mean: np.ndarray,
                               running_var: np.ndarray, momentum: float = 0.9, eps: float = 1e-5,
                               layout: str = "NCHW") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = gamma * (x - mean) / sqrt(var + eps) + beta with batch statistics; running_mean/var updated IN PLACE.

    Returns (y, save_mean, save_inv_std)."""
    op = "batchnorm_forward_training"
    x, gamma, beta = np.asarray(x), np.asarray(gamma), np.asarray(beta)
    dtype, pdtype = bn_dtypes(op, {"x": x}, {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                                             "running_var": running_var})
    bn_shapes(op, x.shape, layout, gamma=gamma.shape, beta=beta.shape, running_mean=np.shape(running_mean),
              running_var=np.shape(running_var))
    eps, momentum = bn_scalars(op, eps, momentum)
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        if not isinstance(a, np.ndarray) or not a.flags.writeable:
            raise DnnbindTypeError(f"{op}: {name} must be a writable array (it is updated in place), got "
                            f"{type(a).__name__}")
    items_per_channel(op, x.shape, layout)
    if layout == "NHWC":
        y, mean, inv_std = batchnorm_forward_training(_nchw(x), gamma, beta, running_mean, running_var, momentum, eps)
        return _nhwc(y), mean, inv_std
    axes = _axes(x)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes)
    var = np.square(x64 - _bcast(mean, x.ndim)).mean(axis=axes)  # biased, as MXNet
    inv_std = 1.0 / np.sqrt(var + eps)
    y = (x64 - _bcast(mean, x.ndim)) * _bcast(inv_std * gamma, x.ndim) + _bcast(beta.astype(np.float64), x.ndim)
    running_mean[...] = momentum * running_mean + (1.0 - momentum) * mean
    running_var[...] = momentum * running_var + (1.0 - momentum) * var
    return y.astype(dtype), mean.astype(pdtype), inv_std.astype(pdtype)


def batchnorm_forward_inference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                                var: np.ndarray, eps: float = 1e-5, layout: str = "NCHW") -> np.ndarray:
    """y = gamma * (x - mean) / sqrt(var + eps) + beta with given (running) statistics."""
    op = "batchnorm_forward_inference"
    x, gamma, beta, mean, var = (np.asarray(a) for a in (x, gamma, beta, mean, var))
    dtype, _ = bn_dtypes(op, {"x": x}, {"gamma": gamma, "beta": beta, "mean": mean, "var": var})
    bn_shapes(op, x.shape, layout, gamma=gamma.shape, beta=beta.shape, mean=mean.shape, var=var.shape)
    eps, _ = bn_scalars(op, eps)
    if layout == "NHWC":
        return _nhwc(batchnorm_forward_inference(_nchw(x), gamma, beta, mean, var, eps))
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    y = (x.astype(np.float64) - _bcast(mean.astype(np.float64), x.ndim)) * _bcast(scale, x.ndim) \
        + _bcast(beta.astype(np.float64), x.ndim)
    return y.astype(dtype)


def batchnorm_backward(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, save_mean: np.ndarray,
                       save_inv_std: np.ndarray, eps: float = 1e-5,
                       layout: str = "NCHW") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of the training-mode forward (batch statistics): (dx, dgamma, dbeta).

    With xhat = (x - mean) * inv_std: dbeta = sum(dy), dgamma = sum(dy * xhat),
    dx = gamma * inv_std * (dy - dbeta / m - xhat * dgamma / m). ``eps`` is unused here (save_inv_std already
    holds it) but kept so the signature matches cudnnBatchNormalizationBackward's."""
    op = "batchnorm_backward"
    x, dy, gamma, save_mean, save_inv_std = (np.asarray(a) for a in (x, dy, gamma, save_mean, save_inv_std))
    dtype, pdtype = bn_dtypes(op, {"x": x, "dy": dy}, {"gamma": gamma, "save_mean": save_mean,
                                                       "save_inv_std": save_inv_std})
    _check.check_same_shape(op, x=x, dy=dy)
    bn_shapes(op, x.shape, layout, gamma=gamma.shape, save_mean=save_mean.shape, save_inv_std=save_inv_std.shape)
    bn_scalars(op, eps)
    m = items_per_channel(op, x.shape, layout)
    if layout == "NHWC":
        dx, dgamma, dbeta = batchnorm_backward(_nchw(x), _nchw(dy), gamma, save_mean, save_inv_std, eps)
        return _nhwc(dx), dgamma, dbeta
    axes, nd = _axes(x), x.ndim
    inv = save_inv_std.astype(np.float64)
    xhat = (x.astype(np.float64) - _bcast(save_mean.astype(np.float64), nd)) * _bcast(inv, nd)
    g = dy.astype(np.float64)
    dbeta = g.sum(axis=axes)
    dgamma = (g * xhat).sum(axis=axes)
    dx = _bcast(gamma.astype(np.float64) * inv, nd) * (g - _bcast(dbeta / m, nd) - xhat * _bcast(dgamma / m, nd))
    return dx.astype(dtype), dgamma.astype(pdtype), dbeta.astype(pdtype)
