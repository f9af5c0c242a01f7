"""Evaluation metrics (``mxnet.gluon.metric`` / ``mxnet.metric``) with MXNet 1.9's semantics
(python/mxnet/metric.py). Layer: gluon; imports numpy only (arrays are read through ``.numpy()``).

Metrics run on the host: predictions of a batch are small (N x classes), and a metric is read once per
logging interval, so one device-to-host copy per update is cheap next to a training step.

``update(labels, preds)`` takes one array or a list of arrays each, paired in order; the lists must have the
same length. What one update adds to ``sum_metric / num_inst`` follows MXNet: Accuracy, TopKAccuracy,
CrossEntropy and Loss count samples (values), while MAE, MSE and RMSE add one batch mean per array pair
(so ``get()`` is a mean of per-batch means, as in MXNet), and F1 with ``average='macro'`` averages the F1 of
each update, ``'micro'`` pools the counts of all updates.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import numpy as np

__all__ = [
    "F1",
    "MAE",
    "MSE",
    "RMSE",
    "Accuracy",
    "CompositeEvalMetric",
    "CrossEntropy",
    "CustomMetric",
    "EvalMetric",
    "Loss",
    "TopKAccuracy",
    "create",
    "register",
]

_REGISTRY: dict[str, type] = {}


def register(cls, *aliases: str):
    """Make ``cls`` creatable by its lower-case class name and ``aliases`` (``create('acc')``)."""
    for name in (cls.__name__.lower(), *aliases):
        _REGISTRY[name] = cls
    return cls


def _host(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


def _pairs(metric: str, labels, preds) -> list:
    """MXNet's check_label_shapes(wrap=True): equal lengths, then single arrays wrapped into lists."""
    if len(labels) != len(preds):
        raise DnnbindValueError(f"{metric}.update: shape of labels {len(labels)} does not match shape of predictions "
                         f"{len(preds)}")
    labels = list(labels) if isinstance(labels, (list, tuple)) else [labels]
    preds = list(preds) if isinstance(preds, (list, tuple)) else [preds]
    return [(_host(a), _host(b)) for a, b in zip(labels, preds)]


class EvalMetric:
    """Running ``sum_metric / num_inst``; ``get()`` -> (name, value), ``reset()`` clears."""

    def __init__(self, name: str, output_names=None, label_names=None, **kwargs):
        self.name = str(name)
        self.output_names, self.label_names = output_names, label_names
        self._kwargs = kwargs
        self.reset()

    def reset(self) -> None:
        self.sum_metric, self.num_inst = 0.0, 0

    def reset_local(self) -> None:
        self.reset()

    def update(self, labels, preds) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define update(labels, preds)")

    def update_dict(self, label: dict, pred: dict) -> None:
        pred = [pred[n] for n in self.output_names] if self.output_names is not None else list(pred.values())
        label = [label[n] for n in self.label_names] if self.label_names is not None else list(label.values())
        self.update(label, pred)

    def get(self) -> tuple:
        return self.name, (self.sum_metric / self.num_inst if self.num_inst else float("nan"))

    get_global = get

    def get_name_value(self) -> list:
        name, value = self.get()
        return list(zip(name if isinstance(name, list) else [name], value if isinstance(value, list) else [value]))

    get_global_name_value = get_name_value

    def get_config(self) -> dict:
        return {**self._kwargs, "metric": type(self).__name__, "name": self.name,
                "output_names": self.output_names, "label_names": self.label_names}

    def __str__(self) -> str:
        return f"EvalMetric: {dict(self.get_name_value())}"


class Accuracy(EvalMetric):
    """Fraction of samples whose argmax over ``axis`` equals the label (preds may also be class ids)."""

    def __init__(self, axis: int = 1, name: str = "accuracy", **kwargs):
        self.axis = axis
        super().__init__(name, **kwargs)

    def update(self, labels, preds) -> None:
        for label, pred in _pairs("Accuracy", labels, preds):
            if pred.shape != label.shape:
                pred = pred.argmax(axis=self.axis)
            pred, label = pred.astype(np.int32).ravel(), label.astype(np.int32).ravel()
            if pred.shape != label.shape:
                raise DnnbindValueError(f"Accuracy.update: {label.size} labels but {pred.size} predictions")
            self.sum_metric += float((pred == label).sum())
            self.num_inst += label.size


