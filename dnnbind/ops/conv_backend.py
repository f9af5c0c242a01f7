"""Layer 2 (ops): 2-D convolutions through cuDNN 9's backend (graph) API. Imports _lib, runtime and ops.

Why: each legacy call (cudnnConvolutionForward / BackwardData / BackwardFilter) re-validates its descriptors
and re-plans the kernel on the host, 23-45 us per call at MNIST sizes (the fused bias+ReLU call 50-100 us),
often more than the kernel. The backend API does that work once: an operation graph of one conv op is
finalized into execution plans (one per engine config the heuristics return), and a call is then one
``cudnnBackendExecute(handle, plan, variant_pack)``, 7-15 us. The variant pack binds the device pointers;
packs are finalized once per pointer set and cached, so a repeated call with the same buffers costs one C call
(PyTorch reaches ~20 us/conv this way).

``candidates(...)`` lists usable plans in heuristic order; timing them and picking one is the caller's job.
Directions: "fwd", "bwd_data", "bwd_filter" (one conv op each) and "fwd_bias_relu": y = relu(conv(x, w) + b)
as ONE graph (conv -> virtual tensor -> pointwise ADD of b -> virtual tensor -> pointwise RELU_FWD -> y), run by
one engine (typically one kernel; runtime-compiled engines included), so the virtual tensors need no memory.
Enum values come from cudnn_graph_v9.h (see _lib.cudnn; tests/test_conv_backend.py checks them).
Tensors are dims + strides: dims always (N, C, H, W) / (K, C, R, S); ``layout="NHWC"`` arrays (MXNet's channels
last: x (N, H, W, C), w (K, R, S, C)) get the strides (H*W*C, 1, W*C, C) for those dims.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import ctypes
import functools
import sys

import numpy as np

from .._lib import cudnn as C
from .._lib import loader
from .._lib.errors import CudnnError, CudnnInternalError, CudnnNotSupported, LibraryNotFoundError
from . import _check

L = C.lib
_i64, _vp, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int

# Tensor UIDs by role: the x-like tensor (x or dx), the w-like (w or dw), the y-like (y or dy); fwd_bias_relu
# adds the bias and its two virtual intermediates (conv(x, w), then + b), which need UIDs but no pointers.
UID_X, UID_W, UID_Y, UID_B, UID_CONV_OUT, UID_BIAS_OUT = 1, 2, 3, 4, 5, 6
# direction -> (operation descriptor type, ALPHA, BETA, CONV_DESC, (x-like, w-like, y-like) attributes,
#               UIDs in the order execute() takes its pointers)
_OPS = {
    "fwd": (C.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            (C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
             C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y), (UID_X, UID_W, UID_Y)),            # (x, w, y)
    "bwd_data": (C.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                 C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                 C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                 (C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                  C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY), (UID_W, UID_Y, UID_X)),     # (w, dy, dx)
    "bwd_filter": (C.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                   C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                   C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                   C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                   (C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                    C.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY), (UID_X, UID_Y, UID_W)),  # (x, dy, dw)
}
_OPS["fwd_bias_relu"] = _OPS["fwd"][:5] + ((UID_X, UID_W, UID_B, UID_Y),)  # its conv op is "fwd"'s; (x, w, b, y)
_DTYPES = {np.dtype(np.float32): C.CUDNN_DATA_FLOAT, np.dtype(np.float64): C.CUDNN_DATA_DOUBLE,
           np.dtype(np.float16): C.CUDNN_DATA_HALF}
DTYPES = tuple(_DTYPES)  # what candidates() builds plans for


def _compute_code(dtype) -> int:
    """The conv's accumulation type: double for double, float otherwise (half data accumulates in float, as the
    legacy descriptor's "pseudo half" does)."""
    return C.CUDNN_DATA_DOUBLE if dtype == np.float64 else C.CUDNN_DATA_FLOAT
_NOTE_TAGS = {C.CUDNN_NUMERICAL_NOTE_TENSOR_CORE: "tc", C.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: "down",
              C.CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: "rpr", C.CUDNN_NUMERICAL_NOTE_FFT: "fft",
              C.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: "nondet", C.CUDNN_NUMERICAL_NOTE_WINOGRAD: "wino"}
