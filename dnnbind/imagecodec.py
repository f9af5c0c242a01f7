"""Image encode/decode on the host for RecordIO, im2rec and the image datasets, with OpenCV's conventions.

Layer: _lib (a leaf): imports numpy, and OpenCV (``cv2``) or Pillow when first asked to code an image.

MXNet codes images with OpenCV, so this module speaks OpenCV's language whichever library does the work: arrays
are BGR (BGRA with alpha) uint8, a gray image is 2-D, and ``flag`` is OpenCV's imread flag (1 color, 0 gray,
-1 unchanged). OpenCV is used when importable, because then encoded bytes and decoded pixels are MXNet's own;
otherwise Pillow. With Pillow, PNG pixels are the same; JPEG pixels may differ by a few levels (another IDCT),
a color image read as gray may differ by one level (another rounding of the luma weights), and encoded bytes
differ from OpenCV's (another encoder). Neither is a hard dependency: the first call without either raises
NotImplementedError saying what to install (``pip install pillow``, the ``image`` extra).
"""

from __future__ import annotations

import io
import os

import numpy as np

from ._lib.errors import DnnbindValueError

_backend: str | None = None  # "cv2" or "pil", chosen on first use; tests may set it to exercise either path

JPEG = (".jpg", ".jpeg")
PNG = (".png",)


def backend() -> str:
    """The library that codes images: "cv2" when OpenCV imports, else "pil"; raises when neither does."""
    global _backend
    if _backend is None:
        try:
            import cv2  # noqa: F401
            _backend = "cv2"
        except ImportError:
            try:
                import PIL.Image  # noqa: F401
                _backend = "pil"
            except ImportError:
                raise NotImplementedError("coding images needs OpenCV or Pillow: pip install pillow "
                                          "(or opencv-python-headless, which gives MXNet's exact bytes)") from None
    return _backend


def _check_flag(flag: int) -> int:
    if flag not in (-1, 0, 1):
        raise DnnbindValueError(f"image flag must be 1 (color), 0 (gray) or -1 (unchanged), got {flag!r}")
    return int(flag)


# -- decode: OpenCV's imdecode/imread ---------------------------------------------------------------------------

def decode(buf, flag: int = -1) -> np.ndarray | None:
    """``cv2.imdecode(buf, flag)``: BGR (H, W, 3), BGRA (H, W, 4) or gray (H, W); None when ``buf`` is not an
    image (OpenCV's answer, which MXNet's unpack_img passes on)."""
    flag = _check_flag(flag)
    data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1)
    if data.size == 0:
        return None
    if backend() == "cv2":
        import cv2
        return cv2.imdecode(data, flag)
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(io.BytesIO(data.tobytes())) as img:
            return _from_pil(img, flag)
    except (UnidentifiedImageError, OSError, SyntaxError):  # Pillow's ways of saying "not an image I can read"
        return None


def imread(path: str | os.PathLike, flag: int = 1) -> np.ndarray | None:
    """``cv2.imread(path, flag)``: None for a file that is not a readable image (as OpenCV)."""
    flag = _check_flag(flag)
    if backend() == "cv2":
        import cv2
        return cv2.imread(os.fspath(path), flag)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return decode(data, flag)


def _from_pil(img, flag: int) -> np.ndarray:
    """A Pillow image in OpenCV's layout for ``flag``."""
    img.load()
    if flag == 0:
        if img.mode != "L":
            img = img.convert("RGB").convert("L")  # drop alpha first: OpenCV's gray read ignores it
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))
    if flag == 1 or img.mode not in ("L", "RGB", "RGBA", "LA", "P", "I;16"):
        return np.ascontiguousarray(np.asarray(img.convert("RGB"))[:, :, ::-1])
    # flag -1 (unchanged): gray stays 2-D (16-bit stays uint16) and alpha stays, as IMREAD_UNCHANGED keeps them;
    # a palette expands to BGR, or BGRA when it has a transparent entry
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode == "LA":
        img = img.convert("RGBA")
    arr = np.asarray(img)
    if arr.ndim == 2:
        return np.ascontiguousarray(arr.astype(np.uint16 if img.mode == "I;16" else np.uint8, copy=False))
    order = [2, 1, 0, 3] if arr.shape[2] == 4 else [2, 1, 0]
    return np.ascontiguousarray(arr[:, :, order])


