"""Basic layers (``mxnet.gluon.nn``): Sequential, Dense, Activation, Dropout, Flatten, Lambda, Embedding.
Layer: gluon; imports nd, gluon.block, gluon.parameter.

Dense keeps MXNet's weight layout (units, in_units) and calls ``nd.FullyConnected`` (one cuBLAS Sgemm plus a
rank-1 Sgemm for the bias). ``in_units=0`` defers the weight's shape to the first forward pass.
"""

from __future__ import annotations

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

from ... import nd
from ...ops._check import scalar
from ..block import Block
from ._checks import size

__all__ = [
    "Activation",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "HybridLambda",
    "HybridSequential",
    "Lambda",
    "Sequential",
]


class Sequential(Block):
    """Stacks Blocks; children are named by index (``0.weight``, ``1.bias`` in save_parameters' files)."""

    _summary_row = False  # Block.summary() gives rows to the children, not to the container

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)

    def add(self, *blocks: Block) -> Sequential:
        for block in blocks:
            self.register_child(block)
        return self

    def forward(self, x, *args):
        for block in self._children.values():
            x = block(x, *args)
            args = ()
            if isinstance(x, (tuple, list)):
                x, args = x[0], tuple(x[1:])
        return x if not args else (x, *args)

    def __getitem__(self, key):
        blocks = list(self._children.values())[key]
        if isinstance(key, slice):
            out = type(self)(prefix=self._prefix)
            return out.add(*blocks)
        return blocks

    def __len__(self) -> int:
        return len(self._children)


class HybridSequential(Sequential):
    """Sequential under MXNet's other name, with its own name counter as there (``hybridsequential0_``)."""


def _act_name(activation) -> str:
    return activation if isinstance(activation, str) else "linear"


class Dense(Block):
    """y = activation(x W^T + b). MXNet arguments; ``flatten=True`` views (N, ...) input as (N, -1)."""
    _array_input = True

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True, flatten: bool = True,
                 dtype="float32", weight_initializer=None, bias_initializer=None, in_units: int = 0,
                 prefix=None, params=None):
        units, in_units = size("Dense", "units", units), size("Dense", "in_units", in_units, 0)
        super().__init__(prefix=prefix, params=params)
        self._units, self._in_units, self._flatten = units, in_units, flatten
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(units, in_units), dtype=dtype, init=weight_initializer,
                                          allow_deferred_init=True)
            self.bias = None
            if use_bias:
                self.bias = self.params.get("bias", shape=(units,), dtype=dtype, init=bias_initializer,
                                            allow_deferred_init=True)
                self.bias.fan_in_from = self.weight
            self.act = Activation(activation, prefix=f"{activation}_") if activation is not None else None

    def _infer(self, x) -> None:
        """First forward: take in_units from the input, then finish the deferred initialization."""
        if not self.weight._shape_known():
            # As MXNet: flatten=True reads a 1-d (N,) input as (N, 1) (in_units 1); flatten=False as one sample.
            in_units = 1
            for d in (x.shape[1:] if self._flatten else x.shape[-1:]):
                in_units *= d
            if not in_units:
                raise DnnbindValueError(f"{self.name}: Dense cannot infer in_units from an input of shape {x.shape}: "
                                        "it has 0 features per sample")
            self.weight.shape = (self._units, in_units)
            self._in_units = in_units
        self.weight._finish_deferred_init()
        if self.bias is not None:
            self.bias._finish_deferred_init()

    def forward(self, x):
        if x.ndim == 0:  # MXNet: "Deferred initialization failed because shape cannot be inferred" (ValueError)
            raise DnnbindValueError(f"{self.name}: Dense cannot take a 0-d input; give it at least one axis")
        if self.weight._data is None:
            self._infer(x)
        w = self.weight.data()
        b = self.bias.data() if self.bias is not None else None
        if self._flatten or x.ndim == 2:
            y = nd.FullyConnected(x, w, b, num_hidden=self._units, no_bias=b is None, flatten=self._flatten)
        else:  # apply to the last axis: (..., in) -> (..., units) through a 2-D view
            lead = x.shape[:-1]
            y = nd.FullyConnected(x.reshape((-1, x.shape[-1])), w, b, num_hidden=self._units, no_bias=b is None)
            y = y.reshape(lead + (self._units,))
        return self.act(y) if self.act is not None else y

    def __repr__(self) -> str:
        shape = self.weight.shape
        act = self.act._act_type if self.act is not None else "linear"
        return f"{type(self).__name__}({shape[1] or None} -> {shape[0]}, {act})"


