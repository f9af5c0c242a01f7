"""Layer 1 (runtime): a DLPack producer and consumer in pure ctypes. Imports only the standard library and numpy.

``to_capsule`` wraps a buffer in a ``"dltensor"`` capsule (the unversioned DLPack 0.8 ABI that every consumer
reads), or a ``"dltensor_versioned"`` one (DLPack 1.0) for a consumer that asked for it with ``max_version``;
``from_capsule`` takes ownership of either kind and returns an ``ImportedTensor`` that calls the producer's
deleter exactly once, when it is released or collected.

The ownership protocol: a capsule named ``"dltensor"`` owns its tensor. A consumer that takes the tensor renames
the capsule ``"used_dltensor"`` and from then on must call ``deleter`` once. So the capsule's destructor frees
the tensor only while the name is still ``"dltensor"``: never consumed means no leak, consumed means no double
free. The same holds for ``"dltensor_versioned"`` / ``"used_dltensor_versioned"``.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import weakref
from ctypes import POINTER, Structure, c_char_p, c_int, c_int64, c_void_p, py_object

import numpy as np

kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBool = 0, 1, 2, 6
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


class DLDevice(Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


def _py(name: str, restype, *argtypes):
    # Private prototypes over ctypes.pythonapi (GIL held, Python error checked after the call) rather than setting
    # argtypes on the shared ctypes.pythonapi attributes, which any other library may set differently.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _py("PyCapsule_New", py_object, c_void_p, c_char_p, c_void_p)
_capsule_get_name = _py("PyCapsule_GetName", c_char_p, py_object)
_capsule_set_name = _py("PyCapsule_SetName", c_int, py_object, c_char_p)
_capsule_get_pointer = _py("PyCapsule_GetPointer", c_void_p, py_object, c_char_p)
# NOTE: a capsule destructor runs while the capsule is being deallocated (refcount 0). Passing it on as a
# py_object would incref and decref it, which deallocates it a second time, so these take the raw address.
_capsule_is_valid_raw = _py("PyCapsule_IsValid", c_int, c_void_p, c_char_p)
_capsule_get_pointer_raw = _py("PyCapsule_GetPointer", c_void_p, c_void_p, c_char_p)
_err_occurred = _py("PyErr_Occurred", c_void_p)

# NOTE: PyCapsule_New and PyCapsule_SetName keep the name pointer, not a copy, so the bytes must outlive every
# capsule, including ones that die at interpreter exit after this module is gone: make them immortal.
_DLTENSOR, _USED, _VERSIONED, _USED_VERSIONED = _NAMES = (
    b"dltensor", b"used_dltensor", b"dltensor_versioned", b"used_dltensor_versioned")
for _name in _NAMES:
    ctypes.pythonapi.Py_IncRef(py_object(_name))


def _callback(body):
    """A C callback (void f(void *)) that keeps working when called with a Python exception in flight.

    NOTE: C code may drop a capsule (or call a deleter) with an exception already set, e.g. numpy's from_dlpack
    rejecting a tensor. Every Python call made with an exception set fails, so the first thing is a call that
    surfaces the pending exception as itself: PyErr_Occurred through a pythonapi prototype. The body then runs;
    the exception cannot be handed back to the C caller, so it is re-raised and ctypes reports it through
    sys.unraisablehook (the caller sees a SystemError) instead of it being lost along with the tensor.
    """

    def run(address):
        try:
            _err_occurred()
        except BaseException:
            body(address)
            raise
        body(address)

    return ctypes.CFUNCTYPE(None, c_void_p)(run)


# Exports alive in C: struct address -> (struct, shape/strides array, owner). Holding them here keeps the memory
# the consumer reads valid and the owner alive until the deleter runs.
_live: dict[int, tuple] = {}


def _release_export(address: int) -> None:
    _live.pop(address, None)


def _destroy_capsule(capsule: int) -> None:
    for name in (_DLTENSOR, _VERSIONED):  # not renamed "used_...": nobody took ownership, so we free it
        if _capsule_is_valid_raw(capsule, name):
            _release_export(_capsule_get_pointer_raw(capsule, name))


# Module level so the libffi trampolines live as long as any capsule or consumer might call them.
_DELETER = _callback(_release_export)
_CAPSULE_DESTRUCTOR = _callback(_destroy_capsule)
_DELETER_ADDRESS = ctypes.cast(_DELETER, c_void_p).value
_DESTRUCTOR_ADDRESS = ctypes.cast(_CAPSULE_DESTRUCTOR, c_void_p).value
_CallDeleter = ctypes.CFUNCTYPE(None, c_void_p)

_KINDS = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt, "b": kDLBool}
_NUMPY = {(kDLFloat, 16): np.float16, (kDLFloat, 32): np.float32, (kDLFloat, 64): np.float64,
          (kDLBool, 8): np.bool_, **{(kDLInt, 8 * n): np.dtype(f"i{n}") for n in (1, 2, 4, 8)},
          **{(kDLUInt, 8 * n): np.dtype(f"u{n}") for n in (1, 2, 4, 8)}}


def dlpack_device(kind: str, index: int) -> tuple[int, int]:
    """``("cpu", 0)`` -> ``(kDLCPU, 0)``; ``("gpu", i)`` -> ``(kDLCUDA, i)``."""
    if kind == "cpu":
        return (kDLCPU, 0)
    if kind in ("gpu", "cuda"):
        return (kDLCUDA, int(index))
    raise DnnbindValueError(f"dlpack_device: unknown device kind {kind!r} (expected 'cpu' or 'gpu')")


def _c_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def is_c_contiguous(shape, strides) -> bool:
    """True when ``strides`` (in elements; None means C order) describe a C-contiguous layout."""
    if strides is None or 0 in shape:
        return True
    return all(dim == 1 or int(s) == c for dim, s, c in zip(shape, strides, _c_strides(shape)))


def to_capsule(owner, ptr: int, shape: tuple, dtype, device: tuple[int, int], strides: tuple | None = None,
               *, max_version: tuple[int, int] | None = None, readonly: bool = False):
    """A DLPack PyCapsule over ``ptr``; ``owner`` stays alive until the consumer calls the deleter.

    ``strides`` are in elements; None means C-contiguous (written out, for consumers older than DLPack 0.6).
    ``max_version`` is what the consumer passed to ``__dlpack__``: (1, x) or newer gets a ``"dltensor_versioned"``
    capsule, which carries ``readonly`` (numpy makes arrays from the legacy ABI read-only, as it cannot tell);
    None gets the legacy ``"dltensor"`` capsule.
    """
    dtype = np.dtype(dtype)
    if (_KINDS.get(dtype.kind), 8 * dtype.itemsize) not in _NUMPY or not dtype.isnative:
        raise DnnbindTypeError(f"to_capsule: dtype {dtype} has no DLPack equivalent here (supported: "
                        f"float16/32/64, int8-64, uint8-64, bool)")
    shape = tuple(int(d) for d in shape)
    strides = _c_strides(shape) if strides is None else tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise DnnbindValueError(f"to_capsule: strides {strides} do not match shape {shape}")
    versioned = max_version is not None and max_version[0] >= 1
    if readonly and not versioned:  # as numpy does: the legacy ABI would hand out a writable view
        raise BufferError("to_capsule: a read-only buffer needs a consumer that accepts DLPack 1.0 (max_version)")
    managed = (DLManagedTensorVersioned(DLPackVersion(1, 0), flags=_READ_ONLY if readonly else 0) if versioned
               else DLManagedTensor())
    ndim = len(shape)
    dims = (c_int64 * max(2 * ndim, 1))(*shape, *strides)
    tensor = managed.dl_tensor
    tensor.data = ptr or None
    tensor.device = DLDevice(*(int(d) for d in device))
    tensor.ndim = ndim
    tensor.dtype = DLDataType(_KINDS[dtype.kind], 8 * dtype.itemsize, 1)
    tensor.shape = ctypes.cast(dims, POINTER(c_int64))
    tensor.strides = ctypes.cast(ctypes.addressof(dims) + 8 * ndim, POINTER(c_int64))
    managed.deleter = _DELETER_ADDRESS
    address = ctypes.addressof(managed)
    _live[address] = (managed, dims, owner)
    try:
        return _capsule_new(address, _VERSIONED if versioned else _DLTENSOR, _DESTRUCTOR_ADDRESS)
    except BaseException:
        _release_export(address)
        raise


class ImportedTensor:
    """A tensor taken from a DLPack capsule. Holds the producer's memory until ``release()`` or collection."""

    def __init__(self, ptr, shape, strides, dtype, device, readonly, deleter, managed):
        self.ptr, self.shape, self.strides, self.dtype = ptr, shape, strides, dtype
        self.device, self.readonly = device, readonly
        self._finalizer = weakref.finalize(self, _call_deleter, deleter, managed)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        """Call the producer's deleter now (idempotent). ``ptr`` is invalid afterwards."""
        self._finalizer()

    def __repr__(self) -> str:
        return (f"ImportedTensor(ptr={self.ptr:#x}, shape={self.shape}, strides={self.strides}, "
                f"dtype={self.dtype}, device={self.device}, readonly={self.readonly})")


