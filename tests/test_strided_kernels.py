"""dnnbind.kernels.strided: coalescing, source generation, argument packing (CPU) and every kernel against numpy
(GPU, marker ``gpu``).

The CPU tests compile every template with NVRTC for compute_90 (NVRTC needs no GPU; skipped where it cannot
load) and check the packed argument struct against the generated C struct, with a fake kernel in place of
the launch.
"""

from __future__ import annotations

import itertools
import re
import struct

import numpy as np
import pytest

from dnnbind._lib import nvrtc
from dnnbind._lib.errors import DnnbindError, NvrtcError
from dnnbind.kernels import _strided_base as B
from dnnbind.kernels import compiler
from dnnbind.kernels import strided as S
from dnnbind.kernels.strided import Ref, coalesce, generate
from tests._helpers import assert_close

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I32, I64, BOOL = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.int64), np.dtype(bool)
ALL = (F16, F32, F64, I8, U8, I32, I64, BOOL)


def _nvrtc_ok() -> bool:
    try:
        nvrtc.version()
    except DnnbindError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC is not installed")


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(tmp_path / "kernel-cache"))
    compiler.clear_memory_cache()
    S.clear_cache()
    yield
    compiler.clear_memory_cache()
    S.clear_cache()


# --- coalescing ----------------------------------------------------------------------------------------

def _offsets(shape, strides):
    """Offsets of every element in row-major order (the oracle for coalescing)."""
    idx = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), np.int64)
    return (np.asarray(strides, np.int64)[:, None] * idx).sum(axis=0) if shape else np.zeros(1, np.int64)


@pytest.mark.parametrize("shape, strides, want_shape, want_strides", [
    ((2, 3, 4), [(12, 4, 1)], (24,), [(1,)]),
    ((2, 3, 4), [(12, 4, 1), (0, 0, 1)], (6, 4), [(4, 1), (0, 1)]),
    ((2, 3, 4), [(12, 4, 1), (0, 0, 0)], (24,), [(1,), (0,)]),
    ((64, 128), [(128, 1), (0, 1)], (64, 128), [(128, 1), (0, 1)]),
    ((4, 1, 5), [(5, 99, 1)], (20,), [(1,)]),           # a size-1 dim's stride is irrelevant
    ((3, 4), [(1, 3)], (3, 4), [(1, 3)]),               # transposed: nothing merges
    ((6,), [(-1,)], (6,), [(-1,)]),
    ((2, 3), [(-3, -1)], (6,), [(-1,)]),                # fully reversed merges too
    ((1, 1), [(7, 7)], (), [()]),
    ((), [()], (), [()]),
])
def test_coalesce_cases(shape, strides, want_shape, want_strides):
    got_shape, got_strides = coalesce(shape, strides)
    assert got_shape == want_shape and got_strides == want_strides


def test_coalesce_keeps_every_offset_random():
    rng = np.random.default_rng(0)
    for _ in range(300):
        nd = int(rng.integers(0, 7))
        shape = tuple(int(s) for s in rng.integers(1, 4, nd))
        operands = []
        for _ in range(int(rng.integers(1, 4))):
            kind = rng.integers(0, 3)
            c = list(np.cumprod((1,) + shape[::-1])[:-1][::-1]) if nd else []
            if kind == 1:  # broadcast some dims
                c = [0 if rng.random() < 0.4 else s for s in c]
            elif kind == 2:  # arbitrary (even negative) strides
                c = [int(v) for v in rng.integers(-20, 21, nd)]
            operands.append(tuple(int(v) for v in c))
        cs, cst = coalesce(shape, operands)
        assert len(cs) <= nd and all(s > 1 for s in cs)
        for st, cst_k in zip(operands, cst):
            np.testing.assert_array_equal(_offsets(shape, st), _offsets(cs, cst_k))


def test_ref_address_and_dtype():
    r = Ref(0x1000, "float64", [3, 1], offset=5)
    assert r.dtype == F64 and r.strides == (3, 1) and r.addr == 0x1000 + 40
    assert "strides=(3, 1)" in repr(r)


# --- source text ---------------------------------------------------------------------------------------

_STRUCT_FIELD = re.compile(r"^\s+(?P<type>[^;]*?)\s(?P<name>\w+)(?P<dims>(\[\d+\])*);$", re.MULTILINE)


def _struct_words(source: str) -> int:
    """The number of 8-byte words in the generated `struct dn_args` (every field is 8 bytes wide)."""
    body = source[source.index("struct dn_args {"):source.index("};", source.index("struct dn_args {"))]
    words = 0
    for m in _STRUCT_FIELD.finditer(body):
        dims = [int(d) for d in re.findall(r"\[(\d+)\]", m.group("dims"))]
        words += int(np.prod(dims)) if dims else 1
    return words


