"""Layer ops: the checks operator entries (ops/defs/) share, on parameters already parsed as MXNet parses them
(nd/_schema.py): per-axis geometry, whether a result fits what cuDNN and the device can take, a bias present
exactly when the parameters say so. Each refusal is a ValueError naming the op, the argument and the shapes, raised
before anything is allocated. Imports runtime and _lib.errors only.
"""

from __future__ import annotations

import math

from .._lib.errors import DnnbindValueError
from ..runtime.array import check_size

__all__ = ["INT32_MAX", "bias_matches", "check_fits", "spatial"]

INT32_MAX = 2 ** 31 - 1  # cuDNN's descriptors take int dims and strides


def spatial(op: str, name: str, value: tuple | None, dims: int, default: int, minimum: int, data_shape) -> tuple:
    """A per-spatial-axis parameter (stride, dilate, pad): unset (None or MXNet's empty default ``()``) is
    ``default`` on every axis; otherwise exactly ``dims`` values (MXNet: "must have the same number of dimensions
    with kernel"), each at least ``minimum``."""
    if not value:
        return (default,) * dims
    if len(value) != dims:
        raise DnnbindValueError(f"{op}: {name} {value} has {len(value)} value(s) but the kernel has {dims} "
                                f"(data {tuple(data_shape)}); give one per spatial axis")
    if min(value) < minimum:
        raise DnnbindValueError(f"{op}: {name} must be >= {minimum} on every axis, got {value} (data "
                                f"{tuple(data_shape)})")
    if max(value) > INT32_MAX:
        raise DnnbindValueError(f"{op}: {name} {value} is beyond the int32 range cuDNN takes (data "
                                f"{tuple(data_shape)})")
    return tuple(value)


def check_fits(op: str, device, dtype, what: str, shape: tuple, context: str = "", cudnn: bool = True) -> None:
    """Refuse, as a ValueError naming the op and the shapes, an array no device could hold or (``cudnn``) cuDNN
    describe: a dimension or a stride (the product of the dimensions after the first) beyond int32, or more bytes
    than the device's (or the host's) whole memory. Checked before anything is allocated."""
    tail = math.prod(shape[1:])
    if cudnn and (tail > INT32_MAX or (shape and max(shape) > INT32_MAX)):
        raise DnnbindValueError(f"{op}: {what} would have shape {shape}, beyond the int32 dimensions and strides "
                                f"cuDNN takes{context}")
    check_size(op, shape, dtype, device, what, context)


def bias_matches(op: str, bias, no_bias: bool, size: int) -> None:
    """A bias exactly when ``no_bias`` is False (MXNet counts the inputs against it)."""
    if no_bias and bias is not None:
        raise DnnbindValueError(f"{op}: a bias {bias.shape} was given but no_bias=True; pass no_bias=False or drop "
                                "the bias")
    if not no_bias and bias is None:
        raise DnnbindValueError(f"{op}: no_bias=False (the default) needs a bias of shape ({size},); pass it, "
                                "or no_bias=True")
