"""Layer symbol: shape and dtype inference over a graph (``Symbol.infer_shape``, ``infer_shape_partial``,
``infer_type``), without running it.

Shapes flow forward from what is known (the caller's shapes, a variable's ``__shape__``). Operators with learned
inputs fill those in from their data, as MXNet's: Convolution's weight is (num_filter, C / num_group, *kernel),
FullyConnected's (num_hidden, inputs), BatchNorm's gamma, beta and statistics (C,), and so on. Outputs follow each
operator's rule: an operator's OpDef (ops/defs/) carries its own (``infer``), the table below holds the rules of
operators that are not OpDefs yet; an operator without a rule is run once on zeros of its input shapes on the cpu
(its numpy twin), which gives the same answer more slowly. A shape that contradicts another is an error naming the node.
"""

from __future__ import annotations

import numpy as np

from .._lib.errors import DnnbindValueError
from ..nd._schema import Param, parse_value
from ..nd._shape import infer_reshape
from . import _opio
from ._graph import Node, Symbol

__all__ = ["infer_shapes", "infer_types"]


_SHAPE = Param("__shape__", "shape", "Shape(tuple)", False, None, None, True)  # a variable's __shape__


def _same(p, shapes):
    """Element-wise: every input and the output have the first input's shape."""
    return [shapes[0]] * len(shapes), [shapes[0]]


def _concat(p, shapes):
    dim = p["dim"] if p["dim"] >= 0 else len(shapes[0]) + p["dim"]
    out = list(shapes[0])
    out[dim] = sum(s[dim] for s in shapes)
    return list(shapes), [tuple(out)]


def _slice_channel(p, shapes):
    data, n = shapes[0], p["num_outputs"]
    axis = p["axis"] if p["axis"] >= 0 else len(data) + p["axis"]
    piece = list(data)
    piece[axis] //= n
    if p["squeeze_axis"]:
        piece.pop(axis)
    return [data], [tuple(piece)] * n


def _reshape(p, shapes):
    spec = p["shape"] if p["shape"] else p.get("target_shape")
    return [shapes[0]], [infer_reshape("Reshape", tuple(shapes[0]), tuple(spec), p["reverse"])]


def _broadcast(p, shapes):
    a, b = shapes
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise DnnbindValueError(f"operands could not be broadcast together with shapes {shapes[0]} {shapes[1]}")
        out.append(max(x, y) if 1 in (x, y) else x)
    return list(shapes), [tuple(out)]


def _reduce(p, shapes):
    data = shapes[0]
    axis = p.get("axis")
    n = len(data)
    if axis is None or axis == ():
        axes = set(range(n))
    else:
        axes = {a if a >= 0 else n + a for a in (axis if isinstance(axis, tuple) else (axis,))}
    if p.get("exclude"):
        axes = set(range(n)) - axes
    if p.get("keepdims"):
        out = tuple(1 if i in axes else d for i, d in enumerate(data))
    else:
        out = tuple(d for i, d in enumerate(data) if i not in axes) or (1,)
    return [data], [out]


RULES = {
    "Concat": _concat, "SliceChannel": _slice_channel, "Reshape": _reshape,
    **{op: _same for op in (
        "softmin", "clip", "Cast", "BlockGrad", "_copy",
        "relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "square", "negative",
        "SoftmaxActivation", "L2Normalization", "elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div",
        "add_n", "_plus_scalar", "_minus_scalar", "_rminus_scalar", "_mul_scalar", "_div_scalar", "_rdiv_scalar",
        "_mod_scalar", "_rmod_scalar", "_power_scalar", "_rpower_scalar", "_maximum_scalar", "_minimum_scalar",
        "_equal_scalar", "_not_equal_scalar", "_greater_scalar", "_greater_equal_scalar", "_lesser_scalar",
        "_lesser_equal_scalar")},
    **{op: _broadcast for op in (
        "broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div", "broadcast_maximum",
        "broadcast_minimum", "broadcast_power", "broadcast_mod", "broadcast_equal", "broadcast_not_equal",
        "broadcast_greater", "broadcast_greater_equal", "broadcast_lesser", "broadcast_lesser_equal",
        "_maximum", "_minimum", "_power", "_mod", "_equal", "_not_equal", "_greater", "_greater_equal",
        "_lesser", "_lesser_equal")},
    **{op: _reduce for op in ("sum", "mean", "max", "min", "prod", "nansum", "nanprod", "argmax", "argmin")},
}


