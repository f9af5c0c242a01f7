"""GPU tests of BatchNormAddRelu (marker ``gpu``; the CPU tests and the shared helpers are in test_bn_add_relu.py,
split off to keep each file short).

- cuDNN's fused op (NHWC float16, float32 statistics) against the numpy twin in float64 on the same rounded inputs.
  Tolerances: y within 2e-3 relative + 4e-3 * max|y| (FACTS.md measured ~3e-3 against an FP32 reference at
  32x64x14x14); save_mean, save_inv_std and the running statistics 1e-3 relative (+ 1e-3 absolute for means);
  dz exactly dy where y > 0 and 0 elsewhere; dx 5e-3 * max|dx| (+ 5e-3 relative); dgamma and dbeta 2e-3 relative +
  2e-3 * max. Inputs are kept clear of the ReLU's kink (|BN(x) + z| >= 0.1, by moving z), so every path agrees on
  the mask and a mask flip cannot pass for a rounding error.
- nd.BatchNormAddRelu: the fused path calls cudnnBatchNormalizationForwardTrainingEx / BackwardEx (dnnbind.trace)
  and agrees with the composed path; the composed paths (float32, NCHW, C not a multiple of 4) against float64.
- A hybridized Block holding gluon.nn.BatchNormAddRelu equals its eager twin over a few training steps.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.ops import batchnorm_fused as B
from dnnbind.ops.reference import batchnorm_fused as R
from tests._helpers import assert_close
from tests.test_bn_add_relu import F16, F32, _formula, _inputs

pytestmark = pytest.mark.gpu
EX = ("cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationBackwardEx")


def _clear_of_zero(x, z, gamma, beta, eps, axis=-1, margin=0.1):
    """z moved so that |BN(x) + z| >= margin everywhere (BN with x's batch statistics; z does not change them)."""
    ax = axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != ax)
    shape = [1] * x.ndim
    shape[ax] = -1
    x64 = x.astype(np.float64)
    bn = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(x64.var(axis=axes, keepdims=True) + eps) \
        * gamma.reshape(shape) + beta.reshape(shape)
    pre = bn + z.astype(np.float64)
    z2 = z.astype(np.float64) + np.where(np.abs(pre) < margin, np.where(pre >= 0, 2 * margin, -2 * margin), 0.0)
    return z2.astype(z.dtype)


def _host(shape, dtype, axis=-1, seed=0, eps=1e-5):
    x, z, gamma, beta, rm, rv = _inputs(shape, dtype, axis=axis, seed=seed)
    return x, _clear_of_zero(x, z, gamma, beta, eps, axis), gamma, beta, rm, rv


def _dev(arrays, ctx):
    return [nd.array(a, ctx=ctx, dtype=a.dtype) for a in arrays]


@pytest.mark.parametrize("shape", [(2, 4, 4, 4), (1, 5, 7, 8), (8, 6, 6, 64), (32, 14, 14, 64)])
def test_gpu_fused_op_against_float64_twin(gpu, shape):
    host = _host(shape, F16, seed=40)
    dy = np.random.RandomState(41).randn(*shape).astype(F16)
    f64 = [a.astype(np.float64) for a in host]
    rm64, rv64 = f64[4].copy(), f64[5].copy()
    dev = _dev(host, gpu)
    for step in range(2):  # the running statistics after two steps (biased variance)
        y, sm, si, reserve = B.batchnorm_add_relu_forward_training(*dev, 0.9, 1e-5)
        ey, esm, esi, _ = R.batchnorm_add_relu_forward_training(*f64[:4], rm64, rv64, 0.9, 1e-5)
        assert y.dtype == F16 and sm.dtype == si.dtype == F32 and reserve.dtype == np.uint8
        assert_close(y, ey, 2e-3, 4e-3 * np.abs(ey).max(), f"y step {step}")
        assert_close(sm, esm, 1e-3, 1e-3, "save_mean")
        assert_close(si, esi, 1e-3, 0, "save_inv_std")
        assert_close(dev[4], rm64, 1e-3, 1e-3, "running_mean")
        assert_close(dev[5], rv64, 1e-3, 0, "running_var (biased, MXNet's convention)")
    dx, dz, dg, db = B.batchnorm_add_relu_backward(dev[0], y, nd.array(dy, ctx=gpu, dtype=F16), dev[2], dev[3], sm,
                                                   si, reserve, 1e-5)
    yh = y.asnumpy()
    assert np.array_equal(dz.asnumpy(), np.where(yh > 0, dy, 0).astype(F16)), "dz is dy masked by the ReLU"
    edx, _, edg, edb = R.batchnorm_add_relu_backward(f64[0], yh.astype(np.float64), dy.astype(np.float64), f64[2],
                                                     f64[3], esm, esi, np.zeros(0, np.uint8), 1e-5)
    assert dx.dtype == F16 and dg.dtype == db.dtype == F32
    assert_close(dx, edx, 5e-3, 5e-3 * np.abs(edx).max(), "dx")
    assert_close(dg, edg, 2e-3, 2e-3 * np.abs(edg).max(), "dgamma")
    assert_close(db, edb, 2e-3, 2e-3 * np.abs(edb).max(), "dbeta")


