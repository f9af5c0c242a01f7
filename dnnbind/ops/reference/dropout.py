"""Numpy twin of inverted dropout: keep each element with probability 1 - p, scale kept ones by 1 / (1 - p).

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

The GPU op's "reserve" is cuDNN's packed bit mask; here it is the scaled mask itself (0 or 1 / (1 - p) in x's
dtype), so ``dropout_backward(dy, reserve, p)`` is ``dy * reserve`` on either backend. The masks of the two
backends differ (numpy's PCG64 here, cuDNN's own generator there), as MXNet's cpu and GPU streams do.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers

import numpy as np

from .. import _check


def dropout_p(op: str, p) -> float:
    """``p`` as a float in [0, 1); TypeError / ValueError naming the op otherwise."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise DnnbindTypeError(f"{op}: p must be a real number in [0, 1), got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise DnnbindValueError(f"{op}: p must be in [0, 1), got {p}")
    return p


def resolve_seed(op: str, seed) -> int:
    """The seed as an unsigned 64-bit int; ``seed`` may be an int or a zero-argument callable returning one
    (called only here, i.e. only when a generator is actually seeded)."""
    s = seed() if callable(seed) else seed
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, (numbers.Integral, np.integer)):
        raise DnnbindTypeError(f"{op}: seed must be an int (or a function returning one), got {type(s).__name__}")
    return int(s) & 0xFFFF_FFFF_FFFF_FFFF


def dropout_forward(x, p=0.5, seed=0, generation=None):
    """(y, reserve): y = x * reserve, reserve in {0, 1/(1-p)} with P(kept) = 1 - p, drawn from PCG64(seed).
    ``generation`` is the GPU op's re-seeding cue; a numpy draw is seeded afresh on every call."""
    op = "dropout_forward"
    _check.check_dtype(op, _check.FLOAT_DTYPES, x=x)
    p = dropout_p(op, p)
    rng = np.random.default_rng(resolve_seed(op, seed))
    keep = rng.random(np.shape(x)) >= p
    mask = (keep * (1.0 / (1.0 - p))).astype(x.dtype)
    return np.asarray(x * mask), mask


def dropout_backward(dy, reserve, p=0.5):
    """dx = dy * reserve (the forward's scaled mask); ``p`` is checked, the scale is in the mask already."""
    op = "dropout_backward"
    _check.check_dtype(op, _check.FLOAT_DTYPES, dy=dy, reserve=reserve)
    dropout_p(op, p)
    if np.shape(dy) != np.shape(reserve):
        raise DnnbindValueError(f"dropout_backward: dy has shape {np.shape(dy)} but the forward's mask has shape "
                         f"{np.shape(reserve)}; pass the reserve dropout_forward returned for this dy")
    return np.asarray(dy * reserve)
