"""MXNet 1.x's Python data iterators (``mx.io``): DataDesc, DataBatch, DataIter, NDArrayIter, ResizeIter and
PrefetchingIter. Layer: beside gluon, above nd; imports runtime, nd and features, never gluon (whose DataLoader is
the other way to feed a model).

NDArrayIter follows MXNet 1.9.1 as its own output shows (tests/fixtures/mxnet_io, written by MXNet itself):

- data and label are an array, a list (named ``_0_data``, ``_1_data``, ... when longer than one) or a dict, and the
  arrays are taken in the order of their sorted names (so ``_10_data`` comes before ``_2_data``). Anything but an
  NDArray becomes a float32 NDArray on the cpu, whatever its dtype; an NDArray keeps its dtype and device, except
  that ``shuffle=True`` makes every array float32 (MXNet rebuilds it from numpy). The number of samples is the
  first data array's; the other arrays are not checked against it until a batch reaches past their end.
- ``shuffle=True`` calls ``np.random.shuffle`` on the index array at construction and at every ``reset()`` /
  ``hard_reset()`` and reorders the arrays by it. Each shuffle reorders the already shuffled arrays: with ``i_j``
  the index array after j shuffles, the arrays after k shuffles are ``x[i_1][i_2]...[i_k]``, so a seeded numpy
  gives MXNet's order.
- ``'pad'``: the last batch wraps around to the start (repeatedly when the batch is larger than the data) and its
  ``pad`` is the number of wrapped samples. ``'discard'``: the last incomplete batch is dropped. ``'roll_over'``:
  the last incomplete batch is kept aside; after ``reset()`` the first batch is those samples followed by the
  first ones of the new epoch (after reshuffling), and its ``pad`` is the number of samples carried over (MXNet
  reports them as padding though they are real); the epoch then goes on from there. ``hard_reset()`` drops them.
  With a batch larger than the data, 'roll_over' fails at a later epoch's first batch, as MXNet does.
- ``getindex()`` and every batch's ``index`` are None; a finished epoch keeps raising StopIteration until
  ``reset()``.

Where dnnbind differs on purpose: ``last_batch_handle`` other than 'pad', 'discard' and 'roll_over' is an error
(MXNet treats any other string as 'discard'); ``batch_size`` must be a positive int (MXNet fails at the first batch
on 0 or a float); no data, empty data and 0-d arrays are refused with a message (MXNet: AssertionError, IndexError);
a layout's batch axis is used for counting, shuffling and tiling too (MXNet uses axis 0 for those); a dict passed in
is not modified (MXNet replaces its values by NDArrays).

ImageRecordIter and ImageDetRecordIter are Python reimplementations (image/record_iter.py). MXNet's other C++ iterators
(CSVIter, LibSVMIter, ... and MXDataIter, their wrapper) are not here: reading them raises UnsupportedFeature naming
them.
"""

from __future__ import annotations

import operator
import sys
import threading
import weakref
from collections import namedtuple

import numpy as np

from ._lib.errors import DnnbindTypeError, DnnbindValueError
from .features import missing
from .nd import array as nd_array
from .nd import concat, slice_axis, tile
from .runtime.array import NDArray
from .runtime.device import cpu

__all__ = ["DataBatch", "DataDesc", "DataIter", "ImageDetRecordIter", "ImageRecordIter", "MNISTIter", "NDArrayIter",
           "PrefetchingIter", "ResizeIter"]

LAST_BATCH_HANDLES = ("pad", "discard", "roll_over")


class DataDesc(namedtuple("DataDesc", ["name", "shape"])):
    """The name and shape of one input (a tuple, compared as such), with its ``dtype`` and ``layout``."""

    def __new__(cls, name: str, shape: tuple, dtype=np.float32, layout: str = "NCHW"):
        desc = super().__new__(cls, name, shape)
        desc.dtype, desc.layout = dtype, layout
        return desc

    def __getnewargs__(self):
        return (self.name, self.shape, self.dtype, self.layout)

    def __repr__(self) -> str:
        return f"DataDesc[{self.name},{self.shape},{self.dtype},{self.layout}]"

    @staticmethod
    def get_batch_axis(layout: str | None) -> int:
        """The position of ``N`` in ``layout`` (0 for None, -1 when it has none)."""
        return 0 if layout is None else layout.find("N")

    @staticmethod
    def get_list(shapes, types) -> list:
        """DataDescs from ``[(name, shape), ...]`` and, optionally, ``[(name, dtype), ...]``."""
        if types is None:
            return [DataDesc(name, shape) for name, shape in shapes]
        dtypes = dict(types)
        return [DataDesc(name, shape, dtypes[name]) for name, shape in shapes]


