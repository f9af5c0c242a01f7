"""MXNet's deformable convolutions over (N, C, H, W) data: ``_contrib_DeformableConvolution`` (DCN v1,
``nd.contrib.DeformableConvolution``: data, offset, weight, bias) and ``_contrib_ModulatedDeformableConvolution``
(DCN v2, ``nd.contrib.ModulatedDeformableConvolution``: data, offset, mask, weight, bias). Gradients go to every
input, as MXNet's.

The offset has 2 * kh * kw channels per deformable group (``num_deformable_group`` consecutive channel groups of the
data), the pair (2k, 2k + 1) moving tap k = i * kw + j by (y, x); the mask (v2) has kh * kw channels per group. Each
tap's point is read by bilinear interpolation with the version's boundary rule (ops/reference/deformable_conv.py
says which), then the columns meet the weight as a grouped convolution (``num_group``), plus the bias. MXNet 1.9.1's
parameters, with its checks (2-D kernels only, layout NCHW, channels divisible by both groups, v2: num_filter
divisible by num_deformable_group and a batch no larger than ``im2col_step`` or a multiple of it). ``workspace`` (MB)
bounds the column buffer of a batch chunk; ``im2col_step`` the chunk (v1 takes 64).

cpu: the numpy twin. gpu: per chunk of the batch, an NVRTC kernel fills the columns (C * kh * kw, chunk * Ho * Wo)
and one strided-batched cuBLAS gemm per direction multiplies them with the weight, group by group (a batch over the
groups); a kernel moves the (F, chunk, L) product into the output (N, F, L) with the bias. The backward takes the
column gradient by the transposed gemm, scatters it into the data gradient (atomicAdd, so sums run in an unspecified
order), has one thread per (sample, deformable group, tap, pixel) sum the offset's (and the mask's) gradient over
the group's channels, and rebuilds the columns for the weight gradient's gemm (beta 1 across chunks), as MXNet does.
float16 runs as float32 (cast in, cast out), as the kernels have no half atomics.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..._lib import cublas
from ..._lib.errors import CublasError, DnnbindTypeError, DnnbindValueError
from ...runtime.array import empty, zeros
from ...runtime.stream import current_stream
from .. import descriptors as D
from .._common import blas, with_context
from ..args import bias_matches, check_fits, spatial
from ..blas import ones_vector, row_sums_into
from ..opdef import Lowering, OpDef, define, table
from ..reference import deformable_conv as ref

V1, V2 = "_contrib_DeformableConvolution", "_contrib_ModulatedDeformableConvolution"
_INT_LIMIT = 2**31
_V1_STEP = 64  # samples per chunk for v1 (MXNet's runs one at a time; v2 takes im2col_step)

SOURCE = r"""
/* T is float or double. The four corners of a sampling point (py, px) under the version's boundary rule, as
   ops/reference/deformable_conv.py taps(): flat indices into H * W (-1: not read), the bilinear weights and the
   weights of d(sample)/dy and d(sample)/dx. Returns whether the point is read at all. */
