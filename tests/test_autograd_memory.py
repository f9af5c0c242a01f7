"""The tape keeps no activation alive that no gradient formula reads, and backward() frees what it used.

A Node's inputs are Nodes (or leaf arrays), never intermediate arrays, and nd ops declared with ``saves`` keep only
what their gradient reads: relu/sigmoid/exp keep their output, add/subtract nothing. These tests watch the arrays
through weak references (on the CPU and, marker ``gpu``, on the GPU, where the memory is what matters) and check
that the gradients stay right (against float64 numpy)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from dnnbind import autograd, nd

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
RNG = np.random.default_rng(5)


def _leaf(shape, device, low=-1.0, high=1.0):
    h = RNG.uniform(low, high, shape)
    x = nd.array(h, ctx=device)
    x.attach_grad()
    return x, h


def _gone(ref) -> bool:
    gc.collect()
    return ref() is None


@pytest.mark.parametrize("device", DEVICES)
def test_an_activation_only_the_forward_needed_is_freed(device):
    """relu differentiates from its output: its input (here z = 2x, like BatchNorm's output before a ReLU) is not
    kept by the tape once the caller drops it."""
    x, h = _leaf((3, 4), device)
    with autograd.record():
        z = x * 2.0
        y = nd.relu(z)
    ref = weakref.ref(z)
    del z
    assert _gone(ref), "relu's input is still alive: the graph keeps an activation no gradient reads"
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.where(2 * h > 0, 2.0, 0.0), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_residual_add_keeps_neither_operand(device):
    """y = relu(a + b) with a = 3x and b = x * w (broadcast): the add's gradient is the incoming one, unbroadcast
    to each operand's shape; neither operand is kept, and both gradients are right."""
    x, hx = _leaf((2, 3), device)
    w, hw = _leaf((3,), device, 0.5, 1.5)
    with autograd.record():
        a = x * 3.0
        b = x * w
        y = nd.relu(a + b)
    refs = [weakref.ref(a), weakref.ref(b)]
    del a, b
    assert all(_gone(r) for r in refs)
    y.backward()
    mask = (3 * hx + hx * hw) > 0
    np.testing.assert_allclose(x.grad.asnumpy(), np.where(mask, 3.0 + hw, 0.0), rtol=1e-6)
    np.testing.assert_allclose(w.grad.asnumpy(), np.where(mask, hx, 0.0).sum(0), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_frees_what_the_closures_saved(device):
    """u = t * t saves t; after backward() without retain_graph, nothing holds t any more, and a second backward
    says why it cannot run."""
    x, h = _leaf((5,), device)
    with autograd.record():
        t = nd.sigmoid(x)
        u = (t * t).sum()
    ref = weakref.ref(t)
    del t
    assert not _gone(ref)  # multiply's gradient reads t: kept until the backward
    u.backward()
    assert _gone(ref)
    s = 1 / (1 + np.exp(-h))
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * s * s * (1 - s), rtol=1e-5)
    with pytest.raises(RuntimeError, match="retain_graph"):
        u.backward()


@pytest.mark.parametrize("device", DEVICES)
def test_retain_graph_keeps_it_for_a_second_backward(device):
    x, h = _leaf((4,), device)
    x.attach_grad(grad_req="add")
    with autograd.record():
        y = (nd.exp(x) - x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * (np.exp(h) - 1), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_of_an_intermediate_variable(device):
    """autograd.grad with respect to a taped intermediate (not a leaf): keyed by its Node."""
    x, h = _leaf((3,), device)
    with autograd.record():
        z = x * x
        y = (nd.exp(z) + z).sum()
    gz, gx = autograd.grad(y, [z, x])
    np.testing.assert_allclose(gz.asnumpy(), np.exp(h * h) + 1, rtol=1e-5)
    np.testing.assert_allclose(gx.asnumpy(), (np.exp(h * h) + 1) * 2 * h, rtol=1e-5)


def _drop_dy_early(node) -> list:
    """Wrap node's backward so it drops its incoming gradient at once (keeping a host copy) and notes whether the
    array is still alive afterwards: [True] means someone else (the engine) still held it."""
    inner, alive = node.backward, []

    def backward(dy):
        ref, kept = weakref.ref(dy), dy.asnumpy()
        del dy
        gc.collect()
        alive.append(ref() is not None)
        return inner(nd.array(kept, ctx="cpu"))
    node.backward = backward
    return alive


def test_backward_hands_each_node_its_gradient_without_keeping_it():
    """A Node's backward gets the only reference to its incoming gradient: one that is done with dy early (a fused
    conv+bias+ReLU after its ReLU part) frees it at once. The chain's gradient stays right."""
    h = RNG.uniform(-1.0, 1.0, (4, 3))
    x = nd.array(h, ctx="cpu")
    x.attach_grad()
    with autograd.record():
        y = nd.relu(x) * 3.0
    alive = _drop_dy_early(y._node)
    y.backward()
    assert alive == [False]
    np.testing.assert_allclose(x.grad.asnumpy(), 3.0 * (h > 0), rtol=0, atol=0)


def test_a_gradient_lives_only_until_its_consumer_is_done_with_it():
    """The gradient one node's backward returns is held by the engine only until the next node takes it: a
    consumer that drops it early frees it (the engine keeps no loop variable or result tuple pointing at it)."""
    h = RNG.uniform(0.5, 1.0, (4, 3))
    x = nd.array(h, ctx="cpu")
    x.attach_grad()
    with autograd.record():
        y = nd.exp(x * 2.0)  # exp's backward returns a fresh array: the gradient flowing into x * 2.0
    alive = _drop_dy_early(y._node.inputs[0])
    y.backward()
    assert alive == [False]
    np.testing.assert_allclose(x.grad.asnumpy(), 2.0 * np.exp(2.0 * h), rtol=1e-6)


def test_a_fused_conv_relu_lets_go_of_its_output_before_the_convolutions_backward(monkeypatch):
    """Convolution(act_type='relu') saves its output for the ReLU's gradient only: a backward that frees the graph
    drops it before the convolution's backward allocates (as an unfused ReLU node would); with retain_graph it is
    kept, and a second backward gives the same gradients."""
    from dnnbind import ops
    rng = np.random.default_rng(3)
    x = nd.array(rng.standard_normal((2, 3, 6, 6)), ctx="cpu")
    w = nd.array(rng.standard_normal((4, 3, 3, 3)), ctx="cpu")
    b = nd.array(rng.standard_normal(4), ctx="cpu")
    for a in (x, w, b):
        a.attach_grad()
    seen, inner = [], ops.reference.conv_backward_data

    def watch(*args, **kwargs):
        gc.collect()
        seen.append(ref() is not None)
        return inner(*args, **kwargs)
    monkeypatch.setattr(ops.reference, "conv_backward_data", watch)  # what the cpu lowering calls
    grads = []
    for retain in (True, False):
        with autograd.record():
            y = nd.Convolution(x, w, b, kernel=(3, 3), num_filter=4, pad=(1, 1), act_type="relu")
            loss = (y * y).sum()  # multiply saves y: it lives until that node is done
        ref = weakref.ref(y.data_numpy)  # the output's memory (the lowering saved the same buffer)
        del y
        loss.backward(retain_graph=retain)
        if retain:
            first = [a.grad.asnumpy().copy() for a in (x, w, b)]
            loss.backward()
            grads.append(first)
        grads.append([a.grad.asnumpy().copy() for a in (x, w, b)])
    # retain_graph: y kept through both of that graph's backwards; then freed before the conv's backward
    assert seen == [True, False, False], seen
    for g1, g2 in zip(grads[0], grads[1]):
        np.testing.assert_array_equal(g1, g2)
    xs, ws, bs = (a.asnumpy().astype(np.float64) for a in (x, w, b))
    z = ops.reference.conv_forward(xs, ws, bs, 1, 1)
    dz = 2 * np.maximum(z, 0) * (z > 0)
    np.testing.assert_allclose(grads[2][0], ops.reference.conv_backward_data(ws, dz, xs.shape, 1, 1), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(grads[2][2], dz.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
