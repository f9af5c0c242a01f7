"""scripts/amp_guard.py (issue 26's accuracy guard): its generated CIFAR-100 files are CIFAR-100's binary layout, read
back by dnnbind.gluon.data.vision.CIFAR100 (fine and coarse labels, shapes, dtypes, class balance), deterministic
from the seed and a task neither trivial nor hopeless; its model is ResNet-50 v1.5 with the CIFAR stem; its
augmentation and lr schedule do what they say; a CPU smoke run trains every mode and writes the JSON and the verdict.
Marker ``gpu``: a short run of every mode on the GPU."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from dnnbind.mxnet import _finder  # noqa: E402

amp_guard = None  # the script as a module, imported by _script below


@pytest.fixture(scope="module", autouse=True)
def _script():
    """Import scripts/amp_guard.py for this module's tests. It installs the mxnet alias through d2l_compare (as the
    script does), which makes cpu(0) the process default as MXNet's does; undone afterwards, with the modules it
    brought, so the GPU tests collected after this file see dnnbind's own default (not at import: collection would
    install it for the whole session)."""
    global amp_guard
    meta, mods = list(sys.meta_path), dict(sys.modules)
    import amp_guard as module
    amp_guard = module
    yield
    _finder.uninstall_mxnet_alias()
    sys.meta_path[:] = meta
    for name in [n for n in sys.modules if n not in mods and (n in ("mxnet", "amp_guard", "d2l_compare", "bench_nhwc")
                                                               or n.startswith("mxnet."))]:
        del sys.modules[name]
    amp_guard = None

from dnnbind.gluon.data.vision import CIFAR100  # noqa: E402

TORCHVISION_RESNET50_PARAMS = 25_557_032
SMOKE = ["--device", "cpu", "--epochs", "1", "--train-size", "256", "--test-size", "128", "--batch", "32",
         "--stages", "1", "1", "1", "1", "--width", "4"]


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def test_generated_files_are_cifar100s_binary_layout(tmp_path):
    meta = amp_guard.generate(str(tmp_path), train_size=300, test_size=205, seed=3)
    assert meta["train_size"] == 300 and meta["test_size"] == 205 and meta["seed"] == 3
    assert (tmp_path / "train.bin").stat().st_size == 300 * (2 + 3072)
    assert (tmp_path / "test.bin").stat().st_size == 205 * (2 + 3072)
    raw = np.fromfile(tmp_path / "train.bin", np.uint8).reshape(300, 3074)
    for train, n in ((True, 300), (False, 205)):
        fine = CIFAR100(root=tmp_path, fine_label=True, train=train)
        coarse = CIFAR100(root=tmp_path, fine_label=False, train=train)
        assert len(fine) == n and fine.data.shape == (n, 32, 32, 3) and fine.data.dtype == np.uint8
        assert fine.label.dtype == np.int32 and fine.label.shape == (n,)
        assert 0 <= fine.label.min() and fine.label.max() < 100
        np.testing.assert_array_equal(coarse.label, fine.label // 5)  # 20 super-classes of 5
        np.testing.assert_array_equal(coarse.data, fine.data)
        counts = np.bincount(fine.label, minlength=100)  # balanced as the real files: n // 100 each, the rest spread
        assert counts.min() == n // 100 and counts.max() == -(-n // 100)
        image, label = fine[7]
        assert image.shape == (32, 32, 3) and int(label) == fine.label[7]
    # the pixel bytes are the R, G, B planes in that order: CIFAR100's HWC image from the record by hand
    ds = CIFAR100(root=tmp_path, fine_label=True, train=True)
    np.testing.assert_array_equal(ds.data[0], raw[0, 2:].reshape(3, 32, 32).transpose(1, 2, 0))
    assert ds.label[0] == raw[0, 1] and raw[0, 0] == raw[0, 1] // 5


def test_generation_is_deterministic_from_the_seed(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    amp_guard.generate(str(a), 256, 128, seed=5)
    amp_guard.generate(str(b), 256, 128, seed=5)
    amp_guard.generate(str(c), 256, 128, seed=6)
    for name in ("train.bin", "test.bin"):
        assert _sha1(a / name) == _sha1(b / name)
        assert _sha1(a / name) != _sha1(c / name)
    # ensure_data reuses matching files and rewrites when the seed differs
    assert amp_guard.ensure_data(str(a), 200, 100, 5)["generated"] is False
    assert amp_guard.ensure_data(str(a), 300, 100, 5)["generated"] is True  # more images than the files hold
    assert amp_guard.ensure_data(str(a), 300, 100, 7)["generated"] is True
    assert amp_guard.ensure_data(str(a), 300, 100, 7, {"nuisance": 1.0})["generated"] is True  # other knobs
    assert amp_guard.ensure_data(str(a), 300, 100, 7, {"nuisance": 1.0})["generated"] is False


def test_the_task_is_learnable_and_not_trivial(tmp_path):
    """Nearest class mean (of the training images) on the test images: far above chance (1%), far below 100%.
    Images of one class all differ; the pixels use most of the byte range."""
    amp_guard.generate(str(tmp_path), 5000, 1000, seed=0)
    tr = CIFAR100(root=tmp_path, fine_label=True, train=True)
    te = CIFAR100(root=tmp_path, fine_label=True, train=False)
    x = tr.data.reshape(len(tr), -1).astype(np.float64)
    means = np.stack([x[tr.label == c].mean(0) for c in range(100)])
    means -= means.mean(1, keepdims=True)
    t = te.data.reshape(len(te), -1).astype(np.float64)
    t -= t.mean(1, keepdims=True)
    acc = float((np.argmax(t @ means.T / np.linalg.norm(means, axis=1), axis=1) == te.label).mean())
    assert 0.05 < acc < 0.9, acc
    same = tr.data[tr.label == 0]
    assert len({hashlib.sha1(im.tobytes()).hexdigest() for im in same}) == len(same)
    assert tr.data.min() == 0 and tr.data.max() == 255 and 100 < tr.data.mean() < 156


def test_model_is_resnet50_v15_with_the_cifar_stem():
    """torchvision's ResNet-50 parameter count, less the 7x7 stem's weights plus the 3x3's, less the 1000-way
    Dense plus the 100-way one; NHWC twin (bench_nhwc) of a small one holds the same values."""
    import dnnbind

    args = amp_guard.parse_args([])
    net = amp_guard.build_net(amp_guard.spec_for(args), "tf32", dnnbind.cpu(), 0, hybrid=False)
    want = TORCHVISION_RESNET50_PARAMS - 7 * 7 * 3 * 64 + 3 * 3 * 3 * 64 - (2048 * 1000 + 1000) + (2048 * 100 + 100)
    assert amp_guard.d2l.num_trainable(net) == want == 23_705_252
    convs = [p for name, p in net.collect_params().items() if name.endswith("weight") and p.data().ndim == 4]
    assert convs[0].shape == (64, 3, 3, 3) and len(convs) == 53  # 1 stem + 16 x 3 + 4 projections
    assert not any("pool" in name for name in net.collect_params())


def test_small_model_nhwc_twin_matches_nchw_logits():
    import dnnbind
    from dnnbind import nd

    spec = amp_guard.spec_for(amp_guard.parse_args(["--stages", "1", "1", "0", "0", "--width", "8"]))
    nchw = amp_guard.build_net(spec, "tf32", dnnbind.cpu(), 0, hybrid=False)
    nhwc = amp_guard.build_net(spec, "fp16-nhwc", dnnbind.cpu(), 0, hybrid=False)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    a = nchw(nd.array(x)).asnumpy()
    b = nhwc(nd.array(x.transpose(0, 2, 3, 1), dtype="float16")).asnumpy().astype(np.float32)
    assert a.shape == b.shape == (2, 100)
    np.testing.assert_allclose(b, a, atol=0.05 * np.abs(a).max(), rtol=0)  # float16 against float32


def test_batches_are_paired_across_modes_and_augmented():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, (64, 32, 32, 3), dtype=np.uint8)  # no zero pixel: padding shows as 0
    labels = np.arange(64, dtype=np.int32)  # one image per label: a batch's labels say which images it holds
    b = amp_guard.Batches(images, labels)
    nchw = list(b.epoch(seed=1, epoch=0, batch=16, layout="NCHW"))
    nhwc = list(b.epoch(seed=1, epoch=0, batch=16, layout="NHWC"))
    again = list(b.epoch(seed=1, epoch=0, batch=16, layout="NCHW"))
    other = list(b.epoch(seed=1, epoch=1, batch=16, layout="NCHW"))
    assert len(nchw) == 4 and nchw[0][0].shape == (16, 3, 32, 32) and nhwc[0][0].shape == (16, 32, 32, 3)
    assert nchw[0][0].dtype == np.uint8 and nchw[0][0].flags["C_CONTIGUOUS"]
    for (x, y), (xh, yh), (xa, ya) in zip(nchw, nhwc, again):
        np.testing.assert_array_equal(y, yh)
        np.testing.assert_array_equal(x, xa)
        np.testing.assert_array_equal(xh, x.transpose(0, 2, 3, 1))
    assert not np.array_equal(nchw[0][1], other[0][1])
    # each sample is a 32x32 window of its zero-padded image (a shift of up to 4 each way), maybe mirrored; over an
    # epoch both mirrored and plain windows, and more than one shift, occur
    seen = set()
    for x, y in nchw:
        for xi, k in zip(x, y):
            padded = np.pad(images[k], ((4, 4), (4, 4), (0, 0)))
            hits = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                    if np.array_equal(xi.transpose(1, 2, 0), padded[dy:dy + 32, dx:dx + 32][:, ::-1 if f else 1])]
            assert hits, k
            seen.update(hits)
    assert {f for _, _, f in seen} == {False, True} and len({(dy, dx) for dy, dx, _ in seen}) > 10
    # the last partial batch is dropped
    assert len(list(b.epoch(seed=0, epoch=0, batch=24, layout="NCHW"))) == 2


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normalize_on_the_device(layout):
    import dnnbind

    x = np.random.default_rng(0).integers(0, 256, (4, 3, 8, 8) if layout == "NCHW" else (4, 8, 8, 3), dtype=np.uint8)
    mean, std = np.array([120, 125, 130], np.float32), np.array([60, 61, 62], np.float32)
    shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    want = (x.astype(np.float64) - mean.reshape(shape)) / std.reshape(shape)
    got = amp_guard.Normalize(mean, std, layout, np.float32, dnnbind.cpu())(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6, atol=1e-6)
    half = amp_guard.Normalize(mean, std, layout, np.float16, dnnbind.cpu())(x)
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half.asnumpy(), got.asnumpy().astype(np.float16))


def test_lr_schedule_warms_up_then_cosine():
    lrs = [amp_guard.lr_at(s, 100, 10, 0.4) for s in range(100)]
    np.testing.assert_allclose(lrs[:10], 0.4 * np.arange(1, 11) / 10)
    assert lrs[10] == pytest.approx(0.4) and lrs[55] == pytest.approx(0.2) and 0 < lrs[-1] < 1e-3
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_verdict_rule():
    runs = [{"mode": m, "seed": s, "status": "ok", "test_acc": a, "train_loss": 1.0, "epochs": []}
            for m, s, a in (("tf32", 0, 0.70), ("tf32", 1, 0.72), ("fp16", 0, 0.69), ("fp16", 1, 0.705),
                            ("fp32", 0, 0.60), ("fp32", 1, 0.61))]
    summary = amp_guard.summarize(runs, ["tf32", "fp16", "fp32"])
    assert summary["tf32"]["mean_acc_pp"] == pytest.approx(71.0)
    assert summary["tf32"]["std_acc_pp"] == pytest.approx(np.std([70, 72], ddof=1))
    v = amp_guard.verdict(summary, runs)
    rows = {r["mode"]: r for r in v["comparisons"]}
    assert v["reference"] == "tf32" and not v["pass"]
    assert rows["fp16"]["pass"] and rows["fp16"]["diff_pp"] == pytest.approx(-1.25)
    assert rows["fp16"]["tol_pp"] == pytest.approx(2 * np.std([70, 72], ddof=1))
    np.testing.assert_allclose(rows["fp16"]["paired_diffs_pp"], [-1.0, -1.5])
    assert not rows["fp32"]["pass"]
    one = amp_guard.summarize(runs[:1] + runs[2:3], ["tf32", "fp16"])  # one seed each: the 1 pp floor
    assert amp_guard.verdict(one, runs)["comparisons"][0]["tol_pp"] == 1.0
    assert amp_guard.verdict(amp_guard.summarize(runs, ["tf32"]), runs)["pass"] is None  # nothing to compare


def _smoke(tmp_path, *extra, timeout=600):
    path = tmp_path / "amp_guard.json"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "amp_guard.py"), *SMOKE, "--root",
                          str(tmp_path / "data"), "--json", str(path), *extra], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(path.read_text()), out.stdout


def test_cpu_smoke_run_writes_the_json(tmp_path):
    result, stdout = _smoke(tmp_path, "--modes", "tf32", "fp16", "--seeds", "1", "--eager")
    assert {"config", "model", "parameters", "data", "runs", "summary", "verdict", "total_s"} <= set(result)
    assert result["data"]["train_size"] == 256 and result["data"]["test_size"] == 128
    assert [(r["mode"], r["seed"], r["status"]) for r in result["runs"]] == [("tf32", 0, "ok"), ("fp16", 0, "ok")]
    for r in result["runs"]:
        assert {"test_acc", "train_loss", "seconds", "epochs"} <= set(r)
        assert 0 <= r["test_acc"] <= 1 and np.isfinite(r["train_loss"]) and len(r["epochs"]) == 1
        assert 3.0 < r["train_loss"] < 6.0  # near ln(100) = 4.6 after 8 small steps
    assert set(result["summary"]) == {"tf32", "fp16"}
    v = result["verdict"]
    assert v["reference"] == "tf32" and [c["mode"] for c in v["comparisons"]] == ["fp16"]
    assert v["comparisons"][0]["tol_pp"] == 1.0 and isinstance(v["pass"], bool)
    assert "verdict:" in stdout
    # same seed, same data, same initial weights: fp16's first epoch stays near tf32's
    losses = [r["train_loss"] for r in result["runs"]]
    assert abs(losses[0] - losses[1]) < 0.05, losses


def test_generate_only_needs_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "amp_guard.py"), "--generate-only", "--train-size",
                          "200", "--test-size", "100", "--root", str(tmp_path)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "200 train / 100 test images written" in out.stdout
    assert len(CIFAR100(root=tmp_path, fine_label=True, train=False)) == 100


@pytest.mark.gpu
def test_gpu_short_run_every_mode(tmp_path, gpu):
    """Every mode, hybridized, on the GPU: one epoch of 4,096 images of the small bottleneck net; all finish with
    finite losses, and from the same weights and batches the fp16 modes' train loss stays near TF32's."""
    path = tmp_path / "amp_guard.json"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "amp_guard.py"), "--device", "gpu", "--epochs", "1",
                          "--train-size", "4096", "--test-size", "1000", "--batch", "128", "--stages", "1", "1", "1",
                          "1", "--modes", "tf32", "fp16", "fp16-nhwc", "fp32", "--seeds", "1", "--root",
                          str(tmp_path / "data"), "--json", str(path)], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    runs = {r["mode"]: r for r in result["runs"]}
    assert all(r["status"] == "ok" for r in runs.values()), {m: r.get("reason") for m, r in runs.items()}
    assert all(np.isfinite(r["train_loss"]) for r in runs.values())
    for m in ("fp16", "fp16-nhwc", "fp32"):
        assert abs(runs[m]["train_loss"] - runs["tf32"]["train_loss"]) < 0.1, (m, runs[m]["train_loss"],
                                                                               runs["tf32"]["train_loss"])
