"""Trainer (``mxnet.gluon.Trainer``): applies an Optimizer to a set of Parameters.
Layer: gluon; imports autograd, ops, runtime, gluon.parameter, gluon.optimizer (dnnbind.distributed lazily).

Flat buffers: when it is created (or on the first step, if shapes were still deferred) the Trainer moves
every trainable Parameter's data and gradient into views of ONE flat data buffer and ONE flat gradient
buffer on the device, grouped by (lr_mult, wd_mult), each view starting on a 64-element (256-byte)
boundary so cuDNN/cuBLAS see aligned pointers. Values are copied in and autograd is re-pointed at the new
gradient views (``mark_variables``), so backward writes straight into the flat gradient and a step is a
few ops per group over the whole model. Arrays obtained from ``param.data()`` *before* the Trainer was
created are stale afterwards: fetch them again.

Several contexts (``initialize(ctx=[gpu(0), gpu(1)])``): one set of flat buffers per context, all with the same
layout. A step sums the gradient buffers of all contexts (one fused all-reduce per buffer: grad_reduce, per
``kvstore``), then runs the same update on every context's buffers: the same arithmetic on the same inputs, so the
copies stay bitwise identical, as MXNet's KVStore keeps them. Under ``python -m dnnbind.launch`` the flat gradient
is also summed across processes: the communicator is made when the Trainer first packs (at construction when
shapes are known), and rank 0's Parameters are then broadcast to every process, as MXNet's ``kvstore.init`` does.
That sum starts during the backward: the flat gradient is cut into buckets (``DNNBIND_BUCKET_MB``, 25 MiB by
default; 0 for one all-reduce in step) and each bucket's all-reduce is queued on a communication stream as soon
as its gradients are final, as PyTorch's DDP does (_grad_buckets says which cases overlap). After ``backward()``
the buckets that launched hold the sum over processes already; ``step()`` sums the rest, then updates.

``step(batch_size)`` sets ``rescale_grad = 1 / batch_size`` (the loss was summed over the batch by
backward) and refuses gradients that no backward wrote since the last step, as MXNet does. The gradients summed
over contexts and processes are divided by the ``batch_size`` given, as in MXNet (whose KVStore sums): pass the
batch of the whole step, i.e. the sum of the slices of every context and, when launched, of every process
(``local batch * world_size``), to get the mean gradient of it. (PyTorch's DDP and Horovod average instead.)

Mixed precision (``net.cast('float16')``, BatchNorm staying float32): float16 Parameters keep their data and
gradients in float16 buffers of their own, and the flat float32 buffers hold their *master* copy, so the update
runs in float32 on float32 weights and optimizer state: one cast of all float16 gradients in, one of all updated
weights out. This is MXNet's ``multi_precision=True``; float16 Parameters get it whatever the flag says (updating
float16 weights in float16 loses small updates, which MXNet only warns about). Gradients are summed across
contexts after that cast, in float32 (a float16 sum could overflow and rounds once per term). As in MXNet, the
master copy is the optimizer's: ``set_data`` on a float16 Parameter after the Trainer packed it does not reach it.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from .. import autograd
from . import grad_reduce as _reduce
from . import optimizer as opt
from ._grad_buckets import GradBuckets
from ._trainer_pack import ALIGN, pack, same_layout
from ._trainer_states import load_states, save_states
from .lr_scheduler import check_number
from .parameter import Parameter, generation
from .parameter_dict import ParameterDict

__all__ = ["ALIGN", "StaleGradientError", "Trainer"]

_INF = float("inf")


class StaleGradientError(RuntimeError, UserWarning):
    """A Parameter's gradient was not written by backward since the last step (MXNet raises UserWarning)."""


