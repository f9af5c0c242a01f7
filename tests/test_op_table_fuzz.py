"""Every op of the nd table, given bad operands or bad parameter values, raises only ValueError, TypeError or
NotImplementedError (dnnbind's, which are MXNet's MXNetError too), never AttributeError, IndexError, OverflowError,
ZeroDivisionError, MemoryError or anything else from deep inside. Parametrized over the registry itself, so an op
added to the table later is fuzzed without touching this file."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import nd
from dnnbind.nd._registry import REGISTRY

TABLE = sorted((op.nd_names[0], op) for op in REGISTRY.values() if op.nd_names)


def _operands():
    x23 = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    return [None, "a", [1, 2], {}, True, 3, 2 ** 40, float("nan"), np.ones(3),
            nd.array(np.float32(2.0)),  # 0-d
            x23, nd.array([1.0, 2, 3]), nd.zeros((0, 3)),  # broadcastable, mismatched, empty
            x23.T,  # non-contiguous
            nd.array([1, 2], dtype="int32"), nd.array([1, 2], dtype="float16")]


BAD_PARAMETER_VALUES = [None, "a", -1, 0, 2 ** 40, (1, 2, 3), 1.5, float("nan"), (), [0, 0], {}]


def _expect_only_value_or_type_errors(call, what, failures):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's notes on nan/overflow casts
            call()
    except (ValueError, TypeError, NotImplementedError) as exc:
        if isinstance(exc, IndexError):  # x[i] indexing alone may raise IndexError, as in MXNet
            failures.append(f"{what}: IndexError {exc}")
        elif not isinstance(exc, dnnbind.DnnbindError) and not isinstance(exc, NotImplementedError):
            failures.append(f"{what}: a plain {type(exc).__name__} (not MXNetError): {exc}")
    except Exception as exc:  # noqa: BLE001  (the point: nothing else may escape)
        failures.append(f"{what}: {type(exc).__name__} {exc}")


@pytest.mark.parametrize("name, op", TABLE, ids=[n for n, _ in TABLE])
def test_bad_operands_raise_only_value_or_type_errors(name, op):
    fn, failures = getattr(nd, name), []
    n = 2 if op.arity is None else op.arity
    operands = _operands()
    combos = itertools.product(operands, repeat=n) if n <= 2 else ((o,) * n for o in operands)
    with dnnbind.cpu():
        for args in combos:
            _expect_only_value_or_type_errors(lambda: fn(*args), f"{name}{tuple(map(_short, args))}", failures)
    assert not failures, f"{len(failures)} bad exceptions: {failures[:5]}"


@pytest.mark.parametrize("name, op", [(n, op) for n, op in TABLE if op.params],
                         ids=[n for n, op in TABLE if op.params])
def test_bad_parameter_values_raise_only_value_or_type_errors(name, op):
    fn, failures = getattr(nd, name), []
    n = 2 if op.arity is None else op.arity
    x23 = _operands()[10]
    with dnnbind.cpu():
        for p in op.params:
            for v in BAD_PARAMETER_VALUES:
                _expect_only_value_or_type_errors(lambda: fn(*([x23] * n), **{p: v}), f"{name}({p}={v!r})",
                                                  failures)
    assert not failures, f"{len(failures)} bad exceptions: {failures[:5]}"


def _short(a):
    return f"NDArray{a.shape}" if isinstance(a, nd.NDArray) else repr(a)[:12]


def test_the_fuzz_covers_the_whole_table():
    public = [op for op in REGISTRY.values() if op.nd_names]  # (the rest are gradients' helpers, no nd function)
    assert len(TABLE) == len(public) >= 60
    assert {"add", "sum", "clip", "take", "transpose", "broadcast_to", "dot"} <= {n for n, _ in TABLE}
