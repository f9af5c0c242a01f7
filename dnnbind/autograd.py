"""Layer 3 (autograd): record(), the tape, backward(). Imports runtime and ops.

Each recorded op attaches a ``Node(backward, inputs)`` to its output; ``backward`` is a closure written
beside the op's forward (in dnnbind.nd) that maps the output's gradient to one gradient per input (None
where an input needs none). ``backward()`` below is a topological sort and one loop. Gradients of leaves
land in their preallocated ``_grad`` buffers (``attach_grad``/``mark_variables``): overwritten for
grad_req "write", accumulated for "add". ``register_grad_ready`` lets a listener hear, during backward(), the moment
a leaf's gradient is final (a launched Trainer starts summing it across processes then, as PyTorch's DDP does).

NOTE: a Node's inputs are the inputs' Nodes (and, for leaves, the leaf arrays), never intermediate arrays: the
graph itself keeps no activation alive. An activation lives only as long as some backward closure saves it (as
in PyTorch), so one that no gradient formula needs (BatchNorm's output feeding a ReLU that differentiates from
its own output) is freed in the forward. backward() also drops each Node's closure once it has run, so saved
activations are freed during the backward, not after it.

While recording, in-place writes follow MXNet 1.x (``check_write``): an array with a place in the graph (a taped
output, a variable, a constant input of a taped op, a view of one) may not be overwritten, since a saved value
would silently change a gradient; a whole-array copy of a graph array into a fresh one is taped (``record_copy``).
"""

from __future__ import annotations

from ._lib.errors import DnnbindTypeError, DnnbindValueError

import threading
import weakref

import numpy as np

from ._lib import hooks
from ._lib.hooks import TRACING
from .ops.blas import axpy, copy as copy_into
from .runtime.array import NDArray, register_autograd, zeros

# The calling thread's autograd state. Each field is absent until first set (read with a default):
#   recording: ops are taped (record(), pause(), set_recording(); default False)
#   training:  ops run in training mode (record(), train_mode(), set_training(); default False)
#   direct, writes, retain: set by backward() for the pass in progress (grad_out/grad_buffer, writes_leaf_grads,
#   frees_graph read them).
# NOTE: public so that nd's per-op dispatch can test ``thread_state.__dict__.get("recording")`` inline: on that
# hot path a call to is_recording() costs more than the lookup itself. Elsewhere it is read, and changed only
# through the functions here (nd's untaped_call also turns ``recording`` off around one call and back on).
thread_state = threading.local()


def is_recording() -> bool:
    return getattr(thread_state, "recording", False)


def is_training() -> bool:
    return getattr(thread_state, "training", False)


class _Scope:
    def __init__(self, recording, training):
        self._rec, self._train = recording, training

    def __enter__(self):
        self._prev = (is_recording(), is_training())
        if self._rec is not None:
            thread_state.recording = self._rec
        if self._train is not None:
            thread_state.training = self._train
        return self

    def __exit__(self, *exc):
        thread_state.recording, thread_state.training = self._prev


def record(train_mode: bool = True) -> _Scope:
    """``with autograd.record():`` ops inside are taped for backward (and run in training mode)."""
    return _Scope(True, train_mode)


def pause(train_mode: bool = False) -> _Scope:
    return _Scope(False, train_mode)


def train_mode() -> _Scope:
    return _Scope(None, True)


def predict_mode() -> _Scope:
    return _Scope(None, False)


def set_recording(flag: bool) -> bool:
    prev = is_recording()
    thread_state.recording = bool(flag)
    return prev


def set_training(flag: bool) -> bool:
    prev = is_training()
    thread_state.training = bool(flag)
    return prev


