"""Layer nd: the op registry and the one dispatch path every table op goes through.

An ``Op`` is declared once (``dnnbind/nd/_table.py``): name, array inputs, shape/dtype rule, numpy twin (the cpu
backend and the tests' oracle), GPU lowering, gradient rule written with registered ops, and its ``nd.*`` /
NDArray method names. Three kinds share one dispatch (``invoke``):

- ``map``: element-wise with numpy broadcasting. GPU: one NVRTC kernel generated from a C expression over the
  inputs ``a, b, c`` (``kernels.strided``), or a cuDNN call where one applies (``lib``). Python scalars are
  operands too: they become kernel arguments, never device uploads.
- ``reduce``: over ``axis`` (int/tuple/None), ``keepdims``, ``exclude``. GPU: cudnnReduceTensor where cuDNN
  can, else a generated reduction kernel.
- ``func``: anything else (shape ops, linear algebra, indexing): ``check`` infers the output, ``cpu``/``gpu``
  compute it.

``invoke`` normalizes and checks the arguments (ValueError/TypeError naming the op, the argument and the
shapes, before any library call), runs the cpu twin or the GPU lowering inside a trace scope named after the
op, and tapes the gradient rule. Broadcast gradients are summed back to each input's shape in one place
(``unbroadcast``), so no rule handles broadcasting itself.

Imports numpy, runtime, ops, kernels, autograd and the hooks of _lib.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError, UnknownArgumentError

import inspect
import math
import numbers
from typing import Callable

import numpy as np

from .. import autograd
from .._lib.cfunc import TRACING
from .._lib.hooks import DEFERRING
from ..ops.opdef import Call, Grads
from ..runtime.array import NDArray, empty
from ..runtime.device import Device, as_device, default_device
from . import _lower
from ._schema import Schema, parse_type_info
from ._schema import schema as schema_of
from ._params import drop_ignored, ignores_keywords

REGISTRY: dict[str, "Op"] = {}
FLOAT_KINDS = "f"


class Op:
    """One op's declaration. See the module docstring for the kinds and _table.py for examples."""

    __slots__ = ("name", "kind", "numpy", "expr", "lib", "grad", "check", "cpu", "gpu", "reduce", "map_expr",
                 "post_expr", "ints", "out_dtype", "nd_names", "methods", "differentiable", "doc", "scalar_exprs",
                 "arity", "params", "same", "saves", "opdef", "schema", "required", "count", "dtype")

    def __init__(self, name: str, kind: str, numpy=None, *, expr: str | None = None, lib=None, grad=None,
                 check=None, cpu=None, gpu=None, reduce: str | None = None, map_expr: str = "a",
                 post_expr: str = "acc", ints: bool = True, out_dtype=None, nd=None, methods=(),
                 differentiable: bool = True, doc: str = "", arity: int = 1, params: tuple = (),
                 same: tuple | None = None, saves: tuple | None = None, opdef=None, dtype=None):
        self.name, self.kind, self.numpy, self.expr, self.lib, self.grad = name, kind, numpy, expr, lib, grad
        self.check, self.cpu, self.gpu, self.reduce = check, cpu, gpu, reduce
        self.map_expr, self.post_expr, self.ints, self.out_dtype = map_expr, post_expr, ints, out_dtype
        self.nd_names = (name,) if nd is None else tuple(nd)
        self.methods, self.differentiable, self.doc = tuple(methods), differentiable, doc
        # scalar_exprs: ``expr`` with its scalar operands renamed to kernel arguments, one entry per pattern of
        # which operands are scalars (a tuple of bools); a cache that nd._lower.scalar_expr fills on first use
        self.scalar_exprs: dict[tuple, str] = {}
        # arity: leading operands (arrays, or scalars for map ops); params: positional parameters after them
        # (nd.clip(x, 0, 1)); same: operand indices whose dtypes must agree (default: all array operands).
        self.arity, self.params, self.same = arity, tuple(params), same
        # saves: what ``grad`` reads, "out" and/or operand indices (None: everything). The backward closure keeps
        # only those alive; the other array operands become autograd.Released (shape, dtype, needs-gradient).
        self.saves = None if saves is None else tuple(saves)
        # a "lib" op: its ops.opdef.OpDef (lowerings, geometry, inference) and its parameter schema (MXNet's
        # declared parameters plus the entry's extras), see _lib_call
        self.opdef, self.schema, self.required = opdef, None, ()
        self.count = None  # a lib op with a variadic input list: the parameter that counts them (num_args)
        # type inference for symbol graphs: ``dtype(p, types, n_out) -> (input types, output types)`` (None where
        # unknown); None means MXNet's element-wise rule (every input and output share one type). See
        # ops/opdef.py ``same_type`` and the rules beside the ops that differ (one_hot's ``dtype``, shape_array's
        # int64, BatchNorm's float32 parameters under float16 data).
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<nd op {self.name} ({self.kind})>"


