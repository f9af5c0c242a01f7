"""Dropout: ops.dropout (cudnnDropoutForward/Backward, one RNG state per cuDNN handle), nd.Dropout, nn.Dropout.

CPU: the prototypes against cuDNN's header; the reserve-size query and descriptors, host-only; the RNG-state
bookkeeping (seeding once per handle, re-seeding when mx.random.seed changes the generation, one descriptor per
rate attached by cudnnRestoreDropoutDescriptor, refusal to seed inside a recorded step) with the cuDNN calls
replaced by a fake that records them; MXNet's semantics on the cpu (numpy): predict-mode identity, mode="always",
p = 0, the scale, the kept fraction, ``axes`` (variational dropout), gradients, seeding.
The GPU tests are in test_gpu_dropout.py.
"""

from __future__ import annotations

import itertools
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

import dnnbind as mx
from dnnbind import autograd, nd
from dnnbind._lib import cudnn
from dnnbind._lib.hooks import RECORDING
from dnnbind.gluon import nn
from dnnbind.ops import dropout as DO
from dnnbind.ops.reference import dropout as RD
from dnnbind.runtime.array import NDArray
from dnnbind.runtime.device import Device
from tests._helpers import c_param_kind, ctypes_arg_kind, cudnn_ops_header

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DECLARED = ["cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor", "cudnnDropoutGetStatesSize",
            "cudnnDropoutGetReserveSpaceSize", "cudnnSetDropoutDescriptor", "cudnnRestoreDropoutDescriptor",
            "cudnnGetDropoutDescriptor", "cudnnDropoutForward", "cudnnDropoutBackward"]


def _within_binomial(kept: int, n: int, p: float, sigmas: float = 5.0) -> None:
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) <= sigmas * sd + 1, f"kept {kept} of {n}; expected {n * (1 - p):.0f} +- {sd:.1f}"


# -- prototypes, host-only queries ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DECLARED)
def test_prototype_matches_cudnn_ops_header(name):
    found = re.findall(rf"\b{name}\s*\(([^()]*)\)\s*;", cudnn_ops_header())
    assert len(found) == 1, f"{name}: {len(found)} prototypes in cudnn_ops_v9.h"
    params = [p for p in found[0].split(",") if p.strip()]
    restype, argtypes = cudnn.lib._table[name]
    assert restype.__name__ == "STATUS" and len(argtypes) == len(params), (name, params)
    for i, (p, t) in enumerate(zip(params, argtypes)):
        assert ctypes_arg_kind(t) == c_param_kind(p), f"{name} parameter {i} {p!r}: argtype {t.__name__}"


def test_reserve_size_and_descriptor_are_host_only():
    """No GPU needed: cuDNN packs the keep-mask into bits (n/8 bytes, rounded up); the query is cached."""
    for n in (1, 7, 1000, 10**6):
        for dtype in (F32, F16, F64):
            size = DO.reserve_size(n, dtype)
            assert math.ceil(n / 8) <= size <= math.ceil(n / 8) + 16, (n, dtype, size)
    assert (1000, F32) in DO._reserve
    d = DO.DropoutDesc()
    assert d._as_parameter_
    d.close()
    d.close()  # idempotent


# -- the RNG-state bookkeeping, with cuDNN's calls faked --------------------------------------------------------
_PTRS = itertools.count(0x7F0000000000, 0x100000)


def _fake(shape, dtype=F32, device=None):
    return NDArray._from_ptr(next(_PTRS), shape, dtype, device or Device("gpu", 0), None)


class FakeCudnn:
    """Records the dropout calls; the host-only queries go to the real library."""

    STATES = 6_815_744

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return getattr(cudnn.lib, name)

    def cudnnDropoutGetStatesSize(self, handle, size):
        self.calls.append(("states_size", handle))
        size._obj.value = self.STATES

    def cudnnSetDropoutDescriptor(self, desc, handle, p, states, nbytes, seed):
        self.calls.append(("set", desc._as_parameter_, handle, p, states, nbytes, seed))

    def cudnnRestoreDropoutDescriptor(self, desc, handle, p, states, nbytes, seed):
        self.calls.append(("restore", desc._as_parameter_, handle, p, states, nbytes))

    def cudnnDropoutForward(self, handle, desc, xd, x, yd, y, reserve, size):
        self.calls.append(("forward", handle, desc._as_parameter_, x, y, reserve, size))

    def cudnnDropoutBackward(self, handle, desc, dyd, dy, dxd, dx, reserve, size):
        self.calls.append(("backward", handle, desc._as_parameter_, dy, dx, reserve, size))

    def kinds(self):
        return [c[0] for c in self.calls]

    def take(self):
        out, self.calls = self.calls, []
        return out


