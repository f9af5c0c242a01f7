"""Layer 2 (ops): activation, bias add and softmax through cuDNN. Imports _lib, runtime and ops.

Arrays of any rank are viewed as 4-D NCHW (descriptors.as4d): (N, C) -> (N, C, 1, 1). Softmax "instance"
mode normalizes over C*H*W per sample, "channel" over C at each pixel (cuDNN's two modes).
"""

from __future__ import annotations

from .._lib import cudnn
from .._lib.errors import CudnnError
from . import _check, reference
from . import descriptors as D
from ._common import dnn, float_dtype, out_like, with_context
from ._dispatch import op

L = cudnn.lib
_SOFTMAX_ALGO = {"accurate": cudnn.CUDNN_SOFTMAX_ACCURATE, "log": cudnn.CUDNN_SOFTMAX_LOG}
_SOFTMAX_MODE = {"instance": cudnn.CUDNN_SOFTMAX_MODE_INSTANCE, "channel": cudnn.CUDNN_SOFTMAX_MODE_CHANNEL}


@op(reference.activation_forward, "x")
def activation_forward(x, mode="relu", coef=0.0):
    """y = f(x): ``cudnnActivationForward`` (relu, sigmoid, tanh, clipped_relu, elu)."""
    dtype = float_dtype("activation_forward", x=x)
    mode, coef = _check.activation_mode("activation_forward", mode, coef)
    y = out_like(x.shape, dtype, x.device)
    if x.size:
        xd = D.tensor(x.shape, dtype)
        L.cudnnActivationForward(dnn(x), D.activation(mode, coef), D.scalar_ptr(1, dtype), xd, x.ptr,
                                 D.scalar_ptr(0, dtype), xd, y.ptr)
    return y


@op(reference.activation_backward, "y", "dy", "x")
def activation_backward(y, dy, x, mode="relu", coef=0.0):
    """dx = f'(x) * dy: ``cudnnActivationBackward`` (takes y, dy and x like cuDNN)."""
    dtype = float_dtype("activation_backward", y=y, dy=dy, x=x)
    mode, coef = _check.activation_mode("activation_backward", mode, coef)
    _check.check_same_shape("activation_backward", y=y, dy=dy, x=x)
    dx = out_like(x.shape, dtype, x.device)
    if x.size:
        d = D.tensor(x.shape, dtype)
        L.cudnnActivationBackward(dnn(x), D.activation(mode, coef), D.scalar_ptr(1, dtype), d, y.ptr, d,
                                  dy.ptr, d, x.ptr, D.scalar_ptr(0, dtype), d, dx.ptr)
    return dx


@op(reference.add_tensor, "x", "b")
def add_tensor(x, b):
    """x + b, b broadcast per channel (or same shape): ``cudnnAddTensor`` into a copy of x."""
    dtype = float_dtype("add_tensor", x=x, b=b)
    b_shape = _check.add_tensor_params("add_tensor", x.shape, b.shape)
    y = x.copy()
    try:
        L.cudnnAddTensor(dnn(x), D.scalar_ptr(1, dtype), D.tensor(b_shape, dtype), b.ptr,
                         D.scalar_ptr(1, dtype), D.tensor(x.shape, dtype), y.ptr)
    except CudnnError as exc:
        raise with_context(exc, op="add_tensor", x=x.shape, b=b.shape) from None
    return y


def add_tensor_(y, b, alpha=1.0):
    """In place: y += alpha * b (b broadcast per channel). GPU NDArrays only; used by layers for bias."""
    dtype = y.dtype
    b_shape = _check.add_tensor_params("add_tensor", y.shape, b.shape)
    L.cudnnAddTensor(dnn(y), D.scalar_ptr(alpha, dtype), D.tensor(b_shape, dtype), b.ptr,
                     D.scalar_ptr(1, dtype), D.tensor(y.shape, dtype), y.ptr)
    return y


@op(reference.softmax_forward, "x")
def softmax_forward(x, algorithm="accurate", mode="instance"):
    """softmax or log-softmax: ``cudnnSoftmaxForward``."""
    dtype = float_dtype("softmax_forward", x=x)
    algorithm, mode = _check.softmax_params("softmax_forward", x.shape, algorithm, mode)
    y = out_like(x.shape, dtype, x.device)
    d = D.tensor(x.shape, dtype)
    L.cudnnSoftmaxForward(dnn(x), _SOFTMAX_ALGO[algorithm], _SOFTMAX_MODE[mode], D.scalar_ptr(1, dtype), d,
                          x.ptr, D.scalar_ptr(0, dtype), d, y.ptr)
    return y


@op(reference.softmax_backward, "y", "dy")
def softmax_backward(y, dy, algorithm="accurate", mode="instance"):
    """Gradient of softmax/log-softmax from its output y: ``cudnnSoftmaxBackward``."""
    dtype = float_dtype("softmax_backward", y=y, dy=dy)
    algorithm, mode = _check.softmax_params("softmax_backward", y.shape, algorithm, mode)
    _check.check_same_shape("softmax_backward", y=y, dy=dy)
    dx = out_like(y.shape, dtype, y.device)
    d = D.tensor(y.shape, dtype)
    L.cudnnSoftmaxBackward(dnn(y), _SOFTMAX_ALGO[algorithm], _SOFTMAX_MODE[mode], D.scalar_ptr(1, dtype), d,
                           y.ptr, d, dy.ptr, D.scalar_ptr(0, dtype), d, dx.ptr)
    return dx
