"""The watchdog: a rank that dies makes the others stop with an error naming it, instead of hanging in NCCL.

Layer: distributed; stdlib, the rendezvous' framing, and the communicators' registry (comm.py).

``init()`` starts one per process when world_size > 1 (``init(watchdog=False)`` or ``DNNBIND_WATCHDOG=0`` turn it
off). It is a daemon thread; the main thread does nothing for it, so steps are not slowed. It watches:

- **The ranks.** init()'s barrier (``_rendezvous.connect``) leaves each rank > 0 with one authenticated TCP
  connection to rank 0. When a process dies, SIGKILL included, the kernel closes its sockets: rank 0 reads EOF at
  once, knows which rank died and tells every other rank (DIED); a rank that reads EOF from rank 0 knows rank 0
  died. A rank that ends normally (``shutdown()``, or the interpreter exiting without an uncaught exception) says
  BYE first, so finishing early is not a death; one that exits on an uncaught exception sends DIED with it. Both
  sides PING every PING_S; a peer silent for ``DNNBIND_WATCHDOG_TIMEOUT`` seconds (default 30, 0: never) counts
  as hung: a host that vanished without closing its sockets, or a process that stopped running Python.
- **NCCL.** ``ncclCommGetAsyncError`` on every live communicator of the process, every PING_S.

On a failure it prints one line to stderr and tells the other ranks. It then aborts every communicator
(``ncclCommAbort``), which lets NCCL kernels blocked on the dead peer exit. Later calls on those communicators
raise RankFailedError. The abort runs on a helper thread: NCCL's abort has been seen to hang (NVIDIA/nccl#992).
The main thread gets ``DNNBIND_WATCHDOG_GRACE`` seconds (default 5) to stop by itself; then the process ends
with ``os._exit(1)``, so a rank never hangs.

Under mpirun with mpi4py the barrier is MPI's, so there are no connections to watch. mpirun itself stops the job
when a rank dies; the NCCL polling still runs.

Messages, framed as the rendezvous' (MAGIC, VERSION, a kind byte; integers big-endian):

    INFO  pid (u32), host (u32 length + utf-8)   both ways, first: what a report says about the rank
    PING                                         both ways, every PING_S
    BYE                                          both ways: the sender ends normally, then closes
    DIED  rank (u32), why (u32 length + utf-8)   rank 0 -> others: `rank` failed; rank k -> rank 0: rank k failed
                                                 (on its own, or seeing `rank` fail), rank 0 passes it on
"""

from __future__ import annotations

import atexit
import math
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from typing import Callable

from .._lib.errors import DnnbindError, DnnbindValueError
from ._rendezvous import HEADER, MAGIC, MAX_TEXT, U32, VERSION, pack_message, pack_text

ENV = "DNNBIND_WATCHDOG"  # "0" turns the watchdog off
TIMEOUT_ENV = "DNNBIND_WATCHDOG_TIMEOUT"  # seconds of silence from a peer that count as a hang; 0: never
GRACE_ENV = "DNNBIND_WATCHDOG_GRACE"  # seconds between aborting NCCL and os._exit
PING_S = 1.0  # heartbeat period, and how often NCCL's asynchronous errors are polled
_INFO, _PING, _BYE, _DIED = b"I", b"P", b"Q", b"D"  # none is a rendezvous kind
_FIELDS = struct.Struct(">II")  # INFO and DIED: a number, then the text's length


class RankFailedError(DnnbindError, RuntimeError):
    """A rank of the job died, hung or hit an NCCL error; ``rank`` is the one that failed."""

    def __init__(self, rank: int, message: str):
        self.rank, self.message = rank, message
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.rank, self.message))


