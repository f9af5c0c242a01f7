"""``horovod.mxnet`` on dnnbind (dnnbind/horovod/mxnet.py), served by the MXNet alias when no real Horovod is
installed.

On the cpu (CI): the import hook (and that a real Horovod wins), one process (size 1: every collective gives a copy),
and a world of 2 as rank 0 or 1 with a fake NCCL communicator: what each call sends to NCCL and what it returns,
broadcast_parameters' order, DistributedTrainer's average against one process. On two GPUs (marker ``gpu``): two
processes launched with ``python -m dnnbind.launch`` run an MXNet+Horovod program: allreduce averages,
broadcast_parameters makes the ranks equal, DistributedTrainer keeps them equal and matches one GPU on the global
batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import dnnbind.horovod.mxnet as hvd
from dnnbind import DnnbindTypeError, DnnbindValueError, autograd, distributed, gluon, kvstore, nd
from dnnbind.features import UnsupportedFeature
from dnnbind.gluon import grad_reduce, nn
from dnnbind.mxnet import _finder
from tests._helpers import assert_close

ROOT = Path(__file__).resolve().parents[1]
CPU = dnnbind.cpu()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _forget_horovod() -> dict:
    saved = {n: m for n, m in sys.modules.items() if n == "horovod" or n.startswith("horovod.")}
    for n in saved:
        del sys.modules[n]
    return saved


# -- the import hook -----------------------------------------------------------------------------------------------

def test_the_alias_serves_horovod_mxnet_when_no_real_horovod_is_installed(alias):
    saved = _forget_horovod()
    try:
        import horovod.mxnet as h
        import horovod
        assert h is hvd and horovod is sys.modules["dnnbind.horovod"] and horovod.mxnet is hvd
        with pytest.raises(ModuleNotFoundError, match="horovod.torch"):
            import horovod.torch  # noqa: F401
    finally:
        _forget_horovod()
        sys.modules.update(saved)


def test_without_the_alias_there_is_no_horovod(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _finder.MXNetAliasFinder)])
    saved = _forget_horovod()
    try:
        with pytest.raises(ModuleNotFoundError):
            import horovod.mxnet  # noqa: F401
    finally:
        sys.modules.update(saved)


def test_uninstalling_the_alias_forgets_horovod(alias):
    saved = _forget_horovod()
    try:
        import horovod.mxnet  # noqa: F401
        dnnbind.mxnet.uninstall_mxnet_alias()
        assert "horovod" not in sys.modules and "horovod.mxnet" not in sys.modules
        with pytest.raises(ModuleNotFoundError):
            import horovod  # noqa: F401
    finally:
        sys.modules.update(saved)


def test_a_real_horovod_wins(alias, tmp_path, monkeypatch):
    pkg = tmp_path / "horovod"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    (pkg / "mxnet.py").write_text("REAL_MXNET = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = _forget_horovod()
    try:
        import horovod.mxnet as h
        assert getattr(h, "REAL_MXNET", False) and sys.modules["horovod"].REAL
    finally:
        _forget_horovod()
        sys.modules.update(saved)


def test_an_mxnet_horovod_program_runs_under_the_runner(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent('''
        import mxnet as mx
        import horovod.mxnet as hvd
        hvd.init()
        x = mx.nd.array([1.0, 2.0])
        y = hvd.allreduce(x, name="x")
        print(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), y.asnumpy().tolist(), y is x)
    '''))
    env = {k: v for k, v in _env().items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-m", "dnnbind.mxnet", str(script)], capture_output=True, text=True, env=env,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "0 1 0 1 [1.0, 2.0] False"


# -- one process -----------------------------------------------------------------------------------------------------

@pytest.fixture
def one(monkeypatch):
    """hvd.init() in a process that was not launched: a world of one."""
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    distributed.shutdown()
    hvd.init()
    yield
    hvd.shutdown()
    distributed.shutdown()


def test_before_init_horovod_says_so():
    distributed.shutdown()
    for f in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, lambda: hvd.allreduce(nd.ones((1,), ctx=CPU))):
        with pytest.raises(DnnbindValueError, match=r"^Horovod has not been initialized; use hvd\.init\(\)\.$") as err:
            f()
        assert isinstance(err.value, ValueError) and isinstance(err.value, dnnbind.mxnet.base.MXNetError)
    assert not hvd.is_initialized()


def test_one_process_is_rank_0_of_1(one):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == \
        (0, 1, 0, 1, 0, 1)
    assert hvd.nccl_built() and not hvd.mpi_enabled()


@pytest.mark.parametrize("kwargs", [{}, {"average": True}, {"average": False}, {"op": hvd.Sum},
                                    {"op": hvd.Average}, {"op": hvd.Max}])
def test_allreduce_of_one_process_is_a_copy(one, kwargs):
    x = nd.array([1.0, -2.0, 3.0], ctx=CPU)
    y = hvd.allreduce(x, name="x", **kwargs)
    assert y is not x and y.numpy().tolist() == [1.0, -2.0, 3.0]
    y[:] = 0
    assert x.numpy().tolist() == [1.0, -2.0, 3.0]
    assert hvd.allreduce_(x, **kwargs) is x and x.numpy().tolist() == [1.0, -2.0, 3.0]


def test_scale_factors_apply_in_one_process(one):
    x = nd.array([1.0, 2.0], ctx=CPU)
    assert hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.25).numpy().tolist() == [0.5, 1.0]
    assert [t.numpy().tolist() for t in hvd.grouped_allreduce([x, x * 2])] == [[1.0, 2.0], [2.0, 4.0]]


def test_broadcast_and_allgather_of_one_process(one):
    x = nd.array([[1.0, 2.0]], ctx=CPU)
    b = hvd.broadcast(x, root_rank=0)
    assert b is not x and b.numpy().tolist() == [[1.0, 2.0]]
    assert hvd.broadcast_(x, 0) is x
    g = hvd.allgather(x)
    assert g is not x and g.numpy().tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: hvd.allreduce([1.0]), DnnbindTypeError, r"^hvd\.allreduce: tensor must be an NDArray, got list"),
    (lambda: hvd.allreduce(nd.ones((1,), ctx=CPU), average=True, op=hvd.Sum), DnnbindValueError,
     r"The op parameter supersedes average\. Please provide only one of them\."),
    (lambda: hvd.allreduce(nd.ones((1,), ctx=CPU), op=hvd.Adasum), UnsupportedFeature, r"Adasum"),
    (lambda: hvd.allreduce(nd.ones((1,), ctx=CPU), op=17), DnnbindValueError, r"unknown op 17"),
    (lambda: hvd.broadcast(nd.ones((1,), ctx=CPU), root_rank=1), DnnbindValueError,
     r"^hvd\.broadcast: root_rank must be a rank in \[0, size\(\)=1\), got 1$"),
    (lambda: hvd.allgather(nd.ones((), ctx=CPU)), DnnbindValueError, r"at least one dimension"),
    (lambda: hvd.broadcast_parameters([nd.ones((1,), ctx=CPU)]), DnnbindValueError,
     r"^invalid params of type: <class 'list'>$"),
    (lambda: hvd.DistributedOptimizer("sgd"), DnnbindTypeError, r"DistributedOptimizer: expects an Optimizer"),
    (lambda: hvd.init(comm=[0, 1]), UnsupportedFeature, r"comm= and process_sets= are not supported"),
])
def test_errors_name_the_call(one, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# -- a world of 2, with a fake communicator -------------------------------------------------------------------------

class FakeComm:
    """This rank's communicator in a world of 2. The other rank holds ``other`` (a function of this rank's
    array), and rank 0's value for a broadcast to rank 1 is 42."""

    def __init__(self, rank: int, other):
        self.rank, self.other, self.calls = rank, other, []

    def all_reduce(self, x, out=None, op="sum"):
        assert out is x
        mine, theirs = x.numpy(), self.other(x.numpy())
        self.calls.append(("all_reduce", op, mine.tolist()))
        x.copy_({"sum": mine + theirs, "avg": (mine + theirs) / 2, "max": np.maximum(mine, theirs)}[op])
        return x

    def broadcast(self, x, root=0, out=None):
        assert out is x
        self.calls.append(("broadcast", root, x.numpy().tolist()))
        if root != self.rank:
            x.copy_(np.full(x.shape, 42.0, x.dtype))
        return x

    def all_gather(self, x, out=None):
        mine = x.numpy()
        theirs = np.array([3], mine.dtype) if mine.dtype == np.int64 else np.full((3,) + mine.shape[1:], 7.0,
                                                                                 mine.dtype)
        if mine.dtype != np.int64 and mine.shape[0] > 3:  # padded to this rank's count
            theirs = np.concatenate([theirs, np.zeros((mine.shape[0] - 3,) + mine.shape[1:], mine.dtype)])
        parts = [mine, theirs] if self.rank == 0 else [theirs, mine]
        return nd.array(np.concatenate(parts), ctx=CPU, dtype=mine.dtype)


