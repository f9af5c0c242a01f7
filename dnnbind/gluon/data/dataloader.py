"""DataLoader and samplers with MXNet Gluon semantics.

Layer: gluon: data; imports numpy and dnnbind.runtime only (runtime.array, lazily, to make NDArrays).

Batches are assembled on the host in numpy and become CPU NDArrays at the end (MXNet's default_batchify_fn
does the same: np.asarray then nd.array), so `data.as_in_context(ctx)` is the one host-to-device copy.

Fast path: a Python loop of 64 __getitem__ calls plus a per-image ToTensor costs more than the GPU step on
MNIST. When the dataset is numpy arrays underneath (ArrayDataset, MNIST) wrapped only by transform_first of
batchable transforms (ToTensor, Normalize, Cast, Compose of those), we index the arrays with the whole batch
of indices and run the transform once on the stacked batch. The transforms are written so that this gives
bit-identical results to the per-sample path (tests/test_data.py checks it).

Worker processes (num_workers > 0): each pass forks its own workers, each with a task pipe and a result pipe
of its own and no lock shared with any other process, and waits on the result pipes and the workers' process
sentinels together (multiprocessing.connection.wait). So leaving a loop early stops the workers at once, and a
worker that dies is reported by name with the sample it was reading (see the section "worker processes" for
why not multiprocessing.Pool).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindError, DnnbindTypeError, DnnbindValueError

import itertools
import multiprocessing
import numbers
import os
import pickle
import signal
import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import connection as mp_connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from .dataset import Dataset, LazyTransformDataset, SubsetDataset, TransformFirstClosure

_LAST_BATCH = ("keep", "discard", "rollover")


class Sampler:
    """Yields sample indices."""

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """start, start+1, ..., start+length-1."""

    def __init__(self, length: int, start: int = 0) -> None:
        self._length, self._start = length, start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._start, self._start + self._length))

    def __len__(self) -> int:
        return self._length


class RandomSampler(Sampler):
    """A fresh permutation of range(length) per pass.

    seed=None draws from numpy's global generator (so np.random.seed fixes the order, as in MXNet);
    an int seed gives permutation e from np.random.default_rng((seed, e)) for pass e, reproducible on resume
    via set_epoch.
    """

    def __init__(self, length: int, seed: int | None = None) -> None:
        self._length, self._seed, self._epoch = length, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self._seed is None:
            perm = np.random.permutation(self._length)
        else:
            perm = np.random.default_rng((self._seed, self._epoch)).permutation(self._length)
            self._epoch += 1
        return iter(perm.tolist())

    def __len__(self) -> int:
        return self._length


class DistributedSampler(Sampler):
    """This rank's share of a permutation of range(length): disjoint across ranks, the same size on each.

    Every rank draws the same permutation, np.random.default_rng((seed, epoch)), and takes every
    num_replicas-th index starting at its rank. When length does not divide evenly the permutation is padded
    by wrapping around to its start (so a few samples are seen twice per epoch), or, with drop_last, the tail
    is dropped. The epoch advances by one after each pass, as in RandomSampler; call set_epoch(e) at the start
    of every epoch to make the order depend on e alone (on resume, or when ranks iterate unevenly).

    num_replicas and rank default to dnnbind.distributed's world (or WORLD_SIZE/RANK, else a world of one).
    """

    def __init__(self, length: int, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            ws, r = _world()
            num_replicas = ws if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        if int(num_replicas) < 1 or not 0 <= int(rank) < int(num_replicas):
            raise DnnbindValueError(f"rank must be in [0, num_replicas={num_replicas}), got rank={rank}")
        if drop_last and length < num_replicas:
            raise DnnbindValueError(f"drop_last with length={length} < num_replicas={num_replicas} leaves no samples")
        self._length, self._replicas, self._rank = int(length), int(num_replicas), int(rank)
        self._shuffle, self._seed, self._drop_last, self._epoch = shuffle, seed, drop_last, 0
        per = self._length // self._replicas if drop_last else -(-self._length // self._replicas)
        self._num_samples = per

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self._shuffle:
            order = np.random.default_rng((self._seed, self._epoch)).permutation(self._length)
        else:
            order = np.arange(self._length)
        self._epoch += 1
        total = self._num_samples * self._replicas
        if total > self._length:  # wrap around, more than once if length < num_replicas
            order = np.resize(order, total)
        return iter(order[self._rank:total:self._replicas].tolist())

    def __len__(self) -> int:
        return self._num_samples


def _world() -> tuple[int, int]:
    """(world_size, rank) from dnnbind.distributed once init() ran, else from the environment."""
    dist = sys.modules.get("dnnbind.distributed")  # NOTE: not imported here: distributed sits below gluon
    if dist is not None and dist.is_initialized():
        return dist.world_size(), dist.rank()
    return int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)


class BatchSampler(Sampler):
    """Groups a sampler's indices into lists of batch_size.

    last_batch: 'keep' yields the short last batch, 'discard' drops it, 'rollover' carries its indices into
    the start of the next pass.
    """

    def __init__(self, sampler: Iterable[int], batch_size: int, last_batch: str = "keep") -> None:
        if last_batch not in _LAST_BATCH:  # MXNet's words (it raises them on iteration, not here)
            raise DnnbindValueError(f"last_batch must be one of 'keep', 'discard', or 'rollover', but got "
                                    f"{last_batch!r}")
        batch_size = _count("BatchSampler", "batch_size", batch_size, 1)
        self._sampler, self._batch_size, self._last_batch = sampler, batch_size, last_batch
        self._prev: list[int] = []

    def __iter__(self) -> Iterator[list[int]]:
        batch, self._prev = self._prev, []
        for i in self._sampler:
            batch.append(i)
            if len(batch) == self._batch_size:
                yield batch
                batch = []
        if batch:
            if self._last_batch == "keep":
                yield batch
            elif self._last_batch == "rollover":
                self._prev = batch

    def __len__(self) -> int:
        n, bs = len(self._sampler), self._batch_size
        if self._last_batch == "keep":
            return (n + bs - 1) // bs
        if self._last_batch == "discard":
            return n // bs
        return (len(self._prev) + n) // bs


def stack_numpy(data: list) -> Any:
    """Stack samples into numpy: tuples field by field (a list of arrays), anything else with np.asarray."""
    first = data[0]
    if isinstance(first, tuple):
        return [stack_numpy(list(field)) for field in zip(*data)]
    if hasattr(first, "asnumpy"):
        return np.stack([d.asnumpy() for d in data])
    return np.asarray(data)


def _to_nd(batch: Any) -> Any:
    # Lazy: importing the data layer must not load the runtime.
    from ...runtime.array import array

    if isinstance(batch, list):
        return [_to_nd(b) for b in batch]
    return array(batch, device="cpu", dtype=batch.dtype)


def default_batchify_fn(data: list) -> Any:
    """MXNet's default: stack numpy samples, return CPU NDArrays (a list of them for tuple samples)."""
    return _to_nd(stack_numpy(data))


