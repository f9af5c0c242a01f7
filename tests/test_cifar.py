"""gluon.data.vision.CIFAR10 / CIFAR100 on small fake files written here in both formats: MXNet's binary records
(label byte(s) then 3072 pixel bytes, planes R, G, B) and the Python-pickle batches of the original archives
(protocol 2 dicts with bytes keys, as the real files are). No network: the download is checked with fake openers.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile

import numpy as np
import pytest

import dnnbind
from dnnbind.gluon import data as gdata
from dnnbind.gluon.data.vision import CIFAR10, CIFAR100, cifar
from dnnbind.gluon.data.vision import transforms as T


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """A temp HOME without MXNET_HOME, and an opener that fails like an offline machine."""
    for var in ("MXNET_HOME", "DNNBIND_OFFLINE", "MXNET_GLUON_REPO"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    calls = []

    def opener(url, timeout=None):
        calls.append((url, timeout))
        raise OSError("Name or service not known")

    monkeypatch.setattr(cifar, "_urlopen", opener)
    return calls


def _records(n, seed, classes, fine_classes=None):
    """Pixels (n, 3072) uint8 and labels: (n,) or, for CIFAR-100, coarse and fine (n,) each."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, classes, n)
    if fine_classes is None:
        return pixels, labels
    return pixels, labels, rng.integers(0, fine_classes, n)


def _expected_images(pixels):
    """Image i, row y, column x, channel c is byte c * 1024 + y * 32 + x of record i."""
    out = np.empty((len(pixels), 32, 32, 3), np.uint8)
    for i, rec in enumerate(pixels):
        for c in range(3):
            for y in range(32):
                out[i, y, :, c] = rec[c * 1024 + y * 32: c * 1024 + y * 32 + 32]
    return out


