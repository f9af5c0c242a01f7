"""Benchmark dnnbind against PyTorch on the same GPU, in one process: the seeds' SimpleCNN for one epoch
(937 steps, batch 64, SGD 0.01 momentum 0.9), same initial weights, same data order, same math mode; then
the model's individual ops and an 8192^3 sgemm. Prints a table and writes JSON.

    python scripts/bench.py                 # strict FP32
    python scripts/bench.py --tf32 --json runs/bench_tf32.json
    python scripts/bench.py --amp           # mixed precision: dnnbind float16 (MXNet's), PyTorch AMP bf16
    python scripts/bench.py --model resnet18   # d2l's ResNet-18 / AlexNet training step: scripts/bench_models.py
    python scripts/bench.py --model resnet50   # ResNet-50 v1.5, 3x224x224, batch 256: scripts/bench_models.py
    python scripts/bench.py --model resnet18 --gpus 2   # scaling from 1 to 2 GPUs: scripts/bench_scaling.py
"""

import argparse
import contextlib
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, gluon  # noqa: E402
from dnnbind.graph import training_step  # noqa: E402
from dnnbind.gluon.data.vision import MNIST  # noqa: E402
from models.simple_cnn import SimpleCNN, to_torch  # noqa: E402

BATCH, STEPS, LR, MOMENTUM = 64, 937, 0.01, 0.9  # FACTS.md's measured setting
SEED = 0


def load_data(dev, seed):
    train, test = MNIST(train=True), MNIST(train=False)
    perm = np.random.default_rng(seed).permutation(len(train.label))[:BATCH * STEPS]
    x = train.data[perm].transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    xs = mx.array(x, device=dev)                               # one shuffled epoch, resident on the GPU
    ys = mx.array(train.label[perm].astype(np.int32), device=dev)
    tx = test.data.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    return xs, ys, tx, test.label.astype(np.int32)


def make_net(dev, seed):
    np.random.seed(seed)
    net = SimpleCNN(fuse_relu=True)
    net.initialize(mx.init.TorchDefault(), ctx=dev)
    net(mx.zeros((2, 1, 28, 28), device=dev))
    return net


def accuracy_dnnbind(net, tx, ty, dev, dtype=np.float32):
    with autograd.predict_mode():
        pred = np.concatenate([net(mx.array(tx[i:i + 1000].astype(dtype), device=dev)).numpy().argmax(1)
                               for i in range(0, len(ty), 1000)])
    return float((pred == ty).mean())


def bench_dnnbind(xs, ys, tx, ty, dev, seed, replay, amp=False):
    """replay: None (eager, autograd every step), "hybridize" (the same loop after ``net.hybridize()``: the net's
    forward and backward replay their recorded calls), "graph" (the step captured as one CUDA graph) or "host"
    (the step's library calls recorded once and re-issued from the host, no CUDA graph).
    amp: MXNet's mixed precision, ``net.cast('float16')`` with float32 master weights in the Trainer; each batch
    is cast to float16 inside the timed loop, as PyTorch's autocast casts its float32 input."""
    net = make_net(dev, seed)
    dtype = np.float16 if amp else np.float32
    cast = (lambda x: x.astype("float16")) if amp else (lambda x: x)
    if amp:
        net.cast("float16")
    if replay == "hybridize":
        net.hybridize()
        replay = None
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM,
                                                          "multi_precision": amp})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    stream = mx.current_stream(dev)
    t0 = time.perf_counter()
    if replay is not None:
        step = training_step(net, loss_fn, trainer, (BATCH, 1, 28, 28), replay=replay, device=dev, data_dtype=dtype)
        setup = time.perf_counter() - t0
        stream.synchronize()
        t0 = time.perf_counter()
        for i in range(STEPS):  # each batch: two D2D copies into the recorded input buffers, one replay
            loss = step(cast(xs[i * BATCH:(i + 1) * BATCH]), ys[i * BATCH:(i + 1) * BATCH])
    else:
        setup = 0.0
        for i in range(STEPS):
            with autograd.record():
                loss = loss_fn(net(cast(xs[i * BATCH:(i + 1) * BATCH])), ys[i * BATCH:(i + 1) * BATCH])
            loss.backward()
            trainer.step(BATCH)
    stream.synchronize()
    epoch = time.perf_counter() - t0
    return {"epoch_s": epoch, "setup_s": setup, "final_loss": float(loss.mean().item()),
            "accuracy": accuracy_dnnbind(net, tx, ty, dev, dtype)}


