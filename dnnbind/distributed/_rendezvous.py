"""A TCP rendezvous: rank 0 hands one blob (the 128-byte ncclUniqueId) to every rank, then all ranks barrier.

Layer: distributed; stdlib only (socket, selectors, hmac), imports nothing of dnnbind but its error classes.

Protocol, all integers big-endian. Every message starts with the header MAGIC (4 bytes) + VERSION (u16) + a
kind byte; a peer that speaks anything else is dropped with a clear error.

    rank 0 -> peer   CHALLENGE  nonce (16 bytes)             on accept
    peer -> rank 0   HELLO  rank (u32), world_size (u32), HMAC-SHA256(secret, nonce + rank + world_size)
    rank 0 -> peer   BLOB   length (u32), bytes            once every rank 1..world_size-1 has said hello
    peer -> rank 0   ACK
    rank 0 -> peer   GO                                     once every peer has acked: the barrier
    rank 0 -> peer   ERROR / TIMEOUT  length (u32), utf-8   instead of BLOB or GO when something is wrong

Who may join: ``python -m dnnbind.launch`` makes a secret per job and gives it to its ranks
(``DNNBIND_RDZV_SECRET``); a peer whose HELLO does not carry the MAC of rank 0's fresh nonce under that secret
is dropped, so a stranger that reaches the port can neither take a rank nor learn the NCCL id (the secret itself
never crosses the wire). Without a secret (ranks started by hand or by another launcher) the MAC is computed with
an empty key: the protocol is the same, and anyone who can reach the port can join, as with torchrun's store.

Rank 0 never waits on one connection: it serves every pending connection at once (``selectors``), gives each
HELLO_TIMEOUT_S to say hello, reads a fixed-size HELLO (no length field a peer controls), and drops idle, garbage
or unauthenticated connections without delaying the real ranks. Lengths a peer reads from rank 0 are capped too.

Rank 0 closes its listening socket as soon as the last hello is in, before any BLOB goes out, so a peer that
starts the next exchange on the same port can never reach the listener of the previous one.

``connect()`` is the same barrier, but the connections stay open afterwards: each rank > 0 keeps one
authenticated connection to rank 0, which the watchdog (_watchdog.py) watches for a rank that dies.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import selectors
import socket
import struct
import time

from .._lib.errors import DnnbindValueError

MAGIC = b"DNRV"
VERSION = 2
SECRET_ENV = "DNNBIND_RDZV_SECRET"  # hex, set by python -m dnnbind.launch for its ranks
HELLO_TIMEOUT_S = 5.0  # a connection that has not said a full hello by then is dropped
MAX_BLOB = 1 << 20  # the NCCL id is 128 bytes; nothing rank 0 sends is near this
MAX_TEXT = 1 << 16
HEADER = struct.Struct(">4sHc")  # every message: MAGIC, VERSION, its one-byte kind (the watchdog's too)
U32 = struct.Struct(">I")  # a length or rank field
_NONCE = 16
_MAC = hashlib.sha256().digest_size
_HELLO_BODY = struct.Struct(">II")
_CHALLENGE, _HELLO, _BLOB, _ACK, _GO, _ERROR, _TIMEOUT = b"C", b"H", b"B", b"A", b"G", b"E", b"T"
_HELLO_SIZE = HEADER.size + _HELLO_BODY.size + _MAC
_RETRY_S = 0.05  # pause between connection attempts while rank 0 is not listening yet
_REPORT_GRACE_S = 1.0  # a connected peer waits this much past its deadline for rank 0's list of missing ranks


class RendezvousError(RuntimeError):
    """A peer was refused (duplicate or out-of-range rank, wrong world size, failed authentication) or spoke
    another protocol."""


class _ReportedTimeout(TimeoutError):
    """Rank 0's own timeout message, passed on unchanged to a waiting peer."""


def secret_from_env() -> bytes | None:
    """The job's secret from DNNBIND_RDZV_SECRET (hex), or None when unset."""
    text = os.environ.get(SECRET_ENV, "").strip()
    if not text:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise DnnbindValueError(f"{SECRET_ENV} must be hex (python -m dnnbind.launch sets it), got "
                                f"{len(text)} characters that are not") from None


