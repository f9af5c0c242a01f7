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

import math
import threading

import numpy as np

from .._lib import cudnn, hooks
from .._lib.errors import CudnnError, DnnbindValueError
from .._lib.hooks import TRACING
from ..runtime import config
from ..runtime.exec_context import exec_context
from . import _check, algos, conv_backend, reference
from . import _wgrad_kernels as KW
from . import descriptors as D
from ._common import (borrow_workspace, cache_insert, dnn, exact_ints, float_dtype, out_like, result_array,
                      with_context)
from ._dispatch import op
from .blas import ones_vector, row_sums_into, sum_rows_into
from .reference.conv import conv3d_bias_params, conv3d_grad_params, conv3d_params

L = cudnn.lib
BACKEND = algos.BACKEND


class _Plan:
    """What a conv call needs besides pointers, built once per argument set: checked shapes, descriptors and
    the algorithm-cache key. The hot path is one dict lookup on the raw arguments."""
    __slots__ = ("bd", "bound", "cdesc", "dtype", "key", "one", "params", "small", "wd", "xd", "y_shape", "yd",
                 "zero")

    def backend_plans(self, direction: str, handle, alignment: int) -> list:
        """This shape's backend-API execution plans (ops.conv_backend) for pointers ``alignment``-byte aligned,
        built on first use; [] if none. Kept per (direction, shape key, determinism, handle, alignment): a plan is
        built for its handle, and the index the algorithm cache stores means "the i-th plan of this list"."""
        k = (direction, self.key, algos.deterministic(), handle, alignment)
        found = _engines.get(k)
        if found is None:
            found = cache_insert(_engines, k, lambda: self._build_plans(direction, handle, alignment), _engines_lock,
                                 PLAN_LIMIT)
        return found

    def _build_plans(self, direction: str, handle, alignment: int) -> list:
        x_shape, w_shape, stride, padding, dilation, groups, dtype, math, layout = self.params
        if dtype not in conv_backend.DTYPES or len(x_shape) != 4:  # conv_backend builds 4-D graphs only; 3-D
            return []  # convolutions take the legacy algorithms
        try:
            return conv_backend.candidates(handle, direction, x_shape, w_shape, self.y_shape, stride, padding,
                                           dilation, dtype, math, algos.deterministic(), groups=groups,
                                           layout=layout, alignment=alignment)
        except CudnnError:
            return []  # the legacy algorithms remain


# Per argument set (_setup) and per (direction, shape, determinism, handle, alignment) (backend_plans); lookups without a
# lock, insertions under one, at most PLAN_LIMIT entries each (the oldest dropped first).
PLAN_LIMIT = 1024
_plans: dict = {}
_engines: dict = {}  # see _Plan.backend_plans
_plans_lock, _engines_lock = threading.Lock(), threading.Lock()


ALIGNED = 16  # bytes: the pointer alignment backend plans are built for when a call's pointers all have it


def _launch(ctx, plan: _Plan, direction: str, ptrs: tuple, legacy, only=None, shapes=None) -> None:
    """Run one conv call of ``direction`` on ``plan``'s shapes: the chosen backend-API plan on ``ptrs`` (its role
    order, see ops.conv_backend), or ``legacy(handle, algo, workspace, workspace_bytes)``, the legacy cuDNN call.

    NOTE: a backend plan promises cuDNN an alignment for every pointer it will be given
    (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT). Promised only the element size (2 bytes for float16), cuDNN offers
    engines without vector loads, which lose to the legacy calls on the GPU; those then cost 80-230 us of host
    time each in an eager step (docs/benchmarks.md). dnnbind's buffers are 256-byte aligned, so a call whose
    pointers are all 16-byte aligned (nearly every call) chooses among plans built for 16; another (a view at
    an odd element offset) among plans built for the element size. Each has its own choice, in memory and on
    disk (the alignment ends the algorithm-cache key)."""
    h = ctx.dnn()
    aligned = ALIGNED if not _or(ptrs) % ALIGNED else plan.dtype.itemsize
    chosen = plan.bound.get((direction, h, algos.objective(), aligned))
    if chosen is None:
        chosen = _chosen(plan, direction, h, ctx.device, ptrs, legacy, only, aligned)
    algo, ws_bytes, backend = chosen
    if TRACING and shapes is not None:
        _annotate(direction, algo, plan.key + (aligned,), ws_bytes, plan.dtype, **shapes)
    ws, ws_size, held = borrow_workspace(ctx, ws_bytes)
    if backend is not None:
        backend.execute(h, ptrs, ws)
    else:
        legacy(h, algo, ws, ws_size)
    del held


def _or(ptrs: tuple) -> int:
    bits = 0
    for p in ptrs:
        bits |= p
    return bits


