"""CPU tests of scripts/d2l_check.py's own logic (cell extraction, magic skipping, per-cell failure reporting) on
small notebooks written here; the d2l corpus itself is not needed (CI has no network and no d2l checkout)."""

import importlib.util
import json
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "d2l_check.py")
_spec = importlib.util.spec_from_file_location("d2l_check", _PATH)
d2l_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(d2l_check)

NOTEBOOK = """# Title

Some text.

```{.python .input}
%matplotlib inline
import math
x = 1
```

```python
not_a_cell = 1
```

```{.python .input  n=3}
y = x + 1
print('%d'
      % y)
```

```eval_rst
.. not python
```

```{.python .input  n=12}
%config InlineBackend.figure_format = 'svg'
```
"""


def test_extract_cells_finds_input_fences_only():
    cells = d2l_check.extract_cells(NOTEBOOK)
    assert [c["index"] for c in cells] == [1, 2, 3]
    assert cells[0]["source"] == "\nimport math\nx = 1"  # magic line blanked: line numbers kept
    assert cells[0]["magics"] == ["%matplotlib inline"]
    assert cells[0]["md_line"] == 5  # the opening fence, 1-based
    assert cells[1]["source"] == "y = x + 1\nprint('%d'\n      % y)" and cells[1]["magics"] == []
    assert cells[2]["source"] == "" and cells[2]["magics"] == ["%config InlineBackend.figure_format = 'svg'"]


