"""Losses (``mxnet.gluon.loss``). Layer: gluon; imports nd, runtime, gluon.block.

MXNet 1.x semantics (python/mxnet/gluon/loss.py at v1.9.x is the specification): the element-wise loss is
scaled by ``sample_weight`` (broadcast against it) and the scalar ``weight``, then averaged (KLDivLoss: summed)
over every axis but ``batch_axis``, so every loss returns one value per sample. ``loss.backward()`` then seeds
ones (the sum over the batch) and ``Trainer.step(batch_size)`` divides by the batch size: the seed's loop.

All math is composed of nd ops, so every loss has a gradient and runs on the arrays' device. The common
classification case (sparse labels, 2-D logits, class axis last) keeps a fused path: cuDNN's log-softmax and a
gather kernel in one recorded op.

The base class and input helpers live in _loss_base.py; TripletLoss, PoissonNLLLoss, CosineEmbeddingLoss and
CTCLoss in _loss_extra.py (MXNet's own output shapes there: PoissonNLLLoss (1,), CosineEmbeddingLoss (N, 1)).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

from .. import nd
from ..runtime.array import NDArray
from ._loss_base import Loss, apply_weighting, as_labels, as_nd, label_like, integer, number, reshape_like
from ._loss_extra import CosineEmbeddingLoss, CTCLoss, PoissonNLLLoss, TripletLoss

# MXNet's private names for these helpers: GluonCV's losses import them from mxnet.gluon.loss by these names.
_apply_weighting = apply_weighting
_reshape_like = reshape_like

__all__ = ["CTCLoss", "CosineEmbeddingLoss", "HingeLoss", "HuberLoss", "KLDivLoss", "L1Loss", "L2Loss",
           "LogisticLoss", "Loss", "NLLLoss", "PoissonNLLLoss", "SigmoidBCELoss", "SigmoidBinaryCrossEntropyLoss",
           "SoftmaxCELoss", "SoftmaxCrossEntropyLoss", "SquaredHingeLoss", "TripletLoss"]


class L2Loss(Loss):
    """(weight / 2) * (pred - label)^2, averaged over all but the batch axis."""

    def __init__(self, weight=1.0, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        label = label_like(label, pred, "L2Loss")
        loss = nd.square(label - pred)
        half = None if self._weight is None else self._weight / 2
        loss = self._weighting(loss, sample_weight, half)
        return self._per_sample(loss)


class L1Loss(Loss):
    """|pred - label|, averaged over all but the batch axis."""

    def __init__(self, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        label = label_like(label, pred, "L1Loss")
        return self._per_sample(self._weighting(nd.abs(label - pred), sample_weight))


class SigmoidBinaryCrossEntropyLoss(Loss):
    """Binary cross-entropy on logits (``from_sigmoid=False``, the stable max(x,0) - x*z + log(1 + exp(-|x|))
    form) or on probabilities; ``pos_weight`` (broadcast to pred) weighs the positive term."""

    def __init__(self, from_sigmoid: bool = False, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._from_sigmoid = from_sigmoid

    def forward(self, pred: NDArray, label, sample_weight=None, pos_weight=None) -> NDArray:
        label = label_like(label, pred, type(self).__name__)
        if pos_weight is not None:
            pos_weight = as_nd(pos_weight, pred, "pos_weight", pred.dtype)
        if not self._from_sigmoid:
            soft = nd.softrelu(-nd.abs(pred))
            if pos_weight is None:
                loss = nd.relu(pred) - pred * label + soft
            else:
                log_weight = (pos_weight - 1.0) * label + 1.0
                loss = pred - pred * label + log_weight * (soft + nd.relu(-pred))
        else:
            eps = 1e-12
            pos = nd.log(pred + eps) * label
            if pos_weight is not None:
                pos = pos * pos_weight
            loss = -(pos + nd.log(1.0 - pred + eps) * (1.0 - label))
        return self._per_sample(self._weighting(loss, sample_weight))


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


class SoftmaxCrossEntropyLoss(Loss):
    """-log softmax(pred)[label] per sample.

    ``sparse_label=True``: labels are class ids (pred's shape without ``axis``, or with it as 1).
    ``sparse_label=False``: labels are distributions of pred's shape and the loss is -sum(label * log_softmax).
    ``from_logits=True``: ``pred`` is already log-probabilities. The result is averaged over all remaining
    axes but the batch axis. 2-D pred with sparse labels over the last axis takes the fused path.
    """

    def __init__(self, axis: int = -1, sparse_label: bool = True, from_logits: bool = False, weight=None,
                 batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._axis = integer(type(self).__name__, "axis", axis)
        self._sparse_label, self._from_logits = sparse_label, from_logits

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        name = type(self).__name__
        if not isinstance(pred, NDArray):
            raise DnnbindTypeError(f"{name}: pred must be an NDArray, got {type(pred).__name__}")
        if not -pred.ndim <= self._axis < pred.ndim:
            raise DnnbindValueError(f"{name}: axis {self._axis} is out of range for pred of shape {pred.shape}")
        axis = self._axis % pred.ndim
        if self._sparse_label and pred.ndim == 2 and axis == 1 and self._batch_axis in (0, -2):
            labels = as_labels(label, pred.shape[0], pred.device)
            loss = nd.pick_nll(pred, labels) if self._from_logits else nd.softmax_ce_per_sample(pred, labels)
            if sample_weight is None and self._weight is None:
                return loss
            return self._per_sample(self._weighting(loss.reshape((pred.shape[0], 1)), sample_weight))
        logp = pred if self._from_logits else nd.log_softmax(pred, axis=axis)
        if self._sparse_label:
            label = as_nd(label, pred, "label")
            loss = -nd.pick(logp, label, axis=axis, keepdims=True)
        else:
            label = label_like(label, pred, f"{name}(sparse_label=False)")
            loss = -nd.sum(logp * label, axis=axis, keepdims=True)
        return self._per_sample(self._weighting(loss, sample_weight))


SoftmaxCELoss = SoftmaxCrossEntropyLoss


class NLLLoss(SoftmaxCrossEntropyLoss):
    """-pred[label] per sample for log-probabilities ``pred`` (e.g. after ``nd.log_softmax``)."""

    def __init__(self, axis: int = -1, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(axis, True, True, weight, batch_axis, prefix=prefix, params=params)


class KLDivLoss(Loss):
    """label * (log(label + 1e-12) - pred), summed over all but the batch axis (MXNet 1.9 sums here).
    ``from_logits=True`` (the default): pred is log-probabilities; else log_softmax(pred, axis) is taken."""

    def __init__(self, from_logits: bool = True, axis: int = -1, weight=None, batch_axis: int = 0, prefix=None,
                 params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._from_logits, self._axis = from_logits, integer(type(self).__name__, "axis", axis)

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        if not self._from_logits:
            pred = nd.log_softmax(pred, axis=self._axis)
        label = as_nd(label, pred, "label", pred.dtype)
        loss = label * (nd.log(label + 1e-12) - pred)
        return self._per_sample(self._weighting(loss, sample_weight), "sum")


class HuberLoss(Loss):
    """|d| - rho/2 where |d| > rho, else d^2 / (2 rho), for d = pred - label; averaged per sample."""

    def __init__(self, rho: float = 1, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._rho = number(type(self).__name__, "rho", rho)
        if not self._rho > 0:  # (nan too)
            raise DnnbindValueError(f"HuberLoss: rho must be positive, got {rho}")

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        d = nd.abs(label_like(label, pred, "HuberLoss") - pred)
        loss = nd.where(d > self._rho, d - 0.5 * self._rho, nd.square(d) * (0.5 / self._rho))
        return self._per_sample(self._weighting(loss, sample_weight))


class HingeLoss(Loss):
    """max(0, margin - pred * label) for labels in {-1, 1}; averaged per sample."""

    def __init__(self, margin: float = 1, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._margin = number(type(self).__name__, "margin", margin)

    def _hinge(self, pred, label):
        return nd.relu(self._margin - pred * label_like(label, pred, type(self).__name__))

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        return self._per_sample(self._weighting(self._hinge(pred, label), sample_weight))


class SquaredHingeLoss(HingeLoss):
    """max(0, margin - pred * label)^2 for labels in {-1, 1}; averaged per sample."""

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        return self._per_sample(self._weighting(nd.square(self._hinge(pred, label)), sample_weight))


class LogisticLoss(Loss):
    """log(1 + exp(-pred * label)) for ``label_format='signed'`` ({-1, 1}) or 'binary' ({0, 1})."""

    def __init__(self, weight=None, batch_axis: int = 0, label_format: str = "signed", prefix=None, params=None):
        if label_format not in ("signed", "binary"):
            raise DnnbindValueError(f"LogisticLoss: label_format must be 'signed' or 'binary', got {label_format!r}")
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._label_format = label_format

    def forward(self, pred: NDArray, label, sample_weight=None) -> NDArray:
        label = label_like(label, pred, "LogisticLoss")
        if self._label_format == "signed":
            label = (label + 1.0) * 0.5
        loss = nd.relu(pred) - pred * label + nd.softrelu(-nd.abs(pred))
        return self._per_sample(self._weighting(loss, sample_weight))
