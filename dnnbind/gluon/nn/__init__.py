"""Neural network layers (``mxnet.gluon.nn``). Layer: gluon; imports nd and gluon.block.

A layer MXNet 1.9.1 has and dnnbind lacks (``GroupNorm``) raises UnsupportedFeature naming it; a typo a plain
AttributeError (``__getattr__`` below).
"""

import sys

from ... import features
from ..block import Block, HybridBlock
from ..symbol_block import SymbolBlock
from .activations import ELU, GELU, SELU, LeakyReLU, PReLU, Swish
from .basic_layers import (
    Activation,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    HybridLambda,
    HybridSequential,
    Lambda,
    Sequential,
)
from .conv_layers import (
    AvgPool1D,
    AvgPool2D,
    AvgPool3D,
    Conv1D,
    Conv1DTranspose,
    Conv2D,
    Conv2DTranspose,
    Conv3D,
    Conv3DTranspose,
    GlobalAvgPool1D,
    GlobalAvgPool2D,
    GlobalAvgPool3D,
    GlobalMaxPool1D,
    GlobalMaxPool2D,
    GlobalMaxPool3D,
    MaxPool1D,
    MaxPool2D,
    MaxPool3D,
    ReflectionPad2D,
)
from .norm_layers import BatchNorm, InstanceNorm, LayerNorm  # noqa: E402

# How export() traces these layers to MXNet's operators (gluon/_export.py holds the tracers).
from .. import _export  # noqa: E402
from . import basic_layers as _basic, conv_layers as _conv  # noqa: E402

for _cls, _fn in ((_basic.Sequential, _export.sequential), (_basic.Dense, _export.dense),
                  (_basic.Activation, _export.activation), (_basic.Dropout, _export.dropout),
                  (_basic.Flatten, _export.flatten), (_conv.ConvBase, _export.conv), (_conv.PoolBase, _export.pool),
                  (BatchNorm, _export.batchnorm), (LayerNorm, _export.layernorm),
                  (InstanceNorm, _export.instancenorm)):
    _export.register(_cls, _fn)
del _cls, _fn
from .fused_layers import BatchNormAddRelu  # noqa: E402

__all__ = [
    "ELU",
    "GELU",
    "SELU",
    "Activation",
    "AvgPool1D",
    "AvgPool2D",
    "AvgPool3D",
    "BatchNorm",
    "BatchNormAddRelu",
    "Block",
    "Conv1D",
    "Conv1DTranspose",
    "Conv2D",
    "Conv2DTranspose",
    "Conv3D",
    "Conv3DTranspose",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "GlobalAvgPool1D",
    "GlobalAvgPool2D",
    "GlobalAvgPool3D",
    "GlobalMaxPool1D",
    "GlobalMaxPool2D",
    "GlobalMaxPool3D",
    "HybridBlock",
    "HybridLambda",
    "HybridSequential",
    "InstanceNorm",
    "Lambda",
    "LayerNorm",
    "LeakyReLU",
    "MaxPool1D",
    "MaxPool2D",
    "MaxPool3D",
    "ReflectionPad2D",
    "PReLU",
    "Sequential",
    "Swish",
    "SymbolBlock",
]


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise features.missing("nn", name, obj=sys.modules[__name__])
