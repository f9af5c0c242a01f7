"""MXNet 1.9.1's ``gluon.contrib.nn.basic_layers``: Concurrent, HybridConcurrent, Identity, SparseEmbedding,
SyncBatchNorm, PixelShuffle1D/2D/3D, with MXNet's names, constructor arguments, defaults and parameter names.
Layer: gluon; imports nd, gluon.block, gluon.nn.

- HybridConcurrent, Identity, the PixelShuffles and SyncBatchNorm keep MXNet's ``hybrid_forward(F, x, ...)``: run
  with F = nd here (Block.forward), and with F = sym by export's tracer, which writes MXNet's own nodes
  (``concat``, ``Reshape``/``transpose``/``SwapAxis``, ``_contrib_SyncBatchNorm``).
- SyncBatchNorm is gluon.nn.BatchNorm on axis 1 calling ``nd.contrib.SyncBatchNorm`` with ``ndev = num_devices``
  and ``key = prefix`` (ops/defs/sync_batchnorm.py: the statistics of every device's batch together, when the
  devices run as launched processes or one thread per context; num_devices=1 is BatchNorm). num_devices=None
  counts the visible GPUs (at least 1) with MXNet's warning.
- SparseEmbedding: dnnbind has no row_sparse storage, so the weight is dense and gets a dense gradient (the values
  are MXNet's: an Embedding lookup); MXNet's need for a Trainer before the first forward does not apply.
"""

from __future__ import annotations

import warnings

from ...._lib.errors import DnnbindTypeError, DnnbindValueError
from .... import nd
from ....runtime.device import num_gpus
from ...block import Block, HybridBlock
from ...nn import BatchNorm, HybridSequential, Sequential

__all__ = ["Concurrent", "HybridConcurrent", "Identity", "SparseEmbedding", "SyncBatchNorm", "PixelShuffle1D",
           "PixelShuffle2D", "PixelShuffle3D"]


