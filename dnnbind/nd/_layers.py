"""Layer nd: the hand-written ops (convolution, dense, activation, softmax, losses, dropout, BatchNorm) as
forward/backward pairs. Imports ops, autograd, runtime. (Pooling is in _pooling.py.)

Each function runs the functional op (cuDNN/cuBLAS on a GPU, numpy on the cpu) and, inside
``autograd.record()``, tapes a closure that calls the op's library backward (cudnnConvolutionBackwardData/
Filter/Bias, cudnnActivationBackward, cudnnSoftmaxBackward, cublasSgemm_v2, or an op's NVRTC kernel:
ops.bias_relu_backward): the backward sits right beside its forward. The
element-wise, reduction and shape ops are table entries (_table.py and siblings), not functions here.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math

import numpy as np

from .. import ops
from .._lib.errors import CudnnError
from ..autograd import frees_graph, grad_out, is_recording, is_training, needs_grad, record_op
from ..ops import dropout as _dropout
from ..ops.reference.dropout import dropout_p
from ..ops.blas import gemm_into, ones_vector, sum_rows_into
from ..ops.bias_relu import wgrad_fits
from ..ops.conv import conv_backward_bias_gemv
from ..ops._common import blas
from ..runtime.array import empty
from ._params import (ParsedCalls, array_arg, bool_arg, check_fits, choice_arg, dtype_name, float_arg, int_arg, into,
                      bias_matches, conv_params, layout_arg, reject, required, shape_arg, spatial)

__all__ = ["Activation", "Convolution", "Dropout", "Flatten", "FullyConnected", "add_n", "log_softmax",
           "pick_nll", "reshape_like", "softmax", "softmax_cross_entropy", "waitall"]


# -- convolution and dense ------------------------------------------------------------------------------------

_FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
RELU_BIAS_KERNEL = True  # False: a fused conv's backward takes cudnnActivationBackward + gemv (tests compare)
SMALL_WGRAD_KERNEL = True  # False: a first layer's dw, db take bias_relu_backward + cuDNN as well (tests compare)
_UNFUSED: set = set()  # float16 or NHWC shapes cuDNN could not fuse (the legacy call refused, no backend plan)


_CONV_ARGS = ParsedCalls()  # a call's arrays' shapes and its parameters -> the parsed geometry


def Convolution(data=None, weight=None, bias=None, kernel=None, stride=None, dilate=None, pad=None, num_filter=None,
                num_group=1, workspace=1024, no_bias=False, cudnn_tune=None, cudnn_off=False, layout=None, out=None,
                name=None, act_type=None, **kwargs):
    """y = conv(x, w) + b (cudnnConvolutionForward + cudnnAddTensor), with MXNet 1.x's parameters (kernel and
    num_filter required; stride, dilate 1 and pad 0 by default; weight (num_filter, C/num_group, *kernel); a bias
    (num_filter,) unless ``no_bias=True``). 1-D data (N, C, W) with a 1-tuple kernel runs the 2-D path on an
    (N, C, 1, W) view; 3-D convolution is not supported. ``workspace``, ``cudnn_tune`` and ``cudnn_off`` are
    checked and ignored (dnnbind picks and caches algorithms per shape, ops.algos); ``name`` is ignored.

    ``layout='NHWC'`` (MXNet's): data (N, H, W, C), weight (num_filter, kh, kw, C/num_group), y (N, H', W',
    num_filter), run by cuDNN on channels-last descriptors (no transposes). ``act_type="relu"`` (dnnbind's, what
    Gluon's Conv2D(activation='relu') passes) fuses the ReLU: one cudnnConvolutionBiasActivationForward (or backend-API
    plan) on the GPU (float32 or float16, with a bias); its backward is the ReLU's on the output (with the bias
    gradient in the same kernel pass on the GPU: ops.bias_relu_backward), then the convolution's backward; where the
    data needs no gradient and the filter has at most 32 taps (a first layer), dw and db come from one kernel on the
    GPU instead (ops.bias_relu_wgrad).
    """
    if kwargs:
        reject("Convolution", kwargs)
    try:  # the hot path: a call seen before (ParsedCalls says how it is keyed)
        key = (data._shape, weight._shape, data._dtype, data._device, None if bias is None else bias._shape,
               id(kernel), id(stride), id(dilate), id(pad), id(num_filter), id(num_group), id(workspace), id(no_bias),
               id(cudnn_off), layout, act_type, cudnn_tune)
        geo = _CONV_ARGS.get(key)
    except (AttributeError, TypeError):  # not NDArrays (numpy arrays, bad arguments), or an unhashable layout
        key = geo = None
    if geo is None:
        data, weight, bias, geo = _conv_args(data, weight, bias, kernel, stride, dilate, pad, num_filter, num_group,
                                             workspace, no_bias, cudnn_tune, cudnn_off, layout, act_type)
        if key is not None:
            _CONV_ARGS.put(key, geo, (kernel, stride, dilate, pad, num_filter, num_group, workspace, no_bias,
                                      cudnn_off))
    one_d, stride, pad, dilate, layout, fused = geo
    b = None if no_bias else bias
    if one_d:  # (N, C, W) as (N, C, 1, W), the weight (F, C/g, k) as (F, C/g, 1, k): recorded views
        n, c, w = data.shape
        y = _conv2d(data.reshape((n, c, 1, w)), weight.reshape(weight.shape[:2] + (1,) + weight.shape[2:]), b,
                    stride, pad, dilate, num_group, layout, fused)
        return into(out, y.reshape((n, y.shape[1], y.shape[3])))
    return into(out, _conv2d(data, weight, b, stride, pad, dilate, num_group, layout, fused))


def _conv_args(data, weight, bias, kernel, stride, dilate, pad, num_filter, num_group, workspace, no_bias,
               cudnn_tune, cudnn_off, layout, act_type):
    """Every check of nd.Convolution's arguments, in MXNet's order (parameters, then the arrays against them);
    returns the arrays and (one_d, stride, pad, dilate, layout, fused) for the 2-D path."""
    op = "Convolution"
    kernel, num_filter, num_group, no_bias = conv_params(op, kernel, num_filter, num_group, workspace, no_bias,
                                                         cudnn_tune, cudnn_off)
    if act_type not in (None, "relu"):
        raise DnnbindValueError(f"Convolution: act_type must be None or 'relu', got {act_type!r}")
    data = array_arg(op, "data", data)
    weight = array_arg(op, "weight", weight, data)
    if bias is not None:
        bias = array_arg(op, "bias", bias, data)
    dims = len(kernel)
    if dims == 3:
        raise NotImplementedError(f"Convolution: 3-D convolution (kernel {kernel}, data {data.shape}) is not "
                                  "supported by dnnbind")
    if dims not in (1, 2) or data.ndim != dims + 2:
        raise DnnbindValueError(f"Convolution: kernel {kernel} has {dims} spatial axes, so data must be "
                                f"{dims + 2}-D (N, C, {'W' if dims == 1 else 'H, W'}); got data {data.shape}")
    if dims == 1:
        if layout not in (None, "NCW"):
            kind = NotImplementedError if layout == "NWC" else DnnbindValueError
            raise kind(f"Convolution: layout must be 'NCW' for 3-D data {data.shape}, got {layout!r}")
        layout = "NCHW"
    else:
        layout = layout_arg(op, layout, data)
    if min(kernel) < 1:
        raise DnnbindValueError(f"Convolution: kernel must be >= 1 on every axis, got {kernel} (data {data.shape})")
    stride = spatial(op, "stride", shape_arg(op, "stride", stride), dims, 1, 1, data.shape)
    dilate = spatial(op, "dilate", shape_arg(op, "dilate", dilate), dims, 1, 1, data.shape)
    pad = spatial(op, "pad", shape_arg(op, "pad", pad), dims, 0, 0, data.shape)
    bias_matches(op, bias, no_bias, num_filter)
    nhwc = layout == "NHWC"
    c = data.shape[-1] if nhwc else data.shape[1]
    if c % num_group or num_filter % num_group:
        raise DnnbindValueError(f"Convolution: num_group {num_group} must divide the data's {c} channels and "
                                f"num_filter {num_filter} (data {data.shape})")
    want = (num_filter,) + kernel + (c // num_group,) if nhwc else (num_filter, c // num_group) + kernel
    wc = (weight.shape[-1] if nhwc else weight.shape[1]) if weight.ndim == dims + 2 else None
    if wc is not None and wc * num_group != c:
        raise DnnbindValueError(f"Convolution: data has {c} channels but weight {weight.shape} expects "
                                f"{wc * num_group} (num_group {num_group}, layout {layout}): data {data.shape}; "
                                f"expected weight {want}")
    if weight.shape != want:
        raise DnnbindValueError(f"Convolution: weight has shape {weight.shape} but data {data.shape} with kernel "
                                f"{kernel}, num_filter {num_filter}, num_group {num_group} (layout {layout}) needs "
                                f"{want}")
    if bias is not None and bias.shape != (num_filter,):
        raise DnnbindValueError(f"Convolution: bias has shape {bias.shape}; expected ({num_filter},) (num_filter)")
    size = data.shape[1:-1] if nhwc else data.shape[2:]
    padded = tuple(s + 2 * p for s, p in zip(size, pad))
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilate, kernel))
    if any(e > s for e, s in zip(span, padded)):
        raise DnnbindValueError(f"Convolution: kernel {kernel} with dilate {dilate} spans {span}, more than the "
                                f"padded input {padded} (data {data.shape}, pad {pad})")
    spatial_out = tuple((s - e) // st + 1 for s, e, st in zip(padded, span, stride))
    y_shape = (data.shape[0],) + (spatial_out + (num_filter,) if nhwc else (num_filter,) + spatial_out)
    context = f" (data {data.shape}, weight {weight.shape}, stride {stride}, pad {pad}, dilate {dilate})"
    check_fits(op, data._device, data.dtype, "the output", y_shape, context)
    n = data.shape[0]
    check_fits(op, data._device, data.dtype, "the padded input", (n,) + padded + (c,) if nhwc else (n, c) + padded,
               context)
    if dims == 1:
        stride, pad, dilate = (1,) + stride, (0,) + pad, (1,) + dilate
    return data, weight, bias, (dims == 1, stride, pad, dilate, layout, act_type == "relu")


def _conv2d(data, weight, b, stride, pad, dilate, num_group, layout, fused):
    """The 2-D convolution of parsed arguments (b None: no bias), taped."""
    y = None
    if fused and b is not None and data._data is None and data.dtype in _FUSED_DTYPES:
        key = (data.shape, weight.shape, data.dtype, stride, pad, dilate, num_group, layout)
        if key not in _UNFUSED:
            try:
                y = ops.conv_bias_relu_forward(data, weight, b, stride, pad, dilate, num_group, layout=layout)
            except CudnnError:  # float16 or NHWC: where cuDNN has no fused engine for the shape, the three calls
                # NOTE: cuDNN documents the legacy fused call for NCHW float32; NHWC float32 may have no engine.
                if data.dtype != np.float16 and layout == "NCHW":
                    raise
                _UNFUSED.add(key)
    if y is None:
        y = ops.conv_forward(data, weight, b, stride, pad, dilate, num_group, layout=layout)
        if fused:
            y = ops.activation_forward(y, "relu")
    if is_recording():
        x_shape, w_shape = data.shape, weight.shape

        saved = [y] if fused else []

        def backward(dy):
            db = None
            bias_grad = b is not None and needs_grad(b)
            if fused:  # relu'(z) from its output: y > 0 exactly where z > 0
                out = saved[0]
                if frees_graph():  # nothing reads y after this: its memory returns before the conv's backward
                    saved.clear()  # allocates (as an unfused ReLU node would free it), e.g. 84.5 MiB of AlexNet's
                if (SMALL_WGRAD_KERNEL and bias_grad and dy._data is None and needs_grad(weight)
                        and not needs_grad(data) and num_group == 1 and wgrad_fits(data, out, w_shape, layout)):
                    # GPU, a first layer (no dx) with few filter taps: dw and db in one kernel pass over x, y and
                    # dy (ops.bias_relu_wgrad), where cuDNN's backward-filter is slow at 1-3 input channels
                    return (None, *ops.bias_relu_wgrad(data, out, dy, w_shape, stride, pad, dilate, layout,
                                                       grad_out(weight), grad_out(b)))
                if bias_grad and RELU_BIAS_KERNEL and dy._data is None:
                    # GPU: the ReLU mask and the bias gradient in one pass over y and dy (ops.bias_relu), db
                    # straight into the Parameter's grad buffer when autograd allows
                    dy, db = ops.bias_relu_backward(out, dy, layout=layout, out=grad_out(b))
                else:
                    dy = ops.activation_backward(out, dy, out, "relu")
                del out
            dx = ops.conv_backward_data(weight, dy, x_shape, stride, pad, dilate, num_group, layout=layout) \
                if needs_grad(data) else None
            dw = None
            if needs_grad(weight):
                if dy._data is None:  # GPU: straight into the Parameter's grad buffer when autograd allows
                    dw = ops.conv_backward_filter.gpu(data, dy, w_shape, stride, pad, dilate, num_group,
                                                      out=grad_out(weight), layout=layout)
                else:
                    dw = ops.conv_backward_filter(data, dy, w_shape, stride, pad, dilate, num_group, layout=layout)
            if bias_grad and db is None:
                db = _conv_bias_grad(dy, b, layout)
            return dx, dw, db

        record_op("Convolution", y, (data, weight, b), backward)
    return y


def _conv_bias_grad(dy, b, layout="NCHW"):
    # On the GPU two gemv calls (GemmEx for float16) beat cudnnConvolutionBackwardBias (FACTS.md).
    # NOTE: ops.bias_relu.conv_backward_bias_kernel gives db in one kernel pass too; not yet timed against the
    # gemvs at ResNet sizes on a GPU, so the gemvs stay here (a fused conv's ReLU path uses the kernel).
    if dy._data is None:  # float16 too: cudnnConvolutionBackwardBias's half kernel is 2.3 ms of a ResNet-18 step
        return conv_backward_bias_gemv(dy, out=grad_out(b), layout=layout)
    return ops.conv_backward_bias(dy, layout=layout)


def FullyConnected(data=None, weight=None, bias=None, num_hidden=None, no_bias=False, flatten=True, out=None,
                   name=None, **kwargs):
    """y = x w^T + b (cublasSgemm_v2), MXNet's arguments: ``num_hidden`` required, weight (num_hidden, in), a bias
    (num_hidden,) unless ``no_bias=True``. ``flatten=True`` views (N, ...) data as (N, -1); ``flatten=False`` applies
    the layer to the last axis, (..., in) -> (..., num_hidden). ``name`` is ignored."""
    if kwargs:
        reject("FullyConnected", kwargs)
    try:  # the hot path: a call seen before (ParsedCalls says how it is keyed)
        key = (data._shape, weight._shape, None if bias is None else bias._shape, data._dtype, data._device,
               id(num_hidden), id(no_bias), id(flatten))
        shapes = _FC_ARGS.get(key)
    except AttributeError:  # not NDArrays
        key = shapes = None
    if shapes is None:
        data, weight, bias, shapes = _fc_args(data, weight, bias, num_hidden, no_bias, flatten)
        if key is not None:
            _FC_ARGS.put(key, shapes, (num_hidden, no_bias, flatten))
    x_shape, y_shape, no_bias = shapes
    x = data.reshape(x_shape) if data._shape != x_shape else data
    b = None if no_bias else bias
    y = ops.linear_forward(x, weight, b)
    if is_recording():
        record_op("FullyConnected", y, (x, weight, b), lambda dy: _linear_backward(x, weight, b, dy))
    return into(out, y.reshape(y_shape) if y.shape != y_shape else y)


_FC_ARGS = ParsedCalls()  # a call's arrays' shapes and its parameters -> (x's 2-D shape, y's shape, no_bias)


def _fc_args(data, weight, bias, num_hidden, no_bias, flatten):
    """Every check of nd.FullyConnected's arguments; returns the arrays and (x_shape, y_shape, no_bias)."""
    op = "FullyConnected"
    if num_hidden is None:
        raise required(op, "num_hidden", "int")
    num_hidden = int_arg(op, "num_hidden", num_hidden, 1)
    no_bias, flatten = bool_arg(op, "no_bias", no_bias), bool_arg(op, "flatten", flatten)
    data = array_arg(op, "data", data)
    weight = array_arg(op, "weight", weight, data)
    if bias is not None:
        bias = array_arg(op, "bias", bias, data)
    bias_matches(op, bias, no_bias, num_hidden)
    if data.ndim == 0:
        raise DnnbindValueError(f"{op}: data must have at least one axis, got a 0-d array")
    shape = data.shape
    if flatten:
        in_units = math.prod(shape[1:]) if data.ndim > 1 else 1
        x_shape, y_shape = (shape[0], in_units), (shape[0], num_hidden)
    else:
        in_units = shape[-1]
        x_shape, y_shape = (math.prod(shape[:-1]), in_units), shape[:-1] + (num_hidden,)
    if weight.ndim == 2 and weight.shape[0] == num_hidden and weight.shape[1] != in_units:
        raise DnnbindValueError(f"{op}: data {shape} has {in_units} features (flatten={flatten}) but weight "
                                f"{weight.shape} expects {weight.shape[1]}")
    if weight.shape != (num_hidden, in_units):
        raise DnnbindValueError(f"{op}: weight has shape {weight.shape} but data {shape} (flatten={flatten}) with "
                                f"num_hidden {num_hidden} needs ({num_hidden}, {in_units})")
    if bias is not None and bias.shape != (num_hidden,):
        raise DnnbindValueError(f"{op}: bias has shape {bias.shape}; expected ({num_hidden},) (num_hidden)")
    check_fits(op, data._device, data.dtype, "the output", y_shape, f" (data {shape}, weight {weight.shape})")
    return data, weight, bias, (x_shape, y_shape, no_bias)


