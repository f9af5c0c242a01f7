"""Issue 21: silent wrong answers in autograd and the nd table, each case checked against what MXNet 1.9.1 (CPU
wheel) gives; the expected values and messages below were taken from that wheel.

- In-place writes while recording (``y += x``, ``y[i] = v``, ``y[:] = v``, ``copyto``, ``out=``): MXNet refuses
  them on arrays of the recorded graph, and tapes a whole-array copy of a graph array into a fresh one.
- ``pick`` is a gather (a one-hot product turned an inf elsewhere in the row into NaN).
- ``axis=()`` reduces over every axis; ``one_hot`` of float16 indices; the gradient of ``2.0 ** x``.
- Bad arguments raise ValueError/TypeError naming the op (never IndexError, OverflowError, MemoryError,
  AttributeError from deep inside).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dnnbind.mxnet as mx
from dnnbind import autograd, nd
from dnnbind.nd import _indexing

from _helpers import assert_close, nd_gradcheck

ASSIGN = ("Check failed: AGInfo::IsNone(*output): Assigning to NDArrays that are already in a computational graph "
          "will cause undefined behavior when evaluating gradients. Please call backward first to clear the graph "
          "or do this out side of a record section. Also note that you cannot use inplace operations like +=, *=, "
          "relu(x, out=x), y[idx]=x, etc inside a record section.")
INPLACE = ("Check failed: AGInfo::IsNone(*output): Inplace operations (+=, -=, x[:]=, etc) are not supported when "
           "recording with autograd.")


def _leaf(values=(1.0, 2.0, 3.0)):
    x = nd.array(list(values))
    x.attach_grad()
    return x


def _raises(fn, message):
    with pytest.raises(mx.base.MXNetError) as info:
        fn()
    assert isinstance(info.value, ValueError)
    assert str(info.value) == message


# -- 1. in-place writes inside autograd.record() --------------------------------------------------------------------

WRITES = {
    "+=": lambda y, x: y.__iadd__(x),
    "-=": lambda y, x: y.__isub__(x),
    "*=": lambda y, x: y.__imul__(x),
    "/=": lambda y, x: y.__itruediv__(x),
    "+= scalar": lambda y, x: y.__iadd__(1.0),
    "y[0] = v": lambda y, x: y.__setitem__(0, 5.0),
    "y[:] = v": lambda y, x: y.__setitem__(slice(None), 5.0),
    "y[:] = x": lambda y, x: y.__setitem__(slice(None), x),
    "y[[0, 1]] = v": lambda y, x: y.__setitem__(nd.array([0, 1]), 5.0),
    "x.copyto(y)": lambda y, x: x.copyto(y),
    "const.copyto(y)": lambda y, x: nd.array([5.0, 5.0, 5.0]).copyto(y),
    "relu(x, out=y)": lambda y, x: nd.relu(x, out=y),
    "relu(y, out=y)": lambda y, x: nd.relu(y, out=y),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_write_into_recorded_output_raises(write):
    # Before the fix `y = x * 2; y += x` gave x a gradient of 2 instead of 3 (the tape never saw the write).
    x = _leaf()
    with autograd.record():
        y = x * 2
        _raises(lambda: WRITES[write](y, x), ASSIGN)
    y.backward()
    assert_close(x.grad, [2.0, 2.0, 2.0], 0, 0)


@pytest.mark.parametrize("write", ["+=", "+= scalar", "y[0] = v", "y[:] = v", "y[:] = x", "const.copyto(y)"])
def test_write_into_a_variable_raises_while_recording(write):
    x, other = _leaf(), _leaf()
    with autograd.record():
        _raises(lambda: WRITES[write](x, other), ASSIGN)
    WRITES[write](x, other)  # outside record(): allowed, as in MXNet


def test_variable_with_grad_req_null_is_in_the_graph():
    x = nd.array([1.0, 2.0])
    x.attach_grad("null")
    with autograd.record():
        _raises(lambda: x.__iadd__(1.0), ASSIGN)


def test_constant_input_of_a_recorded_op_is_in_the_graph_until_backward():
    # MXNet: z (no gradient) used by a recorded op may not be written (its saved value would change the gradient
    # of x); a backward through that op frees it; a backward of an unrelated graph does not.
    x, z = _leaf(), nd.ones(3)
    with autograd.record():
        w = z * x
        other = x * 5
        _raises(lambda: z.__iadd__(1.0), ASSIGN)
        _raises(lambda: z.__setitem__(slice(None), 3.0), ASSIGN)
        _raises(lambda: nd.array([5.0, 5, 5]).copyto(z), ASSIGN)
        _raises(lambda: nd.zeros(3).__iadd__(z), INPLACE)
    other.backward()
    with autograd.record():
        _raises(lambda: z.__iadd__(1.0), ASSIGN)
    w.backward()
    assert_close(x.grad, [1.0, 1.0, 1.0], 0, 0)
    with autograd.record():
        z += 1
    assert_close(z, [2.0, 2.0, 2.0], 0, 0)


def test_untaped_array_updated_with_a_graph_value_raises():
    x = _leaf()
    y = x * 2  # not recorded
    with autograd.record():
        _raises(lambda: y.__iadd__(x), INPLACE)
        z = nd.ones((2, 3))
        _raises(lambda: z.__setitem__(0, x), INPLACE)
        _raises(lambda: z.__setitem__(slice(0, 1), x), INPLACE)
        _raises(lambda: z.__setitem__(slice(None, None, -1), x), INPLACE)
        _raises(lambda: z.__setitem__(nd.array([0, 1]), x), INPLACE)


def test_graph_is_freed_by_backward_so_writes_are_allowed_again():
    x = _leaf()
    with autograd.record():
        y = x * 2
        w = y * 3
    w.backward()
    with autograd.record():
        y += 1  # y's graph is gone: an ordinary write (MXNet gives [3, 5, 7])
        _raises(lambda: y.__iadd__(x), INPLACE)
    assert_close(y, [3.0, 5.0, 7.0], 0, 0)
    with autograd.record():
        y2 = x * 2
        w2 = y2 * 3
    w2.backward(retain_graph=True)
    with autograd.record():
        _raises(lambda: y2.__iadd__(1.0), ASSIGN)


def test_fresh_array_writes_that_mxnet_allows():
    x = _leaf()
    with autograd.record():
        z = nd.ones(3)
        z += 1  # no graph array involved: not taped, allowed twice
        z += 1
        z[1] = 5.0
        z[:] = nd.array([4.0, 5.0, 6.0])
    assert_close(z, [4.0, 5.0, 6.0], 0, 0)
    with autograd.record():
        y = x * 2
    with autograd.pause():
        y += 1
    assert_close(y, [3.0, 5.0, 7.0], 0, 0)


CASES_COPY = {  # (value, key) -> x.grad of sum(z * [1, 2, 3]) with z (2, 3) fresh; from MXNet 1.9.1
    "row": ([[0.0, 0.0, 0.0], [2.0, 4.0, 6.0]], lambda x: x[1] * 1),
    "whole": ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], lambda x: x * 1),
    "first row, broadcast": ([[2.0, 4.0, 6.0], [0.0, 0.0, 0.0]], lambda x: x[0:1] * 1),
}
KEYS_COVER = {"[:]": slice(None), "[...]": Ellipsis, "[:, :]": (slice(None), slice(None)), "[0:5]": slice(0, 5),
              "[-2:]": slice(-2, None), "[:, 0:3]": (slice(None), slice(0, 3)), "[()]": (), "[..., :]":
              (Ellipsis, slice(None))}


@pytest.mark.parametrize("case,key", list(itertools.product(sorted(CASES_COPY), sorted(KEYS_COVER))))
def test_whole_array_assignment_of_a_graph_value_is_a_taped_copy(case, key):
    want, value = CASES_COPY[case]
    x = nd.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    x.attach_grad()
    with autograd.record():
        z = nd.ones((2, 3))
        z[KEYS_COVER[key]] = value(x)
        w = (z * nd.array([1.0, 2.0, 3.0])).sum()
        _raises(lambda: z.__setitem__(slice(None), 0.0), ASSIGN)  # z is in the graph now
    w.backward()
    assert_close(x.grad, want, 0, 0)


def test_copyto_out_copy_and_identity_carry_the_gradient():
    x = _leaf()
    with autograd.record():
        z = nd.ones(3)
        x.copyto(z)
        u = nd.zeros(3)
        nd.relu(x, out=u)
        c = (x * 2).copy()
        i = nd.identity(x * 3)
        d = nd.zeros(3, dtype="float64")
        d[:] = x
        w = z * x + u + c + i + d.astype("float32") * 2
    w.backward()
    assert_close(x.grad, 2 * np.array([1.0, 2.0, 3.0]) + 1 + 2 + 3 + 2, 0, 1e-6)
    x2 = _leaf()
    with autograd.record():
        z = nd.ones(3)
        z[:] = x2
        w = z * x2
    w.backward()
    assert_close(x2.grad, [2.0, 4.0, 6.0], 0, 0)  # MXNet 1.9.1's


def test_views_of_graph_arrays_are_in_the_graph():
    x = _leaf()
    with autograd.record():
        _raises(lambda: x[0:2].__iadd__(1.0), ASSIGN)
        _raises(lambda: x.reshape((3,)).__iadd__(1.0), ASSIGN)
        d = x.detach()
        d += 1  # detach() leaves the graph (and, as in MXNet, shares x's memory)
    assert_close(x, [2.0, 3.0, 4.0], 0, 0)


def test_stop_gradient_is_a_new_array_and_untaped_outputs_of_graph_arrays_are_in_the_graph():
    x = nd.array([1.0, 2.0, 3.0])
    for fn in (nd.stop_gradient, nd.BlockGrad, nd.identity):
        y = fn(x)
        y += 1  # was written into x too (stop_gradient was a detached view); MXNet: x unchanged
    assert_close(x, [1.0, 2.0, 3.0], 0, 0)
    x.attach_grad()
    with autograd.record():
        y = x * 2
        for out in (nd.stop_gradient(y), nd.argmax(y, axis=0), y > 1, nd.concat(y, dim=0),
                    y.astype("float32", copy=False), y.as_in_context(y.context)):
            _raises(lambda: out.__iadd__(1.0), ASSIGN)  # MXNet 1.9.1 raises for each
        labels = nd.array([0.0, 1.0, 2.0])
        w = (y * labels).sum()
        _raises(lambda: (labels + 1).__imul__(2.0), ASSIGN)  # derived from a constant input of the graph
    w.backward()
    assert_close(x.grad, [0.0, 2.0, 4.0], 0, 0)


@pytest.mark.parametrize("view", ["reshape", "slice", "int", "[:]", "expand_dims", "flatten"])
def test_views_of_a_constant_input_are_in_the_graph(view):
    # Writing through a view of z would change the value z * x saved for x's gradient (MXNet raises).
    make = {"reshape": lambda z: z.reshape((3, 1)), "slice": lambda z: z[0:2], "int": lambda z: z[1],
            "[:]": lambda z: z[:], "expand_dims": lambda z: z.expand_dims(0),
            "flatten": lambda z: z.reshape((1, 3)).flatten()}[view]
    x, z = _leaf(), nd.ones(3)
    with autograd.record():
        w = (x * z).sum()
        v = make(z)
        _raises(lambda: v.__iadd__(1.0), ASSIGN)
    w.backward()
    assert_close(x.grad, [1.0, 1.0, 1.0], 0, 0)


def test_int_index_of_a_1d_array_is_a_view():
    z = nd.array([1.0, 2.0, 3.0])
    v = z[1]
    v += 5  # was a TypeError from numpy (a numpy scalar, not a view); MXNet writes through
    z[2] += 1
    assert_close(z, [1.0, 7.0, 4.0], 0, 0)


def test_create_graph_and_autograd_grad_still_work():
    x = _leaf()
    with autograd.record():
        y = x * x * x
        (g,) = autograd.grad(y, [x], create_graph=True)
        z = g.sum()
    z.backward()
    assert_close(x.grad, 6 * np.array([1.0, 2.0, 3.0]), 1e-6, 1e-6)
    with autograd.record():
        y = x * 2
        autograd.grad(y.sum(), [x])
        y += 1  # autograd.grad freed the graph (MXNet: [3, 5, 7])
    assert_close(y, [3.0, 5.0, 7.0], 0, 0)


# -- 2. pick is a gather ---------------------------------------------------------------------------------------------

def _pick_ref(data, index, axis, mode, keepdims):
    n = data.shape[axis]
    idx = np.trunc(index).astype(np.int64)
    idx = np.clip(idx, 0, n - 1) if mode == "clip" else np.mod(idx, n)
    got = np.take_along_axis(data, np.expand_dims(idx, axis), axis=axis)
    return got if keepdims else np.squeeze(got, axis)


def test_pick_does_not_turn_inf_into_nan():
    d = nd.array([[1.0, -np.inf, 3.0, 4.0], [np.inf, 2, 1, 0], [5, 6, np.nan, 8]])
    assert_close(nd.pick(d, nd.array([0, 1, 3])), [1.0, 2.0, 8.0], 0, 0)  # MXNet 1.9.1: [1, 2, 8]
    assert_close(nd.pick(d, nd.array([0.7, 1.5, 2.99])), [1.0, 2.0, np.nan], 0, 0)
    assert_close(nd.pick(d, nd.array([-1, -0.5, 7])), [1.0, np.inf, 8.0], 0, 0)
    assert_close(nd.pick(d, nd.array([-1, -5, 7]), mode="wrap"), [4.0, 0.0, 8.0], 0, 0)
    assert_close(nd.pick(d, nd.array([-1.5, -0.5, 5.5]), mode="wrap"), [4.0, np.inf, 6.0], 0, 0)
    assert_close(nd.pick(d, nd.array([0, 1, 2, 0]), axis=0), [1.0, 2.0, np.nan, 4.0], 0, 0)


PICK_SHAPES = [((5,), 0), ((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1), ((2, 1, 4), 1), ((1, 3, 1), 2),
               ((2, 3, 4, 5), 2), ((0, 3), 1), ((4, 2), 1)]


@pytest.mark.parametrize("shape,axis", PICK_SHAPES)
@pytest.mark.parametrize("mode", ["clip", "wrap"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
def test_pick_matches_numpy(shape, axis, mode, dtype):
    rng = np.random.default_rng(5)
    data = rng.uniform(-3, 3, shape)
    data.flat[::3] = np.inf
    a = axis % len(shape)
    ishape = shape[:a] + shape[a + 1:]
    index = rng.uniform(-7, 7, ishape)
    for keepdims in (False, True):
        got = nd.pick(nd.array(data, dtype="float32"), nd.array(index, dtype=dtype), axis=axis, mode=mode,
                      keepdims=keepdims)
        want = _pick_ref(data.astype(np.float32), index.astype(dtype), a, mode, keepdims)
        assert_close(got, want, 0, 0, name=f"pick {shape} axis {axis} {mode} keepdims={keepdims}")
    kept = shape[:a] + (1,) + shape[a + 1:]  # an index with the picked axis kept as 1 is taken too
    assert_close(nd.pick(nd.array(data), nd.array(index.reshape(kept)), axis=axis, mode=mode),
                 _pick_ref(data.astype(np.float32), index, a, mode, False), 0, 0)


@pytest.mark.parametrize("shape,axis", [s for s in PICK_SHAPES if 0 not in s[0]])
def test_pick_gradient_by_central_differences(shape, axis):
    rng = np.random.default_rng(2)
    a = axis % len(shape)
    index = nd.array(rng.integers(-1, shape[a] + 1, shape[:a] + shape[a + 1:]), dtype="float64")
    nd_gradcheck(lambda x: nd.pick(x, index, axis=axis) * 1.5, [rng.uniform(-1, 1, shape)], "cpu")
    nd_gradcheck(lambda x: nd.pick(x, index, axis=axis, mode="wrap", keepdims=True) ** 2,
                 [rng.uniform(-1, 1, shape)], "cpu")


def test_pick_second_order_gradient():
    x = nd.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype="float64")
    x.attach_grad()
    idx = nd.array([2, 0], dtype="float64")
    with autograd.record():
        y = nd.pick(x * x, idx)
        (g,) = autograd.grad(y.sum(), [x], create_graph=True)
        z = (g * g).sum()
    z.backward()
    assert_close(x.grad, [[0, 0, 24.0], [32.0, 0, 0]], 0, 1e-9)  # d/dx sum((2x)^2) on the picked entries


def _emulate_launch(kind, mode, values, bufs):
    """The gather/scatter_add kernels of kernels.strided (``_strided_src.take_source``) transcribed to numpy, run
    on the packed launch arguments: three addresses (gather: out, x, idx; scatter_add: src, out, idx), the element
    count, the axis length and stride, the coalesced shape, then each operand's strides."""
    addrs, (n, length, axis_stride), rest = values[:3], values[3:6], values[6:]
    ndim = (len(rest)) // 4
    shape, strides = rest[:ndim], [rest[ndim * (k + 1):ndim * (k + 2)] for k in range(3)]
    arrays = [bufs[a] for a in addrs]
    assert n == int(np.prod(shape))
    for pos in np.ndindex(*shape):
        o = [sum(i * s for i, s in zip(pos, st)) for st in strides]
        k = int(arrays[2][o[2]])  # (long long) cast: floats truncate toward zero
        k = min(max(k, 0), length - 1) if mode == "clip" else k % length
        if kind == "gather":
            arrays[0][o[0]] = arrays[1][o[1] + k * axis_stride]
        else:
            arrays[1][o[1] + k * axis_stride] += arrays[0][o[0]]


