"""gluon.SymbolBlock: models MXNet 1.9.1 exported (tests/fixtures/mxnet_models: a Gluon HybridBlock's export, a
Module checkpoint, two hand-written legacy files) run in dnnbind and give MXNet's outputs; a loaded graph trains
(autograd through it, checked by central differences) and hybridizes."""

from __future__ import annotations

import json

import pathlib

import numpy as np
import pytest

import dnnbind as mx
import dnnbind.symbol as sym
from dnnbind import autograd, gluon, nd
from dnnbind._lib.errors import DnnbindTypeError, DnnbindValueError
from dnnbind.features import UnsupportedFeature

MODELS = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_models"
CPU = mx.cpu()

# (name, the graph's inputs, the parameter file's epoch)
FILES = [("twobranch", ["data"], 0), ("lenet_module", ["data", "softmax_label"], 1),
         ("legacy_v1_0", ["data"], 0), ("legacy_v0_8", ["data", "softmax_label"], 0)]


def _load(name, inputs, epoch, ctx):
    return gluon.SymbolBlock.imports(str(MODELS / f"{name}-symbol.json"), inputs,
                                     str(MODELS / f"{name}-{epoch:04d}.params.bin"), ctx=ctx)


def _check_outputs(name, inputs, epoch, ctx, rtol):
    io = dict(np.load(MODELS / f"{name}-io.npz"))
    net = _load(name, inputs, epoch, ctx)
    batch = io["data"].shape[0]  # a label MXNet ran without (inference) is any: SoftmaxOutput's forward ignores it
    out = net(*[nd.array(io[i] if i in io else np.zeros(batch, np.float32), ctx=ctx) for i in inputs])
    outs = out if isinstance(out, list) else [out]
    want = [io[k] for k in sorted(k for k in io if k not in inputs)]
    assert len(outs) == len(want)
    for got, w in zip(outs, want):
        assert got.shape == w.shape
        np.testing.assert_allclose(got.asnumpy(), w, rtol=rtol, atol=rtol * np.abs(w).max())


