"""Reference networks (``mxnet.gluon.model_zoo``): ``vision`` holds MXNet 1.9.1's 34 image classifiers, built with
MXNet's parameter names and shapes, and ``model_store`` finds their pretrained weights on disk (never downloaded).
Layer: gluon; imports gluon.nn, gluon.block and the standard library.
"""

from . import model_store, vision

__all__ = ["model_store", "vision"]
