"""Gradient buckets (gluon/_grad_buckets.py): a launched Trainer sums its flat gradient across processes bucket by
bucket while the backward runs, and autograd's hook that says when a leaf's gradient is final.

On the cpu (CI): this process is made rank 0 of a world of 2 (as in test_trainer_distributed.py) and the NCCL
communicator is a fake whose all-reduce adds "rank 1"'s gradient at the same offsets of the flat buffer, so a
bucketed Trainer and one that sums the whole buffer once in step() (``bucket_bytes`` 0) must end with the same
weights. The cpu has no streams, so buckets are off there unless a test turns them on (``bucket_bytes`` replaced):
the bookkeeping (which ranges, in which order, when, how often) is what these tests check. On two GPUs (marker
``gpu``): two launched processes train with small buckets and with none, and must agree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, distributed, gluon, nd
from dnnbind._lib import hooks
from dnnbind.gluon import _grad_buckets, grad_reduce, nn
from dnnbind.gluon._grad_buckets import GradBuckets, bucket_bytes, partition
from tests._helpers import assert_close

ROOT = Path(__file__).resolve().parents[1]
CPU = mx.cpu()  # explicit: on a GPU machine nd.array defaults to the GPU
RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- autograd.register_grad_ready --------------------------------------------------------------------------------
class Listener:
    def __init__(self, names: dict) -> None:
        self.names, self.events = names, []

    def grad_ready(self, x) -> None:
        self.events.append((self.names[id(x)], x.grad.numpy().copy()))  # the gradient as written by now

    def backward_done(self) -> None:
        self.events.append(("done", None))


def _leaves(*shapes):
    out = []
    for s in shapes:
        x = nd.array(_rand(*s), ctx=CPU)
        x.attach_grad()
        out.append(x)
    return out


def test_a_listener_hears_each_leaf_once_when_its_last_user_has_run_with_its_final_gradient():
    a, b, c = _leaves((3,), (3,), (3,))
    listener = Listener({id(a): "a", id(b): "b", id(c): "c"})
    for x in (a, b, c):
        autograd.register_grad_ready(x, listener)
    try:
        with autograd.record():
            z = a * b  # b is used twice: final only after this node's backward, the last to run
            w = z * b * c
            loss = w.sum()
        loss.backward()
        av, bv, cv = a.numpy(), b.numpy(), c.numpy()
        names = [n for n, _ in listener.events]
        assert names.count("a") == names.count("b") == names.count("c") == 1 and names[-1] == "done"
        assert names.index("c") < names.index("a")  # c's only user runs before a's
        got = dict(listener.events[:-1])
        assert_close(got["a"], bv * bv * cv, 1e-6, 1e-6, "a.grad when a was final")
        assert_close(got["b"], 2 * av * bv * cv, 1e-6, 1e-6, "b.grad when b was final")
        assert_close(got["c"], av * bv * bv, 1e-6, 1e-6, "c.grad when c was final")
        assert all(autograd.is_fresh(x) for x in (a, b, c))
    finally:
        for x in (a, b, c):
            autograd.unregister_grad_ready(x)


def test_a_leaf_is_heard_before_the_backward_of_earlier_layers_runs():
    """What overlap needs: p2 (used only by the later node) is reported before the earlier node's backward."""
    p1, p2, x = _leaves((3,), (3,), (3,))
    listener = Listener({id(p1): "p1", id(p2): "p2"})
    autograd.register_grad_ready(p1, listener)
    autograd.register_grad_ready(p2, listener)

    def node(name, a, b):
        out = nd.array(a.numpy() * b.numpy(), ctx=CPU)

        def backward(g):
            listener.events.append((f"{name} backward", None))
            return g * b, g * a
        return autograd.record_op(name, out, (a, b), backward)
    try:
        with autograd.record():
            h = node("layer1", x, p1)
            loss = node("layer2", h, p2).sum()
        loss.backward()
        assert [n for n, _ in listener.events] == ["layer2 backward", "p2", "layer1 backward", "p1", "done"]
    finally:
        autograd.unregister_grad_ready(p1)
        autograd.unregister_grad_ready(p2)