def _nd_step(gpu, host, dy, **kw):
    """nd.BatchNormAddRelu forward (recording) and backward under a trace: (results, [(op, library function)])."""
    xs = _dev(host[:4], gpu)
    for a in xs:
        a.attach_grad()
    mm, mv = _dev(host[4:], gpu)
    with mx.trace() as t:
        with autograd.record():
            y = nd.BatchNormAddRelu(*xs, mm, mv, fix_gamma=False, **kw)
        y.backward(nd.array(dy, ctx=gpu, dtype=dy.dtype))
    return [y, mm, mv] + [a.grad for a in xs], [(r.op, r.function) for r in t.records]


def _fused_ops(calls) -> list:
    return [c for c in calls if c[0].startswith("batchnorm_add_relu")]


def test_gpu_nd_fused_path_calls_the_fused_functions_and_agrees_with_composed(gpu):
    shape = (8, 6, 6, 16)
    host = _host(shape, F16, seed=50, eps=1e-3)
    dy = np.random.RandomState(51).randn(*shape).astype(F16)
    fused, calls = _nd_step(gpu, host, dy, axis=3)
    bn_calls = [(op, f) for op, f in calls if f.startswith("cudnnBatchNormalization")]
    assert bn_calls == list(zip(("batchnorm_add_relu_forward_training", "batchnorm_add_relu_backward"), EX)), calls
    composed, calls = _nd_step(gpu, host, dy, axis=-1, cudnn_off=True)  # cudnn_off: the separate ops
    # the composed path's BatchNorm: channels-last float16 takes the Ex call's plain-BatchNorm form
    assert not _fused_ops(calls) and any(op.startswith(("batchnorm_forward", "batchnorm_nhwc_forward"))
                                         for op, _ in calls), calls
    tols = [(2e-3, 4e-3), (1e-3, 1e-3), (1e-3, 1e-3), (5e-3, 5e-3), (0, 0), (2e-3, 2e-3), (2e-3, 2e-3)]
    for i, (a, b, (rtol, mtol)) in enumerate(zip(fused, composed, tols)):
        b = b.asnumpy()
        assert_close(a, b, rtol, mtol * max(1.0, float(np.abs(b).max())), ["y", "mm", "mv", "dx", "dz", "dg", "db"][i])


@pytest.mark.parametrize("dtype, shape, axis", [(F32, (4, 8, 5, 5), 1), (F32, (4, 5, 5, 8), 3), (F16, (4, 8, 5, 5), 1),
                                                (F16, (4, 5, 5, 6), -1), (F16, (4, 5, 8), 1)])
