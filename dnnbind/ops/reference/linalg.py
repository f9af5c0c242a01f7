"""Layer ops (reference): numpy twins of MXNet's ``_linalg_*`` operators (la_op.cc), and their gradients.

Every array is a stack of matrices: the last two axes are the matrix, the leading ones a batch (gemm's ``axis``
moves the row axis elsewhere; the callers swap it to -2 first). Row-major, as MXNet's tensors are.

The gradient formulas (MXNet's la_op-inl.h, after Seeger et al., arXiv:1710.08717) are written once, over a small
kit of matrix primitives (``NumpyKit`` here; ops/defs/linalg.py passes its cuBLAS/cuSOLVER kit), so the GPU backward
is the same algebra as the twin's. Each primitive works on stacks of matrices:

- ``gemm(a, b, ta, tb, alpha, beta=0, c=None)``: alpha op(a) op(b) + beta c
- ``trsm(a, b, alpha, rightside, lower, transpose)``: op(tri(a)) x = alpha b, or x op(tri(a)) = alpha b
- ``trmm(a, b, alpha, rightside, lower, transpose)``: alpha op(tri(a)) b, or alpha b op(tri(a))
- ``tri(x, lower)``: the lower (upper) triangle and diagonal, the rest zero
- ``mirror(x, lower)``: the lower (upper) triangle copied onto the other side (a symmetric matrix)
- ``t(x)``: the matrices transposed; ``add(x, y)``; ``diag(x)``: (..., n); ``from_diag(v)``: (..., n, n)
"""

from __future__ import annotations

import numpy as np


class NumpyKit:
    """The matrix primitives on numpy stacks (float64 or float32, computed in the arrays' own type)."""

    @staticmethod
    def t(x):
        return np.swapaxes(x, -1, -2)

    @staticmethod
    def gemm(a, b, ta=False, tb=False, alpha=1.0, beta=0.0, c=None):
        a = np.swapaxes(a, -1, -2) if ta else a
        b = np.swapaxes(b, -1, -2) if tb else b
        r = np.matmul(a, b) * a.dtype.type(alpha)
        if c is not None and beta != 0:
            r = r + c * a.dtype.type(beta)
        return r

    @staticmethod
    def tri(x, lower=True):
        return np.tril(x) if lower else np.triu(x)

    @staticmethod
    def mirror(x, lower=True):
        if lower:
            return np.tril(x) + np.swapaxes(np.tril(x, -1), -1, -2)
        return np.triu(x) + np.swapaxes(np.triu(x, 1), -1, -2)

    @classmethod
    def _op(cls, a, lower, transpose):
        a = cls.tri(a, lower)
        return np.swapaxes(a, -1, -2) if transpose else a

    @classmethod
    def trsm(cls, a, b, alpha=1.0, rightside=False, lower=True, transpose=False):
        op = cls._op(a, lower, transpose)
        rhs = b * b.dtype.type(alpha)
        if rightside:  # x op = rhs  <=>  op^T x^T = rhs^T
            return np.swapaxes(np.linalg.solve(np.swapaxes(op, -1, -2), np.swapaxes(rhs, -1, -2)), -1, -2)
        return np.linalg.solve(op, rhs).astype(b.dtype, copy=False)

    @classmethod
    def trmm(cls, a, b, alpha=1.0, rightside=False, lower=True, transpose=False):
        op = cls._op(a, lower, transpose)
        r = np.matmul(b, op) if rightside else np.matmul(op, b)
        return r * b.dtype.type(alpha)

    @staticmethod
    def add(x, y):
        return x + y

    @staticmethod
    def scale(x, s):
        return x * x.dtype.type(s)

    @staticmethod
    def diag(x):
        return np.diagonal(x, axis1=-2, axis2=-1)

    @staticmethod
    def from_diag(v):
        n = v.shape[-1]
        return v[..., :, None] * np.eye(n, dtype=v.dtype)


NP = NumpyKit


def _cast(x, like):
    return np.asarray(x, dtype=like.dtype)


# -- forwards -----------------------------------------------------------------------------------------------------

def gemm(a, b, c, ta=False, tb=False, alpha=1.0, beta=1.0):
    """alpha op(a) op(b) + beta c on stacks (row axis -2)."""
    return _cast(NP.gemm(a, b, ta, tb, alpha, beta, c), a)


