"""Data-parallel scaling of d2l-zh v1.0.0's ResNet-18 (or AlexNet) training from 1 to N GPUs: images/s and the
scaling, both ways dnnbind trains on several GPUs, hybridized and eager, and PyTorch DDP on the same model and batch
in the same invocation, as the reference. Prints one table and writes JSON.

    python scripts/bench.py --model resnet18 --gpus 4          # all of it: both loops, both modes, torch DDP
    python scripts/bench_scaling.py --model resnet18 --gpus 2 --loops hybrid --modes single --no-torch
    python scripts/bench_scaling.py --model resnet18 --gpus 4 --dry-run   # print what would run, run nothing
    python scripts/bench_scaling.py --model resnet18 --gpus 1  # the code paths on one GPU (no all-reduce)

dnnbind, per loop (``--loops``: ``hybrid``, the network hybridized; ``eager``, the plain loop) and mode (``--modes``):
- ``single``: one process, MXNet's way (d2l's multiple-gpus-gluon): ``net.initialize(ctx=[gpu(0), ..])``, one batch
  of --batch per GPU, a forward/backward per device inside one ``autograd.record()``, ``trainer.step`` summing the
  gradients with one NCCL all-reduce per device over its flat gradient buffer.
- ``launch``: one process per GPU under ``python -m dnnbind.launch``; each rank trains on its own batch of --batch
  and its Trainer all-reduces across processes.
Each loop's 1-GPU reference is the single-process loop on gpu(0), in this process.

PyTorch (``--torch eager``, the default; ``compile`` adds torch.compile; ``--no-torch`` skips it): scripts/
bench_ddp_torch.py under ``python -m torch.distributed.run --standalone``, DistributedDataParallel over NCCL, on 1
GPU (DDP with a world of one: the same code path, so the scaling compares like with like) and on N GPUs. Same model
(d2l_compare.py's torch.nn build), input, batch per GPU, NCHW, TF32, SGD lr 0.05 momentum 0.9, cudnn.benchmark.
When torch is not importable its rows are skipped with a line saying so.

Every run: --warmup steps (30: algorithm search, recording, cudnn.benchmark), then --steps timed steps (50) between
two synchronizes; ms/step is rank 0's (or the one process's) wall time per timed step, images/s = batch x GPUs /
that. Batches are fixed random pools resident on each device, as in bench_models.py. Subprocess runs are stopped
after --run-timeout seconds; a failed run is a row saying why, the others still run.

Layer: script; imports dnnbind, scripts/d2l_compare.py (the models) and bench.py (versions); torch only in the
children (bench_ddp_torch.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:0] = [_ROOT, _HERE]

import dnnbind as mx  # noqa: E402
from dnnbind import autograd, distributed, gluon  # noqa: E402

MODELS = {"resnet18": "resnet", "alexnet": "alexnet"}
POOL, LR, MOMENTUM = 4, 0.05, 0.9  # bench_ddp_torch.py imports these: one place for both frameworks
WARMUP, STEPS = 30, 50             # per run; sized so `--gpus 4` with everything on fits ~5 minutes on H100s
LOOPS = {"hybrid": "hybridized", "eager": "eager"}
MODES = {"single": "one process", "launch": "launched"}
TORCH_MODES = {"eager": "PyTorch DDP, eager", "compile": "PyTorch DDP, torch.compile"}
AIM_PER_GPU = 0.975  # the scaling aimed at: 1.95x on 2 GPUs, 3.9x on 4
VS_DDP = 1.25        # dnnbind's images/s aimed at, as a multiple of DDP's
RUN_TIMEOUT = 300    # seconds a launched or torchrun run may take
DDP_SCRIPT = os.path.join(_HERE, "bench_ddp_torch.py")


def label(row: str) -> str:
    """'hybrid-single' -> 'dnnbind hybridized, one process'; 'torch-eager' -> 'PyTorch DDP, eager'."""
    first, second = row.split("-", 1)
    return TORCH_MODES[second] if first == "torch" else f"dnnbind {LOOPS[first]}, {MODES[second]}"


# ---- dnnbind's runs --------------------------------------------------------------------------------------------------

def _net(d2l, spec, ctx, args, hybrid: bool):
    d2l.mx.random.seed(args.seed)
    net = spec.build_mx()
    net.initialize(d2l.INIT(), ctx=ctx)
    for c in ctx if isinstance(ctx, list) else [ctx]:
        net(mx.zeros((2, 1, spec.size, spec.size), device=c))  # finishes deferred init on every device
    if hybrid:
        net.hybridize()
    return net


def _pool(spec, batch, device, seed):
    rng = np.random.default_rng(seed)
    xs = [mx.array(rng.random((batch, 1, spec.size, spec.size), dtype=np.float32), device=device)
          for _ in range(POOL)]
    ys = [mx.array(rng.integers(0, 10, batch).astype(np.int32), device=device) for _ in range(POOL)]
    return xs, ys


def _time(step, devices, warmup, steps) -> float:
    """Seconds per step: warm-up steps, then ``steps`` steps between two synchronizes of every device."""
    for i in range(warmup):
        step(i)
    for d in devices:
        mx.current_stream(d).synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    for d in devices:
        mx.current_stream(d).synchronize()
    return (time.perf_counter() - t0) / steps


def single_process(d2l, spec, n: int, args, hybrid: bool) -> dict:
    """One process, n GPUs (MXNet's multi-device Gluon): images/s."""
    devices = [mx.gpu(i) for i in range(n)]
    net = _net(d2l, spec, devices if n > 1 else devices[0], args, hybrid)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    pools = [_pool(spec, args.batch, d, args.seed + i) for i, d in enumerate(devices)]

    def step(i):
        with autograd.record():
            losses = [loss_fn(net(xs[i % POOL]), ys[i % POOL]) for xs, ys in pools]
        autograd.backward(losses)
        trainer.step(args.batch * n)
    seconds = _time(step, devices, args.warmup, args.steps)
    return {"status": "ok", "gpus": n, "ms_per_step": seconds * 1e3, "images_per_s": args.batch * n / seconds}


def launched_worker(d2l, spec, args) -> None:
    """One rank of ``python -m dnnbind.launch``: its own batch on gpu(LOCAL_RANK); rank 0 writes the result."""
    distributed.init(timeout=args.timeout)
    world, device = distributed.world_size(), mx.gpu(distributed.local_rank())
    net = _net(d2l, spec, device, args, hybrid=not args.eager)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xs, ys = _pool(spec, args.batch, device, args.seed + distributed.rank())

    def step(i):
        with autograd.record():
            loss = loss_fn(net(xs[i % POOL]), ys[i % POOL])
        loss.backward()
        trainer.step(args.batch * world)  # MXNet's dist kvstore: the sum over ranks, divided by the global batch
    seconds = _time(step, [device], args.warmup, args.steps)
    distributed.barrier(distributed.rank(), world, *distributed.master(), args.timeout,
                        distributed.secret_from_env())
    if distributed.rank() == 0:
        with open(args.result, "w") as f:
            json.dump({"status": "ok", "gpus": world, "ms_per_step": seconds * 1e3,
                       "images_per_s": args.batch * world / seconds}, f)


# ---- the command lines of the runs in subprocesses -------------------------------------------------------------------

def launch_command(n: int, args, hybrid: bool, result: str, port: int) -> list[str]:
    """This script under ``python -m dnnbind.launch``, as a --worker writing rank 0's result to ``result``."""
    return [sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", str(n), "--master-port", str(port),
            os.path.abspath(__file__), "--worker", "--result", result, "--model", args.model, "--batch",
            str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps), "--seed", str(args.seed),
            "--timeout", str(args.timeout)] + ([] if hybrid else ["--eager"])


