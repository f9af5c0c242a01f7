"""MXNet's fused ``RNN`` operator (modes rnn_relu, rnn_tanh, lstm, gru; stacked, optionally bidirectional, LSTM
projection and cell clipping, variable lengths): cuDNN 9's RNN API on a GPU (cudnnRNNForward,
cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8), ops/reference/rnn.py on the cpu.

Inputs (MXNet's): ``data`` (T, N, C) TNC, ``parameters`` MXNet's flat vector (every weight, by layer, direction,
i2h, h2h, h2r; then every bias, i2h, h2h), ``state`` (L*D, N, P), ``state_cell`` (L*D, N, H; lstm only),
``sequence_length`` (N,) int or float (only with ``use_sequence_length``). P is ``projection_size`` (lstm only) or
H = ``state_size``. Outputs: ``output`` (T, N, D*P); with ``state_outputs`` also ``state_output`` and, for lstm,
``statecell_output`` (MXNet's names), and nd.RNN returns them as a tuple.

Dropout ``p`` applies to every layer's output but the last's, in training only: on a GPU cuDNN's, drawn from the
dropout RNG state ops/dropout.py keeps per cuDNN handle (seeded from dnnbind's random state, like nd.Dropout); on
the cpu numpy's. The two backends' masks differ, as MXNet's do.

cuDNN's weight space is not MXNet's vector: its layout is read once per configuration from
cudnnGetRNNWeightParams (each gate matrix and bias of each pseudo-layer, linLayerID 0..G-1 the input gates, G..2G-1
the recurrent gates, 8 an LSTM's projection) and the vector copied in, in as few device copies as the two layouts
allow (none when they coincide); the weight gradient is copied back the same way. Gate orders are MXNet's = cuDNN's
(lstm i, f, g, o; gru r, z, n), checked on a GPU against the twin (tests/test_rnn_op.py).

MXNet 1.9.1's own cpu kernels refuse ``use_sequence_length`` and state clipping and crash with a projection; here
the cpu twin computes all of them as cuDNN does.

Every output takes a gradient (``grad_outputs``): both backwards get ``dy`` as a tuple (dy, dhy, dcy), the
dispatch filling in zeros for an output no gradient reached, as MXNet's RNN takes head gradients for all three.

NOTE: with ``sequence_length`` on a GPU, the lengths are read to the host (cuDNN's data descriptor takes them
there; MXNet copies them too): that synchronizes, so such a call cannot be captured in a CUDA graph.
"""

from __future__ import annotations

import ctypes
import threading
from typing import NamedTuple

import numpy as np

from ..._lib import cudnn
from ..._lib.errors import CudnnError, DnnbindTypeError, DnnbindValueError
from ...runtime import config, rng
from ...runtime.array import NDArray
from ...runtime.array import array as nd_array
from ...runtime.memory import D2D, DeviceBuffer, memcpy, memset
from ...runtime.stream import current_stream
from .. import descriptors as D
from .. import dropout as _dropout
from .._common import cache_insert, dnn, out_like, scratch, with_context
from ..opdef import Lowering, OpDef, define, table
from ..reference.dropout import dropout_p
from ..reference.rnn import GATES, layout, rnn_backward, rnn_forward

NAME = "RNN"
L = cudnn.lib


class Geometry(NamedTuple):
    """A checked call: sizes T, N, C (data), H (state_size), P (projection or H), proj (0 without), L layers,
    D directions, G gates; ``size`` the flat parameter count; ``clip`` (min, max) or None; ``p`` the dropout rate;
    ``lengths`` whether sequence_length is given; ``outputs`` how many arrays the call returns."""
    mode: str
    T: int
    N: int
    C: int
    H: int
    P: int
    proj: int
    L: int
    D: int
    G: int
    size: int
    clip: tuple | None
    clip_nan: bool
    p: float
    lengths: bool
    outputs: int
    dtype: np.dtype


def _sizes(p) -> tuple:
    h = p["state_size"]
    proj = p["projection_size"] or 0
    return h, (proj or h), proj, p["num_layers"], (2 if p["bidirectional"] else 1), GATES[p["mode"]]


def _param_size(p, c: int) -> int:
    h, _, proj, layers, d, _ = _sizes(p)
    return sum(int(np.prod(s)) for *_, s in layout(p["mode"], layers, c, h, d == 2, proj or None))


