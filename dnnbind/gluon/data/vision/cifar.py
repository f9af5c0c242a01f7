"""CIFAR-10 and CIFAR-100 with MXNet Gluon semantics (``mxnet.gluon.data.vision.CIFAR10`` / ``CIFAR100``).

Layer: gluon: data; imports numpy, the standard library and dnnbind.gluon.data only.

Item i is (image, label): a CPU NDArray uint8 (32, 32, 3) and a numpy int32, as MXNet gives them; ``.data``
(N, 32, 32, 3) uint8 and ``.label`` (N,) int32 hold the whole split for the DataLoader's batched path.

Where the files are looked for, in ``root`` (default ``$MXNET_HOME/datasets/cifar10`` or ``cifar100``, with
``$MXNET_HOME`` defaulting to ``~/.mxnet``, MXNet's folder), first hit wins:
  1. MXNet's binary files right in root (data_batch_1.bin ... test_batch.bin; CIFAR-100 train.bin, test.bin),
     or in the archives' folders cifar-10-batches-bin/ / cifar-100-binary/;
  2. the Python-pickle batches of the original archives (cifar-10-batches-py/data_batch_1 ... test_batch;
     cifar-100-python/train, test), read with an unpickler that builds numpy arrays and nothing else;
  3. an archive in root (MXNet's cifar-10-binary.tar.gz, or cifar-10-python.tar.gz etc.): only the expected
     files are taken out of it, by name, never a path from inside the archive;
  4. MXNet's archive downloaded from its repository ($MXNET_GLUON_REPO), sha1-checked, unless
     $DNNBIND_OFFLINE is set. The machines this runs on have no network: it fails within seconds.
Otherwise FileNotFoundError lists every place tried and why.

NOTE: MXNet 1.9.1 also checks each binary file's sha1 against the real data set's and, on any mismatch, downloads
the archive again (offline: a ConnectionError after 5 tries). dnnbind reads any well-formed files of whole
records, so a subset or generated files (d2l_check --fake-cifar10) work offline where MXNet's own loader refuses them.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindValueError

import hashlib
import http.client
import os
import pickle
import tarfile
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

from .._home import dataset_dir, note_source
from ..dataset import Dataset
from .idx import atomic_write
from .mnist import NumpyOnlyUnpickler

# Per data set: binary files per split, the binary archive folder, the pickle folder and files per split,
# the archives (name -> pickle or binary), and MXNet's archive with its sha1 (python/mxnet/gluon/data/vision/
# datasets.py at v1.9.x).
_SETS = {
    "cifar10": {
        "bin": {True: [f"data_batch_{i}.bin" for i in range(1, 6)], False: ["test_batch.bin"]},
        "bin_dir": "cifar-10-batches-bin",
        "py": {True: [f"data_batch_{i}" for i in range(1, 6)], False: ["test_batch"]},
        "py_dir": "cifar-10-batches-py",
        "archives": {"cifar-10-binary.tar.gz": "bin", "cifar-10-python.tar.gz": "py"},
        "mxnet": ("cifar-10-binary.tar.gz", "fab780a1e191a7eda0f345501ccd62d20f7ed891"),
    },
    "cifar100": {
        "bin": {True: ["train.bin"], False: ["test.bin"]},
        "bin_dir": "cifar-100-binary",
        "py": {True: ["train"], False: ["test"]},
        "py_dir": "cifar-100-python",
        "archives": {"cifar-100-binary.tar.gz": "bin", "cifar-100-python.tar.gz": "py"},
        "mxnet": ("cifar-100-binary.tar.gz", "a0bb982c76b83111308126cc779a992fa506b90b"),
    },
}
DEFAULT_REPO = "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/"
DOWNLOAD_TIMEOUT = 5.0  # seconds per network operation: an offline machine fails fast
_urlopen: Callable[..., Any] = urllib.request.urlopen  # tests substitute an opener; never a real host in tests
_PIXELS = 3 * 32 * 32


def default_root(namespace: str) -> str:
    """$MXNET_HOME/datasets/<namespace> (~/.mxnet/... without MXNET_HOME), MXNet's folder."""
    return dataset_dir(namespace)


# ---- readers: (images (N, 32, 32, 3) uint8, labels (N,) int32) -------------------------------------------------

