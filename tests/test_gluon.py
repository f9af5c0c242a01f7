"""Gluon on the cpu backend: Blocks, Parameters, layers, losses, Trainer (SGD/Adam vs numpy), the seed's loop.

Optimizer tests use a tiny Dense model whose gradients are easy to write in numpy, and check the update
rules against hand-written MXNet and PyTorch formulas.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind import initializer as init
from dnnbind.gluon import nn
from tests._helpers import assert_close

CPU = mx.cpu()


def _x(*shape, seed=0):
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=CPU)


class Net(gluon.Block):
    def __init__(self, hidden=8, out=3, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.Sequential()
            with self.body.name_scope():  # MXNet's idiom: the body's children take the body's prefix
                self.body.add(nn.Dense(hidden, activation="relu"), nn.Dense(hidden))
            self.head = nn.Dense(out)

    def forward(self, x):
        return self.head(self.body(x))


# -- registration, naming, deferred init, repr ----------------------------------------------------------------

def test_collect_params_full_names_and_prefixes():
    net = Net(prefix="net_")
    keys = list(net.collect_params().keys())  # MXNet 1.x: full names (save_parameters writes paths)
    assert keys == ["net_sequential0_dense0_weight", "net_sequential0_dense0_bias", "net_sequential0_dense1_weight",
                    "net_sequential0_dense1_bias", "net_dense0_weight", "net_dense0_bias"]
    assert net.body.prefix == "net_sequential0_"
    assert net.body[0].prefix == "net_sequential0_dense0_"
    assert net.head.prefix == "net_dense0_"
    assert net.head.weight.name == "net_dense0_weight"
    assert list(net.collect_params(".*weight").keys()) == ["net_sequential0_dense0_weight",
                                                           "net_sequential0_dense1_weight", "net_dense0_weight"]
    assert list(net.collect_params("net_dense").keys()) == ["net_dense0_weight", "net_dense0_bias"]


def test_global_prefix_counts_and_seed_model_names():
    from models import SimpleCNN
    a, b = SimpleCNN(), SimpleCNN()
    na, nb = int(a.prefix[len("simplecnn"):-1]), int(b.prefix[len("simplecnn"):-1])
    assert nb == na + 1
    assert a.conv1.prefix == a.prefix + "conv0_" and a.conv2.prefix == a.prefix + "conv1_"
    assert a.fc2.prefix == a.prefix + "dense1_"
    assert list(a.collect_params()) == [a.prefix + n for n in ("conv0_weight", "conv0_bias", "conv1_weight",
                                                               "conv1_bias", "dense0_weight", "dense0_bias",
                                                               "dense1_weight", "dense1_bias")]


def test_registration_by_assignment_shared_and_unregister():
    class Tied(gluon.Block):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(4, in_units=4)
            self.b = nn.Dense(4, in_units=4, params=self.a.params)  # shares a's weight and bias
            self.scale = gluon.Parameter("scale", shape=(1,))

    t = Tied()
    assert t.b.weight is t.a.weight
    # Own Parameters first, then children (MXNet's order); shared ones once, under their first name.
    names = ["scale", t.a.weight.name, t.a.bias.name]
    assert list(t.collect_params()) == names
    t.a = None
    assert list(t.collect_params()) == names  # b's Parameters are a's, names included

    class Broken(gluon.Block):
        def __init__(self):
            self.fc = nn.Dense(2)

    with pytest.raises(RuntimeError, match="super"):
        Broken()


def test_deferred_init_and_error_text():
    net = Net()
    net.initialize(ctx=CPU)
    assert net.head.weight.shape == (3, 0)
    with pytest.raises(gluon.DeferredInitializationError) as err:
        net.head.weight.data()
    text = str(err.value)
    assert "head.weight" in text and "forward pass" in text and "in_units" in text
    y = net(_x(5, 6))
    assert y.shape == (5, 3)
    assert net.body[0].weight.shape == (8, 6) and net.head.weight.shape == (3, 8)
    # Known shapes initialize at once; an uninitialized Parameter says what to call.
    d = nn.Dense(4, in_units=6)
    with pytest.raises(RuntimeError, match="initialize"):
        d.weight.data()
    d.initialize(ctx=CPU)
    assert d.weight.data().shape == (4, 6)
    conv = nn.Conv2D(4, 3, in_channels=2)
    conv.initialize(ctx=CPU)
    assert conv.weight.data().shape == (4, 2, 3, 3)


def test_repr_is_nested_with_arguments():
    net = nn.Sequential()
    net.add(nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"), nn.MaxPool2D(2), nn.Flatten(),
            nn.Dropout(0.5), nn.Dense(10, in_units=3136))
    text = repr(net)
    assert text.startswith("Sequential(\n  (0): Conv2D(None -> 16, kernel_size=(3, 3), stride=(1, 1)")
    assert "padding=(1, 1)" in text and "Activation(relu)" in text
    assert "(1): MaxPool2D(size=(2, 2), stride=(2, 2)" in text
    assert "(4): Dense(3136 -> 10, linear)" in text
    outer = Net()
    assert "  (body): Sequential(\n    (0): Dense(None -> 8, relu)" in repr(outer)
    net.hybridize()  # accepted, no-op


def test_hybrid_forward_style_block_and_hooks():
    class Scale(gluon.HybridBlock):  # MXNet 1.x style: Parameters arrive as keyword arguments
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.alpha = self.params.get("alpha", shape=(2,), init=init.Constant(3.0))

        def hybrid_forward(self, F, x, alpha):
            return F.relu(x) * alpha

    block = Scale()
    block.initialize(ctx=CPU)
    block.hybridize()
    seen = []
    block.register_forward_hook(lambda blk, inputs, out: seen.append(out.shape))
    x = mx.array(np.array([-1.0, 2.0], np.float32))
    with autograd.record():
        y = block(x)
    y.backward()
    assert_close(y, [0.0, 6.0], 0, 0, "hybrid_forward output")
    assert_close(block.alpha.grad(), [0.0, 2.0], 0, 0, "grad of alpha")
    assert seen == [(2,)] and block.alpha.name == block.prefix + "alpha"


# -- save / load --------------------------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    net = Net()
    net.initialize(ctx=CPU)
    x = _x(4, 6)
    y = net(x).numpy()
    path = tmp_path / "net.params"
    net.save_parameters(str(path))
    assert os.listdir(tmp_path) == ["net.params"]  # atomic write leaves no temp file, adds no suffix
    other = Net()  # deferred shapes are filled in from the file
    other.load_parameters(str(path), ctx=CPU)
    assert_close(other(x), y, 0, 0, "reloaded output")
    third = Net()
    third.initialize(ctx=CPU)
    third.load_parameters(str(path))
    assert_close(third(x), y, 0, 0, "reloaded output")
    # A file keyed by prefixed names (MXNet 1.x save_params) loads by name.
    legacy = tmp_path / "legacy.npz"
    np.savez(legacy, **{p.name: p.data().numpy() for p in net.collect_params().values()})
    fourth = Net(prefix=net.prefix)
    fourth.load_parameters(str(legacy), ctx=[CPU])
    assert_close(fourth(x), y, 0, 0, "legacy names")


def test_load_mismatch_names_every_problem(tmp_path):
    net = Net()
    net.initialize(ctx=CPU)
    net(_x(2, 6))
    path = str(tmp_path / "net.params")
    net.save_parameters(path)

    class Other(gluon.Block):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential()
            self.body.add(nn.Dense(8, in_units=6), nn.Dense(8, in_units=5))
            self.tail = nn.Dense(3, in_units=8)

    other = Other()
    other.initialize(ctx=CPU)
    with pytest.raises(ValueError) as err:
        other.load_parameters(path)
    text = str(err.value)
    assert "missing" in text and "tail.weight" in text and "tail.bias" in text
    assert "not in this model" in text and "head.weight" in text and "head.bias" in text
    assert "shape mismatch for body.1.weight: the model expects (8, 5), the file has (8, 8)" in text
    with pytest.raises(ValueError, match="shape mismatch"):
        other.load_parameters(path, allow_missing=True, ignore_extra=True)
    net2 = Net()
    net2.initialize(ctx=CPU)
    net2.load_parameters(path, ignore_extra=True)


# -- Trainer vs numpy ------------------------------------------------------------------------------------------

def _tiny(seed=0):
    """Dense(3, in_units=4) with fixed values, an input batch and L2 targets."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    net = nn.Dense(3, in_units=4)
    net.initialize(ctx=CPU)
    net.weight.set_data(w0)
    net.bias.set_data(b0)
    return net, w0.astype(np.float64), b0.astype(np.float64), x, t


