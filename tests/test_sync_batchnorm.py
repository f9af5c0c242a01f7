"""``_contrib_SyncBatchNorm`` (nd.contrib.SyncBatchNorm, ops/defs/sync_batchnorm.py) and where its participants meet
(ops/sync_meeting.py).

- ndev=1 (and inference, use_global_stats): BatchNorm's results, gradients and moving statistics, bit for bit; and
  MXNet 1.9.1's own CPU SyncBatchNorm (fixtures/mxnet_contrib_nn/sync_batchnorm.npz).
- The numpy twin of the synchronized op (ops/reference/sync_batchnorm.py) is BatchNorm of the concatenated batch.
- Several participants in threads (cpu here; 2 GPUs below): each device's output and gradients are the pieces of
  the global-batch BatchNorm, for equal and unequal per-device batches.
- Calls that would wait forever are refused at once (the main thread) or end in an error after the barrier's
  timeout; participants that disagree on the channels are refused.
- GPU (marked gpu): one GPU equals BatchNorm; 2 GPUs in threads (NCCL and the host transport) and 2 launched ranks
  equal the twin.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.ops import sync_meeting
from dnnbind.ops.reference.batchnorm import batchnorm_backward, batchnorm_forward_training
from dnnbind.ops.reference.sync_batchnorm import sync_batchnorm_backward, sync_batchnorm_forward_training
from tests._helpers import assert_close

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "mxnet_contrib_nn" / "sync_batchnorm.npz"


def _arrays(rng, shape, dtype=np.float64):
    c = shape[1]
    x = rng.standard_normal(shape) * 2 + rng.standard_normal(c).reshape([c if i == 1 else 1 for i in range(len(shape))])
    return {"x": x.astype(dtype), "gamma": rng.uniform(0.5, 2, c).astype(dtype),
            "beta": rng.standard_normal(c).astype(dtype), "mm": rng.standard_normal(c).astype(dtype),
            "mv": rng.uniform(0.5, 2, c).astype(dtype),
            "dy": rng.standard_normal(shape).astype(dtype)}


def _run(op, a, ctx, params, train=True, record=True):
    """op(x, gamma, beta, mm, mv, **params) with gradients of x, gamma, beta for dy; numpy results."""
    x, g, b = (nd.array(a[k], ctx=ctx, dtype=a[k].dtype) for k in ("x", "gamma", "beta"))
    mm, mv = (nd.array(a[k], ctx=ctx, dtype=a[k].dtype) for k in ("mm", "mv"))
    for v in (x, g, b):
        v.attach_grad()
    with autograd.record(train_mode=train):
        y = op(x, g, b, mm, mv, **params)
    ys = y if isinstance(y, (list, tuple)) else [y]
    ys[0].backward(nd.array(a["dy"], ctx=ctx, dtype=a["dy"].dtype))
    out = {"y": ys[0].asnumpy(), "dx": x.grad.asnumpy(), "dgamma": g.grad.asnumpy(), "dbeta": b.grad.asnumpy(),
           "mm": mm.asnumpy(), "mv": mv.asnumpy(), "gamma": g.asnumpy()}
    if len(ys) == 3:
        out["mean"], out["var"] = ys[1].asnumpy(), ys[2].asnumpy()
    return out


def _sync(key, ndev=1, **params):
    return lambda *arrays, **more: nd.contrib.SyncBatchNorm(*arrays, key=key, ndev=ndev, **params, **more)


def _bn(**params):
    # MXNet declares SyncBatchNorm's eps a float (BatchNorm's a double): the same float32 value for both
    params["eps"] = float(np.float32(params.get("eps", 1e-3)))
    return lambda *arrays, **more: nd.BatchNorm(*arrays, axis=1, **params, **more)


CASES = [((3, 2, 4), {"fix_gamma": False}), ((2, 3, 2, 2), {}), ((2, 3, 2, 2, 3), {"fix_gamma": False, "eps": 1e-5}),
         ((5, 3), {"fix_gamma": False, "momentum": 0.5}), ((1, 2, 3), {"fix_gamma": False, "momentum": 0.0}),
         ((4, 1, 2), {"fix_gamma": False})]


# -- one device: BatchNorm itself ----------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False], ids=["train", "predict"])
@pytest.mark.parametrize("global_stats", [False, True])
@pytest.mark.parametrize("shape,params", CASES)
def test_one_device_is_batchnorm_bit_for_bit(shape, params, global_stats, train):
    rng = np.random.default_rng(len(shape) * 7 + shape[0])
    a = _arrays(rng, shape)
    params = dict(params, use_global_stats=global_stats)
    got = _run(_sync("one", **params), a, dnnbind.cpu(), {}, train=train)
    want = _run(_bn(**params), a, dnnbind.cpu(), {}, train=train)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert not np.array_equal(got["mm"], a["mm"]) or not train or global_stats  # the statistics did move


def test_ndev_above_one_outside_training_is_batchnorm_too():
    """Inference and use_global_stats never meet: a main-thread call with ndev=4 works."""
    a = _arrays(np.random.default_rng(1), (2, 3, 4))
    got = _run(_sync("infer", ndev=4, fix_gamma=False), a, dnnbind.cpu(), {}, train=False)
    want = _run(_bn(fix_gamma=False), a, dnnbind.cpu(), {}, train=False)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    got = _run(_sync("global", ndev=4, fix_gamma=False, use_global_stats=True), a, dnnbind.cpu(), {})
    want = _run(_bn(fix_gamma=False, use_global_stats=True), a, dnnbind.cpu(), {})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_output_mean_var_gives_the_mean_and_the_variance_as_mxnet():
    """MXNet's SyncBatchNorm outputs the (biased) variance where BatchNorm outputs the inverse standard deviation;
    outside training (where MXNet leaves them unwritten) dnnbind gives the moving statistics."""
    a = _arrays(np.random.default_rng(2), (3, 2, 5))
    got = _run(_sync("omv", fix_gamma=False, output_mean_var=True), a, dnnbind.cpu(), {})
    x = a["x"]
    assert_close(got["mean"], x.mean(axis=(0, 2)), rtol=1e-12, atol=1e-12)
    assert_close(got["var"], x.var(axis=(0, 2)), rtol=1e-12, atol=1e-12)
    bn = _run(_bn(fix_gamma=False, output_mean_var=True), a, dnnbind.cpu(), {})
    assert_close(got["var"], 1 / bn["var"] ** 2 - 1e-3, rtol=1e-10, atol=1e-12)
    pred = _run(_sync("omv", fix_gamma=False, output_mean_var=True), a, dnnbind.cpu(), {}, train=False)
    np.testing.assert_array_equal(pred["mean"], a["mm"])
    np.testing.assert_array_equal(pred["var"], a["mv"])


def _fixture_cases():
    if not FIXTURE.exists():
        return []
    with np.load(FIXTURE) as f:
        return list(range(int(f["count"])))


@pytest.mark.parametrize("i", _fixture_cases())
def test_matches_mxnet_cpu_sync_batchnorm(i):
    f = np.load(FIXTURE)
    params, mode = json.loads(str(f[f"params{i}"])), str(f[f"mode{i}"])
    a = {k: f[f"{k}{i}"] for k in ("x", "gamma", "beta", "mm", "mv", "dy")}
    got = _run(_sync(f"mx{i}", **params), a, dnnbind.cpu(), {}, train=mode != "predict")
    tol = dict(rtol=2e-4, atol=2e-5)
    assert_close(got["y"], f[f"y{i}"], **tol)
    if mode == "predict":  # (MXNet's backward there is unsound: the fixture keeps the output only)
        np.testing.assert_array_equal(got["mm"], a["mm"])
        return
    assert_close(got["dx"], f[f"dx{i}"], **tol)
    assert_close(got["dgamma"], f[f"dgamma{i}"], **tol)
    assert_close(got["dbeta"], f[f"dbeta{i}"], **tol)
    # MXNet updates the moving statistics in its backward, dnnbind in the forward: after both they agree
    assert_close(got["mm"], f[f"mm_after{i}"], **tol)
    assert_close(got["mv"], f[f"mv_after{i}"], **tol)
    if f"mean{i}" in f:
        assert_close(got["mean"], f[f"mean{i}"], **tol)
        assert_close(got["var"], f[f"var{i}"], **tol)


def test_parameters_are_mxnets():
    from dnnbind.nd._schema import schema
    s = schema("_contrib_SyncBatchNorm")
    assert [i.name for i in s.inputs] == ["data", "gamma", "beta", "moving_mean", "moving_var"]
    defaults = {p.name: p.default for p in s.params}
    assert defaults == {"eps": pytest.approx(1e-3), "momentum": pytest.approx(0.9), "fix_gamma": True,
                        "use_global_stats": False, "output_mean_var": False, "ndev": 1, "key": None}
    assert nd.contrib.SyncBatchNorm is nd._contrib_SyncBatchNorm
    x = nd.ones((2, 3))
    with pytest.raises(TypeError, match="Required parameter key"):
        nd.contrib.SyncBatchNorm(x, nd.ones(3), nd.zeros(3), nd.zeros(3), nd.ones(3))
    with pytest.raises(DnnbindValueError, match="ndev must be >= 1"):
        nd.contrib.SyncBatchNorm(x, nd.ones(3), nd.zeros(3), nd.zeros(3), nd.ones(3), key="k", ndev=0)
    with pytest.raises(DnnbindValueError, match=r"gamma has shape \(2,\)"):
        nd.contrib.SyncBatchNorm(x, nd.ones(2), nd.zeros(3), nd.zeros(3), nd.ones(3), key="k")


def test_symbol_node_has_mxnets_arguments_and_auxiliary_states():
    mx = dnnbind.mxnet
    s = mx.sym.contrib.SyncBatchNorm(mx.sym.var("data"), key="s", name="sbn")
    assert s.list_arguments() == ["data", "sbn_gamma", "sbn_beta"]
    assert s.list_auxiliary_states() == ["sbn_moving_mean", "sbn_moving_var"]
    assert s.list_outputs() == ["sbn_output"]


# -- the twin: BatchNorm of the global batch -----------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [(2, 3), (1, 4, 2), (3, 3)])
def test_twin_is_batchnorm_of_the_concatenated_batch(sizes):
    rng = np.random.default_rng(sum(sizes))
    xs = [rng.standard_normal((n, 3, 2, 2)) * 3 + 1 for n in sizes]
    dys = [rng.standard_normal(x.shape) for x in xs]
    gamma, beta = rng.uniform(0.5, 2, 3), rng.standard_normal(3)
    mm, mv = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    mm2, mv2 = mm.copy(), mv.copy()
    ys, mean, var = sync_batchnorm_forward_training(xs, gamma, beta, mm, mv, 0.8, 1e-3)
    xcat = np.concatenate(xs)
    y, bmean, inv_std = batchnorm_forward_training(xcat, gamma, beta, mm2, mv2, 0.8, 1e-3)
    assert_close(np.concatenate(ys), y, rtol=1e-12, atol=1e-12)
    assert_close(mean, bmean, rtol=1e-12, atol=1e-12)
    assert_close(1 / np.sqrt(var + 1e-3), inv_std, rtol=1e-12, atol=1e-12)
    assert_close(mm, mm2, rtol=1e-12, atol=1e-12)
    assert_close(mv, mv2, rtol=1e-12, atol=1e-12)
    dxs, dgammas, dbetas = sync_batchnorm_backward(xs, dys, gamma, mean, var, 1e-3)
    dx, dgamma, dbeta = batchnorm_backward(xcat, np.concatenate(dys), gamma, bmean, inv_std, 1e-3)
    assert_close(np.concatenate(dxs), dx, rtol=1e-10, atol=1e-12)
    assert_close(np.sum(dgammas, axis=0), dgamma, rtol=1e-10, atol=1e-12)
    assert_close(np.sum(dbetas, axis=0), dbeta, rtol=1e-10, atol=1e-12)
    assert_close(dgammas[0], (dys[0] * (xs[0] - mean.reshape(1, 3, 1, 1)) / np.sqrt(var + 1e-3).reshape(1, 3, 1, 1)
                              ).sum(axis=(0, 2, 3)), rtol=1e-10, atol=1e-12)


# -- several participants, one thread each -------------------------------------------------------------------------

def _in_threads(fn, n: int, wait: float = 60.0) -> list:
    """fn(i) in n threads at once; every result or exception, in order. Fails (not hangs) if a thread hangs."""
    results: list = [None] * n

    def work(i):
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
    assert not any(t.is_alive() for t in threads), "a participant hung"
    return results


def _per_device(rng, sizes, tail=(2, 3), c=3, dtype=np.float64):
    xs = [(rng.standard_normal((n, c) + tail) * 2 + rng.standard_normal(c).reshape((1, c) + (1,) * len(tail)))
          .astype(dtype) for n in sizes]
    common = {"gamma": rng.uniform(0.5, 2, c).astype(dtype), "beta": rng.standard_normal(c).astype(dtype),
              "mm": rng.standard_normal(c).astype(dtype), "mv": rng.uniform(0.5, 2, c).astype(dtype)}
    return [dict(common, x=x, dy=rng.standard_normal(x.shape).astype(dtype)) for x in xs]


def _check_against_twin(results, per, params, rtol=1e-10, atol=1e-12):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    # MXNet declares eps and momentum floats: the op computes with their float32 values
    eps, momentum = (float(np.float32(params.get(k, d))) for k, d in (("eps", 1e-3), ("momentum", 0.9)))
    gamma = np.ones_like(per[0]["gamma"]) if params.get("fix_gamma", True) else per[0]["gamma"]
    mm, mv = per[0]["mm"].astype(np.float64), per[0]["mv"].astype(np.float64)  # the twin in float64 throughout
    xs = [p["x"].astype(np.float64) for p in per]
    ys, mean, var = sync_batchnorm_forward_training(xs, gamma.astype(np.float64), per[0]["beta"].astype(np.float64),
                                                    mm, mv, momentum, eps)
    dxs, dgammas, dbetas = sync_batchnorm_backward(xs, [p["dy"].astype(np.float64) for p in per],
                                                   gamma.astype(np.float64), mean, var, eps)
    for i, r in enumerate(results):
        assert_close(r["y"], ys[i], rtol=rtol, atol=atol)
        assert_close(r["dx"], dxs[i], rtol=rtol, atol=atol)
        assert_close(r["dbeta"], dbetas[i], rtol=rtol, atol=atol)
        if params.get("fix_gamma", True):
            np.testing.assert_array_equal(r["dgamma"], 0)
            np.testing.assert_array_equal(r["gamma"], 1)
        else:
            assert_close(r["dgamma"], dgammas[i], rtol=rtol, atol=atol)
        assert_close(r["mm"], mm, rtol=rtol, atol=atol)
        assert_close(r["mv"], mv, rtol=rtol, atol=atol)
        if "mean" in r:
            assert_close(r["mean"], mean, rtol=rtol, atol=atol)
            assert_close(r["var"], var, rtol=rtol, atol=atol)


@pytest.mark.parametrize("sizes,params", [
    ((2, 2), {"fix_gamma": False}),
    ((3, 1, 2), {"fix_gamma": False, "momentum": 0.7, "output_mean_var": True}),  # unequal batches: counts weigh
    ((2, 4), {}),  # fix_gamma
])
def test_threads_on_the_cpu_normalize_with_the_global_batch(sizes, params):
    per = _per_device(np.random.default_rng(len(sizes) * 10 + sizes[0]), sizes)
    key = f"cpu-threads-{sizes}-{sorted(params)}"
    results = _in_threads(lambda i: _run(_sync(key, ndev=len(sizes), **params), per[i], dnnbind.cpu(), {}),
                          len(sizes))
    _check_against_twin(results, per, params)
    # and not what each device alone gives
    alone = _run(_sync("alone", **params), per[0], dnnbind.cpu(), {})
    assert not np.allclose(alone["y"], results[0]["y"])


def test_threads_meet_again_on_the_next_step():
    """Rounds of one key follow each other: two steps, the second with new data."""
    key = "two-steps"
    steps = [_per_device(np.random.default_rng(s), (2, 3)) for s in (40, 41)]

    def participant(i):
        return [_run(_sync(key, ndev=2, fix_gamma=False), step[i], dnnbind.cpu(), {}) for step in steps]
    results = _in_threads(participant, 2)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    for s, step in enumerate(steps):
        _check_against_twin([results[0][s], results[1][s]], step, {"fix_gamma": False})


def test_the_main_thread_is_refused_at_once_naming_the_two_ways():
    a = _arrays(np.random.default_rng(3), (2, 3, 4))
    start = time.monotonic()
    with pytest.raises(DnnbindValueError) as e:
        _run(_sync("main", ndev=2), a, dnnbind.cpu(), {})
    assert time.monotonic() - start < 5
    msg = str(e.value)
    for part in ("_contrib_SyncBatchNorm", "ndev=2", "'main'", "main thread", "dnnbind.launch", "thread",
                 "ndev=1"):
        assert part in msg, (part, msg)


def test_a_participant_alone_times_out_with_an_error_not_a_hang():
    a = _arrays(np.random.default_rng(4), (2, 3, 4))
    idle = threading.Event()
    helper = threading.Thread(target=idle.wait, daemon=True)  # a second live thread: the count check passes
    helper.start()
    previous = sync_meeting.set_timeout(0.5)
    try:
        start = time.monotonic()
        [r] = _in_threads(lambda i: _run(_sync("lonely", ndev=2), a, dnnbind.cpu(), {}), 1, wait=30)
    finally:
        sync_meeting.set_timeout(previous)
        idle.set()
    assert isinstance(r, sync_meeting.SyncTimeoutError), r
    assert time.monotonic() - start < 20
    assert "only 1 of 2 participants" in str(r) and "'lonely'" in str(r) and "DNNBIND_SYNC_TIMEOUT" in str(r)


def test_participants_disagreeing_on_the_channels_are_refused():
    rng = np.random.default_rng(6)
    per = [_arrays(rng, (2, 3, 2)), _arrays(rng, (2, 4, 2))]
    previous = sync_meeting.set_timeout(5)
    try:
        results = _in_threads(lambda i: _run(_sync("channels", ndev=2), per[i], dnnbind.cpu(), {}), 2)
    finally:
        sync_meeting.set_timeout(previous)
    # both hear of it at once (the first is waiting when the second arrives), not after the timeout
    assert all(isinstance(r, DnnbindValueError) and "same number of channels" in str(r) for r in results), results


def test_backward_of_thread_forwards_from_the_main_thread_is_refused():
    """gluoncv's segmentation loop calls autograd.backward(losses) from the main thread: refused, not a hang."""
    per = _per_device(np.random.default_rng(7), (2, 2))
    key = "backward-main"

    def forward(i):
        x = nd.array(per[i]["x"])
        x.attach_grad()
        g, b, mm, mv = (nd.array(per[i][k]) for k in ("gamma", "beta", "mm", "mv"))
        with autograd.record():
            return x, nd.contrib.SyncBatchNorm(x, g, b, mm, mv, key=key, ndev=2).sum()
    results = _in_threads(forward, 2)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    with pytest.raises(DnnbindValueError, match="main thread"):
        autograd.backward([r[1] for r in results])


