"""MXNet's ``LeakyReLU`` and ``Embedding`` OpDef entries (dnnbind/ops/defs/leaky_relu.py, embedding.py) beyond what
tests/test_opdefs.py checks of every entry: outputs and gradients against the real MXNet 1.9.1
(tests/fixtures/mxnet_nn_extra, on the cpu and, marked gpu, on a GPU), rrelu's random slopes and its mask output,
the indices Embedding clips and gives no gradient, the symbol nodes MXNet writes, and the refusals.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from dnnbind.gluon import nn
from tests._helpers import assert_close

SELU_ALPHA, SELU_LAMBDA = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # MXNet's
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_nn_extra", "nn_extra.npz")


def _device(ctx, request):
    return dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")


def _cases(prefix):
    """The fixture's cases of one op (prefix leaky or embed): {field: array} each, stored as <prefix>_<field><i>."""
    f = np.load(FIXTURE)
    cases: dict = {}
    for k in f.files:
        m = re.fullmatch(rf"{prefix}_([a-z]+)(\d+)", k)
        if m:
            cases.setdefault(int(m.group(2)), {})[m.group(1)] = f[k]
    return [cases[i] for i in sorted(cases)]


# -- against the real MXNet 1.9.1 -------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_leaky_relu_matches_mxnet(ctx, request):
    device = _device(ctx, request)
    for case in _cases("leaky"):
        params = eval(str(case["params"]))
        x = nd.array(case["x"], ctx=device)
        x.attach_grad()
        inputs = [x]
        if "gamma" in case:
            gamma = nd.array(case["gamma"], ctx=device)
            gamma.attach_grad()
            inputs.append(gamma)
        what = f"LeakyReLU {params}"
        if params["act_type"] == "rrelu":  # predict mode, the mean slope (MXNet's cpu rrelu crashes in training)
            y, mask = nd.LeakyReLU(*inputs, **params)
            assert_close(y, case["y"], rtol=1e-6, atol=1e-6, name=what)
            # MXNet leaves the mask unwritten in predict mode; dnnbind's holds the slope used
            assert_close(mask, np.full(x.shape, 0.2), rtol=1e-6, atol=0, name=f"{what} mask")
            continue
        with autograd.record():
            y = nd.LeakyReLU(*inputs, **params)
        y.backward(nd.array(case["dy"], ctx=device))
        assert_close(y, case["y"], rtol=1e-5, atol=1e-6, name=what)
        dx_mx = case["dx"]
        if params["act_type"] == "selu":
            # MXNet 1.9.1's selu_grad scales its output's branch by lambda twice: lambda * (alpha + y) below 0, where
            # the derivative is y + lambda * alpha. dnnbind gives the derivative (tests/test_opdefs.py checks it by
            # central differences); the fixture shows MXNet's formula, and agrees above 0.
            xn, yn, dy = case["x"].astype(np.float64), case["y"].astype(np.float64), case["dy"].astype(np.float64)
            neg = xn <= 0
            assert_close(dx_mx[neg], (SELU_LAMBDA * (SELU_ALPHA + yn) * dy)[neg], 1e-5, 1e-6, name="MXNet's selu_grad")
            dx_mx = np.where(neg, SELU_LAMBDA * SELU_ALPHA * np.exp(np.minimum(xn, 0)) * dy, dx_mx)
        assert_close(x.grad, dx_mx, rtol=1e-5, atol=1e-6, name=f"{what} gradient")
        if "gamma" in case:
            assert_close(gamma.grad, case["dgamma"], rtol=1e-5, atol=1e-5, name=f"{what} gamma gradient")


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_embedding_matches_mxnet(ctx, request):
    device = _device(ctx, request)
    for case in _cases("embed"):
        params = eval(str(case["params"]))
        data = nd.array(case["data"], ctx=device, dtype=case["data"].dtype)
        weight = nd.array(case["weight"], ctx=device, dtype=case["weight"].dtype)
        data.attach_grad()
        weight.attach_grad()
        with autograd.record():
            y = nd.Embedding(data, weight, **params)
        y.backward(nd.array(case["dy"], ctx=device, dtype=case["dy"].dtype))
        what = f"Embedding {params} on indices {case['data'].tolist()}"
        assert y.dtype == case["y"].dtype, what
        assert_close(y, case["y"], rtol=0, atol=0, name=what)
        assert_close(weight.grad, case["dweight"], rtol=1e-6, atol=1e-6, name=f"{what} weight gradient")
        # MXNet refuses a gradient for the indices; here they get none (their buffer stays zero)
        assert_close(data.grad, np.zeros(data.shape), rtol=0, atol=0, name=f"{what} index gradient")


