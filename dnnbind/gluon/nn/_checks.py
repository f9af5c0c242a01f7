"""Argument checks of the nn layers' constructors: sizes are ints in range, and a bad one is a ValueError or
TypeError naming the layer and the argument. Layer: gluon; imports numpy and _lib.errors.

MXNet 1.9.1 takes most bad sizes when the layer is made and fails at the first call (``Dense(0)``: "value 0 for
Parameter num_hidden should be greater equal to 1"), or crashes (``Conv2D(4, 3, groups=0)``: SIGFPE). Here the
constructor refuses them, with the same meaning: ValueError for a value out of range, TypeError for a non-int.
"""

from __future__ import annotations

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError

__all__ = ["axis", "size"]

MAX = 2**31 - 1  # cuDNN and cuBLAS take sizes as int32


def size(layer: str, arg: str, value, minimum: int = 1) -> int:
    """``value`` as an int in [minimum, MAX]; ``minimum=0`` where 0 means "inferred from the first input"."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"{layer}: {arg} must be an int, got {value!r} ({type(value).__name__})")
    if not minimum <= value <= MAX:
        what = " (0: inferred from the first input)" if minimum == 0 else ""
        raise DnnbindValueError(f"{layer}: {arg} must be an int in [{minimum}, {MAX}]{what}, got {value}")
    return int(value)


def axis(layer: str, value) -> int:
    """An axis argument: an int (negative counts from the end; checked against the input when it comes)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise DnnbindTypeError(f"{layer}: axis must be an int, got {value!r} ({type(value).__name__})")
    return int(value)
