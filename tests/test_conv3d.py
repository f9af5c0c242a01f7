"""3-D convolution, pooling and deconvolution (5-D data (N, C, D, H, W)), and 1-D convolution and pooling, against
float64 brute force (loops over output positions and taps, written apart from the twins' im2col/tap slicing),
central differences, and fixtures from the real MXNet 1.9.1 (fixtures/mxnet_conv3d/, written by
fixtures/make_mxnet_conv3d.py). The ``gpu``-marked tests compare cuDNN's N-d path with the numpy twin.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dnnbind as d
from dnnbind import autograd, nd
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.gluon.nn import conv_layers as L
from dnnbind.ops import descriptors as D
from dnnbind.ops import reference as R
from dnnbind.ops.reference.conv import conv3d_params
from tests._helpers import assert_close, nd_gradcheck

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_conv3d")


def rnd(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- float64 brute force -------------------------------------------------------------------------------------------

def brute_conv(x, w, b, stride, pad, dilate, groups):
    """(y, and a function dy -> (dx, dw, db)): one output position and one tap at a time."""
    n = x.shape[0]
    k, cg = w.shape[:2]
    kernel = w.shape[2:]
    nd_ = len(kernel)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    out = tuple((xp.shape[2 + i] - dilate[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd_))
    kg = k // groups

    def where(o, t):
        return tuple(o[i] * stride[i] + t[i] * dilate[i] for i in range(nd_))

    y = np.zeros((n, k) + out)
    for o in np.ndindex(*out):
        for f in range(k):
            cs = slice(f // kg * cg, (f // kg + 1) * cg)
            for t in np.ndindex(*kernel):
                y[(slice(None), f) + o] += xp[(slice(None), cs) + where(o, t)] @ w[(f, slice(None)) + t]
    if b is not None:
        y += b.reshape((1, k) + (1,) * nd_)

    def grads(dy):
        dxp, dw = np.zeros_like(xp), np.zeros_like(w)
        for o in np.ndindex(*out):
            for f in range(k):
                cs = slice(f // kg * cg, (f // kg + 1) * cg)
                g = dy[(slice(None), f) + o]
                for t in np.ndindex(*kernel):
                    dxp[(slice(None), cs) + where(o, t)] += np.outer(g, w[(f, slice(None)) + t])
                    dw[(f, slice(None)) + t] += g @ xp[(slice(None), cs) + where(o, t)]
        inner = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pad, x.shape[2:]))
        return dxp[inner], dw, dy.sum(axis=(0,) + tuple(range(2, 2 + nd_)))
    return y, grads


def brute_pool(x, mode, window, stride, pad):
    """cuDNN's three modes ('max', 'avg' counting padding, 'avg_exclude_pad'), 'valid' output size."""
    size = x.shape[2:]
    out = tuple((s + 2 * p - k) // st + 1 for s, p, k, st in zip(size, pad, window, stride))
    y = np.zeros(x.shape[:2] + out)
    for o in np.ndindex(*out):
        lo = [o[i] * stride[i] - pad[i] for i in range(len(out))]
        region = tuple(slice(max(a, 0), min(a + k, s)) for a, k, s in zip(lo, window, size))
        vals = x[(slice(None), slice(None)) + region].reshape(x.shape[:2] + (-1,))
        if mode == "max":
            y[(slice(None), slice(None)) + o] = vals.max(-1)
        else:
            y[(slice(None), slice(None)) + o] = vals.sum(-1) / (np.prod(window) if mode == "avg" else vals.shape[-1])
    return y


CONV3D = [  # x, w, stride, pad, dilate, groups
    ((2, 4, 5, 6, 7), (6, 2, 3, 2, 3), (2, 1, 1), (1, 0, 1), (1, 2, 1), 2),
    ((1, 3, 1, 4, 5), (2, 3, 1, 3, 1), (1, 2, 1), (0, 1, 0), (1, 1, 1), 1),  # depth 1, a 1-wide kernel axis
    ((3, 1, 4, 4, 4), (1, 1, 2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), 1),  # one channel in and out
    ((1, 6, 3, 3, 3), (6, 1, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 6),  # depthwise
    ((2, 2, 6, 3, 4), (4, 2, 2, 1, 2), (1, 3, 1), (0, 0, 0), (2, 1, 3), 1),
]


@pytest.mark.parametrize("xs,ws,stride,pad,dilate,groups", CONV3D)
def test_conv3d_twin_matches_brute_force_forward_and_backward(xs, ws, stride, pad, dilate, groups):
    x, w, b = rnd(xs, 1), rnd(ws, 2), rnd(ws[0], 3)
    want, grads = brute_conv(x, w, b, stride, pad, dilate, groups)
    y = R.conv_forward(x, w, b, stride, pad, dilate, groups)
    assert_close(y, want, 1e-12, 1e-12, name="y")
    dy = rnd(want.shape, 4)
    dx, dw, db = grads(dy)
    assert_close(R.conv_backward_data(w, dy, xs, stride, pad, dilate, groups), dx, 1e-12, 1e-12, name="dx")
    assert_close(R.conv_backward_filter(x, dy, ws, stride, pad, dilate, groups), dw, 1e-12, 1e-12, name="dw")
    assert_close(R.conv_backward_bias(dy), db, 1e-12, 1e-12, name="db")
    # float32 in, float32 out, close to float64
    y32 = R.conv_forward(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), stride, pad, dilate,
                         groups)
    assert y32.dtype == np.float32
    assert_close(y32, want, 1e-4, 1e-4, name="y float32")


@pytest.mark.parametrize("xs,ws,stride,pad,dilate,groups", CONV3D)
def test_nd_convolution_3d_matches_brute_force_with_gradients(xs, ws, stride, pad, dilate, groups):
    x, w, b = rnd(xs, 5), rnd(ws, 6), rnd(ws[0], 7)
    want, grads = brute_conv(x, w, b, stride, pad, dilate, groups)
    arrays = [nd.array(a, dtype="float64") for a in (x, w, b)]
    for a in arrays:
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(*arrays, kernel=ws[2:], num_filter=ws[0], num_group=groups, stride=stride, pad=pad,
                           dilate=dilate)
    dy = rnd(want.shape, 8)
    y.backward(nd.array(dy, dtype="float64"))
    assert_close(y, want, 1e-12, 1e-12, name="y")
    for a, e, name in zip(arrays, grads(dy), ("data", "weight", "bias")):
        assert_close(a.grad, e, 1e-12, 1e-12, name=f"grad of {name}")


def test_nd_convolution_3d_central_differences():
    nd_gradcheck(lambda x, w, b: nd.Convolution(x, w, b, kernel=(2, 2, 2), num_filter=3, stride=(1, 2, 1),
                                                pad=(1, 0, 1), dilate=(1, 1, 2)),
                 [rnd((1, 2, 3, 4, 4), 9), rnd((3, 2, 2, 2, 2), 10), rnd(3, 11)], d.cpu(), rtol=1e-6, atol=1e-7)


def test_nd_convolution_3d_relu_without_bias():
    x, w = rnd((2, 2, 3, 4, 4), 12), rnd((3, 2, 1, 3, 3), 13)
    y = nd.Convolution(nd.array(x, dtype="float64"), nd.array(w, dtype="float64"), kernel=(1, 3, 3), num_filter=3,
                       pad=(0, 1, 1), no_bias=True, act_type="relu")
    assert_close(y, np.maximum(brute_conv(x, w, None, (1, 1, 1), (0, 1, 1), (1, 1, 1), 1)[0], 0), 1e-12, 1e-12)


@pytest.mark.parametrize("xs,ws,stride,pad,dilate,groups", CONV3D)
def test_cudnn_nd_output_shape_matches_ours(xs, ws, stride, pad, dilate, groups):
    y_shape = conv3d_params("t", xs, ws, None, stride, pad, dilate, groups)[4]
    assert D.conv_output_dim_nd(xs, ws, pad, stride, dilate, groups, np.dtype(np.float32)) == y_shape


def test_convolution_3d_refusals_name_the_op_and_shapes():
    x, w = nd.array(rnd((1, 2, 3, 4, 5), 14)), nd.array(rnd((3, 2, 2, 2, 2), 15))
    with pytest.raises(DnnbindValueError, match=r"Convolution.*NCDHW.*NDHWC"):
        nd.Convolution(x, w, kernel=(2, 2, 2), num_filter=3, no_bias=True, layout="NDHWC")
    with pytest.raises(DnnbindValueError, match=r"Convolution.*5-D.*\(1, 2, 3, 4\)"):
        nd.Convolution(nd.array(rnd((1, 2, 3, 4), 16)), w, kernel=(2, 2, 2), num_filter=3, no_bias=True)
    with pytest.raises(DnnbindValueError, match=r"Convolution.*spans"):
        nd.Convolution(x, w, kernel=(2, 2, 2), num_filter=3, no_bias=True, dilate=(3, 1, 1))
    with pytest.raises(DnnbindValueError, match=r"conv_backward_data: dy has shape"):
        R.conv_backward_data(rnd((3, 2, 2, 2, 2), 0), rnd((1, 3, 2, 3, 3), 0), (1, 2, 3, 4, 5))


# -- pooling -------------------------------------------------------------------------------------------------------

POOL3D = [  # x, window, stride, pad
    ((2, 3, 4, 5, 6), (2, 3, 2), (2, 2, 1), (1, 1, 0)),
    ((1, 2, 1, 4, 4), (1, 2, 2), (1, 2, 2), (0, 0, 0)),
    ((1, 2, 5, 3, 4), (3, 3, 3), (1, 2, 1), (1, 1, 1)),
]


@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_pad"])
@pytest.mark.parametrize("xs,window,stride,pad", POOL3D)
def test_pool3d_twin_matches_brute_force_and_its_gradient(mode, xs, window, stride, pad):
    x = rnd(xs, 20)
    want = brute_pool(x, mode, window, stride, pad)
    y = R.pooling_forward(x, mode, window, stride, pad)
    assert_close(y, want, 1e-12, 1e-12, name="y")
    dy = rnd(want.shape, 21)
    dx = R.pooling_backward(y, dy, x, mode, window, stride, pad)
    eps, num = 1e-6, np.zeros_like(x)
    for i in np.ndindex(*xs):  # central differences (max: distinct random values, no tie within eps)
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        num[i] = ((brute_pool(xp, mode, window, stride, pad) - brute_pool(xm, mode, window, stride, pad)) * dy
                  ).sum() / (2 * eps)
    assert_close(dx, num, 1e-6, 1e-7, name="dx")


@pytest.mark.parametrize("mode", ["max", "avg_exclude_pad"])
def test_pool3d_twin_channels_last_equals_channels_first(mode):
    x = rnd((2, 3, 4, 5, 3), 22)  # (N, D, H, W, C)
    first = np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3))
    y = R.pooling_forward(x, mode, (2, 2, 3), (1, 2, 1), (1, 0, 1), layout="NDHWC")
    want = R.pooling_forward(first, mode, (2, 2, 3), (1, 2, 1), (1, 0, 1))
    assert_close(y, want.transpose(0, 2, 3, 4, 1), 0, 0)
    dy = rnd(y.shape, 23)
    dx = R.pooling_backward(y, dy, x, mode, (2, 2, 3), (1, 2, 1), (1, 0, 1), layout="NDHWC")
    dxf = R.pooling_backward(want, np.ascontiguousarray(dy.transpose(0, 4, 1, 2, 3)), first, mode, (2, 2, 3),
                             (1, 2, 1), (1, 0, 1))
    assert_close(dx, dxf.transpose(0, 2, 3, 4, 1), 0, 0)


