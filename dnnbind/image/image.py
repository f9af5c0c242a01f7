"""``mx.image`` of MXNet 1.9.1: image functions, the Python augmenters and ImageIter.

Layer: beside gluon (host data pipeline); imports numpy, dnnbind.imagecodec, dnnbind.recordio, dnnbind.io and
dnnbind.runtime.

Images are NDArrays (H, W, C) on the cpu, uint8 RGB after decoding and float32 after CastAug, as in MXNet. The
arithmetic runs on their numpy copies: each augmenter returns a new NDArray where MXNet's ``*=``/``+=`` also
changed its input in place (no caller of MXNet's own relies on that). Randomness is drawn where MXNet draws it,
in the same order: Python's ``random`` for the crops, flips, jitters, gray and ImageIter's shuffling, numpy's
global generator for LightingAug; so ``random.seed(n); np.random.seed(n)`` gives MXNet's draws (``mx.random.seed``
seeds neither of them in MXNet, and in dnnbind seeds numpy only).

Pixels: decoding and resizing go through OpenCV when it imports (MXNet's own pixels), else Pillow and numpy
(dnnbind.imagecodec, ._cv): PNG pixels are the same, JPEG may differ by a few levels, resizes by a level or two.
"""

from __future__ import annotations

import json
import logging
import os
import random
import warnings
from numbers import Number

import numpy as np

from .. import imagecodec, recordio
from .._lib.errors import DnnbindTypeError, DnnbindValueError
from ..io import DataBatch, DataIter
from ..runtime.array import NDArray, array
from ..runtime.device import cpu
from . import _cv

__all__ = ["Augmenter", "BrightnessJitterAug", "CastAug", "CenterCropAug", "ColorJitterAug", "ColorNormalizeAug",
           "ContrastJitterAug", "CreateAugmenter", "ForceResizeAug", "HorizontalFlipAug", "HueJitterAug",
           "ImageIter", "LightingAug", "RandomCropAug", "RandomGrayAug", "RandomOrderAug", "RandomSizedCropAug",
           "ResizeAug", "SaturationJitterAug", "SequentialAug", "center_crop", "color_normalize", "copyMakeBorder",
           "fixed_crop", "imdecode", "imread", "imresize", "random_crop", "random_size_crop", "resize_short",
           "scale_down"]

_GRAY_COEF = np.array([0.299, 0.587, 0.114], np.float32)  # MXNet's luma weights for the jitters


def host_array(src) -> np.ndarray:
    """The numpy array of an NDArray or an array-like (an image, a label, a mean): a copy for an NDArray."""
    return src.numpy() if isinstance(src, NDArray) else np.asarray(src)


def cpu_ndarray(host: np.ndarray) -> NDArray:
    """A numpy result as the CPU NDArray mx.image returns."""
    return array(np.ascontiguousarray(host), device=cpu())


def _out(result: NDArray, out) -> NDArray:
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape):
        raise DnnbindValueError(f"mx.image: out has shape {tuple(out.shape)}, the result is {tuple(result.shape)}")
    out[:] = result.numpy().astype(out.dtype, copy=False)
    return out


# -- functions ---------------------------------------------------------------------------------------------------

def imdecode(buf, flag: int = 1, to_rgb: bool = True, out=None) -> NDArray:
    """Decode an encoded image: uint8 (H, W, 3) RGB (``to_rgb=False``: BGR), or (H, W, 1) with ``flag=0``."""
    if isinstance(buf, NDArray):
        buf = buf.numpy().astype(np.uint8, copy=False)
    elif not isinstance(buf, (bytes, bytearray, np.ndarray)):
        raise DnnbindValueError("buf must be of type bytes, bytearray or numpy.ndarray, if you would like to "
                                "input type str, please convert to bytes")
    if flag not in (0, 1):
        raise DnnbindValueError(f"imdecode: flag must be 1 (color) or 0 (grayscale), got {flag!r}")
    img = imagecodec.decode(bytes(buf) if not isinstance(buf, np.ndarray) else buf, int(flag))
    if img is None:
        raise DnnbindValueError("imdecode: could not decode the image (the bytes are not a JPEG, PNG or other "
                                "image OpenCV/Pillow reads)")
    img = imagecodec.to_rgb(img) if to_rgb else (img[:, :, None] if img.ndim == 2 else img)
    return _out(cpu_ndarray(img), out)


