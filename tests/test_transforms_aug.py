"""Augmenting transforms of gluon.data.vision.transforms (crops, flips, colour jitters) with MXNet 1.x semantics.

References are written here independently: float64 numpy for the colour formulas (the stdlib's colorsys for hue),
plain slicing for crops, and the numbers MXNet 1.9.1 itself prints (``MXNET``, from the CPU wheel on Python 3.8:
``nd.image.random_<op>(x, a, a)`` with a fixed factor, ``nd.image.adjust_lighting``, ``transforms.CenterCrop``).
Random draws are replayed here from the same numpy seed, following MXNet's order of draws.
"""

from __future__ import annotations

import colorsys

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind.gluon import data as gdata
from dnnbind.gluon.data.vision import _color
from dnnbind.gluon.data.vision import transforms as T

IMG = np.random.RandomState(0).randint(0, 256, (3, 4, 3)).astype(np.uint8)
BIG = np.random.RandomState(1).randint(0, 256, (7, 9, 3)).astype(np.uint8)

MXNET = {
    ("brightness", 0.3): [51, 14, 35, 57, 20, 75, 58, 30, 2, 63, 6, 72, 10, 26, 21, 64, 26, 42, 17, 57, 69, 11, 26,
                          52, 26, 24, 49, 7, 23, 21, 2, 44, 34, 62, 72, 59],
    ("brightness", 1.7): [255, 79, 198, 255, 113, 255, 255, 175, 15, 255, 35, 255, 61, 147, 119, 255, 149, 238, 98,
                          255, 255, 66, 147, 255, 149, 137, 255, 42, 130, 122, 15, 251, 195, 255, 255, 255],
    ("contrast", 0.3): [131, 93, 114, 137, 99, 154, 138, 110, 82, 142, 85, 152, 90, 105, 100, 144, 106, 121, 97, 137,
                        148, 91, 105, 131, 106, 103, 129, 87, 102, 101, 82, 124, 114, 142, 152, 138],
    ("contrast", 1.7): [212, 0, 119, 246, 34, 255, 251, 95, 0, 255, 0, 255, 0, 68, 39, 255, 69, 158, 18, 248, 255, 0,
                        68, 216, 69, 58, 200, 0, 51, 42, 0, 171, 115, 255, 255, 255],
    ("hue", 0.3): [141, 172, 46, 250, 155, 67, 8, 195, 65, 242, 166, 20, 59, 36, 87, 165, 215, 88, 230, 57, 227, 174,
                   38, 113, 165, 80, 90, 61, 24, 77, 87, 8, 148, 197, 217, 242],
    ("hue", 1.7): [46, 91, 172, 67, 250, 228, 140, 8, 195, 20, 228, 242, 87, 80, 36, 88, 114, 215, 158, 230, 57, 59,
                   174, 38, 80, 165, 104, 71, 77, 24, 148, 142, 8, 242, 197, 198],
    ("lighting", (0.1, -0.2, 0.3)): [168, 43, 114, 188, 63, 248, 191, 99, 6, 207, 17, 239, 32, 83, 67, 212, 84, 137,
                                     54, 189, 227, 35, 83, 171, 84, 77, 162, 21, 73, 69, 5, 144, 112, 204, 239, 194],
}
# float32 input IMG * 0.5 + 0.25 (MXNet keeps floats unclamped):
MXNET_HUE_F = [71.24998474121094, 86.25, 23.750001907348633, 125.75, 77.85002899169922, 33.75, 4.750010967254639,
               97.74999237060547, 33.150020599365234, 121.25, 83.6500473022461, 10.749995231628418]
MXNET_CONTRAST_F = [106.62427520751953, 0.37427520751953125, 59.87427520751953, 123.62427520751953,
                    17.37427520751953, 173.7742919921875, 126.17427825927734, 47.974281311035156,
                    -31.925724029541016, 139.7742919921875, -21.725725173950195, 166.124267578125]
