"""MXNet's deformable convolutions (ops/defs/deformable_conv.py, ops/reference/deformable_conv.py) and
gluon.contrib.cnn's layers against the real MXNet 1.9.1: fixtures/mxnet_deformable/, written by
fixtures/make_mxnet_deformable.py (outputs; input gradients through mx.autograd for v1: MXNet 1.9.1 has no cpu
backward for v2). The twin must match them; its gradients (v2's above all) match central differences; the GPU
lowering must match the twin. The registry's own tests (tests/test_opdefs.py) run the entries' samples too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind import symbol as sym
from dnnbind.ops.reference import deformable_conv as ref
from tests._helpers import assert_close, numerical_grad

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_deformable")
V1, V2 = "_contrib_DeformableConvolution", "_contrib_ModulatedDeformableConvolution"
OPS = [V1, V2]


def _cases(op: str):
    f = np.load(os.path.join(HERE, f"{op}.npz"))
    out = []
    for i in range(int(f["count"])):
        inputs = {k[len(f"{i}_in_"):]: f[k] for k in f.files if k.startswith(f"{i}_in_")}
        grads = {k[len(f"{i}_d_"):]: f[k] for k in f.files if k.startswith(f"{i}_d_")}
        out.append((inputs, eval(str(f[f"{i}_params"])), f[f"{i}_dy"], f[f"{i}_y"], grads))
    return out


def _fn(op: str):
    return getattr(nd.contrib, op[len("_contrib_"):])


def _run(op, inputs, params, dy, device, dtype=None):
    """(y, {input: gradient}) of dnnbind's op on ``device``, the inputs cast to ``dtype`` when given."""
    xs = {k: nd.array(v, ctx=device, dtype=dtype or v.dtype) for k, v in inputs.items()}
    for v in xs.values():
        v.attach_grad()
    with autograd.record():
        y = _fn(op)(**xs, **params)
    y.backward(nd.array(dy, ctx=device, dtype=y.dtype))
    return y.numpy(), {k: v.grad.numpy() for k, v in xs.items()}


@pytest.mark.parametrize("op", OPS)
def test_cpu_twin_matches_mxnet(op):
    cases = _cases(op)
    assert len(cases) >= 6
    for n, (inputs, params, dy, y_mx, grads_mx) in enumerate(cases):
        y, grads = _run(op, inputs, params, dy, dnnbind.cpu())
        assert y.shape == y_mx.shape, f"{op} case {n} {params}: shape {y.shape}, MXNet {y_mx.shape}"
        assert_close(y, y_mx, rtol=1e-5, atol=1e-5, name=f"{op} case {n} {params}")
        assert (op == V1) == bool(grads_mx)  # v1's fixtures carry every input's gradient
        for k, g in grads_mx.items():
            assert_close(grads[k], g, rtol=1e-5, atol=1e-5, name=f"{op} case {n} {params} gradient of {k}")


def _geometry(op, inputs, params) -> ref.Geometry:
    from dnnbind.ops.opdef import DEFS
    d = DEFS[op]
    xs = [nd.array(v, dtype="float64") for v in inputs.values()]
    if params.get("no_bias"):
        xs.append(None)
    p = nd.REGISTRY[op].schema.parse(params)
    return d.prepare(p, *xs).g


@pytest.mark.parametrize("op", OPS)
def test_gradients_by_central_differences_on_the_twin(op):
    """Every input's gradient, float64, for the fixtures' configurations (stride 2, dilation 2, pad, num_group 2,
    num_deformable_group 2, no_bias, offsets carrying points off every border)."""
    rng = np.random.default_rng(5)
    for inputs, params, _, _, _ in _cases(op)[:5]:
        arrays = {k: v.astype(np.float64) for k, v in inputs.items()}
        if "offset" in arrays and not np.any(arrays["offset"]):
            continue
        g = _geometry(op, arrays, params)
        names = list(arrays)

        def f(**a):
            return ref.forward(g, a["data"], a["offset"], a.get("mask"), a["weight"], a.get("bias"))[0]

        y, saved = ref.forward(g, arrays["data"], arrays["offset"], arrays.get("mask"), arrays["weight"],
                               arrays.get("bias"))
        dy = rng.uniform(0.5, 1.5, y.shape)
        order = ["data", "offset"] + (["mask"] if op == V2 else []) + ["weight", "bias"]
        needs = tuple(k in arrays for k in order)
        got = dict(zip(order, ref.backward(g, saved, dy, needs)))
        for k in names:
            num = numerical_grad(lambda v, k=k: f(**dict(arrays, **{k: v})), arrays[k], dy)
            assert_close(got[k], num, rtol=1e-5, atol=1e-7, name=f"{op} {params} gradient of {k}")