class DataBatch:
    """One batch: lists of data and label arrays, the number of padded samples and the sample indices."""

    def __init__(self, data, label=None, pad=None, index=None, bucket_key=None, provide_data=None,
                 provide_label=None):
        if data is not None and not isinstance(data, (list, tuple)):
            raise DnnbindTypeError("Data must be list of NDArrays")
        if label is not None and not isinstance(label, (list, tuple)):
            raise DnnbindTypeError("Label must be list of NDArrays")
        self.data, self.label, self.pad, self.index = data, label, pad, index
        self.bucket_key, self.provide_data, self.provide_label = bucket_key, provide_data, provide_label

    def __str__(self) -> str:
        data_shapes = [d.shape for d in self.data]
        label_shapes = [lab.shape for lab in self.label] if self.label else None
        return f"{type(self).__name__}: data shapes: {data_shapes} label shapes: {label_shapes}"


class DataIter:
    """The iterator protocol of MXNet's data iterators: ``iter_next()`` moves on and says whether there was a
    batch, ``getdata()``/``getlabel()``/``getpad()``/``getindex()`` read it, ``next()`` wraps them in a DataBatch
    and raises StopIteration at the end, ``reset()`` starts over. Subclasses override what they need."""

    def __init__(self, batch_size: int = 0):
        self.batch_size = batch_size

    def __iter__(self):
        return self

    def __next__(self) -> DataBatch:
        return self.next()

    def reset(self) -> None:
        """Go back to the start of the data."""

    def next(self) -> DataBatch:
        if not self.iter_next():
            raise StopIteration
        return DataBatch(data=self.getdata(), label=self.getlabel(), pad=self.getpad(), index=self.getindex())

    def iter_next(self):
        """Move to the next batch; whether there was one."""

    def getdata(self):
        """The current batch's data arrays."""

    def getlabel(self):
        """The current batch's label arrays."""

    def getindex(self):
        """The current batch's sample indices (None: not known)."""

    def getpad(self):
        """How many samples at the end of the current batch are padding."""


# -- NDArrayIter -------------------------------------------------------------------------------------------------

def _named_arrays(obj, default_name: str, required: bool) -> list:
    """``[(name, NDArray), ...]`` sorted by name, from an array, a list or a dict of them (MXNet's naming)."""
    if obj is None:
        if required:
            raise DnnbindValueError("NDArrayIter: data is required (an array, a list or a dict of arrays), got None")
        obj = []
    if isinstance(obj, (np.ndarray, NDArray)):
        obj = [obj]
    if isinstance(obj, list):  # one array takes the default name; several are _0_<name>, _1_<name>, ...
        if len(obj) == 1:
            named = {default_name: obj[0]}
        else:
            named = {f"_{i}_{default_name}": value for i, value in enumerate(obj)}
    elif isinstance(obj, dict):
        named = dict(obj)
    else:
        raise DnnbindTypeError("Input must be NDArray, numpy.ndarray, h5py.Dataset a list of them or dict with them "
                               "as values")
    out = []
    for name in sorted(named):
        value = named[name]
        if not isinstance(value, NDArray):
            try:
                value = nd_array(value, ctx=cpu())
            except (TypeError, ValueError):
                raise DnnbindTypeError(f"Invalid type '{type(value)}' for {name}, should be NDArray, numpy.ndarray "
                                       "or h5py.Dataset") from None
        if value.ndim == 0:
            raise DnnbindValueError(f"NDArrayIter: {name!r} is a scalar; every data and label array needs a batch "
                                    "axis (one entry per sample)")
        out.append((name, value))
    if required and not out:
        raise DnnbindValueError(f"NDArrayIter: data is empty ({obj!r}); give at least one array")
    return out


def _batch_size(batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)):
        raise DnnbindTypeError(f"NDArrayIter: batch_size must be an int, got {batch_size!r}")
    try:
        size = operator.index(batch_size)
    except TypeError:
        raise DnnbindTypeError(f"NDArrayIter: batch_size must be an int, got {batch_size!r}") from None
    if size < 1:
        raise DnnbindValueError(f"NDArrayIter: batch_size must be at least 1, got {size}")
    return size


