"""Helpers shared by the image transforms: host views, results in the caller's type, resampling, range casts.

Layer: gluon: data; imports numpy (and dnnbind.runtime lazily, to give NDArray inputs NDArray results).

Transforms run on the host in numpy. An NDArray input (MXNet's case: ``image.imread`` or a dataset item) gets an
NDArray result on the input's device; a numpy input (the DataLoader's batched path) gets numpy back.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindTypeError, DnnbindValueError

from typing import Any

import numpy as np


def host(x: Any) -> np.ndarray:
    """A numpy view or copy of ``x`` (an NDArray is copied to the host)."""
    if hasattr(x, "asnumpy"):
        return x.asnumpy()
    return np.asarray(x)


def like_input(out: np.ndarray, x: Any) -> Any:
    """``out`` as the caller gave ``x``: an NDArray on x's device for an NDArray input, else numpy."""
    from ....runtime.array import NDArray, array  # lazy: importing the data layer loads no runtime
    if not isinstance(x, NDArray):
        return out
    out = np.ascontiguousarray(out)
    if x.device.kind == "cpu":
        return NDArray._from_numpy(out)  # a fresh array the transform made: wrap it without a copy
    return array(out, device=x.device, dtype=out.dtype)


def check_numeric(op: str, x: np.ndarray) -> None:
    """Raise TypeError unless ``x`` holds numbers (bool, integers or floats): not objects, strings, complex."""
    if x.dtype.kind not in "buif":
        raise DnnbindTypeError(f"{op}: expected an array of numbers, got dtype {x.dtype} (shape {x.shape})")


def check_image(op: str, x: np.ndarray, channels: tuple[int, ...] | None = None, layout: str = "HWC") -> None:
    """Raise TypeError unless ``x`` holds numbers, ValueError unless it is an image (H, W, C) or a batch
    (N, H, W, C) (``layout="CHW"``: (C, H, W) or (N, C, H, W)) with no empty axis but N, and C in ``channels``
    (if given)."""
    check_numeric(op, x)
    one, many = ("(H, W, C)", "(N, H, W, C)") if layout == "HWC" else ("(C, H, W)", "(N, C, H, W)")
    if x.ndim not in (3, 4):
        raise DnnbindValueError(f"{op}: expected an image {one} or a batch {many}, got shape {x.shape}")
    if 0 in x.shape[-3:]:
        raise DnnbindValueError(f"{op}: the image is empty: shape {x.shape} ({one[1:-1]} = "
                                f"{', '.join(map(str, x.shape[-3:]))})")
    if channels is not None and x.shape[-1] not in channels:
        want = " or ".join(str(c) for c in channels)
        raise DnnbindValueError(f"{op}: expected {want} channels (the last axis), got shape {x.shape}")


def saturate(val: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 results back to ``dtype`` as MXNet's image ops store them: integers clamped to their range and
    truncated toward zero (uint8: 254.9 -> 254), floats neither clamped nor rounded."""
    dtype = np.dtype(dtype)
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        return np.clip(val, info.min, info.max).astype(dtype)
    return val.astype(dtype, copy=False)


def _axis_weights(n_out: int, n_in: int, nearest: bool):
    """Source indices and weights along one axis (OpenCV's INTER_LINEAR / INTER_NEAREST pixel-centre rule)."""
    scale = n_in / n_out
    if nearest:
        i0 = np.minimum((np.arange(n_out) * scale).astype(np.int64), n_in - 1)
        return i0, i0, np.zeros(n_out, np.float32)
    src = np.maximum((np.arange(n_out) + 0.5) * scale - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, (src - i0).astype(np.float32)


def resize_hwc(x: np.ndarray, oh: int, ow: int, interpolation: int = 1) -> np.ndarray:
    """Resize (..., H, W, C) to (..., oh, ow, C): ``interpolation`` 0 nearest, anything else bilinear with
    OpenCV's pixel-centre rule. The dtype is kept; integer results are rounded to nearest and clamped."""
    h, w = x.shape[-3], x.shape[-2]
    if (oh, ow) == (h, w):
        return x.copy()
    nearest = interpolation == 0
    r0, r1, fr = _axis_weights(oh, h, nearest)
    c0, c1, fc = _axis_weights(ow, w, nearest)
    xf = x.astype(np.float32, copy=False)
    top = xf[..., r0, :, :] * (1 - fr)[:, None, None] + xf[..., r1, :, :] * fr[:, None, None]
    out = top[..., c0, :] * (1 - fc)[:, None] + top[..., c1, :] * fc[:, None]
    if x.dtype.kind in "ui":
        info = np.iinfo(x.dtype)
        return np.clip(np.rint(out), info.min, info.max).astype(x.dtype)
    return out.astype(x.dtype, copy=False)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def size_pair(op: str, size: Any) -> tuple[int, int]:
    """An int or (width, height) as (width, height), both positive."""
    pair = (size, size) if _is_int(size) else size
    if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2 \
            or not all(_is_int(v) for v in pair):
        raise DnnbindTypeError(f"{op}: size must be an int or (width, height) of ints, got {size!r}")
    w, h = (int(v) for v in pair)
    if w <= 0 or h <= 0:
        raise DnnbindValueError(f"{op}: size must be positive, got {size!r}")
    return w, h


def per_image(x: np.ndarray, fn) -> np.ndarray:
    """``fn`` on one image, or on each image of a batch in turn (so random draws happen in image order)."""
    if x.ndim == 3:
        return fn(x)
    return np.stack([fn(img) for img in x]) if len(x) else x.copy()