@pytest.fixture
def world(monkeypatch):
    """This process as rank ``r`` of a launched world of 2, the world's communicator replaced by FakeComm."""
    made: list = []

    def enter(r: int = 0, other=lambda a: np.full(a.shape, 100.0, a.dtype)):
        for k, v in {"WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29558"}.items():
            monkeypatch.setenv(k, v)
        distributed.shutdown()
        distributed.init(barrier_on_init=False)
        hvd.init()  # already initialized: nothing more to do

        def make(device, what=""):
            if not made:
                made.append(FakeComm(r, other))
            return made[0]
        monkeypatch.setattr(kvstore, "world_communicator", make)
        monkeypatch.setattr(grad_reduce, "world_communicator", make)
        return made
    yield enter
    distributed.shutdown()


def test_a_world_of_two(world):
    world(1)
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == \
        (1, 2, 1, 2, 0, 1)


def test_allreduce_averages_by_default_and_keeps_its_input(world):
    made = world(0)
    x = nd.array([2.0, 4.0], ctx=CPU)
    assert hvd.allreduce(x).numpy().tolist() == [51.0, 52.0]
    assert hvd.allreduce(x, average=False).numpy().tolist() == [102.0, 104.0]
    assert hvd.allreduce(x, op=hvd.Max).numpy().tolist() == [100.0, 100.0]
    assert x.numpy().tolist() == [2.0, 4.0]
    assert [c[1] for c in made[0].calls] == ["avg", "sum", "max"]
    assert hvd.allreduce_(x, op=hvd.Sum, prescale_factor=0.5) is x and x.numpy().tolist() == [101.0, 102.0]
    assert made[0].calls[-1] == ("all_reduce", "sum", [1.0, 2.0])  # scaled before the sum


