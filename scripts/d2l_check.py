"""Run the code cells of Dive into Deep Learning (d2l-zh v1.0.0) notebooks on dnnbind and report what fails.

Layer: script (outside the package); imports the standard library only in the parent process. The worker
mode (`--worker`, started by this script in a fresh subprocess per notebook) imports dnnbind, installs the
`mxnet` alias and runs the cells.

    python scripts/d2l_check.py --repo /path/to/d2l-zh [--chapters chapter_deep-learning-basics ...]
        [--timeout 300] [--device cpu|gpu] [--mnist-dir .data/mnist] [--json out.json] [--only lenet]
        [--fake-cifar10 N | --cifar10-dir .data/cifar10] [--backend mxnet --python /path/to/mxnet/python]

Each notebook's ```{.python .input ...}``` cells run unchanged and in order in one namespace (as a Jupyter kernel
would run them: a cell's last expression is displayed with repr), with the chapter folder as the working directory
(so `../data/...` resolves) and the checkout's root on PYTHONPATH (its `d2lzh/` is what `pip install
d2lzh==1.0.0` installs). Only IPython magics (`%matplotlib inline`) are skipped, and matplotlib draws with Agg.
The subprocess gets a temporary HOME whose ~/.mxnet/datasets/fashion-mnist holds links to the IDX files of
--mnist-dir: Fashion-MNIST cannot be downloaded offline, so the notebooks train on MNIST digits instead (same
file names and shapes; their printed accuracies are not the book's). Likewise ~/.mxnet/datasets/cifar10 gets the
CIFAR-10 binary files of --cifar10-dir, or --fake-cifar10 N random records per file (chapter 9's image-augmentation;
the real MXNet refuses those: it checks each file's sha1 and then tries to download the archive).

--backend mxnet runs the same cells on the real MXNet of --python (the oracle), to compare what both print
(`comparable_output`).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT_ROOT = os.path.dirname(HERE)
CHAPTERS = ["chapter_deep-learning-basics", "chapter_deep-learning-computation",
            "chapter_convolutional-neural-networks"]
TIMEOUT_S = 300
MNIST_DIR = os.path.join(PROJECT_ROOT, ".data", "mnist")
# The file names gluon.data.vision.FashionMNIST (MXNet 1.x) and d2lzh.load_data_fashion_mnist look for under
# root=~/.mxnet/datasets/fashion-mnist: the same four as MNIST's.
IDX_FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
MSG_CHARS = 240
CIFAR10_DIR = os.path.join(PROJECT_ROOT, ".data", "cifar10")

# Opening fence of a code cell: ```{.python .input}, ```{.python .input  n=3}; the closing fence is a bare ```.
_FENCE_OPEN = re.compile(r"^```\s*\{\s*\.python\s+\.input\b[^}]*\}\s*$")
_FENCE_CLOSE = re.compile(r"^```\s*$")
# An IPython magic or shell escape starts at column 0 with a name: `%matplotlib inline`, `%%time`, `!ls`. An
# indented `% (a, b)` is the continuation of a string formatting expression, not a magic.
_MAGIC = re.compile(r"^(%%?[A-Za-z_]|![A-Za-z_./])")


# ---- cell extraction (parent and worker) ----------------------------------------------------------------------

def extract_cells(markdown: str) -> list[dict]:
    """The notebook's code cells in order: {"index": 1-based, "md_line": fence line, "source", "magics"}.

    Magic lines (`%...`, `!...`) are replaced by empty lines (so line numbers stay those of the cell) and listed
    in "magics"; a cell left with no code has "source" == "" and is skipped when run.
    """
    cells, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        if not _FENCE_OPEN.match(lines[i]):
            i += 1
            continue
        start, body, i = i + 1, [], i + 1
        while i < len(lines) and not _FENCE_CLOSE.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # past the closing fence
        magics = [ln.strip() for ln in body if _MAGIC.match(ln)]
        code = [("" if _MAGIC.match(ln) else ln) for ln in body]
        source = "\n".join(code) if any(ln.strip() for ln in code) else ""
        cells.append({"index": len(cells) + 1, "md_line": start, "source": source, "magics": magics})
    return cells


# ---- worker: runs one notebook's cells in this process ---------------------------------------------------------

def _display(value: object) -> None:
    if value is not None:
        print(repr(value))


def _ends_with_semicolon(source: str) -> bool:
    """Whether the cell's last token (comments aside) is ';', which makes IPython display nothing."""
    import io
    import tokenize
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT}
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return False
    return bool(tokens) and tokens[-1].string == ";"


