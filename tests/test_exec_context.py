"""No call that queues GPU work relies on whichever device happens to be current (CPU, by reading the source).

CUDA refuses (or, for cuBLAS, silently misbehaves on) a copy, memset, allocation, launch or collective queued on a
stream of a device that is not the current one, and "the current device" is per-thread state that any code may
change (a Block on gpu(1), torch.cuda.set_device, a raw cudaSetDevice). dnnbind's rule: a stream carries its device,
and every function that hands a stream to CUDA, NCCL or a library makes that device current first
(``Device.activate``, ``kernels.devices.make_current``, ``cudart.use_context``, or a handle lookup, which activates).
This test walks dnnbind's source and finds every call site that passes a stream to such a function; the function
around it must make a device current. The GPU half (tests/test_exec_context_gpu.py) runs every family with the
other GPU current on purpose.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "dnnbind"

# Functions that queue work on the stream they are given (runtime, driver, NCCL, library stream binding).
QUEUEING = {
    "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMallocAsync", "cudaFreeAsync", "cudaMemcpyPeerAsync",
    "cudaMemcpy2DAsync", "cudaEventRecord", "cudaStreamWaitEvent", "cudaLaunchHostFunc", "cudaGraphLaunch",
    "cuLaunchKernel", "cuMemcpyAsync", "cuMemsetD8Async", "cudnnSetStream", "cublasSetStream_v2",
    "ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter", "ncclReduce", "ncclSend", "ncclRecv",
}
# Calls that make a device current (or return a handle after making its device current).
ACTIVATING = {"activate", "make_current", "use_context", "cudnn_handle", "cublas_handle", "dnn", "blas",
              "_stream", "stream_device", "current_device", "resolve_stream"}

# Call sites whose device is made current by every caller, with the reason; each one is checked to exist.
CALLER_ACTIVATES = {
    # A recording's replay restores each call's context (recording._contexts) before the loop that issues them.
    ("recording.py", "_replay_calls"): "replay() calls cudart.use_context for the first call's device",
    ("recording.py", "_capture"): "called from replay() after cudart.use_context",
    # The recording hook re-issues calls already made (in the right context) at record time.
    ("recording.py", "runtime"): "records a call already issued by runtime.memory, which activated its device",
    ("recording.py", "launch"): "records a launch already issued by kernels.launch, which made its device current",
    ("recording.py", "_replay_parts"): "called by replay() after it made the recording's context current "
                                       "(cudart.use_context), for one-context recordings only",
    # Handles are created inside _create under the lock, after cudnn_handle/cublas_handle activated the device.
    ("runtime/handles.py", "__init__"): "CudnnHandle/CublasHandle: created by cudnn_handle/cublas_handle, "
                                        "which activate the device, and each also calls device.activate()",
    # DeviceBuffer's allocation: from __init__, which activates the device first, or from _on_current, reached only
    # through allocate_current, whose caller (ExecContext.empty) runs under exec_context(), which activated it.
    ("runtime/memory.py", "_allocate"): "DeviceBuffer._allocate: called by __init__ after device.activate(), and by "
                                        "_on_current for allocate_current's callers, which run under exec_context()",
}


def _name(call: ast.Call) -> str | None:
    """The CUDA/library function a call reaches: ``cudart.call("name", ...)``, ``x.name(...)``, ``name(...)``, or
    ``_cu_launch()(...)`` (kernels.launch's cached cuLaunchKernel)."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "call" and call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value if isinstance(call.args[0].value, str) else None
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "_cu_launch":
        return "cuLaunchKernel"
    return None


def _partial_target(call: ast.Call) -> str | None:
    """``functools.partial(cudart.call, "name")`` / ``partial(driver_call, "cuLaunchKernel")``: the function bound."""
    f = call.func
    is_partial = (isinstance(f, ast.Attribute) and f.attr == "partial") or (isinstance(f, ast.Name) and f.id == "partial")
    if is_partial and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        return call.args[1].value
    return None


def violations(source: str, where: str) -> list[str]:
    """Functions of ``source`` that pass a stream to a QUEUEING function without making a device current."""
    tree = ast.parse(source)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        queued, activates = [], False
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node)
            if name in ACTIVATING:
                activates = True
            if name in QUEUEING or _partial_target(node) in QUEUEING:
                queued.append((node.lineno, name if name in QUEUEING else _partial_target(node)))
        if queued and not activates and (where, fn.name) not in CALLER_ACTIVATES:
            found += [f"{where}:{line} {fn.name}() calls {name} without making its stream's device current"
                      for line, name in queued]
    return found


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_every_call_that_queues_on_a_stream_makes_its_device_current():
    problems = [v for where, src in _sources() for v in violations(src, where)]
    assert not problems, "\n".join(problems)


def test_the_exemptions_still_exist():
    """An exemption whose function is gone or no longer queues anything must be removed."""
    sources = dict(_sources())
    for (where, name), why in CALLER_ACTIVATES.items():
        tree = ast.parse(sources[where])
        fns = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == name]
        assert fns, f"{where}: {name}() is exempt ({why}) but no longer exists"


def test_the_scan_finds_a_queueing_call_without_its_device():
    bad = '''
def copy(dst, src, n, stream):
    cudart.call("cudaMemcpyAsync", dst, src, n, 3, stream.handle)

def launch(fn, h, params):
    err, = _cu_launch()(fn, 1, 1, 1, 32, 1, 1, 0, h, params, 0)

def reduce(self, x):
    nccl.lib.ncclAllReduce(x.ptr, x.ptr, x.size, 7, 0, self.handle, stream)
'''
    found = violations(bad, "fake.py")
    assert [f.split()[3] for f in found] == ["cudaMemcpyAsync", "cuLaunchKernel", "ncclAllReduce"], found
    good = '''
def copy(dst, src, n, stream):
    stream.device.activate()
    cudart.call("cudaMemcpyAsync", dst, src, n, 3, stream.handle)
'''
    assert violations(good, "fake.py") == []


@pytest.mark.parametrize("fn", ["cudnn_handle", "cublas_handle"])
def test_handle_lookups_make_their_device_current(fn):
    """Every cuDNN and cuBLAS call takes its handle from these two, so their activation covers the libraries."""
    tree = ast.parse((ROOT / "runtime" / "handles.py").read_text())
    body = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == fn)
    first = body.body[1] if isinstance(body.body[0], ast.Expr) and isinstance(body.body[0].value, ast.Constant) \
        else body.body[0]
    assert isinstance(first, ast.Expr) and _name(first.value) == "activate", \
        f"runtime/handles.py {fn}() must make the device current before anything else"