def _mac(secret: bytes | None, nonce: bytes, rank: int, world_size: int) -> bytes:
    return hmac.new(secret or b"", nonce + _HELLO_BODY.pack(rank, world_size), hashlib.sha256).digest()


def exchange(blob_from_rank0: bytes | None, rank: int, world_size: int, addr: str = "127.0.0.1",
             port: int = 29500, timeout: float = 300.0, secret: bytes | None = None) -> bytes:
    """Return rank 0's blob on every rank, after all world_size ranks have arrived (a barrier).

    Rank 0 passes the blob and listens on addr:port; the other ranks pass None and connect, retrying until
    `timeout` seconds have passed. Every rank passes the job's `secret` (None: no authentication). Raises
    TimeoutError naming the missing ranks and the address.
    """
    if not 0 <= rank < world_size:
        raise DnnbindValueError(f"rank must be in [0, {world_size}), got {rank}")
    if rank == 0:
        if blob_from_rank0 is None:
            raise DnnbindValueError("rank 0 must pass the blob to broadcast")
        blob = bytes(blob_from_rank0)
        if len(blob) > MAX_BLOB:
            raise DnnbindValueError(f"the rendezvous blob is limited to {MAX_BLOB} bytes, got {len(blob)}")
        if world_size > 1:
            _serve(blob, world_size, addr, port, time.monotonic() + timeout, timeout, secret)
        return blob
    return _join(rank, world_size, addr, port, time.monotonic() + timeout, timeout, secret)


def barrier(rank: int, world_size: int, addr: str = "127.0.0.1", port: int = 29500,
            timeout: float = 300.0, secret: bytes | None = None) -> None:
    """Return once all world_size ranks have called barrier with the same addr:port."""
    exchange(b"" if rank == 0 else None, rank, world_size, addr, port, timeout, secret)


def connect(rank: int, world_size: int, addr: str = "127.0.0.1", port: int = 29500,
            timeout: float = 300.0, secret: bytes | None = None) -> dict[int, socket.socket]:
    """A barrier that leaves every rank > 0 connected to rank 0: rank 0 gets {r: socket} for r in
    1..world_size-1, the others {0: socket}. The caller owns (and closes) the sockets."""
    if not 0 <= rank < world_size:
        raise DnnbindValueError(f"rank must be in [0, {world_size}), got {rank}")
    if world_size == 1:
        return {}
    deadline = time.monotonic() + timeout
    if rank == 0:
        return _serve(b"", world_size, addr, port, deadline, timeout, secret, keep=True)
    return {0: _join(rank, world_size, addr, port, deadline, timeout, secret, keep=True)}


# -- rank 0 -----------------------------------------------------------------------------------------------------

class _Pending:
    """A connection that has not said its hello yet: its nonce, what it sent so far, and its own deadline."""

    __slots__ = ("conn", "nonce", "buf", "deadline")

    def __init__(self, conn: socket.socket, deadline: float):
        self.conn, self.nonce, self.buf, self.deadline = conn, os.urandom(_NONCE), b"", deadline


