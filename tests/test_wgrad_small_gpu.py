"""ops.bias_relu_wgrad's NVRTC kernels on the GPU (marker ``gpu``; skipped without one): dw and db of a fused
conv + bias + ReLU with at most 32 filter taps, in one pass over x, y and dy.

Held to the float64 numpy twin at SimpleCNN's conv1, RGB-like first layers (stride 1 and 2), 5x5, dilated, size-1
and odd shapes, NCHW and NHWC, float32 and float16; run twice for bitwise determinism; and through
nd.Convolution(act_type='relu') with data that needs no gradient, against the path it replaces
(ops.bias_relu_backward + cuDNN's backward-filter, ops.defs.convolution.SMALL_WGRAD_KERNEL = False).

Tolerances: float32 sums of float32 products, 1e-5 relative and 1e-5 of the largest sum |dz * x| (|dz| for db)
absolute (the summation order differs from numpy's); float16: the float32 sum rounded to float16, 2e-3 relative (2
half ulps) and 1e-4 of that magnitude absolute. Against the library path: the same, relative to the largest
magnitude of the result (both float32 sums, in different orders); float16 1e-2.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, nd
from dnnbind.ops import bias_relu as ops_bias_relu
from dnnbind.ops import conv as ops_conv
from dnnbind.ops.defs import convolution as conv_def
from dnnbind.ops import reference as R
from tests._helpers import assert_close
from tests.test_nn_kernels import nhwc_shape
from tests.test_wgrad_small import make_case, w_in

pytestmark = pytest.mark.gpu
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def g(a):
    return mx.array(np.ascontiguousarray(a), device=mx.gpu(0))


def reference_and_scale(x, y, dy, ws, kw):
    """The float64 twin's (dw, db) and the magnitudes sum |dz * x| (per dw element) and sum |dz| (per channel)."""
    x64, y64, dy64 = (a.astype(F64) for a in (x, y, dy))
    want_dw, want_db = R.bias_relu_wgrad(x64, y64, dy64, ws, **kw)
    dz = np.abs(np.where(y64 > 0, dy64, 0.0))
    mag_dw = R.conv_backward_filter(np.abs(x64), dz, ws, kw["stride"], kw["padding"], kw["dilation"], 1,
                                    kw["layout"])
    mag_db = dz.sum(axis=(0, 2, 3) if kw["layout"] == "NCHW" else (0, 1, 2))
    return want_dw, want_db, mag_dw.max(), mag_db.max()


SHAPES = [  # x (N, C, H, W), K, (R, S), stride, padding, dilation
    ((64, 1, 28, 28), 32, (3, 3), 1, 1, 1),  # SimpleCNN's conv1
    ((8, 3, 32, 32), 16, (3, 3), 1, 1, 1),  # RGB-like
    ((8, 3, 32, 32), 16, (3, 3), 2, 1, 1),
    ((16, 1, 12, 12), 7, (5, 5), 1, 2, 1),  # 25 taps, K not a multiple of the 4 channels per thread
    ((4, 3, 17, 15), 5, (3, 3), (2, 1), (0, 1), 2),  # odd sizes, dilation 2
    ((1, 1, 1, 1), 1, (3, 3), 1, 1, 1),  # size-1 dims: one position, eight taps in the padding
    ((1, 3, 5, 1), 1, (1, 1), 1, 0, 1),
    ((2, 32, 4, 4), 3, (1, 1), 1, 0, 1),  # 32 taps
    ((256, 1, 28, 28), 64, (3, 3), 1, 1, 1),  # many slices per channel
]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", SHAPES, ids=str)
def test_kernel_matches_float64_and_is_deterministic(case, layout, dtype):
    x, y, dy, w_nchw, kw = make_case(case, layout, dtype, seed=3)
    ws = w_in(w_nchw, layout)
    want_dw, want_db, mag_dw, mag_db = reference_and_scale(x, y, dy, ws, kw)
    gx, gy, gdy = g(x), g(y), g(dy)
    runs = [mx.ops.bias_relu_wgrad(gx, gy, gdy, ws, **kw) for _ in range(2)]
    (dw, db), (dw2, db2) = [(a.numpy(), b.numpy()) for a, b in runs]
    assert dw.dtype == dtype and db.dtype == dtype and dw.shape == ws and db.shape == (ws[0],)
    rtol, k = (2e-3, 1e-4) if dtype == F16 else (1e-5, 1e-5)
    assert_close(dw, want_dw, rtol, k * mag_dw + 1e-7, name="dw")
    assert_close(db, want_db, rtol, k * mag_db + 1e-7, name="db")
    assert dw.tobytes() == dw2.tobytes() and db.tobytes() == db2.tobytes(), "two runs differ"
    out_dw, out_db = mx.empty(ws, dtype, device=mx.gpu(0)), mx.empty((ws[0],), dtype, device=mx.gpu(0))
    got = mx.ops.bias_relu_wgrad(gx, gy, gdy, ws, **kw, out_dw=out_dw, out_db=out_db)
    assert got[0] is out_dw and got[1] is out_db
    assert out_dw.numpy().tobytes() == dw.tobytes() and out_db.numpy().tobytes() == db.tobytes()


