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
from ._graph import Node, Symbol

__all__ = ["check", "evaluate", "OPS"]


def _node_call(fn: Callable) -> Callable:
    return lambda inputs, given, node: fn(*inputs, **given)


# Every registry entry under each of its MXNet names (nd.OPERATORS): a node calls what an eager program calls.
OPS: dict[str, Callable] = {name: _node_call(fn) for name, (op, fn) in nd.OPERATORS.items()}


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
