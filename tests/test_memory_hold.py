"""runtime.memory.Hold without a GPU: what a recorded step points at is freed only when the step lets go."""

from __future__ import annotations

import types

import pytest

from dnnbind.runtime import memory
from dnnbind.runtime.device import Device


REGIONS = []  # the fake ranges made, in order


class _Region:
    """runtime._vmm.Region faked: ranges 0x10000000 apart, grown in 2 MiB steps."""

    def __init__(self, index):
        self.base, self.mapped, self.released = 0x10000000 * (len(REGIONS) + 1), 0, False
        REGIONS.append(self)

    def grow(self, nbytes):
        size = -(-nbytes // (2 << 20)) * (2 << 20)
        self.mapped += size
        return size

    def release(self):
        self.released = True


@pytest.fixture
def frees(monkeypatch):
    """The CUDA runtime faked: frees are listed; recordings' ranges are _Region."""
    freed = []
    REGIONS.clear()

    def call(name, *args):
        assert name == "cudaStreamIsCapturing", name
        return 0
    fake_rt = types.SimpleNamespace(cudaFreeAsync=lambda ptr, stream: freed.append(ptr))
    monkeypatch.setattr(memory, "cudart", types.SimpleNamespace(rt=lambda: fake_rt, call=call))
    monkeypatch.setattr(memory, "Region", _Region)
    yield freed
    assert not memory._holds and not memory._pinned, "a test left a Hold active"
    assert not memory._pieces, "a test left a piece allocated"


STREAM = types.SimpleNamespace(handle=7, synchronize=lambda: None, device=Device("cpu"))  # activate(): a no-op


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


DEVICE = types.SimpleNamespace(index=0)
MiB = 1 << 20


def test_a_recording_reuses_what_it_freed_while_recording_and_nothing_after(frees):
    """A free during the recording goes back into the family's arena at once (for its later pieces, in the order
    a replay repeats); after the recording a free of a piece waits for the family to let go."""
    hold = memory.Hold()
    with hold:
        a = hold.allocate(1000, DEVICE, STREAM)
        b = hold.allocate(512, DEVICE, STREAM)
        assert len(REGIONS) == 1 and a == REGIONS[0].base and b == a + 1024  # pieces 256-aligned
        memory._free(a, STREAM)  # a temporary: its piece is free again
        memory._free(0xB0000, STREAM)  # allocated before the recording (a recorded call may read it): deferred
        assert hold.allocate(700, DEVICE, STREAM) == a  # reused
        c = hold.allocate(300, DEVICE, STREAM)  # 1024 - 768 left before b: too small; after b
        assert c == b + 512 and REGIONS[0].mapped == 2 * MiB
        memory._free(a, STREAM)
    assert frees == [] and 0xB0000 in hold.deferred
    memory._free(b, STREAM)  # an activation kept past the recording: the replays still write it
    memory._free(c, STREAM)
    assert b in hold.deferred and not REGIONS[0].released
    hold.release()
    assert frees == [0xB0000] and REGIONS[0].released  # the range goes once all its pieces are back


def test_the_range_grows_at_its_end_and_the_hole_there_grows_with_it(frees):
    hold = memory.Hold()
    with hold:
        a = hold.allocate(MiB, DEVICE, STREAM)
        b = hold.allocate(3 * MiB, DEVICE, STREAM)  # 1 MiB hole at the end, grown by 2 MiB: b right after a
        assert b == a + MiB and REGIONS[0].mapped == 4 * MiB
        memory._free(a, STREAM)
        memory._free(b, STREAM)
        c = hold.allocate(4 * MiB, DEVICE, STREAM)  # a and b merged: no growth
        assert c == a and REGIONS[0].mapped == 4 * MiB
        memory._free(c, STREAM)
    hold.release()
    assert REGIONS[0].released and memory.recordings_reserved() == 0


def test_a_child_recording_shares_its_parents_arena_and_reuses_what_goes_while_it_records(frees):
    """A hybridized Block's backward recording allocates from its forward's arena: an activation the backward
    releases is reused for the backward's gradients; one released after the recordings waits for the family."""
    fwd = memory.Hold()
    with fwd:
        act1, act2 = fwd.allocate(4 * MiB, DEVICE, STREAM), fwd.allocate(4 * MiB, DEVICE, STREAM)
    fwd.pin([act1, act2, 0x50000])  # the family's own pieces are not pinned; a parameter is
    assert act1 not in memory._pinned and 0x50000 in memory._pinned
    bwd = memory.Hold(parent=fwd)
    assert bwd.arena is fwd.arena
    with bwd:
        memory._free(act1, STREAM)  # its last read was in this backward
        g1, g2 = bwd.allocate(MiB, DEVICE, STREAM), bwd.allocate(3 * MiB, DEVICE, STREAM)
        assert (g1, g2) == (act1, act1 + MiB) and REGIONS[0].mapped == 8 * MiB  # the activation's piece, split
        memory._free(g1, STREAM)
        memory._free(g2, STREAM)
    memory._free(act2, STREAM)  # after both recordings: deferred to the family's latest Hold
    assert act2 in bwd.deferred
    bwd.release()
    assert act2 in fwd.deferred and not REGIONS[0].released  # the forward's replays still write it
    fwd.release()
    assert REGIONS[0].released and frees == []  # 0x50000 was pinned, never freed: nothing to do


def test_each_stream_has_its_own_range(frees):
    hold = memory.Hold()
    other = types.SimpleNamespace(handle=8, synchronize=lambda: None, device=Device("cpu"))
    with hold:
        a = hold.allocate(256, DEVICE, STREAM)
        memory._free(a, STREAM)
        d = hold.allocate(256, DEVICE, other)  # another stream: never a piece of this stream's range
        assert len(REGIONS) == 2 and d == REGIONS[1].base
        memory._free(d, other)
    hold.release()
    assert all(r.released for r in REGIONS)


def test_another_recordings_pieces_freed_while_one_records_wait(frees):
    """A piece of family A freed while family B records (B's calls may have read it) waits for B, then for A."""
    a = memory.Hold()
    with a:
        buf = a.allocate(256, DEVICE, STREAM)
    b = memory.Hold()
    with b:
        memory._free(buf, STREAM)
    assert buf in b.deferred
    b.release()
    assert buf in a.deferred and not REGIONS[0].released  # A's replays still use it
    a.release()
    assert REGIONS[0].released


def test_a_piece_another_family_pins_is_deferred_even_while_its_own_family_records(frees):
    a, b = memory.Hold(), memory.Hold()
    with a:
        buf = a.allocate(256, DEVICE, STREAM)
    b.pin([buf])  # e.g. B's calls read A's output
    child = memory.Hold(parent=a)
    with child:
        memory._free(buf, STREAM)
    assert buf in b.deferred
    b.release()
    child.release()
    a.release()
    assert REGIONS[0].released


def test_a_range_outlives_the_family_while_a_piece_of_it_is_in_use(frees):
    """A recorded step's output handed to the caller keeps its range after the step is closed."""
    hold = memory.Hold()
    with hold:
        out = hold.allocate(256, DEVICE, STREAM)
    hold.release()
    assert not REGIONS[0].released and memory.recordings_reserved() == 2 * MiB
    memory._free(out, STREAM)
    assert REGIONS[0].released and memory.recordings_reserved() == 0


def test_a_range_freed_while_its_stream_is_captured_waits_for_the_next_recording(frees, monkeypatch):
    hold = memory.Hold()
    with hold:
        out = hold.allocate(256, DEVICE, STREAM)
    hold.release()
    monkeypatch.setattr(memory.cudart, "call", lambda name, *args: 1)  # cudaStreamCaptureStatusActive
    memory._free(out, STREAM)
    assert not REGIONS[0].released and memory._graveyard
    monkeypatch.setattr(memory.cudart, "call", lambda name, *args: 0)
    memory.Hold().release()
    assert REGIONS[0].released and not memory._graveyard
