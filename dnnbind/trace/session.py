"""Layer trace: the session the active (possibly nested) traces share: what entering the outermost
``dnnbind.trace()`` installs and leaving it removes, and the recording of each call. Imports _lib, runtime,
kernels and ops (op and algorithm names); nothing below imports this package.

Zero cost outside a trace: entering replaces the bound functions of cudnn.lib and cublas.lib (``cfunc.intercept``:
instance attributes, and ``Library._on_bind`` wraps those bound later) and ``kernels.Kernel._launch`` with
recording wrappers; leaving puts the originals back, also on an exception. NOTE: ``_launch`` itself is wrapped
because the start event must be recorded before the launch. The scope functions of dnnbind._lib.hooks, which
ops, autograd and gluon call, reach the session through ``hooks.set_session``; the scope stack is per thread.

GPU time: two pooled CUDA events around each call on the stream of its handle, read after one synchronize per
device at exit (or every 4096 calls) into ``event_us``. NOTE: on an idle GPU the start event completes at once, so
a call's event time also holds the host work inside the call before its kernels are queued (cuDNN's can be tens
of µs). So with CUPTI (cupti-python, see _cupti) a call's ``gpu_us`` is the sum of its kernels' durations, and the
event time only without it (Record's docstring). Host time: perf_counter around the call.
"""
# ruff: noqa: BLE001, S110  (the optional tools, CUPTI and NVTX, must never turn a failure into an exception)

from __future__ import annotations

import re
import time

from .. import ops
from .._lib import cudart, hooks
from .._lib.cfunc import Library, intercept
from .._lib.hooks import TRACING
from ..kernels import launch as _kl
from ..ops.algos import algo_name
from ..runtime import handles
from ..runtime.device import default_device, gpu
from ..runtime.stream import Event, current_stream
from . import _cupti
from ._cupti import quiet
from .report import Record

_RESOLVE_EVERY = 4096
_SETUP = re.compile(r"^(cudnn|cublas)?(Backend)?(Get|Set|Create|Destroy|Finalize|Initialize)")  # no GPU work: no events
_CONV = {"cudnnConvolutionForward": "fwd", "cudnnConvolutionBiasActivationForward": "fwd",
         "cudnnConvolutionBackwardData": "bwd_data", "cudnnConvolutionBackwardFilter": "bwd_filter"}
_TRANS = ("N", "T", "C")
_CAPTURED = "calls captured into a CUDA graph have no GPU times (time the replay instead)"

_pool: dict = {}  # Device -> free Events, kept across traces
_handle_streams: dict = {}  # cuDNN/cuBLAS handle -> its dnnbind Stream
_launch_original: list = []  # Kernel._launch as the outermost trace found it
_S = None  # the active session


class Session:
    """What the active traces share: every record, span and note since the outermost one began. Its ``on_push``,
    ``on_pop``, ``annotate`` and ``record_numpy`` are the callbacks of dnnbind._lib.hooks."""

    def __init__(self, libraries, use_cupti: bool):
        self.t0, self.libs = time.perf_counter(), list(libraries)
        self.records, self.spans, self.kernel_spans, self.pending, self.windows = [], [], [], [], []
        self.patched, self.notes, self.base = [], [], {}
        self.info, self.gpu_ok, self.cupti, self.cupti_t0, self.nvtx = None, True, None, 0, None
        self.kernel_times = True  # with CUPTI, gpu_us sums each call's kernels; off for good once CUPTI fails
        self.ops = set(ops.__all__)
        self.undo_libraries = None
        try:
            import nvtx
            self.nvtx = nvtx
        except Exception:
            pass
        if use_cupti:
            _cupti.start(self)

    def on_push(self, name: str) -> bool:
        return self.nvtx is not None and quiet(self.nvtx.push_range, name)

    def on_pop(self, name: str, path: str, t0: float, nvtx_pushed: bool) -> None:
        if nvtx_pushed and self.nvtx is not None:
            quiet(self.nvtx.pop_range)
        self.spans.append((name, path, max(0.0, (t0 - self.t0) * 1e6), (time.perf_counter() - self.t0) * 1e6))

    def annotate(self, info: dict) -> None:
        self.info = {**self.info, **info} if self.info else info

    def record_numpy(self, op_name: str, seconds: float) -> None:
        t1 = time.perf_counter()
        _emit(self, "numpy", op_name, {}, t1 - seconds, t1, None, None, True, op_name)


