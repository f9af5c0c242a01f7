"""dnnbind.symbol (``mx.sym``) against the real MXNet 1.9.1: the same programs (tests/fixtures/mxnet_symbol/
scenarios.py) build the same graphs, write byte-identical symbol files, and read them back."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

import dnnbind.symbol as sym
from dnnbind._lib.errors import DnnbindTypeError, DnnbindValueError, UnknownArgumentError

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_symbol"
# loaded under a name of its own: other fixture folders have a scenarios.py too
_spec = importlib.util.spec_from_file_location("mxnet_symbol_scenarios", FIXTURES / "scenarios.py")
_scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scenarios)
SCENARIOS = _scenarios.SCENARIOS

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["scenarios"]


def _build(name):
    with sym.NameManager():
        return SCENARIOS[name](sym, sym.AttrScope)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_graphs_and_files_are_mxnets(name):
    s, want = _build(name), EXPECTED[name]
    assert s.list_arguments() == want["arguments"]
    assert s.list_outputs() == want["outputs"]
    assert s.list_auxiliary_states() == want["aux"]
    assert s.get_internals().list_outputs() == want["internals"]
    assert s.attr_dict() == want["attr_dict"]
    assert s.name == want["name"]
    assert s.tojson() == want["json"]  # byte for byte


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_mxnets_files_read_back_to_the_same_graph(name):
    want = EXPECTED[name]
    s = sym.load_json(want["json"])
    assert s.list_arguments() == want["arguments"] and s.list_outputs() == want["outputs"]
    assert s.list_auxiliary_states() == want["aux"]
    assert s.tojson() == want["json"]


def test_save_and_load_a_file(tmp_path):
    s = _build("conv_bn_relu")
    s.save(str(tmp_path / "net-symbol.json"))
    assert sym.load(str(tmp_path / "net-symbol.json")).tojson() == s.tojson()
    assert not list(tmp_path.glob("*.tmp"))


def test_indexing_children_and_groups():
    with sym.NameManager():
        d = sym.var("data")
        sl = sym.SliceChannel(d, num_outputs=2)
        assert len(sl) == 2 and sl[1].list_outputs() == ["slicechannel0_output1"]
        assert sl["slicechannel0_output0"].list_outputs() == ["slicechannel0_output0"]
        with pytest.raises(DnnbindValueError, match="cannot find output"):
            sl["nope"]
        with pytest.raises(IndexError):
            sl[2]
        a = sym.Activation(sl[0], act_type="tanh")
        assert a.get_children().list_outputs() == ["slicechannel0_output0"]
        assert d.get_children() is None
        g = sym.Group([a, d])
        assert g.name is None and g.list_outputs() == ["activation0_output", "data"]
        assert [x.list_outputs() for x in g] == [["activation0_output"], ["data"]]


def test_operators_parse_their_parameters_as_mxnet():
    d = sym.var("data")
    with pytest.raises(UnknownArgumentError, match="Cannot find argument 'kernal'"):
        sym.Convolution(d, kernal=(3, 3), num_filter=2)
    with pytest.raises(DnnbindTypeError, match="Required parameter kernel of Shape\\(tuple\\) is not presented"):
        sym.Convolution(d, num_filter=2)
    with pytest.raises(DnnbindValueError, match="Invalid Input: 'fast'"):
        sym.Convolution(d, kernel=(3, 3), num_filter=2, cudnn_tune="fast")
    with pytest.raises(DnnbindTypeError, match="positional arguments must be Symbols"):
        sym.FullyConnected(d, 10)
    with pytest.raises(DnnbindValueError, match="is not an input of FullyConnected"):
        sym.FullyConnected(d, num_hidden=3, gamma=d)
    with pytest.raises(DnnbindTypeError, match="type str not supported"):
        d + "1"


def test_var_attributes():
    v = sym.var("x", shape=(2, 3), lr_mult=2.0, wd_mult=0.0, dtype="float16", __layout__="NC")
    # as MXNet 1.9.1 lists them: the multipliers also under their plain names
    assert v.list_attr() == {"__layout__": "NC", "__dtype__": "2", "__wd_mult__": "0.0", "wd_mult": "0.0",
                             "__lr_mult__": "2.0", "lr_mult": "2.0", "__shape__": "(2, 3)"}
    with pytest.raises(DnnbindValueError, match="must start and end with double underscores"):
        sym.var("x", layout="NC")
    with pytest.raises(DnnbindTypeError, match="Expect a string"):
        sym.var(3)


def test_legacy_files_are_upgraded_as_mxnet_does():
    old = {
        "nodes": [
            {"op": "null", "param": {}, "name": "data", "inputs": [], "backward_source_id": -1},
            {"op": "null", "param": {}, "name": "fc_weight", "inputs": [], "backward_source_id": -1,
             "attr": {"ctx_group": "dev1"}},
            {"op": "null", "param": {}, "name": "fc_bias", "inputs": [], "backward_source_id": -1},
            {"op": "FullyConnected", "param": {"no_bias": "False", "num_hidden": "4"}, "name": "fc",
             "inputs": [[0, 0], [1, 0], [2, 0]], "backward_source_id": -1},
        ],
        "arg_nodes": [0, 1, 2], "heads": [[3, 0]],
    }
    s = sym.load_json(json.dumps(old))
    assert s.list_arguments() == ["data", "fc_weight", "fc_bias"]
    assert s.attr_dict() == {"fc_weight": {"__ctx_group__": "dev1", "ctx_group": "dev1"},
                             "fc": {"no_bias": "False", "num_hidden": "4"}}


@pytest.mark.parametrize("bad, match", [
    ("not json", "not JSON"),
    ('{"nodes": []}', "expected an object with 'nodes' and 'heads'"),
    ('{"nodes": [{"op": "Frobnicate", "name": "f", "inputs": []}], "heads": [[0, 0, 0]]}', "'Frobnicate'"),
    ('{"nodes": [{"op": "null", "name": "d", "inputs": []}], "heads": [[3, 0, 0]]}', "names node 3"),
    ('{"nodes": [{"op": "null", "name": "d", "inputs": []}, {"op": "Activation", "name": "a", '
     '"attrs": {"act_type": "relu", "slope": "1"}, "inputs": [[0, 0, 0]]}], "heads": [[1, 0, 0]]}',
     "Cannot find argument 'slope'"),
])
def test_bad_files_are_refused_naming_the_problem(bad, match):
    with pytest.raises((DnnbindValueError, DnnbindTypeError), match=match):
        sym.load_json(bad)


# -- files MXNet 1.9.1 wrote: the model zoo exported, a Module checkpoint, and hand-written legacy files -------------
MODELS = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["files"]
SYMBOL_FILES = sorted(p.name for p in MODELS.glob("*-symbol.json"))


@pytest.mark.parametrize("fname", SYMBOL_FILES)
def test_mxnets_symbol_files_load_and_write_back_as_mxnet_writes_them(fname):
    s = sym.load(str(MODELS / fname))
    upgraded = MODELS / fname.replace("-symbol.json", "-upgraded.json")
    if upgraded.exists():  # a legacy file: what MXNet 1.9.1's tojson() made of it
        assert s.tojson() == upgraded.read_text().rstrip("\n")
        want = MANIFEST[fname]
        assert s.list_arguments() == want["arguments"]
        assert s.list_auxiliary_states() == want["auxiliary_states"]
        assert s.list_outputs() == want["outputs"]
        assert s.attr_dict() == want["attr_dict"]
    else:
        assert s.tojson() == (MODELS / fname).read_text()  # byte for byte
    assert s.list_arguments() and s.list_outputs()


def test_parameters_by_position_after_the_inputs_as_mxnets_generated_functions():
    """``mx.sym.clip(x, 0, 6)``: values after the Symbols are the parameters in MXNet's declared order (the file
    MXNet 1.9.1 writes for it holds a_min "0", a_max "6"), the same node as by keyword."""
    from dnnbind import symbol as sym
    x = sym.var("x")
    assert sym.clip(x, 0, 6, name="c").tojson() == sym.clip(x, a_min=0, a_max=6, name="c").tojson()
    assert '"a_max": "6"' in sym.clip(x, 0, 6).tojson()
    with pytest.raises(TypeError, match="multiple values for argument 'a_min'"):
        sym.clip(x, 0, 6, a_min=1)
