"""Dropout on the GPU (marker ``gpu``): cuDNN's cudnnDropoutForward/Backward through ops.dropout, nd.Dropout and
nn.Dropout: values (0 or x/(1-p)), kept fraction on 1e6 elements, backward, seeding by mx.random.seed, ranks 1..5
and float16/float64, two rates in one graph, ``axes``, traces, Gluon training, CUDA-graph and recorded steps.
The CPU tests (and the RNG-state bookkeeping with cuDNN faked) are in test_dropout.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.gluon import nn
from dnnbind.ops import dropout as DO

pytestmark = pytest.mark.gpu
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def _within_binomial(kept: int, n: int, p: float, sigmas: float = 5.0) -> None:
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) <= sigmas * sd + 1, f"kept {kept} of {n}; expected {n * (1 - p):.0f} +- {sd:.1f}"


def _g(a):
    return mx.array(np.array(a, order="C"), device=mx.gpu(0))


def _uniform(shape, dtype=F32, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(dtype)


RTOL = {F32: 1e-6, F64: 1e-6, F16: 2e-3}  # cuDNN may scale by 1/(1-p) rounded to float: ~1 ulp of float32
GPU_RUN = True  # the reserve is cuDNN's uint8 bit mask (a dry run of these tests on the cpu sets this False)


@pytest.mark.parametrize("p", [0.5, 0.3])
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_gpu_values_and_backward(rank, dtype, p):
    shape = (7, 6, 5, 4, 3)[:rank] if rank > 1 else (1001,)
    x = _uniform(shape, dtype, rank)
    y, reserve = DO.dropout_forward(_g(x), p, 5)
    yv = y.numpy()
    assert yv.shape == shape and yv.dtype == dtype and reserve.dtype == (np.uint8 if GPU_RUN else dtype)
    kept = yv != 0
    assert 0 < kept.sum() < kept.size
    expected = (x.astype(np.float64) / (1 - p))[kept]
    np.testing.assert_allclose(yv[kept].astype(np.float64), expected, rtol=RTOL[dtype])
    dy = np.random.default_rng(9).standard_normal(shape).astype(dtype)
    dx = DO.dropout_backward(_g(dy), reserve, p).numpy()
    np.testing.assert_allclose(dx[kept].astype(np.float64), (dy.astype(np.float64) / (1 - p))[kept],
                               rtol=RTOL[dtype], atol=RTOL[dtype] * 1e-3)
    assert (dx[~kept] == 0).all()


def test_gpu_kept_fraction_and_fresh_masks():
    p, n = 0.3, 1_000_000
    x = _g(np.ones(n, np.float32))
    masks = [nd.Dropout(x, p=p, mode="always").numpy() for _ in range(2)]
    for m in masks:
        np.testing.assert_allclose(m[m != 0], 1 / (1 - p), rtol=1e-6)
        _within_binomial(int((m != 0).sum()), n, p)
    assert not np.array_equal(masks[0], masks[1])  # cuDNN advances its RNG states at every call


def test_gpu_autograd_backward_and_two_rates():
    """y = Dropout(x); the gradient is dy / (1-p) where kept, else 0; two rates in one graph each get theirs."""
    n = 10_000
    x1, x2 = _g(np.ones(n, np.float32)), _g(np.ones(n, np.float32))
    x1.attach_grad()
    x2.attach_grad()
    dy = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    with autograd.record():
        y1 = nd.Dropout(x1, p=0.2)
        y2 = nd.Dropout(x2, p=0.7)
        loss = (y1 * _g(dy)).sum() + y2.sum()
    loss.backward()
    m1, m2 = y1.numpy(), y2.numpy()
    np.testing.assert_allclose(x1.grad.numpy(), dy * m1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(x2.grad.numpy(), m2, rtol=1e-6)  # 1/(1-0.7) where kept: the 0.7 descriptor's
    np.testing.assert_allclose(m1[m1 != 0], 1 / 0.8, rtol=1e-6)
    np.testing.assert_allclose(m2[m2 != 0], 1 / 0.3, rtol=1e-6)
    assert 0 < (m1 == 0).sum() < (m2 == 0).sum()


def test_gpu_seed_repeats_masks():
    x = _g(_uniform((4096,)))

    def run(seed):
        nd.random.seed(seed)
        with autograd.train_mode():
            return [nd.Dropout(x, p=0.5).numpy() for _ in range(2)] + [nd.Dropout(x, p=0.5, axes=(0,)).numpy()]

    a, b, c = run(7), run(7), run(8)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[1], c[1])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gpu_axes(dtype):
    p, shape = 0.4, (16, 32, 24)
    x = _g(_uniform(shape, dtype))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, p=p, axes=(1,))
    y.backward(_g(np.ones(shape, dtype)))  # (autograd's default head gradient has no float16 fill)
    mask = y.numpy().astype(np.float64) / x.numpy().astype(np.float64)
    kept = mask > 0
    np.testing.assert_allclose(mask[kept], 1 / (1 - p), rtol=RTOL[dtype])
    np.testing.assert_array_equal(kept, np.broadcast_to(kept[:, :1], shape))
    _within_binomial(int(kept[:, 0].sum()), shape[0] * shape[2], p)
    np.testing.assert_allclose(x.grad.numpy().astype(np.float64), np.where(kept, 1 / (1 - p), 0), rtol=RTOL[dtype])


def test_gpu_trace_shows_the_cudnn_calls():
    x = _g(_uniform((64, 32)))
    x.attach_grad()
    with mx.trace() as t:
        with autograd.record():
            y = nd.Dropout(x, p=0.5)
        y.backward()
    names = [r.function for r in t.records]
    assert "cudnnDropoutForward" in names and "cudnnDropoutBackward" in names, names
    assert names.index("cudnnDropoutForward") < names.index("cudnnDropoutBackward")


def test_gpu_gluon_training_step_with_dropout():
    dev = mx.gpu(0)
    nd.random.seed(0)
    net = nn.Sequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dropout(0.5), nn.Dense(3))
    net.initialize(ctx=dev)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 20)).astype(np.float32) * 3
    label = rng.integers(0, 3, 256)
    data = _g(centers[label] + rng.standard_normal((256, 20)).astype(np.float32))
    lab = _g(label.astype(np.int32))
    losses = []
    for _ in range(30):
        with autograd.record():
            loss = loss_fn(net(data), lab)
        loss.backward()
        trainer.step(256)
        losses.append(float(np.mean(loss.numpy())))
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    acc = (net(data).numpy().argmax(axis=1) == label).mean()  # predict mode: Dropout is the identity
    assert acc > 0.9


@pytest.mark.parametrize("replay", ["graph", "host"])
def test_gpu_dropout_in_a_replayed_training_step(replay):
    """CapturedStep / RecordedStep: cuDNN's states were seeded in the warm-up; every replay advances them, so
    with a learning rate of 0 two replays on the same batch still give different losses (different masks)."""
    from dnnbind.graph import training_step
    dev = mx.gpu(0)
    net = nn.Sequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dropout(0.5), nn.Dense(10))
    net.initialize(ctx=dev)
    net(mx.zeros((32, 20), device=dev))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0})
    step = training_step(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, (32, 20), replay=replay, device=dev)
    data = _g(_uniform((32, 20)))
    label = _g(np.arange(32, dtype=np.int32) % 10)
    l1 = step(data, label).numpy().copy()
    l2 = step(data, label).numpy().copy()
    assert np.isfinite(l1).all() and np.isfinite(l2).all() and not np.array_equal(l1, l2)


@pytest.mark.parametrize("replay", ["graph", "host"])
def test_gpu_seeding_inside_a_replayed_step_is_refused(replay):
    from dnnbind.graph import REPLAYS, CaptureError
    x = _g(np.ones((256,), np.float32))

    def step():
        nd.random.seed(3)  # a new generation: cuDNN's states would be re-seeded inside the capture
        return nd.Dropout(x, p=0.5, mode="always")

    with pytest.raises(CaptureError, match="seeded outside a captured or recorded step"):
        REPLAYS[replay](step, inputs=[x], warmup=1)
    y = nd.Dropout(x, p=0.5, mode="always")  # eager use still works afterwards
    assert set(np.unique(y.numpy())) <= {0.0, 2.0}
