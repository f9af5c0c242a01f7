"""python -m dnnbind.launch: torchrun's environment, output prefixes, and stopping everyone on failure/Ctrl-C.

Every subprocess runs under a timeout so a broken launcher fails the test instead of hanging it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRINT_ENV = """
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DNNBIND_RDZV_SECRET"]
line = json.dumps({k: os.environ[k] for k in keys} | {"argv": sys.argv[1:]}) + "\\n"
os.write(1, line.encode())  # one write per line: the workers share the launcher's stdout
"""

# Rank 1 fails with 3 after a moment; the others record their pid and would sleep forever.
FAIL_RANK1 = """
import os, sys, time
open(os.path.join(sys.argv[1], "pid" + os.environ["RANK"]), "w").write(str(os.getpid()))
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    sys.exit(3)
time.sleep(600)
"""

# Every worker records its pid and sleeps; SIGTERM is ignored by rank 0, so only SIGKILL stops it.
SLEEP = """
import os, signal, sys, time
if os.environ["RANK"] == "0" and len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "pid" + os.environ["RANK"]), "w").write(str(os.getpid()))
time.sleep(600)
"""


def _launch(*args, timeout=60, env_extra=None, **kw):
    env = {k: v for k, v in os.environ.items() if k != "DNNBIND_RDZV_SECRET"}  # one node makes its own
    env.update(PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "dnnbind.launch", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie whose parent has gone is reaped by init soon; read its state to be sure
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(tmp_path, n):
    return [int((tmp_path / f"pid{r}").read_text()) for r in range(n)]


def test_environment_is_torchrun_compatible(tmp_path):
    script = tmp_path / "env.py"
    script.write_text(PRINT_ENV)
    r = _launch("--nproc-per-node", 3, "--nnodes", 2, "--node-rank", 1, "--master-port", 1234, script,
                "--lr", "0.1", env_extra={"DNNBIND_RDZV_SECRET": "5e" * 32})  # several nodes share one secret
    assert r.returncode == 0, r.stderr
    envs = sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda e: int(e["RANK"]))
    assert [e["RANK"] for e in envs] == ["3", "4", "5"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    for e in envs:
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == \
            ("6", "3", "127.0.0.1", "1234")
        assert e["argv"] == ["--lr", "0.1"]
        assert e["DNNBIND_RDZV_SECRET"] == "5e" * 32


OMP = """
import os
os.write(1, (os.environ.get("OMP_NUM_THREADS", "unset") + "\\n").encode())
"""


def test_omp_threads_default_to_one_with_several_workers_as_torchrun(tmp_path):
    """N workers, no OMP_NUM_THREADS: each gets 1 and the launcher says so; one worker, or a value the user set:
    left alone."""
    script = tmp_path / "omp.py"
    script.write_text(OMP)
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "DNNBIND_RDZV_SECRET")}

    def run(*args, **extra):
        return subprocess.run([sys.executable, "-m", "dnnbind.launch", *map(str, args), str(script)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**base, "PYTHONPATH": str(ROOT), **extra})

    two = run("--nproc-per-node", 2)
    assert two.returncode == 0, two.stderr
    assert two.stdout.split() == ["1", "1"] and "OMP_NUM_THREADS=1" in two.stderr
    one = run()
    assert one.stdout.split() == ["unset"] and "OMP_NUM_THREADS" not in one.stderr
    mine = run("--nproc-per-node", 2, OMP_NUM_THREADS="4")
    assert mine.stdout.split() == ["4", "4"] and "OMP_NUM_THREADS" not in mine.stderr


def test_defaults_and_tee_prefix(tmp_path):
    script = tmp_path / "env.py"
    script.write_text(PRINT_ENV)
    r = _launch("--tee", script)
    assert r.returncode == 0, r.stderr
    prefix, payload = r.stdout.strip().split(" ", 2)[:2], r.stdout.strip().split(" ", 2)[2]
    assert prefix == ["[rank", "0]"]
    e = json.loads(payload)
    assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == ("0", "1", "127.0.0.1", "29500")


def test_failed_rank_stops_the_others(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAIL_RANK1)
    t0 = time.monotonic()
    r = _launch("--nproc-per-node", 3, script, tmp_path, timeout=30)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 3
    assert "rank 1" in r.stderr and "exited with code 3" in r.stderr
    assert not any(_alive(p) for p in _pids(tmp_path, 3))


def test_worker_killed_by_signal_is_named(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text("import os, signal, time\nif os.environ['RANK'] == '1':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(600)\n")
    r = _launch("--nproc-per-node", 2, script, timeout=30)
    assert r.returncode == 128 + signal.SIGKILL
    assert "rank 1" in r.stderr and "SIGKILL" in r.stderr


def test_sigterm_ignored_gets_sigkill_after_grace(tmp_path):
    # rank 0 ignores SIGTERM and sleeps forever; rank 1 fails: rank 0 must still be gone after the grace period.
    script = tmp_path / "stubborn.py"
    script.write_text(SLEEP.replace('time.sleep(600)', 'time.sleep(600 if os.environ["RANK"] == "0" else 0.5)\n'
                                    'sys.exit(0 if os.environ["RANK"] == "0" else 7)'))
    t0 = time.monotonic()
    r = _launch("--nproc-per-node", 2, "--grace-period", 1, script, tmp_path, "ignore-term", timeout=30)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 7 and "rank 1" in r.stderr
    assert not any(_alive(p) for p in _pids(tmp_path, 2))


def test_sigint_stops_every_worker(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text(SLEEP)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", str(script),
                          str(tmp_path)], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p.poll() is None, "workers did not start"
            time.sleep(0.05)
        time.sleep(0.1)
        pids = _pids(tmp_path, 2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGINT
    assert "SIGINT" in err
    assert not any(_alive(q) for q in pids)


def test_bad_arguments_are_refused(tmp_path):
    r = _launch("--nnodes", 2, "--node-rank", 2, tmp_path / "x.py")
    assert r.returncode == 2 and "--node-rank" in r.stderr
