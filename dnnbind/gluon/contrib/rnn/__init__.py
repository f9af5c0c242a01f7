"""Contributed recurrent cells (``mxnet.gluon.contrib.rnn``): VariationalDropoutCell, LSTMPCell.
Layer: gluon; imports gluon.rnn.

MXNet 1.9.1's convolutional cells (``Conv2DLSTMCell``, ...) raise UnsupportedFeature naming them; a typo a plain
AttributeError.
"""

import sys

from ....features import UnsupportedFeature
from . import rnn_cell
from .rnn_cell import LSTMPCell, VariationalDropoutCell

__all__ = ["LSTMPCell", "VariationalDropoutCell", "rnn_cell"]

_MXNET_NAMES = frozenset([f"Conv{d}D{kind}Cell" for d in (1, 2, 3) for kind in ("RNN", "LSTM", "GRU")]
                         + ["conv_rnn_cell"])


def __getattr__(name: str):
    if name in _MXNET_NAMES:
        raise UnsupportedFeature(f"mxnet.gluon.contrib.rnn.{name} is not supported by dnnbind yet: convolutional "
                                 "recurrent cells")
    raise AttributeError(f"module 'mxnet.gluon.contrib.rnn' (dnnbind) has no attribute {name!r}", name=name,
                         obj=sys.modules[__name__])
