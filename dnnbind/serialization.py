"""MXNet 1.x's binary NDArray file format (``nd.save`` / ``nd.load``), read and written. Layer: runtime helpers;
imports numpy, the standard library, dnnbind._lib.errors and dnnbind.runtime.

The specification is MXNet 1.9's ``NDArray::Save/Load`` (src/ndarray/ndarray.cc) and dmlc's serializer. A
file, all little-endian:

    uint64 0x112 (list magic), uint64 0 (reserved)
    uint64 n, then n arrays
    uint64 k (0: a list; n: a dict), then k names as uint64 length + UTF-8 bytes

One array (the current format, V2 = 0xF993FAC9; V3 = 0xF993FACA is the same layout saved under NumPy shape
semantics, where ndim -1 / dim -1 mean "unknown" and ndim 0 is a scalar):

    uint32 magic, int32 storage type (0 dense, 1 row_sparse, 2 csr)
    [sparse only: the storage shape]
    shape: int32 ndim, int64 dims        (V2: ndim 0 means a "none" array and nothing more follows)
    context: int32 dev_type (1 cpu, 2 gpu, 3 cpu_pinned, 5 cpu_shared), int32 dev_id
    int32 type flag (mshadow: 0 f32, 1 f64, 2 f16, 3 u8, 4 i32, 5 i8, 6 i64, 7 bool, 8 i16, 9 u16, 10 u32,
                     11 u64, 12 bf16; MXNet 1.9 loads only 0..7, so we write only those)
    [sparse only: aux type flags and shapes]
    raw data, C order

Older files: V1 (0xF993FAC8) has no storage type; files older still have no per-array magic at all: the
first uint32 is ndim, followed by uint32 dims. Both are read.

Choices where MXNet 1.x is silent or broken:
- 0-d arrays. MXNet 1.x writes a 0-d array under V2 as ndim 0 *followed by its data*, which its own loader
  then reads as a "none" array and loses sync (checked with mxnet 1.9.1: "basic_string::resize"). We write
  a file that holds any 0-d array entirely as V3, exactly what MXNet does under NumPy shape semantics
  (MXNet reads it inside ``with mx.util.np_shape(True):``). Reading V2/V1/legacy ndim 0, we take the data
  that follows when it starts with a plausible context and type flag (MXNet's 0-d arrays), else a none
  array, returned as ``None``.
- The context written is the array's own, as MXNet does (gpu arrays say gpu(i)); host copies from
  ``save_parameters`` and numpy inputs say cpu(0). On load every array is on the cpu; the caller moves it.
- Size-0 arrays (a 0 dim) stay V2: MXNet 1.9 loads them.

Also here, for checkpoints that are not MXNet files (Trainer.save_states, scripts/train.py): ``load_npz`` reads
an ``np.savez`` archive whole and checked (each entry's header against its size, the zip CRCs), so a truncated
or corrupt file is one CheckpointFileError naming it, never numpy's or zipfile's exception of the moment.
"""

from __future__ import annotations

from ._lib.errors import DnnbindTypeError, DnnbindValueError

import io
import math
import os
import struct
import tempfile
import zipfile

import numpy as np

from ._lib.errors import DnnbindError
from .runtime.array import NDArray

__all__ = ["CheckpointFileError", "NDArrayFileError", "UnsupportedStorageError", "load", "load_bytes",
           "load_frombuffer", "load_npz", "save", "save_bytes"]

LIST_MAGIC = 0x112
V1_MAGIC, V2_MAGIC, V3_MAGIC = 0xF993FAC8, 0xF993FAC9, 0xF993FACA

# mshadow type flags (3rdparty/mshadow/mshadow/base.h, enum TypeFlag); 12 is bfloat16, which numpy lacks.
_FLAG_TO_DTYPE = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8,
                  6: np.int64, 7: np.bool_, 8: np.int16, 9: np.uint16, 10: np.uint32, 11: np.uint64}