@pytest.mark.parametrize("shape,axis", [s for s in PICK_SHAPES if 0 not in s[0]])
@pytest.mark.parametrize("mode", ["clip", "wrap"])
def test_pick_gpu_launch_drives_the_gather_kernel_right(shape, axis, mode, monkeypatch):
    # The GPU pick and its gradient launch kernels.strided's gather/scatter_add kernels with a pick's geometry. The
    # launch is captured here (no GPU): its generated source must build, and the kernel's loop, run in numpy over
    # the packed arguments, must give numpy's answer (the CUDA code itself runs in the gpu tests of take).
    from dnnbind.kernels import strided
    from dnnbind.runtime import stream as rt_stream
    launched = []
    monkeypatch.setattr(rt_stream, "current_stream", lambda device=None: None)
    monkeypatch.setattr(strided, "resolve_stream", lambda stream, device: (device, 0))
    monkeypatch.setattr(strided, "grid_cap", lambda device: 1024)
    monkeypatch.setattr(strided, "launch_variant", lambda key, device, h, grid, block, values: launched.append(
        (key, list(values))))

    class FakeGpu:
        index = 0

    rng = np.random.default_rng(9)
    a = axis % len(shape)
    space = shape[:a] + shape[a + 1:]
    data = rng.uniform(-3, 3, shape)
    index = rng.uniform(-6, 6, space).astype(np.float32)
    out = np.full(int(np.prod(space)), np.nan)
    bufs = {0x10000: out, 0x20000: data.reshape(-1), 0x30000: index.reshape(-1)}
    refs = tuple(strided.Ref(p, np.dtype(b.dtype), (1,)) for p, b in bufs.items())
    _indexing._pick_launch("gather", shape, a, mode, refs, FakeGpu())
    (key, values), = launched
    assert key[:3] == ("gather", mode, (np.float64, np.float64, np.float32))
    strided.generate(key)  # the kernel source for this variant builds
    _emulate_launch("gather", mode, values, bufs)
    assert_close(out.reshape(space), _pick_ref(data, index, a, mode, False), 0, 0)

    g = rng.uniform(-1, 1, space)
    grad = np.zeros(data.size)
    bufs = {0x10000: g.reshape(-1), 0x20000: grad, 0x30000: index.reshape(-1)}
    refs = tuple(strided.Ref(p, np.dtype(b.dtype), (1,)) for p, b in bufs.items())
    launched.clear()
    _indexing._pick_launch("scatter_add", shape, a, mode, refs, FakeGpu())
    (key, values), = launched
    strided.generate(key)
    _emulate_launch("scatter_add", mode, values, bufs)
    x = nd.array(data, dtype="float64")
    x.attach_grad()
    with autograd.record():
        y = nd.pick(x, nd.array(index, dtype="float32"), axis=axis, mode=mode)
    y.backward(nd.array(g, dtype="float64"))
    assert_close(grad.reshape(shape), x.grad, 0, 0)


