"""Layer 0 (_lib): finding and opening the shared libraries. Imports nothing of dnnbind but errors.

cuda.pathfinder knows where pip wheels (CUDA 12 and 13) and system installs put each library and loads
a library's dependencies first (libcublasLt before libcublas, cuDNN's sub-libraries lazily), so we never
hard-code a soname. ``DNNBIND_<NAME>_PATH`` overrides it with an explicit file, for unusual installs.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .errors import LibraryNotFoundError

# What to tell a user whose library is missing: the pip package that ships it.
INSTALL_HINTS = {
    "cudnn": "Install cuDNN 9: `pip install nvidia-cudnn-cu12` (CUDA 12) or `pip install nvidia-cudnn-cu13`"
             " (CUDA 13), or set DNNBIND_CUDNN_PATH to libcudnn.so.9.",
    "cublas": "Install cuBLAS: `pip install nvidia-cublas-cu12` (CUDA 12) or `pip install nvidia-cublas`"
              " (CUDA 13), or set DNNBIND_CUBLAS_PATH to libcublas.so.",
    "nvrtc": "Install NVRTC: `pip install nvidia-cuda-nvrtc-cu12` (CUDA 12) or `pip install nvidia-cuda-nvrtc`"
             " (CUDA 13), or set DNNBIND_NVRTC_PATH.",
    "nccl": "Install NCCL: `pip install nvidia-nccl-cu12` (CUDA 12) or `pip install nvidia-nccl-cu13` (CUDA 13),"
            " or set DNNBIND_NCCL_PATH to libnccl.so.2.",
    "cusolver": "Install cuSOLVER: `pip install nvidia-cusolver-cu12` (CUDA 12) or `pip install nvidia-cusolver`"
                " (CUDA 13; it also needs nvidia-cusparse and nvidia-nvjitlink), or set DNNBIND_CUSOLVER_PATH.",
}

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL, str]] = {}


def env_var(name: str) -> str:
    return f"DNNBIND_{name.upper()}_PATH"


def load(name: str) -> ctypes.CDLL:
    """Open library ``name`` ("cudnn", "cublas", "nvrtc", "nccl") once and return it; raise with a fix if missing."""
    hit = _loaded.get(name)
    if hit is not None:
        return hit[0]
    with _lock:
        if name not in _loaded:
            _loaded[name] = _open(name)
        return _loaded[name][0]


def path(name: str) -> str:
    """The file ``name`` was loaded from (loading it if needed)."""
    load(name)
    return _loaded[name][1]


def loaded() -> dict[str, str]:
    return {k: v[1] for k, v in _loaded.items()}


def _open(name: str) -> tuple[ctypes.CDLL, str]:
    hint = INSTALL_HINTS.get(name, "")
    override = os.environ.get(env_var(name))
    if override:
        if name == "cublas":
            # NOTE: libcublas needs libcublasLt resolvable; preload the one beside the override if any.
            folder = os.path.dirname(override)
            for entry in sorted(os.listdir(folder) if os.path.isdir(folder) else []):
                if entry.startswith("libcublasLt.so"):
                    ctypes.CDLL(os.path.join(folder, entry), mode=ctypes.RTLD_GLOBAL)
                    break
        try:
            return ctypes.CDLL(override, mode=ctypes.RTLD_GLOBAL), override
        except OSError as exc:
            raise LibraryNotFoundError(name, hint, f"{env_var(name)}={override}: {exc}") from None
    try:
        import cuda.pathfinder as pathfinder
    except ImportError as exc:
        raise LibraryNotFoundError(name, "Install cuda-pathfinder: `pip install cuda-pathfinder`.",
                                   str(exc)) from None
    try:
        found = pathfinder.load_nvidia_dynamic_lib(name)
    except Exception as exc:  # pathfinder raises its own DynamicLibNotFoundError and friends
        raise LibraryNotFoundError(name, hint, f"cuda.pathfinder: {exc}") from None
    lib_path = found.abs_path or name
    # pathfinder has dlopen'ed it already; CDLL on the same path returns that same handle.
    return ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL), lib_path
