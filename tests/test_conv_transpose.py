"""Transposed convolution with MXNet 1.x semantics: ``nd.Deconvolution``, ``ops.deconv_*`` and the Gluon layers
``Conv1DTranspose``/``Conv2DTranspose``.

The oracle is written here, from MXNet's definition, not from dnnbind's code: a direct loop that scatters each
input pixel through the kernel into a padded output (float64), and the adjoint identity
<deconv(x, w), z> == <x, conv(z, w)> against a direct-loop convolution with the same weight. Gradients are
checked by central differences. The ``MXNET_*`` fixtures are outputs of MXNet 1.9.1 itself (CPU wheel, Python 3.8)
from inputs ``np.random.RandomState(seed).uniform(-2, 2, shape).astype(float32)``.
GPU tests (marker ``gpu``) compare the GPU forward and all three gradients with the CPU twin at the same shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_close, nd_gradcheck

import dnnbind
from dnnbind import autograd, nd
from dnnbind._lib import cudnn
from dnnbind.gluon import nn
from dnnbind.ops import reference as R

CPU = dnnbind.cpu()


def _rand(seed, shape):
    return np.random.RandomState(seed).uniform(-2, 2, shape).astype(np.float32)


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


# -- the independent references (float64, direct loops) ----------------------------------------------------------

def loop_deconv(x, w, b, stride, pad, dilate, groups, adj):
    """y_full[n, f, i*sh + r*dh, j*sw + s*dw] += x[n, c, i, j] * w[c, f_local, r, s]; y = y_full[pad:pad+out]."""
    (sh, sw), (ph, pw), (dh, dw), (ah, aw) = map(_pair, (stride, pad, dilate, adj))
    n, c, h, wd = x.shape
    _, fg, kh, kw = w.shape
    cg = c // groups
    oh, ow = (h - 1) * sh - 2 * ph + dh * (kh - 1) + 1 + ah, (wd - 1) * sw - 2 * pw + dw * (kw - 1) + 1 + aw
    full = np.zeros((n, fg * groups, oh + 2 * ph, ow + 2 * pw))  # adj past the full extent stays 0
    for ci in range(c):
        g = ci // cg
        for i, j, r, s in np.ndindex(h, wd, kh, kw):  # every input pixel through every tap, for all n and f
            full[:, g * fg:(g + 1) * fg, i * sh + r * dh, j * sw + s * dw] += x[:, ci, i, j, None] * w[ci, :, r, s]
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y if b is None else y + np.asarray(b).reshape(1, -1, 1, 1)


def loop_conv(z, w, stride, pad, dilate, groups, out_hw):
    """The convolution from F to C channels whose filter is w (C, F/groups, R, S): x-shaped output."""
    (sh, sw), (ph, pw), (dh, dw) = map(_pair, (stride, pad, dilate))
    n, f, zh, zw = z.shape
    c, fg, kh, kw = w.shape
    cg = c // groups
    zp = np.pad(z, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, c) + out_hw)
    for ci in range(c):
        g = ci // cg
        for i, j, r, s in np.ndindex(out_hw[0], out_hw[1], kh, kw):
            out[:, ci, i, j] += zp[:, g * fg:(g + 1) * fg, i * sh + r * dh, j * sw + s * dw] @ w[ci, :, r, s]
    return out


# x shape, w shape (C, F/groups, kh, kw), stride, pad, dilate, groups, adj
CASES = [
    ((2, 3, 4, 5), (3, 2, 3, 3), 1, 0, 1, 1, 0),
    ((1, 2, 5, 5), (2, 3, 4, 4), 2, 1, 1, 1, 0),                      # upsampling x2, batch 1
    ((2, 4, 3, 4), (4, 1, 3, 2), (2, 3), (1, 0), (1, 2), 2, (1, 2)),  # non-square everything, groups 2
    ((1, 6, 4, 3), (6, 2, 2, 3), (3, 2), (0, 1), 1, 3, (2, 1)),       # groups 3, adj on both axes
    ((3, 2, 2, 2), (2, 4, 1, 1), 2, 0, 1, 1, 1),                      # 1x1 kernel, stride 2, adj 1
    ((1, 1, 3, 1), (1, 1, 3, 1), 1, (1, 0), 2, 1, 0),                 # dilation 2 with padding, width 1
]
IDS = [str(i) for i in range(len(CASES))]


def _case_arrays(case, seed=0):
    xs, ws = case[:2]
    f = ws[1] * case[5]
    return _rand(seed, xs).astype(np.float64), _rand(seed + 1, ws).astype(np.float64), _rand(seed + 2, (f,))


def _out_shape(case):
    xs, ws, stride, pad, dilate, groups, adj = case
    (sh, sw), (ph, pw), (dh, dw), (ah, aw) = map(_pair, (stride, pad, dilate, adj))
    return (xs[0], ws[1] * groups, (xs[2] - 1) * sh - 2 * ph + dh * (ws[2] - 1) + 1 + ah,
            (xs[3] - 1) * sw - 2 * pw + dw * (ws[3] - 1) + 1 + aw)


def _deconv(x, w, b, case):
    xs, ws, stride, pad, dilate, groups, adj = case
    return nd.Deconvolution(x, w, b, kernel=ws[2:], stride=_pair(stride), pad=_pair(pad), dilate=_pair(dilate),
                            adj=_pair(adj), num_filter=ws[1] * groups, num_group=groups, no_bias=b is None)


# -- CPU forward --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cpu_forward_matches_direct_loop(case):
    x, w, b = _case_arrays(case)
    z = np.random.RandomState(9).standard_normal(_out_shape(case))
    lhs = np.sum(loop_deconv(x, w, None, *case[2:]) * z)  # the oracle itself: the transpose of conv with the same w
    assert abs(lhs - np.sum(x * loop_conv(z, w, *case[2:6], case[0][2:]))) <= 1e-9 * max(1.0, abs(lhs))
    expected = loop_deconv(x, w, b, *case[2:])
    assert expected.shape == _out_shape(case)
    y = _deconv(nd.array(x, ctx=CPU, dtype="float64"), nd.array(w, ctx=CPU, dtype="float64"),
                nd.array(b, ctx=CPU, dtype="float64"), case)
    assert y.shape == expected.shape and y.dtype == np.float64
    assert_close(y, expected, 1e-12, 1e-12, name="Deconvolution float64")
    y32 = R.deconv_forward(x.astype(np.float32), w.astype(np.float32), b, *case[2:])  # numpy twin, float32
    assert y32.dtype == np.float32
    assert_close(y32, expected, 1e-5, 1e-5, name="deconv_forward float32")
    lhs = np.sum(R.deconv_forward(x, w, None, *case[2:]) * z)  # adjoint identity on the twin itself
    assert abs(lhs - np.sum(x * R.deconv_backward_data(w, z, x.shape, *case[2:6]))) <= 1e-9 * max(1, abs(lhs))
    with CPU:  # numpy in, numpy out (computed on the default device)
        y = dnnbind.deconv_forward(x, w, b.astype(np.float64), *case[2:])
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert_close(y, expected, 1e-12, 1e-12, name="dnnbind.deconv_forward numpy")


@pytest.mark.parametrize("case", CASES[1:4], ids=IDS[1:4])
def test_gpu_lowering_roles_with_conv_twins_in_place_of_cudnn(case, monkeypatch):
    """The GPU functions' plumbing on the cpu: conv's bare GPU implementations (``.impl``: cudnnConvolutionBackwardData
    / Forward / BackwardFilter) replaced by their numpy twins, so the roles handed to them (x as dy, y as dx, ...) are
    checked."""
    from dnnbind.ops import conv, deconv
    calls = []

    def twin(name):
        def run(*args, out=None):
            calls.append(name)
            return dnnbind.NDArray._from_numpy(getattr(R, name)(*(getattr(a, "_data", a) for a in args)))
        return run

    for name in ("conv_backward_data", "conv_forward", "conv_backward_filter"):
        monkeypatch.setattr(getattr(conv, name), "impl", twin(name))  # what deconv.py calls
    x, w, _ = _case_arrays(case)
    z = np.random.RandomState(9).standard_normal(_out_shape(case))
    xa, wa, za = (nd.array(a, dtype="float64") for a in (x, w, z))
    assert_close(deconv.deconv_forward.gpu(xa, wa, None, *case[2:]), loop_deconv(x, w, None, *case[2:]), 1e-12, 1e-12)
    assert_close(deconv.deconv_backward_data.gpu(wa, za, x.shape, *case[2:6]), loop_conv(z, w, *case[2:6], x.shape[2:]),
                 1e-12, 1e-12)
    assert_close(deconv.deconv_backward_filter.gpu(xa, za, w.shape, *case[2:6]),
                 R.deconv_backward_filter(x, z, w.shape, *case[2:6]), 1e-12, 1e-12)
    assert calls == ["conv_backward_data", "conv_forward", "conv_backward_filter"]


def test_one_dimensional_goes_through_the_two_dimensional_path():
    x, w, b = _rand(0, (2, 3, 5)).astype(np.float64), _rand(1, (3, 2, 3)).astype(np.float64), _rand(2, (2,))
    y = nd.Deconvolution(nd.array(x, dtype="float64"), nd.array(w, dtype="float64"), nd.array(b, dtype="float64"),
                         kernel=(3,), stride=(2,), pad=(1,), adj=(1,), dilate=(2,), num_filter=2, no_bias=False)
    expected = loop_deconv(x[:, :, None], w[:, :, None], b, (1, 2), (0, 1), (1, 2), 1, (0, 1))[:, :, 0]
    assert y.shape == (2, 2, (5 - 1) * 2 - 2 + 2 * 2 + 1 + 1)
    assert_close(y, expected, 1e-12, 1e-12, name="1-D Deconvolution")
    nd_gradcheck(lambda xa, wa, ba: nd.Deconvolution(xa, wa, ba, kernel=3, stride=2, pad=1, adj=1, num_filter=2,
                                                     no_bias=False), [x[:, :, :4], w, b], CPU)


def test_target_shape_infers_pad_and_adj_like_mxnet():
    x, w = _rand(0, (1, 2, 5, 4)), _rand(1, (2, 3, 3, 3))
    y = nd.Deconvolution(nd.array(x), nd.array(w), kernel=(3, 3), stride=(2, 2), target_shape=(10, 8), num_filter=3)
    # full size (11, 9): one too many on each axis -> pad ceil(1/2) = 1, adj 1 % 2 = 1
    assert y.shape == (1, 3, 10, 8)
    assert_close(y, loop_deconv(x, w, None, 2, 1, 1, 1, 1), 1e-5, 1e-5)
    assert nd.Deconvolution(nd.array(x), nd.array(w), kernel=(3, 3), stride=(2, 2), target_shape=(0, 0),
                            num_filter=3).shape[2:] == (11, 9)


# -- gradients (central differences, float64 on the cpu) ---------------------------------------------------------

@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3], CASES[5]], ids=["stride2", "groups2", "groups3",
                                                                                 "dilate"])
def test_gradients_by_central_differences(case):
    x, w, b = _case_arrays(case, seed=4)
    nd_gradcheck(lambda xa, wa, ba: _deconv(xa, wa, ba, case), [x, w, b.astype(np.float64)], CPU)
    nd_gradcheck(lambda xa, wa: _deconv(xa, wa, None, case), [x, w], CPU)


# -- MXNet 1.9.1's own numbers ---------------------------------------------------------------------------------
# x = u(0, (1, 4, 2, 2)), w = u(1, (4, 1, 3, 2)), b = u(2, (2,)), head gradient u(3, (1, 2, 4, 6)):
#   nd.Deconvolution(x, w, b, kernel=(3, 2), stride=(2, 2), pad=(1, 0), adj=(1, 1), dilate=(1, 2), num_filter=2,
#                    num_group=2, no_bias=False), then y.backward(head). The default (MKLDNN) build; MXNet's own
#   non-MKLDNN CPU kernel (MXNET_MKLDNN_ENABLED=0) gives other forward values whenever dilate > 1, values that are
#   not the adjoint of its own backward (the same dx and dw as here); cuDNN's (and this) forward is.
MXNET_Y = [-0.5203382, -0.2560204, -2.4199147, -0.2560204, -0.8459852, -0.2560204, -0.25633556, -0.2560204,
           -3.7152565, -0.2560204, -2.0371122, -0.2560204, -0.9748509, -0.2560204, -1.6258733, -0.2560204,
           -0.1546539, -0.2560204, -0.75613654, -0.2560204, -1.8714582, -0.2560204, 0.6122494, -0.2560204,
           -5.074995, -1.8962951, 2.8074641, -1.8962951, 0.9744427, -1.8962951, -1.6242279, -1.8962951, 3.7081103,
           -1.8962951, 1.4730134, -1.8962951, -6.166398, -1.8962951, -6.5196934, -1.8962951, -4.9107885,
           -1.8962951, -1.0017345, -1.8962951, -1.7480704, -1.8962951, -3.1396317, -1.8962951]
MXNET_DX = [5.2967596, 6.0311003, -0.061732378, 0.64588416, -1.0589224, -0.22390132, 2.5206933, 2.9298987,
            -1.1172909, 0.51111645, -1.0858182, -1.7141936, -1.4172751, -3.3490796, -4.4249344, -2.7032747]
MXNET_DW = [-0.93772316, -1.0750943, -0.3084484, 1.1375788, -2.3880334, -2.3676548, -2.4376764, -2.4990022,
            0.40575162, -1.9871929, -1.7061895, -0.7066047, 2.4079943, 1.8238631, 1.3444126, -1.9169638, 1.6832833,
            3.0583735, -5.928052, -1.9588578, -1.4083965, 0.5939831, 5.1246943, -0.67159903]
MXNET_DB = [-7.2493763, 1.8685431]
# nd.Deconvolution(u(4, (2, 2, 3)), u(5, (2, 3, 3)), kernel=(3,), stride=(2,), pad=(1,), adj=(1,), num_filter=3)
MXNET_Y1 = [1.329273, -2.5700402, -1.0462244, -0.1512968, 4.708341, -3.3011994, -1.2610052, 2.2715414, -1.0897497,
            4.718979, 1.4645051, -0.8807767, -0.15715103, -2.7330513, -0.25741258, 2.2385802, 0.52888757,
            -0.61046684, 3.2625527, -1.6832719, -4.803042, 5.992136, 0.5627322, 0.005783685, 0.26818612,
            -3.1143835, -1.4358429, -0.5550241, 1.6985707, -2.2794135, 0.22983393, -4.446321, -0.5288882, 0.7356014,
            0.34205547, 1.7894711]
# nd.Deconvolution(u(6, (1, 1, 3, 3)), u(7, (1, 1, 3, 3)), kernel=(3, 3), stride=(2, 2), target_shape=(6, 5),
#                  num_filter=1) (non-MKLDNN kernel: the MKLDNN build refuses target_shape here)
MXNET_T = [3.0045285, -0.35877067, -1.2849902, 1.045047, 2.4567065, -4.742588, 1.6528082, -0.6067234, 0.37054098,
           -1.7738044, -3.5050273, -1.6850857, -3.0005758, 0.09819566, 0.72694224, 3.2716296, 2.2119956, 2.3228087,
           2.6511195, -1.3879976, 0.22803818, -0.27193385, -0.6209471, -0.6384991, -1.2587732, -0.20416489,
           -0.111928195, 0.5559403, 0.29786584, 1.1269923]


def test_matches_mxnet_forward_and_gradients():
    x, w, b = nd.array(_rand(0, (1, 4, 2, 2))), nd.array(_rand(1, (4, 1, 3, 2))), nd.array(_rand(2, (2,)))
    for a in (x, w, b):
        a.attach_grad()
    with autograd.record():
        y = nd.Deconvolution(x, w, b, kernel=(3, 2), stride=(2, 2), pad=(1, 0), adj=(1, 1), dilate=(1, 2),
                             num_filter=2, num_group=2, no_bias=False)
    y.backward(nd.array(_rand(3, (1, 2, 4, 6))))
    for got, want, name in ((y, MXNET_Y, "y"), (x.grad, MXNET_DX, "dx"), (w.grad, MXNET_DW, "dw"),
                            (b.grad, MXNET_DB, "db")):
        assert_close(got.numpy().ravel(), np.array(want), 1e-5, 1e-5, name=name)
    y1 = nd.Deconvolution(nd.array(_rand(4, (2, 2, 3))), nd.array(_rand(5, (2, 3, 3))), kernel=(3,), stride=(2,),
                          pad=(1,), adj=(1,), num_filter=3)
    assert y1.shape == (2, 3, 6)
    assert_close(y1.numpy().ravel(), np.array(MXNET_Y1), 1e-5, 1e-5, name="1-D")
    t = nd.Deconvolution(nd.array(_rand(6, (1, 1, 3, 3))), nd.array(_rand(7, (1, 1, 3, 3))), kernel=(3, 3),
                         stride=(2, 2), target_shape=(6, 5), num_filter=1)
    assert t.shape == (1, 1, 6, 5)
    assert_close(t.numpy().ravel(), np.array(MXNET_T), 1e-5, 1e-5, name="target_shape")


# -- Gluon -------------------------------------------------------------------------------------------------------

def test_conv2d_transpose_shapes_names_and_repr_as_mxnet():
    import dnnbind.mxnet as mx  # the mxnet alias serves the same objects
    assert mx.gluon.nn.Conv2DTranspose is nn.Conv2DTranspose and mx.gluon.nn.Conv1DTranspose is nn.Conv1DTranspose
    assert mx.nd.Deconvolution is nd.Deconvolution and "Deconvolution" in mx.nd.__all__
    layer = nn.Conv2DTranspose(3, 4, strides=2, padding=1)
    assert layer.prefix.startswith("conv") and layer.weight.name == layer.prefix + "weight"
    assert layer.weight.shape == (0, 3, 4, 4)  # in_channels deferred
    assert repr(layer) == "Conv2DTranspose(3 -> 0, kernel_size=(4, 4), stride=(2, 2), padding=(1, 1))"
    layer.initialize()
    assert layer(nd.ones((1, 2, 5, 5))).shape == (1, 3, 10, 10)
    assert layer.weight.shape == (2, 3, 4, 4) and layer.bias.shape == (3,)
    assert repr(layer) == "Conv2DTranspose(3 -> 2, kernel_size=(4, 4), stride=(2, 2), padding=(1, 1))"
    # MXNet's transposed layers draw from conv's global counter
    a, b = nn.Conv2D(2, 3), nn.Conv1DTranspose(2, 3)
    assert int(b.prefix[4:-1]) == int(a.prefix[4:-1]) + 1 and b.prefix.startswith("conv")
    g = nn.Conv2DTranspose(6, 3, groups=2, output_padding=(1, 0), strides=2, in_channels=4, activation="relu",
                           use_bias=False)
    assert g.weight.shape == (4, 3, 3, 3)
    assert repr(g) == ("Conv2DTranspose(3 -> 4, kernel_size=(3, 3), stride=(2, 2), groups=2, bias=False, "
                       "Activation(relu))")
    g.initialize()
    assert g(nd.ones((2, 4, 5, 6))).shape == (2, 6, 12, 13)


def test_conv1d_transpose_and_collect_params():
    net = nn.Sequential()
    with net.name_scope():
        net.add(nn.Conv1DTranspose(4, 3, strides=2, output_padding=1, in_channels=2))
    layer = net[0]
    assert layer.weight.shape == (2, 4, 3)
    assert repr(layer) == "Conv1DTranspose(4 -> 2, kernel_size=(3,), stride=(2,))"
    names = [p.name for p in net.collect_params().values()]
    assert names == [layer.prefix + "weight", layer.prefix + "bias"] and layer.prefix.startswith(net.prefix + "conv")
    net.initialize()
    assert net(nd.ones((2, 2, 7))).shape == (2, 4, 16)


@pytest.mark.parametrize("activation", [None, "tanh", "relu"])
def test_layer_output_and_parameter_gradients(activation):
    layer = nn.Conv2DTranspose(4, (3, 2), strides=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2),
                               groups=2, activation=activation, in_channels=2)
    layer.initialize(dnnbind.init.Uniform(1.0))
    layer.bias.set_data(nd.array(_rand(3, (4,))))
    x = _rand(0, (2, 2, 3, 4))
    xa = nd.array(x)
    xa.attach_grad()
    with autograd.record():
        y = layer(xa)
    head = _rand(5, y.shape)
    y.backward(nd.array(head))
    head = head.astype(np.float64)
    w, b = layer.weight.data().numpy().astype(np.float64), layer.bias.data().numpy()
    z = loop_deconv(x.astype(np.float64), w, b, (2, 1), (1, 0), (1, 2), 2, (1, 0))
    act = {None: lambda v: v, "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0)}[activation]
    assert y.shape == (2, 4, 6, 6)
    assert_close(y, act(z), 1e-5, 1e-5, name="layer output")
    dz = head * {None: lambda v: 1.0, "tanh": lambda v: 1 - np.tanh(v) ** 2, "relu": lambda v: v > 0}[activation](z)
    assert_close(xa.grad, R.deconv_backward_data(w, dz, x.shape, (2, 1), (1, 0), (1, 2), 2), 1e-4, 1e-4, name="dx")
    assert_close(layer.weight.grad(), R.deconv_backward_filter(x.astype(np.float64), dz, w.shape, (2, 1), (1, 0),
                                                               (1, 2), 2), 1e-4, 1e-4, name="dw")
    assert_close(layer.bias.grad(), dz.sum(axis=(0, 2, 3)), 1e-4, 1e-4, name="db")


def test_bilinear_upsampling_as_d2l_fcn_builds_it():
    """d2l's FCN chapter: a Conv2DTranspose(k=4, s=2, p=1) with bilinear weights doubles an image; a constant
    image stays constant away from the border (each output row gets taps 0.25 + 0.75)."""
    og = np.ogrid[:4, :4]  # d2l's bilinear_kernel(3, 3, 4): factor 2, center 1.5, one filter per channel
    weight = np.zeros((3, 3, 4, 4), np.float32)
    weight[range(3), range(3)] = (1 - abs(og[0] - 1.5) / 2) * (1 - abs(og[1] - 1.5) / 2)
    layer = nn.Conv2DTranspose(3, kernel_size=4, padding=1, strides=2, in_channels=3, use_bias=False)
    layer.initialize(dnnbind.init.Constant(0.0))
    layer.weight.set_data(nd.array(weight))
    y = layer(nd.ones((1, 3, 5, 4))).numpy()
    assert y.shape == (1, 3, 10, 8)
    assert_close(y[:, :, 1:-1, 1:-1], np.ones((1, 3, 8, 6)), 1e-6, 1e-6)
    assert_close(y[0, 0, 0, 1:-1], np.full(6, 0.75), 1e-6, 1e-6)


def test_layer_errors():
    with pytest.raises(ValueError, match="Conv2DTranspose: output_padding \\(1, 1\\) must be smaller than strides"):
        nn.Conv2DTranspose(3, 3, output_padding=1)
    with pytest.raises(NotImplementedError, match="layout='NCHW'"):
        nn.Conv2DTranspose(3, 3, layout="NHWC")
    with pytest.raises(ValueError, match="not divisible by groups"):
        nn.Conv2DTranspose(3, 3, groups=2)
    layer = nn.Conv2DTranspose(2, 3, in_channels=3)
    layer.initialize()
    with pytest.raises(ValueError, match=r"Deconvolution: data has 4 channels but weight \(3, 2, 3, 3\) expects 3"):
        layer(nd.ones((1, 4, 5, 5)))
    with pytest.raises(ValueError, match="expects NCW input"):
        nn.Conv1DTranspose(2, 3)(nd.ones((1, 2, 5, 5)))


# -- errors --------------------------------------------------------------------------------------------------------

X, W = nd.ones((2, 3, 4, 4)), nd.ones((3, 2, 3, 3))


@pytest.mark.parametrize("kwargs,exc,fragments", [
    ({"weight": nd.ones((3, 2, 3))}, ValueError, ["Deconvolution: weight must be 4-D", "(3, 2, 3)", "(2, 3, 4, 4)"]),
    ({"weight": nd.ones((4, 2, 3, 3))}, ValueError, ["data has 3 channels but weight (4, 2, 3, 3) expects 4"]),
    ({"kernel": (2, 2)}, ValueError, ["kernel (2, 2) but weight (3, 2, 3, 3) has kernel (3, 3)"]),
    ({"num_filter": 4}, ValueError, ["num_filter 4 but weight (3, 2, 3, 3) with num_group 1 gives 2"]),
    ({"num_group": 3, "num_filter": 2}, ValueError, ["num_filter 2 but weight (3, 2, 3, 3) with num_group 3 gives 6"]),
    ({"bias": nd.ones((2,))}, ValueError, ["a bias was given but no_bias=True"]),
    ({"no_bias": False}, ValueError, ["no_bias=False needs a bias"]),
    ({"bias": nd.ones((3,)), "no_bias": False}, ValueError, ["Deconvolution: bias has shape (3,)", "expected (2,)"]),
    ({"stride": (2, 2), "adj": (2, 2)}, ValueError, ["adj (2, 2) must be smaller than stride (2, 2)"]),
    ({"stride": (0, 0)}, ValueError, ["Deconvolution: stride must be >= 1"]),
    ({"pad": (3, 3)}, ValueError, ["Deconvolution: pad (3, 3) removes the whole output", "(2, 3, 4, 4)"]),
    # MXNet's parameter rules (checked on MXNet 1.9.1): one value per spatial axis; None is sent as the string
    # "None", which MXNet's parser refuses for num_filter in these words (left out: tests/test_mxnet_args.py).
    # MXNet itself reads kernel="None" as an unknown shape and refuses it later ("-1D deconvolution not supported").
    ({"stride": 2}, ValueError, ["stride (2,) has 1 value(s) but the kernel (3, 3) has 2"]),
    ({"kernel": None}, ValueError, ["Deconvolution: kernel must give the filter's size on each spatial axis"]),
    ({"num_filter": None}, TypeError,
     ["Invalid Parameter format for num_filter expect int (non-negative) but value='None'"]),
    ({"target_shape": (12, 6)}, ValueError, ["target_shape (12, 6) is too big", "at most 6"]),
    ({"stride": (1, 1), "target_shape": (5, 5)}, ValueError, ["adj (1, 1) must be smaller than stride (1, 1)"]),
    ({"layout": "NHWC"}, NotImplementedError, ["layout='NCHW'"]),
    ({"data": nd.ones((1, 3, 2, 2, 2))}, ValueError, ["has 2 spatial axes but data (1, 3, 2, 2, 2) has 3"]),
])
def test_deconvolution_errors_name_the_op_argument_and_shapes(kwargs, exc, fragments):
    args = {"data": X, "weight": W, "kernel": (3, 3), "num_filter": 2}
    args.update(kwargs)
    with pytest.raises(exc) as info:
        nd.Deconvolution(**args)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_op_level_errors():
    x, w = _rand(0, (2, 3, 4, 4)), _rand(1, (3, 2, 3, 3))
    with pytest.raises(ValueError, match=r"^deconv_forward: x has 3 channels but w expects 4 .*x \(2, 3, 4, 4\), "
                                         r"w \(4, 2, 3, 3\)"):
        R.deconv_forward(x, _rand(1, (4, 2, 3, 3)))
    with pytest.raises(ValueError, match=r"^deconv_backward_data: dy has shape \(2, 2, 8, 8\) but the transposed"):
        R.deconv_backward_data(w, _rand(2, (2, 2, 8, 8)), x.shape, stride=1)
    with pytest.raises(ValueError, match=r"^deconv_backward_filter: dy has shape \(2, 3, 6, 6\)"):
        R.deconv_backward_filter(x, _rand(2, (2, 3, 6, 6)), w.shape)
    with pytest.raises(TypeError, match="^deconv_forward: dtypes differ"):
        R.deconv_forward(x, w.astype(np.float64))


# -- GPU -----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_forward_and_gradients_match_the_cpu_twin(case, gpu):
    """float32 on the GPU (cudnnConvolutionBackwardData / Forward / BackwardFilter, or their backend plans) against
    the float64 twin, through autograd; then the ops called directly."""
    xs, ws, stride, pad, dilate, groups, adj = case
    x, w, b = (a.astype(np.float32) for a in _case_arrays(case, seed=7))
    head = _rand(11, _out_shape(case))
    f64 = [a.astype(np.float64) for a in (x, w, b, head)]
    y_ref = R.deconv_forward(f64[0], f64[1], f64[2], stride, pad, dilate, groups, adj)
    dx_ref = R.deconv_backward_data(f64[1], f64[3], xs, stride, pad, dilate, groups)
    dw_ref = R.deconv_backward_filter(f64[0], f64[3], ws, stride, pad, dilate, groups)
    db_ref = f64[3].sum(axis=(0, 2, 3))
    xg, wg, bg = (nd.array(a, ctx=gpu) for a in (x, w, b))
    for a in (xg, wg, bg):
        a.attach_grad()
    with autograd.record():
        y = _deconv(xg, wg, bg, case)
    y.backward(nd.array(head, ctx=gpu))
    assert y.device == gpu
    for got, want, name in ((y, y_ref, "y"), (xg.grad, dx_ref, "dx"), (wg.grad, dw_ref, "dw"), (bg.grad, db_ref, "db")):
        assert_close(got, want, 1e-4, 1e-4 * max(1.0, float(np.abs(want).max())), name=name)
    g = lambda a: dnnbind.array(a, device=gpu)  # noqa: E731
    direct = ((dnnbind.deconv_forward(g(x), g(w), g(b), stride, pad, dilate, groups, adj), y_ref, "deconv_forward"),
              (dnnbind.deconv_backward_data(g(w), g(head), xs, stride, pad, dilate, groups), dx_ref, "bwd data"),
              (dnnbind.deconv_backward_filter(g(x), g(head), ws, stride, pad, dilate, groups), dw_ref, "bwd filter"))
    for got, want, name in direct:
        assert_close(got, want, 1e-4, 1e-4 * max(1.0, float(np.abs(want).max())), name=name)


@pytest.mark.gpu
def test_gpu_float64_and_gluon_layers_match_the_cpu(gpu):
    x, w, b = _case_arrays(CASES[1], seed=3)
    y = _deconv(*(nd.array(a, ctx=gpu, dtype="float64") for a in (x, w, b)), CASES[1])
    assert y.dtype == np.float64
    assert_close(y, loop_deconv(x, w, b, *CASES[1][2:]), 1e-10, 1e-10, name="float64 on the GPU")
    for make, shape in ((lambda: nn.Conv2DTranspose(4, 3, strides=2, padding=1, output_padding=1, groups=2,
                                                    activation="relu", in_channels=4), (2, 4, 5, 6)),
                        (lambda: nn.Conv1DTranspose(3, 4, strides=3, padding=1, dilation=2, in_channels=2), (2, 2, 7))):
        results = []
        for device in (CPU, gpu):
            layer = make()
            layer.initialize(dnnbind.init.Constant(0.0), ctx=device)
            layer.weight.set_data(nd.array(_rand(1, layer.weight.shape), ctx=device))
            layer.bias.set_data(nd.array(_rand(2, layer.bias.shape), ctx=device))
            xa = nd.array(_rand(0, shape), ctx=device)
            xa.attach_grad()
            with autograd.record():
                out = layer(xa)
            out.backward(nd.array(_rand(5, out.shape), ctx=device))  # weight grad straight into the Parameter's
            results.append([a.numpy() for a in (out, xa.grad, layer.weight.grad(), layer.bias.grad())])
        for got, want, name in zip(results[1], results[0], ("y", "dx", "dw", "db")):
            assert_close(got, want, 1e-4, 1e-4 * max(1.0, float(np.abs(want).max())), name=name)


@pytest.fixture
def legacy_conv_only():  # legacy calls by name, not backend plans' cudnnBackendExecute (as tests/test_trace.py)
    before = dnnbind.ops.algos._policy["backend"]
    dnnbind.set_conv_algo_policy("time", backend=False)
    yield
    dnnbind.set_conv_algo_policy("time", backend=before)


@pytest.mark.gpu
def test_gpu_trace_shows_backward_data_as_the_forward(gpu, legacy_conv_only):
    x = nd.array(_rand(0, (2, 3, 5, 5)), ctx=gpu)
    w, b = nd.array(_rand(1, (3, 4, 4, 4)), ctx=gpu), nd.array(_rand(2, (4,)), ctx=gpu)
    for a in (x, w, b):
        a.attach_grad()
    with dnnbind.trace() as t:
        with autograd.record():
            y = nd.Deconvolution(x, w, b, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=4, no_bias=False)
        y.backward()
    assert y.shape == (2, 4, 10, 10)
    calls = {}
    for r in t.records:
        calls.setdefault(r.function, []).append(r)
    fwd = calls.get("cudnnConvolutionBackwardData", [])
    assert fwd and fwd[-1].op == "deconv_forward", str(t)
    assert fwd[-1].details["algo"] in cudnn.BWD_DATA_ALGOS
    assert fwd[-1].details["w"] == (3, 4, 4, 4) and fwd[-1].details["dy"] == (2, 3, 5, 5)  # x plays dy
    assert any(r.op == "deconv_forward" for r in calls.get("cudnnAddTensor", [])), str(t)
    for function, op in (("cudnnConvolutionForward", "deconv_backward_data"),
                         ("cudnnConvolutionBackwardFilter", "deconv_backward_filter")):
        assert calls.get(function) and calls[function][-1].op == op, str(t)
