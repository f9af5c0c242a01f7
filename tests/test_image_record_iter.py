"""mx.io.ImageRecordIter / ImageDetRecordIter (dnnbind.image.record_iter) against MXNet 1.9.1's batches
(tests/fixtures/make_mxnet_image.py). Labels, pads and shapes are exact; pixel values go through a bilinear
resize, which may differ from OpenCV's fixed point by one level without OpenCV (scaled by scale/std here).
"""

import os
import warnings

import numpy as np
import pytest

from dnnbind import imagecodec
from dnnbind import io as mxio
from dnnbind._lib.errors import DnnbindValueError

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_image")
ITERS = np.load(os.path.join(HERE, "iters.npz"))
REC, DET = os.path.join(HERE, "img.rec"), os.path.join(HERE, "det.rec")
TOL = 0 if imagecodec.backend() == "cv2" else 1


def rec_iter(**kw):
    args = dict(path_imgrec=REC, data_shape=(3, 8, 8), batch_size=3, preprocess_threads=2)
    args.update(kw)
    return mxio.ImageRecordIter(**args)


def check(prefix, it, tol):
    got = []
    for b in it:
        got.append(b)
        if len(got) >= 10:
            break
    assert len(got) == int(ITERS[prefix + "_n"]), prefix
    for k, b in enumerate(got):
        want = ITERS[f"{prefix}_{k}_label"]
        lab = b.label[0].numpy()
        assert lab.shape == want.shape
        pad = int(ITERS[f"{prefix}_{k}_pad"])
        n = len(lab) - b.pad  # MXNet's round_batch=False leaves stale memory in the padded slots
        np.testing.assert_allclose(lab[:n], want[:n], atol=1e-6, err_msg=prefix)
        data, wdata = b.data[0].numpy(), ITERS[f"{prefix}_{k}_data"]
        assert data.shape == wdata.shape and data.dtype == wdata.dtype, prefix
        err = np.abs(data[:n].astype(np.float64) - wdata[:n]).max()
        assert err <= tol, f"{prefix} batch {k}: max error {err} > {tol}"
        if prefix != "iri_norb":
            assert b.pad == pad, (prefix, k)


def test_plain_batches():
    it = rec_iter()
    assert it.provide_data[0].shape == (3, 3, 8, 8) and it.provide_label[0].shape == (3,)
    assert it.provide_label[0].name == "softmax_label"
    check("iri", it, TOL)


def test_reset_before_first_batch():
    # batches are prefetched at construction; a reset before consuming any must not count the planned wrap
    it = rec_iter(prefetch_buffer=8)
    it.reset()
    check("iri", it, TOL)


def test_normalized_and_second_epoch():
    # the last batch wraps around (round_batch), and MXNet's next epoch starts after the wrapped records
    it = rec_iter(resize=10, mean_r=120, mean_g=110, mean_b=100, std_r=50, std_g=60, std_b=70, scale=0.5)
    check("iri_norm", it, TOL * 0.5 / 50 + 1e-5)
    it.reset()
    check("iri_norm_e2", it, TOL * 0.5 / 50 + 1e-5)


def test_round_batch_false():
    it = rec_iter(round_batch=False, batch_size=4)
    check("iri_norb", it, TOL)
    it.reset()
    last = list(it)[-1]
    assert last.pad == 1 and (last.data[0].numpy()[-1] == 0).all()  # dnnbind reports the real pad (MXNet: 0)


@pytest.mark.parametrize("kw,prefix", [(dict(mirror=True, data_shape=(3, 10, 6)), "iri_mirror"),
                                       (dict(data_shape=(1, 8, 8)), "iri_gray"), (dict(dtype="uint8"), "iri_uint8")])
def test_variants(kw, prefix):
    check(prefix, rec_iter(**kw), TOL if prefix != "iri_gray" else TOL + 1)


@pytest.mark.parametrize("k", range(3))
def test_parts(k):
    check(f"iri_part{k}", rec_iter(batch_size=2, num_parts=3, part_index=k), TOL)


def test_threads_and_seed_repeatable():
    kw = dict(rand_crop=True, rand_mirror=True, resize=12, max_rotate_angle=10, brightness=0.2, pca_noise=0.1,
              random_h=10, seed=5)
    a = [b.data[0].numpy() for b in rec_iter(preprocess_threads=1, **kw)]
    b = [b.data[0].numpy() for b in rec_iter(preprocess_threads=3, prefetch_buffer=1, **kw)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    shuffled = [b.label[0].numpy() for b in rec_iter(shuffle=True, seed=1)]
    assert sorted(np.concatenate(shuffled).tolist()[:7]) == list(range(7))


def test_det_record_iter():
    it = mxio.ImageDetRecordIter(path_imgrec=DET, data_shape=(3, 8, 8), batch_size=2, preprocess_threads=1,
                                 mean_r=10, std_r=2)
    assert it.provide_label[0].shape == (2, 16)
    check("idri", it, TOL)  # its random augmentations: tests/test_image_det_record_iter.py


def test_bad_arguments():
    with pytest.raises(DnnbindValueError):
        mxio.ImageRecordIter(path_imgrec=REC, batch_size=2)  # no data_shape
    with pytest.raises(DnnbindValueError):
        mxio.ImageRecordIter(path_imgrec=REC, data_shape=(3, 8), batch_size=2)
    with pytest.raises(DnnbindValueError):
        rec_iter(part_index=3, num_parts=3)
    with pytest.raises(DnnbindValueError):
        rec_iter(dtype="complex64")
    with pytest.raises(DnnbindValueError):
        next(iter(rec_iter(label_width=2)))  # the records hold one label each
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rec_iter(rand_mirorr=True)  # MXNet ignores unknown keywords silently; dnnbind warns
    assert any("rand_mirorr" in str(x.message) for x in w)
