"""Layer symbol: MXNet's symbolic graph. A ``Symbol`` is a list of output entries ``(node, index)``; a ``Node`` is a
variable (``op`` None) or an operator with its parameters (given ones only, as strings, as MXNet stores them), its
inputs (entries of other nodes) and its outputs. Imports nd (the operators' schemas) and this package's op table.

What the graph answers is MXNet 1.9.1's, read off the real thing: node names (``convolution0``, ``_plusscalar0``),
implicit variables (``convolution0_weight``, with the operator's attributes copied onto them), argument,
auxiliary-state and output names, ``get_internals``, ``get_children``, ``attr``/``attr_dict``, and the operators
(``a + 1`` is ``_plus_scalar``, ``-a`` is ``_mul_scalar`` by -1.0, ``a > b`` is ``_greater``).
"""

from __future__ import annotations

import threading

from .._lib.errors import DnnbindTypeError, DnnbindValueError
from ..nd._mxnet_params import ALIASES, VAR_ARGS
from ..nd._schema import attr_string, schema
from . import _opio

__all__ = ["Node", "Symbol", "Group", "compose", "var", "make", "NameManager", "Prefix", "AttrScope"]


class Node:
    """One node of a graph. ``attrs``: the parameters given (MXNet's strings) and scope attributes (``__lr_mult__``);
    ``params``: the parameters parsed (defaults filled in), None for a variable; ``aux``: input positions that are
    auxiliary states; ``version``: for a variable, how often an operator mutated it (what a symbol file's entries
    record)."""

    __slots__ = ("op", "name", "attrs", "inputs", "params", "num_outputs", "visible", "aux", "version",
                 "__weakref__")

    def __init__(self, op, name, attrs=None, inputs=(), params=None, num_outputs=1, visible=("output",), aux=()):
        self.op, self.name = op, name
        self.version = 0  # a variable's: how many times an operator mutated it (MXNet's entry version)
        self.attrs = dict(attrs or {})
        self.inputs = list(inputs)
        self.params = params
        self.num_outputs, self.visible, self.aux = num_outputs, list(visible), frozenset(aux)

    @property
    def is_variable(self) -> bool:
        return self.op is None

    def output_name(self, i: int) -> str:
        return self.name if self.op is None else f"{self.name}_{self.visible[i]}"

    def __repr__(self) -> str:
        return f"<Node {self.op or 'null'} {self.name}>"


# -- naming (mx.name) and attribute scopes (mx.AttrScope) -----------------------------------------------------------

_tls = threading.local()


class NameManager:
    """``mx.name.NameManager``: names nodes made without a name ``{hint}{count}`` (``convolution0``); ``with
    NameManager():`` starts the counts afresh inside."""

    def __init__(self):
        self._counter: dict[str, int] = {}
        self._old = None

    def get(self, name, hint: str) -> str:
        if name:
            return name
        n = self._counter.get(hint, 0)
        self._counter[hint] = n + 1
        return f"{hint}{n}"

    def __enter__(self):
        self._old = current_name_manager()
        _tls.names = self
        return self

    def __exit__(self, *exc):
        _tls.names = self._old


class Prefix(NameManager):
    """``mx.name.Prefix('net_')``: every name made inside gets the prefix."""

    def __init__(self, prefix: str):
        super().__init__()
        self._prefix = prefix

    def get(self, name, hint: str) -> str:
        return self._prefix + super().get(name, hint)


_process_names = NameManager()


def current_name_manager() -> NameManager:
    return getattr(_tls, "names", None) or _process_names


