"""The on-disk conv algorithm cache (ops.algo_cache): round trip, scoping, atomic writes, bad files. No GPU."""

from __future__ import annotations

import json
import os

import pytest

from dnnbind.ops import algo_cache

ID = "NVIDIA H100 80GB HBM3 sm_90 cudnn 91900"
KEY = ("bwd_filter", (64, 32, 14, 14), (64, 32, 3, 3), (1, 1), (1, 1), (1, 1), 1, "<f4", "fp32", "eager", False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DNNBIND_ALGO_CACHE", raising=False)
    algo_cache.forget()
    algo_cache._warned.clear()
    yield tmp_path
    algo_cache.forget()


def test_round_trip_survives_a_new_process_view(cache):
    assert algo_cache.lookup(ID, KEY) is None
    algo_cache.store(ID, KEY, (3, 14_112_768))
    other = KEY[:-2] + ("graph", False)
    algo_cache.store(ID, other, (5, 0))
    algo_cache.forget()  # as a new process would: read from the file
    assert algo_cache.lookup(ID, KEY) == (3, 14_112_768)
    assert algo_cache.lookup(ID, other) == (5, 0)
    files = os.listdir(cache)
    assert files == [os.path.basename(algo_cache.file_for(ID))], files  # no temp files left behind
    data = json.loads((cache / files[0]).read_text())
    assert data["identity"] == ID and data["format"] == algo_cache.FORMAT and len(data["entries"]) == 2


def test_choices_are_scoped_to_gpu_and_cudnn_version(cache):
    algo_cache.store(ID, KEY, (1, 0))
    assert algo_cache.lookup("NVIDIA H200 sm_90 cudnn 91900", KEY) is None
    assert algo_cache.lookup("NVIDIA H100 80GB HBM3 sm_90 cudnn 92800", KEY) is None
    # a file whose identity does not match its name (copied by hand) is ignored
    path = algo_cache.file_for("other gpu")
    os.replace(algo_cache.file_for(ID), path)
    algo_cache.forget()
    assert algo_cache.lookup("other gpu", KEY) is None


def test_writes_merge_with_another_process(cache):
    algo_cache.store(ID, KEY, (1, 0))
    # another process adds an entry to the file behind our back
    path = algo_cache.file_for(ID)
    data = json.loads(open(path).read())
    data["entries"]["('theirs',)"] = [7, 64]
    with open(path, "w") as f:
        json.dump(data, f)
    algo_cache.store(ID, KEY[:-1] + (True,), (0, 0))
    entries = json.loads(open(path).read())["entries"]
    assert entries["('theirs',)"] == [7, 64] and entries[repr(KEY)] == [1, 0] and len(entries) == 3


def test_corrupt_file_warns_once_and_is_replaced(cache):
    path = algo_cache.file_for(ID)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.warns(RuntimeWarning, match="unreadable conv algorithm cache"):
        assert algo_cache.lookup(ID, KEY) is None
    algo_cache.store(ID, KEY, (2, 0))
    algo_cache.forget()
    assert algo_cache.lookup(ID, KEY) == (2, 0)


def test_unwritable_dir_warns_and_keeps_the_choice_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(blocker / "sub"))  # cannot mkdir under a file
    algo_cache.forget()
    algo_cache._warned.clear()
    with pytest.warns(RuntimeWarning, match="cannot write the conv algorithm cache"):
        algo_cache.store(ID, KEY, (4, 0))
    assert algo_cache.lookup(ID, KEY) == (4, 0)
    algo_cache.forget()


def test_disabled_by_environment(cache, monkeypatch):
    monkeypatch.setenv("DNNBIND_ALGO_CACHE", "0")
    algo_cache.store(ID, KEY, (1, 0))
    assert algo_cache.lookup(ID, KEY) is None
    assert os.listdir(cache) == []


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("DNNBIND_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert algo_cache.cache_dir() == os.path.join(str(tmp_path), "dnnbind")
    assert algo_cache.file_for(ID).endswith("conv_algos_NVIDIA_H100_80GB_HBM3_sm_90_cudnn_91900.json")
