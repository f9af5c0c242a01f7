"""Layer 2 (ops): batch normalization + residual add + ReLU in one cuDNN call. Imports _lib, runtime and ops.

``y = relu(BN(x) + z)`` (MXNet NVIDIA builds' BatchNormAddRelu, the end of a ResNet bottleneck) through
``cudnnBatchNormalizationForwardTrainingEx`` / ``cudnnBatchNormalizationBackwardEx`` with
CUDNN_BATCHNORM_SPATIAL_PERSISTENT and CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION (a ReLU activation descriptor). The
numpy twin is ops/reference/batchnorm_fused.py.

What the GPU op takes is what cuDNN documents for its fused NHWC kernel (cudnnBatchNormalizationForwardTrainingEx:
"All tensors, namely, x, y, dz, dy, dx must be NHWC-fully packed and must be of the type CUDNN_DATA_HALF"; mode
SPATIAL_PERSISTENT; a non-NULL workspace of the queried size; "the tensor C dimension should be a multiple of 4 ...
when bnOps is CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"; the reserve written by the forward preserved for the backward;
only 4-D and 5-D tensors; CUDNN_STATUS_NOT_SUPPORTED for "a configuration the function does not support"): x, z
(N, H, W, C) float16, C-contiguous (which is NHWC fully packed), C % 4 == 0, gamma, beta and the statistics float32.
Other dtypes and channel counts are refused here before any library call; nd.BatchNormAddRelu composes BatchNorm +
add + relu for them instead (and for a shape cuDNN refuses all the same).

Running statistics follow MXNet (BIASED variance), exactly as ops/batchnorm.py does: cuDNN averages its unbiased
variance into a scratch copy of running_var scaled by m / (m - 1), scaled back by (m - 1) / m afterwards. Host
scalars are cached addresses (D.scalar_ptr): a recorded step replays these calls with the same pointers. The
workspace is the stream's shared scratch (ops._common.scratch); the reserve is an NDArray of bytes the forward
returns and the backward takes, so autograd keeps it alive between them.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import threading

import numpy as np

from .._lib import cudnn, hooks
from .._lib.errors import CudnnError
from .._lib.hooks import TRACING
from . import descriptors as D
from ..runtime.array import empty_parts
from ._common import cache_insert, dnn, out_like, out_or_new, scratch, with_context
from ._dispatch import op
from .reference import batchnorm_fused as reference
from .reference.batchnorm import bn_dtypes, bn_scalars
from .reference.batchnorm_fused import fused_shapes

__all__ = ["batchnorm_add_relu_backward", "batchnorm_add_relu_forward_training", "batchnorm_nhwc_backward",
           "batchnorm_nhwc_forward_training", "fusable"]

L = cudnn.lib
MODE = cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT
OPS = cudnn.CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
OPS_BN = cudnn.CUDNN_BATCHNORM_OPS_BN
HALF, FLOAT = np.dtype(np.float16), np.dtype(np.float32)
CHANNEL_MULTIPLE = 4  # cuDNN: C % 4 == 0 for CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION


def fusable(x_shape: tuple, dtype, param_dtype) -> bool:
    """Whether the GPU op takes this data: 4-D (N, H, W, C) float16 with float32 parameters, C % 4 == 0 and more
    than one value per channel. nd.BatchNormAddRelu composes the separate ops otherwise."""
    return (len(x_shape) == 4 and dtype == HALF and param_dtype == FLOAT and x_shape[3] % CHANNEL_MULTIPLE == 0
            and x_shape[0] * x_shape[1] * x_shape[2] > 1)


def _fused_only(op_name: str, x_shape: tuple, dtype) -> None:
    if dtype != HALF:
        raise DnnbindTypeError(f"{op_name}: cuDNN's channels-last BatchNorm kernels (the Ex calls) take float16 data only, "
                        f"got {dtype.name}; nd.BatchNorm and nd.BatchNormAddRelu run other dtypes without them")
    if x_shape[3] % CHANNEL_MULTIPLE:
        raise DnnbindValueError(f"{op_name}: cuDNN's channels-last BatchNorm kernels need a channel count that is a multiple "
                         f"of {CHANNEL_MULTIPLE}, got x of shape {tuple(x_shape)} ({x_shape[3]} channels, last); "
                         "nd.BatchNorm and nd.BatchNormAddRelu run other channel counts without them")


class _Plan:
    """Per (x shape, dtype, handle, bnOps): descriptors and cuDNN's workspace and reserve sizes, queried once (the
    queries take the handle; they are host-side and a recording does not replay them). With CUDNN_BATCHNORM_OPS_BN
    (BatchNorm alone, the channels-last BatchNorm's kernels) there is no z and no activation: NULL descriptors."""
    __slots__ = ("act", "bnd", "bwd_ws", "fwd_ws", "ops", "reserve", "xd", "zd")

    def __init__(self, h: int, x_shape: tuple, dtype, bn_ops: int) -> None:
        self.ops = bn_ops
        # NOTE: the (1, C, 1, 1) parameter descriptor cuDNN derives is the same for the spatial and persistent modes
        self.xd, self.bnd = xd, bnd = D.batchnorm(x_shape, dtype, "NHWC")
        fused = bn_ops == OPS
        self.act = act = D.activation("relu", 0.0) if fused else None
        self.zd = zd = xd if fused else None
        size = ctypes.c_size_t()
        L.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, MODE, bn_ops, xd, zd, xd, bnd, act,
                                                                   ctypes.byref(size))
        self.fwd_ws = size.value
        L.cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, MODE, bn_ops, xd, xd if fused else None, xd, zd, xd,
                                                            bnd, act, ctypes.byref(size))
        self.bwd_ws = size.value
        L.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, MODE, bn_ops, act, xd, ctypes.byref(size))
        self.reserve = size.value


