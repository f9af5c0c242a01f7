"""``gluon.rnn`` and ``gluon.contrib.rnn`` against MXNet 1.9.1 (fixtures written by the real MXNet:
tests/fixtures/make_mxnet_gluon_rnn.py, cases in tests/fixtures/mxnet_gluon_rnn/cases.py).

Per case: the same Parameter names (collect_params, relative to the Block's own global-counter prefix) and
save_parameters keys; MXNet's file loads and reproduces the outputs and the gradients of x, of the begin states and
of every Parameter; dnnbind's file has MXNet's keys (and, where /tmp/mx/bin/python exists, loads into MXNet and
reproduces the outputs there). Then: what calls return, begin_state shapes, deferred input_size, errors that name
the argument, the sequence helpers' fallbacks, and GPU runs (``@pytest.mark.gpu``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as mx
from dnnbind import autograd, nd
from dnnbind.gluon import contrib, rnn
from dnnbind.gluon.parameter import DeferredInitializationError
from dnnbind.gluon.rnn import rnn_cell

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "mxnet_gluon_rnn")
GEN = os.path.join(HERE, "fixtures", "make_mxnet_gluon_rnn.py")
MXNET_PYTHON = "/tmp/mx/bin/python"
sys.path.insert(0, FIX)
import cases  # noqa: E402

with open(os.path.join(FIX, "manifest.json")) as _f:
    MANIFEST = json.load(_f)

CELL_CASES = [c for c in cases.CASES if cases.CASES[c]["kind"] != "layer"]
LAYER_CASES = [c for c in cases.CASES if cases.CASES[c]["kind"] == "layer"]


def _root(prefix: str) -> str:
    """The global-counter part of a prefix ('lstm3_' of 'lstm3_zoneout'), '' when the prefix was given."""
    m = re.match(r"[a-z]+\d+_", prefix)
    return m.group() if m else ""


def _close(got, want, what, rtol=1e-5, atol=1e-6):
    got = got.asnumpy() if hasattr(got, "asnumpy") else np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, MXNet {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    tol = atol + rtol * np.abs(want)
    if not (err <= tol).all():
        i = np.unravel_index(np.argmax(err - tol), err.shape)
        raise AssertionError(f"{what}: max |err| {err.max():.3g} (tolerance {atol} + {rtol}*|want|), first bad index "
                             f"{i}: {got[i]} vs MXNet {want[i]}")


def _loaded(case, ctx=None):
    """The case's Block with MXNet's Parameters loaded (and its fixture arrays)."""
    net = cases.build(mx, case)
    net.load_parameters(os.path.join(FIX, case + ".save_parameters.bin"), ctx=ctx)
    return net, np.load(os.path.join(FIX, case + ".npz"))


def _states(ref):
    return [ref[f"state{k}"] for k in range(8) if f"state{k}" in ref] or None


def _run(case, net, ref, ctx=None, record=True):
    """Call the Block the case's way under autograd.record (train mode as the fixture); returns (out, x, states)."""
    spec = cases.CASES[case]
    ctx = ctx or dnnbind.cpu()
    x = nd.array(ref["x"], ctx=ctx)
    states = [nd.array(s, ctx=ctx) for s in _states(ref)] if _states(ref) else None
    valid = nd.array(ref["valid"], ctx=ctx) if "valid" in ref else None
    if not record:
        with autograd.train_mode() if spec.get("train", True) else autograd.predict_mode():
            return cases.run(mx, case, net, x, states, valid), x, states
    x.attach_grad()
    for s in states or []:
        s.attach_grad()
    with autograd.record(train_mode=spec.get("train", True)):
        out = cases.run(mx, case, net, x, states, valid)
    return out, x, states


def _backward(case, out, ref):
    flat = cases.flatten(out)
    with autograd.record(train_mode=cases.CASES[case].get("train", True)):
        loss = nd.add_n(*[(o * nd.array(ref[f"head{k}"], ctx=o.context)).sum() for k, o in enumerate(flat)])
    loss.backward()


