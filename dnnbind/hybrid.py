"""``hybridize()``: a Block's forward, and under ``autograd.record()`` its backward, recorded once per input
signature as the library calls they make, then replayed on every call. MXNet's CachedOp with ``static_alloc`` and
``static_shape``; the user's loop (``record()``, ``backward()``, ``trainer.step()``) is unchanged.

Layer: top (beside graph); imports recording, autograd, gluon, runtime. gluon sits below this layer and cannot import
it, so importing dnnbind registers ``CachedBlock`` as gluon.block's factory (``set_cached_block_factory``).

For one hybridized Block and one *signature* (input shapes, dtypes and devices, which inputs need a gradient, and
autograd's recording and training flags):

1. the first call runs eagerly. It initializes deferred Parameters, picks conv algorithms, compiles kernels and
   fills every cache: work a recording must not contain;
2. the second call records (graph.CallRecording). The Block's forward runs on *static* input buffers (copies of
   the inputs) and, when autograd is recording, onto a private tape; the output is copied out to the caller and
   one tape node stands for the whole Block in the caller's graph;
3. the first backward through that node copies the head gradient into a static buffer and records the private
   tape's backward: Parameter gradients are written where eager backward writes them (grad_req honoured);
4. later calls copy the inputs in, re-issue the forward's calls and copy the output out; their backward copies
   the head gradient in, re-issues the backward's calls and marks the Parameters' gradients fresh. The first
   re-issue of each is captured into a CUDA graph, so every later one is a single ``cudaGraphLaunch``
   (``set_replay_graphs(False)``: call by call; inside ``dnnbind.trace()`` always call by call, so the trace
   lists each library call).

Every buffer the recording used stays allocated while it exists (static_alloc): one set of activations per
signature, ``MAX_SIGNATURES`` signatures per Block, least recently used dropped first. The forward and backward
of a signature share one memory arena (runtime._arena), where a gradient reuses a dead activation's memory as it
would in an eager step, so a signature keeps about an eager step's peak (MXNet's static memory planning).

Falls back to eager, correctly:
- for a signature whose forward returns something other than NDArrays (one, or tuples and lists of them, as an
  RNN's ``(output, [h, c])``: those are flattened, replayed and rebuilt, with one tape node for every output),
  takes arguments other than arrays or lists of arrays, runs on
  the cpu, copies between host and device (``.asscalar()``, data-dependent Python control flow) or draws random
  numbers with ``nd.random`` (a replay would repeat them): the recording is refused and that signature stays
  eager (``CachedBlock.eager_reasons`` says why); Parameters with ``grad_req='null'`` (BatchNorm's running
  statistics) are restored from before the refused attempt;
- for a call made while an earlier output of the same signature still waits for its backward (the static
  activations are that output's): ``net(a); net(b); (la + lb).backward()`` runs the second call eagerly;
- inside another recording (a RecordedStep, a hybridized parent) or ``dnnbind.trace()`` before the recording
  exists (a traced replay lists the recorded calls).
Re-recorded: when any of the Block's Parameters adopts new arrays (a Trainer packing them into flat buffers,
``cast``, ``reset_ctx``, a grad_req change), or after ``hybridize()`` again. In-place writes (``set_data``,
``load_parameters``) need nothing: the recorded calls read the same buffers.

Not carried over: conv algorithm policy, TF32 and BatchNorm-mode switches changed after the recording (call
``hybridize()`` again); forward hooks of the Block's children (they ran at the recording only).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

from . import autograd
from ._lib import hooks
from ._lib.hooks import RECORDING, TRACING
from .gluon import block as _block
from .gluon.block import RUN_EAGERLY
from .gluon import parameter as _parameter
from .recording import CallRecording, CaptureError
from .runtime.array import NDArray, empty, zeros
from .runtime.stream import current_stream

__all__ = ["CachedBlock", "Signature", "flatten_arrays", "inside_recorded_call", "rebuild_arrays", "set_replay_graphs"]

MAX_SIGNATURES = 8

WARM, READY, EAGER = "warm", "ready", "eager"

# Replays after the first launch one CUDA graph captured from the recorded calls (the calls' host cost gone);
# False: call by call from the host (what a trace always does). set_replay_graphs() switches it.
_GRAPHS = [True]


def set_replay_graphs(flag: bool) -> None:
    """Whether hybridized Blocks recorded from now on replay as CUDA graphs (default) or call by call."""
    _GRAPHS[0] = bool(flag)


inside_recorded_call = [0]  # > 0 while a hybridized Block records or warms up: Blocks called inside it run eagerly


class Signature:
    """One recording: static inputs, the forward's and the backward's calls, the static output and head grad."""

    __slots__ = ("state", "inputs", "needs", "fwd", "bwd", "output", "head", "tape", "leaves", "binding",
                 "last", "serial", "done", "shape", "zeros", "trace", "misses", "pauses")

    def __init__(self) -> None:
        self.state = WARM
        self.serial = self.done = 0  # forwards emitted; the forward whose backward ran last
        self.fwd = self.bwd = self.output = self.head = self.tape = self.last = self.shape = self.zeros = None
        self.trace, self.misses = None, 0  # dnnbind.eager_replay: the recorded forward's ops; calls that differed
        self.inputs, self.needs, self.leaves, self.binding = [], (), [], ()
        self.pauses = None  # (the groups it was made for, cuts, leaves final at each cut): _backward_pauses

    def close(self) -> None:
        for rec in (self.fwd, self.bwd):
            if rec is not None:
                rec.close()
        self.fwd = self.bwd = self.output = self.head = self.tape = self.last = self.shape = self.zeros = None
        self.pauses = None
        self.inputs, self.leaves, self.binding = [], [], ()


def flatten_arrays(out):
    """(the NDArrays of a forward's result in order, its shape to rebuild it from them), or (None, reason): one
    NDArray, or tuples and lists of them nested (an RNN's ``(output, [h, c])``). Also eager_replay's."""
    if isinstance(out, NDArray):
        return [out], None
    if isinstance(out, (tuple, list)):
        flat, shape = [], []
        for item in out:
            sub, sub_shape = flatten_arrays(item)
            if sub is None:
                return None, sub_shape
            shape.append((len(sub), sub_shape))
            flat += sub
        return flat, (type(out), shape)
    return None, f"the forward returns a {type(out).__name__}, not NDArrays (one, or tuples and lists of them)"


def rebuild_arrays(flat: list, shape):
    """The forward's result from its arrays (``flatten_arrays``' inverse)."""
    if shape is None:
        return flat[0]
    kind, parts = shape
    items, i = [], 0
    for n, sub in parts:
        items.append(rebuild_arrays(flat[i:i + n], sub))
        i += n
    return kind(items)


def _binding(params) -> tuple:
    """What the recorded calls point at: every copy's data and gradient arrays (one per context), and grad_req."""
    out = []
    for p in params:
        out.append(p._grad_req)
        for data, grad in p._copies() or ((None, None),):
            out += (data, grad)
    return tuple(out)


def _same_binding(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y or (type(x) is str and x == y) for x, y in zip(a, b))


def _copy(p):
    """The Parameter's data for this call: its copy on the input's device when it lives on several (the Block
    call selected it), its only array otherwise."""
    return p.data() if p._data_list is not None else p._data


class CachedBlock:
    """The recordings of one hybridized Block, keyed by signature. Called by Block._call; returns the output, or
    ``RUN_EAGERLY`` for "run the forward eagerly yourself"."""

    # how its tape nodes are named, and what a user who needs an eager backward (twice, or differentiated) does
    KIND, EAGER_HINT = "hybridized", "call hybridize(active=False)"

    def __init__(self, block, flags: dict) -> None:
        self._block = weakref.ref(block)  # the Block holds this object: no reference cycle
        self.flags = dict(flags)
        self._sigs: OrderedDict = OrderedDict()
        self._generation = _parameter.generation[0]
        self.eager_reasons: dict = {}  # signature -> why it runs eagerly
        self.replays = 0  # calls served by a replay (tests and benchmarks read it)

    # -- the call ---------------------------------------------------------------------------------------------
    def __call__(self, args: tuple):
        if inside_recorded_call[0] or RECORDING:
            return RUN_EAGERLY
        layout = None
        for a in args:
            if type(a) is not NDArray:  # lists of arrays (an RNN's states) are inputs too: flattened
                args, layout = flatten_arrays(args)
                if args is None:
                    return RUN_EAGERLY
                break
        for a in args:
            if not a.on_gpu:  # a cpu (numpy-backed) array
                return RUN_EAGERLY
        recording = autograd.is_recording()
        key = (tuple((a.shape, a.dtype, a.device, autograd.needs_grad(a)) for a in args), recording,
               autograd.is_training(), None if layout is None else repr(layout))
        if self._generation != _parameter.generation[0]:
            self._drop_stale()
        sig = self._sigs.get(key)
        if sig is None:
            return self._warm(key, args, layout)
        self._sigs.move_to_end(key)
        state = sig.state
        if state is READY:
            if recording and sig.last is not None:
                node = sig.last()
                if node is not None and node.backward is not None:
                    return RUN_EAGERLY  # the static activations still belong to an output awaiting its backward
            return self._ready(key, sig, args, recording)
        if state is WARM:
            if TRACING:
                return RUN_EAGERLY
            return self._record(key, sig, args, recording, layout)
        return RUN_EAGERLY  # EAGER

    def _ready(self, key, sig: Signature, args: tuple, recording: bool):
        """A recorded signature's call: replay it (dnnbind.eager_replay first checks the forward's ops)."""
        return self._replay(sig, args, recording)

    def _run_forward(self, block, inputs: list):
        """The Block's forward inside a recording (dnnbind.eager_replay also notes the ops it makes)."""
        return block.forward(*inputs)

    def _warm(self, key, args, layout):
        """First call of a signature: eager, outside any recording; tells whether it can be recorded at all."""
        block = self._block()
        sig = self._sigs[key] = Signature()
        while len(self._sigs) > MAX_SIGNATURES:
            self._sigs.popitem(last=False)[1].close()
        inside_recorded_call[0] += 1
        try:
            out = block.forward(*(args if layout is None else rebuild_arrays(args, layout)))
        finally:
            inside_recorded_call[0] -= 1
        flat, reason = flatten_arrays(out)
        if flat is None:
            sig.state = EAGER
            self.eager_reasons[key] = reason
        return out

    def _params(self) -> list:
        return list(self._block().collect_params().values())

    def _drop_stale(self) -> None:
        self._generation = _parameter.generation[0]
        now = _binding(self._params())
        stale = [k for k, s in self._sigs.items() if s.state is READY and not _same_binding(s.binding, now)]
        for k in stale:
            self._sigs[k].close()
            self._sigs[k] = Signature()
            self._sigs[k].state = WARM  # its caches are warm: the next call records straight away

    # -- recording --------------------------------------------------------------------------------------------
    def _record(self, key, sig: Signature, args: tuple, recording: bool, layout):
        block = self._block()
        params = self._params()
        aux = [(_copy(p), _copy(p).copy()) for p in params if p._data is not None and p._grad_req == "null"]
        needs = tuple(autograd.needs_grad(a) for a in args)
        inputs = []
        for a, need in zip(args, needs):
            x = empty(a.shape, a.dtype, a.device)
            x.copy_(a)
            if need:
                autograd.attach_grad(x, "write")
            inputs.append(x)
        rec = CallRecording(graph=_GRAPHS[0])

        def forward():
            inside_recorded_call[0] += 1
            # The recording keeps each call's scope path; opening this Block's own scope makes those paths
            # (and its backward's) read as an eager call's, from this Block down (see _traced_replay).
            hooks.push(_trace_name(block))
            try:
                return self._run_forward(block, inputs if layout is None else rebuild_arrays(inputs, layout))
            finally:
                hooks.pop()
                inside_recorded_call[0] -= 1
        try:
            out = rec.record(forward)
        except CaptureError as exc:
            for data, saved in aux:  # the refused run may have updated running statistics: undo it
                data.copy_(saved)
            sig.state = EAGER
            self.eager_reasons[key] = str(exc)
            return RUN_EAGERLY
        flat, shape = flatten_arrays(out)
        if flat is None:
            rec.close()
            sig.state = EAGER
            self.eager_reasons[key] = shape
            for data, saved in aux:
                data.copy_(saved)
            return RUN_EAGERLY
        sig.inputs, sig.needs, sig.fwd, sig.output, sig.shape = inputs, needs, rec, flat, shape
        sig.binding = _binding(params)
        if recording:
            sig.tape = flat  # its private tape waits for the first backward
            sig.head = [empty(o.shape, o.dtype, o.device) for o in flat]
            # An output no gradient reaches in a call (an RNN's final state, unused) gets zeros as its head
            sig.zeros = [None] * len(flat)
            # The Parameters this forward used (as eager backward would, it marks only their gradients fresh: an
            # unused one stays stale for the Trainer to report).
            used = set()
            for o in flat:
                if o._node is not None:
                    used.update(id(x) for x in autograd.leaves(o))
            sig.leaves = [c for c in (_copy(p) for p in params if p._data is not None and p._grad_req != "null")
                          if id(c) in used]
        sig.state = READY
        return self._emit(sig, args, recording)

    def _record_backward(self, sig: Signature) -> None:
        tape, sig.tape = sig.tape, None

        heads = [(o, h) for o, h in zip(tape, sig.head) if o._node is not None]

        def backward():
            autograd.backward([o for o, _ in heads], head_grads=[h for _, h in heads])
        if TRACING:  # a recording cannot run inside a trace: this backward runs eagerly (and is traced), and
            backward()  # the signature records again at its next call, its private tape being spent now
            sig.state = WARM
            return
        rec = CallRecording(graph=_GRAPHS[0])
        rec.record(backward, parent=sig.fwd)  # a refusal is an error here: the forward ran as recorded
        sig.bwd = rec

    # -- replaying --------------------------------------------------------------------------------------------
    def _replay(self, sig: Signature, args: tuple, recording: bool):
        for x, a in zip(sig.inputs, args):
            x.copy_(a)
        if TRACING:
            _traced_replay(sig.fwd, ("",))
        else:
            sig.fwd.replay(current_stream(sig.output[0].device))
        self.replays += 1
        return self._emit(sig, args, recording)

    def _emit(self, sig: Signature, args: tuple, recording: bool):
        """The caller's output: a copy of the static one (the next call rewrites that), taped as one node."""
        with autograd.pause(train_mode=autograd.is_training()):
            outs = [o.copy() for o in sig.output]
        if not recording:
            return rebuild_arrays(outs, sig.shape)
        name = type(self._block()).__name__
        sig.serial += 1
        if len(outs) == 1:
            autograd.record_op(f"{self.KIND} {name}", outs[0], tuple(args) + tuple(sig.leaves),
                               self._grad_fn(sig, sig.serial))
        else:  # one node for every output: its backward gets their gradients together
            autograd.record_outputs(f"{self.KIND} {name}", tuple(outs), tuple(args) + tuple(sig.leaves),
                                    self._grad_fn(sig, sig.serial))
        sig.last = weakref.ref(outs[0]._node) if outs[0]._node is not None else None
        return rebuild_arrays(outs, sig.shape)

    def _grad_fn(self, sig: Signature, serial: int):
        def backward(g):
            if autograd.is_recording():
                raise NotImplementedError(f"a {self.KIND} Block's backward cannot itself be differentiated "
                                          f"(create_graph=True); {self.EAGER_HINT} for higher-order gradients")
            # The recorded backward reuses the activations' memory once it has read them, as eager backward
            # frees them: it runs once per forward.
            if sig.done == serial or sig.serial != serial or sig.fwd is None:
                raise RuntimeError(f"backward through a call of {self.KIND} {type(self._block()).__name__} whose "
                                   "activations are gone (a second backward with retain_graph=True, or the "
                                   f"recording was dropped); {self.EAGER_HINT} for this use")
            sig.done = serial
            writes = autograd.writes_leaf_grads()
            before = None if writes else [leaf._grad.copy() for leaf in sig.leaves]  # autograd.grad(): restore
            gs = g if isinstance(g, tuple) else (g,)
            gs += (None,) * (len(sig.head) - len(gs))
            for i, (head, gi) in enumerate(zip(sig.head, gs)):
                if gi is None:  # no gradient reached this output: zeros (kept, so a replay copies them in)
                    if sig.zeros[i] is None:
                        sig.zeros[i] = _zeros_like(head)
                    gi = sig.zeros[i]
                head.copy_(gi)
            if sig.bwd is None:
                self._record_backward(sig)
            elif TRACING:  # the recorded scopes already say "backward" where eager's would: drop the outer one
                _traced_replay(sig.bwd, ("", "backward"))
            else:
                sig.bwd.replay(current_stream(sig.output[0].device), _backward_pauses(sig) if writes else None)
            grads = tuple(x._grad.copy() if need else None for x, need in zip(sig.inputs, sig.needs))
            grads += self._leaf_grads(sig, writes, before)
            if sig.state is WARM:  # see _record_backward: drop the spent recording now that its grads are out
                sig.close()
            return grads
        return backward

    @staticmethod
    def _leaf_grads(sig: Signature, writes: bool, before) -> tuple:
        """The recorded backward wrote each Parameter's gradient into its ``.grad`` as a backward() of this Block
        alone would. What the caller's pass still needs from this node, per Parameter:
        - backward(), the Parameter used only here (or grad_req 'add', which sums in place): nothing;
        - backward(), grad_req 'write' and the Parameter also used elsewhere in the graph: this Block's part
          as a gradient, since the caller's pass writes the sum of all parts over ``.grad``;
        - autograd.grad(): this Block's part as a gradient, and ``.grad`` as it was before."""
        out = []
        if writes:
            for leaf in sig.leaves:
                if leaf._grad_req == "write" and autograd.grad_out(leaf) is not leaf._grad:
                    out.append(leaf._grad.copy())
                else:
                    out.append(None)
                autograd.mark_fresh(leaf)
            return tuple(out)
        for leaf, old in zip(sig.leaves, before):
            out.append(leaf._grad - old if leaf._grad_req == "add" else leaf._grad.copy())
            leaf._grad.copy_(old)
            autograd.clear_fresh(leaf)
        return tuple(out)

    def close(self) -> None:
        for sig in self._sigs.values():
            sig.close()
        self._sigs.clear()


def _backward_pauses(sig: Signature):
    """Where the replayed backward may pause to say that Parameters' gradients are final (replay's ``pauses``), or
    None. A launched Trainer's gradient buckets listen for that (autograd.register_grad_ready) to sum each bucket
    across processes while the backward goes on, as DDP does; a replay in one piece would tell them only at its
    end, with nothing left to overlap. The listener groups the Parameters it wants told together
    (``ready_groups``: a bucket's); each group's cut is after the last recorded call that points into one of its
    gradients (that call writes it: the recording knows no other way to reach it)."""
    listeners = autograd.ready_listeners(sig.leaves)
    groups = []
    for listener in dict.fromkeys(x for x in listeners if x is not None):
        ask = getattr(listener, "ready_groups", None)
        if ask is not None:
            groups += ask([leaf for leaf, x in zip(sig.leaves, listeners) if x is listener])
    if not groups:  # (no listener: every one-GPU program, one call and an empty loop)
        return None
    # the plan holds for this recording and these gradient buffers (a Trainer that packs again moves them)
    key = (weakref.ref(sig.bwd), tuple(tuple((id(leaf), leaf._grad.ptr) for leaf in g) for g in groups))
    plan = sig.pauses
    if plan is None or plan[0][0]() is not sig.bwd or plan[0][1] != key[1]:
        heard = [leaf for g in groups for leaf in g]  # (listeners hear only leaves with a gradient buffer)
        where = {id(leaf): k for k, leaf in enumerate(heard)}
        last = sig.bwd.last_uses([(leaf._grad.ptr, leaf._grad.ptr + leaf._grad.nbytes) for leaf in heard])
        n, at = len(sig.bwd.calls), {}
        for g in groups if last is not None else ():  # None: calls whose buffers are not known: no pauses
            cut = max(last[where[id(leaf)]] for leaf in g) + 1
            if 0 < cut < n:  # written before the last call: worth a pause (the rest is told after the node)
                at.setdefault(cut, []).extend(g)
        cuts = tuple(sorted(at))
        plan = sig.pauses = (key, cuts, [at[c] for c in cuts])
    if not plan[1]:
        return None
    told = plan[2]

    def pause(k: int) -> None:
        for leaf in told[k]:
            autograd.ready_now(leaf)
    return plan[1], pause


def _trace_name(block) -> str:
    return block.__dict__.get("_trace_name") or type(block).__name__.lower()  # as Block.__call__ names it


def _traced_replay(rec: CallRecording, outer: tuple) -> None:
    """A replay inside dnnbind.trace(), call by call. Each recorded call re-opens its scopes from this Block's own
    name down ("net/conv1/conv_forward", "net/conv1/backward/conv_backward_data"), so the scopes the caller
    opened for this Block (``outer``, innermost last: Block.__call__'s name, and autograd's "backward" around
    this node) are closed meanwhile; the trace then reads as an eager call's."""
    st = hooks.stack()
    closed = []
    for name in reversed(outer):
        if not st or (name and st[-1][0] != name):
            break
        closed.append(st[-1][:2])
        hooks.pop()
    try:
        rec.replay()
    finally:
        for name, op in reversed(closed):
            hooks.push(name, op)


_block.set_cached_block_factory(CachedBlock)


def _zeros_like(x: NDArray) -> NDArray:
    return zeros(x.shape, x.dtype, x.device)