PLAN_LIMIT = 1024
_plans: dict = {}
_plans_lock = threading.Lock()


def _plan(h: int, x_shape: tuple, dtype, bn_ops: int = OPS) -> _Plan:
    key = (x_shape, dtype, h, bn_ops)
    plan = _plans.get(key)
    if plan is None:
        plan = cache_insert(_plans, key, lambda: _Plan(h, x_shape, dtype, bn_ops), _plans_lock, PLAN_LIMIT)
    return plan


@op(reference.batchnorm_add_relu_forward_training, "x", "z", "gamma", "beta", "running_mean", "running_var")
def batchnorm_add_relu_forward_training(x, z, gamma, beta, running_mean, running_var, momentum=0.9, eps=1e-5):
    """relu(BN(x) + z) with batch statistics: ``cudnnBatchNormalizationForwardTrainingEx`` (BN_ADD_ACTIVATION).
    x, z (N, H, W, C) float16; updates running_mean and running_var IN PLACE with MXNet's convention; returns
    (y, save_mean, save_inv_std, reserve), reserve a uint8 NDArray the backward needs."""
    return _forward("batchnorm_add_relu_forward_training", x, z, gamma, beta, running_mean, running_var, momentum,
                    eps, OPS)


@op(reference.batchnorm_nhwc_forward_training, "x", "gamma", "beta", "running_mean", "running_var")
def batchnorm_nhwc_forward_training(x, gamma, beta, running_mean, running_var, momentum=0.9, eps=1e-5):
    """BN(x) with batch statistics for channels-last float16 x: ``cudnnBatchNormalizationForwardTrainingEx``
    (CUDNN_BATCHNORM_OPS_BN). The legacy call given an NHWC descriptor runs a generic kernel 50-100x slower
    (bn_fw_tr_1C11_singleread: 6.7 ms of a ResNet-18 float16 step on an H100, against 0.07 ms); the Ex call
    reaches the NHWC kernels. Same returns and conventions as batchnorm_add_relu_forward_training."""
    return _forward("batchnorm_nhwc_forward_training", x, None, gamma, beta, running_mean, running_var, momentum,
                    eps, OPS_BN)


def _forward(name, x, z, gamma, beta, running_mean, running_var, momentum, eps, bn_ops):
    same = {"x": x} if z is None else {"x": x, "z": z}
    dtype, pdtype = bn_dtypes(name, same, {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                                           "running_var": running_var})
    c, m = fused_shapes(name, x.shape, {} if z is None else {"z": z.shape},
                        {"gamma": gamma.shape, "beta": beta.shape, "running_mean": running_mean.shape,
                         "running_var": running_var.shape})
    eps, momentum = bn_scalars(name, eps, momentum)
    _fused_only(name, x.shape, dtype)
    dev = x.device
    h = dnn(x)
    try:
        plan = _plan(h, x.shape, dtype, bn_ops)
        y = out_like(x.shape, dtype, dev)
        # one allocation for the three (var, the running variance's unbiased stand-in, lives as long as the
        # statistics: C values)
        save_mean, save_inv_std, var = empty_parts(((c,), (c,), (c,)), pdtype, dev)
        reserve = out_like((max(plan.reserve, 1),), np.uint8, dev)
        xd, bnd = plan.xd, plan.bnd
        one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
        # NOTE: cached host scalars (D.scalar_ptr), not locals: a recorded step or hybridized Block replays these
        # calls with these addresses after the function returned.
        up, down = D.scalar_ptr(m / (m - 1), pdtype), D.scalar_ptr((m - 1) / m, pdtype)
        # var = running_var * m / (m - 1): cuDNN's unbiased average into it is the biased one scaled.
        L.cudnnTransformTensor(h, up, bnd, running_var.ptr, zero, bnd, var.ptr)
        # NOTE: never a NULL workspace: given NULL and size 0, cuDNN documents that the call "will function
        # exactly like the non-extended function cudnnBatchNormalizationForwardTraining()" (no add, no ReLU).
        with scratch(dev, max(plan.fwd_ws, 1)) as (ws, ws_size):
            if TRACING:
                hooks.annotate(x=x.shape, dtype=dtype.name, workspace_bytes=plan.fwd_ws, reserve_bytes=plan.reserve)
            L.cudnnBatchNormalizationForwardTrainingEx(h, MODE, bn_ops, one, zero, xd, x.ptr, plan.zd,
                                                       None if z is None else z.ptr, xd, y.ptr, bnd, gamma.ptr,
                                                       beta.ptr, 1.0 - momentum, running_mean.ptr, var.ptr, eps,
                                                       save_mean.ptr, save_inv_std.ptr, plan.act, ws, ws_size,
                                                       reserve.ptr, reserve.nbytes)
        L.cudnnTransformTensor(h, down, bnd, var.ptr, zero, bnd, running_var.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dtype=dtype.name) from None
    return y, save_mean, save_inv_std, reserve