def _np_grads(w, b, x, t):
    """Gradient of sum_i L2Loss_i = sum_i 0.5/C sum_c (y_ic - t_ic)^2, y = x w^T + b."""
    dy = (x @ w.T + b - t) / t.shape[1]
    return dy.T @ x, dy.sum(0)


def _run(net, trainer, x, t, steps):
    loss_fn = gluon.loss.L2Loss()
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(mx.array(x)), mx.array(t))
        loss.backward()
        trainer.step(batch_size=x.shape[0])


def test_sgd_momentum_wd_matches_numpy_and_pytorch_form():
    net, w, b, x, t = _tiny()
    lr, mom, wd, n = 0.1, 0.9, 0.01, x.shape[0]
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr, "momentum": mom, "wd": wd})
    _run(net, trainer, x, t, 4)
    # MXNet's form: v = mom v - lr (g/n + wd w); w += v
    wm, bm, vw, vb = w.copy(), b.copy(), np.zeros_like(w), np.zeros_like(b)
    # PyTorch's form: buf = mom buf + (g/n + wd w); w -= lr buf
    wt, bt, uw, ub = w.copy(), b.copy(), np.zeros_like(w), np.zeros_like(b)
    for _ in range(4):
        gw, gb = _np_grads(wm, bm, x, t)
        vw, vb = mom * vw - lr * (gw / n + wd * wm), mom * vb - lr * (gb / n + wd * bm)
        wm, bm = wm + vw, bm + vb
        gw, gb = _np_grads(wt, bt, x, t)
        uw, ub = mom * uw + gw / n + wd * wt, mom * ub + gb / n + wd * bt
        wt, bt = wt - lr * uw, bt - lr * ub
    assert_close(wm, wt, 1e-12, 1e-12, "MXNet vs PyTorch SGD form")
    assert_close(net.weight.data(), wm, 1e-5, 1e-6, "SGD weight")
    assert_close(net.bias.data(), bm, 1e-5, 1e-6, "SGD bias")


