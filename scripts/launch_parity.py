"""Does a launched data-parallel run learn like one GPU? Train the same model at the same global batch and learning
rate once on one GPU and once on N launched ranks (``python -m dnnbind.launch``), and compare the test accuracy.

    python scripts/launch_parity.py --gpus 2                  # SimpleCNN 1 epoch, ResNet-18 2 epochs at 96 x 96
    python scripts/launch_parity.py --gpus 2 --only simplecnn --json runs/parity.json

Each run is scripts/train.py with its own output folder; one GPU gets --batch-size B, each of the N ranks B / N
(train.py's trainer.step divides by the whole world's batch, so the update is the mean over the same B images).
The seeds, data order within each rank's share and initial weights are train.py's. Prints one row per model:
accuracy on 1 GPU, on N ranks, and the difference in percentage points. Exits 1 when a difference exceeds
--tolerance (0.5 points by default).

Layer: script; runs scripts/train.py in subprocesses (standard library only here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# model -> train.py arguments (the global batch is split over the ranks). SimpleCNN: train.py's defaults at batch 128;
# ResNet-18: d2l-zh's resnet.md setting (batch 256, lr 0.05, 96 x 96), with TF32 for speed.
CONFIGS = {
    "simplecnn": {"epochs": 1, "batch": 128, "args": ["--model", "simplecnn", "--lr", "0.01"]},
    "resnet18": {"epochs": 2, "batch": 256, "args": ["--model", "resnet18", "--lr", "0.05", "--resize", "96",
                                                      "--tf32"]},
}


def train_command(model: str, gpus: int, out_dir: str, port: int, extra: list[str]) -> list[str]:
    cfg = CONFIGS[model]
    per_rank = cfg["batch"] // gpus
    if per_rank * gpus != cfg["batch"]:
        raise SystemExit(f"{model}: global batch {cfg['batch']} does not divide over {gpus} GPUs")
    train = [os.path.join(HERE, "train.py"), *cfg["args"], "--epochs", str(cfg["epochs"]), "--batch-size",
             str(per_rank), "--device", "gpu", "--no-progress", "--out-dir", out_dir, *extra]
    if gpus == 1:
        return [sys.executable, *train]
    return [sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", str(gpus), "--master-port", str(port), *train]


def final_accuracy(out_dir: str) -> tuple[float, float]:
    with open(os.path.join(out_dir, "metrics.json")) as f:
        history = json.load(f)
    return float(history[-1]["test_acc"]), float(history[-1]["test_loss"])


def run(cmd: list[str], log: str, timeout: float) -> float:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on shared machines (keep it off in children)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=ROOT)
    if r.returncode:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{tail}")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--only", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS, reverse=True))
    p.add_argument("--tolerance", type=float, default=0.5, help="percentage points")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    p.add_argument("--log-dir", default=None, help="keep each run's output here")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--port", type=int, default=29611)
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = p.parse_args(argv)
    if args.gpus < 2:
        p.error("--gpus must be at least 2 (one GPU is the reference)")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="dnnbind-parity-")
    os.makedirs(log_dir, exist_ok=True)
    rows, failed = [], False
    for model in args.only:
        result = {"model": model, "global_batch": CONFIGS[model]["batch"], "epochs": CONFIGS[model]["epochs"]}
        for gpus in (1, args.gpus):
            out = os.path.join(log_dir, f"{model}-{gpus}gpu")
            cmd = train_command(model, gpus, out, args.port, ["--seed", str(args.seed)])
            if args.dry_run:
                print(" ".join(cmd))
                continue
            seconds = run(cmd, out + ".log", args.timeout)
            acc, loss = final_accuracy(out)
            result[f"{gpus}gpu"] = {"test_acc": acc, "test_loss": loss, "seconds": round(seconds, 1),
                                    "command": " ".join(cmd)}
        if args.dry_run:
            continue
        diff = 100 * (result[f"{args.gpus}gpu"]["test_acc"] - result["1gpu"]["test_acc"])
        result["diff_points"] = round(diff, 3)
        failed |= abs(diff) > args.tolerance
        rows.append(result)
        print(f"{model:10s} 1 GPU {100 * result['1gpu']['test_acc']:.2f}%  {args.gpus} ranks "
              f"{100 * result[f'{args.gpus}gpu']['test_acc']:.2f}%  difference {diff:+.2f} points "
              f"({'within' if abs(diff) <= args.tolerance else 'OUTSIDE'} {args.tolerance})", flush=True)
    if args.json and rows:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "gpus": args.gpus, "tolerance_points": args.tolerance,
                       "results": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
