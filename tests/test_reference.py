"""CPU tests of dnnbind.ops.reference, the numpy twin of every op (no GPU needed).

Forward ops are compared with deliberately naive float64 loop implementations written here; every backward is
checked against central differences of its forward (and, for conv and pooling, a naive loop as well).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _helpers import assert_close, numerical_grad

from dnnbind.ops import reference as R

GRAD_TOL = {"rtol": 1e-5, "atol": 1e-6}  # float64 central differences, eps 1e-6
F64_TOL = {"rtol": 1e-10, "atol": 1e-11}
F32_TOL = {"rtol": 1e-4, "atol": 1e-5}


def rand(shape, seed, dtype=np.float64, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# -- naive oracles ----------------------------------------------------------------------------------------

def naive_conv_taps(x_shape, w_shape, stride, padding, dilation, groups):
    """Yield (n, k, p, q, c, r, s, h, w) for every in-bounds product of the convolution."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n_, _, h_, w_ = x_shape
    k_, cg, r_, s_ = w_shape
    kg = k_ // groups
    p_ = (h_ + 2 * ph - dh * (r_ - 1) - 1) // sh + 1
    q_ = (w_ + 2 * pw - dw * (s_ - 1) - 1) // sw + 1
    for n, k, p, q in itertools.product(range(n_), range(k_), range(p_), range(q_)):
        g = k // kg
        for ci, r, s in itertools.product(range(cg), range(r_), range(s_)):
            h = p * sh - ph + r * dh
            w = q * sw - pw + s * dw
            if 0 <= h < h_ and 0 <= w < w_:
                yield n, k, p, q, g * cg + ci, ci, r, s, h, w


def naive_conv_out_shape(x_shape, w_shape, stride, padding, dilation):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    p_ = (x_shape[2] + 2 * ph - dh * (w_shape[2] - 1) - 1) // sh + 1
    q_ = (x_shape[3] + 2 * pw - dw * (w_shape[3] - 1) - 1) // sw + 1
    return (x_shape[0], w_shape[0], p_, q_)


def naive_conv(x, w, b, stride, padding, dilation, groups):
    y = np.zeros(naive_conv_out_shape(x.shape, w.shape, stride, padding, dilation))
    for n, k, p, q, c, ci, r, s, h, ww in naive_conv_taps(x.shape, w.shape, stride, padding, dilation, groups):
        y[n, k, p, q] += x[n, c, h, ww] * w[k, ci, r, s]
    if b is not None:
        for n, k, p, q in np.ndindex(*y.shape):
            y[n, k, p, q] += b[k]
    return y


def naive_conv_backward_data(w, dy, x_shape, stride, padding, dilation, groups):
    dx = np.zeros(x_shape)
    for n, k, p, q, c, ci, r, s, h, ww in naive_conv_taps(x_shape, w.shape, stride, padding, dilation, groups):
        dx[n, c, h, ww] += dy[n, k, p, q] * w[k, ci, r, s]
    return dx


def naive_conv_backward_filter(x, dy, w_shape, stride, padding, dilation, groups):
    dw = np.zeros(w_shape)
    for n, k, p, q, c, ci, r, s, h, ww in naive_conv_taps(x.shape, w_shape, stride, padding, dilation, groups):
        dw[k, ci, r, s] += dy[n, k, p, q] * x[n, c, h, ww]
    return dw


def naive_pool_windows(x_shape, window, stride, padding):
    """Yield (n, c, p, q, members, area, (P, Q)) with members the in-bounds (h, w) of each window in row-major order."""
    (kh, kw), (ph, pw) = _pair(window), _pair(padding)
    sh, sw = _pair(window if stride is None else stride)
    n_, c_, h_, w_ = x_shape
    p_ = (h_ + 2 * ph - kh) // sh + 1
    q_ = (w_ + 2 * pw - kw) // sw + 1
    for n, c, p, q in itertools.product(range(n_), range(c_), range(p_), range(q_)):
        members = [(p * sh - ph + i, q * sw - pw + j) for i in range(kh) for j in range(kw)]
        members = [(h, w) for h, w in members if 0 <= h < h_ and 0 <= w < w_]
        yield n, c, p, q, members, kh * kw, (p_, q_)


