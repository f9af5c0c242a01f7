"""Layer 0 (_lib): the exception classes. Imports nothing of dnnbind.

One class per library, subclassed by status family so callers can catch what they can handle
(e.g. ``CudnnNotSupported`` to fall back to another algorithm). Every error pickles: ``__reduce__``
rebuilds it from its constructor arguments, so errors cross process boundaries (pytest-xdist,
multiprocessing data loaders) intact.
"""

from __future__ import annotations


class DnnbindError(Exception):
    """Base class of every error dnnbind raises on purpose."""


class LibraryNotFoundError(DnnbindError, OSError):
    """A shared library (cuDNN, cuBLAS, NVRTC, the CUDA driver) could not be found or opened."""

    def __init__(self, library: str, hint: str, tried: str = ""):
        self.library, self.hint, self.tried = library, hint, tried
        msg = f"could not load {library}. {hint}"
        if tried:
            msg += f" (tried: {tried})"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.library, self.hint, self.tried))


class _StatusError(DnnbindError):
    """An error carrying a library status code, the C function that returned it and a message."""

    library = "?"

    def __init__(self, status: int, function: str, message: str = "", context: str = ""):
        self.status, self.function, self.message, self.context = int(status), function, message, context
        super().__init__(self._format())

    def _format(self) -> str:
        text = f"{self.function} failed with {self.library} status {self.status}"
        if self.message:
            text += f": {self.message}"
        if self.context:
            text += f" [{self.context}]"
        return text

    def add_info(self, context: str) -> "_StatusError":
        """Append op-level context (shapes, dtypes, algorithm) as the error passes up a layer."""
        self.context = f"{self.context}; {context}" if self.context else context
        self.args = (self._format(),)
        return self

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self):
        return (type(self), (self.status, self.function, self.message, self.context))


class CudnnError(_StatusError):
    library = "cuDNN"


class CudnnNotInitialized(CudnnError):
    """1000s: no GPU or driver, a sub-library missing or mismatched, licence."""


class CudnnBadParam(CudnnError):
    """2000s: an argument cuDNN rejected (shape, stride, null pointer, descriptor)."""


class CudnnNotSupported(CudnnError):
    """3000s: a valid request this cuDNN/GPU cannot do (layout, data type, algorithm, arch)."""


class CudnnInternalError(CudnnError):
    """4000s: cuDNN failed internally (including host/device allocation failures)."""


class CudnnExecutionFailed(CudnnError):
    """5000s: a kernel or a library cuDNN called failed on the GPU."""


_CUDNN_FAMILIES = {1: CudnnNotInitialized, 2: CudnnBadParam, 3: CudnnNotSupported,
                   4: CudnnInternalError, 5: CudnnExecutionFailed}


def cudnn_error_class(status: int) -> type[CudnnError]:
    """cuDNN 9 groups statuses by thousands (FACTS.md); the v8 codes 1-13 no longer exist."""
    return _CUDNN_FAMILIES.get(int(status) // 1000, CudnnError)


class CublasError(_StatusError):
    library = "cuBLAS"


class CusolverError(_StatusError):
    """A cusolverStatus_t other than CUSOLVER_STATUS_SUCCESS: the function, the status, its name and meaning."""

    library = "cuSOLVER"


class CudaError(_StatusError):
    library = "CUDA runtime"


class CudaDriverError(_StatusError):
    library = "CUDA driver"


class NvrtcError(_StatusError):
    library = "NVRTC"


class NcclError(_StatusError):
    """An ncclResult_t other than ncclSuccess; the message is the status name, ncclGetErrorString's text and
    ncclGetLastError's (nccl.py builds it)."""

    library = "NCCL"


# -- argument errors ----------------------------------------------------------------------------------------------
# MXNet raises MXNetError for a bad argument; Python code expects ValueError/TypeError. These are both: a user's
# ``except mx.base.MXNetError`` (MXNetError is DnnbindError) and ``except ValueError`` each catch them.


class DnnbindValueError(DnnbindError, ValueError):
    """A bad argument value (shape, range, option): MXNet's MXNetError, Python's ValueError."""


class DnnbindTypeError(DnnbindError, TypeError):
    """A bad argument type, a missing required argument or an unknown keyword: MXNetError and TypeError."""


class UnknownArgumentError(DnnbindTypeError):
    """An argument name the op does not declare; the message is MXNet's ``Cannot find argument 'x', Possible
    Arguments: ...`` (dmlc-core's parameter parser), so a misspelled keyword never runs with a default."""

    def __init__(self, op: str, name: str, possible=()):
        self.op, self.name, self.possible = op, name, tuple(possible)
        listing = "".join(f"\n{p}" for p in self.possible)
        super().__init__(f"Cannot find argument '{name}', Possible Arguments:\n----------------{listing}\n"
                         f", in operator {op}")

    def __reduce__(self):
        return (type(self), (self.op, self.name, self.possible))


def reject_unknown(op: str, given, allowed) -> None:
    """Raise MXNet's "Cannot find argument" for the first name of ``given`` not in ``allowed`` (both iterables of
    names). The cheap common case, nothing unknown, is one set difference."""
    unknown = [k for k in given if k not in allowed]
    if unknown:
        raise UnknownArgumentError(op, unknown[0], sorted(allowed))