def _linear_backward(x, w, b, dy):
    if x._data is not None:
        dx, dw, db = ops.linear_backward(x, w, dy, bias=b is not None)
        return (dx if needs_grad(x) else None), dw, db
    # GPU: only the gradients needed (the first layer's dx is skipped): 1-3 cuBLAS calls.
    n, k = x.shape
    units, dtype, h = w.shape[0], x.dtype, blas(x)
    dx = dw = db = None
    if needs_grad(x):
        dx = empty((n, k), dtype, x.device)
        gemm_into(h, dy._ptr, w._ptr, dx._ptr, n, k, units, False, False, 1.0, 0.0, dtype)
    if needs_grad(w):
        dw = grad_out(w)
        if dw is None:
            dw = empty((units, k), dtype, x.device)
        gemm_into(h, dy._ptr, x._ptr, dw._ptr, units, k, n, True, False, 1.0, 0.0, dtype)
    if b is not None and needs_grad(b):
        db = grad_out(b)
        if db is None:
            db = empty((units,), dtype, x.device)
        sum_rows_into(h, dy._ptr, ones_vector(x.device, n, dtype)._ptr, db._ptr, n, units, 1.0, 0.0, dtype)
    return dx, dw, db


# -- activations, pooling, softmax ----------------------------------------------------------------------------

