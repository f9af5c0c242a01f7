"""Layer 2 (ops): choosing convolution algorithms. Imports _lib, runtime and ops.descriptors.

NOTE: at MNIST-sized shapes neither cuDNN's heuristics (``Get*_v7``) nor ``Find*`` reliably picks the fastest
algorithm (FACTS.md), so the default policy times every candidate the heuristics list as usable, with CUDA
events, once per shape, and caches the winner with its workspace size. ``set_conv_algo_policy("heuristic")``
takes the heuristics' first choice instead (no timing); ``deterministic=True`` keeps only deterministic
algorithms (bitwise-reproducible training).
"""

from __future__ import annotations

import ctypes

from .._lib import cudnn
from .._lib.errors import CudnnError
from ..runtime.stream import Event, current_stream

L = cudnn.lib
_policy = {"mode": "time", "deterministic": False}
_chosen: dict = {}  # key -> (algo, workspace bytes)

DIRECTIONS = {
    "fwd": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionForwardWorkspaceSize",
            "cudnnGetConvolutionForwardAlgorithmMaxCount", cudnn.FWD_ALGOS),
    "bwd_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnGetConvolutionBackwardDataWorkspaceSize",
                 "cudnnGetConvolutionBackwardDataAlgorithmMaxCount", cudnn.BWD_DATA_ALGOS),
    "bwd_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                   "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", cudnn.BWD_FILTER_ALGOS),
}


def set_conv_algo_policy(mode: str = "time", deterministic: bool = False) -> None:
    """"time" (default): time the candidates once per shape; "heuristic": cuDNN's first usable choice."""
    if mode not in ("time", "heuristic"):
        raise ValueError(f"set_conv_algo_policy: mode must be 'time' or 'heuristic', got {mode!r}")
    if (mode, deterministic) != (_policy["mode"], _policy["deterministic"]):
        _chosen.clear()
    _policy.update(mode=mode, deterministic=bool(deterministic))


def algo_name(direction: str, algo: int) -> str:
    names = DIRECTIONS[direction][3]
    return names[algo] if 0 <= algo < len(names) else str(algo)


def chosen() -> dict:
    """Every (direction, shapes...) -> (algorithm name, workspace bytes) picked so far in this process."""
    return {k: (algo_name(k[0], a), ws) for k, (a, ws) in _chosen.items()}


def candidates(direction: str, handle: int, d1, d2, cdesc, d3) -> list:
    """Usable algorithms in cuDNN's heuristic order: [(algo, workspace bytes, deterministic)]."""
    get, ws_fn, count_fn, _ = DIRECTIONS[direction]
    count = ctypes.c_int()
    getattr(L, count_fn)(handle, ctypes.byref(count))
    perf = (cudnn.cudnnConvolutionFwdAlgoPerf_t * max(count.value, 1))()
    returned = ctypes.c_int()
    getattr(L, get)(handle, d1, d2, cdesc, d3, len(perf), ctypes.byref(returned), perf)
    out, seen = [], set()
    for p in perf[:returned.value]:
        if p.status != 0 or p.algo in seen:
            continue
        if _policy["deterministic"] and p.determinism != 1:
            continue
        size = ctypes.c_size_t()
        try:
            getattr(L, ws_fn)(handle, d1, d2, cdesc, d3, p.algo, ctypes.byref(size))
        except CudnnError:
            continue
        seen.add(p.algo)
        out.append((p.algo, size.value, p.determinism == 1))
    return out


def choose(key: tuple, direction: str, handle: int, descs: tuple, run, device, only=None) -> tuple[int, int]:
    """(algo, workspace bytes) for ``key``; ``run(algo, ws_ptr, ws_size)`` launches one candidate.
    ``only``: the algorithms allowed (e.g. the fused conv+bias+ReLU supports IMPLICIT_PRECOMP_GEMM)."""
    hit = _chosen.get(key)
    if hit is not None:
        return hit
    cands = candidates(direction, handle, *descs)
    if only is not None:
        cands = [c for c in cands if c[0] in only]
    if not cands:
        raise CudnnError(cudnn.CUDNN_STATUS_NOT_SUPPORTED, DIRECTIONS[direction][0],
                         "no usable algorithm for this configuration", repr(key))
    if _policy["mode"] == "heuristic" or len(cands) == 1:
        best = cands[0][:2]
    else:
        best = _time_candidates(cands, run, device)
    _chosen[key] = best
    return best


def _time_candidates(cands, run, device) -> tuple[int, int]:
    """The fastest candidate by GPU time alone.

    NOTE: an event pair around one eager call measures cuDNN's host work too (26-150 us per conv call,
    FACTS.md), which swamps 10-40 us kernels. So each candidate is captured into a small CUDA graph of
    REPEAT launches and the graph's replay is timed: kernel time only, as it will run in a captured step.
    A candidate that cannot be captured is timed eagerly instead.
    """
    from ._common import workspace
    stream = current_stream(device)
    start, end = Event(device), Event(device)
    results = []
    for algo, ws_bytes, _ in cands:
        ptr, size = workspace(device, ws_bytes)
        try:
            run(algo, ptr, size)  # warm-up: the first launch may load kernels
            best_ms = _graph_time(run, algo, ptr, size, stream, start, end)
            if best_ms is None:
                best_ms = float("inf")
                for _ in range(3):
                    start.record(stream)
                    run(algo, ptr, size)
                    end.record(stream)
                    end.synchronize()
                    best_ms = min(best_ms, end.elapsed_ms(start))
        except CudnnError:
            continue
        results.append((best_ms, ws_bytes, algo))
    if not results:
        return cands[0][:2]
    results.sort()
    _, ws_bytes, algo = results[0]
    return algo, ws_bytes


REPEAT = 5


def _graph_time(run, algo, ptr, size, stream, start, end):
    """Best per-launch ms of ``run`` replayed from a captured graph, or None if it cannot be captured."""
    from .._lib import cudart
    stream.synchronize()
    try:
        cudart.call("cudaStreamBeginCapture", stream.handle, cudart.rt().cudaStreamCaptureMode(1))
    except Exception:
        return None
    graph, failed = None, False
    try:
        for _ in range(REPEAT):
            run(algo, ptr, size)
    except Exception:
        failed = True  # an incomplete graph would time too fast: fall back to eager timing
    finally:
        try:
            graph = cudart.call("cudaStreamEndCapture", stream.handle)
        except Exception:
            graph = None
    if graph is None:
        return None
    if failed:
        cudart.call("cudaGraphDestroy", graph)
        return None
    try:
        exe = cudart.call("cudaGraphInstantiate", graph, 0)
    except Exception:
        cudart.call("cudaGraphDestroy", graph)
        return None
    try:
        cudart.call("cudaGraphLaunch", exe, stream.handle)  # upload and warm
        best = float("inf")
        for _ in range(3):
            start.record(stream)
            cudart.call("cudaGraphLaunch", exe, stream.handle)
            end.record(stream)
            end.synchronize()
            best = min(best, end.elapsed_ms(start) / REPEAT)
        return best
    except Exception:
        return None
    finally:
        cudart.call("cudaGraphExecDestroy", exe)
        cudart.call("cudaGraphDestroy", graph)
