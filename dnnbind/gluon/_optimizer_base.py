"""The optimizer base class and registry (``mxnet.optimizer.Optimizer``, ``register``, ``create``).

Layer: gluon; imports nd, ops, runtime. Split from gluon/optimizer.py so that the optimizers defined in
optimizer.py and _adaptive.py both import it and neither imports the other.

Hyperparameters are checked when an optimizer is made, by argument name (``HYPERPARAMETERS``), for every
subclass: ``Optimizer.__new__`` binds the arguments to the class's ``__init__`` before it runs. A NaN, inf,
negative or otherwise out-of-range value (or a non-number) is a DnnbindValueError (DnnbindTypeError) naming the
optimizer, the argument and the value. MXNet 1.9.1 checks almost none of them (checked: ``create('adam',
learning_rate=nan)`` trains to NaN weights; only SGD's fused op rejects a NaN/inf lr or wd at the first update,
"Invalid Parameter format for lrs expect tuple of <float> but value='[nan, nan]'"). The ranges are PyTorch's
checks (lr, wd, eps >= 0; betas in [0, 1)), with the other decay rates (momentum, gamma1, gamma2) in [0, 1) too.
An unknown keyword is MXNet's TypeError, "__init__() got an unexpected keyword argument 'learning_rat'".
"""

from __future__ import annotations

import difflib
import functools
import inspect
import numbers

from .._lib.errors import DnnbindTypeError, DnnbindValueError

from .. import nd
from ..runtime.array import NDArray, zeros
from .lr_scheduler import check_number

REGISTRY: dict[str, type] = {}  # lower-case class name -> Optimizer subclass (register, create)

_UNIT = {"low": 0.0, "high": 1.0, "high_open": True}  # a decay rate: [0, 1)
# Argument name -> the range check_number enforces, for any optimizer that takes it. A new optimizer's float
# hyperparameter needs an entry here (tests/test_optimizer_checkpoint_validation.py checks every registered one).
HYPERPARAMETERS: dict[str, dict] = {
    "learning_rate": {"low": 0.0, "none_ok": True},
    "wd": {"low": 0.0},
    "rescale_grad": {"low": 0.0, "low_open": True},
    "clip_gradient": {"low": 0.0, "none_ok": True},  # None: no clipping (0 too, for the fused rules)
    "clip_weights": {"low": 0.0, "none_ok": True},
    "momentum": _UNIT, "beta1": _UNIT, "beta2": _UNIT, "gamma1": _UNIT, "gamma2": _UNIT,
    "rho": {"low": 0.0, "high": 1.0},
    "epsilon": {"low": 0.0}, "eps": {"low": 0.0},
}


