"""RecordIO (dnnbind.recordio), im2rec (dnnbind.tools.im2rec) and the image data sets, checked against files the
real MXNet 1.9.1 wrote (tests/fixtures/make_mxnet_recordio.py, run with MXNet's interpreter).

Record files must match MXNet's byte for byte. Image pixels: PNG exactly; a color image read as gray within one
level (Pillow rounds the luma weights differently from OpenCV); JPEG within a few levels (another decoder may
use another IDCT). Image tests run once per installed codec (OpenCV, Pillow) and skip without either.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from dnnbind import imagecodec, recordio
from dnnbind.recordio import IRHeader, MXIndexedRecordIO, MXRecordIO, RecordIOError
from dnnbind.tools import im2rec

FIX = Path(__file__).parent / "fixtures" / "mxnet_recordio"
MAGIC = struct.pack("<I", 0xCED7230A)
ORACLE = Path("/tmp/mx/bin/python")  # MXNet 1.9.1's interpreter, where this machine has it

BACKENDS = [name for name, mod in (("cv2", "cv2"), ("pil", "PIL")) if importlib.util.find_spec(mod)]


@pytest.fixture(params=BACKENDS or [pytest.param(None, marks=pytest.mark.skip("needs OpenCV or Pillow"))])
def codec(request, monkeypatch):
    """Run the test with each installed image library."""
    monkeypatch.setattr(imagecodec, "_backend", request.param)
    return request.param


def payloads() -> list[bytes]:
    return [bytes.fromhex(line.strip()) for line in (FIX / "plain.txt").read_text().splitlines()]


def read_all(rec: MXRecordIO) -> list[bytes]:
    out = []
    while (item := rec.read()) is not None:
        out.append(item)
    return out


def parts(path: Path) -> list[tuple[int, int, int]]:
    """(offset, cflag, length) of every part of a .rec file, parsed here independently of dnnbind.recordio."""
    data, pos, out = path.read_bytes(), 0, []
    while pos < len(data):
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == 0xCED7230A
        out.append((pos, lrec >> 29, lrec & (2**29 - 1)))
        pos += 8 + ((lrec & (2**29 - 1)) + 3) // 4 * 4
    return out


def assert_close(got: np.ndarray, want: np.ndarray, tol: int, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs {want.shape} " \
                                                                 f"{want.dtype}"
    err = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert err.max(initial=0) <= tol, f"{what}: max error {err.max()} > {tol} at {np.unravel_index(err.argmax(), err.shape)}"


# -- the record layer ---------------------------------------------------------------------------------------------

def test_reads_mxnet_records_including_split_ones():
    rec = MXRecordIO(FIX / "plain.rec", "r")
    assert read_all(rec) == payloads()
    assert rec.read() is None  # still None at the end
    rec.reset()
    assert rec.read() == payloads()[0]
    rec.close()
    # The fixture really holds split records (cflag 1/2/3), and the magic at an unaligned offset is not split.
    flags = [cflag for _, cflag, _ in parts(FIX / "plain.rec")]
    assert {1, 2, 3} <= set(flags)
    assert len(flags) == len(payloads()) + 6  # one more part for each aligned magic


def test_writes_mxnet_bytes(tmp_path):
    with MXRecordIO(tmp_path / "x.rec", "w") as rec:
        for p in payloads():
            rec.write(p)
        assert rec.tell() == (FIX / "plain.rec").stat().st_size
    assert (tmp_path / "x.rec").read_bytes() == (FIX / "plain.rec").read_bytes()


@pytest.mark.parametrize("name,key_type", [("img", int), ("strkeys", str)])
def test_indexed_round_trip_is_byte_identical(tmp_path, name, key_type):
    src = MXIndexedRecordIO(FIX / f"{name}.idx", FIX / f"{name}.rec", "r", key_type=key_type)
    dst = MXIndexedRecordIO(tmp_path / f"{name}.idx", tmp_path / f"{name}.rec", "w", key_type=key_type)
    for key in src.keys:
        dst.write_idx(key, src.read_idx(key))
    dst.close()
    for ext in (".rec", ".idx"):
        assert (tmp_path / f"{name}{ext}").read_bytes() == (FIX / f"{name}{ext}").read_bytes()
    assert all(isinstance(k, key_type) for k in src.keys)
    if name == "strkeys":
        assert src.keys == ["b", "a", "c"] and src.read_idx("a") == b"record a"
    # random access in any order
    for key in reversed(src.keys):
        assert src.read_idx(key) == MXIndexedRecordIO(FIX / f"{name}.idx", FIX / f"{name}.rec", "r",
                                                      key_type=key_type).read_idx(key)
    with pytest.raises(KeyError, match="not a key"):
        src.read_idx(key_type(99))


def test_headers_and_labels_as_mxnet_wrote_them():
    rec = MXIndexedRecordIO(FIX / "img.idx", FIX / "img.rec", "r")
    assert rec.keys == [0, 1, 5, 2]
    heads = {k: recordio.unpack(rec.read_idx(k))[0] for k in rec.keys}
    assert heads[0] == IRHeader(0, 3.0, 10, 0)
    assert heads[5] == IRHeader(0, 7.0, 12, 3)
    assert heads[1][0] == 3 and heads[1][2:] == (11, 0)
    np.testing.assert_array_equal(heads[1].label, np.array([1.0, 2.5, -3.0], np.float32))
    assert heads[2][0] == 2 and heads[2].label.dtype == np.float32
    np.testing.assert_array_equal(heads[2].label, [4.0, 0.5])
    assert repr(heads[0]) == "HEADER(flag=0, label=3.0, id=10, id2=0)"


def test_pack_matches_mxnet():
    got = payloads()
    assert recordio.pack(IRHeader(0, 1.5, 7, 0), b"payload") == got[9]
    assert recordio.pack((5, [1, 2, 3], 8, 9), MAGIC + b"!") == got[10]  # flag is recomputed from the label
    header, body = recordio.unpack(got[10])
    assert header.flag == 3 and (header.id, header.id2) == (8, 9) and body == MAGIC + b"!"
    assert recordio.pack(IRHeader(9, 2, 1, 0), b"")[:4] == b"\0\0\0\0"  # a number label: flag 0
    with pytest.raises(ValueError, match="24-byte IRHeader"):
        recordio.unpack(b"short")
    with pytest.raises(ValueError, match="3 float32 labels"):
        recordio.unpack(recordio.pack(IRHeader(0, [1, 2, 3], 0, 0), b"")[:30])


def test_split_records_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    items = []
    for n in range(40):
        words = rng.integers(0, 2**32, size=int(rng.integers(0, 40)), dtype=np.uint32)
        words[rng.random(words.size) < 0.3] = 0xCED7230A  # magic at aligned offsets
        tail = bytes(rng.integers(0, 256, size=n % 4, dtype=np.uint8))
        items.append(words.astype("<u4").tobytes() + tail)
    items.append(b"x" + MAGIC * 3)  # unaligned copies
    with MXRecordIO(tmp_path / "r.rec", "w") as rec:
        for item in items:
            rec.write(item)
        rec.write(bytearray(b"bytearray"))
        rec.write(np.arange(3, dtype=np.uint8))  # anything with the buffer protocol
    assert read_all(MXRecordIO(tmp_path / "r.rec", "r")) == items + [b"bytearray", b"\0\1\2"]


def test_reader_and_writer_rules(tmp_path):
    with pytest.raises(ValueError, match="Invalid flag"):
        MXRecordIO(tmp_path / "x.rec", "a")
    w = MXRecordIO(tmp_path / "x.rec", "w")
    with pytest.raises(TypeError, match="str"):
        w.write("text")
    with pytest.raises(ValueError, match="reading needs flag 'r'"):
        w.read()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(w)
    w.write(b"one")
    w.write(b"two")
    w.close()
    w.close()  # idempotent
    r = MXRecordIO(tmp_path / "x.rec", "r")
    with pytest.raises(ValueError, match="writing needs flag 'w'"):
        r.write(b"x")
    assert r.read() == b"one"
    copy = pickle.loads(pickle.dumps(r))  # the copy starts over; the original keeps its place
    assert copy.read() == b"one" and r.read() == b"two"
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.read()
    idx = MXIndexedRecordIO(tmp_path / "y.idx", tmp_path / "y.rec", "w")
    idx.write_idx(3, b"three")
    idx.close()
    reader = pickle.loads(pickle.dumps(MXIndexedRecordIO(tmp_path / "y.idx", tmp_path / "y.rec", "r")))
    assert reader.keys == [3] and reader.read_idx(3) == b"three"


# -- corrupt and truncated files ----------------------------------------------------------------------------------

def corrupt(tmp_path, data: bytes) -> Path:
    path = tmp_path / "bad.rec"
    path.write_bytes(data)
    return path


def test_bad_magic_names_file_and_offset(tmp_path):
    good = (FIX / "plain.rec").read_bytes()
    second = parts(FIX / "plain.rec")[1][0]
    path = corrupt(tmp_path, good[:second] + b"\xde\xad\xbe\xef" + good[second + 4:])
    rec = MXRecordIO(path, "r")
    assert rec.read() == b""
    with pytest.raises(RecordIOError, match=rf"bad\.rec: invalid RecordIO file at byte offset {second}: bad magic"
                       r" number 0xefbeadde") as err:
        rec.read()
    assert err.value.offset == second and isinstance(err.value, ValueError)
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value)


@pytest.mark.parametrize("cut,what", [(3, "ends inside a part header"), (10, "truncated record"),
                                      (0, "split record")])
def test_truncated_file_names_the_offset(tmp_path, cut, what):
    # plain.txt item 7 is split in three parts; cut inside its first part (header, payload) or after it.
    layout = parts(FIX / "plain.rec")
    first = next(p for p in layout if p[1] == 1 and p[2] == 8)
    end = first[0] + 8 + first[2] if cut == 0 else first[0] + cut
    rec = MXRecordIO(corrupt(tmp_path, (FIX / "plain.rec").read_bytes()[:end]), "r")
    for _ in range(7):
        rec.read()
    offset = end if cut == 0 else first[0]
    with pytest.raises(RecordIOError, match=rf"byte offset {offset}: .*{what}"):
        rec.read()


def test_misplaced_part_flags(tmp_path):
    part = struct.pack("<II", 0xCED7230A, (2 << 29) | 4) + b"abcd"  # a middle part with nothing before it
    with pytest.raises(RecordIOError, match="byte offset 0: part flag 2"):
        MXRecordIO(corrupt(tmp_path, part), "r").read()
    idx = tmp_path / "bad.idx"
    idx.write_text("0\t8000\n")
    with pytest.raises(RecordIOError, match="offset 8000"):
        MXIndexedRecordIO(idx, tmp_path / "bad.rec", "r").read_idx(0)
    idx.write_text("0 8\n")
    with pytest.raises(ValueError, match="bad.idx:1"):
        MXIndexedRecordIO(idx, tmp_path / "bad.rec", "r")


# -- images -------------------------------------------------------------------------------------------------------

JPEG_TOL = 8


def test_unpack_img_matches_mxnet(codec):
    dec = np.load(FIX / "decoded.npz")
    rec = MXIndexedRecordIO(FIX / "img.idx", FIX / "img.rec", "r")
    jpeg = {1, 2}
    for key in rec.keys:
        for iscolor in (-1, 0, 1):
            _, img = recordio.unpack_img(rec.read_idx(key), iscolor)
            want = dec[f"key_{key}_{iscolor}"]
            # Pillow's luma rounding differs from OpenCV's by one level when a color PNG is read as gray.
            tol = JPEG_TOL if key in jpeg else (1 if iscolor == 0 and codec == "pil" else 0)
            assert_close(img, want, tol, f"key {key} iscolor {iscolor}")
    assert recordio.unpack_img(recordio.pack(IRHeader(0, 1, 0, 0), b"not an image"))[1] is None


def test_pack_img_round_trip(codec):
    src = np.load(FIX / "source.npz")
    for name in ("img0", "img2", "img3"):
        s = recordio.pack_img(IRHeader(0, [1, 2], 4, 0), src[name], quality=9, img_fmt=".PNG")
        header, img = recordio.unpack_img(s)
        np.testing.assert_array_equal(img, src[name])
        np.testing.assert_array_equal(header.label, [1, 2])
    s = recordio.pack_img(IRHeader(0, 1, 4, 0), src["img3"], quality=95)  # smooth content: JPEG stays close
    assert s[24:26] == b"\xff\xd8"
    assert_close(recordio.unpack_img(s)[1], src["img3"], 12, "jpeg round trip")
    with pytest.raises(ValueError, match="'.jpg', '.jpeg' or '.png'"):
        recordio.pack_img(IRHeader(0, 1, 4, 0), src["img0"], img_fmt=".bmp")


def test_pack_img_bytes_match_mxnet_with_opencv(codec):
    if codec != "cv2":
        pytest.skip("encoded bytes are MXNet's only with OpenCV (Pillow's encoders differ)")
    src = np.load(FIX / "source.npz")
    rec = MXIndexedRecordIO(FIX / "img.idx", FIX / "img.rec", "r")
    assert recordio.pack_img(IRHeader(0, 3.0, 10, 0), src["img0"], img_fmt=".png") == rec.read_idx(0)
    assert recordio.pack_img(IRHeader(0, [1.0, 2.5, -3.0], 11, 0), src["img1"], quality=90) == rec.read_idx(1)
    assert recordio.pack_img(IRHeader(0, 7, 12, 3), src["img2"], quality=3, img_fmt=".png") == rec.read_idx(5)
    assert recordio.pack_img(IRHeader(0, np.array([4.0, 0.5], np.float32), 13, 0), src["img3"]) == rec.read_idx(2)


# -- im2rec ----------------------------------------------------------------------------------------------------

def test_im2rec_lists_match_mxnet(tmp_path, capsys):
    im2rec.main(["--list", "--recursive", str(tmp_path / "folder"), str(FIX / "images")])
    assert "cat 0\ndog 1\n" in capsys.readouterr().out
    assert (tmp_path / "folder.lst").read_text() == (FIX / "im2rec" / "folder.lst").read_text()
    im2rec.main(["--list", "--recursive", "--no-shuffle", "--train-ratio", "0.6", "--test-ratio", "0.2",
                 str(tmp_path / "split"), str(FIX / "images")])
    for part in ("train", "test", "val"):
        assert (tmp_path / f"split_{part}.lst").read_text() == (FIX / "im2rec" / f"split_{part}.lst").read_text()
    im2rec.main(["--list", "--chunks", "2", str(tmp_path / "top"), str(FIX / "images" / "cat"), "--exts", ".png"])
    chunks = [(tmp_path / f"top_{i}.lst").read_text() for i in range(2)]  # one image each, shuffled
    assert sorted(chunks) == ["0\t0.000000\tC.PNG\n", "1\t0.000000\ta.png\n"]  # .PNG lowercased; no b.jpg


def test_im2rec_pass_through_is_byte_identical(tmp_path):
    shutil.copy(FIX / "im2rec" / "raw.lst", tmp_path / "raw.lst")
    im2rec.main(["--pass-through", str(tmp_path / "raw"), str(FIX / "images")])
    for ext in (".rec", ".idx"):
        assert (tmp_path / f"raw{ext}").read_bytes() == (FIX / "im2rec" / f"raw{ext}").read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_im2rec_png_database_decodes_as_mxnet(tmp_path, codec, threads):
    shutil.copy(FIX / "im2rec" / "folder.lst", tmp_path / "folder.lst")
    im2rec.main(["--encoding", ".png", "--num-thread", str(threads), str(tmp_path / "folder"), str(FIX / "images")])
    assert (tmp_path / "folder.idx").read_text().count("\n") == 5
    mine = MXIndexedRecordIO(tmp_path / "folder.idx", tmp_path / "folder.rec", "r")
    theirs = MXIndexedRecordIO(FIX / "im2rec" / "folder.idx", FIX / "im2rec" / "folder.rec", "r")
    assert mine.keys == theirs.keys
    for key in theirs.keys:
        (h1, a), (h2, b) = recordio.unpack_img(mine.read_idx(key)), recordio.unpack_img(theirs.read_idx(key))
        assert h1 == h2
        # b.jpg and d.jpeg are decoded from JPEG before re-encoding as PNG
        assert_close(a, b, JPEG_TOL, f"key {key}")
    if codec == "cv2":  # OpenCV encodes: MXNet's very bytes (checked with OpenCV 4.11 against MXNet's 4.5.5)
        for ext in (".rec", ".idx"):
            assert (tmp_path / f"folder{ext}").read_bytes() == (FIX / "im2rec" / f"folder{ext}").read_bytes()


def test_im2rec_resize_crop_and_labels(tmp_path, codec):
    (tmp_path / "multi.lst").write_text("7\t1.5\t2.5\tcat/a.png\n8\t3\t4\tdog/missing.png\n")
    im2rec.main(["--pack-label", "--center-crop", "--resize", "3", "--color", "0", "--encoding", ".png",
                 str(tmp_path / "multi"), str(FIX / "images")])
    rec = MXIndexedRecordIO(tmp_path / "multi.idx", tmp_path / "multi.rec", "r")
    assert rec.keys == [7]  # the missing image is reported and left out
    header, img = recordio.unpack_img(rec.read_idx(7))
    np.testing.assert_array_equal(header.label, [1.5, 2.5])
    assert img.shape == (3, 3)  # a.png is 6x4: cropped to 4x4, then resized to 3x3, gray


def test_im2rec_runs_as_a_module(tmp_path):
    shutil.copy(FIX / "im2rec" / "raw.lst", tmp_path / "raw.lst")
    out = subprocess.run([sys.executable, "-m", "dnnbind.tools.im2rec", "--pass-through", str(tmp_path / "raw"),
                          str(FIX / "images")], capture_output=True, text=True, check=True)
    assert "Creating .rec file from" in out.stdout
    assert (tmp_path / "raw.rec").read_bytes() == (FIX / "im2rec" / "raw.rec").read_bytes()


# -- data sets ----------------------------------------------------------------------------------------------------

def decoded(prefix: str, flag: int, n: int) -> list[np.ndarray]:
    dec = np.load(FIX / "decoded.npz")
    return [dec[f"{prefix}_{flag}_{i}"] for i in range(n)]


@pytest.mark.parametrize("flag", [0, 1])
def test_image_record_dataset(codec, flag):
    from dnnbind.gluon.data.vision import ImageRecordDataset
    ds = ImageRecordDataset(str(FIX / "im2rec" / "folder.rec"), flag=flag)
    assert len(ds) == 5
    labels = np.load(FIX / "decoded.npz")["record_labels"]
    for i, want in enumerate(decoded("record", flag, 5)):
        img, label = ds[i]
        assert label == labels[i] and isinstance(label, float)
        tol = 1 if flag == 0 and codec == "pil" else 0  # the stored images are PNG
        assert_close(img.asnumpy(), want, tol, f"item {i}")
    scaled = ImageRecordDataset(str(FIX / "im2rec" / "folder.rec"), flag, lambda x, y: (x.shape, y + 1))
    assert scaled[0] == (ds[0][0].shape, labels[0] + 1)
    multi = ImageRecordDataset(str(FIX / "img.rec"))
    np.testing.assert_array_equal(multi[1][1], [1.0, 2.5, -3.0])
    assert multi[2][0].shape == (4, 9, 3)  # a gray record read in color


@pytest.mark.parametrize("flag", [0, 1])
def test_image_folder_dataset(codec, flag):
    from dnnbind.gluon.data.vision import ImageFolderDataset
    info = json.loads((FIX / "datasets.json").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolderDataset(str(FIX / "images"), flag=flag)
    assert sorted(str(w.message).split(",")[0].split(" ")[1].rsplit("/", 1)[-1] for w in caught) == \
        ["notes.txt", "readme.txt"]
    assert ds.synsets == info["synsets"]
    assert [[os.path.relpath(f, FIX / "images"), label] for f, label in ds.items] == info["items"]
    labels = np.load(FIX / "decoded.npz")["folder_labels"]
    for i, want in enumerate(decoded("folder", flag, len(ds))):
        img, label = ds[i]
        jpeg = ds.items[i][0].endswith(("jpg", "jpeg"))
        tol = JPEG_TOL if jpeg else (1 if flag == 0 and codec == "pil" else 0)
        assert label == labels[i]
        assert_close(img.asnumpy(), want, tol, f"{ds.items[i][0]} flag {flag}")


def test_image_list_dataset(codec):
    from dnnbind.gluon.data.vision import ImageFolderDataset, ImageListDataset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = ImageFolderDataset(str(FIX / "images"))
    root = FIX / "images"
    lst = ImageListDataset(str(root), "../im2rec/folder.lst")
    lines = (FIX / "im2rec" / "folder.lst").read_text().splitlines()
    assert len(lst) == 5
    for i, line in enumerate(lines):
        _, label, path = line.split("\t")
        img, lab = lst[i]
        assert lab.dtype == np.float32 and lab.asnumpy().tolist() == [float(label)]
        want = folder[[p for p, _ in folder.items].index(str(root / path))][0]
        np.testing.assert_array_equal(img.asnumpy(), want.asnumpy())
    entries = ImageListDataset(str(root), [[1, "cat/a.png"], [[2, 3], "cat/b.jpg"], [4, 5, 6, "dog/e.png"]],
                               flag=0)
    assert [entries[i][1].asnumpy().tolist() for i in range(3)] == [[1.0], [2.0, 3.0], [4.0, 5.0, 6.0]]
    assert entries[2][0].shape == (4, 4, 1)
    with pytest.raises(ValueError, match="imglist must be"):
        ImageListDataset(str(root), None)


def test_record_file_dataset_in_a_dataloader(codec):
    from dnnbind.gluon.data import DataLoader, RecordFileDataset
    from dnnbind.gluon.data.vision import ImageRecordDataset
    raw = RecordFileDataset(str(FIX / "im2rec" / "raw.rec"))
    assert len(raw) == 5 and recordio.unpack(raw[0])[1] == (FIX / "images" / "cat" / "b.jpg").read_bytes()
    ds = ImageRecordDataset(str(FIX / "img.rec"), transform=lambda x, y: (x.asnumpy()[:4, :4, :].astype(np.float32),
                                                                          np.float32(x.shape[0])))
    for workers in (0, 2):  # workers get the open record file through pickling (they reopen it)
        batches = list(DataLoader(ds, batch_size=2, num_workers=workers))
        assert [tuple(b[0].shape) for b in batches] == [(2, 4, 4, 3), (2, 4, 4, 3)]
        assert [b[1].asnumpy().tolist() for b in batches] == [[5.0, 8.0], [4.0, 16.0]]


# -- the real MXNet reads what dnnbind writes --------------------------------------------------------------------

@pytest.mark.skipif(not ORACLE.exists(), reason="MXNet 1.9.1's interpreter is not on this machine")
def test_mxnet_reads_dnnbind_files(tmp_path, codec):
    src = np.load(FIX / "source.npz")
    with MXIndexedRecordIO(tmp_path / "d.idx", tmp_path / "d.rec", "w") as rec:
        rec.write_idx(4, recordio.pack_img(IRHeader(0, [1, 2], 9, 0), src["img0"], img_fmt=".png"))
        rec.write_idx(2, recordio.pack(IRHeader(0, 5, 1, 2), MAGIC + b"abc" + MAGIC))
    np.save(tmp_path / "img0.npy", src["img0"])
    check = f"""
import mxnet as mx, numpy as np
r = mx.recordio.MXIndexedRecordIO({str(tmp_path / 'd.idx')!r}, {str(tmp_path / 'd.rec')!r}, 'r')
assert r.keys == [4, 2], r.keys
h, img = mx.recordio.unpack_img(r.read_idx(4))
assert h.flag == 2 and list(h.label) == [1, 2] and h.id == 9, h
assert (img == np.load({str(tmp_path / 'img0.npy')!r})).all()
h, s = mx.recordio.unpack(r.read_idx(2))
assert h == mx.recordio.IRHeader(0, 5.0, 1, 2) and s == {MAGIC + b"abc" + MAGIC!r}, (h, s)
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # MXNet's own numpy, not ours
    out = subprocess.run([str(ORACLE), "-c", check], capture_output=True, text=True, env=env, check=False)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