def test_broadcast_gives_the_roots_value(world):
    world(1)
    x = nd.array([1.0, 2.0], ctx=CPU)
    assert hvd.broadcast(x, root_rank=0).numpy().tolist() == [42.0, 42.0] and x.numpy().tolist() == [1.0, 2.0]
    assert hvd.broadcast(x, root_rank=1).numpy().tolist() == [1.0, 2.0]
    hvd.broadcast_(x, 0)
    assert x.numpy().tolist() == [42.0, 42.0]


@pytest.mark.parametrize("rows", [3, 1, 5])
def test_allgather_concatenates_in_rank_order_with_any_first_dimension(world, rows):
    world(1)  # rank 0 holds 3 rows of 7
    x = nd.array(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2), ctx=CPU)
    g = hvd.allgather(x).numpy()
    assert g.shape == (3 + rows, 2)
    assert np.array_equal(g[:3], np.full((3, 2), 7.0)) and np.array_equal(g[3:], x.numpy())


def _net(seed: int = 0):
    net = nn.Sequential()
    net.add(nn.Dense(5, activation="relu"), nn.Dense(3))
    net.initialize(ctx=CPU)
    net(nd.zeros((1, 4), ctx=CPU))
    for k, p in net._collect_params_with_prefix().items():
        rng = np.random.default_rng([seed, len(k), sum(map(ord, k))])
        p.set_data(nd.array(rng.standard_normal(p.shape).astype(np.float32), ctx=CPU))
    return net


def test_broadcast_parameters_goes_in_sorted_name_order(world):
    made = world(1)
    a, b = nd.ones((2,), ctx=CPU), nd.ones((3,), ctx=CPU) * 2
    hvd.broadcast_parameters({"zz": a, "aa": b}, root_rank=0)
    assert [c[2] for c in made[0].calls] == [[2.0] * 3, [1.0] * 2]  # "aa" first
    assert a.numpy().tolist() == [42.0] * 2 and b.numpy().tolist() == [42.0] * 3
    net = _net()
    hvd.broadcast_parameters(net.collect_params())
    for p in net.collect_params().values():
        assert np.all(p.data().numpy() == 42.0)


def test_broadcast_parameters_waits_for_deferred_initialization(world):
    made = world(1)
    net = nn.Dense(3)
    net.initialize(ctx=CPU)
    hvd.broadcast_parameters(net.collect_params())
    assert not made or not made[0].calls  # nothing to send yet: the shapes are unknown
    net(nd.ones((2, 4), ctx=CPU))
    assert np.all(net.weight.data().numpy() == 42.0) and np.all(net.bias.data().numpy() == 42.0)
    n = len(made[0].calls)
    net.weight.data()
    assert len(made[0].calls) == n  # once