class Node:
    """One taped op. ``inputs[i]``: the Node that made input i, the leaf array itself (a gradient goes into its
    ``_grad``), or None (input i needs no gradient). ``output``: a weak reference to the output array, whose
    ``_node`` is cleared when the graph is freed (so the array no longer counts as taped). ``consts``: weak
    references to the inputs that need no gradient, held in the graph (``in_graph``) until the node is freed."""
    __slots__ = ("backward", "inputs", "name", "scope", "output", "consts", "siblings", "__weakref__")  # weak: hybrid.py

    def __init__(self, backward, inputs, name, output):
        self.backward, self.inputs, self.name, self.scope = backward, inputs, name, None
        self.output = weakref.ref(output)
        self.consts = ()
        self.siblings = ()  # the nodes of an op's other outputs (record_outputs): freed with this one

    def free(self) -> None:
        """Drop the closure (and the activations it saves) and the edges; untape the output and the constants."""
        out = self.output()
        if out is not None and out._node is self:
            out._node = None
        for ref in self.consts:
            c = ref()
            if c is not None and _consts.get(id(c)) is c:
                del _consts[id(c)]
        siblings, self.siblings = self.siblings, ()
        for sib in siblings:  # an RNN's final states leave the graph with its output, as in MXNet
            sib.free()
        self.backward, self.inputs, self.consts = None, (), ()


class Released:
    """Stands in, inside a backward closure, for an operand whose values the gradient formula does not read (an
    nd op declared with ``saves``): its shape and dtype, and whether it needs a gradient, without its memory."""
    __slots__ = ("shape", "dtype", "needs")

    def __init__(self, x: NDArray):
        self.shape, self.dtype, self.needs = x.shape, x.dtype, needs_grad(x)


def needs_grad(x) -> bool:
    if isinstance(x, NDArray):
        return x._node is not None or x._grad_req != "null"
    return type(x) is Released and x.needs


def record_op(name: str, output: NDArray, inputs: tuple, backward) -> NDArray:
    """Tape ``output = op(*inputs)`` if recording and some input needs a gradient."""
    if getattr(thread_state, "recording", False):
        edges = consts = None
        for i, x in enumerate(inputs):
            if x is not None:
                n = x._node
                if n is not None or x._grad_req != "null":
                    if edges is None:
                        edges = [None] * len(inputs)
                    edges[i] = n if n is not None else x
                elif consts is None:
                    consts = [x]
                else:
                    consts.append(x)
        if edges is not None:
            node = output._node = Node(backward, tuple(edges), name, output)
            if consts is not None:  # MXNet gives them a place in the graph too: no in-place writes until freed
                for c in consts:
                    _consts[id(c)] = c
                node.consts = tuple(weakref.ref(c) for c in consts)
            if TRACING:  # keep the Block path (net.conv1) so the backward's calls are traced under it
                node.scope = hooks.current_path()
    return output


class _Slot:
    """The gradient of output ``index`` of a node with several differentiable outputs (RNN's output and final
    states), on its way to that node: the node's backward gets them all at once, as a tuple."""
    __slots__ = ("index", "count", "g")

    def __init__(self, index: int, count: int, g):
        self.index, self.count, self.g = index, count, g


class _Outputs(list):
    """The gradients gathered so far for a node with several differentiable outputs, one slot per output."""


def record_outputs(name: str, outputs: tuple, inputs: tuple, backward) -> tuple:
    """Tape an op with several outputs that all take a gradient: ``backward`` gets a tuple with one gradient per
    output (None where none reached it). Output 0 carries the op's node; each other output gets a node of its own
    that hands its gradient to it (so any of them can be a head, or be consumed alone)."""
    first = outputs[0]
    record_op(name, first, inputs, backward)
    node = first._node
    if node is not None and getattr(thread_state, "recording", False):
        n, siblings = len(outputs), []
        for i, o in enumerate(outputs[1:], 1):
            if o is not None:
                o._node = Node(lambda g, i=i: (_Slot(i, n, g),), (node,), f"{name}[{i}]", o)
                siblings.append(o._node)
        node.siblings = tuple(siblings)
    return outputs


# -- in-place writes while recording ---------------------------------------------------------------------------
# MXNet 1.x refuses to write into an array that has a place in the recorded graph (imperative.cc RecordOp): a
# recorded op's output until a backward frees it, a variable (attach_grad, any grad_req), and a constant input of
# a recorded op until a backward frees that op. Writing into another array with a value from the graph is a
# recorded copy when it covers the whole array (y[:] = x, x.copyto(y), out=y) and refused otherwise.
_consts: "weakref.WeakValueDictionary[int, NDArray]" = weakref.WeakValueDictionary()
_null_vars: "weakref.WeakValueDictionary[int, NDArray]" = weakref.WeakValueDictionary()  # attach_grad('null')

