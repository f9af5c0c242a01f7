"""Numpy twin of MXNet's sequence operators (SequenceMask, SequenceLast, SequenceReverse). Layer: ops. Imports
numpy only.

Data is (T, B, ...) for ``axis`` 0 or (B, T, ...) for ``axis`` 1: T steps of a batch of B sequences. ``lengths``
is None (every sequence is T long) or B whole numbers the caller has already truncated and checked against T (the
op's entry, ops/defs/sequence.py, owns the checks and their messages). Each function returns a new array in the
data's dtype.
"""

from __future__ import annotations

import numpy as np


def _steps_first(x: np.ndarray, axis: int) -> np.ndarray:
    """A (T, B, ...) view of ``x``: writes through it land in ``x``."""
    return x if axis == 0 else np.moveaxis(x, 1, 0)


def sequence_mask(x: np.ndarray, lengths, value: float, axis: int) -> np.ndarray:
    """Steps at or past each sequence's length set to ``value`` (a length of 0 masks all, one >= T none)."""
    y = x.copy()
    if lengths is not None:
        yt = _steps_first(y, axis)
        past = np.arange(yt.shape[0])[:, None] >= np.asarray(lengths)[None, :]  # (T, B)
        yt[past] = value
    return y


def sequence_mask_backward(dy: np.ndarray, lengths, axis: int) -> np.ndarray:
    """The masked steps get no gradient; the rest pass dy through."""
    return sequence_mask(dy, lengths, 0, axis)


def _last_steps(lengths, t: int, b: int) -> np.ndarray:
    return np.full(b, t - 1, np.int64) if lengths is None else np.asarray(lengths, np.int64) - 1


def sequence_last(x: np.ndarray, lengths, axis: int) -> np.ndarray:
    """(B, ...): each sequence's step ``length - 1`` (lengths in [1, T])."""
    xt = _steps_first(x, axis)
    t, b = xt.shape[:2]
    return np.ascontiguousarray(xt[_last_steps(lengths, t, b), np.arange(b)])


def sequence_last_backward(dy: np.ndarray, lengths, axis: int, shape: tuple) -> np.ndarray:
    """dy (B, ...) put back at each sequence's last step, zeros elsewhere (each step is taken at most once)."""
    dx = np.zeros(shape, dy.dtype)
    dxt = _steps_first(dx, axis)
    t, b = dxt.shape[:2]
    dxt[_last_steps(lengths, t, b), np.arange(b)] = dy
    return dx


def reverse_sources(lengths, t: int, b: int) -> np.ndarray:
    """(T, B) source step of each output step: the first ``length`` steps reversed, the padding after them kept in
    place. The permutation is its own inverse, so the backward applies it to dy."""
    steps = np.arange(t)[:, None]
    if lengths is None:
        return np.broadcast_to(t - 1 - steps, (t, b))
    n = np.asarray(lengths, np.int64)[None, :]
    return np.where(steps < n, n - 1 - steps, steps)


def sequence_reverse(x: np.ndarray, lengths) -> np.ndarray:
    """Each sequence's first ``length`` steps in reverse order along axis 0 (a length of 0 changes nothing)."""
    t, b = x.shape[:2]
    return np.ascontiguousarray(x[reverse_sources(lengths, t, b), np.arange(b)[None, :]])


def clamp_lengths(lengths, t: int, lo: int = 0) -> np.ndarray:
    """What the GPU lowering makes of any lengths (it cannot refuse them without a host copy): truncated toward
    zero, NaN counted as 0, clamped to [lo, t]. The twin's functions applied to these give the GPU's results."""
    n = np.asarray(lengths, np.float64)
    n = np.where(np.isnan(n), 0, np.trunc(n))
    return np.clip(n, lo, t).astype(np.int64)
