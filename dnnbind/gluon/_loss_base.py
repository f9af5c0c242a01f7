"""The Loss base class and the input helpers every loss shares (``mxnet.gluon.loss.Loss``).

Layer: gluon; imports nd, runtime, gluon.block. See loss.py for the semantics (MXNet 1.x's).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers

import numpy as np

from .. import nd
from ..runtime.array import NDArray, array
from .block import Block

__all__ = ["Loss", "integer", "number"]


def _host(v, what: str, dtype=None) -> np.ndarray:
    """A label or weight given as numbers (a numpy array, a list, a number) on the host; anything else, None
    included, is a TypeError naming the argument (was numpy's "could not convert string to float")."""
    if v is None:
        raise DnnbindTypeError(f"{what} is required: an NDArray, got None")
    try:
        host = np.asarray(v, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise DnnbindTypeError(f"{what} must be an NDArray or numbers, got {type(v).__name__} {v!r:.40}") from exc
    if host.dtype.kind not in "biuf":
        raise DnnbindTypeError(f"{what} must be an NDArray or numbers, got {type(v).__name__} {v!r:.40}")
    return host


def as_nd(v, like: NDArray, what: str, dtype=None) -> NDArray:
    """``v`` as an NDArray on ``like``'s device (numpy arrays, lists and numbers are uploaded)."""
    if not isinstance(v, NDArray):
        v = array(_host(v, what, dtype or like.dtype), device=like.device)
    elif v.device is not like.device:
        v = v.as_in_context(like.device)
    if dtype is not None and v.dtype != np.dtype(dtype):
        v = v.astype(dtype)
    return v


def label_like(label, pred: NDArray, op: str, what: str = "label", like: str = "pred") -> NDArray:
    """The label viewed in pred's shape and dtype (what MXNet's losses do with ``_reshape_like``), with the checks
    and conversions of a label given as numbers."""
    label = as_nd(label, pred, f"{op}: {what}", pred.dtype)
    if label.size != pred.size:
        raise DnnbindValueError(f"{op}: {what} shape {label.shape} does not match {like} shape {pred.shape}")
    return label if label.shape == pred.shape else label.reshape(pred.shape)


# MXNet's private helpers of mxnet.gluon.loss, with MXNet's signatures (``F`` first): losses written for MXNet
# (GluonCV's) import them and call them from their hybrid_forward with F = mx.nd or mx.sym. loss.py serves them
# under MXNet's names, ``_reshape_like`` and ``_apply_weighting``.

def reshape_like(F, x, y):
    """MXNet's ``_reshape_like(F, x, y)``: x reshaped to y's shape (``F.reshape_like`` for a Symbol)."""
    if F is nd:
        return x.reshape(y.shape)
    return F.reshape_like(x, y)


def apply_weighting(F, loss, weight=None, sample_weight=None):
    """MXNet's ``_apply_weighting``: ``loss`` times ``sample_weight`` (broadcast) times the number ``weight``."""
    if sample_weight is not None:
        loss = F.broadcast_mul(loss, sample_weight)
    if weight is not None:
        # MXNet asserts this (an AssertionError with this message)
        assert isinstance(weight, (float, int, np.generic)), "weight must be a number"
        loss = loss * weight
    return loss


def as_labels(label, n: int, device) -> NDArray:
    """Class ids as an (N,) int32 NDArray on ``device``; (N, 1) labels are flattened."""
    if not isinstance(label, NDArray):
        host = _host(label, "loss: label")
        if host.size != n:
            raise DnnbindValueError(f"loss: expected {n} class labels (shape ({n},) or ({n}, 1)), got shape {host.shape}")
        return array(host.reshape(n).astype(np.int32, copy=False), device=device)
    if label.shape != (n,):
        if label.size != n:
            raise DnnbindValueError(f"loss: expected {n} class labels (shape ({n},) or ({n}, 1)), got shape {label.shape}")
        label = label.reshape((n,))
    if label.device is not device:
        label = label.as_in_context(device)
    if label.dtype.kind not in "iu":
        # NOTE: float labels (e.g. from a float32 dataset) are converted once: the gather kernels read integer
        # ids. Give int32 labels to skip the conversion.
        label = label.astype(np.int32)
    return label


def number(op: str, name: str, v) -> float:
    """A loss's real-valued setting (rho, margin, ...): a finite-or-not Python number, never None or a string."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise DnnbindTypeError(f"{op}: {name} must be a number, got {type(v).__name__} {v!r}")
    return float(v)


def integer(op: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise DnnbindTypeError(f"{op}: {name} must be an int, got {type(v).__name__} {v!r}")
    return int(v)


class Loss(Block):
    """Base class: ``weight`` (a number) scales the loss; the result has one value per ``batch_axis`` entry."""

    _array_input = True  # pred must be an NDArray: Block's call says so by name (BlockInputError)

    def __init__(self, weight=None, batch_axis: int = 0, prefix=None, params=None):
        if weight is not None:
            number(type(self).__name__, "weight", weight)
        integer(type(self).__name__, "batch_axis", batch_axis)
        super().__init__(prefix=prefix, params=params)
        self._weight, self._batch_axis = weight, int(batch_axis)

    def _weighting(self, loss: NDArray, sample_weight=None, weight=None) -> NDArray:
        """loss * sample_weight (broadcast) * weight, MXNet's ``_apply_weighting``."""
        if sample_weight is not None:
            sample_weight = as_nd(sample_weight, loss, f"{type(self).__name__}: sample_weight", loss.dtype)
        weight = self._weight if weight is None else weight
        return apply_weighting(nd, loss, None if weight is None else float(weight), sample_weight)

    def _per_sample(self, loss: NDArray, reduce: str = "mean") -> NDArray:
        """Mean (or sum) over every axis but the batch axis: shape (N,)."""
        axis = self._batch_axis + loss.ndim if self._batch_axis < 0 else self._batch_axis
        if not 0 <= axis < loss.ndim:
            raise DnnbindValueError(f"{type(self).__name__}: batch_axis {self._batch_axis} is out of range for a loss of "
                             f"shape {loss.shape}")
        if loss.size == loss.shape[axis]:  # nothing to reduce: a view, no kernel
            return loss.reshape((loss.shape[axis],))
        fn = nd.mean if reduce == "mean" else nd.sum
        return fn(loss, axis=axis, exclude=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"