def imread(filename, flag: int = 1, to_rgb: bool = True, out=None) -> NDArray:
    """Read and decode an image file, as :func:`imdecode`."""
    if flag not in (0, 1):
        raise DnnbindValueError(f"imread: flag must be 1 (color) or 0 (grayscale), got {flag!r}")
    img = imagecodec.imread(filename, int(flag))
    if img is None:
        raise DnnbindValueError(f"imread: cannot read {filename!r} as an image (missing, or not an image)")
    img = imagecodec.to_rgb(img) if to_rgb else (img[:, :, None] if img.ndim == 2 else img)
    return _out(cpu_ndarray(img), out)


def imresize(src, w: int, h: int, interp: int = 1, out=None) -> NDArray:
    """``src`` (H, W, C) resized to (h, w, C) with OpenCV's ``interp`` (0 nearest, 1 bilinear, 2 bicubic,
    3 area, 4 Lanczos), same dtype."""
    img = host_array(src)
    if img.ndim != 3:
        raise DnnbindValueError(f"imresize: src must be (H, W, C), got shape {img.shape}")
    return _out(cpu_ndarray(_cv.resize(img, int(w), int(h), int(interp))), out)


def scale_down(src_size, size) -> tuple:
    """Shrink the crop ``size`` (w, h), keeping its aspect ratio, until it fits ``src_size`` (w, h)."""
    w, h = size
    sw, sh = src_size
    if sh < h:
        w, h = float(w * sh) / h, sh
    if sw < w:
        w, h = sw, float(h * sw) / w
    return int(w), int(h)


def copyMakeBorder(src, top: int, bot: int, left: int, right: int, type: int = 0, value: float = 0.0,  # noqa: A002
                   values=(), out=None) -> NDArray:
    """Pad an image with a border (``type`` is OpenCV's border code; constant takes ``values`` or ``value``)."""
    img = host_array(src)
    return _out(cpu_ndarray(_cv.copy_make_border(img, int(top), int(bot), int(left), int(right), int(type), value,
                                                 tuple(values))), out)


def _get_interp_method(interp: int, sizes: tuple = ()) -> int:
    """MXNet's ``interp`` 9 (auto: cubic to enlarge, area to shrink, else linear) and 10 (random, Python random)."""
    if interp == 9:
        if sizes:
            oh, ow, nh, nw = sizes
            if nh > oh and nw > ow:
                return 2
            if nh < oh and nw < ow:
                return 3
            return 1
        return 2
    if interp == 10:
        return random.randint(0, 4)
    if interp not in (0, 1, 2, 3, 4):
        raise DnnbindValueError(f"Unknown interp method {interp!r}")
    return interp


def resize_short(src, size: int, interp: int = 2) -> NDArray:
    """Resize so the shorter edge is ``size`` (the longer one by integer division, as MXNet)."""
    h, w = src.shape[0], src.shape[1]
    new_h, new_w = (size * h // w, size) if h > w else (size, size * w // h)
    return imresize(src, new_w, new_h, interp=_get_interp_method(interp, (h, w, new_h, new_w)))


def fixed_crop(src, x0: int, y0: int, w: int, h: int, size=None, interp: int = 2) -> NDArray:
    """``src[y0:y0+h, x0:x0+w]``, resized to ``size`` (w, h) when given and different."""
    img = host_array(src)[y0:y0 + h, x0:x0 + w]
    if size is not None and (w, h) != tuple(size):
        sizes = (h, w, size[1], size[0])
        img = _cv.resize(img, int(size[0]), int(size[1]), _get_interp_method(interp, sizes))
    return cpu_ndarray(img)


def random_crop(src, size, interp: int = 2) -> tuple:
    """A crop of ``size`` (w, h) (scaled down to fit) at a random place; (image, (x0, y0, w, h))."""
    h, w = src.shape[0], src.shape[1]
    new_w, new_h = scale_down((w, h), size)
    x0 = random.randint(0, w - new_w)
    y0 = random.randint(0, h - new_h)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def center_crop(src, size, interp: int = 2) -> tuple:
    """The centred crop of ``size`` (w, h) (scaled down to fit, then resized); (image, (x0, y0, w, h))."""
    h, w = src.shape[0], src.shape[1]
    new_w, new_h = scale_down((w, h), size)
    x0, y0 = int((w - new_w) / 2), int((h - new_h) / 2)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def color_normalize(src, mean, std=None) -> NDArray:
    """``(src - mean) / std`` in float (either may be None)."""
    img = host_array(src).astype(np.float32)
    if mean is not None:
        img = img - host_array(mean).astype(np.float32)
    if std is not None:
        img = img / host_array(std).astype(np.float32)
    return cpu_ndarray(img)


def random_size_crop(src, size, area, ratio, interp: int = 2, **kwargs) -> tuple:
    """A crop of random area (fraction ``area`` or range) and aspect ``ratio`` range, resized to ``size``; ten
    tries, then a center crop. (image, (x0, y0, w, h))."""
    h, w = src.shape[0], src.shape[1]
    src_area = h * w
    if "min_area" in kwargs:
        warnings.warn("`min_area` is deprecated. Please use `area` instead.", DeprecationWarning, stacklevel=2)
        area = kwargs.pop("min_area")
    if kwargs:
        raise DnnbindTypeError(f"unexpected keyword arguments for `random_size_crop`: {sorted(kwargs)}")
    if isinstance(area, Number):
        area = (area, 1.0)
    for _ in range(10):
        target_area = random.uniform(area[0], area[1]) * src_area
        log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
        new_ratio = np.exp(random.uniform(*log_ratio))
        new_w = int(round(np.sqrt(target_area * new_ratio)))
        new_h = int(round(np.sqrt(target_area / new_ratio)))
        if new_w <= w and new_h <= h:
            x0 = random.randint(0, w - new_w)
            y0 = random.randint(0, h - new_h)
            return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)
    return center_crop(src, size, interp)


