"""Layer 2 (ops): the CUDA source of the small-filter kernels of a fused conv + bias + ReLU, the weight gradient
(ops.bias_relu.bias_relu_wgrad) and the forward (ops.conv.conv_bias_relu_forward, dn_small_fwd), and their launch
geometry (pure Python).

For a filter of at most 32 taps T = C*R*S (a network's first layer: 1x3x3, 3x3x3, 1x5x5), dw and db in one pass
over x, y and dy: each thread walks its output positions, forms dz = y > 0 ? dy : 0 in registers (dz is never
written) and keeps T + 1 float sums (the taps, the bias) per channel in registers, for up to 4 channels at once
(KB, see dn_wgrad). cuDNN's backward-filter algorithms are built for many input channels: 24 us on SimpleCNN's
conv1, whose y and dy this reads once (13 MB, ~4 us of an H100's bandwidth).

Deterministic like ops._nn_kernels' channel sums: a fixed butterfly in each warp, the warps added in order into
one slot per (channel, tap, slice) of a scratch buffer, and a second small kernel that adds each channel's slices
in a fixed order; no atomics. Imports numpy and ctypes, ops._nn_kernels (the shared preamble, block size and
slicing) and ops.reference.conv (the tap limit); dnnbind.kernels on first use. Each (dtype, T, layout) is its own
template instance, compiled on first use (then the disk cache): a model asks for one or two.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ._nn_kernels import BLOCK, CUDA_TYPES, DTYPES, INT_LIMIT, PREAMBLE, TARGET_BLOCKS, block_slices
from .reference.conv import WGRAD_MAX_TAPS as MAX_TAPS

__all__ = ["BLOCK", "DTYPES", "INT_LIMIT", "MAX_TAPS", "TARGET_BLOCKS", "Geometry", "channels_per_thread", "final_grid",
           "final_name", "fwd_grid", "fwd_name", "geometry", "kernel", "launch_plan", "magic", "taps_table",
           "wgrad_name"]

MIN_POSITIONS = 4  # output positions per thread at least (the butterflies after the loop cost about 2 positions)
MAX_SUMS = 64  # NCHW: channels per thread KB = min(4, MAX_SUMS // (T + 1)), KB * (T + 1) sums in registers

SOURCE = PREAMBLE + r"""
#define DN_MAX_TAPS 32

/* m / d for m < 2**31 by a multiply: (umulhi(m, mul) + m) >> shr, mul and shr from the divisor (magic() below);
   a division by a runtime value is ~20 instructions, and each position needs two. */
__device__ __forceinline__ unsigned int dn_div(unsigned int m, unsigned int mul, unsigned int shr) {
    return (__umulhi(m, mul) + m) >> shr;
}

/* The convolution's sizes, the divisors of m -> (n, pq) and pq -> (p, q), and per tap t (w's memory order: (c, r,
   s) for NCHW, (r, s, c) for NHWC) the x offset from an output position's top-left input pixel and the tap's row
   and column offsets r*dh, s*dw (the bounds check). By value: kernel parameters are read from the constant bank,
   so the tables cost no registers and no loads through the caches. */
struct dn_wgrad_geom {
    int K, PQ, Q, H, W, CHW, XS, SH, SW, PH, PW, ROWS, CHUNK;
    unsigned int MUL_PQ, SHR_PQ, MUL_Q, SHR_Q;
    int off[DN_MAX_TAPS], dr[DN_MAX_TAPS], dc[DN_MAX_TAPS];
};

/* Block (TX, TY) and grid (ceil(K / (TX * KB)), S). Thread (tx, ty) of block (bx, s) takes the KB channels from
   k0 = (bx * TX + tx) * KB and the positions m = r0 + ty, r0 + ty + TY, ... of the slice [r0, r0 + CHUNK) of the
   N*P*Q output positions, m = (n * P + p) * Q + q. NCHW: TX = 1, the 256 threads across positions, and KB up to 4
   channels per thread: each x value read (and its bounds check and address, most of the instructions) serves KB
   channels. NHWC: KB = 1 and TX threads across channels, where dy's rows are contiguous; the lanes of one position
   read the same x (one broadcast load). x goes through the read-only cache: every block column reads all of it. */
