"""Numpy twin of the activation and softmax ops.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Backward functions take (y, dy, x) like cuDNN's and use whichever of y or x gives the derivative without
overflow: sigmoid and tanh from y, relu/clipped_relu/elu from x. Masks are applied as `dy * mask` because
np.where on a random condition is ~15x slower (branchy inner loop) and relu backward is on the hot path.
"""

from __future__ import annotations

import numpy as np

from .. import _check


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-|x|) never overflows, and the two branches are the same function.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@_check.float16_via_float32
def activation_forward(x: np.ndarray, mode: str = "relu", coef: float = 0.0) -> np.ndarray:
    """relu, sigmoid, tanh, clipped_relu (min(max(x, 0), coef)), elu (x if x > 0 else coef*(exp(x) - 1))."""
    x = np.asarray(x)
    op = "activation_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x)
    mode, coef = _check.activation_mode(op, mode, coef)
    if mode == "relu":
        return np.maximum(x, 0)
    if mode == "sigmoid":
        return _sigmoid(x)
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.clip(x, 0, coef).astype(x.dtype, copy=False)
    return np.where(x > 0, x, coef * np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False)


@_check.float16_via_float32
def activation_backward(y: np.ndarray, dy: np.ndarray, x: np.ndarray, mode: str = "relu",
                        coef: float = 0.0) -> np.ndarray:
    """dx = dy * f'(x)."""
    y, dy, x = np.asarray(y), np.asarray(dy), np.asarray(x)
    op = "activation_backward"
    _check.check_dtype(op, _check.FLOAT32_64, y=y, dy=dy, x=x)
    _check.check_same_shape(op, y=y, dy=dy, x=x)
    mode, coef = _check.activation_mode(op, mode, coef)
    if mode == "relu":
        dx = dy * (x > 0)
    elif mode == "sigmoid":
        dx = dy * y * (1 - y)
    elif mode == "tanh":
        dx = dy * (1 - y * y)
    elif mode == "clipped_relu":
        dx = dy * ((x > 0) & (x < coef))
    else:
        dx = np.where(x > 0, dy, dy * (coef * np.exp(np.minimum(x, 0))))
    return dx.astype(x.dtype, copy=False)


def _softmax_view(x: np.ndarray, mode: str) -> np.ndarray:
    """x reshaped so that the softmax runs over axis 1."""
    return x.reshape(x.shape[0], -1) if mode == "instance" else x


@_check.float16_via_float32
def softmax_forward(x: np.ndarray, algorithm: str = "accurate", mode: str = "instance") -> np.ndarray:
    """Softmax (or log-softmax) over C*H*W per sample (instance) or over C per pixel (channel)."""
    x = np.asarray(x)
    op = "softmax_forward"
    _check.check_dtype(op, _check.FLOAT32_64, x=x)
    algorithm, mode = _check.softmax_params(op, x.shape, algorithm, mode)
    v = _softmax_view(x, mode)
    shifted = v - v.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    s = e.sum(axis=1, keepdims=True)
    y = shifted - np.log(s) if algorithm == "log" else e / s
    return np.ascontiguousarray(y.reshape(x.shape).astype(x.dtype, copy=False))


@_check.float16_via_float32
def softmax_backward(y: np.ndarray, dy: np.ndarray, algorithm: str = "accurate",
                     mode: str = "instance") -> np.ndarray:
    """accurate: dx = y * (dy - sum(dy * y)); log: dx = dy - exp(y) * sum(dy); sums over the softmax axis."""
    y, dy = np.asarray(y), np.asarray(dy)
    op = "softmax_backward"
    _check.check_dtype(op, _check.FLOAT32_64, y=y, dy=dy)
    _check.check_same_shape(op, y=y, dy=dy)
    algorithm, mode = _check.softmax_params(op, y.shape, algorithm, mode)
    yv, dyv = _softmax_view(y, mode), _softmax_view(dy, mode)
    if algorithm == "log":
        dx = dyv - np.exp(yv) * dyv.sum(axis=1, keepdims=True)
    else:
        dx = yv * (dyv - (dyv * yv).sum(axis=1, keepdims=True))
    return np.ascontiguousarray(dx.reshape(y.shape).astype(y.dtype, copy=False))
