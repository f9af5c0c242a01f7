"""Convolution and pooling layers (``mxnet.gluon.nn``). Layer: gluon; imports nd, ops._check, gluon.block.

Conv2D keeps MXNet's weight layout (channels, in_channels/groups, kh, kw) for NCHW, and (channels, kh, kw,
in_channels/groups) for ``layout='NHWC'`` (channels last, MXNet's "OHWI": the data layout applied to the weight).
Both are cuDNN filter layouts, so ``nd.Convolution`` hands the weight to cuDNN unchanged. The 2-D pooling layers
take ``layout='NHWC'`` too (data (N, H, W, C)), the 3-D ones ``layout='NDHWC'`` (MXNet 1.9.1's CPU pools it; its
convolution kernels refuse it, so Conv3D is NCDHW only); the other layers keep their channels-first layout only.
``in_channels=0`` defers the weight's shape to the first forward pass. The 1-D layers (Conv1D, MaxPool1D,
AvgPool1D, GlobalMax/AvgPool1D; layout NCW) run the 2-D path on a view with H = 1 and keep MXNet's 1-D weight
shape (channels, in_channels/groups, k), so their parameter files match MXNet's. ``ceil_mode=True`` is
``nd.Pooling(pooling_convention='full')``. Conv1DTranspose/Conv2DTranspose (``nd.Deconvolution``) keep MXNet's
weight (in_channels, channels/groups, *kernel) and share Conv's name counter (``conv0_``), as in MXNet. The 3-D
layers (Conv3D, Conv3DTranspose, MaxPool3D, AvgPool3D, GlobalMax/AvgPool3D; NCDHW) run cuDNN's N-d convolution and
pooling.
"""

from __future__ import annotations

import numbers

from ..._lib.errors import DnnbindValueError

from ... import nd
from ...ops._check import as_tuple
from ..block import Block
from ._checks import size
from .basic_layers import Activation

__all__ = ["AvgPool1D", "AvgPool2D", "AvgPool3D", "Conv1D", "Conv1DTranspose", "Conv2D", "Conv2DTranspose", "Conv3D",
           "Conv3DTranspose",
           "GlobalAvgPool1D", "GlobalAvgPool2D", "GlobalAvgPool3D", "GlobalMaxPool1D", "GlobalMaxPool2D",
           "GlobalMaxPool3D", "MaxPool1D", "MaxPool2D", "MaxPool3D"]

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
_CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}


def _check_layout(name: str, dims: int, layout, channels_last: bool = False) -> str:
    """The layer's layout: channels first, or (``channels_last``) MXNet's channels-last one. A channels-last
    layout this layer lacks is NotImplementedError; anything else ValueError/TypeError."""
    allowed = (_LAYOUTS[dims], _CHANNELS_LAST[dims]) if channels_last else (_LAYOUTS[dims],)
    if isinstance(layout, str) and layout in allowed:
        return layout
    if layout == _CHANNELS_LAST[dims]:
        raise NotImplementedError(f"{name}: only layout={_LAYOUTS[dims]!r} is supported (cuDNN's native layout), "
                                  f"got {layout!r}")
    kind = ValueError if isinstance(layout, str) else TypeError
    raise kind(f"{name}: layout must be {' or '.join(map(repr, allowed))}, got {layout!r}")