template <typename T>
__device__ __forceinline__ bool dn_dcn_corners(T py, T px, int h, int w, int modulated, int* idx, T* wt, T* gy,
                                               T* gx) {
    bool inside = modulated ? (py > (T)-1 && px > (T)-1 && py < (T)h && px < (T)w)
                            : (py >= (T)0 && px >= (T)0 && py < (T)h && px < (T)w);
    for (int q = 0; q < 4; ++q) { idx[q] = -1; wt[q] = gy[q] = gx[q] = (T)0; }
    if (!inside) return false;
    int y0 = (int)floor(py), x0 = (int)floor(px), y1, x1;
    T ly, lx;
    bool oy0 = true, oy1 = true, ox0 = true, ox1 = true;
    if (modulated) {  /* corners outside the data are zeros */
        y1 = y0 + 1; x1 = x0 + 1;
        ly = py - (T)y0; lx = px - (T)x0;
        oy0 = y0 >= 0; oy1 = y1 <= h - 1; ox0 = x0 >= 0; ox1 = x1 <= w - 1;
    } else {          /* the last row (column) is read alone: both corners there, fraction 0 */
        if (y0 >= h - 1) { y1 = y0; ly = (T)0; } else { y1 = y0 + 1; ly = py - (T)y0; }
        if (x0 >= w - 1) { x1 = x0; lx = (T)0; } else { x1 = x0 + 1; lx = px - (T)x0; }
    }
    T hy = (T)1 - ly, hx = (T)1 - lx;
    if (oy0 && ox0) { idx[0] = y0 * w + x0; wt[0] = hy * hx; gy[0] = -hx; gx[0] = -hy; }
    if (oy0 && ox1) { idx[1] = y0 * w + x1; wt[1] = hy * lx; gy[1] = -lx; gx[1] = hy; }
    if (oy1 && ox0) { idx[2] = y1 * w + x0; wt[2] = ly * hx; gy[2] = hx; gx[2] = -ly; }
    if (oy1 && ox1) { idx[3] = y1 * w + x1; wt[3] = ly * lx; gy[3] = lx; gx[3] = ly; }
    return true;
}

/* The point of tap k at output pixel l of sample n, deformable group g: the integer grid position plus the offset
   (one rounding, as MXNet adds the offset to the integer position; no product is involved). */
template <typename T>
__device__ __forceinline__ void dn_dcn_point(const T* off, int n, int g, int k, int l, int dg, int kh, int kw,
                                             int ho, int wo, int ph, int pw, int sh, int sw, int dh, int dw, T* py,
                                             T* px) {
    long long lsz = (long long)ho * wo;
    const T* o = off + ((long long)n * dg + g) * 2 * kh * kw * lsz;
    int oy = l / wo, ox = l % wo, i = k / kw, j = k % kw;
    *py = (T)(oy * sh - ph + i * dh) + o[(2 * k) * lsz + l];
    *px = (T)(ox * sw - pw + j * dw) + o[(2 * k + 1) * lsz + l];
}

template <typename T>
__device__ __forceinline__ T dn_dcn_dot(const T* src, const int* idx, const T* wt) {
    T v = (T)0;
    for (int q = 0; q < 4; ++q) if (idx[q] >= 0) v += wt[q] * src[idx[q]];
    return v;
}

/* Columns for samples [n0, n0 + nb): col[(c * K + k), b, l], one thread per (c, b, l). */
template <typename T>
__global__ void dn_dcn_im2col(const T* x, const T* off, const T* mask, T* col, long long total, int n0, int nb,
                              int c, int h, int w, int kh, int kw, int ph, int pw, int sh, int sw, int dh, int dw,
                              int dg, int ho, int wo, int modulated) {
    long long lsz = (long long)ho * wo;
    int kk = kh * kw, cpg = c / dg;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int l = (int)(i % lsz), b = (int)((i / lsz) % nb), ch = (int)(i / lsz / nb), n = n0 + b, g = ch / cpg;
        const T* src = x + ((long long)n * c + ch) * h * w;
        const T* m = mask ? mask + ((long long)n * dg + g) * kk * lsz : 0;
        for (int k = 0; k < kk; ++k) {
            T py, px, wt[4], gy[4], gx[4];
            int idx[4];
            dn_dcn_point(off, n, g, k, l, dg, kh, kw, ho, wo, ph, pw, sh, sw, dh, dw, &py, &px);
            dn_dcn_corners(py, px, h, w, modulated, idx, wt, gy, gx);
            T v = dn_dcn_dot(src, idx, wt);
            if (m) v *= m[k * lsz + l];
            col[((long long)(ch * kk + k) * nb + b) * lsz + l] = v;
        }
    }
}

