"""The CTCLoss operator (ops/defs/ctc_loss.py) against the real MXNet 1.9.1 (tests/fixtures/mxnet_ctc, written by
tests/fixtures/make_mxnet_ctc.py), its gradient by central differences in float64, the calls refused on the cpu,
the device-side input preparation of the gpu lowering run on cpu arrays, and cuDNN against the twin (gpu). The
registry-wide checks (shape inference, symbol executor, the GPU lowering on the samples) are tests/test_opdefs.py's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dnnbind
from dnnbind import autograd, nd
from dnnbind.ops.defs import ctc_loss as ctcdef
from dnnbind.ops.opdef import DEFS
from tests._helpers import assert_close, nd_gradcheck

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_ctc", "ctc.npz")


def _cases():
    f = np.load(FIXTURE)
    for i in range(int(f["count"])):
        yield (f[f"x{i}"], f[f"label{i}"], f.get(f"dlen{i}"), f.get(f"llen{i}"), f[f"dy{i}"], f[f"loss{i}"],
               f[f"dx{i}"], eval(str(f[f"params{i}"])), f[f"garbage{i}"])


def _call(device, x, label, dlen, llen, params, dtype="float32"):
    args = [nd.array(x, ctx=device, dtype=dtype), nd.array(label, ctx=device, dtype=label.dtype)]
    for v in (dlen, llen):
        if v is not None:
            args.append(nd.array(v, ctx=device, dtype=v.dtype))
    return args, {**params, **({"use_data_lengths": True} if dlen is not None else {}),
                  **({"use_label_lengths": True} if llen is not None else {})}


@pytest.mark.parametrize("ctx", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_matches_mxnet(ctx, request):
    device = dnnbind.cpu() if ctx == "cpu" else request.getfixturevalue("gpu")
    blanks = set()
    for x, label, dlen, llen, dy, loss_mx, dx_mx, params, garbage in _cases():
        args, params = _call(device, x, label, dlen, llen, params)
        args[0].attach_grad()
        with autograd.record():
            loss = nd.CTCLoss(*args, **params)
        loss.backward(nd.array(dy, ctx=device))
        what = f"CTCLoss {params} labels {label.tolist()}"
        assert_close(loss, loss_mx, rtol=1e-5, atol=1e-5, name=what)
        keep = np.setdiff1d(np.arange(x.shape[1]), garbage)  # MXNet's gradient of an unaligned label: garbage
        assert_close(args[0].grad.numpy()[:, keep], dx_mx[:, keep], rtol=1e-5, atol=1e-5, name=f"{what} gradient")
        assert not args[0].grad.numpy()[:, garbage].any()  # dnnbind's: zeros
        blanks.add(params["blank_label"])
    assert blanks == {"first", "last"}


def test_aliases_and_the_label_lengths_alone_as_third_input():
    """MXNet names the inputs from its flags: with only use_label_lengths the third array is the label lengths."""
    x = np.random.default_rng(0).standard_normal((5, 2, 4))
    lab = np.array([[1.0, 2, 3], [2, 2, 3]])
    a = nd.CTCLoss(nd.array(x), nd.array(lab), nd.array([2, 1]), use_label_lengths=True)
    b = nd.ctc_loss(nd.array(x), nd.array([[1.0, 2, 0], [2, 0, 0]]))
    assert_close(a, b, rtol=1e-6, atol=1e-6)
    c = nd.CTCLoss(nd.array(x), nd.array(lab), label_lengths=nd.array([2, 1]), use_label_lengths=True)
    assert_close(c, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("blank", ["first", "last"])
def test_gradient_by_central_differences(blank):
    lab = np.array([[1.0, 1, 2], [3, 0, 0]]) if blank == "first" else np.array([[0.0, 0, 1], [2, -1, -1]])
    x = np.random.default_rng(3).standard_normal((6, 2, 4))
    nd_gradcheck(lambda d: nd.CTCLoss(d, lab, blank_label=blank), [x], dnnbind.cpu(), rtol=1e-6, atol=1e-7)
    nd_gradcheck(lambda d: nd.CTCLoss(d, lab, nd.array([5.0, 3]), use_data_lengths=True, blank_label=blank), [x],
                 dnnbind.cpu(), rtol=1e-6, atol=1e-7)


def test_label_and_lengths_get_no_gradient_and_float64_works():
    x = nd.array(np.random.default_rng(4).standard_normal((4, 2, 3)), dtype="float64")
    lab, n = nd.array([[1, 2], [2, 0]], dtype="int32"), nd.array([4, 3], dtype="int32")
    for a in (x, lab, n):
        a.attach_grad()
    with autograd.record():
        loss = nd.CTCLoss(x, lab, n, use_data_lengths=True)
    loss.backward()
    assert loss.dtype == np.float64 and loss.shape == (2,)
    assert_close(lab.grad, np.zeros((2, 2)), rtol=0, atol=0)
    assert_close(n.grad, np.zeros(2), rtol=0, atol=0)
    assert_close(x.grad.numpy()[3, 1], np.zeros(3), rtol=0, atol=0, name="no gradient past the data length")


# -- refused on the cpu: errors name the op, the argument and the shapes -------------------------------------------

def _x(shape=(4, 2, 3)):
    return nd.array(np.random.default_rng(0).standard_normal(shape))


@pytest.mark.parametrize("args,params,error,message", [
    ((_x((4, 2)), nd.array([[1.0], [1]])), {}, ValueError, r"CTCLoss: data must be 3-D .*got shape \(4, 2\)"),
    ((_x(), nd.array([1.0, 2])), {}, ValueError, r"CTCLoss: label must be 2-D \(N = 2, .*got \(2,\)"),
    ((_x(), nd.array([[1.0], [1], [1]])), {}, ValueError, r"label must be 2-D \(N = 2.*got \(3, 1\)"),
    ((_x(), nd.array(np.ones((2, 5)))), {}, ValueError, r"the label length 5 exceeds the sequence length T = 4"),
    ((_x(), nd.array([[1.0], [1]])), {"use_data_lengths": True}, TypeError,
     r"CTCLoss: use_data_lengths=True needs the data_lengths input \(N = 2 lengths\) \(data \(4, 2, 3\), label"),
    ((_x(), nd.array([[1.0], [1]]), nd.array([1, 2, 3])), {"use_data_lengths": True}, ValueError,
     r"CTCLoss: data_lengths must have shape \(2,\) .*got \(3,\)"),
    ((_x(), nd.array([[1.0], [1]]), nd.array([5, 2])), {"use_data_lengths": True}, ValueError,
     r"CTCLoss: data_lengths\[0\] is 5, but each must be in \[0, 4\] \(data \(4, 2, 3\), label \(2, 1\), "
     r"data_lengths \(2,\)\)"),
    ((_x(), nd.array([[1.0], [1]]), nd.array([-1, 2])), {"use_label_lengths": True}, ValueError,
     r"CTCLoss: label_lengths\[0\] is -1, but each must be in \[0, 1\]"),
    ((_x(), nd.array([[1.0], [3]])), {}, ValueError,
     r"CTCLoss: label\[1, 0\] is 3, but labels must be in \[1, 2\] with blank_label 'first' \(alphabet A = 3\)"),
    ((_x(), nd.array([[2.0], [0]])), {"blank_label": "last"}, ValueError,
     r"label\[0, 0\] is 2, but labels must be in \[0, 1\] with blank_label 'last'"),
    ((_x(), nd.array([[1.0], [np.nan]])), {}, ValueError, r"CTCLoss: label holds nan, not a whole number"),
    ((_x().astype("int32"), nd.array([[1.0], [1]])), {}, TypeError, r"data must be a floating-point array"),
])
def test_bad_input_is_refused(args, params, error, message):
    with pytest.raises(error, match=message):
        nd.CTCLoss(*args, **params)


# -- the gpu lowering's device-side inputs, run through the table's ops on cpu arrays ----------------------------

@pytest.mark.parametrize("case", range(7))
def test_device_inputs_on_cpu_arrays_match_the_host_checks(case):
    """What the gpu lowering hands cuDNN (labels packed end to end in cuDNN's classes, lengths, the alignment check)
    is made by table ops that run on either backend: here against the cpu's host-side reading of the same call."""
    x, label, dlen, llen, _, loss_mx, _, params, garbage = list(_cases())[case]
    args, params = _call(dnnbind.cpu(), x, label, dlen, llen, params)
    d = DEFS["CTCLoss"]
    p = nd.REGISTRY["CTCLoss"].schema.parse(params)
    arrays = args + [None] * (4 - len(args))
    g = d.prepare(p, *arrays)
    dl, ll = ctcdef._route(p, arrays[2], arrays[3])
    packed, n_lab, n_data, fits = ctcdef.device_inputs(g, p, args[1], dl, ll)
    labels, steps = ctcdef.host_labels(g, label, None if dl is None else dl.numpy(),
                                       None if ll is None else ll.numpy())
    shift = 0 if g.blank == 0 else 1
    want = [k + shift for row in labels for k in row]
    assert packed.numpy()[:len(want)].tolist() == want
    assert n_lab.numpy().tolist() == [len(r) for r in labels]
    assert n_data.numpy().tolist() == steps.tolist()
    from dnnbind.ops.reference.ctc import repeats
    assert fits.numpy().tolist() == [float(len(r) + repeats(r) <= s) for r, s in zip(labels, steps)]
    assert np.flatnonzero(fits.numpy() == 0).tolist() == garbage.tolist()  # the fixture's own count of them
    # what cuDNN is handed: a label it cannot align goes as empty, and the packing skips it, so every other label
    # starts where the lengths cuDNN reads say it does
    given, _, _, _ = ctcdef.device_inputs(g, p, args[1], dl, ll, given_only=True)
    sent = [k + shift for row, s in zip(labels, steps) if len(row) + repeats(row) <= s and s > 0 for k in row]
    assert given.numpy()[:len(sent)].tolist() == sent


# -- gpu: cuDNN against the twin ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_gpu_matches_the_twin(gpu, dtype):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((9, 4, 6)).astype(dtype)
    lab = np.array([[1, 2, 2, 0], [5, 0, 0, 0], [0, 0, 0, 0], [3, 1, 4, 2]], np.int32)
    dlen = np.array([9, 3, 5, 2], np.float32)  # the last cannot be aligned: 0, no gradient
    dy = rng.random(4) + 0.5
    tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-5}[dtype]
    for blank in ("first", "last"):
        labels = lab if blank == "first" else np.where(lab == 0, -1, lab - 1)
        out = {}
        for ctx in (dnnbind.cpu(), gpu):
            xa = nd.array(x, ctx=ctx, dtype=dtype)
            xa.attach_grad()
            with autograd.record():
                loss = nd.CTCLoss(xa, nd.array(labels, ctx=ctx, dtype="int32"), nd.array(dlen, ctx=ctx),
                                  use_data_lengths=True, blank_label=blank)
            loss.backward(nd.array(dy, ctx=ctx, dtype=dtype))
            out[ctx.kind] = (loss.numpy(), xa.grad.numpy())
        assert_close(out["gpu"][0], out["cpu"][0], rtol=tol, atol=tol, name=f"CTCLoss {blank} {dtype}")
        assert_close(out["gpu"][1], out["cpu"][1], rtol=tol, atol=tol, name=f"CTCLoss {blank} {dtype} gradient")


