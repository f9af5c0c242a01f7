"""The numpy twin of every op: the CPU backend and the test oracle.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only (never a GPU module), so it works, and its
tests run, on a machine without CUDA.

Each function has exactly the signature of the GPU op in docs/design.md, takes and returns numpy arrays,
computes in the input dtype (float32 in, float32 out) and validates its arguments through
dnnbind.ops._check first, so a bad call raises the same error on either backend. The in-place helpers
(axpy, scal, fill, copy) mutate their numpy target and also return it.
"""

from .activation import (
    activation_backward,
    activation_forward,
    softmax_backward,
    softmax_forward,
)
from .blas import axpy, copy, fill, gemm, linear_backward, linear_forward, scal
from .conv import (
    add_tensor,
    bias_relu_backward,
    bias_relu_wgrad,
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
)
from .deconv import deconv_backward_data, deconv_backward_filter, deconv_forward
from .dropout import dropout_backward, dropout_forward
from .loss import (
    nll_loss,
    nll_loss_backward,
    softmax_cross_entropy,
    softmax_cross_entropy_backward,
)
from .pooling import pooling_backward, pooling_forward

__all__ = [
    "activation_backward",
    "activation_forward",
    "add_tensor",
    "axpy",
    "bias_relu_backward",
    "bias_relu_wgrad",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "copy",
    "deconv_backward_data",
    "deconv_backward_filter",
    "deconv_forward",
    "dropout_backward",
    "dropout_forward",
    "fill",
    "gemm",
    "linear_backward",
    "linear_forward",
    "nll_loss",
    "nll_loss_backward",
    "pooling_backward",
    "pooling_forward",
    "scal",
    "softmax_backward",
    "softmax_cross_entropy",
    "softmax_cross_entropy_backward",
    "softmax_forward",
]
