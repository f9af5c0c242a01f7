"""Parameters on several contexts (MXNet 1.x's ``initialize(ctx=[gpu(0), gpu(1)])``): the context lists, and which
copy a layer gets. Layer: gluon; imports runtime.

A Parameter on several contexts holds one copy per context. A layer asks for ``param.data()`` without naming a
context, so the copy it gets is the one of the *current device*: MXNet's ``current_context()``, which MXNet's
HybridBlock sets from its input (``with x.context:``) before reading its Parameters. Here a thread-local set by
``using_device(device)`` plays that part: a Block call sets it from its first input's device when none is set (so
the outermost call decides for the Blocks inside it, and an explicit ``using_device`` wins); a Parameter on one
context never reads it, so single-device models pay nothing.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import threading

import numpy as np

from ..runtime.device import Device, as_device

__all__ = ["copy_device", "using_device"]

_tls = threading.local()

# True once any Parameter has lived on several contexts: a Block call then sets the current device from its input
# when none is set (one list read per call while no model is data-parallel).
multi_ctx = [False]


def copy_device() -> Device | None:
    """The device whose copy a Parameter on several contexts gives (``using_device`` on this thread), or None.
    Not CUDA's current device: every GPU call makes its stream's device current itself (runtime.device)."""
    return getattr(_tls, "device", None)


class using_device:  # lower case: used like a function, ``with using_device(gpu(1)): net(x)``
    """``with using_device(dev):`` Parameters on several contexts give their copy on ``dev`` (None: the first)."""

    __slots__ = ("_device", "_old")

    def __init__(self, device) -> None:
        self._device = None if device is None else as_device(device)

    def __enter__(self) -> Device | None:
        self._old = getattr(_tls, "device", None)
        _tls.device = self._device
        return self._device

    def __exit__(self, *exc) -> None:
        _tls.device = self._old


def ctx_list(ctx, what: str) -> list:
    """``ctx`` (None, a device, or a non-empty list of distinct devices) as a list of Devices."""
    if not isinstance(ctx, (list, tuple)):
        return [as_device(ctx)]
    if not ctx:
        raise DnnbindValueError(f"{what}: ctx is an empty list; give a device or a list of devices")
    devices = [as_device(c) for c in ctx]
    seen: set = set()
    for c, d in zip(ctx, devices):
        if d in seen:
            raise DnnbindValueError(f"{what}: ctx={list(ctx)!r} names {d!r} twice (as {c!r}); give each device once. "
                             "dnnbind has one host device: cpu(i) is cpu(0) for every i")
        seen.add(d)
    return devices


def host_mean(copies: list) -> np.ndarray:
    """MXNet's ``Parameter._reduce``: the mean of the copies on the host (what save_parameters writes).

    Float copies are averaged in float64 and rounded once, so identical copies (every trained Parameter) give
    exactly their value; copies that differ (BatchNorm's running statistics, one per device) give their mean.
    """
    first = copies[0].numpy()
    if len(copies) == 1 or first.dtype.kind != "f":
        return first
    total = first.astype(np.float64)
    for c in copies[1:]:
        total += c.numpy()
    return (total / len(copies)).astype(first.dtype)
