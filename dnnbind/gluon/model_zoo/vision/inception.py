"""Inception v3 (Szegedy et al., 2015) as MXNet 1.9.1 builds it: 299x299 input, named stages
(``inception30_A1_conv0_weight``). Layer: gluon; imports gluon.nn."""

from __future__ import annotations

from ... import nn
from ...block import HybridBlock
from ._common import HybridConcurrent, load_pretrained

__all__ = ["Inception3", "inception_v3"]


def _make_basic_conv(**kwargs):
    """Conv (no bias) - BatchNorm (epsilon 1e-3, as the TensorFlow original) - ReLU."""
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(use_bias=False, **kwargs), nn.BatchNorm(epsilon=0.001), nn.Activation("relu"))
    return out


def _make_branch(use_pool, *conv_settings):
    """An optional pool ('avg' 3x3 stride 1, 'max' 3x3 stride 2), then one basic conv per
    (channels, kernel_size, strides, padding) tuple; None leaves Conv2D's default."""
    out = nn.HybridSequential(prefix="")
    if use_pool == "avg":
        out.add(nn.AvgPool2D(pool_size=3, strides=1, padding=1))
    elif use_pool == "max":
        out.add(nn.MaxPool2D(pool_size=3, strides=2))
    for setting in conv_settings:
        kwargs = {k: v for k, v in zip(("channels", "kernel_size", "strides", "padding"), setting) if v is not None}
        out.add(_make_basic_conv(**kwargs))
    return out


def _concurrent(prefix, *branches):
    # The branches must be built inside the block's scope (their layers are named A1_conv0_, ...): callers pass
    # functions, called here in order, so the counters run as in MXNet.
    out = HybridConcurrent(axis=1, prefix=prefix)
    with out.name_scope():
        for make in branches:
            out.add(make())
    return out


def _make_A(pool_features, prefix):
    return _concurrent(prefix,
                       lambda: _make_branch(None, (64, 1, None, None)),
                       lambda: _make_branch(None, (48, 1, None, None), (64, 5, None, 2)),
                       lambda: _make_branch(None, (64, 1, None, None), (96, 3, None, 1), (96, 3, None, 1)),
                       lambda: _make_branch("avg", (pool_features, 1, None, None)))


def _make_B(prefix):
    return _concurrent(prefix,
                       lambda: _make_branch(None, (384, 3, 2, None)),
                       lambda: _make_branch(None, (64, 1, None, None), (96, 3, None, 1), (96, 3, 2, None)),
                       lambda: _make_branch("max"))


def _make_C(channels_7x7, prefix):
    c = channels_7x7
    return _concurrent(prefix,
                       lambda: _make_branch(None, (192, 1, None, None)),
                       lambda: _make_branch(None, (c, 1, None, None), (c, (1, 7), None, (0, 3)),
                                            (192, (7, 1), None, (3, 0))),
                       lambda: _make_branch(None, (c, 1, None, None), (c, (7, 1), None, (3, 0)),
                                            (c, (1, 7), None, (0, 3)), (c, (7, 1), None, (3, 0)),
                                            (192, (1, 7), None, (0, 3))),
                       lambda: _make_branch("avg", (192, 1, None, None)))


def _make_D(prefix):
    return _concurrent(prefix,
                       lambda: _make_branch(None, (192, 1, None, None), (320, 3, 2, None)),
                       lambda: _make_branch(None, (192, 1, None, None), (192, (1, 7), None, (0, 3)),
                                            (192, (7, 1), None, (3, 0)), (192, 3, 2, None)),
                       lambda: _make_branch("max"))


def _split(first, *pairs):
    """A branch whose last stage splits into parallel (1x3) and (3x1) convolutions (module E)."""
    out = nn.HybridSequential(prefix="")
    out.add(_make_branch(None, first, *pairs))
    split = HybridConcurrent(axis=1, prefix="")
    split.add(_make_branch(None, (384, (1, 3), None, (0, 1))))
    split.add(_make_branch(None, (384, (3, 1), None, (1, 0))))
    out.add(split)
    return out


def _make_E(prefix):
    return _concurrent(prefix,
                       lambda: _make_branch(None, (320, 1, None, None)),
                       lambda: _split((384, 1, None, None)),
                       lambda: _split((448, 1, None, None), (384, 3, None, 1)),
                       lambda: _make_branch("avg", (192, 1, None, None)))


def make_aux(classes):
    """MXNet's auxiliary classifier (defined there, used by no network)."""
    out = nn.HybridSequential(prefix="")
    out.add(nn.AvgPool2D(pool_size=5, strides=3), _make_basic_conv(channels=128, kernel_size=1),
            _make_basic_conv(channels=768, kernel_size=5), nn.Flatten(), nn.Dense(classes))
    return out


class Inception3(HybridBlock):
    """Inception v3 for 299x299 input (the final AvgPool2D(8) wants an 8x8 map)."""

    def __init__(self, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(_make_basic_conv(channels=32, kernel_size=3, strides=2),
                              _make_basic_conv(channels=32, kernel_size=3),
                              _make_basic_conv(channels=64, kernel_size=3, padding=1),
                              nn.MaxPool2D(pool_size=3, strides=2),
                              _make_basic_conv(channels=80, kernel_size=1),
                              _make_basic_conv(channels=192, kernel_size=3),
                              nn.MaxPool2D(pool_size=3, strides=2),
                              _make_A(32, "A1_"), _make_A(64, "A2_"), _make_A(64, "A3_"),
                              _make_B("B_"),
                              _make_C(128, "C1_"), _make_C(160, "C2_"), _make_C(160, "C3_"), _make_C(192, "C4_"),
                              _make_D("D_"),
                              _make_E("E1_"), _make_E("E2_"),
                              nn.AvgPool2D(pool_size=8), nn.Dropout(0.5))
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def inception_v3(pretrained: bool = False, ctx=None, root=None, **kwargs) -> Inception3:
    """Inception v3; ``pretrained=True`` loads ``inceptionv3-ed47ec45.params``."""
    net = Inception3(**kwargs)
    return load_pretrained(net, "inceptionv3", root, ctx) if pretrained else net
