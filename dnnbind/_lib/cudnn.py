"""Layer 0 (_lib): cuDNN 9's legacy C API through ctypes. Imports nothing of dnnbind but _lib.

Every prototype below was checked against cudnn_{graph,ops,cnn}_v9.h of the nvidia-cudnn wheel (9.28).
Handles and descriptors are opaque pointers (c_void_p); arrays are device pointers as ints.
"""

from __future__ import annotations

import ctypes

from .cfunc import STATUS, Library, P, cstr, f64, i32, size_t, vp
from .errors import cudnn_error_class

# cudnnStatus_t families (cudnn_graph_v9.h); cudnnGetErrorString names any code.
CUDNN_STATUS_SUCCESS = 0
CUDNN_STATUS_NOT_INITIALIZED = 1001
CUDNN_STATUS_BAD_PARAM = 2000
CUDNN_STATUS_NOT_SUPPORTED = 3000
CUDNN_STATUS_INTERNAL_ERROR = 4000
CUDNN_STATUS_EXECUTION_FAILED = 5000

# cudnnDataType_t
CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF, CUDNN_DATA_INT8, CUDNN_DATA_INT32 = 0, 1, 2, 3, 4
CUDNN_DATA_BFLOAT16 = 9
# cudnnTensorFormat_t
CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC = 0, 1
# cudnnMathType_t
CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH = 0, 1, 2, 3
# cudnnNanPropagation_t
CUDNN_NOT_PROPAGATE_NAN, CUDNN_PROPAGATE_NAN = 0, 1
# cudnnConvolutionMode_t
CUDNN_CONVOLUTION, CUDNN_CROSS_CORRELATION = 0, 1
# cudnnActivationMode_t
CUDNN_ACTIVATION_SIGMOID, CUDNN_ACTIVATION_RELU, CUDNN_ACTIVATION_TANH = 0, 1, 2
CUDNN_ACTIVATION_CLIPPED_RELU, CUDNN_ACTIVATION_ELU, CUDNN_ACTIVATION_IDENTITY = 3, 4, 5
# cudnnPoolingMode_t
CUDNN_POOLING_MAX, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 0, 1
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, CUDNN_POOLING_MAX_DETERMINISTIC = 2, 3
# cudnnSoftmaxAlgorithm_t / cudnnSoftmaxMode_t
CUDNN_SOFTMAX_FAST, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_LOG = 0, 1, 2
CUDNN_SOFTMAX_MODE_INSTANCE, CUDNN_SOFTMAX_MODE_CHANNEL = 0, 1
# cudnnOpTensorOp_t
CUDNN_OP_TENSOR_ADD, CUDNN_OP_TENSOR_MUL, CUDNN_OP_TENSOR_MIN, CUDNN_OP_TENSOR_MAX = 0, 1, 2, 3
# libraryPropertyType
MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL = 0, 1, 2

FWD_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
             "WINOGRAD_NONFUSED")
BWD_DATA_ALGOS = ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED")
BWD_FILTER_ALGOS = ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING")


class cudnnConvolutionFwdAlgoPerf_t(ctypes.Structure):
    # Same layout for the BwdData and BwdFilter perf structs (cudnn_cnn_v9.h).
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


cudnnConvolutionBwdDataAlgoPerf_t = cudnnConvolutionFwdAlgoPerf_t
cudnnConvolutionBwdFilterAlgoPerf_t = cudnnConvolutionFwdAlgoPerf_t
_Perf = P(cudnnConvolutionFwdAlgoPerf_t)
_pi = P(i32)