def test_autograd_grad_a_leaf_off_the_graph_and_an_unregistered_leaf_are_not_heard():
    a, b, c = _leaves((2,), (2,), (2,))
    listener = Listener({id(a): "a", id(b): "b", id(c): "c"})
    for x in (a, b, c):
        autograd.register_grad_ready(x, listener)
    autograd.unregister_grad_ready(c)
    try:
        with autograd.record():
            loss = (a * 2).sum()
        autograd.grad(loss, [a])  # returns gradients, writes no .grad: nothing final to report
        assert listener.events == []
        with autograd.record():
            loss = (a * c).sum()  # b is not in this graph; c no longer listened to
        loss.backward()
        assert [n for n, _ in listener.events] == ["a", "done"]
        listener.events.clear()
        a.backward()  # a head that is itself a leaf
        assert [n for n, _ in listener.events] == ["a", "done"]
    finally:
        for x in (a, b):
            autograd.unregister_grad_ready(x)


def test_a_node_that_writes_its_leaves_gradients_itself_reports_them_once_after_it_ran():
    """What a hybridized Block's node does: its backward replays a private backward (nested: the listener must
    not hear it), writes the Parameters' .grad itself and returns None for them."""
    p, x = _leaves((3,), (3,))
    listener = Listener({id(p): "p", id(x): "x"})
    autograd.register_grad_ready(p, listener)
    autograd.register_grad_ready(x, listener)
    try:
        with autograd.record():
            inner = (p * 3).sum()  # the "recorded" private tape

        def backward(g):
            autograd.backward(inner)  # nested: writes p.grad = 3
            autograd.mark_fresh(p)
            return g * 1.0, None
        with autograd.record():
            out = autograd.record_op("fused", nd.array(x.numpy(), ctx=CPU), (x, p), backward)
            loss = out.sum()
        loss.backward()
        assert [n for n, _ in listener.events] in (["x", "p", "done"], ["p", "x", "done"])
        assert_close(dict(listener.events[:-1])["p"], np.full(3, 3.0), 0, 0, "p.grad written by the node")
    finally:
        autograd.unregister_grad_ready(p)
        autograd.unregister_grad_ready(x)


def test_a_node_that_says_a_leaf_is_final_midway_is_heard_then_and_only_once():
    """What a replayed backward that pauses does (hybrid._backward_pauses): it asks which of its leaves it may
    report itself (the ones it alone writes, straight into .grad), reports one midway, and the pass reports the
    rest after the node; nobody is heard twice. A leaf another node also uses is not the node's to report."""
    p, q, x = _leaves((3,), (3,), (3,))
    listener = Listener({id(p): "p", id(q): "q", id(x): "x"})
    for leaf in (p, q, x):
        autograd.register_grad_ready(leaf, listener)
    try:
        with autograd.record():
            inner = (p * 3).sum()  # the "recorded" private tape: p's gradient is 3
        midway = []

        def backward(g):
            mine = autograd.ready_listeners([p, q])
            assert mine == [listener, None], mine  # q is also used outside this node
            autograd.backward(inner)  # nested: writes p.grad
            autograd.ready_now(p)
            autograd.ready_now(q)  # not this node's to report: ignored
            midway.append([n for n, _ in listener.events])
            autograd.mark_fresh(p)
            return g * 1.0, None, nd.ones((3,), ctx=CPU)
        with autograd.record():
            out = autograd.record_op("fused", nd.array(x.numpy(), ctx=CPU), (x, p, q), backward)
            loss = out.sum() + (q * 2).sum()
        assert autograd.ready_listeners([p]) == [None]  # outside a backward: nothing to report
        loss.backward()
        names = [n for n, _ in listener.events]
        assert midway == [["p"]], midway
        assert sorted(names[:-1]) == ["p", "q", "x"] and names[-1] == "done", names
        events = dict(listener.events[:-1])
        assert_close(events["p"], np.full(3, 3.0), 0, 0, "p.grad reported midway")
        assert_close(events["q"], np.full(3, 3.0), 0, 0, "q.grad: the node's 1 and the other node's 2")
    finally:
        for leaf in (p, q, x):
            autograd.unregister_grad_ready(leaf)


