"""Custom operators written in Python (``mx.operator``: CustomOp, CustomOpProp, register; ``nd.Custom`` and
``sym.Custom``), against MXNet 1.9.1.

The operators and the calls live in tests/fixtures/make_mxnet_custom_op.py; that file ran them on the real MXNet to
write tests/fixtures/mxnet_custom_op/ (what each callback was handed, outputs, gradients, messages), and the tests
here run the same functions on dnnbind and compare.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as mx
from dnnbind import autograd, custom_op, nd
from dnnbind._lib.errors import DnnbindError, DnnbindValueError

from _helpers import assert_close

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "mxnet_custom_op")


def _generator():
    spec = importlib.util.spec_from_file_location("make_mxnet_custom_op",
                                                  os.path.join(HERE, "fixtures", "make_mxnet_custom_op.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ran():
    """The fixture's calls run on dnnbind: (our trace, our arrays, MXNet's trace, MXNet's arrays)."""
    gen = _generator()
    log: list = []
    gen.define(mx, log)
    arrays = gen.run(mx, log)
    n_eager = len(log)
    arrays.update(gen.run_symbolic(mx, log))
    with open(os.path.join(FIX, "trace.json")) as f:
        ref = json.load(f)["trace"]
    ref_arrays = dict(np.load(os.path.join(FIX, "arrays.npz")))
    return log, n_eager, arrays, ref, ref_arrays


def _eager(trace):
    end = next(i for i, e in enumerate(trace) if e[0] == "registered")
    return trace[:end + 1]


def test_callbacks_get_what_mxnet_gives_them(ran):
    """Prop keyword arguments as strings, infer_shape/infer_type inputs, create_operator's ctx, shapes and type
    flags, forward's is_train and req, backward's req ('null' for an input without gradient), which arrays the
    backward gets (declare_backward_dependency, need_top_grad=False), and the aux state."""
    log, _, _, ref, _ = ran
    ours, theirs = _eager(log), _eager(ref)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if a[0] == "error":
            continue  # compared by message below
        assert a == b


def test_outputs_and_gradients_match_mxnet(ran):
    _, _, arrays, _, ref_arrays = ran
    assert set(ref_arrays) <= set(arrays)
    for k, want in ref_arrays.items():
        assert_close(arrays[k], want, rtol=1e-5, atol=1e-6, name=k)


def test_errors_say_what_mxnet_says(ran):
    log, _, _, ref, _ = ran
    ours = {e[1]: e[2] for e in log if e[0] == "error"}
    theirs = {e[1]: e[2] for e in ref if e[0] == "error"}
    assert set(ours) == set(theirs)
    for key, msg in theirs.items():
        # MXNet's last line: "Cannot find custom operator test_nope" / "Required argument `op_type` is missing."
        core = msg.rstrip().rsplit(": ", 1)[-1]
        assert core in ours[key], (key, ours[key], core)
        assert ours[key].startswith("DnnbindValueError")  # an MXNetError (DnnbindError) that is also a ValueError


def test_symbol_names_inference_and_file_match_mxnet(ran):
    log, n_eager, _, ref, _ = ran
    ours = [e for e in log[n_eager:] if e[0].startswith("sym.")]
    theirs = [e for e in ref if e[0].startswith("sym.")]
    assert ours == theirs  # sym.sig.json compares the symbol file byte for byte


