"""Layer 0 (_lib): cuBLAS through ctypes, ``_v2`` names only. Imports nothing of dnnbind but _lib.

NOTE: libcublas exports both ``cublasSgemm_v2(handle, ...)`` and a legacy handle-less ``cublasSgemm(char, ...)``;
calling the legacy one with a handle corrupts the stack silently. Only ``_v2`` names are declared here.
Prototypes checked against cublas_api.h of the nvidia-cublas wheel (12.9).
"""

from __future__ import annotations

from .cfunc import STATUS, Library, P, cstr, i32, i64, size_t, vp
from .errors import CublasError

CUBLAS_STATUS_SUCCESS = 0
CUBLAS_STATUS_NOT_INITIALIZED = 1
# cublasOperation_t
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
# cublasSideMode_t, cublasFillMode_t, cublasDiagType_t (for trsm)
CUBLAS_SIDE_LEFT, CUBLAS_SIDE_RIGHT = 0, 1
CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER = 0, 1
CUBLAS_DIAG_NON_UNIT, CUBLAS_DIAG_UNIT = 0, 1
# cublasPointerMode_t
CUBLAS_POINTER_MODE_HOST, CUBLAS_POINTER_MODE_DEVICE = 0, 1
# cublasMath_t
CUBLAS_DEFAULT_MATH, CUBLAS_PEDANTIC_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 2, 3
CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
# cudaDataType (library_types.h), cublasComputeType_t, cublasGemmAlgo_t: what cublasGemmEx takes for float16
CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

_STATUS_NAMES = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
                 7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH",
                 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
                 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
                 16: "CUBLAS_STATUS_LICENSE_ERROR"}

_pf = vp  # const float* / const double* alpha, beta: host pointers (pointer mode host), passed as ints

