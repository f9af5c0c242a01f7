"""Layer symbol: MXNet's symbol files (``-symbol.json``), written as MXNet 1.9.1 writes them and read as it reads
them, older spellings included.

The file: ``nodes`` in topological order (``op`` "null" for a variable; ``attrs`` the given parameters and scope
attributes as strings, keys sorted; ``inputs`` as ``[node, output, version]``), ``arg_nodes`` (the variables),
``node_row_ptr`` (where each node's outputs start), ``heads`` (the outputs), and ``attrs.mxnet_version``. The
layout is dmlc-core's JSON writer's, so a file dnnbind writes is byte for byte the file MXNet writes for the same
graph.

Older files (MXNet 0.x to 1.x) are read too, as MXNet's ``load_json`` upgrades them: a node's parameters under
``param`` and its other attributes under ``attr`` (older spellings of ``attrs``), hidden keys without underscores
(``ctx_group`` for ``__ctx_group__``), 2-element input entries (no version), and ``backward_source_id``.
"""

from __future__ import annotations

import json

from .._lib.errors import DnnbindValueError
from ..nd._mxnet_params import ALIASES, DECLARED
from ..nd._schema import schema
from . import _opio
from ._graph import Node, Symbol

MXNET_VERSION = 10901  # the version dnnbind's files claim: MXNet 1.9.1's API

# attributes MXNet keeps as hidden "__key__" whatever spelling an old file used
_HIDDEN = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage", "init", "shape", "dtype",
           "storage_type", "profiler_scope")


def _q(s: str) -> str:
    return json.dumps(s)


def _array(items: list[str], indent: str) -> str:
    """dmlc's JSON array: on one line up to 10 elements, else one element per line (its writer's rule)."""
    if len(items) <= 10:
        return "[" + ", ".join(items) + "]"
    inner = indent + "  "
    return "[\n" + ", \n".join(inner + x for x in items) + "\n" + indent + "]"


def dumps(sym: Symbol) -> str:
    nodes = sym._topo()
    index = {id(n): i for i, n in enumerate(nodes)}
    # an entry carries its node's version: 1 for a variable some operator mutates (an auxiliary state), else 0
    mutated = sym._aux_nodes()
    lines = ["{", '  "nodes": [']
    row_ptr, total = [0], 0
    for k, n in enumerate(nodes):
        lines.append("    {")
        lines.append(f'      "op": {_q(n.op or "null")}, ')
        lines.append(f'      "name": {_q(n.name)}, ')
        if len(n.attrs) == 1:  # dmlc writes a one-entry map on its line
            (key, value), = n.attrs.items()
            lines.append(f'      "attrs": {{{_q(key)}: {_q(value)}}}, ')
        elif n.attrs:
            lines.append('      "attrs": {')
            keys = sorted(n.attrs)
            for j, key in enumerate(keys):
                lines.append(f'        {_q(key)}: {_q(n.attrs[key])}' + (", " if j < len(keys) - 1 else ""))
            lines.append("      }, ")
        entries = [f"[{index[id(src)]}, {i}, {int(id(src) in mutated)}]" for src, i in n.inputs]
        lines.append(f'      "inputs": {_array(entries, "      ")}')
        lines.append("    }" + (", " if k < len(nodes) - 1 else ""))
        total += n.num_outputs
        row_ptr.append(total)
    lines.append("  ], ")
    args = [i for i, n in enumerate(nodes) if n.op is None]
    lines.append(f'  "arg_nodes": {_array([str(a) for a in args], "  ")}, ')
    lines.append(f'  "node_row_ptr": {_array([str(r) for r in row_ptr], "  ")}, ')
    heads = [f"[{index[id(n)]}, {i}, {int(id(n) in mutated)}]" for n, i in sym._outputs]
    lines.append(f'  "heads": {_array(heads, "  ")}, ')
    lines.append(f'  "attrs": {{"mxnet_version": ["int", {MXNET_VERSION}]}}')
    lines.append("}")
    return "\n".join(lines)


def _node_attrs(raw: dict) -> dict:
    attrs = {}
    for key in ("param", "attr", "attrs"):  # oldest first: a newer spelling wins
        part = raw.get(key)
        if not part:
            continue
        if not isinstance(part, dict):
            raise DnnbindValueError(f"symbol file: node {raw.get('name')!r} has {key} that is not an object")
        for k, v in part.items():
            if key == "attr" and k in _HIDDEN:
                k = f"__{k}__"
            attrs[k] = v if isinstance(v, str) else str(v)
    return attrs


def _entry(e, n_nodes: int, what: str) -> tuple[int, int]:
    if not isinstance(e, list) or len(e) not in (2, 3) or not all(isinstance(x, int) for x in e):
        raise DnnbindValueError(f"symbol file: {what} entry {e!r} is not [node, output(, version)]")
    if not 0 <= e[0] < n_nodes:
        raise DnnbindValueError(f"symbol file: {what} entry {e!r} names node {e[0]}, but there are {n_nodes}")
    return e[0], e[1]


def loads(text: str) -> Symbol:
    """A Symbol from the text of a symbol file (``mx.sym.load_json``)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DnnbindValueError(f"symbol file: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or "heads" not in doc:
        raise DnnbindValueError("symbol file: expected an object with 'nodes' and 'heads' (an MXNet -symbol.json)")
    raw_nodes = doc["nodes"]
    nodes: list[Node] = []
    for k, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict) or "op" not in raw or "name" not in raw:
            raise DnnbindValueError(f"symbol file: node {k} lacks 'op' or 'name'")
        attrs = _node_attrs(raw)
        inputs = [_entry(e, k, f"node {raw['name']!r} input") for e in raw.get("inputs", [])]
        op = raw["op"]
        if op == "null":
            nodes.append(Node(None, raw["name"], attrs))
            continue
        canonical = ALIASES.get(op, op)
        if canonical not in DECLARED:
            raise DnnbindValueError(f"symbol file: node {raw['name']!r} uses operator {op!r}, which dnnbind does not "
                                    "implement")
        sch = schema(canonical)
        # as MXNet's parameter parser: hidden "__key__" attributes pass, any other undeclared one is an error
        params = sch.parse({k: v for k, v in attrs.items() if not (k.startswith("__") and k.endswith("__"))})
        names = _opio.inputs(canonical, sch, params, len(inputs))
        aux = [pos for pos, name in enumerate(names) if name in _opio.aux_inputs(canonical)]
        total, visible = _opio.outputs(canonical, params)
        entries = []
        for src, i in inputs:
            if i >= nodes[src].num_outputs:
                raise DnnbindValueError(f"symbol file: node {raw['name']!r} reads output {i} of "
                                        f"{nodes[src].name!r}, which has {nodes[src].num_outputs}")
            entries.append((nodes[src], i))
        nodes.append(Node(canonical, raw["name"], attrs, entries, params, total, visible, aux))
    heads = [_entry(e, len(nodes), "head") for e in doc["heads"]]
    return Symbol([(nodes[n], i) for n, i in heads])
