"""MXNet's ``CTCLoss`` (aliases ``ctc_loss``, ``_contrib_CTCLoss``): connectionist temporal classification, cuDNN's
CTC on a GPU, ops/reference/ctc.py on the cpu.

Inputs: ``data`` (T, N, alphabet) unnormalized activations (the softmax is applied inside), ``label`` (N, L) class
indices, and with ``use_data_lengths``/``use_label_lengths`` the N lengths ``data_lengths``/``label_lengths``.
Output: the loss (N,), the data's dtype; MXNet's node has a second, hidden output (its gradient buffer), so the
node counts 2 outputs and shows ``output0``. The gradient goes to ``data`` only; the backward multiplies the
gradient of each sequence's loss, computed with the forward, by the incoming dy (N,).

``blank_label`` 'first': class 0 is the blank, labels are 1 .. A - 1 and 0 pads a label row; 'last': class A - 1 is
the blank, labels are 0 .. A - 2 and -1 pads (MXNet 1.9.1's code and results; its docstring has the paddings the
other way round). Without ``label_lengths`` a label ends at its first padding value; with them the values past the
length are ignored. Lengths and labels are rounded to the nearest whole number, as MXNet's ``lround``.

Semantics kept from MXNet 1.9.1 (warp-ctc): a label that cannot be aligned in its steps (label length + repeated
neighbours > data length) costs 0 (its gradient is zero here; MXNet leaves it uninitialized); an empty label over
zero steps costs inf. The gradient is the derivative of the loss, rounded lengths and all (MXNet masks its gradient
with truncated data lengths, so a fractional length disagrees with its own loss there). Where MXNet reads
outside its arrays the backends differ, because only the host can refuse:

- cpu: refused, naming the op, the argument, the value and the shapes: lengths outside [0, T] or [0, L], labels
  outside the alphabet (or the blank) within their length, non-finite lengths or labels.
- gpu (nothing is read back, so a call never synchronizes and records in a CUDA graph): lengths are clamped to
  [0, T] and [0, L] and labels to the alphabet's non-blank classes.

MXNet computes in float32 only; dnnbind's twin takes float16/32/64 (float64 for the central-difference tests), and
the gpu lowering casts to float32 for cuDNN and back.

gpu: ``cudnnCTCLoss_v8`` (labels, lengths in device memory), CUDNN_LOSS_NORMALIZATION_SOFTMAX (it takes the
activations and returns the gradient w.r.t. them). Around it, table ops (``ops.opdef.table``) on the device: the
label lengths (first padding position), the labels packed end to end (cuDNN's layout) and shifted, the alignment
check, and for ``blank_label='last'`` the alphabet rotated by one so the blank is class 0 as cuDNN requires (labels
+ 1; the gradient rotated back). cuDNN takes labels up to 256 long: a label row longer than that (L > 256) is refused
on the GPU before any library call (no fallback yet: run such a call on the cpu).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..._lib import cudnn
from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import NDArray, array, empty, zeros
from .. import descriptors as D
from .._common import dnn, scratch
from ..opdef import Lowering, OpDef, define, table, typed, view
from ..reference.ctc import ctc_loss

L = cudnn.lib
_F64 = np.dtype(np.float64)
_CUDNN_MAX_LABEL = 256  # cudnnCTCLoss: each label at most 256 long


class Geometry:
    __slots__ = ("t", "n", "a", "l", "blank", "pad", "dtype", "shapes")

    def context(self) -> str:
        return self.shapes


def _route(p, data_lengths, label_lengths):
    """(data_lengths, label_lengths) as the parameters say: MXNet names the inputs from its flags, so with only
    ``use_label_lengths`` the third array given is the label lengths (it arrives in the data_lengths slot)."""
    if not p["use_data_lengths"] and p["use_label_lengths"] and label_lengths is None:
        return None, data_lengths
    return data_lengths, label_lengths


def _prepare(p, data, label, data_lengths=None, label_lengths=None):
    dl, ll = _route(p, data_lengths, label_lengths)
    shapes = (f"data {data.shape}, label {label.shape}" + (f", data_lengths {dl.shape}" if dl is not None else "")
              + (f", label_lengths {ll.shape}" if ll is not None else ""))
    if data.ndim != 3:
        raise DnnbindValueError(f"CTCLoss: data must be 3-D (sequence length T, batch N, alphabet A), got shape "
                                f"{data.shape}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"CTCLoss: data must be a floating-point array, got {data.dtype} ({shapes})")
    t, n, a = data.shape
    if label.ndim != 2 or label.shape[0] != n:
        raise DnnbindValueError(f"CTCLoss: label must be 2-D (N = {n}, label length), one row per sequence of data, "
                                f"got {label.shape} ({shapes})")
    if label.dtype.kind not in "biuf":
        raise DnnbindTypeError(f"CTCLoss: label must be numeric, got {label.dtype} ({shapes})")
    if label.shape[1] > t:
        raise DnnbindValueError(f"CTCLoss: the label length {label.shape[1]} exceeds the sequence length T = {t} "
                                f"(MXNet: the max number of labels cannot exceed the maximum sequence length of the "
                                f"data) ({shapes})")
    for name, flag, arr in (("data_lengths", "use_data_lengths", dl), ("label_lengths", "use_label_lengths", ll)):
        if p[flag] and arr is None:
            raise DnnbindTypeError(f"CTCLoss: {flag}=True needs the {name} input (N = {n} lengths) ({shapes})")
        if not p[flag] and arr is not None:
            raise DnnbindTypeError(f"CTCLoss: got a {name} input of shape {arr.shape} but {flag} is False; pass "
                                   f"{flag}=True ({shapes})")
        if arr is not None:
            if arr.shape != (n,):
                raise DnnbindValueError(f"CTCLoss: {name} must have shape ({n},) (one length per sequence), got "
                                        f"{arr.shape} ({shapes})")
            if arr.dtype.kind not in "biuf":
                raise DnnbindTypeError(f"CTCLoss: {name} must be numeric, got {arr.dtype} ({shapes})")
    if data.device.kind == "gpu" and label.shape[1] > _CUDNN_MAX_LABEL:
        raise DnnbindValueError(f"CTCLoss: cuDNN's CTC takes labels up to {_CUDNN_MAX_LABEL} long, got label rows "
                                f"of {label.shape[1]} ({shapes}); run it on the cpu")
    g = Geometry()
    g.t, g.n, g.a, g.l, g.dtype, g.shapes = t, n, a, label.shape[1], data.dtype, shapes
    g.blank, g.pad = (0, 0) if p["blank_label"] == "first" else (a - 1, -1)
    return g


def _infer(p, shapes):
    data, label = tuple(shapes[0]), tuple(shapes[1])
    n = data[1] if len(data) == 3 else label[0]
    ins = [data, label] + [(n,)] * (int(p["use_data_lengths"]) + int(p["use_label_lengths"]))
    return ins, [(n,)]


# cpu: the numpy twin, after the host checks -------------------------------------------------------------------

def _whole(g: Geometry, name: str, v: np.ndarray) -> np.ndarray:
    """Values rounded to the nearest whole number, half away from zero (MXNet's lround), refused if not finite."""
    v = np.asarray(v)
    if v.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(v.reshape(-1)))
        if bad.size:
            raise DnnbindValueError(f"CTCLoss: {name} holds {v.reshape(-1)[bad[0]]}, not a whole number "
                                    f"({g.context()})")
        v = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return v.astype(np.int64)


