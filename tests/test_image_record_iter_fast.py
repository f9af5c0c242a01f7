"""ImageRecordIter's hot path (dnnbind.image.record_iter, issue 26): each image's random generator built from a
hashed seed state, the mean/std/layout stage as per-channel tables, one pread per record, a pool task per run of
images. Each is held to the plain computation it replaces: numpy's own generators, the per-pixel float32 formula,
recordio's reader, one thread."""

import os

import numpy as np
import pytest

from dnnbind import io as mxio
from dnnbind import recordio
from dnnbind.image import record_iter as ri

NORM = dict(mean_r=123.68, mean_g=116.28, mean_b=103.53, mean_a=7.5, std_r=58.395, std_g=57.12, std_b=57.375,
            std_a=3.0)


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    """JPEG (color), PNG with alpha, and records split by the writer (an id holding RecordIO's magic number)."""
    d = tmp_path_factory.mktemp("fastrec")
    rng = np.random.default_rng(0)
    paths = {}
    for name, n, ch, fmt in (("rgb", 9, 3, ".jpg"), ("rgba", 5, 4, ".png")):
        path = str(d / f"{name}.rec")
        with recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w") as rec:
            for i in range(n):
                h, w = int(rng.integers(30, 60)), int(rng.integers(30, 60))
                img = np.clip(rng.normal(128, 60, (h, w, ch)), 0, 255).astype(np.uint8)
                rec.write_idx(i, recordio.pack_img(recordio.IRHeader(0, float(i), i, 0), img, quality=90,
                                                   img_fmt=fmt))
        paths[name] = path
    path = str(d / "split.rec")
    with recordio.MXRecordIO(path, "w") as rec:
        for i in range(4):
            img = np.clip(rng.normal(128, 60, (40, 44, 3)), 0, 255).astype(np.uint8)
            rec.write(recordio.pack_img(recordio.IRHeader(0, float(i), recordio.MAGIC if i % 2 else i, 0), img))
    paths["split"] = path
    return paths


def test_seed_states_are_numpys():
    """_pcg64_seed_states gives PCG64(SeedSequence(row)).state for every row, zeros and 2**32 - 1 included."""
    rng = np.random.default_rng(1)
    rows = np.stack([rng.integers(0, 2 ** 32, 300), rng.integers(0, 100, 300), rng.integers(0, 2 ** 32, 300)], 1)
    rows[:4] = [[0, 0, 0], [0, 0, 1], [2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1], [7, 0, 0]]
    got = ri._pcg64_seed_states(rows)
    for row, (state, inc) in zip(rows, got):
        want = np.random.PCG64(np.random.SeedSequence(row.tolist())).state["state"]
        assert want == {"state": state, "inc": inc}, row


class _PerPixel(mxio.ImageRecordIter):
    """The stage the tables replace, per pixel: mirror, BGR(A) -> RGB(A), CHW, then the float32 formula."""

    def _normalize(self, res, rng, out):
        p = self._p
        if (p["rand_mirror"] and rng.random() < 0.5) or p["mirror"]:
            res = res[:, ::-1]
        chw = np.transpose(res, (2, 0, 1))
        if chw.shape[0] >= 3:
            chw = chw[[2, 1, 0, 3][:chw.shape[0]]]
        n, dt = chw.shape[0], self._np_dtype
        mean = np.array([p["mean_r"], p["mean_g"], p["mean_b"], p["mean_a"]], np.float32)[:n, None, None]
        std = np.array([p["std_r"], p["std_g"], p["std_b"], p["std_a"]], np.float32)[:n, None, None]
        if dt == np.uint8:
            out[...] = chw
        elif dt == np.int8:
            out[...] = np.clip(chw.astype(np.int16) - np.round(mean).astype(np.int16), -128, 127)
        else:
            contrast = (rng.random() * p["max_random_contrast"] * 2 - p["max_random_contrast"] + 1) * p["scale"]
            illum = (rng.random() * p["max_random_illumination"] * 2 - p["max_random_illumination"]) * p["scale"]
            out[...] = (chw.astype(np.float32) - mean) * (np.float32(contrast) / std) + np.float32(illum) / std


def _batches(cls, **kw):
    it = cls(**kw)
    out = []
    for epoch in range(2):
        it.reset()
        out += [(b.data[0].numpy(), b.label[0].numpy(), b.pad) for b in it]
    it.close()
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32", "int64", "uint8", "int8"])
@pytest.mark.parametrize("case", ["rgb", "rgba", "gray", "jitter"])
def test_tables_give_the_per_pixel_values(recs, dtype, case):
    """Every dtype, 1, 3 and 4 channels, mirrored or not, fixed or per-image random contrast and illumination:
    bit for bit the per-pixel computation (cv2.LUT where it takes the dtype, else numpy's take)."""
    kw = dict(path_imgrec=recs["rgba" if case == "rgba" else "rgb"], batch_size=4, rand_crop=True, rand_mirror=True,
              data_shape=(4 if case == "rgba" else 1 if case == "gray" else 3, 24, 24), dtype=dtype, seed=3,
              preprocess_threads=2, **NORM)
    if case == "jitter":
        kw.update(max_random_contrast=0.3, max_random_illumination=20, scale=0.5)
    got, want = _batches(mxio.ImageRecordIter, **kw), _batches(_PerPixel, **kw)
    assert len(got) == len(want) > 2
    for (x, lx, px), (y, ly, py) in zip(got, want):
        assert x.dtype == y.dtype == np.dtype(dtype) and px == py
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lx, ly)


