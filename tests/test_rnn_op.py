"""MXNet's fused ``RNN`` operator (dnnbind/ops/defs/rnn.py) and its numpy twin (dnnbind/ops/reference/rnn.py).

- The twin against the real MXNet 1.9.1 (tests/fixtures/mxnet_rnn, made by tests/fixtures/make_mxnet_rnn.py):
  every mode, uni- and bidirectional, 2 layers, forward and the gradients of data, parameters and initial states
  with head gradients on the output and on the final states; one variable-length case (assembled from MXNet's
  results on each unpadded sequence: MXNet's cpu kernels refuse use_sequence_length). Float64 and float32.
- The projection (which MXNet's cpu kernels crash on): with P = H and an identity h2r it is the plain LSTM.
- Central differences in float64 through the twin, with head gradients on every output, lengths, clipping,
  a projection and given dropout masks.
- nd.RNN on the cpu against the twin, dropout in training, the symbol's outputs and shapes (MXNet's), bad inputs.
- GPU (marked ``gpu``): the cuDNN lowering against the twin for modes x directions x layers x projection x
  lengths in float32 (strict FP32), float64 and float16, forward and backward (state head gradients included),
  inference vs training, dropout, a CUDA-graph capture.
"""

from __future__ import annotations

import itertools
import os
import re

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from dnnbind.ops.opdef import Call, Grads
from dnnbind.ops.reference.rnn import GATES, layout, param_size, rnn_backward, rnn_forward
from tests._helpers import assert_close, c_param_kind, ctypes_arg_kind, cudnn_header

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_rnn")
H, LAYERS = 3, 2  # the fixtures' state size and depth
CASES = [f"{m}_{d}" for m in GATES for d in ("uni", "bi")]


def _fixture(name):
    z = np.load(os.path.join(FIX, name + ".npz"))
    return {k: z[k] for k in z.files}


def _twin(z, mode, bidir, dtype=np.float64, **kw):
    cast = lambda a: None if a is None else np.asarray(a).astype(dtype)
    y, hy, cy, cache = rnn_forward(cast(z["x"]), cast(z["params"]), cast(z["hx"]), cast(z.get("cx")), mode=mode,
                                   state_size=H, num_layers=LAYERS, bidirectional=bidir,
                                   lengths=z.get("lengths"), **kw)
    dx, dp, dhx, dcx = rnn_backward(cache, cast(z["dy"]), cast(z["dhy"]), cast(z.get("dcy")))
    return {"y": y, "hy": hy, "cy": cy, "dx": dx, "dparams": dp, "dhx": dhx, "dcx": dcx}


def _split(name):
    mode, d = name.rsplit("_", 1)
    return mode, d == "bi"


# -- the twin against MXNet 1.9.1 ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", CASES + ["gru_bi_lengths"])
def test_twin_matches_mxnet(name, dtype):
    z = _fixture(name)
    mode, bidir = _split(name.replace("_lengths", ""))
    got = _twin(z, mode, bidir, np.dtype(dtype))
    tol = 1e-10 if dtype == "float64" and not mode.startswith("rnn_relu") else 1e-5
    for k in ("y", "hy", "cy", "dx", "dparams", "dhx", "dcx"):
        if got[k] is not None and k in z:
            assert got[k].dtype == np.dtype(dtype)
            assert_close(got[k], z[k], rtol=tol, atol=tol, name=f"{name} {k}")


def test_fixtures_are_small_and_complete():
    files = sorted(f for f in os.listdir(FIX) if f.endswith(".npz"))
    assert files == sorted([c + ".npz" for c in CASES] + ["gru_bi_lengths.npz"])
    assert all(os.path.getsize(os.path.join(FIX, f)) < 16_000 for f in files)


def test_param_size_is_mxnets():
    # read off MXNet 1.9.1: sym.RNN(...).infer_shape(data=(5, 3, 6)) with state_size 4, 2 layers, bidirectional
    assert param_size("lstm", 2, 6, 4, True) == 832
    assert param_size("lstm", 2, 6, 4, True, projection_size=2) == 608
    assert param_size("gru", 1, 4, 5, False) == 3 * 5 * (4 + 5 + 2)