def _call_deleter(deleter: int | None, managed: int) -> None:
    if deleter:  # DLPack allows a NULL deleter: nothing to free
        _CallDeleter(deleter)(managed)


def from_capsule(capsule) -> ImportedTensor:
    """Take ownership of a ``"dltensor"`` or ``"dltensor_versioned"`` capsule (from ``x.__dlpack__()``)."""
    if type(capsule).__name__ != "PyCapsule":
        raise DnnbindTypeError(f"from_capsule: expected a DLPack PyCapsule (x.__dlpack__()), got {type(capsule).__name__}")
    name = _capsule_get_name(capsule)
    if name in (_USED, _USED_VERSIONED):
        raise DnnbindValueError("from_capsule: this DLPack capsule was already consumed; call __dlpack__() again")
    if name == _VERSIONED:
        managed = DLManagedTensorVersioned.from_address(_capsule_get_pointer(capsule, _VERSIONED))
        if managed.version.major != 1:
            raise DnnbindValueError(f"from_capsule: DLPack version {managed.version.major}.{managed.version.minor} "
                             f"is not supported (major version 1 is)")
        readonly, used = bool(managed.flags & _READ_ONLY), _USED_VERSIONED
    elif name == _DLTENSOR:
        managed = DLManagedTensor.from_address(_capsule_get_pointer(capsule, _DLTENSOR))
        readonly, used = False, _USED
    else:
        raise DnnbindTypeError(f"from_capsule: capsule named {name!r} is not a DLPack tensor")
    tensor = managed.dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if lanes != 1:
        raise DnnbindTypeError(f"from_capsule: vector dtypes are not supported (code {code}, bits {bits}, lanes {lanes})")
    if (code, bits) not in _NUMPY:
        raise DnnbindTypeError(f"from_capsule: unsupported DLPack dtype (code {code}, bits {bits}); supported: "
                        f"float16/32/64, int8-64, uint8-64, bool")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
    ptr = (tensor.data or 0) + tensor.byte_offset
    device = (tensor.device.device_type, tensor.device.device_id)
    # NOTE: rename only after every check passed. A capsule we refuse keeps its name, so its own destructor still
    # frees the tensor; once renamed, the deleter is ours to call (by the ImportedTensor's finalizer).
    _capsule_set_name(capsule, used)
    return ImportedTensor(ptr, shape, strides, np.dtype(_NUMPY[code, bits]), device, readonly, managed.deleter,
                          ctypes.addressof(managed))
