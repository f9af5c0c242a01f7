"""``mxnet.base``: MXNetError and the type tuples MXNet code tests against. Layer: top (the MXNet alias);
imports dnnbind._lib.errors.

``MXNetError`` is ``dnnbind.DnnbindError``, the base of every error dnnbind raises on purpose (a CUDA, cuDNN or
cuBLAS failure, a missing library, a GPU that is not there), so d2l's probe
``try: nd.zeros((1,), ctx=mx.gpu()) except mx.base.MXNetError: ctx = mx.cpu()`` falls back the same way.
MXNet's C-library entry points (``_LIB``, ``check_call``, ``c_str``, ...) have no counterpart: using one
raises NotImplementedError.
"""

from __future__ import annotations

import sys

import numpy as np

from .._lib.errors import DnnbindError as MXNetError
from . import _unsupported
from ._unsupported import UnsupportedFeature

__all__ = ["MXNetError", "data_dir", "data_dir_default", "integer_types", "numeric_types", "py_str",
           "string_types"]

string_types = (str,)
numeric_types = (float, int, np.generic)
integer_types = (int, np.int32, np.int64)


def py_str(x) -> str:
    """bytes from a C API as str (str passes through)."""
    return x.decode("utf-8") if isinstance(x, (bytes, bytearray)) else x


def data_dir() -> str:
    """$MXNET_HOME, else ~/.mxnet: where data sets (datasets/<name>) and downloads live."""
    from ..gluon.data._home import data_dir as _data_dir  # lazy: this module loads no Gluon
    return _data_dir()


def data_dir_default() -> str:
    """~/.mxnet (%APPDATA%\\mxnet on Windows): data_dir() without MXNET_HOME."""
    from ..gluon.data._home import data_dir_default as _default
    return _default()


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if not (name in _unsupported.NAMES["base"] or name.startswith("_")):  # a typo, not an MXNet feature
        raise _unsupported.missing("base", name, obj=sys.modules[__name__])
    raise UnsupportedFeature(f"mxnet.base.{name} is not supported by dnnbind (MXNet's C library interface has "
                              "no counterpart here)")
