"""``horovod.mxnet`` on dnnbind: ``hvd.init()``, rank and size, allreduce / broadcast / allgather of NDArrays,
``broadcast_parameters``, ``DistributedTrainer`` and ``DistributedOptimizer``, with Horovod's signatures and
semantics, over dnnbind.distributed and the world's NCCL communicator. Layer: top; imports runtime, gluon,
distributed and dnnbind.kvstore (whose per-device communicator it shares).

Start the processes with ``python -m dnnbind.launch`` (or torchrun, mpirun, srun: dnnbind.distributed reads
them), one GPU each; ``hvd.init()`` calls ``dnnbind.distributed.init()`` if no one has. A process that was not
launched is a world of one: size 1, rank 0, every collective gives a copy of its input (scaled as asked), on cpu
and gpu arrays alike. In a world of n > 1 the collectives run on NCCL and need GPU arrays (a cpu array is a
DnnbindValueError).

Differences from Horovod, by design:

- collectives are matched between ranks by the order of the calls, not by ``name`` (NCCL's rule): every rank must
  make the same calls in the same order. ``name`` and ``priority`` are accepted and ignored;
- collectives run at once on the array's stream (no background thread, no tensor fusion) and are not recorded by
  autograd;
- ``DistributedTrainer`` sums the gradients with one NCCL all-reduce of the Trainer's flat gradient buffer per
  step (gluon.Trainer's ``kvstore='dist_sync'`` path) and, like that path, starts every rank from rank 0's
  Parameters; compression is not applied (gradients are summed in their own dtype) and ``num_groups``/``prefix``
  only exist for the signature. ``gradient_predivide_factor`` gives the same average (the sum is divided by
  ``size()`` once instead of before and after);
- ``DistributedOptimizer`` all-reduces each gradient in ``update``; a ``gluon.Trainer`` given one leaves the
  cross-process sum to it whatever its kvstore (Horovod's examples pass ``kvstore=None``), so nothing is summed
  twice. DistributedTrainer is faster (one all-reduce per step), as Horovod advises for Gluon.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .._lib.errors import DnnbindTypeError, DnnbindValueError
from .. import distributed
from .. import kvstore as _kv
from ..features import UnsupportedFeature
from ..gluon import optimizer as opt
from ..gluon.parameter import Parameter
from ..gluon.parameter_dict import ParameterDict
from ..gluon.trainer import Trainer
from ..runtime.array import NDArray, array

__all__ = ["Adasum", "Average", "Compression", "DistributedOptimizer", "DistributedTrainer", "Max", "Min", "Product",
           "Sum", "allgather", "allreduce", "allreduce_", "broadcast", "broadcast_", "broadcast_parameters",
           "cross_rank", "cross_size", "global_process_set", "grouped_allreduce", "grouped_allreduce_", "init",
           "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size"]

# Horovod's reduction ops (horovod.common's ReduceOp values), and NCCL's name for each.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_NCCL_OPS = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every process (the only process set dnnbind has)."""

    process_set_id = 0

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, global)"


global_process_set = _GlobalProcessSet()
_owns_world = [False]  # init() started dnnbind.distributed: shutdown() stops it


# -- the world ---------------------------------------------------------------------------------------------------

def init(comm=None, process_sets=None) -> None:
    """Join the world of the launcher that started this process (a world of one when there is none)."""
    if comm is not None or process_sets is not None:
        raise UnsupportedFeature("hvd.init: comm= and process_sets= are not supported by dnnbind; the world is the "
                                 "launcher's (python -m dnnbind.launch, torchrun, mpirun, srun)")
    if not distributed.is_initialized():
        distributed.init()
        _owns_world[0] = True


def shutdown() -> None:
    if _owns_world[0]:
        distributed.shutdown()
        _owns_world[0] = False


def is_initialized() -> bool:
    return distributed.is_initialized()


def _need_init() -> None:
    if not distributed.is_initialized():
        raise DnnbindValueError(_NOT_INITIALIZED)


def size() -> int:
    _need_init()
    return distributed.world_size()


def rank() -> int:
    _need_init()
    return distributed.rank()


def local_rank() -> int:
    _need_init()
    return distributed.local_rank()


def local_size() -> int:
    """The processes on this node: the launcher's count (LOCAL_WORLD_SIZE, Open MPI's, MPICH's, Slurm's), else
    every process (one node)."""
    n = size()
    if n == 1:
        return 1
    for var in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return n


def cross_rank() -> int:
    return rank() // local_size()


def cross_size() -> int:
    return size() // local_size()


def mpi_threads_supported() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> bool:
    return True


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return True


def rocm_built() -> bool:
    return False


# -- collectives ---------------------------------------------------------------------------------------------------

def _check(api: str, tensor, process_set) -> None:
    _need_init()
    if not isinstance(tensor, NDArray):
        raise DnnbindTypeError(f"hvd.{api}: tensor must be an NDArray, got {type(tensor).__name__}")
    if process_set is not None and process_set is not global_process_set:
        raise UnsupportedFeature(f"hvd.{api}: process sets other than the global one are not supported by dnnbind")


