"""Layer symbol: running a graph. Each node calls the same nd function an eager MXNet program would call (so the
same cuDNN/cuBLAS calls and NVRTC kernels run, and autograd records them: a loaded graph can be fine-tuned), with
the parameters the node was given, parsed as MXNet parses them. Imports nd, autograd and this package's graph.

``evaluate(symbol, values)`` runs the graph once on ``values`` (variable name -> NDArray) and returns its outputs.
Operators dnnbind has no implementation for are refused when the graph is checked (``check``), naming them, before
anything runs.
"""

from __future__ import annotations

from typing import Callable

from .. import nd
from .._lib.errors import DnnbindValueError
from ..features import UnsupportedFeature
from . import _custom, _infer
from ._graph import Node, Symbol

__all__ = ["check", "evaluate", "OPS"]


def _node_call(fn: Callable) -> Callable:
    return lambda inputs, given, node: fn(*inputs, **given)


# Every registry entry under each of its MXNet names (nd.OPERATORS): a node calls what an eager program calls.
OPS: dict[str, Callable] = {name: _node_call(fn) for name, (op, fn) in nd.OPERATORS.items()}
OPS["Custom"] = lambda inputs, given, node: _custom.run(inputs, node)  # a Python operator (custom_op.py)


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


def _open_shapes(symbol: Symbol, values: dict) -> dict:
    """{id(node): its shape} for the creation nodes whose ``shape`` has unknown (0) dims (an exported RNN layer's
    ``_zeros`` begin state of batch 0): filled in by shape inference from the values' shapes, as MXNet binds them."""
    open_nodes = [n for n in symbol._topo() if n.op in _infer.SHAPED and 0 in tuple(n.params.get("shape") or ())]
    if not open_nodes:
        return {}
    shapes, _ = _infer.node_shapes(symbol, {k: v.shape for k, v in values.items()})
    return {id(n): shapes.get((id(n), 0)) for n in open_nodes}


def evaluate(symbol: Symbol, values: dict) -> list:
    """Run ``symbol`` on ``values`` (variable name -> NDArray); returns its outputs in order."""
    results: dict[int, list] = {}
    filled = _open_shapes(symbol, values)
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
        given = _given(n)
        if id(n) in filled:
            if filled[id(n)] is None or 0 in filled[id(n)]:
                raise DnnbindValueError(f"evaluate: node {n.name!r} ({n.op}) has shape {n.params['shape']} with "
                                        f"unknown dims that no operator using it determines")
            given["shape"] = filled[id(n)]
        out = fn(inputs, given, n)
        results[id(n)] = list(out) if isinstance(out, (list, tuple)) else [out]
    return [results[id(n)][i] for n, i in symbol._outputs]
