"""dnnbind.distributed's watchdog: a rank that dies makes the others exit non-zero naming it, instead of hanging.

The ranks here are plain subprocesses with torchrun's variables, started WITHOUT dnnbind.launch (which would stop
the others itself): as under torchrun, mpirun, srun or by hand, the ranks must notice on their own. On the cpu
they wait on an Event that never fires, standing in for a collective whose peer died; on two GPUs (marker
``gpu``) rank 0 is really blocked in NCCL. Every subprocess runs under a timeout, so a hang fails the test.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from dnnbind import distributed
from dnnbind.distributed import RankFailedError, _watchdog
from dnnbind.distributed._rendezvous import pack_message, pack_text

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")

WORKER = textwrap.dedent('''
    import os, sys, threading, time
    from dnnbind import distributed
    mode, out = sys.argv[1], sys.argv[2]
    distributed.init(timeout=30)
    r, ws = distributed.rank(), distributed.world_size()
    if mode.startswith("finish"):  # the port serves another exchange while the watchdog's connections stay open
        distributed.barrier(r, ws, *distributed.master(), 30, distributed.secret_from_env())
    open(os.path.join(out, f"ready{r}"), "w").write(str(os.getpid()))
    if mode == "hang":
        threading.Event().wait()  # blocked forever, as in a collective whose peer died
    elif mode == "fork":  # a forked child (a DataLoader worker) outlives its rank: the rank's death is still seen
        if r == 1:
            child = os.fork()
            if child == 0:
                time.sleep(60)
                os._exit(0)
            open(os.path.join(out, "child1"), "w").write(str(child))
        threading.Event().wait()
    elif mode == "raise":
        if r == 1:
            time.sleep(0.5)
            raise ValueError("boom")
        threading.Event().wait()
    elif mode.startswith("finish"):
        time.sleep(0 if r == int(mode[-1]) else 3)  # one rank ends first; the others outlive a few heartbeats
    elif mode == "shutdown":
        if r == 1:
            distributed.shutdown()
            alive = [t.name for t in threading.enumerate() if t.name.startswith("dnnbind-watchdog")]
            open(os.path.join(out, "threads1"), "w").write(repr(alive))
            os.kill(os.getpid(), 9)  # after its goodbye, rank 1 vanishing is not a death
        time.sleep(3)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world_size: int, port: int, secret: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("OMPI_", "PMI_", "SLURM_", "DNNBIND_WATCHDOG"))}
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # the multi-GPU machines keep NVLink multicast off
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), DNNBIND_RDZV_SECRET=secret, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               **extra)
    return env


class Ranks:
    """world_size ranks of ``script`` started by hand, stderr of rank r in tmp/err{r}."""

    def __init__(self, tmp: Path, script: str, world_size: int, *args: str, **env_extra: str):
        (tmp / "worker.py").write_text(script)
        self.tmp, port, secret = tmp, _free_port(), secrets.token_hex(32)
        self.procs = []
        for r in range(world_size):
            with open(tmp / f"err{r}", "wb") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(tmp / "worker.py"), *args, str(tmp)], cwd=tmp, stdout=subprocess.DEVNULL,
                    stderr=err, env=_env(r, world_size, port, secret, **env_extra)))

    def wait_ready(self, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while not all((self.tmp / f"ready{r}").exists() for r in range(len(self.procs))):
            died = [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None]
            assert not died, f"rank(s) exited before they were ready: {died}: {self.stderr(died[0][0])}"
            assert time.monotonic() < deadline, "the ranks never got through init()"
            time.sleep(0.05)
        time.sleep(0.05)  # the ready file is written: let its content land
        return [int((self.tmp / f"ready{r}").read_text()) for r in range(len(self.procs))]

    def wait(self, ranks, timeout: float) -> dict:
        """{rank: (exit code, seconds it took)} for each of ``ranks``; kills them all if one is still running."""
        t0, out = time.monotonic(), {}
        try:
            for r in ranks:
                code = self.procs[r].wait(max(timeout - (time.monotonic() - t0), 0.01))
                out[r] = (code, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank(s) {[r for r in ranks if r not in out]} still running {timeout:g} s later (a hang); "
                        f"stderr: {[self.stderr(r) for r in ranks]}")
        return out

    def stderr(self, r: int) -> str:
        return (self.tmp / f"err{r}").read_text(errors="replace")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def ranks(tmp_path):
    made = []

    def start(*args, **kw):
        made.append(Ranks(tmp_path, *args, **kw))
        return made[-1]
    yield start
    for r in made:
        r.kill_all()


def test_a_killed_rank_makes_the_others_exit_naming_it(ranks):
    job = ranks(WORKER, 3, "hang", DNNBIND_WATCHDOG_GRACE="1")
    pids = job.wait_ready()
    os.kill(pids[1], signal.SIGKILL)
    for r, (code, took) in job.wait([0, 2], timeout=30).items():
        err = job.stderr(r)
        assert code != 0, (r, err)
        assert took < 15, (r, took)
        assert f"rank 1 (pid {pids[1]}, host {socket.gethostname()}) died" in err, err
        assert f"rank {r} aborts its NCCL communicators and exits" in err, err
        assert err.count("dnnbind.distributed:") == 1, err  # one line, not one per heartbeat


def test_a_rank_whose_forked_child_lives_on_is_still_seen_dying_at_once(ranks, tmp_path):
    job = ranks(WORKER, 2, "fork", DNNBIND_WATCHDOG_GRACE="1")
    pids = job.wait_ready()
    child = int((tmp_path / "child1").read_text())
    try:
        os.kill(pids[1], signal.SIGKILL)
        (code, took), = job.wait([0], timeout=30).values()
        assert code != 0 and took < 10, (code, took)  # the heartbeat timeout (30 s) did not have to catch it
        assert f"rank 1 (pid {pids[1]}" in job.stderr(0)
    finally:
        os.kill(child, signal.SIGKILL)


def test_rank0_dying_is_reported_by_the_others_naming_rank0(ranks):
    job = ranks(WORKER, 3, "hang")  # the default grace, 5 s: well within the 30 s the job may take
    pids = job.wait_ready()
    os.kill(pids[0], signal.SIGKILL)
    for r, (code, took) in job.wait([1, 2], timeout=30).items():
        err = job.stderr(r)
        assert code != 0 and took < 20, (r, code, took, err)
        assert f"rank 0 (pid {pids[0]}, host {socket.gethostname()}) died" in err, err


def test_a_rank_that_raises_is_named_with_its_error(ranks):
    job = ranks(WORKER, 3, "raise", DNNBIND_WATCHDOG_GRACE="1")
    job.wait_ready()
    done = job.wait([1, 0, 2], timeout=30)
    assert done[1][0] == 1 and "ValueError: boom" in job.stderr(1)
    for r in (0, 2):
        err = job.stderr(r)
        assert done[r][0] != 0, (r, err)
        assert "rank 1 (pid" in err and "exited on an uncaught ValueError: boom" in err, err


@pytest.mark.parametrize("first", [0, 1])
def test_ranks_that_finish_normally_exit_0_quietly(ranks, first):
    """One rank ends (and its process exits) while the others still run: it said goodbye, so it is no death."""
    job = ranks(WORKER, 3, f"finish{first}")
    job.wait_ready()
    for r, (code, _) in job.wait([0, 1, 2], timeout=30).items():
        assert code == 0 and "dnnbind.distributed" not in job.stderr(r), (r, code, job.stderr(r))


def test_shutdown_stops_the_thread_and_says_goodbye(ranks, tmp_path):
    job = ranks(WORKER, 2, "shutdown")
    job.wait_ready()
    done = job.wait([1, 0], timeout=30)
    assert done[1][0] == -signal.SIGKILL
    assert (tmp_path / "threads1").read_text() == "[]"
    assert done[0][0] == 0 and "dnnbind.distributed" not in job.stderr(0), job.stderr(0)


# -- in one process: init()'s switches, and the watchdog over socket pairs ---------------------------------------

@pytest.fixture
def world_of_two(monkeypatch):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    yield
    distributed.shutdown()


def test_init_starts_it_unless_asked_not_to_and_shutdown_stops_it(world_of_two, monkeypatch):
    distributed.init(barrier_on_init=False)  # no barrier, no connections: NCCL's errors alone are watched
    w = _watchdog.current()
    assert w is not None and w.is_alive()
    distributed.shutdown()
    assert _watchdog.current() is None and not w.is_alive()
    distributed.init(barrier_on_init=False, watchdog=False)
    assert _watchdog.current() is None
    monkeypatch.setenv("DNNBIND_WATCHDOG", "0")
    distributed.init(barrier_on_init=False)
    assert _watchdog.current() is None
    monkeypatch.setenv("DNNBIND_WATCHDOG", "1")
    monkeypatch.setenv("DNNBIND_WATCHDOG_GRACE", "soon")
    with pytest.raises(ValueError, match="DNNBIND_WATCHDOG_GRACE='soon' must be a number of seconds"):
        distributed.init(barrier_on_init=False)


def test_a_world_of_one_has_no_watchdog(monkeypatch):
    for k in LAUNCHER_VARS:
        monkeypatch.delenv(k, raising=False)
    distributed.init()
    try:
        assert _watchdog.current() is None
    finally:
        distributed.shutdown()


def test_connect_is_a_barrier_that_leaves_each_rank_connected_to_rank0():
    port, got = _free_port(), {}

    def rank(r):
        got[r] = distributed.connect(r, 3, "127.0.0.1", port, 10.0, b"k")
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    try:
        assert sorted(got[0]) == [1, 2] and list(got[1]) == [0] and list(got[2]) == [0], got
        for r in (1, 2):
            got[r][0].sendall(bytes([r]))
            got[0][r].settimeout(5)
            assert got[0][r].recv(1) == bytes([r])  # rank 0's socket for rank r is rank r's connection
        assert distributed.connect(0, 1) == {}
    finally:
        for links in got.values():
            for sock in links.values():
                sock.close()


class FakeComm:
    """Stands for a Communicator: check() raises what it is given, abort(reason) is recorded."""

    def __init__(self, error=None):
        self.handle, self.error, self.aborted = 1, error, []

    def check(self, wait=True):
        assert wait is False, "the watchdog must never wait on a communicator's lock"
        if self.error is not None:
            raise self.error

    def abort(self, reason=None):
        self.aborted.append(reason)
        self.handle = None

    def __repr__(self):
        return "FakeComm(rank 1 of 2)"


def _watch(rank, comms=(), timeout=0.0):
    """A Watchdog of `rank` linked to one peer through a socket pair; returns it, the peer's end, and the exit
    codes it asked for."""
    mine, peer = socket.socketpair()
    codes = []
    exited = threading.Event()
    w = _watchdog.Watchdog(rank, {1 - rank if rank < 2 else 0: mine}, timeout=timeout, grace=0.0,
                           communicators=lambda: [c for c in comms if c.handle],
                           exit_process=lambda code: (codes.append(code), exited.set()))
    w.exited = exited
    peer.settimeout(5)
    return w.start(), peer, codes


def _read_until(sock, kind):
    """The watchdog messages the peer end receives, up to the first of ``kind``: [(kind, number, text)]."""
    buf, got = bytearray(), []
    while not got or got[-1][0] != kind:
        m = _watchdog._take(buf)
        if m is not None:
            got.append(m)
            continue
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {got}"
        buf += chunk
    return got


def test_an_nccl_async_error_aborts_every_communicator_and_tells_rank0(capfd):
    from dnnbind._lib.errors import NcclError
    bad, good = FakeComm(NcclError(6, "ncclCommGetAsyncError", "ncclRemoteError - peer gone")), FakeComm()
    w, peer, codes = _watch(1, [bad, good])
    assert w.exited.wait(10) and codes == [1]
    got = _read_until(peer, b"D")
    assert got[0][:2] == (b"I", os.getpid()) and got[0][2] == socket.gethostname()  # INFO first
    died = got[-1]
    assert died[1] == 1 and "NCCL reported an asynchronous error on FakeComm(rank 1 of 2)" in died[2]
    assert "ncclRemoteError - peer gone" in died[2]
    for c in (bad, good):
        assert len(c.aborted) == 1 and isinstance(c.aborted[0], RankFailedError) and c.aborted[0].rank == 1
    line = capfd.readouterr().err
    assert line.count("dnnbind.distributed: rank 1 (pid") == 1 and "rank 1 aborts its NCCL" in line
    peer.close()


def test_a_death_reported_by_rank0_makes_later_collectives_raise(monkeypatch, capfd):
    """Rank 0 says rank 2 died: this rank aborts its real Communicator (NCCL faked), whose next all_reduce raises
    RankFailedError naming rank 2 before reaching NCCL."""
    from dnnbind import cpu, nd
    from dnnbind.distributed import comm as comm_mod
    calls = []
    fake_lib = types.SimpleNamespace(ncclCommAbort=lambda h: calls.append(("abort", h)),
                                     ncclCommGetAsyncError=lambda h, err: calls.append(("poll", h)))
    monkeypatch.setattr(comm_mod, "_nccl", lambda: types.SimpleNamespace(lib=fake_lib, ncclSuccess=0,
                                                                         ncclInProgress=7))
    c = comm_mod.Communicator(0xABC, 1, 3, cpu())
    try:
        assert c in comm_mod.live_communicators()
        mine, peer = socket.socketpair()
        codes = []
        w = _watchdog.Watchdog(1, {0: mine}, timeout=0.0, grace=0.0, communicators=lambda: [c],
                               exit_process=codes.append).start()
        why = "rank 2 (pid 7, host h) died (its connection to rank 0 closed)"
        peer.sendall(pack_message(b"D", (2).to_bytes(4, "big") + pack_text(why)))
        w._thread.join(10)
        assert codes == [1] and ("abort", 0xABC) in calls and c not in comm_mod.live_communicators()
        with pytest.raises(RankFailedError, match=r"rank 2 \(pid 7, host h\) died") as e:
            c.all_reduce(nd.zeros((2,), ctx=cpu()))
        assert e.value.rank == 2
        assert f"dnnbind.distributed: {why}; rank 1 aborts" in capfd.readouterr().err
        peer.close()
    finally:
        c.handle = None  # never leave a fake handle where a real watchdog would poll it


def test_a_silent_peer_counts_as_hung():
    w, peer, codes = _watch(0, timeout=0.5)
    assert w.exited.wait(10) and codes == [1]
    assert w.failure.rank == 1 and "sent nothing for 0.5 s" in w.failure.message
    peer.close()


def test_a_peer_speaking_another_protocol_is_a_failure():
    w, peer, codes = _watch(0)
    peer.sendall(b"GET / HTTP/1.0\r\n\r\n")
    assert w.exited.wait(10) and codes == [1]
    assert "not the dnnbind watchdog's protocol" in w.failure.message
    peer.close()


def test_a_goodbye_ends_watching_quietly(capfd):
    w, peer, codes = _watch(0, timeout=0.5)
    peer.sendall(pack_message(b"Q"))
    peer.close()
    time.sleep(1.5)  # past the silence timeout: a rank that said goodbye is not watched any more
    assert w.is_alive() and codes == [] and w.failure is None
    w.stop()
    assert not w.is_alive() and "dnnbind.distributed" not in capfd.readouterr().err


def test_rank_failed_error_pickles():
    import pickle
    e = pickle.loads(pickle.dumps(RankFailedError(3, "rank 3 died")))
    assert (type(e), e.rank, str(e)) == (RankFailedError, 3, "rank 3 died")
    from dnnbind._lib.errors import DnnbindError
    assert isinstance(e, DnnbindError) and isinstance(e, RuntimeError)


# -- two GPUs: rank 0 blocked in NCCL while rank 1 is killed -------------------------------------------------------

GPU_WORKER = textwrap.dedent('''
    import os, signal, sys
    import dnnbind as mx
    from dnnbind import distributed, nd
    from dnnbind.runtime.stream import synchronize
    out = sys.argv[1]
    distributed.init(timeout=120)
    r = distributed.rank()
    dev = mx.gpu(distributed.local_rank())
    comm = distributed.communicator(dev)
    x = nd.ones((1 << 20,), ctx=dev)
    y = nd.zeros((1 << 20,), ctx=dev)
    for step in range(10 ** 9):
        comm.all_reduce(x, out=y)
        synchronize(dev)
        if step == 0:
            assert float(y.asnumpy()[0]) == 2.0
            open(os.path.join(out, f"ready{r}"), "w").write(str(os.getpid()))
        if r == 1 and step == 50:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-job: rank 0 is in, or about to enter, an all-reduce
''')


@pytest.mark.gpu
def test_two_gpus_rank1_killed_mid_allreduce_rank0_exits_naming_it(tmp_path):
    import dnnbind as mx
    if mx.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {mx.num_gpus()}")
    job = Ranks(tmp_path, GPU_WORKER, 2)
    try:
        job.wait_ready(timeout=180)
        job.wait([1], timeout=60)  # it kills itself after 50 steps
        t_dead = time.monotonic()
        (code, _), = job.wait([0], timeout=30).values()
        took, err = time.monotonic() - t_dead, job.stderr(0)
        print(f"rank 0 exited with {code} {took:.1f} s after rank 1 died; its stderr:\n{err[-3000:]}")
        assert code != 0, err[-3000:]
        assert took < 30
        assert "rank 1 (pid" in err and "died" in err, err[-3000:]
    finally:
        job.kill_all()
