"""Layer 0 (_lib): NCCL, the collective-communication library, through ctypes. Imports nothing of dnnbind but _lib.

Every prototype below was checked against nccl.h of the nvidia-nccl-cu12 wheel (2.32.3); tests/test_nccl_bindings.py
parses the installed wheel's nccl.h and checks each declaration and enum value against it. Communicators are opaque
pointers (c_void_p), buffers are device pointers as ints, counts are size_t elements (not bytes).

Importing loads nothing; libnccl is opened by the first call (``DNNBIND_NCCL_PATH`` overrides cuda.pathfinder).
NOTE: libnccl opens without a GPU: ncclGetVersion, ncclGetErrorString and ncclGetLastError work on any machine,
and so do the argument checks that fail before NCCL touches CUDA (ncclCommGetAsyncError(NULL, ...)).
"""

from __future__ import annotations

from .errors import DnnbindTypeError, DnnbindValueError

import ctypes

import numpy as np

from .cfunc import STATUS, Library, P, cstr, i32, size_t, vp
from .errors import NcclError

# ncclResult_t (nccl.h). ncclTimeout is new in 2.29-ish headers; older libraries report it as an unknown code.
ncclSuccess = 0
ncclUnhandledCudaError = 1
ncclSystemError = 2
ncclInternalError = 3
ncclInvalidArgument = 4
ncclInvalidUsage = 5
ncclRemoteError = 6
ncclInProgress = 7
ncclTimeout = 8

RESULT_NAMES = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
                8: "ncclTimeout"}

# ncclRedOp_t (built-in operators; values >= ncclNumOps are user operators from ncclRedOpCreate*)
ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg = 0, 1, 2, 3, 4

# ncclDataType_t
ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64 = 0, 1, 2, 3, 4, 5
ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16 = 6, 7, 8, 9

# #define NCCL_UNIQUE_ID_BYTES 128
NCCL_UNIQUE_ID_BYTES = 128


class ncclUniqueId(ctypes.Structure):
    """``typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;``

    NOTE: ncclCommInitRank takes it BY VALUE (128 bytes on the stack), ncclGetUniqueId through a pointer.
    ``bytes(uid)`` and ``ncclUniqueId.from_buffer_copy(b)`` carry it between processes.
    """

    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


_TABLE = {
    # ncclResult_t ncclGetVersion(int* version)
    "ncclGetVersion": (STATUS, [P(i32)]),
    # ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)
    "ncclGetUniqueId": (STATUS, [P(ncclUniqueId)]),
    # ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)
    "ncclCommInitRank": (STATUS, [P(vp), i32, ncclUniqueId, i32]),
    # ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist)
    # comm is an array of ndev communicators; devlist NULL means devices 0..ndev-1.
    "ncclCommInitAll": (STATUS, [P(vp), i32, P(i32)]),
    # ncclResult_t ncclCommDestroy(ncclComm_t comm)
    "ncclCommDestroy": (STATUS, [vp]),
    # ncclResult_t ncclCommAbort(ncclComm_t comm)
    "ncclCommAbort": (STATUS, [vp]),
    # ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError)
    "ncclCommGetAsyncError": (STATUS, [vp, P(i32)]),
    # ncclResult_t ncclGroupStart()
    "ncclGroupStart": (STATUS, []),
    # ncclResult_t ncclGroupEnd()
    "ncclGroupEnd": (STATUS, []),
    # ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
    #     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
    "ncclAllReduce": (STATUS, [vp, vp, size_t, i32, i32, vp, vp]),
    # ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
    #     int root, ncclComm_t comm, cudaStream_t stream)
    "ncclBroadcast": (STATUS, [vp, vp, size_t, i32, i32, vp, vp]),
    # ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    #     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
    "ncclReduceScatter": (STATUS, [vp, vp, size_t, i32, i32, vp, vp]),
    # ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    #     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
    "ncclAllGather": (STATUS, [vp, vp, size_t, i32, vp, vp]),
    # const char* ncclGetErrorString(ncclResult_t result)
    "ncclGetErrorString": (cstr, [i32]),
    # const char* ncclGetLastError(ncclComm_t comm)   (NULL: the last error of this thread, any communicator)
    "ncclGetLastError": (cstr, [vp]),
}


