"""Layer nd: MXNet's output layers, ``nd.SoftmaxOutput``, ``LinearRegressionOutput``, ``LogisticRegressionOutput``,
``MAERegressionOutput`` and ``MakeLoss``. Imports nd, autograd.

Their gradient is their own, not the gradient of their forward: SoftmaxOutput's forward is a softmax, and its
backward gives the data (softmax - one_hot(label)) scaled, whatever gradient arrives from above (as MXNet's, unless
``out_grad``). That is what ``mx.mod.Module`` and symbol files ending in one of them train with. Each is its forward
made of nd ops (so any device runs it) and a backward taped with ``autograd.record_op``; checked against MXNet
1.9.1's outputs and gradients in tests/test_output_layers.py.
"""

from __future__ import annotations

from .. import autograd
from .._lib.errors import DnnbindValueError
from ..runtime.array import NDArray
from . import _params
from ._creation import ones_like
from ._indexing import one_hot
from ._registry import call as _call
from ._shape import expand_dims

__all__ = ["SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput", "MAERegressionOutput", "MakeLoss"]


def SoftmaxOutput(data=None, label=None, grad_scale=1.0, ignore_label=-1.0, multi_output=False, use_ignore=False,
                  preserve_shape=False, normalization="null", out_grad=False, smooth_alpha=0.0, out=None,
                  name=None, **kwargs):
    """softmax of ``data`` (over axis 1 with ``multi_output``, else over the last axis); its backward gives
    ``data`` the gradient of cross-entropy with ``label`` (class indices), as MXNet's SoftmaxOutput."""
    _params.reject("SoftmaxOutput", kwargs)
    data = _params.array_arg("SoftmaxOutput", "data", data)
    label = _params.array_arg("SoftmaxOutput", "label", label, like=data)
    normalization = _params.choice_arg("SoftmaxOutput", "normalization", normalization, ("batch", "null", "valid"))
    multi_output, use_ignore, preserve_shape = bool(multi_output), bool(use_ignore), bool(preserve_shape)
    want = (data.shape[0], *data.shape[2:]) if multi_output else data.shape[:-1]
    if tuple(label.shape) != tuple(want):
        raise DnnbindValueError(f"SoftmaxOutput: label has shape {label.shape}, expected {tuple(want)} for data "
                                f"{data.shape} (multi_output={multi_output})")
    # MXNet 1.9.1's three forms: per position over axis 1 (multi_output); over the last axis (preserve_shape, and
    # 2-D data); else over everything after the batch axis, with the first batch-size labels as the classes
    flat = not multi_output and not preserve_shape and data.ndim > 2
    x = data.reshape((data.shape[0], -1)) if flat else data
    lab = label.reshape((-1,))[:data.shape[0]] if flat else label
    axis = 1 if multi_output else -1
    with autograd.pause():
        y = _call("softmax", x, axis=axis)
    spatial = data.size // (data.shape[0] * data.shape[1]) if multi_output else 1

    def backward(g):
        with autograd.pause():
            grad = _softmax_grad(y, lab, x.shape[axis], multi_output, use_ignore, ignore_label, smooth_alpha,
                                 normalization, float(grad_scale), spatial, data.shape[0])
            if out_grad:
                grad = grad * (g.reshape(grad.shape) if flat else g)
        return (grad.reshape(data.shape) if flat else grad), None

    out_y = y.reshape(data.shape) if flat else y
    return _params.into(out, autograd.record_op("SoftmaxOutput", out_y, (data, label), backward))


def _softmax_grad(y, label, k, multi_output, use_ignore, ignore_label, smooth_alpha, normalization, grad_scale,
                  spatial, batch):
    """(softmax - target) scaled as MXNet's SoftmaxOutput scales it: 'null' by grad_scale (divided by the
    positions per sample with multi_output), 'batch' also by the batch size, 'valid' by the labels not ignored."""
    hot = one_hot(label, k, dtype=y.dtype)
    if multi_output:  # one_hot appends the class axis: (n, ..., k) -> (n, k, ...)
        hot = _call("transpose", hot, axes=(0, hot.ndim - 1, *range(1, hot.ndim - 1)))
    if smooth_alpha:  # MXNet's label smoothing: 1 - alpha on the class, alpha / (k - 1) elsewhere
        hot = hot * (1.0 - smooth_alpha - smooth_alpha / (k - 1)) + smooth_alpha / (k - 1)
    grad = y - hot
    count = float(label.size)
    if use_ignore:
        keep = (label != ignore_label).astype(y.dtype)
        grad = grad * expand_dims(keep, axis=1 if multi_output else keep.ndim)
        count = keep.sum()
    if normalization == "valid":
        if isinstance(count, NDArray):
            return grad * grad_scale / _call("maximum", count, 1.0).reshape((1,) * grad.ndim)
        return grad * (grad_scale / max(count, 1.0))
    scale = grad_scale / spatial
    return grad * (scale / batch if normalization == "batch" else scale)


def _regression(op: str, forward, gradient):
    def layer(data=None, label=None, grad_scale=1.0, out=None, name=None, **kwargs):
        _params.reject(op, kwargs)
        data = _params.array_arg(op, "data", data)
        label = _params.array_arg(op, "label", label, like=data)
        if label.size != data.size:
            raise DnnbindValueError(f"{op}: label has shape {label.shape}, data {data.shape}: the same number of "
                                    "elements is needed")
        label_as_data = label.reshape(data.shape)
        with autograd.pause():
            y = forward(data)

        def backward(g):
            with autograd.pause():
                per_row = data.size // data.shape[0] if data.ndim else 1  # MXNet scales by 1 / outputs per sample
                return gradient(y, label_as_data) * (float(grad_scale) / per_row), None
        return _params.into(out, autograd.record_op(op, y, (data, label), backward))
    layer.__name__ = layer.__qualname__ = op
    layer.__doc__ = f"MXNet's {op}: the forward as shown, the backward its own regression gradient."
    return layer


LinearRegressionOutput = _regression("LinearRegressionOutput", lambda x: x.copy(), lambda y, t: y - t)
LogisticRegressionOutput = _regression("LogisticRegressionOutput", lambda x: _call("sigmoid", x), lambda y, t: y - t)
MAERegressionOutput = _regression("MAERegressionOutput", lambda x: x.copy(), lambda y, t: _call("sign", y - t))


def MakeLoss(data=None, grad_scale=1.0, valid_thresh=0.0, normalization="null", out=None, name=None, **kwargs):
    """``data`` itself as a loss: its backward gives ``data`` grad_scale (normalized), whatever arrives."""
    _params.reject("MakeLoss", kwargs)
    data = _params.array_arg("MakeLoss", "data", data)
    normalization = _params.choice_arg("MakeLoss", "normalization", normalization, ("batch", "null", "valid"))
    with autograd.pause():
        y = data.copy()

    def backward(g):
        with autograd.pause():
            ones = ones_like(data) * float(grad_scale)
            if normalization == "batch":
                return ones / data.shape[0],
            if normalization == "valid":
                valid = (data > valid_thresh).astype(data.dtype).sum()
                return ones / _call("maximum", valid, 1.0),
            return ones,
    return _params.into(out, autograd.record_op("MakeLoss", y, (data,), backward))