ASSIGN_MSG = ("Check failed: AGInfo::IsNone(*output): Assigning to NDArrays that are already in a computational "
              "graph will cause undefined behavior when evaluating gradients. Please call backward first to clear "
              "the graph or do this out side of a record section. Also note that you cannot use inplace operations "
              "like +=, *=, relu(x, out=x), y[idx]=x, etc inside a record section.")
INPLACE_MSG = ("Check failed: AGInfo::IsNone(*output): Inplace operations (+=, -=, x[:]=, etc) are not supported "
               "when recording with autograd.")


class GraphWriteError(DnnbindValueError):
    """An in-place write into an array of the recorded graph (MXNet's AGInfo::IsNone check): an MXNetError."""


def in_graph(x) -> bool:
    """Whether x has a place in the recorded graph (MXNet: the array has an AGInfo)."""
    return (x._node is not None or x._grad_req != "null" or _consts.get(id(x)) is x
            or _null_vars.get(id(x)) is x)


def check_write(x: NDArray, value=None, covers=None) -> bool:
    """Before writing ``value`` into x in place (``x op= value``, ``x[key] = value``, ``value.copyto(x)``), while
    recording: raise where MXNet raises; True when the write must be taped as a copy (``record_copy``).
    ``covers``: a callable saying whether the write replaces all of x (None: an update, x is also an input)."""
    if not getattr(thread_state, "recording", False):
        return False
    if in_graph(x):
        raise GraphWriteError(ASSIGN_MSG)
    if isinstance(value, NDArray) and in_graph(value):
        if covers is None or not covers():
            raise GraphWriteError(INPLACE_MSG)
        return needs_grad(value)
    return False


def hold(out, inputs) -> None:
    """While recording: the output of an op that tapes nothing (no input needs a gradient, or the op has none) but
    reads arrays of the graph has its place in the graph too (MXNet records it), so in-place writes are refused."""
    if any(isinstance(x, NDArray) and in_graph(x) for x in inputs):
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, NDArray):
                _consts[id(o)] = o


def take_place(old: NDArray, new: NDArray) -> None:
    """``new`` (which already holds ``old``'s slots) stands for ``old`` in the recorded graph from now on: the node
    that made ``old`` names ``new`` as its output, and a place ``old`` held as a constant moves to ``new``. Used by
    dnnbind.eager_replay, which hands a deferred op's result to the array object the caller already holds."""
    node = old._node
    if node is not None and node.output() is old:
        node.output = weakref.ref(new)
    for table in (_consts, _null_vars):
        if table.get(id(old)) is old:
            table[id(new)] = new


def record_copy(src: NDArray, out: NDArray, backward=None) -> NDArray:
    """Tape ``out`` as a copy of ``src`` (copy(), copyto(), to(), a whole-array assignment): the gradient goes back
    to src's device and dtype (``backward`` replaces that where the copy also broadcast)."""
    if getattr(thread_state, "recording", False) and needs_grad(src):
        if backward is None:
            dev, dtype = src.device, src.dtype
            backward = lambda g: (g if g.device is dev and g.dtype == dtype else g.to(dev, dtype),)  # noqa: E731
        record_op("_copyto", out, (src,), backward)
    return out


def attach_grad(x: NDArray, grad_req: str = "write") -> None:
    if grad_req not in ("write", "add", "null"):
        raise DnnbindValueError(f"attach_grad: grad_req must be 'write', 'add' or 'null', got {grad_req!r}")
    x._grad_req = grad_req
    x._grad = None if grad_req == "null" else zeros(x.shape, x.dtype, x.device)
    x._node = None
    _mark_null(x, grad_req)


def _mark_null(x: NDArray, grad_req: str) -> None:
    """A variable with grad_req 'null' still has its place in the graph (MXNet: no in-place writes while recording)."""
    if grad_req == "null":
        _null_vars[id(x)] = x
    else:
        _null_vars.pop(id(x), None)


