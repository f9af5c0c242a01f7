"""Layer nd: dnnbind's loss helpers (``softmax_ce_per_sample``, ``pick_nll``: per-sample library forward/backward
pairs Gluon's losses call; MXNet's own ``softmax_cross_entropy`` operator, which sums over the batch, is an entry in
ops/defs/), ``waitall``, and two MXNet operators that compose table ops, registered as composite entries: ``add_n``
(a chain of the table's adds) and ``reshape_like``. Imports ops, autograd, runtime.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from .._lib.errors import DnnbindValueError
from .._lib.hooks import deferrable
from ..autograd import is_recording, record_op
from ._params import array_arg, int_arg, into, reject
from ._registry import call, composite

__all__ = ["add_n", "pick_nll", "reshape_like", "softmax_ce_per_sample", "waitall"]


@deferrable  # one op to dnnbind.eager_replay (it calls the library directly)
def softmax_ce_per_sample(logits, labels):
    """Per-sample -log softmax(logits)[label]: cuDNN log-softmax + a gather kernel; backward (p - onehot) * dl.
    float16 logits (a network cast to float16) are cast to float32 first, taped: the loss and its softmax are
    computed in float32, as mixed precision keeps them (MXNet's AMP lists softmax losses as float32 ops)."""
    if getattr(logits, "dtype", None) == np.float16:
        logits = call("cast", logits, dtype="float32")
    loss = ops.softmax_cross_entropy(logits, labels)
    if is_recording():
        record_op("softmax_cross_entropy", loss, (logits, None),
                  lambda dl: (ops.softmax_cross_entropy_backward(logits, labels, dl), None))
    return loss


@deferrable
def pick_nll(logp, labels):
    """Per-sample -logp[label] (NLL on log-probabilities)."""
    loss = ops.nll_loss(logp, labels)
    if is_recording():
        record_op("nll_loss", loss, (logp, None), lambda dl: (ops.nll_loss_backward(logp, labels, dl), None))
    return loss


def add_n(*args, num_args=None):
    """Sum of several arrays of one shape and dtype (MXNet's add_n / ElementWiseSum): a chain of table adds.
    ``num_args``, if given, must be the number of arrays (MXNet sets it itself)."""
    if num_args is not None and int_arg("add_n", "num_args", num_args, 1) != len(args):
        raise DnnbindValueError(f"add_n: num_args={num_args} but {len(args)} array(s) were given")
    if not args:
        raise DnnbindValueError("add_n: needs at least one array (value 0 for Parameter num_args should be greater "
                                "equal to 1)")
    arrays = [array_arg("add_n", f"args[{i}]", a, None) for i, a in enumerate(args)]
    first = arrays[0]
    for i, a in enumerate(arrays[1:], 1):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise DnnbindValueError(f"add_n: args[{i}] is {a.shape} {a.dtype} but args[0] is {first.shape} "
                                    f"{first.dtype}; every array must have the same shape and dtype")
    total = first if len(arrays) > 1 else first.copy()  # always a new array, like MXNet
    for a in arrays[1:]:
        total = total + a
    return total


def reshape_like(lhs, rhs, lhs_begin=None, lhs_end=None, rhs_begin=None, rhs_end=None):
    """MXNet's reshape_like: ``lhs`` with the dims ``lhs[lhs_begin:lhs_end]`` replaced by ``rhs``'s
    ``[rhs_begin:rhs_end]`` (all of both by default); the sizes must agree."""
    lhs = array_arg("reshape_like", "lhs", lhs)
    rhs = array_arg("reshape_like", "rhs", rhs, lhs)
    lb, le = slice(lhs_begin, lhs_end).indices(lhs.ndim)[:2]
    rb, re_ = slice(rhs_begin, rhs_end).indices(rhs.ndim)[:2]
    shape = lhs.shape[:lb] + rhs.shape[rb:re_] + lhs.shape[le:]
    if int(np.prod(shape)) != lhs.size:
        raise DnnbindValueError(f"reshape_like: lhs {lhs.shape} [{lhs_begin}:{lhs_end}] cannot take rhs {rhs.shape} "
                                f"[{rhs_begin}:{rhs_end}]: the result {shape} has another size")
    return lhs.reshape(shape)


composite("add_n", add_n, nd=("add_n", "ElementWiseSum"))
composite("reshape_like", reshape_like, dtype=lambda p, types, n_out: ([types[0], types[1]], [types[0]]))


def waitall():
    from ..runtime.stream import synchronize
    from ..runtime.device import num_gpus, gpu
    for i in range(num_gpus()):
        synchronize(gpu(i))
