"""Layer 2 (ops): the CUDA source of two small NVRTC kernel families and their launch geometry (pure Python).

- Per-channel sums of a 4-D array, optionally through the ReLU mask: ``dz = y > 0 ? dy : 0`` and ``db[c]`` = the sum
  of dz (or of dy with the mask off) over n, h, w, in ONE pass (ops.bias_relu). Deterministic: every block writes
  its partial sum to its own slot of a scratch buffer and a second tiny kernel adds each channel's slots in a fixed
  order; no atomics. The split of each channel over several blocks fills the GPU even when C is 32.
- Max pooling with window == stride and no padding, forward and backward, NCHW and NHWC (ops.pooling): each window
  belongs to one thread, so the backward writes every dx element exactly once, without atomics.

Imports numpy, and dnnbind.kernels on first use (compiled once per process, then the disk cache). float16 is
stored as ``unsigned short`` bits and converted with the PTX ``cvt`` instructions, as in ops._kernels (NVRTC ships
no cuda_fp16.h). Sizes travel as int; the ops send arrays of 2**31 elements or more down their library paths.
"""

from __future__ import annotations

import numpy as np

BLOCK = 256  # threads per block of every kernel here (the sources assume it: DN_B)
TARGET_BLOCKS = 1024  # channel sums: ~8 resident 256-thread blocks on each of an H100's 132 SMs
MIN_PACKS = 2  # channel sums: a block slice gives each thread at least this many loads (else fewer, larger slices)
MAX_SPLITS = 4096  # slices per channel: the final kernel's fixed-order sum stays short
INT_LIMIT = 2**31  # element counts (and offsets) the kernels index with 32-bit integers

# The CUDA prelude of every kernel source here and of ops._wgrad_kernels': the block size, float16 as bits, and
# dn_ld/dn_st (float <-> the element type).
PREAMBLE = r"""
#define DN_B 256
typedef unsigned short dn_half;
__device__ __forceinline__ float dn_ld(const float v) { return v; }
__device__ __forceinline__ float dn_ld(const dn_half h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
template <typename T> __device__ __forceinline__ T dn_st(const float f);
template <> __device__ __forceinline__ float dn_st<float>(const float f) { return f; }
template <> __device__ __forceinline__ dn_half dn_st<dn_half>(const float f) {
    dn_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""

CHANNEL_SOURCE = PREAMBLE + r"""
/* V elements moved by one load: 16 bytes when the extent and the pointers allow it (fewer instructions, the
   same bytes). */
template <typename T, int V> struct alignas(sizeof(T) * V) dn_pack { T v[V]; };

/* One pack: dz = y > 0 ? dy : 0 (the mask off: dz not written) and its values added into acc. A NaN y counts
   as not positive; a NaN dy where y > 0 reaches the sum. */
template <typename T, int V, bool RELU>
__device__ __forceinline__ void dn_take(const dn_pack<T, V>& yy, const dn_pack<T, V>& d, dn_pack<T, V>* dz,
                                        float (&acc)[V]) {
    if (RELU) {
        dn_pack<T, V> z;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const bool on = dn_ld(yy.v[k]) > 0.f;
            z.v[k] = on ? d.v[k] : (T)0;
            acc[k] += on ? dn_ld(d.v[k]) : 0.f;
        }
        *dz = z;
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += dn_ld(d.v[k]);
    }
}

/* The block's sum lands in slot (c, slice) of part, or (one slice per channel) straight in db[c]. */
template <typename T>
__device__ __forceinline__ void dn_put(float s, float* __restrict__ part, T* __restrict__ db, unsigned int c) {
    if (gridDim.y == 1) db[c] = dn_st<T>(s);
    else part[(size_t)c * gridDim.y + blockIdx.y] = s;
}

