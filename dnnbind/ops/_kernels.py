"""Layer 2 (ops): the few small CUDA kernels where cuDNN/cuBLAS have no call (label gather/scatter for the
losses, fill with a value, SGD's and Adam's updates). Imports dnnbind.kernels (NVRTC), compiled on first use and cached.
"""

from __future__ import annotations

import numpy as np

SOURCE = r"""
#define LOSS_KERNELS(T, L, SUF)                                                                      \
extern "C" __global__ void nll_fwd_##SUF(const T* logp, const L* labels, T* loss, int n, int c) {   \
    int i = blockIdx.x * blockDim.x + threadIdx.x;                                                   \
    if (i < n) {                                                                                     \
        L k = labels[i];                                                                             \
        /* an out-of-range label gives NaN: the training loop's NaN check reports it */              \
        loss[i] = (k >= 0 && k < c) ? -logp[(long long)i * c + k] : (T)__int_as_float(0x7fc00000);                        \
    }                                                                                                \
}                                                                                                    \
extern "C" __global__ void nll_bwd_##SUF(const L* labels, const T* dloss, T* dlogp, int n, int c) { \
    long long total = (long long)n * c;                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;                  \
         i += (long long)gridDim.x * blockDim.x) {                                                   \
        int row = (int)(i / c), col = (int)(i % c);                                                  \
        dlogp[i] = (col == (int)labels[row]) ? -dloss[row] : (T)0;                                   \
    }                                                                                                \
}                                                                                                    \
extern "C" __global__ void sce_bwd_##SUF(const T* prob, const L* labels, const T* dloss, T* dx,      \
                                         int n, int c) {                                             \
    long long total = (long long)n * c;                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;                  \
         i += (long long)gridDim.x * blockDim.x) {                                                   \
        int row = (int)(i / c), col = (int)(i % c);                                                  \
        T onehot = (col == (int)labels[row]) ? (T)1 : (T)0;                                          \
        dx[i] = (prob[i] - onehot) * dloss[row];                                                     \
    }                                                                                                \
}
LOSS_KERNELS(float, int, f32_i32)
LOSS_KERNELS(float, long long, f32_i64)
LOSS_KERNELS(double, int, f64_i32)
LOSS_KERNELS(double, long long, f64_i64)

extern "C" __global__ void fill_f32(float* x, float v, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = v;
}
/* A Dense layer's bias as the rows of y (y[i][j] = b[j]) before the gemm that adds x w^T with beta = 1: one pass
   where a rank-1 gemm (ones b^T) took 2.7-2.9 us at SimpleCNN's sizes. 2-byte types are copied as bits. */
#define BIAS_ROWS(T, SUF)                                                                                \
extern "C" __global__ void bias_rows_##SUF(T* y, const T* b, long long n, int units) {                 \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                        \
         i += (long long)gridDim.x * blockDim.x)                                                        \
        y[i] = b[i % units];                                                                            \
}
BIAS_ROWS(double, 8)
BIAS_ROWS(float, 4)
BIAS_ROWS(unsigned short, 2)
extern "C" __global__ void fill_f64(double* x, double v, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = v;
}

/* Adam over one flat buffer: m, v, w updated in place; grad is already scaled (rescale_grad, weight decay). */
/* SGD over one flat buffer, MXNet's rule, each element read and written once (the cuBLAS form took three or
   four passes over the model). The FMAs in the order the cuBLAS form ran them: the same float32 results.
   With momentum: mom = momentum*mom + a_g*g + a_w*w; w += mom (a_g = -lr*rescale, a_w = -lr*wd).
   Without: w = decay*w + a_g*g (decay = 1 - lr*wd). */
extern "C" __global__ void sgd_mom_f32(float* w, const float* g, float* mom, float momentum, float a_g, float a_w,
                                       long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float m = momentum * mom[i];
        m = fmaf(a_g, g[i], m);
        m = fmaf(a_w, w[i], m);
        mom[i] = m;
        w[i] = w[i] + m;
    }
}
extern "C" __global__ void sgd_f32(float* w, const float* g, float decay, float a_g, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        w[i] = fmaf(a_g, g[i], decay * w[i]);
}

/* Mixed precision (net.cast('float16')): the same SGD reading the float16 gradients directly and writing the
   float16 weights rounded from the new float32 master weights: one pass instead of a cast in, the update and a
   cast out. Conversions as cuda_fp16.h does them (NVRTC ships no cuda_fp16.h): exact in, round-to-nearest out. */
__device__ __forceinline__ float sgd_h2f(const unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short sgd_f2h(const float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
extern "C" __global__ void sgd_mom_f32_h16(float* w, const unsigned short* g, float* mom, unsigned short* w16,
                                           float momentum, float a_g, float a_w, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float m = momentum * mom[i];
        m = fmaf(a_g, sgd_h2f(g[i]), m);
        m = fmaf(a_w, w[i], m);
        mom[i] = m;
        const float wn = w[i] + m;
        w[i] = wn;
        w16[i] = sgd_f2h(wn);
    }
}
extern "C" __global__ void sgd_f32_h16(float* w, const unsigned short* g, unsigned short* w16, float decay,
                                       float a_g, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float wn = fmaf(a_g, sgd_h2f(g[i]), decay * w[i]);
        w[i] = wn;
        w16[i] = sgd_f2h(wn);
    }
}

extern "C" __global__ void adam_f32(float* w, const float* g, float* m, float* v, float lr_t, float beta1,
                                    float beta2, float eps, float rescale, float wd, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = g[i] * rescale + wd * w[i];
        float mi = beta1 * m[i] + (1.f - beta1) * gi;
        float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
        m[i] = mi; v[i] = vi;
        w[i] -= lr_t * mi / (sqrtf(vi) + eps);
    }
}
"""

_module = {}


def kernel(name: str):
    """The compiled kernel ``name`` from SOURCE (one NVRTC compile per process, then the disk cache)."""
    mod = _module.get("m")
    if mod is None:
        from ..kernels import Module
        mod = _module["m"] = Module(SOURCE)
    return mod.get_function(name)


def suffix(dtype, label_dtype) -> str:
    t = "f64" if np.dtype(dtype) == np.float64 else "f32"
    li = "i64" if np.dtype(label_dtype).itemsize == 8 else "i32"
    return f"{t}_{li}"


def grid_for(n: int, block: int = 256, cap: int = 4096) -> int:
    return max(1, min((int(n) + block - 1) // block, cap))
