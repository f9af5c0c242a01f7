"""DLPack producer/consumer (dnnbind.runtime.dlpack) against numpy, the reference implementation. CPU only."""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref

import numpy as np
import pytest

from dnnbind.runtime import dlpack

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool"]


class Owner:
    """The object a producer keeps alive; weakref-able so tests can see when it is freed."""

    def __init__(self, array: np.ndarray):
        self.array = array


class Producer:
    """A minimal DLPack producer over an Owner's numpy buffer, built on to_capsule."""

    def __init__(self, owner: Owner, legacy: bool = False):
        self.owner, self.legacy = owner, legacy

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        a = self.owner.array
        return dlpack.to_capsule(self.owner, a.ctypes.data, a.shape, a.dtype, dlpack.dlpack_device("cpu", 0),
                                 max_version=None if self.legacy else max_version,
                                 readonly=not a.flags.writeable)

    def __dlpack_device__(self):
        return (dlpack.kDLCPU, 0)


def capsule_of(owner: Owner):
    a = owner.array
    return dlpack.to_capsule(owner, a.ctypes.data, a.shape, a.dtype, (dlpack.kDLCPU, 0))


def test_dlpack_device():
    assert dlpack.dlpack_device("cpu", 0) == (1, 0)
    assert dlpack.dlpack_device("gpu", 3) == (2, 3)
    with pytest.raises(ValueError, match="unknown device kind"):
        dlpack.dlpack_device("tpu", 0)


def test_is_c_contiguous():
    assert dlpack.is_c_contiguous((2, 3), None)
    assert dlpack.is_c_contiguous((2, 3), (3, 1))
    assert not dlpack.is_c_contiguous((2, 3), (1, 2))
    assert dlpack.is_c_contiguous((2, 1, 3), (3, 99, 1))  # a dim of size 1 may have any stride
    assert dlpack.is_c_contiguous((0, 3), (7, 7))
    assert dlpack.is_c_contiguous((), ())


def test_consume_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    alive = weakref.ref(a)
    t = dlpack.from_capsule(a.__dlpack__())
    assert (t.ptr, t.shape, t.dtype, t.device, t.readonly) == (a.ctypes.data, (3, 4), np.float32, (1, 0), False)
    assert t.strides in (None, (4, 1)) and dlpack.is_c_contiguous(t.shape, t.strides)
    ptr = a.ctypes.data
    del a
    gc.collect()
    assert alive() is not None and alive().ctypes.data == ptr  # numpy's export holds the array until released
    del t
    gc.collect()
    assert alive() is None  # the finalizer called numpy's deleter


