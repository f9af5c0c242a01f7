"""im2rec: image lists (.lst) and RecordIO image databases (.rec/.idx), as MXNet's tools/im2rec.py.

Layer: top (a program); imports dnnbind.recordio and dnnbind.imagecodec.

    python -m dnnbind.tools.im2rec --list --recursive data/train images/   # images/<class>/*.jpg -> data/train.lst
    python -m dnnbind.tools.im2rec data/train images/                      # every data/train*.lst -> .rec + .idx

Same flags, .lst format (``index<TAB>label...<TAB>path``, labels as ``%f``), shuffle (``random.seed(100)``),
chunk and train/test/val split, and record layout as MXNet's, so real MXNet reads the output. Images are read,
cropped, resized and encoded with OpenCV when it is installed (then the records are MXNet's bytes) and with
Pillow otherwise (then the decoded pixels match MXNet's for PNG input; encoded bytes differ).

Differences, on purpose: ``--num-thread N`` encodes in a pool of N processes and writes the records in list
order (MXNet also restores list order, through a reorder buffer); an image that cannot be read is reported
and left out in every mode (MXNet's single-process path crashes on one).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time

from .. import imagecodec, recordio


def list_image(root: str, recursive: bool, exts: list[str]):
    """(index, path relative to root, label) of each image: with ``recursive``, every folder under root in
    walk order (folders and files sorted) gets the next label as its first image is found; else the files
    directly in root, label 0."""
    i = 0
    if recursive:
        cat: dict[str, int] = {}
        for path, dirs, files in os.walk(root, followlinks=True):
            dirs.sort()  # os.walk visits dirs in the order this list has when it returns
            files.sort()
            for fname in files:
                fpath = os.path.join(path, fname)
                if os.path.isfile(fpath) and os.path.splitext(fname)[1].lower() in exts:
                    label = cat.setdefault(path, len(cat))
                    yield (i, os.path.relpath(fpath, root), label)
                    i += 1
        for folder, label in sorted(cat.items(), key=lambda kv: kv[1]):
            print(os.path.relpath(folder, root), label)
    else:
        for fname in sorted(os.listdir(root)):
            fpath = os.path.join(root, fname)
            if os.path.isfile(fpath) and os.path.splitext(fname)[1].lower() in exts:
                yield (i, os.path.relpath(fpath, root), 0)
                i += 1


def write_list(path_out: str, image_list: list) -> None:
    """Lines ``index<TAB>label<TAB>...path``; labels with %f (6 decimals), as MXNet writes them."""
    with open(path_out, "w") as fout:
        for item in image_list:
            labels = "".join(f"{float(x):f}\t" for x in item[2:])
            fout.write(f"{item[0]:d}\t{labels}{item[1]}\n")


def make_list(args: argparse.Namespace) -> None:
    """Write <prefix>[_<chunk>][_train|_val|_test].lst from the images under args.root."""
    image_list = list(list_image(args.root, args.recursive, args.exts))
    if args.shuffle:
        random.seed(100)  # MXNet's fixed seed: the same folder gives the same .lst as MXNet's tool
        random.shuffle(image_list)
    n = len(image_list)
    chunk_size = (n + args.chunks - 1) // args.chunks
    for i in range(args.chunks):
        chunk = image_list[i * chunk_size:(i + 1) * chunk_size]
        suffix = f"_{i}" if args.chunks > 1 else ""
        # The split sizes come from the chunk size, not the chunk's length (the last chunk may be shorter).
        sep = int(chunk_size * args.train_ratio)
        sep_test = int(chunk_size * args.test_ratio)
        if args.train_ratio == 1.0:
            write_list(args.prefix + suffix + ".lst", chunk)
            continue
        if args.test_ratio:
            write_list(args.prefix + suffix + "_test.lst", chunk[:sep_test])
        if args.train_ratio + args.test_ratio < 1.0:
            write_list(args.prefix + suffix + "_val.lst", chunk[sep_test + sep:])
        write_list(args.prefix + suffix + "_train.lst", chunk[sep_test:sep_test + sep])


def read_list(path_in: str):
    """[index, path, label, ...] for each well-formed line of a .lst file; bad lines are reported and skipped."""
    with open(path_in) as fin:
        for line in fin:
            fields = [f.strip() for f in line.strip().split("\t")]
            if len(fields) < 3:
                print(f"lst should have at least has three parts, but only has {len(fields)} parts for {fields}")
                continue
            try:
                item = [int(fields[0]), fields[-1]] + [float(f) for f in fields[1:-1]]
            except ValueError as e:
                print(f"Parsing lst met error for {fields}, detail: {e}")
                continue
            yield item


def image_encode(args: argparse.Namespace, item: list) -> bytes | None:
    """One list item as a packed record, or None (reported) when the image cannot be read or encoded."""
    fullpath = os.path.join(args.root, item[1])
    label = item[2:] if len(item) > 3 and args.pack_label else item[2]
    header = recordio.IRHeader(0, label, item[0], 0)
    if args.pass_through:  # the file's own bytes, not decoded
        try:
            with open(fullpath, "rb") as fin:
                return recordio.pack(header, fin.read())
        except OSError as e:
            print("pack_img error:", item[1], e)
            return None
    img = imagecodec.imread(fullpath, args.color)
    if img is None:
        print(f"imread read blank (None) image for file: {fullpath}")
        return None
    if args.center_crop:  # the centred square, the longer side cut evenly
        h, w = img.shape[:2]
        if h > w:
            margin = (h - w) // 2
            img = img[margin:margin + w, :]
        else:
            margin = (w - h) // 2
            img = img[:, margin:margin + h]
    if args.resize:  # the shorter side to args.resize, the other scaled (floored)
        h, w = img.shape[:2]
        size = (args.resize, h * args.resize // w) if h > w else (w * args.resize // h, args.resize)
        img = imagecodec.resize(img, *size)
    try:
        return recordio.pack_img(header, img, quality=args.quality, img_fmt=args.encoding)
    except Exception as e:  # noqa: BLE001  (report the file and go on, as MXNet does)
        print(f"pack_img error on file: {fullpath}", e)
        return None


class _Encoder:
    """``image_encode`` with the arguments bound, picklable for the worker pool."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __call__(self, item: list) -> tuple[list, bytes | None]:
        return item, image_encode(self.args, item)


