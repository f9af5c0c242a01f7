"""Activation layers beyond ``Activation`` (``mxnet.gluon.nn``): LeakyReLU, PReLU, ELU, SELU, GELU, Swish.
Layer: gluon; imports nd, initializer, gluon.block.

Each forwards to MXNet's ``nd.LeakyReLU`` modes (an OpDef entry, ops/defs/leaky_relu.py) except Swish,
which is x * sigmoid(beta * x) as MXNet writes it. Names follow MXNet 1.x's default alias, the lowercased class
name (``leakyrelu0``, ``prelu1``).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

from ... import nd
from ...ops._check import scalar
from ..block import Block
from ._checks import size

__all__ = ["ELU", "GELU", "SELU", "LeakyReLU", "PReLU", "Swish"]


class LeakyReLU(Block):
    """x for x > 0, alpha * x otherwise; ``alpha`` >= 0."""
    _array_input = True

    def __init__(self, alpha: float, prefix=None, params=None):
        alpha = scalar("LeakyReLU", "alpha", alpha)
        if alpha < 0:
            raise DnnbindValueError(f"LeakyReLU: the slope alpha must be no less than 0, got {alpha}")
        super().__init__(prefix=prefix, params=params)
        self._alpha = float(alpha)

    def forward(self, x):
        return nd.LeakyReLU(x, act_type="leaky", slope=self._alpha)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._alpha})"


class PReLU(Block):
    """LeakyReLU with a learned slope per channel (axis 1), ``in_channels`` of them; MXNet's init: 0.25."""
    _array_input = True

    def __init__(self, alpha_initializer=None, in_channels: int = 1, prefix=None, params=None):
        in_channels = size("PReLU", "in_channels", in_channels)
        super().__init__(prefix=prefix, params=params)
        if alpha_initializer is None:
            from ... import initializer
            alpha_initializer = initializer.Constant(0.25)
        with self.name_scope():
            self.alpha = self.params.get("alpha", shape=(int(in_channels),), init=alpha_initializer)

    def forward(self, x):
        return nd.LeakyReLU(x, gamma=self.alpha.data(), act_type="prelu")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ELU(Block):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    _array_input = True

    def __init__(self, alpha: float = 1.0, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self._alpha = scalar("ELU", "alpha", alpha)

    def forward(self, x):
        return nd.LeakyReLU(x, act_type="elu", slope=self._alpha)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SELU(Block):
    """lambda * ELU(x, alpha) with Klambauer et al.'s constants."""
    _array_input = True

    def forward(self, x):
        return nd.LeakyReLU(x, act_type="selu")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GELU(Block):
    """0.5 * x * (1 + erf(x / sqrt(2))), MXNet's exact (erf) form."""
    _array_input = True

    def forward(self, x):
        return nd.LeakyReLU(x, act_type="gelu")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Swish(Block):
    """x * sigmoid(beta * x)."""
    _array_input = True

    def __init__(self, beta: float = 1.0, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self._beta = scalar("Swish", "beta", beta)

    def forward(self, x):
        return x * nd.sigmoid(x * self._beta)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
