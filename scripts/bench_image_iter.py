"""Images per second of mx.io.ImageRecordIter (dnnbind.image.record_iter) on synthetic ImageNet-sized JPEGs.

Writes a .rec of random-content 500x375-ish JPEGs once (to --dir), then times epochs of 224x224 random crop +
mirror + mean/std with preprocess_threads = the machine's cores. Pixels are decoded by OpenCV when it imports
(install opencv-python-headless for MXNet's speed and pixels), else Pillow.

    python scripts/bench_image_iter.py [--images 2000] [--batch 128] [--threads N] [--dir /tmp/bench_imgrec]
"""

import argparse
import os
import time

import numpy as np

from dnnbind import imagecodec, recordio
from dnnbind import io as mxio

IMAGES = 2000         # records in the synthetic .rec
BATCH = 128           # batch size
SHAPE = (3, 224, 224)  # data_shape: ImageNet training crop
EPOCHS = 2            # timed passes (the first also warms the page cache); after a wrapped last batch MXNet's
                      # next epoch starts after the wrapped images, so epoch image counts differ


def make_rec(path: str, n: int, seed: int = 0) -> None:
    """n JPEGs of ImageNet-like sizes: smooth color fields plus noise, so they compress like photos."""
    rng = np.random.default_rng(seed)
    with recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w") as rec:
        for i in range(n):
            h, w = int(rng.integers(333, 500)), int(rng.integers(400, 500))
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            base = np.stack([yy / h * 255, xx / w * 255, (yy + xx) / (h + w) * 255], axis=2)
            img = np.clip(base * rng.uniform(0.5, 1.0) + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
            rec.write_idx(i, recordio.pack_img(recordio.IRHeader(0, float(i % 1000), i, 0), img, quality=90))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=IMAGES)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dir", default="/tmp/bench_imgrec")
    args = ap.parse_args()

    # data: generate once, reuse on later runs
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"synthetic_{args.images}.rec")
    if not os.path.exists(path):
        t = time.perf_counter()
        make_rec(path, args.images)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")

    it = mxio.ImageRecordIter(path_imgrec=path, path_imgidx=path[:-4] + ".idx", data_shape=SHAPE,
                              batch_size=args.batch, rand_crop=True, rand_mirror=True, mean_r=123.68,
                              mean_g=116.28, mean_b=103.53, std_r=58.395, std_g=57.12, std_b=57.375,
                              preprocess_threads=args.threads, prefetch_buffer=4)
    print(f"decoder: {imagecodec.backend()}, threads: {args.threads}, batch: {args.batch}")
    # timed epochs: one log line each; CPU time over all threads says how many cores the decoding kept busy (about
    # --threads: CPU-bound, decode limits; far fewer: the threads wait, on the GIL or on the reads)
    for epoch in range(EPOCHS):
        it.reset()
        t, c, n = time.perf_counter(), os.times(), 0
        for batch in it:
            n += batch.data[0].shape[0] - batch.pad
        dt, c1 = time.perf_counter() - t, os.times()
        cpu = c1.user + c1.system - c.user - c.system
        print(f"epoch {epoch}: {n} images in {dt:.2f} s = {n / dt:.0f} images/s; CPU {cpu / n * 1e6:.0f} us/image "
              f"({(c1.system - c.system) / n * 1e6:.0f} in the kernel), {cpu / dt:.1f} cores busy")
    it.close()


if __name__ == "__main__":
    main()
