"""The MXNet 1.9.1 oracle fixtures of tests/fixtures/mxnet_ops and tests/fixtures/mxnet_models are present and
well-formed (CPU only, no MXNet needed): the JSON loads, every op of every symbol file is a registered op (or
alias) in op_params.json, the parameter files are MXNet NDArray lists with arg:/aux: names, the stored type-info
parses agree with the parser in dump_op_params.py. Nothing here runs an op.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import numpy as np
import pytest

from dnnbind import serialization

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
OPS = os.path.join(FIX, "mxnet_ops")
MODELS = os.path.join(FIX, "mxnet_models")

ZOO = ["resnet18_v1", "resnet50_v1", "mobilenet1.0", "mobilenet_v2_1.0", "squeezenet1.0", "vgg11_bn", "alexnet",
       "densenet121", "inception_v3"]
TINY = ["twobranch", "lenet_module", "legacy_v0_8", "legacy_v1_0"]


def _json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def op_params():
    return _json(os.path.join(OPS, "op_params.json"))


@pytest.fixture(scope="module")
def manifest():
    return _json(os.path.join(MODELS, "manifest.json"))


def _dump_module():
    spec = importlib.util.spec_from_file_location("dump_op_params", os.path.join(OPS, "dump_op_params.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports no mxnet at module level
    return mod


def _symbol_files():
    return sorted(p for p in glob.glob(os.path.join(MODELS, "*.json")) if not p.endswith("manifest.json"))


def test_files_present_and_small():
    names = set(os.listdir(MODELS))
    for z in ZOO:
        assert z + "-symbol.json" in names
        assert not any(n.startswith(z + "-") and ".params" in n for n in names), z  # big ones: symbol only
    for t in ["twobranch", "legacy_v0_8", "legacy_v1_0"]:
        assert {t + "-symbol.json", t + "-0000.params.bin", t + "-io.npz"} <= names
    assert {"lenet_module-symbol.json", "lenet_module-0001.params.bin", "lenet_module-io.npz",
            "ops-symbol.json", "ops-io.npz", "legacy_v0_8-upgraded.json", "legacy_v1_0-upgraded.json",
            "make_fixtures.py", "README.md", "manifest.json"} <= names
    total = sum(os.path.getsize(os.path.join(MODELS, n)) for n in names)
    assert total < 3 * 1024 * 1024, total
    for n in ["op_params.json", "op_io.json", "dump_op_params.py", "SUMMARY.md"]:
        assert os.path.getsize(os.path.join(OPS, n)) > 0


def test_op_params_well_formed(op_params):
    assert op_params["mxnet_version"] == "1.9.1"
    ops = op_params["ops"]
    assert len(ops) == op_params["num_kept"] > 300
    assert op_params["num_registered_ops"] <= op_params["num_registered_names"] == len(op_params["all_op_names"])
    for name, rec in ops.items():
        assert rec["name"] == name
        n = len(rec["arg_names"])
        assert len(rec["arg_type_infos"]) == len(rec["arg_descriptions"]) == len(rec["arg_types_parsed"]) == n
        assert all(len(d) <= 200 for d in rec["arg_descriptions"]), name
        for alias in rec["aliases"]:
            assert op_params["alias_of"][alias] == name
    for alias, real in op_params["alias_of"].items():
        assert real in ops and alias in op_params["all_op_names"]
    # every public (no leading underscore) op is there, and the underscore ops symbol files use
    for must in ["Convolution", "Deconvolution", "FullyConnected", "BatchNorm", "Pooling", "SoftmaxOutput",
                 "_plus_scalar", "_mul_scalar", "_copy", "_zeros", "_ones", "_minus_scalar", "_rminus_scalar",
                 "_div_scalar", "_rdiv_scalar", "_power_scalar", "_greater_scalar"]:
        assert must in ops, must
    for alias in ["_Plus", "_Minus", "_Mul", "_Div", "_plus", "_minus", "_mul", "_div", "ElementWiseSum", "flatten"]:
        assert op_params["alias_of"][alias] in ops, alias
    conv = ops["Convolution"]
    assert conv["arg_names"][:4] == ["data", "weight", "bias", "kernel"]
    assert conv["arg_type_infos"][3] == "Shape(tuple), required"
    assert ops["Concat"]["key_var_num_args"] == "num_args"


def test_type_info_parser_matches_stored(op_params):
    mod = _dump_module()
    mod._selftest()
    for name, rec in op_params["ops"].items():
        for info, parsed in zip(rec["arg_type_infos"], rec["arg_types_parsed"]):
            assert mod.parse_type_info(info) == parsed, (name, info)
    pool = dict(zip(op_params["ops"]["Pooling"]["arg_names"], op_params["ops"]["Pooling"]["arg_types_parsed"]))
    assert pool["pool_type"]["enum"] == ["avg", "lp", "max", "sum"] and pool["pool_type"]["default"] == "max"
    assert pool["global_pool"]["default"] is False and pool["p_value"]["nullable"]
    assert pool["data"]["input"] and not pool["data"]["variadic"]


def test_op_io_well_formed():
    doc = _json(os.path.join(OPS, "op_io.json"))
    ids = {c["id"]: c for c in doc["cases"]}
    for want in ["Convolution", "Convolution_no_bias", "Deconvolution", "FullyConnected", "FullyConnected_no_bias",
                 "BatchNorm", "LayerNorm", "InstanceNorm", "Embedding", "LeakyReLU_prelu", "LeakyReLU_leaky",
                 "SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput", "Pooling_valid",
                 "Pooling_full", "Pooling_global", "Activation", "Dropout", "Concat", "Flatten", "Reshape_0_-1",
                 "UpSampling_nearest", "MakeLoss", "BlockGrad", "softmax", "log_softmax",
                 "Deconvolution_stride_pad_adj", "Deconvolution_target_shape", "FullyConnected_flatten_false"]:
        assert want in ids, want
    for c in doc["cases"]:
        assert c["list_outputs"], c["id"]
        for r in c["infer_shape"]:
            if "error" in r:
                continue
            assert list(r["arg_shapes"]) == c["list_arguments"] or set(r["arg_shapes"]) == set(c["list_arguments"])
            assert set(r["aux_shapes"]) == set(c["list_auxiliary_states"])
            assert len(r["out_shapes"]) == len(c["list_outputs"])
    bn = ids["BatchNorm"]
    assert bn["list_auxiliary_states"] == ["batchnorm_moving_mean", "batchnorm_moving_var"]
    assert ids["Convolution"]["infer_shape"][0]["arg_shapes"]["convolution_weight"] == [4, 3, 3, 3]


@pytest.mark.parametrize("path", _symbol_files(), ids=os.path.basename)
def test_symbol_file_ops_known(path, op_params):
    doc = _json(path)
    nodes = doc["nodes"]
    assert nodes and doc["heads"] and doc["arg_nodes"]
    known = set(op_params["ops"]) | set(op_params["alias_of"])
    for i, n in enumerate(nodes):
        assert n["op"] == "null" or n["op"] in known, (os.path.basename(path), n["op"])
        for e in n["inputs"]:
            assert 2 <= len(e) <= 3 and e[0] < i, (n["name"], e)
    for a in doc["arg_nodes"]:
        assert nodes[a]["op"] == "null"
    for h in doc["heads"]:
        assert h[0] < len(nodes)
    if os.path.basename(path).startswith("legacy_") and path.endswith("-symbol.json"):
        assert "mxnet_version" not in doc.get("attrs", {}) or doc["attrs"]["mxnet_version"][1] < 10901
    else:
        assert doc["attrs"]["mxnet_version"] == ["int", 10901]
        assert all("param" not in n and "attr" not in n for n in nodes)  # 1.9.1 writes "attrs" only


def test_legacy_spellings():
    old = _json(os.path.join(MODELS, "legacy_v0_8-symbol.json"))
    assert all("param" in n and "backward_source_id" in n for n in old["nodes"])
    assert any("attr" in n for n in old["nodes"]) and all(len(e) == 2 for n in old["nodes"] for e in n["inputs"])
    new = _json(os.path.join(MODELS, "legacy_v0_8-upgraded.json"))
    names = [n["name"] for n in new["nodes"]]
    assert "bn1_moving_mean" in names and "bn1_moving_var" in names  # the 0.9.0 upgrade adds the aux inputs
    weight = new["nodes"][names.index("conv1_weight")]
    assert weight["attrs"] == {"__lr_mult__": "0.5"}  # "weight_lr_mult" on the op moved to the variable
    argmax = new["nodes"][names.index("argmax1")]
    assert "axis" not in argmax.get("attrs", {})  # 0.9.5 upgrade: int axis -1 dropped
    v10 = _json(os.path.join(MODELS, "legacy_v1_0-symbol.json"))
    assert v10["attrs"]["mxnet_version"] == ["int", 10000] and any("attr" in n for n in v10["nodes"])
    ops10 = [n["op"] for n in _json(os.path.join(MODELS, "legacy_v1_0-upgraded.json"))["nodes"]]
    assert "add_n" in ops10 and "elemwise_add" in ops10  # aliases written back under their real names


def _var_names(sym):
    return {n["name"] for n in sym["nodes"] if n["op"] == "null"}


@pytest.mark.parametrize("prefix,epoch,inputs", [("twobranch", 0, {"data"}),
                                                 ("lenet_module", 1, {"data", "softmax_label"}),
                                                 ("legacy_v0_8", 0, {"data", "softmax_label"}),
                                                 ("legacy_v1_0", 0, {"data"})])
def test_params_files(prefix, epoch, inputs):
    path = os.path.join(MODELS, "%s-%04d.params.bin" % (prefix, epoch))
    loaded = serialization.load(path)
    assert isinstance(loaded, dict) and loaded
    assert all(k.startswith(("arg:", "aux:")) for k in loaded)
    assert any(k.startswith("arg:") for k in loaded) and any(k.startswith("aux:") for k in loaded)
    for v in loaded.values():
        assert v.dtype == np.float32
    sym_file = "%s-upgraded.json" % prefix if prefix.startswith("legacy_") else "%s-symbol.json" % prefix
    variables = _var_names(_json(os.path.join(MODELS, sym_file)))
    assert {k[4:] for k in loaded} == variables - inputs


def test_io_npz(manifest):
    for prefix in TINY + ["ops"]:
        with np.load(os.path.join(MODELS, prefix + "-io.npz")) as z:
            arrays = {k: z[k] for k in z.files}
        assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in arrays.values()), prefix
        m = manifest["files"][prefix + "-symbol.json"]
        if "output_shape" in m:
            assert list(arrays["output"].shape) == m["output_shape"]
        else:
            outs = sorted((k for k in arrays if k.startswith("out")), key=lambda k: int(k[3:]))
            assert [list(arrays[k].shape) for k in outs] == m["output_shapes"]
            heads = _json(os.path.join(MODELS, prefix + ("-upgraded.json" if prefix.startswith("legacy") else
                                                        "-symbol.json")))["heads"]
            assert len(heads) == len(outs)
