"""d2l-zh's ResNet-18 (resnet.md) and d2l_compare's ResNet-50 v1.5 in channels-last layout, for bench_models.py's
NHWC modes.

Layer: script; imports dnnbind (through d2l_compare's mxnet alias) and d2l_compare. The layers are MXNet 1.x's own
spellings of the layout: ``Conv2D(layout='NHWC')`` (weights (out, kh, kw, in)), ``BatchNorm(axis=3)``,
``MaxPool2D/GlobalAvgPool2D(layout='NHWC')``. With ``fused``, each Residual ends in ``nn.BatchNormAddRelu`` (NVIDIA's
MXNet spelling: relu(bn2(conv2(.)) + shortcut) as one cuDNN call where cuDNN has one: float16 NHWC), in place of
bn2, the add and the relu; its Parameters are bn2's. Likewise each ResNet-50 Bottleneck ends in
relu(bn3(conv3(.)) + shortcut) as one nn.BatchNormAddRelu in place of bn3. The weights are the NCHW model's,
transposed, so every mode starts from the same values. MNIST's one input channel makes (N, 1, H, W) and
(N, H, W, 1) the same bytes: those batches enter as views; 3-channel batches are transposed once, before timing (as
torch's channels_last modes convert their pool with .contiguous(memory_format=torch.channels_last)).
"""
from __future__ import annotations

import types

import d2l_compare as d2l
from mxnet import nd
from mxnet.gluon import nn

__all__ = ["MODELS", "build", "to_nhwc"]

# the architectures (d2l_compare functions) with an NHWC twin (AlexNet's Dense would need its rows permuted)
MODELS = ("resnet", "resnet50")


def _layers(fused: bool) -> types.SimpleNamespace:
    L = types.SimpleNamespace(**vars(d2l.GLUON))
    L.conv = lambda c, k, s=1, p=0, act=None, bias=True: nn.Conv2D(c, kernel_size=k, strides=s, padding=p,
                                                                   activation=act, use_bias=bias, layout="NHWC")
    L.maxpool = lambda k, s, p=0: nn.MaxPool2D(pool_size=k, strides=s, padding=p, layout="NHWC")
    L.avgpool = lambda k, s: nn.AvgPool2D(pool_size=k, strides=s, layout="NHWC")
    L.gap = lambda: nn.GlobalAvgPool2D(layout="NHWC")
    L.bn = lambda ndim=4: nn.BatchNorm(axis=3 if ndim == 4 else 1)
    L.cat = lambda xs: nd.concat(*xs, dim=3)
    d2l.with_blocks(L)
    if fused:
        class Residual(L.Block):  # d2l's Residual, its tail fused; children in the book's order, so names match
            def __init__(self, channels, use_1x1conv=False, strides=1):
                super().__init__()
                self.conv1 = L.conv(channels, 3, strides, 1)
                self.conv2 = L.conv(channels, 3, 1, 1)
                self.conv3 = L.conv(channels, 1, strides) if use_1x1conv else None
                self.bn1, self.bn2 = L.bn(), nn.BatchNormAddRelu(axis=3)

            def forward(self, x):
                y = self.conv2(L.relu(self.bn1(self.conv1(x))))
                return self.bn2(y, self.conv3(x) if self.conv3 is not None else x)

        class Bottleneck(L.Block):  # d2l_compare's Bottleneck, its tail fused; children in the same order
            def __init__(self, channels, strides=1, downsample=False):
                super().__init__()
                mid = channels // 4
                self.conv1, self.bn1 = L.conv(mid, 1, bias=False), L.bn()
                self.conv2, self.bn2 = L.conv(mid, 3, strides, 1, bias=False), L.bn()
                self.conv3, self.bn3 = L.conv(channels, 1, bias=False), nn.BatchNormAddRelu(axis=3)
                self.downsample = L.seq(L.conv(channels, 1, strides, bias=False), L.bn()) if downsample else None

            def forward(self, x):
                y = L.relu(self.bn1(self.conv1(x)))
                y = self.conv3(L.relu(self.bn2(self.conv2(y))))
                return self.bn3(y, self.downsample(x) if self.downsample is not None else x)
        L.Residual, L.Bottleneck = Residual, Bottleneck
    return L


def build(spec, base, ctx, fused: bool = True):
    """The NHWC twin of ``base`` (the initialized NCHW model of ``spec``), holding its values."""
    if spec.arch.__name__ not in MODELS:
        raise ValueError(f"bench_nhwc: no NHWC twin of {spec.notebook}; only of {', '.join(MODELS)}")
    net = spec.arch(_layers(fused))
    net.initialize(ctx=ctx)
    net(nd.zeros((2, spec.size, spec.size, spec.channels), ctx=ctx))  # deferred shapes
    src, dst = list(base.collect_params().values()), list(net.collect_params().values())
    if len(src) != len(dst):
        raise ValueError(f"bench_nhwc: {len(src)} NCHW Parameters but {len(dst)} NHWC ones")
    for p, q in zip(src, dst):
        value = p.data()
        value = value.transpose((0, 2, 3, 1)) if value.ndim == 4 else value
        if value.shape != q.shape:
            raise ValueError(f"bench_nhwc: {p.name} {p.shape} does not map onto {q.name} {q.shape}")
        q.set_data(value)
    return net


def to_nhwc(x):
    """An NCHW batch as NHWC: one channel is the same memory, viewed; more are transposed into a new array."""
    n, c, h, w = x.shape
    return x.reshape((n, h, w, 1)) if c == 1 else x.transpose((0, 2, 3, 1))
