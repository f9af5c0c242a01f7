"""Layer ops (numpy twins): MXNet's indexing operators ``gather_nd``, ``scatter_nd``, ``_contrib_boolean_mask`` and
``_contrib_index_copy``, forward and backward. Imports numpy only.

Index arrays may be of any numeric type; a float index is truncated toward zero as MXNet's ``static_cast``. The
checks of index values (range) belong to the callers (ops/defs/gather_scatter.py), which name the op and shapes.
"""

from __future__ import annotations

import numpy as np


def gather_positions(indices: np.ndarray, shape: tuple) -> np.ndarray:
    """The flat row (over shape[:M]) each of gather_nd's N index columns selects, M = indices.shape[0]: MXNet's
    ``(static_cast<index_t>(idx + size)) % size`` per axis, so -size <= idx < 0 counts from the end."""
    m = indices.shape[0]
    cols = indices.reshape(m, -1)
    flat = np.zeros(cols.shape[1], np.int64)
    for j in range(m):
        k = np.trunc(cols[j].astype(np.float64) + shape[j]).astype(np.int64) % shape[j]
        flat = flat * shape[j] + k
    return flat


def scatter_positions(indices: np.ndarray, shape: tuple) -> np.ndarray:
    """scatter_nd's flat rows: the index taken as it is (MXNet does not wrap negative indices here)."""
    m = indices.shape[0]
    cols = np.trunc(indices.reshape(m, -1).astype(np.float64)).astype(np.int64)
    flat = np.zeros(cols.shape[1], np.int64)
    for j in range(m):
        flat = flat * shape[j] + cols[j]
    return flat


def _rows(shape: tuple, m: int) -> tuple[int, int]:
    """(rows, K): shape seen as prod(shape[:m]) rows of K = prod(shape[m:]) elements."""
    return int(np.prod(shape[:m], dtype=np.int64)), int(np.prod(shape[m:], dtype=np.int64))


def gather_nd(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    m = indices.shape[0]
    rows, k = _rows(x.shape, m)
    out = x.reshape(rows, k)[gather_positions(indices, x.shape)]
    return out.reshape(indices.shape[1:] + x.shape[m:])


def gather_nd_backward(dy: np.ndarray, indices: np.ndarray, shape: tuple) -> np.ndarray:
    """The adjoint: dy's rows added into zeros at the gathered rows (repeated rows accumulate)."""
    m = indices.shape[0]
    rows, k = _rows(shape, m)
    dx = np.zeros((rows, k), dy.dtype)
    np.add.at(dx, gather_positions(indices, shape), dy.reshape(-1, k))
    return dx.reshape(shape)


def scatter_nd(x: np.ndarray, indices: np.ndarray, shape: tuple) -> np.ndarray:
    """Zeros of ``shape`` with x's rows written at the indexed rows; of repeated rows the last write stays (MXNet's
    sequential CPU loop; MXNet calls that case undefined)."""
    m = indices.shape[0]
    rows, k = _rows(shape, m)
    out = np.zeros((rows, k), x.dtype)
    out[scatter_positions(indices, shape)] = x.reshape(-1, k)
    return out.reshape(shape)


def scatter_nd_backward(dy: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """MXNet's gradient of scatter_nd: gather_nd of dy at the same indices."""
    m = indices.shape[0]
    rows, k = _rows(dy.shape, m)
    return dy.reshape(rows, k)[scatter_positions(indices, dy.shape)].reshape(indices.shape[1:] + dy.shape[m:])


def mask_positions(index: np.ndarray) -> np.ndarray:
    """The positions along axis 0 that boolean_mask keeps: the nonzero entries of the 1-D mask."""
    return np.flatnonzero(index != 0)


def boolean_mask(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    return x[mask_positions(index)]


def boolean_mask_backward(dy: np.ndarray, index: np.ndarray, shape: tuple) -> np.ndarray:
    dx = np.zeros(shape, dy.dtype)
    dx[mask_positions(index)] = dy
    return dx


def index_rows(index: np.ndarray) -> np.ndarray:
    return np.trunc(index.astype(np.float64)).astype(np.int64) if index.dtype.kind == "f" else index.astype(np.int64)


def index_copy(old: np.ndarray, index: np.ndarray, new: np.ndarray) -> np.ndarray:
    """old with row index[i] replaced by new[i] (of repeated rows the last write stays, as MXNet's CPU loop)."""
    out = old.copy()
    out[index_rows(index)] = new
    return out


def index_copy_backward(dy: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d old, d new): dy with the copied rows zeroed, and dy's copied rows (MXNet's index_copy backward)."""
    rows = index_rows(index)
    d_old = dy.copy()
    d_old[rows] = 0
    return d_old, dy[rows]
