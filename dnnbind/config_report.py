"""``dnnbind.show_config()``: what dnnbind found, and why a GPU is not used. Imports _lib and runtime.

Each line is gathered independently so one missing piece (no driver, no cuBLAS) never hides the others.
"""

from __future__ import annotations

import platform
import sys


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # report, never raise: this is the diagnostic users run when things are broken
        return f"unavailable ({type(exc).__name__}: {exc})"


def config() -> dict:
    from ._lib import cublas, cudart, cudnn, loader, nccl
    from .runtime import config as math, device

    def cudnn_info():
        v = cudnn.version()
        return {"version": ".".join(map(str, cudnn.version_tuple(v))), "raw": v, "path": loader.path("cudnn")}

    def cublas_info():
        v = cublas.version()
        return {"version": f"{v // 10000}.{(v // 100) % 100}.{v % 100}", "path": loader.path("cublas")}

    def nccl_info():
        v = nccl.version()
        return {"version": ".".join(map(str, nccl.version_tuple(v))), "raw": v, "path": loader.path("nccl")}

    def cuda_python():
        from importlib.metadata import version
        return {pkg: _try(lambda p=pkg: version(p)) for pkg in ("cuda-python", "cuda-bindings", "cuda-pathfinder")}

    def versions():
        rt = cudart.rt()
        drv = rt.cudaDriverGetVersion()
        run = rt.cudaRuntimeGetVersion()
        fmt = lambda v: f"{v // 1000}.{(v % 1000) // 10}" if v else "none"  # noqa: E731
        return {"driver": fmt(int(drv[1])) if int(drv[0]) == 0 else "none",
                "runtime": fmt(int(run[1])) if int(run[0]) == 0 else "none"}

    def gpus():
        count, why = device.gpu_status()
        if count == 0:
            return {"count": 0, "why": why}
        out = []
        for i in range(count):
            name, major, minor, memory = device.gpu_properties(i)
            out.append({"index": i, "name": name, "cc": f"{major}.{minor}", "memory_gib": round(memory / 2**30, 1)})
        return {"count": count, "devices": out}

    return {"dnnbind": _try(lambda: __import__("dnnbind").__version__), "python": sys.version.split()[0],
            "platform": platform.platform(), "cudnn": _try(cudnn_info), "cublas": _try(cublas_info),
            "nccl": _try(nccl_info),
            "cuda_python": _try(cuda_python), "cuda": _try(versions), "gpus": _try(gpus),
            "math_mode": math.math_mode()}


def show_config(file=None) -> dict:
    """Print cuDNN/cuBLAS/NCCL versions and paths, cuda-python, driver/runtime versions and the GPUs."""
    info = config()
    out = file or sys.stdout
    print(f"dnnbind {info['dnnbind']}  (python {info['python']}, {info['platform']})", file=out)
    for lib in ("cudnn", "cublas", "nccl"):
        v = info[lib]
        print(f"  {lib:<12}" + (f"{v['version']}  {v['path']}" if isinstance(v, dict) else str(v)), file=out)
    cp = info["cuda_python"]
    print("  cuda-python " + (", ".join(f"{k} {v}" for k, v in cp.items()) if isinstance(cp, dict) else str(cp)),
          file=out)
    cu = info["cuda"]
    print("  CUDA        " + (f"driver {cu['driver']}, runtime {cu['runtime']}" if isinstance(cu, dict) else cu),
          file=out)
    g = info["gpus"]
    if isinstance(g, dict) and g.get("count"):
        for d in g["devices"]:
            print(f"  gpu({d['index']})      {d['name']}  sm_{d['cc'].replace('.', '')}  {d['memory_gib']} GiB",
                  file=out)
    else:
        print("  GPUs        none: " + (g.get("why", "") if isinstance(g, dict) else str(g))
              + " -> ops run on the numpy (cpu) backend", file=out)
    print(f"  math mode   {info['math_mode']}", file=out)
    return info
