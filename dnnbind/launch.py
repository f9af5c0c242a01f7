"""Start N worker processes with a torchrun-compatible environment and watch them.

    python -m dnnbind.launch --nproc-per-node 2 train.py --epochs 3
    python -m dnnbind.launch --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr 10.0.0.1 train.py

Layer: a program on top of everything; imports only the standard library (the workers import dnnbind).

Each worker runs `python script.py args...` with RANK = node_rank * nproc_per_node + local_rank,
WORLD_SIZE = nnodes * nproc_per_node, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and GROUP_RANK,
as torchrun sets it), and DNNBIND_RDZV_SECRET, the job's secret for the rendezvous (made here for one node;
taken from the environment, the same on every node, for several). The worker picks its GPU from LOCAL_RANK; CUDA_VISIBLE_DEVICES is left alone.
With more than one worker per node and no OMP_NUM_THREADS set, each worker gets OMP_NUM_THREADS=1, as torchrun does
(N workers each starting one OpenMP thread per core for numpy/OpenCV oversubscribe the host); the launcher says so.

When a worker exits non-zero or dies by a signal, the others get SIGTERM, then SIGKILL after --grace-period
seconds, and the launcher exits non-zero naming the failed rank. Ctrl-C (SIGINT) or SIGTERM to the launcher
stops every worker the same way. Each worker runs in its own session so the launcher alone decides when it
stops (and a signal reaches the worker's own children too).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

_POLL_S = 0.05  # how often the launcher looks at its workers
SECRET_ENV = "DNNBIND_RDZV_SECRET"  # dnnbind.distributed's rendezvous reads it (stdlib-only here: no import)


class _Stop(Exception):
    """The launcher itself got SIGINT or SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dnnbind.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="workers on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's index, 0..nnodes-1")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", help="address of the rank 0 node")
    p.add_argument("--master-port", "--master_port", type=int, default=29500, help="rendezvous port on it")
    p.add_argument("--tee", action="store_true", help="prefix every line of worker output with [rank k]")
    p.add_argument("--grace-period", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping workers")
    p.add_argument("script", help="the Python script each worker runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    args = p.parse_args(argv)
    if args.nproc_per_node < 1 or args.nnodes < 1:
        p.error("--nproc-per-node and --nnodes must be >= 1")
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
    # The rendezvous admits only ranks holding the job's secret. One node makes its own; several nodes must
    # share one, so it comes from the environment of every node's launcher.
    args.secret = os.environ.get(SECRET_ENV, "").strip()
    if not args.secret:
        if args.nnodes > 1:
            p.error(f"--nnodes > 1: every node's launcher needs the same secret in {SECRET_ENV}, e.g. "
                    f"export {SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))') on one node "
                    f"and the same value on the others")
        args.secret = secrets.token_hex(32)
    return args


def worker_env(args: argparse.Namespace, local_rank: int, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    n = args.nproc_per_node
    env.update(RANK=str(args.node_rank * n + local_rank), WORLD_SIZE=str(args.nnodes * n),
               LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(n), GROUP_RANK=str(args.node_rank),
               MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port), PYTHONUNBUFFERED="1")
    if n > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun; main() tells the user once
    secret = getattr(args, "secret", "")
    if secret:
        env[SECRET_ENV] = secret
    return env


def _pump(stream, out, prefix: bytes) -> None:
    """Copy a worker's pipe to our stdout/stderr line by line, each line prefixed."""
    with stream:
        for line in iter(stream.readline, b""):
            out.write(prefix + line)
            out.flush()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the worker is its session's leader: its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass


def stop_workers(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every live worker, wait up to `grace` seconds, SIGKILL what is left, reap all."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for p in procs:
        _signal_group(p, signal.SIGKILL)  # also when the worker is gone: its children may outlive it
        p.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n, first = args.nproc_per_node, args.node_rank * args.nproc_per_node

    # NOTE: the handler only notes the signal; the watch loop raises _Stop between its calls. Raising from the handler
    # itself could interrupt subprocess's poll() after it took its waitpid lock and before its try block released
    # it, and the stop's wait() then blocked on that lock forever (seen once under load in CI).
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    def check_stop() -> None:
        if received:
            raise _Stop(received[0])

    if n > 1 and "OMP_NUM_THREADS" not in os.environ:
        print(f"dnnbind.launch: setting OMP_NUM_THREADS=1 for each of the {n} workers of this node (as torchrun does) "
              "so they do not oversubscribe its cores; set it yourself to tune it", file=sys.stderr, flush=True)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    try:
        try:
            for lr in range(n):
                pipe = subprocess.PIPE if args.tee else None
                p = subprocess.Popen([sys.executable, args.script, *args.script_args], env=worker_env(args, lr),
                                     stdout=pipe, stderr=pipe, start_new_session=True)
                procs.append(p)
                check_stop()
                if args.tee:
                    prefix = f"[rank {first + lr}] ".encode()
                    for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                        t = threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True)
                        t.start()
                        pumps.append(t)
            # Watch: the first worker to fail stops the rest.
            while True:
                check_stop()
                failed = [(lr, p.returncode) for lr, p in enumerate(procs) if p.poll() not in (None, 0)]
                if failed:
                    lr, code = failed[0]
                    print(f"dnnbind.launch: rank {first + lr} (local_rank {lr}, pid {procs[lr].pid}) "
                          f"{_describe(code)}; stopping the other workers", file=sys.stderr, flush=True)
                    stop_workers(procs, args.grace_period)
                    return code if code > 0 else 128 - code
                if all(p.returncode == 0 for p in procs):
                    return 0
                time.sleep(_POLL_S)
        except _Stop as e:
            # Ignore further Ctrl-C while stopping: a second one would otherwise leave orphans behind.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print(f"dnnbind.launch: got {signal.Signals(e.signum).name}; stopping {len(procs)} worker(s)",
                  file=sys.stderr, flush=True)
            stop_workers(procs, args.grace_period)
            return 128 + e.signum
        finally:
            for p in procs:
                if p.poll() is None:  # an unexpected error in the launcher must not leave workers behind
                    stop_workers(procs, args.grace_period)
                    break
            for t in pumps:
                t.join(timeout=1.0)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
