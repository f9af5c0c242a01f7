"""The NDArray's public fast fields: ``shape``, ``dtype``, ``device``, ``ptr``, ``on_gpu`` are plain slots.

The library reads them directly on its hot path (no property call). ``on_gpu`` is True exactly when the array
lives on a GPU; ``ptr`` is the first element's device pointer, 0 on the cpu. A source scan keeps the old spellings
(``x._shape``..., ``x._data is None`` as the GPU test) from creeping back for NDArrays; other classes that have
attributes of those names (gluon Parameter, a few layers and context managers) are listed by file and receiver.
GPU checks are marked ``gpu`` (skipped without one).
"""

from __future__ import annotations

import inspect
import pickle
import re
import types
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind._lib.errors import DnnbindTypeError
from dnnbind.kernels import pack_args
from dnnbind.runtime.array import NDArray
from dnnbind.runtime.device import Device

FIELDS = ("shape", "dtype", "device", "ptr", "on_gpu")
DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8)
ROOT = Path(dnnbind.__file__).resolve().parent


def _rand(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) + 0.5).astype(dtype)
    return rng.integers(1, 100, size=shape).astype(dtype)


def _check_fields(a: NDArray, want: np.ndarray, device_kind: str) -> None:
    """``a``'s fast fields against the numpy array it must equal, on a device of ``device_kind``."""
    assert a.shape == want.shape and type(a.shape) is tuple
    assert a.dtype == want.dtype and isinstance(a.dtype, np.dtype)
    assert a.device.kind == device_kind and a.context is a.device and a.ctx is a.device
    assert type(a.on_gpu) is bool and a.on_gpu == (device_kind == "gpu")
    assert type(a.ptr) is int
    assert (a.ptr != 0) == (device_kind == "gpu" and a.size > 0), (a.ptr, device_kind)
    assert (a.ndim, a.size, a.nbytes) == (want.ndim, want.size, want.nbytes)
    np.testing.assert_array_equal(a.numpy(), want)


# -- the class ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FIELDS)
def test_the_fields_are_slots_not_properties(name):
    assert name in NDArray.__slots__
    # the slot's descriptor is the class attribute: nothing (a property, a method installed by nd) replaced it
    assert isinstance(NDArray.__dict__[name], types.MemberDescriptorType)
    assert not any(isinstance(k.__dict__.get(name), property) for k in NDArray.__mro__)


def test_the_old_private_fields_are_gone():
    for old in ("_shape", "_dtype", "_device", "_ptr"):
        assert old not in NDArray.__slots__ and not hasattr(NDArray, old)
    a = nd.array([1.0, 2.0])
    for old in ("_shape", "_dtype", "_device", "_ptr"):
        assert not hasattr(a, old)


def test_context_and_ctx_are_the_device():
    a = nd.array(np.ones((2, 3)), ctx=dnnbind.cpu())
    assert a.context is a.device and a.ctx is a.device and a.device == dnnbind.cpu()
    assert isinstance(inspect.getattr_static(NDArray, "context"), property)


def test_the_autograd_stand_in_has_the_same_fields():
    x = nd.array(np.arange(6.0).reshape(2, 3))
    r = autograd.Released(x)
    assert (r.shape, r.dtype, r.needs) == ((2, 3), np.float32, False)
    assert "shape" in autograd.Released.__slots__


# -- cpu arrays -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_cpu_arrays_and_their_views(seed):
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(d) for d in rng.integers(1, 6, size=ndim))
    dtype = DTYPES[seed % len(DTYPES)]
    host = _rand(rng, shape, dtype)
    a = nd.array(host, dtype=dtype)
    _check_fields(a, host, "cpu")
    assert a.ptr == 0 and not a.on_gpu
    _check_fields(a.reshape(-1), host.reshape(-1), "cpu")
    _check_fields(a.reshape((shape[0], -1)), host.reshape(shape[0], -1), "cpu")
    _check_fields(a[0], host[0], "cpu")
    _check_fields(a[shape[0] - 1:], host[shape[0] - 1:], "cpu")
    _check_fields(a.detach(), host, "cpu")
    _check_fields(a.copy(), host, "cpu")
    _check_fields(a.astype(np.float64), host.astype(np.float64), "cpu")
    _check_fields(pickle.loads(pickle.dumps(a)), host, "cpu")