@functools.lru_cache(maxsize=None)
def _signature(cls) -> tuple[inspect.Signature, frozenset | None]:
    """(cls.__init__'s signature, the keywords the construction accepts). The accepted set follows ``**kwargs``
    up the class chain to Optimizer.__init__; None when a class stops the chain (then ``bind`` itself rejects an
    unknown keyword)."""
    sig, accepted = inspect.signature(cls.__init__), set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        accepted |= {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if klass is Optimizer:
            return sig, frozenset(accepted - {"self"})
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return sig, None


def _unexpected(owner: str, key: str, accepted) -> DnnbindTypeError:
    close = difflib.get_close_matches(key, sorted(accepted or ()), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return DnnbindTypeError(f"{owner}.__init__() got an unexpected keyword argument {key!r}{hint}")


def check_arguments(cls, args: tuple, kwargs: dict) -> None:
    """Reject the unknown keywords and the bad hyperparameters of ``cls(*args, **kwargs)`` (see the docstring)."""
    sig, accepted = _signature(cls)
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError:
        return  # a wrong call (missing or surplus arguments): __init__ raises Python's own TypeError
    given = {}
    for name, value in list(bound.arguments.items())[1:]:  # after self
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            given.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            given[name] = value
    owner = cls.__name__
    if accepted is not None:
        for key in given:
            if key not in accepted:
                raise _unexpected(owner, key, accepted)
    for name, value in given.items():
        rule = HYPERPARAMETERS.get(name)
        if rule is not None:
            check_number(owner, name, value, **rule)
    begin = given.get("begin_num_update", 0)
    if isinstance(begin, bool) or not isinstance(begin, numbers.Integral):
        raise DnnbindTypeError(f"{owner}: begin_num_update must be an int, got {begin!r}")
    if begin < 0:
        raise DnnbindValueError(f"{owner}: begin_num_update must be >= 0, got {begin!r}")


def register(cls):
    """Make ``cls`` creatable by its lower-case class name (``create('sgd')``), like ``mx.optimizer.register``."""
    REGISTRY[cls.__name__.lower()] = cls
    return cls


class Optimizer:
    """Base class. ``n_states`` flat state buffers per model; ``update_flat`` updates views in place."""

    n_states = 0

    def __init__(self, learning_rate: float | None = None, wd: float = 0.0, rescale_grad: float = 1.0,
                 clip_gradient: float | None = None, lr_scheduler=None, multi_precision: bool = False,
                 begin_num_update: int = 0, param_dict=None, param_idx2name=None, sym=None, **kwargs):
        owner = type(self).__name__
        if kwargs:  # (a subclass's own __init__ passed them on: __new__ saw other arguments)
            raise _unexpected(owner, sorted(kwargs)[0], _signature(Optimizer)[1])
        # Checked again here (__new__ checked the caller's): a subclass may compute what it passes on.
        for name, value in (("learning_rate", learning_rate), ("wd", wd), ("rescale_grad", rescale_grad),
                            ("clip_gradient", clip_gradient)):
            check_number(owner, name, value, **HYPERPARAMETERS[name])
        # MXNet: no lr and no scheduler -> 0.01; an explicit lr overrides the scheduler's base_lr.
        if learning_rate is None and lr_scheduler is None:
            learning_rate = 0.01
        if lr_scheduler is not None and learning_rate is not None and hasattr(lr_scheduler, "base_lr"):
            lr_scheduler.base_lr = float(learning_rate)
        if learning_rate is None:
            learning_rate = getattr(lr_scheduler, "base_lr", 0.01)
        self.lr = float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.clip_gradient = None if clip_gradient is None else float(clip_gradient)
        self.lr_scheduler = lr_scheduler
        self.multi_precision = bool(multi_precision)
        self.begin_num_update = int(begin_num_update)
        self.num_update = int(begin_num_update)
        self.param_dict = dict(param_dict or {})
        self.idx2name = dict(param_idx2name or {})
        self._index_update_count: dict = {}

    def __new__(cls, *args, **kwargs):
        check_arguments(cls, args, kwargs)  # before any __init__ converts or stores them
        return super().__new__(cls)

    @property
    def learning_rate(self) -> float:
        return self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr

    def set_learning_rate(self, lr: float) -> None:
        if self.lr_scheduler is not None:
            raise RuntimeError("LRScheduler of the optimizer has already been defined; set_learning_rate would "
                               "be overridden by it. Change the scheduler instead.")
        self.lr = check_number(f"{type(self).__name__}.set_learning_rate", "lr", lr, 0.0)

    # -- the flat interface the Trainer drives -----------------------------------------------------------
    def create_state_flat(self, size: int, dtype, device) -> tuple:
        """Zeroed flat state buffers for ``size`` elements."""
        return tuple(zeros((size,), dtype, device) for _ in range(self.n_states))

    def update_flat(self, weight: NDArray, grad: NDArray, states: tuple, lr: float, wd: float, t: int) -> None:
        """Update ``weight`` in place from ``grad`` (flat views); ``t`` is this slice's 1-based step count."""
        raise NotImplementedError(f"{type(self).__name__} defines neither update_flat nor update")

    def _clipped(self, g, zero_clips: bool = False):
        """``g`` clipped to [-clip_gradient, clip_gradient] (an nd expression), or ``g`` when unset.

        MXNet's fused ops (sgd, nag, adam, rmsprop) skip a falsy clip_gradient, so 0 means "off" there, while
        AdaGrad/AdaDelta clip whenever it is not None (``zero_clips=True``)."""
        c = self.clip_gradient
        return g if c is None or (c == 0 and not zero_clips) else nd.clip(g, -c, c)

    # -- MXNet's per-array interface (custom optimizers, mx.optimizer.get_updater-style use) ------------
    def _update_count(self, index) -> None:
        for i in index if isinstance(index, (list, tuple)) else [index]:
            self._index_update_count[i] = self._index_update_count.get(i, self.begin_num_update) + 1
            self.num_update = max(self._index_update_count[i], self.num_update)

    def _get_lr(self, index) -> float:
        p = self.param_dict.get(index)
        return self.learning_rate * (p.lr_mult if p is not None else 1.0)

    def _get_wd(self, index) -> float:
        p = self.param_dict.get(index)
        return self.wd * (p.wd_mult if p is not None else 1.0)

    def create_state(self, index, weight: NDArray):
        """MXNet's per-weight state: None, one array, or a tuple of arrays shaped like ``weight``."""
        states = tuple(zeros(weight.shape, weight.dtype, weight.context) for _ in range(self.n_states))
        return None if not states else states[0] if len(states) == 1 else states

    def create_state_multi_precision(self, index, weight: NDArray):
        return self.create_state(index, weight)

    def update(self, index, weight: NDArray, grad: NDArray, state) -> None:
        """One update of one weight in place (the built-in optimizers run their flat rule on it)."""
        self._update_count(index)
        states = () if state is None else tuple(state) if isinstance(state, (list, tuple)) else (state,)
        flat = [a.reshape((-1,)) for a in (weight, grad, *states)]
        self.update_flat(flat[0], flat[1], tuple(flat[2:]), self._get_lr(index), self._get_wd(index),
                         self._index_update_count[index])

    def update_multi_precision(self, index, weight, grad, state) -> None:
        self.update(index, weight, grad, state)

    @property
    def per_parameter(self) -> bool:
        """True for a custom optimizer written against MXNet's ``update(index, ...)``: no flat rule."""
        return type(self).update_flat is Optimizer.update_flat

    def hyperparams(self) -> dict:
        return {"learning_rate": self.lr, "wd": self.wd}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.hyperparams().items())
        return f"{type(self).__name__}({args})"


def create(name, **kwargs) -> Optimizer:
    """An Optimizer from an instance or a registered name ('sgd', 'adam', 'nag', ...) and its arguments."""
    if isinstance(name, Optimizer):
        if kwargs:
            raise DnnbindValueError("optimizer_params must be empty when an Optimizer instance is given")
        return name
    cls = REGISTRY.get(str(name).lower())
    if cls is None:
        raise DnnbindValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return cls(**kwargs)


Optimizer.register = staticmethod(register)  # MXNet spells it both ways: @mx.optimizer.Optimizer.register

