"""Numpy twin of synchronized batch normalization (MXNet's ``_contrib_SyncBatchNorm``): BatchNorm over the GLOBAL
batch, the union of every participating device's batch.

Layer: dnnbind/ops. Imports numpy and ops.reference.batchnorm only.

Each device normalizes its own batch with the statistics of all of them together, so the participants' outputs are
exactly the pieces of BatchNorm applied to the concatenated batch (``sync_batchnorm_forward_training`` /
``sync_batchnorm_backward`` take the list of per-device batches and say so in numbers). Channels are on axis 1; the
other axes are reduced, and they may differ between devices (only C must agree).

The pieces the operator's lowering exchanges between devices are here too:
- ``local_moments``: a device's (count, mean, sum of squared deviations) per channel;
- ``combine_moments``: the global count, mean and biased variance from every device's moments, by Chan et al.'s
  pairwise update (no E[x^2] - E[x]^2 cancellation, unlike MXNet's float32 kernel);
- ``local_grad_sums``: a device's sum(dy) and sum(dy * xhat) per channel, whose global sums give dx.
Statistics are accumulated in float64 and rounded as BatchNorm's twin rounds them.
"""

from __future__ import annotations

import numpy as np

from .batchnorm import bn_dtypes, bn_scalars

__all__ = ["combine_moments", "global_dx", "local_grad_sums", "local_moments", "sync_batchnorm_backward",
           "sync_batchnorm_forward_training"]


def _axes(x: np.ndarray) -> tuple:
    return (0,) + tuple(range(2, x.ndim))


def _bcast(v: np.ndarray, ndim: int) -> np.ndarray:
    return np.asarray(v).reshape((1, -1) + (1,) * (ndim - 2))


def local_moments(x: np.ndarray) -> np.ndarray:
    """(3, C) float64: this batch's count per channel (repeated over C), mean, and sum of squared deviations from
    that mean."""
    x64 = np.asarray(x, dtype=np.float64)
    axes = _axes(x64)
    n = x64.size // x64.shape[1] if x64.shape[1] else 0
    mean = x64.mean(axis=axes) if n else np.zeros(x64.shape[1])
    m2 = np.square(x64 - _bcast(mean, x64.ndim)).sum(axis=axes)
    return np.stack([np.full(x64.shape[1], float(n)), mean, m2])


def combine_moments(stacked) -> tuple[float, np.ndarray, np.ndarray]:
    """(N, mean, biased variance) of the union of batches from their ``local_moments`` stacked as (P, 3, C)."""
    s = np.asarray(stacked, dtype=np.float64)
    n_i, mean_i, m2_i = s[:, 0], s[:, 1], s[:, 2]
    n = n_i.sum(axis=0)
    mean = (n_i * mean_i).sum(axis=0) / n
    m2 = m2_i.sum(axis=0) + (n_i * np.square(mean_i - mean)).sum(axis=0)
    return float(n[0]), mean, m2 / n


def local_grad_sums(x: np.ndarray, dy: np.ndarray, mean: np.ndarray, inv_std: np.ndarray) -> np.ndarray:
    """(2, C) float64: this batch's sum(dy) and sum(dy * xhat), xhat = (x - mean) * inv_std with the global
    statistics."""
    x64, g = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    axes, nd = _axes(x64), x64.ndim
    xhat = (x64 - _bcast(np.asarray(mean, np.float64), nd)) * _bcast(np.asarray(inv_std, np.float64), nd)
    return np.stack([g.sum(axis=axes), (g * xhat).sum(axis=axes)])


def global_dx(x: np.ndarray, dy: np.ndarray, gamma: np.ndarray, mean: np.ndarray, inv_std: np.ndarray,
              sums: np.ndarray, n: float) -> np.ndarray:
    """dx of one device's batch from the GLOBAL sums (2, C) of sum(dy) and sum(dy * xhat) over N values per
    channel: gamma * inv_std * (dy - sum(dy) / N - xhat * sum(dy * xhat) / N), in float64."""
    x64, g = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    nd = x64.ndim
    inv = np.asarray(inv_std, np.float64)
    xhat = (x64 - _bcast(np.asarray(mean, np.float64), nd)) * _bcast(inv, nd)
    sums = np.asarray(sums, np.float64)
    return _bcast(np.asarray(gamma, np.float64) * inv, nd) * (g - _bcast(sums[0] / n, nd)
                                                               - xhat * _bcast(sums[1] / n, nd))


def sync_batchnorm_forward_training(xs: list, gamma: np.ndarray, beta: np.ndarray, moving_mean: np.ndarray,
                                    moving_var: np.ndarray, momentum: float = 0.9,
                                    eps: float = 1e-3) -> tuple[list, np.ndarray, np.ndarray]:
    """BatchNorm of the global batch ``xs`` (one array per device, channels on axis 1): returns (ys, mean,
    variance), the global batch's mean and BIASED variance; moving_mean/var updated IN PLACE once, as every
    device's copy is: ``moving = momentum * moving + (1 - momentum) * batch``."""
    op = "sync_batchnorm_forward_training"
    xs = [np.asarray(x) for x in xs]
    dtype, pdtype = bn_dtypes(op, {f"x{i}": x for i, x in enumerate(xs)},
                              {"gamma": np.asarray(gamma), "beta": np.asarray(beta), "moving_mean": moving_mean,
                               "moving_var": moving_var})
    eps, momentum = bn_scalars(op, eps, momentum)
    n, mean, var = combine_moments(np.stack([local_moments(x) for x in xs]))
    inv_std = 1.0 / np.sqrt(var + eps)
    ys = []
    for x in xs:
        nd = x.ndim
        y = (x.astype(np.float64) - _bcast(mean, nd)) * _bcast(inv_std * np.asarray(gamma, np.float64), nd) \
            + _bcast(np.asarray(beta, np.float64), nd)
        ys.append(y.astype(dtype))
    moving_mean[...] = momentum * moving_mean + (1.0 - momentum) * mean
    moving_var[...] = momentum * moving_var + (1.0 - momentum) * var
    return ys, mean.astype(pdtype), var.astype(pdtype)


def sync_batchnorm_backward(xs: list, dys: list, gamma: np.ndarray, mean: np.ndarray,
                            var: np.ndarray, eps: float = 1e-3) -> tuple[list, list, list]:
    """Gradients of the global-batch forward: (dxs, dgammas, dbetas), one of each per device. dx uses the sums
    over every device; dgamma and dbeta are each device's own sums (the Trainer adds the devices' parameter
    gradients, as MXNet's kvstore does)."""
    inv_std = 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)
    local = [local_grad_sums(x, dy, mean, inv_std) for x, dy in zip(xs, dys)]
    total = np.sum(local, axis=0)
    n = float(sum(x.size // x.shape[1] for x in xs))
    pdtype = np.asarray(gamma).dtype
    dxs = [global_dx(x, dy, gamma, mean, inv_std, total, n).astype(np.asarray(x).dtype) for x, dy in zip(xs, dys)]
    return dxs, [s[1].astype(pdtype) for s in local], [s[0].astype(pdtype) for s in local]
