"""MXNet's region pooling over (N, C, H, W) features and (R, 5) regions ``[batch_index, x1, y1, x2, y2]`` in image
coordinates (scaled by ``spatial_scale``): ``_contrib_ROIAlign`` (``nd.contrib.ROIAlign``), ``ROIPooling`` and
``_contrib_PSROIPooling`` (``nd.contrib.PSROIPooling``). The gradient goes to the data; the regions take none.

- ROIAlign: each of the ``pooled_size`` (PH, PW) bins averages a grid of bilinear samples (``sample_ratio`` per side,
  or ceil(region side / bins) when <= 0); ``position_sensitive`` reads channel (c * PH + ph) * PW + pw for output
  channel c (C / (PH * PW) outputs); ``aligned`` shifts the pixel model by half a pixel (Detectron2) and then needs
  regions of positive size, else a region is at least 1 x 1.
- ROIPooling: the region rounded to whole pixels (half away from zero), bins floor/ceil of (region side / bins), the
  maximum of each bin (the first of equal maxima in row-major order; an empty bin gives 0); the backward sends each
  output's gradient to its argmax. MXNet's node has a hidden second output (maxidx).
- PSROIPooling (R-FCN): ``pooled_size`` P square bins, each the average of channel (ctop * G + gh) * G + gw of the
  data, (gh, gw) the bin's group of ``group_size`` G (0: G = P); ``output_dim`` outputs per region; the data needs at
  least output_dim * G * G channels (MXNet reads past the data otherwise; refused here).

A region whose batch index (truncated toward zero) is outside [0, N) is ignored on both backends: its output is 0
and it passes no gradient (MXNet's ROIPooling rule; its ROIAlign zeroes one element only for a negative index, and
neither its ROIAlign nor PSROIPooling check an index past N). With ``aligned`` a region of non-positive width or
height is refused on the cpu (MXNet's CHECK); a GPU never reads the regions back (that would synchronize and keep the
op out of a recorded graph), so there it gives NaN.

cpu: ops/reference/roi.py, arithmetic in the data's type with MXNet's roundings. gpu: three NVRTC kernel pairs
(below), one thread per output element computing the same formulas; the backwards scatter with atomicAdd (float32
and float64 have it natively on sm_60+), so gradients sum in an unspecified order. float16 runs as float32 (cast in,
cast out), as the kernels have no half atomics.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import zeros
from ...runtime.stream import current_stream
from ..args import check_fits
from ..opdef import Lowering, OpDef, define, table
from ..reference import roi as ref

ALIGN, POOL, PSPOOL = "_contrib_ROIAlign", "ROIPooling", "_contrib_PSROIPooling"
_INT_LIMIT = 2**31

_SOURCE = r"""
/* T is float or double. Offsets are long long: the data may pass 2**31 elements even when the outputs do not. */
template <typename T> __device__ __forceinline__ int dn_batch(const T* roi, int n) {
    int b = (int)roi[0];                       /* truncation toward zero, as static_cast<int> */
    return (b >= 0 && b < n) ? b : -1;
}

/* One ROIAlign region's geometry, as ops/reference/roi.py align_region. */
template <typename T> struct DnAlign { T y1, x1, bh, bw, count; int gh, gw; };

template <typename T> __device__ DnAlign<T> dn_align_region(const T* roi, T scale, bool aligned, int ph, int pw,
                                                          int ratio) {
    DnAlign<T> g;
    T off = aligned ? (T)0.5 : (T)0;
    g.x1 = roi[1] * scale - off; g.y1 = roi[2] * scale - off;
    T rw = roi[3] * scale - off - g.x1, rh = roi[4] * scale - off - g.y1;
    if (!aligned) { rw = rw > (T)1 ? rw : (T)1; rh = rh > (T)1 ? rh : (T)1; }
    g.bh = rh / (T)ph; g.bw = rw / (T)pw;
    g.gh = ratio > 0 ? ratio : (int)ceil(rh / (T)ph);
    g.gw = ratio > 0 ? ratio : (int)ceil(rw / (T)pw);
    g.count = (T)(g.gh * g.gw);
    return g;
}

