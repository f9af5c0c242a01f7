"""Top layer (graph): capture a whole training step as one CUDA graph and replay it. Imports runtime, ops.

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

import gc

from ._lib import cudart
from .ops.algos import optimize_for
from .runtime.array import NDArray, empty
from .runtime.device import as_device
from .runtime.memory import D2D, memcpy
from .runtime.stream import current_stream

# cudaStreamCaptureMode: thread-local, so another thread's unrelated CUDA calls don't invalidate the capture
_CAPTURE_MODE_THREAD_LOCAL = 1


class CaptureError(RuntimeError):
    pass


class CapturedStep:
    """``step = CapturedStep(fn, inputs=[x, y], preserve=[...])``; ``out = step()`` replays the graph."""

    def __init__(self, fn, inputs=(), preserve=(), warmup: int = 2, device=None):
        self.fn, self.inputs, self.preserve, self.warmup = fn, list(inputs), list(preserve), warmup
        self.device = as_device(device if device is not None else (inputs[0].device if inputs else None))
        if not self.device.is_gpu:
            raise CaptureError("CapturedStep needs a GPU device; on the cpu call the step function directly")
        self._shapes = [(a.shape, a.dtype) for a in self.inputs]
        self._exec = self._graph = None
        self.output: NDArray | None = None
        self.recapture()

    def recapture(self) -> None:
        stream = current_stream(self.device)
        if stream.handle == 0:
            raise CaptureError("cannot capture on the legacy default stream")
        snapshot = [a.copy() for a in self.preserve]
        out = None
        with optimize_for("graph"):  # replayed, only GPU time counts: pick conv algorithms for that
            for _ in range(max(self.warmup, 1)):
                out = self.fn()
        if not isinstance(out, NDArray):
            raise CaptureError(f"the step function must return an NDArray (e.g. the loss), got {type(out).__name__}")
        self.output = empty(out.shape, out.dtype, self.device)
        del out
        stream.synchronize()
        gc.collect()  # free warm-up temporaries now, not inside the capture
        rt = cudart.rt()
        cudart.call("cudaStreamBeginCapture", stream.handle, rt.cudaStreamCaptureMode(_CAPTURE_MODE_THREAD_LOCAL))
        try:
            with optimize_for("graph"):
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
        for a, s in zip(self.preserve, snapshot):  # undo the warm-up steps' updates
            a.copy_(s)
        stream.synchronize()

    def num_nodes(self) -> int:
        nodes = cudart.call("cudaGraphGetNodes", self._graph, 0)
        return int(nodes[1] if isinstance(nodes, tuple) else nodes)

    def __call__(self) -> NDArray:
        for a, (shape, dtype) in zip(self.inputs, self._shapes):
            if a.shape != shape or a.dtype != dtype:
                raise CaptureError(f"input shape changed from {shape} to {a.shape}: a captured step replays fixed "
                                   "shapes; capture again for the new shape (e.g. the last, smaller batch)")
        cudart.call("cudaGraphLaunch", self._exec, current_stream(self.device).handle)
        return self.output

    replay = __call__