def mark_variables(variables, gradients, grad_reqs="write") -> None:
    """Make ``gradients[i]`` (preallocated, e.g. a view of a flat buffer) receive variables[i]'s gradient."""
    if isinstance(variables, NDArray):
        variables, gradients = [variables], [gradients]
    reqs = [grad_reqs] * len(variables) if isinstance(grad_reqs, str) else list(grad_reqs)
    for var, grad, req in zip(variables, gradients, reqs):
        if grad is not None and grad.shape != var.shape:
            raise DnnbindValueError(f"mark_variables: gradient shape {grad.shape} != variable shape {var.shape}")
        var._grad_req, var._grad, var._node = req, (grad if req != "null" else None), None
        _null_vars.pop(id(var), None)  # NOTE: a Parameter with grad_req 'null' comes here; MXNet leaves it unmarked


# Leaves written by the last backward and not yet consumed by a Trainer (its stale-gradient check). Weak values:
# a plain autograd loop without a Trainer must not keep every leaf it ever differentiated alive.
_fresh: "weakref.WeakValueDictionary[int, NDArray]" = weakref.WeakValueDictionary()


def is_fresh(x: NDArray) -> bool:
    return _fresh.get(id(x)) is x


def mark_fresh(x: NDArray) -> None:
    """Say that a backward just wrote x's gradient (a hybridized Block's replayed backward writes it directly)."""
    _fresh[id(x)] = x


def clear_fresh(x: NDArray) -> None:
    _fresh.pop(id(x), None)


# Listeners told when a leaf's gradient is final in a backward() (the Trainer's gradient buckets start summing it
# across processes while the backward goes on, as PyTorch's DDP does). Empty, as in every single-GPU program,
# backward() pays one dict test for it.
_ready: dict[int, tuple] = {}  # id(leaf) -> (weak reference to the leaf, listener)


def register_grad_ready(x: NDArray, listener) -> None:
    """Call ``listener.grad_ready(x)`` in every backward() that reaches x, as soon as x's gradient is final: the
    last node that contributes to it has run and the gradient is in ``x.grad`` (queued on the current stream);
    then ``listener.backward_done()`` once when that backward ends (also when it raised). Only backward() calls
    them, not autograd.grad() nor the backward a hybridized Block replays inside the caller's. One listener per
    leaf: a second registration replaces the first; ``unregister_grad_ready`` removes it."""
    _ready[id(x)] = (weakref.ref(x), listener)


def unregister_grad_ready(x: NDArray) -> None:
    entry = _ready.get(id(x))
    if entry is not None and entry[0]() is x:
        del _ready[id(x)]


def ready_listeners(leaves) -> list:
    """Inside a node's backward, in a backward() pass: per leaf of ``leaves``, its grad-ready listener where this
    node is the last to use the leaf in this pass and writes its gradient straight into ``.grad`` (grad_req
    'write', used once), else None. Such a node, whose own backward runs in stages (a replayed recording), may
    tell the listener itself with ``ready_now`` as soon as a stage has queued the leaf's final gradient, instead
    of the pass telling it after the whole node."""
    if not getattr(thread_state, "ready", None):  # nobody listens in this pass (every one-GPU program)
        return [None] * len(leaves)
    return [None if entry is None else entry[1] for entry in map(_own_entry, leaves)]


def ready_now(x: NDArray) -> None:
    """A leaf ``ready_listeners`` named: its final gradient is queued in ``.grad`` now. Its listener is told at
    once, and the pass will not tell it again (for another leaf this does nothing)."""
    entry = _own_entry(x)
    if entry is not None:
        del thread_state.ready[id(x)]
        _fresh[id(x)] = x
        _tell(entry[1], x, thread_state.told)


def _own_entry(x):
    """The pass's waiting entry for leaf x where the running node is its last user and writes it directly."""
    ready = getattr(thread_state, "ready", None)
    entry = ready.get(id(x)) if ready else None
    if entry is not None and entry[0] == 1 and thread_state.direct.get(id(x)) is x._grad is not None:
        return entry
    return None


def backward(heads, head_grads=None, retain_graph: bool = False, train_mode: bool = True) -> None:
    """Accumulate d(sum of heads)/d(leaf) into every leaf's grad. A non-scalar head gets implicit ones."""
    _run(heads, head_grads, retain_graph, None, False, train_mode)


