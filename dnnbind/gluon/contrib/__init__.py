"""Contributed Gluon blocks (``mxnet.gluon.contrib``): so far the recurrent cells of ``contrib.rnn``.
Layer: gluon; imports gluon.rnn.

MXNet 1.9.1's other contrib namespaces (``nn``, ``cnn``, ``data``, ``estimator``) raise UnsupportedFeature naming
them (``__getattr__`` below); a typo a plain AttributeError.
"""

import sys

from ...features import UnsupportedFeature
from . import rnn

__all__ = ["rnn"]

_MXNET_NAMES = frozenset(["nn", "cnn", "data", "estimator"])


def __getattr__(name: str):
    if name in _MXNET_NAMES:
        raise UnsupportedFeature(f"mxnet.gluon.contrib.{name} is not supported by dnnbind yet")
    raise AttributeError(f"module 'mxnet.gluon.contrib' (dnnbind) has no attribute {name!r}", name=name,
                         obj=sys.modules[__name__])
