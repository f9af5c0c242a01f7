"""Benchmark recurrent networks, dnnbind against PyTorch in one process on one GPU (both on cuDNN's RNN kernels),
and print the ratios (dnnbind / PyTorch: below 1 is faster).

    python scripts/bench_rnn.py                      # all three sections
    python scripts/bench_rnn.py --only lstm --tf32   # the LSTM layer with TF32 math in both
    python scripts/bench_rnn.py --device cpu --steps 2 --epochs 1   # a smoke run without a GPU (no torch needed)

Sections:
- lstm: an LSTM layer (2 layers, hidden 512, input 512, batch 64, 100 steps), forward + backward, from the same
  weights: dnnbind's gluon.rnn.LSTM (eager, and hybridized) against torch.nn.LSTM. ms per iteration, median.
- gru-lm: d2l-zh's GRU language model (rnn-gluon.md: one-hot characters of a 1027-token vocabulary, a 256-unit GRU,
  a Dense decoder, batch 32, 35 steps, SGD with gradient clipping at 1e-2 * theta as the book does), one epoch of 8
  batches (the book's Jay Chou corpus in consecutive sampling), hybridized, against the same model in PyTorch.
- scratch: d2l-zh's rnn-scratch.md cell (a tanh RNN of explicit parameters unrolled over 35 steps in Python) per
  epoch, eager and hybridized (the replay removes the per-step host cost), against the same loop in PyTorch eager.

Layer: script; imports dnnbind, and torch if installed (the dnnbind rows run without it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon, nd  # noqa: E402
from dnnbind.gluon import rnn  # noqa: E402

try:
    import torch
except ImportError:  # the dnnbind rows run without it
    torch = None


def _timed(step, sync, warmup: int, steps: int) -> float:
    """Median ms of ``step()`` over ``steps`` runs after ``warmup`` untimed ones, synchronizing around each."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _row(name: str, ms: float, base: float | None) -> None:
    ratio = f"{ms / base:5.2f}x" if base else "     -"
    print(f"  {name:34s} {ms:9.3f} ms   {ratio}")


# -- an LSTM layer --------------------------------------------------------------------------------------------------

def bench_lstm(args, ctx, dev):
    T, N, C, H, L = args.seq, args.batch, args.input, args.hidden, args.layers
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((T, N, C)).astype(np.float32)
    layer = rnn.LSTM(H, num_layers=L, input_size=C)
    layer.initialize(mx.init.Uniform(0.05), ctx=ctx)
    x = nd.array(x_host, ctx=ctx)
    x.attach_grad()
    results = {}

    def step_mx():
        with autograd.record():
            y = layer(x)
        y.backward()

    results["dnnbind gluon.rnn.LSTM"] = _timed(step_mx, nd.waitall, args.warmup, args.steps)
    layer.hybridize()
    results["dnnbind gluon.rnn.LSTM hybridized"] = _timed(step_mx, nd.waitall, args.warmup, args.steps)
    base = None
    if torch is not None and dev == "cuda":
        lstm = torch.nn.LSTM(C, H, num_layers=L).to(dev)
        with torch.no_grad():  # the same weights: MXNet's names map onto torch's one for one
            for k in range(L):
                for mx_name, t_name in (("i2h_weight", "weight_ih"), ("h2h_weight", "weight_hh"),
                                        ("i2h_bias", "bias_ih"), ("h2h_bias", "bias_hh")):
                    src = layer.collect_params()[f"{layer.prefix}l{k}_{mx_name}"].data().asnumpy()
                    getattr(lstm, f"{t_name}_l{k}").copy_(torch.from_numpy(src))
        xt = torch.from_numpy(x_host).to(dev).requires_grad_()

        def step_torch():
            y, _ = lstm(xt)
            y.backward(torch.ones_like(y))
        base = results["torch.nn.LSTM"] = _timed(step_torch, torch.cuda.synchronize, args.warmup, args.steps)
        y_mx = layer(x).asnumpy()
        y_t = lstm(xt)[0].detach().cpu().numpy()
        print(f"  (same weights: max |dnnbind - torch| output difference {np.abs(y_mx - y_t).max():.2e})")
    print(f"LSTM layer: {L} layers, hidden {H}, input {C}, batch {N}, {T} steps, forward + backward "
          f"({'TF32' if args.tf32 else 'strict FP32'})")
    for k, v in results.items():
        _row(k, v, base)