# -- names, keys, files -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in cases.CASES])
def test_parameter_names_and_keys_are_mxnets(case):
    want = MANIFEST[case]
    net = cases.build(mx, case)
    root, want_root = _root(net.prefix), _root(want["prefix"])
    assert re.sub(r"\d+", "", root) == re.sub(r"\d+", "", want_root), (net.prefix, want["prefix"])
    names = [want_root + k[len(root):] if root and k.startswith(root) else k for k in net.collect_params()]
    assert names == want["collect_params"]
    assert sorted(net._collect_params_with_prefix()) == want["save_keys"]


ORACLE = [pytest.param(c, id=c) for c in cases.CASES if cases.CASES[c].get("oracle", True)]
GRADS = [pytest.param(c, id=c) for c in cases.CASES
         if cases.CASES[c].get("oracle", True) and cases.CASES[c].get("grad", True)]


@pytest.mark.parametrize("case", ORACLE)
def test_mxnet_file_loads_and_reproduces_outputs(case):
    net, ref = _loaded(case)
    want = MANIFEST[case]
    out, _, _ = _run(case, net, ref, record=False)
    assert cases.structure(out) == want["structure"]
    flat = cases.flatten(out)
    assert len(flat) == len([k for k in ref.files if k.startswith("out")])
    for k, o in enumerate(flat):
        _close(o, ref[f"out{k}"], f"{case} out{k}")
    assert repr(net) == want["repr"]


@pytest.mark.parametrize("case", GRADS)
def test_gradients_are_mxnets(case):
    """Gradients of x, of the begin states and of every Parameter, for sum(out_k * head_k) over every output."""
    net, ref = _loaded(case)
    out, x, states = _run(case, net, ref)
    for k, o in enumerate(cases.flatten(out)):  # the recorded forward is the same
        _close(o, ref[f"out{k}"], f"{case} out{k}")
    _backward(case, out, ref)
    _close(x.grad, ref["dx"], f"{case} d(x)", atol=1e-5)
    for k, s in enumerate(states or []):
        _close(s.grad, ref[f"dstate{k}"], f"{case} d(state{k})", atol=1e-5)
    for key, p in net._collect_params_with_prefix().items():
        _close(p.grad(), ref["grad:" + key], f"{case} d({key})", atol=1e-5)


@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in cases.CASES])
def test_begin_state_shapes(case):
    net = cases.build(mx, case)
    got = [list(s.shape) for s in net.begin_state(batch_size=2)]
    assert got == MANIFEST[case]["begin_state"]
    assert [list(s.shape) for s in net.begin_state(2)] == got  # positionally too (MXNet's modifier cells differ)


def _save_all(folder, names, own_values=False):
    """Each case's Block saved by dnnbind: with MXNet's values, or (own_values) with new seeded values, beside
    the fixture's inputs and dnnbind's outputs for them (``<case>.npz``, what --check compares MXNet with)."""
    for k, case in enumerate(names):
        net, ref = _loaded(case)
        if own_values:
            rng = np.random.RandomState(1000 + k)
            for key, p in sorted(net._collect_params_with_prefix().items()):
                p.set_data(rng.uniform(-0.5, 0.5, p.shape).astype(np.float32))
            out, _, _ = _run(case, net, ref, record=False)
            arrays = {key: ref[key] for key in ref.files if key == "x" or key == "valid" or key.startswith("state")}
            arrays.update({f"out{i}": o.asnumpy() for i, o in enumerate(cases.flatten(out))})
            np.savez(os.path.join(folder, case + ".npz"), **arrays)
        net.save_parameters(os.path.join(folder, case + ".save_parameters.bin"))