def gemm2(a, b, ta=False, tb=False, alpha=1.0):
    return _cast(NP.gemm(a, b, ta, tb, alpha), a)


class NotPositiveDefinite(ValueError):
    """A matrix potrf cannot factor (its symmetric matrix is not positive definite)."""


def potrf(a, lower=True):
    """The Cholesky factor of the symmetric matrix MXNet reads from ``a``'s lower (upper) triangle: L with
    L L^T = A (lower), or U with U^T U = A (upper); the other triangle is zero."""
    s = NP.mirror(a, lower)
    try:
        f = np.linalg.cholesky(s)
    except np.linalg.LinAlgError:
        raise NotPositiveDefinite() from None
    return _cast(f if lower else np.swapaxes(f, -1, -2), a)


def potri(a, lower=True):
    """inverse(L L^T) from the triangle L of ``a`` (inverse(U^T U) for upper), symmetric: MXNet computes one triangle
    (LAPACK potri) and mirrors it."""
    eye = np.broadcast_to(np.eye(a.shape[-1], dtype=a.dtype), a.shape)
    x = NP.trsm(a, eye, 1.0, False, lower, False)  # tri(a)^-1
    r = NP.gemm(x, x, ta=True) if lower else NP.gemm(x, x, tb=True)  # L^-T L^-1 or U^-1 U^-T
    return _cast(NP.mirror(r, lower), a)


def trsm(a, b, transpose=False, rightside=False, lower=True, alpha=1.0):
    return _cast(NP.trsm(a, b, alpha, rightside, lower, transpose), b)


def trmm(a, b, transpose=False, rightside=False, lower=True, alpha=1.0):
    return _cast(NP.trmm(a, b, alpha, rightside, lower, transpose), b)


def syrk(a, transpose=False, alpha=1.0):
    """alpha a a^T (alpha a^T a with transpose), computed in one triangle and mirrored, as MXNet."""
    r = NP.gemm(a, a, ta=True, alpha=alpha) if transpose else NP.gemm(a, a, tb=True, alpha=alpha)
    return _cast(NP.mirror(r, True), a)


def sumlogdiag(a):
    with np.errstate(divide="ignore", invalid="ignore"):  # MXNet gives -inf / nan for a non-positive diagonal
        return _cast(np.sum(np.log(NP.diag(a)), axis=-1), a)


class Singular(ValueError):
    """A matrix inverse cannot invert."""


def inverse(a):
    try:
        return _cast(np.linalg.inv(a), a)
    except np.linalg.LinAlgError:
        raise Singular() from None


def slogdet(a):
    """(sign, log|det|) from the LU factorization (MXNet's SignedLogDet: the pivots' parity times the signs of U's
    diagonal; log|det| the sum of log|u_ii|, -inf for a singular matrix)."""
    sign, logabs = np.linalg.slogdet(a)
    return _cast(sign, a), _cast(logabs, a)


def det(a):
    """sign * exp(log|det|), as MXNet computes it (0 for a singular matrix)."""
    sign, logabs = slogdet(a)
    with np.errstate(over="ignore"):
        return _cast(sign * np.exp(logabs), a)


def trian_indices(n: int, offset: int, lower: bool):
    """The (rows, cols) MXNet's extracttrian reads, in its order: row by row of the lower triangle of the matrix,
    or of its transpose for the upper one (offset > 0, or offset 0 with lower false)."""
    k = abs(offset)
    m = n - k
    r, c = np.tril_indices(m)
    r = r + k
    if offset > 0 or (offset == 0 and not lower):
        return c, r
    return r, c


def extract(x, positions, n: int):
    """The elements at flat ``positions`` of each (n, n) matrix (extractdiag, extracttrian; makediag's and
    maketrian's gradient)."""
    flat = x.reshape(x.shape[:-2] + (n * n,))
    return np.ascontiguousarray(flat[..., positions])


def make(v, positions, n: int):
    """(n, n) matrices, zero but for ``v`` at the flat ``positions`` (makediag, maketrian; the extracts'
    gradient)."""
    out = np.zeros(v.shape[:-1] + (n * n,), v.dtype)
    out[..., positions] = v
    return out.reshape(v.shape[:-1] + (n, n))


# -- gradients (one formula each, over a kit K) ---------------------------------------------------------------------

