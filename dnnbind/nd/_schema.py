"""Layer nd: MXNet 1.x's declared operator parameters, and its parser for their values.

Every MXNet operator declares its parameters (dmlc-core's ``DMLC_DECLARE_FIELD``: a name, a type, a default or
"required"), and every value reaches the operator as a *string*: ``nd.Convolution(..., kernel=(3, 3))`` sends
``str((3, 3)) == "(3, 3)"``, a symbol file stores ``"kernel": "(3, 3)"``, and one parser reads both. This module is
that parser, for the symbol files (``mx.sym.load``) and the executor, and the source of the "Cannot find argument",
"Required parameter ... is not presented" and "Invalid Parameter format" refusals.

A ``Schema`` is built from MXNet's own description of an operator, the ``arg_type_infos`` strings its C API lists
(``"Shape(tuple), required"``, ``"int (non-negative), optional, default=1"``,
``"{None, 'fastest', 'limited_workspace', 'off'},optional, default='None'"``); ``nd/_mxnet_params.py`` holds them
for the operators dnnbind implements (generated from MXNet 1.9.1 by ``scripts/gen_mxnet_params.py``). Inputs are
the entries typed ``NDArray-or-Symbol`` (``[]`` marks a variadic input list).

Parsing follows MXNet 1.9.1 (checked against it in tests/test_schema.py):
- int/long: an optional sign and digits only ("3.0" and "1.5" are refused); a "non-negative" label is not checked;
- float/double: a number in C's syntax ("1e-3", ".5", "inf") after optional leading space; anything after it,
  a trailing space included, is refused ("Some trailing characters could not be parsed");
- boolean: "true", "false" in any case, "1", "0";
- Shape(tuple): "(3, 3)", "[3,3]", "()", "(1,1,)", a bare "3" (a 1-tuple); spaces inside are fine; "1,1" and
  "(1.0,1)" are refused. "Shape or None" also takes "None";
- an enum: one of its names exactly; "None" where the enum lists None;
- "X or None": "None", else X.
Non-string Python values are first turned into MXNet's string with ``str()``, as MXNet's Python frontend does, so
``True`` for an int parameter is refused exactly as MXNet refuses it.
"""

from __future__ import annotations

import math
import re

import numpy as np
from typing import Any, NamedTuple

from .._lib.errors import DnnbindTypeError, DnnbindValueError, UnknownArgumentError

__all__ = ["Param", "Schema", "attr_string", "parse_value", "schema"]

# kinds of parameter value
INT, FLOAT, BOOL, SHAPE, FLOAT_TUPLE, ENUM, STRING = "int", "float", "boolean", "shape", "float-tuple", "enum", "str"


class Param(NamedTuple):
    name: str
    kind: str                   # one of the kinds above
    type_text: str              # MXNet's wording of the type, as its messages quote it ("int (non-negative)")
    required: bool
    default: Any                # the parsed default (None where MXNet's default is None or unset)
    choices: tuple | None       # an enum's names (None listed first where the enum takes None)
    none_ok: bool               # "X or None" (and enums listing None)


class Input(NamedTuple):
    name: str
    variadic: bool              # "NDArray-or-Symbol[]": any number of inputs (Concat's data, add_n's args)


_DEFAULT = re.compile(r",\s*optional,\s*default=(.*)$")
_ENUM = re.compile(r"^\{(.*)\}\s*,?\s*(required|optional.*)$")


def parse_type_info(op: str, name: str, info: str) -> Param:
    """A Param from one of MXNet's ``arg_type_infos`` strings."""
    info = info.strip()
    required = info.endswith("required")
    m = _DEFAULT.search(info)
    default_text = None if m is None else m.group(1).strip()
    if default_text is not None and len(default_text) >= 2 and default_text[0] == default_text[-1] == "'":
        default_text = default_text[1:-1]
    choices = None
    em = _ENUM.match(info)
    if em is not None:
        names = [c.strip() for c in em.group(1).split(",")]
        choices = tuple(None if c == "None" else c.strip("'") for c in names)
        kind, type_text, none_ok = ENUM, "{" + em.group(1) + "}", None in choices
    else:
        type_text = info.split(",")[0].strip()
        base = type_text
        none_ok = base.endswith(" or None")
        if none_ok:
            base = base[:-len(" or None")]
        if base.startswith(("int", "long")):
            kind = INT
        elif base.startswith(("float", "double")):
            kind = FLOAT
        elif base == "boolean":
            kind = BOOL
        elif base.startswith("Shape"):
            kind = SHAPE
        elif base.startswith("tuple of <float>") or base.startswith("tuple of <double>"):
            kind = FLOAT_TUPLE
        elif base.startswith("tuple of <int>") or base.startswith("tuple of <long>"):
            kind = SHAPE
        else:
            kind = STRING
    p = Param(name, kind, type_text, required, None, choices, none_ok)
    if default_text is not None and not required:
        try:
            default = None if default_text == "None" else _parse(op, p, default_text)
        except (DnnbindTypeError, DnnbindValueError):
            default = default_text  # a default MXNet prints in a form its parser would not read back: kept as text
        p = p._replace(default=default)
    return p


_INT = re.compile(r"^[+-]?\d+$")


def attr_string(value) -> str:
    """A value as MXNet's Python frontend hands it to an operator (and as symbol files store it): ``str(value)``,
    so ``(3, 3)`` is ``"(3, 3)"``, ``[2, 2]`` is ``"[2, 2]"``, ``True`` is ``"True"`` and ``1e-05`` is ``"1e-05"``."""
    return value if isinstance(value, str) else str(value)


def _bad(op: str, p: Param, text: str) -> DnnbindTypeError:
    return DnnbindTypeError(f"Invalid Parameter format for {p.name} expect {p.type_text} but value={text!r}, in "
                            f"operator {op}")


