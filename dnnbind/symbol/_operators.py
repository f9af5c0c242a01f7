"""The operator functions of ``mx.sym`` and of its ``contrib``/``linalg`` namespaces, made on first use from the
operators nd/_mxnet_params.py declares. Layer symbol: imports nd's operator schemas and this package's graph.
"""

from __future__ import annotations

from ..nd._mxnet_params import ALIASES, DECLARED
from ._graph import Symbol, make


def positional_params(name: str, args: tuple, kwargs: dict):
    """MXNet's generated operator functions take the inputs, then the parameters in declared order, by position
    (``mx.sym.clip(x, 0, 6)``): the first positions are the operator's inputs (Symbols), the rest parameters."""
    from .._lib.errors import DnnbindTypeError
    from ..nd._schema import schema
    sch = schema(name)
    n_in = len(args) if sch.inputs and sch.inputs[0].variadic else len(sch.inputs)
    for inp, a in zip(sch.inputs, args[:n_in]):
        if not isinstance(a, Symbol):
            raise DnnbindTypeError(f"{name}: Argument {inp.name} must be Symbol instances, but got {a!r} "
                                   "(positional arguments must be Symbols up to the operator's inputs)")
    names = [p.name for p in sch.params]
    rest = args[n_in:]
    if len(rest) > len(names):
        raise DnnbindTypeError(f"{name}() takes at most {len(names)} parameters after its inputs, got {len(rest)}")
    kwargs = dict(kwargs)
    for pname, value in zip(names, rest):
        if pname in kwargs:
            raise DnnbindTypeError(f"{name}() got multiple values for argument {pname!r}")
        kwargs[pname] = value
    return args[:n_in], kwargs


def op_function(name: str):
    """``mx.sym.<name>``: a function that makes a ``name`` node."""
    def create(*args, **kwargs) -> Symbol:
        if args and not all(isinstance(a, Symbol) for a in args):
            args, kwargs = positional_params(name, args, kwargs)
        return make(name, *args, **kwargs)
    create.__name__ = create.__qualname__ = name
    from ..nd._schema import schema
    create.__doc__ = f"MXNet's {ALIASES.get(name, name)} operator on Symbols.\n\n{schema(name).doc()}"
    return create


def prefixed_op_function(prefix: str, name: str, module: str):
    """``sym.contrib.<name>`` / ``sym.linalg.<name>``: the operator MXNet names ``prefix + name``."""
    full = prefix + name
    if full in DECLARED or full in ALIASES:
        return op_function(full)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
