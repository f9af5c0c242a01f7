"""scripts/bench.py --model resnet18|alexnet (scripts/bench_models.py) on the CPU: --help needs neither a GPU nor
torch; the smoke run builds the d2l model, runs dnnbind's fp32 eager step, reports the GPU-only modes (dnnbind's
mixed precision among them) as skipped, and writes the JSON. With torch installed, the torch model (weights copied)
gives ResNet-18's first training loss to float32 rounding. Each run is a subprocess: d2l_compare installs the
mxnet alias at import."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_help_needs_no_gpu_and_no_torch():
    out = _bench("--model", "resnet18", "--help")
    assert out.returncode == 0, out.stderr
    assert "--skip-compile" in out.stdout and "--compile-budget" in out.stdout
    out = _bench("--help")  # the SimpleCNN benchmark's own options, with --model listed
    assert out.returncode == 0 and "--skip-ops" in out.stdout and "resnet18" in out.stdout


@pytest.mark.parametrize("model", ["resnet18", "alexnet"])
def test_cpu_smoke_run(tmp_path, model):
    path = tmp_path / "bench.json"
    out = _bench("--model", model, "--device", "cpu", "--batch", "2", "--warmup", "1", "--steps", "1",
                 "--modes", "dnnbind-fp32", "dnnbind-captured", "dnnbind-amp", "torch-fp32", "--json", str(path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["model"] == model and result["batch"] == 2
    assert result["input"] == ([1, 96, 96] if model == "resnet18" else [1, 224, 224])
    runs = result["runs"]
    assert runs["dnnbind-fp32"]["status"] == "ok", runs["dnnbind-fp32"]
    assert runs["dnnbind-fp32"]["ms"] > 0 and runs["dnnbind-fp32"]["final_loss"] == runs["dnnbind-fp32"]["final_loss"]
    assert runs["dnnbind-captured"]["status"] == "skipped"
    assert runs["dnnbind-amp"]["status"] == "skipped"
    if runs["torch-fp32"]["status"] == "skipped":
        return  # no torch here (as in CI)
    assert runs["torch-fp32"]["status"] == "ok", runs["torch-fp32"]
    assert result["paired_tensors"] == (110 if model == "resnet18" else 16)
    check = result["weights_check"]
    assert abs(check["loss_dnnbind"] - check["loss_torch"]) < 1e-5 * abs(check["loss_torch"]), check
    if model == "resnet18":  # no dropout: the same first training step from the same weights
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
