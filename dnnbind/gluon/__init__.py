"""Gluon (``mxnet.gluon``): Blocks, Parameters, layers, losses, Trainer, metrics, data.
Layer: gluon; imports dnnbind.nd, autograd, ops, runtime (and dnnbind.initializer).
"""

from . import loss, metric, nn, utils
from .block import Block, HybridBlock
from .symbol_block import SymbolBlock
from . import parameter as _parameter_module
from .parameter import Constant, DeferredInitializationError, Parameter
from .parameter_dict import ParameterDict

# MXNet spells it gluon.parameter.ParameterDict too; set here so that parameter.py (which ParameterDict builds
# on) need not import parameter_dict: no import cycle.
_parameter_module.ParameterDict = ParameterDict
from .trainer import StaleGradientError, Trainer
from . import rnn  # noqa: E402  (recurrent cells and layers)
from . import contrib  # noqa: E402  (contrib.rnn: VariationalDropoutCell, LSTMPCell)
from . import model_zoo  # noqa: E402  (model_zoo.vision: MXNet's 34 reference networks; MXNet imports it too)

try:
    from . import data
except ImportError as _exc:  # data is built beside this package; keep models and Trainer usable without it
    _data_error = _exc

    def __getattr__(name):
        if name == "data":
            raise ImportError(f"dnnbind.gluon.data could not be imported: {_data_error}") from _data_error
        raise AttributeError(f"module 'dnnbind.gluon' has no attribute {name!r}")

__all__ = [
    "Block",
    "Constant",
    "DeferredInitializationError",
    "HybridBlock",
    "Parameter",
    "ParameterDict",
    "StaleGradientError",
    "SymbolBlock",
    "Trainer",
    "contrib",
    "data",
    "loss",
    "metric",
    "model_zoo",
    "nn",
    "rnn",
    "utils",
]
