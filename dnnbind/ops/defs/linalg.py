"""MXNet's linear-algebra operators (src/operator/tensor/la_op.cc), ``nd.linalg.<op>`` / ``sym.linalg.<op>`` (and
MXNet's aliases ``nd.linalg_<op>``): ``_linalg_gemm``, ``gemm2``, ``potrf``, ``potri``, ``trsm``, ``trmm``, ``syrk``,
``sumlogdiag``, ``inverse``, ``det``, ``slogdet``, and the copies ``extractdiag``, ``makediag``, ``extracttrian``,
``maketrian`` (any dtype, as MXNet's; the others take float32 and float64 only).

Every input is a stack of matrices: the last two axes are the matrix, the leading axes a batch of one shape for all
inputs (no broadcasting); gemm and gemm2 take the rows from ``axis`` (default -2) instead. float32 and float64 only
(MXNet: "This operation only supports 32-bit and 64-bit floating point"); a size-0 matrix or batch is refused by the
factorizations, as MXNet's shape inference treats 0 as unknown. Triangular inputs are read on their triangle only
(``lower``): potrf reads the symmetric matrix from one triangle and zeroes the other triangle of its factor, potri
mirrors its result into a full symmetric matrix, trsm/trmm ignore the other triangle of A and give it no gradient.

Gradients are MXNet's (la_op-inl.h): potrf's is the gradient with respect to a symmetric A (itself symmetric, half
of what the one read triangle's derivative would be off the diagonal), so that entry is marked ``loss`` (its backward
is its own definition; tests/test_linalg.py checks it by symmetric central differences and against MXNet's). det's
gradient is det * ddet * A^-T, zero for a matrix whose determinant is exactly 0.

cpu: ops/reference/linalg.py (numpy). gpu:
- gemm, gemm2, syrk, trmm, the products inside every gradient: ``cublas<t>gemmStridedBatched`` (one call per op;
  trmm multiplies by A's triangle masked out, syrk mirrors one triangle as MXNet does);
- trsm: ``cublas<t>trsm_v2``, one call per matrix of the batch (cuBLAS's batched trsm wants device pointer arrays;
  a loop for now);
- potrf: ``cusolverDn<t>potrf``; inverse: ``cusolverDn<t>getrf`` + ``getrs`` against the identity; det, slogdet:
  getrf, then the pivots' parity and U's diagonal with table ops (their gradients: getrs from the saved factors);
  one cuSOLVER call per matrix of the batch. potri: a triangular solve against the identity and a gemm
  (L^-T L^-1), then the mirror;
- extract/make diag/trian: one gather (``take``) through a fixed index map each way.
A GPU never reads the factorizations' ``info`` back (that would synchronize and keep the op out of a recorded graph):
a matrix potrf cannot factor or inverse cannot invert gives undefined (often NaN/inf) values there, where the cpu
raises MXNet's error.

NOTE: cuBLAS and cuSOLVER are column-major: a row-major stack of (m, n) matrices is, to them, a stack of (n, m)
matrices, each the transpose. So the row-major lower triangle is their upper one (uplo flips), a left-side solve is
their right-side one (side flips), and LU/inverse need no transposes: inverse(A^T)^T = inverse(A), det(A^T) = det(A).
"""

from __future__ import annotations

import atexit
import ctypes
import math
import threading
from typing import NamedTuple

import numpy as np

from ..._lib import cublas, cusolver
from ..._lib.errors import CublasError, DnnbindTypeError, DnnbindValueError
from ...runtime.array import NDArray, array, empty, zeros
from ...runtime.memory import D2D, memcpy
from ...runtime.stream import current_stream
from .. import descriptors as D
from .._common import blas, with_context, workspace
from ..blas_tensor import gemm_strided_batched
from ..opdef import Lowering, OpDef, define, table, view
from ..reference import linalg as ref

GEMM, GEMM2, POTRF, POTRI = "_linalg_gemm", "_linalg_gemm2", "_linalg_potrf", "_linalg_potri"
TRSM, TRMM, SYRK, SUMLOGDIAG = "_linalg_trsm", "_linalg_trmm", "_linalg_syrk", "_linalg_sumlogdiag"
INVERSE, DET, SLOGDET = "_linalg_inverse", "_linalg_det", "_linalg_slogdet"
EXTRACTDIAG, MAKEDIAG = "_linalg_extractdiag", "_linalg_makediag"
EXTRACTTRIAN, MAKETRIAN = "_linalg_extracttrian", "_linalg_maketrian"

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_INT_MAX = 2**31 - 1
# MXNet accepts ``lower`` for potrf/potri (their parser is LaCholeskyParam) without declaring it in the op's
# argument list; dnnbind declares it as an extra in MXNet's syntax.
_LOWER = (("lower", "boolean, optional, default=1"),)


# checks -------------------------------------------------------------------------------------------------------------

def _context(shapes: dict) -> str:
    return " (" + ", ".join(f"{k} {tuple(s)}" for k, s in shapes.items()) + ")"


def _check_types(op: str, **arrays) -> None:
    first = None
    for i, (name, a) in enumerate(arrays.items()):
        if a.dtype not in _FLOATS:
            raise DnnbindTypeError(f"{op}: This operation only supports 32-bit and 64-bit floating point; {name} is "
                                   f"{a.dtype}")
        if first is None:
            first = a.dtype
        elif a.dtype != first:
            raise DnnbindTypeError(f"{op}: Incompatible attr at {i}-th input ({name}): expected {first}, got "
                                   f"{a.dtype}")


def _check_ranks(op: str, shapes: dict) -> int:
    for name, s in shapes.items():
        if len(s) < 2:
            raise DnnbindValueError(f"{op}: {name} must be a tensor of matrices (at least 2 dimensions), got shape "
                                    f"{tuple(s)}")
    if len({len(s) for s in shapes.values()}) > 1:
        raise DnnbindValueError(f"{op}: the inputs must have the same number of dimensions{_context(shapes)}")
    return len(next(iter(shapes.values())))


def _check_dims(op: str, dims: dict, shapes: dict) -> None:
    """MXNet's check_large_dim: each matrix dimension below 2**31 (cuBLAS's int)."""
    for name, d in dims.items():
        if d > _INT_MAX:
            raise DnnbindValueError(f"{op}: Large matrix dimensions (>= 2^31) are not supported: {name} is {d}"
                                    f"{_context(shapes)}")


def _row_axis(op: str, axis: int, ndim: int) -> int:
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim - 1:
        raise DnnbindValueError(f"{op}: Invalid row axis ({axis}) for {ndim}-d inputs: it must name one of the first "
                                f"{ndim - 1} axes")
    return a


