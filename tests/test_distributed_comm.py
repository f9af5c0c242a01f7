"""dnnbind.distributed.Communicator: NCCL collectives on dnnbind arrays. On the CPU: every argument is checked
before NCCL is called. On one GPU (marker ``gpu``): a clique of one, made both ways (ncclCommInitAll and
ncclCommInitRank with a unique id through the rendezvous), where each collective must return its input (a sum,
max or mean over one rank is the identity; gathering or scattering over one rank moves nothing), out of place
and in place, float32 and float16, eagerly and replayed from a captured CUDA graph. Multi-GPU results against
numpy sums need two GPUs (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import distributed, nd
from dnnbind.distributed import Communicator

RNG = np.random.default_rng(3)


def _fake(size=2, device="cpu"):
    """A communicator object that never reaches NCCL: the argument checks must fail first."""
    return Communicator(handle=1, rank=0, size=size, device=dnnbind.cpu() if device == "cpu" else device)


CPU = dnnbind.cpu()  # explicit: on a GPU machine nd.array defaults to the GPU


def test_arguments_are_checked_before_nccl():
    c = _fake()
    x = nd.array(RNG.standard_normal((4, 3)), ctx=CPU)
    with pytest.raises(TypeError, match="all_reduce: x must be a dnnbind NDArray, got ndarray"):
        c.all_reduce(np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"reduce_scatter: x's first axis must divide by size=2, got shape \(3,\)"):
        c.reduce_scatter(nd.array(RNG.standard_normal(3), ctx=CPU))
    with pytest.raises(ValueError, match=r"broadcast: root 2 must be in \[0, size=2\)"):
        c.broadcast(x, root=2)
    with pytest.raises(ValueError, match=r"all_gather: out has shape \(4, 3\).*expected \(8, 3\)"):
        c.all_gather(x, out=nd.zeros((4, 3), ctx=CPU))
    with pytest.raises(TypeError, match="NCCL has no data type for dtype bool"):
        c.all_reduce(nd.array(np.ones(3, bool), ctx=CPU, dtype=bool))
    with pytest.raises(ValueError, match="NCCL has no reduction op 'mean'"):
        c.all_reduce(x, op="mean")
    c.handle = None
    with pytest.raises(RuntimeError, match="all_reduce: the communicator is closed"):
        c.all_reduce(x)


def test_making_communicators_checks_its_arguments():
    with pytest.raises(ValueError, match="uid must be 128 bytes"):
        Communicator.from_unique_id(b"short", 0, 1, "gpu")
    with pytest.raises(ValueError, match=r"rank 2 must be in \[0, size=2\)"):
        Communicator.from_unique_id(bytes(128), 2, 2, "gpu")
    with pytest.raises(ValueError, match="NCCL communicates between GPUs"):
        Communicator.from_unique_id(bytes(128), 0, 1, "cpu")
    with pytest.raises(ValueError, match="Communicator.for_devices: needs distinct GPUs"):
        Communicator.for_devices(["gpu:0", "gpu:0"])


def test_a_gpu_array_must_be_on_the_communicators_device():
    c = _fake(device=dnnbind.gpu(0))
    with pytest.raises(ValueError, match=r"all_reduce: x \(shape \(2,\)\) is on cpu\(0\)"):
        c.all_reduce(nd.array([1.0, 2.0], ctx=CPU))


@pytest.fixture(scope="module")
def clique():
    comms = Communicator.for_devices([dnnbind.gpu(0)])
    yield comms[0]
    for c in comms:
        c.close()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(5, 3), (1,), (2, 1, 4)])
def test_collectives_over_one_rank_return_their_input(clique, dtype, shape):
    c, dev = clique, dnnbind.gpu(0)
    assert (c.rank, c.size) == (0, 1)
    h = RNG.standard_normal(shape).astype(dtype)
    x = nd.array(h, ctx=dev, dtype=dtype)
    for op in ("sum", "max", "avg"):
        np.testing.assert_array_equal(c.all_reduce(x, op=op).asnumpy(), h)
    np.testing.assert_array_equal(c.broadcast(x).asnumpy(), h)
    np.testing.assert_array_equal(c.all_gather(x).asnumpy(), h)
    np.testing.assert_array_equal(c.reduce_scatter(x).asnumpy(), h)
    y = nd.zeros(shape, ctx=dev, dtype=dtype)
    assert c.all_reduce(x, out=y) is y
    np.testing.assert_array_equal(y.asnumpy(), h)
    assert c.all_reduce(x, out=x) is x  # in place
    np.testing.assert_array_equal(x.asnumpy(), h)
    c.check()


@pytest.mark.gpu
def test_unique_id_through_the_rendezvous_and_a_captured_graph(monkeypatch):
    """init() in a world of one, communicator() (ncclGetUniqueId, the rendezvous, ncclCommInitRank); then an
    all-reduce inside a captured CUDA graph, replayed on new data."""
    from dnnbind.graph import CapturedStep
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    distributed.init()
    c = distributed.communicator()
    try:
        assert (c.rank, c.size, c.device) == (0, 1, dnnbind.gpu(0))
        x = nd.array(RNG.standard_normal((64,)).astype(np.float32), ctx=dnnbind.gpu(0))
        step = CapturedStep(lambda: c.all_reduce(x) * 2.0, inputs=[x], preserve=[])
        for _ in range(2):
            h = RNG.standard_normal((64,)).astype(np.float32)
            x.copy_(h)
            np.testing.assert_allclose(step().asnumpy(), 2 * h, rtol=1e-6)
    finally:
        c.close()
        distributed.shutdown()
    assert "closed" in repr(c)
