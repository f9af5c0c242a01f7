"""``mx.operator``: operators written in Python (MXNet 1.x's CustomOp / CustomOpProp / register, run by
``nd.Custom(*inputs, op_type=...)`` and ``sym.Custom``). Layer: beside autograd (imports autograd and runtime, in
the functions that need them); the alias serves it as ``mxnet.operator``, nd.Custom and the symbol executor call
``invoke`` lazily.

What one call does, as MXNet 1.9.1 does it (src/operator/custom/custom.cc, python/mxnet/operator.py):

1. the registered ``CustomOpProp`` subclass is made with the call's keyword arguments *as strings*
   (``nd.Custom(x, op_type='t', scale=2.5)`` calls ``Prop(scale='2.5')``), once per call;
2. ``list_arguments``/``list_outputs``/``list_auxiliary_states`` say how many arrays go in and out (the inputs
   are the arguments, then the auxiliary states); ``infer_shape`` and ``infer_type`` give the outputs' shapes and
   dtypes (numpy type classes in and out);
3. ``create_operator(ctx, in_shapes, in_dtypes)`` (shapes as lists, dtypes as MXNet's type flags: 0 float32,
   1 float64, ...) makes the ``CustomOp``; its ``forward(is_train, req, in_data, out_data, aux)`` fills the
   freshly allocated (uninitialized) outputs, usually through ``self.assign(dst, req, src)``;
4. under ``autograd.record()`` the call is one node of the tape: ``backward(req, out_grad, in_data, out_data,
   in_grad, aux)`` runs when the gradient reaches it, with zero-filled ``in_grad`` arrays, req ``'write'`` for the
   inputs that take a gradient and ``'null'`` for the others, zeros for an output no gradient reached, and the
   auxiliary states get none. Arrays left out by ``declare_backward_dependency`` are not kept for the backward
   (MXNet passes empty arrays there; here they are None), so a loss-like op with ``need_top_grad=False`` does
   not hold its output gradient.

The Python code of forward and backward runs with autograd paused (MXNet runs it on its custom-op thread, outside
the recording), in the training mode of the call, ``with ctx:`` the inputs' device.

An exception raised inside ``forward`` or ``backward`` becomes a ``CustomOpError`` (an ``MXNetError`` under the
alias, as MXNet raises) whose text starts with MXNet's "Error in CustomOp.forward:" and carries the callback's
traceback; the original is its ``__cause__``. MXNet raises it at the next read of an output (its engine runs the
callback later); dnnbind runs ops eagerly, so it is raised by the call itself. Differences from MXNet: an exception
inside infer_shape or infer_type propagates as itself; storage types other than dense do not exist here, so
infer_storage_type is never consulted.
"""

from __future__ import annotations

from ._lib.errors import DnnbindError, DnnbindTypeError, DnnbindValueError

import threading
import traceback
from typing import Any, Callable

import numpy as np

__all__ = ["CustomOp", "CustomOpProp", "register", "get_all_registered_operators", "invoke"]

# MXNet's type flags (mshadow), what create_operator receives as in_dtypes
_TYPE_FLAGS = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2, np.dtype(np.uint8): 3,
               np.dtype(np.int32): 4, np.dtype(np.int8): 5, np.dtype(np.int64): 6, np.dtype(np.bool_): 7}


class CustomOpError(DnnbindError):
    """An exception raised by a custom operator's ``forward`` or ``backward`` (MXNet's MXNetError "Error in
    CustomOp.forward: <traceback>"); the original exception is ``__cause__``."""


def _callback(what: str, op_type, fn, **kwargs) -> None:
    """Run ``op.forward``/``op.backward``, turning an exception into MXNet's error."""
    try:
        fn(**kwargs)
    except Exception as exc:
        raise CustomOpError(f"Error in CustomOp.{what}: {traceback.format_exc()}(custom operator op_type="
                            f"{op_type!r})") from exc


class CustomOp:
    """Base class of an operator implemented in Python: override ``forward`` and ``backward``."""

    def __init__(self):
        pass

    def forward(self, is_train, req, in_data, out_data, aux):
        """Fill ``out_data`` from ``in_data`` (``req[i]``: 'null', 'write', 'inplace' or 'add'; use assign)."""

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        """Fill ``in_grad`` from ``out_grad`` (``req[i]`` as in forward; use assign)."""

    def assign(self, dst, req, src):
        """``dst`` per ``req``: 'null' leaves it, 'write'/'inplace' overwrite it with src, 'add' adds src to it."""
        if req == "null":
            return
        if req in ("write", "inplace"):
            dst[:] = src
        elif req == "add":
            dst[:] += src