def _gemm_shape(op: str, p, sa: tuple, sb: tuple, sc: tuple | None) -> tuple[int, tuple]:
    """(row axis, output shape) of alpha op(A) op(B) (+ beta C): MXNet's LaMatrixMultMacOpShape."""
    shapes = {"A": sa, "B": sb} if sc is None else {"A": sa, "B": sb, "C": sc}
    ndim = _check_ranks(op, {"A": sa, "B": sb})
    axis = _row_axis(op, p["axis"], ndim)
    ta, tb = p["transpose_a"], p["transpose_b"]
    _check_dims(op, {"A rows": sa[axis], "A cols": sa[-1], "B rows": sb[axis], "B cols": sb[-1]}, shapes)
    for i in range(ndim - 1):
        if i != axis and sa[i] != sb[i]:
            raise DnnbindValueError(f"{op}: Shapes of inputs 0, 1 must be the same, except on row/col axis (axis "
                                    f"{i}: {sa[i]} vs {sb[i]}){_context(shapes)}")
    ka, kb = (sa[axis] if ta else sa[-1]), (sb[-1] if tb else sb[axis])
    if ka != kb:
        raise DnnbindValueError(f"{op}: Incompatible matrix dimensions for multiplication: op(A) has {ka} columns, "
                                f"op(B) {kb} rows (transpose_a={ta}, transpose_b={tb}, axis={p['axis']})"
                                f"{_context(shapes)}")
    out = list(sa[:-1]) + [sb[axis] if tb else sb[-1]]
    out[axis] = sa[-1] if ta else sa[axis]
    out = tuple(out)
    if sc is not None and tuple(sc) != out:
        raise DnnbindValueError(f"{op}: Shape inconsistent: C has shape {tuple(sc)}, op(A) op(B) has shape {out}"
                                f"{_context(shapes)}")
    return axis, out


def _tri_shape(op: str, p, sa: tuple, sb: tuple) -> tuple:
    """Output shape of trsm/trmm: MXNet's LaTriangMatrixMultOpShape."""
    shapes = {"A": sa, "B": sb}
    _check_ranks(op, shapes)
    if sa[-2] != sa[-1]:
        raise DnnbindValueError(f"{op}: First operand must be a tensor of square matrices{_context(shapes)}")
    if sa[:-2] != sb[:-2]:
        raise DnnbindValueError(f"{op}: Shapes of inputs 0, 1 must be the same, except on last two dimensions"
                                f"{_context(shapes)}")
    _check_dims(op, {"B rows": sb[-2], "B cols": sb[-1]}, shapes)
    k = sb[-1] if p["rightside"] else sb[-2]
    if sa[-1] != k:
        side = "columns" if p["rightside"] else "rows"
        raise DnnbindValueError(f"{op}: Incompatible matrix dimensions for multiplication: A is {sa[-1]} x {sa[-1]}, "
                                f"B has {k} {side} (rightside={p['rightside']}){_context(shapes)}")
    return tuple(sb)  # (A is square: op(A) B and B op(A) have B's shape)


def _square_shape(op: str, sa: tuple) -> None:
    _check_ranks(op, {"A": sa})
    if sa[-2] != sa[-1]:
        raise DnnbindValueError(f"{op}: Input A's last two dimensions must be equal (a tensor of square matrices), "
                                f"got shape {tuple(sa)}")
    if 0 in sa:
        raise DnnbindValueError(f"{op}: A has a zero-size dimension, shape {tuple(sa)}; MXNet's shape inference "
                                f"takes 0 as unknown and refuses it")
    _check_dims(op, {"A rows": sa[-1]}, {"A": sa})


def _reduced_shape(sa: tuple) -> tuple:
    """MXNet's LaReduceShape<2>: the batch shape, (1,) for a single matrix."""
    return tuple(sa[:-2]) or (1,)


def _syrk_shape(op: str, p, sa: tuple) -> tuple:
    _check_ranks(op, {"A": sa})
    _check_dims(op, {"A rows": sa[-2], "A cols": sa[-1]}, {"A": sa})
    m = sa[-1] if p["transpose"] else sa[-2]
    return tuple(sa[:-2]) + (m, m)


class Geometry(NamedTuple):
    out_shape: tuple
    a_shape: tuple     # A's shape (the gradients' views)
    axis: int = -1     # gemm's row axis, resolved (ndim - 2 means no swap)


def _batch(shape: tuple) -> int:
    return math.prod(shape[:-2])


# the GPU kit: ops/reference/linalg.py's primitives on cuBLAS and table ops ------------------------------------------

_TRSM = {np.dtype(np.float32): "cublasStrsm_v2", np.dtype(np.float64): "cublasDtrsm_v2"}
_X = {np.dtype(np.float32): "S", np.dtype(np.float64): "D"}
_consts: dict = {}
_consts_lock = threading.Lock()


def _const(kind: str, n: int, flag: bool, dtype, device) -> NDArray:
    """A cached device constant: the (1, n, n) triangle masks (``tri``: with diagonal, ``strict``: without), the
    (1, n, n) identity, the (1, n) row 1..n (LAPACK's pivots of no exchange)."""
    key = (kind, n, flag, np.dtype(dtype), device)
    hit = _consts.get(key)
    if hit is None:
        if kind == "tri":
            host = (np.tril if flag else np.triu)(np.ones((n, n)))[None]
        elif kind == "strict":
            host = (np.tril(np.ones((n, n)), -1) if flag else np.triu(np.ones((n, n)), 1))[None]
        elif kind == "eye":
            host = np.eye(n)[None]
        else:
            host = np.arange(1, n + 1, dtype=np.float64)[None]
        with _consts_lock:
            hit = _consts.setdefault(key, array(host.astype(dtype), device=device, dtype=dtype))
    return hit


def _clone(x: NDArray) -> NDArray:
    """A fresh copy of ``x``'s bytes (not taped: inside a lowering)."""
    out = empty(x.shape, x.dtype, x.device)
    if out.nbytes:
        memcpy(out.ptr, x.ptr, out.nbytes, D2D, current_stream(x.device))
    return out


