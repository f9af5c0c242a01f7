"""MXNet's RecordIO files (``mxnet.recordio``): MXRecordIO, MXIndexedRecordIO, IRHeader, pack/unpack(_img).

Layer: runtime (file formats, beside serialization); imports numpy and dnnbind._lib / dnnbind.imagecodec only.

The format is dmlc-core's, written here in Python so the files are byte for byte MXNet's. Each record is one or
more parts, each part::

    uint32 magic 0xced7230a | uint32 lrecord (upper 3 bits cflag, lower 29 bits length) | payload | 0-3 zero bytes

all little-endian, the payload padded to 4 bytes. A payload that holds the magic number at a 4-byte-aligned offset
is split there, so a reader that lost its place can find the next record by scanning for the magic: the parts are
cflag 1 (first), 2 (middle), 3 (last), and the magic at each split is dropped from the file and put back by the
reader. cflag 0 is a whole record. dmlc-core refuses records of 2**29 bytes or more (the length field's limit),
so does this module.

The .idx file beside an indexed .rec is text, one ``key\\toffset\\n`` line a record, offset being the byte where the
record's first part starts. A record header (``pack``) is IRHeader packed as ``<IfQQ`` (24 bytes: flag, label,
id, id2), then ``flag`` float32 labels when flag > 0, then the payload.

Reads go through a buffered file: a record costs two reads (header, payload) and one copy only when it was
split or padded. A truncated or corrupt file raises RecordIOError naming the file and the byte offset.
"""

from __future__ import annotations

import numbers
import os
import struct
from collections import namedtuple
from multiprocessing import current_process
from typing import Any

import numpy as np

from . import imagecodec
from ._lib.errors import DnnbindTypeError, DnnbindValueError

__all__ = ["IRHeader", "MXIndexedRecordIO", "MXRecordIO", "RecordIOError", "pack", "pack_img", "unpack",
           "unpack_img"]

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)  # a part header's first 4 bytes; joins a split record's parts
_PART = struct.Struct("<II")  # magic, lrecord
_LEN_BITS = 29
_LEN_MASK = (1 << _LEN_BITS) - 1
_ZEROS = b"\0\0\0"


class RecordIOError(DnnbindValueError):
    """A RecordIO file that is not one, truncated or corrupt: MXNet's MXNetError ("Invalid RecordIO File"), with
    the file and the byte offset of the bad part."""

    def __init__(self, uri: str, offset: int, what: str):
        self.uri, self.offset, self.what = uri, offset, what
        super().__init__(f"{uri}: invalid RecordIO file at byte offset {offset}: {what}")

    def __reduce__(self):
        return (type(self), (self.uri, self.offset, self.what))


def _lrecord(cflag: int, length: int) -> int:
    return (cflag << _LEN_BITS) | length


