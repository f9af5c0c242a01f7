"""Layer nd: MXNet 1.x's ``nd`` namespace, generated from the one operator registry (nd/_registry.py ``REGISTRY``).
Imports ops, autograd, runtime, kernels (through its modules).

Every registered op becomes an ``nd.<name>`` function (and, where MXNet has one, an NDArray method):
- the table ops (element-wise and reductions in ``_table.py``; ``_shape.py``, ``_indexing.py``, ``_linalg.py``,
  ``_sort.py``), each one ``Op`` row;
- the library-backed operators (Convolution, FullyConnected, BatchNorm, Pooling, softmax, Dropout, LRN, ...), each
  one ``OpDef`` in ops/defs/ registered here as a "lib" op: the function takes MXNet's inputs and parameters,
  parsed by MXNet's declared schema, with its docstring generated from it.
Creation functions take MXNet's ``ctx=`` and ``dtype=``; ``_helpers.py`` holds the few functions that are not
operators (loss helpers, add_n, waitall).
"""

from __future__ import annotations


from .._lib.errors import DnnbindError, DnnbindTypeError, DnnbindValueError

from ..runtime.array import NDArray  # noqa: F401  (nd.NDArray)
from . import _composite_layers, _graph_ops, _indexing, _linalg, _shape, _sort, _table  # noqa: F401  (each registers its ops)
from ._creation import arange, array, empty, eye, full, linspace, ones, zeros  # noqa: F401
from ._bn_fused import BatchNormAddRelu  # noqa: F401
from ._helpers import pick_nll, softmax_ce_per_sample, waitall  # noqa: F401
from ._registry import REGISTRY, Op, call, invoke, lib_op  # noqa: F401
from ._params import drop_ignored, ignores_keywords, into, reject  # noqa: E402
from ..ops import defs as _defs  # noqa: E402,F401  (declares the library-backed operators)
from ..ops.opdef import DEFS as _DEFS, set_table as _set_table  # noqa: E402
from ._registry import untaped_call as _untaped_call  # noqa: E402

_set_table(_untaped_call)

for _d in _DEFS.values():
    lib_op(_d)
from . import random  # noqa: E402,F401
from . import contrib, linalg  # noqa: E402,F401

def _accepted(op: Op) -> tuple:
    """The keywords an nd table function takes: the op's declared parameters, and for a ``func`` op the keyword
    parameters of its check (``concat``'s dim and num_args). Anything else is refused with MXNet's "Cannot find
    argument" before the op runs (the internal ``call`` path, which passes the ops' own parameters, is unchecked)."""
    names = list(op.params)
    if op.kind == "func" and op.check is not None:
        import inspect
        skip = op.arity or 0
        for i, p in enumerate(inspect.signature(op.check).parameters.values()):
            if p.kind is p.KEYWORD_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and i >= skip):
                if p.name not in names:
                    names.append(p.name)
    return tuple(names)


def _mxnet_name(op: Op) -> str:
    """The operator name MXNet's messages use: the entry's own where MXNet declares it (``add_n``), else its
    capitalized alias (``Concat`` for nd.concat)."""
    from ._mxnet_params import DECLARED
    if op.name in DECLARED:
        return op.name
    return next((n for n in op.nd_names if n[:1].isupper()), op.name)


# MXNet's elemwise_* operators (and their _plus/_minus/... spellings, what a symbol's ``a + b`` runs) take operands
# of one shape; they share the broadcasting ops' table entries here, so the names check it themselves.
_SAME_SHAPE = frozenset(["elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div", "_plus", "_minus", "_mul",
                         "_div"])


def _same_shapes(nd_name: str, args) -> None:
    shapes = [a.shape for a in args if isinstance(a, NDArray)]
    for i, s in enumerate(shapes[1:], 1):
        if s != shapes[0]:
            raise DnnbindValueError(f"{nd_name}: Incompatible attr at {i}-th input: expected {shapes[0]}, got {s} "
                                    f"(MXNet's elemwise operators do not broadcast; use broadcast_* for that)")


