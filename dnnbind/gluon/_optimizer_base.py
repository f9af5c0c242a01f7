"""The optimizer base class and registry (``mxnet.optimizer.Optimizer``, ``register``, ``create``).

Layer: gluon; imports nd, ops, runtime. Split from gluon/optimizer.py so that the optimizers defined in
optimizer.py and _adaptive.py both import it and neither imports the other.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

from .. import nd
from ..runtime.array import NDArray, zeros

_REGISTRY: dict[str, type] = {}


def register(cls):
    """Make ``cls`` creatable by its lower-case class name (``create('sgd')``), like ``mx.optimizer.register``."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


class Optimizer:
    """Base class. ``n_states`` flat state buffers per model; ``update_flat`` updates views in place."""

    n_states = 0

    def __init__(self, learning_rate: float | None = None, wd: float = 0.0, rescale_grad: float = 1.0,
                 clip_gradient: float | None = None, lr_scheduler=None, multi_precision: bool = False,
                 begin_num_update: int = 0, param_dict=None, param_idx2name=None, sym=None, **kwargs):
        if kwargs:
            raise DnnbindTypeError(f"{type(self).__name__}: unknown arguments {sorted(kwargs)}")
        if clip_gradient is not None and not clip_gradient >= 0:
            raise DnnbindValueError(f"{type(self).__name__}: clip_gradient must be >= 0 or None, got {clip_gradient}")
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

    @property
    def learning_rate(self) -> float:
        return self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr

    def set_learning_rate(self, lr: float) -> None:
        if self.lr_scheduler is not None:
            raise RuntimeError("LRScheduler of the optimizer has already been defined; set_learning_rate would "
                               "be overridden by it. Change the scheduler instead.")
        self.lr = float(lr)

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
    cls = _REGISTRY.get(str(name).lower())
    if cls is None:
        raise DnnbindValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return cls(**kwargs)


Optimizer.register = staticmethod(register)  # MXNet spells it both ways: @mx.optimizer.Optimizer.register

