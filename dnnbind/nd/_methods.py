"""Layer nd: NDArray's operators and methods, installed on the runtime's class (which never imports nd).

Imports runtime and nd. Operators go straight to ``invoke`` with the op's record (one dict lookup less than the
``nd.*`` functions): ``a + b`` is one table dispatch and, on the GPU, one generated kernel launch.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numbers

import numpy as np

from .. import autograd
from ..runtime.array import NDArray
from ..runtime.device import Device
from . import _indexing, _shape, _sort
from ._registry import REGISTRY, invoke

_NO_PARAMS: dict = {}


def _operand(other) -> bool:
    return isinstance(other, (NDArray, numbers.Number, np.number, np.bool_, np.ndarray, list))


def _binary(name: str, reverse: bool = False):
    op = REGISTRY[name]
    if reverse:
        def method(self, other):
            return invoke(op, (other, self), _NO_PARAMS) if _operand(other) else NotImplemented
    else:
        def method(self, other):
            return invoke(op, (self, other), _NO_PARAMS) if _operand(other) else NotImplemented
    method.__name__ = name
    return method


def _inplace(name: str):
    op = REGISTRY[name]

    def method(self, other):
        if autograd.thread_state.__dict__.get("recording"):
            autograd.check_write(self, other)  # MXNet refuses x op= y on arrays of the recorded graph
        result = invoke(op, (self, other), _NO_PARAMS)
        if result.shape != self.shape:
            raise DnnbindValueError(f"{name} in place: the result's shape {result.shape} differs from the array's "
                             f"{self.shape} (broadcasting cannot grow an array in place)")
        self.copy_(result)
        return self
    return method


def _method(fn, nd_name):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__ = nd_name
    return method


def _data(op: str, x) -> NDArray:
    from ._registry import as_array
    return x if type(x) is NDArray else as_array(op, "data", x)


def _astype(self, dtype, copy: bool = True):
    self = _data("cast", self)
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biuf":
        raise DnnbindTypeError(f"cast: dtype must be a numeric dtype (float16, float32, float64, uint8, int8, int32, "
                               f"int64, bool), got {dtype!r}")
    dtype = dt
    if dtype == self.dtype and not copy:
        return self
    return invoke(REGISTRY["cast"], (self,), {"dtype": dtype})


def _wait_to_read(self):
    if self.on_gpu:
        from ..runtime.stream import current_stream
        current_stream(self.device).synchronize()


def _iter(self):
    if self.ndim == 0:
        raise DnnbindTypeError("iteration over a 0-d NDArray")
    for i in range(self.shape[0]):
        yield self[i]


def _reduce(self):
    return (_rebuild, (self.numpy(), self.device.kind, self.device.index))


def _rebuild(host, kind, index):
    from ..runtime.array import array
    from ..runtime.device import num_gpus
    dev = Device(kind, index) if kind == "cpu" or index < num_gpus() else Device("cpu", 0)
    return array(host, device=dev)


def install(ns: dict) -> None:
    # Operators.
    for dunder, name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                         ("div", "divide"), ("mod", "modulo"), ("pow", "power")):
        setattr(NDArray, f"__{dunder}__", _binary(name))
        setattr(NDArray, f"__r{dunder}__", _binary(name, reverse=True))
        setattr(NDArray, f"__i{dunder}__", _inplace(name))
    for dunder, name in (("eq", "equal"), ("ne", "not_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                         ("lt", "lesser"), ("le", "lesser_equal")):
        setattr(NDArray, f"__{dunder}__", _binary(name))
    NDArray.__hash__ = object.__hash__
    NDArray.__neg__ = lambda self: invoke(REGISTRY["negative"], (self,), _NO_PARAMS)
    NDArray.__abs__ = lambda self: invoke(REGISTRY["abs"], (self,), _NO_PARAMS)
    NDArray.__getitem__ = _indexing.getitem
    NDArray.__setitem__ = _indexing.setitem
    NDArray.__iter__ = _iter
    NDArray.__reduce__ = _reduce
    # Methods: every table op that declares method names, then the composites MXNet has as methods.
    for op in REGISTRY.values():
        for m in op.methods:
            setattr(NDArray, m, _method(ns[op.nd_names[0]] if op.nd_names else None, m))
    for m in ("reshape", "expand_dims", "squeeze", "swapaxes", "broadcast_like", "broadcast_axes", "split",
              "tile", "repeat", "slice", "slice_axis", "flip", "one_hot", "pick", "sort", "argsort", "topk", "norm",
              "relu", "sigmoid", "tanh", "exp", "log", "softmax", "log_softmax"):
        setattr(NDArray, m, _method(ns[m], m))
    # more of MXNet 1.9.1's NDArray methods, each where dnnbind has the operator (GluonCV's CenterNet decoder
    # calls x.shape_array())
    for m in ("shape_array", "size_array", "reshape_like", "slice_like", "softmin", "diag", "pad", "fix",
              "depth_to_space", "space_to_depth", "argmax_channel", "split_v2"):
        if m in ns and not hasattr(NDArray, m):
            setattr(NDArray, m, _method(ns[m], m))
    NDArray.flatten = lambda self: _shape.flatten(self)
    NDArray.T = property(lambda self: invoke(REGISTRY["transpose"], (self,), _NO_PARAMS))
    NDArray.astype = _astype
    from ..runtime.array import register_cast_into
    from . import _lower
    register_cast_into(lambda src, out: _lower.copy_strided(src, _lower.contiguous_strides(src.shape), 0, src.shape,
                                                            out=out))
    NDArray.as_in_ctx = NDArray.as_in_context
    NDArray.wait_to_read = _wait_to_read
    NDArray.wait_to_write = _wait_to_read
    NDArray.stype = property(lambda self: "default")
    NDArray.zeros_like = lambda self: ns["zeros_like"](self)
    NDArray.ones_like = lambda self: ns["ones_like"](self)
    NDArray.asscalar = _asscalar
    NDArray.asnumpy = _asnumpy


class HostArray(np.ndarray):
    """What ``NDArray.asnumpy()`` returns: a numpy array that, like numpy < 1.25 did, converts to a Python
    number when it has one element. NOTE: MXNet 1.x's full reductions have shape (1,), and its users' code
    formats them directly (d2l: ``'loss %f' % l.mean().asnumpy()``), which numpy 2 refuses for 1-d arrays."""

    def __float__(self):
        return float(self.reshape(()).view(np.ndarray)) if self.size == 1 else float(self.view(np.ndarray))

    def __int__(self):
        return int(self.reshape(()).view(np.ndarray)) if self.size == 1 else int(self.view(np.ndarray))

    def __index__(self):
        return int(self) if self.size == 1 and self.dtype.kind in "iub" else self.view(np.ndarray).__index__()


def _asnumpy(self):
    return self.numpy().view(HostArray)


def _asscalar(self):
    if self.size != 1:
        raise DnnbindValueError(f"asscalar: the array must have exactly one element, it has shape {self.shape}")
    return self.numpy().reshape(()).item() if self.dtype.kind != "f" else self.dtype.type(self.numpy().reshape(()))