def test_split_records_and_a_partial_index(recs, tmp_path):
    """Records the writer split (an id with the magic number) decode as recordio reads them; an index naming
    every other record reads those alone (one pread per record reaches past them: the first part decides)."""
    it = mxio.ImageRecordIter(path_imgrec=recs["split"], data_shape=(3, 40, 44), batch_size=4, dtype="uint8")
    b = next(iter(it))
    with recordio.MXRecordIO(recs["split"], "r") as rec:
        for k in range(4):
            header, img = recordio.unpack_img(rec.read(), 1)
            assert b.label[0].numpy()[k] == header.label == k
            np.testing.assert_array_equal(b.data[0].numpy()[k], img[:, :, ::-1].transpose(2, 0, 1))
    it.close()
    idx = str(tmp_path / "half.idx")
    with open(recs["rgb"][:-4] + ".idx") as f, open(idx, "w") as g:
        g.writelines(line for k, line in enumerate(f) if k % 2)
    it = mxio.ImageRecordIter(path_imgrec=recs["rgb"], path_imgidx=idx, data_shape=(3, 24, 24), batch_size=4,
                              round_batch=False)
    assert [b.label[0].numpy()[:4 - b.pad].tolist() for b in it] == [[1, 3, 5, 7]]
    it.close()


@pytest.mark.parametrize("threads,batch", [(3, 4), (5, 4), (4, 9)])
def test_runs_of_images_per_task_change_nothing(recs, threads, batch):
    """A pool task per run of ceil(batch / threads) images: the batches of one thread, for any split."""
    kw = dict(path_imgrec=recs["rgb"], data_shape=(3, 24, 24), batch_size=batch, rand_crop=True, rand_mirror=True,
              max_random_contrast=0.2, seed=11, **NORM)
    one = _batches(mxio.ImageRecordIter, preprocess_threads=1, **kw)
    many = _batches(mxio.ImageRecordIter, preprocess_threads=threads, prefetch_buffer=2, **kw)
    assert len(one) == len(many)
    for (x, lx, px), (y, ly, py) in zip(one, many):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lx, ly)
        assert px == py


def test_record_ends_bound_each_read(recs):
    """_record_ends: each record's bytes end where the next record (or the file) starts."""
    offsets, size = ri._record_offsets(recs["rgb"], "")
    ends = ri._record_ends(offsets, size)
    assert [ends[o] for o in offsets] == offsets[1:] + [size] == sorted(set(offsets[1:] + [os.path.getsize(
        recs["rgb"])]))


def test_buffers_are_reused_only_once_dropped(recs):
    """A dropped batch's memory carries a later batch (no fresh pages to fault in), with the same values as fresh
    memory, its padded slots zero again; a batch the consumer keeps is never written."""
    kw = dict(path_imgrec=recs["rgb"], data_shape=(3, 24, 24), batch_size=4, rand_crop=True, rand_mirror=True,
              round_batch=False, preprocess_threads=2, prefetch_buffer=1, **NORM)
    kept = []
    it = mxio.ImageRecordIter(**kw)
    for epoch in range(3):
        it.reset()
        kept += [(b, b.data[0].numpy(), b.label[0].numpy()) for b in it]
    it.close()
    addresses = {b.data[0]._data.ctypes.data for b, _, _ in kept}
    assert len(addresses) == len(kept)  # all kept: every batch had its own memory
    for b, x, y in kept:  # and none was written after it was handed out
        np.testing.assert_array_equal(b.data[0].numpy(), x)
        np.testing.assert_array_equal(b.label[0].numpy(), y)
    it = mxio.ImageRecordIter(**kw)
    dropped, seen, held = [], {}, []
    for epoch in range(3):
        it.reset()
        for k, b in enumerate(it):
            seen.setdefault(b.data[0]._data.ctypes.data, []).append(b.pad)
            dropped.append((b.data[0].numpy(), b.label[0].numpy(), b.pad))
            if (epoch, k) == (0, 1):
                held.append(b)  # kept a while: the rotation shifts, a full batch's memory gets a padded one
            if (epoch, k) == (1, 0):
                held.clear()
            del b
    it.close()
    assert len(seen) < len(dropped)  # some memory carried a second batch
    assert any(pads[:2] == [0, 3] for pads in seen.values())  # a padded batch in a full one's memory
    for (x, y, p), (_, fx, fy) in zip(dropped, kept):
        np.testing.assert_array_equal(x, fx)
        np.testing.assert_array_equal(y, fy)
        assert not (p and x[len(x) - p:].any())
        assert not (p and y[len(y) - p:].any())


def test_large_spans_read_header_then_body(recs, monkeypatch):
    """A record whose span (to the next indexed one) exceeds _SPAN_MAX is read as before, header then body: the
    same batches."""
    kw = dict(path_imgrec=recs["rgb"], data_shape=(3, 24, 24), batch_size=4, rand_crop=True, seed=2, **NORM)
    one_pread = _batches(mxio.ImageRecordIter, **kw)
    monkeypatch.setattr(ri, "_SPAN_MAX", 64)
    calls = []
    monkeypatch.setattr(ri, "_read_at", lambda *a, _f=ri._read_at: calls.append(a) or _f(*a))
    two_preads = _batches(mxio.ImageRecordIter, **kw)
    assert len(calls) >= 9
    for (x, lx, _), (y, ly, _) in zip(one_pread, two_preads):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lx, ly)
