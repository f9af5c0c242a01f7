"""MXNet's ``LRN`` (local response normalization across channels): cudnnLRNCrossChannelForward/Backward on a GPU,
ops/reference/lrn.py on the cpu.

``y = x / (knorm + alpha / nsize * sum of x^2 over nsize channels centered on x's) ** beta`` on 4-D (N, C, H, W)
data. MXNet 1.9.1 declares ``nsize`` (required), ``alpha`` 1e-4, ``beta`` 0.75, ``knorm`` 2. Refused where MXNet
gives no usable answer: data that is not 4-D (MXNet's kernels fail on it at run time) and an even ``nsize`` (its
window has no center; MXNet's cpu kernels give values that match no window). On a GPU cuDNN also takes only
1 <= nsize <= 16, knorm >= 1e-5 and beta >= 0.01 (cudnnSetLRNDescriptor's limits): outside them the call is refused,
naming them, before any library call.
"""

from __future__ import annotations

from ..._lib import cudnn
from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import descriptors as D
from .._common import dnn, out_like
from ..opdef import Lowering, OpDef, define
from ..reference.lrn import lrn_backward, lrn_forward

L = cudnn.lib
_MODE = cudnn.CUDNN_LRN_CROSS_CHANNEL_DIM1


def _prepare(p, data):
    n = p["nsize"]
    if data.ndim != 4:
        raise DnnbindValueError(f"LRN: data must be 4-D (N, C, H, W), got shape {data.shape}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"LRN: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    if n < 1 or n % 2 == 0:
        raise DnnbindValueError(f"LRN: nsize must be a positive odd number (a window centered on each channel), got "
                                f"{n} (data {data.shape})")
    if data.device.kind == "gpu" and not (n <= 16 and p["knorm"] >= 1e-5 and p["beta"] >= 0.01):
        raise DnnbindValueError(f"LRN: cuDNN takes nsize <= 16, knorm >= 1e-5 and beta >= 0.01, got nsize {n}, "
                                f"knorm {p['knorm']}, beta {p['beta']} (data {data.shape})")
    return n, p["alpha"], p["beta"], p["knorm"]


def _infer(p, shapes):
    return [shapes[0]], [shapes[0]]


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x):
    n, alpha, beta, k = c.geo
    y, scale = lrn_forward(x, n, alpha, beta, k)
    return y, (x, scale)


def _cpu_backward(c, saved, grads, dy):
    n, alpha, beta, _ = c.geo
    x, scale = saved
    return (lrn_backward(x, scale, dy, n, alpha, beta),)


# gpu: cuDNN ---------------------------------------------------------------------------------------------------

def _gpu_forward(c, x):
    y = out_like(x.shape, x.dtype, x.device)
    if x.size:
        t = D.tensor(x.shape, x.dtype)
        L.cudnnLRNCrossChannelForward(dnn(x), D.lrn(*c.geo), _MODE, D.scalar_ptr(1, x.dtype), t, x.ptr,
                                      D.scalar_ptr(0, x.dtype), t, y.ptr)
    return y, (x, y)


def _gpu_backward(c, saved, grads, dy):
    x, y = saved
    dx = out_like(x.shape, x.dtype, x.device)
    if x.size:
        t = D.tensor(x.shape, x.dtype)
        L.cudnnLRNCrossChannelBackward(dnn(x), D.lrn(*c.geo), _MODE, D.scalar_ptr(1, x.dtype), t, y.ptr, t,
                                       dy.ptr, t, x.ptr, D.scalar_ptr(0, x.dtype), t, dx.ptr)
    return (dx,)


def _samples(rng):
    yield {"data": rng.standard_normal((2, 7, 3, 4))}, {"nsize": 3, "alpha": 0.5, "beta": 0.6, "knorm": 1.5}
    yield {"data": rng.standard_normal((1, 5, 1, 2))}, {"nsize": 5}
    yield {"data": rng.standard_normal((3, 2, 2, 2))}, {"nsize": 1, "alpha": 2.0}


define(OpDef("LRN", prepare=_prepare, infer=_infer, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             outputs=lambda p: (2, ["output"]),  # MXNet's node also keeps the scale (tmp_norm), hidden
             doc="Local response normalization across channels (MXNet's LRN): cudnnLRNCrossChannelForward."))
