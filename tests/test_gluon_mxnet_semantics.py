"""Gluon semantics that must be MXNet 1.9.1's, checked against what the real MXNet did (issue 21).

tests/fixtures/mxnet_gluon holds what MXNet 1.9.1 wrote and printed (``make_fixtures.py`` there, run with the real
MXNet, says how): the networks of ``nets.py`` built by both libraries, their ``collect_params()`` keys, Parameter
names and reprs, the names in the files of ``save_parameters`` and ``collect_params().save`` (and those files), and
the public names (``dir()``) of MXNet's namespaces and Gluon classes.

1. ``nn.Dense`` on a 1-d input: (N,) is N samples of one feature with flatten=True, one sample without.
2. ``collect_params()`` is keyed by full names with MXNet's global per-class counters; save_parameters writes
   structural paths (each path of a shared Parameter); both kinds of MXNet file load.
3. An MXNet name dnnbind lacks raises UnsupportedFeature (NotImplementedError and AttributeError) naming the
   feature, by every path (``mx.nd.sparse``, ``net.optimize_for``, ``mx.gluon.nn.GroupNorm``); a typo a plain
   AttributeError.
4. Every layer of ``gluon.nn`` given bad constructor arguments or bad inputs raises ValueError, TypeError or
   NotImplementedError naming the layer, never AttributeError, ZeroDivisionError or a deferred-init RuntimeError.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as dmx
from dnnbind import nd
from dnnbind.gluon import nn
from dnnbind.mxnet import _finder
from dnnbind.features import NAMES
from dnnbind.mxnet._unsupported import UnsupportedFeature

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "mxnet_gluon"
KEYS = json.loads((FIX / "keys.json").read_text())
DIRS = json.loads((FIX / "names.json").read_text())
CPU = dnnbind.cpu()

_spec = importlib.util.spec_from_file_location("mxnet_gluon_nets", FIX / "nets.py")
nets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nets)


@pytest.fixture
def fresh_names():
    """MXNet's name counters from zero (a fresh mx.name.NameManager), as in the fresh MXNet process that wrote the
    fixtures."""
    with dnnbind.symbol.NameManager():
        yield


def _built() -> dict:
    """nets.py's networks, initialized and filled with its values (call under fresh_names)."""
    built = nets.build(dmx)
    for name, net in built.items():
        nets.fill(dmx, np, net, nets.X_SHAPES[name])
    return built


# -- 1. Dense on a 1-d input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("flatten, units, out, weight", [
    (True, 1, (3, 1), (1, 1)), (True, 2, (3, 2), (2, 1)),  # MXNet 1.9.1: (3,) is 3 samples of 1 feature
    (False, 1, (1,), (1, 3)), (False, 2, (2,), (2, 3)),  # ... and one sample of 3 features without flatten
])
def test_dense_on_a_1d_input_as_mxnet(flatten, units, out, weight):
    layer = nn.Dense(units, flatten=flatten)
    layer.initialize(ctx=CPU)
    x = nd.array([1.0, 2.0, 3.0], ctx=CPU)
    y = layer(x)
    assert y.shape == out and layer.weight.shape == weight
    w, b = layer.weight.data().numpy(), layer.bias.data().numpy()
    ref = x.numpy()[:, None] @ w.T + b if flatten else w @ x.numpy() + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6)


def test_dense_on_a_1d_input_with_in_units_and_a_0d_input():
    layer = nn.Dense(2, in_units=1)
    layer.initialize(ctx=CPU)
    assert layer(nd.ones((3,), ctx=CPU)).shape == (3, 2)
    layer = nn.Dense(2, in_units=3)  # MXNet: "Shape inconsistent, Provided = [2,3], inferred shape=(2,1)"
    layer.initialize(ctx=CPU)
    with pytest.raises(ValueError):
        layer(nd.ones((3,), ctx=CPU))
    layer = nn.Dense(2)  # MXNet: "Deferred initialization failed because shape cannot be inferred" (ValueError)
    layer.initialize(ctx=CPU)
    with pytest.raises(ValueError, match=r"dense\d+: Dense cannot take a 0-d input"):
        layer(nd.array(np.float32(5.0), ctx=CPU))


