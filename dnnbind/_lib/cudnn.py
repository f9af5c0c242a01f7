"""Layer 0 (_lib): cuDNN 9's legacy C API through ctypes. Imports nothing of dnnbind but _lib.

Every prototype below was checked against cudnn_{graph,ops,cnn}_v9.h of the nvidia-cudnn wheel (9.28).
Handles and descriptors are opaque pointers (c_void_p); arrays are device pointers as ints.

The backend (graph) API (cudnnBackend*, used by ops.conv_backend) is declared here too; its enum values are
copied from cudnn_graph_v9.h (9.28) and tests/test_conv_backend.py checks them against that header's text.
"""

from __future__ import annotations

import ctypes

from .cfunc import STATUS, Library, P, cstr, f32, f64, i32, i64, size_t, vp
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
# cudnnLRNMode_t
CUDNN_LRN_CROSS_CHANNEL_DIM1 = 0
# cudnnSoftmaxAlgorithm_t / cudnnSoftmaxMode_t
CUDNN_SOFTMAX_FAST, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_LOG = 0, 1, 2
CUDNN_SOFTMAX_MODE_INSTANCE, CUDNN_SOFTMAX_MODE_CHANNEL = 0, 1
# cudnnOpTensorOp_t
CUDNN_OP_TENSOR_ADD, CUDNN_OP_TENSOR_MUL, CUDNN_OP_TENSOR_MIN, CUDNN_OP_TENSOR_MAX = 0, 1, 2, 3
CUDNN_OP_TENSOR_SQRT, CUDNN_OP_TENSOR_NOT = 4, 5
# cudnnReduceTensorOp_t (cudnn_graph_v9.h)
CUDNN_REDUCE_TENSOR_ADD, CUDNN_REDUCE_TENSOR_MUL, CUDNN_REDUCE_TENSOR_MIN, CUDNN_REDUCE_TENSOR_MAX = 0, 1, 2, 3
CUDNN_REDUCE_TENSOR_AMAX, CUDNN_REDUCE_TENSOR_AVG, CUDNN_REDUCE_TENSOR_NORM1, CUDNN_REDUCE_TENSOR_NORM2 = 4, 5, 6, 7
CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS = 8
# cudnnReduceTensorIndices_t / cudnnIndicesType_t (cudnn_ops_v9.h; only 32-bit indices are implemented)
CUDNN_REDUCE_TENSOR_NO_INDICES, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES = 0, 1
CUDNN_32BIT_INDICES, CUDNN_64BIT_INDICES, CUDNN_16BIT_INDICES, CUDNN_8BIT_INDICES = 0, 1, 2, 3
# #define CUDNN_DIM_MAX (cudnn_graph_v9.h): the most dimensions a tensor descriptor takes
CUDNN_DIM_MAX = 8
# libraryPropertyType
MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL = 0, 1, 2