def _images(rows: np.ndarray) -> np.ndarray:
    # Each row is 1024 red, 1024 green, 1024 blue bytes, each plane row-major 32 x 32.
    return np.ascontiguousarray(rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def read_binary(path: str, label_bytes: int, label_index: int) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch: each record is ``label_bytes`` label bytes then 3072 pixel bytes."""
    raw = np.fromfile(path, dtype=np.uint8)
    record = label_bytes + _PIXELS
    if raw.size == 0 or raw.size % record:
        raise DnnbindValueError(f"{path}: {raw.size} bytes is not a whole number of {record}-byte CIFAR records")
    rows = raw.reshape(-1, record)
    return _images(rows[:, label_bytes:]), rows[:, label_index].astype(np.int32)


def _field(d: dict, key: str, path: str) -> Any:
    for k in (key, key.encode()):  # Python 2 pickles read as latin1 have str keys; Python 3 ones may have bytes
        if k in d:
            return d[k]
    raise DnnbindValueError(f"{path}: no {key!r} entry (keys: {sorted(map(str, d))})")


def _latin1_bytes(text: Any, encoding: str = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode of {type(text).__name__} with {encoding!r}")
    return text.encode("latin1")


class _BatchUnpickler(NumpyOnlyUnpickler):
    """NumpyOnlyUnpickler, plus the one call Python 3 writes for bytes under pickle protocol 2
    (``_codecs.encode(text, 'latin1')``), restricted to exactly that, so re-saved batches load too."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        return super().find_class(module, name)


def read_pickle(path: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch: a dict with 'data' (N, 3072) uint8 and a list of labels under ``label_key``."""
    with open(path, "rb") as f:
        # latin1: the original batches are Python 2 pickles (str keys, array bytes as str)
        obj = _BatchUnpickler(f, encoding="latin1").load()
    if not isinstance(obj, dict):
        raise DnnbindValueError(f"{path}: expected a dict, got {type(obj).__name__}")  # noqa: TRY004 (bad file content)
    data = np.asarray(_field(obj, "data", path))
    labels = np.asarray(_field(obj, label_key, path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise DnnbindValueError(f"{path}: 'data' must be uint8 (N, {_PIXELS}), got {data.dtype} {data.shape}")
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise DnnbindValueError(f"{path}: {label_key!r} has shape {labels.shape} ({labels.dtype}) for {len(data)} images")
    return _images(data), labels.astype(np.int32)


# ---- finding the files -----------------------------------------------------------------------------------------

def _read_split(folder: str, kind: str, names: list[str], label: tuple[int, int, str]) -> tuple:
    """Concatenated (images, labels) of ``names`` in ``folder``; a str saying why not if a file is missing."""
    paths = [os.path.join(folder, n) for n in names]
    missing = [n for n, p in zip(names, paths) if not os.path.isfile(p)]
    if missing:
        return f"no {', '.join(missing)}"
    label_bytes, label_index, label_key = label
    parts = [read_binary(p, label_bytes, label_index) if kind == "bin" else read_pickle(p, label_key)
             for p in paths]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _layouts(spec: dict, root: str) -> list[tuple[str, str]]:
    return [(root, "bin"), (os.path.join(root, spec["bin_dir"]), "bin"),
            (os.path.join(root, spec["py_dir"]), "py"), (root, "py")]


def extract(archive: str, dest: str, names: list[str]) -> list[str]:
    """Copy the members of a tar archive whose file names are in ``names`` into ``dest`` (by name only, so
    no member can write outside ``dest``); returns the names found."""
    found = []
    with tarfile.open(archive) as tar:
        for member in tar:
            name = os.path.basename(member.name)
            if member.isfile() and name in names and name not in found:
                atomic_write(os.path.join(dest, name), tar.extractfile(member).read())
                found.append(name)
    return found


def download(spec: dict, root: str) -> str:
    """Fetch MXNet's archive into ``root``, sha1-checked; returns its path. Raises OSError."""
    fname, sha1 = spec["mxnet"]
    repo = os.environ.get("MXNET_GLUON_REPO", DEFAULT_REPO)
    url = repo.rstrip("/") + f"/gluon/dataset/{spec['namespace']}/{fname}"
    try:
        with _urlopen(url, timeout=DOWNLOAD_TIMEOUT) as r:
            payload = r.read()
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise OSError(f"{url}: {e}") from e
    digest = hashlib.sha1(payload).hexdigest()
    if digest != sha1:
        raise OSError(f"{url}: sha1 {digest} != expected {sha1}")
    path = os.path.join(root, fname)
    atomic_write(path, payload)
    return path


def load_cifar(namespace: str, root: str | os.PathLike | None, train: bool, fine_label: bool = False
               ) -> tuple[np.ndarray, np.ndarray, str]:
    """(images (N, 32, 32, 3) uint8, labels (N,) int32, where they came from) for one split."""
    spec = dict(_SETS[namespace], namespace=namespace)
    root = os.path.abspath(os.path.expanduser(os.fspath(root) if root is not None else default_root(namespace)))
    if namespace == "cifar10":
        label, classes = (1, 0, "labels"), 10
    else:
        label = (2, 1, "fine_labels") if fine_label else (2, 0, "coarse_labels")
        classes = 100 if fine_label else 20
    split = "train" if train else "test"
    tried: list[str] = []

    def attempt() -> tuple | None:
        for folder, kind in _layouts(spec, root):
            try:
                got = _read_split(folder, kind, spec[kind][train], label)
            except (ValueError, OSError, EOFError, pickle.UnpicklingError) as e:
                tried.append(f"{folder} ({kind}): unusable: {e}")
                continue
            if isinstance(got, str):
                tried.append(f"{folder} ({'binary' if kind == 'bin' else 'pickle'} files): {got}")
                continue
            images, labels = got
            if labels.size and (labels.min() < 0 or labels.max() >= classes):
                tried.append(f"{folder}: labels outside 0..{classes - 1} ({labels.min()}..{labels.max()})")
                continue
            return images, labels, folder
        return None

    found = attempt()
    if found is None:
        for archive, kind in spec["archives"].items():
            path = os.path.join(root, archive)
            if os.path.isfile(path):
                dest = root if kind == "bin" else os.path.join(root, spec["py_dir"])
                try:
                    extract(path, dest, spec[kind][True] + spec[kind][False])
                except (tarfile.TarError, OSError, EOFError) as e:
                    tried.append(f"{path}: unusable archive: {e}")
        found = attempt() if any(os.path.isfile(os.path.join(root, a)) for a in spec["archives"]) else None
    if found is None:
        if os.environ.get("DNNBIND_OFFLINE"):
            tried.append("download: skipped because $DNNBIND_OFFLINE is set")
        else:
            try:
                path = download(spec, root)
                name = "CIFAR-10" if namespace == "cifar10" else "CIFAR-100"
                note_source(name, root, f"{name}: downloaded {os.path.basename(path)} into {root}")
                extract(path, root, spec["bin"][True] + spec["bin"][False])
                found = attempt()
            except (OSError, tarfile.TarError, EOFError) as e:
                tried.append(f"download into {root}: {e}")
    if found is None:
        name = "CIFAR-10" if namespace == "cifar10" else "CIFAR-100"
        lines = "\n".join(f"  - {t}" for t in dict.fromkeys(tried))
        raise FileNotFoundError(
            f"{name} ({split} split) not found in {root}. Tried:\n{lines}\n"
            f"Fix: put {' / '.join(spec['archives'])} (or its extracted files) in {root}, or pass root=")
    return found


class CIFAR10(Dataset):
    """CIFAR-10: 50,000 training / 10,000 test colour images of 10 classes, MXNet's
    ``gluon.data.vision.CIFAR10(root, train, transform)``: item i is (uint8 (32, 32, 3) CPU NDArray, int32),
    or ``transform(image, label)`` of those; a slice gives a (k, 32, 32, 3) NDArray and an int32 array."""

    _namespace = "cifar10"

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 transform: Callable | None = None) -> None:
        self._train, self._transform = train, transform
        self.data, self.label, self.source = load_cifar(self._namespace, root, train, self._fine())
        self.data.setflags(write=False)

    def _fine(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self.label)

    def _batch_arrays(self) -> list[np.ndarray] | None:
        # The DataLoader's batched path; a (data, label) transform needs the per-sample path.
        return [self.data, self.label] if self._transform is None else None

    def __getitem__(self, idx: Any) -> Any:
        from ....runtime.array import NDArray  # lazy: importing the data layer loads no runtime
        image = NDArray._from_numpy(np.array(self.data[idx]))
        if self._transform is not None:
            return self._transform(image, self.label[idx])
        return image, self.label[idx]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'train' if self._train else 'test'}, {len(self)} images from {self.source})"


class CIFAR100(CIFAR10):
    """CIFAR-100: ``fine_label=False`` (MXNet's default) gives the 20 coarse super-class labels, ``True`` the
    100 fine class labels. Otherwise as CIFAR10 (default root ``$MXNET_HOME/datasets/cifar100``)."""

    _namespace = "cifar100"

    def __init__(self, root: str | os.PathLike | None = None, fine_label: bool = False, train: bool = True,
                 transform: Callable | None = None) -> None:
        self._fine_label = bool(fine_label)
        super().__init__(root, train, transform)

    def _fine(self) -> bool:
        return self._fine_label