/* One axis of a bilinear sample: false outside [-1, size]; else the two positions and weights. */
template <typename T> __device__ __forceinline__ bool dn_axis(T v, int size, int* lo, int* hi, T* wl, T* wh) {
    if (v < (T)-1 || v > (T)size) return false;
    if (v <= (T)0) v = (T)0;
    *lo = (int)v;
    if (*lo >= size - 1) { *lo = *hi = size - 1; v = (T)*lo; } else { *hi = *lo + 1; }
    *wh = v - (T)*lo;
    *wl = (T)1 - *wh;
    return true;
}

template <typename T>
__global__ void dn_roi_align_fwd(const T* x, const T* rois, T* y, int total, int n, int c, int h, int w,
                                 int c_out, int ph, int pw, float scale, int ratio, int ps, int aligned) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int q = i % pw, p = (i / pw) % ph, co = (i / pw / ph) % c_out, r = i / pw / ph / c_out;
        const T* roi = rois + (long long)r * 5;
        int b = dn_batch(roi, n);
        if (b < 0) { y[i] = (T)0; continue; }
        DnAlign<T> g = dn_align_region(roi, (T)scale, aligned != 0, ph, pw, ratio);
        int ci = ps ? (co * ph + p) * pw + q : co;
        const T* src = x + ((long long)b * c + ci) * h * w;
        T acc = (T)0;
        for (int iy = 0; iy < g.gh; ++iy) {
            T yy = g.y1 + (T)p * g.bh + (T)(iy + .5f) * g.bh / (T)g.gh;
            int y0, y1; T wy0, wy1;
            bool iny = dn_axis(yy, h, &y0, &y1, &wy0, &wy1);
            for (int ix = 0; ix < g.gw; ++ix) {
                T xx = g.x1 + (T)q * g.bw + (T)(ix + .5f) * g.bw / (T)g.gw;
                int x0, x1; T wx0, wx1;
                if (!iny || !dn_axis(xx, w, &x0, &x1, &wx0, &wx1)) continue;
                acc += wy0 * wx0 * src[(long long)y0 * w + x0] + wy0 * wx1 * src[(long long)y0 * w + x1]
                     + wy1 * wx0 * src[(long long)y1 * w + x0] + wy1 * wx1 * src[(long long)y1 * w + x1];
            }
        }
        y[i] = acc / g.count;
    }
}

template <typename T>
__global__ void dn_roi_align_bwd(const T* dy, const T* rois, T* dx, int total, int n, int c, int h, int w,
                                 int c_out, int ph, int pw, float scale, int ratio, int ps, int aligned) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int q = i % pw, p = (i / pw) % ph, co = (i / pw / ph) % c_out, r = i / pw / ph / c_out;
        const T* roi = rois + (long long)r * 5;
        int b = dn_batch(roi, n);
        if (b < 0) continue;
        DnAlign<T> g = dn_align_region(roi, (T)scale, aligned != 0, ph, pw, ratio);
        int ci = ps ? (co * ph + p) * pw + q : co;
        T* dst = dx + ((long long)b * c + ci) * h * w;
        T top = dy[i];
        for (int iy = 0; iy < g.gh; ++iy) {
            T yy = g.y1 + (T)p * g.bh + (T)(iy + .5f) * g.bh / (T)g.gh;
            int y0, y1; T wy0, wy1;
            bool iny = dn_axis(yy, h, &y0, &y1, &wy0, &wy1);
            for (int ix = 0; ix < g.gw; ++ix) {
                T xx = g.x1 + (T)q * g.bw + (T)(ix + .5f) * g.bw / (T)g.gw;
                int x0, x1; T wx0, wx1;
                if (!iny || !dn_axis(xx, w, &x0, &x1, &wx0, &wx1)) continue;
                atomicAdd(dst + (long long)y0 * w + x0, top * (wy0 * wx0) / g.count);
                atomicAdd(dst + (long long)y0 * w + x1, top * (wy0 * wx1) / g.count);
                atomicAdd(dst + (long long)y1 * w + x0, top * (wy1 * wx0) / g.count);
                atomicAdd(dst + (long long)y1 * w + x1, top * (wy1 * wx1) / g.count);
            }
        }
    }
}