@pytest.mark.parametrize("params", [
    {"kernel": (2, 2, 3), "stride": (2, 1, 2), "pad": (1, 0, 1), "pool_type": "avg", "pooling_convention": "full"},
    {"kernel": (2, 2, 2), "stride": (2, 2, 2), "pool_type": "avg", "pooling_convention": "full",
     "count_include_pad": False},
    {"kernel": (3, 2, 2), "stride": (2, 2, 1), "pool_type": "sum", "pooling_convention": "full", "pad": (1, 1, 0)},
    {"kernel": (2, 2, 2), "stride": (1, 2, 2), "pool_type": "lp", "p_value": 2},
    {"kernel": (2, 3, 2), "pool_type": "lp", "p_value": 3, "pooling_convention": "full", "stride": (2, 2, 2)},
    {"global_pool": True, "pool_type": "avg"},
])
def test_nd_pooling_3d_central_differences(params):
    x = np.random.default_rng(24).uniform(0.5, 1.5, (1, 2, 3, 4, 5))  # lp: away from the root's slope at 0
    nd_gradcheck(lambda a: nd.Pooling(a, **params), [x], d.cpu(), rtol=1e-6, atol=1e-7)


def test_pooling_3d_refusals():
    x = nd.array(rnd((1, 2, 3, 4, 5), 25))
    with pytest.raises(DnnbindValueError, match=r"Pooling.*NCDHW.*NDHWC"):
        nd.Pooling(x, kernel=(2, 2, 2), layout="NCHW")
    with pytest.raises(DnnbindValueError, match=r"Pooling.*kernel \(2, 2\) has 2 axes"):
        nd.Pooling(x, kernel=(2, 2))
    with pytest.raises(DnnbindValueError, match=r"Pooling: pad .* smaller than kernel"):
        nd.Pooling(x, kernel=(2, 2, 2), pad=(2, 0, 0))


