"""Layer 2 (ops): cuDNN descriptors as owned, cached Python objects. Imports _lib and ops._common.

A descriptor is built once per key (shape, dtype, params, math mode), frees itself when the cache drops it
and nothing else holds it (weakref.finalize), and passes straight into ctypes through ``_as_parameter_``. The
cache is a plain dict so the hot path is one lookup without a lock; insertions take a lock, and beyond
CACHE_LIMIT entries the oldest is dropped (a training run touches a few dozen keys; a stream of new shapes
must not grow it forever).
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError

import ctypes
import threading
import weakref

import numpy as np

from .._lib import cudnn
from ._common import cache_insert

L = cudnn.lib

DATA_TYPES = {np.dtype(np.float32): cudnn.CUDNN_DATA_FLOAT, np.dtype(np.float64): cudnn.CUDNN_DATA_DOUBLE,
              np.dtype(np.float16): cudnn.CUDNN_DATA_HALF}

# NOTE: alpha/beta are *host pointers* to a scalar of the compute type: double for double data, float
# otherwise (half included). They must outlive the call, so they are module constants, passed as addresses.
_SCALARS = {}


def scalar_ptr(value: float, dtype) -> int:
    ptr = _SCALARS.get((value, dtype))  # hot path: the caller's own (value, dtype) seen before
    if ptr is None:
        key = (float(value), np.dtype(dtype) == np.float64)
        ptr = _SCALARS.get(key)
        if ptr is None:
            holder = (ctypes.c_double if key[1] else ctypes.c_float)(key[0])
            _SCALARS[key] = ptr = ctypes.addressof(holder)
            _SCALARS[("keep",) + key] = holder
        try:
            _SCALARS[(value, dtype)] = ptr
        except TypeError:  # an unhashable dtype spelling: no fast entry
            pass
    return ptr


def cudnn_dtype(op: str, dtype) -> int:
    try:
        return DATA_TYPES[np.dtype(dtype)]
    except KeyError:
        raise DnnbindTypeError(f"{op}: dtype {np.dtype(dtype)} is not supported by cuDNN here; use float32, float64 "
                        "or float16") from None


def _int_array(values) -> ctypes.Array:
    """A C int[] for the Nd setters (read during the call, not kept)."""
    return (ctypes.c_int * len(values))(*values)


class OwnedDescriptor:
    """Base of every cuDNN descriptor here: a subclass names its C create/destroy functions in ``_create`` and
    ``_destroy`` and sets it up in ``__init__`` after ``super().__init__()``; the object frees the descriptor when it
    is collected (or on ``close()``)."""
    _create = _destroy = ""
    __slots__ = ("_as_parameter_", "_finalizer", "__weakref__")

    def __init__(self):
        h = ctypes.c_void_p()
        getattr(L, self._create)(ctypes.byref(h))
        self._as_parameter_ = h.value
        self._finalizer = weakref.finalize(self, _destroy, self._destroy, h.value)
        self._finalizer.atexit = False  # at exit the driver frees everything; CUDA may be gone

    def close(self) -> None:
        self._finalizer()


def _destroy(fn_name: str, handle: int) -> None:
    try:
        getattr(L, fn_name)(handle)
    except Exception:  # interpreter shutdown
        pass


class TensorDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"
    __slots__ = ()

    def __init__(self, shape: tuple, dtype, fmt: int = cudnn.CUDNN_TENSOR_NCHW):
        super().__init__()
        if len(shape) == 4:
            # NOTE: the dims are (N, C, H, W) in both formats; the format says how they lie in memory.
            L.cudnnSetTensor4dDescriptor(self, fmt, cudnn_dtype("tensor", dtype), *shape)
        else:  # (N, C, D, H, W): packed, the format saying channels first or last, as for 4-D
            L.cudnnSetTensorNdDescriptorEx(self, fmt, cudnn_dtype("tensor", dtype), len(shape), _int_array(shape))


class FilterDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"
    __slots__ = ()

    def __init__(self, shape: tuple, dtype, fmt: int = cudnn.CUDNN_TENSOR_NCHW):
        super().__init__()
        if len(shape) == 4:
            # NOTE: the dims are (K, C, R, S) in both formats; NHWC lays them out as K, R, S, C (MXNet's OHWI).
            L.cudnnSetFilter4dDescriptor(self, cudnn_dtype("filter", dtype), fmt, *shape)
        else:  # (K, C/groups, T, R, S): a 3-D convolution's weight
            L.cudnnSetFilterNdDescriptor(self, cudnn_dtype("filter", dtype), fmt, len(shape), _int_array(shape))


class ConvDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor"
    __slots__ = ()

    def __init__(self, padding, stride, dilation, groups, dtype, math: str):
        super().__init__()
        # NOTE: half data computes in float ("pseudo half"); double in double.
        compute = cudnn.CUDNN_DATA_DOUBLE if np.dtype(dtype) == np.float64 else cudnn.CUDNN_DATA_FLOAT
        if len(padding) == 2:
            L.cudnnSetConvolution2dDescriptor(self, padding[0], padding[1], stride[0], stride[1], dilation[0],
                                              dilation[1], cudnn.CUDNN_CROSS_CORRELATION, compute)
        else:  # 3-D: one entry per spatial axis (D, H, W)
            L.cudnnSetConvolutionNdDescriptor(self, len(padding), _int_array(padding), _int_array(stride),
                                              _int_array(dilation), cudnn.CUDNN_CROSS_CORRELATION, compute)
        if groups > 1:
            L.cudnnSetConvolutionGroupCount(self, groups)
        # NOTE: cuDNN's default math lets FP32 convolutions run on TF32 tensor cores; FMA_MATH forbids it.
        math_type = cudnn.CUDNN_DEFAULT_MATH if math == "tf32" else cudnn.CUDNN_FMA_MATH
        if np.dtype(dtype) == np.float16:
            math_type = cudnn.CUDNN_TENSOR_OP_MATH
        L.cudnnSetConvolutionMathType(self, math_type)


class ActivationDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor"
    __slots__ = ()

    MODES = {"relu": cudnn.CUDNN_ACTIVATION_RELU, "sigmoid": cudnn.CUDNN_ACTIVATION_SIGMOID,
             "tanh": cudnn.CUDNN_ACTIVATION_TANH, "clipped_relu": cudnn.CUDNN_ACTIVATION_CLIPPED_RELU,
             "elu": cudnn.CUDNN_ACTIVATION_ELU, "identity": cudnn.CUDNN_ACTIVATION_IDENTITY}

    def __init__(self, mode: str, coef: float):
        super().__init__()
        L.cudnnSetActivationDescriptor(self, self.MODES[mode], cudnn.CUDNN_PROPAGATE_NAN, float(coef))


class LRNDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor"
    __slots__ = ()

    def __init__(self, n: int, alpha: float, beta: float, k: float):
        super().__init__()
        L.cudnnSetLRNDescriptor(self, n, alpha, beta, k)  # cuDNN divides alpha by n itself, as MXNet's LRN does


class PoolingDesc(OwnedDescriptor):
    _create, _destroy = "cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor"
    __slots__ = ()

    MODES = {"max": cudnn.CUDNN_POOLING_MAX, "avg": cudnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
             "avg_exclude_pad": cudnn.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING}

    def __init__(self, mode: str, window, padding, stride):
        super().__init__()
        if len(window) == 2:
            L.cudnnSetPooling2dDescriptor(self, self.MODES[mode], cudnn.CUDNN_PROPAGATE_NAN, window[0], window[1],
                                          padding[0], padding[1], stride[0], stride[1])
        else:  # 3-D: one entry per spatial axis (D, H, W); the tensors are 5-D (tensor_nd)
            L.cudnnSetPoolingNdDescriptor(self, self.MODES[mode], cudnn.CUDNN_PROPAGATE_NAN, len(window),
                                          _int_array(window), _int_array(padding), _int_array(stride))


CACHE_LIMIT = 4096
_cache: dict = {}
_lock = threading.Lock()


def _insert(key: tuple, make):
    return cache_insert(_cache, key, make, _lock, CACHE_LIMIT)


def tensor(shape: tuple, dtype) -> TensorDesc:
    """A 4-D NCHW descriptor for ``shape``: (N, C) -> (N, C, 1, 1); 1-D (C,) -> (1, C, 1, 1)."""
    key = ("t", shape, dtype)
    return _cache.get(key) or _insert(key, lambda: TensorDesc(as4d(shape), dtype))


def tensor_nd(shape: tuple, dtype) -> TensorDesc:
    """A packed channels-first descriptor with all of ``shape``'s dims (5-D (N, C, D, H, W) for 3-D convolution and
    pooling), where ``tensor`` folds everything into 4 dims."""
    key = ("tnd", shape, dtype)
    return _cache.get(key) or _insert(key, lambda: TensorDesc(tuple(shape), dtype))


def tensor_ndhwc(shape: tuple, dtype) -> TensorDesc:
    """A channels-last descriptor for an array of shape (N, D, H, W, C) (3-D pooling with layout NDHWC)."""
    key = ("tndn", shape, dtype)
    n, d, h, w, c = shape
    return _cache.get(key) or _insert(key, lambda: TensorDesc((n, c, d, h, w), dtype, cudnn.CUDNN_TENSOR_NHWC))


def tensor_nhwc(shape: tuple, dtype) -> TensorDesc:
    """A channels-last descriptor for an array of shape (N, H, W, C) (CUDNN_TENSOR_NHWC)."""
    key = ("tn", shape, dtype)
    n, h, w, c = shape
    return _cache.get(key) or _insert(key, lambda: TensorDesc((n, c, h, w), dtype, cudnn.CUDNN_TENSOR_NHWC))


def filt_nhwc(shape: tuple, dtype) -> FilterDesc:
    """A channels-last filter for a weight of shape (K, R, S, C): MXNet's NHWC convolution weight (OHWI)."""
    key = ("fn", shape, dtype)
    k, r, s, c = shape
    return _cache.get(key) or _insert(key, lambda: FilterDesc((k, c, r, s), dtype, cudnn.CUDNN_TENSOR_NHWC))