def _where_args(args: tuple) -> tuple:
    """MXNet's ``where`` never broadcasts: x and y share a shape, and the condition has it too, or is 1-D with
    x.shape[0] elements choosing whole rows (GluonCV's FPN R-CNNs). The 1-D condition becomes an (N, 1, ..., 1) view
    for the table op; every other mismatch is refused with the shapes, as MXNet refuses it."""
    if len(args) != 3 or not all(isinstance(a, NDArray) for a in args):
        return args
    c, x, y = args
    if x.shape != y.shape:
        raise DnnbindValueError(f"where: x and y must have the same shape, got x {x.shape} and y {y.shape} "
                                f"(MXNet's where does not broadcast)")
    if c.shape == x.shape:
        return args
    if c.ndim == 1 and x.ndim >= 1 and c.shape[0] == x.shape[0]:
        return (c.reshape((c.shape[0],) + (1,) * (x.ndim - 1)), x, y)
    raise DnnbindValueError(f"where: condition {c.shape} must have x's shape {x.shape}, or be 1-D with x.shape[0] = "
                            f"{x.shape[0] if x.ndim else 0} elements (MXNet's where does not broadcast)")


def _declared_doc(*names) -> str:
    """MXNet's parameter list of the first of ``names`` it declares, for a table op's docstring ("" if none)."""
    from ._mxnet_params import ALIASES, DECLARED
    from ._schema import schema
    for n in names:
        if n in DECLARED or n in ALIASES:
            return "\n\n" + schema(n).doc()
    return ""


def _string_params(*names):
    """The parser for MXNet's string form of parameter values (``axis='(0, 1)'``, ``depth='3'``: what MXNet's
    frontend itself sends and a config file holds), from the schema of the first of ``names`` MXNet declares: a
    str value of a parameter declared with a non-string type is parsed as MXNet parses it. None if none is
    declared (dnnbind's own functions take Python values only)."""
    from ._mxnet_params import ALIASES, DECLARED
    from ._schema import parse_value, schema
    for n in names:
        if n in DECLARED or n in ALIASES:
            sch = schema(n)

            def parse(params: dict) -> None:
                for k, v in params.items():
                    if type(v) is str and sch.declares(k):
                        params[k] = parse_value(sch.op, sch.param(k), v)
            return parse
    return None


def _make_function(op: Op, nd_name: str):
    names = op.params
    accepted = _accepted(op)
    allowed, mx_name = frozenset(accepted), _mxnet_name(op)
    same_shape = nd_name in _SAME_SHAPE
    rows_where = nd_name == "where"  # decided once here, not on every call of every table function
    strings = _string_params(nd_name, mx_name)
    ignores = ignores_keywords(mx_name)

    def fn(*args, out=None, name=None, **params):
        if params:
            if not allowed.issuperset(params):  # a misspelled keyword never runs with a default
                if not ignores:
                    reject(mx_name, {k: v for k, v in params.items() if k not in allowed}, accepted)
                params = drop_ignored(mx_name, params, allowed)
            if strings is not None:
                strings(params)
        if same_shape:
            _same_shapes(nd_name, args)
        elif rows_where:
            args = _where_args(args)
        n = len(args) if op.arity is None else op.arity
        if len(args) == n and out is None:  # the common call: operands only, parameters by keyword
            return invoke(op, args, params)
        if len(args) > n + len(names):
            raise DnnbindTypeError(f"{nd_name}() takes at most {n + len(names)} positional arguments "
                            f"({', '.join(('data',) * n + names)}), got {len(args)}")
        operands, extra = args[:n], args[n:]
        if len(operands) < n:
            raise DnnbindTypeError(f"{nd_name}() needs {n} operand(s), got {len(operands)}")
        for k, v in zip(names, extra):
            if k in params:
                raise DnnbindTypeError(f"{nd_name}() got multiple values for argument {k!r}")
            params[k] = v
        result = invoke(op, operands, params)
        if out is not None:
            out[:] = result
            return out
        return result

    fn.__name__ = fn.__qualname__ = nd_name
    fn.__doc__ = (op.doc or f"MXNet ``nd.{nd_name}`` (dnnbind table op {op.name!r}, kind {op.kind}).") + _declared_doc(
        nd_name, mx_name)
    return fn


