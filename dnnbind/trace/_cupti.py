"""Layer trace: GPU kernel names and durations from CUPTI (the optional extra ``dnnbind[trace]``, the package
cupti-python). Imports nothing of dnnbind but _lib.cudart and this package's report (for CUPTI_NOTE) and
_demangle.

Each kernel CUPTI reports, its name demangled, goes to the traced call whose host window holds the API call that
launched it; that call's ``gpu_us`` becomes the sum of its kernels (Record's docstring says why and what a call
without kernels gets). The optional tools must never turn a failure into an exception: a failure becomes a note
in the trace, and the GPU times fall back to the CUDA events'.
"""
# ruff: noqa: BLE001  (see above: a CUPTI failure is a note, never an exception)

from __future__ import annotations

import bisect
import time

from .._lib import cudart
from ._demangle import demangle
from .report import CUPTI_NOTE

KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER")  # kernels, and the API calls that launched them
_acts: list = []  # (kernel name or None for an API call, start ns, end ns, correlation id)
_registered: list = []


def quiet(fn, *args) -> bool:
    """``fn(*args)``; True unless it raised."""
    try:
        fn(*args)
        return True
    except Exception:
        return False


def start(s) -> None:
    """Enable CUPTI's activity records for session ``s`` (sets ``s.cupti``); a note instead where it fails."""
    try:
        from cupti import cupti  # the cupti-python package (absolute import: not this module)
    except Exception:
        return  # summary() adds CUPTI_NOTE when there were GPU calls
    try:
        if not _registered:
            cupti.activity_register_callbacks(lambda: (8 << 20, 0), _done)
            _registered.append(True)
        for kind in KINDS:
            cupti.activity_enable(getattr(cupti.ActivityKind, kind))
        s.cupti, s.cupti_t0, s.t0 = cupti, cupti.get_timestamp(), time.perf_counter()
    except Exception as exc:
        s.notes.append(f"CUPTI failed ({exc}); {CUPTI_NOTE}")


def stop(s) -> None:
    for kind in KINDS if s.cupti is not None else ():
        quiet(s.cupti.activity_disable, getattr(s.cupti.ActivityKind, kind))


def _done(activities) -> None:
    _acts.extend((getattr(a, "name", None), a.start, a.end, a.correlation_id) for a in activities)


def collect(s) -> None:
    """Give each kernel to the traced call whose host window holds the API call that launched it, then set those
    calls' GPU times from their kernels."""
    if s.cupti is None:
        return
    try:
        for dev in s.base:  # kernels still running would be missing from the flush
            dev.activate()
            cudart.call("cudaDeviceSynchronize")
        s.cupti.activity_flush_all(1)
        acts = list(_acts)
        _acts.clear()
        launched = {corr: start for name, start, _, corr in acts if name is None}
        windows = sorted(s.windows, key=lambda w: w[0])
        starts = [w[0] for w in windows]
        for name, start_ns, end, corr in acts:
            if name is None:
                continue
            name = demangle(name)
            s.kernel_spans.append((name, (start_ns - s.cupti_t0) / 1e3, (end - start_ns) / 1e3))
            at = launched.get(corr)
            i = j = bisect.bisect_right(starts, at) - 1 if at is not None else -1
            while j >= 0 and i - j < 8 and windows[j][1] < at:  # step out of calls nested in the launching one
                j -= 1
            if j >= 0 and windows[j][1] >= at:
                windows[j][2].kernels.append([name, (end - start_ns) / 1e3])
        if s.kernel_times:
            for _, _, rec in windows:
                kernel_time(rec)
    except Exception as exc:
        s.notes.append(f"CUPTI failed ({exc}); kernel names are incomplete and GPU µs are CUDA-event times")
        s.kernel_times = False  # one meaning for the whole column: every record back to its event time
        for rec in s.records:
            rec.gpu_us = rec.event_us
    finally:
        s.windows.clear()


def kernel_time(rec) -> None:
    """``rec.gpu_us`` from its kernels: their sum; with none, 0.0 for a call timed with CUDA events (GPU work was
    expected and none ran), else left as it is (None: setup, numpy, captured calls)."""
    if rec.kernels:
        rec.gpu_us = sum(us for _, us in rec.kernels)
    elif rec.event_us is not None:
        rec.gpu_us = 0.0
