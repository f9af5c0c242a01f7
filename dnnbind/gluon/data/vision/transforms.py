"""Image transforms with MXNet Gluon semantics: ToTensor, Normalize, Cast, Resize, Compose.

Layer: gluon: data; imports numpy and dnnbind.runtime only (here: numpy only).

MXNet's transforms are HybridBlocks over NDArrays; data loading here happens on the host, so these are plain
callables over numpy arrays (an object with .asnumpy() is converted first). Each one accepts a single image
or a batch and gives the same numbers either way; `batchable = True` tells the DataLoader it may apply the
transform once to a stacked batch instead of once per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _host(x: Any) -> np.ndarray:
    if hasattr(x, "asnumpy"):
        return x.asnumpy()
    return np.asarray(x)


class ToTensor:
    """uint8 (H, W, C) -> float32 (C, H, W) in [0, 1]; a batch (N, H, W, C) -> (N, C, H, W).

    Divides by 255 exactly as MXNet and torchvision do (float32 division, not a multiply by 1/255), so the
    per-sample, batched and device loaders all produce bit-identical values.
    """

    batchable = True

    def __call__(self, x: Any) -> np.ndarray:
        x = _host(x)
        if x.ndim == 3:
            axes = (2, 0, 1)
        elif x.ndim == 4:
            axes = (0, 3, 1, 2)
        else:
            raise ValueError(f"ToTensor: expected an image (H, W, C) or a batch (N, H, W, C), got shape {x.shape}")
        # Transpose the (small) uint8 first, then one converting copy and an in-place divide.
        out = np.ascontiguousarray(np.transpose(x, axes), dtype=np.float32)
        if np.may_share_memory(out, x):  # float32 input already laid out as CHW: never divide the caller's data
            out = out.copy()
        out /= np.float32(255.0)
        return out

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """(x - mean[c]) / std[c] per channel on (C, H, W) or (N, C, H, W) float input; mean/std scalar or per-channel."""

    batchable = True

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0) -> None:
        self._mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self._std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
        self.mean, self.std = mean, std

    def __call__(self, x: Any) -> np.ndarray:
        x = _host(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"Normalize: expected (C, H, W) or (N, C, H, W), got shape {x.shape}")
        c = x.shape[-3]
        for name, v in (("mean", self._mean), ("std", self._std)):
            if v.shape[0] not in (1, c):
                raise ValueError(f"Normalize: {name} has {v.shape[0]} values for {c} channels")
        return ((x.astype(np.float32, copy=False) - self._mean) / self._std).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


class Cast:
    """Cast to a dtype (default float32)."""

    batchable = True

    def __init__(self, dtype: Any = "float32") -> None:
        self.dtype = np.dtype(dtype)

    def __call__(self, x: Any) -> np.ndarray:
        return _host(x).astype(self.dtype)

    def __repr__(self) -> str:
        return f"Cast({self.dtype})"


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


class Resize:
    """Resize an (H, W, C) image or an (N, H, W, C) batch to ``size`` = (width, height) or an int (a square, or
    with ``keep_ratio`` the shorter side). ``interpolation`` 0 is nearest, anything else bilinear with OpenCV's
    pixel-centre rule (MXNet resizes with OpenCV; uint8 results may differ from it by one level of rounding).
    The dtype is kept (uint8 is rounded back)."""

    batchable = True

    def __init__(self, size: int | Sequence[int], keep_ratio: bool = False, interpolation: int = 1) -> None:
        if isinstance(size, (int, np.integer)):
            size = int(size)
            if size <= 0:
                raise ValueError(f"Resize: size must be positive, got {size}")
        else:
            size = tuple(int(v) for v in size)
            if len(size) != 2 or min(size) <= 0:
                raise ValueError(f"Resize: size must be an int or (width, height) with positive values, got {size}")
        self.size, self.keep_ratio, self.interpolation = size, bool(keep_ratio), int(interpolation)

    def _target(self, h: int, w: int) -> tuple[int, int]:
        if isinstance(self.size, tuple):
            return self.size[1], self.size[0]
        if not self.keep_ratio:
            return self.size, self.size
        if h < w:
            return self.size, max(1, int(round(w * self.size / h)))
        return max(1, int(round(h * self.size / w))), self.size

    def __call__(self, x: Any) -> np.ndarray:
        x = _host(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"Resize: expected an image (H, W, C) or a batch (N, H, W, C), got shape {x.shape}")
        h, w = x.shape[-3], x.shape[-2]
        oh, ow = self._target(h, w)
        if (oh, ow) == (h, w):
            return x.copy()
        nearest = self.interpolation == 0
        r0, r1, fr = _axis_weights(oh, h, nearest)
        c0, c1, fc = _axis_weights(ow, w, nearest)
        xf = x.astype(np.float32, copy=False)
        top = xf[..., r0, :, :] * (1 - fr)[:, None, None] + xf[..., r1, :, :] * fr[:, None, None]
        out = top[..., c0, :] * (1 - fc)[:, None] + top[..., c1, :] * fc[:, None]
        if x.dtype.kind in "ui":
            info = np.iinfo(x.dtype)
            return np.clip(np.rint(out), info.min, info.max).astype(x.dtype)
        return out.astype(x.dtype, copy=False)

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, keep_ratio={self.keep_ratio}, interpolation={self.interpolation})"


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    @property
    def batchable(self) -> bool:
        return all(getattr(t, "batchable", False) for t in self.transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"