def naive_pool(x, mode, window, stride, padding):
    out = None
    for n, c, p, q, members, area, pq in naive_pool_windows(x.shape, window, stride, padding):
        if out is None:
            out = np.zeros(x.shape[:2] + pq)
        vals = [x[n, c, h, w] for h, w in members]
        if mode == "max":
            out[n, c, p, q] = max(vals)
        else:
            out[n, c, p, q] = sum(vals) / (area if mode == "avg" else len(vals))
    return out


def naive_pool_backward(dy, x, mode, window, stride, padding):
    dx = np.zeros(x.shape)
    for n, c, p, q, members, area, _ in naive_pool_windows(x.shape, window, stride, padding):
        if mode == "max":
            vals = [x[n, c, h, w] for h, w in members]
            h, w = members[vals.index(max(vals))]  # list.index: the first maximum
            dx[n, c, h, w] += dy[n, c, p, q]
        else:
            for h, w in members:
                dx[n, c, h, w] += dy[n, c, p, q] / (area if mode == "avg" else len(members))
    return dx


def naive_activation(x, mode, coef):
    def f(v):
        if mode == "relu":
            return max(v, 0.0)
        if mode == "sigmoid":
            return 1.0 / (1.0 + math.exp(-v))
        if mode == "tanh":
            return math.tanh(v)
        if mode == "clipped_relu":
            return min(max(v, 0.0), coef)
        return v if v > 0 else coef * (math.exp(v) - 1.0)
    return np.array([f(float(v)) for v in x.reshape(-1)]).reshape(x.shape)


def naive_softmax(x, algorithm, mode):
    """Loops over the groups softmax normalizes: a sample (instance) or one pixel's channels (channel)."""
    y = np.zeros(x.shape)
    if mode == "instance" or x.ndim == 2:
        groups = [(n,) for n in range(x.shape[0])]
    else:
        groups = [(n, slice(None), h, w) for n in range(x.shape[0]) for h in range(x.shape[2])
                  for w in range(x.shape[3])]
    for idx in groups:
        vals = x[idx].reshape(-1).tolist()
        m = max(vals)
        total = sum(math.exp(v - m) for v in vals)
        out = [(v - m - math.log(total)) if algorithm == "log" else math.exp(v - m) / total for v in vals]
        y[idx] = np.array(out).reshape(x[idx].shape)
    return y


def naive_matmul(a, b):
    out = np.zeros((a.shape[0], b.shape[1]))
    for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
        out[i, j] = sum(float(a[i, t]) * float(b[t, j]) for t in range(a.shape[1]))
    return out


def naive_cross_entropy(logits, labels):
    out = []
    for row, lab in zip(logits.tolist(), labels.tolist(), strict=True):
        m = max(row)
        out.append(m + math.log(sum(math.exp(v - m) for v in row)) - row[lab])
    return np.array(out)


# -- convolution ------------------------------------------------------------------------------------------

# (x_shape, w_shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1, 1),
    ((2, 3, 7, 6), (4, 3, 3, 2), (2, 1), (1, 0), 1, 1),
    ((3, 4, 9, 8), (6, 2, 3, 3), 2, 2, 2, 2),
    ((2, 4, 6, 7), (4, 1, 3, 3), 1, 1, 1, 4),
    ((2, 5, 4, 3), (3, 5, 1, 1), 1, 0, 1, 1),
    ((1, 2, 8, 7), (3, 2, 2, 2), 3, 1, 1, 1),
    ((2, 6, 5, 9), (6, 2, 2, 3), 1, (0, 2), (1, 2), 3),
    ((1, 3, 7, 5), (2, 3, 5, 1), (1, 2), (2, 0), 1, 1),
]
CONV_IDS = [f"x{c[0]}-w{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-g{c[5]}" for c in CONV_CASES]


@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_forward_matches_naive(case, bias):
    x_shape, w_shape, stride, padding, dilation, groups = case
    x, w = rand(x_shape, 1), rand(w_shape, 2)
    b = rand((w_shape[0],), 3) if bias else None
    y = R.conv_forward(x, w, b, stride, padding, dilation, groups)
    assert_close(y, naive_conv(x, w, b, stride, padding, dilation, groups), **F64_TOL, name="conv_forward")


