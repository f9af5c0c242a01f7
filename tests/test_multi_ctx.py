"""Parameters on several contexts and a Trainer over them (MXNet 1.x's ``ctx=[gpu(0), gpu(1)]`` data parallelism):
on the cpu (CI), and on two GPUs (marker ``gpu``; skipped with fewer than two).

dnnbind has one host device (``cpu(i)`` is ``cpu(0)``), so the cpu tests stand up a second host context with
``_host_context(1)``: a Device value of kind 'cpu' and index 1 that is not interned. Arrays made "on" it are
ordinary host arrays (their ``.device`` reads cpu(0)); Parameters and the Trainer keep their own list of
contexts, which is what these tests exercise. The forward of each slice runs under
``parameter.using_device(ctx)``: what a Block call does by itself from its input's device once block.py dispatches
(``Block._multi_ctx_dispatch``); ``test_block_call_picks_the_inputs_copy`` checks that form where devices differ.
References: the same network trained on one context on the whole batch, and float64 numpy for one Dense layer.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.gluon import Block, nn, parameter
from dnnbind.gluon.param_files import read_param_file
from dnnbind.gluon.parameter import using_device
from dnnbind.gluon.utils import split_and_load
from dnnbind.runtime.device import Device
from tests._helpers import assert_close

CPU = mx.cpu()  # explicit everywhere: on a GPU machine nd.array defaults to the GPU


def _by_path(net) -> dict:
    """Parameters by structural path (``0.weight``): collect_params() keys are full names, which differ between
    two instances of one model (MXNet's global name counters)."""
    return dict(net._collect_params_with_prefix())


def _host_context(index: int) -> Device:
    """A second host context: cpu(index) if the runtime tells cpu contexts apart, else a stand-in value."""
    dev = mx.cpu(index)
    if dev is not CPU:
        return dev
    dev = object.__new__(Device)
    object.__setattr__(dev, "kind", "cpu")
    object.__setattr__(dev, "index", index)
    return dev


CPU1, CPU2 = _host_context(1), _host_context(2)
CTXS = [CPU, CPU1]
RNG = np.random.default_rng(13)


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _arr(a, dtype=None):
    return nd.array(a, ctx=CPU, dtype=dtype)


def _copies(p) -> list:
    return [d.numpy() for d in p.list_data()]


# -- Parameters on a list of contexts ----------------------------------------------------------------------------
def test_cpu_i_is_cpu_0_so_a_list_naming_it_twice_is_refused():
    if mx.cpu(1) is not CPU:
        pytest.skip("this runtime tells cpu contexts apart")
    p = gluon.Parameter("w", shape=(2, 3))
    with pytest.raises(ValueError, match=r"Parameter `w`.initialize: ctx=\[cpu\(0\), cpu\(0\)\] names cpu\(0\) "
                                         r"twice.*cpu\(i\) is cpu\(0\)"):
        p.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    with pytest.raises(ValueError, match="ctx is an empty list"):
        p.initialize(ctx=[])


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5, 5), (7,)])
def test_initialize_on_a_list_gives_one_identical_copy_per_context(shape):
    p = gluon.Parameter("w", shape=shape, init=mx.init.Uniform(1.0))
    before = parameter.generation[0]
    p.initialize(ctx=CTXS)
    assert parameter.generation[0] > before  # a hybridized Block re-records
    assert p.list_ctx() == CTXS
    d0, d1 = p.list_data()
    assert d0 is not d1 and d0.shape == shape
    assert np.array_equal(d0.numpy(), d1.numpy()) and d0.numpy().std() > 0.1  # initialized once, then copied
    assert p.data(CPU) is d0 and p.data(CPU1) is d1
    assert p.data() is d0  # no current device: the first context
    assert all(a is b for a, b in zip(p.data(list), [d0, d1]))
    g0, g1 = p.list_grad()
    assert g0 is not g1 and not g0.numpy().any() and not g1.numpy().any()
    with using_device(CPU1):
        assert p.data() is d1 and p.grad() is g1
    assert p.grad(CPU1) is g1 and p.grad() is g0
    with pytest.raises(RuntimeError, match="Parameter `w` was not initialized on context"):
        p.data(CPU2)
    with using_device(CPU2), pytest.raises(RuntimeError, match=r"not initialized on the current device"):
        p.data()