_TABLE_ACT = ("relu", "sigmoid", "softrelu", "softsign", "tanh")  # MXNet's act_type values, each a table op


def Activation(data=None, act_type=None, out=None, name=None, **kwargs):
    """MXNet's Activation: ``act_type`` (required) relu, sigmoid, tanh (cudnnActivationForward/Backward through the
    table's entries), softrelu, softsign (generated kernels); float data only. ``name`` is ignored."""
    if kwargs:
        reject("Activation", kwargs)
    if act_type is None:
        raise required("Activation", "act_type", "int")
    choice_arg("Activation", "act_type", act_type, _TABLE_ACT)
    data = array_arg("Activation", "data", data)
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"Activation: data must be a floating-point array, got {data.dtype} (shape "
                               f"{data.shape}); use .astype('float32')")
    from ._registry import call
    return into(out, call(act_type, data))


def _softmax(data, axis, algorithm, temperature=None):
    from ._registry import as_array, norm_axes
    data = as_array("softmax", "data", data)
    axis = norm_axes("softmax", data.ndim, axis)[0]
    if temperature is not None and temperature != 1.0:
        data = data / float(temperature)
    cudnn_ok = data.dtype.kind == "f" and ((axis == 1 and data.ndim == 4) or (axis == data.ndim - 1
                                                                              and data.ndim >= 2))
    if not cudnn_ok:  # any other axis or rank: composed of table ops (max, exp, sum), gradient included
        shifted = data - _call("max", data, axis=axis, keepdims=True)
        if algorithm == "log":
            return shifted - _call("log", _call("sum", _call("exp", shifted), axis=axis, keepdims=True))
        e = _call("exp", shifted)
        return e / _call("sum", e, axis=axis, keepdims=True)
    if axis == 1 and data.ndim == 4:
        x, mode, shape = data, "channel", None
    else:  # softmax over the last axis: view as (rows, C) and use cuDNN's instance mode
        shape = data.shape
        x, mode = data.reshape((-1, shape[-1])) if data.ndim != 2 else data, "instance"
    y = ops.softmax_forward(x, algorithm, mode)
    if is_recording():
        record_op("softmax", y, (x,), lambda dy: (ops.softmax_backward(y, dy, algorithm, mode),))
    return y.reshape(shape) if shape is not None and len(shape) != 2 else y


