"""Layer 2 (ops): one front door for every op. Imports runtime and ops.reference.

``@op(reference_fn, "x", "w", "b")`` wraps a GPU implementation taking NDArrays. The wrapper routes:
- every array argument an NDArray on one GPU -> the implementation, directly (the hot path: one loop);
- NDArrays on the cpu -> the numpy twin on their buffers, results wrapped as cpu NDArrays;
- numpy arrays -> computed on the default device (the GPU when there is one) and returned as numpy;
- CUDA arrays of other libraries (CuPy, torch) -> wrapped without a copy, results as NDArrays;
- arrays on different devices -> ValueError naming the op and the devices.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .._lib.cfunc import TRACING
from ..runtime.array import NDArray, array
from ..runtime.device import default_device


def op(reference, *array_names: str):
    def deco(impl):
        names = list(inspect.signature(impl).parameters)
        positions = [(names.index(a), a) for a in array_names]
        op_name = impl.__name__

        @functools.wraps(impl)
        def wrapper(*args, **kwargs):
            device = None
            fast = True
            for pos, name in positions:
                a = args[pos] if pos < len(args) else kwargs.get(name)
                if a is None:
                    continue
                if type(a) is not NDArray or a._data is not None:
                    fast = False
                    break
                if device is None:
                    device = a._device
                elif a._device is not device:
                    fast = False
                    break
            if TRACING:  # dnnbind.trace() is recording: name the op around its library calls
                from .. import trace
                with trace.scope(op_name, op=True):
                    if fast:
                        return impl(*args, **kwargs)
                    return _slow_path(op_name, impl, reference, positions, args, kwargs)
            if fast:
                return impl(*args, **kwargs)
            return _slow_path(op_name, impl, reference, positions, args, kwargs)

        wrapper.gpu = impl
        wrapper.reference = reference
        return wrapper
    return deco


def _slow_path(op_name, impl, reference, positions, args, kwargs):
    args = list(args)
    found = []
    for pos, name in positions:
        a = args[pos] if pos < len(args) else kwargs.get(name)
        if a is not None:
            found.append((pos, name, a))
    kinds = set()
    devices = {}
    for _, name, a in found:
        if isinstance(a, NDArray):
            kinds.add("nd")
            devices[name] = a.device
        elif isinstance(a, np.ndarray) or np.isscalar(a) or isinstance(a, (list, tuple)):
            kinds.add("numpy")
        elif hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__"):
            kinds.add("foreign")
        else:
            raise TypeError(f"{op_name}: {name} must be an array (NDArray, numpy, CuPy or torch), "
                            f"got {type(a).__name__}")
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op_name}: all arrays must be on one device, got {where}; move them with .to(device)")

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
                put(pos, name, np.asarray(a))
            return _reference(op_name, reference, args, kwargs)
        for pos, name, a in found:
            put(pos, name, array(np.asarray(a), device=target))
        return _to_numpy(impl(*args, **kwargs))
    if nd_device is not None and nd_device.kind == "cpu":
        if "foreign" in kinds:
            raise ValueError(f"{op_name}: cannot mix cpu NDArrays with GPU arrays of another library")
        for pos, name, a in found:
            put(pos, name, a._data if isinstance(a, NDArray) else np.asarray(a, dtype=None))
        return _wrap_cpu(_reference(op_name, reference, args, kwargs))
    # GPU: NDArrays on one GPU mixed with numpy or foreign arrays
    target = nd_device
    for pos, name, a in found:
        if isinstance(a, NDArray):
            continue
        if isinstance(a, np.ndarray) or np.isscalar(a) or isinstance(a, (list, tuple)):
            if target is None:
                raise ValueError(f"{op_name}: cannot mix numpy arrays with GPU arrays of another library; "
                                 "convert with dnnbind.array(x, device=...)")
            put(pos, name, array(np.asarray(a), device=target))
            continue
        wrapped = array(a)
        if target is None:
            target = wrapped.device
        elif wrapped.device is not target:
            raise ValueError(f"{op_name}: {name} is on {wrapped.device} but other arrays are on {target}")
        put(pos, name, wrapped)
    return impl(*args, **kwargs)


def _reference(op_name, reference, args, kwargs):
    if TRACING:  # the numpy backend's calls appear in a trace as library "numpy"
        from .. import trace
        return trace.timed_numpy(op_name, reference, *args, **kwargs)
    return reference(*args, **kwargs)


def _to_numpy(result):
    if isinstance(result, tuple):
        return tuple(_to_numpy(r) for r in result)
    return result.numpy() if isinstance(result, NDArray) else result


def _wrap_cpu(result):
    if isinstance(result, tuple):
        return tuple(_wrap_cpu(r) for r in result)
    return NDArray._from_numpy(np.ascontiguousarray(result)) if isinstance(result, np.ndarray) else result
