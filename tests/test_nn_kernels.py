"""CPU tests of ops.bias_relu_backward and of 2x2-style max pooling (window == stride, no padding): the numpy twins
against float64 loops written here, the launch geometry of ops._nn_kernels, the NVRTC compile of its sources (for
sm_90, no GPU needed) and the argument checks. The kernels themselves run in test_nn_kernels_emulated.py (numpy
transcriptions on a faked device) and test_gpu_nn_kernels.py (a real GPU).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnbind
from dnnbind.ops import _nn_kernels as K
from dnnbind.ops import reference as R
from tests._helpers import assert_close

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def rnd(shape, seed, dtype=F32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def relu_out(shape, seed, dtype=F32):
    """A ReLU's output: about half exact zeros, the rest positive."""
    return np.maximum(rnd(shape, seed, dtype), 0)


def to_nchw(a, layout):
    return a if layout == "NCHW" else np.moveaxis(a, 3, 1)


def bias_relu_f64(y, dy, layout):
    """(dz, db) in float64, one channel at a time: dz = dy where y > 0, db = math.fsum of a channel's dz."""
    yc, dyc = to_nchw(y.astype(F64), layout), to_nchw(dy.astype(F64), layout)
    dz = np.zeros_like(dyc)
    db = np.zeros(yc.shape[1])
    for c in range(yc.shape[1]):
        on = yc[:, c] > 0
        dz[:, c][on] = dyc[:, c][on]
        db[c] = math.fsum(dz[:, c].ravel())
    return (dz if layout == "NCHW" else np.moveaxis(dz, 1, 3)), db


def maxpool_f64(x, window, layout):
    """(y, the first maximal tap of each window, or -1 for a window holding a NaN) in float64, window by window."""
    xc = to_nchw(x.astype(F64), layout)
    n, c, h, w = xc.shape
    kh, kw = window
    p, q = h // kh, w // kw
    y, tap = np.zeros((n, c, p, q)), np.zeros((n, c, p, q), int)
    for i, j, a, b in np.ndindex(n, c, p, q):
        win = xc[i, j, a * kh:(a + 1) * kh, b * kw:(b + 1) * kw].ravel()
        nan = np.isnan(win).any()
        y[i, j, a, b] = np.nan if nan else win.max()
        tap[i, j, a, b] = -1 if nan else int(np.flatnonzero(win == win.max())[0])
    return y, tap


def maxpool_backward_f64(x, dy, window, layout):
    xc, dyc = to_nchw(x.astype(F64), layout), to_nchw(dy.astype(F64), layout)
    _, tap = maxpool_f64(x, window, layout)
    kh, kw = window
    dx = np.zeros_like(xc)
    for i, j, a, b in np.ndindex(*tap.shape):
        t = tap[i, j, a, b]
        if t >= 0:
            dx[i, j, a * kh + t // kw, b * kw + t % kw] = dyc[i, j, a, b]
    return dx if layout == "NCHW" else np.moveaxis(dx, 1, 3)


def nhwc_shape(shape, layout):
    return shape if layout == "NCHW" else (shape[0], shape[2], shape[3], shape[1])


# -- bias_relu_backward's numpy twin -----------------------------------------------------------------------------

BIAS_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 32, 28, 28), (3, 1, 4, 4), (4, 5, 1, 1), (2, 64, 7, 7)]


@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=str)
def test_bias_relu_backward_reference_matches_float64(shape, layout, dtype):
    shape = nhwc_shape(shape, layout)
    y, dy = relu_out(shape, 1, dtype), rnd(shape, 2, dtype)
    dz, db = R.bias_relu_backward(y, dy, layout)
    want_dz, want_db = bias_relu_f64(y, dy, layout)
    assert dz.dtype == dtype and db.dtype == dtype and db.shape == (want_db.size,)
    np.testing.assert_array_equal(dz.astype(F64), want_dz)  # dz is dy or 0: exact in every dtype
    k = {F16: 1e-3, F32: 1e-5, F64: 1e-12}[dtype]
    assert_close(db, want_db, k, k * max(1.0, np.abs(dz.astype(F64)).sum(axis=None) / want_db.size), name="db")
    # the same numbers as the ReLU's own backward, then conv_backward_bias
    assert_close(dz, R.activation_backward(y, dy, y, "relu"), 0, 0, name="dz vs activation_backward")


