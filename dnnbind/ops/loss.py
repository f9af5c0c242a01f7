"""Layer 2 (ops): softmax cross-entropy and NLL from integer labels, on the GPU. Imports runtime and ops.

The log-softmax is ``cudnnSoftmaxForward(CUDNN_SOFTMAX_LOG)``; picking each sample's label entry (and the
one-hot in the gradient) has no cuDNN/cuBLAS call, so two tiny NVRTC kernels do it (ops._kernels). Nothing
is copied to the host: a batch's loss and its gradient stay on the device. Labels may be int32 or int64;
an out-of-range label yields a NaN loss (checked on the host only by the numpy twin, which can see them).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError

import numpy as np

from ..runtime.stream import current_stream
from . import _check, _kernels, reference
from ._common import float_dtype, out_like
from ._dispatch import op
from .pointwise import softmax_forward

_LABELS = (np.dtype(np.int32), np.dtype(np.int64))


def _labels(opname, scores, labels, dloss=None, scores_name="logits"):
    dtype = float_dtype(opname, _check.FLOAT32_64, **{scores_name: scores})
    c = _check.loss_params(opname, scores, labels, dloss, scores_name)
    if labels.dtype not in _LABELS:
        raise DnnbindTypeError(f"{opname}: labels must be int32 or int64 on the GPU, got {labels.dtype}; "
                        "use labels.astype('int32')")
    if dloss is not None and dloss.dtype != dtype:
        raise DnnbindTypeError(f"{opname}: dloss has dtype {dloss.dtype} but {scores_name} has {dtype}")
    return dtype, c


def _launch(name, n_threads, args, device):
    _kernels.kernel(name).launch(_kernels.grid_for(n_threads), 256, args, stream=current_stream(device))


@op(reference.nll_loss, "logp", "labels")
def nll_loss(logp, labels):
    """loss[i] = -logp[i, labels[i]]."""
    dtype, c = _labels("nll_loss", logp, labels, scores_name="logp")
    n = logp.shape[0]
    loss = out_like((n,), dtype, logp.device)
    _launch("nll_fwd_" + _kernels.suffix(dtype, labels.dtype), n, (logp, labels, loss, n, c), logp.device)
    return loss


@op(reference.nll_loss_backward, "logp", "labels", "dloss")
def nll_loss_backward(logp, labels, dloss):
    """dlogp[i, j] = -dloss[i] if j == labels[i] else 0."""
    dtype, c = _labels("nll_loss_backward", logp, labels, dloss, scores_name="logp")
    n = logp.shape[0]
    dlogp = out_like(logp.shape, dtype, logp.device)
    _launch("nll_bwd_" + _kernels.suffix(dtype, labels.dtype), n * c, (labels, dloss, dlogp, n, c),
            logp.device)
    return dlogp


@op(reference.softmax_cross_entropy, "logits", "labels")
def softmax_cross_entropy(logits, labels):
    """loss[i] = logsumexp(logits[i]) - logits[i, labels[i]]: cuDNN log-softmax, then the label gather."""
    dtype, c = _labels("softmax_cross_entropy", logits, labels)
    logp = softmax_forward.impl(logits, "log", "instance")
    n = logits.shape[0]
    loss = out_like((n,), dtype, logits.device)
    _launch("nll_fwd_" + _kernels.suffix(dtype, labels.dtype), n, (logp, labels, loss, n, c), logits.device)
    return loss


@op(reference.softmax_cross_entropy_backward, "logits", "labels", "dloss")
def softmax_cross_entropy_backward(logits, labels, dloss):
    """dlogits = (softmax(logits) - onehot(labels)) * dloss[:, None]: cuDNN softmax, then one kernel."""
    dtype, c = _labels("softmax_cross_entropy_backward", logits, labels, dloss)
    prob = softmax_forward.impl(logits, "accurate", "instance")
    n = logits.shape[0]
    _launch("sce_bwd_" + _kernels.suffix(dtype, labels.dtype), n * c, (prob, labels, dloss, prob, n, c),
            logits.device)
    return prob
