"""MXNet's ``mx.optimizer.Updater`` / ``get_updater``: an optimizer applied one key at a time with per-key state,
as a KVStore's ``set_optimizer`` (dnnbind.kvstore) and MXNet programs that update by hand use it. Layer: gluon;
imports runtime.
"""

from __future__ import annotations

import pickle

import numpy as np

from ..runtime.array import NDArray, array

__all__ = ["Updater", "get_updater"]


class Updater:
    """``mx.optimizer.get_updater(optimizer)``: ``updater(key, grad, weight)`` updates ``weight`` in place with
    per-key state made on first use (MXNet's Updater, one key at a time)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.states: dict = {}
        self.states_synced: dict = {}

    def __call__(self, index, grad: NDArray, weight: NDArray) -> None:
        if isinstance(index, bytes):
            index = index.decode()
        if index not in self.states:
            self.states[index] = self.optimizer.create_state_multi_precision(index, weight)
            self.states_synced[index] = True
        elif not self.states_synced[index]:  # loaded from a file: onto the weight's device
            self.states[index] = _state_to(self.states[index], weight.device)
            self.states_synced[index] = True
        self.optimizer.update_multi_precision(index, weight, grad, self.states[index])

    def get_states(self, dump_optimizer: bool = False) -> bytes:
        states = {k: _state_to(v, None) for k, v in self.states.items()}
        return pickle.dumps((states, self.optimizer) if dump_optimizer else states)

    def set_states(self, states: bytes) -> None:
        states = pickle.loads(states)
        if isinstance(states, tuple) and len(states) == 2:
            self.states, self.optimizer = states
        else:
            self.states = states
        self.states_synced = dict.fromkeys(self.states, False)


def get_updater(optimizer) -> Updater:
    return Updater(optimizer)


def _state_to(state, device):
    """An optimizer state (None, an array or nested tuples/lists of them) as numpy (device None) or as NDArrays
    on ``device``."""
    if isinstance(state, (tuple, list)):
        return type(state)(_state_to(s, device) for s in state)
    if device is None:
        return state.numpy() if isinstance(state, NDArray) else state
    if isinstance(state, np.ndarray):
        return array(state, device=device)
    return state.to(device) if isinstance(state, NDArray) else state