def _one_tap(op, data, dy_, dx_, mask=None):
    """A 1 x 1 kernel, one output pixel at (0, 0) moved by (dy_, dx_), weight 1: the sample itself."""
    x = nd.array(data, dtype="float64")
    off = nd.array(np.array([dy_, dx_], np.float64).reshape(1, 2, 1, 1), dtype="float64")
    w = nd.array(np.ones((1, 1, 1, 1)), dtype="float64")
    h, wd = data.shape[2:]
    kw = {"kernel": (1, 1), "num_filter": 1, "no_bias": True, "stride": (h, wd)}
    if op == V2:
        m = nd.array(np.full((1, 1, 1, 1), 1.0 if mask is None else mask), dtype="float64")
        return float(_fn(op)(x, off, m, w, **kw).numpy().ravel()[0])
    return float(_fn(op)(x, off, w, **kw).numpy().ravel()[0])


def test_boundary_rules_of_each_version():
    """v1 reads a point only inside [0, H) x [0, W), its last row alone; v2 fades to zero over (-1, 0) and
    (H - 1, H); v2's value is times the mask."""
    data = np.arange(1.0, 13.0).reshape(1, 1, 3, 4)  # rows 1..4, 5..8, 9..12
    inside = 0.75 * (7 + 8) / 2 + 0.25 * (11 + 12) / 2  # rows 1 and 2, halfway between columns 2 and 3
    assert _one_tap(V1, data, 1.25, 2.5) == pytest.approx(inside)
    assert _one_tap(V2, data, 1.25, 2.5) == pytest.approx(inside)
    assert _one_tap(V1, data, 2.5, 1.0) == pytest.approx(10.0)  # the last row alone, no fading
    assert _one_tap(V2, data, 2.5, 1.0) == pytest.approx(5.0)  # half of row 2, half of a zero row
    assert _one_tap(V1, data, 1.0, 3.75) == pytest.approx(8.0)  # the last column alone
    assert _one_tap(V2, data, 1.0, 3.75) == pytest.approx(0.25 * 8.0)
    assert _one_tap(V1, data, -0.5, 1.0) == 0.0  # above the first row: nothing
    assert _one_tap(V2, data, -0.5, 1.0) == pytest.approx(0.5 * 2.0)
    assert _one_tap(V1, data, 3.0, 1.0) == 0.0 and _one_tap(V2, data, 3.0, 1.0) == 0.0
    assert _one_tap(V2, data, -1.0, 1.0) == 0.0
    assert _one_tap(V2, data, 1.0, 1.0, mask=0.3) == pytest.approx(0.3 * 6.0)