@pytest.mark.gpu
def test_gpu_clamps_what_the_cpu_refuses(gpu):
    """Nothing is read back on the device: out-of-range lengths are clamped, labels clamped to the alphabet."""
    x = np.random.default_rng(10).standard_normal((5, 2, 4)).astype(np.float32)
    lab = np.array([[1, 2], [3, 0]], np.float32)
    got = nd.CTCLoss(nd.array(x, ctx=gpu), nd.array(lab, ctx=gpu), nd.array([9.0, -2], ctx=gpu),
                     use_data_lengths=True).numpy()
    want = nd.CTCLoss(nd.array(x), nd.array(lab), nd.array([5.0, 0]), use_data_lengths=True).numpy()
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_ctc_in_a_hybridized_block_replays(gpu):
    """No host copy in the gpu lowering: a hybridized Block with CTCLoss records and replays."""
    from dnnbind import gluon

    class Ctc(gluon.HybridBlock):
        def hybrid_forward(self, F, x, label, lengths):
            return F.CTCLoss(x, label, lengths, use_data_lengths=True)

    eager, block = Ctc(), Ctc()
    block.hybridize()
    rng = np.random.default_rng(11)
    for step in range(4):
        x = rng.standard_normal((6, 3, 5)).astype(np.float32)
        lab = rng.integers(1, 5, (3, 2)).astype(np.float32)
        n = rng.integers(4, 7, 3).astype(np.float32)
        got = []
        for net in (eager, block):
            xa = nd.array(x, ctx=gpu)
            xa.attach_grad()
            with autograd.record():
                loss = net(xa, nd.array(lab, ctx=gpu), nd.array(n, ctx=gpu))
            loss.backward()
            got.append((loss.numpy(), xa.grad.numpy()))
        assert_close(got[1][0], got[0][0], rtol=1e-6, atol=1e-6, name=f"step {step}")
        assert_close(got[1][1], got[0][1], rtol=1e-6, atol=1e-6, name=f"step {step} gradient")
    assert block._cached.replays >= 2 and not block._cached.eager_reasons, block._cached.eager_reasons


