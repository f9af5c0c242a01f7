"""scripts/bench_scaling.py (python scripts/bench.py --model resnet18 --gpus N) and scripts/bench_ddp_torch.py on the
CPU, without torch: the options, the command lines built for dnnbind.launch and torchrun (each parsed back by the
script it starts), the run plan, the table and its ratios from made-up results, the skip line when torch is missing,
--dry-run, and the driver end to end with its runs replaced by fakes. The GPU runs themselves are not tested here.

The pure functions are tested in this process; whatever calls main() runs in a subprocess, since main imports
d2l_compare, which installs the mxnet alias."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


@pytest.fixture
def bs():
    """scripts/bench_scaling.py as a module (and bench_ddp_torch, which imports it); sys.path restored after."""
    path = list(sys.path)
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("bench_scaling")
    finally:
        sys.path[:] = path
        for name in ("bench_scaling", "bench_ddp_torch"):
            sys.modules.pop(name, None)


def _python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


# ---- options ---------------------------------------------------------------------------------------------------------

def test_defaults_run_everything_in_bounded_steps(bs):
    a = bs.parse_args([])
    assert (a.loops, a.modes, a.torch) == (["hybrid", "eager"], ["single", "launch"], ["eager"])
    assert (a.warmup, a.steps, a.gpus) == (30, 50, 2)
    assert a.json == "runs/bench_scaling_resnet18_2gpu.json" and not a.dry_run


@pytest.mark.parametrize("argv, loops, modes, torch", [
    (["--loops", "hybrid,eager"], ["hybrid", "eager"], ["single", "launch"], ["eager"]),
    (["--loops", "eager", "hybrid"], ["eager", "hybrid"], ["single", "launch"], ["eager"]),
    (["--eager"], ["eager"], ["single", "launch"], ["eager"]),
    (["--modes", "single"], ["hybrid", "eager"], ["single"], ["eager"]),
    (["--modes", "launch,single,launch"], ["hybrid", "eager"], ["launch", "single"], ["eager"]),
    (["--torch", "eager,compile"], ["hybrid", "eager"], ["single", "launch"], ["eager", "compile"]),
    (["--no-torch"], ["hybrid", "eager"], ["single", "launch"], []),
])
def test_lists_take_commas_or_spaces(bs, argv, loops, modes, torch):
    a = bs.parse_args(argv)
    assert (a.loops, a.modes, a.torch) == (loops, modes, torch)


@pytest.mark.parametrize("argv", [["--loops", "graph"], ["--modes", "single,mpi"], ["--torch", "jit"],
                                  ["--gpus", "0"], ["--steps", "0"]])
def test_bad_values_are_refused(bs, argv, capsys):
    with pytest.raises(SystemExit):
        bs.parse_args(argv)
    assert "error" in capsys.readouterr().err


# ---- command lines -----------------------------------------------------------------------------------------------------

def _args(bs, *argv):
    a = bs.parse_args(["--gpus", "4", *argv])
    a.batch = 256  # main() fills it from the model's spec
    return a


@pytest.mark.parametrize("hybrid", [True, False])
def test_launch_command_starts_this_script_as_a_worker_of_the_same_run(bs, hybrid):
    a = _args(bs, "--warmup", "7", "--steps", "9", "--seed", "3")
    cmd = bs.launch_command(4, a, hybrid, "/tmp/r.json", 29600)
    assert cmd[:8] == [sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "4", "--master-port", "29600",
                       str(SCRIPTS / "bench_scaling.py")]
    w = bs.parse_args(cmd[8:])  # what the worker parses
    assert w.worker and w.result == "/tmp/r.json" and w.eager == (not hybrid)
    assert (w.model, w.batch, w.warmup, w.steps, w.seed) == ("resnet18", 256, 7, 9, 3)


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_torch_command_is_torchrun_over_bench_ddp_torch_with_the_same_settings(bs, mode):
    a = _args(bs, "--model", "alexnet", "--warmup", "7", "--steps", "9")
    a.batch = 128
    cmd = bs.torch_command(2, a, mode, "/tmp/t.json")
    assert cmd[:7] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       str(SCRIPTS / "bench_ddp_torch.py")]
    import bench_ddp_torch  # needs no torch until its main() runs
    t = bench_ddp_torch.parse_args(cmd[7:])
    assert (t.model, t.batch, t.warmup, t.steps, t.seed, t.json) == ("alexnet", 128, 7, 9, 0, "/tmp/t.json")
    assert t.tf32 and t.compile == (mode == "compile") and not t.no_ddp  # TF32 as dnnbind; DDP on 1 GPU too
    assert (bench_ddp_torch.LR, bench_ddp_torch.MOMENTUM, bench_ddp_torch.POOL) == (bs.LR, bs.MOMENTUM, bs.POOL)


def test_children_keep_nvlink_multicast_off_and_find_the_checkout(bs):
    env = bs.child_env({"PATH": "/bin", "PYTHONPATH": "/elsewhere"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert bs.child_env({"NCCL_NVLS_ENABLE": "0"})["NCCL_NVLS_ENABLE"] == "0"


def test_plan_runs_each_loops_reference_then_its_modes_then_torch(bs):
    assert bs.plan(_args(bs), True) == [
        ("hybrid-single", 1), ("hybrid-single", 4), ("hybrid-launch", 4),
        ("eager-single", 1), ("eager-single", 4), ("eager-launch", 4),
        ("torch-eager", 1), ("torch-eager", 4)]
    assert bs.plan(_args(bs, "--loops", "hybrid", "--modes", "launch"), False) == [
        ("hybrid-single", 1), ("hybrid-launch", 4)]
    one = bs.parse_args(["--gpus", "1", "--loops", "hybrid"])  # the 1-GPU run is the reference: not run twice
    assert bs.plan(one, True) == [("hybrid-single", 1), ("hybrid-launch", 1), ("torch-eager", 1)]


# ---- the table -----------------------------------------------------------------------------------------------------

def _run(ms, batch, gpus):
    return {"status": "ok", "gpus": gpus, "ms_per_step": ms, "images_per_s": batch * gpus / ms * 1e3}


FAKE = {  # near FACTS.md's 4-H100 numbers: DDP 12.40 ms on 1 GPU, 12.54 on 4; dnnbind hybridized ~9.7 ms
    "hybrid-single@1": _run(9.50, 256, 1), "hybrid-single@4": _run(9.70, 256, 4),
    "hybrid-launch@4": _run(9.60, 256, 4),
    "eager-single@1": _run(12.0, 256, 1), "eager-single@4": _run(30.0, 256, 4),
    "eager-launch@4": {"status": "failed", "reason": "exit 1", "command": ["x"]},
    "torch-eager@1": _run(12.40, 256, 1), "torch-eager@4": _run(12.54, 256, 4),
}


def test_rows_hold_the_scaling_and_the_ratios_to_ddp(bs):
    rows = {r["row"]: r for r in bs.table_rows(FAKE, _args(bs))}
    assert list(rows) == ["hybrid-single", "hybrid-launch", "eager-single", "eager-launch", "torch-eager"]
    ddp = rows["torch-eager"]
    assert ddp["reference"] and ddp["scaling"] == pytest.approx(4 * 12.40 / 12.54)
    h = rows["hybrid-launch"]
    assert h["images_per_s_1"] == FAKE["hybrid-single@1"]["images_per_s"]  # the launch row's reference: 1 GPU
    assert h["scaling"] == pytest.approx(4 * 9.50 / 9.60) and h["efficiency"] == pytest.approx(9.50 / 9.60)
    assert h["vs_ddp_n"] == pytest.approx(12.54 / 9.60) and h["vs_ddp_1"] == pytest.approx(12.40 / 9.50)
    assert h["misses"] == []  # 3.96x >= DDP's 3.96x, >= 3.9x, 1.31x >= 1.25x
    s = rows["hybrid-single"]  # 3.92x: under DDP's 3.96x, over 3.9x; 1.29x DDP's images/s
    assert s["misses"] == ["scaling < DDP's 3.96x"]
    e = rows["eager-single"]
    assert e["misses"] == ["scaling < DDP's 3.96x", "scaling < 3.90x", "< 1.25x DDP's images/s"]
    assert rows["eager-launch"]["status"] == "failed" and rows["eager-launch"]["reason"] == "exit 1"


def test_table_prints_one_line_per_mode(bs):
    args = _args(bs)
    text = bs.format_table(bs.table_rows(FAKE, args), 4, "title")
    lines = text.splitlines()
    assert lines[0] == "title" and "img/s 4 GPUs" in lines[1] and "vs DDP 4" in lines[1]
    by_mode = {line[:34].strip(): line for line in lines[2:7]}
    hl = by_mode["dnnbind hybridized, launched"].split()
    assert hl[3:] == ["26,947", "106,667", "9.50", "9.60", "3.96x", "99%", "1.31x", "1.31x", "met"]
    assert by_mode["dnnbind eager, launched"].split()[3:] == ["failed:", "exit", "1"]
    assert by_mode["PyTorch DDP, eager"].split()[3:] == ["20,645", "81,659", "12.40", "12.54", "3.96x", "99%",
                                                        "1.00x", "1.00x", "(the", "reference)"]
    assert "scaling < DDP's 3.96x" in by_mode["dnnbind hybridized, one process"]
    assert lines[-1].startswith("targets (dnnbind rows): scaling >= DDP's in this run and >= 3.90x")


def test_rows_without_torch_have_no_ratios(bs):
    args = _args(bs, "--no-torch")
    rows = bs.table_rows({k: v for k, v in FAKE.items() if not k.startswith("torch")}, args)
    assert [r["row"] for r in rows] == ["hybrid-single", "hybrid-launch", "eager-single", "eager-launch"]
    h = rows[1]
    assert h["vs_ddp_n"] is None and h["misses"] == []  # only the 3.9x aim is checked
    assert " - " in bs.format_table(rows, 4, "t").splitlines()[3]


def test_skipped_torch_rows_say_why(bs):
    runs = {**FAKE, "torch-eager@1": {"status": "skipped", "reason": "torch is not importable: no module"},
            "torch-eager@4": {"status": "skipped", "reason": "torch is not importable: no module"}}
    rows = bs.table_rows(runs, _args(bs))
    assert rows[-1]["status"] == "skipped" and rows[0]["vs_ddp_n"] is None
    assert "PyTorch DDP, eager" in bs.format_table(rows, 4, "t") and "skipped: torch is not importable" in \
        bs.format_table(rows, 4, "t")


# ---- torch missing, --dry-run, the driver with fake runs ---------------------------------------------------------------

def test_torch_available_without_torch(bs, monkeypatch):
    monkeypatch.setattr(bs.importlib.util, "find_spec", lambda name: None)
    version, why = bs.torch_available()
    assert version is None and "no module named 'torch'" in why


_NO_TORCH = "import sys; sys.modules['torch'] = None  # import torch fails, find_spec finds nothing\n"
_DRIVER = """
import sys
sys.path.insert(0, 'scripts')
import bench_scaling as bs
{patch}
bs.main(sys.argv[1:])
"""


def test_dry_run_without_torch_prints_the_skip_line_and_only_dnnbinds_commands():
    out = _python(_NO_TORCH + _DRIVER.format(patch=""), "--gpus", "2", "--dry-run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "PyTorch is not importable here" in out.stdout and "would be skipped" in out.stdout
    assert "torch.distributed.run" not in out.stdout
    assert out.stdout.count("-m dnnbind.launch --nproc-per-node 2") == 2  # hybrid and eager, launched
    assert "--master-port 29511" in out.stdout and "--master-port 29512" in out.stdout
    assert "NCCL_NVLS_ENABLE=0" in out.stdout


def test_dry_run_with_torch_prints_torchrun_on_1_and_n_gpus():
    patch = "bs.torch_available = lambda: ('2.11.0', '')"
    out = _python(_DRIVER.format(patch=patch), "--gpus", "4", "--dry-run", "--loops", "hybrid")
    assert out.returncode == 0, out.stderr[-3000:]
    for n in (1, 4):
        assert f"-m torch.distributed.run --standalone --nproc-per-node {n} {SCRIPTS / 'bench_ddp_torch.py'}" \
               f" --model resnet18 --batch 256 --warmup 30 --steps 50 --seed 0 --tf32 --json" in out.stdout
    assert "in this process on gpu(0..3)" in out.stdout and "not importable" not in out.stdout


_FAKE_RUNS = """
import json
bs.mx.num_gpus = lambda: 4
import bench
bench.environment = lambda torch: {{"gpu": {{"count": 4, "devices": [{{"name": "FAKE H100"}}] * 4}},
                                    "date": "2026-11-27", "torch": None}}
