"""Every op on the GPU against the float64 numpy reference, forward and backward (marker ``gpu``).

Inputs are random float32 (never zeros); the reference runs in float64 on the same values. Strict FP32
(the default math mode) lands far under 1e-4 relative error; TF32 near 3e-4, so its test uses 2e-2.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as d
from dnnbind.ops import reference as R
from tests._helpers import assert_close

pytestmark = pytest.mark.gpu

RTOL, ATOL = 1e-4, 1e-4


def rnd(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def g(a):
    return d.array(a, device="gpu")


def f64(a):
    return np.asarray(a, np.float64)


def tol_for(expected, k=1.0):
    # Sums of many terms: scale the absolute tolerance by the reference's magnitude.
    return RTOL, ATOL * k * max(1.0, float(np.abs(expected).max()))


CONV_CASES = [  # x shape, w shape, stride, padding, dilation, groups
    ((64, 1, 28, 28), (32, 1, 3, 3), 1, 1, 1, 1),    # the model's conv1
    ((64, 32, 14, 14), (64, 32, 3, 3), 1, 1, 1, 1),  # the model's conv2
    ((1, 3, 9, 7), (5, 3, 3, 3), 2, 0, 1, 1),        # batch 1, odd sizes, stride 2
    ((3, 4, 11, 10), (6, 4, 3, 2), (2, 1), (1, 2), 1, 1),
    ((2, 3, 12, 12), (4, 3, 3, 3), 1, 2, 2, 1),      # dilation 2
    ((5, 6, 8, 8), (6, 2, 3, 3), 1, 1, 1, 3),        # groups 3
    ((7, 2, 5, 5), (3, 2, 1, 1), 1, 0, 1, 1),        # 1x1
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_forward_and_backward(case):
    xs, ws, stride, padding, dilation, groups = case
    x, w, b = rnd(xs, 1), rnd(ws, 2), rnd((ws[0],), 3)
    y_ref = R.conv_forward(f64(x), f64(w), f64(b), stride, padding, dilation, groups)
    y = d.conv_forward(g(x), g(w), g(b), stride, padding, dilation, groups)
    assert isinstance(y, d.NDArray) and y.device == d.gpu(0)
    assert_close(y, y_ref, *tol_for(y_ref), name="conv_forward")
    dy = rnd(y_ref.shape, 4)
    dx_ref = R.conv_backward_data(f64(w), f64(dy), xs, stride, padding, dilation, groups)
    dw_ref = R.conv_backward_filter(f64(x), f64(dy), ws, stride, padding, dilation, groups)
    assert_close(d.conv_backward_data(g(w), g(dy), xs, stride, padding, dilation, groups), dx_ref,
                 *tol_for(dx_ref), name="conv_backward_data")
    assert_close(d.conv_backward_filter(g(x), g(dy), ws, stride, padding, dilation, groups), dw_ref,
                 *tol_for(dw_ref), name="conv_backward_filter")
    db_ref = R.conv_backward_bias(f64(dy))
    assert_close(d.conv_backward_bias(g(dy)), db_ref, *tol_for(db_ref), name="conv_backward_bias")
    from dnnbind.ops.conv import conv_backward_bias_gemv
    assert_close(conv_backward_bias_gemv(g(dy)), db_ref, *tol_for(db_ref), name="conv_backward_bias_gemv")


def test_conv_numpy_in_numpy_out_and_float64():
    x, w = rnd((2, 3, 7, 7), 5, np.float64), rnd((4, 3, 3, 3), 6, np.float64)
    y = d.conv_forward(x, w, padding=1)  # numpy in -> numpy out, computed on the GPU
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert_close(y, R.conv_forward(x, w, padding=1), 1e-10, 1e-10, name="conv float64")


@pytest.mark.parametrize("mode,coef", [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 0.7),
                                       ("elu", 0.9)])
@pytest.mark.parametrize("shape", [(64, 32, 28, 28), (1, 5), (3, 7, 5, 2)])
def test_activation(mode, coef, shape):
    x = rnd(shape, 7)
    y_ref = R.activation_forward(f64(x), mode, coef)
    y = d.activation_forward(g(x), mode, coef)
    assert_close(y, y_ref, 1e-5, 1e-6, name=f"{mode} forward")
    dy = rnd(shape, 8)
    dx_ref = R.activation_backward(y_ref, f64(dy), f64(x), mode, coef)
    assert_close(d.activation_backward(y, g(dy), g(x), mode, coef), dx_ref, 1e-4, 1e-5, name=f"{mode} backward")


@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_pad"])
@pytest.mark.parametrize("xs,window,stride,padding", [((64, 32, 28, 28), 2, 2, 0), ((1, 3, 9, 7), 3, 2, 1),
                                                      ((3, 2, 8, 8), (3, 2), (1, 2), (1, 0)), ((5, 4, 7, 7), 2, 1, 0)])
def test_pooling(mode, xs, window, stride, padding):
    x = rnd(xs, 9)
    y_ref = R.pooling_forward(f64(x), mode, window, stride, padding)
    y = d.pooling_forward(g(x), mode, window, stride, padding)
    assert_close(y, y_ref, 1e-5, 1e-6, name=f"pool {mode}")
    dy = rnd(y_ref.shape, 10)
    dx_ref = R.pooling_backward(y_ref, f64(dy), f64(x), mode, window, stride, padding)
    dx = d.pooling_backward(y, g(dy), g(x), mode, window, stride, padding)
    assert_close(dx, dx_ref, 1e-5, 1e-5, name=f"pool {mode} backward")


@pytest.mark.parametrize("algorithm", ["accurate", "log"])
@pytest.mark.parametrize("mode,shape", [("instance", (64, 10)), ("instance", (3, 4, 5, 2)), ("channel", (2, 6, 3, 3)),
                                        ("instance", (1, 1000))])
def test_softmax(algorithm, mode, shape):
    x = rnd(shape, 11) * 3
    y_ref = R.softmax_forward(f64(x), algorithm, mode)
    y = d.softmax_forward(g(x), algorithm, mode)
    assert_close(y, y_ref, 1e-5, 1e-6, name="softmax")
    dy = rnd(shape, 12)
    dx_ref = R.softmax_backward(y_ref, f64(dy), algorithm, mode)
    assert_close(d.softmax_backward(y, g(dy), algorithm, mode), dx_ref, 1e-4, 1e-5, name="softmax backward")


@pytest.mark.parametrize("m,n,k", [(64, 128, 3136), (1, 7, 5), (33, 17, 65)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm(m, n, k, ta, tb):
    a = rnd((k, m) if ta else (m, k), 13)
    b = rnd((n, k) if tb else (k, n), 14)
    c = rnd((m, n), 15)
    ref = R.gemm(f64(a), f64(b), f64(c), ta, tb, 0.5, 2.0)
    assert_close(d.gemm(g(a), g(b), g(c), ta, tb, 0.5, 2.0), ref, *tol_for(ref, 10), name="gemm")


@pytest.mark.parametrize("n,k,units", [(64, 3136, 128), (1, 5, 3), (17, 128, 10)])
def test_linear(n, k, units):
    x, w, b = rnd((n, k), 16), rnd((units, k), 17), rnd((units,), 18)
    ref = R.linear_forward(f64(x), f64(w), f64(b))
    assert_close(d.linear_forward(g(x), g(w), g(b)), ref, *tol_for(ref, 10), name="linear")
    dy = rnd((n, units), 19)
    dx, dw, db = d.linear_backward(g(x), g(w), g(dy))
    rdx, rdw, rdb = R.linear_backward(f64(x), f64(w), f64(dy))
    for name, a, e in (("dx", dx, rdx), ("dw", dw, rdw), ("db", db, rdb)):
        assert_close(a, e, *tol_for(e, 10), name=name)


@pytest.mark.parametrize("n,c", [(64, 10), (1, 3), (37, 1000)])
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_losses(n, c, label_dtype):
    logits = rnd((n, c), 20) * 4
    labels = np.random.default_rng(21).integers(0, c, n).astype(label_dtype)
    dl = rnd((n,), 22)
    ref = R.softmax_cross_entropy(f64(logits), labels)
    assert_close(d.softmax_cross_entropy(g(logits), g(labels)), ref, 1e-5, 1e-5, name="xent")
    assert_close(d.softmax_cross_entropy_backward(g(logits), g(labels), g(dl)),
                 R.softmax_cross_entropy_backward(f64(logits), labels, f64(dl)), 1e-5, 1e-6, name="xent backward")
    logp = R.softmax_forward(f64(logits), "log").astype(np.float32)
    assert_close(d.nll_loss(g(logp), g(labels)), R.nll_loss(f64(logp), labels), 1e-6, 1e-6, name="nll")
    assert_close(d.nll_loss_backward(g(logp), g(labels), g(dl)), R.nll_loss_backward(f64(logp), labels, f64(dl)),
                 0, 0, name="nll backward")


def test_add_tensor_and_inplace_helpers():
    x, b = rnd((4, 6, 5, 5), 23), rnd((6,), 24)
    assert_close(d.add_tensor(g(x), g(b)), R.add_tensor(f64(x), f64(b)), 1e-6, 1e-6, name="add_tensor")
    y0, xv = rnd((1000,), 25), rnd((1000,), 26)
    y = g(y0)
    d.axpy(0.5, g(xv), y)
    assert_close(y, f64(y0) + 0.5 * f64(xv), 1e-6, 1e-6, name="axpy")
    d.scal(-2.0, y)
    assert_close(y, -2 * (f64(y0) + 0.5 * f64(xv)), 1e-6, 1e-6, name="scal")
    d.fill(y, 3.25)
    assert_close(y, np.full(1000, 3.25), 0, 0, name="fill")
    d.copy(g(xv), y)
    assert_close(y, xv, 0, 0, name="copy")


def test_tf32_mode_is_selectable():
    x, w = rnd((64, 32, 14, 14), 27), rnd((64, 32, 3, 3), 28)
    ref = R.conv_forward(f64(x), f64(w), padding=1)
    with d.math_scope("tf32"):
        y = d.conv_forward(g(x), g(w), padding=1)
    assert d.math_mode() == "fp32"
    assert_close(y, ref, 2e-2, 2e-2 * np.abs(ref).max(), name="conv tf32")


def test_device_array_round_trip_and_views():
    host = rnd((6, 4, 3), 29)
    a = d.array(host, device="gpu")
    assert a.shape == host.shape and a.dtype == np.float32 and a.device == d.gpu(0)
    np.testing.assert_array_equal(a.numpy(), host)
    np.testing.assert_array_equal(a.to("cpu").numpy(), host)
    np.testing.assert_array_equal(a[2:5].numpy(), host[2:5])
    np.testing.assert_array_equal(a.reshape((0, -1)).numpy(), host.reshape(6, -1))
    a[1:3] = np.zeros((2, 4, 3), np.float32) + 7
    assert (a.numpy()[1:3] == 7).all() and (a.numpy()[0] == host[0]).all()
    for dt in (np.float64, np.float16, np.int32, np.uint8):
        v = (host * 10).astype(dt)
        np.testing.assert_array_equal(d.array(v, device="gpu").numpy(), v)
    cai = a.__cuda_array_interface__
    assert cai["data"][0] == a.ptr and cai["shape"] == (6, 4, 3) and cai["version"] == 3


def test_errors_leave_the_process_usable():
    x = g(rnd((2, 3, 8, 8), 30))
    with pytest.raises(ValueError, match="conv_forward"):
        d.conv_forward(x, g(rnd((4, 2, 3, 3), 31)))
    with pytest.raises(ValueError, match="all arrays must be on one device"):
        d.conv_forward(x, d.array(rnd((4, 3, 3, 3), 32), device="cpu"))
    with pytest.raises(TypeError, match="conv_forward"):
        d.conv_forward(x.astype(np.int32), g(rnd((4, 3, 3, 3), 33)))
    # a library error, raised by cuDNN itself, names the function, the status and cuDNN's text
    from dnnbind.ops import descriptors as D
    with pytest.raises(d.CudnnBadParam, match="cudnnSetTensor4dDescriptor.*2000"):
        D.TensorDesc((0, 3, 4, 4), np.dtype(np.float32))
    y = d.activation_forward(x, "relu")  # still works
    assert_close(y, np.maximum(x.numpy(), 0), 0, 0, name="relu after errors")


def test_cupy_zero_copy():
    cp = pytest.importorskip("cupy")
    c = cp.arange(12, dtype=cp.float32).reshape(3, 4)
    a = d.array(c)
    assert a.ptr == c.data.ptr and a.shape == (3, 4)
    y = d.activation_forward(a, "relu")
    back = cp.asarray(y)  # CuPy reads our __cuda_array_interface__
    assert back.data.ptr == y.ptr
    np.testing.assert_array_equal(cp.asnumpy(back), np.maximum(np.arange(12, dtype=np.float32).reshape(3, 4), 0))
    z = d.from_dlpack(c)
    assert z.ptr == c.data.ptr
    c2 = cp.from_dlpack(y)
    assert c2.data.ptr == y.ptr


def test_torch_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.randn(4, 5, device="cuda")
    a = d.array(t)
    assert a.ptr == t.data_ptr()
    y = d.softmax_forward(a)
    ty = torch.from_dlpack(y)
    assert ty.data_ptr() == y.ptr
    torch.testing.assert_close(ty, torch.softmax(t, dim=1), rtol=1e-5, atol=1e-6)
    z = d.from_dlpack(t)
    assert z.ptr == t.data_ptr()
    ta = torch.as_tensor(y, device="cuda")  # through __cuda_array_interface__
    assert ta.data_ptr() == y.ptr


def test_show_time_and_events(capsys):
    a = g(rnd((1 << 20,), 34))
    t = d.show_time(lambda: d.activation_forward(a, "relu"), warmup=3, repeat=10)
    assert len(t.gpu_us) == 10 and t.median_us > 0
    info = d.show_config()
    assert info["gpus"]["count"] >= 1 and "cudnn" in capsys.readouterr().out


def test_conv_algorithms_per_objective_and_reused_from_disk(monkeypatch):
    """Eager and graph objectives choose separately; a later process reuses the choices from the disk cache."""
    from dnnbind.ops import algo_cache, algos
    x, w = rnd((3, 5, 11, 9), 40), rnd((7, 5, 3, 3), 41)  # a shape no other test uses
    expected = R.conv_forward(f64(x), f64(w), None, 1, 1, 1, 1)
    y_eager = d.ops.conv_forward(g(x), g(w), padding=1).numpy()
    with algos.optimize_for("graph"):
        y_graph = d.ops.conv_forward(g(x), g(w), padding=1).numpy()
        assert algos.objective() == "graph"
    assert algos.objective() == "eager"
    mine = lambda table: [k for k in algos.chosen(table) if k[0] == "fwd" and k[1] == (3, 5, 11, 9)]  # noqa: E731
    assert len(mine("eager")) == 1 and len(mine("graph")) == 1
    b = rnd((7,), 42)
    d.ops.conv_bias_relu_forward(g(x), g(w), g(b), padding=1)
    fused = [v for k, v in algos.chosen("eager").items() if k[0] == "fwd_bias_relu" and k[1] == (3, 5, 11, 9)]
    # the only legacy algorithm cuDNN documents for it, unless a backend plan of the fused graph was faster
    assert fused and (fused[0][0] == "IMPLICIT_PRECOMP_GEMM" or fused[0][0].startswith("backend eng")), fused
    assert_close(y_eager, expected, *tol_for(expected))
    assert_close(y_graph, expected, *tol_for(expected))
    eager_choice = algos.chosen("eager")[mine("eager")[0]]

    # a new process: nothing in memory, so the choice must come from the file, with no timing
    algos.forget_choices()
    algo_cache.forget()

    def no_timing(*_a, **_k):
        raise AssertionError("the algorithm was timed again instead of read from the disk cache")

    monkeypatch.setattr(algos, "_time_candidates", no_timing)
    y_again = d.ops.conv_forward(g(x), g(w), padding=1).numpy()
    assert algos.chosen("eager")[mine("eager")[0]] == eager_choice
    assert_close(y_again, expected, *tol_for(expected))
    with pytest.raises(ValueError, match="optimize_for"):
        with algos.optimize_for("fastest"):
            pass


def test_conv_argument_checks_still_apply_after_a_cached_call():
    """Conv calls cache their checked arguments per argument set; equal-hashing spellings must still be refused."""
    x, w = g(rnd((2, 3, 8, 8), 50)), g(rnd((4, 3, 3, 3), 51))
    expected = R.conv_forward(f64(x.numpy()), f64(w.numpy()), None, 1, 1, 1, 1)
    for _ in range(2):  # the second call takes the cached plan
        assert_close(d.ops.conv_forward(x, w, stride=1, padding=1).numpy(), expected, *tol_for(expected))
    for bad in (True, 1.0, (1, True)):
        with pytest.raises(TypeError, match="conv_forward: stride"):
            d.ops.conv_forward(x, w, stride=bad, padding=1)
    with pytest.raises(ValueError, match="conv_forward"):  # another shape is checked afresh
        d.ops.conv_forward(x, g(rnd((4, 2, 3, 3), 52)), stride=1, padding=1)


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_ops_through_backend_plans_match_reference(case, monkeypatch):
    """The conv ops forced onto cuDNN backend-API plans (cudnnBackendExecute) where any exist: same results.
    Grouped convs have none here (ops.conv_backend builds groups=1 graphs) and keep the legacy calls."""
    from dnnbind.ops import algo_cache, algos
    from dnnbind.ops import conv as conv_mod

    def first_backend(cands, run, device, target="graph"):
        for algo, ws, _ in cands:
            if algo >= algos.BACKEND:
                return algo, ws
        return cands[0][:2]

    monkeypatch.setitem(algos._policy, "backend", True)  # also under DNNBIND_CONV_BACKEND=0
    monkeypatch.setattr(conv_mod, "SMALL_FILTER_KERNEL", False)  # the fused plans, not dn_small_fwd, for few taps
    monkeypatch.setattr(algos, "_time_candidates", first_backend)
    monkeypatch.setattr(algo_cache, "lookup", lambda *a: None)
    monkeypatch.setattr(algo_cache, "store", lambda *a: None)
    saved = algos.forget_choices()
    try:
        xs, ws, stride, padding, dilation, groups = case
        x, w, dy = rnd(xs, 11), rnd(ws, 12), None
        y_ref = R.conv_forward(f64(x), f64(w), None, stride, padding, dilation, groups)
        with d.trace() as t:
            y = d.conv_forward(g(x), g(w), None, stride, padding, dilation, groups)
        assert_close(y, y_ref, *tol_for(y_ref), name="conv_forward (backend)")
        dy = rnd(y_ref.shape, 13)
        dx_ref = R.conv_backward_data(f64(w), f64(dy), xs, stride, padding, dilation, groups)
        dw_ref = R.conv_backward_filter(f64(x), f64(dy), ws, stride, padding, dilation, groups)
        assert_close(d.conv_backward_data(g(w), g(dy), xs, stride, padding, dilation, groups), dx_ref,
                     *tol_for(dx_ref), name="conv_backward_data (backend)")
        assert_close(d.conv_backward_filter(g(x), g(dy), ws, stride, padding, dilation, groups), dw_ref,
                     *tol_for(dw_ref), name="conv_backward_filter (backend)")
        if groups == 1:  # the fused conv+bias+relu: a backend graph of three operations
            b = rnd((ws[0],), 14)
            fused_ref = np.maximum(R.conv_forward(f64(x), f64(w), f64(b), stride, padding, dilation, groups), 0)
            assert_close(d.ops.conv_bias_relu_forward(g(x), g(w), g(b), stride, padding, dilation, groups),
                         fused_ref, *tol_for(fused_ref), name="conv_bias_relu_forward (backend)")
        seen = set()
        for k, (name, _) in algos.chosen("eager").items():
            if k[1:3] != (tuple(xs), tuple(ws)):
                continue
            # the choice's key is (direction, *plan key, alignment); the plan lists are kept per alignment too
            plans = [v for kk, v in conv_mod._engines.items()
                     if kk[0] == k[0] and kk[1] == k[1:-1] and kk[-1] == k[-1]]
            if plans and plans[0]:
                assert name.startswith("backend eng"), (k, name)
            else:
                assert not name.startswith("backend"), (k, name)
            seen.add((k[0], bool(plans and plans[0])))
        assert {"fwd", "bwd_data", "bwd_filter"} <= {direction for direction, _ in seen}, seen
        if groups == 1:  # every ungrouped case has single-conv plans on an H100 (9.19); the trace names the plan
            assert all(has for direction, has in seen if direction != "fwd_bias_relu"), seen
            execs = [r for r in t.records if r.function == "cudnnBackendExecute" and r.op == "conv_forward"]
            assert execs and execs[-1].details.get("algo", "").startswith("backend eng"), t.records
    finally:
        algos.restore_choices(saved)


@pytest.fixture
def fresh_algo_choices(monkeypatch):
    """No conv algorithm chosen yet, none on disk, an empty per-stream workspace; all restored afterwards."""
    from dnnbind.ops import _common, algo_cache, algos
    monkeypatch.setattr(algo_cache, "lookup", lambda *a: None)
    monkeypatch.setattr(algo_cache, "store", lambda *a: None)
    monkeypatch.setattr(_common, "_workspaces", {})
    saved = algos.forget_choices()
    yield algos
    algos.restore_choices(saved)


# a 5x5 conv on 26x26: cuDNN offers FFT/Winograd-style candidates needing hundreds of MiB of scratch
BIG_WS_CASE = ((64, 48, 26, 26), (96, 48, 5, 5), 1, 2, 1, 1)


def test_algorithm_search_leaves_only_the_chosen_workspace(fresh_algo_choices):
    """Timing every candidate must not leave the largest candidate's scratch allocated for the process: the shared
    workspace ends no larger than the largest chosen algorithm's that it serves (rounded to 2 MiB; one above
    ops._common.SHARED_WORKSPACE_MAX is borrowed from the pool per call instead), and results stay right."""
    from dnnbind.ops import _common
    algos = fresh_algo_choices
    seen = []
    real = algos.candidates
    algos_candidates = lambda *a: seen.extend(c[1] for c in real(*a)) or real(*a)  # noqa: E731
    try:
        algos.candidates = algos_candidates
        xs, ws, stride, padding, dilation, groups = BIG_WS_CASE
        x, w = rnd(xs, 60), rnd(ws, 61)
        y_ref = R.conv_forward(f64(x), f64(w), None, stride, padding, dilation, groups)
        y = d.conv_forward(g(x), g(w), None, stride, padding, dilation, groups)
        dy = rnd(y_ref.shape, 62)
        dx = d.ops.conv_backward_data(g(w), g(dy), xs, stride, padding, dilation, groups)
    finally:
        algos.candidates = real
    assert_close(y, y_ref, *tol_for(y_ref))
    dx_ref = R.conv_backward_data(f64(w), f64(dy), xs, stride, padding, dilation, groups)
    assert_close(dx, dx_ref, *tol_for(dx_ref))
    chosen = [ws for k, (_, ws) in algos.chosen().items() if k[1] == xs]
    buffers = [b.nbytes for b in _common._workspaces.values()]
    largest_chosen = max([c for c in chosen if c <= _common.SHARED_WORKSPACE_MAX], default=0)
    assert max(buffers, default=0) == -(-largest_chosen // (2 << 20)) * (2 << 20), (buffers, chosen)
    assert max(buffers, default=0) <= _common.SHARED_WORKSPACE_MAX
    if max(seen) > 2 * max(largest_chosen, 2 << 20):  # the search did try a much bigger one
        assert max(buffers, default=0) < max(seen)


def test_workspace_limit_keeps_the_search_within_it(fresh_algo_choices):
    """set_conv_algo_policy(workspace_limit_mb=0): only algorithms without scratch are timed and chosen; the policy
    change forgets earlier choices; bad limits are refused by name."""
    algos = fresh_algo_choices
    before = algos._policy["workspace_limit"] >> 20
    try:
        d.set_conv_algo_policy("time", workspace_limit_mb=0)
        xs, ws, stride, padding, dilation, groups = BIG_WS_CASE
        x, w = rnd(xs, 63), rnd(ws, 64)
        y_ref = R.conv_forward(f64(x), f64(w), None, stride, padding, dilation, groups)
        assert_close(d.conv_forward(g(x), g(w), None, stride, padding, dilation, groups), y_ref, *tol_for(y_ref))
        chosen = {k: v for k, v in algos.chosen().items() if k[1] == xs}
        assert chosen and all(ws_bytes == 0 for _, ws_bytes in chosen.values()), chosen
    finally:
        d.set_conv_algo_policy("time", workspace_limit_mb=before)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_conv_choice_follows_pointer_alignment(fresh_algo_choices, dtype):
    """Calls whose pointers are all 16-byte aligned choose among backend plans built for that alignment; a call on
    a view at an odd element offset (aligned to its element size only) gets its own choice among plans built for
    the element size. Both are right, forward, backward data and backward filter."""
    from dnnbind.ops import conv as conv_mod
    algos = fresh_algo_choices
    xs, ws = (3, 5, 7, 7), (4, 5, 3, 3)
    n = int(np.prod(xs))
    flat = rnd((n + 1,), 70, dtype)
    x_aligned = g(flat[:n].reshape(xs))
    x_odd = g(flat)[1:].reshape(xs)  # a view one element in: 4 (float32) or 2 (float16) bytes past the 256
    assert x_odd.ptr % 16 and not x_aligned.ptr % 16
    w, dy = rnd(ws, 71, dtype), rnd((3, 4, 7, 7), 72, dtype)
    dy_odd = g(np.concatenate([rnd((1,), 73, dtype), dy.ravel()]))[1:].reshape(dy.shape)
    for x, x_host in ((x_aligned, flat[:n]), (x_odd, flat[1:])):
        x_host = f64(x_host.reshape(xs))
        y_ref = R.conv_forward(x_host, f64(w), None, 1, 1, 1, 1)
        assert_close(d.conv_forward(x, g(w), None, 1, 1).numpy(), y_ref, *_tol(y_ref, dtype))
    dx_ref = R.conv_backward_data(f64(w), f64(dy), xs, 1, 1, 1, 1)
    dw_ref = R.conv_backward_filter(f64(flat[1:].reshape(xs)), f64(dy), ws, 1, 1, 1, 1)
    for dyg in (g(dy), dy_odd):
        assert_close(d.conv_backward_data(g(w), dyg, xs, 1, 1).numpy(), dx_ref, *_tol(dx_ref, dtype))
    assert_close(d.conv_backward_filter(x_odd, dy_odd, ws, 1, 1).numpy(), dw_ref, *_tol(dw_ref, dtype))
    itemsize = np.dtype(dtype).itemsize
    keys = [k for k in algos.chosen() if k[1] == xs and k[7] == np.dtype(dtype).str]
    by_direction = {}
    for k in keys:
        by_direction.setdefault(k[0], set()).add(k[-1])
    assert by_direction["fwd"] == {conv_mod.ALIGNED, itemsize}, keys
    assert by_direction["bwd_data"] == {conv_mod.ALIGNED, itemsize}, keys
    assert by_direction["bwd_filter"] == {itemsize}, keys
    plan_lists = {kk[-1] for kk in conv_mod._engines if kk[1][:2] == (xs, ws) and kk[1][6] == np.dtype(dtype).str}
    assert plan_lists <= {conv_mod.ALIGNED, itemsize}, plan_lists


def _tol(expected, dtype):
    """float32 as tol_for; float16 results (float accumulation, one rounding to half) within 1e-2 relative."""
    if np.dtype(dtype) == np.float16:
        return 1e-2, 1e-2 * max(1.0, float(np.abs(expected).max()))
    return tol_for(expected)
