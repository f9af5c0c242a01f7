"""MXNet's ``Embedding``: ``weight[data]``, (d0, ..., dk) indices -> (d0, ..., dk, output_dim) rows of the
(input_dim, output_dim) weight.

MXNet 1.9.1 declares ``input_dim`` and ``output_dim`` (required, each >= 1: the weight must be exactly that shape),
``dtype`` (the weight's type; checked against MXNet's list, and the weight's own dtype is used, as MXNet does where
they differ) and ``sparse_grad`` (a row_sparse gradient in MXNet; parsed, and the gradient here is dense).
Indices come as any numeric array, usually floats of integer values: a float index is truncated toward zero and
every index clipped into [0, input_dim), as MXNet does (-1 takes row 0, 1.7 row 1). The gradient goes to the weight
only, the rows' head gradients added up per index (a repeated index gets the sum); the indices get none (where
MXNet refuses a backward that asks for one, here their gradient stays zero).

On a GPU the table's ``take`` (a gather kernel, mode 'clip') and, for the backward, its scatter-add
``_take_backward``, composed through ``ops.opdef.table``; the cpu twin is numpy.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindValueError
from ..args import check_fits
from ..opdef import Lowering, OpDef, define, table


def _prepare(p, data, weight):
    op = "Embedding"
    n, m = p["input_dim"], p["output_dim"]
    for name, v in (("input_dim", n), ("output_dim", m)):
        if v < 1:  # MXNet's set_lower_bound(1), not part of the declared type
            raise DnnbindValueError(f"value {v} for Parameter {name} should be greater equal to 1, in operator {op}")
    if weight.shape != (n, m):
        raise DnnbindValueError(f"{op}: weight has shape {weight.shape} but input_dim={n}, output_dim={m} need "
                                f"({n}, {m}) (data {data.shape})")
    check_fits(op, data.device, weight.dtype, "the output", data.shape + (m,), f" (data {data.shape}, weight "
               f"{weight.shape})", cudnn=False)
    return n, m


def _infer(p, shapes):
    return [shapes[0], (p["input_dim"], p["output_dim"])], [(*shapes[0], p["output_dim"])]


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _rows(data: np.ndarray, n: int) -> np.ndarray:
    """The weight rows the indices pick: truncated toward zero, clipped into [0, n)."""
    if data.dtype.kind == "f":
        # clipped before the cast (a huge float overflows int64); a NaN index picks row 0 and an infinite one the
        # first or last row, as the GPU's conversion does
        data = np.clip(np.nan_to_num(np.trunc(data), nan=0.0, posinf=n - 1, neginf=0.0), 0, n - 1)
    return np.clip(data.astype(np.int64), 0, n - 1)


def _cpu_forward(c, data, weight):
    rows = _rows(data, c.geo[0])
    return np.take(weight, rows, axis=0), rows


def _cpu_backward(c, rows, grads, dy):
    if not grads.needs[1]:  # (only the indices asked for one: they get none)
        return None, None
    n, m = c.geo
    dw = np.zeros((n, m), dy.dtype)
    np.add.at(dw, rows.reshape(-1), dy.reshape(-1, m))
    return None, dw


# gpu: the table's gather and scatter-add ------------------------------------------------------------------------

def _gpu_forward(c, data, weight):
    return table("take", weight, data, axis=0, mode="clip"), data


def _gpu_backward(c, data, grads, dy):
    if not grads.needs[1]:
        return None, None
    return None, table("_take_backward", dy, data, shape=c.geo, axis=0, mode="clip")


def _samples(rng):
    # indices as floats of whole numbers, MXNet's convention (held fixed by the central differences: ``nograd``)
    yield {"data": rng.integers(0, 5, (4,)).astype(np.float64), "weight": rng.standard_normal((5, 3))}, \
        {"input_dim": 5, "output_dim": 3}
    yield {"data": np.array([[0.0, 2, 2], [1, 0, 2]]), "weight": rng.standard_normal((3, 4))}, \
        {"input_dim": 3, "output_dim": 4, "sparse_grad": True}
    yield {"data": rng.integers(0, 6, (2, 2, 3)).astype(np.float64), "weight": rng.standard_normal((6, 2))}, \
        {"input_dim": 6, "output_dim": 2, "dtype": "float64"}
    # out of range (clipped into the table) and fractional (truncated) indices
    yield {"data": np.array([-1.0, 4, 9, 1.7, 2.5]), "weight": rng.standard_normal((4, 3))}, \
        {"input_dim": 4, "output_dim": 3}


def _dtype(p, types, n_out):
    """MXNet's rule: the indices keep their own type; the weight and the output are the ``dtype`` parameter."""
    t = np.dtype(p["dtype"])
    return [types[0], t], [t]


define(OpDef("Embedding", prepare=_prepare, infer=_infer, samples=_samples, dtype=_dtype,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             nograd=("data",),  # indices: MXNet gives them no gradient
             doc="MXNet's Embedding: weight[data], indices truncated and clipped into [0, input_dim); the gradient "
                 "a scatter-add into the weight."))