def test_sgd_plain_and_learning_rate_setter():
    net, w, b, x, t = _tiny(1)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    assert trainer.learning_rate == 0.5
    trainer.set_learning_rate(0.2)
    _run(net, trainer, x, t, 2)
    for _ in range(2):
        gw, gb = _np_grads(w, b, x, t)
        w, b = w - 0.2 * gw / 5, b - 0.2 * gb / 5
    assert_close(net.weight.data(), w, 1e-5, 1e-6, "SGD weight")
    assert_close(net.bias.data(), b, 1e-5, 1e-6, "SGD bias")


def test_adam_matches_numpy():
    net, w, b, x, t = _tiny(2)
    lr, b1, b2, eps, wd, n = 0.01, 0.9, 0.999, 1e-8, 0.001, x.shape[0]
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": lr, "wd": wd})
    _run(net, trainer, x, t, 3)
    state = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in (("w", w), ("b", b))}
    p = {"w": w, "b": b}
    for step in range(1, 4):
        gw, gb = _np_grads(p["w"], p["b"], x, t)
        lr_t = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        for k, g in (("w", gw), ("b", gb)):
            gi = g / n + wd * p[k]
            m, v = state[k]
            m[...] = b1 * m + (1 - b1) * gi
            v[...] = b2 * v + (1 - b2) * gi * gi
            p[k] = p[k] - lr_t * m / (np.sqrt(v) + eps)
    assert_close(net.weight.data(), p["w"], 1e-5, 1e-6, "Adam weight")
    assert_close(net.bias.data(), p["b"], 1e-5, 1e-6, "Adam bias")