def _serve(blob: bytes, world_size: int, addr: str, port: int, deadline: float, timeout: float,
           secret: bytes | None, keep: bool = False) -> dict[int, socket.socket] | None:
    """Serve one exchange; with `keep`, return the peers' connections open instead of closing them."""
    peers: dict[int, socket.socket] = {}
    done = False
    pending: dict[socket.socket, _Pending] = {}
    sel = selectors.DefaultSelector()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((addr, port))
        except OSError as e:
            raise RendezvousError(f"rank 0 cannot listen on {addr}:{port}: {e} (is MASTER_ADDR an address of "
                                  f"this host, and is MASTER_PORT free?)") from e
        listener.listen(max(world_size, 16))
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ)
        while len(peers) < world_size - 1:
            now = time.monotonic()
            if now >= deadline:
                missing = sorted(set(range(1, world_size)) - set(peers))
                msg = (f"rendezvous at {addr}:{port} timed out after {timeout:g}s: rank(s) {missing} of "
                       f"world_size {world_size} never connected")
                for s in peers.values():
                    _try_send(s, _TIMEOUT, pack_text(msg))
                raise TimeoutError(msg)
            for p in [p for p in pending.values() if p.deadline <= now]:  # idle: drop, never wait on it
                _drop(sel, pending, p, f"no hello within {HELLO_TIMEOUT_S:g}s")
            wake = min([deadline, *(p.deadline for p in pending.values())])
            for key, _ in sel.select(max(wake - now, 0.001)):
                if key.fileobj is listener:
                    _accept(listener, sel, pending, deadline)
                else:
                    p = pending[key.fileobj]
                    rank = _read_hello(p, peers, world_size, secret)
                    if rank is None:  # not complete yet
                        continue
                    sel.unregister(p.conn)
                    del pending[p.conn]
                    if isinstance(rank, str):
                        _refuse(p.conn, rank)
                    else:
                        p.conn.setblocking(True)
                        peers[rank] = p.conn
        sel.unregister(listener)
        listener.close()  # NOTE: before any BLOB, so the next exchange on this port starts clean
        for p in list(pending.values()):
            _drop(sel, pending, p, "the rendezvous is complete")
        for s in peers.values():
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            s.sendall(pack_message(_BLOB, U32.pack(len(blob)) + blob))
        for r, s in peers.items():
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                _expect(s, _ACK, f"rank {r}")
            except (socket.timeout, TimeoutError, ConnectionError, RendezvousError) as e:
                msg = f"rendezvous at {addr}:{port}: rank {r} did not acknowledge the blob ({e})"
                for t in peers.values():
                    _try_send(t, _ERROR, pack_text(msg))
                raise TimeoutError(msg) from e
        for s in peers.values():
            s.sendall(pack_message(_GO))
        done = True
        return peers if keep else None
    finally:
        sel.close()
        listener.close()
        for p in pending.values():
            p.conn.close()
        if not (done and keep):
            for s in peers.values():
                s.close()


def _accept(listener: socket.socket, sel, pending: dict, deadline: float) -> None:
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionError):
        return
    p = _Pending(conn, min(deadline, time.monotonic() + HELLO_TIMEOUT_S))
    try:
        conn.settimeout(1.0)  # a fresh socket's buffer takes 23 bytes at once; never block rank 0 for long
        conn.sendall(pack_message(_CHALLENGE, p.nonce))
        conn.setblocking(False)
    except OSError:
        conn.close()
        return
    pending[conn] = p
    sel.register(conn, selectors.EVENT_READ)


def _read_hello(p: _Pending, peers: dict, world_size: int, secret: bytes | None):
    """Read what the peer sent; return its rank once a full hello checks out, a reason (str) to refuse it,
    or None while the hello is incomplete. A HELLO has a fixed size: no length a peer could inflate."""
    try:
        chunk = p.conn.recv(_HELLO_SIZE - len(p.buf))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as e:
        return f"connection error ({e})"
    if not chunk:
        return "the connection closed before a hello"
    p.buf += chunk
    if len(p.buf) >= HEADER.size:
        magic, version, kind = HEADER.unpack(p.buf[:HEADER.size])
        if magic != MAGIC or version != VERSION or kind != _HELLO:
            return (f"the peer does not speak the dnnbind rendezvous protocol v{VERSION} "
                    f"(got magic {magic!r}, version {version}, message {kind!r})")
    if len(p.buf) < _HELLO_SIZE:
        return None
    rank, ws = _HELLO_BODY.unpack(p.buf[HEADER.size:HEADER.size + _HELLO_BODY.size])
    mac = p.buf[HEADER.size + _HELLO_BODY.size:]
    if not hmac.compare_digest(mac, _mac(secret, p.nonce, rank, ws)):
        return (f"authentication failed for a peer claiming rank {rank}: it does not hold this job's "
                f"{SECRET_ENV} (every rank must get the launcher's secret)")
    if ws != world_size:
        return f"rank {rank} says WORLD_SIZE={ws} but rank 0 has WORLD_SIZE={world_size}"
    if not 1 <= rank < world_size:
        return f"rank {rank} is out of range for WORLD_SIZE={world_size} (expected 1..{world_size - 1})"
    if rank in peers:
        return f"rank {rank} already connected: duplicate RANK (two workers started with RANK={rank}?)"
    return rank


