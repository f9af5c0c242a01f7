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
"""

from __future__ import annotations

import numpy as np

from ..runtime.array import empty
from ..runtime.stream import current_stream
from . import _check, reference
from . import _nn_kernels as K
from ._common import float_dtype, out_like
from ._dispatch import op
from .conv import _target, conv_backward_bias_gemv
from .pointwise import activation_backward

OP = "bias_relu_backward"


def _kernel_ok(dy) -> bool:
    """The kernels take float32/float16 and index with 32-bit integers."""
    return dy._dtype in K.DTYPES and dy.size < K.INT_LIMIT


def _channel_sums(y, dy, dz, db, layout: str) -> None:
    """db[c] = the sum over n, h, w of (y > 0 ? dy : 0), also written to dz; with y None, the sum of dy."""
    dtype, relu = dy._dtype, y is not None
    ptrs = (dy._ptr, y._ptr, dz._ptr) if relu else (dy._ptr,)
    if layout == "NCHW":
        n, c, h, w = dy._shape
        v = K.pack_width(dtype, h * w, ptrs)
        grid, block, hwv, chunk, s = K.nchw_geometry(n, c, h * w, v)
        sizes = (c, hwv, n * hwv, chunk)
    else:
        n, h, w, c = dy._shape
        v = K.pack_width(dtype, c, ptrs)
        grid, block, chunk, s = K.nhwc_geometry(n * h * w, c, v)
        sizes = (c, n * h * w, chunk)
    stream = current_stream(dy._device)
    # One slice per channel: the block writes db itself. Else the slots come from the pool for this call (a
    # recording holds them; the final kernel is queued before their stream-ordered free).
    part = empty((c * s,), np.float32, dy._device) if s > 1 else None
    K.kernel(K.chan_name(layout, dtype, v, relu)).launch(grid, block, (y, dy, dz, part, db, *sizes), stream=stream)
    if part is not None:
        K.kernel(K.final_name(dtype)).launch(K.final_grid(c), K.BLOCK, (part, db, c, s), stream=stream)


@op(reference.bias_relu_backward, "y", "dy")
def bias_relu_backward(y, dy, layout="NCHW", out=None):
    """(dz, db) of y = relu(z + b): one kernel pass over y and dy (db into ``out`` if given, GPU only)."""
    dtype = float_dtype(OP, y=y, dy=dy)
    c = _check.conv_bias_params(OP, dy._shape, layout)
    _check.check_same_shape(OP, y=y, dy=dy)
    db = _target(out, (c,), dtype, dy._device, OP)
    if not _kernel_ok(dy):
        dz = activation_backward(y, dy, y, "relu")
        return dz, conv_backward_bias_gemv(dz, out=db, layout=layout)
    dz = out_like(dy._shape, dtype, dy._device)
    _channel_sums(y, dy, dz, db, layout)
    return dz, db


def conv_backward_bias_kernel(dy, out=None, layout="NCHW"):
    """conv_backward_bias's db on GPU NDArrays, by the channel-sum kernel (into ``out`` if given)."""
    float_dtype("conv_backward_bias", _check.FLOAT_DTYPES, dy=dy)
    k = _check.conv_bias_params("conv_backward_bias", dy._shape, layout)
    if not _kernel_ok(dy):
        return conv_backward_bias_gemv(dy, out=out, layout=layout)
    db = _target(out, (k,), dy._dtype, dy._device, "conv_backward_bias")
    _channel_sums(None, dy, None, db, layout)
    return db
