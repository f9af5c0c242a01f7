"""MXNet 1.x's NDArray file format (dnnbind.serialization) and the Gluon files built on it.

Three sources of truth: files written by the real MXNet 1.9.1 (tests/fixtures/mxnet_params, made by
make_fixtures.py there), byte strings built here by hand from ndarray.cc's layout, and round trips of random
arrays. Truncation is tried at every byte offset of a small file.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import gluon, serialization
from dnnbind.gluon import nn
from dnnbind.serialization import NDArrayFileError
from tests._helpers import assert_close

CPU = mx.cpu()
FIXTURES = Path(__file__).parent / "fixtures" / "mxnet_params"
DTYPES = ["float32", "float64", "float16", "uint8", "int32", "int8", "int64", "bool"]
FLAGS = {"float32": 0, "float64": 1, "float16": 2, "uint8": 3, "int32": 4, "int8": 5, "int64": 6, "bool": 7}
V1, V2, V3 = 0xF993FAC8, 0xF993FAC9, 0xF993FACA


def _values(shape, dtype, seed):
    """The values make_fixtures.py gave each fixture array (exact in every dtype)."""
    k = (np.arange(int(np.prod(shape))) * 7919 + seed * 131) % 97
    if dtype == "bool":
        v = k % 2 == 1
    elif dtype == "uint8":
        v = k
    elif dtype.startswith("int"):
        v = k - 48
    else:
        v = (k - 48) / 8.0
    return np.asarray(v).astype(dtype).reshape(shape)


def _random(shape, dtype, rng):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("uint8", "int8", "int32", "int64"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def _exact(actual, expected, name):
    a = actual.numpy() if hasattr(actual, "numpy") else actual
    assert a.shape == expected.shape and a.dtype == expected.dtype, f"{name}: {a.shape} {a.dtype} vs " \
        f"{expected.shape} {expected.dtype}"
    assert np.array_equal(a, expected), f"{name}: values differ"


# -- hand-built bytes, following src/ndarray/ndarray.cc ---------------------------------------------------------
def _arr(shape, data: np.ndarray, magic=V2, stype=0, ctx=(1, 0), flag=None):
    flag = FLAGS[data.dtype.name] if flag is None else flag
    head = struct.pack("<Ii", magic, stype) + struct.pack(f"<i{len(shape)}q", len(shape), *shape)
    return head + struct.pack("<iii", *ctx, flag) + data.astype(data.dtype.newbyteorder("<")).tobytes()


def _file(arrays, names=()):
    out = struct.pack("<QQQ", 0x112, 0, len(arrays)) + b"".join(arrays) + struct.pack("<Q", len(names))
    for n in names:
        out += struct.pack("<Q", len(n.encode())) + n.encode()
    return out


def test_writer_matches_the_spec_byte_for_byte():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    b = np.array([7, -9], np.int64)
    assert serialization.save_bytes([mx.array(a), b]) == _file([_arr((2, 3), a), _arr((2,), b)])
    assert serialization.save_bytes({"w": a, "bias": b}) == _file([_arr((2, 3), a), _arr((2,), b)], ["w", "bias"])
    # Printed by mxnet 1.9.1: mx.nd.save(f, {'ab': mx.nd.array([1.5], dtype='float16')})
    mxnet_hex = ("120100000000000000000000000000000100000000000000c9fa93f9000000000100000001000000000000000100"
                 "00000000000002000000003e010000000000000002000000000000006162")
    assert serialization.save_bytes({"ab": mx.array(np.array([1.5], np.float16))}) == bytes.fromhex(mxnet_hex)
    # Little-endian whatever the input's byte order.
    assert serialization.save_bytes([np.array([1.0], ">f4")]) == serialization.save_bytes([np.array([1.0], "<f4")])
    assert serialization.save_bytes([np.array([1.0], np.float32)]).endswith(b"\x00\x00\x80\x3f" + bytes(8))


# -- round trips ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype_and_rank(dtype, tmp_path):
    rng = np.random.default_rng(sum(map(ord, dtype)))
    arrays = [_random(tuple(rng.integers(1, 5, size=ndim)), dtype, rng) for ndim in range(1, 6)]
    path = tmp_path / f"{dtype}.params"
    serialization.save(path, [mx.array(a, device=CPU) for a in arrays])
    assert os.listdir(tmp_path) == [path.name]  # atomic write: no temp file left, no suffix added
    assert path.stat().st_mode & 0o777 == 0o666 & ~serialization._umask()  # as open() would make it, not 0600
    loaded = serialization.load(str(path))
    assert isinstance(loaded, list) and len(loaded) == 5
    for i, (got, want) in enumerate(zip(loaded, arrays)):
        assert got.device == CPU
        _exact(got, want, f"{dtype} rank {i + 1}")
    named = {f"p{i}.w": a for i, a in enumerate(arrays)}
    back = serialization.load_bytes(serialization.save_bytes(named))
    assert list(back) == list(named)
    for key in named:
        _exact(back[key], named[key], key)


def test_containers_and_special_shapes():
    x = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
    one = serialization.load_bytes(serialization.save_bytes(mx.array(x)))  # a single array saves as a list
    assert isinstance(one, list) and len(one) == 1
    _exact(one[0], x, "single")
    assert len(serialization.load_bytes(serialization.save_bytes((x, x)))) == 2
    assert serialization.load_bytes(serialization.save_bytes([])) == []
    assert serialization.load_bytes(serialization.save_bytes({})) == []  # MXNet: no names means a list
    # Size-0 stays V2 (MXNet loads it); a 0-d array makes the whole file V3 (NumPy shape semantics).
    empty = np.zeros((0, 3), np.float32)
    assert struct.unpack_from("<I", serialization.save_bytes([empty]), 24)[0] == V2
    scalar = np.array(2.5, np.float32)
    buf = serialization.save_bytes([scalar, x])
    assert struct.unpack_from("<I", buf, 24)[0] == V3
    back = serialization.load_bytes(buf)
    _exact(back[0], scalar, "0-d")
    _exact(back[1], x, "next to a 0-d")
    _exact(serialization.load_bytes(serialization.save_bytes([empty]))[0], empty, "size 0")


def test_save_rejects_what_mxnet_files_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="dict keys must be str"):
        serialization.save_bytes({1: np.zeros(2)})
    with pytest.raises(TypeError, match="array 'w' is a list"):
        serialization.save_bytes({"w": [1.0]})
    for dtype in ("complex64", "int16", "uint64"):  # MXNet 1.9 cannot load int16..uint64 (type flags 8..11)
        with pytest.raises(TypeError, match=f"{dtype}, which MXNet 1.x cannot load"):
            serialization.save_bytes([np.zeros(2, dtype)])
    with pytest.raises(ValueError, match="data must be"):
        serialization.save_bytes("weights")
    with pytest.raises(TypeError):
        serialization.load_bytes("not bytes")
    # A failed save leaves the previous file intact and no temp file behind.
    path = tmp_path / "keep.params"
    serialization.save(path, [np.ones(3, np.float32)])
    with pytest.raises(TypeError):
        serialization.save(path, [np.ones(3, np.float32), object()])
    assert os.listdir(tmp_path) == ["keep.params"]
    _exact(serialization.load(path)[0], np.ones(3, np.float32), "old file kept")


def test_atomic_replace_failure_leaves_old_file(tmp_path, monkeypatch):
    path = tmp_path / "p.params"
    serialization.save(path, {"a": np.arange(3, dtype=np.int32)})

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        serialization.save(path, {"a": np.zeros(5, np.int32)})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["p.params"]
    _exact(serialization.load(path)["a"], np.arange(3, dtype=np.int32), "old file")


# -- files written by the real MXNet 1.9.1 ------------------------------------------------------------------------
def test_mxnet_list_of_every_dtype():
    shapes = [(2, 3), (3,), (2, 1, 2), (4,), (2, 3), (3,), (2,), (5,)]
    expected = [_values(s, d, i) for i, (s, d) in enumerate(zip(shapes, DTYPES))]
    loaded = serialization.load(FIXTURES / "list_dtypes.bin")
    assert isinstance(loaded, list) and len(loaded) == len(expected)
    for got, want in zip(loaded, expected):
        _exact(got, want, want.dtype.name)
    # ... and our writer produces the very same bytes.
    assert serialization.save_bytes(expected) == (FIXTURES / "list_dtypes.bin").read_bytes()


def test_mxnet_dict_of_ranks_1_to_5():
    ranks = {"r1": (3,), "r2": (2, 3), "r3": (2, 1, 3), "r4": (1, 2, 2, 2), "r5": (2, 1, 1, 2, 2)}
    expected = {k: _values(s, "float32", i) for i, (k, s) in enumerate(ranks.items())}
    loaded = serialization.load(FIXTURES / "dict_ranks.bin")
    assert list(loaded) == list(expected)
    for k in expected:
        _exact(loaded[k], expected[k], k)
    assert serialization.save_bytes(expected) == (FIXTURES / "dict_ranks.bin").read_bytes()


def test_mxnet_scalar_and_sparse():
    _exact(serialization.load(FIXTURES / "scalar_np_shape.bin")[0], np.array(2.5, np.float32), "V3 0-d")
    with pytest.raises(NotImplementedError, match=r"csr\.bin: array 0 has csr storage"):
        serialization.load(FIXTURES / "csr.bin")


def _mxnet_net():
    net = nn.Sequential(prefix="net_")  # MXNet's fixture: HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(nn.Dense(4, in_units=3, activation="relu"), nn.Dense(2, in_units=4))
    return net


MXNET_FORWARD = [[-20.5546875, 79.19921875], [-7.3359375, 77.15234375]]  # printed by make_fixtures.py


def test_mxnet_save_parameters_and_export_load_into_gluon():
    x = mx.array(_values((2, 3), "float32", 99), device=CPU)
    shapes = [(4, 3), (4,), (2, 4), (2,)]
    expected = [_values(s, "float32", 10 + i) for i, s in enumerate(shapes)]
    raw = serialization.load(FIXTURES / "gluon_net.bin")
    assert list(raw) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    for got, want in zip(raw.values(), expected):
        _exact(got, want, "param")
    net = _mxnet_net()
    net.load_parameters(str(FIXTURES / "gluon_net.bin"), ctx=CPU)
    assert_close(net(x), np.array(MXNET_FORWARD, np.float32), 1e-6, 1e-6, "forward after MXNet's file")
    # export writes 'arg:net_dense0_weight': loads by Block and by ParameterDict.
    assert list(serialization.load(FIXTURES / "gluon_export.bin"))[0] == "arg:net_dense0_weight"
    for how in ("block", "dict"):
        net = _mxnet_net()
        if how == "block":
            net.load_parameters(str(FIXTURES / "gluon_export.bin"), ctx=CPU)
        else:
            net.collect_params().load(str(FIXTURES / "gluon_export.bin"), ctx=CPU)
        assert_close(net(x), np.array(MXNET_FORWARD, np.float32), 1e-6, 1e-6, f"forward after export ({how})")


# -- older formats and MXNet's corner cases, built by hand --------------------------------------------------------
def test_legacy_formats():
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    tail = struct.pack("<iii", 1, 0, 0) + x.tobytes()
    v1 = struct.pack("<Ii2q", V1, 2, 2, 3) + tail  # V1: no storage type
    pre_v1 = struct.pack("<I2I", 2, 2, 3) + tail  # oldest: no magic, uint32 ndim and dims
    v2_gpu = _arr((2, 3), x, ctx=(2, 3))  # saved from gpu(3): loads onto the cpu
    for name, blob in [("V1", v1), ("pre-V1", pre_v1), ("gpu ctx", v2_gpu)]:
        got = serialization.load_bytes(_file([blob, blob]))
        assert got[0].device == CPU
        _exact(got[0], x, name)
        _exact(got[1], x, name + " second")
    i16 = np.array([-3, 7], np.int16)  # type flag 8: newer MXNet writes it; we read it
    _exact(serialization.load_bytes(_file([_arr((2,), i16, flag=8)]))[0], i16, "int16")
    s = np.array([4.5], np.float32)
    # MXNet 1.x under V2 writes a 0-d array as ndim 0 plus its data (and cannot read it back itself).
    got = serialization.load_bytes(_file([struct.pack("<Iii", V2, 0, 0) + struct.pack("<iii", 1, 0, 0)
                                          + s.tobytes(), _arr((1,), s)]))
    _exact(got[0], np.array(4.5, np.float32), "V2 0-d")
    _exact(got[1], s, "after V2 0-d")
    # A "none" array: V2 ndim 0 with nothing after it, and V3 with an unknown ndim or dim.
    none_v2 = struct.pack("<Iii", V2, 0, 0)
    none_v3 = struct.pack("<Iii", V3, 0, -1)
    none_v3_dim = struct.pack("<Iiiq", V3, 0, 1, -1)
    assert serialization.load_bytes(_file([none_v2, _arr((1,), s)]))[0] is None
    assert serialization.load_bytes(_file([none_v3, none_v3_dim, _arr((1,), s, magic=V3)]))[:2] == [None, None]
    assert serialization.load_bytes(_file([_arr((1,), s), none_v2]))[1] is None


# -- corrupt and truncated files ----------------------------------------------------------------------------------
def test_truncated_at_every_offset(tmp_path):
    rng = np.random.default_rng(3)
    good = serialization.save_bytes({"w": rng.standard_normal((2, 3)).astype(np.float16),
                                     "b": rng.integers(-5, 5, 3).astype(np.int64)})
    assert len(good) < 400
    for cut in range(len(good)):
        with pytest.raises(NDArrayFileError, match=r"^x\.params: .*at byte \d+"):
            serialization.load_bytes(good[:cut], source="x.params")
    path = tmp_path / "cut.params"
    path.write_bytes(good[:24 + 40 + 8])  # array 0: 28 bytes of shape, 12 of ctx + type, 12 of data
    with pytest.raises(NDArrayFileError) as err:
        serialization.load(path)
    msg = str(err.value)
    assert msg == (f"{path}: truncated at byte 64 while reading array 0's data of shape (2, 3) float16 "
                   "(need 12 bytes, 8 left)")
    assert isinstance(err.value, ValueError) and isinstance(err.value, mx.DnnbindError)
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == msg and again.offset == err.value.offset


def test_corrupt_headers_are_named():
    x = np.ones(2, np.float32)
    cases = [
        (b"PK\x03\x04" + bytes(40), r"not an MXNet NDArray file \(magic 0x[0-9A-F]+; expected 0x112\)"),
        (b"\x12\x01", "too short"),
        (_file([b"\xde\xad\xbe\xef" + bytes(30)]), r"array 0 starts with 0xEFBEADDE"),
        (_file([_arr((2,), x, flag=12)]), "type flag 12 .*bfloat16"),
        (_file([_arr((2,), x, flag=99)]), "type flag 99"),
        (_file([_arr((2,), x, stype=7)]), "storage type 7"),
        (_file([struct.pack("<Iii", V2, 0, 1000)]), "ndim 1000"),
        (_file([struct.pack("<Iiiq", V2, 0, 1, -3)]), r"shape \(-3,\)"),
        (_file([_arr((2,), x)], ["a", "b"]), "1 arrays but 2 names"),
        (_file([_arr((2,), x)], ["a"])[:-1] + b"\xff", "name 0 is not UTF-8"),
        # A huge count or shape must fail on the missing bytes, not try to allocate them.
        (struct.pack("<QQQ", 0x112, 0, 2**62), "truncated at byte 24 while reading array 0's magic"),
        (_file([struct.pack("<Iii2q", V2, 0, 2, 2**40, 2**20) + struct.pack("<iii", 1, 0, 0)]),
         r"need 4611686018427387904 bytes"),
    ]
    for blob, pattern in cases:
        with pytest.raises(NDArrayFileError, match=pattern):
            serialization.load_bytes(blob, source="bad.params")
    rsp = _file([struct.pack("<Iii", V2, 1, 0)])
    with pytest.raises(NotImplementedError, match="bad.params: array 0 has row_sparse storage"):
        serialization.load_bytes(rsp, source="bad.params")


# -- Gluon files ----------------------------------------------------------------------------------------------
class Net(gluon.Block):
    def __init__(self, hidden=5, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.Sequential()
            with self.body.name_scope():
                self.body.add(nn.Dense(hidden, activation="relu"), nn.Dense(hidden))
            self.head = nn.Dense(3)

    def forward(self, x):
        return self.head(self.body(x))


def _x(seed=0):
    return mx.array(np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32), device=CPU)


def test_save_parameters_writes_mxnet_format_with_structural_names(tmp_path):
    net = Net()
    net.initialize(ctx=CPU)
    y = net(_x()).numpy()
    path = tmp_path / "net.params"
    net.save_parameters(str(path))
    assert path.read_bytes()[:8] == struct.pack("<Q", 0x112)
    raw = serialization.load(path)
    assert list(raw) == ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "head.weight", "head.bias"]
    _exact(raw["head.weight"], net.head.weight.data().numpy(), "head.weight")
    other = Net()
    other.load_parameters(str(path), ctx=CPU)
    assert_close(other(_x()), y, 0, 0, "reloaded")
    # dnnbind's earlier npz checkpoints still load (told apart by the zip header).
    old = tmp_path / "old.params"
    with open(old, "wb") as f:
        np.savez(f, **{k: v.numpy() for k, v in raw.items()})
    third = Net()
    third.load_parameters(str(old), ctx=CPU)
    assert_close(third(_x()), y, 0, 0, "npz checkpoint")


def test_parameter_dict_save_load_prefixed_names(tmp_path):
    net = Net(prefix="model_")
    net.initialize(ctx=CPU)
    y = net(_x()).numpy()
    full, stripped = tmp_path / "full.params", tmp_path / "stripped.params"
    net.collect_params().save(str(full))
    net.collect_params().save(str(stripped), strip_prefix="model_")
    assert list(serialization.load(full))[0] == "model_sequential0_dense0_weight"
    assert list(serialization.load(stripped))[0] == "sequential0_dense0_weight"
    with pytest.raises(ValueError, match="strip_prefix 'other_'"):
        net.collect_params().save(str(tmp_path / "x"), strip_prefix="other_")
    for path, prefix in [(full, ""), (stripped, "model_")]:
        other = Net(prefix="model_")
        other.collect_params().load(str(path), ctx=CPU, restore_prefix=prefix)
        assert_close(other(_x()), y, 0, 0, f"ParameterDict.load {path.name}")
        other = Net(prefix="model_")  # Block.load_parameters takes prefixed names too (MXNet's legacy path)
        other.load_parameters(str(path), ctx=CPU)
        assert_close(other(_x()), y, 0, 0, f"load_parameters {path.name}")
    # Module / export files: 'arg:' and 'aux:' are stripped.
    mod = tmp_path / "mod.params"
    serialization.save(mod, {("aux:" if "bias" in p.name else "arg:") + p.name: p.data()
                             for p in net.collect_params().values()})
    other = Net(prefix="model_")
    other.collect_params().load(str(mod), ctx=CPU)
    assert_close(other(_x()), y, 0, 0, "arg:/aux: names")


def test_load_parameters_errors(tmp_path):
    net = Net()
    net.initialize(ctx=CPU)
    net(_x())
    path = tmp_path / "net.params"
    net.save_parameters(str(path))
    wider = Net(hidden=7)
    wider.initialize(ctx=CPU)
    wider(_x())
    with pytest.raises(ValueError) as err:
        wider.load_parameters(str(path))
    text = str(err.value)
    assert f"load_parameters({str(path)!r}) into Net" in text
    assert "shape mismatch for body.0.weight: the model expects (7, 6), the file has (5, 6)" in text
    assert "shape mismatch for head.weight: the model expects (3, 7), the file has (3, 5)" in text
    listed = tmp_path / "list.params"
    serialization.save(listed, [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="list of 1 arrays without names"):
        Net().load_parameters(str(listed))
    half = tmp_path / "half.params"
    half.write_bytes(path.read_bytes()[:100])
    with pytest.raises(NDArrayFileError, match=r"half\.params: truncated at byte"):
        Net().load_parameters(str(half))


@pytest.mark.gpu
def test_gpu_arrays_save_and_load_onto_cpu(gpu, tmp_path):
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    path = tmp_path / "g.params"
    serialization.save(path, {"x": mx.array(x, device=gpu)})
    assert struct.unpack_from("<ii", path.read_bytes(), 24 + 12 + 16) == (2, gpu.index)  # MXNet keeps the ctx
    back = serialization.load(path)["x"]
    assert back.device == CPU
    _exact(back, x, "from gpu")
    net = Net()
    net.initialize(ctx=gpu)
    y = net(_x().to(gpu)).numpy()
    net.save_parameters(str(path))
    other = Net()
    other.load_parameters(str(path), ctx=gpu)
    assert_close(other(_x().to(gpu)), y, 0, 0, "gpu reload")
