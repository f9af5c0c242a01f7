"""Run every dnnbind op once and print where it ran, which library call it made, and its error against
float64 numpy. `python scripts/demo.py [--device cpu|gpu]`."""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as d  # noqa: E402
from dnnbind.ops import reference as R  # noqa: E402

rng = np.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default=None, help="cpu or gpu (default: gpu if there is one)")
    args = p.parse_args()
    dev = d.default_device() if args.device is None else d.Device("gpu" if args.device != "cpu" else "cpu")
    d.show_config()
    print(f"\nrunning on {dev}\n")
    x, w, b = rnd(8, 3, 12, 12), rnd(6, 3, 3, 3), rnd(6)
    dy = rnd(8, 6, 12, 12)
    logits, labels = rnd(8, 10), rng.integers(0, 10, 8).astype(np.int32)
    a, bm = rnd(8, 20), rnd(20, 5)
    cases = [  # (op, library call it reaches on the GPU, dnnbind call, float64 reference)
        ("conv_forward", "cudnnConvolutionForward", lambda A: d.conv_forward(A(x), A(w), A(b), padding=1),
         lambda: R.conv_forward(x.astype(float), w.astype(float), b.astype(float), padding=1)),
        ("conv_backward_data", "cudnnConvolutionBackwardData",
         lambda A: d.conv_backward_data(A(w), A(dy), x.shape, padding=1),
         lambda: R.conv_backward_data(w.astype(float), dy.astype(float), x.shape, padding=1)),
        ("conv_backward_filter", "cudnnConvolutionBackwardFilter",
         lambda A: d.conv_backward_filter(A(x), A(dy), w.shape, padding=1),
         lambda: R.conv_backward_filter(x.astype(float), dy.astype(float), w.shape, padding=1)),
        ("conv_backward_bias", "cudnnConvolutionBackwardBias", lambda A: d.conv_backward_bias(A(dy)),
         lambda: R.conv_backward_bias(dy.astype(float))),
        ("activation_forward", "cudnnActivationForward", lambda A: d.activation_forward(A(x), "relu"),
         lambda: R.activation_forward(x.astype(float), "relu")),
        ("pooling_forward", "dn_maxpool_fwd (NVRTC)", lambda A: d.pooling_forward(A(x), "max", 2),
         lambda: R.pooling_forward(x.astype(float), "max", 2)),
        ("softmax_forward", "cudnnSoftmaxForward", lambda A: d.softmax_forward(A(logits)),
         lambda: R.softmax_forward(logits.astype(float))),
        ("gemm", "cublasSgemm_v2", lambda A: d.gemm(A(a), A(bm)), lambda: R.gemm(a.astype(float), bm.astype(float))),
        ("linear_forward", "cublasSgemm_v2", lambda A: d.linear_forward(A(a), A(bm.T.copy()), A(rnd(5))),
         None),
        ("softmax_cross_entropy", "cudnnSoftmaxForward + kernel",
         lambda A: d.softmax_cross_entropy(A(logits), A(labels)),
         lambda: R.softmax_cross_entropy(logits.astype(float), labels)),
    ]
    print(f"{'op':<24}{'library call (GPU)':<34}{'device':<8}{'max rel. error vs float64':>26}")
    for name, call, run, ref in cases:
        out = run(lambda v: d.array(v, device=dev))
        if ref is None:
            print(f"{name:<24}{call:<34}{str(out.device):<8}{'(shape ' + str(out.shape) + ')':>26}")
            continue
        expected = ref()
        got = out.numpy().astype(np.float64)
        err = np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30)
        print(f"{name:<24}{(call if dev.is_gpu else 'numpy'):<34}{str(out.device):<8}{err:>26.2e}")


if __name__ == "__main__":
    main()
