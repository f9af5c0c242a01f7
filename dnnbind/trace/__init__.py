"""Layer trace (beside autograd): see the dispatch. ``with dnnbind.trace() as t: ...`` then ``print(t)`` lists
every cuDNN/cuBLAS call and NVRTC kernel launch dnnbind made inside, with scope, op, arguments, GPU and host time.

trace: imports _lib, runtime, kernels and ops. Nothing below imports it: ops, autograd and gluon name their calls
through dnnbind._lib.hooks (``if TRACING: hooks.annotate(x=x.shape)``), whose scope functions this module
re-exports (``dnnbind.trace.scope("net")``) and whose ``TRACING`` list is ``ACTIVE`` here.

The package: ``report`` (Record, and Report: the table, summary, JSON and Chrome exports), ``session`` (entering
and leaving: wrapping the library functions and kernel launches, GPU times from pooled CUDA events), ``_cupti``
(kernel names and kernel times, with the optional extra ``dnnbind[trace]``), ``_demangle`` (C++ kernel names made
readable by libstdc++) and ``_format`` (text helpers). ``dnnbind.trace`` itself is callable (see the end).
"""

from __future__ import annotations

import sys
import types

from .._lib import cublas, cudnn
from .._lib.hooks import TRACING, annotate, current_path, pop, push, record_numpy, scope, scopes, timed_numpy
from . import session as _session
from ._demangle import demangle
from .report import CUPTI_NOTE, GPU_LIBRARIES, GPU_TIME_NOTES, Record, Report

__all__ = ["ACTIVE", "CUPTI_NOTE", "GPU_LIBRARIES", "GPU_TIME_NOTES", "Record", "Report", "Trace", "annotate",
           "current_path", "demangle", "pop", "push", "record_numpy", "scope", "scopes", "timed_numpy"]

ACTIVE = TRACING


class Trace(Report):
    """``with dnnbind.trace() as t:``, then ``print(t)``, ``t.records``, ``t.summary()``, ``t.to_json()``,
    ``t.to_chrome(path)``. A trace nested in another lists its own calls, numbered as in the outermost.
    ``cupti=False`` leaves CUPTI off even where cupti-python is installed: GPU times are then CUDA-event times."""

    def __init__(self, libraries=None, cupti: bool = True):
        super().__init__()
        self._libraries = (cudnn.lib, cublas.lib) if libraries is None else tuple(libraries)
        self._use_cupti = cupti

    def __enter__(self):
        s = _session.enter(self._libraries, self._use_cupti)
        self._s, self._first = s, (len(s.records), len(s.spans), len(s.kernel_spans))
        TRACING.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        s = self._s
        TRACING.remove(self)
        _session.leave(s)
        self.records, self.spans = s.records[self._first[0]:], s.spans[self._first[1]:] + _session.open_spans(s)
        self.kernel_spans, self.notes, self.cupti = s.kernel_spans[self._first[2]:], s.notes, s.cupti is not None
        self.gpu_time = "kernels" if s.cupti is not None and s.kernel_times else "events"
        return False


class _TraceModule(types.ModuleType):
    """``dnnbind.trace()`` starts a trace and ``dnnbind.trace.scope(...)`` etc. stay module functions: one name,
    and no function named ``trace`` shadowing the package it lives in."""

    def __call__(self, libraries=None, cupti: bool = True) -> Trace:
        return Trace(libraries, cupti)


sys.modules[__name__].__class__ = _TraceModule
