"""Weight initializers with MXNet's semantics (``mxnet.init``). Layer: gluon support; imports numpy and runtime.

An initializer is called as ``init(desc, arr)``: ``desc`` is an :class:`InitDesc` (the Parameter's name plus
attributes such as ``fan_in``) and ``arr`` the NDArray to fill in place. As in MXNet's
``Initializer.__call__``, the name's suffix picks the rule: ``weight`` -> ``_init_weight``, ``bias`` ->
``_init_bias`` (zeros), ``gamma`` -> ``_init_gamma`` (ones), ``beta`` -> ``_init_beta`` (zeros), running/moving
means ``_init_zero``, variances ``_init_one``. So a global ``Uniform(0.07)`` (MXNet's default), ``Xavier`` or
``Constant`` leaves biases at zero, as MXNet's layers do with their ``bias_initializer='zeros'``, while
``TorchDefault`` overrides ``_init_bias`` to match PyTorch's Conv2d/Linear. An initializer given to one
Parameter (``bias_initializer=...``, or ``desc.attrs['__init__']``) is applied with ``_init_weight`` whatever
the name, as in MXNet. Unlike MXNet, any other name is initialized like a weight rather than refused.

Values are drawn on the host with numpy's global RNG (``np.random.seed`` makes runs repeatable) and copied
into the array once: initialization runs once per parameter, never on a training step.
"""

from __future__ import annotations

from ._lib.errors import DnnbindTypeError, DnnbindValueError

import json
import logging
import math
import re

import numpy as np

__all__ = [
    "Bilinear",
    "Constant",
    "InitDesc",
    "Initializer",
    "LSTMBias",
    "MSRAPrelu",
    "Mixed",
    "Normal",
    "One",
    "Orthogonal",
    "TorchDefault",
    "Uniform",
    "Xavier",
    "Zero",
    "create",
    "register",
]

_REGISTRY: dict[str, type] = {}
_log = logging.getLogger(__name__)


def register(cls):
    """Make ``cls`` creatable by its lower-case name (``create('xavier')``), like ``mx.init.register``."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


class InitDesc(str):
    """A Parameter's name carrying ``attrs`` (e.g. ``{'fan_in': 288}``) for the initializer to read."""

    def __new__(cls, name: str, attrs: dict | None = None, global_init=None):
        obj = super().__new__(cls, name)
        obj.attrs = dict(attrs or {})
        obj.global_init = global_init
        return obj


class Initializer:
    """Base class: dispatch on the parameter name (MXNet's ``Initializer.__call__``), fill ``arr`` in place.

    Subclasses override ``_init_weight(desc, arr)`` (and, if they like, ``_init_bias``, ``_init_gamma``,
    ``_init_beta``); ``arr`` is an NDArray, so ``arr[:] = nd.random.uniform(...)`` works as in MXNet.
    """

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._verbose, self._print_func = False, None

    def __call__(self, desc, arr) -> None:
        if not isinstance(desc, InitDesc):
            desc = InitDesc(str(desc))
        if desc.global_init is None:
            desc.global_init = self
        explicit = desc.attrs.get("__init__")
        name = str(desc)
        if explicit:  # a Parameter's own initializer applies whatever the name, as in MXNet
            create(explicit)._init_weight(desc, arr)
        elif name.endswith("weight"):
            self._init_weight(desc, arr)
        elif name.endswith("bias"):
            self._init_bias(desc, arr)
        elif name.endswith("gamma"):
            self._init_gamma(desc, arr)
        elif name.endswith("beta"):
            self._init_beta(desc, arr)
        elif name.endswith(("moving_mean", "running_mean", "moving_inv_var", "moving_avg", "min")):
            self._init_zero(desc, arr)
        elif name.endswith(("moving_var", "running_var", "max")):
            self._init_one(desc, arr)
        else:
            self._init_default(desc, arr)
        if self._verbose and self._print_func:
            _log.info("Initialized %s: %s", name, self._print_func(arr))

    def _init_weight(self, desc, arr) -> None:
        raise NotImplementedError(f"{type(self).__name__} must override _init_weight(name, arr)")

    def _init_bias(self, desc, arr) -> None:
        _fill(arr, np.zeros(arr.shape))

    def _init_gamma(self, desc, arr) -> None:
        _fill(arr, np.ones(arr.shape))

    def _init_beta(self, desc, arr) -> None:
        _fill(arr, np.zeros(arr.shape))

    def _init_zero(self, desc, arr) -> None:
        _fill(arr, np.zeros(arr.shape))

    def _init_one(self, desc, arr) -> None:
        _fill(arr, np.ones(arr.shape))

    def _init_default(self, desc, arr) -> None:
        # MXNet raises for unknown names; a user-created Parameter named e.g. 'scale' is common, so treat
        # anything else like a weight (what MXNet does for names given an explicit init).
        self._init_weight(desc, arr)

    def set_verbosity(self, verbose: bool = False, print_func=None) -> Initializer:
        """Log each initialized array with ``print_func(arr)`` (default: its root mean square)."""
        self._verbose = verbose
        self._print_func = print_func or (lambda x: str(float(np.sqrt(np.mean(np.square(x.numpy()))))))
        return self

    def dumps(self) -> str:
        """``'["name", {kwargs}]'``, MXNet's JSON description of an initializer."""
        return json.dumps([type(self).__name__.lower(), self._kwargs])

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self._kwargs == other._kwargs

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"{type(self).__name__}({args})"