def test_cpu_results_of_ops():
    rng = np.random.default_rng(7)
    x, w = _rand(rng, (3, 4), np.float32), _rand(rng, (5, 4), np.float32)
    a, b = nd.array(x), nd.array(w)
    _check_fields(a + 1, x + 1, "cpu")
    _check_fields(nd.relu(a), np.maximum(x, 0), "cpu")
    _check_fields(nd.transpose(a), x.T, "cpu")
    y = nd.FullyConnected(a, b, no_bias=True, num_hidden=5)
    assert y.shape == (3, 5) and not y.on_gpu and y.ptr == 0
    np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=1e-5, atol=1e-5)
    s = a.sum(axis=1)
    assert s.shape == (3,) and s.dtype == np.float32 and not s.on_gpu and s.ptr == 0
    for made, want in ((nd.zeros((2, 3)), np.zeros((2, 3), np.float32)),
                       (nd.ones((4,), dtype="int32"), np.ones(4, np.int32)),
                       (nd.full((2, 2), 3.5), np.full((2, 2), 3.5, np.float32)),
                       (dnnbind.from_dlpack(x), x)):
        _check_fields(made, want, "cpu")


def test_cpu_results_while_recording():
    x = nd.array(np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32))
    x.attach_grad()
    with autograd.record():
        y = (x * 2).reshape((3, 2))
        z = y.detach()
    y.backward()
    for a in (y, z, x.grad):
        assert not a.on_gpu and a.ptr == 0 and a.device.kind == "cpu"
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2, np.float32))


def test_a_cpu_array_is_refused_as_a_kernel_argument():
    # a cpu array's ptr is 0: the kernel-argument packer must refuse it rather than pass a NULL pointer
    a = nd.array([1.0, 2.0, 3.0])
    for _ in range(2):  # first sight of the type, then its cached converter
        with pytest.raises(DnnbindTypeError, match="cpu"):
            pack_args([a])


def test_a_gpu_array_passes_its_pointer_to_a_kernel():
    fake = NDArray._from_ptr(0x7F0000001000, (3,), np.float32, Device("gpu", 0), None)  # no memory is touched
    assert fake.on_gpu and fake.ptr == 0x7F0000001000
    holders, params = pack_args([fake])
    assert holders[0].value == 0x7F0000001000


# -- the source: the old spellings stay gone ------------------------------------------------------------------

# Other classes with attributes of these names (file -> attribute -> receivers): not NDArrays.
OTHER_CLASSES = {
    "custom_op.py": {"_device": {"self"}},
    "gluon/_grad_buckets.py": {"_device": {"self"}},
    "gluon/_param_ctx.py": {"_device": {"self"}},
    "gluon/nn/basic_layers.py": {"_dtype": {"self"}, "_data": {"self.weight"}},
    "gluon/nn/conv_layers.py": {"_data": {"self.weight"}},
    "gluon/nn/fused_layers.py": {"_data": {"p"}},
    "gluon/nn/norm_layers.py": {"_data": {"p", "self.gamma", "self.beta"}},
    "gluon/contrib/cnn/conv_layers.py": {"_data": {"p"}},
    "gluon/contrib/nn/basic_layers.py": {"_data": {"p"}},
    "gluon/parameter.py": {"_shape": {"self", "src"}, "_data": {"self"}},
    "gluon/rnn/rnn_layer.py": {"_dtype": {"self"}, "_data": {"w"}},
    "gluon/rnn/rnn_cell.py": {"_data": {"w"}},
    "gluon/trainer.py": {"_data": {"p"}},
    "horovod/mxnet.py": {"_data": {"p"}},
    "hybrid.py": {"_data": {"p"}},
}
_OLD = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(_shape|_dtype|_device|_ptr)\b"
                  r"|(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\._data\s+is\s+(?:not\s+)?None\b"
                  r"|[\])]\.(_shape|_dtype|_device|_ptr)\b|[\])]\._data\s+is\s+(?:not\s+)?None\b")