class _Conv(Block):
    """Convolution over ``_dims`` spatial axes (1, 2 or 3), channels first (or last, where ``_nhwc`` allows it)."""
    _dims = 2
    _nhwc = False  # whether layout='NHWC' is offered (Conv2D)
    _array_input = True

    _strides = property(lambda self: tuple(self._kwargs["stride"]))
    _padding = property(lambda self: tuple(self._kwargs["pad"]))
    _dilation = property(lambda self: tuple(self._kwargs["dilate"]))

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, dilation=1, groups: int = 1,
                 layout: str | None = None, activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        name, dims = type(self).__name__, self._dims
        self._layout = _check_layout(name, dims, layout if layout is not None else _LAYOUTS[dims], self._nhwc)
        channels, groups = size(name, "channels", channels), size(name, "groups", groups)
        in_channels = size(name, "in_channels", in_channels, 0)
        if in_channels and in_channels % groups:
            raise DnnbindValueError(f"{name}: in_channels {in_channels} is not divisible by groups {groups}")
        if channels % groups:
            raise DnnbindValueError(f"{name}: channels {channels} is not divisible by groups {groups}")
        super().__init__(prefix=prefix, params=params)
        self._channels, self._in_channels, self._groups = int(channels), int(in_channels), int(groups)
        self._kernel = as_tuple(kernel_size, dims, name, "kernel_size", 1)
        # MXNet's _kwargs: the operator's arguments, which the layer reads at every call (GluonCV's SSD-300 ResNet
        # edits conv._kwargs['stride'] after building); _strides/_padding/_dilation are views of it
        self._kwargs = {"kernel": self._kernel, "stride": as_tuple(strides, dims, name, "strides", 1),
                        "dilate": as_tuple(dilation, dims, name, "dilation", 1),
                        "pad": as_tuple(padding, dims, name, "padding", 0), "num_filter": int(channels),
                        "num_group": int(groups), "no_bias": not use_bias, "layout": self._layout}
        for arg, t in (("kernel_size", self._kernel), ("strides", self._strides), ("padding", self._padding),
                       ("dilation", self._dilation)):
            size(name, arg, max(t), 0)  # at most int32's range, which cuDNN takes
        with self.name_scope():
            wshape = self._weight_shape(in_channels)
            self.weight = self.params.get("weight", shape=wshape, init=weight_initializer, allow_deferred_init=True)
            self.bias = None
            if use_bias:
                self.bias = self.params.get("bias", shape=(channels,), init=bias_initializer,
                                            allow_deferred_init=True)
                self.bias.fan_in_from = self.weight
            self.act = Activation(activation, prefix=f"{activation}_") if activation is not None else None

    def _alias(self) -> str:
        return "conv"

    def _weight_shape(self, in_channels: int) -> tuple:
        """MXNet's weight layout for ``in_channels`` (0: not yet known): OIHW, or OHWI for NHWC."""
        if self._layout == "NHWC":
            return (self._channels,) + self._kernel + (in_channels // self._groups,)
        return (self._channels, in_channels // self._groups) + self._kernel

    def _infer(self, x) -> None:
        """First forward: take in_channels from the input, then finish the deferred initialization."""
        if not self.weight._shape_known():
            if x.ndim != self._dims + 2:
                raise DnnbindValueError(f"{self.name}: {type(self).__name__} expects {self._layout} input "
                                 f"({self._dims + 2}-D), got shape {x.shape}")
            c = x.shape[-1 if self._layout == "NHWC" else 1]
            if not c:
                raise DnnbindValueError(f"{self.name}: {type(self).__name__} cannot infer in_channels from an input "
                                        f"of shape {x.shape}: it has 0 channels")
            if c % self._groups:
                raise DnnbindValueError(f"{self.name}: input channels {c} not divisible by groups {self._groups}")
            self._in_channels = c
            self.weight.shape = self._weight_shape(c)
        self.weight._finish_deferred_init()
        if self.bias is not None:
            self.bias._finish_deferred_init()

    def _weight_and_bias(self, x):
        """Finish deferred init from x's shape, check its rank; (weight, bias or None) for the forward."""
        if self.weight._data is None:
            self._infer(x)
        if x.ndim != self._dims + 2:
            raise DnnbindValueError(f"{self.name}: {type(self).__name__} expects {self._layout} input "
                             f"({self._dims + 2}-D), got shape {x.shape}")
        b = self.bias.data() if self.bias is not None else None
        return self.weight.data(), b

    def forward(self, x):
        w, b = self._weight_and_bias(x)
        kernel, strides, padding, dilation = self._kernel, self._strides, self._padding, self._dilation
        if self._dims == 1:  # (N, C, W) as (N, C, 1, W); the weight viewed as (O, I, 1, k)
            n, c, width = x.shape
            x, w = x.reshape((n, c, 1, width)), w.reshape(w.shape[:2] + (1,) + w.shape[2:])
            kernel, strides, padding, dilation = (1,) + kernel, (1,) + strides, (0,) + padding, (1,) + dilation
        # A ReLU activation is fused into the convolution (one cuDNN call on the GPU); others run after it.
        fuse = self.act is not None and self.act._act_type == "relu"
        y = nd.Convolution(x, w, b, kernel=kernel, stride=strides, pad=padding, dilate=dilation,
                           num_filter=self._channels, num_group=self._groups, no_bias=b is None,
                           act_type="relu" if fuse else None, layout=None if self._dims == 1 else self._layout)
        if self._dims == 1:
            y = y.reshape((y.shape[0], y.shape[1], y.shape[3]))
        return self.act(y) if self.act is not None and not fuse else y

    def _mapping(self) -> str:
        in_axis = -1 if self._layout == "NHWC" else 1
        return f"{self.weight.shape[in_axis] * self._groups or None} -> {self._channels}"

    def __repr__(self) -> str:
        s = f"{type(self).__name__}({self._mapping()}, kernel_size={self._kernel}, stride={self._strides}"
        if any(self._padding):
            s += f", padding={self._padding}"
        if any(d != 1 for d in self._dilation):
            s += f", dilation={self._dilation}"
        if self._groups != 1:
            s += f", groups={self._groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.act is not None:
            s += f", {self.act!r}"
        return s + ")"


# The base class keeps MXNet's name (code written for MXNet subclasses mxnet.gluon.nn.conv_layers._Conv or checks
# isinstance against it); dnnbind's own modules use the public one.
ConvBase = _Conv


class Conv2D(ConvBase):
    """2-D convolution, NCHW or NHWC (weight (channels, kh, kw, in_channels/groups) then). MXNet arguments
    (``strides``, ``padding``, ``dilation``, ``groups``, ``layout``)."""
    _nhwc = True

    def __init__(self, channels: int, kernel_size, strides=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1, layout: str = "NCHW", activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout, activation, use_bias,
                         weight_initializer, bias_initializer, in_channels, prefix, params)


class Conv1D(ConvBase):
    """1-D convolution, NCW, through the 2-D path (H = 1); weight (channels, in_channels/groups, k)."""
    _dims = 1

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, dilation=1, groups: int = 1,
                 layout: str = "NCW", activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout, activation, use_bias,
                         weight_initializer, bias_initializer, in_channels, prefix, params)


class Conv3D(ConvBase):
    """3-D convolution, NCDHW (cuDNN's N-d convolution); weight (channels, in_channels/groups, kd, kh, kw)."""
    _dims = 3

    def __init__(self, channels: int, kernel_size, strides=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1),
                 groups: int = 1, layout: str = "NCDHW", activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout, activation, use_bias,
                         weight_initializer, bias_initializer, in_channels, prefix, params)


