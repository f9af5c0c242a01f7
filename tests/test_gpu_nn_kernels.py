"""The NVRTC kernels of ops.bias_relu (ReLU backward + bias gradient in one pass, plain channel sums) and of
ops.pooling (max pooling with window == stride, no padding) on the GPU (marker ``gpu``; skipped without one).

Each is held to the float64 numpy twin on random inputs (never all zeros: ReLU outputs hold exact zeros, max-pool
inputs are rounded to a coarse grid so windows hold ties), at SimpleCNN's, ResNet-like, size-1 and odd shapes, NCHW
and NHWC, float32 and float16; run twice for bitwise determinism; through nd.Convolution(act_type='relu') and
nd.Pooling against the library path they replace (cudnnActivationBackward + the gemv bias gradient, cuDNN
pooling); through autograd against central differences; and inside captured / recorded training steps.

Tolerances: dz, y and dx are exact (selected or routed values). db: float32 sums of float32 values, 1e-5 relative
and 1e-5 * sum|dz| / C absolute (the summation order differs from numpy's); float16: the float32 sum rounded to
float16, 2e-3 relative (2 half ulps) and 1e-4 * sum|dz| / C absolute. Against the library path, float32 ops on
the same values: conv gradients 1e-5 relative and 1e-5 of the largest magnitude absolute.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.graph import CapturedStep, RecordedStep
from dnnbind.ops.defs import convolution as conv_def
from dnnbind.ops import bias_relu as BR
from dnnbind.ops import pooling as PO
from dnnbind.ops import reference as R
from tests._helpers import assert_close, numerical_grad
from tests.test_nn_kernels import nhwc_shape, relu_out, rnd, tied

pytestmark = pytest.mark.gpu
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(64, 32, 28, 28), (64, 64, 14, 14), (8, 64, 48, 48), (1, 1, 1, 1), (1, 3, 1, 7), (5, 1, 9, 9),
          (2, 6, 3, 3), (3, 70, 5, 5), (4, 1024, 1, 1)]


def g(a):
    return mx.array(np.ascontiguousarray(a), device=mx.gpu(0))


def db_tol(dz, c, dtype):
    scale = np.abs(dz.astype(F64)).sum() / c
    return (2e-3, 1e-4 * scale + 1e-6) if dtype == F16 else (1e-5, 1e-5 * scale + 1e-7)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bias_relu_backward_matches_float64_and_is_deterministic(shape, layout, dtype):
    shape = nhwc_shape(shape, layout)
    y, dy = relu_out(shape, 1, dtype), rnd(shape, 2, dtype)
    want_dz, want_db = R.bias_relu_backward(y.astype(F64), dy.astype(F64), layout)
    gy, gdy = g(y), g(dy)
    runs = [mx.ops.bias_relu_backward(gy, gdy, layout=layout) for _ in range(2)]
    (dz, db), (dz2, db2) = [(a.numpy(), b.numpy()) for a, b in runs]
    assert dz.dtype == dtype and db.dtype == dtype and db.shape == (want_db.size,)
    np.testing.assert_array_equal(dz.astype(F64), want_dz)
    assert_close(db, want_db, *db_tol(want_dz, want_db.size, dtype), name="db")
    assert dz.tobytes() == dz2.tobytes() and db.tobytes() == db2.tobytes(), "two runs differ"
    # the mask off: conv_backward_bias's sum, by the same kernel
    plain = BR.conv_backward_bias_kernel(gdy, layout=layout).numpy()
    want = R.conv_backward_bias(dy.astype(F64), layout)
    assert_close(plain, want, *db_tol(dy, want.size, dtype), name="channel sum")
    assert plain.tobytes() == BR.conv_backward_bias_kernel(gdy, layout=layout).numpy().tobytes()


def test_bias_relu_backward_into_out_and_nan_rules():
    y = relu_out((4, 8, 6, 6), 3)
    dy = rnd(y.shape, 4)
    y[0, 0, 0, :3] = [np.nan, 0.0, -0.0]
    dy[0, 0, 1, :2] = [np.nan, np.inf]
    y[0, 0, 1, :2] = [1.0, -1.0]  # NaN dy where y > 0 reaches db; inf dy where y <= 0 is dropped
    out = mx.empty((8,), device=mx.gpu(0))
    dz, db = mx.ops.bias_relu_backward(g(y), g(dy), out=out)
    assert db is out
    want_dz, want_db = R.bias_relu_backward(y, dy)
    np.testing.assert_array_equal(dz.numpy(), want_dz)
    assert np.isnan(db.numpy()[0]) and np.isnan(want_db[0])
    assert_close(db.numpy()[1:], want_db[1:].astype(F64), 1e-5, 1e-4, name="db")


POOL_CASES = [((64, 32, 28, 28), (2, 2)), ((64, 64, 14, 14), (2, 2)), ((8, 64, 48, 48), (2, 2)),
              ((1, 1, 2, 2), (2, 2)), ((3, 5, 7, 9), (2, 2)), ((2, 3, 9, 10), (3, 3)), ((2, 4, 8, 9), (2, 3)),
              ((1, 2, 5, 5), (1, 1)), ((2, 3, 8, 9), (4, 4))]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_max_pool_kernels_match_float64_with_ties(case, layout, dtype):
    shape, window = nhwc_shape(case[0], layout), case[1]
    x = tied(shape, 5, dtype)  # a coarse grid: ties in most windows, routed to the first
    want_y = R.pooling_forward(x.astype(F64), "max", window, layout=layout)
    y = mx.ops.pooling_forward(g(x), "max", window, layout=layout)
    np.testing.assert_array_equal(y.numpy().astype(F64), want_y)
    dy = rnd(want_y.shape, 6, dtype)
    want_dx = R.pooling_backward(want_y, dy.astype(F64), x.astype(F64), "max", window, layout=layout)
    runs = [mx.ops.pooling_backward(y, g(dy), g(x), "max", window, layout=layout).numpy() for _ in range(2)]
    np.testing.assert_array_equal(runs[0].astype(F64), want_dx)  # routed values, zeros elsewhere: exact
    assert runs[0].tobytes() == runs[1].tobytes()


def test_max_pool_nan_rules():
    x = rnd((2, 3, 6, 6), 7)
    x[0, 0, 0, 1] = np.nan  # the window (0, 0) of channel 0
    y = mx.ops.pooling_forward(g(x), "max", 2).numpy()
    assert np.isnan(y[0, 0, 0, 0]) and np.isfinite(np.delete(y.ravel(), 0)).all()
    dy = rnd(y.shape, 8)
    dx = mx.ops.pooling_backward(g(y), g(dy), g(x), "max", 2).numpy()
    assert (dx[0, 0, :2, :2] == 0).all()  # a window holding a NaN passes no gradient (the twin's rule)
    np.testing.assert_array_equal(dx, R.pooling_backward(y, dy, x, "max", 2))


# -- through nd, against the library path they replace --------------------------------------------------------

def _conv_grads(x, w, b, dy, layout, dtype):
    args = dict(kernel=(3, 3), pad=(1, 1), num_filter=w.shape[0], act_type="relu", layout=layout)
    arrays = [nd.array(a, ctx=mx.gpu(0), dtype=dtype) for a in (x, w, b)]
    for a in arrays:
        a.attach_grad()
    with autograd.record():
        y = nd.Convolution(*arrays, **args)
    y.backward(nd.array(dy, ctx=mx.gpu(0), dtype=dtype))
    return y.numpy(), [a.grad.numpy() for a in arrays]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("xs, k", [((64, 1, 28, 28), 32), ((64, 32, 14, 14), 64), ((1, 3, 5, 7), 1)], ids=str)
def test_nd_convolution_relu_backward_equals_the_library_path(monkeypatch, xs, k, layout, dtype):
    mx.set_conv_algo_policy("time", deterministic=True)  # the conv backward kernels give the same bits twice
    try:
        _compare_conv_paths(monkeypatch, xs, k, layout, dtype)
    finally:
        mx.set_conv_algo_policy("time", deterministic=False)


def _compare_conv_paths(monkeypatch, xs, k, layout, dtype):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(nhwc_shape(xs, layout)).astype(dtype)
    w = (rng.standard_normal(nhwc_shape((k, xs[1], 3, 3), layout)) / 3).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) * 0.1
    y_shape = nhwc_shape((xs[0], k, xs[2], xs[3]), layout)
    dy = rng.standard_normal(y_shape).astype(dtype)
    y1, new = _conv_grads(x, w, b, dy, layout, dtype)
    monkeypatch.setattr(conv_def, "RELU_BIAS_KERNEL", False)
    y0, old = _conv_grads(x, w, b, dy, layout, dtype)
    np.testing.assert_array_equal(y1, y0)
    k_tol = 1e-2 if dtype == F16 else 1e-5
    for name, a, ref in zip(("dx", "dw", "db"), new, old):
        ref = ref.astype(F64)
        assert_close(a, ref, k_tol, k_tol * max(1.0, np.abs(ref).max()), name=name)
    np.testing.assert_array_equal(new[0], old[0])  # dz is exact: the conv's backward data sees the same input


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("n, k, units", [(64, 3136, 128), (64, 128, 10), (1, 7, 1), (300, 5, 33)], ids=str)
def test_linear_forward_writes_the_bias_rows_then_adds_the_product(n, k, units, dtype):
    """ops.linear_forward: the bias_rows kernel fills y with b's rows, the gemm adds x w^T (beta = 1)."""
    rng = np.random.default_rng(31)
    x, w = rng.standard_normal((n, k)).astype(dtype), (rng.standard_normal((units, k)) / 8).astype(dtype)
    b = (rng.standard_normal(units) * 3).astype(dtype)
    ref = x.astype(F64) @ w.astype(F64).T + b.astype(F64)
    got = mx.ops.linear_forward(g(x), g(w), g(b)).numpy()
    assert got.dtype == dtype
    tol = {F16: 1e-2, F32: 1e-5, F64: 1e-12}[dtype]
    if mx.math_mode() == "tf32" and dtype == F32:
        tol = 2e-3
    assert_close(got, ref, tol, tol * max(1.0, np.abs(ref).max()), name="y")
    assert_close(mx.ops.linear_forward(g(x), g(w)).numpy(), ref - b.astype(F64), tol,
                 tol * max(1.0, np.abs(ref).max()), name="y without bias")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_nd_pooling_backward_equals_cudnn(monkeypatch, layout):
    x = rnd(nhwc_shape((64, 32, 28, 28), layout), 10)  # continuous values: no ties, where cuDNN's rule is unknown
    out = []
    for kernel in (True, False):
        monkeypatch.setattr(PO, "MAX_POOL_KERNEL", kernel)
        xa = nd.array(x, ctx=mx.gpu(0))
        xa.attach_grad()
        with autograd.record():
            y = nd.Pooling(xa, kernel=(2, 2), stride=(2, 2), pool_type="max", layout=layout)
        y.backward(nd.array(rnd(y.shape, 11), ctx=mx.gpu(0)))
        out.append((y.numpy(), xa.grad.numpy()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_gradients_by_central_differences():
    """float32 autograd through the kernels against central differences of the float64 numpy forward: conv (+ b,
    ReLU), then a 2x2 max pool. Inputs keep z clear of the ReLU's kink and pool windows clear of ties."""
    rng = np.random.default_rng(13)  # seed 13: min |z| 5e-3, top-two gap in every pooled window 4e-2
    x = rng.standard_normal((2, 3, 6, 6)).astype(F32).astype(F64)
    w = (rng.standard_normal((4, 3, 3, 3)) / 3).astype(F32).astype(F64)
    b = (rng.standard_normal(4) * 0.1).astype(F32).astype(F64)
    z = R.conv_forward(x, w, b, padding=1)
    top2 = np.sort(z.reshape(2, 4, 3, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 4, 3, 3, 4), axis=-1)[..., -2:]
    assert np.abs(z).min() > 1e-3 and (top2[..., 1] - top2[..., 0]).min() > 1e-3, "inputs near a kink or a tie"
    head = rng.uniform(0.5, 1.5, (2, 4, 3, 3))

    def forward(xv, wv, bv):
        r = R.activation_forward(R.conv_forward(xv, wv, bv, padding=1), "relu")
        return R.pooling_forward(r, "max", 2)

    arrays = [nd.array(a.astype(F32), ctx=mx.gpu(0)) for a in (x, w, b)]
    for a in arrays:
        a.attach_grad()
    with autograd.record():
        y = nd.Pooling(nd.Convolution(*arrays, kernel=(3, 3), pad=(1, 1), num_filter=4, act_type="relu"),
                       kernel=(2, 2), stride=(2, 2), pool_type="max")
    y.backward(nd.array(head.astype(F32), ctx=mx.gpu(0)))
    for i, name in enumerate("xwb"):
        f = (lambda v, i=i: forward(*[v if j == i else a for j, a in enumerate((x, w, b))]))
        num = numerical_grad(f, (x, w, b)[i], head, eps=1e-6)
        assert_close(arrays[i].grad, num, 1e-3, 1e-3 * max(1.0, np.abs(num).max()), name=f"d{name}")


# -- inside replayed training steps ---------------------------------------------------------------------------

@pytest.mark.parametrize("replay", [CapturedStep, RecordedStep])
def test_fused_simplecnn_step_replays_like_eager(monkeypatch, replay):
    """SimpleCNN(fuse_relu=True): the kernels (and their scratch from the pool) inside a CUDA graph / a recording
    give what the eager steps give: conv1's dw and db by ops.bias_relu_wgrad (its input needs no gradient), conv2's
    ReLU and bias gradient by ops.bias_relu_backward, the max pools'."""
    from models.simple_cnn import SimpleCNN
    from dnnbind.ops import bias_relu as ops_bias_relu
    called = []

    class Counted:  # Convolution's GPU lowering calls these as ops.bias_relu.<name>.gpu
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __call__(self, *a, **k):
            called.append(self.name)
            return self.fn(*a, **k)

        def gpu(self, *a, **k):
            called.append(self.name)
            return self.fn.gpu(*a, **k)

    for name in ("bias_relu_wgrad", "bias_relu_backward"):
        monkeypatch.setattr(ops_bias_relu, name, Counted(name, getattr(ops_bias_relu, name)))
    dev = mx.gpu(0)
    rng = np.random.default_rng(13)
    batches = [(rng.random((64, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 64).astype(np.int32))
               for _ in range(4)]
    from dnnbind.ops.algos import optimize_for
    mx.set_conv_algo_policy("time", deterministic=True)
    try:
        results = []
        for replayed in (False, True):
            np.random.seed(14)
            net = SimpleCNN(fuse_relu=True)
            net.initialize(mx.init.TorchDefault(), ctx=dev)
            net(mx.zeros((2, 1, 28, 28), device=dev))  # the deferred shapes, before the Trainer sees the Parameters
            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
            x, y = mx.empty((64, 1, 28, 28), device=dev), mx.empty((64,), np.int32, device=dev)

            def step():
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(64)
                return loss

            if replayed:
                step = replay(step, inputs=[x, y], preserve=trainer.state_arrays())
            losses = []
            # both runs choose conv algorithms for the replay's objective: the same deterministic kernels
            with optimize_for("graph" if replay is CapturedStep else "eager"):
                for xb, yb in batches:
                    x.copy_(xb)
                    y.copy_(yb)
                    losses.append(step().numpy().copy())
            paths = net._collect_params_with_prefix().items()  # by path: the two nets' names differ
            results.append((losses, {k: p.data().numpy() for k, p in paths}))
            assert {"bias_relu_wgrad", "bias_relu_backward"} <= set(called), called  # eagerly, or while capturing
            called.clear()
        for a, b in zip(results[0][0], results[1][0]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        for k in results[0][1]:
            np.testing.assert_allclose(results[0][1][k], results[1][1][k], rtol=1e-6, atol=1e-7, err_msg=k)
    finally:
        mx.set_conv_algo_policy("time", deterministic=False)
