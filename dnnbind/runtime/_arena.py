"""Layer 1 (runtime): the sub-allocator one recording family (a recorded step, or a hybridized Block's forward and
backward for one signature) takes its memory from. Pure bookkeeping: no CUDA calls; runtime.memory gives it the
memory (a runtime._vmm.Region per stream: one contiguous range that grows at its end) and releases it.

Why not CUDA's pool directly: a recorded call replays on raw pointers, so memory the recording freed must stay
the recording's while it exists (its replays write into it again), yet the recording's later allocations should
reuse it, as an eager run reuses a dead activation for a gradient. Freed pool memory can't be used: CUDA's
memcpy and cuDNN's internal calls reject a pointer into a freed pool block (cudaErrorInvalidValue). Separate
cudaMallocAsync slabs, tried first, left ResNet-18's recording 55% above its live bytes: holes in different
slabs never merge. So the family's memory is one range, and this arena hands out pieces of it: best fit, a larger
hole split, a freed piece merged with the holes beside it, the range grown at its end when nothing fits (the
hole at the end grows with it). Pieces are reused only in the order a replay repeats (runtime.memory.Hold
decides which frees reach the arena).
"""

from __future__ import annotations

import bisect

ALIGN = 256  # what cudaMallocAsync guarantees, and what cuDNN and the vectorized kernels expect


class _Space:
    """One stream's range: the region, its holes (by address) and how many pieces are out."""

    __slots__ = ("region", "stream", "starts", "sizes", "live")

    def __init__(self, region, stream) -> None:
        self.region, self.stream, self.live = region, stream, 0
        self.starts, self.sizes = [], []


class Arena:
    """Pieces of growable ranges for one recording family. ``allocate(nbytes, stream, new_region)`` -> pointer,
    where ``new_region()`` makes a range (``base``, ``mapped``, ``grow(n) -> bytes added``); ``release(ptr)`` ->
    ``(region, stream)`` for the caller to release (the family is closed and that range has no piece left), else
    None. Pieces are reused on their own stream only: a replay repeats one stream's order."""

    def __init__(self) -> None:
        self.spaces: dict = {}  # stream handle -> _Space
        self.live: dict = {}  # piece pointer -> (its space, its size)
        self.holds: list = []  # the family's Holds not yet released (runtime.memory.Hold)
        self.closed = False
        self.in_use = self.peak = 0  # bytes in pieces now, and at most (no arrangement of pieces needs less)

    def allocate(self, nbytes: int, stream, new_region) -> int:
        n = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        space = self.spaces.get(stream.handle)
        if space is None:
            space = self.spaces[stream.handle] = _Space(new_region(), stream)
        starts, sizes = space.starts, space.sizes
        best = -1
        for i, size in enumerate(sizes):
            if size >= n and (best < 0 or size < sizes[best]):
                best = i
        if best < 0:  # grow the range at its end; a hole already there grows with it
            region = space.region
            end = region.base + region.mapped
            tail = sizes[-1] if starts and starts[-1] + sizes[-1] == end else 0
            added = region.grow(n - tail)
            if tail:
                sizes[-1] += added
            else:
                starts.append(end)
                sizes.append(added)
            best = len(starts) - 1
        ptr = starts[best]
        if sizes[best] == n:
            del starts[best], sizes[best]
        else:  # the front of the hole; the rest stays a hole
            starts[best] += n
            sizes[best] -= n
        space.live += 1
        self.live[ptr] = (space, n)
        self.in_use += n
        self.peak = max(self.peak, self.in_use)
        return ptr

    def release(self, ptr: int):
        space, n = self.live.pop(ptr)
        space.live -= 1
        self.in_use -= n
        starts, sizes = space.starts, space.sizes
        i = bisect.bisect(starts, ptr)
        if i > 0 and starts[i - 1] + sizes[i - 1] == ptr:  # merge with the hole before
            i -= 1
            sizes[i] += n
        else:
            starts.insert(i, ptr)
            sizes.insert(i, n)
        if i + 1 < len(starts) and starts[i] + sizes[i] == starts[i + 1]:  # and with the hole after
            sizes[i] += sizes.pop(i + 1)
            del starts[i + 1]
        if self.closed and space.live == 0:
            del self.spaces[space.stream.handle]
            return space.region, space.stream
        return None

    def close(self) -> list:
        """The family is gone: ``[(region, stream)]`` with no piece left, for the caller to release; the others go
        with their last piece (``release``)."""
        self.closed = True
        empty = [s for s in self.spaces.values() if s.live == 0]
        for s in empty:
            del self.spaces[s.stream.handle]
        return [(s.region, s.stream) for s in empty]

    def reserved(self) -> int:
        return sum(s.region.mapped for s in self.spaces.values())
