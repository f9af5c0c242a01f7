"""Per-call cost of nd table ops against PyTorch, same process, same GPU: host + GPU time of back-to-back
calls at the SimpleCNN's sizes (an element-wise op on 64x3136, a broadcast add 64x128 + 128, row reductions).

    python scripts/bench_nd.py [--calls 2000] [--json runs/bench_nd.json]

Each row times ``calls`` calls in a loop and one synchronize, best of 5 repeats, so the number is what a
Python training loop pays per op: dispatch, allocation, launch, and the kernel where the GPU is the bottleneck.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind  # noqa: E402
from dnnbind import nd  # noqa: E402


def per_call(fn, sync, calls, repeats=5):
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--json", default="runs/bench_nd.json")
    args = p.parse_args()
    import torch
    dev = dnnbind.gpu(0)
    rng = np.random.default_rng(0)
    big = rng.normal(size=(64, 3136)).astype(np.float32)
    small = rng.normal(size=(64, 128)).astype(np.float32)
    bias = rng.normal(size=(128,)).astype(np.float32)
    a, b, s, v = (nd.array(x, ctx=dev) for x in (big, big, small, bias))
    ta, tb, ts, tv = (torch.tensor(x, device="cuda") for x in (big, big, small, bias))
    sync_d, sync_t = (lambda: nd.waitall()), torch.cuda.synchronize
    cases = [
        ("relu 64x3136", lambda: nd.relu(a), lambda: torch.relu(ta)),
        ("exp 64x3136", lambda: nd.exp(a), lambda: torch.exp(ta)),
        ("a * b 64x3136", lambda: a * b, lambda: ta * tb),
        ("a + 1.5 64x3136", lambda: a + 1.5, lambda: ta + 1.5),
        ("broadcast add 64x128 + 128", lambda: s + v, lambda: ts + tv),
        ("row sum 64x3136 -> 64", lambda: a.sum(axis=1), lambda: ta.sum(dim=1)),
        ("row sum 64x128 -> 64", lambda: s.sum(axis=1), lambda: ts.sum(dim=1)),
        ("row max 64x128 -> 64", lambda: s.max(axis=1), lambda: ts.amax(dim=1)),
        ("column sum 64x128 -> 128", lambda: s.sum(axis=0), lambda: ts.sum(dim=0)),
        ("mean 64x3136 -> 1", lambda: a.mean(), lambda: ta.mean()),
    ]
    from dnnbind.nd import _lower
    rows = []
    print(f"{'op':32s} {'cuDNN lowering us':>17s} {'NVRTC us':>9s} {'torch us':>9s} {'best ratio':>10s}")
    for name, fd, ft in cases:
        _lower.USE_CUDNN_OPTENSOR = _lower.USE_CUDNN_REDUCE = True
        lib = per_call(fd, sync_d, args.calls)
        _lower.USE_CUDNN_OPTENSOR = _lower.USE_CUDNN_REDUCE = False
        gen = per_call(fd, sync_d, args.calls)
        t = per_call(ft, sync_t, args.calls)
        best = min(lib, gen)
        rows.append({"op": name, "cudnn_lowering_us": round(lib, 2), "nvrtc_us": round(gen, 2),
                     "torch_us": round(t, 2), "ratio": round(best / t, 3)})
        print(f"{name:32s} {lib:17.2f} {gen:9.2f} {t:9.2f} {best / t:9.2f}x")
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": args.calls, "rows": rows}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