def bench_torch(torch, xs, ys, tx, ty, dev, seed, graph, amp=False):
    """amp: torch.autocast with bfloat16 (PyTorch's mixed precision; no loss scaler needed)."""
    tnet = to_torch(make_net(dev, seed))
    opt = torch.optim.SGD(tnet.parameters(), lr=LR, momentum=MOMENTUM)
    X, Y = torch.from_dlpack(xs), torch.from_dlpack(ys).long()  # the same buffers, zero copy
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)) if amp
                else contextlib.nullcontext)

    def lossf(logits, labels):
        return torch.nn.functional.cross_entropy(logits.float(), labels)

    def forward(x):
        with autocast():
            return tnet(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    setup = 0.0
    if graph:
        sx, sy = X[:BATCH].clone(), Y[:BATCH].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream, as the CUDA-graphs docs prescribe
            state = {k: v.clone() for k, v in tnet.state_dict().items()}
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                lossf(forward(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = lossf(forward(sx), sy)
            static_loss.backward()
            opt.step()
        torch.cuda.synchronize()
        # NOTE: the momentum buffers must exist before capture (else the captured step is SGD's first-step
        # branch, buf = grad, forever); undo the warm-up by restoring weights and zeroing the buffers.
        with torch.no_grad():
            tnet.load_state_dict(state)
            for group in opt.param_groups:
                for p in group["params"]:
                    opt.state[p]["momentum_buffer"].zero_()
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(STEPS):
            sx.copy_(X[i * BATCH:(i + 1) * BATCH])
            sy.copy_(Y[i * BATCH:(i + 1) * BATCH])
            g.replay()
        loss = static_loss
    else:
        for i in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = lossf(forward(X[i * BATCH:(i + 1) * BATCH]), Y[i * BATCH:(i + 1) * BATCH])
            loss.backward()
            opt.step()
    torch.cuda.synchronize()
    epoch = time.perf_counter() - t0
    with torch.no_grad():
        pred = torch.cat([forward(torch.from_numpy(tx[i:i + 1000]).cuda()).argmax(1).cpu()
                          for i in range(0, len(ty), 1000)]).numpy()
    return {"epoch_s": epoch, "setup_s": setup, "final_loss": float(loss.item()), "accuracy": float((pred == ty).mean())}


def bench_ops(torch, dev):
    """GPU time (median of CUDA-event timings) of the model's ops, dnnbind vs PyTorch."""
    rng = np.random.default_rng(0)
    rows = []
    g = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32), device=dev)  # noqa: E731

    def tm(fn, repeat=50):
        return mx.show_time(fn, warmup=5, repeat=repeat, device=dev).median_us

    def ttm(fn, repeat=50):
        for _ in range(5):
            fn()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeat):
            st.record()
            fn()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en) * 1e3)
        return float(np.median(times))

    T = (lambda a: torch.from_dlpack(a)) if torch else None
    F = torch.nn.functional if torch else None
    for name, xs_, ws_ in (("conv1", (64, 1, 28, 28), (32, 1, 3, 3)), ("conv2", (64, 32, 14, 14), (64, 32, 3, 3))):
        x, w, b = g(*xs_), g(*ws_), g(ws_[0])
        y = mx.conv_forward(x, w, b, padding=1)
        dy = g(*y.shape)
        rows.append((f"{name} forward", tm(lambda: mx.conv_forward(x, w, b, padding=1)),
                     ttm(lambda: F.conv2d(T(x), T(w), T(b), padding=1)) if torch else None))
        rows.append((f"{name} backward data", tm(lambda: mx.conv_backward_data(w, dy, xs_, padding=1)),
                     ttm(lambda: torch.ops.aten.convolution_backward(T(dy), T(x), T(w), [ws_[0]], [1, 1], [1, 1],
                                                                   [1, 1], False, [0, 0], 1, [True, False, False]))
                     if torch else None))
        rows.append((f"{name} backward filter", tm(lambda: mx.conv_backward_filter(x, dy, ws_, padding=1)),
                     ttm(lambda: torch.ops.aten.convolution_backward(T(dy), T(x), T(w), [ws_[0]], [1, 1], [1, 1],
                                                                   [1, 1], False, [0, 0], 1, [False, True, False]))
                     if torch else None))
    a = g(64, 32, 28, 28)
    rows.append(("relu forward", tm(lambda: mx.activation_forward(a, "relu")), ttm(lambda: F.relu(T(a))) if torch else None))
    rows.append(("maxpool forward", tm(lambda: mx.pooling_forward(a, "max", 2)),
                 ttm(lambda: F.max_pool2d(T(a), 2)) if torch else None))
    lg = g(64, 10)
    rows.append(("softmax forward", tm(lambda: mx.softmax_forward(lg)), ttm(lambda: F.softmax(T(lg), 1)) if torch else None))
    fx, fw = g(64, 3136), g(128, 3136)
    rows.append(("fc1 gemm", tm(lambda: mx.linear_forward(fx, fw)), ttm(lambda: F.linear(T(fx), T(fw))) if torch else None))
    big_a, big_b = g(8192, 8192), g(8192, 8192)
    for mode in ("fp32", "tf32"):
        with mx.math_scope(mode):
            ours = tm(lambda: mx.gemm(big_a, big_b), repeat=10)
        theirs = None
        if torch:
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            theirs = ttm(lambda: torch.mm(T(big_a), T(big_b)), repeat=10)
            torch.backends.cuda.matmul.allow_tf32 = prev
        rows.append((f"sgemm 8192^3 {mode}", ours, theirs))
    return rows


