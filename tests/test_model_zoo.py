"""``dnnbind.gluon.model_zoo.vision`` (MXNet 1.9.1's 34 reference networks) against the real MXNet
(tests/fixtures/mxnet_model_zoo, written by tests/fixtures/make_mxnet_model_zoo.py):

- every network's collect_params() names and shapes, and save_parameters' keys, equal MXNet's. The shapes come
  from dnnbind's symbolic shape inference (the network traced with a Symbol input), so no network runs here: a
  forward of all 34 at 224x224 takes minutes on a CPU;
- four networks load a parameter file written by MXNet's save_parameters and reproduce MXNet's outputs;
- pretrained=True reads ``$MXNET_HOME/models/<name>-<hash>.params`` and never downloads.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind import symbol as sym
from dnnbind.gluon import nn
from dnnbind.gluon.model_zoo import model_store, vision
from tests._helpers import assert_close

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_model_zoo")
with gzip.open(os.path.join(HERE, "names.json.gz"), "rt") as _f:
    MX = json.load(_f)
IO = ["resnet18_v1", "mobilenet0.25", "squeezenet1.1", "densenet121"]


def _inferred_shapes(net, input_shape) -> dict:
    """Parameter name -> shape, by tracing ``net`` to a symbol graph and inferring shapes from the input's."""
    out = net(sym.var("data"))
    args, outs, aux = out.infer_shape(data=tuple(input_shape))
    shapes = dict(zip(out.list_arguments(), args))
    shapes.update(zip(out.list_auxiliary_states(), aux))
    return shapes, outs[0]


def test_fixture_lists_every_network():
    assert sorted(MX) == sorted(vision._models) and len(MX) == 34
    assert sorted(MX) == sorted(model_store._model_sha1)


@pytest.mark.parametrize("name", sorted(MX))
def test_names_and_shapes_match_mxnet(name):
    want = MX[name]
    net = vision.get_model(name)
    # MXNet's fixture built each network first in its process (prefix counter 0); here earlier tests may have
    # built others of the class: the same class hint, then any counter
    hint = re.sub(r"\d+_$", "", want["prefix"])
    assert re.fullmatch(re.escape(hint) + r"\d+_", net.prefix), (net.prefix, want["prefix"])
    shapes, out_shape = _inferred_shapes(net, want["input"])
    got = [[k.replace(net.prefix, want["prefix"], 1), list(shapes[k])] for k in net.collect_params()]
    assert len(got) == len(want["params"])
    for g, w in zip(got, want["params"]):
        assert g == w
    assert list(net._collect_params_with_prefix()) == want["structure"]  # save_parameters' keys
    assert list(out_shape) == want["output"]


def test_get_model_names_and_errors():
    assert isinstance(vision.get_model("ResNet18_V1"), vision.ResNetV1)  # case-insensitive, as MXNet
    with pytest.raises(ValueError, match=r"Model resnet19_v1 is not supported\. Available options are") as e:
        vision.get_model("resnet19_v1")
    assert "\tsqueezenet1.1" in str(e.value) and "\tmobilenetv2_0.25" in str(e.value)
    with pytest.raises(ValueError, match="Invalid number of layers"):
        vision.get_resnet(1, 19)
    with pytest.raises(ValueError, match="1.0 or 1.1 expected"):
        vision.SqueezeNet("1.2")


def test_family_kwargs():
    net = vision.resnet18_v1(classes=10, thumbnail=True, prefix="mine_")
    shapes, out = _inferred_shapes(net, (2, 3, 32, 32))
    assert out == (2, 10)
    assert shapes["mine_conv0_weight"] == (64, 3, 3, 3)  # thumbnail: a 3x3 stem
    assert shapes["mine_dense0_weight"] == (10, 512)
    net = vision.get_vgg(11, batch_norm=True, classes=7)
    assert any(k.endswith("batchnorm0_gamma") for k in net.collect_params())
    assert vision.get_model("densenet121", dropout=0.1, bn_size=2).features[4][0][1][2]._channels == 64
    assert vision.mobilenet_v2_0_5().features[0]._channels == 16


def test_empty_prefix_name_scope_is_mxnets():
    """A Block made with prefix='' opens no scope (MXNet's _BlockScope): layers made inside its name_scope() are
    numbered by the enclosing Block, so they cannot collide with the enclosing Block's own."""
    outer = nn.HybridSequential(prefix="outer_")
    with outer.name_scope():
        inner = nn.HybridSequential(prefix="")
        with inner.name_scope():
            inner.add(nn.Dense(2))
        last = nn.Dense(2)
    assert inner[0].prefix == "outer_dense0_" and last.prefix == "outer_dense1_"


def _load_mxnet_file(name, tmp_path):
    path = tmp_path / f"{name}.params"
    with lzma.open(os.path.join(HERE, f"{name}.params.xz")) as f:
        path.write_bytes(f.read())
    return path


