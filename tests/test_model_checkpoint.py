"""mx.model's checkpoints: the pair Module.save_checkpoint wrote with MXNet 1.9.1 (tests/fixtures/mxnet_models/
lenet_module-*) loads, runs to MXNet's outputs, and saves back to the same bytes."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import gluon, model, nd
from dnnbind._lib.errors import DnnbindTypeError, DnnbindValueError

MODELS = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_models"


@pytest.fixture
def lenet(tmp_path):
    shutil.copy(MODELS / "lenet_module-symbol.json", tmp_path / "lenet-symbol.json")
    shutil.copy(MODELS / "lenet_module-0001.params.bin", tmp_path / "lenet-0001.params")
    return str(tmp_path / "lenet")


def test_load_checkpoint_gives_mxnets_symbol_and_parameters(lenet):
    sym, arg_params, aux_params = model.load_checkpoint(lenet, 1)
    assert sorted(arg_params) == sorted(a for a in sym.list_arguments() if a not in ("data", "softmax_label"))
    assert sorted(aux_params) == sorted(sym.list_auxiliary_states())
    net = gluon.SymbolBlock(sym, [mx.symbol.var("data"), mx.symbol.var("softmax_label")])
    net.collect_params().load_dict({**arg_params, **aux_params}, ctx=mx.cpu())
    io = np.load(MODELS / "lenet_module-io.npz")
    out = net(nd.array(io["data"], ctx=mx.cpu()), nd.zeros((io["data"].shape[0],), ctx=mx.cpu()))
    np.testing.assert_allclose(out.asnumpy(), io["output"], rtol=1e-5, atol=1e-6)


def test_save_checkpoint_writes_the_same_files_back(lenet, tmp_path):
    sym, arg_params, aux_params = model.load_checkpoint(lenet, 1)
    out = str(tmp_path / "again")
    model.save_checkpoint(out, 7, sym, arg_params, aux_params)
    assert pathlib.Path(out + "-symbol.json").read_text() == pathlib.Path(lenet + "-symbol.json").read_text()
    assert pathlib.Path(out + "-0007.params").read_bytes() == pathlib.Path(lenet + "-0001.params").read_bytes()
    again = model.load_params(out, 7)
    for a, b in zip(again, (arg_params, aux_params)):
        assert a.keys() == b.keys() and all(np.array_equal(a[k].asnumpy(), b[k].asnumpy()) for k in a)


def test_bad_checkpoints_are_refused(tmp_path, lenet):
    with pytest.raises(DnnbindValueError, match="non-negative int"):
        model.save_checkpoint(str(tmp_path / "x"), -1, None, {}, {})
    with pytest.raises(DnnbindTypeError, match="arg_params\\['w'\\] must be an NDArray"):
        model.save_checkpoint(str(tmp_path / "x"), 0, None, {"w": [1, 2]}, {})
    nd.save(str(tmp_path / "g-0000.params"), {"weight": nd.ones((2,), ctx=mx.cpu())})
    with pytest.raises(DnnbindValueError, match="neither arg:<name> nor aux:<name>"):
        model.load_params(str(tmp_path / "g"), 0)
    with pytest.raises(FileNotFoundError):
        model.load_checkpoint(str(tmp_path / "missing"), 0)