# -- GPUs -------------------------------------------------------------------------------------------------------

def _two_gpus() -> bool:
    return dnnbind.num_gpus() >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,params", CASES + [((2, 2, 1, 2, 1, 3), {"fix_gamma": False})])
def test_gpu_one_device_is_batchnorm(shape, params, dtype, gpu):
    a = _arrays(np.random.default_rng(8), shape, np.dtype(dtype))
    got = _run(_sync("gpu-one", **params), a, gpu, {})
    want = _run(_bn(**params), a, gpu, {}) if len(shape) <= 5 else None
    if want is not None:  # the same cuDNN calls (to rounding, should cuDNN's reductions not repeat bit for bit)
        same = dict(rtol=1e-6, atol=1e-7) if dtype == "float32" else dict(rtol=1e-13, atol=1e-14)
        for k in want:
            assert_close(got[k], want[k], name=k, **same)
    twin = _run(_sync("gpu-one", **params), a, dnnbind.cpu(), {})
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-11)
    for k in twin:
        assert_close(got[k], twin[k], **tol)


@pytest.mark.gpu
def test_gpu_one_device_output_mean_var(gpu):
    a = _arrays(np.random.default_rng(9), (3, 2, 5), np.float32)
    got = _run(_sync("gpu-omv", fix_gamma=False, output_mean_var=True), a, gpu, {})
    twin = _run(_sync("gpu-omv", fix_gamma=False, output_mean_var=True), a, dnnbind.cpu(), {})
    for k in twin:
        assert_close(got[k], twin[k], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs")
@pytest.mark.parametrize("transport", ["nccl", "host"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sizes,params", [((2, 2), {"fix_gamma": False}),
                                          ((3, 1), {"fix_gamma": False, "output_mean_var": True}), ((2, 2), {})])
def test_two_gpus_in_threads_normalize_with_the_global_batch(sizes, params, dtype, transport, monkeypatch):
    monkeypatch.setenv("DNNBIND_SYNC_TRANSPORT", transport)
    per = _per_device(np.random.default_rng(11), sizes, dtype=np.dtype(dtype))
    key = f"gpu-threads-{sizes}-{sorted(params)}-{dtype}-{transport}"
    results = _in_threads(lambda i: _run(_sync(key, ndev=2, **params), per[i], dnnbind.gpu(i), {}), 2)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-11)
    _check_against_twin(results, per, params, **tol)


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs")
def test_two_gpus_in_threads_refuse_two_participants_on_one_gpu():
    per = _per_device(np.random.default_rng(12), (2, 2))
    previous = sync_meeting.set_timeout(5)
    try:
        results = _in_threads(lambda i: _run(_sync("same-gpu", ndev=2), per[i], dnnbind.gpu(0), {}), 2)
    finally:
        sync_meeting.set_timeout(previous)
    assert any(isinstance(r, DnnbindValueError) and "two participants" in str(r) for r in results), results