def _fill(arr, host: np.ndarray) -> None:
    arr.copy_(np.asarray(host, dtype=arr.dtype).reshape(arr.shape))


def _fans(shape) -> tuple[float, float]:
    """MXNet's fans: (fan_in, fan_out) = (shape[1], shape[0]) times the receptive field size."""
    if len(shape) < 2:
        raise DnnbindValueError(f"cannot compute fan_in/fan_out of a {len(shape)}-D weight of shape {tuple(shape)}")
    receptive = float(np.prod(shape[2:])) if len(shape) > 2 else 1.0
    return shape[1] * receptive, shape[0] * receptive


@register
class Zero(Initializer):
    def _init_weight(self, desc, arr):
        _fill(arr, np.zeros(arr.shape))

    _init_bias = _init_weight


@register
class One(Initializer):
    def _init_weight(self, desc, arr):
        _fill(arr, np.ones(arr.shape))


@register
class Constant(Initializer):
    def __init__(self, value=0.0):
        super().__init__(value=value)
        self.value = value

    def _init_weight(self, desc, arr):
        _fill(arr, np.broadcast_to(np.asarray(self.value, dtype=np.float64), arr.shape))


@register
class LSTMBias(Initializer):
    """An LSTM bias: 0 everywhere but the forget gate (the second of the gates i, f, g, o), which gets
    ``forget_bias`` (Jozefowicz et al. 2015 recommend 1). MXNet applies it to whatever the name, as a weight."""

    def __init__(self, forget_bias=1.0):
        super().__init__(forget_bias=forget_bias)
        self.forget_bias = forget_bias

    def _init_weight(self, desc, arr):
        host = np.zeros(arr.shape)
        n = arr.shape[0] // 4
        host[n:2 * n] = self.forget_bias
        _fill(arr, host)


@register
class Uniform(Initializer):
    """Weights ~ U(-scale, scale). MXNet's default initializer (scale 0.07); biases zero."""

    def __init__(self, scale: float = 0.07):
        super().__init__(scale=scale)
        self.scale = scale

    def _init_weight(self, desc, arr):
        _fill(arr, np.random.uniform(-self.scale, self.scale, arr.shape))


@register
class Normal(Initializer):
    """Weights ~ N(0, sigma^2); biases zero."""

    def __init__(self, sigma: float = 0.01):
        super().__init__(sigma=sigma)
        self.sigma = sigma

    def _init_weight(self, desc, arr):
        _fill(arr, np.random.normal(0.0, self.sigma, arr.shape))