def grad(heads, variables, head_grads=None, retain_graph=None, create_graph: bool = False,
         train_mode: bool = True):
    """MXNet's ``autograd.grad``: the gradients of ``heads`` w.r.t. ``variables``, returned as a list (a single
    array for a single variable) without touching any ``.grad``. ``create_graph=True`` tapes the gradient
    computation itself, so the result can be differentiated again."""
    single = isinstance(variables, NDArray)
    variables = [variables] if single else list(variables)
    for i, v in enumerate(variables):
        if not isinstance(v, NDArray):
            raise DnnbindTypeError(f"grad: variables[{i}] must be an NDArray, got {type(v).__name__}")
        if v._node is None and v._grad_req == "null":
            raise DnnbindValueError(f"grad: variables[{i}] (shape {v.shape}) is not part of the recorded graph; call "
                             "attach_grad() on it before autograd.record()")
    if retain_graph is None:
        retain_graph = create_graph
    keys = [id(_vertex(v)) for v in variables]  # before _run: freeing the graph untapes the arrays
    got = _run(heads, head_grads, retain_graph, keys, create_graph, train_mode)
    out = [got.get(k) if got.get(k) is not None else zeros(v.shape, v.dtype, v.device)
           for k, v in zip(keys, variables)]
    return out[0] if single else out


def leaves(head: NDArray) -> list:
    """The leaf arrays (attach_grad'ed arrays, Parameters' data) the graph of ``head`` reaches."""
    if head._node is None:
        return [head] if head._grad_req != "null" else []
    order: list = []
    _topo(head._node, set(), order)
    return [v for v in order if type(v) is not Node]


def _vertex(x):
    """x's place in the graph: the Node that made it, or x itself for a leaf."""
    return x._node if x._node is not None else x


_kept_graphs = [False]  # whether a backward pass has kept its graph (retain_graph) or taped itself (create_graph)


def keeps_graphs() -> bool:
    """Whether this program has run a backward pass with ``retain_graph=True`` or ``create_graph=True``: a graph
    whose nodes must be able to run their backward twice, or be differentiated (dnnbind.eager_replay then keeps
    recorded calls eager, as their replayed backward can do neither)."""
    return _kept_graphs[0]


