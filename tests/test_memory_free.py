"""runtime.memory: a failing cudaFreeAsync is reported, never swallowed. No GPU: the CUDA runtime is faked."""

from __future__ import annotations

import warnings

import pytest

from dnnbind._lib import cudart
from dnnbind._lib.errors import CudaError
from dnnbind.runtime import memory
from dnnbind.runtime.device import Device


class _Stream:
    handle = 0x5000
    device = Device("cpu")  # a stream carries its device (made current before a free); the cpu's is a no-op

    def __repr__(self) -> str:
        return "Stream(fake)"


class _FakeRuntime:
    """cudaFreeAsync returns ``status`` (cuda-python style: a 1-tuple) and remembers its calls."""

    def __init__(self, status: int):
        self.status, self.calls = status, []

    def cudaFreeAsync(self, ptr, stream):
        self.calls.append((ptr, stream))
        return (self.status,)

    def cudaGetErrorString(self, err):
        return 0, b"an illegal memory access was encountered"


@pytest.fixture
def fake_rt(monkeypatch):
    def install(status: int) -> _FakeRuntime:
        rt = _FakeRuntime(status)
        monkeypatch.setattr(cudart, "rt", lambda: rt)
        return rt
    monkeypatch.setattr(memory, "_warned", [])
    monkeypatch.setattr(memory, "_shutting_down", False)
    return install


def _buffer(ptr: int) -> memory.DeviceBuffer:
    """A DeviceBuffer as if allocated at ``ptr`` (no GPU: __init__ is skipped)."""
    buf = memory.DeviceBuffer.__new__(memory.DeviceBuffer)
    buf.ptr, buf.nbytes, buf.device, buf.stream = ptr, 256, None, _Stream()
    return buf


def test_free_success_calls_cuda_once(fake_rt):
    rt = fake_rt(0)
    buf = _buffer(0x7000)
    buf.free()
    buf.free()  # idempotent: the pointer is forgotten after the first
    assert rt.calls == [(0x7000, 0x5000)] and buf.ptr == 0


def test_free_failure_raises_cuda_error_naming_pointer_and_status(fake_rt):
    fake_rt(700)
    buf = _buffer(0x7100)
    with pytest.raises(CudaError) as info:
        buf.free()
    exc = info.value
    assert exc.status == 700 and exc.function == "cudaFreeAsync"
    assert "illegal memory access" in str(exc) and "0x7100" in str(exc) and "Stream(fake)" in str(exc)
    assert buf.ptr == 0  # not freed twice


def test_failure_in_del_warns_once(fake_rt):
    rt = fake_rt(700)
    buf = _buffer(0x7200)
    with pytest.warns(RuntimeWarning, match="cudaFreeAsync failed .* status 700.*may leak"):
        del buf
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure: no second warning
        buf = _buffer(0x7300)
        del buf
    assert [p for p, _ in rt.calls] == [0x7200, 0x7300]


def test_at_exit_nothing_is_called(fake_rt, monkeypatch):
    rt = fake_rt(700)
    monkeypatch.setattr(memory, "_shutting_down", True)
    _buffer(0x7400).free()
    assert rt.calls == []


def test_hold_release_frees_everything_then_raises_the_first_failure(fake_rt):
    rt = fake_rt(700)
    hold = memory.Hold()
    hold.deferred = {0x7500: _Stream(), 0x7600: _Stream()}
    with pytest.raises(CudaError, match="0x7500"):
        hold.release()
    assert [p for p, _ in rt.calls] == [0x7500, 0x7600] and hold.deferred == {}
