"""Layer nd: GPU lowerings shared by the table's entries. Imports runtime, ops.tensor_ops and kernels.strided.

Map ops become one generated NVRTC kernel (kernels.strided.strided_map) over strided views: a broadcast input
is read with stride 0, so no operand is ever materialized at the output's shape. Reductions go to
cudnnReduceTensor when cuDNN takes the dtype/rank/axes, else to a generated reduction kernel. Copies through
strides (slices on any axis, transposes, broadcast_to, writes into a slice) are the same map kernel with the
identity expression.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..runtime.array import NDArray, contiguous_strides, empty
from ..runtime.exec_context import exec_context
from ..runtime.stream import current_stream

_strided = None


def strided():
    global _strided
    if _strided is None:
        from ..kernels import strided as mod
        _strided = mod
    return _strided


def broadcast_strides(shape: tuple, out_shape: tuple) -> tuple:
    """Element strides reading an array of ``shape`` (contiguous) at ``out_shape``: 0 on broadcast axes."""
    own = contiguous_strides(shape)
    lead = len(out_shape) - len(shape)
    return tuple(0 if i < lead or shape[i - lead] == 1 and out_shape[i] != 1 else own[i - lead]
                 for i in range(len(out_shape)))


def ref(x: NDArray, strides=None, offset: int = 0):
    return strided().Ref(x.ptr, x.dtype, contiguous_strides(x.shape) if strides is None else tuple(strides),
                         offset)


_OPERANDS = ("a", "b", "c", "d", "e")


def scalar_expr(op, args) -> tuple[str, tuple]:
    """The op's C expression with scalar operands renamed to kernel arguments; cached per scalar pattern."""
    mask = tuple(not isinstance(a, NDArray) for a in args)
    expr = op.scalar_exprs.get(mask)
    if expr is None:
        expr = op.expr
        arrays_seen = 0
        renames = {}
        for n, is_s in zip(_OPERANDS, mask):
            if is_s:
                renames[n] = "s_" + n
            else:
                renames[n] = _OPERANDS[arrays_seen]
                arrays_seen += 1
        expr = re.sub(r"\b([a-e])\b", lambda m: renames.get(m.group(1), m.group(1)), expr)
        op.scalar_exprs[mask] = expr
    return expr, mask


def map_kernel(op, args, params, shape, out_dtype, dev) -> NDArray:
    ctx = exec_context(dev)  # the device made current once: the allocation and the launch below skip it
    out = ctx.empty(shape if type(shape) is tuple else tuple(shape), out_dtype)
    st = strided()
    strides, n = st.CONTIGUOUS_LAYOUTS.get(shape) or st.contiguous_layout(shape)
    if n == 0:
        return out
    expr, mask = scalar_expr(op, args)
    Ref = st.Ref
    refs, scalars = [], []
    for a, name, is_scalar in zip(args, "abcde", mask):
        if is_scalar:
            scalars.append(("s_" + name, _scalar_value(a, out_dtype if out_dtype.kind == "f" else None)))
        else:  # an NDArray is contiguous at its own shape; a broadcast one is read with stride 0
            refs.append(Ref(a.ptr, a.dtype, strides if a.shape == shape else broadcast_strides(a.shape, shape)))
    if params:
        scalars.extend(params.items())
    # the stream as a handle with its device, already current: strided_map resolves neither
    st.strided_map(expr, Ref(out.ptr, out_dtype, strides), refs, shape, scalars, stream=ctx.stream_handle,
                   device=dev.index, current=True)
    return out


def _scalar_value(v, float_dtype):
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if float_dtype is not None:
        return float(v)
    return int(v) if float(v) == int(v) else float(v)


def copy_strided(src: NDArray, strides, offset, shape, out: NDArray | None = None, out_strides=None,
                 out_offset: int = 0, dtype=None) -> NDArray:
    """out[I] = src[offset + I . strides] for every index I of ``shape`` (a gather through strides)."""
    if out is None:
        out = empty(shape, dtype or src.dtype, src.device)
    if math.prod(shape) == 0:
        return out
    st = strided()
    st.strided_map("a", st.Ref(out.ptr, out.dtype, out_strides or contiguous_strides(shape), out_offset),
                   [st.Ref(src.ptr, src.dtype, tuple(strides), offset)], tuple(shape),
                   stream=current_stream(src.device), device=src.device.index)
    return out


def fill_strided(out: NDArray, value, strides, offset, shape) -> None:
    """out[offset + I . strides] = value (a Python scalar) for every index I of ``shape``."""
    if math.prod(shape) == 0:
        return
    st = strided()
    v = float(value) if out.dtype.kind == "f" else int(value)
    st.strided_map("s_v", st.Ref(out.ptr, out.dtype, tuple(strides), offset), [], tuple(shape), [("s_v", v)],
                   stream=current_stream(out.device), device=out.device.index)


# -- reductions -------------------------------------------------------------------------------------------------

_CUDNN_REDUCE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "mean": "mean"}
_FLOAT_LIB = (np.dtype(np.float32), np.dtype(np.float64))