MXNET_CONTRAST_GRAY = [207, 241, 246, 255, 0, 255, 14, 0, 65, 0, 0, 255]  # IMG[..., :1], factor 1.7
MXNET_CENTER_CROP_43 = [[30, 198, 57, 24], [135, 104, 195, 23], [243, 190, 216, 65]]  # CenterCrop((4, 3))(BIG)[..., 0]

_ADJUST = {"brightness": _color.adjust_brightness, "contrast": _color.adjust_contrast, "hue": _color.adjust_hue,
           "lighting": _color.adjust_lighting}


@pytest.mark.parametrize("key", sorted(MXNET, key=str))
def test_color_formulas_match_mxnet_1_9_1(key):
    op, a = key
    alpha = np.asarray(a, np.float32) if op == "lighting" else np.float32(a)
    out = _color.saturate(_ADJUST[op](IMG.astype(np.float32), alpha), np.uint8)
    np.testing.assert_array_equal(out.reshape(-1), MXNET[key], err_msg=str(key))


def test_float_and_gray_inputs_match_mxnet_1_9_1():
    f = IMG.astype(np.float32) * 0.5 + 0.25
    np.testing.assert_allclose(_color.adjust_hue(f, np.float32(0.3)).reshape(-1)[:12], MXNET_HUE_F, rtol=1e-5)
    np.testing.assert_allclose(_color.adjust_contrast(IMG.astype(np.float32) * 0.5 + 0.25, np.float32(1.7))
                               .reshape(-1)[:12], MXNET_CONTRAST_F, rtol=1e-5, atol=1e-4)
    gray = _color.saturate(_color.adjust_contrast(IMG[..., :1].astype(np.float32), np.float32(1.7)), np.uint8)
    np.testing.assert_array_equal(gray.reshape(-1), MXNET_CONTRAST_GRAY)
    np.testing.assert_array_equal(T.CenterCrop((4, 3))(BIG)[..., 0], MXNET_CENTER_CROP_43)


# ---- float64 references ------------------------------------------------------------------------------------------

def ref_brightness(x, a):
    return x * a


def ref_contrast(x, a):
    gray = x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114 if x.shape[-1] == 3 else x[..., 0]
    return x * a + (1 - a) * gray.mean()


def ref_saturation(x, a):
    if x.shape[-1] == 1:
        return x
    gray = x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114
    return x * a + (1 - a) * gray[..., None]


def ref_hue(x, a):
    if x.shape[-1] == 1:
        return x
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        h, l, s = colorsys.rgb_to_hls(*(x[idx] / 255.0))
        out[idx] = np.array(colorsys.hls_to_rgb((h + a) % 1.0, l, s)) * 255.0  # a turns of the hue circle
    return out


EIGVAL = np.array([55.46, 4.794, 1.148])
EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])


def ref_lighting(x, alpha):
    return x if x.shape[-1] == 1 else x + EIGVEC @ (alpha * EIGVAL)


def to_dtype(ref, dtype):
    if np.dtype(dtype) == np.uint8:
        return np.floor(np.clip(ref, 0, 255))  # MXNet clamps, then truncates
    return ref


SINGLE = {"brightness": (T.RandomBrightness, ref_brightness), "contrast": (T.RandomContrast, ref_contrast),
          "saturation": (T.RandomSaturation, ref_saturation), "hue": (T.RandomHue, ref_hue)}
SHAPES = [(1, 1, 3), (5, 7, 3), (4, 6, 1), (3, 5, 7, 3), (1, 1, 1, 3), (2, 3, 2, 1)]


def _image(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, shape).astype(dtype) if dtype == np.uint8 else rng.uniform(0, 255, shape).astype(dtype)


