"""mx.io.ImageDetRecordIter's det_aug_default augmenter (dnnbind.image.record_iter).

Deterministic settings are compared with MXNet 1.9.1's batches (tests/fixtures/make_mxnet_det_iter.py): resize
modes and interpolations, mirror with probability 1, random branches that cannot change anything, the label
layout and which parameter sets MXNet rejects. MXNet's random stream cannot be repeated, so the random crop, pad
and jitters are tested by their properties on images whose pixels encode their own coordinates (PNG, lossless):
the output pixels tell exactly which source pixels a crop or pad kept.
"""

import json
import os

import numpy as np
import pytest

from dnnbind import imagecodec, recordio
from dnnbind import io as mxio
from dnnbind._lib.errors import DnnbindValueError

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_det_iter")
ITERS = np.load(os.path.join(HERE, "iters.npz"))
with open(os.path.join(HERE, "errors.json")) as _f:
    ERRORS = json.load(_f)
# configs of the fixture generator (its CONFIGS / ERRORS), repeated here: the generator runs under MXNet only
CONFIGS = {
    "force": dict(),
    "force_cubic_resize": dict(inter_method=2, resize=10),
    "force_auto": dict(inter_method=9, data_shape=(3, 10, 20)),
    "shrink": dict(resize_mode="shrink", data_shape=(3, 14, 13)),
    "fit": dict(resize_mode="fit", data_shape=(3, 16, 15), mean_r=10, mean_b=3, std_g=2, scale=0.5),
    "fit_nearest": dict(resize_mode="fit", data_shape=(3, 30, 40), inter_method=0),
    "mirror": dict(rand_mirror_prob=1.0, resize_mode="shrink", data_shape=(3, 20, 20)),
    "noop_random": dict(rand_pad_prob=1.0, max_pad_scale=1.0, rand_crop_prob=1.0, num_crop_sampler=0,
                        random_hue_prob=1.0, random_saturation_prob=1.0, random_illumination_prob=1.0,
                        random_contrast_prob=1.0, rand_mirror_prob=1.0),
    "pad_width": dict(label_pad_width=20, label_pad_value=-2.0),
}
BAD = {
    "scale_pinned": dict(rand_crop_prob=1.0, min_crop_scales=(0.5,), max_crop_scales=(0.5,)),
    "tuple_mismatch": dict(num_crop_sampler=2, min_crop_scales=(0.1, 0.2, 0.3)),
    "one_sampler_two_values": dict(min_crop_scales=(0.1, 0.2)),
    "aspect_reversed": dict(min_crop_aspect_ratios=(2.0,), max_crop_aspect_ratios=(1.0,)),
    "bad_inter": dict(inter_method=5),
    "bad_emit": dict(crop_emit_mode="middle"),
    "two_samplers_ok": dict(num_crop_sampler=2, min_crop_scales=(0.1, 0.3), max_crop_scales=(0.9,)),
}
# pixels: exact where no resize runs; a resize without OpenCV (Pillow + numpy) may be off by a level or two
SOURCE_SIZES = [(12, 16), (18, 11), (9, 9), (15, 22)]  # the fixture's images (rows, cols)
RESIZE_TOL = 0 if imagecodec.backend() == "cv2" else 3


def det_iter(path, **kw):
    args = dict(path_imgrec=path, data_shape=(3, 12, 12), batch_size=4, preprocess_threads=1)
    args.update(kw)
    return mxio.ImageDetRecordIter(**args)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_mxnet(name):
    b = next(iter(det_iter(os.path.join(HERE, "det.rec"), **CONFIGS[name])))
    lab, want_lab = b.label[0].numpy(), ITERS[name + "_label"]
    assert lab.shape == want_lab.shape
    np.testing.assert_array_equal(lab, want_lab)  # sizes, label lengths, surviving boxes, padding
    data, want = b.data[0].numpy(), ITERS[name + "_data"]
    assert data.shape == want.shape and data.dtype == want.dtype
    tol = RESIZE_TOL * CONFIGS[name].get("scale", 1.0) * (2 if name == "force_cubic_resize" else 1)
    err = np.abs(data.astype(np.float64) - want).max()
    assert err <= tol, f"{name}: max pixel error {err} > {tol}"
    # an image that kept its size went through no resize: exact whatever the backend
    for k, (h, w) in enumerate(SOURCE_SIZES):
        if tuple(lab[k, 1:3]) == (h, w) and "resize" not in CONFIGS[name]:
            np.testing.assert_array_equal(data[k], want[k], err_msg=f"{name} sample {k}")


