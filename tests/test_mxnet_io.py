"""``mx.io`` (dnnbind/io.py) against the real MXNet 1.9.1.

tests/fixtures/mxnet_io/expected.json holds what MXNet 1.9.1 itself gave for the scenarios of scenarios.py there
(make_fixtures.py): NDArrayIter over a grid of inputs (array, dict, list, NDArray, no label) x sample counts x batch
sizes x last_batch_handle for three epochs, shuffling after np.random.seed, the cursor at an epoch's end and after
reset()/hard_reset(), dtypes and names, DataDesc and DataBatch, ResizeIter, PrefetchingIter and MXNet's errors.
The same scenarios run here through dnnbind's alias and must give the same batches (values, shapes, dtypes, pad,
index), the same descriptions and an MXNetError (DnnbindValueError/TypeError, MXNet's text where it has one) where
MXNet raised. ``differences`` holds what MXNet accepts and dnnbind refuses on purpose; it is checked by hand below.
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import json
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as dmx
from dnnbind import DnnbindTypeError, DnnbindValueError, nd
from dnnbind import io as dio
from dnnbind.features import NAMES, UnsupportedFeature

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "mxnet_io"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CPU = dnnbind.cpu()

# The fixture's scenarios (shared with make_fixtures.py), under a name of their own: other fixture folders have a
# scenarios.py too, and one pytest process imports them all.
_spec = importlib.util.spec_from_file_location("mxnet_io_scenarios", FIXTURES / "scenarios.py")
scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scenarios)

# MXNet's errors whose text dnnbind repeats (the others are Python's own: IndexError, AttributeError, KeyError).
_TEXT_KEPT = ("TypeError", "AssertionError", "MXNetError")


def _compare(path: str, expected, got, mismatches: list) -> None:
    """Walk MXNet's result and dnnbind's together; an error MXNet raised must be an MXNetError here too."""
    if isinstance(expected, dict) and "error" in expected:
        if not (isinstance(got, dict) and "error" in got):
            mismatches.append(f"{path}: MXNet raised {expected['error']}, dnnbind gave {str(got)[:300]}")
            return
        if expected["error"] == "StopIteration" or got["error"] == "StopIteration":
            if expected["error"] != got["error"]:
                mismatches.append(f"{path}: MXNet raised {expected['error']}, dnnbind {got['error']}")
        elif got["error"] not in ("DnnbindValueError", "DnnbindTypeError"):
            mismatches.append(f"{path}: dnnbind raised {got['error']}, not an MXNetError (DnnbindValueError/TypeError)")
        elif expected["error"] == "TypeError" and got["error"] != "DnnbindTypeError":
            mismatches.append(f"{path}: MXNet raised a TypeError, dnnbind {got['error']}")
        elif expected["error"] in _TEXT_KEPT and expected["message"] not in got["message"]:
            mismatches.append(f"{path}: MXNet said {expected['message']!r}, dnnbind {got['message']!r}")
        if "partial" in expected:
            _compare(f"{path}.partial", expected["partial"], got.get("partial"), mismatches)
    elif isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            mismatches.append(f"{path}: keys {sorted(expected)} vs {str(got)[:300]}")
            return
        for k in expected:
            _compare(f"{path}.{k}", expected[k], got[k], mismatches)
    elif isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            mismatches.append(f"{path}: {str(expected)[:300]} vs {str(got)[:300]}")
            return
        for i, (e, g) in enumerate(zip(expected, got)):
            _compare(f"{path}[{i}]", e, g, mismatches)
    elif expected != got or type(expected) is not type(got):
        mismatches.append(f"{path}: MXNet {expected!r}, dnnbind {got!r}")


@pytest.mark.parametrize("part", [p for p in scenarios.PARTS if p != "differences"])
def test_the_scenarios_give_what_mxnet_gave(alias, part):
    got = getattr(scenarios, part)(alias, np)
    mismatches: list = []
    _compare(part, EXPECTED[part], json.loads(json.dumps(got)), mismatches)
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:20])


def test_the_comparison_can_fail():
    mismatches: list = []
    _compare("x", {"a": [1.0, 2.0], "e": {"error": "TypeError", "message": "m"}, "s": {"error": "StopIteration"},
                   "p": 0},
             {"a": [1.0, 2.5], "e": {"error": "DnnbindValueError", "message": "m"},
              "s": {"error": "DnnbindValueError", "message": ""}, "p": None}, mismatches)
    assert len(mismatches) == 4


def test_the_fixtures_hold_the_semantics_the_docstring_states():
    """The roll_over and shuffle rules as MXNet 1.9.1 showed them, spelled out (the grid holds the rest)."""
    ep = EXPECTED["grid"]["array/n10/bs4/roll_over"]["epochs"]
    firsts = [[b["data"][0][2][0][0] for b in e] for e in ep]
    assert firsts == [[0, 4], [8, 2, 6], [0, 4]]  # 8, 9 roll into epoch 2's first batch, which takes 0, 1 too
    assert [b["pad"] for b in ep[1]] == [2, 0, 0]  # ... and reports the 2 carried-over samples as its pad
    pad = EXPECTED["grid"]["array/n10/bs4/pad"]["epochs"][0][-1]
    assert [r[0] for r in pad["data"][0][2]] == [8, 9, 0, 1] and pad["pad"] == 2
    assert EXPECTED["grid"]["array/n7/bs25/pad"]["epochs"][0][0]["pad"] == 18  # wraps around more than once
    sh = EXPECTED["shuffled"]["array/bs4/pad/reset"]
    np.random.seed(7)
    idx = np.arange(10)
    np.random.shuffle(idx)
    assert sh["idx"] == idx.tolist()  # np.random.shuffle of arange(n) at construction
    second = idx.copy()
    np.random.shuffle(second)  # at reset(): the index array again, applied to the already shuffled data
    got = [r[0] for b in sh["epochs"][1] for r in b["data"][0][2]][:10]
    assert got == idx[second].tolist()


# -- what dnnbind refuses on purpose ---------------------------------------------------------------------------

def test_an_unknown_last_batch_handle_is_refused(alias):
    assert EXPECTED["differences"]["last_batch_handle_keep"][0]  # MXNet ran it as 'discard'
    with pytest.raises(DnnbindValueError, match=r"last_batch_handle must be 'pad', 'discard' or 'roll_over', "
                                                r"got 'keep' \(MXNet 1.9.1 treats"):
        alias.io.NDArrayIter(np.arange(10), batch_size=4, last_batch_handle="keep")


@pytest.mark.parametrize("batch_size, error, text", [
    (0, DnnbindValueError, "at least 1"), (-2, DnnbindValueError, "at least 1"),
    (2.0, DnnbindTypeError, "must be an int"), (True, DnnbindTypeError, "must be an int"),
])
def test_batch_size_must_be_a_positive_int(batch_size, error, text):
    assert "error" in EXPECTED["differences"]["batch_size_float"]  # MXNet: at the first batch, from slice_axis
    with pytest.raises(error, match=text):
        dio.NDArrayIter(np.arange(10), batch_size=batch_size)
    assert len(list(dio.NDArrayIter(np.arange(10), batch_size=np.int64(5)))) == 2


@pytest.mark.parametrize("data", [[1, 2, 3], np.zeros(())])
def test_a_scalar_array_is_refused(data):
    assert EXPECTED["differences"]["scalar_data"]["error"] == "IndexError"  # MXNet: "tuple index out of range"
    with pytest.raises(DnnbindValueError, match="needs a batch axis"):
        dio.NDArrayIter(data)


def test_no_data_and_an_empty_prefetch_list_say_what_is_missing():
    with pytest.raises(DnnbindValueError, match="data is required"):
        dio.NDArrayIter(None)
    for empty in ([], {}):
        with pytest.raises(DnnbindValueError, match="data is empty"):
            dio.NDArrayIter(empty)
    with pytest.raises(DnnbindValueError, match="iters is empty"):
        dio.PrefetchingIter([])


def test_a_layout_batch_axis_is_used_throughout():
    mx_shapes = EXPECTED["differences"]["layout_TNC"]  # MXNet counts samples on axis 0: one batch of (3, 4, 4)
    assert mx_shapes[1] == [[3, 4, 4]]
    x = np.arange(3 * 10 * 2).reshape(3, 10, 2)
    it = dio.NDArrayIter(x, batch_size=4, layout="TNC", last_batch_handle="pad")
    assert [repr(d) for d in it.provide_data] == ["DataDesc[data,(3, 4, 2),<class 'numpy.float32'>,TNC]"]
    batches = list(it)
    assert [b.data[0].shape for b in batches] == [(3, 4, 2)] * 3 and [b.pad for b in batches] == [0, 0, 2]
    np.testing.assert_array_equal(batches[2].data[0].asnumpy(), x[:, [8, 9, 0, 1]])
    with pytest.raises(DnnbindValueError, match="no batch axis"):
        dio.NDArrayIter(x, layout="CHW")


def test_a_dict_passed_in_is_left_as_it_was():
    d = {"a": np.arange(4)}
    dio.NDArrayIter(d, batch_size=2)
    assert isinstance(d["a"], np.ndarray)


# -- shuffling -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("handle", ["pad", "discard"])
def test_each_shuffled_epoch_is_a_permutation(handle):
    x = np.arange(12)
    np.random.seed(123)
    it = dio.NDArrayIter(x, x * 10, batch_size=4, shuffle=True, last_batch_handle=handle)
    orders = []
    for _ in range(4):
        seen = [(int(d), int(lab)) for b in it for d, lab in zip(b.data[0].asnumpy(), b.label[0].asnumpy())]
        assert all(lab == 10 * d for d, lab in seen)  # data and label stay paired
        assert sorted(d for d, _ in seen) == list(range(12))
        orders.append([d for d, _ in seen])
        it.reset()
    assert len({tuple(o) for o in orders}) > 1  # every reset reshuffles


def test_the_same_seed_gives_the_same_order_as_mxnet():
    data, label = scenarios.make_inputs(dmx, np, "array", 10)
    np.random.seed(7)
    it = dio.NDArrayIter(data, label, batch_size=3, shuffle=True, last_batch_handle="roll_over")
    assert it.idx.tolist() == EXPECTED["shuffled"]["array/bs3/roll_over/reset"]["idx"]


# -- the alias -------------------------------------------------------------------------------------------------

def test_mx_io_is_dnnbinds_through_the_alias(alias):
    import mxnet
    import mxnet.io
    from mxnet.io import DataBatch, DataDesc, NDArrayIter
    assert mxnet.io is dio and alias.io is dio and DataBatch is dio.DataBatch and DataDesc is dio.DataDesc
    assert NDArrayIter is dio.NDArrayIter and "io" in dir(mxnet)
    assert dmx.io is dio


def test_a_gluon_training_loop_reads_the_batches(alias):
    mx = alias
    from mxnet import autograd, gluon
    rng = np.random.RandomState(0)
    x = rng.randn(64, 5)
    y = x @ np.arange(1, 6) + 0.5
    it = mx.io.NDArrayIter(x, y, batch_size=16, shuffle=True, last_batch_handle="discard")
    net = gluon.nn.Dense(1)
    net.initialize(mx.init.Normal(0.1), ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    loss_fn = gluon.loss.L2Loss()
    losses = []
    for _ in range(20):
        it.reset()
        total = 0.0
        for batch in it:
            data, label = batch.data[0], batch.label[0]
            assert data.context == mx.cpu() and data.shape == (16, 5) and batch.pad == 0
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(data.shape[0])
            total += float(loss.mean().asscalar())
        losses.append(total)
    assert losses[-1] < 0.05 * losses[0]


def test_the_cpp_iterators_name_the_feature(alias):
    import mxnet as mx
    for name in ("ImageRecordUInt8Iter", "CSVIter", "LibSVMIter", "MXDataIter"):  # ImageRecordIter: image/record_iter.py
        with pytest.raises(NotImplementedError, match=rf"^mxnet\.io\.{name} is not supported by dnnbind yet: "
                                                      "MXNet's C\\+\\+ data iterators"):
            getattr(mx.io, name)
    with pytest.raises(ImportError):  # as for mxnet.image's missing names: Python turns the error into this one
        from mxnet.io import CSVIter  # noqa: F401
    for name in sorted(NAMES["io"]):
        try:
            getattr(mx.io, name)
        except UnsupportedFeature as exc:
            assert f"mxnet.io.{name} is not supported by dnnbind" in str(exc)
    with pytest.raises(AttributeError) as err:
        _ = mx.io.NDArrayIterr  # a typo
    assert not isinstance(err.value, NotImplementedError)
    assert getattr(mx.io, "no_such_name", 7) == 7


def test_io_does_not_import_gluon():
    tree = ast.parse((ROOT / "dnnbind" / "io.py").read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert imported and not [m for m in imported if "gluon" in m], imported


# -- details ---------------------------------------------------------------------------------------------------

def test_batches_are_copies_on_the_cpu():
    x = np.arange(8.0).reshape(4, 2)
    it = dio.NDArrayIter(x, batch_size=2)
    b = it.next()
    b.data[0][:] = -1
    it.reset()
    np.testing.assert_array_equal(it.next().data[0].asnumpy(), x[:2])
    assert b.data[0].context == CPU and isinstance(b.data[0], nd.NDArray)


def test_data_desc_pickles_with_its_dtype_and_layout():
    d = dio.DataDesc("x", (2, 3), np.float16, "NTC")
    back = pickle.loads(pickle.dumps(d))
    assert back == d and back.dtype is np.float16 and back.layout == "NTC" and type(back) is dio.DataDesc


def test_the_shorter_label_error_names_the_array():
    it = dio.NDArrayIter(np.arange(10), {"lab": np.arange(5)}, batch_size=3)
    it.next()
    with pytest.raises(DnnbindValueError, match=r"Invalid end for end=6 as axis_size is 5 \(NDArrayIter: 'lab' has "
                                                r"5 samples"):
        it.next()


class _Counting(dio.DataIter):
    """Counts the next() calls made on it (from the prefetching thread)."""

    def __init__(self, n: int, fail_at: int | None = None):
        super().__init__(2)
        self.n, self.i, self.calls, self.fail_at = n, 0, 0, fail_at
        self.provide_data = [dio.DataDesc("data", (2,))]
        self.provide_label = []

    def reset(self):
        self.i = 0

    def next(self):
        self.calls += 1
        if self.fail_at is not None and self.i == self.fail_at:
            self.i += 1
            raise RuntimeError("the wrapped iterator failed")
        if self.i == self.n:
            raise StopIteration
        self.i += 1
        return dio.DataBatch([nd.array([self.i, self.i], ctx=CPU)], [], pad=0)


def test_prefetching_reads_one_batch_ahead_and_stops_its_thread_when_dropped():
    inner = _Counting(3)
    p = dio.PrefetchingIter(inner)
    p._prefetchers[0].ready.wait(5)
    assert inner.calls == 1  # the first batch is read before anyone asks
    assert [int(b.data[0].asnumpy()[0]) for b in p] == [1, 2, 3]
    p.reset()
    assert [int(b.data[0].asnumpy()[0]) for b in p] == [1, 2, 3]
    thread = p._prefetchers[0].thread
    del p
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_prefetching_raises_the_wrapped_iterators_error_in_the_callers_thread():
    p = dio.PrefetchingIter(_Counting(3, fail_at=1))
    assert p.next().data[0].asnumpy()[0] == 1
    with pytest.raises(RuntimeError, match="the wrapped iterator failed"):
        p.next()
    p.reset()
    assert p.next().data[0].asnumpy()[0] == 1
    assert threading.active_count() >= 1


@pytest.mark.gpu
def test_an_ndarray_on_the_gpu_gives_batches_on_the_gpu(gpu):
    x = nd.array(np.arange(12.0).reshape(6, 2), ctx=gpu)
    it = dio.NDArrayIter(x, batch_size=4)
    batches = list(it)
    assert [b.data[0].context for b in batches] == [gpu, gpu] and batches[1].pad == 2
    np.testing.assert_array_equal(batches[1].data[0].asnumpy(), np.arange(12.0).reshape(6, 2)[[4, 5, 0, 1]])


# -- MNISTIter (MXNet's C++ iterator, src/io/iter_mnist.cc) ---------------------------------------------------------

def _write_idx(path, array, gz=False):
    import gzip
    arr = np.asarray(array, np.uint8)
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(header + arr.tobytes())


def test_mnist_iter_reads_idx_files_as_mxnet_does(tmp_path):
    from dnnbind import io as dio
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 4, 3))
    labels = rng.integers(0, 10, 10)
    _write_idx(tmp_path / "img", images)
    _write_idx(tmp_path / "lbl.gz", labels, gz=True)  # the .gz beside the name given is read too
    it = dio.MNISTIter(image=str(tmp_path / "img"), label=str(tmp_path / "lbl"), batch_size=4, shuffle=False,
                       silent=True, data_shape=(12,))  # data_shape: MXNet's examples pass it; it is ignored
    batches = list(it)
    assert len(batches) == 2  # the last incomplete batch is dropped, as MXNet's
    np.testing.assert_array_equal(batches[0].data[0].asnumpy(), images[:4, None] / 256.0)
    np.testing.assert_array_equal(batches[1].label[0].asnumpy(), labels[4:8])
    assert it.provide_data[0].shape == (4, 1, 4, 3) and it.provide_label[0].shape == (4,)
    it.reset()
    assert len(list(it)) == 2
    flat = dio.MNISTIter(image=str(tmp_path / "img"), label=str(tmp_path / "lbl"), batch_size=5, flat=True,
                         shuffle=True, seed=3, silent=True)
    first = [b.label[0].asnumpy() for b in flat]
    flat.reset()
    assert [b.label[0].asnumpy().tolist() for b in flat] == [f.tolist() for f in first]  # shuffled once only
    assert sorted(np.concatenate(first).tolist()) == sorted(labels.tolist())
    assert flat.provide_data[0].shape == (5, 12)


def test_mnist_iter_names_a_missing_file(tmp_path):
    from dnnbind import io as dio
    with pytest.raises(FileNotFoundError, match="image file .*nope"):
        dio.MNISTIter(image=str(tmp_path / "nope"), label=str(tmp_path / "nope2"))