def _refuse(conn: socket.socket, problem: str) -> None:
    _try_send(conn, _ERROR, pack_text(f"rank 0 refused the connection: {problem}"))
    conn.close()


def _drop(sel, pending: dict, p: _Pending, why: str) -> None:
    sel.unregister(p.conn)
    del pending[p.conn]
    _refuse(p.conn, why)


# -- ranks 1..world_size-1 --------------------------------------------------------------------------------------

def _join(rank: int, world_size: int, addr: str, port: int, deadline: float, timeout: float,
          secret: bytes | None, keep: bool = False):
    """Join one exchange: rank 0's blob, or with `keep` the open connection to rank 0 (the blob is empty)."""
    where = f"rank {rank} at rendezvous {addr}:{port}"
    conn = _connect(addr, port, deadline)
    if conn is None:
        raise TimeoutError(f"{where}: rank 0 was not reachable within {timeout:g}s (missing rank: [0]; "
                           f"check MASTER_ADDR/MASTER_PORT, that rank 0 started, and that no other worker "
                           f"has RANK={rank}: rank 0 stops listening once every rank is in)")
    done = False
    try:
        # NOTE: rank 0 knows which ranks are missing; give it time to say so before we give up ourselves.
        conn.settimeout(max(deadline - time.monotonic(), 0.001) + _REPORT_GRACE_S)
        nonce = _expect(conn, _CHALLENGE, "rank 0", size=_NONCE)
        conn.sendall(pack_message(_HELLO, _HELLO_BODY.pack(rank, world_size) + _mac(secret, nonce, rank, world_size)))
        body = _expect(conn, _BLOB, "rank 0", size=4)
        blob = _recv(conn, _length(body, MAX_BLOB, "blob"))
        conn.sendall(pack_message(_ACK))
        _expect(conn, _GO, "rank 0")
        done = True
    except _ReportedTimeout:
        raise
    except (socket.timeout, TimeoutError) as e:
        raise TimeoutError(f"{where}: rank 0 did not finish the rendezvous within {timeout:g}s "
                           f"(some other rank never arrived)") from e
    except ConnectionError as e:
        raise RendezvousError(f"{where}: rank 0 closed the connection ({e})") from e
    finally:
        if not (done and keep):
            conn.close()
    return conn if keep else blob


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

def pack_message(kind: bytes, body: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind) + body


def pack_text(s: str) -> bytes:
    b = s.encode()[:MAX_TEXT]
    return U32.pack(len(b)) + b


def _length(body: bytes, limit: int, what: str) -> int:
    n = U32.unpack(body)[0]
    if n > limit:
        raise RendezvousError(f"rank 0 announced a {what} of {n} bytes, over the limit of {limit}: not a dnnbind "
                              f"rank 0, or a corrupt stream")
    return n


def _try_send(conn: socket.socket, kind: bytes, body: bytes) -> None:
    try:
        conn.settimeout(1.0)
        conn.sendall(pack_message(kind, body))
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
    magic, version, got = HEADER.unpack(_recv(conn, HEADER.size))
    if magic != MAGIC or version != VERSION:
        raise RendezvousError(f"{who} does not speak the dnnbind rendezvous protocol v{VERSION} "
                              f"(got magic {magic!r}, version {version})")
    if got in (_ERROR, _TIMEOUT):
        text = _recv(conn, _length(_recv(conn, 4), MAX_TEXT, "message")).decode(errors="replace")
        raise (_ReportedTimeout if got == _TIMEOUT else RendezvousError)(text)
    if got != kind:
        raise RendezvousError(f"{who} sent message {got!r}, expected {kind!r}")
    return _recv(conn, size)
