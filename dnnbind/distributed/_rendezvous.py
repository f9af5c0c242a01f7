"""A TCP rendezvous: rank 0 hands one blob (the 128-byte ncclUniqueId) to every rank, then all ranks barrier.

Layer: distributed; stdlib only (socket, struct, time), imports nothing of dnnbind.

Protocol, all integers big-endian. Every message starts with the header MAGIC (4 bytes) + VERSION (u16) + a
kind byte; a peer that speaks anything else is dropped with a clear error.

    peer -> rank 0   HELLO  rank (u32), world_size (u32)
    rank 0 -> peer   BLOB   length (u32), bytes            once every rank 1..world_size-1 has said hello
    peer -> rank 0   ACK
    rank 0 -> peer   GO                                     once every peer has acked: the barrier
    rank 0 -> peer   ERROR / TIMEOUT  length (u32), utf-8   instead of BLOB or GO when something is wrong

Rank 0 closes its listening socket as soon as the last hello is in, before any BLOB goes out, so a peer that
starts the next exchange on the same port can never reach the listener of the previous one.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import socket
import struct
import time

MAGIC = b"DNRV"
VERSION = 1
_HEADER = struct.Struct(">4sHc")
_U32 = struct.Struct(">I")
_HELLO, _BLOB, _ACK, _GO, _ERROR, _TIMEOUT = b"H", b"B", b"A", b"G", b"E", b"T"
_RETRY_S = 0.05  # pause between connection attempts while rank 0 is not listening yet
_REPORT_GRACE_S = 1.0  # a connected peer waits this much past its deadline for rank 0's list of missing ranks


class RendezvousError(RuntimeError):
    """A peer was refused (duplicate or out-of-range rank, wrong world size) or spoke another protocol."""


class _ReportedTimeout(TimeoutError):
    """Rank 0's own timeout message, passed on unchanged to a waiting peer."""


def exchange(blob_from_rank0: bytes | None, rank: int, world_size: int, addr: str = "127.0.0.1",
             port: int = 29500, timeout: float = 300.0) -> bytes:
    """Return rank 0's blob on every rank, after all world_size ranks have arrived (a barrier).

    Rank 0 passes the blob and listens on addr:port; the other ranks pass None and connect, retrying until
    `timeout` seconds have passed. Raises TimeoutError naming the missing ranks and the address.
    """
    if not 0 <= rank < world_size:
        raise DnnbindValueError(f"rank must be in [0, {world_size}), got {rank}")
    if rank == 0:
        if blob_from_rank0 is None:
            raise DnnbindValueError("rank 0 must pass the blob to broadcast")
        blob = bytes(blob_from_rank0)
        if world_size > 1:
            _serve(blob, world_size, addr, port, time.monotonic() + timeout, timeout)
        return blob
    return _join(rank, world_size, addr, port, time.monotonic() + timeout, timeout)


def barrier(rank: int, world_size: int, addr: str = "127.0.0.1", port: int = 29500,
            timeout: float = 300.0) -> None:
    """Return once all world_size ranks have called barrier with the same addr:port."""
    exchange(b"" if rank == 0 else None, rank, world_size, addr, port, timeout)


# -- rank 0 -----------------------------------------------------------------------------------------------------

def _serve(blob: bytes, world_size: int, addr: str, port: int, deadline: float, timeout: float) -> None:
    peers: dict[int, socket.socket] = {}
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((addr, port))
        except OSError as e:
            raise RendezvousError(f"rank 0 cannot listen on {addr}:{port}: {e} (is MASTER_ADDR an address of "
                                  f"this host, and is MASTER_PORT free?)") from e
        listener.listen(world_size)
        while len(peers) < world_size - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(1, world_size)) - set(peers))
                msg = (f"rendezvous at {addr}:{port} timed out after {timeout:g}s: rank(s) {missing} of "
                       f"world_size {world_size} never connected")
                for s in peers.values():
                    _try_send(s, _TIMEOUT, _text(msg))
                raise TimeoutError(msg)
            listener.settimeout(remaining)
            try:
                conn, _ = listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            peer = _greet(conn, peers, world_size, deadline)
            if peer is not None:
                peers[peer] = conn
        listener.close()  # NOTE: before any BLOB, so the next exchange on this port starts clean
        for s in peers.values():
            s.sendall(_msg(_BLOB, _U32.pack(len(blob)) + blob))
        for r, s in peers.items():
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                _expect(s, _ACK, f"rank {r}")
            except (socket.timeout, TimeoutError, ConnectionError) as e:
                msg = f"rendezvous at {addr}:{port}: rank {r} did not acknowledge the blob ({e})"
                for t in peers.values():
                    _try_send(t, _ERROR, _text(msg))
                raise TimeoutError(msg) from e
        for s in peers.values():
            s.sendall(_msg(_GO))
    finally:
        listener.close()
        for s in peers.values():
            s.close()


