"""Bad arguments raise ValueError/TypeError that name the op and the shapes, before any work is done.

The checks live in dnnbind.ops._check and are shared by both backends; BACKENDS lists the op namespaces this
file runs against (the numpy twin here; a GPU test can parametrize the same cases over dnnbind's ops).
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind.ops import _check
from dnnbind.ops import reference as R

BACKENDS = {"reference": R}
# Only the numpy twin reads label values (a GPU op would have to synchronize to do it).
CPU_ONLY = {"xent label too big", "xent label negative", "xent bwd label range", "nll label range"}


def rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


X = rand((2, 3, 8, 8))
W = rand((5, 3, 3, 3))
DY = rand((2, 5, 6, 6))
P = rand((2, 3, 4, 4))
L = rand((4, 10))
LAB = np.array([1, 0, 9, 3])
WT = rand((3, 2, 3, 3))  # a transposed convolution's weight for X: (in_channels, F/groups, R, S)
DYT = rand((2, 2, 10, 10))  # and its output's shape at stride 1

# (id, op name, call taking the backend module, exception, fragments the message must contain)
CASES = [
    # conv_forward
    ("conv x ndim", "conv_forward", lambda B: B.conv_forward(X[0], W), ValueError, ["x must be 4-D", "(3, 8, 8)"]),
    ("conv w ndim", "conv_forward", lambda B: B.conv_forward(X, W[0]), ValueError, ["w must be 4-D", "(3, 3, 3)"]),
    ("conv channels", "conv_forward", lambda B: B.conv_forward(X, rand((5, 4, 3, 3))), ValueError,
     ["x has 3 channels but w expects 4 (groups=1)", "x (2, 3, 8, 8)", "w (5, 4, 3, 3)"]),
    ("conv groups channels", "conv_forward", lambda B: B.conv_forward(rand((2, 4, 8, 8)), rand((6, 1, 3, 3)),
                                                                       groups=2),
     ValueError, ["x has 4 channels but w expects 2 (groups=2)"]),
    ("conv groups indivisible", "conv_forward", lambda B: B.conv_forward(X, rand((4, 1, 3, 3)), groups=2),
     ValueError, ["not divisible by groups=2", "x (2, 3, 8, 8)"]),
    ("conv K indivisible", "conv_forward", lambda B: B.conv_forward(rand((2, 4, 8, 8)), rand((5, 2, 3, 3)),
                                                                     groups=2),
     ValueError, ["5 output channels, not divisible by groups=2"]),
    ("conv bias length", "conv_forward", lambda B: B.conv_forward(X, W, rand((4,))), ValueError,
     ["b has shape (4,)", "expected b (5,)", "w (5, 3, 3, 3)"]),
    ("conv bias ndim", "conv_forward", lambda B: B.conv_forward(X, W, rand((1, 5))), ValueError,
     ["b has shape (1, 5)"]),
    ("conv kernel too big", "conv_forward", lambda B: B.conv_forward(rand((1, 3, 2, 2)), W), ValueError,
     ["larger than the padded input (2, 2)", "x (1, 3, 2, 2)"]),
    ("conv dilation too big", "conv_forward", lambda B: B.conv_forward(X, W, dilation=4), ValueError,
     ["spans (9, 9)", "x (2, 3, 8, 8)"]),
    ("conv empty batch", "conv_forward", lambda B: B.conv_forward(rand((0, 3, 8, 8)), W), ValueError,
     ["empty dimension", "(0, 3, 8, 8)"]),
    ("conv stride 0", "conv_forward", lambda B: B.conv_forward(X, W, stride=0), ValueError, ["stride must be >= 1"]),
    ("conv stride negative", "conv_forward", lambda B: B.conv_forward(X, W, stride=(1, -1)), ValueError,
     ["stride must be >= 1"]),
    ("conv padding negative", "conv_forward", lambda B: B.conv_forward(X, W, padding=-1), ValueError,
     ["padding must be >= 0"]),
    ("conv dilation 0", "conv_forward", lambda B: B.conv_forward(X, W, dilation=0), ValueError,
     ["dilation must be >= 1"]),
    ("conv stride float", "conv_forward", lambda B: B.conv_forward(X, W, stride=1.5), TypeError,
     ["stride must be an int or an (h, w) pair"]),
    ("conv stride triple", "conv_forward", lambda B: B.conv_forward(X, W, stride=(1, 1, 1)), TypeError,
     ["stride must be an int or an (h, w) pair"]),
    ("conv groups 0", "conv_forward", lambda B: B.conv_forward(X, W, groups=0), ValueError, ["groups must be >= 1"]),
    ("conv groups str", "conv_forward", lambda B: B.conv_forward(X, W, groups="1"), TypeError,
     ["groups must be an int"]),
    ("conv dtype mix", "conv_forward", lambda B: B.conv_forward(X, W.astype(np.float64)), TypeError,
     ["dtypes differ", "x float32", "w float64"]),
    ("conv int dtype", "conv_forward", lambda B: B.conv_forward(X.astype(np.int64), W), TypeError,
     ["x has dtype int64", "float32"]),
    ("conv bias dtype", "conv_forward", lambda B: B.conv_forward(X, W, rand((5,), np.float64)), TypeError,
     ["dtypes differ", "b float64"]),
    # conv backward
    ("bwd data dy shape", "conv_backward_data", lambda B: B.conv_backward_data(W, DY[:, :, 1:], X.shape),
     ValueError, ["dy has shape (2, 5, 5, 6)", "gives (2, 5, 6, 6)", "x (2, 3, 8, 8)", "w (5, 3, 3, 3)"]),
    ("bwd data channels", "conv_backward_data", lambda B: B.conv_backward_data(W, DY, (2, 4, 8, 8)), ValueError,
     ["x has 4 channels but w expects 3"]),
    ("bwd data x_shape int", "conv_backward_data", lambda B: B.conv_backward_data(W, DY, 8), TypeError,
     ["x_shape must be a tuple of ints"]),
    ("bwd data x_shape ndim", "conv_backward_data", lambda B: B.conv_backward_data(W, DY, (2, 3, 8)), ValueError,
     ["x must be 4-D", "(2, 3, 8)"]),
    ("bwd data dtype", "conv_backward_data", lambda B: B.conv_backward_data(W, DY.astype(np.float64), X.shape),
     TypeError, ["dtypes differ"]),
    ("bwd filter dy shape", "conv_backward_filter", lambda B: B.conv_backward_filter(X, DY, W.shape, stride=2),
     ValueError, ["dy has shape (2, 5, 6, 6)", "gives (2, 5, 3, 3)"]),
    ("bwd filter w_shape", "conv_backward_filter", lambda B: B.conv_backward_filter(X, DY, (5, 3, 3)),
     ValueError, ["w must be 4-D", "(5, 3, 3)"]),
    ("bwd filter dy ndim", "conv_backward_filter", lambda B: B.conv_backward_filter(X, DY[0], W.shape),
     ValueError, ["dy must be 4-D", "(5, 6, 6)"]),
    ("bwd bias ndim", "conv_backward_bias", lambda B: B.conv_backward_bias(DY[0]), ValueError,
     ["dy must be 4-D", "(5, 6, 6)"]),
    ("bwd bias dtype", "conv_backward_bias", lambda B: B.conv_backward_bias(DY.astype(np.int32)), TypeError,
     ["dy has dtype int32"]),
    ("bias relu ndim", "bias_relu_backward", lambda B: B.bias_relu_backward(DY[0], DY[0]), ValueError,
     ["dy must be 4-D", "(5, 6, 6)"]),
    ("bias relu shapes", "bias_relu_backward", lambda B: B.bias_relu_backward(DY[:1], DY), ValueError,
     ["shapes differ", "y (1, 5, 6, 6)", "dy (2, 5, 6, 6)"]),
    ("bias relu dtype", "bias_relu_backward", lambda B: B.bias_relu_backward(DY, DY.astype(np.float64)),
     TypeError, ["dtypes differ", "y float32", "dy float64"]),
    ("bias relu int", "bias_relu_backward", lambda B: B.bias_relu_backward(DY.astype(np.int32), DY.astype(np.int32)),
     TypeError, ["y has dtype int32"]),
    ("bias relu layout", "bias_relu_backward", lambda B: B.bias_relu_backward(DY, DY, layout="CHWN"), ValueError,
     ["unknown layout 'CHWN'"]),
    ("wgrad x ndim", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X[0], DY, DY, W.shape), ValueError,
     ["x must be 4-D", "(3, 8, 8)"]),
    ("wgrad w_shape ndim", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY, (5, 3, 3)), ValueError,
     ["w_shape must be 4-D", "(5, 3, 3)"]),
    ("wgrad w_shape int", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY, 5), TypeError,
     ["w_shape must be a tuple of ints"]),
    ("wgrad groups", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY, (5, 1, 3, 3)), ValueError,
     ["x has 3 channels but w_shape (5, 1, 3, 3) has 1", "groups=1", "x (2, 3, 8, 8)"]),
    ("wgrad y shape", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY[:, :, 1:], DY[:, :, 1:], W.shape),
     ValueError, ["y has shape (2, 5, 5, 6) but the convolution gives (2, 5, 6, 6)", "w_shape (5, 3, 3, 3)"]),
    ("wgrad dy shape", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY[:1], W.shape), ValueError,
     ["shapes differ", "y (2, 5, 6, 6)", "dy (1, 5, 6, 6)"]),
    ("wgrad stride", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY, W.shape, stride=0), ValueError,
     ["stride must be >= 1"]),
    ("wgrad taps", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(rand((2, 4, 8, 8)), DY, DY, (5, 4, 3, 3)),
     ValueError, ["w_shape (5, 4, 3, 3) has C*R*S = 4*3*3 = 36 taps; at most 32"]),
    ("wgrad dtype", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY.astype(np.float64), W.shape),
     TypeError, ["dtypes differ", "dy float64"]),
    ("wgrad int", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X.astype(np.int32), DY, DY, W.shape), TypeError,
     ["x has dtype int32"]),
    ("wgrad layout", "bias_relu_wgrad", lambda B: B.bias_relu_wgrad(X, DY, DY, W.shape, layout="NCWH"), ValueError,
     ["unknown layout 'NCWH'"]),
    # transposed convolution
    ("deconv x ndim", "deconv_forward", lambda B: B.deconv_forward(X[0], WT), ValueError,
     ["x must be 4-D", "(3, 8, 8)"]),
    ("deconv channels", "deconv_forward", lambda B: B.deconv_forward(X, rand((4, 2, 3, 3))), ValueError,
     ["x has 3 channels but w expects 4", "x (2, 3, 8, 8)", "w (4, 2, 3, 3)"]),
    ("deconv groups", "deconv_forward", lambda B: B.deconv_forward(X, WT, groups=2), ValueError,
     ["x has 3 channels, not divisible by groups=2"]),
    ("deconv bias length", "deconv_forward", lambda B: B.deconv_forward(X, WT, rand((3,))), ValueError,
     ["b has shape (3,)", "expected b (2,)", "w (3, 2, 3, 3)"]),
    ("deconv adj", "deconv_forward", lambda B: B.deconv_forward(X, WT, stride=2, adj=2), ValueError,
     ["adj (2, 2) must be smaller than stride (2, 2)"]),
    ("deconv adj negative", "deconv_forward", lambda B: B.deconv_forward(X, WT, adj=-1), ValueError,
     ["adj must be >= 0"]),
    ("deconv padding", "deconv_forward", lambda B: B.deconv_forward(X, WT, padding=6), ValueError,
     ["padding (6, 6) removes the whole output", "x (2, 3, 8, 8)"]),
    ("deconv dtype", "deconv_forward", lambda B: B.deconv_forward(X, WT.astype(np.float64)), TypeError,
     ["dtypes differ", "x float32", "w float64"]),
    ("deconv bwd data dy shape", "deconv_backward_data",
     lambda B: B.deconv_backward_data(WT, DYT[:, :, 1:], X.shape), ValueError,
     ["dy has shape (2, 2, 9, 10)", "x (2, 3, 8, 8)", "w (3, 2, 3, 3)"]),
    ("deconv bwd data x_shape int", "deconv_backward_data", lambda B: B.deconv_backward_data(WT, DYT, 8),
     TypeError, ["x_shape must be a tuple of ints"]),
    ("deconv bwd filter dy shape", "deconv_backward_filter",
     lambda B: B.deconv_backward_filter(X, DYT, WT.shape, stride=2), ValueError,
     ["dy has shape (2, 2, 10, 10)", "gives (2, 2) by (17, 17) to (18, 18)"]),
    ("deconv bwd filter w_shape", "deconv_backward_filter", lambda B: B.deconv_backward_filter(X, DYT, (3, 2, 3)),
     ValueError, ["w must be 4-D", "(3, 2, 3)"]),
    # add_tensor
    ("add b length", "add_tensor", lambda B: B.add_tensor(X, rand((4,))), ValueError,
     ["b has shape (4,)", "x (2, 3, 8, 8)"]),
    ("add b shape", "add_tensor", lambda B: B.add_tensor(X, rand((2, 3, 8, 1))), ValueError,
     ["b has shape (2, 3, 8, 1)"]),
    ("add 1-D", "add_tensor", lambda B: B.add_tensor(rand((5,)), rand((1,))), ValueError,
     ["b has shape (1,); expected x's shape: x (5,)"]),
    ("add dtype", "add_tensor", lambda B: B.add_tensor(X, rand((3,), np.float64)), TypeError, ["dtypes differ"]),
    # activation
    ("act mode", "activation_forward", lambda B: B.activation_forward(X, "relu6"), ValueError,
     ["unknown activation mode 'relu6'", "relu, sigmoid"]),
    ("act mode type", "activation_forward", lambda B: B.activation_forward(X, 3), TypeError,
     ["activation mode must be a string"]),
    ("act clipped coef", "activation_forward", lambda B: B.activation_forward(X, "clipped_relu"), ValueError,
     ["clipped_relu needs coef > 0"]),
    ("act coef type", "activation_forward", lambda B: B.activation_forward(X, "elu", "1"), TypeError,
     ["coef must be a real number"]),
    ("act coef nan", "activation_forward", lambda B: B.activation_forward(X, "elu", float("nan")), ValueError,
     ["coef must be finite"]),
    ("act int dtype", "activation_forward", lambda B: B.activation_forward(X.astype(np.int8)), TypeError,
     ["x has dtype int8"]),
    ("act bwd shapes", "activation_backward", lambda B: B.activation_backward(X, X[:1], X), ValueError,
     ["shapes differ", "dy (1, 3, 8, 8)", "x (2, 3, 8, 8)"]),
    ("act bwd mode", "activation_backward", lambda B: B.activation_backward(X, X, X, "gelu"), ValueError,
     ["unknown activation mode 'gelu'"]),
    ("act bwd dtype", "activation_backward", lambda B: B.activation_backward(X, X.astype(np.float64), X),
     TypeError, ["dtypes differ", "dy float64"]),
    # pooling
    ("pool x ndim", "pooling_forward", lambda B: B.pooling_forward(X[0]), ValueError, ["x must be 4-D", "(3, 8, 8)"]),
    ("pool window too big", "pooling_forward", lambda B: B.pooling_forward(X, window=9), ValueError,
     ["window (9, 9) is larger than the padded input (8, 8)", "x (2, 3, 8, 8)"]),
    ("pool window too big padded", "pooling_forward", lambda B: B.pooling_forward(X, window=(3, 11), padding=1),
     ValueError, ["window (3, 11) is larger than the padded input (10, 10)"]),
    ("pool padding >= window", "pooling_forward", lambda B: B.pooling_forward(X, window=2, padding=2), ValueError,
     ["padding (2, 2) must be smaller than window (2, 2)"]),
    ("pool mode", "pooling_forward", lambda B: B.pooling_forward(X, "min"), ValueError,
     ["unknown pooling mode 'min'", "max, avg, avg_exclude_pad"]),
    ("pool mode type", "pooling_forward", lambda B: B.pooling_forward(X, None), TypeError,
     ["pooling mode must be a string"]),
    ("pool stride 0", "pooling_forward", lambda B: B.pooling_forward(X, stride=0), ValueError,
     ["stride must be >= 1"]),
    ("pool window 0", "pooling_forward", lambda B: B.pooling_forward(X, window=(2, 0)), ValueError,
     ["window must be >= 1"]),
    ("pool window triple", "pooling_forward", lambda B: B.pooling_forward(X, window=(2, 2, 2)), TypeError,
     ["window must be an int or an (h, w) pair"]),
    ("pool bwd dy shape", "pooling_backward", lambda B: B.pooling_backward(P, rand((2, 3, 4, 3)), X), ValueError,
     ["dy has shape (2, 3, 4, 3)", "gives (2, 3, 4, 4)", "x (2, 3, 8, 8)"]),
    ("pool bwd y shape", "pooling_backward", lambda B: B.pooling_backward(X, P, X), ValueError,
     ["y has shape (2, 3, 8, 8)"]),
    ("pool bwd dtype", "pooling_backward", lambda B: B.pooling_backward(P, P, X.astype(np.float64)), TypeError,
     ["dtypes differ"]),
    # softmax
    ("softmax algorithm", "softmax_forward", lambda B: B.softmax_forward(X, "fast"), ValueError,
     ["unknown softmax algorithm 'fast'", "accurate, log"]),
    ("softmax mode", "softmax_forward", lambda B: B.softmax_forward(X, mode="spatial"), ValueError,
     ["unknown softmax mode 'spatial'", "instance, channel"]),
    ("softmax ndim 3", "softmax_forward", lambda B: B.softmax_forward(X[0]), ValueError,
     ["x must be (N, C) or (N, C, H, W)", "(3, 8, 8)"]),
    ("softmax ndim 1", "softmax_forward", lambda B: B.softmax_forward(L[0]), ValueError, ["(10,)"]),
    ("softmax int", "softmax_forward", lambda B: B.softmax_forward(LAB.reshape(2, 2)), TypeError,
     ["x has dtype int64"]),
    ("softmax bwd shapes", "softmax_backward", lambda B: B.softmax_backward(L, L[:2]), ValueError,
     ["shapes differ", "y (4, 10)", "dy (2, 10)"]),
    # gemm
    ("gemm inner", "gemm", lambda B: B.gemm(rand((3, 4)), rand((5, 6))), ValueError,
     ["inner dimensions differ", "a (3, 4)", "b (5, 6)"]),
    ("gemm inner trans", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), trans_a=True), ValueError,
     ["op(a) is (4, 3)", "trans_a=True"]),
    ("gemm trans_b", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), trans_b=True), ValueError,
     ["op(b) is (6, 4)"]),
    ("gemm c shape", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), rand((6, 3)), beta=1.0), ValueError,
     ["c has shape (6, 3); expected (3, 6)"]),
    ("gemm beta without c", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), beta=1.0), ValueError,
     ["beta=1.0 needs c"]),
    ("gemm 1-D", "gemm", lambda B: B.gemm(rand((4,)), rand((4, 6))), ValueError, ["a must be 2-D", "(4,)"]),
    ("gemm trans type", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), trans_a="N"), TypeError,
     ["trans_a must be a bool"]),
    ("gemm alpha type", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6)), alpha="2"), TypeError,
     ["alpha must be a real number"]),
    ("gemm dtype", "gemm", lambda B: B.gemm(rand((3, 4)), rand((4, 6), np.float64)), TypeError,
     ["dtypes differ", "a float32", "b float64"]),
    # linear
    ("linear features", "linear_forward", lambda B: B.linear_forward(L, rand((3, 9))), ValueError,
     ["x has 10 features but w expects 9", "x (4, 10)", "w (3, 9)"]),
    ("linear bias", "linear_forward", lambda B: B.linear_forward(L, rand((3, 10)), rand((4,))), ValueError,
     ["b has shape (4,); expected (3,)"]),
    ("linear x ndim", "linear_forward", lambda B: B.linear_forward(X, rand((3, 10))), ValueError,
     ["x must be 2-D", "(2, 3, 8, 8)"]),
    ("linear dtype", "linear_forward", lambda B: B.linear_forward(L, rand((3, 10), np.float64)), TypeError,
     ["dtypes differ"]),
    ("linear bwd dy", "linear_backward", lambda B: B.linear_backward(L, rand((3, 10)), rand((4, 4))), ValueError,
     ["dy has shape (4, 4); expected (4, 3)"]),
    # losses
    ("xent float labels", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(L, LAB.astype(np.float32)),
     TypeError, ["labels must have an integer dtype", "float32"]),
    ("xent bool labels", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(L, LAB > 2), TypeError,
     ["labels must have an integer dtype"]),
    ("xent label too big", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(L, np.array([1, 10, 2, 3])),
     ValueError, ["labels must be in [0, 10)", "labels[1] = 10"]),
    ("xent label negative", "softmax_cross_entropy",
     lambda B: B.softmax_cross_entropy(L, np.array([1, 2, 3, -1])), ValueError, ["labels[3] = -1"]),
    ("xent labels shape", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(L, LAB[:3]), ValueError,
     ["labels must be (4,)", "logits (4, 10)", "labels (3,)"]),
    ("xent logits ndim", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(L[0], LAB), ValueError,
     ["logits must be 2-D", "(10,)"]),
    ("xent logits int", "softmax_cross_entropy", lambda B: B.softmax_cross_entropy(LAB.reshape(2, 2), LAB[:2]),
     TypeError, ["logits has dtype int64"]),
    ("xent bwd dloss", "softmax_cross_entropy_backward",
     lambda B: B.softmax_cross_entropy_backward(L, LAB, rand((4, 1))), ValueError,
     ["dloss must be (4,)", "dloss (4, 1)"]),
    ("xent bwd dloss dtype", "softmax_cross_entropy_backward",
     lambda B: B.softmax_cross_entropy_backward(L, LAB, rand((4,), np.float64)), TypeError, ["dtypes differ"]),
    ("xent bwd label range", "softmax_cross_entropy_backward",
     lambda B: B.softmax_cross_entropy_backward(L, LAB + 1, rand((4,))), ValueError, ["labels[2] = 10"]),
    ("nll float labels", "nll_loss", lambda B: B.nll_loss(L, LAB.astype(np.float64)), TypeError,
     ["labels must have an integer dtype"]),
    ("nll label range", "nll_loss", lambda B: B.nll_loss(L[:, :5], LAB), ValueError,
     ["labels must be in [0, 5)", "labels[2] = 9"]),
    ("nll logp ndim", "nll_loss", lambda B: B.nll_loss(X, LAB), ValueError, ["logp must be 2-D"]),
    ("nll bwd dloss", "nll_loss_backward", lambda B: B.nll_loss_backward(L, LAB, rand((3,))), ValueError,
     ["dloss must be (4,)"]),
    # dropout
    ("dropout p", "dropout_forward", lambda B: B.dropout_forward(X, 1.0), ValueError, ["p must be in [0, 1)", "1.0"]),
    ("dropout p type", "dropout_forward", lambda B: B.dropout_forward(X, "0.5"), TypeError, ["p must be a real"]),
    ("dropout int", "dropout_forward", lambda B: B.dropout_forward(np.arange(6), 0.5), TypeError,
     ["x has dtype int64"]),
    ("dropout seed", "dropout_forward", lambda B: B.dropout_forward(X, 0.5, seed="1"), TypeError,
     ["seed must be an int"]),
    ("dropout bwd p", "dropout_backward", lambda B: B.dropout_backward(X, X, -0.1), ValueError,
     ["p must be in [0, 1)"]),
    ("dropout bwd int", "dropout_backward", lambda B: B.dropout_backward(np.arange(6), X, 0.5), TypeError,
     ["dy has dtype int64"]),
    # in-place helpers
    ("axpy shapes", "axpy", lambda B: B.axpy(1.0, rand((3,)), rand((4,))), ValueError,
     ["shapes differ", "x (3,)", "y (4,)"]),
    ("axpy dtypes", "axpy", lambda B: B.axpy(1.0, rand((3,)), rand((3,), np.float64)), TypeError, ["dtypes differ"]),
    ("axpy alpha", "axpy", lambda B: B.axpy("1", rand((3,)), rand((3,))), TypeError, ["alpha must be a real number"]),
    ("axpy target list", "axpy", lambda B: B.axpy(1.0, rand((3,)), [0.0, 0.0, 0.0]), TypeError,
     ["y is updated in place"]),
    ("scal alpha", "scal", lambda B: B.scal(None, rand((3,))), TypeError, ["alpha must be a real number"]),
    ("scal int", "scal", lambda B: B.scal(2.0, np.arange(3)), TypeError, ["x has dtype int64"]),
    ("fill value", "fill", lambda B: B.fill(rand((3,)), "0"), TypeError, ["value must be a real number"]),
    ("copy shapes", "copy", lambda B: B.copy(rand((2, 3)), rand((3, 2))), ValueError,
     ["shapes differ", "src (2, 3)", "dst (3, 2)"]),
    ("copy dtypes", "copy", lambda B: B.copy(rand((3,), np.float64), rand((3,))), TypeError,
     ["dtypes differ", "src float64", "dst float32"]),
]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    return BACKENDS[request.param]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_op_and_shapes(backend, case):
    name, op, call, exc, fragments = case
    if name in CPU_ONLY and backend is not R:
        pytest.skip("label values are checked on the CPU only")
    with pytest.raises(exc) as info:
        call(backend)
    # A bad argument is MXNet's MXNetError and Python's ValueError or TypeError at once, never both of those.
    other = TypeError if exc is ValueError else ValueError
    assert isinstance(info.value, dnnbind.DnnbindError) and not isinstance(info.value, other), \
        f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert msg.startswith(f"{op}: "), f"message does not start with the op name {op!r}: {msg}"
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in message: {msg}"


def test_every_public_op_has_an_error_case():
    covered = {c[1] for c in CASES}
    missing = set(R.__all__) - covered
    assert not missing, f"no error case for {sorted(missing)}"
    assert CPU_ONLY <= {c[0] for c in CASES}, CPU_ONLY - {c[0] for c in CASES}


def test_bad_input_leaves_inplace_target_untouched():
    y = rand((3,))
    before = y.copy()
    with pytest.raises(TypeError):
        R.axpy(1.0, rand((3,), np.float64), y)
    assert np.array_equal(y, before)


# -- the shared checks' normalized results ---------------------------------------------------------------

def test_conv_params_normalizes():
    stride, padding, dilation, groups, y_shape = _check.conv_params(
        "conv_forward", (2, 4, 9, 8), (6, 2, 3, 3), (6,), (2, 1), 1, [1, 2], 2)
    assert (stride, padding, dilation, groups) == ((2, 1), (1, 1), (1, 2), 2)
    # floor((H + 2p - d*(R-1) - 1)/s) + 1
    assert y_shape == (2, 6, (9 + 2 - 2 - 1) // 2 + 1, (8 + 2 - 4 - 1) // 1 + 1)
    assert _check.conv_params("conv_forward", (1, 1, 5, 5), (1, 1, 3, 3), None, np.int64(2))[0] == (2, 2)


def test_pool_params_normalizes():
    window, stride, padding, y_shape = _check.pool_params("pooling_forward", (2, 3, 7, 6), "avg", 3, None, 1)
    assert (window, stride, padding) == ((3, 3), (3, 3), (1, 1))
    # floor((H + 2p - k)/s) + 1
    assert y_shape == (2, 3, (7 + 2 - 3) // 3 + 1, (6 + 2 - 3) // 3 + 1)


def test_small_checks():
    assert _check.activation_mode("activation_forward", "ReLU") == ("relu", 0.0)
    assert _check.softmax_params("softmax_forward", (2, 3), "LOG", "Channel") == ("log", "channel")
    assert _check.gemm_params("gemm", (4, 3), (5, 4), (3, 5), True, True) == (3, 5, 4)
    assert _check.add_tensor_params("add_tensor", (2, 3, 4, 4), (3,)) == (1, 3, 1, 1)
    assert _check.add_tensor_params("add_tensor", (2, 3), (2, 3)) == (2, 3)
    assert _check.check_dtype("x", _check.FLOAT_DTYPES, a=np.zeros(2), b=None) == np.float64
    with pytest.raises(TypeError, match="stride must be an int"):
        _check.as_tuple(True, 2, "conv_forward", "stride", 1)
    assert _check.as_tuple(3) == (3, 3) and _check.as_tuple([1, np.int64(2)], 2) == (1, 2)
    assert _check.as_tuple((1, 2, 3), 3, "op", "axes", 0) == (1, 2, 3)
    with pytest.raises(TypeError, match="op: axes must be an int or a tuple of 3 ints"):
        _check.as_tuple((1, 2), 3, "op", "axes")
    with pytest.raises(ValueError, match="Conv2D: padding must be >= 0"):
        _check.as_tuple((1, -1), 2, "Conv2D", "padding", 0)
