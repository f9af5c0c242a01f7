"""Batch normalization: the numpy twin, the cuDNN ops (GPU tests), nd.BatchNorm and gluon.nn.BatchNorm.

CPU tests compare with a float64 reference written here and with literal outputs of MXNet 1.9.1 (the
``MX_*`` constants, produced on the CPU by /tmp/mx38 — mxnet==1.9.1 on Python 3.8 — with a throwaway script:
inputs from ``np.random.RandomState(0)`` as in ``_mx_inputs``, forward + backward inside autograd.record()).
GPU tests (``@pytest.mark.gpu``) hold every cuDNN op to the twin at float32 1e-5 relative.
"""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, gluon, nd
from dnnbind.ops import batchnorm as B
from dnnbind.ops.reference import batchnorm as R
from tests._helpers import assert_close, numerical_grad

CPU = mx.cpu()
SHAPES = [(6, 3), (4, 2, 5), (3, 4, 3, 5), (2, 3, 2, 3, 2)]


def _a(v, dtype=np.float32):
    return nd.array(np.asarray(v, dtype=dtype), ctx=CPU, dtype=dtype)


# -- float64 reference ----------------------------------------------------------------------------------------

def _ref_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    x = x.astype(np.float64)
    return x.mean(axis=axes), x.var(axis=axes), axes


def _ref_bn(x, gamma, beta, mean, var, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x.astype(np.float64) - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape)
            + beta.reshape(shape))


def _inputs(shape, dtype, seed=0):
    rs = np.random.RandomState(seed)
    c = shape[1]
    x = (rs.randn(*shape) * 2 + rs.randn(1, c, *([1] * (len(shape) - 2))) * 3).astype(dtype)
    gamma, beta = rs.uniform(0.5, 2, c).astype(dtype), rs.randn(c).astype(dtype)
    rm, rv = rs.randn(c).astype(dtype), rs.uniform(0.5, 2, c).astype(dtype)
    return x, gamma, beta, rm, rv


# -- the numpy twin -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_twin_training_forward_and_running_stats(shape, dtype):
    x0, gamma, beta, rm, rv = _inputs(shape, dtype)
    momentum, eps = 0.8, 1e-4
    exp_rm, exp_rv = rm.astype(np.float64), rv.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for step in range(3):  # running stats after several steps vs the formula
        x = (x0 * (1 + 0.5 * step) + step).astype(dtype)
        y, save_mean, save_inv = R.batchnorm_forward_training(x, gamma, beta, rm, rv, momentum, eps)
        mean, var, _ = _ref_stats(x)
        assert y.dtype == save_mean.dtype == save_inv.dtype == dtype
        assert_close(y, _ref_bn(x, gamma, beta, mean, var, eps), tol, tol, "y")
        assert_close(save_mean, mean, tol, tol, "save_mean")
        assert_close(save_inv, 1 / np.sqrt(var + eps), tol, tol, "save_inv_std")
        exp_rm = momentum * exp_rm + (1 - momentum) * mean
        exp_rv = momentum * exp_rv + (1 - momentum) * var  # biased variance (MXNet), not cuDNN's unbiased
        assert_close(rm, exp_rm, tol, tol, f"running_mean step {step}")
        assert_close(rv, exp_rv, tol, tol, f"running_var step {step}")


@pytest.mark.parametrize("shape", SHAPES)
def test_twin_inference(shape):
    x, gamma, beta, rm, rv = _inputs(shape, np.float32, seed=1)
    y = R.batchnorm_forward_inference(x, gamma, beta, rm, rv, 1e-3)
    assert_close(y, _ref_bn(x, gamma, beta, rm.astype(np.float64), rv.astype(np.float64), 1e-3), 1e-5, 1e-6, "y")


@pytest.mark.parametrize("shape", [(5, 2), (3, 2, 3), (2, 3, 2, 2)])
def test_twin_backward_by_central_differences(shape):
    x, gamma, beta, rm, rv = _inputs(shape, np.float64, seed=2)
    dy = np.random.RandomState(3).randn(*shape)
    eps = 1e-3
    _, save_mean, save_inv = R.batchnorm_forward_training(x, gamma, beta, rm.copy(), rv.copy(), 0.9, eps)
    dx, dgamma, dbeta = R.batchnorm_backward(x, dy, gamma, save_mean, save_inv, eps)

    def f(xv, g=gamma, b=beta):
        mean, var, _ = _ref_stats(xv)
        return _ref_bn(xv, g, b, mean, var, eps)

    assert_close(dx, numerical_grad(f, x, dy), 1e-6, 1e-7, "dx")
    assert_close(dgamma, numerical_grad(lambda g: f(x, g=g), gamma, dy), 1e-6, 1e-7, "dgamma")
    assert_close(dbeta, numerical_grad(lambda b: f(x, b=b), beta, dy), 1e-6, 1e-7, "dbeta")