class GpuKit:
    """The matrix primitives of ops/reference/linalg.py on (batch, m, n) device arrays."""

    @staticmethod
    def t(x):
        n = len(x.shape)
        return table("swapaxes", x, dim1=n - 2, dim2=n - 1)

    @staticmethod
    def gemm(a, b, ta=False, tb=False, alpha=1.0, beta=0.0, c=None):
        out = _clone(c) if (c is not None and beta != 0) else None
        return gemm_strided_batched(a, b, bool(ta), bool(tb), float(alpha), float(beta) if out is not None else 0.0,
                                    out=out)

    @staticmethod
    def tri(x, lower=True):
        return table("multiply", x, _const("tri", x.shape[-1], bool(lower), x.dtype, x.device))

    @classmethod
    def mirror(cls, x, lower=True):
        strict = table("multiply", x, _const("strict", x.shape[-1], bool(lower), x.dtype, x.device))
        return table("add", cls.tri(x, lower), cls.t(strict))

    @staticmethod
    def trsm(a, b, alpha=1.0, rightside=False, lower=True, transpose=False):
        out = _clone(b)
        batch, m, n = out.shape
        k = a.shape[-1]
        if out.size == 0:
            return out
        dtype, size = out.dtype, out.dtype.itemsize
        # column-major view: X^T (n x m); a row-major left solve is a right solve there, lower is upper
        side = cublas.CUBLAS_SIDE_LEFT if rightside else cublas.CUBLAS_SIDE_RIGHT
        uplo = cublas.CUBLAS_FILL_MODE_UPPER if lower else cublas.CUBLAS_FILL_MODE_LOWER
        trans = cublas.CUBLAS_OP_T if transpose else cublas.CUBLAS_OP_N
        fn, h, alpha_p = getattr(cublas.lib, _TRSM[dtype]), blas(a), D.scalar_ptr(float(alpha), dtype)
        try:
            for i in range(batch):
                fn(h, side, uplo, trans, cublas.CUBLAS_DIAG_NON_UNIT, n, m, alpha_p, a.ptr + i * k * k * size, k,
                   out.ptr + i * m * n * size, n)
        except CublasError as exc:
            raise with_context(exc, op="trsm", a=a.shape, b=b.shape, rightside=rightside, lower=lower,
                               transpose=transpose) from None
        return out

    @classmethod
    def trmm(cls, a, b, alpha=1.0, rightside=False, lower=True, transpose=False):
        masked = cls.tri(a, lower)
        if rightside:
            return cls.gemm(b, masked, False, transpose, alpha)
        return cls.gemm(masked, b, transpose, False, alpha)

    @staticmethod
    def add(x, y):
        return table("add", x, y)

    @staticmethod
    def scale(x, s):
        return table("_mul_scalar", x, scalar=float(s))

    @staticmethod
    def diag(x):
        """(batch, n, n) -> (batch, n): every (n + 1)-th element of each flattened matrix."""
        b, n = x.shape[0], x.shape[-1]
        flat = view(x, (b, n * n))
        return table("slice", flat, begin=(None, 0), end=(None, None), step=(None, n + 1))

    @staticmethod
    def from_diag(v):
        b, n = v.shape
        return table("multiply", view(v, (b, n, 1)), _const("eye", n, True, v.dtype, v.device))

    @staticmethod
    def eye_batch(batch, n, dtype, device):
        return _clone(table("broadcast_to", _const("eye", n, True, dtype, device), shape=(batch, n, n)))


GPU = GpuKit


# cuSOLVER: one dense handle per (device, stream), created at the first call ------------------------------------------

_solvers: dict = {}
_solvers_lock = threading.Lock()


class SolverHandle:
    __slots__ = ("device", "stream", "handle")

    def __init__(self, device, stream):
        device.activate()
        h = ctypes.c_void_p()
        cusolver.lib.cusolverDnCreate(ctypes.byref(h))  # LibraryNotFoundError naming cusolver if it is missing
        self.device, self.stream, self.handle = device, stream, h.value
        cusolver.lib.cusolverDnSetStream(h, stream.handle)

    def close(self) -> None:
        if self.handle:
            h, self.handle = self.handle, None
            cusolver.lib.cusolverDnDestroy(h)


def _release_solvers() -> None:
    """atexit: destroy the handles; errors swallowed (exit must not mask the program's result)."""
    for h in list(_solvers.values()):
        try:
            h.close()
        except Exception:
            pass
    _solvers.clear()


def solver_handle(device) -> int:
    device.activate()
    stream = current_stream(device)
    h = _solvers.get(stream)
    if h is None:
        with _solvers_lock:
            h = _solvers.get(stream)
            if h is None:
                if not _solvers:
                    atexit.register(_release_solvers)
                h = _solvers[stream] = SolverHandle(device, stream)
    return h.handle


def _solver_call(what: str, x: NDArray, fn):
    try:
        return fn()
    except cusolver.CusolverError as exc:
        raise with_context(exc, op=what, shape=x.shape, dtype=x.dtype) from None


def potrf_inplace(x: NDArray, lower: bool) -> None:
    """Cholesky-factor each (n, n) matrix of the (batch, n, n) array ``x`` in place (its other triangle keeps A's
    values)."""
    batch, n, _ = x.shape
    X, size = _X[x.dtype], x.dtype.itemsize
    uplo = cusolver.CUBLAS_FILL_MODE_UPPER if lower else cusolver.CUBLAS_FILL_MODE_LOWER
    h = solver_handle(x.device)
    lwork = ctypes.c_int()

    def run():
        getattr(cusolver.lib, f"cusolverDn{X}potrf_bufferSize")(h, uplo, n, x.ptr, n, ctypes.byref(lwork))
        work, _ = workspace(x.device, max(lwork.value, 1) * size)
        info = zeros((batch,), np.int32, x.device)
        fn = getattr(cusolver.lib, f"cusolverDn{X}potrf")
        for i in range(batch):
            fn(h, uplo, n, x.ptr + i * n * n * size, n, work, lwork.value, info.ptr + 4 * i)
    _solver_call("potrf", x, run)


def getrf_inplace(x: NDArray) -> NDArray:
    """LU-factor each matrix of the (batch, n, n) array ``x`` in place (of its transpose, in column-major terms);
    returns the (batch, n) int32 pivots, 1-based as LAPACK's."""
    batch, n, _ = x.shape
    X, size = _X[x.dtype], x.dtype.itemsize
    h = solver_handle(x.device)
    ipiv = empty((batch, n), np.int32, x.device)
    lwork = ctypes.c_int()

    def run():
        getattr(cusolver.lib, f"cusolverDn{X}getrf_bufferSize")(h, n, n, x.ptr, n, ctypes.byref(lwork))
        work, _ = workspace(x.device, max(lwork.value, 1) * size)
        info = zeros((batch,), np.int32, x.device)
        fn = getattr(cusolver.lib, f"cusolverDn{X}getrf")
        for i in range(batch):
            fn(h, n, n, x.ptr + i * n * n * size, n, work, ipiv.ptr + 4 * i * n, info.ptr + 4 * i)
    _solver_call("getrf", x, run)
    return ipiv


def inverse_from_lu(lu: NDArray, ipiv: NDArray) -> NDArray:
    """inverse(A) from getrf_inplace's factors: getrs against the identity (row-major, it is A's own inverse)."""
    batch, n, _ = lu.shape
    X, size = _X[lu.dtype], lu.dtype.itemsize
    h = solver_handle(lu.device)
    out = GPU.eye_batch(batch, n, lu.dtype, lu.device)

    def run():
        info = zeros((batch,), np.int32, lu.device)
        fn = getattr(cusolver.lib, f"cusolverDn{X}getrs")
        for i in range(batch):
            fn(h, cusolver.CUBLAS_OP_N, n, n, lu.ptr + i * n * n * size, n, ipiv.ptr + 4 * i * n,
               out.ptr + i * n * n * size, n, info.ptr + 4 * i)
    _solver_call("getrs", lu, run)
    return out


