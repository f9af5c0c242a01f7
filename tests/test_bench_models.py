"""scripts/bench.py --model resnet18|alexnet|resnet50 (scripts/bench_models.py) on the CPU: --help needs neither a
GPU nor torch; the smoke run builds the model, runs dnnbind's fp32 eager step, reports the GPU-only modes (dnnbind's
mixed precision among them) as skipped, and writes the JSON. With torch installed, the torch model (weights copied)
gives ResNet-18's and ResNet-50's first training loss to float32 rounding. ResNet-50 v1.5's layout is held to
torchvision's parameter count and to its multiply-adds worked out by hand; its NHWC twin (bench_nhwc) to the NCHW
model's logits. Each run is a subprocess: d2l_compare installs the mxnet alias at import."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


TORCHVISION_RESNET50_PARAMS = 25_557_032  # sum(p.numel() for p in torchvision.models.resnet50().parameters())
INPUTS = {"resnet18": [1, 96, 96], "alexnet": [1, 224, 224], "resnet50": [3, 224, 224]}
PAIRED = {"resnet18": 110, "alexnet": 16, "resnet50": 267}  # tensors copied into torch's model (running stats too)


def _bench(*args, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _python(code: str, timeout=300):
    """Run ``code`` with scripts/ importable; its last stdout line, parsed as JSON."""
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts')\n" + textwrap.dedent(code)],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_help_needs_no_gpu_and_no_torch():
    out = _bench("--model", "resnet18", "--help")
    assert out.returncode == 0, out.stderr
    assert "--skip-compile" in out.stdout and "--compile-budget" in out.stdout
    out = _bench("--help")  # the SimpleCNN benchmark's own options, with --model listed
    assert out.returncode == 0 and "--skip-ops" in out.stdout and "resnet18" in out.stdout
    assert "resnet50" in out.stdout


def test_resnet50_default_modes():
    """Without --modes, --model resnet50 times its own list on the GPU (TF32 and mixed precision, max-autotune
    last), the others every mode; on the CPU every model the fp32 eager modes, the ones that run there."""
    got = _python("""
        import json, bench_models as b
        print(json.dumps({m: {d: b.default_modes(m, d) for d in ("gpu", "cpu")} for m in b.MODELS}))
    """)
    r50 = got["resnet50"]["gpu"]
    assert r50[-1] == "torch-compile-amp-max" and "dnnbind-fp32" not in r50 and "torch-fp32" not in r50
    assert {"dnnbind-amp-nhwc-hybrid", "dnnbind-amp-nhwc-captured", "dnnbind-captured", "torch-amp",
            "torch-amp-graph", "torch-compile-amp"} <= set(r50)
    assert got["resnet18"]["gpu"][:2] == ["dnnbind-fp32", "dnnbind-tf32"] and len(got["resnet18"]["gpu"]) > len(r50)
    assert all(got[m]["cpu"] == ["dnnbind-fp32", "torch-fp32"] for m in got)


def test_resnet50_cpu_smoke_with_the_defaults(tmp_path):
    """The plain CPU smoke command, `bench.py --model resnet50 --device cpu --batch 2 --steps 1`: one warm-up step,
    dnnbind's fp32 eager step end to end, lr 0.1, 3x224x224 inputs and 1000 classes."""
    path = tmp_path / "bench.json"
    out = _bench("--model", "resnet50", "--device", "cpu", "--batch", "2", "--steps", "1", "--json", str(path),
                 timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert list(result["runs"]) == ["dnnbind-fp32", "torch-fp32"] and result["warmup_steps"] == 1
    assert result["runs"]["dnnbind-fp32"]["status"] == "ok", result["runs"]["dnnbind-fp32"]
    assert result["lr"] == 0.1 and result["input"] == [3, 224, 224] and result["classes"] == 1000


@pytest.mark.parametrize("model", ["resnet18", "alexnet", "resnet50"])
def test_cpu_smoke_run(tmp_path, model):
    path = tmp_path / "bench.json"
    out = _bench("--model", model, "--device", "cpu", "--batch", "2", "--warmup", "1", "--steps", "1",
                 "--modes", "dnnbind-fp32", "dnnbind-captured", "dnnbind-amp", "torch-fp32", "--json", str(path),
                 timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["model"] == model and result["batch"] == 2
    assert result["input"] == INPUTS[model]
    assert result["classes"] == (1000 if model == "resnet50" else 10)
    assert result["floor"]["fp16"]["gflop"] > 0 and result["floor"]["tf32"]["memory_ms"] > 0
    if model == "resnet50":
        assert result["parameters"] == TORCHVISION_RESNET50_PARAMS
        assert result["lr"] == 0.1 and result["momentum"] == 0.9
        assert f"{TORCHVISION_RESNET50_PARAMS:,} trainable parameters" in out.stdout
    runs = result["runs"]
    assert runs["dnnbind-fp32"]["status"] == "ok", runs["dnnbind-fp32"]
    assert runs["dnnbind-fp32"]["ms"] > 0 and runs["dnnbind-fp32"]["final_loss"] == runs["dnnbind-fp32"]["final_loss"]
    assert runs["dnnbind-captured"]["status"] == "skipped"
    assert runs["dnnbind-amp"]["status"] == "skipped"
    if runs["torch-fp32"]["status"] == "skipped":
        return  # no torch here (as in CI)
    assert runs["torch-fp32"]["status"] == "ok", runs["torch-fp32"]
    assert result["paired_tensors"] == PAIRED[model]
    assert result["parameters_torch"] == result["parameters"]
    check = result["weights_check"]
    assert abs(check["loss_dnnbind"] - check["loss_torch"]) < 1e-5 * abs(check["loss_torch"]), check
    if model != "alexnet":  # no dropout: the same first training step from the same weights
        first = runs["dnnbind-fp32"]["first_loss"], runs["torch-fp32"]["first_loss"]
        assert abs(first[0] - first[1]) < 1e-4 * abs(first[1]), first


def test_scaling_benchmark_help_and_a_clear_refusal_without_the_gpus():
    """bench.py --gpus N goes to scripts/bench_scaling.py: its options need no GPU; asking for more GPUs than the
    machine has stops with one line saying how many there are."""
    out = _bench("--model", "resnet18", "--gpus", "2", "--help")
    assert out.returncode == 0, out.stderr
    assert "--modes" in out.stdout and "single" in out.stdout and "launch" in out.stdout
    out = _bench("--model", "resnet18", "--gpus", "64", "--modes", "single")
    assert out.returncode != 0 and "--gpus 64: this machine has" in out.stderr, out.stderr[-2000:]


def test_model_floor_counts_alexnets_multiply_adds_and_traffic():
    """scripts/model_floor.py against AlexNet's layer arithmetic worked out by hand (alexnet.md, 1x224x224)."""
    out = subprocess.run([sys.executable, "-c", "import sys, json; sys.path.insert(0, 'scripts'); import model_floor;"
                          "print(json.dumps(model_floor.main(['--model', 'alexnet', '--batch', '2'])))"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    convs = [  # (out channels, out side, in channels * kh * kw)
        (96, 54, 1 * 11 * 11), (256, 26, 96 * 5 * 5), (384, 12, 256 * 3 * 3), (384, 12, 384 * 3 * 3),
        (256, 12, 384 * 3 * 3)]
    dense = [6400 * 4096, 4096 * 4096, 4096 * 10]
    macs = [c * s * s * k for c, s, k in convs] + dense
    flops = 2 * 2 * (3 * sum(macs) - macs[0])  # batch 2; the first layer has no data gradient
    assert abs(got["tf32"]["gflop"] - flops / 1e9) < 1e-9
    params = sum(c * k + c for c, _, k in convs) + sum(dense) + 4096 + 4096 + 10
    assert abs(got["tf32"]["params_m"] - params / 1e6) < 1e-9
    outs = [c * s * s for c, s, _ in convs] + [96 * 26 * 26, 256 * 12 * 12, 256 * 5 * 5] + [4096] * 4 + [10]
    assert abs(got["fp16"]["activation_mib"] - 2 * 2 * sum(outs) / 2**20) < 1e-9
    assert got["fp16"]["compute_ms"] * 2 == pytest.approx(got["tf32"]["compute_ms"])


def _resnet50_by_hand():
    """ResNet-50 v1.5 at 3x224x224 from its definition: [(macs, weights)] of every conv and the Dense, and the
    BatchNorm channels. The stride is on each stage's first 3x3 (v1.5), so its 1x1 reduce runs at the input's
    resolution; the stem and every conv are bias-free."""
    layers, bn = [(64 * 112 * 112 * 3 * 49, 64 * 3 * 49)], [64]  # 7x7/2 stem; then 3x3/2 max pool: 56x56
    cin, side = 64, 56
    for n, cout, stride in ((3, 256, 1), (4, 512, 2), (6, 1024, 2), (3, 2048, 2)):
        mid = cout // 4
        for b in range(n):
            s_out = side // stride if b == 0 else side
            convs = [(mid, side, cin), (mid, s_out, mid * 9), (cout, s_out, mid)]  # (out ch, out side, in * kh * kw)
            if b == 0:
                convs.append((cout, s_out, cin))  # the projection shortcut, 1x1 with the stride
            layers += [(c * s * s * k, c * k) for c, s, k in convs]
            bn += [mid, mid, cout] + ([cout] if b == 0 else [])
            cin, side = cout, s_out
    layers.append((2048 * 1000, 2048 * 1000))
    return layers, bn


def test_resnet50_v1_5_layout_parameters_and_multiply_adds():
    """model_floor.py on d2l_compare's resnet50 against the network worked out by hand: torchvision's 25,557,032
    parameters, v1.5's 4.09 G multiply-adds per image (v1, stride on the 1x1, has 3.86 G), 110 leaf layers."""
    layers, bn = _resnet50_by_hand()
    params = sum(w for _, w in layers) + 1000 + 2 * sum(bn)
    assert params == TORCHVISION_RESNET50_PARAMS  # the hand count itself
    got = _python("""
        import json, model_floor
        rows = model_floor.layer_shapes(model_floor.spec_for('resnet50'))
        print(json.dumps({"rows": len(rows), "macs": sum(r["macs"] for r in rows),
                          "params": sum(r["weights"] for r in rows), "out": rows[-1]["out"],
                          "floor": model_floor.main(['--model', 'resnet50', '--batch', '2'])}))
    """)
    macs = [m for m, _ in layers]
    assert got["params"] == TORCHVISION_RESNET50_PARAMS
    assert got["macs"] == sum(macs) and abs(sum(macs) / 1e9 - 4.09) < 0.01
    assert got["rows"] == 110 and got["out"] == [1000]  # 53 convs, 53 BatchNorms, stem ReLU, pools, Dense
    flops = 2 * 2 * (3 * sum(macs) - macs[0])  # batch 2; the stem has no data gradient
    assert abs(got["floor"]["tf32"]["gflop"] - flops / 1e9) < 1e-9
    assert abs(got["floor"]["fp16"]["params_m"] - TORCHVISION_RESNET50_PARAMS / 1e6) < 1e-12


def test_resnet50_nhwc_twin_gives_the_nchw_logits():
    """bench_nhwc's ResNet-50 twin (NHWC layers, each Bottleneck ending in nn.BatchNormAddRelu) holds the NCHW
    model's weights, transposed, and scores a 3-channel batch as it does (predict mode, CPU; input 64x64 to keep
    it short: the network ends in a global pool)."""
    got = _python("""
        import dataclasses, json
        import numpy as np
        import bench_nhwc, d2l_compare as d2l
        import dnnbind as mx
        spec = dataclasses.replace(d2l.ZOO_SPECS['resnet50'], size=64)
        d2l.mx.random.seed(3)
        net = spec.build_mx()
        net.initialize(d2l.INIT(), ctx=mx.cpu())
        x = mx.array(np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32))
        ref = net(x).numpy()
        twin = bench_nhwc.build(spec, net, mx.cpu())
        blocks = []
        twin.apply(blocks.append)
        xs = bench_nhwc.to_nhwc(x)
        print(json.dumps({"ref": ref.tolist(), "nhwc": twin(xs).numpy().tolist(), "x_nhwc": list(xs.shape),
                          "same": bool(np.array_equal(xs.numpy(), x.numpy().transpose(0, 2, 3, 1))),
                          "params": d2l.num_trainable(twin),
                          "kinds": [type(b).__name__ for b in blocks]}))
    """)
    ref, nhwc = np.array(got["ref"]), np.array(got["nhwc"])
    assert ref.shape == (2, 1000) and got["x_nhwc"] == [2, 64, 64, 3] and got["same"]
    assert np.abs(nhwc - ref).max() <= 1e-4 * np.abs(ref).max(), np.abs(nhwc - ref).max()
    assert got["params"] == TORCHVISION_RESNET50_PARAMS
    kinds = got["kinds"]  # every Bottleneck's bn3 fused: 16 of them; its other BatchNorms and the shortcuts' not
    assert kinds.count("BatchNormAddRelu") == 16 and kinds.count("BatchNorm") == 53 - 16, kinds


@pytest.mark.gpu
def test_gpu_resnet50_modes_run(tmp_path):
    """On the GPU, ResNet-50 at batch 16, 2 timed steps: dnnbind's TF32 and fp16 NHWC modes (eager, hybridized,
    captured) and, with torch, its TF32 and AMP eager and AMP CUDA-graph modes run, all from the same first loss
    (same weights, same batch; TF32, float16 and bfloat16 rounding apart)."""
    path = tmp_path / "bench.json"
    modes = ["dnnbind-tf32", "dnnbind-hybrid", "dnnbind-captured", "dnnbind-amp-nhwc", "dnnbind-amp-nhwc-hybrid",
             "dnnbind-amp-nhwc-captured", "torch-tf32", "torch-amp", "torch-amp-graph"]
    out = _bench("--model", "resnet50", "--batch", "16", "--warmup", "2", "--steps", "2", "--pool", "2",
                 "--modes", *modes, "--json", str(path), timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    runs = result["runs"]
    torch_here = runs["torch-tf32"]["status"] != "skipped"
    for key in modes:
        if key.startswith("torch") and not torch_here:
            continue
        assert runs[key]["status"] == "ok", (key, runs[key].get("reason"), runs[key].get("traceback"))
        assert runs[key]["ms"] > 0 and (runs[key].get("peak_mib") or 0) > 0 and runs[key]["vs_floor"] > 1, runs[key]
    first = runs["dnnbind-tf32"]["first_loss"]
    for key in [k for k in modes if runs[k]["status"] == "ok"]:
        assert abs(runs[key]["first_loss"] - first) < 3e-2 * first, (key, runs[key]["first_loss"], first)
    assert result["parameters"] == TORCHVISION_RESNET50_PARAMS
    if torch_here:
        assert result["parameters_torch"] == TORCHVISION_RESNET50_PARAMS
        check = result["weights_check"]
        assert abs(check["loss_dnnbind"] - check["loss_torch"]) < 1e-4 * abs(check["loss_torch"]), check


def test_cpu_smoke_fed_by_the_image_record_iter(tmp_path):
    """--data rec: the .rec is written under --rec-dir with batch * (warm-up + steps) JPEGs, the iterator and the copy
    are timed alone, and each dnnbind mode that runs here also runs fed by the iterator (the GPU-only ones reported
    as skipped for both), from other pixels than the synthetic pool's; a synthetic run writes none of it."""
    path, rec_dir = tmp_path / "bench.json", tmp_path / "rec"
    out = _bench("--model", "resnet18", "--device", "cpu", "--batch", "2", "--warmup", "1", "--steps", "2",
                 "--modes", "dnnbind-fp32", "dnnbind-amp-nhwc-captured", "--data", "rec", "--rec-dir", str(rec_dir),
                 "--rec-threads", "2", "--json", str(path), timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["data"] == "rec" and result["rec"]["images"] == 2 * (1 + 2)
    assert os.path.exists(rec_dir / "synthetic_6.rec") and os.path.exists(rec_dir / "synthetic_6.idx")
    rates = result["rec"]["dtypes"]["float32"]
    assert rates["iterator_images_per_s"] > 0 and rates["copy_images_per_s"] > 0
    real, synthetic = result["runs_rec"]["dnnbind-fp32"], result["runs"]["dnnbind-fp32"]
    assert real["status"] == "ok" and synthetic["status"] == "ok", real
    assert real["first_loss"] != synthetic["first_loss"]  # the iterator's pixels, not the pool's
    assert real["vs_synthetic"] == pytest.approx(real["images_per_s_wall"] / real["synthetic_images_per_s_wall"])
    assert real["limit"] in ("iterator", "host-to-device copy", "step", "host contention")
    assert real["iterator_dtype"] == "float32" and real["iterator_images_per_s"] == rates["iterator_images_per_s"]
    assert result["runs_rec"]["dnnbind-amp-nhwc-captured"]["status"] == "skipped"
    assert "fed by mx.io.ImageRecordIter" in out.stdout and "iterator alone" in out.stdout
    out = _bench("--model", "resnet18", "--device", "cpu", "--batch", "2", "--warmup", "1", "--steps", "1",
                 "--modes", "dnnbind-fp32", "--json", str(path), timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert not {"data", "rec", "runs_rec"} & set(result) and "fed by" not in out.stdout


def test_rec_limit_names_the_slowest_stage():
    """bench_models.rec_limit: the iterator when it is slower than copy and step in series; the copy when copy and
    step in series fall under 90% of the step; the step when real data reaches 90% of it; else host contention."""
    got = _python("""
        import json, bench_models as b
        print(json.dumps([b.rec_limit(*r) for r in [(900, 1000, 1e5, 3000), (2500, 5000, 1e4, 3000),
                                                     (2900, 8000, 1e5, 3000), (2000, 8000, 1e5, 3000)]]))
    """)
    assert [g[0] for g in got] == ["iterator", "host-to-device copy", "step", "host contention"]
    assert got[1][1] == pytest.approx(1 / (1 / 1e4 + 1 / 3000))


@pytest.mark.gpu
def test_gpu_resnet50_fed_by_the_image_record_iter(tmp_path):
    """On the GPU, ResNet-50 at batch 16 fed by the iterator: the TF32 eager and the fp16 NHWC captured modes run
    on the iterator's batches (copied, cast, transposed as the pool), from a first loss near ln(1000)."""
    path = tmp_path / "bench.json"
    modes = ["dnnbind-tf32", "dnnbind-amp-nhwc-captured"]
    out = _bench("--model", "resnet50", "--batch", "16", "--warmup", "2", "--steps", "3", "--pool", "2",
                 "--modes", *modes, "--data", "rec", "--rec-dir", str(tmp_path / "rec"), "--json", str(path),
                 timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["rec"]["images"] == 16 * 5 and result["rec"]["dtypes"]["float32"]["copy_images_per_s"] > 0
    for key in modes:
        r = result["runs_rec"][key]
        assert r["status"] == "ok", (key, r.get("reason"), r.get("traceback"))
        assert 4 < r["first_loss"] < 12 and r["vs_synthetic"] > 0 and r["limit"], (key, r)
    # --rec-dtype model: the fp16 mode takes the iterator's float16 batches, the TF32 one float32
    out = _bench("--model", "resnet50", "--batch", "16", "--warmup", "2", "--steps", "3", "--pool", "2",
                 "--modes", *modes, "--data", "rec", "--rec-dtype", "model", "--rec-dir", str(tmp_path / "rec"),
                 "--json", str(path), timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = json.loads(path.read_text())["runs_rec"]
    assert [runs[k]["iterator_dtype"] for k in modes] == ["float32", "float16"]
    assert all(runs[k]["status"] == "ok" and 4 < runs[k]["first_loss"] < 12 for k in modes), runs


def test_results_file_is_replaced_whole_or_not_at_all(tmp_path):
    """bench_timing.save_json (every results write of bench_models/bench_ssd): the new results replace the file
    whole; a write that fails part-way (an unserializable value) leaves the previous file and no temporary one."""
    path = tmp_path / "bench.json"
    got = _python(f"""
        import json, os, bench_timing
        path = {str(path)!r}
        bench_timing.save_json(path, {{"runs": {{"a": 1.5}}}})
        first = json.load(open(path))
        try:
            bench_timing.save_json(path, {{"runs": {{"a": 2.5, "bad": object()}}}})
            raised = False
        except TypeError:
            raised = True
        print(json.dumps([first, json.load(open(path)), raised, sorted(os.listdir(os.path.dirname(path)))]))
    """)
    assert got == [{"runs": {"a": 1.5}}, {"runs": {"a": 1.5}}, True, ["bench.json"]], got
