"""MXNet's KVStore (``mx.kv``, dnnbind/kvstore.py) against the real MXNet 1.9.1.

tests/fixtures/mxnet_kvstore/expected.json holds what MXNet 1.9.1 itself gave (make_fixtures.py there): the
scenarios of scenarios.py in one process, and a 2-worker 'dist_sync' job with MXNet's own ps-lite scheduler and
server (dist_worker.py). On the cpu (CI): the same scenarios through dnnbind's alias must give the same values and
raise where MXNet raises; the cross-process logic runs as rank 0 of a world of 2 with a fake NCCL communicator.
On two GPUs (marker ``gpu``): dist_worker.py itself, launched twice with ``python -m dnnbind.launch``, must give
MXNet's per-rank results.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import dnnbind.mxnet as dmx
from dnnbind import DnnbindTypeError, DnnbindValueError, autograd, distributed, gluon, kvstore, nd
from dnnbind.features import UnsupportedFeature
from dnnbind.gluon import nn

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "mxnet_kvstore"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CPU = dnnbind.cpu()

sys.path.insert(0, str(FIXTURES))
import scenarios  # noqa: E402  (the fixture's scenarios, shared with make_fixtures.py)

sys.path.remove(str(FIXTURES))


def _compare(path: str, expected, got, mismatches: list) -> None:
    """Walk MXNet's result and dnnbind's together; an error recorded by MXNet must be a DnnbindError here."""
    if isinstance(expected, dict) and set(expected) == {"error"}:
        if not (isinstance(got, dict) and set(got) == {"error"}):
            mismatches.append(f"{path}: MXNet raised {expected['error']}, dnnbind gave {got!r}")
        elif got["error"] not in ("DnnbindValueError", "DnnbindTypeError"):
            mismatches.append(f"{path}: dnnbind raised {got['error']}, not an MXNetError (DnnbindValueError/TypeError)")
    elif isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            mismatches.append(f"{path}: keys {sorted(expected)} vs {got!r}")
            return
        for k in expected:
            _compare(f"{path}.{k}", expected[k], got[k], mismatches)
    elif isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            mismatches.append(f"{path}: {expected!r} vs {got!r}")
            return
        for i, (e, g) in enumerate(zip(expected, got)):
            _compare(f"{path}[{i}]", e, g, mismatches)
    elif isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if not math.isclose(expected, got, rel_tol=1e-5, abs_tol=1e-6):
            mismatches.append(f"{path}: MXNet {expected!r}, dnnbind {got!r}")
    elif expected != got:
        mismatches.append(f"{path}: MXNet {expected!r}, dnnbind {got!r}")


@pytest.mark.parametrize("part", sorted(EXPECTED["single"]))
def test_the_scenarios_give_what_mxnet_gave(alias, tmp_path, part):
    fn = getattr(scenarios, part)
    got = fn(alias, str(tmp_path / "kv.states")) if part == "optimizers" else fn(alias)
    mismatches: list = []
    _compare(part, EXPECTED["single"][part], json.loads(json.dumps(got)), mismatches)
    assert not mismatches, "\n".join(mismatches[:20])


def test_the_comparison_can_fail():
    mismatches: list = []
    _compare("x", {"a": [1.0, 2.0], "e": {"error": "MXNetError"}}, {"a": [1.0, 2.5], "e": [0.0]}, mismatches)
    assert len(mismatches) == 2


# -- the alias ---------------------------------------------------------------------------------------------------

def test_mx_kv_is_dnnbinds_kvstore_through_the_alias(alias):
    import mxnet.kv
    import mxnet.kvstore
    from mxnet.kvstore import KVStore, create
    assert mxnet.kv is kvstore and mxnet.kvstore is kvstore and alias.kv is alias.kvstore is kvstore
    assert create is kvstore.create and isinstance(create("local"), KVStore) and alias.kv.KVStore is KVStore
    assert issubclass(KVStore, alias.kv.KVStoreBase)
    assert dmx.kv is kvstore  # without the import hook too


def test_the_parameter_server_is_an_unsupported_feature():
    with pytest.raises(UnsupportedFeature, match="KVStoreServer is not supported by dnnbind"):
        kvstore.KVStoreServer
    with pytest.raises(AttributeError) as err:
        kvstore.no_such_name
    assert not isinstance(err.value, NotImplementedError)


# -- errors: dnnbind's messages, caught as mx.base.MXNetError --------------------------------------------------------

def _kv(kind="local"):
    kv = kvstore.create(kind)
    kv.init(3, nd.ones((2, 3), ctx=CPU))
    return kv


@pytest.mark.parametrize("call, error, pattern", [
    (lambda kv: kv.pull(9, out=nd.zeros((2, 3), ctx=CPU)), DnnbindValueError,
     r"^KVStore\.pull: key 9 has not been inited"),
    (lambda kv: kv.push(9, nd.ones((2, 3), ctx=CPU)), DnnbindValueError, r"^KVStore\.push: key 9 has not been inited"),
    (lambda kv: kv.pushpull(9, nd.ones((2, 3), ctx=CPU)), DnnbindValueError, r"key 9 has not been inited"),
    (lambda kv: kv.init(3, nd.ones((2, 3), ctx=CPU)), DnnbindValueError,
     r"^KVStore\.init: duplicate init of key 3\. Please double check if you called kv\.init or kv\.broadcast"),
    (lambda kv: kv.pull(3, out=nd.zeros((4, 2), ctx=CPU)), DnnbindValueError,
     r"out has shape \(4, 2\), the stored value \(2, 3\): operands shape mismatch from\.shape = \[2,3\] "
     r"to\.shape=\[4,2\]"),
    (lambda kv: kv.push(3, [nd.ones((2, 3), ctx=CPU), nd.ones((4, 2), ctx=CPU)]), DnnbindValueError,
     r"^KVStore\.push: key 3: the value has shape \(4, 2\), the stored one \(2, 3\)"),
    (lambda kv: kv.pull(3), DnnbindTypeError, r"^KVStore\.pull: out is required"),
    (lambda kv: kv.init(3.5, nd.ones((2, 3), ctx=CPU)), DnnbindTypeError,
     r"unexpected type for keys: <class 'float'>"),
    (lambda kv: kv.init(11, np.ones((2, 3))), DnnbindTypeError,
     r"the value of key 11 must be an NDArray or a non-empty list of NDArrays \(one per device\), got ndarray"),
    (lambda kv: kv.init([12, 13], [nd.ones((2, 3), ctx=CPU)]), DnnbindValueError,
     r"2 keys need a list of 2 values .*got 1 values"),
    (lambda kv: kv.init([20, "21"], [nd.ones((2, 3), ctx=CPU)] * 2), DnnbindTypeError,
     r"inconsistent types of keys detected"),
    (lambda kv: kv.init("w", nd.ones((2, 3), ctx=CPU)), DnnbindTypeError,
     r"Mixed key types are not allowed: this store uses int keys, got the str key 'w'"),
    (lambda kv: kv.is_capable("x"), DnnbindValueError, r"^Unknown capability: x$"),
    (lambda kv: kv.save_optimizer_states("/nonexistent/x"), DnnbindValueError,
     r"^KVStore\.save_optimizer_states: Cannot save or load states: this store has no optimizer set"),
    (lambda kv: kv.set_optimizer("sgd"), DnnbindTypeError, r"set_optimizer: expects an Optimizer"),
])
def test_errors_name_the_api_and_are_mxnet_errors(call, error, pattern):
    with pytest.raises(error, match=pattern) as err:
        call(_kv())
    assert isinstance(err.value, dmx.base.MXNetError)


def test_a_str_store_names_the_missing_key_as_mxnet_does():
    kv = kvstore.create("local")
    kv.init("w", nd.ones((2,), ctx=CPU))
    with pytest.raises(DnnbindValueError, match=r"key zz doesn't exist\. Did you init\?"):
        kv.pull("zz", out=nd.zeros((2,), ctx=CPU))


@pytest.mark.parametrize("name, error, pattern", [
    (3, DnnbindTypeError, r"^name must be a string$"),  # MXNet's TypeError text
    ("dist_async", DnnbindValueError, r"asynchronous updates are not supported by dnnbind"),
    ("dist", DnnbindValueError, r"unknown KVStore type"),
    ("foo", DnnbindValueError, r"mx\.kv\.create\('foo'\): unknown KVStore type; use one of local, device, nccl"),
])
def test_create_refuses_what_it_cannot_do(name, error, pattern):
    # NOTE: MXNet 1.9.1 makes a local store of an unknown name ('foo' -> type 'foo'); dnnbind refuses it. Its
    # dist_async needs a ps-lite scheduler (without one: Check notnull: ...find("DMLC_NUM_WORKER")).
    with pytest.raises(error, match=pattern) as err:
        kvstore.create(name)
    assert isinstance(err.value, dmx.base.MXNetError)


def test_a_push_of_another_shape_is_refused_where_mxnet_reshapes_the_stored_value():
    # MXNet 1.9.1 without an updater: push((3, 2)) into a (2, 3) key makes the stored value (3, 2) (a pull into
    # (4, 2) then reports from.shape = [3,2]). dnnbind refuses the push and keeps the stored value.
    kv = _kv()
    with pytest.raises(DnnbindValueError, match=r"shape mismatch from\.shape = \[3,2\] to\.shape=\[2,3\]"):
        kv.push(3, nd.ones((3, 2), ctx=CPU))
    out = nd.zeros((2, 3), ctx=CPU)
    kv.pull(3, out=out)
    assert np.array_equal(out.numpy(), np.ones((2, 3)))


def test_a_failed_push_changes_nothing():
    kv = kvstore.create("local")
    kv.init([1, 2], [nd.ones((2,), ctx=CPU), nd.ones((3,), ctx=CPU)])
    with pytest.raises(DnnbindValueError):
        kv.push([1, 2], [nd.ones((2,), ctx=CPU) * 5, nd.ones((4,), ctx=CPU)])
    out = nd.zeros((2,), ctx=CPU)
    kv.pull(1, out=out)
    assert out.numpy().tolist() == [1.0, 1.0]


# -- updates on the store --------------------------------------------------------------------------------------------

def test_set_optimizer_then_pull_gives_the_updated_weight():
    kv = kvstore.create("device")
    kv.set_optimizer(dnnbind.gluon.optimizer.create("sgd", learning_rate=0.5, momentum=0.9))
    kv.init("w", nd.array([1.0, 2.0], ctx=CPU))
    w = np.array([1.0, 2.0], np.float32)
    mom = np.zeros(2, np.float32)
    for g in ([1.0, -1.0], [0.5, 2.0]):
        kv.push("w", [nd.array(g, ctx=CPU), nd.array(g, ctx=CPU)])  # two devices: the sum is the gradient
        mom = 0.9 * mom - 0.5 * 2 * np.array(g, np.float32)
        w = w + mom
    out = nd.zeros((2,), ctx=CPU)
    kv.pull("w", out=out)
    np.testing.assert_allclose(out.numpy(), w, rtol=1e-6)


def test_an_updater_gets_str_keys_as_str():
    seen = []
    kv = kvstore.create("local")
    kv._set_updater(lambda key, grad, stored: seen.append(key))
    kv.init("w", nd.ones((2,), ctx=CPU))
    kv.push("w", nd.ones((2,), ctx=CPU))
    assert seen == ["w"]  # MXNet 1.9.1 hands a str key to _set_updater's function as bytes (b'w')


def test_optimizer_states_round_trip_through_a_file(tmp_path):
    def make(weight):
        kv = kvstore.create("local")
        kv.set_optimizer(dnnbind.gluon.optimizer.create("adam", learning_rate=0.1))
        kv.init(0, nd.array(weight, ctx=CPU))
        return kv
    a = make([1.0, -1.0])
    a.push(0, nd.array([0.3, 0.7], ctx=CPU))
    a.save_optimizer_states(tmp_path / "s", dump_optimizer=True)  # the state and the optimizer's update counts
    out_a, out_b = nd.zeros((2,), ctx=CPU), nd.zeros((2,), ctx=CPU)
    a.pull(0, out=out_a)
    b = make(out_a.numpy())
    b.load_optimizer_states(tmp_path / "s")
    for kv, out in ((a, out_a), (b, out_b)):
        kv.push(0, nd.array([0.1, -0.2], ctx=CPU))
        kv.pull(0, out=out)
    assert np.array_equal(out_a.numpy(), out_b.numpy())
    c = make(out_a.numpy())  # no state loaded: a different step
    c.push(0, nd.array([0.1, -0.2], ctx=CPU))
    c.pull(0, out=out_b)
    assert not np.allclose(out_a.numpy(), out_b.numpy())


def test_a_registered_kvstore_class_is_created_by_name():
    class MyStore(kvstore.KVStoreBase):
        pass
    try:
        kvstore.KVStoreBase.register(MyStore)
        assert type(kvstore.create("MyStore")) is MyStore
    finally:
        kvstore.KVStoreBase.kv_registry.pop("mystore", None)


# -- rank, num_workers and the world -------------------------------------------------------------------------------

@pytest.fixture
def no_world():
    """No world before the test, none after (create('dist_*') initializes dnnbind.distributed)."""
    distributed.shutdown()
    yield
    distributed.shutdown()


@pytest.mark.parametrize("kind", ["dist_sync", "dist_device_sync", "dist_sync_device"])
def test_a_dist_store_in_a_process_that_was_not_launched_is_a_world_of_one(no_world, monkeypatch, kind):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    kv = kvstore.create(kind)
    assert distributed.is_initialized() and distributed.world_size() == 1
    assert (kv.type, kv.rank, kv.num_workers) == (kind, 0, 1)
    kv.init(0, nd.ones((2,), ctx=CPU))
    kv.pushpull(0, [nd.ones((2,), ctx=CPU), nd.ones((2,), ctx=CPU)])  # cpu arrays are fine in a world of one
    kv._barrier()


class FakeComm:
    """This rank's NCCL communicator in a world of 2: all_reduce adds "the other rank's" array (``other``),
    broadcast writes rank 0's (``root_value`` when this process is not rank 0)."""

    def __init__(self, device, rank: int):
        self.device, self.rank, self.calls = device, rank, []

    def all_reduce(self, x, out=None, op="sum"):
        assert out is x, "reduced in place"
        other = np.full(x.shape, 100.0, x.dtype)
        self.calls.append(("all_reduce", op, x.numpy().tolist()))
        x.copy_({"sum": x.numpy() + other, "avg": (x.numpy() + other) / 2}[op])
        return x

    def broadcast(self, x, root=0, out=None):
        assert out is x
        self.calls.append(("broadcast", root, x.numpy().tolist()))
        if self.rank != root:
            x.copy_(np.full(x.shape, 42.0, x.dtype))
        return x


