"""MXNet's sequence operators over (T, B, ...) data (``axis`` 0) or (B, T, ...) data (``axis`` 1), each with an
optional ``sequence_length`` input of B lengths (``use_sequence_length``):

- ``SequenceMask``: the steps at or past each length set to ``value``; the gradient passes through the rest.
- ``SequenceLast``: (B, ...), each sequence's last step (``length - 1``, or T - 1 without lengths).
- ``SequenceReverse``: the first ``length`` steps of each sequence reversed, the padding left in place (axis 0 only,
  as in MXNet).

Lengths are any numeric array; float lengths are truncated toward zero, as MXNet's ``static_cast<int>``. MXNet
checks no length against T: where its kernels would read or write outside the data, the call is refused here,
naming the op, the argument, the value and the shapes. What MXNet computes soundly is kept: a mask length of 0
masks the whole sequence, one past T masks nothing, a reverse length of 0 leaves the sequence as it is. Refused:
negative or non-finite lengths (all three), SequenceLast lengths outside [1, T] (MXNet returns memory before the
data for 0), SequenceReverse lengths past T (MXNet corrupts the heap).

The gradient goes to the data only; ``sequence_length`` takes none (``nograd``). SequenceLast's gradient without
lengths goes to step T - 1, the derivative of its forward (MXNet 1.9.1's backward reads an uninitialized length
buffer there: wrong values, or a crash).

cpu: the numpy twin (ops/reference/sequence.py). gpu: each op is a gather of whole (d0 * d1) rows of the data seen
as (rows, rest): the table's ``take`` (composed through ``ops.opdef.table``), with one extra row of ``value``
(SequenceMask) or zeros (the SequenceMask and SequenceLast backwards) that the masked rows read. The row indices
are computed on the host from the lengths, which are read back there first: checking them against T needs their
values, and B numbers are one small copy (so a call with lengths synchronizes with the device, and cannot be
captured in a CUDA graph).
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import array, full, zeros
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import sequence as ref


class Geometry:
    __slots__ = ("op", "axis", "t", "b", "rest", "shape", "out_shape", "lengths_shape")

    def rows(self) -> int:
        return self.shape[0] * self.shape[1]

    def context(self) -> str:
        return (f"data {self.shape}, axis {self.axis}: T = {self.t} steps, B = {self.b} sequences"
                + (f"; sequence_length {self.lengths_shape}" if self.lengths_shape is not None else ""))


def _axes(op: str, p, shape: tuple) -> tuple[int, int, int]:
    """(axis, T, B), with MXNet's shape checks: rank >= 2, axis 0 or 1 (SequenceReverse: 0)."""
    if len(shape) < 2:
        raise DnnbindValueError(f"{op}: data must be of rank 2 or greater ((T, B, ...) or (B, T, ...)), got shape "
                                f"{tuple(shape)}")
    axis = p["axis"]
    allowed = (0,) if op == "SequenceReverse" else (0, 1)
    if axis not in allowed:
        raise DnnbindValueError(f"{op}: axis must be {' or '.join(map(str, allowed))} (the sequence axis), got "
                                f"{axis} (data {tuple(shape)})")
    return (0, shape[0], shape[1]) if axis == 0 else (1, shape[1], shape[0])


def _out_shape(op: str, shape: tuple, b: int) -> tuple:
    return (b, *shape[2:]) if op == "SequenceLast" else tuple(shape)


def _prepare_for(op: str):
    def prepare(p, data, sequence_length=None):
        axis, t, b = _axes(op, p, data.shape)
        use = p["use_sequence_length"]
        if use and sequence_length is None:
            raise DnnbindTypeError(f"{op}: use_sequence_length=True needs the sequence_length input (B = {b} "
                                   f"lengths for data {data.shape}, axis {axis})")
        if not use and sequence_length is not None:
            raise DnnbindTypeError(f"{op}: got a sequence_length input of shape {sequence_length.shape} but "
                                   f"use_sequence_length is False (MXNet: {op} expects 1 inputs, but got 2); pass "
                                   f"use_sequence_length=True")
        if sequence_length is not None:
            if sequence_length.shape != (b,):
                raise DnnbindValueError(f"{op}: sequence_length must have shape ({b},) (one length per sequence: "
                                        f"data {data.shape}, axis {axis} has B = {b}), got "
                                        f"{sequence_length.shape}")
            if sequence_length.dtype.kind not in "biuf":
                raise DnnbindTypeError(f"{op}: sequence_length must be numeric, got {sequence_length.dtype}")
        if op == "SequenceLast" and t == 0 and b * math.prod(data.shape[2:]):
            raise DnnbindValueError(f"{op}: data {data.shape} has no steps along axis {axis}: no last step to take")
        g = Geometry()
        g.op, g.axis, g.t, g.b, g.shape = op, axis, t, b, tuple(data.shape)
        g.rest = math.prod(data.shape[2:])
        g.out_shape = _out_shape(op, data.shape, b)
        g.lengths_shape = None if sequence_length is None else sequence_length.shape
        return g
    return prepare


