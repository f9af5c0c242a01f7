"""Symbol.infer_shape / infer_shape_partial / infer_type against MXNet 1.9.1: the 66 operator cases of
tests/fixtures/mxnet_ops/op_io.json (each built with the same arguments, its argument, auxiliary-state and output
names, the attributes MXNet stored, and the shapes MXNet inferred), and the exported models' output shapes."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import dnnbind.symbol as sym
from dnnbind import serialization
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.features import UnsupportedFeature

ROOT = pathlib.Path(__file__).resolve().parent / "fixtures"
CASES = json.loads((ROOT / "mxnet_ops" / "op_io.json").read_text())["cases"]
MODELS = ROOT / "mxnet_models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["files"]
LATER = {"RNN", "SequenceMask", "SequenceLast", "SequenceReverse"}


def _build(case):
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in case["kwargs"].items()}
    inputs = [sym.var(n) for n in case["inputs"]]
    return getattr(sym, case["op"])(*inputs, name=case["name"], **kwargs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_each_operator_is_built_and_inferred_as_mxnet_does(case):
    if "error" in case and "list_arguments" not in case:
        pytest.skip(f"MXNet itself refused this case: {case['error'][:80]}")
    s = _build(case)
    assert s.list_arguments() == case["list_arguments"]
    assert s.list_auxiliary_states() == case["list_auxiliary_states"]
    assert s.list_outputs() == case["list_outputs"]
    assert s.list_attr() == case["node_attrs"]
    for inf in case.get("infer_shape", []):
        given = {k: tuple(v) for k, v in inf["given"].items()}
        if "error" in inf:  # MXNet refused these shapes: so must dnnbind
            with pytest.raises((DnnbindValueError, UnsupportedFeature)):
                s.infer_shape(**given)
            continue
        try:
            args, outs, auxs = s.infer_shape(**given)
        except UnsupportedFeature:
            args = None
        if args is None:  # an operator of a later issue (RNN, sequences): built and named, not yet inferred
            assert case["op"] in LATER, case["op"]
            pytest.skip(f"{case['op']} has no shape rule or implementation in dnnbind yet")
        assert dict(zip(s.list_arguments(), args)) == {k: tuple(v) for k, v in inf["arg_shapes"].items()}
        assert outs == [tuple(o) for o in inf["out_shapes"]]
        assert dict(zip(s.list_auxiliary_states(), auxs)) == {k: tuple(v) for k, v in inf["aux_shapes"].items()}


@pytest.mark.parametrize("fname", sorted(f for f, m in MANIFEST.items() if m.get("kind") == "model_zoo"))
def test_model_zoo_graphs_infer_their_output_shape(fname):
    s = sym.load(str(MODELS / fname))
    m = MANIFEST[fname]
    args, outs, auxs = s.infer_shape(data=tuple(m["input_shape"]))
    assert outs == [tuple(m["output_shape"])]
    assert all(a and all(d > 0 for d in a) for a in args + auxs)


@pytest.mark.parametrize("name, epoch", [("twobranch", 0), ("lenet_module", 1), ("legacy_v1_0", 0)])
def test_inferred_parameter_shapes_are_the_saved_ones(name, epoch):
    s = sym.load(str(MODELS / f"{name}-symbol.json"))
    saved = {k.split(":", 1)[-1]: tuple(v.shape)
             for k, v in serialization.load(str(MODELS / f"{name}-{epoch:04d}.params.bin")).items()}
    io = np.load(MODELS / f"{name}-io.npz")
    args, outs, auxs = s.infer_shape(data=io["data"].shape)
    inferred = dict(zip(s.list_arguments(), args)) | dict(zip(s.list_auxiliary_states(), auxs))
    for k, shape in saved.items():
        assert inferred[k] == shape, k


def test_partial_inference_and_types():
    d = sym.var("data")
    f = sym.FullyConnected(sym.Convolution(d, kernel=(3, 3), num_filter=4) + sym.var("z"), num_hidden=3)
    assert f.infer_shape() == (None, None, None)
    assert f.infer_shape_partial() == ([()] * 6, [()], [])
    args, outs, _ = f.infer_shape((2, 3, 8, 8))  # by position, in list_arguments order
    assert args[3] == (2, 4, 6, 6) and args[4] == (3, 144) and outs == [(2, 3)]
    types = f.infer_type(data="float16")
    assert types[0] == [np.float16] * 6 and types[1] == [np.float16]
    assert f.infer_type() == (None, None, None)
    with pytest.raises(DnnbindValueError, match="expects input z of shape \\(2, 4, 6, 6\\), but it is"):
        f.infer_shape(data=(2, 3, 8, 8), z=(2, 5, 6, 6))
    with pytest.raises(DnnbindValueError, match="'nope' is not an input"):
        f.infer_shape(nope=(1,))