@pytest.fixture
def world(monkeypatch):
    """Make this process rank ``r`` of a launched world of 2, with FakeComm for the NCCL communicator."""
    comms: list = []

    def enter(r: int = 0):
        for k, v in {"WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29556"}.items():
            monkeypatch.setenv(k, v)
        distributed.init(barrier_on_init=False)

        def make(device, what="KVStore"):
            if not comms:
                comms.append(FakeComm(device, r))
            return comms[0]
        monkeypatch.setattr(kvstore, "world_communicator", make)
        return comms
    yield enter
    distributed.shutdown()


@pytest.mark.parametrize("kind", ["device", "nccl", "dist_sync", "dist_device_sync", "horovod"])
def test_a_launched_store_sums_over_the_world_once_per_key(world, kind):
    comms = world(0)
    kv = kvstore.create(kind)
    assert (kv.rank, kv.num_workers) == (0, 2)
    kv.init([1, 2], [nd.ones((2,), ctx=CPU), nd.ones((3,), ctx=CPU)])
    assert [c[0] for c in comms[0].calls] == ["broadcast", "broadcast"]  # rank 0's value, per key
    comms[0].calls.clear()
    kv.push([1, 2, 1], [[nd.ones((2,), ctx=CPU), nd.ones((2,), ctx=CPU) * 2], nd.ones((3,), ctx=CPU),
                        nd.ones((2,), ctx=CPU) * 4])
    # key 1: its three local arrays summed (7), then one all-reduce; key 2: one all-reduce
    assert comms[0].calls == [("all_reduce", "sum", [7.0, 7.0]), ("all_reduce", "sum", [1.0, 1.0, 1.0])]
    out = [nd.zeros((2,), ctx=CPU), nd.zeros((3,), ctx=CPU)]
    kv.pull([1, 2], out=out)
    assert [o.numpy().tolist() for o in out] == [[107.0, 107.0], [101.0] * 3]