def _shift(lstm: bool, use_lengths: bool, state_cell, sequence_length):
    """(state_cell, sequence_length) as MXNet reads positional inputs: its node has no state_cell slot outside lstm
    mode, so there the fourth input is the sequence_length (how a symbol graph passes them)."""
    if not lstm and use_lengths and sequence_length is None and state_cell is not None:
        return None, state_cell
    return state_cell, sequence_length


def _prepare(p, data, parameters, state, state_cell=None, sequence_length=None):
    mode = p["mode"]
    lstm = mode == "lstm"
    state_cell, sequence_length = _shift(lstm, p["use_sequence_length"], state_cell, sequence_length)
    if data.ndim != 3:
        raise DnnbindValueError(f"{NAME}: data must be 3-D (sequence length, batch size, input size) (TNC), got shape "
                                f"{tuple(data.shape)}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{NAME}: data must be a floating-point array, got {data.dtype} (shape "
                               f"{tuple(data.shape)}); use .astype('float32')")
    t_len, n, c = data.shape
    if min(data.shape) < 1:
        raise DnnbindValueError(f"{NAME}: data of shape {tuple(data.shape)} is empty; every axis must be at least 1")
    if max(data.shape) >= 2 ** 31:
        raise DnnbindValueError(f"{NAME}: RNN does not support large dimensions (>= 2^31), data {tuple(data.shape)}")
    h, pp, proj, layers, d, _ = _sizes(p)
    if h < 1 or layers < 1:
        raise DnnbindValueError(f"{NAME}: state_size and num_layers must be at least 1, got state_size={h}, "
                                f"num_layers={layers}")
    if p["projection_size"] is not None:
        if not lstm:
            raise DnnbindValueError(f"{NAME}: projection_size is only supported for mode='lstm', got mode={mode!r}")
        if not 1 <= proj <= h:
            raise DnnbindValueError(f"{NAME}: projection_size must be between 1 and state_size ({h}), got {proj}")
    lo, hi = p["lstm_state_clip_min"], p["lstm_state_clip_max"]
    clip = None
    if lo is not None or hi is not None:
        if not lstm:
            raise DnnbindValueError(f"{NAME}: state clipping (lstm_state_clip_min/max) is only supported for "
                                    f"mode='lstm', got mode={mode!r}")
        if lo is None or hi is None:
            raise DnnbindValueError(f"{NAME}: lstm_state_clip_min and lstm_state_clip_max must be specified together")
        if hi < lo:
            raise DnnbindValueError(f"{NAME}: lstm_state_clip_max ({hi}) must be greater or equal to "
                                    f"lstm_state_clip_min ({lo})")
        clip = (float(lo), float(hi))
    rate = dropout_p(NAME, p["p"])
    if lstm and state_cell is None:
        raise DnnbindTypeError(f"{NAME}: mode='lstm' needs state_cell, the initial cell state of shape "
                               f"{(layers * d, n, h)}")
    if not lstm and state_cell is not None:
        raise DnnbindValueError(f"{NAME}: state_cell is only taken with mode='lstm', got mode={mode!r}")
    if p["use_sequence_length"] and sequence_length is None:
        raise DnnbindTypeError(f"{NAME}: use_sequence_length=True needs sequence_length, an array of shape ({n},)")
    if not p["use_sequence_length"] and sequence_length is not None:
        raise DnnbindValueError(f"{NAME}: sequence_length is given but use_sequence_length is False; pass "
                                "use_sequence_length=True")
    size = _param_size(p, c)
    arrays = {"parameters": (parameters, (size,)), "state": (state, (layers * d, n, pp))}
    if lstm:
        arrays["state_cell"] = (state_cell, (layers * d, n, h))
    what = (f"(mode={mode!r}, state_size={h}, num_layers={layers}, bidirectional={d == 2}"
            f"{f', projection_size={proj}' if proj else ''}, data {tuple(data.shape)})")
    for name, (a, shape) in arrays.items():
        if tuple(a.shape) != shape:
            raise DnnbindValueError(f"{NAME}: {name} has shape {tuple(a.shape)}; expected {shape} {what}")
        if a.dtype != data.dtype:
            raise DnnbindTypeError(f"{NAME}: {name} is {a.dtype} but data is {data.dtype}; they must share one dtype")
    if sequence_length is not None:
        if tuple(sequence_length.shape) != (n,):
            raise DnnbindValueError(f"{NAME}: sequence_length has shape {tuple(sequence_length.shape)}; expected "
                                    f"({n},), one length per batch entry of data {tuple(data.shape)}")
        if sequence_length.dtype.kind not in "iuf":
            raise DnnbindTypeError(f"{NAME}: sequence_length must be an integer or float array, got "
                                   f"{sequence_length.dtype}")
    if data.device.kind == "gpu" and data.dtype not in D.DATA_TYPES:
        raise DnnbindTypeError(f"{NAME}: cuDNN's RNN takes float16, float32 or float64 data, got {data.dtype}")
    outputs = (3 if lstm else 2) if p["state_outputs"] else 1
    return Geometry(mode, t_len, n, c, h, pp, proj, layers, d, GATES[mode], size, clip, bool(p["lstm_state_clip_nan"]),
                    rate, sequence_length is not None, outputs, data.dtype)


