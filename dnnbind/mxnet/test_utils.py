"""``mxnet.test_utils``: the comparison and device helpers MXNet tests and examples use. Layer: top (the MXNet
alias); imports runtime.

Tolerances follow MXNet 1.9: with ``rtol``/``atol`` None, each side's dtype picks a default (float16 1e-2/1e-1,
float32 1e-4/1e-3, float64 1e-5/1e-20, integers and bool exact) and the looser of the two sides wins; a dict
maps dtypes to tolerances; a number is used as is. As in MXNet on Ampere and later, a float32 GPU array gets
the float16 defaults while TF32 math is on (``dnnbind.set_math_mode("tf32")``). The symbolic checkers
(``check_numeric_gradient``, ``check_consistency``, ...) and sparse arrays are not supported: using one raises
NotImplementedError.
"""

from __future__ import annotations

import sys

import numbers

import numpy as np

from ..runtime import device as _device
from ..runtime.array import NDArray, array
from ..runtime.config import math_mode
from . import _unsupported
from ._unsupported import UnsupportedFeature

__all__ = ["almost_equal", "assert_allclose", "assert_almost_equal", "assert_exception", "default_atols",
           "default_context", "default_dtype", "default_rtols", "list_gpus", "rand_ndarray", "rand_shape_2d",
           "rand_shape_3d", "rand_shape_nd", "random_arrays", "same", "set_default_context"]


def default_context():
    """The default device (MXNet's ``current_context()``)."""
    return _device.default_device()


def set_default_context(ctx) -> None:
    """Make ``ctx`` this thread's default device."""
    _device.set_default_device(ctx)


def list_gpus() -> range:
    """``range(number of usable GPUs)``: empty without a GPU."""
    return range(_device.num_gpus())


def default_dtype():
    return np.float32


def default_rtols() -> dict:
    return {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-5}


def default_atols() -> dict:
    return {np.dtype(np.float16): 1e-1, np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-20}


def _effective_dtype(x) -> np.dtype:
    dtype = np.dtype(x.dtype)
    on_gpu = isinstance(x, NDArray) and x.context.kind == "gpu"
    if dtype == np.float32 and on_gpu and math_mode() == "tf32":  # TF32 keeps ~10 mantissa bits, like fp16
        return np.dtype(np.float16)
    return dtype


def _tol(x, tol, defaults: dict) -> float:
    if isinstance(tol, numbers.Number):
        return float(tol)
    dtype = _effective_dtype(x)
    tol = tol or {}
    return float(tol.get(dtype, defaults.get(dtype, 0.0)))


def _tols(a, b, rtol, atol) -> tuple[float, float]:
    a = np.asarray(a) if isinstance(a, numbers.Number) else a
    b = np.asarray(b) if isinstance(b, numbers.Number) else b
    return (max(_tol(a, rtol, default_rtols()), _tol(b, rtol, default_rtols())),
            max(_tol(a, atol, default_atols()), _tol(b, atol, default_atols())))


def _host(x) -> np.ndarray:
    return x.numpy() if isinstance(x, NDArray) else np.asarray(x)


def same(a, b) -> bool:
    """Exactly equal shapes and values (NDArrays or numpy)."""
    return bool(np.array_equal(_host(a), _host(b)))


def almost_equal(a, b, rtol=None, atol=None, equal_nan: bool = False, use_broadcast: bool = True) -> bool:
    """``|a - b| <= atol + rtol * |b|`` everywhere (numpy's allclose) with MXNet's default tolerances."""
    rtol, atol = _tols(a, b, rtol, atol)
    a, b = _host(a), _host(b)
    if not use_broadcast and a.shape != b.shape:
        return False
    return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