def _run_cell(source: str, index: int, namespace: dict) -> None:
    """exec the cell; a last expression statement is evaluated and its repr printed, as Jupyter does (unless the
    cell ends with ';')."""
    name = f"<cell {index}>"
    tree = ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
        if not _ends_with_semicolon(source):
            _display(value)


def _error_record(exc: BaseException, index: int, source: str) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    name = f"<cell {index}>"
    cell_frames = [f for f in frames if f.filename == name]
    lineno = cell_frames[-1].lineno if cell_frames else getattr(exc, "lineno", None)
    src_lines = source.splitlines()
    line = src_lines[lineno - 1].strip() if lineno and 0 < lineno <= len(src_lines) else ""
    inner = frames[-1] if frames else None
    where = f"{os.path.basename(inner.filename)}:{inner.lineno} in {inner.name}" if inner else ""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return {"type": type(exc).__name__, "message": msg, "cell_line": lineno, "line": line, "where": where}


def _shim_ipython_display() -> str | None:
    """IPython >= 8.x dropped IPython.display.set_matplotlib_formats, which d2lzh.use_svg_display calls; with
    the Agg backend figure formats mean nothing, so a no-op stands in. Returns a note when it did so."""
    try:
        from IPython import display
    except ImportError:
        return None
    if hasattr(display, "set_matplotlib_formats"):
        return None
    display.set_matplotlib_formats = lambda *formats, **kwargs: None
    return "IPython.display.set_matplotlib_formats is missing in this IPython: replaced by a no-op (Agg backend)"


def _emit(status_path: str, record: dict) -> None:
    # One JSON line per event, flushed at once: if the notebook hangs or crashes, the parent still knows which
    # cell was running.
    with open(status_path, "a") as f:
        f.write(json.dumps(record) + "\n")


def worker(cells_path: str, status_path: str) -> int:
    with open(cells_path) as f:
        cells = json.load(f)
    import matplotlib
    matplotlib.use("Agg")
    import warnings
    warnings.filterwarnings("ignore", message=".*non-interactive.*")  # plt.show() under Agg
    note = _shim_ipython_display()
    if note:
        print(f"[d2l_check] {note}", flush=True)
    if os.environ.get("D2L_CHECK_BACKEND", "dnnbind") == "dnnbind":
        import dnnbind
        dnnbind.install_mxnet_alias()
    else:  # --backend mxnet: the real MXNet of this interpreter, as the oracle
        import mxnet
        print(f"[d2l_check] real MXNet {mxnet.__version__} from {os.path.dirname(mxnet.__file__)}", flush=True)
    import matplotlib.pyplot as plt
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for cell in cells:
        if not cell["source"]:
            continue
        _emit(status_path, {"cell": cell["index"], "event": "start"})
        print(f"[d2l_check] ---- cell {cell['index']} (markdown line {cell['md_line']}) ----", flush=True)
        t0 = time.perf_counter()
        try:
            _run_cell(cell["source"], cell["index"], namespace)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt in a cell are failures of that cell too
            traceback.print_exc()
            record = _error_record(exc, cell["index"], cell["source"])
            _emit(status_path, {"cell": cell["index"], "event": "error", "secs": time.perf_counter() - t0, **record})
            return 1
        finally:
            sys.stdout.flush()
            plt.close("all")
        _emit(status_path, {"cell": cell["index"], "event": "ok", "secs": time.perf_counter() - t0})
    return 0


# ---- parent: one subprocess per notebook ----------------------------------------------------------------------

def find_notebooks(repo: str, chapters: list[str], only: list[str] | None = None) -> list[tuple[str, list[dict]]]:
    """(chapter/notebook.md, cells) for every notebook with at least one code cell, in name order."""
    out = []
    for chapter in chapters:
        folder = os.path.join(repo, chapter)
        if not os.path.isdir(folder):
            raise SystemExit(f"d2l_check: no folder {folder!r}: is --repo a d2l-zh checkout?")
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".md") or (only and not any(o in name for o in only)):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                cells = extract_cells(f.read())
            if cells:
                out.append((f"{chapter}/{name}", cells))
    return out