def _compare(out, ref, dtype, name):
    ref = to_dtype(ref, dtype)
    if np.dtype(dtype) == np.uint8:
        diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
        # float32 vs float64 can straddle an integer before the truncation (hue's round trip often lands on one)
        assert diff.max(initial=0) <= 1, f"{name}: max diff {diff.max()}"
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-3, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", sorted(SINGLE))
def test_random_factor_transforms_against_float64(op, shape, dtype):
    cls, ref = SINGLE[op]
    x = _image(shape, dtype, 1)
    amount = 0.5
    lo, hi = max(0.0, 1 - amount), 1 + amount
    np.random.seed(7)
    images = x if x.ndim == 4 else x[None]
    factors = [float(np.float32(np.random.uniform(lo, hi))) for _ in images]  # one draw per image, in order
    want = np.stack([ref(img.astype(np.float64), a) for img, a in zip(images, factors)]).reshape(x.shape)
    np.random.seed(7)
    out = cls(amount)(x)
    assert isinstance(out, np.ndarray) and out.shape == x.shape and out.dtype == x.dtype
    _compare(out, want, dtype, f"{op} {shape} {np.dtype(dtype)}")


@pytest.mark.parametrize("shape", SHAPES)
def test_random_lighting_against_float64(shape):
    x = _image(shape, np.float32, 2)
    images = x if x.ndim == 4 else x[None]
    np.random.seed(3)
    alphas = [np.random.normal(0, 0.1, 3).astype(np.float32).astype(np.float64) for _ in images]
    want = np.stack([ref_lighting(img.astype(np.float64), a) for img, a in zip(images, alphas)]).reshape(x.shape)
    np.random.seed(3)
    _compare(T.RandomLighting(0.1)(x), want, np.float32, f"lighting {shape}")


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("shape", [(1, 1, 3), (6, 5, 3), (2, 4, 4, 3), (3, 4, 1)])
def test_random_color_jitter_against_float64(shape, dtype):
    amounts = {"brightness": 0.4, "contrast": 0.3, "saturation": 0.0, "hue": 0.2}  # saturation 0: skipped
    x = _image(shape, dtype, 4)
    images = x if x.ndim == 4 else x[None]
    np.random.seed(11)
    want = []
    for img in images:  # MXNet's order of draws: a shuffle of the four, then a factor per non-zero jitter
        y = img.astype(np.float64)
        for k in np.random.permutation(4):
            name = ("brightness", "contrast", "saturation", "hue")[k]
            v = amounts[name]
            if v > 0:
                u = float(np.float32(np.random.uniform(-v, v)))
                f = {"brightness": ref_brightness, "contrast": ref_contrast, "hue": ref_hue}[name]
                y = to_dtype(f(y, u if name == "hue" else 1 + u), dtype)
        want.append(y)
    np.random.seed(11)
    out = T.RandomColorJitter(**amounts)(x)
    want = np.stack(want).reshape(x.shape)
    if dtype == np.uint8:  # rounding differences may carry through later steps
        assert np.abs(out.astype(np.int64) - want).max() <= 2
    else:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-2)


def test_zero_amounts_are_the_identity_and_draws_are_seeded():
    x = _image((5, 6, 3), np.uint8, 5)
    for t in (T.RandomColorJitter(), T.RandomBrightness(0), T.RandomContrast(0), T.RandomSaturation(0),
              T.RandomLighting(0)):
        np.testing.assert_array_equal(t(x), x, err_msg=repr(t))
    aug = T.Compose([T.RandomFlipLeftRight(), T.RandomColorJitter(0.5, 0.5, 0.5, 0.5),
                     T.RandomResizedCrop(4), T.RandomLighting(0.1)])
    dnnbind.nd.random.seed(42)  # mx.random.seed seeds numpy's generator, which the transforms draw from
    first = aug(x)
    dnnbind.nd.random.seed(42)
    np.testing.assert_array_equal(aug(x), first)


RANDOM = [T.RandomFlipLeftRight(), T.RandomFlipTopBottom(), T.RandomBrightness(0.5), T.RandomContrast(0.5),
          T.RandomSaturation(0.5), T.RandomHue(0.5), T.RandomColorJitter(0.4, 0.4, 0.4, 0.4), T.RandomLighting(0.2),
          T.RandomResizedCrop((5, 4)), T.CenterCrop(3), T.CropResize(1, 1, 3, 2, size=4)]


