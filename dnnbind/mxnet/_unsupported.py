"""MXNet namespaces dnnbind does not back yet: importable, and the first use says so. Layer: top (the MXNet
alias); imports nothing of dnnbind.

``import mxnet.contrib.onnx`` and ``from mxnet.contrib import onnx`` succeed; reading any attribute raises
NotImplementedError naming the namespace. Programs that never touch these features run; programs that do fail at the first use with a clear
message, never with a stand-in that computes something different. ``NAMESPACES`` are top-level (registered as
``dnnbind.mxnet.<ns>``); ``CHILDREN`` live under modules dnnbind does back (``mxnet.gluon.rnn``) and are handed
out by the alias only while dnnbind has no module of that name.

Single names follow the same rule wherever they are read: ``missing(ns, name)`` is the error for a name dnnbind
lacks, ``UnsupportedFeature`` when MXNet 1.9.1 has that name (``dnnbind.features.NAMES``: ``mx.gluon.nn.GroupNorm``,
``net.export``), a plain AttributeError for a typo. The modules of the alias and Gluon's Block, Parameter and
nn raise it from their ``__getattr__``; ``dnnbind.gluon`` and ``dnnbind.nd`` get one from ``attach()`` while the
alias is installed (they are served as ``mxnet.gluon`` and ``mxnet.nd`` themselves).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

from ..features import NAMES, PATHS, UnsupportedFeature, missing  # noqa: F401  (the alias modules read them here)

# MXNet 1.9's namespaces without a dnnbind implementation (dotted below ``mxnet``), with a hint where useful.
NAMESPACES: dict[str, str] = {
    "profiler": "MXNet's profiler; use dnnbind.trace()",
    "np": "MXNet's NumPy interface",
    "npx": "MXNet's NumPy extensions",
    "numpy": "MXNet's NumPy interface",
    "numpy_extension": "MXNet's NumPy extensions",
    "contrib": "",
    "contrib.onnx": "",
    "contrib.quantization": "",
    "contrib.autograd": "use mxnet.autograd",
    "contrib.io": "",
    "contrib.tensorboard": "",
    "rnn": "",
    "monitor": "",
    "onnx": "ONNX export",
    "rtc": "runtime-compiled CUDA kernels",
    "engine": "",
    "executor": "",
    "util": "",
    "runtime": "",
    "library": "",
    "visualization": "",
    "viz": "",
    "notebook": "",
    "log": "",
    "registry": "",
    "torch": "",
}

# Namespaces under an unbacked parent that dnnbind does back: ``mxnet.contrib.amp`` is dnnbind.amp (loss scaling for
# a network cast to float16), though ``mxnet.contrib`` itself is a stand-in.
REAL: dict[str, str] = {"contrib.amp": "dnnbind.amp", "contrib.text": "dnnbind.contrib.text",
                        "contrib.text.embedding": "dnnbind.contrib.text.embedding",
                        "contrib.text.vocab": "dnnbind.contrib.text.vocab",
                        "contrib.text.utils": "dnnbind.contrib.text.utils",
                        "contrib.ndarray": "dnnbind.nd.contrib", "contrib.symbol": "dnnbind.symbol.contrib",
                        # MXNet's mxnet.contrib has both spellings of each (d2l's anchor.md: contrib.nd.MultiBoxPrior)
                        "contrib.nd": "dnnbind.nd.contrib", "contrib.sym": "dnnbind.symbol.contrib"}

# Unbacked children of modules dnnbind does back (mxnet.gluon.rnn): served only through the alias, when the
# dnnbind module (dnnbind.gluon.rnn) does not exist; never registered under a dnnbind name.
CHILDREN: dict[str, str] = {
    "gluon.rnn": "recurrent layers",
    "gluon.contrib": "",
    "gluon.contrib.nn": "",
    "gluon.contrib.rnn": "",
    "gluon.contrib.estimator": "",
    "nd.sparse": "sparse storage",
    "ndarray.sparse": "sparse storage",
    "nd.contrib": "",
    "ndarray.contrib": "",
}
child_standins: dict[str, types.ModuleType] = {}  # ns -> the stand-in child(ns) made (uninstall removes them)


class UnsupportedModule(types.ModuleType):
    """A namespace whose every public attribute raises NotImplementedError (its listed children excepted)."""

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):  # introspection (hasattr(m, "__file__"), pickle, ...)
            raise AttributeError(attr)
        ns = self.__dict__.get("_mx_ns")
        if ns is None:
            raise AttributeError(attr)
        sub = f"{ns}.{attr}"
        if sub in NAMESPACES or sub in REAL:
            return install(sub)
        if sub in CHILDREN:
            return child(sub)
        hint = NAMESPACES.get(ns, "") or CHILDREN.get(ns, "")
        raise UnsupportedFeature(f"mxnet.{ns} is not supported by dnnbind yet (mxnet.{ns}.{attr} was used)"
                                  + (f": {hint}" if hint else ""))


# dnnbind modules served as MXNet's, which get a __getattr__ from attach() while the alias is installed.
BACKED = {"dnnbind.gluon": "gluon", "dnnbind.nd": "nd", "dnnbind.image": "image"}
_attached: dict[str, tuple] = {}  # module name -> (module, the __getattr__ it had or None)


def attach(module: types.ModuleType) -> None:
    """Give a module of BACKED a ``__getattr__`` for the names it lacks: its unbacked children (``gluon.rnn``,
    ``nd.sparse``: the stand-ins) and MXNet's other names (``missing``). A ``__getattr__`` the module has is asked
    first. Undone by ``detach_all`` (uninstall_mxnet_alias), so dnnbind's own namespace is left as it was."""
    ns = BACKED.get(getattr(module, "__name__", None))
    if ns is None or module.__name__ in _attached:
        return
    own = module.__dict__.get("__getattr__")

    def __getattr__(name: str):
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if f"{ns}.{name}" in CHILDREN:
            return child(f"{ns}.{name}")
        raise missing(ns, name, obj=module)

    _attached[module.__name__] = (module, own)
    module.__getattr__ = __getattr__