class _ConvTranspose(ConvBase):
    """Transposed convolution (``nd.Deconvolution``: cudnnConvolutionBackwardData on a GPU) over ``_dims`` axes.
    MXNet's weight layout (in_channels, channels/groups, *kernel); per axis the output is
    (in-1)*strides - 2*padding + dilation*(kernel-1) + 1 + output_padding, with output_padding < strides."""

    def __init__(self, channels, kernel_size, strides, padding, output_padding, dilation, groups, layout, activation,
                 use_bias, weight_initializer, bias_initializer, in_channels, prefix, params):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout, activation, use_bias,
                         weight_initializer, bias_initializer, in_channels, prefix, params)
        name = type(self).__name__
        self._outpad = as_tuple(output_padding, self._dims, name, "output_padding", 0)
        self._kwargs["adj"] = self._outpad
        if any(o >= s for o, s in zip(self._outpad, self._strides)):  # MXNet refuses it when the layer is made
            raise DnnbindValueError(f"{name}: output_padding {self._outpad} must be smaller than strides {self._strides}")

    def _weight_shape(self, in_channels: int) -> tuple:
        return (in_channels, self._channels // self._groups) + self._kernel

    def forward(self, x):
        w, b = self._weight_and_bias(x)
        y = nd.Deconvolution(x, w, b, kernel=self._kernel, stride=self._strides,
                             dilate=self._dilation, pad=self._padding, adj=self._outpad, num_filter=self._channels,
                             num_group=self._groups, no_bias=b is None)
        return self.act(y) if self.act is not None else y

    def _mapping(self) -> str:
        # NOTE: MXNet prints weight.shape[1] -> weight.shape[0] for every conv, which for a transposed one reads
        # "channels/groups -> in_channels"; and never output_padding (it tests an attribute it never sets).
        # Kept so that print(net) matches MXNet's.
        return f"{self.weight.shape[1] or None} -> {self.weight.shape[0]}"


class Conv2DTranspose(_ConvTranspose):
    """2-D transposed convolution, NCHW. MXNet arguments (``output_padding`` is Deconvolution's ``adj``)."""

    def __init__(self, channels: int, kernel_size, strides=(1, 1), padding=(0, 0), output_padding=(0, 0),
                 dilation=(1, 1), groups: int = 1, layout: str = "NCHW", activation: str | None = None,
                 use_bias: bool = True, weight_initializer=None, bias_initializer=None, in_channels: int = 0,
                 prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, output_padding, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer, in_channels, prefix, params)


class Conv1DTranspose(_ConvTranspose):
    """1-D transposed convolution, NCW (``nd.Deconvolution`` runs it on an H = 1 view); weight
    (in_channels, channels/groups, k)."""
    _dims = 1

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, output_padding=0, dilation=1,
                 groups: int = 1, layout: str = "NCW", activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer=None, in_channels: int = 0, prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, output_padding, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer, in_channels, prefix, params)


