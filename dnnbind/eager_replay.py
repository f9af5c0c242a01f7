"""Eager replay: the plain eager loop (no ``hybridize()``) runs a Block call's recorded library calls when that call
is proven to repeat the recorded one, op for op. MXNet's engine took the host off the GPU's critical path by
queueing ops asynchronously; this takes it off by not re-issuing the library calls at all, and stays exact.

Layer: top (beside hybrid, whose CachedBlock it extends). Registers ``EagerReplay`` as gluon.block's
``eager_replay_factory`` when on (the default; ``set_eager_replay(False)`` or ``DNNBIND_EAGER_REPLAY=0`` turns it
off). Only a Block called outside any other recording, on GPU arrays, without ``hybridize()``, gets one. With
Parameters on several devices (``ctx=[gpu(0), gpu(1)]``) each device's calls are their own signature, as for
``hybridize()``; under several ranks each process replays its own calls, and the Trainer's gradient buckets launch
after a replayed backward as after a hybridized one.

For one Block and one signature (hybrid.py's: input shapes, dtypes, devices, gradient needs, autograd's flags):

1. the first call runs eagerly (it initializes Parameters, picks algorithms, fills caches);
2. the second records, as ``hybridize()`` does, and notes the *op trace*: every op its forward dispatched
   (``nd.invoke``) and every view it took (``NDArray.reshape``), with the parameters, scalar operands, and where
   each array operand came from (input i, output m of op j, or one particular outside array such as a weight);
3. every later call runs the Block's Python forward again, in full, with its ops *deferred*: each op is compared
   with the trace's next entry and, when it matches, returns a ``Pending`` array (shape, dtype and device known,
   no memory) instead of running. When the forward returns exactly the trace's outputs, all ops having matched,
   and none of the Pending arrays is still referenced anywhere, the call was the recorded one: its recording
   replays (one CUDA graph) and one tape node stands for it, as for a hybridized Block.

Nothing the eager call would have done is skipped or reordered where anyone could see it:
- an op that differs from the trace (another op, other parameters or scalars, an operand from elsewhere: Python
  control flow, a changed attribute, ``random.random()``), a forward that ends early or returns something else,
  an exception, or any use of a Pending array other than as an op operand or for its shape/dtype/device (its
  memory, ``.asnumpy()``, printing it, autograd, a slice, an in-place write) *materializes*: the deferred ops run
  now, eagerly, in order, from the same operands, and every Pending array still referenced becomes their result
  (the same Python object, now an ordinary NDArray with its place in autograd's graph). The forward then goes on
  eagerly. So values, errors (each op's checks ran at its own call in an earlier call of this signature with the
  same operands' shapes) and the autograd graph are the eager call's;
- a Pending array that outlives the forward (stored on the Block, kept by a hook) materializes the call too,
  since a replay's intermediate buffers are rewritten by the next replay;
- device work queued beside the deferred ops (a copy or memset, as in reading a Parameter's values or writing into
  an array in place, or a kernel launch) materializes first, so it sees what the eager call's ops had done. A
  cuDNN or cuBLAS call made outside the op dispatch (the functional ``dnnbind.ops`` API inside a forward) is not
  watched: such a forward should read only its own op results.
A signature whose calls differ from the trace twice stays eager (``eager_reasons`` says why), its first miss
records it again.

A replayed call's backward is its recording's: it runs once and cannot itself be differentiated. Once the program
has run a backward pass with ``retain_graph=True`` or ``create_graph=True`` (``autograd.keeps_graphs()``), calls
under ``autograd.record()`` stay eager. A loop that does so from its first step never meets a replayed node; one
that starts later gets an error naming the switch if it backpropagates through an earlier replayed call twice.

What is not the eager call's: kernel-level numerics may differ within rounding where a recording's algorithm
choice differs from eager's, and a replayed Block's children are not called one by one by the replay (their
forward hooks and trace scopes ran in the Python forward, with Pending arrays as outputs).
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import autograd
from ._lib.hooks import DEFERRING, RECORDING, TRACING
from .gluon import block as _block
from .gluon.block import RUN_EAGERLY
from .hybrid import EAGER, READY, WARM, CachedBlock, Signature, flatten_arrays, inside_recorded_call, rebuild_arrays
from .nd._registry import Op
from .nd._registry import run as _run_op
from .runtime.array import NDArray, view as take_view
from .runtime.device import Device

__all__ = ["EagerReplay", "Pending", "eager_replay_enabled", "set_eager_replay"]

MAX_MISSES = 2  # calls of a signature that differed from its trace before it stays eager
# DNNBIND_EAGER_REPLAY_TRACE=1: print to stderr each time a Block's call is not replayed, and why
_TRACE_MISSES = os.environ.get("DNNBIND_EAGER_REPLAY_TRACE", "").strip() not in ("", "0")

_VIEW = "view"  # the trace entry of an NDArray.reshape view (its "op")
_SLOTS = ("shape", "dtype", "device", "ptr", "on_gpu", "_data", "_owner", "_node", "_grad", "_grad_req")
# A Pending array's own _data slot (hidden behind its property) holds the OpCheck that made it.
_CHECK = NDArray.__dict__["_data"]
_get_ident = threading.get_ident


def set_eager_replay(flag: bool) -> None:
    """Turn eager replay on (the default) or off for Block calls from now on. Off, every non-hybridized Block call
    runs its ops one by one; recordings made so far stay with their Blocks until ``hybridize()`` drops them."""
    _block.eager_replay_factory[0] = EagerReplay.create if flag else None


def eager_replay_enabled() -> bool:
    return _block.eager_replay_factory[0] is not None


# -- Pending arrays ---------------------------------------------------------------------------------------------

class Pending(NDArray):
    """The output of a deferred op: ``shape``, ``dtype``, ``device`` and ``on_gpu`` are known, nothing else is.
    Reading or writing any other field (its pointer, its autograd state) materializes the deferred call first,
    which turns this very object into an ordinary NDArray holding the eager result."""
    __slots__ = ()


def _materializing(name: str):
    slot = NDArray.__dict__[name]

    def get(self):
        _CHECK.__get__(self, NDArray).materialize(f"the forward read a deferred array's {name.lstrip('_')}")
        return slot.__get__(self, NDArray)

    def set(self, value):
        _CHECK.__get__(self, NDArray).materialize(f"the forward set a deferred array's {name.lstrip('_')}")
        slot.__set__(self, value)
    return property(get, set)


for _field in ("ptr", "_data", "_owner", "_node", "_grad", "_grad_req"):
    setattr(Pending, _field, _materializing(_field))


def _adopt(p: Pending, real: NDArray) -> NDArray:
    """``p`` becomes ``real``: same memory, same place in autograd's graph; returns ``p``."""
    p.__class__ = NDArray
    for name in _SLOTS:
        setattr(p, name, getattr(real, name))
    autograd.take_place(real, p)
    return p