def test_nan_rules():
    x, y, dy, w_nchw, kw = make_case(((2, 1, 6, 6), 4, (3, 3), 1, 1, 1), "NCHW", F32, seed=4)
    y[0, 0, 0, :3] = [np.nan, 0.0, -0.0]  # not positive: dy dropped there, even inf
    dy[0, 0, 0, :3] = np.inf
    y[0, 1, 2, 2], dy[0, 1, 2, 2] = 1.0, np.nan  # a NaN dy where y > 0 reaches channel 1's dw and db
    dw, db = (a.numpy() for a in mx.ops.bias_relu_wgrad(g(x), g(y), g(dy), w_nchw, **kw))
    want_dw, want_db = R.bias_relu_wgrad(x, y, dy, w_nchw, **kw)
    np.testing.assert_array_equal(np.isnan(dw), np.isnan(want_dw))
    assert np.isnan(dw[1]).all() and np.isnan(db[1]) and np.isfinite(dw[[0, 2, 3]]).all()
    assert_close(db[[0, 2, 3]], want_db[[0, 2, 3]].astype(F64), 1e-5, 1e-4, name="db")


# -- through nd.Convolution, against the path it replaces ---------------------------------------------------

class _Counted:
    """An op that notes its name in ``calls`` when called (directly or through ``.gpu``, as Convolution's GPU
    lowering calls them)."""

    def __init__(self, name, fn, calls):
        self.name, self.fn, self.calls = name, fn, calls

    def __call__(self, *args, **kwargs):
        self.calls.append(self.name)
        return self.fn(*args, **kwargs)

    def gpu(self, *args, **kwargs):
        self.calls.append(self.name)
        return self.fn.gpu(*args, **kwargs)


# the op each call stands for -> (module, function the lowering calls): the conv gradients through ops.conv's
# *_on entry points (their checks were made when the call was prepared)
WATCHED = {"bias_relu_wgrad": ("bias_relu", "bias_relu_wgrad"), "bias_relu_backward": ("bias_relu", "bias_relu_backward"),
           "conv_backward_data": ("conv", "backward_data_on"), "conv_backward_filter": ("conv", "backward_filter_on")}


def _conv_grads(monkeypatch, x, w, b, dy, kwargs, dtype, data_grad=False):
    """y and the gradients of nd.Convolution(act_type='relu'), and the ops its backward called, in order."""
    xs, ws, bs = (nd.array(a, ctx=mx.gpu(0), dtype=dtype) for a in (x, w, b))
    for a in (ws, bs) + ((xs,) if data_grad else ()):
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(xs, ws, bs, act_type="relu", **kwargs)
    calls = []
    with monkeypatch.context() as m:
        for name, (where, attr) in WATCHED.items():  # in the modules ops/defs/convolution.py calls them from
            module = ops_bias_relu if where == "bias_relu" else ops_conv
            m.setattr(module, attr, _Counted(name, getattr(module, attr), calls))
        y.backward(nd.array(dy, ctx=mx.gpu(0), dtype=dtype))
    return y.numpy(), ws.grad.numpy(), bs.grad.numpy(), (xs.grad.numpy() if data_grad else None), calls


CONV_CASES = [((64, 1, 28, 28), 32, 3, 1, 1), ((8, 3, 32, 32), 16, 3, 1, 1), ((8, 3, 32, 32), 16, 3, 2, 1),
              ((4, 1, 13, 11), 6, 5, 1, 2), ((1, 3, 1, 1), 2, 3, 1, 1)]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_nd_convolution_first_layer_gradients_equal_the_library_path(monkeypatch, case, layout, dtype):
    """Data without a gradient (a network's input): dw and db by one kernel, no dx; the same numbers as
    bias_relu_backward + cuDNN's backward-filter (SMALL_WGRAD_KERNEL off)."""
    mx.set_conv_algo_policy("time", deterministic=True)
    try:
        xs, k, r, stride, pad = case
        rng = np.random.default_rng(11)
        x = rng.standard_normal(nhwc_shape(xs, layout)).astype(dtype)
        w = (rng.standard_normal(nhwc_shape((k, xs[1], r, r), layout)) / r).astype(dtype)
        b = (rng.standard_normal(k) * 0.1).astype(dtype)
        kwargs = dict(kernel=(r, r), stride=(stride, stride), pad=(pad, pad), num_filter=k, layout=layout)
        p = (xs[2] + 2 * pad - r) // stride + 1
        q = (xs[3] + 2 * pad - r) // stride + 1
        dy = rng.standard_normal(nhwc_shape((xs[0], k, p, q), layout)).astype(dtype)
        y1, dw1, db1, _, calls1 = _conv_grads(monkeypatch, x, w, b, dy, kwargs, dtype)
        assert calls1 == ["bias_relu_wgrad"], calls1  # one kernel pass: no dz, no dx, no cuDNN backward-filter
        monkeypatch.setattr(conv_def, "SMALL_WGRAD_KERNEL", False)
        y0, dw0, db0, _, calls0 = _conv_grads(monkeypatch, x, w, b, dy, kwargs, dtype)
        assert calls0 == ["bias_relu_backward", "conv_backward_filter"], calls0
        np.testing.assert_array_equal(y1, y0)
        k_tol = 1e-2 if dtype == F16 else 1e-5
        for name, a, ref in (("dw", dw1, dw0), ("db", db1, db0)):
            ref = ref.astype(F64)
            assert_close(a, ref, k_tol, k_tol * max(1e-3, np.abs(ref).max()), name=name)
    finally:
        mx.set_conv_algo_policy("time", deterministic=False)


