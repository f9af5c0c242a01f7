"""Every operator declared by an ``OpDef`` (dnnbind/ops/defs/), parametrized over the registry: a new entry is
tested by these without a line here. For each of the entry's sample calls:

- cpu: the nd function against shape inference (``infer``), the symbol executor against the nd function, and
  autograd against central differences (float64), in train mode and in predict mode (the differences taken in the
  mode the gradient was recorded in; auxiliary states, which MXNet gives no gradient, held fixed) except for an
  entry marked ``loss`` (an output layer: its backward is its own, checked against MXNet's in its own tests);
- bad input: an unknown argument, a parameter value MXNet's parser refuses, a required parameter left out;
- gpu: forward and every input gradient against the numpy twin, float32 and float64, in both modes.

Plus the entries' own fixtures from the real MXNet 1.9.1 (LRN: tests/fixtures/mxnet_lrn).
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from dnnbind.nd._schema import BOOL, ENUM, FLOAT, INT, SHAPE
from dnnbind.nd._mxnet_params import DECLARED
from dnnbind.nd._params import declared_params
from tests._helpers import assert_close, nd_gradcheck

LIB = sorted(name for name, op in nd.REGISTRY.items() if op.kind == "lib")
CASES = [(name, i) for name in LIB for i, _ in enumerate(nd.REGISTRY[name].opdef.samples(np.random.default_rng(0)))]


def _sample(name: str, i: int):
    d = nd.REGISTRY[name].opdef
    arrays, params = list(d.samples(np.random.default_rng(0)))[i]
    return d, arrays, params


def _call(name, arrays, params, ctx, dtype="float64"):
    xs = {k: (nd.array(v, ctx=ctx, dtype=dtype) if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    return getattr(nd, name)(**xs, **params)


def test_every_lib_op_has_samples():
    assert "LRN" in LIB
    for name in LIB:
        assert any(n == name for n, _ in CASES), f"{name} declares no sample calls"


@pytest.mark.parametrize("name,i", CASES)
def test_shape_inference_matches_the_forward(name, i):
    d, arrays, params = _sample(name, i)
    y = _call(name, arrays, params, dnnbind.cpu())
    y = y[0] if isinstance(y, tuple) else y
    p = nd.REGISTRY[name].schema.parse(params)
    _, outs = d.infer(p, [v.shape for v in arrays.values()])
    # 0 is MXNet's "unknown before running" (boolean_mask's count of the rows it keeps, read from the mask)
    assert len(outs[0]) == len(y.shape) and all(a in (b, 0) for a, b in zip(outs[0], y.shape)), (outs[0], y.shape)


@pytest.mark.parametrize("name,i", CASES)
def test_symbol_executor_matches_nd(name, i):
    d, arrays, params = _sample(name, i)
    mxnet_params = {k: v for k, v in params.items() if k not in dict(d.extra)}
    if mxnet_params != params:
        pytest.skip(f"{name} sample uses dnnbind's extra parameters")
    inputs = [sym.var(k) for k in arrays]
    s = getattr(sym, name)(*inputs, **params, name="op")
    given = {k: nd.array(v, dtype="float64") for k, v in arrays.items()}
    ex = s.bind(dnnbind.cpu(), {k: v for k, v in given.items() if k not in d.aux},
                aux_states={k: v for k, v in given.items() if k in d.aux})
    y = ex.forward(is_train=False)[0]
    expected = _call(name, arrays, params, dnnbind.cpu())
    assert_close(y, expected[0] if isinstance(expected, tuple) else expected, rtol=1e-12, atol=1e-12)


def _mode(train: bool):
    return autograd.train_mode() if train else autograd.predict_mode()


@pytest.mark.parametrize("train", [True, False], ids=["train", "predict"])
@pytest.mark.parametrize("name,i", CASES)
def test_gradients_by_central_differences(name, i, train):
    d, arrays, params = _sample(name, i)
    if d.cpu.backward is None:
        pytest.skip(f"{name} has no gradient")
    if d.loss:  # its gradient is MXNet's defined one, checked against MXNet's (tests/test_output_layers.py)
        pytest.skip(f"{name}'s backward is its own defined gradient, not the derivative of its forward")
    fixed = d.aux + d.nograd  # auxiliary states and inputs without a gradient (labels, indices) are held fixed
    names = [k for k in arrays if k not in fixed]
    aux = {k: v for k, v in arrays.items() if k in fixed}

    def fn(*xs):  # a fresh copy of each fixed input per call: the op may update it in place
        with _mode(train):
            y = getattr(nd, name)(**dict(zip(names, xs)), **{k: nd.array(v, ctx=dnnbind.cpu(), dtype="float64")
                                                            for k, v in aux.items()}, **params)
        return y[0] if isinstance(y, tuple) else y

    nd_gradcheck(fn, [arrays[k] for k in names], dnnbind.cpu(), rtol=1e-5, atol=1e-7)


def _bad_value(p):
    """A value MXNet's parser refuses for parameter ``p``, or None."""
    return {INT: "1.5", FLOAT: "x", BOOL: "maybe", SHAPE: "(1.5,)", ENUM: "no-such-choice"}.get(p.kind)