# -- d2l's GRU language model ----------------------------------------------------------------------------------------

VOCAB, HIDDEN, BATCH, STEPS, BATCHES = 1027, 256, 32, 35, 8
LR, THETA = 1e2, 1e-2


class GRULM(gluon.HybridBlock):
    """rnn-gluon.md's RNNModel with a GRU: one-hot inputs, the layer, a Dense decoder over every step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.rnn = rnn.GRU(HIDDEN)
            self.dense = gluon.nn.Dense(VOCAB, flatten=False)

    def hybrid_forward(self, F, inputs, state):
        x = F.one_hot(F.transpose(inputs), VOCAB)
        y, state = self.rnn(x, state)
        return self.dense(y), state


def bench_gru_lm(args, ctx, dev):
    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, VOCAB, (BATCH, STEPS)).astype(np.float32),
                rng.integers(0, VOCAB, (BATCH, STEPS)).astype(np.float32)) for _ in range(BATCHES)]
    net = GRULM()
    net.initialize(mx.init.Normal(0.01), ctx=ctx)
    net.hybridize()
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0, "wd": 0})
    data = [(nd.array(x, ctx=ctx), nd.array(y, ctx=ctx)) for x, y in batches]

    def epoch_mx():
        state = net.rnn.begin_state(batch_size=BATCH, ctx=ctx)
        for x, y in data:
            state = [s.detach() for s in state]
            with autograd.record():
                out, state = net(x, state)
                lv = loss(out, y.T).mean()
            lv.backward()
            gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], THETA)
            trainer.step(1)
    results = {"dnnbind GRU LM, hybridized": _timed(epoch_mx, nd.waitall, 2, args.epochs)}
    base = None
    if torch is not None and dev == "cuda":
        class TorchGRULM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = torch.nn.GRU(VOCAB, HIDDEN)
                self.dense = torch.nn.Linear(HIDDEN, VOCAB)

            def forward(self, inputs, state):
                x = torch.nn.functional.one_hot(inputs.T, VOCAB).float()
                y, state = self.rnn(x, state)
                return self.dense(y), state
        tnet = TorchGRULM().to(dev)
        opt = torch.optim.SGD(tnet.parameters(), lr=LR)
        tdata = [(torch.from_numpy(x).long().to(dev), torch.from_numpy(y).long().to(dev)) for x, y in batches]

        def epoch_torch():
            state = torch.zeros(1, BATCH, HIDDEN, device=dev)
            for x, y in tdata:
                state = state.detach()
                out, state = tnet(x, state)
                lv = torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB), y.T.reshape(-1))
                opt.zero_grad(set_to_none=True)
                lv.backward()
                torch.nn.utils.clip_grad_norm_(tnet.parameters(), THETA)
                opt.step()
        base = results["torch GRU LM, eager"] = _timed(epoch_torch, torch.cuda.synchronize, 2, args.epochs)
    print(f"d2l GRU language model: vocab {VOCAB}, hidden {HIDDEN}, batch {BATCH}, {STEPS} steps, one epoch of "
          f"{BATCHES} batches with gradient clipping")
    for k, v in results.items():
        _row(k, v, base)


# -- rnn-scratch's cell loop ------------------------------------------------------------------------------------------

class ScratchRNN(gluon.HybridBlock):
    """rnn-scratch.md's tanh RNN: H = tanh(X W_xh + H W_hh + b_h), Y = H W_hq + b_q, unrolled in Python."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.W_xh = self.params.get("W_xh", shape=(VOCAB, HIDDEN), init=mx.init.Normal(0.01))
            self.W_hh = self.params.get("W_hh", shape=(HIDDEN, HIDDEN), init=mx.init.Normal(0.01))
            self.b_h = self.params.get("b_h", shape=(HIDDEN,), init="zeros")
            self.W_hq = self.params.get("W_hq", shape=(HIDDEN, VOCAB), init=mx.init.Normal(0.01))
            self.b_q = self.params.get("b_q", shape=(VOCAB,), init="zeros")

    def hybrid_forward(self, F, inputs, state, W_xh, W_hh, b_h, W_hq, b_q):
        outputs = []
        for t in range(STEPS):
            x = F.one_hot(F.slice_axis(inputs, axis=1, begin=t, end=t + 1).reshape((-1,)), VOCAB)
            state = F.tanh(F.broadcast_add(F.dot(x, W_xh) + F.dot(state, W_hh), b_h))
            outputs.append(F.broadcast_add(F.dot(state, W_hq), b_q))
        return F.concat(*outputs, dim=0), state