# gemm, gemm2 --------------------------------------------------------------------------------------------------------

def _gemm_prepare(p, a, b, c):
    _check_types(GEMM, A=a, B=b, C=c)
    axis, out = _gemm_shape(GEMM, p, tuple(a.shape), tuple(b.shape), tuple(c.shape))
    return Geometry(out, tuple(a.shape), axis)


def _gemm2_prepare(p, a, b):
    _check_types(GEMM2, A=a, B=b)
    axis, out = _gemm_shape(GEMM2, p, tuple(a.shape), tuple(b.shape), None)
    return Geometry(out, tuple(a.shape), axis)


def _gemm_infer(p, shapes):
    _, out = _gemm_shape(GEMM, p, tuple(shapes[0]), tuple(shapes[1]), None)
    return [tuple(shapes[0]), tuple(shapes[1]), out], [out]


def _gemm2_infer(p, shapes):
    _, out = _gemm_shape(GEMM2, p, tuple(shapes[0]), tuple(shapes[1]), None)
    return [tuple(shapes[0]), tuple(shapes[1])], [out]


def _np_swap(x, g: Geometry):
    """numpy: the row axis moved to -2 (and back: the swap is its own inverse)."""
    return x if g.axis == x.ndim - 2 else np.swapaxes(x, g.axis, -2)


def _gemm_cpu_forward(c, a, b, cc=None):
    g, p = c.geo, c.p
    beta = p.get("beta", 0.0)
    y = ref.gemm(_np_swap(a, g), _np_swap(b, g), None if cc is None else _np_swap(cc, g), p["transpose_a"],
                 p["transpose_b"], p["alpha"], beta)
    return np.ascontiguousarray(_np_swap(y, g)), (a, b)


def _gemm_cpu_backward(c, saved, grads, dy):
    g, p = c.geo, c.p
    a, b = saved
    with_c = len(grads.needs) == 3  # gemm (A, B, C), not gemm2
    da, db, dc = ref.gemm_backward(ref.NP, _np_swap(dy, g), _np_swap(a, g), _np_swap(b, g), p["transpose_a"],
                                   p["transpose_b"], p["alpha"], p.get("beta", 0.0), with_c)
    out = [np.ascontiguousarray(_np_swap(x, g)).astype(a.dtype, copy=False) for x in (da, db)]
    if with_c:
        out.append(np.ascontiguousarray(_np_swap(dc, g)).astype(a.dtype, copy=False))
    return tuple(out)


def _gpu_swap(x: NDArray, g: Geometry) -> NDArray:
    n = len(x.shape)
    return x if g.axis == n - 2 else table("swapaxes", x, dim1=g.axis, dim2=n - 2)


def _swapped(shape: tuple, g: Geometry) -> tuple:
    s = list(shape)
    s[g.axis], s[-2] = s[-2], s[g.axis]
    return tuple(s)


def _as3(x: NDArray) -> NDArray:
    s = x.shape
    return view(x, (_batch(s),) + tuple(s[-2:]))


def _gemm_gpu_forward(c, a, b, cc=None):
    g, p = c.geo, c.p
    sa, sb = _gpu_swap(a, g), _gpu_swap(b, g)
    sc = None if cc is None else _as3(_gpu_swap(cc, g))
    y3 = GPU.gemm(_as3(sa), _as3(sb), p["transpose_a"], p["transpose_b"], p["alpha"], p.get("beta", 0.0), sc)
    return _gpu_swap(view(y3, _swapped(g.out_shape, g)), g), (sa, sb)


def _gemm_gpu_backward(c, saved, grads, dy):
    g, p = c.geo, c.p
    sa, sb = saved
    with_c = len(grads.needs) == 3
    d3 = _as3(_gpu_swap(dy, g))  # (the swap's copy; dy itself is left as it is)
    da, db, dc = ref.gemm_backward(GPU, d3, _as3(sa), _as3(sb), p["transpose_a"], p["transpose_b"], p["alpha"],
                                   p.get("beta", 0.0), with_c)
    out = [_gpu_swap(view(da, sa.shape), g), _gpu_swap(view(db, sb.shape), g)]
    if with_c:
        out.append(_gpu_swap(view(dc, _swapped(g.out_shape, g)), g))
    return tuple(out)


# potrf, potri -------------------------------------------------------------------------------------------------------

_REDUCED = (SUMLOGDIAG, DET, SLOGDET)


def _square_prepare(op: str):
    def prepare(p, a):
        _check_types(op, A=a)
        _square_shape(op, tuple(a.shape))
        out = _reduced_shape(tuple(a.shape)) if op in _REDUCED else tuple(a.shape)
        return Geometry(out, tuple(a.shape))
    return prepare


def _square_infer(op: str):
    def infer(p, shapes):
        s = tuple(shapes[0])
        _square_shape(op, s)
        out = _reduced_shape(s) if op in _REDUCED else s
        return [s], [out, out] if op == SLOGDET else [out]
    return infer


def _potrf_cpu_forward(c, a):
    try:
        y = ref.potrf(a, c.p["lower"])
    except ref.NotPositiveDefinite:
        raise DnnbindValueError(f"{POTRF}: potrf failed: the input matrix is either not symmetric or not positive "
                                f"definite (A {a.shape}, lower={c.p['lower']})") from None
    return y, y


def _potrf_cpu_backward(c, y, grads, dy):
    return (ref.potrf_backward(ref.NP, dy, y, c.p["lower"]).astype(y.dtype, copy=False),)


def _potrf_gpu_forward(c, a):
    lower = c.p["lower"]
    x = _clone(_as3(a))
    potrf_inplace(x, lower)
    y = GPU.tri(x, lower)  # MXNet zeroes the other triangle (cuSOLVER leaves A's values there)
    return view(y, a.shape), y


def _potrf_gpu_backward(c, y, grads, dy):
    return (view(ref.potrf_backward(GPU, _as3(dy), y, c.p["lower"]), dy.shape),)


def _potri_cpu_forward(c, a):
    y = ref.potri(a, c.p["lower"])
    return y, (a, y)


def _potri_cpu_backward(c, saved, grads, dy):
    a, y = saved
    return (ref.potri_backward(ref.NP, dy, a, y, c.p["lower"]).astype(a.dtype, copy=False),)