def _with_identity_projection(params, c, bidir):
    """The flat vector of an LSTM with projection_size = H and h2r = I, from a plain LSTM's."""
    plain = {(l, d, n): (off, s) for l, d, n, off, s in layout("lstm", LAYERS, c, H, bidir)}
    out = []
    for l, d, n, off, s in layout("lstm", LAYERS, c, H, bidir, projection_size=H):
        if n == "wr":
            out.append(np.eye(H).ravel())
        else:
            o, shape = plain[(l, d, n)]
            out.append(params[o:o + int(np.prod(shape))])
    return np.concatenate(out)


@pytest.mark.parametrize("bidir", [False, True], ids=["uni", "bi"])
def test_identity_projection_is_the_plain_lstm(bidir):
    z = _fixture(f"lstm_{'bi' if bidir else 'uni'}")
    c = z["x"].shape[2]
    zp = dict(z, params=_with_identity_projection(z["params"], c, bidir))
    got = _twin(zp, "lstm", bidir, projection_size=H)
    for k in ("y", "hy", "cy", "dx", "dhx", "dcx"):
        assert_close(got[k], z[k], rtol=1e-10, atol=1e-12, name=f"projected {k}")
    keep = [np.arange(off, off + int(np.prod(s))) for l, d, n, off, s in
            layout("lstm", LAYERS, c, H, bidir, projection_size=H) if n != "wr"]
    assert_close(got["dparams"][np.concatenate(keep)], z["dparams"], rtol=1e-10, atol=1e-12, name="dparams")


# -- central differences through the twin ----------------------------------------------------------------------

TWIN_CASES = {
    "lstm_bi_proj": {"mode": "lstm", "bidir": True, "layers": 2, "c": 3, "h": 3, "proj": 2},
    "lstm_clip_lengths": {"mode": "lstm", "bidir": True, "layers": 1, "c": 2, "h": 2, "clip": (-0.25, 0.3),
                          "lengths": [3, 1]},
    "gru_lengths": {"mode": "gru", "bidir": True, "layers": 2, "c": 2, "h": 2, "lengths": [2, 3]},
    "relu_dropout": {"mode": "rnn_relu", "bidir": True, "layers": 3, "c": 2, "h": 2, "p": 0.4},
    "tanh_t1": {"mode": "rnn_tanh", "bidir": False, "layers": 2, "c": 2, "h": 3, "t": 1, "n": 1},
}


def _twin_case(case, seed=0):
    rng = np.random.default_rng(seed)
    t, n, c, h = case.get("t", 3), case.get("n", 2), case["c"], case["h"]
    d = 2 if case["bidir"] else 1
    pp = case.get("proj") or h
    size = param_size(case["mode"], case["layers"], c, h, case["bidir"], case.get("proj"))
    arrays = [rng.uniform(-1, 1, (t, n, c)), rng.uniform(-0.7, 0.7, size),
              rng.uniform(-0.5, 0.5, (case["layers"] * d, n, pp))]
    if case["mode"] == "lstm":
        arrays.append(rng.uniform(-0.5, 0.5, (case["layers"] * d, n, h)))
    masks = None
    if case.get("p"):
        masks = [(rng.random((t, n, d * pp)) >= case["p"]) / (1 - case["p"]) for _ in range(case["layers"] - 1)]
    kw = {"mode": case["mode"], "state_size": h, "num_layers": case["layers"], "bidirectional": case["bidir"],
          "projection_size": case.get("proj"), "lengths": case.get("lengths"), "clip": case.get("clip"),
          "p": case.get("p", 0.0), "masks": masks}
    return arrays, kw, rng


@pytest.mark.parametrize("name", sorted(TWIN_CASES))
def test_twin_gradients_by_central_differences(name):
    arrays, kw, rng = _twin_case(TWIN_CASES[name])
    lstm = kw["mode"] == "lstm"
    y, hy, cy, cache = rnn_forward(*arrays, **kw)
    heads = [rng.uniform(0.5, 1.5, y.shape), rng.uniform(-1, 1, hy.shape)] + ([rng.uniform(-1, 1, cy.shape)]
                                                                                if lstm else [])

    def loss(xs):
        outs = rnn_forward(*xs, **kw)[:3]
        return sum(float((o * hd).sum()) for o, hd in zip(outs, heads))

    grads = rnn_backward(cache, *heads)
    eps = 1e-6
    for i, a in enumerate(arrays):
        num = np.zeros(a.size)
        for j in range(a.size):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i].flat[j] += eps
            minus[i].flat[j] -= eps
            num[j] = (loss(plus) - loss(minus)) / (2 * eps)
        assert_close(grads[i].ravel(), num, rtol=1e-5, atol=1e-7, name=f"{name} gradient of input {i}")