def _fast_source(dataset: Dataset) -> tuple[list[np.ndarray], list[Callable], bool] | None:
    """(arrays, transforms for field 0, single) when batches can be sliced from numpy arrays, else None."""
    if isinstance(dataset, LazyTransformDataset):
        fn = dataset._fn
        if not (isinstance(fn, TransformFirstClosure) and getattr(fn._fn, "batchable", False)):
            return None
        inner = _fast_source(dataset._data)
        return None if inner is None else (inner[0], inner[1] + [fn._fn], inner[2])
    if isinstance(dataset, SubsetDataset):
        inner = _fast_source(dataset._data)
        return None if inner is None else ([a[dataset._indices] for a in inner[0]], inner[1], inner[2])
    get = getattr(dataset, "_batch_arrays", None)
    arrays = get() if get is not None else None
    if arrays is None:
        return None
    if not all(isinstance(a, np.ndarray) and a.dtype != object and len(a) == len(dataset) for a in arrays):
        return None
    return list(arrays), [], len(arrays) == 1


class DataLoader:
    """Iterates a dataset in mini-batches (mxnet.gluon.data.DataLoader).

    dataset: a Dataset (or anything with __getitem__/__len__).
    batch_size, shuffle, sampler, last_batch ('keep' | 'discard' | 'rollover'): as in MXNet; or give
    batch_sampler alone.
    batchify_fn: list of samples -> batch; default stacks into CPU NDArrays.
    num_workers: > 0 assembles batches in that many worker processes (``fork`` on Linux, as MXNet;
    ``thread_pool=True``: threads instead), ``prefetch`` batches ahead (default 2 * num_workers). Each pass
    (each ``iter(loader)``) starts its own workers and stops them when it ends, when the loop is left early
    (``break``, an exception, ``del``) or at exit. A worker's exception is raised here; a worker that dies
    (os._exit, a crash, a signal) raises WorkerDiedError naming it and the sample it was reading, at once;
    ``timeout`` seconds without the next batch raise TimeoutError. Datasets the vectorized path serves (arrays
    with batchable transforms, see the module docstring) are sliced in this process: one slice costs less
    than shipping a batch back from a worker.
    pin_memory, pin_device_id, try_nopython: accepted for MXNet's signature; batches are CPU NDArrays over
    ordinary host memory, and ``as_in_context(gpu)`` copies them.

    Argument errors are raised here, not on first use: a batch_size or num_workers that is not a
    non-negative integer (MXNet takes batch_size=0 or -1 as "everything in one batch" and num_workers=-1 as
    0), a bad last_batch (MXNet raises on iteration), a batchify_fn that is not callable, a sampler or
    batch_sampler that is not iterable.
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, shuffle: bool = False,
                 sampler: Iterable[int] | None = None, last_batch: str | None = None,
                 batch_sampler: Iterable[list[int]] | None = None, batchify_fn: Callable | None = None,
                 num_workers: int = 0, pin_memory: bool = False, pin_device_id: int = 0,
                 prefetch: int | None = None, thread_pool: bool = False, timeout: float = 120,
                 try_nopython: bool | None = None) -> None:
        if not hasattr(dataset, "__getitem__"):
            raise DnnbindTypeError(f"DataLoader: dataset must be a Dataset (support len() and dataset[i]), "
                                   f"got {type(dataset).__name__}")
        self._dataset = dataset
        if batch_sampler is None:
            if batch_size is None:
                raise DnnbindValueError("batch_size must be specified unless batch_sampler is specified")
            batch_size = _count("DataLoader", "batch_size", batch_size, 1)
            if sampler is None:
                if not hasattr(dataset, "__len__"):
                    raise DnnbindTypeError(f"DataLoader: dataset {type(dataset).__name__} has no len(); give a "
                                           "sampler or batch_sampler")
                sampler = RandomSampler(len(dataset)) if shuffle else SequentialSampler(len(dataset))
            elif shuffle:
                raise DnnbindValueError("shuffle must not be specified if sampler is specified")
            else:
                _iterable("sampler", sampler)
            batch_sampler = BatchSampler(sampler, batch_size, last_batch if last_batch else "keep")
        elif batch_size is not None or shuffle or sampler is not None or last_batch is not None:
            raise DnnbindValueError("batch_size, shuffle, sampler and last_batch must not be specified if "
                                    "batch_sampler is specified.")
        else:
            _iterable("batch_sampler", batch_sampler)
        if batchify_fn is not None and not callable(batchify_fn):
            raise DnnbindTypeError(f"DataLoader: batchify_fn must be callable (a list of samples -> a batch) or "
                                   f"None, got {batchify_fn!r}")
        self._batch_sampler = batch_sampler
        self._batchify_fn = batchify_fn
        self._num_workers = _count("DataLoader", "num_workers", num_workers, 0)
        prefetch = 2 * self._num_workers if prefetch is None else _count("DataLoader", "prefetch", prefetch, 0)
        self._prefetch = max(1, prefetch)  # MXNet's prefetch=0 still asks for the batch it waits for
        self._thread_pool = bool(thread_pool)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
            raise (DnnbindValueError if isinstance(timeout, numbers.Real) else DnnbindTypeError)(
                f"DataLoader: timeout must be a positive number of seconds, got {timeout!r}")
        self._timeout = float(timeout)
        # kept under MXNet's names: subclasses written for MXNet (GluonCV's RandomTransformDataLoader) read them
        self._pin_memory, self._pin_device_id = bool(pin_memory), pin_device_id
        # The fast path replaces the per-sample default batchify only; a custom batchify_fn sees samples.
        self._fast = _fast_source(dataset) if batchify_fn is None else None

    def _host_batch(self, indices: list[int], mark: Callable[[Any], None] | None = None) -> Any:
        """One batch on the host; ``mark(i)`` is called before reading sample i (workers record it)."""
        if self._fast is not None:
            arrays, fns, single = self._fast
            idx = np.asarray(indices, dtype=np.intp)
            fields = [a[idx] for a in arrays]
            for fn in fns:
                fields[0] = fn(fields[0])
            return fields[0] if single else fields
        if mark is None:
            samples = [self._dataset[i] for i in indices]
        else:
            samples = []
            for i in indices:
                mark(i)
                samples.append(self._dataset[i])
            mark(None)
        if self._batchify_fn is not None:
            return self._batchify_fn(samples)
        return stack_numpy(samples)

    def _finish(self, batch: Any) -> Any:
        return batch if self._batchify_fn is not None else _to_nd(batch)

    def __iter__(self) -> Iterator[Any]:
        if self._num_workers == 0 or self._fast is not None:
            return self._in_process()
        if self._thread_pool:
            return self._threaded()
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        # each worker reseeds numpy from this process's generator state (read, not advanced, so the shuffle
        # order is the same as with num_workers=0): random transforms differ between workers, and
        # np.random.seed / mx.random.seed here still fixes them
        state = np.random.get_state()
        seed = int(state[1][state[2] % len(state[1])])
        return _WorkerIter(self, ctx, seed)

    def _in_process(self) -> Iterator[Any]:
        for indices in self._batch_sampler:
            yield self._finish(self._host_batch(indices))

    def _threaded(self) -> Iterator[Any]:
        """Keep ``prefetch`` batches in flight on a thread pool; yield them in order."""
        pool = ThreadPoolExecutor(self._num_workers, thread_name_prefix="DataLoader")
        batches = iter(self._batch_sampler)
        pending = deque(pool.submit(self._host_batch, b) for b in itertools.islice(batches, self._prefetch))
        try:
            while pending:
                done = pending.popleft()
                nxt = next(batches, None)
                if nxt is not None:
                    pending.append(pool.submit(self._host_batch, nxt))
                try:
                    batch = done.result(self._timeout)
                except (TimeoutError, futures.TimeoutError):
                    raise TimeoutError(f"DataLoader: no batch from the worker threads within timeout="
                                       f"{self._timeout:g} s (the dataset is slow to read, or stuck)") from None
                yield self._finish(batch)
        finally:
            # a thread cannot be stopped: queued batches are dropped, the ones being read finish unseen
            pool.shutdown(wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self._batch_sampler)


def _count(op: str, name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``: TypeError for a non-integer (bool, float, str), ValueError below."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DnnbindTypeError(f"{op}: {name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise DnnbindValueError(f"{op}: {name} must be {need}, got {value}")
    return int(value)


def _iterable(name: str, value: Any) -> None:
    if not hasattr(value, "__iter__"):
        raise DnnbindTypeError(f"DataLoader: {name} must be iterable (a Sampler), got {value!r}")


# ---- worker processes -------------------------------------------------------------------------------------------
#
# Each worker has a pipe of tasks from this process and a pipe of results back, each with one reader and one
# writer, so no lock is shared between processes. (multiprocessing.Pool's workers share a result queue whose
# write lock is a semaphore: Pool.terminate() killed a worker while it held that lock, and the pool's own
# shutdown then blocked on it forever: the hang when a loop left a DataLoader early.) A worker's exit shows on
# its process sentinel at once, and the batches it held are known: the ones sent to it and not answered.


class WorkerDiedError(DnnbindError, RuntimeError):
    """A DataLoader worker process exited while the loop waited on it (os._exit, a crash in native code, a
    signal, the out-of-memory killer); its batches are lost. The message names the worker, its pid, how it
    ended and the sample it was reading."""


class _RemoteTraceback(Exception):
    """The traceback of a worker's exception, attached as its ``__cause__`` (as concurrent.futures does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# The live worker sets of this process: a forked worker closes their pipe ends (see close_inherited).