def _call(name, *args, **params):
    from ._registry import call
    return call(name, *args, **params)


_SOFTMAX_DTYPES = ("float16", "float32", "float64")


def _softmax_args(op, data, length, axis, temperature, dtype, use_length, kwargs):
    """MXNet's softmax parameters: an int axis, a number or None temperature, the output dtype (None: data's)."""
    if kwargs:
        reject(op, kwargs)
    if bool_arg(op, "use_length", use_length) or length is not None:
        raise NotImplementedError(f"{op}: use_length/length (masking by per-row lengths) is not supported by dnnbind")
    axis = int_arg(op, "axis", axis)
    if temperature is not None:
        temperature = float_arg(op, "temperature", temperature)
    dtype = dtype_name(op, dtype, _SOFTMAX_DTYPES)
    data = array_arg(op, "data", data)
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape}); "
                               "use .astype('float32')")
    return data, axis, temperature, dtype


def softmax(data=None, length=None, axis=-1, temperature=None, dtype=None, use_length=False, out=None, name=None,
            **kwargs):
    """MXNet's softmax over ``axis``: cudnnSoftmaxForward(ACCURATE) over the last axis or axis 1 of NCHW; other
    axes compose table ops. ``temperature`` divides the data first; ``dtype`` (float16/32/64) is the output's
    dtype; ``length``/``use_length`` are not supported. ``name`` is ignored."""
    data, axis, temperature, dtype = _softmax_args("softmax", data, length, axis, temperature, dtype, use_length,
                                                   kwargs)
    y = _softmax(data, axis, "accurate", temperature)
    return into(out, y if dtype is None or y.dtype == dtype else _call("cast", y, dtype=np.dtype(dtype)))