def test_twin_lengths_zero_the_padding_and_keep_the_last_valid_state():
    arrays, kw, _ = _twin_case(TWIN_CASES["gru_lengths"])
    y, hy, _, _ = rnn_forward(*arrays, **kw)
    assert np.all(y[2:, 0] == 0) and np.any(y[2, 1] != 0)  # entry 0 has length 2 of 3
    # entry 0 alone on its two steps gives the same final state
    alone = [arrays[0][:2, :1], arrays[1], arrays[2][:, :1]]
    y0, hy0, _, _ = rnn_forward(*alone, **dict(kw, lengths=None))
    assert_close(hy[:, :1], hy0, rtol=1e-12, atol=1e-14, name="final state")
    assert_close(y[:2, :1], y0, rtol=1e-12, atol=1e-14, name="output")


def test_twin_clip_bounds_the_cell_state_where_it_is_read():
    """cuDNN's clip (seen on a GPU): a step reads its cell state clipped, so an initial cell state beyond the bounds
    acts as the bound itself, clipping changes the result, and the cell state returned is not clipped."""
    arrays, kw, _ = _twin_case(TWIN_CASES["lstm_clip_lengths"])
    lo, hi = kw["clip"]
    far = [a.copy() for a in arrays]
    far[3] = np.where(arrays[3] > 0, 5.0, -5.0)
    at_bounds = [a.copy() for a in arrays]
    at_bounds[3] = np.where(arrays[3] > 0, np.float32(hi), np.float32(lo))  # cuDNN's bounds are floats
    y_far, hy_far, _, _ = rnn_forward(*far, **kw)
    y_b, hy_b, _, _ = rnn_forward(*at_bounds, **kw)
    assert_close(y_far, y_b, rtol=1e-14, atol=1e-15, name="output")
    assert_close(hy_far, hy_b, rtol=1e-14, atol=1e-15, name="final state")
    y_free = rnn_forward(*far, **dict(kw, clip=None))[0]
    assert not np.allclose(y_free, y_far)
    big = [a * (4 if i == 1 else 1) for i, a in enumerate(arrays)]  # large gates: the raw cell state leaves them
    cy = rnn_forward(*big, **dict(kw, lengths=None))[2]
    assert cy.min() < lo or cy.max() > hi


# -- nd.RNN on the cpu -------------------------------------------------------------------------------------------

def _nd_args(z, dtype="float64"):
    a = [nd.array(z["x"], dtype=dtype), nd.array(z["params"], dtype=dtype), nd.array(z["hx"], dtype=dtype)]
    if "cx" in z:
        a.append(nd.array(z["cx"], dtype=dtype))
    return a


@pytest.mark.parametrize("name", CASES)
def test_nd_rnn_matches_mxnet_forward(name):
    z = _fixture(name)
    mode, bidir = _split(name)
    outs = nd.RNN(*_nd_args(z), state_size=H, num_layers=LAYERS, bidirectional=bidir, mode=mode,
                  state_outputs=True)
    assert len(outs) == (3 if mode == "lstm" else 2)
    for o, k in zip(outs, ("y", "hy", "cy")):
        assert_close(o, z[k], rtol=1e-5, atol=1e-7, name=f"{name} {k}")
    y = nd.RNN(*_nd_args(z, "float32"), state_size=H, num_layers=LAYERS, bidirectional=bidir, mode=mode)
    assert isinstance(y, dnnbind.NDArray) and y.dtype == np.float32
    assert_close(y, z["y"], rtol=1e-5, atol=1e-6, name=f"{name} float32")


def test_nd_rnn_gradient_of_the_output_is_the_twins():
    z = _fixture("lstm_bi")
    args = _nd_args(z)
    for a in args:
        a.attach_grad()
    with autograd.record():
        y = nd.RNN(*args, state_size=H, num_layers=LAYERS, bidirectional=True, mode="lstm")
    y.backward(nd.array(z["dy"], dtype="float64"))
    got = _twin(dict(z, dhy=np.zeros_like(z["dhy"]), dcy=np.zeros_like(z["dcy"])), "lstm", True)
    for a, k in zip(args, ("dx", "dparams", "dhx", "dcx")):
        assert_close(a.grad, got[k], rtol=1e-10, atol=1e-12, name=k)


