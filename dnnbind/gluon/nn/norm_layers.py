"""Normalization layers (``mxnet.gluon.nn``): BatchNorm, LayerNorm, InstanceNorm.
Layer: gluon; imports nd, gluon.block, gluon.parameter.

BatchNorm follows MXNet 1.9's python/mxnet/gluon/nn/basic_layers.py ``_BatchNorm``: Parameters ``gamma``,
``beta``, ``running_mean``, ``running_var`` (the running ones with grad_req 'null', never trained), shape
``(in_channels,)`` deferred to the first forward when in_channels=0, and ``nd.BatchNorm`` with
``fix_gamma = not scale``. Training mode (``autograd.record()`` or ``autograd.train_mode()``) normalizes with
the batch statistics and updates the running ones in place; predict mode uses the running statistics.
``axis=3`` (or -1) on 4-D data is MXNet's channels-last (NHWC) BatchNorm: nd.BatchNorm hands it to cuDNN as an
NHWC tensor, without the transposes other axes take.

LayerNorm and InstanceNorm call ``nd.LayerNorm`` and ``nd.InstanceNorm`` (ops/defs/layer_norm.py), as MXNet's
``hybrid_forward`` calls ``F.LayerNorm``/``F.InstanceNorm``: InstanceNorm with a channel axis other than 1 swaps it
to 1 and back around the operator (MXNet's ``swapaxes``), so export writes the same nodes (gluon/_export.py).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

import numpy as np

from ... import nd
from ...ops._check import scalar
from ..block import Block
from ._checks import axis as _axis_arg
from ._checks import size

__all__ = ["BatchNorm", "InstanceNorm", "LayerNorm"]


def _norm_axis(layer: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise DnnbindValueError(f"{layer}: axis {axis} is out of range for input with {ndim} axes")
    return axis % ndim


class BatchNorm(Block):
    """Batch normalization (Ioffe and Szegedy, 2014) over ``axis`` with MXNet's constructor and defaults."""
    _array_input = True

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, use_global_stats: bool = False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels: int = 0, prefix=None, params=None):
        momentum, epsilon = scalar("BatchNorm", "momentum", momentum), scalar("BatchNorm", "epsilon", epsilon)
        in_channels = size("BatchNorm", "in_channels", in_channels, 0)
        super().__init__(prefix=prefix, params=params)
        if not 0 <= momentum <= 1:
            raise DnnbindValueError(f"BatchNorm: momentum must be in [0, 1], got {momentum}")
        if not epsilon >= 0:
            raise DnnbindValueError(f"BatchNorm: epsilon must be >= 0, got {epsilon}")
        self._axis = _axis_arg("BatchNorm", axis)
        # nd.BatchNorm's arguments, in MXNet's order (also what __repr__ prints)
        self._kwargs = {"axis": self._axis, "eps": float(epsilon), "momentum": float(momentum),
                        "fix_gamma": not scale, "use_global_stats": bool(use_global_stats)}
        self.in_channels = int(in_channels)
        shape = (int(in_channels),)
        with self.name_scope():
            self.gamma = self.params.get("gamma", grad_req="write" if scale else "null", shape=shape,
                                         init=gamma_initializer, allow_deferred_init=True, differentiable=scale)
            self.beta = self.params.get("beta", grad_req="write" if center else "null", shape=shape,
                                        init=beta_initializer, allow_deferred_init=True, differentiable=center)
            self.running_mean = self.params.get("running_mean", grad_req="null", shape=shape,
                                                init=running_mean_initializer, allow_deferred_init=True,
                                                differentiable=False)
            self.running_var = self.params.get("running_var", grad_req="null", shape=shape,
                                               init=running_variance_initializer, allow_deferred_init=True,
                                               differentiable=False)

    def _params4(self) -> tuple:
        return self.gamma, self.beta, self.running_mean, self.running_var

    def _infer(self, x) -> None:
        """First forward: the channel count from the input, then finish the deferred initialization."""
        if not self.gamma._shape_known():
            if x.ndim < 2:
                raise DnnbindValueError(f"{self.name}: BatchNorm expects input with at least 2 axes, got shape {x.shape}")
            c = x.shape[_norm_axis(self.name, self._axis, x.ndim)]
            if not c:
                raise DnnbindValueError(f"{self.name}: BatchNorm cannot infer in_channels from an input of shape "
                                        f"{x.shape}: axis {self._axis} has size 0")
            for p in self._params4():
                p.shape = (c,)
            self.in_channels = c
        for p in self._params4():
            p._finish_deferred_init()

    def cast(self, dtype) -> None:
        # MXNet keeps BatchNorm's parameters in float32 when the network is cast to float16.
        super().cast("float32" if np.dtype(dtype) == np.float16 else dtype)

    def forward(self, x):
        if any(p._data is None for p in self._params4()):
            self._infer(x)
        return nd.BatchNorm(x, self.gamma.data(), self.beta.data(), self.running_mean.data(),
                            self.running_var.data(), **self._kwargs)

    def __repr__(self) -> str:
        content = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        c = self.gamma.shape[0] if self.gamma.shape else 0
        return f"{type(self).__name__}({content}, in_channels={c or None})"


