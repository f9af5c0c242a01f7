"""nd/_schema.py: MXNet's declared operator parameters and its parser for their (string) values, against what the
real MXNet 1.9.1 did with the same attributes (tests/fixtures/mxnet_schema/cases.json, made by make_cases.py there).
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

from dnnbind._lib.errors import DnnbindTypeError, DnnbindValueError, UnknownArgumentError
from dnnbind.nd import _mxnet_params
from dnnbind.nd._schema import Schema, attr_string, parse_type_info, schema

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_schema"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


def _kwargs(case) -> dict:
    return {k: ast.literal_eval(v) for k, v in case["kwargs"].items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['op']}-{'-'.join(f'{k}={v}' for k, v in c['kwargs'].items())}")
def test_parses_what_mxnet_parses_and_refuses_what_it_refuses(case):
    s = schema(case["op"])
    kwargs = _kwargs(case)
    if case["ok"]:
        got = s.parse(kwargs)
        # MXNet keeps each given attribute as the string the frontend made of it: so do we
        assert s.attrs(kwargs) == case["attrs"]
        for k in kwargs:
            assert k in got
        return
    with pytest.raises((DnnbindTypeError, DnnbindValueError)) as err:
        s.parse(kwargs)
    want = case["error"].removeprefix("MXNetError: ")
    # the message up to the operator's own argument listing, which MXNet appends and dnnbind does not
    head = want.split(", in operator")[0].split("Possible Arguments")[0].rstrip(": ,")
    assert str(err.value).startswith(head), (str(err.value), want)


def test_parsed_values_are_python_values():
    conv = schema("Convolution").parse({"kernel": "(3, 3)", "num_filter": "8", "no_bias": "True", "pad": "[1,1]"})
    assert conv == {"kernel": (3, 3), "stride": (), "dilate": (), "pad": (1, 1), "num_filter": 8, "num_group": 1,
                    "workspace": 1024, "no_bias": True, "cudnn_tune": None, "cudnn_off": False, "layout": None}
    bn = schema("BatchNorm").parse({"eps": "1e-05", "fix_gamma": "False"})
    assert bn["eps"] == 1e-05 and bn["fix_gamma"] is False and bn["momentum"] == pytest.approx(0.9)
    assert schema("sum").parse({"axis": "None"})["axis"] is None
    assert schema("sum").parse({"axis": "1"})["axis"] == (1,)
    assert schema("Reshape").parse({"shape": "(0,-1)"})["shape"] == (0, -1)
    assert schema("softmax").parse({"temperature": "None"})["temperature"] is None
    assert schema("clip").parse({"a_min": "-inf", "a_max": "2"}) == {"a_min": float("-inf"), "a_max": 2.0}
    assert schema("Pooling").parse({}, defaults=False) == {}


def test_unknown_arguments_are_mxnets_error_listing_the_declared_ones():
    with pytest.raises(UnknownArgumentError) as err:
        schema("FullyConnected").parse({"num_hidden": 3, "num_hiden": 4})
    assert "Cannot find argument 'num_hiden'" in str(err.value) and "flatten" in str(err.value)


def test_defaults_are_parsed_from_mxnets_descriptions():
    p = parse_type_info("Pooling", "pooling_convention", "{'full', 'same', 'valid'},optional, default='valid'")
    assert (p.kind, p.default, p.choices, p.required) == ("enum", "valid", ("full", "same", "valid"), False)
    p = parse_type_info("Convolution", "cudnn_tune", "{None, 'fastest', 'limited_workspace', 'off'},optional, "
                                                    "default='None'")
    assert p.none_ok and p.default is None and p.choices[0] is None
    p = parse_type_info("Pooling", "p_value", "int or None, optional, default='None'")
    assert (p.kind, p.none_ok, p.default) == ("int", True, None)
    p = parse_type_info("softmax", "axis", "int, optional, default='-1'")
    assert p.default == -1
    p = parse_type_info("Convolution", "stride", "Shape(tuple), optional, default=[]")
    assert p.default == ()


def test_every_declared_operator_builds_a_schema():
    for name in list(_mxnet_params.DECLARED) + list(_mxnet_params.ALIASES):
        s = schema(name)
        assert s.op in _mxnet_params.DECLARED
        for p in s.params:  # every default goes to MXNet's string and back unchanged
            if not p.required and p.default is not None:
                assert Schema(s.op, (), (p,)).parse({p.name: attr_string(p.default)})[p.name] == p.default, p
    assert schema("flatten") is not schema("Flatten") and schema("flatten").op == "Flatten"
    assert [i.name for i in schema("Convolution").inputs] == ["data", "weight", "bias"]
    assert [i.name for i in schema("BatchNorm").inputs] == ["data", "gamma", "beta", "moving_mean", "moving_var"]
    assert schema("Concat").inputs[0].variadic and _mxnet_params.VAR_ARGS["Concat"] == "num_args"


def test_an_unknown_operator_is_named():
    with pytest.raises(DnnbindValueError, match="'Convolutoin'"):
        schema("Convolutoin")


def test_attr_strings_are_pythons_str_as_in_mxnet():
    assert attr_string((3, 3)) == "(3, 3)" and attr_string([2, 2]) == "[2, 2]"
    assert attr_string(True) == "True" and attr_string(1e-05) == "1e-05" and attr_string(None) == "None"
    assert attr_string("relu") == "relu"


def test_the_generated_docstring_lists_every_parameter():
    doc = schema("Convolution").doc()
    for name in ("data", "kernel", "num_filter", "no_bias", "layout"):
        assert f"\n{name} :" in doc
    assert "kernel : Shape(tuple), required" in doc


def test_a_schema_from_pairs_separates_inputs_and_parameters():
    s = Schema.from_type_infos("Toy", [("data", "NDArray-or-Symbol"), ("k", "int, required"),
                                       ("args", "NDArray-or-Symbol[]")])
    assert [i.name for i in s.inputs] == ["data", "args"] and s.inputs[1].variadic
    assert s.parse({"k": "4"}) == {"k": 4}