/* ROIPooling: the maximum of each bin and its flat index into x (-1: empty bin or ignored region). */
template <typename T>
__global__ void dn_roi_pool_fwd(const T* x, const T* rois, T* y, long long* arg, int total, int n, int c, int h,
                                int w, int ph, int pw, float scale) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int q = i % pw, p = (i / pw) % ph, ch = (i / pw / ph) % c, r = i / pw / ph / c;
        const T* roi = rois + (long long)r * 5;
        int b = dn_batch(roi, n);
        y[i] = (T)0; arg[i] = -1;
        if (b < 0) continue;
        T s = (T)scale;
        int x1 = (int)round(roi[1] * s), y1 = (int)round(roi[2] * s);
        int x2 = (int)round(roi[3] * s), y2 = (int)round(roi[4] * s);
        int rh = max(y2 - y1 + 1, 1), rw = max(x2 - x1 + 1, 1);
        T bh = (T)rh / (T)ph, bw = (T)rw / (T)pw;
        int hs = min(max((int)floor((T)p * bh) + y1, 0), h), he = min(max((int)ceil((T)(p + 1) * bh) + y1, 0), h);
        int ws = min(max((int)floor((T)q * bw) + x1, 0), w), we = min(max((int)ceil((T)(q + 1) * bw) + x1, 0), w);
        if (he <= hs || we <= ws) continue;
        long long base = ((long long)b * c + ch) * h * w;
        T best = (T)-3.402823466e+38f;         /* MXNet starts from -FLT_MAX */
        long long at = -1;
        for (int yy = hs; yy < he; ++yy)
            for (int xx = ws; xx < we; ++xx) {
                T v = x[base + (long long)yy * w + xx];
                if (v > best) { best = v; at = base + (long long)yy * w + xx; }
            }
        y[i] = best; arg[i] = at;
    }
}

template <typename T>
__global__ void dn_roi_pool_bwd(const T* dy, const long long* arg, T* dx, int total) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
        if (arg[i] >= 0) atomicAdd(dx + arg[i], dy[i]);
}

__device__ __forceinline__ float dn_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double dn_mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* PSROIPooling: one bin's (hs, he, ws, we) and its input channel, as ops/reference/roi.py psroi_bins. */
template <typename T>
__device__ long long dn_psroi_bin(const T* roi, int b, int ctop, int p, int q, int c, int h, int w, int ps, int gs,
                                  T scale, int* hs, int* he, int* ws, int* we) {
    T x1 = dn_mul_rn((T)round(roi[1]), scale), y1 = dn_mul_rn((T)round(roi[2]), scale);
    T x2 = dn_mul_rn((T)round(roi[3]) + (T)1, scale), y2 = dn_mul_rn((T)round(roi[4]) + (T)1, scale);
    T rw = x2 - x1 > (T)0.1 ? x2 - x1 : (T)0.1, rh = y2 - y1 > (T)0.1 ? y2 - y1 : (T)0.1;
    T bh = rh / (T)ps, bw = rw / (T)ps;
    /* every product rounded on its own (no fused multiply-add, which would also fuse x1's own product into the
       edge's sum), as MXNet's and the twin's arithmetic: a bin edge that lands on a whole number must floor and
       ceil the same way */
    *hs = min(max((int)floor(dn_mul_rn((T)p, bh) + y1), 0), h);
    *he = min(max((int)ceil(dn_mul_rn((T)(p + 1), bh) + y1), 0), h);
    *ws = min(max((int)floor(dn_mul_rn((T)q, bw) + x1), 0), w);
    *we = min(max((int)ceil(dn_mul_rn((T)(q + 1), bw) + x1), 0), w);
    int gh = min(max((int)floor((T)p * (T)gs / (T)ps), 0), gs - 1);
    int gw = min(max((int)floor((T)q * (T)gs / (T)ps), 0), gs - 1);
    return ((long long)b * c + (ctop * gs + gh) * gs + gw) * h * w;
}

template <typename T>
__global__ void dn_psroi_fwd(const T* x, const T* rois, T* y, int total, int n, int c, int h, int w, int dim,
                             int ps, int gs, float scale) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int q = i % ps, p = (i / ps) % ps, ctop = (i / ps / ps) % dim, r = i / ps / ps / dim;
        const T* roi = rois + (long long)r * 5;
        int b = dn_batch(roi, n);
        y[i] = (T)0;
        if (b < 0) continue;
        int hs, he, ws, we;
        long long base = dn_psroi_bin(roi, b, ctop, p, q, c, h, w, ps, gs, (T)scale, &hs, &he, &ws, &we);
        if (he <= hs || we <= ws) continue;
        T acc = (T)0;
        for (int yy = hs; yy < he; ++yy)
            for (int xx = ws; xx < we; ++xx) acc += x[base + (long long)yy * w + xx];
        y[i] = acc / (T)((he - hs) * (we - ws));
    }
}

