"""``HybridBlock.export``: a Block traced to a symbol graph and written as MXNet's ``path-symbol.json`` +
``path-%04d.params`` (``arg:``/``aux:`` keys), the files ``SymbolBlock.imports`` and MXNet itself load.
Layer: gluon; imports dnnbind.symbol.

Tracing calls each Block with Symbols instead of arrays. A Block that defines MXNet 1.x's
``hybrid_forward(self, F, x, **params)`` runs it with ``F = mx.sym`` and its Parameters as variables, as MXNet
does. Gluon's own layers, written for arrays, give their symbolic form here (``TRACERS``: the same operator and
arguments their forward passes to nd, named ``<prefix>fwd`` as MXNet names them). A Block with neither is refused,
naming its class.
"""

from __future__ import annotations

import contextlib

from .. import serialization
from .. import symbol as sym
from .._lib.errors import DnnbindValueError
from ..features import UnsupportedFeature
from ..symbol import Symbol, compose

__all__ = ["TRACERS", "export", "register", "trace"]


def _var(p):
    return sym.var(p.name)


def _act(block, y):
    return trace(block.act, [y]) if getattr(block, "act", None) is not None else y


def conv(block, x):
    kw = dict(kernel=block._kernel, stride=block._strides, dilate=block._dilation, pad=block._padding,
              num_filter=block._channels, num_group=block._groups, no_bias=block.bias is None,
              layout=block._layout)
    args = [x, _var(block.weight)] + ([_var(block.bias)] if block.bias is not None else [])
    op = "Deconvolution" if "Transpose" in type(block).__name__ else "Convolution"
    if op == "Deconvolution":
        kw["adj"] = block._outpad
    return _act(block, sym.make(op, *args, name=block.prefix + "fwd", **kw))


def dense(block, x):
    args = [x, _var(block.weight)] + ([_var(block.bias)] if block.bias is not None else [])
    y = sym.make("FullyConnected", *args, name=block.prefix + "fwd", num_hidden=block._units,
                 no_bias=block.bias is None, flatten=block._flatten)
    return _act(block, y)


def batchnorm(block, x):
    return sym.make("BatchNorm", x, *[_var(p) for p in block._params4()], name=block.prefix + "fwd", **block._kwargs)


def layernorm(block, x):
    # MXNet's LayerNorm.hybrid_forward names no node: the name manager's "layernorm0" under the block's prefix
    return sym.make("LayerNorm", x, _var(block.gamma), _var(block.beta), name=block.prefix + "layernorm0",
                    axis=block._axis, eps=block._eps)


def instancenorm(block, x):
    """MXNet's InstanceNorm.hybrid_forward: another channel axis than 1 is swapped to 1 and back around the
    operator (SwapAxis nodes ``swapaxes0``/``swapaxes1``, ``dim2`` the axis as the layer was given it)."""
    params = [_var(block.gamma), _var(block.beta)]
    if block._axis == 1:
        return sym.make("InstanceNorm", x, *params, name=block.prefix + "fwd", eps=block._eps)
    x = sym.make("SwapAxis", x, name=block.prefix + "swapaxes0", dim1=1, dim2=block._axis)
    y = sym.make("InstanceNorm", x, *params, name=block.prefix + "fwd", eps=block._eps)
    return sym.make("SwapAxis", y, name=block.prefix + "swapaxes1", dim1=1, dim2=block._axis)


def pool(block, x):
    kw = dict(kernel=block._size, pool_type=block._pool_type, global_pool=block._global,
              pooling_convention="full" if block._ceil else "valid", stride=block._strides, pad=block._padding)
    if block._pool_type == "avg":
        kw["count_include_pad"] = block._count_include_pad
    kw["layout"] = block._layout  # MXNet writes it for every rank (NCW, NCHW, NCDHW and channels-last)
    return sym.make("Pooling", x, name=block.prefix + "fwd", **kw)


def sequential(block, x, *args):
    for child in block._children.values():
        x = trace(child, [x, *args])
        args = ()
    return x


def symbol_block(block, *inputs):
    return compose(block._symbol, dict(zip(block._input_names, inputs)))


def activation(block, x):
    return sym.make("Activation", x, name=block.prefix + "fwd", act_type=block._act_type)


def dropout(block, x):
    return sym.make("Dropout", x, name=block.prefix + "fwd", p=block._rate, axes=block._axes)


def flatten(block, x):
    return sym.make("Flatten", x, name=block.prefix + "flatten0")


# Block class -> its tracer. The layer modules register theirs (gluon/nn/__init__.py, symbol_block.py) so that this
# module imports none of them: they import block.py, which imports this module.
TRACERS: dict = {}


def register(cls, fn) -> None:
    TRACERS[cls] = fn


def trace(block, inputs: list) -> Symbol:
    """``block`` called on Symbols: its graph, named as MXNet's ``name_scope()`` names it. A Block's scope
    *replaces* the caller's name prefix with its own full one ("resnetv10_stage3_conv0_fwd", never
    "resnetv10_resnetv10_stage3_conv0_fwd"); a Block made with prefix='' opens none, so its unnamed nodes continue
    the enclosing count (a ResNet stage's blocks give activation0..activation5). GluonCV's FeatureExtractor looks
    these names up in get_internals()."""
    own = contextlib.nullcontext() if block.__dict__.get("_empty_prefix") else sym.Prefix(block.prefix)
    hybrid = getattr(block, "hybrid_forward", None)  # a user's MXNet 1.x Block (gluon's own layers have none)
    if hybrid is not None:
        params = {name: _var(p) for name, p in block._reg_params.items() if p is not None}
        with own:
            return hybrid(sym, *inputs, **params)
    for cls in type(block).__mro__:
        fn = TRACERS.get(cls)
        if fn is not None:
            # a layer's tracer gives its nodes their full names (block.prefix + "fwd"); a Sequential's children
            # are named in the Sequential's scope
            with own if fn is sequential else sym.NameManager():
                return fn(block, *inputs)
    raise UnsupportedFeature(f"export: {type(block).__name__} ({block.name}) cannot be traced to a symbol graph yet "
                             "(dnnbind traces Sequential, Dense, Conv, Pool, BatchNorm, LayerNorm, InstanceNorm, "
                             "Activation, Dropout, Flatten and Blocks written with hybrid_forward(self, F, x, ...))")


def export(block, path: str, epoch: int = 0, num_inputs: int = 1) -> tuple[str, str]:
    """Write ``path-symbol.json`` and ``path-%04d.params`` (atomically); returns their names."""
    params = block.collect_params()
    waiting = [name for name, p in params.items() if not p._shape_known()]
    if waiting:
        raise DnnbindValueError(f"export: Parameter `{waiting[0]}` has no shape yet: call the Block once (or "
                                "initialize it with known input sizes) before exporting, as MXNet requires a forward "
                                "after hybridize()")
    names = ["data"] if num_inputs == 1 else [f"data{i}" for i in range(num_inputs)]
    out = trace(block, [sym.var(n) for n in names])
    if isinstance(out, (list, tuple)):
        out = sym.Group(list(out))
    args, aux = set(out.list_arguments()), set(out.list_auxiliary_states())
    arrays = {f"arg:{n}": p._host_copy() for n, p in params.items() if n in args}
    arrays.update({f"aux:{n}": p._host_copy() for n, p in params.items() if n in aux})
    files = f"{path}-symbol.json", f"{path}-{int(epoch):04d}.params"
    out.save(files[0])
    serialization.save(files[1], arrays)
    return files