@pytest.mark.parametrize("name", sorted(BAD))
def test_rejects_what_mxnet_rejects(name):
    if ERRORS[name] is None:
        det_iter(os.path.join(HERE, "det.rec"), **BAD[name])
    else:
        with pytest.raises(DnnbindValueError):
            det_iter(os.path.join(HERE, "det.rec"), **BAD[name])


# -- property tests on self-describing images ---------------------------------------------------------------------

def coord_image(h, w):
    """BGR image whose R holds the row, G the column and B a constant 200 (never the fill values used here)."""
    img = np.empty((h, w, 3), np.uint8)
    img[:, :, 2] = np.arange(h)[:, None]
    img[:, :, 1] = np.arange(w)[None, :]
    img[:, :, 0] = 200
    return img


def write_rec(path, items):
    """items: (image, [[id, x1, y1, x2, y2], ...]) -> a .rec made by dnnbind's recordio."""
    w = recordio.MXRecordIO(str(path), "w")
    for i, (img, boxes) in enumerate(items):
        label = np.concatenate([[2, 5], np.ravel(np.asarray(boxes, np.float32))]).astype(np.float32)
        w.write(recordio.pack_img(recordio.IRHeader(0, label, i, 0), img, img_fmt=".png"))
    w.close()
    return str(path)


def samples(it, epochs=1):
    """(image HWC in RGB, boxes (n, 5)) for every sample, read back through the label's size fields."""
    out = []
    for e in range(epochs):
        if e:
            it.reset()
        for b in it:
            data, lab = b.data[0].numpy(), b.label[0].numpy()
            for k in range(data.shape[0] - b.pad):
                c, h, w, n = (int(v) for v in lab[k, :4])
                raw = lab[k, 4:4 + n]
                img = np.transpose(data[k, :c, :h, :w], (1, 2, 0))
                out.append((img, raw[int(raw[0]):].reshape(-1, int(raw[1]))))
    return out


def crop_window(img):
    """(row0, col0, rows, cols) of the source pixels in an output of coord_image (no resize happened)."""
    r, g = img[:, :, 0], img[:, :, 1]
    assert (r == r[:, :1]).all() and (g == g[:1, :]).all()  # a plain window of the source
    assert (np.diff(r[:, 0]) == 1).all() and (np.diff(g[0]) == 1).all()
    return int(r[0, 0]), int(g[0, 0]), img.shape[0], img.shape[1]


@pytest.mark.parametrize("shape,aspect", [((20, 20), 1.0), ((20, 20), 2.0), ((10, 20), 1.0), ((40, 30), 0.5)])
def test_crop_size_pinned(tmp_path, shape, aspect):
    h, w = shape
    rec = write_rec(tmp_path / "c.rec", [(coord_image(h, w), [[0, 0.0, 0.0, 1.0, 1.0]])] * 3)
    # MXNet requires max_crop_scales > min_crop_scales; a 1e-6 wide range pins the scale below a pixel
    s = 0.5
    it = det_iter(rec, batch_size=3, data_shape=(3, 64, 64), resize_mode="shrink", rand_crop_prob=1.0,
                  min_crop_scales=s,
                  max_crop_scales=s + 1e-6, min_crop_aspect_ratios=aspect, max_crop_aspect_ratios=aspect)
    # crop in [0, 1] units: width = s * sqrt(aspect * h / w), height = s / sqrt(aspect * h / w), each <= 1
    ratio = np.sqrt(np.clip(aspect * h / w, s * s, 1 / (s * s)))
    want = (int(min(1, s / ratio) * h), int(min(1, s * ratio) * w))
    got = samples(it, epochs=2)
    assert len(got) == 6
    for img, boxes in got:
        r0, c0, rows, cols = crop_window(img)
        assert (rows, cols) == want
        assert 0 <= r0 <= h - rows and 0 <= c0 <= w - cols
        np.testing.assert_allclose(boxes[0, 1:], [0, 0, 1, 1])  # the whole-image box, clipped to the crop


