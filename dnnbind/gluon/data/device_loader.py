"""DeviceDataLoader: the whole data set resident on the device, batches as views.

Layer: gluon: data; imports numpy and dnnbind.runtime only (runtime.array, lazily).

MNIST is 60,000 x 784 float32 = 188 MB, small next to a GPU. Instead of a host copy per batch (938 small
transfers per epoch, each a sync point), each epoch shuffles once on the host (a permutation of the uint8
images, then the transform to float32 NCHW), uploads the result once into a fixed device buffer with
`copy_`, and yields `buf[i:i+bs]`: first-axis slices of an NDArray are views (docs/design.md), so a batch is a
pointer offset and the training loop does no allocation or copy for data at all.

The order of epoch e depends only on (seed, e), so a run resumed at epoch e (`reset(e)`) sees the same
batches as an uninterrupted one. The batches of an epoch alias the buffer that the next epoch overwrites:
use them before asking for the next epoch (the upload is ordered on the device after earlier work).
"""

from __future__ import annotations

from ..._lib.errors import DnnbindValueError

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .vision.transforms import ToTensor


def _device_array(host: np.ndarray, device: Any) -> Any:
    # Lazy: importing the data layer must not load the runtime.
    from ...runtime.array import array

    return array(host, device=device, dtype=host.dtype)


def _host(x: Any) -> np.ndarray:
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


class DeviceDataLoader:
    """Mini-batches of (images, labels) from a copy of the whole set on `device`.

    images: uint8 (N, H, W, C) (e.g. MNIST(...).data); labels: (N,) integers, kept as int32.
    transform: applied to the permuted image batch each epoch on the host; default ToTensor()
        (float32 NCHW in [0, 1]); must map a batch to a batch (Compose([ToTensor(), Normalize(...)]) works).
    shuffle: a new permutation each epoch from np.random.default_rng((seed, epoch)).
    seed: None picks one at random (readable as .seed, so the run can be repeated).
    last_batch: 'discard' drops the short last batch (fixed shapes, the default); 'keep' yields it.
    """

    def __init__(self, images: Any, labels: Any, batch_size: int, device: Any, shuffle: bool = True,
                 seed: int | None = None, last_batch: str = "discard", transform: Callable | None = None) -> None:
        self._images = np.ascontiguousarray(_host(images))
        self._labels = _host(labels).astype(np.int32)
        if len(self._images) != len(self._labels):
            raise DnnbindValueError(f"DeviceDataLoader: {len(self._images)} images but {len(self._labels)} labels")
        if last_batch not in ("discard", "keep"):
            raise DnnbindValueError(f"DeviceDataLoader: last_batch must be 'discard' or 'keep', got {last_batch!r}")
        if int(batch_size) < 1:
            raise DnnbindValueError(f"DeviceDataLoader: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.device = device
        self.shuffle = shuffle
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
        self.last_batch = last_batch
        self._transform = ToTensor() if transform is None else transform
        self._next_epoch = 0
        self.epoch: int | None = None  # the epoch whose order is in the buffers
        self._data_buf: Any = None
        self._label_buf: Any = None
        self._uploaded: int | None = None
        self._host_refs: tuple = ()
        self._stage: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_dataset(cls, dataset: Any, batch_size: int, device: Any, **kwargs: Any) -> DeviceDataLoader:
        """From a dataset with whole-array `.data` / `.label` (MNIST)."""
        return cls(dataset.data, dataset.label, batch_size, device, **kwargs)

    def reset(self, epoch: int = 0) -> None:
        """Make the next iteration epoch `epoch` (for resuming; iterations then continue epoch+1, ...)."""
        self._next_epoch = int(epoch)

    set_epoch = reset

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of `epoch`."""
        n = len(self._labels)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng((self.seed, int(epoch))).permutation(n)

    def _host_epoch(self, idx: np.ndarray) -> np.ndarray:
        # Permute the uint8 images (4x less memory traffic than float32), then convert the whole set at once.
        if type(self._transform) is not ToTensor or self._images.ndim != 4:
            return np.ascontiguousarray(self._transform(self._images[idx]))
        # NOTE: the default ToTensor runs in reused staging buffers: allocating 188 MB afresh each epoch costs
        # more in page faults than the conversion itself. Same operations as ToTensor, so the same bits.
        if self._stage is None:
            n, h, w, c = self._images.shape
            self._stage = (np.empty((n, h, w, c), np.uint8), np.empty((n, c, h, w), np.float32))
        u8, f32 = self._stage
        np.take(self._images, idx, axis=0, out=u8)
        np.copyto(f32, u8.transpose(0, 3, 1, 2))
        f32 /= np.float32(255.0)
        return f32

    def _upload(self, epoch: int) -> None:
        idx = self.order(epoch)
        data = self._host_epoch(idx)
        labels = np.ascontiguousarray(self._labels[idx])
        if self._data_buf is None:
            self._data_buf = _device_array(data, self.device)
            self._label_buf = _device_array(labels, self.device)
        else:
            if tuple(self._data_buf.shape) != data.shape or self._data_buf.dtype != data.dtype:
                raise DnnbindValueError(f"DeviceDataLoader: transform gave {data.dtype} {data.shape} this epoch, "
                                 f"the buffer is {self._data_buf.dtype} {tuple(self._data_buf.shape)}")
            self._data_buf.copy_(data)
            self._label_buf.copy_(labels)
        # Keep the host arrays alive until the next upload in case the copy is still reading them.
        self._host_refs = (data, labels)
        self._uploaded = epoch

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        epoch = self._next_epoch
        self._next_epoch += 1
        self.epoch = epoch
        # Without shuffling every epoch has the same order: upload once.
        if self._uploaded is None or (self.shuffle and self._uploaded != epoch):
            self._upload(epoch)
        bs = self.batch_size
        for b in range(len(self)):
            i = b * bs
            yield self._data_buf[i:i + bs], self._label_buf[i:i + bs]

    def __len__(self) -> int:
        n = len(self._labels)
        if self.last_batch == "discard":
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    @property
    def num_samples(self) -> int:
        return len(self._labels)