class MXRecordIO:
    """Sequential RecordIO reader (``flag='r'``) or writer (``flag='w'``, which truncates ``uri``).

    As in MXNet, the file is opened by the constructor, ``reset()`` reopens it (back to the first record; a
    writer starts an empty file again), ``read()`` returns None at the end, and a reader or writer used from
    another process than the one that opened it raises RuntimeError (a forked child would share the file
    position); ``MXIndexedRecordIO.seek`` reopens instead.
    """

    def __init__(self, uri: str | os.PathLike, flag: str):
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid = None
        self.is_open = False
        self._file = None
        self.open()

    def open(self) -> None:
        """Open the file: for reading at its start, or for writing as a new empty file."""
        if self.flag == "w":
            self._file = open(self.uri, "wb")  # noqa: SIM115  (held open until close())
            self.writable = True
        elif self.flag == "r":
            self._file = open(self.uri, "rb")  # noqa: SIM115
            self.writable = False
        else:
            raise DnnbindValueError(f"Invalid flag {self.flag!r}: MXRecordIO takes 'r' (read) or 'w' (write)")
        self.pid = current_process().pid
        self.is_open = True

    def close(self) -> None:
        """Close the file (a writer's records are flushed); closing twice is a no-op."""
        if not self.is_open:
            return
        self._file.close()
        self._file = None
        self.is_open = False
        self.pid = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  (at interpreter shutdown the file may already be gone)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset(self) -> None:
        """Back to the first record (reader), or an empty file again (writer)."""
        self.close()
        self.open()

    # NOTE: MXNet's __getstate__ closes the original; here it stays open, since closing it as a side effect of
    # pickling (the DataLoader does, to send a dataset to its workers) would break the parent's next read. The
    # copy reopens at the first record. An open writer does not pickle: its copy would truncate the file.
    def __getstate__(self) -> dict:
        if self.is_open and self.writable:
            raise DnnbindTypeError(f"an open RecordIO writer ({self.uri}) cannot be pickled: its copy would "
                                   "reopen the file for writing and truncate it; close it first")
        state = dict(self.__dict__)
        state["_file"] = None
        state["pid"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if state["is_open"]:
            self.is_open = False
            self.open()

    def _check_pid(self, allow_reset: bool = False) -> None:
        if not self.is_open:
            raise DnnbindValueError(f"{self.uri}: the RecordIO file is closed; call open() or reset() first")
        if self.pid != current_process().pid:
            if not allow_reset:
                raise RuntimeError("Forbidden operation in multiple processes")
            self.reset()

    def tell(self) -> int:
        """The byte offset where the next record will be written (writer) or read from (reader)."""
        self._check_pid()
        return self._file.tell()

    def write(self, buf) -> None:
        """Append ``buf`` (bytes-like) as one record."""
        if not self.writable:
            raise DnnbindValueError(f"{self.uri} is open for reading (flag 'r'); writing needs flag 'w'")
        self._check_pid()
        if isinstance(buf, str):
            raise DnnbindTypeError("MXRecordIO.write takes bytes, got str (encode it first)")
        data = memoryview(buf).cast("B")
        size = len(data)
        if size >= 1 << _LEN_BITS:
            raise DnnbindValueError(f"RecordIO takes records of less than 2**29 bytes, got {size}")
        # Split at every 4-byte-aligned copy of the magic number, dropping it (see the module docstring).
        aligned = size & ~3
        words = np.frombuffer(data[:aligned], dtype="<u4")
        hits = (np.flatnonzero(words == MAGIC) * 4).tolist() if aligned else []
        f = self._file
        start = 0
        for at in hits:
            f.write(_PART.pack(MAGIC, _lrecord(1 if start == 0 else 2, at - start)))
            f.write(data[start:at])  # aligned start and end: no padding
            start = at + 4
        f.write(_PART.pack(MAGIC, _lrecord(3 if hits else 0, size - start)))
        f.write(data[start:])
        f.write(_ZEROS[: -size % 4])

    def read(self) -> bytes | None:
        """The next record, or None at the end of the file."""
        if self.writable:
            raise DnnbindValueError(f"{self.uri} is open for writing (flag 'w'); reading needs flag 'r'")
        self._check_pid()
        f = self._file
        parts = []
        while True:
            offset = f.tell()
            head = f.read(8)
            if not head and not parts:
                return None
            if len(head) < 8:
                what = (f"the file ends inside a part header ({len(head)} of 8 bytes)" if head else
                        "the file ends inside a split record (its last part, cflag 3, is missing)")
                raise RecordIOError(self.uri, offset, what)
            magic, lrec = _PART.unpack(head)
            if magic != MAGIC:
                raise RecordIOError(self.uri, offset, f"bad magic number 0x{magic:08x} (expected 0x{MAGIC:08x}); "
                                    "not a RecordIO file, or an offset that is not a record's start")
            cflag, length = lrec >> _LEN_BITS, lrec & _LEN_MASK
            if cflag > 3 or (cflag in (0, 1)) != (not parts):
                where = "a record's first part" if not parts else "the middle of a split record"
                raise RecordIOError(self.uri, offset, f"part flag {cflag} cannot stand at {where}")
            padded = (length + 3) & ~3
            body = f.read(padded)
            if len(body) < padded:
                raise RecordIOError(self.uri, offset, f"truncated record: the part needs {padded} bytes after its "
                                    f"header, the file has {len(body)}")
            if cflag == 0:
                return body if padded == length else body[:length]
            parts.append(memoryview(body)[:length])
            if cflag == 3:
                return MAGIC_BYTES.join(parts)


class MXIndexedRecordIO(MXRecordIO):
    """RecordIO with random access through an index file (``idx_path``) of ``key\\toffset`` lines.

    ``keys`` lists the keys in file order and ``idx`` maps each to its offset; keys are ``key_type(text)``.
    ``write_idx(key, buf)`` appends a record and its index line; ``read_idx(key)`` seeks and reads.
    """

    def __init__(self, idx_path: str | os.PathLike, uri: str | os.PathLike, flag: str, key_type: type = int):
        self.idx_path = os.fspath(idx_path)
        self.idx: dict = {}
        self.keys: list = []
        self.key_type = key_type
        self.fidx = None
        super().__init__(uri, flag)

    def open(self) -> None:
        super().open()
        self.idx, self.keys = {}, []
        self.fidx = open(self.idx_path, self.flag)  # noqa: SIM115  (held open until close())
        if self.writable:
            return
        for lineno, line in enumerate(self.fidx, 1):
            fields = line.strip().split("\t")
            if fields == [""]:
                continue  # a blank line (a trailing newline too many)
            if len(fields) != 2:
                raise DnnbindValueError(f"{self.idx_path}:{lineno}: an index line is 'key<TAB>offset', got {line!r}")
            key = self.key_type(fields[0])
            self.idx[key] = int(fields[1])
            self.keys.append(key)

    def close(self) -> None:
        if not self.is_open:
            return
        super().close()
        self.fidx.close()
        self.fidx = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["fidx"] = None
        return state

    def seek(self, idx: Any) -> None:
        """Put the reader at the record of key ``idx`` (reopening the file in a new process)."""
        if self.writable:
            raise DnnbindValueError(f"{self.uri} is open for writing (flag 'w'); seek needs flag 'r'")
        self._check_pid(allow_reset=True)
        try:
            pos = self.idx[idx]
        except KeyError:
            raise KeyError(f"{idx!r} is not a key of {self.idx_path}") from None
        self._file.seek(pos)

    def read_idx(self, idx: Any) -> bytes:
        """The record of key ``idx``."""
        self.seek(idx)
        record = self.read()
        if record is None:
            raise RecordIOError(self.uri, self.idx[idx], f"key {idx!r} of {self.idx_path} points at the end of "
                                "the file")
        return record

    def write_idx(self, idx: Any, buf) -> None:
        """Append ``buf`` as the record of key ``idx`` and its line to the index."""
        key = self.key_type(idx)
        pos = self.tell()
        self.write(buf)
        self.fidx.write(f"{key}\t{pos}\n")
        self.idx[key] = pos
        self.keys.append(key)


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])
IRHeader.__doc__ = """A record's header: ``flag`` (the number of float32 labels when ``label`` is an array, else 0),
``label`` (a float, or an array of floats), ``id`` and ``id2`` (uint64; id2 the high bits of a long id, usually 0)."""

