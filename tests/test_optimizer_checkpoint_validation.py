"""Bad optimizer settings and damaged checkpoints (issue 21): every one is a single clear ValueError/TypeError.

1. NaN/inf/out-of-range/non-number hyperparameters of every registered optimizer (parametrized over the
   registry, so one added later is covered), of the lr schedulers, of ``set_learning_rate`` and of
   ``Trainer.step(batch_size)``; unknown keywords are MXNet's TypeError. MXNet 1.9.1 itself (checked) accepts
   almost all of these and trains to NaN weights; it rejects unknown keywords ("__init__() got an unexpected
   keyword argument 'learning_rat'") and, for SGD only, a NaN/inf lr or wd at the first update.
2. Truncated, bit-flipped, foreign and wrong-model files for ``Trainer.load_states``, ``nd.load`` /
   ``load_parameters`` and scripts/train.py's ``--resume`` checkpoints: one ValueError naming the file, nothing
   changed, no temporary files left; writes are atomic.
3. ``train.py --resume`` of a finished run: "nothing to do", exit 0.
CPU tests.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd, serialization
from dnnbind.gluon import Parameter, Trainer, nn
from dnnbind.gluon import _optimizer_base as B
from dnnbind.gluon import lr_scheduler as L
from dnnbind.gluon import optimizer as O
from dnnbind.gluon import utils as gutils

ROOT = Path(__file__).resolve().parents[1]
NAN, INF = float("nan"), float("inf")
OPTIMIZERS = sorted(B.REGISTRY)  # every registered optimizer, now and later


# -- 1. hyperparameters ---------------------------------------------------------------------------------------
def _accepted(cls) -> set:
    return set(B._signature(cls)[1])


def _bad_values(rule: dict) -> list:
    """Values the rule must reject: non-finite, just outside the range, and non-numbers."""
    low, high = rule.get("low"), rule.get("high")
    bad = [NAN, INF, -INF, "0.1", True, [0.1]]
    if not rule.get("none_ok"):
        bad.append(None)
    if low is not None:
        bad.append(low - 0.5)
        if rule.get("low_open"):
            bad.append(low)
    if high is not None:
        bad += [high + 0.5] + ([high] if rule.get("high_open") else [])
    return bad


def _good_value(rule: dict) -> float:
    low, high = rule.get("low", 0.0), rule.get("high")
    return (low + high) / 2 if high is not None else low + 0.5


BAD_CASES = [(name, arg, value) for name in OPTIMIZERS for arg in sorted(_accepted(B.REGISTRY[name]))
             if arg in B.HYPERPARAMETERS for value in _bad_values(B.HYPERPARAMETERS[arg])]


def test_every_float_hyperparameter_of_every_optimizer_has_a_rule():
    # A new optimizer (or a new argument) with a float default must get a range in HYPERPARAMETERS.
    for name in OPTIMIZERS:
        for klass in B.REGISTRY[name].__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for arg, p in inspect.signature(init).parameters.items():
                if isinstance(p.default, float):
                    assert arg in B.HYPERPARAMETERS, f"{name}: {arg} (default {p.default}) has no range rule"
    assert {"learning_rate", "wd", "momentum", "beta1", "beta2", "epsilon", "eps", "gamma1", "gamma2", "rho",
            "rescale_grad", "clip_gradient"} <= set(B.HYPERPARAMETERS)


def _check_message(exc, owner: str, arg: str, value) -> None:
    text = str(exc)
    assert owner in text and arg in text and repr(value) in text, text


@pytest.mark.parametrize("name,arg,value", BAD_CASES, ids=[f"{n}-{a}-{v!r}" for n, a, v in BAD_CASES])
def test_bad_hyperparameter_rejected_at_creation_and_by_trainer(name, arg, value):
    cls = B.REGISTRY[name]
    err = TypeError if value is None or isinstance(value, (str, bool, list)) else ValueError
    with pytest.raises(err) as info:
        O.create(name, **{arg: value})
    _check_message(info.value, cls.__name__, arg, value)
    with pytest.raises(err) as info:
        cls(**{arg: value})
    _check_message(info.value, cls.__name__, arg, value)
    p = Parameter("w_weight", shape=(3,))
    p.initialize()
    with pytest.raises(err) as info:
        Trainer([p], name, {arg: value})
    _check_message(info.value, cls.__name__, arg, value)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_in_range_values_train_to_finite_weights(name):
    cls = B.REGISTRY[name]
    args = {a: _good_value(B.HYPERPARAMETERS[a]) for a in _accepted(cls) if a in B.HYPERPARAMETERS}
    args.update({a: 0.0 for a in ("momentum", "beta1", "clip_gradient") if a in args})  # the closed ends
    p = Parameter("w_weight", shape=(4,))
    p.initialize()
    trainer = Trainer([p], name, args)
    for _ in range(2):
        with autograd.record():
            loss = (p.data() * nd.array(np.arange(4, dtype=np.float32))).sum()
        loss.backward()
        trainer.step(2)
    assert np.isfinite(p.data().numpy()).all()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_unknown_keyword_is_mxnets_type_error(name):
    # MXNet 1.9.1: create('sgd', learning_rat=0.1) and Trainer(params, 'sgd', {'learning_rat': 0.1}) both raise
    # TypeError("__init__() got an unexpected keyword argument 'learning_rat'").
    cls = B.REGISTRY[name]
    pattern = f"{cls.__name__}.__init__.. got an unexpected keyword argument 'learning_rat' .did you mean " \
              "'learning_rate'"
    with pytest.raises(TypeError, match=pattern):
        O.create(name, learning_rat=0.1)
    p = Parameter("w_weight", shape=(3,))
    p.initialize()
    with pytest.raises(TypeError, match=pattern):
        Trainer([p], name, {"learning_rat": 0.1})


def test_custom_optimizer_arguments_are_checked_too():
    class Mine(O.Optimizer):
        def __init__(self, momentum=0.5, **kwargs):
            super().__init__(**kwargs)
            self.momentum = momentum

    assert Mine(momentum=0.9, learning_rate=0.2).momentum == 0.9
    with pytest.raises(ValueError, match="Mine: momentum must be a finite number in .0, 1., got nan"):
        Mine(momentum=NAN)
    with pytest.raises(ValueError, match="Mine: wd must be a finite number >= 0, got inf"):
        Mine(wd=INF)
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentun'"):
        Mine(momentun=0.9)


@pytest.mark.parametrize("value", [NAN, INF, -0.1, "0.1", None])
def test_set_learning_rate_rejects_bad_values(value):
    p = Parameter("w_weight", shape=(3,))
    p.initialize()
    trainer = Trainer([p], "sgd", {"learning_rate": 0.1})
    with pytest.raises((ValueError, TypeError), match=f"SGD.set_learning_rate: lr must be .*got {value!r}"):
        trainer.set_learning_rate(value)
    assert trainer.learning_rate == 0.1
    trainer.set_learning_rate(0.0)  # 0 is a valid (frozen) learning rate
    assert trainer.learning_rate == 0.0


def _one_param_trainer(name="sgd", **kw):
    p = Parameter("w_weight", shape=(3,))
    p.initialize()
    p.set_data(nd.array(np.ones(3, np.float32)))
    trainer = Trainer([p], name, kw or {"learning_rate": 0.1})
    with autograd.record():
        loss = (p.data() * 2).sum()
    loss.backward()
    return p, trainer


@pytest.mark.parametrize("batch_size", [NAN, 0, -4, INF, "a", None, True])
@pytest.mark.parametrize("method", ["step", "update"])
def test_step_rejects_bad_batch_size_and_changes_nothing(batch_size, method):
    # MXNet 1.9.1: nan -> NaN weights, inf/-4 update quietly, 0 -> ZeroDivisionError, 'a'/None -> TypeError.
    p, trainer = _one_param_trainer()
    err = TypeError if batch_size is None or isinstance(batch_size, (str, bool)) else ValueError
    with pytest.raises(err, match=f"Trainer.step: batch_size must be .*got {batch_size!r}"):
        getattr(trainer, method)(batch_size)
    np.testing.assert_array_equal(p.data().numpy(), 1.0)
    getattr(trainer, method)(2)  # the gradient is still fresh: a good call goes through
    np.testing.assert_allclose(p.data().numpy(), 1.0 - 0.1 * 2 / 2, rtol=1e-6)


def test_a_float_batch_size_is_still_accepted():
    p, trainer = _one_param_trainer()
    trainer.step(2.5)  # MXNet accepts it too (rescale_grad = 1 / 2.5)
    np.testing.assert_allclose(p.data().numpy(), 1.0 - 0.1 * 2 / 2.5, rtol=1e-6)


def test_a_nan_learning_rate_from_a_scheduler_or_an_attribute_stops_the_step():
    class Broken(L.LRScheduler):
        def __call__(self, num_update):
            return NAN

    p, trainer = _one_param_trainer("sgd", lr_scheduler=Broken())
    with pytest.raises(ValueError, match="SGD, update 1.*the learning rate from Broken must be .*got nan"):
        trainer.step(2)
    np.testing.assert_array_equal(p.data().numpy(), 1.0)
    p, trainer = _one_param_trainer()
    trainer.optimizer.wd = NAN  # set by hand, past the constructor's check
    with pytest.raises(ValueError, match="wd must be a finite number >= 0, got nan"):
        trainer.step(2)
    np.testing.assert_array_equal(p.data().numpy(), 1.0)


SCHEDULERS = {
    "factor": lambda **kw: L.FactorScheduler(**{"step": 2, "factor": 0.5, **kw}),
    "multifactor": lambda **kw: L.MultiFactorScheduler(**{"step": [2, 4], "factor": 0.5, **kw}),
    "poly": lambda **kw: L.PolyScheduler(**{"max_update": 10, **kw}),
    "cosine": lambda **kw: L.CosineScheduler(**{"max_update": 10, **kw}),
}
SCHEDULER_ARGS = {
    "factor": ["base_lr", "factor", "step", "stop_factor_lr", "warmup_begin_lr"],
    "multifactor": ["base_lr", "factor", "warmup_begin_lr"],
    "poly": ["base_lr", "pwr", "final_lr", "warmup_begin_lr"],
    "cosine": ["base_lr", "final_lr", "warmup_begin_lr"],
}
SCHED_CASES = [(s, a, v) for s, args in SCHEDULER_ARGS.items() for a in args for v in (NAN, INF, -1.0, "x")]


@pytest.mark.parametrize("sched,arg,value", SCHED_CASES, ids=[f"{s}-{a}-{v!r}" for s, a, v in SCHED_CASES])
def test_scheduler_rejects_bad_numbers(sched, arg, value):
    # MXNet 1.9.1 accepts e.g. FactorScheduler(base_lr=nan), factor=nan, step=nan, PolyScheduler(pwr=nan):
    # NaN learning rates at the first update.
    kw = {arg: value}
    if arg == "warmup_begin_lr":
        kw["warmup_steps"] = 2
    with pytest.raises((ValueError, TypeError)) as info:
        SCHEDULERS[sched](**kw)
    assert arg in str(info.value) and repr(value) in str(info.value), str(info.value)


@pytest.mark.parametrize("kw", [{"warmup_steps": NAN}, {"warmup_steps": -1}, {"warmup_steps": True},
                                {"warmup_mode": "cubic"}, {"max_update": NAN}, {"max_update": 0}])
def test_warmup_and_max_update_are_checked(kw):
    with pytest.raises((ValueError, TypeError)):
        L.CosineScheduler(**{"max_update": 10, **kw})


def test_multifactor_steps_must_be_finite():
    with pytest.raises(ValueError, match=r"step\[1\] must be a finite number >= 1, got nan"):
        L.MultiFactorScheduler([2, NAN])


def test_valid_schedules_still_work():
    assert L.FactorScheduler(step=2, factor=0.0, base_lr=1.0)(3) == pytest.approx(1e-8)  # MXNet: stop_factor_lr
    assert L.PolyScheduler(10, base_lr=1.0, pwr=0)(5) == 1.0
    assert L.CosineScheduler(10, base_lr=0.0)(3) == 0.0


# -- 2. checkpoints -------------------------------------------------------------------------------------------
def _net(units=(4, 2)):
    net = nn.HybridSequential(prefix="net_")  # the same names every time (train.py keys by them)
    with net.name_scope():
        for i, u in enumerate(units):
            net.add(nn.Dense(u, in_units=units[i - 1] if i else 3))
    net.initialize()
    return net


def _trained(name="adam", units=(4, 2)):
    net = _net(units)
    trainer = Trainer(net.collect_params(), name, {"learning_rate": 0.1})
    for _ in range(2):
        with autograd.record():
            loss = net(nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))).sum()
        loss.backward()
        trainer.step(2)
    return net, trainer


def _snapshot(trainer):
    return [s.numpy().copy() for s in trainer._states], trainer._counts.copy(), trainer.optimizer.num_update


def _same(trainer, snap) -> bool:
    states, counts, num_update = snap
    return all(np.array_equal(a, s.numpy()) for a, s in zip(states, trainer._states)) and \
        np.array_equal(counts, trainer._counts) and num_update == trainer.optimizer.num_update


def _damaged(raw: bytes, n_flips: int = 400, seed: int = 0):
    """Truncations at many offsets, then single-bit flips: every byte of a small file, else every byte of each
    .npy header inside (numpy's parser meets them) and a random sample of the rest."""
    step = max(1, len(raw) // 120)
    for i in list(range(0, len(raw), step)) + [len(raw) - 1]:
        yield f"truncated at {i}", raw[:i]
    rs = np.random.RandomState(seed)
    if len(raw) <= n_flips:
        spots = list(range(len(raw)))
    else:
        headers = {i for m in re.finditer(re.escape(b"\x93NUMPY"), raw) for i in range(m.start(), m.start() + 128)}
        spots = sorted(headers | set(rs.choice(len(raw), n_flips, replace=False).tolist()))
        spots = [i for i in spots if i < len(raw)]
    for i in spots:
        b = bytearray(raw)
        b[i] ^= 1 << rs.randint(8)
        yield f"bit flipped at {i}", bytes(b)


def _only(folder: Path, names: set) -> None:
    left = {p.name for p in folder.iterdir()} - names
    assert not left, f"left behind: {sorted(left)}"


def test_load_states_of_damaged_files_is_one_value_error_naming_the_file(tmp_path):
    _, trainer = _trained("adam")
    good = tmp_path / "good.states"
    trainer.save_states(good)
    raw = good.read_bytes()
    before = _snapshot(trainer)
    bad = tmp_path / "bad.states"
    errors = 0
    for what, data in _damaged(raw):
        bad.write_bytes(data)
        try:
            trainer.load_states(bad)
        except ValueError as exc:
            errors += 1
            assert "bad.states" in str(exc), (what, str(exc))
            assert "allow_pickle" not in str(exc), (what, str(exc))
            assert _same(trainer, before), f"{what}: a failed load changed the Trainer"
        except Exception as exc:  # noqa: BLE001 - the point: nothing but ValueError may escape
            pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
        else:  # a harmless flip (a zip timestamp, ...): the state must be exactly the saved one
            assert _same(trainer, before), f"{what}: loaded without error but the state differs"
        _only(tmp_path, {"good.states", "bad.states"})
    assert errors > 100


@pytest.mark.parametrize("content,why", [
    (b"", "empty"), (b"hello, not a checkpoint at all", "not an npz archive"),
    (None, "single .npy array"), ("params", "MXNet NDArray file"), ("meta-less", "no __meta__"),
])
def test_load_states_of_foreign_files(tmp_path, content, why):
    _, trainer = _trained("sgd")
    path = tmp_path / "x.states"
    if content is None:
        np.save(open(path, "wb"), np.zeros(3))  # noqa: SIM115
    elif content == "params":
        _net().save_parameters(str(path))
    elif content == "meta-less":
        np.savez(open(path, "wb"), a=np.zeros(3))  # noqa: SIM115
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"x.states.*{why}"):
        trainer.load_states(path)


def test_load_states_of_another_model_or_optimizer(tmp_path):
    _, small = _trained("adam", units=(4, 2))
    _, wide = _trained("adam", units=(5, 2))
    _, deep = _trained("adam", units=(4, 2, 2))
    _, sgd = _trained("sgd", units=(4, 2))
    small.save_states(tmp_path / "small.states")
    deep.save_states(tmp_path / "deep.states")
    snap, snap_deep = _snapshot(wide), _snapshot(deep)
    with pytest.raises(ValueError, match=r"small.states.*has shape \(5, 3\), the file's state \(4, 3\).*more.*"
                                         r"another model"):
        wide.load_states(tmp_path / "small.states")
    assert _same(wide, snap)
    with pytest.raises(ValueError, match=r"small.states.*no state for .*another model"):
        deep.load_states(tmp_path / "small.states")
    assert _same(deep, snap_deep)
    with pytest.raises(ValueError, match=r"deep.states.*state for .*which this Trainer does not have"):
        small.load_states(tmp_path / "deep.states")
    with pytest.raises(ValueError, match=r"small.states.*holds Adam state \(2 buffers\), this Trainer uses SGD"):
        sgd.load_states(tmp_path / "small.states")
    # Same names and sizes, another shape: the check is by shape, not just by size.
    wide.save_states(tmp_path / "wide.states")
    arrays = serialization.load_npz(tmp_path / "wide.states")
    shape = wide._params[0].shape
    arrays[f"{wide._names[0]}::state0"] = np.zeros(shape[::-1], np.float32)
    gutils.atomic_savez(tmp_path / "shapes.states", arrays)
    with pytest.raises(ValueError, match="shapes.states.*" + re.escape(f"this model's Parameter has shape {shape}, "
                                                                        f"the file's state {shape[::-1]}")):
        wide.load_states(tmp_path / "shapes.states")
    assert _same(wide, snap)


def test_save_states_is_atomic_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    _, trainer = _trained("adam")
    path = tmp_path / "t.states"
    trainer.save_states(path)
    old = path.read_bytes()
    _only(tmp_path, {"t.states"})

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gutils.os, "fsync", boom)
    with pytest.raises(OSError, match="No space"):
        trainer.save_states(path)
    assert path.read_bytes() == old  # the previous file is intact
    _only(tmp_path, {"t.states"})


