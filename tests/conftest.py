"""Shared pytest setup: the ``gpu`` marker skips cleanly when no usable GPU is present."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest

# Tests run from a source checkout without installing (PYTHONPATH=. or not): make `import dnnbind` work.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Conv algorithm choices persist on disk (ops.algo_cache); tests keep theirs out of the user's ~/.cache.
os.environ["DNNBIND_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnnbind-test-cache-")
atexit.register(shutil.rmtree, os.environ["DNNBIND_CACHE_DIR"], ignore_errors=True)


def _gpu_count() -> tuple[int, str]:
    try:
        from dnnbind.runtime.device import gpu_status
        return gpu_status()
    except Exception as exc:  # cuda-python missing or broken: no GPU for tests
        return 0, str(exc)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped cleanly without one")
    config.addinivalue_line("markers", "slow: minutes on the CPU (still part of the default run)")


def pytest_report_header(config):
    count, why = _gpu_count()
    return f"dnnbind: {count} GPU(s)" if count else f"dnnbind: no GPU, tests marked gpu skip: {why}"


def pytest_collection_modifyitems(config, items):
    count, why = _gpu_count()
    if count:
        return
    # One short reason per skip; the long one (what was found, how to fix it) is printed once in the header.
    skip = pytest.mark.skip(reason="needs a GPU (none usable: see the header)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu():
    import dnnbind
    return dnnbind.gpu(0)


@pytest.fixture
def alias():
    """install_mxnet_alias() for one test; sys.meta_path and the mxnet entries of sys.modules are restored
    afterwards (shared by the alias and Gluon-semantics tests)."""
    import dnnbind
    from dnnbind.mxnet import uninstall_mxnet_alias
    meta, mods = list(sys.meta_path), dict(sys.modules)
    yield dnnbind.install_mxnet_alias()
    uninstall_mxnet_alias()
    sys.meta_path[:] = meta
    for name in [n for n in sys.modules if n not in mods]:
        if name == "mxnet" or name.startswith("mxnet."):
            del sys.modules[name]
    for name, mod in mods.items():
        if name == "mxnet" or name.startswith("mxnet."):
            sys.modules[name] = mod