def _infer(p, shapes):
    t_len, n, c = shapes[0]
    h, pp, _, layers, d, _ = _sizes(p)
    ins = [tuple(shapes[0]), (_param_size(p, c),), (layers * d, n, pp)]
    if p["mode"] == "lstm":
        ins.append((layers * d, n, h))
    if p["use_sequence_length"]:
        ins.append((n,))
    outs = [(t_len, n, d * pp)]
    if p["state_outputs"]:
        outs.append((layers * d, n, pp))
        if p["mode"] == "lstm":
            outs.append((layers * d, n, h))
    return ins, outs


def _outputs(p):
    """MXNet's node has one output, or with state_outputs the final states too (node_row_ptr of MXNet 1.9.1)."""
    if not p.get("state_outputs"):
        return 1, ["output"]
    names = ["output", "state_output"] + (["statecell_output"] if p.get("mode") == "lstm" else [])
    return len(names), names


def _result(g: Geometry, y, hy, cy):
    if g.outputs == 1:
        return y
    return (y, hy, cy) if g.outputs == 3 else (y, hy)


def _heads(dy):
    """(dy, dhy, dcy) from what the dispatch passes: the output's gradient, or a tuple of every output's."""
    if isinstance(dy, (tuple, list)):
        return tuple(dy) + (None,) * (3 - len(dy))
    return dy, None, None


def _host_lengths(g: Geometry, seq: np.ndarray) -> np.ndarray:
    """The lengths as int32 (a float length is truncated, as MXNet's cast does), each in [1, T]."""
    lengths = np.asarray(seq).astype(np.int64)
    bad = (lengths < 1) | (lengths > g.T)
    if bad.any():
        b = int(np.argmax(bad))
        raise DnnbindValueError(f"{NAME}: sequence_length[{b}] is {seq[b]}; every length must be between 1 and the "
                                f"data's sequence length {g.T}")
    return lengths.astype(np.int32)


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _cpu_forward(c, x, params, hx, cx=None, seq=None):
    g = c.geo
    cx, seq = _shift(g.mode == "lstm", g.lengths, cx, seq)
    lengths = _host_lengths(g, seq) if g.lengths else None
    p = g.p if c.training and g.L > 1 else 0.0
    gen = np.random.default_rng(rng.next_seed()) if p > 0 else None
    y, hy, cy, cache = rnn_forward(x, params, hx, cx, mode=g.mode, state_size=g.H, num_layers=g.L,
                                   bidirectional=g.D == 2, projection_size=g.proj or None, lengths=lengths,
                                   clip=g.clip, clip_nan=g.clip_nan, p=p, rng=gen)
    return _result(g, y, hy, cy), cache


def _cpu_backward(c, cache, grads, dy):
    dy, dhy, dcy = _heads(dy)
    dx, dparams, dhx, dcx = rnn_backward(cache, dy, dhy, dcy)
    need = grads.needs
    out = [dx, dparams, dhx, dcx, None]
    return tuple(o if i < len(need) and need[i] else None for i, o in enumerate(out))[:len(need)]


# gpu: cuDNN ---------------------------------------------------------------------------------------------------

class _Plan:
    """Per configuration and handle: the RNN descriptor, the weight space size and how MXNet's vector maps onto it
    (``segments``: (element offset in the vector, element offset in the weight space, count), merged; ``identity``
    when the vector can be used as the weight space itself)."""
    __slots__ = ("desc", "identity", "key", "segments", "wbytes")