/* The data gradient: each column gradient (times its mask) to its point's corners, one thread per column entry. */
template <typename T>
__global__ void dn_dcn_col2im(const T* dcol, const T* off, const T* mask, T* dx, long long total, int n0, int nb,
                              int c, int h, int w, int kh, int kw, int ph, int pw, int sh, int sw, int dh, int dw,
                              int dg, int ho, int wo, int modulated) {
    long long lsz = (long long)ho * wo;
    int kk = kh * kw, cpg = c / dg;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int l = (int)(i % lsz), b = (int)((i / lsz) % nb), row = (int)(i / lsz / nb), n = n0 + b;
        int ch = row / kk, k = row % kk, g = ch / cpg;
        T py, px, wt[4], gy[4], gx[4];
        int idx[4];
        dn_dcn_point(off, n, g, k, l, dg, kh, kw, ho, wo, ph, pw, sh, sw, dh, dw, &py, &px);
        if (!dn_dcn_corners(py, px, h, w, modulated, idx, wt, gy, gx)) continue;
        T top = dcol[i];
        if (mask) top *= mask[((long long)n * dg + g) * kk * lsz + k * lsz + l];
        T* dst = dx + ((long long)n * c + ch) * h * w;
        for (int q = 0; q < 4; ++q) if (idx[q] >= 0) atomicAdd(dst + idx[q], wt[q] * top);
    }
}

/* The offset's (and the mask's) gradient: one thread per (b, g, k, l) sums over the group's channels the column
   gradient times the slope of the bilinear surface (the sample itself, for the mask). */
template <typename T>
__global__ void dn_dcn_coord(const T* dcol, const T* x, const T* off, const T* mask, T* doff, T* dmask,
                             long long total, int n0, int nb, int c, int h, int w, int kh, int kw, int ph, int pw,
                             int sh, int sw, int dh, int dw, int dg, int ho, int wo, int modulated) {
    long long lsz = (long long)ho * wo;
    int kk = kh * kw, cpg = c / dg;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int l = (int)(i % lsz), k = (int)((i / lsz) % kk), g = (int)((i / lsz / kk) % dg);
        int b = (int)(i / lsz / kk / dg), n = n0 + b;
        T py, px, wt[4], gy[4], gx[4];
        int idx[4];
        dn_dcn_point(off, n, g, k, l, dg, kh, kw, ho, wo, ph, pw, sh, sw, dh, dw, &py, &px);
        T sy = (T)0, sx = (T)0, sm = (T)0;
        if (dn_dcn_corners(py, px, h, w, modulated, idx, wt, gy, gx)) {
            for (int cc = 0; cc < cpg; ++cc) {
                int ch = g * cpg + cc;
                const T* src = x + ((long long)n * c + ch) * h * w;
                T d = dcol[((long long)(ch * kk + k) * nb + b) * lsz + l];
                sy += d * dn_dcn_dot(src, idx, gy);
                sx += d * dn_dcn_dot(src, idx, gx);
                sm += d * dn_dcn_dot(src, idx, wt);
            }
        }
        long long base = ((long long)n * dg + g) * kk;
        T mk = mask ? mask[(base + k) * lsz + l] : (T)1;
        doff[((base + k) * 2) * lsz + l] = sy * mk;
        doff[((base + k) * 2 + 1) * lsz + l] = sx * mk;
        if (dmask) dmask[(base + k) * lsz + l] = sm;
    }
}

