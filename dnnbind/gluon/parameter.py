"""Parameter and ParameterDict (``mxnet.gluon.Parameter``). Layer: gluon; imports runtime, autograd, initializer.

A Parameter owns one data NDArray and one gradient NDArray on one device. Shapes may be partly unknown
(0 dims, MXNet's convention) until the first forward pass; initialization is then deferred and finished by
the layer that infers the shape. A Trainer may later *move* data and grad into views of its flat buffers
(``_rebind``): everything else writes parameters in place (``set_data``, ``load_parameters``, re-init), so
those views stay valid.

Parameter files are MXNet 1.x's NDArray format (``dnnbind.serialization``), so they go both ways with MXNet;
dnnbind's older npz files (told apart by their zip header) still load.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import OrderedDict

import numpy as np

from .. import autograd
from .. import initializer as _init
from .. import serialization
from ..runtime.array import NDArray, array, empty, zeros
from ..runtime.device import Device, as_device
from .param_files import _load_into, _read_param_file

__all__ = ["Constant", "DeferredInitializationError", "Parameter", "ParameterDict"]

_REQS = ("write", "add", "null")

# Bumped whenever any Parameter adopts new data/grad arrays or a new grad_req (``_set_arrays``): a hybridized
# Block's recorded calls point at those arrays, so it checks this one int per call and re-records on a change.
generation = [0]


class DeferredInitializationError(RuntimeError):
    """A Parameter's shape is still unknown: it is inferred on the first forward pass."""


def _norm_shape(shape) -> tuple | None:
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    return tuple(0 if (d is None or int(d) < 0) else int(d) for d in shape)


def _one_ctx(ctx) -> Device:
    if isinstance(ctx, (list, tuple)):
        if len(ctx) != 1:
            raise ValueError(f"dnnbind keeps each Parameter on one device; got ctx={list(ctx)!r}. Use one device "
                             "per model (data parallelism across GPUs is not implemented)")
        ctx = ctx[0]
    return as_device(ctx)