def test_nd_rnn_sequence_length_positional_and_keyword():
    z = _fixture("gru_bi_lengths")
    kw = {"state_size": H, "num_layers": LAYERS, "bidirectional": True, "mode": "gru", "use_sequence_length": True}
    y1 = nd.RNN(*_nd_args(z), nd.array(z["lengths"]), **kw)  # MXNet's positional order: no state_cell slot
    x, w, h = _nd_args(z)
    y2 = nd.RNN(data=x, parameters=w, state=h, sequence_length=nd.array(z["lengths"], dtype="int32"), **kw)
    assert_close(y1, z["y"], rtol=1e-10, atol=1e-12, name="positional")
    assert_close(y2, z["y"], rtol=1e-10, atol=1e-12, name="keyword")


def test_nd_rnn_dropout_between_layers_in_training_only():
    arrays, _kw, _ = _twin_case(TWIN_CASES["relu_dropout"])
    args = [nd.array(a, dtype="float64") for a in arrays]
    params = {"state_size": 2, "num_layers": 3, "bidirectional": True, "mode": "rnn_relu"}
    plain = nd.RNN(*args, **params).numpy()
    assert_close(nd.RNN(*args, p=0.4, **params), plain, rtol=0, atol=0, name="predict mode")
    with autograd.train_mode():
        nd.random.seed(5)
        a = nd.RNN(*args, p=0.4, **params).numpy()
        nd.random.seed(5)
        b = nd.RNN(*args, p=0.4, **params).numpy()
        c = nd.RNN(*args, p=0.4, **params).numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, c) and not np.allclose(a, plain)


def test_symbol_outputs_and_shapes_are_mxnets():
    # MXNet 1.9.1: list_arguments/list_outputs/infer_shape of sym.RNN
    s = sym.RNN(sym.var("data"), state_size=4, num_layers=1, mode="lstm", name="rnn")
    assert s.list_arguments() == ["data", "rnn_parameters", "rnn_state", "rnn_state_cell"]
    assert s.list_outputs() == ["rnn_output"]
    s = sym.RNN(sym.var("data"), state_size=4, num_layers=1, mode="gru", state_outputs=True, name="rnn")
    assert s.list_arguments() == ["data", "rnn_parameters", "rnn_state"]
    assert s.list_outputs() == ["rnn_output", "rnn_state_output"]
    s = sym.RNN(sym.var("data"), state_size=4, num_layers=2, mode="lstm", bidirectional=True, state_outputs=True,
                name="rnn")
    assert s.list_outputs() == ["rnn_output", "rnn_state_output", "rnn_statecell_output"]
    assert s.infer_shape(data=(5, 3, 6)) == ([(5, 3, 6), (832,), (4, 3, 4), (4, 3, 4)],
                                             [(5, 3, 8), (4, 3, 4), (4, 3, 4)], [])
    s = sym.RNN(sym.var("data"), state_size=4, num_layers=2, mode="lstm", bidirectional=True, state_outputs=True,
                projection_size=2, name="rnn")
    assert s.infer_shape(data=(5, 3, 6)) == ([(5, 3, 6), (608,), (4, 3, 2), (4, 3, 4)],
                                             [(5, 3, 4), (4, 3, 2), (4, 3, 4)], [])
    s = sym.RNN(sym.var("data"), state_size=4, num_layers=1, mode="gru", use_sequence_length=True, name="rnn")
    assert s.list_arguments() == ["data", "rnn_parameters", "rnn_state", "rnn_sequence_length"]
    assert s.infer_shape(data=(5, 3, 6))[0][3] == (3,)


def _bad(**over):
    rng = np.random.default_rng(0)
    a = {"data": rng.uniform(size=(3, 2, 4)), "parameters": rng.uniform(size=param_size("lstm", 1, 4, 3)),
             "state": np.zeros((1, 2, 3)), "state_cell": np.zeros((1, 2, 3))}
    p = {"state_size": 3, "num_layers": 1, "mode": "lstm"}
    for k, v in over.items():
        (a if k in ("data", "parameters", "state", "state_cell", "sequence_length") else p)[k] = v
    return {k: (nd.array(v, dtype=v.dtype if isinstance(v, np.ndarray) and v.dtype.kind == "i" else "float32")
                if isinstance(v, np.ndarray) else v) for k, v in a.items() if v is not None}, p