/* dst (Q, P, L) = src (P, Q, L) with axes 0 and 1 swapped, plus bias[p] where given. */
template <typename T>
__global__ void dn_dcn_swap(const T* src, T* dst, const T* bias, long long total, int p, int q, long long lsz) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long l = i % lsz;
        int a = (int)((i / lsz) % p), b = (int)(i / lsz / p);   /* dst index (b, a, l) */
        T v = src[((long long)a * q + b) * lsz + l];
        dst[i] = bias ? v + bias[a] : v;
    }
}
"""

_KERNELS = ("dn_dcn_im2col", "dn_dcn_col2im", "dn_dcn_coord", "dn_dcn_swap")
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
NAMES = tuple(f"{k}<{t}>" for k in _KERNELS for t in _CTYPE.values())
_module: dict = {}
_GEMM_BATCHED = {np.dtype(np.float32): "cublasSgemmStridedBatched",
                 np.dtype(np.float64): "cublasDgemmStridedBatched"}


def _kernel(name: str, dtype):
    """The compiled kernel ``name`` for float32 or float64 (one NVRTC compile of the family per process, then the
    disk cache)."""
    mod = _module.get("m")
    if mod is None:
        from ...kernels import Module
        mod = _module["m"] = Module(SOURCE, NAMES)
    return mod.get_function(f"{name}<{_CTYPE[np.dtype(dtype)]}>")


def _launch(name: str, total: int, args: tuple, like) -> None:
    if total:
        grid = max(1, min(-(-total // 256), 4096))
        _kernel(name, like.dtype).launch(grid, 256, args, stream=current_stream(like.device))


# checks ----------------------------------------------------------------------------------------------------------

class Geometry:
    """A checked call: ``g`` (the twin's ops.reference.deformable_conv.Geometry), the output's shape, and the chunk
    of the batch the GPU lowering runs at once."""
    __slots__ = ("g", "out_shape", "chunk")

    def __init__(self, g: ref.Geometry, out_shape: tuple, chunk: int):
        self.g, self.out_shape, self.chunk = g, out_shape, chunk


def _positive(op: str, p, name: str) -> int:
    if p[name] < 1:  # MXNet's set_lower_bound(1); a 0 group count divides by zero there
        raise DnnbindValueError(f"value {p[name]} for Parameter {name} should be greater equal to 1, in operator "
                                f"{op}")
    return int(p[name])


def _params(op: str, p, data_shape: tuple) -> tuple:
    """(kernel, stride, dilate, pad, F, G, dg): the parsed parameters checked against 4-D data."""
    kernel = tuple(p["kernel"] or ())
    if len(kernel) != 2:  # MXNet's Init: LOG(FATAL) "not implemented" for 1-D and 3-D kernels
        raise DnnbindValueError(f"{op}: kernel must be 2-D (kh, kw); 1-D and 3-D deformable convolution are not "
                                f"implemented (MXNet neither), got kernel {kernel or p['kernel']!r} (data "
                                f"{data_shape})")
    if min(kernel) < 1:
        raise DnnbindValueError(f"{op}: kernel must be >= 1 on every axis, got {kernel} (data {data_shape})")
    if p["layout"] not in (None, "NCHW"):
        raise DnnbindValueError(f"{op}: layout must be 'NCHW' for a 2-D kernel (data {data_shape}), got "
                                f"{p['layout']!r}")
    stride = spatial(op, "stride", p["stride"], 2, 1, 1, data_shape)
    dilate = spatial(op, "dilate", p["dilate"], 2, 1, 1, data_shape)
    pad = spatial(op, "pad", p["pad"], 2, 0, 0, data_shape)
    f = _positive(op, p, "num_filter")
    groups = _positive(op, p, "num_group")
    dg = _positive(op, p, "num_deformable_group")
    return kernel, stride, dilate, pad, f, groups, dg


def _out_hw(op: str, data_shape: tuple, kernel, stride, dilate, pad) -> tuple:
    h, w = data_shape[2:]
    padded = (h + 2 * pad[0], w + 2 * pad[1])
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilate, kernel))
    if any(e > s for e, s in zip(span, padded)):
        raise DnnbindValueError(f"{op}: kernel {kernel} with dilate {dilate} spans {span}, more than the padded input "
                                f"{padded} (data {data_shape}, pad {pad})")
    return tuple((s - e) // st + 1 for s, e, st in zip(padded, span, stride))


def _expected(p, data_shape: tuple, modulated: bool) -> dict:
    """The shape every input must have, from the data's shape and the parameters (MXNet's InferShape)."""
    op = V2 if modulated else V1
    kernel, stride, dilate, pad, f, groups, dg = _params(op, p, data_shape)
    n, c = data_shape[:2]
    ho, wo = _out_hw(op, data_shape, kernel, stride, dilate, pad)
    kk = kernel[0] * kernel[1]
    shapes = {"data": data_shape, "offset": (n, 2 * dg * kk, ho, wo)}
    if modulated:
        shapes["mask"] = (n, dg * kk, ho, wo)
    shapes["weight"] = (f, c // groups) + kernel
    shapes["bias"] = (f,)
    shapes["output"] = (n, f, ho, wo)
    return shapes


def _prepare_for(modulated: bool):
    op = V2 if modulated else V1
    names = ("data", "offset", "mask", "weight", "bias") if modulated else ("data", "offset", "weight", "bias")

    def prepare(p, *arrays):
        given = dict(zip(names, arrays))
        data = given["data"]
        if len(tuple(p["kernel"] or ())) != 2:  # MXNet refuses this first, at parsing
            _params(op, p, tuple(data.shape))
        shapes = ", ".join(f"{k} {tuple(a.shape)}" for k, a in given.items() if a is not None)
        context = f" ({shapes})"
        for k, a in given.items():
            if a is not None and k not in ("weight", "bias") and a.ndim != 4:
                raise DnnbindValueError(f"{op}: {k} must be 4-D (N, C, H, W), got shape {tuple(a.shape)}{context}")
        if data.dtype.kind != "f":
            raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype}{context}")
        for k, a in given.items():
            if a is not None and a.dtype != data.dtype:  # MXNet's UNIFORM_TYPE_CHECK
                raise DnnbindTypeError(f"{op}: {k} is {a.dtype} but data is {data.dtype}; every input must share "
                                       f"one dtype{context}")
        kernel, stride, dilate, pad, f, groups, dg = _params(op, p, tuple(data.shape))
        n, c = data.shape[:2]
        if c % groups:
            raise DnnbindValueError(f"{op}: input num_filter must divide group size: data has {c} channels, "
                                    f"num_group {groups}{context}")
        if c % dg:
            raise DnnbindValueError(f"{op}: input num_filter must divide deformable group size: data has {c} "
                                    f"channels, num_deformable_group {dg}{context}")
        if f % groups:
            raise DnnbindValueError(f"{op}: output num_filter must divide group size: num_filter {f}, num_group "
                                    f"{groups}{context}")
        step = _V1_STEP
        if modulated:
            step = _positive(op, p, "im2col_step")
            if f % dg:  # MXNet's check, though nothing in the computation needs it
                raise DnnbindValueError(f"{op}: output num_filter must divide deformable group size: num_filter {f}, "
                                        f"num_deformable_group {dg}{context}")
            if n > step and n % step:
                raise DnnbindValueError(f"{op}: input batchsize must be smaller than or divide im2col_step: batch {n}, "
                                        f"im2col_step {step}{context}")
        bias_matches(op, given["bias"], p["no_bias"], f)
        want = _expected(p, tuple(data.shape), modulated)
        for k, a in given.items():
            if a is not None and tuple(a.shape) != want[k]:
                raise DnnbindValueError(f"{op}: {k} has shape {tuple(a.shape)} but data {tuple(data.shape)} with "
                                        f"kernel {kernel}, stride {stride}, pad {pad}, dilate {dilate}, num_filter "
                                        f"{f}, num_group {groups}, num_deformable_group {dg} needs {want[k]}")
        out_shape = want["output"]
        ho, wo = out_shape[2:]
        check_fits(op, data.device, data.dtype, "the output", out_shape, context, cudnn=False)
        # the GPU's chunk: at most im2col_step samples, and columns within ``workspace`` MB (at least one sample)
        per_sample = c * kernel[0] * kernel[1] * ho * wo
        isz = max(np.dtype(data.dtype).itemsize, 4)
        chunk = max(1, min(n, step, (int(p["workspace"]) << 20) // max(per_sample * isz, 1))) if n else 1
        for what, count in (("a chunk's columns", per_sample * chunk), ("the output", math.prod(out_shape)),
                            ("the data", math.prod(data.shape)), ("the offset", math.prod(want["offset"]))):
            if count >= _INT_LIMIT:
                raise DnnbindValueError(f"{op}: {what} would have {count} elements; the kernels index planes with "
                                        f"32-bit integers (below 2**31){context}")
        check_fits(op, data.device, data.dtype, "the column buffer", (c * kernel[0] * kernel[1], chunk * ho * wo),
                   context, cudnn=False)
        g = ref.Geometry(tuple(data.shape), (ho, wo), kernel, stride, pad, dilate, groups, dg, f, modulated)
        return Geometry(g, out_shape, chunk)
    return prepare


def _infer_for(modulated: bool):
    def infer(p, shapes):
        want = _expected(p, tuple(shapes[0]), modulated)
        names = ("data", "offset", "mask", "weight", "bias") if modulated else ("data", "offset", "weight", "bias")
        return [want[k] for k in names], [want["output"]]
    return infer


# cpu: the numpy twin -------------------------------------------------------------------------------------------------

def _v1_cpu_forward(c, x, offset, weight, bias):
    return ref.forward(c.geo.g, x, offset, None, weight, bias)


def _v1_cpu_backward(c, saved, grads, dy):
    return ref.backward(c.geo.g, saved, dy, grads.needs)


def _v2_cpu_forward(c, x, offset, mask, weight, bias):
    return ref.forward(c.geo.g, x, offset, mask, weight, bias)


def _v2_cpu_backward(c, saved, grads, dy):
    return ref.backward(c.geo.g, saved, dy, grads.needs)


# gpu: the kernels and cuBLAS -----------------------------------------------------------------------------------------

def _wide(a):
    """float16 runs as float32 (the kernels take float and double)."""
    if a is None:
        return None
    return table("cast", a, dtype="float32") if a.dtype == np.float16 else a


def _narrow(a, dtype):
    if a is None:
        return None
    return table("cast", a, dtype="float16") if np.dtype(dtype) == np.float16 else a


def _geometry_args(g: ref.Geometry) -> tuple:
    c, h, w = g.data_shape[1:]
    (kh, kw), (ph, pw), (sh, sw), (dh, dw), (ho, wo) = g.kernel, g.pad, g.stride, g.dilate, g.out_hw
    return c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, g.deformable_groups, ho, wo, int(g.modulated)


def _gemm_groups(like, a_ptr, b_ptr, c_ptr, m, n, k, trans_a, trans_b, beta, groups, stride_a, stride_b,
                 stride_c) -> None:
    """Row-major C_g[m, n] = op(A_g) op(B_g) + beta C_g for every group g, one cublas<t>gemmStridedBatched call.
    NOTE: cuBLAS is column-major: C^T = op(B)^T op(A)^T, the operands swap places and keep their flags
    (ops/blas.py)."""
    dtype = np.dtype(like.dtype)
    lda, ldb = (m if trans_a else k), (k if trans_b else n)
    try:
        getattr(cublas.lib, _GEMM_BATCHED[dtype])(
            blas(like), int(trans_b), int(trans_a), n, m, k, D.scalar_ptr(1.0, dtype), b_ptr, ldb, stride_b, a_ptr,
            lda, stride_a, D.scalar_ptr(beta, dtype), c_ptr, n, stride_c, groups)
    except CublasError as exc:
        raise with_context(exc, op="deformable convolution gemm", m=m, n=n, k=k, groups=groups) from None


def _at(a, nbytes: int) -> ctypes.c_void_p:
    """A pointer ``nbytes`` into ``a``'s memory, as a kernel argument (a Python int would go as an int32)."""
    return ctypes.c_void_p(a.ptr + nbytes)


