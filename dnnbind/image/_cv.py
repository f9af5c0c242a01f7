"""OpenCV's geometric and color kernels on numpy images: resize (all five ``interp`` codes), copyMakeBorder,
warpAffine and the HLS round trip. Layer: beside runtime (host image math); imports numpy, and ``cv2`` when it
imports (the same backend choice as dnnbind.imagecodec).

MXNet does all of this with OpenCV, so with ``cv2`` installed the results are MXNet's own. Without it, numpy does
the same arithmetic in float32: the pixel-centre conventions, tap counts and border rules are OpenCV's, but OpenCV
computes uint8 images in fixed point, so results may differ from it by a level or two (and INTER_AREA enlargement
and Lanczos are approximated by their float formulas). Images are (H, W) or (H, W, C) arrays of any dtype; the
output has the input's dtype (integers rounded and saturated, as OpenCV's ``saturate_cast``).
"""

from __future__ import annotations

import math

import numpy as np

from .. import imagecodec
from .._lib.errors import DnnbindValueError

INTERP = (0, 1, 2, 3, 4)  # cv::INTER_NEAREST, LINEAR, CUBIC, AREA, LANCZOS4: MXNet passes its code straight through


def cv2_module():
    """The ``cv2`` module when dnnbind.imagecodec decodes with OpenCV, else a false value (numpy does the math)."""
    try:
        return imagecodec.backend() == "cv2" and __import__("cv2")
    except NotImplementedError:  # neither OpenCV nor Pillow: numpy still does geometry
        return None


