"""DataLoader worker processes: leaving a loop early never hangs, a dead worker is reported at once.

The stress test runs in a subprocess under faulthandler.dump_traceback_later, so a hang fails the test (with
every thread's stack) instead of hanging the run. multiprocessing.Pool-based loaders hung here: Pool.terminate()
killed a worker that held the result queue's lock, then blocked on that lock (about 1 run in 15 of d2l's
word2vec; within a few dozen of the passes below).
"""

import faulthandler
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dnnbind.gluon import data as gdata
from dnnbind.gluon.data import dataloader as dl

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="worker processes are forked (Linux)")


@pytest.fixture(autouse=True)
def hard_timeout():
    """A hang in one of these tests kills the run with a traceback after 150 s instead of blocking CI (the
    stress subprocess has its own, shorter limits, so it fails as a test first)."""
    faulthandler.dump_traceback_later(150, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


STRESS = textwrap.dedent("""
    import faulthandler, gc, multiprocessing, random, sys, time
    import numpy as np
    from dnnbind.gluon import data as gdata
    from dnnbind.gluon.data import dataloader as dl

    dl._to_nd = lambda b: b  # batches stay numpy: this tests the workers, not the runtime

    class Samples(gdata.Dataset):
        def __init__(self, n, width, sleep):
            self.n, self.width, self.sleep = n, width, sleep
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if self.sleep:
                time.sleep(self.sleep)
            return np.full((self.width,), i, np.float32), i

    def check(batch, indices):
        x, y = batch
        assert list(y) == list(indices) and (x[:, 0] == y).all(), (list(y), list(indices))

    trials, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    kept = []  # iterators left open until interpreter exit
    t0 = time.time()
    for trial in range(trials):
        faulthandler.dump_traceback_later(10, exit=True)  # per trial: a hang dumps every stack and exits 1
        nw = rng.choice([1, 2, 4])
        # small samples, or 20 KB ones so a batch overflows the pipe and workers block writing it
        width = rng.choice([8, 8, 5000])
        ds = Samples(rng.randint(10, 60), width, rng.choice([0, 0, 0, 0.001]))
        bs = rng.choice([1, 4, 16])
        threads = rng.random() < 0.15
        loader = gdata.DataLoader(ds, batch_size=bs, shuffle=rng.random() < 0.5, num_workers=nw,
                                  thread_pool=threads, prefetch=rng.choice([None, 1, 3, 8]), timeout=15)
        order = [list(b) for b in loader._batch_sampler]  # what a pass yields when shuffle is off
        mode = rng.choice(["break", "break", "break", "several", "del", "raise", "full", "keep"])
        stop = rng.randint(0, min(len(loader), rng.choice([3, 20])))
        if mode in ("break", "full"):
            for j, batch in enumerate(loader):
                if not loader._batch_sampler._sampler.__class__.__name__.startswith("Random"):
                    check(batch, order[j])
                if mode == "break" and j >= stop:
                    break
        elif mode == "several":  # interleaved iterators over one loader, dropped in random order
            its = [iter(loader) for _ in range(rng.randint(2, 3))]
            for _ in range(stop):
                for k in range(len(its)):
                    next(its[k], None)
            rng.shuffle(its)
            while its:
                its.pop()
        elif mode == "del":
            it = iter(loader)
            for _ in range(stop):
                next(it, None)
            if rng.random() < 0.5:
                del loader
            del it
        elif mode == "raise":
            try:
                for j, batch in enumerate(loader):
                    if j >= stop:
                        raise KeyError("left the loop")
            except KeyError:
                pass
        elif mode == "keep" and len(kept) < 3:
            it = iter(loader)
            next(it, None)
            kept.append(it)
        if trial % 50 == 49:
            gc.collect()  # nothing here should need it: dropped passes stop at once (checked at the end)
    faulthandler.dump_traceback_later(20, exit=True)
    left = [p for p in multiprocessing.active_children()]
    print(f"{trials} trials in {time.time() - t0:.1f} s; {len(kept)} iterators left to exit, "
          f"{len(left)} worker processes alive")
    # every pass that was dropped has stopped its workers; only the kept ones still run
    assert len(left) <= sum(len(it._workers.procs) for it in kept if isinstance(it, dl._WorkerIter)), left
""")


def _stress(trials: int, seed: int) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run([sys.executable, "-c", STRESS, str(trials), str(seed)], env=env, cwd=str(REPO),
                           capture_output=True, text=True, timeout=100)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the stress run hung (no exit in 100 s): {e.stdout}{e.stderr}")
    assert r.returncode == 0, f"exit {r.returncode} (a hang shows stacks and exit 1):\n{r.stdout}\n{r.stderr[-6000:]}"
    return r.stdout


def test_leaving_a_loop_early_never_hangs():
    """300 passes over loaders with 1, 2, 4 workers (and some with threads), left at random points by break,
    an exception, del of the iterator and of the loader, several iterators at once, and a few left open until
    the interpreter exits; every one must end, and no worker may outlive its pass."""
    out = _stress(300, 21)
    assert "300 trials" in out and "worker processes alive" in out


# ---- a worker that dies ----------------------------------------------------------------------------------------

class _Dies(gdata.Dataset):
    """Sample ``bad`` ends the worker reading it: os._exit(1), SIGKILL or a segfault."""

    def __init__(self, bad, how, n=40):
        self.bad, self.how, self.n = bad, how, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            if self.how == "exit":
                os._exit(1)
            elif self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "segv":
                faulthandler.disable()  # no traceback noise from the crash itself
                import ctypes
                ctypes.string_at(0)
            time.sleep(60)
        return np.float32(i)


@pytest.mark.parametrize("how, bad, sign", [("exit", 9, "exit code 1"), ("sigkill", 5, "killed by signal SIGKILL"),
                                            ("segv", 13, "killed by signal SIGSEGV")])
def test_dead_worker_is_reported_at_once(how, bad, sign):
    loader = gdata.DataLoader(_Dies(bad, how), batch_size=4, num_workers=2, timeout=30)
    got = []
    t0 = time.monotonic()
    with pytest.raises(dl.WorkerDiedError) as info:
        for x in loader:
            got.append(x.asnumpy().tolist())
    took = time.monotonic() - t0
    assert took < 5, f"the death was noticed after {took:.1f} s"
    first = bad // 4 * 4
    assert got == [list(range(b, b + 4)) for b in range(0, first, 4)]  # the batches before it arrive in order
    err = info.value
    msg = str(err)
    assert f"sample {bad} (dataset[{bad}])" in msg and sign in msg and f"pid {err.pid}" in msg, msg
    assert f"batch {bad // 4} (sample indices [{first}, {first + 1}, {first + 2}, {first + 3}])" in msg, msg
    assert err.sample == bad and err.batch_indices == list(range(first, first + 4)) and err.worker in (0, 1)
    assert isinstance(err, RuntimeError) and isinstance(err, dl.DnnbindError)
    # the other worker was stopped too, and the loader starts fresh workers for the next pass
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("DataLoader")]
    loader._dataset.bad = None
    assert [x.asnumpy().tolist() for x in loader][-1] == [36.0, 37.0, 38.0, 39.0]