@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
def test_conv_backward_data(case):
    x_shape, w_shape, stride, padding, dilation, groups = case
    w = rand(w_shape, 4)
    dy = rand(naive_conv_out_shape(x_shape, w_shape, stride, padding, dilation), 5)
    dx = R.conv_backward_data(w, dy, x_shape, stride, padding, dilation, groups)
    expected = naive_conv_backward_data(w, dy, x_shape, stride, padding, dilation, groups)
    assert_close(dx, expected, **F64_TOL, name="conv_backward_data vs naive")
    num = numerical_grad(lambda x: R.conv_forward(x, w, None, stride, padding, dilation, groups),
                         rand(x_shape, 6), dy)
    assert_close(dx, num, **GRAD_TOL, name="conv_backward_data vs central differences")


@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
def test_conv_backward_filter(case):
    x_shape, w_shape, stride, padding, dilation, groups = case
    x = rand(x_shape, 7)
    dy = rand(naive_conv_out_shape(x_shape, w_shape, stride, padding, dilation), 8)
    dw = R.conv_backward_filter(x, dy, w_shape, stride, padding, dilation, groups)
    expected = naive_conv_backward_filter(x, dy, w_shape, stride, padding, dilation, groups)
    assert_close(dw, expected, **F64_TOL, name="conv_backward_filter vs naive")
    num = numerical_grad(lambda w: R.conv_forward(x, w, None, stride, padding, dilation, groups),
                         rand(w_shape, 9), dy)
    assert_close(dw, num, **GRAD_TOL, name="conv_backward_filter vs central differences")


@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (2, 5, 3, 4), (3, 1, 7, 2)])
def test_conv_backward_bias(shape):
    dy = rand(shape, 10)
    db = R.conv_backward_bias(dy)
    expected = np.array([sum(dy[n, k, p, q] for n in range(shape[0]) for p in range(shape[2])
                             for q in range(shape[3])) for k in range(shape[1])])
    assert_close(db, expected, **F64_TOL, name="conv_backward_bias vs naive")
    x, w = rand((shape[0], 2, shape[2], shape[3]), 11), rand((shape[1], 2, 1, 1), 12)
    num = numerical_grad(lambda b: R.conv_forward(x, w, b), rand((shape[1],), 13), dy)
    assert_close(db, num, **GRAD_TOL, name="conv_backward_bias vs central differences")


def test_conv_float32_mnist_shapes():
    """The float32 path (the CPU backend's training dtype) stays close to float64 at the model's shapes."""
    x, w, b = rand((4, 32, 14, 14), 14), rand((64, 32, 3, 3), 15, scale=0.1), rand((64,), 16)
    dy = rand((4, 64, 14, 14), 17)
    for fn, args in [(R.conv_forward, (x, w, b)), (R.conv_backward_data, (w, dy, x.shape)),
                     (R.conv_backward_filter, (x, dy, w.shape))]:
        ref = fn(*args, padding=1)
        out = fn(*[a.astype(np.float32) if isinstance(a, np.ndarray) else a for a in args], padding=1)
        assert out.dtype == np.float32
        assert_close(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), name=fn.__name__ + " float32")


@pytest.mark.parametrize("b_shape", ["channel", "full", "broadcast"])
@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 4, 5), (1, 4, 1, 1)])
def test_add_tensor(x_shape, b_shape):
    x = rand(x_shape, 18)
    c = x_shape[1]
    b = {"channel": rand((c,), 19), "full": rand(x_shape, 19),
         "broadcast": rand((1, c) + (1,) * (len(x_shape) - 2), 19)}[b_shape]
    expected = np.zeros(x_shape)
    for idx in np.ndindex(*x_shape):
        expected[idx] = x[idx] + (b[idx] if b_shape == "full" else b.reshape(-1)[idx[1]])
    out = R.add_tensor(x, b)
    assert_close(out, expected, **F64_TOL, name="add_tensor")
    assert out is not x


# -- pooling ----------------------------------------------------------------------------------------------

# (x_shape, window, stride, padding)
POOL_CASES = [
    ((2, 3, 4, 6), 2, None, 0),
    ((1, 2, 5, 5), 2, None, 0),
    ((2, 2, 7, 7), 3, 2, 1),
    ((1, 3, 5, 6), (3, 2), (1, 2), (1, 0)),
    ((2, 1, 6, 5), 2, 1, 0),
    ((1, 2, 8, 8), 3, 3, 1),
    ((3, 2, 3, 4), (3, 4), 1, (1, 2)),
]
POOL_IDS = [f"x{c[0]}-k{c[1]}-s{c[2]}-p{c[3]}" for c in POOL_CASES]
POOL_MODES = ["max", "avg", "avg_exclude_pad"]


