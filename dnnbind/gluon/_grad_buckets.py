"""Gradient buckets: a launched Trainer's flat gradient summed across processes while the backward still runs,
bucket by bucket, as PyTorch's DDP does (its Reducer). Layer: gluon; imports autograd, runtime, _lib.

Without buckets a launched Trainer (``python -m dnnbind.launch``, one GPU per process) sums its whole flat
gradient with one NCCL all-reduce in ``step()``, after the backward: the GPU computes, then waits for the network.
With them the flat gradient is cut into buckets, contiguous ranges of at most ``DNNBIND_BUCKET_MB`` MiB (25 by
default, DDP's ``bucket_cap_mb``; a Parameter larger than that is a bucket alone). autograd says when each
Parameter's gradient is final (``autograd.register_grad_ready``: after the last node that contributes to it), and
when all of a bucket's are, its all-reduce is queued on a communication stream of its own (one per device), made
to wait (an event) for what the compute stream has queued so far. The backward goes on meanwhile. At its end the
compute stream waits (an event) for the communication stream, so what follows it sees the sums; ``step()`` sums
the buckets the backward did not launch, the same way, then updates.

Order. Every process must issue the same collectives in the same order (NCCL matches them by order). The buckets
are numbered once, from the layout alone, in the order their gradients should be ready: by their
earliest-registered Parameter, last first (backward reaches the layers in reverse). They launch strictly in that
order, so a bucket ready early waits for the ones before it (as in DDP), and ``step()`` launches the rest in the
same order: every process issues the same sequence whatever its own backward reached (a Parameter it did not use
this step holds its bucket and those after it back to ``step()``). Buckets with a grad_req 'add' Parameter come
last and never launch early: a later backward adds to them.

What overlaps, and what does not:
- grad_req 'write', float32 or float16 Parameters: yes. The float16 gradients are cast into their float32 master
  range (where they are summed, trainer.py) bucket by bucket on the compute stream, just before the all-reduce;
- grad_req 'add': summed in ``step()``;
- a hybridized Block (or an eager call eager replay replays) runs its backward as one node from its recording:
  the replay pauses where a bucket's gradients have been written (``ready_groups``; hybrid's
  ``_backward_pauses`` cuts the recording after the last call that points into each bucket's gradients, one CUDA
  graph per part) and tells autograd then (``autograd.ready_now``), so the bucket's all-reduce overlaps the rest
  of the replayed backward;
- one process driving several GPUs (``ctx=[gpu(0), gpu(1)]``): no buckets. Its backward runs one device after the
  other in one thread, so little could overlap; ``step()`` keeps one fused all-reduce per device in one NCCL group;
- the cpu, a world of one, kvstore None or 'local', ``DNNBIND_BUCKET_MB=0``: no buckets (nothing to overlap);
- a CUDA-graph capture (graph.CapturedStep) or a recorded step (graph.RecordedStep): off, and ``step()`` sums the
  whole buffer with one all-reduce on the current stream, as without buckets, so what they record is unchanged.

Several ``backward()`` calls before one ``step()``: only the first overlaps. Where a later one reaches Parameters
of a bucket already summed (grad_req 'write': it rewrites their gradients), ``step()`` sums those Parameters again
(the bucket whole when it reached all of them), so the update sees the sum of every process's latest gradients, as
without buckets.

Between ``backward()`` and ``step()`` the gradients of the buckets that launched hold their sum over processes (as
after DDP's backward); the others hold this process's own until ``step()``. To clip or inspect the summed
gradients call ``allreduce_grads()`` first, then ``update()``, as MXNet's Trainer asks for several contexts.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import math
import os
import threading
import weakref

from .. import autograd
from .._lib import cudart, hooks
from ..runtime.stream import Stream, current_stream, wait_for

__all__ = ["DEFAULT_BUCKET_MB", "GradBuckets", "bucket_bytes", "partition"]

DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's bucket_cap_mb
_EARLY, _LATE, _OFF = "early", "late", "off"  # what a backward does: launch buckets, note rewrites, nothing


def bucket_bytes(device) -> int:
    """The bucket size, in bytes, for a Trainer whose gradients live on ``device`` (``DNNBIND_BUCKET_MB``); 0: no
    buckets. Always 0 on the cpu, which has no streams to overlap on (tests replace this function to check the
    bookkeeping there)."""
    if device.kind != "gpu":
        return 0
    text = os.environ.get("DNNBIND_BUCKET_MB", "").strip()
    if not text:
        return int(DEFAULT_BUCKET_MB * 2**20)
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (0.0 <= mb < math.inf):
        raise DnnbindValueError(f"DNNBIND_BUCKET_MB={text!r}: the gradient bucket size must be a number of MiB >= 0 "
                                f"(default {DEFAULT_BUCKET_MB:g}; 0 sums the whole gradient once, in step())")
    return int(mb * 2**20)


def partition(spans: list, total: int, cap: int) -> list:
    """Cut the flat range [0, total) into buckets: ``spans`` is [(offset, size, index, kind)] in offset order (one
    per Parameter); a bucket holds consecutive spans of one ``kind`` whose range spans at most ``cap`` elements
    (one span alone may exceed it). Filled from the end, where the gradients that are ready first lie. Returns
    [(start, end, [index, ...])] in offset order; the ranges tile [0, total) (the padding after a span goes with
    it)."""
    out: list = []
    hi, lo, kind, members = total, 0, None, []
    for off, _, i, k in reversed(spans):
        if members and (k != kind or hi - off > cap):
            out.append((lo, hi, members[::-1]))
            hi, members = lo, []
        lo, kind = off, k
        members.append(i)
    if members:
        out.append((0, hi, members[::-1]))
    return out[::-1]


class _Bucket:
    """One contiguous range [start, end) of the flat gradient: its Parameters (``members``, trainer indices in
    offset order), its float32 view and, over the float16 range, the float16 view cast into it first."""

    __slots__ = ("start", "end", "members", "early", "grad", "half_grad", "left", "launched", "rewritten")

    def __init__(self, start: int, end: int, members: list, early: bool, grad, half_grad) -> None:
        self.start, self.end, self.members, self.early = start, end, members, early
        self.grad, self.half_grad = grad, half_grad
        self.left = len(members)  # members whose gradient is not final yet in this backward
        self.launched = False  # summed (or being summed) since the last step
        self.rewritten: set = set()  # members a later backward wrote after the bucket was summed


_streams: dict = {}
_lock = threading.Lock()


def _comm_stream(device) -> Stream:
    """The device's communication stream, made once (every Trainer on the device shares it)."""
    s = _streams.get(device)
    if s is None:
        with _lock:
            s = _streams.get(device)
            if s is None:
                s = _streams[device] = Stream(device)
    return s


