"""Parameter (``mxnet.gluon.Parameter``; ParameterDict is in parameter_dict.py). Layer: gluon; imports runtime,
autograd, initializer.

A Parameter owns a data NDArray and a gradient NDArray per context: usually one device; after
``initialize(ctx=[gpu(0), gpu(1)])`` one copy per device, initialized once and copied, each copy its own autograd
leaf with its own gradient (MXNet's data parallelism; ``_param_ctx`` says which copy ``data()`` gives). Shapes may
be partly unknown (0 dims, MXNet's convention) until the first forward pass; initialization is then deferred and
finished by the layer that infers the shape. A Trainer may later *move* data and grad into views of its flat
buffers (``_rebind``): everything else writes parameters in place (``set_data``, ``load_parameters``, re-init),
so those views stay valid.

Parameter files are MXNet 1.x's NDArray format (``dnnbind.serialization``), so they go both ways with MXNet;
dnnbind's older npz files (told apart by their zip header) still load.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import warnings

import numpy as np

from .. import autograd, features
from .. import initializer as _init
from ..runtime.array import NDArray, array, empty, zeros
from ..runtime.device import Device, as_device
from ._param_ctx import ctx_list, copy_device, host_mean, multi_ctx, using_device

__all__ = ["Constant", "DeferredInitializationError", "Parameter", "copy_device", "multi_ctx",
           "using_device"]

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


def _moved(a: NDArray, ctx: Device) -> NDArray:
    """A new array on ``ctx`` holding ``a``'s values; across devices through the host, which waits for ``a``'s
    device (a peer copy would not be ordered after the work that wrote ``a``)."""
    return a.copy() if a.device is ctx else array(a.numpy(), device=ctx)


class Parameter:
    """A tensor of a Block's weights with its gradient buffer (MXNet's Parameter API)."""

    def __init__(self, name: str = "weight", grad_req: str = "write", shape=None, dtype=np.float32,
                 lr_mult: float = 1.0, wd_mult: float = 1.0, init=None, allow_deferred_init: bool = False,
                 differentiable: bool = True, stype: str = "default", grad_stype: str = "default"):
        if stype != "default" or grad_stype != "default":
            raise DnnbindValueError(f"Parameter `{name}`: only dense storage ('default') is supported")
        if grad_req not in _REQS:
            raise DnnbindValueError(f"Parameter `{name}`: grad_req must be one of {_REQS}, got {grad_req!r}")
        self.name = name
        self._shape = _norm_shape(shape)
        self.dtype = np.dtype(dtype)
        self.lr_mult, self.wd_mult = float(lr_mult), float(wd_mult)
        self.init = init
        self.allow_deferred_init = allow_deferred_init
        self.differentiable = differentiable
        self._grad_req = grad_req if differentiable else "null"
        self._data: NDArray | None = None  # the (first) copy's data and gradient
        self._grad: NDArray | None = None
        self._ctx: Device | None = None  # the (first) context
        # Several contexts: the contexts, {context: index}, every copy's data and gradient. All None on one
        # context, so data() stays one attribute test away from the single-device path.
        self._ctx_list: list | None = None
        self._ctx_index: dict | None = None
        self._data_list: list | None = None
        self._grad_list: list | None = None
        self._deferred_init: tuple = ()  # (init, explicit, [contexts]) while waiting for the shape
        self._structured_name: str | None = None  # 'conv1.weight', set by Block.collect_params
        self.fan_in_from: Parameter | None = None  # a bias reads its layer's fan_in from the weight

    def __getattr__(self, name: str):
        """Reached only when ``name`` is not found: MXNet's Parameter methods dnnbind lacks (``var``,
        ``row_sparse_data``) raise UnsupportedFeature naming them, anything else a plain AttributeError."""
        if name.startswith("_") or hasattr(type(self), name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)
        hint = "symbolic graphs" if name == "var" else "sparse storage" if "sparse" in name else ""
        raise features.missing("Parameter", name, hint, obj=self)

    # -- naming and shape ---------------------------------------------------------------------------------
    @property
    def display_name(self) -> str:
        """The structural name when known (``conv1.weight``), else the prefixed name."""
        return self._structured_name or self.name

    def __repr__(self) -> str:
        return f"Parameter {self.name} (shape={self._shape}, dtype={self.dtype.name})"  # MXNet's: the full name

    @property
    def shape(self) -> tuple | None:
        return self._shape

    @shape.setter
    def shape(self, new) -> None:
        new = _norm_shape(new)
        old = self._shape
        if old is not None and (len(old) != len(new) or any(o and o != n for o, n in zip(old, new))):
            raise DnnbindValueError(f"Parameter `{self.display_name}`: cannot change shape from {old} to {new}; only "
                             "unknown (0) dimensions can be filled in")
        self._shape = new

    def _shape_known(self) -> bool:
        return self._shape is not None and all(d > 0 for d in self._shape)

    # -- initialization -----------------------------------------------------------------------------------
    def initialize(self, init=None, ctx=None, default_init=None, force_reinit: bool = False) -> None:
        """Allocate and fill on ``ctx``: a device, a list of devices (one copy each, identical values), or None
        (the contexts it already has, else the default device); deferred while the shape is unknown.

        ``init`` overrides this Parameter's own ``init``, which overrides ``default_init`` (the Block's global
        initializer, MXNet's precedence).
        """
        if self._data is not None and not force_reinit:
            warnings.warn(f"Parameter `{self.display_name}` is already initialized, ignoring. Set "
                          "force_reinit=True to re-initialize.", stacklevel=2)
            return
        explicit = init if init is not None else self.init
        chosen = explicit if explicit is not None else (default_init or _init.Uniform())
        if ctx is None and self._ctx is not None:
            ctxs = self.list_ctx()
        else:
            ctxs = ctx_list(ctx, f"Parameter `{self.display_name}`.initialize")
        self._deferred_init = (chosen, explicit is not None, ctxs)
        # A bias whose layer's weight shape is still unknown waits too: its fan_in comes from that weight.
        waits_for_weight = self.fan_in_from is not None and not self.fan_in_from._shape_known()
        if not self._shape_known() or waits_for_weight:
            if self.allow_deferred_init or waits_for_weight:
                return
            raise DnnbindValueError(f"Cannot initialize Parameter `{self.display_name}`: its shape {self._shape} has "
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
        init, explicit, ctxs = self._deferred_init
        if self._data is None or self.list_ctx() != ctxs or self._data.shape != self._shape:
            self._adopt_ctxs(ctxs, [empty(self._shape, self.dtype, c) for c in ctxs], None)
        init = _init.create(init)
        desc = _init.InitDesc(self.name, self._init_attrs())
        if explicit:
            init._init_weight(desc, self._data)  # a per-Parameter initializer applies whatever the name
        else:
            init(desc, self._data)
        if self._data_list is not None:  # initialized once: every copy starts identical (through the host, which
            host = self._data.numpy()  # waits for the first copy's device: no cross-device stream ordering)
            for copy in self._data_list[1:]:
                copy.copy_(host)
        self._deferred_init = ()

    def _init_attrs(self) -> dict:
        src = self.fan_in_from if self.fan_in_from is not None else self
        shape = src._shape
        if shape is not None and len(shape) >= 2 and all(shape):
            return {"fan_in": int(np.prod(shape[1:]))}
        return {}

    def _adopt_ctxs(self, ctxs: list, datas: list, grads: list | None) -> None:
        """Live on ``ctxs`` with ``datas[k]`` (and ``grads[k]``, allocated if None) as copy k."""
        self._ctx = ctxs[0]
        if len(ctxs) == 1:
            self._ctx_list = self._ctx_index = self._data_list = self._grad_list = None
        else:
            multi_ctx[0] = True
            self._ctx_list = list(ctxs)
            self._ctx_index = {c: k for k, c in enumerate(ctxs)}
            self._data_list, self._grad_list = [None] * len(ctxs), [None] * len(ctxs)
        for k, data in enumerate(datas):
            self._set_arrays(data, None if grads is None else grads[k], k)

    def _set_arrays(self, data: NDArray, grad: NDArray | None, k: int = 0) -> None:
        """Adopt ``data`` (and ``grad``, allocated if None) as copy ``k`` and tell autograd where gradients go."""
        generation[0] += 1
        if self._grad_req == "null":
            grad = None
        elif grad is None:
            grad = zeros(data.shape, data.dtype, data.device)
        if self._data_list is not None:
            self._data_list[k], self._grad_list[k] = data, grad
        if k == 0:
            self._data, self._grad = data, grad
        autograd.mark_variables([data], [grad], self._grad_req)

    _rebind = _set_arrays  # the Trainer's name for moving a copy into its flat buffers

    def _check_initialized(self) -> None:
        if self._deferred_init:
            self._finish_deferred_init()
            return
        raise RuntimeError(f"Parameter `{self.display_name}` has not been initialized. Call net.initialize(ctx=...) "
                           "(or param.initialize()) before using it, or load_parameters().")

    # -- access -------------------------------------------------------------------------------------------
    def data(self, ctx=None) -> NDArray:
        """The data NDArray on ``ctx`` (the same object every call, so autograd sees one leaf).

        On several contexts, ``ctx=None`` means the current device (``using_device``, which a Block call sets
        from its input), else the first context; ``ctx=list`` gives every copy (MXNet's spelling).
        """
        if self._data is None:
            self._check_initialized()
        if self._data_list is None:
            if ctx is None:  # the path every layer takes per call: as cheap as it was before several contexts
                return self._data
            if ctx is list:
                return [self._data]
            if as_device(ctx) is not self._ctx:
                raise RuntimeError(f"Parameter `{self.display_name}` was not initialized on context {ctx!r}; it "
                                   f"lives on {self._ctx!r}. Use param.reset_ctx() or "
                                   "net.collect_params().reset_ctx().")
            return self._data
        return list(self._data_list) if ctx is list else self._data_list[self._copy_index(ctx)]

    def _copy_index(self, ctx) -> int:
        """Which copy ``ctx`` (None: the current device, else the first) names; several contexts only."""
        dev = copy_device() if ctx is None else as_device(ctx)
        if dev is None:
            return 0
        k = self._ctx_index.get(dev)
        if k is None:
            how = "the current device (using_device / the Block's input)" if ctx is None else "context"
            raise RuntimeError(f"Parameter `{self.display_name}` was not initialized on {how} {dev!r}; it lives on "
                               f"{self._ctx_list!r}. Put the input on one of them (split_and_load), or "
                               "reset_ctx().")
        return k

    def list_data(self) -> list:
        """Every copy, in context order."""
        self.data()  # the initialization checks
        return list(self._data_list) if self._data_list is not None else [self._data]

    def grad(self, ctx=None) -> NDArray:
        self.data(ctx)  # the same initialization and device checks
        if self._grad is None:
            raise RuntimeError(f"Cannot get gradient array for Parameter `{self.display_name}` because "
                               "grad_req='null'")
        if self._grad_list is None:
            return [self._grad] if ctx is list else self._grad
        return list(self._grad_list) if ctx is list else self._grad_list[self._copy_index(ctx)]

    def list_grad(self) -> list:
        """Every copy's gradient, in context order."""
        return self.grad(list)

    def list_ctx(self) -> list:
        if self._data is None and self._deferred_init:
            return list(self._deferred_init[2])
        if self._ctx is None:
            raise RuntimeError(f"Parameter `{self.display_name}` has not been initialized")
        return list(self._ctx_list) if self._ctx_list is not None else [self._ctx]

    def _copies(self) -> list:
        """[(data, grad)] per context (empty before initialization)."""
        if self._data is None:
            return []
        if self._data_list is None:
            return [(self._data, self._grad)]
        return list(zip(self._data_list, self._grad_list))

    @property
    def grad_req(self) -> str:
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req: str) -> None:
        if req not in _REQS:
            raise DnnbindValueError(f"Parameter `{self.display_name}`: grad_req must be one of {_REQS}, got {req!r}")
        if not self.differentiable:
            req = "null"
        if req == self._grad_req:
            return
        self._grad_req = req
        generation[0] += 1
        for k, (data, grad) in enumerate(self._copies()):
            self._set_arrays(data, grad if req != "null" else None, k)

    def set_data(self, data) -> None:
        """Write ``data`` (NDArray or numpy) into every copy in place (a Trainer's views stay valid)."""
        shape = tuple(data.shape)
        if self._data is None:
            if not self._deferred_init:
                self._check_initialized()
            self.shape = shape
            self._finish_deferred_init()
        if shape != self._data.shape:
            raise DnnbindValueError(f"Parameter `{self.display_name}`.set_data: shape {shape} does not match "
                             f"{self._data.shape}")
        for copy, _ in self._copies():
            copy.copy_(data)

    def zero_grad(self) -> None:
        for _, grad in self._copies():
            if grad is not None:
                grad.zero_()

    def reset_ctx(self, ctx) -> None:
        """Move to ``ctx`` (a device or a list): a context kept keeps its copy's values, a new one copies the
        first copy. A Trainer holding this Parameter repacks on its next step."""
        ctxs = ctx_list(ctx, f"Parameter `{self.display_name}`.reset_ctx")
        if self._data is None:
            if self._deferred_init:
                init, explicit, _ = self._deferred_init
                self._deferred_init = (init, explicit, ctxs)
            return
        old = self.list_ctx()
        if ctxs == old:
            return
        copies = self._copies()
        datas, grads = [], []
        for c in ctxs:
            data, grad = copies[old.index(c)] if c in old else copies[0]
            datas.append(_moved(data, c))
            grads.append(_moved(grad, c) if grad is not None else None)
        self._adopt_ctxs(ctxs, datas, None if any(g is None for g in grads) else grads)

    def _load_init(self, host: np.ndarray, ctx=None) -> None:
        """load_parameters: fill unknown dims from the file, initialize if needed, then copy in place."""
        self.shape = host.shape
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if self._data is None:
            if ctx is None:
                ctx = self._deferred_init[2] if self._deferred_init else None
            ctxs = ctx_list(ctx, f"Parameter `{self.display_name}`.load")
            self._deferred_init = ()
            self._adopt_ctxs(ctxs, [array(host, device=c) for c in ctxs], None)
            return
        if ctx is not None:
            self.reset_ctx(ctx)
        for copy, _ in self._copies():
            copy.copy_(host)

    def _host_copy(self) -> np.ndarray:
        """What save_parameters writes: the copy on the host; on several contexts their mean (MXNet's
        ``_reduce``), which is every copy's value when they are identical, as a Trainer keeps them."""
        if self._data_list is None:
            return self.data().numpy()
        self.data()
        return host_mean(self._data_list)

    _reduce = _host_copy  # MXNet's name

    def cast(self, dtype) -> None:
        dtype = np.dtype(dtype)
        self.dtype = dtype
        for k, (data, grad) in enumerate(self._copies()):
            self._set_arrays(data.astype(dtype), grad.astype(dtype) if grad is not None else None, k)


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