def test_softmax_cross_entropy_3d_with_masked_logits_is_finite():
    from dnnbind.gluon import loss as gloss
    np.random.seed(0)
    pred = np.random.randn(2, 3, 5).astype(np.float32)
    pred[:, :, 3:] = -np.inf
    label = np.array([[0, 1, 2], [2, 0, 1]], dtype=np.float32)
    p = nd.array(pred)
    p.attach_grad()
    with autograd.record():
        loss = gloss.SoftmaxCrossEntropyLoss()(p, nd.array(label))
    loss.backward()
    assert_close(loss, [0.7307124137878418, 2.277195930480957], 2e-6, 1e-6)  # MXNet 1.9.1
    want = [[[-0.1385875940322876, 0.04978927969932556, 0.08879944682121277, 0, 0],
             [0.0328233540058136, -0.10779130458831787, 0.07496796548366547, 0, 0],
             [0.050810154527425766, 0.18835458159446716, -0.23916441202163696, 0, 0]],
            [[0.06981310248374939, 0.22278927266597748, -0.2926023602485657, 0, 0],
             [-0.32740065455436707, 0.14650866389274597, 0.18089234828948975, 0, 0],
             [0.03690146654844284, -0.16793188452720642, 0.13103090226650238, 0, 0]]]
    assert_close(p.grad, want, 2e-5, 1e-6)
    # and the unmasked gradient by central differences (float64, the composite path with axis=1)
    logits = np.random.randn(2, 4, 3)
    lab = nd.array([[0, 3, 1], [2, 2, 0]], dtype="float64")
    nd_gradcheck(lambda x: gloss.SoftmaxCrossEntropyLoss(axis=1)(x, lab), [logits], "cpu")