def _reduce_op(api: str, average, op) -> int:
    if op is not None and average is not None:
        raise DnnbindValueError(f"hvd.{api}: The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise UnsupportedFeature(f"hvd.{api}: op=hvd.Adasum is not supported by dnnbind; use hvd.Average or hvd.Sum")
    if op not in _NCCL_OPS:
        raise DnnbindValueError(f"hvd.{api}: unknown op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or "
                                "hvd.Product")
    return op


def _scale(x: NDArray, factor: float) -> NDArray:
    """x * factor in place (x is ours: a copy, or the tensor of an in-place call)."""
    if factor != 1.0:
        x.copy_(x * factor)
    return x


def _allreduce_into(api: str, x: NDArray, op: int, prescale_factor: float, postscale_factor: float) -> NDArray:
    _scale(x, prescale_factor)
    if size() > 1:
        comm = _kv.world_communicator(x.device, f"hvd.{api}")
        comm.all_reduce(x, out=x, op=_NCCL_OPS[op])
    return _scale(x, postscale_factor)  # a world of one: every op of one value is that value


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set, op=None) -> NDArray:
    """A new array: ``tensor`` averaged (the default) or summed over every process (``op``: hvd.Average, hvd.Sum,
    hvd.Min, hvd.Max, hvd.Product; ``average=False`` is hvd.Sum). The input is not modified."""
    _check("allreduce", tensor, process_set)
    op = _reduce_op("allreduce", average, op)
    return _allreduce_into("allreduce", tensor.detach().copy(), op, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set, op=None) -> NDArray:
    """allreduce in place; returns ``tensor``."""
    _check("allreduce_", tensor, process_set)
    op = _reduce_op("allreduce_", average, op)
    return _allreduce_into("allreduce_", tensor, op, prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, op=None) -> list:
    return [allreduce(t, average, name, priority, prescale_factor, postscale_factor, process_set, op)
            for t in tensors]


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set, op=None) -> list:
    return [allreduce_(t, average, name, priority, prescale_factor, postscale_factor, process_set, op)
            for t in tensors]


def _root(api: str, root_rank) -> int:
    n = size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < n:
        raise DnnbindValueError(f"hvd.{api}: root_rank must be a rank in [0, size()={n}), got {root_rank!r}")
    return int(root_rank)


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set) -> NDArray:
    """A new array holding root_rank's ``tensor`` on every process. The input is not modified."""
    _check("broadcast", tensor, process_set)
    return _broadcast_into("broadcast", tensor.detach().copy(), _root("broadcast", root_rank))


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set) -> NDArray:
    """broadcast in place; returns ``tensor``."""
    _check("broadcast_", tensor, process_set)
    return _broadcast_into("broadcast_", tensor, _root("broadcast_", root_rank))


def _broadcast_into(api: str, x: NDArray, root: int) -> NDArray:
    if size() > 1:
        _kv.world_communicator(x.device, f"hvd.{api}").broadcast(x, root=root, out=x)
    return x


def allgather(tensor, name=None, priority=0, process_set=global_process_set) -> NDArray:
    """Every process's ``tensor`` concatenated along axis 0, in rank order; the first dimension may differ between
    processes, the others must not."""
    _check("allgather", tensor, process_set)
    if tensor.ndim == 0:
        raise DnnbindValueError("hvd.allgather: tensor must have at least one dimension, got a 0-d array")
    n = size()
    if n == 1:
        return tensor.detach().copy()
    comm = _kv.world_communicator(tensor.device, "hvd.allgather")
    rows = array(np.array([tensor.shape[0]], np.int64), device=tensor.device)
    counts = [int(c) for c in comm.all_gather(rows).numpy()]
    if len(set(counts)) == 1:
        return comm.all_gather(tensor)
    top, rest = max(counts), tuple(tensor.shape[1:])
    padded = array(np.zeros((top, *rest), tensor.dtype), device=tensor.device)
    if tensor.shape[0]:
        padded[:tensor.shape[0]] = tensor
    gathered = comm.all_gather(padded)  # (n * top, ...): rank r's rows start at r * top
    from .. import nd
    return nd.concat(*[gathered[r * top:r * top + c] for r, c in enumerate(counts) if c], dim=0)


# -- parameters ----------------------------------------------------------------------------------------------------

def broadcast_parameters(params, root_rank: int = 0, prefix=None) -> None:
    """Give every process root_rank's values: ``params`` is a ParameterDict or a dict of name -> Parameter (or
    NDArray), broadcast in the order of the sorted names, as Horovod does. A Parameter whose initialization is
    still deferred is broadcast as soon as it is initialized (its first forward)."""
    if not isinstance(params, (dict, ParameterDict)):
        raise DnnbindValueError(f"invalid params of type: {type(params)}")  # Horovod's text
    if prefix is not None and not isinstance(prefix, str):
        raise DnnbindTypeError(f"hvd.broadcast_parameters: prefix must be a str or None, got {type(prefix).__name__}")
    if size() == 1:
        return
    root = _root("broadcast_parameters", root_rank)
    for name, p in sorted(params.items(), key=lambda item: str(item[0])):
        if isinstance(p, Parameter):
            if p._data is None and p._deferred_init:
                _broadcast_when_initialized(p, root)
            else:
                _broadcast_parameter(p, root)
        elif isinstance(p, NDArray):
            broadcast_(p, root)
        else:
            raise DnnbindTypeError(f"hvd.broadcast_parameters: {name!r} is a {type(p).__name__}, not a Parameter or "
                                   "an NDArray")