def _saturate(out: np.ndarray, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(dtype, copy=False)


# -- resize ------------------------------------------------------------------------------------------------------

def _taps(n_out: int, n_in: int, interp: int) -> np.ndarray:
    """The (n_out, n_in) float32 matrix that resamples one axis as cv::resize does (border: replicate)."""
    scale = n_in / n_out
    m = np.zeros((n_out, n_in), np.float64)
    rows = np.arange(n_out)
    if interp == 0:  # nearest: floor(dst * scale), no half-pixel shift (OpenCV's own, unlike PIL's)
        m[rows, np.minimum(np.floor(rows * scale).astype(np.int64), n_in - 1)] = 1.0
        return m.astype(np.float32)
    if interp == 3 and scale >= 1.0:  # area shrink: each output pixel averages the input interval it covers
        for d in rows:
            lo, hi = d * scale, (d + 1) * scale
            for s in range(int(math.floor(lo)), min(int(math.ceil(hi)), n_in)):
                m[d, s] = (min(hi, s + 1) - max(lo, s)) / scale
        return m.astype(np.float32)
    if interp == 3:  # area enlarge: OpenCV's linear variant that keeps whole input pixels where it can
        sx = np.floor(rows * scale).astype(np.int64)
        fx = (rows + 1) - (sx + 1) / scale
        fx = np.where(fx <= 0, 0.0, fx - np.floor(fx))
        taps = [(sx, 1 - fx), (sx + 1, fx)]
    else:
        src = (rows + 0.5) * scale - 0.5
        sx = np.floor(src).astype(np.int64)
        fx = src - sx
        if interp == 1:  # linear: clamp the position itself at both borders, as OpenCV does
            fx = np.where(sx < 0, 0.0, fx)
            sx = np.maximum(sx, 0)
            fx = np.where(sx >= n_in - 1, 0.0, fx)
            taps = [(sx, 1 - fx), (sx + 1, fx)]
        elif interp == 2:  # cubic, A = -0.75 (OpenCV's, not the -0.5 of PIL)
            a = -0.75
            x = [fx + 1, fx, 1 - fx, 2 - fx]
            w = [((a * t - 5 * a) * t + 8 * a) * t - 4 * a for t in (x[0],)]
            w += [((a + 2) * t - (a + 3)) * t * t + 1 for t in (x[1], x[2])]
            w += [((a * x[3] - 5 * a) * x[3] + 8 * a) * x[3] - 4 * a]
            taps = [(sx - 1 + k, w[k]) for k in range(4)]
        else:  # Lanczos4: 8 taps of sinc(x) sinc(x / 4), normalised to sum 1
            ks = [np.where(np.abs(fx + 3 - k) < 1e-12, 1.0, 0.0) for k in range(8)]
            w = []
            for k in range(8):
                t = (fx + 3 - k) * np.pi
                with np.errstate(invalid="ignore", divide="ignore"):
                    v = 4 * np.sin(t) * np.sin(t / 4) / (t * t)
                w.append(np.where(ks[k] > 0, 1.0, v))
            total = sum(w)
            taps = [(sx - 3 + k, w[k] / total) for k in range(8)]
    for idx, wt in taps:
        np.add.at(m, (rows, np.clip(idx, 0, n_in - 1)), wt)
    return m.astype(np.float32)


def resize(img: np.ndarray, w: int, h: int, interp: int = 1) -> np.ndarray:
    """``cv2.resize(img, (w, h), interpolation=interp)``."""
    if interp not in INTERP:
        raise DnnbindValueError(f"interp must be 0 (nearest), 1 (bilinear), 2 (bicubic), 3 (area) or 4 (Lanczos), "
                                f"got {interp!r}")
    if w <= 0 or h <= 0:
        raise DnnbindValueError(f"resize needs a positive size, got w={w}, h={h}")
    cv2 = cv2_module()
    if cv2:
        out = cv2.resize(img, (int(w), int(h)), interpolation=int(interp))
        return out[:, :, None] if img.ndim == 3 and out.ndim == 2 else out  # cv2 drops a 1-channel axis
    if (img.shape[0], img.shape[1]) == (h, w):
        return img.copy()
    src = img.astype(np.float32)
    out = np.tensordot(_taps(h, img.shape[0], interp), src, axes=(1, 0))       # rows
    out = np.moveaxis(np.tensordot(_taps(w, img.shape[1], interp), out, axes=(1, 1)), 0, 1)  # columns
    return _saturate(out, img.dtype)


# -- borders, affine warps ----------------------------------------------------------------------------------------

_PAD_MODES = {0: "constant", 1: "edge", 2: "symmetric", 3: "wrap", 4: "reflect"}  # cv::BORDER_* -> np.pad


def copy_make_border(img: np.ndarray, top: int, bot: int, left: int, right: int, border: int = 0,
                     value: float = 0.0, values=()) -> np.ndarray:
    """``cv2.copyMakeBorder``: ``border`` 0 constant (``values`` per channel, else ``value``), 1 replicate,
    2 reflect, 3 wrap, 4 reflect-101; the flag 16 (BORDER_ISOLATED) is ignored, as it is for a whole image."""
    mode = _PAD_MODES.get(int(border) & ~16)
    if mode is None:
        raise DnnbindValueError(f"copyMakeBorder: type must be 0-4 (cv::BORDER_*), optionally | 16, got {border!r}")
    if min(top, bot, left, right) < 0:
        raise DnnbindValueError(f"copyMakeBorder: borders must be >= 0, got {(top, bot, left, right)}")
    spec = [(top, bot), (left, right)] + [(0, 0)] * (img.ndim - 2)
    if mode != "constant":
        return np.pad(img, spec, mode=mode)
    out = np.pad(img, spec, mode="constant")
    fill = np.zeros(img.shape[2] if img.ndim == 3 else 1, np.float64)
    vals = list(values) if len(values) else [value] * fill.size
    fill[:min(len(vals), fill.size)] = vals[:fill.size]
    mask = np.ones(out.shape[:2], bool)
    mask[top:top + img.shape[0], left:left + img.shape[1]] = False
    out[mask] = _saturate(fill, img.dtype) if img.ndim == 3 else _saturate(fill[:1], img.dtype)[0]
    return out


def warp_affine(img: np.ndarray, m: np.ndarray, w: int, h: int, interp: int, fill: float) -> np.ndarray:
    """``cv2.warpAffine(img, m, (w, h), interp, BORDER_CONSTANT, fill)``: dst(x, y) = src(M^-1 (x, y))."""
    cv2 = cv2_module()
    if cv2:
        out = cv2.warpAffine(img, m.astype(np.float32), (int(w), int(h)), flags=int(interp),
                             borderMode=cv2.BORDER_CONSTANT, borderValue=(fill, fill, fill, fill))
        return out[:, :, None] if img.ndim == 3 and out.ndim == 2 else out
    full = np.vstack([m.astype(np.float64), [0.0, 0.0, 1.0]])
    inv = np.linalg.inv(full)[:2]
    ys, xs = np.mgrid[0:int(h), 0:int(w)].astype(np.float64)
    sx = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
    sy = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    src = img[:, :, None] if img.ndim == 2 else img
    hh, ww = src.shape[:2]
    out = np.full((int(h), int(w), src.shape[2]), float(fill), np.float32)
    if interp == 0:
        xi, yi = np.rint(sx).astype(np.int64), np.rint(sy).astype(np.int64)
        ok = (xi >= 0) & (xi < ww) & (yi >= 0) & (yi < hh)
        out[ok] = src[yi[ok], xi[ok]]
    else:  # bilinear (other codes are approximated by it); outside samples take the fill value
        x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
        fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
        acc = np.zeros_like(out)
        for dy, dx, wt in ((0, 0, (1 - fx) * (1 - fy)), (0, 1, fx * (1 - fy)), (1, 0, (1 - fx) * fy),
                           (1, 1, fx * fy)):
            xi, yi = x0 + dx, y0 + dy
            ok = (xi >= 0) & (xi < ww) & (yi >= 0) & (yi < hh)
            px = np.full(out.shape, float(fill), np.float32)
            px[ok] = src[yi[ok], xi[ok]]
            acc += wt * px
        out = acc
    out = _saturate(out, img.dtype)
    return out[:, :, 0] if img.ndim == 2 else out


# -- color: OpenCV's 8-bit BGR <-> HLS (H in [0, 180), L and S in [0, 255]) ------------------------------------

def bgr_to_hls(img: np.ndarray) -> np.ndarray:
    cv2 = cv2_module()
    if cv2:
        return cv2.cvtColor(img, cv2.COLOR_BGR2HLS)
    b, g, r = [img[..., k].astype(np.float32) / 255 for k in range(3)]
    vmax, vmin = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    diff, l_ = vmax - vmin, (vmax + vmin) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(diff == 0, 0, np.where(l_ < 0.5, diff / (vmax + vmin), diff / (2 - vmax - vmin)))
        dz = np.where(diff == 0, 1, diff)
        hh = np.where(vmax == r, (g - b) * 60 / dz, np.where(vmax == g, (b - r) * 60 / dz + 120,
                                                             (r - g) * 60 / dz + 240))
    hh = np.where(diff == 0, 0, np.where(hh < 0, hh + 360, hh))
    return _saturate(np.stack([hh / 2, l_ * 255, s * 255], axis=-1), np.uint8)


def hls_to_bgr(img: np.ndarray) -> np.ndarray:
    cv2 = cv2_module()
    if cv2:
        return cv2.cvtColor(img, cv2.COLOR_HLS2BGR)
    hh = img[..., 0].astype(np.float32) * 2
    l_, s = img[..., 1].astype(np.float32) / 255, img[..., 2].astype(np.float32) / 255
    c = (1 - np.abs(2 * l_ - 1)) * s
    hp = (hh % 360) / 60
    x = c * (1 - np.abs(hp % 2 - 1))
    zero = np.zeros_like(c)
    sector = np.floor(hp).astype(np.int64) % 6
    rgb = [np.choose(sector, opts) for opts in ((c, x, zero, zero, x, c), (x, c, c, x, zero, zero),
                                                (zero, zero, x, c, c, x))]
    m = l_ - c / 2
    return _saturate(np.stack([rgb[2] + m, rgb[1] + m, rgb[0] + m], axis=-1) * 255, np.uint8)
