"""dnnbind.distributed: the TCP rendezvous (rank 0's blob reaches every rank), init() and its fallbacks."""

import socket
import struct
import threading
import time

import pytest

from dnnbind import distributed
from dnnbind.distributed import RendezvousError, barrier, exchange


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(ranks, world_size, port, blob=b"", timeout=10.0, secrets=None):
    """Run exchange on threads, one per entry of `ranks` (with the secret of the same index of `secrets`);
    return {index: result or exception}."""
    results = {}

    def go(i, r):
        try:
            key = None if secrets is None else secrets[i]
            results[i] = exchange(blob if r == 0 else None, r, world_size, "127.0.0.1", port, timeout, key)
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
        said = b""  # rank 0's challenge, then its refusal, then EOF
        while chunk := s.recv(1000):
            said += chunk
        assert b"does not speak" in said
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


# -- a stranger on the port (issue: the rendezvous is safe) ----------------------------------------------------

SECRET = bytes(range(32))


def _connect_when_listening(port, deadline_s=5.0):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "rank 0 never listened"
            time.sleep(0.02)


def _stranger_hello(nonce_from, rank, world_size, key):
    from dnnbind.distributed import _rendezvous as rv
    mac = rv._mac(key, nonce_from, rank, world_size)
    return rv.pack_message(rv._HELLO, struct.pack(">II", rank, world_size) + mac)


def _read_challenge(s):
    from dnnbind.distributed import _rendezvous as rv
    head = b""
    while len(head) < rv.HEADER.size + rv._NONCE:
        head += s.recv(rv.HEADER.size + rv._NONCE - len(head))
    return head[rv.HEADER.size:]


@pytest.mark.parametrize("attack", ["idle", "garbage", "huge length", "claims rank 1 without the secret",
                                    "claims rank 1 with another secret", "half a hello"])
def test_a_stranger_neither_stalls_nor_takes_a_rank(attack):
    """A stranger connects first and misbehaves; the real ranks, holding the job's secret, still meet at once
    (no 10 s stall behind an idle connection, no MemoryError from a length it claims) and get the real blob."""
    port = _free_port()
    blob = bytes(range(128))
    results = {}

    def rank(r):
        try:
            results[r] = exchange(blob if r == 0 else None, r, 2, "127.0.0.1", port, 20.0, SECRET)
        except Exception as e:  # noqa: BLE001
            results[r] = e

    t0 = threading.Thread(target=rank, args=(0,), daemon=True)
    t0.start()
    s = _connect_when_listening(port)
    with s:
        nonce = _read_challenge(s)
        if attack == "garbage":
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
        elif attack == "huge length":
            s.sendall(b"DNRV\x00\x02B" + b"\xff\xff\xff\xff")  # 11 bytes claiming a 2^32-1 byte body
        elif attack == "claims rank 1 without the secret":
            s.sendall(_stranger_hello(nonce, 1, 2, None))
        elif attack == "claims rank 1 with another secret":
            s.sendall(_stranger_hello(nonce, 1, 2, b"guess"))
        elif attack == "half a hello":
            s.sendall(_stranger_hello(nonce, 1, 2, None)[:20])
        start = time.monotonic()
        t1 = threading.Thread(target=rank, args=(1,), daemon=True)
        t1.start()
        t1.join(15)
        t0.join(15)
        took = time.monotonic() - start
    assert not t0.is_alive() and not t1.is_alive(), "rendezvous hung"
    assert results == {0: blob, 1: blob}, results
    assert took < 3.0, f"the real rank waited {took:.1f}s behind the stranger"


def test_a_rank_without_the_secret_is_refused_and_told_why():
    port = _free_port()
    results = _run_ranks([0, 1], 2, port, b"id", timeout=2.0, secrets=[SECRET, b"other"])
    assert isinstance(results[1], RendezvousError) and "authentication failed" in str(results[1]), results[1]
    assert isinstance(results[0], TimeoutError), results[0]


def test_a_fake_rank0_announcing_a_huge_blob_is_refused_without_allocating():
    from dnnbind.distributed import _rendezvous as rv
    port = _free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)

    def fake_rank0():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(rv.pack_message(rv._CHALLENGE, b"n" * rv._NONCE))
            conn.recv(1000)
            conn.sendall(rv.pack_message(rv._BLOB, struct.pack(">I", 2**32 - 1)))
            time.sleep(0.5)

    t = threading.Thread(target=fake_rank0, daemon=True)
    t.start()
    with pytest.raises(RendezvousError, match="over the limit"):
        exchange(None, 1, 2, "127.0.0.1", port, 5.0)
    t.join(5)
    srv.close()


