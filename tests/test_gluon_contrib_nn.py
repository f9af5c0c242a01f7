"""``gluon.contrib.nn`` (dnnbind/gluon/contrib/nn/): MXNet 1.9.1's Concurrent, HybridConcurrent, Identity,
SparseEmbedding, SyncBatchNorm and PixelShuffle1D/2D/3D against MXNet's own (fixtures/mxnet_contrib_nn/layers.*,
written by make_mxnet_contrib_nn.py): parameter names, reprs, outputs with MXNet's parameter values, SyncBatchNorm's
gradients and running statistics; against numpy (the pixel shuffles) and BatchNorm; export; and on 2 GPUs (marked
gpu) SyncBatchNorm in a thread per context against BatchNorm of the whole batch.
"""

from __future__ import annotations

import json
import pathlib
import threading
import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, gluon, nd
from dnnbind._lib.errors import DnnbindValueError
from dnnbind.gluon import nn
import dnnbind.gluon.contrib.nn as cnn
from tests._helpers import assert_close

HERE = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_contrib_nn"
LAYERS = json.loads((HERE / "layers.json").read_text())
VALUES = np.load(HERE / "layers.npz")


def _concurrent(cls, **kw):
    net = cls(**kw)
    with net.name_scope():
        net.add(nn.Dense(4, activation="relu"))
        net.add(nn.Dense(3))
        net.add(cnn.Identity())
    return net


def _hybridized(net):
    net.hybridize()
    return net


# case -> the same layer as the fixture's, with MXNet's prefix where it has parameters (its counter depends on
# what was made before it in MXNet's process)
BUILD = {
    "hybrid_concurrent": lambda: _concurrent(cnn.HybridConcurrent, axis=1, prefix="hybridconcurrent0_"),
    "concurrent": lambda: _concurrent(cnn.Concurrent, prefix="concurrent0_"),
    "hybrid_concurrent_hybridized": lambda: _hybridized(_concurrent(cnn.HybridConcurrent, axis=1,
                                                                    prefix="hybridconcurrent1_")),
    "identity": lambda: cnn.Identity(),
    "sync_batchnorm": lambda: cnn.SyncBatchNorm(in_channels=3, num_devices=1, prefix="syncbatchnorm0_"),
    "sync_batchnorm_deferred": lambda: cnn.SyncBatchNorm(num_devices=1, scale=False, momentum=0.7, epsilon=1e-3,
                                                         prefix="syncbatchnorm1_"),
    "pixel_shuffle_1d": lambda: cnn.PixelShuffle1D(2),
    "pixel_shuffle_2d": lambda: cnn.PixelShuffle2D((2, 3)),
    "pixel_shuffle_2d_int": lambda: cnn.PixelShuffle2D(2),
    "pixel_shuffle_3d": lambda: cnn.PixelShuffle3D((2, 3, 4)),
    "pixel_shuffle_3d_int": lambda: cnn.PixelShuffle3D(2),
}
OWN_REPR = {"identity", "sync_batchnorm", "sync_batchnorm_deferred", "pixel_shuffle_1d", "pixel_shuffle_2d",
            "pixel_shuffle_2d_int", "pixel_shuffle_3d", "pixel_shuffle_3d_int"}


def test_all_is_mxnets():
    assert list(cnn.__all__) == LAYERS["__all__"]
    for name in cnn.__all__:
        assert getattr(cnn, name).__name__ == name


@pytest.mark.parametrize("case", sorted(BUILD))
def test_layer_matches_mxnet(case):
    spec = LAYERS[case]
    net = BUILD[case]()
    net.initialize()
    x = VALUES[f"{case}/x"]
    params = net.collect_params()
    if spec["params"] and not all(p._shape_known() for p in params.values()):
        with autograd.predict_mode():
            net(nd.array(x))  # finish the deferred shapes, then load MXNet's values
    assert list(params.keys()) == spec["params"]
    for name, p in params.items():
        p.set_data(nd.array(VALUES[f"{case}/{name}"]))
    xa = nd.array(x)
    with autograd.record(train_mode=spec["train"]):
        y = net(xa)
    assert_close(y, VALUES[f"{case}/y"], rtol=1e-5, atol=1e-6)
    if f"{case}/grad/{spec['params'][0]}" in VALUES if spec["params"] else False:
        y.backward(nd.array(np.linspace(-1, 1, y.size).reshape(y.shape).astype(np.float32)))
        for name, p in params.items():
            if f"{case}/grad/{name}" in VALUES:
                assert_close(p.grad(), VALUES[f"{case}/grad/{name}"], rtol=1e-4, atol=1e-5)
            assert_close(p.data(), VALUES[f"{case}/after/{name}"], rtol=1e-5, atol=1e-6)
    if case in OWN_REPR:
        assert repr(net) == spec["repr"]