def _potri_gpu_forward(c, a):
    lower = c.p["lower"]
    a3 = _as3(a)
    batch, n, _ = a3.shape
    inv = GPU.trsm(a3, GPU.eye_batch(batch, n, a.dtype, a.device), 1.0, False, lower, False)  # tri(A)^-1
    r = GPU.gemm(inv, inv, True, False) if lower else GPU.gemm(inv, inv, False, True)
    y = GPU.mirror(r, lower)
    return view(y, a.shape), (a3, y)


def _potri_gpu_backward(c, saved, grads, dy):
    a3, y = saved
    return (view(ref.potri_backward(GPU, _as3(dy), a3, y, c.p["lower"]), dy.shape),)


# trsm, trmm, syrk ---------------------------------------------------------------------------------------------------

def _tri_prepare(op: str):
    def prepare(p, a, b):
        _check_types(op, A=a, B=b)
        return Geometry(_tri_shape(op, p, tuple(a.shape), tuple(b.shape)), tuple(a.shape))
    return prepare


def _tri_infer(op: str):
    def infer(p, shapes):
        out = _tri_shape(op, p, tuple(shapes[0]), tuple(shapes[1]))
        return [tuple(shapes[0]), tuple(shapes[1])], [out]
    return infer


def _tri_params(p) -> tuple:
    return p["transpose"], p["rightside"], p["lower"], p["alpha"]


def _trsm_cpu_forward(c, a, b):
    tr, rs, lo, al = _tri_params(c.p)
    y = ref.trsm(a, b, tr, rs, lo, al)
    return y, (a, y)


def _trsm_cpu_backward(c, saved, grads, dy):
    a, y = saved
    da, db = ref.trsm_backward(ref.NP, dy, a, y, *_tri_params(c.p))
    return da.astype(a.dtype, copy=False), db.astype(a.dtype, copy=False)


def _trsm_gpu_forward(c, a, b):
    tr, rs, lo, al = _tri_params(c.p)
    a3 = _as3(a)
    y = GPU.trsm(a3, _as3(b), al, rs, lo, tr)
    return view(y, b.shape), (a3, y)


def _trsm_gpu_backward(c, saved, grads, dy):
    a3, y = saved
    da, db = ref.trsm_backward(GPU, _as3(dy), a3, y, *_tri_params(c.p))
    return view(da, c.geo.a_shape), view(db, dy.shape)


def _trmm_cpu_forward(c, a, b):
    tr, rs, lo, al = _tri_params(c.p)
    return ref.trmm(a, b, tr, rs, lo, al), (a, b)


def _trmm_cpu_backward(c, saved, grads, dy):
    a, b = saved
    da, db = ref.trmm_backward(ref.NP, dy, a, b, *_tri_params(c.p))
    return da.astype(a.dtype, copy=False), db.astype(a.dtype, copy=False)


def _trmm_gpu_forward(c, a, b):
    tr, rs, lo, al = _tri_params(c.p)
    a3, b3 = _as3(a), _as3(b)
    return view(GPU.trmm(a3, b3, al, rs, lo, tr), b.shape), (a3, b3)


def _trmm_gpu_backward(c, saved, grads, dy):
    a3, b3 = saved
    da, db = ref.trmm_backward(GPU, _as3(dy), a3, b3, *_tri_params(c.p))
    return view(da, c.geo.a_shape), view(db, dy.shape)


def _syrk_prepare(p, a):
    _check_types(SYRK, A=a)
    return Geometry(_syrk_shape(SYRK, p, tuple(a.shape)), tuple(a.shape))


def _syrk_infer(p, shapes):
    return [tuple(shapes[0])], [_syrk_shape(SYRK, p, tuple(shapes[0]))]


def _syrk_cpu_forward(c, a):
    return ref.syrk(a, c.p["transpose"], c.p["alpha"]), a


def _syrk_cpu_backward(c, a, grads, dy):
    return (ref.syrk_backward(ref.NP, dy, a, c.p["transpose"], c.p["alpha"]).astype(a.dtype, copy=False),)


def _syrk_gpu_forward(c, a):
    a3 = _as3(a)
    tr, alpha = c.p["transpose"], c.p["alpha"]
    r = GPU.gemm(a3, a3, True, False, alpha) if tr else GPU.gemm(a3, a3, False, True, alpha)
    return view(GPU.mirror(r, True), c.geo.out_shape), a3  # MXNet computes one triangle and mirrors it


def _syrk_gpu_backward(c, a3, grads, dy):
    da = ref.syrk_backward(GPU, _as3(dy), a3, c.p["transpose"], c.p["alpha"])
    return (view(da, c.geo.a_shape),)


# sumlogdiag, inverse, det -------------------------------------------------------------------------------------------

def _sumlogdiag_cpu_forward(c, a):
    return ref.sumlogdiag(a).reshape(c.geo.out_shape), a


def _sumlogdiag_cpu_backward(c, a, grads, dy):
    return (ref.sumlogdiag_backward(dy.reshape(a.shape[:-2]), a),)


def _sumlogdiag_gpu_forward(c, a):
    a3 = _as3(a)
    y = table("sum", table("log", GPU.diag(a3)), axis=1)
    return view(y, c.geo.out_shape), a3


def _sumlogdiag_gpu_backward(c, a3, grads, dy):
    b = a3.shape[0]
    ratio = table("divide", view(dy, (b, 1)), GPU.diag(a3))
    return (view(GPU.from_diag(ratio), c.geo.a_shape),)


def _inverse_cpu_forward(c, a):
    try:
        y = ref.inverse(a)
    except ref.Singular:
        raise DnnbindValueError(f"{INVERSE}: the input matrix is non-convertible (singular), A {a.shape}") from None
    return y, y


def _inverse_cpu_backward(c, y, grads, dy):
    return (ref.inverse_backward(ref.NP, dy, y).astype(y.dtype, copy=False),)


def _inverse_gpu_forward(c, a):
    lu = _clone(_as3(a))
    ipiv = getrf_inplace(lu)
    y = inverse_from_lu(lu, ipiv)
    return view(y, a.shape), y


def _inverse_gpu_backward(c, y, grads, dy):
    return (view(ref.inverse_backward(GPU, _as3(dy), y), dy.shape),)


def _det_cpu_forward(c, a):
    d = ref.det(a)
    return d.reshape(c.geo.out_shape), (a, d)


def _det_cpu_backward(c, saved, grads, dy):
    a, d = saved
    return (ref.det_backward(dy.reshape(d.shape), a, d),)


def _pivot_sign(ipiv: NDArray, dtype) -> NDArray:
    """(-1) ** (the number of rows getrf exchanged), from its 1-based pivots: 1 - 2 * (count(ipiv != 1..n) % 2)."""
    n = ipiv.shape[-1]
    moved = table("not_equal", table("cast", ipiv, dtype=np.dtype(dtype).name),
                  _const("arange", n, True, dtype, ipiv.device))
    parity = table("_mod_scalar", table("sum", moved, axis=1), scalar=2.0)
    return table("_rminus_scalar", table("_mul_scalar", parity, scalar=2.0), scalar=1.0)


