"""CPU tests of ops.bias_relu_wgrad, the weight and bias gradients of a fused conv + bias + ReLU with at most 32
filter taps: the numpy twin against a float64 loop written here from the definition, the launch geometry and the
Geometry argument of ops._wgrad_kernels, the NVRTC compile of every kernel instance for sm_90 (no GPU needed, with
ptxas' register report), the argument checks of the GPU path before any launch, and the kernels themselves on the
faked device of test_nn_kernels_emulated.py (numpy transcriptions of their index math). The kernels run on a GPU
in test_wgrad_small_gpu.py.
"""

from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest

import dnnbind
from dnnbind.ops import _wgrad_kernels as KW
from dnnbind.ops import reference as R
from tests._helpers import assert_close
from tests.test_nn_kernels import nhwc_shape, relu_out, rnd

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def out_hw(h, w, r, s, stride, padding, dilation):
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    return (h + 2 * ph - dh * (r - 1) - 1) // sh + 1, (w + 2 * pw - dw * (s - 1) - 1) // sw + 1


def wgrad_f64(x, y, dy, w_nchw, stride, padding, dilation, layout):
    """(dw in NCHW order, db, sum |dz * x| per dw element) in float64, tap by tap from the definition: dz = dy where
    y > 0, dw[k, c, r, s] = math.fsum over n, p, q of dz[n, k, p, q] * x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw]
    (0 outside x)."""
    nchw = (lambda a: a) if layout == "NCHW" else (lambda a: np.moveaxis(a, 3, 1))
    x, y, dy = (nchw(a.astype(F64)) for a in (x, y, dy))
    (sh, sw), (ph, pw), (dh, dw_) = pair(stride), pair(padding), pair(dilation)
    k_, c_, r_, s_ = w_nchw
    n, _, h, w = x.shape
    _, _, p_, q_ = y.shape
    dz = np.where(y > 0, dy, 0.0)
    p, q = np.meshgrid(np.arange(p_), np.arange(q_), indexing="ij")
    dwt, mag = np.zeros(w_nchw), np.zeros(w_nchw)
    for c, r, s in np.ndindex(c_, r_, s_):
        ih, iw = p * sh - ph + r * dh, q * sw - pw + s * dw_
        inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
        xg = np.where(inside, x[:, c, np.clip(ih, 0, h - 1), np.clip(iw, 0, w - 1)], 0.0)  # (N, P, Q)
        for k in range(k_):
            terms = (dz[:, k] * xg).ravel()
            dwt[k, c, r, s], mag[k, c, r, s] = math.fsum(terms), np.abs(terms).sum()
    db = np.array([math.fsum(dz[:, k].ravel()) for k in range(k_)])
    return dwt, db, mag, np.abs(dz).sum(axis=(0, 2, 3))


def w_in(w_nchw, layout):
    """A weight shape (K, C, R, S) in ``layout`` ((K, R, S, C) for NHWC)."""
    k, c, r, s = w_nchw
    return w_nchw if layout == "NCHW" else (k, r, s, c)


def dw_nchw(dw, layout):
    return dw if layout == "NCHW" else np.moveaxis(dw, 3, 1)


# x (N, C, H, W), K, (R, S), stride, padding, dilation
CASES = [
    ((1, 1, 5, 5), 1, (3, 3), 1, 1, 1),  # N = 1, K = 1
    ((2, 3, 7, 9), 4, (3, 3), 1, 0, 1),  # RGB-like, no padding, odd sizes
    ((3, 1, 11, 10), 5, (5, 5), 2, 2, 1),  # 5x5, stride 2, padding 2
    ((2, 3, 9, 8), 2, (3, 3), 2, 1, 2),  # dilation 2 and stride 2
    ((2, 1, 6, 7), 3, (1, 1), 1, 0, 1),  # one tap
    ((1, 2, 8, 8), 6, (3, 5), (2, 1), (1, 2), (1, 2)),  # every pair asymmetric, 30 taps
    ((4, 1, 28, 28), 8, (3, 3), 1, 1, 1),  # SimpleCNN's conv1, smaller
    ((1, 32, 3, 3), 2, (1, 1), 1, 0, 1),  # 32 taps: the limit
    ((2, 1, 1, 1), 3, (3, 3), 1, 1, 1),  # a 1x1 image, all but the centre tap in the padding
]