def detach_all() -> None:
    for module, own in _attached.values():
        if own is None:
            module.__dict__.pop("__getattr__", None)
        else:
            module.__getattr__ = own
    _attached.clear()


def install(ns: str) -> types.ModuleType:
    """The module for ``mxnet.<ns>``, made once and registered as ``dnnbind.mxnet.<ns>`` in sys.modules (with
    its parents), so ``import`` finds it like a file-backed module."""
    full = f"{__package__}.{ns}"
    mod = sys.modules.get(full)
    if mod is not None:
        return mod
    parent_ns, _, leaf = ns.rpartition(".")
    parent = install(parent_ns) if parent_ns else sys.modules[__package__]
    if ns in REAL:  # a real dnnbind module, registered under the alias's name too
        mod = importlib.import_module(REAL[ns])
        sys.modules[full] = mod
        setattr(parent, leaf, mod)
        return mod
    hint = NAMESPACES.get(ns, "")
    mod = UnsupportedModule(full, f"mxnet.{ns}: not supported by dnnbind yet" + (f" ({hint})" if hint else "")
                            + "; importing works, the first use raises NotImplementedError.")
    mod._mx_ns = ns
    mod.__path__ = []  # a package, so `import mxnet.contrib.text.embedding` can walk down to its children
    mod.__package__ = full
    mod.__spec__ = importlib.machinery.ModuleSpec(full, None, is_package=True)
    sys.modules[full] = mod
    setattr(parent, leaf, mod)
    return mod


def child(ns: str) -> types.ModuleType:
    """The stand-in for ``mxnet.<ns>``, an unbacked child of a backed module (see CHILDREN), made once."""
    mod = child_standins.get(ns)
    if mod is None:
        hint = CHILDREN.get(ns, "")
        mod = UnsupportedModule(f"mxnet.{ns}", f"mxnet.{ns}: not supported by dnnbind yet"
                                + (f" ({hint})" if hint else "") + "; the first use raises NotImplementedError.")
        mod._mx_ns = ns
        mod.__path__ = []
        mod.__package__ = mod.__name__
        mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None, is_package=True)
        mod = child_standins.setdefault(ns, mod)
    return mod
