"""Layer nd: MXNet 1.x's ``Deconvolution`` (transposed convolution), 1-D and 2-D, NCW/NCHW. Imports ops, autograd.

The forward is ``ops.deconv_forward`` (cudnnConvolutionBackwardData on a GPU); inside ``autograd.record()`` it
tapes a backward beside it: dx by ``ops.deconv_backward_data`` (cudnnConvolutionForward), dw by
``ops.deconv_backward_filter`` (cudnnConvolutionBackwardFilter, x and dy exchanged), db as for Convolution.
1-D data (N, C, W) runs the 2-D path on a (N, C, 1, W) view, as Conv1D does, with the weight (C, F/g, k) viewed
as (C, F/g, 1, k); the views are recorded reshapes, so their gradients come back in the caller's shapes.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

from .. import ops
from ..autograd import grad_out, is_recording, needs_grad, record_op
from ..ops._check import as_tuple
from ._layers import _conv_bias_grad
from ._params import array_arg, check_fits, conv_params, into, reject, shape_arg

__all__ = ["Deconvolution"]

_LAYOUTS = {1: "NCW", 2: "NCHW"}


def Deconvolution(data=None, weight=None, bias=None, kernel=None, stride=None, dilate=None, pad=None, adj=None,
                  target_shape=None, num_filter=None, num_group=1, workspace=512, no_bias=True, cudnn_tune=None,
                  cudnn_off=False, layout=None, out=None, name=None, **kwargs):
    """MXNet's ``Deconvolution`` (src/operator/nn/deconvolution-inl.h): weight (in_channels,
    num_filter/num_group, *kernel); out = (in-1)*stride - 2*pad + dilate*(kernel-1) + 1 + adj per spatial axis,
    0 <= adj < stride. ``target_shape`` (all axes > 0) replaces pad and adj as MXNet's InferPad does: with
    t = stride*(in-1) + dilate*(kernel-1) + 1 - target, pad = ceil(t/2) and adj = t % 2.

    MXNet's parameters, in its order: ``kernel`` and ``num_filter`` are required and must agree with the weight;
    stride and dilate 1, pad and adj 0 by default (an int is a 1-tuple, as in MXNet: one value per spatial axis);
    no_bias=True (a bias must come with no_bias=False). ``workspace``, ``cudnn_tune``, ``cudnn_off`` and ``name`` are
    checked and ignored (dnnbind times algorithms per shape); ``out`` takes the result.
    """
    op = "Deconvolution"
    if kwargs:
        reject(op, kwargs)
    kernel, num_filter, num_group, no_bias = conv_params(op, kernel, num_filter, num_group, workspace, no_bias,
                                                         cudnn_tune, cudnn_off)
    data = array_arg(op, "data", data)
    weight = array_arg(op, "weight", weight, data)
    if bias is not None:
        bias = array_arg(op, "bias", bias, data)
    if len(kernel) != data.ndim - 2 and data.ndim - 2 in _LAYOUTS:
        raise DnnbindValueError(f"Deconvolution: kernel {kernel} has {len(kernel)} spatial axes but data {data.shape} "
                                f"has {data.ndim - 2}")
    for name_, v in (("stride", stride), ("dilate", dilate), ("pad", pad), ("adj", adj),
                     ("target_shape", target_shape)):
        v = shape_arg(op, name_, v)
        if v is not None and len(v) != len(kernel):
            raise DnnbindValueError(f"Deconvolution: {name_} {v} has {len(v)} value(s) but the kernel {kernel} has "
                                    f"{len(kernel)}; give one per spatial axis")
    return into(out, _deconvolution(data, weight, bias, kernel, stride, dilate, pad, adj, target_shape, num_filter,
                                     num_group, no_bias, layout))


def _deconvolution(data, weight, bias, kernel, stride, dilate, pad, adj, target_shape, num_filter, num_group,
                   no_bias, layout):
    dims = data.ndim - 2
    if dims not in _LAYOUTS:
        raise DnnbindValueError(f"Deconvolution: data must be 3-D (N, C, W) or 4-D (N, C, H, W), got shape {data.shape}"
                         + (" (3-D deconvolution is not supported)" if dims == 3 else ""))
    if layout is not None and layout != _LAYOUTS[dims]:
        raise NotImplementedError(f"Deconvolution: only layout={_LAYOUTS[dims]!r} is supported for {data.ndim}-D "
                                  f"data (cuDNN's native layout), got {layout!r}")
    kernel = _check_weight(data, weight, kernel, num_filter, num_group, dims)
    if no_bias and bias is not None:
        raise DnnbindValueError("Deconvolution: a bias was given but no_bias=True (MXNet's default for Deconvolution); "
                         "pass no_bias=False to add it")
    if not no_bias and bias is None:
        raise DnnbindValueError("Deconvolution: no_bias=False needs a bias (num_filter,)")
    stride, dilate = _axes(stride, 1, dims, "stride"), _axes(dilate, 1, dims, "dilate")
    pad, adj = _axes(pad, 0, dims, "pad"), _axes(adj, 0, dims, "adj")
    if _axes(target_shape, 0, dims, "target_shape") != (0,) * dims:  # MXNet: all zeros (its default) = unset
        pad, adj = _infer_pad(data.shape[2:], kernel, stride, dilate, target_shape, dims)
    if any(a >= s for a, s in zip(adj, stride)):
        raise DnnbindValueError(f"Deconvolution: adj {adj} must be smaller than stride {stride} (MXNet's rule)")
    spatial_out = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1 + a
                        for i, s, p, d, k, a in zip(data.shape[2:], stride, pad, dilate, kernel, adj))
    check_fits("Deconvolution", data._device, data.dtype, "the output", (data.shape[0], num_filter) + spatial_out,
               f" (data {data.shape}, weight {weight.shape}, stride {stride}, pad {pad}, dilate {dilate}, adj {adj})")
    x, w = data, weight
    if dims == 1:  # (N, C, W) as (N, C, 1, W); the weight (C, F/g, k) as (C, F/g, 1, k)
        x = data.reshape((data.shape[0], data.shape[1], 1, data.shape[2]))
        w = weight.reshape(weight.shape[:2] + (1,) + weight.shape[2:])
        stride, dilate, pad, adj = (1,) + stride, (1,) + dilate, (0,) + pad, (0,) + adj
    y = _deconv2d(x, w, bias, stride, pad, dilate, num_group, adj)
    return y.reshape((y.shape[0], y.shape[1], y.shape[3])) if dims == 1 else y


def _axes(value, default: int, dims: int, name: str) -> tuple:
    """An MXNet shape argument: None or () (MXNet's empty default) is ``default`` on every axis; each value at
    least 1 for stride and dilate, 0 for the others."""
    if value is None or (isinstance(value, (tuple, list)) and len(value) == 0):
        return (default,) * dims
    return as_tuple(value, dims, "Deconvolution", name, 1 if name in ("stride", "dilate") else 0)


def _check_weight(data, weight, kernel, num_filter, num_group, dims) -> tuple:
    """The weight against the data and the arguments (messages in the caller's shapes, 1-D included)."""
    layout = "(in_channels, num_filter/num_group, " + ("k)" if dims == 1 else "kh, kw)")
    if weight.ndim != dims + 2:
        raise DnnbindValueError(f"Deconvolution: weight must be {dims + 2}-D {layout} for {dims + 2}-D data; got weight "
                         f"{weight.shape}, data {data.shape}")
    if weight.shape[0] != data.shape[1]:
        raise DnnbindValueError(f"Deconvolution: data has {data.shape[1]} channels but weight {weight.shape} expects "
                         f"{weight.shape[0]} (weight is {layout}); data {data.shape}")
    if kernel is not None and as_tuple(kernel, dims, "Deconvolution", "kernel", 1) != weight.shape[2:]:
        raise DnnbindValueError(f"Deconvolution: kernel {kernel} but weight {weight.shape} has kernel {weight.shape[2:]}")
    if num_filter is not None and int(num_filter) != weight.shape[1] * num_group:
        raise DnnbindValueError(f"Deconvolution: num_filter {num_filter} but weight {weight.shape} with num_group "
                         f"{num_group} gives {weight.shape[1] * num_group} (weight is {layout})")
    return tuple(weight.shape[2:])


def _infer_pad(spatial, kernel, stride, dilate, target_shape, dims) -> tuple[tuple, tuple]:
    """MXNet's DeconvolutionParam::InferPad: the pad and adj that give ``target_shape``."""
    target = as_tuple(target_shape, dims, "Deconvolution", "target_shape", 1)
    pad, adj = [], []
    for i in range(dims):
        total = stride[i] * (spatial[i] - 1) + dilate[i] * (kernel[i] - 1) + 1 - target[i]
        if total < 0:
            raise DnnbindValueError(f"Deconvolution: target_shape {target} is too big: at most "
                             f"{target[i] + total} on axis {i} for input {tuple(spatial)}")
        pad.append((total + 1) // 2)
        adj.append(total % 2)
    return tuple(pad), tuple(adj)


def _deconv2d(x, w, b, stride, pad, dilate, groups, adj):
    y = ops.deconv_forward(x, w, b, stride, pad, dilate, groups, adj)
    if is_recording():
        x_shape, w_shape = x.shape, w.shape

        def backward(dy):
            dx = ops.deconv_backward_data(w, dy, x_shape, stride, pad, dilate, groups) if needs_grad(x) else None
            dw = None
            if needs_grad(w):  # on a GPU straight into the Parameter's grad buffer when autograd allows
                into = {"out": grad_out(w)} if dy._data is None else {}
                dw = ops.deconv_backward_filter(x, dy, w_shape, stride, pad, dilate, groups, **into)
            db = _conv_bias_grad(dy, b) if b is not None and needs_grad(b) else None
            return dx, dw, db

        record_op("Deconvolution", y, (x, w, b), backward)
    return y