# -- 3. axis=() reduces over every axis --------------------------------------------------------------------------------

AXIS_EMPTY = {"sum": 10.0, "mean": 2.5, "max": 4.0, "min": 1.0, "prod": 24.0, "nansum": 10.0,
              "norm": 5.4772257804870605}


@pytest.mark.parametrize("op", sorted(AXIS_EMPTY))
def test_axis_empty_tuple_is_a_full_reduction(op):
    a = nd.array([[1.0, 2.0], [3.0, 4.0]])
    fn = getattr(nd, op)
    for axis in ((), []):
        got = fn(a, axis=axis)
        assert got.shape == (1,)
        assert_close(got, [AXIS_EMPTY[op]], 1e-7, 0)
        got = fn(a, axis=axis, keepdims=True)
        assert got.shape == (1, 1)
        assert_close(got, [[AXIS_EMPTY[op]]], 1e-7, 0)
        if op != "norm":
            assert_close(fn(a, axis=axis, exclude=True), [AXIS_EMPTY[op]], 1e-7, 0)
        assert_close(getattr(a, op)(axis=axis), [AXIS_EMPTY[op]], 1e-7, 0)
    assert fn(a, axis=(0, 1), exclude=True).shape == (2, 2) if op != "norm" else True  # nothing left to reduce