def _run(heads, head_grads, retain_graph, wanted_keys, create_graph, train_mode):
    """The backward pass. Vertices are Nodes and leaf arrays, keyed by id; ``wanted_keys``: the vertex ids whose
    gradients autograd.grad() returns (None: backward(), which writes the leaves' ``_grad``)."""
    if retain_graph or create_graph:
        _kept_graphs[0] = True
    if isinstance(heads, NDArray):
        heads, head_grads = [heads], [head_grads]
    elif head_grads is None:
        head_grads = [None] * len(heads)
    elif isinstance(head_grads, NDArray):
        head_grads = [head_grads]
    order, seen = [], set()
    for h in heads:
        if h._node is None and h._grad_req == "null":
            raise RuntimeError("backward: this array was not computed inside `with autograd.record():` from "
                               "arrays with attach_grad() (or Parameters), or its graph was already freed by a "
                               "backward() without retain_graph=True; nothing to differentiate")
        _topo(_vertex(h), seen, order)
    wanted = None if wanted_keys is None else set(wanted_keys)
    found: dict[int, NDArray] = {}
    # Leaves with grad_req "write" that receive exactly one gradient can have it written straight into their
    # grad buffer by the op's backward (see grad_out): no temporary, no copy (8 fewer copies per CNN step).
    uses: dict[int, int] = {}
    prev_direct = getattr(thread_state, "direct", None)  # a backward run inside another's (a hybridized Block's)
    prev_writes = getattr(thread_state, "writes", True)
    prev_retain = getattr(thread_state, "retain", False)
    thread_state.writes, thread_state.retain = wanted_keys is None, bool(retain_graph)
    for v in order:
        if type(v) is Node:
            for inp in v.inputs:
                if inp is not None and type(inp) is not Node:
                    uses[id(inp)] = uses.get(id(inp), 0) + 1
    thread_state.direct = {} if wanted is not None else {
        id(x): x._grad for x in order if type(x) is not Node and x._grad_req == "write" and x._grad is not None
        and uses.get(id(x)) == 1}
    # Leaves someone waits for (register_grad_ready), with the count of nodes still to run that use them: at 0 the
    # gradient is written and the listener told then, not when the loop reaches the leaf (after every node).
    ready = _waiting(order, uses) if _ready and wanted is None and prev_direct is None else None
    told: dict = {}
    prev_ready = getattr(thread_state, "ready", None)
    thread_state.ready, thread_state.told = ready, told  # a node may say itself when a leaf is final (ready_now)
    grads: dict[int, NDArray] = {}
    # The gradient ops are table ops: taped only when a graph of the gradient is asked for.
    prev = (is_recording(), is_training())
    thread_state.recording, thread_state.training = bool(create_graph), bool(train_mode)
    try:
        for h, g in zip(heads, head_grads):
            g = _ones_like(h) if g is None else (g if isinstance(g, NDArray) else _as_array(g, h))
            _accumulate(grads, _vertex(h), g)
        for x in reversed(order):
            g = grads.pop(id(x), None)
            if wanted is not None and id(x) in wanted and g is not None:
                found[id(x)] = g
            if type(x) is not Node:  # a leaf
                if wanted is None:
                    _write_leaf(x, g)
                    if ready and id(x) in ready:  # a head that is itself a leaf: no node uses it
                        _tell(ready.pop(id(x))[1], x, told)
                continue
            node = x
            if type(g) is _Outputs:  # a node with several outputs: its backward takes them all, as a tuple
                g = tuple(g)
            if g is None or node.backward is None:  # no gradient reached it, or an earlier backward freed it
                if ready:
                    _settle(node.inputs, ready, grads, told)
                if not retain_graph:
                    node.free()  # MXNet clears the whole graph, the nodes no gradient reached too
                continue
            # NOTE: the gradient is handed over, no reference kept here (a call moves its arguments into the
            # callee's frame): a backward done with dy early (a fused conv+bias+ReLU after its ReLU part) frees it
            # with `del dy` before it allocates the rest, as an unfused graph would free it between two nodes.
            box, g = [g], None
            if node.scope is not None and TRACING:
                with hooks.scopes(node.scope):
                    in_grads = node.backward(box.pop())
            else:
                in_grads = node.backward(box.pop())
            for inp, ig in zip(node.inputs, in_grads):
                if ig is not None and inp is not None:
                    _accumulate(grads, inp, ig)
            in_grads = ig = None  # grads holds them now: nothing here may keep them past their consumer
            if ready:
                _settle(node.inputs, ready, grads, told)
            if not retain_graph:
                node.free()
    finally:
        thread_state.recording, thread_state.training = prev
        thread_state.direct, thread_state.writes, thread_state.retain = prev_direct, prev_writes, prev_retain
        thread_state.ready = prev_ready
        for listener in told:
            listener.backward_done()
    return found


def _write_leaf(x, g) -> None:
    """The leaf's gradient into its ``.grad``: overwritten ("write", unless an op wrote it there directly) or
    added ("add")."""
    if g is not None and x._grad_req != "null":
        if x._grad_req == "add":
            _add_into(g, x._grad)
        elif g is not x._grad:
            copy_into(g, x._grad)
        _fresh[id(x)] = x


def _waiting(order, uses) -> dict:
    """{id(leaf): [nodes still to run that use it, listener]} for the leaves of ``order`` someone listens to."""
    out = {}
    for x in order:
        if type(x) is not Node:
            entry = _ready.get(id(x))
            if entry is not None and entry[0]() is x:
                out[id(x)] = [uses.get(id(x), 0), entry[1]]
    return out


def _settle(inputs, ready, grads, told) -> None:
    """A node that uses these inputs has run (or was skipped): a listened-to leaf it was the last user of has its
    final gradient now, so write it and tell the listener."""
    for inp in inputs:
        if inp is not None and type(inp) is not Node:
            entry = ready.get(id(inp))
            if entry is not None:
                if entry[0] > 1:
                    entry[0] -= 1
                    continue
                del ready[id(inp)]
                _write_leaf(inp, grads.pop(id(inp), None))
                _tell(entry[1], inp, told)


def _tell(listener, x, told) -> None:
    told[listener] = True  # insertion-ordered: backward_done in the order the listeners first heard
    listener.grad_ready(x)