/* NCHW: grid (C, S), 256 threads. Block (c, s) takes packs [s * chunk, (s + 1) * chunk) of channel c's
   groups = N * HW / V packs; pack g is at n = g / hwv, r = g % hwv (hwv = HW / V). Four packs per thread are in
   flight per iteration: memory latency, not arithmetic, bounds this kernel. The per-thread sums are combined by a
   fixed butterfly in each warp, then the eight warp sums in order: the same bits on every run. */
template <typename T, int V, bool RELU>
__global__ void __launch_bounds__(DN_B) dn_chan_nchw(const T* __restrict__ y, const T* __restrict__ dy,
                                                     T* __restrict__ dz, float* __restrict__ part,
                                                     T* __restrict__ db, int C_, int hwv_, int groups_, int chunk_) {
    typedef dn_pack<T, V> P;
    const unsigned int C = C_, hwv = hwv_, c = blockIdx.x;
    const unsigned int g0 = blockIdx.y * (unsigned int)chunk_;
    const unsigned int g1 = min(g0 + (unsigned int)chunk_, (unsigned int)groups_);
    const P* yp = (const P*)y;
    const P* dyp = (const P*)dy;
    P* dzp = (P*)dz;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    unsigned int g = g0 + threadIdx.x;
    for (; g + 3 * DN_B < g1; g += 4 * DN_B) {
        size_t off[4];
        P d[4], yy[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned int gu = g + u * DN_B, n = gu / hwv;
            off[u] = ((size_t)n * C + c) * hwv + (gu - n * hwv);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            d[u] = dyp[off[u]];
            if (RELU) yy[u] = yp[off[u]];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) dn_take<T, V, RELU>(yy[u], d[u], dzp + off[u], acc);
    }
    for (; g < g1; g += DN_B) {
        const unsigned int n = g / hwv;
        const size_t off = ((size_t)n * C + c) * hwv + (g - n * hwv);
        P yy;
        if (RELU) yy = yp[off];
        dn_take<T, V, RELU>(yy, dyp[off], dzp + off, acc);
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) s += acc[k];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) s += __shfl_xor_sync(0xffffffffu, s, h);
    __shared__ float warp_sums[DN_B / 32];
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
#pragma unroll
        for (int w = 0; w < DN_B / 32; ++w) t += warp_sums[w];
        dn_put<T>(t, part, db, c);
    }
}

/* NHWC: the data is a (rows = N*H*W, C) matrix. Block (TX, TY), TX * TY = 256, TX a power of two covering the
   cv = C / V channel packs; grid (ceil(cv / TX), S). Thread (tx, ty) adds pack cp = blockIdx.x * TX + tx of rows
   r0 + ty, r0 + ty + TY, ... of its block's slice [r0, r0 + chunk): a warp reads whole rows, coalesced. Then a
   fixed shared-memory tree over ty. */
template <typename T, int V, bool RELU>
__global__ void __launch_bounds__(DN_B) dn_chan_nhwc(const T* __restrict__ y, const T* __restrict__ dy,
                                                     T* __restrict__ dz, float* __restrict__ part,
                                                     T* __restrict__ db, int C_, int rows_, int chunk_) {
    typedef dn_pack<T, V> P;
    const unsigned int cv = (unsigned int)C_ / V, tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x,
                       TY = blockDim.y;
    const unsigned int cp = blockIdx.x * TX + tx;
    const unsigned int r0 = blockIdx.y * (unsigned int)chunk_;
    const unsigned int r1 = min(r0 + (unsigned int)chunk_, (unsigned int)rows_);
    const P* yp = (const P*)y;
    const P* dyp = (const P*)dy;
    P* dzp = (P*)dz;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (cp < cv) {
        unsigned int r = r0 + ty;
        for (; r + 3 * TY < r1; r += 4 * TY) {
            size_t off[4];
            P d[4], yy[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) off[u] = (size_t)(r + u * TY) * cv + cp;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                d[u] = dyp[off[u]];
                if (RELU) yy[u] = yp[off[u]];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) dn_take<T, V, RELU>(yy[u], d[u], dzp + off[u], acc);
        }
        for (; r < r1; r += TY) {
            const size_t off = (size_t)r * cv + cp;
            P yy;
            if (RELU) yy = yp[off];
            dn_take<T, V, RELU>(yy, dyp[off], dzp + off, acc);
        }
    }
    __shared__ float sums[DN_B * V];
    const unsigned int me = (ty * TX + tx) * V;
