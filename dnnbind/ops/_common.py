"""Layer 2 (ops): helpers the GPU ops share: dtype checks, handles, workspace, outputs, bounded caches. Imports
runtime/_lib.

The workspace is one growable device buffer per stream: ops on a stream run in order, so they can share
it, and growing it frees the old one stream-ordered (safe while earlier work still reads it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._lib.errors import DnnbindError, DnnbindTypeError, DnnbindValueError
from ..runtime.array import NDArray, empty
from ..runtime.handles import cublas_handle, cudnn_handle
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import current_stream
from . import _check


def float_dtype(op: str, allowed: tuple = _check.FLOAT_DTYPES, **arrays) -> np.dtype:
    """The one dtype of ``arrays`` (None skipped), from ``allowed`` (default: every float, float16 included)."""
    return _check.check_dtype(op, allowed, **{k: v for k, v in arrays.items() if v is not None})


def out_like(shape, dtype, device) -> NDArray:
    return empty(shape, dtype, device)


def out_or_new(op: str, arg: str, out, shape: tuple, dtype, device) -> NDArray:
    """The array a result is written into: ``out`` when given (an NDArray of exactly that shape, dtype and device,
    e.g. a Parameter's grad buffer: no allocation and no copy after), else a new one."""
    if out is None:
        return empty(shape, dtype, device)
    if not isinstance(out, NDArray):
        raise DnnbindTypeError(f"{op}: {arg} must be a dnnbind NDArray (written in place), got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype or out.device is not device:
        raise DnnbindValueError(f"{op}: {arg} has shape {out.shape}, {out.dtype} on {out.device}; expected "
                                f"{shape}, {np.dtype(dtype)} on {device}")
    return out


def result_array(out, shape, dtype, device, op: str) -> NDArray:
    """``out`` checked as the result's buffer (out_or_new) when given, else a new array (out_like)."""
    if out is None:
        return out_like(shape, dtype, device)
    return out_or_new(op, "out", out, tuple(shape), dtype, device)


def exact_ints(v) -> bool:
    """Whether ``v`` is an int or a tuple of ints, exactly: the only argument spellings a plan cache keys on (1.0
    and True hash like 1 but must still reach the checks, which refuse them)."""
    return type(v) is int or (type(v) is tuple and all(type(e) is int for e in v))


def dnn(x: NDArray) -> int:
    return cudnn_handle(x.device)


def blas(x: NDArray) -> int:
    return cublas_handle(x.device)


_workspaces: dict = {}
_WORKSPACE_ROUND = 2 << 20


def workspace(device, nbytes: int, stream=None) -> tuple[int, int]:
    """(pointer, size) of at least ``nbytes`` of scratch on ``stream`` (default: ``device``'s current stream)."""
    if nbytes == 0:
        return 0, 0
    if stream is None:
        stream = current_stream(device)
    buf = _workspaces.get(stream)
    if buf is None or buf.nbytes < nbytes:
        # Exactly what is asked, rounded up to 2 MiB: the buffer stays for the process, and the requests come from
        # the algorithms chosen for a model's shapes, which grow it a few times in the first step and then never.
        size = -(-nbytes // _WORKSPACE_ROUND) * _WORKSPACE_ROUND
        buf = _workspaces[stream] = DeviceBuffer(size, device, stream)
    return buf.ptr, buf.nbytes


def stream_workspaces() -> list:
    """Every stream's shared workspace buffer now (a recording that calls with their pointers keeps them alive)."""
    return list(_workspaces.values())


SHARED_WORKSPACE_MAX = 32 << 20  # larger scratch is borrowed from the pool for the one call (see scratch)


class scratch:
    """``with scratch(device, nbytes) as (ptr, size):`` workspace for one library call.

    Up to SHARED_WORKSPACE_MAX it is the stream's shared buffer (``workspace``: no allocation per call). A larger
    request, an FFT convolution's hundreds of MiB, is a buffer of its own, freed (stream-ordered) when the call is
    queued: the pool hands that memory to the activations afterwards, as PyTorch's caching allocator does, instead
    of a shared buffer keeping it for the life of the process."""

    __slots__ = ("device", "nbytes", "buf")

    def __init__(self, device, nbytes: int) -> None:
        self.device, self.nbytes, self.buf = device, nbytes, None

    def __enter__(self) -> tuple[int, int]:
        if self.nbytes <= SHARED_WORKSPACE_MAX:
            return workspace(self.device, self.nbytes)
        self.buf = DeviceBuffer(self.nbytes, self.device, current_stream(self.device))
        return self.buf.ptr, self.buf.nbytes

    def __exit__(self, *exc) -> None:
        self.buf = None


def borrow_workspace(ctx, nbytes: int) -> tuple:
    """``scratch`` for a hot path, without the context manager, on an ExecContext's stream: (pointer, size,
    holder). Keep ``holder`` (None for the shared buffer, else the call's own buffer) until the library call is
    queued; dropping it then frees the buffer stream-ordered."""
    if nbytes <= SHARED_WORKSPACE_MAX:
        return workspace(ctx.device, nbytes, ctx.stream) + (None,)
    buf = DeviceBuffer(nbytes, ctx.device, ctx.stream)
    return buf.ptr, buf.nbytes, buf


def with_context(exc: DnnbindError, **info) -> DnnbindError:
    """Add op-level context (shapes, algorithm) to a library error on its way up (CuPy's add_infos)."""
    text = ", ".join(f"{k}={v}" for k, v in info.items())
    if hasattr(exc, "add_info"):
        return exc.add_info(text)
    return exc


def cache_insert(cache: dict, key: Any, make: Callable[[], Any], lock: threading.Lock, limit: int) -> Any:
    """The value of ``key`` in ``cache``, made by ``make()`` under ``lock`` unless another thread made it first;
    beyond ``limit`` entries the oldest one is dropped (a cap, not an LRU: lookups stay plain ``cache.get(key)``
    without the lock, the hot path). A dropped entry still in use lives on through its users' references."""
    with lock:
        value = cache.get(key)
        if value is None:
            value = cache[key] = make()
            if len(cache) > limit:
                del cache[next(iter(cache))]  # dicts keep insertion order: the first key is the oldest
    return value