def _greet(conn: socket.socket, peers: dict[int, socket.socket], world_size: int, deadline: float) -> int | None:
    """Read one HELLO; return the peer's rank, or refuse it (telling it why) and return None."""
    conn.settimeout(max(min(deadline - time.monotonic(), 10.0), 0.001))
    try:
        body = _expect(conn, _HELLO, "a connecting peer", size=8)
        rank, ws = struct.unpack(">II", body)
    except (OSError, RendezvousError) as e:
        _try_send(conn, _ERROR, _text(f"rank 0 refused the connection: {e}"))
        conn.close()
        return None
    problem = None
    if ws != world_size:
        problem = f"rank {rank} says WORLD_SIZE={ws} but rank 0 has WORLD_SIZE={world_size}"
    elif not 1 <= rank < world_size:
        problem = f"rank {rank} is out of range for WORLD_SIZE={world_size} (expected 1..{world_size - 1})"
    elif rank in peers:
        problem = f"rank {rank} already connected: duplicate RANK (two workers started with RANK={rank}?)"
    if problem:
        _try_send(conn, _ERROR, _text(f"rank 0 refused the connection: {problem}"))
        conn.close()
        return None
    conn.settimeout(None)
    return rank


# -- ranks 1..world_size-1 --------------------------------------------------------------------------------------

def _join(rank: int, world_size: int, addr: str, port: int, deadline: float, timeout: float) -> bytes:
    where = f"rank {rank} at rendezvous {addr}:{port}"
    conn = _connect(addr, port, deadline)
    if conn is None:
        raise TimeoutError(f"{where}: rank 0 was not reachable within {timeout:g}s (missing rank: [0]; "
                           f"check MASTER_ADDR/MASTER_PORT, that rank 0 started, and that no other worker "
                           f"has RANK={rank}: rank 0 stops listening once every rank is in)")
    with conn:
        try:
            # NOTE: rank 0 knows which ranks are missing; give it time to say so before we give up ourselves.
            conn.settimeout(max(deadline - time.monotonic(), 0.001) + _REPORT_GRACE_S)
            conn.sendall(_msg(_HELLO, struct.pack(">II", rank, world_size)))
            body = _expect(conn, _BLOB, "rank 0", size=4)
            blob = _recv(conn, _U32.unpack(body)[0])
            conn.sendall(_msg(_ACK))
            _expect(conn, _GO, "rank 0")
        except _ReportedTimeout:
            raise
        except (socket.timeout, TimeoutError) as e:
            raise TimeoutError(f"{where}: rank 0 did not finish the rendezvous within {timeout:g}s "
                               f"(some other rank never arrived)") from e
        except ConnectionError as e:
            raise RendezvousError(f"{where}: rank 0 closed the connection ({e})") from e
        return blob


def _connect(addr: str, port: int, deadline: float) -> socket.socket | None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return socket.create_connection((addr, port), timeout=remaining)
        except (ConnectionRefusedError, ConnectionResetError, socket.timeout, TimeoutError, OSError):
            time.sleep(min(_RETRY_S, max(deadline - time.monotonic(), 0)))


# -- framing ----------------------------------------------------------------------------------------------------

def _msg(kind: bytes, body: bytes = b"") -> bytes:
    return _HEADER.pack(MAGIC, VERSION, kind) + body


def _text(s: str) -> bytes:
    b = s.encode()
    return _U32.pack(len(b)) + b


def _try_send(conn: socket.socket, kind: bytes, body: bytes) -> None:
    try:
        conn.settimeout(1.0)
        conn.sendall(_msg(kind, body))
    except OSError:
        pass


def _recv(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _expect(conn: socket.socket, kind: bytes, who: str, size: int = 0) -> bytes:
    """Read one header; return `size` body bytes of a `kind` message, or raise the error the peer sent."""
    magic, version, got = _HEADER.unpack(_recv(conn, _HEADER.size))
    if magic != MAGIC or version != VERSION:
        raise RendezvousError(f"{who} does not speak the dnnbind rendezvous protocol v{VERSION} "
                              f"(got magic {magic!r}, version {version})")
    if got in (_ERROR, _TIMEOUT):
        text = _recv(conn, _U32.unpack(_recv(conn, 4))[0]).decode(errors="replace")
        raise (_ReportedTimeout if got == _TIMEOUT else RendezvousError)(text)
    if got != kind:
        raise RendezvousError(f"{who} sent message {got!r}, expected {kind!r}")
    return _recv(conn, size)
