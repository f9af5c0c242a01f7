"""Both GPU lowerings of the table ops that have a library call: the generated NVRTC kernels (the default) and
cuDNN (`cudnnOpTensor`, `cudnnActivationForward/Backward`, `cudnnReduceTensor`, selected by
DNNBIND_ND_LIBRARY=cudnn), each against float64 numpy on random inputs, broadcast and size-1 cases included,
and a trace showing which library call ran. Marker ``gpu``; float32 within rtol 2e-5 / atol 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind.nd import _lower

from _helpers import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["nvrtc", "cudnn"])
def library(request, monkeypatch):
    dnnbind.gpu(0).activate()  # skips cleanly (DnnbindError -> conftest) where there is no GPU
    on = request.param == "cudnn"
    monkeypatch.setattr(_lower, "USE_CUDNN_OPTENSOR", on)
    monkeypatch.setattr(_lower, "USE_CUDNN_REDUCE", on)
    return request.param


BINARY = {"add": (lambda a, b: a + b, np.add), "mul": (lambda a, b: a * b, np.multiply),
          "maximum": (nd.maximum, np.maximum), "minimum": (nd.minimum, np.minimum)}
SHAPES = [((64, 128), (64, 128)), ((64, 128), (128,)), ((128,), (64, 128)), ((2, 3, 1, 5), (1, 3, 4, 1)),
          ((1,), (1,)), ((3, 1), (1, 1))]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary(library, name, shapes):
    rng = np.random.default_rng(len(name) * 7 + len(shapes[0]))
    a, b = (rng.normal(size=s).astype(np.float32) for s in shapes)
    f, ref = BINARY[name]
    got = f(nd.array(a, ctx=dnnbind.gpu(0)), nd.array(b, ctx=dnnbind.gpu(0)))
    assert_close(got, ref(a.astype(np.float64), b.astype(np.float64)), 2e-5, 1e-6, name)


ACT = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh}


@pytest.mark.parametrize("name", sorted(ACT))
@pytest.mark.parametrize("shape", [(64, 3136), (2, 3, 4, 5, 2), (1,)], ids=str)
def test_activation_and_its_gradient(library, name, shape):
    rng = np.random.default_rng(3)
    x = (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    w = rng.normal(size=shape).astype(np.float32)
    xd = nd.array(x, ctx=dnnbind.gpu(0))
    xd.attach_grad()
    with autograd.record():
        y = getattr(nd, name)(xd)
        loss = (y * nd.array(w, ctx=dnnbind.gpu(0))).sum()
    loss.backward()
    x64 = x.astype(np.float64)
    y64 = ACT[name](x64)
    assert_close(y, y64, 2e-5, 1e-6, name)
    dy = {"relu": (x64 > 0).astype(np.float64), "sigmoid": y64 * (1 - y64), "tanh": 1 - y64 ** 2}[name]
    assert_close(xd.grad, w * dy, 2e-5, 1e-6, name + " gradient")


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("shape,axis", [((64, 3136), 1), ((64, 128), 0), ((4, 5, 6), (0, 2)), ((7,), None),
                                        ((3, 1, 2), 1)], ids=str)
def test_reductions(library, name, shape, axis):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.9, 1.1, shape).astype(np.float32) if name == "prod" else \
        rng.normal(size=shape).astype(np.float32)
    got = getattr(nd.array(x, ctx=dnnbind.gpu(0)), name)(axis=axis)
    ref = getattr(np, name)(x.astype(np.float64), axis=axis)
    assert_close(got, np.reshape(ref, got.shape), 1e-5 if name != "prod" else 1e-4, 1e-5, name)


def test_the_trace_names_the_chosen_library(library):
    a = nd.array(np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32), ctx=dnnbind.gpu(0))
    with dnnbind.trace() as t:
        (a + a).sum(axis=1)
        nd.waitall()
    fns = [r.function for r in t.records if r.library in ("cudnn", "kernel")]
    if library == "cudnn":
        assert "cudnnOpTensor" in fns and "cudnnReduceTensor" in fns, fns
    else:
        assert "cudnnOpTensor" not in fns and "cudnnReduceTensor" not in fns and len(fns) >= 2, fns