def register(op: Op) -> Op:
    if op.name in REGISTRY:
        raise DnnbindValueError(f"op {op.name!r} is registered twice")
    REGISTRY[op.name] = op
    return op


# -- argument normalization -----------------------------------------------------------------------------------

def _is_scalar(v) -> bool:
    return isinstance(v, (numbers.Number, np.number, np.bool_)) and not isinstance(v, NDArray)


def as_array(op: str, name: str, v, like: NDArray | None = None) -> NDArray:
    """An NDArray from ``v``; numpy arrays and lists go to ``like``'s device (or the default device)."""
    if type(v) is NDArray:
        return v
    if isinstance(v, NDArray):
        return v
    if isinstance(v, (np.ndarray, list, tuple)) or _is_scalar(v):
        from ..runtime.array import array
        dev = like.device if like is not None else default_device()
        dtype = like.dtype if like is not None and not isinstance(v, np.ndarray) else None
        try:
            return array(v, device=dev, dtype=dtype)
        except (ValueError, TypeError) as exc:
            raise DnnbindTypeError(f"{op}: {name} could not be made an array: {exc}") from None
    raise DnnbindTypeError(f"{op}: {name} must be an NDArray (or numpy array / number), got {type(v).__name__}")


def same_device(op: str, arrays, names) -> Device:
    dev = None
    for a, n in zip(arrays, names):
        if isinstance(a, NDArray):
            if dev is None:
                dev = a.device
            elif a.device is not dev:
                where = ", ".join(f"{m} on {x.device!r}" for x, m in zip(arrays, names) if isinstance(x, NDArray))
                raise DnnbindValueError(f"{op}: all arrays must be on one device, got {where}; move them with "
                                 ".as_in_context(ctx)")
    return dev


def broadcast_shape(op: str, shapes, names) -> tuple:
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s):
            j = ndim - len(s) + i
            if d != out[j]:
                if out[j] == 1:
                    out[j] = d
                elif d != 1:
                    detail = ", ".join(f"{n} {tuple(x)}" for x, n in zip(shapes, names))
                    raise DnnbindValueError(f"{op}: shapes cannot be broadcast together: {detail}")
    return tuple(out)


def norm_axes(op: str, ndim: int, axis, exclude: bool = False) -> tuple:
    """Sorted, non-negative axes; ``axis=None`` is all axes; ``exclude`` takes the complement (MXNet)."""
    if axis is None or (isinstance(axis, (tuple, list)) and len(axis) == 0 and not exclude):
        axes = tuple(range(ndim)) if axis is None else ()
    else:
        items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        axes = []
        for a in items:
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, (numbers.Integral, np.integer)):
                raise DnnbindTypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
            a = int(a)
            if not -ndim <= a < ndim:  # a 0-d array has no axis at all (numpy's AxisError; never an IndexError)
                raise DnnbindValueError(f"{op}: axis {a} is out of range for an array of {ndim} dimensions")
            a = a % ndim
            if a in axes:
                raise DnnbindValueError(f"{op}: axis {a} repeated in {axis!r}")
            axes.append(a)
        axes = tuple(sorted(axes))
    if exclude:
        axes = tuple(i for i in range(ndim) if i not in axes)
    return axes