# Operators with no inputs whose output shape is their ``shape`` parameter (MXNet's creation and random nodes;
# ``_arange`` is run instead, its length is arithmetic on its parameters).
SHAPED = frozenset(["_zeros", "_ones", "_full", "_random_uniform", "_random_normal", "_random_randint"])


def _shape_param(p, shapes):
    return [], [tuple(p["shape"] or ())]


# rules that fill in unknown inputs from the first (the learned parameters, labels, element-wise operands)
_FILLS = {_same}


def _by_running(node: Node, shapes: list) -> list:
    """Output shapes of an operator without a rule: run it once on zeros on the cpu."""
    from .. import nd
    from ..runtime.device import cpu
    from ._exec import OPS, check
    if node.op not in OPS:
        check(Symbol([(node, 0)]))
    zeros = [nd.zeros(s, ctx=cpu()) for s in shapes]
    out = OPS[node.op](zeros, {k: v for k, v in node.params.items() if k in node.attrs}, node)
    return [tuple(o.shape) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _known(shape) -> bool:
    return shape is not None and all(d > 0 for d in shape)


def infer_shapes(symbol: Symbol, given: dict, partial: bool):
    """(arg shapes, output shapes, aux shapes), in list_arguments/list_outputs/list_auxiliary_states order, with
    None where a shape stays unknown (``partial``) — or (None, None, None) when anything does and not partial."""
    shapes, nodes = node_shapes(symbol, given)
    aux = symbol._aux_nodes()
    args = [shapes.get((id(n), 0)) for n in nodes if n.op is None and id(n) not in aux]
    auxs = [shapes.get((id(n), 0)) for n in nodes if n.op is None and id(n) in aux]
    outs = [shapes.get((id(n), i)) for n, i in symbol._outputs]
    if not partial and any(not _known(s) for s in args + auxs + outs):
        return None, None, None
    if partial:
        fix = lambda s: s if s is not None else ()  # noqa: E731  (MXNet's partial answer: () for unknown)
        return [fix(s) for s in args], [fix(s) for s in outs], [fix(s) for s in auxs]
    return args, outs, auxs


def node_shapes(symbol: Symbol, given: dict):
    """({(id(node), output index): shape} for every entry inference reaches, the nodes in order). A creation
    node's unknown dims (an exported RNN layer's begin state, ``_zeros`` of batch 0) are filled in from the
    operator that consumes it, as MXNet's backward shape inference fills them."""
    shapes: dict[tuple[int, int], tuple] = {}
    nodes = symbol._topo()
    var_shape = {}
    for n in nodes:
        if n.op is None:
            s = given.get(n.name)
            if s is None and "__shape__" in n.attrs:
                s = parse_value("Variable", _SHAPE, n.attrs["__shape__"])
            var_shape[id(n)] = tuple(s) if s is not None else None
            shapes[(id(n), 0)] = var_shape[id(n)]
    unknown_inputs = set(given) - {n.name for n in nodes if n.op is None}
    if unknown_inputs:
        raise DnnbindValueError(f"infer_shape: {sorted(unknown_inputs)[0]!r} is not an input of the graph")
    for n in nodes:
        if n.op is None:
            continue
        ins = [shapes.get((id(src), i)) for src, i in n.inputs]
        d = _opio.opdef(n.op)
        rule = d.infer if d is not None else RULES.get(n.op)
        if n.op == "Custom":  # a Python operator: its Prop says (and may fill in its auxiliary states)
            from ._custom import infer_shape as rule
        # an OpDef's rule fills in its learned inputs from the data
        fills = d is not None or rule in _FILLS or n.op == "Custom"
        if ins and (not _known(ins[0]) or (not fills and not all(_known(s) for s in ins))):
            continue  # not yet: a later call with more shapes given may get further
        if not ins and n.op in SHAPED:  # a creation node (_zeros, _random_uniform): its shape parameter
            rule = _shape_param
        try:
            if rule is not None:
                want_in, outs = rule(n.params, ins)
            else:
                want_in, outs = ins, _by_running(n, ins)
        except (KeyError, IndexError, ZeroDivisionError, TypeError) as exc:
            raise DnnbindValueError(f"infer_shape: node {n.name!r} ({n.op}) cannot take inputs of shapes {ins}: "
                                    f"{exc}") from None
        for (src, i), have, want in zip(n.inputs, ins, want_in):
            if have is not None and _known(have) and tuple(have) != tuple(want):
                raise DnnbindValueError(f"infer_shape: node {n.name!r} ({n.op}) expects input {src.output_name(i)} "
                                        f"of shape {tuple(want)}, but it is {tuple(have)}")
            if have is None or not _known(have):
                shapes[(id(src), i)] = tuple(want)
        for i, s in enumerate(outs[:n.num_outputs]):
            if (id(n), i) not in shapes or not _known(shapes[(id(n), i)]):
                shapes[(id(n), i)] = tuple(s)
    return shapes, nodes


def _elementwise(p, types, n_out):
    """MXNet's element-wise type rule: every input and output share one type."""
    t = next((x for x in types if x is not None), None)
    return [t] * len(types), [t] * n_out


def _type_rule(op: str):
    """The operator's own type rule where its registry entry declares one (nd.OPERATORS), else element-wise."""
    from .. import nd
    if op == "Custom":  # a Python operator: its Prop's infer_type
        from ._custom import infer_type
        return infer_type
    found = nd.OPERATORS.get(op)
    rule = found[0].dtype if found is not None else None
    return rule if rule is not None else _elementwise


def infer_types(symbol: Symbol, given: dict):
    """(arg types, output types, aux types) as numpy type classes (what MXNet returns), or (None, None, None) when
    some stay unknown. Types flow through every operator, both ways, by its registry entry's rule: the element-wise
    one (inputs and outputs share one type, so a weight takes its data's type) unless the entry declares its own
    (Cast's and one_hot's ``dtype``, BatchNorm's float32 parameters under float16 data, an index's own type)."""
    from ._graph import DTYPE_FLAGS
    names = {v: k for k, v in DTYPE_FLAGS.items()}
    nodes = symbol._topo()
    types: dict[int, np.dtype | None] = {}  # id(variable node) -> its type
    for n in nodes:
        if n.op is None:
            t = given.get(n.name)
            if t is None and "__dtype__" in n.attrs:
                t = names.get(int(n.attrs["__dtype__"]))
            types[id(n)] = np.dtype(t) if t is not None else None
    unknown_inputs = set(given) - {n.name for n in nodes if n.op is None}
    if unknown_inputs:
        raise DnnbindValueError(f"infer_type: {sorted(unknown_inputs)[0]!r} is not an input of the graph")
    out_types: dict[tuple[int, int], np.dtype | None] = {}
    for n in nodes:
        if n.op is None:
            out_types[(id(n), 0)] = types[id(n)]
    for _ in range(len(nodes) + 1):  # until nothing changes: a later type flows back to earlier variables
        changed = False
        for n in nodes:
            if n.op is None:
                continue
            seen = [out_types.get((id(src), i)) for src, i in n.inputs]
            ins, outs = _type_rule(n.op)(n.params, seen, n.num_outputs)
            for (src, i), t in zip(n.inputs, ins):
                if t is not None and src.op is None and types[id(src)] is None:  # a variable takes the rule's type
                    types[id(src)] = out_types[(id(src), 0)] = t
                    changed = True
            for i, t in enumerate(outs):
                if t is not None and out_types.get((id(n), i)) is None:
                    out_types[(id(n), i)] = np.dtype(t)
                    changed = True
        if not changed:
            break
    aux = symbol._aux_nodes()
    args = [types[id(n)] for n in nodes if n.op is None and id(n) not in aux]
    auxs = [types[id(n)] for n in nodes if n.op is None and id(n) in aux]
    outs = [out_types.get((id(n), i)) for n, i in symbol._outputs]
    if any(t is None for t in args + auxs + outs):
        return None, None, None
    return [t.type for t in args], [t.type for t in outs], [t.type for t in auxs]


# -- the Symbol methods (installed on Symbol by the package's __init__) ---------------------------------------------

def _given(sym: Symbol, what: str, args, kwargs) -> dict:
    if args and kwargs:
        raise DnnbindValueError(f"{what}: give the inputs by position or by name, not both")
    if args:
        names = sym.list_arguments()
        if len(args) > len(names):
            raise DnnbindValueError(f"{what}: {len(args)} values for {len(names)} arguments ({names})")
        return {n: a for n, a in zip(names, args) if a is not None}
    return {k: v for k, v in kwargs.items() if v is not None}


def infer_shape(self, *args, **kwargs):
    """(arg shapes, output shapes, aux shapes) from the shapes given (by name or in list_arguments order);
    (None, None, None) when some cannot be found."""
    return infer_shapes(self, _given(self, "infer_shape", args, kwargs), partial=False)


def infer_shape_partial(self, *args, **kwargs):
    """As infer_shape, with () for the shapes that stay unknown."""
    return infer_shapes(self, _given(self, "infer_shape_partial", args, kwargs), partial=True)


def infer_type(self, *args, **kwargs):
    """(arg types, output types, aux types) as numpy types from the types given."""
    return infer_types(self, _given(self, "infer_type", args, kwargs))
