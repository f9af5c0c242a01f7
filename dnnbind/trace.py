"""Layer trace (beside autograd): see the dispatch. ``with dnnbind.trace() as t: ...`` then ``print(t)`` lists
every cuDNN/cuBLAS call and NVRTC kernel launch dnnbind made inside, with scope, op, arguments, GPU and host time.

trace: imports _lib, runtime, kernels (dnnbind.ops lazily, for names); ops import it lazily.

Zero cost outside a trace: entering replaces the bound functions of cudnn.lib and cublas.lib (instance attributes,
see _lib.cfunc.Library; ``Library._on_bind`` wraps those bound later) and ``kernels.Kernel._launch`` with
recording wrappers; exiting puts the originals back, also on an exception. NOTE: ``_launch`` is wrapped rather
than using ``kernels._launch_hooks``, which run after the launch: too late for the start event. Code below this
layer tests one list, ``from dnnbind._lib.cfunc import TRACING`` (the same list as ``trace.ACTIVE``), and imports
this module inside the test: ``if TRACING: from dnnbind import trace; trace.annotate(x=x.shape)``.

GPU time: two pooled CUDA events around each call on the stream of its handle, read after one synchronize per
device at exit (or every 4096 calls). NOTE: on an idle GPU the start event completes at once, so a call's GPU
time also holds the host work inside the call before its kernels are queued (cuDNN's can be tens of µs); CUPTI's
kernel durations (cupti-python) are the kernels alone. Host time: perf_counter around the call. One scope stack
serves all threads.
"""
# ruff: noqa: BLE001, S110  (the optional tools, CUPTI and NVTX, must never turn a failure into an exception)

from __future__ import annotations

import bisect
import json
import re
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from ._lib import cublas, cudart, cudnn
from ._lib.cfunc import TRACING, Library, intercept
from .kernels import launch as _kl
from .runtime.device import default_device, gpu
from .runtime.stream import Event, current_stream

ACTIVE = TRACING
CUPTI_NOTE = "GPU kernel names need the optional extra: pip install cupti-python"
_RESOLVE_EVERY = 4096
_SETUP = re.compile(r"^(cudnn|cublas)?(Backend)?(Get|Set|Create|Destroy|Finalize|Initialize)")  # no GPU work: no events
_CONV = {"cudnnConvolutionForward": "fwd", "cudnnConvolutionBiasActivationForward": "fwd",
         "cudnnConvolutionBackwardData": "bwd_data", "cudnnConvolutionBackwardFilter": "bwd_filter"}
_TRANS = ("N", "T", "C")
GPU_LIBRARIES = ("cudnn", "cublas", "kernel")
_CAPTURED = "calls captured into a CUDA graph have no GPU times (time the replay instead)"
_CUPTI_KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER")  # kernels, and the API calls that launched them

_scopes: list = []  # (name, marked as an op, perf_counter at push, NVTX range pushed)
_pool: dict = {}  # Device -> free Events, kept across traces
_handle_streams: dict = {}  # cuDNN/cuBLAS handle -> its dnnbind Stream
_cupti_acts: list = []  # (kernel name or None for an API call, start ns, end ns, correlation id)
_cupti_registered: list = []
_launch_original: list = []  # Kernel._launch as the outermost trace found it
_S = None  # the session the active (possibly nested) traces share


@dataclass
class Record:
    seq: int
    scope: str  # "simplecnn0/conv0/conv_forward"
    op: str  # the innermost scope naming an op ("conv_forward"), else ""
    library: str  # "cudnn", "cublas", "kernel" (NVRTC), "numpy"
    function: str  # "cudnnConvolutionForward", "add2_kernel", "conv_forward"
    details: dict = field(default_factory=dict)  # algo, workspace_bytes, m/n/k, grid/block, annotate()'s info
    gpu_us: float | None = None
    host_us: float = 0.0
    start_us: float = 0.0  # host start, µs since the outermost trace began
    gpu_start_us: float | None = None  # GPU start on that clock, anchored at the first event on the device
    kernels: list = field(default_factory=list)  # [[name, µs]] from CUPTI


class _Session:
    def __init__(self, libraries, use_cupti: bool):
        self.t0, self.libs = time.perf_counter(), list(libraries)
        self.records, self.spans, self.kernel_spans, self.pending, self.windows = [], [], [], [], []
        self.patched, self.notes, self.base = [], [], {}
        self.info, self.gpu_ok, self.cupti, self.cupti_t0, self.nvtx, self.ops = None, True, None, 0, None, set()
        try:
            from . import ops
            self.ops = set(ops.__all__)
            import nvtx
            self.nvtx = nvtx
        except Exception:
            pass
        if use_cupti:
            _cupti_start(self)