@pytest.mark.parametrize("mode", POOL_MODES)
@pytest.mark.parametrize("case", POOL_CASES, ids=POOL_IDS)
def test_pooling_forward_matches_naive(case, mode):
    x_shape, window, stride, padding = case
    x = rand(x_shape, 20)
    y = R.pooling_forward(x, mode, window, stride, padding)
    assert_close(y, naive_pool(x, mode, window, stride, padding), **F64_TOL, name=f"pooling_forward {mode}")


@pytest.mark.parametrize("mode", POOL_MODES)
@pytest.mark.parametrize("case", POOL_CASES, ids=POOL_IDS)
def test_pooling_backward(case, mode):
    x_shape, window, stride, padding = case
    x = rand(x_shape, 21)
    y = R.pooling_forward(x, mode, window, stride, padding)
    dy = rand(y.shape, 22)
    dx = R.pooling_backward(y, dy, x, mode, window, stride, padding)
    expected = naive_pool_backward(dy, x, mode, window, stride, padding)
    assert_close(dx, expected, **F64_TOL, name=f"pooling_backward {mode} vs naive")
    num = numerical_grad(lambda v: R.pooling_forward(v, mode, window, stride, padding), x, dy)
    assert_close(dx, num, **GRAD_TOL, name=f"pooling_backward {mode} vs central differences")


def test_max_pooling_backward_ties_go_to_first_max():
    x = np.ones((1, 1, 4, 4))
    dy = rand((1, 1, 2, 2), 23)
    dx = R.pooling_backward(R.pooling_forward(x), dy, x)
    expected = np.zeros((1, 1, 4, 4))
    expected[0, 0, ::2, ::2] = dy[0, 0]
    assert_close(dx, expected, rtol=0, atol=0, name="max pooling tie")


# -- activation and softmax -------------------------------------------------------------------------------

ACT_CASES = [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 0.7), ("elu", 1.3), ("elu", 0.5)]


@pytest.mark.parametrize("mode,coef", ACT_CASES)
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4, 5)])
def test_activation(mode, coef, shape):
    x = rand(shape, 24, scale=2.0)
    y = R.activation_forward(x, mode, coef)
    assert_close(y, naive_activation(x, mode, coef), **F64_TOL, name=f"activation_forward {mode}")
    dy = rand(shape, 25)
    dx = R.activation_backward(y, dy, x, mode, coef)
    num = numerical_grad(lambda v: R.activation_forward(v, mode, coef), x, dy)
    assert_close(dx, num, **GRAD_TOL, name=f"activation_backward {mode}")


def test_activation_extremes_do_not_overflow():
    x = np.array([-1e4, -50.0, 0.0, 50.0, 1e4])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        for mode, coef in ACT_CASES:
            y = R.activation_forward(x, mode, coef)
            R.activation_backward(y, np.ones_like(x), x, mode, coef)
    assert_close(R.activation_forward(x, "sigmoid"), [0.0, 1.9287498479639178e-22, 0.5, 1.0, 1.0],
                 rtol=1e-12, atol=0, name="sigmoid extremes")


SOFTMAX_SHAPES = [(3, 5), (1, 4), (2, 3, 4, 5), (1, 4, 1, 1), (2, 5, 3, 2)]


@pytest.mark.parametrize("mode", ["instance", "channel"])
@pytest.mark.parametrize("algorithm", ["accurate", "log"])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_softmax(shape, algorithm, mode):
    x = rand(shape, 26, scale=3.0)
    y = R.softmax_forward(x, algorithm, mode)
    assert_close(y, naive_softmax(x, algorithm, mode), **F64_TOL, name=f"softmax_forward {algorithm} {mode}")
    dy = rand(shape, 27)
    dx = R.softmax_backward(y, dy, algorithm, mode)
    num = numerical_grad(lambda v: R.softmax_forward(v, algorithm, mode), x, dy)
    assert_close(dx, num, **GRAD_TOL, name=f"softmax_backward {algorithm} {mode}")


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]], dtype=np.float32)
    for algorithm in ("accurate", "log"):
        y = R.softmax_forward(x, algorithm)
        assert np.all(np.isfinite(y)), y
        assert_close(y, naive_softmax(x.astype(np.float64), algorithm, "instance"), **F32_TOL,
                     name=f"softmax {algorithm} large")