def test_stale_gradient_error_and_ignore():
    class TwoHeads(gluon.Block):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(2, in_units=3)
            self.b = nn.Dense(2, in_units=3)

        def forward(self, x):
            return self.a(x)  # b is never used

    net = TwoHeads()
    net.initialize(ctx=CPU)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    b_before, a_before = net.b.weight.data().numpy(), net.a.weight.data().numpy()
    with autograd.record():
        y = net(_x(4, 3))
    y.backward()
    with pytest.raises(gluon.StaleGradientError) as err:
        trainer.step(4)
    text = str(err.value)
    assert "Gradient of Parameter `b.weight` on context cpu(0) has not been updated by backward" in text
    assert "ignore_stale_grad=True" in text
    assert isinstance(err.value, UserWarning) and isinstance(err.value, RuntimeError)
    trainer.step(4, ignore_stale_grad=True)
    assert_close(net.b.weight.data(), b_before, 0, 0, "stale parameter left alone")
    assert np.abs(net.a.weight.data().numpy() - a_before).max() > 0
    with pytest.raises(gluon.StaleGradientError, match="a.weight"):
        trainer.step(4)  # no backward since the last step


def test_grad_req_add_accumulates_and_write_overwrites():
    net, w, b, x, t = _tiny(3)
    gw, _ = _np_grads(w, b, x, t)
    loss_fn = gluon.loss.L2Loss()
    for req, factor in (("write", 1), ("add", 2)):
        net.collect_params().setattr("grad_req", req)
        net.collect_params().zero_grad()
        for _ in range(2):
            with autograd.record():
                loss = loss_fn(net(mx.array(x)), mx.array(t))
            loss.backward()
        assert_close(net.weight.grad(), factor * gw, 1e-5, 1e-6, f"grad with grad_req={req}")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    trainer.zero_grad()  # one memset over the flat gradient
    assert not np.abs(net.weight.grad().numpy()).any() and not np.abs(net.bias.grad().numpy()).any()
    net.weight.grad_req = "null"
    with pytest.raises(RuntimeError, match="grad_req='null'"):
        net.weight.grad()


def test_flat_buffer_packing_params_are_views():
    net = Net()
    net.initialize(ctx=CPU)
    x = _x(3, 6)
    before = net(x).numpy()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    assert_close(net(x), before, 0, 0, "values copied into the flat buffer")
    flat = trainer._flat_data
    for key, p in net.collect_params().items():
        off = trainer._offsets[trainer._params.index(p)]
        assert off % 64 == 0, f"{key} at offset {off}"
        assert_close(flat[off:off + p.data().size].reshape(p.shape), p.data(), 0, 0, key)
    mx.fill(flat, 0.25)  # writing the flat buffer is writing every Parameter
    assert np.all(net.head.weight.data().numpy() == 0.25) and np.all(net.body[0].bias.data().numpy() == 0.25)
    with autograd.record():
        y = net(x)
    y.backward()  # gradients land in the flat gradient buffer
    off = trainer._offsets[trainer._names.index("head.bias")]
    assert_close(trainer._flat_grad[off:off + 3], net.head.bias.grad(), 0, 0, "grad view")
    assert np.abs(net.head.bias.grad().numpy()).sum() > 0


def test_lr_mult_groups_constant_and_state_arrays():
    class WithConst(gluon.Block):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, in_units=4)
            self.frozen = nn.Dense(3, in_units=3)
            self.offset = gluon.Constant("offset", np.array([1.0, 2.0, 3.0], np.float32))

        def forward(self, x):
            return self.frozen(self.fc(x)) + self.offset.data()

    net = WithConst()
    net.initialize(ctx=CPU)
    net.frozen.weight.lr_mult = 0.0  # a group of its own: the SGD step over it uses lr 0
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.5})
    assert [len(g.members) for g in trainer._groups] == [3, 1]
    assert sorted(trainer._names[i] for i in trainer._offsets) == ["fc.bias", "fc.weight", "frozen.bias",
                                                                    "frozen.weight"]
    assert net.offset.grad_req == "null"  # a Constant is not packed or updated
    assert_close(net.offset.data(), [1, 2, 3], 0, 0, "Constant value")
    arrays = trainer.state_arrays()
    assert arrays[0] is trainer._flat_data and len(arrays) == 3  # data, grads, momentum
    before = {k: p.data().numpy() for k, p in net.collect_params().items()}
    with autograd.record():
        y = net(_x(2, 4))
    y.backward()
    trainer.step(2)
    after = {k: p.data().numpy() for k, p in net.collect_params().items()}
    frozen_w, fc_w, frozen_b = net.frozen.weight.name, net.fc.weight.name, net.frozen.bias.name
    assert np.array_equal(before[frozen_w], after[frozen_w])
    assert not np.array_equal(before[fc_w], after[fc_w])
    assert not np.array_equal(before[frozen_b], after[frozen_b])