def check_dtype(op: str, x: NDArray, name: str, floats_only: bool) -> None:
    if floats_only and x.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: {name} must be a floating-point array, got {x.dtype}; use .astype('float32')")


# -- dispatch -------------------------------------------------------------------------------------------------

def _scope(name: str):
    from .._lib import hooks
    return hooks.scope(name, op=True)


def invoke(op: Op, args: tuple, params: dict):
    """Run ``op`` on ``args`` (arrays or, for map ops, scalars) with ``params``; tape its gradient."""
    if DEFERRING:  # an eager Block call's ops are being captured or checked (dnnbind.eager_replay)
        return DEFERRING[-1].invoke(op, args, params)
    return run(op, args, params)


def run(op: Op, args: tuple, params: dict):
    """``invoke`` itself, past the one hook that may defer the call."""
    kind = op.kind
    if kind == "lib":
        return _lib_call(op, args, params)
    if kind == "composite":  # composes registered ops, which check, run and tape themselves
        return op.cpu(*args, **params)
    if kind == "map":
        out, arrays = _map(op, args, params)
    elif kind == "reduce":
        out, arrays = _reduce(op, args[0], params)
    else:
        out, arrays = _func(op, args, params)
    if autograd.thread_state.__dict__.get("recording"):
        if op.grad is not None:
            _tape(op, out, arrays, params)
        else:
            autograd.hold(out, arrays)
    return out