def test_axis_empty_tuple_gradient_and_arg_reductions():
    x = nd.array([1.0, 2.0, 3.0])
    x.attach_grad()
    with autograd.record():
        y = nd.mean(x * x, axis=())
    y.backward()
    assert_close(x.grad, [2 / 3, 4 / 3, 2.0], 1e-6, 0)
    for op in (nd.argmax, nd.argmin):
        with pytest.raises(ValueError, match="axis"):
            op(nd.array([[1.0, 2.0]]), axis=())


# -- 4. one_hot of any index dtype -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8", "int8"])
def test_one_hot_index_dtypes(dtype):
    # MXNet 1.9.1: out of range (7, and negative indices) marks nothing; no wrap-around.
    got = nd.one_hot(nd.array([1, 2, 7, 3, 0], dtype=dtype), 4)
    assert got.dtype == np.float32
    assert_close(got, np.eye(5, 4)[[1, 2, 4, 3, 0]] * np.array([[1], [1], [0], [1], [1]]), 0, 0)
    if dtype != "uint8":
        assert_close(nd.one_hot(nd.array([-1, -4, 4, 1], dtype=dtype), 4),
                     [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]], 0, 0)


def test_one_hot_float_indices_truncate_and_large_float16():
    want = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]  # MXNet: cast toward zero
    for dtype in ("float16", "float32"):
        assert_close(nd.one_hot(nd.array([1.7, -0.5, 2.5, 3.99, -1.2], dtype=dtype), 4), want, 0, 0)
    hot = nd.one_hot(nd.array([4096, 4100, 2050], dtype="float16"), 5000).numpy()
    assert hot.sum(axis=1).tolist() == [1.0, 1.0, 1.0]  # was 4 and 2 entries: a float16 arange cannot count there
    assert np.nonzero(hot)[1].tolist() == [4096, 4100, 2050]
    assert nd.one_hot(nd.array([4, 255], dtype="uint8"), 300).numpy().nonzero()[1].tolist() == [4, 255]
    assert_close(nd.one_hot(nd.array([1, 2, 9]), 3, on_value=5, off_value=-1),
                 [[-1, 5, -1], [-1, -1, 5], [-1, -1, -1]], 0, 0)
    assert nd.one_hot(nd.array([1, 2]), 3, dtype="int32").dtype == np.int32
    assert_close(nd.one_hot(nd.array([np.nan, np.inf, 1]), 3), [[0, 0, 0], [0, 0, 0], [0, 1, 0]], 0, 0)


