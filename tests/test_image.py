"""mx.image (dnnbind.image) against MXNet 1.9.1's own outputs (tests/fixtures/make_mxnet_image.py writes them).

Tolerances: PNG decoding is exact; resizes may differ from OpenCV's fixed-point ones by a few levels when
OpenCV is not installed (numpy does the arithmetic in float), and JPEG decoding by a few levels with Pillow.
Seeded augmenters draw from Python's random / numpy as MXNet does, so the same seeds give the same crops and
factors; their float results match to float32 rounding.
"""

import os
import random

import numpy as np
import pytest

import dnnbind.image as image
from dnnbind import imagecodec
from dnnbind._lib.errors import DnnbindValueError

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_image")
IMG = np.load(os.path.join(HERE, "images.npz"))
AUG = np.load(os.path.join(HERE, "augs.npz"))
ITERS = np.load(os.path.join(HERE, "iters.npz"))
CV2 = imagecodec.backend() == "cv2"
RESIZE_TOL = 0 if CV2 else 1  # levels of uint8 (numpy float math vs OpenCV fixed point)


def close(got, want, tol, what=""):
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    where = np.unravel_index(err.argmax(), err.shape) if err.size else ()
    assert err.max(initial=0) <= tol, f"{what}: max error {err.max(initial=0)} > {tol} at {where}"


def seeded():
    random.seed(7)
    np.random.seed(7)


def png0():
    return image.imdecode(IMG["enc_png0"].tobytes())


@pytest.mark.parametrize("name", ["png0", "png1", "png2", "jpg0"])
def test_imdecode(name):
    buf = IMG["enc_" + name].tobytes()
    tol = 0 if name.startswith("png") or CV2 else 4
    close(image.imdecode(buf), IMG[f"dec_{name}_1"], tol, name)
    close(image.imdecode(buf, flag=0), IMG[f"dec_{name}_0"], tol + (0 if CV2 else 1), name)
    close(image.imdecode(buf, to_rgb=False), IMG[f"dec_{name}_bgr"], tol, name)
    close(image.imdecode(IMG["enc_" + name]), IMG[f"dec_{name}_1"], tol, name)  # a numpy buffer too


