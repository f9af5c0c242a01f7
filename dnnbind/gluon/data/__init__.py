"""Data loading with MXNet Gluon semantics (mxnet.gluon.data).

Layer: gluon: data; imports numpy and dnnbind.runtime only. Importing this package loads no runtime and no
GPU library: NDArrays are made lazily when a batch is produced.
"""

from . import sampler, vision
from .dataloader import (
                         BatchSampler,
                         DataLoader,
                         DistributedSampler,
                         RandomSampler,
                         Sampler,
                         SequentialSampler,
                         default_batchify_fn,
                         stack_numpy,
)
from .dataset import ArrayDataset, Dataset, RecordFileDataset, SimpleDataset
from .device_loader import DeviceDataLoader

__all__ = [
    "ArrayDataset", "BatchSampler", "DataLoader", "Dataset", "DeviceDataLoader", "DistributedSampler",
    "RandomSampler", "RecordFileDataset", "Sampler", "SequentialSampler", "SimpleDataset", "default_batchify_fn", "sampler", "stack_numpy", "vision",
]
