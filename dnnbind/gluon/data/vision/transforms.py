"""Image transforms with MXNet Gluon semantics (mxnet.gluon.data.vision.transforms).

Layer: gluon: data; imports numpy and dnnbind.runtime only (the runtime lazily).

MXNet's transforms are HybridBlocks over NDArrays; data loading here happens on the host, so these are plain
callables over numpy arrays. An NDArray input gives an NDArray result (on the input's device), a numpy input
gives numpy. Each one accepts a single image or a batch and gives the same numbers either way (the random
ones draw each image's numbers in turn, so a batch equals its images transformed one by one from the same
numpy seed); `batchable = True` tells the DataLoader it may apply the transform once to a stacked batch
instead of once per sample. Here: ToTensor, Normalize, Cast, Resize, Compose; the crops and flips are in
_geometry.py, the colour jitters in _color.py.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindTypeError, DnnbindValueError

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._color import (
    RandomBrightness,
    RandomColorJitter,
    RandomContrast,
    RandomHue,
    RandomLighting,
    RandomSaturation,
)
from ._geometry import (CenterCrop, CropResize, RandomFlipLeftRight, RandomFlipTopBottom, RandomResizedCrop,
                        check_interpolation)
from ._image import check_image, check_numeric, like_input, resize_hwc, size_pair
from ._image import host as _host

__all__ = ["Cast", "CenterCrop", "Compose", "CropResize", "Normalize", "RandomBrightness", "RandomColorJitter",
           "RandomContrast", "RandomFlipLeftRight", "RandomFlipTopBottom", "RandomHue", "RandomLighting",
           "RandomResizedCrop", "RandomSaturation", "Resize", "ToTensor"]


class ToTensor:
    """uint8 (H, W, C) -> float32 (C, H, W) in [0, 1]; a batch (N, H, W, C) -> (N, C, H, W).

    Divides by 255 exactly as MXNet and torchvision do (float32 division, not a multiply by 1/255), so the
    per-sample, batched and device loaders all produce bit-identical values.
    """

    batchable = True

    def __call__(self, x: Any) -> Any:
        x_in, x = x, _host(x)
        check_image("ToTensor", x)
        axes = (2, 0, 1) if x.ndim == 3 else (0, 3, 1, 2)
        # Transpose the (small) uint8 first, then one converting copy and an in-place divide.
        out = np.ascontiguousarray(np.transpose(x, axes), dtype=np.float32)
        if np.may_share_memory(out, x):  # float32 input already laid out as CHW: never divide the caller's data
            out = out.copy()
        out /= np.float32(255.0)
        return like_input(out, x_in)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """(x - mean[c]) / std[c] per channel on (C, H, W) or (N, C, H, W) float input; mean/std scalar or per-channel."""

    batchable = True

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0) -> None:
        self._mean, self._std = _per_channel("mean", mean), _per_channel("std", std)
        if not np.all(self._std != 0):
            raise DnnbindValueError(f"Normalize: std must not be 0 (it divides), got {std!r}")
        self.mean, self.std = mean, std

    def __call__(self, x: Any) -> Any:
        x_in, x = x, _host(x)
        check_image("Normalize", x, layout="CHW")
        c = x.shape[-3]
        for name, v in (("mean", self._mean), ("std", self._std)):
            if v.shape[0] not in (1, c):
                raise DnnbindValueError(f"Normalize: {name} has {v.shape[0]} values for {c} channels")
        return like_input(((x.astype(np.float32, copy=False) - self._mean) / self._std).astype(np.float32, copy=False),
                          x_in)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def _per_channel(name: str, v: Any) -> np.ndarray:
    """Normalize's mean or std: a number or a sequence of numbers, as float32 (C, 1, 1)."""
    arr = np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v)
    if arr.dtype.kind not in "iuf" or arr.ndim > 1 or arr.size == 0:
        raise DnnbindTypeError(f"Normalize: {name} must be a number or a sequence of numbers, got {v!r}")
    if not np.all(np.isfinite(arr)):
        raise DnnbindValueError(f"Normalize: {name} must be finite, got {v!r}")
    return arr.astype(np.float32).reshape(-1, 1, 1)


class Cast:
    """Cast to a dtype (default float32)."""

    batchable = True

    def __init__(self, dtype: Any = "float32") -> None:
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise DnnbindTypeError(f"Cast: {dtype!r} is not a dtype") from None
        if self.dtype.kind not in "buif":
            raise DnnbindTypeError(f"Cast: dtype must be a number type (float32, uint8, ...), got {self.dtype}")

    def __call__(self, x: Any) -> Any:
        a = _host(x)
        check_numeric("Cast", a)
        return like_input(a.astype(self.dtype), x)

    def __repr__(self) -> str:
        return f"Cast({self.dtype})"


class Resize:
    """Resize an (H, W, C) image or an (N, H, W, C) batch to ``size`` = (width, height) or an int (a square, or
    with ``keep_ratio`` the shorter side). ``interpolation`` 0 is nearest, anything else bilinear with OpenCV's
    pixel-centre rule (MXNet resizes with OpenCV; uint8 results may differ from it by one level of rounding).
    The dtype is kept (uint8 is rounded back)."""

    batchable = True

    def __init__(self, size: int | Sequence[int], keep_ratio: bool = False, interpolation: int = 1) -> None:
        pair = size_pair("Resize", size)  # checks an int too
        size = pair if not isinstance(size, (int, np.integer)) else int(size)
        self.size, self.keep_ratio = size, bool(keep_ratio)
        self.interpolation = check_interpolation("Resize", interpolation)

    def _target(self, h: int, w: int) -> tuple[int, int]:
        if isinstance(self.size, tuple):
            return self.size[1], self.size[0]
        if not self.keep_ratio:
            return self.size, self.size
        if h < w:
            return self.size, max(1, int(round(w * self.size / h)))
        return max(1, int(round(h * self.size / w))), self.size

    def __call__(self, x: Any) -> Any:
        x_in, x = x, _host(x)
        check_image("Resize", x)
        oh, ow = self._target(x.shape[-3], x.shape[-2])
        return like_input(resize_hwc(x, oh, ow, self.interpolation), x_in)

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, keep_ratio={self.keep_ratio}, interpolation={self.interpolation})"


class Compose:
    """Apply transforms in order. With two or more random transforms, a batch (N, H, W, C) goes through the
    whole chain one image at a time, so each image's draws come in the same order as when it is transformed
    alone (a batched path and a per-sample path then agree for the same seed)."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        if callable(transforms) or not hasattr(transforms, "__iter__"):
            raise DnnbindTypeError(f"Compose: transforms must be a list of transforms, got {transforms!r}")
        self.transforms = list(transforms)
        for i, t in enumerate(self.transforms):
            if not callable(t):
                raise DnnbindTypeError(f"Compose: transforms[{i}] is not callable: {t!r} ({type(t).__name__})")

    @property
    def batchable(self) -> bool:
        return all(getattr(t, "batchable", False) for t in self.transforms)

    @property
    def _random(self) -> bool:  # a Compose inside a Compose counts as random if anything in it is
        return any(getattr(t, "_random", False) for t in self.transforms)

    def _chain(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __call__(self, x: Any) -> Any:
        if sum(bool(getattr(t, "_random", False)) for t in self.transforms) > 1:
            a = _host(x)
            if a.ndim == 4:
                return like_input(np.stack([_host(self._chain(img)) for img in a]), x)
        return self._chain(x)

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"
