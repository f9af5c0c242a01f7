"""MXNet's ``Dropout``: inverted dropout (keep with probability 1 - p, scale by 1/(1-p)) in train mode
(``autograd.record()``/``train_mode()``) or with ``mode='always'``; the identity otherwise, and for p = 0.

On a GPU cudnnDropoutForward, its backward cudnnDropoutBackward on the saved reserve (ops/dropout.py); on the cpu
numpy. ``axes`` (variational dropout): one mask of the data's shape with those axes set to 1, drawn the same way
(dropout of ones) and broadcast-multiplied, so the mask is shared along ``axes`` (MXNet's BernoulliKernel + a
broadcast multiply); its gradient is dy times the same mask. Seeds come from dnnbind's one random state
(runtime/rng.py), so ``mx.random.seed(n)`` makes runs repeatable. ``cudnn_off`` is parsed and ignored. Unlike
MXNet, p = 1 is refused (it would drop everything).
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime import rng
from .. import dropout as _dropout
from ..opdef import Lowering, OpDef, define, table
from ..reference import dropout as reference
from ..reference.dropout import dropout_p


def _prepare(p, data):
    rate = dropout_p("Dropout", p["p"])
    if rate and data.dtype.kind != "f":
        raise DnnbindTypeError(f"Dropout: data must be a floating-point array, got {data.dtype} (shape "
                               f"{data.shape})")
    axes = p["axes"] or ()
    for a in axes:
        if not -data.ndim <= a < data.ndim:
            raise DnnbindValueError(f"Dropout: axis {a} is out of range for data of shape {data.shape}")
    shared = tuple(sorted({a % data.ndim for a in axes}))
    mask_shape = tuple(1 if i in shared else d for i, d in enumerate(data.shape)) if shared else None
    return rate, p["mode"] == "always", mask_shape


def _active(c) -> bool:
    rate, always, _ = c.geo
    return rate > 0 and (always or c.training)


def _infer(p, shapes):
    return [shapes[0]], [shapes[0]]


def _cpu_forward(c, x):
    if not _active(c):
        return x, None
    rate, _, mask_shape = c.geo
    if mask_shape is not None:
        mask = reference.dropout_forward(np.ones(mask_shape, x.dtype), rate, rng.next_seed())[0]
        return x * mask, mask
    y, mask = reference.dropout_forward(x, rate, rng.next_seed())
    return y, mask


def _cpu_backward(c, mask, grads, dy):
    return ((dy if mask is None else dy * mask).astype(dy.dtype, copy=False),)


def _gpu_forward(c, x):
    if not _active(c):
        return x, None
    rate, _, mask_shape = c.geo
    if mask_shape is not None:
        mask = _dropout.dropout_mask(mask_shape, x.dtype, x.device, rate, rng.next_seed, rng.generation())
        return table("multiply", x, mask), ("mask", mask)
    y, reserve = _dropout.dropout_forward.gpu(x, rate, rng.next_seed, rng.generation())
    return y, ("reserve", reserve)


def _gpu_backward(c, saved, grads, dy):
    if saved is None:
        return (dy,)
    kind, a = saved
    if kind == "mask":
        return (table("multiply", dy, a),)
    return (_dropout.dropout_backward.gpu(dy, a, c.geo[0]),)


def _samples(rng_):
    yield {"data": rng_.standard_normal((4, 5))}, {"p": 0.0}
    yield {"data": rng_.standard_normal((3, 4))}, {"p": 0.0, "mode": "always", "axes": (1,)}
    # (p > 0 draws a new mask per call: no central differences; tests/test_dropout.py checks those)


define(OpDef("Dropout", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             outputs=lambda p: (2, ["output"]),  # MXNet's node also keeps the mask, hidden
             doc="MXNet's Dropout: cudnnDropoutForward/Backward in train mode, the identity otherwise."))
