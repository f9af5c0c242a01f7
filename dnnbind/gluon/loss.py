"""Losses (``mxnet.gluon.loss``). Layer: gluon; imports nd, runtime, gluon.block.

Every loss returns one value per sample, shape (N,), as MXNet does. ``loss.backward()`` then seeds ones
(the sum over the batch) and ``Trainer.step(batch_size)`` divides by the batch size: the seed's loop.

Reductions over a row (dense labels, L2) are a FullyConnected against a constant (1, C) weight, so they are
one recorded cuBLAS call on the GPU with a backward for free, instead of a host round trip.
"""

from __future__ import annotations

import numpy as np

from .. import nd
from ..runtime.array import NDArray, array, full
from .block import Block

__all__ = ["L2Loss", "Loss", "NLLLoss", "SoftmaxCELoss", "SoftmaxCrossEntropyLoss"]

_row_weights: dict = {}


def _row_reduce(x: NDArray, scale: float) -> NDArray:
    """(N, ...) -> (N,): scale * the sum of each row, recorded."""
    n = x.shape[0]
    x2 = x.reshape((n, -1))
    cols = x2.shape[1]
    if cols == 1 and scale == 1.0:
        return x2.reshape((n,))
    key = (cols, scale, x.device, x.dtype)
    w = _row_weights.get(key)
    if w is None:
        w = _row_weights[key] = full((1, cols), scale, x.dtype, x.device)
    return nd.FullyConnected(x2, w, None, num_hidden=1, no_bias=True).reshape((n,))


def _as_labels(label, n: int, device) -> NDArray:
    """Class ids as an (N,) int32 NDArray on ``device``; (N, 1) labels are flattened."""
    if not isinstance(label, NDArray):
        host = np.asarray(label)
        return array(host.reshape(n).astype(np.int32, copy=False), device=device)
    if label.shape != (n,):
        if label.size != n:
            raise ValueError(f"loss: expected {n} class labels (shape ({n},) or ({n}, 1)), got shape {label.shape}")
        label = label.reshape((n,))
    if label.device is not device:
        label = label.as_in_context(device)
    if label.dtype.kind not in "iu":
        # NOTE: float labels (e.g. from a float32 dataset) go through the host once: the gather kernels
        # read integer ids. Give int32 labels to keep the step on the device.
        label = label.astype(np.int32)
    return label


class Loss(Block):
    """Base class: ``weight`` scales the loss, ``batch_axis`` must be 0 (per-sample output)."""

    def __init__(self, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        if batch_axis != 0:
            raise ValueError(f"{type(self).__name__}: only batch_axis=0 is supported, got {batch_axis}")
        self._weight, self._batch_axis = weight, batch_axis

    def _weighting(self, loss: NDArray, sample_weight=None) -> NDArray:
        if sample_weight is not None:
            if not isinstance(sample_weight, NDArray):
                sample_weight = array(np.broadcast_to(np.asarray(sample_weight, dtype=loss.dtype), loss.shape),
                                      device=loss.device)
            loss = loss * sample_weight.reshape(loss.shape)
        if self._weight is not None:
            loss = loss * float(self._weight)
        return loss

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"


class SoftmaxCrossEntropyLoss(Loss):
    """-log softmax(pred)[label] per sample (cuDNN log-softmax + a gather kernel).

    ``sparse_label=True``: labels are class ids (N,) or (N, 1). ``sparse_label=False``: labels are
    distributions (N, C) and the loss is -sum(label * log_softmax(pred)). ``from_logits=True``: ``pred`` is
    already log-probabilities (the loss is the NLL).
    """

    def __init__(self, axis: int = -1, sparse_label: bool = True, from_logits: bool = False, weight=None,
                 batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._axis, self._sparse_label, self._from_logits = axis, sparse_label, from_logits

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        if pred.ndim != 2 or self._axis not in (-1, 1):
            raise ValueError(f"{type(self).__name__}: expects pred of shape (N, C) with axis=-1 or 1, got "
                             f"shape {pred.shape} and axis={self._axis}")
        if self._sparse_label:
            labels = _as_labels(label, pred.shape[0], pred.device)
            loss = nd.pick_nll(pred, labels) if self._from_logits else nd.softmax_cross_entropy(pred, labels)
        else:
            if not isinstance(label, NDArray):
                label = array(np.asarray(label, dtype=pred.dtype), device=pred.device)
            if label.shape != pred.shape:
                raise ValueError(f"{type(self).__name__}(sparse_label=False): label shape {label.shape} must equal "
                                 f"pred shape {pred.shape}")
            logp = pred if self._from_logits else nd.log_softmax(pred, axis=-1)
            loss = _row_reduce(logp * label, -1.0)
        return self._weighting(loss, sample_weight)


SoftmaxCELoss = SoftmaxCrossEntropyLoss


class NLLLoss(SoftmaxCrossEntropyLoss):
    """-pred[label] per sample for log-probabilities ``pred`` (e.g. after ``nd.log_softmax``)."""

    def __init__(self, axis: int = -1, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(axis, True, True, weight, batch_axis, prefix=prefix, params=params)


class L2Loss(Loss):
    """0.5 * (pred - label)^2, averaged over all but the batch axis: shape (N,)."""

    def __init__(self, weight=1.0, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        if not isinstance(label, NDArray):
            label = array(np.asarray(label, dtype=pred.dtype), device=pred.device)
        if label.size != pred.size:
            raise ValueError(f"L2Loss: label shape {label.shape} does not match pred shape {pred.shape}")
        diff = pred - label.reshape(pred.shape)
        per_row = int(np.prod(pred.shape[1:], dtype=np.int64)) if pred.ndim > 1 else 1
        loss = _row_reduce(diff * diff, 0.5 / per_row)
        return self._weighting(loss, sample_weight)