def test_each_copy_is_its_own_autograd_leaf():
    p = gluon.Parameter("w", shape=(3, 4))
    p.initialize(ctx=CTXS)
    x = _rand(3, 4)
    with autograd.record(), using_device(CPU1):
        y = (p.data() * _arr(x)).sum()
    y.backward()
    g0, g1 = (g.numpy() for g in p.list_grad())
    assert_close(g1, x, 0, 0, "the gradient of the copy that was used")
    assert not g0.any()


def test_deferred_shapes_initialize_every_copy_on_the_first_forward():
    net = nn.Dense(4)
    net.initialize(ctx=CTXS)
    assert net.weight.list_ctx() == CTXS  # known before the shape is
    with using_device(CPU1):
        net(_arr(_rand(2, 6)))
    for p in (net.weight, net.bias):
        c0, c1 = _copies(p)
        assert np.array_equal(c0, c1)
    assert net.weight.shape == (4, 6) and _copies(net.weight)[0].std() > 0


def test_set_data_zero_grad_grad_req_cast_and_reset_ctx_reach_every_copy():
    p = gluon.Parameter("w", shape=(3, 5))
    p.initialize(ctx=CTXS)
    v = _rand(3, 5)
    p.set_data(_arr(v))
    assert all(np.array_equal(c, v) for c in _copies(p))
    for ctx in CTXS:
        with autograd.record(), using_device(ctx):
            y = (p.data() * p.data()).sum()
        y.backward()
    assert all(np.abs(g.numpy()).min() > 0 for g in p.list_grad())
    p.zero_grad()
    assert not any(g.numpy().any() for g in p.list_grad())

    before = parameter.generation[0]
    p.grad_req = "null"
    assert parameter.generation[0] > before
    with pytest.raises(RuntimeError, match="grad_req='null'"):
        p.list_grad()
    p.grad_req = "write"
    g0, g1 = p.list_grad()
    assert g0 is not g1

    p.cast("float64")
    assert all(d.dtype == np.float64 for d in p.list_data() + p.list_grad())
    assert all(np.array_equal(c, v.astype(np.float64)) for c in _copies(p))
    p.cast("float32")

    p.reset_ctx(CPU)
    assert p.list_ctx() == [CPU] and len(p.list_data()) == 1 and np.array_equal(p.data().numpy(), v)
    p.reset_ctx(CTXS)
    assert p.list_ctx() == CTXS and all(np.array_equal(c, v) for c in _copies(p))
    p.data(CPU1).copy_(_arr(v + 1))
    p.reset_ctx([CPU1, CPU2])  # a kept context keeps its copy, a new one copies the old first copy
    assert p.list_ctx() == [CPU1, CPU2]
    assert np.array_equal(p.data(CPU1).numpy(), v + 1) and np.array_equal(p.data(CPU2).numpy(), v)


def _mlp(hidden=5, out=3):
    net = nn.Sequential()
    net.add(nn.Dense(hidden, activation="relu"), nn.Dense(out))
    return net


def test_save_and_load_parameters_with_a_list_of_contexts(tmp_path):
    net = _mlp()
    net.initialize(ctx=CTXS)
    with using_device(CPU1):
        net(_arr(_rand(2, 4)))
    f = str(tmp_path / "net.params")
    net.save_parameters(f)
    expect = {k: _copies(p)[0] for k, p in _by_path(net).items()}

    one = _mlp()
    one.load_parameters(f, ctx=CPU)
    two = _mlp()
    two.load_parameters(f, ctx=CTXS)
    for k, p in _by_path(two).items():
        assert p.list_ctx() == CTXS
        assert all(np.array_equal(c, expect[k]) for c in _copies(p)), k
        assert np.array_equal(_by_path(one)[k].data().numpy(), expect[k]), k

    # Loading into an initialized model on a list writes every copy.
    two.collect_params().setattr("grad_req", "write")
    for p in two.collect_params().values():
        p.set_data(_arr(np.zeros(p.shape, np.float32)))
    two.load_parameters(f, ctx=CTXS)
    assert all(np.array_equal(c, expect["0.weight"]) for c in _copies(two[0].weight))

    # Copies that differ (BatchNorm statistics, one per device) are saved as their mean: MXNet's _reduce.
    w = two[0].weight
    w.data(CPU1).copy_(_arr(expect["0.weight"] + 2.0))
    two.collect_params().save(str(tmp_path / "dict.params"))
    saved = read_param_file(str(tmp_path / "dict.params"))
    assert_close(saved[w.name], expect["0.weight"] + 1.0, 1e-6, 1e-6, "mean of the two copies")
    two.collect_params().load(str(tmp_path / "dict.params"), ctx=CTXS)  # by prefixed name, into every copy
    assert all(np.array_equal(c, saved[w.name]) for c in _copies(w))


