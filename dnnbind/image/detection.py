"""``mx.image`` detection of MXNet 1.9.1: the Det augmenters, CreateDetAugmenter and ImageDetIter.

Layer: beside gluon (host data pipeline); imports numpy and dnnbind.image.image.

A detection label is (N, 5+) float rows ``[class, xmin, ymin, xmax, ymax, ...]`` with coordinates in [0, 1];
records store it flattened after a header ``[header_width, object_width, ...]``. Random draws are MXNet's: Python's
``random`` for crops, pads, flips and the choice among augmenters, in MXNet's order.
"""

from __future__ import annotations

import json
import logging
import random
import warnings
from math import sqrt
from numbers import Number

import numpy as np

from .._lib.errors import DnnbindTypeError, DnnbindValueError
from ..runtime.array import NDArray
from .image import (IMAGENET_MEAN, IMAGENET_PCA_EIGVAL, IMAGENET_PCA_EIGVEC, IMAGENET_STD, Augmenter, CastAug,
                    ColorJitterAug, ColorNormalizeAug, ForceResizeAug, HueJitterAug, ImageIter, LightingAug,
                    RandomGrayAug, ResizeAug, copyMakeBorder, cpu_ndarray, fixed_crop, host_array)

__all__ = ["CreateDetAugmenter", "CreateMultiRandCropAugmenter", "DetAugmenter", "DetBorrowAug",
           "DetHorizontalFlipAug", "DetRandomCropAug", "DetRandomPadAug", "DetRandomSelectAug", "ImageDetIter"]