def reduce_kernel(op, x: NDArray, axes, out_shape, out_dtype, params) -> NDArray:
    kind = op.reduce
    n_out = math.prod(out_shape)
    if x.size == 0 or not axes:
        return _reduce_trivial(op, x, axes, out_shape, out_dtype)
    lib_op = _CUDNN_REDUCE.get(kind) if op.map_expr == "a" and op.post_expr == "acc" else None
    if kind == "mean":
        lib_op = "mean"
    if USE_CUDNN_REDUCE and lib_op is not None and x.dtype in _FLOAT_LIB and out_dtype == x.dtype \
            and x.ndim <= 8:
        from ..ops import tensor_ops
        if tensor_ops.can_reduce(lib_op, x.shape, axes, x.dtype):
            y = tensor_ops.reduce_tensor(lib_op, x, axes)
            return NDArray._from_ptr(y.ptr, out_shape, y.dtype, y.device, y._owner)
    st = strided()
    out = empty(out_shape, out_dtype, x.device)
    scalars = []
    post = op.post_expr
    red = kind
    if kind == "mean":
        red, post = "sum", "acc * inv_n"
        scalars.append(("inv_n", 1.0 / math.prod(x.shape[a] for a in axes)))
    st.strided_reduce(red, ref(x), x.shape, tuple(axes), st.Ref(out.ptr, out_dtype, contiguous_strides(out_shape)),
                      map_expr=op.map_expr, post_expr=post, scalars=scalars, stream=current_stream(x.device),
                      device=x.device.index)
    del n_out
    return out


def _reduce_trivial(op, x, axes, out_shape, out_dtype):
    """Reductions over nothing (no axes: the identity, or a size-0 input: the op's identity value)."""
    if not axes and x.size:
        y = copy_strided(x, contiguous_strides(x.shape), 0, x.shape, dtype=out_dtype) if op.map_expr == "a" \
            and op.post_expr == "acc" and op.reduce in ("sum", "prod", "max", "min", "mean") else None
        if y is not None:
            return NDArray._from_ptr(y.ptr, out_shape, y.dtype, y.device, y._owner)
    # Fall back to the numpy twin on the host for these degenerate shapes (no work on the GPU to speak of).
    host = x.numpy()
    r = np.asarray(op.numpy(host, tuple(axes))).reshape(out_shape).astype(out_dtype)
    from ..runtime.array import array
    return array(r, device=x.device)


# -- cudnnOpTensor for the binary ops cuDNN has (add, mul, min, max) ---------------------------------------------

# NOTE: cudnnOpTensor needs A at the output's shape and only B broadcast (dims equal or 1, same rank). The ops
# below are commutative, so a broadcast A is swapped into B's place. float16 stays on the generated kernel
# (OpTensor's half path computes in float but rounds B's scaling differently from numpy).
# Which library the table prefers where both a cuDNN call and a generated kernel can do an op: "nvrtc" (the
# default) or "cudnn" (cudnnOpTensor / cudnnActivation / cudnnReduceTensor), set by $DNNBIND_ND_LIBRARY or these
# two flags. Measured on an H100 (scripts/bench_nd.py, docs/benchmarks.md) the generated kernels cost less per
# call at training-step sizes: OpTensor and the activation calls spend more host time per call than the whole
# generated launch, and cudnnReduceTensor's row sum of 64x3136 took 155 us against 43 us. Both stay tested.
USE_CUDNN_OPTENSOR = os.environ.get("DNNBIND_ND_LIBRARY", "nvrtc") == "cudnn"
USE_CUDNN_REDUCE = USE_CUDNN_OPTENSOR
_OPTENSOR_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def optensor(cudnn_op: str):
    def lower(args, params, shape, out_dtype, dev):
        if not USE_CUDNN_OPTENSOR or len(args) != 2:
            return None
        a, b = args
        if not (isinstance(a, NDArray) and isinstance(b, NDArray)) or a.dtype not in _OPTENSOR_DTYPES:
            return None
        if a.shape != shape:
            a, b = b, a
        if a.shape != shape or a.size == 0:
            return None
        bshape = (1,) * (len(shape) - b.ndim) + b.shape
        from ..ops import tensor_ops
        if not tensor_ops.can_op_tensor(cudnn_op, shape, bshape, a.dtype):
            return None
        bv = b if bshape == b.shape else NDArray._from_ptr(b.ptr, bshape, b.dtype, b.device, b._owner)
        return tensor_ops.op_tensor(cudnn_op, a, bv)
    lower.__name__ = f"cudnnOpTensor_{cudnn_op}"
    return lower


# -- cudnnActivationForward/Backward for relu, sigmoid, tanh --------------------------------------------------

def activation(mode: str):
    """relu/sigmoid/tanh on cuDNN (float32/64; any rank: cuDNN sees the array as one N-d tensor)."""
    def lower(args, params, shape, out_dtype, dev):
        x = args[0]
        if not USE_CUDNN_OPTENSOR or not isinstance(x, NDArray) or x.dtype not in _OPTENSOR_DTYPES or x.size == 0:
            return None
        from ..ops import activation_forward
        return activation_forward(x, mode)
    lower.__name__ = f"cudnnActivationForward_{mode}"
    return lower


def relu_backward(args, params, shape, out_dtype, dev):
    """dx = dy where y > 0 (cudnnActivationBackward with y standing in for x: relu'(x) is y > 0)."""
    g, y = args
    if not USE_CUDNN_OPTENSOR or not (isinstance(g, NDArray) and isinstance(y, NDArray)) or g.shape != y.shape \
            or g.dtype not in _OPTENSOR_DTYPES or g.size == 0:
        return None
    from ..ops import activation_backward
    return activation_backward(y, g, y, "relu")