def assert_almost_equal(a, b, rtol=None, atol=None, names: tuple = ("a", "b"), equal_nan: bool = False,
                        use_broadcast: bool = True, mismatches: tuple = (10, 10)) -> None:
    """Raise AssertionError unless ``a`` and ``b`` (NDArrays, numpy arrays or numbers) are close.

    The message gives the tolerances, the worst element (index, both values, its error in units of the
    tolerance) and how many elements fail.
    """
    rtol, atol = _tols(a, b, rtol, atol)
    x, y = _host(a), _host(b)
    if not use_broadcast and x.shape != y.shape:
        raise AssertionError(f"{names[0]}.shape = {x.shape} and {names[1]}.shape = {y.shape} are not equal")
    if x.dtype == np.bool_ and y.dtype == np.bool_:
        np.testing.assert_equal(x, y)
        return
    try:
        x, y = np.broadcast_arrays(x, y)
    except ValueError:
        raise AssertionError(f"{names[0]}.shape = {x.shape} and {names[1]}.shape = {y.shape} do not broadcast") \
            from None
    if np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.where(x64 == y64, 0.0, np.abs(x64 - y64))
        tol = atol + rtol * np.abs(y64)
        bad = ~np.isclose(x64, y64, rtol=rtol, atol=atol, equal_nan=equal_nan)
        violation = np.where(bad, np.nan_to_num(err / (tol + 1e-20), nan=np.inf), 0.0)
    idx = np.unravel_index(int(np.argmax(violation)), violation.shape) if violation.ndim else ()
    n_bad = int(bad.sum())
    raise AssertionError(
        f"Error {violation[idx]:f} exceeds tolerance rtol={rtol:e}, atol={atol:e} "
        f"({n_bad} of {x.size} elements, {100.0 * n_bad / max(x.size, 1):.4f}%). "
        f"Location of maximum error: {tuple(int(i) for i in idx)}, {names[0]}={x64[idx]:.8f}, "
        f"{names[1]}={y64[idx]:.8f}")


def assert_allclose(a, b, rtol: float = 1e-07, atol: float = 0, equal_nan: bool = True) -> None:
    assert_almost_equal(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)


def assert_exception(f, exception_type, *args, **kwargs) -> None:
    """Assert that ``f(*args, **kwargs)`` raises ``exception_type``."""
    try:
        f(*args, **kwargs)
    except exception_type:
        return
    raise AssertionError(f"{getattr(f, '__name__', f)} did not raise {exception_type.__name__}")


def random_arrays(*shapes):
    """Standard-normal float32 numpy arrays, one per shape (a single array for a single shape)."""
    arrays = [np.array(np.random.randn(), dtype=default_dtype()) if len(s) == 0
              else np.random.randn(*s).astype(default_dtype()) for s in shapes]
    return arrays[0] if len(arrays) == 1 else arrays


def rand_ndarray(shape, stype: str = "default", density=None, dtype=None, modifier_func=None,
                 shuffle_csr_indices: bool = False, distribution=None, ctx=None) -> NDArray:
    """A standard-normal NDArray of ``shape`` on ``ctx`` (default device); only dense storage is supported."""
    if stype != "default":
        raise NotImplementedError(f"mxnet.test_utils.rand_ndarray: sparse storage (stype={stype!r}) is not "
                                  "supported by dnnbind")
    host = random_arrays(tuple(shape))
    return array(host, device=ctx if ctx is not None else default_context(), dtype=dtype)


def rand_shape_2d(dim0: int = 10, dim1: int = 10, allow_zero_size: bool = False) -> tuple:
    low = 0 if allow_zero_size else 1
    return int(np.random.randint(low, dim0 + 1)), int(np.random.randint(low, dim1 + 1))


def rand_shape_3d(dim0: int = 10, dim1: int = 10, dim2: int = 10, allow_zero_size: bool = False) -> tuple:
    low = 0 if allow_zero_size else 1
    return tuple(int(np.random.randint(low, d + 1)) for d in (dim0, dim1, dim2))


def rand_shape_nd(num_dim: int, dim: int = 10, allow_zero_size: bool = False) -> tuple:
    low = 0 if allow_zero_size else 1
    return tuple(int(d) for d in np.random.randint(low, dim + 1, size=num_dim))


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if name not in _unsupported.NAMES["test_utils"]:  # a typo, not an MXNet feature
        raise _unsupported.missing("test_utils", name, obj=sys.modules[__name__])
    raise UnsupportedFeature(f"mxnet.test_utils.{name} is not supported by dnnbind yet (the symbolic checkers, "
                              "sparse arrays and downloads have no counterpart)")