def _parse(op: str, p: Param, value):
    text = attr_string(value)
    if text == "None":
        if p.none_ok:
            return None
        if p.kind == SHAPE:  # MXNet's shape parser reads "None" as an unknown shape: unset, as the empty default
            return ()
    kind = p.kind
    if kind == INT:
        s = text.strip()
        if not _INT.match(s):
            raise _bad(op, p, text)
        return int(s)
    if kind == FLOAT:
        return _float(op, p, text)
    if kind == BOOL:
        low = text.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise _bad(op, p, text)
    if kind in (SHAPE, FLOAT_TUPLE):
        s = text.strip()
        if kind == SHAPE and _INT.match(s):  # MXNet's Shape parser takes a bare int as a 1-tuple
            return (int(s),)
        if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
            raise _bad(op, p, text)
        items = [t.strip() for t in s[1:-1].split(",")]
        if items and items[-1] == "":
            items.pop()  # "(3,)" and "(1,1,)"
        if kind == SHAPE:
            if not all(_INT.match(t) for t in items):
                raise _bad(op, p, text)
            return tuple(int(t) for t in items)
        return tuple(_float(op, p, t) for t in items)
    if kind == ENUM:
        if text in p.choices:
            return text
        listed = ", ".join("None" if c is None else repr(c) for c in p.choices)
        raise DnnbindValueError(f"Invalid Input: {text!r}, valid values are: {{{listed}}}, in operator {op}")
    return text


def parse_value(op: str, p: Param, value):
    """One value (a string or a Python value) of parameter ``p`` parsed as MXNet parses it."""
    return _parse(op, p, value)


def _float(op: str, p: Param, text: str) -> float:
    s = text.lstrip()  # C's strtod skips leading space; what follows the number must be nothing
    m = re.match(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf(inity)?|nan)", s, re.IGNORECASE)
    if m is None:
        raise _bad(op, p, text)
    if m.end() != len(s):
        raise DnnbindValueError(f"Some trailing characters could not be parsed: {s[m.end():]!r}, in operator {op}")
    v = float(m.group(0))
    if p.type_text.startswith("float"):  # MXNet stores a "float" field as a C float (momentum 0.9 is 0.899999976)
        with np.errstate(over="ignore"):  # beyond float32: inf, as C's strtof gives
            v = float(np.float32(v))
    return v if not math.isnan(v) else math.nan


class Schema:
    """One operator's inputs and parameters as MXNet declares them, in MXNet's order."""

    __slots__ = ("op", "inputs", "params", "_by_name")

    def __init__(self, op: str, inputs: tuple, params: tuple):
        self.op, self.inputs, self.params = op, tuple(inputs), tuple(params)
        self._by_name = {p.name: p for p in self.params}

    @classmethod
    def from_type_infos(cls, op: str, entries) -> Schema:
        """From (name, MXNet type-info string) pairs, inputs and parameters mixed as MXNet lists them."""
        inputs, params = [], []
        for name, info in entries:
            if info.startswith("NDArray-or-Symbol") or info == "Symbol":  # (PSROIPooling types its inputs "Symbol")
                inputs.append(Input(name, info.endswith("[]")))
            else:
                params.append(parse_type_info(op, name, info))
        return cls(op, inputs, params)

    def declares(self, name: str) -> bool:
        return name in self._by_name

    def param(self, name: str) -> Param:
        p = self._by_name.get(name)
        if p is None:
            raise UnknownArgumentError(self.op, name, tuple(self._by_name))
        return p

    def parse(self, kwargs: dict, *, defaults: bool = True) -> dict:
        """``kwargs`` (strings or Python values) parsed as MXNet parses an operator's attributes: every name must be
        declared, every required one present. Returns name -> value in MXNet's order, defaults filled in unless
        ``defaults`` is False (then only the given names)."""
        for name in kwargs:
            if name not in self._by_name:
                raise UnknownArgumentError(self.op, name, tuple(self._by_name))
        out = {}
        for p in self.params:
            if p.name in kwargs:
                out[p.name] = _parse(self.op, p, kwargs[p.name])
            elif p.required:  # an enum is an int inside MXNet, and its message says so
                kind = "int" if p.kind == ENUM else p.type_text
                raise DnnbindTypeError(f"Required parameter {p.name} of {kind} is not presented, in operator "
                                       f"{self.op}")
            elif defaults:
                out[p.name] = p.default
        return out

    def attrs(self, values: dict) -> dict:
        """Parameter values as the strings a symbol file stores (MXNet's ``str()``), in MXNet's order."""
        return {p.name: attr_string(values[p.name]) for p in self.params if p.name in values}

    def doc(self) -> str:
        """The parameter list of a generated docstring, in the layout of MXNet's."""
        lines = ["Parameters", "----------"]
        for i in self.inputs:
            lines.append(f"{i.name} : NDArray{'[]' if i.variadic else ''}")
        for p in self.params:
            tail = "required" if p.required else f"optional, default={p.default!r}"
            lines.append(f"{p.name} : {p.type_text}, {tail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Schema {self.op}: {', '.join(i.name for i in self.inputs)}; {', '.join(self._by_name)}>"


_schemas: dict[str, Schema] = {}


def schema(op: str) -> Schema:
    """The Schema of MXNet operator ``op`` (its name or an alias MXNet accepts), built on first use."""
    s = _schemas.get(op)
    if s is None:
        from ._mxnet_params import ALIASES, DECLARED
        name = ALIASES.get(op, op)
        entries = DECLARED.get(name)
        if entries is None:
            raise DnnbindValueError(f"operator {op!r} is not one dnnbind implements (or not an MXNet 1.x operator)")
        s = _schemas[op] = Schema.from_type_infos(name, entries)
    return s
