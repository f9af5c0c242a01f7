"""MXNet 1.x's argument parsing in the nd namespace: an unknown keyword is refused with MXNet's "Cannot find argument"
(never run with a default), a required parameter left out with "Required parameter ... is not presented", and every
bad call of a layer, creation or random function raises ValueError/TypeError (dnnbind's MXNetError classes) or
NotImplementedError naming the op, before anything is allocated. Also Pooling's defaults (stride 1), which used to
differ. Every expected value and message here was read off the real MXNet 1.9.1 (CPU wheel) as noted.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import dnnbind.nd as nd
from dnnbind import autograd
from dnnbind._lib.errors import DnnbindError, UnknownArgumentError
from dnnbind.gluon import nn
from dnnbind.nd._mxnet_params import DECLARED
from dnnbind.nd._params import declared_params
from dnnbind.nd._registry import REGISTRY
from dnnbind.nd._schema import schema

CPU = "cpu"


def _a(x, dtype=np.float32):
    return nd.array(np.asarray(x, dtype=dtype), ctx=CPU, dtype=dtype)


def _listed(message: str) -> list[str]:
    """The names in a "Possible Arguments" listing (MXNet writes "name : type, ..." lines, dnnbind the names)."""
    body = message.split("----------------\n", 1)[1].rsplit("\n, in operator", 1)[0]
    return [m.group(1) for m in re.finditer(r"^(\w+)", body, re.M)]


# -- unknown keywords: layer, creation and random functions -----------------------------------------------------

X4 = _a(np.random.RandomState(0).randn(1, 2, 4, 4))
W4 = _a(np.ones((3, 2, 3, 3)))
B3 = _a(np.ones(3))
ONE2 = _a(np.ones(2))

# (function, valid call, MXNet's operator name in its message, MXNet 1.9.1's "Possible Arguments" in its order;
# each listing copied from the real wheel's error for ``zzz=1``).
LAYER_CALLS = [
    ("Convolution", lambda **k: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, **k), "Convolution",
     ["kernel", "stride", "dilate", "pad", "num_filter", "num_group", "workspace", "no_bias", "cudnn_tune",
      "cudnn_off", "layout"]),
    ("Deconvolution", lambda **k: nd.Deconvolution(X4, _a(np.ones((2, 3, 3, 3))), kernel=(3, 3), num_filter=3, **k),
     "Deconvolution", ["kernel", "stride", "dilate", "pad", "adj", "target_shape", "num_filter", "num_group",
                       "workspace", "no_bias", "cudnn_tune", "cudnn_off", "layout"]),
    ("FullyConnected", lambda **k: nd.FullyConnected(X4, _a(np.ones((3, 32))), B3, num_hidden=3, **k),
     "FullyConnected", ["num_hidden", "no_bias", "flatten"]),
    ("Activation", lambda **k: nd.Activation(X4, act_type="relu", **k), "Activation", ["act_type"]),
    ("Pooling", lambda **k: nd.Pooling(X4, kernel=(2, 2), **k), "Pooling",
     ["kernel", "pool_type", "global_pool", "cudnn_off", "pooling_convention", "stride", "pad", "p_value",
      "count_include_pad", "layout"]),
    ("softmax", lambda **k: nd.softmax(X4, **k), "softmax", ["axis", "temperature", "dtype", "use_length"]),
    ("log_softmax", lambda **k: nd.log_softmax(X4, **k), "log_softmax", ["axis", "temperature", "dtype",
                                                                          "use_length"]),
    ("add_n", lambda **k: nd.add_n(X4, X4, **k), "add_n", ["num_args"]),
    ("ElementWiseSum", lambda **k: nd.ElementWiseSum(X4, X4, **k), "add_n", ["num_args"]),
    ("Dropout", lambda **k: nd.Dropout(X4, **k), "Dropout", ["p", "mode", "axes", "cudnn_off"]),
    ("BatchNorm", lambda **k: nd.BatchNorm(X4, _a(np.ones(2)), _a(np.zeros(2)), _a(np.zeros(2)), _a(np.ones(2)),
                                           **k), "BatchNorm",
     ["eps", "momentum", "fix_gamma", "use_global_stats", "output_mean_var", "axis", "cudnn_off", "min_calib_range",
      "max_calib_range"]),
    ("LeakyReLU", lambda **k: nd.LeakyReLU(X4, **k), "LeakyReLU", ["act_type", "slope", "lower_bound",
                                                                   "upper_bound"]),
    ("Embedding", lambda **k: nd.Embedding(_a([0, 1]), _a(np.ones((3, 2))), input_dim=3, output_dim=2, **k),
     "Embedding", ["input_dim", "output_dim", "dtype", "sparse_grad"]),
    ("zeros", lambda **k: nd.zeros((2,), **k), "_zeros", ["shape", "ctx", "dtype"]),
    ("ones", lambda **k: nd.ones((2,), **k), "_ones", ["shape", "ctx", "dtype"]),
    ("random.uniform", lambda **k: nd.random.uniform(0, 1, shape=(2,), **k), "_random_uniform",
     ["low", "high", "shape", "ctx", "dtype"]),
    ("random.normal", lambda **k: nd.random.normal(0, 1, shape=(2,), **k), "_random_normal",
     ["loc", "scale", "shape", "ctx", "dtype"]),
    ("random.randn", lambda **k: nd.random.randn(2, **k), "_random_normal", ["loc", "scale", "shape", "ctx", "dtype"]),
    ("random.randint", lambda **k: nd.random.randint(0, 3, shape=(2,), **k), "_random_randint",
     ["low", "high", "shape", "ctx", "dtype"]),
    ("random.shuffle", lambda **k: nd.random.shuffle(_a([1, 2, 3]), **k), "_shuffle", []),
]


@pytest.mark.parametrize("fn,op,possible", [c[1:] for c in LAYER_CALLS], ids=[c[0] for c in LAYER_CALLS])
def test_unknown_keyword_is_refused_like_mxnet(fn, op, possible):
    fn()  # the call is valid without the stray keyword
    with pytest.raises(UnknownArgumentError) as info:
        fn(zzz=1)
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, DnnbindError)  # MXNetError and TypeError
    msg = str(err)
    assert msg.startswith("Cannot find argument 'zzz', Possible Arguments:\n----------------\n"), msg
    assert msg.endswith(f", in operator {op}"), msg
    assert _listed(msg) == possible, msg


def test_misspelled_dtype_never_runs_with_the_default():
    # MXNet 1.9.1: nd.zeros((2, 2), dtpye='float16') -> "Cannot find argument 'dtpye'" in operator _zeros
    with pytest.raises(UnknownArgumentError, match="Cannot find argument 'dtpye'"):
        nd.zeros((2, 2), dtpye="float16")
    with pytest.raises(UnknownArgumentError, match="in operator _ones"):
        nd.ones((2, 2), dtpye="float16")
    assert nd.zeros((2, 2), dtype="float16").dtype == np.float16


# -- unknown keywords: the generated table functions -------------------------------------------------------------

def _table_functions() -> list[tuple[str, int]]:
    names = []
    for op in REGISTRY.values():
        for n in op.nd_names:
            names.append((n, 2 if op.arity is None else op.arity))
    return sorted(set(names))


def _parameterless(name: str) -> bool:
    """MXNet 1.9.1 declares no parameters for the operator behind nd.<name> (relu, zeros_like, shape_array, ...)."""
    op = _op_of(name)
    return op in DECLARED and not declared_params(op)


def _outcome(call):
    try:
        return call()
    except DnnbindError as exc:
        return exc


def _op_of(name: str) -> str:
    return next(op.name for op in REGISTRY.values() if name in op.nd_names)


@pytest.mark.parametrize("name,arity", _table_functions(), ids=[n for n, _ in _table_functions()])
def test_table_function_refuses_an_unknown_keyword(name, arity):
    """An operator with parameters refuses a keyword it does not declare, with MXNet's message. One with none
    (MXNet 1.9.1 has no parameter struct to check against) takes it and ignores it, as MXNet does, with a warning
    naming it (GluonCV calls F.zeros_like(x, dtype='int64') and gets float32 in MXNet)."""
    x = _a(np.ones((2, 3)))
    if _parameterless(name):
        f, key = getattr(nd, name), f"zzz_{name}"  # a keyword of its own: the warning comes once per keyword
        args = [x] * len(schema(_op_of(name)).inputs)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = _outcome(lambda: f(*args, **{key: 1}))
        assert any(f"takes no parameters: {key}=1 is ignored" in str(w.message) for w in seen), name
        want = _outcome(lambda: f(*args))
        assert type(got) is type(want)  # the same result, or the same refusal of these inputs
        if not isinstance(want, Exception):
            for g, e in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
                np.testing.assert_array_equal(g.asnumpy(), e.asnumpy())
        return
    with pytest.raises(UnknownArgumentError) as info:
        getattr(nd, name)(*[x] * arity, zzz=1)
    assert str(info.value).startswith("Cannot find argument 'zzz', Possible Arguments:")


# MXNet 1.9.1's listings (names only, in any order: dnnbind lists concat's as dim, num_args).
TABLE_LISTINGS = {
    "sum": ({"axis", "keepdims", "exclude"}, lambda x: nd.sum(x, axes=1)),
    "clip": ({"a_min", "a_max"}, lambda x: nd.clip(x, 0, 1, amin=0)),
    "take": ({"axis", "mode"}, lambda x: nd.take(x, _a([0]), axes=0)),
    "transpose": ({"axes"}, lambda x: nd.transpose(x, axis=(1, 0))),
    "broadcast_to": ({"shape"}, lambda x: nd.broadcast_to(x, shape=(2, 3), size=2)),
    "Concat": ({"dim", "num_args"}, lambda x: nd.concat(x, x, axis=0)),
}


@pytest.mark.parametrize("op", sorted(TABLE_LISTINGS))
def test_table_function_lists_its_parameters(op):
    possible, call = TABLE_LISTINGS[op]
    with pytest.raises(UnknownArgumentError) as info:
        call(_a(np.ones((2, 3))))
    assert set(_listed(str(info.value))) == possible
    assert str(info.value).endswith(f", in operator {op}")


def test_method_spelling_is_checked_too():
    x = _a(np.ones((2, 3)))
    with pytest.raises(UnknownArgumentError, match="Cannot find argument 'axes'"):
        x.sum(axes=1)
    assert x.sum(axis=1).shape == (2,)  # the right spelling still works, positional parameters too
    assert nd.sum(x, 1).shape == (2,) and nd.clip(x, 0, 0.5).asnumpy().max() == 0.5


# NOTE: MXNet 1.9.1 silently ignores any keyword given to an operator that declares no parameters (nd.relu(x, foo=1),
# nd.Flatten(x, foo=1), nd.broadcast_add(a, b, foo=1) all run there), and MXNet code relies on it: GluonCV's CenterNet
# decoder calls F.zeros_like(x, dtype='int64') and gets float32. dnnbind's registry operators do the same, with a
# warning naming the ignored keyword (test_table_function_refuses_an_unknown_keyword); nd.random.shuffle still refuses.
def test_a_parameterless_library_op_ignores_a_keyword_with_a_warning():
    with pytest.warns(UserWarning, match="Flatten takes no parameters: zzz_flatten=1 is ignored"):
        y = nd.Flatten(X4, zzz_flatten=1)
    np.testing.assert_array_equal(y.asnumpy(), nd.Flatten(X4).asnumpy())


# -- required parameters -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,text", [
    # MXNet 1.9.1's messages, up to ", in operator <op>(...)"
    (lambda: nd.Convolution(X4, W4, B3, num_filter=3), "Required parameter kernel of Shape(tuple) is not presented"),
    (lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3)),
     "Required parameter num_filter of int (non-negative) is not presented"),
    (lambda: nd.Deconvolution(X4, _a(np.ones((2, 3, 3, 3))), num_filter=3),
     "Required parameter kernel of Shape(tuple) is not presented"),
    (lambda: nd.Deconvolution(X4, _a(np.ones((2, 3, 3, 3))), kernel=(3, 3)),
     "Required parameter num_filter of int (non-negative) is not presented"),
    (lambda: nd.FullyConnected(X4, _a(np.ones((3, 32))), B3), "Required parameter num_hidden of int is not presented"),
    (lambda: nd.Activation(X4), "Required parameter act_type of int is not presented"),
    (lambda: nd.Embedding(_a([0, 1]), _a(np.ones((3, 2)))), "Required parameter input_dim of int is not presented"),
    (lambda: nd.Embedding(_a([0, 1]), _a(np.ones((3, 2))), input_dim=3),
     "Required parameter output_dim of int is not presented"),
])
def test_required_parameter_missing(call, text):
    with pytest.raises(TypeError) as info:
        call()
    assert isinstance(info.value, DnnbindError)
    assert str(info.value).startswith(text), str(info.value)


# -- Pooling's defaults and modes against MXNet 1.9.1 ----------------------------------------------------------

# x = np.random.RandomState(0).randn(1, 1, 4, 4).astype(np.float32), pooled by the real MXNet 1.9.1:
POOL_X = np.random.RandomState(0).randn(1, 1, 4, 4).astype(np.float32)
MXNET_POOL = {
    # nd.Pooling(x, kernel=(2, 2)): stride defaults to 1, so the output is 3x3
    "max": [1.8675580024719238, 0.978738009929657, 2.2408931255340576, 1.8675580024719238, 0.9500884413719177,
            1.4542734622955322, 0.7610377073287964, 0.44386324286460876, 1.4542734622955322],
    # nd.Pooling(x, kernel=(2, 2), pool_type='avg')
    "avg": [0.763622522354126, 0.33792644739151, 1.004590630531311, 0.2994149327278137, 0.13186316192150116,
            0.5992620587348938, 0.2975230813026428, 0.2800450921058655, 0.5939636826515198],
}
MXNET_POOL_1D = [  # nd.Pooling(x.reshape(1, 1, 16), kernel=(3,)): 14 outputs
    1.764052391052246, 2.2408931255340576, 2.2408931255340576, 2.2408931255340576, 1.8675580024719238,
    0.9500884413719177, 0.9500884413719177, 0.4105985164642334, 0.4105985164642334, 1.4542734622955322,
    1.4542734622955322, 1.4542734622955322, 0.7610377073287964, 0.44386324286460876]
MXNET_POOL_MODES = [  # (arguments, output shape, values) of nd.Pooling(x, **arguments)
    (dict(kernel=(2, 2), pool_type="sum", pad=(1, 1)), (1, 1, 5, 5),
     [1.764052391052246, 2.1642096042633057, 1.3788952827453613, 3.2196311950683594, 2.2408931255340576,
      3.63161039352417, 3.054490089416504, 1.35170578956604, 4.018362522125244, 2.08953595161438,
      1.7643392086029053, 1.1976597309112549, 0.5274526476860046, 2.397048234939575, 1.3029162883758545,
      0.6578188538551331, 1.1900923252105713, 1.120180368423462, 2.375854730606079, 1.7879477739334106,
      0.7610377073287964, 0.882712721824646, 0.5655382871627808, 0.7775375843048096, 0.3336743414402008]),
    (dict(kernel=(2, 2), stride=(2, 2), pool_type="lp", p_value=3), (1, 1, 2, 2),
     [2.232964038848877, 2.3540194034576416, 0.7993231415748596, 1.4741108417510986]),
    (dict(kernel=(3, 3), stride=(2, 2), pool_type="lp", p_value=2, pooling_convention="full"), (1, 1, 2, 2),
     [3.126570463180542, 3.006786823272705, 0.9954856038093567, 1.5633339881896973]),
    (dict(kernel=(3, 3), stride=(2, 2), pool_type="sum", pooling_convention="full"), (1, 1, 2, 2),
     [5.434739589691162, 5.6166791915893555, 1.7779992818832397, 2.375854730606079]),
    (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg", pooling_convention="full"), (1, 1, 3, 3),
     [0.3393877446651459, 0.38236019015312195, 0.34825599193573, 0.2311525195837021, 0.3032868504524231,
      0.2727651000022888, 0.14711879193782806, 0.14986877143383026, 0.0834185853600502]),
    (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg", pooling_convention="full",
          count_include_pad=False), (1, 1, 3, 3),
     [0.763622522354126, 0.5735403299331665, 1.04476797580719, 0.34672874212265015, 0.3032868504524231,
      0.5455302000045776, 0.441356360912323, 0.2997375428676605, 0.3336743414402008]),
    (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), global_pool=True, pool_type="avg"), (1, 1, 1, 1),
     [0.6649249196052551]),  # global pooling ignores kernel, stride and pad
    (dict(kernel=(2, 2), pad=(1, 1)), (1, 1, 5, 5), None),  # pad < kernel, stride 1
]


def _windows64(x: np.ndarray, k: int, s: int) -> np.ndarray:
    """(P, Q, k, k) windows of a 2-D float64 array, stride s, no padding."""
    p, q = (x.shape[0] - k) // s + 1, (x.shape[1] - k) // s + 1
    return np.array([[x[i * s:i * s + k, j * s:j * s + k] for j in range(q)] for i in range(p)])


@pytest.mark.parametrize("pool_type", ["max", "avg"])
def test_pooling_default_stride_is_one(pool_type):
    y = nd.Pooling(_a(POOL_X), kernel=(2, 2), pool_type=pool_type)
    assert y.shape == (1, 1, 3, 3)
    np.testing.assert_allclose(y.asnumpy().ravel(), MXNET_POOL[pool_type], rtol=1e-6, atol=1e-7)
    win = _windows64(POOL_X[0, 0].astype(np.float64), 2, 1)
    want = win.max(axis=(2, 3)) if pool_type == "max" else win.mean(axis=(2, 3))
    np.testing.assert_allclose(y.asnumpy()[0, 0], want, rtol=1e-6, atol=1e-7)  # the float64 oracle agrees


def test_pooling_1d_default_stride_is_one():
    y = nd.Pooling(_a(POOL_X.reshape(1, 1, 16)), kernel=(3,))
    assert y.shape == (1, 1, 14)
    np.testing.assert_allclose(y.asnumpy().ravel(), MXNET_POOL_1D, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("args,shape,values", MXNET_POOL_MODES, ids=[str(i) for i in range(len(MXNET_POOL_MODES))])
def test_pooling_modes_match_mxnet(args, shape, values):
    y = nd.Pooling(_a(POOL_X), **args)
    assert y.shape == shape
    if values is not None:
        np.testing.assert_allclose(y.asnumpy().ravel(), values, rtol=1e-5, atol=1e-6)


def test_pooling_sum_and_lp_have_gradients():
    a = _a(POOL_X, np.float64)
    a.attach_grad()
    with autograd.record():
        y = nd.sum(nd.Pooling(a, kernel=(2, 2), pool_type="sum", pad=(1, 1))) + \
            nd.sum(nd.Pooling(a, kernel=(2, 2), stride=(2, 2), pool_type="lp", p_value=2))
    y.backward()
    x = POOL_X[0, 0].astype(np.float64)
    # d/dx of the padded 2x2 sums (stride 1) is 4 everywhere; of the 2x2 L2 norms x / norm of its window
    norms = np.sqrt(_windows64(x * x, 2, 2).sum(axis=(2, 3)))
    want = 4.0 + x / np.kron(norms, np.ones((2, 2)))
    np.testing.assert_allclose(a.grad.asnumpy()[0, 0], want, rtol=1e-10)


# gluon.nn.MaxPool2D() and AvgPool2D(3, padding=1) on the same x, by MXNet 1.9.1: their strides default to pool_size.
MXNET_GLUON_POOL = {
    "max": [1.8675580024719238, 2.2408931255340576, 0.7610377073287964, 1.4542734622955322],
    "avg": [0.33938777446746826, 0.4464847147464752, 0.13223248720169067, 0.2639838457107544],
}


def test_gluon_pooling_keeps_strides_equal_to_pool_size():
    x = _a(POOL_X)
    np.testing.assert_allclose(nn.MaxPool2D()(x).asnumpy().ravel(), MXNET_GLUON_POOL["max"], rtol=1e-6)
    np.testing.assert_allclose(nn.AvgPool2D(pool_size=3, padding=1)(x).asnumpy().ravel(), MXNET_GLUON_POOL["avg"],
                               rtol=1e-6)


# -- other MXNet behaviours the parsing brings in ----------------------------------------------------------------

# nd.Convolution on 1-D data (N, C, W), by MXNet 1.9.1: x = RandomState(1).randn(1, 2, 6), w = RandomState(2)
# .randn(3, 2, 3), b = RandomState(3).randn(3), kernel=(3,), stride=(2,), pad=(1,), num_filter=3 (float32)
MXNET_CONV1D = [0.5155997276306152, 2.7545180320739746, 5.806527614593506, -1.7217204570770264, 2.2180140018463135,
                -2.435136079788208, -2.9769701957702637, 0.23783642053604126, -4.45617151260376]
# nd.FullyConnected(x, w, b, num_hidden=2, flatten=False), x = RandomState(4).randn(2, 3, 4), w = RandomState(5)
# .randn(2, 4), b = RandomState(6).randn(2)
MXNET_FC_NOFLATTEN = [-3.0505709648132324, 2.0208637714385986, -1.6973835229873657, -1.5896327495574951,
                      1.7405050992965698, -1.560896635055542, -3.134601593017578, 2.1455323696136475,
                      0.6552391052246094, 2.425567388534546, -0.07008737325668335, 1.2772753238677979]


def _rs(seed, shape):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def test_convolution_1d_and_dense_without_flatten_match_mxnet():
    y = nd.Convolution(_a(_rs(1, (1, 2, 6))), _a(_rs(2, (3, 2, 3))), _a(_rs(3, (3,))), kernel=(3,), stride=(2,),
                       pad=(1,), num_filter=3)
    assert y.shape == (1, 3, 3)
    np.testing.assert_allclose(y.asnumpy().ravel(), MXNET_CONV1D, rtol=1e-5, atol=1e-5)
    y = nd.FullyConnected(_a(_rs(4, (2, 3, 4))), _a(_rs(5, (2, 4))), _a(_rs(6, (2,))), num_hidden=2, flatten=False)
    assert y.shape == (2, 3, 2)
    np.testing.assert_allclose(y.asnumpy().ravel(), MXNET_FC_NOFLATTEN, rtol=1e-5, atol=1e-5)


def test_out_and_dtype_arguments():
    x = _a(POOL_X)
    out = nd.zeros((1, 1, 3, 3))
    assert nd.Pooling(x, kernel=(2, 2), out=out) is out
    np.testing.assert_allclose(out.asnumpy().ravel(), MXNET_POOL["max"], rtol=1e-6)
    assert nd.softmax(x, axis=0, dtype="float64").dtype == np.float64  # MXNet: the output's dtype
    z = nd.ones((2, 2))
    assert nd.zeros((2, 2), out=z) is z and z.asnumpy().sum() == 0
    assert nd.add_n(x) is not x  # MXNet: a new array even for one input


# -- bad calls: only ValueError / TypeError (MXNetError) or NotImplementedError, naming the op -------------------

OK = (ValueError, TypeError, NotImplementedError)

BAD_CALLS = [
    # (label, call): each was AttributeError, MemoryError or a silent success before
    ("Pooling(3)", lambda: nd.Pooling(3)),
    ("Pooling(None)", lambda: nd.Pooling(None, kernel=(2, 2))),
    ("Pooling no kernel", lambda: nd.Pooling(X4)),  # MXNet: "0D pooling not supported"
    ("Pooling kernel int on 2-D", lambda: nd.Pooling(X4, kernel=2)),  # MXNet reads 2 as (2,): 1-D
    ("Pooling pad >= kernel", lambda: nd.Pooling(X4, kernel=(2, 2), pad=(2, 2))),
    ("Pooling lp without p_value", lambda: nd.Pooling(X4, kernel=(2, 2), pool_type="lp")),
    ("Pooling 'same' on 2-D", lambda: nd.Pooling(X4, kernel=(2, 2), pooling_convention="same")),
    ("FullyConnected('a')", lambda: nd.FullyConnected("a", _a(np.ones((3, 4))), B3, num_hidden=3)),
    ("FullyConnected weight mismatch", lambda: nd.FullyConnected(X4, _a(np.ones((4, 32))), B3, num_hidden=3)),
    ("FullyConnected bias with no_bias", lambda: nd.FullyConnected(X4, _a(np.ones((3, 32))), B3, num_hidden=3,
                                                                   no_bias=True)),
    ("FullyConnected no bias", lambda: nd.FullyConnected(X4, _a(np.ones((3, 32))), num_hidden=3)),
    ("Convolution huge pad", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, pad=(2 ** 31, 0))),
    ("Convolution big pad", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, pad=(100000, 100000))),
    ("Convolution num_group 0", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, num_group=0)),
    ("Convolution kernel mismatch", lambda: nd.Convolution(X4, W4, B3, kernel=(2, 2), num_filter=3)),
    ("Convolution num_filter mismatch", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=4)),
    ("Convolution int stride on 2-D", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, stride=2)),
    ("Convolution float kernel", lambda: nd.Convolution(X4, W4, B3, kernel=(3.0, 3.0), num_filter=3)),
    ("Convolution no bias", lambda: nd.Convolution(X4, W4, kernel=(3, 3), num_filter=3)),
    ("Convolution cudnn_tune", lambda: nd.Convolution(X4, W4, B3, kernel=(3, 3), num_filter=3, cudnn_tune="xx")),
    ("Deconvolution huge stride", lambda: nd.Deconvolution(X4, _a(np.ones((2, 3, 3, 3))), kernel=(3, 3),
                                                           num_filter=3, stride=(2 ** 20, 2 ** 20))),
    ("Activation elu", lambda: nd.Activation(X4, act_type="elu")),  # not one of MXNet's five
    ("Activation int data", lambda: nd.Activation(_a([1, 2], np.int32), act_type="relu")),
    ("softmax int dtype", lambda: nd.softmax(X4, dtype="int32")),
    ("softmax length", lambda: nd.softmax(X4, _a([2]), use_length=True)),
    ("add_n nothing", lambda: nd.add_n()),
    ("add_n num_args", lambda: nd.add_n(X4, X4, num_args=3)),
    ("add_n shapes", lambda: nd.add_n(X4, ONE2)),
    ("add_n number", lambda: nd.add_n(X4, 3)),
    ("Embedding mismatch", lambda: nd.Embedding(_a([0, 1]), _a(np.ones((3, 2))), input_dim=4, output_dim=2)),
    ("LeakyReLU slope str", lambda: nd.LeakyReLU(X4, slope="a")),
    ("Flatten 0-d", lambda: nd.Flatten(_a(1.0))),
    ("BatchNorm numpy moving_mean", lambda: nd.BatchNorm(X4, ONE2, ONE2, np.zeros(2, np.float32), ONE2)),
    ("zeros huge", lambda: nd.zeros((2 ** 40,))),
    ("zeros float shape", lambda: nd.zeros((2.5,))),
    ("ones sparse", lambda: nd.zeros((2,), stype="csr")),
    ("arange repeat 0", lambda: nd.arange(3, repeat=0)),
    ("arange None", lambda: nd.arange(None)),
    ("arange huge", lambda: nd.arange(0, 2 ** 50)),
    ("full str", lambda: nd.full((2,), "a")),
    ("empty huge", lambda: nd.empty((2 ** 25, 2 ** 25))),
    ("uniform int dtype", lambda: nd.random.uniform(shape=(2,), dtype="int32")),
    ("uniform NDArray low", lambda: nd.random.uniform(nd.zeros(2), nd.ones(2), shape=(2,))),
    ("uniform huge", lambda: nd.random.uniform(shape=(2 ** 40,))),
    ("randint float dtype", lambda: nd.random.randint(0, 3, shape=(2,), dtype="float32")),
    ("shuffle 0-d", lambda: nd.random.shuffle(_a(1.0))),
    ("full overflow", lambda: nd.full((2,), 2 ** 33, dtype="int32")),
    ("eye None", lambda: nd.eye(None)),
    ("linspace negative", lambda: nd.linspace(0, 1, -1)),
    ("zeros_like str", lambda: nd.zeros_like("abc")),
    ("out of another shape", lambda: nd.zeros((2, 2), out=nd.zeros((3,)))),
    ("rrelu infinite bound", lambda: nd.random.uniform(0.1, float("inf"), shape=(2,))),
]


@pytest.mark.parametrize("call", [c[1] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_call_raises_a_value_or_type_error(call):
    with pytest.raises(OK) as info:
        call()
    err = info.value
    assert isinstance(err, (DnnbindError, NotImplementedError)), repr(err)
    assert str(err), "an error message is required"


# -- fuzz: every argument of the layer ops with bad values ------------------------------------------------------

class _Odd:
    pass


BAD_VALUES = [None, "abc", [1, 2], (), (0, 0), (-1, -1), (2 ** 40, 2 ** 40), -1, 0, 2 ** 62, 1.5, float("nan"),
              True, _Odd(), np.float32(1.0), _a(1.0), _a(np.ones((2, 2)), np.int32), _a(np.ones((2, 2)), np.float16),
              nd.zeros((0, 2, 4, 4)), np.zeros((2, 2)), {"a": 1}]

FUZZ = {  # a valid call's arguments for each op: every argument in turn gets every bad value
    "Convolution": (nd.Convolution, dict(data=X4, weight=W4, bias=B3, kernel=(3, 3), stride=(1, 1), dilate=(1, 1),
                                         pad=(1, 1), num_filter=3, num_group=1, workspace=1024, no_bias=False,
                                         cudnn_tune="fastest", cudnn_off=False, layout="NCHW")),
    "Deconvolution": (nd.Deconvolution, dict(data=X4, weight=_a(np.ones((2, 3, 3, 3))), bias=B3, kernel=(3, 3),
                                             stride=(2, 2), dilate=(1, 1), pad=(1, 1), adj=(1, 1),
                                             target_shape=(0, 0), num_filter=3, num_group=1, no_bias=False)),
    "FullyConnected": (nd.FullyConnected, dict(data=X4, weight=_a(np.ones((3, 32))), bias=B3, num_hidden=3,
                                               no_bias=False, flatten=True)),
    "Pooling": (nd.Pooling, dict(data=X4, kernel=(2, 2), pool_type="avg", global_pool=False, cudnn_off=False,
                                 pooling_convention="full", stride=(2, 2), pad=(1, 1), count_include_pad=True,
                                 layout="NCHW")),
    "Activation": (nd.Activation, dict(data=X4, act_type="tanh")),
    "BatchNorm": (nd.BatchNorm, dict(data=X4, gamma=_a(np.ones(2)), beta=_a(np.zeros(2)),
                                     moving_mean=_a(np.zeros(2)), moving_var=_a(np.ones(2)), eps=1e-3, momentum=0.9,
                                     fix_gamma=False, use_global_stats=False, output_mean_var=False, axis=1)),
    "Dropout": (nd.Dropout, dict(data=X4, p=0.5, mode="always", axes=(1,), cudnn_off=False)),
    "softmax": (nd.softmax, dict(data=X4, axis=1, temperature=2.0, dtype="float32")),
    "log_softmax": (nd.log_softmax, dict(data=X4, axis=-1, temperature=None)),
    "Embedding": (nd.Embedding, dict(data=_a([0, 2]), weight=_a(np.ones((3, 2))), input_dim=3, output_dim=2,
                                     dtype="float32", sparse_grad=False)),
    "LeakyReLU": (nd.LeakyReLU, dict(data=X4, act_type="rrelu", slope=0.3, lower_bound=0.1, upper_bound=0.4)),
    "Flatten": (nd.Flatten, dict(data=X4)),
    "zeros": (nd.zeros, dict(shape=(2, 3), ctx="cpu", dtype="float16")),
    "ones": (nd.ones, dict(shape=(2, 3), ctx="cpu", dtype="float64")),
    "full": (nd.full, dict(shape=(2, 3), val=2.0, ctx="cpu", dtype="float32")),
    "empty": (nd.empty, dict(shape=(2, 3), ctx="cpu", dtype="float32")),
    "arange": (nd.arange, dict(start=0, stop=5, step=1, repeat=2, ctx="cpu", dtype="float32")),
    "random.uniform": (nd.random.uniform, dict(low=0.0, high=1.0, shape=(2, 3), dtype="float32", ctx="cpu")),
    "random.normal": (nd.random.normal, dict(loc=0.0, scale=1.0, shape=(2, 3), dtype="float32", ctx="cpu")),
    "random.randint": (nd.random.randint, dict(low=0, high=5, shape=(2, 3), dtype="int32", ctx="cpu")),
    "random.shuffle": (nd.random.shuffle, dict(data=_a([1, 2, 3]))),
}


def _fuzz_cases():
    for op, (fn, good) in FUZZ.items():
        for arg in good:
            yield pytest.param(op, arg, id=f"{op}-{arg}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a NaN temperature gives NaNs, as in MXNet
@pytest.mark.parametrize("op,arg", list(_fuzz_cases()))
def test_fuzz_layer_arguments(op, arg):
    fn, good = FUZZ[op]
    with autograd.train_mode():
        fn(**good)  # the valid call runs
    for bad in BAD_VALUES:
        args = dict(good, **{arg: bad})
        try:
            with autograd.train_mode():
                fn(**args)
        except OK as err:
            assert isinstance(err, (DnnbindError, NotImplementedError)), f"{op}({arg}={bad!r}): {err!r}"
        except Exception as err:  # noqa: BLE001  (the point: nothing else may escape)
            pytest.fail(f"{op}({arg}={bad!r}) raised {type(err).__name__}: {err}")