template <typename T>
__global__ void dn_psroi_bwd(const T* dy, const T* rois, T* dx, int total, int n, int c, int h, int w, int dim,
                             int ps, int gs, float scale) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int q = i % ps, p = (i / ps) % ps, ctop = (i / ps / ps) % dim, r = i / ps / ps / dim;
        const T* roi = rois + (long long)r * 5;
        int b = dn_batch(roi, n);
        if (b < 0) continue;
        int hs, he, ws, we;
        long long base = dn_psroi_bin(roi, b, ctop, p, q, c, h, w, ps, gs, (T)scale, &hs, &he, &ws, &we);
        if (he <= hs || we <= ws) continue;
        T share = dy[i] / (T)((he - hs) * (we - ws));
        for (int yy = hs; yy < he; ++yy)
            for (int xx = ws; xx < we; ++xx) atomicAdd(dx + base + (long long)yy * w + xx, share);
    }
}
"""

_KERNELS = ("dn_roi_align_fwd", "dn_roi_align_bwd", "dn_roi_pool_fwd", "dn_roi_pool_bwd", "dn_psroi_fwd",
            "dn_psroi_bwd")
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
NAMES = tuple(f"{k}<{t}>" for k in _KERNELS for t in _CTYPE.values())
_module: dict = {}


def _kernel(name: str, dtype):
    """The compiled kernel ``name`` for float32 or float64 (one NVRTC compile of the family per process, then the
    disk cache)."""
    mod = _module.get("m")
    if mod is None:
        from ...kernels import Module
        mod = _module["m"] = Module(_SOURCE, NAMES)
    return mod.get_function(f"{name}<{_CTYPE[np.dtype(dtype)]}>")


def _launch(name: str, total: int, args: tuple, like) -> None:
    if total:
        grid = max(1, min(-(-total // 256), 4096))
        _kernel(name, like.dtype).launch(grid, 256, args, stream=current_stream(like.device))


# checks ----------------------------------------------------------------------------------------------------------

class Geometry(NamedTuple):
    data_shape: tuple
    out_shape: tuple
    p: dict  # the parameters the kernels and twins read (PSROIPooling's group_size resolved)


def _check_inputs(op: str, data, rois) -> str:
    context = f" (data {tuple(data.shape)}, rois {tuple(rois.shape)})"
    if data.ndim != 4:
        raise DnnbindValueError(f"{op}: data must be 4-D (N, C, H, W), got shape {tuple(data.shape)}")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise DnnbindValueError(f"{op}: rois must be 2-D of shape (R, 5), each [batch_index, x1, y1, x2, y2], got "
                                f"shape {tuple(rois.shape)}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"{op}: data must be a floating-point array, got {data.dtype}{context}")
    if rois.dtype != data.dtype:  # MXNet's type inference: CHECK_EQ(dtype, in_type[1])
        raise DnnbindTypeError(f"{op}: rois is {rois.dtype} but data is {data.dtype}; they must share a dtype"
                               f"{context}")
    return context


def _check_scale(op: str, scale: float) -> None:
    if not 0.0 <= scale <= 1.0:  # MXNet's set_range(0.0, 1.0)
        raise DnnbindValueError(f"value {scale} for Parameter spatial_scale should be in range [0, 1], in operator "
                                f"{op}")


def _check_pooled(op: str, pooled) -> tuple[int, int]:
    pooled = tuple(pooled)
    if len(pooled) != 2:  # MXNet's set_expect_ndim(2)
        raise DnnbindValueError(f"value {list(pooled)} for Parameter pooled_size has wrong dimensions, expected "
                                f"dimension=2, in operator {op}")
    if min(pooled) <= 0:  # MXNet's enforce_nonzero (and a negative size has no bins)
        raise DnnbindValueError(f"value {list(pooled)} for Parameter pooled_size is invalid, the input shape must be "
                                f"positive in all dimensions, in operator {op}")
    return pooled


def _finish(op: str, data, rois, out_shape: tuple, p: dict, context: str) -> Geometry:
    check_fits(op, data.device, data.dtype, "the output", out_shape, context, cudnn=False)
    if math.prod(out_shape) >= _INT_LIMIT:
        raise DnnbindValueError(f"{op}: the output would have {math.prod(out_shape)} elements; the kernels index "
                                f"with 32-bit integers (below 2**31){context}")
    return Geometry(tuple(data.shape), out_shape, p)


def _align_out(p, dshape: tuple, rshape: tuple) -> tuple:
    ph, pw = _check_pooled(ALIGN, p["pooled_size"])
    c = dshape[1]
    if p["position_sensitive"]:
        if c % (ph * pw):
            raise DnnbindValueError(f"{ALIGN}: Input channels should be divided by pooled_size[0]*pooled_size[1] "
                                    f"when position_sensitive is true: {c} channels, pooled_size {(ph, pw)}")
        c //= ph * pw
    return (rshape[0], c, ph, pw)


def _align_prepare(p, data, rois):
    context = _check_inputs(ALIGN, data, rois)
    _check_scale(ALIGN, p["spatial_scale"])
    out = _align_out(p, tuple(data.shape), tuple(rois.shape))
    q = {k: p[k] for k in ("spatial_scale", "sample_ratio", "position_sensitive", "aligned")}
    q["pooled_size"] = out[2:]
    return _finish(ALIGN, data, rois, out, q, context)


def _pool_prepare(p, data, rois):
    context = _check_inputs(POOL, data, rois)
    _check_scale(POOL, p["spatial_scale"])
    ph, pw = _check_pooled(POOL, p["pooled_size"])
    out = (rois.shape[0], data.shape[1], ph, pw)
    return _finish(POOL, data, rois, out, {"pooled_size": (ph, pw), "spatial_scale": p["spatial_scale"]}, context)


def _psroi_params(p) -> dict:
    ps, dim = p["pooled_size"], p["output_dim"]
    gs = p["group_size"] or ps  # MXNet's Init: group_size 0 means pooled_size
    for name, v in (("pooled_size", ps), ("output_dim", dim), ("group_size", gs)):
        if v < 1:
            raise DnnbindValueError(f"{PSPOOL}: {name} must be positive, got {v}")
    return {"pooled_size": ps, "output_dim": dim, "group_size": gs, "spatial_scale": p["spatial_scale"]}


def _psroi_prepare(p, data, rois):
    context = _check_inputs(PSPOOL, data, rois)
    _check_scale(PSPOOL, p["spatial_scale"])
    q = _psroi_params(p)
    need = q["output_dim"] * q["group_size"] ** 2
    if data.shape[1] < need:
        raise DnnbindValueError(f"{PSPOOL}: data has {data.shape[1]} channels but output_dim {q['output_dim']} x "
                                f"group_size {q['group_size']}^2 = {need} are read{context}")
    out = (rois.shape[0], q["output_dim"], q["pooled_size"], q["pooled_size"])
    return _finish(PSPOOL, data, rois, out, q, context)


def _infer_for(op: str):
    def infer(p, shapes):
        d, r = tuple(shapes[0]), tuple(shapes[1])
        if op == ALIGN:
            out = _align_out(p, d, r)
        elif op == POOL:
            out = (r[0], d[1]) + _check_pooled(POOL, p["pooled_size"])
        else:
            q = _psroi_params(p)
            out = (r[0], q["output_dim"], q["pooled_size"], q["pooled_size"])
        return [d, (r[0], 5)], [out]
    return infer


# cpu: the numpy twins ------------------------------------------------------------------------------------------------

def _check_aligned_rois(g: Geometry, rois: np.ndarray) -> None:
    """MXNet's CHECK_GT(roi_width, 0) with ``aligned``: the regions are host values here, so they are checked."""
    if not g.p["aligned"]:
        return
    s = np.float32(g.p["spatial_scale"]).astype(rois.dtype)
    keep = ref.batch_index(rois, g.data_shape[0]) >= 0
    bad = np.flatnonzero(keep & (((rois[:, 3] - rois[:, 1]) * s <= 0) | ((rois[:, 4] - rois[:, 2]) * s <= 0)))
    if bad.size:
        i = int(bad[0])
        raise DnnbindValueError(f"{ALIGN}: with aligned=True every region needs a positive width and height; rois[{i}] "
                                f"is {rois[i].tolist()} (spatial_scale {g.p['spatial_scale']}, rois "
                                f"{tuple(rois.shape)})")