_FUNCTIONS = ("cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendFinalize",
              "cudnnBackendSetAttribute", "cudnnBackendGetAttribute", "cudnnBackendExecute")
PACK_CACHE = 64  # finalized variant packs kept per plan (one per distinct pointer set)


def available() -> bool:
    """Whether the loaded cuDNN exports the backend API (every 9.x does)."""
    try:
        return all(L.has(name) for name in _FUNCTIONS)
    except (OSError, CudnnError):  # the library itself could not be loaded
        return False


class Descriptor:
    """Owns one cudnnBackendDescriptor_t (destroyed with the object) and the descriptors set into it."""

    __slots__ = ("_as_parameter_", "_refs", "kind", "device_pointers")

    def __init__(self, kind: int):
        h = _vp()
        L.cudnnBackendCreateDescriptor(kind, ctypes.byref(h))
        self._as_parameter_, self.kind, self._refs = h.value, kind, []
        # A variant pack's device pointers (its tensors', then the workspace's): a recording reads which buffers a
        # cudnnBackendExecute reaches from here (recording.CallRecording.last_uses), since cuDNN keeps them inside
        self.device_pointers = None

    def __del__(self, _finalizing=sys.is_finalizing):
        h = getattr(self, "_as_parameter_", None)
        if h and not _finalizing():  # at interpreter exit the process teardown frees everything
            self._as_parameter_ = None
            try:
                L.cudnnBackendDestroyDescriptor(h)
            except (CudnnError, AttributeError, TypeError):
                pass

    def set(self, name: int, atype: int, ctype, *values) -> Descriptor:
        L.cudnnBackendSetAttribute(self, name, atype, len(values), (ctype * len(values))(*values))
        return self

    def set_descs(self, name: int, *descs: Descriptor) -> Descriptor:
        self._refs.extend(descs)  # plans must keep alive everything they were built from
        return self.set(name, C.CUDNN_TYPE_BACKEND_DESCRIPTOR, _vp, *(d._as_parameter_ for d in descs))

    def finalize(self) -> Descriptor:
        L.cudnnBackendFinalize(self)
        return self

    def get(self, name: int, atype: int, ctype, count: int) -> list:
        out, n = (ctype * max(count, 1))(), _i64()
        L.cudnnBackendGetAttribute(self, name, atype, count, ctypes.byref(n), out)
        return list(out[:n.value])

    def get_int64(self, name: int) -> int:
        return self.get(name, C.CUDNN_TYPE_INT64, _i64, 1)[0]

    def get_descs(self, name: int, kind: int, count: int | None = None) -> list:
        """Descriptor-valued attribute: cuDNN fills descriptors the caller created (count None: ask first)."""
        if count is None:
            n = _i64()
            L.cudnnBackendGetAttribute(self, name, C.CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, ctypes.byref(n), None)
            count = n.value
        if count <= 0:
            return []
        descs = [Descriptor(kind) for _ in range(count)]
        arr, n = (_vp * count)(*(d._as_parameter_ for d in descs)), _i64()
        L.cudnnBackendGetAttribute(self, name, C.CUDNN_TYPE_BACKEND_DESCRIPTOR, count, ctypes.byref(n), arr)
        return descs[:n.value]


def _packed_strides(dims, layout: str = "NCHW") -> list:
    """Element strides of a packed 4-D tensor of ``dims`` (N, C, H, W): row-major, or channels last (NHWC)."""
    n, c, h, w = dims
    return [h * w * c, 1, w * c, c] if layout == "NHWC" else [c * h * w, h * w, w, 1]


