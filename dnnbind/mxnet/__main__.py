"""``python -m dnnbind.mxnet script.py [args]``: run an MXNet 1.x program unchanged on dnnbind. Layer: top (the
MXNet alias); imports dnnbind.mxnet.

The program runs as ``python script.py [args]`` would run it, with ``import mxnet`` resolved to dnnbind: it is
``__main__``, ``sys.argv`` is ``[script.py, args...]``, its directory is ``sys.path[0]``, an uncaught exception
prints Python's traceback (without this runner's frames) and exits with status 1, ``sys.exit(n)`` exits with
``n``. Also ``python -m dnnbind.mxnet -m package.module [args]`` and ``-c "code" [args]``.
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import types

from ._finder import install_mxnet_alias

USAGE = """usage: python -m dnnbind.mxnet script.py [args ...]
       python -m dnnbind.mxnet -m module [args ...]
       python -m dnnbind.mxnet -c command [args ...]

Runs an MXNet 1.x program with `import mxnet` resolved to dnnbind."""

def _strip_runner_frames(tb):
    """The traceback from the program's first frame on, as if Python had run it directly."""
    ours = os.path.abspath(__file__)
    while tb is not None and (tb.tb_frame.f_globals is vars(runpy)  # runpy may be frozen: no file to compare
                              or os.path.abspath(tb.tb_frame.f_code.co_filename) == ours):
        tb = tb.tb_next
    return tb


def _run(argv: list[str]) -> None:
    mode, target = argv[0], None
    if mode in ("-m", "-c"):
        if len(argv) < 2:
            raise SystemExit(f"Argument expected for the {mode} option\n{USAGE}")
        target, rest = argv[1], argv[2:]
    else:
        target, rest = mode, argv[1:]
    if mode == "-m":
        sys.argv = [target, *rest]  # run_module replaces argv[0] with the module's file, as `python -m` does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "-c":
        sys.argv = ["-c", *rest]
        sys.path[0] = ""  # `python -c` puts the current directory first
        code = compile(target, "<string>", "exec")
        module = types.ModuleType("__main__")
        module.__builtins__ = builtins
        saved, sys.modules["__main__"] = sys.modules["__main__"], module  # what runpy does for scripts
        try:
            exec(code, module.__dict__)
        finally:
            sys.modules["__main__"] = saved
    else:
        if not os.path.exists(target):
            print(f"{sys.executable}: can't open file {os.path.abspath(target)!r}: [Errno 2] No such file or "
                  "directory", file=sys.stderr)
            raise SystemExit(2)
        sys.argv = [target, *rest]
        # `python script.py` puts the script's directory first on sys.path (instead of -m's current directory).
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    install_mxnet_alias()
    try:
        _run(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # NOTE: re-raising from here would put this frame back on top of the traceback; printing it through
        # sys.excepthook (as the interpreter does, and IPython-style hooks expect) keeps it Python's own.
        tb = _strip_runner_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the default hook prints exc.__traceback__
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