def test_states_round_trip_through_a_file_object():
    _, trainer = _trained("adam")
    buf = io.BytesIO()
    trainer.save_states(buf)
    snap = _snapshot(trainer)
    for s in trainer._states:
        s.zero_()
    trainer.load_states(io.BytesIO(buf.getvalue()))
    assert _same(trainer, snap)


def test_nd_load_and_load_parameters_of_damaged_files(tmp_path):
    # The file format stays MXNet's (no checksum): a flipped data byte loads as other values; anything the
    # reader can see is a ValueError naming the file. MXNet 1.9.1 here: MXNetError "Invalid NDArray file format".
    net = _net()
    good = tmp_path / "good.params"
    net.save_parameters(str(good))
    bad = tmp_path / "bad.params"
    errors = 0
    for what, data in _damaged(good.read_bytes(), n_flips=10_000):
        bad.write_bytes(data)
        for load in (lambda: nd.load(str(bad)), lambda: _net().load_parameters(str(bad))):
            try:
                load()
            except ValueError as exc:
                errors += 1
                assert "bad.params" in str(exc), (what, str(exc))
            except Exception as exc:  # noqa: BLE001
                pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
    assert errors > 100
    _only(tmp_path, {"good.params", "bad.params"})


def test_a_corrupt_storage_type_is_a_value_error_too(tmp_path):
    net = _net()
    path = tmp_path / "x.params"
    net.save_parameters(str(path))
    raw = bytearray(path.read_bytes())
    raw[28] = 1  # array 0's storage type word: row_sparse
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="x.params: array 0 has row_sparse storage") as info:
        nd.load(str(path))
    assert isinstance(info.value, NotImplementedError)  # (a real sparse file: what dnnbind cannot read)