class Trace:
    """``with dnnbind.trace() as t:``, then ``print(t)``, ``t.records``, ``t.summary()``, ``t.to_json()``,
    ``t.to_chrome(path)``. A trace nested in another lists its own calls, numbered as in the outermost."""

    def __init__(self, libraries=None, cupti: bool = True):
        self.records: list[Record] = []
        self.spans: list[tuple] = []  # (name, path, start µs, end µs) of scopes
        self.kernel_spans: list[tuple] = []  # (name, start µs, µs) of GPU kernels, from CUPTI
        self.notes: list[str] = []
        self.cupti = False
        self._libraries = (cudnn.lib, cublas.lib) if libraries is None else tuple(libraries)
        self._use_cupti = cupti

    def __enter__(self):
        global _S
        if _S is None:
            session = _Session(self._libraries, self._use_cupti)
            _install(session)  # refuses while a RecordedStep records: then no session is left behind
            _S = session
        self._s, self._first = _S, (len(_S.records), len(_S.spans), len(_S.kernel_spans))
        TRACING.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        global _S
        s = self._s
        TRACING.remove(self)
        try:
            _resolve(s)
            _cupti_collect(s)
        finally:
            if not TRACING:
                _uninstall(s)
                _S = None
        now = (time.perf_counter() - s.t0) * 1e6
        still_open = [(e[0], _path(i + 1), max(0.0, (e[2] - s.t0) * 1e6), now) for i, e in enumerate(_scopes)]
        self.records, self.spans = s.records[self._first[0]:], s.spans[self._first[1]:] + still_open
        self.kernel_spans, self.notes, self.cupti = s.kernel_spans[self._first[2]:], s.notes, s.cupti is not None
        return False

    def summary(self) -> dict:
        groups: dict = {}
        for r in self.records:
            g = groups.setdefault((r.op, r.library, r.function), [0, None, 0.0])
            g[0], g[2] = g[0] + 1, g[2] + r.host_us
            if r.gpu_us is not None:
                g[1] = (g[1] or 0.0) + r.gpu_us
        by_call = [{"op": op, "library": lib, "function": fn, "calls": c, "gpu_us": gu, "host_us": hu} for
                   (op, lib, fn), (c, gu, hu) in sorted(groups.items(), key=lambda kv: (-(kv[1][1] or 0), -kv[1][2]))]
        timed = [r.gpu_us for r in self.records if r.gpu_us is not None]
        gpu_calls = any(r.library in GPU_LIBRARIES for r in self.records)
        notes = list(dict.fromkeys(self.notes + ([CUPTI_NOTE] if gpu_calls and not self.cupti else [])))
        return {"calls": len(self.records), "gpu_us": sum(timed) if timed else None,
                "host_us": sum(r.host_us for r in self.records), "by_call": by_call, "notes": notes}

    def table(self) -> str:
        rows = [(str(r.seq), _clip(r.scope or "-", 40, left=True), r.op or "-", r.function,
                 _clip(_fmt_details(r.details), 60), _us(r.gpu_us), _us(r.host_us)) for r in self.records]
        kernels = {i: [f"      -> {_clip(k, 80)}  {us:.2f} µs" for k, us in r.kernels]
                   for i, r in enumerate(self.records)}
        lines = _columns(("seq", "scope", "op", "function", "details", "GPU µs", "host µs"), rows, (0, 5, 6), kernels)
        s = self.summary()
        lines += ["", "by op and library call:"] + _columns(
            ("op", "function", "calls", "GPU µs", "host µs"),
            [(g["op"] or "-", g["function"], str(g["calls"]), _us(g["gpu_us"]), _us(g["host_us"]))
             for g in s["by_call"]], (2, 3, 4))
        lines.append(f"total: {s['calls']} calls, GPU {_us(s['gpu_us'])} µs, host {s['host_us']:.2f} µs")
        return "\n".join(lines + [f"note: {n}" for n in s["notes"]])

    __str__ = table

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps({"records": [asdict(r) for r in self.records], "scopes": self.spans,
                           "kernels": self.kernel_spans, "summary": self.summary()}, indent=1, default=str)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_chrome(self, path: str) -> str:
        """Trace-event JSON for ui.perfetto.dev: scopes with the host calls nested in them on one track, the
        calls' GPU times (CUDA events) on a second, CUPTI's kernels (when present) on a third."""
        ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "dnnbind"}}]
        for tid, name in ((1, "host: scopes and calls"), (2, "GPU: calls (CUDA events)"), (3, "GPU: kernels")):
            ev.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev += [_x(name, "scope", 1, t0, t1 - t0, {"path": p}) for name, p, t0, t1 in self.spans]
        for r in self.records:
            args = {"seq": r.seq, "scope": r.scope, "op": r.op, **{k: str(v) for k, v in r.details.items()}}
            ev.append(_x(r.function, r.library, 1, r.start_us, r.host_us, args))
            if r.gpu_us is not None and r.gpu_start_us is not None:
                ev.append(_x(r.function, r.library, 2, r.gpu_start_us, r.gpu_us, {"seq": r.seq, "op": r.op}))
        ev += [_x(name, "kernel", 3, t0, dur, {}) for name, t0, dur in self.kernel_spans]
        with open(path, "w") as f:
            json.dump({"traceEvents": ev, "displayTimeUnit": "ns"}, f)
        return path