def _chosen(plan: _Plan, direction: str, h, device, ptrs: tuple, legacy, only, alignment: int) -> tuple:
    """(algorithm, workspace bytes, backend plan or None) for one call of ``direction`` on ``plan``'s shapes:
    algos.choose's answer, kept on the plan per (direction, handle, objective, alignment) so a warm call skips
    choose() and the plan list lookup (_launch reads ``plan.bound`` itself and calls this only on a miss)."""
    target = algos.objective()

    def run(algo, ws, ws_size):
        if algo >= BACKEND:
            plan.backend_plans(direction, h, alignment)[algo - BACKEND].execute(h, ptrs, ws)
        else:
            legacy(h, algo, ws, ws_size)

    if direction == "bwd_data":
        descs = (plan.wd, plan.yd, plan.cdesc, plan.xd)
    elif direction == "bwd_filter":
        descs = (plan.xd, plan.yd, plan.cdesc, plan.wd)
    else:
        descs = (plan.xd, plan.wd, plan.cdesc, plan.yd)
    algo, ws = algos.choose((direction,) + plan.key + (alignment,), "fwd" if direction == "fwd_bias_relu"
                            else direction, h, descs, run, device, only=only,
                            plans=lambda: plan.backend_plans(direction, h, alignment))
    chosen = (algo, ws, plan.backend_plans(direction, h, alignment)[algo - BACKEND] if algo >= BACKEND else None)
    plan.bound[(direction, h, target, alignment)] = chosen
    return chosen


def _forget_choices() -> None:
    for plan in list(_plans.values()):
        plan.bound.clear()


algos.on_policy_change(_forget_choices)


def _annotate(direction, algo, key, ws_bytes, dtype, **shapes) -> None:
    """Name shapes, dtype and math mode on the call the trace records next; for a backend plan's
    cudnnBackendExecute also the plan and its workspace (the legacy calls carry their algorithm)."""
    plan = {} if algo < BACKEND else {"algo": algos.algo_name(direction, algo, (direction,) + key),
                                       "workspace_bytes": ws_bytes}
    if key[-1] != "NCHW":
        plan["layout"] = key[-1]
    hooks.annotate(**shapes, dtype=dtype.name, math=config.math_mode(), **plan)


def _setup(opname, x_shape, w_shape, stride, padding, dilation, groups, dtype, b_shape=None, dy_shape=None,
           layout="NCHW"):
    """Validate once per argument set (with the bias, or the gradient's shape for a backward); build the
    descriptors. Other spellings (lists, floats) are validated every call instead of cached."""
    math = config.math_mode()
    raw = None
    # Only exact ints are cached: 1.0 and True hash like 1 but must still be refused by the checks below.
    if exact_ints(stride) and exact_ints(padding) and exact_ints(dilation) and type(groups) is int and \
            type(layout) is str:
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
    plan.bound = {}  # (direction, handle, objective) -> _chosen()'s answer
    plan.params = (x_shape, w_shape, stride, padding, dilation, groups, dtype, math, layout)
    plan.dtype, plan.one, plan.zero = dtype, D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
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
    plan = _setup("conv_forward", x.shape, w.shape, stride, padding, dilation, groups, dtype,
                  b_shape=None if b is None else b.shape, layout=layout)
    return forward_on(exec_context(x.device), plan, x, w, b)


def conv_plan(opname: str, x_shape: tuple, w_shape: tuple, stride, padding, dilation, groups: int, dtype,
              b_shape=None, dy_shape=None, layout: str = "NCHW") -> _Plan:
    """The checked, cached plan of one conv call (shapes in ``layout``; ``opname`` one of conv_forward,
    conv_bias_relu_forward, conv_backward_data, conv_backward_filter): what the ``*_on`` functions take. Raises
    on arguments the op refuses, naming it."""
    return _setup(opname, x_shape, w_shape, stride, padding, dilation, groups, np.dtype(dtype), b_shape=b_shape,
                  dy_shape=dy_shape, layout=layout)


def _conv_error(exc: CudnnError, opname: str, plan: _Plan, **shapes) -> CudnnError:
    x_shape, w_shape, stride, padding, dilation, groups, _, _, layout = plan.params
    return with_context(exc, op=opname, **shapes, stride=stride, padding=padding, dilation=dilation, groups=groups,
                        layout=layout)


