"""Evaluation metrics (``mxnet.gluon.metric`` / ``mxnet.metric``). Layer: gluon; imports numpy and runtime.

Metrics run on the host: predictions of a batch are small (N x classes), and a metric is read once per
logging interval, so one device-to-host copy per update is cheap next to a training step.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Accuracy", "CompositeEvalMetric", "EvalMetric", "Loss", "TopKAccuracy", "create"]


def _host(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class EvalMetric:
    """Running ``sum_metric / num_inst``; ``get()`` -> (name, value), ``reset()`` clears."""

    def __init__(self, name: str, output_names=None, label_names=None):
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.sum_metric, self.num_inst = 0.0, 0

    def update(self, labels, preds) -> None:
        raise NotImplementedError

    def get(self) -> tuple:
        return self.name, (self.sum_metric / self.num_inst if self.num_inst else float("nan"))

    def get_name_value(self) -> list:
        name, value = self.get()
        return list(zip(_as_list(name), _as_list(value)))

    def __str__(self) -> str:
        return f"EvalMetric: {dict(self.get_name_value())}"


class Accuracy(EvalMetric):
    """Fraction of samples whose argmax over ``axis`` equals the label (labels may be class ids or preds)."""

    def __init__(self, axis: int = 1, name: str = "accuracy", **kwargs):
        self.axis = axis
        super().__init__(name, **kwargs)

    def update(self, labels, preds) -> None:
        labels, preds = _as_list(labels), _as_list(preds)
        if len(labels) != len(preds):
            raise ValueError(f"Accuracy.update: {len(labels)} label arrays but {len(preds)} prediction arrays")
        for label, pred in zip(labels, preds):
            label, pred = _host(label), _host(pred)
            if pred.shape != label.shape:
                pred = pred.argmax(axis=self.axis)
            pred, label = pred.astype(np.int64).ravel(), label.astype(np.int64).ravel()
            if pred.shape != label.shape:
                raise ValueError(f"Accuracy.update: {label.size} labels but {pred.size} predictions")
            self.sum_metric += float((pred == label).sum())
            self.num_inst += label.size


class TopKAccuracy(EvalMetric):
    """Fraction of samples whose label is among the ``top_k`` highest scores."""

    def __init__(self, top_k: int = 1, name: str = "top_k_accuracy", **kwargs):
        self.top_k = top_k
        super().__init__(f"{name}_{top_k}", **kwargs)

    def update(self, labels, preds) -> None:
        for label, pred in zip(_as_list(labels), _as_list(preds)):
            label, pred = _host(label).astype(np.int64).ravel(), _host(pred)
            top = np.argsort(pred, axis=1)[:, -self.top_k:]
            self.sum_metric += float((top == label[:, None]).any(axis=1).sum())
            self.num_inst += label.size


class Loss(EvalMetric):
    """Mean of the loss values passed as ``preds`` (labels are ignored)."""

    def __init__(self, name: str = "loss", **kwargs):
        super().__init__(name, **kwargs)

    def update(self, _, preds) -> None:
        for pred in _as_list(preds):
            values = _host(pred)
            self.sum_metric += float(values.sum())
            self.num_inst += values.size


class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; ``get()`` returns lists of names and values."""

    def __init__(self, metrics=None, name: str = "composite", **kwargs):
        self.metrics = [create(m) for m in (metrics or [])]
        super().__init__(name, **kwargs)

    def add(self, metric) -> None:
        self.metrics.append(create(metric))

    def reset(self) -> None:
        for m in getattr(self, "metrics", []):
            m.reset()

    def update(self, labels, preds) -> None:
        for m in self.metrics:
            m.update(labels, preds)

    def get(self) -> tuple:
        pairs = [m.get() for m in self.metrics]
        return [n for n, _ in pairs], [v for _, v in pairs]


_NAMES = {"acc": Accuracy, "accuracy": Accuracy, "top_k_accuracy": TopKAccuracy, "loss": Loss}


def create(metric, **kwargs) -> EvalMetric:
    """A metric from an instance, a name ('acc', 'loss') or a list of those (a CompositeEvalMetric)."""
    if isinstance(metric, EvalMetric):
        return metric
    if isinstance(metric, (list, tuple)):
        return CompositeEvalMetric(metric)
    cls = _NAMES.get(str(metric).lower())
    if cls is None:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(sorted(_NAMES))}")
    return cls(**kwargs)
