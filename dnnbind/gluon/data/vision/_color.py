"""Colour jitters with MXNet 1.x semantics: RandomBrightness, RandomContrast, RandomSaturation, RandomHue,
RandomColorJitter, RandomLighting (re-exported by transforms.py).

Layer: gluon: data; imports numpy (and dnnbind.runtime lazily through _image).

The formulas are those of MXNet's ``src/operator/image/image_random-inl.h``, in float32 as there:
  brightness  out = x * a
  contrast    out = x * a + (1 - a) * mean(gray),  gray = 0.299 R + 0.587 G + 0.114 B (1 channel: x itself)
  saturation  out = x * a + (1 - a) * gray         (per pixel)
  hue         RGB -> HLS (on x / 255), h += a * 360 degrees, back to RGB * 255
  lighting    out = x + eigvec @ (alpha * eigval), alpha ~ N(0, alpha_std)^3 (AlexNet's PCA noise)
with a drawn uniformly from [max(0, 1 - v), 1 + v] for the single jitters. Results are stored back in the
input's dtype as MXNet stores them: integers clamped to their range and truncated (uint8 254.9 -> 254), floats
unclamped. Images are (H, W, C) with C = 1 or 3 (hue, saturation and lighting leave one channel unchanged), or
(N, H, W, C) batches, each image drawing its own factors in turn from numpy's global generator.

Deviation: MXNet 1.x's saturation computes ``gray = x[c] * coef[c]`` in a loop that assigns instead of adding,
so its "gray" is 0.114 * B alone; dnnbind uses the full weighted sum, which is what the coefficients are for.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers
from typing import Any

import numpy as np

from ._image import check_image, host, like_input, per_image, saturate

__all__ = ["RandomBrightness", "RandomColorJitter", "RandomContrast", "RandomHue", "RandomLighting",
           "RandomSaturation"]

GRAY = np.array([0.299, 0.587, 0.114], np.float32)
# AlexNet's RGB eigenvectors (columns) scaled by their eigenvalues (55.46, 4.794, 1.148), as MXNet stores them.
EIG = (np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
       * np.array([55.46, 4.794, 1.148])).astype(np.float32)
# For sectors 0-5 of the hue circle: which of (p2, p1, rising, falling) is R, G, B (MXNet's c_HlsSectorData).
_SECTOR_RGB = np.array([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])


# ---- the adjustments, on one float32 (H, W, C) image ------------------------------------------------------

def adjust_brightness(f: np.ndarray, alpha: np.float32) -> np.ndarray:
    return f * alpha


def adjust_contrast(f: np.ndarray, alpha: np.float32) -> np.ndarray:
    gray = f.astype(np.float64) @ GRAY.astype(np.float64) if f.shape[-1] == 3 else f.astype(np.float64)
    beta = (np.float32(1) - alpha) * np.float32(gray.mean() if gray.size else 0.0)
    return f * alpha + beta


def adjust_saturation(f: np.ndarray, alpha: np.float32) -> np.ndarray:
    if f.shape[-1] == 1:
        return f.copy()
    gray = (f @ GRAY)[..., None] * (np.float32(1) - alpha)
    return gray + f * alpha


def rgb_to_hls(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h in degrees [0, 360), l, s) of float32 RGB in [0, 1] (the last axis), MXNet's RGB2HLSConvert."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    vmax, vmin = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    diff, l = vmax - vmin, (vmax + vmin) * np.float32(0.5)
    chroma = diff > np.finfo(np.float32).eps
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(l < 0.5, diff / (vmax + vmin), diff / (np.float32(2) - vmax - vmin))
        k = np.float32(60) / diff
        h = np.where(vmax == r, (g - b) * k, np.where(vmax == g, (b - r) * k + np.float32(120),
                                                      (r - g) * k + np.float32(240)))
    h = np.where(h < 0, h + np.float32(360), h)
    zero = np.float32(0)
    return np.where(chroma, h, zero), l, np.where(chroma, s, zero)


def hls_to_rgb(h: np.ndarray, l: np.ndarray, s: np.ndarray) -> np.ndarray:
    """float32 RGB in [0, 1] (stacked on a new last axis) from hue in degrees (any value), lightness,
    saturation: MXNet's HLS2RGBConvert."""
    p2 = np.where(l <= 0.5, l * (np.float32(1) + s), l + s - l * s)
    p1 = np.float32(2) * l - p2
    h = h * np.float32(1.0 / 60.0)
    h = h - np.float32(6) * np.floor(h / np.float32(6))
    h = np.where(h >= 6, h - np.float32(6), h)
    sector = np.clip(h.astype(np.int64), 0, 5)
    frac = h - sector
    table = [p2, p1, p1 + (p2 - p1) * (np.float32(1) - frac), p1 + (p2 - p1) * frac]
    rgb = [np.where(s != 0, np.choose(_SECTOR_RGB[sector, c], table), l) for c in range(3)]
    return np.stack(rgb, axis=-1).astype(np.float32, copy=False)