class AttrScope:
    """``mx.AttrScope(ctx_group='dev1', lr_mult='0.5')``: attributes (stored as ``__key__``) given to every node made
    inside, variables included."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            if not isinstance(v, str):
                raise DnnbindValueError(f"AttrScope: attributes must be strings, got {k}={v!r}")
        self._attrs = {f"__{k}__" if not k.startswith("__") else k: v for k, v in kwargs.items()}
        self._old = None

    def get(self, attrs: dict | None) -> dict:
        out = dict(self._attrs)
        out.update(attrs or {})
        return out

    def __enter__(self):
        self._old = getattr(_tls, "attrs", None)
        merged = AttrScope()
        merged._attrs = {**(self._old._attrs if self._old else {}), **self._attrs}
        _tls.attrs = merged
        return self

    def __exit__(self, *exc):
        _tls.attrs = self._old


def scope_attrs(attrs: dict | None) -> dict:
    scope = getattr(_tls, "attrs", None)
    return scope.get(attrs) if scope is not None else dict(attrs or {})


# -- the symbol -----------------------------------------------------------------------------------------------------

class Symbol:
    """MXNet's Symbol: one or more outputs of a graph."""

    __slots__ = ("_outputs", "__weakref__")

    def __init__(self, outputs):
        self._outputs = list(outputs)

    # -- structure
    def _node(self) -> Node | None:
        """The one node every output comes from (an operator's outputs), else None (a group of several)."""
        first = self._outputs[0][0] if self._outputs else None
        return first if all(n is first for n, _ in self._outputs) else None

    @property
    def name(self) -> str | None:
        """The node's name when every output is one node's, else None (a group)."""
        node = self._node()
        return None if node is None else node.name

    def _topo(self) -> list[Node]:
        order, seen = [], set()
        for node, _ in self._outputs:
            stack = [(node, False)]
            while stack:
                n, done = stack.pop()
                if done:
                    order.append(n)
                    continue
                if id(n) in seen:
                    continue
                seen.add(id(n))
                stack.append((n, True))
                for src, _ in reversed(n.inputs):
                    if id(src) not in seen:
                        stack.append((src, False))
        return order

    def _aux_nodes(self) -> set[int]:
        aux = set()
        for n in self._topo():
            for pos in n.aux:
                aux.add(id(n.inputs[pos][0]))
        return aux

    def list_arguments(self) -> list[str]:
        aux = self._aux_nodes()
        return [n.name for n in self._topo() if n.op is None and id(n) not in aux]

    def list_auxiliary_states(self) -> list[str]:
        aux = self._aux_nodes()
        return [n.name for n in self._topo() if n.op is None and id(n) in aux]

    def list_inputs(self) -> list[str]:
        return [n.name for n in self._topo() if n.op is None]

    def list_outputs(self) -> list[str]:
        return [n.output_name(i) for n, i in self._outputs]

    def get_internals(self) -> Symbol:
        entries = []
        for n in self._topo():
            entries += [(n, 0)] if n.op is None else [(n, i) for i in range(len(n.visible))]
        return Symbol(entries)

    def get_children(self) -> Symbol | None:
        entries = [e for n, _ in self._outputs for e in n.inputs]
        return Symbol(entries) if entries else None

    def __getitem__(self, index) -> Symbol:
        if isinstance(index, str):
            names = self.list_outputs()
            hits = [i for i, n in enumerate(names) if n == index]
            if not hits:
                raise DnnbindValueError(f"Symbol: cannot find output that matches name {index!r}")
            if len(hits) > 1:
                raise DnnbindValueError(f"Symbol: there are multiple outputs with name {index!r}")
            index = hits[0]
        if not isinstance(index, int):
            raise DnnbindTypeError(f"Symbol index must be an int or an output name, got {type(index).__name__}")
        if not -len(self._outputs) <= index < len(self._outputs):
            raise IndexError(f"Symbol index {index} out of range for {len(self._outputs)} output(s)")
        return Symbol([self._outputs[index]])

    def __len__(self) -> int:
        return len(self._outputs)

    def __call__(self, *args, **kwargs) -> Symbol:
        """MXNet's composition ``net(data=x)``: this graph with the named inputs (positional: in list_arguments
        order) replaced by the given Symbols."""
        if args:
            kwargs = {**dict(zip(self.list_arguments(), args)), **kwargs}
        return compose(self, kwargs)

    def __iter__(self):
        return (Symbol([e]) for e in self._outputs)

    # -- attributes
    def attr(self, key: str):
        node = self._node()
        return None if node is None else node.attrs.get(key)

    def list_attr(self, recursive: bool = False) -> dict:
        if recursive:
            raise DnnbindValueError("Symbol.list_attr: recursive=True is removed in MXNet 1.x; use attr_dict()")
        node = self._node()
        return {} if node is None else _listed(node.attrs)

    def attr_dict(self) -> dict:
        return {n.name: _listed(n.attrs) for n in self._topo() if n.attrs}

    def _set_attr(self, **kwargs) -> None:
        for k, v in kwargs.items():
            if not isinstance(v, str):
                raise DnnbindValueError(f"Symbol._set_attr: values must be strings, got {k}={v!r}")
            for n, _ in self._outputs:
                n.attrs[k] = v

    # -- files (tojson, and infer_shape/infer_type, simple_bind/bind, are installed by the package's __init__:
    # they live in _json.py, _infer.py and _executor.py, which import this module)
    def save(self, fname: str, remove_amp_cast: bool = True) -> None:
        """Write the JSON to ``fname`` atomically (a crash leaves the old file or the whole new one)."""
        from ..serialization import atomic_write
        text = self.tojson().encode()
        atomic_write(fname, lambda f: f.write(text))

    # -- printing
    def __repr__(self) -> str:
        if len(self._outputs) == 1:
            return f"<Symbol {self.name}>"
        return f"<Symbol group [{', '.join(n.name for n, _ in self._outputs)}]>"

    __str__ = __repr__

    def __copy__(self) -> Symbol:
        return Symbol(self._outputs)

    def __bool__(self):
        raise NotImplementedError("The truth value of a Symbol is ambiguous (MXNet refuses it too)")

    # -- operators: MXNet's (python/mxnet/symbol/symbol.py) choice of internal operator for each
    def _binary(self, other, sym_op: str, scalar_op: str, rscalar: bool = False):
        if isinstance(other, Symbol):
            return make(sym_op, self, other) if not rscalar else make(sym_op, other, self)
        if isinstance(other, (int, float)) and not isinstance(other, bool) or _is_numpy_scalar(other):
            return make(scalar_op, self, scalar=other)
        raise DnnbindTypeError(f"type {type(other).__name__} not supported")

    def __add__(self, o):
        return self._binary(o, "_Plus", "_PlusScalar")

    __radd__ = __add__

    def __sub__(self, o):
        return self._binary(o, "_Minus", "_MinusScalar")

    def __rsub__(self, o):
        return self._binary(o, "_Minus", "_RMinusScalar", rscalar=True)

    def __mul__(self, o):
        return self._binary(o, "_Mul", "_MulScalar")

    __rmul__ = __mul__

    def __truediv__(self, o):
        return self._binary(o, "_Div", "_DivScalar")

    def __rtruediv__(self, o):
        return self._binary(o, "_Div", "_RDivScalar", rscalar=True)

    def __mod__(self, o):
        return self._binary(o, "_Mod", "_ModScalar")

    def __rmod__(self, o):
        return self._binary(o, "_Mod", "_RModScalar", rscalar=True)

    def __pow__(self, o):
        return self._binary(o, "_Power", "_PowerScalar")

    def __rpow__(self, o):
        return self._binary(o, "_Power", "_rpower_scalar", rscalar=True)

    def __neg__(self):
        return make("_MulScalar", self, scalar=-1.0)

    def __abs__(self):
        return make("abs", self)

    def __eq__(self, o):
        return self._binary(o, "_equal", "_equal_scalar")

    def __ne__(self, o):
        return self._binary(o, "_not_equal", "_not_equal_scalar")

    def __gt__(self, o):
        return self._binary(o, "_greater", "_greater_scalar")

    def __ge__(self, o):
        return self._binary(o, "_greater_equal", "_greater_equal_scalar")

    def __lt__(self, o):
        return self._binary(o, "_lesser", "_lesser_scalar")

    def __le__(self, o):
        return self._binary(o, "_lesser_equal", "_lesser_equal_scalar")

    __hash__ = object.__hash__