def test_twin_errors_before_any_work():
    x, gamma, beta, rm, rv = _inputs((4, 3, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"batchnorm_forward_training: gamma has shape \(2,\) but x of shape "
                                         r"\(4, 3, 2, 2\) has 3 channels"):
        R.batchnorm_forward_training(x, gamma[:2], beta, rm, rv)
    with pytest.raises(ValueError, match="batchnorm_forward_inference: var has shape"):
        R.batchnorm_forward_inference(x, gamma, beta, rm, rv[:1])
    with pytest.raises(ValueError, match="2 to 5 axes"):
        R.batchnorm_forward_inference(x.reshape(-1), gamma, beta, rm, rv)
    with pytest.raises(ValueError, match="momentum must be"):
        R.batchnorm_forward_training(x, gamma, beta, rm, rv, momentum=1.5)
    with pytest.raises(ValueError, match="eps must be"):
        R.batchnorm_forward_inference(x, gamma, beta, rm, rv, eps=-1.0)
    with pytest.raises(ValueError, match="at least one value per channel"):
        R.batchnorm_forward_training(x[:0], gamma, beta, rm, rv)
    with pytest.raises(TypeError, match="batchnorm_forward_inference: gamma has dtype float16; expected one of "
                                        "float32"):
        R.batchnorm_forward_inference(x.astype(np.float16), gamma.astype(np.float16), beta, rm, rv)
    with pytest.raises(TypeError, match="batchnorm_forward_training: .*dtype float64 but the data is float32"):
        R.batchnorm_forward_training(x, *(a.astype(np.float64) for a in (gamma, beta, rm, rv)))
    with pytest.raises(ValueError, match=r"batchnorm_backward: shapes differ"):
        R.batchnorm_backward(x, x[:2], gamma, rm, rv)


def _half_inputs(shape, seed):
    """float16 data, float32 parameters and statistics (mixed precision), and float64 copies of all of them."""
    x, gamma, beta, rm, rv = _inputs(shape, np.float32, seed)
    dy = np.random.RandomState(seed + 1).randn(*shape)
    return (x.astype(np.float16), gamma, beta, rm, rv, dy.astype(np.float16))


def _check_half_against_float64(ops, x, gamma, beta, rm, rv, dy, to_host):
    """ops (the twin or the cuDNN ops) on float16 data against the twin in float64 on the same (rounded) values:
    outputs in float16 within half rounding (2e-3 relative), statistics and parameter gradients in float32."""
    f64 = [np.asarray(to_host(a), np.float64) for a in (x, gamma, beta, rm, rv, dy)]
    rm64, rv64 = f64[3].copy(), f64[4].copy()
    y, sm, si = ops.batchnorm_forward_training(x, gamma, beta, rm, rv, 0.9, 1e-5)
    ey, esm, esi = R.batchnorm_forward_training(f64[0], f64[1], f64[2], rm64, rv64, 0.9, 1e-5)
    assert to_host(y).dtype == np.float16 and to_host(sm).dtype == to_host(si).dtype == np.float32
    np.testing.assert_allclose(to_host(y), ey, rtol=2e-3, atol=4e-3 * np.abs(ey).max())
    np.testing.assert_allclose(to_host(sm), esm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_host(si), esi, rtol=1e-4)
    np.testing.assert_allclose(to_host(rm), rm64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_host(rv), rv64, rtol=1e-4)
    dx, dg, db = ops.batchnorm_backward(x, dy, gamma, sm, si, 1e-5)
    edx, edg, edb = R.batchnorm_backward(f64[0], f64[5], f64[1], esm, esi, 1e-5)
    assert to_host(dx).dtype == np.float16 and to_host(dg).dtype == np.float32
    np.testing.assert_allclose(to_host(dx), edx, rtol=5e-3, atol=5e-3 * np.abs(edx).max())
    np.testing.assert_allclose(to_host(dg), edg, rtol=1e-3, atol=1e-3 * np.abs(edg).max())
    np.testing.assert_allclose(to_host(db), edb, rtol=1e-3, atol=1e-3 * np.abs(edb).max())
    y = ops.batchnorm_forward_inference(x, gamma, beta, rm, rv, 1e-3)
    ey = R.batchnorm_forward_inference(f64[0], f64[1], f64[2], rm64, rv64, 1e-3)
    np.testing.assert_allclose(to_host(y), ey, rtol=2e-3, atol=4e-3 * np.abs(ey).max())


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 5), (2, 1, 3, 4)])
def test_twin_float16_data_with_float32_parameters(shape):
    _check_half_against_float64(R, *_half_inputs(shape, 30), to_host=np.asarray)


# -- the cuDNN binding, host side (no GPU needed) -------------------------------------------------------------

