"""Top layer (graph): record a whole training step once, replay it every step. Imports _lib, runtime, ops.

Two ways to replay, one recording discipline:
- ``CapturedStep``: the step captured as one CUDA graph, replayed with a single ``cudaGraphLaunch``;
- ``RecordedStep``: the step recorded as its list of library calls (each cuDNN/cuBLAS function with its
  argument tuple, each packed kernel launch, each device copy) and replayed from the host call by call. No
  CUDA graph: every call is issued as an eager step issues it, minus everything Python did to get there
  (autograd, shape checks, descriptor and algorithm lookups, allocation). MXNet's ``hybridize(static_alloc=
  True, static_shape=True)`` makes the same trade.

A step (forward, loss, backward, optimizer update) is a fixed sequence of cuDNN/cuBLAS calls and kernel
launches on fixed buffers once shapes are fixed, so CUDA can record it once and replay it with a single
``cudaGraphLaunch``: the Python, ctypes and cuDNN host costs (~26-150 us per conv call, FACTS.md) vanish.

What makes a step capturable here:
- warm-up first (eagerly): it picks conv algorithms for GPU time alone (``ops.algos.optimize_for("graph")``;
  timing synchronizes), grows the workspace, loads kernels
  and fills every cache, so nothing inside the capture allocates a cache or synchronizes;
- inputs are *static* device buffers the caller refills before each replay (``x.copy_(batch)``);
- every temporary is allocated and freed inside the capture (stream-ordered allocations become graph memory
  nodes); the step's result is copied into a static output buffer before capture ends;
- scalars passed by host pointer (learning rate, momentum) are read at capture time: changing them later
  needs a new capture (``CapturedStep.recapture()``).
Warm-up steps would change the model, so the arrays named in ``preserve`` (parameters, optimizer state) are
snapshotted before warm-up and restored after capture.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import re

import numpy as np

from . import autograd
from ._lib import cublas, cudart, cudnn, hooks
from ._lib.cfunc import Library, intercept
from ._lib.hooks import RECORDING, TRACING
from .kernels.launch import _drv_call
from .ops import _common
from .ops.algos import optimize_for
from .runtime.array import NDArray, empty
from .runtime.device import as_device
from .runtime.memory import D2D, Hold, memcpy
from .runtime.stream import current_stream
from .trace import session as _traced

# cudaStreamCaptureMode: thread-local, so another thread's unrelated CUDA calls don't invalidate the capture
_CAPTURE_MODE_THREAD_LOCAL = 1


class CaptureError(RuntimeError):
    pass


class _StaticStep:
    """What both replays share: fixed input shapes, warm-up, snapshot/restore of ``preserve``."""

    _objective = "graph"  # how conv algorithms are chosen while warming up and recording (ops.algos)
    _kind = "a recorded step"

    def __init__(self, fn, inputs=(), preserve=(), warmup: int = 2, device=None):
        self.fn, self.inputs, self.preserve, self.warmup = fn, list(inputs), list(preserve), warmup
        self.device = as_device(device if device is not None else (inputs[0].device if inputs else None))
        if not self.device.is_gpu:
            raise CaptureError(f"{type(self).__name__} needs a GPU device; on the cpu call the step function "
                               "directly")
        self._shapes = [(a.shape, a.dtype) for a in self.inputs]
        self.output: NDArray | None = None
        self.recapture()

    def recapture(self) -> None:
        stream = current_stream(self.device)
        if stream.handle == 0:
            raise CaptureError("cannot capture on the legacy default stream")
        snapshot = [a.copy() for a in self.preserve]
        out = None
        with optimize_for(self._objective):
            for _ in range(max(self.warmup, 1)):
                out = self.fn()
        if not isinstance(out, NDArray):
            raise CaptureError(f"the step function must return an NDArray (e.g. the loss), got {type(out).__name__}")
        self._out_spec = (out.shape, out.dtype)
        del out
        stream.synchronize()
        gc.collect()  # free warm-up temporaries now, not inside the recording
        # The shared conv workspaces are used by pointer; one that grows later must outlive the recording.
        self._workspaces = list(_common._workspaces.values())
        with optimize_for(self._objective):
            self._record(stream)
        for a, s in zip(self.preserve, snapshot):  # undo the warm-up steps' updates
            a.copy_(s)
        stream.synchronize()

    def _check_inputs(self) -> None:
        for a, (shape, dtype) in zip(self.inputs, self._shapes):
            if a.shape != shape or a.dtype != dtype:
                raise CaptureError(f"input shape changed from {shape} to {a.shape}: {self._kind} replays fixed "
                                   "shapes; capture again for the new shape (e.g. the last, smaller batch)")


class CapturedStep(_StaticStep):
    """``step = CapturedStep(fn, inputs=[x, y], preserve=[...])``; ``out = step()`` replays the graph."""

    _kind = "a captured step"

    def _record(self, stream) -> None:
        self._exec = self._graph = None
        out = None
        self.output = empty(*self._out_spec, self.device)  # before capture: not a graph allocation
        rt = cudart.rt()
        cudart.call("cudaStreamBeginCapture", stream.handle, rt.cudaStreamCaptureMode(_CAPTURE_MODE_THREAD_LOCAL))
        try:
            out = self.fn()
            memcpy(self.output._ptr, out._ptr, out.nbytes, D2D, stream)
            del out
            gc.collect()  # every temporary must be freed inside the capture (graph memory-free nodes)
        except BaseException as exc:
            try:
                cudart.call("cudaStreamEndCapture", stream.handle)
            except Exception:
                pass
            raise CaptureError(f"capturing the step failed: {exc}. A step must not synchronize, copy to the "
                               "host (.numpy(), .item()) or change shapes.") from exc
        graph = cudart.call("cudaStreamEndCapture", stream.handle)
        self._graph = graph
        self._exec = cudart.call("cudaGraphInstantiate", graph, 0)

    def num_nodes(self) -> int:
        nodes = cudart.call("cudaGraphGetNodes", self._graph, 0)
        return int(nodes[1] if isinstance(nodes, tuple) else nodes)

    def __call__(self) -> NDArray:
        self._check_inputs()
        cudart.call("cudaGraphLaunch", self._exec, current_stream(self.device).handle)
        return self.output

    replay = __call__


# Calls that only query or create (no GPU work, no state a replay needs) are made but not recorded; a Destroy
# during the recording is postponed until the recording is dropped (a replay may still use the object).
_QUERY = re.compile(r"^(cudnn|cublas)(Get|Create)|^cudnnDropoutGet|^cudnnBackend(Create|Set|Get|Finalize|Initialize)")
_DESTROY = re.compile(r"^(cudnn|cublas)Destroy|^cudnnBackendDestroy")


class CallRecording:
    """The library calls one run of a function made, re-issued by ``replay()`` with the same arguments.

    ``out = rec.record(fn)`` runs ``fn`` once for real, noting every cuDNN/cuBLAS call with its arguments, every
    kernel launch with its packed parameters and every device-to-device copy or memset. The memory those calls
    point at stays allocated while the recording exists (runtime.memory.Hold): everything freed during the run
    (its temporaries keep distinct addresses), and everything allocated during it (so an activation kept past
    the run, or a view into one, outlives its arrays). ``calls`` lists the recorded functions in order; a replay
    inside ``dnnbind.trace()`` goes through the traced library functions, so the trace lists and times them.
    Shared by RecordedStep (a whole training step) and hybridize() (a Block's forward and its backward).
    """

    def __init__(self, graph: bool = False) -> None:
        self._calls, self.calls, self._libs, self._keep, self._destroys = [], [], [], [], []
        self._hold: Hold | None = None
        # graph=True: the first replay is captured into a CUDA graph (one cudaGraphLaunch per replay after that)
        # where CUDA accepts the capture; a refused capture leaves the call-by-call replay.
        self._graph_wanted, self._graph, self._exec, self._stream = graph, None, None, 0
        self._paths: list = []  # per call: the scopes open when it was recorded (for a traced replay)
        self._base = 0

    def record(self, fn, parent: CallRecording | None = None):
        """Run ``fn`` once, recording it; returns its result. ``parent``: a recording always replayed just before
        this one (a hybridized Block's forward before its backward), whose freed memory this one may reuse."""
        if TRACING or Library._on_bind is not None:
            raise CaptureError("cannot record inside dnnbind.trace() (or another recording); trace the replay "
                               "instead")
        self._calls, self.calls, self._libs, self._keep, self._destroys = [], [], [], [], []
        self._paths, self._base = [], len(hooks.stack())
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
        pointers = set(hold.allocated)
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
        self._calls.append((functools.partial(_drv_call, "cuLaunchKernel"), args, None))
        self.calls.append(name)
        self._libs.append(("kernel", name, device))  # a traced replay records it as the kernel it is
        self._paths.append(self._path())

    def runtime(self, name, args) -> None:
        if name == "cudaMemcpyAsync" and args[3] != D2D:
            raise CaptureError("the recorded code copies between host and device (.numpy(), .asscalar(), an "
                               "array from numpy): a recording can replay device work only")
        self._calls.append((functools.partial(cudart.call, name), args, None))  # raises CudaError on failure
        self.calls.append(name)
        self._libs.append(None)
        self._paths.append(self._path())

    def refuse(self, why: str) -> None:
        """Called (through hooks.RECORDING) by code whose GPU work a replay could not repeat faithfully."""
        raise CaptureError(f"cannot record: {why}")

    def replay(self, stream=None) -> None:
        """Re-issue the calls (``stream``: the stream they were recorded on, for a graph=True recording)."""
        if self._hold is None:
            raise CaptureError("this recording was closed; record it again")
        if TRACING:  # replay through the libraries' (traced) functions, so dnnbind.trace() lists every call,
            # each inside the scopes (Blocks, ops) it was recorded in, as an eager call would be
            for (fn, args, _), bound, name, path in zip(self._calls, self._libs, self.calls, self._paths):
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
        rt = cudart.rt()
        try:
            cudart.call("cudaStreamBeginCapture", handle, rt.cudaStreamCaptureMode(_CAPTURE_MODE_THREAD_LOCAL))
        except Exception:  # noqa: BLE001  (e.g. the stream is already capturing: stay call by call)
            return False
        try:
            self._replay_calls()
        except Exception:  # noqa: BLE001  (a call CUDA cannot capture: call by call it is)
            try:
                graph = cudart.call("cudaStreamEndCapture", handle)
                cudart.call("cudaGraphDestroy", graph)
            except Exception:  # noqa: BLE001
                pass
            return False
        try:
            graph = cudart.call("cudaStreamEndCapture", handle)
            self._exec = cudart.call("cudaGraphInstantiate", graph, 0)
        except Exception:  # noqa: BLE001  (the capture was invalidated)
            return False
        self._graph, self._stream = graph, handle
        return True

    def _replay_calls(self) -> None:
        for fn, args, bound in self._calls:
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


class RecordedStep(_StaticStep):
    """``step = RecordedStep(fn, inputs=[x, y], preserve=[...])``; ``out = step()`` re-issues the recorded calls.

    The recording (a CallRecording) runs the step once for real (then restores ``preserve``). Conv algorithms
    are chosen for eager calls (wall time, cuDNN's host work included): a replay pays that host work.
    ``step.calls`` lists the recorded functions in order.
    """

    _objective = "eager"
    _kind = "a recorded step"

    def _record(self, stream) -> None:
        old = getattr(self, "_rec", None)
        rec = CallRecording()
        out = rec.record(self.fn)
        if not isinstance(out, NDArray):
            rec.close()
            raise CaptureError("the step function must return an NDArray")
        self.output = out  # its buffer is held: every replay rewrites it in place
        self._rec = rec
        if old is not None:
            old.close()

    @property
    def calls(self) -> list:
        return self._rec.calls if getattr(self, "_rec", None) is not None else []

    def __call__(self) -> NDArray:
        self._check_inputs()
        if getattr(self, "_rec", None) is None:
            raise CaptureError("this recorded step was closed; record it again with recapture()")
        self._rec.replay()
        return self.output

    replay = __call__

    def close(self) -> None:
        """Free what the recording holds now (also done when the step is garbage collected)."""
        rec, self._rec = getattr(self, "_rec", None), None
        if rec is not None:
            rec.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


REPLAYS = {"graph": CapturedStep, "host": RecordedStep}


class TrainingStep:
    """``step = training_step(net, loss_fn, trainer, (64, 1, 28, 28))``; ``loss = step(data, label)``.

    The Block-API way to make a training step static: forward, loss, backward and ``trainer.step`` are
    recorded once over fixed input buffers and replayed for every batch, ``replay="graph"`` as one CUDA graph
    (CapturedStep), ``replay="host"`` call by call from the host (RecordedStep). A call stages the batch into
    the input buffers (two device copies) and replays; the returned loss buffer is rewritten by the next call.
    Host-side scalars are those of the recording: a changed learning rate needs ``step.recapture()``.
    """

    def __init__(self, net, loss_fn, trainer, data_shape, label_shape=None, label_dtype=np.int32,
                 replay: str = "graph", device=None, warmup: int = 2, data_dtype=np.float32):
        if replay not in REPLAYS:
            raise ValueError(f"training_step: replay must be one of {sorted(REPLAYS)}, got {replay!r}")
        device = as_device(device if device is not None else _first_param_device(net))
        batch = int(data_shape[0])
        self.data = empty(tuple(data_shape), data_dtype, device)  # float16 for a network cast to float16
        self.label = empty(tuple(label_shape) if label_shape is not None else (batch,), label_dtype, device)
        self.data.copy_(np.random.default_rng(0).random(self.data.shape, dtype=np.float32).astype(data_dtype))
        self.label.copy_(np.zeros(self.label.shape, label_dtype))
        x, y = self.data, self.label

        def step():
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(batch)
            return loss

        self.replay = REPLAYS[replay](step, inputs=[x, y], preserve=trainer.state_arrays(), warmup=warmup,
                                      device=device)

    def recapture(self) -> None:
        self.replay.recapture()

    def __call__(self, data, label) -> NDArray:
        if data.shape != self.data.shape or label.shape != self.label.shape:
            raise CaptureError(f"training step: batch of shape {data.shape} / {label.shape}, recorded for "
                               f"{self.data.shape} / {self.label.shape}; record another step for this shape "
                               "(or drop the short last batch)")
        self.data.copy_(data)
        self.label.copy_(label)
        return self.replay()


def training_step(net, loss_fn, trainer, data_shape, label_shape=None, label_dtype=np.int32,
                  replay: str = "graph", device=None, warmup: int = 2, data_dtype=np.float32) -> TrainingStep:
    return TrainingStep(net, loss_fn, trainer, data_shape, label_shape, label_dtype, replay, device, warmup,
                        data_dtype)


training_step.__doc__ = TrainingStep.__doc__


def _first_param_device(net):
    for p in net.collect_params().values():
        return p.data().device
    raise CaptureError("training_step: the network has no initialized parameters (run one forward first)")


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
