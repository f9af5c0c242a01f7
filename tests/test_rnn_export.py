"""Recurrent models as files, both ways with MXNet 1.9.1: a HybridBlock with Gluon GRU and LSTM layers that MXNet
exported (fixtures/mxnet_rnn_export, written by make_mxnet_rnn_export.py: ``_rnn_param_concat``, ``_zeros`` begin
states of batch 0 that shape inference fills in, ``SwapAxis`` for NTC) runs in dnnbind's SymbolBlock with MXNet's
outputs; dnnbind's export of such a model loads in MXNet with dnnbind's outputs (checked when the real MXNet is at
/tmp/mx/bin/python)."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

import dnnbind
from dnnbind import gluon, nd
from dnnbind.gluon import nn, rnn

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_rnn_export")
MXNET_PYTHON = "/tmp/mx/bin/python"
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _imported(tmp_path, ctx):
    shutil.copy(os.path.join(HERE, "net-symbol.json"), tmp_path / "net-symbol.json")
    shutil.copy(os.path.join(HERE, "net-0000.params.bin"), tmp_path / "net-0000.params")
    return gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data"], str(tmp_path / "net-0000.params"),
                                     ctx=ctx)


@pytest.mark.parametrize("device", DEVICES)
def test_an_rnn_model_mxnet_exported_runs_with_mxnets_outputs(tmp_path, device):
    ctx = dnnbind.gpu(0) if device == "gpu" else dnnbind.cpu()
    io = np.load(os.path.join(HERE, "io.npz"))
    net = _imported(tmp_path, ctx)
    y = net(nd.array(io["x"], ctx=ctx)).asnumpy()
    np.testing.assert_allclose(y, io["y"], rtol=1e-4 if device == "gpu" else 1e-5, atol=1e-6)
    # another batch size: the begin states follow it (their batch dim is 0 in the file)
    x3 = np.concatenate([io["x"], io["x"][:1]])
    y3 = net(nd.array(x3, ctx=ctx)).asnumpy()
    np.testing.assert_allclose(y3[:2], io["y"], rtol=1e-4 if device == "gpu" else 1e-5, atol=1e-6)


def test_the_imported_rnn_model_fine_tunes(tmp_path):
    net = _imported(tmp_path, dnnbind.cpu())
    io = np.load(os.path.join(HERE, "io.npz"))
    x = nd.array(io["x"])
    with dnnbind.autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    grads = {k: p.grad().asnumpy() for k, p in net.collect_params().items() if p.grad_req != "null"}
    assert grads and all(np.isfinite(g).all() for g in grads.values())
    assert any(np.abs(g).sum() > 0 for k, g in grads.items() if "gru" in k)


class _Net(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.lstm = rnn.LSTM(6, num_layers=2, bidirectional=True, input_size=4)
            self.out = nn.Dense(3, flatten=False)

    def hybrid_forward(self, F, x):
        return self.out(self.lstm(x))


@pytest.mark.skipif(not os.path.exists(MXNET_PYTHON), reason="the real MXNet (/tmp/mx/bin/python) is not here")
def test_dnnbinds_export_of_an_rnn_model_runs_in_mxnet(tmp_path):
    net = _Net()
    net.initialize(dnnbind.init.Xavier())
    x = np.random.RandomState(0).randn(5, 2, 4).astype(np.float32)
    net.hybridize()
    y = net(nd.array(x)).asnumpy()
    net.export(str(tmp_path / "lstmnet"))
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import mxnet as mx, numpy as np
        net = mx.gluon.SymbolBlock.imports('{tmp_path}/lstmnet-symbol.json', ['data'], '{tmp_path}/lstmnet-0000.params')
        np.save('{tmp_path}/y_mx.npy', net(mx.nd.array(np.load('{tmp_path}/x.npy'))).asnumpy())
    """)
    res = subprocess.run([MXNET_PYTHON, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "y_mx.npy"), y, rtol=1e-5, atol=1e-6)
