"""MXNet's region-pooling, resizing and indexing operators (ops/defs/resize.py, roi.py, gather_scatter.py) against
the real MXNet 1.9.1: fixtures/mxnet_region_ops/<op>.npz, written by fixtures/make_mxnet_region_ops.py (outputs and
input gradients through mx.autograd). The cpu twin must match them; the GPU lowering must match the twin. Central
differences of every entry's samples run in tests/test_opdefs.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind.ops.defs import roi as roi_defs
from dnnbind.ops.opdef import Call, Grads
from dnnbind.ops.reference import roi as roi_ref
from tests._helpers import assert_close

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_region_ops")
OPS = ["_contrib_BilinearResize2D", "_contrib_AdaptiveAvgPooling2D", "_contrib_ROIAlign", "ROIPooling",
       "_contrib_PSROIPooling", "gather_nd",
       "scatter_nd", "_contrib_boolean_mask", "_contrib_index_copy"]
INDEX_INPUTS = {"rois", "indices", "index", "index_vector"}


def _cases(op: str):
    f = np.load(os.path.join(HERE, f"{op}.npz"))
    out = []
    for i in range(int(f["count"])):
        inputs = {k[len(f"{i}_in_"):]: f[k] for k in f.files if k.startswith(f"{i}_in_")}
        grads = {k[len(f"{i}_d_"):]: f[k] for k in f.files if k.startswith(f"{i}_d_")}
        out.append((inputs, eval(str(f[f"{i}_params"])), f[f"{i}_dy"], f[f"{i}_y"], grads))
    return out


def _fn(op: str):
    return getattr(nd.contrib, op[len("_contrib_"):]) if op.startswith("_contrib_") else getattr(nd, op)


def _run(op, inputs, params, dy, device, dtype=None):
    """(y, {input: gradient}) of dnnbind's op on ``device``; float inputs cast to ``dtype`` when given, index inputs
    keep theirs unless they are floats (rois are the data's type)."""
    xs = {}
    for k, v in inputs.items():
        t = v.dtype if dtype is None or (k in INDEX_INPUTS and v.dtype.kind != "f") else dtype
        xs[k] = nd.array(v, ctx=device, dtype=t)
        if k not in INDEX_INPUTS:
            xs[k].attach_grad()
    with autograd.record():
        y = _fn(op)(**xs, **params)
    y.backward(nd.array(dy, ctx=device, dtype=y.dtype))
    return y.numpy(), {k: v.grad.numpy() for k, v in xs.items() if k not in INDEX_INPUTS}


@pytest.mark.parametrize("op", OPS)
def test_cpu_twin_matches_mxnet(op):
    for n, (inputs, params, dy, y_mx, grads_mx) in enumerate(_cases(op)):
        y, grads = _run(op, inputs, params, dy, dnnbind.cpu())
        assert y.shape == y_mx.shape, f"{op} case {n} {params}: shape {y.shape}, MXNet {y_mx.shape}"
        assert_close(y, y_mx, rtol=1e-5, atol=1e-6, name=f"{op} case {n} {params}")
        for k, g in grads_mx.items():
            assert_close(grads[k], g, rtol=1e-5, atol=1e-6, name=f"{op} case {n} {params} gradient of {k}")


def test_psroi_pooling_gradient_by_central_differences():
    rng = np.random.default_rng(0)
    for arrays, params in roi_defs._psroi_samples(rng):
        p = roi_defs._psroi_params(dict({"group_size": 0}, **params))
        x, rois = arrays["data"], arrays["rois"]
        w = rng.uniform(0.5, 1.5, roi_ref.psroi_pool(x, rois, p).shape)
        dx = roi_ref.psroi_pool_backward(w, rois, p, x.shape)
        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = 1e-6
            num[i] = ((roi_ref.psroi_pool(x + e, rois, p) - roi_ref.psroi_pool(x - e, rois, p)) * w).sum() / 2e-6
        assert_close(dx, num, rtol=1e-5, atol=1e-7, name=f"PSROIPooling {params}")


def test_composed_gpu_lowerings_run_on_the_cpu_backend_too():
    """The resizing and indexing GPU lowerings are compositions of table ops, which run on either backend: on the
    cpu they must give the twin's results (the kernels of the ROI ops need a GPU: test_gpu_lowering_matches_twin)."""
    from dnnbind.ops.opdef import DEFS
    rng = np.random.default_rng(1)
    for op in ("_contrib_BilinearResize2D", "_contrib_AdaptiveAvgPooling2D", "gather_nd", "scatter_nd",
               "_contrib_boolean_mask", "_contrib_index_copy"):
        d = DEFS[op]
        for arrays, params in d.samples(rng):
            xs = [nd.array(v, dtype="float64") for v in arrays.values()]
            p = nd.REGISTRY[op].schema.parse(params)
            c = Call(d.prepare(p, *xs), p, dnnbind.cpu(), True)
            y, saved = d.cpu.forward(c, *[x.numpy() for x in xs])
            yg, saved_g = d.gpu.forward(c, *xs)
            assert_close(yg.numpy(), y, rtol=1e-12, atol=1e-12, name=f"{op} {params}")
            dy = rng.standard_normal(y.shape)
            grads = Grads(tuple(k not in d.nograd for k in arrays), (None,) * len(xs), False)
            want = d.cpu.backward(c, saved, grads, dy)
            got = d.gpu.backward(c, saved_g, grads, nd.array(dy, dtype="float64"))
            for k, (a, b) in enumerate(zip(got, want)):
                if b is not None:
                    assert_close(a.numpy(), b, rtol=1e-12, atol=1e-12, name=f"{op} {params} gradient {k}")


# bad input: refused before running, naming the op, the argument and the shapes ------------------------------------

def _x(*shape):
    return nd.array(np.random.default_rng(0).standard_normal(shape))


@pytest.mark.parametrize("call,match", [
    (lambda: nd.contrib.BilinearResize2D(_x(2, 3, 4), height=2, width=2),
     r"BilinearResize2D: data must be 4-D.*\(2, 3, 4\)"),
    (lambda: nd.contrib.BilinearResize2D(_x(1, 1, 4, 4), scale_height=2.0), "needs scale_width"),
    (lambda: nd.contrib.BilinearResize2D(_x(1, 1, 4, 4), mode="odd_scale"), "odd_scale' needs scale_height"),
    (lambda: nd.contrib.BilinearResize2D(_x(1, 1, 4, 4), height=0), "Parameter height should be greater equal to 1"),
    (lambda: nd.contrib.BilinearResize2D(_x(1, 1, 4, 4), _x(1, 1, 2, 2)), "like.*mode is 'size'"),
    (lambda: nd.contrib.AdaptiveAvgPooling2D(_x(1, 1, 4, 4), output_size=(1, 2, 3)), "output_size must be"),
    (lambda: nd.contrib.ROIAlign(_x(1, 2, 4, 4), _x(3, 4), pooled_size=(2, 2), spatial_scale=1.0),
     r"ROIAlign: rois must be 2-D of shape \(R, 5\).*\(3, 4\)"),
    (lambda: nd.contrib.ROIAlign(_x(1, 3, 4, 4), _x(3, 5), pooled_size=(2, 2), spatial_scale=1.0,
                                 position_sensitive=True), "Input channels should be divided"),
    (lambda: nd.contrib.ROIAlign(_x(1, 3, 4, 4), _x(3, 5), pooled_size=(2, 2), spatial_scale=2.0),
     "spatial_scale should be in range"),
    (lambda: nd.ROIPooling(_x(1, 3, 4, 4), _x(3, 5), pooled_size=(2,), spatial_scale=1.0),
     "pooled_size has wrong dimensions"),
    (lambda: nd.ROIPooling(_x(1, 3, 4, 4), nd.array(np.zeros((3, 5)), dtype="float64"), pooled_size=(2, 2),
                           spatial_scale=1.0), "rois is float64 but data is float32"),
    (lambda: nd.gather_nd(_x(3, 4), nd.array([0, 1])), r"gather_nd requires index tensor to have at least 2 dim"),
    (lambda: nd.gather_nd(_x(3, 4), nd.array([[0], [1], [2]])), r"index M = 3 axes, but data \(3, 4\)"),
    (lambda: nd.gather_nd(_x(3, 4), nd.array([[3], [0]])), r"index 3.0 .* out of bounds for axis 0 of size 3"),
    (lambda: nd.scatter_nd(_x(2), nd.array([[0, 1]]), shape=(3, 2)), r"data must be \(2, 2\)"),
    (lambda: nd.scatter_nd(_x(2), nd.array([[0, -1]]), shape=(3,)), r"index -1.0 .* allowed \[0, 2\]"),
    (lambda: nd.contrib.boolean_mask(_x(3, 2), nd.array([1, 0])), r"index must be 1-D with one entry per row.*\(3,\)"),
    (lambda: nd.contrib.boolean_mask(_x(3, 2), nd.array([1, 0, 1]), axis=1), "axis must be 0"),
    (lambda: nd.contrib.index_copy(_x(3, 2), nd.array([0, 1]), _x(2, 3)), r"new_tensor's rows must have old_tensor"),
    (lambda: nd.contrib.index_copy(_x(3, 2), nd.array([0, 3]), _x(2, 2)), r"index 3.0 .*old_tensor \(3, 2\)"),
])
def test_bad_input_is_refused_with_context(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call().numpy()


def test_roi_align_aligned_refuses_empty_regions_on_the_cpu():
    rois = nd.array([[0, 2, 2, 2, 5]])
    with pytest.raises(ValueError, match=r"aligned=True every region needs a positive width.*rois\[0\]"):
        nd.contrib.ROIAlign(_x(1, 2, 6, 6), rois, pooled_size=(2, 2), spatial_scale=1.0, aligned=True)


def test_boolean_mask_shape_is_the_masks_count_and_symbol_inference_leaves_it_unknown():
    y = nd.contrib.boolean_mask(_x(4, 3), nd.array([0, 2, 0, 1]))
    assert y.shape == (2, 3)
    s = dnnbind.symbol.contrib.boolean_mask(dnnbind.symbol.var("d"), dnnbind.symbol.var("i"))
    _, outs, _ = s.infer_shape_partial(d=(4, 3), i=(4,))
    assert outs == [(0, 3)] or outs == [None]


def test_roi_pooling_symbol_has_mxnets_hidden_maxidx_output():
    s = dnnbind.symbol.ROIPooling(dnnbind.symbol.var("data"), dnnbind.symbol.var("rois"), pooled_size=(2, 2),
                                  spatial_scale=1.0, name="pool")
    assert s.list_outputs() == ["pool_output"]
    assert s.infer_shape(data=(2, 3, 8, 8), rois=(5, 5))[1] == [(5, 3, 2, 2)]


# gpu: the lowering against the twin on MXNet's fixture inputs ----------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_lowering_matches_twin(op, dtype, gpu):
    tol = 2e-5 if dtype == "float32" else 1e-10
    for n, (inputs, params, dy, _, _) in enumerate(_cases(op)):
        y_c, g_c = _run(op, inputs, params, dy, dnnbind.cpu(), dtype)
        y_g, g_g = _run(op, inputs, params, dy, gpu, dtype)
        assert_close(y_g, y_c, rtol=tol, atol=tol, name=f"{op} case {n} {params} ({dtype})")
        for k in g_c:
            assert_close(g_g[k], g_c[k], rtol=tol * 10, atol=tol * 10, name=f"{op} case {n} gradient of {k}")


@pytest.mark.gpu
def test_gpu_float16_roi_align_runs_as_float32(gpu):
    inputs, params, dy, _, _ = _cases("_contrib_ROIAlign")[0]
    y32, _ = _run("_contrib_ROIAlign", inputs, params, dy, gpu, "float32")
    y16, _ = _run("_contrib_ROIAlign", inputs, params, dy, gpu, "float16")
    assert_close(y16.astype(np.float32), y32, rtol=2e-3, atol=2e-3, name="ROIAlign float16")
