"""Layer 1 (runtime): devices. Imports dnnbind._lib only.

A ``Device`` is a value ("cpu" or "gpu", index). Making one touches no GPU; ``activate()`` makes its CUDA
context current (cudaSetDevice) the first time a GPU thing is done on it, once per thread per switch.
"""

from __future__ import annotations

import threading

from .._lib import cudart


class Device:
    __slots__ = ("kind", "index", "__weakref__")
    _cache: dict = {}

    def __new__(cls, kind: str = "gpu", index: int = 0):
        key = (kind, int(index))
        dev = cls._cache.get(key)
        if dev is None:
            if kind not in ("cpu", "gpu"):
                raise ValueError(f"device kind must be 'cpu' or 'gpu', got {kind!r}")
            dev = object.__new__(cls)
            object.__setattr__(dev, "kind", kind)
            object.__setattr__(dev, "index", 0 if kind == "cpu" else int(index))
            cls._cache[key] = dev
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

    def __repr__(self) -> str:
        return "cpu(0)" if self.kind == "cpu" else f"gpu({self.index})"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"

    def activate(self) -> None:
        if self.kind == "gpu" and getattr(_tls, "current", None) != self.index:
            _ensure_gpu(self.index)
            cudart.call("cudaSetDevice", self.index)
            _tls.current = self.index

    def __enter__(self):
        _tls.stack = getattr(_tls, "stack", [])
        _tls.stack.append(default_device())
        _tls.default = self
        return self

    def __exit__(self, *exc):
        _tls.default = _tls.stack.pop()


_tls = threading.local()
_count: tuple[int, str] | None = None


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


def default_device() -> Device:
    """The device ``with dnnbind.gpu(1):`` selected, else gpu(0) when there is a GPU, else cpu()."""
    dev = getattr(_tls, "default", None)
    if dev is None:
        dev = gpu(0) if num_gpus() > 0 else cpu()
        _tls.default = dev
    return dev


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
    raise ValueError(f"not a device: {obj!r} (expected 'cpu', 'gpu', 'gpu:N' or a dnnbind Device)")
