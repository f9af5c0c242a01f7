"""TripletLoss, PoissonNLLLoss, CosineEmbeddingLoss and CTCLoss (``mxnet.gluon.loss``; re-exported by loss.py).

Layer: gluon; imports nd, runtime, gluon._loss_base.

MXNet 1.x (python/mxnet/gluon/loss.py at v1.9.x) is the specification, output shapes included: TripletLoss
sums over all but the batch axis before its margin; PoissonNLLLoss returns the mean over everything (shape
(1,)); CosineEmbeddingLoss returns (N, 1); CTCLoss returns (N,). All are nd ops, so they have gradients and run
on the arrays' device; CTC runs its forward recursion as one small group of ops per time step.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math

import numpy as np

from .. import nd
from ..runtime.array import NDArray, array
from ._loss_base import Loss, _as_nd, _reshape_like, number

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
        positive = _reshape_like(positive, pred, "TripletLoss", "positive")
        negative = _reshape_like(negative, pred, "TripletLoss", "negative")
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
        target = _reshape_like(target, pred, "PoissonNLLLoss", "target")
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
        input1 = _reshape_like(input1, input2, "CosineEmbeddingLoss", "input1", "input2")
        label = _as_nd(label, input2, "label", input2.dtype).reshape((-1, 1))
        norms = nd.norm(input1, axis=-1) * nd.norm(input2, axis=-1)
        cos = (nd.sum(input1 * input2, axis=-1) / nd.maximum(norms, 1e-12)).reshape((-1, 1))
        if label.shape[0] != cos.shape[0]:
            raise DnnbindValueError(f"CosineEmbeddingLoss: {label.shape[0]} labels for {cos.shape[0]} vector pairs "
                             f"(inputs of shape {input2.shape}; the cosine is taken along the last axis)")
        loss = (1.0 - cos) * (label == 1) + nd.relu((label == -1) * (cos - self._margin))
        return self._weighting(loss, sample_weight)


_NEG = -1e30  # log(0) stand-in: finite, so max-shifted sums and their gradients stay free of inf - inf


def _host_ints(v, what: str, n: int) -> np.ndarray:
    a = v.numpy() if isinstance(v, NDArray) else np.asarray(v)
    if a.size != n:
        raise DnnbindValueError(f"CTCLoss: {what} must have one entry per sample ({n}), got shape {a.shape}")
    a = a.reshape(n)
    if a.dtype.kind == "f" and not np.array_equal(a, np.round(a)):
        raise DnnbindValueError(f"CTCLoss: {what} must hold whole numbers, got {a}")
    return a.astype(np.int64)


def _logsumexp(*xs: NDArray) -> NDArray:
    m = xs[0]
    for x in xs[1:]:
        m = nd.maximum(m, x)
    total = nd.exp(xs[0] - m)
    for x in xs[1:]:
        total = total + nd.exp(x - m)
    return m + nd.log(total)


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

    def _plan(self, label, n: int, t: int, c: int, pred_lengths, label_lengths):
        """Host-side tables from the labels: extended label (blanks between), skip mask, lengths."""
        lab = label.numpy() if isinstance(label, NDArray) else np.asarray(label)
        if lab.ndim != 2:
            raise DnnbindValueError(f"CTCLoss: label must be 2-D ({self._label_layout}), got shape {lab.shape}")
        if self._label_layout == "TN":
            lab = lab.T
        if lab.shape[0] != n:
            raise DnnbindValueError(f"CTCLoss: label shape {lab.shape} ({self._label_layout}) has {lab.shape[0]} samples "
                             f"but pred has {n}")
        lmax = lab.shape[1]
        if lmax > t:
            raise DnnbindValueError(f"CTCLoss: labels of length {lmax} cannot fit in {t} time steps of pred")
        lab = lab.astype(np.int64)
        if label_lengths is None:
            pad = lab == -1
            lens = np.where(pad.any(axis=1), pad.argmax(axis=1), lmax)
        else:
            lens = _host_ints(label_lengths, "label_lengths", n)
        steps = np.full(n, t) if pred_lengths is None else _host_ints(pred_lengths, "pred_lengths", n)
        if lens.min(initial=0) < 0 or lens.max(initial=0) > lmax:
            raise DnnbindValueError(f"CTCLoss: label_lengths must be in 0..{lmax}, got {lens}")
        if steps.min() < 1 or steps.max() > t:
            raise DnnbindValueError(f"CTCLoss: pred_lengths must be in 1..{t}, got {steps}")
        valid = np.arange(lmax)[None, :] < lens[:, None]
        if ((lab < 0) | (lab > c - 2))[valid].any():
            raise DnnbindValueError(f"CTCLoss: label ids must be in 0..{c - 2} (class {c - 1} is the blank), got "
                             f"{np.unique(lab[valid]).tolist()}")
        blank = c - 1
        ext = np.full((n, 2 * lmax + 1), blank, np.int64)
        ext[:, 1::2] = np.where(valid, lab, blank)
        skip = np.zeros(ext.shape, bool)
        skip[:, 3::2] = (ext[:, 3::2] != ext[:, 1:-2:2]) & valid[:, 1:]
        repeats = ((lab[:, 1:] == lab[:, :-1]) & valid[:, 1:]).sum(axis=1)
        possible = lens + repeats <= steps
        return ext, skip, lens, steps, possible

    def forward(self, pred: NDArray, label, pred_lengths=None, label_lengths=None, sample_weight=None) -> NDArray:
        _check_pred("CTCLoss", pred)
        if pred.ndim != 3:
            raise DnnbindValueError(f"CTCLoss: pred must be 3-D ({self._layout}), got shape {pred.shape}")
        if self._layout == "TNC":
            pred = nd.swapaxes(pred, 0, 1)
        n, t, c = pred.shape
        if c < 2:
            raise DnnbindValueError(f"CTCLoss: pred needs at least 2 classes (labels and the blank), got shape {pred.shape}")
        ext, skip, lens, steps, possible = self._plan(label, n, t, c, pred_lengths, label_lengths)
        s = ext.shape[1]

        def const(a) -> NDArray:
            return array(np.asarray(a, dtype=pred.dtype), device=pred.device)

        # log p(extended label s at time t): (T, N, S), by a batched product with the one-hot extended labels.
        onehot = np.zeros((n, s, c), pred.dtype)
        np.put_along_axis(onehot, ext[:, :, None], 1.0, axis=2)
        logp = nd.swapaxes(nd.batch_dot(nd.log_softmax(pred, axis=-1), const(onehot), transpose_b=True), 0, 1)

        neg = {k: const(np.full((n, k), _NEG)) for k in (1, 2)}
        no_skip = const(np.where(skip, 0.0, _NEG))

        def shifted(a: NDArray, k: int) -> NDArray:  # alpha[s - k], log(0) below s = k
            if s <= k:
                return const(np.full((n, s), _NEG))
            return nd.concat(neg[k], nd.slice_axis(a, axis=1, begin=0, end=s - k), dim=1)

        start = np.full((n, s), _NEG)
        start[:, :2] = 0.0
        alpha = logp[0] + const(start)
        for step in range(1, t):
            new = _logsumexp(alpha, shifted(alpha, 1), shifted(alpha, 2) + no_skip) + logp[step]
            if (steps > step).all():
                alpha = new
            else:  # samples past their last step keep their alpha (a select: blending would cancel -1e30s)
                alpha = nd.where(const(np.broadcast_to((steps > step)[:, None], (n, s))), new, alpha)
        last = nd.pick(alpha, const(2 * lens), axis=1)
        before = nd.pick(alpha, const(np.maximum(2 * lens - 1, 0)), axis=1) + const(np.where(lens > 0, 0.0, _NEG))
        loss = -_logsumexp(last, before)
        if not possible.all():
            loss = loss * const(possible)
        return self._weighting(loss, sample_weight)

    def __repr__(self) -> str:
        return f"CTCLoss(layout={self._layout!r}, label_layout={self._label_layout!r}, w={self._weight})"