def to_rgb(img: np.ndarray) -> np.ndarray:
    """An OpenCV-layout image as MXNet's ``mx.image.imdecode`` gives it: RGB (H, W, 3), or (H, W, 1) gray."""
    if img.ndim == 2:
        return img[:, :, None]
    return np.ascontiguousarray(img[:, :, 2::-1])


def decode_rgb(buf, flag: int = 1) -> np.ndarray:
    """``mx.image.imdecode(buf, flag)`` on the host: uint8 RGB (H, W, 3) (flag 1) or (H, W, 1) (flag 0)."""
    if flag not in (0, 1):
        raise DnnbindValueError(f"image flag must be 1 (color) or 0 (grayscale), got {flag!r}")
    img = decode(buf, flag)
    if img is None:
        raise DnnbindValueError("could not decode the image: the bytes are not a JPEG, PNG or other image "
                                "OpenCV/Pillow reads")
    return to_rgb(img)


# -- encode: OpenCV's imencode ----------------------------------------------------------------------------------

def encode(img: np.ndarray, fmt: str = ".jpg", quality: int = 95) -> bytes:
    """``cv2.imencode(fmt, img, [quality param])``: ``img`` BGR/BGRA/gray uint8; ``quality`` is JPEG quality
    (0-100) or PNG compression (0-9; larger values clamp to 9, as OpenCV does, so MXNet's default 95 means 9)."""
    fmt = fmt.lower()
    if fmt not in JPEG + PNG:
        raise DnnbindValueError(f"image format must be '.jpg', '.jpeg' or '.png', got {fmt!r}")
    img = np.asarray(img)
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3, 4)) or 0 in img.shape:
        raise DnnbindValueError(f"an image to encode must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got "
                                f"shape {img.shape}")
    if backend() == "cv2":
        import cv2
        param = [cv2.IMWRITE_JPEG_QUALITY if fmt in JPEG else cv2.IMWRITE_PNG_COMPRESSION, int(quality)]
        ok, buf = cv2.imencode(fmt, img, param)
        if not ok:
            raise DnnbindValueError(f"OpenCV could not encode a {img.shape} {img.dtype} image as {fmt}")
        return buf.tobytes()
    from PIL import Image
    if img.dtype != np.uint8:
        raise DnnbindValueError(f"encoding with Pillow takes uint8 images, got {img.dtype} (install "
                                "opencv-python-headless for other depths)")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 3:
        if img.shape[2] == 4 and fmt in JPEG:
            img = img[:, :, :3]  # JPEG has no alpha; OpenCV drops it too
        order = [2, 1, 0, 3] if img.shape[2] == 4 else [2, 1, 0]
        img = img[:, :, order]
    pil = Image.fromarray(np.ascontiguousarray(img))
    out = io.BytesIO()
    if fmt in JPEG:
        pil.save(out, "JPEG", quality=min(max(int(quality), 0), 100))
    else:
        pil.save(out, "PNG", compress_level=min(max(int(quality), 0), 9))
    return out.getvalue()


def resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(img, (width, height))`` (bilinear with pixel centres). Without OpenCV, the same rule in
    float32, rounded: uint8 results may differ from OpenCV's fixed-point ones by one level."""
    if backend() == "cv2":
        import cv2
        return cv2.resize(img, (int(width), int(height)))
    h, w = img.shape[:2]
    src = img[:, :, None] if img.ndim == 2 else img
    out = np.empty((height, width, src.shape[2]), np.float32)
    ys, y1, fy = _weights(height, h)
    xs, x1, fx = _weights(width, w)
    s = src.astype(np.float32)
    rows = s[ys] * (1 - fy)[:, None, None] + s[y1] * fy[:, None, None]
    out[:] = rows[:, xs] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    out = np.clip(np.rint(out), 0, np.iinfo(img.dtype).max if img.dtype.kind == "u" else None).astype(img.dtype)
    return out[:, :, 0] if img.ndim == 2 else out


def _weights(n_out: int, n_in: int):
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)