def random_boxes(rng, n):
    xy = rng.uniform(0, 0.8, (n, 2))
    wh = rng.uniform(0.05, 0.5, (n, 2))
    return np.column_stack([np.arange(n), xy, np.minimum(1, xy + wh)]).astype(np.float32)


def iou_and_cover(crop, boxes):
    x, y, w, h = crop
    iw = np.clip(np.minimum(x + w, boxes[:, 3]) - np.maximum(x, boxes[:, 1]), 0, None)
    ih = np.clip(np.minimum(y + h, boxes[:, 4]) - np.maximum(y, boxes[:, 2]), 0, None)
    inter = iw * ih
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 4] - boxes[:, 2])
    return inter / (w * h + area - inter), inter / area


@pytest.mark.parametrize("mode", ["center", "overlap"])
def test_crop_constraints_and_emission(tmp_path, mode):
    rng = np.random.default_rng(4)
    H, W = 120, 160  # large: a pixel is below 1% of the image, the tolerance of recovering the float crop
    items = [(coord_image(H, W), random_boxes(rng, 6)) for _ in range(8)]
    rec = write_rec(tmp_path / "c.rec", items)
    min_iou, thresh = 0.3, 0.4
    it = det_iter(rec, batch_size=4, data_shape=(3, 128, 160), resize_mode="shrink", rand_crop_prob=1.0,
                  min_crop_scales=0.3, max_crop_scales=1.0, min_crop_aspect_ratios=0.5, max_crop_aspect_ratios=2.0,
                  min_crop_overlaps=min_iou, max_crop_trials=50, crop_emit_mode=mode, emit_overlap_thresh=thresh,
                  seed=3)
    got = samples(it)
    cropped = 0
    tol = 2.0 / min(H, W)
    for (img, boxes), (_, src) in zip(got, items):
        assert ((boxes[:, 1:] >= 0) & (boxes[:, 1:] <= 1)).all()
        assert (boxes[:, 3] >= boxes[:, 1]).all() and (boxes[:, 4] >= boxes[:, 2]).all()
        r0, c0, rows, cols = crop_window(img)
        if (rows, cols) == (H, W):
            np.testing.assert_array_equal(boxes, src)  # no sampler found a crop: boxes untouched
            continue
        cropped += 1
        crop = (c0 / W, r0 / H, cols / W, rows / H)
        iou, cover = iou_and_cover(crop, src)
        assert iou.max() >= min_iou - 0.05, "no box meets the sampler's min_crop_overlaps"
        ids = set(boxes[:, 0].astype(int).tolist())
        if mode == "center":
            cx, cy = (src[:, 1] + src[:, 3]) / 2, (src[:, 2] + src[:, 4]) / 2
            inside = (cx > crop[0] + tol) & (cx < crop[0] + crop[2] - tol) & \
                     (cy > crop[1] + tol) & (cy < crop[1] + crop[3] - tol)
            outside = (cx < crop[0] - tol) | (cx > crop[0] + crop[2] + tol) | \
                      (cy < crop[1] - tol) | (cy > crop[1] + crop[3] + tol)
        else:
            inside, outside = cover > thresh + 0.03, cover < thresh - 0.03
        for k in range(len(src)):
            if inside[k]:
                assert k in ids, f"box {k} should survive the crop"
            if outside[k]:
                assert k not in ids, f"box {k} should be dropped"
        # survivors are the source boxes in the crop's coordinates, clipped to [0, 1]
        for row in boxes:
            s = src[int(row[0])]
            want = [np.clip((s[1] - crop[0]) / crop[2], 0, 1), np.clip((s[2] - crop[1]) / crop[3], 0, 1),
                    np.clip((s[3] - crop[0]) / crop[2], 0, 1), np.clip((s[4] - crop[1]) / crop[3], 0, 1)]
            np.testing.assert_allclose(row[1:], want, atol=3 * tol)
    assert cropped >= 4  # most samples found a crop