def enter(libraries, use_cupti: bool) -> Session:
    """The session for a trace being entered: the active one, else a new one, installed."""
    global _S
    if _S is None:
        s = Session(libraries, use_cupti)
        try:
            _install(s)  # refuses while a RecordedStep records: then no session is left behind
        except BaseException:
            _cupti.stop(s)
            raise
        _S = s
        hooks.set_session(s)
    return _S


def leave(s: Session) -> None:
    """After a trace left TRACING: read the pending GPU times and kernel names; the last one out uninstalls."""
    global _S
    try:
        _resolve(s)
        _cupti.collect(s)
    finally:
        if not TRACING:
            _uninstall(s)
            _S = None
            hooks.set_session(None)


def open_spans(s: Session) -> list:
    """Spans of this thread's scopes still open, ending now."""
    now = (time.perf_counter() - s.t0) * 1e6
    return [(e[0], hooks.path(i + 1), max(0.0, (e[2] - s.t0) * 1e6), now) for i, e in enumerate(hooks.stack())]


# --- installing --------------------------------------------------------------------------------------------

def _install(s: Session) -> None:
    s.undo_libraries = intercept(s.libs, _wrap)
    _launch_original[:] = [_kl.Kernel.__dict__["_launch"]]
    s.patched.append((_kl.Kernel, "_launch", _launch_original[0]))
    _kl.Kernel._launch = _traced_launch
    _handle_streams.clear()


def _uninstall(s: Session) -> None:
    s.undo_libraries()
    for owner, name, original in reversed(s.patched):
        setattr(owner, name, original)
    for dev, (ev, _) in s.base.items():
        _pool.setdefault(dev, []).append(ev)
    _cupti.stop(s)


def _wrap(lib: Library, c_name: str, fn):
    libname, work = lib.name, _SETUP.match(c_name) is None

    def traced(*args):
        if _S is None:
            return fn(*args)
        return _call(libname, c_name, fn, args, _lib_where if work else None, args[0] if args else None,
                     _summarize(c_name, args) if work else {}, work)

    traced.__wrapped__, traced.__name__ = fn, c_name
    return traced


def _traced_launch(kernel, device, g, b, args, stream, shared_mem):
    original = _launch_original[0]
    if _S is None:
        return original(kernel, device, g, b, args, stream, shared_mem)
    details = {"grid": g, "block": b, **({"shared_mem": shared_mem} if shared_mem else {})}
    return _call("kernel", kernel.name, lambda: original(kernel, device, g, b, args, stream, shared_mem), (),
                 _kernel_where, (device, stream), details, True)


def replayed_launch(name: str, device: int, stream_handle: int, grid, block, launch) -> None:
    """A recorded kernel launch re-issued inside a trace (graph.CallRecording): ``launch()`` recorded as the
    kernel ``name``, as Kernel._launch records a live one."""
    if _S is None:
        return launch()
    return _call("kernel", name, launch, (), _kernel_where, (device, stream_handle), {"grid": grid, "block": block},
                 True)


# --- recording ---------------------------------------------------------------------------------------------

def _call(library, function, fn, args, where, where_arg, details, work):
    s = _S
    pair = _gpu_begin(s, where, where_arg) if where is not None and s.gpu_ok else None
    c0 = s.cupti.get_timestamp() if s.cupti is not None else 0
    t0 = time.perf_counter()
    failed = True
    try:
        out = fn(*args)
        failed = False
        return out
    finally:
        t1 = time.perf_counter()
        pair = _gpu_end(s, pair) if pair is not None else None
        c1 = s.cupti.get_timestamp() if s.cupti is not None else 0
        rec = _emit(s, library, function, details, t0, t1, pair, (c0, c1) if c1 else None, work, None)
        if failed:
            rec.details["failed"] = True