MAP_KEYS = [("map", "dn_map", "a + b", F32, (F32, F32), 0, ()),
            ("map", "dn_map", "a > 0 ? a : alpha * a", F16, (F16,), 3, (("alpha", "double", "d"),)),
            ("map", "dn_map", "c ? a : b", F64, (F64, F64, BOOL), 8, ()),
            ("map", "relu", "a > 0 ? a : 0", I8, (I8,), 1, (("k", "long long", "q"), ("f", "bool", "q"))),
            ("map", "dn_map", "a * b", F16, (F16, F64), 0, (), 4)]


@pytest.mark.parametrize("key", MAP_KEYS, ids=lambda k: f"{k[2]}-{k[5]}d")
def test_map_source_text(key):
    source, name, fmt = generate(key)
    assert name == key[1] and f'extern "C" __global__ void {name}(const dn_args p)' in source
    assert _struct_words(source) == len(fmt) and set(fmt) <= set("Qqd")
    assert f"return ({key[2]});" in source  # the expression sits on its own line: NVRTC errors point at it
    if key[-1] == 4:
        assert "dn_vec<dn_half, 4> dn_vo;" in source and "const dn_vec<double, 4> dn_vb" in source
        assert "dn_f2h((float)(dn_f(dn_h2f(dn_va.v[dn_k]), dn_vb.v[dn_k])))" in source
    elif key[5] == 0:
        kernel = source[source.index('extern "C"'):]
        assert "%" not in kernel and "p.st" not in kernel and "o0 = dn_i" in kernel  # the plain fast kernel
    else:
        assert f"long long st[{1 + len(key[4])}][{key[5]}];" in source and "unsigned int dn_q" in source
    if F16 in key[4]:
        assert "dn_h2f(p.a[o1])" in source and "dn_f2h((float)(" in source


def test_reduce_source_text():
    source, _, fmt = generate(("reduce", "dn_argmax", "argmax", "fabs(a)", "acc", F16, I64, 2, 1, ()))
    assert "__shared__ long long dn_si[256];" in source and "dn_h2f(p.x[dn_off0])" in source
    assert "return (fabs(a));" in source and "dn_post" not in source  # arg ops write the index
    assert _struct_words(source) == len(fmt)
    source, _, fmt = generate(("reduce", "dn_mean", "sum", "a", "acc * inv_n", F32, F32, 0, 0,
                               (("inv_n", "double", "d"),)))
    assert "dn_si" not in source and "return (acc * inv_n);" in source and "kshape" not in source
    assert _struct_words(source) == len(fmt)


@pytest.mark.parametrize("key", [("gather", "clip", (F32, F32, F32), 3), ("scatter_add", "wrap", (F64, F64, I64), 0),
                                 ("sort", True, F16, F16, I64, 2), ("sort", False, I32, None, F32, 0),
                                 ("random", "normal", F64), ("random", "randint", I32)], ids=str)
def test_other_source_struct_sizes(key):
    source, _, fmt = generate(key)
    assert _struct_words(source) == len(fmt)


def test_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="complex64"):
        generate(("map", "dn_map", "a", F32, (np.dtype(np.complex64),), 0, ()))
    with pytest.raises(TypeError, match="float16"):
        generate(("scatter_add", "clip", (F16, F16, I64), 1))
    with pytest.raises(TypeError, match="needs a float out"):
        S.random_fill(Ref(0, I32, (1,)), 4, "normal", 0, 0, 0.0, 1.0, stream=0, device=0)


def test_bad_names_are_value_errors():
    with pytest.raises(ValueError, match="scalar name 'a'"):
        generate(("map", "dn_map", "a", F32, (F32,), 0, (("a", "double", "d"),)))
    with pytest.raises(ValueError, match="C identifier"):
        generate(("map", "bad name", "a", F32, (F32,), 0, ()))


# --- NVRTC compiles every template (no GPU needed) -----------------------------------------------------

def _compile(key):
    """Compile the generated source to PTX and check it defines the kernel as an entry point."""
    source, name, _ = generate(key)
    ptx = compiler.Module(source, (name,), arch="compute_90").ptx
    assert f".entry {name}(" in ptx, f"{name} is not an entry of the PTX for {key}"


@needs_nvrtc
@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("ndim", [0, 1, 3, 8])
def test_nvrtc_map_every_dtype(private_cache, dtype, ndim):
    expr = "a + b" if dtype != BOOL else "a && b"
    _compile(("map", "dn_map", expr, dtype, (dtype, dtype), ndim, (), 4 if ndim == 0 else 1))
    _compile(("map", "dn_map", "a > b ? a : alpha * b", BOOL if ndim % 2 else dtype, (dtype, F32), ndim,
              (("alpha", "double", "d"),)))


@needs_nvrtc
@pytest.mark.parametrize("expr", ["exp(a)", "sqrt(a) + log1p(b)", "a > 0 ? a : alpha * a", "c ? a : b",
                                  "(a > hi ? hi : (a < lo ? lo : a))", "tanh(a) * b", "pow(a, b)", "fabs(a - b)",
                                  "max(a, b)", "floor(a / b)", "fmod(a, b)", "erf(a)"])
