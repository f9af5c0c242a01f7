"""Numpy twin of MXNet's CTCLoss (connectionist temporal classification). Layer: ops. Imports numpy only.

``data`` is (T, N, A) unnormalized activations (a softmax over the A classes is applied inside, as MXNet does);
``labels`` holds, per sequence, its label as class indices already in the data's alphabet (the op's entry,
ops/defs/ctc_loss.py, strips the padding, checks the values and the lengths, and passes Python lists). The
forward-backward recursions run in log space in float64 whatever the data's dtype, so long sequences do not
underflow and the float32 results match MXNet's to rounding.

Two edge cases follow MXNet 1.9.1 (warp-ctc), not the textbook: a label that cannot be aligned in the steps given
(length + repeated neighbours > steps) costs 0 with a zero gradient, and an empty label over zero steps costs inf.
"""

from __future__ import annotations

import numpy as np

_NEG = -np.inf


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def repeats(label) -> int:
    """Neighbouring equal labels: each needs a blank between them, one step more than the label's length."""
    return int(sum(1 for i in range(1, len(label)) if label[i] == label[i - 1]))


def _one(logp: np.ndarray, label: list, blank: int) -> tuple[float, np.ndarray]:
    """(-log p(label | x), the occupancy (T, A) of each class at each step) for one sequence of T steps."""
    t_len, a = logp.shape
    z = [blank]
    for k in label:
        z += [k, blank]
    s_len = len(z)
    z = np.asarray(z)
    # s - 2 may be skipped into s when z[s] is a label differing from z[s - 2] (no blank between distinct labels)
    skip = np.zeros(s_len, bool)
    skip[2:] = (z[2:] != blank) & (z[2:] != z[:-2])
    alpha = np.full((t_len, s_len), _NEG)
    alpha[0, 0] = logp[0, blank]
    if s_len > 1:
        alpha[0, 1] = logp[0, z[1]]
    for t in range(1, t_len):
        prev = alpha[t - 1]
        acc = prev.copy()
        acc[1:] = np.logaddexp(acc[1:], prev[:-1])
        acc[2:] = np.where(skip[2:], np.logaddexp(acc[2:], prev[:-2]), acc[2:])
        alpha[t] = acc + logp[t, z]
    ends = [s_len - 1] + ([s_len - 2] if s_len > 1 else [])
    log_p = np.logaddexp.reduce(alpha[t_len - 1, ends])
    # beta[t, s]: log-probability of finishing from state s at step t, the emission at t excluded
    beta = np.full((t_len, s_len), _NEG)
    beta[t_len - 1, ends] = 0.0
    for t in range(t_len - 2, -1, -1):
        nxt = beta[t + 1] + logp[t + 1, z]
        acc = nxt.copy()
        acc[:-1] = np.logaddexp(acc[:-1], nxt[1:])
        acc[:-2] = np.where(skip[2:], np.logaddexp(acc[:-2], nxt[2:]), acc[:-2])
        beta[t] = acc
    occupancy = np.zeros((t_len, a))
    if np.isfinite(log_p):
        w = np.exp(alpha + beta - log_p)  # each path through (t, s), over all paths: <= 1, no overflow
        for s in range(s_len):
            occupancy[:, z[s]] += w[:, s]
    return -float(log_p), occupancy


def ctc_loss(data: np.ndarray, labels: list, data_lengths, blank: int, want_grad: bool = True):
    """(loss (N,), gradient (T, N, A) of the loss sum w.r.t. data or None), in the data's dtype.

    ``labels``: N lists of class indices; ``data_lengths``: N whole numbers in [0, T]."""
    t_max, n, a = data.shape
    loss = np.zeros(n)
    grad = np.zeros((t_max, n, a)) if want_grad else None
    for b in range(n):
        t_len, label = int(data_lengths[b]), list(labels[b])
        if len(label) + repeats(label) > t_len:  # no alignment fits; MXNet (warp-ctc) gives 0, no gradient
            continue
        if t_len == 0:  # an empty label over no steps: warp-ctc's log of an empty sum
            loss[b] = np.inf
            continue
        logp = _log_softmax(data[:t_len, b].astype(np.float64))
        loss[b], occupancy = _one(logp, label, blank)
        if want_grad:
            grad[:t_len, b] = np.exp(logp) - occupancy  # d(-log p)/dx = softmax - occupancy
    out = loss.astype(data.dtype)
    return out, (grad.astype(data.dtype) if want_grad else None)