class Parameter:
    """A tensor of a Block's weights with its gradient buffer (MXNet's Parameter API)."""

    def __init__(self, name: str = "weight", grad_req: str = "write", shape=None, dtype=np.float32,
                 lr_mult: float = 1.0, wd_mult: float = 1.0, init=None, allow_deferred_init: bool = False,
                 differentiable: bool = True, stype: str = "default", grad_stype: str = "default"):
        if stype != "default" or grad_stype != "default":
            raise ValueError(f"Parameter `{name}`: only dense storage ('default') is supported")
        if grad_req not in _REQS:
            raise ValueError(f"Parameter `{name}`: grad_req must be one of {_REQS}, got {grad_req!r}")
        self.name = name
        self._shape = _norm_shape(shape)
        self.dtype = np.dtype(dtype)
        self.lr_mult, self.wd_mult = float(lr_mult), float(wd_mult)
        self.init = init
        self.allow_deferred_init = allow_deferred_init
        self.differentiable = differentiable
        self._grad_req = grad_req if differentiable else "null"
        self._data: NDArray | None = None
        self._grad: NDArray | None = None
        self._ctx: Device | None = None
        self._deferred_init: tuple = ()  # (init, explicit, ctx) while waiting for the shape
        self._structured_name: str | None = None  # 'conv1.weight', set by Block.collect_params
        self.fan_in_from: Parameter | None = None  # a bias reads its layer's fan_in from the weight

    # -- naming and shape ---------------------------------------------------------------------------------
    @property
    def display_name(self) -> str:
        """The structural name when known (``conv1.weight``), else the prefixed name."""
        return self._structured_name or self.name

    def __repr__(self) -> str:
        return f"Parameter {self.display_name} (shape={self._shape}, dtype={self.dtype.name})"

    @property
    def shape(self) -> tuple | None:
        return self._shape

    @shape.setter
    def shape(self, new) -> None:
        new = _norm_shape(new)
        old = self._shape
        if old is not None and (len(old) != len(new) or any(o and o != n for o, n in zip(old, new))):
            raise ValueError(f"Parameter `{self.display_name}`: cannot change shape from {old} to {new}; only "
                             "unknown (0) dimensions can be filled in")
        self._shape = new

    def _shape_known(self) -> bool:
        return self._shape is not None and all(d > 0 for d in self._shape)

    # -- initialization -----------------------------------------------------------------------------------
    def initialize(self, init=None, ctx=None, default_init=None, force_reinit: bool = False) -> None:
        """Allocate and fill on ``ctx`` (the default device if None); deferred while the shape is unknown.

        ``init`` overrides this Parameter's own ``init``, which overrides ``default_init`` (the Block's global
        initializer, MXNet's precedence).
        """
        if self._data is not None and not force_reinit:
            warnings.warn(f"Parameter `{self.display_name}` is already initialized, ignoring. Set "
                          "force_reinit=True to re-initialize.", stacklevel=2)
            return
        explicit = init if init is not None else self.init
        chosen = explicit if explicit is not None else (default_init or _init.Uniform())
        ctx = self._ctx if (ctx is None and self._ctx is not None) else _one_ctx(ctx)
        self._deferred_init = (chosen, explicit is not None, ctx)
        # A bias whose layer's weight shape is still unknown waits too: its fan_in comes from that weight.
        waits_for_weight = self.fan_in_from is not None and not self.fan_in_from._shape_known()
        if not self._shape_known() or waits_for_weight:
            if self.allow_deferred_init or waits_for_weight:
                return
            raise ValueError(f"Cannot initialize Parameter `{self.display_name}`: its shape {self._shape} has "
                             "unknown (0) dimensions and allow_deferred_init is False. Give the full shape.")
        self._finish_deferred_init()

    def _deferred_message(self) -> str:
        return (f"Parameter `{self.display_name}` has not been initialized yet because initialization was "
                f"deferred: its shape {self._shape} has unknown (0) dimensions that are inferred from the first "
                "input. Run a forward pass first (e.g. net(x) with one batch), or give in_channels (Conv2D) / "
                "in_units (Dense) when creating the layer so that shapes are known at initialize().")

    def _finish_deferred_init(self) -> None:
        if not self._deferred_init:
            return
        if not self._shape_known():
            raise DeferredInitializationError(self._deferred_message())
        init, explicit, ctx = self._deferred_init
        if self._data is None or self._data.device is not ctx or self._data.shape != self._shape:
            self._ctx = ctx
            self._set_arrays(empty(self._shape, self.dtype, ctx), None)
        init = _init.create(init)
        desc = _init.InitDesc(self.name, self._init_attrs())
        if explicit:
            init._init_weight(desc, self._data)  # a per-Parameter initializer applies whatever the name
        else:
            init(desc, self._data)
        self._deferred_init = ()

    def _init_attrs(self) -> dict:
        src = self.fan_in_from if self.fan_in_from is not None else self
        shape = src._shape
        if shape is not None and len(shape) >= 2 and all(shape):
            return {"fan_in": int(np.prod(shape[1:]))}
        return {}

    def _set_arrays(self, data: NDArray, grad: NDArray | None) -> None:
        """Adopt ``data`` (and ``grad``, allocated if None) and tell autograd where gradients go."""
        generation[0] += 1
        self._data = data
        if self._grad_req == "null":
            self._grad = None
        else:
            self._grad = grad if grad is not None else zeros(data.shape, data.dtype, data.device)
        autograd.mark_variables([data], [self._grad], self._grad_req)

    _rebind = _set_arrays  # the Trainer's name for moving a Parameter into its flat buffers

    def _check_initialized(self) -> None:
        if self._deferred_init:
            self._finish_deferred_init()
            return
        raise RuntimeError(f"Parameter `{self.display_name}` has not been initialized. Call net.initialize(ctx=...) "
                           "(or param.initialize()) before using it, or load_parameters().")

    # -- access -------------------------------------------------------------------------------------------
    def data(self, ctx=None) -> NDArray:
        """The data NDArray (the same object every call, so autograd sees one leaf)."""
        if self._data is None:
            self._check_initialized()
        if ctx is not None and as_device(ctx) is not self._ctx:
            raise RuntimeError(f"Parameter `{self.display_name}` was not initialized on context {ctx!r}; it lives "
                               f"on {self._ctx!r}. Use param.reset_ctx() or net.collect_params().reset_ctx().")
        return self._data

    def list_data(self) -> list:
        return [self.data()]

    def grad(self, ctx=None) -> NDArray:
        self.data(ctx)  # the same initialization and device checks
        if self._grad is None:
            raise RuntimeError(f"Cannot get gradient array for Parameter `{self.display_name}` because "
                               "grad_req='null'")
        return self._grad

    def list_grad(self) -> list:
        return [self.grad()]

    def list_ctx(self) -> list:
        if self._data is None and self._deferred_init:
            return [self._deferred_init[2]]
        if self._ctx is None:
            raise RuntimeError(f"Parameter `{self.display_name}` has not been initialized")
        return [self._ctx]

    @property
    def grad_req(self) -> str:
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req: str) -> None:
        if req not in _REQS:
            raise ValueError(f"Parameter `{self.display_name}`: grad_req must be one of {_REQS}, got {req!r}")
        if not self.differentiable:
            req = "null"
        if req == self._grad_req:
            return
        self._grad_req = req
        if self._data is not None:
            self._set_arrays(self._data, self._grad if req != "null" else None)

    def set_data(self, data) -> None:
        """Write ``data`` (NDArray or numpy) into this Parameter in place (a Trainer's views stay valid)."""
        shape = tuple(data.shape)
        if self._data is None:
            if not self._deferred_init:
                self._check_initialized()
            self.shape = shape
            self._finish_deferred_init()
        if shape != self._data.shape:
            raise ValueError(f"Parameter `{self.display_name}`.set_data: shape {shape} does not match "
                             f"{self._data.shape}")
        self._data.copy_(data)

    def zero_grad(self) -> None:
        if self._grad is not None:
            self._grad.zero_()

    def reset_ctx(self, ctx) -> None:
        """Move data (and grad) to ``ctx``. A Trainer holding this Parameter repacks on its next step."""
        ctx = _one_ctx(ctx)
        if self._data is None:
            if self._deferred_init:
                init, explicit, _ = self._deferred_init
                self._deferred_init = (init, explicit, ctx)
            return
        if ctx is self._ctx:
            return
        grad = self._grad.to(ctx) if self._grad is not None else None
        self._ctx = ctx
        self._set_arrays(self._data.to(ctx).copy(), grad)

    def _load_init(self, host: np.ndarray, ctx=None) -> None:
        """load_parameters: fill unknown dims from the file, initialize if needed, then copy in place."""
        self.shape = host.shape
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if self._data is None:
            if ctx is None:
                ctx = self._deferred_init[2] if self._deferred_init else None
            self._ctx = _one_ctx(ctx)
            self._deferred_init = ()
            self._set_arrays(array(host, device=self._ctx), None)
            return
        if ctx is not None:
            self.reset_ctx(ctx)
        self._data.copy_(host)

    def _host_copy(self) -> np.ndarray:
        return self.data().numpy()

    def cast(self, dtype) -> None:
        dtype = np.dtype(dtype)
        self.dtype = dtype
        if self._data is not None:
            grad = self._grad.astype(dtype) if self._grad is not None else None
            self._set_arrays(self._data.astype(dtype), grad)


