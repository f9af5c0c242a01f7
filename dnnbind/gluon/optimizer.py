"""Optimizers (``mxnet.optimizer``): SGD with momentum and weight decay, Adam. Layer: gluon; imports ops, runtime.

An optimizer updates *flat* views: the Trainer packs all Parameters of one (lr_mult, wd_mult) group into
one contiguous data buffer and one gradient buffer, so an update is a handful of cuBLAS calls (axpy/scal) or
one fused kernel (Adam) over the whole model rather than one call per tensor. State buffers (momentum, Adam
moments) are flat too and laid out like the data.

Update rules are MXNet's, with ``g = rescale_grad * grad + wd * weight``:

* SGD: ``mom = momentum * mom - lr * g; weight += mom`` (no momentum: ``weight -= lr * g``). With a
  constant lr this is PyTorch's ``buf = momentum * buf + g; weight -= lr * buf`` with ``mom = -lr * buf``.
* Adam: ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; weight -= lr_t m / (sqrt(v) + eps)`` with the bias
  correction folded into ``lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)``.
"""

from __future__ import annotations

import math

from .. import ops
from ..runtime.array import NDArray, zeros

__all__ = ["SGD", "Adam", "Optimizer", "create", "register"]

_REGISTRY: dict[str, type] = {}


def register(cls):
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


class Optimizer:
    """Base class. ``n_states`` flat state buffers per model; ``update_flat`` updates views in place."""

    n_states = 0

    def __init__(self, learning_rate: float = 0.01, wd: float = 0.0, rescale_grad: float = 1.0,
                 clip_gradient=None, lr_scheduler=None, multi_precision: bool = False, begin_num_update: int = 0,
                 param_dict=None, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unknown arguments {sorted(kwargs)}")
        if clip_gradient is not None and clip_gradient > 0:
            raise ValueError(f"{type(self).__name__}: clip_gradient is not supported (it needs a clip kernel over "
                             "the flat gradient); leave it None")
        if multi_precision:
            raise ValueError(f"{type(self).__name__}: multi_precision is not supported; use float32 Parameters")
        self.lr = float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.lr_scheduler = lr_scheduler
        self.num_update = int(begin_num_update)
        if lr_scheduler is not None and hasattr(lr_scheduler, "base_lr"):
            lr_scheduler.base_lr = self.lr

    @property
    def learning_rate(self) -> float:
        return self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr

    def set_learning_rate(self, lr: float) -> None:
        if self.lr_scheduler is not None:
            raise RuntimeError("LRScheduler of the optimizer has already been defined; set_learning_rate would "
                               "be overridden by it. Change the scheduler instead.")
        self.lr = float(lr)

    def create_state_flat(self, size: int, dtype, device) -> tuple:
        """Zeroed flat state buffers for ``size`` elements."""
        return tuple(zeros((size,), dtype, device) for _ in range(self.n_states))

    def update_flat(self, weight: NDArray, grad: NDArray, states: tuple, lr: float, wd: float, t: int) -> None:
        """Update ``weight`` in place from ``grad`` (flat views); ``t`` is this slice's 1-based step count."""
        raise NotImplementedError

    def hyperparams(self) -> dict:
        return {"learning_rate": self.lr, "wd": self.wd}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.hyperparams().items())
        return f"{type(self).__name__}({args})"


@register
class SGD(Optimizer):
    """SGD with optional momentum and weight decay (MXNet's form; see the module docstring)."""

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, lazy_update: bool = False, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = float(momentum)
        self.n_states = 1 if self.momentum != 0.0 else 0

    def update_flat(self, weight, grad, states, lr, wd, t):
        r = self.rescale_grad
        if self.momentum == 0.0:
            # weight = (1 - lr*wd) weight - lr*r grad: MXNet's sgd_update, two cuBLAS calls.
            if wd:
                ops.scal(1.0 - lr * wd, weight)
            ops.axpy(-lr * r, grad, weight)
            return
        mom = states[0]
        ops.scal(self.momentum, mom)
        ops.axpy(-lr * r, grad, mom)
        if wd:
            ops.axpy(-lr * wd, weight, mom)
        ops.axpy(1.0, mom, weight)

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "momentum": self.momentum}


@register
class Adam(Optimizer):
    """Adam (Kingma & Ba) with MXNet's placement of eps and weight decay (wd added to the gradient)."""

    n_states = 2

    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, lazy_update: bool = True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def update_flat(self, weight, grad, states, lr, wd, t):
        lr_t = lr * math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        m, v = states
        ops.adam_update(weight, grad, m, v, lr_t, self.beta1, self.beta2, self.epsilon, self.rescale_grad, wd)

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


def create(name, **kwargs) -> Optimizer:
    """An Optimizer from an instance or a registered name ('sgd', 'adam') and its arguments."""
    if isinstance(name, Optimizer):
        if kwargs:
            raise ValueError("optimizer_params must be empty when an Optimizer instance is given")
        return name
    cls = _REGISTRY.get(str(name).lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return cls(**kwargs)