def _in_range(g: Geometry, name: str, v: np.ndarray, hi: int) -> None:
    bad = np.flatnonzero((v < 0) | (v > hi))
    if bad.size:
        i = int(bad[0])
        raise DnnbindValueError(f"CTCLoss: {name}[{i}] is {v[i]}, but each must be in [0, {hi}] ({g.context()}); "
                                f"MXNet reads outside its arrays there")


def host_labels(g: Geometry, label, data_lengths, label_lengths) -> tuple[list, np.ndarray]:
    """(each sequence's label as classes of the data's alphabet, the data lengths), checked on the host."""
    lab = _whole(g, "label", label)
    if label_lengths is not None:
        n_lab = _whole(g, "label_lengths", label_lengths)
        _in_range(g, "label_lengths", n_lab, g.l)
    else:  # the first padding value ends a label
        is_pad = lab == g.pad
        n_lab = np.where(is_pad.any(axis=1), is_pad.argmax(axis=1), g.l)
    lo, hi = (1, g.a - 1) if g.blank == 0 else (0, g.a - 2)
    labels = []
    for b in range(g.n):
        row = lab[b, :n_lab[b]]
        bad = np.flatnonzero((row < lo) | (row > hi))
        if bad.size:
            raise DnnbindValueError(f"CTCLoss: label[{b}, {int(bad[0])}] is {row[bad[0]]}, but labels must be in "
                                    f"[{lo}, {hi}] with blank_label '{'first' if g.blank == 0 else 'last'}' "
                                    f"(alphabet A = {g.a}) ({g.context()})")
        labels.append(row.tolist())
    if data_lengths is None:
        n_data = np.full(g.n, g.t, np.int64)
    else:
        n_data = _whole(g, "data_lengths", data_lengths)
        _in_range(g, "data_lengths", n_data, g.t)
    return labels, n_data


