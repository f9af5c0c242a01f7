"""ResNet v1 (He et al., 2015) and v2 (pre-activation, He et al., 2016), 18/34/50/101/152 layers, as MXNet 1.9.1
builds them (``resnetv10_stage1_conv0_weight``). Layer: gluon; imports gluon.nn.

The residual blocks take ``prefix=''`` and build their layers outside any scope of their own, so the layers are
numbered by the stage that holds them: stage1_conv0, stage1_conv1, ... across all of the stage's blocks.
"""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import load_pretrained

__all__ = [
    "BasicBlockV1",
    "BasicBlockV2",
    "BottleneckV1",
    "BottleneckV2",
    "ResNetV1",
    "ResNetV2",
    "get_resnet",
    "resnet18_v1",
    "resnet18_v2",
    "resnet34_v1",
    "resnet34_v2",
    "resnet50_v1",
    "resnet50_v2",
    "resnet101_v1",
    "resnet101_v2",
    "resnet152_v1",
    "resnet152_v2",
]


def _conv3x3(channels, stride, in_channels):
    return nn.Conv2D(channels, kernel_size=3, strides=stride, padding=1, use_bias=False, in_channels=in_channels)


def _downsample_v1(channels, stride, in_channels):
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(channels, kernel_size=1, strides=stride, use_bias=False, in_channels=in_channels),
            nn.BatchNorm())
    return out


class BasicBlockV1(HybridBlock):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the input (through a strided 1x1 conv-BN when ``downsample``), ReLU."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        super().__init__(**kwargs)
        self.body = nn.HybridSequential(prefix="")
        self.body.add(_conv3x3(channels, stride, in_channels), nn.BatchNorm(), nn.Activation("relu"),
                      _conv3x3(channels, 1, channels), nn.BatchNorm())
        self.downsample = _downsample_v1(channels, stride, in_channels) if downsample else None

    def hybrid_forward(self, F, x):
        residual = self.downsample(x) if self.downsample is not None else x
        return F.Activation(residual + self.body(x), act_type="relu")