def _check_outputs(name, tmp_path, device):
    io = np.load(os.path.join(HERE, f"{name}-io.npz"))
    net = vision.get_model(name)
    net.load_parameters(_load_mxnet_file(name, tmp_path), ctx=device)
    y = net(nd.array(io["x"], ctx=device)).asnumpy()
    # rtol 1e-4 of each value, plus 1e-4 of the largest (a logit near zero is a sum of cancelling terms)
    assert_close(y, io["y"], rtol=1e-4, atol=1e-4 * float(np.abs(io["y"]).max()), name=f"{name} output")
    return net


@pytest.mark.parametrize("name", IO)
def test_mxnet_params_file_gives_mxnets_outputs(name, tmp_path):
    _check_outputs(name, tmp_path, dnnbind.cpu())


@pytest.mark.gpu
def test_mxnet_params_file_gives_mxnets_outputs_gpu(tmp_path, gpu):
    _check_outputs("resnet18_v1", tmp_path, gpu)


def test_saved_file_round_trips(tmp_path):
    """dnnbind's save_parameters writes MXNet's keys (features.0.weight) and loads back into a fresh network."""
    io = np.load(os.path.join(HERE, "mobilenet0.25-io.npz"))
    net = _check_outputs("mobilenet0.25", tmp_path, dnnbind.cpu())
    net.save_parameters(str(tmp_path / "mine.params"))
    loaded = dnnbind.serialization.load(str(tmp_path / "mine.params"))
    assert list(loaded) == MX["mobilenet0.25"]["structure"]
    other = vision.mobilenet0_25()
    other.load_parameters(str(tmp_path / "mine.params"), ctx=dnnbind.cpu())
    y = other(nd.array(io["x"], ctx=dnnbind.cpu())).asnumpy()
    assert_close(y, io["y"], rtol=1e-4, atol=1e-4 * float(np.abs(io["y"]).max()), name="reloaded output")


def test_pretrained_missing_file_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    monkeypatch.delenv("MXNET_GLUON_REPO", raising=False)
    with pytest.raises(FileNotFoundError) as e:
        vision.squeezenet1_1(pretrained=True)
    msg = str(e.value)
    assert "squeezenet1.1-33ba0f93.params" in msg and str(tmp_path / "models") in msg
    assert "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/gluon/models/squeezenet1.1-33ba0f93.zip" in msg
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "elsewhere"))):
        vision.get_model("mobilenetv2_0.25", pretrained=True, root=str(tmp_path / "elsewhere"))
    assert not os.path.exists(tmp_path / "models")  # nothing created, nothing fetched
    with pytest.raises(ValueError, match="Pretrained model for resnet19_v1 is not available"):
        model_store.get_model_file("resnet19_v1")


def test_pretrained_loads_file_from_mxnet_home(tmp_path, monkeypatch):
    """A file under $MXNET_HOME/models with the published name loads; its sha1 is not the published one, so a
    ModelFileMismatchWarning says so (MXNet would download the file again; dnnbind loads what is there)."""
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    io = np.load(os.path.join(HERE, "mobilenet0.25-io.npz"))
    (tmp_path / "models").mkdir()
    target = tmp_path / "models" / "mobilenet0.25-9f83e440.params"
    target.write_bytes(_load_mxnet_file("mobilenet0.25", tmp_path).read_bytes())
    with pytest.warns(model_store.ModelFileMismatchWarning, match="9f83e440996887baf91a6aff1cccc1c903a64274"):
        net = vision.get_model("mobilenet0.25", pretrained=True)
    y = net(nd.array(io["x"])).asnumpy()
    assert_close(y, io["y"], rtol=1e-4, atol=1e-4 * float(np.abs(io["y"]).max()), name="pretrained output")
    # a file whose sha1 is the published one (here: the table made to say so) gives no warning
    sha1 = hashlib.sha1(target.read_bytes()).hexdigest()
    monkeypatch.setitem(model_store._model_sha1, "mobilenet0.25", sha1)
    published = target.rename(tmp_path / "models" / f"mobilenet0.25-{sha1[:8]}.params")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_store.get_model_file("mobilenet0.25") == str(published)


def test_pretrained_file_written_by_dnnbind(tmp_path):
    net = vision.squeezenet1_1()
    net.initialize(ctx=dnnbind.cpu())
    shapes, _ = _inferred_shapes(net, (1, 3, 224, 224))
    for k, p in net.collect_params().items():  # shapes from inference, values from the initializer
        p.shape = shapes[k]
    net.initialize(ctx=dnnbind.cpu(), force_reinit=True)
    net.save_parameters(str(tmp_path / f"squeezenet1.1-{model_store.short_hash('squeezenet1.1')}.params"))
    with pytest.warns(model_store.ModelFileMismatchWarning):
        other = vision.squeezenet1_1(pretrained=True, root=str(tmp_path))
    for (k, p), q in zip(net.collect_params().items(), other.collect_params().values()):
        np.testing.assert_array_equal(p.data().asnumpy(), q.data().asnumpy(), err_msg=k)
