"""Layer 2 (ops): how shapes meet cuDNN's N-d tensor API: cached, bounded N-d tensor / OpTensor / ReduceTensor
descriptors, and the canonical shapes (size-1 dims dropped, neighbouring dims that behave alike merged) that keep
ranks under cuDNN's limits. Imports _lib, runtime and ops.descriptors; split from ops/tensor_ops.py (the calls).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import math
import operator
import threading

import numpy as np

from .._lib import cudnn
from ..runtime.array import contiguous_strides
from . import descriptors as D

L = cudnn.lib
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
INT_MAX = 2**31 - 1  # cuDNN dims/strides are int and a descriptor holds < 2**31 elements (9.28: NOT_SUPPORTED)
MIN_DIMS, MAX_DIMS = 4, cudnn.CUDNN_DIM_MAX
OP_TENSOR_OPS = {"add": cudnn.CUDNN_OP_TENSOR_ADD, "mul": cudnn.CUDNN_OP_TENSOR_MUL,
                 "min": cudnn.CUDNN_OP_TENSOR_MIN, "max": cudnn.CUDNN_OP_TENSOR_MAX,
                 "sqrt": cudnn.CUDNN_OP_TENSOR_SQRT, "not": cudnn.CUDNN_OP_TENSOR_NOT}
REDUCE_OPS = {"sum": cudnn.CUDNN_REDUCE_TENSOR_ADD, "prod": cudnn.CUDNN_REDUCE_TENSOR_MUL,
              "min": cudnn.CUDNN_REDUCE_TENSOR_MIN, "max": cudnn.CUDNN_REDUCE_TENSOR_MAX,
              "amax": cudnn.CUDNN_REDUCE_TENSOR_AMAX, "mean": cudnn.CUDNN_REDUCE_TENSOR_AVG,
              "norm1": cudnn.CUDNN_REDUCE_TENSOR_NORM1, "norm2": cudnn.CUDNN_REDUCE_TENSOR_NORM2}


# -- descriptors -----------------------------------------------------------------------------------------------
class TensorNdDesc(D.OwnedDescriptor):
    """cudnnSetTensorNdDescriptor with 4..8 dims; ``dims``/``strides`` are what cuDNN was given."""
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"
    __slots__ = ("dims", "strides")

    def __init__(self, dims: tuple, strides: tuple, dtype):
        super().__init__()
        n = len(dims)
        L.cudnnSetTensorNdDescriptor(self, D.cudnn_dtype("tensor_nd", dtype), n, (ctypes.c_int * n)(*dims),
                                     (ctypes.c_int * n)(*strides))
        self.dims, self.strides = dims, strides


class OpTensorDesc(D.OwnedDescriptor):
    _create, _destroy = "cudnnCreateOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor"
    __slots__ = ()

    def __init__(self, op: str, dtype):
        super().__init__()
        # NOTE: compute type FLOAT for float32 and float16 data (cuDNN's table), DOUBLE only for double.
        L.cudnnSetOpTensorDescriptor(self, OP_TENSOR_OPS[op], _compute(dtype), cudnn.CUDNN_PROPAGATE_NAN)


class ReduceDesc(D.OwnedDescriptor):
    _create, _destroy = "cudnnCreateReduceTensorDescriptor", "cudnnDestroyReduceTensorDescriptor"
    __slots__ = ()

    def __init__(self, op: str, dtype, indices: bool):
        super().__init__()
        flag = cudnn.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES if indices else cudnn.CUDNN_REDUCE_TENSOR_NO_INDICES
        L.cudnnSetReduceTensorDescriptor(self, REDUCE_OPS[op], _compute(dtype), cudnn.CUDNN_PROPAGATE_NAN, flag,
                                         cudnn.CUDNN_32BIT_INDICES)


def _compute(dtype) -> int:
    return cudnn.CUDNN_DATA_DOUBLE if dtype == F64 else cudnn.CUDNN_DATA_FLOAT


CACHE_CAP = 4096  # descriptors kept; a run touches a few hundred keys
_descs: dict = {}
_lock = threading.Lock()


def cached(key, make):
    """The value cached under ``key`` (descriptors, and tensor_ops' workspace sizes), made by ``make()`` on a miss.
    Lock-free lookup; creation and insertion under a lock. Over the cap the oldest quarter is dropped
    (dicts keep insertion order). A dropped descriptor is destroyed only when nothing uses it any more: calls
    and recorded steps hold the Python object itself (weakref.finalize in descriptors.OwnedDescriptor)."""
    d = _descs.get(key)
    if d is None:
        with _lock:
            d = _descs.get(key)
            if d is None:
                d = make()
                if len(_descs) >= CACHE_CAP:
                    for old in list(_descs)[:CACHE_CAP // 4]:
                        _descs.pop(old, None)
                _descs[key] = d
    return d


def tensor_nd(shape, dtype, strides=None) -> TensorNdDesc:
    """The cuDNN descriptor of an array of ``shape`` (rank 0..8) read with element ``strides`` (default
    C-contiguous); ranks under 4 are padded with trailing 1s. Cached by key, thread-safe, bounded."""
    try:
        d = _descs.get(("t", shape, dtype, strides))  # hot path: internal callers pass normalized keys
    except TypeError:  # a list shape: normalize below
        d = None
    if d is not None:
        return d
    shape, strides, dtype = _layout("tensor_nd", shape, strides, dtype)
    pad = max(MIN_DIMS - len(shape), 0)
    dims, padded = shape + (1,) * pad, strides + (1,) * pad
    key = ("t", shape, dtype, None if strides == _contiguous(shape) else strides)
    return cached(key, lambda: TensorNdDesc(dims, padded, dtype))


def _layout(op: str, shape, strides, dtype):
    try:
        shape = tuple(operator.index(s) for s in shape)
        strides = None if strides is None else tuple(operator.index(s) for s in strides)
    except TypeError:
        raise DnnbindTypeError(f"{op}: shape and strides must be sequences of ints, got shape {shape!r}, "
                        f"strides {strides!r}") from None
    if len(shape) > MAX_DIMS:
        raise DnnbindValueError(f"{op}: shape {shape} has {len(shape)} dims; cuDNN descriptors take at most {MAX_DIMS}")
    if any(d < 1 for d in shape):
        raise DnnbindValueError(f"{op}: shape {shape} has an empty or negative dim; cuDNN takes dims >= 1 (skip the "
                         "call for empty arrays)")
    if strides is None:
        strides = _contiguous(shape)
    elif len(strides) != len(shape):
        raise DnnbindValueError(f"{op}: strides {strides} do not match shape {shape}")
    elif any(s == 0 and d > 1 for d, s in zip(shape, strides)):
        raise DnnbindValueError(f"{op}: strides {strides} for shape {shape}: cuDNN takes a zero stride only on a dim "
                         "of 1 (no broadcast reads)")
    if math.prod(shape) > INT_MAX or stride_span(shape, strides) > INT_MAX:
        raise DnnbindValueError(f"{op}: shape {shape} strides {strides} reach past 2**31 - 1 elements, cuDNN's limit")
    D.cudnn_dtype(op, dtype)  # raises TypeError naming the op
    return shape, strides, np.dtype(dtype)


def stride_span(shape: tuple, strides: tuple) -> int:
    """The distance, in elements, between the lowest and the highest element that ``shape`` read with ``strides``
    reaches."""
    return sum((d - 1) * abs(s) for d, s in zip(shape, strides))


_contiguous = contiguous_strides


def op_tensor_desc(op: str, dtype) -> OpTensorDesc:
    """The cached OpTensor descriptor of ``op`` (a key of OP_TENSOR_OPS) for ``dtype`` data."""
    return cached(("o", op, dtype), lambda: OpTensorDesc(op, dtype))


def reduce_tensor_desc(op: str, dtype, indices: bool) -> ReduceDesc:
    """The cached ReduceTensor descriptor of ``op`` (a key of REDUCE_OPS), with or without indices."""
    return cached(("r", op, dtype, indices), lambda: ReduceDesc(op, dtype, indices))


# -- canonical shapes (see the module NOTE) --------------------------------------------------------------------
def _merge(shape: tuple, kinds) -> list:
    """[(size, kind)]: size-1 dims dropped, neighbours of the same kind multiplied together."""
    out = []
    for d, k in zip(shape, kinds):
        if d == 1:
            continue
        if out and out[-1][1] == k:
            out[-1] = (out[-1][0] * d, k)
        else:
            out.append((d, k))
    return out


def canonical_broadcast(shape: tuple, b_shape: tuple) -> tuple[tuple, tuple]:
    """(a's dims, b's dims) for an a of ``shape`` with b of ``b_shape`` broadcast to it, in canonical form."""
    merged = _merge(shape, [db != 1 for db in b_shape])
    return tuple(d for d, _ in merged), tuple(d if full else 1 for d, full in merged)


def canonical_reduce(shape: tuple, axes: tuple) -> tuple[tuple, tuple]:
    """(input dims, output dims) of a reduction of ``shape`` over the sorted ``axes``, in canonical form."""
    merged = _merge(shape, [i in axes for i in range(len(shape))])
    return tuple(d for d, _ in merged), tuple(1 if red else d for d, red in merged)


def canonical_strided(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:
    """(dims, strides) reading the same elements in the same order as ``shape`` with ``strides``, in canonical
    form."""
    dims, st = [], []
    for d, s in zip(shape, strides):
        if d == 1:
            continue
        if dims and st[-1] == s * d:  # the outer dim steps exactly over this one: one longer dim
            dims[-1] *= d
            st[-1] = s
        else:
            dims.append(d)
            st.append(s)
    return tuple(dims), tuple(st)


def descriptor_rank(dims: tuple) -> int:
    """The rank cuDNN is given for ``dims`` (short ones are padded to MIN_DIMS)."""
    return max(len(dims), MIN_DIMS)


def check_dims_fit(op: str, dims: tuple, limit: int, what: str) -> None:
    """NotImplementedError (the table's cue to use its NVRTC kernel) when cuDNN cannot take these dims."""
    if descriptor_rank(dims) > limit or math.prod(dims) > INT_MAX:
        raise NotImplementedError(f"{op}: {what} needs {len(dims)} dims after merging (cuDNN takes at most "
                                  f"{limit}) or more than 2**31 - 1 elements")