def _det_gpu_forward(c, a):
    lu = _clone(_as3(a))
    ipiv = getrf_inplace(lu)
    sign, logabs = _lu_sign_logabs(lu, ipiv)
    d = table("multiply", sign, table("exp", logabs))  # MXNet's sign * exp(log|det|)
    return view(d, c.geo.out_shape), (lu, ipiv, d)


def _det_gpu_backward(c, saved, grads, dy):
    lu, ipiv, d = saved
    b, n, _ = lu.shape
    inv_t = GPU.t(inverse_from_lu(lu, ipiv))
    scale = view(table("multiply", d, view(dy, (b,))), (b, 1, 1))
    da = table("multiply", scale, inv_t)
    # MXNet's StopZeroDetGrad: exactly 0 where det is 0 (the inverse there is inf/nan)
    keep = table("broadcast_to", view(table("_not_equal_scalar", d, scalar=0.0), (b, 1, 1)), shape=(b, n, n))
    da = table("where", keep, da, table("zeros_like", da))
    return (view(da, c.geo.a_shape),)


def _slogdet_cpu_forward(c, a):
    sign, logabs = ref.slogdet(a)
    shape = c.geo.out_shape
    return (sign.reshape(shape), logabs.reshape(shape)), (a, logabs)


def _slogdet_cpu_backward(c, saved, grads, dys):
    a, logabs = saved
    return (ref.slogdet_backward(dys[1].reshape(logabs.shape), a, logabs),)  # the sign takes no gradient


def _lu_sign_logabs(lu: NDArray, ipiv: NDArray) -> tuple:
    """MXNet's SignedLogDet from getrf's factors: (sign, log|det|), each (batch,)."""
    u = GPU.diag(lu)
    sign = table("multiply", _pivot_sign(ipiv, lu.dtype), table("prod", table("sign", u), axis=1))
    return sign, table("sum", table("log", table("abs", u)), axis=1)


def _slogdet_gpu_forward(c, a):
    lu = _clone(_as3(a))
    ipiv = getrf_inplace(lu)
    sign, logabs = _lu_sign_logabs(lu, ipiv)
    shape = c.geo.out_shape
    return (view(sign, shape), view(logabs, shape)), (lu, ipiv, logabs)


def _slogdet_gpu_backward(c, saved, grads, dys):
    lu, ipiv, logabs = saved
    b, n, _ = lu.shape
    da = table("multiply", view(dys[1], (b, 1, 1)), GPU.t(inverse_from_lu(lu, ipiv)))
    # zero where log|det| is -inf (a singular matrix), as MXNet's StopZeroDetGrad
    keep = table("broadcast_to", view(table("_not_equal_scalar", logabs, scalar=-np.inf), (b, 1, 1)),
                 shape=(b, n, n))
    da = table("where", keep, da, table("zeros_like", da))
    return (view(da, c.geo.a_shape),)


# extractdiag, makediag, extracttrian, maketrian: fixed index maps between a matrix and its diagonal / triangle -----

class IndexMap(NamedTuple):
    positions: np.ndarray   # flat indices into the (n, n) matrix, in MXNet's order of the extracted values
    n: int                  # the matrix side


def _index_map(kind: str, n: int, offset: int, lower: bool) -> IndexMap:
    if kind == "diag":
        i = np.arange(n - abs(offset))
        rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    else:
        rows, cols = ref.trian_indices(n, offset, lower)
    return IndexMap(np.asarray(rows * n + cols, np.int64), n)


def _triangular_root(k: int) -> int:
    return int(math.floor(0.5 + (math.sqrt(8 * k + 1) - 1.0) * 0.5))


def _diag_trian_geometry(op: str, p, shape: tuple) -> tuple[Geometry, IndexMap]:
    """MXNet's LaDiagTrianShape: the output shape and the index map of an extract or make op."""
    kind = "diag" if op in (EXTRACTDIAG, MAKEDIAG) else "trian"
    offset, lower = p["offset"], p.get("lower", True)
    if len(shape) == 0:
        raise DnnbindValueError(f"{op}: A must have at least 1 dimension, got a scalar")
    if 0 in shape:
        raise DnnbindValueError(f"{op}: A has a zero-size dimension, shape {tuple(shape)}; MXNet's shape inference "
                                f"takes 0 as unknown and refuses it")
    if op in (EXTRACTDIAG, EXTRACTTRIAN):
        if len(shape) < 2:
            raise DnnbindValueError(f"{op}: Input operand must be a tensor of matrices, got shape {tuple(shape)}")
        if shape[-2] != shape[-1]:
            raise DnnbindValueError(f"{op}: Input operand must be a tensor of square matrices, got shape "
                                    f"{tuple(shape)}")
        n = shape[-1]
        m = n - abs(offset)
        if m <= 0:
            raise DnnbindValueError(f"{op}: Illegal offset {offset} for diag/trian extraction of {n} x {n} matrices")
        imap = _index_map(kind, n, offset, lower)
        return Geometry(tuple(shape[:-2]) + (len(imap.positions),), tuple(shape)), imap
    k = shape[-1]
    m = k if kind == "diag" else _triangular_root(k)
    if kind == "trian" and m * (m + 1) // 2 != k:
        raise DnnbindValueError(f"{op}: Input tensor of maketrian has an invalid dimension for the last axis: {k} is "
                                f"not m (m + 1) / 2 for any m (shape {tuple(shape)})")
    n = m + abs(offset)
    return Geometry(tuple(shape[:-1]) + (n, n), tuple(shape)), _index_map(kind, n, offset, lower)


class DiagGeometry(NamedTuple):
    out_shape: tuple
    a_shape: tuple
    imap: IndexMap


def _diag_prepare(op: str):
    def prepare(p, a):
        g, imap = _diag_trian_geometry(op, p, tuple(a.shape))
        return DiagGeometry(g.out_shape, g.a_shape, imap)
    return prepare


def _diag_infer(op: str):
    def infer(p, shapes):
        g, _ = _diag_trian_geometry(op, p, tuple(shapes[0]))
        return [tuple(shapes[0])], [g.out_shape]
    return infer


def _np_extract(x: np.ndarray, imap: IndexMap) -> np.ndarray:
    return ref.extract(x, imap.positions, imap.n)


def _np_make(v: np.ndarray, imap: IndexMap) -> np.ndarray:
    return ref.make(v, imap.positions, imap.n)


def _extract_cpu_forward(c, a):
    return _np_extract(a, c.geo.imap), None


def _extract_cpu_backward(c, saved, grads, dy):
    return (_np_make(dy, c.geo.imap),)