RANK_PROGRAM = textwrap.dedent('''
    import sys
    import numpy as np
    import dnnbind
    from dnnbind import distributed
    from dnnbind.ops.reference.sync_batchnorm import sync_batchnorm_backward, sync_batchnorm_forward_training
    sys.path.insert(0, sys.argv[1])
    from tests.test_sync_batchnorm import _per_device, _run, _sync

    distributed.init()
    r, n = distributed.rank(), distributed.world_size()
    dev = dnnbind.gpu(distributed.local_rank())
    for dtype, tol in (("float32", dict(rtol=1e-4, atol=1e-5)), ("float64", dict(rtol=1e-9, atol=1e-11))):
        for sizes, params in (((2, 3), {"fix_gamma": False, "output_mean_var": True}), ((2, 2), {})):
            per = _per_device(np.random.default_rng(13), sizes, dtype=np.dtype(dtype))  # every rank: all batches
            mine = _run(_sync("ranks", ndev=n, **params), per[r], dev, {})
            # every rank checks its own piece against the twin's of the whole batch
            eps, momentum = float(np.float32(1e-3)), float(np.float32(0.9))
            gamma = per[0]["gamma"] if not params.get("fix_gamma", True) else np.ones_like(per[0]["gamma"])
            mm, mv = per[0]["mm"].astype(np.float64), per[0]["mv"].astype(np.float64)
            xs = [p["x"].astype(np.float64) for p in per]
            ys, mean, var = sync_batchnorm_forward_training(xs, gamma.astype(np.float64),
                                                            per[0]["beta"].astype(np.float64), mm, mv, momentum, eps)
            dxs, dgs, dbs = sync_batchnorm_backward(xs, [p["dy"].astype(np.float64) for p in per],
                                                    gamma.astype(np.float64), mean, var, eps)
            np.testing.assert_allclose(mine["y"], ys[r], **tol)
            np.testing.assert_allclose(mine["dx"], dxs[r], **tol)
            np.testing.assert_allclose(mine["dbeta"], dbs[r], **tol)
            np.testing.assert_allclose(mine["mm"], mm, **tol)
            np.testing.assert_allclose(mine["mv"], mv, **tol)
            if "mean" in mine:
                np.testing.assert_allclose(mine["var"], var, **tol)
    print(f"rank {r} of {n} sync ok", flush=True)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs")
def test_two_launched_ranks_normalize_with_the_global_batch(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "NCCL_NVLS_ENABLE": "0"}
    r = subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", "2", "--master-port",
                        str(_free_port()), str(script), str(ROOT)], capture_output=True, text=True, timeout=300,
                       env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "rank 0 of 2 sync ok" in out and "rank 1 of 2 sync ok" in out, out[-3000:]