class Conv3DTranspose(_ConvTranspose):
    """3-D transposed convolution, NCDHW (cuDNN's N-d descriptors); weight (in_channels, channels/groups, kd, kh,
    kw). MXNet 1.9.1 refuses a dilation other than 1 in 3-D (so does nd.Deconvolution)."""
    _dims = 3

    def __init__(self, channels: int, kernel_size, strides=(1, 1, 1), padding=(0, 0, 0), output_padding=(0, 0, 0),
                 dilation=(1, 1, 1), groups: int = 1, layout: str = "NCDHW", activation: str | None = None,
                 use_bias: bool = True, weight_initializer=None, bias_initializer=None, in_channels: int = 0,
                 prefix=None, params=None):
        super().__init__(channels, kernel_size, strides, padding, output_padding, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer, in_channels, prefix, params)


class PoolBase(Block):
    """Max/avg pooling over ``_dims`` spatial axes (1, 2 or 3) by ``nd.Pooling``; 2-D and 3-D also channels last
    (NHWC, NDHWC)."""
    _pool_type = "max"
    _dims = 2
    _array_input = True

    def __init__(self, pool_size=2, strides=None, padding=0, layout: str | None = None, ceil_mode: bool = False,
                 global_pool: bool = False, count_include_pad: bool = True, prefix=None, params=None):
        name, dims = type(self).__name__, self._dims
        self._layout = _check_layout(name, dims, layout if layout is not None else _LAYOUTS[dims], dims != 1)
        self._size = as_tuple(pool_size, dims, name, "pool_size", 1)
        self._strides = as_tuple(strides if strides is not None else pool_size, dims, name, "strides", 1)
        self._padding = as_tuple(padding, dims, name, "padding", 0)
        super().__init__(prefix=prefix, params=params)
        self._global, self._count_include_pad, self._ceil = bool(global_pool), bool(count_include_pad), bool(ceil_mode)

    def _alias(self) -> str:
        return "pool"

    def forward(self, x):
        if x.ndim != self._dims + 2:
            raise DnnbindValueError(f"{self.name}: {type(self).__name__} expects {self._layout} input "
                             f"({self._dims + 2}-D), got shape {x.shape}")
        return nd.Pooling(x, kernel=self._size, pool_type=self._pool_type, stride=self._strides, pad=self._padding,
                          global_pool=self._global, pooling_convention="full" if self._ceil else "valid",
                          count_include_pad=self._count_include_pad,
                          layout=None if self._dims == 1 else self._layout)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size={self._size}, stride={self._strides}, padding={self._padding}, "
                f"ceil_mode={self._ceil}, global_pool={self._global}, pool_type={self._pool_type}, "
                f"layout={self._layout})")


class MaxPool2D(PoolBase):
    """Max pooling (cudnnPoolingForward, CUDNN_POOLING_MAX); ``strides`` defaults to ``pool_size``."""

    def __init__(self, pool_size=(2, 2), strides=None, padding=0, layout="NCHW", ceil_mode=False, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, **kwargs)


class AvgPool2D(PoolBase):
    """Average pooling; padded zeros count unless ``count_include_pad=False`` (MXNet's default: they count)."""
    _pool_type = "avg"

    def __init__(self, pool_size=(2, 2), strides=None, padding=0, layout="NCHW", ceil_mode=False,
                 count_include_pad=True, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, count_include_pad=count_include_pad,
                         **kwargs)