# -- partition -----------------------------------------------------------------------------------------------------
def _check_tiling(buckets, spans, total):
    assert buckets[0][0] == 0 and buckets[-1][1] == total
    for (_, e0, _), (s1, _, _) in zip(buckets, buckets[1:]):
        assert e0 == s1, "a gap or an overlap between two buckets"
    where = {i: k for k, (_, _, members) in enumerate(buckets) for i in members}
    assert sorted(where) == sorted(i for _, _, i, _ in spans), "every Parameter in exactly one bucket"
    for off, n, i, _ in spans:
        s, e, _ = buckets[where[i]]
        assert s <= off and off + n <= e


@pytest.mark.parametrize("cap", [1, 64, 100, 300, 10**9])
def test_partition_tiles_the_flat_buffer_and_cuts_at_kinds_and_the_cap(cap):
    rng = np.random.default_rng(cap)
    spans, off = [], 0
    for i in range(40):
        n = int(rng.integers(1, 200))
        spans.append((off, n, i, i // 10))  # four kinds (groups) of ten
        off = (off + n + 63) // 64 * 64
    total = off
    buckets = partition(spans, total, cap)
    _check_tiling(buckets, spans, total)
    kind = {i: k for _, _, i, k in spans}
    for s, e, members in buckets:
        assert len({kind[i] for i in members}) == 1, "a bucket mixes kinds"
        if len(members) > 1:
            assert e - s <= cap or (s == 0 and e - [o for o, _, i, _ in spans if i == members[0]][0] <= cap)
    if cap >= total:
        assert len(buckets) == 4


# -- a launched Trainer with buckets, on the cpu --------------------------------------------------------------------
@pytest.fixture
def world(monkeypatch):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29557"}.items():
        monkeypatch.setenv(k, v)
    distributed.init(barrier_on_init=False)
    yield
    distributed.shutdown()


def _address(x) -> int:
    return x._data.__array_interface__["data"][0] if not x.on_gpu else x.ptr


class SlicedWorld:
    """Rank 0's communicator of a world of 2 whose all-reduce adds "rank 1"'s gradient at the offsets of the
    array in the Trainer's flat buffer (``flat``): rank 1's whole flat gradient of round ``round``."""

    def __init__(self, device) -> None:
        self.device, self.flat, self.round, self.calls = device, None, 0, []

    def all_reduce(self, x, out=None, op="sum"):
        """On a GPU it runs where NCCL would, on the current stream (the communication stream): x.numpy() waits for
        that stream only, so it reads the backward's gradients only if the stream waited for them."""
        assert op == "sum" and out is x, "the Trainer reduces in place"
        start = (_address(x) - _address(self.flat)) // x.dtype.itemsize
        assert 0 <= start and start + x.size <= self.flat.size
        self.calls.append((start, start + x.size))
        other = np.random.default_rng(1000 + self.round).standard_normal(self.flat.size).astype(np.float32)
        x.copy_(x.numpy() + other[start:start + x.size])
        return x

    def broadcast(self, x, root=0, out=None):
        return x


@pytest.fixture
def fake(monkeypatch, world):
    """Launched world of 2 with SlicedWorld communicators; ``fake.cap(bytes)`` sets the bucket size the next
    Trainer gets (0: none); returns the communicators made, in order."""
    made: list = []
    cap = [0]

    def make(device):
        made.append(SlicedWorld(device))
        return made[-1]
    monkeypatch.setattr(grad_reduce, "world_communicator", make)
    monkeypatch.setattr(_grad_buckets, "bucket_bytes", lambda device: cap[0])

    class Made(list):
        def trainer(self, net, nbytes, optimizer="sgd", params=None, **kw):
            cap[0] = nbytes
            t = gluon.Trainer(net.collect_params(), optimizer, params or {"learning_rate": 0.1}, **kw)
            made[-1].flat = t._flat_grad
            return t, made[-1]
    return Made()


class Mlp(gluon.Block):
    """d0 -> d1 -> d2, and ``aux`` (from the input, added before d2) when ``use_aux``."""

    def __init__(self, dtype="float32") -> None:
        super().__init__()
        self.d0 = nn.Dense(8, in_units=4, activation="relu")
        self.d1 = nn.Dense(8, in_units=8)
        self.aux = nn.Dense(8, in_units=4)
        self.d2 = nn.Dense(3, in_units=8)
        self.use_aux = True

    def forward(self, x):
        h = self.d1(self.d0(x))
        if self.use_aux:
            h = h + self.aux(x)
        return self.d2(h.astype(self.d2.weight.dtype))  # a float32 d2 after float16 layers (float32_tail)


def _pair(dtype="float32", float32_tail=False, ctx=CPU):
    """Two identical networks (values copied by path)."""
    nets = []
    for _ in range(2):
        net = Mlp()
        net.initialize(ctx=ctx)
        if dtype != "float32":
            net.cast(dtype)
            if float32_tail:
                net.d2.cast("float32")
        nets.append(net)
    for (_, p0), (_, p1) in zip(sorted(nets[0]._collect_params_with_prefix().items()),
                                sorted(nets[1]._collect_params_with_prefix().items())):
        p1.set_data(p0.data().copy())
    return nets


def _backward(net, rng_seed, batch=5):
    rng = np.random.default_rng(rng_seed)
    dtype, ctx = net.d0.weight.dtype, net.d0.weight.data().device
    x = nd.array(rng.standard_normal((batch, 4)), ctx=ctx, dtype=dtype)
    t = nd.array(rng.standard_normal((batch, 3)), ctx=ctx)
    with autograd.record():
        out = net(x)
        loss = gluon.loss.L2Loss()(out.astype("float32") if out.dtype != np.float32 else out, t)
    loss.backward()


def _same_weights(a, b, what, rtol=1e-6, atol=1e-7):
    pa, pb = a._collect_params_with_prefix(), b._collect_params_with_prefix()
    for k in pa:
        assert_close(pa[k].data().astype("float32"), pb[k].data().astype("float32"), rtol, atol, f"{k} {what}")


def _ranges(buckets):
    return [(b.start, b.end) for b in buckets.buckets]


# Mlp's flat layout, float32: d0.weight 32 @0, d0.bias 8 @64, d1.weight 64 @128, d1.bias 8 @192, aux.weight 32 @256,
# aux.bias 8 @320, d2.weight 24 @384, d2.bias 3 @448; total 512. With 128-element (512-byte) buckets: [384, 512)
# d2, [256, 384) aux, [128, 256) d1, [0, 128) d0, launched in that order (last registered first).
CAP = 128 * 4


def test_buckets_tile_the_flat_gradient_in_the_order_backward_makes_them_ready(fake):
    net, _ = _pair()
    trainer, comm = fake.trainer(net, CAP)
    b = trainer._buckets
    assert isinstance(b, GradBuckets)
    assert _ranges(b) == [(384, 512), (256, 384), (128, 256), (0, 128)]
    names = [trainer._names[i] for bk in b.buckets for i in bk.members]
    assert names == ["d2.weight", "d2.bias", "aux.weight", "aux.bias", "d1.weight", "d1.bias", "d0.weight",
                     "d0.bias"]
    _backward(net, 0)
    assert comm.calls == _ranges(b), "each bucket summed during the backward, in order"
    assert b.early_launches == 4
    trainer.step(10)
    assert comm.calls == _ranges(b), "step() sums nothing more"


def test_bucketed_steps_equal_the_one_shot_sum(fake):
    net, twin = _pair()
    trainer, comm = fake.trainer(net, CAP, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    t2, comm2 = fake.trainer(twin, 0, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    assert t2._buckets is None
    for step in range(3):
        comm.round = comm2.round = step
        for n, t in ((net, trainer), (twin, t2)):
            _backward(n, step)
            t.step(10)
        assert comm2.calls[-1] == (0, 512) and len(comm2.calls) == step + 1  # one whole all-reduce per step
        assert sorted(comm.calls[4 * step:]) == sorted(_ranges(trainer._buckets)), "each bucket once per step"
        _same_weights(net, twin, f"after step {step}")


def test_a_parameter_without_gradient_holds_its_bucket_and_the_later_ones_back_to_step(fake):
    net, twin = _pair()
    trainer, comm = fake.trainer(net, CAP)
    t2, comm2 = fake.trainer(twin, 0)
    net.use_aux = twin.use_aux = False
    for n, t in ((net, trainer), (twin, t2)):
        _backward(n, 1)
    assert comm.calls == [(384, 512)], "aux's bucket is next in order: it and d1, d0 wait for step()"
    with pytest.raises(gluon.trainer.StaleGradientError):
        trainer.step(10)
    for t in (trainer, t2):
        t.step(10, ignore_stale_grad=True)
    assert comm.calls == [(384, 512), (256, 384), (128, 256), (0, 128)], "the rest in step(), in the same order"
    _same_weights(net, twin, "after a step without aux")
    net.use_aux = twin.use_aux = True
    comm.round = comm2.round = 1
    for n, t in ((net, trainer), (twin, t2)):
        _backward(n, 2)
        t.step(10)
    assert len(comm.calls) == 8
    _same_weights(net, twin, "after the next step")


@pytest.mark.parametrize("float32_tail", [False, True])
def test_float16_gradients_are_cast_and_summed_bucket_by_bucket(fake, float32_tail):
    net, twin = _pair("float16", float32_tail)
    trainer, comm = fake.trainer(net, CAP)
    t2, comm2 = fake.trainer(twin, 0)
    h = trainer._half_end
    assert h == (384 if float32_tail else 512)
    assert all(bk.half_grad is not None for bk in trainer._buckets.buckets if bk.end <= h)
    for step in range(2):
        comm.round = comm2.round = step
        _backward(net, step)
        half = trainer._half_grad.numpy().astype(np.float32)
        summed = trainer._flat_grad.numpy()
        other = np.random.default_rng(1000 + step).standard_normal(512).astype(np.float32)
        assert np.array_equal(summed[:h], half + other[:h]), "each float16 bucket cast, then summed"
        trainer.step(10)
        _backward(twin, step)
        t2.step(10)
        _same_weights(net, twin, f"float16, after step {step}", 1e-3, 1e-3)


def test_grad_req_add_gradients_accumulate_and_are_summed_in_step(fake):
    net, twin = _pair()
    for n in (net, twin):
        n.collect_params().setattr("grad_req", "add")
    trainer, comm = fake.trainer(net, CAP)
    t2, comm2 = fake.trainer(twin, 0)
    for step in range(2):
        comm.round = comm2.round = step
        for n, t in ((net, trainer), (twin, t2)):
            t.zero_grad()
            _backward(n, 3 + step)
            _backward(n, 4 + step)  # adds to the first: nothing may be summed before the last
        assert len(comm.calls) == 4 * step, "no bucket launched during a backward"
        for t in (trainer, t2):
            t.step(20)
        assert comm.calls[4 * step:] == _ranges(trainer._buckets), "each bucket once, in order, in step()"
        _same_weights(net, twin, f"with grad_req 'add', step {step}")


def test_a_grad_req_add_bucket_comes_last_and_does_not_hold_the_others_back(fake):
    net, twin = _pair()
    for n in (net, twin):
        n.d1.collect_params().setattr("grad_req", "add")
    trainer, comm = fake.trainer(net, CAP)
    t2, _ = fake.trainer(twin, 0)
    assert _ranges(trainer._buckets) == [(384, 512), (256, 384), (0, 128), (128, 256)]
    for n, t in ((net, trainer), (twin, t2)):
        t.zero_grad()
        _backward(n, 3)
    assert comm.calls == [(384, 512), (256, 384), (0, 128)]
    for t in (trainer, t2):
        t.step(10)
    assert comm.calls == _ranges(trainer._buckets)
    _same_weights(net, twin, "with d1's grad_req 'add'")


@pytest.mark.parametrize("partial", [False, True])
def test_a_second_backward_before_step_sums_what_it_rewrote_again(fake, partial):
    """Two backward() calls with grad_req 'write' before one step: the update must see the sum of the latest
    gradients, as with one all-reduce in step(); the first backward already summed every bucket."""
    net, twin = _pair()
    trainer, comm = fake.trainer(net, 10**6)  # one bucket: the second backward rewrites part of it (partial)
    t2, _ = fake.trainer(twin, 0)
    assert _ranges(trainer._buckets) == [(0, 512)]
    for n, t in ((net, trainer), (twin, t2)):
        _backward(n, 5)
        n.use_aux = not partial
        _backward(n, 6)
        t.step(10)
    if partial:  # d0, d1, d2 rewritten: summed again one by one; aux kept its first sum
        assert comm.calls == [(0, 512), (0, 32), (64, 72), (128, 192), (192, 200), (384, 408), (448, 451)]
    else:
        assert comm.calls == [(0, 512), (0, 512)]
    _same_weights(net, twin, "after two backward passes and one step")


def test_allreduce_grads_then_update_and_a_step_without_backward(fake):
    net, twin = _pair()
    trainer, comm = fake.trainer(net, CAP)
    t2, _ = fake.trainer(twin, 0)
    for n, t in ((net, trainer), (twin, t2)):
        _backward(n, 7)
        t.allreduce_grads()
        t.update(10)
    assert len(comm.calls) == 4
    for t in (trainer, t2):  # no backward since: every gradient stale, every bucket still summed in step()
        t.step(10, ignore_stale_grad=True)
    assert sorted(comm.calls[4:]) == sorted(_ranges(trainer._buckets))
    _same_weights(net, twin, "after allreduce_grads/update")


def test_packing_again_after_a_backward_finishes_its_sum_once(fake):
    net, twin = _pair()
    trainer, comm = fake.trainer(net, CAP)
    t2, _ = fake.trainer(twin, 0)
    net.use_aux = twin.use_aux = False
    for n in (net, twin):
        _backward(n, 8)
    assert comm.calls == [(384, 512)]
    old = trainer._buckets
    trainer._pack()  # what a Parameter moving between backward and step makes step() do
    assert comm.calls == [(384, 512), (256, 384), (128, 256), (0, 128)] and trainer._buckets is not old
    assert not old._leaves, "the old buckets stopped listening"
    for t in (trainer, t2):
        t.step(10, ignore_stale_grad=True)
    assert len(comm.calls) == 4
    _same_weights(net, twin, "after packing again mid-step")


def test_while_a_step_is_recorded_step_sums_the_whole_buffer_once(fake, monkeypatch):
    net, _ = _pair()
    trainer, comm = fake.trainer(net, CAP)
    monkeypatch.setattr(hooks, "RECORDING", [object()])  # what _grad_buckets reads: a step being recorded
    _backward(net, 9)
    assert comm.calls == []
    trainer.step(10)
    assert comm.calls == [(0, 512)]


def test_no_buckets_on_the_cpu_in_a_world_of_one_or_when_set_to_zero(fake, monkeypatch):
    class Gpu:
        kind = "gpu"
    monkeypatch.undo()  # the real bucket_bytes (and no world)
    assert bucket_bytes(CPU) == 0
    monkeypatch.delenv("DNNBIND_BUCKET_MB", raising=False)
    assert bucket_bytes(Gpu()) == 25 * 2**20
    monkeypatch.setenv("DNNBIND_BUCKET_MB", "0")
    assert bucket_bytes(Gpu()) == 0
    monkeypatch.setenv("DNNBIND_BUCKET_MB", "0.5")
    assert bucket_bytes(Gpu()) == 2**19
    for bad in ("-1", "x", "nan", "inf"):
        monkeypatch.setenv("DNNBIND_BUCKET_MB", bad)
        with pytest.raises(ValueError, match="DNNBIND_BUCKET_MB"):
            bucket_bytes(Gpu())
    net, _ = _pair()
    trainer = gluon.Trainer(net.collect_params(), "sgd", kvstore=None)
    assert trainer._buckets is None


def test_a_world_of_one_makes_no_buckets(monkeypatch):
    monkeypatch.setattr(_grad_buckets, "bucket_bytes", lambda device: CAP)
    net, _ = _pair()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    assert trainer._buckets is None
    _backward(net, 0)
    trainer.step(5)


def test_mxnets_trainer_signature_is_unchanged():
    import inspect
    assert list(inspect.signature(gluon.Trainer).parameters) == [
        "params", "optimizer", "optimizer_params", "kvstore", "compression_params", "update_on_kvstore"]


# -- one GPU, a fake second rank ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_on_a_gpu_buckets_are_summed_on_the_communication_stream_after_their_gradients(fake, dtype):
    from dnnbind._lib import cudart
    from dnnbind.runtime.stream import current_stream
    dev = mx.gpu(0)
    old = mx.set_math_mode("fp32")
    try:
        net, twin = _pair(dtype, ctx=dev)
        trainer, comm = fake.trainer(net, CAP)
        t2, comm2 = fake.trainer(twin, 0)
        for step in range(3):
            comm.round = comm2.round = step
            for n, t in ((net, trainer), (twin, t2)):
                _backward(n, step)
                t.step(10)
            _same_weights(net, twin, f"{dtype} on {dev}, after step {step}", *((1e-3, 1e-3) if dtype == "float16"
                                                                             else (1e-6, 1e-7)))
        assert comm.calls[:4] == _ranges(trainer._buckets) and trainer._buckets.early_launches == 12
        if mx.eager_replay_enabled():  # step 3 replayed the Block's backward, pausing after each bucket's gradients
            plans = [sig.pauses for sig in net.__dict__["_auto"]._sigs.values() if sig.pauses]
            assert plans and len(plans[0][1]) >= 3, plans  # after d2, aux and d1 (d0 is written last)
        stream = current_stream(dev)  # inside a CUDA-graph capture the buckets stay off
        cudart.call("cudaStreamBeginCapture", stream.handle, cudart.rt().cudaStreamCaptureMode(1))
        try:
            inside = trainer._buckets._usable()
        finally:
            cudart.call("cudaGraphDestroy", cudart.call("cudaStreamEndCapture", stream.handle))
        assert not inside and trainer._buckets._usable()
    finally:
        mx.set_math_mode(old)


# -- two GPUs, two launched processes -------------------------------------------------------------------------------
# body: Dense(64) relu, Dense(64) relu, Dense(4) from 10 inputs; aux: Dense(4) from the input, added on even steps
SHAPES = [(64, 10), (64,), (64, 64), (64,), (4, 64), (4,), (4, 10), (4,)]
MODES = ("float32", "float16", "hybrid", "add", "conv")

WORKER = textwrap.dedent('''
    import os
    import sys
    import numpy as np
    import dnnbind as mx
    from dnnbind import autograd, distributed, gluon, nd
    from dnnbind.gluon import nn

    distributed.init()
    r, ws = distributed.rank(), distributed.world_size()
    dev = mx.gpu(distributed.local_rank())
    mx.set_math_mode("fp32")
    data = np.load(sys.argv[1])


    def run(mode, bucket_mb):
        """Train 6 steps; the weights (float32, in Parameter order) and the buckets launched during backward."""
        os.environ["DNNBIND_BUCKET_MB"] = bucket_mb  # read when the Trainer packs
        if mode == "conv":
            return run_conv()
        net = nn.HybridSequential()
        net.add(nn.Dense(64, in_units=10, activation="relu"), nn.Dense(64, in_units=64, activation="relu"),
                nn.Dense(4, in_units=64))
        aux = nn.Dense(4, in_units=10)  # odd steps leave its bucket (and the later ones) to step()
        net.initialize(ctx=dev)
        aux.initialize(ctx=dev)
        params = list(net.collect_params().values()) + list(aux.collect_params().values())
        for i, p in enumerate(params):  # rank r starts off by r: the Trainer broadcasts rank 0's
            p.set_data(nd.array(data[f"p:{i}"] + r, ctx=dev))
        if mode == "hybrid":
            net.hybridize()
        dtype = "float16" if mode == "float16" else "float32"
        if mode == "float16":
            net.cast("float16")
            aux.cast("float16")
        if mode == "add":
            for p in params:
                p.grad_req = "add"
        trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        loss_fn = gluon.loss.L2Loss()
        for step, (x, y) in enumerate(zip(data["x"], data["y"])):
            n = len(x) // ws
            xs = nd.array(x[r * n:(r + 1) * n], ctx=dev, dtype=dtype)
            ys = nd.array(y[r * n:(r + 1) * n], ctx=dev)
            if mode == "add":
                trainer.zero_grad()
            with autograd.record():
                out = net(xs)
                if step % 2 == 0:
                    out = out + aux(xs)
                loss = loss_fn(out.astype("float32"), ys)
            loss.backward()
            trainer.step(n * ws, ignore_stale_grad=True)
        early = trainer._buckets.early_launches if trainer._buckets is not None else -1
        # the body's recordings (hybridize(), or eager replay's) whose replayed backward paused for a bucket
        cache = net.__dict__.get("_cached") or net.__dict__.get("_auto")
        paused = 0 if cache is None else sum(bool(sig.pauses and sig.pauses[1]) for sig in cache._sigs.values())
        return [p.data().astype("float32").numpy() for p in params], early, paused


    def run_conv():
        """A conv net with BatchNorm, eager (replayed from step 3): its convolutions' gradients come from cuDNN
        backend plans, whose pointers only their variant packs know. Rank 0's start is broadcast."""
        nd.random.seed(5)
        net = nn.HybridSequential()
        net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.Conv2D(16, 3, strides=2),
                nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Dense(4))
        net.initialize(mx.init.Xavier(), ctx=dev)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for step in range(6):
            rng = np.random.default_rng(100 + step)  # the same global batch on both ranks: each takes its half
            x, y = rng.standard_normal((16, 3, 12, 12)).astype("f"), rng.integers(0, 4, 16).astype("f")
            n = len(x) // ws
            with autograd.record():
                loss = loss_fn(net(nd.array(x[r * n:(r + 1) * n], ctx=dev)), nd.array(y[r * n:(r + 1) * n], ctx=dev))
            loss.backward()
            trainer.step(n * ws)
        early = trainer._buckets.early_launches if trainer._buckets is not None else -1
        cache = net.__dict__.get("_auto")
        paused = 0 if cache is None else sum(bool(sig.pauses and sig.pauses[1]) for sig in cache._sigs.values())
        return [p.data().astype("float32").numpy() for p in net.collect_params().values()], early, paused


    out = {}
    for mode in ("float32", "float16", "hybrid", "add", "conv"):
        ref, none, _ = run(mode, "0")  # one all-reduce of the whole flat gradient in each step()
        got, early, paused = run(mode, "0.004")  # ~1000 floats a bucket: 3 buckets over this model
        assert none == -1, none
        for i, (a, b) in enumerate(zip(ref, got)):
            out[f"{mode}:ref:{i}"], out[f"{mode}:got:{i}"] = a, b
        out[f"{mode}:early"], out[f"{mode}:paused"] = np.array(early), np.array(paused)
        out[f"{mode}:n"] = np.array(len(got))
    np.savez(sys.argv[2] + f"/rank{r}.npz", **out)
''')


@pytest.mark.gpu
def test_two_launched_processes_with_buckets_train_as_with_one_sum_per_step(tmp_path):
    """Per mode (float32, float16, a hybridized body, grad_req 'add', a conv net): 6 steps with 3 buckets and with one
    all-reduce per step must give the same weights, both ranks bitwise equal; buckets launched during the backward
    except for grad_req 'add', and from inside the body's replayed backward (hybridized, or eager replay's from
    the third step), which pauses after each bucket's gradients."""
    if mx.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {mx.num_gpus()}")
    steps, batch = 6, 32
    start = {f"p:{i}": _rand(*s) * 0.3 for i, s in enumerate(SHAPES)}
    np.savez(tmp_path / "data.npz", x=_rand(steps, batch, 10), y=_rand(steps, batch, 4), **start)
    (tmp_path / "worker.py").write_text(WORKER)
    proc = subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", "--master-port", "29563",
                           str(tmp_path / "worker.py"), str(tmp_path / "data.npz"), str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "rank0.npz") as r0, np.load(tmp_path / "rank1.npz") as r1:
        for mode in MODES:
            tol = {"float16": (2e-3, 2e-3), "conv": (1e-4, 1e-5)}.get(mode, (1e-5, 1e-6))
            for i in range(int(r0[f"{mode}:n"])):
                got, ref = f"{mode}:got:{i}", f"{mode}:ref:{i}"
                if mode != "conv":  # (conv: BatchNorm's running statistics are each rank's own)
                    assert np.array_equal(r0[got], r1[got]), f"{got}: the ranks differ"
                    assert np.abs(r0[got] - start[f"p:{i}"]).max() > 1e-4, f"{got} did not move"
                assert_close(r0[got], r0[ref], *tol, f"{got}: buckets vs one all-reduce per step")
                assert_close(r1[got], r1[ref], *tol, f"{got}: buckets vs one all-reduce per step, rank 1")
            early = int(r0[f"{mode}:early"])
            paused = int(r0[f"{mode}:paused"])
            if mode == "add":
                assert early == 0, "grad_req 'add' buckets never launch during the backward"
                assert paused == 0, "grad_req 'add': no replayed backward pauses for a bucket"
            else:
                assert early > 0, f"{mode}: no bucket launched during the backward"
                if mode == "hybrid" or mx.eager_replay_enabled():  # the body's backward is a replay
                    assert paused > 0, f"{mode}: the replayed backward never paused to launch a bucket"