_live: weakref.WeakSet = weakref.WeakSet()

# What a worker is doing, in its progress slots: (state, sample index).
_IDLE, _SAMPLE, _OTHER_KEY, _BATCHIFY = 0, 1, 2, 3
# Bytes of tasks that may wait unread in a worker's pipe. A pipe holds at least a page (4096 bytes), so a
# write of this much never blocks; a bigger task is sent only to a worker that has nothing queued (it is then
# reading its pipe, not blocked writing a result that this process is not reading).
_PIPE_ROOM = 4000
_PARENT_CHECK_S = 1.0  # how often an idle worker checks that its parent is still alive
_GRACE_S = 0.05  # how long shutdown waits for idle workers to leave on their own before it terminates them


class _WorkerSet:
    """The worker processes of one pass, the pipes to them, and the batches each one holds."""

    def __init__(self, loader: DataLoader, ctx: Any, seed: int) -> None:
        n = loader._num_workers
        self.procs: list[Any] = []
        self.tasks: list[Any] = []  # this process's write end of each worker's task pipe
        self.results: list[Any] = []  # this process's read end of each worker's result pipe
        self.pending: list[deque] = [deque() for _ in range(n)]  # per worker: (batch id, task bytes), FIFO
        self.indices: dict[int, list] = {}  # batch id -> its sample indices, until answered
        self.done: dict[int, tuple[bool, Any]] = {}
        self.dead: dict[int, WorkerDiedError] = {}  # workers that exited, and the error that says so
        self.progress = ctx.RawArray("q", 2 * n)  # per worker: state, sample index (shared memory)
        self.closed = False
        self.owner = os.getpid()  # only this process may stop the workers (not a forked copy of it)
        _live.add(self)
        try:
            for w in range(n):
                task_r, task_w = ctx.Pipe(duplex=False)
                res_r, res_w = ctx.Pipe(duplex=False)
                self.tasks.append(task_w)
                self.results.append(res_r)
                try:
                    p = ctx.Process(target=_worker_loop, name=f"DataLoader worker {w}", daemon=True,
                                    args=(loader, w, seed, task_r, res_w, self.progress, os.getpid()))
                    p.start()
                finally:
                    # Drop this process's copies of the worker's ends now, before the next fork copies them:
                    # then a worker's exit reads as end-of-file on its result pipe, and a write to a dead
                    # worker fails instead of filling a pipe nobody reads.
                    task_r.close()
                    res_w.close()
                self.procs.append(p)
        except BaseException:
            self.shutdown()
            raise

    def close_inherited(self) -> None:
        """In a forked worker: close the copies of this process's pipe ends it inherited, so that end-of-file
        still reaches the workers (a pipe reads as closed only once every copy of its write end is closed)."""
        for conn in (*self.tasks, *self.results):
            conn.close()

    def submit(self, bid: int, indices: list) -> bool:
        """Send batch ``bid`` to the least busy worker with room in its pipe; False if none has room (or a
        worker has died: the pass then ends at the first batch it lost)."""
        if self.dead:
            return False
        payload = ForkingPickler.dumps((bid, indices))
        best = None
        for w, queue in enumerate(self.pending):
            if queue and sum(size for _, size in queue) + len(payload) > _PIPE_ROOM:
                continue
            if best is None or len(queue) < len(self.pending[best]):
                best = w
        if best is None:
            return False
        self.indices[bid] = indices
        self.pending[best].append((bid, len(payload)))
        try:
            self.tasks[best].send_bytes(payload)
        except OSError:  # its read end is closed: the worker is gone
            self._lost(best)
        return True

    def get(self, bid: int, timeout: float) -> tuple[bool, Any]:
        """(ok, batch or (exception, traceback)) of batch ``bid``, waiting at most ``timeout`` seconds; raises
        WorkerDiedError if the worker holding it died (the batches before it still come)."""
        deadline = time.monotonic() + timeout
        while bid not in self.done:
            holder = next((w for w, queue in enumerate(self.pending) if any(b == bid for b, _ in queue)), None)
            if self.dead and (holder is None or holder in self.dead):
                raise self.dead.get(holder) or self.first_death()
            live = [w for w in range(len(self.procs)) if w not in self.dead]
            readers = {self.results[w]: w for w in live if self.pending[w]}
            sentinels = {self.procs[w].sentinel: w for w in live}
            ready = mp_connection.wait([*readers, *sentinels], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(self._timeout_message(bid, timeout))
            for r in ready:
                if r in readers:
                    self._receive(readers[r])
            for r in ready:
                w = sentinels.get(r) if isinstance(r, int) else None
                if w is not None and w not in self.dead:
                    while self.pending[w] and w not in self.dead and self.results[w].poll():
                        self._receive(w)  # what it sent before it went
                    self._lost(w)
        self.indices.pop(bid, None)
        return self.done.pop(bid)

    def first_death(self) -> WorkerDiedError:
        return next(iter(self.dead.values()))

    def _lost(self, w: int) -> None:
        if w not in self.dead:
            self.dead[w] = self._died(w)

    def _receive(self, w: int) -> None:
        try:
            bid, ok, payload = self.results[w].recv()
        except (EOFError, OSError):  # it died (mid-message, perhaps)
            self._lost(w)
            return
        except Exception as e:  # noqa: BLE001 (a batch this process cannot unpickle: that batch's error)
            bid, ok, payload = self.pending[w][0][0], False, (e, "")
        sent, _ = self.pending[w].popleft()  # a worker answers its tasks in order
        assert sent == bid, (sent, bid)
        self.done[bid] = (ok, payload)

    def _doing(self, w: int) -> str:
        state, index = self.progress[2 * w], self.progress[2 * w + 1]
        if state == _SAMPLE:
            return f"reading sample {index} (dataset[{index}])"
        if state == _OTHER_KEY:
            return "reading a sample (dataset[key] for a key that is not an int)"
        if state == _BATCHIFY:
            return "in batchify_fn, after reading the batch's samples"
        return "between batches"

    def _batch_text(self, bid: int) -> str:
        idx = list(self.indices.get(bid, ()))
        shown = ", ".join(map(str, idx[:8])) + (f", ... ({len(idx)} in all)" if len(idx) > 8 else "")
        return f"batch {bid} (sample indices [{shown}])"

    def _died(self, w: int) -> WorkerDiedError:
        p = self.procs[w]
        p.join(1.0)  # its sentinel fired or its pipe closed: it is exiting
        code = p.exitcode
        if code is None:
            how = "its pipe closed"
        elif code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit code {code}"
        held = [bid for bid, _ in self.pending[w]]
        if held:
            doing = self._doing(w)
            what = f"{'while ' if doing.startswith('reading') else ''}{doing} of {self._batch_text(held[0])}"
            if len(held) > 1:
                what += f"; it also held batches {held[1:]}"
        else:
            what = "while holding no batch"
        err = WorkerDiedError(
            f"DataLoader worker {w} (pid {p.pid}) died ({how}) {what}. The batch is lost and the pass stops. "
            "Look at the dataset's __getitem__ (or batchify_fn) for that sample: os._exit or sys.exit, a crash "
            "in native code, a signal, or the out-of-memory killer.")
        state, index = self.progress[2 * w], self.progress[2 * w + 1]
        err.worker, err.pid, err.exitcode = w, p.pid, code
        err.sample = index if held and state == _SAMPLE else None
        err.batch_indices = list(self.indices.get(held[0], ())) if held else None
        return err

    def _timeout_message(self, bid: int, timeout: float) -> str:
        w = next((w for w, queue in enumerate(self.pending) if any(b == bid for b, _ in queue)), None)
        where = "" if w is None else (f" ({self._batch_text(bid)} is with worker {w}, pid {self.procs[w].pid}, "
                                      f"still {self._doing(w)} of {self._batch_text(self.pending[w][0][0])})")
        return (f"DataLoader: no batch from the workers within timeout={timeout:g} s{where}: a worker may be "
                "stuck, or the dataset is slow to read (raise timeout=)")

    def shutdown(self) -> None:
        """Stop the workers now; never blocks for long. Idempotent."""
        if self.closed or os.getpid() != self.owner:
            return
        self.closed = True
        _live.discard(self)
        for conn in (*self.tasks, *self.results):
            conn.close()  # an idle worker reads end-of-file and leaves; a busy one fails its next send
        deadline = time.monotonic() + _GRACE_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        # No lock is shared with a worker, so killing one mid-batch can leave nothing blocked here.
        for p in self.procs:
            if p.exitcode is None:
                p.terminate()
        for p in self.procs:
            p.join(1.0)
            if p.exitcode is None:  # it ignores SIGTERM (a handler it inherited)
                p.kill()
                p.join(1.0)


class _WorkerIter:
    """One pass over a DataLoader with worker processes: up to ``prefetch`` batches in flight, yielded in order.

    The workers stop when the pass ends, on an error, on close(), when the iterator is dropped (a ``break``
    out of a for loop, ``del``) and at interpreter exit (weakref.finalize).
    """

    def __init__(self, loader: DataLoader, ctx: Any, seed: int) -> None:
        self._loader = loader
        self._batches = iter(loader._batch_sampler)
        self._held: list | None = None  # the next batch's indices, when no worker had room for it
        self._sent = self._taken = 0
        self._exhausted = False
        workers = _WorkerSet(loader, ctx, seed)
        self._workers = workers
        self._finalizer = weakref.finalize(self, workers.shutdown)
        try:
            self._fill()
        except BaseException:
            self.close()
            raise

    def _fill(self) -> None:
        while not self._exhausted and self._sent - self._taken < self._loader._prefetch:
            if self._held is None:
                self._held = next(self._batches, None)
                if self._held is None:
                    self._exhausted = True
                    return
            if not self._workers.submit(self._sent, self._held):
                return
            self._sent += 1
            self._held = None

    def __iter__(self) -> "_WorkerIter":
        return self

    def __next__(self) -> Any:
        if not self._finalizer.alive:
            raise StopIteration
        try:
            self._fill()
            if self._taken == self._sent:
                if self._workers.dead:  # the batches left were never sent
                    raise self._workers.first_death()
                self.close()
                raise StopIteration
            ok, payload = self._workers.get(self._taken, self._loader._timeout)
            self._taken += 1
            if not ok:
                exc, tb = payload
                if tb:
                    exc.__cause__ = _RemoteTraceback(tb)
                raise exc
            self._fill()
            return self._loader._finish(payload)
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._loader._batch_sampler)

    def close(self) -> None:
        """Stop the workers; the pass ends (idempotent)."""
        self._finalizer()


