"""LayerNorm, InstanceNorm, GroupNorm (ops/defs/layer_norm.py) and UpSampling (ops/defs/upsampling.py) against the
real MXNet 1.9.1: outputs and the gradients of every input on seeded float32 inputs
(tests/fixtures/mxnet_norm_upsampling/make_fixture.py), on the cpu and on a GPU; the refusals; the symbol nodes; and
Gluon's nn.LayerNorm and nn.InstanceNorm on the operators, exported as MXNet exports them.

The registry-wide checks (shape inference, symbol executor, central differences, bad arguments, GPU lowering against
the twin) run on these entries' samples in tests/test_opdefs.py.

Every case runs through nd (UpSampling's variadic data: several inputs, bilinear's data and weight, num_args filled
in as MXNet's frontend does) and through the entry's prepare and lowerings directly (``_direct``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, gluon, nd
from dnnbind import symbol as sym
from dnnbind.ops.opdef import Call, Grads
from tests._helpers import assert_close

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_norm_upsampling", "norm_upsampling.npz")


def _fixture():
    return np.load(FIXTURE)


def _cases():
    f = _fixture()
    out = []
    for c in f["cases"]:
        c = str(c)
        names = [str(n) for n in f[f"{c}__names"]]
        outs = [f[k] for k in sorted(k for k in f.files if k.startswith(f"{c}__out"))]
        out.append((c, str(f[f"{c}__op"]), eval(str(f[f"{c}__params"])), [f[f"{c}__in__{n}"] for n in names],
                    f[f"{c}__dy"], outs, [f[f"{c}__grad__{n}"] for n in names]))
    return out


CASES = _cases()
VIA_ND = CASES  # every case through nd (UpSampling's variadic data: several inputs, bilinear's data and weight)
DIRECT = CASES  # and through the entry's lowerings themselves


def _device(ctx, request):
    return dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _check(case, outs, grads):
    name, op, params, _, _, y_mx, dx_mx = case
    assert len(outs) == len(y_mx), f"{name}: {len(outs)} outputs, MXNet gives {len(y_mx)}"
    for k, (o, e) in enumerate(zip(outs, y_mx)):
        assert_close(o, e, rtol=1e-5, atol=2e-6, name=f"{name} {op} {params} output {k}")
    for k, (g, e) in enumerate(zip(grads, dx_mx)):
        assert_close(g, e, rtol=1e-4, atol=2e-5, name=f"{name} {op} {params} gradient of input {k}")


@pytest.mark.parametrize("ctx", DEVICES)
@pytest.mark.parametrize("case", VIA_ND, ids=lambda c: c[0])
def test_matches_mxnet(case, ctx, request):
    _, op, params, inputs, dy, _, _ = case
    device = _device(ctx, request)
    xs = [nd.array(a, ctx=device) for a in inputs]
    for x in xs:
        x.attach_grad()
    with autograd.record():
        y = getattr(nd, op)(*xs, **params)
    outs = y if isinstance(y, tuple) else (y,)
    outs[0].backward(nd.array(dy, ctx=device))
    _check(case, outs, [x.grad for x in xs])


def _direct(op, arrays, params, device, dy, gpu_lowering=None):
    """The entry's prepare, forward and backward, as the dispatch runs them (parameters parsed by the schema, the
    geometry from NDArrays; numpy for the cpu lowering, NDArrays for the gpu one). ``gpu_lowering`` runs the gpu
    lowering on ``device`` whatever its kind (its table compositions run on cpu arrays too)."""
    entry = nd.REGISTRY[op]
    d, p = entry.opdef, entry.schema.parse(params)
    xs = [nd.array(a, ctx=device, dtype=a.dtype) for a in arrays]
    c = Call(d.prepare(p, *xs), p, device, True)
    grads = Grads((True,) * len(xs), (None,) * len(xs), True)
    use_gpu = device.kind == "gpu" if gpu_lowering is None else gpu_lowering
    if use_gpu:
        out, saved = d.gpu.forward(c, *xs)
        dxs = d.gpu.backward(c, saved, grads, nd.array(dy, ctx=device, dtype=xs[0].dtype))
    else:
        out, saved = d.cpu.forward(c, *[x.asnumpy() for x in xs])
        dxs = d.cpu.backward(c, saved, grads, dy.astype(xs[0].dtype))
    outs = out if isinstance(out, tuple) else (out,)
    return [np.asarray(o.asnumpy() if hasattr(o, "asnumpy") else o) for o in outs], \
        [np.asarray(g.asnumpy() if hasattr(g, "asnumpy") else g) for g in dxs]


@pytest.mark.parametrize("ctx", DEVICES)
@pytest.mark.parametrize("case", DIRECT, ids=lambda c: c[0])
def test_several_inputs_and_bilinear_match_mxnet(case, ctx, request):
    _, op, params, inputs, dy, _, _ = case
    _check(case, *_direct(op, inputs, params, _device(ctx, request), dy))


@pytest.mark.parametrize("case", [c for c in CASES if "bilinear" not in c[2].values()], ids=lambda c: c[0])
def test_gpu_compositions_run_on_cpu_arrays_match_mxnet(case):
    """The gpu lowerings of these entries are compositions of the table's ops, which run on cpu arrays as well:
    checked here without a GPU (bilinear's is cuDNN's deconvolution: GPU only)."""
    _, op, params, inputs, dy, _, _ = case
    _check(case, *_direct(op, inputs, params, dnnbind.cpu(), dy, gpu_lowering=True))


@pytest.mark.parametrize("ctx", DEVICES)
def test_float16_computes_in_float32(ctx, request):
    device = _device(ctx, request)
    rng = np.random.default_rng(5)
    x, g, b = rng.standard_normal((3, 4, 6)) * 3 + 1, rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)
    want = nd.LayerNorm(nd.array(x, dtype="float64"), nd.array(g, dtype="float64"), nd.array(b, dtype="float64"),
                        output_mean_var=True)
    xs = [nd.array(a, ctx=device, dtype="float16") for a in (x, g, b)]
    for a in xs:
        a.attach_grad()
    with autograd.record():
        got = nd.LayerNorm(*xs, output_mean_var=True)
    got[0].backward(nd.ones(got[0].shape, ctx=device, dtype="float16"))
    for k, (o, e) in enumerate(zip(got, want)):
        assert o.dtype == np.float16
        assert_close(o, e, rtol=2e-3, atol=2e-3, name=f"float16 output {k}")
    assert all(a.grad.dtype == np.float16 for a in xs)
    assert_close(xs[2].grad, np.full(6, 3 * 4.0), 0, 0, "dbeta")


@pytest.mark.parametrize("gpu_lowering", [False, True], ids=["twin", "gpu-composition"])
@pytest.mark.parametrize("op,params,p", [("LayerNorm", {"output_mean_var": True}, 6),
                                         ("GroupNorm", {"num_groups": 2, "output_mean_var": True}, 2),
                                         ("InstanceNorm", {}, 4)])
def test_float16_lowerings_round_float32_results(op, params, p, gpu_lowering):
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((3, 4, 6)) * 2, rng.uniform(0.5, 1.5, p), rng.standard_normal(p)]
    dy = rng.standard_normal((3, 4, 6))
    outs, grads = _direct(op, [a.astype(np.float16) for a in arrays], params, dnnbind.cpu(), dy.astype(np.float16),
                          gpu_lowering=gpu_lowering)
    want_outs, want_grads = _direct(op, arrays, params, dnnbind.cpu(), dy)
    for k, (o, e) in enumerate(zip(outs + grads, want_outs + want_grads)):
        assert o.dtype == np.float16
        assert_close(o, e, rtol=3e-3, atol=3e-3 * np.abs(e).max(), name=f"{op} float16 result {k}")


# -- refusals -----------------------------------------------------------------------------------------------------

def _a(shape, dtype="float32"):
    return nd.array(np.random.default_rng(0).standard_normal(shape), dtype=dtype)


def test_norms_refuse_what_mxnet_refuses():
    x = _a((2, 3, 4))
    with pytest.raises(ValueError, match=r"LayerNorm: axis 3 is out of range for data of shape \(2, 3, 4\)"):
        nd.LayerNorm(x, _a((4,)), _a((4,)), axis=3)
    with pytest.raises(ValueError, match=r"LayerNorm: gamma has shape \(3,\); expected \(4,\)"):
        nd.LayerNorm(x, _a((3,)), _a((4,)))
    with pytest.raises(TypeError, match="LayerNorm: gamma is float64 but data is float32"):
        nd.LayerNorm(x, _a((4,), "float64"), _a((4,)))
    with pytest.raises(TypeError, match="LayerNorm: data must be a floating-point array, got int32"):
        nd.LayerNorm(_a((2, 4), "int32"), _a((4,), "int32"), _a((4,), "int32"))
    with pytest.raises(ValueError, match=r"LayerNorm: data is empty \(shape \(0, 4\)\)"):
        nd.LayerNorm(_a((0, 4)), _a((4,)), _a((4,)))
    with pytest.raises(ValueError, match=r"InstanceNorm: data must have at least 3 axes .* got shape \(2, 3\)"):
        nd.InstanceNorm(_a((2, 3)), _a((3,)), _a((3,)))
    with pytest.raises(ValueError, match=r"InstanceNorm: beta has shape \(5,\); expected \(3,\)"):
        nd.InstanceNorm(x, _a((3,)), _a((5,)))
    with pytest.raises(ValueError, match="GroupNorm: data has 3 channels, not divisible by num_groups 2"):
        nd.GroupNorm(x, _a((2,)), _a((2,)), num_groups=2)
    with pytest.raises(ValueError, match="GroupNorm: num_groups must be at least 1, got 0"):
        nd.GroupNorm(x, _a((1,)), _a((1,)), num_groups=0)  # MXNet 1.9.1 crashes (a division by zero)
    with pytest.raises(ValueError, match=r"GroupNorm: gamma has shape \(3,\); expected \(1,\) \(num_groups"):
        nd.GroupNorm(x, _a((3,)), _a((3,)))  # per group in MXNet 1.9.1, not per channel


def test_upsampling_refuses_what_mxnet_refuses():
    x = _a((2, 3, 4, 5))
    with pytest.raises(ValueError, match="value 0 for Parameter scale should be greater equal to 1"):
        nd.UpSampling(x, scale=0, sample_type="nearest", num_args=1)
    with pytest.raises(ValueError, match=r"UpSampling: expects 2 inputs \(num_args=2\), but got 1"):
        nd.UpSampling(x, scale=2, sample_type="nearest", num_args=2)
    with pytest.raises(ValueError, match=r"UpSampling: expects 2 inputs \(data and weight"):
        nd.UpSampling(x, scale=2, sample_type="bilinear", num_filter=3, num_args=1)
    with pytest.raises(ValueError, match=r"UpSampling: data must be 4-D \(N, C, H, W\), got shape \(2, 3, 4\)"):
        nd.UpSampling(_a((2, 3, 4)), scale=2, sample_type="nearest", num_args=1)
    with pytest.raises(TypeError, match="UpSampling: data must be a floating-point array, got int32"):
        nd.UpSampling(_a((1, 1, 2, 2), "int32"), scale=2, sample_type="nearest", num_args=1)
    with pytest.raises(TypeError, match="Required parameter sample_type"):
        nd.UpSampling(x, scale=2, num_args=1)
    # through the entry itself (the dispatch passes one array): several inputs, bilinear
    up = nd.REGISTRY["UpSampling"]

    def prepare(*shapes, **params):
        return up.opdef.prepare(up.schema.parse(params), *[_a(s) for s in shapes])

    near = {"scale": 2, "sample_type": "nearest", "num_args": 2}
    with pytest.raises(ValueError, match=r"input height of 3 \(data\[1\]\) does not divide output height of 8"):
        prepare((2, 3, 4, 5), (2, 1, 3, 5), **near)
    with pytest.raises(ValueError, match=r"data\[1\] would be upsampled 1x in height but 2x in width"):
        prepare((2, 3, 4, 5), (2, 1, 8, 5), **near)  # MXNet fails at run time (a shape mismatch)
    with pytest.raises(ValueError, match=r"data\[1\] has batch size 3 but data\[0\] has 2"):
        prepare((2, 3, 4, 5), (3, 1, 8, 10), **near)
    with pytest.raises(ValueError, match="number of channels must be the same when multi_input_mode==sum"):
        prepare((2, 3, 4, 5), (2, 2, 8, 10), **near, multi_input_mode="sum")
    with pytest.raises(TypeError, match=r"UpSampling: data\[1\] is float64 but data\[0\] is float32"):
        up.opdef.prepare(up.schema.parse(near), _a((2, 3, 4, 5)), _a((2, 1, 8, 10), "float64"))
    bil = {"scale": 2, "sample_type": "bilinear", "num_args": 2}
    with pytest.raises(ValueError, match="needs num_filter equal to the data's channels, 3; got num_filter=0"):
        prepare((2, 3, 4, 5), (3, 1, 4, 4), **bil)  # MXNet 1.9.1 crashes (a division by zero)
    with pytest.raises(ValueError, match=r"weight has shape \(3, 1, 3, 3\); expected \(3, 1, 4, 4\)"):
        prepare((2, 3, 4, 5), (3, 1, 3, 3), **bil, num_filter=3)


# -- symbol nodes -------------------------------------------------------------------------------------------------

def test_symbol_outputs_and_shapes_are_mxnets():
    d = sym.var("data")
    s = sym.LayerNorm(d, name="ln")
    assert s.list_arguments() == ["data", "ln_gamma", "ln_beta"] and s.list_outputs() == ["ln_output"]
    assert s.infer_shape(data=(2, 3, 4)) == ([(2, 3, 4), (4,), (4,)], [(2, 3, 4)], [])
    assert '"node_row_ptr": [0, 1, 2, 3, 6]' in s.tojson()  # three outputs, one visible
    s = sym.LayerNorm(d, name="ln", axis=1, output_mean_var=True)
    assert s.list_outputs() == ["ln_output", "ln_mean", "ln_std"]
    assert s.infer_shape(data=(2, 3, 4)) == ([(2, 3, 4), (3,), (3,)], [(2, 3, 4), (2, 1, 4), (2, 1, 4)], [])
    s = sym.InstanceNorm(d, name="in")
    assert s.list_outputs() == ["in_output"] and s.get_internals().list_outputs()[-1] == "in_output"
    assert s.infer_shape(data=(2, 3, 4, 5)) == ([(2, 3, 4, 5), (3,), (3,)], [(2, 3, 4, 5)], [])
    s = sym.GroupNorm(d, name="gn", num_groups=3, output_mean_var=True)
    assert s.list_outputs() == ["gn_output", "gn_mean", "gn_std"]
    assert s.infer_shape(data=(2, 6, 4, 5)) == ([(2, 6, 4, 5), (3,), (3,)], [(2, 6, 4, 5), (2, 3), (2, 3)], [])
    s = sym.UpSampling(d, scale=2, sample_type="nearest", name="up")  # num_args filled in, as MXNet's frontend does
    assert s.list_arguments() == ["data"] and s.infer_shape(data=(2, 3, 4, 5))[1] == [(2, 3, 8, 10)]
    s = sym.UpSampling(d, scale=2, sample_type="bilinear", num_filter=3, name="up")
    assert s.list_arguments() == ["data", "up_weight"]
    assert s.infer_shape(data=(2, 3, 4, 5)) == ([(2, 3, 4, 5), (3, 1, 4, 4)], [(2, 3, 8, 10)], [])
    weight = next(n for n in json.loads(s.tojson())["nodes"] if n["name"] == "up_weight")
    assert weight["attrs"]["__init__"] == '["bilinear", {}]'
    s = sym.UpSampling(sym.var("a"), sym.var("b"), scale=2, sample_type="nearest", name="up")
    assert s.infer_shape(a=(2, 3, 4, 5), b=(2, 1, 8, 10))[1] == [(2, 4, 8, 10)]


def test_symbol_graph_runs_the_operators():
    case = next(c for c in CASES if c[0] == "layernorm2")  # axis -2, output_mean_var
    _, _, params, inputs, _, y_mx, _ = case
    s = sym.LayerNorm(sym.var("data"), name="ln", **params)
    ex = s.bind(dnnbind.cpu(), {k: nd.array(v) for k, v in zip(["data", "ln_gamma", "ln_beta"], inputs)})
    for k, (o, e) in enumerate(zip(ex.forward(is_train=False), y_mx)):
        assert_close(o, e, rtol=1e-5, atol=2e-6, name=f"executor output {k}")


# -- Gluon --------------------------------------------------------------------------------------------------------

def _net():
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(gluon.nn.LayerNorm(axis=1, epsilon=1e-3, prefix="ln_"),
                gluon.nn.InstanceNorm(axis=2, scale=True, prefix="in2_"), gluon.nn.InstanceNorm(prefix="in_"),
            gluon.nn.InstanceNorm(axis=0, scale=True, prefix="in0_"),
                gluon.nn.LayerNorm(prefix="last_"))
    return net


def test_gluon_layers_run_the_operators_and_export_as_mxnet(tmp_path):
    f = _fixture()
    net = _net()
    net.initialize(ctx=dnnbind.cpu())
    x = nd.array(f["export__x"])
    net(x)
    params = net.collect_params()
    for name, p in params.items():
        p.set_data(nd.array(f[f"export__param__{name}"]))
    assert_close(net(x), f["export__y"], rtol=1e-5, atol=2e-6, name="the net's output")
    sym_file, param_file = net.export(str(tmp_path / "net"))
    ours = json.loads(open(sym_file).read())["nodes"]
    theirs = json.loads(str(f["export__json"]))["nodes"]

    def ops(nodes):  # the variables' attributes (__init__, __shape__, ...) are not compared
        return [(n["op"], n["name"], n.get("attrs") if n["op"] != "null" else None, n["inputs"]) for n in nodes]

    assert ops(ours) == ops(theirs)
    back = gluon.SymbolBlock.imports(sym_file, ["data"], param_file, ctx=dnnbind.cpu())
    assert_close(back(x), f["export__y"], rtol=1e-5, atol=2e-6, name="the exported graph's output")


def test_gluon_instancenorm_gradients_through_swapaxes():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 5))
    layer = gluon.nn.InstanceNorm(axis=-1, scale=True, in_channels=5)
    layer.initialize(ctx=dnnbind.cpu())
    layer.gamma.set_data(nd.array(rng.uniform(0.5, 1.5, 5)))
    xa = nd.array(x)
    xa.attach_grad()
    with autograd.record():
        y = layer(xa)
    y.backward(nd.array(np.arange(x.size).reshape(x.shape) % 7))
    # the same as the operator on the channels-first array
    xt = nd.array(x.swapaxes(1, 3))
    xt.attach_grad()
    with autograd.record():
        yt = nd.InstanceNorm(xt, layer.gamma.data(), layer.beta.data(), eps=1e-5)
    yt.backward(nd.array((np.arange(x.size).reshape(x.shape) % 7).swapaxes(1, 3)))
    assert_close(y, yt.asnumpy().swapaxes(1, 3), rtol=1e-6, atol=1e-6, name="output")
    assert_close(xa.grad, xt.grad.asnumpy().swapaxes(1, 3), rtol=1e-5, atol=1e-6, name="gradient")
    assert layer.gamma.grad().shape == (5,)