# -- gemm and linear --------------------------------------------------------------------------------------

@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("alpha,beta,with_c", [(1.0, 0.0, False), (0.5, 0.0, True), (-1.5, 2.0, True),
                                                (2.0, 1.0, True)])
def test_gemm(trans_a, trans_b, alpha, beta, with_c):
    m, n, k = 3, 5, 4
    a = rand((k, m) if trans_a else (m, k), 28)
    b = rand((n, k) if trans_b else (k, n), 29)
    c = rand((m, n), 30) if with_c else None
    out = R.gemm(a, b, c, trans_a, trans_b, alpha, beta)
    expected = alpha * naive_matmul(a.T if trans_a else a, b.T if trans_b else b)
    if with_c:
        expected += beta * c
    assert_close(out, expected, **F64_TOL, name="gemm")


def test_gemm_beta_zero_ignores_c():
    a, b = rand((2, 3), 31), rand((3, 4), 32)
    c = np.full((2, 4), np.nan)
    assert_close(R.gemm(a, b, c, beta=0.0), naive_matmul(a, b), **F64_TOL, name="gemm beta=0")


@pytest.mark.parametrize("n,d_in,units", [(1, 3, 2), (4, 7, 5), (5, 1, 3)])
def test_linear(n, d_in, units):
    x, w, b = rand((n, d_in), 33), rand((units, d_in), 34), rand((units,), 35)
    y = R.linear_forward(x, w, b)
    assert_close(y, naive_matmul(x, w.T) + b, **F64_TOL, name="linear_forward")
    assert_close(R.linear_forward(x, w), naive_matmul(x, w.T), **F64_TOL, name="linear_forward no bias")
    dy = rand((n, units), 36)
    dx, dw, db = R.linear_backward(x, w, dy)
    assert_close(dx, numerical_grad(lambda v: R.linear_forward(v, w, b), x, dy), **GRAD_TOL, name="dx")
    assert_close(dw, numerical_grad(lambda v: R.linear_forward(x, v, b), w, dy), **GRAD_TOL, name="dw")
    assert_close(db, numerical_grad(lambda v: R.linear_forward(x, w, v), b, dy), **GRAD_TOL, name="db")
    assert R.linear_backward(x, w, dy, bias=False)[2] is None


# -- losses -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("label_dtype", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("n,c", [(1, 2), (5, 10), (8, 3)])
def test_softmax_cross_entropy(n, c, label_dtype):
    logits = rand((n, c), 37, scale=3.0)
    labels = np.random.default_rng(38).integers(0, c, n).astype(label_dtype)
    loss = R.softmax_cross_entropy(logits, labels)
    assert_close(loss, naive_cross_entropy(logits, labels), **F64_TOL, name="softmax_cross_entropy")
    dloss = rand((n,), 39)
    g = R.softmax_cross_entropy_backward(logits, labels, dloss)
    num = numerical_grad(lambda v: R.softmax_cross_entropy(v, labels), logits, dloss)
    assert_close(g, num, **GRAD_TOL, name="softmax_cross_entropy_backward")


def test_softmax_cross_entropy_is_stable_for_large_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [5e3, 5e3, 5e3]], dtype=np.float32)
    labels = np.array([2, 1])
    loss = R.softmax_cross_entropy(logits, labels)
    assert_close(loss, [2000.0, math.log(3.0)], rtol=1e-6, atol=1e-6, name="large logits")
    g = R.softmax_cross_entropy_backward(logits, labels, np.ones(2, np.float32))
    assert_close(g, [[1, 0, -1], [1 / 3, -2 / 3, 1 / 3]], rtol=1e-6, atol=1e-6, name="large logits grad")


@pytest.mark.parametrize("n,c", [(1, 2), (5, 10), (6, 4)])
def test_nll_loss(n, c):
    logp = R.softmax_forward(rand((n, c), 40), "log")
    labels = np.random.default_rng(41).integers(0, c, n)
    loss = R.nll_loss(logp, labels)
    assert_close(loss, [-logp[i, labels[i]] for i in range(n)], **F64_TOL, name="nll_loss")
    dloss = rand((n,), 42)
    g = R.nll_loss_backward(logp, labels, dloss)
    num = numerical_grad(lambda v: R.nll_loss(v, labels), logp, dloss)
    assert_close(g, num, **GRAD_TOL, name="nll_loss_backward")
    # log_softmax then nll is softmax cross-entropy.
    logits = rand((n, c), 43)
    assert_close(R.nll_loss(R.softmax_forward(logits, "log"), labels), R.softmax_cross_entropy(logits, labels),
                 **F64_TOL, name="nll(log_softmax) == cross-entropy")


