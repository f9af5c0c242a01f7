"""Layer ops: ``OpDef``, the registry entry of an operator whose forward and backward are library calls (cuDNN,
cuBLAS) or hand-written kernels, declared once beside those calls. Imports runtime and _lib only.

MXNet registers an operator once (``NNVM_REGISTER_OP``: parameters, shape and type inference, compute per device,
gradient); an OpDef is that registration for dnnbind. One entry carries:

- ``name``: MXNet's operator name. Its parameters (names, types, defaults, which are required) are MXNet 1.9.1's own
  declarations (nd/_mxnet_params.py, parsed by nd/_schema.py): they are looked up, not restated. ``extra`` declares
  dnnbind's additions in MXNet's type-info syntax (Convolution's ``act_type``, which fuses a ReLU).
- ``prepare(p, *arrays) -> geo``: every check of the arrays against the parsed parameters ``p``
  (ValueError/TypeError naming the op, the argument and the shapes, before any library call), returning what the
  lowerings want precomputed (the geometry). The dispatch caches it per (shapes, dtype, device, parameters), so a
  call seen before is checked once.
- ``infer(p, shapes) -> (input shapes, output shapes)``: shape inference without running, for symbol graphs
  (learned inputs such as a weight are filled in from the data's shape).
- ``mutates``: the inputs the op writes in place (BatchNorm's moving statistics): they must be NDArrays.
- ``nograd``: the inputs that take no gradient (labels, indices: MXNet's ops give them none).
- ``aux``, ``optional``, ``init``, ``outputs``: what a graph node needs beyond that (auxiliary states, the inputs
  a parameter turns off, the initializer MXNet attaches to an input's variable, the count and visible names of
  the outputs).
- ``cpu`` and ``gpu``: a ``Lowering`` each, (forward, backward). ``forward(c, *arrays) -> (outputs, saved)`` and
  ``backward(c, saved, grads, dy) -> one gradient per input`` (None where ``grads.needs`` says no); ``c`` is the
  call (``Call``: the geometry, the parsed parameters, the device, whether in training mode).
  The cpu lowering is the numpy twin: it takes and returns numpy arrays, is the cpu backend and is the tests'
  oracle. The gpu lowering takes and returns NDArrays and makes the library calls; its backend tactics (fusions,
  small-filter kernels, refusal caches) live with it, here in ops.
- ``samples(rng)``: valid calls (numpy inputs, parameters) for the tests parametrized over the registry.
- ``dtype(p, types, n_out) -> (input types, output types)``: type inference for symbol graphs, where an operator
  departs from MXNet's element-wise rule (every input and output of one type): BatchNorm's parameters stay
  float32 under float16 data, Embedding's weight and output are its ``dtype``. ``types`` holds a numpy dtype or
  None (unknown) per input; None as the rule means the element-wise one.
- ``grad_outputs``: every output takes a gradient (RNN's output and final states): the backward's ``dy`` is a
  tuple with one gradient per output, zeros where none reached that output. Otherwise only the first output
  carries a gradient (BatchNorm's mean and variance outputs take none, as in MXNet).
- ``loss``: the backward is the op's own defined gradient, not the derivative of its forward (MXNet's output
  layers: SoftmaxOutput's backward gives softmax - one_hot(label) and ignores the gradient from above), so the
  tests check it against MXNet's own gradients, not against central differences of the forward.

The dispatch (nd/_registry.py ``invoke``) parses the parameters, decides the backend once per call, runs the
lowering inside a trace scope named after the op, and tapes the backward with a ``Grads`` context: which inputs
want a gradient, the buffers a backward may write them into, whether the graph is freed as the backward runs.
A lowering never reads autograd's thread state.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..runtime.array import NDArray
from ..runtime.exec_context import exec_context

__all__ = ["Call", "DEFS", "Grads", "Lowering", "OpDef", "define", "float32_params", "table", "typed", "view"]


class Lowering(NamedTuple):
    forward: Callable
    backward: Callable | None = None


class Call:
    """One call of an operator, as the dispatch resolved it once: ``geo`` (what ``prepare`` returned), ``p`` (the
    parsed parameters, MXNet's defaults filled in), ``device`` and ``training`` (autograd's train mode). On a GPU,
    ``ctx()`` is where the call runs (runtime.exec_context: the device made current, its stream, the handles),
    resolved on first use and shared by everything the lowering calls."""
    __slots__ = ("geo", "p", "device", "training", "_exec")

    def __init__(self, geo, p: dict, device, training: bool):
        self.geo, self.p, self.device, self.training, self._exec = geo, p, device, training, None

    def ctx(self):
        e = self._exec
        if e is None:
            e = self._exec = exec_context(self.device)
        return e


class Grads:
    """What a backward is told: ``needs[i]`` whether input i wants a gradient, ``into[i]`` a buffer its gradient may
    be written into directly (a Parameter's grad buffer) or None, ``frees`` whether nothing reads what the forward
    saved after this backward (so it may drop it early). ``ctx(like)``: as Call.ctx, for the stream current when
    the backward runs (not the forward's), on ``device`` (or, where the caller gave none, ``like``'s)."""
    __slots__ = ("needs", "into", "frees", "device", "_exec")

    def __init__(self, needs: tuple, into: tuple, frees: bool, device=None):
        self.needs, self.into, self.frees, self.device, self._exec = needs, into, frees, device, None

    def ctx(self, like=None):
        e = self._exec
        if e is None:
            e = self._exec = exec_context(self.device if self.device is not None else like.device)
        return e


def _one_output(p) -> tuple:
    return 1, ["output"]


class OpDef:
    __slots__ = ("name", "extra", "prepare", "infer", "aux", "optional", "init", "outputs", "cpu", "gpu",
                 "samples", "nd", "doc", "mutates", "nograd", "loss", "dtype", "grad_outputs")

    def __init__(self, name: str, *, prepare: Callable, infer: Callable, cpu: Lowering, gpu: Lowering,
                 samples: Callable, extra: tuple = (), aux: tuple = (), optional: dict | None = None,
                 init: dict | None = None, outputs: Callable = _one_output, nd: tuple | None = None,
                 doc: str = "", mutates: tuple = (), nograd: tuple = (), loss: bool = False,
                 dtype: Callable | None = None, grad_outputs: bool = False):
        self.name, self.extra, self.prepare, self.infer = name, tuple(extra), prepare, infer
        self.aux, self.optional, self.init, self.outputs = tuple(aux), dict(optional or {}), dict(init or {}), outputs
        self.cpu, self.gpu, self.samples, self.doc = cpu, gpu, samples, doc
        self.nd = (name,) if nd is None else tuple(nd)
        self.mutates = tuple(mutates)  # inputs the op updates in place: NDArrays only (a numpy copy would lose it)
        self.nograd = tuple(nograd)  # inputs that take no gradient (class ids, indices): never perturbed by tests
        self.loss = bool(loss)  # backward = the op's defined gradient (an output layer), not its forward's derivative
        self.dtype = dtype  # type inference where the element-wise rule does not hold (see the module docstring)
        self.grad_outputs = bool(grad_outputs)  # the backward takes every output's gradient (a tuple)

    def __repr__(self) -> str:
        return f"<OpDef {self.name}>"


def typed(own: tuple = (), out: Callable | None = None) -> Callable:
    """A type rule: the inputs at ``own`` keep their own types (indices, lengths, a condition); the other inputs
    and the outputs share one type, unless ``out(p, t)`` gives the output types (one_hot's ``dtype``, argsort's
    indices, shape_array's int64) from the parameters and the shared type ``t`` (None while unknown)."""
    def rule(p, types, n_out):
        t = next((x for i, x in enumerate(types) if i not in own and x is not None), None)
        ins = [types[i] if i in own else t for i in range(len(types))]
        return ins, (list(out(p, t)) if out is not None else [t] * n_out)
    return rule


def float32_params(p, types, n_out):
    """The normalization layers' type rule (MXNet's BatchNorm): the output has the data's type; the learned
    parameters and statistics (every input after data, and the hidden mean/var outputs) are float32 under float16
    data, else the data's type."""
    import numpy as np
    t = types[0]
    if t is None:
        return types, [None] * n_out
    pt = np.dtype(np.float32) if t == np.float16 else t
    return [t] + [pt] * (len(types) - 1), [t] + [pt] * (n_out - 1)


DEFS: dict[str, OpDef] = {}


def define(d: OpDef) -> OpDef:
    """Declare an operator (at import of its module in ops/defs/); nd registers every declared one."""
    if d.name in DEFS:
        raise ValueError(f"operator {d.name!r} is declared twice")
    DEFS[d.name] = d
    return d


def view(x: NDArray, shape: tuple) -> NDArray:
    """``x`` seen with another shape of the same size, not taped (a lowering's reshapes are inside its op)."""
    if not x.on_gpu:
        return NDArray._from_numpy(x._data.reshape(shape))
    return NDArray._from_ptr(x.ptr, shape, x.dtype, x.device, x._owner)


_table_call: Callable | None = None


def table(name: str, *args, **params):
    """Run nd's table op ``name`` (element-wise, reduction, shape op; nd/_table.py) untaped, on either backend: what
    a lowering composes where no library call fits (softrelu, softmax over a middle axis). Its own backward
    composes the gradient the same way. nd installs the entry point at import (``set_table``), so ops does not
    import nd."""
    return _table_call(name, *args, **params)


def set_table(call: Callable) -> None:
    global _table_call
    _table_call = call