def test_crop_samplers_choice(tmp_path):
    # two samplers: one that can never succeed (no box can reach IoU 0.99 with a crop of scale <= 0.2), one that
    # always can; every crop must then come from the second, whose scale range is pinned to [0.9, 0.9 + 1e-6)
    H, W = 50, 50
    rec = write_rec(tmp_path / "c.rec", [(coord_image(H, W), [[0, 0.0, 0.0, 1.0, 1.0]])] * 4)
    it = det_iter(rec, data_shape=(3, 64, 64), resize_mode="shrink", rand_crop_prob=1.0, num_crop_sampler=2,
                  min_crop_scales=(0.1, 0.9), max_crop_scales=(0.2, 0.9 + 1e-6), min_crop_overlaps=(0.99, 0.0),
                  max_crop_trials=(5, 5))
    for img, _ in samples(it, epochs=3):
        assert crop_window(img)[2:] == (45, 45)
    # rand_crop_prob 0: never crops
    it = det_iter(rec, data_shape=(3, 64, 64), resize_mode="shrink", min_crop_scales=0.1, max_crop_scales=0.2)
    for img, _ in samples(it):
        assert crop_window(img) == (0, 0, H, W)


def test_pad(tmp_path):
    H, W = 40, 50
    box = [[0, 0.2, 0.1, 0.7, 0.9], [1, 0.0, 0.5, 1.0, 1.0]]
    rec = write_rec(tmp_path / "p.rec", [(coord_image(H, W), box)] * 8)
    max_scale, fill = 2.0, 33
    it = det_iter(rec, data_shape=(3, 128, 128), resize_mode="shrink", rand_pad_prob=1.0, max_pad_scale=max_scale,
                  fill_value=fill, seed=11)
    padded = 0
    for img, boxes in samples(it, epochs=2):
        inner = img[:, :, 2] == 200
        rows, cols = np.nonzero(inner.any(1))[0], np.nonzero(inner.any(0))[0]
        top, left = rows[0], cols[0]
        assert (len(rows), len(cols)) == (H, W) and crop_window(img[top:top + H, left:left + W]) == (0, 0, H, W)
        assert (img[~inner] == fill).all()
        ph, pw = img.shape[:2]
        if (ph, pw) == (H, W):  # scale below 1.05: no pad
            np.testing.assert_allclose(boxes, box)
            continue
        padded += 1
        # the pad box is scale x scale image sizes; each side is int(.) of it, so within a pixel
        sx, sy = pw / W, ph / H
        assert 1.05 - 2 / W <= sx <= max_scale + 2 / W and abs(sx - sy) <= 2 / min(H, W)
        want = np.array(box, np.float64)
        want[:, [1, 3]] = (want[:, [1, 3]] * W + left) / pw
        want[:, [2, 4]] = (want[:, [2, 4]] * H + top) / ph
        np.testing.assert_allclose(boxes, want, atol=2.5 / min(H, W))
        # sizes shrink by 1/scale
        src = np.array(box, np.float64)
        np.testing.assert_allclose((boxes[:, 3] - boxes[:, 1]) * sx, src[:, 3] - src[:, 1], atol=0.05)
        np.testing.assert_allclose((boxes[:, 4] - boxes[:, 2]) * sy, src[:, 4] - src[:, 2], atol=0.05)
    assert padded >= 8


