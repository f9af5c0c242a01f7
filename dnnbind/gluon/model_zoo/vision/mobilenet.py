"""MobileNet (Howard et al., 2017) and MobileNetV2 (Sandler et al., 2018) at width multipliers 1.0, 0.75, 0.5 and
0.25, as MXNet 1.9.1 builds them (``mobilenet0_conv0_weight``, ``mobilenetv20_features_conv0_weight``).
Layer: gluon; imports gluon.nn."""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import load_pretrained

__all__ = [
    "MobileNet",
    "MobileNetV2",
    "get_mobilenet",
    "get_mobilenet_v2",
    "mobilenet0_5",
    "mobilenet0_25",
    "mobilenet0_75",
    "mobilenet1_0",
    "mobilenet_v2_0_5",
    "mobilenet_v2_0_25",
    "mobilenet_v2_0_75",
    "mobilenet_v2_1_0",
]


class RELU6(HybridBlock):
    """min(max(x, 0), 6). The class name is MXNet's: it names the block (``relu60_``)."""

    def hybrid_forward(self, F, x):
        return F.clip(x, a_min=0, a_max=6)  # by keyword: dnnbind.symbol.clip takes no positional scalars


def _add_conv(out, channels=1, kernel=1, stride=1, pad=0, num_group=1, active=True, relu6=False):
    out.add(nn.Conv2D(channels, kernel, stride, pad, groups=num_group, use_bias=False))
    out.add(nn.BatchNorm(scale=True))
    if active:
        out.add(RELU6() if relu6 else nn.Activation("relu"))


def _add_conv_dw(out, dw_channels, channels, stride, relu6=False):
    """Depthwise 3x3 (one group per channel), then pointwise 1x1."""
    _add_conv(out, channels=dw_channels, kernel=3, stride=stride, pad=1, num_group=dw_channels, relu6=relu6)
    _add_conv(out, channels=channels, relu6=relu6)


class LinearBottleneck(HybridBlock):
    """MobileNetV2's inverted residual: expand 1x1 (x t), depthwise 3x3, project 1x1 without activation; the input
    is added back when the shapes allow (stride 1, same channels)."""

    def __init__(self, in_channels, channels, t, stride, **kwargs):
        super().__init__(**kwargs)
        self.use_shortcut = stride == 1 and in_channels == channels
        with self.name_scope():
            self.out = nn.HybridSequential()
            _add_conv(self.out, in_channels * t, relu6=True)
            _add_conv(self.out, in_channels * t, kernel=3, stride=stride, pad=1, num_group=in_channels * t,
                      relu6=True)
            _add_conv(self.out, channels, active=False, relu6=True)

    def hybrid_forward(self, F, x):
        out = self.out(x)
        return F.elemwise_add(out, x) if self.use_shortcut else out


class MobileNet(HybridBlock):
    """MobileNet v1 with width ``multiplier``; global average pool, so any input of at least 32x32 runs."""

    def __init__(self, multiplier: float = 1.0, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            # MXNet enters features.name_scope() here, a no-op for a prefix-'' Block: the layers are
            # counted in this Block's scope (mobilenet0_conv0, ..., then dense0)
            _add_conv(self.features, channels=int(32 * multiplier), kernel=3, pad=1, stride=2)
            dw_channels = [int(x * multiplier) for x in [32, 64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024]]
            channels = [int(x * multiplier) for x in [64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024] * 2]
            strides = [1, 2] * 3 + [1] * 5 + [2, 1]
            for dwc, c, s in zip(dw_channels, channels, strides):
                _add_conv_dw(self.features, dw_channels=dwc, channels=c, stride=s)
            self.features.add(nn.GlobalAvgPool2D())
            self.features.add(nn.Flatten())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


class MobileNetV2(HybridBlock):
    """MobileNetV2 with width ``multiplier``; the classifier is a 1x1 convolution without bias (``pred_``)."""

    def __init__(self, multiplier: float = 1.0, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="features_")
            with self.features.name_scope():
                _add_conv(self.features, int(32 * multiplier), kernel=3, stride=2, pad=1, relu6=True)
                in_channels_group = [int(x * multiplier) for x in
                                     [32] + [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3]
                channels_group = [int(x * multiplier) for x in
                                  [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3 + [320]]
                ts = [1] + [6] * 16
                strides = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
                for in_c, c, t, s in zip(in_channels_group, channels_group, ts, strides):
                    self.features.add(LinearBottleneck(in_channels=in_c, channels=c, t=t, stride=s))
                # the last convolution widens only above 1.0 (MXNet's rule; the paper's too)
                last_channels = int(1280 * multiplier) if multiplier > 1.0 else 1280
                _add_conv(self.features, last_channels, relu6=True)
                self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.HybridSequential(prefix="output_")
            with self.output.name_scope():
                self.output.add(nn.Conv2D(classes, 1, use_bias=False, prefix="pred_"), nn.Flatten())

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def _version_suffix(multiplier: float) -> str:
    # MXNet's file names: mobilenet1.0, mobilenet0.75, mobilenet0.5, mobilenet0.25
    suffix = f"{multiplier:.2f}"
    return suffix[:-1] if suffix in ("1.00", "0.50") else suffix


def get_mobilenet(multiplier: float, pretrained: bool = False, ctx=None, root=None, **kwargs) -> MobileNet:
    """MobileNet with width ``multiplier``."""
    net = MobileNet(multiplier, **kwargs)
    if pretrained:
        load_pretrained(net, f"mobilenet{_version_suffix(multiplier)}", root, ctx)
    return net


def get_mobilenet_v2(multiplier: float, pretrained: bool = False, ctx=None, root=None, **kwargs) -> MobileNetV2:
    """MobileNetV2 with width ``multiplier``."""
    net = MobileNetV2(multiplier, **kwargs)
    if pretrained:
        load_pretrained(net, f"mobilenetv2_{_version_suffix(multiplier)}", root, ctx)
    return net


def mobilenet1_0(**kwargs) -> MobileNet:
    return get_mobilenet(1.0, **kwargs)


def mobilenet0_75(**kwargs) -> MobileNet:
    return get_mobilenet(0.75, **kwargs)


def mobilenet0_5(**kwargs) -> MobileNet:
    return get_mobilenet(0.5, **kwargs)


def mobilenet0_25(**kwargs) -> MobileNet:
    return get_mobilenet(0.25, **kwargs)


def mobilenet_v2_1_0(**kwargs) -> MobileNetV2:
    return get_mobilenet_v2(1.0, **kwargs)


def mobilenet_v2_0_75(**kwargs) -> MobileNetV2:
    return get_mobilenet_v2(0.75, **kwargs)


def mobilenet_v2_0_5(**kwargs) -> MobileNetV2:
    return get_mobilenet_v2(0.5, **kwargs)


def mobilenet_v2_0_25(**kwargs) -> MobileNetV2:
    return get_mobilenet_v2(0.25, **kwargs)
