"""SequenceMask, SequenceLast, SequenceReverse (ops/defs/sequence.py) against the real MXNet 1.9.1
(tests/fixtures/mxnet_sequence, written by tests/fixtures/make_mxnet_sequence.py), and the calls refused where MXNet
would read or write outside the data. The registry-wide checks (shape inference, symbol executor, central
differences, the GPU lowering against the twin) are tests/test_opdefs.py's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from dnnbind.ops.opdef import DEFS, Call, Grads
from dnnbind.ops.defs import sequence as seqdef
from dnnbind.ops.reference import sequence as ref
from tests._helpers import assert_close

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_sequence", "sequence.npz")


def _cases():
    f = np.load(FIXTURE)
    for i in range(int(f["count"])):
        yield (str(f[f"op{i}"]), f[f"x{i}"], f[f"len{i}"] if f"len{i}" in f else None, f[f"dy{i}"], f[f"y{i}"],
               f[f"dx{i}"] if int(f[f"has_dx{i}"]) else None, eval(str(f[f"params{i}"])))


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_matches_mxnet(ctx, request):
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    seen = set()
    for op, x, lengths, dy, y_mx, dx_mx, params in _cases():
        xa = nd.array(x, ctx=device)
        xa.attach_grad()
        args = [xa] if lengths is None else [xa, nd.array(lengths, ctx=device, dtype=lengths.dtype)]
        with autograd.record():
            y = getattr(nd, op)(*args, **params)
        what = f"{op} {params} lengths {None if lengths is None else lengths.tolist()} ({x.shape})"
        assert_close(y, y_mx, rtol=0, atol=0, name=what)
        if dx_mx is not None:
            y.backward(nd.array(dy, ctx=device))
            assert_close(xa.grad, dx_mx, rtol=0, atol=0, name=f"{what} gradient")
        seen.add((op, None if lengths is None else lengths.dtype.name))
    for op in ("SequenceMask", "SequenceLast", "SequenceReverse"):  # lengths given as float32 and as int32
        assert {(op, None), (op, "float32"), (op, "int32")} <= seen


def test_last_without_lengths_gradient_goes_to_the_last_step():
    """MXNet 1.9.1 reads an uninitialized length buffer here; the gradient of the forward is one-hot at T - 1."""
    x = nd.array(np.arange(24, dtype=np.float32).reshape(3, 2, 4))
    x.attach_grad()
    with autograd.record():
        y = nd.SequenceLast(x)
    y.backward(nd.ones((2, 4)))
    expected = np.zeros((3, 2, 4), np.float32)
    expected[2] = 1
    assert_close(x.grad, expected, rtol=0, atol=0, name="SequenceLast gradient")


def test_sequence_length_gets_no_gradient_and_int_lengths_work_with_float64_data():
    x = nd.array(np.ones((3, 2)), dtype="float64")
    n = nd.array([1, 3], dtype="int32")
    x.attach_grad()
    n.attach_grad()
    with autograd.record():
        y = nd.SequenceMask(x, n, use_sequence_length=True, value=-1)
    y.backward(nd.ones((3, 2), dtype="float64"))
    assert y.dtype == np.float64
    assert_close(y, [[1, 1], [-1, 1], [-1, 1]], rtol=0, atol=0)
    assert_close(x.grad, [[1, 1], [0, 1], [0, 1]], rtol=0, atol=0)
    assert_close(n.grad, [0, 0], rtol=0, atol=0)


def test_keyword_inputs_and_symbol_shapes():
    x = np.arange(12.0).reshape(2, 3, 2)
    y = nd.SequenceLast(data=nd.array(x), sequence_length=nd.array([1, 2, 2]), use_sequence_length=True)
    assert_close(y, x[[0, 1, 1], [0, 1, 2]], rtol=0, atol=0)
    s = sym.SequenceLast(sym.var("data"), sym.var("len"), use_sequence_length=True, axis=1, name="last")
    assert s.list_arguments() == ["data", "len"]
    assert s.infer_shape(data=(4, 5, 3)) == ([(4, 5, 3), (4,)], [(4, 3)], [])
    s = sym.SequenceReverse(sym.var("data"), name="rev")
    assert s.list_arguments() == ["data"]
    assert s.infer_shape(data=(4, 5, 3)) == ([(4, 5, 3)], [(4, 5, 3)], [])


# -- refused: errors name the op, the argument and the shapes ------------------------------------------------------

def _x(shape=(3, 2, 4)):
    return nd.array(np.random.default_rng(0).standard_normal(shape))


def test_lengths_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"SequenceMask: sequence_length must have shape \(2,\) .*data \(3, 2, 4\), "
                                         r"axis 0 .*got \(3,\)"):
        nd.SequenceMask(_x(), nd.array([1, 2, 3]), use_sequence_length=True)
    with pytest.raises(ValueError, match=r"SequenceLast: sequence_length must have shape \(3,\) .*axis 1.*got "
                                         r"\(2,\)"):
        nd.SequenceLast(_x(), nd.array([1, 2]), use_sequence_length=True, axis=1)
    with pytest.raises(ValueError, match=r"SequenceReverse: sequence_length must have shape \(2,\).*got \(1, 2\)"):
        nd.SequenceReverse(_x(), nd.array([[1, 2]]), use_sequence_length=True)


def test_invalid_axis_and_rank():
    with pytest.raises(ValueError, match=r"SequenceMask: axis must be 0 or 1 .*got 2 \(data \(3, 2, 4\)\)"):
        nd.SequenceMask(_x(), axis=2)
    with pytest.raises(ValueError, match=r"SequenceReverse: axis must be 0 .*got 1"):
        nd.SequenceReverse(_x(), axis=1)
    with pytest.raises(ValueError, match=r"SequenceLast: data must be of rank 2 or greater.*\(3,\)"):
        nd.SequenceLast(nd.array([1.0, 2, 3]))
    with pytest.raises(ValueError, match="axis must be 0 or 1"):
        sym.SequenceMask(sym.var("data"), axis=-1).infer_shape(data=(3, 2))


def test_lengths_and_the_flag_must_agree():
    with pytest.raises(TypeError, match=r"SequenceMask: use_sequence_length=True needs the sequence_length input"):
        nd.SequenceMask(_x(), use_sequence_length=True)
    with pytest.raises(TypeError, match=r"SequenceLast: got a sequence_length input .*use_sequence_length is False"):
        nd.SequenceLast(_x(), nd.array([1, 2]))


@pytest.mark.parametrize("op,lengths,message", [
    ("SequenceLast", [0, 2], r"sequence_length\[0\] is 0.0, but each length must be in \[1, 3\]"),
    ("SequenceLast", [2, 4], r"sequence_length\[1\] is 4.0, but each length must be in \[1, 3\]"),
    ("SequenceReverse", [4, 1], r"sequence_length\[0\] is 4.0, but each length must be in \[0, 3\]"),
    ("SequenceMask", [-1, 1], r"sequence_length\[0\] is -1.0, but each length must be >= 0"),
    ("SequenceReverse", [1, np.nan], r"sequence_length\[1\] is nan, not a number of steps"),
])
def test_lengths_out_of_range_are_refused_on_the_cpu(op, lengths, message):
    """Where MXNet reads or writes outside the data (SequenceLast's 0 or > T, SequenceReverse's > T, a negative
    length anywhere), the cpu backend refuses the call, naming the op, the value and the shapes (the gpu clamps:
    see test_gpu_clamps_out_of_range_lengths)."""
    with pytest.raises(ValueError, match=rf"{op}: {message} \(data \(3, 2, 4\), axis 0: T = 3 steps, B = 2 "
                                         rf"sequences; sequence_length \(2,\)\)"):
        getattr(nd, op)(_x(), nd.array(lengths), use_sequence_length=True)


_OUT_OF_RANGE = [[-1.0, 9.0], [np.nan, 2.5], [0.0, -np.inf], [np.inf, 3.0], [4.0, 0.0]]


def _clamped_twin(op, x, lengths, dy, axis):
    """The twin on the lengths the gpu lowering makes of out-of-range ones (ref.clamp_lengths)."""
    t = x.shape[axis]
    lo = 1 if op == "SequenceLast" else 0
    n = ref.clamp_lengths(lengths, t, lo)
    if op == "SequenceMask":
        return ref.sequence_mask(x, n, -7.0, axis), ref.sequence_mask_backward(dy, n, axis)
    if op == "SequenceLast":
        return ref.sequence_last(x, n, axis), ref.sequence_last_backward(dy, n, axis, x.shape)
    return ref.sequence_reverse(x, n), ref.sequence_reverse(dy, n)


def _run_gpu_lowering(name, arrays, params, dy, dtype="float64"):
    """The gpu lowering's forward and backward run through the table's ops on whatever device the arrays are on."""
    d = DEFS[name]
    p = nd.REGISTRY[name].schema.parse(params)
    xs = [arrays[0], arrays[1] if len(arrays) > 1 else None]
    c = Call(d.prepare(p, *xs), p, xs[0].device, True)
    y, saved = d.gpu.forward(c, *xs)
    dx = d.gpu.backward(c, saved, Grads((True, False), (None, None), True), dy)[0]
    return y, dx


@pytest.mark.parametrize("op", ["SequenceMask", "SequenceLast", "SequenceReverse"])
@pytest.mark.parametrize("axis", [0, 1])
def test_gpu_lowering_clamps_out_of_range_lengths_on_cpu_arrays(op, axis):
    """The gpu lowering cannot refuse a length without reading it back: it clamps (NaN as 0, then [0, T], [1, T] for
    SequenceLast), which is the twin applied to ref.clamp_lengths' lengths."""
    if op == "SequenceReverse" and axis == 1:
        return
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4) if axis == 0 else (2, 3, 4))
    params = {"use_sequence_length": True, "axis": axis, **({"value": -7.0} if op == "SequenceMask" else {})}
    for lengths in _OUT_OF_RANGE:
        dy = rng.standard_normal((2, 4) if op == "SequenceLast" else x.shape)
        y, dx = _run_gpu_lowering(op, [nd.array(x, dtype="float64"), nd.array(lengths, dtype="float64")], params,
                                  nd.array(dy, dtype="float64"))
        y_ref, dx_ref = _clamped_twin(op, x, np.array(lengths), dy, axis)
        assert_close(y, y_ref, rtol=0, atol=0, name=f"{op} axis {axis} lengths {lengths}")
        assert_close(dx, dx_ref, rtol=0, atol=0, name=f"{op} axis {axis} lengths {lengths} gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["SequenceMask", "SequenceLast", "SequenceReverse"])
def test_gpu_clamps_out_of_range_lengths(gpu, op):
    """On the device, out-of-range lengths are clamped, not refused (no host copy), as documented."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 4))
    params = {"value": -7.0} if op == "SequenceMask" else {}
    for lengths in _OUT_OF_RANGE:
        xa = nd.array(x, ctx=gpu, dtype="float64")
        xa.attach_grad()
        dy = rng.standard_normal((2, 4) if op == "SequenceLast" else x.shape)
        with autograd.record():
            y = getattr(nd, op)(xa, nd.array(lengths, ctx=gpu, dtype="float32"), use_sequence_length=True, **params)
        y.backward(nd.array(dy, ctx=gpu, dtype="float64"))
        y_ref, dx_ref = _clamped_twin(op, x, np.array(lengths, np.float32), dy, 0)
        assert_close(y, y_ref, rtol=0, atol=0, name=f"{op} lengths {lengths}")
        assert_close(xa.grad, dx_ref, rtol=0, atol=0, name=f"{op} lengths {lengths} gradient")


def test_what_mxnet_computes_soundly_is_kept():
    """A mask length of 0 masks everything and one past T nothing; a reverse length of 0 changes nothing."""
    x = np.arange(6.0).reshape(3, 2)
    assert_close(nd.SequenceMask(nd.array(x), nd.array([0, 9]), use_sequence_length=True, value=-1),
                 [[-1, 1], [-1, 3], [-1, 5]], rtol=0, atol=0)
    assert_close(nd.SequenceReverse(nd.array(x), nd.array([0, 3]), use_sequence_length=True),
                 [[0, 5], [2, 3], [4, 1]], rtol=0, atol=0)


def test_empty_data():
    y = nd.SequenceMask(nd.zeros((0, 2, 3)))
    assert y.shape == (0, 2, 3)
    assert nd.SequenceLast(nd.zeros((3, 0, 2))).shape == (0, 2)
    with pytest.raises(ValueError, match=r"SequenceLast: data \(0, 2, 3\) has no steps along axis 0"):
        nd.SequenceLast(nd.zeros((0, 2, 3)))


# -- the GPU lowering's row gathers, run through the table's ops on cpu arrays -------------------------------------

@pytest.mark.parametrize("name", ["SequenceMask", "SequenceLast", "SequenceReverse"])
def test_gpu_lowering_logic_on_cpu_arrays(name):
    """The gpu lowering is made of the table's ops (concat, take), which run on either backend: run on cpu arrays,
    its index arithmetic is checked here against the numpy twin without a GPU (the gpu-marked registry test runs
    it on the device)."""
    d = DEFS[name]
    for arrays, params in d.samples(np.random.default_rng(0)):
        p = nd.REGISTRY[name].schema.parse(params)
        xs = [nd.array(arrays["data"], dtype="float64"),
              nd.array(arrays["sequence_length"]) if "sequence_length" in arrays else None]
        c = Call(d.prepare(p, *xs), p, xs[0].device, True)
        yg, saved_g = d.gpu.forward(c, *xs)
        yc, saved_c = d.cpu.forward(c, *[None if a is None else a.numpy() for a in xs])
        assert_close(yg, yc, rtol=0, atol=0, name=f"{name} {params} forward")
        dy = np.random.default_rng(1).standard_normal(yc.shape)
        grads = Grads((True, False), (None, None), True)
        dxg = d.gpu.backward(c, saved_g, grads, nd.array(dy, dtype="float64"))[0]
        dxc = d.cpu.backward(c, saved_c, grads, dy)[0]
        assert_close(dxg, dxc, rtol=0, atol=0, name=f"{name} {params} gradient")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gpu_float16_and_int_lengths(gpu, dtype):
    """float16 data (the row gathers copy any dtype) with int32 lengths, against the cpu."""
    x = np.random.default_rng(2).standard_normal((5, 3, 4)).astype(dtype)
    n = np.array([5, 2, 1], np.int32)
    for op, params in (("SequenceMask", {"value": -2.0}), ("SequenceLast", {}), ("SequenceReverse", {})):
        out = {}
        for ctx in (dnnbind.cpu(), gpu):
            xa = nd.array(x, ctx=ctx, dtype=dtype)
            xa.attach_grad()
            with autograd.record():
                y = getattr(nd, op)(xa, nd.array(n, ctx=ctx, dtype="int32"), use_sequence_length=True, **params)
            y.backward(nd.ones(y.shape, ctx=ctx, dtype=dtype))
            out[ctx.kind] = (y.numpy(), xa.grad.numpy())
        assert_close(out["gpu"][0], out["cpu"][0], rtol=0, atol=0, name=f"{op} {dtype}")
        assert_close(out["gpu"][1], out["cpu"][1], rtol=0, atol=0, name=f"{op} {dtype} gradient")


@pytest.mark.parametrize("name", ["SequenceMask", "SequenceLast", "SequenceReverse"])
def test_gpu_lowering_reads_no_lengths_back_and_uploads_its_steps_once(name, monkeypatch):
    """No host copy inside the gpu lowering (NDArray.numpy/asnumpy refused while it runs, on cpu arrays where the
    table's ops need neither), and the arange(T)/arange(B) it compares with are uploaded once per (n, dtype, device),
    then served from the cache."""
    from dnnbind.runtime.array import NDArray
    seqdef._STEPS.clear()
    uploads = []
    real_array = seqdef.array
    monkeypatch.setattr(seqdef, "array", lambda *a, **k: uploads.append(a[0].shape) or real_array(*a, **k))

    def refuse(self, *a, **k):
        raise AssertionError("the gpu lowering copied an array to the host")
    x = np.random.default_rng(7).standard_normal((5, 3, 2))
    arrays = [nd.array(x, dtype="float64"), nd.array([2.0, 5, 1])]
    dy = nd.array(np.ones((3, 2) if name == "SequenceLast" else x.shape), dtype="float64")
    with monkeypatch.context() as m:
        m.setattr(NDArray, "numpy", refuse)
        m.setattr(NDArray, "asnumpy", refuse)
        for _ in range(3):
            _run_gpu_lowering(name, arrays, {"use_sequence_length": True}, dy)
    assert len(uploads) == len(set(uploads)) and uploads, uploads  # each arange once, however many calls
    assert all(k[1] == np.float64 for k in seqdef._STEPS)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1])
def test_sequence_mask_in_a_hybridized_block_replays(gpu, axis):
    """SequenceMask with lengths runs on the device only, so a hybridized Block records it and replays it (a CUDA
    graph), with the values of the eager call; the gradient as well."""
    from dnnbind import gluon

    class Masked(gluon.HybridBlock):
        def hybrid_forward(self, F, x, lengths):
            return F.SequenceMask(x, lengths, use_sequence_length=True, value=-3.0, axis=axis)

    eager, block = Masked(), Masked()
    block.hybridize()
    rng = np.random.default_rng(8)
    shape = (6, 4, 5) if axis == 0 else (4, 6, 5)
    for step in range(5):
        x = rng.standard_normal(shape).astype(np.float32)
        lengths = rng.integers(0, 8, 4).astype(np.float32)  # 7 > T: clamped, as the eager gpu call does
        got = []
        for net in (eager, block):
            xa = nd.array(x, ctx=gpu)
            xa.attach_grad()
            with autograd.record():
                y = net(xa, nd.array(lengths, ctx=gpu))
            y.backward(nd.ones(shape, ctx=gpu) * 2)
            got.append((y.asnumpy(), xa.grad.asnumpy()))
        assert_close(got[1][0], got[0][0], rtol=0, atol=0, name=f"step {step}")
        assert_close(got[1][1], got[0][1], rtol=0, atol=0, name=f"step {step} gradient")
        assert_close(got[0][0], ref.sequence_mask(x, ref.clamp_lengths(lengths, 6), -3.0, axis), rtol=0, atol=0)
    assert block._cached.replays >= 2 and not block._cached.eager_reasons, block._cached.eager_reasons