class TopKAccuracy(EvalMetric):
    """Fraction of samples whose label is among the ``top_k`` highest scores; named ``top_k_accuracy_<k>``."""

    def __init__(self, top_k: int = 1, name: str = "top_k_accuracy", **kwargs):
        if top_k < 1:
            raise DnnbindValueError(f"TopKAccuracy: top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        super().__init__(f"{name}_{top_k}", **kwargs)

    def update(self, labels, preds) -> None:
        for label, pred in _pairs("TopKAccuracy", labels, preds):
            label = label.astype(np.int32).ravel()
            if pred.ndim > 2:
                raise DnnbindValueError(f"TopKAccuracy.update: predictions must be 1-D or 2-D, got shape {pred.shape}")
            if pred.ndim == 1:
                # Predicted class ids. (MXNet compares argpartition indices here, which only means something
                # for this reading.)
                hits = (pred.astype(np.int32) == label).sum()
            else:
                k = min(self.top_k, pred.shape[1])
                top = np.argsort(pred.astype(np.float32), axis=1, kind="stable")[:, pred.shape[1] - k:]
                hits = (top == label[:, None]).any(axis=1).sum()
            self.sum_metric += float(hits)
            self.num_inst += pred.shape[0]


class _Regression(EvalMetric):
    """MAE/MSE/RMSE: one batch mean per (label, pred) pair; 1-D arrays are read as columns."""

    def _batch(self, diff: np.ndarray) -> float:
        raise NotImplementedError

    def update(self, labels, preds) -> None:
        for label, pred in _pairs(type(self).__name__, labels, preds):
            label = label.reshape(label.shape[0], 1) if label.ndim == 1 else label
            pred = pred.reshape(pred.shape[0], 1) if pred.ndim == 1 else pred
            self.sum_metric += float(self._batch(label.astype(np.float64) - pred.astype(np.float64)))
            self.num_inst += 1


class MAE(_Regression):
    """Mean absolute error."""

    def __init__(self, name: str = "mae", **kwargs):
        super().__init__(name, **kwargs)

    def _batch(self, diff):
        return np.abs(diff).mean()


class MSE(_Regression):
    """Mean squared error."""

    def __init__(self, name: str = "mse", **kwargs):
        super().__init__(name, **kwargs)

    def _batch(self, diff):
        return (diff ** 2).mean()


class RMSE(_Regression):
    """Root mean squared error (of each batch; averaged over batches as MXNet does)."""

    def __init__(self, name: str = "rmse", **kwargs):
        super().__init__(name, **kwargs)

    def _batch(self, diff):
        return np.sqrt((diff ** 2).mean())


class CrossEntropy(EvalMetric):
    """Mean of ``-log(p[label] + eps)`` over samples; ``preds`` are probabilities (N, classes)."""

    def __init__(self, eps: float = 1e-12, name: str = "cross-entropy", **kwargs):
        self.eps = eps
        super().__init__(name, eps=eps, **kwargs)

    def update(self, labels, preds) -> None:
        for label, pred in _pairs("CrossEntropy", labels, preds):
            label = label.ravel()
            if label.shape[0] != pred.shape[0]:
                raise DnnbindValueError(f"CrossEntropy.update: {label.shape[0]} labels for predictions of shape {pred.shape}")
            prob = pred[np.arange(label.shape[0]), label.astype(np.int64)].astype(np.float64)
            self.sum_metric += float((-np.log(prob + self.eps)).sum())
            self.num_inst += label.shape[0]


class F1(EvalMetric):
    """Binary F1 of argmax(pred, axis=1) against 0/1 labels; ``average`` 'macro' (per update) or 'micro'."""

    def __init__(self, name: str = "f1", average: str = "macro", **kwargs):
        if average not in ("macro", "micro"):
            raise DnnbindValueError(f"F1: average must be 'macro' or 'micro', got {average!r}")
        self.average = average
        super().__init__(name, **kwargs)

    def reset(self) -> None:
        super().reset()
        self._tp = self._fp = self._fn = self._tn = 0

    def update(self, labels, preds) -> None:
        for label, pred in _pairs("F1", labels, preds):
            label = label.astype(np.int32).ravel()
            if len(np.unique(label)) > 2:
                raise DnnbindValueError("F1 currently only supports binary classification (labels 0 and 1)")
            p, t = pred.argmax(axis=1) == 1, label == 1
            self._tp += int((p & t).sum())
            self._fp += int((p & ~t).sum())
            self._fn += int((~p & t).sum())
            self._tn += int((~p & ~t).sum())
        total = self._tp + self._fp + self._fn + self._tn
        if self.average == "macro":
            self.sum_metric += self._fscore()
            self.num_inst += 1
            self._tp = self._fp = self._fn = self._tn = 0
        else:
            self.sum_metric, self.num_inst = self._fscore() * total, total

    def _fscore(self) -> float:
        precision = self._tp / (self._tp + self._fp) if self._tp + self._fp else 0.0
        recall = self._tp / (self._tp + self._fn) if self._tp + self._fn else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


class Loss(EvalMetric):
    """Mean of the loss values passed as ``preds`` (labels are ignored)."""

    def __init__(self, name: str = "loss", **kwargs):
        super().__init__(name, **kwargs)

    def update(self, _, preds) -> None:
        for pred in preds if isinstance(preds, (list, tuple)) else [preds]:
            values = _host(pred)
            self.sum_metric += float(values.astype(np.float64).sum())
            self.num_inst += values.size


class CustomMetric(EvalMetric):
    """``feval(label, pred)`` on numpy arrays per pair: a value (one instance) or a (sum, count) tuple."""

    def __init__(self, feval, name: str | None = None, allow_extra_outputs: bool = False, **kwargs):
        name = name or getattr(feval, "__name__", "custom")
        self._feval = feval
        super().__init__(f"custom({name})" if "<" in name else name, **kwargs)

    def update(self, labels, preds) -> None:
        for label, pred in _pairs("CustomMetric", labels, preds):
            value = self._feval(label, pred)
            if isinstance(value, tuple):
                self.sum_metric += float(value[0])
                self.num_inst += int(value[1])
            else:
                self.sum_metric += float(value)
                self.num_inst += 1


class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; ``get()`` returns lists of names and values."""

    def __init__(self, metrics=None, name: str = "composite", **kwargs):
        self.metrics = [create(m) for m in (metrics or [])]
        super().__init__(name, **kwargs)

    def add(self, metric) -> None:
        self.metrics.append(create(metric))

    def get_metric(self, index: int) -> EvalMetric:
        return self.metrics[index]

    def reset(self) -> None:
        for m in getattr(self, "metrics", []):
            m.reset()

    def update(self, labels, preds) -> None:
        for m in self.metrics:
            m.update(labels, preds)

    def get(self) -> tuple:
        names, values = [], []
        for m in self.metrics:
            name, value = m.get()
            names.extend(name if isinstance(name, list) else [name])
            values.extend(value if isinstance(value, list) else [value])
        return names, values


for _cls, _aliases in [(Accuracy, ("acc",)), (TopKAccuracy, ("top_k_accuracy", "top_k_acc")), (MAE, ()),
                       (MSE, ()), (RMSE, ()), (CrossEntropy, ("ce",)), (F1, ()), (Loss, ()),
                       (CompositeEvalMetric, ("composite",))]:
    register(_cls, *_aliases)


def create(metric, *args, **kwargs) -> EvalMetric:
    """A metric from an instance, a name ('acc', 'ce', 'rmse'), a function ``f(label, pred)`` (a
    CustomMetric) or a list of those (a CompositeEvalMetric)."""
    if isinstance(metric, EvalMetric):
        return metric
    if isinstance(metric, (list, tuple)):
        return CompositeEvalMetric([create(m, *args, **kwargs) for m in metric])
    if callable(metric) and not isinstance(metric, type):
        return CustomMetric(metric, *args, **kwargs)
    if isinstance(metric, type) and issubclass(metric, EvalMetric):
        return metric(*args, **kwargs)
    cls = _REGISTRY.get(str(metric).lower())
    if cls is None:
        raise DnnbindValueError(f"unknown metric {metric!r}; known: {', '.join(sorted(_REGISTRY))}")
    return cls(*args, **kwargs)
