"""Trainer.save_states / load_states: optimizer state per Parameter, step counts and lr in one npz file, written
atomically. Layer: gluon; imports ops, serialization, gluon.utils. Split from trainer.py.

With Parameters on several contexts every context holds the same state (the same updates ran on each), so the
file holds the first context's and loading writes it into every context.

Loading checks the whole file before it changes anything: a corrupt or truncated file, or one written for
another model (names, shapes) or another optimizer, is one DnnbindValueError (a CheckpointFileError for damage)
naming the file and what is wrong, and the Trainer is left as it was. ``fname`` may also be a binary file object
(scripts/train.py keeps the states inside its own checkpoint); its ``name`` attribute names it in errors.
"""

from __future__ import annotations

import json
import math

import numpy as np

from .. import ops
from .._lib.errors import DnnbindValueError
from ..serialization import load_npz
from .utils import atomic_savez

__all__ = ["load_states", "save_states"]


def _name(fname) -> str:
    return str(fname) if not hasattr(fname, "read") and not hasattr(fname, "write") else \
        str(getattr(fname, "name", "<stream>"))


def save_states(trainer, fname) -> None:
    o = trainer._optimizer
    if any(s is not None for s in trainer._custom_states.values()):
        raise DnnbindValueError(f"save_states({_name(fname)!r}): the state of the custom optimizer "
                                f"{type(o).__name__} cannot be saved (only built-in optimizers' flat state is)")
    meta = {"optimizer": type(o).__name__, "n_states": len(trainer._states), "num_update": o.num_update,
            "lr": o.lr, "names": trainer._names, "counts": trainer._counts.tolist()}
    arrays = {"__meta__": np.array(json.dumps(meta))}
    for i in trainer._trainable():
        p = trainer._params[i]
        a, n = trainer._offsets[i], p._data.size
        for k, s in enumerate(trainer._states):
            arrays[f"{trainer._names[i]}::state{k}"] = s[a:a + n].numpy().reshape(p._data.shape)
    if hasattr(fname, "write"):
        np.savez(fname, **arrays)
    else:
        atomic_savez(fname, arrays)


def _meta(arrays: dict, where: str) -> dict:
    """The ``__meta__`` entry, parsed and type-checked (a damaged one is a ValueError, not a KeyError later)."""
    raw = arrays.pop("__meta__", None)
    if raw is None or raw.dtype.kind != "U" or raw.ndim != 0:
        raise DnnbindValueError(f"{where}: not a Trainer states file (no __meta__ text entry; "
                                f"entries: {', '.join(sorted(arrays)[:5]) or 'none'})")
    try:
        meta = json.loads(str(raw))
    except ValueError as exc:
        raise DnnbindValueError(f"{where}: the __meta__ entry is not valid JSON ({exc})") from None
    ok = isinstance(meta, dict) and isinstance(meta.get("optimizer"), str) and \
        all(isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) and meta[k] >= 0
            for k in ("n_states", "num_update")) and \
        isinstance(meta.get("lr"), (int, float)) and math.isfinite(meta["lr"]) and meta["lr"] >= 0 and \
        isinstance(meta.get("names"), list) and all(isinstance(n, str) for n in meta["names"]) and \
        isinstance(meta.get("counts"), list) and len(meta["counts"]) == len(meta["names"]) and \
        all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in meta["counts"])
    if not ok:
        raise DnnbindValueError(f"{where}: the __meta__ entry is damaged (expected optimizer, n_states, num_update, "
                                f"lr, names and counts; got {str(raw)[:200]!r})")
    return meta


def _listed(items: list, limit: int = 5, sep: str = ", ") -> str:
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return sep.join(items[:limit]) + more


def load_states(trainer, fname) -> None:
    o = trainer._optimizer
    where = f"load_states({_name(fname)!r})"
    arrays = load_npz(fname)  # damage: CheckpointFileError naming the file
    meta = _meta(arrays, where)
    if meta["optimizer"] != type(o).__name__ or meta["n_states"] != len(trainer._states):
        raise DnnbindValueError(f"{where}: the file holds {meta['optimizer']} state "
                                f"({meta['n_states']} buffers), this Trainer uses {type(o).__name__} "
                                f"({len(trainer._states)})")
    missing, problems = [], []
    for i in trainer._trainable():
        shape = trainer._params[i]._data.shape
        for k in range(len(trainer._states)):
            key = f"{trainer._names[i]}::state{k}"
            arr = arrays.get(key)
            if arr is None:
                missing.append(key)
            elif arr.dtype.kind != "f":
                problems.append(f"{key} has dtype {arr.dtype}, not a float type")
            elif arr.shape != shape and (arr.ndim != 1 or arr.size != math.prod(shape)):  # (1-d: older files)
                problems.append(f"{key}: this model's Parameter has shape {shape}, the file's state {arr.shape}")
    known = set(trainer._names)
    extra = [f"{name}::state{k}" for name in meta["names"] if name not in known for k in range(meta["n_states"])
             if f"{name}::state{k}" in arrays]  # (a Parameter frozen since is still known: its state is skipped)
    if extra:
        problems.insert(0, f"state for {_listed(extra)}, which this Trainer does not have")
    if missing:
        problems.insert(0, f"no state for {_listed(missing)}")
    if problems:
        hint = " (a file of another model?)" if missing or extra or len(problems) > 1 else ""
        raise DnnbindValueError(f"{where}: {_listed(problems, 4, '; ')}{hint}")
    for i in trainer._trainable():
        a, n = trainer._offsets[i], trainer._params[i]._data.size
        for b in trainer._bufs:
            for k, s in enumerate(b.states):
                flat = arrays[f"{trainer._names[i]}::state{k}"].reshape(-1)
                ops.copy(np.ascontiguousarray(flat, dtype=s.dtype), s[a:a + n])
    counts = dict(zip(meta["names"], meta["counts"]))
    trainer._counts[:] = [counts.get(name, 0) for name in trainer._names]
    o.num_update = int(meta["num_update"])
    if o.lr_scheduler is None:
        o.lr = float(meta["lr"])
