"""Layer nd: MXNet 1.x's argument parsing for the hand-written nd functions (layers, creation, nd.random).
Imports numpy, runtime and _lib.errors.

MXNet parses every operator's keywords against the parameters the op declares (dmlc-core's parameter manager): a
name the op does not declare is refused with "Cannot find argument 'x', Possible Arguments: ...", a required
parameter left out with "Required parameter kernel of Shape(tuple) is not presented", a value of the wrong kind with
"Invalid Parameter format for ...". The helpers here give the same refusals as DnnbindTypeError/DnnbindValueError
(so ``except mx.base.MXNetError`` and ``except TypeError``/``ValueError`` both catch them), each naming the op and the
argument, before any allocation or library call. ``declared_params(op)`` lists each op's parameters as MXNet 1.9.1 declares
them, in its order (nd/_schema.py's table, generated from MXNet itself).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

from .._lib.errors import DnnbindTypeError, DnnbindValueError, UnknownArgumentError
from ..runtime.array import NDArray
from ._mxnet_params import DECLARED, VAR_ARGS
from ._schema import schema

def declared_params(op: str) -> tuple[str, ...]:
    """MXNet 1.9.1's declared parameters of operator ``op`` (the arrays, ``out`` and ``name`` are not parameters), in
    its order, from nd/_schema.py's table; an operator with a variable number of inputs also lists the parameter
    that counts them (add_n's ``num_args``), as MXNet's "Possible Arguments" does. Keys are MXNet's operator names,
    as its messages spell them ("_zeros" for nd.zeros, "_random_normal" for nd.random.normal and randn)."""
    names = _declared.get(op)
    if names is None:
        s = schema(op)
        names = tuple(p.name for p in s.params)
        count = VAR_ARGS.get(s.op)
        if count is not None and count not in names:
            names += (count,)
        _declared[op] = names
    return names


_declared: dict = {}



def ignores_keywords(mx_name: str) -> bool:
    """MXNet parses keywords against an operator's parameter struct, and an operator with none (relu, zeros_like,
    shape_array, elemwise_add: no parameters declared) takes any keyword and ignores it: GluonCV's
    ``F.zeros_like(x, dtype='int64')`` runs in MXNet 1.9.1 and gives float32. dnnbind does the same for those
    operators (with a warning: drop_ignored), and refuses unknown keywords everywhere else, as MXNet does."""
    return mx_name in DECLARED and not declared_params(mx_name)


_warned_ignored: set = set()


def drop_ignored(mx_name: str, params: dict, allowed) -> dict:
    """The keywords an operator without parameters keeps (none of MXNet's), with a warning, once per operator and
    keyword, naming what is ignored: MXNet ignores it silently, dnnbind says so."""
    for k in params:
        if k not in allowed and (mx_name, k) not in _warned_ignored:
            _warned_ignored.add((mx_name, k))
            warnings.warn(f"{mx_name} takes no parameters: {k}={params[k]!r} is ignored (as MXNet 1.9.1 ignores it)",
                          UserWarning, stacklevel=3)
    return {k: v for k, v in params.items() if k in allowed}


def reject(op: str, kwargs: dict, declared: tuple | None = None) -> None:
    """MXNet's "Cannot find argument" for the first keyword in ``kwargs`` (the names a function did not bind)."""
    if kwargs:
        raise UnknownArgumentError(op, next(iter(kwargs)), declared_params(op) if declared is None else declared)


def required(op: str, name: str, kind: str):
    """MXNet's text for a required parameter left out (a TypeError, as Python's own missing argument is)."""
    return DnnbindTypeError(f"Required parameter {name} of {kind} is not presented, in operator {op}")


def _bad_format(op: str, name: str, kind: str, value) -> DnnbindTypeError:
    return DnnbindTypeError(f"Invalid Parameter format for {name} expect {kind} but value={value!r}, in operator {op}")


def _is_int(v) -> bool:
    return type(v) is int or (isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_)))


def array_arg(op: str, name: str, value, like: NDArray | None = None, numpy_ok: bool = True) -> NDArray:
    """An NDArray input of a layer op; a numpy array is taken too (on ``like``'s device) unless ``numpy_ok`` is
    False (an array the op updates in place). Anything else (None, a number, a string, a list) is a TypeError, as
    MXNet's "Argument data must have NDArray type"."""
    if isinstance(value, NDArray):
        return value
    if numpy_ok and isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        from ..runtime.array import array
        from ..runtime.device import default_device
        return array(value, device=like.device if like is not None else default_device())
    raise DnnbindTypeError(f"{op}: argument {name} must be an NDArray, got {type(value).__name__}"
                           + (f" {value!r}" if isinstance(value, (str, numbers.Number)) else ""))


def shape_arg(op: str, name: str, value) -> tuple[int, ...] | None:
    """An MXNet ``Shape(tuple)`` parameter: None or () (MXNet's empty default) is None, an int is a 1-tuple, a
    tuple or list of ints a tuple. Floats, bools, strings are the TypeError "Invalid Parameter format"."""
    if type(value) is tuple:  # the hot path: a tuple of ints
        for v in value:
            if type(v) is not int:
                break
        else:
            return value or None
    if value is None:
        return None
    if _is_int(value):
        return (int(value),)
    if isinstance(value, (tuple, list)) and all(_is_int(v) for v in value):
        return tuple(int(v) for v in value) or None
    raise _bad_format(op, name, "Shape(tuple)", value)


def int_arg(op: str, name: str, value, minimum: int | None = None, kind: str = "int") -> int:
    """An int parameter; below ``minimum`` is MXNet's "should be greater equal to" (a ValueError)."""
    if type(value) is not int:
        if not _is_int(value):
            raise _bad_format(op, name, kind, value)
        value = int(value)
    if minimum is not None and value < minimum:
        raise DnnbindValueError(f"value {value} for Parameter {name} should be greater equal to {minimum}, in operator "
                                f"{op}")
    return value


def float_arg(op: str, name: str, value) -> float:
    if not isinstance(value, (numbers.Real, np.floating, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise _bad_format(op, name, "float", value)
    return float(value)


def choice_arg(op: str, name: str, value, choices: tuple, none_ok: bool = False):
    """One of ``choices`` (strings; None too with ``none_ok``): MXNet's "Invalid Input: 'x', valid values are"."""
    if value is None and none_ok:
        return None
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(([] if not none_ok else ["None"]) + [repr(c) for c in sorted(choices)])
    kind = DnnbindValueError if isinstance(value, str) else DnnbindTypeError
    raise kind(f"Invalid Input: {value!r} for {name}, valid values are: {{{listed}}}, in operator {op}")


def dtype_name(op: str, value, choices: tuple, none_ok: bool = True):
    """A dtype parameter as MXNet's name ('float32'): a string, a numpy type or dtype; one of ``choices``."""
    if value is not None and not isinstance(value, str):
        try:
            value = np.dtype(value).name
        except TypeError:
            raise DnnbindTypeError(f"{op}: dtype must be a dtype name or numpy type, got {value!r}") from None
    return choice_arg(op, "dtype", value, choices, none_ok)


def into(out, y):
    """MXNet's ``out=``: the result written into ``out`` (which is returned), or ``y`` itself."""
    if out is None:
        return y
    if not isinstance(out, NDArray):
        raise DnnbindTypeError(f"out must be an NDArray, got {type(out).__name__}")
    if out.shape != y.shape:
        raise DnnbindValueError(f"out has shape {out.shape} but the result has shape {y.shape}")
    out[:] = y
    return out
