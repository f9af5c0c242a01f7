"""numpy names MXNet 1.x programs use that numpy 1.24 and 2 removed, back under the MXNet alias. Layer: top (the
MXNet alias); imports numpy only.

MXNet 1.x's own examples and most code written for it ran on numpy 1.1x: ``np.fromstring(buf, dtype=...)`` to read
MNIST's IDX files (example/image-classification/train_mnist.py), and the aliases ``np.float``, ``np.int``,
``np.bool``, ``np.object``, ``np.str`` (removed in numpy 1.24). With a current numpy those lines fail before MXNet
is even reached, which is one reason MXNet code no longer runs (the brief's numpy >= 1.24 problem). The alias puts
them back, as they were:

- ``np.float``/``int``/``bool``/``object``/``str``/``complex`` are the Python builtins they were aliases of;
- ``np.fromstring(data, dtype, count, sep='')`` on bytes (its removed binary mode) reads them as
  ``np.frombuffer(...).copy()`` did; the text mode (``sep`` given) is numpy's own, unchanged.

Only missing names and the removed binary mode are added: nothing numpy still does changes.
"""

from __future__ import annotations

import numpy as np

ALIASES = {"float": float, "int": int, "bool": bool, "object": object, "str": str, "complex": complex}

_numpy_fromstring = np.fromstring


def fromstring(string, dtype=float, count=-1, *, sep="", like=None):
    """numpy's ``fromstring``, with its binary mode (``sep=''``) as numpy < 2 had it: a copy of the bytes."""
    if sep == "":
        data = string.encode("latin-1") if isinstance(string, str) else string
        return np.frombuffer(data, dtype=dtype, count=count).copy()
    if like is not None:
        return _numpy_fromstring(string, dtype=dtype, count=count, sep=sep, like=like)
    return _numpy_fromstring(string, dtype=dtype, count=count, sep=sep)


def install() -> None:
    """Add what is missing (idempotent)."""
    for name, value in ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, value)
    if np.fromstring is _numpy_fromstring and int(np.__version__.split(".")[0]) >= 2:
        np.fromstring = fromstring