def log_softmax(data=None, length=None, axis=-1, temperature=None, dtype=None, use_length=False, out=None,
                name=None, **kwargs):
    """MXNet's log_softmax: cudnnSoftmaxForward(LOG); the arguments are softmax's."""
    data, axis, temperature, dtype = _softmax_args("log_softmax", data, length, axis, temperature, dtype, use_length,
                                                   kwargs)
    y = _softmax(data, axis, "log", temperature)
    return into(out, y if dtype is None or y.dtype == dtype else _call("cast", y, dtype=np.dtype(dtype)))


def softmax_cross_entropy(logits, labels):
    """Per-sample -log softmax(logits)[label]: cuDNN log-softmax + a gather kernel; backward (p - onehot) * dl.
    float16 logits (a network cast to float16) are cast to float32 first, taped: the loss and its softmax are
    computed in float32, as mixed precision keeps them (MXNet's AMP lists softmax losses as float32 ops)."""
    if getattr(logits, "dtype", None) == np.float16:
        logits = _call("cast", logits, dtype="float32")
    loss = ops.softmax_cross_entropy(logits, labels)
    if is_recording():
        record_op("softmax_cross_entropy", loss, (logits, None),
                  lambda dl: (ops.softmax_cross_entropy_backward(logits, labels, dl), None))
    return loss