def _align_cpu_forward(c, x, rois):
    _check_aligned_rois(c.geo, rois)
    return ref.roi_align(x, rois, c.geo.p), rois


def _align_cpu_backward(c, rois, grads, dy):
    return ref.roi_align_backward(dy, rois, c.geo.p, c.geo.data_shape), None


def _pool_cpu_forward(c, x, rois):
    y, arg = ref.roi_pool(x, rois, c.geo.p)
    return y, arg


def _pool_cpu_backward(c, arg, grads, dy):
    return ref.roi_pool_backward(dy, arg, c.geo.data_shape), None


def _psroi_cpu_forward(c, x, rois):
    return ref.psroi_pool(x, rois, c.geo.p), rois


def _psroi_cpu_backward(c, rois, grads, dy):
    return ref.psroi_pool_backward(dy, rois, c.geo.p, c.geo.data_shape), None


# gpu: the kernels ----------------------------------------------------------------------------------------------------

def _wide(a):
    """float16 runs as float32 (the kernels take float and double)."""
    return table("cast", a, dtype="float32") if a.dtype == np.float16 else a


def _narrow(a, dtype):
    return table("cast", a, dtype="float16") if np.dtype(dtype) == np.float16 else a


def _dims(g: Geometry) -> tuple:
    return g.data_shape


