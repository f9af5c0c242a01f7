"""Every entry of the nd op table, parametrized over the table: forward against float64 numpy (broadcast shapes,
ranks 0-5, size-1 and size-0 axes, non-contiguous sources, scalars on either side), gradients by central
differences, and the same cases on the GPU (marker ``gpu``) against the float64 twin.

Tolerances: float32 results within rtol 2e-5 / atol 1e-6 of float64 numpy (CUDA's single-precision math is
within 2 ulp); gradients in float64 within 1e-5 of central differences (eps 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import autograd, nd
from dnnbind.nd import REGISTRY

from _helpers import assert_close, nd_gradcheck

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]

# Input domains where each op is smooth (no log of negatives, no kinks at the sample points).
POSITIVE = ("log", "log2", "log10", "sqrt", "rsqrt", "cbrt", "reciprocal", "rcbrt", "gamma", "gammaln")
ABOVE_ONE = ("arccosh",)
AWAY_FROM_ZERO = ("abs", "sign", "relu", "softsign", "floor", "ceil", "round", "rint", "trunc", "logical_not")
UNIT = ("arcsin", "arccos", "arctanh")
NO_GRAD = ("sign", "floor", "ceil", "round", "rint", "trunc", "logical_not", "equal", "not_equal", "greater",
           "greater_equal", "lesser", "lesser_equal", "logical_and", "logical_or", "logical_xor")

UNARY = sorted(n for n, op in REGISTRY.items() if op.kind == "map" and op.arity == 1 and not op.params)
BINARY = sorted(n for n, op in REGISTRY.items() if op.kind == "map" and op.arity == 2)
REDUCE = sorted(n for n, op in REGISTRY.items() if op.kind == "reduce")


def _sample(name, shape, rng, dtype=np.float64):
    if name in POSITIVE or name == "power_base":
        x = rng.uniform(0.5, 2.0, shape)
    elif name in ABOVE_ONE:
        x = rng.uniform(1.2, 3.0, shape)
    elif name in UNIT:
        x = rng.uniform(-0.8, 0.8, shape)
    elif name == "log1p":
        x = rng.uniform(-0.5, 2.0, shape)
    elif name in AWAY_FROM_ZERO or name in ("divisor",):
        x = rng.uniform(0.2, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
        if name in ("floor", "ceil", "round", "rint", "trunc"):
            x = np.round(x * 4) / 4 + 0.1  # away from the integer and half-integer jumps
    else:
        x = rng.uniform(-2.0, 2.0, shape)
    return np.asarray(x, dtype=dtype)


def _fn(name):
    """The op through the one dispatch path (internal ops such as _relu_backward have no nd name)."""
    return lambda *args, **params: nd.call(name, *args, **params)


def _ref(op, *arrays, **params):
    return np.asarray(op.numpy(*arrays, **params), dtype=np.float64)


UNARY_SHAPES = [(), (1,), (7,), (3, 4), (2, 1, 3), (2, 3, 1, 2, 2), (0, 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_forward(name, device):
    op, rng = REGISTRY[name], np.random.default_rng(0)
    for shape in UNARY_SHAPES:
        x = _sample(name, shape, rng)
        got = _fn(name)(nd.array(x, ctx=device, dtype="float32"))
        assert got.shape == shape and got.dtype == np.float32
        assert_close(got, _ref(op, x.astype(np.float32).astype(np.float64)), rtol=2e-5, atol=1e-6,
                     name=f"{name}{shape}")
    # a non-contiguous numpy source (a transposed view) goes in by value
    x = _sample(name, (4, 3), rng).T
    got = _fn(name)(nd.array(x, ctx=device, dtype="float32"))
    assert_close(got, _ref(op, x.astype(np.float32).astype(np.float64)), rtol=2e-5, atol=1e-6, name=name)


BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((1,), (2, 3)),
                 ((0, 3), (3,)), ((2, 3, 1, 5, 1), (1, 3, 4, 1, 2))]


def _binary_samples(name, sa, sb, rng):
    a = _sample("power_base" if name == "power" else "x", sa, rng)
    b = _sample("divisor" if name in ("divide", "modulo") else "x", sb, rng)
    if name in ("maximum", "minimum") and a.size and b.size:
        b = b + 0.05  # no ties at the sample points
    return a, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BINARY)
def test_binary_forward_broadcast_and_scalars(name, device):
    op, rng = REGISTRY[name], np.random.default_rng(1)
    fn = _fn(name)
    for sa, sb in BINARY_SHAPES + [(b, a) for a, b in BINARY_SHAPES[1:]]:
        a, b = _binary_samples(name, sa, sb, rng)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        got = fn(nd.array(a32, ctx=device), nd.array(b32, ctx=device))
        want = _ref(op, a32.astype(np.float64), b32.astype(np.float64))
        assert got.shape == np.broadcast_shapes(sa, sb)
        assert_close(got, want, rtol=2e-5, atol=1e-5, name=f"{name}{sa}{sb}")
    x = _binary_samples(name, (2, 3), (2, 3), rng)[0].astype(np.float32)
    s = 1.5
    assert_close(fn(nd.array(x, ctx=device), s), _ref(op, x.astype(np.float64), s), 2e-5, 1e-5, f"{name} scalar")
    assert_close(fn(s, nd.array(x, ctx=device)), _ref(op, s, x.astype(np.float64)), 2e-5, 1e-5, f"scalar {name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum", "equal", "greater",
                                  "modulo", "abs", "negative", "square", "relu", "sign"])
def test_integer_dtypes(name, device):
    op, rng = REGISTRY[name], np.random.default_rng(2)
    for dtype in (np.int32, np.int64):
        a = rng.integers(-9, 10, (3, 4)).astype(dtype)
        b = rng.integers(1, 5, (4,)).astype(dtype) * rng.choice([-1, 1], (4,)).astype(dtype)
        args = (a, b)[:op.arity]
        got = _fn(name)(*[nd.array(v, ctx=device, dtype=dtype) for v in args])
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.numpy(), np.asarray(op.numpy(*args)).astype(dtype))


_gradcheck = nd_gradcheck


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in UNARY if n not in NO_GRAD])
def test_unary_gradient(name, device):
    x = _sample(name, (2, 3), np.random.default_rng(4))
    _gradcheck(_fn(name), [x], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in BINARY if n not in NO_GRAD])
def test_binary_gradient_unbroadcasts(name, device):
    rng = np.random.default_rng(5)
    for sa, sb in [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1, 3), (4, 1))]:
        a, b = _binary_samples(name, sa, sb, rng)
        _gradcheck(_fn(name), [a, b], device)
    a = _binary_samples(name, (3,), (3,), rng)[0]
    _gradcheck(lambda x: _fn(name)(x, 1.25), [a], device)


@pytest.mark.parametrize("device", DEVICES)
def test_where_clip_and_gradients(device):
    rng = np.random.default_rng(6)
    c, x, y = rng.integers(0, 2, (3, 4)).astype(np.float64), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    got = nd.where(nd.array(c, ctx=device), nd.array(x, ctx=device), nd.array(y, ctx=device))
    assert_close(got, np.where(c != 0, x, y), 1e-6, 1e-7)
    _gradcheck(lambda a, b: nd.where(nd.array(c, ctx=device, dtype="float64"), a, b), [x, y], device)
    # MXNet's 1-D condition of x.shape[0] elements picks whole rows (GluonCV's FPN R-CNNs), gradients included
    rows = np.array([1.0, 0.0, 1.0])
    got = nd.where(nd.array(rows, ctx=device), nd.array(x, ctx=device), nd.array(y, ctx=device))
    assert_close(got, np.where(rows[:, None] != 0, x, y), 1e-6, 1e-7)
    _gradcheck(lambda a, b: nd.where(nd.array(rows, ctx=device, dtype="float64"), a, b), [x, y], device)
    # ... and never broadcasts otherwise (MXNet: "inferring shapes failed" / "Check failed")
    for cs, ys in (((3, 1), (3, 4)), ((4,), (3, 4)), ((3, 4), (4,))):
        with pytest.raises(ValueError, match="where: "):
            nd.where(nd.ones(cs, ctx=device), nd.array(x, ctx=device), nd.ones(ys, ctx=device))
    v = rng.uniform(-2, 2, (3, 5))
    v = np.where(np.abs(np.abs(v) - 1) < 0.05, 0.5, v)
    assert_close(nd.clip(nd.array(v, ctx=device), -1, 1), np.clip(v, -1, 1), 1e-6, 1e-7)
    _gradcheck(lambda a: nd.clip(a, -1.0, 1.0), [v], device)


AXES = [None, 0, -1, (0, 2), (1,), ()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", REDUCE)
def test_reductions(name, device):
    op, rng = REGISTRY[name], np.random.default_rng(7)
    x = rng.uniform(0.5, 2.0, (3, 4, 5))
    fn = _fn(name)
    for axis in AXES:
        for keepdims in (False, True):
            for exclude in (False, True):
                if name.startswith("arg") and (axis == () or exclude):
                    continue
                got = fn(nd.array(x, ctx=device, dtype="float32"), axis=axis, keepdims=keepdims, exclude=exclude)
                from dnnbind.nd._registry import norm_axes
                axes = norm_axes(name, 3, None if axis == () else axis, exclude and axis != ())  # MXNet: () is all
                want = np.asarray(op.numpy(x.astype(np.float32).astype(np.float64), axes))
                shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keepdims else \
                    tuple(d for i, d in enumerate(x.shape) if i not in axes)
                want = want.reshape(shape or (1,))
                assert got.shape == (shape or (1,)), (axis, keepdims, exclude, got.shape)
                assert_close(got, want, rtol=2e-5, atol=1e-5, name=f"{name} axis={axis} keepdims={keepdims} "
                                                                 f"exclude={exclude}")
        if op.grad is not None and axis != ():
            _gradcheck(lambda a: fn(a, axis=axis), [x[:2, :3, :2]], device)


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_rank0_size0_and_ints(device):
    z = nd.zeros((0, 3), ctx=device)
    assert_close(nd.sum(z, axis=0), np.zeros(3), 0, 0)
    assert_close(nd.prod(z, axis=0), np.ones(3), 0, 0)
    with pytest.raises(ValueError, match="max.*size-0"):
        nd.max(z, axis=0)
    i = nd.array([[3, 1, 4], [1, 5, 9]], ctx=device, dtype="int32")
    np.testing.assert_array_equal(i.sum(axis=1).numpy(), [8, 15])
    np.testing.assert_array_equal(i.argmax(axis=1).numpy(), [2, 2])
    # MXNet 1.9.1 gives the indices in the input's own type (int32 here; float16 for float16 data)
    assert i.argmax(axis=1).dtype == np.int32
    assert nd.array([[1, 5, 2]], ctx=device, dtype="float16").argmax(axis=1).dtype == np.float16
    s = nd.array(np.float32(2.5), ctx=device)
    assert s.shape == () and float(s.sum().asscalar()) == 2.5


@pytest.mark.parametrize("device", DEVICES)
def test_sum_axis_is_recorded(device):
    """The review's bug: d/dx of x.sum() + x.sum(axis=0).sum() must be 2, not 1."""
    x = nd.array(np.random.default_rng(8).normal(size=(3, 4)), ctx=device)
    x.attach_grad()
    with autograd.record():
        y = x.sum() + x.sum(axis=0).sum() + x.mean(axis=(0, 1)) * 12
    y.backward()
    assert_close(x.grad, np.full((3, 4), 3.0), 1e-6, 1e-6)


def test_one_entry_per_op_and_names_generated():
    for op in REGISTRY.values():
        for n in op.nd_names:
            assert callable(getattr(nd, n)), n
        for m in op.methods:
            assert hasattr(nd.NDArray, m), m
    assert len([o for o in REGISTRY.values() if o.kind == "map"]) >= 50
