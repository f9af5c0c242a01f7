"""Layer 2 (ops): SGD's and Adam's updates over flat buffers (the Trainer's). Imports runtime and ops.

It has no cuDNN/cuBLAS call, so on the GPU it is a small NVRTC kernel (ops._kernels). Dropout is ops.dropout
(cuDNN); NDArray arithmetic, reductions and every other element-wise op live in the nd op table (nd/_table.py).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError

import numpy as np

from ..runtime.stream import current_stream
from . import _kernels


def _launch(name, n, args, device):
    _kernels.kernel(name).launch(_kernels.grid_for(n), 256, args, stream=current_stream(device))


def adam_update(w, g, m, v, lr_t, beta1, beta2, eps, rescale, wd) -> None:
    """In place over flat buffers: gi = g*rescale + wd*w; m, v moments; w -= lr_t m / (sqrt(v) + eps)."""
    if not w.on_gpu:
        gi = g._data * rescale + wd * w._data
        m._data[...] = beta1 * m._data + (1 - beta1) * gi
        v._data[...] = beta2 * v._data + (1 - beta2) * gi * gi
        w._data[...] -= (lr_t * m._data / (np.sqrt(v._data) + eps)).astype(w.dtype)
        return
    if w.dtype != np.float32:
        raise DnnbindTypeError(f"adam_update: GPU Adam supports float32, got {w.dtype}")
    f = np.float32
    _launch("adam_f32", w.size, (w, g, m, v, f(lr_t), f(beta1), f(beta2), f(eps), f(rescale), f(wd),
                                 np.int64(w.size)), w.device)


def sgd_update(w, g, mom, lr, momentum, wd, rescale, w16=None) -> None:
    """In place over flat float32 buffers, MXNet's SGD: with ``mom`` (momentum != 0) ``mom = momentum*mom -
    lr*wd*w - lr*rescale*g; w += mom``, else ``w = (1 - lr*wd)*w - lr*rescale*g``. One kernel on the GPU.

    Mixed precision: ``g`` float16 (the float16 Parameters' gradients) and ``w16`` their float16 weights, written
    from the updated float32 master ``w`` in the same pass."""
    f = np.float32
    a_g = f(-lr * rescale)
    half = g.dtype == np.float16
    if half and (w16 is None or w16.dtype != np.float16 or w16.shape != w.shape):
        raise DnnbindTypeError(f"sgd_update: float16 gradients need w16, the float16 weights of shape {w.shape}")
    if not w.on_gpu:
        gd = g._data.astype(f) if half else g._data
        if mom is None:
            w._data[...] = f(1.0 - lr * wd) * w._data + a_g * gd
        else:
            m = f(momentum) * mom._data + a_g * gd + f(-lr * wd) * w._data
            mom._data[...] = m
            w._data[...] += m
        if half:
            w16._data[...] = w._data.astype(np.float16)
        return
    if w.dtype != np.float32:
        raise DnnbindTypeError(f"sgd_update: GPU SGD supports float32 weights, got {w.dtype}")
    n = np.int64(w.size)
    if mom is None:
        name, args = ("sgd_f32_h16", (w, g, w16, f(1.0 - lr * wd), a_g, n)) if half else \
            ("sgd_f32", (w, g, f(1.0 - lr * wd), a_g, n))
    else:
        name, args = ("sgd_mom_f32_h16", (w, g, mom, w16, f(momentum), a_g, f(-lr * wd), n)) if half else \
            ("sgd_mom_f32", (w, g, mom, f(momentum), a_g, f(-lr * wd), n))
    _launch(name, w.size, args, w.device)
