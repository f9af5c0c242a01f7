"""Gluon layers of MXNet 1.x that real programs use (issue 11): activations, 1-D/3-D and ceil-mode pooling,
Conv1D, Conv2D/Dense with every activation, Embedding, Lambda/HybridLambda, layer names.

Every layer runs against a float64 numpy reference written here (from MXNet's documented formulas, not from
dnnbind's code), on several shapes, with gradients (input and parameters) by central differences. The
``MXNET_*`` fixtures are outputs of MXNet 1.9.1 itself (the CPU wheel on Python 3.8, MKLDNN on and off gave the
same values), from inputs made with ``np.random.RandomState(seed).uniform(-2, 2, shape).astype(float32)``.
GPU tests run the same cases on ``gpu(0)`` and compare with the cpu.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from _helpers import assert_close, numerical_grad

import dnnbind
from dnnbind import autograd, nd
from dnnbind.gluon import nn

CPU = dnnbind.cpu()


def _rand(seed, shape, lo=-2.0, hi=2.0):
    return np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


# -- numpy references (float64) ---------------------------------------------------------------------------------

def np_softrelu(x):
    return np.logaddexp(0.0, x)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


NP_ACT = {"relu": lambda x: np.maximum(x, 0), "sigmoid": np_sigmoid, "tanh": np.tanh, "softrelu": np_softrelu,
          "softsign": lambda x: x / (1 + np.abs(x)), None: lambda x: x}
SELU_A, SELU_L = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
np_erf = np.vectorize(math.erf)


def np_conv(x, w, b, stride, pad, groups=1):
    """Direct 2-D cross-correlation, NCHW, weight (O, C/groups, kh, kw)."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh, ow = (h + 2 * pad[0] - kh) // stride[0] + 1, (wd + 2 * pad[1] - kw) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1]]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return y + (b.reshape(1, -1, 1, 1) if b is not None else 0)


def np_pool(x, k, s, p, kind, full=False, include_pad=True):
    """MXNet's pooling (src/operator/nn/pool.h): 'full' rounds the output size up; an avg window counting
    padding ends at H + pad, one not counting it covers only real elements."""
    n, c, h, w = x.shape
    rnd = math.ceil if full else math.floor
    oh, ow = 1 + rnd((h + 2 * p[0] - k[0]) / s[0]), 1 + rnd((w + 2 * p[1] - k[1]) / s[1])
    y = np.zeros((n, c, oh, ow))
    for a in range(oh):
        for b in range(ow):
            h0, w0 = a * s[0] - p[0], b * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
            area = (h1 - h0) * (w1 - w0)
            win = x[:, :, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)]
            if kind == "max":
                y[:, :, a, b] = win.max(axis=(2, 3))
            else:
                y[:, :, a, b] = win.sum(axis=(2, 3)) / (area if include_pad else win.shape[2] * win.shape[3])
    return y


def _conv1d_ref(x, prm, stride, pad, groups=1, act=None, bias=True):
    y = np_conv(x[:, :, None, :], prm["weight"][:, :, None, :], prm.get("bias") if bias else None, (1, stride),
                (0, pad), groups)
    return NP_ACT[act](y[:, :, 0, :])


def _pool1d_ref(x, k, s, p, kind, full=False):
    return np_pool(x[:, :, None, :], (1, k), (1, s), (0, p), kind, full)[:, :, 0, :]


def _dense_ref(x, prm, act=None, flatten=True):
    x2 = x.reshape(x.shape[0], -1) if flatten else x
    return NP_ACT[act](x2 @ prm["weight"].T + prm.get("bias", 0))


