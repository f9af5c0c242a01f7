"""Block, the base of every layer and model (``mxnet.gluon.Block``). Layer: gluon; imports nd, runtime.

Children and Parameters register themselves when assigned as attributes (``self.conv1 = nn.Conv2D(...)``).
Names follow MXNet 1.x: a Block made outside any ``name_scope()`` takes a global name, numbered per class
(``simplecnn0_``); one made inside its parent's ``name_scope()`` is numbered per parent (``simplecnn0_conv0_``).
Prefixes name Parameters (``simplecnn0_conv0_weight``), which is what ``collect_params()`` is keyed by, what the
initializers dispatch on and what ``collect_params().save`` writes. ``save_parameters`` writes paths instead
(``conv1.weight``), which do not depend on how many models were made before. An MXNet Block method dnnbind lacks
(``export``) raises UnsupportedFeature naming it (``Block.__getattr__``).

``HybridBlock`` is ``Block``: every op is a cuDNN/cuBLAS call on the arrays' device, with no symbolic graph to
build. ``hybridize()`` is the speed switch it is in MXNet: the Block's forward (and, under autograd.record(), its
backward) is recorded once per input signature as the library calls it makes and replayed on every call
(dnnbind.hybrid, a layer above this one, registers itself through ``set_cached_block_factory``).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import os
import re
import threading
from collections import OrderedDict

from .. import features, nd, serialization
from .._lib import hooks
from .._lib.hooks import TRACING
from ..runtime.array import NDArray
from ..runtime.device import default_device
from ..symbol import Prefix, Symbol, current_name_manager
from ._export import export, trace
from ._param_ctx import copy_device, multi_ctx, using_device
from .param_files import load_into, read_param_file
from .parameter import Parameter
from .parameter_dict import ParameterDict

__all__ = ["Block", "BlockInputError", "HookHandle", "HybridBlock"]

_tls = threading.local()
RUN_EAGERLY = object()  # what a hybridized Block's cache returns for "run the forward yourself"
_cached_block_factory = None  # dnnbind.hybrid.CachedBlock, registered when dnnbind is imported


# dnnbind.eager_replay's factory while eager replay is on (None: off): a Block called without hybridize() gets one
# such cache, which replays its recorded calls where a repeat of the same forward is proven (see that module).
eager_replay_factory = [None]


def set_cached_block_factory(factory) -> None:
    """``factory(block, flags)`` makes the object a hybridized Block calls with its arguments (dnnbind.hybrid)."""
    global _cached_block_factory
    _cached_block_factory = factory


_global_lock = threading.Lock()


class _BlockScope:
    """The naming scope a Block opens with ``name_scope()``: numbers the children made inside it."""

    def __init__(self, block: Block):
        self._block = block
        self._counter: dict[str, int] = {}
        self._old = None

    @staticmethod
    def create(prefix: str | None, hint: str) -> str:
        current = getattr(_tls, "scope", None)
        if current is None:
            if prefix is None:
                # as MXNet: a Block made outside any scope is numbered by the current mx.name.NameManager, so
                # `with mx.name.NameManager():` starts its count afresh (resnetv10_ again)
                with _global_lock:
                    prefix = current_name_manager().get(None, hint) + "_"
            return prefix
        if prefix is None:
            count = current._counter.get(hint, 0)
            current._counter[hint] = count + 1
            prefix = f"{hint}{count}_"
        return current._block.prefix + prefix

    def __enter__(self):
        # As MXNet 1.x: a Block made with prefix='' opens no scope of its own; its children are numbered by the
        # enclosing one (alexnet's features.name_scope() adds dense0, dense1, and the net's output is dense2).
        if self._block.__dict__.get("_empty_prefix"):
            return self
        self._old = getattr(_tls, "scope", None)
        _tls.scope = self
        # ... and, as MXNet's, it names the Symbols made inside too: mx.sym.Convolution(..., name='expand_conv0')
        # in SSD's name_scope is "ssd0_expand_conv0" (GluonCV's FeatureExpander builds its graph so)
        self._names = Prefix(self._block.prefix)
        self._names.__enter__()
        return self

    def __exit__(self, *exc):
        if not self._block.__dict__.get("_empty_prefix"):
            self._names.__exit__(*exc)
            _tls.scope = self._old


class BlockInputError(DnnbindValueError, TypeError):
    """A layer called with something other than an NDArray. A ValueError, as MXNet's HybridBlock raises ("there
    must be one NDArray or one Symbol in the input"), and a TypeError, as Python would."""