def test_bias_relu_backward_reference_nan_rules():
    y = np.array([np.nan, 0.0, -0.0, 1.0, 2.0, -1.0], F32).reshape(1, 1, 2, 3)
    dy = np.array([5.0, np.nan, 7.0, 8.0, np.nan, np.inf], F32).reshape(1, 1, 2, 3)
    dz, db = R.bias_relu_backward(y, dy)
    # a NaN y is not positive; dy where y <= 0 is dropped even when NaN or inf (routed, not multiplied)
    np.testing.assert_array_equal(dz.ravel(), [0, 0, 0, 8, np.nan, 0])
    assert np.isnan(db[0])


# -- max pooling's numpy twin, window == stride ------------------------------------------------------------------

POOL_CASES = [  # NCHW shape, window
    ((1, 1, 2, 2), (2, 2)), ((2, 3, 7, 9), (2, 2)), ((1, 1, 5, 5), (3, 3)), ((2, 2, 7, 8), (2, 3)),
    ((3, 4, 6, 6), (1, 1)), ((2, 3, 4, 9), (4, 1)), ((1, 2, 28, 28), (2, 2))]


def tied(shape, seed, dtype):
    """Random values on a coarse grid: many ties inside windows, and exact zeros."""
    return (np.round(rnd(shape, seed) * 2) / 2).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_max_pooling_reference_tiles_match_float64(case, layout, dtype):
    shape, window = nhwc_shape(case[0], layout), case[1]
    x = tied(shape, 3, dtype)
    y = R.pooling_forward(x, "max", window, layout=layout)
    want_y, _ = maxpool_f64(x, window, layout)
    np.testing.assert_array_equal(to_nchw(y, layout).astype(F64), want_y)
    dy = rnd(y.shape, 4, dtype)
    dx = R.pooling_backward(y, dy, x, "max", window, layout=layout)
    assert dx.dtype == dtype
    np.testing.assert_array_equal(dx.astype(F64), maxpool_backward_f64(x, dy, window, layout))


def test_max_pooling_reference_nan_rules():
    x = np.array([[1, np.nan, 3, 3], [0, 2, 1, 3]], F32).reshape(1, 1, 2, 4)  # windows [1 nan; 0 2], [3 3; 1 3]
    y = R.pooling_forward(x, "max", 2)
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 0, 1] == 3
    dy = np.array([10.0, np.inf], F32).reshape(1, 1, 1, 2)
    dx = R.pooling_backward(y, dy, x, "max", 2)
    # the NaN window passes nothing; inf goes to the first of the three tied 3s only (no inf * 0 = NaN elsewhere)
    np.testing.assert_array_equal(dx.ravel(), [0, 0, np.inf, 0, 0, 0, 0, 0])


# -- launch geometry ------------------------------------------------------------------------------------------

GEOMETRY_SHAPES = [(64, 32, 28, 28), (64, 64, 14, 14), (256, 64, 48, 48), (8, 64, 48, 48), (1, 1, 1, 1),
                   (1, 1, 3, 5), (2, 1000, 1, 1), (1, 3, 224, 224), (128, 512, 7, 7), (1, 70000, 1, 1)]


@pytest.mark.parametrize("shape", GEOMETRY_SHAPES, ids=str)
def test_channel_geometry_covers_each_channel_once_and_fills_the_gpu(shape):
    n, c, h, w = shape
    for width in (1, 2, 4):
        if (h * w) % width == 0:
            grid, block, hwv, chunk, s = K.nchw_geometry(n, c, h * w, width)
            units = n * hwv
            assert grid == (c, s) and block == (K.BLOCK, 1) and hwv * width == h * w
            assert 1 <= s <= min(K.MAX_SPLITS, 65535) and (s - 1) * chunk < units <= s * chunk  # no empty slice
            if units >= K.TARGET_BLOCKS * K.BLOCK * K.MIN_PACKS:  # enough work: TARGET_BLOCKS blocks, give or
                assert c * s > K.TARGET_BLOCKS - c  # take a column of channels
        if c % width == 0:
            grid, block, chunk, s = K.nhwc_geometry(n * h * w, c, width)
            tx, ty = block
            assert tx * ty == K.BLOCK and tx & (tx - 1) == 0 and tx <= 32
            assert grid[0] * tx >= c // width > (grid[0] - 1) * tx and grid[1] == s
            assert (s - 1) * chunk < n * h * w <= s * chunk
    assert K.final_grid(c) * K.BLOCK >= 32 * c


def test_simplecnn_and_resnet_sizes_get_enough_blocks():
    assert math.prod(K.nchw_geometry(64, 32, 784, 4)[0]) >= 2 * 132  # conv1 of SimpleCNN
    assert math.prod(K.nchw_geometry(64, 64, 196, 4)[0]) >= 2 * 132  # conv2
    assert math.prod(K.nchw_geometry(256, 64, 48 * 48, 4)[0]) >= K.TARGET_BLOCKS  # ResNet-18's first stage