def test_offset_channels_are_y_then_x_per_tap_and_group():
    """Offset channel 2k moves tap k down, 2k + 1 right; the second deformable group's channels move the second
    half of the data's channels."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5))
    w = np.zeros((2, 2, 1, 2))
    w[0, 0, 0, 1] = 1.0  # output 0: channel 0, tap 1 (i=0, j=1)
    w[1, 1, 0, 1] = 1.0  # output 1: channel 1, tap 1
    off = np.zeros((1, 2 * 2 * 2, 5, 4))
    off[0, 2, :, :] = 1.0  # group 0, tap 1: one row down
    off[0, 4 + 3, :, :] = -1.0  # group 1, tap 1: one column left
    y = nd.contrib.DeformableConvolution(nd.array(x), nd.array(off), nd.array(w), kernel=(1, 2), num_filter=2,
                                         num_deformable_group=2, no_bias=True).numpy()
    assert_close(y[0, 0, :4], x[0, 0, 1:, 1:], rtol=1e-6, atol=1e-6, name="group 0 moved down")
    assert_close(y[0, 0, 4], np.zeros(4), rtol=0, atol=0, name="group 0 past the last row")
    assert_close(y[0, 1], x[0, 1, :, :4], rtol=1e-6, atol=1e-6, name="group 1 moved left onto tap 0's column")


def test_zero_offsets_and_unit_masks_are_a_plain_convolution():
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 3)), rng.standard_normal(6)
    kw = {"kernel": (3, 3), "num_filter": 6, "num_group": 2, "stride": (2, 1), "pad": (1, 1), "dilate": (1, 2)}
    want = nd.Convolution(nd.array(x), nd.array(w), nd.array(b), **kw).numpy()
    off = nd.zeros((2, 18) + want.shape[2:])
    got1 = nd.contrib.DeformableConvolution(nd.array(x), off, nd.array(w), nd.array(b), **kw).numpy()
    got2 = nd.contrib.ModulatedDeformableConvolution(nd.array(x), off, nd.ones((2, 9) + want.shape[2:]), nd.array(w),
                                                     nd.array(b), **kw).numpy()
    assert_close(got1, want, rtol=1e-5, atol=1e-5, name="v1, zero offsets")
    assert_close(got2, want, rtol=1e-5, atol=1e-5, name="v2, zero offsets, masks 1")


def test_float16_and_float64_run_on_the_cpu():
    inputs, params, dy, y_mx, _ = _cases(V1)[0]
    y64, g64 = _run(V1, inputs, params, dy, dnnbind.cpu(), "float64")
    y16, g16 = _run(V1, inputs, params, dy, dnnbind.cpu(), "float16")
    assert y64.dtype == np.float64 and y16.dtype == np.float16 and g16["offset"].dtype == np.float16
    assert_close(y64, y_mx, rtol=1e-5, atol=1e-5, name="float64")
    assert_close(y16.astype(np.float64), y64, rtol=2e-2, atol=5e-2, name="float16")


def test_symbol_names_and_shapes_follow_mxnet():
    d, o = sym.var("data"), sym.var("offset")
    s = sym.contrib.DeformableConvolution(data=d, offset=o, kernel=(3, 3), num_filter=4, pad=(1, 1), name="dc")
    assert s.list_arguments() == ["data", "offset", "dc_weight", "dc_bias"]
    args, outs, _ = s.infer_shape(data=(2, 6, 5, 7), offset=(2, 18, 5, 7))
    assert args == [(2, 6, 5, 7), (2, 18, 5, 7), (4, 6, 3, 3), (4,)] and outs == [(2, 4, 5, 7)]
    m = sym.contrib.ModulatedDeformableConvolution(data=d, offset=o, mask=sym.var("mask"), kernel=(3, 3),
                                                   num_filter=4, no_bias=True, num_group=2, name="mdc")
    assert m.list_arguments() == ["data", "offset", "mask", "mdc_weight"]
    args, outs, _ = m.infer_shape(data=(2, 6, 5, 7), offset=(2, 18, 3, 5), mask=(2, 9, 3, 5))
    assert args[3] == (4, 3, 3, 3) and outs == [(2, 4, 3, 5)]
    with pytest.raises(ValueError, match="offset"):
        s.infer_shape(data=(2, 6, 5, 7), offset=(2, 16, 5, 7))


def test_symbol_executor_matches_nd():
    inputs, params, dy, y_mx, grads_mx = _cases(V1)[2]
    names = list(inputs)
    s = sym.contrib.DeformableConvolution(*[sym.var(k) for k in names], **params, name="dc")
    ex = s.bind(dnnbind.cpu(), {k: nd.array(v) for k, v in inputs.items()},
                args_grad={k: nd.zeros(v.shape) for k, v in inputs.items()})
    y = ex.forward(is_train=True)[0]
    ex.backward(nd.array(dy))
    assert_close(y, y_mx, rtol=1e-5, atol=1e-5, name="executor forward")
    for k in names:
        assert_close(ex.grad_dict[k], grads_mx[k], rtol=1e-5, atol=1e-5, name=f"executor gradient of {k}")


def test_the_gpu_chunk_follows_im2col_step_and_workspace():
    from dnnbind.ops.opdef import DEFS

    def chunk(op, n, c, hw, **kw):
        arrays = [nd.zeros((n, c, hw, hw)), nd.zeros((n, 18, hw, hw))]
        if op == V2:
            arrays.append(nd.zeros((n, 9, hw, hw)))
        arrays.append(nd.zeros((3, c, 3, 3)))
        params = dict({"kernel": (3, 3), "num_filter": 3, "pad": (1, 1), "no_bias": True}, **kw)
        return DEFS[op].prepare(nd.REGISTRY[op].schema.parse(params), *arrays, None).chunk

    assert chunk(V1, 5, 2, 4) == 5 and chunk(V1, 100, 2, 4) == 64
    assert chunk(V2, 8, 2, 4, im2col_step=4) == 4 and chunk(V2, 3, 2, 4) == 3
    # 4 channels x 9 taps x 60 x 60 float32 columns: 518400 bytes a sample, so 2 fit in a 1 MB workspace
    assert chunk(V1, 5, 4, 60, workspace=1) == 2 and chunk(V1, 5, 4, 60, workspace=0) == 1


# bad input: refused before running, naming the op, the argument and the shapes ------------------------------------

def _x(*shape, dtype="float32"):
    return nd.array(np.random.default_rng(0).standard_normal(shape), dtype=dtype)


D, M = nd.contrib.DeformableConvolution, nd.contrib.ModulatedDeformableConvolution
K3 = {"kernel": (3, 3), "num_filter": 3, "pad": (1, 1)}


@pytest.mark.parametrize("call,match", [
    (lambda: D(_x(1, 2, 5, 5), _x(1, 16, 5, 5), _x(3, 2, 3, 3), _x(3), **K3),
     r"DeformableConvolution: offset has shape \(1, 16, 5, 5\) .* needs \(1, 18, 5, 5\)"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 4, 5), _x(3, 2, 3, 3), _x(3), **K3), r"offset has shape \(1, 18, 4, 5\)"),
    (lambda: D(_x(2, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **K3), r"offset has shape \(1, 18, 5, 5\)"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 2, 3), _x(3), **K3), r"weight has shape \(3, 2, 2, 3\)"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(4), **K3), r"bias has shape \(4,\)"),
    (lambda: D(_x(1, 3, 5, 5), _x(1, 18, 5, 5), _x(4, 1, 3, 3), _x(4), **dict(K3, num_filter=4, num_group=2)),
     "input num_filter must divide group size"),
    (lambda: D(_x(1, 3, 5, 5), _x(1, 36, 5, 5), _x(4, 3, 3, 3), _x(4), **dict(K3, num_filter=4,
                                                                             num_deformable_group=2)),
     "input num_filter must divide deformable group size"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 1, 3, 3), _x(3), **dict(K3, num_group=2)),
     "output num_filter must divide group size"),
    (lambda: D(_x(1, 2, 5), _x(1, 6, 5), _x(3, 2, 3), _x(3), kernel=(3,), num_filter=3, pad=(1,)),
     r"kernel must be 2-D"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **K3, layout="NCW"), "layout must be 'NCHW'"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **K3, layout="NHWC"), "valid values"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 1, 1), _x(3, 2, 3, 3), _x(3), kernel=(3, 3), num_filter=3, dilate=(3, 3)),
     r"spans \(7, 7\), more than the padded input \(5, 5\)"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **dict(K3, num_group=0)),
     "num_group should be greater equal to 1"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **dict(K3, stride=(0, 1))),
     "stride must be >= 1"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **dict(K3, pad=(1,))),
     r"pad \(1,\) has 1 value"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5, dtype="float64"), _x(3, 2, 3, 3), _x(3), **K3),
     "offset is float64 but data is float32"),
    (lambda: D(nd.array(np.ones((1, 2, 5, 5)), dtype="int32"), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **K3),
     "floating-point"),
    (lambda: D(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **dict(K3, no_bias=True)),
     "no_bias=True"),
    (lambda: M(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(1, 8, 5, 5), _x(3, 2, 3, 3), _x(3), **K3),
     r"ModulatedDeformableConvolution: mask has shape \(1, 8, 5, 5\) .* needs \(1, 9, 5, 5\)"),
    (lambda: M(_x(3, 2, 5, 5), _x(3, 18, 5, 5), _x(3, 9, 5, 5), _x(3, 2, 3, 3), _x(3), **K3, im2col_step=2),
     "input batchsize must be smaller than or divide im2col_step"),
    (lambda: M(_x(1, 2, 5, 5), _x(1, 36, 5, 5), _x(1, 18, 5, 5), _x(3, 2, 3, 3), _x(3), **K3,
               num_deformable_group=2), "output num_filter must divide deformable group size"),
    (lambda: M(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(1, 9, 5, 5), _x(3, 2, 3, 3), _x(3), **K3, im2col_step=0),
     "im2col_step should be greater equal to 1"),
    (lambda: M(_x(1, 2, 5, 5), _x(1, 18, 5, 5), _x(1, 9, 5), _x(3, 2, 3, 3), _x(3), **K3),
     r"mask must be 4-D \(N, C, H, W\), got shape \(1, 9, 5\)"),
])
def test_bad_input_is_refused_with_context(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_mxnet_batch_rule_for_im2col_step_lets_a_multiple_through():
    y = M(_x(4, 2, 5, 5), _x(4, 18, 5, 5), _x(4, 9, 5, 5), _x(3, 2, 3, 3), _x(3), **K3, im2col_step=2)
    assert y.shape == (4, 3, 5, 5)


# gluon.contrib.cnn ------------------------------------------------------------------------------------------------

def _blocks():
    f = np.load(os.path.join(HERE, "gluon_blocks.npz"))
    for i in range(int(f["count"])):
        yield i, f, str(f[f"{i}_class"]), eval(str(f[f"{i}_kwargs"]))


def test_gluon_blocks_have_mxnets_parameters_and_match_its_outputs():
    from dnnbind.gluon.contrib import cnn
    for i, f, cls, kwargs in _blocks():
        block = getattr(cnn, cls)(**kwargs)
        params = block.collect_params()
        assert list(params.keys()) == eval(str(f[f"{i}_names"])), cls
        assert [tuple(p.shape) for p in params.values()] == eval(str(f[f"{i}_shapes_before"])), cls
        if cls == "DeformableConvolution":  # (v2 keeps Block's own repr)
            assert repr(block) == str(f[f"{i}_repr_before"])
        block.initialize(dnnbind.init.Uniform(0.5))
        x = nd.array(f[f"{i}_x"])
        block(x)
        for k, (name, p) in enumerate(params.items()):
            init = f[f"{i}_init_{k}"]
            got = p.data().numpy()
            assert got.shape == init.shape, name
            if not np.any(init):  # MXNet's zeros: the biases and the offset layer
                assert not np.any(got), f"{name} should start at zero"
            else:  # the global initializer: uniform in [-0.5, 0.5]
                assert np.all(np.abs(got) <= 0.5) and np.std(got) > 0.1, name
        if cls == "DeformableConvolution":
            assert repr(block) == str(f[f"{i}_repr"])
        for k, p in enumerate(params.values()):
            p.set_data(nd.array(f[f"{i}_param_{k}"]))
        x.attach_grad()
        with autograd.record():
            y = block(x)
        y.backward(nd.array(f[f"{i}_dy"]))
        assert_close(y, f[f"{i}_y"], rtol=1e-5, atol=1e-5, name=f"{cls} {kwargs}")
        if f[f"{i}_dx"].size:
            assert_close(x.grad, f[f"{i}_dx"], rtol=1e-4, atol=1e-5, name=f"{cls} {kwargs} data gradient")


def test_gluon_blocks_train_their_offset_layer():
    """The offset convolution starts at zero and still takes a gradient (through the sampling)."""
    from dnnbind.gluon.contrib import cnn
    for cls in (cnn.DeformableConvolution, cnn.ModulatedDeformableConvolution):
        block = cls(4, kernel_size=3, padding=1)
        block.initialize()
        x = nd.array(np.random.default_rng(0).standard_normal((2, 3, 6, 6)))
        with autograd.record():
            y = block(x)
        y.backward()
        assert np.any(block.offset_weight.grad().numpy()), cls.__name__
        assert np.any(block.deformable_conv_weight.grad().numpy()), cls.__name__


def test_gluon_blocks_export_and_import(tmp_path):
    """Written with MXNet's hybrid_forward, the layers trace to a symbol graph: exported, imported back, same output
    (the same files load in MXNet 1.9.1, checked by hand when this was written)."""
    from dnnbind.gluon import SymbolBlock, nn
    from dnnbind.gluon.contrib import cnn
    net = nn.HybridSequential()
    net.add(cnn.DeformableConvolution(4, 3, padding=1),
            cnn.ModulatedDeformableConvolution(2, 3, padding=1, activation="relu", offset_use_bias=False))
    net.initialize(dnnbind.init.Uniform(0.3))
    x = nd.array(np.random.default_rng(3).standard_normal((2, 3, 6, 6)))
    net.hybridize()
    net(x)
    for p in net.collect_params().values():  # offsets away from zero
        p.set_data(nd.array(np.random.default_rng(4).uniform(-0.3, 0.3, p.shape)))
    y = net(x)
    sym_file, params_file = net.export(str(tmp_path / "dcn"))
    back = SymbolBlock.imports(sym_file, ["data"], params_file)
    assert_close(back(x), y, rtol=1e-6, atol=1e-6, name="exported and imported")


def test_gluon_block_arguments():
    from dnnbind.gluon.contrib import cnn
    with pytest.raises(ValueError, match="Only supports 'NCHW' and 'NHWC' layout"):
        cnn.DeformableConvolution(4, 3, layout="NCW")
    block = cnn.DeformableConvolution(4, 3, layout="NHWC", in_channels=2)
    block.initialize()
    with pytest.raises(ValueError, match="valid values"):  # as MXNet: its operator refuses NHWC at the forward
        block(nd.array(np.ones((1, 5, 5, 2))))


# gpu: the kernels and cuBLAS against the twin ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_lowering_matches_the_twin(op, dtype, gpu):
    tol = 2e-5 if dtype == "float32" else 1e-10
    for n, (inputs, params, dy, _, _) in enumerate(_cases(op)):
        y_c, g_c = _run(op, inputs, params, dy, dnnbind.cpu(), dtype)
        y_g, g_g = _run(op, inputs, params, dy, gpu, dtype)
        assert_close(y_g, y_c, rtol=tol, atol=tol, name=f"{op} case {n} {params} {dtype}")
        for k in g_c:
            assert_close(g_g[k], g_c[k], rtol=tol * 10, atol=tol * 10,
                         name=f"{op} case {n} {params} {dtype} gradient of {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_chunks_and_partial_gradients(op, gpu):
    """Several chunks (one uneven for v1: 5 samples, 2 a chunk in 1 MB), and backwards that want only some
    gradients, against the twin in float64."""
    rng = np.random.default_rng(7)
    n, c, hw = 5 if op == V1 else 4, 4, 60
    params = {"kernel": (3, 3), "num_filter": 3, "pad": (1, 1), "workspace": 1}
    if op == V2:
        params["im2col_step"] = 2
    arrays = {"data": rng.standard_normal((n, c, hw, hw)), "offset": rng.uniform(-3, 3, (n, 18, hw, hw))}
    if op == V2:
        arrays["mask"] = rng.uniform(0.2, 1.8, (n, 9, hw, hw))
    arrays.update(weight=rng.standard_normal((3, c, 3, 3)), bias=rng.standard_normal(3))
    dy = rng.uniform(0.5, 1.5, (n, 3, hw, hw))
    y_c, g_c = _run(op, arrays, params, dy, dnnbind.cpu(), "float64")
    y_g, g_g = _run(op, arrays, params, dy, gpu, "float64")
    assert_close(y_g, y_c, rtol=1e-10, atol=1e-10, name=f"{op} chunked forward")
    for k in g_c:
        assert_close(g_g[k], g_c[k], rtol=1e-9, atol=1e-9, name=f"{op} chunked gradient of {k}")
    for wanted in (["data"], ["offset"], ["weight", "bias"]) + ((["mask"],) if op == V2 else ()):
        xs = {k: nd.array(v, ctx=gpu, dtype="float64") for k, v in arrays.items()}
        for k in wanted:
            xs[k].attach_grad()
        with autograd.record():
            y = _fn(op)(**xs, **params)
        y.backward(nd.array(dy, ctx=gpu, dtype="float64"))
        for k in wanted:
            assert_close(xs[k].grad, g_c[k], rtol=1e-9, atol=1e-9, name=f"{op} only {wanted}: gradient of {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_float16_runs_as_float32(op, gpu):
    inputs, params, dy, _, _ = _cases(op)[2]
    y32, g32 = _run(op, inputs, params, dy, dnnbind.cpu(), "float32")
    y16, g16 = _run(op, inputs, params, dy, gpu, "float16")
    assert y16.dtype == np.float16 and all(g.dtype == np.float16 for g in g16.values())
    assert_close(y16.astype(np.float32), y32, rtol=2e-2, atol=5e-2, name=f"{op} float16")
    for k in g32:
        assert_close(g16[k].astype(np.float32), g32[k], rtol=5e-2, atol=1e-1, name=f"{op} float16 gradient of {k}")


@pytest.mark.gpu
def test_gpu_gluon_blocks_match_mxnet(gpu):
    from dnnbind.gluon.contrib import cnn
    for i, f, cls, kwargs in _blocks():
        block = getattr(cnn, cls)(**kwargs)
        block.initialize(ctx=gpu)
        block(nd.array(f[f"{i}_x"], ctx=gpu))
        for k, p in enumerate(block.collect_params().values()):
            p.set_data(nd.array(f[f"{i}_param_{k}"], ctx=gpu))
        y = block(nd.array(f[f"{i}_x"], ctx=gpu))
        assert_close(y, f[f"{i}_y"], rtol=1e-4, atol=1e-4, name=f"{cls} {kwargs} on the GPU")


def test_kernels_compile_for_sm_90_without_a_gpu():
    """Every instantiation the lowering asks for compiles (NVRTC, no GPU needed), without warnings."""
    from dnnbind.kernels import Module
    from dnnbind.ops.defs import deformable_conv as defs
    try:
        mod = Module(defs.SOURCE, defs.NAMES, arch="sm_90")
    except (OSError, RuntimeError) as exc:  # no NVRTC library on this machine
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert mod.code and set(mod.lowered_names) == set(defs.NAMES)
    assert "warning" not in mod.log.lower(), mod.log


# the GPU lowering on the host: its CUDA source compiled by g++, cuBLAS emulated ------------------------------------
# What this checks without a GPU: the lowering's launch arguments, chunking, pointer offsets, cuBLAS argument order
# (column-major, swapped operands, strides) and the kernels' own arithmetic, against the twin. The GPU runs above
# check the same on the device.

_HOST_PRELUDE = r"""
#include <cmath>
#include <cstddef>
using std::floor;
struct dn_dim3 { unsigned x; };
static const dn_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
#define __global__
#define __device__
#define __forceinline__ inline
template <typename T> T atomicAdd(T* p, T v) { T old = *p; *p += v; return old; }
"""

_HOST_WRAPPERS = r"""
#define DN_P const T*
#define DN_GEO int c, int h, int w, int kh, int kw, int ph, int pw, int sh, int sw, int dh, int dw, int dg, int ho, \
    int wo, int modulated