class _AxisNorm(Block):
    """Shared by LayerNorm and InstanceNorm: gamma and beta of shape (in_channels,) along ``axis``, deferred to the
    first forward when in_channels=0; ``_op`` calls the operator."""
    _array_input = True

    def __init__(self, axis, epsilon, center, scale, beta_initializer, gamma_initializer, in_channels, prefix,
                 params):
        epsilon = scalar(type(self).__name__, "epsilon", epsilon)
        in_channels = size(type(self).__name__, "in_channels", in_channels, 0)
        super().__init__(prefix=prefix, params=params)
        if not epsilon >= 0:
            raise DnnbindValueError(f"{type(self).__name__}: epsilon must be >= 0, got {epsilon}")
        self._axis, self._eps = _axis_arg(type(self).__name__, axis), epsilon
        self._center, self._scale = center, scale
        shape = (int(in_channels),)
        with self.name_scope():
            self.gamma = self.params.get("gamma", grad_req="write" if scale else "null", shape=shape,
                                         init=gamma_initializer, allow_deferred_init=True, differentiable=scale)
            self.beta = self.params.get("beta", grad_req="write" if center else "null", shape=shape,
                                        init=beta_initializer, allow_deferred_init=True, differentiable=center)

    def _op(self, x, axis: int):
        raise NotImplementedError

    def forward(self, x):
        axis = _norm_axis(type(self).__name__, self._axis, x.ndim)
        if 0 in x.shape:  # (MXNet refuses empty input too)
            raise DnnbindValueError(f"{self.name}: {type(self).__name__} got an empty input, shape {x.shape}")
        if self.gamma._data is None or self.beta._data is None:
            if not self.gamma._shape_known():
                if not x.shape[axis]:
                    raise DnnbindValueError(f"{self.name}: {type(self).__name__} cannot infer in_channels from an "
                                            f"input of shape {x.shape}: axis {self._axis} has size 0")
                self.gamma.shape = self.beta.shape = (x.shape[axis],)
            self.gamma._finish_deferred_init()
            self.beta._finish_deferred_init()
        # Like MXNet, gamma and beta always apply; scale/center=False only stop training them (grad_req 'null').
        return self._op(x, axis)

    def __repr__(self) -> str:
        c = self.gamma.shape[0] if self.gamma.shape else 0
        return (f"{type(self).__name__}(axis={self._axis}, eps={self._eps!r}, center={self._center}, "
                f"scale={self._scale}, in_channels={c or None})")


class LayerNorm(_AxisNorm):
    """Layer normalization over ``axis`` (default the last) per sample: MXNet's nn.LayerNorm."""

    def __init__(self, axis: int = -1, epsilon: float = 1e-5, center: bool = True, scale: bool = True,
                 beta_initializer="zeros", gamma_initializer="ones", in_channels: int = 0, prefix=None, params=None):
        super().__init__(axis, epsilon, center, scale, beta_initializer, gamma_initializer, in_channels, prefix,
                         params)

    def _op(self, x, axis: int):
        return nd.LayerNorm(x, self.gamma.data(), self.beta.data(), axis=self._axis, eps=self._eps)


class InstanceNorm(_AxisNorm):
    """Instance normalization: per sample and channel (``axis``), over the remaining axes except the batch
    axis 0: MXNet's nn.InstanceNorm (scale=False by default, as there). A channel axis other than 1 is swapped to
    1 and back around nd.InstanceNorm, as MXNet does (so axis 0 takes gamma along the batch axis, as there)."""

    def __init__(self, axis: int = 1, epsilon: float = 1e-5, center: bool = True, scale: bool = False,
                 beta_initializer="zeros", gamma_initializer="ones", in_channels: int = 0, prefix=None, params=None):
        super().__init__(axis, epsilon, center, scale, beta_initializer, gamma_initializer, in_channels, prefix,
                         params)

    def _op(self, x, axis: int):
        if x.ndim < 3:
            raise DnnbindValueError(f"{type(self).__name__}: needs input (N, C, ...) with at least 3 axes, got shape "
                                    f"{x.shape}")
        gamma, beta = self.gamma.data(), self.beta.data()
        if axis == 1:
            return nd.InstanceNorm(x, gamma, beta, eps=self._eps)
        y = nd.InstanceNorm(nd.swapaxes(x, 1, axis), gamma, beta, eps=self._eps)
        return nd.swapaxes(y, 1, axis)
