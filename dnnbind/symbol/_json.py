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
from ..nd._mxnet_params import ALIASES, DECLARED, VAR_ARGS
from ..nd._schema import schema
from . import _opio
from ._graph import Node, Symbol

MXNET_VERSION = 10901  # the version dnnbind's files claim: MXNet 1.9.1's API



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
        entries = [f"[{index[id(src)]}, {i}, {src.version}]" for src, i in n.inputs]
        lines.append(f'      "inputs": {_array(entries, "      ")}')
        lines.append("    }" + (", " if k < len(nodes) - 1 else ""))
        total += n.num_outputs
        row_ptr.append(total)
    lines.append("  ], ")
    args = [i for i, n in enumerate(nodes) if n.op is None]
    lines.append(f'  "arg_nodes": {_array([str(a) for a in args], "  ")}, ')
    lines.append(f'  "node_row_ptr": {_array([str(r) for r in row_ptr], "  ")}, ')
    heads = [f"[{index[id(n)]}, {i}, {n.version}]" for n, i in sym._outputs]
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
            attrs[k] = v if isinstance(v, str) else str(v)
    return attrs


def _entry(e, n_nodes: int, what: str) -> tuple[int, int, int]:
    if not isinstance(e, list) or len(e) not in (2, 3) or not all(isinstance(x, int) for x in e):
        raise DnnbindValueError(f"symbol file: {what} entry {e!r} is not [node, output(, version)]")
    if not 0 <= e[0] < n_nodes:
        raise DnnbindValueError(f"symbol file: {what} entry {e!r} names node {e[0]}, but there are {n_nodes}")
    return e[0], e[1], e[2] if len(e) == 3 else 0


def _hidden(attrs: dict, input_names: list[str]) -> tuple[dict, dict]:
    """MXNet's upgrade of hidden keys on an operator node: a bare ``lr_mult`` becomes ``__lr_mult__``, and
    ``weight_lr_mult`` moves to the input variable ``weight`` as its ``__lr_mult__``. Returns (the node's
    attributes, {input name: attributes for its variable})."""
    own, moved = {}, {}
    for k, v in attrs.items():
        for key in _HIDDEN_KEYS:
            if k == key:
                own[f"__{key}__"] = v
                break
            if k.endswith("_" + key) and k[:-len(key) - 1] in input_names:
                moved.setdefault(k[:-len(key) - 1], {})[f"__{key}__"] = v
                break
        else:
            own[k] = v
    return own, moved


_HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


def loads(text: str) -> Symbol:
    """A Symbol from the text of a symbol file (``mx.sym.load_json``), upgraded as MXNet upgrades older files."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DnnbindValueError(f"symbol file: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or "heads" not in doc:
        raise DnnbindValueError("symbol file: expected an object with 'nodes' and 'heads' (an MXNet -symbol.json)")
    version = 800  # a file without mxnet_version is MXNet 0.8's
    tagged = (doc.get("attrs") or {}).get("mxnet_version")
    if isinstance(tagged, list) and len(tagged) == 2 and isinstance(tagged[1], int):
        version = tagged[1]
    nodes: list[Node] = []
    for k, raw in enumerate(doc["nodes"]):
        if not isinstance(raw, dict) or "op" not in raw or "name" not in raw:
            raise DnnbindValueError(f"symbol file: node {k} lacks 'op' or 'name'")
        attrs = _node_attrs(raw)
        inputs = [_entry(e, len(nodes), f"node {raw['name']!r} input") for e in raw.get("inputs", [])]
        op = raw["op"]
        if op == "null":
            nodes.append(Node(None, raw["name"], {(f"__{a}__" if a in _HIDDEN_KEYS else a): v
                                                  for a, v in attrs.items()}))
            continue
        nodes.append(_op_node(raw["name"], op, attrs, inputs, nodes, version))
    heads = [_entry(e, len(nodes), "head") for e in doc["heads"]]
    for n, _, v in heads:
        if nodes[n].op is None:
            nodes[n].version = max(nodes[n].version, v)
    return Symbol([(nodes[n], i) for n, i, _ in heads])


def _op_node(name: str, op: str, attrs: dict, inputs: list, nodes: list[Node], version: int) -> Node:
    canonical = ALIASES.get(op, op)
    if canonical == "Custom":  # a Python operator: its inputs and outputs are its registered Prop's
        from ._custom import node_from_file
        entries = [(nodes[src], i) for src, i, _ in inputs]
        return node_from_file(name, attrs, entries)
    if canonical not in DECLARED:
        raise DnnbindValueError(f"symbol file: node {name!r} uses operator {op!r}, which dnnbind does not implement")
    sch = schema(canonical)
    if version < 905 and canonical in ("argmax", "argmin") and attrs.get("axis") == "-1":
        del attrs["axis"]  # MXNet's upgrade for files before 0.9.5 (axis -1 meant "all" there)
    count = VAR_ARGS.get(canonical)
    hidden_ok = {count} if count is not None and all(p.name != count for p in sch.params) else set()
    names_guess = [i.name for i in sch.inputs]
    attrs, moved = _hidden(attrs, names_guess)
    # as MXNet's parameter parser: hidden "__key__" attributes pass, any other undeclared one is an error
    params = sch.parse({k: v for k, v in attrs.items()
                        if not (k.startswith("__") and k.endswith("__")) and k not in hidden_ok})
    names = _opio.inputs(canonical, sch, params, len(inputs))
    entries = []
    for src, i, v in inputs:
        if i >= nodes[src].num_outputs:
            raise DnnbindValueError(f"symbol file: node {name!r} reads output {i} of {nodes[src].name!r}, which "
                                    f"has {nodes[src].num_outputs}")
        if nodes[src].op is None:
            nodes[src].version = max(nodes[src].version, v)
        entries.append((nodes[src], i))
    aux_names = _opio.aux_inputs(canonical)
    if version < 900 and len(entries) < len(names):  # files before 0.9 left out the auxiliary states
        for missing in names[len(entries):]:
            if missing in aux_names:
                entries.append((Node(None, f"{name}_{missing}", dict(attrs)), 0))  # not a node of the file
    if version < 904:  # ... and the initializers MXNet now attaches to the variables of some inputs
        for pos, input_name in enumerate(names[:len(entries)]):
            init = _opio.input_init(canonical).get(input_name)
            src = entries[pos][0]
            if init is not None and src.op is None and "__init__" not in src.attrs:
                src.attrs["__init__"] = init
    for input_name, extra in moved.items():
        if input_name in names[:len(entries)] and entries[names.index(input_name)][0].op is None:
            entries[names.index(input_name)][0].attrs.update(extra)
    if len(entries) != len(names) and not (sch.inputs and sch.inputs[0].variadic):
        raise DnnbindValueError(f"symbol file: node {name!r} ({canonical}) has {len(entries)} inputs, expected "
                                f"{len(names)} ({', '.join(names)})")
    aux = [pos for pos, n in enumerate(names) if n in aux_names]
    total, visible = _opio.outputs(canonical, params)
    return Node(canonical, name, attrs, entries, params, total, visible, aux)