class DetAugmenter:
    """A transform of (image, label) pairs."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        for k, v in self._kwargs.items():
            if isinstance(v, NDArray):
                v = v.numpy()
            if isinstance(v, np.ndarray):
                self._kwargs[k] = v.tolist()

    def dumps(self):
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])

    def __call__(self, src, label):
        raise NotImplementedError("Must override implementation.")


class DetBorrowAug(DetAugmenter):
    """An image Augmenter applied to the image, the label unchanged."""

    def __init__(self, augmenter):
        if not isinstance(augmenter, Augmenter):
            raise DnnbindTypeError("Borrowing from invalid Augmenter")
        super().__init__(augmenter=augmenter.dumps())
        self.augmenter = augmenter

    def dumps(self):
        return [self.__class__.__name__.lower(), self.augmenter.dumps()]

    def __call__(self, src, label):
        return self.augmenter(src), label


class DetRandomSelectAug(DetAugmenter):
    """Skip with probability ``skip_prob``, else one augmenter of ``aug_list`` chosen at random."""

    def __init__(self, aug_list, skip_prob=0):
        super().__init__(skip_prob=skip_prob)
        if not isinstance(aug_list, (list, tuple)):
            aug_list = [aug_list]
        for aug in aug_list:
            if not isinstance(aug, DetAugmenter):
                raise DnnbindValueError("Allow DetAugmenter in list only")
        if not aug_list:
            skip_prob = 1
        self.aug_list, self.skip_prob = aug_list, skip_prob

    def dumps(self):
        return [self.__class__.__name__.lower(), [x.dumps() for x in self.aug_list]]

    def __call__(self, src, label):
        if random.random() < self.skip_prob:
            return src, label
        random.shuffle(self.aug_list)  # MXNet shuffles the list and takes the first
        return self.aug_list[0](src, label)


class DetHorizontalFlipAug(DetAugmenter):
    """With probability ``p``, flip the image and the boxes left-right."""

    def __init__(self, p):
        super().__init__(p=p)
        self.p = p

    def __call__(self, src, label):
        if random.random() < self.p:
            src = cpu_ndarray(host_array(src)[:, ::-1])
            label = label.copy()
            tmp = 1.0 - label[:, 1]
            label[:, 1] = 1.0 - label[:, 3]
            label[:, 3] = tmp
        return src, label


def _areas(label):
    return np.maximum(0, label[:, 3] - label[:, 1]) * np.maximum(0, label[:, 2] - label[:, 0])


def _pair(v, what):
    if isinstance(v, (tuple, list)):
        return tuple(v)
    if not isinstance(v, Number):
        raise DnnbindTypeError(f"{what} must be a number or a (min, max) pair, got {v!r}")
    return (v, v)


class DetRandomCropAug(DetAugmenter):
    """A random crop that keeps at least ``min_object_covered`` of each box it cuts, SSD-style."""

    def __init__(self, min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33), area_range=(0.05, 1.0),
                 min_eject_coverage=0.3, max_attempts=50):
        aspect_ratio_range = _pair(aspect_ratio_range, "aspect_ratio_range")
        area_range = _pair(area_range, "area_range")
        super().__init__(min_object_covered=min_object_covered, aspect_ratio_range=aspect_ratio_range,
                         area_range=area_range, min_eject_coverage=min_eject_coverage, max_attempts=max_attempts)
        self.min_object_covered, self.min_eject_coverage = min_object_covered, min_eject_coverage
        self.max_attempts, self.aspect_ratio_range, self.area_range = max_attempts, aspect_ratio_range, area_range
        self.enabled = False
        if area_range[1] <= 0 or area_range[0] > area_range[1]:
            warnings.warn(f"Skip DetRandomCropAug due to invalid area_range: {area_range}", stacklevel=2)
        elif aspect_ratio_range[0] > aspect_ratio_range[1] or aspect_ratio_range[0] <= 0:
            warnings.warn(f"Skip DetRandomCropAug due to invalid aspect_ratio_range: {aspect_ratio_range}",
                          stacklevel=2)
        else:
            self.enabled = True

    def __call__(self, src, label):
        crop = self._random_crop_proposal(label, src.shape[0], src.shape[1])
        if crop:
            x, y, w, h, label = crop
            src = fixed_crop(src, x, y, w, h, None)
        return src, label

    @staticmethod
    def _intersect(label, xmin, ymin, xmax, ymax):
        left, right = np.maximum(label[:, 0], xmin), np.minimum(label[:, 2], xmax)
        top, bot = np.maximum(label[:, 1], ymin), np.minimum(label[:, 3], ymax)
        out = np.stack([left, top, right, bot], axis=1).astype(label.dtype)
        out[np.logical_or(left >= right, top >= bot)] = 0
        return out

    def _check_satisfy_constraints(self, label, xmin, ymin, xmax, ymax, width, height):
        if (xmax - xmin) * (ymax - ymin) < 2:
            return False
        x1, y1, x2, y2 = xmin / width, ymin / height, xmax / width, ymax / height
        object_areas = _areas(label[:, 1:])
        valid = np.where(object_areas * width * height > 2)[0]
        if valid.size < 1:
            return False
        inter = self._intersect(label[valid, 1:], x1, y1, x2, y2)
        cov = _areas(inter) / object_areas[valid]
        cov = cov[cov > 0]
        return cov.size > 0 and np.amin(cov) > self.min_object_covered

    def _update_labels(self, label, crop_box, height, width):
        xmin, ymin = crop_box[0] / width, crop_box[1] / height
        w, h = crop_box[2] / width, crop_box[3] / height
        out = label.copy()
        out[:, (1, 3)] -= xmin
        out[:, (2, 4)] -= ymin
        out[:, (1, 3)] /= w
        out[:, (2, 4)] /= h
        out[:, 1:5] = np.minimum(1, np.maximum(0, out[:, 1:5]))
        coverage = _areas(out[:, 1:]) * w * h / _areas(label[:, 1:])
        valid = np.logical_and(out[:, 3] > out[:, 1], out[:, 4] > out[:, 2])
        valid = np.where(np.logical_and(valid, coverage > self.min_eject_coverage))[0]
        return out[valid] if valid.size else None

    def _random_crop_proposal(self, label, height, width):
        if not self.enabled or height <= 0 or width <= 0:
            return ()
        min_area = self.area_range[0] * height * width
        max_area = self.area_range[1] * height * width
        for _ in range(self.max_attempts):
            ratio = random.uniform(*self.aspect_ratio_range)
            if ratio <= 0:
                continue
            h = int(round(sqrt(min_area / ratio)))
            max_h = int(round(sqrt(max_area / ratio)))
            if round(max_h * ratio) > width:
                max_h = int((width + 0.4999999) / ratio)  # MXNet's constant: the largest h with round(h*r) <= w
            max_h = min(max_h, height)
            h = min(h, max_h)
            if h < max_h:
                h = random.randint(h, max_h)
            w = int(round(h * ratio))
            area = w * h
            if area < min_area:
                h += 1
                w = int(round(h * ratio))
                area = w * h
            if area > max_area:
                h -= 1
                w = int(round(h * ratio))
                area = w * h
            if not (min_area <= area <= max_area and 0 <= w <= width and 0 <= h <= height):
                continue
            y = random.randint(0, max(0, height - h))
            x = random.randint(0, max(0, width - w))
            if self._check_satisfy_constraints(label, x, y, x + w, y + h, width, height):
                new_label = self._update_labels(label, (x, y, w, h), height, width)
                if new_label is not None:
                    return (x, y, w, h, new_label)
        return ()


class DetRandomPadAug(DetAugmenter):
    """Place the image at a random spot of a larger canvas filled with ``pad_val`` (zoom out)."""

    def __init__(self, aspect_ratio_range=(0.75, 1.33), area_range=(1.0, 3.0), max_attempts=50,
                 pad_val=(128, 128, 128)):
        if not isinstance(pad_val, (list, tuple)):
            if not isinstance(pad_val, Number):
                raise DnnbindTypeError(f"pad_val must be a number or per-channel values, got {pad_val!r}")
        aspect_ratio_range = _pair(aspect_ratio_range, "aspect_ratio_range")
        area_range = _pair(area_range, "area_range")
        super().__init__(aspect_ratio_range=aspect_ratio_range, area_range=area_range, max_attempts=max_attempts,
                         pad_val=pad_val)
        self.pad_val, self.aspect_ratio_range, self.area_range = pad_val, aspect_ratio_range, area_range
        self.max_attempts = max_attempts
        self.enabled = False
        if area_range[1] <= 1.0 or area_range[0] > area_range[1]:
            warnings.warn(f"Skip DetRandomPadAug due to invalid parameters: {area_range}", stacklevel=2)
        elif aspect_ratio_range[0] <= 0 or aspect_ratio_range[0] > aspect_ratio_range[1]:
            warnings.warn(f"Skip DetRandomPadAug due to invalid aspect_ratio_range: {aspect_ratio_range}",
                          stacklevel=2)
        else:
            self.enabled = True

    def __call__(self, src, label):
        height, width = src.shape[0], src.shape[1]
        pad = self._random_pad_proposal(label, height, width)
        if pad:
            x, y, w, h, label = pad
            vals = self.pad_val if isinstance(self.pad_val, (list, tuple)) else (self.pad_val,)
            src = copyMakeBorder(src, y, h - y - height, x, w - x - width, 16, values=vals)
        return src, label

    @staticmethod
    def _update_labels(label, pad_box, height, width):
        out = label.copy()
        out[:, (1, 3)] = (out[:, (1, 3)] * width + pad_box[0]) / pad_box[2]
        out[:, (2, 4)] = (out[:, (2, 4)] * height + pad_box[1]) / pad_box[3]
        return out

    def _random_pad_proposal(self, label, height, width):
        if not self.enabled or height <= 0 or width <= 0:
            return ()
        min_area = self.area_range[0] * height * width
        max_area = self.area_range[1] * height * width
        for _ in range(self.max_attempts):
            ratio = random.uniform(*self.aspect_ratio_range)
            if ratio <= 0:
                continue
            h = int(round(sqrt(min_area / ratio)))
            max_h = int(round(sqrt(max_area / ratio)))
            if round(h * ratio) < width:
                h = int((width + 0.499999) / ratio)
            h = max(h, height)
            h = min(h, max_h)
            if h < max_h:
                h = random.randint(h, max_h)
            w = int(round(h * ratio))
            if (h - height) < 2 or (w - width) < 2:
                continue  # a marginal pad is not worth it (MXNet's rule)
            y = random.randint(0, max(0, h - height))
            x = random.randint(0, max(0, w - width))
            return (x, y, w, h, self._update_labels(label, (x, y, w, h), height, width))
        return ()


def CreateMultiRandCropAugmenter(min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33), area_range=(0.05, 1.0),
                                 min_eject_coverage=0.3, max_attempts=50, skip_prob=0):
    """One DetRandomCropAug per entry of the list-valued parameters (scalars broadcast), picked at random."""
    params = [p if isinstance(p, list) else [p] for p in
              (min_object_covered, aspect_ratio_range, area_range, min_eject_coverage, max_attempts)]
    num = max(len(p) for p in params)
    for k, p in enumerate(params):
        if len(p) != num:
            if len(p) != 1:
                raise DnnbindValueError("CreateMultiRandCropAugmenter: list parameters must have one length")
            params[k] = p * num
    augs = [DetRandomCropAug(min_object_covered=moc, aspect_ratio_range=arr, area_range=ar,
                             min_eject_coverage=mec, max_attempts=ma) for moc, arr, ar, mec, ma in zip(*params)]
    return DetRandomSelectAug(augs, skip_prob=skip_prob)


def CreateDetAugmenter(data_shape, resize=0, rand_crop=0, rand_pad=0, rand_gray=0, rand_mirror=False, mean=None,
                       std=None, brightness=0, contrast=0, saturation=0, pca_noise=0, hue=0, inter_method=2,
                       min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33), area_range=(0.05, 3.0),
                       min_eject_coverage=0.3, max_attempts=50, pad_val=(127, 127, 127)) -> list:
    """MXNet's standard detection augmenter list for a (C, H, W) ``data_shape``."""
    auglist = []
    if resize > 0:
        auglist.append(DetBorrowAug(ResizeAug(resize, inter_method)))
    if rand_crop > 0:
        auglist.append(CreateMultiRandCropAugmenter(min_object_covered, aspect_ratio_range, area_range,
                                                    min_eject_coverage, max_attempts, skip_prob=(1 - rand_crop)))
    if rand_mirror > 0:
        auglist.append(DetHorizontalFlipAug(0.5))
    if rand_pad > 0:
        pad_aug = DetRandomPadAug(aspect_ratio_range, (1.0, area_range[1]), max_attempts, pad_val)
        auglist.append(DetRandomSelectAug([pad_aug], 1 - rand_pad))
    auglist.append(DetBorrowAug(ForceResizeAug((data_shape[2], data_shape[1]), inter_method)))
    auglist.append(DetBorrowAug(CastAug()))
    if brightness or contrast or saturation:
        auglist.append(DetBorrowAug(ColorJitterAug(brightness, contrast, saturation)))
    if hue:
        auglist.append(DetBorrowAug(HueJitterAug(hue)))
    if pca_noise > 0:
        auglist.append(DetBorrowAug(LightingAug(pca_noise, IMAGENET_PCA_EIGVAL, IMAGENET_PCA_EIGVEC)))
    if rand_gray > 0:
        auglist.append(DetBorrowAug(RandomGrayAug(rand_gray)))
    if mean is True:
        mean = np.array(IMAGENET_MEAN)
    elif mean is not None and not (isinstance(mean, np.ndarray) and mean.shape[0] in (1, 3)):
        raise DnnbindValueError("CreateDetAugmenter: mean must be True, None or a numpy array of 1 or 3 values")
    if std is True:
        std = np.array(IMAGENET_STD)
    elif std is not None and not (isinstance(std, np.ndarray) and std.shape[0] in (1, 3)):
        raise DnnbindValueError("CreateDetAugmenter: std must be True, None or a numpy array of 1 or 3 values")
    if mean is not None or std is not None:
        auglist.append(DetBorrowAug(ColorNormalizeAug(mean, std)))
    return auglist


