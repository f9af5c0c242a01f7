"""MXNet's output layers: ``SoftmaxOutput``, ``LinearRegressionOutput``, ``LogisticRegressionOutput``,
``MAERegressionOutput`` and ``MakeLoss``, what ``mx.mod.Module`` and symbol files ending in one of them train with.

Their backward is their own, not the derivative of their forward (``loss=True``), and, as MXNet's, it ignores the
gradient that arrives from above: SoftmaxOutput's forward is a softmax and its backward gives the data
(softmax - one_hot(label)) scaled; a regression output's forward is the identity (a sigmoid for the logistic one)
and its backward (output - label), or sign(output - label) for MAE, times grad_scale / (outputs per sample);
MakeLoss's forward is the identity and its backward grad_scale, normalized. The label gets no gradient. A
regression label has the data's first dimension and number of elements (MXNet's check; (N,) for (N, 1) data when
a graph leaves its shape to inference).

SoftmaxOutput as MXNet 1.9.1 computes it:
- three forms: per position over axis 1 (``multi_output``, label (N, *spatial) or (N, 1, *spatial)); over the
  last axis (``preserve_shape``, and 2-D data; label data.shape[:-1]); else over everything after the batch axis,
  with the first N labels (of a label shaped data.shape[:-1]) as the classes. 1-D data, which has no class axis,
  is refused (MXNet's answer for it is a softmax over one class: ones);
- float labels mark the class they truncate to (MXNet casts them), as does ``ignore_label``; a label outside
  [0, classes) marks none. ``smooth_alpha`` puts 1 - alpha on the class and alpha / (classes - 1) elsewhere;
  ``use_ignore`` zeroes the rows of ignored labels;
- ``normalization``: 'null' scales by grad_scale (divided by the positions per sample with ``multi_output``),
  'batch' by grad_scale / label.size, 'valid' by grad_scale / the labels (all of the label) that are not
  ``ignore_label`` (at least 1), whether or not ``use_ignore`` is set;
- ``out_grad`` multiplies the gradient by the gradient from above, as MXNet documents it. (MXNet 1.9.1 itself
  multiplies by the op's output there: its backward node is given the output, not the head gradient.)
MakeLoss's 'batch' divides by the product of all but the last dimension (MXNet flattens the data to 2-D keeping
the last axis), 'valid' by the count of data > ``valid_thresh`` (at least 1).

On a GPU each is composed of the table's ops and the registered softmax (``ops.opdef.table``, untaped, no kernel
of its own); the cpu twin is numpy. Checked against MXNet 1.9.1 in tests/test_output_layers.py.
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import NDArray, array, empty, zeros
from ..opdef import Lowering, OpDef, define, table, view

_LABEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # others are compared as float64: exact class ids


def _check_data(op: str, data) -> None:
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype} (shape {data.shape}); "
                               "use .astype('float32')")


def _check_label(op: str, label) -> None:
    if label.dtype.kind not in "iuf":
        raise DnnbindTypeError(f"{op}: label must be a real-valued array, got {label.dtype} (shape {label.shape})")


def _as(x: NDArray, shape: tuple) -> NDArray:
    return x if x.shape == shape else view(x, shape)


def _cast(x: NDArray, dtype) -> NDArray:
    return x if x.dtype == dtype else table("cast", x, dtype=dtype)


def _prefix(x: NDArray, n: int) -> NDArray:
    """The first ``n`` elements of a C-contiguous array, without a copy (SoftmaxOutput's flat form reads only the
    first N labels)."""
    if not x.on_gpu:
        return NDArray._from_numpy(x._data.reshape(-1)[:n])
    return NDArray._from_ptr(x.ptr, (n,), x.dtype, x.device, x._owner)


_CLASSES: dict = {}  # (classes, dtype, device) -> arange(classes) there: one upload per shape seen, not per step


def _classes(k: int, dtype, device) -> NDArray:
    key = (k, dtype, device)
    a = _CLASSES.get(key)
    if a is None:
        if len(_CLASSES) >= 64:
            _CLASSES.clear()
        a = _CLASSES[key] = array(np.arange(k, dtype=dtype), device=device)
    return a


# SoftmaxOutput --------------------------------------------------------------------------------------------------

class Geometry:
    __slots__ = ("shape", "x_shape", "axis", "k", "rows", "lab_shape", "cls_shape", "scale", "valid", "ignore",
                 "use_ignore", "smooth", "out_grad", "label_dtype")


def _softmax_prepare(p, data, label):
    _check_data("SoftmaxOutput", data)
    _check_label("SoftmaxOutput", label)
    shape, multi = tuple(data.shape), p["multi_output"]
    if len(shape) < 2:
        raise DnnbindValueError(f"SoftmaxOutput: data must have a batch axis and a class axis (2-D or more), got "
                                f"shape {shape}")
    n = shape[0]
    want = (n, *shape[2:]) if multi else shape[:-1]
    if tuple(label.shape) != want and not (multi and tuple(label.shape) == (n, 1, *shape[2:])):
        also = f" or {(n, 1, *shape[2:])}" if multi else ""
        raise DnnbindValueError(f"SoftmaxOutput: label has shape {tuple(label.shape)}, expected {want}{also} for "
                                f"data {shape} (multi_output={multi})")
    g = Geometry()
    flat = not multi and not p["preserve_shape"] and len(shape) > 2
    g.shape, g.x_shape = shape, (n, math.prod(shape[1:])) if flat else shape
    g.axis = 1 if multi else len(g.x_shape) - 1
    g.k, g.rows = g.x_shape[g.axis], n if flat else None
    g.lab_shape = tuple(1 if i == g.axis else d for i, d in enumerate(g.x_shape))  # the label beside the classes
    g.cls_shape = tuple(g.k if i == g.axis else 1 for i in range(len(g.x_shape)))
    if not math.isfinite(p["ignore_label"]):
        raise DnnbindValueError(f"SoftmaxOutput: ignore_label must be a finite number, got {p['ignore_label']}")
    g.ignore, g.use_ignore, g.out_grad = int(p["ignore_label"]), p["use_ignore"], p["out_grad"]  # MXNet's int cast
    norm, scale = p["normalization"], p["grad_scale"]
    g.valid = norm == "valid"
    if norm == "null":
        g.scale = scale / (max(math.prod(shape[2:]), 1) if multi else 1)
    elif norm == "batch":
        g.scale = scale / max(label.size, 1)
    else:
        g.scale = scale  # divided by the count of valid labels, known only when the backward runs
    alpha = p["smooth_alpha"]
    g.smooth = None
    if alpha:
        if g.k < 2:
            raise DnnbindValueError(f"SoftmaxOutput: smooth_alpha spreads alpha over the other classes, but data "
                                    f"{shape} has {g.k} class")
        g.smooth = (1.0 - alpha, alpha / (g.k - 1))  # on the class, elsewhere
    g.label_dtype = label.dtype if label.dtype in _LABEL_DTYPES else np.dtype(np.float64)
    return g


def _softmax_infer(p, shapes):
    data = tuple(shapes[0])
    want = (data[0], *data[2:]) if p["multi_output"] else data[:-1]
    label = shapes[1] if len(shapes) > 1 else None
    if p["multi_output"] and label is not None and tuple(label) == (data[0], 1, *data[2:]):
        want = tuple(label)  # MXNet takes this form too
    return [data, want], [data]


def _np_softmax(x, axis):
    xf = x.astype(np.float32) if x.dtype == np.float16 else x
    e = np.exp(xf - xf.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def _softmax_cpu_forward(c, x, label):
    g = c.geo
    y = _np_softmax(x.reshape(g.x_shape), g.axis)
    return y.reshape(g.shape), (y, label)


def _softmax_cpu_backward(c, saved, grads, dy):
    if not grads.needs[0]:
        return None, None
    g, (y, label) = c.geo, saved
    lab = np.trunc(label.astype(g.label_dtype, copy=False))
    rows = (lab.reshape(-1)[:g.rows] if g.rows is not None else lab).reshape(g.lab_shape)
    hot = (rows == np.arange(g.k, dtype=lab.dtype).reshape(g.cls_shape)).astype(y.dtype)
    if g.smooth is not None:
        on, off = g.smooth
        hot = hot * y.dtype.type(on - off) + y.dtype.type(off)
    grad = y - hot
    if g.use_ignore:
        grad = grad * (rows != g.ignore).astype(y.dtype)
    scale = g.scale / max(np.count_nonzero(lab != g.ignore), 1) if g.valid else g.scale
    grad = grad * y.dtype.type(scale)
    if g.out_grad:
        grad = grad * dy.reshape(g.x_shape).astype(y.dtype, copy=False)
    return grad.astype(y.dtype, copy=False).reshape(g.shape), None


def _softmax_gpu_forward(c, x, label):
    g = c.geo
    y = table("softmax", _as(x, g.x_shape), axis=g.axis)
    return _as(y, g.shape), (y, label)


def _softmax_gpu_backward(c, saved, grads, dy):
    if not grads.needs[0]:
        return None, None
    g, (y, label) = c.geo, saved
    lab = table("trunc", _cast(label, g.label_dtype))
    rows = _as(_prefix(lab, g.rows) if g.rows is not None else lab, g.lab_shape)
    # the one-hot as a broadcast comparison of (.., 1, ..) labels with (1, .., k, .., 1) class ids
    hot = _cast(table("equal", rows, view(_classes(g.k, lab.dtype, lab.device), g.cls_shape)), y.dtype)
    if g.smooth is not None:
        on, off = g.smooth
        hot = table("add", table("multiply", hot, on - off), off)
    grad = table("subtract", y, hot)
    if g.use_ignore:
        grad = table("multiply", grad, _cast(table("not_equal", rows, float(g.ignore)), y.dtype))
    if g.valid:  # grad_scale / max(count, 1) in the label's precision, then the data's (MXNet's DType(scale))
        count = table("maximum", table("sum", table("not_equal", lab, float(g.ignore))), 1.0)
        grad = table("multiply", grad, _cast(table("divide", g.scale, count), y.dtype))
    else:
        grad = table("multiply", grad, g.scale)
    if g.out_grad:
        grad = table("multiply", grad, _cast(_as(dy, g.x_shape), y.dtype))
    return _as(grad, g.shape), None


def _softmax_samples(rng):
    def labels(shape, k):
        return rng.integers(0, k, shape).astype(np.float64)

    x = rng.standard_normal
    lab = labels((4,), 5)
    lab[3] = -1  # outside the classes: marks none
    yield {"data": x((4, 5)), "label": lab}, {}
    yield {"data": x((4, 5)), "label": labels((4,), 5)}, {"grad_scale": 0.5, "normalization": "batch"}
    yield ({"data": x((4, 5)), "label": np.array([2.0, 0.0, 2.0, 4.0])},
           {"use_ignore": True, "ignore_label": 2, "normalization": "valid", "smooth_alpha": 0.1})
    yield {"data": x((2, 3, 4)), "label": labels((2, 4), 3)}, {"multi_output": True, "normalization": "valid",
                                                                  "ignore_label": 1}
    yield ({"data": x((2, 3, 2, 2)), "label": labels((2, 1, 2, 2), 3)},
           {"multi_output": True, "use_ignore": True, "ignore_label": 0, "normalization": "batch"})
    yield {"data": x((2, 3, 4)), "label": labels((2, 3), 4)}, {"preserve_shape": True, "out_grad": True}
    yield {"data": x((2, 3, 4)), "label": labels((2, 3), 4)}, {"normalization": "valid", "ignore_label": 3}


define(OpDef("SoftmaxOutput", prepare=_softmax_prepare, infer=_softmax_infer, samples=_softmax_samples,
             cpu=Lowering(_softmax_cpu_forward, _softmax_cpu_backward),
             gpu=Lowering(_softmax_gpu_forward, _softmax_gpu_backward), nograd=("label",), loss=True,
             doc="MXNet's SoftmaxOutput: the softmax of ``data``; its backward gives ``data`` the gradient of "
                 "cross-entropy with ``label`` (class indices), normalized as ``normalization`` says."))


# the regression outputs ----------------------------------------------------------------------------------------

def _regression_prepare_for(op: str):
    def prepare(p, data, label):
        _check_data(op, data)
        _check_label(op, label)
        if data.ndim == 0 or label.ndim == 0 or label.shape[0] != data.shape[0] or label.size != data.size:
            raise DnnbindValueError(f"{op}: label has shape {tuple(label.shape)}, data {tuple(data.shape)}: the same "
                                    "number of elements and the same first (batch) dimension are needed")
        per_row = data.size // data.shape[0] if data.shape[0] else 1  # MXNet scales by 1 / outputs per sample
        return p["grad_scale"] / max(per_row, 1)
    return prepare


def _regression_infer(p, shapes):
    data = tuple(shapes[0])
    label = shapes[1] if len(shapes) > 1 else None
    if (label is not None and len(label) and all(d > 0 for d in label) and label[0] == data[0]
            and math.prod(label) == math.prod(data)):
        return [data, tuple(label)], [data]  # any label of the data's batch size and size (MXNet's check)
    return [data, (data[0],) if len(data) == 2 and data[1] == 1 else data], [data]  # MXNet's default: (N,) for (N, 1)


def _np_sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


_REGRESSIONS = {  # op -> (numpy forward, numpy gradient of (output, label), table forward, table gradient)
    "LinearRegressionOutput": (np.copy, np.subtract, None, "subtract"),
    "LogisticRegressionOutput": (_np_sigmoid, np.subtract, "sigmoid", "subtract"),
    "MAERegressionOutput": (np.copy, lambda y, t: np.sign(y - t), None, "sign"),
}


def _regression_lowerings(op: str):
    np_forward, np_grad, forward, grad = _REGRESSIONS[op]

    def cpu_forward(c, x, label):
        y = np_forward(x)
        return y, (y, label)

    def cpu_backward(c, saved, grads, dy):
        if not grads.needs[0]:
            return None, None
        y, label = saved
        return (np_grad(y, label.reshape(y.shape).astype(y.dtype, copy=False)) * y.dtype.type(c.geo)).astype(
            y.dtype, copy=False), None

    def gpu_forward(c, x, label):
        y = empty(x.shape, x.dtype, x.device).copy_(x) if forward is None else table(forward, x)
        return y, (y, label)

    def gpu_backward(c, saved, grads, dy):
        if not grads.needs[0]:
            return None, None
        y, label = saved
        d = table("subtract", y, _cast(_as(label, y.shape), y.dtype))
        return table("multiply", d if grad == "subtract" else table(grad, d), c.geo), None

    return Lowering(cpu_forward, cpu_backward), Lowering(gpu_forward, gpu_backward)


def _regression_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3)), "label": rng.random((4, 3))}, {}
    yield {"data": x((2, 3, 4)), "label": rng.random((2, 12))}, {"grad_scale": 2.0}
    yield {"data": x((4, 1)), "label": rng.random((4,))}, {"grad_scale": 0.5}


for _op in _REGRESSIONS:
    _cpu, _gpu = _regression_lowerings(_op)
    define(OpDef(_op, prepare=_regression_prepare_for(_op), infer=_regression_infer, samples=_regression_samples,
                 cpu=_cpu, gpu=_gpu, nograd=("label",), loss=True,
                 doc=f"MXNet's {_op}: the forward as shown; its backward gives ``data`` its own regression gradient "
                     "times grad_scale / (outputs per sample), whatever comes from above."))


# MakeLoss -------------------------------------------------------------------------------------------------------

def _make_loss_prepare(p, data):
    _check_data("MakeLoss", data)
    norm, scale = p["normalization"], p["grad_scale"]
    if norm == "batch":  # MXNet flattens the data to 2-D keeping the last axis: its "batch" is all the others
        scale = scale / max(math.prod(data.shape[:-1]), 1)
    return scale, (p["valid_thresh"] if norm == "valid" else None), tuple(data.shape), data.dtype


def _make_loss_infer(p, shapes):
    return [shapes[0]], [shapes[0]]


def _make_loss_cpu_forward(c, x):
    y = x.copy()
    return y, (y if c.geo[1] is not None else None)


def _make_loss_cpu_backward(c, y, grads, dy):
    scale, thresh, shape, dtype = c.geo
    if thresh is not None:
        scale = scale / max(np.count_nonzero(y > thresh), 1)
    return (np.full(shape, scale, dtype),)


def _make_loss_gpu_forward(c, x):
    y = empty(x.shape, x.dtype, x.device).copy_(x)
    return y, (y if c.geo[1] is not None else None)


def _make_loss_gpu_backward(c, y, grads, dy):
    scale, thresh, shape, dtype = c.geo
    if thresh is not None:  # counted in float32 at least: a float16 sum stops counting at 2048
        over = table("greater", y, thresh)
        count = table("maximum", table("sum", _cast(over, np.dtype(np.float32)) if dtype == np.float16 else over),
                      1.0)
        scale = _cast(table("divide", scale, count), dtype)
    return (table("add", zeros(shape, dtype, c.device), scale),)


def _make_loss_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3))}, {}
    yield {"data": x((2, 3, 4))}, {"grad_scale": 0.5, "normalization": "batch"}
    yield {"data": x((4, 3))}, {"normalization": "valid", "valid_thresh": 0.2, "grad_scale": 3.0}


define(OpDef("MakeLoss", prepare=_make_loss_prepare, infer=_make_loss_infer, samples=_make_loss_samples,
             cpu=Lowering(_make_loss_cpu_forward, _make_loss_cpu_backward),
             gpu=Lowering(_make_loss_gpu_forward, _make_loss_gpu_backward), loss=True,
             doc="MXNet's MakeLoss: ``data`` itself as a loss; its backward gives ``data`` grad_scale (normalized), "
                 "whatever comes from above."))