def _cpu_forward(c, data, label, data_lengths=None, label_lengths=None):
    g = c.geo
    dl, ll = _route(c.p, data_lengths, label_lengths)
    labels, n_data = host_labels(g, label, dl, ll)
    loss, grad = ctc_loss(data, labels, n_data, g.blank)
    return loss, grad


def _cpu_backward(c, grad, grads, dy):
    return (grad * dy.astype(grad.dtype)[None, :, None], None, None, None)


# gpu: cuDNN, its inputs made on the device --------------------------------------------------------------------

_STEPS: dict = {}  # (n, dtype, device) -> arange(n): uploaded once, never per call (a CUDA graph may hold it)
_WORKSPACE: dict = {}  # (T, N, A, L, device) -> cuDNN's workspace bytes


def _arange(n: int, device) -> NDArray:
    key = (n, _F64, device)
    a = _STEPS.get(key)
    if a is None:
        a = _STEPS[key] = array(np.arange(n, dtype=_F64), device=device)
    return a


def _rounded(x: NDArray) -> NDArray:
    """float64 on the device, rounded half away from zero (MXNet's lround); NaN counted as 0."""
    v = table("cast", x, dtype="float64")
    if x.dtype.kind == "f":
        v = table("round", v)
        v = table("where", table("equal", v, v), v, 0.0)
    return v


def device_inputs(g: Geometry, p, label, data_lengths, label_lengths, given_only: bool = False):
    """What cuDNN is given, made by table ops on the arrays' device (so the cpu tests can check it): (labels
    packed end to end in cuDNN's classes (N * L,), label lengths (N,), data lengths (N,), fits (N,): 1 where the
    label can be aligned in its steps), all float64 holding whole numbers; the lengths clamped, the labels clamped
    to [1, A - 1]."""
    dev, n, l_max = label.device, g.n, g.l
    lab = _rounded(label)  # (N, L)
    cols = view(_arange(l_max, dev), (1, l_max)) if l_max else None
    if label_lengths is not None:
        n_lab = table("clip", _rounded(label_lengths), a_min=0.0, a_max=float(l_max))
    elif l_max:  # the first padding position, L where there is none
        first = table("where", table("equal", lab, float(g.pad)), cols, float(l_max))
        n_lab = view(table("min", first, axis=1), (n,))
    else:
        n_lab = table("multiply", _arange(n, dev), 0.0)
    if data_lengths is not None:
        n_data = table("clip", _rounded(data_lengths), a_min=0.0, a_max=float(g.t))
    else:
        n_data = table("add", table("multiply", _arange(n, dev), 0.0), float(g.t))
    if g.blank != 0:
        lab = table("add", lab, 1.0)  # the alphabet rotated by one: the blank (A - 1) becomes class 0
    lab = table("clip", lab, a_min=1.0, a_max=float(max(g.a - 1, 1)))
    # repeated neighbours within the length: each needs a blank between them, one step more
    if l_max > 1:
        same = table("equal", table("slice_axis", lab, axis=1, begin=1, end=l_max),
                     table("slice_axis", lab, axis=1, begin=0, end=l_max - 1))
        inside = table("lesser", table("slice_axis", cols, axis=1, begin=1, end=l_max), view(n_lab, (n, 1)))
        reps = view(table("sum", table("multiply", same, inside), axis=1), (n,))
    else:
        reps = table("multiply", n_lab, 0.0)
    fits = table("lesser_equal", table("add", n_lab, reps), n_data)
    # given_only: pack only the labels cuDNN is given (an unalignable one goes as empty), so each label starts
    # where the lengths cuDNN reads say it does
    packed = _pack(lab, _given(n_lab, n_data, fits) if given_only else n_lab, n, l_max, dev)
    return packed, n_lab, n_data, fits


