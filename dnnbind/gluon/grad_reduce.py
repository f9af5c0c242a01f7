"""How a Trainer sums gradients: over the contexts of one process, and over the processes of a launched world.
Layer: gluon; imports runtime, and dnnbind.distributed lazily (inside functions: it sits above gluon).

MXNet does this with a KVStore; dnnbind keeps MXNet's ``kvstore=`` argument and its meaning:

- ``None``: no summing at all. With Parameters on several contexts each copy is updated with its own gradient
  (MXNet's ``kvstore=None``); a launched process trains alone.
- ``'local'``: the gradients of this process's contexts are summed; nothing crosses processes.
- ``'device'`` (the default), ``'nccl'``, ``'dist_sync'``, ``'dist_device_sync'`` (and ``'dist_sync_device'``):
  the same, and under ``python -m dnnbind.launch`` (``dnnbind.distributed.init()`` with WORLD_SIZE > 1) also
  across processes: the flat gradient buffer summed with NCCL bucket by bucket while the backward runs
  (_grad_buckets), or in one all-reduce per step (``DNNBIND_BUCKET_MB=0``, a captured or recorded step).

One process, several contexts: on GPUs one NCCL all-reduce per device over its whole flat gradient buffer, all
in one ``ncclGroupStart/End`` (``Communicator.for_devices``), on each device's current stream; on the cpu a
numpy sum into every copy (MXNet's 'local' KVStore on the host). 'local' and 'device' take the same path here:
on GPUs both use NCCL, which gives every device the same sum.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import numpy as np

# Where each gradient starts in the flat buffers this module sums (the Trainer's and a several-context Module's):
# a multiple of ALIGN elements, 256 bytes of float32, the alignment cuDNN/cuBLAS like for every tensor.
ALIGN = 64

__all__ = ["check_kvstore", "world_communicator", "world_size"]

LOCAL_KINDS = ("local", "device", "nccl", "dist_sync", "dist_device_sync", "dist_sync_device", "horovod")
WORLD_KINDS = ("device", "nccl", "dist_sync", "dist_device_sync", "dist_sync_device", "horovod")


class KVStoreTypeError(TypeError, ValueError):
    """kvstore is not None, a string or a KVStore: MXNet raises TypeError, dnnbind's other checks ValueError."""


def check_kvstore(kvstore) -> str | None:
    """The kvstore kind: None or one of LOCAL_KINDS, from a string or a KVStore-like object (``.type``)."""
    if kvstore is None:
        return None
    kind = kvstore if isinstance(kvstore, str) else getattr(kvstore, "type", None)
    if not isinstance(kind, str):
        raise KVStoreTypeError(f"Trainer: kvstore must be None, a string ('device', 'local', 'nccl', 'dist_sync', "
                               f"'dist_device_sync') or a KVStore with a .type string; got "
                               f"{type(kvstore).__name__}")
    if kind.startswith("dist") and "async" in kind:
        raise DnnbindValueError(f"Trainer: kvstore={kind!r}: asynchronous updates are not supported; use 'dist_sync' "
                         "(every step sums the gradients of all processes)")
    if kind not in LOCAL_KINDS:
        raise DnnbindValueError(f"Trainer: kvstore={kind!r} is not supported; use one of {', '.join(LOCAL_KINDS)} or None")
    return kind


def _distributed():
    from .. import distributed  # lazy: distributed sits above gluon
    return distributed


def world_size() -> int:
    """The launched world's size after dnnbind.distributed.init(), else 1."""
    d = _distributed()
    return d.world_size() if d.is_initialized() else 1


def world_communicator(device):
    """This process's NCCL communicator of the launched world, on ``device`` (tests replace this function)."""
    d = _distributed()
    if device.kind != "gpu":
        raise DnnbindValueError(f"Trainer: this process is rank {d.rank()} of {d.world_size()} (dnnbind.distributed.init()) "
                         f"but its Parameters are on {device!r}: gradients are summed across processes with NCCL, "
                         "which needs one GPU per process. Initialize the model on "
                         "gpu(dnnbind.distributed.local_rank()), or run one process (WORLD_SIZE=1).")
    return d.communicator(device)


def local_communicators(devices: list) -> list:
    """One NCCL communicator per GPU of ``devices`` (ncclCommInitAll), rank k on devices[k]."""
    return _distributed().Communicator.for_devices(devices)


def sum_on_host(grads: list) -> None:
    """Every cpu buffer of ``grads`` becomes their sum, added in context order (so every copy gets the same
    bits)."""
    arrays = [g.data_numpy for g in grads]
    total = arrays[0].copy()
    for a in arrays[1:]:
        np.add(total, a, out=total)
    for a in arrays:
        np.copyto(a, total)


def sum_on_devices(comms: list, grads: list) -> None:
    """Every GPU buffer of ``grads`` becomes their sum: one in-place all-reduce per device, issued as one group."""
    with _distributed().group():
        for comm, g in zip(comms, grads):
            comm.all_reduce(g, out=g)