@pytest.mark.parametrize("shape,axis,n,even", [((8, 3), 0, 2, True), ((4, 6, 2), 1, 2, True), ((7, 2), 0, 2, False),
                                               ((9,), 0, 3, False)])
def test_split_and_load_puts_slice_i_on_context_i(shape, axis, n, even):
    x = _rand(*shape)
    ctxs = [CPU, CPU1, CPU2][:n]
    parts = split_and_load(_arr(x), ctxs, batch_axis=axis, even_split=even)
    assert len(parts) == n
    sizes = [p.shape[axis] for p in parts]
    each, extra = divmod(shape[axis], n)
    assert sizes == [each + 1] * extra + [each] * (n - extra)  # MXNet: the first slices take the remainder
    assert np.array_equal(np.concatenate([p.numpy() for p in parts], axis=axis), x)
    from_numpy = split_and_load(x, ctxs, batch_axis=axis, even_split=even)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(parts, from_numpy))
    one = split_and_load(_arr(x), [CPU])
    assert len(one) == 1 and np.array_equal(one[0].numpy(), x)


def test_split_and_load_refuses_an_uneven_split_unless_asked():
    with pytest.raises(ValueError, match=r"data with shape \(7, 2\) cannot be evenly split into 2 slices"):
        split_and_load(_arr(_rand(7, 2)), CTXS)
    with pytest.raises(ValueError, match="ctx_list is empty"):
        split_and_load(_arr(_rand(4, 2)), [])


# -- a Trainer over several contexts --------------------------------------------------------------------------------
def _conv():
    net = nn.Sequential()
    net.add(nn.Conv2D(4, kernel_size=3, padding=1, activation="relu"), nn.MaxPool2D(2), nn.Dense(6, activation="relu"),
            nn.Dense(3))
    return net


ARCHS = {"dense": (lambda: _mlp(7, 3), (5,)), "conv": (_conv, (2, 6, 6))}
OPTS = {"sgd": ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}), "adam": ("adam", {"learning_rate": 0.01})}


def _twins(arch: str, ctxs: list):
    """(net on ctxs, the same net on CPU alone holding the same values), shapes resolved."""
    build, shape = ARCHS[arch]
    multi, single = build(), build()
    multi.initialize(mx.init.Xavier(), ctx=ctxs)
    single.initialize(ctx=CPU)
    x = _arr(_rand(2, *shape))
    with using_device(ctxs[0]):
        multi(x)
    single(x)
    for pm, ps in zip(multi.collect_params().values(), single.collect_params().values()):
        ps.set_data(pm.data(ctxs[0]))
    return multi, single


def _parallel_step(net, trainer, loss_fn, x, y, ctxs, batch, used=None):
    """d2l-zh's train step on several contexts: split, one forward per context under one record(), backward each."""
    xs, ys = split_and_load(x, ctxs), split_and_load(y, ctxs)
    with autograd.record():
        losses = []
        for k, (ctx, a, b) in enumerate(zip(ctxs, xs, ys)):
            if used is None or k in used:
                with using_device(ctx):
                    losses.append(loss_fn(net(a), b))
    for loss in losses:
        loss.backward()
    trainer.step(batch)


def _plain_step(net, trainer, loss_fn, x, y, batch):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch)


def _batch(arch: str, n: int):
    return _arr(_rand(n, *ARCHS[arch][1])), _arr(RNG.integers(0, 3, n).astype(np.float32))


@pytest.mark.parametrize("opt", sorted(OPTS))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_two_contexts_train_like_one_context_on_the_whole_batch(arch, opt):
    multi, single = _twins(arch, CTXS)
    start = {k: p.data().numpy() for k, p in _by_path(single).items()}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tm = gluon.Trainer(multi.collect_params(), *OPTS[opt])
    ts = gluon.Trainer(single.collect_params(), *OPTS[opt])
    for b in (6, 4, 6):  # a different batch, and batch size, every step
        x, y = _batch(arch, 2 * b)
        _parallel_step(multi, tm, loss_fn, x, y, CTXS, 2 * b)
        _plain_step(single, ts, loss_fn, x, y, 2 * b)
    for k, p in _by_path(multi).items():
        c0, c1 = _copies(p)
        assert np.array_equal(c0, c1), f"{k}: the copies differ"
        ref = _by_path(single)[k].data().numpy()
        assert np.abs(ref - start[k]).max() > 1e-4, f"{k} did not move"
        assert_close(c0, ref, 1e-5, 1e-6, f"{k} after 3 steps on 2 contexts vs 1 context on the whole batch")


