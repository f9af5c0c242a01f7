"""Under the MXNet alias, the numpy names MXNet-era programs use and numpy >= 1.24/2 removed are back (np.float &
co., np.fromstring's binary mode); nothing numpy still does changes."""

from __future__ import annotations

import numpy as np

from dnnbind.mxnet import _numpy_compat


def test_removed_names_come_back_and_existing_behaviour_stays(alias):
    assert np.float is float and np.int is int and np.object is object and np.str is str  # np.bool: numpy 2 has its own
    raw = np.arange(6, dtype=np.int8).tobytes()
    got = np.fromstring(raw, dtype=np.int8)
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.int8))
    got[0] = 9  # a copy, writable, as numpy 1.x's binary mode gave
    np.testing.assert_array_equal(np.fromstring("1 2 3", dtype=int, sep=" "), [1, 2, 3])  # text mode: numpy's
    np.testing.assert_array_equal(np.fromstring(raw, dtype=np.int16, count=2), np.frombuffer(raw, np.int16, 2))


def test_install_adds_only_what_is_missing(monkeypatch):
    monkeypatch.setattr(np, "float", "kept", raising=False)
    _numpy_compat.install()
    assert np.float == "kept"