# hidden attributes MXNet also lists under their plain name (attr_dict() shows both __lr_mult__ and lr_mult)
_PLAIN_TOO = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


def _listed(attrs: dict) -> dict:
    out = dict(attrs)
    for k in _PLAIN_TOO:
        if f"__{k}__" in attrs:
            out[k] = attrs[f"__{k}__"]
    return out


def _is_numpy_scalar(v) -> bool:
    import numpy as np
    return isinstance(v, np.generic) and v.dtype.kind in "iuf"


def compose(symbol: Symbol, inputs: dict) -> Symbol:
    """``symbol`` with its variables named in ``inputs`` replaced by those Symbols (MXNet's ``net(data=x)``): a
    copy of the graph; the rest of the variables, and their nodes, are shared."""
    for name, s in inputs.items():
        if not isinstance(s, Symbol) or len(s._outputs) != 1:
            raise DnnbindTypeError(f"compose: {name} must be a Symbol with one output")
    names = {n.name for n in symbol._topo() if n.op is None}
    unknown = [k for k in inputs if k not in names]
    if unknown:
        raise DnnbindValueError(f"compose: {unknown[0]!r} is not an input of the symbol ({sorted(names)})")
    copies: dict[int, Node] = {}

    def entry(node, i):
        if node.op is None and node.name in inputs:
            return inputs[node.name]._outputs[0]
        return (copies.get(id(node), node), i)

    for n in symbol._topo():
        if n.op is None:
            continue
        new = Node(n.op, n.name, n.attrs, [entry(s, i) for s, i in n.inputs], n.params, n.num_outputs, n.visible,
                   n.aux)
        copies[id(n)] = new
    return Symbol([entry(n, i) for n, i in symbol._outputs])


