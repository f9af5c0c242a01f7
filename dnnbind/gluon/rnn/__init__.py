"""Recurrent cells and layers (``mxnet.gluon.rnn``, MXNet 1.9.1). Layer: gluon; imports nd and gluon.block.

Cells (rnn_cell.py) take one step per call and ``unroll`` a sequence from Python; layers (rnn_layer.py) run a whole
sequence, every layer and direction in one ``nd.RNN`` call.
"""

from . import rnn_cell, rnn_layer
from .rnn_cell import (
    BidirectionalCell,
    DropoutCell,
    GRUCell,
    HybridRecurrentCell,
    HybridSequentialRNNCell,
    LSTMCell,
    ModifierCell,
    RecurrentArgumentError,
    RecurrentCell,
    ResidualCell,
    RNNCell,
    SequentialRNNCell,
    ZoneoutCell,
)
from .rnn_layer import GRU, LSTM, RNN

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "BidirectionalCell",
    "DropoutCell",
    "GRUCell",
    "HybridRecurrentCell",
    "HybridSequentialRNNCell",
    "LSTMCell",
    "ModifierCell",
    "RNNCell",
    "RecurrentArgumentError",
    "RecurrentCell",
    "ResidualCell",
    "SequentialRNNCell",
    "ZoneoutCell",
    "rnn_cell",
    "rnn_layer",
]