def test_dead_worker_in_batchify_and_the_samples_it_had():
    def batchify(samples):
        if 6.0 in samples:
            os._exit(3)
        return np.stack(samples)

    loader = gdata.DataLoader(gdata.SimpleDataset(np.arange(12, dtype=np.float32)), batch_size=4,
                              batchify_fn=batchify, num_workers=1, timeout=30)
    with pytest.raises(dl.WorkerDiedError, match=r"exit code 3\) in batchify_fn, after reading the batch's "
                                                 r"samples of batch 1 \(sample indices \[4, 5, 6, 7\]\)"):
        list(loader)


def test_worker_killed_from_outside_while_the_loop_waits():
    class Slow(gdata.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            time.sleep(30 if i == 2 else 0)
            return np.float32(i)

    it = iter(gdata.DataLoader(Slow(), batch_size=2, num_workers=2, timeout=30))
    assert next(it).asnumpy().tolist() == [0, 1]
    victim = next(p for p in it._workers.procs if it._workers.pending[it._workers.procs.index(p)]
                  and it._workers.pending[it._workers.procs.index(p)][0][0] == 1)
    threading.Timer(0.5, os.kill, (victim.pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(dl.WorkerDiedError, match=rf"pid {victim.pid}\) died \(killed by signal SIGKILL\) while "
                                                 r"reading sample 2 \(dataset\[2\]\)"):
        next(it)
    assert time.monotonic() - t0 < 5
    with pytest.raises(StopIteration):  # the pass is over
        next(it)


# ---- errors, timeouts and shutdown -----------------------------------------------------------------------------

class _Unpicklable(Exception):
    def __init__(self, a, b):  # pickles as _Unpicklable(msg) and fails to unpickle: needs two arguments
        super().__init__(f"{a}/{b}")


class _Raises(gdata.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 1:
            raise KeyError(f"sample {i} is unreadable")
        if i == 5:
            raise _Unpicklable("x", "y")
        if i == 7:
            return lambda: None  # a sample that does not pickle (batchify=list keeps it as it is)
        return np.float32(i)


@pytest.mark.parametrize("sampler, error, match", [
    ([0, 1], KeyError, "sample 1 is unreadable"),
    ([4, 5], RuntimeError, r"_Unpicklable: x/y \(the worker's exception could not be pickled"),
    ([6, 7], RuntimeError, r"batch 0 \(sample indices \[6, 7\]\) could not be pickled"),
])
def test_worker_exceptions_keep_their_type_and_traceback(sampler, error, match):
    loader = gdata.DataLoader(_Raises(), batch_size=2, batchify_fn=list, num_workers=2, sampler=sampler)
    with pytest.raises(error, match=match) as info:
        list(loader)
    cause = info.value.__cause__
    assert isinstance(cause, dl._RemoteTraceback) and "Traceback (most recent call last)" in str(cause)
    assert "__getitem__" in str(cause) or "dumps" in str(cause)


def test_timeout_names_the_worker_and_the_sample():
    class Stuck(gdata.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(30 if i == 1 else 0)
            return np.float32(i)

    loader = gdata.DataLoader(Stuck(), batch_size=2, num_workers=1, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timeout=0.5 s \(batch 0 \(sample indices \[0, 1\]\) is with worker 0, "
                                           r"pid \d+, still reading sample 1 \(dataset\[1\]\) of batch 0"):
        next(iter(loader))
    assert time.monotonic() - t0 < 3  # and closing the pass did not wait for the stuck sample


def test_close_and_drop_stop_the_workers_at_once():
    import multiprocessing
    loader = gdata.DataLoader(gdata.SimpleDataset(np.arange(400, dtype=np.float32)), batch_size=2,
                              num_workers=4)
    for _ in range(3):
        it = iter(loader)
        procs = list(it._workers.procs)
        next(it)
        t0 = time.monotonic()
        del it
        assert time.monotonic() - t0 < 2 and all(p.exitcode is not None for p in procs)
    it = iter(loader)
    next(it)
    it.close()
    it.close()  # idempotent
    with pytest.raises(StopIteration):
        next(it)
    assert len(it) == 200
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("DataLoader")]


def test_big_batches_and_index_lists_do_not_block_the_pipes():
    """Tasks over a page (a batch of 3000 indices) and results far over a pipe's buffer both get through."""
    ds = gdata.ArrayDataset(np.arange(12000, dtype=np.int64))
    loader = gdata.DataLoader(ds, batch_size=3000, shuffle=True, num_workers=2, prefetch=4)
    loader._fast = None  # per-sample reads in the workers
    np.random.seed(0)
    got = np.concatenate([b.asnumpy() for b in loader])
    assert sorted(got.tolist()) == list(range(12000))


def test_workers_ignore_ctrl_c():
    """SIGINT reaches the whole process group on Ctrl-C; workers leave it to the main process, which stops them."""
    class Pid(gdata.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return np.int64(os.getpid())

    it = iter(gdata.DataLoader(Pid(), batch_size=1, num_workers=1, prefetch=1))
    pid = int(next(it).asnumpy()[0])
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    assert [int(b.asnumpy()[0]) for b in it] == [pid] * 5
