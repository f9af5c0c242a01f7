"""ops.bias_relu_backward, the channel-sum kernel and the max-pool kernels of ops.pooling on a FAKED device (CPU):
GPU NDArrays at made-up addresses backed by numpy buffers, and each launch of an ops._nn_kernels kernel run as a
numpy transcription of its CUDA loops (grid, slices, pack offsets, partial slots, the final sum, the pooling
window and edge logic; and ops._wgrad_kernels' dn_wgrad and its final sum, whose tests are in test_wgrad_small.py).
What this checks: the ops' launch arguments and geometry, that every output element is written exactly once, and
the results against the numpy twin. What it cannot: the CUDA code itself (compiled in test_nn_kernels.py and
test_wgrad_small.py, run in test_gpu_nn_kernels.py and test_wgrad_small_gpu.py).
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import dnnbind
from dnnbind.ops import _common as CM
from dnnbind.ops import _nn_kernels as K
from dnnbind.ops import _wgrad_kernels as KW
from dnnbind.ops import bias_relu as BR
from dnnbind.ops import conv as CV
from dnnbind.ops import pooling as PO
from dnnbind.ops import reference as R
from dnnbind.runtime.array import NDArray
from tests._helpers import assert_close
from tests.test_nn_kernels import BIAS_SHAPES, POOL_CASES, nhwc_shape, relu_out, rnd, tied

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SENTINEL = 12345.0  # what fresh fake memory holds: a value no kernel writes by chance
_CTYPES = {"float": F32, "dn_half": F16}


class FakeDevice:
    def __init__(self, monkeypatch):
        self.mem: dict[int, np.ndarray] = {}
        self.writes: dict[int, np.ndarray] = {}  # per allocation: how often each element was written
        self.launches: list = []
        self.next = 1 << 20
        self.dev = dnnbind.gpu(0)
        for mod in (BR, CV, PO, CM):  # CM: result_array's new arrays (bias_relu's db)
            monkeypatch.setattr(mod, "out_like", self.empty)
        monkeypatch.setattr(BR, "empty", self.empty)
        for mod in (BR, PO):
            monkeypatch.setattr(mod, "current_stream", lambda device: None)
        monkeypatch.setattr(K, "kernel", lambda name: _Launcher(self, name))
        monkeypatch.setattr(KW, "kernel", lambda name: _Launcher(self, name))  # ops.bias_relu_wgrad's kernels

    def empty(self, shape, dtype, device=None, offset=0):
        dtype, size = np.dtype(dtype), int(np.prod(shape))
        ptr, self.next = self.next + offset, self.next + (-(-(size * dtype.itemsize + offset) // 256) + 1) * 256
        self.mem[ptr] = np.full(size, SENTINEL, dtype)
        self.writes[ptr] = np.zeros(size, int)
        return NDArray._from_ptr(ptr, shape, dtype, self.dev, None)

    def put(self, a, offset=0):
        out = self.empty(a.shape, a.dtype, offset=offset)
        self.mem[out.ptr][:] = a.ravel()
        return out

    def get(self, a):
        return self.mem[a.ptr].reshape(a.shape).copy()

    def written_once(self, a):
        return bool((self.writes[a.ptr] == 1).all())


class _Launcher:
    def __init__(self, fake, name):
        self.fake, self.name = fake, name

    def launch(self, grid, block, args, stream=None):
        grid = grid if isinstance(grid, tuple) else (grid,)
        block = block if isinstance(block, tuple) else (block,)
        self.fake.launches.append((self.name, grid, block))
        kind, params = re.fullmatch(r"(\w+)<(.*)>", self.name).groups()
        params = [p.strip() for p in params.split(",")]
        dtype = _CTYPES[params[0]]
        ptrs = [a for a in args if isinstance(a, NDArray)]
        assert all(a.dtype in (dtype, F32) for a in ptrs), (self.name, [a.dtype for a in ptrs])
        assert all(type(a) is int or isinstance(a, ctypes.Structure) for a in args
                   if not isinstance(a, NDArray) and a is not None), args
        getattr(self, kind)(grid, block, params, *args)

    def buf(self, a):
        return None if a is None else self.fake.mem[a.ptr]

    def store(self, a, index, values):
        self.fake.mem[a.ptr][index] = values
        np.add.at(self.fake.writes[a.ptr], index, 1)

    def _check_packs(self, width, *arrays):
        for a in arrays:
            if a is not None:
                assert a.ptr % (width * a.dtype.itemsize) == 0, f"{self.name}: pointer not aligned to its packs"

    def _put(self, part, db, s_total, c, s, total):
        if s_total == 1:
            self.store(db, [c], np.float32(total).astype(db.dtype))
        else:
            self.store(part, [c * s_total + s], np.float32(total))

    def _take(self, relu, y, dy, dz, el):
        d = self.buf(dy)[el].astype(np.float32)
        if relu:
            on = self.buf(y)[el].astype(np.float32) > 0
            self.store(dz, el, np.where(on, self.buf(dy)[el], 0))
            d = np.where(on, d, np.float32(0))
        return d

    def dn_chan_nchw(self, grid, block, params, y, dy, dz, part, db, c_, hwv, groups, chunk):
        width, relu = int(params[1]), params[2] == "true"
        assert block == (K.BLOCK, 1) and grid[0] == c_ and (part is None) == (grid[1] == 1)
        self._check_packs(width, y, dy, dz)
        for c in range(c_):
            for s in range(grid[1]):
                g = np.arange(s * chunk, min((s + 1) * chunk, groups))
                n = g // hwv
                el = (((n * c_ + c) * hwv + (g - n * hwv))[:, None] * width + np.arange(width)).ravel()
                self._put(part, db, grid[1], c, s, self._take(relu, y, dy, dz, el).sum(dtype=np.float32))

    def dn_chan_nhwc(self, grid, block, params, y, dy, dz, part, db, c_, rows, chunk):
        width, relu = int(params[1]), params[2] == "true"
        tx_n, ty_n = block
        assert tx_n * ty_n == K.BLOCK and (part is None) == (grid[1] == 1)
        self._check_packs(width, y, dy, dz)
        cv = c_ // width
        for bx in range(grid[0]):
            for s in range(grid[1]):
                r = np.arange(s * chunk, min((s + 1) * chunk, rows))
                for tx in range(tx_n):
                    cp = bx * tx_n + tx
                    if cp >= cv:
                        continue
                    el = (r * cv + cp)[:, None] * width + np.arange(width)
                    d = self._take(relu, y, dy, dz, el.ravel()).reshape(el.shape)
                    for k in range(width):
                        self._put(part, db, grid[1], cp * width + k, s, d[:, k].sum(dtype=np.float32))

    def dn_chan_final(self, grid, block, params, part, db, c_, s_total):
        assert grid[0] * block[0] >= 32 * c_ and part.size == c_ * s_total
        sums = self.buf(part).reshape(c_, s_total).sum(axis=1, dtype=np.float32)
        self.store(db, np.arange(c_), sums.astype(db.dtype))

    def dn_wgrad(self, grid, block, params, x, y, dy, part, dw, db, g):
        """Block (bx, s): channels (bx * TX + tx) * KB + j, the slice's positions; x gathered through the Geometry
        tables and dn_div's multiply (the kernel's own index math), sums in float32 (in numpy's order)."""
        taps, kb, nhwc = int(params[1]), int(params[2]), params[3] == "true"
        tx_n = block[0] if nhwc else 1
        assert block[0] * block[1] == K.BLOCK and (nhwc or block == (K.BLOCK, 1))
        assert (part is None) == (grid[1] == 1) and grid[0] * tx_n * kb >= g.K > (grid[0] - 1) * tx_n * kb
        xs, ys, dys = (self.buf(a).astype(np.float32) for a in (x, y, dy))
        for s in range(grid[1]):
            m = np.arange(s * g.CHUNK, min((s + 1) * g.CHUNK, g.ROWS), dtype=np.uint64)
            n = (((m * np.uint64(g.MUL_PQ)) >> np.uint64(32)) + m) >> np.uint64(g.SHR_PQ)
            pq = m - n * np.uint64(g.PQ)
            p = (((pq * np.uint64(g.MUL_Q)) >> np.uint64(32)) + pq) >> np.uint64(g.SHR_Q)
            n, pq, p, q, m = (a.astype(np.int64) for a in (n, pq, p, pq - p * np.uint64(g.Q), m))
            ih, iw = p * g.SH - g.PH, q * g.SW - g.PW
            base = n * g.CHW + (ih * g.W + iw) * g.XS
            xv = np.zeros((taps, m.size), np.float32)
            for t in range(taps):
                inside = (ih + g.dr[t] >= 0) & (ih + g.dr[t] < g.H) & (iw + g.dc[t] >= 0) & (iw + g.dc[t] < g.W)
                xv[t, inside] = xs[(base + g.off[t])[inside]]
            for bx in range(grid[0]):
                for c in range(tx_n):
                    for j in range(kb):
                        k = (bx * tx_n + c) * kb + j
                        if k >= g.K:
                            continue
                        o = m * g.K + k if nhwc else (n * g.K + k) * g.PQ + pq
                        dz = np.where(ys[o] > 0, dys[o], np.float32(0))
                        sums = np.append((xv * dz).sum(axis=1, dtype=np.float32), dz.sum(dtype=np.float32))
                        if grid[1] == 1:
                            self.store(dw, np.arange(k * taps, (k + 1) * taps), sums[:taps].astype(dw.dtype))
                            self.store(db, [k], sums[taps:].astype(db.dtype))
                        else:
                            self.store(part, (k * (taps + 1) + np.arange(taps + 1)) * grid[1] + s, sums)

    def dn_wgrad_final(self, grid, block, params, part, dw, db, k_, taps, s_total):
        assert grid[0] * block[0] >= 32 * k_ * (taps + 1) and part.size == k_ * (taps + 1) * s_total
        sums = self.buf(part).reshape(k_, taps + 1, s_total).sum(axis=2, dtype=np.float32)
        self.store(dw, np.arange(k_ * taps), sums[:, :taps].ravel().astype(dw.dtype))
        self.store(db, np.arange(k_), sums[:, taps].astype(db.dtype))

    def _windows(self, grid, params, total, c_, h, w, p_, q_, kh_, kw_):
        """Per output o: (base, sh, sw, p, q, kh, kw), as dn_window computes them."""
        kh = int(params[1]) or kh_
        kw = int(params[2]) or kw_
        assert grid[0] * K.BLOCK >= total
        for o in range(total):
            if params[3] == "true":
                c, t = o % c_, o // c_
                q, t2 = t % q_, t // q_
                p, n = t2 % p_, t2 // p_
                yield o, ((n * h + p * kh) * w + q * kw) * c_ + c, w * c_, c_, p, q, kh, kw
            else:
                q, t = o % q_, o // q_
                p = t % p_
                yield o, ((t // p_) * h + p * kh) * w + q * kw, w, 1, p, q, kh, kw

    def dn_maxpool_fwd(self, grid, block, params, x, y, total, *dims):
        xs = self.buf(x).astype(np.float32)
        for o, base, sh, sw, _, _, kh, kw in self._windows(grid, params, total, *dims):
            m = xs[base]
            for i in range(kh):
                for j in range(kw):
                    v = xs[base + i * sh + j * sw]
                    if v > m or v != v:
                        m = v
            self.store(y, [o], np.float32(m).astype(y.dtype))

    def dn_maxpool_bwd(self, grid, block, params, x, dy, dx, total, *dims):
        xs, g = self.buf(x).astype(np.float32), self.buf(dy)
        c_, h, w, p_, q_ = dims[:5]
        for o, base, sh, sw, p, q, kh, kw in self._windows(grid, params, total, *dims):
            win = [xs[base + i * sh + j * sw] for i in range(kh) for j in range(kw)]
            hit = -1 if any(v != v for v in win) else next(k for k, v in enumerate(win) if v == max(win))
            ih = h - p * kh if p + 1 == p_ else kh
            jw = w - q * kw if q + 1 == q_ else kw
            for i in range(ih):
                for j in range(jw):
                    tap = i < kh and j < kw and i * kw + j == hit
                    self.store(dx, [base + i * sh + j * sw], g[o] if tap else 0)


@pytest.fixture
def fake(monkeypatch):
    return FakeDevice(monkeypatch)


# -- bias_relu_backward and the channel sums ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", BIAS_SHAPES + [(64, 32, 28, 28), (8, 64, 12, 12), (2, 6, 3, 3)], ids=str)
def test_bias_relu_backward_kernels_match_the_twin(fake, shape, layout, dtype):
    shape = nhwc_shape(shape, layout)
    y, dy = relu_out(shape, 1, dtype), rnd(shape, 2, dtype)
    dz, db = dnnbind.ops.bias_relu_backward(fake.put(y), fake.put(dy), layout=layout)
    want_dz, want_db = R.bias_relu_backward(y, dy, layout)
    assert dz.dtype == dtype and db.dtype == dtype and fake.written_once(dz) and fake.written_once(db)
    np.testing.assert_array_equal(fake.get(dz), want_dz)
    k = 2e-3 if dtype == F16 else 1e-5
    assert_close(fake.get(db), want_db.astype(F64), k, k * max(1.0, np.abs(want_db.astype(F64)).max()), name="db")
    names = [n for n, _, _ in fake.launches]
    assert names[0].startswith(f"dn_chan_{layout.lower()}<") and names[0].endswith("true>") and len(names) <= 2


def test_db_goes_into_out_and_the_slices_fill_the_gpu(fake):
    y, dy = relu_out((64, 32, 28, 28), 3), rnd((64, 32, 28, 28), 4)
    out = fake.empty((32,), F32)
    dz, db = dnnbind.ops.bias_relu_backward(fake.put(y), fake.put(dy), out=out)
    assert db is out
    (name, grid, block), (final, fgrid, _) = fake.launches
    assert name == "dn_chan_nchw<float, 4, true>" and grid[0] == 32 and grid[0] * grid[1] >= 264
    assert final == "dn_chan_final<float>"
    assert_close(fake.get(db), R.bias_relu_backward(y, dy)[1], 1e-5, 1e-3, name="db")


def test_unaligned_arrays_take_scalar_loads(fake):
    y, dy = relu_out((2, 4, 4, 4), 5), rnd((2, 4, 4, 4), 6)
    dz, db = dnnbind.ops.bias_relu_backward(fake.put(y, offset=4), fake.put(dy))
    assert fake.launches[0][0] == "dn_chan_nchw<float, 1, true>"
    np.testing.assert_array_equal(fake.get(dz), R.bias_relu_backward(y, dy)[0])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (64, 64, 14, 14), (1, 1, 1, 1)], ids=str)
def test_conv_backward_bias_kernel_matches_the_twin(fake, shape, layout):
    dy = rnd(nhwc_shape(shape, layout), 7)
    db = BR.conv_backward_bias_kernel(fake.put(dy), layout=layout)
    assert all(n.endswith("false>") or n.startswith("dn_chan_final") for n, _, _ in fake.launches)
    assert_close(fake.get(db), R.conv_backward_bias(dy.astype(F64), layout), 1e-5, 1e-4, name="db")


def test_float64_keeps_the_library_calls(fake, monkeypatch):
    calls = []
    monkeypatch.setattr(BR, "activation_backward", lambda *a, **k: calls.append("relu") or a[1])
    monkeypatch.setattr(BR, "conv_backward_bias_gemv", lambda dz, out=None, layout="NCHW": calls.append("gemv"))
    y = fake.put(relu_out((2, 3, 4, 4), 8, F64))
    dnnbind.ops.bias_relu_backward(y, fake.put(rnd((2, 3, 4, 4), 9, F64)))
    assert calls == ["relu", "gemv"] and not fake.launches


# -- max pooling, window == stride ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POOL_CASES + [((2, 3, 28, 28), (2, 2)), ((1, 2, 14, 15), (2, 2))], ids=str)
def test_max_pool_kernels_match_the_twin(fake, case, layout, dtype):
    shape, window = nhwc_shape(case[0], layout), case[1]
    x = tied(shape, 10, dtype)
    x.flat[::13] = np.nan  # some windows hold a NaN
    y = dnnbind.ops.pooling_forward(fake.put(x), "max", window, layout=layout)
    want_y = R.pooling_forward(x, "max", window, layout=layout)
    assert y.dtype == dtype and fake.written_once(y)
    np.testing.assert_array_equal(fake.get(y), want_y)
    dy = rnd(want_y.shape, 11, dtype)
    dx = dnnbind.ops.pooling_backward(y, fake.put(dy), fake.put(x), "max", window, layout=layout)
    assert fake.written_once(dx)  # every element, the edges outside all windows included, exactly once
    np.testing.assert_array_equal(fake.get(dx), R.pooling_backward(want_y, dy, x, "max", window, layout=layout))
    compiled = (2, 2) if tuple(window) == (2, 2) else (0, 0)
    assert [n for n, _, _ in fake.launches] == [K.pool_name(d, dtype, compiled, layout) for d in ("fwd", "bwd")]


@pytest.mark.parametrize("kwargs", [dict(mode="avg"), dict(padding=1, window=3), dict(window=3, stride=2),
                                    dict(dtype=F64), dict(window=6)], ids=str)  # window 6: 36 taps, global
def test_other_pooling_goes_to_cudnn(fake, monkeypatch, kwargs):
    calls = []

    class FakeCudnn:
        def __getattr__(self, name):
            return lambda *a: calls.append(name)

    monkeypatch.setattr(PO, "L", FakeCudnn())
    monkeypatch.setattr(PO, "dnn", lambda x: 0)
    monkeypatch.setattr(PO.D, "pooling", lambda *a: None)
    monkeypatch.setattr(PO, "_desc", lambda *a: None)
    dtype = kwargs.pop("dtype", F32)
    x = fake.put(rnd((1, 2, 6, 6), 12, dtype))
    args = dict(mode="max", window=2, stride=None, padding=0) | kwargs
    y = dnnbind.ops.pooling_forward(x, **args)
    dnnbind.ops.pooling_backward(y, y, x, **args)
    assert calls == ["cudnnPoolingForward", "cudnnPoolingBackward"] and not fake.launches


def test_the_switch_sends_max_pooling_back_to_cudnn(fake, monkeypatch):
    monkeypatch.setattr(PO, "MAX_POOL_KERNEL", False)
    assert not PO._kernel_case("max", (2, 2), (2, 2), (0, 0), F32, fake.put(rnd((1, 1, 2, 2), 13)))
