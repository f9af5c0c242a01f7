"""SqueezeNet 1.0 (Iandola et al., 2016) and 1.1 (the official repo's cheaper variant) as MXNet 1.9.1 builds them
(``squeezenet0_conv0_weight``). Layer: gluon; imports gluon.nn."""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import HybridConcurrent, load_pretrained

__all__ = ["SqueezeNet", "get_squeezenet", "squeezenet1_0", "squeezenet1_1"]


def _make_fire(squeeze_channels, expand1x1_channels, expand3x3_channels):
    """A fire module: a 1x1 squeeze, then 1x1 and 3x3 expands side by side, concatenated."""
    out = nn.HybridSequential(prefix="")
    out.add(_make_fire_conv(squeeze_channels, 1))
    paths = HybridConcurrent(axis=1, prefix="")
    paths.add(_make_fire_conv(expand1x1_channels, 1))
    paths.add(_make_fire_conv(expand3x3_channels, 3, 1))
    out.add(paths)
    return out


def _make_fire_conv(channels, kernel_size, padding=0):
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(channels, kernel_size, padding=padding), nn.Activation("relu"))
    return out


def _pool():
    # ceil_mode: Caffe's pooling rounds up, and the pretrained weights were trained with it
    return nn.MaxPool2D(pool_size=3, strides=2, ceil_mode=True)


class SqueezeNet(HybridBlock):
    """``version`` '1.0' or '1.1'. The classifier ends in AvgPool2D(13): the feature map is 13x13 at 224x224."""

    def __init__(self, version: str, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        if version not in ("1.0", "1.1"):
            raise ValueError(f"Unsupported SqueezeNet version {version}: 1.0 or 1.1 expected")
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            if version == "1.0":
                self.features.add(nn.Conv2D(96, kernel_size=7, strides=2), nn.Activation("relu"), _pool(),
                                  _make_fire(16, 64, 64), _make_fire(16, 64, 64), _make_fire(32, 128, 128),
                                  _pool(),
                                  _make_fire(32, 128, 128), _make_fire(48, 192, 192), _make_fire(48, 192, 192),
                                  _make_fire(64, 256, 256),
                                  _pool(),
                                  _make_fire(64, 256, 256))
            else:
                self.features.add(nn.Conv2D(64, kernel_size=3, strides=2), nn.Activation("relu"), _pool(),
                                  _make_fire(16, 64, 64), _make_fire(16, 64, 64),
                                  _pool(),
                                  _make_fire(32, 128, 128), _make_fire(32, 128, 128),
                                  _pool(),
                                  _make_fire(48, 192, 192), _make_fire(48, 192, 192), _make_fire(64, 256, 256),
                                  _make_fire(64, 256, 256))
            self.features.add(nn.Dropout(0.5))
            self.output = nn.HybridSequential(prefix="")
            self.output.add(nn.Conv2D(classes, kernel_size=1), nn.Activation("relu"), nn.AvgPool2D(13),
                            nn.Flatten())

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def get_squeezenet(version: str, pretrained: bool = False, ctx=None, root=None, **kwargs) -> SqueezeNet:
    """SqueezeNet ``version`` ('1.0' or '1.1')."""
    net = SqueezeNet(version, **kwargs)
    return load_pretrained(net, f"squeezenet{version}", root, ctx) if pretrained else net


def squeezenet1_0(**kwargs) -> SqueezeNet:
    return get_squeezenet("1.0", **kwargs)


def squeezenet1_1(**kwargs) -> SqueezeNet:
    return get_squeezenet("1.1", **kwargs)
