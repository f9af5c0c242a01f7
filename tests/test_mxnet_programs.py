"""MXNet 1.x programs written the way Dive into Deep Learning (d2l-zh v1) writes its from-scratch chapters, run
unchanged through ``python -m dnnbind.mxnet`` in a subprocess: linear regression, softmax regression and an MLP
with dropout, built only from ``nd`` ops and ``autograd`` (synthetic data: no downloads). They must learn."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent('''
    import random
    import sys
    from mxnet import autograd, nd
    import mxnet as mx

    mx.random.seed(1)
    random.seed(1)
    ctx = mx.cpu() if sys.argv[1] == "cpu" else mx.gpu(0)

    # -- linear regression from scratch (d2l 3.2) --
    num_inputs, num_examples = 2, 1000
    true_w, true_b = [2, -3.4], 4.2
    features = nd.random.normal(scale=1, shape=(num_examples, num_inputs), ctx=ctx)
    labels = true_w[0] * features[:, 0] + true_w[1] * features[:, 1] + true_b
    labels += nd.random.normal(scale=0.01, shape=labels.shape, ctx=ctx)

    def data_iter(batch_size, features, labels):
        indices = list(range(len(features)))
        random.shuffle(indices)
        for i in range(0, len(features), batch_size):
            j = nd.array(indices[i: min(i + batch_size, len(features))], ctx=ctx)
            yield features.take(j), labels.take(j)

    w = nd.random.normal(scale=0.01, shape=(num_inputs, 1), ctx=ctx)
    b = nd.zeros(shape=(1,), ctx=ctx)
    w.attach_grad()
    b.attach_grad()

    def linreg(X, w, b):
        return nd.dot(X, w) + b

    def squared_loss(y_hat, y):
        return (y_hat - y.reshape(y_hat.shape)) ** 2 / 2

    def sgd(params, lr, batch_size):
        for param in params:
            param[:] = param - lr * param.grad / batch_size

    for epoch in range(3):
        for X, y in data_iter(10, features, labels):
            with autograd.record():
                l = squared_loss(linreg(X, w, b), y)
            l.backward()
            sgd([w, b], 0.03, 10)
        train_l = squared_loss(linreg(features, w, b), labels)
        print("epoch %d, loss %f" % (epoch + 1, train_l.mean().asnumpy()))
    assert train_l.mean().asscalar() < 1e-3, train_l.mean()
    assert abs(w.asnumpy().ravel() - true_w).max() < 0.01 and abs(b.asscalar() - true_b) < 0.01

    # -- softmax regression and an MLP with dropout from scratch (d2l 3.6, 3.9, 3.13) on 3 Gaussian blobs --
    centers = nd.array([[2, 0, 0, 1], [0, 2, 0, -1], [0, 0, 2, 0]], ctx=ctx)
    y_all = nd.random.randint(0, 3, shape=(600,), ctx=ctx).astype("float32")
    X_all = nd.one_hot(y_all, 3).dot(centers) + nd.random.normal(scale=0.5, shape=(600, 4), ctx=ctx)

    def softmax(X):
        X_exp = X.exp()
        partition = X_exp.sum(axis=1, keepdims=True)
        return X_exp / partition

    def cross_entropy(y_hat, y):
        return -nd.pick(y_hat, y).log()

    def accuracy(y_hat, y):
        return (y_hat.argmax(axis=1) == y.astype("float32")).mean().asscalar()

    W = nd.random.normal(scale=0.01, shape=(4, 3), ctx=ctx)
    b2 = nd.zeros(3, ctx=ctx)
    params = [W, b2]
    for p in params:
        p.attach_grad()
    net = lambda X: softmax(nd.dot(X.reshape((-1, 4)), W) + b2)
    for epoch in range(5):
        for X, y in data_iter(20, X_all, y_all):
            with autograd.record():
                l = cross_entropy(net(X), y).sum()
            l.backward()
            sgd(params, 0.1, 20)
    acc = accuracy(net(X_all), y_all)
    print("softmax regression accuracy %.3f" % acc)
    assert acc > 0.9, acc

    def dropout(X, drop_prob):
        keep_prob = 1 - drop_prob
        if keep_prob == 0:
            return X.zeros_like()
        mask = nd.random.uniform(0, 1, X.shape, ctx=ctx) < keep_prob
        return mask * X / keep_prob

    W1 = nd.random.normal(scale=0.1, shape=(4, 16), ctx=ctx)
    b1 = nd.zeros(16, ctx=ctx)
    W2 = nd.random.normal(scale=0.1, shape=(16, 3), ctx=ctx)
    b3 = nd.zeros(3, ctx=ctx)
    params = [W1, b1, W2, b3]
    for p in params:
        p.attach_grad()

    def mlp(X, train=True):
        H = nd.maximum(nd.dot(X, W1) + b1, 0)
        if train:
            H = dropout(H, 0.2)
        return nd.dot(H, W2) + b3

    def softmax_ce(y_hat, y):
        return -nd.pick(nd.log_softmax(y_hat), y)

    for epoch in range(10):
        for X, y in data_iter(20, X_all, y_all):
            with autograd.record():
                l = softmax_ce(mlp(X), y).sum()
            l.backward()
            sgd(params, 0.2, 20)
    acc = accuracy(mlp(X_all, train=False), y_all)
    print("mlp accuracy %.3f" % acc)
    assert acc > 0.9, acc

    # -- files MXNet programs write --
    nd.save(sys.argv[2], {"W1": W1, "b1": b1})
    loaded = nd.load(sys.argv[2])
    assert (loaded["W1"].asnumpy() == W1.asnumpy()).all()
    print("ok", ctx)
''')


def _run(tmp_path, device):
    script = tmp_path / "d2l_scratch.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "dnnbind.mxnet", str(script), device, str(tmp_path / "w.nd")],
                          capture_output=True, text=True, env=env, timeout=600)


def test_d2l_scratch_chapters_learn_on_cpu(tmp_path):
    r = _run(tmp_path, "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok cpu(0)" in r.stdout


import pytest  # noqa: E402


@pytest.mark.gpu
def test_d2l_scratch_chapters_learn_on_gpu(tmp_path):
    r = _run(tmp_path, "gpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok gpu(0)" in r.stdout