def _chunks(geo: Geometry):
    n = geo.g.data_shape[0]
    for n0 in range(0, n, geo.chunk):
        yield n0, min(geo.chunk, n - n0)


def _im2col(g: ref.Geometry, xw, ow, mw, col, n0: int, nb: int) -> None:
    c = g.data_shape[1]
    lsz = g.out_hw[0] * g.out_hw[1]
    total = c * nb * lsz
    _launch("dn_dcn_im2col", total, (xw, ow, mw, col, np.int64(total), n0, nb, *_geometry_args(g)), xw)


def _gpu_forward(c, x, offset, mask, weight, bias):
    geo = c.geo
    g = geo.g
    xw, ow, mw, ww, bw = (_wide(a) for a in (x, offset, mask, weight, bias))
    n, ch = g.data_shape[:2]
    kk = g.kernel[0] * g.kernel[1]
    lsz = g.out_hw[0] * g.out_hw[1]
    f, groups = g.num_filter, g.groups
    m, kd = f // groups, ch // groups * kk
    dtype = xw.dtype
    y = empty(geo.out_shape, dtype, x.device)
    if n and lsz:
        col = empty((ch * kk, geo.chunk * lsz), dtype, x.device)
        tmp = empty((f, geo.chunk * lsz), dtype, x.device)
        isz = np.dtype(dtype).itemsize
        for n0, nb in _chunks(geo):
            _im2col(g, xw, ow, mw, col, n0, nb)
            _gemm_groups(xw, ww.ptr, col.ptr, tmp.ptr, m, nb * lsz, kd, False, False, 0.0, groups, m * kd,
                         kd * nb * lsz, m * nb * lsz)
            total = nb * f * lsz
            _launch("dn_dcn_swap", total, (tmp, _at(y, n0 * f * lsz * isz), bw, np.int64(total), f, nb,
                                           np.int64(lsz)), xw)
    return _narrow(y, x.dtype), (xw, ow, mw, ww, bias is not None)