#define DN_GEO_ARGS c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, dg, ho, wo, modulated
#define DN_WRAP(T, S) \
extern "C" void im2col_##S(DN_P x, DN_P off, DN_P mask, T* col, long long total, int n0, int nb, DN_GEO) { \
    dn_dcn_im2col<T>(x, off, mask, col, total, n0, nb, DN_GEO_ARGS); } \
extern "C" void col2im_##S(DN_P dcol, DN_P off, DN_P mask, T* dx, long long total, int n0, int nb, DN_GEO) { \
    dn_dcn_col2im<T>(dcol, off, mask, dx, total, n0, nb, DN_GEO_ARGS); } \
extern "C" void coord_##S(DN_P dcol, DN_P x, DN_P off, DN_P mask, T* doff, T* dmask, long long total, int n0, \
    int nb, DN_GEO) { dn_dcn_coord<T>(dcol, x, off, mask, doff, dmask, total, n0, nb, DN_GEO_ARGS); } \
extern "C" void swap_##S(DN_P src, T* dst, DN_P bias, long long total, int p, int q, long long lsz) { \
    dn_dcn_swap<T>(src, dst, bias, total, p, q, lsz); }
#define T float
DN_WRAP(float, float)
#undef T
#define T double
DN_WRAP(double, double)
#undef T
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    import ctypes
    import shutil
    import subprocess
    from dnnbind.ops.defs import deformable_conv as defs
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the kernels for the host")
    d = tmp_path_factory.mktemp("dcn_host")
    (d / "k.cpp").write_text(_HOST_PRELUDE + defs.SOURCE + _HOST_WRAPPERS)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.cpp")], check=True,
                   capture_output=True, timeout=300)
    return ctypes.CDLL(str(d / "k.so"))


