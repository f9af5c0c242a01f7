"""DataLoader and samplers with MXNet Gluon semantics.

Layer: gluon: data; imports numpy and dnnbind.runtime only (runtime.array, lazily, to make NDArrays).

Batches are assembled on the host in numpy and become CPU NDArrays at the end (MXNet's default_batchify_fn
does the same: np.asarray then nd.array), so `data.as_in_context(ctx)` is the one host-to-device copy.

Fast path: a Python loop of 64 __getitem__ calls plus a per-image ToTensor costs more than the GPU step on
MNIST. When the dataset is numpy arrays underneath (ArrayDataset, MNIST) wrapped only by transform_first of
batchable transforms (ToTensor, Normalize, Cast, Compose of those), we index the arrays with the whole batch
of indices and run the transform once on the stacked batch. The transforms are written so that this gives
bit-identical results to the per-sample path (tests/test_data.py checks it).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

import itertools
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .dataset import (
    Dataset,
    _LazyTransformDataset,
    _SubsetDataset,
    _TransformFirstClosure,
)

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
        if last_batch not in _LAST_BATCH:
            raise DnnbindValueError(f"last_batch must be one of {_LAST_BATCH}, got {last_batch!r}")
        if int(batch_size) < 1:
            raise DnnbindValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self._sampler, self._batch_size, self._last_batch = sampler, int(batch_size), last_batch
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
    if isinstance(dataset, _LazyTransformDataset):
        fn = dataset._fn
        if not (isinstance(fn, _TransformFirstClosure) and getattr(fn._fn, "batchable", False)):
            return None
        inner = _fast_source(dataset._data)
        return None if inner is None else (inner[0], inner[1] + [fn._fn], inner[2])
    if isinstance(dataset, _SubsetDataset):
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
    ``thread_pool=True``: threads instead), ``prefetch`` batches ahead (default 2 * num_workers); a worker's
    exception is raised here, and ``timeout`` seconds without a batch raise TimeoutError. Datasets the
    vectorized path serves (arrays with batchable transforms, see the module docstring) are sliced in this
    process: one slice costs less than shipping a batch back from a worker.
    pin_memory, pin_device_id, try_nopython: accepted for MXNet's signature; batches are CPU NDArrays over
    ordinary host memory, and ``as_in_context(gpu)`` copies them.
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, shuffle: bool = False,
                 sampler: Iterable[int] | None = None, last_batch: str | None = None,
                 batch_sampler: Iterable[list[int]] | None = None, batchify_fn: Callable | None = None,
                 num_workers: int = 0, pin_memory: bool = False, pin_device_id: int = 0,
                 prefetch: int | None = None, thread_pool: bool = False, timeout: float = 120,
                 try_nopython: bool | None = None) -> None:
        self._dataset = dataset
        if batch_sampler is None:
            if batch_size is None:
                raise DnnbindValueError("batch_size must be specified unless batch_sampler is specified")
            if sampler is None:
                sampler = RandomSampler(len(dataset)) if shuffle else SequentialSampler(len(dataset))
            elif shuffle:
                raise DnnbindValueError("shuffle must not be specified if sampler is specified")
            batch_sampler = BatchSampler(sampler, batch_size, last_batch if last_batch else "keep")
        elif batch_size is not None or shuffle or sampler is not None or last_batch is not None:
            raise DnnbindValueError("batch_size, shuffle, sampler and last_batch must not be specified if "
                             "batch_sampler is specified")
        self._batch_sampler = batch_sampler
        self._batchify_fn = batchify_fn
        self._num_workers = max(0, int(num_workers))
        self._prefetch = max(1, int(prefetch) if prefetch is not None else 2 * self._num_workers)
        self._thread_pool = bool(thread_pool)
        self._timeout = timeout
        # The fast path replaces the per-sample default batchify only; a custom batchify_fn sees samples.
        self._fast = _fast_source(dataset) if batchify_fn is None else None

    def _host_batch(self, indices: list[int]) -> Any:
        if self._fast is not None:
            arrays, fns, single = self._fast
            idx = np.asarray(indices, dtype=np.intp)
            fields = [a[idx] for a in arrays]
            for fn in fns:
                fields[0] = fn(fields[0])
            return fields[0] if single else fields
        samples = [self._dataset[i] for i in indices]
        if self._batchify_fn is not None:
            return self._batchify_fn(samples)
        return stack_numpy(samples)

    def _finish(self, batch: Any) -> Any:
        return batch if self._batchify_fn is not None else _to_nd(batch)

    def __iter__(self) -> Iterator[Any]:
        if self._num_workers == 0 or self._fast is not None:
            for indices in self._batch_sampler:
                yield self._finish(self._host_batch(indices))
            return
        if self._thread_pool:
            with ThreadPoolExecutor(self._num_workers) as pool:
                yield from self._pipelined(lambda b: pool.submit(self._host_batch, b),
                                           lambda f: f.result(self._timeout), lambda f: f.cancel())
            return
        import multiprocessing
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        # each worker reseeds numpy from this process's generator state (read, not advanced, so the shuffle
        # order is the same as with num_workers=0): random transforms differ between workers, and
        # np.random.seed / mx.random.seed here still fixes them
        state = np.random.get_state()
        seed = int(state[1][state[2] % len(state[1])])
        with ctx.Pool(self._num_workers, initializer=_worker_init, initargs=(self, seed)) as pool:
            yield from self._pipelined(lambda b: pool.apply_async(_worker_batch, (b,)),
                                       lambda r: r.get(self._timeout), lambda r: None)

    def _pipelined(self, submit: Callable, result: Callable, cancel: Callable) -> Iterator[Any]:
        """Keep ``prefetch`` batches in flight; yield them in order."""
        import multiprocessing
        batches = iter(self._batch_sampler)
        pending = deque(submit(b) for b in itertools.islice(batches, self._prefetch))
        try:
            while pending:
                done = pending.popleft()
                nxt = next(batches, None)
                if nxt is not None:
                    pending.append(submit(nxt))
                try:
                    batch = result(done)
                except (multiprocessing.TimeoutError, TimeoutError):
                    raise TimeoutError(f"DataLoader: no batch from the workers within timeout={self._timeout} s"
                                       " (a worker may be stuck, or the dataset is slow to read)") from None
                yield self._finish(batch)
        finally:
            for f in pending:
                cancel(f)

    def __len__(self) -> int:
        return len(self._batch_sampler)


# ---- worker processes -------------------------------------------------------------------------------------------

_worker_loader: DataLoader | None = None


def _worker_init(loader: DataLoader, seed: int) -> None:
    global _worker_loader
    import os
    _worker_loader = loader
    np.random.seed((seed + os.getpid()) % (2**32))


def _worker_batch(indices: list[int]) -> Any:
    assert _worker_loader is not None
    return _worker_loader._host_batch(indices)

