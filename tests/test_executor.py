"""Symbol.simple_bind / bind and the Executor against MXNet 1.9.1 (tests/fixtures/mxnet_executor): an MLP with
BatchNorm and SoftmaxOutput gives MXNet's training outputs, gradients (grad_req 'write', and 'add' over two
backward passes), updated BatchNorm statistics and inference outputs; on the cpu and the GPU."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import dnnbind as mx
import dnnbind.symbol as sym
from dnnbind import nd
from dnnbind._lib.errors import DnnbindTypeError, DnnbindValueError

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_executor"
CASES = np.load(FIX / "cases.npz")
NET = sym.load(str(FIX / "net-symbol.json"))
SHAPES = {"data": (5, 4), "softmax_label": (5,)}


def _exe(req, ctx):
    exe = NET.simple_bind(ctx, grad_req=req, **SHAPES)
    init = {k[5:]: nd.array(CASES[k], ctx=ctx) for k in CASES.files if k.startswith("init_")}
    aux = {k[8:]: nd.array(CASES[k], ctx=ctx) for k in CASES.files if k.startswith("auxinit_")}
    exe.copy_params_from(init, aux)
    return exe


@pytest.mark.parametrize("req", ["write", "add"])
@pytest.mark.parametrize("ctx", [pytest.param(mx.cpu(), id="cpu"),
                                 pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)])
def test_training_step_is_mxnets(req, ctx):
    ctx = mx.gpu(0) if ctx == "gpu" else ctx
    tol = dict(rtol=1e-5, atol=1e-6) if ctx.kind == "cpu" else dict(rtol=1e-4, atol=1e-5)
    exe = _exe(req, ctx)
    for _ in range(2 if req == "add" else 1):
        exe.forward(is_train=True)
        exe.backward()
    np.testing.assert_allclose(exe.outputs[0].asnumpy(), CASES[f"{req}_train_out"], **tol)
    for k in CASES.files:
        if k.startswith(f"{req}_grad_"):
            np.testing.assert_allclose(exe.grad_dict[k[len(req) + 6:]].asnumpy(), CASES[k], err_msg=k, **tol)
        if k.startswith(f"{req}_aux_"):
            np.testing.assert_allclose(exe.aux_dict[k[len(req) + 5:]].asnumpy(), CASES[k], err_msg=k, **tol)
    exe.forward(is_train=False)
    np.testing.assert_allclose(exe.outputs[0].asnumpy(), CASES[f"{req}_test_out"], **tol)
    assert list(exe.output_dict) == ["softmax_output"]


def test_bind_uses_the_callers_arrays_and_forward_copies_inputs():
    ctx = mx.cpu()
    names = NET.list_arguments()
    arg_shapes, _, aux_shapes = NET.infer_shape(**SHAPES)
    args = {n: nd.array(CASES[f"init_{n}"], ctx=ctx) for n in names}
    grads = {n: nd.zeros(s, ctx=ctx) for n, s in zip(names, arg_shapes) if n not in ("data", "softmax_label")}
    aux = [nd.array(CASES[f"auxinit_{n}"], ctx=ctx) for n in NET.list_auxiliary_states()]
    exe = NET.bind(ctx, args, args_grad=grads, aux_states=aux)
    assert exe.arg_dict["fc1_weight"] is args["fc1_weight"] and "data" not in exe.grad_dict
    exe.forward(is_train=True, data=CASES["init_data"])
    exe.backward()
    np.testing.assert_allclose(grads["fc1_weight"].asnumpy(), CASES["write_grad_fc1_weight"], rtol=1e-5, atol=1e-6)


def test_bad_binds_are_refused():
    ctx = mx.cpu()
    with pytest.raises(DnnbindValueError, match="cannot infer the shapes of \\['softmax_label'\\]|cannot infer"):
        sym.FullyConnected(sym.var("data"), num_hidden=2).simple_bind(ctx)
    exe = NET.simple_bind(ctx, **SHAPES)
    with pytest.raises(DnnbindValueError, match="data has shape \\(3, 4\\), the executor was bound with"):
        exe.forward(data=np.zeros((3, 4), np.float32))
    with pytest.raises(DnnbindValueError, match="unknown argument 'date'"):
        exe.forward(date=np.zeros((5, 4), np.float32))
    with pytest.raises(DnnbindValueError, match="call forward\\(is_train=True\\) first"):
        exe.backward()
    with pytest.raises(DnnbindValueError, match="no array for argument"):
        NET.bind(ctx, {"data": nd.zeros((5, 4), ctx=ctx)})
    with pytest.raises(DnnbindTypeError, match="must be an NDArray"):
        NET.bind(ctx, [np.zeros(1)] * len(NET.list_arguments()), aux_states=[nd.zeros((6,), ctx=ctx)] * 2)
    with pytest.raises(DnnbindValueError, match="no array for auxiliary state"):
        NET.bind(ctx, [nd.zeros((1,), ctx=ctx)] * len(NET.list_arguments()))
    with pytest.raises(DnnbindValueError, match="grad_req"):
        NET.simple_bind(ctx, grad_req="sometimes", **SHAPES)
    with pytest.raises(DnnbindValueError, match="not in the arguments"):
        exe.copy_params_from({"nope": nd.zeros((1,), ctx=ctx)})
    exe.copy_params_from({"nope": nd.zeros((1,), ctx=ctx)}, allow_extra_params=True)