def _pack_error(e: BaseException) -> tuple[BaseException, str]:
    """(the exception, its formatted traceback), with an exception that does not survive pickling replaced
    by a RuntimeError that carries its type and message."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        pickle.loads(ForkingPickler.dumps(e))
    except Exception:  # noqa: BLE001 (any failure to round-trip)
        e = RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {e} (the worker's exception could not be "
                         "pickled; its traceback follows)")
    e.__traceback__ = None
    return e, tb


def _worker_loop(loader: DataLoader, w: int, seed: int, tasks: Any, results: Any, progress: Any,
                 parent: int) -> None:
    """A worker: read (batch id, indices), answer (batch id, ok, batch or error), until end-of-file."""
    for live in list(_live):  # empty unless forked
        live.close_inherited()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process, which stops the workers
    np.random.seed((seed + os.getpid()) % (2**32))

    def mark(i: Any) -> None:
        if i is None:
            progress[2 * w] = _BATCHIFY
        elif isinstance(i, numbers.Integral):
            progress[2 * w + 1] = int(i)
            progress[2 * w] = _SAMPLE
        else:
            progress[2 * w] = _OTHER_KEY

    while True:
        try:
            while not tasks.poll(_PARENT_CHECK_S):
                if os.getppid() != parent:  # orphaned: the main process is gone
                    return
            bid, indices = tasks.recv()
        except (EOFError, OSError):
            return
        try:
            out = (bid, True, loader._host_batch(indices, mark))
        except Exception as e:  # noqa: BLE001 (every error goes back to the loop)
            out = (bid, False, _pack_error(e))
        progress[2 * w] = _IDLE
        try:
            buf = ForkingPickler.dumps(out)
        except Exception as e:  # noqa: BLE001 (a batch that does not pickle)
            shown = list(indices[:8]) + (["..."] if len(indices) > 8 else [])
            err = RuntimeError(f"DataLoader worker {w}: batch {bid} (sample indices {shown}) could not be "
                               f"pickled to send it to the main process ({type(e).__name__}: {e}); return numpy "
                               "arrays, NDArrays or plain Python values from the dataset and batchify_fn, or "
                               "use thread_pool=True")
            err.__cause__ = e
            buf = ForkingPickler.dumps((bid, False, _pack_error(err)))
        try:
            results.send_bytes(buf)
        except OSError:  # the main process closed its end: the pass is over
            return


# ---- MXNet's private worker-pool names ----------------------------------------------------------------------------
#
# Libraries written for MXNet 1.x import these from mxnet.gluon.data.dataloader and subclass them: GluonCV's
# RandomTransformDataLoader builds a multiprocessing.Pool with ``_worker_initializer`` and iterates it with a
# ``_MultiWorkerIter`` subclass that overrides ``_push_next``. They keep MXNet's signatures and attributes
# (``_worker_pool``, ``_data_buffer``, ``_sent_idx``, ``_rcvd_idx``, ``_iter``); dnnbind's own DataLoader does not
# use them (see the worker-process section above for why not multiprocessing.Pool).


def default_mp_batchify_fn(data: list) -> Any:
    """MXNet's batchify for worker processes. MXNet stacks into ``cpu_shared`` memory so the batch crosses the
    process boundary without a copy; here the batch is pickled back (``_worker_fn``), so it is the default."""
    return default_batchify_fn(data)


def _as_in_context(data: Any, ctx: Any) -> Any:
    """``data`` (an NDArray, or a list/tuple of them) moved to ``ctx``; anything else unchanged."""
    if hasattr(data, "as_in_context"):
        return data.as_in_context(ctx)
    if isinstance(data, (list, tuple)):
        return [_as_in_context(d, ctx) for d in data]
    return data


_worker_dataset = None  # the dataset of this worker process, set by _worker_initializer


def _worker_initializer(dataset: Any, active_shape: Any = None, active_array: Any = None) -> None:
    """multiprocessing.Pool initializer: the dataset becomes a global of the worker (MXNet's; the two numpy
    flags are accepted and ignored, dnnbind has no numpy-semantics mode)."""
    global _worker_dataset
    _worker_dataset = dataset


def _worker_fn(samples: list, batchify_fn: Callable, dataset: Any = None) -> bytes:
    """In a worker: the batch of ``samples`` from the worker's dataset, pickled with ForkingPickler."""
    batch = batchify_fn([_worker_dataset[i] for i in samples])
    return ForkingPickler.dumps(batch, pickle.HIGHEST_PROTOCOL).tobytes()