class BatchNormParamDesc(TensorDesc):
    """The (1, C, 1, 1) descriptor cuDNN derives from x's for spatial mode (cudnnDeriveBNTensorDescriptor)."""
    __slots__ = ()

    def __init__(self, x_desc, dtype):  # an empty descriptor, then derived from x's
        OwnedDescriptor.__init__(self)
        L.cudnnDeriveBNTensorDescriptor(self, x_desc, cudnn.CUDNN_BATCHNORM_SPATIAL)


def batchnorm(x_shape: tuple, dtype, layout: str = "NCHW") -> tuple:
    """(x descriptor, derived parameter descriptor) of spatial BatchNorm (ops/batchnorm.py, ops/batchnorm_fused.py)
    on an x of ``x_shape``: 4-D NHWC for ``layout="NHWC"``, else as ``tensor`` folds it."""
    xd = tensor_nhwc(x_shape, dtype) if layout == "NHWC" else tensor(x_shape, dtype)
    key = ("bn", x_shape, dtype, layout)
    bnd = _cache.get(key) or _insert(key, lambda: BatchNormParamDesc(xd, dtype))
    return xd, bnd


def as4d(shape: tuple) -> tuple:
    if len(shape) == 4:
        return tuple(shape)
    if len(shape) == 1:
        return (1, shape[0], 1, 1)
    if len(shape) == 2:
        return (shape[0], shape[1], 1, 1)
    if len(shape) == 3:
        return (shape[0], shape[1], shape[2], 1)
    if not shape:
        return (1, 1, 1, 1)
    return (shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64)), 1)