class FakeBuffer:
    def __init__(self, nbytes, device, stream=None):
        self.nbytes, self.ptr = nbytes, next(_PTRS)


@pytest.fixture
def fake_cudnn(monkeypatch):
    lib = FakeCudnn()
    handle = SimpleNamespace(value=0x1000)
    monkeypatch.setattr(DO, "L", lib)
    monkeypatch.setattr(DO, "_states", {})
    monkeypatch.setattr(DO, "DeviceBuffer", FakeBuffer)
    monkeypatch.setattr(DO, "dnn", lambda x: handle.value)
    monkeypatch.setattr(DO, "out_like", lambda shape, dtype, device: _fake(shape, dtype))
    monkeypatch.setattr(DO, "current_stream", lambda device: SimpleNamespace(handle=0))
    lib.handle = handle
    return lib


def test_first_forward_seeds_once_later_ones_reuse_the_states(fake_cudnn):
    seeds = iter([11, 12, 13])
    x = _fake((4, 5))
    y, reserve = DO.dropout_forward(x, 0.5, lambda: next(seeds), 3)
    (size_call, set_call, fwd) = fake_cudnn.take()
    assert size_call == ("states_size", 0x1000)
    _, desc, h, p, states, nbytes, seed = set_call
    assert (h, p, nbytes, seed) == (0x1000, 0.5, FakeCudnn.STATES, 11)
    assert fwd == ("forward", 0x1000, desc, x.ptr, y.ptr, reserve.ptr, DO.reserve_size(20, F32))
    assert y.shape == (4, 5) and y.dtype == F32 and reserve.dtype == np.uint8
    assert reserve.size == DO.reserve_size(20, F32)
    DO.dropout_forward(x, 0.5, lambda: next(seeds), 3)  # same generation: no seeding, no seed drawn
    assert fake_cudnn.kinds() == ["forward"] and next(seeds) == 12
    st = DO._states[0x1000]
    assert st.seed == 11 and st.generation == 3 and st.states.ptr == states


def test_new_generation_reseeds_the_same_states_buffer(fake_cudnn):
    x = _fake((10,))
    DO.dropout_forward(x, 0.5, 5, 1)
    states = DO._states[0x1000].states.ptr
    fake_cudnn.take()
    DO.dropout_forward(x, 0.5, 6, 2)
    (set_call, fwd) = fake_cudnn.take()
    assert set_call[0] == "set" and set_call[4] == states and set_call[6] == 6  # no new buffer, no size query
    DO.dropout_forward(x, 0.5, 7, None)  # None: keep the states as they are
    assert fake_cudnn.kinds() == ["forward"]


def test_each_rate_gets_its_own_descriptor_by_restore_and_backward_uses_it(fake_cudnn):
    x = _fake((64,))
    DO.dropout_forward(x, 0.2, 1, 0)
    _, set_call, f1 = fake_cudnn.take()
    y2, r2 = DO.dropout_forward(x, 0.7, 1, 0)
    restore, f2 = fake_cudnn.take()
    assert restore[0] == "restore" and restore[3] == pytest.approx(0.7) and restore[4] == set_call[4]
    assert f2[2] == restore[1] != f1[2] == set_call[1]  # two descriptors, one states buffer, no re-seeding
    DO.dropout_forward(x, 0.2, 1, 0)
    assert fake_cudnn.take()[0][2] == f1[2]
    # NOTE: cudnnDropoutBackward reads the scale 1/(1-p) from the descriptor: the 0.7 forward's backward must
    # use the 0.7 descriptor although a 0.2 forward ran since.
    dx = DO.dropout_backward(_fake((64,)), r2, 0.7)
    (bwd,) = fake_cudnn.take()
    assert bwd[0] == "backward" and bwd[2] == f2[2] and bwd[4] == dx.ptr and bwd[5] == r2.ptr


def test_rates_per_handle_are_bounded(fake_cudnn, monkeypatch):
    monkeypatch.setattr(DO, "RATES_PER_HANDLE", 3)
    x = _fake((8,))
    for p in (0.1, 0.2, 0.3, 0.4, 0.5):
        DO.dropout_forward(x, p, 1, 0)
    assert sorted(DO._states[0x1000].descs) == pytest.approx([0.3, 0.4, 0.5])


