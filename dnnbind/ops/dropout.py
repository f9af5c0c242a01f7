"""Layer 2 (ops): inverted dropout through cuDNN (cudnnDropoutForward/Backward). Imports _lib, runtime and ops.

cuDNN keeps its random-number generator in a device buffer of RNG states (~6.5 MB) that cudnnSetDropoutDescriptor
seeds with a kernel and every cudnnDropoutForward advances in place, so consecutive calls (and the replays of a
captured or recorded step) draw fresh masks. dnnbind keeps one such buffer per cuDNN handle, i.e. per (device,
stream): launches on one stream run in order, so they never use it at the same time.

Per handle (``RngState``): the states buffer, the seed and the ``generation`` it was seeded at, and one dropout
descriptor per rate p. The first descriptor seeds the states (cudnnSetDropoutDescriptor); a new p gets its own
descriptor attached to the same states by cudnnRestoreDropoutDescriptor (no re-seeding). A descriptor per p, not
one re-pointed at each p, because cudnnDropoutBackward reads p (the 1/(1-p) scale) from the descriptor: with two
rates in one network the first layer's backward would otherwise run with the last forward's p, and a recorded
step replays its calls with the descriptors it recorded.

Seeding: the caller passes ``seed`` (an int, or a function returning one, called only when seeding happens) and a
``generation``; the states are seeded at the first call on a handle and, unless ``generation`` is None, again
whenever it differs from the one they were seeded at. nd.Dropout passes ``nd.random.next_seed`` and
``nd.random.generation()``, so ``mx.random.seed(n)`` makes the masks that follow repeat exactly.

NOTE: seeding launches a kernel into the states buffer; inside a CUDA-graph capture it would become a graph node
re-seeding on every replay (identical masks each step), and a RecordedStep would replay it likewise. So seeding
is refused there (RuntimeError): run the step once eagerly first (CapturedStep/RecordedStep's warm-up does) and
call ``mx.random.seed`` outside the step. A descriptor for a new p (create + restore) launches no kernel and is
allowed anywhere (restore is host-only as documented; not yet seen inside a capture on a GPU).
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import ctypes
import threading

import numpy as np

from .._lib import cudart, cudnn
from .._lib.errors import CudnnError
from .._lib.hooks import RECORDING
from ..runtime.array import NDArray, empty
from ..runtime.device import as_device
from ..runtime.handles import cudnn_handle
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import current_stream
from . import descriptors as D
from . import tensor_layout as TL
from ._common import cache_insert, dnn, float_dtype, out_like, with_context
from ._dispatch import op
from .reference import dropout as reference
from .reference.dropout import dropout_p, resolve_seed
from .tensor_ops import set_tensor

L = cudnn.lib

__all__ = ["dropout_backward", "dropout_forward", "dropout_mask", "reserve_size", "rng_state"]

RATES_PER_HANDLE = 32  # dropout descriptors kept per handle (one per rate p); beyond it the oldest is dropped
_UNSEEDED = object()  # the generation of states seeded with generation=None (any other generation re-seeds them)


class DropoutDesc(D.OwnedDescriptor):
    _create, _destroy = "cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor"
    __slots__ = ()


class RngState:
    """cuDNN's dropout RNG states for one handle, the seed and generation they were seeded at, and the
    descriptors (one per p) that point at them."""

    __slots__ = ("handle", "states", "seed", "generation", "descs")

    def __init__(self, handle: int, states: DeviceBuffer):
        self.handle, self.states = handle, states
        self.seed, self.generation, self.descs = 0, _UNSEEDED, {}

    def seed_with(self, p: float, seed: int, generation) -> None:
        """Seed the states (a kernel on the handle's stream) through a fresh descriptor for ``p``. Descriptors of
        other rates are dropped (a recorded step holding one keeps it alive: it points at these same states)."""
        desc = DropoutDesc()
        L.cudnnSetDropoutDescriptor(desc, self.handle, p, self.states.ptr, self.states.nbytes, seed)
        self.seed, self.generation, self.descs = seed, generation, {p: desc}

    def desc(self, p: float) -> DropoutDesc:
        """The descriptor for rate ``p``, attached to the already-seeded states (host-only, no kernel)."""
        d = self.descs.get(p)
        if d is None:
            with _lock:
                d = self.descs.get(p)
                if d is None:
                    d = DropoutDesc()
                    # NOTE: restore ignores the seed (it only records it); the states are used as they are.
                    L.cudnnRestoreDropoutDescriptor(d, self.handle, p, self.states.ptr, self.states.nbytes,
                                                    self.seed)
                    if len(self.descs) >= RATES_PER_HANDLE:
                        del self.descs[next(iter(self.descs))]
                    self.descs[p] = d
        return d


_states: dict = {}  # cuDNN handle (int) -> RngState; handles live until exit, so do these
_lock = threading.RLock()


def rng_state(device, handle: int, p: float, seed=0, generation=None) -> RngState:
    """The handle's RngState: created and seeded from ``seed`` on first use; re-seeded when ``generation`` is not
    None and differs from the generation it was seeded at (None: keep the states as they are)."""
    st = _states.get(handle)
    if st is not None and (generation is None or st.generation == generation):
        return st
    with _lock:
        st = _states.get(handle)
        if st is not None and (generation is None or st.generation == generation):
            return st
        _refuse_inside_capture(device)
        value = resolve_seed("dropout_forward", seed)  # before any allocation: a bad seed changes nothing
        if st is None:
            size = ctypes.c_size_t()
            L.cudnnDropoutGetStatesSize(handle, ctypes.byref(size))
            st = RngState(handle, DeviceBuffer(size.value, device, current_stream(device)))
        st.seed_with(p, value, _UNSEEDED if generation is None else generation)
        _states[handle] = st
        return st


def _refuse_inside_capture(device) -> None:
    stream = current_stream(device)
    capturing = stream.handle and int(cudart.call("cudaStreamIsCapturing", stream.handle))
    if RECORDING or capturing:
        raise RuntimeError("dropout: cuDNN's dropout RNG state must be seeded outside a captured or recorded step "
                           "(seeding inside would re-seed it at every replay). Run the step once eagerly before "
                           "capturing (CapturedStep/RecordedStep's warm-up does) and call mx.random.seed outside "
                           "the step.")


_reserve: dict = {}  # (n, dtype) -> reserve bytes: each size queried once (a recorded step then replays no query)
_reserve_lock = threading.Lock()
RESERVE_CACHE_LIMIT = 4096


def reserve_size(n: int, dtype) -> int:
    """Bytes of cuDNN's reserve space (the packed keep-mask) for ``n`` elements (a host query, no GPU needed)."""
    size = _reserve.get((n, dtype))
    if size is None:
        size = cache_insert(_reserve, (n, dtype), lambda: _query_reserve(n, dtype), _reserve_lock,
                            RESERVE_CACHE_LIMIT)
    return size


def _query_reserve(n: int, dtype) -> int:
    out = ctypes.c_size_t()
    L.cudnnDropoutGetReserveSpaceSize(_flat(n, dtype), ctypes.byref(out))
    return out.value


def _flat(n: int, dtype):
    """Element-wise: any shape is described as (1, 1, 1, n), packed (as MXNet's cuDNN dropout does)."""
    return TL.tensor_nd((1, 1, 1, n), dtype)


def _gpu_p(name: str, p) -> float:
    # cuDNN takes p as a float; keying descriptors by the float32 value keeps 0.1 and np.float32(0.1) together.
    return float(np.float32(dropout_p(name, p)))


@op(reference.dropout_forward, "x")
def dropout_forward(x, p=0.5, seed=0, generation=None):
    """``cudnnDropoutForward``: (y, reserve); y is x with each element zeroed with probability p and the rest
    scaled by 1/(1-p); ``reserve`` (uint8, cuDNN's packed mask) is what ``dropout_backward`` needs.

    ``seed`` (an int or a function returning one) and ``generation``: see the module docstring. Any shape up to
    2**31 - 1 elements; float32, float64, float16."""
    name = "dropout_forward"
    dtype = float_dtype(name, x=x)
    p = _gpu_p(name, p)
    if not callable(seed):  # checked now, although it is used only when the states are (re)seeded
        resolve_seed(name, seed)
    n = x.size
    if n == 0:
        return out_like(x.shape, dtype, x.device), out_like((0,), np.uint8, x.device)
    try:
        xd, size = _flat(n, dtype), reserve_size(n, dtype)
    except ValueError as exc:
        raise DnnbindValueError(f"{name}: x of shape {x.shape}: {exc}") from None
    h = dnn(x)
    try:
        # first: a seeding refused inside a capture must not have allocated anything in it
        desc = rng_state(x.device, h, p, seed, generation).desc(p)
        y, reserve = out_like(x.shape, dtype, x.device), out_like((size,), np.uint8, x.device)
        L.cudnnDropoutForward(h, desc, xd, x.ptr, xd, y.ptr, reserve.ptr, size)
    except CudnnError as exc:
        raise with_context(exc, op=name, x=x.shape, dtype=dtype.name, p=p) from None
    return y, reserve


@op(reference.dropout_backward, "dy", "reserve")
def dropout_backward(dy, reserve, p=0.5):
    """``cudnnDropoutBackward``: dx = dy / (1-p) where the forward kept an element, 0 elsewhere. ``reserve`` and
    ``p`` are the forward's (its mask and rate); dy has the forward's x's shape."""
    name = "dropout_backward"
    dtype = float_dtype(name, dy=dy)
    p = _gpu_p(name, p)
    n = dy.size
    if n == 0:
        return out_like(dy.shape, dtype, dy.device)
    try:
        dyd, size = _flat(n, dtype), reserve_size(n, dtype)
    except ValueError as exc:
        raise DnnbindValueError(f"{name}: dy of shape {dy.shape}: {exc}") from None
    if reserve.dtype != np.uint8 or reserve.size != size:
        raise DnnbindValueError(f"{name}: reserve must be the uint8 array of {size} bytes dropout_forward returned for "
                         f"{n} elements, got {reserve.dtype} of {reserve.size}")
    h = dnn(dy)
    try:
        desc = rng_state(dy.device, h, p).desc(p)  # seeded by the forward (if that ran on another stream: here)
        dx = out_like(dy.shape, dtype, dy.device)
        L.cudnnDropoutBackward(h, desc, dyd, dy.ptr, dyd, dx.ptr, reserve.ptr, size)
    except CudnnError as exc:
        raise with_context(exc, op=name, dy=dy.shape, dtype=dtype.name, p=p) from None
    return dx


def dropout_mask(shape: tuple, dtype, device, p=0.5, seed=0, generation=None) -> NDArray:
    """A mask of ``shape`` on ``device``, each element 0 (probability p) or 1/(1-p): dropout applied to ones
    (cudnnSetTensor + cudnnDropoutForward on a GPU, both capturable). Variational dropout broadcasts it."""
    device = as_device(device)
    if device.kind != "cpu":  # seed first: a seeding refused inside a capture must find nothing allocated in it
        rng_state(device, cudnn_handle(device), _gpu_p("dropout_mask", p), seed, generation)
    ones = empty(tuple(shape), dtype, device)
    if not ones.on_gpu:
        ones._data[...] = 1
    elif ones.size:
        set_tensor(ones, 1.0)
    return dropout_forward(ones, p, seed, generation)[0]