def test_cudnn_prototypes_match_header():
    import nvidia.cudnn

    from dnnbind._lib import cudnn
    base = list(getattr(nvidia.cudnn, "__path__", []))
    header = next((os.path.join(p, "include", "cudnn_ops.h") for p in base
                   if os.path.exists(os.path.join(p, "include", "cudnn_ops.h"))), None)
    if header is None:
        pytest.skip("cudnn_ops.h not shipped with this cuDNN")
    with open(header) as f:
        text = f.read()
    for name in ("cudnnDeriveBNTensorDescriptor", "cudnnBatchNormalizationForwardTraining",
                 "cudnnBatchNormalizationForwardInference", "cudnnBatchNormalizationBackward"):
        m = re.search(name + r"\s*\(([^;]*)\);", text)
        params = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.DOTALL).split(",")
        argtypes = cudnn._TABLE[name][1]
        assert len(argtypes) == len(params), name
        for ctype, decl in zip(argtypes, params):  # doubles are doubles, the mode an int, the rest pointers
            if "double" in decl:
                assert ctype is ctypes.c_double, (name, decl)
            elif "cudnnBatchNormMode_t" in decl:
                assert ctype is ctypes.c_int32, (name, decl)
    assert (cudnn.CUDNN_BATCHNORM_PER_ACTIVATION, cudnn.CUDNN_BATCHNORM_SPATIAL) == (0, 1)
    assert "CUDNN_BATCHNORM_SPATIAL = 1" in text


