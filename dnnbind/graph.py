"""Top layer (graph): record a whole training step once, replay it every step. Imports _lib, runtime, ops and
recording (CallRecording, the recorder it shares with hybrid.py).

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

from ._lib.errors import DnnbindValueError

import gc

import numpy as np

from . import autograd
from ._lib import cudart
from .ops import stream_workspaces
from .ops.algos import optimize_for
from .recording import CAPTURE_MODE_THREAD_LOCAL, CallRecording, CaptureError
from .runtime.array import NDArray, empty
from .runtime.device import as_device
from .runtime.memory import D2D, memcpy
from .runtime.stream import current_stream

__all__ = ["CallRecording", "CaptureError", "CapturedStep", "RecordedStep", "TrainingStep", "training_step"]


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
        self.device.activate()
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
        self._workspaces = stream_workspaces()
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
        cudart.call("cudaStreamBeginCapture", stream.handle, rt.cudaStreamCaptureMode(CAPTURE_MODE_THREAD_LOCAL))
        try:
            out = self.fn()
            memcpy(self.output.ptr, out.ptr, out.nbytes, D2D, stream)
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
        self.device.activate()
        cudart.call("cudaGraphLaunch", self._exec, current_stream(self.device).handle)
        return self.output

    replay = __call__


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
            raise DnnbindValueError(f"training_step: replay must be one of {sorted(REPLAYS)}, got {replay!r}")
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
