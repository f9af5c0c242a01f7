"""MXNet's KVStore (``mx.kv`` / ``mx.kvstore``): ``create(name)`` and the KVStore's init / push / pull / pushpull /
broadcast, with an optimizer or an updater on the store. Layer: top (above gluon and distributed); imports runtime,
gluon's optimizer and dnnbind.distributed.

What each kind sums (the same split as gluon.Trainer's ``kvstore=``, see gluon/grad_reduce.py):

- every kind: the arrays of one push (one per device, MXNet's list) are added, in list order, on the device of the
  stored value (each is copied there first: simple, and correct for cpu and gpu arrays alike);
- ``'device'``, ``'nccl'``, ``'dist_sync'``, ``'dist_device_sync'`` (``'dist_sync_device'``) and ``'horovod'``:
  under ``python -m dnnbind.launch`` (``dnnbind.distributed.init()`` with a world of n > 1) the sum is then
  all-reduced over the n processes with the world's NCCL communicator, and ``init`` broadcasts rank 0's value,
  as MXNet's dist kvstore does. NCCL needs GPU arrays there: a cpu array is a DnnbindValueError. Every rank must
  make the same calls in the same order (NCCL matches collectives by order, not by key);
- ``'local'``: nothing crosses processes.

``rank`` and ``num_workers`` are the world's (``dnnbind.distributed``) for the kinds that cross processes, 0 and 1
for ``'local'``. ``create('dist_*')`` calls ``dnnbind.distributed.init()`` when no one has, as MXNet's create
joins the job; a process that was not launched is then a world of one. (MXNet 1.9.1 itself needs its ps-lite
scheduler for the dist kinds: without DMLC_NUM_WORKER & co. create fails, ``Check notnull:
Environment::Get()->find("DMLC_NUM_WORKER")``.)

Semantics read from MXNet 1.9.1 (tests/fixtures/mxnet_kvstore): a push without an updater replaces the stored
value by the sum; with one (``set_optimizer``, ``_set_updater``) it calls ``updater(key, merged, stored)``, which
updates the stored value in place, so a pull gives the updated weight. Where dnnbind differs on purpose:

- an unknown name is an error (MXNet makes a local store of any name without "dist" or "nccl" in it);
  ``'dist_async'`` is refused (there is no parameter server);
- a push whose shape differs from the stored value's is an error (MXNet, without an updater, quietly makes the
  stored value take the pushed shape);
- an updater gets a str key as str (MXNet's ``_set_updater`` callback gets bytes);
- ``save_optimizer_states`` writes numpy arrays in its pickle (MXNet pickles its own NDArrays), so the files
  are dnnbind's own.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ._lib.errors import DnnbindTypeError, DnnbindValueError
from . import distributed
from .features import UnsupportedFeature
from .gluon import optimizer as opt
from .gluon.optimizer import Updater, get_updater  # noqa: F401  (mx.kvstore's names, as in MXNet)
from .runtime.array import NDArray, array
from .runtime.device import as_device, gpu
from .runtime.stream import current_stream

__all__ = ["KVStore", "KVStoreBase", "Updater", "create", "get_updater", "world_communicator"]

LOCAL = "local"
WORLD_KINDS = ("device", "nccl", "dist_sync", "dist_device_sync", "dist_sync_device", "horovod")
KINDS = (LOCAL, *WORLD_KINDS)


class KVStoreBase:
    """MXNet's abstract store: ``KVStoreBase.register(cls)`` makes ``create(cls.__name__.lower())`` give a
    ``cls()``, looked up before the built-in kinds (as MXNet 1.9.1's create does)."""

    OPTIMIZER = "optimizer"
    kv_registry: dict = {}

    @staticmethod
    def register(klass):
        if not isinstance(klass, type):
            raise DnnbindTypeError(f"KVStoreBase.register: expects a class, got {type(klass).__name__}")
        KVStoreBase.kv_registry[klass.__name__.lower()] = klass
        return klass


def create(name: str = "local") -> KVStoreBase:
    """A new store of kind ``name`` (case-insensitive): one of KINDS, or a class registered with
    ``KVStoreBase.register``."""
    if not isinstance(name, str):
        raise DnnbindTypeError("name must be a string")  # MXNet's TypeError text
    kind = name.lower()
    if kind in KVStoreBase.kv_registry:
        return KVStoreBase.kv_registry[kind]()
    if kind.startswith("dist") and "async" in kind:
        raise DnnbindValueError(f"mx.kv.create({name!r}): asynchronous updates are not supported by dnnbind (there "
                                "is no parameter server); use 'dist_sync', which sums every push over the "
                                "processes of python -m dnnbind.launch")
    if kind not in KINDS:
        raise DnnbindValueError(f"mx.kv.create({name!r}): unknown KVStore type; use one of {', '.join(KINDS)}")
    if kind.startswith("dist") and not distributed.is_initialized():
        distributed.init()  # MXNet's dist create joins the job; not launched: a world of one
    return KVStore(kind)


# -- the world's NCCL communicator, one per device, shared with dnnbind.horovod ----------------------------------

_comms: dict = {}


def world_size() -> int:
    """The launched world's size after dnnbind.distributed.init(), else 1."""
    return distributed.world_size() if distributed.is_initialized() else 1


def world_communicator(device, what: str = "KVStore"):
    """This process's NCCL communicator of the launched world on ``device``, made on first use and kept (making
    one is a collective: every rank must ask in the same order). Tests replace this function."""
    device = as_device(device)
    if device.kind != "gpu":
        raise DnnbindValueError(f"{what}: this process is rank {distributed.rank()} of {distributed.world_size()} "
                                f"(dnnbind.distributed.init()), and values are summed across processes with NCCL, "
                                f"which needs GPU arrays; got an array on {device!r}. Put it on "
                                f"gpu(dnnbind.distributed.local_rank()), or run one process (WORLD_SIZE=1).")
    key = (device, distributed.rank(), distributed.world_size(), distributed.master())
    comm = _comms.get(key)
    if comm is None or not comm.handle:
        comm = _comms[key] = distributed.communicator(device)
    return comm


# -- the store -----------------------------------------------------------------------------------------------------

def _moved(a: NDArray, device) -> NDArray:
    """``a`` on ``device`` (itself when already there). NOTE: a copy between two GPUs (cudaMemcpyPeerAsync) is
    ordered with neither GPU's stream, so it waits for a's stream before and for the copy after."""
    if a.device is device:
        return a
    between_gpus = a.device.kind == "gpu" and device.kind == "gpu"
    if between_gpus:
        current_stream(a.device).synchronize()
    out = a.detach().to(device)
    if between_gpus:
        current_stream(device).synchronize()
    return out


def _mx_shape(shape: tuple) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class KVStore(KVStoreBase):
    """A key-value store over NDArrays (MXNet's ``mx.kv.KVStore``); make one with ``create(name)``."""

    def __init__(self, kind: str = LOCAL):
        if kind not in KINDS:
            raise DnnbindValueError(f"KVStore: unknown type {kind!r}; use one of {', '.join(KINDS)}")
        self._type = kind
        self._store: dict = {}  # key -> the stored NDArray (on the device of the value init gave)
        self._str_keys: bool | None = None  # int or str keys, fixed by the first call (MXNet refuses a mix)
        self._updater = None

    # -- who and where ------------------------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._type

    @property
    def rank(self) -> int:
        return distributed.rank() if self._crosses_world() else 0

    @property
    def num_workers(self) -> int:
        return world_size() if self._type != LOCAL else 1

    def _crosses_world(self) -> bool:
        return self._type != LOCAL and world_size() > 1

    def is_capable(self, capability: str) -> bool:
        if str(capability).lower() == KVStoreBase.OPTIMIZER:
            return True
        raise DnnbindValueError(f"Unknown capability: {capability}")

    def __repr__(self) -> str:
        return (f"KVStore(type={self._type!r}, rank={self.rank}, num_workers={self.num_workers}, "
                f"keys={len(self._store)})")

    # -- keys and values ----------------------------------------------------------------------------------------
    def _pairs(self, api: str, key, value, what: str = "value") -> list:
        """[(key, [arrays])] in call order: one key with one array or a list of them (one per device), or a list of
        keys with one such value each (MXNet's _ctype_key_value)."""
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                got = f"{len(value)} {what}s" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"
                raise DnnbindValueError(f"KVStore.{api}: {len(key)} keys need a list of {len(key)} {what}s (an "
                                        f"NDArray or a list of NDArrays each), got {got}")
            if len({isinstance(k, str) for k in key}) > 1:
                raise DnnbindTypeError(f"KVStore.{api}: inconsistent types of keys detected: {list(key)!r} mixes int "
                                       "and str keys")
            pairs = []
            for k, v in zip(key, value):
                pairs += self._pairs(api, k, v, what)
            return pairs
        key = self._key(api, key)
        if isinstance(value, NDArray):
            return [(key, [value])]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, NDArray) for v in value):
            return [(key, list(value))]
        kinds = [type(v).__name__ for v in value] if isinstance(value, (list, tuple)) else type(value).__name__
        raise DnnbindTypeError(f"KVStore.{api}: the {what} of key {key!r} must be an NDArray or a non-empty list of "
                               f"NDArrays (one per device), got {kinds}")

    def _key(self, api: str, key):
        if isinstance(key, (int, np.integer)):
            key, is_str = int(key), False
        elif isinstance(key, str):
            is_str = True
        else:
            raise DnnbindTypeError(f"KVStore.{api}: unexpected type for keys: {type(key)} (use int or str keys)")
        if self._str_keys is None:
            self._str_keys = is_str
        elif self._str_keys != is_str:
            have, got = ("str", "int") if self._str_keys else ("int", "str")
            raise DnnbindTypeError(f"KVStore.{api}: Mixed key types are not allowed: this store uses {have} keys, "
                                   f"got the {got} key {key!r}")
        return key

    def _stored(self, api: str, key) -> NDArray:
        stored = self._store.get(key)
        if stored is None:
            missing = f"key {key} doesn't exist. Did you init?" if isinstance(key, str) else \
                f"key {key} has not been inited"
            raise DnnbindValueError(f"KVStore.{api}: {missing} (call kv.init({key!r}, value) first)")
        return stored

    def _world(self, api: str, device):
        return world_communicator(device, f"KVStore.{api} (type {self._type!r})") if self._crosses_world() else None

    # -- the API ------------------------------------------------------------------------------------------------
    def init(self, key, value) -> None:
        """Store a copy of ``value`` under ``key`` (once per key). Across processes every rank gets rank 0's."""
        for k, arrays in self._pairs("init", key, value):
            for a in arrays:  # a key given several values: the second is a duplicate init, as in MXNet
                if k in self._store:
                    raise DnnbindValueError(f"KVStore.init: duplicate init of key {k}. Please double check if you "
                                            "called kv.init or kv.broadcast with this key multiple times")
                stored = a.detach().copy()  # (never taped by autograd)
                comm = self._world("init", stored.device)
                if comm is not None:
                    comm.broadcast(stored, root=0, out=stored)
                self._store[k] = stored

    def push(self, key, value, priority: int = 0) -> None:
        """Sum the values of each key (over the list, then over the processes) and apply them to the stored value:
        the updater's update if one is set, else the sum replaces it."""
        grouped: OrderedDict = OrderedDict()
        for k, arrays in self._pairs("push", key, value):
            stored = self._stored("push", k)
            for a in arrays:
                if a.shape != stored.shape:
                    raise DnnbindValueError(
                        f"KVStore.push: key {k!r}: the value has shape {a.shape}, the stored one {stored.shape}: "
                        f"operands shape mismatch from.shape = {_mx_shape(a.shape)} to.shape={_mx_shape(stored.shape)}")
            grouped.setdefault(k, []).extend(arrays)
        for k, arrays in grouped.items():
            stored = self._store[k]
            merged = self._merge(arrays, stored)
            comm = self._world("push", merged.device)
            if comm is not None:
                comm.all_reduce(merged, out=merged)
            if self._updater is not None:
                self._updater(k, merged, stored)
            else:
                stored.copy_(merged)

    @staticmethod
    def _merge(arrays: list, stored: NDArray) -> NDArray:
        """The sum of ``arrays`` in list order, as a new array on the stored value's device."""
        dev = stored.device
        merged = _moved(arrays[0], dev)
        merged = merged.detach().copy() if merged is arrays[0] else merged
        for a in arrays[1:]:
            a = _moved(a, dev)
            merged += a if a.dtype == merged.dtype else a.astype(merged.dtype)
        return merged

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Copy the stored value of each key into its ``out`` array(s)."""
        if out is None:
            raise DnnbindTypeError("KVStore.pull: out is required (the NDArray, or list of NDArrays, to pull into)")
        pairs = self._pairs("pull", key, out, "out")
        for k, outs in pairs:
            stored = self._stored("pull", k)
            for o in outs:
                if o.shape != stored.shape:
                    raise DnnbindValueError(
                        f"KVStore.pull: key {k!r}: out has shape {o.shape}, the stored value {stored.shape}: operands "
                        f"shape mismatch from.shape = {_mx_shape(stored.shape)} to.shape={_mx_shape(o.shape)}")
        for k, outs in pairs:
            for o in outs:
                o.copy_(_moved(self._store[k], o.device))

    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """push, then pull into ``out`` (into ``value`` when out is None)."""
        if out is not None:
            self._pairs("pushpull", key, out, "out")  # refuse a bad ``out`` before anything is pushed
        self.push(key, value, priority)
        self.pull(key, value if out is None else out, priority)

    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """init(key, value), then pull into ``out``: every device (and process) gets the value of rank 0."""
        self._pairs("broadcast", key, out, "out")
        self.init(key, value)
        self.pull(key, out, priority)

    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None):
        raise UnsupportedFeature("KVStore.row_sparse_pull is not supported by dnnbind: it has no sparse arrays")

    def set_gradient_compression(self, compression_params):
        raise UnsupportedFeature("KVStore.set_gradient_compression is not supported by dnnbind: values are summed "
                                 "uncompressed")

    # -- updates on the store -----------------------------------------------------------------------------------
    def set_optimizer(self, optimizer) -> None:
        """Update on the store: each push runs ``optimizer`` on the summed value (the gradient) and the stored
        weight, so pull gives the updated weight. Across processes every rank runs the same update on the same
        all-reduced gradient (MXNet runs it once on its server)."""
        if not isinstance(optimizer, opt.Optimizer):
            raise DnnbindTypeError(f"KVStore.set_optimizer: expects an Optimizer (mx.optimizer.create('sgd', ...)), "
                                   f"got {type(optimizer).__name__}")
        self._set_updater(Updater(optimizer))

    def _set_updater(self, updater) -> None:
        """``updater(key, merged, stored)`` runs at each push, and must update ``stored`` in place."""
        if not callable(updater):
            raise DnnbindTypeError(f"KVStore._set_updater: the updater must be callable (key, input, stored), got "
                                   f"{type(updater).__name__}")
        self._updater = updater

    set_updater = _set_updater

    def save_optimizer_states(self, fname, dump_optimizer: bool = False) -> None:
        """Write the optimizer's state (and with dump_optimizer the optimizer itself) to ``fname``."""
        blob = self._updater_for("save_optimizer_states").get_states(dump_optimizer)
        with open(fname, "wb") as f:
            f.write(blob)

    def load_optimizer_states(self, fname) -> None:
        updater = self._updater_for("load_optimizer_states")
        with open(fname, "rb") as f:
            updater.set_states(f.read())

    def _updater_for(self, api: str) -> Updater:
        if not isinstance(self._updater, Updater):
            what = "no optimizer" if self._updater is None else "a custom updater, not an optimizer,"
            raise DnnbindValueError(f"KVStore.{api}: Cannot save or load states: this store has {what} set "
                                    "(call kv.set_optimizer(optimizer) first)")
        return self._updater

    # -- synchronization ----------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        """Wait until every process of the world got here (a no-op in one process)."""
        if not self._crosses_world():
            return
        dev = gpu(distributed.local_rank())
        token = array(np.zeros(1, np.float32), device=dev)
        world_communicator(dev, "KVStore._barrier").all_reduce(token, out=token)
        current_stream(dev).synchronize()

    barrier = _barrier


def __getattr__(name: str):
    if name in ("KVStoreServer", "kvstore_server"):
        raise UnsupportedFeature(f"mxnet.kvstore.{name} is not supported by dnnbind: there are no parameter servers "
                                 "('dist_sync' sums with an NCCL all-reduce between the launched processes)")
    raise AttributeError(f"module 'dnnbind.kvstore' has no attribute {name!r}")