def _train(trainer_of, steps: int = 3, batch: int = 8, seed: int = 0) -> dict:
    net = _net(seed)
    trainer = trainer_of(net.collect_params())
    rng = np.random.default_rng(9)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        x = nd.array(rng.standard_normal((batch, 4)).astype(np.float32), ctx=CPU)
        y = nd.array(rng.integers(0, 3, batch).astype(np.float32), ctx=CPU)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
    return {k: p.data().numpy() for k, p in net._collect_params_with_prefix().items()}


OPT = ("sgd", {"learning_rate": 0.1, "momentum": 0.9})


def test_distributed_trainer_averages_over_the_processes(world):
    made = world(0, other=lambda a: a)  # the other rank computed the same gradient: the average is this one's
    got = _train(lambda params: hvd.DistributedTrainer(params, *OPT))
    distributed.shutdown()
    want = _train(lambda params: gluon.Trainer(params, *OPT, kvstore=None))
    kinds = [c[0] for c in made[0].calls]
    assert kinds[0] == "broadcast" and kinds.count("all_reduce") >= 3  # rank 0's start, then a sum every step
    for k in want:
        assert_close(got[k], want[k], 1e-6, 1e-7, k)


def test_a_distributed_trainer_that_only_summed_would_differ(world):
    world(0, other=lambda a: a)
    summed = _train(lambda params: gluon.Trainer(params, *OPT, kvstore="dist_sync"))  # MXNet's dist: the sum
    distributed.shutdown()
    want = _train(lambda params: gluon.Trainer(params, *OPT, kvstore=None))
    assert any(not np.allclose(summed[k], want[k]) for k in want)


def test_distributed_trainer_of_one_process_is_a_plain_trainer(one):
    got = _train(lambda params: hvd.DistributedTrainer(params, *OPT, gradient_predivide_factor=2.0))
    want = _train(lambda params: gluon.Trainer(params, *OPT, kvstore=None))
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_distributed_trainer_unwraps_a_distributed_optimizer(one):
    net = _net()
    inner = dnnbind.gluon.optimizer.create("sgd", learning_rate=0.1)
    with pytest.warns(UserWarning, match="DistributedTrainer does not take DistributedOptimizer"):
        t = hvd.DistributedTrainer(net.collect_params(), hvd.DistributedOptimizer(inner))
    assert t.optimizer is inner


def test_distributed_optimizer_averages_each_gradient(world):
    made = world(0, other=lambda a: a)
    got = _train(lambda params: gluon.Trainer(params, hvd.DistributedOptimizer(
        dnnbind.gluon.optimizer.create(OPT[0], **OPT[1]), gradient_predivide_factor=2.0), kvstore=None))
    assert made[0].calls and all(c[:2] == ("all_reduce", "sum") for c in made[0].calls)
    assert len(made[0].calls) == 3 * 4  # one per Parameter per step
    distributed.shutdown()
    want = _train(lambda params: gluon.Trainer(params, *OPT, kvstore=None))
    for k in want:
        assert_close(got[k], want[k], 1e-6, 1e-7, k)


@pytest.mark.parametrize("kv", ["device", "dist_sync", "horovod"])
def test_a_trainer_leaves_the_cross_process_sum_to_a_distributed_optimizer(world, kv):
    """Whatever the Trainer's kvstore, a DistributedOptimizer's gradients are summed once (in its update)."""
    made = world(0, other=lambda a: a)
    got = _train(lambda params: gluon.Trainer(params, hvd.DistributedOptimizer(
        dnnbind.gluon.optimizer.create(OPT[0], **OPT[1])), kvstore=kv))
    assert len(made[0].calls) == 3 * 4 and all(c[:2] == ("all_reduce", "sum") for c in made[0].calls)
    distributed.shutdown()
    want = _train(lambda params: gluon.Trainer(params, *OPT, kvstore=None))
    for k in want:
        assert_close(got[k], want[k], 1e-6, 1e-7, k)


# -- GPUs ----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_one_process_on_a_gpu(one):
    dev = dnnbind.gpu(0)
    x = nd.array([1.0, 2.0], ctx=dev)
    y = hvd.allreduce(x)
    assert y.device == dev and y is not x and y.numpy().tolist() == [1.0, 2.0]
    assert hvd.broadcast(x, 0).numpy().tolist() == [1.0, 2.0]