def pick_nll(logp, labels):
    """Per-sample -logp[label] (NLL on log-probabilities)."""
    loss = ops.nll_loss(logp, labels)
    if is_recording():
        record_op("nll_loss", loss, (logp, None), lambda dl: (ops.nll_loss_backward(logp, labels, dl), None))
    return loss


def add_n(*args, num_args=None, out=None, name=None, **kwargs):
    """Sum of several arrays of one shape and dtype (MXNet's add_n / ElementWiseSum): a chain of table adds.
    ``num_args``, if given, must be the number of arrays (MXNet sets it itself). ``name`` is ignored."""
    if kwargs:
        reject("add_n", kwargs)
    if num_args is not None and int_arg("add_n", "num_args", num_args, 1) != len(args):
        raise DnnbindValueError(f"add_n: num_args={num_args} but {len(args)} array(s) were given")
    if not args:
        raise DnnbindValueError("add_n: needs at least one array (value 0 for Parameter num_args should be greater "
                                "equal to 1)")
    arrays = [array_arg("add_n", f"args[{i}]", a, None) for i, a in enumerate(args)]
    first = arrays[0]
    for i, a in enumerate(arrays[1:], 1):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise DnnbindValueError(f"add_n: args[{i}] is {a.shape} {a.dtype} but args[0] is {first.shape} "
                                    f"{first.dtype}; every array must have the same shape and dtype")
    total = first if len(arrays) > 1 or out is not None else first.copy()  # always a new array, like MXNet
    for a in arrays[1:]:
        total = total + a
    return into(out, total)


def reshape_like(lhs, rhs):
    return lhs.reshape(rhs.shape)


def Flatten(data=None, out=None, name=None, **kwargs):
    """MXNet's Flatten: (N, ...) -> (N, prod(...)) as a view; 1-D (N,) -> (N, 1). ``name`` is ignored."""
    if kwargs:
        reject("Flatten", kwargs)
    data = array_arg("Flatten", "data", data)
    if data.ndim == 0:
        raise DnnbindValueError("Flatten: data must have at least one axis, got a 0-d array")
    return into(out, data.reshape((data.shape[0], math.prod(data.shape[1:]))))


def Dropout(data=None, p=0.5, mode="training", axes=(), cudnn_off=False, out=None, name=None, **kwargs):
    """MXNet's Dropout: inverted dropout (keep with probability 1 - p, scale by 1/(1-p)) inside
    ``autograd.train_mode()``/``record()`` or with ``mode="always"``; the identity otherwise, and for p = 0.

    On a GPU cudnnDropoutForward, its backward cudnnDropoutBackward on the saved reserve (ops.dropout); on the
    cpu numpy. ``axes`` (variational dropout): one mask of the shape of ``data`` with those axes set to 1, drawn
    the same way (dropout of ones) and broadcast-multiplied, so the mask is shared along ``axes`` (MXNet's
    BernoulliKernel + broadcast mul); its gradient is the table's multiply. Seeds come from dnnbind's one random
    state (nd.random), so ``mx.random.seed(n)`` makes runs repeatable. ``cudnn_off`` (None, a bool) and ``name``
    are accepted and ignored. Unlike MXNet, p = 1 is refused (it would drop everything).
    """
    from ._registry import norm_axes
    from .random import generation, next_seed
    if kwargs:
        reject("Dropout", kwargs)
    if not (isinstance(mode, str) and mode in ("training", "always")):
        raise (DnnbindValueError if isinstance(mode, str) else DnnbindTypeError)(
            f"Dropout: mode must be 'training' or 'always', got {mode!r}")
    p = dropout_p("Dropout", p)
    if cudnn_off is not None:
        bool_arg("Dropout", "cudnn_off", cudnn_off)
    data = array_arg("Dropout", "data", data)
    if out is not None:
        return into(out, Dropout(data, p, mode, axes))
    if p == 0 or not (mode == "always" or is_training()):
        return data
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"Dropout: data must be a floating-point array, got {data.dtype} (shape "
                               f"{data.shape})")
    if axes is not None and not isinstance(axes, (tuple, list)):
        axes = (axes,)
    if axes:
        shared = norm_axes("Dropout", data.ndim, tuple(axes))
        mask_shape = tuple(1 if i in shared else d for i, d in enumerate(data.shape))
        mask = _dropout.dropout_mask(mask_shape, data.dtype, data.device, p, next_seed, generation())
        return data * mask  # recorded by the table's multiply: d/ddata = dy * mask
    y, reserve = _dropout.dropout_forward(data, p, next_seed, generation())
    if is_recording():
        record_op("Dropout", y, (data,), lambda dy: (_dropout.dropout_backward(dy, reserve, p),))
    return y


