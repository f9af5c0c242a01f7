"""NAG, AdaGrad, RMSProp (plain and centered) and AdaDelta with MXNet 1.9's update rules. Layer: gluon; imports
nd and gluon.optimizer.

Each rule is a few nd element-wise ops over the Trainer's flat views, written in place with ``x[:] = expr``
(on the GPU every expression is a generated kernel over the whole model), never a per-Parameter loop. The
rules follow MXNet's code, which in places differs from its docstrings (references are to v1.9.x):

* NAG (NAGMomKernel, src/operator/optimizer_op-inl.h): ``g = clip(r*grad) + wd*weight`` (wd outside the
  clip), ``weight += momentum^2 mom - (1 + momentum) lr g; mom = momentum*mom - lr*g'``; momentum 0 is plain
  sgd_update. The kernel runs with ``out=weight`` and reads the weight again after writing it, so the wd term
  of the new momentum ``g'`` uses the *updated* weight; checked against MXNet 1.9.1 and kept, since it is what
  MXNet programs trained with (without wd the two readings agree).
* AdaGrad (optimizer.py, dense branch): ``g = clip(r*grad); history += g^2;
  weight -= lr*(g / sqrt(history + eps) + wd*weight)``; ``eps`` defaults to 1e-7.
* RMSProp (RMSPropUpdateKernel / RMSPropAlexUpdateKernel): ``g = clip(r*grad + wd*weight)``,
  ``n = (1-gamma1) g^2 + gamma1 n``; plain: ``weight -= lr g / sqrt(n + eps)``; centered (Graves):
  ``gm = (1-gamma1) g + gamma1 gm; delta = gamma2 delta - lr g / sqrt(n - gm^2 + eps); weight += delta``;
  then ``clip_weights`` clips the new weight. Defaults lr 0.001, gamma1 0.9, gamma2 0.9, eps 1e-8.
* AdaDelta (optimizer.py): ``g = clip(r*grad)``; ``acc_g = rho acc_g + (1-rho) g^2;
  delta = sqrt(acc_delta + eps) / sqrt(acc_g + eps) * g; acc_delta = rho acc_delta + (1-rho) delta^2;
  weight -= delta + wd*weight``. No learning rate is used (as in MXNet). MXNet also scales the gradient
  buffer in place by rescale_grad; here the gradient is left as backward wrote it.

MXNet 1.9 has no AdamW optimizer class (only the ``_adamw_update`` operator used by GluonNLP), so there is
none here either.
"""

from __future__ import annotations

from .. import nd
from ._optimizer_base import Optimizer, register

__all__ = ["NAG", "AdaDelta", "AdaGrad", "RMSProp"]


@register
class NAG(Optimizer):
    """Nesterov accelerated gradient with MXNet's momentum form."""

    def __init__(self, learning_rate: float | None = None, momentum: float = 0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = float(momentum)
        self.n_states = 1 if self.momentum != 0.0 else 0

    def update_flat(self, weight, grad, states, lr, wd, t):
        if self.momentum == 0.0:
            weight[:] = weight * (1.0 - lr * wd) - self._clipped(grad * self.rescale_grad) * lr
            return
        mu, mom = self.momentum, states[0]
        c = self._clipped(grad * self.rescale_grad) * lr
        decayed = mom * mu
        weight[:] = weight + decayed * mu - (c + weight * (lr * wd)) * (1.0 + mu)
        mom[:] = decayed - c - weight * (lr * wd)  # the NEW weight: see the module docstring

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "momentum": self.momentum}


@register
class AdaGrad(Optimizer):
    """AdaGrad (Duchi et al.): per-element lr scaled by the root of the summed squared gradients."""

    n_states = 1

    def __init__(self, learning_rate: float | None = None, eps: float = 1e-7, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.float_stable_eps = float(eps)

    def update_flat(self, weight, grad, states, lr, wd, t):
        g = self._clipped(grad * self.rescale_grad, zero_clips=True)
        history = states[0]
        history[:] = history + g * g
        weight[:] = weight - (g / nd.sqrt(history + self.float_stable_eps) + weight * wd) * lr

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "eps": self.float_stable_eps}


@register
class RMSProp(Optimizer):
    """RMSProp: Tieleman & Hinton's (``centered=False``) or Graves's centered form."""

    def __init__(self, learning_rate: float = 0.001, gamma1: float = 0.9, gamma2: float = 0.9,
                 epsilon: float = 1e-8, centered: bool = False, clip_weights: float | None = None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1, self.gamma2, self.epsilon = float(gamma1), float(gamma2), float(epsilon)
        self.centered = bool(centered)
        self.clip_weights = clip_weights
        self.n_states = 3 if self.centered else 1

    def update_flat(self, weight, grad, states, lr, wd, t):
        g1 = self.gamma1
        g = self._clipped(grad * self.rescale_grad + weight * wd)
        n = states[0]
        n[:] = g * g * (1.0 - g1) + n * g1
        if self.centered:
            _, gm, delta = states
            gm[:] = g * (1.0 - g1) + gm * g1
            delta[:] = delta * self.gamma2 - g * lr / nd.sqrt(n - gm * gm + self.epsilon)
            new = weight + delta
        else:
            new = weight - g * lr / nd.sqrt(n + self.epsilon)
        if self.clip_weights:
            new = nd.clip(new, -self.clip_weights, self.clip_weights)
        weight[:] = new

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "gamma1": self.gamma1, "gamma2": self.gamma2, "epsilon": self.epsilon,
                "centered": self.centered}


@register
class AdaDelta(Optimizer):
    """AdaDelta (Zeiler): no learning rate; step sizes from running averages of g^2 and delta^2."""

    n_states = 2

    def __init__(self, rho: float = 0.90, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def update_flat(self, weight, grad, states, lr, wd, t):
        rho, eps = self.rho, self.epsilon
        g = self._clipped(grad * self.rescale_grad, zero_clips=True)
        acc_g, acc_delta = states
        acc_g[:] = acc_g * rho + g * g * (1.0 - rho)
        delta = nd.sqrt(acc_delta + eps) / nd.sqrt(acc_g + eps) * g
        acc_delta[:] = acc_delta * rho + delta * delta * (1.0 - rho)
        weight[:] = weight - delta - weight * wd

    def hyperparams(self) -> dict:
        return {**super().hyperparams(), "rho": self.rho, "epsilon": self.epsilon}