@pytest.mark.parametrize("shape", SHAPES)
def test_derived_bn_descriptor_is_1c11(shape):
    from dnnbind._lib import cudnn
    from dnnbind.ops import descriptors
    try:
        _, bnd = descriptors.batchnorm(shape, np.dtype(np.float32))
    except OSError as exc:  # the library itself is not loadable here
        pytest.skip(f"cuDNN not loadable: {exc}")
    dt, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    cudnn.lib.cudnnGetTensorNdDescriptor(bnd, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
    assert dt.value == cudnn.CUDNN_DATA_FLOAT
    assert tuple(dims[:nb.value]) == (1, shape[1], 1, 1)


# -- nd.BatchNorm against MXNet 1.9.1 -------------------------------------------------------------------------

def _mx_inputs():
    rs = np.random.RandomState(0)
    x = (rs.rand(2, 3, 2, 2) * 2 - 1).astype(np.float32)
    x2 = (rs.rand(4, 3, 3, 3) * 3 + 1).astype(np.float32)
    x3 = rs.randn(5, 3).astype(np.float32)
    return x, x2, x3


G, BETA = np.array([1.5, 0.5, -1.0], np.float32), np.array([0.1, -0.2, 0.3], np.float32)
MM, MV = [0.1, -0.1, 0.2], [0.5, 2.0, 1.5]
# nd.BatchNorm(x, G, BETA, MM, MV) outside record (defaults: eps 1e-3, fix_gamma=True): y[0, 0] and y[1, 2]
MX_PREDICT_Y00 = [[0.09664743, 0.5667596], [0.24908835, 0.08554191]]
MX_PREDICT_Y12 = [[0.9180752, 0.6251162], [0.07387212, 0.5947047]]
# the same in training (eps=1e-5, momentum 0.9, fix_gamma=False), backward with dy = arange(24)/10 - 1
MX_TRAIN_Y01 = [[-0.5342363, -0.1408741], [-0.5095761, 0.29433006]]
MX_TRAIN_MM = [0.0915864, -0.06750208, 0.22218774]
MX_TRAIN_MV = [0.48004976, 1.8319185, 1.3678648]
MX_TRAIN_DX10 = [[1.3892425, 2.6021178], [0.63092124, 0.94682616]]
MX_TRAIN_DG = [-2.1050594, 0.87015396, 0.56703955]
MX_TRAIN_DB = [-2.0, 1.2, 4.3999996]
# axis=-1 on x.transpose(0, 2, 3, 1), fix_gamma=False, predict: y[0, 0]
MX_AXIS_LAST_Y00 = [[0.09497114, -0.21862422, -0.29366094], [0.8001394, -0.06151657, 0.6535207]]
# output_mean_var=True in train_mode with zeros/ones moving stats: mean and inverse std
MX_OMV_MEAN = [0.01586399, 0.22497907, 0.4218774]
MX_OMV_INVSTD = [1.8212013, 1.7672557, 2.3593235]


def test_nd_predict_defaults_match_mxnet():
    x, _, _ = _mx_inputs()
    gamma = _a(G)
    y = nd.BatchNorm(_a(x), gamma, _a(BETA), _a(MM), _a(MV))
    assert_close(y.asnumpy()[0, 0], MX_PREDICT_Y00, 2e-6, 1e-6, "y[0,0]")
    assert_close(y.asnumpy()[1, 2], MX_PREDICT_Y12, 2e-6, 1e-6, "y[1,2]")
    assert_close(gamma, np.ones(3), 0, 0, "gamma set to 1 in place by fix_gamma (as MXNet)")


def test_nd_training_forward_backward_running_stats_match_mxnet():
    x, _, _ = _mx_inputs()
    xx, gg, bb = _a(x), _a(G), _a(BETA)
    for a in (xx, gg, bb):
        a.attach_grad()
    mm, mv = _a(MM), _a(MV)
    with autograd.record():
        y = nd.BatchNorm(xx, gg, bb, mm, mv, eps=1e-5, momentum=0.9, fix_gamma=False)
    y.backward(_a(np.arange(24).reshape(2, 3, 2, 2) / 10 - 1))
    assert_close(y.asnumpy()[0, 1], MX_TRAIN_Y01, 1e-5, 1e-6, "y")
    assert_close(mm, MX_TRAIN_MM, 1e-5, 1e-6, "moving_mean")
    assert_close(mv, MX_TRAIN_MV, 1e-5, 1e-6, "moving_var")
    assert_close(xx.grad.asnumpy()[1, 0], MX_TRAIN_DX10, 1e-5, 1e-5, "dx")
    assert_close(gg.grad, MX_TRAIN_DG, 1e-5, 1e-5, "dgamma")
    assert_close(bb.grad, MX_TRAIN_DB, 1e-5, 1e-5, "dbeta")


def test_nd_fix_gamma_training_zero_gamma_grad_and_axis_and_output_mean_var():
    x, _, _ = _mx_inputs()
    gg = _a(G)
    gg.attach_grad()
    gg.grad[:] = 5.0
    with autograd.record():
        y = nd.BatchNorm(_a(x), gg, _a(BETA), nd.zeros(3, ctx=CPU), nd.ones(3, ctx=CPU), fix_gamma=True)
    y.backward()
    assert_close(gg, np.ones(3), 0, 0, "gamma")
    assert_close(gg.grad, np.zeros(3), 0, 0, "dgamma with fix_gamma")
    y4 = nd.BatchNorm(_a(x.transpose(0, 2, 3, 1)), _a(G), _a(BETA), _a(MM), _a(MV), axis=-1, fix_gamma=False)
    assert y4.shape == (2, 2, 2, 3)
    assert_close(y4.asnumpy()[0, 0], MX_AXIS_LAST_Y00, 2e-6, 1e-6, "axis=-1")
    with autograd.train_mode():
        y, mean, inv_std = nd.BatchNorm(_a(x), _a(G), _a(BETA), nd.zeros(3, ctx=CPU), nd.ones(3, ctx=CPU),
                                        output_mean_var=True)
    assert_close(mean, MX_OMV_MEAN, 1e-5, 1e-6, "mean")
    assert_close(inv_std, MX_OMV_INVSTD, 1e-5, 1e-6, "inverse std")
    _, mean, inv_std = nd.BatchNorm(_a(x), _a(G), _a(BETA), _a(MM), _a(MV), output_mean_var=True)  # predict
    assert_close(mean, MM, 0, 1e-7, "predict mean")
    assert_close(inv_std, 1 / np.sqrt(np.array(MV) + 1e-3), 1e-6, 0, "predict inverse std")


def test_nd_use_global_stats_in_record_matches_mxnet():
    x = np.random.RandomState(1).randn(2, 3, 4).astype(np.float32)
    xx, gg, bb = _a(x), _a([2.0, -1.0, 0.5]), _a([0.1, 0.2, 0.3])
    for a in (xx, gg, bb):
        a.attach_grad()
    mm, mv = _a([0.2, -0.3, 0.1]), _a([1.5, 0.7, 2.0])
    with autograd.record():
        y = nd.BatchNorm(xx, gg, bb, mm, mv, fix_gamma=False, use_global_stats=True, eps=1e-5)
    y.backward(_a(x[::-1].copy()))
    assert_close(y.asnumpy()[0, 1], [-1.1929187, 2.5922794, -2.244, 0.75124377], 1e-5, 1e-6, "y")
    assert_close(xx.grad.asnumpy()[0, 0], [-0.5265033, -0.6271561, 1.8514315, -1.796109], 1e-5, 1e-6, "dx")
    assert_close(gg.grad, [0.6836817, 3.2738245, -0.56508744], 1e-5, 1e-6, "dgamma")
    assert_close(bb.grad, [-1.2611449, -0.87778383, 0.91982555], 1e-5, 1e-6, "dbeta")
    assert_close(mm, np.float32([0.2, -0.3, 0.1]), 0, 0, "moving_mean untouched")
    assert_close(mv, np.float32([1.5, 0.7, 2.0]), 0, 0, "moving_var untouched")


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("use_global_stats", [False, True])
def test_nd_moving_statistics_get_no_gradient(use_global_stats, train):
    """MXNet 1.9.1 writes no gradient into the auxiliary states, in any mode (their grad buffers keep what they
    held, though their values scale the output with use_global_stats or in predict mode); the predict-mode
    gradient of data is the affine one (MXNet's with backward(train_mode=False): what the forward computed)."""
    x = np.random.RandomState(2).randn(2, 3, 4)
    xx, mm, mv = _a(x, np.float64), _a([0.2, -0.3, 0.1], np.float64), _a([1.5, 0.7, 2.0], np.float64)
    for a in (xx, mm, mv):
        a.attach_grad()
        a.grad[:] = 7.0
    with autograd.record(train_mode=train):
        y = nd.BatchNorm(xx, _a([2.0, -1.0, 0.5], np.float64), _a([0.1, 0.2, 0.3], np.float64), mm, mv,
                         fix_gamma=False, use_global_stats=use_global_stats, eps=1e-5)
    y.backward(_a(x[::-1].copy(), np.float64))
    assert (mm.grad.asnumpy() == 7).all() and (mv.grad.asnumpy() == 7).all()
    if use_global_stats or not train:
        scale = np.array([2.0, -1.0, 0.5]) / np.sqrt(np.array([1.5, 0.7, 2.0]) + 1e-5)
        assert_close(xx.grad, x[::-1] * scale.reshape(1, 3, 1), 1e-12, 1e-12, "affine dx")


@pytest.mark.parametrize("use_global_stats", [False, True])
def test_nd_gradient_by_central_differences(use_global_stats):
    shape = (3, 2, 2, 3)
    x, gamma, beta, rm, rv = _inputs(shape, np.float64, seed=4)
    dy = np.random.RandomState(5).randn(*shape)

    def run(xv, g, b):
        return nd.BatchNorm(_a(xv, np.float64), _a(g, np.float64), _a(b, np.float64), _a(rm, np.float64),
                            _a(rv, np.float64), eps=1e-3, fix_gamma=False, use_global_stats=use_global_stats)

    xx, gg, bb = _a(x, np.float64), _a(gamma, np.float64), _a(beta, np.float64)
    for a in (xx, gg, bb):
        a.attach_grad()
    with autograd.record():
        y = nd.BatchNorm(xx, gg, bb, _a(rm, np.float64), _a(rv, np.float64), eps=1e-3, fix_gamma=False,
                         use_global_stats=use_global_stats)
    y.backward(_a(dy, np.float64))
    with autograd.train_mode():  # the same mode as record(): batch statistics unless use_global_stats
        nx = numerical_grad(lambda v: run(v, gamma, beta).asnumpy(), x, dy)
        ng = numerical_grad(lambda v: run(x, v, beta).asnumpy(), gamma, dy)
        nb = numerical_grad(lambda v: run(x, gamma, v).asnumpy(), beta, dy)
    assert_close(xx.grad, nx, 1e-6, 1e-7, "dx")
    assert_close(gg.grad, ng, 1e-6, 1e-7, "dgamma")
    assert_close(bb.grad, nb, 1e-6, 1e-7, "dbeta")


def test_nd_errors_name_the_op_and_shapes():
    x = _a(np.random.RandomState(0).randn(4, 3, 2, 2))
    with pytest.raises(ValueError, match=r"BatchNorm: gamma has shape \(2,\) but x of shape \(4, 3, 2, 2\)"):
        nd.BatchNorm(x, _a([1, 1]), _a([0, 0, 0]), _a([0, 0, 0]), _a([1, 1, 1]))
    with pytest.raises(ValueError, match=r"BatchNorm: moving_var has shape \(4,\)"):
        nd.BatchNorm(x, _a([1, 1, 1]), _a([0, 0, 0]), _a([0, 0, 0]), _a([1, 1, 1, 1]))
    gamma = _a([2.0, 2.0])
    with pytest.raises(ValueError):
        nd.BatchNorm(x, gamma, _a([0, 0, 0]), _a([0, 0, 0]), _a([1, 1, 1]))
    assert_close(gamma, [2.0, 2.0], 0, 0, "gamma untouched by a refused call")


# -- gluon.nn.BatchNorm ---------------------------------------------------------------------------------------

MX_GLUON_OUT = [[-1.314254, 0.74215996, -1.215389], [0.1853572, -1.7583864, 0.35935202],
                [0.8489226, -1.3646295, 0.7417379]]  # step 2's training output [0, :, 0, :]
MX_GLUON_RM = [0.6829432, 0.738937, 0.68426573]
MX_GLUON_RV = [1.0937712, 1.1626325, 1.1756701]
MX_GLUON_PREDICT = [[0.642431, 2.1387784, 0.7143701], [1.8236479, 0.29439348, 1.9605395],
                    [2.2213914, 0.45782188, 2.1359956]]
MX_GLUON_2D_RM = [0.03244412, 0.09799258, 0.05564799]
MX_GLUON_2D_RV = [0.9719887, 0.99282587, 0.9641565]


def test_gluon_batchnorm_matches_mxnet():
    _, x2, x3 = _mx_inputs()
    net = gluon.nn.BatchNorm()
    net.initialize(ctx=CPU)
    assert net.gamma.name.endswith("_gamma") and net.running_var.name.endswith("_running_var")
    assert net.name.startswith("batchnorm")
    assert net.running_mean.grad_req == "null" and net.running_var.grad_req == "null"
    for i in range(2):
        with autograd.record():
            out = net(_a(x2 * (i + 1)))
        out.backward()
    assert_close(out.asnumpy()[0, :, 0, :], MX_GLUON_OUT, 1e-5, 1e-6, "train output")
    assert_close(net.running_mean.data(), MX_GLUON_RM, 1e-5, 1e-6, "running_mean")
    assert_close(net.running_var.data(), MX_GLUON_RV, 1e-5, 1e-6, "running_var")
    assert_close(net(_a(x2)).asnumpy()[0, :, 0, :], MX_GLUON_PREDICT, 1e-5, 1e-6, "predict")
    assert repr(net) == ("BatchNorm(axis=1, eps=1e-05, momentum=0.9, fix_gamma=False, use_global_stats=False, "
                         "in_channels=3)")
    net2 = gluon.nn.BatchNorm(in_channels=3)
    net2.initialize(ctx=CPU)
    assert net2.gamma.data().shape == (3,)  # known at initialize()
    with autograd.record():
        o = net2(_a(x3))
    o.backward()
    assert_close(net2.running_mean.data(), MX_GLUON_2D_RM, 1e-5, 1e-6, "2-D running_mean")
    assert_close(net2.running_var.data(), MX_GLUON_2D_RV, 1e-5, 1e-6, "2-D running_var")


def test_gluon_modes_and_options():
    x, gamma, *_ = _inputs((4, 3, 2, 2), np.float32, seed=6)
    net = gluon.nn.BatchNorm(momentum=0.5, epsilon=1e-3)
    net.initialize(ctx=CPU)
    y = net(_a(x))  # predict mode: running statistics 0 / 1, nothing updated
    assert_close(y, x / np.sqrt(1 + 1e-3), 1e-5, 1e-6, "predict with initial stats")
    assert_close(net.running_mean.data(), np.zeros(3), 0, 0, "running_mean unchanged in predict mode")
    with autograd.train_mode():  # training mode without recording: batch statistics, stats updated
        y = net(_a(x))
    mean, var, _ = _ref_stats(x)
    assert_close(y, _ref_bn(x, np.ones(3), np.zeros(3), mean, var, 1e-3), 1e-5, 1e-5, "train_mode")
    assert_close(net.running_mean.data(), 0.5 * mean, 1e-5, 1e-6, "running_mean")
    assert_close(net.running_var.data(), 0.5 + 0.5 * var, 1e-5, 1e-6, "running_var")
    ugs = gluon.nn.BatchNorm(use_global_stats=True, in_channels=3)
    ugs.initialize(ctx=CPU)
    with autograd.record():
        y = ugs(_a(x))
    assert_close(y, x / np.sqrt(1 + 1e-5), 1e-5, 1e-6, "use_global_stats in training")
    assert_close(ugs.running_var.data(), np.ones(3), 0, 0, "use_global_stats leaves running_var")
    plain = gluon.nn.BatchNorm(center=False, scale=False, in_channels=3)
    plain.initialize(ctx=CPU)
    assert plain.gamma.grad_req == "null" and plain.beta.grad_req == "null"
    plain.gamma.set_data(_a(gamma))
    with autograd.record():
        y = plain(_a(x))
    assert_close(plain.gamma.data(), np.ones(3), 0, 0, "scale=False: gamma fixed at 1 (fix_gamma)")
    assert_close(y, _ref_bn(x, np.ones(3), np.zeros(3), mean, var, 1e-5), 1e-5, 1e-5, "no scale, no center")
    nhwc = gluon.nn.BatchNorm(axis=-1)
    nhwc.initialize(ctx=CPU)
    xt = x.transpose(0, 2, 3, 1).copy()
    with autograd.record():
        y = nhwc(_a(xt))
    assert nhwc.gamma.shape == (3,)
    expect = _ref_bn(x, np.ones(3), np.zeros(3), mean, var, 1e-5).transpose(0, 2, 3, 1)
    assert_close(y, expect, 1e-5, 1e-5, "axis=-1")


def test_conv_bn_relu_net_trains_on_cpu_and_round_trips(tmp_path):
    nd.random.seed(0)
    rs = np.random.RandomState(0)
    x = rs.randn(16, 1, 8, 8).astype(np.float32)
    label = (x.mean(axis=(1, 2, 3)) > 0).astype(np.float32)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Flatten(),
            gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier(), ctx=CPU)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for _ in range(5):
        with autograd.record():
            loss = loss_fn(net(_a(x)), _a(label))
        loss.backward()
        trainer.step(16)
        losses.append(float(loss.mean().asscalar()))
    assert losses[-1] < losses[0], losses
    bn = net[1]
    assert not np.allclose(bn.running_mean.data().asnumpy(), 0)
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    loaded = nd.load(path)
    assert {"1.gamma", "1.beta", "1.running_mean", "1.running_var"} <= set(loaded)
    net2 = gluon.nn.Sequential()
    net2.add(gluon.nn.Conv2D(4, 3), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Flatten(),
             gluon.nn.Dense(2))
    net2.load_parameters(path, ctx=CPU)
    for name in ("gamma", "beta", "running_mean", "running_var"):
        assert_close(getattr(net2[1], name).data(), getattr(bn, name).data(), 0, 0, name)
    assert_close(net2(_a(x)), net(_a(x)), 1e-6, 1e-6, "predict after load")