# -- in-place helpers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inplace_helpers(dtype):
    x, y = rand((3, 4), 44, dtype), rand((3, 4), 45, dtype)
    y0 = y.copy()
    assert R.axpy(0.5, x, y) is y
    assert_close(y, y0 + 0.5 * x.astype(np.float64), rtol=1e-6, atol=1e-6, name="axpy")
    assert R.scal(-2.0, y) is y
    assert_close(y, -2.0 * (y0 + 0.5 * x.astype(np.float64)), rtol=1e-6, atol=1e-6, name="scal")
    assert R.fill(y, 3.25) is y and np.all(y == 3.25)
    assert R.fill(y, 0) is y and np.all(y == 0)
    assert R.copy(x, y) is y and np.array_equal(x, y)
    assert y.dtype == dtype


# -- dtypes and layout of every op ------------------------------------------------------------------------

def _all_ops(dtype):
    """(name, thunk) for every functional op on small inputs of the given dtype."""
    def r(shape, seed):
        return rand(shape, seed, dtype)
    x, w, b, dy = r((2, 4, 6, 6), 50), r((6, 2, 3, 3), 51), r((6,), 52), r((2, 6, 3, 3), 53)
    px, pdy = r((2, 3, 6, 6), 54), r((2, 3, 3, 3), 55)
    lx, lw, lb, ldy = r((4, 5), 56), r((3, 5), 57), r((3,), 58), r((4, 3), 59)
    labels, dloss = np.array([0, 2, 1, 2]), r((4,), 60)
    conv = {"stride": 2, "padding": 1, "groups": 2}
    return [
        ("conv_forward", lambda: R.conv_forward(x, w, b, **conv)),
        ("conv_backward_data", lambda: R.conv_backward_data(w, dy, x.shape, **conv)),
        ("conv_backward_filter", lambda: R.conv_backward_filter(x, dy, w.shape, **conv)),
        ("conv_backward_bias", lambda: R.conv_backward_bias(dy)),
        ("add_tensor", lambda: R.add_tensor(x, r((4,), 61))),
        ("activation_forward", lambda: R.activation_forward(x, "elu", 1.0)),
        ("activation_backward", lambda: R.activation_backward(x, x, x, "sigmoid")),
        *[(f"pooling_forward {m}", lambda m=m: R.pooling_forward(px, m, 3, 2, 1)) for m in POOL_MODES],
        *[(f"pooling_backward {m}", lambda m=m: R.pooling_backward(pdy, pdy, px, m, 3, 2, 1)) for m in POOL_MODES],
        ("softmax_forward", lambda: R.softmax_forward(x, "log", "channel")),
        ("softmax_backward", lambda: R.softmax_backward(x, x, "accurate", "instance")),
        ("gemm", lambda: R.gemm(lx, lw, r((4, 3), 62), trans_b=True, alpha=0.5, beta=0.5)),
        ("linear_forward", lambda: R.linear_forward(lx, lw, lb)),
        *[(f"linear_backward[{i}]", lambda i=i: R.linear_backward(lx, lw, ldy)[i]) for i in range(3)],
        ("softmax_cross_entropy", lambda: R.softmax_cross_entropy(ldy, labels)),
        ("softmax_cross_entropy_backward", lambda: R.softmax_cross_entropy_backward(ldy, labels, dloss)),
        ("nll_loss", lambda: R.nll_loss(ldy, labels)),
        ("nll_loss_backward", lambda: R.nll_loss_backward(ldy, labels, dloss)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_op_keeps_dtype_and_is_c_contiguous(dtype):
    for name, thunk in _all_ops(dtype):
        out = thunk()
        assert isinstance(out, np.ndarray), name
        assert out.dtype == dtype, f"{name}: {dtype.__name__} in gave {out.dtype} out"
        assert out.flags.c_contiguous, f"{name}: output is not C-contiguous"


def test_float32_ops_close_to_float64():
    for (name, t32), (_, t64) in zip(_all_ops(np.float32), _all_ops(np.float64), strict=True):
        assert_close(t32(), t64(), rtol=1e-4, atol=1e-5, name=f"{name} float32 vs float64")
