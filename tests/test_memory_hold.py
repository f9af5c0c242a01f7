"""runtime.memory.Hold without a GPU: what a recorded step points at is freed only when the step lets go."""

from __future__ import annotations

import types

import pytest

from dnnbind.runtime import memory


@pytest.fixture
def frees(monkeypatch):
    freed = []
    fake_rt = types.SimpleNamespace(cudaFreeAsync=lambda ptr, stream: freed.append(ptr))
    monkeypatch.setattr(memory, "cudart", types.SimpleNamespace(rt=lambda: fake_rt))
    yield freed
    assert not memory._holds and not memory._pinned, "a test left a Hold active"


STREAM = types.SimpleNamespace(handle=7)


def test_free_outside_any_hold_is_immediate(frees):
    memory._free(0x10000, STREAM)
    assert frees == [0x10000]


def test_frees_while_recording_wait_for_release(frees):
    hold = memory.Hold()
    with hold:
        memory._free(0x20000, STREAM)
        memory._free(0x30000, STREAM)
    assert frees == []
    memory._free(0x40000, STREAM)  # after recording and not pinned: freed at once
    assert frees == [0x40000]
    hold.release()
    assert sorted(frees) == [0x20000, 0x30000, 0x40000]


def test_pinned_pointer_freed_later_waits_for_release(frees):
    hold = memory.Hold()
    with hold:
        pass
    hold.pin([0x50000, 0x60000])
    memory._free(0x50000, STREAM)  # e.g. a workspace that grew after the recording
    assert frees == []
    hold.release()
    assert frees == [0x50000]
    memory._free(0x60000, STREAM)  # unpinned by release: a later free is a plain free
    assert frees == [0x50000, 0x60000]


def test_nested_holds_defer_to_the_innermost(frees):
    outer, inner = memory.Hold(), memory.Hold()
    with outer, inner:
        memory._free(0x70000, STREAM)
    outer.release()
    assert frees == []
    inner.release()
    assert frees == [0x70000]


def test_a_pointer_two_steps_pin_is_freed_after_both_let_go(frees):
    first, second = memory.Hold(), memory.Hold()
    first.pin([0x80000])
    second.pin([0x80000])  # e.g. two recorded steps over the same parameter buffer
    memory._free(0x80000, STREAM)
    first.release()
    assert frees == []  # the second step still replays with it
    second.release()
    assert frees == [0x80000]
