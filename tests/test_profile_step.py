"""scripts/profile_step.py --per-op: every op call of an eager step timed by op kind, forward and backward, and the
registry's dispatch put back afterwards (cpu backend; the GPU numbers are in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import os

from dnnbind import autograd
from dnnbind.nd import _registry

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "profile_step.py")


def _script():
    spec = importlib.util.spec_from_file_location("profile_step", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_per_op_counts_each_op_kind_once_per_call(capsys):
    before = (_registry._lib_call, _registry._map, autograd.record_op)
    forward, backward = _script().main(["--device", "cpu", "--steps", "2", "--warmup", "1", "--per-op", "--batch",
                                        "4"])
    # SimpleCNN (fused conv+ReLU): two convolutions, two poolings and two dense layers a step, each with a backward
    for name in ("Convolution", "Pooling", "FullyConnected"):
        assert forward[name][0] == 4 and forward[name][1] > 0, (name, forward[name])
        assert backward[name][0] == 4 and backward[name][1] > 0, (name, backward[name])
    out = capsys.readouterr().out
    assert "forward (with autograd recording)" in out and "backward nodes" in out and "ms per step" in out
    assert (_registry._lib_call, _registry._map, autograd.record_op) == before  # measurement undone