def test_consume_numpy_transposed():
    a = np.arange(12, dtype=np.int64).reshape(3, 4).T
    t = dlpack.from_capsule(a.__dlpack__())
    assert (t.ptr, t.shape) == (a.ctypes.data, (4, 3))
    assert t.strides == tuple(s // a.itemsize for s in a.strides) == (1, 4)
    assert not dlpack.is_c_contiguous(t.shape, t.strides)


def test_consume_versioned_readonly():
    a = np.arange(5, dtype=np.uint8)
    a.setflags(write=False)
    capsule = a.__dlpack__(max_version=(1, 0))
    t = dlpack.from_capsule(capsule)
    assert (t.ptr, t.shape, t.dtype, t.readonly) == (a.ctypes.data, (5,), np.uint8, True)
    with pytest.raises(ValueError, match="already consumed"):
        dlpack.from_capsule(capsule)
    t.release()
    t.release()  # idempotent
    assert t.released


def test_numpy_consumes_ours_and_owner_lifetime():
    owner = Owner(np.arange(6, dtype=np.float32).reshape(2, 3))
    alive, ptr = weakref.ref(owner), owner.array.ctypes.data
    producer = Producer(owner)
    del owner
    out = np.from_dlpack(producer)
    assert out.ctypes.data == ptr and out.shape == (2, 3) and out.dtype == np.float32
    out[1, 2] = 42.0
    assert alive().array[1, 2] == 42.0  # shared memory, not a copy
    del producer
    gc.collect()
    assert alive() is not None  # numpy's array still uses the buffer
    del out
    gc.collect()
    assert alive() is None  # numpy called our deleter


def test_numpy_consumes_legacy_and_readonly():
    owner = Owner(np.zeros(3, dtype=np.int16))
    legacy = np.from_dlpack(Producer(owner, legacy=True))
    assert not legacy.flags.writeable  # numpy cannot tell from the legacy ABI, so it plays safe
    owner.array[0] = 7
    assert legacy[0] == 7 and legacy.ctypes.data == owner.array.ctypes.data
    owner.array.setflags(write=False)
    assert not np.from_dlpack(Producer(owner)).flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        np.from_dlpack(Producer(owner, legacy=True))
    t = dlpack.from_capsule(Producer(owner).__dlpack__(max_version=(1, 0)))
    assert t.readonly and t.ptr == owner.array.ctypes.data


def test_unconsumed_capsule_frees_owner():
    owner = Owner(np.zeros(4))
    alive = weakref.ref(owner)
    capsule = capsule_of(owner)
    del owner
    gc.collect()
    assert alive() is not None
    del capsule
    assert alive() is None  # the capsule destructor called the deleter (refcounting alone, no gc needed)


def test_own_round_trip_releases_once():
    owner = Owner(np.arange(3, dtype=np.int32))
    alive = weakref.ref(owner)
    capsule = capsule_of(owner)
    t = dlpack.from_capsule(capsule)
    assert (t.ptr, t.shape, t.strides, t.dtype) == (owner.array.ctypes.data, (3,), (1,), np.int32)
    del owner
    with pytest.raises(ValueError, match="already consumed"):
        dlpack.from_capsule(capsule)
    del capsule  # consumed: dropping the capsule must not free the tensor
    gc.collect()
    assert alive() is not None
    t.release()
    assert alive() is None
    del t
    gc.collect()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_round_trip(dtype):
    a = (np.arange(7) % 2).astype(dtype)
    t = dlpack.from_capsule(a.__dlpack__())
    assert t.dtype == np.dtype(dtype) and t.ptr == a.ctypes.data
    out = np.from_dlpack(Producer(Owner(a)))
    assert out.dtype == np.dtype(dtype) and out.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(out, a)


def test_zero_dim_round_trip():
    out = np.from_dlpack(Producer(Owner(np.array(2.5))))
    assert out.shape == () and out[()] == 2.5


def test_unsupported_dtype_leaves_capsule_unconsumed():
    a = np.ones(3, dtype=np.complex64)
    alive = weakref.ref(a)
    capsule = a.__dlpack__()
    for _ in range(2):  # refused, not consumed: the second try fails the same way
        with pytest.raises(TypeError, match="unsupported DLPack dtype"):
            dlpack.from_capsule(capsule)
    del a, capsule
    gc.collect()
    assert alive() is None  # the unconsumed capsule still freed numpy's export
    with pytest.raises(TypeError, match="no DLPack equivalent"):
        dlpack.to_capsule(None, 0, (3,), np.complex64, (1, 0))


def test_lanes_rejected():
    owner = Owner(np.zeros(4, dtype=np.float32))
    alive = weakref.ref(owner)
    capsule = capsule_of(owner)
    address = dlpack._capsule_get_pointer(capsule, b"dltensor")
    dlpack.DLManagedTensor.from_address(address).dl_tensor.dtype.lanes = 4
    with pytest.raises(TypeError, match="lanes 4"):
        dlpack.from_capsule(capsule)
    del owner, capsule
    assert alive() is None


def test_not_a_capsule():
    with pytest.raises(TypeError, match="expected a DLPack PyCapsule"):
        dlpack.from_capsule(np.zeros(3))
    other = ctypes.pythonapi.PyCapsule_New  # any capsule with another name
    other.restype, other.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with pytest.raises(TypeError, match="not a DLPack tensor"):
        dlpack.from_capsule(other(1, b"something_else", None))


def test_capsule_dropped_during_exception(monkeypatch):
    # The capsule dies while C code unwinds with an exception set; the destructor must still free the owner.
    # NOTE: the in-flight exception cannot survive a Python callback, so the caller gets a SystemError and the
    # original goes to sys.unraisablehook; what matters here is that nothing leaks and nothing is lost silently.
    reported, owners = [], []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def new_capsule():  # its frame is gone before the error, so the traceback does not hold the owner
        owner = Owner(np.zeros(2))
        owners.append(weakref.ref(owner))
        return capsule_of(owner)

    def subscript_a_temporary_capsule():
        return new_capsule()[0]

    with pytest.raises((TypeError, SystemError)):
        subscript_a_temporary_capsule()
    gc.collect()
    assert owners[0]() is None
    assert [type(r.exc_value) for r in reported] == [TypeError]  # the original error is reported, not lost