def test_symbol_nodes_match_mxnet_json():
    # each read off the real MXNet 1.9.1's tojson() (spaces dropped)
    want = {
        "rrelu": '{"nodes":[{"op":"null","name":"data","inputs":[]},{"op":"LeakyReLU","name":"l","attrs":{"act_type":'
                 '"rrelu"},"inputs":[[0,0,0]]}],"arg_nodes":[0],"node_row_ptr":[0,1,3],"heads":[[1,0,0],[1,1,0]],'
                 '"attrs":{"mxnet_version":["int",10901]}}',
        "prelu": '{"nodes":[{"op":"null","name":"data","inputs":[]},{"op":"null","name":"l_gamma","attrs":'
                 '{"__init__":"[\\"Constant\\", {\\"value\\": 0.25}]","act_type":"prelu"},"inputs":[]},{"op":'
                 '"LeakyReLU","name":"l","attrs":{"act_type":"prelu"},"inputs":[[0,0,0],[1,0,0]]}],"arg_nodes":[0,1],'
                 '"node_row_ptr":[0,1,2,3],"heads":[[2,0,0]],"attrs":{"mxnet_version":["int",10901]}}',
        "embedding": '{"nodes":[{"op":"null","name":"data","inputs":[]},{"op":"null","name":"e_weight","attrs":'
                     '{"input_dim":"4","output_dim":"3"},"inputs":[]},{"op":"Embedding","name":"e","attrs":'
                     '{"input_dim":"4","output_dim":"3"},"inputs":[[0,0,0],[1,0,0]]}],"arg_nodes":[0,1],'
                     '"node_row_ptr":[0,1,2,3],"heads":[[2,0,0]],"attrs":{"mxnet_version":["int",10901]}}',
    }
    got = {"rrelu": sym.LeakyReLU(sym.var("data"), act_type="rrelu", name="l"),
           "prelu": sym.LeakyReLU(sym.var("data"), act_type="prelu", name="l"),
           "embedding": sym.Embedding(sym.var("data"), input_dim=4, output_dim=3, name="e")}
    for k, s in got.items():
        assert json.loads(s.tojson()) == json.loads(want[k]), k
    assert got["rrelu"].list_outputs() == ["l_output", "l_mask"]
    assert got["rrelu"].infer_shape(data=(2, 3)) == ([(2, 3)], [(2, 3), (2, 3)], [])
    assert got["prelu"].list_arguments() == ["data", "l_gamma"]
    assert got["prelu"].infer_shape(data=(2, 3, 4)) == ([(2, 3, 4), (3,)], [(2, 3, 4)], [])
    # MXNet keeps a gamma of known shape (one slope for all)
    assert got["prelu"].infer_shape(data=(2, 3, 4), l_gamma=(1,)) == ([(2, 3, 4), (1,)], [(2, 3, 4)], [])
    assert sym.LeakyReLU(sym.var("data"), name="l").list_arguments() == ["data"]
    assert got["embedding"].infer_shape(data=(2, 5)) == ([(2, 5), (4, 3)], [(2, 5, 3)], [])


# -- rrelu: random slopes in train mode ---------------------------------------------------------------------------

def _rrelu_train(device, seed=None):
    x = nd.array(-np.abs(np.random.default_rng(0).standard_normal((40, 50))) - 0.1, ctx=device)
    x.attach_grad()
    if seed is not None:
        nd.random.seed(seed)
    with autograd.record():
        y, mask = nd.LeakyReLU(x, act_type="rrelu", lower_bound=0.1, upper_bound=0.3)
    y.backward(nd.ones(y.shape, ctx=device))
    return x.numpy(), y.numpy(), mask.numpy(), x.grad.numpy()


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_rrelu_draws_slopes_in_train_mode(ctx, request):
    device = _device(ctx, request)
    x, y, mask, dx = _rrelu_train(device, seed=5)
    assert mask.shape == x.shape and (mask >= 0.1).all() and (mask <= 0.3).all()
    assert mask.std() > 0.03 and abs(mask.mean() - 0.2) < 0.01  # uniform on [0.1, 0.3]: sd 0.058
    assert_close(y, x * mask, rtol=1e-6, atol=1e-7, name="rrelu output: x times its slope")
    assert_close(dx, mask, rtol=0, atol=0, name="rrelu gradient: the slope drawn")
    again = _rrelu_train(device, seed=5)
    assert_close(again[2], mask, rtol=0, atol=0, name="mx.random.seed repeats the draws")
    other = _rrelu_train(device)
    assert not np.array_equal(other[2], mask)
    xp = nd.array(np.array([-1.0, 2.0, -3.0]), ctx=device)  # positive inputs pass through
    with autograd.train_mode():
        y, mask = nd.LeakyReLU(xp, act_type="rrelu", lower_bound=0.25, upper_bound=0.5)
    assert y.numpy()[1] == 2.0 and (y.numpy()[[0, 2]] < 0).all()


