"""ParameterDict (``mxnet.gluon.ParameterDict``): an ordered name -> Parameter mapping with MXNet 1.x's
``get``/``get_constant``, initialize, save and load. Layer: gluon; imports initializer, serialization and
gluon.parameter (through the module, so that either may be imported first). Split from parameter.py.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import os
import re
from collections import OrderedDict

import numpy as np

from .. import initializer as _init
from .. import serialization
from . import parameter as _parameter
from .param_files import load_into, read_param_file

__all__ = ["ParameterDict"]


class ParameterDict:
    """An ordered name -> Parameter mapping (``collect_params()`` returns one keyed by full names, as MXNet 1.x)."""

    def __init__(self, prefix: str = "", shared: ParameterDict | None = None):
        self._prefix = prefix
        self._params: OrderedDict[str, _parameter.Parameter] = OrderedDict()
        self._shared = shared

    prefix = property(lambda self: self._prefix)

    def __repr__(self) -> str:
        body = "\n".join(f"  {p!r}" for p in self._params.values())
        return f"{self._prefix} (\n{body}\n)"  # MXNet's format, also when empty

    def __getitem__(self, key: str) -> _parameter.Parameter:
        return self._params[key]

    def __setitem__(self, key: str, value: _parameter.Parameter) -> None:
        self._params[key] = value

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __contains__(self, key) -> bool:
        return key in self._params

    def keys(self):
        return self._params.keys()

    def values(self):
        return self._params.values()

    def items(self):
        return self._params.items()

    def update(self, other) -> None:
        for k, v in (other.items() if hasattr(other, "items") else other):
            if k in self._params and self._params[k] is not v:
                raise DnnbindValueError(f"ParameterDict.update: two different Parameters named `{k}`")
            self._params[k] = v

    def get(self, name: str, **kwargs) -> _parameter.Parameter:
        """The Parameter ``prefix + name``, created with ``kwargs`` if absent (MXNet 1.x ``params.get``)."""
        full = self._prefix + name
        param = self._params.get(full)
        if param is None and self._shared is not None:
            param = self._shared._params.get(full) or self._shared._params.get(name)
        if param is None:
            param = _parameter.Parameter(full, **kwargs)
        elif "shape" in kwargs:
            param.shape = kwargs["shape"]  # a shared Parameter: fill in what this layer knows
        self._params[full] = param
        return param

    def get_constant(self, name: str, value=None) -> _parameter.Parameter:
        """The Constant ``prefix + name``, created from ``value`` if absent (MXNet 1.x ``params.get_constant``)."""
        full = self._prefix + name
        param = self._params.get(full)
        if param is None:
            if value is None:
                raise KeyError(f"get_constant: no constant {full!r}; pass value= to create it")
            param = self._params[full] = _parameter.Constant(full, value)
        return param

    def select(self, pattern: str | None) -> ParameterDict:
        if pattern is None:
            return self
        rx = re.compile(pattern)
        out = ParameterDict(self._prefix)
        out._params.update((k, p) for k, p in self._params.items() if rx.match(k) or rx.match(p.name))
        return out

    def initialize(self, init=None, ctx=None, verbose: bool = False, force_reinit: bool = False) -> None:
        """Initialize every Parameter: ``init`` is the global initializer (default Uniform(0.07))."""
        default = _init.create(init) if init is not None else _init.Uniform()
        for p in self._params.values():
            p.initialize(None, ctx, default, force_reinit=force_reinit)
            if verbose:
                print(f"initialized {p!r} with {p.init if p.init is not None else default!r}")

    def zero_grad(self) -> None:
        for p in self._params.values():
            p.zero_grad()

    def reset_ctx(self, ctx) -> None:
        for p in self._params.values():
            p.reset_ctx(ctx)

    def list_ctx(self) -> list:
        out = []
        for p in self._params.values():
            for c in p.list_ctx():
                if c not in out:
                    out.append(c)
        return out

    def setattr(self, name: str, value) -> None:
        """Set an attribute on every Parameter, e.g. ``setattr('grad_req', 'add')``."""
        for p in self._params.values():
            setattr(p, name, value)

    def save(self, filename, strip_prefix: str = "") -> None:
        """Save every Parameter under its prefixed name minus ``strip_prefix`` (MXNet 1.x's format); atomic."""
        arrays = {}
        for p in self._params.values():
            if not p.name.startswith(strip_prefix):
                raise DnnbindValueError(f"ParameterDict.save: strip_prefix {strip_prefix!r} is not a prefix of Parameter "
                                 f"`{p.name}` (a shared Parameter, or a child made outside name_scope())")
            arrays[p.name[len(strip_prefix):]] = p._host_copy()
        serialization.save(filename, arrays)

    def load(self, filename, ctx=None, allow_missing: bool = False, ignore_extra: bool = False,
             restore_prefix: str = "", cast_dtype: bool = False, dtype_source: str = "current") -> None:
        """Load a file keyed by prefixed names (``save``, MXNet's ``export``/Module with ``arg:``/``aux:``).

        ``restore_prefix`` is prepended to every name in the file, undoing ``save(strip_prefix=...)``.
        """
        self.load_dict(read_param_file(filename), ctx, allow_missing, ignore_extra, restore_prefix,
                       os.fspath(filename), cast_dtype, dtype_source)

    def load_dict(self, param_dict: dict, ctx=None, allow_missing: bool = False, ignore_extra: bool = False,
                  restore_prefix: str = "", filename=None, cast_dtype: bool = False,
                  dtype_source: str = "current") -> None:
        """Load ``{name: array}`` (NDArrays or numpy arrays, e.g. ``nd.load(f)``) as ``load`` loads a file.

        ``restore_prefix`` is prepended to every name, undoing ``save(strip_prefix=...)``; MXNet's ``arg:``/``aux:``
        prefixes are dropped."""
        targets = {p.name: p for p in self._params.values()}
        bad = [name for name in targets if not name.startswith(restore_prefix)]
        if bad:
            raise DnnbindValueError(f"ParameterDict.load: restore_prefix {restore_prefix!r} is not a prefix of "
                             f"Parameter `{bad[0]}`")
        loaded = {}
        for k, v in param_dict.items():
            if k.startswith(("arg:", "aux:")):
                k = k[4:]
            loaded[restore_prefix + k] = v.numpy() if hasattr(v, "numpy") else (None if v is None else np.asarray(v))
        what = f"ParameterDict.load({filename!r})" if filename is not None else "ParameterDict.load_dict"
        load_into(targets, loaded, what, ctx, allow_missing, ignore_extra, cast_dtype, dtype_source)
