"""Datasets with MXNet Gluon semantics: Dataset, SimpleDataset, ArrayDataset, lazy transforms.

Layer: gluon: data; imports numpy and dnnbind.runtime only (here: numpy only).

A dataset is anything with __getitem__ and __len__. Items are numpy arrays / scalars or tuples of them;
NDArrays are made only when the DataLoader batches. The transform wrappers keep a reference to the wrapped
dataset and the function (`_data`, `_fn`) so the DataLoader can recognise "array data + a batchable transform
on the first field" and batch whole slices at once (see dataloader._fast_source).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

from collections.abc import Callable
from typing import Any

import numpy as np


class Dataset:
    """Abstract dataset: subclasses implement __getitem__ and __len__."""

    def __getitem__(self, idx: int) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def transform(self, fn: Callable, lazy: bool = True) -> Dataset:
        """Return a dataset whose items are fn(*item) (tuples are unpacked) or fn(item).

        lazy=False applies fn to every item now and keeps the results in a SimpleDataset.
        """
        trans = LazyTransformDataset(self, fn)
        if lazy:
            return trans
        return SimpleDataset([trans[i] for i in range(len(trans))])

    def transform_first(self, fn: Callable, lazy: bool = True) -> Dataset:
        """Like transform, but fn sees only the first field of each item (the data, not the label)."""
        return self.transform(TransformFirstClosure(fn), lazy)

    def take(self, count: int | None) -> Dataset:
        """The first `count` items (all when count is None or exceeds len)."""
        if count is None or count >= len(self):
            return self
        return SubsetDataset(self, np.arange(count))

    def filter(self, fn: Callable) -> Dataset:
        """The items for which fn(item) is true, in order (fn sees each item once, now)."""
        return SubsetDataset(self, np.array([i for i in range(len(self)) if fn(self[i])], dtype=np.int64))

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Shard ``index`` of ``num_shards`` contiguous shards; the first len % num_shards get one item more."""
        if not 0 <= index < num_shards:
            raise DnnbindValueError(f"Dataset.shard: index must be in [0, num_shards={num_shards}), got {index}")
        size, rest = divmod(len(self), num_shards)
        start = size * index + min(index, rest)
        return SubsetDataset(self, np.arange(start, start + size + (index < rest)))

    def sample(self, sampler: Any) -> Dataset:
        """The items at the indices ``sampler`` yields (a Sampler or any iterable of ints)."""
        return SubsetDataset(self, np.fromiter((int(i) for i in sampler), dtype=np.int64))


class SimpleDataset(Dataset):
    """Wraps any indexable with a length (a list, a numpy array, ...)."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, idx: int) -> Any:
        return self._data[idx]


class ArrayDataset(Dataset):
    """Zips equal-length arrays: item i is (a[i], b[i], ...), or a[i] when there is one array.

    Objects with .asnumpy() (NDArrays) are converted to numpy once, here, so indexing is cheap and the
    DataLoader can slice the arrays directly.
    """

    def __init__(self, *args: Any) -> None:
        if not args:
            raise DnnbindValueError("ArrayDataset needs at least one array")
        self._length = len(args[0])
        self._data = []
        for i, a in enumerate(args):
            if len(a) != self._length:
                raise DnnbindValueError(f"ArrayDataset: all arrays must have the same length; array 0 has "
                                 f"{self._length} items, array {i} has {len(a)}")
            if hasattr(a, "asnumpy"):
                a = a.asnumpy()
            self._data.append(a)

    def __len__(self) -> int:
        return self._length

    def _batch_arrays(self) -> list | None:
        # For the DataLoader's vectorised path; None unless every field is a numpy array.
        return self._data if all(isinstance(a, np.ndarray) for a in self._data) else None

    def __getitem__(self, idx: int) -> Any:
        if len(self._data) == 1:
            return self._data[0][idx]
        return tuple(a[idx] for a in self._data)


class _LazyTransformDataset(Dataset):
    """Applies fn to each item on access (MXNet unpacks tuple items into fn's arguments)."""

    def __init__(self, data: Dataset, fn: Callable) -> None:
        self._data = data
        self._fn = fn

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, idx: int) -> Any:
        item = self._data[idx]
        if isinstance(item, tuple):
            return self._fn(*item)
        return self._fn(item)


class _TransformFirstClosure:
    """fn applied to the first argument only; a class, not a lambda, so it pickles and can be inspected."""

    def __init__(self, fn: Callable) -> None:
        self._fn = fn

    def __call__(self, x: Any, *args: Any) -> Any:
        if args:
            return (self._fn(x),) + args
        return self._fn(x)


# The classes keep MXNet's private names (type names and reprs match MXNet's; code written for MXNet imports them
# from mxnet.gluon.data.dataset by these names); dnnbind's own modules use the public ones.
LazyTransformDataset = _LazyTransformDataset
TransformFirstClosure = _TransformFirstClosure


class SubsetDataset(Dataset):
    """The items of ``data`` at ``indices`` (take, filter, shard, sample)."""

    def __init__(self, data: Dataset, indices: np.ndarray) -> None:
        self._data = data
        self._indices = indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, idx: int) -> Any:
        return self._data[int(self._indices[idx])]


class RecordFileDataset(Dataset):
    """The records of a RecordIO file (``filename``, with its index beside it as ``<name>.idx``), as bytes in
    index order: MXNet's ``gluon.data.RecordFileDataset``. The file is opened once; a copy pickled into a
    DataLoader worker reopens it there."""

    def __init__(self, filename: str) -> None:
        import os

        from ...recordio import MXIndexedRecordIO
        self.idx_file = os.path.splitext(filename)[0] + ".idx"
        self.filename = filename
        self._record = MXIndexedRecordIO(self.idx_file, self.filename, "r")

    def __getitem__(self, idx: int) -> bytes:
        return self._record.read_idx(self._record.keys[idx])

    def __len__(self) -> int:
        return len(self._record.keys)