def prepare_home(home: str, mnist_dir: str, limit: int | None = None) -> str:
    """Link the IDX files of mnist_dir into home/.mxnet/datasets/fashion-mnist (or, with ``limit``, write copies
    holding only the first ``limit`` images and labels of each); returns a note to print."""
    target = os.path.join(home, ".mxnet", "datasets", "fashion-mnist")
    os.makedirs(target, exist_ok=True)
    found = [n for n in IDX_FILES if os.path.isfile(os.path.join(mnist_dir, n))]
    for n in found:
        if limit is None:
            os.symlink(os.path.abspath(os.path.join(mnist_dir, n)), os.path.join(target, n))
        else:
            truncate_idx(os.path.join(mnist_dir, n), os.path.join(target, n), limit)
    if len(found) < len(IDX_FILES):
        missing = sorted(set(IDX_FILES) - set(found))
        return (f"WARNING: {mnist_dir} lacks {', '.join(missing)}: notebooks loading Fashion-MNIST will fail "
                "(offline, nothing can be downloaded)")
    what = "linked the MNIST digit IDX files" if limit is None else \
        f"wrote the first {limit} images and labels of each MNIST digit IDX file"
    return (f"Fashion-MNIST is not reachable offline: {what} of {mnist_dir} into {target} (a temporary HOME); "
            "accuracies are MNIST's, not the book's")


CIFAR10_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


def write_fake_cifar10(folder: str, records: int, seed: int = 0) -> None:
    """The six CIFAR-10 binary files gluon.data.vision.CIFAR10 reads (data_batch_1..5.bin, test_batch.bin), each
    ``records`` records of one label byte (0..9) then 3072 pixel bytes (1024 red, 1024 green, 1024 blue, each plane
    row-major 32 x 32), random. The real files hold 10,000 records each."""
    import numpy as np
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for name in CIFAR10_FILES:
        rows = rng.integers(0, 256, (records, 1 + 3072), dtype=np.uint8)
        rows[:, 0] = rng.integers(0, 10, records, dtype=np.uint8)
        rows.tofile(os.path.join(folder, name))


def prepare_cifar10(home: str, cifar10_dir: str | None, fake_records: int | None) -> str | None:
    """Put CIFAR-10's binary files where gluon.data.vision.CIFAR10 looks (home/.mxnet/datasets/cifar10): links to
    those of cifar10_dir, or ``fake_records`` random records per file. Returns a note to print, None if neither.

    NOTE: MXNet 1.9.1 checks each file's sha1 against the real CIFAR-10's and, on a mismatch, downloads
    cifar-10-binary.tar.gz (offline: fails). Only the real files pass it; dnnbind reads any well-formed files."""
    target = os.path.join(home, ".mxnet", "datasets", "cifar10")
    if fake_records:
        write_fake_cifar10(target, fake_records)
        return (f"CIFAR-10 is not reachable offline: wrote {fake_records} random records per file into {target} "
                "(real MXNet rejects them: their sha1 is not CIFAR-10's; accuracies mean nothing)")
    if not cifar10_dir:
        return None
    found = [n for n in CIFAR10_FILES if os.path.isfile(os.path.join(cifar10_dir, n))]
    if not found:
        return None
    os.makedirs(target, exist_ok=True)
    for n in found:
        os.symlink(os.path.abspath(os.path.join(cifar10_dir, n)), os.path.join(target, n))
    missing = sorted(set(CIFAR10_FILES) - set(found))
    return f"linked the CIFAR-10 binary files of {cifar10_dir} into {target}" + \
        (f" (missing: {', '.join(missing)})" if missing else "")