def test_layernorm_instancenorm_match_mxnet():
    x = np.random.RandomState(1).randn(2, 3, 4).astype(np.float32)
    expect = [[-0.19012278, -0.26608518, 1.6044993, -1.1482912], [-0.1262664, -1.4735211, 0.28366417, 1.3161234],
              [-1.6715239, 0.89443636, 0.6165859, 0.16050169]]  # MXNet 1.9.1, both layers, sample 1
    for layer in (gluon.nn.LayerNorm(), gluon.nn.InstanceNorm()):
        layer.initialize(ctx=CPU)
        assert_close(layer(_a(x)).asnumpy()[1], expect, 1e-5, 1e-6, type(layer).__name__)
    ln = gluon.nn.LayerNorm(axis=1, in_channels=3)
    ln.initialize(ctx=CPU)
    ln.gamma.set_data(_a([1.0, 2.0, 3.0]))
    xx = _a(x)
    xx.attach_grad()
    with autograd.record():
        y = ln(xx)
    y.backward()
    mean, var = x.astype(np.float64).mean(axis=1, keepdims=True), x.astype(np.float64).var(axis=1, keepdims=True)
    assert_close(y, (x - mean) / np.sqrt(var + 1e-5) * np.array([1, 2, 3.0]).reshape(1, 3, 1), 1e-5, 1e-5, "ln")
    assert xx.grad.shape == x.shape