class HookHandle:
    """What ``register_forward_hook``/``register_forward_pre_hook`` return (MXNet's ``HookHandle``):
    ``detach()`` removes the hook; ``with block.register_forward_hook(f):`` removes it on exit."""

    def __init__(self, hooks: list, hook) -> None:
        self._hooks, self._hook = hooks, hook

    def detach(self) -> None:
        for i, h in enumerate(self._hooks):
            if h is self._hook:
                del self._hooks[i]
                return

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


# What to use instead of MXNet's Block/HybridBlock methods dnnbind lacks (the names come from MXNet 1.9.1's dir()).
_UNSUPPORTED_HINTS = {
    "export": "it writes a symbolic graph (-symbol.json), which dnnbind does not build; save_parameters() writes "
              "the weights (in MXNet's format)",
    "infer_shape": "shapes are inferred by the first forward call",
    "infer_type": "dtypes are inferred by the first forward call",
    "optimize_for": "graph partitioning for MXNet's backends; hybridize() is dnnbind's speed switch",
    "register_op_hook": "a hook per operator of the symbolic executor; register_forward_hook() runs per Block",
    "save": "MXNet 1.9's save(prefix) of the structure and parameters; use save_parameters()",
    "load": "MXNet 1.9's load(prefix); use load_parameters()",
}


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