_FLAG_TO_DTYPE = {k: np.dtype(v) for k, v in _FLAG_TO_DTYPE.items()}
# MXNet 1.9's loader stops at 7 ("Unknown type enum 8"), so those are all we write; 8..11 are read.
_DTYPE_TO_FLAG = {v: k for k, v in _FLAG_TO_DTYPE.items() if k <= 7}
_STYPES = {0: "default", 1: "row_sparse", 2: "csr"}
_DEV_TYPES = {1, 2, 3, 5}  # cpu, gpu, cpu_pinned, cpu_shared (include/mxnet/base.h)
_MAX_NDIM = 32  # MXNet has no hard limit; anything larger in a file is corruption, not a tensor


class NDArrayFileError(DnnbindError, ValueError):
    """A file that is not, or no longer, a valid MXNet NDArray file: names the file and the byte offset."""

    def __init__(self, source: str, offset: int, message: str):
        self.source, self.offset, self.message = source, offset, message
        super().__init__(f"{source}: {message}")

    def __reduce__(self):
        return (type(self), (self.source, self.offset, self.message))


class UnsupportedStorageError(NDArrayFileError, NotImplementedError):
    """A sparse array: valid in MXNet, not readable here; or a corrupt storage-type word (hence a ValueError too)."""


class CheckpointFileError(DnnbindError, ValueError):
    """An npz checkpoint that cannot be read back (corrupt, truncated, not npz): names the file and what is wrong."""

    def __init__(self, source: str, message: str):
        self.source, self.message = source, message
        super().__init__(f"{source}: {message}")

    def __reduce__(self):
        return (type(self), (self.source, self.message))


# -- reading -----------------------------------------------------------------------------------------------------
class _Reader:
    """Little-endian reads from a binary stream of known size; every shortfall is an NDArrayFileError."""

    def __init__(self, stream, size: int, source: str):
        self.stream, self.size, self.source, self.pos = stream, size, source, 0

    def fail(self, message: str, offset: int | None = None):
        offset = self.pos if offset is None else offset
        raise NDArrayFileError(self.source, offset, f"{message} (at byte {offset})")

    def truncated(self, what: str, n: int, left: int):
        raise NDArrayFileError(self.source, self.pos, f"truncated at byte {self.pos} while reading {what} "
                               f"(need {n} bytes, {left} left)")

    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            self.truncated(what, n, left)

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = self.stream.read(n)
        if len(out) != n:  # the file shrank under us
            self.truncated(what, n, len(out))
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        values = struct.unpack("<" + fmt, self.bytes(struct.calcsize("<" + fmt), what))
        return values if len(values) > 1 else values[0]

    def into(self, out: np.ndarray, what: str) -> None:
        view = out.reshape(-1).view(np.uint8)
        self.need(view.size, what)
        got = self.stream.readinto(view) if view.size else 0
        if got != view.size:
            self.truncated(what, view.size, got)
        self.pos += view.size


def _read_shape(r: _Reader, what: str, dim_fmt: str = "q", ndim: int | None = None) -> tuple | None:
    """An MXNet TShape: int32 ndim, then ndim dims. None for an unknown ndim (-1)."""
    start = r.pos
    if ndim is None:
        ndim = r.unpack("i", f"{what} ndim")
    if ndim == -1:
        return None
    if not 0 <= ndim <= _MAX_NDIM:
        r.fail(f"{what} has ndim {ndim}; expected 0..{_MAX_NDIM} (not an MXNet NDArray file, or corrupt)", start)
    dims = r.unpack(f"{ndim}{dim_fmt}", f"{what} dims") if ndim else ()
    return (dims,) if isinstance(dims, int) else tuple(dims)


def _plausible_0d(r: _Reader) -> bool:
    """After an ndim-0 shape in the older formats: does a context and a type flag follow (a 0-d array)?"""
    if r.size - r.pos < 12:
        return False
    here = r.stream.tell()
    dev_type, dev_id, flag = struct.unpack("<iii", r.stream.read(12))
    r.stream.seek(here)
    return dev_type in _DEV_TYPES and 0 <= dev_id < 1024 and flag in _FLAG_TO_DTYPE


