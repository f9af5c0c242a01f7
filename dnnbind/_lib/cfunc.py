"""Layer 0 (_lib): declare each C function once. Imports nothing of dnnbind but loader and hooks.

A ``Library`` holds a table ``{c_name: (restype, argtypes)}`` and binds an entry the first time it is
used: ``argtypes``/``restype`` set, and for status-returning functions an ``errcheck`` that raises the
library's exception, so call sites read like C and can never forget the check (tinygrad's DLL.bind,
vLLM's cuda_wrapper table). Binding lazily means a function removed from a newer library breaks only
its own callers, never the import (the cudnn-python-wrappers failure mode).
"""

from __future__ import annotations

import ctypes
from typing import Callable

from . import loader

# TRACING (non-empty while dnnbind.trace() is active) and RECORDING (while graph.RecordedStep records) live in
# hooks, the module cross-cutting services hang on; re-exported here for compatibility: the same list objects.
from .hooks import RECORDING, TRACING  # noqa: F401

# Short names for the ctypes types the tables use. Pointers travel as ints (c_void_p).
i32, u32, i64, size_t = ctypes.c_int, ctypes.c_uint, ctypes.c_int64, ctypes.c_size_t
f32, f64, vp, cstr = ctypes.c_float, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p
P = ctypes.POINTER



class Library:
    """Lazily bound functions of one shared library: ``lib.cudnnCreate(...)``."""

    # Set only while a trace is active: ``hook(library, c_name, fn)`` wraps a function bound during the trace
    # and returns what to call. Only the binding path (once per function) looks at it.
    _on_bind: Callable | None = None

    def __init__(self, name: str, table: dict, errcheck: Callable | None):
        self._name, self._table, self._errcheck = name, table, errcheck

    def __getattr__(self, c_name: str):
        try:
            restype, argtypes = self._table[c_name]
        except KeyError:
            raise AttributeError(f"{c_name} is not declared in dnnbind's {self._name} table") from None
        handle = loader.load(self._name)
        try:
            fn = getattr(handle, c_name)
        except AttributeError:
            raise AttributeError(
                f"{c_name} is not exported by {loader.path(self._name)}; this {self._name} is too old or too new"
            ) from None
        fn.restype, fn.argtypes = restype, argtypes
        if restype is STATUS and self._errcheck is not None:
            fn.errcheck = self._errcheck
        # Cache on the instance: later lookups skip __getattr__ entirely (the hot path).
        setattr(self, c_name, fn)
        if Library._on_bind is not None:
            return Library._on_bind(self, c_name, fn)
        return fn

    def has(self, c_name: str) -> bool:
        try:
            getattr(self, c_name)
            return True
        except AttributeError:
            return False

    @property
    def name(self) -> str:
        return self._name


def intercept(libraries, wrap: Callable) -> Callable[[], None]:
    """Route every call to the functions of ``libraries`` through ``wrap(lib, c_name, fn)``'s result: those
    bound already (instance attributes) and those first bound while this is active (``Library._on_bind``).
    Returns the function that puts the originals back. Used by dnnbind.trace and graph.RecordedStep."""
    if Library._on_bind is not None:
        raise RuntimeError("the library functions are already intercepted (a trace or a recording is active)")
    patched = []

    def install(lib, c_name, fn):
        wrapped = wrap(lib, c_name, fn)
        patched.append((lib, c_name, fn))
        setattr(lib, c_name, wrapped)
        return wrapped

    for lib in libraries:
        for c_name, fn in list(vars(lib).items()):
            if c_name in lib._table:
                install(lib, c_name, fn)
    Library._on_bind = lambda lib, c_name, fn: (install(lib, c_name, fn) if any(lib is x for x in libraries)
                                                else fn)

    def undo() -> None:
        Library._on_bind = None
        for lib, c_name, fn in reversed(patched):
            setattr(lib, c_name, fn)
    return undo


class STATUS(ctypes.c_int):
    """Marks a function returning a status enum; its errcheck turns non-zero into an exception.

    A subclass of c_int as restype would be returned unconverted; errcheck receives it and we use .value.
    """
