"""``mx.sym.contrib``: MXNet's contrib operators on Symbols (``sym.contrib.box_nms`` is the ``_contrib_box_nms``
node), for the ones nd/_mxnet_params.py declares."""

from __future__ import annotations


def __getattr__(name: str):
    from ._operators import prefixed_op_function  # here, not at the top: no module attribute of that name
    fn = prefixed_op_function("_contrib_", name, __name__)
    globals()[name] = fn  # made once: MXNet's are module attributes, tested by identity (GluonCV: norm_layer is ...)
    return fn
