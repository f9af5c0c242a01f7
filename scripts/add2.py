"""Seed 003 (NN-CUDA-Example's add2) with dnnbind: the same CUDA C kernel, compiled at run time by NVRTC instead
of a torch C++ extension, launched on dnnbind arrays, checked against numpy, and timed with show_time next to
dnnbind's own additions (cublasSaxpy_v2 and NDArray a + b) and PyTorch's a + b.

    python scripts/add2.py [--n 1048576] [--repeat 100]

Without a GPU it still compiles the kernel (NVRTC needs no GPU) and prints the code sizes.
"""

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind
import dnnbind.nd  # installs the NDArray arithmetic operators (a + b)
import dnnbind.trace
from dnnbind import kernels

N = 1024 * 1024  # elements per array (the seed's n)
BLOCK = 1024  # threads per block, as in the seed's launch_add2
WARMUP = 10  # untimed runs first (the seed: 10)
REPEAT = 100  # timed runs; the table shows the median of their GPU event times

# The seed's kernel, word for word, plus extern "C" so NVRTC keeps its plain name.
ADD2 = r"""
extern "C" __global__ void add2_kernel(float* c,
                                       const float* a,
                                       const float* b,
                                       int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; \
            i < n; i += gridDim.x * blockDim.x) {
        c[i] = a[i] + b[i];
    }
}
"""


def launch_add2(kernel, c, a, b, n: int) -> None:
    """The seed's launch_add2: grid (n + 1023) / 1024 blocks of 1024 threads."""
    kernel.launch(grid=(n + BLOCK - 1) // BLOCK, block=BLOCK, args=(c, a, b, n))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=N, help="elements per array")
    p.add_argument("--repeat", type=int, default=REPEAT, help="timed runs per variant")
    args = p.parse_args()
    n = args.n

    # compile: CUBIN for this GPU (sm_90 without one), and PTX to show what NVRTC emits
    kernel = kernels.compile(ADD2, "add2_kernel")
    ptx = kernels.compile(ADD2, "add2_kernel", arch="compute_90")
    print(f"add2_kernel: {kernel.module.kind.upper()} for {kernel.module.arch} {len(kernel.module.code)} bytes,"
          f" PTX for compute_90 {len(ptx.module.code)} bytes")
    if dnnbind.num_gpus() == 0:
        print("no GPU: launching and timing add2 needs an NVIDIA GPU and driver; compiled only")
        return

    # data: the seed's a, b, c of n floats on the GPU
    dev = dnnbind.gpu(0)
    rng = np.random.default_rng(0)
    a_np, b_np = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    a, b = dnnbind.array(a_np, device=dev), dnnbind.array(b_np, device=dev)
    c = dnnbind.empty((n,), np.float32, dev)
    y = b.copy()  # cublasSaxpy_v2 adds in place: y = b, then y += 1.0 * a

    # check every variant against numpy once (float32 addition: bitwise equal)
    launch_add2(kernel, c, a, b, n)
    dnnbind.axpy(1.0, a, y)
    want = a_np + b_np
    for name, got in (("add2_kernel", c), ("cublasSaxpy_v2", y), ("NDArray a + b", a + b)):
        err = float(np.abs(got.numpy() - want).max())
        print(f"check {name:<16} max |error| vs numpy = {err:.3g}")
        assert err <= 1e-6, f"{name} disagrees with numpy"

    # time: median GPU time over --repeat runs, CUDA events on dnnbind's stream (show_time)
    variants = [(f"add2_kernel (NVRTC, {(n + BLOCK - 1) // BLOCK}x{BLOCK})", lambda: launch_add2(kernel, c, a, b, n)),
                ("cublasSaxpy_v2 (dnnbind.axpy)", lambda: dnnbind.axpy(1.0, a, y)),
                ("NDArray a + b (dnnbind.nd)", lambda: a + b)]
    torch = _torch()
    if torch is not None:
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        variants.append(("torch a + b", lambda: ta + tb))
    print(f"\nc = a + b, n = {n} float32, median of {args.repeat} runs")
    print(f"{'':<40}{'GPU us':>10}{'host us':>10}")
    for name, fn in variants:
        t = dnnbind.show_time(fn, warmup=WARMUP, repeat=args.repeat, device=dev, name=name)
        print(f"{name:<40}{t.median_us:>10.2f}{statistics.median(t.wall_us):>10.2f}")

    # trace: what each variant dispatched to
    with dnnbind.trace() as tr:
        for _, fn in variants[:3]:
            fn()
    print("\n" + str(tr))


def _torch():
    """torch when it imports with CUDA, launching on dnnbind's stream so show_time's events bracket it."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        torch.cuda.set_stream(torch.cuda.ExternalStream(dnnbind.current_stream(dnnbind.gpu(0)).handle))
        return torch
    except Exception:  # noqa: BLE001 - torch is optional: any failure just drops its row
        return None


if __name__ == "__main__":
    main()