def test_one_dense_layer_on_two_contexts_matches_float64_numpy():
    n_in, n_out, b, lr, wd = 5, 3, 4, 0.1, 0.01
    net = nn.Dense(n_out, in_units=n_in)
    net.initialize(ctx=CTXS)
    w, bias = _rand(n_out, n_in), _rand(n_out)
    net.weight.set_data(_arr(w))
    net.bias.set_data(_arr(bias))
    x, t = _rand(2 * b, n_in), _rand(2 * b, n_out)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr, "wd": wd})
    _parallel_step(net, trainer, gluon.loss.L2Loss(), _arr(x), _arr(t), CTXS, 2 * b)
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64)
    dpred = (x64 @ w64.T + b64 - t) / n_out  # d/dpred of mean over outputs of (pred - t)^2 / 2, per sample
    gw, gb = dpred.T @ x64, dpred.sum(0)
    expect_w = w64 - lr * (gw / (2 * b) + wd * w64)
    expect_b = b64 - lr * (gb / (2 * b) + wd * b64)
    for c in _copies(net.weight):
        assert_close(c, expect_w, 1e-5, 1e-7, "weight vs float64")
    for c in _copies(net.bias):
        assert_close(c, expect_b, 1e-5, 1e-7, "bias vs float64")


def test_a_context_without_backward_is_stale_and_ignoring_it_counts_zeros():
    multi, single = _twins("dense", CTXS)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tm = gluon.Trainer(multi.collect_params(), "sgd", {"learning_rate": 0.2})
    ts = gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.2})
    x, y = _batch("dense", 8)
    _parallel_step(multi, tm, loss_fn, x, y, CTXS, 8)  # every copy's gradient is now non-zero
    _plain_step(single, ts, loss_fn, x, y, 8)
    x, y = _batch("dense", 8)
    with pytest.raises(gluon.StaleGradientError, match=r"Gradient of Parameter `0.weight` on context .* has not "
                                                       r"been updated by backward since last `step` \(and 3 more"):
        _parallel_step(multi, tm, loss_fn, x, y, CTXS, 8, used={0})
    tm.step(8, ignore_stale_grad=True)  # context 1's gradient counts as zeros: the first half's gradient only
    _plain_step(single, ts, loss_fn, x[:4], y[:4], 8)
    for k, p in _by_path(multi).items():
        c0, c1 = _copies(p)
        assert np.array_equal(c0, c1), k
        assert_close(c0, _by_path(single)[k].data(), 1e-5, 1e-6, k)


def test_kvstore_none_updates_each_copy_with_its_own_gradient():
    multi, single = _twins("dense", CTXS)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tm = gluon.Trainer(multi.collect_params(), "sgd", {"learning_rate": 0.2}, kvstore=None)
    ts = gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.2})
    x, y = _batch("dense", 8)
    _parallel_step(multi, tm, loss_fn, x, y, CTXS, 8)
    _plain_step(single, ts, loss_fn, x[:4], y[:4], 8)  # copy 0 saw the first half only (MXNet's kvstore=None)
    w0, w1 = _copies(multi[0].weight)
    assert not np.array_equal(w0, w1)
    assert_close(w0, single[0].weight.data(), 1e-5, 1e-6, "copy 0")


def test_allreduce_grads_then_update_is_step():
    a, _ = _twins("dense", CTXS)
    b, _ = _twins("dense", CTXS)
    for pa, pb in zip(a.collect_params().values(), b.collect_params().values()):
        pb.set_data(pa.data())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    ta = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.5})
    tb = gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.5})
    x, y = _batch("dense", 6)
    _parallel_step(a, ta, loss_fn, x, y, CTXS, 6)
    xs, ys = split_and_load(x, CTXS), split_and_load(y, CTXS)
    with autograd.record():
        losses = []
        for ctx, xi, yi in zip(CTXS, xs, ys):
            with using_device(ctx):
                losses.append(loss_fn(b(xi), yi))
    for loss in losses:
        loss.backward()
    before = [g.numpy() for g in b[0].weight.list_grad()]
    tb.allreduce_grads()
    g0, g1 = (g.numpy() for g in b[0].weight.list_grad())
    assert np.array_equal(g0, g1)
    assert_close(g0, before[0] + before[1], 1e-6, 1e-7, "summed gradient")
    tb.update(6)
    for pa, pb in zip(a.collect_params().values(), b.collect_params().values()):
        assert all(np.array_equal(ca, cb) for ca, cb in zip(_copies(pa), _copies(pb)))


