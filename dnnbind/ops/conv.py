"""Layer 2 (ops): convolution through cuDNN (forward, backward data/filter/bias, fused bias+ReLU); a first layer's
fused bias+ReLU forward (at most 32 filter taps) by an NVRTC kernel instead (ops._wgrad_kernels, dn_small_fwd).

Imports _lib, runtime and ops. Cross-correlation (what every framework calls convolution). The output
shape is validated by ops._check (same rule as cudnnGetConvolution2dForwardOutputDim; a CPU test holds the
two together); 5-D data (N, C, D, H, W), channels first only, by ops.reference.conv.conv3d_params, and given to
cuDNN on N-d descriptors (tests/test_conv3d.py holds its shape rule to cudnnGetConvolutionNdForwardOutputDim; the
backend-API plans of ops.conv_backend are 4-D only, so 3-D takes the legacy algorithms). Algorithms come from
ops.algos, chosen once per shape (keyed on the full shapes); the workspace is shared per stream (up to 32 MiB; a
larger one is borrowed from the pool for the call: ops._common.scratch).

``layout``: "NCHW" (x (N, C, H, W), w (K, C/groups, R, S), y (N, K, P, Q)) or "NHWC", MXNet's channels-last
(x (N, H, W, C), w (K, R, S, C/groups), "OHWI", y (N, P, Q, K); b (K,) either way), given to cuDNN as
CUDNN_TENSOR_NHWC descriptors. The layout is part of every cache key (descriptors, plans, the algorithm choice
in memory and on disk), so the two layouts' choices never mix.
"""

from __future__ import annotations

import threading

import numpy as np

from .._lib import cudnn, hooks
from .._lib.errors import CudnnError, DnnbindTypeError, DnnbindValueError
from .._lib.hooks import TRACING
from ..runtime import config
from ..runtime.array import NDArray, empty
from ..runtime.stream import current_stream
from . import _check, algos, conv_backend, reference
from . import _wgrad_kernels as KW
from . import descriptors as D
from ._common import blas, cache_insert, dnn, float_dtype, out_like, scratch, with_context
from ._dispatch import op
from .blas import ones_vector, row_sums_into, sum_rows_into
from .reference.conv import conv3d_bias_params, conv3d_grad_params, conv3d_params

L = cudnn.lib
BACKEND = algos.BACKEND


class _Plan:
    """What a conv call needs besides pointers, built once per argument set: checked shapes, descriptors and
    the algorithm-cache key. The hot path is one dict lookup on the raw arguments."""
    __slots__ = ("bd", "cdesc", "key", "params", "small", "wd", "xd", "y_shape", "yd")

    def backend_plans(self, direction: str, handle) -> list:
        """This shape's backend-API execution plans (ops.conv_backend), built on first use; [] if none.
        Kept per (direction, shape key, determinism, handle): a plan is built for its handle, and the index the
        algorithm cache stores means "the i-th plan of this list"."""
        k = (direction, self.key, algos.deterministic(), handle)
        found = _engines.get(k)
        if found is None:
            found = cache_insert(_engines, k, lambda: self._build_plans(direction, handle), _engines_lock, PLAN_LIMIT)
        return found

    def _build_plans(self, direction: str, handle) -> list:
        x_shape, w_shape, stride, padding, dilation, groups, dtype, math, layout = self.params
        if dtype not in conv_backend.DTYPES or len(x_shape) != 4:  # conv_backend builds 4-D graphs only; 3-D
            return []  # convolutions take the legacy algorithms
        try:
            return conv_backend.candidates(handle, direction, x_shape, w_shape, self.y_shape, stride, padding,
                                           dilation, dtype, math, algos.deterministic(), groups=groups,
                                           layout=layout)
        except CudnnError:
            return []  # the legacy algorithms remain


# Per argument set (_setup) and per (direction, shape, determinism, handle) (backend_plans); lookups without a
# lock, insertions under one, at most PLAN_LIMIT entries each (the oldest dropped first).
PLAN_LIMIT = 1024
_plans: dict = {}
_engines: dict = {}  # see _Plan.backend_plans
_plans_lock, _engines_lock = threading.Lock(), threading.Lock()


