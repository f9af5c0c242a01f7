"""Reading parameter files into Parameters: MXNet 1.x's binary NDArray files (and dnnbind's older npz ones),
name matching with clear errors for missing, extra and mis-shaped entries. Layer: gluon; imports numpy,
dnnbind.serialization and runtime. Used by Block.load_parameters and ParameterDict.load; split from parameter.py.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import os

import numpy as np

from .. import serialization

def read_param_file(filename) -> dict:
    """name -> numpy array of a parameter file, with MXNet's ``arg:``/``aux:`` prefixes (Module, export) removed."""
    path = os.fspath(filename)
    with open(path, "rb") as f:
        zipped = f.read(2) == b"PK"  # dnnbind's npz files before the MXNet format (zip); MXNet's start 0x12
    if zipped:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    loaded = serialization.load(path)
    if isinstance(loaded, list):
        if not loaded:
            return {}
        raise DnnbindValueError(f"{path}: holds a list of {len(loaded)} arrays without names; a parameter file is a dict "
                         "(nd.save(fname, {name: array}) or save_parameters)")
    return {(k[4:] if k.startswith(("arg:", "aux:")) else k): (None if v is None else v.data_numpy)
            for k, v in loaded.items()}


def load_into(params: dict, loaded: dict, what: str, ctx, allow_missing: bool, ignore_extra: bool,
              cast_dtype: bool, dtype_source: str) -> None:
    """Check ``loaded`` against ``params`` (both keyed alike), report every problem in one ValueError, then load."""
    missing = [k for k in params if k not in loaded]
    extra = [k for k in loaded if k not in params]
    problems = []
    if missing and not allow_missing:
        problems.append("missing in the file (allow_missing=True skips them): " + ", ".join(missing))
    if extra and not ignore_extra:
        problems.append("in the file but not in this model (ignore_extra=True skips them): " + ", ".join(extra))
    for key, p in params.items():
        if key not in loaded:
            continue
        arr, shape = loaded[key], p.shape
        if arr is None:
            problems.append(f"{key} is an empty (none) array in the file")
        elif shape is not None and (len(shape) != arr.ndim or any(d and d != s for d, s in zip(shape, arr.shape))):
            problems.append(f"shape mismatch for {key}: the model expects {shape}, the file has {arr.shape}")
        elif arr.dtype != p.dtype and not cast_dtype:
            problems.append(f"dtype mismatch for {key}: the model has {p.dtype.name}, the file {arr.dtype.name} "
                            "(cast_dtype=True converts)")
    if problems:
        raise DnnbindValueError(f"{what}:\n  " + "\n  ".join(problems))
    for key, p in params.items():
        if key in loaded:
            arr = loaded[key]
            if cast_dtype and dtype_source == "saved":
                p.cast(arr.dtype)
            p._load_init(arr, ctx)