class NDArrayIter(DataIter):
    """Batches of in-memory arrays (numpy arrays, NDArrays, lists of them or dicts name -> array), as MXNet 1.9.1's
    NDArrayIter: see this module's docstring for its exact behaviour."""

    def __init__(self, data, label=None, batch_size: int = 1, shuffle: bool = False, last_batch_handle: str = "pad",
                 data_name: str = "data", label_name: str = "softmax_label", layout: str = "NCHW"):
        super().__init__(_batch_size(batch_size))
        if last_batch_handle not in LAST_BATCH_HANDLES:
            raise DnnbindValueError(f"NDArrayIter: last_batch_handle must be 'pad', 'discard' or 'roll_over', got "
                                    f"{last_batch_handle!r} (MXNet 1.9.1 treats any other value as 'discard')")
        axis = DataDesc.get_batch_axis(layout)
        if axis < 0:
            raise DnnbindValueError(f"NDArrayIter: layout {layout!r} has no batch axis 'N'")
        self.data = _named_arrays(data, data_name, required=True)
        self.label = _named_arrays(label, label_name, required=False)
        for name, value in self.data + self.label:
            if value.ndim <= axis:
                raise DnnbindValueError(f"NDArrayIter: {name!r} has shape {value.shape}, which has no axis {axis} "
                                        f"for the 'N' of layout {layout!r}")
        self.layout, self._axis = layout, axis
        self.shuffle, self.last_batch_handle = shuffle, last_batch_handle
        self.num_data = self.data[0][1].shape[axis]
        self.idx = np.arange(self.num_data)
        self.cursor = -self.batch_size  # where the current batch starts; negative: the carried-over samples
        self._cache_data = self._cache_label = None  # 'roll_over': the last incomplete batch, for the next epoch
        self.reset()

    # -- what it provides ----------------------------------------------------------------------------------------
    def _descs(self, arrays: list) -> list:
        return [DataDesc(name, value.shape[:self._axis] + (self.batch_size,) + value.shape[self._axis + 1:],
                         np.dtype(value.dtype).type, layout=self.layout) for name, value in arrays]

    @property
    def provide_data(self) -> list:
        """A DataDesc per data array, with the batch's shape."""
        return self._descs(self.data)

    @property
    def provide_label(self) -> list:
        """A DataDesc per label array, with the batch's shape."""
        return self._descs(self.label)

    # -- moving --------------------------------------------------------------------------------------------------
    def _rolled_over(self) -> bool:
        """Whether the current batch is an epoch's first after a roll-over (it starts with the cached samples)."""
        return self.last_batch_handle == "roll_over" and -self.batch_size < self.cursor < 0

    def hard_reset(self) -> None:
        """Start over without the samples a 'roll_over' epoch left for the next one."""
        if self.shuffle:
            self._shuffle_data()
        self.cursor = -self.batch_size
        self._cache_data = self._cache_label = None

    def reset(self) -> None:
        if self.shuffle:
            self._shuffle_data()
        n, bs = self.num_data, self.batch_size
        if self.last_batch_handle == "roll_over" and n - bs < self.cursor < n:
            # The epoch ended on an incomplete batch (now cached): the next one starts that many samples early.
            self.cursor = self.cursor - n - bs
        else:
            self.cursor = -bs

    def iter_next(self) -> bool:
        self.cursor += self.batch_size
        return self.cursor < self.num_data

    def next(self) -> DataBatch:
        if not self.iter_next():
            raise StopIteration
        data, label = self.getdata(), self.getlabel()
        if data[0].shape[self._axis] != self.batch_size:  # the incomplete last batch: kept for 'roll_over' only
            self._cache_data, self._cache_label = data, label
            raise StopIteration
        return DataBatch(data=data, label=label, pad=self.getpad(), index=None)

    # -- reading the current batch -------------------------------------------------------------------------------
    def getdata(self) -> list:
        return self._batch(self.data)

    def getlabel(self) -> list:
        return self._batch(self.label)

    def getpad(self) -> int:
        if self.last_batch_handle == "pad" and self.cursor + self.batch_size > self.num_data:
            return self.cursor + self.batch_size - self.num_data
        if self._rolled_over():
            return -self.cursor
        return 0

    def _batch(self, arrays: list) -> list:
        n, bs, start = self.num_data, self.batch_size, self.cursor
        if start >= n:
            raise DnnbindValueError("DataIter needs reset.")
        if self._rolled_over():
            # NOTE: getdata() takes the cached data, the getlabel() that follows the cached label (MXNet's order).
            if self._cache_data is not None:
                cached, self._cache_data = self._cache_data, None
            elif self._cache_label is not None:
                cached, self._cache_label = self._cache_label, None
            else:
                raise DnnbindValueError("next epoch should have cached data")
            return self._join([cached, self._slice(arrays, 0, start + bs)])
        if self.last_batch_handle == "pad" and start + bs > n:
            wrapped = start + bs - n  # samples taken again from the start, as many times as needed
            whole, part = divmod(wrapped, n)
            pieces = [self._slice(arrays, start, None)]
            if whole:
                pieces.append(self._tile(self._slice(arrays, 0, n), whole))
            if part:
                pieces.append(self._slice(arrays, 0, part))
            return self._join(pieces)
        return self._slice(arrays, start, min(start + bs, n))

    def _slice(self, arrays: list, begin: int, end: int | None) -> list:
        """Samples [begin, end) of each array (copies); ``end=None``: to the end of the source's first array."""
        if end is None:
            end = arrays[0][1].shape[self._axis] if arrays else 0
        out = []
        for name, value in arrays:
            size = value.shape[self._axis]
            if end > size:
                raise DnnbindValueError(f"Check failed: *end <= axis_size: Invalid end for end={end} as axis_size is "
                                        f"{size} (NDArrayIter: {name!r} has {size} samples, the batch needs {end}; "
                                        f"give every data and label array the data's {self.num_data} samples)")
            out.append(slice_axis(value, axis=self._axis, begin=begin, end=end))
        return out

    def _tile(self, batch: list, times: int) -> list:
        out = []
        for value in batch:
            reps = [1] * value.ndim
            reps[self._axis] = times
            out.append(tile(value, reps=tuple(reps)))
        return out

    def _join(self, pieces: list) -> list:
        """The pieces' arrays concatenated along the batch axis, array by array (empty pieces: no arrays)."""
        pieces = [p for p in pieces if p]
        if len(pieces) <= 1:
            return pieces[0] if pieces else []
        if len({len(p) for p in pieces}) != 1:
            raise DnnbindValueError("data source should contain the same size")
        return [concat(*arrays, dim=self._axis) for arrays in zip(*pieces)]

    def _shuffle_data(self) -> None:
        # NOTE: the index array is shuffled in place and reorders the arrays as they are now (already shuffled),
        # exactly as MXNet does, so a seeded numpy gives MXNet's order. The result is float32, as in MXNet.
        np.random.shuffle(self.idx)
        self.data = self._reordered(self.data)
        self.label = self._reordered(self.label)

    def _reordered(self, arrays: list) -> list:
        out = []
        for name, value in arrays:
            try:
                host = np.take(value.asnumpy(), self.idx, axis=self._axis)
            except IndexError as exc:
                raise DnnbindValueError(f"NDArrayIter: shuffle=True needs {self.num_data} samples in every array, "
                                        f"{name!r} has {value.shape[self._axis]} ({exc})") from None
            out.append((name, nd_array(host, ctx=value.context)))
        return out