def _make_composite_function(op: Op, nd_name: str):
    """``nd.<name>`` of a composite op: its function's own signature, with MXNet's refusal of unknown keywords,
    its string parameter values parsed, and ``out=``."""
    import inspect
    impl = op.cpu
    sig = inspect.signature(impl).parameters.values()
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig)  # the function checks its own keywords (reshape)
    accepted = tuple(p.name for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    allowed, mx_name = frozenset(accepted), _mxnet_name(op)
    strings = _string_params(nd_name, mx_name)
    from ._mxnet_params import ALIASES, DECLARED
    possible = None if mx_name in DECLARED or mx_name in ALIASES else accepted  # MXNet's list where it has one

    ignores = ignores_keywords(mx_name)

    def fn(*args, out=None, name=None, **params):
        if params:
            if not open_kwargs and not allowed.issuperset(params):
                if not ignores:
                    reject(mx_name, {k: v for k, v in params.items() if k not in allowed}, possible)
                params = drop_ignored(mx_name, params, allowed)
            if strings is not None:
                strings(params)
        try:
            result = impl(*args, **params)
        except DnnbindError:
            raise
        except (TypeError, ValueError, IndexError) as exc:
            # A composite checks what its own arithmetic needs; what slips past (a list where an int goes, a
            # surplus positional argument) still reaches the caller as MXNet's error, naming the operator.
            kind = DnnbindTypeError if isinstance(exc, TypeError) else DnnbindValueError
            raise kind(f"{mx_name}: {exc}") from exc
        return result if out is None else into(out, result)

    fn.__name__ = fn.__qualname__ = nd_name
    fn.__doc__ = (op.doc or f"MXNet ``nd.{nd_name}``.") + _declared_doc(nd_name, mx_name)
    return fn


def _make_lib_function(op: Op, nd_name: str):
    """``nd.<Op>`` of a lib op, with MXNet's calling convention: the input arrays first (by position or by name),
    then the parameters (by name, or by position in MXNet's declared order), ``out=`` and ``name=``."""
    inputs = tuple(i.name for i in op.schema.inputs)
    names = tuple(p.name for p in op.schema.params)
    n, input_set = len(inputs), frozenset(inputs)
    variadic = op.count is not None  # every positional argument is an input array (UpSampling's data)

    def fn(*args, out=None, name=None, **params):
        if variadic:
            if "data" in params:  # data= by name: one array, or the list of them
                given = params.pop("data")
                args = args + (tuple(given) if isinstance(given, (list, tuple)) else (given,))
        elif len(args) > n or not input_set.isdisjoint(params):
            arrays = list(args[:n]) + [None] * (n - len(args))  # (a negative count makes no Nones)
            for k, v in zip(names, args[n:]):
                if k in params:
                    raise DnnbindTypeError(f"{nd_name}() got multiple values for argument {k!r}")
                params[k] = v
            if len(args) > n + len(names):
                raise DnnbindTypeError(f"{nd_name}() takes at most {n + len(names)} positional arguments, got "
                                       f"{len(args)}")
            for i, k in enumerate(inputs):
                if k in params:
                    if arrays[i] is not None:
                        raise DnnbindTypeError(f"{nd_name}() got multiple values for argument {k!r}")
                    arrays[i] = params.pop(k)
            while arrays and arrays[-1] is None:
                arrays.pop()
            args = tuple(arrays)
        result = invoke(op, args, params)
        if out is None:
            return result
        if isinstance(result, tuple):  # several outputs: out is a list of arrays, one per output (MXNet's)
            if not isinstance(out, (list, tuple)) or len(out) != len(result):
                raise DnnbindTypeError(f"{nd_name}: out must be a list of {len(result)} NDArrays (one per output)")
            return tuple(into(o, r) for o, r in zip(out, result))
        return into(out, result)

    fn.__name__ = fn.__qualname__ = nd_name
    fn.__doc__ = f"{op.doc}\n\n{op.schema.doc()}" if op.doc else op.schema.doc()
    return fn


def _build_namespace(ns: dict) -> list:
    made = []
    for op in REGISTRY.values():
        for nd_name in op.nd_names:
            if nd_name in ns and not getattr(ns[nd_name], "_generated", False):
                raise RuntimeError(f"nd.{nd_name} is defined twice (table op {op.name!r} and a function)")
            make = {"lib": _make_lib_function, "composite": _make_composite_function}.get(op.kind, _make_function)
            fn = make(op, nd_name)
            fn._generated = True
            ns[nd_name] = fn
            made.append(nd_name)
    return made


_generated = _build_namespace(globals())
_table.bind_nd_functions(globals())


def _operator_table() -> dict:
    """MXNet operator name -> (the registry entry, the function a graph node calls with its inputs and parameters):
    the nd function where the entry has one (its keyword checks and string parsing), else the dispatch itself
    (the internal ``_plus_scalar`` family). MXNet's aliases of each name (``_Plus``, ``_npi_*``) map too."""
    from ._mxnet_params import ALIASES
    table = {}
    for op in REGISTRY.values():
        def direct(*args, _op=op, **params):
            return invoke(_op, args, params)
        table.setdefault(op.name, (op, globals()[op.nd_names[0]] if op.nd_names else direct))
        for n in op.nd_names:
            table.setdefault(n, (op, globals()[n]))
    for alias, canonical in ALIASES.items():
        if canonical in table:
            table.setdefault(alias, table[canonical])
    return table


OPERATORS = _operator_table()


def save(fname, data) -> None:
    """``nd.save``: MXNet 1.x's binary NDArray file (a list or a dict of arrays)."""
    from .. import serialization
    serialization.save(fname, data)


def load(fname):
    """``nd.load``: a list, or a dict when the file has names; arrays on the cpu."""
    from .. import serialization
    return serialization.load(fname)


def load_frombuffer(buf):
    from .. import serialization
    return serialization.load_bytes(buf)


def Custom(*data, op_type=None, out=None, name=None, **kwargs):
    """``nd.Custom(*inputs, op_type='name', **kwargs)``: the Python operator registered as ``name`` with
    ``mx.operator.register`` (dnnbind/custom_op.py) on ``inputs`` (its arguments, then its auxiliary states); the
    keyword arguments reach its CustomOpProp as strings. One output is an NDArray, several a list."""
    from ..custom_op import invoke  # lazy: the registry of Python operators, beside autograd (it runs user code)
    result = invoke(data, op_type, kwargs)
    if out is None:
        return result
    if isinstance(result, list):
        if not isinstance(out, (list, tuple)) or len(out) != len(result):
            raise DnnbindTypeError(f"Custom: out must be a list of {len(result)} NDArrays (one per output)")
        return [into(o, r) for o, r in zip(out, result)]
    return into(out, result)


def concatenate(arrays, axis=0, always_copy=True):
    return concat(*arrays, dim=axis)  # noqa: F821  (generated)


from . import _methods  # noqa: E402  (installs the NDArray methods and operators)

_methods.install(globals())

__all__ = sorted({*_generated, "arange", "array", "empty", "eye", "full", "linspace", "ones", "zeros", "pick_nll",
                  "softmax_ce_per_sample", "waitall", "save", "load", "load_frombuffer", "concatenate", "NDArray",
                  "random", "contrib", "linalg", "BatchNormAddRelu", "Custom"})