def _write_bin(path, pixels, *label_columns):
    rows = np.concatenate([np.stack(label_columns, axis=1).astype(np.uint8), pixels], axis=1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows.tofile(path)


def _write_pickle(path, obj, protocol=2):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def _cifar10_files(folder, kind, sizes=(2, 1, 3, 1, 2), test=3):
    """Train batches of ``sizes`` records and a test batch; returns {train: (pixels, labels)}."""
    parts = {True: [], False: []}
    names = {True: [f"data_batch_{i}" for i in range(1, 6)], False: ["test_batch"]}
    for train, counts in ((True, sizes), (False, (test,))):
        for k, (name, n) in enumerate(zip(names[train], counts)):
            pixels, labels = _records(n, 10 * k + train, 10)
            if kind == "bin":
                _write_bin(os.path.join(folder, name + ".bin"), pixels, labels)
            else:
                _write_pickle(os.path.join(folder, name), {b"batch_label": b"fake", b"labels": labels.tolist(),
                                                           b"data": pixels, b"filenames": [b"x.png"] * n})
            parts[train].append((pixels, labels))
    return {t: (np.concatenate([p for p, _ in v]), np.concatenate([lab for _, lab in v])) for t, v in parts.items()}


@pytest.mark.parametrize("kind,sub", [("bin", ""), ("bin", "cifar-10-batches-bin"), ("py", "cifar-10-batches-py")])
def test_cifar10_formats(tmp_path, kind, sub):
    want = _cifar10_files(str(tmp_path / sub), kind)
    for train in (True, False):
        ds = CIFAR10(root=str(tmp_path), train=train)
        pixels, labels = want[train]
        assert len(ds) == len(labels) == ds.data.shape[0]
        np.testing.assert_array_equal(ds.data, _expected_images(pixels))
        np.testing.assert_array_equal(ds.label, labels)
        assert ds.label.dtype == np.int32 and ds.data.dtype == np.uint8
        img, lab = ds[len(ds) - 1]
        assert isinstance(img, dnnbind.NDArray) and img.shape == (32, 32, 3) and img.dtype == np.uint8
        assert img.device.kind == "cpu" and isinstance(lab, np.int32) and lab == labels[-1]
        np.testing.assert_array_equal(img.asnumpy(), _expected_images(pixels[-1:])[0])
    batch, labs = CIFAR10(root=str(tmp_path))[0:3]
    assert isinstance(batch, dnnbind.NDArray) and batch.shape == (3, 32, 32, 3) and labs.shape == (3,)


def test_cifar10_single_record_and_transform(tmp_path):
    _cifar10_files(str(tmp_path), "bin", sizes=(1, 1, 1, 1, 1), test=1)
    ds = CIFAR10(root=str(tmp_path), train=False, transform=lambda x, y: (x.asnumpy().sum(), y + 100))
    assert len(ds) == 1 and ds[0][1] >= 100 and ds._batch_arrays() is None
    assert CIFAR10(root=str(tmp_path), train=False)._batch_arrays() is not None


@pytest.mark.parametrize("kind", ["bin", "py"])
@pytest.mark.parametrize("fine", [False, True])
def test_cifar100_coarse_and_fine_labels(tmp_path, kind, fine):
    data = {}
    for train, name, n in ((True, "train", 4), (False, "test", 1)):
        pixels, coarse, fine_labels = _records(n, 3 + train, 20, 100)
        if kind == "bin":
            _write_bin(str(tmp_path / (name + ".bin")), pixels, coarse, fine_labels)
        else:
            _write_pickle(str(tmp_path / "cifar-100-python" / name),  # a re-saved file: str keys, protocol 4
                          {"data": pixels, "fine_labels": fine_labels.tolist(), "coarse_labels": coarse.tolist()},
                          protocol=4)
        data[train] = (pixels, fine_labels if fine else coarse)
    for train in (True, False):
        ds = CIFAR100(root=str(tmp_path), fine_label=fine, train=train)
        np.testing.assert_array_equal(ds.data, _expected_images(data[train][0]))
        np.testing.assert_array_equal(ds.label, data[train][1])
    assert "CIFAR100(train, 4 images" in repr(CIFAR100(root=str(tmp_path), fine_label=fine))


def test_default_root_is_mxnet_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    want = _cifar10_files(str(tmp_path / "mxhome" / "datasets" / "cifar10"), "bin")
    assert len(CIFAR10(train=False)) == len(want[False][1])
    monkeypatch.delenv("MXNET_HOME")
    _cifar10_files(str(tmp_path / "home" / ".mxnet" / "datasets" / "cifar10"), "py", sizes=(1,) * 5, test=2)
    assert len(CIFAR10(train=False)) == 2


def test_missing_files_fail_fast_naming_where_it_looked(tmp_path, offline, monkeypatch):
    with pytest.raises(FileNotFoundError) as e:
        CIFAR10(root=str(tmp_path / "empty"), train=False)
    msg = str(e.value)
    assert "CIFAR-10 (test split) not found in" in msg and str(tmp_path / "empty") in msg
    assert "no test_batch.bin" in msg and "cifar-10-batches-py" in msg and "cifar-10-binary.tar.gz" in msg
    assert "Name or service not known" in msg and offline[0][1] == cifar.DOWNLOAD_TIMEOUT
    assert offline[0][0].endswith("/gluon/dataset/cifar10/cifar-10-binary.tar.gz")
    monkeypatch.setenv("DNNBIND_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"(?s)CIFAR-100 \(train split\).*DNNBIND_OFFLINE is set"):
        CIFAR100(root=str(tmp_path / "empty"))
    assert len(offline) == 1


def _tar_gz(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _file_bytes(folder, kind, sizes=(1,) * 5, test=2):
    src = folder / "src"
    want = _cifar10_files(str(src), kind, sizes, test)
    return want, {p: (src / p).read_bytes() for p in os.listdir(src)}


def test_archive_in_root_is_extracted_by_name_only(tmp_path):
    want, files = _file_bytes(tmp_path, "py")
    members = {f"cifar-10-batches-py/{n}": b for n, b in files.items()}
    members["../../evil"] = b"pwned"
    root = tmp_path / "root"
    root.mkdir()
    (root / "cifar-10-python.tar.gz").write_bytes(_tar_gz(members))
    ds = CIFAR10(root=str(root), train=False)
    np.testing.assert_array_equal(ds.label, want[False][1])
    assert not (tmp_path / "evil").exists() and not (root / "evil").exists()
    assert (root / "cifar-10-batches-py" / "data_batch_3").is_file()


def test_download_checks_sha1_then_extracts(tmp_path, monkeypatch, caplog):
    want, files = _file_bytes(tmp_path, "bin")
    archive = _tar_gz(files)
    served = []

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def opener(url, timeout=None):
        served.append(url)
        return Response(archive)

    monkeypatch.setattr(cifar, "_urlopen", opener)
    monkeypatch.setenv("MXNET_GLUON_REPO", "https://mirror.invalid/repo")
    root = tmp_path / "dl"
    with pytest.raises(FileNotFoundError, match=r"sha1 [0-9a-f]{40} != expected fab780a1"):
        CIFAR10(root=str(root), train=False)
    assert served == ["https://mirror.invalid/repo/gluon/dataset/cifar10/cifar-10-binary.tar.gz"]
    assert not (root / "cifar-10-binary.tar.gz").exists()
    spec = dict(cifar._SETS["cifar10"], mxnet=("cifar-10-binary.tar.gz", hashlib.sha1(archive).hexdigest()))
    monkeypatch.setitem(cifar._SETS, "cifar10", spec)
    from dnnbind.gluon.data import _home
    monkeypatch.setattr(_home, "_said", set())
    ds = CIFAR10(root=str(root), train=True)
    np.testing.assert_array_equal(ds.label, want[True][1])
    assert (root / "cifar-10-binary.tar.gz").is_file() and (root / "data_batch_5.bin").is_file()
    notes = [r.getMessage() for r in caplog.records if r.name == "dnnbind.gluon.data"]
    assert notes == [f"CIFAR-10: downloaded cifar-10-binary.tar.gz into {root}"]  # said once, as MXNet prints
    CIFAR10(root=str(root), train=False)  # found in root, where MXNet reads it: nothing more to say
    assert len([r for r in caplog.records if r.name == "dnnbind.gluon.data"]) == 1


def test_unsafe_or_broken_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNBIND_OFFLINE", "1")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    _write_pickle(str(tmp_path / "cifar-10-batches-py" / "test_batch"), {b"data": Evil(), b"labels": [1]})
    with pytest.raises(FileNotFoundError, match="refusing to unpickle global (posix|os|nt).system"):
        CIFAR10(root=str(tmp_path), train=False)
    (tmp_path / "test_batch.bin").write_bytes(b"\x01" * 3000)
    with pytest.raises(FileNotFoundError, match="3000 bytes is not a whole number of 3073-byte CIFAR records"):
        CIFAR10(root=str(tmp_path), train=False)
    pixels, _ = _records(2, 0, 10)
    _write_bin(str(tmp_path / "test_batch.bin"), pixels, np.array([3, 12]))
    with pytest.raises(FileNotFoundError, match=r"labels outside 0\.\.9 \(3\.\.12\)"):
        CIFAR10(root=str(tmp_path), train=False)
    _write_pickle(str(tmp_path / "cifar-10-batches-py" / "test_batch"), {b"data": pixels, b"labels": [1, 2, 3]})
    with pytest.raises(FileNotFoundError, match=r"'labels' has shape \(3,\).*for 2 images"):
        CIFAR10(root=str(tmp_path), train=False)


def test_dataloader_with_augmentation_and_mxnet_alias(tmp_path):
    _cifar10_files(str(tmp_path), "bin", sizes=(3, 2, 2, 2, 1))
    augs = T.Compose([T.RandomFlipLeftRight(), T.ToTensor()])
    loader = gdata.DataLoader(CIFAR10(root=str(tmp_path)).transform_first(augs), batch_size=4, shuffle=True)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 3, 32, 32), (4, 3, 32, 32), (2, 3, 32, 32)]
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int32
    dnnbind.install_mxnet_alias()
    import mxnet as mx
    from mxnet.gluon.data.vision.datasets import CIFAR100 as AliasCIFAR100
    assert mx.gluon.data.vision.CIFAR10 is CIFAR10 and AliasCIFAR100 is CIFAR100