def _old_spellings(path: Path, rel: str) -> list:
    allowed = OTHER_CLASSES.get(rel, {})
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r"\s*(from|import)\s", line):
            continue  # module paths (``from ..nd._shape import``)
        for m in _OLD.finditer(line):
            recv, attr = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), "_data")
            if recv is None or recv not in allowed.get(attr, ()):
                found.append(f"dnnbind/{rel}:{n}: {line.strip()}")
    return found


def test_no_old_spelling_of_the_gpu_test_or_the_fields_in_the_source():
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 100, "the scan must see the package's sources"
    found = [hit for p in files for hit in _old_spellings(p, p.relative_to(ROOT).as_posix())]
    assert not found, ("an NDArray's fields are x.shape/x.dtype/x.device/x.ptr, and its GPU test is x.on_gpu "
                       "(not x._data is None); another class's attribute of that name goes in OTHER_CLASSES:\n"
                       + "\n".join(found))


def test_the_scan_finds_the_old_spellings(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("if x._data is None:\n    pass\ny = a._shape\nz = f(b)._ptr\nok = x.on_gpu\n"
                   "w = self.weight._data is not None\n")
    found = _old_spellings(bad, "bad.py")
    assert [f.split(":")[1] for f in found] == ["1", "3", "4", "6"]
    # the same text in a file where self.weight is a gluon Parameter: line 6 is allowed there
    assert [f.split(":")[1] for f in _old_spellings(bad, "gluon/nn/conv_layers.py")] == ["1", "3", "4"]


# -- gpu arrays -----------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_arrays_and_their_views(gpu):
    rng = np.random.default_rng(11)
    host = _rand(rng, (4, 3, 5), np.float32)
    a = nd.array(host, ctx=gpu)
    _check_fields(a, host, "gpu")
    assert a.on_gpu and a.ptr != 0 and a.__cuda_array_interface__["data"][0] == a.ptr
    row = 3 * 5 * 4
    _check_fields(a.reshape((4, 15)), host.reshape(4, 15), "gpu")
    assert a.reshape((4, 15)).ptr == a.ptr
    _check_fields(a[1], host[1], "gpu")
    assert a[1].ptr == a.ptr + row
    _check_fields(a[2:4], host[2:4], "gpu")
    assert a[2:4].ptr == a.ptr + 2 * row
    _check_fields(a.detach(), host, "gpu")
    assert a.detach().ptr == a.ptr
    _check_fields(a.copy(), host, "gpu")
    _check_fields(a.astype(np.float64), host.astype(np.float64), "gpu")
    back = a.to("cpu")
    _check_fields(back, host, "cpu")
    assert back.ptr == 0 and not back.on_gpu


@pytest.mark.gpu
def test_gpu_results_of_ops(gpu):
    rng = np.random.default_rng(12)
    x = _rand(rng, (3, 4), np.float32)
    a = nd.array(x, ctx=gpu)
    for y, want in ((a + 1, x + 1), (nd.relu(a), np.maximum(x, 0)), (nd.zeros((2, 3), ctx=gpu), np.zeros((2, 3))),
                    (nd.transpose(a), x.T)):
        assert y.on_gpu and y.ptr != 0 and y.device == gpu and y.shape == want.shape
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    s = a.sum(axis=1)
    assert s.on_gpu and s.ptr != 0 and s.shape == (3,)
    np.testing.assert_allclose(s.numpy(), x.sum(axis=1), rtol=1e-5)
    a.attach_grad()
    with autograd.record():
        y = (a * 2).reshape((4, 3))
    y.backward()
    assert a.grad.on_gpu and a.grad.ptr != 0 and a.grad.ptr != a.ptr
    np.testing.assert_array_equal(a.grad.numpy(), np.full((3, 4), 2, np.float32))