def test_gpu_composed_paths_against_float64(gpu, dtype, shape, axis):
    """float32 data, channels on axis 1, C % 4 != 0, 3-D: no fused call; training and predict mode vs float64."""
    host = _host(shape, dtype, axis=axis, seed=60, eps=1e-3)
    dy = np.random.RandomState(61).randn(*shape).astype(dtype)
    got, calls = _nd_step(gpu, host, dy, axis=axis)
    assert not _fused_ops(calls), calls
    ax = axis % len(shape)
    perm = [i for i in range(len(shape)) if i != ax] + [ax]  # channels last, then 4-D for the twin
    nhwc = [np.transpose(a, perm).astype(np.float64) for a in (host[0], host[1], dy)]
    if len(shape) == 3:
        nhwc = [a[:, :, None, :] for a in nhwc]
    rm, rv = host[4].astype(np.float64), host[5].astype(np.float64)
    g, b = host[2].astype(np.float64), host[3].astype(np.float64)
    ey, esm, esi, res = R.batchnorm_add_relu_forward_training(nhwc[0], nhwc[1], g, b, rm, rv, 0.9, 1e-3)
    edx, edz, edg, edb = R.batchnorm_add_relu_backward(nhwc[0], ey, nhwc[2], g, b, esm, esi, res, 1e-3)
    inv = np.argsort(perm)
    back = [np.transpose(a.reshape(np.transpose(host[0], perm).shape), inv) for a in (ey, edx, edz)]
    t32 = dtype == F32
    for a, e, name, (rtol, mtol) in ((got[0], back[0], "y", (1e-4, 1e-4) if t32 else (2e-3, 4e-3)),
                                     (got[1], rm, "moving_mean", (1e-4, 1e-4) if t32 else (1e-3, 1e-3)),
                                     (got[2], rv, "moving_var", (1e-4, 1e-4) if t32 else (1e-3, 1e-3)),
                                     (got[3], back[1], "d data", (1e-4, 1e-4) if t32 else (5e-3, 5e-3)),
                                     (got[4], back[2], "d addend", (1e-6, 0) if t32 else (1e-3, 0)),
                                     (got[5], edg, "d gamma", (1e-4, 1e-4) if t32 else (2e-3, 2e-3)),
                                     (got[6], edb, "d beta", (1e-4, 1e-4) if t32 else (2e-3, 2e-3))):
        assert_close(a, e, rtol, mtol * max(1.0, float(np.abs(e).max())), name)
    x, z, *_ = _dev(host, gpu)
    mm, mv = _dev(host[4:], gpu)
    y = nd.BatchNormAddRelu(x, z, *_dev(host[2:4], gpu), mm, mv, fix_gamma=False, axis=axis)  # predict mode
    expect = _formula(host[0], host[1].astype(np.float64), g, b, 1e-3, axis, mean=host[4], var=host[5])
    assert_close(y, expect, 1e-4 if t32 else 2e-3, (1e-4 if t32 else 4e-3) * np.abs(expect).max(), "predict")


class _Net(gluon.nn.Block):
    def __init__(self):
        super().__init__()
        self.bn = gluon.nn.BatchNormAddRelu(axis=3, in_channels=16)

    def forward(self, x, z):
        return self.bn(x, z) * 2.0


def test_gpu_hybridized_block_equals_eager(gpu):
    """The same calls replayed: equal to the eager Block within one float16 rounding (in practice bitwise)."""
    nets = []
    for _ in range(2):
        net = _Net()
        net.initialize(ctx=gpu)
        net.cast("float16")
        assert net.bn.gamma.data().dtype == F32
        nets.append((net, gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})))
    nets[1][0].hybridize()
    rng = np.random.default_rng(70)
    for step in range(5):  # warm-up, record (again after the Trainer packs its Parameters), replays
        bn = nets[0][0].bn
        x = (rng.standard_normal((8, 6, 6, 16)) * 2 + 1).astype(F16)
        z = _clear_of_zero(x, rng.standard_normal(x.shape).astype(F16), bn.gamma.data().asnumpy(),
                           bn.beta.data().asnumpy(), 1e-5)
        got = []
        for net, trainer in nets:
            xx = nd.array(x, ctx=gpu, dtype=F16)
            xx.attach_grad()
            with autograd.record():
                out = net(xx, nd.array(z, ctx=gpu, dtype=F16))
            out.backward()
            trainer.step(8)
            got.append([out.asnumpy(), xx.grad.asnumpy()] +
                       [p.data().asnumpy() for p in net.collect_params().values()])
        for a, b in zip(*got):
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-3,
                                       err_msg=f"step {step}")
    assert nets[1][0]._cached.replays >= 2, "the later steps must be replays"
