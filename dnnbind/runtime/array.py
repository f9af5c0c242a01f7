"""Layer 1 (runtime): the NDArray, one type for both backends. Imports _lib and runtime.

On cpu an NDArray holds a C-contiguous numpy array; on gpu a pointer into a DeviceBuffer (or into memory
another library owns, for zero-copy imports) plus an ``_owner`` reference that keeps that memory alive.
Views (``reshape``, first-axis slices) share the owner. The autograd layer attaches its state through the
``_node``/``_grad``/``_grad_req`` slots and registers ``backward`` here (``register_autograd``), so this
layer never imports autograd. Arithmetic operators are added by ``dnnbind.nd`` in the same way.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math
import os

import numpy as np

from .._lib.errors import DnnbindError
from .._lib.hooks import DEFERRING
from . import dlpack as _dlpack
from .device import Device, as_device
from .memory import D2D, D2H, H2D, DeviceBuffer, memcpy, memset
from .staging import upload
from .stream import current_stream, wait_for

_autograd = {}  # filled by dnnbind.autograd: {"backward": fn}


def register_autograd(**hooks) -> None:
    _autograd.update(hooks)


class NDArray:
    """An n-dimensional array on the cpu (a numpy array) or a GPU (device memory).

    Its public fast fields are plain slots, read without a property call (read them; only the runtime layer
    assigns them):

    - ``shape``: tuple of ints; ``dtype``: numpy dtype; ``device``: the Device it lives on (``context``/``ctx``
      are MXNet's spellings of it);
    - ``ptr``: the device pointer of the first element, 0 on the cpu;
    - ``on_gpu``: True exactly when the array lives on a GPU (its elements are at ``ptr``; on the cpu they are
      the numpy array ``data_numpy``).
    """
    __slots__ = ("shape", "dtype", "device", "ptr", "on_gpu", "_data", "_owner", "_node", "_grad", "_grad_req",
                 "__weakref__")
    __array_priority__ = 1000  # numpy scalars defer to our operators

    # -- construction (internal) ---------------------------------------------------------------------------
    @classmethod
    def _from_numpy(cls, data: np.ndarray) -> "NDArray":
        a = object.__new__(cls)
        a.shape, a.dtype, a.device, a.ptr, a.on_gpu, a._data = data.shape, data.dtype, _CPU, 0, False, data
        a._owner, a._node, a._grad, a._grad_req = None, None, None, "null"
        return a

    @classmethod
    def _from_ptr(cls, ptr: int, shape: tuple, dtype, device: Device, owner) -> "NDArray":
        a = object.__new__(cls)
        a.shape, a.dtype, a.device, a.ptr, a.on_gpu, a._data = tuple(shape), np.dtype(dtype), device, ptr, True, None
        a._owner, a._node, a._grad, a._grad_req = owner, None, None, "null"
        return a

    # -- properties (shape, dtype, device, ptr, on_gpu are slots) ------------------------------------------
    context = ctx = property(lambda self: self.device)  # MXNet spelling
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    nbytes = property(lambda self: math.prod(self.shape) * self.dtype.itemsize)

    @property
    def data_numpy(self) -> np.ndarray:
        """The backing numpy array of a cpu NDArray (no copy)."""
        if self.on_gpu:
            raise DnnbindError("data_numpy: this NDArray lives on the gpu; use .numpy() to copy it to the host")
        return self._data

    # -- host/device movement ------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A numpy copy (waits for the GPU work that produces this array)."""
        if not self.on_gpu:
            return self._data.copy()
        out = np.empty(self.shape, self.dtype)
        stream = current_stream(self.device)
        memcpy(out.ctypes.data, self.ptr, self.nbytes, D2H, stream)
        stream.synchronize()
        return out

    asnumpy = numpy

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def item(self):
        if self.size != 1:
            raise DnnbindValueError(f"item: only size-1 arrays convert to a scalar, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    asscalar = item

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def to(self, device=None, dtype=None) -> "NDArray":
        """This array on ``device`` (itself if already there and no dtype change); a taped copy while recording."""
        out = self._to(device, dtype)
        if out is not self and (self._node is not None or self._grad_req != "null"):
            return _autograd["copied"](self, out)
        return out

    def _to(self, device, dtype) -> "NDArray":
        device = as_device(device)
        if device is self.device and (dtype is None or np.dtype(dtype) == self.dtype):
            return self
        if device.kind == "cpu" or not self.on_gpu:
            host = self.numpy() if self.on_gpu else self._data
            return array(host, device=device, dtype=dtype)
        if dtype is not None and np.dtype(dtype) != self.dtype:
            return array(self.numpy(), device=device, dtype=dtype)
        out = empty(self.shape, self.dtype, device)  # gpu -> another gpu
        src_stream, dst_stream = current_stream(self.device), current_stream(device)
        # The copy is queued on the destination's stream, which knows nothing of the source's: it first waits for
        # the work that writes this array, and the source's stream then waits for the copy, so a later write or a
        # stream-ordered free of this array there cannot overtake the copy's read.
        wait_for(dst_stream, src_stream)
        device.activate()  # queued on the destination's stream: its device must be current
        from .._lib import cudart
        cudart.call("cudaMemcpyPeerAsync", out.ptr, device.index, self.ptr, self.device.index, self.nbytes,
                    dst_stream.handle)
        wait_for(src_stream, dst_stream)
        return out

    def as_in_context(self, ctx) -> "NDArray":
        return self.to(ctx)

    def copyto(self, other) -> "NDArray":
        if isinstance(other, NDArray):
            # While recording, MXNet refuses to overwrite an array of the graph and tapes a copy of one into another.
            tape = _autograd["check_write"](other, self, _whole)
            other.copy_(self)
            return _autograd["copied"](self, other) if tape else other
        return self.to(other).copy() if as_device(other) is self.device else self.to(other)

    def astype(self, dtype, copy: bool = True) -> "NDArray":
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        if not self.on_gpu:
            return NDArray._from_numpy(self._data.astype(dtype))
        return array(self.numpy().astype(dtype), device=self.device)

    def copy(self) -> "NDArray":
        if not self.on_gpu:
            out = NDArray._from_numpy(self._data.copy())
        else:
            out = empty(self.shape, self.dtype, self.device)
            memcpy(out.ptr, self.ptr, self.nbytes, D2D, current_stream(self.device))
        if self._node is not None or self._grad_req != "null":  # taped while recording (MXNet's copy is an op)
            return _autograd["copied"](self, out)
        return out

    def copy_(self, src) -> "NDArray":
        """Write ``src`` (numpy, scalar or NDArray of this shape) into this array in place."""
        if isinstance(src, NDArray):
            if src.shape != self.shape:
                raise DnnbindValueError(f"copy_: shape {src.shape} does not match {self.shape}")
            if src.device is not self.device:
                src = src.to(self.device)
            if src.dtype != self.dtype:
                if self.on_gpu and _cast_into:  # one kernel that converts as it copies (nd's, registered)
                    _cast_into[0](src, self)
                    return self
                src = src.astype(self.dtype)
            if not self.on_gpu:
                np.copyto(self._data, src._data)
            else:
                memcpy(self.ptr, src.ptr, self.nbytes, D2D, current_stream(self.device))
            return self
        host = np.ascontiguousarray(np.broadcast_to(np.asarray(src, dtype=self.dtype), self.shape))
        if not self.on_gpu:
            np.copyto(self._data, host)
        else:
            stream = current_stream(self.device)
            # through a pinned buffer where it pays (runtime.staging): the host then does not wait for the stream
            if not upload(self.ptr, host, stream):
                memcpy(self.ptr, host.ctypes.data, self.nbytes, H2D, stream)
                # NOTE: pageable H2D copies are staged, but `host` may be a temporary: wait before it is freed.
                stream.synchronize()
        return self

    def zero_(self) -> "NDArray":
        if not self.on_gpu:
            self._data[...] = 0
        else:
            memset(self.ptr, 0, self.nbytes, current_stream(self.device))
        return self

    # -- views ---------------------------------------------------------------------------------------------
    def reshape(self, *shape) -> "NDArray":
        """A view with a new shape. MXNet codes: 0 keeps that input dim, -1 infers one dim."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        new = _infer_shape(self.shape, shape)
        if DEFERRING:  # an eager Block call's ops are being captured or checked (dnnbind.eager_replay)
            return DEFERRING[-1].view(self, new)
        return view(self, new)

    def flatten(self) -> "NDArray":
        return self.reshape((self.shape[0], -1)) if self.ndim > 1 else self

    def __getitem__(self, key):
        if not self.on_gpu:
            if isinstance(key, (int, np.integer, slice)):
                return NDArray._from_numpy(self._data[key])
            return NDArray._from_numpy(np.ascontiguousarray(self._data[key]))
        if isinstance(key, (int, np.integer)):
            n = self.shape[0]
            i = int(key) + n if key < 0 else int(key)
            if not 0 <= i < n:
                raise IndexError(f"index {key} out of range for axis 0 of size {n}")
            start, stop = i, i + 1
            shape = self.shape[1:]
        elif isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("gpu NDArray slices must have step 1 (a contiguous view)")
            stop = max(stop, start)
            shape = (stop - start,) + self.shape[1:]
        else:
            raise IndexError("gpu NDArray supports an int or a step-1 slice on the first axis; use .numpy() "
                             "for other indexing")
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return NDArray._from_ptr(self.ptr + start * row, shape, self.dtype, self.device, self._owner)

    def __setitem__(self, key, value):
        self[key].copy_(value.numpy() if isinstance(value, NDArray) and value.device is not self.device
                        else value)

    def __len__(self):
        if not self.shape:
            raise DnnbindTypeError("len() of a 0-d NDArray")
        return self.shape[0]

    # -- interchange ---------------------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        if not self.on_gpu:
            raise AttributeError("__cuda_array_interface__: this NDArray lives on the cpu")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": current_stream(self.device).handle or 1}

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if not self.on_gpu:
            kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device), ("copy", copy))
                      if v is not None}
            return self._data.__dlpack__(**kwargs)
        if stream is not None and stream != -1:
            _order_for_consumer(self.device, stream)
        return _dlpack.to_capsule(self, self.ptr, self.shape, self.dtype,
                                  _dlpack.dlpack_device("gpu", self.device.index), max_version=max_version)

    def __dlpack_device__(self):
        return _dlpack.dlpack_device(self.device.kind, self.device.index)

    # -- autograd (implemented in dnnbind.autograd) --------------------------------------------------------
    def attach_grad(self, grad_req: str = "write") -> None:
        _autograd["attach_grad"](self, grad_req)

    @property
    def grad(self):
        return self._grad

    def backward(self, out_grad=None, retain_graph: bool = False) -> None:
        _autograd["backward"](self, out_grad, retain_graph)

    def detach(self) -> "NDArray":
        if not self.on_gpu:
            return NDArray._from_numpy(self._data)
        return NDArray._from_ptr(self.ptr, self.shape, self.dtype, self.device, self._owner)

    # -- printing ------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        body = str(self.numpy())  # as MXNet: numpy's print options apply (d2l sets np.set_printoptions(2))
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        return f"\n{body}\n<NDArray {shape} @{self.device!r}>"


_CPU = Device("cpu", 0)


def view(x: NDArray, new: tuple) -> NDArray:
    """``x`` seen with the shape ``new`` (same size, already inferred): ``NDArray.reshape`` past its one hook."""
    if not x.on_gpu:
        out = NDArray._from_numpy(x._data.reshape(new))
    else:
        out = NDArray._from_ptr(x.ptr, new, x.dtype, x.device, x._owner)
    if x._node is not None or x._grad is not None or _autograd["held"].get(id(x)) is x:
        return _autograd["view"](x, out)  # taped (a view of a graph array is in the graph too)
    return out


def _whole() -> bool:
    return True  # copyto replaces the whole destination (autograd's check_write asks)


def _order_for_consumer(device: Device, consumer_stream: int) -> None:
    """DLPack: make the consumer's stream wait for work queued on ours (an event, not a host sync)."""
    from .stream import Event
    if consumer_stream in (1, 2):
        consumer_stream = 0 if consumer_stream == 1 else 2  # legacy default / per-thread default
    ev = Event(device, timing=False).record()
    from .._lib import cudart
    device.activate()  # the consumer's stream is on the array's device
    cudart.call("cudaStreamWaitEvent", consumer_stream, ev._obj, 0)


_cast_into: list = []  # nd's converting device copy, fn(src, out): copy_ between dtypes in one pass


def register_cast_into(fn) -> None:
    """nd's converting device copy ``fn(src, out)`` (one kernel between dtypes), which copy_ uses when the dtypes
    differ; the runtime cannot import nd (a layer above), so nd registers it."""
    _cast_into[:] = [fn]


def contiguous_strides(shape: tuple) -> tuple:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _infer_shape(old: tuple, new: tuple) -> tuple:
    size = math.prod(old)
    out = [old[i] if d == 0 and i < len(old) else int(d) for i, d in enumerate(new)]
    if out.count(-1) > 1:
        raise DnnbindValueError(f"reshape: at most one -1 allowed, got {new}")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or size % rest:
            raise DnnbindValueError(f"reshape: cannot reshape {old} into {new}")
        out[out.index(-1)] = size // rest
    if math.prod(out) != size or any(d < 0 for d in out):
        raise DnnbindValueError(f"reshape: cannot reshape {old} (size {size}) into {tuple(new)}")
    return tuple(out)


_MEMORY: dict = {}


def memory_bytes(device: Device) -> int:
    """The host's physical memory, or a GPU's total memory: the most one array could ever take there."""
    key = (device.kind, device.index)
    size = _MEMORY.get(key)
    if size is None:
        if device.kind == "cpu":
            try:
                size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                size = 1 << 50
        else:
            from .device import gpu_properties
            size = gpu_properties(device.index)[3]
        _MEMORY[key] = size
    return size


def check_size(op: str, shape: tuple, dtype, device: Device, what: str = "the result", context: str = "") -> None:
    """Refuse, as a ValueError naming the op and the size asked for, an array no device could hold, before
    anything is allocated (numpy's MemoryError or a CUDA out-of-memory error deep inside says neither).
    ``context``: more of the call for the message (the arguments that gave this shape)."""
    if any(d < 0 for d in shape):
        raise DnnbindValueError(f"{op}: {what} would have a negative dimension, shape {tuple(shape)}")
    n = math.prod(shape)
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes > memory_bytes(device):
        raise DnnbindValueError(f"{op}: {what} would have shape {tuple(shape)}: {n} elements, "
                                f"{nbytes / 2 ** 30:.1f} GiB of {np.dtype(dtype).name}, more than the {device.kind}'s "
                                f"{memory_bytes(device) / 2 ** 30:.1f} GiB of memory{context}")


# -- factories -----------------------------------------------------------------------------------------------
def empty(shape, dtype=np.float32, device=None) -> NDArray:
    device = device if type(device) is Device else as_device(device)
    if type(shape) is not tuple:
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    dtype = dtype if type(dtype) is np.dtype else np.dtype(dtype)
    if device.kind == "cpu":
        return NDArray._from_numpy(np.empty(shape, dtype))
    buf = DeviceBuffer(math.prod(shape) * dtype.itemsize, device)
    # _from_ptr inlined: shape and dtype are exact already, and every op output comes through here
    a = object.__new__(NDArray)
    a.shape, a.dtype, a.device, a.ptr, a.on_gpu, a._data = shape, dtype, device, buf.ptr, True, None
    a._owner, a._node, a._grad, a._grad_req = buf, None, None, "null"
    return a


def empty_parts(shapes, dtype, device) -> tuple:
    """Uninitialized arrays of one dtype, one per shape in ``shapes``, carved from ONE device allocation (each part
    starting 256-byte aligned) that lives while any of them does: an op's small per-channel results (BatchNorm's
    saved mean and inverse std) cost one cudaMallocAsync instead of several. On the cpu, separate arrays."""
    device = device if type(device) is Device else as_device(device)
    dtype = dtype if type(dtype) is np.dtype else np.dtype(dtype)
    shapes = [s if type(s) is tuple else tuple(s) for s in shapes]
    if device.kind == "cpu":
        return tuple(NDArray._from_numpy(np.empty(s, dtype)) for s in shapes)
    sizes = [-(-math.prod(s) * dtype.itemsize // 256) * 256 for s in shapes]
    buf = DeviceBuffer(sum(sizes), device)
    parts, offset = [], 0
    for s, size in zip(shapes, sizes):
        parts.append(NDArray._from_ptr(buf.ptr + offset, s, dtype, device, buf))
        offset += size
    return tuple(parts)


def zeros(shape, dtype=np.float32, device=None) -> NDArray:
    return empty(shape, dtype, device).zero_()


def ones(shape, dtype=np.float32, device=None) -> NDArray:
    return full(shape, 1, dtype, device)


def full(shape, value, dtype=np.float32, device=None) -> NDArray:
    out = empty(shape, dtype, device)
    if not out.on_gpu:
        out._data[...] = value
    else:
        out.copy_(np.full(out.shape, value, out.dtype))
    return out


def array(obj, device=None, dtype=None) -> NDArray:
    """An NDArray from numpy, a list/scalar, an NDArray, or a CUDA array of another library.

    CuPy arrays and PyTorch CUDA tensors are wrapped without a copy when they are C-contiguous, on the
    requested device, and of the requested dtype. Lists of Python floats become float32 (MXNet's default).
    """
    if isinstance(obj, NDArray):
        return obj.to(device, dtype) if device is not None or dtype is not None else obj
    if not isinstance(obj, np.ndarray) and (hasattr(obj, "__cuda_array_interface__")
                                            or _is_cuda_dlpack(obj)):
        out = from_cuda(obj)
        if (device is not None and as_device(device) is not out.device) or \
                (dtype is not None and np.dtype(dtype) != out.dtype):
            return out.to(device if device is not None else out.device, dtype)
        return out
    if isinstance(obj, np.ndarray):
        host = obj
    else:
        host = np.asarray(obj)
        if dtype is None and host.dtype == np.float64:
            host = host.astype(np.float32)
    host = np.asarray(host, dtype=dtype, order="C")
    device = as_device(device)
    if device.kind == "cpu":
        return NDArray._from_numpy(host.copy() if host is obj else host)
    out = empty(host.shape, host.dtype, device)
    return out.copy_(host)


def _is_cuda_dlpack(obj) -> bool:
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] == 2  # kDLCUDA
    except Exception:
        return False


def from_cuda(obj) -> NDArray:
    """Wrap a CUDA array of another library (``__cuda_array_interface__`` or DLPack) without copying."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
        strides = cai.get("strides")
        if strides is not None and not _dlpack.is_c_contiguous(shape, [s // dtype.itemsize for s in strides]):
            raise DnnbindValueError(f"array: the {type(obj).__name__} is not C-contiguous (strides {strides}); "
                             "make it contiguous first (.contiguous() in torch, cupy.ascontiguousarray)")
        ptr = int(cai["data"][0])
        from .._lib import cudart
        attrs = cudart.call("cudaPointerGetAttributes", ptr) if ptr else None
        index = int(attrs.device) if attrs is not None else 0
        device = Device("gpu", index)
        stream = cai.get("stream")
        if stream:
            # The producer's work on `stream` must finish before ours reads the data: an event, no host sync.
            device.activate()  # the wait is queued on this device's stream
            ev = cudart.call("cudaEventCreateWithFlags", 2)
            cudart.call("cudaEventRecord", ev, 0 if stream == 1 else stream)
            cudart.call("cudaStreamWaitEvent", current_stream(device).handle, ev, 0)
            cudart.call("cudaEventDestroy", ev)
        return NDArray._from_ptr(ptr, shape, dtype, device, obj)
    return from_dlpack(obj)


def from_dlpack(obj) -> NDArray:
    """``dnnbind.from_dlpack(x)``: zero-copy import of any DLPack producer (torch, CuPy, numpy, JAX)."""
    if isinstance(obj, NDArray):
        return obj
    dev_type, dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if dev_type == 1:  # kDLCPU: numpy is a complete DLPack consumer
        return NDArray._from_numpy(np.ascontiguousarray(np.from_dlpack(obj)))
    if dev_type != 2:
        raise DnnbindValueError(f"from_dlpack: unsupported device type {dev_type} (only CPU and CUDA)")
    device = Device("gpu", dev_id)
    t = _dlpack.from_capsule(obj.__dlpack__(stream=current_stream(device).handle or 1))
    if t.strides is not None and not _dlpack.is_c_contiguous(t.shape, t.strides):
        raise DnnbindValueError(f"from_dlpack: the tensor is not C-contiguous (shape {t.shape}, strides {t.strides})")
    return NDArray._from_ptr(t.ptr, t.shape, t.dtype, device, t)