class CustomOpProp:
    """Base class of a custom operator's properties: its inputs, outputs, shapes, types and the operator itself.

    need_top_grad: whether the backward reads the output gradient (the default declare_backward_dependency)."""

    def __init__(self, need_top_grad=True):
        self.need_top_grad_ = need_top_grad

    def infer_shape(self, in_shape):
        """(input shapes, output shapes[, aux shapes]); default: every output has the first input's shape."""
        return in_shape, (in_shape[0],) * len(self.list_outputs()), ()

    def infer_type(self, in_type):
        """(input types, output types[, aux types]); default: all the first input's type."""
        return in_type, [in_type[0]] * len(self.list_outputs()), [in_type[0]] * len(self.list_auxiliary_states())

    def infer_storage_type(self, in_stype):
        """Dense storage throughout (dnnbind has no other)."""
        return in_stype, ["default"] * len(self.list_outputs()), ["default"] * len(self.list_auxiliary_states())

    def infer_storage_type_backward(self, ograd_stype, in_stype, out_stype, igrad_stype, aux_stype):
        lists = [ograd_stype, in_stype, out_stype, igrad_stype, aux_stype]
        return tuple(["default"] * len(x) for x in lists)

    def list_outputs(self):
        return ["output"]

    def list_arguments(self):
        return ["data"]

    def list_auxiliary_states(self):
        return []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        """The ids (of out_grad, in_data, out_data) the backward reads; the others are not kept for it."""
        deps = []
        if self.need_top_grad_:
            deps.extend(out_grad)
        deps.extend(in_data)
        deps.extend(out_data)
        return deps

    def create_operator(self, ctx, in_shapes, in_dtypes):
        """The CustomOp that computes, for this context, input shapes and type flags."""
        return CustomOp()


_lock = threading.Lock()
_REGISTRY: dict[str, type] = {}


def register(reg_name: str) -> Callable[[type], type]:
    """``@mx.operator.register('name')``: make a CustomOpProp subclass the operator ``op_type='name'``. A later
    registration of the same name replaces the earlier one, as in MXNet."""
    def do_register(prop_cls: type) -> type:
        with _lock:
            _REGISTRY[str(reg_name)] = prop_cls
        return prop_cls
    return do_register


register("custom_op")(CustomOpProp)  # MXNet registers the base class under this name too


def get_all_registered_operators() -> list:
    """The op_type names registered with ``register`` (MXNet's lists every operator of its C library instead)."""
    return sorted(_REGISTRY)


def _prop(op_type, kwargs: dict) -> CustomOpProp:
    if op_type is None or op_type == "":
        raise DnnbindValueError("Custom: Required argument `op_type` is missing.")
    prop_cls = _REGISTRY.get(str(op_type))
    if prop_cls is None:
        raise DnnbindValueError(f"Custom: Cannot find custom operator {op_type} (register it with "
                                "@mx.operator.register first)")
    # MXNet hands every parameter to the C library as a string, and the Prop gets it back as that string
    return prop_cls(**{k: str(v) for k, v in kwargs.items()})


def _split(ret, n: tuple, what: str, op_type: str) -> tuple:
    """An infer_shape/infer_type result as (inputs, outputs, aux), each of the declared length."""
    if len(ret) == 2:
        ins, outs, auxs = ret[0], ret[1], []
    elif len(ret) == 3:
        ins, outs, auxs = ret
    else:
        raise DnnbindValueError(f"Custom {op_type}: {what} must return 2 or 3 lists, got {len(ret)}")
    for got, want, kind in ((ins, n[0], "input"), (outs, n[1], "output"), (auxs, n[2], "aux state")):
        if len(got) != want:
            raise DnnbindValueError(f"Custom {op_type}: {what} returned {len(got)} {kind} entries, expecting {want}")
    return list(ins), list(outs), list(auxs)


class _Spec:
    """One call's Prop, counts, and the shapes and dtypes it declares (what sym.Custom's inference reads too)."""

    def __init__(self, op_type, kwargs: dict):
        self.op_type = op_type
        self.prop = _prop(op_type, kwargs)
        self.arguments = list(self.prop.list_arguments())
        self.outputs = list(self.prop.list_outputs())
        self.aux = list(self.prop.list_auxiliary_states())
        # MXNet asks for the backward's dependencies when it parses the call, before any inference: ids
        # 0..n_out-1 are the output gradients, then the inputs, then the outputs
        n_args, n_out = len(self.arguments), len(self.outputs)
        self.deps = {int(d) for d in self.prop.declare_backward_dependency(
            list(range(n_out)), list(range(n_out, n_out + n_args)), list(range(n_out + n_args, 2 * n_out + n_args)))}

    @property
    def counts(self) -> tuple:
        return len(self.arguments), len(self.outputs), len(self.aux)

    def shapes(self, in_shapes: list) -> tuple:
        ret = self.prop.infer_shape([list(s) for s in in_shapes[:len(self.arguments)]])
        ins, outs, auxs = _split(ret, self.counts, "infer_shape", self.op_type)
        return [tuple(int(d) for d in s) for s in ins], [tuple(int(d) for d in s) for s in outs], \
            [tuple(int(d) for d in s) for s in auxs]

    def types(self, in_types: list) -> tuple:
        ret = self.prop.infer_type([np.dtype(t).type for t in in_types[:len(self.arguments)]])
        ins, outs, auxs = _split(ret, self.counts, "infer_type", self.op_type)
        return [np.dtype(t) for t in ins], [np.dtype(t) for t in outs], [np.dtype(t) for t in auxs]