def filt(shape: tuple, dtype) -> FilterDesc:
    key = ("f", shape, dtype)
    return _cache.get(key) or _insert(key, lambda: FilterDesc(shape, dtype))


def conv(padding, stride, dilation, groups, dtype, math: str) -> ConvDesc:
    key = ("c", padding, stride, dilation, groups, dtype, math)
    return _cache.get(key) or _insert(key, lambda: ConvDesc(padding, stride, dilation, groups, dtype, math))


def activation(mode: str, coef: float) -> ActivationDesc:
    key = ("a", mode, coef)
    return _cache.get(key) or _insert(key, lambda: ActivationDesc(mode, coef))


def lrn(n: int, alpha: float, beta: float, k: float) -> LRNDesc:
    key = ("lrn", n, alpha, beta, k)
    return _cache.get(key) or _insert(key, lambda: LRNDesc(n, alpha, beta, k))


def pooling(mode: str, window, padding, stride) -> PoolingDesc:
    key = ("p", mode, window, padding, stride)
    return _cache.get(key) or _insert(key, lambda: PoolingDesc(mode, window, padding, stride))


def conv_output_dim(x_shape, w_shape, padding, stride, dilation, groups, dtype) -> tuple:
    """cuDNN's own answer for the output shape (host-side; works without a GPU)."""
    n, c, h, w = (ctypes.c_int() for _ in range(4))
    L.cudnnGetConvolution2dForwardOutputDim(conv(padding, stride, dilation, groups, dtype, "fp32"),
                                            tensor(tuple(x_shape), dtype), filt(tuple(w_shape), dtype),
                                            ctypes.byref(n), ctypes.byref(c), ctypes.byref(h), ctypes.byref(w))
    return n.value, c.value, h.value, w.value