_TABLE = {
    # cublasStatus_t cublasCreate_v2(cublasHandle_t* handle)
    "cublasCreate_v2": (STATUS, [P(vp)]),
    # cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
    "cublasDestroy_v2": (STATUS, [vp]),
    # cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version)
    "cublasGetVersion_v2": (STATUS, [vp, P(i32)]),
    # cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value)
    "cublasGetProperty": (STATUS, [i32, P(i32)]),
    # const char* cublasGetStatusName(cublasStatus_t status)
    "cublasGetStatusName": (cstr, [i32]),
    # const char* cublasGetStatusString(cublasStatus_t status)
    "cublasGetStatusString": (cstr, [i32]),
    # cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
    "cublasSetStream_v2": (STATUS, [vp, vp]),
    # cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
    "cublasSetMathMode": (STATUS, [vp, i32]),
    # cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
    "cublasSetPointerMode_v2": (STATUS, [vp, i32]),
    # cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes)
    "cublasSetWorkspace_v2": (STATUS, [vp, vp, size_t]),
    # cublasStatus_t cublasSgemm_v2(handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    #     int k, const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
    #     float* C, int ldc)
    "cublasSgemm_v2": (STATUS, [vp, i32, i32, i32, i32, i32, _pf, vp, i32, vp, i32, _pf, vp, i32]),
    # cublasStatus_t cublasDgemm_v2(...same with double...)
    "cublasDgemm_v2": (STATUS, [vp, i32, i32, i32, i32, i32, _pf, vp, i32, vp, i32, _pf, vp, i32]),
    # cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
    #     int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
    #     cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
    #     cublasComputeType_t computeType, cublasGemmAlgo_t algo)
    "cublasGemmEx": (STATUS, [vp, i32, i32, i32, i32, i32, _pf, vp, i32, i32, vp, i32, i32, _pf, vp, i32, i32, i32,
                              i32]),
    # cublasStatus_t cublasSgemv_v2(handle, cublasOperation_t trans, int m, int n, const float* alpha,
    #     const float* A, int lda, const float* x, int incx, const float* beta, float* y, int incy)
    "cublasSgemv_v2": (STATUS, [vp, i32, i32, i32, _pf, vp, i32, vp, i32, _pf, vp, i32]),
    "cublasDgemv_v2": (STATUS, [vp, i32, i32, i32, _pf, vp, i32, vp, i32, _pf, vp, i32]),
    # cublasStatus_t cublasSaxpy_v2(handle, int n, const float* alpha, const float* x, int incx, float* y,
    #     int incy)
    "cublasSaxpy_v2": (STATUS, [vp, i32, _pf, vp, i32, vp, i32]),
    "cublasDaxpy_v2": (STATUS, [vp, i32, _pf, vp, i32, vp, i32]),
    # cublasStatus_t cublasSscal_v2(handle, int n, const float* alpha, float* x, int incx)
    "cublasSscal_v2": (STATUS, [vp, i32, _pf, vp, i32]),
    "cublasDscal_v2": (STATUS, [vp, i32, _pf, vp, i32]),
    # --- for ops.tensor_ops ----------------------------------------------------------------------------------
    # cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode)
    "cublasGetPointerMode_v2": (STATUS, [vp, P(i32)]),
    # cublasStatus_t cublasSgeam(handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    #     const float* alpha, const float* A, int lda, const float* beta, const float* B, int ldb, float* C,
    #     int ldc). NOTE: geam and gemmStridedBatched have no _v2 name and no handle-less twin.
    "cublasSgeam": (STATUS, [vp, i32, i32, i32, i32, _pf, vp, i32, _pf, vp, i32, vp, i32]),
    "cublasDgeam": (STATUS, [vp, i32, i32, i32, i32, _pf, vp, i32, _pf, vp, i32, vp, i32]),
    # cublasStatus_t cublasSgemmStridedBatched(handle, cublasOperation_t transa, cublasOperation_t transb,
    #     int m, int n, int k, const float* alpha, const float* A, int lda, long long int strideA,
    #     const float* B, int ldb, long long int strideB, const float* beta, float* C, int ldc,
    #     long long int strideC, int batchCount)
    "cublasSgemmStridedBatched": (
        STATUS, [vp, i32, i32, i32, i32, i32, _pf, vp, i32, i64, vp, i32, i64, _pf, vp, i32, i64, i32]),
    "cublasDgemmStridedBatched": (
        STATUS, [vp, i32, i32, i32, i32, i32, _pf, vp, i32, i64, vp, i32, i64, _pf, vp, i32, i64, i32]),
    # cublasStatus_t cublasStrsm_v2(cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo,
    #     cublasOperation_t trans, cublasDiagType_t diag, int m, int n, const float* alpha, const float* A, int lda,
    #     float* B, int ldb). Solves in place: B is overwritten by the solution (nd.linalg.trsm).
    "cublasStrsm_v2": (STATUS, [vp, i32, i32, i32, i32, i32, i32, _pf, vp, i32, vp, i32]),
    "cublasDtrsm_v2": (STATUS, [vp, i32, i32, i32, i32, i32, i32, _pf, vp, i32, vp, i32]),
    # cublasStatus_t cublasSdot_v2(handle, int n, const float* x, int incx, const float* y, int incy,
    #     float* result). result is a host or a device pointer as the handle's pointer mode says.
    "cublasSdot_v2": (STATUS, [vp, i32, vp, i32, vp, i32, vp]),
    "cublasDdot_v2": (STATUS, [vp, i32, vp, i32, vp, i32, vp]),
    # cublasStatus_t cublasSnrm2_v2(handle, int n, const float* x, int incx, float* result)
    "cublasSnrm2_v2": (STATUS, [vp, i32, vp, i32, vp]),
    "cublasDnrm2_v2": (STATUS, [vp, i32, vp, i32, vp]),
}


def status_name(status: int) -> str:
    try:
        return (lib.cublasGetStatusName(int(status)) or b"").decode()
    except Exception:
        return _STATUS_NAMES.get(int(status), f"status {int(status)}")


def status_string(status: int) -> str:
    try:
        return (lib.cublasGetStatusString(int(status)) or b"").decode()
    except Exception:
        return ""


def _errcheck(result, func, args):
    status = result.value if hasattr(result, "value") else int(result)
    if status != CUBLAS_STATUS_SUCCESS:
        message = " - ".join(p for p in (status_name(status), status_string(status)) if p)
        raise CublasError(status, func.__name__, message)
    return status


lib = Library("cublas", _TABLE, _errcheck)


def version() -> int:
    """cuBLAS version as MAJOR*10000 + MINOR*100 + PATCH, read without a handle (no GPU needed)."""
    import ctypes
    vals = []
    for prop in (0, 1, 2):
        v = ctypes.c_int()
        lib.cublasGetProperty(prop, ctypes.byref(v))
        vals.append(v.value)
    return vals[0] * 10000 + vals[1] * 100 + vals[2]