def test_pack_width():
    assert K.pack_width(F32, 784, (256, 512)) == 4 and K.pack_width(F16, 196, (256,)) == 4
    assert K.pack_width(F16, 64, (256,)) == 8 and K.pack_width(F32, 6, (256,)) == 2
    assert K.pack_width(F32, 49, (256,)) == 1
    assert K.pack_width(F32, 784, (256, 260)) == 1  # one pointer 4-byte aligned only: scalar loads
    assert K.pack_width(F32, 784, (256, 264)) == 2


def test_kernel_names():
    assert K.pool_name("fwd", F32, (2, 2), "NCHW") == "dn_maxpool_fwd<float, 2, 2, false>"
    assert K.pool_name("bwd", F16, (3, 3), "NHWC") == "dn_maxpool_bwd<dn_half, 0, 0, true>"  # runtime window
    assert K.chan_name("NHWC", F16, 8, False) == "dn_chan_nhwc<dn_half, 8, false>"
    assert K.chan_name("NCHW", F32, 4, True) in K.CHANNEL_NAMES and K.final_name(F16) in K.CHANNEL_NAMES
    assert len(set(K.CHANNEL_NAMES)) == 2 * (3 + 4) * 2 + 2 and len(set(K.POOL_NAMES)) == 16


@pytest.mark.parametrize("family", ["channel", "pool"])
def test_sources_compile_for_sm_90_without_a_gpu(family):
    """Every instantiation the ops can ask for compiles (NVRTC, no GPU needed), without warnings."""
    from dnnbind.kernels import Module
    src, names = (K.CHANNEL_SOURCE, K.CHANNEL_NAMES) if family == "channel" else (K.POOL_SOURCE, K.POOL_NAMES)
    mod = Module(src, names, arch="sm_90")
    assert mod.code and set(mod.lowered_names) == set(names)
    assert "warning" not in mod.log.lower(), mod.log


# -- argument checks, before any work ------------------------------------------------------------------------

def _fake_gpu(shape, dtype=F32, ptr=1 << 20):
    from dnnbind.runtime.array import NDArray
    return NDArray._from_ptr(ptr, shape, dtype, dnnbind.gpu(0), None)


@pytest.mark.parametrize("args, exc, text", [
    (((2, 3, 4, 4), (2, 3, 4, 5)), ValueError, "shapes differ"),
    (((2, 3, 4), (2, 3, 4)), ValueError, "dy must be 4-D"),
    (((2, 3, 4, 4), (2, 3, 4, 4), F64, F32), TypeError, "dtypes differ"),
    (((2, 3, 4, 4), (2, 3, 4, 4), np.dtype(np.int32), np.dtype(np.int32)), TypeError, "y has dtype int32"),
])
def test_gpu_op_refuses_bad_input_before_any_launch(monkeypatch, args, exc, text):
    """The GPU path (fake device arrays; any allocation or launch would fail the test) checks first."""
    from dnnbind.ops import bias_relu as BR

    def forbidden(*a, **k):
        raise AssertionError("allocated or launched before the checks")

    monkeypatch.setattr(K, "kernel", forbidden)
    monkeypatch.setattr(BR, "out_like", forbidden)
    monkeypatch.setattr(BR, "empty", forbidden)
    ys, dys, *dts = args
    y, dy = _fake_gpu(ys, dts[0] if dts else F32), _fake_gpu(dys, dts[1] if dts else F32)
    with pytest.raises(exc, match=f"^bias_relu_backward: .*{text}"):
        dnnbind.ops.bias_relu_backward(y, dy)
    with pytest.raises(ValueError, match="^bias_relu_backward: unknown layout"):
        dnnbind.ops.bias_relu_backward(_fake_gpu((1, 2, 2, 2)), _fake_gpu((1, 2, 2, 2)), layout="NCWH")
    with pytest.raises(ValueError, match=r"^bias_relu_backward: out has shape \(3,\)"):
        dnnbind.ops.bias_relu_backward(_fake_gpu((1, 2, 2, 2)), _fake_gpu((1, 2, 2, 2)), out=_fake_gpu((3,)))


def test_cpu_ndarrays_take_the_numpy_twin():
    y, dy = relu_out((2, 3, 4, 5), 7), rnd((2, 3, 4, 5), 8)
    dz, db = dnnbind.ops.bias_relu_backward(dnnbind.array(y, device="cpu"), dnnbind.array(dy, device="cpu"))
    want = R.bias_relu_backward(y, dy)
    np.testing.assert_array_equal(dz.numpy(), want[0])
    np.testing.assert_array_equal(db.numpy(), want[1])
