"""The MXNet alias on the cpu: ``python -m dnnbind.mxnet script.py`` runs an MXNet 1.x program unchanged,
``install_mxnet_alias()`` does the same in-process, unbacked namespaces fail on first use, Context semantics,
mx.test_utils, mx.image and the lr schedulers (values checked against MXNet 1.9.1 by hand-written formulas).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as dmx
from dnnbind.mxnet import _finder

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(args, cwd=None, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(), cwd=cwd,
                          timeout=timeout)


# -- the runner ----------------------------------------------------------------------------------------------

MX_SCRIPT = '''
import os, sys
import numpy as np
import mxnet as mx
from mxnet import nd, autograd, gluon, init, image
from mxnet import initializer, metric, optimizer, lr_scheduler, context, base, test_utils, contrib, random
from mxnet.gluon import nn, data as gdata, loss as gloss, utils as gutils
from mxnet.gluon.data.vision import transforms
from mxnet.contrib import text
import mxnet.gluon.nn as nn2
import mxnet.ndarray as F
import mxnet.gluon.data.vision.transforms
import mxnet.sym, mxnet.symbol, mxnet.mod, mxnet.io, mxnet.kv, mxnet.kvstore, mxnet.recordio, mxnet.profiler
import mxnet.np, mxnet.npx, mxnet.contrib.text.embedding
import helper  # a module beside the script: the script's directory is on sys.path

assert nn2 is nn and F is nd and mx.nd is nd and mx.ndarray is nd and mx.gluon is gluon
assert mx.init is init and mx.initializer is initializer and mx.metric is metric and mx.optimizer is optimizer
assert isinstance(gluon.Trainer, type) and isinstance(gluon.Parameter, type)
assert mx.__version__ == "1.9.1", mx.__version__
assert mx.base.MXNetError is mx.MXNetError

ctx = mx.cpu()
assert isinstance(ctx, mx.Context) and ctx == mx.Context("cpu", 0) and repr(ctx) == "cpu(0)"
ngpu = mx.context.num_gpus()


def try_gpu():  # d2l's probe, with a call that exists in every dnnbind version
    try:
        ctx = mx.gpu()
        _ = nd.array([0.0]).as_in_context(ctx)
    except mx.base.MXNetError:
        ctx = mx.cpu()
    return ctx


probe = try_gpu()
assert (probe == mx.gpu(0)) == (ngpu > 0), (probe, ngpu)
try:
    mx.random.seed(42)
    seeded = "seeded"
except NotImplementedError:
    seeded = "no-seed"
np.random.seed(0)

net = nn.Sequential()
net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
net.initialize(init.Xavier(), ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
loss_fn = gloss.SoftmaxCrossEntropyLoss()
X = nd.array(np.random.randn(32, 5).astype("float32"), ctx)
y = nd.array(np.random.randint(0, 3, size=32).astype("float32"), ctx)
losses = []
for step in range(3):
    with autograd.record():
        loss = loss_fn(net(X), y)
    loss.backward()
    trainer.step(32)
    losses.append(float(loss.mean().asscalar()))
acc = mx.metric.Accuracy()
acc.update([y], [net(X)])
assert losses[-1] < losses[0], losses
print("MXOK", __name__, sys.argv, sys.path[0], seeded, repr(probe), ngpu, losses, acc.get()[0])
'''


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_runner_runs_an_mxnet_script_unchanged(tmp_path):
    script = _write(tmp_path / "train_mx.py", MX_SCRIPT)
    _write(tmp_path / "helper.py", "VALUE = 1\n")
    r = _run(["-m", "dnnbind.mxnet", str(script), "arg1", "--flag"], cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MXOK"))
    assert f"MXOK __main__ {[str(script), 'arg1', '--flag']}" in line
    assert f" {os.path.realpath(tmp_path)} " in line
    # This machine has no GPU: the probe failed with MXNetError and fell back to the cpu.
    if not dnnbind.num_gpus():
        assert " cpu(0) 0 " in line


def test_runner_exit_codes_and_tracebacks(tmp_path):
    bad = _write(tmp_path / "bad.py", """\
        import mxnet as mx


        def fail():
            raise ValueError("boom from the script")


        fail()
    """)
    r = _run(["-m", "dnnbind.mxnet", str(bad)])
    assert r.returncode == 1
    assert "Traceback (most recent call last):" in r.stderr
    assert f'File "{bad}", line 8, in <module>' in r.stderr and f'File "{bad}", line 5, in fail' in r.stderr
    assert r.stderr.rstrip().endswith("ValueError: boom from the script")
    assert "runpy" not in r.stderr and "__main__.py" not in r.stderr  # the runner's own frames are hidden

    _write(tmp_path / "exits.py", "import sys, mxnet\nsys.exit(3)\n")
    assert _run(["-m", "dnnbind.mxnet", str(tmp_path / "exits.py")]).returncode == 3
    r = _run(["-m", "dnnbind.mxnet", str(tmp_path / "missing.py")])
    assert r.returncode == 2 and "can't open file" in r.stderr
    r = _run(["-m", "dnnbind.mxnet"])
    assert r.returncode == 2 and "usage" in r.stderr


def test_runner_module_and_command_forms(tmp_path):
    pkg = tmp_path / "mxpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _write(pkg / "mod.py", """\
        import sys
        import mxnet as mx
        from mxnet.gluon import nn
        print("MOD", __name__, sys.argv[0].endswith("mod.py"), sys.argv[1:], type(nn.Dense(2)).__module__)
    """)
    r = _run(["-m", "dnnbind.mxnet", "-m", "mxpkg.mod", "x", "y"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "MOD __main__ True ['x', 'y'] dnnbind.gluon.nn.basic_layers" in r.stdout
    r = _run(["-m", "dnnbind.mxnet", "-c", "import sys, mxnet as mx; print('CMD', __name__, sys.argv, "
              "mx.__version__)", "z"])
    assert r.returncode == 0, r.stderr
    assert "CMD __main__ ['-c', 'z'] 1.9.1" in r.stdout


def test_without_the_alias_mxnet_is_not_dnnbind():
    r = _run(["-c", "import dnnbind, dnnbind.mxnet, importlib.util, sys\n"
                    "hooked = any(type(f).__name__ == 'MXNetAliasFinder' for f in sys.meta_path)\n"
                    "spec = importlib.util.find_spec('mxnet')\n"
                    "print(hooked, 'mxnet' in sys.modules, 'REAL' if spec else 'NONE')"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["False", "False"]  # importing dnnbind (and dnnbind.mxnet) adds no hook
    if r.stdout.split()[2] == "REAL":
        pytest.skip("a real MXNet is installed here: without the alias it stays the one `import mxnet` finds")
    r = _run(["-c", "import dnnbind\nimport mxnet"])
    assert r.returncode == 1 and "No module named 'mxnet'" in r.stderr


def test_the_wheel_has_no_top_level_mxnet_package():
    setuptools = pytest.importorskip("setuptools")
    found = setuptools.find_packages(str(ROOT), include=["dnnbind*", "models*"])
    assert "dnnbind.mxnet" in found
    assert not [p for p in found if p.split(".")[0] == "mxnet"]


# -- in-process alias ----------------------------------------------------------------------------------------

def test_install_alias_in_process_is_idempotent(alias):
    assert alias is dmx
    assert dnnbind.install_mxnet_alias() is alias
    assert sum(isinstance(f, _finder.MXNetAliasFinder) for f in sys.meta_path) == 1
    assert isinstance(sys.meta_path[0], _finder.MXNetAliasFinder)
    import mxnet as mx
    import mxnet.gluon.nn as nn
    import mxnet.ndarray as F
    from mxnet import autograd, gluon, image, init, nd  # noqa: F401
    from mxnet.gluon import data as gdata  # noqa: F401
    from mxnet.gluon import nn as nn2
    from mxnet.gluon.data.vision import transforms
    from mxnet.gluon.data.vision.datasets import MNIST
    assert mx is dmx and nn is nn2 is dnnbind.gluon.nn and F is nd is dnnbind.nd
    assert sys.modules["mxnet.gluon"] is dnnbind.gluon and init is dnnbind.initializer
    assert transforms is dnnbind.gluon.data.vision.transforms and MNIST is dnnbind.gluon.data.vision.MNIST
    assert dnnbind.gluon.__spec__.name == "dnnbind.gluon"  # the dnnbind module keeps its own spec
    assert image is dmx.image is dnnbind.image and mx.test_utils is importlib.import_module("mxnet.test_utils")
    with pytest.raises(ModuleNotFoundError, match="mxnet.no_such_module"):
        importlib.import_module("mxnet.no_such_module")
    _finder.uninstall_mxnet_alias()
    assert "mxnet" not in sys.modules and not _finder.is_installed()
    if importlib.util.find_spec("mxnet") is None:  # no real MXNet here
        with pytest.raises(ImportError):
            importlib.import_module("mxnet")


def test_install_replaces_an_already_imported_foreign_mxnet(alias):
    _finder.uninstall_mxnet_alias()
    fake = types.ModuleType("mxnet")
    sys.modules["mxnet"] = fake
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mx = dnnbind.install_mxnet_alias()
    assert mx is dmx and sys.modules["mxnet"] is dmx
    assert any("already imported" in str(w.message) for w in caught)


def test_random_resolves_to_nd_random_when_it_exists(alias):
    import mxnet
    has_nd_random = importlib.util.find_spec("dnnbind.nd.random") is not None \
        if hasattr(dnnbind.nd, "__path__") else False
    if has_nd_random:
        assert mxnet.random is importlib.import_module("dnnbind.nd.random")
        assert importlib.import_module("mxnet.random") is mxnet.random
    else:
        with pytest.raises(NotImplementedError, match=r"mxnet\.random"):
            mxnet.random.seed(1)


# -- unbacked features ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, feature", [
    ("contrib.onnx.export_model", "mxnet.contrib.onnx"),
    ("monitor.Monitor", "mxnet.monitor"),
    ("visualization.plot_network", "mxnet.visualization"),
    ("rtc.CudaModule", "mxnet.rtc"),
    ("profiler.set_config", "mxnet.profiler"),
    ("np.zeros", "mxnet.np"),
    ("npx.set_np", "mxnet.npx"),
    ("test_utils.check_numeric_gradient", "mxnet.test_utils.check_numeric_gradient"),
    ("base._LIB", "mxnet.base._LIB"),
])
def test_unbacked_feature_raises_on_first_use(path, feature):
    *mods, attr = path.split(".")
    obj = dmx
    for m in mods:
        obj = getattr(obj, m)  # importing and walking down the namespaces works
    with pytest.raises(NotImplementedError) as err:
        getattr(obj, attr)
    assert feature in str(err.value) and "dnnbind" in str(err.value)


def test_unbacked_namespaces_import_and_introspect_quietly(alias):
    import mxnet.contrib.onnx as onnx
    from mxnet.contrib import onnx as onnx2
    assert onnx2 is onnx and not hasattr(onnx, "__file__") and not hasattr(dmx.profiler, "__all__")
    with pytest.raises(NotImplementedError, match="^mxnet.contrib.onnx is not supported by dnnbind yet"):
        onnx.export_model("net-symbol.json")
    # contrib.text is dnnbind's (d2lzh imports it at import time and chapter 10 uses it)
    import mxnet.contrib.text.embedding as emb
    from mxnet.contrib import text
    assert text.embedding is emb and emb is importlib.import_module("dnnbind.contrib.text.embedding")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mxnet.contrib.no_such_thing")
    # Unbacked children of backed modules: importable through the alias while dnnbind has no such module.
    from mxnet.gluon import rnn
    from mxnet.gluon.model_zoo import vision  # backed now: dnnbind.gluon.model_zoo (the stand-in no longer serves)
    import mxnet.gluon.model_zoo.vision as vision2
    assert vision2 is vision and vision is importlib.import_module("dnnbind.gluon.model_zoo.vision")
    if importlib.machinery.PathFinder.find_spec("dnnbind.gluon.rnn", dnnbind.gluon.__path__) is None:
        with pytest.raises(NotImplementedError, match=r"mxnet\.gluon\.rnn .*recurrent layers"):
            rnn.LSTM(10)
        _finder.uninstall_mxnet_alias()  # the stand-ins leave dnnbind's own namespace with the alias
        assert not hasattr(dnnbind.gluon, "rnn") and not hasattr(dnnbind.gluon, "model_zoo")
        assert "dnnbind.gluon.rnn" not in sys.modules


# -- Context ---------------------------------------------------------------------------------------------------

def test_context_is_dnnbind_device_with_mxnet_semantics():
    mx = dmx
    assert mx.Context is dnnbind.Device and mx.context.Context is mx.Context
    g1 = mx.gpu(1)
    assert g1 is mx.Context("gpu", 1) is mx.Context(device_type="gpu", device_id=1) is mx.Context(g1)
    assert g1 == mx.Context("gpu", 1) and g1 != mx.gpu(0) and g1 != mx.cpu()
    assert hash(g1) == hash(mx.Context("gpu", 1)) and len({g1, mx.gpu(1), mx.gpu(0), mx.cpu()}) == 3
    assert repr(g1) == "gpu(1)" and repr(mx.cpu()) == "cpu(0)" and repr(mx.cpu_pinned()) == "cpu(0)"
    assert mx.cpu_pinned() is mx.cpu() is mx.Context("cpu_shared") is mx.cpu(3)
    assert (g1.device_type, g1.device_id, g1.device_typeid) == ("gpu", 1, 2)
    assert (mx.cpu().device_type, mx.cpu().device_id, mx.cpu().device_typeid) == ("cpu", 0, 1)
    assert isinstance(dnnbind.zeros((2,), device="cpu").context, mx.Context)
    assert pickle.loads(pickle.dumps(g1)) is g1
    with pytest.raises(ValueError, match="device kind"):
        mx.Context("tpu", 0)
    with pytest.raises(ValueError, match=">= 0"):
        mx.Context("gpu", -1)


def test_context_with_statement_sets_the_default_device():
    mx = dmx
    before = mx.current_context()
    with mx.gpu(2) as ctx:
        assert ctx is mx.gpu(2) and mx.current_context() is mx.gpu(2) and mx.test_utils.default_context() is ctx
        with mx.cpu():
            assert mx.context.current_context() is mx.cpu()
            assert dnnbind.zeros((3,)).context is mx.cpu()
        assert mx.current_context() is mx.gpu(2)
    assert mx.current_context() is before
    mx.test_utils.set_default_context(mx.cpu())
    try:
        assert mx.current_context() is mx.cpu()
    finally:
        mx.test_utils.set_default_context(before)


class _SlowMissDict(dict):
    """An intern table whose misses take a while, so racing threads all miss before any of them inserts."""

    def get(self, key, default=None):
        value = super().get(key, default)
        if key not in self:
            time.sleep(0.002)  # after the lookup: the caller acts on a stale miss, as a preempted thread would
        return value


def test_device_interning_is_thread_safe():
    original = dnnbind.Device._cache
    dnnbind.Device._cache = _SlowMissDict(original)
    try:
        for round_ in range(5):
            index = 1000 + round_ * 7 + 3  # a device no other test made: every thread races to create it
            barrier = threading.Barrier(8)
            got = []

            def make(barrier=barrier, got=got, index=index):
                barrier.wait()
                got.append(dnnbind.Device("gpu", index))

            threads = [threading.Thread(target=make) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(got) == 8 and all(d is got[0] for d in got) and got[0].index == index
    finally:
        original.update(dnnbind.Device._cache)
        dnnbind.Device._cache = original


def test_failed_gpu_probe_is_an_mxnet_error():
    if dnnbind.num_gpus():
        pytest.skip("a GPU is usable here; the probe succeeds")
    mx = dmx
    assert mx.test_utils.list_gpus() == range(0) and mx.context.num_gpus() == 0
    with pytest.raises(mx.base.MXNetError, match="no GPU"):
        dnnbind.zeros((1,), device=mx.gpu())
    with pytest.raises(mx.MXNetError):
        mx.nd.array([0.0]).as_in_context(mx.gpu())
    try:  # d2l's exact spelling, once nd.zeros takes ctx=
        mx.nd.zeros((1,), ctx=mx.gpu())
    except TypeError as exc:
        pytest.skip(f"nd.zeros does not take ctx= yet: {exc}")
    except mx.base.MXNetError:
        pass
    else:
        raise AssertionError("nd.zeros(ctx=mx.gpu()) succeeded without a GPU")


# -- test_utils, image, lr_scheduler ---------------------------------------------------------------------------

def test_assert_almost_equal_mxnet_tolerances_and_message():
    tu = dmx.test_utils
    rng = np.random.default_rng(3)
    for shape in [(5,), (3, 4), (2, 3, 4)]:
        a = rng.standard_normal(shape).astype(np.float32)
        b = a + np.float32(5e-4) * rng.uniform(-1, 1, shape).astype(np.float32)  # inside float32's atol 1e-3
        tu.assert_almost_equal(dnnbind.array(a, device="cpu"), b)
        tu.assert_almost_equal(a, dnnbind.array(b, device="cpu"), rtol=1e-3, atol=1e-3)
        assert tu.almost_equal(a, b) and tu.same(dnnbind.array(a, device="cpu"), a) and not tu.same(a, b)
        bad = b.copy()
        bad.flat[-1] += 0.1
        with pytest.raises(AssertionError) as err:
            tu.assert_almost_equal(a, bad, names=("ours", "ref"))
        msg = str(err.value)
        idx = np.unravel_index(a.size - 1, shape)
        assert "rtol=1.000000e-04, atol=1.000000e-03" in msg and f"{tuple(int(i) for i in idx)}" in msg
        assert "1 of" in msg and "ours=" in msg and "ref=" in msg
    # float64 on both sides: MXNet's float64 defaults (rtol 1e-5, atol 1e-20) reject what float32's accept.
    x = rng.standard_normal(6)
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(x, x * (1 + 1e-4))
    tu.assert_almost_equal(x, x * (1 + 1e-4), rtol={np.dtype(np.float64): 1e-3})
    tu.assert_allclose(x, x.copy())
    with pytest.raises(NotImplementedError, match="sparse"):
        tu.rand_ndarray((2, 2), stype="csr")
    r = tu.rand_ndarray((4, 3), ctx=dmx.cpu())
    assert r.shape == (4, 3) and r.dtype == np.float32 and r.context is dmx.cpu() and r.numpy().std() > 0


def test_image_decode_read_resize_crop(tmp_path):
    PIL = pytest.importorskip("PIL.Image")
    img = dmx.image
    rng = np.random.default_rng(5)
    for h, w in [(7, 9), (16, 12)]:
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        path = tmp_path / f"img{h}x{w}.png"
        PIL.fromarray(pixels).save(path)
        x = img.imread(str(path))
        assert x.shape == (h, w, 3) and x.dtype == np.uint8 and x.context is dmx.cpu()
        np.testing.assert_array_equal(x.numpy(), pixels)  # PNG is lossless: exact pixels
        np.testing.assert_array_equal(img.imread(str(path), to_rgb=False).numpy(), pixels[:, :, ::-1])
        gray = img.imdecode(path.read_bytes(), flag=0)
        ref = np.asarray(PIL.fromarray(pixels).convert("L"))[:, :, None]
        assert gray.shape == (h, w, 1)
        np.testing.assert_array_equal(gray.numpy(), ref)
        np.testing.assert_array_equal(img.imdecode(np.frombuffer(path.read_bytes(), np.uint8)).numpy(), pixels)
        small = img.imresize(x, 5, 4, interp=0)  # OpenCV's nearest, as MXNet's (tests/test_image.py: fixtures)
        assert small.shape == (4, 5, 3) and small.dtype == np.uint8
        assert img.resize_short(x, 6).shape[:2] == ((6 * h // w, 6) if h > w else (6, 6 * w // h))
        crop = img.fixed_crop(x, 1, 2, 4, 3)
        np.testing.assert_array_equal(crop.numpy(), pixels[2:5, 1:5])
        out, (x0, y0, cw, ch) = img.center_crop(x, (4, 4))
        assert (cw, ch) == (4, 4) and (x0, y0) == ((w - 4) // 2, (h - 4) // 2)
        np.testing.assert_array_equal(out.numpy(), pixels[y0:y0 + 4, x0:x0 + 4])
    with pytest.raises(ValueError, match="flag"):
        img.imdecode(b"xx", flag=2)
    with pytest.raises(ValueError, match="bytes"):  # MXNet 1.9.1's own: a ValueError
        img.imdecode("not bytes")


def test_lr_schedulers_match_mxnet():
    L = dmx.lr_scheduler
    assert L is dnnbind.gluon.lr_scheduler
    s = L.FactorScheduler(step=2, factor=0.5, base_lr=1.0)
    assert [s(i) for i in range(7)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    s = L.FactorScheduler(1, 0.1, stop_factor_lr=1e-3, base_lr=1.0, warmup_steps=3, warmup_begin_lr=0.5,
                          warmup_mode="constant")
    assert [round(s(i), 12) for i in range(7)] == [0.5, 0.5, 0.5, 0.01, 0.001, 0.001, 0.001]
    s = L.MultiFactorScheduler([2, 4], factor=0.1, base_lr=1.0)
    assert np.allclose([s(i) for i in range(6)], [1, 1, 1, 0.1, 0.1, 0.01], rtol=1e-12)
    s = L.CosineScheduler(10, base_lr=1.0, final_lr=0.1, warmup_steps=2, warmup_begin_lr=0.2)
    got = [s(i) for i in (0, 1, 2, 6, 10, 12)]
    want = [0.2, 0.6, 1.0, 0.1 + 0.9 * (1 + math.cos(math.pi * 4 / 8)) / 2, 0.1, 0.1]
    assert np.allclose(got, want, rtol=1e-12)
    s = L.PolyScheduler(17, base_lr=0.9, pwr=3, final_lr=0.01, warmup_steps=5, warmup_begin_lr=0.2)
    assert np.isclose(s(9), 0.01 + 0.89 * (1 - 4 / 12) ** 3, rtol=1e-12) and np.isclose(s(3), 0.2 + 0.7 * 3 / 5)
    opt = dmx.optimizer.create("sgd", learning_rate=0.5, lr_scheduler=L.FactorScheduler(2, 0.5))
    assert opt.lr_scheduler.base_lr == 0.5 and isinstance(opt, dmx.optimizer.SGD)
    for bad in [lambda: L.FactorScheduler(0), lambda: L.FactorScheduler(2, factor=1.5),
                lambda: L.MultiFactorScheduler([3, 2]), lambda: L.CosineScheduler(0),
                lambda: L.PolyScheduler(10, base_lr=0.1, warmup_begin_lr=0.2),
                lambda: L.CosineScheduler(10, warmup_mode="cubic")]:
        with pytest.raises(ValueError):
            bad()


@pytest.mark.gpu
def test_gpu_probe_context_and_runner_on_a_gpu(tmp_path):
    mx = dmx
    assert list(mx.test_utils.list_gpus()) == list(range(mx.context.num_gpus())) and mx.context.num_gpus() >= 1
    x = mx.nd.array(np.arange(6, dtype=np.float32)).as_in_context(mx.gpu(0))
    assert x.context is mx.gpu(0) and isinstance(x.context, mx.Context)
    np.testing.assert_array_equal(x.copyto(mx.cpu()).numpy(), np.arange(6, dtype=np.float32))
    free, total = mx.context.gpu_memory_info(0)
    assert 0 < free <= total
    with mx.gpu(0):
        assert dnnbind.zeros((2,)).context is mx.gpu(0)
    script = _write(tmp_path / "train_mx.py", MX_SCRIPT)
    _write(tmp_path / "helper.py", "")
    r = _run(["-m", "dnnbind.mxnet", str(script)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f" gpu(0) {mx.context.num_gpus()} " in r.stdout  # d2l's probe found the GPU


def test_alias_makes_cpu_the_default_context_and_uninstall_restores_it():
    from dnnbind.runtime import device as device_mod
    before = dnnbind.default_device()
    mx = dnnbind.install_mxnet_alias()
    try:
        assert dnnbind.default_device() == dnnbind.cpu(0)
        assert mx.nd.zeros((2,)).context == mx.cpu(0)  # MXNet: arrays made without ctx= live on cpu(0)
        assert mx.context.current_context() == mx.cpu(0)
        with dnnbind.gpu(0) if dnnbind.num_gpus() else dnnbind.cpu(0) as d:  # a with-block still wins
            assert dnnbind.default_device() == d
        assert dnnbind.default_device() == dnnbind.cpu(0)
    finally:
        _finder.uninstall_mxnet_alias()
    assert dnnbind.default_device() == before
    assert device_mod._process_default is None


def test_unbacked_names_are_attribute_errors_too_so_introspection_works(alias):
    """torch.compile runs pickle.whichmodule over every loaded module: hasattr/getattr-with-default must work."""
    import pickle
    from dnnbind.mxnet._unsupported import UnsupportedFeature
    # An MXNet name dnnbind lacks names the feature; a name MXNet lacks too (a typo) is a plain AttributeError,
    # except in a namespace dnnbind does not back at all (mx.profiler), where every name is the feature.
    for mod, mx_name in ((alias.base, "check_call"), (alias.test_utils, "assert_almost_equal_ignore_nan"),
                         (alias.test_utils, "check_numeric_gradient"), (alias.profiler, "no_such_name_here")):
        for name in (mx_name, "no_such_name_here"):
            assert not hasattr(mod, name)
            assert getattr(mod, name, 7) == 7
        with pytest.raises(NotImplementedError, match="not supported by dnnbind"):
            getattr(mod, mx_name)
        if mod is not alias.profiler:
            with pytest.raises(AttributeError) as err:
                getattr(mod, "no_such_name_here")
            assert not isinstance(err.value, NotImplementedError)
    with pytest.raises(UnsupportedFeature):
        alias.profiler.set_config
    assert alias.recordio.MXRecordIO is importlib.import_module("dnnbind.recordio").MXRecordIO
    assert pickle.whichmodule(math.sqrt, "sqrt") == "math"
