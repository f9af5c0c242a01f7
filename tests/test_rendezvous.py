"""dnnbind.distributed: the TCP rendezvous (rank 0's blob reaches every rank), init() and its fallbacks."""

import socket
import threading
import time

import pytest

from dnnbind import distributed
from dnnbind.distributed import RendezvousError, barrier, exchange


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(ranks, world_size, port, blob=b"", timeout=10.0):
    """Run exchange on threads, one per entry of `ranks`; return {index: result or exception}."""
    results = {}

    def go(i, r):
        try:
            results[i] = exchange(blob if r == 0 else None, r, world_size, "127.0.0.1", port, timeout)
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=go, args=(i, r), daemon=True) for i, r in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not any(t.is_alive() for t in threads), "rendezvous hung"
    return results


def test_blob_reaches_every_rank_intact():
    blob = bytes(range(128))
    results = _run_ranks([3, 1, 0, 2], 4, _free_port(), blob)  # peers start before rank 0 listens
    assert all(v == blob for v in results.values()), results


def test_world_of_one_needs_no_network():
    assert exchange(b"x" * 128, 0, 1, "127.0.0.1", 1, 0.1) == b"x" * 128


def test_repeated_exchanges_on_one_port():
    port = _free_port()
    for k in range(3):
        results = _run_ranks([0, 1, 2], 3, port, bytes([k]) * 128)
        assert all(v == bytes([k]) * 128 for v in results.values()), results


def test_missing_peer_times_out_naming_it():
    port = _free_port()
    t0 = time.monotonic()
    results = _run_ranks([0, 1], 3, port, b"id", timeout=1.0)
    assert time.monotonic() - t0 < 5
    for v in results.values():
        assert isinstance(v, TimeoutError), results
        assert "[2]" in str(v) and f"127.0.0.1:{port}" in str(v)


def test_peer_without_rank0_times_out():
    port = _free_port()
    with pytest.raises(TimeoutError, match=r"rank 0 was not reachable.*\[0\]"):
        exchange(None, 1, 2, "127.0.0.1", port, 0.5)


def test_duplicate_rank_is_refused():
    port = _free_port()
    results = {}

    def go(i, r):
        try:
            results[i] = exchange(b"blob" if r == 0 else None, r, 3, "127.0.0.1", port, 5.0)
        except Exception as e:  # noqa: BLE001
            results[i] = e

    first = [threading.Thread(target=go, args=(i, r), daemon=True) for i, r in ((0, 0), (1, 1))]
    for t in first:
        t.start()
    time.sleep(0.3)  # rank 1 is in; rank 0 now waits for rank 2
    with pytest.raises(RendezvousError, match="duplicate RANK") as e:
        exchange(None, 1, 3, "127.0.0.1", port, 5.0)
    assert "rank 1" in str(e.value)
    go(2, 2)
    for t in first:
        t.join(5)
    assert results == {0: b"blob", 1: b"blob", 2: b"blob"}


def test_wrong_world_size_is_refused():
    port = _free_port()
    results = {}
    t = threading.Thread(target=lambda: results.setdefault(0, exchange(b"b", 0, 2, "127.0.0.1", port, 5.0)))
    t.start()
    with pytest.raises(RendezvousError, match="WORLD_SIZE=3"):
        exchange(None, 1, 3, "127.0.0.1", port, 5.0)
    assert exchange(None, 1, 2, "127.0.0.1", port, 5.0) == b"b"
    t.join(5)


def test_garbage_peer_does_not_break_rendezvous():
    port = _free_port()
    results = {}
    t = threading.Thread(target=lambda: results.setdefault(0, exchange(b"b", 0, 2, "127.0.0.1", port, 5.0)))
    t.start()
    deadline = time.monotonic() + 5
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    with s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert b"does not speak" in s.recv(1000)
    assert exchange(None, 1, 2, "127.0.0.1", port, 5.0) == b"b"
    t.join(5)
    assert results[0] == b"b"


def test_barrier():
    port = _free_port()
    done = []
    ts = [threading.Thread(target=lambda r=r: (barrier(r, 3, "127.0.0.1", port, 5.0), done.append(r)))
          for r in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert sorted(done) == [0, 1, 2]


def test_init_defaults_to_world_of_one(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    distributed.shutdown()
    assert not distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        distributed.rank()
    distributed.init()
    try:
        assert (distributed.rank(), distributed.world_size(), distributed.local_rank()) == (0, 1, 0)
        assert distributed.is_initialized()
    finally:
        distributed.shutdown()


def test_init_reads_environment_and_rejects_bad_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK=5"):
        distributed.init()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    distributed.init(barrier_on_init=False)
    try:
        assert (distributed.rank(), distributed.world_size(), distributed.local_rank()) == (3, 4, 1)
    finally:
        distributed.shutdown()


def test_nccl_unique_id_without_bindings_says_so(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "dnnbind._lib.nccl", None)  # makes the import fail
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    distributed.init()
    try:
        with pytest.raises(NotImplementedError, match="NCCL bindings"):
            distributed.nccl_unique_id()
    finally:
        distributed.shutdown()
