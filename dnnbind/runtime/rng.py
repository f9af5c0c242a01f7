"""Layer runtime: dnnbind's one seedable random state (what ``mx.random.seed`` resets). Imports numpy only.

Every random source takes from it: nd.random's draws a ``(seed, offset)`` slice each (``take``), dropout a seed for
the generator it keeps (``next_seed``), host-side shuffles numpy's PCG64 seeded from it (``host_rng``).
``generation()`` counts ``reseed`` calls: state seeded once and kept (cuDNN dropout's RNG states, ops.dropout)
compares it with the generation it was seeded in and seeds itself again when they differ. It sits below ops and nd
so that both draw from the same state.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["generation", "host_rng", "next_seed", "reseed", "take"]

_lock = threading.Lock()
_state = {"seed": int(np.random.SeedSequence().entropy % (1 << 62)), "offset": 0, "rng": None, "generation": 0}


def reseed(seed: int) -> None:
    with _lock:
        _state["seed"], _state["offset"], _state["rng"] = int(seed) % (1 << 62), 0, None
        _state["generation"] += 1


def take(n: int) -> tuple[int, int]:
    """(seed, offset) for a draw of ``n`` numbers; the state advances past them."""
    with _lock:
        off = _state["offset"]
        _state["offset"] = off + ((int(n) + 3) // 4) * 4 + 4
        return _state["seed"], off


def next_seed() -> int:
    """A fresh 63-bit seed for a kernel with its own counter (dropout), from the shared state."""
    s, off = take(1)
    x = (s * 0x9E3779B97F4A7C15 + off * 0xBF58476D1CE4E5B9 + 1) & ((1 << 64) - 1)
    x ^= x >> 31
    return x & ((1 << 62) - 1)


def generation() -> int:
    """How many times ``reseed()`` has been called (see the module docstring)."""
    return _state["generation"]


def host_rng() -> np.random.Generator:
    with _lock:
        if _state["rng"] is None:
            _state["rng"] = np.random.Generator(np.random.PCG64(_state["seed"]))
        return _state["rng"]