# -- the op trace -----------------------------------------------------------------------------------------------

class _Refused(Exception):
    """An op whose operands or parameters a later call cannot be compared with (it keeps the signature eager)."""


_PLAIN = (bool, int, float, str, bytes, type(None), np.dtype, Device, np.number, np.bool_, type)


def _execute(op, args, params):
    """Run one noted call now: a registry op (past the hook), a view, or a ``hooks.deferrable`` function."""
    if type(op) is Op:
        return _run_op(op, args, params)
    if op is _VIEW:
        return take_view(args[0], params["shape"])
    return op(*args, **params)


def _name(op) -> str:
    return "a view" if op is _VIEW else getattr(op, "name", None) or getattr(op, "__name__", repr(op))


def _plain(v) -> bool:
    if isinstance(v, _PLAIN):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(x) for x in v.values())
    return False


class _Entry:
    """One traced op: the op (an nd registry Op, _VIEW, or a ``hooks.deferrable`` function), each operand's origin,
    the parameters (a registry op's: plain values; a function's keyword arguments: a tuple of (name, origin), as
    they may be arrays), and each output's origin."""
    __slots__ = ("op", "args", "params", "outs", "many", "single")

    def __init__(self, op, args, params, outs, many):
        self.op, self.args, self.params, self.outs, self.many = op, args, params, outs, many
        # the common case, made fast: one new output returned alone -> its (shape, dtype, device, on_gpu)
        o = outs[0] if many is None else None
        self.single = (o[1], o[2], o[3], o[3].kind == "gpu") if o is not None and o[0] == "new" else None