# -- augmenters ----------------------------------------------------------------------------------------------------

class Augmenter:
    """An image transform ``aug(src) -> dst``; ``dumps()`` is its JSON description, as MXNet's."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        for k, v in self._kwargs.items():
            if isinstance(v, NDArray):
                v = v.numpy()
            if isinstance(v, np.ndarray):
                self._kwargs[k] = v.tolist()

    def dumps(self):
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])

    def __call__(self, src):
        raise NotImplementedError("Must override implementation.")


class SequentialAug(Augmenter):
    """Apply ``ts`` in order."""

    def __init__(self, ts):
        super().__init__()
        self.ts = ts

    def dumps(self):
        return [self.__class__.__name__.lower(), [x.dumps() for x in self.ts]]

    def __call__(self, src):
        for aug in self.ts:
            src = aug(src)
        return src


class RandomOrderAug(Augmenter):
    """Apply ``ts`` in a random order (``random.shuffle`` of the list itself, as MXNet)."""

    def __init__(self, ts):
        super().__init__()
        self.ts = ts

    def dumps(self):
        return [self.__class__.__name__.lower(), [x.dumps() for x in self.ts]]

    def __call__(self, src):
        random.shuffle(self.ts)
        for t in self.ts:
            src = t(src)
        return src


class ResizeAug(Augmenter):
    """Resize the shorter edge to ``size``."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size, self.interp = size, interp

    def __call__(self, src):
        return resize_short(src, self.size, self.interp)


class ForceResizeAug(Augmenter):
    """Resize to ``size`` (w, h), ignoring the aspect ratio."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size, self.interp = size, interp

    def __call__(self, src):
        sizes = (src.shape[0], src.shape[1], self.size[1], self.size[0])
        return imresize(src, *self.size, interp=_get_interp_method(self.interp, sizes))


class RandomCropAug(Augmenter):
    """:func:`random_crop` to ``size`` (w, h)."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size, self.interp = size, interp

    def __call__(self, src):
        return random_crop(src, self.size, self.interp)[0]


class RandomSizedCropAug(Augmenter):
    """:func:`random_size_crop` to ``size`` (w, h)."""

    def __init__(self, size, area, ratio, interp=2, **kwargs):
        super().__init__(size=size, area=area, ratio=ratio, interp=interp)
        self.size = size
        if "min_area" in kwargs:
            warnings.warn("`min_area` is deprecated. Please use `area` instead.", DeprecationWarning, stacklevel=2)
            self.area = kwargs.pop("min_area")
        else:
            self.area = area
        if kwargs:
            raise DnnbindTypeError(f"unexpected keyword arguments for `RandomSizedCropAug`: {sorted(kwargs)}")
        self.ratio, self.interp = ratio, interp

    def __call__(self, src):
        return random_size_crop(src, self.size, self.area, self.ratio, self.interp)[0]


