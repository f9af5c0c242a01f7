"""``mx.mod.Module`` and ``mx.callback`` against what MXNet 1.9.1 did (tests/fixtures/mxnet_module/make_fixtures.py,
run with the real MXNet): the same MLP, data and initial parameters, trained with ``fit`` and by hand, must end
with MXNet's parameters, scores, predictions and log lines. CPU only."""

import json
import logging
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from dnnbind import callback, model, nd, symbol as sym
from dnnbind import module as mod_api
from dnnbind.gluon import metric
from dnnbind.io import NDArrayIter
from dnnbind.runtime.array import array

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "mxnet_module"
MODELS = ROOT / "tests" / "fixtures" / "mxnet_models"
Z = np.load(FIX / "mlp.npz")
EXPECTED = json.loads((FIX / "expected.json").read_text())
PARAMS = ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def mlp():
    data = sym.var("data")
    fc1 = sym.FullyConnected(data, name="fc1", num_hidden=16)
    act1 = sym.Activation(fc1, name="relu1", act_type="relu")
    fc2 = sym.FullyConnected(act1, name="fc2", num_hidden=5)
    return sym.SoftmaxOutput(fc2, name="softmax")


def iters():
    train = NDArrayIter(Z["train_x"], Z["train_y"], batch_size=16, shuffle=False)
    val = NDArrayIter(Z["val_x"], Z["val_y"], batch_size=16, shuffle=False)
    return train, val


def init_params():
    return {name: array(Z["init_" + name]) for name in PARAMS}


def assert_close(actual, expected, what, rtol=1e-4, atol=1e-6):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    err = np.abs(actual - expected)
    bad = err > atol + rtol * np.abs(expected)
    assert not bad.any(), (f"{what}: max error {err.max():.3g} (rtol {rtol}, atol {atol}) first bad index "
                           f"{np.argwhere(bad)[0].tolist()}")


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def fitted(tag="fit", opt_params=None):
    logger = logging.getLogger("test_module_" + tag)
    logger.setLevel(logging.INFO)
    handler = Lines()
    logger.addHandler(handler)
    train, val = iters()
    mod = mod_api.Module(mlp(), logger=logger)
    mod.fit(train, eval_data=val, optimizer="sgd", num_epoch=2, eval_metric="acc", arg_params=init_params(),
            optimizer_params=opt_params or {"learning_rate": 0.1, "momentum": 0.9})
    logger.removeHandler(handler)
    return mod, val, handler.lines


