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


def test_a_recording_reuses_only_what_it_allocated_and_freed_itself(frees):
    """Temporaries of one recording share memory as an eager run's do (same size, same stream), never memory
    from before the recording and never after it ends; everything is freed at release."""
    hold = memory.Hold()
    other = types.SimpleNamespace(handle=8)
    with hold:
        hold.note(0x90000, 256)  # as DeviceBuffer does for what it allocates while a Hold records
        hold.note(0xA0000, 512)
        assert hold.reuse(256, STREAM) == 0  # nothing freed yet
        memory._free(0x90000, STREAM)
        memory._free(0xB0000, STREAM)  # allocated before the recording: deferred, not handed out
        assert hold.reuse(512, STREAM) == 0 and hold.reuse(256, other) == 0  # too large, other stream
        assert hold.reuse(256, STREAM) == 0x90000
        assert hold.reuse(256, STREAM) == 0  # handed out once
        memory._free(0xA0000, STREAM)
    assert hold.reuse(512, STREAM) == 0  # the recording is over
    hold.pin(hold.allocated)
    memory._free(0x90000, STREAM)  # the reused block's last array goes: deferred (pinned)
    assert frees == []
    hold.release()
    assert sorted(frees) == [0x90000, 0xA0000, 0xB0000]


def test_a_child_recording_reuses_what_its_parent_frees_while_it_records(frees):
    """A hybridized Block's backward recording reuses the activations its forward recording made and the
    backward releases; the forward's Hold still frees them."""
    fwd = memory.Hold()
    with fwd:
        fwd.note(0xC0000, 1024)
    fwd.pin(fwd.allocated)
    bwd = memory.Hold(parent=fwd)
    with bwd:
        memory._free(0xC0000, STREAM)  # the activation's last array goes during the backward
        assert bwd.reuse(1024, STREAM) == 0xC0000 and 0xC0000 not in fwd.deferred
        memory._free(0xC0000, STREAM)  # the gradient that reused it goes too
    bwd.pin(bwd.allocated)
    bwd.release()
    assert frees == []  # the forward still replays into it
    fwd.release()
    assert frees == [0xC0000]


def test_reuse_takes_the_smallest_freed_block_that_fits(frees):
    hold = memory.Hold()
    with hold:
        for ptr, size in ((0xD0000, 4096), (0xE0000, 1024), (0xF0000, 2048)):
            hold.note(ptr, size)
            memory._free(ptr, STREAM)
        assert hold.reuse(1500, STREAM) == 0xF0000  # 2048 fits best
        assert hold.reuse(1024, STREAM) == 0xE0000
        assert hold.reuse(5000, STREAM) == 0
        memory._free(0xF0000, STREAM)  # back under its own size
        assert hold.reuse(2048, STREAM) == 0xF0000
    hold.release()
    assert sorted(frees) == [0xD0000]  # the two handed out again are still in use (never freed after)


def test_a_child_recording_starts_with_what_its_parent_freed_and_did_not_reuse(frees):
    fwd = memory.Hold()
    with fwd:
        fwd.note(0x100000, 512)
        memory._free(0x100000, STREAM)  # a forward temporary, dead after its last use
    fwd.pin(fwd.allocated)
    bwd = memory.Hold(parent=fwd)
    with bwd:
        assert bwd.reuse(512, STREAM) == 0x100000  # a backward temporary takes it
    assert memory.Hold(parent=fwd).reuse(512, STREAM) == 0  # handed to one child only
    bwd.pin(bwd.allocated)
    bwd.release()
    fwd.release()
    assert frees == []  # in use again (the child's array never went): nothing to free