def Group(symbols) -> Symbol:
    """``mx.sym.Group([a, b])``: one symbol with the outputs of each."""
    symbols = list(symbols)
    if not symbols or not all(isinstance(s, Symbol) for s in symbols):
        raise DnnbindTypeError("Group expects a non-empty list of Symbols")
    return Symbol([e for s in symbols for e in s._outputs])


def _method(op: str):
    """``sym.<method>(...)`` as MXNet's Symbol has it: the operator on this symbol, further positional arguments
    taken as the operator's parameters in MXNet's order (``x.reshape((0, -1))``, ``x.sum(1)``)."""
    def method(self, *args, **kwargs):
        if args:
            names = [p.name for p in schema(op).params]
            kwargs = {**dict(zip(names, args)), **kwargs}
        return make(op, self, **kwargs)
    method.__name__ = op
    method.__doc__ = f"The {op} operator on this Symbol."
    return method


for _m, _op in (("reshape", "Reshape"), ("flatten", "Flatten"), ("sum", "sum"), ("mean", "mean"), ("max", "max"),
                ("min", "min"), ("prod", "prod"), ("transpose", "transpose"), ("expand_dims", "expand_dims"),
                ("squeeze", "squeeze"), ("softmax", "softmax"), ("log_softmax", "log_softmax"), ("relu", "relu"),
                ("sigmoid", "sigmoid"), ("tanh", "tanh"), ("exp", "exp"), ("log", "log"), ("abs", "abs"),
                ("sqrt", "sqrt"), ("square", "square"), ("clip", "clip"), ("astype", "Cast"),
                ("slice_axis", "slice_axis"), ("split", "SliceChannel"), ("argmax", "argmax"), ("argmin", "argmin"),
                ("norm", "norm"), ("swapaxes", "SwapAxis"), ("tile", "tile"), ("repeat", "repeat"),
                ("broadcast_to", "broadcast_to"), ("zeros_like", "zeros_like"), ("ones_like", "ones_like")):
    setattr(Symbol, _m, _method(_op))


# MXNet's __dtype__ attribute: mshadow's type flags
DTYPE_FLAGS = {"float32": 0, "float64": 1, "float16": 2, "uint8": 3, "int32": 4, "int8": 5, "int64": 6, "bool": 7,
               "bfloat16": 12}


def var(name: str, attr=None, shape=None, lr_mult=None, wd_mult=None, dtype=None, init=None, stype=None,
        **kwargs) -> Symbol:
    """``mx.sym.var`` / ``mx.sym.Variable``: an input or parameter of the graph."""
    if not isinstance(name, str):
        raise DnnbindTypeError("Expect a string for variable `name`")
    attrs = scope_attrs(attr)
    if shape is not None:
        attrs["__shape__"] = str(tuple(shape))
    if lr_mult is not None:
        attrs["__lr_mult__"] = str(lr_mult)
    if wd_mult is not None:
        attrs["__wd_mult__"] = str(wd_mult)
    if dtype is not None:
        import numpy as np
        attrs["__dtype__"] = str(DTYPE_FLAGS[np.dtype(dtype).name if not isinstance(dtype, str) or
                                            dtype != "bfloat16" else "bfloat16"])
    if init is not None:
        attrs["__init__"] = init if isinstance(init, str) else init.dumps()
    if stype is not None:
        attrs["__storage_type__"] = str({"default": 0, "row_sparse": 1, "csr": 2}[stype])
    for k, v in kwargs.items():
        if k.startswith("__") and k.endswith("__"):
            attrs[k] = str(v)
        else:
            raise DnnbindValueError(f"Attribute name={k} is not supported. Additional attributes must start and end "
                                    "with double underscores, e.g, __yourattr__")
    return Symbol([(Node(None, name, attrs), 0)])