def test_containers_print_their_children_as_mxnet():
    net = _concurrent(cnn.HybridConcurrent, axis=1)
    text = repr(net)
    assert text.startswith("HybridConcurrent(\n  (0): Dense(") and text.endswith("(2): Identity(\n  \n  )\n)")
    assert LAYERS["hybrid_concurrent"]["repr"].endswith("(2): Identity(\n  \n  )\n)")


def test_default_names_count_per_class_as_mxnet():
    outer = nn.HybridSequential(prefix="net_")
    with outer.name_scope():
        blocks = [cnn.HybridConcurrent(), cnn.Concurrent(), cnn.Identity(), cnn.SyncBatchNorm(num_devices=1),
                  cnn.SyncBatchNorm(num_devices=1), cnn.SparseEmbedding(5, 2), cnn.PixelShuffle2D(2)]
    assert [b.prefix for b in blocks] == ["net_hybridconcurrent0_", "net_concurrent0_", "net_identity0_",
                                          "net_syncbatchnorm0_", "net_syncbatchnorm1_", "net_sparseembedding0_",
                                          "net_pixelshuffle2d0_"]
    assert blocks[3]._kwargs["key"] == "net_syncbatchnorm0_"  # the layer's key is its prefix, as MXNet's
    assert list(blocks[5].collect_params().keys()) == ["net_sparseembedding0_weight"]


def test_hybrid_concurrent_is_a_hybrid_sequential_and_concurrent_a_sequential():
    assert issubclass(cnn.HybridConcurrent, nn.HybridSequential)
    assert issubclass(cnn.Concurrent, nn.Sequential)
    assert issubclass(cnn.SyncBatchNorm, nn.BatchNorm)
    net = _concurrent(cnn.HybridConcurrent, axis=1)
    assert len(net) == 3 and isinstance(net[2], cnn.Identity)


