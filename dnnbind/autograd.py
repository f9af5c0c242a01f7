"""Layer 3 (autograd): record(), the tape, backward(). Imports runtime and ops.

Each recorded op attaches a ``Node(backward, inputs)`` to its output; ``backward`` is a closure written
beside the op's forward (in dnnbind.nd) that maps the output's gradient to one gradient per input (None
where an input needs none). ``backward()`` below is a topological sort and one loop. Gradients of leaves
land in their preallocated ``_grad`` buffers (``attach_grad``/``mark_variables``): overwritten for
grad_req "write", accumulated for "add".
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from ._lib import hooks
from ._lib.hooks import TRACING
from .ops.blas import axpy, copy as copy_into
from .runtime.array import NDArray, register_autograd, zeros

_tls = threading.local()


def is_recording() -> bool:
    return getattr(_tls, "recording", False)


def is_training() -> bool:
    return getattr(_tls, "training", False)


class _Scope:
    def __init__(self, recording, training):
        self._rec, self._train = recording, training

    def __enter__(self):
        self._prev = (is_recording(), is_training())
        if self._rec is not None:
            _tls.recording = self._rec
        if self._train is not None:
            _tls.training = self._train
        return self

    def __exit__(self, *exc):
        _tls.recording, _tls.training = self._prev


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
    _tls.recording = bool(flag)
    return prev


def set_training(flag: bool) -> bool:
    prev = is_training()
    _tls.training = bool(flag)
    return prev


class Node:
    __slots__ = ("backward", "inputs", "name", "scope")

    def __init__(self, backward, inputs, name):
        self.backward, self.inputs, self.name, self.scope = backward, inputs, name, None


def needs_grad(x) -> bool:
    return isinstance(x, NDArray) and (x._node is not None or x._grad_req != "null")


def record_op(name: str, output: NDArray, inputs: tuple, backward) -> NDArray:
    """Tape ``output = op(*inputs)`` if recording and some input needs a gradient."""
    if getattr(_tls, "recording", False):
        for x in inputs:
            if x is not None and (x._node is not None or x._grad_req != "null"):
                node = output._node = Node(backward, inputs, name)
                if TRACING:  # keep the Block path (net.conv1) so the backward's calls are traced under it
                    node.scope = hooks.current_path()
                break
    return output


def attach_grad(x: NDArray, grad_req: str = "write") -> None:
    if grad_req not in ("write", "add", "null"):
        raise ValueError(f"attach_grad: grad_req must be 'write', 'add' or 'null', got {grad_req!r}")
    x._grad_req = grad_req
    x._grad = None if grad_req == "null" else zeros(x.shape, x.dtype, x.device)
    x._node = None


def mark_variables(variables, gradients, grad_reqs="write") -> None:
    """Make ``gradients[i]`` (preallocated, e.g. a view of a flat buffer) receive variables[i]'s gradient."""
    if isinstance(variables, NDArray):
        variables, gradients = [variables], [gradients]
    reqs = [grad_reqs] * len(variables) if isinstance(grad_reqs, str) else list(grad_reqs)
    for var, grad, req in zip(variables, gradients, reqs):
        if grad is not None and grad.shape != var.shape:
            raise ValueError(f"mark_variables: gradient shape {grad.shape} != variable shape {var.shape}")
        var._grad_req, var._grad, var._node = req, (grad if req != "null" else None), None


# Leaves written by the last backward and not yet consumed by a Trainer (its stale-gradient check). Weak values:
# a plain autograd loop without a Trainer must not keep every leaf it ever differentiated alive.
_fresh: "weakref.WeakValueDictionary[int, NDArray]" = weakref.WeakValueDictionary()


def is_fresh(x: NDArray) -> bool:
    return _fresh.get(id(x)) is x


def clear_fresh(x: NDArray) -> None:
    _fresh.pop(id(x), None)


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
            raise TypeError(f"grad: variables[{i}] must be an NDArray, got {type(v).__name__}")
        if v._node is None and v._grad_req == "null":
            raise ValueError(f"grad: variables[{i}] (shape {v.shape}) is not part of the recorded graph; call "
                             "attach_grad() on it before autograd.record()")
    if retain_graph is None:
        retain_graph = create_graph
    got = _run(heads, head_grads, retain_graph, variables, create_graph, train_mode)
    out = [got.get(id(v)) if got.get(id(v)) is not None else zeros(v.shape, v.dtype, v.device) for v in variables]
    return out[0] if single else out