# --- Backend (graph) API enums, all from cudnn_graph_v9.h (9.28) -------------------------------------------
# cudnnBackendDescriptorType_t
CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1
CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2
CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3
CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4
CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5
CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR = 7
CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15
CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16
CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17
# cudnnBackendAttributeName_t. NOTE: the header's prose calls 101 "CUDNN_ATTR_CONVOLUTION_MODE"; the enum
# spells it CUDNN_ATTR_CONVOLUTION_CONV_MODE.
CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_ATTR_CONVOLUTION_CONV_MODE = 100, 101
CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 102, 103
CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 104, 105
CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106
CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_RESULTS = 200, 201, 202
CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES = 300, 302
CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE = 303
CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400  # deprecated in the header, still documented as required there
CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401
CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402
CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION = 405
CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE = 600, 601
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800  # deprecated in the header, still documented as required there
CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 801, 802
CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_ATTR_TENSOR_DATA_TYPE = 900, 901
CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES = 902, 903
CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_IS_VIRTUAL = 906, 907
CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1000, 1001
CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003
CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_ATTR_ENGINE_GLOBAL_INDEX = 1300, 1301
CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE = 1303, 1305
# cudnnBackendAttributeType_t
CUDNN_TYPE_HANDLE, CUDNN_TYPE_DATA_TYPE, CUDNN_TYPE_BOOLEAN, CUDNN_TYPE_INT64 = 0, 1, 2, 3
CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, CUDNN_TYPE_VOID_PTR, CUDNN_TYPE_CONVOLUTION_MODE = 4, 5, 6, 7
CUDNN_TYPE_HEUR_MODE, CUDNN_TYPE_KNOB_TYPE, CUDNN_TYPE_NUMERICAL_NOTE = 8, 9, 11
CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_TYPE_CHAR = 15, 19, 24
# cudnnBackendHeurMode_t (A is the decision tree preferred over INSTANT; FALLBACK: functional, unoptimized)
CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK, CUDNN_HEUR_MODE_A = 0, 1, 2, 3
# cudnnBackendNumericalNote_t
CUDNN_NUMERICAL_NOTE_TENSOR_CORE, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS = 0, 1
CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION, CUDNN_NUMERICAL_NOTE_FFT = 2, 3
CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, CUDNN_NUMERICAL_NOTE_WINOGRAD = 4, 5
CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 = 6, 7
CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13, CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP = 8, 9
CUDNN_NUMERICAL_NOTE_TYPE_COUNT = 10
# cudnnBackendBehaviorNote_t
CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION, CUDNN_BEHAVIOR_NOTE_REQUIRES_FILTER_INT8x32_REORDER = 0, 1
CUDNN_BEHAVIOR_NOTE_REQUIRES_BIAS_INT8x32_REORDER, CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API = 2, 3
CUDNN_BEHAVIOR_NOTE_CUBLASLT_DEPENDENCY, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT = 4, 5
# cudnnBackendKnobType_t: only the count (the size of a knob-choice array)
CUDNN_KNOB_TYPE_COUNTS = 46  # 9.28's; older cuDNN has fewer (9.19: 44). Used as a capacity only.
# Pointwise ops (ops.conv_backend's fused conv + bias + ReLU graph)
CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR = 0, 13
CUDNN_ATTR_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MATH_PREC = 0, 1
CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP = 3, 4
CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE = 5
CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC = 750, 751
CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC = 752, 753
CUDNN_TYPE_POINTWISE_MODE = 14
# cudnnPointwiseMode_t
CUDNN_POINTWISE_ADD, CUDNN_POINTWISE_RELU_FWD = 0, 100

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
_u64 = ctypes.c_ulonglong  # unsigned long long (the dropout seed)

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
    # cudnnStatus_t cudnnSetTensorNdDescriptorEx(desc, cudnnTensorFormat_t format, cudnnDataType_t dataType,
    #                                            int nbDims, const int dimA[])
    "cudnnSetTensorNdDescriptorEx": (STATUS, [vp, i32, i32, i32, _pi]),
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
    "cudnnDestroyTensorDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc)
    "cudnnCreateFilterDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetFilter4dDescriptor(desc, cudnnDataType_t dataType, cudnnTensorFormat_t format,
    #                                          int k, int c, int h, int w)
    "cudnnSetFilter4dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnSetFilterNdDescriptor(desc, cudnnDataType_t dataType, cudnnTensorFormat_t format,
    #                                          int nbDims, const int filterDimA[])
    "cudnnSetFilterNdDescriptor": (STATUS, [vp, i32, i32, i32, _pi]),
    # cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc)
    "cudnnDestroyFilterDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc)
    "cudnnCreateConvolutionDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetConvolution2dDescriptor(desc, int pad_h, int pad_w, int u, int v, int dilation_h,
    #                                    int dilation_w, cudnnConvolutionMode_t mode, cudnnDataType_t computeType)
    "cudnnSetConvolution2dDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnSetConvolutionNdDescriptor(desc, int arrayLength, const int padA[],
    #     const int filterStrideA[], const int dilationA[], cudnnConvolutionMode_t mode, cudnnDataType_t computeType)
    "cudnnSetConvolutionNdDescriptor": (STATUS, [vp, i32, _pi, _pi, _pi, i32, i32]),
    # cudnnStatus_t cudnnGetConvolutionNdForwardOutputDim(convDesc, inputTensorDesc, filterDesc, int nbDims,
    #                                                     int tensorOuputDimA[])
    "cudnnGetConvolutionNdForwardOutputDim": (STATUS, [vp, vp, vp, i32, _pi]),
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
    # cudnnStatus_t cudnnSetPoolingNdDescriptor(desc, const cudnnPoolingMode_t mode,
    #     const cudnnNanPropagation_t maxpoolingNanOpt, int nbDims, const int windowDimA[], const int paddingA[],
    #     const int strideA[])
    "cudnnSetPoolingNdDescriptor": (STATUS, [vp, i32, i32, i32, _pi, _pi, _pi]),
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
    # cudnnStatus_t cudnnCreateLRNDescriptor(cudnnLRNDescriptor_t *normDesc)
    "cudnnCreateLRNDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetLRNDescriptor(normDesc, unsigned lrnN, double lrnAlpha, double lrnBeta, double lrnK)
    "cudnnSetLRNDescriptor": (STATUS, [vp, ctypes.c_uint, f64, f64, f64]),
    "cudnnDestroyLRNDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnLRNCrossChannelForward(handle, normDesc, cudnnLRNMode_t lrnMode, const void *alpha,
    #     xDesc, const void *x, const void *beta, yDesc, void *y)
    "cudnnLRNCrossChannelForward": (STATUS, [vp, vp, i32, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnLRNCrossChannelBackward(handle, normDesc, lrnMode, const void *alpha, yDesc,
    #     const void *y, dyDesc, const void *dy, xDesc, const void *x, const void *beta, dxDesc, void *dx)
    "cudnnLRNCrossChannelBackward": (STATUS, [vp, vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnSoftmaxForward(handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
    #     const void *alpha, xDesc, const void *x, const void *beta, yDesc, void *y)
    "cudnnSoftmaxForward": (STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnSoftmaxBackward(handle, algo, mode, const void *alpha, yDesc, const void *y,
    #     dyDesc, const void *dy, const void *beta, dxDesc, void *dx)
    "cudnnSoftmaxBackward": (STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp, vp, vp]),
    # --- backend (graph) API, cudnn_graph_v9.h; cudnnBackendDescriptor_t is void* ---------------------------
    # cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
    #                                            cudnnBackendDescriptor_t *descriptor)
    "cudnnBackendCreateDescriptor": (STATUS, [i32, P(vp)]),
    # cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
    "cudnnBackendDestroyDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
    "cudnnBackendFinalize": (STATUS, [vp]),
    # cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t elementCount, const void *arrayOfElements)
    "cudnnBackendSetAttribute": (STATUS, [vp, i32, i32, i64, vp]),
    # cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t requestedElementCount, int64_t *elementCount, void *arrayOfElements)
    "cudnnBackendGetAttribute": (STATUS, [vp, i32, i32, i64, P(i64), vp]),
    # cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
    #     cudnnBackendDescriptor_t variantPack)
    "cudnnBackendExecute": (STATUS, [vp, vp, vp]),
    # --- N-d tensor ops (ops.tensor_ops), cudnn_ops_v9.h -----------------------------------------------------
    # cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc, int nbDimsRequested,
    #     cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[])
    "cudnnGetTensorNdDescriptor": (STATUS, [vp, i32, _pi, _pi, _pi, _pi]),
    # cudnnStatus_t cudnnTransformTensor(handle, const void *alpha, xDesc, const void *x, const void *beta,
    #     yDesc, void *y)
    "cudnnTransformTensor": (STATUS, [vp, vp, vp, vp, vp, vp, vp]),
    # cudnnStatus_t cudnnSetTensor(handle, const cudnnTensorDescriptor_t yDesc, void *y, const void *valuePtr)
    "cudnnSetTensor": (STATUS, [vp, vp, vp, vp]),
    # cudnnStatus_t cudnnScaleTensor(handle, const cudnnTensorDescriptor_t yDesc, void *y, const void *alpha)
    "cudnnScaleTensor": (STATUS, [vp, vp, vp, vp]),
    # cudnnStatus_t cudnnGetOpTensorDescriptor(const cudnnOpTensorDescriptor_t opTensorDesc,
    #     cudnnOpTensorOp_t *opTensorOp, cudnnDataType_t *opTensorCompType, cudnnNanPropagation_t *opTensorNanOpt)
    "cudnnGetOpTensorDescriptor": (STATUS, [vp, _pi, _pi, _pi]),
    # cudnnStatus_t cudnnCreateReduceTensorDescriptor(cudnnReduceTensorDescriptor_t *reduceTensorDesc)
    "cudnnCreateReduceTensorDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnSetReduceTensorDescriptor(desc, cudnnReduceTensorOp_t reduceTensorOp,
    #     cudnnDataType_t reduceTensorCompType, cudnnNanPropagation_t reduceTensorNanOpt,
    #     cudnnReduceTensorIndices_t reduceTensorIndices, cudnnIndicesType_t reduceTensorIndicesType)
    "cudnnSetReduceTensorDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnGetReduceTensorDescriptor(const desc, cudnnReduceTensorOp_t *reduceTensorOp,
    #     cudnnDataType_t *reduceTensorCompType, cudnnNanPropagation_t *reduceTensorNanOpt,
    #     cudnnReduceTensorIndices_t *reduceTensorIndices, cudnnIndicesType_t *reduceTensorIndicesType)
    "cudnnGetReduceTensorDescriptor": (STATUS, [vp, _pi, _pi, _pi, _pi, _pi]),
    # cudnnStatus_t cudnnDestroyReduceTensorDescriptor(cudnnReduceTensorDescriptor_t reduceTensorDesc)
    "cudnnDestroyReduceTensorDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnGetReductionIndicesSize(handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc,
    #     const cudnnTensorDescriptor_t aDesc, const cudnnTensorDescriptor_t cDesc, size_t *sizeInBytes)
    "cudnnGetReductionIndicesSize": (STATUS, [vp, vp, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnGetReductionWorkspaceSize(handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc,
    #     const cudnnTensorDescriptor_t aDesc, const cudnnTensorDescriptor_t cDesc, size_t *sizeInBytes)
    "cudnnGetReductionWorkspaceSize": (STATUS, [vp, vp, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnReduceTensor(handle, const cudnnReduceTensorDescriptor_t reduceTensorDesc,
    #     void *indices, size_t indicesSizeInBytes, void *workspace, size_t workspaceSizeInBytes,
    #     const void *alpha, aDesc, const void *A, const void *beta, cDesc, void *C)
    "cudnnReduceTensor": (STATUS, [vp, vp, vp, size_t, vp, size_t, vp, vp, vp, vp, vp, vp]),
    # --- batch normalization (ops.batchnorm), cudnn_ops_v9.h; deprecated since 9.0, exported by every 9.x ----
    # cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
    #     const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode)
    "cudnnDeriveBNTensorDescriptor": (STATUS, [vp, vp, i32]),
    # cudnnStatus_t cudnnBatchNormalizationForwardTraining(handle, cudnnBatchNormMode_t mode, const void *alpha,
    #     const void *beta, xDesc, const void *x, yDesc, void *y, bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    #     void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance)
    "cudnnBatchNormalizationForwardTraining": (
        STATUS, [vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, f64, vp, vp, f64, vp, vp]),
    # cudnnStatus_t cudnnBatchNormalizationForwardInference(handle, cudnnBatchNormMode_t mode,
    #     const void *alpha, const void *beta, xDesc, const void *x, yDesc, void *y, bnScaleBiasMeanVarDesc,
    #     const void *bnScale, const void *bnBias, const void *estimatedMean, const void *estimatedVariance,
    #     double epsilon)
    "cudnnBatchNormalizationForwardInference": (STATUS, [vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f64]),
    # cudnnStatus_t cudnnBatchNormalizationBackward(handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    #     const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff, xDesc, const void *x,
    #     dyDesc, const void *dy, dxDesc, void *dx, dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    #     void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance)
    "cudnnBatchNormalizationBackward": (
        STATUS, [vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f64, vp, vp]),
    # --- fused BatchNorm + add + ReLU (ops.batchnorm_fused), cudnn_ops_v9.h; deprecated since 9.0, exported by 9.x ---
    # cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, bnOps, xDesc, zDesc,
    #     yDesc, bnScaleBiasMeanVarDesc, activationDesc, size_t *sizeInBytes)
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": (STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, mode, bnOps, xDesc, yDesc, dyDesc,
    #     dzDesc, dxDesc, dBnScaleBiasDesc, activationDesc, size_t *sizeInBytes)
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": (
        STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, bnOps, activationDesc, xDesc,
    #     size_t *sizeInBytes)   (mode: cudnnBatchNormMode_t, bnOps: cudnnBatchNormOps_t, both enums)
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": (STATUS, [vp, i32, i32, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(handle, mode, bnOps, const void *alpha, const void *beta,
    #     xDesc, const void *xData, zDesc, const void *zData, yDesc, void *yData, bnScaleBiasMeanVarDesc,
    #     const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    #     void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    #     activationDesc, void *workspace, size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSize)
    "cudnnBatchNormalizationForwardTrainingEx": (
        STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f64, vp, vp, f64, vp, vp, vp, vp, size_t,
                 vp, size_t]),
    # cudnnStatus_t cudnnBatchNormalizationBackwardEx(handle, mode, bnOps, const void *alphaDataDiff,
    #     const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff, xDesc, const void *xData,
    #     yDesc, const void *yData, dyDesc, const void *dyData, dzDesc, void *dzData, dxDesc, void *dxData,
    #     dBnScaleBiasDesc, const void *bnScaleData, const void *bnBiasData, void *dBnScaleData, void *dBnBiasData,
    #     double epsilon, const void *savedMean, const void *savedInvVariance, activationDesc, void *workSpace,
    #     size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes)
    "cudnnBatchNormalizationBackwardEx": (
        STATUS, [vp, i32, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, f64, vp,
                 vp, vp, vp, size_t, vp, size_t]),
    # --- dropout (ops.dropout), cudnn_ops_v9.h; cudnnDropoutBackward sits in its training section -------------
    # cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *dropoutDesc)
    "cudnnCreateDropoutDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc)
    "cudnnDestroyDropoutDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *sizeInBytes)
    "cudnnDropoutGetStatesSize": (STATUS, [vp, P(size_t)]),
    # cudnnStatus_t cudnnDropoutGetReserveSpaceSize(cudnnTensorDescriptor_t xdesc, size_t *sizeInBytes)
    "cudnnDropoutGetReserveSpaceSize": (STATUS, [vp, P(size_t)]),
    # cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc, cudnnHandle_t handle,
    #     float dropout, void *states, size_t stateSizeInBytes, unsigned long long seed)
    "cudnnSetDropoutDescriptor": (STATUS, [vp, vp, f32, vp, size_t, _u64]),
    # cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc, cudnnHandle_t handle,
    #     float dropout, void *states, size_t stateSizeInBytes, unsigned long long seed)
    "cudnnRestoreDropoutDescriptor": (STATUS, [vp, vp, f32, vp, size_t, _u64]),
    # cudnnStatus_t cudnnGetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc, cudnnHandle_t handle,
    #     float *dropout, void **states, unsigned long long *seed)
    "cudnnGetDropoutDescriptor": (STATUS, [vp, vp, P(f32), P(vp), P(_u64)]),
    # cudnnStatus_t cudnnDropoutForward(cudnnHandle_t handle, const cudnnDropoutDescriptor_t dropoutDesc,
    #     const cudnnTensorDescriptor_t xdesc, const void *x, const cudnnTensorDescriptor_t ydesc, void *y,
    #     void *reserveSpace, size_t reserveSpaceSizeInBytes)
    "cudnnDropoutForward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, size_t]),
    # cudnnStatus_t cudnnDropoutBackward(cudnnHandle_t handle, const cudnnDropoutDescriptor_t dropoutDesc,
    #     const cudnnTensorDescriptor_t dydesc, const void *dy, const cudnnTensorDescriptor_t dxdesc, void *dx,
    #     void *reserveSpace, size_t reserveSpaceSizeInBytes)
    "cudnnDropoutBackward": (STATUS, [vp, vp, vp, vp, vp, vp, vp, size_t]),
}

# cudnnBatchNormMode_t (cudnn_ops_v9.h) and CUDNN_BN_MIN_EPSILON (0.0 since cuDNN 7.5; a #define)
CUDNN_BATCHNORM_PER_ACTIVATION, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_SPATIAL_PERSISTENT = 0, 1, 2
CUDNN_BN_MIN_EPSILON = 0.0
# cudnnBatchNormOps_t (the *Ex calls: ops.batchnorm_fused)
CUDNN_BATCHNORM_OPS_BN, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION = 0, 1, 2


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

# --- RNN (the fused RNN operator, ops/defs/rnn.py), cudnn_adv_v9.h; libcudnn.so.9 exports them and loads
# libcudnn_adv.so.9 itself. Every enum and prototype below was checked against cudnn_adv.h of the nvidia-cudnn wheel
# (9.28); the cuDNN 7 RNN calls (cudnnRNNForwardTraining, cudnnGetRNNLinLayerMatrixParams, ...) are gone in 9. ----
# cudnnRNNAlgo_t
CUDNN_RNN_ALGO_STANDARD, CUDNN_RNN_ALGO_PERSIST_STATIC, CUDNN_RNN_ALGO_PERSIST_DYNAMIC = 0, 1, 2
CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H = 3
# cudnnForwardMode_t
CUDNN_FWD_MODE_INFERENCE, CUDNN_FWD_MODE_TRAINING = 0, 1
# cudnnRNNMode_t (the cell)
CUDNN_RNN_RELU, CUDNN_RNN_TANH, CUDNN_LSTM, CUDNN_GRU = 0, 1, 2, 3
# cudnnRNNBiasMode_t (DOUBLE: an input and a recurrent bias per gate, MXNet's i2h and h2h biases)
CUDNN_RNN_NO_BIAS, CUDNN_RNN_SINGLE_INP_BIAS, CUDNN_RNN_DOUBLE_BIAS, CUDNN_RNN_SINGLE_REC_BIAS = 0, 1, 2, 3
# cudnnDirectionMode_t
CUDNN_UNIDIRECTIONAL, CUDNN_BIDIRECTIONAL = 0, 1
# cudnnRNNInputMode_t
CUDNN_LINEAR_INPUT, CUDNN_SKIP_INPUT = 0, 1
# cudnnRNNClipMode_t
CUDNN_RNN_CLIP_NONE, CUDNN_RNN_CLIP_MINMAX = 0, 1
# cudnnRNNDataLayout_t. NOTE: 0 is the *padded* (unpacked) sequence-major layout, MXNet's TNC with lengths;
# PACKED (1) drops the padding and needs lengths sorted in decreasing order.
CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED = 0, 1
CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED = 2
# auxFlags of cudnnSetRNNDescriptor_v8 (#defines)
CUDNN_RNN_PADDED_IO_DISABLED, CUDNN_RNN_PADDED_IO_ENABLED = 0, 1
# cudnnWgradMode_t
CUDNN_WGRAD_MODE_ADD, CUDNN_WGRAD_MODE_SET = 0, 1

_TABLE.update({
    # cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *rnnDesc)
    "cudnnCreateRNNDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t rnnDesc)
    "cudnnDestroyRNNDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t rnnDesc, cudnnRNNAlgo_t algo,
    #     cudnnRNNMode_t cellMode, cudnnRNNBiasMode_t biasMode, cudnnDirectionMode_t dirMode,
    #     cudnnRNNInputMode_t inputMode, cudnnDataType_t dataType, cudnnDataType_t mathPrec, cudnnMathType_t mathType,
    #     int32_t inputSize, int32_t hiddenSize, int32_t projSize, int32_t numLayers,
    #     cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags)
    "cudnnSetRNNDescriptor_v8": (STATUS, [vp, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, vp,
                                          ctypes.c_uint32]),
    # cudnnStatus_t cudnnRNNSetClip_v8(cudnnRNNDescriptor_t rnnDesc, cudnnRNNClipMode_t clipMode,
    #     cudnnNanPropagation_t clipNanOpt, double lclip, double rclip)
    "cudnnRNNSetClip_v8": (STATUS, [vp, i32, i32, f64, f64]),
    # cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *rnnDataDesc)
    "cudnnCreateRNNDataDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc)
    "cudnnDestroyRNNDataDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc, cudnnDataType_t dataType,
    #     cudnnRNNDataLayout_t layout, int maxSeqLength, int batchSize, int vectorSize,
    #     const int seqLengthArray[] (host), void *paddingFill (host, a value of dataType))
    "cudnnSetRNNDataDescriptor": (STATUS, [vp, i32, i32, i32, i32, i32, _pi, vp]),
    # cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     size_t *weightSpaceSize)
    "cudnnGetRNNWeightSpaceSize": (STATUS, [vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc, int32_t pseudoLayer,
    #     size_t weightSpaceSize, const void *weightSpace, int32_t linLayerID, cudnnTensorDescriptor_t mDesc,
    #     void **mAddr, cudnnTensorDescriptor_t bDesc, void **bAddr)
    "cudnnGetRNNWeightParams": (STATUS, [vp, vp, i32, size_t, vp, i32, vp, P(vp), vp, P(vp)]),
    # cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnForwardMode_t fwdMode, cudnnRNNDataDescriptor_t xDesc, size_t *workSpaceSize,
    #     size_t *reserveSpaceSize)
    "cudnnGetRNNTempSpaceSizes": (STATUS, [vp, vp, i32, vp, P(size_t), P(size_t)]),
    # cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc, cudnnForwardMode_t fwdMode,
    #     const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc, const void *x,
    #     cudnnRNNDataDescriptor_t yDesc, void *y, cudnnTensorDescriptor_t hDesc, const void *hx, void *hy,
    #     cudnnTensorDescriptor_t cDesc, const void *cx, void *cy, size_t weightSpaceSize,
    #     const void *weightSpace, size_t workSpaceSize, void *workSpace, size_t reserveSpaceSize,
    #     void *reserveSpace)
    "cudnnRNNForward": (STATUS, [vp, vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, size_t, vp, size_t, vp,
                                 size_t, vp]),
    # cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t yDesc, const void *y, const void *dy,
    #     cudnnRNNDataDescriptor_t xDesc, void *dx, cudnnTensorDescriptor_t hDesc, const void *hx,
    #     const void *dhy, void *dhx, cudnnTensorDescriptor_t cDesc, const void *cx, const void *dcy, void *dcx,
    #     size_t weightSpaceSize, const void *weightSpace, size_t workSpaceSize, void *workSpace,
    #     size_t reserveSpaceSize, void *reserveSpace)
    "cudnnRNNBackwardData_v8": (STATUS, [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, size_t, vp,
                                         size_t, vp, size_t, vp]),
    # cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnWgradMode_t addGrad, const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc, const void *x,
    #     cudnnTensorDescriptor_t hDesc, const void *hx, cudnnRNNDataDescriptor_t yDesc, const void *y,
    #     size_t weightSpaceSize, void *dweightSpace, size_t workSpaceSize, void *workSpace,
    #     size_t reserveSpaceSize, void *reserveSpace)
    # NOTE: ADD accumulates into dweightSpace: zero it first.
    "cudnnRNNBackwardWeights_v8": (STATUS, [vp, vp, i32, vp, vp, vp, vp, vp, vp, vp, size_t, vp, size_t, vp,
                                            size_t, vp]),
})

# --- CTC loss (the CTCLoss operator, ops/defs/ctc_loss.py), cudnn_adv.h / cudnn_graph.h / cudnn_ops.h of the
# nvidia-cudnn wheel (9.28). The _v8 loss and workspace calls take labels and lengths in device memory (so they
# neither synchronize nor refuse a CUDA graph); the descriptor is set with _v9 (cudnnSetCTCLossDescriptor_v8 is
# deprecated in 9 and takes a cudnnNanPropagation_t where _v9 takes a cudnnCTCGradMode_t). ----------------------
# cudnnLossNormalizationMode_t. SOFTMAX: the input is unnormalized activations and the gradient is w.r.t. them
CUDNN_LOSS_NORMALIZATION_NONE, CUDNN_LOSS_NORMALIZATION_SOFTMAX = 0, 1
# cudnnCTCGradMode_t (cudnn_graph.h): what the gradient of a sample with no alignment (L + repeats > T) is
CUDNN_CTC_ZERO_OOB_GRADIENTS, CUDNN_CTC_SKIP_OOB_GRADIENTS = 0, 1
# cudnnCTCLossAlgo_t (cudnn_ops.h)
CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC = 0, 1

_TABLE.update({
    # cudnnStatus_t cudnnCreateCTCLossDescriptor(cudnnCTCLossDescriptor_t *ctcLossDesc)
    "cudnnCreateCTCLossDescriptor": (STATUS, [P(vp)]),
    # cudnnStatus_t cudnnDestroyCTCLossDescriptor(cudnnCTCLossDescriptor_t ctcLossDesc)
    "cudnnDestroyCTCLossDescriptor": (STATUS, [vp]),
    # cudnnStatus_t cudnnSetCTCLossDescriptor_v9(cudnnCTCLossDescriptor_t ctcLossDesc, cudnnDataType_t compType,
    #     cudnnLossNormalizationMode_t normMode, cudnnCTCGradMode_t ctcGradMode, int maxLabelLength)
    "cudnnSetCTCLossDescriptor_v9": (STATUS, [vp, i32, i32, i32, i32]),
    # cudnnStatus_t cudnnGetCTCLossWorkspaceSize_v8(cudnnHandle_t handle, cudnnCTCLossAlgo_t algo,
    #     cudnnCTCLossDescriptor_t ctcLossDesc, const cudnnTensorDescriptor_t probsDesc,
    #     const cudnnTensorDescriptor_t gradientsDesc, size_t *sizeInBytes)
    "cudnnGetCTCLossWorkspaceSize_v8": (STATUS, [vp, i32, vp, vp, vp, P(size_t)]),
    # cudnnStatus_t cudnnCTCLoss_v8(cudnnHandle_t handle, cudnnCTCLossAlgo_t algo, cudnnCTCLossDescriptor_t ctcLossDesc,
    #     const cudnnTensorDescriptor_t probsDesc, const void *probs, const int labels[] (device),
    #     const int labelLengths[] (device), const int inputLengths[] (device), void *costs,
    #     const cudnnTensorDescriptor_t gradientsDesc, void *gradients, size_t workSpaceSizeInBytes,
    #     void *workspace)
    # NOTE: labels are the sequences' labels concatenated (packed, as cudnnCTCLoss's host labels), values in
    # [1, A - 1]: class 0 is the blank.
    "cudnnCTCLoss_v8": (STATUS, [vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, vp, size_t, vp]),
})