_ACTIVATIONS = ("relu", "sigmoid", "tanh", "softrelu", "softsign")


class Activation(Block):
    """``nd.Activation``: relu, sigmoid, tanh (cuDNN), softrelu, softsign (generated kernels)."""
    _array_input = True

    def __init__(self, activation: str, prefix=None, params=None):
        if activation not in _ACTIVATIONS:
            kind = DnnbindValueError if isinstance(activation, str) else DnnbindTypeError
            raise kind(f"Activation: unknown activation {activation!r}; MXNet accepts {', '.join(_ACTIVATIONS)}")
        self._act_type = activation
        super().__init__(prefix=prefix, params=params)

    def _alias(self) -> str:
        return self._act_type

    def forward(self, x):
        return nd.Activation(x, act_type=self._act_type)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._act_type})"


class Dropout(Block):
    """Inverted dropout with rate ``rate`` inside ``autograd.record()`` (training); identity otherwise.
    ``axes``: the axes along which the mask is shared (variational dropout), as MXNet's."""
    _array_input = True

    def __init__(self, rate: float, axes: tuple = (), prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        rate = scalar("Dropout", "rate", rate)
        if not 0 <= rate < 1:
            raise DnnbindValueError(f"Dropout: rate must be in [0, 1), got {rate}")
        self._rate = float(rate)
        self._axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)

    def forward(self, x):
        return nd.Dropout(x, p=self._rate, axes=self._axes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p = {self._rate}, axes={self._axes})"


class Flatten(Block):
    """(N, ...) -> (N, -1), a view."""
    _array_input = True

    def forward(self, x):
        if x.ndim == 0:
            raise DnnbindValueError(f"{self.name}: Flatten needs an input (N, ...) with at least one axis, got a 0-d "
                                    "array")
        return nd.Flatten(x)

    def __repr__(self) -> str:
        return type(self).__name__


class Lambda(Block):
    """Wrap a function of NDArrays (or the name of an ``nd`` function) as a Block."""

    def __init__(self, function, prefix=None):
        super().__init__(prefix=prefix)
        if isinstance(function, str):
            if not hasattr(nd, function):
                raise DnnbindValueError(f"Lambda: dnnbind.nd has no function {function!r}")
            function = getattr(nd, function)
        elif not callable(function):
            raise DnnbindValueError(  # noqa: TRY004  (MXNet raises ValueError here)
                f"Lambda: expected a function or an nd function name, got {type(function).__name__}")
        self._func = function

    def forward(self, *args):
        return self._func(*args)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self._func, '__name__', repr(self._func))})"


class HybridLambda(Block):
    """Like Lambda, but the function is called as ``function(F, x, *args)`` with F = ``dnnbind.nd`` (MXNet's
    HybridLambda); a string names an ``nd`` function, called without F."""
    _array_input = True

    def __init__(self, function, prefix=None):
        super().__init__(prefix=prefix)
        if isinstance(function, str):
            if not hasattr(nd, function):
                raise DnnbindValueError(f"HybridLambda: dnnbind.nd has no function {function!r}")
            name, impl = function, getattr(nd, function)
            self._func = lambda F, *args: impl(*args)
        elif callable(function):
            name, self._func = getattr(function, "__name__", repr(function)), function
        else:
            raise DnnbindValueError(f"HybridLambda: expected a function or an nd function name, got "  # noqa: TRY004
                             f"{type(function).__name__}")
        self._func_name = name

    def forward(self, x, *args):
        return self._func(nd, x, *args)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._func_name})"


class Embedding(Block):
    """Index -> vector lookup: (d0, ..., dk) integer ids -> (d0, ..., dk, output_dim), ``nd.Embedding``.

    The weight (input_dim, output_dim) gets a dense gradient (``sparse_grad`` is accepted and ignored).
    """
    _array_input = True

    def __init__(self, input_dim: int, output_dim: int, dtype="float32", weight_initializer=None,
                 sparse_grad: bool = False, prefix=None, params=None):
        input_dim, output_dim = size("Embedding", "input_dim", input_dim), size("Embedding", "output_dim", output_dim)
        super().__init__(prefix=prefix, params=params)
        self._input_dim, self._output_dim, self._dtype = input_dim, output_dim, dtype
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(self._input_dim, self._output_dim), dtype=dtype,
                                          init=weight_initializer, allow_deferred_init=True)

    def forward(self, x):
        return nd.Embedding(x, self.weight.data(), self._input_dim, self._output_dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._input_dim} -> {self._output_dim}, {self._dtype})"