def make_case(case, layout, dtype, seed=0):
    xs, k, (r, s), stride, padding, dilation = case
    n, c, h, w = xs
    p, q = out_hw(h, w, r, s, stride, padding, dilation)
    x = rnd(nhwc_shape(xs, layout), seed, dtype)
    y, dy = relu_out(nhwc_shape((n, k, p, q), layout), seed + 1, dtype), rnd(nhwc_shape((n, k, p, q), layout),
                                                                              seed + 2, dtype)
    return x, y, dy, (k, c, r, s), dict(stride=stride, padding=padding, dilation=dilation, layout=layout)


def check_against_f64(dw, db, x, y, dy, w_nchw, kw, dtype):
    want_dw, want_db, mag, dz_mag = wgrad_f64(x, y, dy, w_nchw, kw["stride"], kw["padding"], kw["dilation"],
                                              kw["layout"])
    # float32 sums of float32 products: 1e-5 relative and 1e-5 of sum |terms| absolute (the order differs from the
    # loop's); float16: the float32 sum rounded to float16 (2 half ulps); float64: 1e-12
    rtol, k = {F16: (2e-3, 1e-4), F32: (1e-5, 1e-5), F64: (1e-12, 1e-12)}[dtype]
    assert_close(dw_nchw(dw, kw["layout"]), want_dw, rtol, k * max(1e-30, mag.max()), name="dw")
    assert_close(db, want_db, rtol, k * max(1e-30, dz_mag.max()), name="db")


@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_reference_matches_float64_loops(case, layout, dtype):
    x, y, dy, w_nchw, kw = make_case(case, layout, dtype)
    dw, db = R.bias_relu_wgrad(x, y, dy, w_in(w_nchw, layout), **kw)
    assert dw.dtype == dtype and db.dtype == dtype and dw.shape == w_in(w_nchw, layout) and db.shape == (w_nchw[0],)
    check_against_f64(dw, db, x, y, dy, w_nchw, kw, dtype)
    # the same numbers as the unfused route: bias_relu_backward, then conv_backward_filter of its dz
    dz, db2 = R.bias_relu_backward(y, dy, layout)
    np.testing.assert_array_equal(db, db2)
    np.testing.assert_array_equal(dw, R.conv_backward_filter(x, dz, w_in(w_nchw, layout), kw["stride"],
                                                             kw["padding"], kw["dilation"], 1, layout))


def test_reference_nan_rules():
    x = np.ones((1, 1, 2, 2), F32)
    y = np.array([np.nan, 0.0, 1.0, 2.0], F32).reshape(1, 1, 2, 2)
    dy = np.array([5.0, np.inf, 3.0, np.nan], F32).reshape(1, 1, 2, 2)
    dw, db = R.bias_relu_wgrad(x, y[:, :, :1, :1], dy[:, :, :1, :1], (1, 1, 2, 2))
    assert dw.tolist() == [[[[0.0, 0.0], [0.0, 0.0]]]] and db.tolist() == [0.0]  # a NaN y is not positive
    dw, db = R.bias_relu_wgrad(x, y, dy, (1, 1, 1, 1))
    assert np.isnan(dw).all() and np.isnan(db).all()  # a NaN dy where y > 0 reaches both; inf where y == 0 not


# -- launch geometry and the kernel's arguments -----------------------------------------------------------------

