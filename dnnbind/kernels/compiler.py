"""Layer kernels: compile CUDA C++ at run time with NVRTC and cache the code in memory and on disk.

Imports dnnbind._lib (nvrtc, errors), its sibling launch.py, and cuda.bindings on first use; no compiler
toolchain is needed, and compiling works without a GPU (give ``arch`` or get sm_90).

Kernels are looked up by *name expression*: ``"add2_kernel"`` for an ``extern "C"`` kernel, ``"scale<float>"``
for a template instance, ``"ns::f"`` for a C++ kernel. NVRTC instantiates each and reports its mangled
("lowered") name, so kernels need not be ``extern "C"``; ``extern "C"`` just keeps the symbol readable.

Code is CUBIN for ``sm_XX`` when this NVRTC can target the GPU, else PTX for the newest ``compute_XX`` it
knows, which the driver JIT-compiles at load. The disk cache (``$DNNBIND_CACHE_DIR``, else
``~/.cache/dnnbind/kernels``) is keyed by sha256 of everything that changes the output: source, name
expressions, options, headers, target and the NVRTC version. ``#include`` files read from disk through
``-I`` are not part of the key; pass them as ``headers={"name.h": text}`` to have them hashed.
"""

from __future__ import annotations

from .._lib.errors import DnnbindValueError

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dnnbind._lib import cudart, nvrtc
from dnnbind._lib.errors import NvrtcError

from .launch import (
    Kernel,
    driver_call,
    compute_capability,
    current_device_or_none,
)

__all__ = ["Module", "cache_dir", "clear_memory_cache", "compile", "target"]

logger = logging.getLogger("dnnbind.kernels")

DEFAULT_ARCH = 90  # Hopper (H100/H200), the project's GPUs; used for compile-only work without a GPU
PROGRAM_NAME = "kernel.cu"  # what NVRTC's log calls the source: "kernel.cu(3): error: ..."
_CACHE_FORMAT = 1
_MAGIC = b"dnnbind-kernel-cache 1\n"
_MAX_QUOTED = 20  # error lines quoted under the log, enough for a typo and its follow-on errors


@dataclass(frozen=True)
class _Image:
    kind: str  # "cubin" or "ptx"
    code: bytes  # PTX keeps its trailing NUL: cuModuleLoadData reads PTX as a C string
    lowered: dict[str, str]  # name expression -> symbol
    log: str  # NVRTC's warnings, if any


# --- target --------------------------------------------------------------------------------------------

_ARCH_RE = re.compile(r"(sm_|compute_)?(\d+)([af]?)")


def _parse_arch(arch: Any) -> tuple[str, int, str]:
    """'sm_90' / 'sm_90a' / 'compute_80' / '90' / 90 / (9, 0) -> (family, number, suffix)."""
    if isinstance(arch, tuple) and len(arch) == 2:
        return "sm", 10 * int(arch[0]) + int(arch[1]), ""
    if isinstance(arch, int):
        return "sm", arch, ""
    m = _ARCH_RE.fullmatch(str(arch).strip().lower())
    if not m:
        raise DnnbindValueError(f"arch must look like 'sm_90', 'sm_90a', 'compute_90', 90 or (9, 0); got {arch!r}")
    return (m.group(1) or "sm_").rstrip("_"), int(m.group(2)), m.group(3)


def target(arch: Any = None) -> tuple[str, str]:
    """The NVRTC ``-arch`` option and output kind for ``arch`` (None: the current GPU, else sm_90).

    >>> target("sm_90")      # with an NVRTC that supports sm_90
    ('-arch=sm_90', 'cubin')
    """
    if arch is None:
        device = current_device_or_none()
        arch = compute_capability(device) if device is not None else DEFAULT_ARCH
    family, number, suffix = _parse_arch(arch)
    if family == "compute":
        return f"-arch=compute_{number}{suffix}", "ptx"
    supported = nvrtc.supported_archs()
    if number in supported:
        return f"-arch=sm_{number}{suffix}", "cubin"
    # A GPU newer than this NVRTC: emit PTX for the newest architecture it knows; the driver JITs it.
    older = [a for a in supported if a <= number]
    if not older:
        major, minor = nvrtc.version()
        raise DnnbindValueError(f"NVRTC {major}.{minor} cannot compile for sm_{number}; it supports"
                         f" sm_{supported[0]} to sm_{supported[-1]}")
    return f"-arch=compute_{max(older)}", "ptx"