# -- 2. collect_params() keys, names and files -----------------------------------------------------------------

def test_collect_params_keys_names_and_files_match_mxnet(fresh_names, tmp_path):
    built = _built()
    for name, net in built.items():
        want = KEYS[name]
        params = net.collect_params()
        assert net.prefix == want["prefix"], name
        assert list(params.keys()) == want["collect_params"], name
        assert list(net.collect_params(".*weight").keys()) == want["collect_params_weight"], name
        assert [p.name for p in params.values()] == want["param_names"], name
        # MXNet prints a Parameter made by params.get() without dtype as dtype=<class 'numpy.float32'>
        assert repr(params) == want["repr"].replace("<class 'numpy.float32'>", "float32"), name
        net.save_parameters(str(tmp_path / "a.params"))
        assert list(nd.load(str(tmp_path / "a.params"))) == want["save_parameters"], name
        params.save(str(tmp_path / "b.params"))
        assert list(nd.load(str(tmp_path / "b.params"))) == want["collect_save"], name
    mlp = built["mlp"]
    mlp.collect_params().save(str(tmp_path / "c.params"), strip_prefix="mlp_")
    assert list(nd.load(str(tmp_path / "c.params"))) == KEYS["mlp"]["strip_save"]
    assert list(mlp.collect_params("mlp_s.*")) == KEYS["mlp"]["collect_params_scale"]
    assert mlp.collect_params()["mlp_dense0_weight"] is mlp.hidden.weight
    with pytest.raises(KeyError):
        mlp.collect_params()["hidden.weight"]  # a path is save_parameters' key, not collect_params()'
    assert mlp.hidden.weight.name == "mlp_dense0_weight" and repr(mlp.hidden.weight).startswith(
        "Parameter mlp_dense0_weight (shape=(4, 5)")


def test_files_mxnet_wrote_load(fresh_names, monkeypatch):
    expect = {}
    for name in KEYS:
        expect[name] = {k: v.numpy() for k, v in nd.load(str(FIX / f"{name}.save_parameters.bin")).items()}
    for how in ("save_parameters", "collect_save", "collect_save by load_parameters"):
        with dnnbind.symbol.NameManager():  # the same names as MXNet's, every round
            built = nets.build(dmx)
        for name, net in built.items():
            nets.fill(dmx, np, net, nets.X_SHAPES[name])
            for p in net.collect_params().values():
                p.set_data(np.zeros(p.shape, np.float32))
            if how == "save_parameters":
                net.load_parameters(str(FIX / f"{name}.save_parameters.bin"), ctx=CPU)
            elif how == "collect_save":
                net.collect_params().load(str(FIX / f"{name}.collect_save.bin"), ctx=CPU)
            else:  # full names in a file for load_parameters: dnnbind matches them by name
                net.load_parameters(str(FIX / f"{name}.collect_save.bin"), ctx=CPU)
            for path, p in net._collect_params_with_prefix(dedupe=False).items():
                np.testing.assert_array_equal(p.data().numpy(), expect[name][path], err_msg=f"{how}: {name} {path}")
        x = nd.array(nets.values(np, (2, 5), 7), ctx=CPU)
        np.testing.assert_allclose(built["mlp"](x).numpy(), KEYS["mlp"]["forward"], rtol=1e-6, err_msg=how)
    mlp = built["mlp"]
    for p in mlp.collect_params().values():
        p.set_data(np.zeros(p.shape, np.float32))
    with pytest.raises(ValueError, match="missing"):  # stripped names need restore_prefix, as in MXNet
        mlp.collect_params().load(str(FIX / "mlp.strip.bin"), ctx=CPU)
    mlp.collect_params().load(str(FIX / "mlp.strip.bin"), ctx=CPU, restore_prefix="mlp_")
    np.testing.assert_array_equal(mlp.hidden.weight.data().numpy(), expect["mlp"]["hidden.weight"])
    loaded = nd.load(str(FIX / "mlp.collect_save.bin"))
    mlp.collect_params().zero_grad()
    for p in mlp.collect_params().values():
        p.set_data(np.zeros(p.shape, np.float32))
    mlp.collect_params().load_dict(loaded, ctx=CPU)  # MXNet's ParameterDict.load_dict
    np.testing.assert_array_equal(mlp.scale.data().numpy(), expect["mlp"]["scale"])