# -- GPU: every op against the twin ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_ops_match_twin(gpu, shape, dtype):
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    x, gamma, beta, rm, rv = _inputs(shape, dtype, seed=7)
    dy = np.random.RandomState(8).randn(*shape).astype(dtype)
    host = {"x": x, "g": gamma, "b": beta, "rm": rm, "rv": rv, "dy": dy}
    dev = {k: nd.array(v, ctx=gpu, dtype=dtype) for k, v in host.items()}
    rm_c, rv_c = rm.copy(), rv.copy()
    for step in range(2):
        y, sm, si = B.batchnorm_forward_training(dev["x"], dev["g"], dev["b"], dev["rm"], dev["rv"], 0.9, 1e-5)
        ey, esm, esi = R.batchnorm_forward_training(x, gamma, beta, rm_c, rv_c, 0.9, 1e-5)
        assert_close(y, ey, rtol, rtol, f"y step {step}")
        assert_close(sm, esm, rtol, rtol, "save_mean")
        assert_close(si, esi, rtol, rtol, "save_inv_std")
        assert_close(dev["rm"], rm_c, rtol, rtol, "running_mean")
        assert_close(dev["rv"], rv_c, rtol, rtol, "running_var (biased, fixed up from cuDNN's unbiased)")
    dx, dg, db = B.batchnorm_backward(dev["x"], dev["dy"], dev["g"], sm, si, 1e-5)
    edx, edg, edb = R.batchnorm_backward(x, dy, gamma, esm, esi, 1e-5)
    assert_close(dx, edx, 10 * rtol, rtol, "dx")
    assert_close(dg, edg, 10 * rtol, rtol, "dgamma")
    assert_close(db, edb, 10 * rtol, rtol, "dbeta")
    y = B.batchnorm_forward_inference(dev["x"], dev["g"], dev["b"], dev["rm"], dev["rv"], 1e-3)
    assert_close(y, R.batchnorm_forward_inference(x, gamma, beta, rm_c, rv_c, 1e-3), rtol, rtol, "inference")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mode", ["persistent", "spatial"])
