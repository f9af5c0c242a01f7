"""Layer 2 (ops): one front door for every op. Imports runtime and ops.reference.

``@op(reference_fn, "x", "w", "b")`` wraps a GPU implementation taking NDArrays. The wrapper routes:
- every array argument an NDArray on one GPU -> the implementation, directly (the hot path: one loop);
- NDArrays on the cpu -> the numpy twin on their buffers, results wrapped as cpu NDArrays;
- numpy arrays -> computed on the default device (the GPU when there is one) and returned as numpy;
- CUDA arrays of other libraries (CuPy, torch) -> wrapped without a copy, results as NDArrays;
- arrays on different devices -> ValueError naming the op and the devices;
- None for a required array, or anything that is no array of numbers -> TypeError naming the op and argument,
  before any library call (the op's own checks then refuse bad shapes with ValueError).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import functools
import inspect

import numpy as np

from .._lib import hooks
from .._lib.hooks import TRACING
from ..runtime.array import NDArray, array
from ..runtime.device import default_device


def op(reference, *array_names: str):
    def deco(impl):
        params = inspect.signature(impl).parameters
        names = list(params)
        positions = [(names.index(a), a) for a in array_names]
        required = frozenset(a for a in array_names if params[a].default is inspect.Parameter.empty)
        op_name = impl.__name__

        @functools.wraps(impl)
        def wrapper(*args, **kwargs):
            device = None
            fast = True
            for pos, name in positions:
                a = args[pos] if pos < len(args) else kwargs.get(name)
                if a is None:
                    if name in required:  # before any work: the GPU path would fail on None's attributes
                        raise _not_an_array(op_name, name, a)
                    continue
                if type(a) is not NDArray or not a.on_gpu:
                    fast = False
                    break
                if device is None:
                    device = a.device
                elif a.device is not device:
                    fast = False
                    break
            if TRACING:  # dnnbind.trace() is recording: name the op around its library calls
                with hooks.scope(op_name, op=True):
                    if fast:
                        return impl(*args, **kwargs)
                    return _slow_path(op_name, impl, reference, positions, required, args, kwargs)
            if fast:
                return impl(*args, **kwargs)
            return _slow_path(op_name, impl, reference, positions, required, args, kwargs)

        def gpu(*args, **kwargs):
            """The GPU implementation without the routing (what a lowering calls once the backend is decided),
            named after the op in a trace as the routed call is."""
            if TRACING:
                with hooks.scope(op_name, op=True):
                    return impl(*args, **kwargs)
            return impl(*args, **kwargs)

        wrapper.gpu = gpu
        wrapper.impl = impl  # the bare implementation: for ops composed of other ops (a deconvolution's forward is a
        # convolution's backward-data call), so a trace names the op the caller asked for
        wrapper.reference = reference
        wrapper.array_names, wrapper.required_arrays = tuple(array_names), required
        return wrapper
    return deco


def _not_an_array(op_name: str, name: str, a) -> TypeError:
    return TypeError(f"{op_name}: {name} must be an array (NDArray, numpy, CuPy or torch), got {type(a).__name__}")


def _slow_path(op_name, impl, reference, positions, required, args, kwargs):
    args = list(args)
    found = []
    for pos, name in positions:
        a = args[pos] if pos < len(args) else kwargs.get(name)
        if a is not None:
            found.append((pos, name, a))
        elif name in required:
            raise _not_an_array(op_name, name, a)
    kinds = set()
    devices = {}
    for i, (pos, name, a) in enumerate(found):
        if isinstance(a, NDArray):
            kinds.add("nd")
            devices[name] = a.device
        elif isinstance(a, (np.ndarray, np.generic, int, float, list, tuple)):
            found[i] = (pos, name, _numeric(op_name, name, a))  # checked once, here, before any work
            kinds.add("numpy")
        elif hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__"):
            kinds.add("foreign")
        else:
            raise _not_an_array(op_name, name, a)
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise DnnbindValueError(f"{op_name}: all arrays must be on one device, got {where}; move them with .to(device)")

    def put(pos, name, value):
        if pos < len(args):
            args[pos] = value
        else:
            kwargs[name] = value

    nd_device = next(iter(devices.values()), None)
    if kinds == {"numpy"} or (kinds <= {"numpy"} and not found):
        target = default_device()
        if target.kind == "cpu":
            for pos, name, a in found:
                put(pos, name, a)
            return _reference(op_name, reference, args, kwargs)
        for pos, name, a in found:
            put(pos, name, array(a, device=target))
        return _to_numpy(impl(*args, **kwargs))
    if nd_device is not None and nd_device.kind == "cpu":
        if "foreign" in kinds:
            raise DnnbindValueError(f"{op_name}: cannot mix cpu NDArrays with GPU arrays of another library")
        for pos, name, a in found:
            put(pos, name, a._data if isinstance(a, NDArray) else a)
        return _wrap_cpu(_reference(op_name, reference, args, kwargs))
    # GPU: NDArrays on one GPU mixed with numpy or foreign arrays
    if nd_device is None and "numpy" in kinds:  # whatever the order: no NDArray says where numpy data goes
        raise DnnbindValueError(f"{op_name}: cannot mix numpy arrays with GPU arrays of another library; "
                         "convert with dnnbind.array(x, device=...)")
    target = nd_device
    for pos, name, a in found:
        if isinstance(a, NDArray):
            continue
        if isinstance(a, np.ndarray):
            put(pos, name, array(a, device=target))
            continue
        wrapped = array(a)
        if target is None:
            target = wrapped.device
        elif wrapped.device is not target:
            raise DnnbindValueError(f"{op_name}: {name} is on {wrapped.device} but other arrays are on {target}")
        put(pos, name, wrapped)
    return impl(*args, **kwargs)


def _numeric(op_name: str, name: str, a) -> np.ndarray:
    """``a`` (numpy, a Python/numpy number or nested lists) as a numpy array of bools, ints or floats."""
    try:
        out = np.asarray(a)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise DnnbindTypeError(f"{op_name}: {name} is not an array: {exc}") from None
    if out.dtype.kind not in "biuf":
        raise DnnbindTypeError(f"{op_name}: {name} has dtype {out.dtype}; expected numbers (bool, int or float)")
    return out


def _reference(op_name, reference, args, kwargs):
    if TRACING:  # the numpy backend's calls appear in a trace as library "numpy"
        return hooks.timed_numpy(op_name, reference, *args, **kwargs)
    return reference(*args, **kwargs)


def _to_numpy(result):
    if isinstance(result, tuple):
        return tuple(_to_numpy(r) for r in result)
    return result.numpy() if isinstance(result, NDArray) else result


def _wrap_cpu(result):
    if isinstance(result, tuple):
        return tuple(_wrap_cpu(r) for r in result)
    return NDArray._from_numpy(np.ascontiguousarray(result)) if isinstance(result, np.ndarray) else result