def _align_args(g: Geometry, c_out: int) -> tuple:
    p = g.p
    ph, pw = p["pooled_size"]
    return (c_out, ph, pw, float(p["spatial_scale"]), int(p["sample_ratio"]), int(p["position_sensitive"]),
            int(p["aligned"]))


def _align_gpu_forward(c, x, rois):
    g = c.geo
    xw, rw = _wide(x), _wide(rois)
    y = zeros(g.out_shape, xw.dtype, x.device)
    total = math.prod(g.out_shape)
    _launch("dn_roi_align_fwd", total, (xw, rw, y, total, *_dims(g), *_align_args(g, g.out_shape[1])), xw)
    return _narrow(y, x.dtype), rw


def _align_gpu_backward(c, rw, grads, dy):
    g = c.geo
    dyw = _wide(dy)
    dx = zeros(g.data_shape, dyw.dtype, dy.device)
    total = math.prod(g.out_shape)
    _launch("dn_roi_align_bwd", total, (dyw, rw, dx, total, *_dims(g), *_align_args(g, g.out_shape[1])), dyw)
    return _narrow(dx, dy.dtype), None


def _pool_gpu_forward(c, x, rois):
    g = c.geo
    xw, rw = _wide(x), _wide(rois)
    y = zeros(g.out_shape, xw.dtype, x.device)
    arg = zeros(g.out_shape, np.int64, x.device)
    total = math.prod(g.out_shape)
    ph, pw = g.p["pooled_size"]
    _launch("dn_roi_pool_fwd", total, (xw, rw, y, arg, total, *_dims(g), ph, pw, float(g.p["spatial_scale"])), xw)
    return _narrow(y, x.dtype), arg


def _pool_gpu_backward(c, arg, grads, dy):
    g = c.geo
    dyw = _wide(dy)
    dx = zeros(g.data_shape, dyw.dtype, dy.device)
    total = math.prod(g.out_shape)
    _launch("dn_roi_pool_bwd", total, (dyw, arg, dx, total), dyw)
    return _narrow(dx, dy.dtype), None


def _psroi_args(g: Geometry) -> tuple:
    p = g.p
    return p["output_dim"], p["pooled_size"], p["group_size"], float(p["spatial_scale"])


def _psroi_gpu_forward(c, x, rois):
    g = c.geo
    xw, rw = _wide(x), _wide(rois)
    y = zeros(g.out_shape, xw.dtype, x.device)
    total = math.prod(g.out_shape)
    _launch("dn_psroi_fwd", total, (xw, rw, y, total, *_dims(g), *_psroi_args(g)), xw)
    return _narrow(y, x.dtype), rw


def _psroi_gpu_backward(c, rw, grads, dy):
    g = c.geo
    dyw = _wide(dy)
    dx = zeros(g.data_shape, dyw.dtype, dy.device)
    total = math.prod(g.out_shape)
    _launch("dn_psroi_bwd", total, (dyw, rw, dx, total, *_dims(g), *_psroi_args(g)), dyw)
    return _narrow(dx, dy.dtype), None


