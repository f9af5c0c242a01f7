"""IDX file reader and writer (the MNIST container format).

Layer: gluon: data; imports numpy and the standard library only.

An IDX file is a 4-byte magic (two zero bytes, a type code, the number of dimensions), one big-endian uint32
per dimension, then the payload in C order. Files may be gzip-compressed; we detect that by the gzip magic
bytes (0x1f 0x8b) rather than by the file name, because copies are often renamed or decompressed in place.
Every check raises ValueError naming the file, so a truncated download says which file to delete.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindTypeError, DnnbindValueError

import gzip
import os
import struct
import tempfile
import zlib

import numpy as np

# IDX type code -> big-endian numpy dtype.
_CODE_TO_DTYPE = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_DTYPE_TO_CODE = {dt.newbyteorder("="): code for code, dt in _CODE_TO_DTYPE.items()}

# The two magics MNIST uses: labels are 1-d uint8, images 3-d uint8.
MAGIC_LABELS = 0x00000801
MAGIC_IMAGES = 0x00000803

_GZIP_MAGIC = b"\x1f\x8b"


def _load_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DnnbindValueError(f"{path}: corrupt or truncated gzip stream ({e}); delete it and fetch it again") from e
    return raw


def read_idx(path: str | os.PathLike, expected_magic: int | None = None,
             expected_shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """Read an IDX file (gzip or raw) into a native-endian numpy array.

    expected_magic: e.g. MAGIC_IMAGES; a different magic raises ValueError.
    expected_shape: one entry per dimension, None = any size (e.g. (None, 28, 28) for MNIST images).
    """
    path = os.fspath(path)
    raw = _load_bytes(path)
    if len(raw) < 4:
        raise DnnbindValueError(f"{path}: {len(raw)} bytes is too short for an IDX header (need at least 4)")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    magic = struct.unpack(">I", raw[:4])[0]
    if zero != 0 or code not in _CODE_TO_DTYPE:
        raise DnnbindValueError(f"{path}: not an IDX file (magic 0x{magic:08x}; expected 0x0000TTDD with a known type TT)")
    if expected_magic is not None and magic != expected_magic:
        raise DnnbindValueError(f"{path}: wrong IDX magic 0x{magic:08x}, expected 0x{expected_magic:08x}"
                         " (labels are 0x00000801, images 0x00000803)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DnnbindValueError(f"{path}: truncated header: {len(raw)} bytes, {ndim} dimensions need {header}")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    if expected_shape is not None:
        ok = len(shape) == len(expected_shape) and all(e is None or e == s for s, e in zip(shape, expected_shape))
        if not ok:
            want = tuple("N" if e is None else e for e in expected_shape)
            raise DnnbindValueError(f"{path}: wrong dimensions {shape}, expected {want}")
    dtype = _CODE_TO_DTYPE[code]
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = len(raw) - header
    if have != need:
        what = "truncated" if have < need else "has trailing bytes"
        raise DnnbindValueError(f"{path}: payload {what}: {have} bytes after the header, shape {shape} needs {need}")
    # frombuffer over bytes is read-only; one copy makes it writable and native-endian.
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> None:
    """Write `array` as an IDX file; gzip when compress is True (default: when the name ends in .gz).

    The file appears atomically (temporary file + os.replace), so a reader never sees half of it.
    """
    path = os.fspath(path)
    a = np.ascontiguousarray(array)
    key = a.dtype.newbyteorder("=") if a.dtype.byteorder not in ("|", "=") else a.dtype
    if key not in _DTYPE_TO_CODE:
        raise DnnbindTypeError(f"write_idx: dtype {a.dtype} has no IDX type code (uint8, int8, int16, int32, float32, float64)")
    code = _DTYPE_TO_CODE[key]
    if a.ndim > 255:
        raise DnnbindValueError(f"write_idx: {a.ndim} dimensions do not fit in one byte")
    payload = (struct.pack(">HBB", 0, code, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
               + a.astype(_CODE_TO_DTYPE[code], copy=False).tobytes())
    if compress is None:
        compress = path.endswith(".gz")
    if compress:
        payload = gzip.compress(payload, mtime=0)
    atomic_write(path, payload)


def atomic_write(path: str, data: bytes) -> None:
    """Write bytes to `path` via a temporary file in the same folder and os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