def _gpu_backward(c, saved, grads, dy):
    geo = c.geo
    g = geo.g
    xw, ow, mw, ww, has_bias = saved
    needs = dict(zip(("data", "offset", "mask", "weight", "bias") if g.modulated else
                     ("data", "offset", "weight", "bias"), grads.needs))
    need_bias = has_bias and bool(needs.get("bias"))
    dyw = _wide(dy)
    dtype, dev = dyw.dtype, dy.device
    n, ch = g.data_shape[:2]
    kk = g.kernel[0] * g.kernel[1]
    lsz = g.out_hw[0] * g.out_hw[1]
    f, groups = g.num_filter, g.groups
    m, kd = f // groups, ch // groups * kk
    isz = np.dtype(dtype).itemsize
    dx = zeros(g.data_shape, dtype, dev) if needs["data"] else None
    doff = zeros(ow.shape, dtype, dev) if needs["offset"] or needs.get("mask") else None
    dmask = zeros(mw.shape, dtype, dev) if g.modulated and needs["mask"] else None
    dw = zeros(ww.shape, dtype, dev) if needs["weight"] else None
    db = zeros((f,), dtype, dev) if need_bias else None
    if n and lsz:
        dyt = empty((f, geo.chunk * lsz), dtype, dev)
        col = empty((ch * kk, geo.chunk * lsz), dtype, dev) if needs["weight"] or dx is not None or \
            doff is not None else None
        ones = ones_vector(dev, geo.chunk * lsz, dtype) if need_bias else None
        args = _geometry_args(g)
        for i, (n0, nb) in enumerate(_chunks(geo)):
            total = nb * f * lsz
            _launch("dn_dcn_swap", total, (_at(dyw, n0 * f * lsz * isz), dyt, None, np.int64(total), nb, f,
                                           np.int64(lsz)), dyw)
            beta = 0.0 if i == 0 else 1.0
            if dx is not None or doff is not None:
                # the column gradient W_g^T dy_g, into the column buffer (rebuilt below for the weight)
                _gemm_groups(dyw, ww.ptr, dyt.ptr, col.ptr, kd, nb * lsz, m, True, False, 0.0, groups, m * kd,
                             m * nb * lsz, kd * nb * lsz)
                if doff is not None:
                    t = nb * g.deformable_groups * kk * lsz
                    _launch("dn_dcn_coord", t, (col, xw, ow, mw, doff, dmask, np.int64(t), n0, nb, *args), dyw)
                if dx is not None:
                    t = ch * kk * nb * lsz
                    _launch("dn_dcn_col2im", t, (col, ow, mw, dx, np.int64(t), n0, nb, *args), dyw)
            if dw is not None:
                _im2col(g, xw, ow, mw, col, n0, nb)
                _gemm_groups(dyw, dyt.ptr, col.ptr, dw.ptr, m, kd, nb * lsz, False, True, beta, groups,
                             m * nb * lsz, kd * nb * lsz, m * kd)
            if db is not None:
                row_sums_into(blas(dyw), dyt.ptr, ones.ptr, db.ptr, f, nb * lsz, 1.0, beta, dtype)
    out = {"data": dx, "offset": doff if needs["offset"] else None, "mask": dmask if needs.get("mask") else None,
           "weight": dw, "bias": db}
    return tuple(_narrow(out[k], dy.dtype) for k in needs)


