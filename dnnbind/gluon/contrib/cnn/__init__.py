"""Contributed convolution layers (``mxnet.gluon.contrib.cnn``): DeformableConvolution (DCN v1) and
ModulatedDeformableConvolution (DCN v2). Layer: gluon; imports nd, gluon.block, gluon.nn.
"""

from . import conv_layers
from .conv_layers import DeformableConvolution, ModulatedDeformableConvolution

__all__ = ["DeformableConvolution", "ModulatedDeformableConvolution", "conv_layers"]
