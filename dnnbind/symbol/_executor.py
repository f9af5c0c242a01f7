"""Layer symbol: MXNet's Executor, a graph bound to arrays (``Symbol.simple_bind``, ``Symbol.bind``).

    exe = net.simple_bind(mx.gpu(), data=(64, 1, 28, 28), softmax_label=(64,))
    exe.forward(is_train=True, data=x, softmax_label=y)
    exe.backward()
    exe.grad_dict['fc1_weight']

The arguments, their gradient buffers and the auxiliary states are arrays the executor owns (or the caller gave to
``bind``); ``forward`` runs the graph with the nd calls an eager program makes (``_exec.evaluate``), recording it
for ``backward`` when ``is_train``, which writes each argument's gradient into its buffer (grad_req 'write', 'add'
or 'null', as MXNet). BatchNorm's moving statistics are updated in place in training, as in MXNet.
"""

from __future__ import annotations

import numpy as np

from .. import autograd
from .._lib.errors import DnnbindTypeError, DnnbindValueError
from ..features import UnsupportedFeature
from ..runtime.array import NDArray, zeros
from ..runtime.device import as_device
from ._exec import check, evaluate

__all__ = ["Executor", "simple_bind", "bind"]

_REQS = ("write", "add", "null")


def _per_name(what: str, value, names: list, default=None) -> dict:
    """A per-argument setting given as one value, a list in argument order, or a dict by name."""
    if value is None:
        return dict.fromkeys(names, default)
    if isinstance(value, dict):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise DnnbindValueError(f"{what}: {unknown[0]!r} is not an argument of the symbol ({names})")
        return {n: value.get(n, default) for n in names}
    if isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise DnnbindValueError(f"{what}: {len(value)} values for {len(names)} arguments ({names})")
        return dict(zip(names, value))
    return dict.fromkeys(names, value)


class Executor:
    """A Symbol bound to arrays on one device."""

    def __init__(self, symbol, ctx, arg_arrays: list, grad_arrays: list, grad_reqs: list, aux_arrays: list):
        check(symbol)
        self._symbol, self._ctx = symbol, as_device(ctx)
        self.arg_arrays, self.grad_arrays, self.aux_arrays = arg_arrays, grad_arrays, aux_arrays
        names, aux_names = symbol.list_arguments(), symbol.list_auxiliary_states()
        self._grad_reqs = dict(zip(names, grad_reqs))
        for name, req in self._grad_reqs.items():
            if req not in _REQS:
                raise DnnbindValueError(f"bind: grad_req for {name!r} must be one of {_REQS}, got {req!r}")
        self.arg_dict = dict(zip(names, arg_arrays))
        self.grad_dict = {n: g for n, g in zip(names, grad_arrays) if g is not None}
        self.aux_dict = dict(zip(aux_names, aux_arrays))
        marked = [(a, g, r) for a, g, r in zip(arg_arrays, grad_arrays, grad_reqs) if g is not None and r != "null"]
        if marked:  # MXNet's executor writes each argument's gradient into the buffer it was bound with
            autograd.mark_variables([m[0] for m in marked], [m[1] for m in marked], [m[2] for m in marked])
        self.outputs: list = []
        self._recorded = False

    @property
    def output_dict(self) -> dict:
        return dict(zip(self._symbol.list_outputs(), self.outputs))

    def forward(self, is_train: bool = False, **kwargs) -> list:
        """Run the graph; ``kwargs`` (argument name -> NDArray or numpy array) are copied into the arguments
        first. Returns the outputs (also ``outputs``)."""
        for name, value in kwargs.items():
            dst = self.arg_dict.get(name)
            if dst is None:
                raise DnnbindValueError(f"Executor.forward: unknown argument {name!r} (arguments: "
                                        f"{list(self.arg_dict)})")
            src = value if isinstance(value, NDArray) else np.asarray(value)
            if tuple(src.shape) != tuple(dst.shape):
                raise DnnbindValueError(f"Executor.forward: {name} has shape {tuple(src.shape)}, the executor was "
                                        f"bound with {dst.shape}; bind again (or reshape) for a new shape")
            dst[:] = src
        values = {**self.arg_dict, **self.aux_dict}
        if is_train:
            with autograd.record(train_mode=True):
                self.outputs = evaluate(self._symbol, values)
        else:
            with autograd.predict_mode():
                self.outputs = evaluate(self._symbol, values)
        self._recorded = bool(is_train)
        return self.outputs

    def backward(self, out_grads=None, is_train: bool = True) -> None:
        """Gradients of the outputs (``out_grads``, default ones) into the arguments' gradient buffers."""
        if not self._recorded:
            raise DnnbindValueError("Executor.backward: call forward(is_train=True) first")
        if out_grads is not None and not isinstance(out_grads, (list, tuple)):
            out_grads = [out_grads]
        heads = [o for o in self.outputs]
        autograd.backward(heads, head_grads=out_grads, train_mode=is_train)
        self._recorded = False

    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        """Copy ``arg_params``/``aux_params`` (name -> NDArray) into the bound arrays."""
        for params, target, what in ((arg_params, self.arg_dict, "arg"), (aux_params or {}, self.aux_dict, "aux")):
            for name, value in params.items():
                dst = target.get(name)
                if dst is None:
                    if allow_extra_params:
                        continue
                    raise DnnbindValueError(f"Find name {name!r} that is not in the {what}uments"
                                            if what == "arg" else f"Find name {name!r} that is not in the auxiliary "
                                            "states")
                src = value if isinstance(value, NDArray) else np.asarray(value)
                if tuple(src.shape) != tuple(dst.shape):
                    raise DnnbindValueError(f"copy_params_from: {name} has shape {tuple(src.shape)}, bound with "
                                            f"{dst.shape}")
                dst[:] = src.astype(dst.dtype) if src.dtype != dst.dtype else src

    def reshape(self, *args, **kwargs):
        raise UnsupportedFeature("Executor.reshape is not supported by dnnbind yet: bind the symbol again with the "
                                 "new shapes (simple_bind)")

    def __repr__(self) -> str:
        return f"<Executor {self._symbol!r} on {self._ctx!r}>"