def test_shared_parameters_are_saved_under_each_path_or_deduplicated(fresh_names, tmp_path):
    tied = _built()["tied"]
    f = str(tmp_path / "tied.params")
    tied.save_parameters(f, deduplicate=True)
    assert list(nd.load(f)) == ["0.weight", "0.bias"]
    before = tied[0].weight.data().numpy()
    tied[0].weight.set_data(np.zeros((4, 4), np.float32))
    tied.load_parameters(f, ctx=CPU)
    np.testing.assert_array_equal(tied[1].weight.data().numpy(), before)
    nd.save(str(tmp_path / "half.params"), {"1.weight": nd.ones((4, 4))})  # any one path of a shared Parameter
    with pytest.raises(ValueError, match=r"missing in the file \(allow_missing=True skips them\): 0\.bias$"):
        tied.load_parameters(str(tmp_path / "half.params"), ctx=CPU)
    tied.load_parameters(str(tmp_path / "half.params"), ctx=CPU, allow_missing=True)
    np.testing.assert_array_equal(tied[2].weight.data().numpy(), np.ones((4, 4)))


def test_two_parameters_with_one_name_are_refused():
    class Scaled(nn.Block):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(2, in_units=2)
            self.alpha = dnnbind.gluon.Parameter("alpha", shape=(1,))  # not prefixed: the same name twice

    net = nn.Sequential()
    net.add(Scaled(), Scaled())
    with pytest.raises(ValueError, match="two different Parameters are named `alpha`"):
        net.collect_params()


def test_trainer_names_parameters_by_path_so_states_move_between_instances(tmp_path):
    def make():
        net = nn.Sequential()
        net.add(nn.Dense(3, in_units=2))
        net.initialize(ctx=CPU)
        return net, dnnbind.gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.1})

    net, trainer = make()
    with dnnbind.autograd.record():
        y = net(nd.ones((2, 2), ctx=CPU)).sum()
    y.backward()
    trainer.step(2)
    trainer.save_states(str(tmp_path / "s"))
    other_net, other = make()  # other names (dense1_...), the same paths
    assert list(other_net.collect_params()) != list(net.collect_params())
    other.load_states(str(tmp_path / "s"))


# -- 3. MXNet's names dnnbind lacks --------------------------------------------------------------------------

def test_the_name_table_is_mxnets():
    assert set(NAMES) == set(DIRS)
    for ns, names in DIRS.items():
        assert NAMES[ns] == frozenset(names), ns


def _check_names(obj, ns: str, skip=()) -> None:
    """Every name MXNet's ``ns`` has: present, or UnsupportedFeature naming it; a typo: a plain AttributeError."""
    for name in DIRS[ns]:
        if name in skip:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                getattr(obj, name)
        except UnsupportedFeature as exc:  # anything else (a bare AttributeError) fails the test
            assert isinstance(exc, NotImplementedError) and isinstance(exc, AttributeError)
            assert "not supported by dnnbind" in str(exc) and f".{name}" in str(exc), (ns, name, str(exc))
    for typo in ("no_such_name", DIRS[ns][-1] + "x"):
        with pytest.raises(AttributeError) as err:
            getattr(obj, typo)
        assert not isinstance(err.value, NotImplementedError), (ns, typo)
        assert getattr(obj, typo, 7) == 7


