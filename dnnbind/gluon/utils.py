"""Small helpers of ``mxnet.gluon.utils``. Layer: gluon; imports numpy and runtime.

``atomic_savez`` backs save_parameters / Trainer.save_states: a checkpoint is either the old file or the
complete new one, never a torn write (an interrupted job must be able to resume from it).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..runtime.array import NDArray, array

__all__ = ["atomic_savez", "split_and_load", "split_data"]


def atomic_savez(path, arrays: dict) -> None:
    """np.savez ``arrays`` to exactly ``path`` (no '.npz' added): temp file in the same folder, fsync, replace."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX when both are on one filesystem: hence the same folder
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def split_data(data, num_slice: int, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` along the batch axis into ``num_slice`` pieces (views on the first axis)."""
    if batch_axis != 0:
        raise ValueError("split_data: only batch_axis=0 is supported (first-axis slices are views)")
    size = data.shape[0]
    if even_split and size % num_slice:
        raise ValueError(f"split_data: {size} samples do not split evenly into {num_slice} slices; "
                         "use even_split=False or a different batch size")
    step = size // num_slice
    bounds = [i * step for i in range(num_slice)] + [size]
    return [data[bounds[i]:bounds[i + 1]] for i in range(num_slice)]


def split_and_load(data, ctx_list, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` and put slice i on ``ctx_list[i]`` (MXNet's multi-device helper)."""
    if not isinstance(data, NDArray):
        data = array(data)
    if not isinstance(ctx_list, (list, tuple)):
        ctx_list = [ctx_list]
    if len(ctx_list) == 1:
        return [data.as_in_context(ctx_list[0])]
    return [s.as_in_context(c) for s, c in zip(split_data(data, len(ctx_list), batch_axis, even_split), ctx_list)]