def test_trainer_packs_on_first_step_when_deferred_and_checkpoints(tmp_path):
    def make():
        np.random.seed(5)
        net = Net()
        net.initialize(ctx=CPU)
        return net, gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})

    x, t = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32), np.zeros((4, 3), np.float32)
    net, trainer = make()
    _run(net, trainer, x, t, 2)  # shapes are inferred inside the first record(); packing happens at step
    assert trainer._layout is not None
    net.save_parameters(str(tmp_path / "p"))
    trainer.save_states(str(tmp_path / "s"))
    _run(net, trainer, x, t, 2)
    expected = net(mx.array(x)).numpy()
    net2, trainer2 = make()
    net2.load_parameters(str(tmp_path / "p"), ctx=CPU)
    trainer2 = gluon.Trainer(net2.collect_params(), "adam", {"learning_rate": 0.01})
    trainer2.load_states(str(tmp_path / "s"))
    _run(net2, trainer2, x, t, 2)
    assert_close(net2(mx.array(x)), expected, 1e-6, 1e-7, "resumed Adam run")


# -- losses, initializers, metric -------------------------------------------------------------------------------

def test_softmax_cross_entropy_variants():
    logits = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    labels = np.array([0, 4, 2, 2, 1, 3], np.int32)
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    expected = -logp[np.arange(6), labels]
    x = mx.array(logits)
    x.attach_grad()
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(x, mx.array(labels))
    loss.backward()
    assert loss.shape == (6,)
    assert_close(loss, expected, 1e-5, 1e-6, "sparse CE")
    assert_close(x.grad, np.exp(logp) - np.eye(5)[labels], 1e-5, 1e-6, "dCE/dlogits")
    onehot = mx.array(np.eye(5, dtype=np.float32)[labels])
    assert_close(gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)(x, onehot), expected, 1e-5, 1e-6, "dense")
    assert_close(gluon.loss.NLLLoss()(mx.array(logp.astype(np.float32)), mx.array(labels)), expected, 1e-5, 1e-6,
                 "NLL")
    assert_close(gluon.loss.SoftmaxCrossEntropyLoss(from_logits=True)(nd.log_softmax(x), mx.array(labels[:, None])),
                 expected, 1e-5, 1e-6, "from_logits with (N, 1) labels")
    assert_close(gluon.loss.SoftmaxCrossEntropyLoss(weight=2.0)(x, mx.array(labels)), 2 * expected, 1e-5, 1e-6,
                 "weighted")


def test_initializers():
    np.random.seed(0)
    conv = nn.Conv2D(64, 3, in_channels=4)
    conv.initialize(init.TorchDefault(), ctx=CPU)
    bound = 1 / np.sqrt(4 * 9)
    for p in (conv.weight, conv.bias):
        v = p.data().numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.9 * bound, p.name
    dense = nn.Dense(200, in_units=300)
    dense.initialize(init.Xavier(), ctx=CPU)
    var = dense.weight.data().numpy().var()
    assert abs(var / (2 / 500) - 1) < 0.05
    assert np.all(dense.bias.data().numpy() == 0)
    default = nn.Dense(50, in_units=40)
    default.initialize(ctx=CPU)  # MXNet's default: Uniform(0.07) weights, zero biases
    w = default.weight.data().numpy()
    assert np.abs(w).max() <= 0.07 and np.abs(w).max() > 0.06 and np.all(default.bias.data().numpy() == 0)
    explicit = nn.Dense(3, in_units=2, bias_initializer="ones")
    explicit.initialize(init.Normal(0.5), ctx=CPU)
    assert np.all(explicit.bias.data().numpy() == 1)
    with pytest.warns(UserWarning, match="already initialized"):
        explicit.initialize(ctx=CPU)