def test_rrelu_predict_mode_uses_the_mean_slope():
    x = nd.array(np.array([-1.0, 2.0]))
    x.attach_grad()
    with autograd.record(train_mode=False):
        y, mask = nd.LeakyReLU(x, act_type="rrelu", lower_bound=0.1, upper_bound=0.3)
    y.backward()
    assert_close(y, np.array([-0.2, 2.0]), 1e-6, 1e-7)
    assert_close(mask, np.array([0.2, 0.2]), 1e-6, 0)
    assert_close(x.grad, np.array([0.2, 1.0]), 1e-6, 0)


def test_rrelu_refuses_bounds_it_cannot_draw_from():
    x = nd.array(np.array([-1.0, 2.0]))
    with autograd.train_mode():
        for lo, hi in ((0.3, 0.1), (0.1, float("inf")), (float("nan"), 0.3)):
            with pytest.raises(ValueError, match="lower_bound .* and upper_bound .* must be finite"):
                nd.LeakyReLU(x, act_type="rrelu", lower_bound=lo, upper_bound=hi)
        y, mask = nd.LeakyReLU(x, act_type="rrelu", lower_bound=0.2, upper_bound=0.2)  # one point: that slope
    assert_close(y, np.array([-0.2, 2.0]), 1e-6, 0)


# -- Embedding's indices ---------------------------------------------------------------------------------------

def test_embedding_clips_truncates_and_sums_repeated_rows():
    w = np.arange(12.0).reshape(4, 3)
    idx = np.array([-1, 9, 1.7, 2.5, -0.5, 3, 3])
    data, weight = nd.array(idx), nd.array(w)
    weight.attach_grad()
    with autograd.record():
        y = nd.Embedding(data, weight, input_dim=4, output_dim=3)
    y.backward(nd.ones(y.shape))
    rows = [0, 3, 1, 2, 0, 3, 3]
    assert_close(y, w[rows], 0, 0)
    assert_close(weight.grad, np.array([[2.0] * 3, [1.0] * 3, [1.0] * 3, [3.0] * 3]), 0, 0)
    ints = nd.Embedding(nd.array(np.array([[3, 0]]), dtype="int32"), weight, 4, 3)  # positional, like MXNet
    assert ints.dtype == np.float32 and ints.shape == (1, 2, 3)
    assert_close(ints, w[[[3, 0]]], 0, 0)


def test_refusals_name_the_problem():
    x = nd.array(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"needs gamma"):
        nd.LeakyReLU(x, act_type="prelu")
    with pytest.raises(ValueError, match=r"gamma \(3,\) was given but act_type='leaky' takes data only"):
        nd.LeakyReLU(x, nd.array(np.ones(3)))  # MXNet: "expects 1 inputs, but got 2"
    with pytest.raises(ValueError, match=r"gamma has shape \(2,\); expected \(1,\) or \(3,\)"):
        nd.LeakyReLU(x, nd.array(np.ones(2)), act_type="prelu")
    with pytest.raises(TypeError, match="gamma is float64 but data is float32"):
        nd.LeakyReLU(x, nd.array(np.ones(3), dtype="float64"), act_type="prelu")
    with pytest.raises(TypeError, match="floating-point"):
        nd.LeakyReLU(nd.array(np.ones(3), dtype="int32"))
    with pytest.raises(ValueError, match="value 0 for Parameter output_dim should be greater equal to 1"):
        nd.Embedding(nd.array([0.0]), nd.array(np.ones((3, 1))), input_dim=3, output_dim=0)
    with pytest.raises(ValueError, match=r"weight has shape \(3, 2\) but input_dim=4, output_dim=2 need \(4, 2\)"):
        nd.Embedding(nd.array([0.0]), nd.array(np.ones((3, 2))), input_dim=4, output_dim=2)


# -- Gluon's layers on the entries ------------------------------------------------------------------------------

def test_gluon_layers_forward_and_learn():
    x = nd.array(np.random.default_rng(3).standard_normal((2, 3, 4)))
    p = nn.PReLU(in_channels=3)
    p.initialize()
    with autograd.record():
        y = p(x)
    y.backward()
    xn = x.numpy()
    assert_close(y, np.where(xn > 0, xn, 0.25 * xn), 1e-6, 1e-7)
    assert_close(p.alpha.grad(), np.where(xn > 0, 0, xn).sum(axis=(0, 2)), 1e-5, 1e-6)
    for layer, want in ((nn.LeakyReLU(0.1), np.where(xn > 0, xn, 0.1 * xn)),
                        (nn.ELU(0.5), np.where(xn > 0, xn, 0.5 * np.expm1(np.minimum(xn, 0)))),
                        (nn.SELU(), 1.0507009873554805 * np.where(xn > 0, xn, 1.6732632423543772
                                                                 * np.expm1(np.minimum(xn, 0))))):
        assert_close(layer(x), want, 1e-5, 1e-6, name=type(layer).__name__)
    assert nn.GELU()(x).shape == x.shape
    emb = nn.Embedding(5, 2)
    emb.initialize()
    assert emb(nd.array([[4.0, 0.0]])).shape == (1, 2, 2)
