"""``mx.model``'s checkpoint functions: MXNet 1.x's ``prefix-symbol.json`` + ``prefix-%04d.params`` pair, the files
``Module.save_checkpoint`` and ``HybridBlock.export`` write. Layer: top (imports symbol and serialization).

    sym, arg_params, aux_params = mx.model.load_checkpoint("lenet", 1)
    mx.model.save_checkpoint("lenet", 2, sym, arg_params, aux_params)

The parameter file is MXNet's NDArray file (serialization) with every array keyed ``arg:<name>`` (learned) or
``aux:<name>`` (auxiliary states); both files are written atomically.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import serialization
from ._lib.errors import DnnbindTypeError, DnnbindValueError
from .runtime.array import NDArray, array
from .runtime.device import cpu
from .symbol import Symbol, load as load_symbol

__all__ = ["BatchEndParam", "load_checkpoint", "load_params", "save_checkpoint"]

# What Module.fit/score hand each batch-end callback (mx.model.BatchEndParam, as in MXNet).
BatchEndParam = namedtuple("BatchEndParams", ["epoch", "nbatch", "eval_metric", "locals"])


def _param_file(prefix: str, epoch: int) -> str:
    if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
        raise DnnbindValueError(f"checkpoint epoch must be a non-negative int, got {epoch!r}")
    return f"{prefix}-{int(epoch):04d}.params"


def save_checkpoint(prefix: str, epoch: int, symbol: Symbol, arg_params: dict, aux_params: dict,
                    remove_amp_cast: bool = True) -> None:
    """Write ``prefix-symbol.json`` (when ``symbol`` is given) and ``prefix-%04d.params``."""
    arrays = {}
    for kind, params in (("arg", arg_params), ("aux", aux_params)):
        if not isinstance(params, dict):
            raise DnnbindTypeError(f"save_checkpoint: {kind}_params must be a dict name -> NDArray, got "
                                   f"{type(params).__name__}")
        for name, value in params.items():
            if not isinstance(value, (NDArray, np.ndarray)):
                raise DnnbindTypeError(f"save_checkpoint: {kind}_params[{name!r}] must be an NDArray, got "
                                       f"{type(value).__name__}")
            arrays[f"{kind}:{name}"] = value
    param_name = _param_file(prefix, epoch)  # checked before anything is written
    if symbol is not None:
        symbol.save(f"{prefix}-symbol.json", remove_amp_cast=remove_amp_cast)
    serialization.save(param_name, arrays)


def load_params(prefix: str, epoch: int) -> tuple[dict, dict]:
    """(arg_params, aux_params) of ``prefix-%04d.params``, as NDArrays on the cpu."""
    fname = _param_file(prefix, epoch)
    loaded = serialization.load(fname)
    if not isinstance(loaded, dict):
        raise DnnbindValueError(f"{fname}: holds a list of {len(loaded)} unnamed arrays, not a checkpoint's "
                                "arg:/aux: dict")
    arg_params, aux_params = {}, {}
    for key, value in loaded.items():
        kind, _, name = key.partition(":")
        if kind not in ("arg", "aux") or not name:
            raise DnnbindValueError(f"{fname}: key {key!r} is neither arg:<name> nor aux:<name> (a checkpoint's "
                                    "parameter file; a Gluon save_parameters file is read by load_parameters)")
        value = value if isinstance(value, NDArray) else array(np.asarray(value), device=cpu())
        (arg_params if kind == "arg" else aux_params)[name] = value
    return arg_params, aux_params


def load_checkpoint(prefix: str, epoch: int) -> tuple[Symbol, dict, dict]:
    """(symbol, arg_params, aux_params) from ``prefix-symbol.json`` and ``prefix-%04d.params``."""
    symbol = load_symbol(f"{prefix}-symbol.json")
    arg_params, aux_params = load_params(prefix, epoch)
    return symbol, arg_params, aux_params
