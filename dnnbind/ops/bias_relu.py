"""Layer 2 (ops): the bias + ReLU part of a fused convolution's backward, and per-channel sums, as NVRTC kernels
(ops._nn_kernels). Imports runtime and ops.

``bias_relu_backward(y, dy)`` -> (dz, db): dz = dy where y > 0, else 0, and db[c] = the sum of dz over n, h, w,
read and written in one pass (cuDNN's route was cudnnActivationBackward, then two gemv over dz). float32 and
float16 (float16 data, float32 sums, db rounded to float16); float64 and arrays of 2**31 elements or more take
that library route instead. Deterministic: per-block partial sums in a scratch buffer from the stream-ordered pool,
added in a fixed order by a second small kernel (ops._nn_kernels explains the grid).

``conv_backward_bias_kernel(dy)`` is the same kernel with the mask off: conv_backward_bias's result.
NOTE: nd.Convolution's unfused bias gradient keeps conv_backward_bias_gemv: both read dy once, and nobody has yet
timed the kernel against cuBLAS's gemv at ResNet sizes (256x64x48x48) on a GPU.

``bias_relu_wgrad(x, y, dy, w_shape)`` -> (dw, db): for a filter of at most 32 taps C*R*S (a first layer), the
weight and bias gradients in one kernel pass over x, y and dy (ops._wgrad_kernels), dz kept in registers. On
SimpleCNN's conv1 it replaces bias_relu_backward and cuDNN's backward-filter (~24 us there: its algorithms are
built for many input channels). float32 and float16; groups 1; no dx (for a network's input, which needs none).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from ..runtime.array import NDArray, empty
from ..runtime.stream import current_stream
from . import _check, reference
from . import _nn_kernels as K
from . import _wgrad_kernels as KW
from ._common import exact_ints, float_dtype, out_like, result_array
from ._dispatch import op
from .conv import conv_backward_bias_gemv
from .pointwise import activation_backward
from .reference.conv import bias_relu_wgrad_params

OP = "bias_relu_backward"


def _kernel_ok(dy) -> bool:
    """The kernels take float32/float16 and index with 32-bit integers."""
    return dy.dtype in K.DTYPES and dy.size < K.INT_LIMIT


def _channel_sums(y, dy, dz, db, layout: str) -> None:
    """db[c] = the sum over n, h, w of (y > 0 ? dy : 0), also written to dz; with y None, the sum of dy."""
    dtype, relu = dy.dtype, y is not None
    ptrs = (dy.ptr, y.ptr, dz.ptr) if relu else (dy.ptr,)
    if layout == "NCHW":
        n, c, h, w = dy.shape
        v = K.pack_width(dtype, h * w, ptrs)
        grid, block, hwv, chunk, s = K.nchw_geometry(n, c, h * w, v)
        sizes = (c, hwv, n * hwv, chunk)
    else:
        n, h, w, c = dy.shape
        v = K.pack_width(dtype, c, ptrs)
        grid, block, chunk, s = K.nhwc_geometry(n * h * w, c, v)
        sizes = (c, n * h * w, chunk)
    stream = current_stream(dy.device)
    # One slice per channel: the block writes db itself. Else the slots come from the pool for this call (a
    # recording holds them; the final kernel is queued before their stream-ordered free).
    part = empty((c * s,), np.float32, dy.device) if s > 1 else None
    K.kernel(K.chan_name(layout, dtype, v, relu)).launch(grid, block, (y, dy, dz, part, db, *sizes), stream=stream)
    if part is not None:
        K.kernel(K.final_name(dtype)).launch(K.final_grid(c), K.BLOCK, (part, db, c, s), stream=stream)


@op(reference.bias_relu_backward, "y", "dy")
def bias_relu_backward(y, dy, layout="NCHW", out=None):
    """(dz, db) of y = relu(z + b): one kernel pass over y and dy (db into ``out`` if given, GPU only)."""
    dtype = float_dtype(OP, y=y, dy=dy)
    c = _check.conv_bias_params(OP, dy.shape, layout)
    _check.check_same_shape(OP, y=y, dy=dy)
    db = result_array(out, (c,), dtype, dy.device, OP)
    if not _kernel_ok(dy):
        dz = activation_backward(y, dy, y, "relu")
        return dz, conv_backward_bias_gemv(dz, out=db, layout=layout)
    dz = out_like(dy.shape, dtype, dy.device)
    _channel_sums(y, dy, dz, db, layout)
    return dz, db


def conv_backward_bias_kernel(dy, out=None, layout="NCHW"):
    """conv_backward_bias's db on GPU NDArrays, by the channel-sum kernel (into ``out`` if given)."""
    float_dtype("conv_backward_bias", _check.FLOAT_DTYPES, dy=dy)
    k = _check.conv_bias_params("conv_backward_bias", dy.shape, layout)
    if not _kernel_ok(dy):
        return conv_backward_bias_gemv(dy, out=out, layout=layout)
    db = result_array(out, (k,), dy.dtype, dy.device, "conv_backward_bias")
    _channel_sums(None, dy, None, db, layout)
    return db


