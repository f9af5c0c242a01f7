"""Trainer (``mxnet.gluon.Trainer``): applies an Optimizer to a set of Parameters.
Layer: gluon; imports autograd, ops, runtime, gluon.parameter, gluon.optimizer.

Flat buffers: when it is created (or on the first step, if shapes were still deferred) the Trainer moves
every trainable Parameter's data and gradient into views of ONE flat data buffer and ONE flat gradient
buffer on the device, grouped by (lr_mult, wd_mult), each view starting on a 64-element (256-byte)
boundary so cuDNN/cuBLAS see aligned pointers. Values are copied in and autograd is re-pointed at the new
gradient views (``mark_variables``), so backward writes straight into the flat gradient and a step is a
few ops per group over the whole model. Arrays obtained from ``param.data()`` *before* the Trainer was
created are stale afterwards: fetch them again.

``step(batch_size)`` sets ``rescale_grad = 1 / batch_size`` (the loss was summed over the batch by
backward) and refuses gradients that no backward wrote since the last step, as MXNet does.

Mixed precision (``net.cast('float16')``, BatchNorm staying float32): float16 Parameters keep their data and
gradients in float16 buffers of their own, and the flat float32 buffers hold their *master* copy, so the update
runs in float32 on float32 weights and optimizer state: one cast of all float16 gradients in, one of all updated
weights out. This is MXNet's ``multi_precision=True``; float16 Parameters get it whatever the flag says (updating
float16 weights in float16 loses small updates, which MXNet only warns about). As in MXNet, the master copy is
the optimizer's: ``set_data`` on a float16 Parameter after the Trainer packed it does not reach it.
"""

from __future__ import annotations

import json

import numpy as np

from .. import autograd, ops
from ..runtime.array import zeros
from . import optimizer as opt
from .parameter import Parameter, ParameterDict
from .utils import atomic_savez

__all__ = ["StaleGradientError", "Trainer"]

ALIGN = 64  # elements; 256 bytes of float32, the alignment cuDNN/cuBLAS like for every tensor


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class StaleGradientError(RuntimeError, UserWarning):
    """A Parameter's gradient was not written by backward since the last step (MXNet raises UserWarning)."""


class _Group:
    """Parameters sharing (lr_mult, wd_mult): one contiguous slice [start, end) of the flat buffers."""

    def __init__(self, lr_mult: float, wd_mult: float, members: list, start: int, end: int):
        self.lr_mult, self.wd_mult, self.members, self.start, self.end = lr_mult, wd_mult, members, start, end
        self.data = self.grad = None
        self.states: tuple = ()


