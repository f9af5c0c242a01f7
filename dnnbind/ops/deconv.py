"""Layer 2 (ops): transposed convolution (MXNet's Deconvolution) on the convolution machinery. Imports _lib,
runtime and ops.

y = deconv(x, w) is the adjoint in its input of the convolution from F to C channels whose filter is w
(C, F/groups, R, S): cuDNN's filter layout (K, C/groups, R, S) with K = C. So, with that convolution's
descriptors, its forward IS ``cudnnConvolutionBackwardData`` (x in the role of dy, y in the role of dx), its
data gradient is ``cudnnConvolutionForward`` of dy, and its weight gradient ``cudnnConvolutionBackwardFilter``
with x and dy exchanged. Each direction calls ops.conv's implementation, so descriptors, the per-shape
algorithm choice (legacy call or backend plan), workspaces, groups and dilation are conv's own. ``adj``
(MXNet's output padding) only enlarges the output: the convolution of a (H_out + adj)-high input with the same
stride still gives H rows as long as adj < stride.
"""

from __future__ import annotations

from .._lib import cudnn
from .._lib.errors import CudnnError
from . import _check, reference
from . import descriptors as D
from ._common import dnn, float_dtype, with_context
from ._dispatch import op
from .conv import conv_backward_data, conv_backward_filter, conv_forward
from .reference.deconv import deconv3d_grad_params, deconv3d_params

L = cudnn.lib


@op(reference.deconv_forward, "x", "w", "b")
def deconv_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, adj=0):
    """y = conv_transpose(x, w) + b: ``cudnnConvolutionBackwardData`` (+ ``cudnnAddTensor`` for the bias).
    x (N, C, H, W), w (C, F/groups, R, S), b (F,); y (N, F, (H-1)*sh - 2*ph + dh*(R-1) + 1 + adj_h, ...)."""
    dtype = float_dtype("deconv_forward", x=x, w=w, b=b)
    check = deconv3d_params if len(x.shape) == 5 else _check.deconv_params
    stride, padding, dilation, groups, _, y_shape = check(
        "deconv_forward", x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups,
        adj)
    # The convolution being transposed maps y's shape to x's: conv's backward data with dy = x, dx = y.
    y = conv_backward_data.impl(w, x, y_shape, stride, padding, dilation, groups)
    if b is not None:
        one = D.scalar_ptr(1, dtype)
        try:
            # NOTE: D.tensor folds a 5-D y into (N, F, O*P*Q, 1); the per-channel bias adds the same way
            L.cudnnAddTensor(dnn(y), one, D.tensor((1, y_shape[1], 1, 1), dtype), b.ptr, one,
                             D.tensor(y_shape, dtype), y.ptr)
        except CudnnError as exc:
            raise with_context(exc, op="deconv_forward", y=y_shape, b=b.shape) from None
    return y


@op(reference.deconv_backward_data, "w", "dy")
def deconv_backward_data(w, dy, x_shape, stride=1, padding=0, dilation=1, groups=1):
    """dx = conv(dy, w): ``cudnnConvolutionForward`` (dy (N, F, P, Q) as its input, w as its filter)."""
    float_dtype("deconv_backward_data", w=w, dy=dy)
    x_shape = _check.check_shape_arg("deconv_backward_data", "x_shape", x_shape)
    check = deconv3d_grad_params if len(x_shape) == 5 else _check.deconv_grad_params
    stride, padding, dilation, groups, _, _ = check(
        "deconv_backward_data", x_shape, w.shape, dy.shape, stride, padding, dilation, groups)
    return conv_forward.impl(dy, w, None, stride, padding, dilation, groups)


@op(reference.deconv_backward_filter, "x", "dy")
def deconv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, out=None):
    """dw: ``cudnnConvolutionBackwardFilter`` with dy as the convolution's input and x as its output gradient
    (into ``out`` if given, GPU only)."""
    float_dtype("deconv_backward_filter", x=x, dy=dy)
    w_shape = _check.check_shape_arg("deconv_backward_filter", "w_shape", w_shape)
    check = deconv3d_grad_params if len(x.shape) == 5 else _check.deconv_grad_params
    stride, padding, dilation, groups, _, _ = check(
        "deconv_backward_filter", x.shape, w_shape, dy.shape, stride, padding, dilation, groups)
    return conv_backward_filter.impl(dy, x, w_shape, stride, padding, dilation, groups, out=out)
