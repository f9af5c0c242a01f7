"""Fused layers of NVIDIA's MXNet builds (``mxnet.gluon.nn`` there): BatchNormAddRelu.
Layer: gluon; imports nd and gluon.nn.norm_layers.

``BatchNormAddRelu`` is ``nn.BatchNorm`` followed by ``relu(bn + addend)``, called as ``layer(x, addend)``: the
constructor, the defaults and the Parameters (``gamma``, ``beta``, ``running_mean``, ``running_var``, shape
``(in_channels,)``, deferred to the first forward) are nn.BatchNorm's, inherited, so weights saved from one load
into the other; ``cast('float16')`` keeps them float32, as for BatchNorm. It runs ``nd.BatchNormAddRelu``: one fused
cuDNN call in training with ``axis=3`` (channels last) on float16 GPU data, the separate ops otherwise.
"""

from __future__ import annotations

from ... import nd
from .norm_layers import BatchNorm

__all__ = ["BatchNormAddRelu"]


class BatchNormAddRelu(BatchNorm):
    """relu(BatchNorm(x) + addend) over ``axis``, with nn.BatchNorm's constructor, defaults and Parameters."""

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, use_global_stats: bool = False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels: int = 0, prefix=None, params=None):
        super().__init__(axis=axis, momentum=momentum, epsilon=epsilon, center=center, scale=scale,
                         use_global_stats=use_global_stats, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer, running_mean_initializer=running_mean_initializer,
                         running_variance_initializer=running_variance_initializer, in_channels=in_channels,
                         prefix=prefix, params=params)

    def _alias(self) -> str:
        return "batchnormaddrelu"

    def forward(self, x, addend):
        if any(p._data is None for p in self._params4()):
            self._infer(x)
        return nd.BatchNormAddRelu(x, addend, self.gamma.data(), self.beta.data(), self.running_mean.data(),
                                   self.running_var.data(), **self._kwargs)
