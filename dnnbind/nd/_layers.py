"""Layer nd: the hand-written ops (convolution, dense, activation, pooling, softmax, losses, dropout) as
forward/backward pairs. Imports ops, autograd, runtime.

Each function runs the functional op (cuDNN/cuBLAS on a GPU, numpy on the cpu) and, inside
``autograd.record()``, tapes a closure that calls the op's library backward (cudnnConvolutionBackwardData/
Filter/Bias, cudnnActivationBackward, cudnnPoolingBackward, cudnnSoftmaxBackward, cublasSgemm_v2, or an op's
NVRTC kernel: ops.bias_relu_backward, 2x2 max pooling): the backward sits right beside its forward. The
element-wise, reduction and shape ops are table entries (_table.py and siblings), not functions here.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

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

__all__ = ["Activation", "Convolution", "Dropout", "Flatten", "FullyConnected", "Pooling", "add_n", "log_softmax",
           "pick_nll", "reshape_like", "softmax", "softmax_cross_entropy", "waitall"]


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v), int(v))


# -- convolution and dense ------------------------------------------------------------------------------------

_FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
RELU_BIAS_KERNEL = True  # False: a fused conv's backward takes cudnnActivationBackward + gemv (tests compare)
SMALL_WGRAD_KERNEL = True  # False: a first layer's dw, db take bias_relu_backward + cuDNN as well (tests compare)
_UNFUSED: set = set()  # float16 or NHWC shapes cuDNN could not fuse (the legacy call refused, no backend plan)


def _layout(opname: str, layout, data) -> str:
    """MXNet's ``layout`` argument of Convolution/Pooling on 4-D data: None (NCHW), 'NCHW' or 'NHWC'."""
    if layout is None:
        return "NCHW"
    if isinstance(layout, str) and layout in ("NCHW", "NHWC"):
        return layout
    kind = ValueError if isinstance(layout, str) else TypeError
    raise kind(f"{opname}: layout must be 'NCHW' or 'NHWC' (data {tuple(data.shape)}), got {layout!r}")


def Convolution(data, weight, bias=None, kernel=None, stride=(1, 1), pad=(0, 0), dilate=(1, 1), num_filter=None,
                num_group=1, no_bias=False, act_type=None, layout=None, **_ignored):
    """y = conv(x, w) + b (cudnnConvolutionForward + cudnnAddTensor).

    ``layout='NHWC'`` (MXNet's): data (N, H, W, C), weight (num_filter, kh, kw, C/num_group), y (N, H', W',
    num_filter), run by cuDNN on channels-last descriptors (no transposes). ``act_type="relu"`` fuses the ReLU:
    one cudnnConvolutionBiasActivationForward (or backend-API plan) on the GPU (float32 or float16, with a bias);
    its backward is the ReLU's on the output (with the bias gradient in the same kernel pass on the GPU:
    ops.bias_relu_backward), then the convolution's backward; where the data needs no gradient and the filter has at
    most 32 taps (a first layer), dw and db come from one kernel on the GPU instead (ops.bias_relu_wgrad).
    """
    b = None if no_bias else bias
    stride, pad, dilate = _pair(stride), _pair(pad), _pair(dilate)
    layout = _layout("Convolution", layout, data)
    fused = act_type == "relu"
    if act_type not in (None, "relu"):
        raise DnnbindValueError(f"Convolution: act_type must be None or 'relu', got {act_type!r}")
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


def FullyConnected(data, weight, bias=None, num_hidden=None, no_bias=False, flatten=True, **_ignored):
    """y = x w^T + b (cublasSgemm_v2); flatten=True views (N, ...) input as (N, -1) like MXNet."""
    x = data.reshape((data.shape[0], -1)) if (flatten and data.ndim != 2) else data
    b = None if no_bias else bias
    y = ops.linear_forward(x, weight, b)
    if is_recording():
        record_op("FullyConnected", y, (x, weight, b), lambda dy: _linear_backward(x, weight, b, dy))
    return y


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

_ACT = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "elu": "elu", "clipped_relu": "clipped_relu"}


_TABLE_ACT = ("relu", "sigmoid", "tanh", "softrelu", "softsign")


def Activation(data, act_type="relu", coef=0.0, **_ignored):
    """MXNet's Activation: relu, sigmoid, tanh (cudnnActivationForward/Backward through the table's entries),
    softrelu, softsign (generated kernels); elu and clipped_relu (with ``coef``) call cuDNN directly."""
    if act_type in _TABLE_ACT and not coef:
        from ._registry import call
        return call(act_type, data)
    mode = _ACT.get(act_type)
    if mode is None:
        raise DnnbindValueError(f"Activation: unknown act_type {act_type!r}; expected one of "
                         f"{', '.join(_TABLE_ACT + ('elu', 'clipped_relu'))}")
    y = ops.activation_forward(data, mode, coef)
    if is_recording():
        record_op("Activation", y, (data,), lambda dy: (ops.activation_backward(y, dy, data, mode, coef),))
    return y


