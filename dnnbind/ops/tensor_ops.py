"""Layer 2 (ops): the cuDNN "tensor" calls the nd op table lowers to (OpTensor, AddTensor, ReduceTensor,
TransformTensor, Scale/SetTensor). Imports _lib, runtime and ops (tensor_layout for the N-d descriptors and
canonical shapes, descriptors, _common, _check); the cuBLAS ones are in ops/blas_tensor.py.

GPU NDArrays only (C-contiguous); the op table keeps the numpy twins and validates op-level input, these
helpers validate again (TypeError/ValueError naming the function and shapes) before any library call.

NOTE: shapes are made canonical before they reach cuDNN: size-1 dims are dropped and neighbouring dims that
behave alike (both broadcast or both full in ``b``, both reduced or both kept, strides that chain) are merged.
The memory and the result are the same, flattened reduction indices included, and ranks shrink under cuDNN's
limits (OpTensor/AddTensor: 5 dims; descriptors: CUDNN_DIM_MAX = 8). What is still beyond a limit raises
NotImplementedError; ``can_op_tensor``/``can_reduce``/``can_transform``/``can_add_tensor`` say so up front, so
the table can route to its NVRTC kernel instead. cuDNN descriptors get at least 4 dims (older cuDNN wants
nbDims >= 3 or 4): shorter ranks are padded with trailing 1s, so (N, C) meets cuDNN as (N, C, 1, 1).
NOTE: cuDNN's OpTensor/ReduceTensor/Transform have no TF32 path; cuBLAS follows the handle's math mode,
which runtime.handles keeps in step with dnnbind's (strict FP32 unless ``set_math_mode("tf32")``).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import math
import operator

import numpy as np

from .._lib import cublas, cudnn
from .._lib.errors import CublasError, CudnnError
from ..runtime.array import NDArray, contiguous_strides, empty
from ..runtime.memory import D2D, DeviceBuffer, memcpy
from ..runtime.stream import current_stream
from . import _check
from . import descriptors as D
from ._common import blas, dnn, with_context, workspace
from .tensor_layout import (INT_MAX, MAX_DIMS, MIN_DIMS, OP_TENSOR_OPS, REDUCE_OPS, cached,  # noqa: F401
                            canonical_broadcast, canonical_reduce, canonical_strided, check_dims_fit, descriptor_rank,
                            op_tensor_desc, reduce_tensor_desc, stride_span, tensor_nd)

L, C = cudnn.lib, cublas.lib
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DNN_FLOATS, BLAS_FLOATS = (F32, F64, F16), (F32, F64)
OP_TENSOR_MAX_DIMS = 5  # cuDNN docs: OpTensor and AddTensor support tensors of up to 5 dims
REDUCE_MAX_DIMS = MAX_DIMS

UNARY_OPS = ("sqrt", "not")
INDEX_OPS = ("min", "max")  # cuDNN computes indices for MIN and MAX only
_EMPTY_IDENTITY = {"sum": 0.0, "norm1": 0.0, "norm2": 0.0, "prod": 1.0, "mean": math.nan}
CUBLAS_GEAM = {F32: "cublasSgeam", F64: "cublasDgeam"}  # the geam function per dtype (here and ops/blas_tensor.py)


# -- argument checks -------------------------------------------------------------------------------------------
def check_gpu_arrays(op: str, allowed: tuple, **arrays) -> np.dtype:
    """All given arrays (None skipped) are GPU NDArrays on one device with one dtype from ``allowed``."""
    device = None
    for name, a in arrays.items():
        if a is None:
            continue
        if not isinstance(a, NDArray):
            raise DnnbindTypeError(f"{op}: {name} must be a dnnbind NDArray on a GPU, got {type(a).__name__}")
        if not a.on_gpu:
            raise DnnbindTypeError(f"{op}: {name} {a.shape} lives on the cpu; {op} takes GPU arrays")
        if device is None:
            device = a.device
        elif a.device is not device:
            raise DnnbindValueError(f"{op}: arrays on different devices: "
                             + ", ".join(f"{k} on {v.device}" for k, v in arrays.items() if v is not None))
    return _check.check_dtype(op, allowed, **arrays)


def real_scalar(op: str, name: str, value) -> float:
    """An alpha/beta argument as a float (ops._check.scalar's checks; a float passes straight through)."""
    return value if type(value) is float else _check.scalar(op, name, value)


def out_or_empty(op: str, out, shape: tuple, dtype, device, beta: float, also=None) -> NDArray:
    """The given ``out`` (of ``shape``, or of ``also`` where given), else a new array; beta != 0 needs ``out``."""
    if out is None:
        if beta != 0:
            raise DnnbindValueError(f"{op}: beta={beta} blends into out, so it needs out; pass out or beta=0")
        return empty(shape, dtype, device)
    if out.shape != shape and out.shape != also:
        expected = f"{shape}" + (f" or {also}" if also is not None else "")
        raise DnnbindValueError(f"{op}: out has shape {out.shape}; expected {expected}")
    return out


def _broadcast_check(op: str, b_shape: tuple, shape: tuple, names=("b", "a")) -> None:
    if len(b_shape) != len(shape) or any(db != d and db != 1 for db, d in zip(b_shape, shape)):
        raise DnnbindValueError(f"{op}: {names[0]} {b_shape} does not broadcast to {names[1]} {shape}: cuDNN needs the "
                         f"same rank and each {names[0]} dim equal to {names[1]}'s or 1 (swap the operands or "
                         "reshape first)")


def _normalize_axes(op: str, axes, ndim: int) -> tuple:
    if axes is None:
        return tuple(range(ndim))
    items = (axes,) if isinstance(axes, (int, np.integer)) else axes
    try:
        norm = tuple(operator.index(a) for a in items)
    except TypeError:
        raise DnnbindTypeError(f"{op}: axes must be an int, a sequence of ints or None, got {axes!r}") from None
    if any(not -ndim <= a < ndim for a in norm):
        raise DnnbindValueError(f"{op}: axes {axes} out of range for an array of {ndim} dims")
    norm = tuple(sorted(a % ndim for a in norm))
    if len(set(norm)) != len(norm):
        raise DnnbindValueError(f"{op}: repeated axis in {axes}")
    return norm


# -- what cuDNN takes ------------------------------------------------------------------------------------------
def can_op_tensor(op: str, a_shape, b_shape, dtype) -> bool:
    """True when ``op_tensor(op, a, b)`` runs in cuDNN for these shapes (b broadcast to a) and dtype."""
    a_shape, b_shape = tuple(a_shape), tuple(a_shape if b_shape is None else b_shape)
    if op not in OP_TENSOR_OPS or np.dtype(dtype) not in DNN_FLOATS or len(a_shape) != len(b_shape) \
            or any(db != d and db != 1 for db, d in zip(b_shape, a_shape)) or math.prod(a_shape) > INT_MAX:
        return False
    return descriptor_rank(canonical_broadcast(a_shape, b_shape)[0]) <= OP_TENSOR_MAX_DIMS


def can_add_tensor(b_shape, y_shape, dtype) -> bool:
    """True when ``add_tensor_nd(b, y)`` runs in cuDNN (same rule as OpTensor: merged rank <= 5)."""
    return can_op_tensor("add", y_shape, b_shape, dtype)


def can_reduce(op: str, shape, axes, dtype, indices: bool = False) -> bool:
    """True when ``reduce_tensor(op, x, axes, indices=...)`` runs in cuDNN for an x of ``shape``."""
    shape = tuple(shape)
    if op not in REDUCE_OPS or np.dtype(dtype) not in DNN_FLOATS or (indices and op not in INDEX_OPS) \
            or math.prod(shape) > INT_MAX:
        return False
    axes = _normalize_axes("can_reduce", axes, len(shape))
    return descriptor_rank(canonical_reduce(shape, axes)[0]) <= REDUCE_MAX_DIMS


def can_transform(shape, strides, dtype) -> bool:
    """True when cuDNN can copy an array of ``shape`` read with element ``strides`` into a contiguous one.
    Negative strides work (cuDNN 9.19, H100); zero strides (broadcast reads) on dims > 1 do not."""
    shape, strides = tuple(shape), tuple(strides)
    if np.dtype(dtype) not in DNN_FLOATS or len(shape) != len(strides) or any(s == 0 and d > 1 for d, s in
                                                                             zip(shape, strides)) \
            or math.prod(shape) > INT_MAX or stride_span(shape, strides) > INT_MAX:
        return False
    return descriptor_rank(canonical_strided(shape, strides)[0]) <= MAX_DIMS


# -- cuDNN calls -----------------------------------------------------------------------------------------------
def op_tensor(op: str, a: NDArray, b: NDArray | None = None, out: NDArray | None = None, alpha1: float = 1.0,
              alpha2: float = 1.0, beta: float = 0.0) -> NDArray:
    """out = op(alpha1 a, alpha2 b) + beta out (cudnnOpTensor); b broadcast to a's shape (dims equal or 1).
    op: add, mul, min, max, or the unary sqrt, not (b ignored: ``not`` is cuDNN's 1 - a). out may be a."""
    if op not in OP_TENSOR_OPS:
        raise DnnbindValueError(f"op_tensor: op must be one of {tuple(OP_TENSOR_OPS)}, got {op!r}")
    unary = op in UNARY_OPS
    if b is None and not unary:
        raise DnnbindValueError(f"op_tensor: {op} needs b")
    dtype = check_gpu_arrays("op_tensor", DNN_FLOATS, a=a, b=None if unary else b, out=out)
    alpha1, alpha2, beta = (real_scalar("op_tensor", n, v) for n, v in (("alpha1", alpha1), ("alpha2", alpha2),
                                                                           ("beta", beta)))
    b = a if unary else b
    _broadcast_check("op_tensor", b.shape, a.shape)
    out = out_or_empty("op_tensor", out, a.shape, dtype, a.device, beta)
    if a.size == 0:
        return out
    a_dims, b_dims = canonical_broadcast(a.shape, b.shape)
    check_dims_fit("op_tensor", a_dims, OP_TENSOR_MAX_DIMS, f"a {a.shape} with b {b.shape}")
    ad = tensor_nd(a_dims, dtype)
    try:
        L.cudnnOpTensor(dnn(a), op_tensor_desc(op, dtype), D.scalar_ptr(alpha1, dtype), ad, a.ptr,
                        D.scalar_ptr(alpha2, dtype), tensor_nd(b_dims, dtype), b.ptr, D.scalar_ptr(beta, dtype),
                        ad, out.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=f"op_tensor({op})", a=a.shape, b=b.shape, dtype=dtype.name) from None
    return out


def add_tensor_nd(b: NDArray, y: NDArray, alpha: float = 1.0, beta: float = 1.0) -> NDArray:
    """y = alpha b + beta y in place (cudnnAddTensor), b broadcast to y (same rank, dims equal or 1)."""
    dtype = check_gpu_arrays("add_tensor_nd", DNN_FLOATS, b=b, y=y)
    alpha, beta = real_scalar("add_tensor_nd", "alpha", alpha), real_scalar("add_tensor_nd", "beta", beta)
    _broadcast_check("add_tensor_nd", b.shape, y.shape, ("b", "y"))
    if y.size == 0:
        return y
    y_dims, b_dims = canonical_broadcast(y.shape, b.shape)
    check_dims_fit("add_tensor_nd", y_dims, OP_TENSOR_MAX_DIMS, f"y {y.shape} with b {b.shape}")
    try:
        L.cudnnAddTensor(dnn(y), D.scalar_ptr(alpha, dtype), tensor_nd(b_dims, dtype), b.ptr,
                         D.scalar_ptr(beta, dtype), tensor_nd(y_dims, dtype), y.ptr)
    except CudnnError as exc:
        raise with_context(exc, op="add_tensor_nd", b=b.shape, y=y.shape, dtype=dtype.name) from None
    return y


def reduce_tensor(op: str, x: NDArray, axes=None, out: NDArray | None = None, indices: bool = False,
                  alpha: float = 1.0, beta: float = 0.0):
    """out = alpha reduce_op(x over axes) + beta out (cudnnReduceTensor); axes None means all.

    out has x's shape with the reduced axes set to 1 (a given out may also drop them). ``indices=True``
    (min/max) also returns the int32 indices of the extremes, flattened over the reduced axes in row-major
    order, shaped like out. Returns out, or (out, indices)."""
    if op not in REDUCE_OPS:
        raise DnnbindValueError(f"reduce_tensor: op must be one of {tuple(REDUCE_OPS)}, got {op!r}")
    dtype = check_gpu_arrays("reduce_tensor", DNN_FLOATS, x=x, out=out)
    if not isinstance(indices, (bool, np.bool_)):
        raise DnnbindTypeError(f"reduce_tensor: indices must be a bool, got {indices!r}")
    if indices and op not in INDEX_OPS:
        raise DnnbindValueError(f"reduce_tensor: indices=True needs op 'min' or 'max' (cuDNN's rule), got {op!r}")
    alpha, beta = real_scalar("reduce_tensor", "alpha", alpha), real_scalar("reduce_tensor", "beta", beta)
    axes = _normalize_axes("reduce_tensor", axes, x.ndim)
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    dropped = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    out = out_or_empty("reduce_tensor", out, keep, dtype, x.device, beta, also=dropped)
    idx = empty(out.shape, np.int32, x.device) if indices and x.size == 0 else None
    if x.size == 0:
        return _reduce_empty(op, x, axes, out, alpha, beta, idx)
    a_dims, c_dims = canonical_reduce(x.shape, axes)
    check_dims_fit("reduce_tensor", a_dims, REDUCE_MAX_DIMS, f"x {x.shape} over axes {axes}")
    if a_dims == c_dims:  # nothing to reduce (axes of size 1): cuDNN refuses equal shapes ("!dims_differ")
        return _reduce_nothing(op, x, out, a_dims, alpha, beta, indices)
    ad, cd, rd = tensor_nd(a_dims, dtype), tensor_nd(c_dims, dtype), reduce_tensor_desc(op, dtype, indices)
    h = dnn(x)
    try:
        ws_size, idx_size = cached(("rs", op, dtype, indices, a_dims, c_dims, x.device),
                                   lambda: _reduce_sizes(h, rd, ad, cd, indices))
        idx_ptr = idx_bytes = 0
        if indices:
            # NOTE: sized as cuDNN asks, at least one uint32 per output; the int32 view is out-shaped.
            buf = DeviceBuffer(max(idx_size, 4 * out.size), x.device)
            idx = NDArray._from_ptr(buf.ptr, out.shape, np.int32, x.device, buf)
            idx_ptr, idx_bytes = buf.ptr, buf.nbytes
        ws, ws_bytes = workspace(x.device, ws_size)
        L.cudnnReduceTensor(h, rd, idx_ptr, idx_bytes, ws, ws_bytes, D.scalar_ptr(alpha, dtype), ad, x.ptr,
                            D.scalar_ptr(beta, dtype), cd, out.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=f"reduce_tensor({op})", x=x.shape, axes=axes, dtype=dtype.name) from None
    return (out, idx) if indices else out


def _reduce_sizes(h, rd, ad, cd, indices: bool) -> tuple[int, int]:
    """(workspace bytes, indices bytes) cuDNN wants; cached per shape and device by the caller."""
    ws, idx = ctypes.c_size_t(), ctypes.c_size_t()
    L.cudnnGetReductionWorkspaceSize(h, rd, ad, cd, ctypes.byref(ws))
    if indices:
        L.cudnnGetReductionIndicesSize(h, rd, ad, cd, ctypes.byref(idx))
    return ws.value, idx.value


def _reduce_nothing(op, x, out, dims, alpha, beta, indices):
    """Each output element reduces one input element: out = alpha f(x) + beta out, f = |.| for amax and the
    norms (max(alpha x, -alpha x), min for alpha < 0), identity otherwise; indices are all 0."""
    dtype, d = x.dtype, tensor_nd(dims, x.dtype)
    try:
        if op in ("amax", "norm1", "norm2"):
            L.cudnnOpTensor(dnn(x), op_tensor_desc("max" if alpha >= 0 else "min", dtype), D.scalar_ptr(alpha, dtype),
                            d, x.ptr, D.scalar_ptr(-alpha, dtype), d, x.ptr, D.scalar_ptr(beta, dtype), d, out.ptr)
        else:
            L.cudnnAddTensor(dnn(x), D.scalar_ptr(alpha, dtype), d, x.ptr, D.scalar_ptr(beta, dtype), d, out.ptr)
    except CudnnError as exc:
        raise with_context(exc, op=f"reduce_tensor({op})", x=x.shape, dtype=dtype.name) from None
    return (out, empty(out.shape, np.int32, x.device).zero_()) if indices else out


def _reduce_empty(op, x, axes, out, alpha, beta, idx):
    """x has no elements: out holds the reduction's identity (0 for sums and norms, 1 for prod, NaN mean)."""
    if out.size == 0:
        return (out, idx) if idx is not None else out
    ident = _EMPTY_IDENTITY.get(op)
    if ident is None:
        raise DnnbindValueError(f"reduce_tensor: {op} over an empty reduction (x {x.shape}, axes {axes}) has no "
                         "identity")
    if beta == 0:
        set_tensor(out, alpha * ident)
    elif ident == 0:
        scale_tensor(out, beta)
    else:
        raise NotImplementedError(f"reduce_tensor: {op} of an empty x {x.shape} with beta={beta}")
    return out


def transform_tensor(x: NDArray, out: NDArray, x_strides, alpha: float = 1.0, beta: float = 0.0,
                     x_offset: int = 0) -> NDArray:
    """out = alpha (x's memory read with element ``x_strides`` from element ``x_offset``, in out's shape)
    + beta out, out contiguous (cudnnTransformTensor). transpose(x, axes) is this with x's strides permuted;
    a flip is a negative stride with the offset at the last element. x and out must not overlap."""
    dtype = check_gpu_arrays("transform_tensor", DNN_FLOATS, x=x, out=out)
    alpha, beta = real_scalar("transform_tensor", "alpha", alpha), real_scalar("transform_tensor", "beta", beta)
    shape = out.shape
    try:
        strides, x_offset = tuple(operator.index(s) for s in x_strides), operator.index(x_offset)
    except TypeError:
        raise DnnbindTypeError(f"transform_tensor: x_strides must be a sequence of ints and x_offset an int, got "
                        f"{x_strides!r}, {x_offset!r}") from None
    if len(strides) != len(shape):
        raise DnnbindValueError(f"transform_tensor: x_strides {strides} do not match out {shape}")
    if out.size == 0:
        return out
    if x.ptr == out.ptr:
        raise DnnbindValueError(f"transform_tensor: x {x.shape} and out {shape} share memory; cuDNN cannot transform "
                         "in place")
    if any(s == 0 and d > 1 for d, s in zip(shape, strides)):
        raise NotImplementedError(f"transform_tensor: cuDNN reads no zero strides on dims > 1 (broadcast): out "
                                  f"{shape}, strides {strides}")
    lo = x_offset + sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    hi = x_offset + sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    if lo < 0 or hi >= x.size:
        raise DnnbindValueError(f"transform_tensor: reading out {shape} with strides {strides} from offset {x_offset} "
                         f"reaches elements {lo}..{hi}, outside x {x.shape}")
    dims, st = canonical_strided(shape, strides)
    check_dims_fit("transform_tensor", dims, MAX_DIMS, f"out {shape} read with strides {strides}")
    src = x.ptr + x_offset * x.dtype.itemsize
    if st == contiguous_strides(dims) and alpha == 1 and beta == 0:  # the same order: a plain copy
        memcpy(out.ptr, src, out.nbytes, D2D, current_stream(out.device))
        return out
    try:
        if len(dims) == 2 and st == (1, dims[0]) and dtype in BLAS_FLOATS and beta == 0:
            # NOTE: a 2-d swap (also (A, B, C) -> (C, A, B)): out = X^T for X, the row-major (S, R) matrix at
            # src. cublas geam does it for half the host time of TransformTensor (20 vs 47 us, H100).
            r, s = dims
            getattr(C, CUBLAS_GEAM[dtype])(blas(x), cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_T, s, r,
                                           D.scalar_ptr(alpha, dtype), src, r, D.scalar_ptr(0.0, dtype), src, r,
                                           out.ptr, s)
            return out
        L.cudnnTransformTensor(dnn(x), D.scalar_ptr(alpha, dtype), tensor_nd(dims, dtype, st), src,
                               D.scalar_ptr(beta, dtype), tensor_nd(dims, dtype), out.ptr)
    except (CudnnError, CublasError) as exc:
        raise with_context(exc, op="transform_tensor", x=x.shape, out=shape, x_strides=strides) from None
    return out


def transpose(x: NDArray, axes=None, out: NDArray | None = None) -> NDArray:
    """x with its axes permuted (default: reversed), copied contiguous through cudnnTransformTensor."""
    check_gpu_arrays("transpose", DNN_FLOATS, x=x, out=out)
    n = x.ndim
    try:
        given = tuple(range(n))[::-1] if axes is None else tuple(operator.index(a) for a in axes)
    except TypeError:
        raise DnnbindTypeError(f"transpose: axes must be a sequence of ints or None, got {axes!r}") from None
    axes = tuple(a + n if -n <= a < 0 else a for a in given)
    if sorted(axes) != list(range(n)):
        raise DnnbindValueError(f"transpose: axes {given} are not a permutation of the {n} axes of x {x.shape}")
    shape = tuple(x.shape[a] for a in axes)
    out = out_or_empty("transpose", out, shape, x.dtype, x.device, 0.0)
    src = contiguous_strides(x.shape)
    return transform_tensor(x, out, tuple(src[a] for a in axes))


def scale_tensor(x: NDArray, alpha: float) -> NDArray:
    """x *= alpha in place (cudnnScaleTensor)."""
    dtype = check_gpu_arrays("scale_tensor", DNN_FLOATS, x=x)
    alpha = real_scalar("scale_tensor", "alpha", alpha)
    if x.size:
        try:
            L.cudnnScaleTensor(dnn(x), tensor_nd((x.size,), dtype), x.ptr, D.scalar_ptr(alpha, dtype))
        except CudnnError as exc:
            raise with_context(exc, op="scale_tensor", x=x.shape, dtype=dtype.name) from None
    return x


_FILL: dict = {}  # fill values, kept alive for recorded steps that replay the call


def _fill_ptr(value: float, dtype) -> int:
    # NOTE: the header says valuePtr has the data type, but cuDNN 9.19 reads a float for half data (a half's
    # 16 bits came out as 0 on an H100): like alpha/beta, float for float32/float16 and double for float64.
    key = (math.nan if math.isnan(value) else value, dtype == F64)  # one NaN entry, however it was made
    holder = _FILL.get(key)
    if holder is None:
        holder = _FILL.setdefault(key, (ctypes.c_double if key[1] else ctypes.c_float)(value))
    return ctypes.addressof(holder)


def set_tensor(x: NDArray, value: float) -> NDArray:
    """x[...] = value in place (cudnnSetTensor); NaN and infinities are fine."""
    dtype = check_gpu_arrays("set_tensor", DNN_FLOATS, x=x)
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"set_tensor: value must be a real number, got {value!r}")
    if x.size:
        try:
            L.cudnnSetTensor(dnn(x), tensor_nd((x.size,), dtype), x.ptr, _fill_ptr(float(value), dtype))
        except CudnnError as exc:
            raise with_context(exc, op="set_tensor", x=x.shape, dtype=dtype.name) from None
    return x


# The cuBLAS calls (geam, gemm_strided_batched, matmul2d, dot, nrm2) are in ops/blas_tensor.py.