def _annotate(direction, algo, key, ws_bytes, dtype, **shapes) -> None:
    """Name shapes, dtype and math mode on the call the trace records next; for a backend plan's
    cudnnBackendExecute also the plan and its workspace (the legacy calls carry their algorithm)."""
    plan = {} if algo < BACKEND else {"algo": algos.algo_name(direction, algo, (direction,) + key),
                                       "workspace_bytes": ws_bytes}
    if key[-1] != "NCHW":
        plan["layout"] = key[-1]
    hooks.annotate(**shapes, dtype=dtype.name, math=config.math_mode(), **plan)


def _exact(v) -> bool:
    return type(v) is int or (type(v) is tuple and all(type(e) is int for e in v))


def _setup(opname, x_shape, w_shape, stride, padding, dilation, groups, dtype, b_shape=None, dy_shape=None,
           layout="NCHW"):
    """Validate once per argument set (with the bias, or the gradient's shape for a backward); build the
    descriptors. Other spellings (lists, floats) are validated every call instead of cached."""
    math = config.math_mode()
    raw = None
    # Only exact ints are cached: 1.0 and True hash like 1 but must still be refused by the checks below.
    if _exact(stride) and _exact(padding) and _exact(dilation) and type(groups) is int and type(layout) is str:
        raw = (opname, x_shape, w_shape, stride, padding, dilation, groups, dtype, b_shape, dy_shape, math, layout)
        plan = _plans.get(raw)
        if plan is not None:
            return plan
    plan = _new_plan(opname, x_shape, w_shape, stride, padding, dilation, groups, dtype, b_shape, dy_shape, math,
                     layout)
    return plan if raw is None else cache_insert(_plans, raw, lambda: plan, _plans_lock, PLAN_LIMIT)


def _new_plan(opname, x_shape, w_shape, stride, padding, dilation, groups, dtype, b_shape, dy_shape, math,
              layout="NCHW") -> _Plan:
    three_d = len(x_shape) == 5
    if dy_shape is None:
        check = conv3d_params if three_d else _check.conv_params
        stride, padding, dilation, groups, y_shape = check(opname, x_shape, w_shape, b_shape, stride, padding,
                                                           dilation, groups, layout)
    else:
        check = conv3d_grad_params if three_d else _check.conv_grad_params
        stride, padding, dilation, groups, y_shape = check(opname, x_shape, w_shape, dy_shape, stride, padding,
                                                           dilation, groups, layout)
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    plan = _Plan()
    plan.params = (x_shape, w_shape, stride, padding, dilation, groups, dtype, math, layout)
    plan.y_shape = y_shape
    plan.cdesc = D.conv(padding, stride, dilation, groups, dtype, math)
    plan.key = (x_shape, w_shape, stride, padding, dilation, groups, dtype.str, math, layout)
    if three_d:  # 5-D (N, C, D, H, W): N-d descriptors (a 3-entry convolution descriptor, 5-D tensors and filter)
        plan.xd, plan.wd, plan.yd = D.tensor_nd(x_shape, dtype), D.filt(w_shape, dtype), D.tensor_nd(y_shape, dtype)
        plan.bd = D.tensor_nd((1, y_shape[1], 1, 1, 1), dtype)
    elif layout == "NHWC":  # the same dims for cuDNN, laid out channels last (descriptors.tensor_nhwc/filt_nhwc)
        plan.xd, plan.wd, plan.yd = D.tensor_nhwc(x_shape, dtype), D.filt_nhwc(w_shape, dtype), \
            D.tensor_nhwc(y_shape, dtype)
        plan.bd = D.tensor_nhwc((1, 1, 1, y_shape[3]), dtype)
    else:
        plan.xd, plan.wd, plan.yd = D.tensor(x_shape, dtype), D.filt(w_shape, dtype), D.tensor(y_shape, dtype)
        plan.bd = D.tensor((1, y_shape[1], 1, 1), dtype)
    plan.small = _small_filter(plan) if opname == "conv_bias_relu_forward" and not three_d else None
    return plan


