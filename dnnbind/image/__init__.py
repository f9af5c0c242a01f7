"""``mx.image`` of MXNet 1.9.1 (image functions, augmenters, ImageIter, detection), served by the MXNet alias.

Layer: beside gluon (host data pipeline); imports numpy, dnnbind.imagecodec, recordio, io and runtime. See
image.py for the pixel and randomness conventions.
"""

from . import detection
from .detection import (CreateDetAugmenter, CreateMultiRandCropAugmenter, DetAugmenter, DetBorrowAug,
                        DetHorizontalFlipAug, DetRandomCropAug, DetRandomPadAug, DetRandomSelectAug, ImageDetIter)
from .image import (Augmenter, BrightnessJitterAug, CastAug, CenterCropAug, ColorJitterAug, ColorNormalizeAug,
                    ContrastJitterAug, CreateAugmenter, ForceResizeAug, HorizontalFlipAug, HueJitterAug, ImageIter,
                    LightingAug, RandomCropAug, RandomGrayAug, RandomOrderAug, RandomSizedCropAug, ResizeAug,
                    SaturationJitterAug, SequentialAug, center_crop, color_normalize, copyMakeBorder, fixed_crop,
                    imdecode, imread, imresize, random_crop, random_size_crop, resize_short, scale_down)

__all__ = ["Augmenter", "BrightnessJitterAug", "CastAug", "CenterCropAug", "ColorJitterAug", "ColorNormalizeAug",
           "ContrastJitterAug", "CreateAugmenter", "CreateDetAugmenter", "CreateMultiRandCropAugmenter",
           "DetAugmenter", "DetBorrowAug", "DetHorizontalFlipAug", "DetRandomCropAug", "DetRandomPadAug",
           "DetRandomSelectAug", "ForceResizeAug", "HorizontalFlipAug", "HueJitterAug", "ImageDetIter", "ImageIter",
           "LightingAug", "RandomCropAug", "RandomGrayAug", "RandomOrderAug", "RandomSizedCropAug", "ResizeAug",
           "SaturationJitterAug", "SequentialAug", "center_crop", "color_normalize", "copyMakeBorder", "detection",
           "fixed_crop", "imdecode", "imread", "imresize", "random_crop", "random_size_crop", "resize_short",
           "scale_down"]
