"""The import hook behind ``import mxnet``: a meta-path finder mapping ``mxnet`` and ``mxnet.<sub>`` to dnnbind
modules. Layer: top (the MXNet alias); imports dnnbind modules by name, lazily.

Nothing named ``mxnet`` is installed: the finder exists only in an interpreter where ``install_mxnet_alias()``
ran (``python -m dnnbind.mxnet`` runs it before the program), placed first on ``sys.meta_path`` so it wins
over a real MXNet. Each ``mxnet.<name>`` is served by the dnnbind module itself (``sys.modules["mxnet.gluon"]
is dnnbind.gluon``), so classes, isinstance checks and module state are shared between both spellings.
A target is looked up by name when first imported, so ``mxnet.random`` becomes ``dnnbind.nd.random`` as soon
as that module exists.

The same finder serves ``horovod`` and ``horovod.mxnet`` (dnnbind.horovod, over dnnbind.distributed and NCCL), but
only while no real Horovod can be imported: one that is installed always wins (see HOROVOD).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
import warnings

ALIAS = "mxnet"

# mxnet.<prefix> -> the dnnbind modules that back it, tried in order. The longest matching prefix wins and
# the rest of the dotted name follows it: mxnet.gluon.data.vision -> dnnbind.gluon.data.vision. Any other
# mxnet.<name> is dnnbind.mxnet.<name> (context, base, test_utils, the unsupported namespaces).
TARGETS: dict[str, tuple[str, ...]] = {
    "mxnet": ("dnnbind.mxnet",),
    "mxnet.nd": ("dnnbind.nd",),
    "mxnet.ndarray": ("dnnbind.nd",),
    "mxnet.autograd": ("dnnbind.autograd",),
    "mxnet.gluon": ("dnnbind.gluon",),
    "mxnet.init": ("dnnbind.initializer",),
    "mxnet.initializer": ("dnnbind.initializer",),
    "mxnet.metric": ("dnnbind.gluon.metric",),
    "mxnet.optimizer": ("dnnbind.gluon.optimizer",),
    "mxnet.lr_scheduler": ("dnnbind.gluon.lr_scheduler",),
    "mxnet.kv": ("dnnbind.kvstore",),
    "mxnet.kvstore": ("dnnbind.kvstore",),
    "mxnet.io": ("dnnbind.io",),
    "mxnet.sym": ("dnnbind.symbol",),
    "mxnet.symbol": ("dnnbind.symbol",),
    "mxnet.model": ("dnnbind.model",),
    "mxnet.mod": ("dnnbind.module",),
    "mxnet.module": ("dnnbind.module",),
    "mxnet.callback": ("dnnbind.callback",),
    "mxnet.recordio": ("dnnbind.recordio",),
    "mxnet.operator": ("dnnbind.custom_op",),
    "mxnet.image": ("dnnbind.image",),
    "mxnet.name": ("dnnbind.symbol.name",),
    "mxnet.attribute": ("dnnbind.symbol.attribute",),
    "mxnet.random": ("dnnbind.nd.random", "dnnbind.mxnet.random"),  # the stand-in raises until nd.random exists
}


# horovod.<name> -> dnnbind's module, served only when no other finder can import a real ``horovod``.
HOROVOD: dict[str, str] = {"horovod": "dnnbind.horovod", "horovod.mxnet": "dnnbind.horovod.mxnet"}


def _real_horovod_exists() -> bool:
    """Whether a finder other than the alias's can import ``horovod`` (an installed Horovod)."""
    for finder in sys.meta_path:
        if isinstance(finder, MXNetAliasFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            if finder.find_spec("horovod", None) is not None:
                return True
        except Exception:  # noqa: BLE001  (a third-party finder's failure is not a Horovod)
            continue
    return False


def load_horovod(fullname: str) -> types.ModuleType | None:
    """dnnbind's module for ``horovod`` / ``horovod.mxnet``; None when a real Horovod is there (or is already
    imported) or the name is one dnnbind does not have (horovod.torch)."""
    if fullname == "horovod":
        if _real_horovod_exists():
            return None
    elif not _is_ours(sys.modules.get("horovod")):
        return None
    name = HOROVOD.get(fullname)
    return importlib.import_module(name) if name is not None else None


def targets(fullname: str) -> tuple[str, ...]:
    """The dnnbind module names that may back ``fullname`` (``mxnet`` or ``mxnet.<...>``), in order."""
    parts = fullname.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in TARGETS:
            return tuple(".".join([t, *parts[i:]]) for t in TARGETS[head])
    return ("dnnbind.mxnet." + ".".join(parts[1:]),)


def load(fullname: str) -> types.ModuleType | None:
    """Import and return the dnnbind module behind ``fullname``; None when there is none.

    An ImportError from *inside* an existing target (a missing third-party package) propagates: only a
    target that does not exist moves on to the next one.
    """
    from . import _unsupported
    rest = fullname[len(ALIAS) + 1:]
    if rest in _unsupported.NAMESPACES or rest in _unsupported.REAL:
        _unsupported.install(rest)
    for name in targets(fullname):
        try:
            module = importlib.import_module(name)
            _unsupported.attach(module)  # mxnet.gluon, mxnet.nd: MXNet's names dnnbind lacks name the feature
            return module
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
    if rest in _unsupported.CHILDREN:  # e.g. mxnet.gluon.rnn while dnnbind.gluon.rnn does not exist
        return _unsupported.child(rest)
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system an already imported dnnbind module instead of executing anything."""

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.own_spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        # NOTE: the import system set module.__spec__ to the alias spec (the one attribute it overwrites on a
        # module returned by create_module); the dnnbind module keeps its own, so relative imports inside it,
        # reload() and pickling by module name keep working.
        module.__spec__ = self.own_spec


def _standin_for_dnnbind_name(fullname: str, path) -> types.ModuleType | None:
    """The stand-in for an unbacked child asked for by its dnnbind name, while no such dnnbind module exists.

    ``from mxnet.gluon import rnn`` looks for ``dnnbind.gluon.rnn``: the import system names a from-import's
    submodule after the parent's own ``__name__``, and ``sys.modules["mxnet.gluon"]`` is ``dnnbind.gluon``.
    """
    from . import _unsupported
    for ns in _unsupported.CHILDREN:
        if fullname in targets(f"{ALIAS}.{ns}"):
            if path is not None and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
                return None  # dnnbind has it now: the real module wins
            return _unsupported.child(ns)
    return None


class MXNetAliasFinder(importlib.abc.MetaPathFinder):
    """``mxnet`` and ``mxnet.*`` -> dnnbind modules (see TARGETS), ``horovod.mxnet`` -> dnnbind.horovod.mxnet when
    no real Horovod is installed; every other name is left to later finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == ALIAS or fullname.startswith(ALIAS + "."):
            module = load(fullname)  # None: the import system raises "No module named 'mxnet.<...>'"
        elif fullname == "horovod" or fullname.startswith("horovod."):
            module = load_horovod(fullname)
        elif fullname.startswith("dnnbind."):
            module = _standin_for_dnnbind_name(fullname, path)
        else:
            return None
        if module is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module),
                                              is_package=hasattr(module, "__path__"))