def test_gpu_batchnorm_modes_match_twin(gpu, dtype, mode):
    """Both training modes (CUDNN_BATCHNORM_SPATIAL_PERSISTENT, MXNet's and the default, and CUDNN_BATCHNORM_SPATIAL)
    give the twin's results, in float32 and in mixed precision; the previous mode comes back."""
    import dnnbind
    shape = (32, 16, 12, 12)
    previous = dnnbind.set_batchnorm_mode(mode)
    try:
        if dtype == np.float16:
            host = _half_inputs(shape, 50)
            dev = [nd.array(a, ctx=gpu, dtype=a.dtype) for a in host]
            _check_half_against_float64(B, *dev, to_host=lambda a: a.asnumpy())
        else:
            x, gamma, beta, rm, rv = _inputs(shape, dtype, seed=51)
            dy = np.random.RandomState(52).randn(*shape).astype(dtype)
            dev = {k: nd.array(v, ctx=gpu) for k, v in dict(x=x, g=gamma, b=beta, rm=rm, rv=rv, dy=dy).items()}
            y, sm, si = B.batchnorm_forward_training(dev["x"], dev["g"], dev["b"], dev["rm"], dev["rv"], 0.9, 1e-5)
            ey, esm, esi = R.batchnorm_forward_training(x, gamma, beta, rm, rv, 0.9, 1e-5)
            assert_close(y, ey, 1e-4, 1e-4, "y")
            assert_close(dev["rv"], rv, 1e-5, 1e-5, "running_var")
            dx, dg, db = B.batchnorm_backward(dev["x"], dev["dy"], dev["g"], sm, si, 1e-5)
            edx, edg, edb = R.batchnorm_backward(x, dy, gamma, esm, esi, 1e-5)
            for got, want, name in ((dx, edx, "dx"), (dg, edg, "dgamma"), (db, edb, "dbeta")):
                assert_close(got, want, 1e-4, 1e-4 * max(1.0, float(np.abs(want).max())), name)
    finally:
        assert dnnbind.set_batchnorm_mode(previous) == mode
    assert previous == "persistent"  # the default
    with pytest.raises(ValueError, match="set_batchnorm_mode: mode must be one of"):
        dnnbind.set_batchnorm_mode("fast")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(6, 3), (16, 8, 7, 9), (2, 1, 3, 4)])
