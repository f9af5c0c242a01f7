"""``mxnet.image``: decode, read, resize and crop images on the host with Pillow. Layer: top (the MXNet alias);
imports runtime.

Results are NDArrays laid out like MXNet's: uint8 (H, W, 3) RGB (``to_rgb=False``: BGR), or (H, W, 1) with
``flag=0`` (grayscale), on the cpu (crops and resizes stay on their input's device). MXNet uses OpenCV; this
module uses Pillow, so decoded pixels are the same for PNG and may differ by a few levels for JPEG (different
IDCT), and resizing uses Pillow's filters (``interp`` 0 nearest, 1 bilinear, 2 bicubic, 3 area, 4 Lanczos),
which smooth when shrinking where OpenCV's bilinear does not. Without Pillow, each function raises
NotImplementedError saying to ``pip install pillow``. The iterators and augmenters (``ImageIter``,
``ImageDetIter``, ``CreateAugmenter``, ...) are not supported: using one raises NotImplementedError.
"""

from __future__ import annotations

import sys

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import io
import random

import numpy as np

from ..gluon.data.vision._geometry import scale_down
from ..runtime.array import NDArray, array
from ..runtime.device import cpu
from . import _unsupported
from ._unsupported import UnsupportedFeature

__all__ = ["center_crop", "fixed_crop", "imdecode", "imread", "imresize", "random_crop", "resize_short",
           "scale_down"]


def _pil(fn: str):
    try:
        from PIL import Image
    except ImportError:
        raise NotImplementedError(f"mxnet.image.{fn} needs Pillow in dnnbind: pip install pillow") from None
    return Image


def _from_pil(img, flag: int, to_rgb: bool) -> NDArray:
    if flag == 0:
        host = np.asarray(img.convert("L"), dtype=np.uint8)[:, :, None]
    else:
        host = np.asarray(img.convert("RGB"), dtype=np.uint8)
        if not to_rgb:
            host = host[:, :, ::-1]
    return array(np.ascontiguousarray(host), device=cpu())


def _check_flag(fn: str, flag) -> int:
    if flag not in (0, 1):
        raise DnnbindValueError(f"mxnet.image.{fn}: flag must be 1 (color) or 0 (grayscale), got {flag!r}")
    return int(flag)


def imread(filename, flag: int = 1, to_rgb: bool = True, out=None) -> NDArray:
    """Read and decode the image file ``filename``: uint8 (H, W, 3), or (H, W, 1) with ``flag=0``."""
    flag = _check_flag("imread", flag)
    Image = _pil("imread")
    with Image.open(filename) as img:
        return _out(_from_pil(img, flag, to_rgb), out)


def imdecode(buf, flag: int = 1, to_rgb: bool = True, out=None) -> NDArray:
    """Decode an encoded image (bytes, bytearray, a uint8 numpy array or NDArray of the file's bytes)."""
    flag = _check_flag("imdecode", flag)
    if isinstance(buf, NDArray):
        buf = buf.numpy()
    if not isinstance(buf, (bytes, bytearray, np.ndarray)):
        raise DnnbindTypeError(f"mxnet.image.imdecode: buf must be bytes, bytearray or numpy.ndarray, got "
                         f"{type(buf).__name__} (encode a str to bytes first)")
    data = buf.tobytes() if isinstance(buf, np.ndarray) else bytes(buf)
    Image = _pil("imdecode")
    with Image.open(io.BytesIO(data)) as img:
        return _out(_from_pil(img, flag, to_rgb), out)


def _out(result: NDArray, out) -> NDArray:
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape) or np.dtype(out.dtype) != result.dtype:
        raise DnnbindValueError(f"mxnet.image: out has shape {tuple(out.shape)} {out.dtype}, the image is "
                         f"{tuple(result.shape)} {result.dtype}")
    out.copy_(result)
    return out


def _resample(Image, interp: int):
    names = {0: "NEAREST", 1: "BILINEAR", 2: "BICUBIC", 3: "BOX", 4: "LANCZOS"}
    if interp not in names:
        raise DnnbindValueError(f"mxnet.image.imresize: interp must be 0-4, 9 (auto) or 10 (random), got {interp!r}")
    resampling = getattr(Image, "Resampling", Image)  # Pillow >= 9.1 moved the constants
    return getattr(resampling, names[interp])