@op(reference.batchnorm_add_relu_backward, "x", "y", "dy", "gamma", "beta", "save_mean", "save_inv_std", "reserve")
def batchnorm_add_relu_backward(x, y, dy, gamma, beta, save_mean, save_inv_std, reserve, eps=1e-5, out_dgamma=None,
                                out_dbeta=None):
    """Gradients of the fused training forward: ``cudnnBatchNormalizationBackwardEx`` (BN_ADD_ACTIVATION) with
    the saved statistics and the forward's reserve; returns (dx, dz, dgamma, dbeta). ``eps`` must be the forward's.
    ``out_dgamma``/``out_dbeta``: (C,) arrays the parameter gradients are written into (GPU only)."""
    return _backward("batchnorm_add_relu_backward", x, y, dy, gamma, beta, save_mean, save_inv_std, reserve, eps,
                     OPS, out_dgamma, out_dbeta)


@op(reference.batchnorm_nhwc_backward, "x", "dy", "gamma", "beta", "save_mean", "save_inv_std", "reserve")
def batchnorm_nhwc_backward(x, dy, gamma, beta, save_mean, save_inv_std, reserve, eps=1e-5, out_dgamma=None,
                            out_dbeta=None):
    """Gradients of batchnorm_nhwc_forward_training: ``cudnnBatchNormalizationBackwardEx`` (CUDNN_BATCHNORM_OPS_BN);
    returns (dx, dgamma, dbeta). ``out_dgamma``/``out_dbeta`` as for batchnorm_add_relu_backward."""
    dx, _, dgamma, dbeta = _backward("batchnorm_nhwc_backward", x, None, dy, gamma, beta, save_mean, save_inv_std,
                                     reserve, eps, OPS_BN, out_dgamma, out_dbeta)
    return dx, dgamma, dbeta


def _backward(name, x, y, dy, gamma, beta, save_mean, save_inv_std, reserve, eps, bn_ops, out_dgamma=None,
              out_dbeta=None):
    same = {"x": x, "dy": dy} if y is None else {"x": x, "y": y, "dy": dy}
    dtype, pdtype = bn_dtypes(name, same, {"gamma": gamma, "beta": beta, "save_mean": save_mean,
                                           "save_inv_std": save_inv_std})
    c, _ = fused_shapes(name, x.shape, {k: a.shape for k, a in same.items() if k != "x"},
                        {"gamma": gamma.shape, "beta": beta.shape, "save_mean": save_mean.shape,
                         "save_inv_std": save_inv_std.shape})
    eps, _ = bn_scalars(name, eps)
    _fused_only(name, x.shape, dtype)
    if reserve.dtype != np.uint8 or len(reserve.shape) != 1:
        raise DnnbindTypeError(f"{name}: reserve must be the 1-D uint8 array the forward returned, got dtype "
                        f"{reserve.dtype.name} and shape {reserve.shape}")
    dev = x.device
    h = dnn(x)
    try:
        plan = _plan(h, x.shape, dtype, bn_ops)
        if reserve.nbytes < plan.reserve:
            raise DnnbindValueError(f"{name}: reserve has {reserve.nbytes} bytes but cuDNN needs {plan.reserve} for x of "
                             f"shape {x.shape}; pass the reserve its forward returned")
        dx = out_like(x.shape, dtype, dev)
        dz = out_like(x.shape, dtype, dev) if bn_ops == OPS else None
        dgamma = out_or_new(name, "out_dgamma", out_dgamma, (c,), pdtype, dev)
        dbeta = out_or_new(name, "out_dbeta", out_dbeta, (c,), pdtype, dev)
        xd = plan.xd
        one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
        with scratch(dev, max(plan.bwd_ws, 1)) as (ws, ws_size):
            if TRACING:
                hooks.annotate(x=x.shape, dtype=dtype.name, workspace_bytes=plan.bwd_ws, reserve_bytes=plan.reserve)
            yd, y_ptr = (None, None) if y is None else (xd, y.ptr)  # y and dz: only with the add and ReLU
            L.cudnnBatchNormalizationBackwardEx(h, MODE, bn_ops, one, zero, one, zero, xd, x.ptr, yd, y_ptr, xd,
                                                dy.ptr, plan.zd, None if dz is None else dz.ptr, xd, dx.ptr,
                                                plan.bnd, gamma.ptr, beta.ptr, dgamma.ptr, dbeta.ptr, eps,
                                                save_mean.ptr, save_inv_std.ptr, plan.act, ws, ws_size,
                                                reserve.ptr, reserve.nbytes)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dy=dy.shape, dtype=dtype.name) from None
    return dx, dz, dgamma, dbeta