def truncate_idx(src: str, dst: str, limit: int) -> None:
    """A gzipped IDX file (magic: 0, 0, dtype code, rank; then rank big-endian uint32 sizes; then the data in C
    order) cut to its first ``limit`` items along the first axis."""
    import gzip
    import struct
    with gzip.open(src, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{src}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    rank = raw[3]
    dims = list(struct.unpack(f">{rank}I", raw[4:4 + 4 * rank]))
    n = min(limit, dims[0])
    item = 1
    for d in dims[1:]:
        item *= d
    header = raw[:4] + struct.pack(f">{rank}I", n, *dims[1:])
    body = raw[4 + 4 * rank: 4 + 4 * rank + n * item]
    with gzip.open(dst, "wb") as f:
        f.write(header + body)


def _env(repo: str, home: str, device: str, backend: str = "dnnbind") -> dict:
    env = dict(os.environ)
    env["D2L_CHECK_BACKEND"] = backend
    # NOTE: the real ~/.cache stays the cache (compiled NVRTC kernels, conv algorithms) though HOME is temporary.
    env.setdefault("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    env["HOME"] = home
    env["MPLBACKEND"] = "Agg"
    env["DNNBIND_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    paths = [os.path.abspath(repo), PROJECT_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible: mx.gpu() raises MXNetError, d2l.try_gpu() -> cpu
    return env


def run_notebook(repo: str, rel: str, cells: list[dict], home: str, timeout: float, device: str,
                 log_dir: str, backend: str = "dnnbind", python: str | None = None) -> dict:
    chapter_dir = os.path.join(repo, os.path.dirname(rel))
    work = tempfile.mkdtemp(prefix="d2l_nb_")
    cells_path, status_path = os.path.join(work, "cells.json"), os.path.join(work, "status.jsonl")
    with open(cells_path, "w") as f:
        json.dump(cells, f)
    log_path = os.path.join(log_dir, rel.replace("/", "__").replace(".md", ".log"))
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python or sys.executable, os.path.abspath(__file__), "--worker", cells_path,
                                 status_path],
                                cwd=chapter_dir, env=_env(repo, home, device, backend), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: DataLoader workers included
            rc, timed_out = proc.wait(), True
        except BaseException:  # Ctrl-C: the notebook runs in its own session, so it would outlive us
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    wall = time.perf_counter() - t0
    events = []
    if os.path.exists(status_path):
        with open(status_path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(work, ignore_errors=True)
    code_cells = [c for c in cells if c["source"]]
    result = {"notebook": rel, "cells": len(code_cells), "ran": sum(e["event"] == "ok" for e in events),
              "magics_skipped": [m for c in cells for m in c["magics"]], "wall_s": round(wall, 1),
              "status": "ok", "log": log_path}
    errors = [e for e in events if e["event"] == "error"]
    started = [e["cell"] for e in events if e["event"] == "start"]
    if errors:
        result.update(status="error", at_cell=errors[-1]["cell"],
                      error={k: errors[-1][k] for k in ("type", "message", "cell_line", "line", "where")})
    elif timed_out:
        result.update(status="timeout", at_cell=started[-1] if started else None)
    elif rc != 0 or result["ran"] < len(code_cells):
        result.update(status="crash", at_cell=started[-1] if started else None, returncode=rc)
    return result


def format_result(r: dict) -> str:
    head = f"{r['notebook']}: {r['ran']}/{r['cells']} cells"
    if r["status"] == "error":
        e = r["error"]
        msg = e["message"] if len(e["message"]) <= MSG_CHARS else e["message"][:MSG_CHARS] + "..."
        tail = f", stopped at cell {r['at_cell']}: {e['type']}: {msg}"
        if e["line"]:
            tail += f"  [cell line {e['cell_line']}: {e['line']}]"
        if e["where"]:
            tail += f"  [raised at {e['where']}]"
    elif r["status"] == "timeout":
        tail = f", timed out at cell {r['at_cell']}"
    elif r["status"] == "crash":
        tail = f", died at cell {r['at_cell']} (exit code {r.get('returncode')})"
    else:
        tail = ", all ran"
    return f"{head}{tail} ({r['wall_s']:.1f}s)"


# Lines of a notebook's log that differ between runs or installs whatever the framework computes: the worker's
# notes, object addresses, matplotlib reprs (they changed between matplotlib 3.7 and 3.8), timings.
_UNCOMPARABLE = re.compile(r"^\[d2l_check\] (?!---- cell)|object at 0x|<Axes|AxesSubplot|time [0-9.]+ sec")


def comparable_output(log_text: str) -> list[str]:
    """What a notebook printed that two frameworks running the same cells should print alike (cell markers kept,
    so a difference names its cell); training logs still differ by their random draws."""
    return [ln.rstrip() for ln in log_text.splitlines() if ln.strip() and not _UNCOMPARABLE.search(ln)]


def _git_commit(path: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", path, "describe", "--always", "--tags", "--dirty"], capture_output=True,
                             check=False, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", help="d2l-zh checkout or extracted tree (tag v1.0.0)")
    p.add_argument("--chapters", nargs="+", default=CHAPTERS)
    p.add_argument("--only", nargs="+", help="run only notebooks whose file name contains one of these")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per notebook")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--mnist-dir", default=MNIST_DIR)
    p.add_argument("--limit-images", type=int, default=None, metavar="N",
                   help="give the notebooks only the first N training and N test images (the cells run unchanged "
                        "on less data: chapter 5 on a CPU in minutes, not hours)")
    p.add_argument("--cifar10-dir", default=CIFAR10_DIR,
                   help="folder with CIFAR-10's binary files (data_batch_1.bin ... test_batch.bin) to link into "
                        "~/.mxnet/datasets/cifar10")
    p.add_argument("--fake-cifar10", type=int, default=None, metavar="N",
                   help="instead, write N random records per CIFAR-10 file there (image-augmentation then trains "
                        "on noise in minutes)")
    p.add_argument("--backend", choices=["dnnbind", "mxnet"], default="dnnbind",
                   help="mxnet: run the cells on the real MXNet of --python (the oracle), without dnnbind's alias")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the notebooks")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--log-dir", help="keep each notebook's output here (default: a temporary folder)")
    p.add_argument("--worker", nargs=2, metavar=("CELLS_JSON", "STATUS_JSONL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    if not args.repo:
        p.error("--repo is required")
    repo = os.path.abspath(args.repo)
    if not os.path.isfile(os.path.join(repo, "d2lzh", "utils.py")):
        print(f"WARNING: {repo}/d2lzh/utils.py not found: `import d2lzh` will fail")
    if args.python == sys.executable and importlib.util.find_spec("IPython") is None:
        print("WARNING: IPython is not installed: d2lzh's `from IPython import display` will fail, and so will "
              "every notebook importing d2lzh. Install it: `pip install ipython` (or `pip install -e .[d2l]`).")
    notebooks = find_notebooks(repo, args.chapters, args.only)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="d2l_logs_")
    os.makedirs(log_dir, exist_ok=True)
    n_magic = sum(len(c["magics"]) for _, cells in notebooks for c in cells)
    print(f"{len(notebooks)} notebooks, {sum(len(c) for _, c in notebooks)} code cells; {n_magic} IPython magic "
          f"lines skipped (not Python: %matplotlib inline etc.); matplotlib backend Agg; device {args.device}; "
          f"timeout {args.timeout:.0f}s per notebook; logs in {log_dir}")
    home = tempfile.mkdtemp(prefix="d2l_home_")
    results = []
    try:
        print(prepare_home(home, args.mnist_dir, args.limit_images))
        note = prepare_cifar10(home, args.cifar10_dir, args.fake_cifar10)
        if note:
            print(note)
        for rel, cells in notebooks:
            r = run_notebook(repo, rel, cells, home, args.timeout, args.device, log_dir, args.backend, args.python)
            results.append(r)
            print(format_result(r), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "error", "timeout", "crash")}
    ran, total = sum(r["ran"] for r in results), sum(r["cells"] for r in results)
    print(f"summary: {counts['ok']}/{len(results)} notebooks ran every cell; {counts['error']} stopped on an "
          f"error, {counts['timeout']} timed out, {counts['crash']} died; {ran}/{total} cells ran")
    if args.json:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": args.device,
                "timeout_s": args.timeout, "python": platform.python_version(), "machine": platform.processor()
                or platform.machine(), "cpus": os.cpu_count(), "dnnbind_commit": _git_commit(PROJECT_ROOT),
                "d2l_commit": _git_commit(repo), "repo": repo, "limit_images": args.limit_images,
                "backend": args.backend, "fake_cifar10": args.fake_cifar10}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "summary": {**counts, "cells_ran": ran, "cells": total}, "results": results},
                      f, indent=1)
    return 0 if counts["ok"] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
