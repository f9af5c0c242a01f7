"""Neural network layers (``mxnet.gluon.nn``). Layer: gluon; imports nd and gluon.block."""

from ..block import Block, HybridBlock, SymbolBlock
from .basic_layers import Activation, Dense, Dropout, Flatten, HybridLambda, HybridSequential, Lambda, Sequential
from .conv_layers import AvgPool2D, Conv2D, GlobalAvgPool2D, GlobalMaxPool2D, MaxPool2D

__all__ = [
           "Activation",
           "AvgPool2D",
           "Block",
           "Conv2D",
           "Dense",
           "Dropout",
           "Flatten",
           "GlobalAvgPool2D",
           "GlobalMaxPool2D",
           "HybridBlock",
           "HybridLambda",
           "HybridSequential",
           "Lambda",
           "MaxPool2D",
           "Sequential",
           "SymbolBlock",
]
