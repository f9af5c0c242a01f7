"""Layer 2 (ops): 2-D and 3-D pooling through cuDNN and two NVRTC kernels. Imports _lib, runtime and ops.

Modes: "max", "avg" (padding counted in the divisor, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING) and
"avg_exclude_pad". Output size floor((H + 2p - k) / s) + 1, cuDNN's rule. ``layout="NHWC"``: x (N, H, W, C) and
y (N, P, Q, C), given to cuDNN as CUDNN_TENSOR_NHWC descriptors (the pooling descriptor is the same).

Max pooling with window == stride and no padding (the 2x2 stride-2 pool of most CNNs), float32 or float16, windows
of up to MAX_KERNEL_WINDOW taps, runs NVRTC kernels instead (ops._nn_kernels: one thread per window; cuDNN's
pooling kernels cost 4-8 us per call at SimpleCNN's sizes). The forward propagates NaN as cuDNN does with
CUDNN_PROPAGATE_NAN. The backward routes each window's dy to its first maximal x (ops.reference's rule) and gives a
window holding a NaN no gradient (the reference's rule too; what cuDNN does there is not documented). Every other
case goes to cuDNN.

5-D data (N, C, D, H, W), or (N, D, H, W, C) with ``layout`` "NHWC"/"NDHWC", is checked by
ops.reference.pooling.pool3d_params and pooled by cuDNN on N-d descriptors (a 3-entry pooling descriptor; 5-D
tensors, channels last through the NHWC format of cudnnSetTensorNdDescriptorEx).
"""

from __future__ import annotations

import math

from .._lib import cudnn
from ..runtime.stream import current_stream
from . import _check, reference
from . import _nn_kernels as K
from . import descriptors as D
from ._common import dnn, float_dtype, out_like
from ._dispatch import op
from .reference.pooling import CHANNELS_LAST_3D, pool3d_grad_params, pool3d_params

L = cudnn.lib
MAX_POOL_KERNEL = True  # False: cuDNN for every case (the tests compare the two)
MAX_KERNEL_WINDOW = 32  # taps: one thread per window reads them one by one; larger windows (global max) go to cuDNN


def _kernel_case(mode: str, window, stride, padding, dtype, x) -> bool:
    """Max pooling whose windows tile x without overlap or padding, in a dtype and size the kernels take."""
    return (MAX_POOL_KERNEL and window == stride and padding == (0, 0) and mode.lower() == "max"
            and window[0] * window[1] <= MAX_KERNEL_WINDOW and dtype in K.DTYPES and x.size < K.INT_LIMIT)


def _pool_kernel(direction: str, arrays: tuple, x_shape, y_shape, window, dtype, layout) -> None:
    _, c, h, w = _check.to_nchw(x_shape, layout)
    p, q = _check.to_nchw(y_shape, layout)[2:]
    total = math.prod(y_shape)
    K.kernel(K.pool_name(direction, dtype, window, layout)).launch(
        K.pool_grid(total), K.BLOCK, (*arrays, total, c, h, w, p, q, window[0], window[1]),
        stream=current_stream(arrays[0].device))


def _desc(shape, dtype, layout):
    return D.tensor_nhwc(shape, dtype) if layout == "NHWC" else D.tensor(shape, dtype)


@op(reference.pooling_forward, "x")
def pooling_forward(x, mode="max", window=2, stride=None, padding=0, layout="NCHW"):
    """``cudnnPoolingForward``, or the max-pool kernel (window == stride, no padding: see above)."""
    dtype = float_dtype("pooling_forward", x=x)
    if len(x.shape) == 5:
        return _pooling3d_forward(x, dtype, mode, window, stride, padding, layout)
    window, stride, padding, y_shape = _check.pool_params("pooling_forward", x.shape, mode, window, stride,
                                                          padding, layout)
    y = out_like(y_shape, dtype, x.device)
    if _kernel_case(mode, window, stride, padding, dtype, x):
        _pool_kernel("fwd", (x, y), x.shape, y_shape, window, dtype, layout)
        return y
    L.cudnnPoolingForward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                          _desc(x.shape, dtype, layout), x.ptr, D.scalar_ptr(0, dtype),
                          _desc(y_shape, dtype, layout), y.ptr)
    return y


@op(reference.pooling_backward, "y", "dy", "x")
def pooling_backward(y, dy, x, mode="max", window=2, stride=None, padding=0, layout="NCHW"):
    """``cudnnPoolingBackward`` (needs the forward's x and y: max routes dy to the arg-max), or the max-pool
    kernel."""
    dtype = float_dtype("pooling_backward", y=y, dy=dy, x=x)
    if len(x.shape) == 5:
        return _pooling3d_backward(y, dy, x, dtype, mode, window, stride, padding, layout)
    window, stride, padding, y_shape = _check.pool_grad_params("pooling_backward", x.shape, y.shape, dy.shape,
                                                               mode, window, stride, padding, layout)
    dx = out_like(x.shape, dtype, x.device)
    if _kernel_case(mode, window, stride, padding, dtype, x):  # y is not read: the max is recomputed from x
        _pool_kernel("bwd", (x, dy, dx), x.shape, y_shape, window, dtype, layout)
        return dx
    yd, xd = _desc(y_shape, dtype, layout), _desc(x.shape, dtype, layout)
    L.cudnnPoolingBackward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                           yd, y.ptr, yd, dy.ptr, xd, x.ptr, D.scalar_ptr(0, dtype), xd, dx.ptr)
    return dx


def _desc3d(shape, dtype, layout):
    return D.tensor_ndhwc(shape, dtype) if layout in CHANNELS_LAST_3D else D.tensor_nd(shape, dtype)


def _pooling3d_forward(x, dtype, mode, window, stride, padding, layout):
    window, stride, padding, y_shape = pool3d_params("pooling_forward", x.shape, mode, window, stride, padding,
                                                     layout)
    y = out_like(y_shape, dtype, x.device)
    L.cudnnPoolingForward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                          _desc3d(x.shape, dtype, layout), x.ptr, D.scalar_ptr(0, dtype),
                          _desc3d(y_shape, dtype, layout), y.ptr)
    return y


def _pooling3d_backward(y, dy, x, dtype, mode, window, stride, padding, layout):
    window, stride, padding, y_shape = pool3d_grad_params("pooling_backward", x.shape, y.shape, dy.shape, mode,
                                                          window, stride, padding, layout)
    dx = out_like(x.shape, dtype, x.device)
    yd, xd = _desc3d(y_shape, dtype, layout), _desc3d(x.shape, dtype, layout)
    L.cudnnPoolingBackward(dnn(x), D.pooling(mode.lower(), window, padding, stride), D.scalar_ptr(1, dtype),
                           yd, y.ptr, yd, dy.ptr, xd, x.ptr, D.scalar_ptr(0, dtype), xd, dx.ptr)
    return dx