#pragma unroll
    for (int k = 0; k < V; ++k) sums[me + k] = acc[k];
    __syncthreads();
    for (unsigned int h = TY >> 1; h > 0; h >>= 1) {
        if (ty < h) {
#pragma unroll
            for (int k = 0; k < V; ++k) sums[me + k] += sums[me + h * TX * V + k];
        }
        __syncthreads();
    }
    if (ty == 0 && cp < cv) {
#pragma unroll
        for (int k = 0; k < V; ++k) dn_put<T>(sums[me + k], part, db, cp * V + k);
    }
}

/* db[c] = the sum of channel c's S slots of part, in a fixed order: one warp per channel, lane l adds slots
   l, l + 32, ..., then a butterfly. */
template <typename T>
__global__ void __launch_bounds__(DN_B) dn_chan_final(const float* __restrict__ part, T* __restrict__ db, int C,
                                                      int S) {
    const int w = (int)((blockIdx.x * DN_B + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (w >= C) return;  // whole warps leave together: the shuffles below see all 32 lanes
    float a = 0.f;
    for (int s = lane; s < S; s += 32) a += part[(size_t)w * S + s];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) a += __shfl_xor_sync(0xffffffffu, a, h);
    if (lane == 0) db[w] = dn_st<T>(a);
}
"""

POOL_SOURCE = PREAMBLE + r"""
/* Output element o -> the offset of its window's top-left x, the x strides of a window row and column, and its
   output row p and column q. NCHW: o = ((plane * P) + p) * Q + q; NHWC: o = ((n * P + p) * Q + q) * C + c. */
template <bool NHWC>
__device__ __forceinline__ void dn_window(unsigned int o, unsigned int C, unsigned int H, unsigned int W,
                                          unsigned int P, unsigned int Q, unsigned int kh, unsigned int kw,
                                          unsigned int& base, unsigned int& sh, unsigned int& sw, unsigned int& p,
                                          unsigned int& q) {
    if (NHWC) {
        const unsigned int c = o % C, t = o / C;
        q = t % Q;
        const unsigned int t2 = t / Q;
        p = t2 % P;
        const unsigned int n = t2 / P;
        base = ((n * H + p * kh) * W + q * kw) * C + c;
        sh = W * C;
        sw = C;
    } else {
        q = o % Q;
        const unsigned int t = o / Q;
        p = t % P;
        base = ((t / P) * H + p * kh) * W + q * kw;
        sh = W;
        sw = 1;
    }
}

/* y = the window's max; a NaN anywhere in the window gives NaN (CUDNN_PROPAGATE_NAN). KH, KW: the window at
   compile time (the 2x2 case, fully unrolled), 0 for the runtime kh, kw. One thread per output element. */
template <typename T, int KH, int KW, bool NHWC>
__global__ void __launch_bounds__(DN_B) dn_maxpool_fwd(const T* __restrict__ x, T* __restrict__ y, int total,
                                                       int C, int H, int W, int P, int Q, int kh_, int kw_) {
    const unsigned int o = blockIdx.x * DN_B + threadIdx.x;
    if (o >= (unsigned int)total) return;
    const unsigned int kh = KH ? KH : kh_, kw = KW ? KW : kw_;
    unsigned int base, sh, sw, p, q;
    dn_window<NHWC>(o, C, H, W, P, Q, kh, kw, base, sh, sw, p, q);
    float m = dn_ld(x[base]);
#pragma unroll
    for (unsigned int i = 0; i < kh; ++i) {
#pragma unroll
        for (unsigned int j = 0; j < kw; ++j) {
            const float v = dn_ld(x[base + i * sh + j * sw]);
            if (v > m || v != v) m = v;  // once m is NaN nothing replaces it
        }
    }
    y[o] = dn_st<T>(m);  // exact: a float16 max is one of the float16 inputs
}

/* dx: each window's dy goes to its FIRST maximal x in row-major window order (strict > keeps the first of ties),
   0 to the other taps, as ops.reference.pooling_backward does. The max is recomputed from x (y is not read).
   A window holding a NaN passes no gradient: its max is NaN, which equals no x (the reference's x == max test).
   The thread of the last window row (column) also writes the 0s of the rows (columns) below (right of) every
   window when H (W) is not a multiple of the window: every dx element is written exactly once. */
template <typename T, int KH, int KW, bool NHWC>
__global__ void __launch_bounds__(DN_B) dn_maxpool_bwd(const T* __restrict__ x, const T* __restrict__ dy,
                                                       T* __restrict__ dx, int total, int C, int H, int W, int P,
                                                       int Q, int kh_, int kw_) {
    const unsigned int o = blockIdx.x * DN_B + threadIdx.x;
    if (o >= (unsigned int)total) return;
    const unsigned int kh = KH ? KH : kh_, kw = KW ? KW : kw_;
    unsigned int base, sh, sw, p, q;
    dn_window<NHWC>(o, C, H, W, P, Q, kh, kw, base, sh, sw, p, q);
    float m = 0.f;
    int hit = 0;
    bool nan = false;
#pragma unroll
    for (unsigned int i = 0; i < kh; ++i) {
#pragma unroll
        for (unsigned int j = 0; j < kw; ++j) {
            const float v = dn_ld(x[base + i * sh + j * sw]);
            const int k = (int)(i * kw + j);
            if (k == 0 || v > m) { m = v; hit = k; }
            nan |= v != v;
        }
    }
    if (nan) hit = -1;
    const T g = dy[o];  // routed as is: dx holds dy's exact bits
    const unsigned int ih = (p + 1 == (unsigned int)P) ? (unsigned int)H - p * kh : kh;
    const unsigned int jw = (q + 1 == (unsigned int)Q) ? (unsigned int)W - q * kw : kw;
    if (ih == kh && jw == kw) {  // the common case: no edge left over
#pragma unroll
        for (unsigned int i = 0; i < kh; ++i) {
#pragma unroll
            for (unsigned int j = 0; j < kw; ++j) dx[base + i * sh + j * sw] = (int)(i * kw + j) == hit ? g : (T)0;
        }
    } else {
        for (unsigned int i = 0; i < ih; ++i) {
            for (unsigned int j = 0; j < jw; ++j) {
                const bool tap = i < kh && j < kw && (int)(i * kw + j) == hit;
                dx[base + i * sh + j * sw] = tap ? g : (T)0;
            }
        }
    }
}
"""

CUDA_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "dn_half"}  # the templates' element type per dtype
DTYPES = tuple(CUDA_TYPES)  # what the kernels take; other dtypes keep the library paths
_WIDTHS = {np.dtype(np.float32): (4, 2, 1), np.dtype(np.float16): (8, 4, 2, 1)}  # 16, 8, 4... bytes per load
_LAYOUT_NAME = {"NCHW": "nchw", "NHWC": "nhwc"}
_POOL_WINDOWS = ((2, 2), (0, 0))  # compiled windows: 2x2, and any (runtime kh, kw)


def _bool(v: bool) -> str:
    return "true" if v else "false"


def chan_name(layout: str, dtype, width: int, relu: bool) -> str:
    return f"dn_chan_{_LAYOUT_NAME[layout]}<{CUDA_TYPES[np.dtype(dtype)]}, {width}, {_bool(relu)}>"


def final_name(dtype) -> str:
    return f"dn_chan_final<{CUDA_TYPES[np.dtype(dtype)]}>"


def pool_name(direction: str, dtype, window: tuple, layout: str) -> str:
    kh, kw = window if tuple(window) in _POOL_WINDOWS else (0, 0)
    return f"dn_maxpool_{direction}<{CUDA_TYPES[np.dtype(dtype)]}, {kh}, {kw}, {_bool(layout == 'NHWC')}>"


CHANNEL_NAMES = tuple(chan_name(lay, dt, v, relu) for lay in _LAYOUT_NAME for dt in DTYPES for v in _WIDTHS[dt]
                      for relu in (True, False)) + tuple(final_name(dt) for dt in DTYPES)
POOL_NAMES = tuple(pool_name(d, dt, win, lay) for d in ("fwd", "bwd") for dt in DTYPES for win in _POOL_WINDOWS
                   for lay in _LAYOUT_NAME)

_modules: dict = {}


def kernel(name: str):
    """The compiled kernel ``name`` (one of CHANNEL_NAMES or POOL_NAMES): one NVRTC compile of its family per
    process, then the disk cache."""
    family = "pool" if name.startswith("dn_maxpool") else "chan"
    mod = _modules.get(family)
    if mod is None:
        from ..kernels import Module
        src, names = (POOL_SOURCE, POOL_NAMES) if family == "pool" else (CHANNEL_SOURCE, CHANNEL_NAMES)
        mod = _modules[family] = Module(src, names)
    return mod.get_function(name)


# -- launch geometry (pure Python, tested on the CPU) -------------------------------------------------------------

def pack_width(dtype, extent: int, ptrs) -> int:
    """Elements per load: the widest of 16, 8, 4... bytes that divides ``extent`` (the contiguous run: H*W for
    NCHW, C for NHWC) and to which every pointer is aligned."""
    dtype = np.dtype(dtype)
    for v in _WIDTHS[dtype]:
        if extent % v == 0 and all(p % (v * dtype.itemsize) == 0 for p in ptrs):
            return v
    return 1


def block_slices(units: int, columns: int, per_block: int, least: int = MIN_PACKS) -> tuple[int, int]:
    """(chunk, S): each of ``columns`` block columns splits its ``units`` (packs or rows) into S slices of
    ``chunk``, S as large as TARGET_BLOCKS wants while a slice still gives every thread ``least`` units."""
    want = max(1, TARGET_BLOCKS // columns)
    most = max(1, units // (per_block * least))
    s = max(1, min(want, most, MAX_SPLITS, 65535))
    chunk = -(-units // s)
    return chunk, -(-units // chunk)  # no empty slice


def nchw_geometry(n: int, c: int, hw: int, width: int) -> tuple[tuple, tuple, int, int, int]:
    """(grid, block, hwv, chunk, S) of dn_chan_nchw: a channel's N*HW/width packs in S slices of chunk packs."""
    hwv = hw // width
    chunk, s = block_slices(n * hwv, c, BLOCK)
    return (c, s), (BLOCK, 1), hwv, chunk, s


def nhwc_geometry(rows: int, c: int, width: int) -> tuple[tuple, tuple, int, int]:
    """(grid, block, chunk, S) of dn_chan_nhwc: TX threads across the C/width channel packs (a power of two, at
    most 32), 256/TX down the rows; the rows in S slices of chunk."""
    cv = c // width
    tx = min(32, 1 << max(0, (cv - 1).bit_length()))
    ty = BLOCK // tx
    columns = -(-cv // tx)
    chunk, s = block_slices(rows, columns, ty)
    return (columns, s), (tx, ty), chunk, s


def final_grid(c: int) -> int:
    """Blocks of dn_chan_final: one warp per channel."""
    return -(-c * 32 // BLOCK)


def pool_grid(total: int) -> int:
    return -(-total // BLOCK)