def test_save_and_load_states_fill_every_context(tmp_path):
    a, _ = _twins("dense", CTXS)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    ta = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for _ in range(2):
        x, y = _batch("dense", 6)
        _parallel_step(a, ta, loss_fn, x, y, CTXS, 6)
    f = str(tmp_path / "t.states")
    ta.save_states(f)
    b, _ = _twins("dense", CTXS)
    for pa, pb in zip(a.collect_params().values(), b.collect_params().values()):
        pb.set_data(pa.data())
    tb = gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    tb.load_states(f)
    for buf in tb._bufs:
        assert np.array_equal(buf.states[0].numpy(), ta._bufs[0].states[0].numpy())
    x, y = _batch("dense", 6)
    _parallel_step(a, ta, loss_fn, x, y, CTXS, 6)
    _parallel_step(b, tb, loss_fn, x, y, CTXS, 6)
    for pa, pb in zip(a.collect_params().values(), b.collect_params().values()):
        assert all(np.array_equal(ca, cb) for ca, cb in zip(_copies(pa), _copies(pb)))


def test_float16_master_weights_on_two_contexts():
    multi, single = _twins("dense", CTXS)
    multi.cast("float16")
    single.cast("float16")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tm = gluon.Trainer(multi.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    ts = gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    start = single[0].weight.data().numpy().astype(np.float32)
    for _ in range(3):
        x, y = _batch("dense", 8)
        x = x.astype(np.float16)
        _parallel_step(multi, tm, loss_fn, x, y, CTXS, 8)
        _plain_step(single, ts, loss_fn, x, y, 8)
    assert len(tm._bufs) == 2 and tm._half_end > 0
    for k, p in _by_path(multi).items():
        c0, c1 = _copies(p)
        assert c0.dtype == np.float16 and np.array_equal(c0, c1), k
        assert_close(c0, _by_path(single)[k].data(), 2e-3, 2e-3, k)
    for b in tm._bufs:  # the float32 master weights too
        assert np.array_equal(b.data.numpy(), tm._bufs[0].data.numpy())
    assert np.abs(single[0].weight.data().numpy().astype(np.float32) - start).max() > 1e-3


class _HandSGD(gluon.optimizer.Optimizer):
    """A custom optimizer written against MXNet's per-weight API."""

    def update(self, index, weight, grad, state):
        self._update_count(index)
        weight[:] = weight - self._get_lr(index) * self.rescale_grad * grad


def test_a_custom_optimizer_updates_every_copy_with_its_own_counts():
    multi, single = _twins("dense", CTXS)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tm = gluon.Trainer(multi.collect_params(), _HandSGD(learning_rate=0.3))
    ts = gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.3})
    for _ in range(2):
        x, y = _batch("dense", 6)
        _parallel_step(multi, tm, loss_fn, x, y, CTXS, 6)
        _plain_step(single, ts, loss_fn, x, y, 6)
    assert tm.optimizer._index_update_count == {i: 2 for i in range(4)}  # per context, not 4
    assert tm.optimizer.num_update == 2
    for k, p in _by_path(multi).items():
        c0, c1 = _copies(p)
        assert np.array_equal(c0, c1), k
        assert_close(c0, _by_path(single)[k].data(), 1e-5, 1e-6, k)


def test_trainer_needs_one_list_of_contexts():
    a, b = nn.Dense(2, in_units=3), nn.Dense(2, in_units=3)
    a.initialize(ctx=CTXS)
    b.initialize(ctx=CPU)
    params = list(a.collect_params().values()) + list(b.collect_params().values())
    with pytest.raises(ValueError, match="Trainer: all Parameters must live on the same contexts"):
        gluon.Trainer(params, "sgd")


def test_single_context_data_path_is_unchanged():
    p = gluon.Parameter("w", shape=(2, 2))
    p.initialize(ctx=CPU)
    assert p._data_list is None and p.data() is p.list_data()[0] and p.data(CPU) is p.data()
    with using_device(CPU1):  # a Parameter on one context ignores the current device
        assert p.data() is p.list_data()[0]
    with pytest.raises(RuntimeError, match=r"was not initialized on context .*; it lives on cpu\(0\)"):
        p.data(CPU1)