@pytest.mark.parametrize("over,err,match", [
    ({"data": np.zeros((3, 4))}, ValueError, r"RNN: data must be 3-D .* got shape \(3, 4\)"),
    ({"state": np.zeros((2, 2, 3))}, ValueError, r"RNN: state has shape \(2, 2, 3\); expected \(1, 2, 3\)"),
    ({"state_cell": np.zeros((1, 3, 3))}, ValueError, r"RNN: state_cell has shape \(1, 3, 3\); expected"),
    ({"parameters": np.zeros(7)}, ValueError, r"RNN: parameters has shape \(7,\); expected \(108,\)"),
    ({"state_cell": None}, TypeError, r"RNN: mode='lstm' needs state_cell"),
    ({"mode": "gru", "state_cell": None, "projection_size": 2}, ValueError,
     "projection_size is only supported for mode"),
    ({"projection_size": 4}, ValueError, "projection_size must be between 1 and state_size"),
    ({"lstm_state_clip_min": -1.0}, ValueError, "must be specified together"),
    ({"lstm_state_clip_min": 1.0, "lstm_state_clip_max": 0.5}, ValueError, "greater or equal"),
    ({"mode": "gru", "state_cell": None, "lstm_state_clip_min": -1.0, "lstm_state_clip_max": 1.0}, ValueError,
     "only supported for mode='lstm'"),
    ({"use_sequence_length": True}, TypeError, r"use_sequence_length=True needs sequence_length"),
    ({"sequence_length": np.array([3, 2])}, ValueError, "use_sequence_length is False"),
    ({"use_sequence_length": True, "sequence_length": np.array([3, 2, 1])}, ValueError,
     r"sequence_length has shape \(3,\); expected \(2,\)"),
    ({"use_sequence_length": True, "sequence_length": np.array([3, 0])}, ValueError,
     r"sequence_length\[1\] is 0; every length must be between 1 and"),
    ({"use_sequence_length": True, "sequence_length": np.array([4, 1])}, ValueError, "between 1 and the data's"),
    ({"p": 1.0}, ValueError, r"RNN: p must be in \[0, 1\)"),
    ({"state_size": 0}, ValueError, "state_size and num_layers must be at least 1"),
])
def test_bad_inputs_are_refused(over, err, match):
    a, p = _bad(**over)
    with pytest.raises(err, match=match):
        nd.RNN(**a, **p)


def test_mixed_dtypes_and_integer_data_are_refused():
    a, p = _bad()
    a["state"] = a["state"].astype("float64")
    with pytest.raises(TypeError, match="RNN: state is float64 but data is float32"):
        nd.RNN(**a, **p)
    a, p = _bad()
    a["data"] = a["data"].astype("int32")
    with pytest.raises(TypeError, match="RNN: data must be a floating-point array"):
        nd.RNN(**a, **p)


# -- the cuDNN 9 prototypes -------------------------------------------------------------------------------------

RNN_FUNCS = ["cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor", "cudnnSetRNNDescriptor_v8",
             "cudnnRNNSetClip_v8", "cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor",
             "cudnnSetRNNDataDescriptor", "cudnnGetRNNWeightSpaceSize", "cudnnGetRNNWeightParams",
             "cudnnGetRNNTempSpaceSizes", "cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"]


@pytest.mark.parametrize("name", RNN_FUNCS)
def test_rnn_prototypes_match_cudnn_adv_header(name):
    from dnnbind._lib import cudnn
    found = re.findall(rf"\b{name}\s*\(([^()]*)\)\s*;", cudnn_header("adv"))
    assert found, f"{name} is not declared in cudnn_adv.h"
    params = [p for p in found[-1].split(",") if p.strip()]
    _restype, argtypes = cudnn._TABLE[name]
    assert [c_param_kind(p) for p in params] == [ctypes_arg_kind(t) for t in argtypes]


def test_rnn_enums_match_cudnn_adv_header():
    from dnnbind._lib import cudnn
    text = cudnn_header("adv")
    for enum in ("CUDNN_RNN_ALGO_STANDARD", "CUDNN_FWD_MODE_TRAINING", "CUDNN_LSTM", "CUDNN_GRU", "CUDNN_RNN_RELU",
                 "CUDNN_RNN_DOUBLE_BIAS", "CUDNN_BIDIRECTIONAL", "CUDNN_LINEAR_INPUT", "CUDNN_RNN_CLIP_MINMAX",
                 "CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED", "CUDNN_WGRAD_MODE_ADD"):
        m = re.search(rf"\b{enum}\s*=\s*(\d+)", text)
        assert m and int(m.group(1)) == getattr(cudnn, enum), enum
    assert re.search(r"#define CUDNN_RNN_PADDED_IO_ENABLED \(1U << 0\)", text)