def test_dnnbind_files_have_mxnets_keys_and_values(tmp_path):
    from dnnbind import serialization
    _save_all(tmp_path, cases.CASES)
    for case in cases.CASES:
        mine = serialization.load(os.path.join(tmp_path, case + ".save_parameters.bin"))
        theirs = serialization.load(os.path.join(FIX, case + ".save_parameters.bin"))
        assert sorted(mine) == sorted(theirs) == MANIFEST[case]["save_keys"]
        for k in mine:
            np.testing.assert_array_equal(np.asarray(mine[k]), np.asarray(theirs[k]))


@pytest.mark.skipif(not os.path.exists(MXNET_PYTHON), reason="the real MXNet (/tmp/mx/bin/python) is not here")
def test_dnnbind_files_load_into_mxnet(tmp_path):
    """Files dnnbind writes, with values of its own, load (strictly) into MXNet 1.9.1's Blocks, which then give
    dnnbind's outputs (1e-5)."""
    _save_all(tmp_path, list(cases.CASES), own_values=True)
    res = subprocess.run([MXNET_PYTHON, GEN, "--check", str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert res.stdout.count(" ok ") == len(os.listdir(tmp_path)) // 2, res.stdout


# -- what calls return ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [rnn.RNN, rnn.LSTM, rnn.GRU])
def test_layer_returns_output_alone_without_states_and_pair_with_states(layer):
    net = layer(4, num_layers=2)
    net.initialize()
    x = nd.array(np.random.RandomState(0).rand(3, 2, 5).astype(np.float32))
    out = net(x)
    assert isinstance(out, nd.NDArray) and out.shape == (3, 2, 4)
    begin = net.begin_state(batch_size=2)
    out2, states = net(x, begin)
    assert isinstance(out2, nd.NDArray) and isinstance(states, list) and len(states) == len(begin)
    assert all(s.shape == (2, 2, 4) for s in states)
    np.testing.assert_allclose(out2.asnumpy(), out.asnumpy(), rtol=1e-6)
    if layer is not rnn.LSTM:  # one array is one state
        out3, states3 = net(x, begin[0])
        assert isinstance(states3, list) and len(states3) == 1


def test_cell_step_and_unroll_return_types():
    cell = rnn.GRUCell(4)
    cell.initialize()
    x = nd.ones((2, 3, 5))
    outs, states = cell.unroll(3, x, merge_outputs=False)
    assert isinstance(outs, list) and len(outs) == 3 and outs[0].shape == (2, 4)
    out, states = cell.unroll(3, x, merge_outputs=True)
    assert out.shape == (2, 3, 4) and isinstance(states, list) and states[0].shape == (2, 4)
    out, states = cell.unroll(3, nd.swapaxes(x, dim1=0, dim2=1), layout="TNC", merge_outputs=True)
    assert out.shape == (3, 2, 4)
    step, new = cell(nd.ones((2, 5)), cell.begin_state(2))
    assert step.shape == (2, 4) and isinstance(new, list)


# -- deferred input_size ----------------------------------------------------------------------------------------

def test_cell_infers_input_size_on_first_step():
    cell = rnn.LSTMCell(3)
    assert cell.i2h_weight.shape == (12, 0) and cell.h2h_weight.shape == (12, 3)
    cell.initialize()
    with pytest.raises(DeferredInitializationError):
        cell.i2h_weight.data()
    cell(nd.ones((2, 7)), cell.begin_state(2))
    assert cell.i2h_weight.shape == (12, 7) and repr(cell) == "LSTMCell(7 -> 12)"
    given = contrib.rnn.LSTMPCell(3, 2, input_size=5)
    given.initialize()
    assert given.i2h_weight.data().shape == (12, 5) and given.h2r_weight.data().shape == (2, 3)


def test_layer_infers_input_size_of_first_layer_only():
    net = rnn.LSTM(4, num_layers=2, bidirectional=True, layout="NTC")
    assert net.l0_i2h_weight.shape == (16, 0) and net.r0_i2h_weight.shape == (16, 0)
    assert net.l1_i2h_weight.shape == (16, 8)
    net.initialize()
    net(nd.ones((2, 3, 6)))
    assert net.l0_i2h_weight.shape == (16, 6) and net.r0_i2h_weight.shape == (16, 6)
    assert repr(net) == "LSTM(6 -> 4, NTC, num_layers=2, bidirectional)"


def test_lstm_state_clip_reaches_the_operator():
    """MXNet's cpu ignores the clip (no oracle; the semantics are nd.RNN's, cuDNN's): bounds the cell state reaches
    change the output, bounds it never reaches change nothing."""
    x = nd.array(np.random.RandomState(3).uniform(-2, 2, (4, 2, 5)).astype(np.float32))
    free = rnn.LSTM(4, input_size=5, prefix="same_")
    free.initialize(mx.init.Uniform(1.0))
    out_free = free(x).asnumpy()
    for lo, hi, binds in ((-0.1, 0.1, True), (-100.0, 100.0, False)):
        net = rnn.LSTM(4, input_size=5, state_clip_min=lo, state_clip_max=hi, params=free.collect_params())
        assert net.l0_i2h_weight is free.l0_i2h_weight
        assert np.allclose(net(x).asnumpy(), out_free) != binds, (lo, hi)


def test_layer_parameter_shapes_with_projection():
    net = rnn.LSTM(4, num_layers=2, projection_size=3, input_size=5)
    shapes = {k: p.shape for k, p in net._reg_params.items()}
    assert shapes == {"l0_i2h_weight": (16, 5), "l0_h2h_weight": (16, 3), "l0_i2h_bias": (16,),
                      "l0_h2h_bias": (16,), "l0_h2r_weight": (3, 4), "l1_i2h_weight": (16, 3),
                      "l1_h2h_weight": (16, 3), "l1_i2h_bias": (16,), "l1_h2h_bias": (16,), "l1_h2r_weight": (3, 4)}


def test_initializer_defaults():
    cell = rnn.RNNCell(3, input_size=2)
    cell.initialize(mx.init.One())
    assert (cell.i2h_weight.data().asnumpy() == 1).all() and (cell.i2h_bias.data().asnumpy() == 0).all()
    layer = rnn.GRU(3, input_size=2, h2h_bias_initializer="ones")
    layer.initialize()
    assert (layer.l0_i2h_bias.data().asnumpy() == 0).all() and (layer.l0_h2h_bias.data().asnumpy() == 1).all()


# -- errors -------------------------------------------------------------------------------------------------------

def test_bad_layout_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"layout 'NCT'.*'TNC' or 'NTC'"):
        rnn.LSTM(4, layout="NCT")
    with pytest.raises(AssertionError):  # MXNet's assert: code catching that keeps working
        rnn.GRU(4, layout="TCN")
    cell = rnn.RNNCell(3)
    cell.initialize()
    with pytest.raises(ValueError, match=r"layout must be 'NTC' or 'TNC'.*'NT'"):
        cell.unroll(2, nd.ones((2, 2, 3)), layout="NT")


def test_unroll_length_mismatch_names_both():
    cell = rnn.RNNCell(3)
    cell.initialize()
    with pytest.raises(ValueError, match=r"length=4 but inputs of shape \(2, 3, 5\) has 3 steps"):
        cell.unroll(4, nd.ones((2, 3, 5)))
    with pytest.raises(ValueError, match=r"length=2 but inputs is a list of 3 steps"):
        cell.unroll(2, [nd.ones((2, 5))] * 3)


def test_cell_state_errors_name_the_state_and_shapes():
    cell = rnn.LSTMCell(4)
    cell.initialize()
    x = nd.ones((2, 5))
    with pytest.raises(ValueError, match=r"states\[1\] has shape \(2, 3\), expected \(2, 4\)"):
        cell(x, [nd.zeros((2, 4)), nd.zeros((2, 3))])
    with pytest.raises(ValueError, match="expected 2 state"):
        cell(x, [nd.zeros((2, 4))])
    with pytest.raises(ValueError, match="states must be a list"):
        cell(x, nd.zeros((2, 4)))


def test_layer_state_errors_name_the_state_and_shapes():
    net = rnn.LSTM(4, num_layers=2)
    net.initialize()
    x = nd.ones((3, 2, 5))
    good = net.begin_state(2)
    with pytest.raises(ValueError, match=r"Invalid recurrent state shape. Expecting \(2, 2, 4\), got \(1, 2, 4\).*"
                                         r"states\[1\]"):
        net(x, [good[0], nd.zeros((1, 2, 4))])
    with pytest.raises(ValueError, match=r"expected 2 state\(s\) \[h, c\], got 1"):
        net(x, [good[0]])
    with pytest.raises(ValueError, match=r"inputs must be 3-D in layout 'TNC'.*\(2, 5\)"):
        net(nd.ones((2, 5)))
    with pytest.raises(ValueError, match=r"6 features.*input_size 5"):
        net(nd.ones((3, 2, 6)))
    with pytest.raises(ValueError, match="sequence_length"):
        rnn.GRU(4, use_sequence_length=True)(x)


def test_cell_misuse_is_refused():
    bi = rnn.BidirectionalCell(rnn.RNNCell(2), rnn.RNNCell(2))
    with pytest.raises(NotImplementedError, match="unroll"):
        bi(nd.ones((1, 2)), [])
    base = rnn.GRUCell(2)
    rnn.ZoneoutCell(base, 0.1)
    with pytest.raises(AssertionError, match="already modified"):
        rnn.ResidualCell(base)
    with pytest.raises(AssertionError, match="modifier cell instead"):
        base.begin_state(2)
    with pytest.raises(AssertionError, match="doesn't support zoneout"):
        rnn.ZoneoutCell(bi)
    with pytest.raises(ValueError, match="rate must be a number"):
        rnn.DropoutCell("0.5")


# -- the sequence helpers, without nd's Sequence* ops -----------------------------------------------------------

VALID_CASES = [c for c in CELL_CASES if cases.CASES[c].get("valid")]


@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in VALID_CASES])
def test_valid_length_through_the_fallback_helpers(case, monkeypatch):
    monkeypatch.setattr(rnn_cell, "_SEQUENCE_OPS", False)
    net, ref = _loaded(case)
    out, x, states = _run(case, net, ref)
    for k, o in enumerate(cases.flatten(out)):
        _close(o, ref[f"out{k}"], f"{case} out{k}")
    _backward(case, out, ref)
    _close(x.grad, ref["dx"], f"{case} d(x)", atol=1e-5)
    for key, p in net._collect_params_with_prefix().items():
        _close(p.grad(), ref["grad:" + key], f"{case} d({key})", atol=1e-5)