# -- deconvolution -------------------------------------------------------------------------------------------------

def brute_deconv(x, w, b, stride, pad, adj, groups):
    n, c = x.shape[:2]
    fg, kernel = w.shape[1], w.shape[2:]
    cg = c // groups
    full = tuple((i - 1) * s + k + a for i, s, k, a in zip(x.shape[2:], stride, kernel, adj))
    yp = np.zeros((n, fg * groups) + full)
    for i in np.ndindex(*x.shape[2:]):
        for ch in range(c):
            gi = ch // cg
            for t in np.ndindex(*kernel):
                pos = tuple(i[a] * stride[a] + t[a] for a in range(len(i)))
                yp[(slice(None), slice(gi * fg, (gi + 1) * fg)) + pos] += np.outer(x[(slice(None), ch) + i],
                                                                                  w[(ch, slice(None)) + t])
    out = tuple(f - 2 * p for f, p in zip(full, pad))
    y = yp[(slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(pad, out))]
    return y + (0 if b is None else b.reshape((1, -1, 1, 1, 1)))


@pytest.mark.parametrize("xs,ws,stride,pad,adj,groups", [
    ((2, 3, 3, 4, 2), (3, 2, 2, 3, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), 1),
    ((1, 4, 2, 3, 3), (4, 1, 2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 0), 2),
    ((1, 2, 1, 2, 3), (2, 3, 1, 3, 3), (1, 2, 2), (0, 1, 1), (0, 1, 1), 1),
])
def test_deconvolution_3d_matches_brute_force_and_central_differences(xs, ws, stride, pad, adj, groups):
    x, w, b = rnd(xs, 30), rnd(ws, 31), rnd(ws[1] * groups, 32)
    kw = {"kernel": ws[2:], "num_filter": ws[1] * groups, "num_group": groups, "stride": stride, "pad": pad,
          "adj": adj, "no_bias": False}
    y = nd.Deconvolution(nd.array(x, dtype="float64"), nd.array(w, dtype="float64"), nd.array(b, dtype="float64"),
                         **kw)
    assert_close(y, brute_deconv(x, w, b, stride, pad, adj, groups), 1e-12, 1e-12)
    nd_gradcheck(lambda *a: nd.Deconvolution(*a, **kw), [x, w, b], d.cpu(), rtol=1e-6, atol=1e-7)


