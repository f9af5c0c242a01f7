"""Optimizers (``mxnet.optimizer``): SGD and Adam here; NAG, AdaGrad, RMSProp and AdaDelta in gluon/_adaptive.py;
the base class, ``register`` and ``create`` in gluon/_optimizer_base.py. Layer: gluon; imports nd, ops, runtime.

An optimizer updates *flat* views: the Trainer packs all Parameters of one (lr_mult, wd_mult) group into
one contiguous data buffer and one gradient buffer, so an update is one fused kernel (SGD, Adam; float64 SGD:
cuBLAS axpy/scal) or a few nd element-wise ops over the whole model rather than one call per tensor.
State buffers (momentum, moments, histories) are flat too and laid out like the data.

Update rules are MXNet 1.9's (python/mxnet/optimizer/optimizer.py and src/operator/optimizer_op-inl.h), with
``r = rescale_grad`` and ``clip(x) = min(max(x, -c), c)`` when ``clip_gradient = c`` is set:

* SGD (SGDKernel/SGDMomKernel): ``mom = momentum*mom - lr*wd*weight - lr*clip(r*grad); weight += mom``
  (no momentum: ``weight = (1 - lr*wd)*weight - lr*clip(r*grad)``). wd is NOT clipped. With a constant lr
  this is PyTorch's ``buf = momentum*buf + g; weight -= lr*buf`` with ``mom = -lr*buf``.
* Adam (AdamUpdateKernel): ``g = clip(r*grad + wd*weight)`` (wd inside the clip), ``m = b1 m + (1-b1) g;
  v = b2 v + (1-b2) g^2; weight -= lr_t m / (sqrt(v) + eps)``, ``lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)``.

``multi_precision`` is accepted: it keeps float32 master weights for float16 Parameters, which is a no-op for
the float32 Parameters the Trainer packs (mixed precision is a later issue).

Custom optimizers subclass :class:`Optimizer` and define MXNet's ``create_state(index, weight)`` and
``update(index, weight, grad, state)`` (using ``_update_count``, ``_get_lr``, ``_get_wd``); the Trainer then
runs them one Parameter at a time (a host loop, as MXNet does for every optimizer).
"""

from __future__ import annotations

import math

import numpy as np

from .. import nd, ops
from ._optimizer_base import Optimizer, create, register  # noqa: F401  (mx.optimizer.*)

__all__ = ["SGD", "Adam", "Optimizer", "create", "register"]

@register
class SGD(Optimizer):
    """SGD with optional momentum and weight decay (MXNet's form; see the module docstring)."""

    def __init__(self, learning_rate: float | None = None, momentum: float = 0.0, lazy_update: bool = True,
                 **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = float(momentum)
        self.lazy_update = lazy_update
        self.n_states = 1 if self.momentum != 0.0 else 0

    def update_flat(self, weight, grad, states, lr, wd, t):
        r = self.rescale_grad
        if self.clip_gradient:
            # Clipping needs an element-wise min/max: nd ops over the flat views (the cuBLAS path cannot).
            step = self._clipped(grad * r) * lr
            if self.momentum == 0.0:
                weight[:] = weight * (1.0 - lr * wd) - step
            else:
                mom = states[0]
                mom[:] = mom * self.momentum - weight * (lr * wd) - step
                weight[:] = weight + mom
            return
        if weight.dtype == np.float32:  # MXNet's sgd_update / sgd_mom_update: one pass over the flat buffers
            ops.sgd_update(weight, grad, states[0] if self.momentum != 0.0 else None, lr, self.momentum, wd, r)
            return
        if self.momentum == 0.0:  # float64: cuBLAS, two calls
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

    def update_flat_mixed(self, weight, grad16, states, lr, wd, t, weight16) -> None:
        """update_flat for float16 Parameters: float32 master ``weight`` and state, their float16 gradients read
        and float16 weights written in the same pass (the Trainer's mixed precision; no clip_gradient)."""
        ops.sgd_update(weight, grad16, states[0] if self.momentum != 0.0 else None, lr, self.momentum, wd,
                       self.rescale_grad, w16=weight16)

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
        if not self.clip_gradient:
            ops.adam_update(weight, grad, m, v, lr_t, self.beta1, self.beta2, self.epsilon, self.rescale_grad, wd)
            return
        g = self._clipped(grad * self.rescale_grad + weight * wd)
        m[:] = m * self.beta1 + g * (1.0 - self.beta1)
        v[:] = v * self.beta2 + g * g * (1.0 - self.beta2)
        weight[:] = weight - m * lr_t / (nd.sqrt(v) + self.epsilon)

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


from ._adaptive import NAG, AdaDelta, AdaGrad, RMSProp  # noqa: E402  (they register themselves on import)

__all__ += ["NAG", "AdaDelta", "AdaGrad", "RMSProp"]

from ._updater import Updater, get_updater  # noqa: E402  (mx.optimizer.Updater / get_updater)

__all__ += ["Updater", "get_updater"]
