"""Layer nd: ``nd.random`` / ``mx.random``: one seedable random state for every dnnbind random source.

Imports runtime and kernels.strided (lazily). ``seed(n)`` resets the state; every draw takes the next
``(seed, offset)`` slice of it. On the GPU the numbers come from a counter-based generator in a generated
kernel (they depend only on the seed and the draw's offset, so a seeded run repeats exactly and the kernels
are graph-capturable); on the cpu from numpy's PCG64 seeded the same way. Dropout draws its seeds from here too:
on the cpu one per call, on the GPU one whenever cuDNN's dropout RNG state is (re)seeded (``generation()``).
Like MXNet, the cpu and GPU streams differ.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import numpy as np

from .._lib.hooks import RECORDING
from ..runtime.array import NDArray, empty
from ..runtime import rng
from ..runtime.device import as_device
from ._creation import as_dtype, as_shape
from ..ops.args import check_fits
from ._params import dtype_name, float_arg, int_arg, into, reject


__all__ = ["seed", "uniform", "normal", "randn", "randint", "shuffle", "exponential", "poisson", "multinomial",
           "next_seed"]

def seed(seed_state: int, ctx="all") -> None:
    """``mx.random.seed(n)``: reset dnnbind's random state (both devices: ``ctx`` is accepted and ignored).

    Also seeds numpy's global generator, which dnnbind's initializers and the DataLoader's shuffling draw
    from (as MXNet's initializers draw from mx.random), so one call makes a whole run repeatable."""
    if not isinstance(seed_state, (int, np.integer)) or isinstance(seed_state, bool):
        raise DnnbindTypeError(f"random.seed: seed must be an int, got {type(seed_state).__name__}")
    rng.reseed(int(seed_state))
    np.random.seed(int(seed_state) % (1 << 32))


_take, next_seed, generation, _host_rng = rng.take, rng.next_seed, rng.generation, rng.host_rng


_FLOAT_DTYPES = ("float16", "float32", "float64")
_OPS = {"uniform": "_random_uniform", "normal": "_random_normal", "randint": "_random_randint"}


def _params(dist: str, kwargs: dict, p0, p1, dtype, names: tuple) -> None:
    """MXNet's checks of a draw's parameters: known keywords only, numbers (per-element NDArray parameters, MXNet's
    _sample_* ops, are not supported), the dtypes the op declares."""
    op = _OPS[dist]
    if kwargs:
        reject(op, kwargs)
    for n, v in zip(names, (p0, p1)):
        if isinstance(v, NDArray):
            raise NotImplementedError(f"nd.random.{dist}: {n} as an NDArray (one draw per element) is not "
                                      "supported by dnnbind; pass a number")
        if dist == "randint":
            int_arg(op, n, v, kind="long")
        elif not np.isfinite(float_arg(op, n, v)):
            raise DnnbindValueError(f"nd.random.{dist}: {n} must be finite, got {v}")
    dtype_name(op, dtype, ("int32", "int64") if dist == "randint" else _FLOAT_DTYPES)


def _draw(dist: str, p0, p1, shape, dtype, ctx, out) -> NDArray:
    if out is not None and not isinstance(out, NDArray):
        raise DnnbindTypeError(f"random.{dist}: out must be an NDArray, got {type(out).__name__}")
    unset = shape is None or (type(shape) is tuple and not shape)
    if out is not None and unset:  # MXNet fills ``out``: its shape and dtype
        shape, dtype, unset = out.shape, out.dtype if dtype is None else dtype, False
    shape = as_shape(f"random.{dist}", (1,) if unset else shape)
    if out is not None and shape != out.shape:
        raise DnnbindValueError(f"random.{dist}: shape {shape} differs from out's shape {out.shape}")
    dtype = as_dtype(dtype)
    check_fits(f"random.{dist}", out.device if out is not None else as_device(ctx), dtype, "the draw", shape,
               cudnn=False)
    dev = out.device if out is not None else as_device(ctx)
    if dev.kind == "cpu":
        gen = _host_rng()
        if dist == "uniform":
            host = gen.uniform(p0, p1, shape)
        elif dist == "normal":
            host = gen.normal(p0, p1, shape)
        else:
            host = gen.integers(int(p0), int(p1), shape)
        r = NDArray._from_numpy(np.asarray(host.astype(dtype), order="C"))
    else:
        from ..kernels import strided
        from ..runtime.stream import current_stream
        from ._lower import contiguous_strides
        r = empty(shape, dtype, dev)
        if RECORDING:  # the seed and offset are host values baked into the launch: a replay would repeat them
            RECORDING[-1].refuse(f"nd.random.{dist} draws from a host-side counter that a replay cannot advance")
        s, off = _take(r.size)
        if r.size:
            strided.random_fill(strided.Ref(r.ptr, dtype, contiguous_strides(shape)), r.size, dist, s, off,
                                float(p0), float(p1), stream=current_stream(dev), device=dev.index)
    if out is not None:
        out[:] = r
        return out
    return r


def _check_range(op, low, high):
    if not low < high:
        raise DnnbindValueError(f"random.{op}: low ({low}) must be less than high ({high})")


def uniform(low=0.0, high=1.0, shape=None, dtype=None, ctx=None, out=None, name=None, **kwargs) -> NDArray:
    """Uniform numbers in [low, high) (MXNet's ``_random_uniform``), float32 unless ``dtype`` says otherwise."""
    _params("uniform", kwargs, low, high, dtype, ("low", "high"))
    _check_range("uniform", low, high)
    return _draw("uniform", low, high, shape, dtype, ctx, out)


def normal(loc=0.0, scale=1.0, shape=None, dtype=None, ctx=None, out=None, name=None, **kwargs) -> NDArray:
    """Normal numbers of mean ``loc`` and standard deviation ``scale`` (MXNet's ``_random_normal``)."""
    _params("normal", kwargs, loc, scale, dtype, ("loc", "scale"))
    if scale < 0:
        raise DnnbindValueError(f"random.normal: scale must be >= 0, got {scale}")
    return _draw("normal", loc, scale, shape, dtype, ctx, out)


def randn(*shape, loc=0.0, scale=1.0, dtype=None, ctx=None, out=None, name=None, **kwargs) -> NDArray:
    """``randn(2, 3)``: normal numbers of that shape (MXNet's ``_random_normal``)."""
    _params("normal", kwargs, loc, scale, dtype, ("loc", "scale"))
    return normal(loc, scale, shape or None, dtype, ctx, out)


def randint(low, high, shape=None, dtype=None, ctx=None, out=None, name=None, **kwargs) -> NDArray:
    """Integers in [low, high) (MXNet's ``_random_randint``), int32 unless ``dtype`` is 'int64'."""
    _params("randint", kwargs, low, high, dtype, ("low", "high"))
    _check_range("randint", low, high)
    return _draw("randint", low, high, shape, dtype or "int32", ctx, out)


def shuffle(data, out=None, name=None, **kwargs) -> NDArray:
    """A copy of ``data`` with its first axis permuted (the permutation drawn from the shared state); ``out`` takes
    it, ``name`` is ignored."""
    from ._params import array_arg
    if kwargs:
        reject("_shuffle", kwargs)
    data = array_arg("random.shuffle", "data", data)
    if data.ndim == 0:
        raise DnnbindValueError("random.shuffle: data must have at least one axis, got a 0-d array")
    if out is not None:
        return into(out, shuffle(data))
    perm = _host_rng().permutation(data.shape[0]).astype(np.int64)
    from ._registry import call
    from ..runtime.array import array
    return call("take", data, array(perm, device=data.device), axis=0)


def _unsupported(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"nd.random.{name} is not supported by dnnbind yet")
    fn.__name__ = name
    return fn


exponential = _unsupported("exponential")
poisson = _unsupported("poisson")
multinomial = _unsupported("multinomial")


def _composites() -> None:
    """The random operators a symbol graph writes (``F.random.uniform`` is an ``_random_uniform`` node with no
    inputs, ``ctx`` '' for the default device): registry entries with no nd names of their own."""
    from ._registry import composite

    def ctx_of(ctx):
        return None if ctx in ("", None) else ctx

    composite("_random_uniform", lambda low=0.0, high=1.0, shape=None, ctx=None, dtype=None:
              uniform(low, high, shape, dtype, ctx_of(ctx)), nd=())
    composite("_random_normal", lambda loc=0.0, scale=1.0, shape=None, ctx=None, dtype=None:
              normal(loc, scale, shape, dtype, ctx_of(ctx)), nd=())
    composite("_random_randint", lambda low=None, high=None, shape=None, ctx=None, dtype=None:
              randint(low, high, shape, dtype, ctx_of(ctx)), nd=())
    composite("_shuffle", lambda data: shuffle(data), nd=())


_composites()