def test_deconvolution_3d_refuses_dilation_as_mxnet():
    with pytest.raises(DnnbindValueError, match="Dilate is not supported in 3d deconvolution"):
        nd.Deconvolution(nd.array(rnd((1, 2, 2, 2, 2), 33)), nd.array(rnd((2, 1, 2, 2, 2), 34)), kernel=(2, 2, 2),
                         num_filter=1, dilate=(1, 2, 1))


# -- the real MXNet ------------------------------------------------------------------------------------------------

def _fixture_cases(group):
    path = os.path.join(HERE, group + ".npz")
    f = np.load(path)
    for i in range(int(f["count"])):
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(str(f[f"{i}_params"])).items()}
        yield pytest.param(group, i, params, id=f"{group}-{i}")


_OPS = {"conv1d": "Convolution", "conv3d": "Convolution", "pool1d": "Pooling", "pool3d": "Pooling",
        "deconv3d": "Deconvolution"}


@pytest.mark.parametrize("group,i,params", [c for g in _OPS for c in _fixture_cases(g)])
def test_matches_mxnet(group, i, params):
    f = np.load(os.path.join(HERE, group + ".npz"))
    names = [n for n in ("data", "weight", "bias") if f"{i}_{n}" in f.files]
    arrays = {n: nd.array(f[f"{i}_{n}"]) for n in names}
    for a in arrays.values():
        a.attach_grad()
    with autograd.record():
        y = getattr(nd, _OPS[group])(**arrays, **params)
    y = y[0] if isinstance(y, (list, tuple)) else y
    y.backward(nd.array(f[f"{i}_dy"]))
    ref = f[f"{i}_y"]
    assert_close(y, ref, 1e-5, 1e-5 * max(1.0, float(np.abs(ref).max())), name=f"{params} y")
    for n in names:
        ref = f[f"{i}_d_{n}"]
        assert_close(arrays[n].grad, ref, 1e-5, 1e-5 * max(1.0, float(np.abs(ref).max())), name=f"{params} d_{n}")


