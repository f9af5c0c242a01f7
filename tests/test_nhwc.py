"""Channels-last (NHWC) 2-D convolution, pooling and BatchNorm, MXNet 1.x's way: the cpu (numpy) path.

Every case runs twice, NHWC on (N, H, W, C) data with OHWI weights and NCHW on the transposes, forward and
backward through autograd, and must agree; the NHWC convolution is also held to a direct tap-by-tap sum written
here in NHWC (independent of the im2col reference) and its gradients to central differences. Inputs are random
(never zeros). The GPU twins of these tests are in tests/test_nhwc_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, nd
from dnnbind.gluon import nn
from dnnbind.ops import _check
from dnnbind.ops import reference as R
from dnnbind.ops.defs import batchnorm as DB
from dnnbind.ops.reference import batchnorm as RB
from tests._helpers import assert_close, nd_gradcheck

CPU = mx.cpu()
TOL = {np.float64: (1e-12, 1e-12), np.float32: (2e-5, 2e-5)}

# (x NCHW, w OIHW, stride, pad, dilate, groups)
CONV_CASES = [
    ((2, 3, 7, 9), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),     # odd H/W, padding
    ((1, 4, 9, 7), (5, 4, 3, 2), (2, 2), (0, 0), (1, 1), 1),     # batch 1, stride 2, non-square kernel
    ((3, 6, 8, 8), (6, 2, 3, 3), (1, 1), (1, 1), (1, 1), 3),     # groups 3
    ((2, 3, 11, 10), (4, 3, 3, 3), (2, 1), (1, 2), (2, 2), 1),   # dilation 2, uneven stride and padding
    ((2, 5, 5, 5), (3, 5, 1, 1), (1, 1), (0, 0), (1, 1), 1),     # 1x1
]


def nhwc(a):
    return np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))


def nchw(a):
    return np.ascontiguousarray(np.asarray(a).transpose(0, 3, 1, 2))


def rnd(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def direct_conv_nhwc(x, w, b, stride, pad, dil, groups):
    """The definition, tap by tap, in NHWC: x (N, H, W, C), w (K, R, S, C/groups), float64."""
    n, h, wd, c = x.shape
    k, r, s, cg = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[0]), (pad[1], pad[1]), (0, 0)))
    p = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    y, kg = np.zeros((n, p, q, k)), k // groups
    for g in range(groups):
        for i in range(r):
            for j in range(s):
                patch = xp[:, i * dil[0]:i * dil[0] + stride[0] * (p - 1) + 1:stride[0],
                           j * dil[1]:j * dil[1] + stride[1] * (q - 1) + 1:stride[1], g * cg:(g + 1) * cg]
                y[..., g * kg:(g + 1) * kg] += np.einsum("npqc,kc->npqk", patch, w[g * kg:(g + 1) * kg, i, j])
    return y + b


def conv_autograd(x, w, b, dy, case, layout, dtype, ctx=CPU, act_type=None):
    """nd.Convolution forward and its autograd gradients (y, dx, dw, db) as numpy."""
    _, ws, stride, pad, dil, groups = case
    arrs = [nd.array(a, ctx=ctx, dtype=dtype) for a in (x, w, b)]
    for a in arrs:
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(*arrs, kernel=ws[2:], stride=stride, pad=pad, dilate=dil, num_filter=ws[0],
                           num_group=groups, layout=layout, act_type=act_type)
    y.backward(nd.array(dy, ctx=ctx, dtype=dtype))
    return [y.asnumpy()] + [a.grad.asnumpy() for a in arrs]


# -- convolution ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_nhwc_equals_nchw_and_the_direct_sum(case, dtype):
    xs, ws, stride, pad, dil, groups = case
    x, w, b = rnd(xs, 1, dtype), rnd(ws, 2, dtype), rnd((ws[0],), 3, dtype)
    y_ref = R.conv_forward(x, w, b, stride, pad, dil, groups)
    dy = rnd(y_ref.shape, 4, dtype)
    y, dx, dw, db = conv_autograd(nhwc(x), nhwc(w), b, nhwc(dy), case, "NHWC", dtype)
    assert y.shape == nhwc(y_ref).shape and dw.shape == (ws[0], ws[2], ws[3], ws[1])
    rtol, atol = TOL[dtype]
    direct = direct_conv_nhwc(nhwc(x), nhwc(w), b, stride, pad, dil, groups)
    assert_close(y, direct, rtol, atol * max(1, np.abs(direct).max()), "NHWC y vs the direct sum")
    for got, want, name in zip((y, dx, dw, db), conv_autograd(x, w, b, dy, case, "NCHW", dtype),
                               ("y", "dx", "dw", "db")):
        want = want if name == "db" else nhwc(want)
        assert_close(got, want, rtol, atol * max(1, np.abs(want).max()), f"NHWC {name} vs NCHW")


def test_conv_nhwc_gradients_by_central_differences():
    xs, ws, stride, pad, dil, groups = (2, 7, 5, 4), (4, 3, 2, 2), (2, 1), (1, 0), (1, 2), 2  # NHWC shapes

    def f(x, w, b):
        return nd.Convolution(x, w, b, kernel=(3, 2), stride=stride, pad=pad, dilate=dil, num_filter=4,
                              num_group=groups, layout="NHWC")
    nd_gradcheck(f, [rnd(xs, 5), rnd(ws, 6), rnd((4,), 7)], CPU)


def test_conv_ops_take_numpy_non_contiguous_input_and_fused_relu():
    xs, ws = (2, 3, 6, 5), (4, 3, 3, 3)
    x4, w, b = rnd(xs, 8, np.float32), rnd(ws, 9, np.float32), rnd((4,), 10, np.float32)
    view = x4.transpose(0, 2, 3, 1)  # NHWC, not contiguous; numpy in, numpy out (on the GPU where there is one)
    assert not view.flags.c_contiguous
    y = mx.ops.conv_forward(view, nhwc(w), b, 1, 1, layout="NHWC")
    assert_close(y, nhwc(R.conv_forward(x4, w, b, 1, 1)), 1e-4, 1e-4, "conv_forward NHWC")
    fused = mx.ops.conv_bias_relu_forward(view, nhwc(w), b, 1, 1, layout="NHWC")
    assert_close(fused, np.maximum(y, 0), 1e-4, 1e-4, "conv_bias_relu_forward NHWC")
    case = ((2, 3, 6, 5), ws, (1, 1), (1, 1), (1, 1), 1)
    got = conv_autograd(nhwc(x4), nhwc(w), b, nhwc(rnd((2, 4, 6, 5), 11)), case, "NHWC", np.float32, act_type="relu")
    want = conv_autograd(x4, w, b, rnd((2, 4, 6, 5), 11), case, "NCHW", np.float32, act_type="relu")
    for g, e, name in zip(got, want, ("y", "dx", "dw", "db")):
        assert_close(g, e if name == "db" else nhwc(e), 1e-5, 1e-4, f"relu-fused {name}")
    dy = rnd((2, 6, 5, 4), 12)
    db = mx.ops.conv_backward_bias(nd.array(dy, ctx=CPU, dtype="float64"), layout="NHWC")
    assert_close(db, dy.sum(axis=(0, 1, 2)), 1e-12, 1e-12, "db")


# -- pooling --------------------------------------------------------------------------------------------------

POOL_CASES = [  # x NCHW, nd.Pooling arguments
    ((2, 3, 7, 9), dict(kernel=(3, 3), pool_type="max", stride=(2, 2), pad=(1, 1))),
    ((1, 4, 8, 8), dict(kernel=(2, 2), pool_type="avg")),
    ((2, 3, 7, 7), dict(kernel=(3, 2), pool_type="avg", stride=(2, 1), pad=(1, 1), count_include_pad=False)),
    ((2, 3, 7, 9), dict(kernel=(2, 2), pool_type="max", stride=(2, 2), pooling_convention="full")),
    ((2, 3, 7, 9), dict(kernel=(3, 3), pool_type="avg", stride=(2, 2), pad=(1, 1), pooling_convention="full")),
    ((2, 5, 6, 7), dict(pool_type="max", global_pool=True)),
    ((1, 5, 6, 7), dict(pool_type="avg", global_pool=True)),
]


def pool_autograd(x, dy, kwargs, layout, dtype=np.float64):
    a = nd.array(x, ctx=CPU, dtype=dtype)
    a.attach_grad()
    with autograd.record():
        y = nd.Pooling(a, layout=layout, **kwargs)
    y.backward(nd.array(dy, ctx=CPU, dtype=dtype))
    return y.asnumpy(), a.grad.asnumpy()


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pooling_nhwc_equals_nchw(case):
    xs, kwargs = case
    x = rnd(xs, 20)
    y_nchw = nd.Pooling(nd.array(x, ctx=CPU, dtype="float64"), **kwargs).asnumpy()
    dy = rnd(y_nchw.shape, 21)
    y, dx = pool_autograd(nhwc(x), nhwc(dy), kwargs, "NHWC")
    y_ref, dx_ref = pool_autograd(x, dy, kwargs, "NCHW")
    assert y.shape == nhwc(y_ref).shape
    assert_close(y, nhwc(y_ref), 1e-12, 1e-12, "pooling y")
    assert_close(dx, nhwc(dx_ref), 1e-12, 1e-12, "pooling dx")
    if kwargs.get("global_pool"):
        assert y.shape == (xs[0], 1, 1, xs[1])


def test_pooling_nhwc_gradient_by_central_differences():
    nd_gradcheck(lambda x: nd.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg",
                                      count_include_pad=False, layout="NHWC"), [rnd((2, 5, 6, 3), 22)], CPU)


# -- BatchNorm ------------------------------------------------------------------------------------------------

def bn_run(x, params, dy, axis, **kw):
    """nd.BatchNorm in training (autograd.record) or, with use_global_stats, on the moving statistics."""
    g, b = (nd.array(a, ctx=CPU, dtype="float64") for a in params[:2])
    mm, mv = (nd.array(a, ctx=CPU, dtype="float64") for a in params[2:])
    xa = nd.array(x, ctx=CPU, dtype="float64")
    for a in (xa, g, b):
        a.attach_grad()
    with autograd.record():
        y, mean, inv_std = nd.BatchNorm(xa, g, b, mm, mv, eps=1e-5, fix_gamma=False, axis=axis,
                                        output_mean_var=True, **kw)
    y.backward(nd.array(dy, ctx=CPU, dtype="float64"))
    predict = nd.BatchNorm(xa, g, b, mm, mv, eps=1e-5, fix_gamma=False, axis=axis)
    return [a.asnumpy() for a in (y, mean, inv_std, mm, mv, xa.grad, g.grad, b.grad, predict)]


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (1, 2, 3, 4), (3, 1, 2, 2)])
@pytest.mark.parametrize("axis", [3, -1])
@pytest.mark.parametrize("use_global_stats", [False, True])
def test_batchnorm_axis3_equals_axis1(shape, axis, use_global_stats, monkeypatch):
    x = rnd(shape, 30) * 2 + 1
    params = [np.random.default_rng(31).uniform(0.5, 2, shape[1]), rnd(shape[1], 32), rnd(shape[1], 33),
              np.random.default_rng(34).uniform(0.5, 2, shape[1])]
    dy = rnd(shape, 35)
    layouts = []
    real = DB.batchnorm_forward_training  # the numpy twin, as BatchNorm's cpu lowering calls it

    def spy(*args, **kwargs):
        layouts.append(kwargs["layout"])
        return real(*args, **kwargs)
    monkeypatch.setattr(DB, "batchnorm_forward_training", spy)
    got = bn_run(nhwc(x), params, nhwc(dy), axis, use_global_stats=use_global_stats)
    want = bn_run(x, params, dy, 1, use_global_stats=use_global_stats)
    names = ("y", "mean", "inv_std", "moving_mean", "moving_var", "dx", "dgamma", "dbeta", "predict")
    for g, e, name in zip(got, want, names):
        e = nhwc(e) if name in ("y", "dx", "predict") else e
        assert_close(g, e, 1e-10, 1e-10, f"BatchNorm axis={axis} {name}")
    assert layouts == ([] if use_global_stats else ["NHWC", "NCHW"])  # channels last went to the op as NHWC


def test_batchnorm_nhwc_ops_and_gradient_by_central_differences():
    x, dy = rnd((3, 4, 5, 2), 40), rnd((3, 4, 5, 2), 41)
    gamma, beta = np.array([0.7, 1.3]), np.array([0.1, -0.2])
    rm, rv, rm1, rv1 = np.zeros(2), np.ones(2), np.zeros(2), np.ones(2)
    y, sm, si = RB.batchnorm_forward_training(x, gamma, beta, rm, rv, 0.9, 1e-5, layout="NHWC")
    y1, sm1, si1 = RB.batchnorm_forward_training(nchw(x), gamma, beta, rm1, rv1, 0.9, 1e-5)
    assert_close(y, nhwc(y1), 1e-12, 1e-12, "y")
    assert_close(rv, rv1, 1e-12, 1e-12, "running_var")
    assert_close(sm, x.mean(axis=(0, 1, 2)), 1e-12, 1e-12, "save_mean over N, H, W")
    dx, dg, db = RB.batchnorm_backward(x, dy, gamma, sm, si, 1e-5, layout="NHWC")
    assert_close(db, dy.sum(axis=(0, 1, 2)), 1e-12, 1e-12, "dbeta")
    g, b = nd.array(gamma, ctx=CPU, dtype="float64"), nd.array(beta, ctx=CPU, dtype="float64")
    mm, mv = nd.zeros((2,), ctx=CPU, dtype="float64"), nd.ones((2,), ctx=CPU, dtype="float64")

    def f(v):
        with autograd.train_mode():  # batch statistics for the central differences too
            return nd.BatchNorm(v, g, b, mm, mv, fix_gamma=False, axis=3)
    nd_gradcheck(f, [x], CPU)


# -- Gluon ----------------------------------------------------------------------------------------------------

def test_conv2d_nhwc_weight_is_ohwi_and_deferred():
    conv = nn.Conv2D(6, (3, 2), layout="NHWC", groups=2)
    conv.initialize(ctx=CPU)
    y = conv(nd.array(rnd((2, 7, 5, 4), 50), ctx=CPU, dtype="float32"))
    assert conv.weight.shape == (6, 3, 2, 2) and y.shape == (2, 5, 4, 6)
    assert nn.Conv2D(8, 3, in_channels=4, layout="NHWC").weight.shape == (8, 3, 3, 4)
    assert repr(nn.Conv2D(8, 3, in_channels=4, layout="NHWC")).startswith("Conv2D(4 -> 8, kernel_size=(3, 3)")
    assert nn.MaxPool2D(layout="NHWC")(nd.ones((1, 4, 6, 3))).shape == (1, 2, 3, 3)
    assert nn.GlobalAvgPool2D(layout="NHWC")(nd.ones((2, 4, 6, 3))).shape == (2, 1, 1, 3)
    assert "layout=NHWC" in repr(nn.AvgPool2D(layout="NHWC"))


def nhwc_net(layout, seed=0):
    axis = 3 if layout == "NHWC" else 1
    net = nn.Sequential()
    net.add(nn.Conv2D(6, 3, padding=1, layout=layout, activation="relu"), nn.BatchNorm(axis=axis),
            nn.Activation("relu"), nn.Conv2D(8, 3, strides=2, layout=layout, groups=2), nn.BatchNorm(axis=axis),
            nn.MaxPool2D(2, layout=layout), nn.GlobalAvgPool2D(layout=layout), nn.Dense(5))
    nd.random.seed(seed)
    net.initialize(mx.init.Xavier(), ctx=CPU)
    return net


def copy_weights(src, dst):
    """src NHWC net -> dst NCHW twin: conv weights OHWI -> OIHW, everything else as is."""
    for p, q in zip(src.collect_params().values(), dst.collect_params().values()):
        v = p.data().asnumpy()
        q.set_data(nd.array(nchw(v) if v.ndim == 4 else v, ctx=CPU))


def test_gluon_nhwc_net_equals_its_nchw_twin():
    x = rnd((3, 4, 9, 11), 60, np.float32)
    a, b = nhwc_net("NHWC"), nhwc_net("NCHW", seed=1)
    a(nd.array(nhwc(x), ctx=CPU))
    b(nd.array(x, ctx=CPU))
    copy_weights(a, b)
    outs = []
    for net, data in ((a, nhwc(x)), (b, x)):
        with autograd.record():
            y = net(nd.array(data, ctx=CPU))
        y.backward(nd.array(rnd(y.shape, 61, np.float32), ctx=CPU))
        outs.append((y.asnumpy(), net(nd.array(data, ctx=CPU)).asnumpy(), list(net.collect_params().values())))
    (ya, pa, params_a), (yb, pb, params_b) = outs
    assert_close(ya, yb, 1e-5, 1e-5, "training-mode output")
    assert_close(pa, pb, 1e-5, 1e-5, "predict-mode output (running statistics)")
    for p, q in zip(params_a, params_b):
        assert p.shape == (q.shape if len(q.shape) != 4 else nhwc(np.empty(q.shape)).shape), p.name
        got = p.data().asnumpy() if p.grad_req == "null" else p.grad().asnumpy()
        want = q.data().asnumpy() if q.grad_req == "null" else q.grad().asnumpy()
        assert_close(got, nhwc(want) if want.ndim == 4 else want, 1e-4, 1e-5, p.name)


# -- errors and caches ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,exc,fragments", [
    (lambda: mx.ops.conv_forward(rnd((1, 5, 5, 3), 0), rnd((4, 3, 3, 3), 1), layout="NWHC"), ValueError,
     ["conv_forward: unknown layout 'NWHC'", "'NCHW' or 'NHWC'"]),
    (lambda: mx.ops.conv_forward(rnd((1, 5, 5, 3), 0), rnd((4, 3, 3, 3), 1), layout=3), TypeError,
     ["conv_forward: layout must be a string"]),
    (lambda: mx.ops.conv_forward(rnd((1, 5, 5, 3), 0), rnd((4, 3, 5, 5), 1), layout="NHWC"), ValueError,
     ["conv_forward: x has 3 channels but w expects 5", "x (1, 5, 5, 3), w (4, 3, 5, 5)", "w is (K, R, S, C/groups)"]),
    (lambda: mx.ops.conv_forward(rnd((1, 5, 5, 3), 0), rnd((4, 3, 3), 1), layout="NHWC"), ValueError,
     ["conv_forward: w must be 4-D (K, R, S, C/groups) (layout NHWC), got shape (4, 3, 3)"]),
    (lambda: mx.ops.conv_forward(rnd((1, 5, 5, 3), 0), rnd((4, 3, 3, 3), 1), rnd((3,), 2), layout="NHWC"),
     ValueError, ["conv_forward: b has shape (3,) but w has 4 output channels"]),
    (lambda: mx.ops.conv_backward_data(rnd((4, 3, 3, 3), 1), rnd((1, 3, 3, 3), 2), (1, 5, 5, 3), layout="NHWC"),
     ValueError, ["conv_backward_data: dy has shape (1, 3, 3, 3) but the convolution gives (1, 3, 3, 4)",
                  "layout NHWC"]),
    (lambda: mx.ops.pooling_forward(rnd((1, 2, 2, 3), 0), "max", 3, layout="NHWC"), ValueError,
     ["pooling_forward: window (3, 3) is larger than the padded input (2, 2)", "x (1, 2, 2, 3)"]),
    (lambda: mx.ops.pooling_forward(rnd((1, 4, 4, 3), 0), layout="nhwc"), ValueError,
     ["pooling_forward: unknown layout 'nhwc'"]),
    (lambda: RB.batchnorm_forward_inference(rnd((2, 3, 4), 0), *np.ones((4, 4)), layout="NHWC"), ValueError,
     ["batchnorm_forward_inference: layout NHWC needs 4-D x (N, H, W, C), got shape (2, 3, 4)"]),
    (lambda: RB.batchnorm_forward_inference(rnd((2, 3, 4, 5), 0), *np.ones((4, 3)), layout="NHWC"), ValueError,
     ["gamma has shape (3,) but x of shape (2, 3, 4, 5) has 5 channels (axis 3)"]),
    (lambda: nd.Convolution(nd.ones((1, 5, 5, 3)), nd.ones((4, 3, 3, 3)), nd.ones((4,)), kernel=(3, 3),
                            num_filter=4, layout="NHCW"), ValueError, ["Invalid Input: 'NHCW', valid values are", "in operator Convolution"]),
    (lambda: nd.Pooling(nd.ones((1, 5, 5, 3)), kernel=(2, 2), layout="NCWH"), ValueError,  # MXNet's parser
     ["Invalid Input: 'NCWH', valid values are: {None, 'NCDHW', 'NCHW', 'NCW', 'NDHWC', 'NHWC', 'NWC'}", "Pooling"]),
    (lambda: nd.Pooling(nd.ones((1, 5, 5, 3)), kernel=(2, 2), layout="NCW"), ValueError,
     ["Pooling: layout must be 'NCHW' or 'NHWC'", "(1, 5, 5, 3)"]),
    (lambda: nd.Pooling(nd.ones((1, 5, 3)), kernel=(2,), layout="NWC"), ValueError, ["Pooling: layout must be 'NCW'"]),
    (lambda: nn.Conv2D(4, 3, layout="NCWH"), ValueError, ["Conv2D: layout must be 'NCHW' or 'NHWC', got 'NCWH'"]),
    (lambda: nn.MaxPool2D(layout=("N", "H")), TypeError, ["MaxPool2D: layout must be 'NCHW' or 'NHWC'"]),
    (lambda: nn.Conv2DTranspose(4, 3, layout="NHWC"), NotImplementedError, ["layout='NCHW'"]),
    (lambda: nn.Conv1D(4, 3, layout="NWC"), NotImplementedError, ["layout='NCW'"]),
])
def test_errors_name_the_op_the_argument_and_the_shapes(call, exc, fragments):
    with pytest.raises(exc) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_gluon_conv_nhwc_channel_mismatch_is_clear():
    conv = nn.Conv2D(4, 3, in_channels=3, layout="NHWC")
    conv.initialize(ctx=CPU)
    with pytest.raises(ValueError, match=r"data has 5 channels but weight \(4, 3, 3, 3\) expects 3.*layout NHWC"):
        conv(nd.ones((1, 6, 6, 5), ctx=CPU))


@pytest.fixture
def cudnn_host():
    from dnnbind._lib.errors import DnnbindError
    from dnnbind.ops import descriptors as D
    try:
        D.TensorDesc((1, 1, 1, 1), np.float32)
    except DnnbindError as exc:
        pytest.skip(f"cuDNN does not load here: {exc}")


def test_conv_plan_keys_and_descriptors_keep_the_layouts_apart(cudnn_host):
    """Host-side (no GPU): the same shape tuples in both layouts get distinct plans, keys and NHWC descriptors,
    and cuDNN's own output dims for the NHWC descriptors are _check's."""
    import ctypes
    from dnnbind.ops import conv, descriptors as D
    f32 = np.dtype(np.float32)
    xs, ws = (2, 8, 8, 8), (8, 3, 3, 8)
    a = conv._setup("conv_forward", xs, ws, (2, 2), (1, 1), (1, 1), 1, f32, layout="NHWC")
    b = conv._setup("conv_forward", xs, (8, 8, 3, 3), (2, 2), (1, 1), (1, 1), 1, f32)
    assert a.key[-1] == "NHWC" and b.key[-1] == "NCHW" and a.key[:2] == (xs, ws)
    assert a.y_shape == (2, 4, 4, 8) and a.xd is D.tensor_nhwc(xs, f32) and a.wd is D.filt_nhwc(ws, f32)
    assert a.bd is D.tensor_nhwc((1, 1, 1, 8), f32) and a.params[-1] == "NHWC"
    assert conv._setup("conv_forward", xs, ws, (2, 2), (1, 1), (1, 1), 1, f32, layout="NHWC") is a  # cached
    dims = [ctypes.c_int() for _ in range(4)]
    D.L.cudnnGetConvolution2dForwardOutputDim(a.cdesc, a.xd, a.wd, *(ctypes.byref(v) for v in dims))
    assert _check.from_nchw(tuple(v.value for v in dims), "NHWC") == a.y_shape


def test_backend_graph_of_an_nhwc_conv_has_channels_last_strides(monkeypatch, cudnn_host):
    """The fused conv+bias+ReLU graph built for NHWC shapes: every tensor's dims are N, C, H, W with the strides
    (H*W*C, 1, W*C, C); cuDNN accepts each SetAttribute (finalize is skipped: it needs a GPU)."""
    from dnnbind._lib import cudnn as C
    from dnnbind.ops import conv_backend as cb
    monkeypatch.setattr(C.lib, "cudnnBackendFinalize", lambda d: 0)
    tensors, real = [], C.lib.cudnnBackendSetAttribute

    def spy(d, name, atype, n, values):
        if d.kind == C.CUDNN_BACKEND_TENSOR_DESCRIPTOR and name in (C.CUDNN_ATTR_TENSOR_DIMENSIONS,
                                                                     C.CUDNN_ATTR_TENSOR_STRIDES):
            tensors.append((name, list(values[:n])))
        return real(d, name, atype, n, values)

    monkeypatch.setattr(C.lib, "cudnnBackendSetAttribute", spy)
    conv = cb._conv((2, 2), (1, 1), (1, 1), C.CUDNN_DATA_FLOAT)
    cb._graph_ops("fwd_bias_relu", (8, 10, 10, 3), (5, 3, 3, 3), (8, 5, 5, 5), conv, np.dtype(np.float32), 4,
                  "NHWC")
    dims = [v for k, v in tensors if k == C.CUDNN_ATTR_TENSOR_DIMENSIONS]
    strides = [v for k, v in tensors if k == C.CUDNN_ATTR_TENSOR_STRIDES]
    assert dims == [[8, 3, 10, 10], [5, 3, 3, 3], [8, 5, 5, 5], [1, 5, 1, 1], [8, 5, 5, 5], [8, 5, 5, 5]]
    assert strides == [[300, 1, 30, 3], [27, 1, 9, 3], [125, 1, 25, 5], [5, 1, 5, 5], [125, 1, 25, 5],
                       [125, 1, 25, 5]]
    assert cb._packed_strides((8, 3, 10, 10)) == [300, 100, 10, 1]
    with pytest.raises(ValueError, match="conv_backend.candidates: unknown layout 'CHWN'"):
        cb.candidates(0, "fwd", (8, 10, 10, 3), (5, 3, 3, 3), (8, 5, 5, 5), 2, 1, layout="CHWN")