@pytest.mark.parametrize("name", LIB)
def test_bad_arguments_are_refused_before_running(name):
    d, arrays, params = _sample(name, 0)
    x = {k: nd.array(v) for k, v in arrays.items()}
    if not declared_params(name) and name in DECLARED:  # MXNet declares none: it ignores the keyword (warning)
        with pytest.warns(UserWarning, match=f"{name} takes no parameters: no_such_arg_{name}=1 is ignored"):
            getattr(nd, name)(**x, **params, **{f"no_such_arg_{name}": 1})
    else:
        with pytest.raises(dnnbind.UnknownArgumentError, match="Cannot find argument 'no_such_arg'"):
            getattr(nd, name)(**x, **params, no_such_arg=1)
    schema = nd.REGISTRY[name].schema
    for p in schema.params:
        bad = _bad_value(p)
        if bad is not None:
            with pytest.raises((TypeError, ValueError), match=p.name if p.kind != ENUM else "valid values"):
                getattr(nd, name)(**x, **dict(params, **{p.name: bad}))
    for p in schema.params:
        if p.required and p.name != nd.REGISTRY[name].count:  # (a variadic input count is filled in, as MXNet's)
            given = {k: v for k, v in params.items() if k != p.name}
            with pytest.raises(TypeError, match=f"Required parameter {p.name}"):
                getattr(nd, name)(**x, **given)


# Operators whose library computes in float32 whatever the data's type: float64 data is cast for the call and the
# result back, so the GPU matches the float64 twin to float32's precision only.
GPU_FLOAT32_ONLY = {"CTCLoss",  # cudnnCTCLoss_v8 takes float32 only
                    "_contrib_MultiBoxTarget"}  # its kernel encodes the box offsets in float, as MXNet's