def test_rank_1_starts_from_rank_0s_value(world):
    world(1)
    kv = kvstore.create("dist_sync")
    assert (kv.rank, kv.num_workers) == (1, 2)
    out = nd.zeros((2,), ctx=CPU)
    kv.broadcast(0, nd.ones((2,), ctx=CPU), out=out)
    assert out.numpy().tolist() == [42.0, 42.0]


def test_a_launched_local_store_stays_in_its_process(world):
    comms = world(0)
    kv = kvstore.create("local")
    assert (kv.rank, kv.num_workers) == (0, 1)
    kv.init(0, nd.ones((2,), ctx=CPU))
    v = nd.ones((2,), ctx=CPU) * 3
    kv.pushpull(0, v)
    assert v.numpy().tolist() == [3.0, 3.0] and not comms


def test_a_launched_store_with_an_optimizer_updates_with_the_world_sum(world):
    comms = world(0)
    kv = kvstore.create("dist_sync")
    kv.set_optimizer(dnnbind.gluon.optimizer.create("sgd", learning_rate=0.01))
    kv.init(0, nd.array([1.0, 2.0], ctx=CPU))
    kv.push(0, nd.array([1.0, -1.0], ctx=CPU))
    out = nd.zeros((2,), ctx=CPU)
    kv.pull(0, out=out)
    np.testing.assert_allclose(out.numpy(), [1.0 - 0.01 * 101, 2.0 - 0.01 * 99], rtol=1e-6)
    assert [c[0] for c in comms[0].calls] == ["broadcast", "all_reduce"]


