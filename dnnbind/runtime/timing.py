"""Layer 1 (runtime): timing GPU work, seed 003's ``show_time`` done with CUDA events. Imports runtime.

Host timers around asynchronous launches measure the launch, not the work (seed 003's warning). Events
recorded on the stream around each call time the GPU work itself; the host-side cost is reported too,
because for small ops it is what bounds the step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .device import as_device
from .stream import Event, current_stream


@dataclass
class Timing:
    name: str
    gpu_us: list = field(default_factory=list)   # per call, from CUDA events (empty on cpu)
    wall_us: list = field(default_factory=list)  # per call, host wall time including a synchronize
    result: object = None

    @property
    def median_us(self) -> float:
        return statistics.median(self.gpu_us or self.wall_us)

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.gpu_us or self.wall_us)

    def __str__(self) -> str:
        kind = "GPU" if self.gpu_us else "wall"
        return (f"{self.name}: median {self.median_us:.3f} us, mean {self.mean_us:.3f} us, "
                f"min {min(self.gpu_us or self.wall_us):.3f} us ({kind}, {len(self.wall_us)} runs)")


def show_time(func, warmup: int = 10, repeat: int = 100, device=None, name: str | None = None) -> Timing:
    """Warm up, then time ``func()`` ``repeat`` times; median/mean over runs. Returns a Timing."""
    device = as_device(device)
    timing = Timing(name or getattr(func, "__name__", "func"))
    for _ in range(warmup):
        func()
    if device.is_gpu:
        stream = current_stream(device)
        stream.synchronize()
        start, end = Event(device), Event(device)
        for _ in range(repeat):
            t0 = time.perf_counter()
            start.record(stream)
            timing.result = func()
            end.record(stream)
            end.synchronize()
            timing.wall_us.append((time.perf_counter() - t0) * 1e6)
            timing.gpu_us.append(end.elapsed_ms(start) * 1e3)
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            timing.result = func()
            timing.wall_us.append((time.perf_counter() - t0) * 1e6)
    return timing