def waitall():
    from ..runtime.stream import synchronize
    from ..runtime.device import num_gpus, gpu
    for i in range(num_gpus()):
        synchronize(gpu(i))


# -- batch normalization --------------------------------------------------------------------------------------

from .._lib.errors import CudnnBadParam, CudnnNotSupported
from ..ops import batchnorm as _bn
from ..ops import batchnorm_fused as _bn_ex
from ..ops.blas import fill as _fill
from ..ops.reference.batchnorm import bn_shapes as _bn_shapes
from ..runtime.array import zeros as _zeros


_NO_EX: set = set()  # (shape, dtype) the Ex call refused: the legacy call from then on


def _nhwc_ex(data, gamma, layout: str) -> bool:
    """Whether training BatchNorm takes cuDNN's Ex call (ops.batchnorm_fused.batchnorm_nhwc_*): channels-last float16
    GPU data in the persistent mode, where the legacy call's NHWC kernel is 50-100x slower (ResNet-18 float16 on an
    H100: 16 ms of a 21 ms step). Other cases keep the legacy call."""
    return (layout == "NHWC" and data._device.kind == "gpu" and _bn.TRAIN_MODE == _bn_ex.MODE
            and _bn_ex.fusable(data.shape, data.dtype, gamma.dtype) and (data.shape, data.dtype) not in _NO_EX)