def _tape(op: Op, out, arrays, params) -> None:
    inputs = tuple(a if isinstance(a, NDArray) else None for a in arrays)
    if not any(autograd.needs_grad(a) for a in inputs if a is not None):
        autograd.hold(out, inputs)
        return
    shapes = tuple(a.shape if a is not None else None for a in inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    saved_out, saved = out, arrays
    if op.saves is not None:  # keep only what the gradient formula reads (module docstring of autograd)
        saved_out = out if "out" in op.saves else None
        saved = tuple(a if i in op.saves or not isinstance(a, NDArray) else autograd.Released(a)
                      for i, a in enumerate(arrays))

    def backward(g):
        grads = op.grad(g, saved_out, *saved, **params)
        if not isinstance(grads, tuple):
            grads = (grads,)
        return tuple(None if gi is None or shape is None else unbroadcast(gi, shape)
                     for gi, shape in zip(grads, shapes))

    autograd.record_op(op.name, outs[0], inputs, backward)


def unbroadcast(g, shape: tuple):
    """Sum ``g`` back to ``shape`` (the gradient of a broadcast): the one place broadcasting is undone."""
    if not isinstance(g, NDArray):
        return g
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    if axes:
        g = invoke(REGISTRY["sum"], (g,), {"axis": axes, "keepdims": False, "exclude": False})
    return g.reshape(shape) if g.shape != shape else g


def _func(op: Op, args, params):
    names = [f"data[{i}]" if op.arity is None else (_NAMES[i] if op.arity > 1 else "data") for i in range(len(args))]
    if any(type(a) is not NDArray for a in args):
        first = next((a for a in args if isinstance(a, NDArray)), None)
        args = tuple(as_array(op.name, n, a, first) for a, n in zip(args, names))
    dev = same_device(op.name, args, names) if args else as_device(params.get("ctx"))
    meta = op.check(*args, **params) if op.check is not None else None
    if dev.kind == "cpu":
        if TRACING:
            from .._lib import hooks
            out = hooks.timed_numpy(op.name, op.cpu, meta, *args, **params)
        else:
            out = op.cpu(meta, *args, **params)
    elif TRACING:
        with _scope(op.name):
            out = op.gpu(meta, *args, **params)
    else:
        out = op.gpu(meta, *args, **params)
    return out, args


# map ----------------------------------------------------------------------------------------------------------

_NAMES = ("a", "b", "c", "d", "e")


_REQUIRED: dict = {}  # map op name -> its parameters without a default (clip's a_min and a_max)


def _map_params(op: Op, params) -> None:
    """A map op's parameters become scalars of its kernel: each must be a real number, and the ones its numpy
    twin gives no default are required (MXNet's "Required parameter a_min of float is not presented")."""
    required = _REQUIRED.get(op.name)
    if required is None:
        sig = inspect.signature(op.numpy)
        required = _REQUIRED[op.name] = tuple(p for p in op.params if p in sig.parameters
                                              and sig.parameters[p].default is inspect.Parameter.empty)
    for k in required:
        if k not in params:
            raise DnnbindTypeError(f"{op.name}: Required parameter {k} of float is not presented")
    for k, v in params.items():
        if not isinstance(v, numbers.Real):
            raise DnnbindTypeError(f"{op.name}: {k} must be a number, got {type(v).__name__} {v!r}")


def _map(op: Op, args, params):
    if op.params:
        _map_params(op, params)
    if len(args) != op.arity:
        raise DnnbindTypeError(f"{op.name}: takes {op.arity} operand(s), got {len(args)}"
                        + (f"; pass {', '.join(op.params)} by keyword" if op.params else ""))
    # Hot path first: NDArrays of one device, dtype and shape, and Python numbers (a + b, x * 0.5 in a step).
    a0 = None
    for a in args:
        t = type(a)
        if t is NDArray:
            if a0 is None:
                a0 = a
            elif a.device is not a0.device or a.dtype != a0.dtype or a.shape != a0.shape:
                a0 = None
                break
        elif t is not float and t is not int:
            a0 = None
            break
    if a0 is not None:
        dtype = a0.dtype
        if not op.ints and dtype.kind != "f":
            check_dtype(op.name, a0, "the input", True)
        out_dtype = dtype if op.out_dtype is None else np.dtype(op.out_dtype(dtype))
        return _map_run(op, args, params, a0.shape, out_dtype, a0.device), args
    return _map_general(op, args, params)


def _map_general(op: Op, args, params):
    names = _NAMES[:len(args)]
    first = next((a for a in args if isinstance(a, NDArray)), None)
    if first is None:
        raise DnnbindTypeError(f"{op.name}: at least one argument must be an NDArray, got "
                        f"{', '.join(type(a).__name__ for a in args)}")
    norm = []
    for a, n in zip(args, names):
        if isinstance(a, NDArray) or _is_scalar(a):
            norm.append(a)
        elif isinstance(a, (np.ndarray, list, tuple)):
            norm.append(as_array(op.name, n, a, first))
        else:
            raise DnnbindTypeError(f"{op.name}: {n} must be an NDArray or a number, got {type(a).__name__}")
    arrays = [a for a in norm if isinstance(a, NDArray)]
    dev = same_device(op.name, norm, names)
    same = [i for i in (range(len(norm)) if op.same is None else op.same) if isinstance(norm[i], NDArray)]
    dtype = norm[same[0]].dtype if same else first.dtype
    if any(norm[i].dtype != dtype for i in same):
        found = ", ".join(f"{names[i]} {norm[i].dtype}" for i in same)
        raise DnnbindTypeError(f"{op.name}: operands must share a dtype, got {found}; convert one with .astype()")
    if not op.ints:
        check_dtype(op.name, norm[same[0]] if same else first, "the input", True)
    shape = broadcast_shape(op.name, [a.shape for a in arrays], [n for a, n in zip(norm, names)
                                                                   if isinstance(a, NDArray)])
    out_dtype = dtype if op.out_dtype is None else np.dtype(op.out_dtype(dtype))
    return _map_run(op, tuple(norm), params, shape, out_dtype, dev), tuple(norm)


def check_int_scalar(op: str, name: str, v, dtype: np.dtype) -> None:
    """An integer scalar operand of an integer array must fit the array's dtype. MXNet casts it (2**40 into an
    int32 array becomes -2**31, 200 into int8 -56) and numpy raises OverflowError; dnnbind refuses it, before any
    kernel, on both backends."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        lo, hi = _INT_RANGE.get(dtype) or _INT_RANGE.setdefault(dtype, (int(np.iinfo(dtype).min),
                                                                       int(np.iinfo(dtype).max)))
        if not lo <= v <= hi:
            raise DnnbindValueError(f"{op}: the scalar {name}={int(v)} does not fit the {dtype} array's range "
                                    f"[{lo}, {hi}]; convert the array with .astype('int64') or 'float64' first")


_INT_RANGE: dict = {}


def _map_run(op: Op, args, params, shape, out_dtype, dev):
    if out_dtype.kind in "iu":
        for a, n in zip(args, _NAMES):
            if type(a) is not NDArray:
                check_int_scalar(op.name, n, a, out_dtype)
    if dev.kind == "cpu":
        if TRACING:
            from .._lib import hooks
            return hooks.timed_numpy(op.name, _map_cpu, op, args, params, shape, out_dtype)
        return _map_cpu(op, args, params, shape, out_dtype)
    if TRACING:
        with _scope(op.name):
            return _map_gpu(op, args, params, shape, out_dtype, dev)
    if op.lib is None:  # the common case, without the extra call
        return _lower.map_kernel(op, args, params, shape, out_dtype, dev)
    return _map_gpu(op, args, params, shape, out_dtype, dev)


def _map_cpu(op: Op, args, params, shape, out_dtype):
    vals = [a._data if type(a) is NDArray else a for a in args]
    with np.errstate(all="ignore"):  # NaN/inf results without warnings, as on the GPU (and in MXNet)
        r = op.numpy(*vals, **params)
    if type(r) is not np.ndarray or r.dtype != out_dtype or r.shape != shape:
        r = np.broadcast_to(np.asarray(r), shape).astype(out_dtype)
    elif not r.flags.c_contiguous:
        r = np.ascontiguousarray(r)
    return NDArray._from_numpy(r)


def _map_gpu(op: Op, args, params, shape, out_dtype, dev):
    if op.lib is not None:
        out = op.lib(args, params, shape, out_dtype, dev)
        if out is not None:
            return out
    return _lower.map_kernel(op, args, params, shape, out_dtype, dev)


# reduce -------------------------------------------------------------------------------------------------------

def _reduce(op: Op, x, params):
    if not isinstance(x, NDArray):
        x = as_array(op.name, "data", x)
    axis = params.get("axis")
    if type(axis) in (tuple, list) and not axis:  # MXNet: axis=() reduces over every axis, exclude or not
        if op.reduce in ("argmax", "argmin"):
            raise DnnbindValueError(f"{op.name}: axis must be an int or None, got {axis!r}")
        axis = params["axis"] = None  # in place: the gradient rule reads the same params
        params["exclude"] = False
    keepdims = bool(params.get("keepdims", False))
    exclude = bool(params.get("exclude", False))
    axes = norm_axes(op.name, x.ndim, axis, exclude)
    if not op.ints:
        check_dtype(op.name, x, "data", True)
    if op.reduce in ("max", "min", "argmax", "argmin") and any(x.shape[a] == 0 for a in axes):
        raise DnnbindValueError(f"{op.name}: cannot reduce over a size-0 axis (shape {x.shape}, axes {axes})")
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keepdims else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if not out_shape and x.ndim:
        out_shape = (1,)  # MXNet 1.x: a full reduction is a shape-(1,) array, never 0-d
    out_dtype = x.dtype if op.out_dtype is None else np.dtype(op.out_dtype(x.dtype))
    if x.device.kind == "cpu":
        def run():
            with np.errstate(all="ignore"):
                r = np.asarray(op.numpy(x._data, axes, **{k: v for k, v in params.items()
                                                          if k not in ("axis", "keepdims", "exclude")}))
            return NDArray._from_numpy(np.asarray(r.reshape(out_shape).astype(out_dtype, copy=False), order="C"))
        if TRACING:
            from .._lib import hooks
            out = hooks.timed_numpy(op.name, run)
        else:
            out = run()
    else:
        from . import _lower
        if TRACING:
            with _scope(op.name):
                out = _lower.reduce_kernel(op, x, axes, out_shape, out_dtype, params)
        else:
            out = _lower.reduce_kernel(op, x, axes, out_shape, out_dtype, params)
    return out, (x,)


def reduced_size(shape: tuple, axes: tuple) -> int:
    return math.prod(shape[a] for a in axes)


def keepdims_shape(shape: tuple, axes: tuple) -> tuple:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def new_empty(shape, dtype, dev) -> NDArray:
    return empty(shape, dtype, dev)


def func(name: str, check, cpu, gpu, grad=None, *, nd=None, methods=(), arity: int | None = 1, params=(),
         differentiable: bool = True, doc: str = "", dtype=None) -> Op:
    """Register a ``func`` op: ``check(*arrays, **params) -> meta`` validates and infers (before any library
    call); ``cpu(meta, *arrays, **params)`` / ``gpu(...)`` compute; ``grad(g, out, *arrays, **params)``."""
    return register(Op(name, "func", check=check, cpu=cpu, gpu=gpu, grad=grad, nd=nd, methods=methods,
                       arity=arity, params=params, differentiable=differentiable, doc=doc, dtype=dtype))


def composite(name: str, fn: Callable, *, nd=None, methods=(), dtype=None, doc: str = "") -> Op:
    """Register a ``composite`` op: ``fn(*arrays, **params)`` composes registered ops (reshape's codes, split,
    tile, norm), so it has no backend or gradient of its own: the ops it calls check, run and tape themselves.
    Its entry gives it ``nd.*`` names, NDArray methods, MXNet's parameter parsing and the symbol executor's node."""
    return register(Op(name, "composite", cpu=fn, nd=nd, methods=methods, arity=None, dtype=dtype,
                       doc=doc or (fn.__doc__ or "")))


def call(name: str, *args, **params):
    """Invoke a registered op by name (what gradient rules and composite ops use)."""
    return invoke(REGISTRY[name], args, params)


def untaped_call(name: str, *args, **params):
    """Invoke a registered op by name without taping it (inside a lib op's lowering, which tapes itself)."""
    tls = autograd.thread_state.__dict__
    if not tls.get("recording"):
        return invoke(REGISTRY[name], args, params)
    tls["recording"] = False
    try:
        return invoke(REGISTRY[name], args, params)
    finally:
        tls["recording"] = True


Callable  # noqa: B018  (re-exported type for the table's annotations)


# lib: operators declared by an ops.opdef.OpDef (library forward/backward pairs) ---------------------------------

def lib_op(d) -> Op:
    """Register the ops.opdef.OpDef ``d`` as a "lib" op: ``nd.<name>`` and ``sym.<name>`` come from it."""
    op = Op(d.name, "lib", nd=d.nd, doc=d.doc, opdef=d, dtype=d.dtype)
    base = schema_of(d.name)
    extra = tuple(parse_type_info(d.name, n, info) for n, info in d.extra)
    op.schema = Schema(base.op, base.inputs, base.params + extra)
    op.arity = len(base.inputs)
    op.required = tuple(i for i, inp in enumerate(base.inputs) if inp.name not in d.optional)
    if base.inputs and base.inputs[0].variadic:  # UpSampling's data: any number of arrays, counted by num_args
        from ._mxnet_params import VAR_ARGS
        op.arity, op.required, op.count = None, (), VAR_ARGS.get(base.op, "num_args")
    return register(op)


_PREPARED: dict = {}  # (op, shapes, dtype, device, parameter names, ids) -> (parsed parameters, geometry, values)


def _lib_params(op: Op, params: dict) -> dict:
    """The call's parameters parsed as MXNet parses them (each value as its ``str()``; a dtype as its name), every
    name declared, every required one given, defaults filled in."""
    dtype = params.get("dtype")
    if dtype is not None and not isinstance(dtype, str):  # MXNet's frontend passes a numpy type by its name
        try:
            params = dict(params, dtype=np.dtype(dtype).name)
        except TypeError:
            raise DnnbindTypeError(f"{op.name}: dtype must be a dtype name or numpy type, got {dtype!r}") from None
    declared = schema_of(op.name)
    for name in params:
        if not op.schema.declares(name):  # MXNet's message lists MXNet's own parameters
            if ignores_keywords(op.name):  # MXNet declares none: it ignores the keyword (nd._params)
                params = drop_ignored(op.name, params, [n for n in params if op.schema.declares(n)])
                break
            raise UnknownArgumentError(op.name, name, tuple(p.name for p in declared.params))
    return op.schema.parse(params)


def _lib_arrays(op: Op, args: tuple) -> tuple:
    """The inputs as NDArrays on one device (numpy arrays and lists go to the first NDArray's device); None only
    where the entry lists the input as optional."""
    names = [i.name for i in op.schema.inputs] if op.count is None else [f"data[{i}]" for i in range(len(args))]
    if not args:
        raise DnnbindTypeError(f"{op.name}: needs at least one input array")
    if len(args) > len(names):
        raise DnnbindTypeError(f"{op.name}: takes {len(names)} input array(s) ({', '.join(names)}), got {len(args)}")
    args = tuple(args) + (None,) * (len(names) - len(args))
    first = next((a for a in args if isinstance(a, NDArray)), None)
    out = []
    for a, n in zip(args, names):
        if a is None:
            if n not in op.opdef.optional:
                raise DnnbindTypeError(f"{op.name}: {n} must be an array (NDArray, or numpy), got None")
            out.append(None)
        elif isinstance(a, NDArray):
            out.append(a)
        elif n in op.opdef.mutates:
            raise DnnbindTypeError(f"{op.name}: {n} must be an NDArray (the op updates it in place), got "
                                   f"{type(a).__name__}")
        elif isinstance(a, np.ndarray) and a.dtype.kind in "biuf":  # MXNet takes NDArrays; numpy is a convenience
            out.append(as_array(op.name, n, a, first))
        else:
            raise DnnbindTypeError(f"{op.name}: argument {n} must be an NDArray, got {type(a).__name__}")
    same_device(op.name, out, names)
    return tuple(out)


def _lib_call(op: Op, args: tuple, params: dict):
    """One call of a lib op: arrays checked, parameters parsed and the geometry prepared (both cached per call
    signature), the backend decided once, the lowering run, the backward taped."""
    if op.count is not None:  # a variadic input list: MXNet's frontend counts it (num_args) itself
        if op.count not in params:
            params = dict(params, **{op.count: len(args)})
        if not args or any(type(a) is not NDArray for a in args):
            args = _lib_arrays(op, args)
    elif len(args) != op.arity:
        args = _lib_arrays(op, args)
    else:  # the hot path: NDArrays (None only where optional); plain loops, cheaper than any() over generators
        for a in args:
            if type(a) is not NDArray and a is not None:
                args = _lib_arrays(op, args)
                break
        else:
            for i in op.required:
                if args[i] is None:
                    args = _lib_arrays(op, args)
                    break
    dev = args[0].device
    sig = []
    for a in args:
        if a is None:
            sig.append(None)
        else:
            if a.device is not dev:
                _lib_arrays(op, args)  # raises, naming the devices
            sig.append(a.shape)
            sig.append(a.dtype)
    values = tuple(params.values())
    key = (op, tuple(sig), dev, tuple(params), tuple(map(id, values)))
    hit = _PREPARED.get(key)
    d = op.opdef
    if hit is None:
        p = _lib_params(op, params)
        geo = d.prepare(p, *args)
        if list not in map(type, values):  # a list may change under the same id: never cached
            if len(_PREPARED) >= 4096:
                _PREPARED.clear()
            _PREPARED[key] = (p, geo, values)  # the values stay alive while cached: their ids are not reused
    else:
        p, geo = hit[0], hit[1]
    c = Call(geo, p, dev, autograd.is_training())
    if dev.kind == "gpu":
        low = d.gpu
        if TRACING:
            with _scope(op.name):
                out, saved = low.forward(c, *args)
        else:
            out, saved = low.forward(c, *args)
    else:
        low = d.cpu
        host = [None if a is None else a._data for a in args]
        if TRACING:
            from .._lib import hooks
            out, saved = hooks.timed_numpy(op.name, low.forward, c, *host)
        else:
            out, saved = low.forward(c, *host)
        if type(out) is np.ndarray and any(out is h for h in host):  # the identity: the input itself, as on a GPU
            out = args[next(i for i, h in enumerate(host) if h is out)]
        else:
            out = tuple(_host_array(o) for o in out) if isinstance(out, tuple) else _host_array(out)
    if autograd.thread_state.__dict__.get("recording"):
        first = out[0] if isinstance(out, tuple) else out
        wanted = False
        for a in args:
            if a is first:  # the identity (Dropout outside train mode): the input's own place in the graph has it
                return out
            if a is not None and (a._node is not None or a._grad_req != "null"):  # autograd.needs_grad, inlined
                wanted = True
        if wanted and low.backward is not None:
            if d.grad_outputs and isinstance(out, tuple):
                autograd.record_outputs(op.name, out, args, _lib_backward(op.name, low, c, saved, args,
                                                                           dev.kind == "gpu", out))
            else:
                autograd.record_op(op.name, first, args, _lib_backward(op.name, low, c, saved, args,
                                                                       dev.kind == "gpu"))
        else:
            autograd.hold(out, args)
    return out


def _host_array(r):
    if r is None or isinstance(r, NDArray):
        return r
    return NDArray._from_numpy(np.asarray(r, order="C"))  # (ascontiguousarray would make a 0-d result 1-d)


def _lib_backward(name: str, low, c, saved, args, gpu: bool, outputs: tuple | None = None):
    """The taped backward of one lib op call. It keeps what the lowering saved and, of the inputs, only whether
    each wants a gradient and its identity (for the leaf gradient buffer autograd may offer: ``grads.into``):
    an input the lowering does not save (a ReLU's input) is not kept alive by the tape. With ``outputs`` (an op
    whose every output takes a gradient) ``dy`` is a tuple; an output no gradient reached gets zeros."""
    needs = tuple(autograd.needs_grad(a) for a in args)
    if outputs is not None:
        metas = tuple((o.shape, o.dtype, o.device) for o in outputs)
        inner = _lib_backward(name, low, c, saved, args, gpu)

        def backward_outputs(dys):
            dys = dys if isinstance(dys, tuple) else (dys,)
            dys = dys + (None,) * (len(metas) - len(dys))
            full = tuple(g if g is not None else _zeros(*m) for g, m in zip(dys, metas))
            return inner(full)
        return backward_outputs
    # only leaves can have a buffer to write into, and the tape's node holds each leaf input, so its id stays its own
    keys = tuple(id(a) if a is not None and a._node is None and a._grad_req != "null" else None
                 for a in args) if gpu else None

    def backward(dy):
        if gpu:
            grads = Grads(needs, tuple(autograd.grad_buffer(k) for k in keys), autograd.frees_graph(), c.device)
            # dy is handed over, no reference kept in this frame: a lowering done with it early (a fused conv's
            # ReLU part) frees it before allocating the rest, as autograd's loop does (autograd._run)
            box, dy = [dy], None
            if TRACING:  # the backward's library calls are named after the op, as the forward's are
                with _scope(name):
                    return low.backward(c, saved, grads, box.pop())
            return low.backward(c, saved, grads, box.pop())
        grads = Grads(needs, (None,) * len(needs), autograd.frees_graph())
        dxs = low.backward(c, saved, grads, tuple(g._data for g in dy) if isinstance(dy, tuple) else dy._data)
        return tuple(_host_array(g) for g in dxs)
    return backward


def _zeros(shape, dtype, device):
    from ..runtime.array import zeros
    return zeros(shape, dtype, device)
