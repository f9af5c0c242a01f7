"""The one operator registry as a whole: every entry (table, composite and library-backed) under MXNet's names, with
MXNet's declared parameters, its string parameter values, its type rule, and a node in the symbol executor.

Checked against MXNet 1.9.1: its declared parameters (nd/_mxnet_params.py, generated from the wheel) and
fixtures/mxnet_infer_type/cases.json (its Symbol.infer_type, written by make_mxnet_infer_type.py).
"""

from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind.nd import _mxnet_params
from dnnbind.nd._params import declared_params
from dnnbind.nd._schema import schema
from dnnbind.symbol import _exec

from tests._helpers import assert_close

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_infer_type", "cases.json")


def _accepted(op) -> set:
    """The parameter names dnnbind's function for ``op`` takes."""
    if op.kind == "composite":
        ps = inspect.signature(op.cpu).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in ps):  # the function checks its keywords itself (reshape)
            return {"*"}
        return {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if op.kind == "lib":
        return {p.name for p in op.schema.params}
    return set(nd._accepted(op))


MXNET_NAMED = sorted((name, op.name) for name, (op, _) in nd.OPERATORS.items()
                     if name in _mxnet_params.DECLARED)


# Declared (nd/_mxnet_params.py, so mx.sym builds their nodes) but not run yet: the vision issue's contrib, region,
# indexing and linear-algebra operators. Each leaves this set when its registry entry lands.
PENDING: set = set()


def test_every_operator_mxnet_declares_runs_in_a_graph():
    """Each of the operators dnnbind's mx.sym declares has a registry entry behind it (PENDING aside)."""
    missing = sorted(set(_mxnet_params.DECLARED) - set(nd.OPERATORS) - PENDING)
    assert not missing, f"declared but not runnable: {missing}"
    assert not PENDING & set(nd.OPERATORS), f"implemented now, drop from PENDING: {sorted(PENDING & set(nd.OPERATORS))}"
    # the executor's table is the registry's, not a second list; Custom's node is built from the Python operator
    # registered under its op_type (symbol/_custom.py, custom_op.py), not from a registry entry
    assert set(_exec.OPS) - {"Custom"} == set(nd.OPERATORS)


@pytest.mark.parametrize("name,entry", MXNET_NAMED)
def test_each_entry_takes_mxnet_declared_parameters(name, entry):
    op, _ = nd.OPERATORS[name]
    s = schema(name)
    accepted = _accepted(op)
    if "*" in accepted:
        return
    inputs = {i.name for i in s.inputs}
    declared = list(declared_params(name))  # MXNet's, with the count of a variadic input (add_n's num_args)
    assert [p for p in declared if p not in accepted] == [], f"{name} refuses parameters MXNet declares"
    # beyond MXNet's declared list: ctx (creation ops), act_type (Convolution's fused activation) and lower
    # (MXNet's potrf/potri parse it without declaring it: nd.linalg.potrf(A, lower=False) runs in MXNet 1.9.1)
    assert sorted(accepted - inputs - set(declared)) in ([], ["ctx"], ["act_type"], ["lower"]), \
        f"{name} takes parameters MXNet does not declare: {sorted(accepted - inputs - set(declared))}"


@pytest.mark.parametrize("name", ["sum", "tile", "argmax", "one_hot", "reshape", "Pad", "L2Normalization", "dot",
                                  "Activation", "slice_axis"])
def test_unknown_keywords_are_refused_with_mxnets_message(name):
    _, fn = nd.OPERATORS[name]
    with pytest.raises(TypeError, match="Cannot find argument 'bogus', Possible Arguments:"):
        fn(nd.ones((1, 1, 2, 2)), bogus=1)


def test_argmax_refuses_exclude_which_mxnet_does_not_declare():
    with pytest.raises(TypeError, match="(?s)Cannot find argument 'exclude'.*in operator argmax"):
        nd.argmax(nd.ones((2, 3)), axis=1, exclude=True)


def test_string_parameter_values_are_parsed_as_mxnet_parses_them():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    a = nd.array(x)
    assert_close(nd.sum(a, axis="(0, 2)").numpy(), x.sum(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    assert_close(nd.sum(a, axis="1", keepdims="True").numpy(), x.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert nd.one_hot(nd.array([0, 2]), depth="3").shape == (2, 3)
    assert nd.transpose(a, axes="(2, 0, 1)").shape == (4, 2, 3)
    assert nd.Reshape(a, shape="(-1, 4)").shape == (6, 4)
    assert_close(nd.clip(a, a_min="-0.5", a_max="0.5").numpy(), np.clip(x, -0.5, 0.5), rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="Invalid Parameter format for depth expect int but value='3.5'"):
        nd.one_hot(nd.array([0, 2]), depth="3.5")


def _cases():
    with open(FIXTURES) as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["expr"][:60])
def test_infer_type_matches_mxnet(case):
    mx = dnnbind.mxnet
    d = mx.sym.var("data")
    sym = eval(case["expr"], {"mx": mx, "d": d})
    assert sym.list_arguments() == case["arguments"]
    args, outs, aux = sym.infer_type(**case["given"])

    def names(ts):
        return None if ts is None else [np.dtype(t).name for t in ts]
    assert (names(args), names(outs), names(aux)) == (case["arg_types"], case["out_types"], case["aux_types"])


def test_eager_dtypes_follow_the_same_rules():
    """What the type rules say about a graph, the eager ops do (MXNet 1.9.1's outputs)."""
    h = nd.array([[1, 5, 2], [3, 0, 4]], dtype="float16")
    assert nd.argmax(h, axis=1).dtype == np.float16
    assert nd.argmax(h.astype("int32"), axis=1).dtype == np.int32
    assert nd.shape_array(h).dtype == np.int64 and nd.shape_array(h).numpy().tolist() == [2, 3]
    assert nd.size_array(h).numpy().tolist() == [6]
    assert [a.dtype for a in nd.topk(h, k=1, ret_typ="both")] == [np.float16, np.float32]
    assert nd.one_hot(nd.array([1, 2], dtype="int32"), depth=3).dtype == np.float32


@pytest.mark.parametrize("scalar_op,fn", [
    ("_plus_scalar", lambda x, s: x + s), ("_rminus_scalar", lambda x, s: s - x),
    ("_rdiv_scalar", lambda x, s: s / x), ("_power_scalar", lambda x, s: x ** s),
    ("_maximum_scalar", np.maximum), ("_greater_scalar", lambda x, s: (x > s).astype(x.dtype))])
def test_scalar_operators_are_entries(scalar_op, fn):
    """The internal operators a symbol's ``x + 2`` writes run through the registry (graph files hold them)."""
    x = np.random.default_rng(1).uniform(0.5, 2.0, (3, 2))
    op, call = nd.OPERATORS[scalar_op]
    assert op.kind == "composite"
    assert_close(call(nd.array(x), scalar=1.5).numpy(), fn(x, 1.5).astype(np.float32), rtol=1e-5, atol=1e-6)
    # an int array computes in its own type: the scalar is cast to it, as MXNet's kernels do
    xi = nd.array([1, 2, 3], dtype="int32")
    assert nd.OPERATORS["_plus_scalar"][1](xi, scalar=2.0).dtype == np.int32