# -- Gluon ---------------------------------------------------------------------------------------------------------

def test_gluon_3d_layers_shapes_names_and_repr_as_mxnet():
    # the reprs and shapes below are MXNet 1.9.1's (printed by the real mxnet for the same layers and input)
    x = nd.array(np.arange(2 * 3 * 4 * 5 * 6, dtype=np.float32).reshape(2, 3, 4, 5, 6) / 100)
    c = L.Conv3D(4, (2, 3, 2), strides=(1, 2, 1), padding=1, activation="relu")
    c.initialize()
    assert c(x).shape == (2, 4, 5, 3, 7)
    assert c.weight.shape == (4, 3, 2, 3, 2)
    assert sorted(c.collect_params().keys()) == [c.prefix + "bias", c.prefix + "weight"]
    assert repr(c) == "Conv3D(3 -> 4, kernel_size=(2, 3, 2), stride=(1, 2, 1), padding=(1, 1, 1), Activation(relu))"
    t = L.Conv3DTranspose(4, (2, 3, 2), strides=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 0))
    t.initialize()
    assert t(x).shape == (2, 4, 7, 7, 10) and t.weight.shape == (3, 4, 2, 3, 2)
    assert repr(t) == "Conv3DTranspose(4 -> 3, kernel_size=(2, 3, 2), stride=(2, 1, 2), padding=(1, 0, 1))"
    cases = [
        (L.MaxPool3D(), (2, 3, 2, 2, 3), ("MaxPool3D(size=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0), "
                                          "ceil_mode=False, global_pool=False, pool_type=max, layout=NCDHW)")),
        (L.MaxPool3D((2, 2, 3), ceil_mode=True), (2, 3, 2, 3, 2),
         ("MaxPool3D(size=(2, 2, 3), stride=(2, 2, 3), padding=(0, 0, 0), ceil_mode=True, global_pool=False, "
          "pool_type=max, layout=NCDHW)")),
        (L.AvgPool3D(3, strides=2, padding=1, count_include_pad=False), (2, 3, 2, 3, 3),
         ("AvgPool3D(size=(3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1), ceil_mode=False, global_pool=False, "
          "pool_type=avg, layout=NCDHW)")),
        (L.GlobalMaxPool3D(), (2, 3, 1, 1, 1),
         ("GlobalMaxPool3D(size=(1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), ceil_mode=True, global_pool=True, "
          "pool_type=max, layout=NCDHW)")),
        (L.GlobalAvgPool3D(layout="NDHWC"), (2, 1, 1, 1, 6),
         ("GlobalAvgPool3D(size=(1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), ceil_mode=True, global_pool=True, "
          "pool_type=avg, layout=NDHWC)")),
    ]
    xv = x.numpy().astype(np.float64)
    for block, shape, text in cases:
        assert repr(block) == text
        y = block(x)
        assert y.shape == shape
    assert_close(cases[3][0](x).numpy().reshape(2, 3), xv.max(axis=(2, 3, 4)), 0, 0)
    assert_close(cases[4][0](x).numpy().reshape(2, 6), xv.mean(axis=(1, 2, 3)), 1e-6, 1e-6)
    assert_close(cases[0][0](x), R.pooling_forward(xv, "max", (2, 2, 2), (2, 2, 2), 0), 1e-6, 1e-6)