def _read_array(r: _Reader, index: int) -> np.ndarray | None:
    what = f"array {index}"
    start = r.pos
    magic = r.unpack("I", f"{what}'s magic")
    stype, np_shape = 0, magic == V3_MAGIC
    if magic in (V2_MAGIC, V3_MAGIC):
        stype = r.unpack("i", f"{what}'s storage type")
        if stype != 0:
            name = _STYPES.get(stype)
            if name is None:
                r.fail(f"{what} has storage type {stype}; expected 0 (dense), 1 or 2", start + 4)
            raise UnsupportedStorageError(r.source, start, f"{what} has {name} storage (at byte {start}); dnnbind "
                                          "reads dense arrays only. Convert it in MXNet first: "
                                          "arr.tostype('default') (or the file is corrupt)")
        shape = _read_shape(r, f"{what}'s shape")
    elif magic == V1_MAGIC:
        shape = _read_shape(r, f"{what}'s shape")
    else:  # the oldest format: no magic, this word is ndim and the dims are uint32
        if magic > _MAX_NDIM:
            r.fail(f"{what} starts with 0x{magic:08X}; expected the array magic 0x{V2_MAGIC:08X} "
                   "(not an MXNet NDArray file, or corrupt)", start)
        shape = _read_shape(r, f"{what}'s shape", "I", ndim=magic)
    if shape is None or any(d == -1 for d in shape):  # unknown shape (NumPy semantics): a none array
        if not np_shape and shape is not None:
            r.fail(f"{what} has shape {shape}; dims must be >= 0", start)
        return None
    if any(d < 0 for d in shape):
        r.fail(f"{what} has shape {shape}; dims must be >= 0 (or -1 for unknown)", start)
    if not shape and not np_shape and not _plausible_0d(r):
        return None  # MXNet's "none" array: nothing more was written for it
    r.unpack("ii", f"{what}'s context")  # where it lived when saved; we load onto the cpu
    flag_at = r.pos
    flag = r.unpack("i", f"{what}'s type flag")
    dtype = _FLAG_TO_DTYPE.get(flag)
    if dtype is None:
        hint = " (bfloat16, which numpy cannot hold)" if flag == 12 else ""
        r.fail(f"{what} has type flag {flag}{hint}; expected one of {sorted(_FLAG_TO_DTYPE)}", flag_at)
    r.need(math.prod(shape) * dtype.itemsize, f"{what}'s data of shape {shape} {dtype.name}")
    out = np.empty(shape, dtype.newbyteorder("<"))
    r.into(out, f"{what}'s data")
    return out if out.dtype.isnative else out.astype(dtype)


def _read_file(r: _Reader) -> tuple[list, list]:
    if r.size < 8:
        r.fail(f"too short to be an MXNet NDArray file ({r.size} bytes; the header alone is 24)", 0)
    magic = r.unpack("Q", "the list magic")
    if magic != LIST_MAGIC:
        r.fail(f"not an MXNet NDArray file (magic 0x{magic:X}; expected 0x{LIST_MAGIC:X})", 0)
    r.unpack("Q", "the reserved header word")
    count = r.unpack("Q", "the array count")
    arrays = []  # appended one by one: a corrupt count fails at the first missing array, not in an allocation
    for i in range(count):
        arrays.append(_read_array(r, i))
    n_names = r.unpack("Q", "the name count")
    if n_names not in (0, count):
        r.fail(f"the file has {count} arrays but {n_names} names; expected 0 or {count}", r.pos - 8)
    names = []
    for i in range(n_names):
        length = r.unpack("Q", f"name {i}'s length")
        at = r.pos
        raw = r.bytes(length, f"name {i}")
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            r.fail(f"name {i} is not UTF-8: {raw[:40]!r}", at)
    return arrays, names


def _wrap(arrays: list, names: list):
    out = [None if a is None else NDArray._from_numpy(a) for a in arrays]  # cpu NDArrays over the read buffers
    return dict(zip(names, out)) if names else out  # a repeated name keeps its last array, as in MXNet


