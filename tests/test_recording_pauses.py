"""CallRecording's two pieces behind a backward that overlaps its all-reduce (recording.py): ``last_uses`` (which
recorded call last points into a buffer) and ``replay(pauses=...)`` (the calls in parts, the host told between
them). On the cpu the recorded "library calls" are Python functions wrapped as the recorder wraps cuDNN's (its
``_wrap``, what ``intercept`` installs), so no library is needed; the GPU side (one CUDA graph per part, a launched
Trainer's buckets) is tested in test_grad_buckets.py.
"""

from __future__ import annotations

import ctypes

import pytest

from dnnbind._lib import hooks
from dnnbind.recording import CallRecording

BASE = 0x7F00_0000_0000  # device-like addresses (well above any small integer argument)


class _Pack:
    """A cuDNN variant pack as ops.conv_backend makes it: the pointers live inside, ``device_pointers`` says which."""

    def __init__(self, *ptrs) -> None:
        self.device_pointers = ptrs


class _Args(ctypes.Structure):  # a by-value kernel argument (the generated elementwise kernels' kind)
    _fields_ = [("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p)]


def _recorded(calls, log=None):
    """A recording of ``calls``: [(name, args)], each a fake library call (``name`` may be 'launch', whose args
    are the packed kernel parameters), replayed into ``log``."""
    rec = CallRecording()
    log = [] if log is None else log

    def body():
        for name, args in calls:
            if name == "launch":
                hooks.RECORDING[-1].launch("k", None, (0,) * 11, list(args))
                continue

            def fake(*a, _name=name):
                log.append(_name)
                return 0
            rec._wrap(None, name, fake)(*args)
    rec.record(body)
    return rec


def test_last_uses_reads_arguments_kernel_parameters_and_variant_packs():
    a, b, c, d = BASE, BASE + 4096, BASE + 8192, BASE + 12288  # four 4 KiB buffers
    rec = _recorded([
        ("cudnnConvolutionBackwardData", (a + 64, 5, 1 << 20)),  # into a (not at its start)
        ("cudnnBackendExecute", (1, 2, _Pack(b, c + 100))),  # b and c, through the pack
        ("launch", (ctypes.c_void_p(d), ctypes.c_int(7))),  # d, through a kernel parameter
        ("launch", (_Args(64, a, None),)),  # a again, through a struct field
        ("cudaLikeMemset", (c + 4095, 0, 1)),  # c's last byte
    ])
    ranges = [(a, a + 4096), (b, b + 4096), (c, c + 4096), (d, d + 4096), (BASE + 65536, BASE + 65600)]
    assert rec.last_uses(ranges) == [3, 1, 4, 2, -1]


def test_a_pack_that_hides_its_pointers_makes_last_uses_unknown():
    rec = _recorded([("cudnnBackendExecute", (1, 2, object())), ("cudnnFake", (BASE,))])
    assert rec.last_uses([(BASE, BASE + 16)]) is None


@pytest.mark.parametrize("cuts", [(1,), (1, 3), (2, 4), (4,)])
def test_replay_in_parts_tells_the_host_between_them_in_order(cuts):
    log = []
    rec = _recorded([(f"cudnnCall{i}", (BASE + i,)) for i in range(5)], log)
    log.clear()
    rec.replay(pauses=(cuts, lambda k: log.append(f"pause {k}")))
    want, k = [], 0
    for i in range(5):
        if k < len(cuts) and cuts[k] == i:
            want.append(f"pause {k}")
            k += 1
        want.append(f"cudnnCall{i}")
    assert log == want
    log.clear()
    rec.replay()  # without pauses: the calls alone, in order
    assert log == [f"cudnnCall{i}" for i in range(5)]