class _HostDevice:
    """GPU NDArrays whose pointers are host numpy buffers: the kernels (built for the host) and the emulated cuBLAS
    read and write them directly."""

    def __init__(self, lib):
        self.lib, self.buffers = lib, []

    def alloc(self, shape, dtype, fill=None):
        from dnnbind.runtime.array import NDArray
        buf = np.full(max(int(np.prod(shape)), 1), np.nan if fill is None else fill, np.dtype(dtype))
        self.buffers.append(buf)
        return NDArray._from_ptr(buf.ctypes.data, tuple(shape), np.dtype(dtype), dnnbind.gpu(0), None)

    def put(self, a):
        x = self.alloc(a.shape, a.dtype)
        self.view(x.ptr, a.size, a.dtype)[:] = a.ravel()
        return x

    def view(self, ptr, count, dtype):
        """``count`` elements at address ``ptr`` (inside one of the buffers), as a writable numpy array."""
        for buf in self.buffers:
            lo = buf.ctypes.data
            if lo <= ptr < lo + buf.nbytes:
                start = (ptr - lo) // buf.itemsize
                assert buf.dtype == np.dtype(dtype) and start + count <= buf.size, "access past an allocation"
                return buf[start:start + count]
        raise AssertionError(f"pointer {ptr:#x} is in no allocation")

    def get(self, a):
        return self.view(a.ptr, a.size, a.dtype).reshape(a.shape).copy()

    def launch(self, name, total, args, like):
        import ctypes
        from dnnbind.runtime.array import NDArray
        conv = []
        for a in args:
            if isinstance(a, NDArray):
                conv.append(ctypes.c_void_p(a.ptr))
            elif a is None:
                conv.append(ctypes.c_void_p(None))
            elif isinstance(a, ctypes.c_void_p):
                conv.append(a)
            elif isinstance(a, np.int64):
                conv.append(ctypes.c_longlong(int(a)))
            else:
                assert type(a) is int and -2**31 <= a < 2**31, (name, a)
                conv.append(ctypes.c_int(a))
        kind = name[len("dn_dcn_"):]
        getattr(self.lib, f"{kind}_{'float' if like.dtype == np.float32 else 'double'}")(*conv)

    def gemm_strided_batched(self, dtype):
        """cublas<t>gemmStridedBatched, column-major, as cuBLAS defines it."""
        def gemm(handle, transa, transb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch):
            isz = np.dtype(dtype).itemsize
            for i in range(batch):
                def mat(ptr, ld, rows, cols):  # a column-major (rows x cols) matrix with leading dimension ld
                    flat = self.view(ptr, ld * (cols - 1) + rows, dtype)
                    return flat[np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]]
                opa = mat(a + i * sa * isz, lda, k, m).T if transa else mat(a + i * sa * isz, lda, m, k)
                opb = mat(b + i * sb * isz, ldb, n, k).T if transb else mat(b + i * sb * isz, ldb, k, n)
                flat = self.view(c + i * sc * isz, ldc * (n - 1) + m, dtype)
                idx = np.arange(m)[:, None] + ldc * np.arange(n)[None, :]
                old = np.where(beta != 0, flat[idx], 0)
                flat[idx] = alpha * (opa @ opb) + beta * old
        return gemm