# (id, block factory, input shape, reference(x, params) in float64)
CASES = [
    ("leakyrelu", lambda: nn.LeakyReLU(0.15), (2, 3, 4), lambda x, p: np.where(x > 0, x, 0.15 * x)),
    ("prelu", lambda: nn.PReLU(in_channels=3), (2, 3, 4, 2),
     lambda x, p: np.where(x > 0, x, p["alpha"].reshape(1, 3, 1, 1) * x)),
    ("prelu_shared", lambda: nn.PReLU(), (5, 4), lambda x, p: np.where(x > 0, x, p["alpha"] * x)),
    ("elu", lambda: nn.ELU(0.7), (3, 5), lambda x, p: np.where(x > 0, x, 0.7 * np.expm1(x))),
    ("selu", lambda: nn.SELU(), (2, 3, 4), lambda x, p: SELU_L * np.where(x > 0, x, SELU_A * np.expm1(x))),
    ("gelu", lambda: nn.GELU(), (4, 6), lambda x, p: 0.5 * x * (1 + np_erf(x / np.sqrt(2)))),
    ("swish", lambda: nn.Swish(1.5), (2, 7), lambda x, p: x * np_sigmoid(1.5 * x)),
    *[(f"act_{a}", lambda a=a: nn.Activation(a), (3, 4, 2), lambda x, p, a=a: NP_ACT[a](x))
      for a in ("relu", "sigmoid", "tanh", "softrelu", "softsign")],
    *[(f"dense_{a}", lambda a=a: nn.Dense(5, activation=a), (3, 2, 4), lambda x, p, a=a: _dense_ref(x, p, a))
      for a in ("sigmoid", "tanh", "softrelu", "softsign")],
    ("dense_nobias_noflatten", lambda: nn.Dense(4, use_bias=False, flatten=False, in_units=3), (2, 5, 3),
     lambda x, p: x @ p["weight"].T),
    *[(f"conv2d_{a}", lambda a=a: nn.Conv2D(4, 3, padding=1, activation=a), (2, 3, 5, 6),
       lambda x, p, a=a: NP_ACT[a](np_conv(x, p["weight"], p["bias"], (1, 1), (1, 1)))) for a in
      ("sigmoid", "softrelu", "softsign")],
    ("conv2d_nobias_stride", lambda: nn.Conv2D(3, (2, 3), strides=2, use_bias=False, in_channels=2), (2, 2, 7, 6),
     lambda x, p: np_conv(x, p["weight"], None, (2, 2), (0, 0))),
    ("conv1d", lambda: nn.Conv1D(4, 3, strides=2, padding=1), (2, 3, 9), lambda x, p: _conv1d_ref(x, p, 2, 1)),
    ("conv1d_groups_tanh", lambda: nn.Conv1D(4, 3, groups=2, activation="tanh", in_channels=2), (2, 2, 8),
     lambda x, p: _conv1d_ref(x, p, 1, 0, groups=2, act="tanh")),
    ("maxpool2d_ceil", lambda: nn.MaxPool2D(3, 2, padding=1, ceil_mode=True), (2, 2, 6, 7),
     lambda x, p: np_pool(x, (3, 3), (2, 2), (1, 1), "max", full=True)),
    ("avgpool2d_ceil", lambda: nn.AvgPool2D(3, 2, padding=1, ceil_mode=True), (1, 2, 5, 6),
     lambda x, p: np_pool(x, (3, 3), (2, 2), (1, 1), "avg", full=True)),
    ("avgpool2d_ceil_nopad", lambda: nn.AvgPool2D((2, 3), 2, ceil_mode=True), (2, 1, 5, 8),
     lambda x, p: np_pool(x, (2, 3), (2, 2), (0, 0), "avg", full=True)),
    ("avgpool2d_ceil_exclude", lambda: nn.AvgPool2D(3, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 6, 5),
     lambda x, p: np_pool(x, (3, 3), (2, 2), (1, 1), "avg", full=True, include_pad=False)),
    ("avgpool2d_exclude", lambda: nn.AvgPool2D(3, 2, 1, count_include_pad=False), (1, 2, 7, 6),
     lambda x, p: np_pool(x, (3, 3), (2, 2), (1, 1), "avg", include_pad=False)),
    ("maxpool1d_ceil", lambda: nn.MaxPool1D(3, 2, ceil_mode=True), (2, 3, 8),
     lambda x, p: _pool1d_ref(x, 3, 2, 0, "max", full=True)),
    ("avgpool1d_pad", lambda: nn.AvgPool1D(2, padding=1), (2, 3, 7), lambda x, p: _pool1d_ref(x, 2, 2, 1, "avg")),
    ("gmaxpool1d", lambda: nn.GlobalMaxPool1D(), (2, 3, 5), lambda x, p: x.max(axis=2, keepdims=True)),
    ("gavgpool1d", lambda: nn.GlobalAvgPool1D(), (2, 3, 5), lambda x, p: x.mean(axis=2, keepdims=True)),
    ("gmaxpool2d", lambda: nn.GlobalMaxPool2D(), (2, 3, 4, 3), lambda x, p: x.max(axis=(2, 3), keepdims=True)),
    ("gavgpool2d", lambda: nn.GlobalAvgPool2D(), (2, 3, 4, 3), lambda x, p: x.mean(axis=(2, 3), keepdims=True)),
    ("gmaxpool3d", lambda: nn.GlobalMaxPool3D(), (2, 2, 3, 2, 3), lambda x, p: x.max(axis=(2, 3, 4), keepdims=True)),
    ("gavgpool3d", lambda: nn.GlobalAvgPool3D(), (2, 2, 3, 2, 3), lambda x, p: x.mean(axis=(2, 3, 4), keepdims=True)),
    ("flatten", lambda: nn.Flatten(), (2, 3, 2), lambda x, p: x.reshape(2, -1)),
    ("hybridlambda", lambda: nn.HybridLambda(lambda F, x: F.tanh(x) * 2), (3, 4), lambda x, p: np.tanh(x) * 2),
    ("hybridlambda_name", lambda: nn.HybridLambda("softsign"), (3, 4), lambda x, p: x / (1 + np.abs(x))),
    ("lambda", lambda: nn.Lambda(lambda x: nd.sigmoid(x) + x), (3, 4), lambda x, p: np_sigmoid(x) + x),
]
IDS = [case[0] for case in CASES]


