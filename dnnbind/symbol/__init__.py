"""``mx.sym``: MXNet 1.x's symbolic graphs. Layer: symbol (above nd; imports nd's operator schemas).

    data = mx.sym.var('data')
    net = mx.sym.FullyConnected(data, num_hidden=10, name='fc')
    net.list_arguments()            # ['data', 'fc_weight', 'fc_bias']
    net.save('net-symbol.json')     # byte for byte the file MXNet 1.9.1 writes
    net = mx.sym.load('net-symbol.json')

Every operator MXNet declares that dnnbind knows (nd/_mxnet_params.py) is ``mx.sym.<name>``, with MXNet's parameter
parsing and errors. What runs a graph (shape inference, the executor, SymbolBlock) builds on this.
"""

from __future__ import annotations

from ..nd._mxnet_params import ALIASES, DECLARED
from . import _executor, _infer, _json, _operators
from ._custom import Custom  # noqa: F401  (mx.sym.Custom: a Python operator, custom_op.py)
from ._graph import AttrScope, Group, NameManager, Prefix, Symbol, compose, current_name_manager, make, var
from ._json import loads as load_json

# The Symbol methods that live beside the graph (each of these modules imports _graph, so _graph cannot import them)
Symbol.tojson = _json.dumps
Symbol.__deepcopy__ = lambda self, memo: _json.loads(_json.dumps(self))
Symbol.infer_shape = _infer.infer_shape
Symbol.infer_shape_partial = _infer.infer_shape_partial
Symbol.infer_type = _infer.infer_type
Symbol.simple_bind = _executor.simple_bind
Symbol.bind = _executor.bind

__all__ = ["AttrScope", "Custom", "Group", "NameManager", "Prefix", "Symbol", "Variable", "arange", "compose",
           "current_name_manager", "full", "load", "load_json", "ones", "var", "zeros"]

Variable = var


def load(fname: str) -> Symbol:
    """``mx.sym.load``: the Symbol in a symbol file."""
    with open(fname, encoding="utf-8") as f:
        return load_json(f.read())


def _dtype_name(dtype) -> str:
    import numpy as np
    return np.dtype(dtype if dtype is not None else np.float32).name


def zeros(shape, dtype=None, **kwargs) -> Symbol:
    """``mx.sym.zeros``: an ``_zeros`` node (no inputs), float32 unless ``dtype`` says otherwise."""
    return make("_zeros", shape=shape, dtype=_dtype_name(dtype), **kwargs)


def ones(shape, dtype=None, **kwargs) -> Symbol:
    """``mx.sym.ones``: an ``_ones`` node."""
    return make("_ones", shape=shape, dtype=_dtype_name(dtype), **kwargs)


def full(shape, val, dtype=None, **kwargs) -> Symbol:
    """``mx.sym.full``: an ``_full`` node of ``val``."""
    return make("_full", shape=shape, dtype=_dtype_name(dtype), value=float(val), **kwargs)


def arange(start, stop=None, step=1.0, repeat=1, infer_range=False, name=None, dtype=None) -> Symbol:
    """``mx.sym.arange``: an ``_arange`` node."""
    return make("_arange", start=start, stop=stop, step=step, repeat=repeat, infer_range=infer_range, name=name,
                dtype=_dtype_name(dtype))


def __getattr__(name: str):
    if name in ("contrib", "linalg"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name in DECLARED or name in ALIASES:
        fn = _operators.op_function(name)
        globals()[name] = fn
        return fn
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"module 'mxnet.symbol' has no attribute {name!r} (dnnbind's mx.sym knows the operators "
                         "listed in dnnbind/nd/_mxnet_params.py)")


def __dir__() -> list:
    return sorted(set(globals()) | {n for n in DECLARED if not n.startswith("_")} |
                  {n for n in ALIASES if not n.startswith("_")})