class Trainer:
    """``Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4})``."""

    def __init__(self, params, optimizer, optimizer_params: dict | None = None, kvstore="device",
                 compression_params=None, update_on_kvstore=None):
        if isinstance(params, (dict, ParameterDict)):
            items = list(params.items())
        elif isinstance(params, (list, tuple)):
            items = [(p.display_name if isinstance(p, Parameter) else str(p), p) for p in params]
        else:
            raise TypeError(f"Trainer: first argument must be a ParameterDict, dict or list of Parameters, got "
                            f"{type(params).__name__}")
        self._names, self._params, seen = [], [], set()
        for name, p in items:
            if not isinstance(p, Parameter):
                raise TypeError(f"Trainer: `{name}` is a {type(p).__name__}, not a Parameter")
            if id(p) not in seen:  # a shared Parameter is updated once
                seen.add(id(p))
                self._names.append(name)
                self._params.append(p)
        self._optimizer = opt.create(optimizer, **(optimizer_params or {}))
        self._optimizer.param_dict = dict(enumerate(self._params))  # lr_mult/wd_mult for custom optimizers
        self._scale = self._optimizer.rescale_grad
        # Per-Parameter update count (Adam's t), starting at begin_num_update as MXNet's _update_count does.
        self._counts = np.full(len(self._params), self._optimizer.begin_num_update, np.int64)
        self._custom_states: dict[int, object] = {}  # state of a custom (per-Parameter) optimizer, by index
        self._layout = None  # set by _pack: what each Parameter must still be for the packing to hold
        self._carried_fresh: set[int] = set()
        self._amp_loss_scaler = None  # dnnbind.amp.init_trainer sets it (and _amp_original_scale)
        if all(p._data is not None for p in self._params):
            self._pack()

    # -- packing ------------------------------------------------------------------------------------------
    def _trainable(self) -> list[int]:
        return [i for i, p in enumerate(self._params) if p.grad_req != "null"]

    def _pack(self) -> None:
        """Move trainable Parameters into views of the flat buffers (keeping data, grads, optimizer state)."""
        params, trainable = self._params, self._trainable()
        for i in trainable:
            params[i].data()  # raises the clear deferred/uninitialized error if a shape is still unknown
        if not trainable:
            self._layout = [(p._data, p._grad, p.grad_req) for p in params]
            self._groups, self._offsets, self._states, self._half_end = [], {}, (), 0
            return
        where = {i: params[i]._ctx for i in trainable}
        if len(set(where.values())) > 1:
            listing = ", ".join(f"{self._names[i]} on {d!r}" for i, d in where.items())
            raise ValueError(f"Trainer: all Parameters must be on one device, found {listing}")
        dtypes = {params[i].dtype for i in trainable}
        half = np.dtype(np.float16)
        if half in dtypes and dtypes <= {half, np.dtype(np.float32)}:
            dtype = np.dtype(np.float32)  # mixed precision: float32 master weights (module docstring)
        elif len(dtypes) > 1:
            raise ValueError(f"Trainer: all trainable Parameters must share one dtype (or be float16 and float32), "
                             f"found {sorted(map(str, dtypes))}")
        else:
            dtype = next(iter(dtypes))
        device = where[trainable[0]]
        keys: dict[tuple, list[int]] = {}
        for i in sorted(trainable, key=lambda i: params[i].dtype != half):  # float16 first: one contiguous range
            keys.setdefault((params[i].dtype == half, params[i].lr_mult, params[i].wd_mult), []).append(i)
        offsets, groups, off, half_end = {}, [], 0, 0
        for (is_half, lr_mult, wd_mult), members in keys.items():
            start = off
            for i in members:
                offsets[i] = off
                off = _align(off + params[i].data().size)
            groups.append(_Group(lr_mult, wd_mult, members, start, off))
            half_end = off if is_half else half_end
        total = max(off, ALIGN)
        flat_data, flat_grad = zeros((total,), dtype, device), zeros((total,), dtype, device)
        half_data = half_grad = None
        if half_end:  # the float16 Parameters' own data and gradients, laid out like the master range
            half_data, half_grad = zeros((half_end,), half, device), zeros((half_end,), half, device)
        states = self._optimizer.create_state_flat(total, dtype, device)
        old_states = getattr(self, "_states", None)
        for i in trainable:
            p, o = params[i], offsets[i]
            n = p._data.size
            if p.dtype == half:
                ops.copy(p._data.astype(dtype).reshape((n,)), flat_data[o:o + n])  # the master copy
                data, grad = half_data, half_grad
            else:
                data, grad = flat_data, flat_grad
            data_view = data[o:o + n].reshape(p._data.shape)
            grad_view = grad[o:o + n].reshape(p._data.shape)
            ops.copy(p._data, data_view)
            if p._grad is not None:
                ops.copy(p._grad, grad_view)
            if old_states and i in self._offsets:  # repacking: carry momentum / moments over
                oo = self._offsets[i]
                for new, old in zip(states, old_states):
                    ops.copy(old[oo:oo + n], new[o:o + n])
            # A backward that ran before packing marked the old array fresh: carry that over to the view.
            if autograd.is_fresh(p._data):
                self._carried_fresh.add(i)
                autograd.clear_fresh(p._data)
            p._rebind(data_view, grad_view)
        for g in groups:  # the views one step hands to the optimizer, made once
            g.data, g.grad = flat_data[g.start:g.end], flat_grad[g.start:g.end]
            g.states = tuple(s[g.start:g.end] for s in states)
        self._flat_data, self._flat_grad, self._states = flat_data, flat_grad, states
        self._half_data, self._half_grad, self._half_end = half_data, half_grad, half_end
        self._offsets, self._groups = offsets, groups
        self._layout = [(p._data, p._grad, p.grad_req) for p in params]

    def _ensure_packed(self) -> None:
        layout = self._layout
        if layout is None or any(p._data is not d or p._grad is not g or p.grad_req != r
                                 for p, (d, g, r) in zip(self._params, layout)):
            self._pack()  # first step, or a Parameter moved (reset_ctx, grad_req change, another Trainer)

    # -- public API ---------------------------------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        return self._optimizer.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    @property
    def optimizer(self) -> opt.Optimizer:
        return self._optimizer

    def state_arrays(self) -> list:
        """The device arrays a step changes (flat data, flat grads, optimizer state), packed first.

        A CUDA-graph capture (dnnbind.graph.CapturedStep) snapshots these before its warm-up steps and restores
        them after. Host-side scalars are baked into a capture: a captured step replays the lr (and Adam's
        bias correction) of the capture.
        """
        self._ensure_packed()
        if not self._groups:
            return []
        half = [self._half_data, self._half_grad] if self._half_end else []
        return [self._flat_data, self._flat_grad, *half, *self._states]

    def zero_grad(self) -> None:
        """Zero every gradient at once: one memset over the flat gradient buffer (for grad_req='add')."""
        self._ensure_packed()
        if self._groups:
            self._flat_grad.zero_()
            if self._half_end:
                self._half_grad.zero_()

    def allreduce_grads(self) -> None:
        """Nothing to reduce: one device, gradients already in the flat buffer."""

    def step(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """One update with gradients scaled by 1/batch_size."""
        self._optimizer.rescale_grad = self._scale / batch_size
        self._ensure_packed()
        self._update(ignore_stale_grad)

    def update(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        self.step(batch_size, ignore_stale_grad)

    def _update(self, ignore_stale_grad: bool) -> None:
        params, trainable = self._params, self._trainable()
        fresh = [i for i in trainable if i in self._carried_fresh or autograd.is_fresh(params[i]._data)]
        if len(fresh) != len(trainable) and not ignore_stale_grad:
            stale = [i for i in trainable if i not in set(fresh)]
            i = stale[0]
            more = f" (and {len(stale) - 1} more: {', '.join(self._names[j] for j in stale[1:6])})" \
                if len(stale) > 1 else ""
            raise StaleGradientError(
                f"Gradient of Parameter `{self._names[i]}` on context {params[i]._ctx!r} has not been updated by "
                f"backward since last `step`{more}. This could mean a bug in your model that made it only use a "
                "subset of the Parameters (Blocks) for this iteration. If you are intentionally only using a subset, "
                "call step with ignore_stale_grad=True to suppress this warning and skip updating of Parameters "
                "with stale gradient")
        o = self._optimizer
        if o.per_parameter:
            self._update_custom(fresh)
            return
        if fresh:
            o.num_update = max(o.num_update, int(self._counts[fresh].max()) + 1)
        lr, wd = o.learning_rate, o.wd
        fresh_set = set(fresh)
        h = self._half_end
        if h:  # float16 gradients into the float32 master range: the update runs in float32
            ops.copy(self._half_grad.astype(np.float32), self._flat_grad[:h])
        scaler = self._amp_loss_scaler
        if scaler is not None and self._groups:  # dnnbind.amp: skip a step whose gradients overflowed
            overflow = not np.isfinite(float(self._flat_grad.sum().asscalar()))  # inf/NaN anywhere: one read
            scaler.update_scale(overflow)
            if overflow:
                for i in trainable:
                    autograd.clear_fresh(params[i]._data)
                self._carried_fresh.clear()
                return
        for g in self._groups:
            counts = self._counts[g.members]
            if all(i in fresh_set for i in g.members) and (counts == counts[0]).all():
                # The fast path: the whole group in a handful of ops over its flat slice.
                o.update_flat(g.data, g.grad, g.states, lr * g.lr_mult, wd * g.wd_mult, int(counts[0]) + 1)
                self._counts[g.members] += 1
                continue
            for i in g.members:  # some stale (skipped) or out-of-step counts: one Parameter at a time
                if i in fresh_set:
                    a, b = self._offsets[i], self._offsets[i] + params[i]._data.size
                    o.update_flat(self._flat_data[a:b], self._flat_grad[a:b], tuple(s[a:b] for s in self._states),
                                  lr * g.lr_mult, wd * g.wd_mult, int(self._counts[i]) + 1)
                    self._counts[i] += 1
        if h:  # the updated master weights, rounded to the float16 Parameters
            ops.copy(self._flat_data[:h].astype(np.float16), self._half_data)
        for i in trainable:
            autograd.clear_fresh(params[i]._data)
        self._carried_fresh.clear()

    def _update_custom(self, fresh: list[int]) -> None:
        """A custom optimizer (MXNet's ``update(index, weight, grad, state)``): one Parameter at a time."""
        o, params = self._optimizer, self._params
        for i in fresh:
            p = params[i]
            if i not in self._custom_states:
                self._custom_states[i] = o.create_state_multi_precision(i, p.data())
            o.update_multi_precision(i, p.data(), p.grad(), self._custom_states[i])
            self._counts[i] += 1
        for i in self._trainable():
            autograd.clear_fresh(params[i]._data)
        self._carried_fresh.clear()

    # -- checkpoints --------------------------------------------------------------------------------------
    def save_states(self, fname) -> None:
        """Optimizer state (momentum / Adam moments per Parameter), step counts and lr; atomic."""
        self._ensure_packed()
        o = self._optimizer
        if any(s is not None for s in self._custom_states.values()):
            raise ValueError(f"save_states({fname!r}): the state of the custom optimizer {type(o).__name__} "
                             "cannot be saved (only built-in optimizers' flat state is)")
        meta = {"optimizer": type(o).__name__, "n_states": len(self._states), "num_update": o.num_update,
                "lr": o.lr, "names": self._names, "counts": self._counts.tolist()}
        arrays = {"__meta__": np.array(json.dumps(meta))}
        for i in self._trainable():
            a, n = self._offsets[i], self._params[i]._data.size
            for k, s in enumerate(self._states):
                arrays[f"{self._names[i]}::state{k}"] = s[a:a + n].numpy()
        atomic_savez(fname, arrays)

    def load_states(self, fname) -> None:
        """Restore what save_states wrote; the Parameters must be initialized (load_parameters first)."""
        self._ensure_packed()
        o = self._optimizer
        with np.load(fname, allow_pickle=False) as f:
            meta = json.loads(str(f["__meta__"]))
            arrays = {k: f[k] for k in f.files if k != "__meta__"}
        if meta["optimizer"] != type(o).__name__ or meta["n_states"] != len(self._states):
            raise ValueError(f"load_states({fname!r}): the file holds {meta['optimizer']} state "
                             f"({meta['n_states']} buffers), this Trainer uses {type(o).__name__} "
                             f"({len(self._states)})")
        problems = []
        for i in self._trainable():
            a, n = self._offsets[i], self._params[i]._data.size
            for k, s in enumerate(self._states):
                key = f"{self._names[i]}::state{k}"
                if key not in arrays:
                    problems.append(f"missing {key}")
                elif arrays[key].size != n:
                    problems.append(f"{key}: expected {n} values, the file has {arrays[key].size}")
        if problems:
            raise ValueError(f"load_states({fname!r}): " + "; ".join(problems))
        for i in self._trainable():
            a, n = self._offsets[i], self._params[i]._data.size
            for k, s in enumerate(self._states):
                ops.copy(arrays[f"{self._names[i]}::state{k}"].astype(s.dtype, copy=False), s[a:a + n])
        counts = dict(zip(meta["names"], meta["counts"]))
        self._counts[:] = [counts.get(name, 0) for name in self._names]
        o.num_update = int(meta["num_update"])
        if o.lr_scheduler is None:
            o.lr = float(meta["lr"])