def _make(factory, shape, device, seed=0):
    block = factory()
    block.initialize(ctx=device)
    x = nd.array(_rand(seed, shape), ctx=device)
    block(x)  # finishes deferred shapes
    params = block.collect_params()
    for i, (name, p) in enumerate(params.items()):  # random parameters (PReLU's 0.25 would hide a mix-up)
        p.set_data(nd.array(_rand(100 + i, p.shape, -1, 1), ctx=device))
    return block, x


def _local(params):
    """{'weight': ...}: collect_params() keys are full names (``dense0_weight``), the layer's prefix first."""
    return {name.removeprefix(params.prefix): p.data().numpy().astype(np.float64) for name, p in params.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer_forward_matches_numpy(case):
    _, factory, shape, ref = case
    for seed, scale in ((0, 1.0), (1, 3.0)):
        block, x = _make(factory, shape, CPU, seed)
        x = x * scale
        y = block(x)
        assert_close(y, ref(x.numpy().astype(np.float64), _local(block.collect_params())), 2e-5, 2e-5,
                     name=case[0])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer_gradients_by_central_differences(case):
    _, factory, shape, _ = case
    block, x32 = _make(factory, shape, CPU)
    block.cast("float64")
    x = nd.array(x32.numpy(), ctx=CPU, dtype="float64")
    x.attach_grad()
    params = list(block.collect_params().values())
    with autograd.record():
        y = block(x)
    w = np.random.default_rng(5).uniform(0.5, 1.5, y.shape)
    y.backward(nd.array(w, ctx=CPU, dtype="float64"))
    host_x = x.numpy()
    assert_close(x.grad, numerical_grad(lambda v: block(nd.array(v, ctx=CPU, dtype="float64")).numpy(), host_x, w),
                 1e-5, 1e-6, name=f"{case[0]} d/dx")
    for p in params:
        base, analytic = p.data().numpy().copy(), p.grad().numpy().copy()

        def f(v, p=p):
            p.set_data(nd.array(v, ctx=CPU, dtype="float64"))
            return block(nd.array(host_x, ctx=CPU, dtype="float64")).numpy()
        num = numerical_grad(f, base, w)
        p.set_data(nd.array(base, ctx=CPU, dtype="float64"))
        assert_close(analytic, num, 1e-5, 1e-6, name=f"{case[0]} d/d{p.name}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer_gpu_matches_cpu(case, gpu):
    _, factory, shape, _ = case
    outs = []
    for device in (CPU, gpu):
        block, x = _make(factory, shape, device)
        x.attach_grad()
        with autograd.record():
            y = block(x)
        y.backward(nd.array(np.random.default_rng(5).uniform(0.5, 1.5, y.shape), ctx=device))
        outs.append([y.numpy(), x.grad.numpy()] + [p.grad().numpy() for p in block.collect_params().values()])
    for a, b in zip(outs[1], outs[0]):
        assert_close(a, b, 1e-4, 1e-5, name=case[0])


# -- nd ops with MXNet 1.9.1's own outputs -------------------------------------------------------------------------

MXNET_POOL_AVG_FULL = [[[[0.26371694, 0.4896503, 0.1415527, 0.11652602],
                         [0.6538534, 0.6535237, 0.08230938, 0.4280293],
                         [0.18060637, 0.6114366, 0.40993166, 0.13012742]],
                        [[0.11903068, 0.46280906, -0.14079137, 0.03644497],
                         [-0.14843312, 0.22784065, -0.2145213, -0.5546646],
                         [-0.422522, -0.24879175, -0.22531193, -0.4356864]]]]
MXNET_POOL_AVG_FULL_EXCLUDE = [[[[0.5933631, 0.73447543, 0.21232904, 0.34957805],
                                 [0.9807802, 0.6535237, 0.08230938, 0.8560586],
                                 [0.40636438, 0.9171548, 0.61489755, 0.39038223]],
                                [[0.26781905, 0.6942136, -0.21118705, 0.1093349],
                                 [-0.22264966, 0.22784065, -0.2145213, -1.1093292],
                                 [-0.95067465, -0.37318766, -0.33796793, -1.3070592]]]]
MXNET_POOL_MAX_FULL = [[[[1.5670921, 1.8546511, 1.1669002, 0.58357644],
                         [1.7023865, 1.9144734, 1.3304794, 1.3304794],
                         [1.4800485, 1.9144734, 1.7786757, 1.1221167]],
                        [[1.0969348, 1.7749923, 0.7272812, 0.47054198],
                         [0.7905248, 1.7749923, 1.9534954, -0.25187218],
                         [-0.5451569, 0.6124333, 1.9534954, -1.0222976]]]]
MXNET_GELU_ROW = [-0.1228001, 0.7146637, -0.04553915, -0.16965272]  # nd.LeakyReLU(x, act_type='gelu')[0, 0]
MXNET_ELU_ROW = [-0.19771464, 0.88129795, -0.6052219, -0.38252136]  # act_type='elu', slope=0.7


@pytest.mark.parametrize("pool_type,include,expected", [("avg", True, MXNET_POOL_AVG_FULL),
                                                        ("avg", False, MXNET_POOL_AVG_FULL_EXCLUDE),
                                                        ("max", True, MXNET_POOL_MAX_FULL)])
def test_pooling_full_convention_matches_mxnet(pool_type, include, expected):
    x = nd.array(_rand(0, (1, 2, 5, 6)))
    y = nd.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type=pool_type, pooling_convention="full",
                   count_include_pad=include)
    assert_close(y, np.array(expected), 1e-6, 1e-6, name=f"Pooling full {pool_type}")


def test_leakyrelu_modes_match_mxnet():
    x = nd.array(_rand(1, (2, 3, 4)))
    assert_close(nd.LeakyReLU(x, act_type="gelu")[0, 0], np.array(MXNET_GELU_ROW), 1e-6, 1e-6, name="gelu")
    assert_close(nd.LeakyReLU(x, act_type="elu", slope=0.7)[0, 0], np.array(MXNET_ELU_ROW), 1e-6, 1e-6, name="elu")


@pytest.mark.parametrize("shape,k,s,p", [((2, 3, 7, 7), (3, 3), (2, 2), (0, 0)), ((1, 2, 6, 9), (2, 4), (3, 2), (1, 1)),
                                         ((2, 1, 8, 5), (3, 2), (2, 2), (1, 0))])
@pytest.mark.parametrize("pool_type,include", [("max", True), ("avg", True), ("avg", False)])
def test_pooling_full_shapes_and_gradients(shape, k, s, p, pool_type, include):
    x = _rand(3, shape)
    y = nd.Pooling(nd.array(x), kernel=k, stride=s, pad=p, pool_type=pool_type, pooling_convention="full",
                   count_include_pad=include)
    assert_close(y, np_pool(x.astype(np.float64), k, s, p, pool_type, True, include), 1e-5, 1e-6, name="full")
    from _helpers import nd_gradcheck
    nd_gradcheck(lambda a: nd.Pooling(a, kernel=k, stride=s, pad=p, pool_type=pool_type, pooling_convention="full",
                                      count_include_pad=include), [x.astype(np.float64)], CPU)


@pytest.mark.parametrize("act", ["leaky", "elu", "selu", "gelu", "prelu"])
def test_nd_leakyrelu_gradients(act):
    from _helpers import nd_gradcheck
    x = _rand(4, (2, 3, 5))
    if act == "prelu":
        nd_gradcheck(lambda a, g: nd.LeakyReLU(a, gamma=g, act_type="prelu"), [x, _rand(5, (3,), 0, 1)], CPU)
    else:
        nd_gradcheck(lambda a: nd.LeakyReLU(a, act_type=act, slope=0.3), [x], CPU)


def test_elu_large_inputs_have_finite_gradients():
    x = nd.array(np.array([-50.0, -1.0, 100.0, 800.0]), dtype="float64")
    x.attach_grad()
    with autograd.record():
        y = nd.LeakyReLU(x, act_type="elu", slope=1.0)
    y.backward()
    assert np.isfinite(x.grad.numpy()).all() and np.isfinite(y.numpy()).all()


def test_rrelu_uses_mean_slope_outside_training():
    x = nd.array(np.array([-1.0, 2.0]))
    y, mask = nd.LeakyReLU(x, act_type="rrelu", lower_bound=0.1, upper_bound=0.3)  # MXNet returns [output, mask]
    assert_close(y, np.array([-0.2, 2.0]), 1e-6, 1e-7)


# -- Embedding, Lambda, names, errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("idx_shape", [(5,), (2, 3), (2, 2, 2)])
def test_embedding_lookup_and_scatter_add_gradient(idx_shape):
    emb = nn.Embedding(6, 4)
    emb.initialize()
    table = _rand(7, (6, 4))
    emb.weight.set_data(nd.array(table))
    idx = np.random.RandomState(8).randint(0, 6, idx_shape)
    idx.flat[0] = idx.flat[-1]  # a repeated id: its gradient rows must add up
    x = nd.array(idx.astype(np.float32))
    with autograd.record():
        y = emb(x)
    assert_close(y, table[idx], 0, 0, name="embedding")
    g = np.random.default_rng(2).uniform(0.5, 1.5, y.shape)
    y.backward(nd.array(g))
    expect = np.zeros((6, 4))
    np.add.at(expect, idx.reshape(-1), g.reshape(-1, 4))
    assert_close(emb.weight.grad(), expect, 1e-6, 1e-6, name="embedding grad")
    assert repr(emb) == "Embedding(6 -> 4, float32)"


def test_lambda_forms():
    x = nd.array(_rand(9, (2, 3)))
    assert_close(nn.Lambda("tanh")(x), np.tanh(x.numpy()), 1e-6, 1e-6)
    seen = []
    hl = nn.HybridLambda(lambda F, a, b: seen.append(F) or F.maximum(a, b))
    assert_close(hl(x, -x), np.abs(x.numpy()), 0, 0)
    assert seen == [nd]
    with pytest.raises(ValueError, match="no function"):
        nn.HybridLambda("no_such_op")
    with pytest.raises(ValueError, match="Lambda"):
        nn.Lambda(3)


def test_layer_names_follow_mxnet_aliases():
    # MXNet 1.9.1 names these pool0, leakyrelu0, embedding0, prelu0, elu0, conv0, pool1, ... (global counters).
    expect = {nn.GlobalAvgPool2D: "pool", nn.MaxPool1D: "pool", nn.GlobalMaxPool3D: "pool", nn.Conv1D: "conv",
              nn.LeakyReLU: "leakyrelu", nn.Embedding: "embedding", nn.PReLU: "prelu", nn.ELU: "elu",
              nn.SELU: "selu", nn.Swish: "swish", nn.GELU: "gelu", nn.HybridLambda: "hybridlambda",
              nn.Lambda: "lambda", nn.Flatten: "flatten"}
    args = {nn.Conv1D: (2, 3), nn.LeakyReLU: (0.1,), nn.Embedding: (3, 2), nn.HybridLambda: ("tanh",),
            nn.Lambda: ("tanh",)}
    for cls, alias in expect.items():
        a, b = cls(*args.get(cls, ())), cls(*args.get(cls, ()))
        ma, mb = re.fullmatch(alias + r"(\d+)", a.name), re.fullmatch(alias + r"(\d+)", b.name)
        assert ma and mb and int(mb.group(1)) == int(ma.group(1)) + 1, (cls, a.name, b.name)
    assert re.fullmatch(r"softrelu\d+", nn.Activation("softrelu").name)
    net = nn.Sequential()
    with net.name_scope():
        net.add(nn.PReLU(), nn.Embedding(4, 2))
    assert [p.name for p in net.collect_params().values()] == [net.prefix + "prelu0_alpha",
                                                                 net.prefix + "embedding0_weight"]


def test_prelu_default_alpha_is_quarter():
    p = nn.PReLU(in_channels=2)
    p.initialize()
    assert_close(p.alpha.data(), np.full(2, 0.25), 0, 0)
    assert_close(p(nd.array(np.array([[-4.0, 4.0]]))), np.array([[-1.0, 4.0]]), 0, 0)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="'NCHW' or 'NHWC'"):  # NHWC itself is supported (tests/test_nhwc.py)
        nn.Conv2D(2, 3, layout="HWCN")
    with pytest.raises(NotImplementedError, match="NCW"):
        nn.MaxPool1D(layout="NWC")
    with pytest.raises(ValueError):
        nn.AvgPool2D(layout="NCW")
    with pytest.raises(ValueError, match="unknown activation"):
        nn.Dense(3, activation="swish")
    with pytest.raises(ValueError, match="no less than 0"):
        nn.LeakyReLU(-0.1)
    with pytest.raises(ValueError, match=r"Invalid Input: 'bogus', valid values are: \{'elu', 'gelu', 'leaky', "
                                         r"'prelu', 'rrelu', 'selu'\}, in operator LeakyReLU"):  # MXNet 1.9.1's words
        nd.LeakyReLU(nd.ones((2,)), act_type="bogus")
    with pytest.raises(ValueError, match="gamma"):
        nd.LeakyReLU(nd.ones((2, 3)), gamma=nd.ones((2,)), act_type="prelu")
    with pytest.raises(ValueError, match="pooling_convention"):
        nd.Pooling(nd.ones((1, 1, 4, 4)), kernel=(2, 2), pooling_convention="same")
    with pytest.raises(ValueError, match="NCW"):
        nn.MaxPool1D()(nd.ones((1, 1, 4, 4)))
    conv = nn.Conv1D(2, 3)
    conv.initialize()
    with pytest.raises(ValueError, match="NCW"):
        conv(nd.ones((1, 1, 4, 4)))
