"""``IPython.display.set_matplotlib_formats`` under the MXNet alias. Layer: top (the MXNet alias); imports
nothing of dnnbind.

d2l-zh v1.0.0's ``d2lzh.use_svg_display()`` calls ``IPython.display.set_matplotlib_formats('svg')``. IPython 7.23
deprecated it and IPython 9 removed it, so every plotting notebook of the book stops in a current Jupyter, with
the real MXNet as well. Its maintained home is ``matplotlib_inline.backend_inline.set_matplotlib_formats``
(the package IPython itself uses for inline figures). Where IPython's module lacks the name, the alias adds one
that forwards there; an IPython that still has it is left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

MODULE = "IPython.display"


def set_matplotlib_formats(*formats, **kwargs) -> None:
    """``IPython.display.set_matplotlib_formats``: forwards to matplotlib-inline (``pip install matplotlib-inline``,
    part of the ``d2l`` extra)."""
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats as forward
    except ImportError as exc:
        raise ImportError("IPython.display.set_matplotlib_formats (removed in IPython 9) is provided under the "
                          "MXNet alias by matplotlib-inline: pip install matplotlib-inline") from exc
    forward(*formats, **kwargs)


def patch(module) -> None:
    if not hasattr(module, "set_matplotlib_formats"):
        module.set_matplotlib_formats = set_matplotlib_formats


class _PatchAfterExec(importlib.abc.Loader):
    """Runs IPython.display's own loader, then adds the missing name."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader)
        return spec


def install() -> None:
    """Patch IPython.display now if it is loaded, else when it is first imported (idempotent)."""
    if MODULE in sys.modules:
        patch(sys.modules[MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        # Just before the path finder, which would load IPython.display: the MXNet alias's finder stays first.
        at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
                  len(sys.meta_path))
        sys.meta_path.insert(at, _Finder())