@pytest.mark.parametrize("ns", ["mx", "gluon", "nn", "nd", "base", "image", "test_utils"])
def test_module_names_are_mxnets_or_name_the_feature(alias, ns):
    import mxnet
    obj = {"mx": mxnet, "gluon": mxnet.gluon, "nn": mxnet.gluon.nn, "nd": mxnet.nd, "base": mxnet.base,
           "image": mxnet.image, "test_utils": mxnet.test_utils}[ns]
    _check_names(obj, ns)


def test_block_and_parameter_names_are_mxnets_or_name_the_feature():
    layer = nn.Dense(2, in_units=3)
    layer.initialize(ctx=CPU)
    # hybrid_forward: MXNet's HybridBlock has one that raises NotImplementedError; here it is the subclass's
    _check_names(layer, "Block")
    _check_names(layer, "HybridBlock", skip=("hybrid_forward",))
    with pytest.raises(AttributeError) as err:
        layer.hybrid_forward
    assert not isinstance(err.value, NotImplementedError)
    with pytest.raises(UnsupportedFeature, match=r"mxnet\.gluon\.HybridBlock\.optimize_for is not supported by "
                                                 r"dnnbind yet \(Dense\.optimize_for was used\)"):
        layer.optimize_for
    _check_names(layer.weight, "Parameter")
    _check_names(layer.collect_params(), "ParameterDict")