class Constant(Parameter):
    """A non-trainable Parameter holding ``value`` (grad_req 'null'). ``Constant(value)`` or (name, value)."""

    def __init__(self, *args, **kwargs):
        if len(args) == 2:
            name, value = args
        elif len(args) == 1:
            name, value = kwargs.pop("name", "const"), args[0]
        else:
            name, value = kwargs.pop("name", "const"), kwargs.pop("value")
        value = value.numpy() if isinstance(value, NDArray) else np.asarray(value, dtype=np.float32)
        self.value = value
        super().__init__(name, grad_req="null", shape=value.shape, dtype=value.dtype,
                         init=_init.create(lambda desc, arr: arr.copy_(value)), differentiable=False)


class ParameterDict:
    """An ordered name -> Parameter mapping (``collect_params()`` returns one keyed by structural names)."""

    def __init__(self, prefix: str = "", shared: ParameterDict | None = None):
        self._prefix = prefix
        self._params: OrderedDict[str, Parameter] = OrderedDict()
        self._shared = shared

    prefix = property(lambda self: self._prefix)

    def __repr__(self) -> str:
        body = "\n".join(f"  {p!r}" for p in self._params.values())
        return f"ParameterDict {self._prefix!r} (\n{body}\n)" if body else f"ParameterDict {self._prefix!r} ()"

    def __getitem__(self, key: str) -> Parameter:
        return self._params[key]

    def __setitem__(self, key: str, value: Parameter) -> None:
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
                raise ValueError(f"ParameterDict.update: two different Parameters named `{k}`")
            self._params[k] = v

    def get(self, name: str, **kwargs) -> Parameter:
        """The Parameter ``prefix + name``, created with ``kwargs`` if absent (MXNet 1.x ``params.get``)."""
        full = self._prefix + name
        param = self._params.get(full)
        if param is None and self._shared is not None:
            param = self._shared._params.get(full) or self._shared._params.get(name)
        if param is None:
            param = Parameter(full, **kwargs)
        elif "shape" in kwargs:
            param.shape = kwargs["shape"]  # a shared Parameter: fill in what this layer knows
        self._params[full] = param
        return param

    def get_constant(self, name: str, value=None) -> Parameter:
        """The Constant ``prefix + name``, created from ``value`` if absent (MXNet 1.x ``params.get_constant``)."""
        full = self._prefix + name
        param = self._params.get(full)
        if param is None:
            if value is None:
                raise KeyError(f"get_constant: no constant {full!r}; pass value= to create it")
            param = self._params[full] = Constant(full, value)
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
                raise ValueError(f"ParameterDict.save: strip_prefix {strip_prefix!r} is not a prefix of Parameter "
                                 f"`{p.name}` (a shared Parameter, or a child made outside name_scope())")
            arrays[p.name[len(strip_prefix):]] = p._host_copy()
        serialization.save(filename, arrays)

    def load(self, filename, ctx=None, allow_missing: bool = False, ignore_extra: bool = False,
             restore_prefix: str = "", cast_dtype: bool = False, dtype_source: str = "current") -> None:
        """Load a file keyed by prefixed names (``save``, MXNet's ``export``/Module with ``arg:``/``aux:``).

        ``restore_prefix`` is prepended to every name in the file, undoing ``save(strip_prefix=...)``.
        """
        targets = {p.name: p for p in self._params.values()}
        bad = [name for name in targets if not name.startswith(restore_prefix)]
        if bad:
            raise ValueError(f"ParameterDict.load: restore_prefix {restore_prefix!r} is not a prefix of "
                             f"Parameter `{bad[0]}`")
        loaded = {restore_prefix + k: v for k, v in _read_param_file(filename).items()}
        _load_into(targets, loaded, f"ParameterDict.load({os.fspath(filename)!r})", ctx, allow_missing,
                   ignore_extra, cast_dtype, dtype_source)