template <typename T, int TAPS, int KB, bool NHWC>
__global__ void __launch_bounds__(DN_B) dn_wgrad(const T* __restrict__ x, const T* __restrict__ y,
                                                 const T* __restrict__ dy, float* __restrict__ part,
                                                 T* __restrict__ dw, T* __restrict__ db, const dn_wgrad_geom g) {
    constexpr int V = KB * (TAPS + 1);  // sums per thread: per channel, the taps then the bias
    const unsigned int TX = NHWC ? blockDim.x : 1u, TY = NHWC ? blockDim.y : (unsigned int)DN_B;
    const unsigned int tx = NHWC ? threadIdx.x : 0u, ty = NHWC ? threadIdx.y : threadIdx.x;
    const unsigned int K = g.K, PQ = g.PQ, Q = g.Q, k0 = (blockIdx.x * TX + tx) * KB;
    const unsigned int r0 = blockIdx.y * (unsigned int)g.CHUNK;
    const unsigned int r1 = min(r0 + (unsigned int)g.CHUNK, (unsigned int)g.ROWS);
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
    if (k0 < K) {
        for (unsigned int m = r0 + ty; m < r1; m += TY) {
            const unsigned int n = dn_div(m, g.MUL_PQ, g.SHR_PQ), pq = m - n * PQ;
            const unsigned int p = dn_div(pq, g.MUL_Q, g.SHR_Q), q = pq - p * Q;
            const unsigned int o = NHWC ? m * K + k0 : (n * K + k0) * PQ + pq;
            float dz[KB];
#pragma unroll
            for (int j = 0; j < KB; ++j) {  // channels past K (the last group, KB not dividing K) add nothing
                const unsigned int oj = o + j * (NHWC ? 1u : PQ);
                // a NaN y counts as not positive; dy where y <= 0 is dropped, not multiplied (bias_relu_backward)
                dz[j] = (k0 + j < K && dn_ld(y[oj]) > 0.f) ? dn_ld(dy[oj]) : 0.f;
            }
            const int ih = (int)(p * (unsigned int)g.SH) - g.PH, iw = (int)(q * (unsigned int)g.SW) - g.PW;
            const int base = (int)n * g.CHW + (ih * g.W + iw) * g.XS;  // may point before x: never read there
#pragma unroll
            for (int t = 0; t < TAPS; ++t) {
                const bool in = (unsigned int)(ih + g.dr[t]) < (unsigned int)g.H &&
                                (unsigned int)(iw + g.dc[t]) < (unsigned int)g.W;
                const float v = in ? dn_ld(__ldg(x + (base + g.off[t]))) : 0.f;  // padding reads as 0
#pragma unroll
                for (int j = 0; j < KB; ++j) acc[j * (TAPS + 1) + t] = fmaf(dz[j], v, acc[j * (TAPS + 1) + t]);
            }
#pragma unroll
            for (int j = 0; j < KB; ++j) acc[j * (TAPS + 1) + TAPS] += dz[j];
        }
    }
    /* The lanes of a warp with one tx (lane % TX == tx, TX a power of two) hold sums of the same channels: a fixed
       butterfly over the lane bits >= TX (NCHW: all five), then the eight warps' sums in order. */
#pragma unroll
    for (int i = 0; i < V; ++i) {
#pragma unroll
        for (int h = 16; h > 0; h >>= 1)
            if ((unsigned int)h >= TX) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], h);
    }
    __shared__ float ws[DN_B / 32][NHWC ? 32 : 1][V];
    const unsigned int tid = threadIdx.y * blockDim.x + threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (lane < TX) {
#pragma unroll
        for (int i = 0; i < V; ++i) ws[warp][lane][i] = acc[i];
    }
    __syncthreads();
    for (unsigned int i = tid; i < TX * V; i += DN_B) {  // i = (c * KB + j) * (TAPS + 1) + t
        const unsigned int c = i / V, u = i - c * V, j = u / (TAPS + 1), t = u - j * (TAPS + 1);
        const unsigned int kk = (blockIdx.x * TX + c) * KB + j;
        if (kk >= K) continue;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < DN_B / 32; ++w) s += ws[w][c][u];
        if (gridDim.y == 1) {  // one slice: the block has the whole sum
            if (t < TAPS) dw[kk * TAPS + t] = dn_st<T>(s);
            else db[kk] = dn_st<T>(s);
        } else {
            part[((size_t)kk * (TAPS + 1) + t) * gridDim.y + blockIdx.y] = s;
        }
    }
}

