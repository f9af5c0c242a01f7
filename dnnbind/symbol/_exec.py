"""Layer symbol: running a graph. Each node calls the same nd function an eager MXNet program would call (so the
same cuDNN/cuBLAS calls and NVRTC kernels run, and autograd records them: a loaded graph can be fine-tuned), with
the parameters the node was given, parsed as MXNet parses them. Imports nd, autograd and this package's graph.

``evaluate(symbol, values)`` runs the graph once on ``values`` (variable name -> NDArray) and returns its outputs.
Operators dnnbind has no implementation for are refused when the graph is checked (``check``), naming them, before
anything runs.
"""

from __future__ import annotations

import operator
from typing import Callable

from .. import nd
from .._lib.errors import DnnbindValueError
from ..features import UnsupportedFeature
from ._graph import Node, Symbol

__all__ = ["check", "evaluate", "OPS"]


def _nd(name: str) -> Callable:
    """The nd function of the same name, given the node's inputs in order and its given parameters."""
    fn = getattr(nd, name)
    return lambda inputs, given, node: fn(*inputs, **given)


def _scalar(node: Node):
    """A scalar operator's operand: an int where the file wrote one ("2"), else a float, as MXNet's frontend gave
    it (so an int array stays int under ``x * 2``)."""
    text = node.attrs.get("scalar", "1")
    try:
        return int(text)
    except ValueError:
        return float(text)


def _scalar_op(fn, reverse: bool = False) -> Callable:
    if reverse:
        return lambda inputs, given, node: fn(_scalar(node), inputs[0])
    return lambda inputs, given, node: fn(inputs[0], _scalar(node))


def _binary(fn) -> Callable:
    return lambda inputs, given, node: fn(inputs[0], inputs[1])


def _slice_channel(inputs, given, node):
    return nd.split(inputs[0], **given)


def _copy(inputs, given, node):
    return inputs[0].copy()


OPS: dict[str, Callable] = {
    # layers
    **{name: _nd(name) for name in ("Concat", "Cast", "SoftmaxActivation", "L2Normalization", "Pad")
       if hasattr(nd, name)},
    "SliceChannel": _slice_channel,
    "Reshape": lambda inputs, given, node: nd.reshape(inputs[0], **given),
    "BlockGrad": lambda inputs, given, node: nd.stop_gradient(inputs[0]),
    "_copy": _copy,
    # element-wise and tensor ops under their own names
    **{name: _nd(name) for name in (
        "abs", "exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "square", "sin", "cos", "tan",
        "tanh", "sigmoid", "relu", "sign", "floor", "ceil", "round", "rint", "trunc", "fix", "negative",
        "reciprocal", "erf", "gamma", "gammaln", "arccos", "arcsin", "arctan", "cbrt", "softsign",
        "clip", "expand_dims", "transpose", "sum", "mean", "max", "min", "prod", "nansum", "argmax", "argmin",
        "norm", "batch_dot", "dot", "add_n", "broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
        "broadcast_maximum", "broadcast_minimum", "broadcast_power", "broadcast_mod", "broadcast_equal",
        "broadcast_not_equal", "broadcast_greater", "broadcast_greater_equal", "broadcast_lesser",
        "broadcast_lesser_equal", "broadcast_to", "broadcast_axis", "broadcast_like", "elemwise_add",
        "elemwise_sub", "elemwise_mul", "elemwise_div", "slice", "slice_axis", "slice_like", "take", "pick",
        "one_hot", "tile", "repeat", "reverse", "stack", "squeeze", "where", "zeros_like", "ones_like",
        "topk", "sort", "argsort", "swapaxes", "SwapAxis", "shape_array", "size_array", "hard_sigmoid",
        "reshape_like", "softmin") if hasattr(nd, name)},
    # the internal operators MXNet's symbol arithmetic writes
    "_plus_scalar": _scalar_op(operator.add),
    "_minus_scalar": _scalar_op(operator.sub),
    "_rminus_scalar": _scalar_op(operator.sub, reverse=True),
    "_mul_scalar": _scalar_op(operator.mul),
    "_div_scalar": _scalar_op(operator.truediv),
    "_rdiv_scalar": _scalar_op(operator.truediv, reverse=True),
    "_mod_scalar": _scalar_op(operator.mod),
    "_rmod_scalar": _scalar_op(operator.mod, reverse=True),
    "_power_scalar": _scalar_op(operator.pow),
    "_rpower_scalar": _scalar_op(operator.pow, reverse=True),
    "_maximum_scalar": _scalar_op(nd.maximum),
    "_minimum_scalar": _scalar_op(nd.minimum),
    "_equal_scalar": _scalar_op(operator.eq),
    "_not_equal_scalar": _scalar_op(operator.ne),
    "_greater_scalar": _scalar_op(operator.gt),
    "_greater_equal_scalar": _scalar_op(operator.ge),
    "_lesser_scalar": _scalar_op(operator.lt),
    "_lesser_equal_scalar": _scalar_op(operator.le),
    "_maximum": _binary(nd.maximum),
    "_minimum": _binary(nd.minimum),
    "_power": _binary(nd.power),
    "_mod": _binary(operator.mod),
    "_equal": _binary(operator.eq),
    "_not_equal": _binary(operator.ne),
    "_greater": _binary(operator.gt),
    "_greater_equal": _binary(operator.ge),
    "_lesser": _binary(operator.lt),
    "_lesser_equal": _binary(operator.le),
}


def _lib(op):
    """An operator declared by an OpDef: the nd dispatch itself, with the node's inputs and given parameters."""
    return lambda inputs, given, node: nd.invoke(op, tuple(inputs), dict(given))


OPS.update({name: _lib(op) for name, op in nd.REGISTRY.items() if op.kind == "lib"})


def check(symbol: Symbol) -> None:
    """Refuse a graph with operators dnnbind cannot run, naming each (with a node that uses it)."""
    missing: dict[str, str] = {}
    for n in symbol._topo():
        if n.op is not None and n.op not in OPS:
            missing.setdefault(n.op, n.name)
    if missing:
        listed = ", ".join(f"{op} (node {name!r})" for op, name in sorted(missing.items()))
        raise UnsupportedFeature(f"this graph uses operators dnnbind cannot run yet: {listed}")


def _given(node: Node) -> dict:
    """The node's parameters as its file gave them (parsed), which is how an eager MXNet call passes them."""
    return {k: v for k, v in node.params.items() if k in node.attrs}


def evaluate(symbol: Symbol, values: dict) -> list:
    """Run ``symbol`` on ``values`` (variable name -> NDArray); returns its outputs in order."""
    results: dict[int, list] = {}
    for n in symbol._topo():
        if n.op is None:
            if n.name not in values:
                raise DnnbindValueError(f"evaluate: no value for the graph's input {n.name!r}")
            results[id(n)] = [values[n.name]]
            continue
        fn = OPS.get(n.op)
        if fn is None:
            check(symbol)
        inputs = [results[id(src)][i] for src, i in n.inputs]
        out = fn(inputs, _given(n), n)
        results[id(n)] = list(out) if isinstance(out, (list, tuple)) else [out]
    return [results[id(n)][i] for n, i in symbol._outputs]
