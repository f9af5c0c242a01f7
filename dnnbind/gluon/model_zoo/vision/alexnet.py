"""AlexNet (Krizhevsky, "One weird trick...", 2014) with MXNet 1.9.1's layout and names (``alexnet0_conv0_weight``).
Layer: gluon; imports gluon.nn."""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import load_pretrained

__all__ = ["AlexNet", "alexnet"]


class AlexNet(HybridBlock):
    """Five convolutions and three Dense layers; the Dense after Flatten takes 256*6*6 inputs at 224x224."""

    def __init__(self, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            # MXNet enters features.name_scope() here, a no-op for a prefix-'' Block: the layers are
            # counted in this Block's scope (alexnet0_dense0, dense1, then output dense2)
            for channels, kernel, stride, pad, pool in ((64, 11, 4, 2, True), (192, 5, 1, 2, True),
                                                        (384, 3, 1, 1, False), (256, 3, 1, 1, False),
                                                        (256, 3, 1, 1, True)):
                self.features.add(nn.Conv2D(channels, kernel_size=kernel, strides=stride, padding=pad,
                                            activation="relu"))
                if pool:
                    self.features.add(nn.MaxPool2D(pool_size=3, strides=2))
            self.features.add(nn.Flatten())
            for _ in range(2):
                self.features.add(nn.Dense(4096, activation="relu"))
                self.features.add(nn.Dropout(0.5))
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def alexnet(pretrained: bool = False, ctx=None, root=None, **kwargs) -> AlexNet:
    """AlexNet; ``pretrained=True`` loads ``alexnet-44335d1f.params`` from ``root`` (``$MXNET_HOME/models``) onto
    ``ctx`` (cpu())."""
    net = AlexNet(**kwargs)
    return load_pretrained(net, "alexnet", root, ctx) if pretrained else net