# --- what ops, nd and gluon call -------------------------------------------------------------------------

def push(name: str, op: bool = False) -> None:
    """Enter a scope (a Block's name, an op's name); ``op=True`` marks an op name that dnnbind.ops lacks."""
    s = _S
    nvtx_pushed = s is not None and s.nvtx is not None and _quiet(s.nvtx.push_range, name)
    _scopes.append((name, op, time.perf_counter(), nvtx_pushed))


def pop() -> None:
    s, scope_path = _S, _path(len(_scopes))
    name, _, t0, nvtx_pushed = _scopes.pop()
    if s is not None:
        if nvtx_pushed and s.nvtx is not None:
            _quiet(s.nvtx.pop_range)
        s.spans.append((name, scope_path, max(0.0, (t0 - s.t0) * 1e6), (time.perf_counter() - s.t0) * 1e6))


@contextmanager
def scope(name: str, op: bool = False):
    push(name, op)
    try:
        yield
    finally:
        pop()


def current_path() -> tuple:
    """The scope names now open (e.g. ("simplecnn", "conv1")); autograd keeps it to replay in backward."""
    return tuple(name for name, op, _, _ in _scopes if not op)


@contextmanager
def scopes(path: tuple, suffix: str = "backward"):
    """Re-enter a recorded scope path (a backward runs outside the Blocks whose forward taped it)."""
    for name in path:
        push(name)
    push(suffix)
    try:
        yield
    finally:
        for _ in range(len(path) + 1):
            pop()


def annotate(**info) -> None:
    """Attach ``info`` (shapes, dtypes, math mode...) to the next recorded call that does GPU work."""
    s = _S
    if s is not None:
        s.info = {**s.info, **info} if s.info else info


def record_numpy(op_name: str, seconds: float) -> None:
    """Record an op the numpy backend ran in ``seconds`` (library "numpy")."""
    if _S is not None:
        t1 = time.perf_counter()
        _emit("numpy", op_name, {}, t1 - seconds, t1, None, None, True, op_name)