@pytest.mark.parametrize("name, inputs, epoch", FILES)
def test_mxnets_files_give_mxnets_outputs_on_the_cpu(name, inputs, epoch):
    _check_outputs(name, inputs, epoch, CPU, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name, inputs, epoch", FILES)
def test_mxnets_files_give_mxnets_outputs_on_the_gpu(name, inputs, epoch):
    _check_outputs(name, inputs, epoch, mx.gpu(0), 1e-4)


def test_parameters_are_named_as_in_the_graph_and_loaded():
    net = _load("twobranch", ["data"], 0, CPU)
    s = sym.load(str(MODELS / "twobranch-symbol.json"))
    params = net.collect_params()
    assert sorted(params.keys()) == sorted([a for a in s.list_arguments() if a != "data"]
                                           + s.list_auxiliary_states())
    for a in s.list_auxiliary_states():
        assert params[a].grad_req == "null"
    assert all(p.grad_req == "write" for k, p in params.items() if k not in s.list_auxiliary_states())


def _tiny():
    with sym.NameManager():
        d = sym.var("data")
        h = sym.Activation(sym.FullyConnected(d, num_hidden=4, name="fc1"), act_type="tanh")
        return sym.FullyConnected(h * 0.5 + 1, num_hidden=2, name="fc2")


def _tiny_block(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    net = gluon.SymbolBlock(_tiny(), sym.var("data"))
    shapes = {"fc1_weight": (4, 3), "fc1_bias": (4,), "fc2_weight": (2, 4), "fc2_bias": (2,)}
    net.collect_params().load_dict({k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()},
                                   ctx=CPU, cast_dtype=True, dtype_source="saved")
    return net


def test_gradients_through_a_loaded_graph_match_central_differences():
    net = _tiny_block(np.float64)
    x = nd.array(np.random.default_rng(1).standard_normal((5, 3)), ctx=CPU, dtype=np.float64)
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    w = net.collect_params()["fc1_weight"]
    analytic = w.grad().asnumpy()
    base = w.data().asnumpy().copy()
    eps, numeric = 1e-6, np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        for sign in (1, -1):
            v = base.copy()
            v[idx] += sign * eps
            w.set_data(nd.array(v, ctx=CPU, dtype=np.float64))
            numeric[idx] += sign * float((net(x) ** 2).sum().asscalar()) / (2 * eps)
    w.set_data(nd.array(base, ctx=CPU, dtype=np.float64))
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_a_loaded_graph_trains_and_hybridizes():
    net = _tiny_block()
    x = nd.array(np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32), ctx=CPU)
    eager = net(x).asnumpy()
    net.hybridize()
    for _ in range(3):
        np.testing.assert_allclose(net(x).asnumpy(), eager, rtol=1e-6)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    losses = []
    for _ in range(5):
        with autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
        trainer.step(1)
        losses.append(float(loss.asscalar()))
    assert losses[-1] < losses[0]


def test_a_module_checkpoint_trains_through_its_softmax_output():
    net = _load("lenet_module", ["data", "softmax_label"], 1, CPU)
    rng = np.random.default_rng(3)
    x = nd.array(rng.standard_normal((16, 1, 10, 10)).astype(np.float32), ctx=CPU)
    y = nd.array(rng.integers(0, 5, 16).astype(np.float32), ctx=CPU)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    nll = []
    for _ in range(8):
        with autograd.record():
            p = net(x, y)  # SoftmaxOutput's forward is the softmax; its backward the cross-entropy gradient
        p.backward()
        trainer.step(16)
        nll.append(float(-np.log(p.asnumpy()[np.arange(16), y.asnumpy().astype(int)]).mean()))
    assert nll[-1] < nll[0] * 0.8, nll


def test_initialize_then_call_infers_the_parameter_shapes_as_mxnet():
    net = gluon.SymbolBlock(_tiny(), sym.var("data"))
    net.initialize(ctx=CPU)
    out = net(nd.array(np.ones((5, 3), np.float32), ctx=CPU))
    assert out.shape == (5, 2)
    shapes = {k: p.shape for k, p in net.collect_params().items()}
    assert shapes == {"fc1_weight": (4, 3), "fc1_bias": (4,), "fc2_weight": (2, 4), "fc2_bias": (2,)}
    with pytest.raises(RuntimeError, match="has not been initialized"):  # MXNet's RuntimeError too
        gluon.SymbolBlock(_tiny(), sym.var("data")).collect_params()["fc1_weight"].data()


def test_bad_uses_are_refused_naming_the_problem():
    d = sym.var("data")
    with pytest.raises(DnnbindValueError, match="'label' is not an input of the graph"):
        gluon.SymbolBlock(sym.Activation(d, act_type="relu"), sym.var("label"))
    with pytest.raises(DnnbindTypeError, match="inputs must be variables"):
        gluon.SymbolBlock(sym.Activation(d, act_type="relu"), sym.Activation(d, act_type="relu"))
    # an operator dnnbind cannot run (MXNet's "Correlation"): a symbol file naming it is refused at load, naming the
    # node and the operator; a graph holding it is refused by SymbolBlock, naming them too
    doc = json.loads(sym.Activation(d, act_type="relu", name="act").tojson())
    for node in doc["nodes"]:
        if node["op"] == "Activation":
            node["op"], node["attrs"] = "Correlation", {}
    with pytest.raises(DnnbindValueError, match="node 'act' uses operator 'Correlation', which dnnbind does not"):
        sym.load_json(json.dumps(doc))
    # a Custom node whose op_type is not registered is refused at load, as in MXNet
    for node in doc["nodes"]:
        if node["op"] == "Correlation":
            node["op"], node["attrs"] = "Custom", {"op_type": "mine"}
    with pytest.raises(DnnbindValueError, match="Cannot find custom operator mine"):
        sym.load_json(json.dumps(doc))
    custom = sym.Activation(d, act_type="relu", name="act")
    next(n for n in custom._topo() if n.op == "Activation").op = "Correlation"
    with pytest.raises(UnsupportedFeature, match=r"operators dnnbind cannot run yet: Correlation \(node 'act'\)"):
        gluon.SymbolBlock(custom, d)
    with pytest.raises(DnnbindValueError, match="1 input\\(s\\) expected"):
        _tiny_block()(nd.ones((2, 3), ctx=CPU), nd.ones((2, 3), ctx=CPU))