def test_load_parameters_of_another_model_names_the_file(tmp_path):
    path = tmp_path / "small.params"
    _net((4, 2)).save_parameters(str(path))
    with pytest.raises(ValueError, match=r"(?s)small.params.*shape mismatch for 0.weight: the model expects \(5, 3\)"):
        _net((5, 2)).load_parameters(str(path))


# -- 2 and 3. scripts/train.py --------------------------------------------------------------------------------
def _train_module():
    spec = importlib.util.spec_from_file_location("_train_script_under_test", ROOT / "scripts" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _params(net):
    return {k: v.data().numpy().copy() for k, v in net.collect_params().items()}


def test_train_checkpoint_damaged_or_foreign_is_one_value_error(tmp_path):
    train = _train_module()
    args = train.parse_args(["--model", "simplecnn"])
    net, trainer = _trained("sgd")
    good = tmp_path / "good.ckpt"
    train.save_checkpoint(str(good), net, trainer, 1, 0, [], args)
    _only(tmp_path, {"good.ckpt"})
    net2, trainer2 = _trained("sgd")
    assert train.load_checkpoint(str(good), net2, trainer2, None, "simplecnn")["epoch"] == 1
    for k, v in _params(net).items():
        np.testing.assert_array_equal(_params(net2)[k], v)
    before, snap = _params(net2), _snapshot(trainer2)
    bad = tmp_path / "bad.ckpt"
    errors = 0
    for what, data in _damaged(good.read_bytes(), n_flips=300):
        bad.write_bytes(data)
        try:
            train.load_checkpoint(str(bad), net2, trainer2, None, "simplecnn")
        except ValueError as exc:
            errors += 1
            assert "bad.ckpt" in str(exc), (what, str(exc))
            assert all(np.array_equal(v, _params(net2)[k]) for k, v in before.items()), what
            assert _same(trainer2, snap), what
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
        _only(tmp_path, {"good.ckpt", "bad.ckpt"})  # no .states.tmp, no .tmp
    assert errors > 100
    wide, wide_trainer = _trained("sgd", units=(5, 2))
    first = re.escape(next(iter(train.model_params(wide))))  # (collect_params' names less the model's prefix)
    with pytest.raises(ValueError, match=rf"good.ckpt: not a checkpoint of this model: {first} has shape "
                                         r"\(4, 3\) in the file, \(5, 3\) in the model"):
        train.load_checkpoint(str(good), wide, wide_trainer, None, "simplecnn")
    with pytest.raises(ValueError, match="good.ckpt: a checkpoint of --model simplecnn, not --model resnet18"):
        train.load_checkpoint(str(good), net2, trainer2, None, "resnet18")
    _only(tmp_path, {"good.ckpt", "bad.ckpt"})


def test_train_checkpoint_resumes_into_a_model_named_later_in_the_process(tmp_path):
    """Block names count up per process (simplecnn0_, simplecnn1_): the checkpoint keys leave the model's prefix
    out, as MXNet's strip_prefix does, so the second model built in a process reads the first one's file."""
    train = _train_module()  # (puts the checkout on sys.path, as the script does)
    from models.simple_cnn import SimpleCNN
    args = train.parse_args(["--model", "simplecnn"])
    nets = []
    for _ in range(2):
        net = SimpleCNN()
        net.initialize(ctx=dnnbind.cpu())
        net(nd.array(np.random.default_rng(0).random((1, 1, 28, 28)), ctx=dnnbind.cpu()))
        nets.append((net, Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})))
    (first, t1), (second, t2) = nets
    assert first.prefix != second.prefix
    path = tmp_path / "first.ckpt"
    train.save_checkpoint(str(path), first, t1, 1, 0, [], args)
    train.load_checkpoint(str(path), second, t2, dnnbind.cpu(), "simplecnn")
    for a, b in zip(first.collect_params().values(), second.collect_params().values()):
        np.testing.assert_array_equal(a.data().numpy(), b.data().numpy())


