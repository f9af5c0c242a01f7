"""Layer 2 (ops): elementwise arithmetic, reductions, dropout and Adam, for NDArray operators and the
Trainer. Imports runtime and ops. These have no cuDNN/cuBLAS call (or only an awkward one), so on the GPU
they are small NVRTC kernels (ops._kernels); sums are one cuBLAS gemv against a ones vector.
"""

from __future__ import annotations

import numpy as np

from ..runtime.array import NDArray, empty
from ..runtime.stream import current_stream
from . import _kernels
from ._common import blas
from .blas import ones_vector, sum_rows_into

BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "eq": 4, "maximum": 5, "gt": 6}
_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "eq": lambda a, b: (a == b).astype(np.result_type(a)), "maximum": np.maximum,
          "gt": lambda a, b: (a > b).astype(np.result_type(a))}


def _sfx(op, dtype):
    if dtype == np.float32:
        return "f32"
    if dtype == np.float64:
        return "f64"
    raise TypeError(f"{op}: GPU arithmetic supports float32 and float64, got {dtype}")


def _launch(name, n, args, device):
    _kernels.kernel(name).launch(_kernels.grid_for(n), 256, args, stream=current_stream(device))


def binary(op: str, a: NDArray, b) -> NDArray:
    """a (op) b for same-shape NDArrays or an NDArray and a Python scalar."""
    if op not in BINARY_OPS:
        raise ValueError(f"binary: unknown op {op!r}")
    if a._data is not None:
        bv = b._data if isinstance(b, NDArray) else np.asarray(b, a.dtype)
        return NDArray._from_numpy(np.ascontiguousarray(_NUMPY[op](a._data, bv).astype(a.dtype, copy=False)))
    sfx = _sfx(op, a.dtype)
    if isinstance(b, NDArray):
        if b._device is not a._device:
            raise ValueError(f"{op}: arrays on different devices ({a._device} and {b._device})")
        if b.shape != a.shape and b.size != 1:
            raise ValueError(f"{op}: shapes {a.shape} and {b.shape} differ (only same shape or size-1 broadcast)")
        if b.dtype != a.dtype:
            raise TypeError(f"{op}: dtypes {a.dtype} and {b.dtype} differ")
        b_scalar = int(b.size == 1 and a.size != 1)
    else:
        b = _scalar_array(float(b), a.dtype, a._device)
        b_scalar = 1
    out = empty(a.shape, a.dtype, a._device)
    if a.size:
        _launch("binary_" + sfx, a.size, (a, b, out, np.int64(a.size), BINARY_OPS[op], b_scalar), a._device)
    return out


_scalars: dict = {}


def _scalar_array(value, dtype, device):
    # Device-resident constants, cached: a scalar operand must not cost an upload per call.
    key = (value, np.dtype(dtype), device)
    s = _scalars.get(key)
    if s is None:
        s = empty((1,), dtype, device).copy_(np.asarray([value], dtype))
        if len(_scalars) < 4096:
            _scalars[key] = s
    return s


def affine(a: NDArray, alpha: float, beta: float = 0.0) -> NDArray:
    """alpha * a + beta."""
    if a._data is not None:
        return NDArray._from_numpy((a._data * alpha + beta).astype(a.dtype, copy=False))
    sfx = _sfx("affine", a.dtype)
    out = empty(a.shape, a.dtype, a._device)
    cast = np.float64 if sfx == "f64" else np.float32
    if a.size:
        _launch("affine_" + sfx, a.size, (a, out, cast(alpha), cast(beta), np.int64(a.size)), a._device)
    return out


def broadcast_scalar(s: NDArray, shape, alpha: float = 1.0) -> NDArray:
    """An array of ``shape`` filled with alpha * s[0] (s a size-1 array): the gradient of a sum."""
    if s._data is not None:
        return NDArray._from_numpy(np.full(shape, alpha * s._data.reshape(-1)[0], s.dtype))
    sfx = _sfx("broadcast", s.dtype)
    out = empty(shape, s.dtype, s._device)
    cast = np.float64 if sfx == "f64" else np.float32
    if out.size:
        _launch("bcast_" + sfx, out.size, (s, out, cast(alpha), np.int64(out.size)), s._device)
    return out


def sum_all(x: NDArray, scale: float = 1.0) -> NDArray:
    """scale * sum of all elements, as a shape-(1,) array: one gemv against ones on the GPU."""
    if x._data is not None:
        return NDArray._from_numpy(np.asarray([x._data.sum(dtype=np.float64) * scale], x.dtype))
    _sfx("sum", x.dtype)
    out = empty((1,), x.dtype, x._device)
    n = x.size
    sum_rows_into(blas(x), x._ptr, ones_vector(x._device, n, x.dtype)._ptr, out._ptr, n, 1, scale, 0.0, x.dtype)
    return out


def dropout(x: NDArray, p: float, seed: int) -> tuple[NDArray, NDArray]:
    """(y, mask) with y = x * mask, mask in {0, 1/(1-p)}."""
    if x._data is not None:
        rng = np.random.default_rng(seed)
        mask = ((rng.random(x.shape) >= p) / (1.0 - p)).astype(x.dtype)
        return NDArray._from_numpy(x._data * mask), NDArray._from_numpy(mask)
    if x.dtype != np.float32:
        raise TypeError(f"dropout: GPU dropout supports float32, got {x.dtype}")
    y, mask = empty(x.shape, x.dtype, x._device), empty(x.shape, x.dtype, x._device)
    if x.size:
        _launch("dropout_f32", x.size, (x, y, mask, np.float32(p), np.uint64(seed), np.int64(x.size)), x._device)
    return y, mask


def adam_update(w, g, m, v, lr_t, beta1, beta2, eps, rescale, wd) -> None:
    """In place over flat buffers: gi = g*rescale + wd*w; m, v moments; w -= lr_t m / (sqrt(v) + eps)."""
    if w._data is not None:
        gi = g._data * rescale + wd * w._data
        m._data[...] = beta1 * m._data + (1 - beta1) * gi
        v._data[...] = beta2 * v._data + (1 - beta2) * gi * gi
        w._data[...] -= (lr_t * m._data / (np.sqrt(v._data) + eps)).astype(w.dtype)
        return
    if w.dtype != np.float32:
        raise TypeError(f"adam_update: GPU Adam supports float32, got {w.dtype}")
    f = np.float32
    _launch("adam_f32", w.size, (w, g, m, v, f(lr_t), f(beta1), f(beta2), f(eps), f(rescale), f(wd),
                                 np.int64(w.size)), w._device)