/* The forward of the same small-filter conv + bias + ReLU (NCHW, groups 1). Block (bx, by): 256 output positions
   m = (n, p, q) and the FWD_KC channels from by * FWD_KC, whose weights and biases it first copies to shared memory
   (every thread reads all of them). Each thread holds its position's TAPS input values in registers and writes
   y = relu(b[k] + sum_t w[k, t] x_t) for its channels (w's tap order). cuDNN's kernels for one input channel take
   9 us on SimpleCNN's conv1, whose 6.4 MB of y this writes once. A NaN propagates, as cuDNN's ReLU with
   CUDNN_PROPAGATE_NAN does. */
#define DN_FWD_KC 8
template <typename T, int TAPS>
__global__ void __launch_bounds__(DN_B) dn_small_fwd(const T* __restrict__ x, const T* __restrict__ w,
                                                     const T* __restrict__ b, T* __restrict__ y,
                                                     const dn_wgrad_geom g) {
    __shared__ float sw[DN_FWD_KC * (TAPS + 1)];
    const unsigned int K = g.K, PQ = g.PQ, Q = g.Q, k0 = blockIdx.y * DN_FWD_KC;
    const unsigned int kn = min((unsigned int)DN_FWD_KC, K - k0);
    for (unsigned int i = threadIdx.x; i < kn * TAPS; i += DN_B) sw[i] = dn_ld(w[k0 * TAPS + i]);
    if (threadIdx.x < kn) sw[DN_FWD_KC * TAPS + threadIdx.x] = dn_ld(b[k0 + threadIdx.x]);
    __syncthreads();
    const unsigned int m = blockIdx.x * (unsigned int)DN_B + threadIdx.x;
    if (m >= (unsigned int)g.ROWS) return;
    const unsigned int n = dn_div(m, g.MUL_PQ, g.SHR_PQ), pq = m - n * PQ;
    const unsigned int p = dn_div(pq, g.MUL_Q, g.SHR_Q), q = pq - p * Q;
    const int ih = (int)(p * (unsigned int)g.SH) - g.PH, iw = (int)(q * (unsigned int)g.SW) - g.PW;
    const int base = (int)n * g.CHW + (ih * g.W + iw) * g.XS;  // may point before x: never read there
    float v[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        const bool in = (unsigned int)(ih + g.dr[t]) < (unsigned int)g.H &&
                        (unsigned int)(iw + g.dc[t]) < (unsigned int)g.W;
        v[t] = in ? dn_ld(__ldg(x + (base + g.off[t]))) : 0.f;  // padding reads as 0
    }
    T* out = y + ((size_t)n * K + k0) * PQ + pq;
#pragma unroll
    for (int j = 0; j < DN_FWD_KC; ++j) {
        if ((unsigned int)j < kn) {
            float acc = sw[DN_FWD_KC * TAPS + j];
#pragma unroll
            for (int t = 0; t < TAPS; ++t) acc = fmaf(sw[j * TAPS + t], v[t], acc);
            out[(size_t)j * PQ] = dn_st<T>((acc > 0.f || acc != acc) ? acc : 0.f);
        }
    }
}