def test_accuracy_metric():
    acc = gluon.metric.Accuracy()
    acc.update(mx.array(np.array([1, 0, 2], np.int32)), mx.array(np.eye(3, dtype=np.float32)[[1, 2, 2]]))
    assert acc.get() == ("accuracy", 2 / 3)
    acc.update([mx.array(np.array([0], np.int32))], [mx.array(np.array([[0.9, 0.1]], np.float32))])
    assert acc.get()[1] == 3 / 4
    acc.reset()
    assert np.isnan(acc.get()[1])


# -- the seed ----------------------------------------------------------------------------------------------------

def test_seed_simplecnn_training_loop_loss_falls():
    # The seed's code with only the import lines changed (lr 0.1 instead of 0.01 so that ~30 steps show it).
    import dnnbind as mx
    from dnnbind import gluon, nd
    from dnnbind.gluon import nn

    class SimpleCNN(gluon.Block):
        def __init__(self):
            super(SimpleCNN, self).__init__()  # noqa: UP008  (the seed's spelling)
            with self.name_scope():
                self.conv1 = nn.Conv2D(32, kernel_size=3, strides=1, padding=1)
                self.conv2 = nn.Conv2D(64, kernel_size=3, strides=1, padding=1)
                self.fc1 = nn.Dense(128)
                self.fc2 = nn.Dense(10)

        def forward(self, x):
            x = nd.relu(self.conv1(x))
            x = nd.Pooling(x, pool_type='max', kernel=(2, 2), stride=(2, 2))
            x = nd.relu(self.conv2(x))
            x = nd.Pooling(x, pool_type='max', kernel=(2, 2), stride=(2, 2))
            x = x.reshape((0, -1))  # 展平
            x = nd.relu(self.fc1(x))
            x = self.fc2(x)
            return x

    ctx = mx.cpu()
    np.random.seed(0)
    net = SimpleCNN()
    net.initialize(ctx=ctx)

    from dnnbind import gluon, autograd  # noqa: I001  (the seed's import line)

    # 256 synthetic digits: class k is a bright 5x5 square at grid cell k, on noise.
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 256).astype(np.int32)
    images = (rng.random((256, 1, 28, 28)) * 0.2).astype(np.float32)
    for i, k in enumerate(labels):
        r, c = divmod(int(k), 4)
        images[i, 0, 2 + 7 * r:7 + 7 * r, 2 + 7 * c:7 + 7 * c] += 1.0
    train_loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, labels), batch_size=64, shuffle=True)

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})

    losses = []
    for epoch in range(8):
        for data, label in train_loader:
            data = data.as_in_context(ctx)
            label = label.as_in_context(ctx)
            with autograd.record():
                output = net(data)  # 前向传播
                loss = loss_fn(output, label)  # 计算损失
            loss.backward()  # 反向传播
            trainer.step(batch_size=64)  # 更新参数
            losses.append(float(loss.mean().item()))
    assert len(losses) == 32
    assert abs(losses[0] - np.log(10)) < 0.05
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.15, np.round(losses, 3)


def test_get_constant_as_the_model_construction_chapter_uses_it():
    """d2l's FancyMLP: a constant random weight from params.get_constant, used with nd.dot in forward."""
    from dnnbind import gluon, nd
    import numpy as np

    class Fancy(gluon.nn.Block):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.rand_weight = self.params.get_constant("rand_weight", nd.random.uniform(shape=(4, 4)))
            self.dense = gluon.nn.Dense(4, activation="relu")

        def forward(self, x):
            return nd.relu(nd.dot(self.dense(x), self.rand_weight.data()) + 1)

    net = Fancy()
    net.initialize()
    x = nd.random.uniform(shape=(2, 4))
    y = net(x)
    assert y.shape == (2, 4) and net.rand_weight.grad_req == "null"
    w = net.rand_weight.data().numpy()
    d = net.dense(x).numpy()
    np.testing.assert_allclose(y.numpy(), np.maximum(d @ w + 1, 0), rtol=1e-5)
    assert net.params.get_constant("rand_weight") is net.rand_weight