class OpTrace:
    """The ops a recorded forward made (``entries``), the origins of its outputs and the shape of its result."""
    __slots__ = ("entries", "outputs", "layout")

    def __init__(self, entries, outputs, layout):
        self.entries, self.outputs, self.layout = entries, outputs, layout


class OpCapture:
    """Installed in DEFERRING while a recording runs the Block's forward: notes each top-level op (the ops an op's
    own lowering or gradient dispatches are part of it) and runs it."""

    def __init__(self, inputs):
        self.thread = _get_ident()
        self.depth = 0
        self.origin: dict = {}  # id(array) -> (origin, weakref): weak, so the recording's memory plan is unchanged
        for i, x in enumerate(inputs):
            self.origin[id(x)] = (("i", i), weakref.ref(x))
        self.entries: list = []
        self.refused: str | None = None

    def _origin(self, a):
        if isinstance(a, NDArray):
            hit = self.origin.get(id(a))
            if hit is not None and hit[1]() is a:
                return hit[0]
            return ("x", a)  # an array from outside the forward's ops (a Parameter's data): this very object
        if isinstance(a, (tuple, list)) and any(isinstance(x, NDArray) for x in a):
            return ("l", type(a), tuple(self._origin(x) for x in a))
        if not _plain(a):
            raise _Refused(f"an operand of type {type(a).__name__}")
        return ("v", a, type(a))

    def invoke(self, op, args, params):
        if self.depth or self.thread != _get_ident() or self.refused:
            return _execute(op, args, params)
        return self._note(op, args, params)

    def view(self, x, new):
        if self.depth or self.thread != _get_ident() or self.refused:
            return take_view(x, new)
        return self._note(_VIEW, (x,), {"shape": new})

    def device_work(self) -> None:
        """Device work queued outside the noted ops (the ops' own library calls and copies): nothing to do."""

    def _note(self, op, args, params):
        noted = params
        try:
            origins = tuple(self._origin(a) for a in args)
            if type(op) is not Op and op is not _VIEW:
                noted = tuple((k, self._origin(v)) for k, v in params.items())
            elif not _plain(params):
                raise _Refused(f"a parameter of {_name(op)} that is not a plain value")
        except _Refused as exc:
            self.refused = str(exc)
            origins = None
        self.depth += 1
        try:
            out = _execute(op, args, params)
        finally:
            self.depth -= 1
        if origins is None:
            return out
        k = len(self.entries)
        many = type(out) if isinstance(out, (tuple, list)) else None
        outs = []
        for m, o in enumerate(out if many is not None else (out,)):
            if not isinstance(o, NDArray):
                self.refused = f"{_name(op)} returns a {type(o).__name__}"
                return out
            hit = self.origin.get(id(o))
            if hit is not None and hit[1]() is o:  # the op returned an array it was given (an identity)
                outs.append(("same", hit[0]))
            elif any(o is a for a in args):
                outs.append(("same", self._origin(o)))
            else:
                self.origin[id(o)] = ((k, m), weakref.ref(o))
                outs.append(("new", o.shape, o.dtype, o.device))
        self.entries.append(_Entry(op, origins, noted, tuple(outs), many))
        return out

    def finish(self, out) -> OpTrace | None:
        if self.refused:
            return None
        flat, layout = flatten_arrays(out)
        if flat is None:
            self.refused = layout
            return None
        return OpTrace(tuple(self.entries), tuple(self._origin(o) for o in flat), layout)