def bench_scratch(args, ctx, dev):
    rng = np.random.default_rng(2)
    batches = [(rng.integers(0, VOCAB, (BATCH, STEPS)).astype(np.float32),
                rng.integers(0, VOCAB, (BATCH, STEPS)).astype(np.float32)) for _ in range(BATCHES)]
    data = [(nd.array(x, ctx=ctx), nd.array(y, ctx=ctx)) for x, y in batches]
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    results = {}
    for hybrid in (False, True):
        net = ScratchRNN()
        net.initialize(ctx=ctx)
        if hybrid:
            net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})

        def epoch_mx():
            state = nd.zeros((BATCH, HIDDEN), ctx=ctx)
            for x, y in data:
                state = state.detach()
                with autograd.record():
                    out, state = net(x, state)
                    lv = loss(out, y.T.reshape((-1,))).mean()
                lv.backward()
                gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], THETA)
                trainer.step(1)
        results[f"dnnbind rnn-scratch, {'hybridized' if hybrid else 'eager'}"] = _timed(
            epoch_mx, nd.waitall, 2, args.epochs)
    base = None
    if torch is not None and dev == "cuda":
        g = torch.Generator().manual_seed(0)
        ps = [(torch.randn(s, generator=g) * 0.01).to(dev).requires_grad_() for s in
              ((VOCAB, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, VOCAB), (VOCAB,))]
        tdata = [(torch.from_numpy(x).long().to(dev), torch.from_numpy(y).long().to(dev)) for x, y in batches]
        opt = torch.optim.SGD(ps, lr=LR)

        def epoch_torch():
            state = torch.zeros(BATCH, HIDDEN, device=dev)
            W_xh, W_hh, b_h, W_hq, b_q = ps
            for x, y in tdata:
                state = state.detach()
                outs = []
                for t in range(STEPS):
                    xt = torch.nn.functional.one_hot(x[:, t], VOCAB).float()
                    state = torch.tanh(xt @ W_xh + state @ W_hh + b_h)
                    outs.append(state @ W_hq + b_q)
                lv = torch.nn.functional.cross_entropy(torch.cat(outs), y.T.reshape(-1))
                opt.zero_grad(set_to_none=True)
                lv.backward()
                torch.nn.utils.clip_grad_norm_(ps, THETA)
                opt.step()
        base = results["torch rnn-scratch, eager"] = _timed(epoch_torch, torch.cuda.synchronize, 2, args.epochs)
    print(f"d2l rnn-scratch: tanh RNN of explicit parameters, vocab {VOCAB}, hidden {HIDDEN}, batch {BATCH}, "
          f"{STEPS} steps unrolled, one epoch of {BATCHES} batches")
    for k, v in results.items():
        _row(k, v, base)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["lstm", "gru-lm", "scratch"], action="append")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if mx.num_gpus() else "cpu")
    ap.add_argument("--tf32", action="store_true", help="TF32 math in both frameworks (default: strict FP32)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--input", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=10, help="timed epochs per row of gru-lm and scratch")
    args = ap.parse_args(argv)
    ctx = mx.gpu(0) if args.device == "gpu" else mx.cpu()
    dev = "cuda" if args.device == "gpu" else "cpu"
    mx.set_math_mode("tf32" if args.tf32 else "fp32")
    if torch is not None and dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
        print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; {torch.cuda.get_device_name()}")
    sections = args.only or ["lstm", "gru-lm", "scratch"]
    for name, fn in (("lstm", bench_lstm), ("gru-lm", bench_gru_lm), ("scratch", bench_scratch)):
        if name in sections:
            fn(args, ctx, dev)


if __name__ == "__main__":
    main()