def test_the_launcher_gives_its_ranks_one_secret_and_init_uses_it(monkeypatch):
    from dnnbind import launch
    monkeypatch.delenv(distributed.SECRET_ENV, raising=False)
    args = launch.parse_args(["--nproc-per-node", "2", "train.py"])
    envs = [launch.worker_env(args, lr, base={}) for lr in range(2)]
    assert envs[0][distributed.SECRET_ENV] == envs[1][distributed.SECRET_ENV]
    assert len(bytes.fromhex(envs[0][distributed.SECRET_ENV])) == 32
    assert launch.parse_args(["train.py"]).secret != args.secret  # one per job
    monkeypatch.setenv(distributed.SECRET_ENV, envs[0][distributed.SECRET_ENV])
    assert distributed.secret_from_env() == bytes.fromhex(envs[0][distributed.SECRET_ENV])


def test_several_nodes_need_a_shared_secret(monkeypatch, capsys):
    from dnnbind import launch
    monkeypatch.delenv(distributed.SECRET_ENV, raising=False)
    with pytest.raises(SystemExit):
        launch.parse_args(["--nnodes", "2", "--node-rank", "0", "train.py"])
    assert distributed.SECRET_ENV in capsys.readouterr().err
    monkeypatch.setenv(distributed.SECRET_ENV, "ab" * 32)
    assert launch.parse_args(["--nnodes", "2", "--node-rank", "1", "train.py"]).secret == "ab" * 32


# -- the launchers clusters already run ----------------------------------------------------------------------

@pytest.mark.parametrize("env, expect", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234",
      "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},  # torchrun inside a Slurm allocation is torchrun
     ("torchrun", 3, 8, 3, "10.0.0.1", 1234)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     ("openmpi", 5, 16, 1, "127.0.0.1", 29500)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MASTER_ADDR": "h0"},
     ("mpich", 2, 4, 0, "h0", 29500)),
    ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[03-05,9],cpu1"},
     ("slurm", 9, 16, 1, "gpu03", 29500)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1,n2",
      "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4000"},
     ("slurm", 0, 2, 0, "10.1.1.1", 4000)),
    ({}, ("none", 0, 1, 0, "127.0.0.1", 29500)),
])
def test_placement_reads_each_launchers_variables(env, expect):
    assert tuple(distributed.placement(env)) == expect


@pytest.mark.parametrize("nodelist, host", [("a1", "a1"), ("a1,a2", "a1"), ("node[001-004]", "node001"),
                                            ("gpu[7,9-10],x", "gpu7"), ("rack1-n[2-3]", "rack1-n2")])
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert distributed.first_host(nodelist) == host


def test_placement_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK=4"):
        distributed.placement({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="SLURM_NTASKS='x'"):
        distributed.placement({"SLURM_PROCID": "0", "SLURM_NTASKS": "x"})


class _FakeComm:
    """mpi4py's COMM_WORLD as rank 1 of 2 sees it: bcast returns what rank 0 sent."""

    def __init__(self):
        self.calls = []

    def Barrier(self):
        self.calls.append("Barrier")

    def bcast(self, obj, root=0):
        self.calls.append(("bcast", obj, root))
        return b"i" * 128


def test_under_mpirun_with_mpi4py_the_nccl_id_goes_through_mpi(monkeypatch):
    import sys
    import types
    comm = _FakeComm()
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(COMM_WORLD=comm)))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", sys.modules["mpi4py"].MPI)
    monkeypatch.setitem(sys.modules, "dnnbind._lib.nccl", types.SimpleNamespace(get_unique_id=lambda: b"x" * 128))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    distributed.init()  # no TCP port is opened or dialled: it would time out here, with no rank 0
    try:
        assert distributed.launcher() == "openmpi" and distributed.local_rank() == 1
        assert distributed.nccl_unique_id() == b"i" * 128
        assert comm.calls == ["Barrier", ("bcast", None, 0)]
    finally:
        distributed.shutdown()