@pytest.mark.parametrize("t", RANDOM, ids=[type(t).__name__ for t in RANDOM])
def test_batch_equals_images_one_by_one_and_ndarray_in_ndarray_out(t):
    x = _image((4, 6, 7, 3), np.uint8, 6)
    np.random.seed(0)
    batch = t(x)
    np.random.seed(0)
    one_by_one = np.stack([t(img) for img in x])
    np.testing.assert_array_equal(batch, one_by_one)
    assert t.batchable
    np.random.seed(0)
    out = t(nd.array(x[0], dtype="uint8"))
    assert isinstance(out, dnnbind.NDArray) and out.dtype == np.uint8 and out.device.kind == "cpu"
    np.testing.assert_array_equal(out.asnumpy(), one_by_one[0])


def test_random_flips():
    x = _image((2, 3, 1), np.uint8, 7)
    for t, axis in ((T.RandomFlipLeftRight(), 1), (T.RandomFlipTopBottom(), 0)):
        np.random.seed(1)
        flips = np.random.rand(400) < 0.5
        np.random.seed(1)
        outs = [t(x) for _ in range(400)]
        for out, flip in zip(outs, flips):
            np.testing.assert_array_equal(out, np.flip(x, axis) if flip else x)
        assert 150 < flips.sum() < 250
        assert t(np.zeros((1, 1, 3), np.float32)).shape == (1, 1, 3)


def test_center_crop_and_crop_resize():
    for size in [(4, 3), (1, 1), (9, 7), 5]:
        w, h = (size, size) if isinstance(size, int) else size
        y0, x0 = (7 - h) // 2, (9 - w) // 2
        np.testing.assert_array_equal(T.CenterCrop(size)(BIG), BIG[y0:y0 + h, x0:x0 + w], err_msg=str(size))
    # larger than the image: the largest centred window of the size's aspect ratio, upsampled (MXNet's scale_down)
    out = T.CenterCrop((12, 3))(BIG)  # 9 wide -> window 9 x int(3 * 9 / 12) = 9 x 2 at y = 2
    np.testing.assert_array_equal(out, T.Resize((12, 3))(BIG[2:4, 0:9]))
    assert T.CenterCrop(20)(BIG).shape == (20, 20, 3)
    batch = np.stack([BIG, BIG[::-1]])
    np.testing.assert_array_equal(T.CenterCrop((4, 3))(batch)[1], T.CenterCrop((4, 3))(BIG[::-1]))
    np.testing.assert_array_equal(T.CropResize(1, 2, 3, 4)(BIG), BIG[2:6, 1:4])
    np.testing.assert_array_equal(T.CropResize(0, 0, 9, 7)(batch), batch)
    np.testing.assert_array_equal(T.CropResize(1, 2, 3, 4, size=5)(BIG), T.Resize(5)(BIG[2:6, 1:4]))
    np.testing.assert_array_equal(T.CropResize(8, 6, 1, 1)(BIG), BIG[6:7, 8:9])


def _replay_window(h, w, scale, ratio):
    """MXNet's random_size_crop draws, written out: 10 tries of (area, log-ratio), then the placement."""
    for _ in range(10):
        area = np.random.uniform(*scale) * h * w
        r = np.exp(np.random.uniform(np.log(ratio[0]), np.log(ratio[1])))
        nw, nh = round(float(np.sqrt(area * r))), round(float(np.sqrt(area / r)))
        if 0 < nw <= w and 0 < nh <= h:
            return np.random.randint(0, w - nw + 1), np.random.randint(0, h - nh + 1), nw, nh
    return None