def _fake_repo(tmp_path, text):
    chapter = tmp_path / "chapter_fake"
    chapter.mkdir()
    (chapter / "nb.md").write_text(text)
    (chapter / "index.md").write_text("# no code here\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "value.txt").write_text("41")
    return tmp_path


FAILING = """
```{.python .input}
%matplotlib inline
with open('../data/value.txt') as f:
    v = int(f.read())
```

```{.python .input}
w = v + 1
raise NotImplementedError(f'feature {w} missing')
```

```{.python .input}
never = 1
```
"""


def test_second_cell_failure_is_reported(tmp_path):
    repo = _fake_repo(tmp_path, FAILING)
    notebooks = d2l_check.find_notebooks(str(repo), ["chapter_fake"])
    assert [rel for rel, _ in notebooks] == ["chapter_fake/nb.md"]  # index.md has no code cell
    rel, cells = notebooks[0]
    home = tmp_path / "home"
    home.mkdir()
    r = d2l_check.run_notebook(str(repo), rel, cells, str(home), 120, "cpu", str(tmp_path))
    assert (r["status"], r["ran"], r["cells"], r["at_cell"]) == ("error", 1, 3, 2)
    assert r["error"]["type"] == "NotImplementedError"
    assert r["error"]["message"] == "feature 42 missing"  # cell 1 read ../data from the chapter folder
    assert r["error"]["cell_line"] == 2 and r["error"]["line"].startswith("raise NotImplementedError")
    assert r["magics_skipped"] == ["%matplotlib inline"]
    line = d2l_check.format_result(r)
    assert line.startswith("chapter_fake/nb.md: 1/3 cells, stopped at cell 2: NotImplementedError: feature 42")


def test_timeout_names_the_running_cell(tmp_path):
    repo = _fake_repo(tmp_path, "```{.python .input}\nx = 1\n```\n```{.python .input}\nimport time\n"
                                "time.sleep(60)\n```\n")
    rel, cells = d2l_check.find_notebooks(str(repo), ["chapter_fake"])[0]
    r = d2l_check.run_notebook(str(repo), rel, cells, str(tmp_path), 8, "cpu", str(tmp_path))
    assert (r["status"], r["ran"], r["at_cell"]) == ("timeout", 1, 2)
    assert "timed out at cell 2" in d2l_check.format_result(r)


def test_main_runs_mxnet_cells_and_writes_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    text = ("```{.python .input}\nfrom mxnet import nd\nx = nd.ones((2, 3))\nx.sum()\n```\n"
            "```{.python .input}\nimport os\nassert os.path.isfile(os.path.expanduser("
            "'~/.mxnet/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz'))\n```\n")
    repo = _fake_repo(tmp_path, text)
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    for name in d2l_check.IDX_FILES:
        (mnist / name).write_bytes(b"fake")
    out = tmp_path / "out.json"
    rc = d2l_check.main(["--repo", str(repo), "--chapters", "chapter_fake", "--mnist-dir", str(mnist),
                         "--json", str(out), "--timeout", "120"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "chapter_fake/nb.md: 2/2 cells, all ran" in printed
    assert "linked the MNIST digit IDX files" in printed
    data = json.loads(out.read_text())
    assert data["summary"]["ok"] == 1 and data["results"][0]["ran"] == 2


def test_limit_images_writes_truncated_idx_files_the_dataset_reads(tmp_path):
    """--limit-images: each IDX file keeps its header (first size cut to N) and the first N items, and dnnbind's
    FashionMNIST reads the cut files from the prepared HOME."""
    import gzip
    import struct

    import numpy as np

    from dnnbind.gluon.data.vision import FashionMNIST
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    images = {"train": rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
              "t10k": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)}
    labels = {k: rng.integers(0, 10, len(v), dtype=np.uint8) for k, v in images.items()}
    for k in images:
        with gzip.open(src / f"{k}-images-idx3-ubyte.gz", "wb") as f:
            f.write(b"\0\0\x08\x03" + struct.pack(">3I", *images[k].shape) + images[k].tobytes())
        with gzip.open(src / f"{k}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(b"\0\0\x08\x01" + struct.pack(">I", len(labels[k])) + labels[k].tobytes())
    home = tmp_path / "home"
    note = d2l_check.prepare_home(str(home), str(src), limit=3)
    assert "first 3 images" in note
    root = home / ".mxnet" / "datasets" / "fashion-mnist"
    for k, train in (("train", True), ("t10k", False)):
        ds = FashionMNIST(root=str(root), train=train)
        assert len(ds) == 3
        x, y = ds[2]
        np.testing.assert_array_equal(np.asarray(x.asnumpy()).reshape(28, 28), images[k][2])
        assert int(y) == int(labels[k][2])
    with pytest.raises(ValueError, match="not an unsigned-byte IDX file"):
        bad = tmp_path / "bad.gz"
        with gzip.open(bad, "wb") as f:
            f.write(b"\0\0\x0d\x01\0\0\0\x01abcd")
        d2l_check.truncate_idx(str(bad), str(tmp_path / "out.gz"), 1)


def test_cell_ending_in_semicolon_displays_nothing(tmp_path, capsys):
    """Jupyter shows a cell's last expression unless the cell ends with ';' (comments aside)."""
    ns = {}
    d2l_check._run_cell("x = 41\nx + 1", 1, ns)
    d2l_check._run_cell("x + 2;  # quiet", 2, ns)
    d2l_check._run_cell("s = 'a;'\ns", 3, ns)
    assert capsys.readouterr().out.split() == ["42", "'a;'"]


def test_fake_cifar10_files_read_as_cifar10(tmp_path):
    """--fake-cifar10: six files of N records (label byte + 3072 pixel bytes) in ~/.mxnet/datasets/cifar10, which
    dnnbind's CIFAR10 reads from that default root; the note says real MXNet refuses them."""
    import numpy as np

    from dnnbind.gluon.data.vision import CIFAR10
    home = tmp_path / "home"
    note = d2l_check.prepare_cifar10(str(home), None, 3)
    assert "3 random records" in note and "sha1" in note
    root = home / ".mxnet" / "datasets" / "cifar10"
    assert sorted(os.listdir(root)) == sorted(d2l_check.CIFAR10_FILES)
    raw = np.fromfile(root / "test_batch.bin", dtype=np.uint8).reshape(-1, 3073)
    assert raw.shape[0] == 3 and (raw[:, 0] < 10).all()
    test = CIFAR10(root=str(root), train=False)
    assert len(test) == 3 and len(CIFAR10(root=str(root), train=True)) == 15
    x, y = test[1]
    np.testing.assert_array_equal(x.asnumpy(), raw[1, 1:].reshape(3, 32, 32).transpose(1, 2, 0))
    assert int(y) == raw[1, 0]
    assert d2l_check.prepare_cifar10(str(tmp_path / "h2"), str(tmp_path / "nothing"), None) is None


def test_cifar10_dir_is_linked(tmp_path):
    src = tmp_path / "cifar"
    d2l_check.write_fake_cifar10(str(src), 2)
    (src / "test_batch.bin").unlink()
    note = d2l_check.prepare_cifar10(str(tmp_path / "home"), str(src), None)
    assert "linked" in note and "missing: test_batch.bin" in note
    assert os.path.islink(tmp_path / "home" / ".mxnet" / "datasets" / "cifar10" / "data_batch_5.bin")


def test_backend_mxnet_runs_the_interpreters_own_mxnet(tmp_path, capsys):
    """--backend mxnet: dnnbind's alias is not installed, so `import mxnet` is whatever --python has (here a
    stand-in package on PYTHONPATH)."""
    fake = tmp_path / "site" / "mxnet"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.0.fake'\n")
    repo = _fake_repo(tmp_path, "```{.python .input}\nimport mxnet, sys\nprint('got', mxnet.__version__, "
                                "'dnnbind' in sys.modules)\n```\n")
    logs = tmp_path / "logs"
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path / "site")
    try:
        rc = d2l_check.main(["--repo", str(repo), "--chapters", "chapter_fake", "--backend", "mxnet",
                             "--log-dir", str(logs), "--mnist-dir", str(tmp_path / "no_mnist"), "--timeout", "60"])
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert rc == 0, capsys.readouterr().out
    log = (logs / "chapter_fake__nb.log").read_text()
    assert "got 0.0.fake False" in log and "real MXNet 0.0.fake" in log


def test_comparable_output_drops_addresses_notes_and_timings():
    log = ("[d2l_check] real MXNet 1.9.1 from /x\n[d2l_check] ---- cell 2 (markdown line 17) ----\n"
           "<matplotlib.image.AxesImage object at 0x7fbbeecdeb20>\n(561, 728)\n\n"
           "array([[<Axes: >, <Axes: >]], dtype=object)\nepoch 1, loss 2.0, time 22.12 sec, lr 0.1\n")
    assert d2l_check.comparable_output(log) == ["[d2l_check] ---- cell 2 (markdown line 17) ----", "(561, 728)"]
