"""Crops and flips with MXNet 1.x semantics: CenterCrop, CropResize, RandomResizedCrop, RandomFlipLeftRight,
RandomFlipTopBottom (re-exported by transforms.py).

Layer: gluon: data; imports numpy (and dnnbind.runtime lazily through _image).

Inputs are (H, W, C) images or (N, H, W, C) batches, numpy or NDArray. Sizes are (width, height) as in MXNet.
Randomness comes from numpy's global generator (``mx.random.seed`` seeds it), drawn image by image, so a batch
gives what its images give one at a time. Resizing is ``interpolation`` 0 nearest, anything else bilinear
(MXNet hands 2/3/4 to OpenCV's bicubic/area/Lanczos; see Resize).
"""

from __future__ import annotations

from ...._lib.errors import DnnbindTypeError, DnnbindValueError

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._image import check_image, host, like_input, per_image, resize_hwc, size_pair

__all__ = ["CenterCrop", "CropResize", "RandomFlipLeftRight", "RandomFlipTopBottom", "RandomResizedCrop"]

_INTERP = (0, 1, 2, 3, 4, 9, 10)  # MXNet's codes (OpenCV's, plus 9 auto and 10 random)


def check_interpolation(op: str, interpolation: Any) -> int:
    """``interpolation`` as an int, one of MXNet's codes; a TypeError or ValueError naming ``op`` otherwise."""
    if isinstance(interpolation, bool) or not isinstance(interpolation, (int, np.integer)):
        raise DnnbindTypeError(f"{op}: interpolation must be an int, one of {_INTERP}, got {interpolation!r}")
    if interpolation not in _INTERP:
        raise DnnbindValueError(f"{op}: unknown interpolation {interpolation!r}; expected one of {_INTERP}")
    return int(interpolation)


def scale_down(src_size: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """MXNet's ``image.scale_down`` (``mx.image.scale_down`` is this function): shrink a (w, h) crop, keeping its
    aspect ratio, until it fits (sw, sh)."""
    w, h = size
    sw, sh = src_size
    if sh < h:
        w, h = float(w * sh) / h, sh
    if sw < w:
        w, h = sw, float(h * sw) / w
    return int(w), int(h)


def fixed_crop(x: np.ndarray, x0: int, y0: int, w: int, h: int, size: tuple[int, int] | None,
               interpolation: int) -> np.ndarray:
    """The (w, h) window at (x0, y0) of (..., H, W, C), resized to ``size`` (width, height) if it differs."""
    out = x[..., y0:y0 + h, x0:x0 + w, :]
    if size is not None and (w, h) != tuple(size):
        return resize_hwc(out, size[1], size[0], interpolation)
    return out.copy()


class CenterCrop:
    """Crop the centre (width, height) = ``size`` window (an int: a square); an image smaller than ``size`` is
    cropped to the largest window of that aspect ratio and upsampled to ``size``."""

    batchable = True

    def __init__(self, size: int | Sequence[int], interpolation: int = 1) -> None:
        self.size = size_pair("CenterCrop", size)
        self.interpolation = check_interpolation("CenterCrop", interpolation)

    def __call__(self, x: Any) -> Any:
        a = host(x)
        check_image("CenterCrop", a)
        h, w = a.shape[-3], a.shape[-2]
        nw, nh = (max(1, v) for v in scale_down((w, h), self.size))  # never an empty crop (MXNet's can be)
        out = fixed_crop(a, int((w - nw) / 2), int((h - nh) / 2), nw, nh, self.size, self.interpolation)
        return like_input(out, x)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size}, interpolation={self.interpolation})"