@pytest.mark.parametrize("seed", range(6))
def test_random_resized_crop_replays_mxnet_sampling(seed):
    img = _image((11, 13, 3), np.float32, seed)
    np.random.seed(seed)
    x0, y0, nw, nh = _replay_window(11, 13, (0.08, 1.0), (3 / 4, 4 / 3))
    np.random.seed(seed)
    out = T.RandomResizedCrop((6, 5))(img)
    assert out.shape == (5, 6, 3)
    np.testing.assert_allclose(out, T.Resize((6, 5))(img[y0:y0 + nh, x0:x0 + nw]), rtol=1e-6)
    # no window fits (areas above the image's): the centre crop of the size's aspect ratio
    np.random.seed(seed)
    assert _replay_window(11, 13, (2.0, 3.0), (1.0, 1.0)) is None
    np.testing.assert_array_equal(T.RandomResizedCrop(4, scale=(2.0, 3.0), ratio=(1.0, 1.0))(img),
                                  T.CenterCrop(4)(img))
    one = T.RandomResizedCrop(1)(np.ones((1, 1, 3), np.uint8))
    assert one.shape == (1, 1, 3) and (one == 1).all()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"RandomBrightness: expected an image \(H, W, C\).*shape \(4, 4\)"):
        T.RandomBrightness(0.5)(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match=r"RandomHue: expected 1 or 3 channels.*\(2, 2, 4\)"):
        T.RandomHue(0.5)(np.zeros((2, 2, 4), np.uint8))
    with pytest.raises(ValueError, match="RandomContrast: contrast must be a number >= 0"):
        T.RandomContrast(-0.1)
    with pytest.raises(ValueError, match="RandomColorJitter: hue must be"):
        T.RandomColorJitter(hue=-1)
    with pytest.raises(ValueError, match="CropResize: the window x=7, y=2, width=3, height=4 does not fit"):
        T.CropResize(7, 2, 3, 4)(BIG)
    with pytest.raises(ValueError, match="CropResize: need x, y >= 0"):
        T.CropResize(-1, 0, 2, 2)
    with pytest.raises(TypeError, match="CropResize: width must be an int"):
        T.CropResize(0, 0, 2.5, 2)
    with pytest.raises(ValueError, match="RandomResizedCrop: ratio"):
        T.RandomResizedCrop(4, ratio=(0, 1))
    with pytest.raises(ValueError, match="CenterCrop: size must be positive"):
        T.CenterCrop((0, 3))
    with pytest.raises(TypeError, match="CenterCrop: size must be an int or"):
        T.CenterCrop("big")
    with pytest.raises(ValueError, match="CenterCrop: unknown interpolation 7"):
        T.CenterCrop(3, interpolation=7)
    with pytest.raises(ValueError, match="RandomFlipTopBottom: expected"):
        T.RandomFlipTopBottom()(np.zeros((1, 2, 3, 4, 5)))


def test_dataloader_batched_path_equals_per_sample_path():
    images = _image((10, 6, 6, 3), np.uint8, 8)
    ds = gdata.ArrayDataset(images, np.arange(10)).transform_first(
        T.Compose([T.RandomFlipLeftRight(), T.RandomBrightness(0.3), T.ToTensor()]))
    np.random.seed(5)
    fast = [b[0].asnumpy() for b in gdata.DataLoader(ds, batch_size=4)]
    np.random.seed(5)
    slow = [b[0].asnumpy() for b in gdata.DataLoader(ds, batch_size=4, batchify_fn=gdata.default_batchify_fn)]
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
    assert fast[0].shape == (4, 3, 6, 6) and fast[-1].shape == (2, 3, 6, 6)
    nested = T.Compose([T.Compose([T.RandomFlipTopBottom()]), T.RandomHue(0.5)])  # two random draws per image
    np.random.seed(2)
    batch = nested(images)
    np.random.seed(2)
    np.testing.assert_array_equal(batch, np.stack([nested(img) for img in images]))


