"""``mx.sym.linalg``: MXNet's linear-algebra operators on Symbols (``sym.linalg.gemm2`` is the ``_linalg_gemm2``
node), for the ones nd/_mxnet_params.py declares."""

from __future__ import annotations


def __getattr__(name: str):
    from ._operators import prefixed_op_function  # here, not at the top: no module attribute of that name
    return prefixed_op_function("_linalg_", name, __name__)
