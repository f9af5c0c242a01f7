"""MXNet's sequence operators over (T, B, ...) data (``axis`` 0) or (B, T, ...) data (``axis`` 1), each with an
optional ``sequence_length`` input of B lengths (``use_sequence_length``):

- ``SequenceMask``: the steps at or past each length set to ``value``; the gradient passes through the rest.
- ``SequenceLast``: (B, ...), each sequence's last step (``length - 1``, or T - 1 without lengths).
- ``SequenceReverse``: the first ``length`` steps of each sequence reversed, the padding left in place (axis 0 only,
  as in MXNet).

Lengths are any numeric array; float lengths are truncated toward zero, as MXNet's ``static_cast<int>``. MXNet
checks no length against T. What it computes soundly is kept on both backends: a mask length of 0 masks the whole
sequence, one past T masks nothing, a reverse length of 0 leaves the sequence as it is. Where its kernels would read
or write outside the data the two backends differ, because only the host can refuse:

- cpu (the lengths are host values already, so checking them costs nothing): the call is refused, naming the op,
  the argument, the value and the shapes. Refused: negative or non-finite lengths (all three), SequenceLast lengths
  outside [1, T] (MXNet returns memory before the data for 0), SequenceReverse lengths past T (MXNet corrupts the
  heap). These are calls with no right answer to match, so the backend that can say so does.
- gpu: the lengths are never read back (that would synchronize the stream and keep the op out of a hybridized
  Block's CUDA graph), so out-of-range lengths are *clamped*: a NaN length counts as 0, then each length is clamped
  to [0, T] (SequenceLast: [1, T], so a length of 0 takes step 0). SequenceMask needs no clamp: a negative length
  masks everything, as 0 does, one past T nothing. The clamped result is what the cpu twin gives for the clamped
  lengths (``ref.clamp_lengths``), and for in-range lengths both backends agree exactly.

The gradient goes to the data only; ``sequence_length`` takes none (``nograd``). SequenceLast's gradient without
lengths goes to step T - 1, the derivative of its forward (MXNet 1.9.1's backward reads an uninitialized length
buffer there: wrong values, or a crash).

cpu: the numpy twin (ops/reference/sequence.py). gpu: compositions of the table's ops (``ops.opdef.table``), every
index computed on the device from the lengths cast to float64 (exact integers) and the step and sequence numbers
``arange(T)``/``arange(B)``, uploaded once per (n, dtype, device) and cached:

- SequenceMask: ``where(arange(T) < trunc(lengths), data, value)``, the (T, B) condition broadcast over the rest;
  the backward is ``where(condition, dy, 0)``.
- SequenceLast: ``take`` of the rows (last * B + b, or b * T + last for axis 1) of the data seen as (d0 * d1, rest),
  last = clip(trunc(lengths), 1, T) - 1; the backward is ``where(arange(T) == last, dy spread along T, 0)``.
- SequenceReverse: ``take`` of the rows src * B + b, src = t < n ? n - 1 - t : t; the backward is the same
  gather of dy (the permutation is its own inverse).

So a call with lengths makes a handful of small kernel launches and no host copy: a hybridized Block records it
(``unroll(..., valid_length=...)``, an attention mask).
"""

from __future__ import annotations

import math

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import NDArray, array, zeros
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import sequence as ref

_F64 = np.dtype(np.float64)


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


# gpu: compositions of table ops, all on the device ------------------------------------------------------------------
#
# No length is read back: the lengths become float64 step numbers on the device (exact for any integer length up to
# 2**53, and comparable with the cached step and sequence numbers below), and every index is computed from them by
# element-wise ops, so a call makes no host copy and a hybridized Block records it like any other op.

_STEPS: dict = {}  # (n, dtype, device) -> arange(n) on that device: uploaded once, never per call


def _arange(n: int, device) -> NDArray:
    """0 .. n-1 as float64 on ``device``, uploaded the first time it is asked for and cached. The cache is never
    trimmed: an entry is n * 8 bytes, there is one per distinct T or B a program uses, and a recording (hybridize)
    may hold its pointer for as long as it lives."""
    key = (n, _F64, device)
    a = _STEPS.get(key)
    if a is None:
        a = _STEPS[key] = array(np.arange(n, dtype=_F64), device=device)
    return a