@register
class Xavier(Initializer):
    """Glorot: scale = sqrt(magnitude / factor), factor = (fan_in + fan_out)/2, fan_in or fan_out.

    Uniform draws U(-scale, scale) (variance scale^2/3), gaussian N(0, scale^2). The defaults (uniform, avg,
    3) give Var = 2 / (fan_in + fan_out), Glorot & Bengio's value.
    """

    def __init__(self, rnd_type: str = "uniform", factor_type: str = "avg", magnitude: float = 3):
        super().__init__(rnd_type=rnd_type, factor_type=factor_type, magnitude=magnitude)
        if rnd_type not in ("uniform", "gaussian"):
            raise DnnbindValueError(f"Xavier: rnd_type must be 'uniform' or 'gaussian', got {rnd_type!r}")
        if factor_type not in ("avg", "in", "out"):
            raise DnnbindValueError(f"Xavier: factor_type must be 'avg', 'in' or 'out', got {factor_type!r}")
        self.rnd_type, self.factor_type, self.magnitude = rnd_type, factor_type, float(magnitude)

    def _init_weight(self, desc, arr):
        fan_in, fan_out = _fans(arr.shape)
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[self.factor_type]
        scale = math.sqrt(self.magnitude / factor)
        if self.rnd_type == "uniform":
            _fill(arr, np.random.uniform(-scale, scale, arr.shape))
        else:
            _fill(arr, np.random.normal(0.0, scale, arr.shape))


@register
class MSRAPrelu(Xavier):
    """He/Kaiming: Xavier(gaussian, factor_type, 2 / (1 + slope^2))."""

    def __init__(self, factor_type: str = "avg", slope: float = 0.25):
        super().__init__("gaussian", factor_type, 2.0 / (1 + slope ** 2))
        self._kwargs = {"factor_type": factor_type, "slope": slope}


@register
class TorchDefault(Initializer):
    """PyTorch's default for Conv2d/Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

    PyTorch writes the weight rule as kaiming_uniform_(a=sqrt(5)): gain = sqrt(2/(1+5)) = sqrt(1/3),
    bound = gain * sqrt(3/fan_in) = 1/sqrt(fan_in). The bias needs the weight's fan_in, which a bias shape
    does not carry: layers pass it as ``desc.attrs['fan_in']``.
    """

    def _init_weight(self, desc, arr):
        fan_in = desc.attrs.get("fan_in") or _fans(arr.shape)[0]
        bound = 1.0 / math.sqrt(fan_in)
        _fill(arr, np.random.uniform(-bound, bound, arr.shape))

    def _init_bias(self, desc, arr):
        fan_in = desc.attrs.get("fan_in")
        if not fan_in:
            raise DnnbindValueError(f"TorchDefault: cannot initialize `{desc}` without the layer's fan_in "
                             "(a Parameter created outside Dense/Conv2D needs attrs={'fan_in': n})")
        bound = 1.0 / math.sqrt(fan_in)
        _fill(arr, np.random.uniform(-bound, bound, arr.shape))


@register
class Orthogonal(Initializer):
    """Weight = ``scale`` times an orthonormal factor of a random (nout, prod(shape[1:])) matrix (Saxe et al.).

    The rows (nout <= nin) or columns (nout > nin) of the result are orthonormal before scaling: the SVD
    ``u, _, v = svd(a)`` of the random matrix gives ``u`` when it has the matrix's shape, else ``v`` (MXNet's
    rule). ``rand_type`` 'uniform' draws U(-1, 1), 'normal' N(0, 1).
    """

    def __init__(self, scale: float = 1.414, rand_type: str = "uniform"):
        super().__init__(scale=scale, rand_type=rand_type)
        if rand_type not in ("uniform", "normal"):
            raise DnnbindValueError(f"Orthogonal: rand_type must be 'uniform' or 'normal', got {rand_type!r}")
        self.scale, self.rand_type = scale, rand_type

    def _init_weight(self, desc, arr):
        if len(arr.shape) < 2:
            raise DnnbindValueError(f"Orthogonal: `{desc}` has shape {tuple(arr.shape)}; it needs at least 2 dimensions")
        nout, nin = arr.shape[0], int(np.prod(arr.shape[1:]))
        if self.rand_type == "uniform":
            a = np.random.uniform(-1.0, 1.0, (nout, nin))
        else:
            a = np.random.normal(0.0, 1.0, (nout, nin))
        u, _, v = np.linalg.svd(a, full_matrices=False)
        _fill(arr, self.scale * (u if u.shape == a.shape else v))