# -- GPU: the cuDNN lowering against the twin ---------------------------------------------------------------------

GPU_CASES = [(m, bidir, layers, proj, lengths)
             for m in ("rnn_relu", "rnn_tanh", "lstm", "gru") for bidir in (False, True) for layers in (1, 2)
             for proj, lengths in ((None, None), (None, [4, 1, 3]))] + [
    ("lstm", False, 2, 2, None), ("lstm", True, 2, 2, [2, 4, 1]), ("lstm", True, 1, 3, None)]


def _gpu_ids(case):
    m, bidir, layers, proj, lengths = case
    return f"{m}-{'bi' if bidir else 'uni'}-L{layers}{f'-P{proj}' if proj else ''}{'-len' if lengths else ''}"


def _lowering_call(dev, arrays, params, train, dtype):
    """Run the gpu and cpu lowerings directly (so the state head gradients reach the backward) and return both
    results: outputs and every input gradient."""
    op = nd.REGISTRY["RNN"]
    d = op.opdef
    p = op.schema.parse(params)
    res = {}
    rng = np.random.default_rng(11)
    for kind, ctx in (("cpu", dnnbind.cpu()), ("gpu", dev)):
        xs = [None if a is None else nd.array(a, ctx=ctx, dtype=dtype if a.dtype.kind == "f" and i < 4 else None)
              for i, a in enumerate(arrays)]
        geo = d.prepare(p, *xs)
        c = Call(geo, p, ctx, train)
        low = d.gpu if kind == "gpu" else d.cpu
        host = xs if kind == "gpu" else [None if x is None else x.numpy() for x in xs]
        outs, saved = low.forward(c, *host)
        outs = outs if isinstance(outs, tuple) else (outs,)
        heads = [rng.uniform(0.5, 1.5, o.shape) for o in outs]
        rng = np.random.default_rng(11)  # the same heads on both
        hd = [nd.array(h, ctx=ctx, dtype=dtype) if kind == "gpu" else h.astype(dtype) for h in heads]
        needs = tuple(x is not None and i < 4 for i, x in enumerate(xs))
        grads = low.backward(c, saved, Grads(needs, (None,) * len(xs), True), tuple(hd))
        as_np = lambda a: None if a is None else (a.numpy() if hasattr(a, "numpy") else np.asarray(a))
        res[kind] = ([as_np(o) for o in outs], [as_np(g) for g in grads])
    return res


