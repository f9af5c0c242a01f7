"""MXNet 1.9.1's C++ image iterators in Python: ``mx.io.ImageRecordIter`` and ``mx.io.ImageDetRecordIter``.

Layer: beside gluon (host data pipeline); imports numpy, dnnbind.imagecodec, recordio, this package's _cv, io and runtime.

What matches MXNet (checked against its output, tests/test_image_record_iter.py):

- parameters, defaults and the augmentation order of ``src/io/image_aug_default.cc`` (resize the shorter edge,
  affine rotate/shear/scale/aspect, pad, random-resized / random-size / centre-or-random crop, brightness/contrast/
  saturation, HSL, PCA noise), then mirror and ``(x - mean) * scale / std`` into NCHW RGB of ``dtype``;
- records in file order when ``shuffle=False``; ``num_parts`` split the file by bytes as dmlc-core's InputSplit
  does (part k holds the records that start in [k*step, (k+1)*step), step = ceil(size / num_parts) rounded up to
  4), so parts may hold different record counts;
- ``round_batch=True``: the last batch wraps around to the first records (``pad`` counts them) and the next epoch
  starts after the wrapped records, as MXNet's does; labels (batch,) for label_width 1, else (batch, width).

``ImageDetRecordIter`` runs MXNet's ``det_aug_default`` (``src/io/image_det_aug_default.cc``) in its order, on the
image and its boxes together (tests/test_image_det_record_iter.py):

- ``resize`` (shorter edge); HLS jitter (``max_random_hue`` / ``_saturation`` / ``_illumination``, each applied with
  its ``random_*_prob``, added to OpenCV's 8-bit H, L, S and clipped) and contrast (``max_random_contrast``,
  ``random_contrast_prob``: pixels times 1 + c, rounded); mirror (``rand_mirror_prob``, boxes flipped); pad
  (``rand_pad_prob``, a square pad box of scale U(1, ``max_pad_scale``) image sizes, none below 1.05, filled with
  ``fill_value``, boxes projected into it); the crop samplers (``rand_crop_prob``; ``num_crop_sampler`` samplers
  in random order, each trying ``max_crop_trials`` boxes of scale U(``min/max_crop_scales``) and pixel aspect
  U(``min/max_crop_aspect_ratios``), accepted when some box meets its ``min/max_crop_overlaps`` (IoU),
  ``_sample_coverages`` (intersection / crop area) and ``_object_coverages`` (intersection / box area) and a box
  is emitted: ``crop_emit_mode`` 'center' keeps the boxes whose centre lies in the crop, 'overlap' those covered
  more than ``emit_overlap_thresh``; the first sampler that finds one wins, none: no crop); then ``resize_mode``
  'force' (to ``data_shape``), 'shrink' (only when larger, keeping the aspect) or 'fit' (keeping the aspect),
  each with ``inter_method`` (9 auto and 10 random too). A 'shrink' / 'fit' image smaller than ``data_shape``
  sits at the top left on zeros, as in MXNet's fresh batch memory;
- MXNet's parameter checks (crop tuples of 1 or ``num_crop_sampler`` values, max scale > min scale, ...) raise
  DnnbindValueError; boxes with x2 <= x1 or y2 <= y1 are dropped, even without augmentation, as MXNet does;
- labels: rows ``[channels, height, width, label length, header..., surviving objects..., label_pad_value...]``;
- checked against MXNet's pixels and labels where nothing random runs (resize modes, interpolations,
  ``rand_mirror_prob`` 1, random branches enabled with zero ranges); the random parts by their properties.

Where it differs on purpose, or cannot match:

- random augmentation draws from numpy, one generator per (seed, epoch, record position), so a run repeats
  whatever ``preprocess_threads`` is; MXNet's per-thread mt19937 streams cannot be reproduced, and ``shuffle``
  orders differ from MXNet's too (same seed, same order, here);
- ``round_batch=False``: the last batch's missing samples are zeros and ``pad`` counts them (MXNet leaves stale
  memory there and reports pad 0);
- unknown keywords: MXNet accepts any keyword silently; here they raise a warning naming them, so typos show;
- pixels come from OpenCV when it imports (MXNet's own decode and resizes), else Pillow + numpy (JPEG within a few
  levels, resizes within a level or two); ``mean_img`` (a mean image file) is not supported;
- batches are plain numpy-backed cpu NDArrays: dnnbind has no pinned host allocator yet.

Work runs in ``preprocess_threads`` threads: OpenCV and Pillow decode and resize without the GIL, and numpy's
elementwise loops drop it too, so threads scale on the decode-heavy part without copying images between
processes. Up to ``prefetch_buffer`` batches are in flight ahead of the consumer. Threads scale only as far as
the GIL-held part of an image allows (N threads: at most 1 / that many images/s), so the per-image Python is kept
small (issue 26; about 50 us against ~1.7 ms of JPEG decoding, where it was ~400 us): one ``os.pread`` per record
and no copy of its bytes; each image's generator set from a seed state hashed for the whole batch at once
(_pcg64_seed_states) instead of built by numpy; mirror, BGR -> RGB, HWC -> CHW and mean/std as one table lookup
per channel (cv2.LUT or numpy's take) straight into the batch; one pool task per run of a batch's images.

``DNNBIND_IMAGE_DECODE=processes`` runs the same work in ``preprocess_threads`` forked worker *processes* instead,
which share no GIL with each other or with the training loop (MXNet's C++ threads had none to share). They write
straight into batch buffers on shared files in /dev/shm (a ring of ``prefetch_buffer + 3``; a consumer that keeps
more than two batches gets copies), and the batches are the threads' value for value. It falls back to threads,
with a warning, where /dev/shm has not twice the ring's size free. Threads stay the default until the processes'
speed is measured on a many-core machine (docs/benchmarks.md).
"""

from __future__ import annotations

import collections
import math
import mmap
import multiprocessing
import os
import struct
import sys
import threading
import warnings
import weakref
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

from .. import imagecodec, recordio
from .._lib.errors import DnnbindTypeError, DnnbindValueError
from . import _cv
from ..io import DataBatch, DataDesc, DataIter
from ..runtime.array import NDArray

__all__ = ["ImageDetRecordIter", "ImageRecordIter"]

# ImageRecordIter's parameters and MXNet's defaults (mx.io.ImageRecordIter.__doc__ of 1.9.1).
_REC_PARAMS = dict(
    path_imglist="", path_imgrec="", path_imgidx="", aug_seq="aug_default", label_width=1, data_shape=None,
    preprocess_threads=4, verbose=True, num_parts=1, part_index=0, device_id=0, shuffle_chunk_size=0,
    shuffle_chunk_seed=0, seed_aug=None, shuffle=False, seed=0, batch_size=None, round_batch=True,
    prefetch_buffer=4, ctx="gpu", dtype=None, resize=-1, rand_crop=False, random_resized_crop=False,
    max_rotate_angle=0, max_aspect_ratio=0.0, min_aspect_ratio=None, max_shear_ratio=0.0, max_crop_size=-1,
    min_crop_size=-1, max_random_scale=1.0, min_random_scale=1.0, max_random_area=1.0, min_random_area=1.0,
    max_img_size=1e10, min_img_size=0.0, brightness=0.0, contrast=0.0, saturation=0.0, pca_noise=0.0, random_h=0,
    random_s=0, random_l=0, rotate=-1, fill_value=255, inter_method=1, pad=0, mirror=False, rand_mirror=False,
    mean_img="", mean_r=0.0, mean_g=0.0, mean_b=0.0, mean_a=0.0, std_r=1.0, std_g=1.0, std_b=1.0, std_a=1.0,
    scale=1.0, max_random_contrast=0.0, max_random_illumination=0.0, data_name="data",
    label_name="softmax_label")

_DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8", "int8")
_CV_LUT_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "uint8", "int8"))  # cv2.LUT's depths
_PART = struct.Struct("<II")
_SPAN_MAX = 1 << 22  # _read_record: bytes one pread may fetch for a record (larger spans: header, then body)
# eigval * eigvec of ImageNet's RGB covariance, rows R, G, B (image_aug_default.cc)
_PCA = np.array([[55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
                 [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
                 [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203]], np.float32)


def _parse_args(what: str, defaults: dict, kwargs: dict) -> dict:
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        # NOTE: MXNet's C++ iterators accept (and ignore) any keyword; a warning keeps that but shows typos
        warnings.warn(f"{what}: unknown parameters {unknown} are ignored (MXNet ignores them silently)",
                      stacklevel=3)
    p = dict(defaults)
    p.update({k: v for k, v in kwargs.items() if k in defaults})
    for req in ("data_shape", "batch_size"):
        if p[req] is None:
            raise DnnbindValueError(f"{what}: Required parameter {req} is not presented")
    p["data_shape"] = tuple(int(d) for d in p["data_shape"])
    if len(p["data_shape"]) != 3 or min(p["data_shape"]) <= 0:
        raise DnnbindValueError(f"{what}: data_shape must be (C, H, W) of positive sizes, got {p['data_shape']}")
    if p["data_shape"][0] not in (1, 3, 4):
        raise DnnbindValueError(f"{what}: Invalid output shape {p['data_shape']} (1, 3 or 4 channels)")
    for name in ("batch_size", "preprocess_threads", "label_width", "num_parts", "prefetch_buffer"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise DnnbindTypeError(f"{what}: {name} must be an int, got {v!r}")
    if p["batch_size"] <= 0 or p["preprocess_threads"] < 1 or p["num_parts"] < 1:
        raise DnnbindValueError(f"{what}: batch_size and num_parts must be >= 1 and preprocess_threads >= 1")
    if not 0 <= p["part_index"] < p["num_parts"]:
        raise DnnbindValueError(f"{what}: part_index must be in [0, num_parts={p['num_parts']}), got "
                                f"{p['part_index']}")
    dtype = "float32" if p["dtype"] is None else str(np.dtype(p["dtype"])) if p["dtype"] != "bfloat16" else "bf16"
    if dtype not in _DTYPES:
        raise DnnbindValueError(f"{what}: dtype must be one of {_DTYPES} (or None), got {p['dtype']!r}")
    p["dtype"] = dtype
    if not p["path_imgrec"]:
        raise DnnbindValueError(f"{what}: path_imgrec must be given")
    if p.get("mean_img"):
        raise NotImplementedError(f"{what}: mean_img (a mean image file) is not supported by dnnbind; use "
                                  "mean_r/mean_g/mean_b")
    return p


# -- reading records by offset -------------------------------------------------------------------------------------

def _record_offsets(path: str, idx_path: str) -> tuple:
    """(offsets of the records' first parts in file order, file size)."""
    size = os.path.getsize(path)
    if idx_path:
        offs = set()
        with open(idx_path) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 2:
                    offs.add(int(fields[1]))
        return sorted(offs), size
    offs = []
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                raise recordio.RecordIOError(path, pos, "the file ends inside a part header")
            magic, lrec = _PART.unpack(head)
            if magic != recordio.MAGIC:
                raise recordio.RecordIOError(path, pos, f"bad magic number 0x{magic:08x}")
            cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
            if cflag in (0, 1):
                offs.append(pos)
            pos += 8 + ((length + 3) & ~3)
    return offs, size


def _part(offsets: list, size: int, part_index: int, num_parts: int) -> list:
    """dmlc-core's byte partition: the records that start in [k*step, (k+1)*step)."""
    step = (size + num_parts - 1) // num_parts
    step = (step + 3) // 4 * 4
    lo, hi = step * part_index, step * (part_index + 1)
    return [o for o in offsets if lo <= o < hi]


def _record_ends(offsets: list, size: int) -> dict:
    """Each record's end bound: the next record's offset (or the file's size), the bytes one pread should fetch."""
    return {o: e for o, e in zip(offsets, offsets[1:] + [size])}


def _read_record(fd: int, path: str, offset: int, end: int):
    """The record at ``offset`` in one ``os.pread`` of [offset, end) (a memoryview, no copy of the payload), or
    through ``_read_at`` when it is not one whole part there (split records) or the span is large (an index naming
    a few of the file's records)."""
    if end - offset > _SPAN_MAX:
        return _read_at(fd, path, offset)
    buf = os.pread(fd, end - offset, offset)
    if len(buf) >= 8:
        magic, lrec = _PART.unpack_from(buf)
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        if magic == recordio.MAGIC and cflag == 0 and 8 + length <= len(buf):
            return memoryview(buf)[8:8 + length]
    return _read_at(fd, path, offset)


def _read_at(fd: int, path: str, offset: int) -> bytes:
    """The record whose first part starts at ``offset`` (os.pread: thread-safe, no shared file position)."""
    parts = []
    while True:
        head = os.pread(fd, 8, offset)
        if len(head) < 8:
            raise recordio.RecordIOError(path, offset, "truncated part header")
        magic, lrec = _PART.unpack(head)
        if magic != recordio.MAGIC:
            raise recordio.RecordIOError(path, offset, f"bad magic number 0x{magic:08x}")
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        body = os.pread(fd, length, offset + 8)
        if cflag == 0:
            return body
        parts.append(body)
        if cflag == 3:
            return recordio.MAGIC_BYTES.join(parts)
        offset += 8 + ((length + 3) & ~3)


# -- per-image random generators -------------------------------------------------------------------------------------

# numpy's SeedSequence constants (its hashmix / mix / generate_state) and PCG64's 128-bit multiplier
_SS_INIT_A, _SS_MULT_A, _SS_INIT_B, _SS_MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_SS_MIX_L, _SS_MIX_R, _M32 = 0xCA01F9DD, 0x4973F715, 0xFFFFFFFF
_PCG_MULT, _M128 = 0x2360ED051FC65DA44385DF649FCCF645, (1 << 128) - 1


def _pcg64_seed_states(entropy) -> list:
    """``np.random.PCG64(np.random.SeedSequence(row)).state["state"]`` as (state, inc) for each row of ``entropy``
    (n, k <= 4) of uint32 words, the rows hashed at once: numpy builds each image's generator in ~40 us of GIL time,
    this in ~3 (tests/test_image_record_iter_fast.py holds it to numpy's)."""
    e = np.asarray(entropy, np.uint32)
    n, k = e.shape
    u32, hc = np.uint32, _SS_INIT_A

    def hashmix(v):
        nonlocal hc
        v = v ^ u32(hc)
        hc = hc * _SS_MULT_A & _M32  # the hash constant's sequence does not depend on the data
        v = v * u32(hc)
        return v ^ (v >> u32(16))

    def mix(x, y):
        r = u32(_SS_MIX_L) * x - u32(_SS_MIX_R) * y
        return r ^ (r >> u32(16))

    pool = [hashmix(e[:, i] if i < k else np.zeros(n, u32)) for i in range(4)]  # SeedSequence.mix_entropy
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    hc, words = _SS_INIT_B, []
    for i in range(8):  # generate_state(4, np.uint64): 8 uint32 words, little-endian pairs
        v = pool[i % 4] ^ u32(hc)
        hc = hc * _SS_MULT_B & _M32
        v = v * u32(hc)
        words.append((v ^ (v >> u32(16))).astype(np.uint64))
    val = [(words[2 * j] | (words[2 * j + 1] << np.uint64(32))).tolist() for j in range(4)]
    out = []
    for v0, v1, v2, v3 in zip(*val):  # pcg_setseq_128_srandom_r(state=(v0, v1), initseq=(v2, v3))
        inc = ((((v2 << 64) | v3) << 1) | 1) & _M128
        out.append((((inc + ((v0 << 64) | v1)) & _M128) * _PCG_MULT + inc & _M128, inc))
    return out


# -- the default augmenter of image_aug_default.cc, on OpenCV-layout (BGR) uint8 images ---------------------------

def _interp(code: int, ow: int, oh: int, nw: int, nh: int, rng) -> int:
    if code == 9:
        return 2 if nw > ow and nh > oh else 3 if nw < ow and nh < oh else 1
    if code == 10:
        return int(rng.integers(0, 5))
    return code


def _augment(img: np.ndarray, p: dict, rng) -> np.ndarray:
    ds_h, ds_w = p["data_shape"][1], p["data_shape"][2]
    if p["min_aspect_ratio"] is not None:
        max_ar, min_ar = p["max_aspect_ratio"], p["min_aspect_ratio"]
    else:
        max_ar, min_ar = 1 + p["max_aspect_ratio"], 1 - p["max_aspect_ratio"]
    res = img
    if p["resize"] > 0:
        h, w = res.shape[:2]
        nh, nw = (p["resize"] * h // w, p["resize"]) if h > w else (p["resize"], p["resize"] * w // h)
        res = _cv.resize(res, nw, nh, _interp(p["inter_method"], w, h, nw, nh, rng))
    rrc = p["random_resized_crop"]
    if (p["max_rotate_angle"] > 0 or p["max_shear_ratio"] > 0 or p["rotate"] > 0 or p["max_random_scale"] != 1
            or p["min_random_scale"] != 1 or (not rrc and (min_ar != 1 or max_ar != 1))
            or p["max_img_size"] != 1e10 or p["min_img_size"] != 0):
        s = rng.random() * p["max_shear_ratio"] * 2 - p["max_shear_ratio"]
        angle = int(rng.integers(-p["max_rotate_angle"], p["max_rotate_angle"] + 1))
        if p["rotate"] > 0:
            angle = p["rotate"]
        a, b = math.cos(angle / 180.0 * math.pi), math.sin(angle / 180.0 * math.pi)
        scale = 1.0 if rrc else rng.random() * (p["max_random_scale"] - p["min_random_scale"]) + p["min_random_scale"]
        ratio = 1.0 if rrc else rng.random() * (max_ar - min_ar) + min_ar
        hs = 2 * scale / (1 + ratio)
        ws = ratio * hs
        h, w = res.shape[:2]
        new_w = int(max(p["min_img_size"], min(p["max_img_size"], scale * w)))
        new_h = int(max(p["min_img_size"], min(p["max_img_size"], scale * h)))
        m = np.array([[hs * a - s * b * ws, hs * b + s * a * ws, 0], [-b * ws, a * ws, 0]], np.float32)
        m[0, 2] = (new_w - (m[0, 0] * w + m[0, 1] * h)) / 2
        m[1, 2] = (new_h - (m[1, 0] * w + m[1, 1] * h)) / 2
        res = _cv.warp_affine(res, m, new_w, new_h, _interp(p["inter_method"], w, h, new_w, new_h, rng),
                              p["fill_value"])
    if p["pad"] > 0:
        k = p["pad"]
        res = _cv.copy_make_border(res, k, k, k, k, 0, p["fill_value"])
    cropped = False
    if rrc:
        if p["min_random_scale"] != 1 or p["max_random_scale"] != 1 or p["min_crop_size"] != -1 \
                or p["max_crop_size"] != -1 or p["rand_crop"]:
            raise DnnbindValueError("Setting random_resized_crop to true conflicts with min_random_scale, "
                                    "max_random_scale, min_crop_size, max_crop_size, and rand_crop.")
        if p["max_random_area"] != 1 or p["min_random_area"] != 1 or max_ar != 1 or min_ar != 1:
            h, w = res.shape[:2]
            for _ in range(10):
                target = h * w * rng.uniform(p["min_random_area"], p["max_random_area"])
                r = rng.uniform(min_ar, max_ar)
                y_area, x_area = int(round(math.sqrt(target / r))), int(round(math.sqrt(target * r)))
                if rng.random() > 0.5:
                    y_area, x_area = x_area, y_area
                if y_area <= h and x_area <= w:
                    y0, x0 = int(rng.integers(0, h - y_area + 1)), int(rng.integers(0, w - x_area + 1))
                    res = _cv.resize(res[y0:y0 + y_area, x0:x0 + x_area], ds_w, ds_h,
                                     _interp(p["inter_method"], x_area, y_area, ds_w, ds_h, rng))
                    cropped = True
                    break
    elif p["max_crop_size"] != -1 or p["min_crop_size"] != -1:
        h, w = res.shape[:2]
        if not (w >= p["max_crop_size"] and h >= p["max_crop_size"] and p["max_crop_size"] >= p["min_crop_size"]):
            raise DnnbindValueError("input image size smaller than max_crop_size")
        size = int(rng.integers(p["min_crop_size"], p["max_crop_size"] + 1))
        y, x = h - size, w - size
        if p["rand_crop"]:
            y, x = int(rng.integers(0, y + 1)), int(rng.integers(0, x + 1))
        else:
            y, x = y // 2, x // 2
        res = _cv.resize(res[y:y + size, x:x + size], ds_w, ds_h,
                         _interp(p["inter_method"], size, size, ds_w, ds_h, rng))
        cropped = True
    if not cropped:
        h, w = res.shape[:2]
        code = _interp(p["inter_method"], w, h, ds_w, ds_h, rng)
        if h < ds_h:  # too small: enlarge to the crop first, keeping the aspect (MXNet's float truncation)
            res = _cv.resize(res, int(np.float32(ds_h) / np.float32(h) * np.float32(w)), ds_h, code)
        if res.shape[1] < ds_w:
            h, w = res.shape[:2]
            res = _cv.resize(res, ds_w, int(np.float32(ds_w) / np.float32(w) * np.float32(h)), code)
        h, w = res.shape[:2]
        y, x = h - ds_h, w - ds_w
        if p["rand_crop"]:
            y, x = int(rng.integers(0, y + 1)), int(rng.integers(0, x + 1))
        else:
            y, x = y // 2, x // 2
        res = res[y:y + ds_h, x:x + ds_w]
    if p["brightness"] > 0 or p["contrast"] > 0 or p["saturation"] > 0:
        ab = 1 + rng.uniform(-p["brightness"], p["brightness"])
        ac = 1 + rng.uniform(-p["contrast"], p["contrast"])
        as_ = 1 + rng.uniform(-p["saturation"], p["saturation"])
        # NOTE: MXNet converts with CV_RGB2GRAY on BGR data (weights swapped); kept for the same pixels
        coef = np.array([0.299, 0.587, 0.114], np.float32)
        f = res.astype(np.float32)
        for i in rng.permutation(3):
            if i == 0:
                f = np.clip(np.rint(f * ab), 0, 255)
            elif i == 1:
                gray_mean = np.clip(np.rint(f @ coef), 0, 255).mean()
                f = np.clip(np.rint(f * ac + (1 - ac) * gray_mean), 0, 255)
            else:
                gray = np.clip(np.rint(f @ coef), 0, 255)[..., None]
                f = np.clip(np.rint(f * as_ + gray * (1 - as_)), 0, 255)
        res = f.astype(np.uint8)
    if p["random_h"] or p["random_s"] or p["random_l"]:
        hls = _cv.bgr_to_hls(res).astype(np.int32)
        r = [(rng.random() + 4 * rng.random()) / 5 for _ in range(3)]  # MXNet's near-gaussian draw
        dh = int(r[0] * p["random_h"] * 2 - p["random_h"])
        ds = int(r[1] * p["random_s"] * 2 - p["random_s"])
        dl = int(r[2] * p["random_l"] * 2 - p["random_l"])
        hls += np.array([dh, dl, ds], np.int32)
        res = _cv.hls_to_bgr(np.clip(hls, 0, np.array([180, 255, 255])).astype(np.uint8))
    if p["pca_noise"] > 0:
        alpha = rng.normal(0, p["pca_noise"], 3).astype(np.float32)
        rgb = _PCA @ alpha
        # MXNet adds the float to an int pixel and truncates; channels are B, G, R here
        res = np.clip((res.astype(np.int32) + rgb[::-1]).astype(np.int32), 0, 255).astype(np.uint8)
    return res


# -- decoding in worker processes ------------------------------------------------------------------------------
# DNNBIND_IMAGE_DECODE=processes: ``preprocess_threads`` worker *processes* decode, augment and normalize straight
# into batch buffers in shared memory, where threads share one GIL with the training loop (MXNet's C++ threads
# have none). The batches are the same, value for value: each image's random draws come from its own seed
# (position, epoch), whoever decodes it.

DECODE_ENV = "DNNBIND_IMAGE_DECODE"


def _decode_mode() -> str:
    mode = os.environ.get(DECODE_ENV, "threads").strip().lower() or "threads"
    if mode not in ("threads", "processes"):
        raise DnnbindValueError(f"{DECODE_ENV} must be 'threads' or 'processes', got {mode!r}")
    return mode


_worker: dict = {}  # in a worker process: the iterator's decoding copy, and the shared buffers mapped by path


def _worker_start(state: dict) -> None:
    _worker["it"] = state["cls"]._decoder(state)
    _worker["data"] = ((state["batch_size"],) + tuple(state["p"]["data_shape"]), np.dtype(state["p"]["dtype"]))
    _worker["mapped"] = {}


def _map(path: str, shape: tuple, dtype, create: bool = False) -> np.ndarray:
    """An array on the shared file ``path`` (in /dev/shm). Its base is the mmap object, which stays mapped as long
    as any array on it lives and unmaps when the last goes: never closed by hand, so no array outlives its memory.
    ``create``: make the file, zero-filled."""
    nbytes = max(1, math.prod(shape) * np.dtype(dtype).itemsize)
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        m = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return np.frombuffer(m, dtype, math.prod(shape)).reshape(shape)


def _worker_load(names: tuple, slots, positions: list, states: list, epoch: int) -> None:
    """One pool task in a worker process: a run of a batch's images into the shared buffers ``names`` (the data
    file, the label file, the label rows' shape)."""
    mapped = _worker["mapped"]
    arrays = mapped.get(names)
    if arrays is None:
        shape, dtype = _worker["data"]
        arrays = mapped[names] = (_map(names[0], shape, dtype), _map(names[1], names[2], np.float32))
    _worker["it"]._load_many(slots, positions, states, epoch, arrays[0], arrays[1])


class _SharedRing:
    """The batch buffers of an iterator decoding in worker processes: pairs (data, label) of numpy arrays on
    shared files in /dev/shm, at most ``prefetch_buffer + HELD + 1``. A pair is free when nothing but the ring
    refers to it (the consumer dropped its batch, no task holds it). At most HELD batches a consumer still holds
    are the ring's own; a consumer that keeps more gets copies, so the ring never runs out. The files are unlinked
    when the iterator closes (or is collected); their memory goes with the last array on it."""

    HELD = 2  # ring batches a consumer may hold before it gets copies
    ROOT = "/dev/shm"

    def __init__(self, data_shape: tuple, dtype, label_shape: tuple, limit: int) -> None:
        self.data_shape, self.dtype, self.label_shape, self.limit = data_shape, dtype, label_shape, limit
        rows = label_shape[0]
        self.label_rows = (rows, math.prod(label_shape) // rows)
        self.pairs: list = []  # (data, label) arrays
        self.paths: list = []  # their files, unlinked by close()
        self.by_ptr: dict = {}  # data pointer -> (data path, label path, label rows' shape)
        self._closer = weakref.finalize(self, _unlink, self.paths)  # also when the iterator is only collected

    @classmethod
    def make(cls, it) -> "_SharedRing | None":
        """The ring for ``it``, or None (threads, with a warning) when /dev/shm has not room for it."""
        p = it._p
        data_shape = (it.batch_size,) + tuple(p["data_shape"])
        label_shape = it._label_shape()
        limit = max(1, p["prefetch_buffer"]) + cls.HELD + 1
        need = limit * (math.prod(data_shape) * it._np_dtype.itemsize + math.prod(label_shape) * 4)
        try:
            st = os.statvfs(cls.ROOT)
            room = st.f_bavail * st.f_frsize
        except OSError:
            room = 0
        if need > room // 2:  # NOTE: a tmpfs past its size kills the writer with SIGBUS: keep well inside it
            warnings.warn(f"{DECODE_ENV}=processes: {cls.ROOT} has {room / 2**20:.0f} MiB free and the batch "
                          f"buffers need {need / 2**20:.0f} MiB (twice that free is asked); decoding in threads",
                          stacklevel=4)
            return None
        return cls(data_shape, it._np_dtype, label_shape, limit)

    def _new(self) -> tuple:
        base = os.path.join(self.ROOT, f"dnnbind-imgrec-{os.getpid()}-{id(self):x}-{len(self.pairs)}")
        self.paths += (base + "-data", base + "-label")
        data = _map(base + "-data", self.data_shape, self.dtype, create=True)
        label = _map(base + "-label", self.label_shape, np.float32, create=True)
        self.by_ptr[data.ctypes.data] = (base + "-data", base + "-label", self.label_rows)
        self.pairs.append((data, label))
        return data, label

    def take(self, used: int) -> tuple:
        for pair in self.pairs:
            # NOTE: 2 = the ring's reference and getrefcount's own (see ImageRecordIter._buffers)
            if sys.getrefcount(pair[0]) == 2 and sys.getrefcount(pair[1]) == 2:
                data, label = pair
                data[used:] = 0
                label.reshape(self.label_rows)[used:] = 0
                return data, label
        if len(self.pairs) >= self.limit:
            raise RuntimeError("ImageRecordIter: no free shared batch buffer (cannot happen: see _SharedRing)")
        return self._new()  # a new file reads as zeros

    def names(self, data) -> tuple:
        return self.by_ptr[data.ctypes.data]

    def hand(self, data, label, in_flight: list) -> tuple:
        """What the consumer gets for a finished batch: the ring's own arrays, or copies when it already holds
        HELD of the ring's batches (a pair referenced beyond the ring that is neither this one nor in flight)."""
        busy = {id(d) for d in in_flight}
        busy.add(id(data))
        held = 0
        for pair in self.pairs:
            if id(pair[0]) not in busy and sys.getrefcount(pair[0]) > 2:
                held += 1
        if held >= self.HELD:
            return data.copy(), label.copy()
        return data, label

    def close(self) -> None:
        self.pairs, self.by_ptr = [], {}
        self._closer()


def _unlink(paths: list) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    paths.clear()


class ImageRecordIter(DataIter):
    """``mx.io.ImageRecordIter``: batches of decoded, augmented images from an image RecordIO file (see the
    module docstring for what matches MXNet)."""

    _WHAT = "ImageRecordIter"
    _DEFAULTS = _REC_PARAMS

    def __init__(self, **kwargs):
        p = _parse_args(self._WHAT, self._DEFAULTS, kwargs)
        super().__init__(p["batch_size"])
        self._p = p
        self._init_labels(p)
        offsets, size = _record_offsets(p["path_imgrec"], p.get("path_imgidx", ""))
        self._offsets = _part(offsets, size, p["part_index"], p["num_parts"])
        self._ends = _record_ends(offsets, size)
        self._open_decoding()
        c, h, w = p["data_shape"]
        self.provide_data = [DataDesc(p["data_name"], (self.batch_size, c, h, w), self._np_dtype.type, "NCHW")]
        self.provide_label = [DataDesc(p["label_name"], self._label_shape(), np.float32, "NCHW")]
        self._ring = None  # worker processes: the batches' shared-memory buffers (_SharedRing)
        if _decode_mode() == "processes":
            self._ring = _SharedRing.make(self)
        if self._ring is not None:
            # NOTE: fork, as the DataLoader's workers: spawn and forkserver run the user's main module again (an
            # unguarded training script would start over), and the workers touch no CUDA, only numpy and OpenCV
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(max_workers=p["preprocess_threads"], mp_context=ctx,
                                             initializer=_worker_start, initargs=(self._decoder_state(),))
        else:
            self._pool = ThreadPoolExecutor(max_workers=p["preprocess_threads"], thread_name_prefix="imgrec")
        self._epoch, self._pos, self._overflow, self._state = -1, 0, False, (0, False)
        self._pending = collections.deque()
        self._handed = []  # (data, label) of the batches handed out, reused once nothing else holds them
        self._batch = None
        self.reset()

    def _open_decoding(self) -> None:
        """What decoding an image needs beside the parameters, offsets and labels (also in a worker process)."""
        self._cv2 = _cv.cv2_module() or None  # cv2.LUT / flip / split for the last stage (_normalize), where installed
        self._tables = {}  # _normalize's per-channel tables, by channel count, when no random contrast/illumination
        self._fd = os.open(self._p["path_imgrec"], os.O_RDONLY)
        self._local = threading.local()  # each worker's reusable random generator (_rng)
        self._np_dtype = np.dtype(self._p["dtype"])

    def _decoder_state(self) -> dict:
        """What a worker process needs to decode this iterator's images (_worker_start): its class, parameters,
        record offsets, label tables and the batch buffers' shapes."""
        labels = {k: v for k, v in self.__dict__.items() if k in ("_label_map", "_det_width")}
        return {"cls": type(self), "p": self._p, "offsets": self._offsets, "ends": self._ends, "labels": labels,
                "batch_size": self.batch_size, "label_shape": self._label_shape()}

    @classmethod
    def _decoder(cls, state: dict) -> "ImageRecordIter":
        """A worker process's copy of the iterator: it decodes images into batch buffers, nothing else."""
        it = object.__new__(cls)
        it._p, it._offsets, it._ends, it.batch_size = state["p"], state["offsets"], state["ends"], state["batch_size"]
        it.__dict__.update(state["labels"])
        it._open_decoding()
        return it

    # -- labels --
    def _init_labels(self, p):
        self._label_map = None
        if p["path_imglist"]:
            self._label_map = {}
            with open(p["path_imglist"]) as f:
                for line in f:
                    fields = line.strip().split("\t")
                    if len(fields) >= 3:
                        self._label_map[int(float(fields[0]))] = np.array(fields[1:-1], np.float32)

    def _label_shape(self):
        width = self._p["label_width"]
        return (self.batch_size,) if width == 1 else (self.batch_size, width)

    def _label(self, header) -> np.ndarray:
        width = self._p["label_width"]
        if self._label_map is not None:
            return self._label_map[header.id]
        if header.flag > 0:
            if header.flag != width:
                raise DnnbindValueError(f"rec file provide {header.flag}-dimensional label but label_width is set "
                                        f"to {width}")
            return np.asarray(header.label, np.float32)
        if width != 1:
            raise DnnbindValueError("label_width must be 1 unless an imglist is provided or the rec file is packed "
                                    "with multi dimensional label")
        return np.array([header.label], np.float32)

    # -- one image --
    def _decode(self, payload: bytes) -> np.ndarray:
        c = self._p["data_shape"][0]
        img = imagecodec.decode(payload, {1: 0, 3: 1, 4: -1}[c])
        if img is None:
            raise DnnbindValueError(f"{self._WHAT}: a record of {self._p['path_imgrec']} is not a decodable image")
        if img.ndim == 2:
            img = img[:, :, None]
        if img.shape[2] != c:
            raise DnnbindValueError(f"{self._WHAT}: Expected {c} channels, got {img.shape[2]}")
        return img

    def _rng(self, pos: int, epoch: int, seed_state=None):
        """``np.random.default_rng([key, epoch, pos])``: its generator, or this thread's own set to ``seed_state``
        (_pcg64_seed_states' (state, inc) of that entropy; a state set costs ~3 us of GIL time, a new one ~40)."""
        if seed_state is None:
            p = self._p
            key = p["seed"] if p.get("seed_aug") is None else p["seed_aug"]  # ImageDetRecordIter has no seed_aug
            return np.random.default_rng([int(key) & 0xFFFFFFFF, epoch, pos])
        local = self._local
        if not hasattr(local, "bitgen"):
            local.bitgen = np.random.PCG64(0)
            local.gen = np.random.Generator(local.bitgen)
        local.bitgen.state = {"bit_generator": "PCG64", "state": {"state": seed_state[0], "inc": seed_state[1]},
                              "has_uint32": 0, "uinteger": 0}
        return local.gen

    def _load(self, slot: int, pos: int, epoch: int, data: np.ndarray, label: np.ndarray, seed_state=None) -> None:
        p = self._p
        offset = self._offsets[pos]
        header, payload = recordio.unpack(_read_record(self._fd, p["path_imgrec"], offset, self._ends[offset]))
        label[slot] = self._label(header)
        rng = self._rng(pos, epoch, seed_state)
        res = _augment(self._decode(payload), p, rng)
        self._normalize(res, rng, data[slot])

    def _load_many(self, slots, positions: list, states: list, epoch: int, data: np.ndarray,
                   label: np.ndarray) -> None:
        """One pool task: a run of a batch's images (a future per image costs more GIL time than a small image)."""
        for slot, pos, state in zip(slots, positions, states):
            self._load(slot, pos, epoch, data, label, state)

    def _table(self, n: int, rng) -> np.ndarray:
        """(n, 256): what each uint8 value of each output channel (RGB order) becomes: ``(x - mean) * contrast /
        std + illumination / std`` in float32, then cast to ``dtype`` (int8: ``x - round(mean)``, clipped; uint8:
        x). The same float32 operations the pixels would go through, so a table lookup gives the same values."""
        p, dt = self._p, self._np_dtype
        fixed = dt in (np.uint8, np.int8) or (p["max_random_contrast"] == 0 and p["max_random_illumination"] == 0)
        if fixed and n in self._tables:
            return self._tables[n]
        mean = np.array([p["mean_r"], p["mean_g"], p["mean_b"], p["mean_a"]], np.float32)[:n, None]
        std = np.array([p["std_r"], p["std_g"], p["std_b"], p["std_a"]], np.float32)[:n, None]
        if dt == np.uint8:
            table = np.repeat(np.arange(256, dtype=np.uint8)[None], n, axis=0)
        elif dt == np.int8:
            table = np.clip(np.arange(256, dtype=np.int16) - np.round(mean).astype(np.int16), -128, 127)
        else:
            # MXNet's contrast and illumination draws (zero ranges: 1 * scale and 0)
            contrast = (rng.random() * p["max_random_contrast"] * 2 - p["max_random_contrast"] + 1) * p["scale"]
            illum = (rng.random() * p["max_random_illumination"] * 2 - p["max_random_illumination"]) * p["scale"]
            table = (np.arange(256, dtype=np.float32) - mean) * (np.float32(contrast) / std) \
                + np.float32(illum) / std
        table = np.ascontiguousarray(table.astype(dt))
        if fixed:
            self._tables[n] = table
        return table

    def _normalize(self, res: np.ndarray, rng, out: np.ndarray) -> None:
        """Mirror, BGR(A) -> RGB(A), HWC -> CHW and mean/std into ``out`` (the batch's slot), one table lookup per
        channel (_table), with cv2.LUT where it takes ``dtype`` (all but float16 and int64), else numpy's take:
        both drop the GIL, and nothing of the image's size is allocated but the channel planes."""
        p = self._p
        mirrored = (p["rand_mirror"] and rng.random() < 0.5) or p["mirror"]
        n = res.shape[2]
        table = self._table(n, rng)
        src = (2, 1, 0, 3)[:n] if n >= 3 else (0,)  # OpenCV's BGR(A) -> RGB(A)
        cv2 = self._cv2
        if cv2 is not None and table.dtype in _CV_LUT_DTYPES:
            if mirrored:
                res = cv2.flip(res, 1)  # drops a 1-channel axis
            planes = cv2.split(res) if n > 1 else [res.reshape(res.shape[:2])]
            for c in range(n):
                dst = out[c]
                got = cv2.LUT(planes[src[c]], table[c], dst=dst)
                if got is not dst:  # NOTE: cv2 writes into dst only when it fits; anything else comes back new
                    dst[...] = got.reshape(dst.shape)
            return
        if mirrored:
            res = res[:, ::-1]
        for c in range(n):
            np.take(table[c], res[:, :, src[c]], out=out[c])

    # -- batches --
    def _plan(self):
        """Yield (positions, pad) for the epoch, following MXNet's round_batch rules."""
        n, bs = len(self._offsets), self.batch_size
        order = self._order
        while True:
            if self._overflow:
                return
            take = order[self._pos:self._pos + bs]
            self._pos += len(take)
            if not take:
                return
            if len(take) == bs:
                yield take, 0, (self._pos, False)
                continue
            pad = bs - len(take)
            if self._p["round_batch"]:
                extra = [order[i % n] for i in range(pad)]
                self._pos = pad % n if n else 0
                self._overflow = True
                yield take + extra, pad, (self._pos, True)
            else:
                yield take, pad, (self._pos, False)
            return

    def _buffers(self, used: int) -> tuple:
        """(data, label) for a batch whose first ``used`` slots the workers fill: a pair handed out before that
        nothing references any more (its batch was dropped), its other slots zeroed, or fresh zeros. Reused memory
        is already mapped: fresh memory costs a page fault and the kernel's zeroing per 4 KiB, in every worker."""
        if self._ring is not None:
            return self._ring.take(used)
        for i, pair in enumerate(self._handed):
            # NOTE: 2 = the pair's reference and getrefcount's own; a batch, NDArray or view someone keeps adds
            # one, so what a consumer holds is never written again
            if sys.getrefcount(pair[0]) == 2 and sys.getrefcount(pair[1]) == 2:
                del self._handed[i]
                data, label = pair
                data[used:] = 0
                label.reshape(self.batch_size, -1)[used:] = 0
                return data, label
        c, h, w = self._p["data_shape"]
        return np.zeros((self.batch_size, c, h, w), self._np_dtype), np.zeros(self._label_shape(), np.float32)

    def _submit(self, positions, pad, state):
        data, label = self._buffers(len(positions))
        lab2 = label.reshape(self.batch_size, -1)
        p = self._p
        key = p["seed"] if p.get("seed_aug") is None else p["seed_aug"]
        states = _pcg64_seed_states([[int(key) & 0xFFFFFFFF, self._epoch, pos] for pos in positions])
        # one task per thread (or fewer, smaller ones when batches are small); each writes its own slots
        k = -(-len(positions) // p["preprocess_threads"])
        if self._ring is not None:  # worker processes write into the shared buffers, named
            names = self._ring.names(data)
            futs = [self._pool.submit(_worker_load, names, range(i, min(i + k, len(positions))), positions[i:i + k],
                                      states[i:i + k], self._epoch) for i in range(0, len(positions), k)]
        else:
            futs = [self._pool.submit(self._load_many, range(i, min(i + k, len(positions))), positions[i:i + k],
                                      states[i:i + k], self._epoch, data, lab2) for i in range(0, len(positions), k)]
        self._pending.append((futs, data, label, pad, state))

    def _fill(self):
        while len(self._pending) < max(1, self._p["prefetch_buffer"]):
            nxt = next(self._plan_iter, None)
            if nxt is None:
                return
            self._submit(*nxt)

    def reset(self):
        for futs, *_ in self._pending:  # drop batches in flight: their buffers are private, just wait them out
            for f in futs:
                f.cancel()
        for futs, *_ in self._pending:
            for f in futs:
                if not f.cancelled():
                    f.exception()
        self._pending.clear()
        self._epoch += 1
        # NOTE: batches are planned ahead, so the cursor to resume from is the last *consumed* batch's
        pos, overflow = self._state
        self._overflow = False
        if overflow:
            self._pos = pos  # MXNet: the next epoch goes on after the records the wrap used
        else:
            self._pos = 0
            n = len(self._offsets)
            if self._p["shuffle"]:
                self._order = np.random.default_rng([int(self._p["seed"]) & 0xFFFFFFFF, self._epoch]) \
                    .permutation(n).tolist()
            else:
                self._order = list(range(n))
        self._state = (self._pos, False)
        self._plan_iter = self._plan()
        self._fill()

    def iter_next(self) -> bool:
        if not self._pending:
            self._batch = None
            return False
        futs, data, label, pad, self._state = self._pending.popleft()
        for f in futs:
            f.result()  # re-raises a worker's error here
        self._fill()
        # NOTE: each batch owns its buffers until the consumer drops it (_buffers), so the NDArrays wrap them
        # without a copy. The shared ring is bounded: a consumer keeping its batches gets copies (_SharedRing.hand)
        if self._ring is not None:
            data, label = self._ring.hand(data, label, [entry[1] for entry in self._pending])
        else:
            self._handed.append((data, label))
            if len(self._handed) > self._p["prefetch_buffer"] + 2:
                del self._handed[0]  # a consumer that keeps batches: stop watching the oldest
        self._batch = (NDArray._from_numpy(data), NDArray._from_numpy(label), pad)
        return True

    def next(self) -> DataBatch:
        if not self.iter_next():
            raise StopIteration
        return DataBatch(data=[self._batch[0]], label=[self._batch[1]], pad=self._batch[2], index=None,
                         provide_data=self.provide_data, provide_label=self.provide_label)

    def getdata(self):
        return [self._batch[0]]

    def getlabel(self):
        return [self._batch[1]]

    def getpad(self) -> int:
        return self._batch[2] if self._batch is not None else 0

    def getindex(self):
        return None

    def close(self):
        """Stop the workers and close the file (also done when the iterator is collected)."""
        self._handed = []
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None
        if getattr(self, "_ring", None) is not None:
            self._pending, self._batch = collections.deque(), None
            self._ring.close()
            self._ring = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  (interpreter shutdown)
            pass


# ImageDetRecordIter: its parameters and defaults (mx.io.ImageDetRecordIter.__doc__ of 1.9.1).
_DET_PARAMS = dict(
    path_imglist="", path_imgrec="./data/imgrec.rec", aug_seq="det_aug_default", label_width=-1, data_shape=None,
    preprocess_threads=4, verbose=True, num_parts=1, part_index=0, shuffle_chunk_size=0, shuffle_chunk_seed=0,
    label_pad_width=0, label_pad_value=-1.0, shuffle=False, seed=0, batch_size=None, round_batch=True,
    prefetch_buffer=4, ctx="gpu", dtype=None, resize=-1, rand_crop_prob=0.0, min_crop_scales=(0.0,),
    max_crop_scales=(1.0,), min_crop_aspect_ratios=(1.0,), max_crop_aspect_ratios=(1.0,), min_crop_overlaps=(0.0,),
    max_crop_overlaps=(1.0,), min_crop_sample_coverages=(0.0,), max_crop_sample_coverages=(1.0,),
    min_crop_object_coverages=(0.0,), max_crop_object_coverages=(1.0,), num_crop_sampler=1, crop_emit_mode="center",
    emit_overlap_thresh=0.3, max_crop_trials=(25,), rand_pad_prob=0.0, max_pad_scale=1.0, max_random_hue=0,
    random_hue_prob=0.0, max_random_saturation=0, random_saturation_prob=0.0, max_random_illumination=0,
    random_illumination_prob=0.0, max_random_contrast=0.0, random_contrast_prob=0.0, rand_mirror_prob=0.0,
    fill_value=127, inter_method=1, resize_mode="force", mean_img="", mean_r=0.0, mean_g=0.0, mean_b=0.0,
    mean_a=0.0, std_r=0.0, std_g=0.0, std_b=0.0, std_a=0.0, scale=1.0, data_name="data", label_name="label")

_DET_TUPLES = ("min_crop_scales", "max_crop_scales", "min_crop_aspect_ratios", "max_crop_aspect_ratios",
               "min_crop_overlaps", "max_crop_overlaps", "min_crop_sample_coverages", "max_crop_sample_coverages",
               "min_crop_object_coverages", "max_crop_object_coverages", "max_crop_trials")
_EMIT_MODES = ("center", "overlap")
_RESIZE_MODES = ("force", "shrink", "fit")
_F32 = np.float32


def _as_tuple(name: str, v, kind) -> tuple:
    """A crop parameter as MXNet's Tuple<float|int>: a scalar, a sequence, or its string form '(0.1, 0.3)'."""
    if isinstance(v, str):
        v = [s for s in v.strip().strip("()[]").split(",") if s.strip()]
    elif np.isscalar(v):
        v = [v]
    try:
        return tuple(kind(float(x)) if kind is int else _F32(x) for x in v)
    except (TypeError, ValueError):
        raise DnnbindValueError(f"ImageDetRecordIter: {name} must be a number or a tuple of numbers, "
                                f"got {v!r}") from None


def _det_check(p: dict) -> None:
    """MXNet's DefaultImageDetAugmenter::Init checks, and its broadcast of one-value crop tuples to every sampler."""
    what = "ImageDetRecordIter"
    for name in ("crop_emit_mode", "resize_mode"):
        allowed = _EMIT_MODES if name == "crop_emit_mode" else _RESIZE_MODES
        if p[name] not in allowed:
            raise DnnbindValueError(f"{what}: {name} must be one of {allowed}, got {p[name]!r}")
    if not (0 <= p["inter_method"] <= 4 or p["inter_method"] in (9, 10)):
        raise DnnbindValueError(f"{what}: invalid inter_method {p['inter_method']}: valid values 0-4, 9, 10")
    n = int(p["num_crop_sampler"])
    for name in _DET_TUPLES:
        t = _as_tuple(name, p[name], int if name == "max_crop_trials" else float)
        if n == 1 and len(t) != 1:
            raise DnnbindValueError(f"{what}: {name} must hold 1 value for num_crop_sampler=1, got {t}")
        if n > 1:
            if len(t) == 1:
                t = t * n
            elif len(t) != n:
                raise DnnbindValueError(f"{what}: # of parameters/crop_samplers mismatch: {name} holds {len(t)} "
                                        f"values for num_crop_sampler={n}")
        p[name] = t
    for i in range(max(n, 0)):
        lo, hi = p["min_crop_scales"][i], p["max_crop_scales"][i]
        bad = [msg for ok, msg in (
            (lo >= 0, "min_crop_scales >= 0"), (hi <= 1, "max_crop_scales <= 1"),
            (hi > lo, "max_crop_scales > min_crop_scales"),
            (p["min_crop_aspect_ratios"][i] >= 0, "min_crop_aspect_ratios >= 0"),
            (p["max_crop_aspect_ratios"][i] >= p["min_crop_aspect_ratios"][i], "max >= min crop aspect ratio"),
            (p["max_crop_overlaps"][i] >= p["min_crop_overlaps"][i], "max >= min crop overlap"),
            (p["max_crop_sample_coverages"][i] >= p["min_crop_sample_coverages"][i], "max >= min sample coverage"),
            (p["max_crop_object_coverages"][i] >= p["min_crop_object_coverages"][i], "max >= min object coverage"))
            if not ok]
        if bad:
            raise DnnbindValueError(f"{what}: crop sampler {i} needs {', '.join(bad)}")
    if p["emit_overlap_thresh"] < 0:
        raise DnnbindValueError(f"{what}: emit_overlap_thresh must be >= 0, got {p['emit_overlap_thresh']}")


# -- boxes: rows [id, x1, y1, x2, y2, extra...] in [0, 1] image coordinates; rects (x, y, w, h) as cv::Rect_<float> --

def _intersect_area(rect, boxes: np.ndarray) -> np.ndarray:
    """Area of ``rect & box`` per box (cv::Rect_<float>'s intersection: empty when it has no positive extent)."""
    x, y, w, h = rect
    iw = np.minimum(x + w, boxes[:, 3]) - np.maximum(x, boxes[:, 1])
    ih = np.minimum(y + h, boxes[:, 4]) - np.maximum(y, boxes[:, 2])
    return np.where((iw > 0) & (ih > 0), iw * ih, _F32(0)).astype(_F32)


def _project(boxes: np.ndarray, rect) -> np.ndarray:
    """The boxes in ``rect``'s coordinates, clipped to [0, 1] (ImageDetObject::Project)."""
    x, y, w, h = rect
    out = boxes.copy()
    out[:, 1] = np.maximum(_F32(0), (boxes[:, 1] - x) / w)
    out[:, 2] = np.maximum(_F32(0), (boxes[:, 2] - y) / h)
    out[:, 3] = np.minimum(_F32(1), (boxes[:, 3] - x) / w)
    out[:, 4] = np.minimum(_F32(1), (boxes[:, 4] - y) / h)
    return out


def _try_crop(boxes: np.ndarray, rect, p: dict, i: int):
    """The boxes that survive cropping to ``rect`` under sampler ``i``'s constraints, or None when the crop is
    rejected (ImageDetLabel::TryCrop): some box must meet every constraint that is not its default, and at least
    one box must be emitted ('center': its centre lies in the crop; 'overlap': intersection / box area above
    ``emit_overlap_thresh``)."""
    if len(boxes) == 0:
        return boxes
    x, y, w, h = rect
    inter = _intersect_area(rect, boxes)
    gt_area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 4] - boxes[:, 2])
    ok = np.ones(len(boxes), bool)
    lo, hi = p["min_crop_overlaps"][i], p["max_crop_overlaps"][i]
    if lo > 0 or hi < 1:
        union = w * h + gt_area - inter
        iou = np.where(inter > 0, inter / np.where(union > 0, union, 1), _F32(0))
        ok &= (iou >= lo) & (iou <= hi)
    lo, hi = p["min_crop_sample_coverages"][i], p["max_crop_sample_coverages"][i]
    if lo > 0 or hi < 1:
        c = inter / (w * h)  # NOTE: MXNet's "sample coverage" is intersection / crop area
        ok &= (c >= lo) & (c <= hi)
    lo, hi = p["min_crop_object_coverages"][i], p["max_crop_object_coverages"][i]
    if lo > 0 or hi < 1:
        c = inter / gt_area
        ok &= (c >= lo) & (c <= hi)
    if not ok.any():
        return None
    if p["crop_emit_mode"] == "center":
        cx = (boxes[:, 1] + boxes[:, 3]) * _F32(0.5)
        cy = (boxes[:, 2] + boxes[:, 4]) * _F32(0.5)
        keep = (x <= cx) & (cx < x + w) & (y <= cy) & (cy < y + h)  # cv::Rect::contains: half-open
    else:
        keep = inter / gt_area > _F32(p["emit_overlap_thresh"])
    if not keep.any():
        return None
    return _project(boxes[keep], rect)


def _uniform(rng, lo, hi, n=None):
    """std::uniform_real_distribution<float>(lo, hi): lo + (hi - lo) * u, also for hi < lo (numpy refuses that)."""
    u = rng.random(n)
    return (_F32(lo) + (_F32(hi) - _F32(lo)) * u.astype(_F32)).astype(_F32) if n else \
        _F32(_F32(lo) + (_F32(hi) - _F32(lo)) * _F32(u))


def _crop_rect(rng, lo_scale, hi_scale, lo_ar, hi_ar, img_ar):
    """A random crop (x, y, w, h) in [0, 1] coordinates (GenerateCropBox): scale ~ U(lo, hi), then w/h in pixels
    ~ an aspect ratio in [lo_ar, hi_ar], limited so that neither side exceeds the image."""
    scale = _uniform(rng, lo_scale, hi_scale) + _F32(1e-12)
    lo_r = max(_F32(lo_ar / img_ar), scale * scale)
    hi_r = min(_F32(hi_ar / img_ar), _F32(1.0 / (scale * scale)))
    ratio = _F32(np.sqrt(_uniform(rng, lo_r, hi_r)))
    w, h = min(_F32(1), scale * ratio), min(_F32(1), scale / ratio)
    return _uniform(rng, 0, 1 - w), _uniform(rng, 0, 1 - h), w, h


def _det_augment(img: np.ndarray, boxes: np.ndarray, p: dict, rng):
    """MXNet's det_aug_default on an OpenCV-layout (BGR) uint8 image and its valid boxes, in its order: resize the
    shorter edge, HLS hue/saturation/illumination and contrast, mirror, pad, sampler crop, then ``resize_mode``.
    Returns (image, boxes)."""
    res = img
    if p["resize"] > 0:
        h, w = res.shape[:2]
        nh, nw = (p["resize"] * h // w, p["resize"]) if h > w else (p["resize"], p["resize"] * w // h)
        res = _cv.resize(res, nw, nh, _interp(p["inter_method"], w, h, nw, nh, rng))
    probs = [p["random_hue_prob"], p["random_saturation_prob"], p["random_illumination_prob"],
             p["random_contrast_prob"]]
    if max(probs) > 0:
        # four deltas, then four coin flips, as MXNet draws them; int() truncates toward zero as C++ does
        d = _uniform(rng, -1, 1, 4)
        dh, ds, dl = (int(d[k] * _F32(m)) for k, m in
                      enumerate((p["max_random_hue"], p["max_random_saturation"], p["max_random_illumination"])))
        dc = d[3] * _F32(p["max_random_contrast"])
        flips = rng.random(4) < np.array(probs)
        dh, ds, dl = (v if f else 0 for v, f in zip((dh, ds, dl), flips[:3]))
        dc = dc if flips[3] else _F32(0)
        if dh or ds or dl:
            if res.ndim != 3 or res.shape[2] != 3:
                raise DnnbindValueError("ImageDetRecordIter: hue/saturation/illumination need 3-channel images, "
                                        f"got {res.shape}")
            # OpenCV's HLS layout is (H, L, S); each channel is clipped, H to [0, 180]
            hls = _cv.bgr_to_hls(res).astype(np.int32) + np.array([dh, dl, ds], np.int32)
            res = _cv.hls_to_bgr(np.clip(hls, 0, np.array([180, 255, 255])).astype(np.uint8))
        if abs(float(dc)) > 1e-3:
            # cv::Mat::convertTo(alpha=1+c): round half to even, saturate
            res = np.clip(np.rint(res.astype(_F32) * (dc + _F32(1))), 0, 255).astype(np.uint8)
    if p["rand_mirror_prob"] > 0 and rng.random() < p["rand_mirror_prob"]:
        res = np.ascontiguousarray(res[:, ::-1])  # OpenCV's resize refuses negative strides
        boxes = boxes.copy()
        boxes[:, 1], boxes[:, 3] = 1 - boxes[:, 3], 1 - boxes[:, 1]
    if p["rand_pad_prob"] > 0 and p["max_pad_scale"] > 1 and rng.random() < p["rand_pad_prob"]:
        scale = _uniform(rng, 1, p["max_pad_scale"])
        if scale >= _F32(1.05):  # MXNet skips pads below 5%
            x0, y0 = _uniform(rng, 0, scale - 1, 2)
            boxes = _project(boxes, (-x0, -y0, scale, scale))
            h, w = res.shape[:2]
            left, top = int(x0 * _F32(w)), int(y0 * _F32(h))
            right, bot = int((scale - x0 - 1) * _F32(w)), int((scale - y0 - 1) * _F32(h))
            fill = [p["fill_value"]] * 3 + [0]
            res = _cv.copy_make_border(res, top, bot, left, right, 0, values=fill[:res.shape[2]])
    n = p["num_crop_sampler"]
    if p["rand_crop_prob"] > 0 and n > 0 and rng.random() < p["rand_crop_prob"]:
        # samplers in a random order; the first that finds a crop within its trials wins; none: no crop
        h, w = res.shape[:2]
        for i in rng.permutation(n):
            found = None
            for _ in range(p["max_crop_trials"][i]):
                rect = _crop_rect(rng, p["min_crop_scales"][i], p["max_crop_scales"][i],
                                  p["min_crop_aspect_ratios"][i], p["max_crop_aspect_ratios"][i], _F32(w) / _F32(h))
                kept = _try_crop(boxes, rect, p, i)
                if kept is not None:
                    found = rect, kept
                    break
            if found is not None:
                (x, y, cw, ch), boxes = found
                left, top = int(x * _F32(w)), int(y * _F32(h))
                # NOTE: a degenerate zero-pixel crop would make OpenCV throw; keep one pixel instead
                res = res[top:top + max(1, int(ch * _F32(h))), left:left + max(1, int(cw * _F32(w)))]
                break
    ds_h, ds_w = p["data_shape"][1:]
    h, w = res.shape[:2]
    mode = p["resize_mode"]
    if mode == "force":
        res = _cv.resize(res, ds_w, ds_h, _interp(p["inter_method"], w, h, ds_w, ds_h, rng))
    elif mode == "fit" or (h > ds_h or w > ds_w):  # 'shrink' resizes only an image larger than data_shape
        ratio = min(_F32(ds_h) / _F32(h), _F32(ds_w) / _F32(w))
        nh, nw = int(ratio * _F32(h)), int(ratio * _F32(w))
        res = _cv.resize(res, nw, nh, _interp(p["inter_method"], w, h, nw, nh, rng))
    if res.ndim == 2:
        res = res[:, :, None]
    return res, boxes


class ImageDetRecordIter(ImageRecordIter):
    """``mx.io.ImageDetRecordIter``: images and their boxes through MXNet's ``det_aug_default`` augmenter (shorter
    edge resize, HLS/contrast jitter, mirror, pad, sampler crops, ``resize_mode``), then mean/std; labels
    (batch, 4 + padded width): ``[channels, height, width, label length, header..., objects..., label_pad_value...]``
    from records whose label is ``[header_width, object_width, header extras..., objects...]``."""

    _WHAT = "ImageDetRecordIter"
    _DEFAULTS = _DET_PARAMS

    def __init__(self, **kwargs):
        self._det_rows = None
        super().__init__(**kwargs)

    def _init_labels(self, p):
        _det_check(p)
        self._label_map = None
        # MXNet scans the labels once: the padded width is the longest raw label (or label_pad_width)
        width = 0
        with recordio.MXRecordIO(p["path_imgrec"], "r") as rec:
            while True:
                s = rec.read()
                if s is None:
                    break
                header, _ = recordio.unpack(s)
                n = np.size(header.label)
                if p["label_width"] > 0 and n != p["label_width"]:
                    raise DnnbindValueError(f"rec file provide {n}-dimensional label but label_width is set to "
                                            f"{p['label_width']}")
                width = max(width, n)
        if p["label_pad_width"] > 0:
            if width > p["label_pad_width"]:
                raise DnnbindValueError(f"ImageDetRecordIOParser: label_pad_width: {p['label_pad_width']} smaller "
                                        f"than estimated width: {width}")
            width = p["label_pad_width"]
        self._det_width = width

    def _label_shape(self):
        return (self.batch_size, self._det_width + 4)

    def _load(self, slot, pos, epoch, data, label, seed_state=None):
        p = self._p
        header, payload = recordio.unpack(_read_at(self._fd, p["path_imgrec"], self._offsets[pos]))
        raw = np.ravel(np.asarray(header.label, np.float32))
        hw = int(raw[0]) if raw.size else 0
        ow = int(raw[1]) if raw.size > 1 else 0
        if raw.size < 7 or hw < 2 or ow < 5 or (raw.size - hw) % ow:
            raise DnnbindValueError(f"ImageDetRecordIter: a label must be [header_width >= 2, object_width >= 5, "
                                    f"..., objects...], got {raw.tolist()}")
        objs = raw[hw:].reshape(-1, ow)
        # MXNet keeps only boxes with x2 > x1 and y2 > y1 (ImageDetLabel::FromArray), even without augmentation
        objs = objs[(objs[:, 3] > objs[:, 1]) & (objs[:, 4] > objs[:, 2])]
        rng = self._rng(pos, epoch, seed_state)
        img, objs = _det_augment(self._decode(payload), objs, p, rng)
        out_label = np.concatenate([raw[:hw], objs.ravel()])
        row = np.full(self._det_width + 4, p["label_pad_value"], np.float32)
        row[:4] = (img.shape[2], img.shape[0], img.shape[1], out_label.size)
        row[4:4 + out_label.size] = out_label
        label[slot] = row
        chw = np.transpose(img, (2, 0, 1))
        if chw.shape[0] >= 3:
            chw = chw[[2, 1, 0, 3][:chw.shape[0]]]
        n, (ds_h, ds_w) = chw.shape[0], p["data_shape"][1:]
        # 'shrink' / 'fit' leave a smaller image at the top left; MXNet's rest is fresh (zero) memory
        full = np.zeros((n, ds_h, ds_w), np.float32)
        full[:, :chw.shape[1], :chw.shape[2]] = chw
        mean = np.array([p["mean_r"], p["mean_g"], p["mean_b"], p["mean_a"]], np.float32)[:n, None, None]
        std = np.array([p["std_r"], p["std_g"], p["std_b"], p["std_a"]], np.float32)[:n, None, None]
        out = full - mean
        # NOTE: the det iterator's std defaults to 0, meaning "no division"
        out = np.where(std > 0, out / np.where(std > 0, std, 1), out) * np.float32(p["scale"])
        data[slot] = out
