"""DenseNet-BC 121/161/169/201 (Huang et al., 2016) as MXNet 1.9.1 builds them (``densenet0_stage1_conv0_weight``).
Layer: gluon; imports gluon.nn."""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import HybridConcurrent, Identity, load_pretrained

__all__ = ["DenseNet", "densenet121", "densenet161", "densenet169", "densenet201", "get_densenet"]

# layers -> (channels of the first convolution, growth rate, dense layers per block)
densenet_spec = {121: (64, 32, [6, 12, 24, 16]),
                 161: (96, 48, [6, 12, 36, 24]),
                 169: (64, 32, [6, 12, 32, 32]),
                 201: (64, 32, [6, 12, 48, 32])}


def _make_dense_block(num_layers, bn_size, growth_rate, dropout, stage_index):
    out = nn.HybridSequential(prefix=f"stage{stage_index}_")
    with out.name_scope():  # the layers' counters restart per stage: densenet0_stage2_conv0_
        for _ in range(num_layers):
            out.add(_make_dense_layer(growth_rate, bn_size, dropout))
    return out


def _make_dense_layer(growth_rate, bn_size, dropout):
    """BN-ReLU-Conv1x1-BN-ReLU-Conv3x3, its output concatenated to its input (the dense connection)."""
    new_features = nn.HybridSequential(prefix="")
    new_features.add(nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(bn_size * growth_rate, kernel_size=1, use_bias=False),
                     nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(growth_rate, kernel_size=3, padding=1, use_bias=False))
    if dropout:
        new_features.add(nn.Dropout(dropout))
    out = HybridConcurrent(axis=1, prefix="")
    out.add(Identity())
    out.add(new_features)
    return out


def _make_transition(num_output_features):
    out = nn.HybridSequential(prefix="")
    out.add(nn.BatchNorm(), nn.Activation("relu"), nn.Conv2D(num_output_features, kernel_size=1, use_bias=False),
            nn.AvgPool2D(pool_size=2, strides=2))
    return out


class DenseNet(HybridBlock):
    """Stem, dense blocks joined by transitions (halving channels and size), BN-ReLU, 7x7 average pool, Dense.
    The final AvgPool2D(7) wants a 7x7 map: 224x224 input."""

    def __init__(self, num_init_features, growth_rate, block_config, bn_size=4, dropout=0, classes=1000,
                 **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.Conv2D(num_init_features, kernel_size=7, strides=2, padding=3, use_bias=False),
                              nn.BatchNorm(), nn.Activation("relu"),
                              nn.MaxPool2D(pool_size=3, strides=2, padding=1))
            num_features = num_init_features
            for i, num_layers in enumerate(block_config):
                self.features.add(_make_dense_block(num_layers, bn_size, growth_rate, dropout, i + 1))
                num_features += num_layers * growth_rate
                if i != len(block_config) - 1:
                    num_features //= 2
                    self.features.add(_make_transition(num_features))
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.AvgPool2D(pool_size=7), nn.Flatten())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def get_densenet(num_layers: int, pretrained: bool = False, ctx=None, root=None, **kwargs) -> DenseNet:
    """DenseNet-BC ``num_layers`` (121, 161, 169, 201)."""
    if num_layers not in densenet_spec:
        raise ValueError(f"Invalid number of layers: {num_layers}. Options are {sorted(densenet_spec)}")
    num_init_features, growth_rate, block_config = densenet_spec[num_layers]
    net = DenseNet(num_init_features, growth_rate, block_config, **kwargs)
    return load_pretrained(net, f"densenet{num_layers}", root, ctx) if pretrained else net


def densenet121(**kwargs) -> DenseNet:
    return get_densenet(121, **kwargs)


def densenet161(**kwargs) -> DenseNet:
    return get_densenet(161, **kwargs)


def densenet169(**kwargs) -> DenseNet:
    return get_densenet(169, **kwargs)


def densenet201(**kwargs) -> DenseNet:
    return get_densenet(201, **kwargs)