def _interp(interp: int, sizes: tuple = ()) -> int:
    """MXNet's choice for ``interp`` 9 (auto: bicubic to enlarge, area to shrink, else bilinear) and 10 (random)."""
    if interp == 9:
        if not sizes:
            return 2
        oh, ow, nh, nw = sizes
        return 2 if nh > oh and nw > ow else 3 if nh < oh and nw < ow else 1
    if interp == 10:
        return random.randint(0, 4)
    return interp


def imresize(src, w: int, h: int, interp: int = 1, out=None) -> NDArray:
    """``src`` (H, W, C) resized to (h, w, C), same dtype and device."""
    Image = _pil("imresize")
    host = src.numpy() if isinstance(src, NDArray) else np.asarray(src)
    if host.ndim != 3:
        raise DnnbindValueError(f"mxnet.image.imresize: src must be (H, W, C), got shape {host.shape}")
    if int(w) <= 0 or int(h) <= 0:
        raise DnnbindValueError(f"mxnet.image.imresize: w and h must be positive, got w={w}, h={h}")
    w, h = int(w), int(h)
    resample = _resample(Image, _interp(interp, (host.shape[0], host.shape[1], h, w)))
    if host.dtype == np.uint8 and host.shape[2] in (3, 4):
        mode = "RGB" if host.shape[2] == 3 else "RGBA"
        res = np.asarray(Image.fromarray(np.ascontiguousarray(host), mode).resize((w, h), resample))
    else:  # other channel counts or dtypes: one float32 plane at a time, rounded back for integer dtypes
        planes = [np.asarray(Image.fromarray(np.ascontiguousarray(host[:, :, c], dtype=np.float32), "F")
                             .resize((w, h), resample)) for c in range(host.shape[2])]
        res = np.stack(planes, axis=2)
        if np.issubdtype(host.dtype, np.integer):
            info = np.iinfo(host.dtype)
            res = np.clip(np.rint(res), info.min, info.max)
    device = src.context if isinstance(src, NDArray) else cpu()
    return _out(array(np.ascontiguousarray(res, dtype=host.dtype), device=device), out)


def resize_short(src, size: int, interp: int = 2) -> NDArray:
    """Resize so the shorter edge is ``size``, keeping the aspect ratio (integer division like MXNet)."""
    h, w = src.shape[0], src.shape[1]
    new_h, new_w = (size * h // w, size) if h > w else (size, size * w // h)
    return imresize(src, new_w, new_h, interp=_interp(interp, (h, w, new_h, new_w)))


def fixed_crop(src, x0: int, y0: int, w: int, h: int, size: tuple | None = None, interp: int = 2) -> NDArray:
    """``src[y0:y0+h, x0:x0+w]``, then resized to ``size`` (w, h) if given and different."""
    host = src.numpy() if isinstance(src, NDArray) else np.asarray(src)
    device = src.context if isinstance(src, NDArray) else cpu()
    out = array(np.ascontiguousarray(host[y0:y0 + h, x0:x0 + w]), device=device)
    if size is not None and (w, h) != tuple(size):
        out = imresize(out, size[0], size[1], interp=_interp(interp, (h, w, size[1], size[0])))
    return out


def random_crop(src, size: tuple, interp: int = 2) -> tuple:
    """A crop of ``size`` (w, h) at a random place (scaled down to fit, then resized to ``size``);
    returns (image, (x0, y0, w, h))."""
    h, w = src.shape[0], src.shape[1]
    new_w, new_h = scale_down((w, h), size)
    x0, y0 = random.randint(0, w - new_w), random.randint(0, h - new_h)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def center_crop(src, size: tuple, interp: int = 2) -> tuple:
    """The centered crop of ``size`` (w, h) (scaled down to fit, then resized); returns (image, (x0, y0, w, h))."""
    h, w = src.shape[0], src.shape[1]
    new_w, new_h = scale_down((w, h), size)
    x0, y0 = int((w - new_w) / 2), int((h - new_h) / 2)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if name not in _unsupported.NAMES["image"]:  # a typo, not an MXNet feature
        raise _unsupported.missing("image", name, obj=sys.modules[__name__])
    raise UnsupportedFeature(f"mxnet.image.{name} is not supported by dnnbind yet (imread, imdecode, imresize, "
                              "resize_short and the crops are)")