def _thread_worker_fn(samples: list, batchify_fn: Callable, dataset: Any) -> Any:
    """In a thread of a ThreadPool: the batch, unpickled."""
    return batchify_fn([dataset[i] for i in samples])


class _MultiWorkerIter:
    """MXNet's iterator over a ``multiprocessing.Pool`` (or ThreadPool): ``prefetch`` batches are submitted with
    ``apply_async(worker_fn, (indices, batchify_fn, dataset))`` at once, one more per batch taken, and yielded
    in order. With ``dataset`` None the worker returns pickled bytes (``_worker_fn``), else the batch itself."""

    def __init__(self, worker_pool: Any, batchify_fn: Callable, batch_sampler: Iterable, pin_memory: bool = False,
                 pin_device_id: int = 0, worker_fn: Callable = _worker_fn, prefetch: int = 0, dataset: Any = None,
                 data_loader: Any = None, timeout: float = 120) -> None:
        self._worker_pool = worker_pool
        self._batchify_fn = batchify_fn
        self._batch_sampler = batch_sampler
        self._data_buffer: dict = {}
        self._rcvd_idx = 0
        self._sent_idx = 0
        self._iter = iter(self._batch_sampler)
        self._worker_fn = worker_fn
        self._pin_memory = pin_memory
        self._pin_device_id = pin_device_id
        self._dataset = dataset
        self._data_loader = data_loader
        self._timeout = timeout
        for _ in range(prefetch):
            self._push_next()

    def __len__(self) -> int:
        return len(self._batch_sampler)

    def _push_next(self) -> None:
        """Submit the next batch of indices to the pool (nothing when the sampler is exhausted)."""
        r = next(self._iter, None)
        if r is None:
            return
        self._data_buffer[self._sent_idx] = self._worker_pool.apply_async(
            self._worker_fn, (r, self._batchify_fn, self._dataset))
        self._sent_idx += 1

    def __next__(self) -> Any:
        self._push_next()
        if self._rcvd_idx == self._sent_idx:
            raise StopIteration
        ret = self._data_buffer.pop(self._rcvd_idx)
        try:
            batch = ret.get(self._timeout)
        except multiprocessing.TimeoutError:
            raise TimeoutError(f"DataLoader: worker timed out after {self._timeout} seconds (a slow transform: "
                               "raise timeout)") from None
        except BaseException:
            self._worker_pool.terminate()
            raise
        if self._dataset is None:
            batch = pickle.loads(batch)
        self._rcvd_idx += 1
        return batch  # pin_memory: batches are CPU NDArrays already, as_in_context(gpu) copies them

    next = __next__

    def __iter__(self) -> "_MultiWorkerIter":
        return self