@op(reference.conv_forward, "x", "w", "b")
def conv_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """y = conv(x, w) + b: ``cudnnConvolutionForward`` (+ ``cudnnAddTensor`` for the bias)."""
    dtype = float_dtype("conv_forward", x=x, w=w, b=b)
    plan = _setup("conv_forward", x._shape, w._shape, stride, padding, dilation, groups, dtype,
                  b_shape=None if b is None else b._shape, layout=layout)
    y_shape, cdesc, key, xd, wd, yd = plan.y_shape, plan.cdesc, plan.key, plan.xd, plan.wd, plan.yd
    y = out_like(y_shape, dtype, x._device)
    h = dnn(x)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)

    def run(algo, ws, ws_size):
        if algo >= BACKEND:
            plan.backend_plans("fwd", h)[algo - BACKEND].execute(h, (x._ptr, w._ptr, y._ptr), ws)
        else:
            L.cudnnConvolutionForward(h, one, xd, x._ptr, wd, w._ptr, cdesc, algo, ws, ws_size, zero, yd, y._ptr)

    try:
        algo, ws_bytes = algos.choose(("fwd",) + key, "fwd", h, (xd, wd, cdesc, yd), run, x._device,
                                      plans=lambda: plan.backend_plans("fwd", h))
        if TRACING:
            _annotate("fwd", algo, key, ws_bytes, dtype, x=x._shape, w=w._shape)
        with scratch(x._device, ws_bytes) as (ws, ws_size):
            run(algo, ws, ws_size)
        if b is not None:
            L.cudnnAddTensor(h, one, plan.bd, b._ptr, one, yd, y._ptr)
    except CudnnError as exc:
        raise with_context(exc, op="conv_forward", x=x._shape, w=w._shape, stride=stride, padding=padding,
                           dilation=dilation, groups=groups, layout=layout) from None
    return y


def _reference_conv_bias_relu(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    y = reference.conv_forward(x, w, b, stride, padding, dilation, groups, layout)
    return reference.activation_forward(y, "relu")


SMALL_FILTER_KERNEL = True  # False: conv_bias_relu_forward always goes to cuDNN (tests compare the two)


def _small_filter(plan) -> tuple | None:
    """(kernel name, grid, geometry) of dn_small_fwd (ops._wgrad_kernels) for a first layer's few taps (C*R*S <= 32),
    NCHW, groups 1, float32/float16, 32-bit indexable, else None: the kernel writes y once, where cuDNN's
    one-input-channel kernels run at a fraction of the bandwidth. Worked out once per plan (_new_plan)."""
    x_shape, w_shape, stride, padding, dilation, groups, dtype = plan.params[:7]
    _, c, r, s = w_shape
    sizes = (np.prod(x_shape, dtype=np.int64), np.prod(plan.y_shape, dtype=np.int64))
    if not (plan.params[8] == "NCHW" and groups == 1 and c * r * s <= KW.MAX_TAPS and dtype in KW.DTYPES
            and max(sizes) < KW.INT_LIMIT):
        return None
    geom = KW.launch_plan(x_shape, w_shape, plan.y_shape, stride, padding, dilation, "NCHW")[0]
    return KW.fwd_name(dtype, c * r * s), KW.fwd_grid(geom.ROWS, geom.K), geom


@op(_reference_conv_bias_relu, "x", "w", "b")
def conv_bias_relu_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """y = relu(conv(x, w) + b) in one call: ``cudnnConvolutionBiasActivationForward``, or (eager calls, when
    faster) one backend-API plan of the graph conv -> add bias -> relu (ops.conv_backend "fwd_bias_relu").

    NOTE: cuDNN documents only IMPLICIT_PRECOMP_GEMM for the legacy call with a ReLU, and it needs a bias; z
    (the residual input) is y itself with alpha2 = 0.
    """
    dtype = float_dtype("conv_bias_relu_forward", (np.dtype(np.float32), np.dtype(np.float16)), x=x, w=w, b=b)
    if b is None:
        raise DnnbindValueError("conv_bias_relu_forward: needs a bias b (use conv_forward + activation_forward without)")
    plan = _setup("conv_bias_relu_forward", x._shape, w._shape, stride, padding, dilation, groups, dtype,
                  b_shape=b._shape, layout=layout)
    y_shape, cdesc, key, xd, wd, yd, bd = plan.y_shape, plan.cdesc, plan.key, plan.xd, plan.wd, plan.yd, plan.bd
    y = out_like(y_shape, dtype, x._device)
    if plan.small is not None and SMALL_FILTER_KERNEL:
        name, grid, geom = plan.small
        KW.kernel(name).launch(grid, KW.BLOCK, (x, w, b, y, geom), stream=current_stream(x._device))
        return y
    h = dnn(x)
    act = D.activation("relu", 0.0)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)

    def run(algo, ws, ws_size):
        if algo >= BACKEND:  # one backend graph: conv -> + bias -> relu, fused by cuDNN's runtime fusion engines
            plan.backend_plans("fwd_bias_relu", h)[algo - BACKEND].execute(h, (x._ptr, w._ptr, b._ptr, y._ptr), ws)
        else:
            L.cudnnConvolutionBiasActivationForward(h, one, xd, x._ptr, wd, w._ptr, cdesc, algo, ws, ws_size, zero,
                                                    yd, y._ptr, bd, b._ptr, act, yd, y._ptr)

    try:
        algo, ws_bytes = algos.choose(("fwd_bias_relu",) + key, "fwd", h, (xd, wd, cdesc, yd), run, x._device,
                                      only=(1,),  # CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
                                      plans=lambda: plan.backend_plans("fwd_bias_relu", h))
        if TRACING:
            _annotate("fwd_bias_relu", algo, key, ws_bytes, dtype, x=x._shape, w=w._shape)
        with scratch(x._device, ws_bytes) as (ws, ws_size):
            run(algo, ws, ws_size)
    except CudnnError as exc:
        raise with_context(exc, op="conv_bias_relu_forward", x=x._shape, w=w._shape, layout=layout) from None
    return y