class CenterCropAug(Augmenter):
    """:func:`center_crop` to ``size`` (w, h)."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size, self.interp = size, interp

    def __call__(self, src):
        return center_crop(src, self.size, self.interp)[0]


def _f32(src) -> np.ndarray:
    return host_array(src).astype(np.float32, copy=False)


class BrightnessJitterAug(Augmenter):
    """Multiply by ``1 + U(-brightness, brightness)``."""

    def __init__(self, brightness):
        super().__init__(brightness=brightness)
        self.brightness = brightness

    def __call__(self, src):
        alpha = 1.0 + random.uniform(-self.brightness, self.brightness)
        return cpu_ndarray(_f32(src) * np.float32(alpha))


class ContrastJitterAug(Augmenter):
    """Blend with the image's mean gray level: ``alpha * src + (1 - alpha) * mean(gray)``."""

    def __init__(self, contrast):
        super().__init__(contrast=contrast)
        self.contrast = contrast

    def __call__(self, src):
        alpha = 1.0 + random.uniform(-self.contrast, self.contrast)
        img = _f32(src)
        gray = img * _GRAY_COEF
        # NOTE: MXNet divides the weighted sum by the element count of all channels and multiplies by 3
        gray_level = np.float32(3.0 * (1.0 - alpha) / gray.size) * gray.sum(dtype=np.float32)
        return cpu_ndarray(img * np.float32(alpha) + gray_level)


class SaturationJitterAug(Augmenter):
    """Blend each pixel with its gray level: ``alpha * src + (1 - alpha) * gray``."""

    def __init__(self, saturation):
        super().__init__(saturation=saturation)
        self.saturation = saturation

    def __call__(self, src):
        alpha = 1.0 + random.uniform(-self.saturation, self.saturation)
        img = _f32(src)
        gray = (img * _GRAY_COEF).sum(axis=2, keepdims=True, dtype=np.float32) * np.float32(1.0 - alpha)
        return cpu_ndarray(img * np.float32(alpha) + gray)


class HueJitterAug(Augmenter):
    """Rotate the hue in YIQ space by ``U(-hue, hue) * pi``."""

    def __init__(self, hue):
        super().__init__(hue=hue)
        self.hue = hue
        self.tyiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.321], [0.211, -0.523, 0.311]])
        self.ityiq = np.array([[1.0, 0.956, 0.621], [1.0, -0.272, -0.647], [1.0, -1.107, 1.705]])

    def __call__(self, src):
        alpha = random.uniform(-self.hue, self.hue)
        u, w = np.cos(alpha * np.pi), np.sin(alpha * np.pi)
        bt = np.array([[1.0, 0.0, 0.0], [0.0, u, -w], [0.0, w, u]])
        t = np.dot(np.dot(self.ityiq, bt), self.tyiq).T
        return cpu_ndarray(np.dot(_f32(src), t.astype(np.float32)))


class ColorJitterAug(RandomOrderAug):
    """Brightness, contrast and saturation jitters in a random order."""

    def __init__(self, brightness, contrast, saturation):
        ts = []
        if brightness > 0:
            ts.append(BrightnessJitterAug(brightness))
        if contrast > 0:
            ts.append(ContrastJitterAug(contrast))
        if saturation > 0:
            ts.append(SaturationJitterAug(saturation))
        super().__init__(ts)


class LightingAug(Augmenter):
    """AlexNet-style PCA noise: add ``eigvec @ (alpha * eigval)``, alpha ~ N(0, alphastd) from numpy."""

    def __init__(self, alphastd, eigval, eigvec):
        super().__init__(alphastd=alphastd, eigval=eigval, eigvec=eigvec)
        self.alphastd, self.eigval, self.eigvec = alphastd, eigval, eigvec

    def __call__(self, src):
        alpha = np.random.normal(0, self.alphastd, size=(3,))
        rgb = np.dot(self.eigvec * alpha, self.eigval)
        return cpu_ndarray(_f32(src) + rgb.astype(np.float32))


