"""TripletLoss, PoissonNLLLoss, CosineEmbeddingLoss and CTCLoss (``mxnet.gluon.loss``; re-exported by loss.py).

Layer: gluon; imports nd, runtime, gluon._loss_base.

MXNet 1.x (python/mxnet/gluon/loss.py at v1.9.x) is the specification, output shapes included: TripletLoss
sums over all but the batch axis before its margin; PoissonNLLLoss returns the mean over everything (shape
(1,)); CosineEmbeddingLoss returns (N, 1); CTCLoss returns (N,). All are nd ops, so they have gradients and run
on the arrays' device; CTC is the CTCLoss operator (cuDNN's CTC on a GPU), as MXNet's Gluon calls F.CTCLoss.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math

import numpy as np

from .. import nd
from ..runtime.array import NDArray, array
from ._loss_base import Loss, as_nd, label_like, number

__all__ = ["CTCLoss", "CosineEmbeddingLoss", "PoissonNLLLoss", "TripletLoss"]


def _check_pred(op: str, pred, what: str = "pred") -> None:
    if not isinstance(pred, NDArray):
        raise DnnbindTypeError(f"{op}: {what} must be an NDArray, got {type(pred).__name__}")


class TripletLoss(Loss):
    """max(0, sum(|positive - pred|^2 - |negative - pred|^2) + margin), the sum over all but the batch axis.
    ``positive`` and ``negative`` may have any shape with pred's number of elements. ``sample_weight`` (not in
    MXNet's signature; None there) scales the per-sample result."""

    def __init__(self, margin: float = 1, weight=None, batch_axis: int = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._margin = number(type(self).__name__, "margin", margin)

    def forward(self, pred: NDArray, positive, negative, sample_weight=None) -> NDArray:
        _check_pred("TripletLoss", pred)
        positive = label_like(positive, pred, "TripletLoss", "positive")
        negative = label_like(negative, pred, "TripletLoss", "negative")
        gap = self._per_sample(nd.square(positive - pred) - nd.square(negative - pred), "sum")
        return self._weighting(nd.relu(gap + self._margin), sample_weight)


class PoissonNLLLoss(Loss):
    """Negative log-likelihood of ``target`` counts under Poisson(rate): exp(pred) - target * pred with
    ``from_logits=True`` (pred is log(rate)), else pred - target * log(pred + epsilon). ``compute_full`` adds
    Stirling's approximation of log(target!) where target > 1. Returns the mean over all elements, shape (1,),
    as MXNet does. (MXNet's compute_full gives NaN for a zero count: 0 * log(0); dnnbind gives the intended 0.)"""

    def __init__(self, weight=None, from_logits: bool = True, batch_axis: int = 0, compute_full: bool = False,
                 prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._from_logits, self._compute_full = bool(from_logits), bool(compute_full)

    def forward(self, pred: NDArray, target, sample_weight=None, epsilon: float = 1e-08) -> NDArray:
        _check_pred("PoissonNLLLoss", pred)
        target = label_like(target, pred, "PoissonNLLLoss", "target")
        if self._from_logits:
            loss = nd.exp(pred) - target * pred
        else:
            loss = pred - target * nd.log(pred + number("PoissonNLLLoss", "epsilon", epsilon))
        if self._compute_full:
            t = nd.maximum(target, 1.0)  # the formula's value where target > 1; a finite stand-in elsewhere
            stirling = t * nd.log(t) - t + 0.5 * nd.log(t * (2 * math.pi))
            loss = loss + stirling * (target > 1)
        return nd.mean(self._weighting(loss, sample_weight))


class CosineEmbeddingLoss(Loss):
    """1 - cos(input1, input2) where label is 1, max(0, cos - margin) where label is -1 (0 for other labels),
    the cosine taken along the last axis. Returns shape (N, 1) as MXNet does; ``sample_weight`` broadcasts
    against it."""

    def __init__(self, weight=None, batch_axis: int = 0, margin: float = 0, prefix=None, params=None):
        super().__init__(weight, batch_axis, prefix=prefix, params=params)
        self._margin = number(type(self).__name__, "margin", margin)

    def forward(self, input1, input2: NDArray, label, sample_weight=None) -> NDArray:
        _check_pred("CosineEmbeddingLoss", input2, "input2")
        input1 = label_like(input1, input2, "CosineEmbeddingLoss", "input1", "input2")
        label = as_nd(label, input2, "label", input2.dtype).reshape((-1, 1))
        norms = nd.norm(input1, axis=-1) * nd.norm(input2, axis=-1)
        cos = (nd.sum(input1 * input2, axis=-1) / nd.maximum(norms, 1e-12)).reshape((-1, 1))
        if label.shape[0] != cos.shape[0]:
            raise DnnbindValueError(f"CosineEmbeddingLoss: {label.shape[0]} labels for {cos.shape[0]} vector pairs "
                             f"(inputs of shape {input2.shape}; the cosine is taken along the last axis)")
        loss = (1.0 - cos) * (label == 1) + nd.relu((label == -1) * (cos - self._margin))
        return self._weighting(loss, sample_weight)


class CTCLoss(Loss):
    """Connectionist Temporal Classification: -log p(label | pred) per sample, shape (N,).

    ``pred``: unnormalised scores, (N, T, C) for ``layout='NTC'`` or (T, N, C) for 'TNC'; class C - 1 is the
    blank. ``label``: (N, L) for ``label_layout='NT'`` or (L, N) for 'TN', class ids 0..C-2 padded with -1
    (a sample's length is its count before the first -1) unless ``label_lengths`` gives them. ``pred_lengths``
    gives each sample's number of valid time steps (default T). A label that cannot be aligned within its time
    steps gets loss 0 (and no gradient), as MXNet's warp-ctc gives.
    """

    def __init__(self, layout: str = "NTC", label_layout: str = "NT", weight=None, prefix=None, params=None):
        if layout not in ("NTC", "TNC"):
            raise DnnbindValueError(f"CTCLoss: layout must be 'NTC' or 'TNC', got {layout!r}")
        if label_layout not in ("NT", "TN"):
            raise DnnbindValueError(f"CTCLoss: label_layout must be 'NT' or 'TN', got {label_layout!r}")
        super().__init__(weight, label_layout.find("N"), prefix=prefix, params=params)
        self._layout, self._label_layout = layout, label_layout

    def forward(self, pred: NDArray, label, pred_lengths=None, label_lengths=None, sample_weight=None) -> NDArray:
        # MXNet's Gluon CTCLoss is F.CTCLoss with the blank last: the operator (ops/defs/ctc_loss.py) checks the
        # label values and lengths (on the cpu) and runs cuDNN's CTC on a GPU without reading anything back.
        _check_pred("CTCLoss", pred)
        if pred.ndim != 3:
            raise DnnbindValueError(f"CTCLoss: pred must be 3-D ({self._layout}), got shape {pred.shape}")
        if self._layout == "NTC":
            pred = nd.swapaxes(pred, 0, 1)
        t, n, c = pred.shape
        if c < 2:
            raise DnnbindValueError(f"CTCLoss: pred needs at least 2 classes (labels and the blank), got shape "
                                    f"{pred.shape}")
        label = label if isinstance(label, NDArray) else array(np.asarray(label), device=pred.device)
        if label.ndim != 2:
            raise DnnbindValueError(f"CTCLoss: label must be 2-D ({self._label_layout}), got shape {label.shape}")
        if self._label_layout == "TN":
            label = nd.swapaxes(label, 0, 1)
        if label.shape[0] != n:
            raise DnnbindValueError(f"CTCLoss: label shape {label.shape} ({self._label_layout}) has {label.shape[0]} "
                                    f"samples but pred has {n}")
        if label.shape[1] > t:
            raise DnnbindValueError(f"CTCLoss: labels of length {label.shape[1]} cannot fit in {t} time steps of "
                                    f"pred")
        lengths = [v if v is None or isinstance(v, NDArray) else array(np.asarray(v), device=pred.device)
                   for v in (pred_lengths, label_lengths)]
        loss = nd.CTCLoss(pred, label, lengths[0], lengths[1], use_data_lengths=pred_lengths is not None,
                          use_label_lengths=label_lengths is not None, blank_label="last")
        return self._weighting(loss, sample_weight)

    def __repr__(self) -> str:
        return f"CTCLoss(layout={self._layout!r}, label_layout={self._label_layout!r}, w={self._weight})"