def test_gpu_float16_data_with_float32_parameters(gpu, shape):
    """cuDNN's mixed mode: half x, dy, y, dx; float gamma, beta, statistics and their gradients."""
    host = _half_inputs(shape, 40)
    dev = [nd.array(a, ctx=gpu, dtype=a.dtype) for a in host]
    _check_half_against_float64(B, *dev, to_host=lambda a: a.asnumpy() if hasattr(a, "asnumpy") else np.asarray(a))


@pytest.mark.gpu
@pytest.mark.parametrize("fix_gamma, use_global_stats", [(False, False), (True, False), (False, True)])
def test_gpu_nd_and_gluon_match_cpu(gpu, fix_gamma, use_global_stats):
    x, gamma, beta, rm, rv = _inputs((4, 3, 5, 5), np.float32, seed=9)
    dy = np.random.RandomState(10).randn(*x.shape).astype(np.float32)
    results = {}
    for ctx in (CPU, gpu):
        arrs = [nd.array(v, ctx=ctx) for v in (x, gamma, beta)]
        for a in arrs:
            a.attach_grad()
        mm, mv = nd.array(rm, ctx=ctx), nd.array(rv, ctx=ctx)
        kw = {"eps": 1e-5, "fix_gamma": fix_gamma, "use_global_stats": use_global_stats}
        with autograd.record():
            y = nd.BatchNorm(*arrs, mm, mv, **kw)
        y.backward(nd.array(dy, ctx=ctx))
        yp = nd.BatchNorm(*arrs, mm, mv, **kw)  # predict mode: cudnnBatchNormalizationForwardInference
        net = gluon.nn.BatchNorm(axis=-1)
        net.initialize(ctx=ctx)
        with autograd.record():
            yg = net(nd.array(x.transpose(0, 2, 3, 1).copy(), ctx=ctx))
        yg.backward()
        results[ctx.kind] = [y, mm, mv, *arrs, *(a.grad for a in arrs), yp, yg, net.running_mean.data(),
                             net.running_var.data()]
    for i, (a, e) in enumerate(zip(results["gpu"], results["cpu"])):
        assert_close(a, e.asnumpy(), 1e-5, 1e-5, f"result {i}")


def _one_value_per_channel(device, dtype, layout):
    """BatchNorm in training mode over one value per channel (GluonCV's SSD probes its anchors with a batch of one
    whose last map is 1x1): MXNet 1.9.1 gives beta, moves the moving mean toward x and scales the moving variance by
    the momentum (the batch's biased variance is 0); x and gamma get no gradient, beta gets dy."""
    rng = np.random.default_rng(5)
    c = 3
    shape = (1, c, 1, 1) if layout == "NCHW" else (1, 1, 1, c)
    x = rng.standard_normal(shape).astype(dtype)
    pdt = np.float64 if dtype == np.float64 else np.float32
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(pdt), rng.standard_normal(c).astype(pdt)
    rm0, rv0, dy = rng.standard_normal(c).astype(pdt), rng.uniform(0.5, 1.5, c).astype(pdt), \
        rng.standard_normal(shape).astype(dtype)
    xs = nd.array(x, ctx=device, dtype=dtype)
    g, b = nd.array(gamma, ctx=device, dtype=pdt), nd.array(beta, ctx=device, dtype=pdt)
    rm, rv = nd.array(rm0, ctx=device, dtype=pdt), nd.array(rv0, ctx=device, dtype=pdt)
    for a in (xs, g, b):
        a.attach_grad()
    with autograd.record(train_mode=True):
        y = nd.BatchNorm(xs, g, b, rm, rv, fix_gamma=False, momentum=0.9, axis=1 if layout == "NCHW" else 3)
    y.backward(nd.array(dy, ctx=device, dtype=dtype))
    np.testing.assert_allclose(y.asnumpy().reshape(-1), beta.astype(dtype), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rm.asnumpy(), 0.9 * rm0 + 0.1 * x.reshape(-1).astype(pdt), rtol=1e-6)
    np.testing.assert_allclose(rv.asnumpy(), 0.9 * rv0, rtol=1e-6)
    np.testing.assert_array_equal(xs.grad.asnumpy(), 0)
    np.testing.assert_array_equal(g.grad.asnumpy(), 0)
    np.testing.assert_allclose(b.grad.asnumpy(), dy.reshape(-1).astype(pdt), rtol=1e-6)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_value_per_channel_gives_beta_as_mxnet(dtype, layout):
    _one_value_per_channel(mx.cpu(), dtype, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gpu_one_value_per_channel_gives_beta_as_mxnet(gpu, dtype, layout):
    _one_value_per_channel(gpu, dtype, layout)
