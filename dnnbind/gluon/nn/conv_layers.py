"""Convolution and pooling layers (``mxnet.gluon.nn``). Layer: gluon; imports nd, ops._check, gluon.block.

Conv2D keeps MXNet's weight layout (channels, in_channels/groups, kh, kw), NCHW only: that is cuDNN's
filter layout, so ``nd.Convolution`` hands the weight to cudnnConvolutionForward unchanged.
``in_channels=0`` defers the weight's shape to the first forward pass.
"""

from __future__ import annotations

from ... import nd
from ...ops._check import as_tuple
from ..block import Block
from .basic_layers import Activation

__all__ = ["AvgPool2D", "Conv2D", "GlobalAvgPool2D", "GlobalMaxPool2D", "MaxPool2D"]


class Conv2D(Block):
    """2-D convolution, NCHW. MXNet arguments (``strides``, ``padding``, ``dilation``, ``groups``)."""

    def __init__(self, channels: int, kernel_size, strides=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1, layout: str = "NCHW", activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        if layout != "NCHW":
            raise ValueError(f"Conv2D: only layout='NCHW' is supported (cuDNN's native layout), got {layout!r}")
        if in_channels and in_channels % groups:
            raise ValueError(f"Conv2D: in_channels {in_channels} is not divisible by groups {groups}")
        if channels % groups:
            raise ValueError(f"Conv2D: channels {channels} is not divisible by groups {groups}")
        self._channels, self._in_channels, self._groups = int(channels), int(in_channels), int(groups)
        self._kernel = as_tuple(kernel_size, 2, "Conv2D", "kernel_size", 1)
        self._strides = as_tuple(strides, 2, "Conv2D", "strides", 1)
        self._padding = as_tuple(padding, 2, "Conv2D", "padding", 0)
        self._dilation = as_tuple(dilation, 2, "Conv2D", "dilation", 1)
        with self.name_scope():
            wshape = (channels, in_channels // groups) + self._kernel
            self.weight = self.params.get("weight", shape=wshape, init=weight_initializer, allow_deferred_init=True)
            self.bias = None
            if use_bias:
                self.bias = self.params.get("bias", shape=(channels,), init=bias_initializer,
                                            allow_deferred_init=True)
                self.bias.fan_in_from = self.weight
            self.act = Activation(activation, prefix=activation + "_") if activation is not None else None

    def _alias(self) -> str:
        return "conv"

    def _infer(self, x) -> None:
        """First forward: take in_channels from the input, then finish the deferred initialization."""
        if not self.weight._shape_known():
            if x.ndim != 4:
                raise ValueError(f"{self.name}: Conv2D expects NCHW input (4-D), got shape {x.shape}")
            if x.shape[1] % self._groups:
                raise ValueError(f"{self.name}: input channels {x.shape[1]} not divisible by groups {self._groups}")
            self._in_channels = x.shape[1]
            self.weight.shape = (self._channels, x.shape[1] // self._groups) + self._kernel
        self.weight._finish_deferred_init()
        if self.bias is not None:
            self.bias._finish_deferred_init()

    def forward(self, x):
        if self.weight._data is None:
            self._infer(x)
        b = self.bias.data() if self.bias is not None else None
        # A ReLU activation is fused into the convolution (one cuDNN call on the GPU); others run after it.
        fuse = self.act is not None and self.act._act_type == "relu"
        y = nd.Convolution(x, self.weight.data(), b, kernel=self._kernel, stride=self._strides, pad=self._padding,
                           dilate=self._dilation, num_filter=self._channels, num_group=self._groups,
                           no_bias=b is None, act_type="relu" if fuse else None)
        return self.act(y) if self.act is not None and not fuse else y

    def __repr__(self) -> str:
        in_ch = self.weight.shape[1] * self._groups or None
        s = f"{type(self).__name__}({in_ch} -> {self._channels}, kernel_size={self._kernel}, stride={self._strides}"
        if self._padding != (0, 0):
            s += f", padding={self._padding}"
        if self._dilation != (1, 1):
            s += f", dilation={self._dilation}"
        if self._groups != 1:
            s += f", groups={self._groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.act is not None:
            s += f", {self.act!r}"
        return s + ")"


class _Pool2D(Block):
    _pool_type = "max"

    def __init__(self, pool_size=(2, 2), strides=None, padding=0, layout: str = "NCHW", ceil_mode: bool = False,
                 global_pool: bool = False, count_include_pad: bool = True, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        if layout != "NCHW":
            raise ValueError(f"{type(self).__name__}: only layout='NCHW' is supported, got {layout!r}")
        if ceil_mode:
            raise ValueError(f"{type(self).__name__}: ceil_mode=True is not supported (cuDNN pools with floor)")
        name = type(self).__name__
        self._size = as_tuple(pool_size, 2, name, "pool_size", 1)
        self._strides = as_tuple(strides if strides is not None else pool_size, 2, name, "strides", 1)
        self._padding = as_tuple(padding, 2, name, "padding", 0)
        self._global, self._count_include_pad = global_pool, count_include_pad

    def _alias(self) -> str:
        return "pool"

    def forward(self, x):
        return nd.Pooling(x, kernel=self._size, pool_type=self._pool_type, stride=self._strides, pad=self._padding,
                          global_pool=self._global, count_include_pad=self._count_include_pad)

    def __repr__(self) -> str:
        if self._global:
            return f"{type(self).__name__}(global_pool=True, pool_type={self._pool_type}, layout=NCHW)"
        return (f"{type(self).__name__}(size={self._size}, stride={self._strides}, padding={self._padding}, "
                f"ceil_mode=False, global_pool=False, pool_type={self._pool_type}, layout=NCHW)")


class MaxPool2D(_Pool2D):
    """Max pooling (cudnnPoolingForward, CUDNN_POOLING_MAX); ``strides`` defaults to ``pool_size``."""

    def __init__(self, pool_size=(2, 2), strides=None, padding=0, layout="NCHW", ceil_mode=False, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, **kwargs)


class AvgPool2D(_Pool2D):
    """Average pooling; padded zeros count unless ``count_include_pad=False`` (MXNet's default: they count)."""
    _pool_type = "avg"

    def __init__(self, pool_size=(2, 2), strides=None, padding=0, layout="NCHW", ceil_mode=False,
                 count_include_pad=True, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, count_include_pad=count_include_pad,
                         **kwargs)


class GlobalMaxPool2D(_Pool2D):
    """(N, C, H, W) -> (N, C, 1, 1) by max."""

    def __init__(self, layout="NCHW", **kwargs):
        super().__init__((1, 1), None, 0, layout, global_pool=True, **kwargs)


class GlobalAvgPool2D(_Pool2D):
    """(N, C, H, W) -> (N, C, 1, 1) by mean."""
    _pool_type = "avg"

    def __init__(self, layout="NCHW", **kwargs):
        super().__init__((1, 1), None, 0, layout, global_pool=True, **kwargs)