def torch_command(n: int, args, mode: str, result: str) -> list[str]:
    """scripts/bench_ddp_torch.py under torchrun (``python -m torch.distributed.run``, this interpreter), n ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), DDP_SCRIPT,
            "--model", args.model, "--batch", str(args.batch), "--warmup", str(args.warmup), "--steps",
            str(args.steps), "--seed", str(args.seed), "--tf32", "--json", result] + (
        ["--compile"] if mode == "compile" else [])


def child_env(base: dict | None = None) -> dict:
    """The children's environment: the checkout on PYTHONPATH; NVLink multicast kept off (FACTS.md: NCCL_NVLS_ENABLE=0
    is set on the multi-GPU machines; never unset it, also in launched children)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the child's process group (dnnbind.launch and torchrun then stop their ranks), SIGKILL after grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def run_command(cmd: list[str], result: str, timeout: float) -> dict:
    """Run cmd in its own process group, at most ``timeout`` seconds; rank 0's JSON, or why there is none."""
    proc = subprocess.Popen(cmd, env=child_env(), start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return {"status": "failed", "reason": f"stopped after {timeout:.0f} s (--run-timeout)", "command": cmd}
    except BaseException:  # Ctrl-C: stop the ranks too
        _stop(proc)
        raise
    try:
        with open(result) as f:
            r = {"status": "ok", **json.load(f)}
    except (OSError, ValueError) as exc:
        why = f"exit {code}" if code != 0 else f"no result ({type(exc).__name__}: {exc})"
        return {"status": "failed", "reason": why, "command": cmd}
    if code != 0:  # rank 0 wrote its timings after the timed steps; something failed later (at exit): keep both
        r["exit_code"] = code
        print(f"  note: exit {code} after rank 0 wrote its result: {shlex.join(cmd)}", flush=True)
    return r


def torch_available() -> tuple[str | None, str]:
    """(torch's version, "") when this interpreter can import torch, else (None, why). Looks, without importing it:
    torch runs only in the torchrun children."""
    try:
        found = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if found is None:
        return None, f"no module named 'torch' for {sys.executable}"
    try:
        return importlib.metadata.version("torch"), ""
    except importlib.metadata.PackageNotFoundError:
        return "unknown", ""


# ---- the plan, the table ---------------------------------------------------------------------------------------------

def plan(args, with_torch: bool) -> list[tuple[str, int]]:
    """(row, GPUs) in the order they run: per loop its 1-GPU reference (``<loop>-single`` on 1) and each mode on
    --gpus; then each torch mode on 1 GPU and on --gpus."""
    runs = []
    for loop in args.loops:
        runs.append((f"{loop}-single", 1))
        runs += [(f"{loop}-{mode}", args.gpus) for mode in args.modes if (mode, args.gpus) != ("single", 1)]
    for mode in args.torch if with_torch else []:
        runs += [(f"torch-{mode}", n) for n in sorted({1, args.gpus})]
    return runs


def table_rows(runs: dict, args) -> list[dict]:
    """One row per loop and mode, then per torch mode: images/s on 1 and N GPUs, the scaling, dnnbind against DDP
    (eager, else the first torch mode run), and the targets a dnnbind row misses. ``runs`` maps 'row@GPUs' to a
    run's result ({"status": "ok", "ms_per_step", "images_per_s"} or {"status", "reason"})."""
    n = args.gpus
    ok = lambda r: r if r and r.get("status") == "ok" else None  # noqa: E731
    ref = "torch-eager" if "eager" in args.torch else (f"torch-{args.torch[0]}" if args.torch else None)
    ddp1, ddpn = (ok(runs.get(f"{ref}@1")), ok(runs.get(f"{ref}@{n}"))) if ref else (None, None)
    ddp_scaling = ddpn["images_per_s"] / ddp1["images_per_s"] if ddp1 and ddpn else None
    keys = [f"{loop}-{mode}" for loop in args.loops for mode in args.modes] + [f"torch-{m}" for m in args.torch]
    rows = []
    for key in keys:
        first = key.split("-", 1)[0]
        one = runs.get(f"{key}@1" if first == "torch" else f"{first}-single@1")
        many = runs.get(f"{key}@{n}")
        row = {"row": key, "mode": label(key), "gpus": n}
        if not (ok(one) and ok(many)):
            bad = next((r for r in (one, many) if r is not None and not ok(r)), None) or {"status": "not run"}
            row.update(status=bad["status"], reason=bad.get("reason", ""))
            rows.append(row)
            continue
        row.update(status="ok", images_per_s_1=one["images_per_s"], images_per_s_n=many["images_per_s"],
                   ms_per_step_1=one["ms_per_step"], ms_per_step_n=many["ms_per_step"])
        row["scaling"] = many["images_per_s"] / one["images_per_s"]
        row["efficiency"] = row["scaling"] / n
        row["vs_ddp_1"] = one["images_per_s"] / ddp1["images_per_s"] if ddp1 else None
        row["vs_ddp_n"] = many["images_per_s"] / ddpn["images_per_s"] if ddpn else None
        if key == ref:
            row["reference"] = True
        elif first != "torch" and n > 1:
            misses = []
            if ddp_scaling is not None and row["scaling"] < ddp_scaling:
                misses.append(f"scaling < DDP's {ddp_scaling:.2f}x")
            if row["scaling"] < AIM_PER_GPU * n:
                misses.append(f"scaling < {AIM_PER_GPU * n:.2f}x")
            if row["vs_ddp_n"] is not None and row["vs_ddp_n"] < VS_DDP:
                misses.append(f"< {VS_DDP:.2f}x DDP's images/s")
            row["misses"] = misses
        rows.append(row)
    return rows


def format_table(rows: list[dict], n: int, title: str) -> str:
    def num(v, spec, suffix=""):
        return "-" if v is None else f"{v:{spec}}{suffix}"
    head = (f"{'mode':<34}{'img/s 1 GPU':>13}{f'img/s {n} GPUs':>15}{'ms 1 GPU':>10}{f'ms {n} GPUs':>12}"
            f"{'scaling':>9}{'eff.':>6}{'vs DDP 1':>10}{f'vs DDP {n}':>10}  targets")
    lines = [title, head]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['mode']:<34}  {r['status']}: {r.get('reason', '')}"[:len(head) + 40])
            continue
        targets = ("met" if not r["misses"] else "; ".join(r["misses"])) if "misses" in r else (
            "(the reference)" if r.get("reference") else "")
        lines.append(f"{r['mode']:<34}{r['images_per_s_1']:>13,.0f}{r['images_per_s_n']:>15,.0f}"
                     f"{r['ms_per_step_1']:>10.2f}{r['ms_per_step_n']:>12.2f}{num(r['scaling'], '.2f', 'x'):>9}"
                     f"{num(100 * r['efficiency'], '.0f', '%'):>6}{num(r['vs_ddp_1'], '.2f', 'x'):>10}"
                     f"{num(r['vs_ddp_n'], '.2f', 'x'):>10}  {targets}")
    if n > 1:
        lines.append(f"targets (dnnbind rows): scaling >= DDP's in this run and >= {AIM_PER_GPU * n:.2f}x; images/s on "
                     f"{n} GPUs >= {VS_DDP:.2f}x DDP's. vs DDP: images/s over the reference's on as many GPUs")
    return "\n".join(lines)