def test_data_that_needs_a_gradient_keeps_the_library_path(monkeypatch):
    rng = np.random.default_rng(12)
    x, w, b = rng.standard_normal((4, 1, 10, 10)), rng.standard_normal((8, 1, 3, 3)) / 3, rng.standard_normal(8)
    dy = rng.standard_normal((4, 8, 10, 10))
    kwargs = dict(kernel=(3, 3), pad=(1, 1), num_filter=8)
    y, dw, db, dx, calls = _conv_grads(monkeypatch, x, w, b, dy, kwargs, F32, data_grad=True)
    assert calls == ["bias_relu_backward", "conv_backward_data", "conv_backward_filter"], calls
    x, w = x.astype(F32).astype(F64), w.astype(F32).astype(F64)
    dz = np.where(y > 0, dy.astype(F32), 0.0).astype(F64)  # the GPU's own mask: a z near 0 cannot flip it
    assert_close(dw, R.conv_backward_filter(x, dz, w.shape, padding=1), 1e-4, 1e-4, name="dw")
    assert_close(db, dz.sum(axis=(0, 2, 3)), 1e-4, 1e-4, name="db")
    assert_close(dx, R.conv_backward_data(w, dz, x.shape, padding=1), 1e-4, 1e-4, name="dx")


# -- the forward: dn_small_fwd through ops.conv_bias_relu_forward -----------------------------------------------

FWD_CASES = [  # x shape, w shape, stride, padding, dilation
    ((64, 1, 28, 28), (32, 1, 3, 3), 1, 1, 1),  # SimpleCNN's conv1
    ((8, 3, 32, 32), (16, 3, 3, 3), 1, 1, 1),   # an RGB first layer, 27 taps
    ((8, 3, 32, 32), (16, 3, 3, 3), 2, 0, 1),   # stride 2, no padding
    ((2, 1, 13, 11), (5, 1, 5, 5), 1, 2, 1),    # 5x5, odd sizes
    ((3, 2, 12, 12), (4, 2, 3, 3), 1, 2, 2),    # dilation 2
    ((1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1),      # size 1
]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("case", FWD_CASES, ids=str)
def test_small_filter_forward_matches_float64_and_cudnn(monkeypatch, case, dtype):
    """conv_bias_relu_forward by dn_small_fwd against the float64 reference and against cuDNN's path; a NaN in x
    reaches y (cuDNN's ReLU propagates NaN); bitwise the same twice."""
    from dnnbind.ops import conv as conv_mod
    xs, ws, stride, padding, dilation = case
    rng = np.random.default_rng(17)
    x, w = rng.standard_normal(xs).astype(dtype), (rng.standard_normal(ws) / 3).astype(dtype)
    b = (rng.standard_normal(ws[0]) * 0.3).astype(dtype)
    ref = np.maximum(R.conv_forward(x.astype(F64), w.astype(F64), b.astype(F64), stride, padding, dilation), 0)
    tol = 2e-3 if dtype == F16 else 1e-5
    with mx.trace() as t:
        y1 = mx.ops.conv_bias_relu_forward(g(x), g(w), g(b), stride, padding, dilation).numpy()
    calls = [r.function for r in t.records if r.op == "conv_bias_relu_forward"]
    assert any(f.startswith("dn_small_fwd") for f in calls), calls
    y2 = mx.ops.conv_bias_relu_forward(g(x), g(w), g(b), stride, padding, dilation).numpy()
    assert y1.tobytes() == y2.tobytes()
    assert_close(y1, ref, tol, tol * max(1.0, np.abs(ref).max()), name="y")
    monkeypatch.setattr(conv_mod, "SMALL_FILTER_KERNEL", False)
    y0 = mx.ops.conv_bias_relu_forward(g(x), g(w), g(b), stride, padding, dilation).numpy()
    ctol = 1e-2 if dtype == F16 else 2e-3  # cuDNN may run TF32 (math mode) where the kernel sums in float32
    assert_close(y1, y0.astype(F64), ctol, ctol * max(1.0, np.abs(ref).max()), name="y vs cuDNN")
    monkeypatch.setattr(conv_mod, "SMALL_FILTER_KERNEL", True)
    xn = x.copy()
    xn.reshape(-1)[0] = np.nan
    yn = mx.ops.conv_bias_relu_forward(g(xn), g(w), g(b), stride, padding, dilation).numpy()
    assert np.isnan(yn).any() and not np.isnan(y1).any()