_TABLE = {
    # size_t cudnnGetVersion(void)
    "cudnnGetVersion": (size_t, []),
    # size_t cudnnGetCudartVersion(void)
    "cudnnGetCudartVersion": (size_t, []),
    # cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value)
    "cudnnGetProperty": (STATUS, [i32, _pi]),
    # const char *cudnnGetErrorString(cudnnStatus_t status)
    "cudnnGetErrorString": (cstr, [i32]),
    # void cudnnGetLastErrorString(char *message, size_t max_size)
    "cudnnGetLastErrorString": (None, [ctypes.c_char_p, size_t]),
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
    "cudnnCreate": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
    "cudnnDestroy": (STATUS, [vp]),
    # cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
    "cudnnSetStream": (STATUS, [vp, vp]),
    # cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
    "cudnnCreateTensorDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetTensor4dDescriptor(desc, cudnnTensorFormat_t format, cudnnDataType_t dataType,
    #                                          int n, int c, int h, int w)
    "cudnnSetTensor4dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnSetTensorNdDescriptor(desc, cudnnDataType_t dataType, int nbDims, const int dimA[],
    #                                          const int strideA[])
    "cudnnSetTensorNdDescriptor": (STATUS, [vp, i32, i32, _pi, _pi]),
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
    "cudnnDestroyTensorDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc)
    "cudnnCreateFilterDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetFilter4dDescriptor(desc, cudnnDataType_t dataType, cudnnTensorFormat_t format,
    #                                          int k, int c, int h, int w)
    "cudnnSetFilter4dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc)
    "cudnnDestroyFilterDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc)
    "cudnnCreateConvolutionDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetConvolution2dDescriptor(desc, int pad_h, int pad_w, int u, int v, int dilation_h,
    #                                    int dilation_w, cudnnConvolutionMode_t mode, cudnnDataType_t computeType)
    "cudnnSetConvolution2dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount)
    "cudnnSetConvolutionGroupCount": (STATUS, [vp, i32]),
    # cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType)
    "cudnnSetConvolutionMathType": (STATUS, [vp, i32]),
    # cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(convDesc, inputTensorDesc, filterDesc,
    #                                                      int *n, int *c, int *h, int *w)
    "cudnnGetConvolution2dForwardOutputDim": (STATUS, [vp, vp, vp, _pi, _pi, _pi, _pi]),
    # cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc)
    "cudnnDestroyConvolutionDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count)
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (STATUS, [vp, _pi]),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (STATUS, [vp, _pi]),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (STATUS, [vp, _pi]),
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(handle, srcDesc, filterDesc, convDesc, destDesc,
    #                  const int requestedAlgoCount, int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perf)
    "cudnnGetConvolutionForwardAlgorithm_v7": (STATUS, [vp, vp, vp, vp, vp, i32, _pi, _Perf]),
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, filterDesc, diffDesc, convDesc,
    #                  gradDesc, const int requestedAlgoCount, int *returnedAlgoCount, ...Perf_t *perfResults)
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (STATUS, [vp, vp, vp, vp, vp, i32, _pi, _Perf]),
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, srcDesc, diffDesc, convDesc,
    #                  gradDesc, const int requestedAlgoCount, int *returnedAlgoCount, ...Perf_t *perfResults)
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (STATUS, [vp, vp, vp, vp, vp, i32, _pi, _Perf]),
    # cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc,
    #                                                      cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes)
    "cudnnGetConvolutionForwardWorkspaceSize": (STATUS, [vp, vp, vp, vp, vp, i32, P(size_t)]),
    # cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wDesc, dyDesc, convDesc, dxDesc,
    #                                                      cudnnConvolutionBwdDataAlgo_t algo, size_t *size)
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (STATUS, [vp, vp, vp, vp, vp, i32, P(size_t)]),
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xDesc, dyDesc, convDesc, gradDesc,
    #                                                      cudnnConvolutionBwdFilterAlgo_t algo, size_t *size)
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (STATUS, [vp, vp, vp, vp, vp, i32, P(size_t)]),
    # cudnnStatus_t cudnnConvolutionForward(handle, const void *alpha, xDesc, const void *x, wDesc,
    #     const void *w, convDesc, cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes,
    #     const void *beta, yDesc, void *y)
    "cudnnConvolutionForward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, i32, vp, size_t, vp, vp, vp]),
    # cudnnStatus_t cudnnConvolutionBiasActivationForward(handle, const void *alpha1, xDesc, const void *x,
    #     wDesc, const void *w, convDesc, algo, void *workSpace, size_t workSpaceSizeInBytes,
    #     const void *alpha2, zDesc, const void *z, biasDesc, const void *bias, activationDesc, yDesc, void *y)
    "cudnnConvolutionBiasActivationForward": (
        STATUS, [vp, vp, vp, vp, vp, vp, vp, i32, vp, size_t, vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnConvolutionBackwardData(handle, const void *alpha, wDesc, const void *w, dyDesc,
    #     const void *dy, convDesc, algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     dxDesc, void *dx)
    "cudnnConvolutionBackwardData": (STATUS, [vp, vp, vp, vp, vp, vp, vp, i32, vp, size_t, vp, vp, vp]),
    # cudnnStatus_t cudnnConvolutionBackwardFilter(handle, const void *alpha, xDesc, const void *x, dyDesc,
    #     const void *dy, convDesc, algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     dwDesc, void *dw)
    "cudnnConvolutionBackwardFilter": (STATUS, [vp, vp, vp, vp, vp, vp, vp, i32, vp, size_t, vp, vp, vp]),
    # cudnnStatus_t cudnnConvolutionBackwardBias(handle, const void *alpha, dyDesc, const void *dy,
    #     const void *beta, dbDesc, void *db)
    "cudnnConvolutionBackwardBias": (STATUS, [vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnAddTensor(handle, const void *alpha, aDesc, const void *A, const void *beta,
    #     cDesc, void *C)
    "cudnnAddTensor": (STATUS, [vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnCreateOpTensorDescriptor(cudnnOpTensorDescriptor_t *opTensorDesc)
    "cudnnCreateOpTensorDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetOpTensorDescriptor(desc, cudnnOpTensorOp_t op, cudnnDataType_t compType,
    #     cudnnNanPropagation_t nanOpt)
    "cudnnSetOpTensorDescriptor": (STATUS, [vp, i32, i32, i32]),
    "cudnnDestroyOpTensorDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnOpTensor(handle, opTensorDesc, const void *alpha1, aDesc, const void *A,
    #     const void *alpha2, bDesc, const void *B, const void *beta, cDesc, void *C)
    "cudnnOpTensor": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc)
    "cudnnCreateActivationDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetActivationDescriptor(desc, cudnnActivationMode_t mode,
    #     cudnnNanPropagation_t reluNanOpt, double coef)
    "cudnnSetActivationDescriptor": (STATUS, [vp, i32, i32, f64]),
    "cudnnDestroyActivationDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnActivationForward(handle, activationDesc, const void *alpha, xDesc, const void *x,
    #     const void *beta, yDesc, void *y)
    "cudnnActivationForward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnActivationBackward(handle, activationDesc, const void *alpha, yDesc, const void *y,
    #     dyDesc, const void *dy, xDesc, const void *x, const void *beta, dxDesc, void *dx)
    "cudnnActivationBackward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *poolingDesc)
    "cudnnCreatePoolingDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetPooling2dDescriptor(desc, cudnnPoolingMode_t mode, cudnnNanPropagation_t nanOpt,
    #     int windowHeight, int windowWidth, int verticalPadding, int horizontalPadding, int verticalStride,
    #     int horizontalStride)
    "cudnnSetPooling2dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32, i32, i32]),
    "cudnnDestroyPoolingDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnGetPooling2dForwardOutputDim(poolingDesc, inputTensorDesc, int *n, int *c, int *h,
    #     int *w)
    "cudnnGetPooling2dForwardOutputDim": (STATUS, [vp, vp, _pi, _pi, _pi, _pi]),
    # cudnnStatus_t cudnnPoolingForward(handle, poolingDesc, const void *alpha, xDesc, const void *x,
    #     const void *beta, yDesc, void *y)
    "cudnnPoolingForward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnPoolingBackward(handle, poolingDesc, const void *alpha, yDesc, const void *y,
    #     dyDesc, const void *dy, xDesc, const void *x, const void *beta, dxDesc, void *dx)
    "cudnnPoolingBackward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnSoftmaxForward(handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
    #     const void *alpha, xDesc, const void *x, const void *beta, yDesc, void *y)
    "cudnnSoftmaxForward": (STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnSoftmaxBackward(handle, algo, mode, const void *alpha, yDesc, const void *y,
    #     dyDesc, const void *dy, const void *beta, dxDesc, void *dx)
    "cudnnSoftmaxBackward": (STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp, vp, vp]),
}


def error_string(status: int) -> str:
    try:
        return (lib.cudnnGetErrorString(int(status)) or b"").decode(errors="replace")
    except Exception:  # the library itself may be what failed to load
        return ""


def last_error_string() -> str:
    """cuDNN's own account of the last failed check, e.g. ``(n <= 0) || (c <= 0) ...``."""
    buf = ctypes.create_string_buffer(1024)
    try:
        lib.cudnnGetLastErrorString(buf, len(buf))
    except Exception:
        return ""
    return buf.value.decode(errors="replace").strip()


def _errcheck(result, func, args):
    status = result.value if hasattr(result, "value") else int(result)
    if status != CUDNN_STATUS_SUCCESS:
        name, last = error_string(status), last_error_string()
        message = " - ".join(part for part in (name, last) if part)
        raise cudnn_error_class(status)(status, func.__name__, message)
    return status


lib = Library("cudnn", _TABLE, _errcheck)


def version() -> int:
    """cudnnGetVersion(): MAJOR*10000 + MINOR*100 + PATCH for cuDNN 9 (91900 is 9.19.0)."""
    return int(lib.cudnnGetVersion())


def version_tuple(v: int | None = None) -> tuple[int, int, int]:
    v = version() if v is None else int(v)
    if v >= 90000:
        return v // 10000, (v // 100) % 100, v % 100
    return v // 1000, (v // 100) % 10, v % 100  # cuDNN 8's MAJOR*1000 + MINOR*100 + PATCH