def _emit(s, library, function, details, t0, t1, pair, window, work, op):
    if work and s.info:
        details, s.info = {**details, **s.info}, None
    scopes = hooks.stack()
    op = details.pop("op", None) or op or next((e[0] for e in reversed(scopes) if e[1] or e[0] in s.ops), "")
    rec = Record(len(s.records), hooks.path(), op, library, function, details, None, (t1 - t0) * 1e6,
                 (t0 - s.t0) * 1e6)
    s.records.append(rec)
    if window is not None:
        s.windows.append((*window, rec))
    if pair is not None:
        s.pending.append((rec, *pair))
        if len(s.pending) >= _RESOLVE_EVERY:
            _resolve(s)
    return rec


def _summarize(name: str, args) -> dict:
    """Cheap facts read from the call's own arguments."""
    try:
        if name in _CONV:
            return {"algo": algo_name(_CONV[name], int(args[7])), "workspace_bytes": int(args[9] or 0)}
        if name.endswith("gemm_v2"):
            return {"transa": _TRANS[args[1]], "transb": _TRANS[args[2]], "m": args[3], "n": args[4], "k": args[5]}
        if name.endswith("gemv_v2"):
            return {"trans": _TRANS[args[1]], "m": args[2], "n": args[3]}
        if name.endswith(("axpy_v2", "scal_v2")):
            return {"n": args[1]}
    except Exception:
        pass
    return {}


# --- GPU times ---------------------------------------------------------------------------------------------

def _lib_where(handle):
    """(device, stream handle) a cuDNN/cuBLAS handle runs on; dnnbind's current stream for a foreign one."""
    h = getattr(handle, "value", handle)
    st = _handle_streams.get(h)
    if st is None:
        _handle_streams.update(handles.handle_streams())
        st = _handle_streams.get(h)
    if st is None:
        dev = default_device()
        if dev.kind != "gpu":
            return None
        st = current_stream(dev)
    return st.device, st.handle


def _kernel_where(arg):
    device, stream = arg
    return gpu(device), _kl.stream_handle(stream, device)


def _record(ev: Event, stream_handle: int) -> Event:
    ev.device.activate()  # the traced call's stream is on the event's device
    cudart.call("cudaEventRecord", ev._obj, stream_handle)
    return ev


def _gpu_begin(s, where, arg):
    """(device, stream, recorded start event, end event) or None; both events are taken before the call so that
    creating one never lands inside the timed interval."""
    try:
        w = where(arg)
        if w is None:
            return None
        dev, h = w
        if int(cudart.call("cudaStreamIsCapturing", h)):  # events in a capture would become graph nodes
            if _CAPTURED not in s.notes:
                s.notes.append(_CAPTURED)
            return None
        free = _pool.setdefault(dev, [])
        while len(free) < 3:
            free.append(Event(dev))
        if dev not in s.base:
            s.base[dev] = (_record(free.pop(), h), (time.perf_counter() - s.t0) * 1e6)
        return dev, h, _record(free.pop(), h), free.pop()
    except Exception as exc:  # no GPU or no driver: host times only
        s.gpu_ok = False
        s.notes.append(f"no GPU times: {exc}")
        return None


def _gpu_end(s, pair):
    dev, h, start, end = pair
    try:
        return dev, start, _record(end, h)
    except Exception as exc:
        s.gpu_ok = False
        s.notes.append(f"no GPU times: {exc}")
        return None


def _resolve(s: Session) -> None:
    """Wait once per device, then read every pending event pair and give the events back to the pool."""
    try:
        for dev in {p[1] for p in s.pending}:
            dev.activate()
            cudart.call("cudaDeviceSynchronize")
        for rec, dev, start, end in s.pending:
            base, base_us = s.base[dev]
            rec.gpu_us = rec.event_us = end.elapsed_ms(start) * 1e3  # gpu_us: _cupti.collect may replace it
            rec.gpu_start_us = base_us + start.elapsed_ms(base) * 1e3
            _pool.setdefault(dev, []).extend((start, end))
    except Exception as exc:
        s.notes.append(f"GPU times incomplete: {exc}")
    s.pending.clear()