def timed_numpy(op_name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, recorded as the numpy call of ``op_name``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    record_numpy(op_name, time.perf_counter() - t0)
    return out


# --- recording -------------------------------------------------------------------------------------------

def _install(s: _Session) -> None:
    s.undo_libraries = intercept(s.libs, _wrap)
    _launch_original[:] = [_kl.Kernel.__dict__["_launch"]]
    s.patched.append((_kl.Kernel, "_launch", _launch_original[0]))
    _kl.Kernel._launch = _traced_launch
    _handle_streams.clear()


def _uninstall(s: _Session) -> None:
    s.undo_libraries()
    for owner, name, original in reversed(s.patched):
        setattr(owner, name, original)
    for dev, (ev, _) in s.base.items():
        _pool.setdefault(dev, []).append(ev)
    for kind in _CUPTI_KINDS if s.cupti is not None else ():
        _quiet(s.cupti.activity_disable, getattr(s.cupti.ActivityKind, kind))


def _quiet(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except Exception:
        return False


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
        rec = _emit(library, function, details, t0, t1, pair, (c0, c1) if c1 else None, work, None)
        if failed:
            rec.details["failed"] = True


def _emit(library, function, details, t0, t1, pair, window, work, op):
    s = _S
    if work and s.info:
        details, s.info = {**details, **s.info}, None
    op = details.pop("op", None) or op or next((e[0] for e in reversed(_scopes) if e[1] or e[0] in s.ops), "")
    rec = Record(len(s.records), _path(len(_scopes)), op, library, function, details, None, (t1 - t0) * 1e6,
                 (t0 - s.t0) * 1e6)
    s.records.append(rec)
    if window is not None:
        s.windows.append((*window, rec))
    if pair is not None:
        s.pending.append((rec, *pair))
        if len(s.pending) >= _RESOLVE_EVERY:
            _resolve(s)
    return rec


def _path(depth: int) -> str:
    return "/".join(e[0] for e in _scopes[:depth])


def _lib_where(handle):
    """(device, stream handle) a cuDNN/cuBLAS handle runs on; dnnbind's current stream for a foreign one."""
    h = getattr(handle, "value", handle)
    st = _handle_streams.get(h)
    if st is None:
        from .runtime import handles
        for table in (handles._cudnn, handles._cublas):
            _handle_streams.update({obj.handle: stream for stream, obj in list(table.items())})
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


def _resolve(s: _Session) -> None:
    """Wait once per device, then read every pending event pair and give the events back to the pool."""
    try:
        for dev in {p[1] for p in s.pending}:
            dev.activate()
            cudart.call("cudaDeviceSynchronize")
        for rec, dev, start, end in s.pending:
            base, base_us = s.base[dev]
            rec.gpu_us = end.elapsed_ms(start) * 1e3
            rec.gpu_start_us = base_us + start.elapsed_ms(base) * 1e3
            _pool.setdefault(dev, []).extend((start, end))
    except Exception as exc:
        s.notes.append(f"GPU times incomplete: {exc}")
    s.pending.clear()


def _summarize(name: str, args) -> dict:
    """Cheap facts read from the call's own arguments."""
    try:
        if name in _CONV:
            from .ops.algos import algo_name
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


# --- CUPTI (optional extra: cupti-python) ----------------------------------------------------------------

def _cupti_start(s: _Session) -> None:
    try:
        from cupti import cupti
    except Exception:
        return  # summary() adds CUPTI_NOTE when there were GPU calls
    try:
        if not _cupti_registered:
            cupti.activity_register_callbacks(lambda: (8 << 20, 0), _cupti_done)
            _cupti_registered.append(True)
        for kind in _CUPTI_KINDS:
            cupti.activity_enable(getattr(cupti.ActivityKind, kind))
        s.cupti, s.cupti_t0, s.t0 = cupti, cupti.get_timestamp(), time.perf_counter()
    except Exception as exc:
        s.notes.append(f"CUPTI failed ({exc}); {CUPTI_NOTE}")


def _cupti_done(activities) -> None:
    _cupti_acts.extend((getattr(a, "name", None), a.start, a.end, a.correlation_id) for a in activities)


def _cupti_collect(s: _Session) -> None:
    """Give each kernel to the traced call whose host window holds the API call that launched it."""
    if s.cupti is None:
        return
    try:
        for dev in s.base:  # kernels still running would be missing from the flush
            dev.activate()
            cudart.call("cudaDeviceSynchronize")
        s.cupti.activity_flush_all(1)
        acts = list(_cupti_acts)
        _cupti_acts.clear()
        launched = {corr: start for name, start, _, corr in acts if name is None}
        windows = sorted(s.windows, key=lambda w: w[0])
        starts = [w[0] for w in windows]
        for name, start, end, corr in acts:
            if name is None:
                continue
            s.kernel_spans.append((name, (start - s.cupti_t0) / 1e3, (end - start) / 1e3))
            at = launched.get(corr)
            i = j = bisect.bisect_right(starts, at) - 1 if at is not None else -1
            while j >= 0 and i - j < 8 and windows[j][1] < at:  # step out of calls nested in the launching one
                j -= 1
            if j >= 0 and windows[j][1] >= at:
                windows[j][2].kernels.append([name, (end - start) / 1e3])
        s.windows.clear()
    except Exception as exc:
        s.notes.append(f"CUPTI failed ({exc}); kernel names are incomplete")


# --- formatting ------------------------------------------------------------------------------------------

def _x(name, cat, tid, ts, dur, args) -> dict:
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "cat": cat, "ts": round(ts, 3),
            "dur": round(max(dur, 0.0), 3), "args": args}


def _us(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fmt_details(d: dict) -> str:
    out = []
    for k, v in d.items():
        if k.endswith("_bytes"):
            k, v = k[:-6], (f"{v / 2**20:.1f}MiB" if v >= 2**20 else f"{v / 2**10:.1f}KiB" if v >= 2**10 else f"{v}B")
        elif isinstance(v, (tuple, list)):
            v = "(" + ",".join(str(x) for x in v) + ")"
        out.append(f"{k}={v}")
    return " ".join(out)


def _clip(text: str, width: int, left: bool = False) -> str:
    if len(text) <= width:
        return text
    return "..." + text[3 - width:] if left else text[:width - 3] + "..."


def _columns(head, rows, right, extra=None) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(head).rstrip()]
    for i, row in enumerate(rows):
        out += [line(row).rstrip(), *(extra or {}).get(i, ())]
    return out


class _TraceModule(types.ModuleType):
    """``dnnbind.trace()`` starts a trace and ``dnnbind.trace.scope(...)`` etc. stay module functions: one name,
    and no function named ``trace`` shadowing the module it lives in."""

    def __call__(self, libraries=None, cupti: bool = True) -> Trace:
        return Trace(libraries, cupti)


sys.modules[__name__].__class__ = _TraceModule
