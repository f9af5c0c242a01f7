"""Layer trace: GPU kernel names and durations from CUPTI (the optional extra cupti-python). Imports nothing of
dnnbind but _lib.cudart and this package's report (for CUPTI_NOTE).

Each kernel CUPTI reports goes to the traced call whose host window holds the API call that launched it. The
optional tools must never turn a failure into an exception: a failure becomes a note in the trace.
"""
# ruff: noqa: BLE001  (see above: a CUPTI failure is a note, never an exception)

from __future__ import annotations

import bisect
import time

from .._lib import cudart
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
    """Give each kernel to the traced call whose host window holds the API call that launched it."""
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
            s.kernel_spans.append((name, (start_ns - s.cupti_t0) / 1e3, (end - start_ns) / 1e3))
            at = launched.get(corr)
            i = j = bisect.bisect_right(starts, at) - 1 if at is not None else -1
            while j >= 0 and i - j < 8 and windows[j][1] < at:  # step out of calls nested in the launching one
                j -= 1
            if j >= 0 and windows[j][1] >= at:
                windows[j][2].kernels.append([name, (end - start_ns) / 1e3])
        s.windows.clear()
    except Exception as exc:
        s.notes.append(f"CUPTI failed ({exc}); kernel names are incomplete")
