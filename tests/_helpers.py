"""Test helpers shared by the CPU and GPU test files: closeness with a useful message, numerical gradients.

Imports numpy only; `actual` may be anything with a `.numpy()` method (an NDArray), so GPU tests can pass
their results straight in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np


def _to_numpy(a) -> np.ndarray:
    if not isinstance(a, np.ndarray) and hasattr(a, "numpy"):
        a = a.numpy()
    return np.asarray(a)


def assert_close(actual, expected, rtol: float, atol: float, name: str = "value") -> None:
    """Assert |actual - expected| <= atol + rtol * |expected| elementwise (NaN matches only NaN).

    On failure the message gives the count of bad elements, the max absolute error and where it is, the
    tolerance, and the first bad index with both values.
    """
    a = _to_numpy(actual)
    e = _to_numpy(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")
    a64 = a.astype(np.float64)
    e64 = e.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(a64 - e64)
        tol = atol + rtol * np.abs(e64)
        same_special = (np.isnan(a64) & np.isnan(e64)) | ((a64 == e64) & np.isinf(e64))
        bad = ~((err <= tol) | same_special)
    if not bad.any():
        return
    finite_err = np.where(np.isfinite(err), err, -1.0)
    worst = np.unravel_index(int(np.argmax(finite_err)), a.shape) if a.ndim else ()
    first = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape) if a.ndim else ()
    idx = tuple(int(i) for i in first)
    got, want = float(a64[first]), float(e64[first])
    raise AssertionError(
        f"{name}: {int(bad.sum())} of {a.size} elements out of tolerance (rtol={rtol:g}, atol={atol:g}, "
        f"dtype {a.dtype} vs {e.dtype}); max abs error {float(err[worst]):.3g} at "
        f"{tuple(int(i) for i in worst)}; first bad index {idx}: actual {got!r} expected {want!r} "
        f"(error {float(err[first]):.3g} > tolerance {float(tol[first]):.3g})")


def numerical_grad(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, dy: np.ndarray,
                   eps: float = 1e-6) -> np.ndarray:
    """d/dx of sum(f(x) * dy) by central differences, one element at a time (use float64, small x)."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        plus = float(np.sum(np.asarray(f(x), dtype=np.float64) * dy))
        flat[i] = orig - eps
        minus = float(np.sum(np.asarray(f(x), dtype=np.float64) * dy))
        flat[i] = orig
        gflat[i] = (plus - minus) / (2 * eps)
    return grad


def nd_gradcheck(fn, arrays, device, rtol: float = 1e-5, atol: float = 1e-6, seed: int = 3) -> None:
    """Autograd through ``fn`` (dnnbind nd ops, float64 on ``device``) against central differences of the same
    function, with a random head gradient so every output element matters."""
    from dnnbind import autograd, nd
    rng = np.random.default_rng(seed)
    xs = [nd.array(a, ctx=device, dtype="float64") for a in arrays]
    for x in xs:
        x.attach_grad()
    with autograd.record():
        y = fn(*xs)
    w = rng.uniform(0.5, 1.5, y.shape)
    y.backward(nd.array(w, ctx=device, dtype="float64"))
    for i, a in enumerate(arrays):
        def f(v, i=i):
            vals = [nd.array(v if j == i else arrays[j], ctx=device, dtype="float64") for j in range(len(arrays))]
            return fn(*vals).numpy()
        assert_close(xs[i].grad, numerical_grad(f, a, w), rtol=rtol, atol=atol, name=f"grad of input {i}")


def cudnn_header(part: str = "ops") -> str:
    """The nvidia-cudnn wheel's cudnn_<part>.h (or cudnn_<part>_v9.h; part "ops", "adv", ...), comments removed;
    skips the test without it."""
    import importlib
    import re
    from pathlib import Path

    import pytest
    try:
        mod = importlib.import_module("nvidia.cudnn")
    except ImportError:
        pytest.skip("the nvidia-cudnn wheel (and its headers) is not installed")
    for base in mod.__path__:
        for name in (f"cudnn_{part}.h", f"cudnn_{part}_v9.h"):
            h = Path(base) / "include" / name
            if h.is_file():
                return re.sub(r"/\*.*?\*/|//[^\n]*", " ", h.read_text(errors="replace"), flags=re.DOTALL)
    pytest.skip(f"no cudnn_{part}.h in the nvidia-cudnn wheel")


def cudnn_ops_header() -> str:
    return cudnn_header("ops")


def c_param_kind(param: str) -> str:
    """A C parameter's ABI kind: ptr (pointers, descriptors, the handle), f32, f64, u64 or i32 (int and enums)."""
    p = " ".join(param.replace("const", " ").split())
    if "*" in p or "[" in p:
        return "ptr"
    typ = " ".join(p.split()[:-1])
    if typ.endswith("Descriptor_t") or typ == "cudnnHandle_t":
        return "ptr"
    # size_t and unsigned long long are both 64-bit unsigned here (ctypes makes c_size_t and c_ulonglong one type)
    kinds = {"float": "f32", "double": "f64", "size_t": "u64", "unsigned long long": "u64", "int": "i32",
             "int32_t": "i32", "uint32_t": "u32"}
    return kinds.get(typ) or ("i32" if typ.startswith("cudnn") and typ.endswith("_t") else typ)


def ctypes_arg_kind(t) -> str:
    """A ctypes argtype's ABI kind, as c_param_kind names them."""
    import ctypes
    if t is ctypes.c_void_p or issubclass(t, ctypes._Pointer):
        return "ptr"
    kinds = {ctypes.c_float: "f32", ctypes.c_double: "f64", ctypes.c_int: "i32", ctypes.c_uint32: "u32"}
    if t in kinds:
        return kinds[t]
    assert t._type_ in "LQ" and ctypes.sizeof(t) == 8, t
    return "u64"


@contextlib.contextmanager
def gluoncv_through_alias():
    """``with gluoncv_through_alias() as (mx, model_zoo):`` the mxnet alias installed and GluonCV's model_zoo imported
    through it (torch hidden while it loads: gluoncv_values.import_model_zoo). Skips the test without GluonCV. The
    alias is uninstalled after: it made cpu(0) the process default, as MXNet does, and later tests expect dnnbind's."""
    import pytest

    import dnnbind
    import gluoncv_values
    from dnnbind.mxnet import uninstall_mxnet_alias
    mx = dnnbind.install_mxnet_alias()
    try:
        try:
            model_zoo = gluoncv_values.import_model_zoo()
        except ImportError as exc:
            pytest.skip(f"gluoncv is not installed ({exc})")
        yield mx, model_zoo
    finally:
        uninstall_mxnet_alias()