calls = []
def single(d2l, spec, n, args, hybrid):
    calls.append(("single", n, hybrid))
    ms = 9.5 if hybrid else 12.0
    return {{"status": "ok", "gpus": n, "ms_per_step": ms, "images_per_s": args.batch * n / ms * 1e3}}
def run(cmd, result, timeout):
    calls.append((cmd[2], cmd[cmd.index("--nproc-per-node") + 1], timeout))
    n, ms = int(cmd[cmd.index("--nproc-per-node") + 1]), 12.4 if "torch.distributed.run" in cmd else 9.6
    return {{"status": "ok", "gpus": n, "ms_per_step": ms, "images_per_s": 256 * n / ms * 1e3}}
bs.single_process, bs.run_command = single, run
{torch}
import atexit
atexit.register(lambda: print("CALLS", json.dumps(calls)))
"""


@pytest.mark.parametrize("with_torch", [True, False])
def test_driver_runs_the_plan_and_writes_one_table_and_the_json(tmp_path, with_torch):
    torch = "bs.torch_available = lambda: ('2.11.0', '')" if with_torch else ""
    code = (("" if with_torch else _NO_TORCH) + _DRIVER.format(patch=_FAKE_RUNS.format(torch=torch)))
    path = tmp_path / "scaling.json"
    out = _python(code, "--gpus", "4", "--json", str(path), "--run-timeout", "77")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    calls = json.loads(out.stdout.split("CALLS ", 1)[1])
    expected = [["single", 1, True], ["single", 4, True], ["dnnbind.launch", "4", 77.0],
                ["single", 1, False], ["single", 4, False], ["dnnbind.launch", "4", 77.0]]
    if with_torch:
        expected += [["torch.distributed.run", "1", 77.0], ["torch.distributed.run", "4", 77.0]]
    assert calls == expected
    result = json.loads(path.read_text())
    assert result["gpus"] == 4 and result["batch_per_gpu"] == 256 and result["date"] == "2026-11-27"
    assert result["loops"] == ["hybrid", "eager"] and result["warmup_steps"] == 30 and result["timed_steps"] == 50
    assert result["torch"] == ("2.11.0" if with_torch else None)
    table = {r["row"]: r for r in result["table"]}
    assert table["hybrid-launch"]["scaling"] == pytest.approx(4 * 9.5 / 9.6)
    if with_torch:
        assert table["hybrid-launch"]["vs_ddp_n"] == pytest.approx(12.4 / 9.6)
        assert "PyTorch DDP, eager" in out.stdout and "not importable" not in out.stdout
    else:
        assert table["torch-eager"]["status"] == "skipped"
        assert "PyTorch is not importable here" in out.stdout and "skipping its DDP rows" in out.stdout
    assert "FAKE H100" in out.stdout and f"wrote {path}" in out.stdout


def test_run_command_reads_rank_0s_result_or_says_why_not(bs, tmp_path):
    result = str(tmp_path / "r.json")
    write = f"import json; json.dump({{'images_per_s': 5.0, 'ms_per_step': 2.0}}, open({result!r}, 'w'))"
    assert bs.run_command([sys.executable, "-c", write], result, 60) == {
        "status": "ok", "images_per_s": 5.0, "ms_per_step": 2.0}
    r = bs.run_command([sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path / "none.json"), 60)
    assert r["status"] == "failed" and r["reason"] == "exit 3"
    r = bs.run_command([sys.executable, "-c", "raise SystemExit(3)"], result, 60)  # a failure after the result
    assert r == {"status": "ok", "images_per_s": 5.0, "ms_per_step": 2.0, "exit_code": 3}
    r = bs.run_command([sys.executable, "-c", "pass"], str(tmp_path / "none.json"), 60)
    assert r["status"] == "failed" and r["reason"].startswith("no result (FileNotFoundError")
    r = bs.run_command([sys.executable, "-c", "import time; time.sleep(60)"], result, 1)  # stopped by SIGTERM
    assert r["status"] == "failed" and r["reason"] == "stopped after 1 s (--run-timeout)"