def test_nvrtc_map_expressions_float_and_double(private_cache, expr):
    scal = (("alpha", "double", "d"), ("hi", "float", "d"), ("lo", "float", "d"))
    for dt in (F32, F64, F16):
        _compile(("map", "dn_map", expr, dt, (dt, dt, BOOL), 2, scal))


@needs_nvrtc
@pytest.mark.parametrize("op", S.REDUCE_OPS)
@pytest.mark.parametrize("dtype", [F16, F32, F64, I32, I64, U8, BOOL], ids=str)
def test_nvrtc_reduce(private_cache, op, dtype):
    out = I64 if op.startswith("arg") else dtype
    _compile(("reduce", "dn_r", op, "a", "acc", dtype, out, 2, 1, ()))
    if dtype in (F32, F16):
        _compile(("reduce", "dn_r", op, "(double)a * a", "sqrt(acc) * s", dtype, F32 if op.startswith("arg") else
                  dtype, 0, 3, (("s", "double", "d"),)))


@needs_nvrtc
@pytest.mark.parametrize("kind, out_dtypes", [("gather", [F16, F32, F64, I32, I64, U8, BOOL]),
                                              ("scatter_add", [F32, F64, I32, I64])])
def test_nvrtc_gather_scatter(private_cache, kind, out_dtypes):
    for dt, idx, mode, nd in itertools.product(out_dtypes, (F32, I32, I64), ("clip", "wrap"), (0, 3)):
        _compile((kind, mode, (dt, dt, idx), nd))


@needs_nvrtc
def test_nvrtc_sort_and_random(private_cache):
    for x, desc, nd in itertools.product((F16, F32, F64, I32, I64, U8), (False, True), (0, 2)):
        _compile(("sort", desc, x, x, I64, nd))
        _compile(("sort", desc, x, None, F32, nd))
    _compile(("sort", False, F32, F32, None, 1))
    for dist, dts in (("uniform", (F16, F32, F64)), ("normal", (F16, F32, F64)),
                      ("randint", (I32, I64, F32, U8)), ("bernoulli", (F32, F64, U8, BOOL, I64))):
        for dt in dts:
            _compile(("random", dist, dt))


@needs_nvrtc
def test_nvrtc_error_quotes_the_expression(private_cache):
    with pytest.raises(NvrtcError) as info:
        _compile(("map", "dn_map", "a +* b", F32, (F32, F32), 0, ()))
    assert "return (a +* b);" in str(info.value)


# --- argument packing (a fake kernel takes the launch) -------------------------------------------------

class _FakeKernel:
    def __init__(self, log):
        self.log = log

    def _launch(self, device, grid, block, args, stream, smem):
        from dnnbind.kernels.launch import pack_args
        holders, params = pack_args(args)  # what Kernel._launch does first
        assert len(holders) == 1 and len(params) == 8
        self.log.append((grid, block, bytes(args[0]), stream))

    def launch_struct(self, device, grid_x, block_x, arg, h, current=False):  # Kernel's hot path: same record
        self._launch(device, (grid_x, 1, 1), (block_x, 1, 1), (arg,), h, 0)