def adjust_hue(f: np.ndarray, alpha: np.float32) -> np.ndarray:
    if f.shape[-1] == 1:
        return f.copy()  # MXNet leaves a one-channel output unwritten; the image unchanged is what it means
    h, l, s = rgb_to_hls(f / np.float32(255))
    return hls_to_rgb(h + alpha * np.float32(360), l, s) * np.float32(255)


def adjust_lighting(f: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    if f.shape[-1] == 1:
        return f.copy()
    return f + EIG @ alpha.astype(np.float32)


# ---- the transforms ---------------------------------------------------------------------------------------

def _amount(op: str, name: str, v: Any) -> float:
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise DnnbindTypeError(f"{op}: {name} must be a number >= 0, got {v!r} ({type(v).__name__})")
    if not 0 <= v < float("inf"):
        raise DnnbindValueError(f"{op}: {name} must be a number >= 0, got {v!r}")
    return float(v)


def _uniform(lo: float, hi: float) -> np.float32:
    return np.float32(np.random.uniform(lo, hi))


class _ColorTransform:
    """One random adjustment per image: ``_draw()`` its parameter, ``_adjust(float32 image, parameter)``."""

    batchable = True
    _random = True

    def _draw(self):
        raise NotImplementedError

    def _adjust(self, f: np.ndarray, param) -> np.ndarray:
        raise NotImplementedError

    def _one(self, img: np.ndarray) -> np.ndarray:
        return saturate(self._adjust(img.astype(np.float32), self._draw()), img.dtype)

    def __call__(self, x: Any) -> Any:
        a = host(x)
        check_image(type(self).__name__, a, (1, 3))
        return like_input(per_image(a, self._one), x)


class _RandomFactor(_ColorTransform):
    """A factor drawn uniformly from [max(0, 1 - v), 1 + v]."""

    _arg = ""

    def __init__(self, amount: float) -> None:
        v = _amount(type(self).__name__, self._arg, amount)
        setattr(self, self._arg, v)
        self._range = (max(0.0, 1.0 - v), 1.0 + v)

    def _draw(self):
        return _uniform(*self._range)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self, self._arg)})"


class RandomBrightness(_RandomFactor):
    """Scale the pixels by a factor drawn from [max(0, 1 - brightness), 1 + brightness]."""

    _arg = "brightness"

    def _adjust(self, f, a):
        return adjust_brightness(f, a)


class RandomContrast(_RandomFactor):
    """Blend with the image's mean gray level by a factor drawn from [max(0, 1 - contrast), 1 + contrast]."""

    _arg = "contrast"

    def _adjust(self, f, a):
        return adjust_contrast(f, a)


class RandomSaturation(_RandomFactor):
    """Blend with each pixel's gray level by a factor drawn from [max(0, 1 - saturation), 1 + saturation]."""

    _arg = "saturation"

    def _adjust(self, f, a):
        return adjust_saturation(f, a)


class RandomHue(_RandomFactor):
    """Rotate the hue by a * 360 degrees, a drawn from [max(0, 1 - hue), 1 + hue] (as MXNet does: a whole turn
    is no change, so hue=0.5 turns by up to half a turn either way)."""

    _arg = "hue"

    def _adjust(self, f, a):
        return adjust_hue(f, a)


class RandomColorJitter(_ColorTransform):
    """Brightness, contrast, saturation and hue jitters in a random order (each image its own order): a factor
    1 + U(-v, v) for the first three and a hue turn of U(-hue, hue) * 360 degrees; a 0 skips that jitter. Each
    step is stored in the image's dtype before the next, as MXNet does."""

    def __init__(self, brightness: float = 0, contrast: float = 0, saturation: float = 0, hue: float = 0) -> None:
        self.amounts = tuple(_amount("RandomColorJitter", n, v) for n, v in
                             (("brightness", brightness), ("contrast", contrast), ("saturation", saturation),
                              ("hue", hue)))

    def _one(self, img: np.ndarray) -> np.ndarray:
        out = img
        for k in np.random.permutation(4):
            v = self.amounts[k]
            if v > 0:
                f = out.astype(np.float32)
                if k == 3:
                    f = adjust_hue(f, _uniform(-v, v))
                else:
                    f = (adjust_brightness, adjust_contrast, adjust_saturation)[k](f, np.float32(1) + _uniform(-v, v))
                out = saturate(f, img.dtype)
        return out.copy() if out is img else out

    def __repr__(self) -> str:
        b, c, s, h = self.amounts
        return f"RandomColorJitter(brightness={b}, contrast={c}, saturation={s}, hue={h})"


class RandomLighting(_ColorTransform):
    """AlexNet-style PCA lighting noise: add eigvec @ (alpha * eigval) to every pixel, alpha ~ N(0, alpha)^3
    (``alpha`` is the noise's standard deviation, MXNet's ``alpha_std``)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = _amount("RandomLighting", "alpha", alpha)

    def _draw(self):
        return np.random.normal(0.0, self.alpha, 3).astype(np.float32)

    def _adjust(self, f, alpha):
        return adjust_lighting(f, alpha)

    def __repr__(self) -> str:
        return f"RandomLighting({self.alpha})"
