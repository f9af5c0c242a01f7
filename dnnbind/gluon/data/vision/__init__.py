"""Vision data sets and transforms (mxnet.gluon.data.vision).

Layer: gluon: data; imports numpy and dnnbind.runtime only.

`vision.datasets` is a small module object made here (MXNet spells the class
gluon.data.vision.datasets.MNIST); it is registered in sys.modules so
`from dnnbind.gluon.data.vision.datasets import MNIST` works too.
"""

import sys
import types

from . import transforms
from .cifar import CIFAR10, CIFAR100
from .idx import read_idx, write_idx
from .image_folder import ImageFolderDataset, ImageListDataset, ImageRecordDataset
from .mnist import MNIST, FashionMNIST

datasets = types.ModuleType(__name__ + ".datasets",
                            "Vision data sets: MNIST, FashionMNIST, CIFAR10, CIFAR100, ImageRecordDataset, "
                            "ImageFolderDataset, ImageListDataset.")
datasets.MNIST = MNIST
datasets.FashionMNIST = FashionMNIST
datasets.CIFAR10 = CIFAR10
datasets.CIFAR100 = CIFAR100
datasets.ImageRecordDataset = ImageRecordDataset
datasets.ImageFolderDataset = ImageFolderDataset
datasets.ImageListDataset = ImageListDataset
sys.modules[datasets.__name__] = datasets

__all__ = ["CIFAR10", "CIFAR100", "MNIST", "FashionMNIST", "ImageFolderDataset", "ImageListDataset",
           "ImageRecordDataset", "datasets", "read_idx", "transforms", "write_idx"]