def forward_on(ctx, plan: _Plan, x, w, b=None):
    """conv_forward on arrays its checks (or the Convolution operator's) accepted, ``plan`` from conv_plan for
    them, on ExecContext ``ctx`` (their device, made current): no check or lookup is repeated."""
    y = ctx.empty(plan.y_shape, plan.dtype)
    xp, wp, yp = x.ptr, w.ptr, y.ptr
    xd, wd, yd, cdesc, one, zero = plan.xd, plan.wd, plan.yd, plan.cdesc, plan.one, plan.zero
    try:
        _launch(ctx, plan, "fwd", (xp, wp, yp), lambda h, algo, ws, ws_size: L.cudnnConvolutionForward(
                    h, one, xd, xp, wd, wp, cdesc, algo, ws, ws_size, zero, yd, yp),
                shapes=dict(x=x.shape, w=w.shape) if TRACING else None)
        if b is not None:
            L.cudnnAddTensor(ctx.dnn(), one, plan.bd, b.ptr, one, yd, yp)
    except CudnnError as exc:
        raise _conv_error(exc, "conv_forward", plan, x=x.shape, w=w.shape) from None
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
    plan = _setup("conv_bias_relu_forward", x.shape, w.shape, stride, padding, dilation, groups, dtype,
                  b_shape=b.shape, layout=layout)
    return bias_relu_forward_on(exec_context(x.device), plan, x, w, b)


def bias_relu_forward_on(ctx, plan: _Plan, x, w, b):
    """conv_bias_relu_forward on checked arrays (see forward_on)."""
    y = ctx.empty(plan.y_shape, plan.dtype)
    if plan.small is not None and SMALL_FILTER_KERNEL:
        name, grid, geom = plan.small
        KW.kernel(name).launch(grid, KW.BLOCK, (x, w, b, y, geom), stream=ctx.stream)
        return y
    act = D.activation("relu", 0.0)
    xp, wp, bp, yp = x.ptr, w.ptr, b.ptr, y.ptr
    xd, wd, yd, bd, cdesc, one, zero = plan.xd, plan.wd, plan.yd, plan.bd, plan.cdesc, plan.one, plan.zero

    def legacy(h, algo, ws, ws_size):
        L.cudnnConvolutionBiasActivationForward(h, one, xd, xp, wd, wp, cdesc, algo, ws, ws_size, zero, yd, yp, bd,
                                                bp, act, yd, yp)
    try:
        # one backend graph: conv -> + bias -> relu, fused by cuDNN's runtime fusion; of the legacy algorithms,
        # only CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (1) is documented for it
        _launch(ctx, plan, "fwd_bias_relu", (xp, wp, bp, yp), legacy, only=(1,),
                shapes=dict(x=x.shape, w=w.shape) if TRACING else None)
    except CudnnError as exc:
        raise _conv_error(exc, "conv_bias_relu_forward", plan, x=x.shape, w=w.shape) from None
    return y


@op(reference.conv_backward_data, "w", "dy")
def conv_backward_data(w, dy, x_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """dx = conv_transpose(dy, w): ``cudnnConvolutionBackwardData``."""
    dtype = float_dtype("conv_backward_data", w=w, dy=dy)
    x_shape = _check.check_shape_arg("conv_backward_data", "x_shape", x_shape)
    plan = _setup("conv_backward_data", x_shape, w.shape, stride, padding, dilation, groups, dtype,
                  dy_shape=dy.shape, layout=layout)
    return backward_data_on(exec_context(w.device), plan, w, dy)


def backward_data_on(ctx, plan: _Plan, w, dy):
    """conv_backward_data on checked arrays (see forward_on); dx has the plan's x shape."""
    dx = ctx.empty(plan.params[0], plan.dtype)
    wp, dyp, dxp = w.ptr, dy.ptr, dx.ptr
    wd, dyd, dxd, cdesc, one, zero = plan.wd, plan.yd, plan.xd, plan.cdesc, plan.one, plan.zero
    try:
        _launch(ctx, plan, "bwd_data", (wp, dyp, dxp), lambda h, algo, ws, ws_size: L.cudnnConvolutionBackwardData(
                    h, one, wd, wp, dyd, dyp, cdesc, algo, ws, ws_size, zero, dxd, dxp),
                shapes=dict(w=w.shape, dy=dy.shape) if TRACING else None)
    except CudnnError as exc:
        raise _conv_error(exc, "conv_backward_data", plan, w=w.shape, dy=dy.shape, x_shape=plan.params[0]) from None
    return dx


@op(reference.conv_backward_filter, "x", "dy")
def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, out=None, layout="NCHW"):
    """dw = correlation of x with dy: ``cudnnConvolutionBackwardFilter`` (into ``out`` if given, GPU only)."""
    dtype = float_dtype("conv_backward_filter", x=x, dy=dy)
    w_shape = _check.check_shape_arg("conv_backward_filter", "w_shape", w_shape)
    plan = _setup("conv_backward_filter", x.shape, w_shape, stride, padding, dilation, groups, dtype,
                  dy_shape=dy.shape, layout=layout)
    return backward_filter_on(exec_context(x.device), plan, x, dy, out)