def test_the_gpu_path_for_empty_labels_on_cpu_arrays_matches_the_twin():
    """cuDNN's CTC gives an empty label cost 0; the GPU lowering sets its loss and gradient itself, with table ops
    (checked here on cpu arrays): the blank at every step, -sum log softmax[blank], softmax - onehot(blank)."""
    from dnnbind.ops.reference.ctc import ctc_loss
    rng = np.random.default_rng(5)
    t, n, a = 6, 3, 4
    x = rng.standard_normal((t, n, a)).astype(np.float32)
    lengths = np.array([6.0, 4.0, 5.0])
    labels = [[], [2, 3], []]
    want_loss, want_grad = ctc_loss(x.astype(np.float64), labels, lengths, blank=0)
    steps_in = nd.array((np.arange(t)[:, None] < lengths[None, :]).astype(np.float64), dtype="float64")
    loss, grad = ctcdef._empty_labels(nd.array(x), nd.array([0.0, 2.0, 0.0], dtype="float64"),
                                      nd.array(lengths, dtype="float64"), steps_in,
                                      nd.array(np.full(n, -7.0, np.float32)), nd.array(np.full((t, n, a), 9.0, np.float32)))
    loss, grad = loss.numpy(), grad.numpy()
    for i in (0, 2):  # the empty labels take the twin's values, the other sequence keeps what it had
        assert_close(loss[i], want_loss[i], rtol=1e-5, atol=1e-5, name=f"loss {i}")
        assert_close(grad[:, i], want_grad[:, i], rtol=1e-5, atol=1e-6, name=f"gradient {i}")
    assert loss[1] == -7.0 and (grad[:, 1] == 9.0).all()