# -- wrappers ----------------------------------------------------------------------------------------------------

class _BatchHolder(DataIter):
    """An iterator that holds whole DataBatches (``current_batch``) and reads its parts from it."""

    def getdata(self):
        return self.current_batch.data

    def getlabel(self):
        return self.current_batch.label

    def getindex(self):
        return self.current_batch.index

    def getpad(self):
        return self.current_batch.pad


class ResizeIter(_BatchHolder):
    """``size`` batches per epoch from ``data_iter``, which is reset (and goes on) whenever it runs out first."""

    def __init__(self, data_iter: DataIter, size: int, reset_internal: bool = True):
        super().__init__()
        self.data_iter, self.size, self.reset_internal = data_iter, size, reset_internal
        self.cur = 0
        self.current_batch = None
        self.provide_data = data_iter.provide_data
        self.provide_label = data_iter.provide_label
        self.batch_size = data_iter.batch_size
        if hasattr(data_iter, "default_bucket_key"):
            self.default_bucket_key = data_iter.default_bucket_key

    def reset(self) -> None:
        self.cur = 0
        if self.reset_internal:
            self.data_iter.reset()

    def iter_next(self) -> bool:
        if self.cur == self.size:
            return False
        try:
            self.current_batch = self.data_iter.next()
        except StopIteration:
            self.data_iter.reset()
            self.current_batch = self.data_iter.next()
        self.cur += 1
        return True



