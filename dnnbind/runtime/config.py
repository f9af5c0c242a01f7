"""Layer 1 (runtime): global math mode. Imports nothing of dnnbind.

NOTE: cuDNN's default math lets FP32 convolutions use TF32 tensor cores on Ampere and later (about 3e-4
relative error against float64). dnnbind defaults to strict FP32 (CUDNN_FMA_MATH, cuBLAS default math)
so results match float64 references tightly; ``set_math_mode("tf32")`` opts in to TF32 everywhere.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

_MODES = ("fp32", "tf32")
_state = {"mode": "fp32", "version": 0}


def math_mode() -> str:
    return _state["mode"]


def math_version() -> int:
    """Bumped at each change, so cached descriptors and handles know to refresh."""
    return _state["version"]


def set_math_mode(mode: str) -> str:
    """Select "fp32" (strict, default) or "tf32"; returns the previous mode."""
    mode = str(mode).lower()
    if mode not in _MODES:
        raise DnnbindValueError(f"set_math_mode: mode must be one of {_MODES}, got {mode!r}")
    prev = _state["mode"]
    if mode != prev:
        _state["mode"] = mode
        _state["version"] += 1
    return prev


class math_scope:
    """``with dnnbind.math_scope("tf32"):`` sets the mode and restores the previous one on exit."""

    def __init__(self, mode: str):
        self.mode, self.prev = mode, None

    def __enter__(self):
        self.prev = set_math_mode(self.mode)
        return self

    def __exit__(self, *exc):
        set_math_mode(self.prev)
