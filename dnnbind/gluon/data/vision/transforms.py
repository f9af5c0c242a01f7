"""Image transforms with MXNet Gluon semantics: ToTensor, Normalize, Cast, Compose.

Layer: gluon: data; imports numpy and dnnbind.runtime only (here: numpy only).

MXNet's transforms are HybridBlocks over NDArrays; data loading here happens on the host, so these are plain
callables over numpy arrays (an object with .asnumpy() is converted first). Each one accepts a single image
or a batch and gives the same numbers either way; `batchable = True` tells the DataLoader it may apply the
transform once to a stacked batch instead of once per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _host(x: Any) -> np.ndarray:
    if hasattr(x, "asnumpy"):
        return x.asnumpy()
    return np.asarray(x)


class ToTensor:
    """uint8 (H, W, C) -> float32 (C, H, W) in [0, 1]; a batch (N, H, W, C) -> (N, C, H, W).

    Divides by 255 exactly as MXNet and torchvision do (float32 division, not a multiply by 1/255), so the
    per-sample, batched and device loaders all produce bit-identical values.
    """

    batchable = True

    def __call__(self, x: Any) -> np.ndarray:
        x = _host(x)
        if x.ndim == 3:
            axes = (2, 0, 1)
        elif x.ndim == 4:
            axes = (0, 3, 1, 2)
        else:
            raise ValueError(f"ToTensor: expected an image (H, W, C) or a batch (N, H, W, C), got shape {x.shape}")
        # Transpose the (small) uint8 first, then one converting copy and an in-place divide.
        out = np.ascontiguousarray(np.transpose(x, axes), dtype=np.float32)
        if np.may_share_memory(out, x):  # float32 input already laid out as CHW: never divide the caller's data
            out = out.copy()
        out /= np.float32(255.0)
        return out

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """(x - mean[c]) / std[c] per channel on (C, H, W) or (N, C, H, W) float input; mean/std scalar or per-channel."""

    batchable = True

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0) -> None:
        self._mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self._std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
        self.mean, self.std = mean, std

    def __call__(self, x: Any) -> np.ndarray:
        x = _host(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"Normalize: expected (C, H, W) or (N, C, H, W), got shape {x.shape}")
        c = x.shape[-3]
        for name, v in (("mean", self._mean), ("std", self._std)):
            if v.shape[0] not in (1, c):
                raise ValueError(f"Normalize: {name} has {v.shape[0]} values for {c} channels")
        return ((x.astype(np.float32, copy=False) - self._mean) / self._std).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


class Cast:
    """Cast to a dtype (default float32)."""

    batchable = True

    def __init__(self, dtype: Any = "float32") -> None:
        self.dtype = np.dtype(dtype)

    def __call__(self, x: Any) -> np.ndarray:
        return _host(x).astype(self.dtype)

    def __repr__(self) -> str:
        return f"Cast({self.dtype})"


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    @property
    def batchable(self) -> bool:
        return all(getattr(t, "batchable", False) for t in self.transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"