# -- dw and db of a fused conv + bias + ReLU with a small filter ------------------------------------------------

OPW = "bias_relu_wgrad"
_wgrad_plans: dict = {}  # exact-int arguments -> checked plan (as ops.conv caches its _Plan); at most PLAN_LIMIT
PLAN_LIMIT = 256


def wgrad_fits(x, y, w_shape, layout: str = "NCHW") -> bool:
    """Whether bias_relu_wgrad takes a convolution's (already valid) arrays: float32/float16, at most KW.MAX_TAPS
    filter taps C*R*S, fewer than 2**31 elements in x and y (the kernels index with 32-bit integers)."""
    _, c, r, s = _check.to_nchw(w_shape, layout)
    return x.dtype in K.DTYPES and c * r * s <= KW.MAX_TAPS and x.size < K.INT_LIMIT and y.size < K.INT_LIMIT


def _wgrad_plan(x_shape, w_shape, y_shape, dy_shape, stride, padding, dilation, layout):
    """(w_shape, taps, launch geometry, final grid), the arguments checked once per exact-int argument set."""
    raw = None
    if exact_ints(stride) and exact_ints(padding) and exact_ints(dilation) and type(w_shape) is tuple and \
            all(type(d) is int for d in w_shape) and type(layout) is str:
        raw = (x_shape, w_shape, y_shape, dy_shape, stride, padding, dilation, layout)
        plan = _wgrad_plans.get(raw)
        if plan is not None:
            return plan
    stride, padding, dilation, w_shape, taps = bias_relu_wgrad_params(
        OPW, x_shape, w_shape, y_shape, dy_shape, stride, padding, dilation, layout)
    for name, shape in (("x", x_shape), ("y", y_shape)):
        if np.prod(shape, dtype=np.int64) >= K.INT_LIMIT:
            raise DnnbindValueError(f"{OPW}: {name} {shape} has 2**31 elements or more; the kernel indexes with 32-bit "
                             "integers (use conv_backward_filter and conv_backward_bias)")
    geom, grid, block, s = KW.launch_plan(_check.to_nchw(x_shape, layout), _check.to_nchw(w_shape, layout),
                                          _check.to_nchw(y_shape, layout), stride, padding, dilation, layout)
    plan = (w_shape, taps, geom, grid, block, s, KW.final_grid(w_shape[0], taps))
    if raw is not None:
        if len(_wgrad_plans) >= PLAN_LIMIT:
            _wgrad_plans.pop(next(iter(_wgrad_plans)))  # the oldest: a cap, not an LRU (ops._common.cache_insert)
        _wgrad_plans[raw] = plan
    return plan


def _check_out(out, name: str, shape, dtype, device) -> None:
    if out is None:
        return
    if not isinstance(out, NDArray):
        raise DnnbindTypeError(f"{OPW}: {name} must be a dnnbind NDArray (written in place), got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype or out.device is not device:
        raise DnnbindValueError(f"{OPW}: {name} has shape {out.shape}, {out.dtype} on {out.device}; expected "
                         f"{tuple(shape)}, {dtype} on {device}")


@op(reference.bias_relu_wgrad, "x", "y", "dy")
def bias_relu_wgrad(x, y, dy, w_shape, stride=1, padding=0, dilation=1, layout="NCHW", out_dw=None, out_db=None):
    """(dw, db) of y = relu(conv(x, w) + b), groups 1, at most 32 filter taps: one kernel pass over x, y and dy
    (plus a small fixed-order sum of the per-block slots), into ``out_dw``/``out_db`` if given (GPU only)."""
    dtype = float_dtype(OPW, K.DTYPES, x=x, y=y, dy=dy)
    w_shape, taps, geom, grid, block, s, final_grid = _wgrad_plan(x.shape, w_shape, y.shape, dy.shape, stride,
                                                                  padding, dilation, layout)
    k = w_shape[0]
    _check_out(out_dw, "out_dw", w_shape, dtype, x.device)
    _check_out(out_db, "out_db", (k,), dtype, x.device)
    dw = out_like(w_shape, dtype, x.device) if out_dw is None else out_dw
    db = out_like((k,), dtype, x.device) if out_db is None else out_db
    stream = current_stream(x.device)
    # One slice per block column: the blocks write dw and db themselves. Else per-(channel, tap, slice) slots from
    # the pool for this call (a recording holds them; the final kernel is queued before their stream-ordered free).
    part = empty((k * (taps + 1) * s,), np.float32, x.device) if s > 1 else None
    KW.kernel(KW.wgrad_name(dtype, taps, layout)).launch(grid, block, (x, y, dy, part, dw, db, geom), stream=stream)
    if part is not None:
        KW.kernel(KW.final_name(dtype)).launch(final_grid, K.BLOCK, (part, dw, db, k, taps, s), stream=stream)
    return dw, db