def backward_filter_on(ctx, plan: _Plan, x, dy, out=None):
    """conv_backward_filter on checked arrays (see forward_on), into ``out`` (checked here) if given."""
    dw = result_array(out, plan.params[1], plan.dtype, ctx.device, "conv_backward_filter") if out is not None \
        else ctx.empty(plan.params[1], plan.dtype)
    xp, dyp, dwp = x.ptr, dy.ptr, dw.ptr
    xd, dyd, dwd, cdesc, one, zero = plan.xd, plan.yd, plan.wd, plan.cdesc, plan.one, plan.zero
    try:
        _launch(ctx, plan, "bwd_filter", (xp, dyp, dwp),
                lambda h, algo, ws, ws_size: L.cudnnConvolutionBackwardFilter(
                    h, one, xd, xp, dyd, dyp, cdesc, algo, ws, ws_size, zero, dwd, dwp),
                shapes=dict(x=x.shape, dy=dy.shape) if TRACING else None)
    except CudnnError as exc:
        raise _conv_error(exc, "conv_backward_filter", plan, x=x.shape, dy=dy.shape,
                          w_shape=plan.params[1]) from None
    return dw


@op(reference.conv_backward_bias, "dy")
def conv_backward_bias(dy, layout="NCHW"):
    """db[k] = sum of dy over n, h, w: ``cudnnConvolutionBackwardBias``."""
    dtype = float_dtype("conv_backward_bias", dy=dy)
    if len(dy.shape) == 5:  # 3-D: D.tensor folds (N, K, O, P, Q) into (N, K, O*P, Q), the same per-channel sum
        k = conv3d_bias_params("conv_backward_bias", dy.shape, layout)
    else:
        k = _check.conv_bias_params("conv_backward_bias", dy.shape, layout)
    db = out_like((k,), dtype, dy.device)
    one, zero = D.scalar_ptr(1, dtype), D.scalar_ptr(0, dtype)
    if layout == "NHWC":
        dyd, dbd = D.tensor_nhwc(dy.shape, dtype), D.tensor_nhwc((1, 1, 1, k), dtype)
    else:
        dyd, dbd = D.tensor(dy.shape, dtype), D.tensor((1, k, 1, 1), dtype)
    L.cudnnConvolutionBackwardBias(dnn(dy), one, dyd, dy.ptr, zero, dbd, db.ptr)
    return db


def conv_backward_bias_gemv(dy, out=None, layout="NCHW"):
    """Same result as conv_backward_bias, as two cuBLAS gemv against ones (sum over N, then over H*W).

    NOTE: cudnnConvolutionBackwardBias is slow at MNIST sizes (FACTS.md), and its float16 kernel at ResNet sizes
    (2.3 ms of a 11 ms ResNet-18 step on an H100); the training path (nd.Convolution's backward) uses this
    instead. float16 goes through cublasGemmEx with float accumulation. GPU NDArrays only.

    NHWC: db is the column sum of dy viewed as (N*H*W, K), taken in the same two steps (over N into a (H*W, K)
    matrix, then its column sums), so the ones vectors stay N and H*W long as for NCHW; a hybridized Block's
    recording, which cannot copy from the host, needs no longer one than its eager run made.
    """
    float_dtype("conv_backward_bias", _check.FLOAT_DTYPES, dy=dy)
    _check.conv_bias_params("conv_backward_bias", dy.shape, layout)
    return backward_bias_on(exec_context(dy.device), dy, out, layout)


def backward_bias_on(ctx, dy, out=None, layout="NCHW"):
    """conv_backward_bias_gemv on a checked dy (see forward_on), into ``out`` (checked here) if given."""
    dtype, shape = dy.dtype, dy.shape
    n, k = shape[0], shape[-1] if layout == "NHWC" else shape[1]
    hw = math.prod(shape) // (n * k)
    h = ctx.blas()
    # the (K*H*W,) partial sums live only between the two gemvs: the stream's shared scratch, not an allocation
    per_pixel, _, held = borrow_workspace(ctx, k * hw * dtype.itemsize)
    sum_rows_into(h, dy.ptr, ones_vector(ctx.device, n, dtype).ptr, per_pixel, n, k * hw, 1.0, 0.0, dtype)
    db = result_array(out, (k,), dtype, ctx.device, "conv_backward_bias") if out is not None else ctx.empty((k,), dtype)
    if layout == "NHWC":  # per_pixel is (H*W, K): sum its rows
        sum_rows_into(h, per_pixel, ones_vector(ctx.device, hw, dtype).ptr, db.ptr, hw, k, 1.0, 0.0, dtype)
    else:  # per_pixel is (K, H*W): sum each row
        row_sums_into(h, per_pixel, ones_vector(ctx.device, hw, dtype).ptr, db.ptr, k, hw, 1.0, 0.0, dtype)
    del held
    return db