def test_a_launched_store_needs_gpu_arrays(monkeypatch):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29557"}.items():
        monkeypatch.setenv(k, v)
    distributed.init(barrier_on_init=False)
    try:
        kv = kvstore.create("dist_sync")
        with pytest.raises(DnnbindValueError, match=r"KVStore\.init \(type 'dist_sync'\): this process is rank 0 of 2 "
                           r".*needs GPU arrays; got an array on cpu\(0\)"):
            kv.init(0, nd.ones((2,), ctx=CPU))
    finally:
        distributed.shutdown()


# -- gluon.Trainer with a KVStore object ---------------------------------------------------------------------------

def _train(kvstore_arg, steps: int = 3) -> dict:
    rng = np.random.default_rng(5)
    net = nn.Sequential()
    net.add(nn.Dense(6, activation="relu"), nn.Dense(3))
    net.initialize(ctx=CPU)
    net(nd.zeros((1, 4), ctx=CPU))
    for k, p in net._collect_params_with_prefix().items():
        p.set_data(nd.array(np.random.default_rng(len(k)).standard_normal(p.shape).astype(np.float32), ctx=CPU))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=kvstore_arg)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        x = nd.array(rng.standard_normal((8, 4)).astype(np.float32), ctx=CPU)
        y = nd.array(rng.integers(0, 3, 8).astype(np.float32), ctx=CPU)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
    return {k: p.data().numpy() for k, p in net._collect_params_with_prefix().items()}