def _run_train(tmp_path, *args):
    from test_train_script import _mnist_root
    root = _mnist_root()
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--device", "cpu", "--no-progress",
           "--out-dir", str(tmp_path / "runs"), *args] + (["--data-dir", root] if root else [])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_train_resume_of_a_finished_run_and_of_a_corrupt_checkpoint(tmp_path):
    first = _run_train(tmp_path, "--limit", "64", "--save", "a.ckpt")
    assert first.returncode == 0, first.stderr
    # The default --epochs (1) is done: nothing to do (was: UnboundLocalError for 'png').
    again = _run_train(tmp_path, "--limit", "64", "--resume", "a.ckpt")
    assert again.returncode == 0, again.stderr
    assert "nothing to do: a.ckpt has finished 1 epoch and --epochs is 1" in again.stdout
    assert "Traceback" not in again.stderr
    raw = (tmp_path / "a.ckpt").read_bytes()
    (tmp_path / "bad.ckpt").write_bytes(raw[:len(raw) // 2])
    bad = _run_train(tmp_path, "--limit", "64", "--epochs", "2", "--resume", "bad.ckpt")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    last = bad.stderr.strip().splitlines()[-1]  # one line (before it: a data-source note, if any)
    assert last.startswith("cannot resume: bad.ckpt: corrupt or truncated npz archive"), bad.stderr
    other = _run_train(tmp_path, "--limit", "64", "--epochs", "2", "--resume", "a.ckpt", "--optimizer", "adam")
    assert other.returncode == 1 and "holds SGD state" in other.stderr and "Traceback" not in other.stderr
    nan_lr = _run_train(tmp_path, "--limit", "64", "--lr", "nan")
    assert nan_lr.returncode == 1 and "learning_rate must be a finite number" in nan_lr.stderr, nan_lr.stderr
    assert not list(tmp_path.glob("*tmp*"))


def test_load_npz_reads_what_np_savez_wrote(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.asfortranarray(np.eye(3)),
              "c": np.array("text"), "d": np.zeros((0, 4), np.int64)}
    np.savez(tmp_path / "x.npz", **arrays)
    got = serialization.load_npz(tmp_path / "x.npz")
    assert list(got) == list(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        np.testing.assert_array_equal(got[k], v)
    assert math.isclose(float(got["a"].sum()), 15.0)
    with pytest.raises(FileNotFoundError):
        serialization.load_npz(tmp_path / "missing.npz")