_plans: dict = {}
_plans_lock = threading.Lock()
_temp: dict = {}  # (plan key, data key, fwd mode) -> (workspace bytes, reserve bytes)
_temp_lock = threading.Lock()
_seq_dev: dict = {}  # (device, T, N) -> int32 device array of N times T (devSeqLengths without sequence_length)
_seq_lock = threading.Lock()


def _dropout_desc(c, h: int):
    g = c.geo
    if not (c.training and g.p > 0 and g.L > 1):
        return None, 0.0
    p = float(np.float32(g.p))
    return _dropout.rng_state(c.device, h, p, rng.next_seed, rng.generation()).desc(p), p


def _plan(c, h: int, train_dropout: bool = True) -> _Plan:
    g = c.geo
    math = config.math_mode() if g.dtype == np.float32 else "-"
    drop, p = _dropout_desc(c, h) if train_dropout else (None, 0.0)
    key = (h, g.mode, g.dtype, math, g.C, g.H, g.P, g.proj, g.L, g.D, g.clip, g.clip_nan, p,
           None if drop is None else id(drop))
    plan = _plans.get(key)
    if plan is None:
        plan = cache_insert(_plans, key, lambda: _make_plan(c, h, math, drop, key), _plans_lock, 1024)
    return plan


def _make_plan(c, h: int, math: str, drop, key) -> _Plan:
    g = c.geo
    plan = _Plan()
    plan.key = key
    plan.desc = D.rnn(g.mode, g.dtype, math, g.C, g.H, g.P, g.L, g.D == 2, g.clip, g.clip_nan, drop)
    size = ctypes.c_size_t()
    L.cudnnGetRNNWeightSpaceSize(h, plan.desc, ctypes.byref(size))
    plan.wbytes = size.value
    plan.segments, plan.identity = _weight_map(c, h, plan.desc, plan.wbytes)
    return plan


def _state_descs(g):
    """The hx/hy and cx/cy descriptors of this call's batch (not the plan's: one plan serves every batch size)."""
    return D.rnn_state((g.L * g.D, g.N, g.P), g.dtype), D.rnn_state((g.L * g.D, g.N, g.H), g.dtype)


