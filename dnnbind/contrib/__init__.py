"""MXNet's ``mx.contrib`` pieces dnnbind has: ``contrib.text`` (vocabularies and token embeddings read from disk).
Layer: top (beside gluon); its modules import nd, runtime and gluon.data's MXNET_HOME helper.

``mx.contrib.amp`` is dnnbind.amp; MXNet's other contrib packages (onnx, quantization, ...) are not here.
"""

from . import text  # noqa: F401

__all__ = ["text"]
