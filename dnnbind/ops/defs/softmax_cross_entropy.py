"""MXNet's ``softmax_cross_entropy(data, label)``: the cross entropy of softmax(data) against class ids, summed over
the batch into one value of shape (1,). ``data`` is (N, C), ``label`` (N,) holds class ids as floats (MXNet casts
them to int, truncating). The gradient is (softmax(data) - onehot(label)) times the head gradient; the label gets
none. On a GPU the per-sample loss and its gradient come from ops/loss.py's kernels (cuDNN's log-softmax and a
gather), summed by the table's ``sum``; the cpu twin is ops/reference/loss.py.

(Gluon's SoftmaxCrossEntropyLoss wants the per-sample values: it calls ``nd.softmax_ce_per_sample``, dnnbind's
helper in nd/_helpers.py, not this operator.)
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import loss as _loss
from .. import reference
from ..opdef import Lowering, OpDef, define, table


def _prepare(p, data, label):
    op = "softmax_cross_entropy"
    if data.ndim != 2:
        raise DnnbindValueError(f"{op}: data must be 2-D (batch, classes), got shape {data.shape} (MXNet: "
                                "SoftmaxCrossEntropy only accept 2D data)")
    if label.ndim != 1:
        raise DnnbindValueError(f"{op}: label must be 1-D (one class id per row), got shape {label.shape}")
    if label.shape[0] != data.shape[0]:
        raise DnnbindValueError(f"{op}: data {data.shape} and label {label.shape} disagree on the batch size")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    return data.shape[0]


def _infer(p, shapes):
    return [shapes[0], (shapes[0][0],)], [(1,)]


def _cpu_forward(c, x, label):
    ids = label.astype(np.int64)
    return reference.softmax_cross_entropy(x, ids).sum(keepdims=True).astype(x.dtype), (x, ids)


def _cpu_backward(c, saved, grads, dy):
    x, ids = saved
    dl = np.broadcast_to(dy.astype(x.dtype), (x.shape[0],))
    return reference.softmax_cross_entropy_backward(x, ids, np.ascontiguousarray(dl)), None


def _gpu_forward(c, x, label):
    ids = table("cast", label, dtype="int32")
    return table("sum", _loss.softmax_cross_entropy.gpu(x, ids), keepdims=False), (x, ids)


def _gpu_backward(c, saved, grads, dy):
    x, ids = saved
    dl = table("broadcast_to", dy, shape=(x.shape[0],))
    return _loss.softmax_cross_entropy_backward.gpu(x, ids, dl), None


def _samples(rng):
    yield {"data": rng.standard_normal((4, 5)), "label": np.array([0.0, 1.0, 4.0, 2.0])}, {}
    yield {"data": rng.standard_normal((1, 3)), "label": np.array([2.0])}, {}


define(OpDef("softmax_cross_entropy", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             nograd=("label",),
             doc="MXNet's softmax_cross_entropy: the batch's summed cross entropy of softmax(data) against the "
                 "class ids in label, shape (1,)."))