@op(reference.conv_backward_data, "w", "dy")
def conv_backward_data(w, dy, x_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """dx = conv_transpose(dy, w): ``cudnnConvolutionBackwardData``."""
    dtype = float_dtype("conv_backward_data", w=w, dy=dy)
    x_shape = _check.check_shape_arg("conv_backward_data", "x_shape", x_shape)
    plan = _setup("conv_backward_data", x_shape, w._shape, stride, padding, dilation, groups, dtype,
                  dy_shape=dy._shape, layout=layout)
    cdesc, key, wd, dyd, dxd = plan.cdesc, plan.key, plan.wd, plan.yd, plan.xd
    dx = out_like(x_shape, dtype, w._device)
    h = dnn(w)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)

    def run(algo, ws, ws_size):
        if algo >= BACKEND:
            plan.backend_plans("bwd_data", h)[algo - BACKEND].execute(h, (w._ptr, dy._ptr, dx._ptr), ws)
        else:
            L.cudnnConvolutionBackwardData(h, one, wd, w._ptr, dyd, dy._ptr, cdesc, algo, ws, ws_size, zero, dxd,
                                           dx._ptr)

    try:
        algo, ws_bytes = algos.choose(("bwd_data",) + key, "bwd_data", h, (wd, dyd, cdesc, dxd), run, w._device,
                                      plans=lambda: plan.backend_plans("bwd_data", h))
        if TRACING:
            _annotate("bwd_data", algo, key, ws_bytes, dtype, w=w._shape, dy=dy._shape)
        with scratch(w._device, ws_bytes) as (ws, ws_size):
            run(algo, ws, ws_size)
    except CudnnError as exc:
        raise with_context(exc, op="conv_backward_data", w=w._shape, dy=dy._shape, x_shape=x_shape,
                           layout=layout) from None
    return dx


@op(reference.conv_backward_filter, "x", "dy")
def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, out=None, layout="NCHW"):
    """dw = correlation of x with dy: ``cudnnConvolutionBackwardFilter`` (into ``out`` if given, GPU only)."""
    dtype = float_dtype("conv_backward_filter", x=x, dy=dy)
    w_shape = _check.check_shape_arg("conv_backward_filter", "w_shape", w_shape)
    plan = _setup("conv_backward_filter", x._shape, w_shape, stride, padding, dilation, groups, dtype,
                  dy_shape=dy._shape, layout=layout)
    cdesc, key, xd, dyd, dwd = plan.cdesc, plan.key, plan.xd, plan.yd, plan.wd
    dw = _target(out, w_shape, dtype, x._device, "conv_backward_filter")
    h = dnn(x)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)

    def run(algo, ws, ws_size):
        if algo >= BACKEND:
            plan.backend_plans("bwd_filter", h)[algo - BACKEND].execute(h, (x._ptr, dy._ptr, dw._ptr), ws)
        else:
            L.cudnnConvolutionBackwardFilter(h, one, xd, x._ptr, dyd, dy._ptr, cdesc, algo, ws, ws_size, zero,
                                             dwd, dw._ptr)

    try:
        algo, ws_bytes = algos.choose(("bwd_filter",) + key, "bwd_filter", h, (xd, dyd, cdesc, dwd), run,
                                      x._device, plans=lambda: plan.backend_plans("bwd_filter", h))
        if TRACING:
            _annotate("bwd_filter", algo, key, ws_bytes, dtype, x=x._shape, dy=dy._shape)
        with scratch(x._device, ws_bytes) as (ws, ws_size):
            run(algo, ws, ws_size)
    except CudnnError as exc:
        raise with_context(exc, op="conv_backward_filter", x=x._shape, dy=dy._shape, w_shape=w_shape,
                           layout=layout) from None
    return dw


