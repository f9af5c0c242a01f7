"""gluon.data.DistributedSampler: disjoint, covering, equal shares, the same order on every rank per epoch."""

import pytest

from dnnbind import gluon
from dnnbind.gluon.data import DistributedSampler


def _shares(length, n, epoch=0, **kw):
    out = []
    for r in range(n):
        s = DistributedSampler(length, num_replicas=n, rank=r, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
        assert len(out[-1]) == len(s)
    return out


@pytest.mark.parametrize("length,n", [(12, 4), (10, 4), (3, 4), (1, 1), (17, 3)])
def test_shares_are_equal_and_cover(length, n):
    shares = _shares(length, n)
    assert len({len(s) for s in shares}) == 1
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(length))
    assert len(flat) == -(-length // n) * n
    if length % n == 0:
        assert len(set(flat)) == len(flat)  # disjoint


def test_drop_last_is_disjoint_and_equal():
    shares = _shares(10, 4, drop_last=True)
    assert [len(s) for s in shares] == [2, 2, 2, 2]
    flat = [i for s in shares for i in s]
    assert len(set(flat)) == 8 and set(flat) <= set(range(10))


def test_deterministic_per_epoch_and_different_across_epochs():
    a, b = _shares(100, 4, epoch=3, seed=7), _shares(100, 4, epoch=3, seed=7)
    assert a == b
    assert _shares(100, 4, epoch=4, seed=7) != a
    assert _shares(100, 4, epoch=3, seed=8) != a


def test_epoch_advances_each_pass_and_set_epoch_overrides():
    s = DistributedSampler(50, num_replicas=2, rank=1, seed=1)
    first, second = list(s), list(s)
    assert first != second
    s.set_epoch(0)
    assert list(s) == first


def test_no_shuffle_is_strided():
    assert _shares(8, 2, shuffle=False) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_defaults_come_from_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(9, shuffle=False)
    assert list(s) == [2, 5, 8]
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert len(DistributedSampler(9)) == 9


def test_bad_rank_and_dataloader_use():
    with pytest.raises(ValueError, match="rank"):
        DistributedSampler(10, num_replicas=2, rank=2)
    import numpy as np
    ds = gluon.data.ArrayDataset(np.arange(10, dtype=np.float32))
    loader = gluon.data.DataLoader(ds, batch_size=5, sampler=DistributedSampler(10, 2, 0, shuffle=False))
    assert [b.asnumpy().tolist() for b in loader] == [[0, 2, 4, 6, 8]]
