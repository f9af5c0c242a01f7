"""Numpy twin of the losses: softmax cross-entropy on logits and negative log-likelihood on log-probabilities.

Layer: dnnbind/ops. Imports numpy and dnnbind.ops._check only.

Labels are integer class ids of shape (N,). Their range is checked here (reading the values is free on the
CPU); the GPU ops check only dtype and shape.
"""

from __future__ import annotations

import numpy as np

from .. import _check


def _labels(op: str, scores: np.ndarray, labels, dloss=None, scores_name: str = "logits") -> np.ndarray:
    labels = np.asarray(labels)
    num_classes = _check.loss_params(op, scores, labels, dloss, scores_name)
    _check.check_label_values(op, labels, num_classes)
    return labels.astype(np.intp, copy=False)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """loss[n] = logsumexp(logits[n]) - logits[n, labels[n]], computed stably; shape (N,)."""
    logits = np.asarray(logits)
    labels = _labels("softmax_cross_entropy", logits, labels)
    return -_log_softmax(logits)[np.arange(len(labels)), labels]


def softmax_cross_entropy_backward(logits: np.ndarray, labels: np.ndarray, dloss: np.ndarray) -> np.ndarray:
    """dlogits = (softmax(logits) - onehot(labels)) * dloss[:, None]."""
    logits, dloss = np.asarray(logits), np.asarray(dloss)
    labels = _labels("softmax_cross_entropy_backward", logits, labels, dloss)
    g = np.exp(_log_softmax(logits))
    g[np.arange(len(labels)), labels] -= 1
    return g * dloss[:, None]


def nll_loss(logp: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """loss[n] = -logp[n, labels[n]]; shape (N,)."""
    logp = np.asarray(logp)
    labels = _labels("nll_loss", logp, labels, scores_name="logp")
    return -logp[np.arange(len(labels)), labels]


def nll_loss_backward(logp: np.ndarray, labels: np.ndarray, dloss: np.ndarray) -> np.ndarray:
    """dlogp[n, c] = -dloss[n] where c == labels[n], else 0."""
    logp, dloss = np.asarray(logp), np.asarray(dloss)
    labels = _labels("nll_loss_backward", logp, labels, dloss, scores_name="logp")
    g = np.zeros_like(logp)
    g[np.arange(len(labels)), labels] = -dloss
    return g
