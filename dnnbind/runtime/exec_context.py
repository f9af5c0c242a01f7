"""Layer 1 (runtime): where a GPU call runs, resolved once where the call enters. Imports runtime.

An ``ExecContext`` is a device's current stream with everything a library call on it needs: the device (made current
by ``exec_context()``), the stream and its raw handle, the cuDNN handle bound to it, and allocation on it. The
registry's dispatch resolves one per op call (``exec_context(device)``: one context check, one stream lookup) and
hands it down (``Call.exec``, ``Grads.exec``), so the op's allocations, workspace and library calls do not each ask
again which device is current, which stream is in use and which handle belongs to it; before, a convolution's forward
and backward asked 19 times.

The context belongs to its stream (``Stream.exec_context``), so it lives and dies with it. It holds no state that can
go stale: the device stays current for the op's duration (nothing in between runs foreign code), and the handle is
the stream's for the stream's life. cuBLAS's handle is not cached here: its math mode follows
``dnnbind.set_math_mode`` (runtime.handles.cublas_handle re-syncs it), so ``blas()`` asks each time.
"""

from __future__ import annotations

import math

import numpy as np

from .array import NDArray
from .device import Device
from .handles import cublas_handle, cudnn_handle
from .memory import allocate_current
from .stream import Stream, current_stream


class ExecContext:
    """A device's stream with its handles, for calls made while that device is current (see the module docstring)."""

    __slots__ = ("device", "stream", "stream_handle", "_dnn")

    def __init__(self, stream: Stream):
        self.device, self.stream, self.stream_handle, self._dnn = stream.device, stream, stream.handle, None

    def dnn(self) -> int:
        """The cuDNN handle bound to this stream (created on first use)."""
        h = self._dnn
        if h is None:
            h = self._dnn = cudnn_handle(self.device, self.stream)
        return h

    def blas(self) -> int:
        """The cuBLAS handle bound to this stream, its math mode in step with the current one."""
        return cublas_handle(self.device, self.stream)

    def empty(self, shape: tuple, dtype: np.dtype) -> NDArray:
        """An uninitialized array on this stream: ``shape`` an exact tuple of ints and ``dtype`` a numpy dtype (the
        caller's checks made them so), the device already current."""
        buf = allocate_current(math.prod(shape) * dtype.itemsize, self.device, self.stream)
        a = object.__new__(NDArray)
        a.shape, a.dtype, a.device, a.ptr, a.on_gpu, a._data = shape, dtype, self.device, buf.ptr, True, None
        a._owner, a._node, a._grad, a._grad_req = buf, None, None, "null"
        return a

    def __repr__(self) -> str:
        return f"ExecContext({self.device!r}, stream 0x{self.stream_handle:x})"


def exec_context(device: Device) -> ExecContext:
    """Make ``device`` current on this thread and return the context of its current stream (a GPU device)."""
    device.activate()
    stream = current_stream(device)
    ctx = stream.exec_context
    if ctx is None:
        ctx = stream.exec_context = ExecContext(stream)
    return ctx
