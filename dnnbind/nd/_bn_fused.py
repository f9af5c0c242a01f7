"""Layer nd: ``BatchNormAddRelu``, relu(BatchNorm(data) + addend), as NVIDIA's MXNet builds spell it (their ResNet-50
examples call ``F.BatchNormAddRelu(data=x, addend=z, ...)``). Imports ops, autograd, runtime and nd.

BatchNorm's arguments and defaults (nd.BatchNorm, MXNet 1.x: eps 1e-3, momentum 0.9, fix_gamma True,
use_global_stats False, axis 1), plus ``addend`` of data's shape and dtype (no broadcasting: it is the residual).

- Training (``autograd.is_training()``, not ``use_global_stats``) with the channels last (``axis`` 3 or -1) on 4-D
  float16 GPU data, float32 parameters and C % 4 == 0 (what cuDNN fuses: ops/batchnorm_fused.py): one
  cudnnBatchNormalizationForwardTrainingEx; the backward one cudnnBatchNormalizationBackwardEx giving the gradients
  of data, addend, gamma and beta. The moving statistics are updated in place in the forward, with the biased
  variance, as nd.BatchNorm does; ``fix_gamma`` sets gamma to 1 in place and gives it a zero gradient.
- Everything else (inference, ``use_global_stats``, axis 1, float32, other ranks, the cpu, ``cudnn_off=True``):
  ``relu(nd.BatchNorm(data, ...) + addend)``, the separate ops themselves, so the results are theirs exactly.
- A shape cuDNN refuses (CUDNN_STATUS_NOT_SUPPORTED or BAD_PARAM, before it does any work) is remembered and
  composed from then on, as nd.Convolution does for float16 shapes it cannot fuse.
Bad arguments raise ValueError/TypeError naming BatchNormAddRelu before any library call.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

from .._lib.errors import CudnnBadParam, CudnnNotSupported
from .._lib.hooks import deferrable
from ..autograd import grad_out, is_recording, is_training, record_op
from ..ops import batchnorm_fused as _fused
from ..ops.blas import fill as _fill
from ..ops.defs.batchnorm import check as _bn_check
from ..ops.reference.batchnorm import bn_dtypes
from ..runtime.array import NDArray
from ..runtime.array import zeros as _zeros
from ._schema import Schema, schema

__all__ = ["BatchNormAddRelu"]

NAME = "BatchNormAddRelu"
_UNFUSED: set = set()  # (shape, dtype) cuDNN refused to fuse: composed from then on


def _fusable(data: NDArray, param_dtype) -> bool:
    """The fused path's device and data rule (a function, so a cpu test can route the fused path to the twin)."""
    return data.device.kind == "gpu" and _fused.fusable(data.shape, data.dtype, param_dtype)


def _check(data, addend, gamma, beta, moving_mean, moving_var, axis, act_type) -> tuple:
    """Everything that can be refused, before any library call (fix_gamma's in-place fill included)."""
    from ._registry import norm_axes
    if act_type not in (None, "relu"):
        raise DnnbindValueError(f"{NAME}: act_type must be 'relu' (the activation it fuses), got {act_type!r}")
    if not 2 <= data.ndim <= 5:
        raise DnnbindValueError(f"{NAME}: data must have 2 to 5 axes (N, C, ...), got shape {data.shape}")
    ax = norm_axes(NAME, data.ndim, axis)[0]
    if addend.shape != data.shape:
        raise DnnbindValueError(f"{NAME}: addend has shape {addend.shape} but data has shape {data.shape}; expected the "
                         "same shape (the residual is added element-wise, without broadcasting)")
    c = data.shape[ax]
    params = {"gamma": gamma, "beta": beta, "moving_mean": moving_mean, "moving_var": moving_var}
    for name, p in params.items():
        if p is None or not hasattr(p, "shape"):
            raise DnnbindTypeError(f"{NAME}: {name} must be an NDArray of shape ({c},), got {type(p).__name__}")
        if tuple(p.shape) != (c,):
            raise DnnbindValueError(f"{NAME}: {name} has shape {tuple(p.shape)} but data of shape {data.shape} has {c} "
                             f"channels (axis {ax}); expected {name} of shape ({c},)")
    _, pdtype = bn_dtypes(NAME, {"data": data, "addend": addend}, params)
    return ax, pdtype


# NVIDIA's BatchNormAddRelu takes BatchNorm's parameters and act_type; an unknown keyword lists these.
DECLARED = ("eps", "momentum", "fix_gamma", "use_global_stats", "output_mean_var", "axis", "cudnn_off", "act_type")
# BatchNorm's declarations of those parameters (MXNet 1.9.1's), parsed as MXNet parses them under this op's name;
# act_type is checked by _check (only 'relu', the activation cuDNN fuses)
_PARAMS = Schema(NAME, schema("BatchNorm").inputs, tuple(q for q in schema("BatchNorm").params if q.name in DECLARED))