def _weight_map(c, h: int, desc, wbytes: int):
    """Where each piece of MXNet's vector lies in cuDNN's weight space, asked of cudnnGetRNNWeightParams on a
    scratch weight space (addresses minus its base), every matrix and bias checked for the size MXNet gives it."""
    g = c.geo
    isz = g.dtype.itemsize
    pieces = {(layer, d, name): (off, shape) for layer, d, name, off, shape in
              layout(g.mode, g.L, g.C, g.H, g.D == 2, g.proj or None)}
    base_buf = DeviceBuffer(max(wbytes, 1), c.device, current_stream(c.device))
    base = base_buf.ptr
    mdesc, bdesc = D.TensorDesc((1, 1, 1, 1), g.dtype), D.TensorDesc((1, 1, 1, 1), g.dtype)
    maddr, baddr = ctypes.c_void_p(), ctypes.c_void_p()
    segs = []
    for layer in range(g.L):
        for d in range(g.D):
            ids = list(range(2 * g.G)) + ([8] if g.proj else [])
            for lin in ids:
                L.cudnnGetRNNWeightParams(h, desc, layer * g.D + d, wbytes, base, lin, mdesc, ctypes.byref(maddr),
                                          bdesc, ctypes.byref(baddr))
                if lin == 8:  # the projection: MXNet's h2r weight, no bias
                    off, shape = pieces[(layer, d, "wr")]
                    wsrc, n, bsrc = off, int(np.prod(shape)), None
                else:
                    rec = lin >= g.G
                    gate = lin - g.G if rec else lin
                    off, shape = pieces[(layer, d, "wh" if rec else "wx")]
                    n = int(np.prod(shape)) // g.G
                    wsrc = off + gate * n
                    bsrc = pieces[(layer, d, "bh" if rec else "bx")][0] + gate * g.H
                _check_piece(mdesc, n, layer, d, lin, "matrix")
                segs.append((wsrc, (maddr.value - base) // isz, n))
                if bsrc is not None:
                    _check_piece(bdesc, g.H, layer, d, lin, "bias")
                    segs.append((bsrc, (baddr.value - base) // isz, g.H))
    del base_buf
    segs.sort()
    merged = [list(segs[0])]
    for src, dst, n in segs[1:]:
        last = merged[-1]
        if last[0] + last[2] == src and last[1] + last[2] == dst:
            last[2] += n
        else:
            merged.append([src, dst, n])
    merged = tuple(tuple(s) for s in merged)
    identity = len(merged) == 1 and merged[0][:2] == (0, 0) and merged[0][2] == g.size and wbytes == g.size * isz
    return merged, identity


def _check_piece(desc, n: int, layer: int, d: int, lin: int, what: str) -> None:
    dt, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    L.cudnnGetTensorNdDescriptor(desc, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
    got = int(np.prod([dims[i] for i in range(nb.value)]))
    if got != n:
        raise DnnbindValueError(f"{NAME}: cuDNN's {what} of layer {layer}, direction {d}, linLayerID {lin} has "
                                f"{got} elements, MXNet's layout {n}: the weight map does not fit this cuDNN")


def _weights_in(plan: _Plan, params: NDArray) -> NDArray:
    """cuDNN's weight space holding MXNet's vector ``params`` (the vector itself when the layouts coincide)."""
    if plan.identity:
        return params
    ws = out_like((plan.wbytes,), np.uint8, params.device)
    isz, stream = params.dtype.itemsize, current_stream(params.device)
    for src, dst, n in plan.segments:
        memcpy(ws.ptr + dst * isz, params.ptr + src * isz, n * isz, D2D, stream)
    return ws


def _weights_out(plan: _Plan, dws: NDArray, like: NDArray) -> NDArray:
    """MXNet's flat vector from cuDNN's weight gradient space."""
    if plan.identity:
        return NDArray._from_ptr(dws.ptr, like.shape, like.dtype, like.device, dws._owner)
    dw = out_like(like.shape, like.dtype, like.device)
    isz, stream = like.dtype.itemsize, current_stream(like.device)
    for src, dst, n in plan.segments:
        memcpy(dw.ptr + src * isz, dws.ptr + dst * isz, n * isz, D2D, stream)
    return dw


def _seq_lengths(c, seq):
    """(host lengths tuple, int32 device array) for the call."""
    g = c.geo
    if seq is None:
        key = (c.device, g.T, g.N)
        dev = _seq_dev.get(key)
        if dev is None:
            dev = cache_insert(_seq_dev, key, lambda: nd_array(np.full(g.N, g.T, np.int32), c.device), _seq_lock, 256)
        return (g.T,) * g.N, dev
    lengths = _host_lengths(g, seq.numpy())  # NOTE: synchronizes (cuDNN's data descriptor takes host lengths)
    return tuple(int(v) for v in lengths), nd_array(lengths, c.device)


def _temp_sizes(h: int, plan: _Plan, xd, data_key: tuple, mode: int) -> tuple:
    key = (plan.key, data_key, mode)
    sizes = _temp.get(key)
    if sizes is None:
        def query():
            ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
            L.cudnnGetRNNTempSpaceSizes(h, plan.desc, mode, xd, ctypes.byref(ws), ctypes.byref(rs))
            return ws.value, rs.value
        sizes = cache_insert(_temp, key, query, _temp_lock, 4096)
    return sizes


class _Saved(NamedTuple):
    plan: object
    train: bool
    x: NDArray
    hx: NDArray
    cx: NDArray | None
    w: NDArray
    params: NDArray
    y: NDArray
    reserve: NDArray | None
    lengths: tuple
    dev_lengths: NDArray


def _run_forward(c, h, plan, x, params, hx, cx, lengths, dev_lengths, train: bool, w=None):
    g = c.geo
    dt = g.dtype
    xd = D.rnn_data(dt, g.T, g.N, g.C, lengths)
    yd = D.rnn_data(dt, g.T, g.N, g.D * g.P, lengths)
    mode = cudnn.CUDNN_FWD_MODE_TRAINING if train else cudnn.CUDNN_FWD_MODE_INFERENCE
    ws_bytes, rs_bytes = _temp_sizes(h, plan, xd, (g.T, g.N, lengths), mode)
    w = _weights_in(plan, params) if w is None else w
    dev = x.device
    y = out_like((g.T, g.N, g.D * g.P), dt, dev)
    hy = out_like(hx.shape, dt, dev)
    cy = out_like(cx.shape, dt, dev) if cx is not None else None
    reserve = out_like((max(rs_bytes, 1),), np.uint8, dev) if train else None
    h_desc, c_desc = _state_descs(g)
    with scratch(dev, max(ws_bytes, 1)) as (ws, ws_size):
        L.cudnnRNNForward(h, plan.desc, mode, dev_lengths.ptr, xd, x.ptr, yd, y.ptr, h_desc, hx.ptr,
                          hy.ptr, c_desc, None if cx is None else cx.ptr, None if cy is None else cy.ptr,
                          plan.wbytes, w.ptr, ws_size, ws, rs_bytes, None if reserve is None else reserve.ptr)
    return y, hy, cy, w, reserve


def _gpu_forward(c, x, params, hx, cx=None, seq=None):
    g = c.geo
    cx, seq = _shift(g.mode == "lstm", g.lengths, cx, seq)
    h = dnn(x)
    try:
        plan = _plan(c, h)
        lengths, dev_lengths = _seq_lengths(c, seq)
        train = bool(c.training)
        y, hy, cy, w, reserve = _run_forward(c, h, plan, x, params, hx, cx, lengths, dev_lengths, train)
    except CudnnError as exc:
        raise with_context(exc, op=NAME, data=x.shape, dtype=g.dtype.name, mode=g.mode, state_size=g.H,
                           num_layers=g.L, bidirectional=g.D == 2) from None
    saved = _Saved(plan, train, x, hx, cx, w, params, y, reserve, lengths, dev_lengths)
    return _result(g, y, hy, cy), saved


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    dt = g.dtype
    dy, dhy, dcy = _heads(dy)
    s = saved
    h = dnn(s.x)
    dev = s.x.device
    need = grads.needs
    try:
        plan, y, reserve = s.plan, s.y, s.reserve
        if not s.train:
            # The forward ran in inference mode (predict mode), which keeps no reserve: run it again in training
            # mode, without dropout (predict mode applies none), for the reserve the backward reads.
            plan = _plan(c, h, train_dropout=False)
            y, _, _, _, reserve = _run_forward(c, h, plan, s.x, s.params, s.hx, s.cx, s.lengths, s.dev_lengths, True)
        w = s.w if plan is s.plan else _weights_in(plan, s.params)
        xd = D.rnn_data(dt, g.T, g.N, g.C, s.lengths)
        yd = D.rnn_data(dt, g.T, g.N, g.D * g.P, s.lengths)
        ws_bytes, rs_bytes = _temp_sizes(h, plan, xd, (g.T, g.N, s.lengths), cudnn.CUDNN_FWD_MODE_TRAINING)
        h_desc, c_desc = _state_descs(g)
        if dy.dtype != dt:
            dy = table("cast", dy, dtype=dt)
        dx = out_like(s.x.shape, dt, dev)
        if g.lengths:  # steps past a length: make sure they read as 0, whatever cuDNN leaves there
            memset(dx.ptr, 0, dx.nbytes, current_stream(dev))
        dhx = out_like(s.hx.shape, dt, dev)
        dcx = out_like(s.cx.shape, dt, dev) if s.cx is not None else None
        with scratch(dev, max(ws_bytes, 1)) as (ws, ws_size):
            # NOTE: BackwardData must run before BackwardWeights (it leaves what the latter reads in the reserve).
            L.cudnnRNNBackwardData_v8(h, plan.desc, s.dev_lengths.ptr, yd, y.ptr, dy.ptr, xd, dx.ptr,
                                      h_desc, s.hx.ptr, None if dhy is None else dhy.ptr, dhx.ptr,
                                      c_desc, None if s.cx is None else s.cx.ptr,
                                      None if dcy is None else dcy.ptr, None if dcx is None else dcx.ptr,
                                      plan.wbytes, w.ptr, ws_size, ws, rs_bytes, reserve.ptr)
            dparams = None
            if need[1]:
                dws = out_like((max(plan.wbytes, 1),), np.uint8, dev)
                memset(dws.ptr, 0, plan.wbytes, current_stream(dev))  # NOTE: the weight gradient is ADDed into
                L.cudnnRNNBackwardWeights_v8(h, plan.desc, cudnn.CUDNN_WGRAD_MODE_ADD, s.dev_lengths.ptr, xd,
                                             s.x.ptr, h_desc, s.hx.ptr, yd, y.ptr, plan.wbytes, dws.ptr,
                                             ws_size, ws, rs_bytes, reserve.ptr)
                dparams = _weights_out(plan, dws, s.params)
    except CudnnError as exc:
        raise with_context(exc, op=f"{NAME} backward", data=s.x.shape, dtype=dt.name, mode=g.mode) from None
    out = [dx, dparams, dhx, dcx, None]
    return tuple(o if i < len(need) and need[i] else None for i, o in enumerate(out))[:len(need)]


# samples for the registry-parametrized tests ------------------------------------------------------------------

def _arrays(rng_, mode, t_len, n, c, h, layers, bidir, proj=None, lengths=None):
    d = 2 if bidir else 1
    pp = proj or h
    size = sum(int(np.prod(s)) for *_, s in layout(mode, layers, c, h, bidir, proj))
    a = {"data": rng_.uniform(-1, 1, (t_len, n, c)), "parameters": rng_.uniform(-0.6, 0.6, size),
         "state": rng_.uniform(-0.5, 0.5, (layers * d, n, pp))}
    if mode == "lstm":
        a["state_cell"] = rng_.uniform(-0.5, 0.5, (layers * d, n, h))
    if lengths is not None:
        a["sequence_length"] = np.asarray(lengths, np.float64)
    return a


def _samples(rng_):
    base = {"state_outputs": True}
    for mode in ("rnn_relu", "rnn_tanh", "lstm", "gru"):
        yield _arrays(rng_, mode, 3, 2, 3, 3, 1, False), dict(base, mode=mode, state_size=3, num_layers=1)
    yield (_arrays(rng_, "lstm", 3, 2, 3, 2, 2, True),
           dict(base, mode="lstm", state_size=2, num_layers=2, bidirectional=True))
    yield (_arrays(rng_, "gru", 2, 3, 2, 2, 2, True),
           {"mode": "gru", "state_size": 2, "num_layers": 2, "bidirectional": True})
    yield (_arrays(rng_, "lstm", 3, 2, 2, 3, 2, True, proj=2),
           dict(base, mode="lstm", state_size=3, num_layers=2, bidirectional=True, projection_size=2))
    yield (_arrays(rng_, "gru", 4, 3, 2, 2, 1, True, lengths=[4, 2, 1]),
           dict(base, mode="gru", state_size=2, num_layers=1, bidirectional=True, use_sequence_length=True))
    yield (_arrays(rng_, "lstm", 3, 2, 2, 2, 2, False, lengths=[1, 3]),
           dict(base, mode="lstm", state_size=2, num_layers=2, use_sequence_length=True))
    yield (_arrays(rng_, "rnn_tanh", 1, 1, 2, 3, 2, True),  # T = 1, batch of 1
           dict(base, mode="rnn_tanh", state_size=3, num_layers=2, bidirectional=True))
    yield (_arrays(rng_, "lstm", 3, 2, 2, 2, 1, False),  # clipping, with values that reach the bounds
           dict(base, mode="lstm", state_size=2, num_layers=1, lstm_state_clip_min=-0.3, lstm_state_clip_max=0.35))


def _types(p, types, n_out):
    """Symbol type inference: every input and output share the data's type, but sequence_length (the last input
    when given) keeps its own (int or float), as in MXNet's RNNType."""
    own = len(types) - 1 if p.get("use_sequence_length") else None
    t = next((x for i, x in enumerate(types) if i != own and x is not None), None)
    return [types[i] if i == own else t for i in range(len(types))], [t] * n_out


define(OpDef(NAME, prepare=_prepare, infer=_infer, samples=_samples, outputs=_outputs, dtype=_types,
             grad_outputs=True,  # the final states take gradients too (an encoder's state feeds a decoder)
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             optional={"state_cell": lambda p: p.get("mode") == "lstm",
                       "sequence_length": lambda p: bool(p.get("use_sequence_length"))},
             nograd=("sequence_length",),
             doc="MXNet's fused RNN operator (rnn_relu, rnn_tanh, lstm, gru; TNC): cudnnRNNForward and "
                 "cudnnRNNBackwardData_v8/BackwardWeights_v8 on a GPU, a numpy twin on the cpu."))
