"""Layer 1 (runtime): devices. Imports dnnbind._lib only.

A ``Device`` is a value ("cpu" or "gpu", index). Making one touches no GPU; ``activate()`` makes its CUDA
context current (cudaSetDevice) the first time a GPU thing is done on it, once per thread per switch.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import threading

from .._lib import cudart


class Device:
    """A device value, interned: ``Device("gpu", 0) is Device("gpu", 0)``, so ``==`` and ``hash`` are identity.

    Also MXNet's ``mx.Context`` (``dnnbind.mxnet`` aliases it): ``Device(device_type, device_id=0)``, keyword
    spellings ``device_type=``/``device_id=``, ``Device(other_device)``, and ``"cpu_pinned"``/``"cpu_shared"``
    meaning the cpu. There is one cpu: ``Device("cpu", i)`` is ``cpu(0)`` for every ``i``.
    """

    __slots__ = ("kind", "index", "__weakref__")
    _cache: dict = {}
    _lock = threading.Lock()

    def __new__(cls, kind="gpu", index: int = 0, device_type=None, device_id=None):
        if device_type is not None:
            kind = device_type
        if device_id is not None:
            index = device_id
        dev = cls._cache.get((kind, index))  # the hot path: one lock-free dict lookup
        if dev is None:
            dev = cls._intern(kind, index)
        return dev

    @classmethod
    def _intern(cls, kind, index) -> Device:
        if isinstance(kind, Device):  # MXNet's copy spelling Context(ctx); not cached (keyed by identity)
            return kind
        if not isinstance(kind, str) or kind not in _KINDS:
            raise DnnbindValueError(f"device kind must be 'cpu' or 'gpu' (or MXNet's 'cpu_pinned', 'cpu_shared'), "
                             f"got {kind!r}")
        canon = (_KINDS[kind], 0 if _KINDS[kind] == "cpu" else int(index))
        if canon[1] < 0:
            raise DnnbindValueError(f"device index must be >= 0, got {index!r}")
        # NOTE: creation is locked so two threads asking for a new device at once get the same object
        # (identity is equality); lookups above stay lock-free because a dict read is atomic under the GIL.
        with cls._lock:
            dev = cls._cache.get(canon)
            if dev is None:
                dev = object.__new__(cls)
                object.__setattr__(dev, "kind", canon[0])
                object.__setattr__(dev, "index", canon[1])
                cls._cache[canon] = dev
            cls._cache[(kind, index)] = dev  # the caller's spelling ("cpu", 3), ("gpu", np.int64(0)) too
        return dev

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    def __reduce__(self):
        return (Device, (self.kind, self.index))

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    # MXNet spelling: ctx.device_type, ctx.device_id
    device_type = property(lambda self: self.kind)
    device_id = property(lambda self: self.index)
    device_typeid = property(lambda self: 1 if self.kind == "cpu" else 2)  # MXNet's enum: cpu 1, gpu 2

    def __repr__(self) -> str:
        return "cpu(0)" if self.kind == "cpu" else f"gpu({self.index})"

    __str__ = __repr__  # MXNet prints a context as gpu(0) / cpu(0) (d2l's "training on gpu(0)")

    def activate(self) -> None:
        """Make this GPU's context current on this thread unless it already is (a no-op for the cpu).

        Every call that queues work on a stream (allocation, copy, memset, kernel launch, cuDNN, cuBLAS, NCCL,
        graph launch) calls this with the stream's device first, so none relies on which device happens to be
        current: the *actual* current context is compared, so a device switched by other code (torch, CuPy, a raw
        cudaSetDevice) is noticed too."""
        if self.kind != "gpu":
            return
        primary = _primary.get(self.index)
        if primary is not None and cudart.current_context() == primary:
            return
        _ensure_gpu(self.index)
        cudart.call("cudaSetDevice", self.index)
        _primary[self.index] = cudart.current_context()  # the device's primary context: one per process

    def __enter__(self):
        _tls.stack = getattr(_tls, "stack", [])
        _tls.stack.append(getattr(_tls, "default", None))
        _tls.default = self
        return self

    def __exit__(self, *exc):
        _tls.default = _tls.stack.pop()  # None where the thread had chosen none: the process default again


_KINDS = {"cpu": "cpu", "gpu": "gpu", "cpu_pinned": "cpu", "cpu_shared": "cpu"}
_tls = threading.local()
_primary: dict[int, int] = {}  # GPU index -> its primary CUcontext, learnt at the first activate()
_count: tuple[int, str] | None = None
_count_lock = threading.Lock()


def cpu(index: int = 0) -> Device:
    return Device("cpu", 0)


def gpu(index: int = 0) -> Device:
    return Device("gpu", index)


def num_gpus() -> int:
    """Number of usable GPUs; 0 with no GPU or no driver. Never raises."""
    return gpu_status()[0]


def gpu_status() -> tuple[int, str]:
    """(count, reason there is none). Cached: the answer cannot change within a process."""
    global _count
    if _count is None:
        with _count_lock:  # one cudaGetDeviceCount even when threads ask at once
            if _count is None:
                _count = cudart.device_count()
    return _count


def gpu_properties(index: int) -> tuple[str, int, int, int]:
    """(name, compute capability major, minor, total memory bytes) of GPU ``index`` (cudaGetDeviceProperties)."""
    prop = cudart.call("cudaGetDeviceProperties", index)
    name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
    return name.strip("\x00"), int(prop.major), int(prop.minor), int(prop.totalGlobalMem)


def _ensure_gpu(index: int) -> None:
    count, why = gpu_status()
    if index >= count:
        from .._lib.errors import DnnbindError
        if count == 0:
            raise DnnbindError(f"gpu({index}) requested but no GPU is usable: {why}. Use device='cpu'.")
        raise DnnbindError(f"gpu({index}) requested but only {count} GPU(s) are present")


_process_default: Device | None = None  # set_process_default_device(); the MXNet alias makes it cpu(0)
_auto_default: Device | None = None  # gpu(0) when there is a GPU, else cpu(): computed once


def default_device() -> Device:
    """The device ``with dnnbind.gpu(1):`` (or set_default_device) selected on this thread, else the
    process default (``set_process_default_device``; cpu(0) under the MXNet alias, as in MXNet), else gpu(0)
    when there is a GPU, else cpu()."""
    global _auto_default
    dev = getattr(_tls, "default", None)
    if dev is not None:
        return dev
    if _process_default is not None:
        return _process_default
    if _auto_default is None:
        _auto_default = gpu(0) if num_gpus() > 0 else cpu()
    return _auto_default


def set_process_default_device(device) -> Device | None:
    """Make ``device`` the default of every thread that has not chosen one (None: back to gpu(0)-if-present);
    returns the previous process default. ``install_mxnet_alias()`` sets cpu(0): MXNet's default context."""
    global _process_default
    old, _process_default = _process_default, (None if device is None else as_device(device))
    return old


def set_default_device(device) -> None:
    """Make ``device`` this thread's default (what ``with device:`` does for a block); MXNet's
    ``test_utils.set_default_context``."""
    _tls.default = as_device(device)


def as_device(obj) -> Device:
    """Device from a Device, None (the default device), 'cpu', 'gpu', 'gpu:1', 'cuda:0', or a torch device."""
    if obj is None:
        return default_device()
    if isinstance(obj, Device):
        return obj
    text = str(obj).strip().lower()
    kind, _, idx = text.partition(":")
    if kind in ("gpu", "cuda"):
        return gpu(int(idx or 0))
    if kind == "cpu":
        return cpu()
    if text.startswith(("gpu(", "cpu(")) and text.endswith(")"):
        return as_device(f"{text[:3]}:{text[4:-1] or 0}")
    raise DnnbindValueError(f"not a device: {obj!r} (expected 'cpu', 'gpu', 'gpu:N' or a dnnbind Device)")