# -- modifier cells in training ---------------------------------------------------------------------------------

def test_zoneout_in_training_keeps_new_or_previous_values():
    base = rnn.GRUCell(6, input_size=3)
    cell = rnn.ZoneoutCell(base, zoneout_outputs=0.5, zoneout_states=0.5)
    cell.initialize(mx.init.Uniform(1.0))
    xs = np.random.RandomState(1).rand(5, 8, 3).astype(np.float32)
    states = cell.begin_state(batch_size=8)
    prev = np.zeros((8, 6), np.float32)
    kept = new = 0
    for x in xs:
        x = nd.array(x)
        with autograd.record():  # training: the masks are live
            out, next_states = cell(x, states)
        fresh, fresh_states = base(x, states)  # what the base cell alone gives from the same states
        out, fresh = out.asnumpy(), fresh.asnumpy()
        is_new, is_old = np.isclose(out, fresh), np.isclose(out, prev)
        assert (is_new | is_old).all()
        new, kept = new + (is_new & ~is_old).sum(), kept + (is_old & ~is_new).sum()
        s, f, o = next_states[0].asnumpy(), fresh_states[0].asnumpy(), states[0].asnumpy()
        assert (np.isclose(s, f) | np.isclose(s, o)).all()
        states, prev = next_states, out
    assert new > 0 and kept > 0