def _infer_for(op: str):
    def infer(p, shapes):
        data = tuple(shapes[0])
        axis, t, b = _axes(op, p, data)
        ins = [data, (b,)] if p["use_sequence_length"] else [data]
        return ins, [_out_shape(op, data, b)]
    return infer


# the lengths: read, truncated, checked -----------------------------------------------------------------------------

_RANGE = {  # op -> (lowest length, whether a length past T is allowed, why the range)
    "SequenceMask": (0, True, ""),
    "SequenceLast": (1, False, "; an empty sequence has no last step, and MXNet reads outside the data there"),
    "SequenceReverse": (0, False, "; MXNet writes outside the data there"),
}


def _lengths(g: Geometry, lengths) -> np.ndarray | None:
    """The lengths as int64 (truncated toward zero), each checked against the op's range, or None."""
    if lengths is None:
        return None
    host = lengths if isinstance(lengths, np.ndarray) else lengths.numpy()  # (a GPU array: B values copied back)
    if host.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(host))
        if bad.size:
            i = int(bad[0])
            raise DnnbindValueError(f"{g.op}: sequence_length[{i}] is {host[i]}, not a number of steps "
                                    f"({g.context()})")
        n = np.trunc(host).astype(np.int64)
    else:
        n = host.astype(np.int64)
    lo, past_t, why = _RANGE[g.op]
    bad = np.flatnonzero((n < lo) | ((n > g.t) if not past_t else False))
    if bad.size:
        i = int(bad[0])
        allowed = f">= {lo}" if past_t else f"in [{lo}, {g.t}]"
        raise DnnbindValueError(f"{g.op}: sequence_length[{i}] is {host[i]}, but each length must be {allowed} "
                                f"({g.context()}){why}")
    return n


# cpu: the numpy twin ---------------------------------------------------------------------------------------------

def _cpu_mask_forward(c, x, lengths):
    n = _lengths(c.geo, lengths)
    return ref.sequence_mask(x, n, c.p["value"], c.geo.axis), n


def _cpu_mask_backward(c, n, grads, dy):
    return ref.sequence_mask_backward(dy, n, c.geo.axis), None


def _cpu_last_forward(c, x, lengths):
    n = _lengths(c.geo, lengths)
    return ref.sequence_last(x, n, c.geo.axis), n


def _cpu_last_backward(c, n, grads, dy):
    return ref.sequence_last_backward(dy, n, c.geo.axis, c.geo.shape), None


def _cpu_reverse_forward(c, x, lengths):
    n = _lengths(c.geo, lengths)
    return ref.sequence_reverse(x, n), n


def _cpu_reverse_backward(c, n, grads, dy):
    return ref.sequence_reverse(dy, n), None


# gpu: gathers of whole rows ---------------------------------------------------------------------------------------

def _row(g: Geometry, t, b):
    """The row of (step t, sequence b) in the data seen as (d0 * d1, rest)."""
    return t * g.b + b if g.axis == 0 else b * g.t + t


