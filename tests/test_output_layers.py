"""nd.SoftmaxOutput and the regression/MakeLoss output layers: forward and input gradient against MXNet 1.9.1
(tests/fixtures/mxnet_output_layers, 28 cases: normalization null/batch/valid, ignore_label, label smoothing,
multi_output, preserve_shape, >2-D data), on the cpu and the GPU; and the label shapes MXNet infers and accepts."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, nd
from dnnbind._lib.errors import DnnbindValueError, UnknownArgumentError

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_output_layers"
CASES = json.loads((FIX / "cases.json").read_text())["cases"]
ARRAYS = np.load(FIX / "cases.npz")


def _run(k, case, ctx):
    x = nd.array(ARRAYS[f"{k}_data"], ctx=ctx)
    x.attach_grad()
    args = [x] + ([nd.array(ARRAYS[f"{k}_label"], ctx=ctx)] if case["label"] else [])
    with autograd.record():
        y = getattr(nd, case["op"])(*args, **case["kwargs"])
    y.backward()
    np.testing.assert_allclose(y.asnumpy(), ARRAYS[f"{k}_out"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.asnumpy(), ARRAYS[f"{k}_grad"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c['op']}-{c['kwargs']}" for c in CASES])
def test_outputs_and_gradients_are_mxnets(k):
    _run(k, CASES[k], mx.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c['op']}-{c['kwargs']}" for c in CASES])
def test_outputs_and_gradients_are_mxnets_on_the_gpu(k):
    _run(k, CASES[k], mx.gpu(0))


def test_the_gradient_ignores_what_comes_from_above_unless_out_grad():
    x = nd.array(np.random.default_rng(0).standard_normal((3, 4)), ctx=mx.cpu())
    label = nd.array([0, 1, 3], ctx=mx.cpu())
    grads = []
    for out_grad in (False, True):
        x.attach_grad()
        with autograd.record():
            y = nd.SoftmaxOutput(x, label, out_grad=out_grad)
            z = y * 3
        z.backward()
        grads.append(x.grad.asnumpy())
    np.testing.assert_allclose(grads[1], 3 * grads[0], rtol=1e-6)


def test_bad_arguments_are_refused():
    x = nd.ones((3, 4), ctx=mx.cpu())
    with pytest.raises(DnnbindValueError, match="label has shape \\(4,\\), expected \\(3,\\)"):
        nd.SoftmaxOutput(x, nd.ones((4,), ctx=mx.cpu()))
    with pytest.raises(UnknownArgumentError, match="Cannot find argument 'grad_scal'"):
        nd.SoftmaxOutput(x, nd.ones((3,), ctx=mx.cpu()), grad_scal=1)
    with pytest.raises(ValueError, match="Invalid Input: 'mean', valid values are: \\{'batch', 'null', 'valid'\\}"):
        nd.SoftmaxOutput(x, nd.ones((3,), ctx=mx.cpu()), normalization="mean")
    with pytest.raises(DnnbindValueError, match="same number of elements"):
        nd.LinearRegressionOutput(x, nd.ones((3,), ctx=mx.cpu()))


def _arg_shapes(op, params, **given):
    from dnnbind import symbol as sym
    return getattr(sym, op)(sym.var("data"), name="o", **params).infer_shape(**given)[0]


def test_label_shapes_are_inferred_and_accepted_as_mxnet_does():
    # MXNet 1.9.1's answers: sym.<op>(sym.var('data'), name='o', **params).infer_shape(**given)[0]
    assert _arg_shapes("LinearRegressionOutput", {}, data=(4, 1)) == [(4, 1), (4,)]
    assert _arg_shapes("LinearRegressionOutput", {}, data=(4, 3, 2)) == [(4, 3, 2), (4, 3, 2)]
    assert _arg_shapes("LinearRegressionOutput", {}, data=(2, 3, 4), o_label=(2, 12)) == [(2, 3, 4), (2, 12)]
    assert _arg_shapes("SoftmaxOutput", {}, data=(2, 3, 4)) == [(2, 3, 4), (2, 3)]
    assert _arg_shapes("SoftmaxOutput", {"multi_output": True}, data=(2, 3, 4)) == [(2, 3, 4), (2, 4)]
    assert _arg_shapes("SoftmaxOutput", {"multi_output": True}, data=(2, 3, 4), o_label=(2, 1, 4)) == \
        [(2, 3, 4), (2, 1, 4)]
    with pytest.raises(DnnbindValueError, match="o_label"):  # MXNet: Shape inconsistent, Provided=[24]
        _arg_shapes("LinearRegressionOutput", {}, data=(2, 3, 4), o_label=(24,))
    with pytest.raises(DnnbindValueError, match="same first"):  # the same size is not enough (MXNet's check)
        nd.LinearRegressionOutput(nd.ones((2, 3, 4), ctx=mx.cpu()), nd.ones((4, 6), ctx=mx.cpu()))
