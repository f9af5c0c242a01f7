"""Contributed Gluon blocks (``mxnet.gluon.contrib``): ``nn`` (Concurrent, HybridConcurrent, Identity,
SparseEmbedding, SyncBatchNorm, PixelShuffle1D/2D/3D), ``cnn`` (the deformable convolutions) and ``rnn`` (the
recurrent cells). Layer: gluon; imports gluon.nn, gluon.rnn.

MXNet 1.9.1's other contrib namespaces (``data``, ``estimator``) raise UnsupportedFeature naming them
(``__getattr__`` below); a typo a plain AttributeError.
"""

import sys

from ...features import UnsupportedFeature
from . import cnn, nn, rnn

__all__ = ["cnn", "nn", "rnn"]

_MXNET_NAMES = frozenset(["data", "estimator"])


def __getattr__(name: str):
    if name in _MXNET_NAMES:
        raise UnsupportedFeature(f"mxnet.gluon.contrib.{name} is not supported by dnnbind yet")
    raise AttributeError(f"module 'mxnet.gluon.contrib' (dnnbind) has no attribute {name!r}", name=name,
                         obj=sys.modules[__name__])