def _v1_gpu_forward(c, x, offset, weight, bias):
    return _gpu_forward(c, x, offset, None, weight, bias)


def _v2_gpu_forward(c, x, offset, mask, weight, bias):
    return _gpu_forward(c, x, offset, mask, weight, bias)


# samples: offsets that carry points off every border, groups, stride, dilation, no bias -----------------------------

def _sample(rng, shape, p, spread, modulated):
    n, c, h, w = shape
    kh, kw = p["kernel"]
    f, groups, dg = p["num_filter"], p.get("num_group", 1), p.get("num_deformable_group", 1)
    s, d, q = p.get("stride", (1, 1)), p.get("dilate", (1, 1)), p.get("pad", (0, 0))
    ho = (h + 2 * q[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (w + 2 * q[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    arrays = {"data": rng.standard_normal(shape),
              "offset": rng.uniform(-spread, spread, (n, 2 * dg * kh * kw, ho, wo))}
    if modulated:
        arrays["mask"] = rng.uniform(0.2, 1.8, (n, dg * kh * kw, ho, wo))
    arrays["weight"] = rng.standard_normal((f, c // groups, kh, kw))
    if not p.get("no_bias"):
        arrays["bias"] = rng.standard_normal(f)
    return arrays, p


def _samples_for(modulated: bool):
    def samples(rng):
        yield _sample(rng, (2, 2, 4, 5), {"kernel": (3, 3), "num_filter": 3, "pad": (1, 1)}, 2.5, modulated)
        yield _sample(rng, (1, 4, 6, 5), {"kernel": (2, 3), "num_filter": 2, "stride": (2, 1), "dilate": (2, 1),
                                          "pad": (1, 1), "num_group": 2, "num_deformable_group": 2, "no_bias": True},
                      2.0, modulated)
    return samples


_OPTIONAL = {"bias": lambda p: not p["no_bias"]}

define(OpDef(V1, prepare=_prepare_for(False), infer=_infer_for(False), samples=_samples_for(False),
             cpu=Lowering(_v1_cpu_forward, _v1_cpu_backward), gpu=Lowering(_v1_gpu_forward, _gpu_backward),
             optional=_OPTIONAL,
             doc="Deformable convolution (DCN v1; MXNet's contrib DeformableConvolution): each tap reads the data at "
                 "its offset point by bilinear interpolation."))
define(OpDef(V2, prepare=_prepare_for(True), infer=_infer_for(True), samples=_samples_for(True),
             cpu=Lowering(_v2_cpu_forward, _v2_cpu_backward), gpu=Lowering(_v2_gpu_forward, _gpu_backward),
             optional=_OPTIONAL,
             doc="Modulated deformable convolution (DCN v2; MXNet's contrib ModulatedDeformableConvolution): each "
                 "tap's bilinear sample at its offset point, times its mask."))
