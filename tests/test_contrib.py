"""``nd.contrib.arange_like``, ``batch_dot``'s transposes and ``gluon.utils.clip_global_norm`` against the real MXNet
1.9.1 (tests/fixtures/mxnet_contrib, written by tests/fixtures/make_mxnet_contrib.py), on the cpu and, marked gpu,
on the GPU (clip_global_norm also with arrays on several devices)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind.gluon import utils
from tests._helpers import assert_close

F = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_contrib", "contrib.npz"))
N_ARANGE, N_BDOT, N_CLIP = (int(n) for n in F["counts"])
CTX = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _device(ctx, request):
    return dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")


# -- arange_like ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx", CTX)
@pytest.mark.parametrize("i", range(N_ARANGE))
def test_arange_like_matches_mxnet(i, ctx, request):
    shape, dtype, params = tuple(F[f"arange_shape{i}"]), str(F[f"arange_dtype{i}"]), eval(str(F[f"arange_params{i}"]))
    y = nd.contrib.arange_like(nd.zeros(shape, ctx=_device(ctx, request), dtype=dtype), **params)
    want = F[f"arange_y{i}"]
    assert y.dtype == want.dtype and y.shape == want.shape, (params, y.dtype, y.shape)
    assert_close(y, want, rtol=0, atol=0, name=f"arange_like {shape} {dtype} {params}")


def test_arange_like_ctx_out_and_gradient():
    x = nd.ones((2, 3))
    assert nd.contrib.arange_like(x, ctx="cpu(0)").device == dnnbind.cpu()
    out = nd.zeros((3,))
    assert nd.contrib.arange_like(x, axis=1, start=1, out=out) is out
    assert_close(out, [1, 2, 3], rtol=0, atol=0)
    x.attach_grad()
    with autograd.record():
        y = nd.contrib.arange_like(x) * x
    y.backward()
    assert_close(x.grad, np.arange(6.0).reshape(2, 3), rtol=0, atol=0, name="gradient through the product only")


def test_arange_like_refusals():
    x = nd.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"arange_like: cannot handle axis 3 for data of shape \(2, 3, 4\)"):
        nd.contrib.arange_like(x, axis=3)
    with pytest.raises(ValueError, match=r"arange_like: repeat must be >= 1, got 0"):  # MXNet dies of SIGFPE
        nd.contrib.arange_like(x, repeat=0)
    with pytest.raises(TypeError, match="arange_like: data must be an NDArray"):
        nd.contrib.arange_like(np.zeros(3))


def test_mxnet_alias_resolves_nd_contrib(alias):
    import mxnet as mx
    from mxnet.nd.contrib import arange_like
    assert mx.nd.contrib.arange_like is arange_like is nd.contrib.arange_like
    assert_close(mx.nd.contrib.arange_like(mx.nd.zeros((2, 2))), [[0, 1], [2, 3]], rtol=0, atol=0)


# -- batch_dot's transposes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx", CTX)
@pytest.mark.parametrize("i", range(N_BDOT))
def test_batch_dot_transposes_match_mxnet_and_numpy(i, ctx, request):
    dev = _device(ctx, request)
    a, b, dy = F[f"bdot_a{i}"], F[f"bdot_b{i}"], F[f"bdot_dy{i}"]
    ta, tb = (bool(t) for t in F[f"bdot_t{i}"])
    aa, bb = nd.array(a, ctx=dev), nd.array(b, ctx=dev)
    aa.attach_grad()
    bb.attach_grad()
    with autograd.record():
        y = nd.batch_dot(aa, bb, transpose_a=ta, transpose_b=tb)
    y.backward(nd.array(dy, ctx=dev))
    what = f"batch_dot transpose_a={ta} transpose_b={tb}"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.matmul(a64.transpose(0, 2, 1) if ta else a64, b64.transpose(0, 2, 1) if tb else b64)
    assert_close(y, want, rtol=1e-5, atol=1e-5, name=f"{what} vs numpy")
    assert_close(y, F[f"bdot_y{i}"], rtol=1e-5, atol=1e-5, name=f"{what} vs MXNet")
    assert_close(aa.grad, F[f"bdot_da{i}"], rtol=1e-5, atol=1e-5, name=f"{what} lhs gradient")
    assert_close(bb.grad, F[f"bdot_db{i}"], rtol=1e-5, atol=1e-5, name=f"{what} rhs gradient")


# -- clip_global_norm --------------------------------------------------------------------------------------------

def _clip_case(i):
    n = int(F[f"clip_n{i}"])
    return ([F[f"clip_in{i}_{j}"] for j in range(n)], float(F[f"clip_max{i}"]), F[f"clip_norm{i}"],
            bool(F[f"clip_warned{i}"]), [F[f"clip_out{i}_{j}"] for j in range(n)], F[f"clip_lazy{i}"])


def _check_clip(i, devices):
    host, max_norm, norm_mx, warned_mx, out_mx, lazy_mx = _clip_case(i)
    arrays = [nd.array(h, ctx=devices[j % len(devices)]) for j, h in enumerate(host)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        norm = utils.clip_global_norm(arrays, max_norm)
    assert type(norm) is np.float32, type(norm)  # MXNet returns asscalar(): a numpy float32
    assert_close(np.array([norm]), np.array([norm_mx]), rtol=1e-6, atol=0, name=f"case {i} norm")
    assert any("nan or inf is detected" in str(w.message) for w in caught) == warned_mx
    for j, (a, want) in enumerate(zip(arrays, out_mx)):
        assert a.device == devices[j % len(devices)]
        assert_close(a, want, rtol=1e-6, atol=1e-7, name=f"case {i} array {j} clipped")
    lazy = utils.clip_global_norm([nd.array(h, ctx=devices[j % len(devices)]) for j, h in enumerate(host)],
                                  max_norm, check_isfinite=False)
    assert isinstance(lazy, nd.NDArray) and lazy.shape == (1,) and lazy.device == devices[0]
    assert_close(lazy, lazy_mx, rtol=1e-6, atol=0, name=f"case {i} lazy norm")


@pytest.mark.parametrize("i", range(N_CLIP))
def test_clip_global_norm_matches_mxnet(i):
    _check_clip(i, [dnnbind.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(N_CLIP))
def test_clip_global_norm_on_gpus_and_mixed_devices(i, gpu):
    _check_clip(i, [gpu])
    _check_clip(i, [gpu, dnnbind.cpu()])  # the norm gathered on the first array's device
    _check_clip(i, [dnnbind.cpu(), gpu])
    if dnnbind.num_gpus() > 1:
        _check_clip(i, [dnnbind.gpu(0), dnnbind.gpu(1)])


def test_clip_global_norm_float64_and_refusals():
    a = nd.array([3.0, 4.0], dtype="float64")  # MXNet 1.9.1 fails here (its scale is concatenated with float32)
    norm = utils.clip_global_norm([a], 1.0)
    assert type(norm) is np.float64 and norm == 5.0
    assert_close(a, [0.6, 0.8], rtol=1e-8, atol=0)  # (scaled by 1 / (5 + 1e-8))
    with pytest.raises(ValueError, match="non-empty list"):
        utils.clip_global_norm([], 1.0)
    with pytest.raises(TypeError, match=r"arrays\[1\] must be an NDArray"):
        utils.clip_global_norm([a, np.ones(2)], 1.0)