class CropResize:
    """Crop the (width, height) window whose top-left corner is (x, y), then resize it to ``size`` (an int or
    (width, height)) if given. ``interpolation=None`` is bilinear (MXNet 1.9 fails on None with a size)."""

    batchable = True

    def __init__(self, x: int, y: int, width: int, height: int, size: int | Sequence[int] | None = None,
                 interpolation: int | None = None) -> None:
        for name, v in (("x", x), ("y", y), ("width", width), ("height", height)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise DnnbindTypeError(f"CropResize: {name} must be an int, got {v!r}")
        if width <= 0 or height <= 0 or x < 0 or y < 0:
            raise DnnbindValueError(f"CropResize: need x, y >= 0 and width, height > 0, got x={x}, y={y}, "
                             f"width={width}, height={height}")
        self._box = (int(x), int(y), int(width), int(height))
        self.size = None if size is None else size_pair("CropResize", size)
        self.interpolation = 1 if interpolation is None else check_interpolation("CropResize", interpolation)

    def __call__(self, x: Any) -> Any:
        a = host(x)
        check_image("CropResize", a)
        x0, y0, w, h = self._box
        if x0 + w > a.shape[-2] or y0 + h > a.shape[-3]:
            raise DnnbindValueError(f"CropResize: the window x={x0}, y={y0}, width={w}, height={h} does not fit in an "
                             f"image of shape {a.shape} (H, W = {a.shape[-3]}, {a.shape[-2]})")
        return like_input(fixed_crop(a, x0, y0, w, h, self.size, self.interpolation), x)

    def __repr__(self) -> str:
        x, y, w, h = self._box
        return f"CropResize(x={x}, y={y}, width={w}, height={h}, size={self.size})"


class RandomResizedCrop:
    """Crop a random window, then resize it to ``size`` ((width, height) or an int).

    MXNet's ``image.random_size_crop``: up to 10 tries draw an area fraction uniformly from ``scale`` and an
    aspect ratio (width / height) log-uniformly from ``ratio``; the first window that fits is placed uniformly
    at random. If none fits, the centre crop of ``size``'s aspect ratio is used.
    """

    batchable = True
    _random = True

    def __init__(self, size: int | Sequence[int], scale: float | Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), interpolation: int = 1) -> None:
        self.size = size_pair("RandomResizedCrop", size)
        if isinstance(scale, numbers.Real):
            scale = (scale, 1.0)
        for name, pair in (("scale", scale), ("ratio", ratio)):
            if isinstance(pair, (str, bytes)) or not hasattr(pair, "__iter__") or not all(
                    isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair):
                raise DnnbindTypeError(f"RandomResizedCrop: {name} must be a pair of numbers, got {pair!r}")
        self.scale = tuple(float(v) for v in scale)
        self.ratio = tuple(float(v) for v in ratio)
        if not all(math.isfinite(v) for v in self.scale + self.ratio):
            raise DnnbindValueError(f"RandomResizedCrop: scale and ratio must be finite, got {scale!r}, {ratio!r}")
        if len(self.scale) != 2 or min(self.scale) <= 0:
            raise DnnbindValueError(f"RandomResizedCrop: scale must be (min_area, max_area) > 0, got {scale!r}")
        if len(self.ratio) != 2 or min(self.ratio) <= 0:
            raise DnnbindValueError(f"RandomResizedCrop: ratio must be (min, max) aspect ratios > 0, got {ratio!r}")
        self.interpolation = check_interpolation("RandomResizedCrop", interpolation)

    def window(self, h: int, w: int) -> tuple[int, int, int, int]:
        """Draw one crop window (x0, y0, width, height) for an h x w image."""
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = np.random.uniform(*self.scale) * h * w
            new_ratio = math.exp(np.random.uniform(*log_ratio))
            nw = round(math.sqrt(target_area * new_ratio))
            nh = round(math.sqrt(target_area / new_ratio))
            if 0 < nw <= w and 0 < nh <= h:  # MXNet tests only the upper bounds; a 0-pixel window is unusable
                return np.random.randint(0, w - nw + 1), np.random.randint(0, h - nh + 1), nw, nh
        nw, nh = (max(1, v) for v in scale_down((w, h), self.size))  # never an empty crop (MXNet's can be)
        return int((w - nw) / 2), int((h - nh) / 2), nw, nh

    def __call__(self, x: Any) -> Any:
        a = host(x)
        check_image("RandomResizedCrop", a)

        def one(img):
            x0, y0, w, h = self.window(img.shape[0], img.shape[1])
            return fixed_crop(img, x0, y0, w, h, self.size, self.interpolation)
        return like_input(per_image(a, one), x)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class _RandomFlip:
    batchable = True
    _random = True  # draws from numpy's generator (Compose keeps per-image draw order for two or more)
    _axis = 0  # the image axis flipped: 0 rows (top-bottom), 1 columns (left-right)

    def __call__(self, x: Any) -> Any:
        a = host(x)
        check_image(type(self).__name__, a)
        # One draw per image, in order: rand(N) gives the same numbers as N calls of rand().
        flip = np.random.rand(*a.shape[:-3]) < 0.5
        if a.ndim == 3:
            out = np.flip(a, self._axis).copy() if flip else a.copy()
        else:
            out = a.copy()
            out[flip] = np.flip(a[flip], self._axis + 1)
        return like_input(out, x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomFlipLeftRight(_RandomFlip):
    """Mirror the image left to right with probability 0.5 (each image of a batch on its own draw)."""

    _axis = 1


class RandomFlipTopBottom(_RandomFlip):
    """Flip the image top to bottom with probability 0.5 (each image of a batch on its own draw)."""

    _axis = 0
