"""HybridBlock.export: Gluon Blocks (layers, HybridSequential, MXNet 1.x hybrid_forward Blocks, SymbolBlocks) traced
to MXNet's symbol + params files, which load back (SymbolBlock.imports) to the same outputs. The same files load
in the real MXNet 1.9.1 to the same outputs: tests/fixtures/mxnet_export/check_in_mxnet.py (run by hand; see its
docstring), which reported a largest difference of 9.5e-7 on 2026-11-27."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import gluon, nd, serialization
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.features import UnsupportedFeature
from dnnbind.gluon import nn

CPU = mx.cpu()


class TwoBranch(gluon.HybridBlock):
    """A GluonCV-style Block: children and F calls in hybrid_forward."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.a = nn.Conv2D(4, 3, padding=1, activation="relu")
            self.b = nn.HybridSequential()
            self.b.add(nn.Conv2D(4, 1, use_bias=False), nn.BatchNorm(), nn.Activation("tanh"))
            self.pool = nn.MaxPool2D()
            self.avg = nn.GlobalAvgPool2D()
            self.fc = nn.Dense(5)
            self.drop = nn.Dropout(0.5)
            self.scale = self.params.get("scale", shape=(1,), init=mx.init.Constant(0.5))

    def hybrid_forward(self, F, x, scale):
        y = F.concat(self.a(x), self.b(x), dim=1)
        y = F.broadcast_mul(self.pool(y), scale) + 1
        return F.broadcast_add(self.fc(self.drop(F.Flatten(y))), F.Flatten(self.avg(y)).sum(axis=1, keepdims=True))


def _models():
    seq = nn.HybridSequential()
    seq.add(nn.Conv2D(6, 3, strides=2), nn.BatchNorm(), nn.Activation("relu"), nn.AvgPool2D(ceil_mode=True),
            nn.Flatten(), nn.Dense(4, activation="sigmoid"), nn.Dense(2, use_bias=False))
    up = nn.HybridSequential()  # a transposed conv's output_padding is the node's adj (it changes the shape)
    up.add(nn.Conv2DTranspose(3, 3, strides=2, output_padding=1), nn.Activation("tanh"))
    return {"twobranch": TwoBranch(), "sequential": seq, "transposed": up}


def _x():
    return nd.array(np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32), ctx=CPU)


@pytest.mark.parametrize("name", ["twobranch", "sequential", "transposed"])
def test_exported_files_load_back_to_the_same_outputs(tmp_path, name):
    net = _models()[name]
    net.initialize(mx.init.Xavier(), ctx=CPU)
    x = _x()
    y = net(x).asnumpy()
    sym_file, param_file = net.export(str(tmp_path / name), epoch=3)
    assert param_file.endswith("-0003.params")
    loaded = serialization.load(param_file)
    assert all(k.startswith(("arg:", "aux:")) for k in loaded)
    graph = json.loads(open(sym_file).read())
    assert graph["nodes"][0] == {"op": "null", "name": "data", "inputs": []}
    assert {k[4:] for k in loaded if k.startswith("aux:")} == {
        p for p in net.collect_params() if p.endswith(("running_mean", "running_var"))}
    back = gluon.SymbolBlock.imports(sym_file, ["data"], param_file, ctx=CPU)
    np.testing.assert_allclose(back(x).asnumpy(), y, rtol=1e-6, atol=1e-6)
    # a re-export of the imported SymbolBlock is the same graph
    sym2, _ = back.export(str(tmp_path / f"{name}-again"))
    assert open(sym2).read() == open(sym_file).read()


def test_writes_for_mxnet(tmp_path):
    """The files check_in_mxnet.py loads into the real MXNet (kept under pytest's basetemp)."""
    x = _x()
    np.save(tmp_path / "x.npy", x.asnumpy())
    for name, net in _models().items():
        net.initialize(mx.init.Xavier(), ctx=CPU)
        np.save(tmp_path / f"{name}-out.npy", net(x).asnumpy())
        net.export(str(tmp_path / name))
    assert len(list(tmp_path.glob("*-symbol.json"))) == 3


def test_export_needs_known_shapes_and_traceable_blocks(tmp_path):
    net = nn.Dense(3)
    net.initialize(ctx=CPU)
    with pytest.raises(DnnbindValueError, match="has no shape yet: call the Block once"):
        net.export(str(tmp_path / "d"))
    emb = nn.Embedding(5, 3)
    emb.initialize(ctx=CPU)
    with pytest.raises(UnsupportedFeature, match="Embedding .* cannot be traced"):
        emb.export(str(tmp_path / "e"))


def test_elemwise_operators_refuse_to_broadcast_as_in_mxnet():
    import dnnbind.symbol as sym
    a, b = nd.ones((2, 5), ctx=CPU), nd.ones((2, 1), ctx=CPU)
    with pytest.raises(DnnbindValueError, match="elemwise_add: Incompatible attr at 1-th input"):
        nd.elemwise_add(a, b)
    net = gluon.SymbolBlock(sym.var("a") + sym.var("b"), [sym.var("a"), sym.var("b")])
    with pytest.raises(DnnbindValueError, match="Incompatible attr"):
        net(a, b)
    assert (a + b).shape == (2, 5)  # NDArray arithmetic broadcasts, as MXNet 1.x's does
