"""Top layer (beside graph and hybrid): record the library calls one run of a function makes, replay them.
Imports _lib, runtime, kernels.launch and trace.

``CallRecording`` is the recorder graph.RecordedStep (a whole training step) and hybrid.py (a Block's forward and
its backward) share: every cuDNN/cuBLAS call with its arguments (intercepted), every kernel launch with its packed
parameters and every device copy or memset (through _lib.hooks.RECORDING), each with the scope path (Blocks, ops)
it ran in; the memory they point at held by a runtime.memory.Hold; replayed call by call from the host, or (on
request) as one CUDA graph captured from a replay.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import re

from ._lib import cublas, cudart, cudnn, hooks
from ._lib.cfunc import Library, intercept
from ._lib.hooks import RECORDING, TRACING
from .kernels.driver import driver_call
from .runtime.memory import D2D, Hold
from .trace import session as _traced

__all__ = ["CallRecording", "CaptureError"]

# cudaStreamCaptureMode: thread-local, so another thread's unrelated CUDA calls don't invalidate the capture
CAPTURE_MODE_THREAD_LOCAL = 1


class CaptureError(RuntimeError):
    pass


# Calls that only query or create (no GPU work, no state a replay needs) are made but not recorded; a Destroy
# during the recording is postponed until the recording is dropped (a replay may still use the object).
_QUERY = re.compile(r"^(cudnn|cublas)(Get|Create)|^cudnnDropoutGet|^cudnnBackend(Create|Set|Get|Finalize|Initialize)")
_DESTROY = re.compile(r"^(cudnn|cublas)Destroy|^cudnnBackendDestroy")


class CallRecording:
    """The library calls one run of a function made, re-issued by ``replay()`` with the same arguments.

    ``out = rec.record(fn)`` runs ``fn`` once for real, noting every cuDNN/cuBLAS call with its arguments, every
    kernel launch with its packed parameters and every device-to-device copy or memset. The memory those calls
    point at stays allocated while the recording exists (runtime.memory.Hold): what the run allocates is a piece
    of the recording's arena (runtime._arena), whose freed pieces only the recording (and a child recording: a
    hybridized Block's backward) reuses, in the order a replay repeats; anything else its calls use is pinned,
    and a free of it waits for the recording to close. ``calls`` lists the recorded functions in order; a replay
    inside ``dnnbind.trace()`` goes through the traced library functions, so the trace lists and times them.
    Shared by RecordedStep (a whole training step) and hybridize() (a Block's forward and its backward).
    """

    def __init__(self, graph: bool = False) -> None:
        self._calls, self.calls, self._libs, self._keep, self._destroys = [], [], [], [], []
        self._hold: Hold | None = None
        # graph=True: the first replay is captured into a CUDA graph (one cudaGraphLaunch per replay after that)
        # where CUDA accepts the capture; a refused capture leaves the call-by-call replay.
        self._graph_wanted, self._graph, self._exec, self._stream = graph, None, None, 0
        # replay(pauses=...): the recording cut at those call indices, one CUDA graph per part (made on first use)
        self._parts_at: tuple = ()
        self._parts: list = []  # per part: (graph, exec) or None where its capture was refused (call by call)
        self._launched_at: dict = {}  # call index -> the packed parameters of the kernel launched there
        self._paths: list = []  # per call: the scopes open when it was recorded (for a traced replay)
        self._base = 0
        # (index of the first call, CUcontext) wherever the recorded calls change device: a replay makes each
        # call's device current again, whatever device is current when it is replayed.
        self._contexts: list = []

    def record(self, fn, parent: CallRecording | None = None):
        """Run ``fn`` once, recording it; returns its result. ``parent``: a recording always replayed just before
        this one (a hybridized Block's forward before its backward), whose freed memory this one may reuse."""
        if TRACING or Library._on_bind is not None:
            raise CaptureError("cannot record inside dnnbind.trace() (or another recording); trace the replay "
                               "instead")
        self._calls, self.calls, self._libs, self._keep, self._destroys = [], [], [], [], []
        self._paths, self._base = [], len(hooks.stack())
        self._contexts, self._launched_at = [], {}
        hold = Hold(parent._hold if parent is not None else None)
        undo = intercept((cudnn.lib, cublas.lib), self._wrap)
        RECORDING.append(self)
        TRACING.append(self)  # no trace session: only the scope names (Blocks, ops) are kept, one path per call
        try:
            with hold:
                out = fn()
        except BaseException as exc:
            self._calls, self._keep = [], []
            hold.release()
            if isinstance(exc, CaptureError):
                raise
            raise CaptureError(f"recording failed: {type(exc).__name__}: {exc}") from exc
        finally:
            TRACING.remove(self)
            RECORDING.remove(self)
            undo()
        pointers = set()  # what the calls point at (Hold.pin skips the family's own pieces)
        for args in [args for _, args, _ in self._calls] + self._keep:  # call arguments, kernel parameters
            for a in args:
                v = getattr(a, "value", a)
                if type(v) is int and v > 0xFFFF:
                    pointers.add(v)
        hold.pin(pointers)
        self._hold = hold
        return out

    def _wrap(self, lib, name, fn):
        if _QUERY.match(name):
            return fn
        if _DESTROY.match(name):
            def postponed(*args):
                self._destroys.append((fn, args))
                return 0
            return postponed

        def recorded(*args):
            result = fn(*args)
            self._note_context()
            self._calls.append(_lean(fn, args))
            self.calls.append(name)
            self._libs.append((lib, args))  # as called: a traced replay goes through lib with these
            self._paths.append(self._path())
            return result
        return recorded

    def _path(self) -> tuple:
        """The scopes open now, below the recording's start: a traced replay re-opens them around the call."""
        return tuple((name, op) for name, op, _, _ in hooks.stack()[self._base:])

    # Hooks the lower layers call through _lib.hooks.RECORDING (kernels.launch, runtime.memory).
    def launch(self, name, fn, args, holders, device: int = 0) -> None:
        self._keep.append(holders)
        self._note_context()
        self._launched_at[len(self._calls)] = holders
        self._calls.append((functools.partial(driver_call, "cuLaunchKernel"), args, None))
        self.calls.append(name)
        self._libs.append(("kernel", name, device))  # a traced replay records it as the kernel it is
        self._paths.append(self._path())

    def runtime(self, name, args) -> None:
        if name == "cudaMemcpyAsync" and args[3] != D2D:
            raise CaptureError("the recorded code copies between host and device (.numpy(), .asscalar(), an "
                               "array from numpy): a recording can replay device work only")
        self._note_context()
        self._calls.append((functools.partial(cudart.call, name), args, None))  # raises CudaError on failure
        self.calls.append(name)
        self._libs.append(None)
        self._paths.append(self._path())

    def _note_context(self) -> None:
        """Before a call is appended: note the context it ran in when it differs from the previous call's."""
        ctx = cudart.current_context()
        if not self._contexts or self._contexts[-1][1] != ctx:
            self._contexts.append((len(self._calls), ctx))

    def refuse(self, why: str) -> None:
        """Called (through hooks.RECORDING) by code whose GPU work a replay could not repeat faithfully."""
        raise CaptureError(f"cannot record: {why}")

    def last_uses(self, ranges: list) -> list | None:
        """For each device address range ``(lo, hi)``, the index of the last recorded call that points into it
        (an argument, a kernel parameter, a cuDNN variant pack's ``device_pointers``), -1 where none does: after
        that call the range holds its final values, for calls that write a buffer through a pointer to it (as
        every recorded op does its outputs). None where a call reaches memory it does not show (a variant pack
        that does not say its pointers)."""
        last = [-1] * len(ranges)
        order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
        starts = [ranges[k][0] for k in order]
        for i, (_, args, _) in enumerate(self._calls):
            if self.calls[i] == "cudnnBackendExecute":
                args = getattr(args[2], "device_pointers", None)
                if args is None:
                    return None
            for p in _pointers(self._launched_at.get(i, args)):
                j = bisect.bisect_right(starts, p) - 1
                if j >= 0 and p < ranges[order[j]][1]:
                    last[order[j]] = i
        return last

    def replay(self, stream=None, pauses=None) -> None:
        """Re-issue the calls (``stream``: the stream they were recorded on, for a graph=True recording).
        ``pauses``: (cuts, callback): the calls are replayed in parts cut before each index of ``cuts`` (sorted,
        inside the recording), and ``callback(k)`` runs after part k has been queued, before the next one (not
        after the last): what the host does then (queue a collective on the parts' outputs so far) overlaps the
        rest of the replay. A graph=True recording makes one CUDA graph per part."""
        if self._hold is None:
            raise CaptureError("this recording was closed; record it again")
        if self._contexts:
            cudart.use_context(self._contexts[0][1])
        if pauses is not None and pauses[0] and not TRACING and len(self._contexts) <= 1:
            self._replay_parts(stream, *pauses)
            return
        if TRACING:  # replay through the libraries' (traced) functions, so dnnbind.trace() lists every call,
            # each inside the scopes (Blocks, ops) it was recorded in, as an eager call would be
            switches = dict(self._contexts)
            for i, ((fn, args, _), bound, name, path) in enumerate(zip(self._calls, self._libs, self.calls,
                                                                     self._paths)):
                if i in switches:
                    cudart.use_context(switches[i])
                if pauses is not None and i in pauses[0]:
                    pauses[1](pauses[0].index(i))
                for scope_name, op in path:
                    hooks.push(scope_name, op)
                try:
                    if bound is None:
                        fn(*args)
                    elif bound[0] == "kernel":  # (fn.handle, grid xyz, block xyz, shared, stream, params, extra)
                        _traced.replayed_launch(bound[1], bound[2], args[8], args[1:4], args[4:7],
                                                functools.partial(fn, *args))
                    else:
                        getattr(bound[0], name)(*bound[1])
                finally:
                    for _ in path:
                        hooks.pop()
            return
        if self._exec is not None:
            err = cudart.rt().cudaGraphLaunch(self._exec, self._stream)
            if (err[0] if type(err) is tuple else err) == 0:
                return
            cudart.call("cudaGraphLaunch", self._exec, self._stream)  # raises CudaError with CUDA's text
        if self._graph_wanted and stream is not None:
            self._graph_wanted = False  # one try
            if self._capture(stream.handle):
                cudart.call("cudaGraphLaunch", self._exec, self._stream)
                return
        self._replay_calls()

    def _capture(self, handle: int) -> bool:
        """Capture one replay of the calls into a CUDA graph (nothing runs while capturing)."""
        made = self._capture_calls(handle, 0, len(self._calls))
        if made is None:
            return False
        self._graph, self._exec = made
        self._stream = handle
        return True

    def _capture_calls(self, handle: int, start: int, end: int):
        """(graph, its executable) of calls [start, end) captured on the stream ``handle``, or None where CUDA
        refuses the capture (the calls are then replayed one by one)."""
        rt = cudart.rt()
        try:
            cudart.call("cudaStreamBeginCapture", handle, rt.cudaStreamCaptureMode(CAPTURE_MODE_THREAD_LOCAL))
        except Exception:  # noqa: BLE001  (e.g. the stream is already capturing: stay call by call)
            return None
        try:
            self._replay_calls(start, end)
        except Exception:  # noqa: BLE001  (a call CUDA cannot capture: call by call it is)
            try:
                graph = cudart.call("cudaStreamEndCapture", handle)
                cudart.call("cudaGraphDestroy", graph)
            except Exception:  # noqa: BLE001
                pass
            return None
        try:
            graph = cudart.call("cudaStreamEndCapture", handle)
            return graph, cudart.call("cudaGraphInstantiate", graph, 0)
        except Exception:  # noqa: BLE001  (the capture was invalidated)
            return None

    def _replay_parts(self, stream, cuts, callback) -> None:
        """replay(pauses=(cuts, callback)): part by part, a CUDA graph each where the recording wants graphs
        and the stream is given (the parts' graphs are made for one set of cuts: new cuts make them again)."""
        cuts = tuple(cuts)
        bounds = (0,) + cuts + (len(self._calls),)
        graphs = self._graph_wanted or self._exec is not None
        if graphs and stream is not None and (cuts != self._parts_at or self._stream not in (0, stream.handle)):
            self._drop_parts()
            self._parts_at, self._stream = cuts, stream.handle
            self._parts = [self._capture_calls(stream.handle, a, b) for a, b in zip(bounds, bounds[1:])]
        use = graphs and stream is not None and cuts == self._parts_at
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            part = self._parts[k] if use else None
            if part is not None:
                cudart.call("cudaGraphLaunch", part[1], self._stream)
            else:
                self._replay_calls(a, b)
            if k < len(cuts):
                callback(k)

    def _drop_parts(self) -> None:
        parts, self._parts, self._parts_at = self._parts, [], ()
        for part in parts:
            for fn, obj in zip(("cudaGraphDestroy", "cudaGraphExecDestroy"), part or ()):
                try:
                    cudart.call(fn, obj)
                except Exception:  # noqa: BLE001
                    pass

    def _replay_calls(self, start: int = 0, end: int | None = None) -> None:
        calls = self._calls if start == 0 and end is None else self._calls[start:end]
        if len(self._contexts) > 1:  # calls on several devices: each switch made again, in order
            switches = dict(self._contexts)
            for i, (fn, args, bound) in enumerate(calls, start):
                if i in switches:
                    cudart.use_context(switches[i])
                status = fn(*args)
                if status and bound is not None:
                    bound.errcheck(status, bound, args)
            return
        for fn, args, bound in calls:  # one device, made current by replay()
            status = fn(*args)
            if status and bound is not None:  # raise as the bound function would: function, status, cuDNN's text
                bound.errcheck(status, bound, args)

    def close(self) -> None:
        """Free what the recording holds now (also done when it is garbage collected)."""
        for fn, args in self._destroys:
            try:
                fn(*args)
            except Exception:
                pass
        self._destroys, self._calls, self._libs, self._keep = [], [], [], []
        self._launched_at = {}
        self._drop_parts()
        exec_, graph, self._exec, self._graph = self._exec, self._graph, None, None
        for fn, obj in (("cudaGraphExecDestroy", exec_), ("cudaGraphDestroy", graph)):
            if obj is not None:
                try:
                    cudart.call(fn, obj)
                except Exception:  # noqa: BLE001
                    pass
        if self._hold is not None:
            hold, self._hold = self._hold, None
            hold.release()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _pointers(values):
    """The integers among a call's arguments or a launch's packed parameters (ctypes values, and the fields of a
    by-value Structure): the candidates for device addresses."""
    for a in values:
        fields = getattr(a, "_fields_", None)
        if fields is not None:
            yield from _pointers(getattr(a, f[0]) for f in fields)
            continue
        v = getattr(a, "value", a)
        if type(v) is int and v > 0xFFFF:
            yield v


_SIMPLE = (ctypes.c_int, ctypes.c_uint, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_float,
           ctypes.c_double)


def _lean(fn, args) -> tuple:
    """(callable, arguments, bound function or None) for the replay of one library call.

    NOTE: replay is where host time per call matters most, so a status-returning function is re-bound at the
    same address without its Python errcheck (the replay loop tests the int status and calls the errcheck only
    on failure), and int/float arguments are converted once to their declared ctypes types here rather than
    by ctypes at every call.
    """
    if getattr(fn, "errcheck", None) is None or not fn.argtypes:
        return fn, args, None
    raw = type(fn)(ctypes.cast(fn, ctypes.c_void_p).value)
    raw.argtypes, raw.restype = fn.argtypes, ctypes.c_int
    converted = tuple(t(a) if t in _SIMPLE and type(a) in (int, float) else a for a, t in zip(args, fn.argtypes))
    return raw, converted, fn