def test_gluon_conv3d_refuses_channels_last():
    with pytest.raises(NotImplementedError, match="NCDHW"):
        L.Conv3D(2, 3, layout="NDHWC")


# -- GPU: cuDNN's N-d path against the twin --------------------------------------------------------------------------

_GPU_TOL = {np.float64: (1e-10, 1e-10), np.float32: (1e-4, 1e-4), np.float16: (2e-2, 2e-2)}


def _gpu_vs_cpu(gpu, fn, arrays, dtype, seed):
    """fn's output and input gradients on the GPU against the same on the cpu twin (float64 there)."""
    rtol, atol = _GPU_TOL[dtype]
    arrays = [a.astype(dtype) for a in arrays]  # the twin gets the very values the GPU does (float16 rounding)
    results = []
    for device, dt in ((gpu, dtype), (d.cpu(), np.float64)):
        xs = [nd.array(a, ctx=device, dtype=dt) for a in arrays]  # nd.array of numpy data is float32 by default
        for x in xs:
            x.attach_grad()
        with d.math_scope("fp32"), autograd.record():  # TF32 off
            y = fn(*xs)
        dy = np.random.default_rng(seed).standard_normal(y.shape).astype(dtype)
        y.backward(nd.array(dy, ctx=device, dtype=dt))
        results.append([y.numpy()] + [x.grad.numpy() for x in xs])
    for i, (got, want) in enumerate(zip(*results)):
        scale = max(1.0, float(np.abs(want).max()))
        assert_close(got, want, rtol, atol * scale, name=f"output {i} ({np.dtype(dtype).name})")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("xs,ws,stride,pad,dilate,groups", CONV3D)
def test_gpu_convolution_3d_matches_twin(gpu, dtype, xs, ws, stride, pad, dilate, groups):
    arrays = [rnd(xs, 40, np.float32), rnd(ws, 41, np.float32), rnd(ws[0], 42, np.float32)]
    _gpu_vs_cpu(gpu, lambda x, w, b: nd.Convolution(x, w, b, kernel=ws[2:], num_filter=ws[0], num_group=groups,
                                                    stride=stride, pad=pad, dilate=dilate), arrays, dtype, 43)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_convolution_3d_relu_and_1d(gpu, dtype):
    arrays = [rnd((2, 3, 3, 4, 5), 44, np.float32), rnd((4, 3, 2, 2, 3), 45, np.float32), rnd(4, 46, np.float32)]
    _gpu_vs_cpu(gpu, lambda x, w, b: nd.Convolution(x, w, b, kernel=(2, 2, 3), num_filter=4, pad=(1, 0, 1),
                                                    act_type="relu"), arrays, dtype, 47)
    arrays = [rnd((2, 4, 11), 48, np.float32), rnd((6, 2, 3), 49, np.float32), rnd(6, 50, np.float32)]
    _gpu_vs_cpu(gpu, lambda x, w, b: nd.Convolution(x, w, b, kernel=(3,), num_filter=6, num_group=2, stride=(2,),
                                                    pad=(1,), dilate=(2,)), arrays, dtype, 51)


