"""Layer 2 (ops): choosing convolution algorithms. Imports _lib, runtime and ops.descriptors.

NOTE: at MNIST-sized shapes neither cuDNN's heuristics (``Get*_v7``) nor ``Find*`` reliably picks the fastest
algorithm (FACTS.md), so the default policy times every candidate the heuristics list as usable, once per
shape, and caches the winner with its workspace size, in the process and on disk (ops.algo_cache), so the
next run reuses it. ``set_conv_algo_policy("heuristic")`` takes the heuristics' first choice instead (no
timing); ``deterministic=True`` keeps only deterministic algorithms (bitwise-reproducible training).

What "fastest" means depends on how the call will run. In a captured CUDA graph only GPU time counts. Run
eagerly, each legacy conv call also costs 30-270 us of cuDNN's own CPU work, which differs by algorithm and
often exceeds the kernel (FACTS.md), so eager calls pick the algorithm with the least host work plus GPU time
per call. The sum, not the larger of the two: one call in isolation overlaps its host work with its kernel,
but a step of many ops is bound by the sum of all host work or the sum of all GPU work, and a call timed alone
cannot tell which. Taking the larger per call chose, for fp16 NHWC ResNet-18, legacy calls of 80-100 us host
over plans of 40 us whose kernels were a little slower, in a step that was all host (docs/benchmarks.md).
``optimize_for("graph")`` (used by dnnbind.graph.CapturedStep while it warms up) selects the GPU-time
objective; the default is ``"eager"``. Each objective has its own cache.

Timed calls also consider the execution plans of cuDNN's backend (graph) API (ops.conv_backend): built once
per shape, a plan runs with one ``cudnnBackendExecute`` whose host cost is 7-15 us where the legacy call pays
23-45 us (H100, docs/benchmarks.md), and some plans' kernels beat every legacy algorithm's. They are numbered
``BACKEND + i`` (i: the plan's place in the heuristics' list, stable for one GPU and cuDNN version, so the
on-disk cache can name it). For the "graph" objective a plan is a candidate only if its call captures into the
candidate's timing graph. ``set_conv_algo_policy(backend=False)`` (or ``DNNBIND_CONV_BACKEND=0``) turns the plans
off.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import contextlib
import ctypes
import os
import sys
import threading
import time

from .._lib import cudnn
from .._lib.errors import CudaError, CudnnError
from ..runtime.device import gpu_properties
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import Event, current_stream
from . import algo_cache

L = cudnn.lib
WORKSPACE_LIMIT = 1 << 30  # MXNet's Convolution(workspace=1024) default: at most 1024 MiB of scratch per call
_policy = {"mode": "time", "deterministic": False, "workspace_limit": WORKSPACE_LIMIT,
           "backend": os.environ.get("DNNBIND_CONV_BACKEND", "1").strip().lower() not in ("0", "false", "no", "off")}
BACKEND = 1000  # algorithm ids >= BACKEND name backend execution plans (see module docstring)
_plan_names: dict = {}  # (key, algo >= BACKEND) -> the plan's name, for chosen()
_chosen = {"eager": {}, "graph": {}}  # objective -> {key -> (algo, workspace bytes)}
# the objectives' names in the on-disk cache; "eager-sum" since the eager objective became host plus GPU time
# (choices stored under "eager" were made by the larger of the two and are not reused)
_DISK_OBJECTIVE = {"eager": "eager-sum", "graph": "graph"}
_chosen_lock = threading.Lock()  # insertions and clears (lookups are plain dict gets); one entry per conv shape
_tls = threading.local()
_identity: dict = {}  # device index -> "GPU name sm_XY cudnn N", the on-disk cache's scope

DIRECTIONS = {
    "fwd": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionForwardWorkspaceSize",
            "cudnnGetConvolutionForwardAlgorithmMaxCount", cudnn.FWD_ALGOS),
    "bwd_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnGetConvolutionBackwardDataWorkspaceSize",
                 "cudnnGetConvolutionBackwardDataAlgorithmMaxCount", cudnn.BWD_DATA_ALGOS),
    "bwd_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                   "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", cudnn.BWD_FILTER_ALGOS),
}


def set_conv_algo_policy(mode: str = "time", deterministic: bool = False, backend: bool | None = None,
                         workspace_limit_mb: int | None = None) -> None:
    """"time" (default): time the candidates once per shape; "heuristic": cuDNN's first usable choice.
    ``backend``: whether eager calls may use backend-API execution plans (None: leave as is).
    ``workspace_limit_mb``: the timed search skips algorithms needing more scratch than this (default 1024, as
    MXNet's Convolution ``workspace``; None: leave as is). It applies to shapes not yet chosen."""
    if mode not in ("time", "heuristic"):
        raise DnnbindValueError(f"set_conv_algo_policy: mode must be 'time' or 'heuristic', got {mode!r}")
    if workspace_limit_mb is not None and (isinstance(workspace_limit_mb, bool)
                                           or not isinstance(workspace_limit_mb, int) or workspace_limit_mb < 0):
        raise DnnbindValueError(f"set_conv_algo_policy: workspace_limit_mb must be an int >= 0, got {workspace_limit_mb!r}")
    backend = _policy["backend"] if backend is None else bool(backend)
    limit = _policy["workspace_limit"] if workspace_limit_mb is None else workspace_limit_mb << 20
    changed = (mode, deterministic, backend, limit) != (_policy["mode"], _policy["deterministic"], _policy["backend"],
                                                        _policy["workspace_limit"])
    _policy.update(mode=mode, deterministic=bool(deterministic), backend=backend, workspace_limit=limit)
    if changed:  # choices made under the old policy, and callers' caches of them (ops.conv's plans), are dropped
        forget_choices()


_on_policy_change: list = []


def on_policy_change(forget) -> None:
    """Call ``forget()`` whenever the choices are dropped (set_conv_algo_policy changing the policy,
    forget_choices): a cache of choose()'s answers (ops.conv keeps one per conv shape, to skip choose() on the hot
    path) must then be dropped too."""
    _on_policy_change.append(forget)


def forget_choices() -> dict:
    """Drop every algorithm chosen in this process (what a new process starts with; the on-disk cache is left as
    it is), returning what was chosen so ``restore_choices`` can put it back (tests)."""
    with _chosen_lock:
        saved = {target: dict(table) for target, table in _chosen.items()}
        for table in _chosen.values():
            table.clear()
    for forget in _on_policy_change:
        forget()
    return saved


def restore_choices(saved: dict) -> None:
    """Put back what forget_choices returned, dropping what was chosen since."""
    forget_choices()
    with _chosen_lock:
        for target, table in _chosen.items():
            table.update(saved.get(target, {}))


def use_backend() -> bool:
    """Whether a conv call now may run a backend-API plan: timed calls, with the policy allowing it. For the
    "graph" objective only plans whose calls capture into a CUDA graph qualify (``_time_candidates``)."""
    return _policy["backend"] and _policy["mode"] == "time"


def deterministic() -> bool:
    return _policy["deterministic"]


@contextlib.contextmanager
def optimize_for(target: str):
    """``with optimize_for("graph"):`` conv algorithms chosen inside minimize GPU time alone (for a step that
    will be captured); ``"eager"`` (the default) minimizes host work plus GPU time per call."""
    if target not in _chosen:
        raise DnnbindValueError(f"optimize_for: target must be 'eager' or 'graph', got {target!r}")
    prev = getattr(_tls, "objective", "eager")
    _tls.objective = target
    try:
        yield
    finally:
        _tls.objective = prev


def objective() -> str:
    return getattr(_tls, "objective", "eager")


def algo_name(direction: str, algo: int, key: tuple | None = None) -> str:
    if algo >= BACKEND:
        return "backend " + _plan_names.get((key, algo), f"plan #{algo - BACKEND}")
    names = DIRECTIONS["fwd" if direction == "fwd_bias_relu" else direction][3]  # the fused op uses fwd algos
    return names[algo] if 0 <= algo < len(names) else str(algo)


def chosen(target: str | None = None) -> dict:
    """Every (direction, shapes...) -> (algorithm name, workspace bytes) in use for ``target`` (default: the
    current objective), picked in this process or loaded from the on-disk cache."""
    table = _chosen[target or objective()]
    return {k: (algo_name(k[0], a, k), ws) for k, (a, ws) in table.items()}


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


def choose(key: tuple, direction: str, handle: int, descs: tuple, run, device, only=None,
           plans=None) -> tuple[int, int]:
    """(algo, workspace bytes) for ``key``; ``run(algo, ws_ptr, ws_size)`` launches one candidate.
    ``only``: the legacy algorithms allowed (e.g. the fused conv+bias+ReLU supports IMPLICIT_PRECOMP_GEMM).
    ``plans``: a callable returning this shape's backend plans (ops.conv_backend), offered to eager calls."""
    target = objective()
    table = _chosen[target]
    hit = table.get(key)
    if hit is not None:
        return hit
    timed = _policy["mode"] == "time"
    backend = plans is not None and use_backend()
    disk_key = key + (_DISK_OBJECTIVE[target], _policy["deterministic"], _policy["workspace_limit"] >> 20) + \
        (("backend",) if backend else ())
    if timed:
        hit = algo_cache.lookup(_device_identity(device), disk_key)
        if hit is not None and hit[0] >= BACKEND:
            found = plans() if backend else []
            if hit[0] - BACKEND < len(found):  # the same heuristics list as when it was stored
                _plan_names[(key, hit[0])] = found[hit[0] - BACKEND].name
            else:
                hit = None
        if hit is not None and (only is None or hit[0] in only or hit[0] >= BACKEND):
            return _remember(table, key, hit)
    cands = candidates(direction, handle, *descs)
    if only is not None:
        cands = [c for c in cands if c[0] in only]
    if backend:
        for i, plan in enumerate(plans()):
            cands.append((BACKEND + i, plan.workspace_size, True))
            _plan_names[(key, BACKEND + i)] = plan.name
    if not cands:
        raise CudnnError(cudnn.CUDNN_STATUS_NOT_SUPPORTED, DIRECTIONS[direction][0],
                         "no usable algorithm for this configuration", repr(key))
    if not timed or len(cands) == 1:
        best = cands[0][:2]
    else:
        if _TRACE:
            _trace(f"dnnbind conv algo [{target}] timing {key}")
        best = _time_candidates(cands, run, device, target)
        if _TRACE:
            _trace(f"dnnbind conv algo [{target}] chose {best[0]} ({algo_name(direction, best[0], key)})")
        algo_cache.store(_device_identity(device), disk_key, best)
    return _remember(table, key, best)


def _remember(table: dict, key: tuple, choice: tuple) -> tuple:
    """Keep the first choice made for ``key``: two threads timing one new shape at once agree on one."""
    with _chosen_lock:
        return table.setdefault(key, choice)


def _device_identity(device) -> str:
    ident = _identity.get(device.index)
    if ident is None:
        name, major, minor, _ = gpu_properties(device.index)
        ident = _identity[device.index] = f"{name} sm_{major}{minor} cudnn {cudnn.version()}"
    return ident


def _time_candidates(cands, run, device, target: str = "graph") -> tuple[int, int]:
    """The fastest candidate: by GPU time alone for "graph", by host work plus GPU time per call for "eager".

    NOTE: an event pair around one eager call measures cuDNN's host work too (26-150 us per conv call,
    FACTS.md), which swamps 10-40 us kernels. So each candidate is captured into a small CUDA graph of
    REPEAT launches and the graph's replay is timed: kernel time only, as it will run in a captured step.
    A candidate that cannot be captured is timed eagerly instead. The eager objective adds the host time of
    REPEAT calls queued back to back (``_host_time``).
    """
    stream = current_stream(device)
    start, end = Event(device), Event(device)
    results = []
    limit = _policy["workspace_limit"]
    fitting = [c for c in cands if c[1] <= limit] or [min(cands, key=lambda c: c[1])]
    for algo, ws_bytes, _ in fitting:
        # NOTE: each candidate gets its own scratch, freed (stream-ordered) after its timing. Timing from the
        # shared per-stream workspace (ops._common.workspace) would grow it to the largest candidate's size,
        # often gigabytes, and keep it for the life of the process.
        try:
            scratch = DeviceBuffer(ws_bytes, device, stream)
        except CudaError:  # out of memory for this candidate's workspace: it cannot run in this process
            continue
        ptr, size = scratch.ptr, scratch.nbytes
        try:
            run(algo, ptr, size)  # warm-up: the first launch may load kernels
            best_ms = _graph_time(run, algo, ptr, size, stream, start, end)
            if best_ms is None and algo >= BACKEND and target == "graph":
                continue  # a plan that does not capture cannot run inside a captured step
            if best_ms is None:
                best_ms = _event_time(run, algo, ptr, size, stream, start, end)
            host_ms = _host_time(run, algo, ptr, size, stream) if target == "eager" else 0.0
        except CudnnError:
            continue
        finally:
            del scratch
        _trace_candidate(target, algo, host_ms, best_ms)
        results.append((best_ms + host_ms, ws_bytes, algo))
    if not results:
        return fitting[0][:2]
    results.sort()
    # Within TIE of the fastest, the smallest workspace: a step keeps the largest chosen workspace in memory.
    fastest = results[0][0]
    _, ws_bytes, algo = min((r for r in results if r[0] <= fastest * (1 + TIE)), key=lambda r: (r[1], r[0]))
    return algo, ws_bytes


TIE = 0.03  # timing differences below 3% are within run-to-run noise (FACTS.md: repeat timings vary 1-3%)


REPEAT = 5
_TRACE = os.environ.get("DNNBIND_CONV_ALGO_TRACE", "") not in ("", "0")


def _trace_candidate(target: str, algo: int, host_ms: float, gpu_ms: float) -> None:
    if _TRACE:
        _trace(f"dnnbind conv algo [{target}] {algo}: host {host_ms * 1e3:.1f} us, gpu {gpu_ms * 1e3:.1f} us")


def _trace(line: str) -> None:
    """DNNBIND_CONV_ALGO_TRACE=1: how each choice is made, on stderr (the key, each candidate's host and GPU time,
    the winner)."""
    print(line, file=sys.stderr)


def _host_time(run, algo, ptr, size, stream) -> float:
    """Best host ms per call of REPEAT calls queued back to back, the GPU free to lag behind (its queue holds
    far more than REPEAT launches, so the host never waits)."""
    best = float("inf")
    for _ in range(3):
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(REPEAT):
            run(algo, ptr, size)
        best = min(best, (time.perf_counter() - t0) * 1e3 / REPEAT)
    stream.synchronize()
    return best


def _event_time(run, algo, ptr, size, stream, start, end) -> float:
    """Best ms of one eager call between two events: the kernel, plus host work the GPU waited for."""
    best = float("inf")
    for _ in range(3):
        start.record(stream)
        run(algo, ptr, size)
        end.record(stream)
        end.synchronize()
        best = min(best, end.elapsed_ms(start))
    return best


def _graph_time(run, algo, ptr, size, stream, start, end):
    """Best per-launch ms of ``run`` replayed from a captured graph, or None if it cannot be captured."""
    from .._lib import cudart
    stream.device.activate()  # the graph is launched on this stream
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