def gemm_backward(K, dy, a, b, ta, tb, alpha, beta, with_c=True):
    """(da, db, dc) of alpha op(a) op(b) + beta c (dc None for gemm2)."""
    da = K.gemm(b, dy, tb, True, alpha) if ta else K.gemm(dy, b, False, not tb, alpha)
    db = K.gemm(dy, a, True, ta, alpha) if tb else K.gemm(a, dy, not ta, False, alpha)
    dc = K.scale(dy, beta) if with_c else None
    return da, db, dc


def potrf_backward(K, dl, l, lower):
    """0.5 L^-T mirror_lower(L^T dL) L^-1 (with L = U^T, dL = dU^T for the upper factor): MXNet's gradient with
    respect to a symmetric A (symmetric itself), not the derivative of the one triangle the forward reads."""
    if not lower:
        l, dl = K.t(l), K.t(dl)
    m = K.mirror(K.gemm(l, dl, True, False), True)
    m = K.trsm(l, m, 1.0, False, True, True)
    return K.trsm(l, m, 0.5, True, True, False)


def potri_backward(K, dy, b, y, lower):
    """-tri(Y (dY + dY^T) B^-T) (lower), -tri(B^-T (dY + dY^T) Y) (upper): B the input factor, Y the output."""
    if lower:
        g = K.add(K.gemm(y, dy), K.gemm(y, dy, False, True))
        g = K.trsm(b, g, -1.0, True, True, True)
    else:
        g = K.add(K.gemm(dy, y), K.gemm(dy, y, True, False))
        g = K.trsm(b, g, -1.0, False, False, True)
    return K.tri(g, lower)


def trsm_backward(K, dc, a, c, transpose, rightside, lower, alpha):
    """(da, db) of C = trsm(A, B): dB solves the transposed system; dA = -(1/alpha) dB C^T (or C^T dB), on A's
    triangle."""
    db = K.trsm(a, dc, alpha, rightside, lower, not transpose)
    scale = -1.0 / alpha
    if rightside == transpose:
        da = K.gemm(db, c, transpose, not transpose, scale)
    else:
        da = K.gemm(c, db, not transpose, transpose, scale)
    return K.tri(da, lower), db


def trmm_backward(K, dc, a, b, transpose, rightside, lower, alpha):
    if rightside == transpose:
        da = K.gemm(dc, b, transpose, not transpose, alpha)
    else:
        da = K.gemm(b, dc, not transpose, transpose, alpha)
    db = K.trmm(a, dc, alpha, rightside, lower, not transpose)
    return K.tri(da, lower), db


def syrk_backward(K, dy, a, transpose, alpha):
    if transpose:
        return K.add(K.gemm(a, dy, False, False, alpha), K.gemm(a, dy, False, True, alpha))
    return K.add(K.gemm(dy, a, False, False, alpha), K.gemm(dy, a, True, False, alpha))


def inverse_backward(K, dy, y):
    """-Y^T dY Y^T (Y the inverse)."""
    return K.gemm(y, K.gemm(dy, y, False, True), True, False, -1.0)


# numpy-only gradients (the GPU composes its own from its kit) ------------------------------------------------------

def sumlogdiag_backward(dy, a):
    return _cast(NP.from_diag(dy[..., None] / NP.diag(a)), a)


def _inverse_or_zero(a, keep):
    """inverse(a) where ``keep``, zeros elsewhere (a singular matrix has none)."""
    eye = np.eye(a.shape[-1], dtype=a.dtype)
    safe = np.where(keep[..., None, None], a, eye)
    return np.where(keep[..., None, None], np.linalg.inv(safe), 0)


def det_backward(ddet, a, d):
    """det * ddet * A^-T, zero where det is 0 (MXNet's StopZeroDetGrad)."""
    keep = d != 0
    inv = _inverse_or_zero(a, keep)
    return _cast((d * ddet)[..., None, None] * np.swapaxes(inv, -1, -2), a)


def slogdet_backward(dlogabs, a, logabs):
    """dlogabs * A^-T, zero where log|det| is -inf; the sign takes no gradient."""
    keep = logabs != -np.inf
    inv = _inverse_or_zero(a, keep)
    return _cast(dlogabs[..., None, None] * np.swapaxes(inv, -1, -2), a)
