"""scripts/d2l_compare.py's model table: for every chapter-5 model, the dnnbind (Gluon) model builds, and its
parameters pair up in order, shape for shape, with the PyTorch twin's; the copied weights give the same logits.
Needs torch (skipped without it, as in CI); runs on the CPU."""

import importlib.util
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dnnbind  # noqa: E402
from dnnbind.mxnet import _finder  # noqa: E402

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "d2l_compare.py")


@pytest.fixture(scope="module")
def d2l_compare():
    """The script as a module; it installs the mxnet alias at import, undone (with sys.modules) afterwards."""
    meta, mods = list(sys.meta_path), dict(sys.modules)
    spec = importlib.util.spec_from_file_location("d2l_compare", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["d2l_compare"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    _finder.uninstall_mxnet_alias()
    sys.meta_path[:] = meta
    for name in [n for n in sys.modules if n not in mods and (n in ("mxnet", "d2l_compare") or n.startswith("mxnet."))]:
        del sys.modules[name]


# Gluon's parameter name -> torch's (a BatchNorm's gamma/beta are torch's weight/bias)
TORCH_NAME = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias",
              "running_mean": "running_mean", "running_var": "running_var"}
MODELS = ["lenet", "alexnet", "vgg", "nin", "googlenet", "resnet", "densenet", "batch-norm"]


def test_table_covers_the_chapter(d2l_compare):
    assert list(d2l_compare.SPECS) == MODELS
    book = {name: (s.size, s.lr, s.batch_size) for name, s in d2l_compare.SPECS.items()}
    assert book == {"lenet": (28, 0.9, 256), "alexnet": (224, 0.01, 128), "vgg": (224, 0.05, 128),
                    "nin": (224, 0.1, 128), "googlenet": (96, 0.1, 128), "resnet": (96, 0.05, 256),
                    "densenet": (96, 0.1, 256), "batch-norm": (28, 1.0, 256)}


@pytest.mark.parametrize("name", MODELS)
def test_parameters_pair_up_in_order(d2l_compare, name):
    spec = d2l_compare.SPECS[name]
    net = spec.build_mx()
    net.initialize(d2l_compare.INIT(), ctx=dnnbind.cpu())
    out = net(dnnbind.nd.zeros((1, 1, spec.size, spec.size), ctx=dnnbind.cpu()))
    assert out.shape == (1, 10)
    pairs = d2l_compare.paired_params(net, spec.build_torch().eval(), spec.size)
    assert pairs, name
    for gname, p, tname, t in pairs:
        assert p.shape == tuple(t.shape), f"{name}: {gname} {p.shape} vs torch {tname} {tuple(t.shape)}"
        kind = next(k for k in TORCH_NAME if gname.endswith("_" + k))  # MXNet's names: conv0_weight, ..._running_var
        assert TORCH_NAME[kind] == tname.rsplit(".", 1)[1], f"{name}: {gname} paired with {tname}"


@pytest.mark.parametrize("name", ["lenet", "resnet", "batch-norm"])
def test_copied_weights_give_the_same_logits(d2l_compare, name):
    spec = d2l_compare.SPECS[name]
    net, tnet, _ = d2l_compare.build_pair(spec, dnnbind.cpu(), seed=1)
    x = np.random.default_rng(0).random((4, 1, spec.size, spec.size), dtype=np.float32)
    ours = d2l_compare.logits_mx(net, x, dnnbind.cpu())
    theirs = d2l_compare.logits_torch(tnet, x, torch.device("cpu"))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_float64_twins_train_in_step(d2l_compare):
    """--float64: both frameworks' float64 copies start from the FP32 model's weights, and one SGD step on the same
    batch leaves them within float64 rounding of each other (1e-10), where FP32 would differ by ~1e-6. (LeNet: no
    BatchNorm, whose running variance follows another convention in torch.)"""
    spec = d2l_compare.SPECS["lenet"]
    net, tnet, _ = d2l_compare.build_pair(spec, dnnbind.cpu(), seed=2)
    twins = d2l_compare.float64_twins(spec, net, tnet, dnnbind.cpu())
    params = list(twins["net"].collect_params().values())
    assert {p.data().dtype for p in params} == {np.dtype(np.float64)}
    rng = np.random.default_rng(3)
    x, y = rng.random((16, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 16)
    d2l_compare.epoch_mx(twins["net"], twins["trainer"], x, y, 16, dnnbind.cpu(), "float64")
    d2l_compare.epoch_torch(twins["tnet"], twins["opt"], x, y, 16, torch.device("cpu"), "float64")
    state = [v for k, v in twins["tnet"].state_dict().items() if not k.endswith("num_batches_tracked")]
    moved = 0.0
    for p, t, p0 in zip(params, state, net.collect_params().values(), strict=True):
        ours, theirs = p.data().asnumpy(), t.detach().numpy()
        assert ours.dtype == theirs.dtype == np.float64
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12, err_msg=p.name)
        moved = max(moved, float(np.abs(ours - p0.data().asnumpy()).max()))
    assert moved > 1e-4  # the step did move the weights (lr 0.9)