class BottleneckV1(HybridBlock):
    """1x1 (channels/4, strided) - 3x3 - 1x1 (channels), each followed by BN; the 1x1 convolutions keep their bias
    (as in MXNet's definition and its pretrained files)."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        super().__init__(**kwargs)
        self.body = nn.HybridSequential(prefix="")
        self.body.add(nn.Conv2D(channels // 4, kernel_size=1, strides=stride), nn.BatchNorm(),
                      nn.Activation("relu"),
                      _conv3x3(channels // 4, 1, channels // 4), nn.BatchNorm(), nn.Activation("relu"),
                      nn.Conv2D(channels, kernel_size=1, strides=1), nn.BatchNorm())
        self.downsample = _downsample_v1(channels, stride, in_channels) if downsample else None

    def hybrid_forward(self, F, x):
        residual = self.downsample(x) if self.downsample is not None else x
        return F.Activation(self.body(x) + residual, act_type="relu")


class BasicBlockV2(HybridBlock):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3 plus the input; the shortcut (a strided 1x1 conv when ``downsample``) reads
    the first BN-ReLU's output."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        super().__init__(**kwargs)
        self.bn1 = nn.BatchNorm()
        self.conv1 = _conv3x3(channels, stride, in_channels)
        self.bn2 = nn.BatchNorm()
        self.conv2 = _conv3x3(channels, 1, channels)
        self.downsample = (nn.Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels)
                           if downsample else None)

    def hybrid_forward(self, F, x):
        residual = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            residual = self.downsample(x)
        x = self.conv1(x)
        x = F.Activation(self.bn2(x), act_type="relu")
        return self.conv2(x) + residual


class BottleneckV2(HybridBlock):
    """Pre-activation bottleneck: BN-ReLU-1x1, BN-ReLU-3x3 (strided), BN-ReLU-1x1, plus the shortcut."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        super().__init__(**kwargs)
        self.bn1 = nn.BatchNorm()
        self.conv1 = nn.Conv2D(channels // 4, kernel_size=1, strides=1, use_bias=False)
        self.bn2 = nn.BatchNorm()
        self.conv2 = _conv3x3(channels // 4, stride, channels // 4)
        self.bn3 = nn.BatchNorm()
        self.conv3 = nn.Conv2D(channels, kernel_size=1, strides=1, use_bias=False)
        self.downsample = (nn.Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels)
                           if downsample else None)

    def hybrid_forward(self, F, x):
        residual = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            residual = self.downsample(x)
        x = self.conv1(x)
        x = F.Activation(self.bn2(x), act_type="relu")
        x = self.conv2(x)
        x = F.Activation(self.bn3(x), act_type="relu")
        return self.conv3(x) + residual


def _make_layer(block, layers, channels, stride, stage_index, in_channels):
    layer = nn.HybridSequential(prefix=f"stage{stage_index}_")
    with layer.name_scope():
        layer.add(block(channels, stride, channels != in_channels, in_channels=in_channels, prefix=""))
        for _ in range(layers - 1):
            layer.add(block(channels, 1, False, in_channels=channels, prefix=""))
    return layer


class ResNetV1(HybridBlock):
    """``block`` (BasicBlockV1 or BottleneckV1) repeated ``layers[i]`` times per stage, ``channels`` the stem's
    then each stage's width. ``thumbnail=True``: a 3x3 stem for 32x32 images (CIFAR). Ends in a global pool."""

    def __init__(self, block, layers, channels, classes=1000, thumbnail=False, **kwargs):
        super().__init__(**kwargs)
        if len(layers) != len(channels) - 1:
            raise ValueError(f"ResNetV1: {len(layers)} stages need {len(layers) + 1} channels, got {len(channels)}")
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            if thumbnail:
                self.features.add(_conv3x3(channels[0], 1, 0))
            else:
                self.features.add(nn.Conv2D(channels[0], 7, 2, 3, use_bias=False), nn.BatchNorm(),
                                  nn.Activation("relu"), nn.MaxPool2D(3, 2, 1))
            for i, num_layer in enumerate(layers):
                self.features.add(_make_layer(block, num_layer, channels[i + 1], 1 if i == 0 else 2, i + 1,
                                              in_channels=channels[i]))
            self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.Dense(classes, in_units=channels[-1])

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


class ResNetV2(HybridBlock):
    """As ResNetV1 with pre-activation blocks; the input is first normalized by a BatchNorm without scale and
    shift (MXNet's stand-in for mean/std preprocessing)."""

    def __init__(self, block, layers, channels, classes=1000, thumbnail=False, **kwargs):
        super().__init__(**kwargs)
        if len(layers) != len(channels) - 1:
            raise ValueError(f"ResNetV2: {len(layers)} stages need {len(layers) + 1} channels, got {len(channels)}")
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.BatchNorm(scale=False, center=False))
            if thumbnail:
                self.features.add(_conv3x3(channels[0], 1, 0))
            else:
                self.features.add(nn.Conv2D(channels[0], 7, 2, 3, use_bias=False), nn.BatchNorm(),
                                  nn.Activation("relu"), nn.MaxPool2D(3, 2, 1))
            in_channels = channels[0]
            for i, num_layer in enumerate(layers):
                self.features.add(_make_layer(block, num_layer, channels[i + 1], 1 if i == 0 else 2, i + 1,
                                              in_channels=in_channels))
                in_channels = channels[i + 1]
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes, in_units=in_channels)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# layers -> (block kind, blocks per stage, channels of the stem then of each stage)
resnet_spec = {18: ("basic_block", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
               34: ("basic_block", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
               50: ("bottle_neck", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
               101: ("bottle_neck", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
               152: ("bottle_neck", [3, 8, 36, 3], [64, 256, 512, 1024, 2048])}
resnet_net_versions = [ResNetV1, ResNetV2]
resnet_block_versions = [{"basic_block": BasicBlockV1, "bottle_neck": BottleneckV1},
                         {"basic_block": BasicBlockV2, "bottle_neck": BottleneckV2}]


def get_resnet(version: int, num_layers: int, pretrained: bool = False, ctx=None, root=None, **kwargs):
    """ResNet v``version`` (1 or 2) with ``num_layers`` (18, 34, 50, 101, 152)."""
    if num_layers not in resnet_spec:
        raise ValueError(f"Invalid number of layers: {num_layers}. Options are {sorted(resnet_spec)}")
    if version not in (1, 2):
        raise ValueError(f"Invalid resnet version: {version}. Options are 1 and 2.")
    block_type, layers, channels = resnet_spec[num_layers]
    net = resnet_net_versions[version - 1](resnet_block_versions[version - 1][block_type], layers, channels,
                                           **kwargs)
    if pretrained:
        load_pretrained(net, f"resnet{num_layers}_v{version}", root, ctx)
    return net


def resnet18_v1(**kwargs) -> ResNetV1:
    return get_resnet(1, 18, **kwargs)


def resnet34_v1(**kwargs) -> ResNetV1:
    return get_resnet(1, 34, **kwargs)


def resnet50_v1(**kwargs) -> ResNetV1:
    return get_resnet(1, 50, **kwargs)


def resnet101_v1(**kwargs) -> ResNetV1:
    return get_resnet(1, 101, **kwargs)


def resnet152_v1(**kwargs) -> ResNetV1:
    return get_resnet(1, 152, **kwargs)


def resnet18_v2(**kwargs) -> ResNetV2:
    return get_resnet(2, 18, **kwargs)


def resnet34_v2(**kwargs) -> ResNetV2:
    return get_resnet(2, 34, **kwargs)


def resnet50_v2(**kwargs) -> ResNetV2:
    return get_resnet(2, 50, **kwargs)


def resnet101_v2(**kwargs) -> ResNetV2:
    return get_resnet(2, 101, **kwargs)


def resnet152_v2(**kwargs) -> ResNetV2:
    return get_resnet(2, 152, **kwargs)