class Trainer:
    """``Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4})``.

    ``kvstore``: None, 'local', 'device' (default), 'nccl', 'dist_sync', 'dist_device_sync' or a KVStore-like
    object with that ``.type`` (see grad_reduce for what each sums). ``compression_params`` and
    ``update_on_kvstore`` are accepted for MXNet's signature: every process updates its own copies.
    """

    def __init__(self, params, optimizer, optimizer_params: dict | None = None, kvstore="device",
                 compression_params=None, update_on_kvstore=None):
        if isinstance(params, ParameterDict):  # keyed by full names (global counters): name by path, stable
            items = [(p.display_name if isinstance(p, Parameter) else k, p) for k, p in params.items()]
            if len({k for k, _ in items}) < len(items):  # paths of several models: their full names
                items = list(params.items())
        elif isinstance(params, dict):
            items = list(params.items())
        elif isinstance(params, (list, tuple)):
            items = [(p.display_name if isinstance(p, Parameter) else str(p), p) for p in params]
        else:
            raise DnnbindTypeError(f"Trainer: first argument must be a ParameterDict, dict or list of Parameters, got "
                            f"{type(params).__name__}")
        self._names, self._params, seen = [], [], set()
        for name, p in items:
            if not isinstance(p, Parameter):
                raise DnnbindTypeError(f"Trainer: `{name}` is a {type(p).__name__}, not a Parameter")
            if id(p) not in seen:  # a shared Parameter is updated once
                seen.add(id(p))
                self._names.append(name)
                self._params.append(p)
        self._kvstore = _reduce.check_kvstore(kvstore)
        self._optimizer = opt.create(optimizer, **(optimizer_params or {}))
        self._optimizer.param_dict = dict(enumerate(self._params))  # lr_mult/wd_mult for custom optimizers
        self._scale = self._optimizer.rescale_grad
        # Per-Parameter update count (Adam's t), starting at begin_num_update as MXNet's _update_count does.
        self._counts = np.full(len(self._params), self._optimizer.begin_num_update, np.int64)
        self._custom_states: dict = {}  # state of a custom (per-Parameter) optimizer: by index, (index, k) on ctx k
        self._custom_counts: dict[int, dict] = {}  # a custom optimizer's update counts on context k > 0
        self._layout = None  # set by _pack: what each Parameter must still be for the packing to hold
        self._generation = -1  # parameter.generation when the layout was last checked
        self._carried_fresh: set[tuple] = set()  # (index, context) written by a backward before packing
        self._bufs: list = []
        self._local_comms = self._world_comm = None  # NCCL communicators, made on first use and kept
        self._buckets: GradBuckets | None = None  # a launched world's gradient buckets (_grad_buckets)
        self._reduced = False  # allreduce_grads() ran: the next update uses the summed gradients as they are
        self._amp_loss_scaler = None  # dnnbind.amp.init_trainer sets it (and _amp_original_scale)
        self._master_grad = False  # keep float32 gradients for float16 Parameters even where the update needs none
        if all(p._data is not None for p in self._params):
            self._pack()

    # -- packing ------------------------------------------------------------------------------------------
    def _trainable(self) -> list[int]:
        return [i for i, p in enumerate(self._params) if p.grad_req != "null"]

    def _pack(self) -> None:
        """Move trainable Parameters into views of the flat buffers (keeping data, grads, optimizer state)."""
        old = self._buckets
        if old is not None:
            if old.launched():  # a backward summed buckets in the old buffers: finish the sum there, once
                self._prepare_grads([])
                self._reduced = True
            old.close()
            self._buckets = None
        pack(self)
        if self._bufs:
            comm = self._world()  # launched on the cpu: say so now, not at the first step
            if comm is not None and len(self._bufs) == 1:
                spans = [(self._offsets[i], self._params[i]._data.size, i, self._params[i]._data,
                          self._params[i].grad_req, k) for k, g in enumerate(self._groups) for i in g.members]
                self._buckets = GradBuckets.make(comm, self._bufs[0], self._half_end, spans, self)

    def _master_grad_needed(self, contexts: int) -> bool:
        """Whether float16 Parameters need float32 gradients too (summed, clipped, scaled or checked there): all
        but the one-pass update of _fused_half. Decided at packing; a step that finds it needed after all
        (a loss scaler attached later, stale gradients) packs again with them (sticky)."""
        o = self._optimizer
        return self._master_grad or contexts != 1 or self._amp_loss_scaler is not None or o.per_parameter or \
            bool(o.clip_gradient) or getattr(o, "update_flat_mixed", None) is None or \
            (self._kvstore in _reduce.WORLD_KINDS and _reduce.world_size() > 1)

    def _with_master_grad(self) -> None:
        """Pack again with the float16 Parameters' float32 gradient range, if it was left out (see _Buffers)."""
        if self._bufs and self._bufs[0].grad_base:
            self._master_grad = True
            self._pack()

    def _ensure_packed(self) -> None:
        if self._generation == generation[0]:  # no Parameter anywhere adopted new arrays since the last check
            return
        if self._layout is None or not same_layout(self._params, self._layout):
            self._pack()  # first step, or a Parameter moved (reset_ctx, grad_req change, another Trainer)
        self._generation = generation[0]

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
        """The device arrays a step changes (flat data, flat grads, optimizer state per context), packed first.

        A CUDA-graph capture (dnnbind.graph.CapturedStep) snapshots these before its warm-up steps and restores
        them after. Host-side scalars are baked into a capture: a captured step replays the lr (and Adam's
        bias correction) of the capture.
        """
        self._ensure_packed()
        out = []
        for b in self._bufs:
            half = [b.half_data, b.half_grad] if self._half_end else []
            out += [b.data, b.grad, *half, *b.states]
        return out

    def zero_grad(self) -> None:
        """Zero every gradient at once: one memset per flat gradient buffer (for grad_req='add')."""
        self._ensure_packed()
        for b in self._bufs:
            b.grad.zero_()
            if self._half_end:
                b.half_grad.zero_()

    def allreduce_grads(self) -> None:
        """Sum the gradients over contexts (and launched processes) now, e.g. to clip them before ``update``."""
        again = self._reduced
        self._ensure_packed()  # (packing again finishes a sum a backward started: then it is done)
        self._with_master_grad()  # the sum runs over the float32 gradients
        if again or not self._reduced:
            self._prepare_grads(self._fresh(True)[1])
        self._reduced = True

    def step(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """Sum the gradients (contexts, processes), then one update with them scaled by 1/batch_size."""
        # NOTE: MXNet takes any batch_size: nan makes every weight NaN, inf or a negative one quietly skips or
        # reverses the update, and 0 is a bare ZeroDivisionError. Here each is a ValueError naming the value.
        if type(batch_size) is not int or batch_size <= 0:  # (the common case costs one test)
            batch_size = check_number("Trainer.step", "batch_size", batch_size, 0.0, low_open=True)
        self._optimizer.rescale_grad = self._scale / batch_size
        self._ensure_packed()
        fresh, partial = self._fresh(ignore_stale_grad)
        fused = self._fused_half(fresh)
        if not fused:
            self._with_master_grad()
        if not self._reduced:
            self._prepare_grads(partial, cast_half=not fused)
        self._update(fresh, fused)

    def update(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """The update of ``step``, on gradients ``allreduce_grads()`` summed. Unlike MXNet, where the copies
        would then drift apart, it sums them itself when allreduce_grads() was not called."""
        self.step(batch_size, ignore_stale_grad)

    # -- one step -----------------------------------------------------------------------------------------
    def _fresh(self, ignore_stale_grad: bool) -> tuple[list, list]:
        """(Parameters to update, [(index, stale contexts)] of those updated with some copies stale).

        MXNet's rule: a Parameter is stale when any copy's gradient was not written since the last step, and
        that raises. With ignore_stale_grad, a Parameter with no fresh copy is skipped; one with some fresh copies
        is updated everywhere, its stale copies counting as zeros (MXNet would skip those copies' update and
        let them drift apart from the others).
        """
        params, carried, n = self._params, self._carried_fresh, len(self._bufs)
        trainable = self._trainable()
        if n <= 1:  # one context: one check per Parameter, as always
            fresh = [i for i in trainable if (i, 0) in carried or autograd.is_fresh(params[i]._data)]
            if len(fresh) == len(trainable) or ignore_stale_grad:
                return fresh, []
            stale = [(i, 0) for i in sorted(set(trainable) - set(fresh))]
            raise self._stale_error(stale)
        fresh, partial, stale = [], [], []
        for i in trainable:
            datas = params[i]._data_list
            gone = [k for k in range(n) if (i, k) not in carried and not autograd.is_fresh(datas[k])]
            if len(gone) < n:
                fresh.append(i)
            if gone and len(gone) < n:
                partial.append((i, gone))
            stale += [(i, k) for k in gone]
        if stale and not ignore_stale_grad:
            raise self._stale_error(stale)
        return fresh, partial

    def _stale_error(self, stale: list) -> StaleGradientError:
        i, k = stale[0]
        names = list(dict.fromkeys(self._names[j] for j, _ in stale[1:] if j != i))
        more = f" (and {len(names)} more: {', '.join(names[:5])})" if names else ""
        ctx = self._params[i].list_ctx()[k]
        return StaleGradientError(
            f"Gradient of Parameter `{self._names[i]}` on context {ctx!r} has not been updated by backward since "
            f"last `step`{more}. This could mean a bug in your model that made it only use a subset of the "
            "Parameters (Blocks) for this iteration. If you are intentionally only using a subset, call step with "
            "ignore_stale_grad=True to suppress this warning and skip updating of Parameters with stale gradient")

    def _fused_half(self, fresh: list) -> bool:
        """Whether this step updates the float16 Parameters straight from their float16 gradients (the optimizer's
        ``update_flat_mixed``: one pass, no cast in or out): one context, no other process, no loss scaler or
        clipping, every float16 group updated whole (the per-Parameter path reads the float32 range)."""
        h, o = self._half_end, self._optimizer
        if not h or len(self._bufs) != 1 or self._amp_loss_scaler is not None or o.per_parameter or \
                o.clip_gradient or getattr(o, "update_flat_mixed", None) is None or self._world() is not None:
            return False
        fresh_set = set(fresh)
        for g in self._groups:
            if g.start < h:
                counts = self._counts[g.members]
                if not all(i in fresh_set for i in g.members) or not (counts == counts[0]).all():
                    return False
        return True

    def _prepare_grads(self, partial: list, cast_half: bool = True) -> None:
        """The gradients the update reads: stale copies zeroed, float16 ones cast into the master range, then
        summed over contexts and processes."""
        for i, gone in partial:
            if self._params[i].grad_req == "write":  # a copy no backward wrote holds the last step's gradient
                for k in gone:
                    self._params[i]._grad_list[k].zero_()
        h = self._half_end
        grads = [b.grad for b in self._bufs]
        if self._buckets is not None and self._buckets.flush():
            summed = True  # across processes bucket by bucket, each float16 one cast first (_grad_buckets)
        else:
            if h and cast_half:  # float16 gradients into the float32 master range: summed and applied in float32
                for b in self._bufs:
                    b.grad[:h].copy_(b.half_grad)  # converts as it copies
            summed = len(grads) > 1 and self._kvstore is not None
            if summed:
                if self._bufs[0].device.kind == "cpu":
                    _reduce.sum_on_host(grads)
                else:
                    if self._local_comms is None:
                        self._local_comms = _reduce.local_communicators([b.device for b in self._bufs])
                    _reduce.sum_on_devices(self._local_comms, grads)
            comm = self._world() if grads else None
            if comm is not None:
                comm.all_reduce(grads[0], out=grads[0])
                summed = True
        if summed and h and self._optimizer.per_parameter:  # a custom optimizer reads the float16 gradients
            for b in self._bufs:
                b.half_grad.copy_(b.grad[:h])

    def _world(self):
        """This process's communicator of the launched world when gradients cross processes, else None."""
        if self._kvstore not in _reduce.WORLD_KINDS or _reduce.world_size() == 1:
            return None
        if getattr(self._optimizer, "sums_across_processes", False):  # hvd.DistributedOptimizer sums in update()
            return None
        if len(self._bufs) > 1:
            raise DnnbindValueError(f"Trainer: under dnnbind.distributed (world of {_reduce.world_size()}) each process "
                             f"trains on one GPU, but the Parameters live on {[b.device for b in self._bufs]}; "
                             "initialize them on gpu(dnnbind.distributed.local_rank()) only")
        device = self._bufs[0].device
        if self._world_comm is None:
            comm = _reduce.world_communicator(device)
            for flat in (self._bufs[0].data, self._bufs[0].half_data):  # MXNet's kvstore.init: every process
                if flat is not None:  # starts from rank 0's values
                    comm.broadcast(flat, root=0, out=flat)
            self._world_comm = comm
        elif getattr(self._world_comm, "device", device) is not device:
            raise DnnbindValueError(f"Trainer: the Parameters moved to {device!r}, but this process's NCCL communicator "
                             f"is on {self._world_comm.device!r}; keep them on gpu(local_rank)")
        return self._world_comm

    def _update(self, fresh: list, fused: bool = False) -> None:
        self._reduced = False
        params, trainable, bufs = self._params, self._trainable(), self._bufs
        o = self._optimizer
        if o.per_parameter:
            self._update_custom(fresh)
            return
        if fresh:
            o.num_update = max(o.num_update, int(self._counts[fresh].max()) + 1)
        lr, wd = o.learning_rate, o.wd
        if not (0.0 <= lr < _INF and 0.0 <= wd < _INF):  # a scheduler's output, or an attribute set by hand
            where = f"Trainer.step ({type(o).__name__}, update {o.num_update})"
            source = f" from {type(o.lr_scheduler).__name__}" if o.lr_scheduler is not None else ""
            check_number(where, f"the learning rate{source}", lr, 0.0)
            check_number(where, "wd", wd, 0.0)
        fresh_set = set(fresh)
        scaler = self._amp_loss_scaler
        if scaler is not None and bufs:  # dnnbind.amp: skip a step whose gradients overflowed
            overflow = not all(np.isfinite(float(b.grad.sum().asscalar())) for b in bufs)  # one read per context
            scaler.update_scale(overflow)
            if overflow:
                self._clear_fresh(trainable)
                return
        for gi, g in enumerate(self._groups):
            counts = self._counts[g.members]
            if all(i in fresh_set for i in g.members) and (counts == counts[0]).all():
                # The fast path: the whole group in a handful of ops over its flat slice, on every context.
                for b in bufs:
                    data, grad, states = b.views[gi]
                    if fused and g.start < self._half_end:  # float16 gradients in, float16 weights out
                        o.update_flat_mixed(data, b.half_grad[g.start:g.end], states, lr * g.lr_mult,
                                            wd * g.wd_mult, int(counts[0]) + 1, b.half_data[g.start:g.end])
                    else:
                        o.update_flat(data, grad, states, lr * g.lr_mult, wd * g.wd_mult, int(counts[0]) + 1)
                self._counts[g.members] += 1
                continue
            for i in g.members:  # some stale (skipped) or out-of-step counts: one Parameter at a time
                if i in fresh_set:
                    a, z = self._offsets[i], self._offsets[i] + params[i]._data.size
                    for b in bufs:
                        o.update_flat(b.data[a:z], b.grad_slice(a, z), tuple(s[a:z] for s in b.states),
                                      lr * g.lr_mult, wd * g.wd_mult, int(self._counts[i]) + 1)
                    self._counts[i] += 1
        if self._half_end and not fused:  # the updated master weights, rounded to the float16 Parameters
            for b in bufs:
                b.half_data.copy_(b.data[:self._half_end])
        self._clear_fresh(trainable)

    def _update_custom(self, fresh: list[int]) -> None:
        """A custom optimizer (MXNet's ``update(index, weight, grad, state)``): one Parameter at a time, on each
        context with its own state and update counts (MXNet keeps one updater per device)."""
        o, params = self._optimizer, self._params
        counts0 = o._index_update_count
        try:
            for k in range(max(len(self._bufs), 1)):
                if k:
                    o._index_update_count = self._custom_counts.setdefault(k, {})
                for i in fresh:
                    p, key = params[i], (i if k == 0 else (i, k))
                    data, grad = p._copies()[k]
                    if key not in self._custom_states:
                        self._custom_states[key] = o.create_state_multi_precision(i, data)
                    o.update_multi_precision(i, data, grad, self._custom_states[key])
        finally:
            o._index_update_count = counts0
        self._counts[fresh] += 1
        self._clear_fresh(self._trainable())

    def _clear_fresh(self, trainable: list) -> None:
        for i in trainable:
            for data, _ in self._params[i]._copies():
                autograd.clear_fresh(data)
        self._carried_fresh.clear()

    # -- checkpoints --------------------------------------------------------------------------------------
    def save_states(self, fname) -> None:
        """Optimizer state (momentum / Adam moments per Parameter, from the first context), step counts and lr;
        atomic (temp file in the same folder, fsync, rename; a failed write leaves no temp file). ``fname`` may
        also be a writable binary file object."""
        self._ensure_packed()
        save_states(self, fname)

    def load_states(self, fname) -> None:
        """Restore what save_states wrote, into every context; the Parameters must be initialized. A corrupt or
        truncated file, or one for another model or optimizer, is one ValueError naming the file, and changes
        nothing."""
        self._ensure_packed()
        load_states(self, fname)