_IR = struct.Struct("<IfQQ")  # what MXNet's native "IfQQ" is on the little-endian hosts it runs on
_IR_SIZE = _IR.size


def pack(header, s: bytes) -> bytes:
    """``header`` (an IRHeader or a 4-tuple) and the payload ``s`` as one record's bytes. A number label is
    stored in the header (flag 0); anything else is a float32 label array stored after it (flag its size)."""
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
    else:
        label = np.asarray(header.label, dtype=np.float32)
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + bytes(s)
    return _IR.pack(*header) + bytes(s)


def unpack(s: bytes) -> tuple:
    """A record's (IRHeader, payload); the label is a float32 numpy array when the header's flag is > 0."""
    if len(s) < _IR_SIZE:
        raise DnnbindValueError(f"recordio.unpack: a record starts with a {_IR_SIZE}-byte IRHeader, got "
                                f"{len(s)} bytes")
    header = IRHeader(*_IR.unpack_from(s))
    s = s[_IR_SIZE:]
    if header.flag > 0:
        if len(s) < 4 * header.flag:
            raise DnnbindValueError(f"recordio.unpack: the header says {header.flag} float32 labels, the record "
                                    f"has {len(s)} bytes after the header")
        header = header._replace(label=np.frombuffer(s, np.float32, header.flag))
        s = s[4 * header.flag:]
    return header, s


def unpack_img(s: bytes, iscolor: int = -1) -> tuple:
    """A record's (IRHeader, image): the image decoded as OpenCV's ``imdecode(buf, iscolor)`` gives it (BGR, BGRA
    or 2-D gray uint8 numpy; -1 keeps what the file has), or None when the payload is not an image."""
    header, s = unpack(s)
    return header, imagecodec.decode(s, iscolor)


def pack_img(header, img: np.ndarray, quality: int = 95, img_fmt: str = ".jpg") -> bytes:
    """``header`` and ``img`` (BGR/BGRA/gray uint8, OpenCV's layout) encoded as ``img_fmt`` ('.jpg' with JPEG
    ``quality`` 1-100, or '.png' with compression ``quality`` 0-9) as one record's bytes."""
    return pack(header, imagecodec.encode(img, img_fmt, quality))