def environment(torch) -> dict:
    """GPU, library versions and date, for the JSON of this script and of bench_models.py."""
    info = mx.show_config()
    return {"gpu": info["gpus"], "cudnn": info["cudnn"], "cublas": info["cublas"], "cuda": info.get("cuda"),
            "cuda_python": info.get("cuda_python"), "torch": getattr(torch, "__version__", None),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


MODELS = ("simplecnn", "resnet18", "alexnet", "resnet50")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", choices=MODELS, default="simplecnn")
    pre.add_argument("--gpus", type=int, default=None)
    known, rest = pre.parse_known_args(argv)
    if known.gpus is not None:  # data-parallel scaling, 1 to N GPUs: its own script
        import bench_scaling
        model = "resnet18" if known.model == "simplecnn" else known.model
        return bench_scaling.main(["--model", model, "--gpus", str(known.gpus), *rest])
    if known.model != "simplecnn":  # the larger models time a training step: their own script and options
        import bench_models
        return bench_models.main(["--model", known.model, *rest])
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=MODELS, default="simplecnn",
                   help="resnet18, alexnet, resnet50: scripts/bench_models.py (see --model resnet50 --help)")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision (TF32 for the rest): dnnbind float16 with float32 master weights, PyTorch "
                        "autocast bf16")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--seeds", type=int, default=3,
                   help="accuracy is compared as the mean over this many seeds (initial weights and data order)")
    p.add_argument("--json", default="runs/bench.json")
    p.add_argument("--skip-ops", action="store_true")
    args = p.parse_args(argv)
    if mx.num_gpus() == 0:
        raise SystemExit(f"bench.py needs a GPU: {mx.runtime.gpu_status()[1]}")
    dev = mx.gpu(0)
    args.tf32 = args.tf32 or args.amp
    mode = "tf32" if args.tf32 else "fp32"
    mx.set_math_mode(mode)
    if args.amp:
        mode = "amp (dnnbind float16, PyTorch bf16; TF32 elsewhere)"
    try:
        import torch
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    env = environment(torch)
    xs, ys, tx, ty = load_data(dev, args.seed)

    def runs_for(xs, ys, seed):
        runs = [("dnnbind eager", lambda: bench_dnnbind(xs, ys, tx, ty, dev, seed, None, args.amp)),
                ("dnnbind hybridized", lambda: bench_dnnbind(xs, ys, tx, ty, dev, seed, "hybridize", args.amp)),
                ("dnnbind recorded step", lambda: bench_dnnbind(xs, ys, tx, ty, dev, seed, "host", args.amp)),
                ("dnnbind captured step", lambda: bench_dnnbind(xs, ys, tx, ty, dev, seed, "graph", args.amp))]
        if torch is not None:
            runs += [("PyTorch eager", lambda: bench_torch(torch, xs, ys, tx, ty, dev, seed, False, args.amp)),
                     ("PyTorch CUDA graph", lambda: bench_torch(torch, xs, ys, tx, ty, dev, seed, True, args.amp))]
        return runs

    results = {}
    for name, fn in runs_for(xs, ys, args.seed):
        fn()  # warm-up epoch (not reported): algorithms, kernels, memory pools
        results[name] = fn()
        r = results[name]
        print(f"{name:<24} epoch {r['epoch_s']:.3f} s  setup {r['setup_s']:.3f} s  accuracy {100 * r['accuracy']:.2f}%")
    print(f"\nSimpleCNN, one epoch ({STEPS} steps, batch {BATCH}), math {mode}, {env['gpu']['devices'][0]['name']}")
    print(f"{'run':<24}{'epoch s':>10}{'images/s':>12}{'accuracy':>10}{'vs PyTorch eager':>18}{'vs PyTorch graph':>18}")
    for name, r in results.items():
        pe = results.get("PyTorch eager", {}).get("epoch_s")
        pg = results.get("PyTorch CUDA graph", {}).get("epoch_s")
        print(f"{name:<24}{r['epoch_s']:>10.3f}{BATCH * STEPS / r['epoch_s']:>12,.0f}{100 * r['accuracy']:>9.2f}%"
              f"{(r['epoch_s'] / pe if pe else float('nan')):>17.2f}x{(r['epoch_s'] / pg if pg else float('nan')):>17.2f}x")
    # Accuracy after one epoch depends on the seed (FACTS.md: 97.5-98.6%), so it is compared as a mean over
    # seeds; each seed changes the initial weights and the data order, the same for every implementation.
    seeds = [args.seed + i for i in range(max(args.seeds, 1))]
    accuracy = {name: [r["accuracy"]] for name, r in results.items()}
    for seed in seeds[1:]:
        sx, sy, _, _ = load_data(dev, seed)
        for name, fn in runs_for(sx, sy, seed):
            accuracy[name].append(fn()["accuracy"])
        del sx, sy
    print(f"\naccuracy after one epoch, seeds {seeds}")
    ref = accuracy.get("PyTorch eager")
    for name, accs in accuracy.items():
        mean = float(np.mean(accs))
        vs = f"{100 * (mean - float(np.mean(ref))):+.2f} pp vs PyTorch eager" if ref else ""
        print(f"{name:<24}{'  '.join(f'{100 * a:.2f}%' for a in accs)}   mean {100 * mean:.2f}%   {vs}")
    from dnnbind.ops import algos
    conv_algos = {target: {" ".join(map(str, k[:3])): v for k, v in algos.chosen(target).items()}
                  for target in ("eager", "graph")}
    print("\nconv algorithms (eager: least wall time per call; graph: least GPU time), key = direction x w")
    for target, table in conv_algos.items():
        for k, (name, ws) in table.items():
            print(f"  {target:<6}{k:<44}{name:<34}{ws / 2**20:6.1f} MiB")
    ops_rows = [] if args.skip_ops else bench_ops(torch, dev)
    if ops_rows:
        print("\nsingle-call latency: CUDA events around one call on an idle GPU (launch latency included)")
        print(f"{'op':<28}{'dnnbind us':>12}{'PyTorch us':>12}{'ratio':>8}")
        for name, ours, theirs in ops_rows:
            print(f"{name:<28}{ours:>12.1f}{(theirs or float('nan')):>12.1f}{(ours / theirs if theirs else float('nan')):>8.2f}")
    out = {**env, "math_mode": mode, "train": results,
           "accuracy_by_seed": {"seeds": seeds, **accuracy}, "conv_algorithms": conv_algos,
           "ops": [{"op": n, "dnnbind_us": o, "torch_us": t} for n, o, t in ops_rows]}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
