"""VGG 11/13/16/19 (Simonyan and Zisserman, 2014), with and without BatchNorm, as MXNet 1.9.1 builds them
(``vgg0_conv0_weight``, initializers included). Layer: gluon; imports gluon.nn and initializer."""

from __future__ import annotations

from ....initializer import Xavier
from ... import nn
from ...block import HybridBlock
from ._common import load_pretrained

__all__ = ["VGG", "get_vgg", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"]

# layers -> (convolutions per stage, channels per stage)
vgg_spec = {11: ([1, 1, 2, 2, 2], [64, 128, 256, 512, 512]),
            13: ([2, 2, 2, 2, 2], [64, 128, 256, 512, 512]),
            16: ([2, 2, 3, 3, 3], [64, 128, 256, 512, 512]),
            19: ([2, 2, 4, 4, 4], [64, 128, 256, 512, 512])}


class VGG(HybridBlock):
    """Stages of 3x3 convolutions each closed by a 2x2 max pool, then Dense 4096, 4096, classes."""

    def __init__(self, layers, filters, classes: int = 1000, batch_norm: bool = False, **kwargs):
        super().__init__(**kwargs)
        if len(layers) != len(filters):
            raise ValueError(f"VGG: layers ({len(layers)} stages) and filters ({len(filters)}) differ in length")
        with self.name_scope():
            self.features = self._make_features(layers, filters, batch_norm)
            # added in this Block's scope (not the features' own), so the names are vgg0_dense0_, as in MXNet
            for _ in range(2):
                self.features.add(nn.Dense(4096, activation="relu", weight_initializer="normal",
                                           bias_initializer="zeros"))
                self.features.add(nn.Dropout(rate=0.5))
            self.output = nn.Dense(classes, weight_initializer="normal", bias_initializer="zeros")

    def _make_features(self, layers, filters, batch_norm):
        featurizer = nn.HybridSequential(prefix="")
        for num, channels in zip(layers, filters):
            for _ in range(num):
                featurizer.add(nn.Conv2D(channels, kernel_size=3, padding=1,
                                         weight_initializer=Xavier(rnd_type="gaussian", factor_type="out",
                                                                   magnitude=2),
                                         bias_initializer="zeros"))
                if batch_norm:
                    featurizer.add(nn.BatchNorm())
                featurizer.add(nn.Activation("relu"))
            featurizer.add(nn.MaxPool2D(strides=2))
        return featurizer

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def get_vgg(num_layers: int, pretrained: bool = False, ctx=None, root=None, **kwargs) -> VGG:
    """VGG-``num_layers`` (11, 13, 16, 19); ``batch_norm=True`` for the _bn variants."""
    if num_layers not in vgg_spec:
        raise ValueError(f"Invalid number of layers: {num_layers}. Options are {sorted(vgg_spec)}")
    layers, filters = vgg_spec[num_layers]
    net = VGG(layers, filters, **kwargs)
    if pretrained:
        suffix = "_bn" if kwargs.get("batch_norm") else ""
        load_pretrained(net, f"vgg{num_layers}{suffix}", root, ctx)
    return net


def vgg11(**kwargs) -> VGG:
    return get_vgg(11, **kwargs)


def vgg13(**kwargs) -> VGG:
    return get_vgg(13, **kwargs)


def vgg16(**kwargs) -> VGG:
    return get_vgg(16, **kwargs)


def vgg19(**kwargs) -> VGG:
    return get_vgg(19, **kwargs)


def vgg11_bn(**kwargs) -> VGG:
    kwargs["batch_norm"] = True
    return get_vgg(11, **kwargs)


def vgg13_bn(**kwargs) -> VGG:
    kwargs["batch_norm"] = True
    return get_vgg(13, **kwargs)


def vgg16_bn(**kwargs) -> VGG:
    kwargs["batch_norm"] = True
    return get_vgg(16, **kwargs)


def vgg19_bn(**kwargs) -> VGG:
    kwargs["batch_norm"] = True
    return get_vgg(19, **kwargs)