def simple_bind(symbol, ctx, grad_req="write", type_dict=None, stype_dict=None, group2ctx=None,
                shared_arg_names=None, shared_exec=None, shared_buffer=None, **shapes) -> Executor:
    """``Symbol.simple_bind``: arrays of the shapes inferred from ``shapes`` (argument name -> shape), zeros,
    gradient buffers for the arguments whose grad_req is not 'null'."""
    if group2ctx:
        raise UnsupportedFeature("simple_bind(group2ctx=...) (model parallelism) is not supported by dnnbind")
    if stype_dict and any(v != "default" for v in stype_dict.values()):
        raise UnsupportedFeature("simple_bind: sparse storage types are not supported by dnnbind")
    ctx = as_device(ctx)
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    if arg_shapes is None:
        partial = symbol.infer_shape_partial(**shapes)[0]
        missing = [n for n, s in zip(symbol.list_arguments(), partial) if not s]
        raise DnnbindValueError(f"simple_bind: cannot infer the shapes of {missing} from {shapes}; give them")
    names, aux_names = symbol.list_arguments(), symbol.list_auxiliary_states()
    types = dict.fromkeys(names + aux_names, np.float32)
    if type_dict:
        inferred = symbol.infer_type(**type_dict)
        if inferred[0] is not None:
            types.update(zip(names, inferred[0]))
            types.update(zip(aux_names, inferred[2]))
    reqs = _per_name("simple_bind: grad_req", grad_req, names, "null")
    shared = shared_exec.arg_dict if shared_exec is not None else {}
    args = []
    for n, s in zip(names, arg_shapes):
        reuse = shared.get(n) if shared_arg_names and n in shared_arg_names else None
        args.append(reuse if reuse is not None and tuple(reuse.shape) == tuple(s) else
                    zeros(s, types[n], ctx))
    grads = [zeros(s, types[n], ctx) if reqs[n] != "null" else None for n, s in zip(names, arg_shapes)]
    aux = [zeros(s, types[n], ctx) for n, s in zip(aux_names, aux_shapes)]
    return Executor(symbol, ctx, args, grads, [reqs[n] for n in names], aux)


def bind(symbol, ctx, args, args_grad=None, grad_req="write", aux_states=None, group2ctx=None,
         shared_exec=None) -> Executor:
    """``Symbol.bind``: the caller's arrays (lists in argument order, or dicts by name)."""
    if group2ctx:
        raise UnsupportedFeature("bind(group2ctx=...) (model parallelism) is not supported by dnnbind")
    ctx = as_device(ctx)
    names, aux_names = symbol.list_arguments(), symbol.list_auxiliary_states()
    arg_map = _per_name("bind: args", args, names)
    missing = [n for n in names if arg_map[n] is None]
    if missing:
        raise DnnbindValueError(f"bind: no array for argument(s) {missing}")
    grad_map = _per_name("bind: args_grad", args_grad, names) if args_grad is not None else dict.fromkeys(names)
    aux_map = _per_name("bind: aux_states", aux_states, aux_names) if aux_names else {}
    missing = [n for n in aux_names if aux_map.get(n) is None]
    if missing:
        raise DnnbindValueError(f"bind: no array for auxiliary state(s) {missing}")
    reqs = _per_name("bind: grad_req", grad_req, names, "null")
    for n in names:
        if grad_map[n] is None:
            reqs[n] = "null"  # no buffer, no gradient: MXNet's rule
    for what, mapping in (("args", arg_map), ("args_grad", grad_map), ("aux_states", aux_map)):
        for n, a in mapping.items():
            if a is None:
                continue
            if not isinstance(a, NDArray):
                raise DnnbindTypeError(f"bind: {what}[{n!r}] must be an NDArray, got {type(a).__name__}")
            if a.device is not ctx:  # the executor reads and writes them in place: they must live on ctx
                raise DnnbindValueError(f"bind: {what}[{n!r}] is on {a.device!r}, the executor on {ctx!r}")
    return Executor(symbol, ctx, [arg_map[n] for n in names], [grad_map[n] for n in names],
                    [reqs[n] for n in names], [aux_map[n] for n in aux_names])