def _gather(src, n: int, rows: np.ndarray, shape: tuple, pad=None):
    """``src`` seen as (n, rest) rows, the given rows of it, as ``shape``; ``pad`` (a value) appends one row of it,
    which the index ``n`` reads."""
    if math.prod(shape) == 0:
        return zeros(shape, src._dtype, src._device)
    flat = view(src, (n, src.size // n))
    if pad is not None:
        flat = table("concat", flat, full((1, flat._shape[1]), pad, src._dtype, src._device), dim=0)
    idx = array(np.ascontiguousarray(rows, np.int64).reshape(-1), device=src._device)
    return view(table("take", flat, idx, axis=0, mode="clip"), shape)


def _gpu_mask_forward(c, x, lengths):
    g = c.geo
    n = _lengths(g, lengths)
    if n is None:  # nothing to mask: a copy, as MXNet's output is its own array
        return x.copy(), None
    t, b = np.meshgrid(np.arange(g.t), np.arange(g.b), indexing="ij")
    rows = np.where(t >= n[None, :], g.rows(), _row(g, t, b))  # (T, B): a masked step reads the pad row
    order = rows if g.axis == 0 else rows.T  # in the data's own row order
    return _gather(x, g.rows(), order, g.shape, pad=c.p["value"]), order


def _gpu_mask_backward(c, order, grads, dy):
    if order is None:
        return dy.copy(), None
    return _gather(dy, c.geo.rows(), order, c.geo.shape, pad=0), None


def _gpu_last_forward(c, x, lengths):
    g = c.geo
    n = _lengths(g, lengths)
    last = (np.full(g.b, g.t - 1, np.int64) if n is None else n - 1)
    rows = _row(g, last, np.arange(g.b))
    return _gather(x, g.rows(), rows, g.out_shape), rows


def _gpu_last_backward(c, rows, grads, dy):
    g = c.geo
    inverse = np.full(g.rows(), g.b, np.int64)  # every row reads dy's zero pad row but the last steps
    inverse[rows] = np.arange(g.b)
    return _gather(dy, g.b, inverse, g.shape, pad=0), None


def _gpu_reverse_forward(c, x, lengths):
    g = c.geo
    n = _lengths(g, lengths)
    rows = _row(g, ref.reverse_sources(n, g.t, g.b), np.arange(g.b)[None, :])  # (T, B) in the data's order
    return _gather(x, g.rows(), rows, g.shape), rows


def _gpu_reverse_backward(c, rows, grads, dy):
    return _gather(dy, c.geo.rows(), rows, c.geo.shape), None  # the permutation is its own inverse


# samples: axis 0 and 1, with and without lengths, one sequence, float and edge lengths ----------------------------

def _mask_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3, 2))}, {}
    yield {"data": x((4, 3, 2)), "sequence_length": np.array([2.0, 4, 1])}, {"use_sequence_length": True}
    yield {"data": x((3, 5)), "sequence_length": np.array([1.0, 3, 0])}, {"use_sequence_length": True, "axis": 1,
                                                                            "value": -1.5}
    yield {"data": x((5, 1, 2, 2)), "sequence_length": np.array([2.7])}, {"use_sequence_length": True, "value": 3.0}
    yield {"data": x((1, 4, 3)), "sequence_length": np.array([0.0])}, {"use_sequence_length": True, "axis": 1}
    yield {"data": x((3, 2, 2)), "sequence_length": np.array([7.0, 3])}, {"use_sequence_length": True}


def _last_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3, 2))}, {}
    yield {"data": x((4, 3, 2)), "sequence_length": np.array([2.0, 4, 1])}, {"use_sequence_length": True}
    yield {"data": x((3, 5, 2)), "sequence_length": np.array([1.0, 2, 3])}, {"use_sequence_length": True, "axis": 1}
    yield {"data": x((5, 1)), "sequence_length": np.array([2.7])}, {"use_sequence_length": True}
    yield {"data": x((2, 4, 3))}, {"axis": 1}


def _reverse_samples(rng):
    x = rng.standard_normal
    yield {"data": x((4, 3, 2))}, {}
    yield {"data": x((4, 3, 2)), "sequence_length": np.array([2.0, 4, 0])}, {"use_sequence_length": True}
    yield {"data": x((5, 1, 2, 2)), "sequence_length": np.array([3.9])}, {"use_sequence_length": True}
    yield {"data": x((3, 4)), "sequence_length": np.array([1.0, 3, 2, 3])}, {"use_sequence_length": True}


_LENGTHS = {"sequence_length": lambda p: p["use_sequence_length"]}

define(OpDef("SequenceMask", prepare=_prepare_for("SequenceMask"), infer=_infer_for("SequenceMask"),
             samples=_mask_samples, optional=_LENGTHS, nograd=("sequence_length",),
             cpu=Lowering(_cpu_mask_forward, _cpu_mask_backward), gpu=Lowering(_gpu_mask_forward, _gpu_mask_backward),
             doc="MXNet's SequenceMask: the steps at or past each sequence's length set to ``value``."))
define(OpDef("SequenceLast", prepare=_prepare_for("SequenceLast"), infer=_infer_for("SequenceLast"),
             samples=_last_samples, optional=_LENGTHS, nograd=("sequence_length",),
             cpu=Lowering(_cpu_last_forward, _cpu_last_backward), gpu=Lowering(_gpu_last_forward, _gpu_last_backward),
             doc="MXNet's SequenceLast: each sequence's last step, (B, ...)."))
define(OpDef("SequenceReverse", prepare=_prepare_for("SequenceReverse"), infer=_infer_for("SequenceReverse"),
             samples=_reverse_samples, optional=_LENGTHS, nograd=("sequence_length",),
             cpu=Lowering(_cpu_reverse_forward, _cpu_reverse_backward),
             gpu=Lowering(_gpu_reverse_forward, _gpu_reverse_backward),
             doc="MXNet's SequenceReverse: each sequence's first ``length`` steps reversed along axis 0."))