def _given(n_lab, n_data, fits):
    """The label lengths cuDNN is given: 0 for a label that cannot be aligned or has no steps."""
    return table("where", table("logical_and", fits, table("greater", n_data, 0.0)), n_lab, 0.0)


def _pack(lab: NDArray, n_lab: NDArray, n: int, l_max: int, dev) -> NDArray:
    """The labels' first n_lab[b] values of each row, end to end, in an (N * L,) array (the tail unused): slot j
    belongs to the row b(j) = #{rows ending at or before j} and holds its value j - start[b(j)]."""
    if not l_max:
        return table("multiply", _arange(max(n, 1), dev), 0.0)
    seqs = _arange(n, dev)
    before = table("lesser_equal", view(seqs, (n, 1)), view(seqs, (1, n)))  # [b', b] = b' <= b
    ends = view(table("sum", table("multiply", view(n_lab, (n, 1)), before), axis=0), (n,))  # inclusive cumsum
    starts = table("subtract", ends, n_lab)
    slots = _arange(n * l_max, dev)
    row = view(table("sum", table("lesser_equal", view(ends, (1, n)), view(slots, (n * l_max, 1))), axis=1),
               (n * l_max,))
    row = table("clip", row, a_min=0.0, a_max=float(n - 1))  # slots past the last label: any row, never read
    col = table("clip", table("subtract", slots, table("take", starts, row, axis=0, mode="clip")),
                a_min=0.0, a_max=float(l_max - 1))
    src = table("add", table("multiply", row, float(l_max)), col)
    return table("take", view(lab, (n * l_max,)), src, axis=0, mode="clip")


def _gpu_forward(c, data, label, data_lengths=None, label_lengths=None):
    g, p = c.geo, c.p
    dl, ll = _route(p, data_lengths, label_lengths)
    t, n, a = g.t, g.n, g.a
    packed, n_lab, n_data, fits = device_inputs(g, p, label, dl, ll, given_only=True)
    x = data if data.dtype == np.float32 else table("cast", data, dtype="float32")
    if g.blank != 0:  # rotate the alphabet: class A - 1 (the blank) first, as cuDNN's blank is class 0
        x = table("concat", table("slice_axis", x, axis=2, begin=a - 1, end=a),
                  table("slice_axis", x, axis=2, begin=0, end=a - 1), dim=2)
    # cuDNN is never handed a call it cannot align (its result there is not MXNet's): such a sequence gets an
    # empty label over at least one step, and its loss and gradient are set afterwards
    ok = table("logical_and", fits, table("greater", n_data, 0.0))
    lab_len = _given(n_lab, n_data, fits)
    steps = table("maximum", n_data, 1.0)
    as_int = [table("cast", v, dtype="int32") for v in (packed, lab_len, steps)]
    if t * n * a:
        costs, grad = empty((n,), np.float32, data.device), empty((t, n, a), np.float32, data.device)
        desc, td = D.ctc_loss(max(g.l, 1)), D.ctc_tensor((t, n, a))
        algo = cudnn.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
        key = (t, n, a, g.l, data.device)
        size = _WORKSPACE.get(key)
        if size is None:  # a host-only query, once per shape
            got = ctypes.c_size_t()
            L.cudnnGetCTCLossWorkspaceSize_v8(dnn(x), algo, desc, td, td, ctypes.byref(got))
            size = _WORKSPACE[key] = got.value
        with scratch(data.device, size) as (ws, ws_size):
            L.cudnnCTCLoss_v8(dnn(x), algo, desc, td, x.ptr, as_int[0].ptr, as_int[1].ptr, as_int[2].ptr,
                              costs.ptr, td, grad.ptr, ws_size, ws)
    else:
        costs, grad = zeros((n,), np.float32, data.device), zeros((t, n, a), np.float32, data.device)
    # MXNet's edge cases: no alignment costs 0 (no gradient), an empty label over no steps inf
    empty_label = table("logical_and", table("equal", n_data, 0.0), table("equal", n_lab, 0.0))
    loss = table("where", fits, costs, 0.0)
    loss = table("where", empty_label, float("inf"), loss)
    # no gradient past each sequence's steps, nor for a sequence cuDNN was not given
    steps_in = table("lesser", view(_arange(t, data.device), (t, 1)), view(n_data, (1, n)))  # (T, N)
    live = table("logical_and", steps_in, view(ok, (1, n)))
    grad = table("where", view(live, (t, n, 1)), grad, 0.0)
    if t * n * a:
        loss, grad = _empty_labels(x, n_lab, n_data, steps_in, loss, grad)
    if g.blank != 0:  # rotate the gradient back: class 0 (the blank) to A - 1
        grad = table("concat", table("slice_axis", grad, axis=2, begin=1, end=a),
                     table("slice_axis", grad, axis=2, begin=0, end=1), dim=2)
    if g.dtype != np.float32:
        loss = table("cast", loss, dtype=g.dtype.name)
    return loss, grad


