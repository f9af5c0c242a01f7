"""Layer 0 (_lib): the hooks that cross-cutting services (tracing, step recording) hang on. Imports nothing of
dnnbind, only the standard library, so every layer may import it at module level without an import cycle.

- ``TRACING``: non-empty while a ``dnnbind.trace()`` is active (it holds the active traces; ``dnnbind.trace.
  ACTIVE`` is this same list). Hot paths test it with one lookup, ``if TRACING:``, and only then call the scope
  functions below; outside a trace nothing else is looked at.
- ``RECORDING``: non-empty while ``dnnbind.graph.RecordedStep`` records a step. The layers that queue GPU work
  outside the cuDNN/cuBLAS tables (kernel launches, memcpy/memset) test it the same way and hand the call to
  ``RECORDING[-1]``.
- ``DEFERRING``: non-empty while an eager Block call's ops are captured or checked against an earlier call's
  (``dnnbind.eager_replay``). The op dispatch (``nd.invoke``) and the runtime's view (``NDArray.reshape``) test
  it the same way and hand the call to ``DEFERRING[-1]``; memcpy, memset and kernel launches call
  ``DEFERRING[-1].device_work()`` before they queue anything.
- The scope stack: ``scope(name)``/``push``/``pop`` name the calls made inside (a Block's name, an op's name);
  ``annotate`` attaches facts to the next recorded call; ``timed_numpy`` times a numpy-backend op. The stack is
  per thread (as autograd's recording state is): the calls a thread makes are named by that thread's scopes.
  The tracer registers itself with ``set_session`` on entry and ``set_session(None)`` on exit; without one the
  functions below keep the stack and do nothing else.

A session is any object with ``on_push(name) -> token``, ``on_pop(name, path, t0, token)``, ``annotate(info)``
and ``record_numpy(op_name, seconds)`` (dnnbind.trace's session is the one in use).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DEFERRING", "RECORDING", "TRACING", "annotate", "current_path", "deferrable", "path", "pop", "push",
           "record_numpy", "scope", "scopes", "session", "set_session", "stack", "timed_numpy"]

TRACING: list = []
RECORDING: list = []
DEFERRING: list = []


def deferrable(fn: Callable) -> Callable:
    """``fn`` (an ``nd`` function outside the op registry that computes arrays from arrays, such as a fused loss)
    becomes one op for ``DEFERRING``: while a session is active the call goes to ``DEFERRING[-1].invoke(fn, args,
    kwargs)``, which either runs ``fn`` itself or defers it. Without a session, one list test and the call."""
    def call(*args, **kwargs):
        if DEFERRING:
            return DEFERRING[-1].invoke(fn, args, kwargs)
        return fn(*args, **kwargs)
    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.__wrapped__ = fn
    return call

_tls = threading.local()
_session: Any = None  # the active trace session (one per process: the library functions it wraps are global)


def set_session(s: Any) -> None:
    """The tracer's entry (``s``) and exit (None)."""
    global _session
    _session = s


def session() -> Any:
    return _session


def stack() -> list:
    """This thread's open scopes, outermost first: (name, marked as an op, perf_counter at push, token)."""
    try:
        return _tls.scopes
    except AttributeError:
        s = _tls.scopes = []
        return s


def path(depth: int | None = None) -> str:
    """"net/conv0/conv_forward": the names of this thread's ``depth`` outermost open scopes (all by default)."""
    st = stack()
    return "/".join(e[0] for e in (st if depth is None else st[:depth]))


def push(name: str, op: bool = False) -> None:
    """Enter a scope (a Block's name, an op's name); ``op=True`` marks an op name that dnnbind.ops lacks."""
    s = _session
    token = s.on_push(name) if s is not None else None
    stack().append((name, op, time.perf_counter(), token))


def pop() -> None:
    st = stack()
    full = "/".join(e[0] for e in st)
    name, _, t0, token = st.pop()
    s = _session
    if s is not None:
        s.on_pop(name, full, t0, token)


@contextmanager
def scope(name: str, op: bool = False) -> Iterator[None]:
    push(name, op)
    try:
        yield
    finally:
        pop()


def current_path() -> tuple:
    """The scope names now open, ops excluded (e.g. ("simplecnn", "conv1")); autograd keeps it to replay it
    around the backward of what was taped there."""
    return tuple(name for name, op, _, _ in stack() if not op)


@contextmanager
def scopes(names: tuple, suffix: str = "backward") -> Iterator[None]:
    """Re-enter a recorded scope path, then ``suffix`` (a backward runs outside the Blocks whose forward taped
    it)."""
    for name in names:
        push(name)
    push(suffix)
    try:
        yield
    finally:
        for _ in range(len(names) + 1):
            pop()


def annotate(**info: Any) -> None:
    """Attach ``info`` (shapes, dtypes, math mode...) to the next recorded call that does GPU work."""
    s = _session
    if s is not None:
        s.annotate(info)


def record_numpy(op_name: str, seconds: float) -> None:
    """Record an op the numpy backend ran in ``seconds`` (library "numpy"); nothing outside a trace."""
    s = _session
    if s is not None:
        s.record_numpy(op_name, seconds)


def timed_numpy(op_name: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recorded as the numpy call of ``op_name``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    record_numpy(op_name, time.perf_counter() - t0)
    return out
