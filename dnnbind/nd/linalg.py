"""Layer nd: ``nd.linalg`` (MXNet's ``mx.nd.linalg``): the registry entries MXNet names ``_linalg_<op>`` (gemm, gemm2,
potrf, trsm, ...), once dnnbind has them; a name it lacks raises AttributeError."""

from __future__ import annotations


def __getattr__(name: str):
    from . import OPERATORS
    found = OPERATORS.get("_linalg_" + name)
    if found is None:
        raise AttributeError(f"module 'dnnbind.nd.linalg' has no attribute {name!r}")
    return found[1]
