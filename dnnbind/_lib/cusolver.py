"""Layer 0 (_lib): cuSOLVER's dense API (cusolverDn) through ctypes. Imports nothing of dnnbind but _lib.

Only what ``nd.linalg`` needs: the handle, Cholesky (potrf) and LU (getrf, getrs) in float32 and float64.
Prototypes as in cusolverDn.h / cusolver_common.h of the nvidia-cusolver wheels (CUDA 12 and 13), enums passed as
``int`` (``cublasFillMode_t``, ``cublasOperation_t`` come from cublas_api.h: FILL_MODE_LOWER 0, UPPER 1; OP_N 0,
OP_T 1). Workspace sizes (``int* Lwork``) count elements of the matrix type, not bytes.

NOTE: libcusolver links against libcublas, libcublasLt, libcusparse and libnvJitLink. cuda.pathfinder's
``load_nvidia_dynamic_lib("cusolver")`` loads those first (its catalog lists them as cusolver's dependencies), so
loading goes through _lib/loader.py like every other library; a missing one surfaces as LibraryNotFoundError naming
cusolver at the first call, never at import.
"""

from __future__ import annotations

from .cfunc import STATUS, Library, P, i32, vp
from .errors import CusolverError

# cusolverStatus_t (cusolver_common.h)
CUSOLVER_STATUS_SUCCESS = 0
# cublasFillMode_t, cublasOperation_t (cublas_api.h)
CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER = 0, 1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1

_STATUS = {
    0: ("CUSOLVER_STATUS_SUCCESS", "the operation completed successfully"),
    1: ("CUSOLVER_STATUS_NOT_INITIALIZED", "the library was not initialized (no GPU or driver, or cusolverDnCreate "
                                           "was not called)"),
    2: ("CUSOLVER_STATUS_ALLOC_FAILED", "resource allocation failed inside cuSOLVER"),
    3: ("CUSOLVER_STATUS_INVALID_VALUE", "an unsupported value or parameter was passed (a negative dimension, "
                                         "a leading dimension too small)"),
    4: ("CUSOLVER_STATUS_ARCH_MISMATCH", "the function needs a feature this GPU architecture lacks"),
    5: ("CUSOLVER_STATUS_MAPPING_ERROR", "access to GPU memory space failed"),
    6: ("CUSOLVER_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"),
    7: ("CUSOLVER_STATUS_INTERNAL_ERROR", "an internal cuSOLVER operation failed"),
    8: ("CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED", "the matrix type is not supported by this function"),
    9: ("CUSOLVER_STATUS_NOT_SUPPORTED", "the requested operation is not supported"),
    10: ("CUSOLVER_STATUS_ZERO_PIVOT", "a zero pivot was encountered"),
    11: ("CUSOLVER_STATUS_INVALID_LICENSE", "invalid license"),
}


_TABLE = {
    # cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t* handle)
    "cusolverDnCreate": (STATUS, [P(vp)]),
    # cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t handle)
    "cusolverDnDestroy": (STATUS, [vp]),
    # cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t handle, cudaStream_t streamId)
    "cusolverDnSetStream": (STATUS, [vp, vp]),
    # cusolverStatus_t cusolverGetProperty(libraryPropertyType type, int* value)
    "cusolverGetProperty": (STATUS, [i32, P(i32)]),
    # cusolverStatus_t cusolverDnSpotrf_bufferSize(cusolverDnHandle_t handle, cublasFillMode_t uplo, int n,
    #     float* A, int lda, int* Lwork)
    "cusolverDnSpotrf_bufferSize": (STATUS, [vp, i32, i32, vp, i32, P(i32)]),
    "cusolverDnDpotrf_bufferSize": (STATUS, [vp, i32, i32, vp, i32, P(i32)]),
    # cusolverStatus_t cusolverDnSpotrf(cusolverDnHandle_t handle, cublasFillMode_t uplo, int n, float* A, int lda,
    #     float* Workspace, int Lwork, int* devInfo)
    "cusolverDnSpotrf": (STATUS, [vp, i32, i32, vp, i32, vp, i32, vp]),
    "cusolverDnDpotrf": (STATUS, [vp, i32, i32, vp, i32, vp, i32, vp]),
    # cusolverStatus_t cusolverDnSgetrf_bufferSize(cusolverDnHandle_t handle, int m, int n, float* A, int lda,
    #     int* Lwork)
    "cusolverDnSgetrf_bufferSize": (STATUS, [vp, i32, i32, vp, i32, P(i32)]),
    "cusolverDnDgetrf_bufferSize": (STATUS, [vp, i32, i32, vp, i32, P(i32)]),
    # cusolverStatus_t cusolverDnSgetrf(cusolverDnHandle_t handle, int m, int n, float* A, int lda,
    #     float* Workspace, int* devIpiv, int* devInfo)
    "cusolverDnSgetrf": (STATUS, [vp, i32, i32, vp, i32, vp, vp, vp]),
    "cusolverDnDgetrf": (STATUS, [vp, i32, i32, vp, i32, vp, vp, vp]),
    # cusolverStatus_t cusolverDnSgetrs(cusolverDnHandle_t handle, cublasOperation_t trans, int n, int nrhs,
    #     const float* A, int lda, const int* devIpiv, float* B, int ldb, int* devInfo)
    "cusolverDnSgetrs": (STATUS, [vp, i32, i32, i32, vp, i32, vp, vp, i32, vp]),
    "cusolverDnDgetrs": (STATUS, [vp, i32, i32, i32, vp, i32, vp, vp, i32, vp]),
}


def status_name(status: int) -> str:
    return _STATUS.get(int(status), (f"status {int(status)}", ""))[0]


def status_string(status: int) -> str:
    return _STATUS.get(int(status), ("", "unknown cuSOLVER status"))[1]


def _errcheck(result, func, args):
    status = result.value if hasattr(result, "value") else int(result)
    if status != CUSOLVER_STATUS_SUCCESS:
        raise CusolverError(status, func.__name__, f"{status_name(status)} - {status_string(status)}")
    return status


lib = Library("cusolver", _TABLE, _errcheck)


def version() -> int:
    """cuSOLVER's version as MAJOR*10000 + MINOR*100 + PATCH, read without a handle (no GPU needed)."""
    import ctypes
    vals = []
    for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        lib.cusolverGetProperty(prop, ctypes.byref(v))
        vals.append(v.value)
    return vals[0] * 10000 + vals[1] * 100 + vals[2]


__all__ = ["CusolverError", "lib", "status_name", "status_string", "version"]