# eps and momentum default to nd.BatchNorm's own defaults (MXNet's declared values, 1e-3 and 0.9 as C floats), so
# the composed path and nd.BatchNorm called without them agree to the bit
_EPS, _MOMENTUM = _PARAMS.param("eps").default, _PARAMS.param("momentum").default


@deferrable  # one op to dnnbind.eager_replay (it calls the library directly)
def BatchNormAddRelu(data=None, addend=None, gamma=None, beta=None, moving_mean=None, moving_var=None, eps=_EPS,
                     momentum=_MOMENTUM, fix_gamma=True, use_global_stats=False, output_mean_var=False, axis=1,
                     cudnn_off=False, act_type="relu", out=None, name=None, **kwargs):
    """relu(BatchNorm(data) + addend) with MXNet BatchNorm's arguments (see the module docstring); ``addend`` has
    data's shape and dtype. ``output_mean_var=True`` also returns BatchNorm's mean and inverse standard deviation.
    ``name`` is ignored; ``out`` takes the output."""
    from ._params import array_arg, into, reject
    from ._registry import call
    if kwargs:
        reject(NAME, kwargs, DECLARED)
    given = {"eps": eps, "momentum": momentum, "fix_gamma": fix_gamma, "use_global_stats": use_global_stats,
             "output_mean_var": output_mean_var, "axis": axis, "cudnn_off": cudnn_off}
    p = _PARAMS.parse(given)
    eps, momentum, fix_gamma, use_global_stats, output_mean_var, axis, cudnn_off = (p[k] for k in given)
    # gamma and the moving statistics are written in place: NDArrays only
    data = array_arg(NAME, "data", data)
    gamma, beta, moving_mean, moving_var = (array_arg(NAME, n, a, data, numpy_ok=False) for n, a in (
        ("gamma", gamma), ("beta", beta), ("moving_mean", moving_mean), ("moving_var", moving_var)))
    addend = array_arg(NAME, "addend", addend, data)
    if out is not None:
        res = BatchNormAddRelu(data, addend, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma,
                               use_global_stats, output_mean_var, axis, cudnn_off, act_type)
        return (into(out, res[0]),) + tuple(res[1:]) if output_mean_var else into(out, res)
    ax, pdtype = _check(data, addend, gamma, beta, moving_mean, moving_var, axis, act_type)
    _bn_check(NAME, p, data, gamma, beta, moving_mean, moving_var)  # BatchNorm's own checks (dtypes, eps, momentum)
    key = (data.shape, data.dtype)
    if (is_training() and not use_global_stats and not cudnn_off and ax == 3 and data.ndim == 4
            and key not in _UNFUSED and _fusable(data, pdtype)):
        out = _fused_forward(data, addend, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma)
        if out is not None:
            return out if output_mean_var else out[0]
        _UNFUSED.add(key)
    # nd.BatchNorm itself, given the values as given (the same objects each call of a Gluon layer: its parsed
    # call is cached)
    out = call("BatchNorm", data, gamma, beta, moving_mean, moving_var, **given)
    y = call("relu", (out[0] if output_mean_var else out) + addend)
    return (y, out[1], out[2]) if output_mean_var else y


def _fused_forward(data, addend, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma):
    """(y, mean, inv_std) through ops.batchnorm_fused, taped; None where cuDNN refuses the shape."""
    if fix_gamma:
        _fill(gamma, 1.0)
    try:
        y, mean, inv_std, reserve = _fused.batchnorm_add_relu_forward_training(data, addend, gamma, beta,
                                                                               moving_mean, moving_var, momentum, eps)
    except (CudnnNotSupported, CudnnBadParam):  # refused before any work: the moving statistics are untouched
        return None
    if is_recording():
        x = data

        def backward(dy):
            # NOTE: y, the statistics and cuDNN's reserve (the ReLU mask among others) live until this has run.
            # on a GPU, dgamma and dbeta go into the Parameters' grad buffers where autograd offers them (no copy
            # after); the numpy twin takes no such arguments
            into = {}
            if x.device.kind == "gpu":
                into = {"out_dgamma": None if fix_gamma else grad_out(gamma), "out_dbeta": grad_out(beta)}
            dx, dz, dgamma, dbeta = _fused.batchnorm_add_relu_backward(x, y, dy, gamma, beta, mean, inv_std,
                                                                       reserve, eps, **into)
            if fix_gamma:
                dgamma = _zeros(dgamma.shape, dgamma.dtype, dgamma.device)
            return dx, dz, dgamma, dbeta

        record_op(NAME, y, (data, addend, gamma, beta), backward)
    return y, mean, inv_std