def _gpu_arrays(case, rng):
    m, bidir, layers, proj, lengths = case
    t, n, c, h = 4, 3, 5, 4
    d = 2 if bidir else 1
    pp = proj or h
    arrays = [rng.uniform(-1, 1, (t, n, c)), rng.uniform(-0.5, 0.5, param_size(m, layers, c, h, bidir, proj)),
              rng.uniform(-0.5, 0.5, (layers * d, n, pp)),
              rng.uniform(-0.5, 0.5, (layers * d, n, h)) if m == "lstm" else None,
              None if lengths is None else np.asarray(lengths, np.int32)]
    params = {"mode": m, "state_size": h, "num_layers": layers, "bidirectional": bidir, "state_outputs": True}
    if proj:
        params["projection_size"] = proj
    if lengths is not None:
        params["use_sequence_length"] = True
    return arrays, params


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", GPU_CASES, ids=_gpu_ids)
def test_gpu_matches_the_twin(case, dtype, gpu):
    arrays, params = _gpu_arrays(case, np.random.default_rng(3))
    with dnnbind.math_scope("fp32"):
        res = _lowering_call(gpu, arrays, params, True, dtype)
    tol = 2e-5 if dtype == "float32" else 1e-10
    for k, (g, c) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        assert_close(g, c, rtol=tol, atol=tol, name=f"{_gpu_ids(case)} output {k}")
    for k, (g, c) in enumerate(zip(res["gpu"][1], res["cpu"][1])):
        if c is not None:
            assert_close(g, c, rtol=10 * tol, atol=10 * tol, name=f"{_gpu_ids(case)} gradient of input {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPU_CASES[i] for i in (0, 5, 10, 16, 22, -2, -1)], ids=_gpu_ids)
def test_gpu_float16_and_tf32_are_close(case, gpu):
    arrays, params = _gpu_arrays(case, np.random.default_rng(4))
    res = _lowering_call(gpu, arrays, params, True, "float16")
    for k, (g, c) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        assert_close(g.astype(np.float32), c.astype(np.float32), rtol=2e-2, atol=1e-2, name=f"float16 output {k}")
    for k, (g, c) in enumerate(zip(res["gpu"][1], res["cpu"][1])):
        if c is not None:
            assert_close(g.astype(np.float32), c.astype(np.float32), rtol=5e-2, atol=3e-2, name=f"float16 grad {k}")
    with dnnbind.math_scope("tf32"):
        res = _lowering_call(gpu, arrays, params, True, "float32")
    for k, (g, c) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        assert_close(g, c, rtol=5e-3, atol=5e-3, name=f"tf32 output {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPU_CASES[i] for i in (6, 13, 30, -2)], ids=_gpu_ids)
def test_gpu_inference_and_training_modes_agree(case, gpu):
    """Inference (predict mode, no reserve) and training forwards give the same values; a backward after an
    inference forward (record(train_mode=False)) re-runs the forward in training mode for its reserve."""
    arrays, params = _gpu_arrays(case, np.random.default_rng(5))
    train = _lowering_call(gpu, arrays, params, True, "float32")
    infer = _lowering_call(gpu, arrays, params, False, "float32")
    for a, b in zip(train["gpu"][0] + train["gpu"][1], infer["gpu"][0] + infer["gpu"][1]):
        if a is not None:
            assert_close(a, b, rtol=1e-6, atol=1e-6, name="inference vs training")


@pytest.mark.gpu
def test_gpu_through_nd_and_autograd(gpu):
    z = _fixture("lstm_bi")
    for ctx in (dnnbind.cpu(), gpu):
        args = [a.as_in_context(ctx) for a in _nd_args(z, "float32")]
        for a in args:
            a.attach_grad()
        with autograd.record():
            y, _hy, cy = nd.RNN(*args, state_size=H, num_layers=LAYERS, bidirectional=True, mode="lstm",
                               state_outputs=True)
        y.backward(nd.array(z["dy"], ctx=ctx))
        assert_close(y, z["y"], rtol=1e-5, atol=1e-6, name=f"{ctx} y")
        assert_close(cy, z["cy"], rtol=1e-5, atol=1e-6, name=f"{ctx} cy")
        if ctx.kind == "cpu":
            grads = [a.grad.numpy() for a in args]
        else:
            for a, g in zip(args, grads):
                assert_close(a.grad, g, rtol=1e-4, atol=1e-5, name="gpu gradient")


@pytest.mark.gpu
def test_gpu_dropout_between_layers(gpu):
    rng = np.random.default_rng(6)
    arrays, params = _gpu_arrays(("gru", True, 3, None, None), rng)
    args = [nd.array(a, ctx=gpu) for a in arrays[:3]]
    params = dict(params, state_outputs=False, p=0.5)
    plain = nd.RNN(*args, **params).numpy()
    for a in args:
        a.attach_grad()
    with autograd.record():
        nd.random.seed(1)
        y1 = nd.RNN(*args, **params)
    y1.backward()
    y2 = None
    with autograd.train_mode():
        nd.random.seed(1)
        y2 = nd.RNN(*args, **params).numpy()
        y3 = nd.RNN(*args, **params).numpy()
    assert np.isfinite(args[1].grad.numpy()).all()
    assert not np.allclose(y1.numpy(), plain) and np.array_equal(y1.numpy(), y2) and not np.array_equal(y2, y3)


@pytest.mark.gpu
@pytest.mark.parametrize("replay", ["graph", "host"])
def test_gpu_rnn_in_a_captured_step(replay, gpu):
    from dnnbind.graph import REPLAYS
    z = _fixture("lstm_bi")
    args = [a.as_in_context(gpu) for a in _nd_args(z, "float32")]
    w = args[1]
    w.attach_grad()
    dy = nd.array(z["dy"], ctx=gpu)  # (no host-to-device copy inside a capture)

    def step():
        with autograd.record():
            y = nd.RNN(*args, state_size=H, num_layers=LAYERS, bidirectional=True, mode="lstm")
        y.backward(dy)
        return w.grad * 1.0

    eager = step().numpy()
    replayed = REPLAYS[replay](step, inputs=args, warmup=1)
    assert_close(replayed().numpy(), eager, rtol=1e-6, atol=1e-7, name=f"{replay} replay")


@pytest.mark.gpu
def test_gpu_weight_space_map(gpu, capsys):
    """Reports how MXNet's vector lies in cuDNN 9's weight space (the copies per call; identity: none)."""
    from dnnbind.ops._common import dnn
    from dnnbind.ops.defs import rnn as R
    op = nd.REGISTRY["RNN"]
    lines = []
    for case in (("rnn_tanh", False, 1, None, None), ("lstm", True, 2, None, None), ("gru", False, 2, None, None),
                 ("lstm", True, 2, 2, None)):
        arrays, params = _gpu_arrays(case, np.random.default_rng(0))
        xs = [None if a is None else nd.array(a, ctx=gpu) for a in arrays]
        p = op.schema.parse(params)
        plan = R._plan(Call(op.opdef.prepare(p, *xs), p, gpu, False), dnn(xs[0]))
        lines.append(f"{_gpu_ids(case)}: weight space {plan.wbytes} B, MXNet's vector {arrays[1].size * 4} B, "
                     f"identity {plan.identity}, {len(plan.segments)} copies: {plan.segments[:6]}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.gpu
def test_gpu_weight_copy_path(gpu, monkeypatch):
    """The copy path (for a cuDNN whose weight space is not MXNet's vector; 9.19 needs none): the same results
    with the weights copied into a weight space of their own, piece by piece, and the gradient copied back."""
    from dnnbind.ops.defs import rnn as R
    arrays, params = _gpu_arrays(("lstm", True, 2, 2, [2, 4, 1]), np.random.default_rng(8))
    direct = _lowering_call(gpu, arrays, params, True, "float32")["gpu"]
    real = R._weight_map

    def split(c, h, desc, wbytes):  # every piece its own segment, never the identity
        out = []
        for src, dst, n in real(c, h, desc, wbytes)[0]:
            cut = list(range(0, n, 7)) + [n]
            out += [(src + a, dst + a, b - a) for a, b in itertools.pairwise(cut)]
        return tuple(out), False

    monkeypatch.setattr(R, "_weight_map", split)
    monkeypatch.setattr(R, "_plans", {})
    copied = _lowering_call(gpu, arrays, params, True, "float32")["gpu"]
    for a, b in zip(direct[0] + direct[1], copied[0] + copied[1]):
        if a is not None:
            assert_close(b, a, rtol=0, atol=0, name="copied weights")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("lengths", [None, [3, 4, 1]], ids=["full", "lengths"])
def test_gpu_clip_matches_the_twin(lengths, dtype, gpu):
    """cudnnRNNSetClip_v8 against the twin's clip (the cell state bounded where a step reads it), both directions,
    with an initial cell state partly beyond the bounds."""
    arrays, params = _gpu_arrays(("lstm", True, 2, None, lengths), np.random.default_rng(9))
    arrays[1] = arrays[1] * 3
    arrays[3] = arrays[3] * 3
    params = dict(params, lstm_state_clip_min=-0.4, lstm_state_clip_max=0.5)
    with dnnbind.math_scope("fp32"):
        res = _lowering_call(gpu, arrays, params, True, dtype)
    tol = 2e-5 if dtype == "float32" else 1e-10
    for k, (g, c) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        assert_close(g, c, rtol=tol, atol=tol, name=f"clip output {k}")
    for k, (g, c) in enumerate(zip(res["gpu"][1], res["cpu"][1])):
        if c is not None:
            assert_close(g, c, rtol=10 * tol, atol=10 * tol, name=f"clip gradient of input {k}")


def test_final_states_leave_the_graph_with_the_output():
    """After a backward through the output alone, the final states are free arrays again (MXNet frees the whole
    node): writable in place, no longer taped."""
    from dnnbind import autograd
    rng = np.random.default_rng(7)
    t, n, c, h = 3, 2, 4, 5
    w = nd.array(rng.uniform(-0.3, 0.3, 4 * h * (c + h) + 8 * h))
    x = nd.array(rng.standard_normal((t, n, c)))
    h0, c0 = nd.zeros((1, n, h)), nd.zeros((1, n, h))
    w.attach_grad()
    with autograd.record():
        y, hy, cy = nd.RNN(x, w, h0, c0, state_size=h, num_layers=1, mode="lstm", state_outputs=True)
        loss = (y * y).sum()
    assert autograd.in_graph(hy) and autograd.in_graph(cy)
    loss.backward()
    assert not autograd.in_graph(hy) and not autograd.in_graph(cy)
    with autograd.record():
        hy[:] = 0  # no GraphWriteError: the node is freed
    assert float(hy.abs().sum().asscalar()) == 0.0
