"""Trainer.save_states / load_states: optimizer state per Parameter, step counts and lr in one npz file, written
atomically. Layer: gluon; imports ops, gluon.utils. Split from trainer.py.

With Parameters on several contexts every context holds the same state (the same updates ran on each), so the
file holds the first context's and loading writes it into every context.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import json

import numpy as np

from .. import ops
from .utils import atomic_savez

__all__ = ["load_states", "save_states"]


def save_states(trainer, fname) -> None:
    o = trainer._optimizer
    if any(s is not None for s in trainer._custom_states.values()):
        raise DnnbindValueError(f"save_states({fname!r}): the state of the custom optimizer {type(o).__name__} "
                         "cannot be saved (only built-in optimizers' flat state is)")
    meta = {"optimizer": type(o).__name__, "n_states": len(trainer._states), "num_update": o.num_update,
            "lr": o.lr, "names": trainer._names, "counts": trainer._counts.tolist()}
    arrays = {"__meta__": np.array(json.dumps(meta))}
    for i in trainer._trainable():
        a, n = trainer._offsets[i], trainer._params[i]._data.size
        for k, s in enumerate(trainer._states):
            arrays[f"{trainer._names[i]}::state{k}"] = s[a:a + n].numpy()
    atomic_savez(fname, arrays)


def load_states(trainer, fname) -> None:
    o = trainer._optimizer
    with np.load(fname, allow_pickle=False) as f:
        meta = json.loads(str(f["__meta__"]))
        arrays = {k: f[k] for k in f.files if k != "__meta__"}
    if meta["optimizer"] != type(o).__name__ or meta["n_states"] != len(trainer._states):
        raise DnnbindValueError(f"load_states({fname!r}): the file holds {meta['optimizer']} state "
                         f"({meta['n_states']} buffers), this Trainer uses {type(o).__name__} "
                         f"({len(trainer._states)})")
    problems = []
    for i in trainer._trainable():
        n = trainer._params[i]._data.size
        for k in range(len(trainer._states)):
            key = f"{trainer._names[i]}::state{k}"
            if key not in arrays:
                problems.append(f"missing {key}")
            elif arrays[key].size != n:
                problems.append(f"{key}: expected {n} values, the file has {arrays[key].size}")
    if problems:
        raise DnnbindValueError(f"load_states({fname!r}): " + "; ".join(problems))
    for i in trainer._trainable():
        a, n = trainer._offsets[i], trainer._params[i]._data.size
        for b in trainer._bufs:
            for k, s in enumerate(b.states):
                ops.copy(arrays[f"{trainer._names[i]}::state{k}"].astype(s.dtype, copy=False), s[a:a + n])
    counts = dict(zip(meta["names"], meta["counts"]))
    trainer._counts[:] = [counts.get(name, 0) for name in trainer._names]
    o.num_update = int(meta["num_update"])
    if o.lr_scheduler is None:
        o.lr = float(meta["lr"])