def _make_cpu_forward(c, a):
    return _np_make(a, c.geo.imap), None


def _make_cpu_backward(c, saved, grads, dy):
    return (_np_extract(dy, c.geo.imap),)


def _positions(imap: IndexMap, device) -> NDArray:
    key = ("positions", imap.n, imap.positions.tobytes(), device)
    hit = _consts.get(key)
    if hit is None:
        with _consts_lock:
            hit = _consts.setdefault(key, array(imap.positions, device=device, dtype=np.int64))
    return hit


def _scatter_map(imap: IndexMap, device) -> NDArray:
    """For each of the n * n matrix elements, the index of its value among the m extracted ones, or m (a zero
    column appended to them) where it takes none: making a matrix is then one gather."""
    key = ("scatter", imap.n, imap.positions.tobytes(), device)
    hit = _consts.get(key)
    if hit is None:
        m = len(imap.positions)
        host = np.full(imap.n * imap.n, m, np.int64)
        host[imap.positions] = np.arange(m)
        with _consts_lock:
            hit = _consts.setdefault(key, array(host, device=device, dtype=np.int64))
    return hit


def _gpu_extract(x: NDArray, imap: IndexMap, out_shape: tuple) -> NDArray:
    rows = math.prod(x.shape[:-2])
    flat = view(x, (rows, imap.n * imap.n))
    return view(table("take", flat, _positions(imap, x.device), axis=1), out_shape)


def _gpu_make(v: NDArray, imap: IndexMap, out_shape: tuple) -> NDArray:
    rows, m = math.prod(v.shape[:-1]), v.shape[-1]
    padded = table("concat", view(v, (rows, m)), zeros((rows, 1), v.dtype, v.device), dim=1)
    return view(table("take", padded, _scatter_map(imap, v.device), axis=1), out_shape)


def _extract_gpu_forward(c, a):
    return _gpu_extract(a, c.geo.imap, c.geo.out_shape), None


def _extract_gpu_backward(c, saved, grads, dy):
    return (_gpu_make(dy, c.geo.imap, c.geo.a_shape),)


def _make_gpu_forward(c, a):
    return _gpu_make(a, c.geo.imap, c.geo.out_shape), None


def _make_gpu_backward(c, saved, grads, dy):
    return (_gpu_extract(dy, c.geo.imap, c.geo.a_shape),)


# samples: well-conditioned inputs; triangular ones with values in the ignored triangle --------------------------------

def _spd(rng, shape):
    x = rng.standard_normal(shape)
    n = shape[-1]
    return np.matmul(x, np.swapaxes(x, -1, -2)) / n + np.eye(n) * 1.5


def _triangular(rng, shape):
    """Random matrices with a diagonal of magnitude 1.5-2.5 (either sign): well-conditioned triangles."""
    x = rng.standard_normal(shape) * 0.5
    n = shape[-1]
    d = rng.uniform(1.5, 2.5, shape[:-1]) * rng.choice([-1.0, 1.0], shape[:-1])
    x[..., np.arange(n), np.arange(n)] = d
    return x


def _gemm_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 3, 4)), "B": x((2, 4, 5)), "C": x((2, 3, 5))}, {"alpha": 0.7, "beta": 0.4}
    yield {"A": x((4, 3)), "B": x((5, 4)), "C": x((3, 5))}, {"transpose_a": True, "transpose_b": True}
    yield {"A": x((3, 2, 4)), "B": x((4, 2, 5)), "C": x((3, 2, 5))}, {"axis": 0, "alpha": -1.5, "beta": 2.0}
    yield {"A": x((1, 2, 1, 3)), "B": x((1, 2, 1, 3)), "C": x((1, 2, 1, 1))}, {"transpose_b": True}


def _gemm2_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 3, 4)), "B": x((2, 4, 5))}, {"alpha": 0.7}
    yield {"A": x((4, 3)), "B": x((4, 5))}, {"transpose_a": True}
    yield {"A": x((2, 2, 3, 4)), "B": x((2, 2, 5, 4))}, {"transpose_b": True, "alpha": -2.0}
    yield {"A": x((3, 2, 4)), "B": x((4, 2, 5))}, {"axis": -3}


def _potrf_samples(rng):
    yield {"A": _spd(rng, (2, 3, 3))}, {}
    yield {"A": _spd(rng, (4, 4))}, {"lower": False}
    yield {"A": _spd(rng, (2, 1, 2, 2))}, {}


def _potri_samples(rng):
    yield {"A": _triangular(rng, (2, 3, 3))}, {}
    yield {"A": _triangular(rng, (4, 4))}, {"lower": False}
    yield {"A": _triangular(rng, (1, 1, 1))}, {}


def _tri_samples(rng):
    x = rng.standard_normal
    yield {"A": _triangular(rng, (2, 3, 3)), "B": x((2, 3, 4))}, {}
    yield {"A": _triangular(rng, (2, 3, 3)), "B": x((2, 4, 3))}, {"rightside": True, "alpha": 0.5}
    yield {"A": _triangular(rng, (3, 3)), "B": x((3, 2))}, {"transpose": True, "lower": False, "alpha": -2.0}
    yield {"A": _triangular(rng, (2, 1, 4, 4)), "B": x((2, 1, 3, 4))}, {"rightside": True, "transpose": True,
                                                                         "lower": False}


def _syrk_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 3, 4))}, {}
    yield {"A": x((3, 4))}, {"transpose": True, "alpha": 0.6}
    yield {"A": x((2, 1, 1, 3))}, {"alpha": -1.0}


def _sumlogdiag_samples(rng):
    yield {"A": _spd(rng, (2, 3, 3))}, {}
    yield {"A": np.abs(_triangular(rng, (4, 4)))}, {}
    yield {"A": _spd(rng, (3, 1, 1))}, {}


def _inverse_samples(rng):
    yield {"A": _spd(rng, (2, 3, 3)) + rng.standard_normal((2, 3, 3)) * 0.3}, {}
    yield {"A": _triangular(rng, (4, 4)) + rng.standard_normal((4, 4)) * 0.2}, {}
    yield {"A": _triangular(rng, (2, 2, 1, 1))}, {}


def _det_samples(rng):
    yield {"A": rng.standard_normal((2, 3, 3)) + np.eye(3)}, {}
    yield {"A": _triangular(rng, (4, 4)) + rng.standard_normal((4, 4)) * 0.3}, {}
    yield {"A": rng.standard_normal((3, 2, 2))}, {}


def _slogdet_samples(rng):
    yield {"A": rng.standard_normal((2, 3, 3)) + np.eye(3)}, {}
    yield {"A": -_spd(rng, (4, 4))}, {}


def _extract_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 3, 3))}, {}
    yield {"A": x((4, 4))}, {"offset": -1}
    yield {"A": x((2, 1, 4, 4))}, {"offset": 2}