def writes_leaf_grads() -> bool:
    """Inside backward: whether this pass writes the leaves' ``.grad`` (backward()) or only returns gradients
    (autograd.grad()); a hybridized Block's replayed backward, which writes them itself, needs to know."""
    return getattr(thread_state, "writes", True)


def frees_graph() -> bool:
    """Inside backward: whether this pass frees the graph after each node (no retain_graph), so a node's backward
    may drop what it saved as soon as it has read it (its memory then goes back before the node's next call)."""
    return not getattr(thread_state, "retain", False)


def grad_out(x):
    """Inside backward: the buffer an op's backward may write x's gradient into directly, else None."""
    direct = getattr(thread_state, "direct", None)
    return direct.get(id(x)) if direct else None


def grad_buffer(key):
    """``grad_out`` by the input's ``id`` (taken when the op was taped): a tape that keeps an input's identity, not
    the array. Only leaves with a gradient buffer are found, and they stay alive, so the id is theirs."""
    direct = getattr(thread_state, "direct", None)
    return direct.get(key) if direct and key is not None else None


def _topo(vertex, seen, order):
    """Post-order of the vertices (Nodes, leaf arrays) reachable from ``vertex``: inputs before their users."""
    # Iterative DFS: deep graphs (long RNN-like chains) must not hit Python's recursion limit.
    stack = [(vertex, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack.append((v, True))
        if type(v) is Node:
            for inp in v.inputs:
                if inp is not None and id(inp) not in seen:
                    stack.append((inp, False))


def _accumulate(grads, x, g):
    prev = grads.get(id(x))
    if type(g) is _Slot or type(prev) is _Outputs:  # one output's gradient of a node with several
        if type(prev) is not _Outputs:
            count = g.count if type(g) is _Slot else 1
            slots = _Outputs([None] * count)
            slots[0] = prev
            grads[id(x)] = prev = slots
        i, g = (g.index, g.g) if type(g) is _Slot else (0, g)
        if i >= len(prev):
            prev.extend([None] * (i + 1 - len(prev)))
        prev[i] = g if prev[i] is None else (prev[i] + g if is_recording() else _add_into(g, prev[i].copy()))
        return
    if prev is None:
        grads[id(x)] = g
    elif is_recording():  # create_graph: the sum must be taped too
        grads[id(x)] = prev + g
    else:
        total = prev.copy()  # never add in place: prev may alias a buffer another node still reads
        grads[id(x)] = _add_into(g, total)


def _add_into(g, dst):
    """dst += g in place: cuBLAS axpy for float32/64; other dtypes (float16) through a generated kernel, as
    cuBLAS has no half-precision axpy."""
    if dst.dtype in (np.float32, np.float64):
        return axpy(1.0, g, dst)
    return dst.copy_(dst + g)


def _ones_like(x):
    # A fill kernel, not a host upload: backward() must not synchronize, so it can run inside graph capture.
    from .runtime.array import contiguous_strides, empty
    out = empty(x.shape, x.dtype, x.device)
    if not out.on_gpu:  # host: numpy fills any dtype
        out._data[...] = 1
        return out
    if out.dtype in (np.float32, np.float64):
        from .ops.blas import fill
        return fill(out, 1.0)
    from .nd._lower import fill_strided  # float16 and the rest: the generated kernel takes every dtype
    fill_strided(out, 1, contiguous_strides(out.shape), 0, out.shape)
    return out


def _as_array(g, like):
    from .runtime.array import array
    return array(g, device=like.device, dtype=like.dtype)


def _view(src: NDArray, out: NDArray) -> NDArray:
    """reshape()/flatten() of a taped array is itself taped: the gradient is reshaped back. A view of an array
    that is in the graph without a gradient is in the graph too (no in-place writes into it while recording)."""
    if not needs_grad(src):
        if getattr(thread_state, "recording", False):
            hold(out, (src,))
        return out
    shape = src.shape
    return record_op("reshape", out, (src,), lambda g: (g.reshape(shape),))


def _attach(x, req):
    attach_grad(x, req)


def _backward(x, out_grad, retain_graph):
    backward(x, out_grad, retain_graph)


register_autograd(backward=_backward, attach_grad=_attach, view=_view, check_write=check_write, copied=record_copy,
                  held=_consts)