@pytest.mark.gpu
@pytest.mark.parametrize("train", [True, False], ids=["train", "predict"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,i", CASES)
def test_gpu_lowering_matches_the_twin(name, i, dtype, train, gpu):
    d, arrays, params = _sample(name, i)
    results = {}
    for ctx in (dnnbind.cpu(), gpu):
        xs = {k: nd.array(v, ctx=ctx, dtype=dtype) for k, v in arrays.items()}
        for v in xs.values():
            v.attach_grad()
        with autograd.record(train_mode=train):
            y = getattr(nd, name)(**xs, **params)
        outs = y if isinstance(y, tuple) else (y,)
        y = outs[0]
        dy = np.random.default_rng(1).uniform(0.5, 1.5, y.shape)
        if d.cpu.backward is not None:
            y.backward(nd.array(dy, ctx=ctx, dtype=dtype))
        # every output, and every input after the call (an auxiliary state the op updates in place)
        results[ctx.kind] = ([o.numpy() for o in outs] + [v.numpy() for v in xs.values()],
                             [v.grad.numpy() if d.cpu.backward is not None else None for v in xs.values()])
    tol = 2e-5 if dtype == "float32" or name in GPU_FLOAT32_ONLY else 1e-10
    for k, (g, c) in enumerate(zip(*(results[kind][0] for kind in ("gpu", "cpu")))):
        assert_close(g, c, rtol=tol, atol=tol, name=f"{name} forward, output or updated input {k}")
    for k, (g, c) in enumerate(zip(results["gpu"][1], results["cpu"][1])):
        if c is not None:
            assert_close(g, c, rtol=tol * 10, atol=tol * 10, name=f"{name} gradient of input {k}")


# -- fixtures from the real MXNet 1.9.1 ---------------------------------------------------------------------------

def _lrn_cases():
    import os
    f = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_lrn", "lrn.npz"))
    return [(f[f"x{i}"], f[f"dy{i}"], f[f"y{i}"], f[f"dx{i}"], eval(str(f[f"params{i}"]))) for i in range(3)]


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_lrn_matches_mxnet(ctx, request):
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    for x, dy, y_mx, dx_mx, params in _lrn_cases():
        xa = nd.array(x, ctx=device)
        xa.attach_grad()
        with autograd.record():
            y = nd.LRN(xa, **params)
        y.backward(nd.array(dy, ctx=device))
        assert_close(y, y_mx, rtol=1e-5, atol=1e-6, name=f"LRN {params}")
        assert_close(xa.grad, dx_mx, rtol=1e-4, atol=1e-5, name=f"LRN gradient {params}")


def test_lrn_refuses_what_mxnet_cannot_compute():
    x = nd.array(np.random.default_rng(0).standard_normal((2, 5, 3, 4)))
    with pytest.raises(ValueError, match="nsize must be a positive odd number"):
        nd.LRN(x, nsize=4)
    with pytest.raises(ValueError, match=r"LRN: data must be 4-D \(N, C, H, W\), got shape \(2, 5, 3\)"):
        nd.LRN(x[:, :, :, 0], nsize=3)
    with pytest.raises(TypeError, match="floating-point"):
        nd.LRN(nd.array(np.ones((1, 3, 2, 2)), dtype="int32"), nsize=3)


def test_lrn_symbol_matches_mxnet_json_and_outputs():
    s = sym.LRN(sym.var("data"), nsize=3, name="lrn")
    assert s.list_outputs() == ["lrn_output"]
    assert s.infer_shape(data=(2, 5, 3, 4)) == ([(2, 5, 3, 4)], [(2, 5, 3, 4)], [])
    assert '"node_row_ptr": [0, 1, 3]' in s.tojson()  # MXNet's LRN node has a hidden second output


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_softmax_cross_entropy_operator_matches_mxnet(ctx, request):
    """MXNet's operator sums over the batch (shape (1,)) and truncates float class ids; Gluon's loss, which wants
    per-sample values, uses nd.softmax_ce_per_sample instead."""
    import os
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    f = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_xent", "xent.npz"))
    x = nd.array(f["x"], ctx=device)
    x.attach_grad()
    with autograd.record():
        loss = nd.softmax_cross_entropy(x, nd.array(f["label"], ctx=device))
    loss.backward(nd.array([2.0], ctx=device))
    assert loss.shape == (1,)
    assert_close(loss, f["loss"], rtol=1e-5, atol=1e-5, name="loss")
    assert_close(x.grad, f["dx"], rtol=1e-5, atol=1e-6, name="data gradient")
    with pytest.raises(ValueError, match="only accept 2D data"):
        nd.softmax_cross_entropy(nd.array(np.ones((2, 3, 4))), nd.array(np.zeros(2)))
