"""ImageRecordIter decoding in worker processes (``DNNBIND_IMAGE_DECODE=processes``, dnnbind.image.record_iter):
the batches are the threads' value for value (each image's random draws come from its own seed), for plain and
detection records, over epochs and a wrapped last batch; a consumer that keeps every batch gets intact, distinct
batches; a worker's error reaches the caller; the shared files go when the iterator does; no room in /dev/shm
falls back to threads."""

import gc
import glob
import os

import numpy as np
import pytest

from dnnbind import io as mxio
from dnnbind import recordio
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.image import record_iter as ri

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_image")
NORM = dict(mean_r=123.68, mean_g=116.28, mean_b=103.53, std_r=58.395, std_g=57.12, std_b=57.375)

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm") or not hasattr(os, "fork"),
                                reason="worker processes need fork and /dev/shm")


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    d = tmp_path_factory.mktemp("procrec")
    rng = np.random.default_rng(0)
    path = str(d / "img.rec")
    with recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w") as w:
        for i in range(11):
            h, wd = int(rng.integers(30, 70)), int(rng.integers(30, 70))
            img = np.clip(rng.normal(128, 60, (h, wd, 3)), 0, 255).astype(np.uint8)
            w.write_idx(i, recordio.pack_img(recordio.IRHeader(0, float(i % 5), i, 0), img, quality=90,
                                             img_fmt=".jpg"))
    return path


def _files():
    return set(glob.glob("/dev/shm/dnnbind-imgrec-*"))


def _epochs(cls, mode, monkeypatch, epochs=2, **kw):
    monkeypatch.setenv(ri.DECODE_ENV, mode)
    it = cls(**kw)
    assert (it._ring is not None) == (mode == "processes")
    out = []
    for _ in range(epochs):
        out.append([(b.data[0].numpy(), b.label[0].numpy(), b.pad) for b in it])
        it.reset()
    it.close()
    return out


@pytest.mark.parametrize("extra", [dict(), dict(round_batch=False), dict(dtype="float16", shuffle=True)])
def test_same_batches_as_threads(rec, monkeypatch, extra):
    kw = dict(path_imgrec=rec, data_shape=(3, 24, 24), batch_size=4, rand_crop=True, rand_mirror=True,
              max_random_contrast=0.3, seed=3, preprocess_threads=2, **NORM, **extra)
    before = _files()
    a = _epochs(mxio.ImageRecordIter, "threads", monkeypatch, **kw)
    b = _epochs(mxio.ImageRecordIter, "processes", monkeypatch, **kw)
    assert len(a[0]) == 3 and a[0][-1][2] == 1  # 11 records: a last batch with one pad
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for (x, lx, px), (y, ly, py) in zip(ea, eb):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(lx, ly)
            assert px == py
    assert np.abs(a[0][0][0]).max() > 0  # real images, not zeros
    assert _files() == before  # close() unlinked the shared files


def test_detection_batches_as_threads(monkeypatch):
    kw = dict(path_imgrec=os.path.join(HERE, "det.rec"), data_shape=(3, 16, 16), batch_size=2, rand_mirror_prob=0.5,
              rand_crop_prob=0.5, num_crop_sampler=1, min_crop_scales=(0.5,), preprocess_threads=2, seed=1)
    a = _epochs(mxio.ImageDetRecordIter, "threads", monkeypatch, **kw)
    b = _epochs(mxio.ImageDetRecordIter, "processes", monkeypatch, **kw)
    for ea, eb in zip(a, b):
        for (x, lx, _), (y, ly, _) in zip(ea, eb):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(lx, ly)


def test_a_consumer_keeping_every_batch(rec, monkeypatch):
    """list(it) keeps all batches: past the ring's share they are copies, and every one holds its own images."""
    kw = dict(path_imgrec=rec, data_shape=(3, 16, 16), batch_size=2, preprocess_threads=2, prefetch_buffer=1,
              **NORM)
    want = _epochs(mxio.ImageRecordIter, "threads", monkeypatch, epochs=1, **kw)[0]
    monkeypatch.setenv(ri.DECODE_ENV, "processes")
    it = mxio.ImageRecordIter(**kw)
    kept = list(it)
    assert len(it._ring.pairs) <= it._ring.limit
    it.close()  # the batches stay readable after the iterator is closed
    assert len(kept) == len(want) == 6
    for b, (x, lx, _) in zip(kept, want):
        np.testing.assert_array_equal(b.data[0].numpy(), x)
        np.testing.assert_array_equal(b.label[0].numpy(), lx)


def test_a_collected_iterator_removes_its_files(rec, monkeypatch):
    monkeypatch.setenv(ri.DECODE_ENV, "processes")
    before = _files()
    it = mxio.ImageRecordIter(path_imgrec=rec, data_shape=(3, 16, 16), batch_size=2, preprocess_threads=2)
    batch = next(iter(it))
    assert _files() - before
    values = batch.data[0].numpy()
    del it
    gc.collect()
    assert _files() == before
    np.testing.assert_array_equal(batch.data[0].numpy(), values)  # still mapped while the batch lives


def test_a_workers_error_reaches_the_caller(tmp_path, monkeypatch):
    path = str(tmp_path / "bad.rec")
    with recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w") as w:
        w.write_idx(0, recordio.pack(recordio.IRHeader(0, 1.0, 0, 0), b"not an image at all"))
    monkeypatch.setenv(ri.DECODE_ENV, "processes")
    it = mxio.ImageRecordIter(path_imgrec=path, data_shape=(3, 8, 8), batch_size=1, preprocess_threads=1)
    with pytest.raises(DnnbindValueError, match="not a decodable image"):
        next(iter(it))
    it.close()


def test_no_room_falls_back_to_threads(rec, monkeypatch):
    monkeypatch.setenv(ri.DECODE_ENV, "processes")
    monkeypatch.setattr(ri._SharedRing, "ROOT", "/nonexistent-dnnbind-shm")
    with pytest.warns(UserWarning, match="decoding in threads"):
        it = mxio.ImageRecordIter(path_imgrec=rec, data_shape=(3, 8, 8), batch_size=2)
    assert it._ring is None and next(iter(it)).data[0].shape == (2, 3, 8, 8)
    it.close()


def test_the_switch_is_checked(rec, monkeypatch):
    monkeypatch.setenv(ri.DECODE_ENV, "fibers")
    with pytest.raises(DnnbindValueError, match="threads' or 'processes'"):
        mxio.ImageRecordIter(path_imgrec=rec, data_shape=(3, 8, 8), batch_size=2)
