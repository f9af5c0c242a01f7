"""Layer 2 (ops): 2-D pooling through cuDNN. Imports _lib, runtime and ops.

Modes: "max", "avg" (padding counted in the divisor, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING) and
"avg_exclude_pad". Output size floor((H + 2p - k) / s) + 1, cuDNN's rule. ``layout="NHWC"``: x (N, H, W, C) and
y (N, P, Q, C), given to cuDNN as CUDNN_TENSOR_NHWC descriptors (the pooling descriptor is the same).
"""

from __future__ import annotations

from .._lib import cudnn
from . import _check, reference
from . import descriptors as D
from ._common import dnn, float_dtype, out_like
from ._dispatch import op

L = cudnn.lib


def _desc(shape, dtype, layout):
    return D.tensor_nhwc(shape, dtype) if layout == "NHWC" else D.tensor(shape, dtype)


@op(reference.pooling_forward, "x")
def pooling_forward(x, mode="max", window=2, stride=None, padding=0, layout="NCHW"):
    """``cudnnPoolingForward``."""
    dtype = float_dtype("pooling_forward", x=x)
    window, stride, padding, y_shape = _check.pool_params("pooling_forward", x._shape, mode, window, stride,
                                                          padding, layout)
    y = out_like(y_shape, dtype, x._device)
    L.cudnnPoolingForward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                          _desc(x._shape, dtype, layout), x._ptr, D.scalar_ptr(0, dtype),
                          _desc(y_shape, dtype, layout), y._ptr)
    return y


@op(reference.pooling_backward, "y", "dy", "x")
def pooling_backward(y, dy, x, mode="max", window=2, stride=None, padding=0, layout="NCHW"):
    """``cudnnPoolingBackward`` (needs the forward's x and y: max routes dy to the arg-max)."""
    dtype = float_dtype("pooling_backward", y=y, dy=dy, x=x)
    window, stride, padding, y_shape = _check.pool_grad_params("pooling_backward", x._shape, y._shape, dy._shape,
                                                               mode, window, stride, padding, layout)
    dx = out_like(x._shape, dtype, x._device)
    yd, xd = _desc(y_shape, dtype, layout), _desc(x._shape, dtype, layout)
    L.cudnnPoolingBackward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                           yd, y._ptr, yd, dy._ptr, xd, x._ptr, D.scalar_ptr(0, dtype), xd, dx._ptr)
    return dx