@pytest.fixture
def host_gpu(host_kernels, monkeypatch):
    import types
    from dnnbind.ops.defs import deformable_conv as defs
    dev = _HostDevice(host_kernels)
    monkeypatch.setattr(defs, "empty", lambda shape, dtype, device=None: dev.alloc(shape, dtype))
    monkeypatch.setattr(defs, "zeros", lambda shape, dtype, device=None: dev.alloc(shape, dtype, 0))
    monkeypatch.setattr(defs, "_launch", dev.launch)
    monkeypatch.setattr(defs, "blas", lambda like: 0)
    monkeypatch.setattr(defs, "D", types.SimpleNamespace(scalar_ptr=lambda v, dtype: float(v)))
    lib = types.SimpleNamespace(cublasSgemmStridedBatched=dev.gemm_strided_batched(np.float32),
                                cublasDgemmStridedBatched=dev.gemm_strided_batched(np.float64))
    monkeypatch.setattr(defs, "cublas", types.SimpleNamespace(lib=lib))
    monkeypatch.setattr(defs, "ones_vector", lambda device, n, dtype: dev.put(np.ones(n, dtype)))

    def row_sums(h, a_ptr, ones_ptr, out_ptr, rows, cols, alpha, beta, dtype):
        a = dev.view(a_ptr, rows * cols, dtype).reshape(rows, cols)
        out = dev.view(out_ptr, rows, dtype)
        out[:] = alpha * a.sum(axis=1) + (beta * out if beta else 0)
    monkeypatch.setattr(defs, "row_sums_into", row_sums)
    return dev