# -- checking a call against the trace --------------------------------------------------------------------------

class _Mismatch(Exception):
    pass


class OpCheck:
    """Installed in DEFERRING while a later call's forward runs: each op must be the trace's next one; it is then
    deferred and answered with Pending arrays. ``materialize()`` runs the deferred ops and ends the check."""

    def __init__(self, trace: OpTrace, inputs: tuple):
        self.thread = _get_ident()
        self.entries = trace.entries
        self.inputs = inputs
        self.k = 0  # ops matched (and deferred) so far
        self.made: dict = {}  # (k, m) -> weakref to the Pending array handed out
        # id(Pending) -> its (k, m): a Pending this check made is alive wherever it is an operand, so its id is
        # not reused meanwhile; a Pending of an earlier check is no longer a Pending (materialized) or dead.
        self.tags: dict = {}
        self.active = True
        self.why: str | None = None  # what ended the check early

    # the hooks ---------------------------------------------------------------------------------------------
    def invoke(self, op, args, params):
        if not self.active or self.thread != _get_ident():
            return _execute(op, args, params)
        try:
            return self._defer(op, args, params)
        except _Mismatch as exc:
            self.materialize(f"op {self.k} ({_name(op)}): {exc}")
        return _execute(op, args, params)  # its Pending operands are real arrays now

    def view(self, x, new):
        if not self.active or self.thread != _get_ident():
            return take_view(x, new)
        try:
            return self._defer(_VIEW, (x,), {"shape": new})
        except _Mismatch as exc:
            self.materialize(f"op {self.k} (a view): {exc}")
        return take_view(x, new)

    def device_work(self) -> None:
        """A copy, memset or kernel launch queued beside the deferred ops (a host read of a Parameter, an in-place
        write, a kernel of the forward's own): the deferred ops come first, as in the eager call."""
        if self.active and self.thread == _get_ident():
            self.materialize("the forward queued device work outside its ops (a copy, a write, a kernel)")

    def _defer(self, op, args, params):
        k = self.k
        entries = self.entries
        if k >= len(entries):
            raise _Mismatch("the recorded forward made no more ops")
        e = entries[k]
        if e.op is not op:
            raise _Mismatch(f"the recorded forward made {_name(e.op)} here")
        origins = e.args
        if len(args) != len(origins):
            raise _Mismatch("an operand differs")
        tags = self.tags
        for a, o in zip(args, origins):  # a plain loop: this runs for every operand of every deferred op
            if type(a) is Pending:
                if tags.get(id(a)) != o:
                    raise _Mismatch("an operand differs")
            elif not self._same(a, o):
                raise _Mismatch("an operand differs")
        if type(e.params) is dict:
            if params != e.params:
                raise _Mismatch("a parameter differs")
        else:
            if len(params) != len(e.params):
                raise _Mismatch("a keyword argument differs")
            for (key, v), (name, o) in zip(params.items(), e.params):
                if key != name or not self._same(v, o):
                    raise _Mismatch("a keyword argument differs")
        self.k = k + 1
        if e.single is not None:
            return self._pending(k, 0, e.single)
        outs = []
        for m, o in enumerate(e.outs):
            if o[0] == "new":
                outs.append(self._pending(k, m, (o[1], o[2], o[3], o[3].kind == "gpu")))
            else:
                outs.append(self._resolve(o[1], None))
        return outs[0] if e.many is None else e.many(outs)

    def _pending(self, k: int, m: int, meta: tuple) -> Pending:
        p = object.__new__(Pending)
        p.shape, p.dtype, p.device, p.on_gpu = meta
        _CHECK.__set__(p, self)
        tag = (k, m)
        self.tags[id(p)] = tag
        self.made[tag] = weakref.ref(p)
        return p

    def _same(self, a, origin) -> bool:
        kind = origin[0]
        if kind == "v":
            return type(a) is origin[2] and (a is origin[1] or a == origin[1])
        if kind == "x":
            return a is origin[1]
        if kind == "i":
            return a is self.inputs[origin[1]]
        if kind == "l":
            return (type(a) is origin[1] and len(a) == len(origin[2])
                    and all(self._same(x, o) for x, o in zip(a, origin[2])))
        return type(a) is Pending and self.tags.get(id(a)) == origin

    def _resolve(self, origin, real):
        """The array an origin names: an input, an outside array, or output m of op j (``real``: those computed
        by materialize; None: the Pending handed out)."""
        kind = origin[0]
        if kind == "i":
            return self.inputs[origin[1]]
        if kind == "x":
            return origin[1]
        if kind == "v":
            return origin[1]
        if kind == "l":
            return origin[1](self._resolve(o, real) for o in origin[2])
        if real is not None:
            return real[origin]
        p = self.made[origin]()
        if p is None:
            raise _Mismatch("an output it refers to is gone")
        return p

    # the outcomes ------------------------------------------------------------------------------------------
    def materialize(self, why: str, outputs=None):
        """Run the deferred ops eagerly, in order; each Pending array still referenced becomes its op's result.
        Ends the check (``why``: the reason), so later ops run eagerly. Returns the arrays ``outputs`` (origins)
        name."""
        if not self.active:
            return None
        self.active = False
        self.why = why
        if DEFERRING and DEFERRING[-1] is self:
            DEFERRING.pop()
        real: dict = {}
        for k in range(self.k):
            e = self.entries[k]
            args = tuple(self._resolve(o, real) for o in e.args)
            params = e.params if type(e.params) is dict else {k: self._resolve(o, real) for k, o in e.params}
            out = _execute(e.op, args, params)
            results = out if e.many is not None else (out,)
            for m, (o, r) in enumerate(zip(e.outs, results)):
                if o[0] != "new":
                    continue
                ref = self.made.get((k, m))
                p = ref() if ref is not None else None
                real[(k, m)] = _adopt(p, r) if p is not None else r
        self.made.clear()
        self.tags.clear()
        return None if outputs is None else [self._resolve(o, real) for o in outputs]

    def compare(self, out, trace: OpTrace) -> str | None:
        """After the forward returned ``out``: None when it made the recorded ops and returned the recorded
        outputs; else why not."""
        if self.k != len(self.entries):
            return f"the forward made {self.k} of the recorded forward's {len(self.entries)} ops"
        flat, layout = flatten_arrays(out)
        if flat is None or layout != trace.layout or len(flat) != len(trace.outputs) \
                or not all(self._same(a, o) for a, o in zip(flat, trace.outputs)):
            return "the forward returned other arrays than the recorded one"
        return None

    def referenced(self) -> bool:
        """Whether an array the forward made is still referenced (the caller dropped the result first)."""
        return any(ref() is not None for ref in self.made.values())