# ---- driver ------------------------------------------------------------------------------------------------------------

def _choices(values: list[str], choices, p, option: str) -> list[str]:
    """'a,b' or 'a b' -> ['a', 'b'], each one of choices, in the given order, each once."""
    out = []
    for v in (x.strip() for value in values for x in value.split(",")):
        if v and v not in choices:
            p.error(f"{option}: {v!r} is not one of {', '.join(choices)}")
        if v and v not in out:
            out.append(v)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--gpus", type=int, default=2, help="GPUs to scale to (the reference is 1)")
    p.add_argument("--loops", nargs="+", default=["hybrid,eager"], metavar="LOOP",
                   help="dnnbind's training loops, comma- or space-separated: hybrid (net.hybridize()), eager "
                        "(default: hybrid,eager)")
    p.add_argument("--modes", nargs="+", default=["single,launch"], metavar="MODE",
                   help="dnnbind's multi-GPU ways: single (one process, MXNet's multi-device Gluon), launch (one "
                        "process per GPU, python -m dnnbind.launch) (default: single,launch)")
    p.add_argument("--torch", nargs="+", default=["eager"], metavar="MODE",
                   help="PyTorch DDP runs (torchrun, scripts/bench_ddp_torch.py), each on 1 GPU (DDP with a world "
                        "of one) and on --gpus: eager, compile (torch.compile; adds minutes of compiling) "
                        "(default: eager)")
    p.add_argument("--no-torch", action="store_true", help="leave out PyTorch DDP")
    p.add_argument("--batch", type=int, default=None, help="per GPU (default: the book's, ResNet-18 256)")
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help=f"untimed steps per run (default {WARMUP}; with --steps {STEPS}, the whole --gpus 4 run with "
                        "both loops, both modes and torch's two DDP runs is meant to take ~5 minutes on H100s)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"timed steps per run (default {STEPS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eager", action="store_true", help="the same as --loops eager")
    p.add_argument("--timeout", type=float, default=120.0, help="rendezvous timeout of the launched ranks")
    p.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT,
                   help=f"seconds a launched or torchrun run may take before it is stopped (default {RUN_TIMEOUT})")
    p.add_argument("--master-port", type=int, default=29511, help="the first launched run's; each next one +1")
    p.add_argument("--json", default=None, help="default: runs/bench_scaling_<model>_<gpus>gpu.json")
    p.add_argument("--dry-run", action="store_true", help="print the runs and command lines, run nothing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.loops = ["eager"] if args.eager and not args.worker else _choices(args.loops, LOOPS, p, "--loops")
    args.modes = _choices(args.modes, MODES, p, "--modes")
    args.torch = [] if args.no_torch else _choices(args.torch, TORCH_MODES, p, "--torch")
    if not args.loops or not args.modes:
        p.error("--loops and --modes need at least one value each")
    if args.gpus < 1 or args.warmup < 1 or args.steps < 1:
        p.error("--gpus, --warmup and --steps must be >= 1")
    args.json = args.json or f"runs/bench_scaling_{args.model}_{args.gpus}gpu.json"
    return args


def dry_run(args, torch_version, why) -> dict:
    tmp = "$TMP"  # each result file lives in a temporary directory made at run time
    print(f"dry run: {args.model}, batch {args.batch} per GPU, TF32, 1 -> {args.gpus} GPUs; loops "
          f"{','.join(args.loops)}; modes {','.join(args.modes)}; torch {','.join(args.torch) or 'off'}; "
          f"{args.warmup} warm-up + {args.steps} timed steps per run; this machine has {mx.num_gpus()} GPU(s)")
    if args.torch and torch_version is None:
        print(f"PyTorch is not importable here ({why}): its DDP rows would be skipped")
    env = child_env()
    print(f"children's environment: PYTHONPATH={env['PYTHONPATH']} NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}")
    commands, port = [], args.master_port
    for row, n in plan(args, torch_version is not None):
        first, second = row.split("-", 1)
        result = f"{tmp}/{row}_{n}.json"
        if first == "torch":
            cmd = torch_command(n, args, second, result)
        elif second == "launch":
            cmd, port = launch_command(n, args, first == "hybrid", result, port), port + 1
        else:
            print(f"  [{label(row)}, {n} GPU(s)] in this process on gpu(0..{n - 1})")
            continue
        commands.append(cmd)
        print(f"  [{label(row)}, {n} GPU(s)]\n    {shlex.join(cmd)}")
    return {"dry_run": True, "plan": plan(args, torch_version is not None), "commands": commands}


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    import d2l_compare as d2l  # the models; it installs the mxnet alias at import
    spec = d2l.SPECS[MODELS[args.model]]
    args.batch = args.batch or spec.batch_size
    mx.set_math_mode("tf32")
    if args.worker:
        launched_worker(d2l, spec, args)
        return None
    torch_version, why = torch_available() if args.torch else (None, "")
    if args.dry_run:
        return dry_run(args, torch_version, why)
    have = mx.num_gpus()
    if have < args.gpus:
        raise SystemExit(f"bench_scaling.py --gpus {args.gpus}: this machine has {have} GPU(s)")
    import bench

    from dnnbind import config_report
    out = {"model": args.model, "batch_per_gpu": args.batch, "gpus": args.gpus, "math": "tf32", "layout": "NCHW",
           "loops": args.loops, "modes": args.modes, "torch_modes": args.torch, "warmup_steps": args.warmup,
           "timed_steps": args.steps, "pool_batches": POOL, "lr": LR, "momentum": MOMENTUM,
           **bench.environment(None), "torch": torch_version, "nccl": config_report.config().get("nccl"),
           "runs": {}}
    if args.torch and torch_version is None:
        print(f"PyTorch is not importable here ({why}): skipping its DDP rows", flush=True)
        for mode in args.torch:
            for n in sorted({1, args.gpus}):
                out["runs"][f"torch-{mode}@{n}"] = {"status": "skipped", "reason": f"torch is not importable: {why}"}
    path = args.json
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    port, start = args.master_port, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for row, n in plan(args, torch_version is not None):
            first, second = row.split("-", 1)
            result = os.path.join(tmp, f"{row}_{n}.json")
            print(f"{label(row)}, {n} GPU(s) ...", flush=True)
            t0 = time.perf_counter()
            if first == "torch":
                r = run_command(torch_command(n, args, second, result), result, args.run_timeout)
            elif second == "launch":
                r = run_command(launch_command(n, args, first == "hybrid", result, port), result, args.run_timeout)
                port += 1  # a fresh rendezvous port per launched run
            else:
                try:
                    r = single_process(d2l, spec, n, args, hybrid=first == "hybrid")
                except Exception as exc:  # noqa: BLE001  (a run's failure is a result; the others still run)
                    r = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc(limit=-6)}
                    print(r["traceback"], flush=True)
                gc.collect()  # this run's model, trainer and pools go before the next run
            r["wall_s"] = time.perf_counter() - t0
            out["runs"][f"{row}@{n}"] = r
            print(f"  {r['ms_per_step']:.2f} ms/step, {r['images_per_s']:,.0f} images/s ({r['wall_s']:.0f} s)"
                  if r["status"] == "ok" else f"  {r['status']}: {r['reason']}", flush=True)
            with open(path, "w") as f:  # after every run: a run cut short still leaves the others' numbers
                json.dump(out, f, indent=1)
    out["wall_s"] = time.perf_counter() - start
    out["table"] = table_rows(out["runs"], args)
    gpus = out.get("gpu")  # show_config's {"count", "devices": [...]}, or why not, as a string
    gpu = ((gpus.get("devices") if isinstance(gpus, dict) else None) or [{}])[0].get("name", "?")
    print("\n" + format_table(out["table"], args.gpus,
                              f"{args.model}, batch {args.batch} per GPU, TF32, NCHW, 1 -> {args.gpus} GPUs ({gpu}); "
                              f"{args.warmup} warm-up + {args.steps} timed steps per run; torch {torch_version}"))
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nall runs: {out['wall_s']:.0f} s; wrote {path}")
    return out


if __name__ == "__main__":
    main()