def enabled(flag: bool | None) -> bool:
    """init()'s ``watchdog`` argument, or DNNBIND_WATCHDOG when it is None (on unless 0/false/no/off)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def settings() -> tuple[float, float]:
    """(timeout, grace) from DNNBIND_WATCHDOG_TIMEOUT and DNNBIND_WATCHDOG_GRACE; init() reads them before its
    barrier, so a bad value fails there."""
    return _seconds(TIMEOUT_ENV, 30.0), _seconds(GRACE_ENV, 5.0)


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise DnnbindValueError(f"{name}={text!r} must be a number of seconds >= 0")
    return value


class Watchdog:
    """Watches ``links`` (rank -> socket, from _rendezvous.connect) and the communicators on a daemon thread.

    ``communicators`` and ``exit_process`` are comm.live_communicators and os._exit; tests pass stand-ins.
    """

    def __init__(self, rank: int, links: dict, *, timeout: float | None = None, grace: float | None = None,
                 communicators: Callable[[], list] | None = None, exit_process: Callable[[int], None] = os._exit):
        if communicators is None:
            from .comm import live_communicators as communicators
        if timeout is None or grace is None:
            env_timeout, env_grace = settings()
            timeout, grace = env_timeout if timeout is None else timeout, env_grace if grace is None else grace
        self.rank, self.timeout, self.grace = rank, timeout, grace
        self.failure: RankFailedError | None = None
        self._source: int | None = None  # the rank whose DIED message reported the failure
        self._communicators, self._exit = communicators, exit_process
        self._links = dict(links)  # the ranks still watched: no BYE, no EOF yet
        self._bufs = {r: bytearray() for r in links}
        self._seen = {r: time.monotonic() for r in links}  # when each last sent anything
        self._who = {r: "pid ?, host ?" for r in links}  # until its INFO arrives
        self._me = f"pid {os.getpid()}, host {socket.gethostname()}"
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()  # stop() wakes the thread's select at once
        self._thread = threading.Thread(target=self._run, name="dnnbind-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        info = pack_message(_INFO, U32.pack(os.getpid()) + pack_text(socket.gethostname()))
        for r, s in self._links.items():
            s.settimeout(PING_S)  # a send never blocks the thread for long
            self._send(r, info)
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, goodbye: bool = True, why: str = "") -> None:
        """Stop the thread and close the connections. ``goodbye``: say BYE, so the others don't count this rank
        as dead; else, with ``why``, say DIED (this rank failed). Does nothing once a failure is being handled."""
        if self.failure is not None:
            return
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2 * PING_S)
        if self.failure is not None:  # the thread is taking the process down: leave it the connections
            return
        for r, s in self._links.items():
            if goodbye:
                self._send(r, pack_message(_BYE))
            elif why:
                self._send(r, _died(self.rank, why))
            s.close()
        self._links.clear()
        self._wake_r.close()
        self._wake_w.close()

    def _close_in_child(self) -> None:
        """After fork: close the child's copies of the sockets, so the parent's death still closes them, and
        never say anything on them (the parent is the rank, not the child). The thread is not copied by fork."""
        for s in [*self._links.values(), self._wake_r, self._wake_w]:
            s.close()
        self._links.clear()

    # -- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            for r, s in self._links.items():
                sel.register(s, selectors.EVENT_READ, r)
            beat = 0.0
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= beat:
                    beat = now + PING_S
                    for r in list(self._links):
                        self._send(r, pack_message(_PING))
                    self._check_silence(now)
                    self._poll_nccl()
                if self.failure is not None:
                    break
                for key, _ in sel.select(max(beat - time.monotonic(), 0.0)):
                    if key.data in self._links and self.failure is None:  # key.data None: stop() woke us
                        self._read(sel, key.data)
        except Exception as e:  # noqa: BLE001 - a bug of the watchdog must not stop a healthy job: say so, stop
            if self.failure is None:
                _say(f"dnnbind.distributed: the watchdog of rank {self.rank} stopped on an internal error ({e!r}); "
                     f"this rank no longer watches the others")
                return
        finally:
            sel.close()
        if self.failure is not None:  # found before stop() asked, or racing it: going down wins
            self._go_down()

    def _read(self, sel, r: int) -> None:
        s = self._links[r]
        try:
            chunk = s.recv(1 << 16)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError:  # ECONNRESET: the peer's kernel closed it with our PINGs unread
            chunk = b""
        if not chunk:
            self._forget(sel, r)
            where = "rank 0" if self.rank == 0 else f"rank {self.rank}"
            return self._fail(r, f"rank {r} ({self._who[r]}) died (its connection to {where} closed)")
        self._seen[r] = time.monotonic()
        buf = self._bufs[r]
        buf += chunk
        while (msg := _take(buf)) is not None:
            kind, number, text = msg
            if kind == _BYE:
                self._forget(sel, r)
                return
            if kind == _INFO:
                self._who[r] = f"pid {number}, host {text}"
            elif kind == _DIED:
                return self._fail(number, text, source=r)
            elif kind is None:
                self._forget(sel, r)
                return self._fail(r, f"rank {r} ({self._who[r]}) sent something that is not the dnnbind watchdog's "
                                     f"protocol v{VERSION} ({text})")

    def _forget(self, sel, r: int) -> None:
        s = self._links.pop(r)
        sel.unregister(s)
        s.close()

    def _check_silence(self, now: float) -> None:
        for r in self._links:
            if self.timeout and now - self._seen[r] > self.timeout:
                return self._fail(r, f"rank {r} ({self._who[r]}) sent nothing for {self.timeout:g} s (hung, or its "
                                     f"host is unreachable; {TIMEOUT_ENV} sets how long)")

    def _poll_nccl(self) -> None:
        for c in self._communicators():
            try:
                c.check(wait=False)
            except Exception as e:  # noqa: BLE001 - NcclError, or the communicator closed meanwhile
                if c.handle:
                    return self._fail(self.rank, f"rank {self.rank} ({self._me}): NCCL reported an asynchronous "
                                                 f"error on {c!r}: {e}")

    def _fail(self, rank: int, why: str, source: int | None = None) -> None:
        if self.failure is None:
            self.failure = RankFailedError(rank, why)
            self._source = source

    def _go_down(self) -> None:
        """Report, tell the other ranks, abort NCCL, give the main thread the grace period, exit."""
        err = self.failure
        try:
            _say(f"dnnbind.distributed: {err.message}; rank {self.rank} aborts its NCCL communicators and exits")
            for r in list(self._links):
                if r not in (err.rank, self._source):
                    self._send(r, _died(err.rank, err.message))
            deadline = time.monotonic() + self.grace
            if self._exit is os._exit and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
                signal.alarm(math.ceil(self.grace) + 10)  # NOTE: in case exiting hangs too (a wedged CUDA teardown)
            aborts = threading.Thread(target=self._abort_all, name="dnnbind-watchdog-abort", daemon=True)
            aborts.start()
            aborts.join(self.grace)
            time.sleep(max(deadline - time.monotonic(), 0.0))  # the main thread may raise RankFailedError and exit
        finally:
            _flush()
            self._exit(1)

    def _abort_all(self) -> None:
        for c in self._communicators():
            try:
                c.abort(self.failure)
            except Exception:  # noqa: BLE001 - going down anyway: abort the rest
                pass

    def _send(self, r: int, data: bytes) -> None:
        try:
            self._links[r].sendall(data)
        except (OSError, KeyError):
            pass  # a peer that is gone is seen by the reading side


def _died(rank: int, why: str) -> bytes:
    return pack_message(_DIED, U32.pack(rank) + pack_text(why))


def _take(buf: bytearray):
    """Remove one whole message from the front of ``buf``: (kind, number, text); None while incomplete;
    (None, 0, what) for bytes that are not the protocol. No length read here exceeds MAX_TEXT."""
    if len(buf) < HEADER.size:
        return None
    magic, version, kind = HEADER.unpack_from(buf)
    if magic != MAGIC or version != VERSION or kind not in (_INFO, _PING, _BYE, _DIED):
        del buf[:]
        return None, 0, f"magic {magic!r}, version {version}, message {kind!r}"
    if kind in (_PING, _BYE):
        del buf[:HEADER.size]
        return kind, 0, ""
    if len(buf) < HEADER.size + _FIELDS.size:
        return None
    number, n = _FIELDS.unpack_from(buf, HEADER.size)
    if n > MAX_TEXT:
        del buf[:]
        return None, 0, f"a text of {n} bytes"
    end = HEADER.size + _FIELDS.size + n
    if len(buf) < end:
        return None
    text = bytes(buf[HEADER.size + _FIELDS.size:end]).decode(errors="replace")
    del buf[:end]
    return kind, number, text


def _say(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode(errors="replace"))  # NOTE: not sys.stderr: the main thread may hold its lock
    except OSError:
        pass


def _flush() -> None:
    """Flush Python's stdout/stderr before os._exit, without waiting more than a second on a lock the main thread
    may hold."""
    def go():
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(1.0)


# -- the process's watchdog -------------------------------------------------------------------------------------

_current: Watchdog | None = None
_hooked = False


def start(rank: int, links: dict, timeout: float, grace: float) -> Watchdog:
    """Stop any previous watchdog and start this process's (init() calls it)."""
    global _current, _hooked
    stop()
    if not _hooked:
        _hooked = True
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _current = Watchdog(rank, links, timeout=timeout, grace=grace).start()
    return _current


def stop(goodbye: bool = True, why: str = "") -> None:
    global _current
    w, _current = _current, None
    if w is not None:
        w.stop(goodbye, why)


def current() -> Watchdog | None:
    return _current


def _at_exit() -> None:
    # An uncaught exception in the main thread sets sys.last_value (3.12: also sys.last_exc) before atexit runs:
    # that rank failed, and says so. NOTE: sys.exit(code) does not; a rank that calls it says BYE, whatever the code.
    e = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    w = _current
    if e is None or w is None:
        return stop()
    stop(goodbye=False, why=f"rank {w.rank} ({w._me}) exited on an uncaught {type(e).__name__}: {e}")


def _after_fork_in_child() -> None:
    global _current
    w, _current = _current, None
    if w is not None:
        w._close_in_child()
