"""dnnbind.ops.tensor_ops: N-d cuDNN descriptors and the cuDNN/cuBLAS tensor calls the nd op table lowers to.

CPU: every prototype we bind against the header's own parameter list (count and kind of each parameter), the
enum values against the headers, descriptor creation/set without a GPU (ranks 0..8, strided, cached, bounded,
thread-safe), the shape canonicalization checked for meaning with numpy, the can_* predicates against the
limits measured on an H100 (cuDNN 9.19), and argument errors raised before any library call.
GPU (marker ``gpu``): each function against float64 numpy on random inputs (float32 to 1e-5, float64 to 1e-12,
sums scaled by sqrt(n)).
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from dnnbind._lib import cublas, cudnn
from dnnbind.ops import tensor_ops as T
from dnnbind.ops import blas_tensor as B
from dnnbind.ops import tensor_layout as TL
from dnnbind.runtime.array import NDArray
from dnnbind.runtime.device import Device

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)

# -- prototypes and enums against the headers ------------------------------------------------------------------
CUDNN_USED = ["cudnnGetTensorNdDescriptor", "cudnnTransformTensor", "cudnnSetTensor", "cudnnScaleTensor",
              "cudnnGetOpTensorDescriptor", "cudnnCreateReduceTensorDescriptor", "cudnnSetReduceTensorDescriptor",
              "cudnnGetReduceTensorDescriptor", "cudnnDestroyReduceTensorDescriptor", "cudnnGetReductionIndicesSize",
              "cudnnGetReductionWorkspaceSize", "cudnnReduceTensor",
              # declared before, used here
              "cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptor", "cudnnDestroyTensorDescriptor",
              "cudnnCreateOpTensorDescriptor", "cudnnSetOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor",
              "cudnnOpTensor", "cudnnAddTensor"]
CUBLAS_USED = ["cublasGetPointerMode_v2", "cublasSetPointerMode_v2", "cublasSgeam", "cublasDgeam",
               "cublasSgemmStridedBatched", "cublasDgemmStridedBatched", "cublasSdot_v2", "cublasDdot_v2",
               "cublasSnrm2_v2", "cublasDnrm2_v2", "cublasSgemm_v2", "cublasDgemm_v2"]
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_HANDLES = re.compile(r"^(cudnnHandle_t|cublasHandle_t|cudaStream_t|cudnn\w*Descriptor_t)$")


def _include(pkg: str) -> Path:
    try:
        mod = importlib.import_module(f"nvidia.{pkg}")
    except ImportError:
        pytest.skip(f"the nvidia-{pkg} wheel (and its headers) is not installed")
    for base in mod.__path__:
        if (Path(base) / "include").is_dir():
            return Path(base) / "include"
    pytest.skip(f"no include/ in the nvidia-{pkg} wheel")


def _header_text(pkg: str) -> str:
    return " ".join(_COMMENTS.sub(" ", h.read_text(errors="replace")) for h in sorted(_include(pkg).glob("*.h")))


def _c_kind(param: str) -> str:
    p = param.replace("const", " ")
    if "*" in p or "[" in p:
        return "ptr"
    typ = " ".join(p.split()[:-1])  # drop the parameter's name
    kinds = {"int": "i32", "size_t": "size_t", "long long int": "i64", "long long": "i64", "int64_t": "i64",
             "double": "f64", "float": "f32"}
    if typ in kinds:
        return kinds[typ]
    if _HANDLES.match(typ):
        return "ptr"  # opaque handles and descriptors are pointers
    assert typ.endswith("_t"), f"unclassified C parameter {param!r}"
    return "i32"  # an enum


def _py_kind(t) -> str:
    if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer):
        return "ptr"
    if t is ctypes.c_size_t:
        return "size_t"
    return {"i": "i32", "I": "i32", "l": "i64", "q": "i64", "d": "f64", "f": "f32"}[t._type_]


@pytest.mark.parametrize("pkg,lib,name", [("cudnn", cudnn.lib, n) for n in CUDNN_USED]
                         + [("cublas", cublas.lib, n) for n in CUBLAS_USED])
def test_prototype_matches_the_header(pkg, lib, name):
    text = _header_text(pkg)
    lists = {re.sub(r"\s+", " ", m.group(1)).strip()
             for m in re.finditer(rf"\b{name}\s*\(([^()]*)\)\s*;", text)}
    assert len(lists) == 1, f"{name}: {len(lists)} distinct prototypes in the headers: {lists}"
    params = [p for p in next(iter(lists)).split(",") if p.strip() not in ("", "void")]
    restype, argtypes = lib._table[name]
    assert len(argtypes) == len(params), f"{name}: {len(argtypes)} argtypes, header has {params}"
    for i, (p, t) in enumerate(zip(params, argtypes)):
        assert _py_kind(t) == _c_kind(p), f"{name} parameter {i} {p!r}: argtype {t.__name__}"
    assert restype.__name__ == "STATUS"


def _enums(pkg: str, prefix: str) -> dict:
    member = re.compile(rf"\b({prefix}\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*=\s*(-?\d+)\s*[,}}]")
    return {name: int(v) for name, v in member.findall(_header_text(pkg))}


def test_enum_values_match_the_headers():
    header = _enums("cudnn", "CUDNN_")
    ours = {k: v for k, v in vars(cudnn).items() if k.startswith(("CUDNN_OP_TENSOR_", "CUDNN_REDUCE_TENSOR_"))
            or k.endswith("BIT_INDICES") or k in ("CUDNN_PROPAGATE_NAN", "CUDNN_DATA_FLOAT", "CUDNN_DATA_DOUBLE",
                                                  "CUDNN_DATA_HALF")}
    assert len(ours) == 25, sorted(ours)
    assert {k: header.get(k) for k in ours} == ours
    dim_max = re.search(r"#define\s+CUDNN_DIM_MAX\s+(\d+)", _header_text("cudnn"))
    assert dim_max and int(dim_max.group(1)) == cudnn.CUDNN_DIM_MAX == T.MAX_DIMS
    header = _enums("cublas", "CUBLAS_")
    for name in ("CUBLAS_OP_N", "CUBLAS_OP_T", "CUBLAS_POINTER_MODE_HOST", "CUBLAS_POINTER_MODE_DEVICE"):
        assert header[name] == getattr(cublas, name), name


# -- descriptors without a GPU ---------------------------------------------------------------------------------
def _get_nd(desc) -> tuple:
    n, dt = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    cudnn.lib.cudnnGetTensorNdDescriptor(desc, 8, ctypes.byref(dt), ctypes.byref(n), dims, strides)
    return dt.value, tuple(dims[:n.value]), tuple(strides[:n.value])


@pytest.mark.parametrize("rank", range(9))
@pytest.mark.parametrize("dtype,code", [(F32, 0), (F64, 1), (F16, 2)])
def test_tensor_nd_ranks_0_to_8(rank, dtype, code):
    shape = tuple(int(d) for d in np.random.default_rng(rank).integers(1, 6, rank))
    strides = tuple(s // dtype.itemsize for s in np.empty(shape, dtype).strides)
    pad = max(4 - rank, 0)
    assert _get_nd(T.tensor_nd(shape, dtype)) == (code, shape + (1,) * pad, strides + (1,) * pad)


def test_tensor_nd_strided_and_cached():
    for shape, axes in [((2, 3, 4, 5), (3, 1, 0, 2)), ((2, 3), (1, 0)), ((2, 3, 4), (2, 0, 1))]:
        view = np.transpose(np.empty(shape, np.float32), axes)
        strides = tuple(s // 4 for s in view.strides)
        d = T.tensor_nd(view.shape, np.float32, strides)
        pad = max(4 - view.ndim, 0)
        assert _get_nd(d) == (0, view.shape + (1,) * pad, strides + (1,) * pad)
        assert T.tensor_nd(list(view.shape), "float32", list(strides)) is d
    flipped = T.tensor_nd((3, 4), np.float64, (-4, 1))  # cuDNN 9.19 reads negative strides (transform_tensor)
    assert _get_nd(flipped) == (1, (3, 4, 1, 1), (-4, 1, 1, 1))
    a = T.tensor_nd((6, 7), np.float32)
    assert T.tensor_nd((6, 7), np.dtype(np.float32)) is a and T.tensor_nd([6, 7], "float32", (7, 1)) is a


def test_descriptor_cache_is_bounded_and_evicted_descriptors_stay_valid(monkeypatch):
    monkeypatch.setattr(TL, "_descs", {})
    monkeypatch.setattr(TL, "CACHE_CAP", 8)
    first = T.tensor_nd((1000, 3), np.float32)
    for i in range(40):
        T.tensor_nd((i + 1, 5), np.float32)
        assert len(TL._descs) <= 8
    assert ("t", (1000, 3), F32, None) not in TL._descs
    assert _get_nd(first) == (0, (1000, 3, 1, 1), (3, 1, 1, 1))  # still alive: we hold it


def test_descriptor_cache_is_thread_safe(monkeypatch):
    monkeypatch.setattr(TL, "_descs", {})
    got, barrier = [], threading.Barrier(8)

    def work():
        barrier.wait()
        got.append([T.tensor_nd((11, 13, k), np.float32) for k in range(1, 30)])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(all(a is b for a, b in zip(row, got[0])) for row in got)


def test_op_and_reduce_descriptors():
    vals = [ctypes.c_int() for _ in range(5)]
    refs = [ctypes.byref(v) for v in vals]
    for op, code in T.OP_TENSOR_OPS.items():
        for dtype, comp in [(F32, 0), (F16, 0), (F64, 1)]:
            cudnn.lib.cudnnGetOpTensorDescriptor(TL.op_tensor_desc(op, dtype), *refs[:3])
            assert [v.value for v in vals[:3]] == [code, comp, cudnn.CUDNN_PROPAGATE_NAN]
    for op, code in T.REDUCE_OPS.items():
        for indices in ([False, True] if op in T.INDEX_OPS else [False]):
            cudnn.lib.cudnnGetReduceTensorDescriptor(TL.reduce_tensor_desc(op, F64, indices), *refs)
            assert [v.value for v in vals] == [code, 1, cudnn.CUDNN_PROPAGATE_NAN, int(indices), 0]
    assert TL.reduce_tensor_desc("sum", F32, False) is TL.reduce_tensor_desc("sum", F32, False)


@pytest.mark.parametrize("shape,strides,dtype,exc,match", [
    ((1,) * 9, None, F32, ValueError, "at most 8"),
    ((2, 0, 3), None, F32, ValueError, "empty"),
    ((2, 3), (0, 1), F32, ValueError, "zero stride"),
    ((2, 3), (3, 1, 1), F32, ValueError, "do not match"),
    ((2, 3), None, np.int32, TypeError, "int32"),
    ((2**16, 2**15), None, F32, ValueError, "2\\*\\*31"),
    ((2, 3.5), None, F32, TypeError, "ints"),
])
def test_tensor_nd_rejects(shape, strides, dtype, exc, match):
    with pytest.raises(exc, match="tensor_nd.*" + match):
        T.tensor_nd(shape, dtype, strides)


# -- canonical shapes keep the meaning (numpy) -----------------------------------------------------------------
def _random_case(rng, rank):
    shape = tuple(int(d) for d in rng.integers(1, 5, rank))
    mask = rng.random(rank) < 0.5
    return shape, mask


@pytest.mark.parametrize("seed", range(40))
def test_canonical_layouts_keep_the_meaning(seed):
    rng = np.random.default_rng(seed)
    shape, mask = _random_case(rng, int(rng.integers(0, 9)))
    x = rng.standard_normal(shape)
    # broadcast: b has 1 where mask
    b_shape = tuple(1 if m else d for d, m in zip(shape, mask))
    b = rng.standard_normal(b_shape)
    a_dims, b_dims = TL.canonical_broadcast(shape, b_shape)
    np.testing.assert_array_equal((x.reshape(a_dims) + b.reshape(b_dims)).reshape(shape), x + b)
    # reduce over the masked axes: values and flattened indices
    axes = tuple(i for i, m in enumerate(mask) if m)
    a_dims, c_dims = TL.canonical_reduce(shape, axes)
    red = tuple(i for i, (a, c) in enumerate(zip(a_dims, c_dims)) if a != c)
    np.testing.assert_allclose(x.reshape(a_dims).sum(red, keepdims=True).reshape(-1),
                               x.sum(axes, keepdims=True).reshape(-1), rtol=1e-12)
    np.testing.assert_array_equal(_flat_argmax(x.reshape(a_dims), red).reshape(-1), _flat_argmax(x, axes).reshape(-1))
    # strided read (a transpose): merged dims and strides read the same elements
    perm = tuple(int(p) for p in rng.permutation(len(shape)))
    view = np.transpose(x, perm)
    dims, st = TL.canonical_strided(view.shape, tuple(s // 8 for s in view.strides))
    merged = np.lib.stride_tricks.as_strided(x, dims, tuple(s * 8 for s in st)) if dims else x.reshape(())
    np.testing.assert_array_equal(merged.reshape(-1), view.reshape(-1))


def _flat_argmax(x, axes, fn=np.argmax):
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [-1])
    out = fn(moved, axis=-1)
    return out.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])


def test_can_predicates_follow_the_measured_limits():
    # Measured on an H100 with cuDNN 9.19: OpTensor/AddTensor refuse 6+ dims; ReduceTensor takes 8 dims with
    # any pattern of reduced axes; TransformTensor takes 8 dims, negative strides and dims past 65535.
    assert T.can_op_tensor("add", (2, 3, 4, 5, 6), (1, 3, 1, 5, 1), F32)
    assert not T.can_op_tensor("add", (2, 3, 4, 5, 6, 7), (1, 3, 1, 5, 1, 7), F32)
    assert T.can_op_tensor("mul", (2, 3, 4, 5, 6, 7), (1, 1, 4, 5, 6, 7), F64)  # merges to 2 dims
    assert T.can_op_tensor("sqrt", (2, 3, 4, 5, 6, 7, 8, 9), None, F16)
    assert not T.can_op_tensor("add", (2, 3), (3, 1), F32) and not T.can_op_tensor("pow", (2,), (2,), F32)
    assert not T.can_op_tensor("add", (2, 3), (1, 3), np.int32)
    assert not T.can_add_tensor((2, 1, 4, 1, 6, 1), (2, 3, 4, 5, 6, 7), F32)
    assert T.can_add_tensor((1, 3, 1, 1), (2, 3, 4, 5), F32)
    assert T.can_reduce("sum", (2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6), F32)
    assert T.can_reduce("max", (2, 3, 4, 5, 6, 7), (1, 3, 5), F64, indices=True)
    assert not T.can_reduce("sum", (2, 3, 4), 1, F32, indices=True)
    assert not T.can_reduce("sum", (2, 3) * 5, (0, 2, 4, 6, 8), F32)  # 10 dims after merging
    assert T.can_reduce("sum", (2, 3) * 5, (0, 1, 2), F32)  # 8 after merging
    assert T.can_transform((2, 3, 2, 3, 2, 3, 2, 3), (1, 2, 6, 12, 36, 72, 216, 432), F32)
    assert T.can_transform((4, 5), (-5, 1), F32) and T.can_transform((70000, 3), (1, 70000), F32)
    assert not T.can_transform((4, 5), (0, 1), F32) and not T.can_transform((4, 5), (1,), F32)


# -- argument errors before any library call -------------------------------------------------------------------
@pytest.fixture
def no_library(monkeypatch):
    """Fake GPU arrays; any path that reaches cuDNN, cuBLAS or device memory fails the test."""
    def reached(*args, **kwargs):
        raise AssertionError("validation let the call reach the library")
    for mod, names in ((T, ("dnn", "blas", "memcpy", "workspace", "DeviceBuffer")), (B, ("blas", "gemm_into"))):
        for name in names:
            monkeypatch.setattr(mod, name, reached)
    for mod in (T, B):
        monkeypatch.setattr(mod, "empty", lambda shape, dtype, device: fake(shape, dtype))


_PTRS = itertools.count(0x7F0000000000, 0x100000)


def fake(shape, dtype=F32, index=0, ptr=None):
    return NDArray._from_ptr(ptr or next(_PTRS), shape, dtype, Device("gpu", index), None)


def _cases():
    a, b6 = fake((2, 3)), fake((2, 3, 4, 5, 6, 7))
    return [
        (lambda: T.op_tensor("pow", a, a), ValueError, "op_tensor: op must be"),
        (lambda: T.op_tensor("add", a), ValueError, "op_tensor: add needs b"),
        (lambda: T.op_tensor("add", a, fake((3, 2))), ValueError, r"op_tensor: b \(3, 2\) does not broadcast"),
        (lambda: T.op_tensor("add", a, fake((3,))), ValueError, "op_tensor: b .* does not broadcast"),
        (lambda: T.op_tensor("add", a, fake((2, 3), np.int32)), TypeError, "op_tensor: b has dtype int32"),
        (lambda: T.op_tensor("add", a, NDArray._from_numpy(np.ones((2, 3), np.float32))), TypeError,
         "op_tensor: b .* lives on the cpu"),
        (lambda: T.op_tensor("add", a, np.ones((2, 3), np.float32)), TypeError, "op_tensor: b must be"),
        (lambda: T.op_tensor("add", a, fake((2, 3), index=1)), ValueError, "op_tensor: arrays on different"),
        (lambda: T.op_tensor("add", a, a, beta=1.0), ValueError, "op_tensor: beta=1.0 .* needs out"),
        (lambda: T.op_tensor("add", a, a, out=fake((3, 2))), ValueError, r"op_tensor: out has shape \(3, 2\)"),
        (lambda: T.op_tensor("add", a, a, alpha1="x"), TypeError, "op_tensor: alpha1"),
        (lambda: T.op_tensor("add", b6, fake((1, 3, 1, 5, 1, 7))), NotImplementedError, "op_tensor: .* 6 dims"),
        (lambda: T.add_tensor_nd(fake((2, 1, 4, 1, 6, 1)), b6), NotImplementedError, "add_tensor_nd: .* 6 dims"),
        (lambda: T.add_tensor_nd(fake((2, 4)), a), ValueError, r"add_tensor_nd: b \(2, 4\) does not broadcast"),
        (lambda: T.reduce_tensor("avg", a), ValueError, "reduce_tensor: op must be"),
        (lambda: T.reduce_tensor("sum", a, 2), ValueError, "reduce_tensor: axes 2 out of range"),
        (lambda: T.reduce_tensor("sum", a, (1, -1)), ValueError, "reduce_tensor: repeated axis"),
        (lambda: T.reduce_tensor("sum", a, 1.5), TypeError, "reduce_tensor: axes must be"),
        (lambda: T.reduce_tensor("sum", a, 1, indices=True), ValueError, "reduce_tensor: indices=True needs"),
        (lambda: T.reduce_tensor("sum", a, 1, out=fake((2, 3))), ValueError, "reduce_tensor: out has shape"),
        (lambda: T.reduce_tensor("sum", fake((2, 3) * 5), (0, 2, 4, 6, 8)), NotImplementedError,
         "reduce_tensor: .* 10 dims"),
        (lambda: T.reduce_tensor("max", fake((0, 3)), 0), ValueError, "reduce_tensor: max over an empty"),
        (lambda: T.transform_tensor(a, fake((3, 2)), (1,)), ValueError, "transform_tensor: x_strides"),
        (lambda: T.transform_tensor(a, fake((3, 2)), (1, 4)), ValueError, "transform_tensor: reading out"),
        (lambda: T.transform_tensor(a, fake((3, 2)), (-1, 3)), ValueError, "transform_tensor: reading out"),
        (lambda: T.transform_tensor(a, fake((3, 2)), (0, 1)), NotImplementedError, "transform_tensor: .*zero"),
        (lambda: T.transform_tensor(a, fake((3, 2), ptr=a.ptr), (1, 3)), ValueError, "transform_tensor: .*share"),
        (lambda: T.transpose(a, (0, 0)), ValueError, "transpose: axes .* are not a permutation"),
        (lambda: T.transpose(a, (0, 2)), ValueError, "transpose: axes"),
        (lambda: T.scale_tensor(fake((2,), np.int32), 2.0), TypeError, "scale_tensor: x has dtype int32"),
        (lambda: T.set_tensor(a, "1"), TypeError, "set_tensor: value must be a real number"),
        (lambda: B.geam(fake((2, 3, 4))), ValueError, "geam: a must have 2 dims"),
        (lambda: B.geam(a, fake((2, 3)), trans_b=True), ValueError, r"geam: op\(a\) is \(2, 3\) but op\(b\)"),
        (lambda: B.geam(a, None, beta=1.0), ValueError, "geam: beta=1.0 needs b"),
        (lambda: B.geam(fake((2, 3), F16)), TypeError, "geam: a has dtype float16"),
        (lambda: B.geam(a, trans_a=True, out=fake((3, 2), ptr=a.ptr)), ValueError, "geam: out may share"),
        (lambda: B.geam(a, trans_a=1), TypeError, "geam: trans_a must be a bool"),
        (lambda: B.gemm_strided_batched(fake((2, 3, 4)), fake((3, 4, 5))), ValueError,
         "gemm_strided_batched: op\\(a\\) is \\(2, 3, 4\\) but op\\(b\\) is \\(3, 4, 5\\)"),
        (lambda: B.gemm_strided_batched(fake((2, 3, 4)), fake((2, 5, 5))), ValueError, "gemm_strided_batched"),
        (lambda: B.gemm_strided_batched(fake((2, 3, 4)), fake((2, 4, 5)), beta=0.5), ValueError,
         "gemm_strided_batched: beta=0.5"),
        (lambda: B.gemm_strided_batched(a, fake((2, 3, 4))), ValueError, "gemm_strided_batched: a must have 3"),
        (lambda: B.matmul2d(a, fake((2, 3))), ValueError, "matmul2d: inner dimensions differ"),
        (lambda: B.matmul2d(a, fake((3, 2)), out=fake((3, 3))), ValueError, "matmul2d: out has shape"),
        (lambda: B.dot(a, fake((7,))), ValueError, r"dot: x \(2, 3\) and y \(7,\) have different sizes"),
        (lambda: B.dot(fake((3,), F64), fake((3,))), TypeError, "dot: dtypes differ"),
        (lambda: B.nrm2(a, out=fake((2,))), ValueError, "nrm2: out must have one element"),
    ]


@pytest.mark.parametrize("i", range(len(_cases())))
def test_bad_arguments_raise_before_any_library_call(no_library, i):
    call, exc, match = _cases()[i]
    with pytest.raises(exc, match=match):
        call()


def test_empty_arrays_need_no_library(no_library):
    a = fake((0, 3))
    assert T.op_tensor("add", a, fake((1, 3))).shape == (0, 3)
    assert T.transpose(a).shape == (3, 0)
    assert B.geam(a, trans_a=True).shape == (3, 0)
    assert T.reduce_tensor("sum", a, 1).shape == (0, 1)
    assert T.scale_tensor(a, 2.0) is a and T.set_tensor(a, 1.0) is a


# -- GPU: each function against float64 numpy ------------------------------------------------------------------
RTOL = {F32: 1e-5, F64: 1e-12, F16: 2e-3}


def _gpu():
    from dnnbind.runtime.device import gpu
    return gpu(0)


def g(a):
    from dnnbind.runtime.array import array
    return array(np.array(a, order="C"), device=_gpu())  # (ascontiguousarray makes 0-d arrays 1-d)


def rnd(shape, seed, dtype=F32, low=None):
    x = np.random.default_rng(seed).standard_normal(shape)
    if low is not None:  # magnitudes in [low, low + 1), random signs (prod, sqrt)
        x = np.sign(x) * (low + np.random.default_rng(seed + 1).random(shape))
    return x.astype(dtype)


def check(actual, expected, dtype, scale=0.0, name="value"):
    """|actual - expected| <= rtol (|expected| + scale) elementwise, rtol 1e-5 for float32, 1e-12 for float64;
    ``scale`` (broadcast) is the magnitude of the terms that were combined (sqrt(n) ||x|| for sums of n)."""
    got = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != expected {expected.shape}"
    tol = RTOL[dtype] * (np.abs(expected) + np.broadcast_to(scale, expected.shape) + 1e-30)
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(got - expected) <= tol) | (np.isnan(got) & np.isnan(expected)))
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} out of tolerance (rtol {RTOL[dtype]:g}, "
                             f"{np.dtype(dtype).name}); first at {i}: got {got[i]!r}, expected {expected[i]!r}, "
                             f"tolerance {tol[i]:.3g}")


BROADCAST_CASES = [((7,), (7,)), ((7,), (1,)), ((3, 5), (1, 5)), ((3, 5), (3, 1)), ((2, 3, 4), (2, 1, 4)),
                   ((2, 3, 4, 5), (1, 3, 1, 1)), ((2, 3, 4, 5), (2, 1, 4, 1)), ((2, 3, 4, 5, 6), (1, 3, 1, 5, 1)),
                   ((2, 3, 4, 5, 6, 7), (1, 1, 4, 5, 1, 1)), ((64, 128), (1, 128)), ((), ())]
_REF = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "min": np.minimum, "max": np.maximum}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", ["add", "mul", "min", "max"])
@pytest.mark.parametrize("case", range(len(BROADCAST_CASES)))
def test_op_tensor(op, case, dtype):
    shape, b_shape = BROADCAST_CASES[case]
    a, b, c = rnd(shape, case, dtype), rnd(b_shape, case + 100, dtype), rnd(shape, case + 200, dtype)
    a64, b64, c64 = (x.astype(np.float64) for x in (a, b, c))
    check(T.op_tensor(op, g(a), g(b)), _REF[op](a64, b64), dtype, np.abs(a64) + np.abs(b64))
    out = T.op_tensor(op, g(a), g(b), out=g(c), alpha1=1.5, alpha2=-0.75, beta=0.5)
    expected = _REF[op](1.5 * a64, -0.75 * b64) + 0.5 * c64
    check(out, expected, dtype, 2 * (np.abs(a64) + np.abs(b64) + np.abs(c64)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_op_tensor_unary_half_and_in_place(dtype):
    a = rnd((4, 5, 6), 1, dtype, low=0.1)
    a64 = a.astype(np.float64)
    check(T.op_tensor("sqrt", g(np.abs(a))), np.sqrt(np.abs(a64)), dtype)
    check(T.op_tensor("not", g(a)), 1 - a64, dtype, 1 + np.abs(a64))  # cuDNN's NOT is 1 - a (H100, 9.19)
    b = rnd((1, 5, 1), 2, dtype)
    x = g(a)
    assert T.op_tensor("mul", x, g(b), out=x) is x
    check(x, a64 * b.astype(np.float64), dtype, np.abs(a64 * b))


@pytest.mark.gpu
def test_op_tensor_past_cudnn_limits_raises_not_implemented():
    a, b = g(rnd((2, 3, 4, 5, 6, 7), 0)), g(rnd((1, 3, 1, 5, 1, 7), 1))
    assert not T.can_op_tensor("add", a.shape, b.shape, F32)
    with pytest.raises(NotImplementedError, match="op_tensor"):
        T.op_tensor("add", a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("case", range(len(BROADCAST_CASES)))
def test_add_tensor_nd(case, dtype):
    shape, b_shape = BROADCAST_CASES[case]
    y, b = rnd(shape, case, dtype), rnd(b_shape, case + 1, dtype)
    gy = g(y)
    assert T.add_tensor_nd(g(b), gy, alpha=2.0, beta=-0.5) is gy
    check(gy, 2 * b.astype(np.float64) - 0.5 * y.astype(np.float64), dtype, 2 * (np.abs(b) + np.abs(y)))


REDUCE_CASES = [((9,), 0), ((9,), None), ((6, 7), 1), ((6, 7), 0), ((6, 7), None), ((3, 4, 5), (0, 2)),
                ((3, 4, 5), -1), ((3, 4, 5), (1, 2)), ((2, 3, 4, 5), (1, 3)), ((2, 3, 4, 5), (0, 3)),
                ((2, 1, 4, 5), (1,)), ((2, 1, 4, 5), (0, 1)), ((3, 4, 5, 6, 7), (0, 2, 4)), ((3, 4, 5, 6, 7), 2),
                ((2, 3, 4, 5, 6, 3), (1, 3, 5)), ((2, 3, 4, 5, 6, 3), (0, 1, 2)),
                ((2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6)), ((1000, 37), 0), ((5,), ()), ((), None)]


def _reduce_ref(op, x, axes):
    axes = tuple(range(x.ndim)) if axes is None else axes
    x = x.astype(np.float64)
    fns = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean,
           "amax": lambda v, **k: np.max(np.abs(v), **k), "norm1": lambda v, **k: np.sum(np.abs(v), **k),
           "norm2": lambda v, **k: np.sqrt(np.sum(v * v, **k))}
    n = int(np.prod([x.shape[a] for a in axes]))
    expected = fns[op](x, axis=axes, keepdims=True)
    l2 = np.sqrt(np.sum(x * x, axis=axes, keepdims=True))  # rounding of a sum of n grows like sqrt(n) ||x||
    scale = {"sum": np.sqrt(n) * l2, "mean": l2 / np.sqrt(n), "norm1": np.sqrt(n) * l2, "norm2": np.sqrt(n) * l2,
             "prod": np.abs(expected) * n}
    return expected, scale.get(op, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", list(T.REDUCE_OPS))
@pytest.mark.parametrize("case", range(len(REDUCE_CASES)))
def test_reduce_tensor(op, case, dtype):
    shape, axes = REDUCE_CASES[case]
    x = rnd(shape, case, dtype, low=0.5 if op == "prod" else None)
    norm_axes = T._normalize_axes("t", axes, len(shape))
    expected, scale = _reduce_ref(op, x, norm_axes)
    out = T.reduce_tensor(op, g(x), axes)
    assert out.shape == expected.shape
    check(out, expected, dtype, scale, f"{op} over {axes} of {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("case", range(len(REDUCE_CASES)))
def test_reduce_tensor_indices(op, case):
    shape, axes = REDUCE_CASES[case]
    x = rnd(shape, case + 7)
    norm_axes = T._normalize_axes("t", axes, len(shape))
    out, idx = T.reduce_tensor(op, g(x), axes, indices=True)
    expected = _flat_argmax(x, norm_axes, np.argmax if op == "max" else np.argmin)
    assert idx.dtype == np.int32 and idx.shape == out.shape
    np.testing.assert_array_equal(idx.numpy(), expected)
    check(out, _reduce_ref(op, x, norm_axes)[0], F32)


@pytest.mark.gpu
def test_reduce_tensor_alpha_beta_dropped_out_half_and_empty():
    x = rnd((4, 5, 6), 3)
    x64 = x.astype(np.float64)
    c = rnd((4, 6), 4)
    out = T.reduce_tensor("sum", g(x), 1, out=g(c), alpha=2.0, beta=-1.0)  # out without the reduced axis
    check(out, 2 * x64.sum(1) - c, F32, 2 * np.abs(x64).sum(1) + np.abs(c))
    h = rnd((8, 50), 5, F16)
    check(T.reduce_tensor("sum", g(h), 1), h.astype(np.float64).sum(1, keepdims=True), F16,
          np.abs(h.astype(np.float64)).sum(1, keepdims=True))
    assert T.reduce_tensor("sum", g(np.ones((0, 3), np.float32)), 0).numpy().tolist() == [[0.0, 0.0, 0.0]]
    assert T.reduce_tensor("prod", g(np.ones((3, 0), np.float32)), 1).numpy().tolist() == [[1.0]] * 3
    _, idx = T.reduce_tensor("max", g(x[:, :1]), 1, indices=True)  # nothing to reduce: indices 0
    assert not idx.numpy().any()


TRANSPOSE_CASES = [((3, 4), None), ((5, 1), (1, 0)), ((3, 4, 5), (2, 0, 1)), ((3, 4, 5), (0, 2, 1)),
                   ((2, 3, 4, 5), (3, 1, 0, 2)), ((2, 3, 4, 5), (0, 1, 3, 2)), ((2, 3, 4, 5, 6), (4, 2, 0, 3, 1)),
                   ((2, 3, 4, 5, 6), (0, 1, 2, 3, 4)), ((2, 3, 2, 3, 2, 3, 2, 3), None), ((70000, 3), (1, 0))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("case", range(len(TRANSPOSE_CASES)))
def test_transpose(case, dtype):
    shape, axes = TRANSPOSE_CASES[case]
    x = rnd(shape, case, dtype)
    out = T.transpose(g(x), axes)
    np.testing.assert_array_equal(out.numpy(), np.transpose(x, axes))  # a copy: exact


@pytest.mark.gpu
def test_transform_tensor_flip_and_blend():
    x = rnd((3, 4, 5), 0)
    out = T.empty((3, 4, 5), F32, _gpu())
    T.transform_tensor(g(x), out, (20, -5, 1), x_offset=15)  # axis 1 reversed
    np.testing.assert_array_equal(out.numpy(), x[:, ::-1])
    c = rnd((5, 3, 4), 1)
    out = T.transform_tensor(g(x), g(c), (1, 20, 5), alpha=2.0, beta=0.5)
    check(out, 2 * np.transpose(x, (2, 0, 1)).astype(np.float64) + 0.5 * c, F32, 2 + np.abs(c) + 2 * np.abs(x).max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_scale_and_set_tensor(dtype):
    x = rnd((3, 100003), 0, dtype)
    gx = g(x)
    assert T.scale_tensor(gx, -0.5) is gx
    check(gx, -0.5 * x.astype(np.float64), dtype, np.abs(x))
    for value in (1.25, -3.0, float("inf"), float("nan")):
        T.set_tensor(gx, value)
        np.testing.assert_array_equal(gx.numpy(), np.full(x.shape, value, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_geam(trans_a, trans_b, dtype):
    m, n = 37, 53
    a = rnd((n, m) if trans_a else (m, n), 1, dtype)
    b = rnd((n, m) if trans_b else (m, n), 2, dtype)
    op_a, op_b = (a.T if trans_a else a).astype(np.float64), (b.T if trans_b else b).astype(np.float64)
    out = B.geam(g(a), g(b), 1.5, -0.25, trans_a, trans_b)
    check(out, 1.5 * op_a - 0.25 * op_b, dtype, 2 * (np.abs(op_a) + np.abs(op_b)))
    at = B.geam(g(a), trans_a=not trans_a)  # b None: a one-call transpose (or copy)
    np.testing.assert_array_equal(at.numpy(), a if trans_a else a.T)
    a[0, 1] = np.inf  # beta 0 with b None: the stand-in b must not turn inf into nan
    assert np.isinf(B.geam(g(a), trans_a=True).numpy()[1, 0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_strided_batched_and_matmul2d(trans_a, trans_b, dtype):
    batch, m, k, n = 5, 17, 23, 11
    a = rnd((batch, k, m) if trans_a else (batch, m, k), 1, dtype)
    b = rnd((batch, n, k) if trans_b else (batch, k, n), 2, dtype)
    op_a = np.swapaxes(a, 1, 2) if trans_a else a
    op_b = np.swapaxes(b, 1, 2) if trans_b else b
    expected = np.matmul(op_a.astype(np.float64), op_b.astype(np.float64))
    scale = np.matmul(np.abs(op_a).astype(np.float64), np.abs(op_b)) * np.sqrt(k)
    check(B.gemm_strided_batched(g(a), g(b), trans_a, trans_b), expected, dtype, scale)
    c = rnd((batch, m, n), 3, dtype)
    out = B.gemm_strided_batched(g(a), g(b), trans_a, trans_b, alpha=-2.0, beta=0.5, out=g(c))
    check(out, -2 * expected + 0.5 * c, dtype, 2 * scale + np.abs(c))
    check(B.matmul2d(g(a[1]), g(b[1]), trans_a, trans_b), expected[1], dtype, scale[1])
    out = B.matmul2d(g(a[2]), g(b[2]), trans_a, trans_b, out=g(c[2]), alpha=0.5, beta=2.0)
    check(out, 0.5 * expected[2] + 2 * c[2], dtype, scale[2] + 2 * np.abs(c[2]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("n", [1, 7, 100003])
def test_dot_and_nrm2_write_device_results_and_restore_the_pointer_mode(n, dtype):
    x, y = rnd((n,), 1, dtype), rnd((n,), 2, dtype)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    out = B.dot(g(x), g(y))
    assert out.shape == (1,)
    check(out, [x64 @ y64], dtype, np.sqrt(n) * np.linalg.norm(x64 * y64))
    check(B.nrm2(g(x.reshape(1, -1))), [np.sqrt(x64 @ x64)], dtype, np.sqrt(n) * np.sqrt(x64 @ x64))
    mode = ctypes.c_int(-1)
    cublas.lib.cublasGetPointerMode_v2(T.blas(g(x)), ctypes.byref(mode))
    assert mode.value == cublas.CUBLAS_POINTER_MODE_HOST
    # host alpha/beta still work on the shared handle after the device-result calls
    check(B.matmul2d(g(x.reshape(1, -1)), g(y.reshape(-1, 1))), [[x64 @ y64]], dtype,
          np.sqrt(n) * np.linalg.norm(x64 * y64))
    assert B.dot(g(x[:0]), g(y[:0])).numpy().tolist() == [0.0]