def test_mxnet_alias_exposes_the_transforms():
    mx = dnnbind.install_mxnet_alias()
    from mxnet.gluon.data.vision import transforms as mt
    for name in ("CenterCrop", "RandomResizedCrop", "RandomFlipLeftRight", "RandomFlipTopBottom", "RandomBrightness",
                 "RandomContrast", "RandomSaturation", "RandomHue", "RandomColorJitter", "RandomLighting", "Cast",
                 "CropResize"):
        assert getattr(mt, name) is getattr(T, name)
    img = mx.nd.array(IMG, dtype="uint8")
    out = mt.Compose([mt.RandomFlipLeftRight(), mt.RandomColorJitter(0.5, 0.5, 0.5, 0.5),
                      mt.RandomResizedCrop((20, 10), scale=(0.1, 1), ratio=(0.5, 2))])(img)
    assert out.shape == (10, 20, 3) and out.asnumpy().dtype == np.uint8


def test_existing_transforms_give_ndarray_for_ndarray_input():
    x = _image((5, 6, 3), np.uint8, 9)
    for t in (T.ToTensor(), T.Cast("float16"), T.Resize(4), T.Compose([T.ToTensor(), T.Normalize(0.5, 0.25)])):
        want = t(x)
        out = t(nd.array(x, dtype="uint8"))
        assert isinstance(want, np.ndarray) and isinstance(out, dnnbind.NDArray), repr(t)
        assert out.dtype == want.dtype and out.device.kind == "cpu"
        np.testing.assert_array_equal(out.asnumpy(), want)


# ---- every transform, fuzzed with bad arguments and bad images ---------------------------------------------------

# A working instance of each transform of the module (a new transform must be added here: the test checks).
GOOD = {
    "Cast": lambda: T.Cast(), "CenterCrop": lambda: T.CenterCrop(3),
    "Compose": lambda: T.Compose([T.Resize(3), T.ToTensor()]), "CropResize": lambda: T.CropResize(0, 0, 2, 2, size=3),
    "Normalize": lambda: T.Normalize(0.5, 0.2), "RandomBrightness": lambda: T.RandomBrightness(0.3),
    "RandomColorJitter": lambda: T.RandomColorJitter(0.2, 0.2, 0.2, 0.1), "RandomContrast": lambda: T.RandomContrast(0.3),
    "RandomFlipLeftRight": lambda: T.RandomFlipLeftRight(), "RandomFlipTopBottom": lambda: T.RandomFlipTopBottom(),
    "RandomHue": lambda: T.RandomHue(0.1), "RandomLighting": lambda: T.RandomLighting(0.1),
    "RandomResizedCrop": lambda: T.RandomResizedCrop(3), "RandomSaturation": lambda: T.RandomSaturation(0.3),
    "Resize": lambda: T.Resize(3), "ToTensor": lambda: T.ToTensor(),
}
_SIZE = [((0,), ValueError), (((2, 0),), ValueError), (("a",), TypeError), ((None,), TypeError), ((2.5,), TypeError),
         ((True,), TypeError), (((1, 2, 3),), TypeError)]
_AMOUNT = [((-1,), ValueError), (("x",), TypeError), ((None,), TypeError), ((float("inf"),), ValueError),
           ((float("nan"),), ValueError)]
