"""Layer trace: what a trace reports. ``Record`` is one library call, numpy op or kernel launch; ``Report`` holds
a trace's records, scope spans and kernel spans and renders them (``table()``/``str``, ``summary()``,
``to_json()``, ``to_chrome()``). Imports nothing of dnnbind beyond this package's _format: a report can be built
and rendered by hand (the tests do).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ._format import chrome_event, clip, columns, fmt_details, short_kernel, us

CUPTI_NOTE = ('kernel names and kernel times (no launch gaps) need the optional extra: pip install "dnnbind[trace]"'
              " (cupti-python)")
GPU_LIBRARIES = ("cudnn", "cublas", "kernel")
# What the "GPU µs" column holds, by Report.gpu_time; the table and summary()["notes"] say it when GPU calls exist.
GPU_TIME_NOTES = {
    "kernels": "GPU µs = sum of the call's kernel durations (CUPTI); CUDA-event times are in the records' event_us",
    "events": "GPU µs = CUDA-event time around each call (launch gaps included)",
}


@dataclass
class Record:
    """One call. ``gpu_us``, the "GPU µs" column, depends on the trace's ``gpu_time`` (Report.gpu_time):

    - ``"kernels"`` (CUPTI was active): the sum of ``kernels``' durations, the time the GPU spent in this call's
      own kernels, without the gaps between them. A call with no kernel has 0.0 where it was timed with CUDA
      events (GPU work was expected and none ran: cuBLAS on n=0), else None (descriptor setup, numpy calls,
      calls inside a CUDA-graph capture), as without CUPTI.
    - ``"events"`` (no CUPTI): CUDA-event time around the call, the same as ``event_us``. On an idle GPU it also
      holds the launch gaps and the host work inside the call before its kernels are queued.

    ``event_us`` is the CUDA-event time in both cases (None without events: numpy calls, setup calls, captures).
    """

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
    kernels: list = field(default_factory=list)  # [[demangled name, µs]] from CUPTI
    event_us: float | None = None  # CUDA-event time around the call (see the class docstring)


class Report:
    """The records of a trace and their renderings (``dnnbind.trace.Trace`` adds recording them)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.spans: list[tuple] = []  # (name, path, start µs, end µs) of scopes
        self.kernel_spans: list[tuple] = []  # (name, start µs, µs) of GPU kernels, from CUPTI
        self.notes: list[str] = []
        self.cupti = False  # CUPTI was active (kernel names); see gpu_time for what gpu_us holds
        self.gpu_time = "events"  # "kernels": gpu_us sums each call's CUPTI kernels; "events": CUDA-event time

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
        extra = [GPU_TIME_NOTES[self.gpu_time]] if gpu_calls else []
        if gpu_calls and not self.cupti:
            extra.append(CUPTI_NOTE)
        notes = list(dict.fromkeys(extra + self.notes))
        return {"calls": len(self.records), "gpu_us": sum(timed) if timed else None,
                "host_us": sum(r.host_us for r in self.records), "gpu_time": self.gpu_time, "by_call": by_call,
                "notes": notes}

    def table(self) -> str:
        rows = [(str(r.seq), clip(r.scope or "-", 40, left=True), r.op or "-", r.function,
                 clip(fmt_details(r.details), 60), us(r.gpu_us), us(r.host_us)) for r in self.records]
        kernels = {i: [f"      -> {short_kernel(k, 100)}  {t:.2f} µs" for k, t in r.kernels]
                   for i, r in enumerate(self.records)}
        lines = columns(("seq", "scope", "op", "function", "details", "GPU µs", "host µs"), rows, (0, 5, 6), kernels)
        s = self.summary()
        lines += ["", "by op and library call:"] + columns(
            ("op", "function", "calls", "GPU µs", "host µs"),
            [(g["op"] or "-", g["function"], str(g["calls"]), us(g["gpu_us"]), us(g["host_us"]))
             for g in s["by_call"]], (2, 3, 4))
        lines.append(f"total: {s['calls']} calls, GPU {us(s['gpu_us'])} µs, host {s['host_us']:.2f} µs")
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
        calls' GPU times (CUDA events) on a second, CUPTI's kernels (when present, demangled) on a third."""
        ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "dnnbind"}}]
        for tid, name in ((1, "host: scopes and calls"), (2, "GPU: calls (CUDA events)"), (3, "GPU: kernels")):
            ev.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev += [chrome_event(name, "scope", 1, t0, t1 - t0, {"path": p}) for name, p, t0, t1 in self.spans]
        for r in self.records:
            args = {"seq": r.seq, "scope": r.scope, "op": r.op, **{k: str(v) for k, v in r.details.items()}}
            ev.append(chrome_event(r.function, r.library, 1, r.start_us, r.host_us, args))
            # this track shows the CUDA events whatever gpu_us holds (a report built by hand may give gpu_us only)
            event_us = r.event_us if r.event_us is not None or self.gpu_time == "kernels" else r.gpu_us
            if event_us is not None and r.gpu_start_us is not None:
                ev.append(chrome_event(r.function, r.library, 2, r.gpu_start_us, event_us,
                                       {"seq": r.seq, "op": r.op, "gpu_us": r.gpu_us}))
        ev += [chrome_event(name, "kernel", 3, t0, dur, {}) for name, t0, dur in self.kernel_spans]
        with open(path, "w") as f:
            json.dump({"traceEvents": ev, "displayTimeUnit": "ns"}, f)
        return path