class ColorNormalizeAug(Augmenter):
    """:func:`color_normalize` by ``mean`` and ``std``."""

    def __init__(self, mean, std):
        super().__init__(mean=mean, std=std)
        self.mean = mean if mean is None or isinstance(mean, NDArray) else cpu_ndarray(np.asarray(mean, np.float32))
        self.std = std if std is None or isinstance(std, NDArray) else cpu_ndarray(np.asarray(std, np.float32))

    def __call__(self, src):
        return color_normalize(src, self.mean, self.std)


class RandomGrayAug(Augmenter):
    """With probability ``p``, replace every channel by ``0.21 R + 0.72 G + 0.07 B``."""

    def __init__(self, p):
        super().__init__(p=p)
        self.p = p
        self.mat = np.array([[0.21, 0.21, 0.21], [0.72, 0.72, 0.72], [0.07, 0.07, 0.07]], np.float32)

    def __call__(self, src):
        if random.random() < self.p:
            return cpu_ndarray(np.dot(_f32(src), self.mat))
        return src


class HorizontalFlipAug(Augmenter):
    """With probability ``p``, flip left-right."""

    def __init__(self, p):
        super().__init__(p=p)
        self.p = p

    def __call__(self, src):
        if random.random() < self.p:
            return cpu_ndarray(host_array(src)[:, ::-1])
        return src


class CastAug(Augmenter):
    """Cast to ``typ`` (float32)."""

    def __init__(self, typ="float32"):
        super().__init__(type=typ)
        self.typ = typ

    def __call__(self, src):
        return src.astype(self.typ) if isinstance(src, NDArray) else cpu_ndarray(np.asarray(src).astype(self.typ))


IMAGENET_PCA_EIGVAL = np.array([55.46, 4.794, 1.148])  # ImageNet's RGB PCA, as MXNet hard-codes it
IMAGENET_PCA_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
IMAGENET_MEAN = [123.68, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]


def _check_stat(what: str, v) -> None:
    if not (isinstance(v, (np.ndarray, NDArray)) and v.shape[0] in (1, 3)):
        raise DnnbindValueError(f"CreateAugmenter: {what} must be True, None, or a numpy/NDArray of 1 or 3 values, "
                                f"got {v!r}")


def CreateAugmenter(data_shape, resize=0, rand_crop=False, rand_resize=False, rand_mirror=False, mean=None,
                    std=None, brightness=0, contrast=0, saturation=0, hue=0, pca_noise=0, rand_gray=0,
                    inter_method=2) -> list:
    """MXNet's standard augmenter list for a (C, H, W) ``data_shape``."""
    auglist = []
    if resize > 0:
        auglist.append(ResizeAug(resize, inter_method))
    crop_size = (data_shape[2], data_shape[1])
    if rand_resize:
        if not rand_crop:
            raise DnnbindValueError("CreateAugmenter: rand_resize needs rand_crop=True")
        auglist.append(RandomSizedCropAug(crop_size, 0.08, (3.0 / 4.0, 4.0 / 3.0), inter_method))
    elif rand_crop:
        auglist.append(RandomCropAug(crop_size, inter_method))
    else:
        auglist.append(CenterCropAug(crop_size, inter_method))
    if rand_mirror:
        auglist.append(HorizontalFlipAug(0.5))
    auglist.append(CastAug())
    if brightness or contrast or saturation:
        auglist.append(ColorJitterAug(brightness, contrast, saturation))
    if hue:
        auglist.append(HueJitterAug(hue))
    if pca_noise > 0:
        auglist.append(LightingAug(pca_noise, IMAGENET_PCA_EIGVAL, IMAGENET_PCA_EIGVEC))
    if rand_gray > 0:
        auglist.append(RandomGrayAug(rand_gray))
    if mean is True:
        mean = cpu_ndarray(np.array(IMAGENET_MEAN, np.float32))
    elif mean is not None:
        _check_stat("mean", mean)
    if std is True:
        std = cpu_ndarray(np.array(IMAGENET_STD, np.float32))
    elif std is not None:
        _check_stat("std", std)
    if mean is not None or std is not None:
        auglist.append(ColorNormalizeAug(mean, std))
    return auglist


# -- ImageIter -------------------------------------------------------------------------------------------------------