# Bad constructor arguments: (args, error). MXNet 1.9.1 rejects float sizes too (MXNetError "Invalid Parameter
# format for size"); it takes a negative jitter amount, Normalize(std=0) (giving inf) and Compose(None) (an
# AttributeError later), which dnnbind refuses here.
BAD_ARGS = {
    "Cast": [(("notadtype",), TypeError), ((object,), TypeError), ((str,), TypeError)],
    "CenterCrop": _SIZE + [((3, 99), ValueError), ((3, "x"), TypeError)],
    "Compose": [((None,), TypeError), ((3,), TypeError), (([1],), TypeError), ((T.ToTensor(),), TypeError)],
    "CropResize": [((0, 0, 0, 2), ValueError), (("a", 0, 2, 2), TypeError), ((0, 0, 2, 2, 0), ValueError),
                   ((0, 0, 2, 2, "x"), TypeError), ((0, 0, 2, 2, 3, 99), ValueError)],
    "Normalize": [(("a",), TypeError), ((None,), TypeError), ((0.5, 0), ValueError), ((0.5, [1, 0]), ValueError),
                  (([],), TypeError), ((float("nan"),), ValueError)],
    "RandomBrightness": _AMOUNT, "RandomContrast": _AMOUNT, "RandomSaturation": _AMOUNT, "RandomHue": _AMOUNT,
    "RandomLighting": _AMOUNT,
    "RandomColorJitter": [((-1,), ValueError), (("x",), TypeError), ((0, 0, 0, None), TypeError)],
    "RandomFlipLeftRight": [((1,), TypeError)], "RandomFlipTopBottom": [((1,), TypeError)], "ToTensor": [((1,), TypeError)],
    "RandomResizedCrop": _SIZE + [((3, "x"), TypeError), ((3, (0, 1)), ValueError), ((3, (0.1, 1), "x"), TypeError),
                                  ((3, (0.1, 1), (0, 1)), ValueError), ((3, (0.1, 1), (1, 1), 99), ValueError),
                                  ((3, (0.1, float("inf"))), ValueError)],
    "Resize": _SIZE + [((3, False, 99), ValueError), ((3, False, "x"), TypeError)],
}
# Bad images: (label, input, error). Resize of an image with H = 0 raised IndexError before.
BAD_SHAPES = [("H=0", np.zeros((0, 4, 3), np.uint8)), ("W=0", np.zeros((4, 0, 3), np.uint8)),
              ("C=0", np.zeros((4, 4, 0), np.uint8)), ("batch H=0", np.zeros((2, 0, 4, 3), np.uint8)),
              ("2-D", np.zeros((4, 4), np.uint8)), ("5-D", np.zeros((1, 1, 4, 4, 3), np.uint8)),
              ("0-D", np.uint8(3))]
BAD_DTYPES = [("object", np.array([[[None]]], dtype=object)), ("str", "abc"), ("None", None),
              ("complex", np.zeros((4, 4, 3), np.complex64)), ("str array", np.full((4, 4, 3), "a"))]


@pytest.mark.parametrize("name", T.__all__)
def test_every_transform_rejects_bad_arguments_and_images_by_name(name):
    assert set(GOOD) == set(T.__all__) == set(BAD_ARGS)
    for args, error in BAD_ARGS[name]:
        with pytest.raises(error, match=name if name not in ("RandomFlipLeftRight", "RandomFlipTopBottom",
                                                                "ToTensor") else "takes no arguments"):
            getattr(T, name)(*args)
    t = GOOD[name]()
    inner = "Resize" if name == "Compose" else name  # a Compose's error names the transform that raised it
    cases = [(label, x, TypeError) for label, x in BAD_DTYPES]
    if name != "Cast":  # Cast takes any shape
        cases += [(label, x, ValueError) for label, x in BAD_SHAPES]
    for label, x, error in cases:
        with pytest.raises(error) as info:
            t(x)
        msg = str(info.value)
        assert msg.startswith(inner + ":") and str(np.shape(x)) in msg, (label, msg)
        assert isinstance(info.value, dnnbind.DnnbindError), (label, type(info.value))
    if name != "Cast":  # an empty batch is not an error: it gives an empty batch
        out = t(np.zeros((0, 5, 5, 3), np.uint8))
        assert out.shape[0] == 0


def test_resize_of_an_empty_image_names_the_shape():
    with pytest.raises(ValueError, match=r"Resize: the image is empty: shape \(0, 4, 3\) \(H, W, C = 0, 4, 3\)"):
        T.Resize(3)(np.zeros((0, 4, 3), np.uint8))
    with pytest.raises(ValueError, match=r"Resize: the image is empty"):
        T.Resize(3, keep_ratio=True)(nd.array(np.zeros((4, 0, 3), np.uint8), dtype=np.uint8))