class GradBuckets:
    """A launched Trainer's buckets over its flat gradient (one context) and the state of one step.

    autograd calls ``grad_ready(leaf)`` and ``backward_done()`` (it is the listener of every trainable
    Parameter's data); the Trainer calls ``flush()`` in step() and ``close()`` when it packs again.
    ``spans``: [(offset, size, index, leaf, grad_req, group)] per trainable Parameter, in offset order.
    """

    def __init__(self, comm, device, flat_grad, half_grad, half_end: int, spans: list, cap: int) -> None:
        self._comm, self._device, self._gpu = comm, device, device.kind == "gpu"
        self._flat, self._half, self._half_end = flat_grad, half_grad, half_end
        total = flat_grad.size
        self._spans = {i: (o, n) for o, n, i, *_ in spans}
        reqs = {i: req for _, _, i, _, req, _ in spans}
        buckets = []
        for start, end, members in partition([(o, n, i, (g, req)) for o, n, i, _, req, g in spans], total, cap):
            grad = flat_grad if (start, end) == (0, total) else flat_grad[start:end]
            half = half_grad[start:end] if end <= half_end else None
            buckets.append(_Bucket(start, end, members, all(reqs[i] == "write" for i in members), grad, half))
        # Launch order: the buckets ready first first (the one whose earliest-registered Parameter comes last);
        # those that never launch early after them.
        self.buckets = sorted(buckets, key=lambda b: (not b.early, -min(b.members)))
        self._early = sum(b.early for b in buckets)
        leaves = {i: x for _, _, i, x, *_ in spans}
        self._where: dict = {}  # id(leaf) -> (its bucket, its trainer index)
        self._leaves = []
        for b in self.buckets:
            for i in b.members:
                self._where[id(leaves[i])] = (b, i)
                self._leaves.append(leaves[i])
                autograd.register_grad_ready(leaves[i], self)
        self._next = 0  # position in self.buckets of the next bucket to launch
        self._mode = None  # what the backward in progress does (_EARLY, _LATE, _OFF); None between backwards
        self._backwards = 0  # backward passes that reached these Parameters since the last step
        self._launched = False  # some bucket launched since the last step
        self._unjoined = False  # launched on the communication stream, not yet waited for by the compute stream
        self.early_launches = 0  # buckets launched during a backward, over this object's life (tests, benchmarks)
        self._finalizer = None

    @classmethod
    def make(cls, comm, buffers, half_end: int, spans: list, owner) -> GradBuckets | None:
        """Buckets over ``buffers`` (a Trainer's one context: _trainer_pack._Buffers) summed by ``comm``, or None
        where there are to be none (bucket_bytes is 0). They stop listening when ``owner`` (the Trainer) is
        garbage collected, if it did not close them first."""
        cap = bucket_bytes(buffers.device)
        if cap <= 0 or buffers.grad_base:  # (grad_base: no float32 range for float16 gradients; never in a world)
            return None
        out = cls(comm, buffers.device, buffers.grad, buffers.half_grad, half_end, sorted(spans, key=lambda s: s[0]),
                  max(cap // buffers.grad.dtype.itemsize, 1))
        out._finalizer = weakref.finalize(owner, out.close)
        return out

    # -- autograd's listener ------------------------------------------------------------------------------------
    def grad_ready(self, leaf) -> None:
        where = self._where.get(id(leaf))
        if where is None:
            return
        if self._mode is None:
            self._begin()
        b, i = where
        if self._mode is _EARLY:
            if b.early:
                b.left -= 1
                if b.left == 0:
                    self._launch_ready()
        elif self._mode is _LATE and b.launched:
            b.rewritten.add(i)

    def ready_groups(self, leaves) -> list:
        """For a node whose backward writes these leaves' final gradients in stages (a replayed recording: hybrid's
        ``_backward_pauses``): the groups worth telling together, each bucket's members among them, for the
        buckets this backward launches early; [] when it launches none (a later backward of the step, or while
        buckets are off)."""
        if self._mode is not _EARLY and not (self._mode is None and self._backwards == 0 and self._usable()):
            return []
        groups: dict = {}
        for leaf in leaves:
            where = self._where.get(id(leaf))
            if where is not None and where[0].early:
                groups.setdefault(id(where[0]), []).append(leaf)
        return list(groups.values())

    def backward_done(self) -> None:
        self._join()
        self._mode = None
        self._backwards += 1

    def _begin(self) -> None:
        if self._backwards == 0 and self._usable():
            self._mode = _EARLY
            for b in self.buckets:
                b.left = len(b.members)
        else:
            self._mode = _LATE if self._launched else _OFF

    def _launch_ready(self) -> None:
        """Launch, in order, the buckets from the next one on whose gradients are all final."""
        ready, n = [], self._next
        while n < self._early and self.buckets[n].left == 0:
            ready.append(self.buckets[n])
            n += 1
        if ready:
            self._next = n
            self._send([(b.grad, b.half_grad) for b in ready])
            for b in ready:
                b.launched = True
            self._launched = True
            self.early_launches += len(ready)

    # -- the Trainer's side -------------------------------------------------------------------------------------
    def launched(self) -> bool:
        """Whether some bucket was summed since the last step (its gradients hold the sum over processes)."""
        return self._launched

    def flush(self) -> bool:
        """In step(): sum every bucket the backward did not, and the Parameters a later backward rewrote, in the
        fixed order, then make the compute stream wait for it all; the next backward starts a new step. False
        (nothing done) where buckets are off now (a capture or a recorded step) and none launched: the caller
        sums the whole buffer itself."""
        try:
            if not self._launched and not self._usable():
                return False
            parts = [(b.grad, b.half_grad) for b in self.buckets if not b.launched]
            for b in self.buckets:
                if not b.rewritten:
                    continue
                if len(b.rewritten) == len(b.members):
                    parts.append((b.grad, b.half_grad))
                    continue
                for i in b.members:
                    if i in b.rewritten:
                        o, n = self._spans[i]
                        parts.append((self._flat[o:o + n], self._half[o:o + n] if o < self._half_end else None))
            if parts:
                self._send(parts)
            self._join()
            return True
        finally:
            for b in self.buckets:
                b.launched = False
                b.rewritten.clear()
            self._next, self._backwards, self._launched, self._mode = 0, 0, False, None

    def close(self) -> None:
        """Stop listening (the Trainer packed its Parameters again, or is gone)."""
        for leaf in self._leaves:
            autograd.unregister_grad_ready(leaf)
        self._leaves, self._where = [], {}
        if self._finalizer is not None:
            self._finalizer.detach()

    # -- streams ------------------------------------------------------------------------------------------------
    def _usable(self) -> bool:
        """Whether buckets may launch now: not while a step is recorded or captured (see the module docstring)."""
        if hooks.RECORDING:
            return False
        if self._gpu:
            return not int(cudart.call("cudaStreamIsCapturing", current_stream(self._device).handle))
        return True

    def _send(self, parts: list) -> None:
        """Queue the all-reduce of each (float32 view, float16 view or None) in place, in order, on the
        communication stream, after what the compute stream has queued so far (the float16 views cast into their
        float32 range first, there)."""
        for grad, half in parts:
            if half is not None:
                grad.copy_(half)  # converts as it copies
        if not self._gpu:  # the cpu (tests): no streams, in order at once
            for grad, _ in parts:
                self._comm.all_reduce(grad, out=grad)
            return
        stream = _comm_stream(self._device)
        wait_for(stream, current_stream(self._device))
        with stream:  # Communicator.all_reduce runs on the device's current stream
            for grad, _ in parts:
                self._comm.all_reduce(grad, out=grad)
        self._unjoined = True

    def _join(self) -> None:
        """The compute stream waits for everything queued on the communication stream so far."""
        if not self._unjoined:
            return
        self._unjoined = False
        wait_for(current_stream(self._device), _comm_stream(self._device))