def _host_case(op, inputs, params, dy, dev, dtype, needs=None):
    """The GPU lowering's forward and backward on the host device; (y, {input: gradient})."""
    from dnnbind.ops.opdef import DEFS, Call, Grads
    d = DEFS[op]
    names = list(inputs) + (["bias"] if params.get("no_bias") else [])
    cpu = [nd.array(inputs[k], dtype=dtype) if k in inputs else None for k in names]
    p = nd.REGISTRY[op].schema.parse(params)
    geo = d.prepare(p, *cpu)
    c = Call(geo, p, dnnbind.gpu(0), True)
    xs = [dev.put(inputs[k].astype(dtype)) if k in inputs else None for k in names]
    y, saved = d.gpu.forward(c, *xs)
    needs = tuple(k in inputs for k in names) if needs is None else needs
    grads = d.gpu.backward(c, saved, Grads(needs, (None,) * len(names), False), dev.put(dy.astype(dtype)))
    return dev.get(y), {k: dev.get(g) for k, g in zip(names, grads) if g is not None}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_lowering_on_the_host_matches_the_twin(op, dtype, host_gpu):
    tol = 2e-5 if dtype == "float32" else 1e-12
    for n, (inputs, params, dy, _, _) in enumerate(_cases(op)):
        y_c, g_c = _run(op, inputs, params, dy, dnnbind.cpu(), dtype)
        y_h, g_h = _host_case(op, inputs, params, dy, host_gpu, dtype)
        assert_close(y_h, y_c, rtol=tol, atol=tol, name=f"{op} case {n} {params} {dtype}")
        assert set(g_h) == set(g_c)
        for k in g_c:
            assert_close(g_h[k], g_c[k], rtol=tol * 10, atol=tol * 10, name=f"{op} case {n} {params} gradient of {k}")