# samples: regions inside, across the border, tiny, and one ignored (batch index past N) -------------------------------

def _rois(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def _align_samples(rng):
    x = rng.standard_normal
    rois = _rois([0, 1.3, 0.7, 6.1, 5.2], [1, -2.0, 3.1, 4.4, 9.5], [1, 2.2, 2.6, 2.9, 3.3], [2, 0, 0, 3, 3])
    yield {"data": x((2, 3, 6, 7)), "rois": rois}, {"pooled_size": (2, 3), "spatial_scale": 1.0}
    yield {"data": x((2, 2, 6, 7)), "rois": rois[:3]}, {"pooled_size": (3, 2), "spatial_scale": 0.5,
                                                        "sample_ratio": 2, "aligned": True}
    yield {"data": x((2, 8, 5, 5)), "rois": rois[:2]}, {"pooled_size": (2, 2), "spatial_scale": 0.8,
                                                        "position_sensitive": True, "sample_ratio": 1}


def _pool_samples(rng):
    # distinct values, so that no bin's maximum is tied and the gradient is defined
    x = rng.permutation(2 * 3 * 6 * 7).reshape(2, 3, 6, 7) / 10.0 + rng.uniform(0, 0.01, (2, 3, 6, 7))
    rois = _rois([0, 1.3, 0.7, 6.1, 5.2], [1, -2.0, 3.1, 4.4, 9.5], [1, 2.5, 2.5, 2.9, 3.3], [3, 0, 0, 3, 3])
    yield {"data": x, "rois": rois}, {"pooled_size": (2, 3), "spatial_scale": 1.0}
    yield {"data": x, "rois": rois[:3] * np.array([1, 2, 2, 2, 2])}, {"pooled_size": (3, 2), "spatial_scale": 0.5}


def _psroi_samples(rng):
    x = rng.standard_normal
    rois = _rois([0, 1.3, 0.7, 6.1, 5.2], [1, -2.0, 3.1, 4.4, 9.5], [1, 2.5, 2.5, 2.9, 3.3], [-1, 0, 0, 3, 3])
    yield {"data": x((2, 8, 6, 7)), "rois": rois}, {"pooled_size": 2, "output_dim": 2, "spatial_scale": 1.0}
    yield {"data": x((2, 9, 6, 7)), "rois": rois[:3]}, {"pooled_size": 3, "output_dim": 1, "spatial_scale": 0.6}
    yield {"data": x((1, 4, 5, 5)), "rois": rois[:1]}, {"pooled_size": 3, "output_dim": 1, "group_size": 2,
                                                        "spatial_scale": 0.9}


_ROIS = ("rois",)

define(OpDef(ALIGN, prepare=_align_prepare, infer=_infer_for(ALIGN), samples=_align_samples, nograd=_ROIS,
             cpu=Lowering(_align_cpu_forward, _align_cpu_backward),
             gpu=Lowering(_align_gpu_forward, _align_gpu_backward),
             doc="ROIAlign (Mask R-CNN; MXNet's contrib ROIAlign): each bin of each region the average of bilinear "
                 "samples of the data."))
define(OpDef(POOL, prepare=_pool_prepare, infer=_infer_for(POOL), samples=_pool_samples, nograd=_ROIS,
             outputs=lambda p: (2, ["output"]),  # MXNet's node also keeps maxidx, hidden
             cpu=Lowering(_pool_cpu_forward, _pool_cpu_backward), gpu=Lowering(_pool_gpu_forward, _pool_gpu_backward),
             doc="ROI max pooling (Fast R-CNN; MXNet's ROIPooling): each bin of each whole-pixel region its maximum."))
# (MXNet types PSROIPooling's inputs "Symbol", a legacy OperatorProperty; nd/_schema.py counts those as inputs)
define(OpDef(PSPOOL, prepare=_psroi_prepare, infer=_infer_for(PSPOOL), samples=_psroi_samples, nograd=_ROIS,
             cpu=Lowering(_psroi_cpu_forward, _psroi_cpu_backward),
             gpu=Lowering(_psroi_gpu_forward, _psroi_gpu_backward),
             doc="Position-sensitive ROI average pooling (R-FCN; MXNet's contrib PSROIPooling)."))