WORKER = textwrap.dedent('''
    import json, sys
    import numpy as np
    import dnnbind
    dnnbind.install_mxnet_alias()
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    from mxnet.gluon import nn
    import horovod.mxnet as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    ctx = mx.gpu(hvd.local_rank())
    dnnbind.set_math_mode("fp32")
    res = {"rank": r, "size": n, "local_size": hvd.local_size()}
    x = nd.array([1.0, 2.0, 3.0], ctx=ctx) * (r + 1)
    res["allreduce"] = hvd.allreduce(x, name="x").asnumpy().tolist()
    res["allreduce_sum"] = hvd.allreduce(x, average=False).asnumpy().tolist()
    res["input_kept"] = x.asnumpy().tolist()
    res["broadcast_from_1"] = hvd.broadcast(x, root_rank=1).asnumpy().tolist()
    res["allgather"] = hvd.allgather(nd.ones((r + 1, 2), ctx=ctx) * r).asnumpy().tolist()
    data = np.load(sys.argv[1])
    net = nn.Sequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(4))
    net.initialize(ctx=ctx)
    net(nd.array(data["x"][0][:2], ctx=ctx))
    paths = net._collect_params_with_prefix()
    for k, p in paths.items():  # rank r starts off by r: broadcast_parameters must give rank 0's
        p.set_data(nd.array(data["p:" + k] + r, ctx=ctx))
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    res["broadcast_parameters_max_error"] = max(float(np.abs(p.data().asnumpy() - data["p:" + k]).max())
                                                for k, p in paths.items())
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for xb, yb in zip(data["x"], data["y"]):
        m = len(xb) // n
        with autograd.record():
            loss = loss_fn(net(nd.array(xb[r * m:(r + 1) * m], ctx=ctx)), nd.array(yb[r * m:(r + 1) * m], ctx=ctx))
        loss.backward()
        trainer.step(m)  # Horovod: this process's batch (the gradients are averaged over the processes)
    np.savez(sys.argv[2] + "/rank%d.npz" % r, **{k: p.data().asnumpy() for k, p in paths.items()})
    with open(sys.argv[2] + "/rank%d.json" % r, "w") as f:
        json.dump(res, f)
''')


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
def test_two_launched_processes_run_an_mxnet_horovod_program(tmp_path):
    if dnnbind.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {dnnbind.num_gpus()}")
    dev, steps, batch = dnnbind.gpu(0), 4, 32
    rng = np.random.default_rng(31)
    old = dnnbind.set_math_mode("fp32")
    try:
        xs = rng.standard_normal((steps, batch, 10)).astype(np.float32)
        ys = rng.integers(0, 4, (steps, batch)).astype(np.float32)
        net = nn.Sequential()
        net.add(nn.Dense(16, activation="relu"), nn.Dense(4))
        net.initialize(ctx=dev)
        net(nd.array(xs[0][:2], ctx=dev))
        paths = net._collect_params_with_prefix()  # by path: the names differ between processes
        start = {f"p:{k}": p.data().numpy() for k, p in paths.items()}
        np.savez(tmp_path / "data.npz", x=xs, y=ys, **start)
        (tmp_path / "worker.py").write_text(WORKER)
        proc = subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", "--master-port",
                               str(_free_port()), str(tmp_path / "worker.py"), str(tmp_path / "data.npz"),
                               str(tmp_path)], check=False, capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        for r in range(2):
            res = json.loads((tmp_path / f"rank{r}.json").read_text())
            assert (res["rank"], res["size"], res["local_size"]) == (r, 2, 2)
            assert res["allreduce"] == [1.5, 3.0, 4.5]  # the average of [1,2,3] * 1 and * 2
            assert res["allreduce_sum"] == [3.0, 6.0, 9.0]
            assert res["input_kept"] == [float(v * (r + 1)) for v in (1, 2, 3)]
            assert res["broadcast_from_1"] == [2.0, 4.0, 6.0]
            assert res["allgather"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]  # rank 0: 1 row, rank 1: 2 rows
            assert res["broadcast_parameters_max_error"] == 0.0, "rank 1 kept its own start"
        # One GPU, the whole batch, a plain Trainer: the reference of the average.
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for x, y in zip(xs, ys):
            with autograd.record():
                loss = loss_fn(net(nd.array(x, ctx=dev)), nd.array(y, ctx=dev))
            loss.backward()
            trainer.step(batch)
        with np.load(tmp_path / "rank0.npz") as r0, np.load(tmp_path / "rank1.npz") as r1:
            for k, p in paths.items():
                assert np.array_equal(r0[k], r1[k]), f"{k}: the ranks differ"
                assert np.abs(r0[k] - start[f"p:{k}"]).max() > 1e-4, f"{k} did not move"
                assert_close(r0[k], p.data(), 1e-4, 1e-6, f"{k}: 2 processes vs 1 on the whole batch")
    finally:
        dnnbind.set_math_mode(old)
