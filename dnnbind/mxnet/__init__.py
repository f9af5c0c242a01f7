"""The ``mxnet`` alias: the module ``import mxnet as mx`` gives under ``python -m dnnbind.mxnet script.py`` or
after ``dnnbind.install_mxnet_alias()``. Layer: top (above gluon); imports runtime and _lib at import time,
every other dnnbind module lazily, on first attribute access.

``mx.nd``/``mx.ndarray``, ``mx.autograd``, ``mx.gluon``, ``mx.init``/``mx.initializer``, ``mx.metric``,
``mx.optimizer``, ``mx.lr_scheduler``, ``mx.random``, ``mx.kv``/``mx.kvstore``, ``mx.io``, ``mx.sym``, ``mx.model``,
``mx.mod``/``mx.module``, ``mx.callback`` and ``mx.operator`` (custom_op.py) are dnnbind's own modules (see
``_finder.TARGETS``); ``mx.context``, ``mx.base`` and ``mx.test_utils`` are small modules here; the namespaces dnnbind
does not back (``mx.profiler``, ``mx.contrib.onnx``, ...) import fine and raise
NotImplementedError naming the feature on first use. Any other name MXNet 1.9.1 has (``mx.use_np``, and through
the alias ``mx.gluon.rnn.LSTM``, ``mx.nd.Correlation``, ``mx.gluon.nn.GroupNorm``) raises UnsupportedFeature naming it; a name
MXNet lacks too is a plain AttributeError (see _unsupported.missing). ``mx.img`` and ``mx.rnd`` are ``mx.image``
and ``mx.random``, as in MXNet. ``import dnnbind.mxnet as mx`` works too, without the import hook.
"""

from __future__ import annotations

import sys

from . import _unsupported
from ._finder import install_mxnet_alias, uninstall_mxnet_alias
from .base import MXNetError
from .context import Context, cpu, cpu_pinned, current_context, gpu, num_gpus

__version__ = "1.9.1"  # the MXNet release whose Python API this mirrors (what version checks compare to)

__all__ = ["Context", "MXNetError", "cpu", "cpu_pinned", "current_context", "gpu", "install_mxnet_alias",
           "num_gpus", "uninstall_mxnet_alias"]

# Resolved on first access through the same table as `import mxnet.<name>`, so both give the same module.
_LAZY = frozenset(["recordio", "nd", "ndarray", "autograd", "gluon", "init", "initializer", "metric", "optimizer",
                   "lr_scheduler", "random", "image", "test_utils", "kv", "kvstore", "io", "sym", "symbol",
                   "model", "name", "attribute", "mod", "module", "callback", "operator"])
_ALIASES = {"img": "image", "rnd": "random"}


def __getattr__(name: str):
    if name in _LAZY:
        from . import _finder
        module = _finder.load(f"{_finder.ALIAS}.{name}")
        globals()[name] = module
        return module
    if name == "AttrScope":  # mx.AttrScope is mx.attribute.AttrScope
        return __getattr__("attribute").AttrScope
    if name in _ALIASES:  # MXNet's short names: mx.img is mx.image, mx.rnd is mx.random
        return __getattr__(_ALIASES[name])
    if name in _unsupported.NAMESPACES:  # mx.recordio, mx.contrib, ...: made on first access
        return _unsupported.install(name)
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise _unsupported.missing("mx", name, obj=sys.modules[__name__])  # mx.use_np: the feature; mx.gluonn: a typo


def __dir__() -> list:
    return sorted(set(globals()) | _LAZY | set(_ALIASES) | {n for n in _unsupported.NAMESPACES if "." not in n})
