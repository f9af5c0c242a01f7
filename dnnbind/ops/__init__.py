"""Layer 2 (ops): functional ops, arrays in and arrays out. Imports _lib, runtime, kernels and itself.

Each op validates its arguments (ops._check) before any library call, then runs on the arrays' device:
cuDNN/cuBLAS on a GPU, the numpy twin (ops.reference) on the cpu. See docs/design.md for the signatures.
"""

from . import reference
from .algos import set_conv_algo_policy
from .batchnorm import set_batchnorm_mode
from .batchnorm_fused import (batchnorm_add_relu_backward, batchnorm_add_relu_forward_training,
                              batchnorm_nhwc_backward, batchnorm_nhwc_forward_training)
from .arith import adam_update, sgd_update
from .bias_relu import bias_relu_backward, bias_relu_wgrad
from .blas import axpy, copy, fill, gemm, linear_backward, linear_forward, scal
from .conv import (conv_backward_bias, conv_backward_data, conv_backward_filter, conv_bias_relu_forward,
                   conv_forward)
from .deconv import deconv_backward_data, deconv_backward_filter, deconv_forward
from .dropout import dropout_backward, dropout_forward
from .loss import nll_loss, nll_loss_backward, softmax_cross_entropy, softmax_cross_entropy_backward
from .pointwise import activation_backward, activation_forward, add_tensor, softmax_backward, softmax_forward
from .pooling import pooling_backward, pooling_forward
from ._common import stream_workspaces  # noqa: F401  (for graph.RecordedStep; not an op, so not in __all__)

__all__ = ["reference", "set_conv_algo_policy", "set_batchnorm_mode", "batchnorm_add_relu_backward",
           "batchnorm_add_relu_forward_training", "batchnorm_nhwc_backward", "batchnorm_nhwc_forward_training",
           "adam_update", "sgd_update", "axpy", "bias_relu_backward", "bias_relu_wgrad",
           "copy", "fill", "gemm", "linear_backward",
           "linear_forward", "scal", "conv_backward_bias", "conv_backward_data", "conv_backward_filter",
           "conv_forward", "conv_bias_relu_forward", "deconv_backward_data",
           "deconv_backward_filter", "deconv_forward", "dropout_backward", "dropout_forward", "nll_loss",
           "nll_loss_backward", "softmax_cross_entropy",
           "softmax_cross_entropy_backward", "activation_backward", "activation_forward", "add_tensor",
           "softmax_backward", "softmax_forward", "pooling_backward", "pooling_forward"]