def conv_output_dim_nd(x_shape, w_shape, padding, stride, dilation, groups, dtype) -> tuple:
    """cuDNN's own answer for a 3-D (or any N-d) convolution's output shape (host-side; works without a GPU)."""
    out = (ctypes.c_int * len(x_shape))()
    L.cudnnGetConvolutionNdForwardOutputDim(conv(tuple(padding), tuple(stride), tuple(dilation), groups, dtype,
                                                 "fp32"),
                                            tensor_nd(tuple(x_shape), dtype), filt(tuple(w_shape), dtype),
                                            len(x_shape), out)
    return tuple(out)


# --- RNN (ops/defs/rnn.py) -------------------------------------------------------------------------------------

class StateTensorDesc(OwnedDescriptor):
    """A packed 3-D tensor descriptor (layers * directions, batch, size): an RNN's hx/cx/hy/cy. NOTE: cuDNN's RNN
    calls want exactly 3 dims here; the 4-D descriptors above (trailing 1) are refused."""
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"
    __slots__ = ()

    def __init__(self, shape3: tuple, dtype):
        super().__init__()
        a, b, c = shape3
        dims, strides = (ctypes.c_int * 3)(a, b, c), (ctypes.c_int * 3)(b * c, c, 1)
        L.cudnnSetTensorNdDescriptor(self, cudnn_dtype("rnn", dtype), 3, dims, strides)


class RNNDesc(OwnedDescriptor):
    """cudnnSetRNNDescriptor_v8 (+ cudnnRNNSetClip_v8). ``dropout`` is a dropout descriptor (ops/dropout.py's, kept
    alive here: cuDNN reads it at every training forward) or None."""
    _create, _destroy = "cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor"
    __slots__ = ("dropout",)

    CELLS = {"rnn_relu": cudnn.CUDNN_RNN_RELU, "rnn_tanh": cudnn.CUDNN_RNN_TANH, "lstm": cudnn.CUDNN_LSTM,
             "gru": cudnn.CUDNN_GRU}

    def __init__(self, mode: str, dtype, math: str, input_size: int, hidden: int, proj: int, layers: int,
                 bidirectional: bool, clip, clip_nan: bool, dropout):
        super().__init__()
        self.dropout = dropout
        dt = np.dtype(dtype)
        data = cudnn_dtype("RNN", dt)
        # NOTE: half data accumulates in float (mathPrec FLOAT) on tensor cores; float32 follows dnnbind's math mode
        # as convolutions do (FMA_MATH forbids TF32, DEFAULT_MATH allows it); double computes in double.
        if dt == np.float16:
            prec, math_type = cudnn.CUDNN_DATA_FLOAT, cudnn.CUDNN_TENSOR_OP_MATH
        elif dt == np.float64:
            prec, math_type = cudnn.CUDNN_DATA_DOUBLE, cudnn.CUDNN_DEFAULT_MATH
        else:
            prec = cudnn.CUDNN_DATA_FLOAT
            math_type = cudnn.CUDNN_DEFAULT_MATH if math == "tf32" else cudnn.CUDNN_FMA_MATH
        L.cudnnSetRNNDescriptor_v8(self, cudnn.CUDNN_RNN_ALGO_STANDARD, self.CELLS[mode], cudnn.CUDNN_RNN_DOUBLE_BIAS,
                                   cudnn.CUDNN_BIDIRECTIONAL if bidirectional else cudnn.CUDNN_UNIDIRECTIONAL,
                                   cudnn.CUDNN_LINEAR_INPUT, data, prec, math_type, input_size, hidden, proj, layers,
                                   dropout, cudnn.CUDNN_RNN_PADDED_IO_ENABLED)
        if clip is not None:
            nan = cudnn.CUDNN_NOT_PROPAGATE_NAN if clip_nan else cudnn.CUDNN_PROPAGATE_NAN
            L.cudnnRNNSetClip_v8(self, cudnn.CUDNN_RNN_CLIP_MINMAX, nan, float(clip[0]), float(clip[1]))