def _normalize_options(options: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(options, str):  # compile(src, name, "-lineinfo") would otherwise iterate characters
        options = (options,)
    opts = tuple(str(o) for o in options)
    for o in opts:
        if o.startswith(("-arch", "--gpu-architecture", "-gencode")):
            raise DnnbindValueError(f"pass the target as arch='sm_90' (or 'compute_90' for PTX), not as option {o!r}")
    return opts


# --- caches --------------------------------------------------------------------------------------------

_lock = threading.Lock()
_images: dict[str, _Image] = {}  # sha256 key -> compiled code
_kernels: dict[tuple, Kernel] = {}  # compile()'s arguments -> the Kernel it returned


def cache_dir() -> str:
    """Where compiled kernels are kept: $DNNBIND_CACHE_DIR, else ~/.cache/dnnbind/kernels."""
    explicit = os.environ.get("DNNBIND_CACHE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dnnbind", "kernels")


def clear_memory_cache() -> None:
    """Forget compiled code and kernels held in memory (the disk cache stays; tests use this)."""
    with _lock:
        _images.clear()
        _kernels.clear()


def _cache_key(source: str, names: tuple[str, ...], options: tuple[str, ...],
               headers: tuple[tuple[str, str], ...]) -> str:
    blob = json.dumps([_CACHE_FORMAT, source, names, options, headers, nvrtc.version()], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_cached(path: str, kind: str, names: tuple[str, ...]) -> _Image | None:
    """The image stored at ``path``, or None when absent or damaged (a damaged file is rebuilt)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise DnnbindValueError("bad magic")
        end = data.index(b"\n", len(_MAGIC))
        meta = json.loads(data[len(_MAGIC):end])
        code = data[end + 1:]
        if len(code) != meta["size"] or hashlib.sha256(code).hexdigest() != meta["sha256"]:
            raise DnnbindValueError("checksum mismatch")
        if meta["kind"] != kind or set(meta["lowered"]) != set(names):
            raise DnnbindValueError("metadata mismatch")
        return _Image(kind, code, {str(k): str(v) for k, v in meta["lowered"].items()}, str(meta["log"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        logger.warning("ignoring damaged kernel cache file %s (%s); recompiling", path, exc)
        return None


def _write_cached(path: str, image: _Image) -> None:
    """Best effort: a read-only or full disk costs a recompile next time, never an error now."""
    meta = {"kind": image.kind, "lowered": image.lowered, "log": image.log, "size": len(image.code),
            "sha256": hashlib.sha256(image.code).hexdigest()}
    data = _MAGIC + json.dumps(meta).encode() + b"\n" + image.code
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        # Write a private temp file then rename over the target: readers (other processes, pytest-xdist
        # workers) see the old file or the whole new one, never a partial write.
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        logger.info("could not write kernel cache file %s: %s", path, exc)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _get_image(source: str, names: tuple[str, ...], options: tuple[str, ...],
               headers: tuple[tuple[str, str], ...], kind: str) -> _Image:
    key = _cache_key(source, names, options, headers)
    image = _images.get(key)
    if image is not None:
        return image
    path = os.path.join(cache_dir(), key + ".bin")
    image = _read_cached(path, kind, names)
    if image is None:
        image = _run_nvrtc(source, names, options, headers, kind)
        _write_cached(path, image)
    _images[key] = image
    return image


# --- NVRTC ---------------------------------------------------------------------------------------------

def _program_log(prog: Any) -> str:
    size = nvrtc.call("nvrtcGetProgramLogSize", prog)
    if size <= 1:  # just the terminating NUL
        return ""
    buf = bytearray(size)
    nvrtc.call("nvrtcGetProgramLog", prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def _get_code(prog: Any, kind: str) -> bytes:
    what = "CUBIN" if kind == "cubin" else "PTX"
    size = nvrtc.call(f"nvrtcGet{what}Size", prog)
    buf = bytearray(size)
    nvrtc.call(f"nvrtcGet{what}", prog, buf)
    return bytes(buf)


def _run_nvrtc(source: str, names: tuple[str, ...], options: tuple[str, ...],
               headers: tuple[tuple[str, str], ...], kind: str) -> _Image:
    """Compile once with NVRTC. Raises NvrtcError with the log and the offending source lines quoted."""
    prog = nvrtc.call("nvrtcCreateProgram", source.encode(), PROGRAM_NAME.encode(), len(headers),
                      [text.encode() for _, text in headers], [name.encode() for name, _ in headers])
    try:
        for name in names:
            nvrtc.call("nvrtcAddNameExpression", prog, name.encode())
        opts = [o.encode() for o in options]
        try:
            nvrtc.call("nvrtcCompileProgram", prog, len(opts), opts)
        except NvrtcError as exc:
            log = _program_log(prog)
            context = f"compiling {', '.join(names) or 'a module'} with {' '.join(options)}"
            raise NvrtcError(exc.status, exc.function, _explain(log, source, headers, names) or exc.message,
                             context) from None
        lowered = {name: nvrtc.call("nvrtcGetLoweredName", prog, name.encode()).decode() for name in names}
        return _Image(kind, _get_code(prog, kind), lowered, _program_log(prog))
    finally:
        nvrtc.call("nvrtcDestroyProgram", prog)


_LOG_LOCATION = re.compile(r"^(?P<file>[^\s()][^()]*)\((?P<line>\d+)\): (?:catastrophic )?(?:error|warning)")


def _explain(log: str, source: str, headers: tuple[tuple[str, str], ...], names: tuple[str, ...]) -> str:
    """NVRTC's log, then each line it complains about quoted with its number and the line before it.

    NVRTC reports a missing ';' at the *next* token, often the next line, hence the line of context.
    """
    files = {PROGRAM_NAME: source.splitlines(), **{name: text.splitlines() for name, text in headers}}
    quoted: list[str] = []
    seen: set[tuple[str, int]] = set()
    name_map_error = False
    for entry in log.splitlines():
        m = _LOG_LOCATION.match(entry)
        if not m:
            continue
        file, number = m.group("file"), int(m.group("line"))
        if file.startswith("__nv_name_map"):
            name_map_error = True  # NVRTC's synthetic file for name expressions
            continue
        lines = files.get(file) or files.get(os.path.basename(file))
        if not lines or not 1 <= number <= len(lines) or (file, number) in seen or len(seen) >= _MAX_QUOTED:
            continue
        seen.add((file, number))
        if number > 1 and (file, number - 1) not in seen:
            quoted.append(f"  {file}:{number - 1:<4d}| {lines[number - 2].rstrip()}")
        quoted.append(f"> {file}:{number:<4d}| {lines[number - 1].rstrip()}")
    text = log.strip()
    if quoted:
        text += "\n\noffending source lines (> marks the reported line):\n" + "\n".join(quoted)
    if name_map_error:
        text += (f"\n\nnote: a kernel name was not found in the source (asked for {', '.join(names)}): give the"
                 " function's name as written, e.g. 'add2_kernel' for an extern \"C\" kernel or"
                 " 'scale<float>' for a template instance")
    return text


# --- modules -------------------------------------------------------------------------------------------

class Module:
    """One compiled source with one or more kernels.

    ``Module(source, name_expressions=("k1", "k2<float>"))`` compiles now (memory and disk cached) and
    loads on the first launch on each device. ``get_function(name)`` accepts a name expression given at
    compile time or, for kernels not listed, the symbol itself (e.g. an ``extern "C"`` name).
    """

    def __init__(self, source: str, name_expressions: Sequence[str] = (), options: Sequence[str] | str = (),
                 arch: Any = None, headers: Mapping[str, str] | None = None):
        if isinstance(name_expressions, str):
            name_expressions = (name_expressions,)
        self.source = source
        self.name_expressions = tuple(str(n) for n in name_expressions)
        flag, self.kind = target(arch)
        self.arch = flag.split("=", 1)[1]  # 'sm_90' or 'compute_90'
        self.options = _normalize_options(options) + (flag,)
        self.headers = tuple(sorted((headers or {}).items()))
        image = _get_image(source, self.name_expressions, self.options, self.headers, self.kind)
        self.code: bytes = image.code
        self.log: str = image.log  # warnings from NVRTC; empty when there were none
        self.lowered_names: dict[str, str] = dict(image.lowered)
        self._kernels: dict[str, Kernel] = {}
        self._loaded: dict[int, Any] = {}  # device -> CUmodule
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<dnnbind.kernels.Module {self.kind} for {self.arch}, kernels {list(self.name_expressions)}>"

    @property
    def ptx(self) -> str | None:
        return self.code.rstrip(b"\0").decode() if self.kind == "ptx" else None

    def get_function(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            kernel = self._kernels.setdefault(name, Kernel(self, name, self.lowered_names.get(name, name)))
        return kernel

    def _get_function(self, lowered: str, device: int, name: str) -> Any:
        """The CUfunction for ``lowered`` on ``device``, loading this module there first if needed."""
        with self._lock:
            cumodule = self._loaded.get(device)
            if cumodule is None:
                # cuModuleLoadData loads into the *current* context; cudaFree(0) makes the runtime create
                # and bind the device's primary context (the one dnnbind.runtime, CuPy and torch share).
                cudart.call("cudaFree", 0)
                # NOTE: modules are never unloaded: kernels live as long as the process, and unloading at
                # interpreter exit races the context's own teardown.
                cumodule = self._loaded[device] = driver_call(
                    "cuModuleLoadData", self.code, context=f"loading {self.kind} for {self.arch} on device {device}")
        hint = "" if name in self.lowered_names else (
            "; declare the kernel extern \"C\" or pass its name in name_expressions")
        return driver_call("cuModuleGetFunction", cumodule, lowered.encode(),
                         context=f"kernel '{name}' (symbol {lowered}) on device {device}{hint}")


def compile(source: str, name: str, options: Sequence[str] | str = (), arch: Any = None,
            headers: Mapping[str, str] | None = None) -> Kernel:
    """Compile ``source`` and return its kernel ``name`` (a name expression, e.g. 'k' or 'k<float>').

    ``arch``: None (the current GPU, or sm_90 without one), 'sm_90', 'compute_90' (PTX), 90 or (9, 0).
    Calling again with the same arguments returns the same Kernel, so its loaded code is reused.
    """
    flag, _ = target(arch)
    opts = _normalize_options(options)
    hdrs = tuple(sorted((headers or {}).items()))
    key = (source, name, opts, hdrs, flag)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                arch_name = flag.split("=", 1)[1]
                module = Module(source, (name,), opts, arch_name, dict(hdrs))
                kernel = _kernels[key] = module.get_function(name)
    return kernel