def test_magic_division_is_exact():
    rng = np.random.default_rng(0)
    for d in list(range(1, 1100)) + [int(v) for v in rng.integers(1, 2**31, 300)] + [2**30, 2**30 + 1, 2**31 - 1]:
        mul, shr = KW.magic(d)
        assert 0 <= mul < 2**32 and 0 <= shr <= 31
        ms = [0, 1, d - 1, d, d + 1, 2**31 - 1] + [int(v) for v in rng.integers(0, 2**31, 50)]
        ms += [min(2**31 - 1, max(0, (int(v) // d) * d + e)) for v in rng.integers(0, 2**31, 20) for e in (-1, 0)]
        for m in ms:
            assert (((m * mul) >> 32) + m) >> shr == m // d, (d, m)


def test_geometry_struct_matches_the_cuda_struct():
    body = re.search(r"struct dn_wgrad_geom \{(.*?)\};", KW.SOURCE, re.S).group(1)
    fields = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            ctype, names = re.fullmatch(r"(unsigned int|int) (.*)", decl).groups()
            for name in names.split(","):
                m = re.fullmatch(r"(\w+)(?:\[(\w+)\])?", name.strip())
                fields.append((m.group(1), ctype, m.group(2)))
    got = [(name, t) for name, t in KW.Geometry._fields_]
    assert [f[0] for f in fields] == [name for name, _ in got]
    for (name, ctype, count), (_, t) in zip(fields, got):
        if count:
            assert count == "DN_MAX_TAPS" and t._length_ == KW.MAX_TAPS and t._type_ is ctypes.c_int, name
        else:
            assert t is (ctypes.c_uint if ctype == "unsigned int" else ctypes.c_int), name
    assert ctypes.sizeof(KW.Geometry) == 4 * (17 + 3 * KW.MAX_TAPS)
    assert "#define DN_MAX_TAPS 32" in KW.SOURCE and KW.MAX_TAPS == 32


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_tap_table_addresses_x(case, layout):
    """off[t] from an output position's top-left pixel lands on x[n, c, ih + r*dh, iw + s*dw], taps in w's order."""
    xs, k, (r, s), stride, padding, dilation = case
    n, c, h, w = xs
    dil = pair(dilation)
    off, dr, dc = KW.taps_table(c, h, w, r, s, dil, layout)
    x = np.arange(math.prod(xs)).reshape(nhwc_shape(xs, layout))
    taps = np.arange(c * r * s).reshape(w_in((1, c, r, s), layout)[1:])  # tap numbers in w's memory order
    for ci, ri, si in np.ndindex(c, r, s):
        t = taps[ci, ri, si] if layout == "NCHW" else taps[ri, si, ci]
        assert (dr[t], dc[t]) == (ri * dil[0], si * dil[1])
        for ni, ih, iw in ((n - 1, 0, 0), (0, h - 1 - dr[t], w - 1 - dc[t])):  # the tap at the top left, bottom right
            if ih < 0 or iw < 0 or ih + dr[t] >= h or iw + dc[t] >= w:
                continue  # the tap reaches past the image from every position
            base = ni * c * h * w + (ih * w + iw) * (1 if layout == "NCHW" else c)
            want = x[ni, ci, ih + dr[t], iw + dc[t]] if layout == "NCHW" else x[ni, ih + dr[t], iw + dc[t], ci]
            assert x.flat[base + off[t]] == want


GEOMETRY = [(64, 32, 28, 28, 9), (8, 16, 32, 32, 27), (8, 16, 16, 16, 27), (1, 1, 1, 1, 1), (2, 3, 7, 9, 25),
            (256, 64, 112, 112, 27), (1, 70, 1, 1, 32), (64, 5, 28, 28, 30), (1, 2, 300, 300, 16)]


@pytest.mark.parametrize("shape", GEOMETRY, ids=str)
def test_geometry_covers_each_channel_and_position_once(shape):
    n, k, p, q, taps = shape
    rows = n * p * q
    for layout in ("NCHW", "NHWC"):
        kb = KW.channels_per_thread(taps, layout)
        assert kb * (taps + 1) <= KW.MAX_SUMS or kb == 1
        grid, block, chunk, s = KW.geometry(layout, rows, k, taps)
        tx = block[0] if layout == "NHWC" else 1
        assert block[0] * block[1] == KW.BLOCK and tx & (tx - 1) == 0 and tx <= 32
        assert grid[0] * tx * kb >= k > (grid[0] - 1) * tx * kb  # every channel, no empty block column
        assert grid[1] == s and 1 <= s <= 65535 and (s - 1) * chunk < rows <= s * chunk  # no empty slice
        if s > 1:  # each thread keeps MIN_POSITIONS positions
            assert chunk >= KW.MIN_POSITIONS * block[1 if layout == "NHWC" else 0]
    assert KW.final_grid(k, taps) * KW.BLOCK >= 32 * k * (taps + 1)


def test_simplecnn_conv1_fills_the_gpu():
    grid, block, chunk, s = KW.geometry("NCHW", 64 * 28 * 28, 32, 9)
    assert KW.channels_per_thread(9, "NCHW") == 4 and grid[0] == 8 and grid[0] * grid[1] >= 2 * 132
    geom, grid2, block2, s2 = KW.launch_plan((64, 1, 28, 28), (32, 1, 3, 3), (64, 32, 28, 28), (1, 1), (1, 1),
                                             (1, 1), "NCHW")
    assert (grid2, block2, s2) == (grid, block, s) and (geom.K, geom.PQ, geom.Q, geom.CHUNK) == (32, 784, 28, chunk)
    assert (geom.H, geom.W, geom.CHW, geom.XS, geom.PH, geom.PW, geom.ROWS) == (28, 28, 784, 1, 1, 1, 64 * 784)
    assert list(geom.off[:9]) == [0, 1, 2, 28, 29, 30, 56, 57, 58] and list(geom.dr[:9]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_kernel_names():
    assert KW.wgrad_name(F32, 9, "NCHW") == "dn_wgrad<float, 9, 4, false>"
    assert KW.wgrad_name(F16, 27, "NCHW") == "dn_wgrad<dn_half, 27, 2, false>"
    assert KW.wgrad_name(F32, 27, "NHWC") == "dn_wgrad<float, 27, 1, true>"
    assert KW.wgrad_name(F32, 32, "NCHW") == "dn_wgrad<float, 32, 1, false>"
    assert KW.final_name(F16) == "dn_wgrad_final<dn_half>"
    assert KW.fwd_name(F16, 9) == "dn_small_fwd<dn_half, 9>" and KW.fwd_grid(50176, 32) == (196, 4)
    assert len(set(KW.ALL_NAMES)) == 2 * 32 * 2 + 2 + 2 * 32


def test_every_instance_compiles_for_sm_90_without_spills():
    """Each (dtype, taps, layout) the op can ask for and the final sums compile (NVRTC, no GPU); ptxas' report
    shows no spills and at most 128 registers (two 256-thread blocks per SM)."""
    from dnnbind.kernels import Module
    mod = Module(KW.SOURCE, KW.ALL_NAMES, options=("-Xptxas=-v",), arch="sm_90")
    assert mod.code and set(mod.lowered_names) == set(KW.ALL_NAMES)
    assert "warning" not in mod.log.lower(), mod.log
    used = [int(v) for v in re.findall(r"Used (\d+) registers", mod.log)]
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", mod.log)]
    assert len(used) == len(KW.ALL_NAMES) and max(used) <= 128 and not any(spills), mod.log


# -- argument checks of the GPU path, before any work -----------------------------------------------------------

def _fake_gpu(shape, dtype=F32, ptr=1 << 20):
    from dnnbind.runtime.array import NDArray
    return NDArray._from_ptr(ptr, shape, dtype, dnnbind.gpu(0), None)


X, Y = (2, 3, 8, 8), (2, 5, 6, 6)


@pytest.mark.parametrize("args, kwargs, exc, text", [
    ((X, Y, Y, (5, 3, 3, 3), F64), {}, TypeError, "x has dtype float64; expected one of float32, float16"),
    ((X, Y, (2, 5, 6, 5), (5, 3, 3, 3)), {}, ValueError, r"shapes differ \(y \(2, 5, 6, 6\), dy \(2, 5, 6, 5\)\)"),
    ((X, (2, 5, 8, 8), (2, 5, 8, 8), (5, 3, 3, 3)), {}, ValueError, r"y has shape \(2, 5, 8, 8\) but the "
                                                                    r"convolution gives \(2, 5, 6, 6\)"),
    ((X, Y, Y, (5, 1, 3, 3)), {}, ValueError, r"only ungrouped convolutions \(groups=1\)"),
    (((2, 4, 8, 8), Y, Y, (5, 4, 3, 3)), {}, ValueError, "C\\*R\\*S = 4\\*3\\*3 = 36 taps; at most 32"),
    ((X, Y, Y, (5, 3, 3, 3)), dict(layout="NHWC"), ValueError, r"x has 8 channels but w_shape"),
    ((X, Y, Y, (5, 3, 3, 3)), dict(out_dw=(5, 3, 3, 1)), ValueError, r"out_dw has shape \(5, 3, 3, 1\)"),
    ((X, Y, Y, (5, 3, 3, 3)), dict(out_db=(4,)), ValueError, r"out_db has shape \(4,\)"),
    ((X, Y, Y, (5, 3, 3, 3)), dict(out_db=np.zeros(5, F32)), TypeError, "out_db must be a dnnbind NDArray"),
    ((X, Y, Y, (5, 3, 3)), {}, ValueError, r"w_shape must be 4-D \(K, C, R, S\)"),
    ((X, Y, Y, 5), {}, TypeError, "w_shape must be a tuple of ints"),
])
def test_gpu_op_refuses_bad_input_before_any_launch(monkeypatch, args, kwargs, exc, text):
    from dnnbind.ops import bias_relu as BR

    def forbidden(*a, **k):
        raise AssertionError("allocated or launched before the checks")

    monkeypatch.setattr(KW, "kernel", forbidden)
    monkeypatch.setattr(BR, "empty", forbidden)
    xs, ys, dys, ws, *dt = args
    monkeypatch.setattr(BR, "out_like", forbidden)
    kwargs = {name: _fake_gpu(v, ptr=1 << 24) if isinstance(v, tuple) else v for name, v in kwargs.items()}
    arrays = [_fake_gpu(s, dt[0] if dt and i == 0 else F32) for i, s in enumerate((xs, ys, dys))]
    with pytest.raises(exc, match=f"^bias_relu_wgrad: .*{text}"):
        dnnbind.ops.bias_relu_wgrad(*arrays, ws, **kwargs)


def test_cpu_ndarrays_take_the_numpy_twin():
    x, y, dy, w_nchw, kw = make_case(CASES[1], "NCHW", F32)
    dw, db = dnnbind.ops.bias_relu_wgrad(*(dnnbind.array(a, device="cpu") for a in (x, y, dy)), w_nchw, **kw)
    want = R.bias_relu_wgrad(x, y, dy, w_nchw, **kw)
    np.testing.assert_array_equal(dw.numpy(), want[0])
    np.testing.assert_array_equal(db.numpy(), want[1])


# -- the kernels on the faked device (test_nn_kernels_emulated.py) ----------------------------------------------

@pytest.fixture
def fake(monkeypatch):
    from tests.test_nn_kernels_emulated import FakeDevice
    return FakeDevice(monkeypatch)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES + [((64, 1, 28, 28), 32, (3, 3), 1, 1, 1), ((8, 3, 32, 32), 16, (3, 3), 2, 1, 1),
                                          ((16, 1, 12, 12), 7, (5, 5), 1, 2, 1)], ids=str)
def test_kernels_match_the_twin(fake, case, layout, dtype):
    x, y, dy, w_nchw, kw = make_case(case, layout, dtype, seed=5)
    ws = w_in(w_nchw, layout)
    dw, db = dnnbind.ops.bias_relu_wgrad(fake.put(x), fake.put(y), fake.put(dy), ws, **kw)
    assert dw.dtype == dtype and db.dtype == dtype and dw.shape == ws and db.shape == (ws[0],)
    assert fake.written_once(dw) and fake.written_once(db)
    check_against_f64(fake.get(dw), fake.get(db), x, y, dy, w_nchw, kw, dtype)
    taps = math.prod(w_nchw[1:])
    names = [name for name, _, _ in fake.launches]
    assert names[0] == KW.wgrad_name(dtype, taps, layout) and names[1:] in ([], [KW.final_name(dtype)])


def test_results_go_into_out_and_the_slices_fill_the_gpu(fake):
    x, y, dy, w_nchw, kw = make_case(((64, 1, 28, 28), 32, (3, 3), 1, 1, 1), "NCHW", F32, seed=7)
    out_dw, out_db = fake.empty(w_nchw, F32), fake.empty((32,), F32)
    dw, db = dnnbind.ops.bias_relu_wgrad(fake.put(x), fake.put(y), fake.put(dy), w_nchw, **kw, out_dw=out_dw,
                                         out_db=out_db)
    assert dw is out_dw and db is out_db
    (name, grid, block), (final, _, _) = fake.launches
    assert name == "dn_wgrad<float, 9, 4, false>" and grid[0] == 8 and grid[0] * grid[1] >= 264
    assert final == "dn_wgrad_final<float>"
    want = R.bias_relu_wgrad(x.astype(F64), y.astype(F64), dy.astype(F64), w_nchw, **kw)
    assert_close(fake.get(dw), want[0], 1e-5, 1e-4, name="dw")
    assert_close(fake.get(db), want[1], 1e-5, 1e-4, name="db")


def test_channels_past_k_in_the_last_group_add_nothing(fake):
    """K = 5 with KB = 4 channels per thread: the second block column has one real channel."""
    x, y, dy, w_nchw, kw = make_case(((3, 1, 9, 9), 5, (3, 3), 1, 1, 1), "NCHW", F32, seed=9)
    dw, db = dnnbind.ops.bias_relu_wgrad(fake.put(x), fake.put(y), fake.put(dy), w_nchw, **kw)
    assert fake.launches[0][1][0] == 2 and fake.written_once(dw) and fake.written_once(db)
    check_against_f64(fake.get(dw), fake.get(db), x, y, dy, w_nchw, kw, F32)