@op(reference.conv_backward_bias, "dy")
def conv_backward_bias(dy, layout="NCHW"):
    """db[k] = sum of dy over n, h, w: ``cudnnConvolutionBackwardBias``."""
    dtype = float_dtype("conv_backward_bias", dy=dy)
    if len(dy._shape) == 5:  # 3-D: D.tensor folds (N, K, O, P, Q) into (N, K, O*P, Q), the same per-channel sum
        k = conv3d_bias_params("conv_backward_bias", dy._shape, layout)
    else:
        k = _check.conv_bias_params("conv_backward_bias", dy._shape, layout)
    db = out_like((k,), dtype, dy._device)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
    if layout == "NHWC":
        dyd, dbd = D.tensor_nhwc(dy._shape, dtype), D.tensor_nhwc((1, 1, 1, k), dtype)
    else:
        dyd, dbd = D.tensor(dy._shape, dtype), D.tensor((1, k, 1, 1), dtype)
    L.cudnnConvolutionBackwardBias(dnn(dy), one, dyd, dy._ptr, zero, dbd, db._ptr)
    return db


def _target(out, shape, dtype, device, opname):
    if out is None:
        return out_like(shape, dtype, device)
    if not isinstance(out, NDArray):
        raise DnnbindTypeError(f"{opname}: out must be a dnnbind NDArray (written in place), got {type(out).__name__}")
    if out._shape != tuple(shape) or out._dtype != dtype or out._device is not device:
        raise DnnbindValueError(f"{opname}: out has shape {out._shape}, {out._dtype} on {out._device}; expected "
                         f"{tuple(shape)}, {dtype} on {device}")
    return out


def conv_backward_bias_gemv(dy, out=None, layout="NCHW"):
    """Same result as conv_backward_bias, as two cuBLAS gemv against ones (sum over N, then over H*W).

    NOTE: cudnnConvolutionBackwardBias is slow at MNIST sizes (FACTS.md), and its float16 kernel at ResNet sizes
    (2.3 ms of a 11 ms ResNet-18 step on an H100); the training path (nd.Convolution's backward) uses this
    instead. float16 goes through cublasGemmEx with float accumulation. GPU NDArrays only.

    NHWC: db is the column sum of dy viewed as (N*H*W, K), taken in the same two steps (over N into a (H*W, K)
    matrix, then its column sums), so the ones vectors stay N and H*W long as for NCHW; a hybridized Block's
    recording, which cannot copy from the host, needs no longer one than its eager run made.
    """
    dtype = float_dtype("conv_backward_bias", _check.FLOAT_DTYPES, dy=dy)
    k = _check.conv_bias_params("conv_backward_bias", dy._shape, layout)
    n = dy._shape[0]
    hw = dy.size // (n * k)
    h = blas(dy)
    per_pixel = empty((k * hw,), dtype, dy._device)
    sum_rows_into(h, dy._ptr, ones_vector(dy._device, n, dtype)._ptr, per_pixel._ptr, n, k * hw, 1.0, 0.0, dtype)
    db = _target(out, (k,), dtype, dy._device, "conv_backward_bias")
    if layout == "NHWC":  # per_pixel is (H*W, K): sum its rows
        sum_rows_into(h, per_pixel._ptr, ones_vector(dy._device, hw, dtype)._ptr, db._ptr, hw, k, 1.0, 0.0, dtype)
    else:  # per_pixel is (K, H*W): sum each row
        row_sums_into(h, per_pixel._ptr, ones_vector(dy._device, hw, dtype)._ptr, db._ptr, k, hw, 1.0, 0.0,
                      dtype)
    return db