def test_each_handle_has_its_own_states(fake_cudnn):
    x = _fake((8,))
    DO.dropout_forward(x, 0.5, 1, 0)
    fake_cudnn.handle.value = 0x2000
    DO.dropout_forward(x, 0.5, 2, 0)
    a, b = DO._states[0x1000], DO._states[0x2000]
    assert a.states.ptr != b.states.ptr and (a.seed, b.seed) == (1, 2)
    assert fake_cudnn.kinds().count("states_size") == 2


def test_backward_on_a_handle_without_states_seeds_it_and_a_forward_reseeds(fake_cudnn):
    n = 100
    reserve = _fake((DO.reserve_size(n, F32),), np.uint8)
    DO.dropout_backward(_fake((n,)), reserve, 0.5)
    assert fake_cudnn.kinds() == ["states_size", "set", "backward"]
    fake_cudnn.take()
    DO.dropout_forward(_fake((n,)), 0.5, 9, 0)
    set_call, _ = fake_cudnn.take()
    assert set_call[0] == "set" and set_call[6] == 9


def test_seeding_is_refused_while_a_step_records(fake_cudnn):
    x = _fake((8,))
    DO.dropout_forward(x, 0.5, 1, 0)
    RECORDING.append(object())
    try:
        DO.dropout_forward(x, 0.5, 1, 0)  # seeded already: fine
        DO.dropout_forward(x, 0.9, 1, 0)  # a new rate: a host-only restore, fine
        with pytest.raises(RuntimeError, match="seeded outside a captured or recorded step"):
            DO.dropout_forward(x, 0.5, 2, 1)
    finally:
        RECORDING.pop()
    assert fake_cudnn.kinds() == ["states_size", "set", "forward", "forward", "restore", "forward"]


def test_bad_arguments_and_empty_arrays_need_no_library(fake_cudnn):
    x = _fake((3, 4))
    with pytest.raises(ValueError, match="dropout_forward: p must be in"):
        DO.dropout_forward(x, 1.0)
    with pytest.raises(TypeError, match="dropout_forward: p must be a real"):
        DO.dropout_forward(x, "0.5")
    with pytest.raises(TypeError, match="dropout_forward: x has dtype int32"):
        DO.dropout_forward(_fake((3,), np.int32), 0.5)
    with pytest.raises(ValueError, match="reserve must be the uint8 array of 4 bytes"):
        DO.dropout_backward(x, _fake((3, 4)), 0.5)
    with pytest.raises(TypeError, match="seed must be an int"):
        DO.dropout_forward(x, 0.5, seed=lambda: "x")
    assert fake_cudnn.calls == []
    y, r = DO.dropout_forward(_fake((0, 4)), 0.5)
    assert y.shape == (0, 4) and r.size == 0 and DO.dropout_backward(_fake((0, 4)), r, 0.5).shape == (0, 4)
    assert fake_cudnn.calls == []


def test_mx_random_seed_reseeds_the_gpu_states_identically(fake_cudnn):
    """nd.Dropout draws the seed from nd.random only when cuDNN's states are (re)seeded: seed(7) twice seeds
    them with the same value, seed(8) with another."""
    x = _fake((6,))
    used = []
    for s in (7, 7, 8):
        nd.random.seed(s)
        nd.Dropout(x, p=0.5, mode="always")
        nd.Dropout(x, p=0.5, mode="always")
        used.append([c[6] for c in fake_cudnn.take() if c[0] == "set"])
    assert len(used[0]) == 1 and used[0] == used[1] != used[2]


def test_replayed_steps_do_not_replay_the_dropout_queries():
    from dnnbind.recording import _QUERY
    assert _QUERY.match("cudnnDropoutGetStatesSize") and _QUERY.match("cudnnDropoutGetReserveSpaceSize")
    assert _QUERY.match("cudnnCreateDropoutDescriptor")
    assert not _QUERY.match("cudnnDropoutForward") and not _QUERY.match("cudnnDropoutBackward")


def test_seed_counts_generations():
    g = nd.random.generation()
    nd.random.seed(1)
    nd.random.seed(1)
    assert nd.random.generation() == g + 2


# -- MXNet semantics on the cpu --------------------------------------------------------------------------------
def test_reference_twin():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (50, 40)).astype(F16)
    y, mask = RD.dropout_forward(x, 0.25, seed=3)
    assert y.dtype == F16 and mask.dtype == F16 and set(np.unique(mask)) <= {0, F16.type(1 / 0.75)}
    np.testing.assert_array_equal(y, x * mask)
    np.testing.assert_array_equal(RD.dropout_forward(x, 0.25, seed=3)[1], mask)  # the seed decides
    np.testing.assert_array_equal(RD.dropout_backward(x, mask, 0.25), x * mask)
    with pytest.raises(ValueError, match="dropout_backward: dy has shape"):
        RD.dropout_backward(x, mask[:2], 0.25)