def Pooling(data, kernel=(1, 1), pool_type="max", stride=None, pad=(0, 0), global_pool=False,
            pooling_convention="valid", count_include_pad=True, layout=None, **_ignored):
    """cudnnPoolingForward; backward cudnnPoolingBackward. MXNet arguments; ``layout='NHWC'``: 4-D data
    (N, H, W, C) pooled over H and W by cuDNN on channels-last descriptors. 1-D input and
    ``pooling_convention='full'`` (ceil) go through ``_nn_extra.pooling_ext``, which calls back here."""
    if data.ndim == 4:
        layout = _layout("Pooling", layout, data)
    if pooling_convention != "valid" or data.ndim != 4:
        from ._nn_extra import pooling_ext
        return pooling_ext(Pooling, data, kernel, pool_type, stride, pad, global_pool, pooling_convention,
                           count_include_pad, layout)
    if global_pool:
        kernel = stride = data.shape[2:] if layout == "NCHW" else data.shape[1:3]
        pad = (0, 0)
    mode = {"max": "max", "avg": "avg" if count_include_pad else "avg_exclude_pad"}.get(pool_type)
    if mode is None:
        raise DnnbindValueError(f"Pooling: pool_type must be 'max' or 'avg', got {pool_type!r}")
    window, stride, pad = _pair(kernel), _pair(stride if stride is not None else kernel), _pair(pad)
    y = ops.pooling_forward(data, mode, window, stride, pad, layout=layout)
    if is_recording():
        record_op("Pooling", y, (data,),
                  lambda dy: (ops.pooling_backward(y, dy, data, mode, window, stride, pad, layout=layout),))
    return y


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


def softmax(data, axis=-1, temperature=None, **_ignored):
    """cudnnSoftmaxForward(ACCURATE) over the last axis or axis 1 of NCHW; other axes compose table ops."""
    return _softmax(data, axis, "accurate", temperature)


def log_softmax(data, axis=-1, temperature=None, **_ignored):
    """cudnnSoftmaxForward(LOG)."""
    return _softmax(data, axis, "log", temperature)


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


def add_n(*args, **_ignored):
    """Sum of several same-shape arrays (MXNet's add_n / ElementWiseSum): a chain of table adds."""
    if not args:
        raise DnnbindValueError("add_n: needs at least one array")
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out


def reshape_like(lhs, rhs):
    return lhs.reshape(rhs.shape)


def Flatten(data):
    return data.reshape((data.shape[0], -1))


def Dropout(data, p=0.5, mode="training", axes=(), cudnn_off=None, **_ignored):
    """MXNet's Dropout: inverted dropout (keep with probability 1 - p, scale by 1/(1-p)) inside
    ``autograd.train_mode()``/``record()`` or with ``mode="always"``; the identity otherwise, and for p = 0.

    On a GPU cudnnDropoutForward, its backward cudnnDropoutBackward on the saved reserve (ops.dropout); on the
    cpu numpy. ``axes`` (variational dropout): one mask of the shape of ``data`` with those axes set to 1, drawn
    the same way (dropout of ones) and broadcast-multiplied, so the mask is shared along ``axes`` (MXNet's
    BernoulliKernel + broadcast mul); its gradient is the table's multiply. Seeds come from dnnbind's one random
    state (nd.random), so ``mx.random.seed(n)`` makes runs repeatable. ``cudnn_off`` is accepted and ignored.
    """
    from ._registry import as_array, norm_axes
    from .random import generation, next_seed
    if mode not in ("training", "always"):
        raise DnnbindValueError(f"Dropout: mode must be 'training' or 'always', got {mode!r}")
    p = dropout_p("Dropout", p)
    data = as_array("Dropout", "data", data)
    if p == 0 or not (mode == "always" or is_training()):
        return data
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


def BatchNorm(data, gamma, beta, moving_mean, moving_var, eps=1e-3, momentum=0.9, fix_gamma=True,
              use_global_stats=False, output_mean_var=False, axis=1, cudnn_off=False, **_ignored):
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
    ``cudnn_off`` is accepted and ignored.
    """
    from ._registry import as_array, call, norm_axes
    data = as_array("BatchNorm", "data", data)
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


__all__.append("BatchNorm")