def test_variational_dropout_masks_persist_until_reset():
    cell = contrib.rnn.VariationalDropoutCell(rnn.LSTMCell(3, input_size=4), drop_inputs=0.5, drop_states=0.5,
                                              drop_outputs=0.5)
    cell.initialize()
    states = cell.begin_state(2)
    with autograd.record():
        cell(nd.ones((2, 4)), states)
        masks = (cell.drop_inputs_mask, cell.drop_states_mask, cell.drop_outputs_mask)
        cell(nd.ones((2, 4)), states)
    assert all(m is not None for m in masks)
    assert (cell.drop_inputs_mask, cell.drop_states_mask, cell.drop_outputs_mask) == masks
    cell.reset()
    assert cell.drop_inputs_mask is None and cell.drop_outputs_mask is None
    assert cell.prefix == cell.base_cell.prefix + "vardrop" and cell.params is cell.base_cell.params


def test_hybridized_cells_and_layers_run_on_the_cpu():
    """On the cpu hybridize() runs eagerly (dnnbind.hybrid records device calls only): same results."""
    cell = rnn.LSTMCell(3, input_size=2)
    cell.initialize()
    x = nd.array(np.random.RandomState(4).rand(2, 4, 2).astype(np.float32))
    want, _ = cell.unroll(4, x, merge_outputs=True)
    cell.hybridize()
    got, _ = cell.unroll(4, x, merge_outputs=True)
    np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    layer = rnn.GRU(3, input_size=2, layout="NTC")
    layer.initialize()
    want = layer(x).asnumpy()
    layer.hybridize()
    for _ in range(3):
        np.testing.assert_array_equal(layer(x).asnumpy(), want)
    out, states = layer(x, layer.begin_state(2))
    np.testing.assert_array_equal(out.asnumpy(), want)


