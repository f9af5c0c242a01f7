"""Layer 1 (runtime): one growable, contiguous range of device memory through CUDA's virtual memory management
(``cuMemAddressReserve`` once, then ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess`` for each extension at its
end). Imports _lib.errors and cuda.bindings.driver.

A recording family's arena (runtime._arena) lives in one of these: the range only grows at its end, so a hole at
the end grows with it and freed neighbours always merge, which separate cudaMallocAsync slabs can't do (each is
its own allocation, and a piece can't span two). PyTorch's "expandable segments" use the same driver calls.
"""

from __future__ import annotations

from .._lib.errors import CudaDriverError

_drv = None


def _driver():
    global _drv
    if _drv is None:
        from cuda.bindings import driver
        _drv = driver
    return _drv


def _call(function: str, *args):
    result = getattr(_driver(), function)(*args)
    status = int(result[0])
    if status != 0:
        try:
            text = _driver().CUresult(status).name
        except ValueError:
            text = "unknown CUresult"
        raise CudaDriverError(status, function, text, "a recording's device memory (runtime._vmm)")
    return result[1] if len(result) == 2 else tuple(result[1:]) or None


class Region:
    """``[base, base + mapped)`` of device ``index``'s memory, readable and writable there; ``grow(n)`` maps at
    least ``n`` more bytes at the end and returns how many. ``release()`` unmaps it all: the caller first makes
    sure no queued work still uses it."""

    def __init__(self, index: int) -> None:
        drv = _driver()
        self.index = index
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        self._prop = prop
        self.granularity = int(_call("cuMemGetAllocationGranularity", prop,
                                     drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        device = _call("cuDeviceGet", index)
        total = int(_call("cuDeviceTotalMem", device))
        # NOTE: address space only (no memory): as much as the device has, so the range never needs to move
        self.reserved = -(-total // self.granularity) * self.granularity
        self.base = int(_call("cuMemAddressReserve", self.reserved, 0, 0, 0))
        self.mapped = 0
        self._chunks: list = []  # (address, bytes, handle)

    def grow(self, nbytes: int) -> int:
        size = -(-nbytes // self.granularity) * self.granularity
        if self.mapped + size > self.reserved:
            raise CudaDriverError(2, "cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY",
                                  f"a recording needs {self.mapped + size} bytes, more than device {self.index} has")
        drv = _driver()
        handle = _call("cuMemCreate", size, self._prop, 0)
        at = self.base + self.mapped
        try:
            _call("cuMemMap", at, size, 0, handle, 0)
            access = drv.CUmemAccessDesc()
            access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = self.index
            access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            _call("cuMemSetAccess", at, size, [access], 1)
        except CudaDriverError:
            try:
                _call("cuMemUnmap", at, size)
            except CudaDriverError:
                pass
            _call("cuMemRelease", handle)
            raise
        self._chunks.append((at, size, handle))
        self.mapped += size
        return size

    def release(self) -> None:
        chunks, self._chunks = self._chunks, []
        for at, size, handle in chunks:
            _call("cuMemUnmap", at, size)
            _call("cuMemRelease", handle)
        if self.reserved:
            _call("cuMemAddressFree", self.base, self.reserved)
        self.mapped = self.reserved = 0