def _extracttrian_samples(rng):
    yield from _extract_samples(rng)
    yield {"A": rng.standard_normal((3, 3))}, {"lower": False}


def _makediag_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 3))}, {}
    yield {"A": x((3,))}, {"offset": 1}
    yield {"A": x((2, 1, 3))}, {"offset": -2}


def _maketrian_samples(rng):
    x = rng.standard_normal
    yield {"A": x((2, 6))}, {}
    yield {"A": x((10,))}, {"lower": False}
    yield {"A": x((2, 3))}, {"offset": 1}
    yield {"A": x((2, 1, 6))}, {"offset": -2, "lower": False}


def _nd(op: str) -> tuple:
    """``nd._linalg_gemm`` and MXNet's alias ``nd.linalg_gemm`` (nd.linalg.gemm comes from the name)."""
    return (op, op[1:])


def _square(op: str, samples, cpu: Lowering, gpu: Lowering, doc: str, **kw) -> OpDef:
    return OpDef(op, prepare=_square_prepare(op), infer=_square_infer(op), samples=samples, cpu=cpu, gpu=gpu,
                 doc=doc, nd=_nd(op), **kw)


define(OpDef(GEMM, nd=_nd(GEMM), prepare=_gemm_prepare, infer=_gemm_infer, samples=_gemm_samples,
             cpu=Lowering(_gemm_cpu_forward, _gemm_cpu_backward), gpu=Lowering(_gemm_gpu_forward, _gemm_gpu_backward),
             doc="alpha * op(A) op(B) + beta * C on stacks of matrices (nd.linalg.gemm)."))
define(OpDef(GEMM2, nd=_nd(GEMM2), prepare=_gemm2_prepare, infer=_gemm2_infer, samples=_gemm2_samples,
             cpu=Lowering(_gemm_cpu_forward, _gemm_cpu_backward), gpu=Lowering(_gemm_gpu_forward, _gemm_gpu_backward),
             doc="alpha * op(A) op(B) on stacks of matrices (nd.linalg.gemm2)."))
define(_square(POTRF, _potrf_samples, Lowering(_potrf_cpu_forward, _potrf_cpu_backward),
               Lowering(_potrf_gpu_forward, _potrf_gpu_backward),
               "Cholesky factor of symmetric positive-definite matrices (nd.linalg.potrf).", extra=_LOWER,
               loss=True))  # its gradient is MXNet's symmetric one, not the derivative of the triangle it reads
define(_square(POTRI, _potri_samples, Lowering(_potri_cpu_forward, _potri_cpu_backward),
               Lowering(_potri_gpu_forward, _potri_gpu_backward),
               "inverse(L L^T) from Cholesky factors L (nd.linalg.potri).", extra=_LOWER))
define(OpDef(TRSM, nd=_nd(TRSM), prepare=_tri_prepare(TRSM), infer=_tri_infer(TRSM), samples=_tri_samples,
             cpu=Lowering(_trsm_cpu_forward, _trsm_cpu_backward), gpu=Lowering(_trsm_gpu_forward, _trsm_gpu_backward),
             doc="Solves op(A) X = alpha B (or X op(A) = alpha B) for triangular A (nd.linalg.trsm)."))
define(OpDef(TRMM, nd=_nd(TRMM), prepare=_tri_prepare(TRMM), infer=_tri_infer(TRMM), samples=_tri_samples,
             cpu=Lowering(_trmm_cpu_forward, _trmm_cpu_backward), gpu=Lowering(_trmm_gpu_forward, _trmm_gpu_backward),
             doc="alpha * op(A) B (or alpha * B op(A)) for triangular A (nd.linalg.trmm)."))
define(OpDef(SYRK, nd=_nd(SYRK), prepare=_syrk_prepare, infer=_syrk_infer, samples=_syrk_samples,
             cpu=Lowering(_syrk_cpu_forward, _syrk_cpu_backward), gpu=Lowering(_syrk_gpu_forward, _syrk_gpu_backward),
             doc="alpha * A A^T (or alpha * A^T A) (nd.linalg.syrk)."))
define(_square(SUMLOGDIAG, _sumlogdiag_samples, Lowering(_sumlogdiag_cpu_forward, _sumlogdiag_cpu_backward),
               Lowering(_sumlogdiag_gpu_forward, _sumlogdiag_gpu_backward),
               "The sum of the logarithms of the diagonal of each matrix (nd.linalg.sumlogdiag)."))
define(_square(INVERSE, _inverse_samples, Lowering(_inverse_cpu_forward, _inverse_cpu_backward),
               Lowering(_inverse_gpu_forward, _inverse_gpu_backward), "Matrix inverse (nd.linalg.inverse)."))
define(_square(DET, _det_samples, Lowering(_det_cpu_forward, _det_cpu_backward),
               Lowering(_det_gpu_forward, _det_gpu_backward), "Determinant (nd.linalg.det).",
               outputs=lambda p: (3, ["output0"])))  # MXNet's node also keeps LU and the pivots, hidden
define(_square(SLOGDET, _slogdet_samples, Lowering(_slogdet_cpu_forward, _slogdet_cpu_backward),
               Lowering(_slogdet_gpu_forward, _slogdet_gpu_backward),
               "Sign and log of the absolute value of the determinant (nd.linalg.slogdet).", grad_outputs=True,
               outputs=lambda p: (4, ["output0", "output1"])))  # (MXNet's node also keeps LU and the pivots)
for _op, _samples, _cpu, _gpu, _doc in (
        (EXTRACTDIAG, _extract_samples, (_extract_cpu_forward, _extract_cpu_backward),
         (_extract_gpu_forward, _extract_gpu_backward), "The diagonal at offset of each matrix."),
        (MAKEDIAG, _makediag_samples, (_make_cpu_forward, _make_cpu_backward),
         (_make_gpu_forward, _make_gpu_backward), "Square matrices with the given diagonal at offset."),
        (EXTRACTTRIAN, _extracttrian_samples, (_extract_cpu_forward, _extract_cpu_backward),
         (_extract_gpu_forward, _extract_gpu_backward), "The lower (upper) triangle at offset, row by row."),
        (MAKETRIAN, _maketrian_samples, (_make_cpu_forward, _make_cpu_backward),
         (_make_gpu_forward, _make_gpu_backward), "Triangular matrices from their packed triangle.")):
    # any dtype, as MXNet (a copy of elements); the gradient is the inverse copy
    define(OpDef(_op, nd=_nd(_op), prepare=_diag_prepare(_op), infer=_diag_infer(_op), samples=_samples,
                 cpu=Lowering(*_cpu), gpu=Lowering(*_gpu), doc=_doc + f" (nd.linalg.{_op[8:]})"))
