"""runtime.staging: host-to-device uploads through pinned buffers give the same bytes as the plain path, for every
size, dtype and layout of the source, also when the buffers are reused while earlier copies are still queued."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dnnbind as mx
from dnnbind.runtime import staging

pytestmark = pytest.mark.gpu


@pytest.fixture
def counted(gpu, monkeypatch):
    """Counts the uploads that took the pinned path."""
    taken = []
    real = staging.upload

    def upload(dst, host, stream):
        ok = real(dst, host, stream)
        taken.append(ok)
        return ok
    monkeypatch.setattr(sys.modules["dnnbind.runtime.array"], "upload", upload)  # (the module, not nd.array)
    return taken


@pytest.mark.parametrize("shape,dtype", [((3, 5), np.float32), ((1,), np.float64), ((512, 1024), np.float32),
                                         ((700, 999), np.float16), ((2, 3, 256, 256), np.int32),
                                         ((1 << 21,), np.uint8)])
def test_upload_matches_the_source(counted, shape, dtype):
    rng = np.random.default_rng(sum(shape))
    src = (rng.standard_normal(shape) * 100).astype(dtype)
    out = mx.nd.array(src, ctx=mx.gpu(0), dtype=dtype)
    np.testing.assert_array_equal(out.asnumpy(), src)
    assert counted == [src.nbytes >= staging.MIN_BYTES]


def test_non_contiguous_and_broadcast_sources(counted):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((600, 1200)).astype(np.float32)
    view = base[:, ::2]  # 1.4 MB, not contiguous
    out = mx.nd.array(view, ctx=mx.gpu(0))
    np.testing.assert_array_equal(out.asnumpy(), view)
    dst = mx.nd.zeros((600, 600), ctx=mx.gpu(0))
    dst.copy_(np.float32(2.5))  # a scalar broadcast to 1.4 MB
    np.testing.assert_array_equal(dst.asnumpy(), np.full((600, 600), 2.5, np.float32))
    assert counted and all(counted)


def test_stages_reused_while_copies_are_queued(counted):
    """More uploads than stages, each behind GPU work that is still running: every array keeps its own bytes (a
    stage is overwritten only after its earlier copy was made)."""
    rng = np.random.default_rng(2)
    big = mx.nd.array(rng.standard_normal((2048, 2048)).astype(np.float32), ctx=mx.gpu(0))
    srcs, outs = [], []
    for i in range(3 * staging.STAGES + 1):
        for _ in range(4):  # GPU work queued before the copy, so the copy waits in the stream
            big = mx.nd.dot(big, big) * 1e-3
        src = np.full((512, 1024 + 64 * i), float(i), np.float32) + rng.standard_normal((512, 1024 + 64 * i)).astype(
            np.float32)
        srcs.append(src.copy())
        outs.append(mx.nd.array(src, ctx=mx.gpu(0)))
        src[...] = -1.0  # the caller reuses its numpy buffer at once: the upload must not read it later
    for i, (src, out) in enumerate(zip(srcs, outs)):
        np.testing.assert_array_equal(out.asnumpy(), src, err_msg=f"upload {i}")
    assert len(counted) == len(srcs) + 1 and all(counted)