class MaxPool1D(PoolBase):
    """Max pooling over W of (N, C, W), the 2-D path with H = 1."""
    _dims = 1

    def __init__(self, pool_size=2, strides=None, padding=0, layout="NCW", ceil_mode=False, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, **kwargs)


class AvgPool1D(PoolBase):
    """Average pooling over W of (N, C, W), the 2-D path with H = 1."""
    _pool_type = "avg"
    _dims = 1

    def __init__(self, pool_size=2, strides=None, padding=0, layout="NCW", ceil_mode=False,
                 count_include_pad=True, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, count_include_pad=count_include_pad,
                         **kwargs)


# The global layers pass ceil_mode=True as MXNet's do: Pooling ignores the convention for global_pool, but print(net)
# and export show it.
class GlobalMaxPool2D(PoolBase):
    """(N, C, H, W) -> (N, C, 1, 1) by max ((N, H, W, C) -> (N, 1, 1, C) for NHWC)."""

    def __init__(self, layout="NCHW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class GlobalAvgPool2D(PoolBase):
    """(N, C, H, W) -> (N, C, 1, 1) by mean ((N, H, W, C) -> (N, 1, 1, C) for NHWC)."""
    _pool_type = "avg"

    def __init__(self, layout="NCHW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class GlobalMaxPool1D(PoolBase):
    """(N, C, W) -> (N, C, 1) by max."""
    _dims = 1

    def __init__(self, layout="NCW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class GlobalAvgPool1D(PoolBase):
    """(N, C, W) -> (N, C, 1) by mean."""
    _pool_type = "avg"
    _dims = 1

    def __init__(self, layout="NCW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class MaxPool3D(PoolBase):
    """Max pooling over D, H, W of (N, C, D, H, W) ((N, D, H, W, C) for NDHWC); ``strides`` defaults to
    ``pool_size``. MXNet's argument order (ceil_mode before layout, unlike MaxPool2D's)."""
    _dims = 3

    def __init__(self, pool_size=(2, 2, 2), strides=None, padding=0, ceil_mode=False, layout="NCDHW", **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, **kwargs)


class AvgPool3D(PoolBase):
    """Average pooling over D, H, W; padded zeros count unless ``count_include_pad=False``."""
    _pool_type = "avg"
    _dims = 3

    def __init__(self, pool_size=(2, 2, 2), strides=None, padding=0, ceil_mode=False, layout="NCDHW",
                 count_include_pad=True, **kwargs):
        super().__init__(pool_size, strides, padding, layout, ceil_mode, count_include_pad=count_include_pad,
                         **kwargs)


class GlobalMaxPool3D(PoolBase):
    """(N, C, D, H, W) -> (N, C, 1, 1, 1) by max ((N, D, H, W, C) -> (N, 1, 1, 1, C) for NDHWC)."""
    _dims = 3

    def __init__(self, layout="NCDHW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class GlobalAvgPool3D(PoolBase):
    """(N, C, D, H, W) -> (N, C, 1, 1, 1) by mean ((N, D, H, W, C) -> (N, 1, 1, 1, C) for NDHWC)."""
    _pool_type = "avg"
    _dims = 3

    def __init__(self, layout="NCDHW", **kwargs):
        super().__init__(1, None, 0, layout, True, global_pool=True, **kwargs)


class ReflectionPad2D(Block):
    """MXNet's ``nn.ReflectionPad2D(padding)``: pads (N, C, H, W) data by reflecting its border (``F.pad(...,
    mode='reflect')``); an int pads H and W by that much on each side, else the 8-tuple of ``pad_width``."""

    def __init__(self, padding=0, prefix=None, params=None):
        if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
            padding = (0, 0, 0, 0, padding, padding, padding, padding)
        if not isinstance(padding, (tuple, list)) or len(padding) != 8:
            raise DnnbindValueError(f"ReflectionPad2D: padding must be an int or 8 numbers (pad_width), got "
                                    f"{padding!r}")
        super().__init__(prefix=prefix, params=params)
        self._padding = tuple(padding)

    def hybrid_forward(self, F, x):
        return F.pad(x, mode="reflect", pad_width=self._padding)