@pytest.fixture
def fake_launch(monkeypatch):
    log = []
    sources = {}

    def fake_compile(source, name, options, arch):
        sources[name] = source
        return _FakeKernel(log)
    monkeypatch.setattr(B, "compile_kernel", fake_compile)
    monkeypatch.setattr(B, "compute_capability", lambda device: 90)
    monkeypatch.setattr(B, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(S, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(S, "_split_scratch", lambda device, h: (0x100000, 0x200000, 0x300000))
    B.GRID_CAPS.clear()
    S.clear_cache()
    yield log, sources
    B.GRID_CAPS.clear()
    S.clear_cache()


def _words(blob: bytes, fmt: str):
    return struct.unpack("=" + fmt, blob)


def test_pack_contiguous_map(fake_launch):
    log, sources = fake_launch
    a, b, c = (Ref(k << 32, F32, (128, 1)) for k in (1, 2, 3))
    S.strided_map("a + b", c, [a, b], (64, 128), stream=7, device=0)
    grid, block, blob, stream = log[-1]
    assert block == (256, 1, 1) and grid == (8, 1, 1) and stream == 7  # 4 elements per thread
    assert _words(blob, "QQQq") == (3 << 32, 1 << 32, 2 << 32, 8192)
    assert "p.st" not in sources["dn_map"] and "dn_vec<float, 4>" in sources["dn_map"]
    shifted = Ref(1 << 32, F32, (128, 1), offset=1)  # 4-byte aligned only: the scalar kernel
    S.strided_map("a + b", c, [shifted, b], (64, 128), stream=7, device=0, name="unaligned")
    grid, _, blob, _ = log[-1]
    assert grid == (32, 1, 1) and _words(blob, "QQQq")[1] == (1 << 32) + 4
    assert "dn_vec" not in sources["unaligned"] and "p.st" not in sources["unaligned"]


def test_pack_broadcast_negative_and_scalars(fake_launch):
    log, _ = fake_launch
    out = Ref(0x1000, F32, (5, 1))
    a = Ref(0x2000, F64, (0, -1), offset=4)  # a row broadcast over the rows, read backwards
    S.strided_map("a * alpha + k", out, [a], (3, 5), scalars=(("alpha", 2.5), ("k", np.int32(3))), stream=0, device=0)
    _, _, blob, _ = log[-1]
    got = _words(blob, "QQqdq" + "q" * 2 + "q" * 4)
    assert got == (0x1000, 0x2000 + 32, 15, 2.5, 3, 3, 5, 5, 1, 0, -1)


def test_pack_reduce_layouts(fake_launch):
    log, _ = fake_launch
    x = Ref(0x1000, F32, (3136, 1))
    out = Ref(0x2000, F32, (1,))
    S.strided_reduce("sum", x, (64, 3136), (1,), out, stream=0, device=0)   # rows: lanes along the row
    grid, block, blob, _ = log[-1]
    w = _words(blob, "QQQQQ" + "q" * 6 + "qq" + "qq")
    assert w[5:11] == (64, 3136, 3136, 256, 1, 1) and grid == (64, 1, 1) and block == (256, 1, 1)
    S.strided_reduce("sum", Ref(0x1000, F32, (128, 1)), (64, 128), (0,), out, stream=0, device=0)  # columns
    grid, block, blob, _ = log[-1]
    w = _words(blob, "QQQQQ" + "q" * 6 + "qq" + "qq")
    assert w[5:11] == (128, 64, 64, 8, 32, 0) and grid == (4, 1, 1) and block == (256, 1, 1)
    S.strided_reduce("max", Ref(0x1000, F32, (1,)), (1 << 20,), (0,), out, stream=0, device=0)  # full: split
    grid, block, blob, _ = log[-1]
    w = _words(blob, "QQQQQ" + "q" * 6 + "qq")
    assert grid[1] > 1 and w[2:5] == (0x100000, 0x200000, 0x300000) and w[7] * grid[1] >= 1 << 20


def test_reduce_layout_heuristic():
    assert S.reduce_layout(64, 3136, True, 132) == (256, 1, 1)
    assert S.reduce_layout(128, 64, False, 132) == (8, 32, 1)
    assert S.reduce_layout(1 << 20, 4, True, 132) == (4, 64, 1)
    assert S.reduce_layout(1 << 22, 3, False, 132) == (1, 256, 1)
    rt, ot, splits = S.reduce_layout(1, 10**6, True, 132)
    assert (rt, ot) == (256, 1) and 100 < splits <= 264


def test_pack_gather_sort_random(fake_launch):
    log, _ = fake_launch
    x = Ref(0x1000, F32, (4, 1))
    S.gather(x, (3, 4), Ref(0x2000, I64, (1,)), (5,), 1, Ref(0x3000, F32, (5, 1)), stream=0, device=0)
    w = _words(log[-1][2], "QQQqqq" + "qq" + "qqqqqq")
    assert w[:6] == (0x3000, 0x1000, 0x2000, 15, 4, 1) and w[6:8] == (3, 5)
    S.sort_along(Ref(0x1000, F32, (1, 3)), (3, 4), 0, Ref(0x2000, F32, (4, 1)), Ref(0x3000, I64, (4, 1)),
                 descending=True, k=2, stream=0, device=0)
    w = _words(log[-1][2], "QQQqqqqq" + "q" + "qq")
    assert w == (0x1000, 0x2000, 0x3000, 12, 3, 1, 2, 4, 4, 3, 1)
    S.random_fill(Ref(0x1000, F32, (1,)), 10, "uniform", -1, 2, 0.0, 1.0, stream=0, device=0)
    w = _words(log[-1][2], "QqQQddqq")
    assert w == (0x1000, 10, 2**64 - 1, 2, 0.0, 1.0, 0, 0)


def test_size_zero_launches_nothing(fake_launch):
    log, _ = fake_launch
    r = Ref(0x1000, F32, (0, 1))
    S.strided_map("a", r, [r], (3, 0), stream=0, device=0)
    S.strided_reduce("sum", r, (0, 3), (1,), r, stream=0, device=0)
    S.sort_along(r, (3, 0), 1, r, None, stream=0, device=0)
    S.random_fill(r, 0, "uniform", 0, 0, 0.0, 1.0, stream=0, device=0)
    assert log == []


def test_argument_errors():
    r2 = Ref(0x1000, F32, (4, 1))
    with pytest.raises(ValueError, match="MAX_DIMS = 8"):
        shape = (2,) * 9
        st = tuple(2 ** d for d in range(9))  # column-major: no two dims merge
        S.strided_map("a", Ref(0, F32, st), [Ref(0, F32, st)], shape, stream=0, device=0)
    with pytest.raises(ValueError, match="strides"):
        S.strided_map("a", r2, [Ref(0, F32, (1,))], (3, 4), stream=0, device=0)
    with pytest.raises(ValueError, match="op must be"):
        S.strided_reduce("mean", r2, (3, 4), (1,), r2)
    with pytest.raises(ValueError, match="argmax over zero elements"):
        S.strided_reduce("argmax", r2, (3, 0), (1,), r2)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        S.strided_reduce("sum", r2, (3, 4), (2,), r2)
    with pytest.raises(ValueError, match="mode"):
        S.gather(r2, (3, 4), Ref(0, I64, (1,)), (2,), 0, r2, mode="raise")
    with pytest.raises(TypeError, match="must match"):
        S.gather(r2, (3, 4), Ref(0, I64, (1,)), (2,), 0, Ref(0, F64, (4, 1)))
    with pytest.raises(ValueError, match="k must be"):
        S.sort_along(r2, (3, 4), 1, r2, None, k=5)
    with pytest.raises(ValueError, match="dist"):
        S.random_fill(r2, 3, "poisson", 0, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="low < high"):
        S.random_fill(Ref(0, I32, (1,)), 3, "randint", 0, 0, 5, 5)
    with pytest.raises(TypeError, match="scalar 'alpha' is a str"):
        S.scalar_signature("strided_map", (("alpha", "2"),))
    # dtype and name errors come before any library call: no GPU is needed to see them
    with pytest.raises(TypeError, match="complex64"):
        S.strided_map("a", r2, [Ref(0, np.complex64, (4, 1))], (3, 4))
    with pytest.raises(TypeError, match="atomicAdd"):
        S.scatter_add(Ref(0, F16, (4, 1)), Ref(0, I64, (1,)), (4,), 0, Ref(0, F16, (4, 1)), (3, 4))
    with pytest.raises(ValueError, match="scalar name 'acc'"):
        S.strided_reduce("sum", r2, (3, 4), (1,), r2, post_expr="acc", scalars=(("acc", 1.0),))


# --- on the GPU, against numpy ---------------------------------------------------------------------------

class _Dev:
    """numpy arrays mirrored on the GPU; ``ref(view)`` describes any numpy view of a mirrored base (broadcast,
    reversed, sliced) as a Ref with the view's own strides and offset."""

    def __init__(self):
        import dnnbind
        self.d = dnnbind
        self.gpu = dnnbind.gpu(0)
        self.stream = dnnbind.current_stream(self.gpu)
        self.bases: list[tuple[np.ndarray, object]] = []

    def put(self, host: np.ndarray) -> np.ndarray:
        host = host if host.flags.c_contiguous else host.copy()  # (ascontiguousarray makes 0-d arrays 1-d)
        self.bases.append((host, self.d.array(host, device="gpu")))
        return host

    def empty(self, shape, dtype) -> np.ndarray:
        host = np.zeros(shape, dtype)
        self.bases.append((host, self.d.empty(shape, dtype, device="gpu")))
        return host

    def _base(self, view: np.ndarray):
        for host, dev in self.bases:
            lo = host.ctypes.data
            if lo <= view.ctypes.data < lo + max(host.nbytes, 1) or (view.size == 0 and view.base is host):
                return host, dev
        raise AssertionError("not a view of a mirrored array")

    def ref(self, view: np.ndarray) -> Ref:
        host, dev = self._base(view)
        item = view.dtype.itemsize
        return Ref(dev.ptr, view.dtype, tuple(s // item for s in view.strides), (view.ctypes.data - host.ctypes.data)
                   // item)

    def get(self, host: np.ndarray) -> np.ndarray:
        """The device copy of a mirrored base array."""
        for h, dev in self.bases:
            if h is host:
                return dev.numpy()
        raise AssertionError("not a mirrored base")


@pytest.fixture
def dev():
    return _Dev()


def _rand(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -50
        return rng.integers(lo, 50, shape).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


def _map_case(dev, expr, fn, out_shape, views, out_dtype, scalars=(), rtol=1e-6, atol=0.0):
    out = dev.empty(out_shape, out_dtype)
    S.strided_map(expr, dev.ref(out), [dev.ref(v) for v in views], out_shape, scalars, stream=dev.stream)
    want = np.asarray(fn(*[v.astype(np.float64) if v.dtype.kind == "f" else v for v in views]))
    assert_close(dev.get(out), np.broadcast_to(want, out_shape).astype(out_dtype), rtol, atol, expr)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, F32, F64, I32, I64, I8, U8], ids=str)
def test_gpu_map_dtypes_contiguous_and_broadcast(dev, dtype):
    rng = np.random.default_rng(1)
    a = dev.put(_rand(rng, (64, 128), dtype))
    b = dev.put(_rand(rng, (128,), dtype))
    tol = {F16: (1e-3, 1e-3)}.get(dtype, (1e-6, 0.0))
    _map_case(dev, "a + b", lambda x, y: x + y, (64, 128), [a, np.broadcast_to(b, (64, 128))], dtype, (), *tol)
    _map_case(dev, "a * b", lambda x, y: x * y, (64, 128), [a, a], dtype, (), *tol)
    _map_case(dev, "a > b", lambda x, y: x > y, (64, 128), [a, np.broadcast_to(b, (64, 128))], BOOL)
    flat = dev.put(_rand(rng, (1003,), dtype))  # the vector kernel's tail, then misaligned views
    _map_case(dev, "a - b", lambda x, y: x - y, (1003,), [flat, flat[::-1]], dtype, (), *tol)
    _map_case(dev, "a * b", lambda x, y: np.multiply(x, y, dtype=np.float64), (1003,), [flat, flat], F64, (), *tol)
    _map_case(dev, "a + b", lambda x, y: x + y, (1001,), [flat[1:-1], flat[2:]], dtype, (), *tol)


@pytest.mark.gpu
@pytest.mark.parametrize("ndim", range(7))
def test_gpu_map_ranks_negative_strides_and_strided_out(dev, ndim):
    rng = np.random.default_rng(ndim)
    shape = tuple(int(s) for s in rng.integers(2, 5, ndim))
    big = dev.put(np.asarray(rng.standard_normal(tuple(2 * s + 1 for s in shape)), np.float32))
    a = big[tuple(slice(-2, None, -2) for _ in shape)] if ndim else big[...]  # reversed, every other element
    b = dev.put(np.asarray(rng.standard_normal(shape[1:] if ndim else ()), np.float64))
    bv = np.broadcast_to(b, shape)
    _map_case(dev, "exp(a) * b", lambda x, y: np.exp(x) * y, shape, [a, bv], np.float32, rtol=2e-6, atol=1e-6)
    out_base = dev.put(np.asarray(rng.standard_normal(tuple(s + 2 for s in shape)), np.float32))
    before = out_base.copy()
    inner = tuple(slice(1, 1 + s) for s in shape) if ndim else ...
    window = out_base[inner]  # setitem into a slice of a contiguous buffer
    S.strided_map("a > 0 ? a : alpha * a", dev.ref(window), [dev.ref(a)], shape, (("alpha", 0.25),),
                  stream=dev.stream)
    want = before.copy()
    av = a.astype(np.float64)
    want[inner] = np.where(av > 0, av, 0.25 * av)
    assert_close(dev.get(out_base), want, 1e-6, 0, "leaky relu into a slice")


@pytest.mark.gpu
def test_gpu_map_where_clip_float16_and_size0(dev):
    rng = np.random.default_rng(3)
    a = dev.put(rng.standard_normal((5, 7, 9)).astype(np.float16))
    b = dev.put(rng.standard_normal((5, 7, 9)).astype(np.float16))
    c = dev.put(rng.random((7, 1)) < 0.5)
    cv = np.broadcast_to(c, (5, 7, 9))
    _map_case(dev, "c ? a : b", lambda x, y, z: np.where(z, x, y), (5, 7, 9), [a, b, cv], np.float16)
    out = dev.empty((5, 7, 9), np.float16)  # an int stream handle and an explicit device
    S.strided_map("c ? a : b", dev.ref(out), [dev.ref(a), dev.ref(b), dev.ref(cv)], (5, 7, 9),
                  stream=dev.stream.handle, device=0)
    np.testing.assert_array_equal(dev.get(out), np.where(cv, a, b))
    _map_case(dev, "(a > hi ? hi : (a < lo ? lo : a))", lambda x: np.clip(x, -0.5, 0.5), (5, 7, 9), [a],
              np.float32, (("hi", 0.5), ("lo", np.float32(-0.5))), 1e-3, 1e-3)
    empty = dev.put(np.zeros((3, 0), np.float32))
    S.strided_map("a + 1", dev.ref(empty), [dev.ref(empty)], (3, 0), stream=dev.stream)  # nothing to do
    scalar = dev.put(np.array(2.5, np.float64))
    _map_case(dev, "a * a + k", lambda x: x * x + 3, (), [scalar], np.float64, (("k", 3),))


def _reduce_case(dev, op, x_view, axes, out_dtype=None, map_expr="a", post_expr="acc", scalars=(), want=None,
                 rtol=1e-6, atol=0.0):
    kept = tuple(s for d, s in enumerate(x_view.shape) if d not in axes)
    out = dev.empty(kept, out_dtype or x_view.dtype)
    S.strided_reduce(op, dev.ref(x_view), x_view.shape, axes, dev.ref(out), map_expr, post_expr, scalars,
                     stream=dev.stream)
    if want is None:
        x64 = x_view.astype(np.float64) if x_view.dtype.kind == "f" else x_view.astype(np.int64)
        want = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](x64, axis=tuple(axes))
    assert_close(dev.get(out), np.asarray(want).astype(out.dtype), rtol, atol, f"{op} over {axes}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape, axes", [((64, 3136), (1,)), ((64, 128), (0,)), ((100003,), (0,)),
                                         ((1000, 1000), (0, 1)), ((8, 16, 9, 5), (0, 2)), ((7, 6, 5, 4), (1, 3)),
                                         ((3, 5), ()), ((2, 70000), (1,)), ((70000, 3), (0,))])
def test_gpu_reduce_sum_max_min_prod(dev, shape, axes):
    rng = np.random.default_rng(len(shape))
    x = dev.put(rng.uniform(0.5, 1.5, shape).astype(np.float32))
    _reduce_case(dev, "sum", x, axes, rtol=2e-6)
    _reduce_case(dev, "max", x, axes)
    _reduce_case(dev, "min", x, axes)
    small = dev.put(rng.uniform(0.99, 1.01, shape))  # float64, a product that stays finite
    _reduce_case(dev, "prod", small, axes, rtol=1e-9)


@pytest.mark.gpu
def test_gpu_reduce_accuracy_and_strided_input(dev):
    rng = np.random.default_rng(7)
    x = dev.put(rng.standard_normal(10**6).astype(np.float32) + 1.0)
    _reduce_case(dev, "sum", x, (0,), rtol=1e-6)
    big = dev.put(rng.standard_normal((40, 300)).astype(np.float32))
    view = big.T[::-3]  # transposed and reversed: nothing contiguous
    _reduce_case(dev, "sum", view, (1,), rtol=1e-5, atol=1e-5)
    _reduce_case(dev, "sum", view, (0,), rtol=1e-5, atol=1e-5)
    v64 = view.astype(np.float64)
    _reduce_case(dev, "sum", view, (0, 1), map_expr="a * a", post_expr="sqrt(acc)",
                 want=np.sqrt((v64 * v64).sum()), rtol=1e-5)
    _reduce_case(dev, "sum", view, (1,), map_expr="(double)a", post_expr="acc * inv_n",
                 scalars=(("inv_n", 1.0 / view.shape[1]),), want=v64.mean(axis=1), rtol=2e-7, atol=1e-7)
    ints = dev.put(rng.integers(-100, 100, (33, 65)).astype(np.int32))
    _reduce_case(dev, "sum", ints, (1,), out_dtype=np.int64, rtol=0)
    _reduce_case(dev, "max", ints, (0,), rtol=0)
    flags = dev.put(rng.random((20, 30)) < 0.3)
    _reduce_case(dev, "sum", flags, (0, 1), out_dtype=np.int64, want=flags.sum(), rtol=0)
    h = dev.put(rng.uniform(-1, 1, (16, 500)).astype(np.float16))
    _reduce_case(dev, "sum", h, (1,), out_dtype=np.float32, want=h.astype(np.float64).sum(axis=1), rtol=1e-5,
                 atol=1e-4)
    empty = dev.put(np.zeros((4, 0), np.float32))
    _reduce_case(dev, "sum", empty, (1,), want=np.zeros(4))
    _reduce_case(dev, "prod", empty, (1,), want=np.ones(4))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, axis", [((50, 37), 1), ((50, 37), 0), ((3, 200000), 1), ((1000,), 0)])
def test_gpu_argmax_argmin_ties_and_nan(dev, shape, axis):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 5, shape).astype(np.float32)  # many ties: the first occurrence must win
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        xs = dev.put(x)
        for out_dtype in (np.int64, np.float32):
            _reduce_case(dev, op, xs, (axis,), out_dtype, want=fn(x, axis=axis), rtol=0)
    xn = x.copy()
    flat = xn.reshape(-1)
    flat[rng.choice(flat.size, max(1, flat.size // 50), replace=False)] = np.nan
    xs = dev.put(xn)
    _reduce_case(dev, "argmax", xs, (axis,), np.int64, want=np.argmax(xn, axis=axis), rtol=0)
    _reduce_case(dev, "argmin", xs, (axis,), np.int64, want=np.argmin(xn, axis=axis), rtol=0)
    _reduce_case(dev, "max", xs, (axis,), want=np.max(xn, axis=axis))
    _reduce_case(dev, "min", xs, (axis,), want=np.min(xn, axis=axis))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["clip", "wrap"])
@pytest.mark.parametrize("idx_dtype", [np.float32, np.int64, np.int32])
def test_gpu_gather_and_scatter_add(dev, mode, idx_dtype):
    rng = np.random.default_rng(5)
    x = dev.put(rng.standard_normal((4, 7, 3)).astype(np.float32))
    raw = rng.uniform(-10, 10, (5, 2))
    idx = dev.put(raw.astype(idx_dtype))
    as_int = np.trunc(idx.astype(np.float64)).astype(np.int64)  # float indices truncate toward zero
    for axis in (0, 1, 2, -1):
        want = np.take(x, as_int, axis=axis, mode=mode)
        out = dev.empty(want.shape, np.float32)
        S.gather(dev.ref(x), x.shape, dev.ref(idx), idx.shape, axis, dev.ref(out), mode, stream=dev.stream)
        assert_close(dev.get(out), want, 0, 0, f"take axis {axis}")
        src = dev.put(rng.standard_normal(want.shape))
        acc = dev.put(np.zeros(x.shape, np.float64))
        S.scatter_add(dev.ref(src), dev.ref(idx), idx.shape, axis, dev.ref(acc), x.shape, mode, stream=dev.stream)
        ax = axis % 3
        k = np.take(np.arange(x.shape[ax]), as_int, mode=mode).reshape(-1)  # the resolved indices, in order
        expect = np.zeros(x.shape)
        np.add.at(np.moveaxis(expect, ax, 0), k,
                  np.moveaxis(src.reshape(x.shape[:ax] + (k.size,) + x.shape[ax + 1:]), ax, 0))
        assert_close(dev.get(acc), expect, 1e-12, 1e-12, f"scatter_add axis {axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("descending", [False, True])
def test_gpu_sort_and_topk(dev, dtype, descending):
    rng = np.random.default_rng(9)
    x = rng.integers(0, 20, (6, 300, 4)).astype(dtype)  # ties everywhere: the sort must be stable
    if np.dtype(dtype).kind == "f":
        x.reshape(-1)[rng.choice(x.size, 30, replace=False)] = np.nan
    xs = dev.put(x)
    for axis in (1, 0, 2):
        key = -x.astype(np.float64) if descending else x.astype(np.float64)
        if descending:  # NaN is the largest: first when descending
            key = np.where(np.isnan(key), -np.inf, key)
            key = np.where(np.isnan(x.astype(np.float64)), -np.inf, key)
        order = np.argsort(key, axis=axis, kind="stable")
        for k in (None, 3):
            n = x.shape[axis] if k is None else k
            want_i = np.take(order, np.arange(n), axis=axis)
            want_v = np.take_along_axis(x, want_i, axis=axis)
            vals = dev.empty(want_v.shape, dtype)
            inds = dev.empty(want_v.shape, np.int64)
            S.sort_along(dev.ref(xs), x.shape, axis, dev.ref(vals), dev.ref(inds), descending, k, stream=dev.stream)
            np.testing.assert_array_equal(dev.get(inds), want_i)
            np.testing.assert_array_equal(dev.get(vals), want_v)
    view = xs[:, ::-7, 1]  # a strided lane
    inds = dev.empty((6, view.shape[1]), np.float32)
    S.sort_along(dev.ref(view), view.shape, 1, None, dev.ref(inds), descending, stream=dev.stream)
    key = np.where(np.isnan(view.astype(np.float64)), np.inf, view.astype(np.float64))
    want = np.argsort(-key if descending else key, axis=1, kind="stable")
    np.testing.assert_array_equal(dev.get(inds), want.astype(np.float32))


@pytest.mark.gpu
def test_gpu_random_statistics_and_reproducibility(dev):
    n = 1 << 20

    def fill(dist, dtype, seed, offset=0, p0=0.0, p1=1.0, count=n):
        out = dev.empty((count,), dtype)
        S.random_fill(dev.ref(out), count, dist, seed, offset, p0, p1, stream=dev.stream)
        return dev.get(out)

    u = fill("uniform", np.float32, 1, p0=-1.0, p1=3.0)
    assert u.min() >= -1.0 and u.max() <= 3.0 and abs(u.mean() - 1.0) < 0.01 and abs(u.var() - 16 / 12) < 0.01
    g = fill("normal", np.float64, 2, p0=0.5, p1=2.0)
    assert abs(g.mean() - 0.5) < 0.01 and abs(g.std() - 2.0) < 0.01 and np.isfinite(g).all()
    g16 = fill("normal", np.float16, 2)
    assert abs(float(g16.astype(np.float64).mean())) < 0.01 and abs(float(g16.astype(np.float64).std()) - 1) < 0.01
    r = fill("randint", np.int32, 3, p0=-3, p1=5)
    assert r.min() == -3 and r.max() == 4 and np.all(np.abs(np.bincount(r + 3) / n - 1 / 8) < 0.003)
    bern = fill("bernoulli", np.float32, 4, p0=0.3)
    assert set(np.unique(bern)) <= {0.0, 1.0} and abs(bern.mean() - 0.3) < 0.003
    np.testing.assert_array_equal(fill("uniform", np.float32, 1, p0=-1.0, p1=3.0), u)  # same seed: same numbers
    assert np.mean(fill("uniform", np.float32, 5, p0=-1.0, p1=3.0) == u) < 0.01  # another seed: others
    whole = fill("normal", np.float32, 6, count=1000)
    tail = fill("normal", np.float32, 6, offset=400, count=600)
    np.testing.assert_array_equal(tail, whole[400:])  # depends only on (seed, offset + i)
    c = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(c) < 0.01