_ZERO_FILL = ctypes.c_double(0.0)  # the padding value of an RNN output: 8 zero bytes read as any data type


class RNNDataDesc(OwnedDescriptor):
    """cudnnSetRNNDataDescriptor, padded sequence-major (MXNet's TNC): ``lengths`` one per batch entry; padding in
    an output is filled with 0 (MXNet's outputs past a sequence's length)."""
    _create, _destroy = "cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor"
    __slots__ = ()

    def __init__(self, dtype, max_len: int, batch: int, vector: int, lengths: tuple):
        super().__init__()
        seq = (ctypes.c_int * batch)(*lengths)  # read by the call (host), not kept
        L.cudnnSetRNNDataDescriptor(self, cudnn_dtype("RNN", dtype), cudnn.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                    max_len, batch, vector, seq, ctypes.addressof(_ZERO_FILL))


def rnn_state(shape3: tuple, dtype) -> StateTensorDesc:
    key = ("rs", shape3, dtype)
    return _cache.get(key) or _insert(key, lambda: StateTensorDesc(shape3, dtype))


def rnn(mode: str, dtype, math: str, input_size: int, hidden: int, proj: int, layers: int, bidirectional: bool,
        clip, clip_nan: bool, dropout=None) -> RNNDesc:
    """The RNN descriptor for these settings; one per dropout descriptor (a per-handle RNG state and rate p)."""
    key = ("rnn", mode, dtype, math, input_size, hidden, proj, layers, bidirectional, clip, clip_nan,
           None if dropout is None else id(dropout))
    return _cache.get(key) or _insert(key, lambda: RNNDesc(mode, dtype, math, input_size, hidden, proj, layers,
                                                           bidirectional, clip, clip_nan, dropout))


def rnn_data(dtype, max_len: int, batch: int, vector: int, lengths: tuple) -> RNNDataDesc:
    key = ("rd", dtype, max_len, batch, vector, lengths)
    return _cache.get(key) or _insert(key, lambda: RNNDataDesc(dtype, max_len, batch, vector, lengths))


# --- CTC loss (ops/defs/ctc_loss.py) ---------------------------------------------------------------------------

class CTCLossDesc(OwnedDescriptor):
    """float32 compute, softmax applied inside (the input is unnormalized activations and the gradient is w.r.t.
    them), a zero gradient for a sample with no alignment, labels up to ``max_label`` long."""
    _create, _destroy = "cudnnCreateCTCLossDescriptor", "cudnnDestroyCTCLossDescriptor"
    __slots__ = ()

    def __init__(self, max_label: int):
        super().__init__()
        L.cudnnSetCTCLossDescriptor_v9(self, cudnn.CUDNN_DATA_FLOAT, cudnn.CUDNN_LOSS_NORMALIZATION_SOFTMAX,
                                       cudnn.CUDNN_CTC_ZERO_OOB_GRADIENTS, int(max_label))


def ctc_loss(max_label: int) -> CTCLossDesc:
    key = ("ctc", max_label)
    return _cache.get(key) or _insert(key, lambda: CTCLossDesc(max_label))


def ctc_tensor(shape3: tuple) -> StateTensorDesc:
    """The (T, N, A) float32 activations and gradients: a packed 3-D descriptor, as the RNN states'."""
    return rnn_state(tuple(shape3), np.float32)
