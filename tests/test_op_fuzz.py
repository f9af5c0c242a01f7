"""Fuzzing the @op family: every op called with bad arguments (non-arrays, wrong dtypes, None) raises only
TypeError/ValueError naming the op, on the CPU and (marked gpu) on the GPU; and the process stays usable.
Split from tests/test_op_errors.py, whose inputs it shares."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import dnnbind
from dnnbind.ops import reference as R
from tests.test_op_errors import DY, DYT, L, LAB, P, W, WT, X, rand


# -- fuzz: every op of the @op family with bad arguments, on the CPU ---------------------------------------

def _op_family() -> dict:
    """The ops that go through ops._dispatch.op (they carry ``.array_names``)."""
    return {name: getattr(dnnbind.ops, name) for name in dnnbind.ops.__all__
            if hasattr(getattr(dnnbind.ops, name), "array_names")}


# A valid call of each @op op: positional arguments (arrays first, as the op names them) and keywords.
VALID = {
    "conv_forward": ((X, W, rand((5,), seed=1)), {"padding": 1}),
    "conv_bias_relu_forward": ((X, W, rand((5,), seed=2)), {}),
    "conv_backward_data": ((W, DY, X.shape), {}),
    "conv_backward_filter": ((X, DY, W.shape), {}),
    "conv_backward_bias": ((DY,), {}),
    "bias_relu_backward": ((rand(DY.shape, seed=37), DY), {}),
    "bias_relu_wgrad": ((X, rand(DY.shape, seed=38), DY, W.shape), {}),
    "deconv_forward": ((X, WT, rand((2,), seed=15)), {"stride": 2, "adj": 1}),
    "deconv_backward_data": ((WT, DYT, X.shape), {}),
    "deconv_backward_filter": ((X, DYT, WT.shape), {}),
    "dropout_forward": ((X,), {"p": 0.3, "seed": 1}),
    "dropout_backward": ((X, (rand(X.shape, seed=16) > 0).astype(np.float32) * 2), {}),  # the cpu reserve: the mask
    "add_tensor": ((X, rand((3,), seed=3)), {}),
    "activation_forward": ((X,), {"mode": "tanh"}),
    "activation_backward": ((X, rand(X.shape, seed=4), rand(X.shape, seed=5)), {}),
    "softmax_forward": ((L,), {}),
    "softmax_backward": ((L, rand(L.shape, seed=6)), {}),
    "pooling_forward": ((X,), {}),
    "pooling_backward": ((P, rand(P.shape, seed=7), X), {}),
    "gemm": ((rand((3, 4)), rand((4, 6), seed=8)), {}),
    "linear_forward": ((L, rand((3, 10), seed=9), rand((3,), seed=10)), {}),
    "linear_backward": ((L, rand((3, 10), seed=11), rand((4, 3), seed=12)), {}),
    "nll_loss": ((L, LAB), {}),
    "nll_loss_backward": ((L, LAB, rand((4,), seed=13)), {}),
    "softmax_cross_entropy": ((L, LAB), {}),
    "softmax_cross_entropy_backward": ((L, LAB, rand((4,), seed=14)), {}),
    # fused BatchNorm + add + ReLU: NHWC float16 data (C = 8), float32 per-channel arrays; the cpu reserve is empty
    # (on a GPU a 0-byte reserve is refused with ValueError before cuDNN is called)
    "batchnorm_add_relu_forward_training": ((X.astype(np.float16), rand(X.shape, np.float16, seed=17),
                                             *(rand((8,), seed=s) for s in (18, 19, 20)),
                                             np.abs(rand((8,), seed=21)) + 0.5), {}),
    "batchnorm_add_relu_backward": ((X.astype(np.float16), np.abs(rand(X.shape, np.float16, seed=22)),
                                     rand(X.shape, np.float16, seed=23), *(rand((8,), seed=s) for s in (24, 25, 26)),
                                     np.abs(rand((8,), seed=27)) + 0.5, np.zeros(0, np.uint8)), {}),
    "batchnorm_nhwc_forward_training": ((X.astype(np.float16), *(rand((8,), seed=s) for s in (28, 29, 30)),
                                         np.abs(rand((8,), seed=31)) + 0.5), {}),
    "batchnorm_nhwc_backward": ((X.astype(np.float16), rand(X.shape, np.float16, seed=32),
                                 *(rand((8,), seed=s) for s in (33, 34, 35)), np.abs(rand((8,), seed=36)) + 0.5,
                                 np.zeros(0, np.uint8)), {}),
}


class _ForeignGPUArray:
    """Looks like a CuPy/torch CUDA array (a __cuda_array_interface__), but points at nothing."""
    shape, dtype = (2, 3), np.dtype(np.float32)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (2, 3), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3}


NOT_ARRAYS = [None, 3, 2.5, True, "abc", b"x", object(), {"a": 1}, np.float32(1.0), _ForeignGPUArray()]  # foreign last
BAD_ARRAYS = [np.zeros(()), np.zeros((2,), np.complex64), np.array(["a", "b"]), np.array([None, 1.0], dtype=object),
              [[1.0, 2.0], [3.0]], rand((2,)), rand((1, 2, 3)), rand((2, 3, 8, 8, 1)), rand((0, 3)),
              rand((2, 3, 8, 8)).astype(np.float16), np.arange(6).reshape(2, 3), np.full((4, 10), np.nan, np.float32)]


def _call_bad(fn, args, kwargs, pos, bad, device):
    """``fn`` with ``bad`` at ``pos`` and the other arrays as NDArrays on ``device`` (None: numpy as given)."""
    args = [dnnbind.array(a, device=device) if device and isinstance(a, np.ndarray) else a for a in args]
    args[pos] = bad
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return exc
    return None


def test_fuzz_covers_every_op_of_the_op_family():
    assert set(_op_family()) == set(VALID), "add a valid call to VALID for each new @op op"


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("device", [None, "cpu", pytest.param("gpu", marks=pytest.mark.gpu)],
                         ids=["numpy", "cpu NDArray", "gpu NDArray"])
def test_fuzz_bad_arguments_raise_only_type_or_value_errors(name, device):
    """None, scalars, strings, foreign objects, wrong ranks and dtypes in place of each array argument: only
    TypeError/ValueError escape (StopIteration, AttributeError, IndexError... would be bugs), and None or a
    non-array names the op and the argument. On a GPU the bad argument meets GPU NDArrays (the fast path)."""
    fn = _op_family()[name]
    args, kwargs = VALID[name]
    with dnnbind.cpu():
        for arg_name in fn.array_names:
            pos = list(inspect.signature(fn).parameters).index(arg_name)
            if pos >= len(args) or not isinstance(args[pos], np.ndarray):
                continue
            for bad in NOT_ARRAYS + BAD_ARRAYS:
                if isinstance(bad, _ForeignGPUArray) and (device == "gpu" or
                                                          sum(isinstance(a, np.ndarray) for a in args) < 2):
                    continue  # alone or beside GPU arrays it would be wrapped: its pointer is not real
                exc = _call_bad(fn, args, kwargs, pos, bad, device)  # anything but TypeError/ValueError propagates
                if (bad is None and arg_name in fn.required_arrays) or type(bad) in (str, bytes, dict, object):
                    assert isinstance(exc, TypeError) and not isinstance(exc, ValueError), \
                        f"{name}({arg_name}={bad!r}) gave {exc!r}"
                    assert str(exc).startswith(f"{name}: {arg_name} "), str(exc)


def test_fuzz_none_for_every_array_raises_type_error_naming_the_op():
    """conv_forward(None, None) used to leak StopIteration from the dtype check."""
    for name, fn in _op_family().items():
        n_required = len(fn.required_arrays)
        with pytest.raises(TypeError, match=f"^{name}: "):
            fn(*([None] * n_required))


def test_fuzz_leaves_the_process_usable():
    for name in sorted(VALID):
        fn, (args, kwargs) = _op_family()[name], VALID[name]
        for pos in range(min(len(fn.array_names), len(args))):
            for bad in NOT_ARRAYS[:-1] + BAD_ARRAYS:
                _call_bad(fn, args, kwargs, pos, bad, "cpu")
    x, w = rand((2, 3, 9, 7), seed=20), rand((4, 3, 3, 2), seed=21)
    y = dnnbind.conv_forward(dnnbind.array(x, device="cpu"), dnnbind.array(w, device="cpu"), stride=(2, 1))
    expected = R.conv_forward(x.astype(np.float64), w.astype(np.float64), stride=(2, 1))
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 1.5, "1024", True])
def test_conv_workspace_limit_is_checked(bad):
    with pytest.raises(ValueError, match="set_conv_algo_policy: workspace_limit_mb"):
        dnnbind.set_conv_algo_policy("time", workspace_limit_mb=bad)


def test_batchnorm_mode_is_checked_and_restorable():
    before = dnnbind.set_batchnorm_mode("persistent")
    assert dnnbind.set_batchnorm_mode(before) == "persistent"
    with pytest.raises(ValueError, match="set_batchnorm_mode: mode must be one of"):
        dnnbind.set_batchnorm_mode("per_activation")