class Block:
    """Base class of layers and models: subclass, assign children/Parameters in __init__, define forward."""

    _summary_row = True  # summary() prints a row for this Block (containers set False)
    _array_input = False  # the first argument must be an NDArray (the nn layers, HybridBlocks in MXNet, set True)
    _multi_ctx_dispatch = True  # a call picks its Parameters' copies by its input's device (tests read this)

    def __init__(self, prefix: str | None = None, params: ParameterDict | None = None):
        object.__setattr__(self, "_children", OrderedDict())
        object.__setattr__(self, "_reg_params", OrderedDict())
        self._empty_prefix = prefix == ""
        self._prefix = _BlockScope.create(prefix, self._alias())
        self._name = self._prefix.removesuffix("_")
        self._scope = _BlockScope(self)
        # Sharing (MXNet 1.x): the new dict takes the shared dict's prefix so that get('weight') finds its names.
        self._params = ParameterDict(params.prefix if params is not None else self._prefix, shared=params)
        self._forward_hooks: list = []
        self._forward_pre_hooks: list = []

    def _alias(self) -> str:
        return type(self).__name__.lower()

    prefix = property(lambda self: self._prefix)
    name = property(lambda self: self._name)
    params = property(lambda self: self._params, doc="This Block's own ParameterDict (MXNet 1.x).")

    def name_scope(self) -> _BlockScope:
        """``with self.name_scope():`` children made inside get this Block's prefix."""
        return self._scope

    # -- registration -------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value) -> None:
        children = self.__dict__.get("_children")
        if children is None and isinstance(value, (Block, Parameter)):
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning `{name}`")
        if children is not None:
            old = self.__dict__.get(name)
            if isinstance(old, (Block, Parameter)) and isinstance(value, (Block, Parameter)) \
                    and not isinstance(value, type(old)) and not isinstance(old, type(value)):
                raise DnnbindTypeError(f"Changing attribute type for `{name}` from {type(old).__name__} to "
                                f"{type(value).__name__} is not allowed")
            self._children.pop(name, None)
            self._reg_params.pop(name, None)
            if isinstance(value, Block):
                self._children[name] = value
                value.__dict__.setdefault("_trace_name", name)  # its name in a trace's scope path
            elif isinstance(value, Parameter):
                self._reg_params[name] = value
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        """Reached only when ``name`` is not found: MXNet's Block/HybridBlock methods dnnbind lacks (``export``)
        raise UnsupportedFeature naming them, anything else (a typo) a plain AttributeError."""
        if name.startswith("_") or name == "hybrid_forward" or hasattr(type(self), name):
            # hybrid_forward: a subclass's to define; a class attribute: a property failed (before __init__)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)
        ns = "Block" if name in features.NAMES["Block"] else "HybridBlock"
        raise features.missing(ns, name, _UNSUPPORTED_HINTS.get(name, ""), obj=self)

    def __delattr__(self, name: str) -> None:
        self._children.pop(name, None)
        self._reg_params.pop(name, None)
        object.__delattr__(self, name)

    def register_child(self, block: Block, name: str | None = None) -> Block:
        """Add ``block`` as a child under ``name`` (default: its index, as Sequential does)."""
        if name is None:
            name = str(len(self._children))
        self._children[name] = block
        return block

    def register_parameter(self, name: str, param: Parameter) -> Parameter:
        self._reg_params[name] = param
        return param

    # -- parameters ---------------------------------------------------------------------------------------
    def _collect_params_with_prefix(self, prefix: str = "", out: OrderedDict | None = None,
                                    seen: set | None = None, dedupe: bool = True) -> OrderedDict:
        """Path -> Parameter (``body.0.weight``) of the Parameters assigned as attributes, own ones first, then
        the children's: what save_parameters writes. ``dedupe``: a shared Parameter under its first path only."""
        out = OrderedDict() if out is None else out
        seen = set() if seen is None else seen
        for key, p in self._reg_params.items():
            if p is not None and (not dedupe or id(p) not in seen):
                seen.add(id(p))
                out[prefix + key] = p
        for name, child in self._children.items():
            child._collect_params_with_prefix(prefix + name + ".", out, seen, dedupe)
        return out

    def _collect_by_name(self, rx, ret: ParameterDict) -> None:
        """MXNet 1.x's walk: this Block's ParameterDict (``params.get``), then Parameters assigned as attributes
        that it lacks (MXNet 2's way, left out by MXNet 1.x), then each child's; keyed by full name."""
        own = {id(p): p for p in self._params.values()}
        for p in self._reg_params.values():
            if p is not None:
                own.setdefault(id(p), p)
        for p in own.values():
            if rx is not None and not rx.match(p.name):
                continue
            old = ret._params.get(p.name)
            if old is not None and old is not p:
                raise DnnbindValueError(
                    f"{type(self).__name__}.collect_params(): two different Parameters are named `{p.name}` "
                    "(MXNet 1.x keys Parameters by name). Create them with self.params.get(name, ...) inside the "
                    "Block so that its prefix makes the name unique, or give them distinct names.")
            ret._params[p.name] = p
        for child in self._children.values():
            child._collect_by_name(rx, ret)

    def collect_params(self, select: str | None = None) -> ParameterDict:
        """Every Parameter of this Block and its children, keyed by full name as in MXNet 1.x
        (``mlp_dense0_weight``); a shared Parameter once. ``select`` is a regex matched (re.match) against the
        names, e.g. ``'.*weight'``. save_parameters uses structural names (``hidden.weight``) instead."""
        for key, p in self._collect_params_with_prefix().items():
            # Remember the fullest path for error messages (a child's own collect gives shorter ones).
            if p._structured_name is None or key.count(".") >= p._structured_name.count("."):
                p._structured_name = key
        ret = ParameterDict(self._params.prefix)
        self._collect_by_name(re.compile(select) if select is not None else None, ret)
        return ret

    def initialize(self, init=None, ctx=None, verbose: bool = False, force_reinit: bool = False) -> None:
        """Initialize all Parameters on ``ctx`` (default device if None); unknown shapes wait for a forward."""
        self.collect_params().initialize(init, ctx, verbose, force_reinit)

    def zero_grad(self) -> None:
        self.collect_params().zero_grad()

    def reset_ctx(self, ctx) -> None:
        self.collect_params().reset_ctx(ctx)

    def hybridize(self, active: bool = True, **kwargs) -> None:
        """Record this Block's calls once per input signature and replay them (dnnbind.hybrid); children too, as
        in MXNet (a child runs its own recording when called outside this one). ``active=False`` turns it off;
        calling it again drops the recordings. MXNet's flags (static_alloc, static_shape, ...) are accepted:
        recordings are always static."""
        for child in self._children.values():
            child.hybridize(active, **kwargs)
        for name in ("_cached", "_auto"):  # a new hybridize() drops every recording, eager replay's too
            old = self.__dict__.pop(name, None)
            if old is not None:
                old.close()
        if active and _cached_block_factory is not None:
            object.__setattr__(self, "_cached", _cached_block_factory(self, kwargs))

    def cast(self, dtype) -> None:
        """Cast this Block's Parameters and, through their own ``cast``, its children's (so a child can refuse:
        BatchNorm keeps float32 when the network goes float16, as in MXNet)."""
        for child in self._children.values():
            child.cast(dtype)
        # this Block's own Parameters: its ParameterDict (where a SymbolBlock keeps all of its, as MXNet casts
        # self.params) and those assigned as attributes, each once
        own = {id(p): p for p in self._params.values()}
        for p in self._reg_params.values():
            if p is not None:
                own.setdefault(id(p), p)
        for p in own.values():
            p.cast(dtype)

    def apply(self, fn) -> Block:
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    # -- saving and loading -------------------------------------------------------------------------------
    def save_parameters(self, filename, deduplicate: bool = False) -> None:
        """Save host copies of all Parameters keyed by path (``0.weight``), in MXNet 1.x's format; atomically.

        A shared Parameter is written under each of its paths, as MXNet does, or once, under its first path,
        with ``deduplicate=True``; load_parameters reads both.
        """
        params = self._collect_params_with_prefix(dedupe=deduplicate)
        serialization.save(filename, {key: p._host_copy() for key, p in params.items()})

    save_params = save_parameters

    def load_parameters(self, filename, ctx=None, allow_missing: bool = False, ignore_extra: bool = False,
                        cast_dtype: bool = False, dtype_source: str = "current") -> None:
        """Load a file of save_parameters (MXNet's or dnnbind's). All mismatches are reported in one ValueError.

        Files keyed by prefixed names (``collect_params().save``, ``export``'s ``arg:``/``aux:``) load too: by
        the full name, or by this Block's prefix + the name (MXNet's ``restore_prefix``).
        """
        loaded = read_param_file(filename)
        paths = self._collect_params_with_prefix(dedupe=False)
        if loaded and not set(loaded) & set(paths):
            by_name = {p.name: key for key, p in paths.items()}
            loaded = {by_name.get(k, by_name.get(self._prefix + k, k)): v for k, v in loaded.items()}
        # A shared Parameter has several paths; the file may hold any of them (MXNet writes each, deduplicate=True
        # the first): load it from the first the file holds, and count none of its paths as extra.
        keys_of: dict[int, list] = {}
        for key, p in paths.items():
            keys_of.setdefault(id(p), []).append(key)
        params, aliases = OrderedDict(), set()
        for keys in keys_of.values():
            chosen = next((k for k in keys if k in loaded), keys[0])
            params[chosen] = paths[chosen]
            aliases.update(k for k in keys if k != chosen)
        loaded = {k: v for k, v in loaded.items() if k not in aliases}
        load_into(params, loaded, f"load_parameters({os.fspath(filename)!r}) into {type(self).__name__}", ctx,
                  allow_missing, ignore_extra, cast_dtype, dtype_source)

    load_params = load_parameters

    # -- calling ------------------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook) -> HookHandle:
        """``hook(block, inputs)`` runs before forward; the handle's ``detach()`` removes it."""
        self._forward_pre_hooks.append(hook)
        return HookHandle(self._forward_pre_hooks, hook)

    def register_forward_hook(self, hook) -> HookHandle:
        """``hook(block, inputs, output)`` runs after forward; the handle's ``detach()`` removes it."""
        self._forward_hooks.append(hook)
        return HookHandle(self._forward_hooks, hook)

    def __call__(self, *args, **kwargs):
        if multi_ctx[0] and args and isinstance(args[0], NDArray) and copy_device() is None:
            with using_device(args[0].device):  # Parameters on several devices: the layers read the input's copy
                return self(*args, **kwargs)
        if TRACING:  # one list check: dnnbind.trace() is recording; name this Block's calls (net.conv1 -> ...)
            with hooks.scope(self.__dict__.get("_trace_name") or type(self).__name__.lower()):
                return self._call(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args, kwargs):
        if args and isinstance(args[0], Symbol):  # traced (export, hybrid_forward with F = mx.sym): its graph
            return trace(self, list(args))
        if self._array_input and args and not isinstance(args[0], NDArray):
            self._refuse_input(args[0])
        for hook in self._forward_pre_hooks:
            hook(self, args)
        cached = self.__dict__.get("_cached")
        if cached is None and eager_replay_factory[0] is not None and args and type(args[0]) is NDArray \
                and args[0].on_gpu and not kwargs:
            cached = self.__dict__.get("_auto") or self._eager_replay()
        if cached is not None and args and type(args[0]) is NDArray and args[0].device != default_device():
            # A hybridized Block runs as MXNet's bound graph does: on its input's device, creation calls without
            # a ctx included (GluonCV's F.arange(n) in a decoder); eager, MXNet would make those on cpu(0).
            with args[0].device:
                return self._call_cached(cached, args, kwargs)
        return self._call_cached(cached, args, kwargs)

    def _call_cached(self, cached, args, kwargs):
        out = cached(args) if cached is not None and not kwargs else RUN_EAGERLY
        if out is RUN_EAGERLY:
            out = self.forward(*args, **kwargs)
        for hook in self._forward_hooks:
            hook(self, args, out)
        return out

    def _eager_replay(self):
        auto = eager_replay_factory[0](self)  # None for a Block called inside another's call: it runs eagerly
        if auto is not None:
            object.__setattr__(self, "_auto", auto)
        return auto

    def _refuse_input(self, x) -> None:
        shape = getattr(x, "shape", None)
        hint = " (make it one with nd.array(...))" if shape is not None or isinstance(x, (list, tuple)) else ""
        raise BlockInputError(f"{self.name} ({type(self).__name__}): the input x must be an NDArray, got "
                              f"{type(x).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
                              + hint)

    def forward(self, x, *args, **kwargs):
        """Override this. A 1.x-style ``hybrid_forward(F, x, **params)`` is called if the subclass has one."""
        hybrid = getattr(self, "hybrid_forward", None)
        if hybrid is None:
            raise NotImplementedError(f"{type(self).__name__} must define forward(self, x)")
        params = {name: p.data() for name, p in self._reg_params.items() if p is not None}
        return hybrid(nd, x, *args, **kwargs, **params)

    def export(self, path: str, epoch: int = 0) -> tuple[str, str]:
        """MXNet's ``HybridBlock.export``: ``path-symbol.json`` and ``path-%04d.params`` (``arg:``/``aux:`` keys),
        what ``SymbolBlock.imports`` and MXNet load. The Block is traced to a symbol graph (gluon/_export.py); its
        Parameters need their shapes (a call first, as MXNet needs one after hybridize())."""
        return export(self, path, epoch)

    # -- printing -----------------------------------------------------------------------------------------
    def summary(self, *inputs) -> None:
        """Run ``self(*inputs)`` and print MXNet 1.x's table: one row per layer called (Sequential containers
        are not rows) with its output shape and parameter count, then the total, trainable, non-trainable
        and shared counts. The Block must be initialized. A hybridized Block runs eagerly here: its replay would
        skip the children's calls, whose hooks make the rows."""
        from ._summary import summary
        cached = []
        self.apply(lambda b: cached.append((b, b.__dict__.pop("_cached"))) if "_cached" in b.__dict__ else None)
        try:
            summary(self, *inputs)
        finally:
            for b, c in cached:
                b.__dict__["_cached"] = c

    def __repr__(self) -> str:
        if not self._children:
            return f"{type(self).__name__}()"
        lines = [f"  ({key}): {_indent(repr(child), 2)}" for key, child in self._children.items()]
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"


HybridBlock = Block  # no graph compilation here, so the two are one class

