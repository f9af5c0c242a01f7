"""MXNet's private names that GluonCV 0.10.5 imports from mxnet.gluon (``loss._apply_weighting``,
``loss._reshape_like``, ``data.dataloader._MultiWorkerIter`` & co, ``data.sampler``), with MXNet 1.9.1's behaviour
(each expected value below was read off the real MXNet), and GluonCV itself through the alias where it is installed.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind import symbol as sym
from dnnbind.gluon import loss as gloss
from dnnbind.gluon.data import ArrayDataset, BatchSampler, SequentialSampler
from dnnbind.gluon.data import dataloader as dl

from _helpers import assert_close


def test_apply_weighting_like_mxnet():
    l = nd.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    out = gloss._apply_weighting(nd, l, 0.5, nd.array([[2.0], [3.0]]))
    assert_close(out.asnumpy(), [[1.0, 2.0, 3.0], [6.0, 7.5, 9.0]], rtol=0, atol=0)
    assert gloss._apply_weighting(nd, l, None, None) is l
    assert_close(gloss._apply_weighting(nd, l, np.float32(2)).asnumpy(), l.asnumpy() * 2, rtol=0, atol=0)
    for bad in ("2", nd.array([2.0])):
        with pytest.raises(AssertionError, match="weight must be a number"):
            gloss._apply_weighting(nd, l, bad)


def test_apply_weighting_and_reshape_like_on_symbols():
    s = gloss._apply_weighting(sym, sym.var("a"), 2.0, sym.var("w"))
    assert s.list_arguments() == ["a", "w"]
    assert '"op": "broadcast_mul"' in s.tojson()
    r = gloss._reshape_like(sym, sym.var("x"), sym.var("y"))
    assert r.infer_shape(x=(6,), y=(2, 3))[1] == [(2, 3)]


def test_reshape_like_on_arrays():
    assert gloss._reshape_like(nd, nd.arange(6), nd.zeros((2, 3))).shape == (2, 3)


def test_losses_still_weight_as_before():
    """Loss._weighting now goes through _apply_weighting: sample weights broadcast, the number scales."""
    pred, label = nd.array([[1.0, 2.0], [3.0, 5.0]]), nd.array([[0.0, 2.0], [1.0, 1.0]])
    out = gloss.L2Loss(weight=2.0)(pred, label, nd.array([[1.0], [0.5]]))
    want = np.mean(((np.array([[1.0, 2.0], [3.0, 5.0]]) - [[0, 2], [1, 1]]) ** 2) * [[1.0], [0.5]], axis=1)
    assert_close(out.asnumpy(), want, rtol=1e-6, atol=0)


def test_default_mp_batchify_fn_and_as_in_context():
    b = dl.default_mp_batchify_fn([np.array([1, 2]), np.array([3, 4])])
    assert b.shape == (2, 2) and b.dtype == np.int64
    pair = dl.default_mp_batchify_fn([(np.array([1.0, 2.0]), 1), (np.array([3.0, 4.0]), 0)])
    assert [p.asnumpy().tolist() for p in pair] == [[[1.0, 2.0], [3.0, 4.0]], [1, 0]]
    moved = dl._as_in_context([nd.array([1.0]), (nd.array([2.0]),), 3], nd.array([0.0]).context)
    assert isinstance(moved, list) and moved[2] == 3 and moved[1][0].asnumpy().tolist() == [2.0]


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_multi_worker_iter_over_a_pool_like_mxnet():
    ds = ArrayDataset(np.arange(10).reshape(5, 2).astype("float32"), np.arange(5))
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(2, initializer=dl._worker_initializer, initargs=[ds, False, False])
    try:
        it = dl._MultiWorkerIter(pool, dl.default_batchify_fn, BatchSampler(SequentialSampler(5), 2, "keep"),
                                 prefetch=2)
        assert len(it) == 3
        got = [(b[0].asnumpy().tolist(), b[1].asnumpy().tolist()) for b in it]
    finally:
        pool.terminate()
    assert got == [([[0.0, 1.0], [2.0, 3.0]], [0, 1]), ([[4.0, 5.0], [6.0, 7.0]], [2, 3]), ([[8.0, 9.0]], [4])]


def test_multi_worker_iter_thread_pool_returns_batches_unpickled():
    from multiprocessing.pool import ThreadPool
    ds = ArrayDataset(np.arange(6).astype("float32"))
    with ThreadPool(2) as pool:
        it = dl._MultiWorkerIter(pool, dl.default_batchify_fn, BatchSampler(SequentialSampler(6), 4, "keep"),
                                 worker_fn=dl._thread_worker_fn, prefetch=1, dataset=ds)
        got = [b.asnumpy().tolist() for b in it]
    assert got == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]


def test_sampler_module_has_mxnets_name():
    from dnnbind.gluon import data
    assert data.sampler.Sampler is dl.Sampler and data.sampler.BatchSampler is BatchSampler


def test_sym_contrib_functions_keep_their_identity():
    """MXNet's generated operator functions are module attributes: GluonCV tests ``norm_layer is SyncBatchNorm``
    with one imported by name and one read as mx.sym.contrib.SyncBatchNorm."""
    from dnnbind.symbol import contrib
    from dnnbind.symbol.contrib import box_nms
    assert contrib.box_nms is box_nms and sym.contrib.box_nms is box_nms


def _names_fixture():
    import importlib.util
    import json
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("make_mxnet_symbol_names",
                                                  os.path.join(here, "fixtures", "make_mxnet_symbol_names.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(os.path.join(here, "fixtures", "mxnet_symbol_names", "names.json")) as f:
        return gen, json.load(f)


def test_graph_names_follow_mxnets_name_scopes():
    """A Block called on Symbols names its nodes as MXNet does (each Block's scope replaces the caller's prefix; a
    Block made with prefix='' continues the enclosing count), Symbols made inside name_scope() get the Block's
    prefix, and a SymbolBlock's Parameters are named as its graph's variables."""
    import dnnbind.mxnet as mx
    gen, ref = _names_fixture()
    ours = gen.names(mx)
    assert ours["internals"] == ref["internals"]
    assert ours["symbolblock_params"] == ref["symbolblock_params"]


def test_gluoncv_imports_and_runs_through_the_alias(alias):
    pytest.importorskip("gluoncv", reason="GluonCV is not installed")
    import mxnet as mx
    try:
        import gluoncv
    except ImportError as exc:  # gluon.contrib.nn (HybridConcurrent, Identity) comes from another change
        pytest.skip(f"GluonCV does not import yet: {exc}")
    net = gluoncv.model_zoo.get_model("cifar_resnet20_v1", pretrained=False)
    net.initialize()
    assert net(mx.nd.random.uniform(shape=(1, 3, 32, 32))).shape == (1, 10)
    # GluonCV's own loss over MXNet's private helpers
    from gluoncv.loss import SoftmaxCrossEntropyLoss
    out = SoftmaxCrossEntropyLoss()(mx.nd.array([[1.0, 2.0, 3.0]]), mx.nd.array([2]))
    assert_close(out.asnumpy(), [0.40760598], rtol=1e-6, atol=1e-7)  # MXNet 1.9.1 with GluonCV 0.10.5
    from gluoncv.data import RandomTransformDataLoader
    ds = ArrayDataset(np.arange(8).astype("float32"))
    loader = RandomTransformDataLoader([lambda x: x * 2, lambda x: x * 2], ds, batch_size=4)
    assert [b.asnumpy().tolist() for b in loader] == [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0]]


def test_survey_script_reports_one_network(tmp_path):
    """scripts/gluoncv_survey.py on one small network: a row that says built and ran, and the JSON."""
    import importlib.util
    if importlib.util.find_spec("gluoncv") is None:  # (importing it needs the alias: only look for it)
        pytest.skip("GluonCV is not installed")
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "gluoncv_survey.py"), "--timeout", "120",
                        "--json", str(out), "cifar_resnet20_v1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(x["model"], x["built"], x["forward"], x["result"]) for x in rows] == [
        ("cifar_resnet20_v1", True, True, "1x10")]
    assert "1 networks: 1 built, 1 ran forward" in r.stdout


def test_conv_kwargs_are_mxnets_and_steer_the_layer():
    """MXNet 1.9.1's conv layers keep the operator's arguments in ``_kwargs`` and read them at every call; GluonCV's
    SSD-300 ResNet-34 edits ``conv._kwargs['stride']`` after building (the dicts below are MXNet 1.9.1's own)."""
    from dnnbind.gluon import nn
    assert nn.Conv2D(4, 3, strides=2, padding=1)._kwargs == {
        "kernel": (3, 3), "stride": (2, 2), "dilate": (1, 1), "pad": (1, 1), "num_filter": 4, "num_group": 1,
        "no_bias": False, "layout": "NCHW"}
    assert nn.Conv2DTranspose(4, 3, strides=2, output_padding=1)._kwargs["adj"] == (1, 1)
    conv = nn.Conv2D(4, 3, strides=2, padding=1, in_channels=2)
    conv.initialize()
    x = dnnbind.nd.array(np.random.default_rng(0).standard_normal((1, 2, 8, 8)))
    assert conv(x).shape == (1, 4, 4, 4)
    conv._kwargs["stride"] = (1, 1)
    y = conv(x)
    assert y.shape == (1, 4, 8, 8)
    want = dnnbind.nd.Convolution(x, conv.weight.data(), conv.bias.data(), kernel=(3, 3), stride=(1, 1), pad=(1, 1),
                                  num_filter=4)
    np.testing.assert_allclose(y.asnumpy(), want.asnumpy(), rtol=1e-6)


def test_reflection_pad2d_as_mxnet():
    """nn.ReflectionPad2D (GluonCV's monodepth2 decoders): MXNet 1.9.1 gives shape (2, 3, 8, 9), sum 25704 and the
    prefix reflectionpad2d0_ for this input; the values are numpy's reflect padding."""
    from dnnbind.gluon import nn
    x = np.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    with dnnbind.symbol.NameManager():
        m = nn.ReflectionPad2D(2)
    y = m(nd.array(x)).asnumpy()
    assert m.prefix == "reflectionpad2d0_" and y.shape == (2, 3, 8, 9) and float(y.sum()) == 25704.0
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect"))
    with pytest.raises(ValueError, match="ReflectionPad2D: padding"):
        nn.ReflectionPad2D((1, 2))
