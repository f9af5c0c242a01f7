"""Image data sets read from files: ImageRecordDataset (a RecordIO file), ImageFolderDataset (a folder per
class), ImageListDataset (a .lst file or a list), as MXNet's ``gluon.data.vision``.

Layer: gluon: data; imports numpy, and lazily dnnbind.runtime (to make NDArrays), dnnbind.recordio and
dnnbind.imagecodec (leaves that code files and images; test_lib's layer walk counts them as top-level modules,
so they are imported where used).

Images come back as MXNet's ``mx.image.imdecode``/``imread`` give them: uint8 NDArrays on the cpu, (H, W, 3) RGB
with ``flag=1``, (H, W, 1) gray with ``flag=0``. They are decoded with OpenCV when it is installed (MXNet's own
decoder, so pixels match exactly) and with Pillow otherwise (the same PNG pixels; JPEGs can differ by a few
levels, and a color image read as gray by one).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ...._lib.errors import DnnbindTypeError, DnnbindValueError
from ..dataset import Dataset, RecordFileDataset


def _nd(host: np.ndarray):
    from ....runtime.array import NDArray  # lazy: importing the data layer loads no runtime
    return NDArray._from_numpy(np.ascontiguousarray(host))


def _check_flag(cls: str, flag: int) -> int:
    if flag not in (0, 1):
        raise DnnbindValueError(f"{cls}: flag must be 1 (color, RGB) or 0 (grayscale), got {flag!r}")
    return int(flag)


def _imread(path: str, flag: int):
    """``mx.image.imread(path, flag)``: a uint8 NDArray, RGB (H, W, 3) or gray (H, W, 1)."""
    from .... import imagecodec
    img = imagecodec.imread(path, flag)
    if img is None:
        raise DnnbindValueError(f"could not read an image from {path!r} (missing, or not a JPEG/PNG image)")
    return _nd(imagecodec.to_rgb(img))


class ImageRecordDataset(RecordFileDataset):
    """The images of a RecordIO file (``filename``, its index ``<name>.idx`` beside it), made by im2rec or
    ``recordio.pack_img``: item i is (image, label), the label being the header's (a float, or a float32 numpy
    array for a multi-label record), passed through ``transform(image, label)`` when given."""

    def __init__(self, filename: str, flag: int = 1, transform: Callable | None = None) -> None:
        super().__init__(filename)
        self._flag = _check_flag("ImageRecordDataset", flag)
        self._transform = transform

    def __getitem__(self, idx: int) -> Any:
        from .... import imagecodec, recordio
        header, payload = recordio.unpack(super().__getitem__(idx))
        img = _nd(imagecodec.decode_rgb(payload, self._flag))
        if self._transform is not None:
            return self._transform(img, header.label)
        return img, header.label

    def __repr__(self) -> str:
        return f"ImageRecordDataset({self.filename!r}, {len(self)} images)"


class ImageFolderDataset(Dataset):
    """Images in a folder per class under ``root`` (``root/car/0001.jpg``, ``root/bus/123.png``, ...).

    ``synsets`` lists the class folders in sorted order (label i is ``synsets[i]``); ``items`` lists
    (path, label) for every .jpg, .jpeg and .png file (any case) in each, sorted by name. Other files are
    skipped with a warning, as in MXNet. Item i is (image, label), through ``transform(image, label)`` if given.
    """

    def __init__(self, root: str, flag: int = 1, transform: Callable | None = None) -> None:
        self._root = os.path.expanduser(root)
        self._flag = _check_flag("ImageFolderDataset", flag)
        self._transform = transform
        self._exts = [".jpg", ".jpeg", ".png"]
        self._list_images(self._root)

    def _list_images(self, root: str) -> None:
        self.synsets: list[str] = []
        self.items: list[tuple[str, int]] = []
        for folder in sorted(os.listdir(root)):
            path = os.path.join(root, folder)
            if not os.path.isdir(path):
                warnings.warn(f"Ignoring {path}, which is not a directory.", stacklevel=3)
                continue
            label = len(self.synsets)
            self.synsets.append(folder)
            for name in sorted(os.listdir(path)):
                filename = os.path.join(path, name)
                ext = os.path.splitext(filename)[1]
                if ext.lower() not in self._exts:
                    warnings.warn(f"Ignoring {filename} of type {ext}. Only support {', '.join(self._exts)}")
                    continue
                self.items.append((filename, label))

    def __getitem__(self, idx: int) -> Any:
        filename, label = self.items[idx]
        img = _imread(filename, self._flag)
        if self._transform is not None:
            return self._transform(img, label)
        return img, label

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"ImageFolderDataset({self._root!r}, {len(self)} images, {len(self.synsets)} classes)"


class ImageListDataset(Dataset):
    """Images listed in ``imglist`` under ``root``: the name of a .lst file in ``root`` (im2rec's
    ``index<TAB>label[<TAB>label...]<TAB>path`` lines), or a list of ``[label, path]`` /
    ``[label1, label2, ..., path]`` / ``[[labels], path]`` entries. Item i is (image, label), the label a float32
    NDArray of the line's labels (MXNet's ``gluon.data.vision.ImageListDataset``)."""

    def __init__(self, root: str = ".", imglist: str | list | None = None, flag: int = 1) -> None:
        self._root = os.path.expanduser(root)
        self._flag = _check_flag("ImageListDataset", flag)
        self._imglist: dict = {}
        self._imgkeys: list = []
        if isinstance(imglist, str):
            fname = os.path.join(self._root, imglist)
            with open(fname) as fin:
                for lineno, line in enumerate(fin, 1):
                    fields = line.strip().split("\t")
                    if len(fields) < 3:
                        raise DnnbindValueError(f"{fname}:{lineno}: a list line is 'index<TAB>label...<TAB>path', "
                                                f"got {line!r}")
                    key = int(fields[0])
                    self._imglist[key] = (np.array(fields[1:-1], dtype=np.float32),
                                          os.path.join(self._root, fields[-1]))
                    self._imgkeys.append(key)
        elif isinstance(imglist, list):
            # Keys are "1", "2", ... as MXNet numbers a list's entries.
            for index, entry in enumerate(imglist, 1):
                if len(entry) > 2:
                    label = entry[:-1]
                elif isinstance(entry[0], (int, float, np.number)):
                    label = [entry[0]]
                else:
                    label = entry[0]
                if not isinstance(entry[-1], str):
                    raise DnnbindTypeError(f"ImageListDataset: entry {index - 1} must end with the image's path, got "
                                           f"{entry!r}")
                key = str(index)
                self._imglist[key] = (np.asarray(label, dtype=np.float32).reshape(-1),
                                      os.path.join(self._root, entry[-1]))
                self._imgkeys.append(key)
        else:
            raise DnnbindValueError(f"imglist must be filename or list of valid entries, given {type(imglist)}")

    @property
    def items(self) -> list[tuple[str, np.ndarray]]:
        """(path, labels) of each image, in list order."""
        return [(self._imglist[k][1], self._imglist[k][0]) for k in self._imgkeys]

    def __getitem__(self, idx: int) -> Any:
        label, path = self._imglist[self._imgkeys[idx]]
        return _imread(path, self._flag), _nd(label)

    def __len__(self) -> int:
        return len(self._imgkeys)

    def __repr__(self) -> str:
        return f"ImageListDataset({self._root!r}, {len(self)} images)"