def _tensor(uid: int, dims, dtype_code: int, alignment: int, virtual: bool = False,
            layout: str = "NCHW") -> Descriptor:
    """A fully packed tensor of ``dims`` (N, C, H, W) in ``layout`` (unfinalized). Virtual: an intermediate of the
    graph, never in memory (not in the variant pack). A (1, K, 1, 1) bias gets strides (K, 1, 1, 1) (NHWC:
    (K, 1, K, K)): broadcast over N, H, W."""
    t = (Descriptor(C.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
         .set(C.CUDNN_ATTR_TENSOR_UNIQUE_ID, C.CUDNN_TYPE_INT64, _i64, uid)
         .set(C.CUDNN_ATTR_TENSOR_DATA_TYPE, C.CUDNN_TYPE_DATA_TYPE, _int, dtype_code)
         .set(C.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, C.CUDNN_TYPE_INT64, _i64, alignment)
         .set(C.CUDNN_ATTR_TENSOR_DIMENSIONS, C.CUDNN_TYPE_INT64, _i64, *dims)
         .set(C.CUDNN_ATTR_TENSOR_STRIDES, C.CUDNN_TYPE_INT64, _i64, *_packed_strides(dims, layout)))
    return t.set(C.CUDNN_ATTR_TENSOR_IS_VIRTUAL, C.CUDNN_TYPE_BOOLEAN, ctypes.c_bool, True) if virtual else t


def _conv(stride, padding, dilation, compute_code: int) -> Descriptor:
    """Cross-correlation (what frameworks call convolution), symmetric padding (unfinalized)."""
    return (Descriptor(C.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
            .set(C.CUDNN_ATTR_CONVOLUTION_COMP_TYPE, C.CUDNN_TYPE_DATA_TYPE, _int, compute_code)
            .set(C.CUDNN_ATTR_CONVOLUTION_CONV_MODE, C.CUDNN_TYPE_CONVOLUTION_MODE, _int, C.CUDNN_CROSS_CORRELATION)
            .set(C.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, C.CUDNN_TYPE_INT64, _i64, 2)
            .set(C.CUDNN_ATTR_CONVOLUTION_DILATIONS, C.CUDNN_TYPE_INT64, _i64, *dilation)
            .set(C.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, C.CUDNN_TYPE_INT64, _i64, *stride)
            .set(C.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, C.CUDNN_TYPE_INT64, _i64, *padding)
            .set(C.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, C.CUDNN_TYPE_INT64, _i64, *padding))


def _operation(direction: str, conv: Descriptor, tx: Descriptor, tw: Descriptor, ty: Descriptor, dtype) -> Descriptor:
    """The conv operation node (unfinalized). ALPHA/BETA accept CUDNN_TYPE_FLOAT or CUDNN_TYPE_DOUBLE
    (cudnn_graph_v9.h); we pass the data's own precision, as the legacy API's alpha/beta pointers do."""
    kind, alpha, beta, conv_attr, tensor_attrs, _ = _OPS[direction]
    scalar = (C.CUDNN_TYPE_DOUBLE, ctypes.c_double) if dtype == np.float64 else (C.CUDNN_TYPE_FLOAT, ctypes.c_float)
    op = Descriptor(kind).set(alpha, *scalar, 1.0).set(beta, *scalar, 0.0).set_descs(conv_attr, conv)
    for attr, t in zip(tensor_attrs, (tx, tw, ty)):
        op.set_descs(attr, t)
    return op


def _pointwise(mode: int, math_code: int) -> Descriptor:
    """A pointwise descriptor (unfinalized). For RELU_FWD the clips are set as cudnn-frontend sets them (lower 0,
    slope 0, upper the math type's max: the header's default is "numeric limit max", which frontend clamps to
    FLT_MAX for float math). CUDNN_ATTR_POINTWISE_NAN_PROPAGATION is deprecated in cuDNN 9 and left at its
    default (NOT_PROPAGATE_NAN, the value frontend sets explicitly)."""
    pw = (Descriptor(C.CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
          .set(C.CUDNN_ATTR_POINTWISE_MODE, C.CUDNN_TYPE_POINTWISE_MODE, _int, mode)
          .set(C.CUDNN_ATTR_POINTWISE_MATH_PREC, C.CUDNN_TYPE_DATA_TYPE, _int, math_code))
    if mode == C.CUDNN_POINTWISE_RELU_FWD:
        upper = float(np.finfo(np.float32 if math_code == C.CUDNN_DATA_FLOAT else np.float64).max)
        pw.set(C.CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, C.CUDNN_TYPE_DOUBLE, ctypes.c_double, 0.0)
        pw.set(C.CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, C.CUDNN_TYPE_DOUBLE, ctypes.c_double, upper)
        pw.set(C.CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, C.CUDNN_TYPE_DOUBLE, ctypes.c_double, 0.0)
    return pw


def _pointwise_op(pw: Descriptor, x: Descriptor, y: Descriptor, b: Descriptor | None = None) -> Descriptor:
    """y = op(x) or op(x, b) (unfinalized); ALPHA1/ALPHA2 left at their default 1.0."""
    op = Descriptor(C.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    op.set_descs(C.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
    op.set_descs(C.CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
    if b is not None:
        op.set_descs(C.CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)
    return op.set_descs(C.CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)


def _graph_ops(direction: str, x_shape, w_shape, y_shape, conv: Descriptor, dtype, alignment: int,
               layout: str = "NCHW") -> list:
    """The finalized operation nodes of one direction's graph (shapes in ``layout``)."""
    code = _DTYPES[dtype]
    x_shape, w_shape, y_shape = (_check.to_nchw(s, layout) for s in (x_shape, w_shape, y_shape))
    tx, tw, ty = (_tensor(uid, s, code, alignment, layout=layout).finalize()
                  for uid, s in ((UID_X, x_shape), (UID_W, w_shape), (UID_Y, y_shape)))
    if direction != "fwd_bias_relu":
        return [_operation(direction, conv, tx, tw, ty, dtype).finalize()]
    # NOTE: the intermediates and the pointwise math are float for float32 and float16 data (as PyTorch's fused
    # conv graph and cudnn-frontend's ConvBiasAct sample use; half data is rounded once, at y), double for
    # float64 (where cuDNN may well have no engine: candidates() then returns []).
    inner = C.CUDNN_DATA_DOUBLE if dtype == np.float64 else C.CUDNN_DATA_FLOAT
    tb = _tensor(UID_B, (1, w_shape[0], 1, 1), code, alignment, layout=layout).finalize()
    conv_out, bias_out = (_tensor(uid, y_shape, inner, max(alignment, 4), virtual=True, layout=layout).finalize()
                          for uid in (UID_CONV_OUT, UID_BIAS_OUT))
    add, relu = (_pointwise(m, inner).finalize() for m in (C.CUDNN_POINTWISE_ADD, C.CUDNN_POINTWISE_RELU_FWD))
    return [_operation("fwd", conv, tx, tw, conv_out, dtype).finalize(),
            _pointwise_op(add, conv_out, bias_out, tb).finalize(),
            _pointwise_op(relu, bias_out, ty).finalize()]


def _variant_pack(uids, ptrs, workspace_ptr: int) -> Descriptor:
    """Binds device pointers to tensor UIDs (unfinalized); keeps its arrays alive with it."""
    uid_arr, ptr_arr, ws_arr = (_i64 * len(uids))(*uids), (_vp * len(ptrs))(*ptrs), (_vp * 1)(workspace_ptr or None)
    d = Descriptor(C.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    L.cudnnBackendSetAttribute(d, C.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, C.CUDNN_TYPE_INT64, len(uids), uid_arr)
    L.cudnnBackendSetAttribute(d, C.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, C.CUDNN_TYPE_VOID_PTR, len(ptrs), ptr_arr)
    L.cudnnBackendSetAttribute(d, C.CUDNN_ATTR_VARIANT_PACK_WORKSPACE, C.CUDNN_TYPE_VOID_PTR, 1, ws_arr)
    d._refs.extend((uid_arr, ptr_arr, ws_arr))
    d.device_pointers = tuple(ptrs) + ((workspace_ptr,) if workspace_ptr else ())
    return d


class BackendConvPlan:
    """One finalized execution plan. ``execute(handle, ptrs, workspace_ptr)`` runs it; ptrs (a tuple of
    device pointers) in role order: fwd (x, w, y), bwd_data (w, dy, dx), bwd_filter (x, dy, dw),
    fwd_bias_relu (x, w, b, y) with b (1, K, 1, 1)."""

    __slots__ = ("_packs", "_ph", "_plan", "_uids", "alignment", "behavior_notes", "direction", "engine_index",
                 "knobs", "name", "numerical_notes", "workspace_size")

    def __init__(self, direction, plan: Descriptor, engine_index, knobs, notes, behavior, alignment):
        self.direction, self._plan, self._uids, self.alignment = direction, plan, _OPS[direction][5], alignment
        self._ph = plan._as_parameter_
        self.engine_index, self.knobs = engine_index, knobs
        self.numerical_notes, self.behavior_notes = notes, behavior
        self.workspace_size = plan.get_int64(C.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)
        tags = [_NOTE_TAGS[n] for n in notes if n in _NOTE_TAGS]
        if C.CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION in behavior:
            tags.append("rtc")
        self.name = (f"eng{engine_index}" + ("[" + ",".join(f"k{t}={v}" for t, v in knobs) + "]" if knobs else "")
                     + ("(" + ",".join(tags) + ")" if tags else ""))
        self._packs: dict = {}  # (ptrs, workspace_ptr) -> finalized variant pack, oldest first

    def __repr__(self) -> str:
        return f"<BackendConvPlan {self.direction} {self.name} ws={self.workspace_size}>"

    def execute(self, handle: int, ptrs: tuple, workspace_ptr: int = 0) -> None:
        # NOTE: the pack goes in as its Descriptor (+0.1 us over an int): whoever keeps the call's arguments
        # (a RecordedStep, prepared()) keeps the pack, and through it the plan, alive. cudnnBackendExecute is
        # looked up on the Library each call so dnnbind.trace() / RecordedStep see it.
        try:
            pack = self._packs.get((ptrs, workspace_ptr))
        except TypeError:  # ptrs given as a list
            ptrs = tuple(ptrs)
            pack = self._packs.get((ptrs, workspace_ptr))
        if pack is None:
            pack = self._pack(ptrs, workspace_ptr)
        L.cudnnBackendExecute(handle, self._ph, pack)

    def prepared(self, handle: int, ptrs: tuple, workspace_ptr: int = 0) -> functools.partial:
        """A zero-argument callable doing only the cudnnBackendExecute (``.func``/``.args`` for replay). It
        holds the variant pack (which holds the plan), so it stays valid after the pack leaves the cache."""
        ptrs = tuple(ptrs)
        pack = self._packs.get((ptrs, workspace_ptr)) or self._pack(ptrs, workspace_ptr)
        return functools.partial(L.cudnnBackendExecute, handle, self._ph, pack)

    def json(self) -> str | None:
        """The plan's JSON (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION), or None if not retrievable."""
        attr, ctype = C.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, C.CUDNN_TYPE_CHAR
        try:
            n = _i64()
            L.cudnnBackendGetAttribute(self._plan, attr, ctype, 0, ctypes.byref(n), None)
            buf = ctypes.create_string_buffer(n.value or 1 << 16)
            L.cudnnBackendGetAttribute(self._plan, attr, ctype, len(buf), ctypes.byref(n), buf)
        except CudnnError:
            return None
        return buf.value.decode(errors="replace")

    def _pack(self, ptrs: tuple, workspace_ptr: int) -> Descriptor:
        if len(ptrs) != len(self._uids):
            raise DnnbindValueError(f"BackendConvPlan.execute: {self.direction} takes {len(self._uids)} pointers, "
                             f"got {len(ptrs)}")
        for p in ptrs:
            if not p or p % self.alignment:
                raise DnnbindValueError(f"BackendConvPlan.execute: pointer {p!r} is not {self.alignment}-byte aligned "
                                 "(the plan's CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)")
        if self.workspace_size and not workspace_ptr:
            raise DnnbindValueError(f"BackendConvPlan.execute: {self.name} needs {self.workspace_size} bytes of workspace")
        pack = _variant_pack(self._uids, ptrs, workspace_ptr).finalize()
        pack._refs.append(self._plan)
        if len(self._packs) >= PACK_CACHE:  # evict the oldest; destroyed once nothing else holds it
            del self._packs[next(iter(self._packs))]
        self._packs[(ptrs, workspace_ptr)] = pack
        return pack


def _excluded(notes, dtype, math: str, deterministic: bool) -> str:
    """Why an engine is refused ("" if it is not). As PyTorch's filterEngineConfigs (Conv_v8.cpp) does,
    down-converting engines are always refused and strict fp32 refuses tensor cores (TF32 on float data);
    we also refuse reduced-precision reductions there. float64's tensor cores (DMMA) are full FP64: kept."""
    if deterministic and C.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC in notes:
        return "nondeterministic"
    if C.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS in notes:
        return "down-converts inputs"
    if dtype == np.float32 and math == "fp32":
        if C.CUDNN_NUMERICAL_NOTE_TENSOR_CORE in notes:
            return "tensor cores (TF32) under strict fp32"
        if C.CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION in notes:
            return "reduced-precision reduction under strict fp32"
    return ""


def _engine_info(cfg: Descriptor):
    engine = cfg.get_descs(C.CUDNN_ATTR_ENGINECFG_ENGINE, C.CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1)[0]
    index = engine.get_int64(C.CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
    notes = tuple(engine.get(C.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, C.CUDNN_TYPE_NUMERICAL_NOTE, _int,
                             C.CUDNN_NUMERICAL_NOTE_TYPE_COUNT))
    behavior = tuple(engine.get(C.CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, C.CUDNN_TYPE_BEHAVIOR_NOTE, _int,
                                C.CUDNN_BEHAVIOR_NOTE_TYPE_COUNT))
    knobs = []
    for k in cfg.get_descs(C.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, C.CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                           C.CUDNN_KNOB_TYPE_COUNTS):
        knobs.append((k.get(C.CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, C.CUDNN_TYPE_KNOB_TYPE, _int, 1)[0],
                      k.get_int64(C.CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)))
    return index, tuple(sorted(knobs)), notes, behavior


def _heuristic_configs(graph: Descriptor, mode: int) -> list:
    heur = Descriptor(C.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR).set_descs(C.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
    heur.set(C.CUDNN_ATTR_ENGINEHEUR_MODE, C.CUDNN_TYPE_HEUR_MODE, _int, mode).finalize()
    cfgs = heur.get_descs(C.CUDNN_ATTR_ENGINEHEUR_RESULTS, C.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
    for cfg in cfgs:
        cfg._refs.append(heur)
    return cfgs


def _all_configs(graph: Descriptor, skipped: list) -> list:
    """Mode A's configs (INSTANT's if A fails), then FALLBACK's. Nothing filters out runtime-compiled engines
    (CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION): a fused graph often has no other; they compile (NVRTC) when
    their plan is finalized. A mode failing with NOT_SUPPORTED / an internal error is noted in skipped."""
    cfgs = []
    for modes in ((C.CUDNN_HEUR_MODE_A, C.CUDNN_HEUR_MODE_INSTANT), (C.CUDNN_HEUR_MODE_FALLBACK,)):
        for mode in modes:
            try:
                cfgs.extend(_heuristic_configs(graph, mode))
                break
            except (CudnnNotSupported, CudnnInternalError) as exc:
                skipped.append((f"heuristics mode {mode}", exc))
    return cfgs


def candidates(handle: int, direction: str, x_shape, w_shape, y_shape, stride=1, padding=0, dilation=1,
               dtype=np.float32, math: str = "fp32", deterministic: bool = False, *, groups: int = 1,
               alignment: int | None = None, limit: int | None = None, skipped: list | None = None,
               layout: str = "NCHW") -> list:
    """Usable execution plans for one conv, in heuristic order (mode A, or INSTANT if A fails, then the
    FALLBACK engines not already listed); [] when no engine supports the graph (never raises NOT_SUPPORTED).
    ``direction``: see _OPS (for "fwd_bias_relu" y_shape is y's and the bias is (1, K, 1, 1), K = w_shape[0]).
    Shapes NCHW / KCRS, or NHWC / KRSC with ``layout="NHWC"``, fully packed; float32, float64 or float16 (float
    accumulation); groups=1 only (else []). ``alignment``: the byte alignment promised for every pointer (default:
    the element size, see below). ``limit``: stop after that many plans. ``skipped``: a list that receives (name,
    reason) for each engine config refused or failing to finalize (NOT_SUPPORTED or an internal/compile error)."""
    if direction not in _OPS:
        raise DnnbindValueError(f"conv_backend.candidates: direction must be one of {sorted(_OPS)}, got {direction!r}")
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise DnnbindTypeError(f"conv_backend.candidates: dtype must be float32, float64 or float16, got {dtype}")
    if math not in ("fp32", "tf32"):
        raise DnnbindValueError(f"conv_backend.candidates: math must be 'fp32' or 'tf32', got {math!r}")
    if groups != 1:
        return []
    stride, padding, dilation, _, y_expect = _check.conv_params(
        "conv_backend.candidates", x_shape, w_shape, None, stride, padding, dilation, 1, layout)
    if tuple(y_shape) != y_expect:
        raise DnnbindValueError(f"conv_backend.candidates: y_shape {tuple(y_shape)} but the conv gives {y_expect}")
    # NOTE: CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT promises the alignment of the pointers bound at execute time
    # ("Byte alignment of pointers for this tensor", cudnn_graph_v9.h); engines may use vector loads sized by
    # it, and finalization requires a multiple of the element size. dnnbind's buffers are 256-aligned but a
    # view at an element offset is only itemsize-aligned, so that is the safe default. Pass 16 when every
    # pointer is known 16-aligned; execute() checks each new pointer set against it.
    alignment = int(alignment or dtype.itemsize)
    skipped = [] if skipped is None else skipped
    if direction == "fwd_bias_relu":
        # NOTE: runtime-fusion engines dlopen NVRTC by soname when their plan is finalized; a pip-wheel NVRTC
        # outside the loader's search path is found only if already loaded (cuda.pathfinder loads it globally).
        # Without it those engines report NOT_SUPPORTED (prerequisite missing) and are skipped.
        try:
            loader.load("nvrtc")
        except (LibraryNotFoundError, OSError) as exc:
            skipped.append(("nvrtc", exc))
    try:
        conv = _conv(stride, padding, dilation, _compute_code(dtype)).finalize()
        # NOTE: CUDNN_ATTR_OPERATIONGRAPH_HANDLE / EXECUTION_PLAN_HANDLE are marked deprecated in 9.28's enum,
        # but the header's descriptor docs still list them as required; cudnn-frontend sets both.
        graph = Descriptor(C.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
        try:
            ops = _graph_ops(direction, x_shape, w_shape, y_shape, conv, dtype, alignment, layout)
            graph.set_descs(C.CUDNN_ATTR_OPERATIONGRAPH_OPS, *ops)
            graph.set(C.CUDNN_ATTR_OPERATIONGRAPH_HANDLE, C.CUDNN_TYPE_HANDLE, _vp, handle).finalize()
        except CudnnNotSupported as exc:
            skipped.append(("graph", exc))
            return []
        plans, seen = [], set()
        for cfg in _all_configs(graph, skipped):
            index, knobs, notes, behavior = _engine_info(cfg)
            if (index, knobs) in seen:
                continue
            seen.add((index, knobs))
            why = _excluded(notes, dtype, math, deterministic)
            if why:
                skipped.append((f"eng{index}", why))
                continue
            plan = Descriptor(C.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
            plan.set(C.CUDNN_ATTR_EXECUTION_PLAN_HANDLE, C.CUDNN_TYPE_HANDLE, _vp, handle)
            plan.set_descs(C.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg)
            try:
                plan.finalize()  # a runtime-fusion engine compiles here (NVRTC; a missing one: NOT_SUPPORTED)
            except (CudnnNotSupported, CudnnInternalError) as exc:
                skipped.append((f"eng{index}", exc))
                continue
            plan._refs.append(graph)  # cfg -> heuristics -> graph -> ops -> conv, tensors
            plans.append(BackendConvPlan(direction, plan, index, knobs, notes, behavior, alignment))
            if limit is not None and len(plans) >= limit:
                return plans
        return plans
    except CudnnError as exc:
        raise exc.add_info(f"conv_backend {direction} x={tuple(x_shape)} w={tuple(w_shape)} "
                           f"y={tuple(y_shape)} {dtype} {math} {layout}") from None