# -- the Block's cache ------------------------------------------------------------------------------------------

class EagerReplay(CachedBlock):
    """A non-hybridized Block's recordings, keyed by signature, replayed only where the forward's ops are proven to
    repeat (module docstring). ``replays`` counts replayed calls, ``misses`` the calls that differed."""

    KIND = "replayed"
    EAGER_HINT = ("eager replay ran this call from its recording, whose backward runs once and is not "
                  "differentiable: call dnnbind.set_eager_replay(False) (or set DNNBIND_EAGER_REPLAY=0) before "
                  "the loop")

    def __init__(self, block) -> None:
        super().__init__(block, {})
        self.misses = 0
        self._trace: OpTrace | None = None

    @classmethod
    def create(cls, block):
        """gluon.block's factory: a cache for a Block called at the top (None inside another Block's recording,
        replay or check, a trace, or a RecordedStep: the Blocks called there are part of that call)."""
        if inside_recorded_call[0] or RECORDING or TRACING:
            return None
        return cls(block)

    def __call__(self, args: tuple):
        if inside_recorded_call[0] or RECORDING or TRACING:
            return RUN_EAGERLY
        if autograd.keeps_graphs() and autograd.is_recording():
            # A replayed call's backward runs once and cannot be differentiated: a program that retains or
            # differentiates its graphs keeps its recorded calls eager (the Blocks' predict-mode calls replay still).
            return RUN_EAGERLY
        for a in args:
            if type(a) is not NDArray:  # arrays only (no nested lists): a Block taking states runs eagerly
                return RUN_EAGERLY
        return super().__call__(args)

    def _run_forward(self, block, inputs: list):
        capture = OpCapture(inputs)
        DEFERRING.append(capture)
        try:
            out = block.forward(*inputs)
        finally:
            DEFERRING.remove(capture)
        self._trace = capture.finish(out)
        if self._trace is None:
            self._trace = capture.refused or "no trace"
        return out

    def _record(self, key, sig: Signature, args: tuple, recording: bool, layout):
        self._trace = None
        out = super()._record(key, sig, args, recording, layout)
        trace, self._trace = self._trace, None
        if sig.state is READY:
            if isinstance(trace, OpTrace):
                sig.trace = trace
            else:  # replayable, but not provably the same call next time: eager from now on
                sig.state = EAGER
                self._say(key, f"eager replay cannot compare its calls: {trace}")
        elif key in self.eager_reasons:
            self._say(key, self.eager_reasons[key])
        return out

    def _say(self, key, why: str) -> None:
        self.eager_reasons[key] = why
        if _TRACE_MISSES:
            import sys
            print(f"dnnbind eager replay: {type(self._block()).__name__} {key[0]}: {why}", file=sys.stderr)

    def _ready(self, key, sig: Signature, args: tuple, recording: bool):
        block, trace = self._block(), sig.trace
        check = OpCheck(trace, args)
        inside_recorded_call[0] += 1  # the Blocks it calls run their forward (eagerly, or deferred by this check)
        DEFERRING.append(check)
        try:
            out = block.forward(*args)
        except BaseException:
            check.materialize("the forward raised")  # the ops before the error ran, as in an eager call
            raise
        finally:
            inside_recorded_call[0] -= 1
            if check.active:
                DEFERRING.remove(check)
        if check.active:
            why = check.compare(out, trace)
            if why is not None:
                check.materialize(why)  # the Pending arrays in ``out`` are the eager results now
            else:
                del out  # the caller gets the replay's outputs: the forward's Pending ones must be unreferenced
                if not check.referenced():
                    check.active = False
                    return self._replay(sig, args, recording)
                out = rebuild_arrays(check.materialize("an array the forward made is still referenced after it "
                                                 "returned", trace.outputs), trace.layout)
        self._miss(key, sig, check.why)
        return out

    def _miss(self, key, sig: Signature, why: str) -> None:
        self.misses += 1
        sig.misses += 1
        if sig.misses >= MAX_MISSES:
            sig.state = EAGER
            self._say(key, f"its calls differ from the recorded one ({why})")
        else:  # record it again at the next call (a fresh signature: a taped output may still need the old one)
            fresh = Signature()
            fresh.state, fresh.misses = WARM, sig.misses
            self._sigs[key] = fresh
            self._say(key, f"a call differed from the recorded one ({why}); recording again")


def _default_on() -> bool:
    return os.environ.get("DNNBIND_EAGER_REPLAY", "1").strip().lower() not in ("0", "false", "off", "no")


set_eager_replay(_default_on())