def spec(op_type, kwargs: dict) -> _Spec:
    """The Prop of ``op_type`` made with ``kwargs``, with its argument/output/aux names (for sym.Custom)."""
    return _Spec(op_type, kwargs)


def invoke(inputs, op_type=None, kwargs: dict | None = None) -> Any:
    """Run custom operator ``op_type`` on ``inputs`` (its arguments, then its auxiliary states): the output
    NDArray, or a list of them when the operator has several outputs. Taped under ``autograd.record()``."""
    from . import autograd
    from .runtime.array import NDArray, empty

    sp = _Spec(op_type, dict(kwargs or {}))
    n_args, n_out, n_aux = sp.counts
    inputs = list(inputs)
    if len(inputs) != n_args + n_aux:
        raise DnnbindValueError(f"Custom {op_type}: expects {n_args} argument(s) {sp.arguments} and {n_aux} "
                                f"auxiliary state(s) {sp.aux}, got {len(inputs)} input array(s)")
    for i, x in enumerate(inputs):
        if not isinstance(x, NDArray):
            raise DnnbindTypeError(f"Custom {op_type}: input {i} must be an NDArray, got {type(x).__name__}")
    args, auxs = inputs[:n_args], inputs[n_args:]
    device = inputs[0].device if inputs else None
    in_shapes, out_shapes, _ = sp.shapes([x.shape for x in inputs])
    for x, s in zip(args, in_shapes):
        if tuple(x.shape) != s:
            raise DnnbindValueError(f"Custom {op_type}: infer_shape changed an input's shape from {x.shape} to {s}")
    _, out_types, _ = sp.types([x.dtype for x in inputs])
    op = sp.prop.create_operator(device, [list(x.shape) for x in inputs],
                                 [_TYPE_FLAGS.get(np.dtype(x.dtype), -1) for x in inputs])
    outs = [empty(s, t, device) for s, t in zip(out_shapes, out_types)]
    is_train = int(autograd.is_training())
    with autograd.pause(train_mode=bool(is_train)), _on(device):
        _callback("forward", op_type, op.forward, is_train=is_train, req=["write"] * n_out, in_data=list(args),
                  out_data=outs, aux=list(auxs))

    need = [autograd.needs_grad(x) for x in args]
    if autograd.is_recording() and any(need):
        _record(op, sp, args, auxs, outs, need, is_train)
    else:
        autograd.hold(outs, inputs)
    return outs[0] if n_out == 1 else outs


class _on:
    """``with ctx:`` the device (MXNet runs the Python code inside ``with ctx``); nothing for no device."""

    def __init__(self, device):
        self._device = device

    def __enter__(self):
        if self._device is not None and hasattr(self._device, "__enter__"):
            self._device.__enter__()
        return self

    def __exit__(self, *exc):
        if self._device is not None and hasattr(self._device, "__exit__"):
            self._device.__exit__(*exc)


def _record(op: CustomOp, sp: _Spec, args: list, auxs: list, outs: list, need: list, is_train: int) -> None:
    """Tape the call: its backward runs ``op.backward`` with the arrays declare_backward_dependency keeps."""
    from . import autograd
    from .runtime.array import zeros

    n_args, n_out, _ = sp.counts
    ids_grad, ids_in = list(range(n_out)), list(range(n_out, n_out + n_args))
    ids_out = list(range(n_out + n_args, 2 * n_out + n_args))
    deps = sp.deps
    kept_in = [x if i in deps else None for x, i in zip(args, ids_in)]
    kept_out = [y if i in deps else None for y, i in zip(outs, ids_out)]
    wants_grad = [i in deps for i in ids_grad]
    shapes = [(y.shape, y.dtype, y.device) for y in outs]
    in_specs = [(x.shape, x.dtype, x.device) for x in args]
    n_inputs = len(args) + len(auxs)

    def backward(*gs):
        if n_out > 1:
            gs = gs[0]
        out_grad = []
        for g, (s, t, d), wanted in zip(gs, shapes, wants_grad):
            if not wanted:
                out_grad.append(None)
            elif g is None:
                out_grad.append(zeros(s, t, d))
            else:
                out_grad.append(g)
        in_grad = [zeros(s, t, d) for s, t, d in in_specs]
        req = ["write" if n else "null" for n in need]
        with autograd.pause(train_mode=bool(is_train)), _on(in_specs[0][2] if in_specs else None):
            _callback("backward", sp.op_type, op.backward, req=req, out_grad=out_grad, in_data=list(kept_in),
                      out_data=list(kept_out), in_grad=in_grad, aux=list(auxs))
        grads = [g if n else None for g, n in zip(in_grad, need)]
        return tuple(grads) + (None,) * (n_inputs - len(grads))

    if n_out == 1:
        autograd.record_op(f"Custom:{sp.op_type}", outs[0], tuple(args) + tuple(auxs), backward)
    else:
        autograd.record_outputs(f"Custom:{sp.op_type}", tuple(outs), tuple(args) + tuple(auxs), backward)