def _empty_labels(x, n_lab, n_data, steps_in, loss, grad):
    """An empty label over some steps: cuDNN's CTC gives it cost 0, but its one alignment is the blank at every
    step, so the loss is -sum_t log softmax(x_t)[blank] and the gradient softmax(x_t) - onehot(blank) (the blank
    is class 0 here, after the rotation). Composed of table ops and merged in where the label is empty."""
    t, n, a = x.shape
    m = table("max", x, axis=2, keepdims=True)
    lse = table("add", table("log", table("sum", table("exp", table("subtract", x, m)), axis=2, keepdims=True)), m)
    blank_lp = view(table("subtract", table("slice_axis", x, axis=2, begin=0, end=1), lse), (t, n))
    empty_loss = table("negative", table("sum", table("where", steps_in, blank_lp, 0.0), axis=0))
    onehot = table("cast", table("equal", view(_arange(a, x.device), (1, 1, a)), 0.0), dtype="float32")
    empty_grad = table("subtract", table("exp", table("subtract", x, lse)), onehot)
    is_empty = table("logical_and", table("equal", n_lab, 0.0), table("greater", n_data, 0.0))  # (N,)
    loss = table("where", is_empty, table("cast", empty_loss, dtype=loss.dtype.name), loss)
    empty_grad = table("where", view(steps_in, (t, n, 1)), empty_grad, 0.0)  # nothing past its steps
    return loss, table("where", view(is_empty, (1, n, 1)), empty_grad, grad)


def _gpu_backward(c, grad, grads, dy):
    g = c.geo
    d = dy if dy.dtype == np.float32 else table("cast", dy, dtype="float32")
    dx = table("multiply", grad, view(d, (1, g.n, 1)))
    if g.dtype != np.float32:
        dx = table("cast", dx, dtype=g.dtype.name)
    return (dx, None, None, None)


# samples: blank first/last, with and without lengths, repeats, an empty label -----------------------------------

def _samples(rng):
    x = rng.standard_normal
    yield {"data": x((5, 3, 4)), "label": np.array([[1.0, 2, 0], [3, 3, 0], [2, 0, 0]])}, {}
    yield ({"data": x((5, 3, 4)), "label": np.array([[0.0, 1, -1], [2, 2, -1], [1, -1, -1]])},
           {"blank_label": "last"})
    yield ({"data": x((6, 2, 5)), "label": np.array([[1.0, 4, 4], [2, 0, 0]]), "data_lengths": np.array([6.0, 4]),
            "label_lengths": np.array([3.0, 1])},
           {"use_data_lengths": True, "use_label_lengths": True})
    yield ({"data": x((4, 2, 3)), "label": np.array([[1.0, 0], [2, 1]]), "data_lengths": np.array([3.0, 4])},
           {"use_data_lengths": True})


define(OpDef("CTCLoss", prepare=_prepare, infer=_infer, samples=_samples, nd=("CTCLoss", "ctc_loss"),
             optional={"data_lengths": lambda p: p["use_data_lengths"],
                       "label_lengths": lambda p: p["use_label_lengths"]},
             nograd=("label", "data_lengths", "label_lengths"),
             dtype=typed(own=(1, 2, 3)), outputs=lambda p: (2, ["output0"]),  # MXNet's hidden second output is its gradient buffer
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="Connectionist temporal classification loss (MXNet's CTCLoss): cudnnCTCLoss_v8."))