def test_predict_mode_p0_and_bad_arguments():
    x = nd.array(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert nd.Dropout(x, p=0.5) is x  # outside train_mode: identity
    with autograd.train_mode():
        assert nd.Dropout(x, p=0.0) is x
    with autograd.predict_mode():
        assert nd.Dropout(x, p=0.5, mode="training") is x
        y = nd.Dropout(x, p=0.5, mode="always").numpy()
    assert set(np.unique(y[y != 0] / x.numpy()[y != 0])) == {2.0}
    with pytest.raises(ValueError, match="Invalid Input: .train., valid values are: {.always., .training.}, in operator Dropout"):
        nd.Dropout(x, mode="train")
    with pytest.raises(ValueError, match=r"Dropout: p must be in \[0, 1\)"):
        nd.Dropout(x, p=1.0)
    with pytest.raises(ValueError, match="Dropout: axis 2 is out of range"):
        nd.Dropout(x, p=0.5, mode="always", axes=(2,))


def test_cpu_values_fraction_and_gradient():
    p, n = 0.3, 200_000
    x = nd.array(np.random.default_rng(1).uniform(0.5, 1.5, n).astype(np.float32))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, p=p)
    dy = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    y.backward(nd.array(dy))
    yv, xv, g = y.numpy(), x.numpy(), x.grad.numpy()
    kept = yv != 0
    np.testing.assert_allclose(yv[kept], xv[kept] / (1 - p), rtol=1e-6)
    _within_binomial(int(kept.sum()), n, p)
    np.testing.assert_allclose(g[kept], dy[kept] / (1 - p), rtol=1e-6)
    assert (g[~kept] == 0).all()


@pytest.mark.parametrize("shape,axes", [((20, 30, 40), (1,)), ((20, 30, 40), (0, 2)), ((20, 30, 40), (-1,)),
                                        ((50, 60), 0), ((8, 3, 10, 10), (2, 3))])
def test_cpu_axes_share_the_mask_along_the_axes(shape, axes):
    p = 0.4
    x = nd.array(np.random.default_rng(3).uniform(0.5, 1.5, shape).astype(np.float32))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, p=p, axes=axes)
    y.backward()
    mask = y.numpy().astype(np.float64) / x.numpy()
    kept = mask > 0
    np.testing.assert_allclose(mask[kept], 1 / (1 - p), rtol=1e-6)
    shared = tuple(a % len(shape) for a in (axes if isinstance(axes, tuple) else (axes,)))
    first = kept[tuple(slice(0, 1) if i in shared else slice(None) for i in range(len(shape)))]
    np.testing.assert_array_equal(kept, np.broadcast_to(first, shape))  # one mask along the axes
    _within_binomial(int(first.sum()), first.size, p)
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 1 / (1 - p), 0), rtol=1e-6)  # d(sum y)/dx


def test_cpu_seed_repeats_masks():
    x = nd.array(np.ones((1000,), np.float32))

    def run(seed):
        nd.random.seed(seed)
        with autograd.train_mode():
            return nd.Dropout(x, p=0.5).numpy(), nd.Dropout(x, p=0.5, axes=(0,)).numpy()

    (a1, b1), (a2, b2), (a3, _) = run(7), run(7), run(8)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a1, a3)


def test_gluon_dropout_takes_axes():
    layer = nn.Dropout(0.5, axes=(1,))
    assert repr(layer) == "Dropout(p = 0.5, axes=(1,))" and repr(nn.Dropout(0.1)) == "Dropout(p = 0.1, axes=())"
    x = nd.array(np.ones((6, 50), np.float32))
    assert layer(x) is x
    with autograd.record():
        y = layer(x).numpy()
    assert ((y == y[:, :1]).all()) and set(np.unique(y)) <= {0.0, 2.0}
    with pytest.raises(ValueError, match="rate must be in"):
        nn.Dropout(1.0)


def test_cpu_ndarrays_take_the_numpy_twin():
    assert DO.dropout_forward.reference is RD.dropout_forward
    x = mx.array(np.ones((4, 4), np.float32), device=mx.cpu())
    y, mask = DO.dropout_forward(x, 0.5, 1)
    assert y.device.kind == "cpu" and set(np.unique(mask.numpy())) <= {0.0, 2.0}
    np.testing.assert_array_equal(y.numpy(), mask.numpy())
    np.testing.assert_array_equal(DO.dropout_backward(x, mask, 0.5).numpy(), mask.numpy())