class ImageDetIter(ImageIter):
    """ImageIter for detection: labels are (batch, max objects, object width), padded with -1; the max object
    count is found by one pass over the data at construction, as MXNet does."""

    def __init__(self, batch_size, data_shape, path_imgrec=None, path_imglist=None, path_root=None,
                 path_imgidx=None, shuffle=False, part_index=0, num_parts=1, aug_list=None, imglist=None,
                 data_name="data", label_name="label", last_batch_handle="pad", **kwargs):
        super().__init__(batch_size=batch_size, data_shape=data_shape, path_imgrec=path_imgrec,
                         path_imglist=path_imglist, path_root=path_root, path_imgidx=path_imgidx, shuffle=shuffle,
                         part_index=part_index, num_parts=num_parts, aug_list=[], imglist=imglist,
                         data_name=data_name, label_name=label_name, last_batch_handle=last_batch_handle)
        self.auglist = CreateDetAugmenter(data_shape, **kwargs) if aug_list is None else aug_list
        label_shape = self._estimate_label_shape()
        self.provide_label = [(label_name, (self.batch_size, label_shape[0], label_shape[1]))]
        self.label_shape = label_shape

    def _check_valid_label(self, label):
        if len(label.shape) != 2 or label.shape[1] < 5:
            raise RuntimeError(f"Label with shape (1+, 5+) required, {label} received.")
        valid = np.logical_and(label[:, 0] >= 0, np.logical_and(label[:, 3] > label[:, 1],
                                                                label[:, 4] > label[:, 2]))
        if not valid.any():
            raise RuntimeError("Invalid label occurs.")

    def _estimate_label_shape(self):
        max_count, width = 0, 0
        self.reset()
        try:
            while True:
                label, _ = self.next_sample()
                label = self._parse_label(label)
                max_count, width = max(max_count, label.shape[0]), label.shape[1]
        except StopIteration:
            pass
        self.reset()
        return (max_count, width)

    def _parse_label(self, label):
        raw = np.ravel(host_array(label))
        if raw.size < 7:
            raise RuntimeError(f"Label shape is invalid: {raw.shape}")
        header_width, obj_width = int(raw[0]), int(raw[1])
        if (raw.size - header_width) % obj_width != 0:
            raise RuntimeError(f"Label shape {raw.shape} inconsistent with annotation width {obj_width}.")
        out = np.reshape(raw[header_width:], (-1, obj_width))
        valid = np.where(np.logical_and(out[:, 3] > out[:, 1], out[:, 4] > out[:, 2]))[0]
        if valid.size < 1:
            raise RuntimeError("Encounter sample with no valid label.")
        return out[valid, :]

    def reshape(self, data_shape=None, label_shape=None):
        """Change the data shape and/or grow the label shape (max objects, object width)."""
        if data_shape is not None:
            self.check_data_shape(data_shape)
            self.provide_data = [(self.provide_data[0][0], (self.batch_size,) + tuple(data_shape))]
            self.data_shape = tuple(data_shape)
        if label_shape is not None:
            self.check_label_shape(label_shape)
            self.provide_label = [(self.provide_label[0][0], (self.batch_size,) + tuple(label_shape))]
            self.label_shape = tuple(label_shape)

    def check_label_shape(self, label_shape):
        if not len(label_shape) == 2:
            raise DnnbindValueError("label_shape should have length 2")
        if label_shape[0] < self.label_shape[0]:
            raise DnnbindValueError(f"Attempts to reduce label count from {self.label_shape[0]} to "
                                    f"{label_shape[0]}, not allowed.")
        if label_shape[1] != self.provide_label[0][1][2]:
            raise DnnbindValueError(f"label_shape object width inconsistent: {self.provide_label[0][1][2]} vs "
                                    f"{label_shape[1]}.")

    def sync_label_shape(self, it, verbose=False):
        """Give this iterator and ``it`` the same (larger) label shape."""
        if not isinstance(it, ImageDetIter):
            raise DnnbindTypeError("Synchronize with invalid iterator.")
        if self.label_shape[1] != it.label_shape[1]:
            raise DnnbindValueError("object width mismatch.")
        max_count = max(self.label_shape[0], it.label_shape[0])
        if max_count > self.label_shape[0]:
            self.reshape(None, (max_count, self.label_shape[1]))
        if max_count > it.label_shape[0]:
            it.reshape(None, (max_count, it.label_shape[1]))
        if verbose:
            logging.info("Resized label_shape to (%d, %d).", max_count, self.label_shape[1])
        return it

    def _batchify(self, batch_data, batch_label, start=0):
        i = start
        try:
            while i < self.batch_size:
                label, s = self.next_sample()
                data = self.imdecode(s)
                try:
                    self.check_valid_image([data])
                    label = self._parse_label(label)
                    data, label = self.augmentation_transform(data, label)
                    self._check_valid_label(label)
                except RuntimeError as e:
                    logging.debug("Invalid image, skipping:  %s", e)
                    continue
                batch_data[i] = host_array(self.postprocess_data(data))
                n = label.shape[0]
                batch_label[i][:n] = label
                batch_label[i][n:] = -1
                i += 1
        except StopIteration:
            if not i:
                raise
        return i

    def _new_label(self) -> np.ndarray:
        """A batch's label buffer: -1 marks the object rows an image does not use (MXNet's padding)."""
        return np.full(self.provide_label[0][1], -1, np.float32)

    def augmentation_transform(self, data, label):  # noqa: D102
        for aug in self.auglist:
            data, label = aug(data, label)
        return data, label