def test_every_path_to_a_missing_feature_names_it_in_a_fresh_process(tmp_path):
    """As a program meets them: attribute access first, before any import of the stand-ins."""
    script = textwrap.dedent("""
        import dnnbind
        mx = dnnbind.install_mxnet_alias()
        from mxnet.gluon import nn
        from dnnbind.mxnet._unsupported import UnsupportedFeature
        cases = {"mx.nd.sparse": lambda: mx.nd.sparse.csr_matrix, "mx.profiler": lambda: mx.profiler.set_config,
                 "mx.use_np": lambda: mx.use_np, "nn.GroupNorm": lambda: nn.GroupNorm, "optimize_for": lambda: nn.Dense(2).optimize_for,
                 "mx.nd.Correlation": lambda: mx.nd.Correlation, "mx.gluon.contrib": lambda: mx.gluon.contrib.estimator}
        for what, f in cases.items():
            try:
                f()
            except UnsupportedFeature as exc:
                print(what, "->", exc)
            else:
                print(what, "-> no error")
        for what, f in {"mx.gluonn": lambda: mx.gluonn, "nn.Dence": lambda: nn.Dence}.items():
            try:
                f()
            except NotImplementedError:
                print(what, "-> NotImplementedError")
            except AttributeError as exc:
                print(what, "-> AttributeError", exc)
        print(mx.img is mx.image, mx.rnd is mx.random)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    for what, feature in [("mx.nd.sparse", "mxnet.nd.sparse"), ("mx.profiler", "mxnet.profiler"), ("mx.use_np", "mxnet.use_np"),
                          ("nn.GroupNorm", "mxnet.gluon.nn.GroupNorm"),
                          ("optimize_for", "mxnet.gluon.HybridBlock.optimize_for"), ("mx.nd.Correlation", "mxnet.nd.Correlation"),
                          ("mx.gluon.contrib", "mxnet.gluon.contrib.estimator")]:
        line = next(x for x in lines if x.startswith(what + " ->"))
        assert f"-> {feature} is not supported by dnnbind" in line, line
    assert any(x.startswith("mx.gluonn -> AttributeError") for x in lines), lines
    assert any(x.startswith("nn.Dence -> AttributeError") for x in lines), lines
    assert lines[-1] == "True True"


def test_the_alias_leaves_dnnbinds_namespaces_as_they_were(alias):
    import mxnet
    assert hasattr(mxnet.nd, "sparse") and not hasattr(mxnet.gluon, "no_such_name")
    _finder.uninstall_mxnet_alias()
    assert not hasattr(dnnbind.nd, "sparse") and "__getattr__" not in vars(dnnbind.nd)
    with pytest.raises(AttributeError) as err:
        dnnbind.nd.Correlation  # noqa: B018
    assert not isinstance(err.value, NotImplementedError)


# -- 4. bad arguments and inputs of every layer --------------------------------------------------------------

# name: (constructor arguments, a good input shape); a layer added to nn.__all__ without an entry is made with no
# arguments on a (1, 2, 6, 6) input, and fails here if it needs more.
LAYERS = {
    "Conv3D": ((2, 3), (1, 2, 4, 4, 4)), "Conv3DTranspose": ((2, 3), (1, 2, 4, 4, 4)),
    "MaxPool3D": ((), (1, 2, 4, 4, 4)), "AvgPool3D": ((), (1, 2, 4, 4, 4)),
    "Dense": ((2,), (2, 5)), "Activation": (("relu",), (2, 5)), "Dropout": ((0.5,), (2, 5)),
    "Embedding": ((5, 3), (2, 3)), "Flatten": ((), (2, 5)), "HybridLambda": (("relu",), (2, 5)),
    "Lambda": (("relu",), (2, 5)), "Sequential": ((), (2, 5)), "HybridSequential": ((), (2, 5)),
    "Conv1D": ((2, 3), (1, 2, 8)), "Conv2D": ((2, 3), (1, 2, 6, 6)), "Conv1DTranspose": ((2, 3), (1, 2, 8)),
    "Conv2DTranspose": ((2, 3), (1, 2, 6, 6)), "MaxPool1D": ((), (1, 2, 8)), "AvgPool1D": ((), (1, 2, 8)),
    "GlobalMaxPool1D": ((), (1, 2, 8)), "GlobalAvgPool1D": ((), (1, 2, 8)),
    "GlobalMaxPool3D": ((), (1, 2, 4, 4, 4)), "GlobalAvgPool3D": ((), (1, 2, 4, 4, 4)),
    "LayerNorm": ((), (2, 5)), "LeakyReLU": ((0.1,), (2, 5)), "ELU": ((), (2, 5)), "SELU": ((), (2, 5)),
    "GELU": ((), (2, 5)), "Swish": ((), (2, 5)), "PReLU": ((), (2, 5)),
}
NOT_LAYERS = {"Block", "HybridBlock", "SymbolBlock"}  # base classes, not layers to call
GOOD = (ValueError, TypeError, NotImplementedError)
BAD_VALUES = [0, -1, None, "abc", 10**12, 2.5, (), (1, 2, 3, 4)]


def _good_args(name: str) -> tuple:
    shape = LAYERS.get(name, ((), (1, 2, 6, 6)))[1]
    x = nd.array(np.random.default_rng(0).random(shape, dtype=np.float32) * 4, ctx=CPU)
    return (x, nd.ones(shape, ctx=CPU)) if name == "BatchNormAddRelu" else (x,)


def _attempt(what: str, make, call=None) -> list:
    """[] if ``make()`` (then ``call(layer)``) runs or raises ValueError/TypeError/NotImplementedError; else the
    problem."""
    try:
        layer = make()
        if call is not None:
            layer.initialize(ctx=CPU)
            call(layer)
    except GOOD:
        return []
    except Exception as exc:  # noqa: BLE001  (what this test looks for)
        return [f"{what}: {type(exc).__name__}: {str(exc)[:200]}"]
    return []


@pytest.mark.parametrize("name", sorted(set(nn.__all__) - NOT_LAYERS))
def test_layer_refuses_bad_arguments_and_inputs_with_value_or_type_errors(name):
    cls = getattr(nn, name)
    base = LAYERS.get(name, ((), None))[0]
    good = _good_args(name)
    layer = cls(*base)  # the good case works (a layer added later needs an entry in LAYERS if this fails)
    layer.initialize(ctx=CPU)
    layer(*good)
    problems = []
    params = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in ("prefix", "params")]
    for i, p in enumerate(params):
        for v in BAD_VALUES:
            args, kwargs = list(base), {}
            if i < len(args):
                args[i] = v
            else:
                kwargs[p.name] = v
            what = f"{name}(*{args}, **{kwargs})"
            problems += _attempt(what, lambda: cls(*args, **kwargs), lambda layer: layer(*good))
    with pytest.raises(TypeError):  # MXNet: "__init__() got an unexpected keyword argument 'foo'"
        cls(*base, foo=1)
    shape = good[0].shape
    inputs = {"None": None, "str": "abc", "list": [1.0, 2.0], "numpy": np.ones(shape, np.float32),
              "0-d": nd.array(np.float32(1.0), ctx=CPU), "1-d": nd.ones((3,), ctx=CPU),
              "2-d": nd.ones((2, 3), ctx=CPU), "3-d": nd.ones((1, 2, 3), ctx=CPU),
              "4-d": nd.ones((1, 2, 3, 3), ctx=CPU),
              "5-d": nd.ones((1, 2, 2, 2, 2), ctx=CPU), "6-d": nd.ones((1,) * 6, ctx=CPU),
              "int32": nd.ones(shape, dtype="int32", ctx=CPU), "float64": nd.ones(shape, dtype="float64", ctx=CPU),
              "float16": nd.ones(shape, dtype="float16", ctx=CPU), "uint8": nd.ones(shape, dtype="uint8", ctx=CPU),
              "0-size": nd.ones((0,) + shape[1:], ctx=CPU),
              "0-channels": nd.ones(shape[:1] + (0,) + shape[2:], ctx=CPU),
              "0-last": nd.ones(shape[:-1] + (0,), ctx=CPU)}
    for key, x in inputs.items():
        args = (x,) + good[1:]
        problems += _attempt(f"{name} first call on {key}", lambda: cls(*base), lambda layer: layer(*args))
        problems += _attempt(f"{name} call on {key} after a good one", lambda: cls(*base),
                             lambda layer: (layer(*good), layer(*args)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("value", [None, "abc", [1.0, 2.0], np.ones((2, 3), np.float32)])
def test_a_layer_given_no_ndarray_says_so_as_mxnet(value):
    layer = nn.Dense(2)
    layer.initialize(ctx=CPU)
    with pytest.raises(ValueError, match=r"dense\d+ \(Dense\): the input x must be an NDArray, got") as err:
        layer(value)  # MXNet: ValueError "In HybridBlock, there must be one NDArray or one Symbol in the input"
    assert isinstance(err.value, TypeError)
    net = nn.Sequential()
    net.add(nn.Dense(2))
    net.initialize(ctx=CPU)
    net.hybridize()
    with pytest.raises(ValueError, match=r"\(Dense\): the input x must be an NDArray"):
        net(value)


def test_bad_sizes_are_refused_when_the_layer_is_made():
    with pytest.raises(ValueError, match=r"Conv2D: groups must be an int in \[1, "):
        nn.Conv2D(4, 3, groups=0)  # MXNet 1.9.1 dies of SIGFPE
    with pytest.raises(ValueError, match=r"Dense: units must be an int in \[1, "):
        nn.Dense(units=0)  # MXNet: ValueError at the first call ("num_hidden should be greater equal to 1")
    with pytest.raises(TypeError, match=r"Dense: units must be an int, got 2\.5"):
        nn.Dense(2.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        nn.Dense(2, foo=1)  # as MXNet's
    with pytest.raises(ValueError, match=r"conv\d+: Conv2D cannot infer in_channels from an input of shape "
                                         r"\(1, 0, 5, 5\): it has 0 channels"):
        layer = nn.Conv2D(4, 3)
        layer.initialize(ctx=CPU)
        layer(nd.ones((1, 0, 5, 5), ctx=CPU))