@pytest.mark.parametrize("kind", ["device", "local"])
def test_a_trainer_with_a_kvstore_object_trains_as_with_its_name(kind):
    by_name, by_object = _train(kind), _train(kvstore.create(kind))
    start = _train(kind, steps=0)
    for k in by_name:
        assert np.array_equal(by_name[k], by_object[k]), k
        assert not np.array_equal(by_name[k], start[k]), f"{k} did not move"


# -- GPUs ----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_a_store_on_one_gpu_sums_gpu_and_cpu_arrays():
    dev = dnnbind.gpu(0)
    kv = kvstore.create("device")
    kv.init(0, nd.ones((3,), ctx=dev))
    kv.push(0, [nd.ones((3,), ctx=dev) * 2, nd.ones((3,), ctx=CPU) * 3])
    outs = [nd.zeros((3,), ctx=dev), nd.zeros((3,), ctx=CPU)]
    kv.pull(0, out=outs)
    assert [o.numpy().tolist() for o in outs] == [[5.0] * 3] * 2
    kv.set_optimizer(dnnbind.gluon.optimizer.create("sgd", learning_rate=0.5))
    kv.pushpull(0, nd.ones((3,), ctx=dev), out=outs[0])
    assert outs[0].numpy().tolist() == [4.5] * 3


@pytest.mark.gpu
def test_a_store_sums_the_arrays_of_two_gpus():
    if dnnbind.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {dnnbind.num_gpus()}")
    d0, d1 = dnnbind.gpu(0), dnnbind.gpu(1)
    kv = kvstore.create("device")
    kv.init("w", nd.zeros((4,), ctx=d0))
    vals = [nd.array([1.0, 2.0, 3.0, 4.0], ctx=d0), nd.array([10.0, 20.0, 30.0, 40.0], ctx=d1)]
    kv.pushpull("w", vals)
    for v in vals:
        assert v.numpy().tolist() == [11.0, 22.0, 33.0, 44.0]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dist_sync", "dist_device_sync"])
def test_two_launched_processes_give_what_mxnets_dist_kvstore_gave(tmp_path, kind):
    if dnnbind.num_gpus() < 2:
        pytest.skip(f"needs 2 GPUs, found {dnnbind.num_gpus()}")
    proc = subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", "--master-port",
                           str(_free_port()), str(FIXTURES / "dist_worker.py"), kind, str(tmp_path), "--dnnbind"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        mismatches: list = []
        _compare(f"rank{r}", EXPECTED[kind][r], got, mismatches)
        assert not mismatches, "\n".join(mismatches)