@register
class Bilinear(Initializer):
    """Bilinear-interpolation kernels for upsampling (a Conv2DTranspose weight (C, 1 or C, k, k))."""

    def _init_weight(self, desc, arr):
        if len(arr.shape) != 4:
            raise DnnbindValueError(f"Bilinear: `{desc}` has shape {tuple(arr.shape)}; it needs 4 dimensions")
        h, w = arr.shape[2], arr.shape[3]
        f = math.ceil(w / 2.0)
        c = (2 * f - 1 - f % 2) / (2.0 * f)
        x, y = np.arange(w), np.arange(h)
        kernel = np.outer(1 - np.abs(y / f - c), 1 - np.abs(x / f - c))
        _fill(arr, np.broadcast_to(kernel, arr.shape))


class Mixed(Initializer):
    """The first initializer whose regular expression matches the start of the Parameter's name (re.match).

    ``Mixed(['bias', '.*'], [Zero(), Uniform(0.1)])``; a name matching no pattern raises ValueError.
    """

    def __init__(self, patterns: list, initializers: list):
        if len(patterns) != len(initializers):
            raise DnnbindValueError(f"Mixed: {len(patterns)} patterns but {len(initializers)} initializers")
        super().__init__()
        self.map = [(re.compile(p), create(i)) for p, i in zip(patterns, initializers)]

    def __call__(self, desc, arr) -> None:
        for prog, init in self.map:
            if prog.match(str(desc)):
                init(desc, arr)
                return
        raise DnnbindValueError(f"Mixed: Parameter name {str(desc)!r} did not match any pattern; add a '.*' pattern at "
                         "the end with a default initializer")

    _init_weight = __call__

    def __repr__(self) -> str:
        return f"Mixed({[(p.pattern, i) for p, i in self.map]})"


# MXNet's lower-case aliases used as strings: weight_initializer='zeros', bias_initializer='ones'.
_REGISTRY.update({"zeros": Zero, "ones": One, "torch": TorchDefault, "torchdefault": TorchDefault})


def create(init) -> Initializer | None:
    """An Initializer from an instance, a name ('xavier', 'zeros'), a class, or None."""
    if init is None or isinstance(init, Initializer):
        return init
    if isinstance(init, type) and issubclass(init, Initializer):
        return init()
    if isinstance(init, str):
        kwargs = {}
        if init.startswith("["):  # MXNet's dumps() form, what a symbol's __init__ attribute holds: '["zero", {}]'
            try:
                init, kwargs = json.loads(init)
            except (ValueError, TypeError):
                raise DnnbindValueError(f"initializer {init!r} is not MXNet's '[\"name\", {{kwargs}}]' form") from None
        cls = _REGISTRY.get(str(init).lower())
        if cls is None:
            raise DnnbindValueError(f"unknown initializer {init!r}; known: {', '.join(sorted(_REGISTRY))}")
        return cls(**kwargs)
    if callable(init):  # a plain function f(desc, arr), as MXNet accepts
        return _FunctionInit(init)
    raise DnnbindTypeError(f"initializer must be an Initializer, a name or None, got {type(init).__name__}")


class _FunctionInit(Initializer):
    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def __call__(self, desc, arr):
        self._fn(desc, arr)

    def _init_weight(self, desc, arr):
        self._fn(desc, arr)

    def __repr__(self) -> str:
        return f"Initializer({getattr(self._fn, '__name__', 'function')})"
