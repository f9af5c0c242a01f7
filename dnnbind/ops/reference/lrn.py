"""Numpy twin of MXNet's LRN (local response normalization across channels). Layer: ops. Imports numpy only.

For 4-D data (N, C, H, W), each value is divided by the sum of squares over a window of ``n`` channels centered on
its own (clipped at the edges): ``y = x / (k + alpha / n * sum_{window} x^2) ** beta`` (MXNet's lrn-inl.h and
cuDNN's cudnnLRNCrossChannelForward use the same formula, alpha divided by the window width).
"""

from __future__ import annotations

import numpy as np


def _window_sum(v: np.ndarray, n: int) -> np.ndarray:
    """Sum over channels [c - n//2, c + n//2] (clipped) for every c, along axis 1 (n odd)."""
    half = n // 2
    c = v.shape[1]
    csum = np.cumsum(np.pad(v, ((0, 0), (half + 1, half)) + ((0, 0),) * (v.ndim - 2)), axis=1)
    return csum[:, n:n + c] - csum[:, :c]


def lrn_forward(x: np.ndarray, n: int, alpha: float, beta: float, k: float):
    """(y, scale) with scale = k + alpha / n * window sum of x^2, computed in float64 and returned as x's dtype."""
    xd = x.astype(np.float64)
    scale = k + alpha / n * _window_sum(xd * xd, n)
    return (xd * scale ** -beta).astype(x.dtype), scale


def lrn_backward(x: np.ndarray, scale: np.ndarray, dy: np.ndarray, n: int, alpha: float, beta: float):
    """dx from x, the forward's scale and dy: dy * scale^-beta - 2 beta alpha / n * x * window sum of
    (dy * x * scale^(-beta-1)) (the window is symmetric, so the channels a value feeds are its own window)."""
    xd, dyd = x.astype(np.float64), dy.astype(np.float64)
    feed = _window_sum(dyd * xd * scale ** (-beta - 1.0), n)
    return (dyd * scale ** -beta - 2.0 * beta * alpha / n * xd * feed).astype(x.dtype)