def test_symbol_file_round_trip():
    gen = _generator()
    gen.define(mx, [])
    s = mx.sym.Custom(mx.sym.var("x"), op_type="test_sigmoid", name="act", scale=2)
    back = mx.sym.load_json(s.tojson())
    assert back.tojson() == s.tojson()
    assert back.infer_shape(x=(4, 5))[1] == [(4, 5)]
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    out = back.bind(mx.cpu(), {"x": nd.array(x)}).forward()[0]
    assert_close(out.asnumpy(), 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


class _Cube(custom_op.CustomOp):
    """y = x**3 * k (k a float parameter), float64 friendly: for central differences."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] ** 3 * self.k)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] * 3 * in_data[0] ** 2 * self.k)


@custom_op.register("test_cube")
class _CubeProp(custom_op.CustomOpProp):
    def __init__(self, k="1"):
        super().__init__(need_top_grad=True)
        self.k = float(k)

    def create_operator(self, ctx, in_shapes, in_dtypes):
        return _Cube(self.k)


@pytest.mark.parametrize("shape", [(1,), (3, 4), (2, 1, 3)])
def test_gradient_by_central_differences(shape):
    rng = np.random.default_rng(len(shape))
    x0 = rng.uniform(-1.5, 1.5, size=shape)
    w = rng.normal(size=shape)

    def f(v):
        return float(np.sum(nd.Custom(nd.array(v, dtype=np.float64), op_type="test_cube", k=0.7).asnumpy() * w))

    x = nd.array(x0, dtype=np.float64)
    x.attach_grad()
    with autograd.record():
        y = nd.Custom(x, op_type="test_cube", k=0.7)
        z = (y * nd.array(w, dtype=np.float64)).sum()
    z.backward()
    eps, num = 1e-6, np.zeros(shape)
    for i in np.ndindex(*shape):
        d = np.zeros(shape)
        d[i] = eps
        num[i] = (f(x0 + d) - f(x0 - d)) / (2 * eps)
    assert_close(x.grad.asnumpy(), num, rtol=1e-6, atol=1e-8, name="dx")
    assert_close(y.asnumpy(), x0 ** 3 * 0.7, rtol=1e-12, atol=0, name="y")


def test_gradient_accumulates_with_grad_req_add_and_flows_through_other_ops():
    x = nd.array([0.5, -1.0, 2.0])
    x.attach_grad(grad_req="add")
    for _ in range(2):
        with autograd.record():
            z = (nd.exp(nd.Custom(x * 2, op_type="test_cube"))).sum()
        z.backward()
    xv = np.array([0.5, -1.0, 2.0])
    want = 2 * np.exp((2 * xv) ** 3) * 3 * (2 * xv) ** 2 * 2
    assert_close(x.grad.asnumpy(), want, rtol=1e-4, atol=1e-4)


def test_not_recorded_outside_record_and_untouched_by_inner_ops():
    """The operator's own nd calls are not taped (they run with autograd paused); outside record() nothing is."""
    x = nd.array([1.0, 2.0])
    x.attach_grad()
    y = nd.Custom(x, op_type="test_cube")
    assert y._node is None
    with autograd.record():
        y = nd.Custom(x, op_type="test_cube")
    assert y._node is not None and y._node.name == "Custom:test_cube"


def test_errors():
    x = nd.array([1.0, 2.0])
    with pytest.raises(DnnbindValueError, match="Cannot find custom operator no_such_op"):
        nd.Custom(x, op_type="no_such_op")
    with pytest.raises(DnnbindValueError, match="Required argument `op_type` is missing"):
        nd.Custom(x)
    with pytest.raises(DnnbindValueError, match=r"expects 1 argument\(s\) \['data'\]"):
        nd.Custom(x, x, op_type="test_cube")
    with pytest.raises(DnnbindError):  # an MXNetError
        mx.sym.Custom(mx.sym.var("d"), op_type="no_such_op")

    class BadProp(custom_op.CustomOpProp):
        def infer_shape(self, in_shape):
            return in_shape, [], []

    custom_op.register("test_bad_shape")(BadProp)
    with pytest.raises(DnnbindValueError, match="infer_shape returned 0 output entries, expecting 1"):
        nd.Custom(x, op_type="test_bad_shape")


class _Raises(custom_op.CustomOp):
    def __init__(self, where):
        super().__init__()
        self.where = where

    def forward(self, is_train, req, in_data, out_data, aux):
        if self.where == "forward":
            raise ValueError("boom in forward")
        self.assign(out_data[0], req[0], in_data[0] * 2)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        raise KeyError("boom in backward")


class _RaisesProp(custom_op.CustomOpProp):
    def __init__(self, where="forward"):
        super().__init__(need_top_grad=True)
        self.where = where

    def create_operator(self, ctx, shapes, dtypes):
        return _Raises(self.where)


custom_op.register("test_raises")(_RaisesProp)


def test_an_exception_in_forward_or_backward_is_mxnets_error():
    """As MXNet 1.9.1: "Error in CustomOp.forward: <the callback's traceback>", an MXNetError; here at the call
    (eager), the original exception chained."""
    x = nd.array([1.0, -2.0, 3.0])
    with pytest.raises(custom_op.CustomOpError, match="Error in CustomOp.forward: Traceback") as info:
        nd.Custom(x, op_type="test_raises", where="forward")
    assert isinstance(info.value, DnnbindError) and isinstance(info.value.__cause__, ValueError)
    assert "boom in forward" in str(info.value) and "test_raises" in str(info.value)
    x.attach_grad()
    with autograd.record():
        y = nd.Custom(x, op_type="test_raises", where="backward")
    np.testing.assert_array_equal(y.numpy(), [2.0, -4.0, 6.0])
    with pytest.raises(custom_op.CustomOpError, match="Error in CustomOp.backward: Traceback") as info:
        y.backward()
    assert isinstance(info.value.__cause__, KeyError) and "boom in backward" in str(info.value)


def test_out_and_assign_req():
    x = nd.array([1.0, 2.0])
    out = nd.zeros((2,))
    r = nd.Custom(x, op_type="test_cube", k=2, out=out)
    assert r is out
    assert_close(out.asnumpy(), [2.0, 16.0], rtol=0, atol=0)
    op, dst = custom_op.CustomOp(), nd.array([1.0, 1.0])
    op.assign(dst, "add", nd.array([2.0, 3.0]))
    op.assign(dst, "null", nd.array([9.0, 9.0]))
    assert_close(dst.asnumpy(), [3.0, 4.0], rtol=0, atol=0)
    op.assign(dst, "inplace", nd.array([5.0, 6.0]))
    assert_close(dst.asnumpy(), [5.0, 6.0], rtol=0, atol=0)


def test_alias_serves_mx_operator(alias):
    import mxnet
    import mxnet.operator
    assert mxnet.operator is custom_op
    assert mxnet.operator.CustomOp is custom_op.CustomOp
    assert mxnet.nd.Custom is nd.Custom and mxnet.sym.Custom is dnnbind.symbol.Custom
    assert "custom_op" in mxnet.operator.get_all_registered_operators()


def test_hybrid_block_with_F_custom():
    from dnnbind import gluon

    class Net(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = gluon.nn.Dense(3)

        def hybrid_forward(self, F, x):
            return F.Custom(self.dense(x), op_type="test_cube", k=0.5)

    net = Net()
    net.initialize()
    x = nd.array(np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32))
    eager = net(x).asnumpy()
    net.hybridize()
    with autograd.record():
        y = net(x)
    y.backward()
    assert_close(y.asnumpy(), eager, rtol=1e-6, atol=1e-6)
    w = net.dense.weight
    g = w.grad().asnumpy()
    h = net.dense(x).asnumpy()
    want = (1.5 * h ** 2).T @ x.asnumpy()
    assert_close(g, want, rtol=1e-4, atol=1e-5, name="dW")


@pytest.mark.gpu
def test_gpu_matches_cpu(gpu):
    rng = np.random.default_rng(5)
    x0 = rng.normal(size=(3, 5)).astype(np.float32)
    res = {}
    for dev in (dnnbind.cpu(0), gpu):
        x = nd.array(x0).as_in_context(dev)
        x.attach_grad()
        with autograd.record():
            y = nd.Custom(x, op_type="test_cube", k=1.5)
        y.backward()
        assert y.context == dev
        res[str(dev)] = (y.asnumpy(), x.grad.asnumpy())
    (y_c, g_c), (y_g, g_g) = res.values()
    assert_close(y_g, y_c, rtol=1e-5, atol=1e-6)
    assert_close(g_g, g_c, rtol=1e-5, atol=1e-6)
