"""dnnbind._lib.hooks: the one module tracing and step recording hang on. It imports nothing of dnnbind, its
lists are the ones cfunc and dnnbind.trace expose, and its scope stack is per thread. No GPU needed."""

from __future__ import annotations

import ast
import ctypes
import threading
from pathlib import Path

import pytest

from dnnbind import trace
from dnnbind._lib import cfunc, hooks, loader

ROOT = Path(__file__).resolve().parent.parent


def test_hooks_imports_nothing_of_dnnbind():
    tree = ast.parse((ROOT / "dnnbind" / "_lib" / "hooks.py").read_text())
    imported = ["." * n.level + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m.startswith(("dnnbind", "."))], imported


def test_the_lists_are_shared():
    assert cfunc.TRACING is hooks.TRACING is trace.ACTIVE
    assert cfunc.RECORDING is hooks.RECORDING


def test_outside_a_trace_scopes_nest_and_the_rest_does_nothing():
    assert hooks.session() is None
    with hooks.scope("net"), hooks.scope("conv_forward", op=True):
        assert hooks.current_path() == ("net",) and hooks.path() == "net/conv_forward"
        hooks.annotate(x=(1, 2))
        hooks.record_numpy("conv_forward", 0.1)
        assert hooks.timed_numpy("op", lambda a, b=0: a + b, 2, b=3) == 5
    assert hooks.stack() == []
    with hooks.scopes(("net", "conv0")):
        assert hooks.path() == "net/conv0/backward"
    assert hooks.stack() == []


@pytest.fixture
def libc(monkeypatch):
    real_load = loader.load
    monkeypatch.setattr(loader, "load", lambda name: ctypes.CDLL(None) if name == "fakec" else real_load(name))
    return cfunc.Library("fakec", {"abs": (ctypes.c_int, [ctypes.c_int])}, None)


def test_each_thread_names_its_calls_with_its_own_scopes(libc):
    inside, done = threading.Event(), threading.Event()

    def worker():
        with hooks.scope("worker"):
            inside.set()
            done.wait(5)
            libc.abs(-2)

    with trace(libraries=[libc]) as t, hooks.scope("main"):
        th = threading.Thread(target=worker)
        th.start()
        inside.wait(5)
        libc.abs(-1)  # the worker's scope is open now: it must not name this call
        done.set()
        th.join()
    assert sorted((r.scope, r.function) for r in t.records) == [("main", "abs"), ("worker", "abs")]
    assert {s[1] for s in t.spans} == {"main", "worker"}
    assert hooks.session() is None and hooks.stack() == []