class _Prefetcher:
    """One iterator's background thread: fetches the next batch whenever the last one was taken.

    ``ready`` is set when ``batch`` (None at the end, or ``error``) can be read; ``taken`` asks for the next one.
    The thread holds this object, not the PrefetchingIter, so dropping the PrefetchingIter stops it.
    """

    def __init__(self, it: DataIter):
        self.it, self.batch, self.error, self.alive = it, None, None, True
        self.ready, self.taken = threading.Event(), threading.Event()
        self.taken.set()
        self.thread = threading.Thread(target=self._run, name="dnnbind.io.PrefetchingIter", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.taken.wait()
            if not self.alive:
                return
            try:
                self.batch, self.error = self.it.next(), None
            except StopIteration:
                self.batch, self.error = None, None
            except BaseException as exc:  # noqa: BLE001  (handed to the consumer's thread, raised there)
                self.batch, self.error = None, exc
            self.taken.clear()
            self.ready.set()

    def request(self) -> None:
        self.ready.clear()
        self.taken.set()


def _stop(prefetchers: list) -> None:
    for p in prefetchers:
        p.alive = False
        p.taken.set()
    for p in prefetchers:
        if p.thread is not threading.current_thread():
            p.thread.join()


class PrefetchingIter(_BatchHolder):
    """Reads one batch ahead of each iterator in ``iters`` on a background thread per iterator; a batch holds the
    data (and labels) of every iterator's batch, in order. ``rename_data`` / ``rename_label``: a dict
    ``{old name: new name}`` per iterator for ``provide_data`` / ``provide_label``."""

    def __init__(self, iters, rename_data=None, rename_label=None):
        super().__init__()
        if not isinstance(iters, list):
            iters = [iters]
        if not iters:
            raise DnnbindValueError("PrefetchingIter: iters is empty; give a DataIter or a list of them")
        self.iters, self.n_iter = iters, len(iters)
        self.rename_data, self.rename_label = rename_data, rename_label
        self.batch_size = self.provide_data[0][1][0]
        self.current_batch = None
        self._prefetchers = [_Prefetcher(it) for it in iters]
        self._finalizer = weakref.finalize(self, _stop, self._prefetchers)

    @staticmethod
    def _renamed(iters: list, renames, attr: str) -> list:
        out = []
        for i, it in enumerate(iters):
            for desc in getattr(it, attr):
                if renames is None:
                    out.append(desc)
                    continue
                name, shape = desc[0], desc[1]
                if name not in renames[i]:
                    raise DnnbindValueError(f"PrefetchingIter: rename_{attr[8:]}[{i}] has no new name for {name!r}; "
                                            f"it needs one for each name in iters[{i}].{attr}")
                out.append(DataDesc(renames[i][name], shape, getattr(desc, "dtype", np.float32),
                                    getattr(desc, "layout", "NCHW")))
        return out

    @property
    def provide_data(self) -> list:
        return self._renamed(self.iters, self.rename_data, "provide_data")

    @property
    def provide_label(self) -> list:
        return self._renamed(self.iters, self.rename_label, "provide_label")

    def _wait(self) -> list:
        for p in self._prefetchers:
            p.ready.wait()
        for p in self._prefetchers:
            if p.error is not None:
                raise p.error
        return [p.batch for p in self._prefetchers]

    def reset(self) -> None:
        for p in self._prefetchers:
            p.ready.wait()  # the batch being fetched is dropped
        for it in self.iters:
            it.reset()
        for p in self._prefetchers:
            p.error = None
            p.request()

    def iter_next(self) -> bool:
        batches = self._wait()
        if batches[0] is None:
            if any(b is not None for b in batches):
                raise DnnbindValueError("Number of entry mismatches between iterators")
            return False
        if any(b is None or b.pad != batches[0].pad for b in batches):
            raise DnnbindValueError("Number of entry mismatches between iterators")
        self.current_batch = DataBatch([d for b in batches for d in (b.data or [])],
                                       [lab for b in batches for lab in (b.label or [])],
                                       batches[0].pad, batches[0].index, provide_data=self.provide_data,
                                       provide_label=self.provide_label)
        for p in self._prefetchers:
            p.request()
        return True

    def next(self) -> DataBatch:
        if not self.iter_next():
            raise StopIteration
        return self.current_batch



# -- MNISTIter ----------------------------------------------------------------------------------------------------

def _read_idx(path: str, what: str):
    """An IDX file (MNIST's format) as a numpy array: ``path`` itself, or ``path + '.gz'``."""
    import gzip
    import os
    for candidate, opener in ((path, open), (path + ".gz", gzip.open)):
        if os.path.exists(candidate):
            with opener(candidate, "rb") as f:
                raw = f.read()
            break
    else:
        raise FileNotFoundError(f"MNISTIter: the {what} file {path!r} (or {path}.gz) does not exist; MNIST's files "
                                "are train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
                                "t10k-labels-idx1-ubyte")
    if len(raw) < 8 or raw[:2] != b"\x00\x00" or raw[2] != 8:
        raise DnnbindValueError(f"MNISTIter: {path!r} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DnnbindValueError(f"MNISTIter: {path!r} holds {data.size} values, its header says {dims}")
    return data.reshape(dims)


class MNISTIter(DataIter):
    """MXNet's ``mx.io.MNISTIter`` (a C++ iterator there): MNIST's IDX files as batches of ``data`` (N, 1, 28, 28),
    or (N, 784) with ``flat``, scaled by 1/256 as MXNet's, and ``softmax_label`` (N,). As MXNet's: the order is
    shuffled once, when the iterator is made (``seed``), the last incomplete batch is dropped, and unknown keywords
    (``data_shape``, which MXNet's examples pass) are accepted and ignored. ``num_parts``/``part_index`` give one
    contiguous part of the (shuffled) images."""

    def __init__(self, image="./train-images-idx3-ubyte", label="./train-labels-idx1-ubyte", batch_size=128,
                 shuffle=True, flat=False, seed=0, silent=False, num_parts=1, part_index=0, prefetch_buffer=4,
                 ctx="gpu", dtype=None, **_ignored):
        super().__init__(_batch_size(batch_size))
        images = _read_idx(str(image), "image")
        labels = _read_idx(str(label), "label")
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DnnbindValueError(f"MNISTIter: {len(labels)} labels for images of shape {images.shape}")
        order = np.arange(len(labels))
        if shuffle:
            np.random.default_rng(int(seed)).shuffle(order)
        if int(num_parts) > 1:
            step = len(order) // int(num_parts)
            order = order[int(part_index) * step:(int(part_index) + 1) * step]
        x = images[order].astype(np.float32) * (1.0 / 256.0)
        self._data = x.reshape(len(order), -1) if flat else x.reshape(len(order), 1, *images.shape[1:])
        self._label = labels[order].astype(np.float32)
        self._cursor = -self.batch_size
        if not silent:
            print(f"MNISTIter: load {len(order)} images, shuffle={int(bool(shuffle))}, "  # MXNet's LOG(INFO)
                  f"shape={(self.batch_size,) + self._data.shape[1:]}", file=sys.stderr)

    @property
    def provide_data(self):
        return [DataDesc("data", (self.batch_size,) + self._data.shape[1:])]

    @property
    def provide_label(self):
        return [DataDesc("softmax_label", (self.batch_size,))]

    def reset(self) -> None:
        self._cursor = -self.batch_size

    def iter_next(self) -> bool:
        self._cursor += self.batch_size
        return self._cursor + self.batch_size <= len(self._label)

    def getdata(self):
        return [nd_array(self._data[self._cursor:self._cursor + self.batch_size], ctx=cpu())]

    def getlabel(self):
        return [nd_array(self._label[self._cursor:self._cursor + self.batch_size], ctx=cpu())]

    def getpad(self) -> int:
        return 0


# ImageRecordIter and ImageDetRecordIter (C++ in MXNet) are Python here; image.record_iter imports this module's DataIter,
# so the import sits below the classes it needs.
from .image.record_iter import ImageDetRecordIter, ImageRecordIter  # noqa: E402

# MXNet's other C++ iterators and its submodules: the first use says dnnbind does not have them.
_CPP_HINT = ("MXNet's C++ data iterators are not part of dnnbind; use mx.io.NDArrayIter, or a gluon.data Dataset with "
             "gluon.data.DataLoader")


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    hint = _CPP_HINT if name.endswith(("Iter", "Iter_v1")) else ""
    raise missing("io", name, hint=hint, obj=sys.modules[__name__])
