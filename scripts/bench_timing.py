"""Timing and memory for scripts/bench_models.py: per framework (dnnbind or torch) a clock (CUDA events on a GPU,
the host clock on the CPU) and a memory gauge (each framework's own allocator), a time budget for a warm-up, and
measure(), which warms a training step up and times it. Layer: script; imports dnnbind, and torch only as passed in.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
import types

import numpy as np

import dnnbind as mx
from dnnbind.serialization import atomic_write


class BudgetExceeded(BaseException):  # not an Exception: torch's own `except Exception` fallbacks must not eat it
    pass


@contextlib.contextmanager
def time_budget(seconds: float | None, what: str):
    """Raise BudgetExceeded in the main thread once `seconds` have passed (SIGALRM; None: no limit)."""
    if not seconds:
        yield
        return

    def expire(*_):
        raise BudgetExceeded(f"{what}: warm-up (compilation) took more than {seconds:g} s (--compile-budget)")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _WallEvent:  # the CPU stand-in for a CUDA event
    def record(self):
        self.t = time.perf_counter()


def clock_for(framework: str, ctx, torch):
    """event(), ms(start, end), sync(): CUDA events on the GPU, the host clock on the CPU."""
    if not ctx.is_gpu:
        return types.SimpleNamespace(event=_WallEvent, ms=lambda a, b: (b.t - a.t) * 1e3, sync=lambda: None)
    if framework == "torch":
        return types.SimpleNamespace(event=lambda: torch.cuda.Event(enable_timing=True),
                                     ms=lambda a, b: a.elapsed_time(b), sync=torch.cuda.synchronize)
    stream = mx.current_stream(ctx)
    return types.SimpleNamespace(event=lambda: mx.Event(ctx), ms=lambda a, b: b.elapsed_ms(a), sync=stream.synchronize)


def memory_for(framework: str, ctx, torch):
    """reset(), peak() -> dict of MiB (or {} on the CPU): each framework's own allocator."""
    if not ctx.is_gpu:
        return types.SimpleNamespace(reset=lambda: None, peak=dict)
    if framework == "torch":
        return types.SimpleNamespace(
            reset=torch.cuda.reset_peak_memory_stats,
            peak=lambda: {"peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                          "reserved_mib": torch.cuda.max_memory_reserved() / 2**20})
    from cuda.bindings import driver
    from cuda.bindings import runtime as rt

    from dnnbind._lib import cudart
    from dnnbind.runtime import memory
    pool = cudart.call("cudaDeviceGetDefaultMemPool", ctx.index)  # dnnbind allocates from it (runtime.memory)
    pool_high = rt.cudaMemPoolAttr.cudaMemPoolAttrUsedMemHigh
    graph_high = rt.cudaGraphMemAttributeType.cudaGraphMemAttrUsedMemHigh

    def reset():  # NOTE: a high watermark can only be reset by writing 0; it restarts from the current use
        cudart.call("cudaMemPoolSetAttribute", pool, pool_high, driver.cuuint64_t(0))
        cudart.call("cudaDeviceSetGraphMemAttribute", ctx.index, graph_high, driver.cuuint64_t(0))

    def peak():
        p = int(cudart.call("cudaMemPoolGetAttribute", pool, pool_high)) / 2**20
        g = int(cudart.call("cudaDeviceGetGraphMemAttribute", ctx.index, graph_high)) / 2**20
        # hybridize() and recorded steps keep their static memory mapped beside the pool (runtime._vmm); it only
        # grows while a recording is alive, so what is mapped now is its high watermark
        r = memory.recordings_reserved() / 2**20
        return {"peak_mib": p + g + r, "pool_mib": p, "graph_mib": g, "recordings_mib": r}
    return types.SimpleNamespace(reset=reset, peak=peak)


def guarded(fn, errors: list):
    """fn() -> its value, or {} with the error noted: memory accounting must never cost a mode its timings."""
    try:
        return fn() or {}
    except Exception as exc:  # noqa: BLE001
        errors.append(f"{type(exc).__name__}: {exc}")
        return {}


def loss_value(loss) -> float:
    """The batch's mean loss: dnnbind's per-sample losses (an NDArray) or torch's scalar tensor."""
    return float(loss.mean().item() if isinstance(loss, mx.NDArray) else loss.detach().float().mean().item())


def measure(step, clock, memory, args, budget=None, what="") -> dict:
    """step(i) for i = 0 .. args.warmup - 1 untimed (under `budget` seconds), then args.steps timed steps: a CUDA
    event after each, one synchronize at the end. The caller resets `memory` before it builds the mode, so the
    warm-up peak includes the setup (recording, capture, compilation)."""
    errors = []
    t0 = time.perf_counter()
    with time_budget(budget, what):
        first = loss_value(step(0))  # from the shared initial weights: agrees across modes where no dropout
        for i in range(1, args.warmup):
            loss = step(i)
        clock.sync()
    warm_s = time.perf_counter() - t0
    warm_peak = guarded(memory.peak, errors).get("peak_mib")
    guarded(memory.reset, errors)
    events = [clock.event() for _ in range(args.steps + 1)]
    t0 = time.perf_counter()
    events[0].record()
    for i in range(args.steps):  # no synchronization inside the timed block
        loss = step(args.warmup + i)
        events[i + 1].record()
    clock.sync()
    wall = time.perf_counter() - t0
    ms = np.array([clock.ms(a, b) for a, b in itertools.pairwise(events)])
    return {"status": "ok", "ms": float(np.median(ms)), "ms_p10": float(np.percentile(ms, 10)),
            "ms_p90": float(np.percentile(ms, 90)), "ms_wall_mean": wall * 1e3 / args.steps,
            "images_per_s": args.batch * 1e3 / float(np.median(ms)), "warmup_s": warm_s,
            "peak_warmup_mib": warm_peak, **guarded(memory.peak, errors),
            "first_loss": first, "final_loss": loss_value(loss),
            **({"memory_error": errors[0]} if errors else {})}


def save_json(path: str, obj) -> None:
    """Write a benchmark's results to ``path`` atomically (serialization.atomic_write): the scripts rewrite the file
    after every mode so a run cut short keeps its numbers, and a kill in the middle of a write must then leave the
    previous complete file, not half of the new one."""
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))
