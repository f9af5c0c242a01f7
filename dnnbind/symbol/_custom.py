"""Layer symbol: ``sym.Custom``, a node of a Python operator registered with ``mx.operator.register``
(dnnbind/custom_op.py). Imports this package's graph and custom_op (which imports nothing of dnnbind at import).

Unlike the operators MXNet declares, Custom's inputs, outputs and auxiliary states are whatever the registered
CustomOpProp lists, so the node is built here from the Prop rather than from a schema: inputs named by
``list_arguments`` then ``list_auxiliary_states`` (a missing one becomes the variable ``{node}_{name}``), outputs
``{node}_{output}``, the parameters (``op_type`` and the keyword arguments) kept as the strings MXNet stores.
Shape and type inference ask the Prop (a Prop is made per question, as MXNet makes one per node); the executor runs
``nd.Custom``, so a bound graph's backward calls the operator's backward through autograd.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import custom_op
from ._graph import Node, Symbol, scope_attrs, current_name_manager

__all__ = ["Custom", "node_from_file", "infer_shape", "infer_type", "run"]


def _kwargs(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != "op_type"}


def _node(name: str, attrs: dict, params: dict, entries: list, sp) -> Node:
    n_args = len(sp.arguments)
    aux = list(range(n_args, n_args + len(sp.aux)))
    return Node("Custom", name, attrs, entries, params, len(sp.outputs), list(sp.outputs), aux)


def Custom(*args, op_type=None, name=None, attr=None, **kwargs) -> Symbol:
    """``mx.sym.Custom(*inputs, op_type='name', **kwargs)``: inputs by position (arguments, then auxiliary states)
    or by their names in the Prop's lists."""
    symbols = {k: v for k, v in kwargs.items() if isinstance(v, Symbol)}
    given = {k: str(v) for k, v in kwargs.items() if not isinstance(v, Symbol)}
    for a in args:
        if not isinstance(a, Symbol):
            raise DnnbindTypeError(f"Custom: positional arguments must be Symbols, got {type(a).__name__}; give "
                                   "parameters by keyword")
    sp = custom_op.spec(op_type, given)
    names = sp.arguments + sp.aux
    if len(args) > len(names):
        raise DnnbindValueError(f"Custom {op_type}: {len(args)} inputs given, it takes {len(names)} "
                                f"({', '.join(names)})")
    unknown = [k for k in symbols if k not in names]
    if unknown:
        raise DnnbindValueError(f"Custom {op_type}: {unknown[0]} is not an input (inputs: {', '.join(names)})")
    node_name = current_name_manager().get(name, "custom")
    params = {"op_type": str(op_type), **given}
    attrs = scope_attrs(attr)
    attrs.update(params)
    entries = []
    for pos, input_name in enumerate(names):
        if pos < len(args):
            s = args[pos]
        elif input_name in symbols:
            s = symbols[input_name]
        else:
            s = Symbol([(Node(None, f"{node_name}_{input_name}", scope_attrs(attr)), 0)])
        if len(s._outputs) != 1:
            raise DnnbindValueError(f"Custom {op_type}: input {input_name} is a group of {len(s._outputs)} outputs")
        entries.append(s._outputs[0])
        if pos >= len(sp.arguments):
            s._outputs[0][0].version += 1  # an auxiliary state is mutated by the operator, as in make()
    node = _node(node_name, attrs, params, entries, sp)
    return Symbol([(node, i) for i in range(len(sp.outputs))])


def node_from_file(name: str, attrs: dict, entries: list) -> Node:
    """A Custom node of a symbol file (its op_type must be registered in this process, as in MXNet)."""
    params = {k: v for k, v in attrs.items() if not (k.startswith("__") and k.endswith("__"))}
    sp = custom_op.spec(params.get("op_type"), _kwargs(params))
    want = len(sp.arguments) + len(sp.aux)
    if len(entries) != want:
        raise DnnbindValueError(f"symbol file: node {name!r} (Custom {params.get('op_type')}) has {len(entries)} "
                                f"inputs, expected {want}")
    return _node(name, attrs, params, entries, sp)


def infer_shape(params: dict, shapes: list) -> tuple:
    """(input shapes incl. auxiliary states, output shapes) from the Prop's infer_shape."""
    sp = custom_op.spec(params["op_type"], _kwargs(params))
    n_args = len(sp.arguments)
    if any(s is None or 0 in tuple(s) for s in shapes[:n_args]):
        raise DnnbindValueError(f"Custom {params['op_type']}: the shapes of its arguments {sp.arguments} must be "
                                f"known to infer its outputs, got {shapes[:n_args]}")
    ins, outs, auxs = sp.shapes(shapes)
    return ins + auxs, outs


def infer_type(params: dict, types: list, n_out: int) -> tuple:
    """(input types incl. auxiliary states, output types) from the Prop's infer_type; None while unknown."""
    sp = custom_op.spec(params["op_type"], _kwargs(params))
    n_args = len(sp.arguments)
    if any(t is None for t in types[:n_args]):
        return list(types), [None] * n_out
    ins, outs, auxs = sp.types(types)
    return ins + auxs, outs


def run(inputs: list, node: Node):
    """The executor's call: nd.Custom on the node's inputs with its parameters."""
    return custom_op.invoke(inputs, node.params["op_type"], _kwargs(node.params))
