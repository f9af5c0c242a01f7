"""Layer 2 (ops): conv algorithm choices kept on disk, so the next run skips timing. Imports _lib and runtime.

One JSON file per (GPU model, cuDNN version), since a choice is only valid for both. It lives in
``$DNNBIND_CACHE_DIR`` (default ``$XDG_CACHE_HOME/dnnbind``, i.e. ``~/.cache/dnnbind``); set
``DNNBIND_ALGO_CACHE=0`` to keep choices in memory only. Writes merge with what another process may have
written meanwhile and replace the file atomically (temp file + ``os.replace``), so a crash or two runs at
once never leave a torn file; an unreadable or unwritable cache is skipped with one warning, never fatal.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings

# 2: the conv keys end with the layout ("NCHW" or "NHWC"); a format-1 file (keys without it) is ignored and replaced
FORMAT = 2
_loaded: dict = {}      # file path -> {key string: [algo, workspace bytes]}
_warned: set = set()


def enabled() -> bool:
    return os.environ.get("DNNBIND_ALGO_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> str:
    base = os.environ.get("DNNBIND_CACHE_DIR")
    if base:
        return base
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "dnnbind")


def file_for(identity: str) -> str:
    """The cache file of one (GPU model, cuDNN version) identity, e.g. 'NVIDIA H100 80GB HBM3 sm_90 cudnn 91900'."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", identity).strip("_")
    return os.path.join(cache_dir(), f"conv_algos_{slug}.json")


def _read(path: str, identity: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _warn(path, f"ignoring unreadable conv algorithm cache {path}: {exc}")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("identity") != identity:
        return {}
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, list) and len(v) == 2}


def lookup(identity: str, key: tuple):
    """(algo, workspace bytes) stored for ``key``, or None."""
    if not enabled():
        return None
    path = file_for(identity)
    table = _loaded.get(path)
    if table is None:
        table = _loaded[path] = _read(path, identity)
    hit = table.get(repr(key))
    return (int(hit[0]), int(hit[1])) if hit is not None else None


def store(identity: str, key: tuple, value: tuple) -> None:
    """Record one choice and rewrite the file atomically (merged with its current contents)."""
    if not enabled():
        return
    path = file_for(identity)
    table = _loaded.setdefault(path, {})
    table[repr(key)] = [int(value[0]), int(value[1])]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        merged = _read(path, identity)
        merged.update(table)
        fd, tmp = tempfile.mkstemp(prefix=".conv_algos.", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "identity": identity, "entries": merged}, f, indent=0, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        _warn(path, f"cannot write the conv algorithm cache {path} ({exc}); choices stay in this process only. "
                    "Set DNNBIND_CACHE_DIR to a writable folder or DNNBIND_ALGO_CACHE=0.")


def forget() -> None:
    """Drop what was read from disk (the files stay); the next lookup reads them again."""
    _loaded.clear()


def _warn(path: str, message: str) -> None:
    if path not in _warned:
        _warned.add(path)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