_GPU_POOL = [
    {"kernel": (2, 3, 2), "stride": (2, 2, 1), "pad": (1, 1, 0)},
    {"kernel": (2, 3, 2), "stride": (2, 2, 1), "pad": (1, 1, 0), "pool_type": "avg"},
    {"kernel": (2, 3, 2), "stride": (2, 2, 1), "pad": (1, 1, 0), "pool_type": "avg", "count_include_pad": False},
    {"kernel": (2, 2, 3), "stride": (2, 2, 2), "pool_type": "avg", "pooling_convention": "full"},
    {"kernel": (2, 2, 3), "stride": (2, 2, 2), "pooling_convention": "full"},
    {"kernel": (2, 2, 2), "stride": (2, 1, 2), "pool_type": "sum", "pad": (1, 0, 1)},
    {"kernel": (2, 2, 2), "pool_type": "lp", "p_value": 2},
    {"global_pool": True, "pool_type": "avg"},
    {"global_pool": True},
    {"kernel": (2, 2, 3), "stride": (1, 2, 2), "pool_type": "avg", "layout": "NDHWC"},
    {"kernel": (2, 2, 2), "stride": (2, 2, 2), "layout": "NDHWC", "pooling_convention": "full"},
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("params", _GPU_POOL)
def test_gpu_pooling_3d_matches_twin(gpu, dtype, params):
    # distinct values: max pooling's gradient goes to one element on both backends
    x = (np.random.default_rng(52).permutation(2 * 3 * 4 * 5 * 6).reshape(2, 3, 4, 5, 6) / 240.0 + 0.5)
    _gpu_vs_cpu(gpu, lambda a: nd.Pooling(a, **params), [x.astype(np.float32)], dtype, 53)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_pooling_1d_matches_twin(gpu, dtype):
    x = np.random.default_rng(54).permutation(2 * 3 * 9).reshape(2, 3, 9) / 50.0
    for params in ({"kernel": (3,), "stride": (2,), "pad": (1,)},
                   {"kernel": (3,), "stride": (2,), "pool_type": "avg", "pooling_convention": "full"}):
        _gpu_vs_cpu(gpu, lambda a, params=params: nd.Pooling(a, **params), [x.astype(np.float32)], dtype, 55)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_deconvolution_3d_matches_twin(gpu, dtype):
    arrays = [rnd((1, 4, 2, 3, 3), 56, np.float32), rnd((4, 1, 2, 3, 2), 57, np.float32), rnd(2, 58, np.float32)]
    _gpu_vs_cpu(gpu, lambda x, w, b: nd.Deconvolution(x, w, b, kernel=(2, 3, 2), num_filter=2, num_group=2,
                                                      stride=(2, 1, 2), pad=(0, 1, 1), adj=(1, 0, 0), no_bias=False),
                arrays, dtype, 59)


@pytest.mark.gpu
def test_gpu_gluon_conv3d_pool3d_train_step(gpu):
    net_x = rnd((2, 2, 4, 6, 6), 60, np.float32)
    outs = []
    for device in (gpu, d.cpu()):
        conv, pool = L.Conv3D(3, 3, padding=1, in_channels=2), L.AvgPool3D(2)
        conv.initialize(ctx=device)
        conv.weight.set_data(nd.array(rnd((3, 2, 3, 3, 3), 61, np.float32), ctx=device))
        x = nd.array(net_x, ctx=device)
        with d.math_scope("fp32"), autograd.record():
            y = pool(conv(x)).sum()
        y.backward()
        outs.append((y.numpy(), conv.weight.grad().numpy()))
    assert_close(outs[0][0], outs[1][0], 1e-4, 1e-4, name="loss")
    assert_close(outs[0][1], outs[1][1], 1e-4, 1e-3, name="weight grad")