@pytest.mark.skipif(not hasattr(Block, "_multi_ctx_dispatch"), reason="block.py does not yet set the current "
                    "device from a Block call's input (Block._multi_ctx_dispatch)")
@pytest.mark.parametrize("where", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_block_call_picks_the_inputs_copy(where):
    """``net(x)`` with x on context k uses copy k, without using_device: d2l-zh's loop as written."""
    if where == "cpu":
        if CPU1 is CPU or mx.cpu(1) is CPU:
            pytest.skip("host arrays carry no cpu index here (cpu(i) is cpu(0)): no input can name cpu(1)")
        ctxs = [CPU, mx.cpu(1)]
    else:
        if mx.num_gpus() < 2:
            pytest.skip(f"needs 2 GPUs, found {mx.num_gpus()}")
        ctxs = [mx.gpu(0), mx.gpu(1)]
    net = _mlp()
    net.initialize(ctx=ctxs)
    x = nd.array(_rand(4, 5), ctx=ctxs[0])
    xs = split_and_load(x, ctxs)
    with autograd.record():
        losses = [net(xi).sum() for xi in xs]
    for loss in losses:
        loss.backward()
    # The same weights on one device, given each slice: copy k's gradient must be slice k's. (Comparing the two
    # copies with each other cannot tell: the output bias's gradient of a sum is the slice's size on both.)
    single = _mlp()
    single.initialize(ctx=ctxs[0])
    single(xs[0].as_in_context(ctxs[0]))
    for ps, pm in zip(single.collect_params().values(), net.collect_params().values()):
        ps.set_data(pm.data(ctxs[0]))
    for k, xk in enumerate(xs):
        with autograd.record():
            single(xk.as_in_context(ctxs[0])).sum().backward()
        for ps, pm in zip(single.collect_params().values(), net.collect_params().values()):
            want, got = ps.grad().numpy(), pm.list_grad()[k].numpy()
            assert np.abs(got).max() > 0, (pm.name, k)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{pm.name}, copy {k}")


# -- two GPUs ----------------------------------------------------------------------------------------------------------
def _gpus(n: int = 2) -> list:
    if mx.num_gpus() < n:
        pytest.skip(f"needs {n} GPUs, found {mx.num_gpus()}")
    return [mx.gpu(i) for i in range(n)]


def _gpu_twins(arch: str, gpus: list, dtype=None):
    build, shape = ARCHS[arch]
    multi, single = build(), build()
    multi.initialize(mx.init.Xavier(), ctx=gpus)
    single.initialize(ctx=gpus[0])
    with using_device(gpus[0]):
        multi(nd.array(_rand(2, *shape), ctx=gpus[0]))
    single(nd.array(_rand(2, *shape), ctx=gpus[0]))
    for pm, ps in zip(multi.collect_params().values(), single.collect_params().values()):
        ps.set_data(pm.data(gpus[0]))
    if dtype is not None:
        multi.cast(dtype)
        single.cast(dtype)
    return multi, single


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [None, "float16"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_d2l_program_on_two_gpus_keeps_copies_bitwise_equal(arch, dtype):
    gpus = _gpus()
    old = mx.set_math_mode("fp32")
    try:
        multi, single = _gpu_twins(arch, gpus, dtype)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        tm = gluon.Trainer(multi.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
        ts = gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
        for b in (8, 16, 8):
            xh, yh = _rand(2 * b, *ARCHS[arch][1]), RNG.integers(0, 3, 2 * b).astype(np.float32)
            x = nd.array(xh, ctx=gpus[0], dtype=dtype)
            y = nd.array(yh, ctx=gpus[0])
            _parallel_step(multi, tm, loss_fn, x, y, gpus, 2 * b)
            _plain_step(single, ts, loss_fn, x, y, 2 * b)
        rtol, atol = (5e-3, 1e-3) if dtype == "float16" else (1e-4, 1e-5)
        for k, p in _by_path(multi).items():
            c0, c1 = _copies(p)
            assert np.array_equal(c0, c1), f"{k}: the GPUs' copies differ"
            assert_close(c0, _by_path(single)[k].data(), rtol, atol, f"{k}: 2 GPUs vs 1 GPU")
    finally:
        mx.set_math_mode(old)


@pytest.mark.gpu
def test_a_mix_of_cpu_and_gpu_contexts_is_refused():
    net = nn.Dense(2, in_units=3)
    net.initialize(ctx=[CPU, mx.gpu(0)])
    with pytest.raises(ValueError, match="a mix of cpu and gpu contexts"):
        gluon.Trainer(net.collect_params(), "sgd")