# -- cells and layers agree ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_layer_matches_unrolled_cells(mode):
    """One bidirectional 2-layer layer = a stack of BidirectionalCells with the same Parameters."""
    make_layer = {"lstm": lambda: rnn.LSTM(3, 2, bidirectional=True, input_size=4),
                  "gru": lambda: rnn.GRU(3, 2, bidirectional=True, input_size=4),
                  "rnn_tanh": lambda: rnn.RNN(3, 2, "tanh", bidirectional=True, input_size=4)}[mode]
    make_cell = {"lstm": rnn.LSTMCell, "gru": rnn.GRUCell,
                 "rnn_tanh": lambda n, **kw: rnn.RNNCell(n, "tanh", **kw)}[mode]
    layer = make_layer()
    layer.initialize(mx.init.Uniform(0.5))
    stack = rnn.SequentialRNNCell()
    for i, ni in enumerate([4, 6]):
        stack.add(rnn.BidirectionalCell(make_cell(3, input_size=ni, prefix=f"l{i}_"),
                                        make_cell(3, input_size=ni, prefix=f"r{i}_")))
    stack.initialize()
    for d in "lr":
        for i in range(2):
            for g in ("i2h_weight", "h2h_weight", "i2h_bias", "h2h_bias"):
                cell = stack[i]._children[f"{d}_cell"]
                getattr(cell, g).set_data(getattr(layer, f"{d}{i}_{g}").data())
    x = nd.array(np.random.RandomState(2).uniform(-1, 1, (5, 2, 4)).astype(np.float32))
    out = layer(x)
    ref, _ = stack.unroll(5, x, layout="TNC", merge_outputs=True)
    np.testing.assert_allclose(out.asnumpy(), ref.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_sequence_length_matches_cells_with_valid_length(bidirectional):
    """use_sequence_length (MXNet's cpu ignores it: no oracle) against the cells' valid_length, which match
    MXNet's: zero outputs past each length, states of each sequence's last valid step."""
    layer = rnn.LSTM(3, bidirectional=bidirectional, input_size=2, use_sequence_length=True, layout="NTC")
    layer.initialize(mx.init.Uniform(0.5))
    l_cell = rnn.LSTMCell(3, input_size=2, prefix="l0_")
    cell = rnn.BidirectionalCell(l_cell, rnn.LSTMCell(3, input_size=2, prefix="r0_")) if bidirectional else l_cell
    cell.initialize()
    for d in "lr"[:1 + bidirectional]:
        c = cell._children[f"{d}_cell"] if bidirectional else cell
        for g in ("i2h_weight", "h2h_weight", "i2h_bias", "h2h_bias"):
            getattr(c, g).set_data(getattr(layer, f"{d}0_{g}").data())
    rs = np.random.RandomState(5)
    x = nd.array(rs.uniform(-1, 1, (3, 4, 2)).astype(np.float32))
    valid = nd.array([4, 2, 1])
    begin = [nd.array(rs.uniform(-0.5, 0.5, (1 + bidirectional, 3, 3)).astype(np.float32)) for _ in range(2)]
    out, (h, c) = layer(x, begin, sequence_length=valid)
    cell_begin = [begin[0][0], begin[1][0]] + ([begin[0][1], begin[1][1]] if bidirectional else [])
    ref, states = cell.unroll(4, x, begin_state=cell_begin, merge_outputs=True, valid_length=valid)
    np.testing.assert_allclose(out.asnumpy(), ref.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.asnumpy()[0], states[0].asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.asnumpy()[0], states[1].asnumpy(), rtol=1e-5, atol=1e-6)
    if bidirectional:
        np.testing.assert_allclose(h.asnumpy()[1], states[2].asnumpy(), rtol=1e-5, atol=1e-6)


# -- GPU ----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("case", ["L_lstm_bi2_ntc", "L_gru_bi2", "L_rnn_relu_bi2_ntc", "L_lstm_proj"])
def test_layer_on_gpu_matches_mxnet(case, gpu):
    net, ref = _loaded(case, ctx=gpu)
    grad = cases.CASES[case].get("grad", True)
    out, x, states = _run(case, net, ref, ctx=gpu, record=grad)
    for k, o in enumerate(cases.flatten(out)):
        _close(o, ref[f"out{k}"], f"{case} out{k} (gpu)", rtol=1e-4, atol=1e-5)
    if grad:
        _backward(case, out, ref)
        _close(x.grad, ref["dx"], f"{case} d(x) (gpu)", rtol=1e-4, atol=1e-4)
        for key, p in net._collect_params_with_prefix().items():
            _close(p.grad(), ref["grad:" + key], f"{case} d({key}) (gpu)", rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_hybridized_lstm_layer_on_gpu(gpu):
    net, ref = _loaded("L_lstm_bi2_ntc", ctx=gpu)
    x = nd.array(ref["x"], ctx=gpu)
    eager = net(x).asnumpy()
    with autograd.record():
        eager_loss = (net(x) ** 2).sum()
    eager_loss.backward()
    eager_grad = net.l0_i2h_weight.grad().asnumpy().copy()
    net.hybridize()
    for _ in range(3):  # warm-up, recording, replay
        with autograd.record():
            y = net(x)
            loss = (y ** 2).sum()
        loss.backward()
        np.testing.assert_allclose(y.asnumpy(), eager, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(net.l0_i2h_weight.grad().asnumpy(), eager_grad, rtol=1e-4, atol=1e-5)
    out, states = net(x, net.begin_state(2, ctx=gpu))  # with states: a pair, as eager
    assert len(states) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["lstm_valid", "bi_valid", "gru_tnc_valid"])
def test_cells_on_gpu_match_mxnet(case, gpu):
    net, ref = _loaded(case, ctx=gpu)
    out, x, _ = _run(case, net, ref, ctx=gpu)
    for k, o in enumerate(cases.flatten(out)):
        _close(o, ref[f"out{k}"], f"{case} out{k} (gpu)", rtol=1e-4, atol=1e-5)
    _backward(case, out, ref)
    _close(x.grad, ref["dx"], f"{case} d(x) (gpu)", rtol=1e-4, atol=1e-4)