/* Output j = k * (taps + 1) + t (t == taps: the bias) = the sum of its S slots of part in a fixed order: one
   warp per output, lane l adds slots l, l + 32, ..., then a butterfly. */
template <typename T>
__global__ void __launch_bounds__(DN_B) dn_wgrad_final(const float* __restrict__ part, T* __restrict__ dw,
                                                       T* __restrict__ db, int K, int taps, int S) {
    const int j = (int)((blockIdx.x * DN_B + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (j >= K * (taps + 1)) return;  // whole warps leave together: the shuffles below see all 32 lanes
    float a = 0.f;
    for (int s = lane; s < S; s += 32) a += part[(size_t)j * S + s];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) a += __shfl_xor_sync(0xffffffffu, a, h);
    if (lane == 0) {
        const int k = j / (taps + 1), t = j - k * (taps + 1);
        if (t < taps) dw[k * taps + t] = dn_st<T>(a);
        else db[k] = dn_st<T>(a);
    }
}
"""

_LAYOUTS = ("NCHW", "NHWC")
_SIZES = ("K", "PQ", "Q", "H", "W", "CHW", "XS", "SH", "SW", "PH", "PW", "ROWS", "CHUNK")


class Geometry(ctypes.Structure):
    """dn_wgrad_geom, passed by value (a ctypes Structure goes to the launch as its bytes)."""
    _fields_ = [(name, ctypes.c_int) for name in _SIZES] + [
        (name, ctypes.c_uint) for name in ("MUL_PQ", "SHR_PQ", "MUL_Q", "SHR_Q")] + [
        (name, ctypes.c_int * MAX_TAPS) for name in ("off", "dr", "dc")]


def channels_per_thread(taps: int, layout: str) -> int:
    """KB: NCHW threads sum up to 4 channels (their x loads shared), as registers allow; NHWC threads one (its
    lanes already share x, and its shared memory would grow with KB)."""
    return 1 if layout == "NHWC" else max(1, min(4, MAX_SUMS // (taps + 1)))


def wgrad_name(dtype, taps: int, layout: str) -> str:
    kb, nhwc = channels_per_thread(taps, layout), "true" if layout == "NHWC" else "false"
    return f"dn_wgrad<{CUDA_TYPES[np.dtype(dtype)]}, {taps}, {kb}, {nhwc}>"


def final_name(dtype) -> str:
    return f"dn_wgrad_final<{CUDA_TYPES[np.dtype(dtype)]}>"


def fwd_name(dtype, taps: int) -> str:
    return f"dn_small_fwd<{CUDA_TYPES[np.dtype(dtype)]}, {taps}>"


FWD_KC = 8  # dn_small_fwd: channels per block (DN_FWD_KC)


def fwd_grid(rows: int, k: int) -> tuple[int, int]:
    """Blocks of dn_small_fwd: 256 output positions by FWD_KC channels each."""
    return -(-rows // BLOCK), -(-k // FWD_KC)


ALL_NAMES = tuple(wgrad_name(dt, t, lay) for dt in DTYPES for t in range(1, MAX_TAPS + 1) for lay in _LAYOUTS) + \
    tuple(final_name(dt) for dt in DTYPES) + tuple(fwd_name(dt, t) for dt in DTYPES for t in range(1, MAX_TAPS + 1))

_modules: dict = {}


def kernel(name: str):
    """The compiled kernel ``name`` (one of ALL_NAMES): each instance is its own NVRTC compile, on first use in a
    process (then the disk cache), so a model pays only for the tap counts it has."""
    mod = _modules.get(name)
    if mod is None:
        from ..kernels import Module
        mod = _modules[name] = Module(SOURCE, (name,))
    return mod.get_function(name)


# -- launch geometry (pure Python, tested on the CPU) -------------------------------------------------------------

def taps_table(c: int, h: int, w: int, r: int, s: int, dilation, layout: str) -> tuple[list, list, list]:
    """(off, dr, dc) per tap, in w's memory order: the x offset of tap (c, r, s) from an output position's top-left
    input pixel, and the tap's row and column offsets r*dh, s*dw."""
    off, dr, dc = [], [], []
    if layout == "NCHW":  # w (K, C, R, S); x pixels 1 apart, channels H*W apart
        order = [(ci, ri, si) for ci in range(c) for ri in range(r) for si in range(s)]
        for ci, ri, si in order:
            off.append(ci * h * w + ri * dilation[0] * w + si * dilation[1])
    else:  # w (K, R, S, C); x pixels C apart, channels 1 apart
        order = [(ci, ri, si) for ri in range(r) for si in range(s) for ci in range(c)]
        for ci, ri, si in order:
            off.append((ri * dilation[0] * w + si * dilation[1]) * c + ci)
    for _, ri, si in order:
        dr.append(ri * dilation[0])
        dc.append(si * dilation[1])
    return off, dr, dc


def geometry(layout: str, rows: int, k: int, taps: int) -> tuple[tuple, tuple, int, int]:
    """(grid, block, chunk, S) of dn_wgrad over ``rows`` = N*P*Q output positions and ``k`` output channels.
    NCHW: a block per KB channels and slice, 256 threads across positions. NHWC: TX threads across channels (a power
    of two, at most 32), 256/TX down the positions. S slices per block column, as many as TARGET_BLOCKS wants while
    each thread keeps MIN_POSITIONS positions (as ops._nn_kernels' channel sums do)."""
    if layout == "NCHW":
        columns = -(-k // channels_per_thread(taps, layout))
        chunk, s = block_slices(rows, columns, BLOCK, MIN_POSITIONS)
        return (columns, s), (BLOCK, 1), chunk, s
    tx = min(32, 1 << max(0, (k - 1).bit_length()))
    ty = BLOCK // tx
    columns = -(-k // tx)
    chunk, s = block_slices(rows, columns, ty, MIN_POSITIONS)
    return (columns, s), (tx, ty), chunk, s


def magic(d: int) -> tuple[int, int]:
    """(mul, shr) of dn_div: m // d == ((m * mul >> 32) + m) >> shr for 0 <= m < 2**31 (shr = ceil(log2 d), mul =
    ceil(2**(32 + shr) / d) - 2**32, which fits 32 bits; d = 1 gives (0, 0))."""
    shr = (d - 1).bit_length()
    return -(-(1 << (32 + shr)) // d) - (1 << 32), shr


def final_grid(k: int, taps: int) -> int:
    """Blocks of dn_wgrad_final: one warp per (channel, tap or bias)."""
    return -(-k * (taps + 1) * 32 // BLOCK)


@functools.lru_cache(maxsize=256)
def launch_plan(x_nchw: tuple, w_nchw: tuple, y_nchw: tuple, stride: tuple, padding: tuple, dilation: tuple,
                layout: str) -> tuple[Geometry, tuple, tuple, int]:
    """(the Geometry argument, grid, block, S) for validated shapes given as NCHW tuples (the argument is shared
    by every launch of this shape: read-only)."""
    n, c, h, w = x_nchw
    k, _, r, s = w_nchw
    _, _, p, q = y_nchw
    grid, block, chunk, slices = geometry(layout, n * p * q, k, c * r * s)
    off, dr, dc = taps_table(c, h, w, r, s, dilation, layout)
    sizes = dict(K=k, PQ=p * q, Q=q, H=h, W=w, CHW=c * h * w, XS=1 if layout == "NCHW" else c, SH=stride[0],
                 SW=stride[1], PH=padding[0], PW=padding[1], ROWS=n * p * q, CHUNK=chunk)
    (sizes["MUL_PQ"], sizes["SHR_PQ"]), (sizes["MUL_Q"], sizes["SHR_Q"]) = magic(p * q), magic(q)
    geom = Geometry(**sizes)
    geom.off[:len(off)], geom.dr[:len(dr)], geom.dc[:len(dc)] = off, dr, dc
    return geom, grid, block, slices
