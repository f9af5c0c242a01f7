"""Small helpers of ``mxnet.gluon.utils``. Layer: gluon; imports numpy, runtime and (inside functions) nd.

``atomic_savez`` backs save_parameters / Trainer.save_states: a checkpoint is either the old file or the
complete new one, never a torn write (an interrupted job must be able to resume from it).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import hashlib
import os
import shutil
import socket
import ssl
import urllib.request
import uuid
import warnings

import numpy as np

from ..runtime.array import NDArray, array

__all__ = ["atomic_savez", "check_sha1", "clip_global_norm", "download", "split_and_load", "split_data"]


def atomic_savez(path, arrays: dict) -> None:
    """np.savez ``arrays`` to exactly ``path`` (no '.npz' added), atomically (serialization.atomic_write)."""
    from .. import serialization
    serialization.atomic_write(path, lambda f: np.savez(f, **arrays))


def split_data(data, num_slice: int, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` along ``batch_axis`` into ``num_slice`` pieces (views when the axis is 0).

    Uneven splits (``even_split=False``) give the first ``size % num_slice`` slices one extra sample, as MXNet.
    """
    if not 0 <= batch_axis < len(data.shape):
        raise DnnbindValueError(f"split_data: batch_axis {batch_axis} is out of range for data of shape {data.shape}")
    size = data.shape[batch_axis]
    if num_slice < 1 or (not even_split and size < num_slice):
        raise DnnbindValueError(f"split_data: cannot split {size} samples along axis {batch_axis} into {num_slice} slices")
    if even_split and size % num_slice:
        raise DnnbindValueError(f"split_data: data with shape {data.shape} cannot be evenly split into {num_slice} slices "
                         f"along axis {batch_axis}. Use a batch size that's a multiple of {num_slice} or set "
                         "even_split=False to allow uneven partitioning of data.")
    each, extras = divmod(size, num_slice)
    bounds = np.cumsum([0] + [each + 1] * extras + [each] * (num_slice - extras)).tolist()
    if batch_axis == 0:
        return [data[bounds[i]:bounds[i + 1]] for i in range(num_slice)]
    from .. import nd  # gluon may import nd; deferred so that this small module stays cheap to import
    return [nd.slice_axis(data, axis=batch_axis, begin=bounds[i], end=bounds[i + 1]) for i in range(num_slice)]


def split_and_load(data, ctx_list, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` along ``batch_axis`` and put slice i on ``ctx_list[i]`` (MXNet's multi-device helper): one
    context gives ``[data.as_in_context(ctx)]``; numpy (or list) data is first made an array on ``ctx_list[0]``."""
    if not isinstance(ctx_list, (list, tuple)):
        ctx_list = [ctx_list]
    if not ctx_list:
        raise DnnbindValueError("split_and_load: ctx_list is empty; give at least one context")
    if not isinstance(data, NDArray):
        data = array(data, device=ctx_list[0])
    if len(ctx_list) == 1:
        return [data.as_in_context(ctx_list[0])]
    return [s.as_in_context(c) for s, c in zip(split_data(data, len(ctx_list), batch_axis, even_split), ctx_list)]


def clip_global_norm(arrays: list, max_norm: float, check_isfinite: bool = True):
    """Scale ``arrays`` in place so that their joint 2-norm is at most ``max_norm``; return that norm.

    MXNet's rule: ``scale = min(max_norm / (norm + 1e-8), 1)``. Each array's sum of squares is computed on its own
    device and gathered on the first array's, where the norm and the scale are computed; the scale then goes to
    each array's device, so the arrays may live on several devices (cpu and GPUs). With ``check_isfinite`` the
    norm is read back and returned as MXNet's ``asscalar()`` gives it (a numpy scalar of the arrays' dtype:
    ``numpy.float32``), with a warning if it is nan or inf (the arrays are then scaled by nan or 0, as in MXNet);
    otherwise it stays an NDArray of shape (1,) and nothing waits for the device. (MXNet 1.9.1 fails on float64
    or float16 arrays, concatenating the scale with a float32 one; here they work.)
    """
    from .. import nd
    if isinstance(arrays, NDArray) or not arrays:
        raise DnnbindValueError("clip_global_norm: arrays must be a non-empty list of NDArrays")
    for i, a in enumerate(arrays):
        if not isinstance(a, NDArray):
            raise DnnbindTypeError(f"clip_global_norm: arrays[{i}] must be an NDArray, got {type(a).__name__}")
    ctx = arrays[0].context
    squares = [nd.sum(nd.square(a)).reshape((1,)).as_in_context(ctx) for a in arrays]
    total = nd.sqrt(nd.add_n(*squares) if len(squares) > 1 else squares[0])
    if check_isfinite:
        value = total.asscalar()
        if not np.isfinite(value):
            warnings.warn(UserWarning("nan or inf is detected. Clipping results will be undefined."), stacklevel=2)
    scale = nd.minimum(max_norm / (total + 1e-8), 1.0)  # (nan stays nan, as MXNet's min over [scale, 1])
    for a in arrays:
        a[:] = a * scale.as_in_context(a.context)
    return value if check_isfinite else total


def check_sha1(filename, sha1_hash: str) -> bool:
    """Whether the SHA-1 of the file's content is ``sha1_hash`` (hex digits)."""
    sha1 = hashlib.sha1()
    with open(filename, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha1.update(chunk)
    return sha1.hexdigest() == sha1_hash


DOWNLOAD_TIMEOUT = 10.0  # seconds per attempt: an offline machine fails within this, not after minutes


def download(url: str, path=None, overwrite: bool = False, sha1_hash: str | None = None, retries: int = 5,
             verify_ssl: bool = True) -> str:
    """Fetch ``url`` to ``path`` (a file, a folder, or the current folder) unless a good copy is there.

    An existing file is kept unless ``overwrite`` or its SHA-1 differs from ``sha1_hash``. The file is written
    to a temporary name and renamed, so a failed download leaves nothing half-written. Without network
    (these machines have none) it raises OSError naming the URL and where to place the file by hand.
    """
    if retries < 0:
        raise DnnbindValueError(f"download: retries must be >= 0, got {retries}")
    fname = url.split("/")[-1] if path is None else os.path.expanduser(os.fspath(path))
    if path is not None and (os.path.isdir(fname) or fname.endswith(os.sep)):  # a folder, existing or not
        fname = os.path.join(fname, url.split("/")[-1])
    if not fname or fname.endswith(os.sep):
        raise DnnbindValueError(f"download: cannot name a file after {url!r}; pass path=")
    if not overwrite and os.path.exists(fname) and (not sha1_hash or check_sha1(fname, sha1_hash)):
        return fname
    os.makedirs(os.path.dirname(os.path.abspath(fname)), exist_ok=True)
    context = None if verify_ssl else ssl._create_unverified_context()
    errors = []
    for _ in range(retries + 1):
        tmp = f"{fname}.{uuid.uuid4().hex}.part"
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT, context=context) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            if sha1_hash and not check_sha1(tmp, sha1_hash):
                raise OSError(f"the content of {url} does not match sha1 {sha1_hash}")
            os.replace(tmp, fname)
            return fname
        except (OSError, ValueError) as exc:  # URLError and socket timeouts are OSErrors
            errors.append(exc)
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(getattr(exc, "reason", None), (socket.gaierror, ConnectionRefusedError)):
                break  # no network or no such host: retrying cannot help, fail fast
    raise OSError(f"download: could not fetch {url} to {fname!r} ({errors[-1]!r}). If this machine is offline, "
                  f"copy the file there by hand.") from errors[-1]