def load(fname) -> list | dict:
    """MXNet's ``nd.load``: a dict name -> NDArray when the file has names, else a list; arrays on the cpu.

    Also reads the older per-array formats (V1, pre-V1). A ``None`` entry stands for MXNet's "none" array.
    """
    path = os.fspath(fname)
    with open(path, "rb") as f:
        return _wrap(*_read_file(_Reader(f, os.fstat(f.fileno()).st_size, path)))


def load_bytes(buf, source: str = "<bytes>") -> list | dict:
    """``load`` from bytes in memory (MXNet's ``nd.load_frombuffer``); ``source`` names it in errors."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise DnnbindTypeError(f"load_bytes: buf must be bytes, bytearray or memoryview, got {type(buf).__name__}")
    data = bytes(buf)
    return _wrap(*_read_file(_Reader(io.BytesIO(data), len(data), source)))


load_frombuffer = load_bytes


# -- npz checkpoints ---------------------------------------------------------------------------------------------

def load_npz(source, name: str | None = None) -> dict:
    """Every array of an ``np.savez`` archive (a path or a seekable binary file), name -> numpy array, read whole.

    Any damage is one CheckpointFileError naming ``name`` (default: the path, or the file object's ``name``);
    a missing file stays FileNotFoundError. Nothing is unpickled.
    """
    if isinstance(source, (str, bytes, os.PathLike)):
        name = name or os.fsdecode(source)
        with open(source, "rb") as f:
            return _read_npz(f, name)
    return _read_npz(source, name or str(getattr(source, "name", "<stream>")))


def _read_npz(f, name: str) -> dict:
    start = f.tell()
    head = f.read(8)
    f.seek(start)
    if head[:4] != b"PK\x03\x04":
        if not head:
            why = "the file is empty"
        elif head.startswith(b"\x93NUMPY"):
            why = "it is a single .npy array, not an npz archive"
        elif len(head) == 8 and struct.unpack("<Q", head)[0] == LIST_MAGIC:
            why = "it is an MXNet NDArray file (nd.save / save_parameters), not an npz archive"
        else:
            why = f"it is not an npz archive (starts with {head[:4]!r}; expected b'PK\\x03\\x04')"
        raise CheckpointFileError(name, why)
    try:
        with zipfile.ZipFile(f) as z:
            return {_npz_key(info.filename): _read_npz_entry(z, info) for info in z.infolist()}
    except Exception as exc:  # noqa: BLE001 - damaged bytes reach zipfile, zlib, struct and numpy's header parser
        # (ast/tokenize): each raises its own kind (BadZipFile, EOFError, OSError, SyntaxError, TokenError, ...)
        raise CheckpointFileError(name, f"corrupt or truncated npz archive ({type(exc).__name__}: {exc})") from None


def _npz_key(filename: str) -> str:
    return filename[:-4] if filename.endswith(".npy") else filename


def _read_npz_entry(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    from numpy.lib import format as npy
    with z.open(info) as m:
        version = npy.read_magic(m)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(m)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(m)
        else:
            raise ValueError(f"entry {info.filename!r} has npy format version {version}")
        if dtype.hasobject:
            raise ValueError(f"entry {info.filename!r} holds Python objects (dtype {dtype}); not a checkpoint")
        nbytes, left = math.prod(shape) * dtype.itemsize, info.file_size - m.tell()
        if nbytes != left:  # checked before reading: a damaged shape must not allocate its size
            raise ValueError(f"entry {info.filename!r} says {shape} {dtype} ({nbytes} bytes) but holds {left}")
        buf = bytearray(nbytes)
        got = m.readinto(buf)
        if got != nbytes or m.read(1):  # reading to the end checks the entry's CRC-32
            raise ValueError(f"entry {info.filename!r}: read {got} of {nbytes} bytes")
    return np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")


# -- writing -----------------------------------------------------------------------------------------------------
def _host(value, key) -> tuple[np.ndarray, int, int]:
    """(C-contiguous little-endian host copy, dev_type, dev_id) of an NDArray or numpy array."""
    if isinstance(value, NDArray):
        dev = value.device
        host = value.data_numpy if dev.kind == "cpu" else value.numpy()
        dev_type, dev_id = (1, 0) if dev.kind == "cpu" else (2, dev.index)
    elif isinstance(value, np.ndarray):
        host, dev_type, dev_id = value, 1, 0
    else:
        raise DnnbindTypeError(f"save: {key} is a {type(value).__name__}; save takes NDArrays (or numpy arrays), "
                        "as a list or a dict str -> array")
    flag = _DTYPE_TO_FLAG.get(host.dtype.newbyteorder("="))
    if flag is None:
        raise DnnbindTypeError(f"save: {key} has dtype {host.dtype}, which MXNet 1.x cannot load; supported: "
                        + ", ".join(d.name for d in _DTYPE_TO_FLAG))
    host = np.asarray(host, dtype=host.dtype.newbyteorder("<"), order="C")  # (ascontiguousarray makes 0-d 1-d)
    return host, dev_type, dev_id


def _normalize(data) -> tuple[list, list]:
    if isinstance(data, (NDArray, np.ndarray)):
        return [data], []
    if isinstance(data, dict):
        bad = [k for k in data if not isinstance(k, str)]
        if bad:
            raise DnnbindTypeError(f"save: dict keys must be str, got {bad[0]!r} ({type(bad[0]).__name__})")
        return list(data.values()), list(data.keys())
    if isinstance(data, (list, tuple)):
        return list(data), []
    raise DnnbindValueError(f"save: data must be an NDArray, a list of NDArrays or a dict str -> NDArray, got "
                     f"{type(data).__name__}")


def _chunks(data):
    """Yield the file's bytes piece by piece (array data as zero-copy byte views)."""
    values, names = _normalize(data)
    keys = [f"array {name!r}" for name in names] or [f"array {i}" for i in range(len(values))]
    prepared = [_host(value, key) for key, value in zip(keys, values)]
    magic = V3_MAGIC if any(h.ndim == 0 for h, _, _ in prepared) else V2_MAGIC  # see the module docstring
    yield struct.pack("<QQQ", LIST_MAGIC, 0, len(prepared))
    for host, dev_type, dev_id in prepared:
        head = struct.pack(f"<Iii{host.ndim}q", magic, 0, host.ndim, *host.shape)
        yield head + struct.pack("<iii", dev_type, dev_id, _DTYPE_TO_FLAG[host.dtype.newbyteorder("=")])
        yield host.reshape(-1).view(np.uint8)
    yield struct.pack("<Q", len(names))
    for name in names:
        raw = name.encode("utf-8")
        yield struct.pack("<Q", len(raw)) + raw


def save_bytes(data) -> bytes:
    """The bytes ``save`` would write."""
    return b"".join(bytes(c) for c in _chunks(data))


def save(fname, data) -> None:
    """MXNet's ``nd.save``: an NDArray, a list of them, or a dict str -> NDArray; atomically.

    The file is written to a temporary file in the same folder, fsynced, then renamed over ``fname``, so a
    crash leaves either the old file or the complete new one.
    """
    chunks = list(_chunks(data))  # validate everything before touching the disk

    def write(f):
        for chunk in chunks:
            f.write(chunk)

    atomic_write(fname, write)


def atomic_write(fname, write) -> None:
    """Call ``write(f)`` on a temporary file in ``fname``'s folder, fsync it, give it the mode a plain ``open``
    would, and rename it over ``fname``: a crash leaves the old file or the complete new one, and a failed write
    leaves no temporary file behind. Every checkpoint writer (nd.save, save_parameters, Trainer.save_states,
    scripts/train.py) goes through here."""
    path = os.fspath(fname)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)  # atomic on POSIX within one filesystem: hence the same folder
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    try:  # Linux says it without changing it (setting it, even briefly, races with other threads)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