# MXNet's Python names for its internal operators: the node-name hint is the name lowercased ("_PlusScalar" ->
# "_plusscalar0"), the file stores the operator's own name ("_plus_scalar").
def make(called: str, *args, name: str | None = None, attr: dict | None = None, **kwargs) -> Symbol:
    """A node of operator ``called`` (its name or an alias) over ``args``/``kwargs``: Symbols are inputs, anything
    else a parameter. Missing inputs become variables ``{name}_{input}``, as in MXNet."""
    op = ALIASES.get(called, called)
    sch = schema(op)
    input_names = [i.name for i in sch.inputs]
    sym_kwargs = {k: v for k, v in kwargs.items() if isinstance(v, Symbol)}
    # ``__layout__=`` and the like are the node's attributes, not parameters (MXNet keeps them on the node)
    node_attrs = {k: str(v) for k, v in kwargs.items() if k.startswith("__") and k.endswith("__")}
    params_given = {k: v for k, v in kwargs.items() if not isinstance(v, Symbol) and k not in node_attrs}
    for k in sym_kwargs:
        if k not in input_names:
            raise DnnbindValueError(f"{called}: {k} is not an input of {op} (inputs: {', '.join(input_names)})")
    for a in args:
        if not isinstance(a, Symbol):
            raise DnnbindTypeError(f"{called}: positional arguments must be Symbols, got {type(a).__name__}; give "
                                   "parameters by keyword")
    variadic = bool(sch.inputs) and sch.inputs[0].variadic
    count = VAR_ARGS.get(op)
    if variadic and count is not None and count not in params_given:
        params_given[count] = len(args)  # MXNet's frontend always passes it, declared or not (add_n)
    declared = {p.name for p in sch.params}
    if not declared:  # an operator with no parameters takes any keyword and ignores it, as MXNet (nd/__init__.py
        # _ignores_keywords); the node keeps it as an attribute, as MXNet's JSON does
        params = sch.parse({})
    else:
        params = sch.parse({k: v for k, v in params_given.items() if k in declared or k != count})
    attrs = scope_attrs(attr)
    attrs.update(node_attrs)
    attrs.update({k: attr_string(v) for k, v in params_given.items()})
    node_name = current_name_manager().get(name, called.lower())
    names = _opio.inputs(op, sch, params, len(args))
    if len(args) > len(names):
        raise DnnbindValueError(f"{called}: {len(args)} inputs given, {op} takes {len(names)} ({', '.join(names)})")
    aux_names, inits = _opio.aux_inputs(op), _opio.input_init(op)
    entries, aux = [], []
    for pos, input_name in enumerate(names):
        if pos < len(args):
            given = args[pos]
        elif input_name in sym_kwargs:
            given = sym_kwargs[input_name]
        else:
            var_attrs = dict(attrs)
            if input_name in inits:
                var_attrs["__init__"] = inits[input_name]
            given = Symbol([(Node(None, f"{node_name}_{input_name}", var_attrs), 0)])
        if len(given._outputs) != 1:
            raise DnnbindValueError(f"{called}: input {input_name} is a group of {len(given._outputs)} outputs; give "
                                    "one output")
        entries.append(given._outputs[0])
        if input_name in aux_names:
            aux.append(pos)
            given._outputs[0][0].version += 1  # composing mutates the variable, as in MXNet
    total, visible = _opio.outputs(op, params)
    node = Node(op, node_name, attrs, entries, params, total, visible, aux)
    return Symbol([(node, i) for i in range(len(visible))])