# -- 5. power's gradients ----------------------------------------------------------------------------------------------

def test_rpow_and_power_gradients_by_central_differences():
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 1.5, (2, 3))
    y = rng.uniform(0.5, 1.5, (3,))
    nd_gradcheck(lambda a: 2.0 ** a, [x], "cpu")
    nd_gradcheck(lambda a: 2 ** a, [x], "cpu")
    nd_gradcheck(lambda a: a ** 2.0, [x], "cpu")
    nd_gradcheck(lambda a: a ** 3, [x], "cpu")
    nd_gradcheck(lambda a, b: a ** b, [x, y], "cpu")
    nd_gradcheck(lambda a, b: b ** a, [x, y], "cpu")
    nd_gradcheck(lambda a: nd.power(a, 1.5), [x], "cpu")
    v = nd.array([0.5, 1.0])
    v.attach_grad()
    with autograd.record():
        out = 0.0 ** v
    out.backward()
    assert np.isnan(v.grad.numpy()).all()  # MXNet 1.9.1: 0 * log(0)


# -- 6. bad arguments: ValueError/TypeError naming the op ------------------------------------------------------------

x0 = nd.array(np.float32(3)).reshape(())
BAD = {
    "max of 0-d, axis=0": (lambda: nd.max(x0, axis=0), ValueError, "max: axis 0"),
    "sum of 0-d, axis=-1": (lambda: nd.sum(x0, axis=-1), ValueError, "sum: axis -1"),
    "argmax of 0-d, axis=0": (lambda: nd.argmax(x0, axis=0), ValueError, "argmax: axis 0"),
    "concat of 0-d": (lambda: nd.concat(x0, x0, dim=0), ValueError, "concat: axis 0"),
    "stack of 0-d, axis=1": (lambda: nd.stack(x0, x0, axis=1), ValueError, "stack: axis 1"),
    "take from 0-d": (lambda: nd.take(x0, nd.array([0])), ValueError, "take: axis 0"),
    "sort of 0-d": (lambda: nd.sort(x0), ValueError, "sort"),
    "int32 + 2**40": (lambda: nd.array([1, 2], dtype="int32") + 2 ** 40, ValueError, "add: the scalar b=1099511627776"),
    "2**40 - int32": (lambda: 2 ** 40 - nd.array([1, 2], dtype="int32"), ValueError, "subtract: the scalar a="),
    "int8 + 200": (lambda: nd.array([1, 2], dtype="int8") + 200, ValueError, "int8"),
    "uint8 * -1": (lambda: nd.array([1, 2], dtype="uint8") * -1, ValueError, "uint8"),
    "int32 == 2**40": (lambda: nd.array([1, 2], dtype="int32") == 2 ** 40, ValueError, "equal"),
    "int32[0] = 2**40": (lambda: nd.array([1, 2], dtype="int32").__setitem__(0, 2 ** 40), ValueError, "setitem"),
    "repeat 2**40": (lambda: nd.repeat(nd.array([1.0, 2]), 2 ** 40), ValueError,
                     "repeat: repeating (2,) 1099511627776"),
    "repeat -1": (lambda: nd.repeat(nd.array([1.0, 2]), -1), ValueError, "repeat: repeats cannot be a negative"),
    "repeat 1.5": (lambda: nd.repeat(nd.array([1.0, 2]), 1.5), TypeError, "repeats expect int"),
    "tile 2**40": (lambda: nd.tile(nd.array([1.0, 2]), (2 ** 40,)), ValueError,
                   "tile: tiling (2,) by (1099511627776,)"),
    "tile 'a'": (lambda: nd.tile(nd.array([1.0, 2]), "a"), TypeError, "reps expect Shape(tuple)"),
    "broadcast_to huge": (lambda: nd.broadcast_to(nd.array([[1.0, 2]]), shape=(2 ** 40, 2)), ValueError,
                          "broadcast_to: the result would have shape (1099511627776, 2): 2199023255552 elements"),
    "broadcast_axis huge": (lambda: nd.broadcast_axis(nd.array([[1.0, 2]]), axis=0, size=2 ** 40), ValueError,
                            "broadcast_to"),
    "reshape huge": (lambda: nd.array([1.0, 2]).reshape((2 ** 40, 2)), ValueError, "reshape"),
    "reshape None data": (lambda: nd.reshape(None, (2,)), TypeError, "reshape: data"),
    "expand_dims str": (lambda: nd.expand_dims("a", 0), TypeError, "expand_dims: data"),
    "tile None": (lambda: nd.tile(None, (2,)), TypeError, "tile: data"),
    "swapaxes None": (lambda: nd.swapaxes(None, 0, 1), TypeError, "swapaxes: data"),
    "flip None": (lambda: nd.flip(None, 0), TypeError, "flip: data"),
    "topk None": (lambda: nd.topk(None), TypeError, "topk: data"),
    "topk k>n of empty": (lambda: nd.topk(nd.zeros((0, 3)), axis=0, k=10), ValueError, "topk: k=10"),
    "stack None": (lambda: nd.stack(nd.ones(2), None), TypeError, "stack: data[1]"),
    "identity None": (lambda: nd.identity(None), TypeError, "identity: data"),
    "cast None": (lambda: nd.cast(None, dtype="float32"), TypeError, "cast: data"),
    "pick axis None": (lambda: nd.pick(nd.ones((2, 3)), nd.array([0, 1]), axis=None), ValueError,
                       "axis=None is not supported by pick yet"),
    "pick bad mode": (lambda: nd.pick(nd.ones((2, 3)), nd.array([0, 1]), mode="raise"), ValueError,
                      "Invalid Input: 'raise', valid values are: {'clip', 'wrap'}, in operator pick"),
    "pick index shape": (lambda: nd.pick(nd.ones((2, 3)), nd.array([0, 1, 2])), ValueError, "pick: index shape (3,)"),
    "pick from an empty axis": (lambda: nd.pick(nd.ones((2, 0)), nd.array([0, 1])), ValueError, "pick: cannot"),
    "one_hot depth 1.5": (lambda: nd.one_hot(nd.array([0, 1]), 1.5), TypeError, "depth expect int"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_value_or_type_error(case):
    fn, exc, text = BAD[case]
    with pytest.raises(exc) as info:
        fn()
    assert isinstance(info.value, mx.base.MXNetError), type(info.value)
    assert not isinstance(info.value, IndexError)
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_topk_gradient_scatters_to_positions_past_2048_and_keeps_inf_local(dtype):
    # MXNet 1.9.1 (float32, and float16 for topk): the head gradient lands on the picked positions only.
    xv = np.random.RandomState(0).permutation(3000).reshape(1, 3000).astype(np.float32) / 3000.0
    x = nd.array(xv, dtype=dtype)
    x.attach_grad()
    with autograd.record():
        y = nd.topk(x, k=3, ret_typ="value")
    y.backward(nd.array([[np.inf, 2.0, 3.0]], dtype=dtype))
    g = x.grad.numpy()
    assert np.nonzero(g[0])[0].tolist() == [654, 1985, 2191]
    assert g[0][[654, 1985, 2191]].tolist() == [np.inf, 2.0, 3.0]
    assert not np.isnan(g).any()


def test_topk_k_below_one_sorts_the_whole_axis():
    x = nd.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    assert_close(nd.topk(x, k=-1), [[0, 2, 1], [1, 2, 0]], 0, 0)  # MXNet: "a global sort if k < 1"
    assert_close(nd.topk(x, k=0, ret_typ="value"), [[3, 2, 1], [5, 4, 0]], 0, 0)


def test_fuzz_elementwise_reductions_shapes_and_indexing_raise_only_value_or_type_errors():
    """Bad inputs of every kind into the element-wise, broadcast, reduction, shape, indexing and dot ops: any
    error is a ValueError/TypeError (an IndexError only from x[key]), never AttributeError, OverflowError,
    MemoryError or a bare IndexError from deep inside."""
    x23, x1 = nd.array(np.arange(6).reshape(2, 3)), nd.array([1.0, 2, 3])
    vals = [None, "a", [1, 2], x0, x23, x1, nd.zeros((0, 3)), 3, 2 ** 40, 1.5, nd.array([1, 2], dtype="int32"),
            nd.array([1, 2], dtype="float16"), -1, (1, 2), np.ones(3), True, {}, float("nan")]
    ops2 = ["add", "subtract", "multiply", "divide", "power", "maximum", "equal", "modulo", "broadcast_add",
            "elemwise_add", "dot", "batch_dot", "take", "pick", "broadcast_like", "concat", "stack"]
    ops1 = ["exp", "log", "relu", "abs", "sum", "mean", "max", "argmax", "norm", "reshape", "transpose",
            "expand_dims", "squeeze", "flatten", "flip", "sort", "topk", "one_hot", "tile", "repeat", "split",
            "identity", "cast"]
    args1 = [(), (0,), (5,), ("a",), (None,), (2 ** 40,), ((2 ** 40,),), ((0, 0),)]
    failures = []

    def check(name, fn, indexing=False):
        try:
            fn()
        except (ValueError, TypeError, NotImplementedError) as exc:
            if isinstance(exc, IndexError) and not indexing:
                failures.append((name, type(exc).__name__, str(exc)[:80]))
        except Exception as exc:  # noqa: BLE001  (the point: nothing else may escape)
            failures.append((name, type(exc).__name__, str(exc)[:80]))

    for op in ops2:
        for i, a in enumerate(vals):
            for j, b in enumerate(vals):
                check(f"{op}({i},{j})", lambda: getattr(nd, op)(a, b))
    for op in ops1:
        for i, a in enumerate(vals):
            for args in args1:
                check(f"{op}({i},{args})", lambda: getattr(nd, op)(a, *args))
                check(f"{op}({i},axis={args})", lambda: getattr(nd, op)(a, axis=args[0] if args else None))
    for a in (x23, x1, x0, nd.zeros((0, 3))):
        for key in (0, 5, -5, 1.5, "a", None, (0, 0, 0), slice(None, None, 0), [0, 1], [5], nd.array([5]), 2 ** 40,
                    (Ellipsis, Ellipsis), (0, slice(None))):
            check(f"{a.shape}[{key!r}]", lambda: a[key], indexing=True)
            for v in (1, None, "a", x23, 2 ** 40):
                check(f"{a.shape}[{key!r}] = {v!r}", lambda: a.copy().__setitem__(key, v), indexing=True)
    assert not failures, f"{len(failures)} bad exceptions, first ones: {failures[:10]}"