@pytest.mark.parametrize("tag, opt_params", [
    ("fit", {"learning_rate": 0.1, "momentum": 0.9}),
    # weight decay: MXNet's optimizer exempts the biases of a Module (wd_mult 0 unless *_weight / *_gamma)
    ("fit_wd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}),
])
def test_fit_matches_mxnet(tag, opt_params):
    mod, val, lines = fitted(tag, opt_params)
    arg, aux = mod.get_params()
    assert sorted(arg) == sorted(PARAMS) and aux == {}
    for name in PARAMS:
        assert arg[name].device.kind == "cpu"
        assert_close(arg[name].asnumpy(), Z[f"{tag}_{name}"], f"{tag} {name}")
    exp = EXPECTED[tag]
    assert [ln for ln in lines if "Time cost" not in ln] == exp["log"]
    assert sum("Time cost=" in ln for ln in lines) == 2
    score = mod.score(val, "acc")
    assert [n for n, _ in score] == [n for n, _ in exp["score"]]
    assert_close([v for _, v in score], [v for _, v in exp["score"]], "score acc")
    ce = mod.score(val, metric.create("ce"))
    assert_close([v for _, v in ce], [v for _, v in exp["score_ce"]], "score ce")
    pred = mod.predict(val)
    assert_close(pred.asnumpy(), Z[f"{tag}_predict"], "predict")
    batches = mod.predict(val, merge_batches=False)
    assert [[list(o.shape) for o in b] for b in batches] == exp["predict_batches"]  # last batch's pad cut off
    assert [[n, list(s)] for n, s in mod.output_shapes] == exp["output_shapes"]
    assert [[d.name, list(d.shape)] for d in mod.data_shapes] == exp["data_shapes"]
    assert [[d.name, list(d.shape)] for d in mod.label_shapes] == exp["label_shapes"]
    assert mod.output_names == exp["output_names"]


def test_lower_half_loop_equals_fit():
    train, _ = iters()
    mod = mod_api.Module(mlp())
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
    assert mod.binded and not mod.params_initialized
    mod.init_params(arg_params=init_params())
    mod.init_optimizer(optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    assert mod.optimizer_initialized
    assert mod._optimizer.rescale_grad == EXPECTED["rescale_grad"]
    assert {str(k): v for k, v in mod._optimizer.idx2name.items()} == EXPECTED["idx2name"]
    acc = metric.create("acc")
    accs = []
    for _ in range(2):
        acc.reset()
        for batch in train:
            mod.forward(batch)
            mod.update_metric(acc, batch.label)
            mod.backward()
            mod.update()
        accs.append(acc.get()[1])
        train.reset()
    assert_close(accs, EXPECTED["loop_acc"], "loop accuracy")
    arg, _ = mod.get_params()
    for name in PARAMS:
        assert_close(arg[name].asnumpy(), Z["loop_" + name], name)
        assert_close(arg[name].asnumpy(), Z["fit_" + name], name)


def test_input_grads_and_outputs():
    train, _ = iters()
    mod = mod_api.Module(mlp())
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label, inputs_need_grad=True)
    mod.init_params(arg_params=init_params())
    mod.forward_backward(next(iter(train)))
    assert_close(mod.get_outputs()[0].asnumpy(), Z["first_output"], "output")
    assert_close(mod.get_input_grads()[0].asnumpy(), Z["input_grad"], "input grad")


def test_errors_and_warnings_like_mxnet():
    errors = EXPECTED["errors"]
    mod = mod_api.Module(mlp())
    with pytest.raises(AssertionError, match=errors["init_params"][1]):
        mod.init_params()
    train, _ = iters()
    batch = next(iter(train))
    for call in (lambda: mod.forward(batch), mod.get_params, mod.init_optimizer):
        with pytest.raises(AssertionError, match="call bind"):
            call()
    with pytest.raises(ValueError) as err:
        mod_api.Module(mlp(), data_names=("x",))
    assert str(err.value) == errors["data_names"][1]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod_api.Module(mlp(), label_names=("y",))
    assert [str(x.message) for x in w] == errors["label_names_warning"]
    mod = mod_api.Module(mlp())
    mod.bind(data_shapes=[("data", (16, 20))], label_shapes=[("softmax_label", (16,))])
    with pytest.raises(RuntimeError, match=f"^{errors['missing_param'][1]}$"):
        mod.init_params(arg_params={"fc1_weight": init_params()["fc1_weight"]})
    mod.init_params()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod.init_params()
    assert [str(x.message) for x in w] == errors["init_twice_warning"]


def test_checkpoint_round_trip_resumes_training(tmp_path):
    """One epoch, save with the optimizer states, load, one more epoch: MXNet's two-epoch result."""
    train, _ = iters()
    mod = mod_api.Module(mlp())
    mod.fit(train, num_epoch=1, arg_params=init_params(),
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    prefix = str(tmp_path / "mlp")
    mod.save_checkpoint(prefix, 1, save_optimizer_states=True)
    assert {p.name for p in tmp_path.iterdir()} == {"mlp-symbol.json", "mlp-0001.params", "mlp-0001.states"}
    sym_, arg, aux = model.load_checkpoint(prefix, 1)
    assert sym_.list_arguments() == mlp().list_arguments()
    for name in PARAMS:
        assert_close(arg[name].asnumpy(), mod.get_params()[0][name].asnumpy(), name, rtol=0, atol=0)

    loaded = mod_api.Module.load(prefix, 1, load_optimizer_states=True)
    assert loaded.params_initialized and not loaded.binded
    train.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fit's init_params on loaded parameters: "already initialized"
        loaded.fit(train, begin_epoch=1, num_epoch=2, optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    for name in PARAMS:
        assert_close(loaded.get_params()[0][name].asnumpy(), Z["fit_" + name], name)

    # save_params / load_params / set_params
    other = mod_api.Module(mlp())
    other.bind(data_shapes=[("data", (16, 20))], label_shapes=[("softmax_label", (16,))])
    other.init_params()
    loaded.save_params(str(tmp_path / "p.params"))
    other.load_params(str(tmp_path / "p.params"))
    for name in PARAMS:
        assert_close(other.get_params()[0][name].asnumpy(), Z["fit_" + name], name)


def test_lenet_checkpoint_from_mxnet_predicts_mxnet_outputs(tmp_path):
    shutil.copy(MODELS / "lenet_module-symbol.json", tmp_path / "lenet_module-symbol.json")
    shutil.copy(MODELS / "lenet_module-0001.params.bin", tmp_path / "lenet_module-0001.params")
    io = np.load(MODELS / "lenet_module-io.npz")
    mod = mod_api.Module.load(str(tmp_path / "lenet_module"), 1)
    it = NDArrayIter(io["data"], None, batch_size=8)
    mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label, for_training=False)
    assert_close(mod.predict(it).asnumpy(), io["output"], "lenet predict", rtol=1e-4, atol=1e-5)
    assert_close(mod.predict(nd.array(io["data"])).asnumpy(), io["output"], "lenet predict(array)", atol=1e-5)


def test_callbacks(tmp_path, caplog):
    train, _ = iters()
    mod = mod_api.Module(mlp())
    seen = []
    with caplog.at_level(logging.INFO):
        mod.fit(train, num_epoch=2, arg_params=init_params(),
                optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
                batch_end_callback=[callback.Speedometer(16, 2, auto_reset=False), callback.log_train_metric(3),
                                    lambda p: seen.append((p.epoch, p.nbatch))],
                epoch_end_callback=callback.do_checkpoint(str(tmp_path / "cb"), period=2))
    assert seen == [(e, b) for e in range(2) for b in range(7)]
    text = caplog.text
    assert "Epoch[1] Batch [0-6]\tSpeed:" in text and "samples/sec\taccuracy=" in text
    assert "Iter[0] Batch[3] Train-accuracy=" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cb-0002.params", "cb-symbol.json"]
    _, arg, _ = model.load_checkpoint(str(tmp_path / "cb"), 2)
    for name in PARAMS:
        assert_close(arg[name].asnumpy(), Z["fit_" + name], name)


def test_mnist_mlp_example_runs_through_the_alias(tmp_path):
    """MXNet's example/module/mnist_mlp.py (random data instead of MNIST), unchanged, under the alias."""
    out = subprocess.run([sys.executable, "-m", "dnnbind.mxnet", str(FIX / "mnist_mlp.py")], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "predict shape (250, 10)" in out.stdout and "validation Accuracy:" in out.stdout
    assert "Epoch[1] Validation-accuracy=" in out.stderr and "Epoch[1] Time cost=" in out.stderr
    assert (tmp_path / "mnist_mlp-0002.params").exists()


def test_alias_serves_mod_and_callback():
    code = ("import dnnbind; mx = dnnbind.install_mxnet_alias(); import mxnet.module, mxnet.callback\n"
            "import dnnbind.module, dnnbind.callback\n"
            "assert mx.mod is dnnbind.module and mx.module is dnnbind.module and mxnet.module is dnnbind.module\n"
            "assert mx.callback is dnnbind.callback and mx.mod.Module is dnnbind.module.Module\n"
            "assert mx.model.BatchEndParam(0, 1, None, None).nbatch == 1\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