@pytest.mark.parametrize("op", OPS)
def test_gpu_lowering_on_the_host_in_chunks_and_with_some_gradients(op, host_gpu):
    """Uneven chunks (v1: 5 samples, 2 a chunk) and backwards that want one gradient, in float64."""
    rng = np.random.default_rng(11)
    n, c, hw = (5, 4, 60) if op == V1 else (4, 2, 6)
    params = {"kernel": (3, 3), "num_filter": 3, "pad": (1, 1), "workspace": 1}
    if op == V2:
        params["im2col_step"] = 2
    inputs = {"data": rng.standard_normal((n, c, hw, hw)), "offset": rng.uniform(-3, 3, (n, 18, hw, hw))}
    if op == V2:
        inputs["mask"] = rng.uniform(0.2, 1.8, (n, 9, hw, hw))
    inputs.update(weight=rng.standard_normal((3, c, 3, 3)), bias=rng.standard_normal(3))
    dy = rng.uniform(0.5, 1.5, (n, 3, hw, hw))
    y_c, g_c = _run(op, inputs, params, dy, dnnbind.cpu(), "float64")
    names = list(inputs)
    for i, k in enumerate(names):
        needs = tuple(j == i for j in range(len(names)))
        y_h, g_h = _host_case(op, inputs, params, dy, host_gpu, "float64", needs)
        assert_close(y_h, y_c, rtol=1e-12, atol=1e-12, name=f"{op} chunked forward")
        assert set(g_h) == {k}
        assert_close(g_h[k], g_c[k], rtol=1e-10, atol=1e-10, name=f"{op} chunked, only the gradient of {k}")