def write_record(args: argparse.Namespace, lst: str, working_dir: str) -> int:
    """Encode the images of one .lst into <name>.rec and <name>.idx in working_dir; returns the records written."""
    name = os.path.splitext(os.path.basename(lst))[0]
    record = recordio.MXIndexedRecordIO(os.path.join(working_dir, name + ".idx"),
                                        os.path.join(working_dir, name + ".rec"), "w")
    items = read_list(lst)
    encode = _Encoder(args)
    pool = None
    if args.num_thread > 1:
        pool = multiprocessing.Pool(args.num_thread)
        results = pool.imap(encode, items, chunksize=16)  # imap keeps list order, so the output is deterministic
    else:
        results = map(encode, items)
    count, pre_time = 0, time.time()
    try:
        for item, packed in results:
            if packed is None:
                continue
            record.write_idx(item[0], packed)
            if count % 1000 == 0:
                cur_time = time.time()
                print("time:", cur_time - pre_time, " count:", count)
                pre_time = cur_time
            count += 1
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        record.close()
    return count


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dnnbind.tools.im2rec", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Create an image list or make a record database by reading from an image list")
    parser.add_argument("prefix", help="prefix of input/output lst and rec files.")
    parser.add_argument("root", help="path to folder containing images.")
    cgroup = parser.add_argument_group("Options for creating image lists")
    cgroup.add_argument("--list", action="store_true",
                        help="create image list(s) <prefix>.lst by traversing root; otherwise read <prefix>*.lst "
                             "and create <prefix>*.rec")
    cgroup.add_argument("--exts", nargs="+", default=[".jpeg", ".jpg", ".png"],
                        help="list of acceptable image extensions.")
    cgroup.add_argument("--chunks", type=int, default=1, help="number of chunks.")
    cgroup.add_argument("--train-ratio", type=float, default=1.0, help="Ratio of images to use for training.")
    cgroup.add_argument("--test-ratio", type=float, default=0, help="Ratio of images to use for testing.")
    cgroup.add_argument("--recursive", action="store_true",
                        help="walk subfolders and give each folder its own label; otherwise only the images in "
                             "root, label 0")
    cgroup.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                        help="keep the listing order in <prefix>.lst instead of shuffling")
    rgroup = parser.add_argument_group("Options for creating database")
    rgroup.add_argument("--pass-through", action="store_true",
                        help="whether to skip transformation and save image as is")
    rgroup.add_argument("--resize", type=int, default=0,
                        help="resize the shorter edge of image to the newsize; 0 packs the original size")
    rgroup.add_argument("--center-crop", action="store_true",
                        help="crop the centre of the image to make it square")
    rgroup.add_argument("--quality", type=int, default=95,
                        help="JPEG quality for encoding, 1-100; or PNG compression for encoding, 1-9")
    rgroup.add_argument("--num-thread", type=int, default=1,
                        help="number of processes encoding images (the records keep list order)")
    rgroup.add_argument("--color", type=int, default=1, choices=[-1, 0, 1],
                        help="1: color (alpha dropped), 0: grayscale, -1: as stored, alpha included")
    rgroup.add_argument("--encoding", type=str, default=".jpg", choices=[".jpg", ".png"],
                        help="specify the encoding of the images.")
    rgroup.add_argument("--pack-label", action="store_true",
                        help="Whether to also pack multi dimensional label in the record file")
    args = parser.parse_args(argv)
    args.prefix = os.path.abspath(args.prefix)
    args.root = os.path.abspath(args.root)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        make_list(args)
        return 0
    working_dir = args.prefix if os.path.isdir(args.prefix) else os.path.dirname(args.prefix)
    # Every <prefix>*.lst in the folder (train, val, chunks), as MXNet's tool does.
    lists = sorted(os.path.join(working_dir, f) for f in os.listdir(working_dir)
                   if os.path.isfile(os.path.join(working_dir, f)))
    lists = [f for f in lists if f.startswith(args.prefix) and f.endswith(".lst")]
    for lst in lists:
        print("Creating .rec file from", lst, "in", working_dir)
        write_record(args, lst, working_dir)
    if not lists:
        print(f"Did not find and list file with prefix {args.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