def _steps(lengths, lo: int, t: int) -> NDArray:
    """The lengths as float64 on their device: truncated toward zero, NaN counted as 0, clamped to [lo, t]."""
    n = table("cast", lengths, dtype="float64")
    if lengths.dtype.kind == "f":
        n = table("trunc", n)
        n = table("where", table("equal", n, n), n, 0.0)  # NaN != NaN: a NaN length becomes 0
    return table("clip", n, a_min=float(lo), a_max=float(t))


def _broadcastable(m: NDArray, ndim: int) -> NDArray:
    """A (d0, d1) array seen as (d0, d1, 1, ...) against data of rank ``ndim``."""
    return view(m, m.shape + (1,) * (ndim - 2))


def _take_rows(src: NDArray, rows: NDArray, shape: tuple) -> NDArray:
    """``src`` (data-shaped) seen as (d0 * d1, rest) rows, the rows at the float64 indices ``rows``, as ``shape``."""
    n = src.shape[0] * src.shape[1]
    flat = view(src, (n, src.size // n))
    return view(table("take", flat, view(rows, (rows.size,)), axis=0, mode="clip"), shape)


def _gpu_mask_forward(c, x, lengths):
    g = c.geo
    if lengths is None or x.size == 0:  # nothing to mask: a copy, as MXNet's output is its own array
        return x.copy(), None
    # keep[t, b] = t < length[b]: NaN compares false (all masked, as a length of 0); no clamp is needed
    n = table("trunc", table("cast", lengths, dtype="float64")) if lengths.dtype.kind == "f" else \
        table("cast", lengths, dtype="float64")
    steps = _arange(g.t, x.device)
    if g.axis == 0:
        keep = table("lesser", view(steps, (g.t, 1)), view(n, (1, g.b)))
    else:
        keep = table("lesser", view(steps, (1, g.t)), view(n, (g.b, 1)))
    keep = _broadcastable(keep, len(g.shape))
    return table("where", keep, x, c.p["value"]), keep


def _gpu_mask_backward(c, keep, grads, dy):
    if keep is None:
        return dy.copy(), None
    return table("where", keep, dy, 0.0), None


def _gpu_last_forward(c, x, lengths):
    g = c.geo
    if x.size == 0:
        return zeros(g.out_shape, x.dtype, x.device), None
    seqs = _arange(g.b, x.device)
    if lengths is None:
        last = table("add", table("multiply", seqs, 0.0), float(g.t - 1))  # (B,) of T - 1, made on the device
    else:
        last = table("subtract", _steps(lengths, 1, g.t), 1.0)
    rows = (table("add", table("multiply", last, float(g.b)), seqs) if g.axis == 0
            else table("add", table("multiply", seqs, float(g.t)), last))
    return _take_rows(x, rows, g.out_shape), last


def _gpu_last_backward(c, last, grads, dy):
    g = c.geo
    if last is None:
        return zeros(g.shape, dy.dtype, dy.device), None
    steps = _arange(g.t, dy.device)
    rest = g.shape[2:]
    if g.axis == 0:  # hit[t, b] = (t == last[b]); dy (B, ...) spread along the steps, kept where hit
        hit = table("equal", view(steps, (g.t, 1)), view(last, (1, g.b)))
        spread = view(dy, (1, g.b, *rest))
    else:
        hit = table("equal", view(steps, (1, g.t)), view(last, (g.b, 1)))
        spread = view(dy, (g.b, 1, *rest))
    return table("where", _broadcastable(hit, len(g.shape)), spread, 0.0), None


def _gpu_reverse_forward(c, x, lengths):
    g = c.geo
    if x.size == 0:
        return x.copy(), None
    steps, seqs = view(_arange(g.t, x.device), (g.t, 1)), view(_arange(g.b, x.device), (1, g.b))
    if lengths is None:  # source step T - 1 - t for every sequence
        src = table("add", table("multiply", steps, -1.0), float(g.t - 1))
    else:  # src = t < n ? n - 1 - t : t, written t + (t < n) * (n - 1 - 2t) (every term finite and exact)
        n = view(_steps(lengths, 0, g.t), (1, g.b))
        inside = table("lesser", steps, n)
        src = table("add", steps, table("multiply", inside,
                                        table("subtract", table("subtract", n, 1.0), table("multiply", steps, 2.0))))
    rows = table("add", table("multiply", src, float(g.b)), seqs)  # (T, B): row src * B + b of the data
    return _take_rows(x, rows, g.shape), rows


def _gpu_reverse_backward(c, rows, grads, dy):
    if rows is None:
        return dy.copy(), None
    return _take_rows(dy, rows, c.geo.shape), None  # the permutation is its own inverse


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