def BatchNorm(data=None, gamma=None, beta=None, moving_mean=None, moving_var=None, eps=1e-3, momentum=0.9,
              fix_gamma=True, use_global_stats=False, output_mean_var=False, axis=1, cudnn_off=False,
              min_calib_range=None, max_calib_range=None, out=None, name=None, **kwargs):
    """MXNet 1.x's ``BatchNorm`` operator (defaults from src/operator/nn/batch_norm-inl.h: eps 1e-3,
    momentum 0.9, fix_gamma True). Spatial batch norm over ``axis``: 1, or the last axis of 4-D data (MXNet's
    channels-last ``axis=3``/``-1``, run by cuDNN on an NHWC descriptor); any other axis goes through a transpose.

    - Training (``autograd.is_training()`` and not ``use_global_stats``): batch statistics,
      cudnnBatchNormalizationForwardTraining on a GPU; ``moving_mean``/``moving_var`` are updated IN PLACE,
      ``moving = momentum * moving + (1 - momentum) * batch`` with the biased batch variance (MXNet's kernels).
      NOTE: MXNet's CPU/CUDA kernels update them in the backward pass, its cuDNN path in the forward; dnnbind
      updates in the forward (so also under ``train_mode()`` without ``record()``). After forward + backward
      the values agree with MXNet's.
    - Otherwise: the moving statistics (cudnnBatchNormalizationForwardInference; composed of table ops when
      recording, so the gradient is the plain affine one).
    - ``fix_gamma``: gamma is set to 1 IN PLACE (as MXNet does) and its gradient is 0.
    - ``output_mean_var``: also returns the mean and the INVERSE standard deviation used (MXNet's outputs).
    Needs > 1 value per channel for batch statistics (MXNet would then normalize with variance 0).
    ``cudnn_off``, ``name`` and the quantization calibration ``min_calib_range``/``max_calib_range`` are accepted
    and ignored. ``out`` takes the normalized output.
    """
    from ._registry import call, norm_axes
    data, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma, use_global_stats, output_mean_var, axis = \
        _bn_args("BatchNorm", kwargs, data, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma,
                 use_global_stats, output_mean_var, axis, cudnn_off, min_calib_range, max_calib_range)
    if out is not None:
        res = BatchNorm(data, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma, use_global_stats,
                        output_mean_var, axis)
        return (into(out, res[0]),) + tuple(res[1:]) if output_mean_var else into(out, res)
    ax = norm_axes("BatchNorm", data.ndim, axis)[0] if data.ndim else axis
    perm, layout = None, "NHWC" if ax == 3 and data.ndim == 4 else "NCHW"
    if ax != 1 and data.ndim >= 2 and layout == "NCHW":  # channels to axis 1, and back (the transposes have grads)
        perm = [i for i in range(data.ndim) if i != ax]
        perm.insert(1, ax)
        data = call("transpose", data, axes=tuple(perm))
    _bn_shapes("BatchNorm", data.shape, layout, gamma=gamma.shape, beta=beta.shape, moving_mean=moving_mean.shape,
               moving_var=moving_var.shape)
    if fix_gamma:
        _fill(gamma, 1.0)
    if is_training() and not use_global_stats:
        ex = _nhwc_ex(data, gamma, layout)
        if ex:
            try:
                y, mean, inv_std, reserve = _bn_ex.batchnorm_nhwc_forward_training(data, gamma, beta, moving_mean,
                                                                                   moving_var, momentum, eps)
            except (CudnnNotSupported, CudnnBadParam):  # refused before any work: the legacy call from now on
                _NO_EX.add((data.shape, data.dtype))
                ex = False
        if not ex:
            y, mean, inv_std = _bn.batchnorm_forward_training(data, gamma, beta, moving_mean, moving_var, momentum,
                                                              eps, layout=layout)
        if is_recording():
            x = data

            def backward(dy):
                if ex:
                    dx, dgamma, dbeta = _bn_ex.batchnorm_nhwc_backward(x, dy, gamma, beta, mean, inv_std, reserve,
                                                                       eps)
                else:
                    dx, dgamma, dbeta = _bn.batchnorm_backward(x, dy, gamma, mean, inv_std, eps, layout=layout)
                if fix_gamma:
                    dgamma = _zeros(dgamma.shape, dgamma.dtype, dgamma.device)
                return dx, dgamma, dbeta

            record_op("BatchNorm", y, (x, gamma, beta), backward)
    else:
        inv_std = None
        if is_recording() and any(needs_grad(a) for a in (data, gamma, beta)):
            bshape = (1, 1, 1, data.shape[3]) if layout == "NHWC" else (1, data.shape[1]) + (1,) * (data.ndim - 2)
            inv_std = call("rsqrt", moving_var + float(eps))
            g = gamma * 0.0 + 1.0 if fix_gamma else gamma  # fix_gamma: gamma's gradient is 0, like MXNet's
            y = (data - moving_mean.reshape(bshape)) * (g * inv_std).reshape(bshape) + beta.reshape(bshape)
        else:
            y = _bn.batchnorm_forward_inference(data, gamma, beta, moving_mean, moving_var, eps, layout=layout)
        if output_mean_var:
            mean = moving_mean.copy()
            if inv_std is None:
                inv_std = call("rsqrt", moving_var + float(eps))
    if perm is not None:
        y = call("transpose", y, axes=tuple(int(i) for i in np.argsort(perm)))
    return (y, mean, inv_std) if output_mean_var else y


def _bn_args(op, kwargs, data, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma, use_global_stats,
             output_mean_var, axis, cudnn_off, min_calib_range, max_calib_range, declared=None) -> tuple:
    """BatchNorm's (and BatchNormAddRelu's) arguments checked as MXNet parses them: the arrays (gamma and the moving
    statistics are updated in place, so they must be NDArrays), the numbers, the flags."""
    if kwargs:
        reject(op, kwargs, declared)
    data = array_arg(op, "data", data)
    gamma, beta, moving_mean, moving_var = (array_arg(op, n, a, data, numpy_ok=False) for n, a in (
        ("gamma", gamma), ("beta", beta), ("moving_mean", moving_mean), ("moving_var", moving_var)))
    eps, momentum = float_arg(op, "eps", eps), float_arg(op, "momentum", momentum)
    fix_gamma, use_global_stats, output_mean_var = (bool_arg(op, n, v) for n, v in (
        ("fix_gamma", fix_gamma), ("use_global_stats", use_global_stats), ("output_mean_var", output_mean_var)))
    bool_arg(op, "cudnn_off", cudnn_off)
    axis = int_arg(op, "axis", axis)
    for n, v in (("min_calib_range", min_calib_range), ("max_calib_range", max_calib_range)):
        if v is not None:
            float_arg(op, n, v)
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape})")
    return data, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma, use_global_stats, output_mean_var, \
        axis


__all__.append("BatchNorm")
