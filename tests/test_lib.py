"""CPU tests of the binding layer: loading, versions, descriptors through cuDNN's host-side functions,
error mapping and pickling, import hygiene, and the one-way layering of the package."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind._lib import cublas, cudnn, errors, loader
from dnnbind.ops import _check
from dnnbind.ops import descriptors as D

ROOT = Path(__file__).resolve().parents[1]


def test_libraries_load_and_report_versions():
    v = cudnn.version()
    major, minor, patch = cudnn.version_tuple(v)
    assert major == 9 and v == major * 10000 + minor * 100 + patch
    assert cublas.version() >= 120000
    assert loader.path("cudnn").endswith(".so.9") or "cudnn" in loader.path("cudnn")
    assert "cublas" in loader.path("cublas")


def test_version_parsing():
    assert cudnn.version_tuple(91900) == (9, 19, 0)
    assert cudnn.version_tuple(92801) == (9, 28, 1)
    assert cudnn.version_tuple(8907) == (8, 9, 7)


def test_functions_are_declared_once_with_prototypes():
    fn = cudnn.lib.cudnnConvolutionForward
    assert fn.argtypes is not None and len(fn.argtypes) == 13 and fn.errcheck is not None
    assert cudnn.lib.cudnnConvolutionForward is fn  # cached: later lookups skip binding
    assert len(cublas.lib.cublasSgemm_v2.argtypes) == 14
    with pytest.raises(AttributeError, match="not declared"):
        cublas.lib.cublasSgemm  # the legacy handle-less name is never bound


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups", [
    ((64, 1, 28, 28), (32, 1, 3, 3), 1, 1, 1, 1), ((1, 3, 9, 7), (5, 3, 3, 3), 2, 0, 1, 1),
    ((3, 4, 11, 10), (6, 4, 3, 2), (2, 1), (1, 2), 1, 1), ((2, 3, 12, 12), (4, 3, 3, 3), 1, 2, 2, 1),
    ((5, 6, 8, 8), (6, 2, 3, 3), 1, 1, 1, 3), ((2, 2, 5, 5), (3, 2, 5, 5), 3, 2, 1, 1)])
def test_cudnn_output_shape_matches_ours(xs, ws, stride, padding, dilation, groups):
    s, p, dl, g, y_shape = _check.conv_params("t", xs, ws, None, stride, padding, dilation, groups)
    assert D.conv_output_dim(xs, ws, p, s, dl, g, np.dtype(np.float32)) == y_shape
    assert dnnbind.conv_forward(np.ones(xs, np.float32), np.ones(ws, np.float32), None, stride, padding,
                                dilation, groups).shape == y_shape


def test_bad_descriptor_raises_2000_family_with_cudnn_text():
    with pytest.raises(errors.CudnnBadParam) as info:
        D.TensorDesc((0, 3, 4, 4), np.dtype(np.float32))
    e = info.value
    assert e.status == 2000 and e.function == "cudnnSetTensor4dDescriptor"
    assert "CUDNN_STATUS_BAD_PARAM" in str(e) and "(n <= 0)" in str(e)


def test_error_classes_by_family_and_pickling():
    assert errors.cudnn_error_class(1001) is errors.CudnnNotInitialized
    assert errors.cudnn_error_class(2003) is errors.CudnnBadParam
    assert errors.cudnn_error_class(3007) is errors.CudnnNotSupported
    assert errors.cudnn_error_class(4003) is errors.CudnnInternalError
    assert errors.cudnn_error_class(5002) is errors.CudnnExecutionFailed
    for e in (errors.CudnnBadParam(2000, "cudnnX", "msg", "ctx"), errors.CublasError(7, "cublasSgemm_v2", "bad"),
              errors.CudaError(2, "cudaMallocAsync", "oom"), errors.LibraryNotFoundError("cudnn", "hint", "t")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
    e = errors.CudnnBadParam(2000, "cudnnConvolutionForward", "bad").add_info("x=(1, 2)")
    assert "x=(1, 2)" in str(e)


@pytest.mark.skipif(dnnbind.num_gpus() > 0, reason="checks the no-GPU behaviour")
def test_without_gpu_create_fails_clearly_and_cpu_is_default():
    import ctypes
    with pytest.raises(errors.CudnnNotInitialized, match="cudnnCreate.*1001"):
        cudnn.lib.cudnnCreate(ctypes.byref(ctypes.c_void_p()))
    with pytest.raises(errors.CublasError, match="cublasCreate_v2"):
        cublas.lib.cublasCreate_v2(ctypes.byref(ctypes.c_void_p()))
    assert dnnbind.default_device() == dnnbind.cpu()
    with pytest.raises(dnnbind.DnnbindError, match="no GPU is usable"):
        dnnbind.array([1.0, 2.0], device="gpu")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_import_touches_no_gpu_and_loads_no_library():
    r = _run("import dnnbind, sys\n"
             "maps = open('/proc/self/maps').read()\n"
             "print('cudnn' in maps, 'cublas' in maps, 'cuda.bindings.runtime' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "False"]


def test_missing_library_says_what_to_install(tmp_path):
    r = _run("import dnnbind\ntry:\n    dnnbind._lib.cudnn.version()\nexcept dnnbind.LibraryNotFoundError as e:\n"
             "    print('ERR', e)\n", DNNBIND_CUDNN_PATH=str(tmp_path / "libcudnn.so.9"))
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "pip install nvidia-cudnn-cu12" in r.stdout and "DNNBIND_CUDNN_PATH" in r.stdout


def test_show_config_prints_versions_and_gpus(capsys):
    info = dnnbind.show_config()
    out = capsys.readouterr().out
    assert "cudnn" in out and "cublas" in out and "CUDA" in out
    assert isinstance(info["gpus"], dict)


# The layers, top to bottom; a module may import only from its own layer or those above it.
LAYERS = [("dnnbind._lib", "dnnbind.features"), ("dnnbind.runtime", "dnnbind.serialization"), ("dnnbind.kernels",), ("dnnbind.ops",),
          ("dnnbind.autograd", "dnnbind.trace", "dnnbind.custom_op"), ("dnnbind.nd", "dnnbind.initializer"),
          ("dnnbind.symbol",),
          ("dnnbind.gluon",),
          ("dnnbind.config_report", "dnnbind.graph", "dnnbind.hybrid", "dnnbind.recording", "dnnbind")]


def _layer_of(module: str) -> int:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return best[0] if best else len(LAYERS)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts[: len(parts) - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def test_layers_import_one_way():
    bad = []
    for path in (ROOT / "dnnbind").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        mine = _layer_of(module)
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: lazy imports inside functions are deliberate
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module + ".__init__" if rel.name == "__init__" else module, node)
                targets = [f"{base}.{a.name}" for a in node.names] if node.module is None else [base]
            for t in targets:
                if t.startswith("dnnbind") and _layer_of(t) > mine and module != "dnnbind":
                    bad.append(f"{module} imports {t}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def _module_of(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT).with_suffix("")
    is_package = rel.name == "__init__"
    return ".".join(rel.parts[:-1] if is_package else rel.parts), is_package


def _is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or p.is_dir()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches(source: str, module: str, is_package: bool) -> list[str]:
    """Where ``source`` (the text of dnnbind module ``module``) takes another dnnbind module's private name:
    ``from M import _name`` (``_name`` not a submodule), or ``alias._name`` with ``alias`` bound to a dnnbind module
    by an import anywhere in the file. A name shared between modules belongs to its module's interface: it gets a
    public name there (inside a private module such as ``_strided_base`` that is still private to the package)."""
    tree = ast.parse(source)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").startswith("dnnbind"):
                    continue
                base = node.module
            else:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                if _is_module(f"{base}.{a.name}"):
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif _private(a.name) and base != module:
                    found.append(f"{module}:{node.lineno} imports {base}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dnnbind") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
            target = aliases.get(node.value.id)
            if target is not None and target != module:
                found.append(f"{module}:{node.lineno} reads {target}.{node.attr}")
    return found


def test_no_module_takes_another_modules_private_names():
    bad = []
    for path in (ROOT / "dnnbind").rglob("*.py"):
        bad += private_reaches(path.read_text(), *_module_of(path))
    assert not bad, "private names taken across modules:\n" + "\n".join(sorted(bad))


def test_private_reaches_finds_both_spellings():
    """The scan above can fail: an import of a private name, and a read through a module alias, are both found;
    a private submodule, a module's own names and public names are not."""
    source = ("from . import _kernels, conv as C\nfrom .conv import _exact, forward_on\nfrom ..runtime import memory\n"
              "x = C._launch\ny = memory._free\nz = _kernels.kernel\n")
    found = private_reaches(source, "dnnbind.ops.bias_relu", False)
    assert found == ["dnnbind.ops.bias_relu:2 imports dnnbind.ops.conv._exact",
                     "dnnbind.ops.bias_relu:4 reads dnnbind.ops.conv._launch",
                     "dnnbind.ops.bias_relu:5 reads dnnbind.runtime.memory._free"], found
    assert private_reaches("from ._common import workspace\n", "dnnbind.ops.conv", False) == []
