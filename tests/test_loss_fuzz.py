"""Every Gluon loss, given bad predictions, labels, weights or settings, raises only ValueError, TypeError or
NotImplementedError, and dnnbind's own (MXNet's MXNetError) where dnnbind raises: never AttributeError, numpy's
"could not convert string to float" or a bare float() error. Parametrized over gluon.loss.__all__, so losses
added later are covered."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind.gluon import loss as L

LOSSES = [n for n in L.__all__ if n != "Loss"]
BAD_SETTINGS = [None, "a", (1, 2), {}, float("nan")]


def _inputs():
    x23 = nd.array(np.random.default_rng(0).random((2, 3)).astype(np.float32))
    return x23, [None, "a", [1, 2], {}, 3, nd.array(np.float32(2.0)), x23, nd.array([1.0, 2]), nd.zeros((0, 3)),
                 nd.array([[1, 2, 3]], dtype="int32"), x23.astype("float16"), np.ones((2, 3)), float("nan")]


def _arity(loss) -> int:
    return sum(p.default is inspect.Parameter.empty for p in inspect.signature(loss.forward).parameters.values())


def _check(call, what, failures):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            call()
    except NotImplementedError:
        pass
    except (ValueError, TypeError) as exc:
        if isinstance(exc, IndexError) or not isinstance(exc, dnnbind.DnnbindError):
            failures.append(f"{what}: a plain {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001  (the point: nothing else may escape)
        failures.append(f"{what}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("name", LOSSES)
def test_bad_inputs_raise_only_value_or_type_errors(name):
    loss, failures = getattr(L, name)(), []
    x23, values = _inputs()
    n = _arity(loss)
    with dnnbind.cpu():
        for a in values:
            for b in values:
                _check(lambda: loss(a, *([b] * (n - 1))), f"{name}({a!r:.20}, {b!r:.20})", failures)
        for w in values:  # sample_weight, where the loss takes one
            if "sample_weight" in inspect.signature(loss.forward).parameters:
                _check(lambda: loss(*([x23] * n), sample_weight=w), f"{name}(sample_weight={w!r:.20})", failures)
    assert not failures, f"{len(failures)} bad exceptions: {failures[:5]}"


@pytest.mark.parametrize("name", LOSSES)
def test_bad_settings_raise_only_value_or_type_errors(name):
    cls, failures = getattr(L, name), []
    x23, _ = _inputs()
    settings = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "prefix", "params")]
    for p in settings:
        for v in BAD_SETTINGS:
            def make_and_call():
                loss = cls(**{p: v})
                loss(*([x23] * _arity(loss)))
            _check(make_and_call, f"{name}({p}={v!r})", failures)
    assert not failures, f"{len(failures)} bad exceptions: {failures[:5]}"


def test_a_label_of_strings_names_the_loss_and_the_argument():
    with pytest.raises(TypeError, match="L2Loss: label must be an NDArray or numbers, got str"):
        L.L2Loss()(nd.ones((2, 3)), "a")
    with pytest.raises(TypeError, match="HuberLoss: rho must be a number, got NoneType"):
        L.HuberLoss(rho=None)