class Concurrent(Sequential):
    """Feeds the input to every child and concatenates their outputs along ``axis`` (default -1)."""

    def __init__(self, axis: int = -1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def forward(self, x):
        return nd.concat(*[block(x) for block in self._children.values()], dim=self.axis)


class HybridConcurrent(HybridSequential):
    """Concurrent for HybridBlocks: every child on the same input, outputs concatenated along ``axis``."""

    def __init__(self, axis: int = -1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    forward = Block.forward  # hybrid_forward with F = nd (Sequential's forward chains the children instead)

    def hybrid_forward(self, F, x):
        return F.concat(*[block(x) for block in self._children.values()], dim=self.axis)


class Identity(HybridBlock):
    """Passes the input through (a residual branch of a HybridConcurrent)."""

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)

    def hybrid_forward(self, F, x):
        return x

    def __repr__(self) -> str:
        return f"{type(self).__name__}(\n\n)"  # MXNet's HybridBlock repr with no children


class SparseEmbedding(Block):
    """Index -> vector lookup for very large vocabularies (MXNet keeps the weight and its gradient row_sparse;
    dnnbind keeps them dense: see the module docstring). (d0, ..., dk) ids -> (d0, ..., dk, output_dim)."""

    def __init__(self, input_dim: int, output_dim: int, dtype="float32", weight_initializer=None, **kwargs):
        input_dim = _positive_int("SparseEmbedding", "input_dim", input_dim)
        output_dim = _positive_int("SparseEmbedding", "output_dim", output_dim)
        super().__init__(**kwargs)
        self._kwargs = {"input_dim": input_dim, "output_dim": output_dim, "dtype": dtype, "sparse_grad": True}
        self.weight = self.params.get("weight", shape=(input_dim, output_dim), init=weight_initializer, dtype=dtype)

    def forward(self, x):
        return nd.Embedding(x, self.weight.data(), **self._kwargs)

    def __repr__(self) -> str:
        k = self._kwargs
        return f"{type(self).__name__}({k['input_dim']} -> {k['output_dim']}, {k['dtype']})"


class SyncBatchNorm(BatchNorm):
    """Cross-device synchronized batch normalization (Zhang et al., CVPR 2018): BatchNorm on axis 1 whose
    training statistics are those of the whole mini-batch over ``num_devices`` devices (default: the visible
    GPUs, with MXNet's warning). The devices participate as processes launched one per GPU
    (``python -m dnnbind.launch``) or as one thread per context in one process; see ops/defs/sync_batchnorm.py."""

    def __init__(self, in_channels: int = 0, num_devices=None, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros", running_variance_initializer="ones",
                 **kwargs):
        super().__init__(axis=1, momentum=momentum, epsilon=epsilon, center=center, scale=scale,
                         use_global_stats=use_global_stats, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer, running_mean_initializer=running_mean_initializer,
                         running_variance_initializer=running_variance_initializer, in_channels=in_channels,
                         **kwargs)
        num_devices = self._get_num_devices() if num_devices is None else _positive_int("SyncBatchNorm", "num_devices",
                                                                               num_devices)
        # nd.contrib.SyncBatchNorm's arguments, in MXNet's order (also what __repr__ prints)
        self._kwargs = {"eps": self._kwargs["eps"], "momentum": self._kwargs["momentum"], "fix_gamma": not scale,
                        "use_global_stats": bool(use_global_stats), "ndev": num_devices, "key": self.prefix}

    def _alias(self) -> str:
        return "syncbatchnorm"

    def _get_num_devices(self) -> int:
        warnings.warn("Caution using SyncBatchNorm: if not using all the GPUs, please mannually set num_devices",
                      UserWarning)
        return max(num_gpus(), 1)

    def forward(self, x):
        if any(p._data is None for p in self._params4()):
            self._infer(x)
        return self.hybrid_forward(nd, x, self.gamma.data(), self.beta.data(), self.running_mean.data(),
                                   self.running_var.data())

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        return F.contrib.SyncBatchNorm(x, gamma, beta, running_mean, running_var, name="fwd", **self._kwargs)


def _positive_int(layer: str, name: str, value) -> int:
    """A positive integer argument (a count or size), refused with the layer's and the argument's names."""
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise DnnbindTypeError(f"{layer}: {name} must be an int, got {type(value).__name__} {value!r}")
    if int(value) < 1:
        raise DnnbindValueError(f"{layer}: {name} must be >= 1, got {value}")
    return int(value)


def _factors(layer: str, factor, n: int) -> tuple:
    try:
        return (int(factor),) * n
    except TypeError:
        factors = tuple(int(f) for f in factor)
    if len(factors) != n:  # MXNet asserts "wrong length"
        raise DnnbindValueError(f"{layer}: factor must be an int or {n} ints, got {factor!r} (wrong length "
                                f"{len(factors)})")
    return factors


class PixelShuffle1D(HybridBlock):
    """(N, f*C, W) -> (N, C, W*f): groups of f channels become f neighbouring positions along W."""

    def __init__(self, factor):
        super().__init__()
        self._factor = int(factor)

    def hybrid_forward(self, F, x):
        f = self._factor
        x = F.reshape(x, (0, -4, -1, f, 0))  # (N, C, f, W)
        x = F.transpose(x, (0, 1, 3, 2))     # (N, C, W, f)
        return F.reshape(x, (0, 0, -3))      # (N, C, W*f)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._factor})"


class PixelShuffle2D(HybridBlock):
    """(N, f1*f2*C, H, W) -> (N, C, H*f1, W*f2) (Shi et al., 2016's sub-pixel convolution's shuffle)."""

    def __init__(self, factor):
        super().__init__()
        self._factors = _factors("PixelShuffle2D", factor, 2)

    def hybrid_forward(self, F, x):
        f1, f2 = self._factors
        x = F.reshape(x, (0, -4, -1, f1 * f2, 0, 0))  # (N, C, f1*f2, H, W)
        x = F.reshape(x, (0, 0, -4, f1, f2, 0, 0))    # (N, C, f1, f2, H, W)
        x = F.transpose(x, (0, 1, 4, 2, 5, 3))        # (N, C, H, f1, W, f2)
        return F.reshape(x, (0, 0, -3, -3))           # (N, C, H*f1, W*f2)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._factors})"


class PixelShuffle3D(HybridBlock):
    """(N, f1*f2*f3*C, D, H, W) -> (N, C, D*f1, H*f2, W*f3), through swapaxes as MXNet's (its transpose stops at
    6 axes)."""

    def __init__(self, factor):
        super().__init__()
        self._factors = _factors("PixelShuffle3D", factor, 3)

    def hybrid_forward(self, F, x):
        f1, f2, f3 = self._factors
        x = F.reshape(x, (0, -4, -1, f1 * f2 * f3, 0, 0, 0))  # (N, C, f1*f2*f3, D, H, W)
        x = F.swapaxes(x, 2, 3)                               # (N, C, D, f1*f2*f3, H, W)
        x = F.reshape(x, (0, 0, 0, -4, f1, f2 * f3, 0, 0))    # (N, C, D, f1, f2*f3, H, W)
        x = F.reshape(x, (0, 0, -3, 0, 0, 0))                 # (N, C, D*f1, f2*f3, H, W)
        x = F.swapaxes(x, 3, 4)                               # (N, C, D*f1, H, f2*f3, W)
        x = F.reshape(x, (0, 0, 0, 0, -4, f2, f3, 0))         # (N, C, D*f1, H, f2, f3, W)
        x = F.reshape(x, (0, 0, 0, -3, 0, 0))                 # (N, C, D*f1, H*f2, f3, W)
        x = F.swapaxes(x, 4, 5)                               # (N, C, D*f1, H*f2, W, f3)
        return F.reshape(x, (0, 0, 0, 0, -3))                 # (N, C, D*f1, H*f2, W*f3)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._factors})"
