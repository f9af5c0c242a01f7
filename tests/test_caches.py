"""The process-wide caches: one entry per key even when threads race to make it, and a cap on their size.
No GPU needed: cuDNN descriptors are host objects (cudnnCreate*Descriptor works without one)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dnnbind._lib.errors import DnnbindError
from dnnbind.ops import _common, conv
from dnnbind.ops import descriptors as D
from dnnbind.runtime import handles

F32 = np.dtype(np.float32)


@pytest.fixture
def cudnn_host():
    """cuDNN's host side (descriptors) loads without a GPU; skip where the library itself is missing."""
    try:
        D.TensorDesc((1, 1, 1, 1), F32)
    except DnnbindError as exc:
        pytest.skip(f"cuDNN does not load here: {exc}")


def _race(fn, n: int = 8) -> list:
    """``fn()`` from ``n`` threads released together; their results."""
    barrier, out = threading.Barrier(n), [None] * n

    def run(i):
        barrier.wait()
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_cache_insert_makes_one_value_per_key_under_a_race():
    cache, lock, made = {}, threading.Lock(), []

    def make():
        time.sleep(0.01)  # widen the window a check-then-insert without the lock would lose
        made.append(object())
        return made[-1]

    got = _race(lambda: cache.get("k") or _common.cache_insert(cache, "k", make, lock, 10))
    assert len(made) == 1 and all(g is made[0] for g in got) and cache == {"k": made[0]}


def test_cache_insert_drops_the_oldest_beyond_the_limit():
    cache, lock = {}, threading.Lock()
    for i in range(7):
        assert _common.cache_insert(cache, i, lambda i=i: f"v{i}", lock, 4) == f"v{i}"
    assert list(cache) == [3, 4, 5, 6]
    assert _common.cache_insert(cache, 5, lambda: "other", lock, 4) == "v5"  # present: not made again


def test_descriptor_cache_is_capped_and_dropped_descriptors_are_freed(monkeypatch, cudnn_host):
    monkeypatch.setattr(D, "_cache", {})
    monkeypatch.setattr(D, "CACHE_LIMIT", 3)
    first = D.tensor((2, 3, 4, 5), F32)
    assert D.tensor((2, 3, 4, 5), F32) is first  # a hit: the same object
    finalizer = first._finalizer
    del first
    for n in range(3, 6):
        D.tensor((n, 3, 4, 5), F32)
    assert len(D._cache) == 3 and ("t", (2, 3, 4, 5), F32) not in D._cache
    assert not finalizer.alive  # cudnnDestroyTensorDescriptor ran once nothing held it


def test_descriptor_race_builds_one(monkeypatch, cudnn_host):
    monkeypatch.setattr(D, "_cache", {})
    got = _race(lambda: D.filt((8, 3, 3, 3), F32))
    assert len({id(g) for g in got}) == 1 and len(D._cache) == 1


def test_conv_setup_race_and_cap(monkeypatch, cudnn_host):
    monkeypatch.setattr(conv, "_plans", {})
    got = _race(lambda: conv._setup("conv_forward", (2, 3, 8, 8), (4, 3, 3, 3), 1, 1, 1, 1, F32))
    assert len({id(g) for g in got}) == 1 and got[0].y_shape == (2, 4, 8, 8)
    monkeypatch.setattr(conv, "PLAN_LIMIT", 2)
    for n in range(1, 5):
        conv._setup("conv_forward", (n, 3, 8, 8), (4, 3, 3, 3), 1, 0, 1, 1, F32)
    assert len(conv._plans) == 2
    with pytest.raises(ValueError, match="conv_forward: x has 3 channels but w expects 2"):
        conv._setup("conv_forward", (2, 3, 8, 8), (4, 2, 3, 3), 1, 0, 1, 1, F32)
    assert len(conv._plans) == 2  # a refused argument set is not cached


def test_handle_creation_race_creates_one_per_stream(monkeypatch):
    created = []

    class FakeHandle:
        def __init__(self, device, stream):
            time.sleep(0.01)
            created.append(self)
            self.handle = 0x100 + len(created)

    table, stream = {}, object()
    monkeypatch.setattr(handles, "_register_exit", lambda: None)
    got = _race(lambda: table.get(stream) or handles._create(table, FakeHandle, None, stream))
    assert len(created) == 1 and all(g is created[0] for g in got) and table[stream] is created[0]


@pytest.mark.gpu
def test_large_conv_scratch_is_borrowed_for_the_call_and_small_scratch_is_shared():
    """ops._common.scratch: up to SHARED_WORKSPACE_MAX the stream's shared workspace (the same pointer each time);
    beyond it a buffer of its own that goes back to the pool when the call is queued (the shared one does not
    grow to it)."""
    import dnnbind as mx
    from dnnbind.ops import _common
    from dnnbind.runtime.memory import pool_stats
    dev = mx.gpu(0)
    with _common.scratch(dev, 1 << 20) as (p1, n1):
        pass
    with _common.scratch(dev, 1 << 20) as (p2, n2):
        pass
    assert p1 == p2 and n1 >= 1 << 20
    shared = _common._workspaces[mx.current_stream(dev)].nbytes
    big = _common.SHARED_WORKSPACE_MAX + (64 << 20)
    mx.current_stream(dev).synchronize()
    before = pool_stats(dev)["used"]
    with _common.scratch(dev, big) as (p3, n3):
        assert n3 >= big and p3 != p1
        assert pool_stats(dev)["used"] >= before + big
    mx.current_stream(dev).synchronize()
    assert pool_stats(dev)["used"] < before + big  # freed once the call was queued
    assert _common._workspaces[mx.current_stream(dev)].nbytes == shared
