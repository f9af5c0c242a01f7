"""MXNet's ``Pooling`` (max, avg, sum, lp; 'valid' and 'full' conventions; global; 1-D, 2-D and 3-D, channels first
and last):
cudnnPoolingForward/Backward (ops/pooling.py) on a GPU, ops/reference/pooling.py on the cpu, with what cuDNN lacks
composed around the one pooling call.

cuDNN pools 4-D and 5-D data in three modes ('max', 'avg' counting padding, 'avg_exclude_pad') with the 'valid' (floor)
output size. The rest of MXNet's operator is arithmetic around that call, the same on both backends:

- 'sum' is the average counting padding times the window's area (padding adds zeros to a sum);
- 'lp' (``p_value`` p) is (sum of x^p over the window)^(1/p), signed for odd p: x^p, 'sum', then the root. Its
  gradient is MXNet's, dy * (x / y)^(p - 1), composed the same way;
- 'full' (ceil: output 1 + ceil((H + 2 pad - k) / s)) appends rows and columns (and planes) on the high side
  (the lowest finite value for max, so a window that holds only those gives MXNet's lowest value; zeros
  otherwise) and pools them with 'valid'. Its averages are then rescaled to MXNet's divisor (pool.h: a window counting padding stops at
  H + pad, so the appended rows never count; without padding only real elements count);
- global pooling is a kernel of the whole input, stride 1, no padding (``kernel``, ``stride``, ``pad`` and the
  convention are ignored, as MXNet ignores them);
- 1-D data (N, C, W) is pooled as an (N, C, 1, W) view; 3-D data (N, C, D, H, W) on cuDNN's N-d descriptors;
  channels-last data (NHWC, and NDHWC, which MXNet 1.9.1's CPU pools too) by cuDNN on channels-last descriptors.

MXNet 1.9.1 declares ``kernel`` (required unless ``global_pool``), ``stride`` (1 on every axis), ``pad`` (0),
``pool_type`` 'max', ``pooling_convention`` 'valid', ``count_include_pad`` (None: True), ``p_value`` (None),
``layout`` (None: channels first), ``cudnn_off`` (checked, ignored). Refused with ValueError where dnnbind has no
answer that matches MXNet: channels-last 1-D data, 'same' (MXNet has it for 1-D
max pooling only, and refuses it in shape inference), 'lp' without a ``p_value`` >= 1, a pad not smaller than the
kernel or a kernel larger than the padded input (MXNet's oneDNN kernels refuse both, its own give values of no
window).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..._lib.errors import DnnbindTypeError, DnnbindValueError
from ...runtime.array import array, full
from ..args import check_fits, spatial
from ..opdef import Lowering, OpDef, define, table, view
from ..pooling import pooling_backward, pooling_forward
from ..reference import pooling as R

_OP = "Pooling"


class _Divisor:
    """'full' averages: the factors (1, 1, P, Q) ((1, P, Q, 1) channels last; (1, 1, O, P, Q) in 3-D) turning
    cuDNN's window sum / area
    into MXNet's average, in float64; each device's copy is uploaded once (the geometry holding this is cached per
    call signature, so a training loop uploads it once)."""
    __slots__ = ("host", "copies")

    def __init__(self, host: np.ndarray):
        self.host, self.copies = host, {}

    def on(self, dtype, device):
        key = (dtype, device)
        a = self.copies.get(key)
        if a is None:
            a = self.copies[key] = array(self.host.astype(dtype), device=device)
        return a


class _Geo(NamedTuple):
    x: tuple                # the input's shape
    x4: tuple               # the input as pooled: 4-D (1-D data as (N, C, 1, W)), or 5-D for 3-D data
    y4: tuple               # the pooled output, as x4
    y: tuple                # the output's shape as returned (3-D for 1-D data)
    layout: str             # "NCHW" or "NHWC"
    mode: str               # cuDNN's mode: "max", "avg" (padding counted) or "avg_exclude_pad"
    window: tuple           # (kh, kw) or (kd, kh, kw), stride and pad likewise
    stride: tuple
    pad: tuple
    extra: tuple            # 'full': the rows and columns (planes) appended on the high side; all 0 for none
    fill: float             # their value
    factor: float           # what the pooled value is multiplied by: the window's size for sum and lp, else 1
    divisor: _Divisor | None  # 'full' averages with appended rows: MXNet's divisor
    p: int | None           # lp: p_value (None otherwise)

    @property
    def one_d(self) -> bool:
        return len(self.x) == 3


def _out_size(size: int, k: int, s: int, pad: int, full_: bool) -> int:
    """One axis's output: floor ('valid') or ceil ('full') of (size + 2 pad - k) / s, plus one."""
    span = size + 2 * pad - k
    return (-(-span // s) if full_ else span // s) + 1


def _prepare(p, data):
    shape = tuple(data.shape)
    dims = data.ndim - 2
    if dims not in (1, 2, 3):
        raise DnnbindValueError(f"Pooling: data must be 3-D (N, C, W), 4-D (N, C, H, W) or 5-D (N, C, D, H, W), got "
                                f"shape {shape}")
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"Pooling: data must be a floating-point array, got {data.dtype} (shape {shape})")
    pool_type, convention, layout, p_value = p["pool_type"], p["pooling_convention"], p["layout"], p["p_value"]
    if dims == 1:
        if layout not in (None, "NCW"):
            raise DnnbindValueError(f"Pooling: layout must be 'NCW' for 3-D data {shape} (channels-last 1-D "
                                    f"pooling is not supported), got {layout!r}")
        layout = "NCHW"
    elif dims == 3:  # ops.pooling calls channels first/last "NCHW"/"NHWC" in 4-D and 5-D alike
        if layout not in (None, "NCDHW", "NDHWC"):
            raise DnnbindValueError(f"Pooling: layout must be 'NCDHW' or 'NDHWC' (data {shape}), got {layout!r}")
        layout = "NHWC" if layout == "NDHWC" else "NCHW"
    elif layout is None:
        layout = "NCHW"
    elif layout not in ("NCHW", "NHWC"):  # the parser took one of MXNet's layouts, of another rank
        raise DnnbindValueError(f"Pooling: layout must be 'NCHW' or 'NHWC' (data {shape}), got {layout!r}")
    if convention == "same":  # MXNet 1.9.1 has it for 1-D max pooling only
        if dims != 1 or pool_type != "max":
            raise DnnbindValueError(f"Pooling: pooling_convention='same' is for 1-D max pooling only (3-D data "
                                    f"(N, C, W)); got pool_type {pool_type!r}, data {shape}")
        raise NotImplementedError(f"Pooling: pooling_convention='same' is not supported by dnnbind (data {shape})")
    if pool_type == "lp" and p_value is None:
        raise DnnbindValueError(f"Pooling: pool_type='lp' needs p_value (data {shape})")
    if p_value is not None and p_value < 1:  # no root 1/p (dnnbind refused it for every pool type, and still does)
        raise DnnbindValueError(f"Pooling: p_value must be >= 1, got {p_value} (data {shape})")
    size = shape[1:-1] if layout == "NHWC" else shape[2:]
    kernel = p["kernel"]
    if p["global_pool"]:  # MXNet: the kernel is the whole input, stride 1, no padding; the convention does not matter
        kernel, stride, pad, convention = tuple(size), (1,) * dims, (0,) * dims, "valid"
    elif not kernel:
        raise DnnbindValueError(f"Pooling: kernel is required unless global_pool=True (data {shape})")
    elif len(kernel) != dims:
        raise DnnbindValueError(f"Pooling: kernel {kernel} has {len(kernel)} axes but data {shape} has {dims} "
                                "spatial axes")
    elif min(kernel) < 1:
        raise DnnbindValueError(f"Pooling: kernel must be >= 1 on every axis, got {kernel} (data {shape})")
    else:
        stride, pad = p["stride"], p["pad"]
    stride = spatial(_OP, "stride", stride, dims, 1, 1, shape)
    pad = spatial(_OP, "pad", pad, dims, 0, 0, shape)
    spatial(_OP, "kernel", kernel, dims, 1, 1, shape)  # a global kernel of an empty axis, or beyond int32
    if any(a >= k for a, k in zip(pad, kernel)):
        raise DnnbindValueError(f"Pooling: pad {pad} must be smaller than kernel {kernel} on every axis (data "
                                f"{shape})")
    padded = tuple(s + 2 * a for s, a in zip(size, pad))
    if any(k > s for k, s in zip(kernel, padded)):
        raise DnnbindValueError(f"Pooling: kernel {kernel} is larger than the padded input {padded} (data "
                                f"{shape}, pad {pad})")
    n, c = shape[0], shape[-1] if layout == "NHWC" else shape[1]
    check_fits(_OP, data.device, data.dtype, "the padded input",
               (n, c) + padded if layout == "NCHW" else (n,) + padded + (c,), f" (data {shape}, pad {pad})")
    if dims == 1:
        size, kernel, stride, pad = (1,) + tuple(size), (1,) + kernel, (1,) + stride, (0,) + pad
    full_ = convention == "full"
    axes = range(len(size))
    out = tuple(_out_size(size[d], kernel[d], stride[d], pad[d], full_) for d in axes)
    extra = tuple(max(0, (out[d] - 1) * stride[d] + kernel[d] - size[d] - 2 * pad[d]) for d in axes)
    cip = p["count_include_pad"] is not False  # None means True
    if pool_type == "max":
        mode = "max"
    elif pool_type == "avg" and not cip and not any(extra):
        mode = "avg_exclude_pad"
    else:  # sum and lp are sums of the padded window; a 'full' average is rescaled from the one counting padding
        mode = "avg"
    divisor = _divisor(size, kernel, stride, pad, out, cip, layout) if pool_type == "avg" and any(extra) else None
    nchw = layout == "NCHW"
    x4 = (n, c) + tuple(size) if nchw else (n,) + tuple(size) + (c,)
    y4 = (n, c) + out if nchw else (n,) + out + (c,)
    y = (n, c, out[1]) if dims == 1 else y4
    fill = float(np.finfo(data.dtype).min) if pool_type == "max" else 0.0
    factor = float(math.prod(kernel)) if pool_type in ("sum", "lp") else 1.0
    return _Geo(shape, x4, y4, y, layout, mode, kernel, stride, pad, extra, fill, factor, divisor,
                p_value if pool_type == "lp" else None)


def _divisor(size, window, stride, pad, out, include_pad: bool, layout: str) -> _Divisor:
    """MXNet's 'full' averages (pool.h): a window counting padding stops at size + pad (the appended rows never
    count); without padding only real elements count. As factors of cuDNN's sum / area."""
    counts = []
    for d in range(len(window)):
        start = np.arange(out[d]) * stride[d] - pad[d]
        if include_pad:
            cnt = np.minimum(start + window[d], size[d] + pad[d]) - start
        else:
            cnt = np.minimum(start + window[d], size[d]) - np.maximum(start, 0)
        counts.append(np.maximum(cnt, 1).astype(np.float64))  # a window of appended rows only: its sum is 0
    host = math.prod(window) / functools.reduce(np.multiply.outer, counts)
    return _Divisor(host.reshape((1, 1) + host.shape if layout == "NCHW" else (1,) + host.shape + (1,)))


def _infer(p, shapes):
    data = shapes[0]
    last = bool(p["layout"]) and p["layout"].endswith("C")
    sp = data[1:-1] if last else data[2:]
    n = len(sp)
    if p["global_pool"]:
        out_sp = (1,) * n
    else:
        k = tuple(p["kernel"])
        s = tuple(p["stride"]) if len(p["stride"]) == n else (1,) * n
        pad = tuple(p["pad"]) if len(p["pad"]) == n else (0,) * n
        if p["pooling_convention"] == "same":  # MXNet 1.9.1 refuses it in shape inference, for 2-D and 1-D alike
            raise DnnbindValueError(f"Pooling: pooling_convention='same' is refused by MXNet 1.9.1's shape inference "
                                    f"(data {tuple(data)}); use 'valid' or 'full'")
        full_ = p["pooling_convention"] == "full"
        out_sp = tuple(_out_size(sp[i], k[i], s[i], pad[i], full_) for i in range(n))
    out = (data[0], *out_sp, data[-1]) if last else (data[0], data[1], *out_sp)
    return [data], [out, out]


def _outputs(p):
    # MXNet 1.9.1's pip wheel (oneDNN) gives max pooling in a channels-first layout a second, workspace output
    return 2 if p["pool_type"] == "max" and p["layout"] in (None, "NCW", "NCHW", "NCDHW") else 1, ["output"]


# cpu: the numpy twin ------------------------------------------------------------------------------------------

def _quiet(fn):
    """``fn`` with numpy's NaN and inf results unwarned, as the table ops' twins (and the GPU, and MXNet) give them:
    an lp window of zeros has an infinite root slope."""
    @functools.wraps(fn)
    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    return run


@_quiet
def _cpu_forward(c, x):
    g = c.geo
    x4 = x.reshape(g.x4)
    xp = x4 if g.p is None or g.p == 1 else np.power(x4, float(g.p))
    h = 1 if g.layout == "NHWC" else 2
    xe = xp
    for d, extra in enumerate(g.extra):  # 'full': rows (d = 0), then columns (then 3-D's last axis), appended
        if extra:
            shape = list(xe.shape)
            shape[h + d] = extra
            xe = np.concatenate([xe, np.full(shape, g.fill, xe.dtype)], axis=h + d)
    y0 = R.pooling_forward(xe, g.mode, g.window, g.stride, g.pad, layout=g.layout)
    s = y0 * g.factor if g.factor != 1 else y0
    if g.divisor is not None:
        s = s * g.divisor.host.astype(s.dtype)
    if g.p is None or g.p == 1:
        y = s
    elif g.p == 2:
        y = np.sqrt(s)
    else:
        y = np.power(np.abs(s), 1.0 / g.p)
        if g.p % 2:
            y = y * np.sign(s)
    return y.reshape(g.y), (x4, xe, y0, s, y)


@_quiet
def _cpu_backward(c, saved, grads, dy):
    g = c.geo
    x4, xe, y0, s, y = saved
    if not grads.needs[0]:
        return (None,)
    d = dy.reshape(g.y4)
    if g.p == 2:  # d sqrt(s) / ds
        d = d * 0.5 / y
    elif g.p is not None and g.p > 2:  # d |s|^(1/p) sign(s) / ds = y / (p s)
        d = d * y / (s * g.p)
    if g.divisor is not None:
        d = d * g.divisor.host.astype(d.dtype)
    if g.factor != 1:
        d = d * g.factor
    dx = R.pooling_backward(y0, d, xe, g.mode, g.window, g.stride, g.pad, layout=g.layout)
    if any(g.extra):  # the appended rows and columns take no gradient
        dx = dx[_own_rows(g)]
    if g.p is not None and g.p > 1:  # d x^p / dx
        dx = dx * (g.p * np.power(x4, float(g.p - 1)))
    return (dx.reshape(g.x),)


def _own_rows(g) -> tuple:
    """The index of the input's own rows and columns in its 'full' extension (the appended ones dropped)."""
    h = 1 if g.layout == "NHWC" else 2
    return (slice(None),) * h + tuple(slice(0, g.x4[h + d]) for d in range(len(g.window)))


# gpu: cuDNN, the arithmetic around it by table ops --------------------------------------------------------------

def _gpu_forward(c, x):
    g = c.geo
    x4 = view(x, g.x4) if g.one_d else x
    if not math.prod(g.y4):  # no batch or no channels: nothing to pool (cuDNN takes no empty tensor)
        return full(g.y, 0, x.dtype, x.device), (x4, None, None, None, None)
    xp = x4 if g.p is None or g.p == 1 else table("power", x4, float(g.p))
    h = 1 if g.layout == "NHWC" else 2
    xe = xp
    for d, extra in enumerate(g.extra):  # 'full': rows (d = 0), then columns (then 3-D's last axis), appended
        if extra:
            shape = list(xe.shape)
            shape[h + d] = extra
            xe = table("concat", xe, full(tuple(shape), g.fill, xe.dtype, xe.device), dim=h + d)
    y0 = pooling_forward.gpu(xe, g.mode, g.window, g.stride, g.pad, layout=g.layout)
    s = table("multiply", y0, g.factor) if g.factor != 1 else y0
    if g.divisor is not None:
        s = table("multiply", s, g.divisor.on(s.dtype, s.device))
    if g.p is None or g.p == 1:
        y = s
    elif g.p == 2:
        y = table("sqrt", s)
    else:
        y = table("power", table("abs", s), 1.0 / g.p)
        if g.p % 2:
            y = table("multiply", y, table("sign", s))
    return (view(y, g.y) if g.one_d else y), (x4, xe, y0, s, y)


def _gpu_backward(c, saved, grads, dy):
    g = c.geo
    x4, xe, y0, s, y = saved
    if not grads.needs[0]:
        return (None,)
    if xe is None:  # nothing was pooled
        return (full(g.x, 0, dy.dtype, dy.device),)
    d = view(dy, g.y4) if g.one_d else dy
    if g.p == 2:  # d sqrt(s) / ds
        d = table("divide", table("multiply", d, 0.5), y)
    elif g.p is not None and g.p > 2:  # d |s|^(1/p) sign(s) / ds = y / (p s)
        d = table("divide", table("multiply", d, y), table("multiply", s, float(g.p)))
    if g.divisor is not None:
        d = table("multiply", d, g.divisor.on(d.dtype, d.device))
    if g.factor != 1:
        d = table("multiply", d, g.factor)
    dx = pooling_backward.gpu(y0, d, xe, g.mode, g.window, g.stride, g.pad, layout=g.layout)
    if any(g.extra):  # the appended rows and columns take no gradient
        dx = table("_basic_index", dx, key=_own_rows(g))
    if g.p is not None and g.p > 1:  # d x^p / dx
        dx = table("multiply", dx, table("multiply", table("power", x4, float(g.p - 1)), float(g.p)))
    return (view(dx, g.x) if g.one_d else dx,)


def _samples(rng):
    def normal(*shape):
        return {"data": rng.standard_normal(shape)}
    yield normal(2, 3, 5, 6), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1)}
    yield normal(1, 2, 4, 5), {"kernel": (2, 2), "pool_type": "avg"}
    yield normal(1, 2, 5, 6), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg",
                               "count_include_pad": False}
    yield normal(2, 2, 5, 6), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg",
                               "pooling_convention": "full"}
    yield normal(1, 2, 7, 5), {"kernel": (2, 3), "stride": (2, 2), "pool_type": "avg", "pooling_convention": "full",
                               "count_include_pad": False}
    yield normal(1, 2, 5, 6), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pooling_convention": "full"}
    yield normal(1, 2, 4, 5), {"kernel": (2, 2), "pad": (1, 1), "pool_type": "sum"}
    yield normal(1, 2, 5, 5), {"kernel": (2, 2), "stride": (2, 2), "pool_type": "sum", "pooling_convention": "full"}
    yield normal(1, 2, 4, 4), {"kernel": (2, 2), "stride": (2, 2), "pool_type": "lp", "p_value": 2}
    yield normal(1, 2, 4, 4), {"kernel": (2, 2), "pool_type": "lp", "p_value": 1}
    # p = 3: windows of positive values, away from the root's infinite slope at 0
    yield ({"data": rng.uniform(0.5, 1.5, (1, 2, 5, 5))},
           {"kernel": (3, 3), "stride": (2, 2), "pool_type": "lp", "p_value": 3, "pooling_convention": "full"})
    yield normal(2, 3, 4, 5), {"global_pool": True, "pool_type": "avg"}
    yield normal(1, 4, 3, 3), {"global_pool": True, "kernel": (2, 2), "stride": (2, 2), "pad": (1, 1)}
    yield normal(2, 5, 6, 3), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg",
                               "count_include_pad": False, "layout": "NHWC"}
    yield normal(1, 5, 6, 2), {"kernel": (2, 2), "stride": (2, 2), "pooling_convention": "full", "layout": "NHWC"}
    yield normal(2, 3, 9), {"kernel": (3,), "stride": (2,), "pad": (1,)}
    yield normal(1, 2, 8), {"kernel": (3,), "stride": (2,), "pool_type": "avg", "pooling_convention": "full",
                            "layout": "NCW"}
    yield normal(2, 2, 4, 5, 6), {"kernel": (2, 3, 2), "stride": (2, 2, 1), "pad": (1, 1, 0)}
    yield normal(1, 2, 5, 4, 5), {"kernel": (2, 2, 3), "stride": (2, 2, 2), "pool_type": "avg",
                                  "pooling_convention": "full", "count_include_pad": False}
    yield normal(1, 2, 3, 4, 3), {"kernel": (2, 2, 2), "pad": (1, 0, 1), "pool_type": "sum",
                                  "pooling_convention": "full", "stride": (2, 2, 2)}
    yield normal(1, 3, 4, 3, 5), {"kernel": (3, 2, 2), "stride": (1, 1, 2), "pool_type": "avg", "layout": "NDHWC"}
    yield normal(2, 3, 3, 4, 2), {"global_pool": True, "pool_type": "max"}


define(OpDef("Pooling", prepare=_prepare, infer=_infer, outputs=_outputs, samples=_samples,
             cpu=Lowering(_cpu_forward, _cpu_backward), gpu=Lowering(_gpu_forward, _gpu_backward),
             doc="Pooling over the spatial axes of 3-D (N, C, W), 4-D (N, C, H, W) or 5-D (N, C, D, H, W) data "
                 "(MXNet's Pooling): "
                 "cudnnPoolingForward. pool_type 'max', 'avg', 'sum' or 'lp' (p_value); pooling_convention 'valid' "
                 "(floor) or 'full' (ceil); global_pool pools the whole input; layout 'NHWC' ('NDHWC') pools "
                 "channels-last data."))