def test_imread(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(IMG["enc_png1"].tobytes())
    close(image.imread(str(path)), IMG["dec_png1_1"], 0)
    with pytest.raises(DnnbindValueError):
        image.imread(str(tmp_path / "missing.png"))


def test_imdecode_bad():
    with pytest.raises(ValueError):
        image.imdecode("not bytes")
    with pytest.raises(ValueError):
        image.imdecode(b"garbage bytes")
    with pytest.raises(ValueError):
        image.imdecode(IMG["enc_png0"].tobytes(), flag=2)


@pytest.mark.parametrize("interp", range(5))
def test_imresize(interp):
    img = png0()
    tol = RESIZE_TOL
    close(image.imresize(img, 13, 9, interp=interp), IMG[f"resize_small_{interp}"], tol, f"shrink {interp}")
    close(image.imresize(img, 41, 37, interp=interp), IMG[f"resize_big_{interp}"], tol, f"enlarge {interp}")


def test_crops_and_borders():
    img = png0()
    close(image.resize_short(img, 12), IMG["resize_short"], RESIZE_TOL)
    close(image.fixed_crop(img, 3, 2, 10, 8), IMG["fixed_crop"], 0)
    close(image.fixed_crop(img, 3, 2, 10, 8, size=(5, 4), interp=1), IMG["fixed_crop_size"], RESIZE_TOL)
    out, box = image.center_crop(img, (12, 10), interp=1)
    close(out, IMG["center_crop"], 0)
    assert box == tuple(IMG["center_crop_box"])
    out, box = image.center_crop(img, (40, 10), interp=1)
    close(out, IMG["center_crop_big"], RESIZE_TOL)
    assert box == tuple(IMG["center_crop_big_box"])
    close(image.copyMakeBorder(img, 1, 2, 3, 4, values=(10, 20, 30)), IMG["border_const"], 0)
    close(image.copyMakeBorder(img, 2, 1, 0, 3, type=1), IMG["border_rep"], 0)
    close(image.color_normalize(img.astype("float32"), np.array([100, 110, 120]), np.array([50, 60, 70])),
          IMG["normalize"], 1e-5)
    assert [image.scale_down((30, 20), (40, 10)), image.scale_down((30, 20), (10, 40))] == \
        [tuple(x) for x in IMG["scale_down"]]


def test_random_crops_seeded():
    img = png0()
    seeded()
    out, box = image.random_crop(img, (10, 8), interp=1)
    assert box == tuple(IMG["random_crop_box"])
    close(out, IMG["random_crop"], RESIZE_TOL)
    seeded()
    out, box = image.random_size_crop(img, (10, 8), 0.3, (0.75, 1.33), interp=1)
    assert box == tuple(IMG["random_size_crop_box"])
    close(out, IMG["random_size_crop"], RESIZE_TOL)


def _augs():
    eigval = np.array([55.46, 4.794, 1.148])
    eigvec = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
    return {"brightness": image.BrightnessJitterAug(0.3), "contrast": image.ContrastJitterAug(0.3),
            "saturation": image.SaturationJitterAug(0.3), "hue": image.HueJitterAug(0.2),
            "lighting": image.LightingAug(0.1, eigval, eigvec), "gray": image.RandomGrayAug(1.0),
            "flip": image.HorizontalFlipAug(1.0), "colorjitter": image.ColorJitterAug(0.2, 0.2, 0.2),
            "cast": image.CastAug(), "normalize": image.ColorNormalizeAug(np.array([1, 2, 3]), np.array([2, 2, 2]))}


@pytest.mark.parametrize("name", sorted(_augs()))
def test_color_augmenters_seeded(name):
    aug = _augs()[name]
    seeded()
    close(aug(png0().astype("float32")), AUG[name], 1e-3, name)


@pytest.mark.parametrize("name,aug", [("randomcrop", image.RandomCropAug((10, 8), 1)),
                                      ("sizedcrop", image.RandomSizedCropAug((10, 8), 0.3, (0.75, 1.33), 1)),
                                      ("centercrop", image.CenterCropAug((10, 8), 1)),
                                      ("resize", image.ResizeAug(12, 1)),
                                      ("forceresize", image.ForceResizeAug((11, 7), 1))])
def test_geometry_augmenters_seeded(name, aug):
    seeded()
    close(aug(png0()), AUG[name], RESIZE_TOL, name)


def test_create_augmenter_chain():
    seeded()
    chain = image.CreateAugmenter((3, 8, 8), resize=12, rand_crop=True, rand_mirror=True, mean=True, std=True,
                                  brightness=0.1, contrast=0.1, saturation=0.1, pca_noise=0.1, inter_method=1)
    assert [type(a).__name__ for a in chain] == list(AUG["create_names"])
    x = png0()
    for aug in chain:
        x = aug(x)
    close(x, AUG["create_chain"], (RESIZE_TOL + 1e-3) / 57.0 * 1.3, "chain")  # resize error / std, jittered
    assert image.SequentialAug([image.CastAug()]).dumps()[0] == "sequentialaug"
    with pytest.raises(ValueError):
        image.CreateAugmenter((3, 8, 8), mean=[1, 2])


def _batches(it, n=10):
    out = []
    for b in it:
        out.append(b)
        if len(out) >= n:
            break
    return out


def check_iter(prefix, it, tol):
    got = _batches(it)
    assert len(got) == int(ITERS[prefix + "_n"]), prefix
    for k, b in enumerate(got):
        close(b.label[0], ITERS[f"{prefix}_{k}_label"], 1e-6, f"{prefix} label {k}")
        assert b.pad == int(ITERS[f"{prefix}_{k}_pad"]), (prefix, k)
        close(b.data[0], ITERS[f"{prefix}_{k}_data"], tol, f"{prefix} data {k}")


REC, IDX = os.path.join(HERE, "img.rec"), os.path.join(HERE, "img.idx")


def test_image_iter():
    check_iter("ii", image.ImageIter(3, (3, 8, 8), path_imgrec=REC, path_imgidx=IDX, inter_method=1), 0)
    check_iter("ii_seq", image.ImageIter(3, (3, 8, 8), path_imgrec=REC, inter_method=1, last_batch_handle="discard"), 0)
    check_iter("ii_part", image.ImageIter(2, (3, 8, 8), path_imgrec=REC, path_imgidx=IDX, num_parts=2, part_index=1,
                                          inter_method=1), 0)
    random.seed(3)
    check_iter("ii_shuf", image.ImageIter(3, (3, 8, 8), path_imgrec=REC, path_imgidx=IDX, shuffle=True,
                                          inter_method=1), 0)
    check_iter("ii_aug", image.ImageIter(3, (3, 8, 8), path_imgrec=REC, path_imgidx=IDX, resize=10, mean=True,
                                         std=True, inter_method=1), RESIZE_TOL / 57.0 + 1e-4)


def test_image_iter_imglist(tmp_path):
    paths = []
    for i, key in enumerate(["png1", "png2"]):
        p = tmp_path / f"{i}.png"
        p.write_bytes(IMG["enc_" + key].tobytes())
        paths.append([float(i + 5), f"{i}.png"])
    it = image.ImageIter(2, (3, 8, 8), imglist=paths, path_root=str(tmp_path))
    b = it.next()
    assert b.label[0].numpy().tolist() == [5.0, 6.0] and b.data[0].shape == (2, 3, 8, 8)
    lst = tmp_path / "a.lst"
    lst.write_text("0\t5\t0.png\n1\t6\t1.png\n")
    it = image.ImageIter(2, (3, 8, 8), path_imglist=str(lst), path_root=str(tmp_path), label_width=1)
    assert it.next().label[0].numpy().tolist() == [5.0, 6.0]


def test_image_iter_bad_args():
    with pytest.raises(ValueError):
        image.ImageIter(2, (3, 8, 8))
    with pytest.raises(ValueError):
        image.ImageIter(2, (1, 8, 8), path_imgrec=REC)
    with pytest.raises(ValueError):
        image.ImageIter(2, (3, 8, 8), path_imgrec=REC, shuffle=True)  # needs the index
    with pytest.raises(ValueError):
        image.ImageIter(2, (3, 8, 8), path_imgrec=REC, last_batch_handle="keep")


def test_image_det_iter():
    it = image.ImageDetIter(2, (3, 8, 8), path_imgrec=os.path.join(HERE, "det.rec"),
                            path_imgidx=os.path.join(HERE, "det.idx"), inter_method=1)
    assert it.provide_label[0][1] == (2, 2, 5)
    check_iter("idi", it, RESIZE_TOL)


def test_det_augmenters():
    label = np.array([[0, 0.1, 0.2, 0.6, 0.7], [1, 0.3, 0.1, 0.9, 0.5]], np.float32)
    img = png0()
    out, lab = image.DetHorizontalFlipAug(1.0)(img, label)
    close(out, img.numpy()[:, ::-1], 0)
    close(lab[:, 1], np.array([0.4, 0.1]), 1e-6)
    seeded()
    out, lab = image.DetRandomPadAug(area_range=(1.5, 2.5), pad_val=(1, 2, 3))(img, label)
    assert out.shape[0] >= img.shape[0] and out.shape[1] >= img.shape[1] and (lab[:, 1:] <= 1).all()
    seeded()
    out, lab = image.DetRandomCropAug(min_object_covered=0.1, area_range=(0.3, 1.0))(img, label)
    assert out.shape[0] <= img.shape[0] and (lab[:, 1:] >= 0).all()
    augs = image.CreateDetAugmenter((3, 8, 8), rand_crop=0.5, rand_pad=0.5, rand_mirror=True, mean=True, std=True)
    x, lab = png0(), label
    for aug in augs:
        x, lab = aug(x, lab)
    assert x.shape == (8, 8, 3) and str(x.dtype) == "float32"
