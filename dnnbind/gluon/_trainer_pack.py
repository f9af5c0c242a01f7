"""The Trainer's flat buffers: every trainable Parameter's data and gradient moved into views of one flat data and
one flat gradient buffer per context (gluon/trainer.py's docstring says why). Layer: gluon; imports autograd, ops,
runtime. Split from trainer.py.

Every context gets the same layout, so the k-th context's buffers hold copy k of every Parameter at the same
offsets: one all-reduce per buffer sums the gradients of all Parameters, and one update per group runs on each.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import numpy as np

from .. import autograd, ops
from ..runtime.array import zeros
from .grad_reduce import ALIGN

__all__ = ["ALIGN", "pack", "same_layout"]

_HALF = np.dtype(np.float16)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Group:
    """Parameters sharing (lr_mult, wd_mult): one contiguous slice [start, end) of the flat buffers.
    ``data``/``grad``/``states`` are the first context's views of it (the others' are in _Buffers.views)."""

    def __init__(self, lr_mult: float, wd_mult: float, members: list, start: int, end: int):
        self.lr_mult, self.wd_mult, self.members, self.start, self.end = lr_mult, wd_mult, members, start, end
        self.data = self.grad = None
        self.states: tuple = ()


class _Buffers:
    """One context's flat buffers, and per group the (data, grad, states) views one step hands the optimizer.

    ``grad`` covers offsets [grad_base, total): with float16 Parameters updated straight from their float16
    gradients (the Trainer's one-pass update), nothing reads a float32 gradient for them, so their range of it is
    not allocated (grad_base = half_end; on AlexNet that is 178 MiB); otherwise grad_base is 0."""

    __slots__ = ("data", "device", "grad", "grad_base", "half_data", "half_grad", "states", "views")

    def __init__(self, device, total: int, dtype, half_end: int, optimizer, master_grad: bool) -> None:
        self.device = device
        self.grad_base = 0 if master_grad else half_end
        self.data, self.grad = zeros((total,), dtype, device), zeros((total - self.grad_base,), dtype, device)
        self.half_data = self.half_grad = None
        if half_end:  # the float16 Parameters' own data and gradients, laid out like the master range
            self.half_data, self.half_grad = zeros((half_end,), _HALF, device), zeros((half_end,), _HALF, device)
        self.states = optimizer.create_state_flat(total, dtype, device)
        self.views: list = []

    def grad_slice(self, start: int, end: int):
        """The float32 gradients of offsets [start, end), or None where they are not kept (see the class)."""
        if start < self.grad_base:
            return None
        return self.grad[start - self.grad_base:end - self.grad_base]


def _contexts(trainer, trainable: list) -> list:
    """The contexts every trainable Parameter lives on (one list for all of them, as MXNet requires)."""
    params, names = trainer._params, trainer._names
    first = params[trainable[0]].list_ctx()
    for i in trainable[1:]:
        mine = params[i].list_ctx()
        if mine != first:
            raise DnnbindValueError(f"Trainer: all Parameters must live on the same contexts, but `{names[i]}` is on "
                             f"{mine!r} and `{names[trainable[0]]}` on {first!r}")
    if len(first) > 1 and len({d.kind for d in first}) > 1:
        raise DnnbindValueError(f"Trainer: the Parameters live on {first!r}, a mix of cpu and gpu contexts; their "
                         "gradients can be summed on GPUs (NCCL) or on the host, not across both. Use only GPUs or "
                         "only the cpu.")
    return first


def _dtype(trainer, trainable: list) -> np.dtype:
    dtypes = {trainer._params[i].dtype for i in trainable}
    if _HALF in dtypes and dtypes <= {_HALF, np.dtype(np.float32)}:
        return np.dtype(np.float32)  # mixed precision: float32 master weights (trainer.py's docstring)
    if len(dtypes) > 1:
        raise DnnbindValueError(f"Trainer: all trainable Parameters must share one dtype (or be float16 and float32), "
                         f"found {sorted(map(str, dtypes))}")
    return next(iter(dtypes))


def pack(trainer) -> None:
    """Move ``trainer``'s trainable Parameters into views of new flat buffers, per context, keeping their values,
    gradients, optimizer state and freshness."""
    params, trainable = trainer._params, trainer._trainable()
    for i in trainable:
        params[i].list_data()  # raises the clear deferred/uninitialized error if a shape is still unknown
    if not trainable:
        trainer._layout = layout(params)
        trainer._groups, trainer._offsets, trainer._bufs, trainer._states, trainer._half_end = [], {}, [], (), 0
        return
    ctxs, dtype = _contexts(trainer, trainable), _dtype(trainer, trainable)
    keys: dict[tuple, list[int]] = {}
    for i in sorted(trainable, key=lambda i: params[i].dtype != _HALF):  # float16 first: one contiguous range
        keys.setdefault((params[i].dtype == _HALF, params[i].lr_mult, params[i].wd_mult), []).append(i)
    offsets, groups, off, half_end = {}, [], 0, 0
    for (is_half, lr_mult, wd_mult), members in keys.items():
        start = off
        for i in members:
            offsets[i] = off
            off = _align(off + params[i]._data.size)
        groups.append(_Group(lr_mult, wd_mult, members, start, off))
        half_end = off if is_half else half_end
    total = max(off, ALIGN)
    master = bool(half_end) and trainer._master_grad_needed(len(ctxs))
    bufs = [_Buffers(c, total, dtype, half_end, trainer._optimizer, master) for c in ctxs]
    old_bufs, old_offsets = trainer._bufs, trainer._offsets if trainer._bufs else {}
    old_layout = trainer._layout if trainer._bufs else None
    for i in trainable:
        p, o = params[i], offsets[i]
        n = p._data.size
        for k, ((data, grad), b) in enumerate(zip(p._copies(), bufs)):
            if p.dtype == _HALF:
                ops.copy(data.astype(dtype).reshape((n,)), b.data[o:o + n])  # the master copy
                flat_data, flat_grad = b.half_data, b.half_grad
                grad_view = flat_grad[o:o + n].reshape(data.shape)
            else:
                flat_data, grad_view = b.data, b.grad_slice(o, o + n).reshape(data.shape)
            data_view = flat_data[o:o + n].reshape(data.shape)
            ops.copy(data, data_view)
            if grad is not None:
                ops.copy(grad, grad_view)
            if i in old_offsets:  # repacking: carry momentum / moments over (a new context takes the first's)
                oo, old = old_offsets[i], old_bufs[k if k < len(old_bufs) else 0]
                for new_s, old_s in zip(b.states, old.states):
                    ops.copy(old_s[oo:oo + n], new_s[o:o + n])
                # and the master weights rather than their float16 rounding, unless the Parameter took a new array
                if p.dtype == _HALF and old.data.dtype == dtype and _same_array(old_layout, i, k, data):
                    ops.copy(old.data[oo:oo + n], b.data[o:o + n])
            # A backward that ran before packing marked the old array fresh: carry that over to the view.
            if autograd.is_fresh(data):
                trainer._carried_fresh.add((i, k))
                autograd.clear_fresh(data)
            p._rebind(data_view, grad_view, k)
    for b in bufs:  # the views one step hands to the optimizer, made once
        b.views = [(b.data[g.start:g.end], b.grad_slice(g.start, g.end), tuple(s[g.start:g.end] for s in b.states))
                   for g in groups]
    for g, (data, grad, states) in zip(groups, bufs[0].views):
        g.data, g.grad, g.states = data, grad, states
    first = bufs[0]
    trainer._bufs, trainer._offsets, trainer._groups, trainer._half_end = bufs, offsets, groups, half_end
    # The first context's buffers under their single-device names (checkpoints, tests, dnnbind.graph).
    trainer._flat_data, trainer._flat_grad, trainer._states = first.data, first.grad, first.states
    trainer._half_data, trainer._half_grad = first.half_data, first.half_grad
    trainer._layout = layout(params)


def _same_array(saved: list | None, i: int, k: int, data) -> bool:
    """Whether copy k of Parameter i is the array it was at the last packing (``layout``'s record)."""
    if saved is None or i >= len(saved) or k >= len(saved[i][0]):
        return False
    return saved[i][0][k][0] is data


def layout(params: list) -> list:
    """What each Parameter must still hold for a packing to be valid: its copies' arrays and grad_req."""
    return [(tuple(p._copies()), p.grad_req) for p in params]


def same_layout(params: list, saved: list) -> bool:
    for p, (copies, req) in zip(params, saved):
        now = p._copies()
        if p.grad_req != req or len(now) != len(copies) or \
                any(d is not d0 or g is not g0 for (d, g), (d0, g0) in zip(now, copies)):
            return False
    return True