class ImageIter(DataIter):
    """Batches of augmented images from a RecordIO file (``path_imgrec``, with ``path_imgidx`` for shuffling and
    parts) or an image list (``path_imglist`` file or ``imglist`` list, files under ``path_root``), as MXNet's
    Python ImageIter: decode, ``aug_list`` (default ``CreateAugmenter(data_shape, **kwargs)``), HWC -> CHW, one
    image at a time in this thread. ``last_batch_handle`` is 'pad' (wrap around, ``pad`` counts the wrapped),
    'discard' or 'roll_over'."""

    def __init__(self, batch_size, data_shape, label_width=1, path_imgrec=None, path_imglist=None, path_root=None,
                 path_imgidx=None, shuffle=False, part_index=0, num_parts=1, aug_list=None, imglist=None,
                 data_name="data", label_name="softmax_label", dtype="float32", last_batch_handle="pad", **kwargs):
        super().__init__()
        if not (path_imgrec or path_imglist or isinstance(imglist, list)):
            raise DnnbindValueError("ImageIter needs path_imgrec, path_imglist or an imglist list")
        if dtype not in ("int32", "float32", "int64", "float64"):
            raise DnnbindValueError(f"{dtype} label not supported")
        if last_batch_handle not in ("pad", "discard", "roll_over"):
            raise DnnbindValueError(f"last_batch_handle must be 'pad', 'discard' or 'roll_over', got "
                                    f"{last_batch_handle!r}")
        if path_imgrec:
            if path_imgidx:
                self.imgrec = recordio.MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
                self.imgidx = list(self.imgrec.keys)
            else:
                self.imgrec = recordio.MXRecordIO(path_imgrec, "r")
                self.imgidx = None
        else:
            self.imgrec = None
        imgkeys = []
        if path_imglist:
            self.imglist = {}
            with open(path_imglist) as fin:
                for line in fin:
                    fields = line.strip().split("\t")
                    if fields == [""]:
                        continue
                    key = int(fields[0])
                    self.imglist[key] = (np.array(fields[1:-1], dtype=np.float64).astype(dtype), fields[-1])
                    imgkeys.append(key)
        elif isinstance(imglist, list):
            self.imglist = {}
            for index, img in enumerate(imglist, 1):
                key = str(index)  # NOTE: MXNet keys an in-memory list by the strings "1", "2", ...
                if len(img) > 2:
                    label = np.array(img[:-1], dtype=dtype)
                elif isinstance(img[0], Number):
                    label = np.array([img[0]], dtype=dtype)
                else:
                    label = np.array(host_array(img[0]), dtype=dtype)
                self.imglist[key] = (label, img[-1])
                imgkeys.append(key)
        else:
            self.imglist = None
        self.path_root = path_root
        data_shape = tuple(data_shape)
        self.check_data_shape(data_shape)
        self.provide_data = [(data_name, (batch_size,) + data_shape)]
        self.provide_label = [(label_name, (batch_size, label_width) if label_width > 1 else (batch_size,))]
        self.batch_size, self.data_shape, self.label_width = batch_size, data_shape, label_width
        self.shuffle = shuffle
        if self.imgrec is None:
            self.seq = imgkeys
        elif shuffle or num_parts > 1 or path_imgidx:
            if self.imgidx is None:
                raise DnnbindValueError("ImageIter: shuffle and num_parts > 1 need path_imgidx with path_imgrec")
            self.seq = self.imgidx
        else:
            self.seq = None
        if num_parts > 1:
            if not 0 <= part_index < num_parts:
                raise DnnbindValueError(f"ImageIter: part_index must be in [0, {num_parts}), got {part_index}")
            c = len(self.seq) // num_parts  # NOTE: MXNet drops the len % num_parts records at the end
            self.seq = self.seq[part_index * c:(part_index + 1) * c]
        self.auglist = CreateAugmenter(data_shape, **kwargs) if aug_list is None else aug_list
        self.cur = 0
        self._allow_read = True
        self.last_batch_handle = last_batch_handle
        self.num_image = len(self.seq) if self.seq is not None else None
        self._cache_data = self._cache_label = self._cache_idx = None
        self.reset()

    def reset(self):
        if self.seq is not None and self.shuffle:
            random.shuffle(self.seq)
        if self.last_batch_handle != "roll_over" or self._cache_data is None:
            if self.imgrec is not None:
                self.imgrec.reset()
            self.cur = 0
            self._allow_read = True

    def hard_reset(self):
        """Reset and drop a rolled-over partial batch."""
        if self.seq is not None and self.shuffle:
            random.shuffle(self.seq)
        if self.imgrec is not None:
            self.imgrec.reset()
        self.cur = 0
        self._allow_read = True
        self._cache_data = self._cache_label = self._cache_idx = None

    def next_sample(self):
        """The next (label, encoded image bytes); StopIteration at the end of the data."""
        if self._allow_read is False:
            raise StopIteration
        if self.seq is not None:
            if self.cur >= self.num_image:
                if self.last_batch_handle != "discard":
                    self.cur = 0
                raise StopIteration
            idx = self.seq[self.cur]
            self.cur += 1
            if self.imgrec is not None:
                header, img = recordio.unpack(self.imgrec.read_idx(idx))
                return (header.label, img) if self.imglist is None else (self.imglist[idx][0], img)
            label, fname = self.imglist[idx]
            return label, self.read_image(fname)
        s = self.imgrec.read()
        if s is None:
            if self.last_batch_handle != "discard":
                self.imgrec.reset()
            raise StopIteration
        header, img = recordio.unpack(s)
        return header.label, img

    def _batchify(self, batch_data, batch_label, start=0):
        i = start
        try:
            while i < self.batch_size:
                label, s = self.next_sample()
                data = self.imdecode(s)
                try:
                    self.check_valid_image(data)
                except RuntimeError as e:
                    logging.debug("Invalid image, skipping:  %s", e)
                    continue
                data = self.augmentation_transform(data)
                batch_data[i] = host_array(self.postprocess_data(data))
                self._put_label(batch_label, i, label)
                i += 1
        except StopIteration:
            if not i:
                raise
        return i

    @staticmethod
    def _put_label(batch_label, i, label):
        lab = np.ravel(host_array(label)) if not isinstance(label, Number) else np.array([label])
        batch_label[i] = lab[0] if batch_label.ndim == 1 else lab

    def _new_label(self) -> np.ndarray:
        """A batch's label buffer (every slot written by _batchify)."""
        return np.empty(self.provide_label[0][1], np.float32)

    def next(self):
        c, h, w = self.data_shape
        if self._cache_data is not None:
            batch_data, batch_label, i = self._cache_data, self._cache_label, self._cache_idx
        else:
            batch_data = np.zeros((self.batch_size, c, h, w), np.float32)
            batch_label = self._new_label()
            i = self._batchify(batch_data, batch_label)
        pad = self.batch_size - i
        if pad != 0:
            if self.last_batch_handle == "discard":
                raise StopIteration
            if self.last_batch_handle == "roll_over" and self._cache_data is None:
                self._cache_data, self._cache_label, self._cache_idx = batch_data, batch_label, i
                raise StopIteration
            self._batchify(batch_data, batch_label, i)
            if self.last_batch_handle == "pad":
                self._allow_read = False
            else:
                self._cache_data = self._cache_label = self._cache_idx = None
        return DataBatch([cpu_ndarray(batch_data)], [cpu_ndarray(batch_label)], pad=pad)

    def check_data_shape(self, data_shape):
        """data_shape must be (3, H, W)."""
        if not len(data_shape) == 3:
            raise DnnbindValueError("data_shape should have length 3, with dimensions CxHxW")
        if not data_shape[0] == 3:
            raise DnnbindValueError("This iterator expects inputs to have 3 channels.")

    def check_valid_image(self, data):
        """RuntimeError for an empty image."""
        if len(data[0].shape) == 0:
            raise RuntimeError("Data shape is wrong")

    def imdecode(self, s):
        """Decode one image; RuntimeError naming the record or file when it is broken."""
        try:
            return imdecode(s)
        except Exception as e:  # noqa: BLE001  (any decoder failure becomes MXNet's "Broken image" error)
            if self.seq is not None and self.num_image:
                idx = self.seq[(self.cur % self.num_image) - 1]
            else:
                idx = self.cur - 1
            where = f"filename: {self.imglist[idx][1]}" if self.imglist is not None else f"index: {idx}"
            raise RuntimeError(f"Broken image {where}, {e}") from None

    def read_image(self, fname):
        """The bytes of ``path_root/fname``."""
        with open(os.path.join(self.path_root or "", fname), "rb") as fin:
            return fin.read()

    def augmentation_transform(self, data):
        """Apply the augmenters in order."""
        for aug in self.auglist:
            data = aug(data)
        return data

    def postprocess_data(self, datum):
        """HWC -> CHW."""
        return cpu_ndarray(np.transpose(host_array(datum), (2, 0, 1)))
