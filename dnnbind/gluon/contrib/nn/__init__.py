"""Contributed neural-network layers (``mxnet.gluon.contrib.nn``): Concurrent, HybridConcurrent, Identity,
SparseEmbedding, SyncBatchNorm, PixelShuffle1D/2D/3D. Layer: gluon; imports nd, gluon.block, gluon.nn."""

from . import basic_layers
from .basic_layers import *  # noqa: F401,F403

__all__ = basic_layers.__all__