def _broadcast_parameter(p: Parameter, root: int) -> None:
    copies = p.list_data()  # several contexts: the first copy is broadcast, the others follow it
    broadcast_(copies[0], root)
    for c in copies[1:]:
        c.copy_(copies[0])


def _broadcast_when_initialized(p: Parameter, root: int) -> None:
    finish = p._finish_deferred_init

    def finish_then_broadcast() -> None:
        finish()
        if not p._deferred_init:
            del p._finish_deferred_init  # back to the class's method: broadcast once
            _broadcast_parameter(p, root)

    p._finish_deferred_init = finish_then_broadcast


# -- compression (accepted for the signature) ---------------------------------------------------------------------

class _NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    @staticmethod
    def compress(tensor):
        return (tensor.astype(np.float16), tensor.dtype) if tensor.dtype in (np.float32, np.float64) else \
            (tensor, None)

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """Horovod's gradient compression choices (``hvd.Compression.none``, ``hvd.Compression.fp16``)."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


# -- training ------------------------------------------------------------------------------------------------------

class DistributedOptimizer(opt.Optimizer):
    """Wraps an Optimizer: each ``update`` first sums the gradient over every process, and the optimizer's
    rescale_grad is divided by ``size()``, so the update uses the average. Attributes are the wrapped optimizer's
    (read and written through)."""

    _OWN = ("_optimizer", "_gradient_predivide_factor", "_num_groups")
    # gluon.Trainer leaves the cross-process sum to it (whatever its kvstore), so no gradient is summed twice
    sums_across_processes = True

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)  # no hyperparameters of its own to check (Optimizer.__new__ checks them)

    def __init__(self, optimizer, gradient_predivide_factor: float = 1.0, num_groups: int = 0):
        if not isinstance(optimizer, opt.Optimizer):
            raise DnnbindTypeError(f"hvd.DistributedOptimizer: expects an Optimizer (mx.optimizer.create(...)), got "
                                   f"{type(optimizer).__name__}")
        if not gradient_predivide_factor > 0:
            raise DnnbindValueError(f"hvd.DistributedOptimizer: gradient_predivide_factor must be > 0, got "
                                    f"{gradient_predivide_factor!r}")
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_gradient_predivide_factor", float(gradient_predivide_factor))
        object.__setattr__(self, "_num_groups", int(num_groups))
        optimizer.rescale_grad *= gradient_predivide_factor / size()

    def __getattr__(self, item):
        if item in DistributedOptimizer._OWN:
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def __setattr__(self, name, value) -> None:
        if name in DistributedOptimizer._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)  # the Trainer's rescale_grad, update counts: the wrapped one's

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._optimizer!r})"

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad) -> None:
        f = self._gradient_predivide_factor
        if size() == 1 and f == 1.0:
            return
        grads = grad if isinstance(index, (list, tuple)) else [grad]
        for g in grads:
            allreduce_(g, average=False, prescale_factor=1.0 / f)

    def update(self, index, weight, grad, state) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)


class DistributedTrainer(Trainer):
    """``gluon.Trainer`` whose step averages the gradients over every process: they are summed (one NCCL
    all-reduce of the flat gradient buffer per step) and rescale_grad is divided by ``size()``. So
    ``step(batch_size)`` takes this process's batch, as with Horovod (MXNet's dist kvstore takes the global one)."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor: float = 1.0, prefix=None, num_groups: int = 0):
        if not gradient_predivide_factor > 0:
            raise DnnbindValueError(f"hvd.DistributedTrainer: gradient_predivide_factor must be > 0, got "
                                    f"{gradient_predivide_factor!r}")
        if prefix is not None and not isinstance(prefix, str):
            raise DnnbindTypeError(f"hvd.DistributedTrainer: prefix must be a str or None, got "
                                   f"{type(prefix).__name__}")
        if compression not in (Compression.none, Compression.fp16):
            raise DnnbindValueError(f"hvd.DistributedTrainer: compression must be hvd.Compression.none or "
                                    f"hvd.Compression.fp16, got {compression!r}")
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its optimizer. We have unwrapped "
                          "it for you.", stacklevel=2)
        n = size()
        # One process: Horovod's kvstore=None (each context updated with its own gradient). Several: the Trainer's
        # cross-process sum ('dist_sync'), which also starts every rank from rank 0's Parameters.
        super().__init__(params, optimizer, optimizer_params, kvstore="dist_sync" if n > 1 else None)
        self._scale /= n
        self._compression = compression
        self._gradient_predivide_factor = float(gradient_predivide_factor)
        self._prefix = prefix or ""
        self._num_groups = int(num_groups)