def test_mirror_flips_exactly(tmp_path):
    rng = np.random.default_rng(2)
    items = [(rng.integers(0, 256, (9 + i, 14, 3)).astype(np.uint8), random_boxes(rng, 3)) for i in range(3)]
    rec = write_rec(tmp_path / "m.rec", items)
    kw = dict(data_shape=(3, 16, 16), resize_mode="shrink", batch_size=3)
    plain = samples(det_iter(rec, **kw))
    flipped = samples(det_iter(rec, rand_mirror_prob=1.0, **kw))
    for (a, ba), (b, bb), (_, src) in zip(plain, flipped, items):
        np.testing.assert_array_equal(b, a[:, ::-1])
        np.testing.assert_array_equal(ba, src)
        want = ba.copy()
        want[:, 1], want[:, 3] = np.float32(1) - ba[:, 3], np.float32(1) - ba[:, 1]
        np.testing.assert_array_equal(bb, want)


def test_color_jitter(tmp_path):
    rng = np.random.default_rng(5)
    items = [(rng.integers(0, 256, (10, 12, 3)).astype(np.uint8), [[0, 0.1, 0.1, 0.9, 0.9]]) for _ in range(4)]
    rec = write_rec(tmp_path / "j.rec", items)
    kw = dict(data_shape=(3, 16, 16), resize_mode="shrink", batch_size=4)
    base = samples(det_iter(rec, **kw))
    for img, _ in base:
        assert img.shape == (10, 12, 3)

    def same(other):
        return all(np.array_equal(a, b) for (a, _), (b, _) in zip(base, other))

    # range 0 with prob 1: the branch runs but changes nothing; prob 0 with a range: it never runs
    assert same(samples(det_iter(rec, random_hue_prob=1.0, random_saturation_prob=1.0, max_random_hue=0,
                                 max_random_saturation=0, **kw)))
    assert same(samples(det_iter(rec, random_hue_prob=0.0, max_random_hue=60, max_random_saturation=80,
                                 max_random_illumination=50, max_random_contrast=0.5, **kw)))
    # on, they change pixels (else the two checks above could not fail)
    for name, kw2 in (("hue", dict(random_hue_prob=1.0, max_random_hue=60)),
                      ("saturation", dict(random_saturation_prob=1.0, max_random_saturation=80)),
                      ("illumination", dict(random_illumination_prob=1.0, max_random_illumination=60)),
                      ("contrast", dict(random_contrast_prob=1.0, max_random_contrast=0.5))):
        assert not same(samples(det_iter(rec, **kw2, **kw))), name


def test_contrast_is_a_rounded_scale(tmp_path):
    # contrast alone: every pixel is round(v * (1 + c)) for one c per image (cv::Mat::convertTo)
    rng = np.random.default_rng(6)
    items = [(rng.integers(0, 256, (10, 12, 3)).astype(np.uint8), [[0, 0.1, 0.1, 0.9, 0.9]]) for _ in range(4)]
    rec = write_rec(tmp_path / "j.rec", items)
    kw = dict(data_shape=(3, 16, 16), resize_mode="shrink", batch_size=4)
    base = samples(det_iter(rec, **kw))
    out = samples(det_iter(rec, random_contrast_prob=1.0, max_random_contrast=0.5, **kw))
    for (a, _), (b, _) in zip(base, out):
        nz = a > 20
        alpha = np.median(b[nz] / a[nz])
        assert 0.5 <= alpha <= 1.5
        assert np.abs(b - np.clip(np.rint(a * alpha), 0, 255)).max() <= 1 + 255 * 0.01


def test_seeded_runs_repeat(tmp_path):
    rng = np.random.default_rng(7)
    items = [(coord_image(30 + i, 40), random_boxes(rng, 4)) for i in range(5)]
    rec = write_rec(tmp_path / "s.rec", items)
    kw = dict(data_shape=(3, 24, 24), batch_size=2, rand_crop_prob=0.8, min_crop_scales=0.3, max_crop_scales=1.0,
              min_crop_overlaps=0.1, rand_pad_prob=0.5, max_pad_scale=1.6, rand_mirror_prob=0.5,
              random_hue_prob=0.5, max_random_hue=20, random_contrast_prob=0.5, max_random_contrast=0.3)

    def run(**k):
        it, out = det_iter(rec, **kw, **k), []
        for _ in range(2):  # two epochs: the second draws anew
            out += [(b.data[0].numpy(), b.label[0].numpy()) for b in it]
            it.reset()
        return out

    a, b = run(seed=4, preprocess_threads=1), run(seed=4, preprocess_threads=3, prefetch_buffer=1)
    assert len(a) == len(b) > 0
    for (da, la), (db, lb) in zip(a, b):
        np.testing.assert_array_equal(da, db)
        np.testing.assert_array_equal(la, lb)
    c = run(seed=5, preprocess_threads=1)
    assert any(not np.array_equal(x[1], y[1]) for x, y in zip(a, c))