def test_sync_batchnorm_default_num_devices_warns_as_mxnet():
    spec = LAYERS["sync_batchnorm_default"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = cnn.SyncBatchNorm()
    assert [str(w.message) for w in caught] == spec["warnings"]
    want = dict(spec["kwargs"], key=layer.prefix, ndev=max(dnnbind.num_gpus(), 1))
    assert layer._kwargs == want
    assert list(layer._kwargs) == ["eps", "momentum", "fix_gamma", "use_global_stats", "ndev", "key"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cnn.SyncBatchNorm(num_devices=2)  # given: no warning


@pytest.mark.parametrize("scale,center", [(True, True), (False, True), (True, False)])
def test_sync_batchnorm_on_one_device_is_batchnorm(scale, center):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for layer in (cnn.SyncBatchNorm(num_devices=1, scale=scale, center=center, epsilon=1e-3, momentum=0.8),
                  nn.BatchNorm(scale=scale, center=center, epsilon=1e-3, momentum=0.8)):
        layer.initialize(dnnbind.initializer.Uniform(0.5))
        with autograd.predict_mode():
            layer(nd.array(x))
        for p, v in zip(layer.collect_params().values(), (1.3, 0.2, 0.1, 1.5)):
            p.set_data(nd.full(p.shape, v))
        xa = nd.array(x)
        xa.attach_grad()
        with autograd.record():
            y = layer(xa)
        y.backward(nd.array(dy))
        results.append([y.asnumpy(), xa.grad.asnumpy()] + [p.data().asnumpy() for p in layer.collect_params().values()]
                       + [p.grad().asnumpy() for p in layer.collect_params().values() if p.grad_req != "null"])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def _numpy_shuffle(x, factors):
    n, cf = x.shape[:2]
    spatial = x.shape[2:]
    c = cf // int(np.prod(factors))
    d = len(factors)
    y = x.reshape((n, c) + tuple(factors) + spatial)
    # (N, C, f1..fd, s1..sd) -> (N, C, s1, f1, s2, f2, ...)
    perm = [0, 1] + [j for i in range(d) for j in (2 + d + i, 2 + i)]
    return y.transpose(perm).reshape((n, c) + tuple(s * f for s, f in zip(spatial, factors)))


@pytest.mark.parametrize("cls,factor,shape", [
    (cnn.PixelShuffle1D, 3, (2, 6, 4)), (cnn.PixelShuffle1D, 1, (1, 2, 3)),
    (cnn.PixelShuffle2D, (1, 2), (2, 4, 3, 2)), (cnn.PixelShuffle2D, 3, (1, 18, 2, 2)),
    (cnn.PixelShuffle3D, (2, 1, 3), (1, 12, 2, 3, 1)), (cnn.PixelShuffle3D, 1, (2, 2, 1, 2, 3)),
])
def test_pixel_shuffles_match_numpy_and_pass_gradients_back(cls, factor, shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape)
    layer = cls(factor)
    factors = (factor,) * (len(shape) - 2) if isinstance(factor, int) else factor
    xa = nd.array(x, dtype="float64")
    xa.attach_grad()
    with autograd.record():
        y = layer(xa)
    want = _numpy_shuffle(x, factors)
    np.testing.assert_array_equal(y.asnumpy(), want)
    dy = rng.standard_normal(want.shape)
    y.backward(nd.array(dy, dtype="float64"))
    # a permutation: the gradient is dy shuffled back, so <y, dy> = <x, dx>
    assert_close(float((xa.grad.asnumpy() * x).sum()), float((dy * want).sum()), rtol=1e-12, atol=1e-12)
    assert sorted(xa.grad.asnumpy().ravel()) == sorted(dy.ravel())


def test_sparse_embedding_is_a_dense_lookup_with_mxnets_surface():
    spec = LAYERS["sparse_embedding"]
    emb = cnn.SparseEmbedding(10, 4, prefix="sparseembedding0_")
    assert list(emb.collect_params().keys()) == spec["params"] and repr(emb) == spec["repr"]
    emb.initialize()
    emb.weight.set_data(nd.array(VALUES["sparse_embedding/sparseembedding0_weight"]))
    x = nd.array(VALUES["sparse_embedding/x"])
    with autograd.record():
        y = emb(x)
    assert_close(y, VALUES["sparse_embedding/y"], rtol=1e-6, atol=1e-7)
    y.backward(nd.ones(y.shape))
    g = emb.weight.grad().asnumpy()
    assert g.shape == (10, 4) and np.array_equal(g[[0, 1, 3, 9]], np.ones((4, 4))) and not g[[2, 4]].any()


def test_bad_arguments_are_refused():
    with pytest.raises(DnnbindValueError, match="PixelShuffle2D: factor must be an int or 2 ints"):
        cnn.PixelShuffle2D((2, 3, 4))
    with pytest.raises(DnnbindValueError, match="PixelShuffle3D"):
        cnn.PixelShuffle3D((2, 3))
    with pytest.raises(DnnbindValueError, match="SparseEmbedding: input_dim must be >= 1"):
        cnn.SparseEmbedding(0, 4)
    with pytest.raises(DnnbindValueError, match="SyncBatchNorm: num_devices must be >= 1"):
        cnn.SyncBatchNorm(num_devices=0)


def test_sync_batchnorm_on_several_devices_from_the_main_thread_says_what_to_do():
    layer = cnn.SyncBatchNorm(num_devices=2)
    layer.initialize()
    x = nd.array(np.random.default_rng(3).standard_normal((2, 3, 2)))
    with autograd.predict_mode():
        layer(x)  # inference meets no one
    with pytest.raises(DnnbindValueError, match=r"(?s)ndev=2.*main thread.*dnnbind\.launch.*own thread"):
        with autograd.record():
            layer(x)


def test_threads_share_one_layer_on_the_cpu():
    """Two threads through one SyncBatchNorm (one cpu copy of the parameters): each output is its piece of the
    whole batch's BatchNorm."""
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((2, 3, 4)).astype(np.float64) for _ in range(2)]
    layer = cnn.SyncBatchNorm(in_channels=3, num_devices=2, prefix="cpu_threads_")
    layer.cast("float64")
    layer.initialize()
    ys: list = [None, None]

    def work(i):
        try:
            with autograd.record():
                ys[i] = layer(nd.array(xs[i], dtype="float64")).asnumpy()
        except BaseException as e:  # noqa: BLE001
            ys[i] = e
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for y in ys:
        if isinstance(y, BaseException):
            raise y
    whole = np.concatenate(xs)
    mean, var = whole.mean(axis=(0, 2), keepdims=True), whole.var(axis=(0, 2), keepdims=True)
    eps = float(np.float32(1e-5))
    assert_close(np.concatenate(ys), (whole - mean) / np.sqrt(var + eps), rtol=1e-10, atol=1e-12)


def _export_and_import(net, x, path):
    """Export ``net`` (called once on x in predict mode), import it back with SymbolBlock; its nodes and outputs."""
    with autograd.predict_mode():
        want = net(x)
    sym_file, params_file = net.export(str(path))
    nodes = json.loads(pathlib.Path(sym_file).read_text())["nodes"]
    back = gluon.SymbolBlock.imports(sym_file, "data", params_file)
    with autograd.predict_mode():
        got = back(x)
    assert_close(got, want, rtol=1e-6, atol=1e-7)
    return nodes


def test_export_writes_mxnets_nodes_and_imports_back(tmp_path):
    rng = np.random.default_rng(5)
    net = _concurrent(cnn.HybridConcurrent, axis=1, prefix="cat_")
    net.initialize(dnnbind.initializer.Uniform(0.5))
    nodes = _export_and_import(net, nd.array(rng.standard_normal((3, 5))), tmp_path / "cat")
    assert "concat" in [n["op"] for n in nodes] or "Concat" in [n["op"] for n in nodes]

    net = nn.HybridSequential(prefix="model_")
    with net.name_scope():
        net.add(cnn.SyncBatchNorm(num_devices=1))
        net.add(cnn.PixelShuffle1D(2))
    net.initialize(dnnbind.initializer.Uniform(0.5))
    x = nd.array(rng.standard_normal((2, 4, 3)))
    with autograd.predict_mode():
        net(x)
    for p in net.collect_params().values():  # running statistics away from 0 and 1, so they matter
        if "running" in p.name:
            p.set_data(nd.array(np.linspace(0.5, 1.5, p.shape[0])))
    nodes = _export_and_import(net, x, tmp_path / "sbn")
    sbn = [n for n in nodes if n["op"] == "_contrib_SyncBatchNorm"]
    assert len(sbn) == 1 and sbn[0]["name"] == "model_syncbatchnorm0_fwd"
    assert sbn[0]["attrs"]["key"] == "model_syncbatchnorm0_" and sbn[0]["attrs"]["ndev"] == "1"


def test_gluoncv_imports_resolve_through_the_mxnet_alias(alias):
    from mxnet.gluon.contrib.nn import HybridConcurrent, Identity, SyncBatchNorm  # GluonCV's imports
    import mxnet
    assert SyncBatchNorm is cnn.SyncBatchNorm and mxnet.gluon.contrib.nn.SyncBatchNorm is cnn.SyncBatchNorm
    assert HybridConcurrent is cnn.HybridConcurrent and Identity is cnn.Identity


# -- 2 GPUs: a thread per context --------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(dnnbind.num_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("scale", [True, False])
def test_two_gpus_in_threads_train_like_batchnorm_on_the_whole_batch(scale):
    rng = np.random.default_rng(6)
    ctx = [dnnbind.gpu(0), dnnbind.gpu(1)]
    xs = [rng.standard_normal((3, 4, 2, 2)).astype(np.float32) * 2 + 1 for _ in ctx]
    dys = [rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    # in_channels given: the threads' first forward must not both finish a deferred initialization
    layer = cnn.SyncBatchNorm(in_channels=4, num_devices=2, scale=scale, momentum=0.8, prefix=f"gpu_threads_{scale}_")
    layer.initialize(ctx=ctx)
    results: list = [None, None]

    def work(i):
        try:
            x = nd.array(xs[i], ctx=ctx[i])
            x.attach_grad()
            with autograd.record():
                y = layer(x)
            y.backward(nd.array(dys[i], ctx=ctx[i]))
            results[i] = (y.asnumpy(), x.grad.asnumpy())
        except BaseException as e:  # noqa: BLE001
            results[i] = e
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a participant hung"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    # BatchNorm of the whole batch on the cpu
    ref = nn.BatchNorm(scale=scale, momentum=0.8, prefix=f"ref_{scale}_")
    ref.initialize()
    whole = nd.array(np.concatenate(xs))
    whole.attach_grad()
    with autograd.record():
        y = ref(whole)
    y.backward(nd.array(np.concatenate(dys)))
    assert_close(np.concatenate([r[0] for r in results]), y, rtol=1e-4, atol=1e-5)
    assert_close(np.concatenate([r[1] for r in results]), whole.grad, rtol=1e-4, atol=1e-4)
    for i, c in enumerate(ctx):  # every copy's running statistics: the whole batch's
        assert_close(layer.running_mean.data(c), ref.running_mean.data(), rtol=1e-5, atol=1e-6)
        assert_close(layer.running_var.data(c), ref.running_var.data(), rtol=1e-5, atol=1e-6)
    # the parameter gradients summed over the copies (what the Trainer does) are the whole batch's
    assert_close(sum(layer.beta.grad(c).asnumpy() for c in ctx), ref.beta.grad(), rtol=1e-4, atol=1e-4)
    if scale:
        assert_close(sum(layer.gamma.grad(c).asnumpy() for c in ctx), ref.gamma.grad(), rtol=1e-4, atol=1e-4)