def _run(heads, head_grads, retain_graph, variables, create_graph, train_mode):
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
                               "arrays with attach_grad() (or Parameters); nothing to differentiate")
        _topo(h, seen, order)
    wanted = None if variables is None else {id(v) for v in variables}
    found: dict[int, NDArray] = {}
    # Leaves with grad_req "write" that receive exactly one gradient can have it written straight into their
    # grad buffer by the op's backward (see grad_out): no temporary, no copy (8 fewer copies per CNN step).
    uses: dict[int, int] = {}
    for x in order:
        if x._node is not None:
            for inp in x._node.inputs:
                if inp is not None and inp._node is None:
                    uses[id(inp)] = uses.get(id(inp), 0) + 1
    _tls.direct = {} if wanted is not None else {
        i: x._grad for x in order if x._node is None and x._grad_req == "write" and x._grad is not None
        and uses.get(id(x)) == 1 for i in (id(x),)}
    grads: dict[int, NDArray] = {}
    # The gradient ops are table ops: taped only when a graph of the gradient is asked for.
    prev = (is_recording(), is_training())
    _tls.recording, _tls.training = bool(create_graph), bool(train_mode)
    try:
        for h, g in zip(heads, head_grads):
            g = _ones_like(h) if g is None else (g if isinstance(g, NDArray) else _as_array(g, h))
            _accumulate(grads, h, g)
        for x in reversed(order):
            g = grads.pop(id(x), None)
            node = x._node
            if wanted is not None and id(x) in wanted and g is not None:
                found[id(x)] = g
            if node is None:  # a leaf
                if wanted is None and g is not None and x._grad_req != "null":
                    if x._grad_req == "add":
                        _add_into(g, x._grad)
                    elif g is not x._grad:
                        copy_into(g, x._grad)
                    _fresh[id(x)] = x
                continue
            if g is None:
                continue
            if node.scope is not None and TRACING:
                with hooks.scopes(node.scope):
                    in_grads = node.backward(g)
            else:
                in_grads = node.backward(g)
            for inp, ig in zip(node.inputs, in_grads):
                if ig is not None and inp is not None and (inp._node is not None or inp._grad_req != "null"):
                    _accumulate(grads, inp, ig)
            if not retain_graph:
                x._node = None
    finally:
        _tls.recording, _tls.training = prev
        _tls.direct = None
    return found


def grad_out(x):
    """Inside backward: the buffer an op's backward may write x's gradient into directly, else None."""
    direct = getattr(_tls, "direct", None)
    return direct.get(id(x)) if direct else None


def _topo(x, seen, order):
    # Iterative DFS: deep graphs (long RNN-like chains) must not hit Python's recursion limit.
    stack = [(x, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if node._node is not None:
            for inp in node._node.inputs:
                if inp is not None and id(inp) not in seen and (inp._node is not None or inp._grad_req != "null"):
                    stack.append((inp, False))


def _accumulate(grads, x, g):
    prev = grads.get(id(x))
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
    if out._data is not None:  # host: numpy fills any dtype
        out._data[...] = 1
        return out
    if out._dtype in (np.float32, np.float64):
        from .ops.blas import fill
        return fill(out, 1.0)
    from .nd._lower import fill_strided  # float16 and the rest: the generated kernel takes every dtype
    fill_strided(out, 1, contiguous_strides(out.shape), 0, out.shape)
    return out


def _as_array(g, like):
    from .runtime.array import array
    return array(g, device=like.device, dtype=like.dtype)


def _view(src: NDArray, out: NDArray) -> NDArray:
    """reshape()/flatten() of a taped array is itself taped: the gradient is reshaped back."""
    shape = src.shape
    return record_op("reshape", out, (src,), lambda g: (g.reshape(shape),))


def _attach(x, req):
    attach_grad(x, req)


def _backward(x, out_grad, retain_graph):
    backward(x, out_grad, retain_graph)


register_autograd(backward=_backward, attach_grad=_attach, view=_view)