def result_name(status: int) -> str:
    """``ncclInvalidArgument`` for 4; a table lookup (nccl.h has no name function), safe while raising."""
    return RESULT_NAMES.get(int(status), f"ncclResult_t {int(status)}")


def error_string(status: int) -> str:
    try:
        return (lib.ncclGetErrorString(int(status)) or b"").decode(errors="replace")
    except Exception:  # never let the error path raise a second error
        return ""


def last_error(comm: int | None = None) -> str:
    try:
        return (lib.ncclGetLastError(comm) or b"").decode(errors="replace")
    except Exception:
        return ""


def error_message(status: int, comm: int | None = None) -> str:
    """``name - ncclGetErrorString - ncclGetLastError``, skipping the empty parts."""
    return " - ".join(p for p in (result_name(status), error_string(status), last_error(comm)) if p)


def _errcheck(result, func, args):
    status = result.value if hasattr(result, "value") else int(result)
    if status != ncclSuccess:
        # NOTE: ncclGetLastError(NULL) is the calling thread's last message, whatever the communicator.
        raise NcclError(status, func.__name__, error_message(status))
    return status


lib = Library("nccl", _TABLE, _errcheck)


def version() -> int:
    """NCCL's code: MAJOR*10000 + MINOR*100 + PATCH since 2.9 (MAJOR*1000 + MINOR*100 + PATCH before). No GPU."""
    v = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(v))
    return v.value


def get_unique_id() -> bytes:
    """``ncclGetUniqueId``: the 128 bytes every rank of a new clique passes to ncclCommInitRank (rank 0 makes it).
    NOTE: NCCL may start its bootstrap network listener here; it needs a GPU driver but no device selected."""
    uid = ncclUniqueId()
    lib.ncclGetUniqueId(ctypes.byref(uid))
    return bytes(uid)


def version_tuple(v: int) -> tuple[int, int, int]:
    if v >= 10000:
        return v // 10000, (v // 100) % 100, v % 100
    return v // 1000, (v // 100) % 10, v % 100


# numpy dtype name -> ncclDataType_t. bfloat16 is matched by name (ml_dtypes); numpy itself has none.
DTYPES = {"int8": ncclInt8, "uint8": ncclUint8, "int32": ncclInt32, "uint32": ncclUint32, "int64": ncclInt64,
          "uint64": ncclUint64, "float16": ncclFloat16, "float32": ncclFloat32, "float64": ncclFloat64,
          "bfloat16": ncclBfloat16}
REDUCE_OPS = {"sum": ncclSum, "prod": ncclProd, "max": ncclMax, "min": ncclMin, "avg": ncclAvg}


def _dtype_name(dtype) -> str:
    if dtype is None:  # np.dtype(None) is float64; a missing dtype must not pass as one
        return "None"
    try:
        return np.dtype(dtype).name
    except TypeError:  # "bfloat16" without ml_dtypes, or something that is no dtype at all
        return str(dtype)


def nccl_dtype(dtype) -> int:
    """The ncclDataType_t for a numpy dtype; TypeError naming it (and what NCCL takes) otherwise."""
    name = _dtype_name(dtype)
    try:
        return DTYPES[name]
    except KeyError:
        raise DnnbindTypeError(f"NCCL has no data type for dtype {name}; supported: {', '.join(DTYPES)}") from None


def nccl_op(op: str, dtype=None) -> int:
    """The ncclRedOp_t for 'sum', 'prod', 'max', 'min' or 'avg'; ValueError naming the op (and dtype) otherwise."""
    key = op.lower() if isinstance(op, str) else op
    try:
        return REDUCE_OPS[key]
    except (KeyError, TypeError):
        on = f" (dtype {_dtype_name(dtype)})" if dtype is not None else ""
        raise DnnbindValueError(f"NCCL has no reduction op {op!r}{on}; supported: {', '.join(REDUCE_OPS)}") from None