_lock = threading.Lock()


def _is_ours(module) -> bool:
    return (getattr(module, "__name__", "") or "").split(".")[0] == "dnnbind"


def install_mxnet_alias() -> types.ModuleType:
    """Make ``import mxnet`` (and ``mxnet.<sub>``) resolve to dnnbind in this interpreter, and ``import
    horovod.mxnet`` too where no real Horovod is installed; returns the module that ``import mxnet as mx`` then
    gives. Idempotent.

    Meant for notebooks and embedding: ``import dnnbind; mx = dnnbind.install_mxnet_alias()``. Run it before
    the code that imports mxnet. A real MXNet already imported is dropped from ``sys.modules`` with a warning:
    later imports get dnnbind, names bound before the call keep the real MXNet objects.
    """
    with _lock:
        if not any(isinstance(f, MXNetAliasFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, MXNetAliasFinder())
        from . import _unsupported
        for name in _unsupported.BACKED:  # already imported (dnnbind.mxnet keeps mx.gluon once read): hook it now
            if name in sys.modules:
                _unsupported.attach(sys.modules[name])
        stale = [n for n, m in list(sys.modules.items())
                 if (n == ALIAS or n.startswith(ALIAS + ".")) and m is not None and not _is_ours(m)]
        if stale:
            where = getattr(sys.modules.get(ALIAS), "__file__", None) or "elsewhere"
            warnings.warn(f"install_mxnet_alias: mxnet was already imported (from {where}); later imports of "
                          "mxnet resolve to dnnbind, objects imported before keep the real MXNet",
                          RuntimeWarning, stacklevel=2)
            for n in stale:
                del sys.modules[n]
        # MXNet's default context is cpu(0): programs ask for mx.gpu() where they want it, and code that
        # mixes the two (d2l-zh's chapter 3 trains on CPU data with parameters made without ctx=) relies on it.
        from ..runtime import device as _device
        if _previous_default[0] is _UNSET:
            _previous_default[0] = _device.set_process_default_device(_device.cpu(0))
        # d2l-zh's use_svg_display() calls IPython.display.set_matplotlib_formats, which IPython 9 removed.
        from . import _ipython_compat
        _ipython_compat.install()
        # MXNet-era code reads IDX files with np.fromstring's binary mode and uses np.float & co.: numpy 2 removed them.
        from . import _numpy_compat
        _numpy_compat.install()
    return importlib.import_module(ALIAS)


_UNSET = object()
_previous_default: list = [_UNSET]  # the process default before install_mxnet_alias(), restored by uninstall


def uninstall_mxnet_alias() -> None:
    """Undo install_mxnet_alias(): remove the finder and the ``mxnet`` entries it put in ``sys.modules``."""
    from . import _unsupported
    standins = {id(m) for m in _unsupported.child_standins.values()}
    with _lock:
        if _previous_default[0] is not _UNSET:
            from ..runtime import device as _device
            _device.set_process_default_device(_previous_default[0])
            _previous_default[0] = _UNSET
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, MXNetAliasFinder)]
        _unsupported.detach_all()
        for n, m in list(sys.modules.items()):
            served = n == ALIAS or n.startswith(ALIAS + ".") or n in HOROVOD
            if (served and _is_ours(m)) or id(m) in standins:
                del sys.modules[n]
        # Importing a stand-in set it as an attribute of its dnnbind parent (dnnbind.gluon.rnn): undo that too.
        for ns, standin in _unsupported.child_standins.items():
            for name in targets(f"{ALIAS}.{ns}"):
                parent, _, leaf = name.rpartition(".")
                if getattr(sys.modules.get(parent), leaf, None) is standin:
                    delattr(sys.modules[parent], leaf)


def is_installed() -> bool:
    return any(isinstance(f, MXNetAliasFinder) for f in sys.meta_path)