def test_pipeline_shapes(tmp_path):
    rng = np.random.default_rng(8)
    items = [(rng.integers(0, 256, (20 + 3 * i, 30 - 2 * i, 3)).astype(np.uint8), random_boxes(rng, 1 + i % 4))
             for i in range(7)]
    rec = write_rec(tmp_path / "all.rec", items)
    it = det_iter(rec, data_shape=(3, 32, 32), batch_size=3, rand_crop_prob=0.5, min_crop_scales=0.3,
                  max_crop_scales=0.9, min_crop_aspect_ratios=0.5, max_crop_aspect_ratios=2.0,
                  crop_emit_mode="overlap", rand_pad_prob=0.5, max_pad_scale=2.0, rand_mirror_prob=0.5,
                  random_hue_prob=0.5, max_random_hue=18, random_saturation_prob=0.5, max_random_saturation=32,
                  random_illumination_prob=0.5, max_random_illumination=32, random_contrast_prob=0.5,
                  max_random_contrast=0.5, mean_r=123, mean_g=117, mean_b=104, std_r=58, std_g=57, std_b=57,
                  preprocess_threads=2)
    width = 2 + 5 * 4  # the longest raw label
    assert it.provide_data[0].shape == (3, 3, 32, 32) and it.provide_label[0].shape == (3, width + 4)
    batches = list(it)
    assert len(batches) == 3 and batches[-1].pad == 2
    for b in batches:
        data, lab = b.data[0].numpy(), b.label[0].numpy()
        assert data.shape == (3, 3, 32, 32) and data.dtype == np.float32 and np.isfinite(data).all()
        assert lab.shape == (3, width + 4)
        for row in lab:
            assert tuple(row[:3]) == (3, 32, 32)
            n = int(row[3])
            assert 7 <= n <= width and (n - 2) % 5 == 0 and row[4] == 2 and row[5] == 5
            assert (row[4 + n:] == -1).all()
            objs = row[6:4 + n].reshape(-1, 5)
            assert ((objs[:, 1:] >= 0) & (objs[:, 1:] <= 1)).all()


def test_jitter_channels(tmp_path):
    # OpenCV's HLS: saturation must leave lightness (max + min) / 2 alone, illumination must move it by one step
    # per image; mixing the channels up fails one or the other
    rng = np.random.default_rng(9)
    items = [(rng.integers(60, 200, (10, 12, 3)).astype(np.uint8), [[0, 0.1, 0.1, 0.9, 0.9]]) for _ in range(4)]
    rec = write_rec(tmp_path / "j.rec", items)
    kw = dict(data_shape=(3, 16, 16), resize_mode="shrink", batch_size=4)

    def light(img):
        return (img.max(-1) + img.min(-1)) / 2.0

    base = samples(det_iter(rec, **kw))
    sat = samples(det_iter(rec, random_saturation_prob=1.0, max_random_saturation=50, seed=1, **kw))
    ill = samples(det_iter(rec, random_illumination_prob=1.0, max_random_illumination=40, seed=1, **kw))
    moved = 0
    for (a, _), (s, _), (i, _) in zip(base, sat, ill):
        assert np.abs(light(s) - light(a)).max() <= 2.5  # 8-bit HLS round trips
        d = light(i) - light(a)
        assert np.abs(d - np.median(d)).max() <= 2.5
        moved += abs(np.median(d)) >= 3
    assert moved >= 2
    assert not all(np.array_equal(a, s) for (a, _), (s, _) in zip(base, sat))
