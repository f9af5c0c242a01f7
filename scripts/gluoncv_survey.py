"""Which of GluonCV 0.10.5's model-zoo networks build and run forward on dnnbind through the ``mxnet`` alias.

    python scripts/gluoncv_survey.py                      # all of get_model_list(), a table on stdout
    python scripts/gluoncv_survey.py --json out.json resnet18_v1 yolo3_darknet53_voc

For each name: ``gluoncv.model_zoo.get_model(name, pretrained=False, pretrained_base=False)`` (retried without
``pretrained_base`` where the network's constructor does not take it; ``classes=`` given to the ``*_custom`` ones),
``initialize()``, one forward of a batch-1 input of the size the network expects (224 for classification, 32 for
CIFAR, 300/512 for SSD, 416 for YOLOv3, 512 for the R-CNNs and CenterNet, 480 for segmentation (1024 for
Fast-SCNN, whose upsampling sizes are fixed when it is made), 256x192 for pose,
clips for the video networks). Prints one row per network: built?, forward?, the output shapes or the first line of
the error, seconds. Runs on the default device (the numpy CPU backend without a GPU).

Each network runs in a worker process under ``signal.alarm(timeout)``; a worker that does not answer within the
timeout plus a grace period is killed and restarted on the next name (the network is reported as a timeout).

GluonCV's model zoo imports ``mxnet.gluon.contrib.nn`` (HybridConcurrent, Identity, SyncBatchNorm, PixelShuffle2D)
at import time. Where dnnbind does not have one of those yet, this script puts a placeholder in its place that
raises UnsupportedFeature when a network *constructs* it, so the rest of the zoo can be surveyed and the networks
that need it are reported as such (nothing else is patched).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time

TIMEOUT_S = 60  # per network: build + initialize + forward
GRACE_S = 30  # a worker stuck in one long library call past the alarm is killed after this much more
CONTRIB_NN = ("HybridConcurrent", "Identity", "SyncBatchNorm", "PixelShuffle2D", "Concurrent")


def input_shape(name: str) -> tuple:
    """The batch-1 input a network of this name expects (NCHW; NCTHW for 3-D video networks)."""
    n = name.lower()
    if n.startswith("cifar"):
        return (1, 3, 32, 32)
    if n.startswith("ssd_300"):
        return (1, 3, 300, 300)
    if n.startswith("ssd_512"):
        return (1, 3, 512, 512)
    if n.startswith("yolo3"):
        return (1, 3, 416, 416)
    if "rcnn" in n or n.startswith("center_net"):
        return (1, 3, 512, 512)
    if n.startswith("fastscnn"):
        return (1, 3, 1024, 1024)  # its upsampling sizes are fixed by crop_size (1024) when it is made
    if n.startswith(("fcn", "psp", "deeplab", "danet", "icnet")) or n.endswith("_s") and "hrnet" in n:
        return (1, 3, 480, 480)
    if n.startswith(("simple_pose", "mobile_pose", "alpha_pose")):
        return (1, 3, 256, 192)
    if n.startswith("monodepth2"):
        return (1, 6, 192, 640) if "posenet" in n else (1, 3, 192, 640)
    if n.startswith("siamrpn"):
        return (1, 3, 127, 127)
    if n.startswith("c3d") or n.startswith("r2plus1d") or n.startswith("p3d"):
        return (1, 3, 16, 112, 112)
    if n.startswith("slowfast"):
        return (1, 3, 36 if "4x16" in n else (40 if "8x8" in n else 80), 224, 224)  # fast + slow frames, concatenated
    if n.startswith("i3d"):
        return (1, 3, 32 if "slow" not in n else 16, 224, 224)
    if n.startswith("inceptionv3") or n.startswith("inception_v3"):
        return (1, 3, 299, 299)
    if n.startswith("nasnet"):
        return (1, 3, 331, 331) if "4032" in n else (1, 3, 224, 224)
    return (1, 3, 224, 224)


def _shapes(out) -> str:
    if hasattr(out, "shape"):
        return "x".join(str(d) for d in out.shape)
    if isinstance(out, (list, tuple)):
        return "(" + ", ".join(_shapes(o) for o in out) + ")"
    return type(out).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _setup():
    """Import dnnbind's alias and GluonCV (with placeholders for the gluon.contrib.nn blocks dnnbind lacks)."""
    import dnnbind
    mx = dnnbind.install_mxnet_alias()
    import mxnet.gluon.contrib.nn as contrib_nn
    from dnnbind.features import UnsupportedFeature

    def placeholder(name):
        class Missing:
            def __init__(self, *args, **kwargs):
                raise UnsupportedFeature(f"mxnet.gluon.contrib.nn.{name} is not in dnnbind yet")
        Missing.__name__ = Missing.__qualname__ = name
        return Missing

    for name in CONTRIB_NN:
        try:
            getattr(contrib_nn, name)
        except Exception:  # noqa: BLE001  (the stand-in module raises UnsupportedFeature)
            setattr(contrib_nn, name, placeholder(name))
    import gluoncv
    return mx, gluoncv


def _alarm(signum, frame):
    raise TimeoutError("timed out")


def survey_one(mx, gluoncv, name: str, timeout: int) -> dict:
    """One network: build, initialize, forward; a dict with what happened."""
    row = {"model": name, "built": False, "forward": False, "result": "", "seconds": 0.0}
    t0 = time.time()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        kwargs = {"pretrained": False, "pretrained_base": False}
        if "custom" in name:
            kwargs["classes"] = ["a", "b"]
        try:
            net = gluoncv.model_zoo.get_model(name, **kwargs)
        except (TypeError, Warning) as exc:  # darknet53's constructor raises Warning for a keyword it does not take
            if "pretrained_base" not in str(exc) and not isinstance(exc, Warning):
                raise
            del kwargs["pretrained_base"]
            net = gluoncv.model_zoo.get_model(name, **kwargs)
        row["built"] = True
        net.initialize()
        shape = input_shape(name)
        x = mx.nd.random.uniform(shape=shape)
        if name.startswith("siamrpn"):
            out = net(x, mx.nd.random.uniform(shape=(1, 3, 287, 287)))  # its search branch is fixed at 24x24
        else:
            out = net(x)
        mx.nd.waitall()
        row["forward"] = True
        row["result"] = _shapes(out)
    except BaseException as exc:  # noqa: BLE001  (every failure is a row of the table)
        row["result"] = _first_line(exc)
    finally:
        signal.alarm(0)
    row["seconds"] = round(time.time() - t0, 1)
    return row


def worker(timeout: int) -> None:
    """Read names from stdin, one per line; answer one JSON line each (after a 'start' line)."""
    import warnings
    warnings.simplefilter("ignore")  # GluonCV's "already initialized" warnings, one per Parameter
    protocol = sys.stdout
    sys.stdout = sys.stderr  # what the networks print (GluonCV's own messages) stays out of the answers
    mx, gluoncv = _setup()
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        print(json.dumps({"start": name}), file=protocol, flush=True)
        print(json.dumps(survey_one(mx, gluoncv, name, timeout)), file=protocol, flush=True)


def run(names: list, timeout: int) -> list:
    """Survey ``names`` in a worker process, restarting it after a hang or a crash."""
    rows, todo = [], list(names)
    while todo:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--timeout", str(timeout)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        proc.stdin.write("".join(n + "\n" for n in todo))
        proc.stdin.close()
        current, deadline = None, time.time() + 120  # importing takes seconds; a first answer in 2 minutes
        while todo:
            ready, _, _ = select.select([proc.stdout], [], [], 5)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:  # not an answer: something a library printed
                    continue
                if "start" in msg:
                    current, deadline = msg["start"], time.time() + timeout + GRACE_S
                    continue
                rows.append(msg)
                todo.remove(msg["model"])
                current = None
                _print_row(msg)
            elif time.time() > deadline:
                break
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if todo:
            name = current or todo[0]
            how = "killed after the timeout" if proc.returncode == -signal.SIGKILL else \
                f"worker exited with {proc.returncode}"
            row = {"model": name, "built": False, "forward": False, "result": f"Timeout: {how}",
                   "seconds": float(timeout + GRACE_S)}
            rows.append(row)
            todo.remove(name)
            _print_row(row)
    return rows


def _print_row(row: dict) -> None:
    print(f"{row['model']:<48} {'yes' if row['built'] else 'no':<5} {'yes' if row['forward'] else 'no':<5} "
          f"{row['seconds']:>6.1f}  {row['result']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: all of get_model_list())")
    parser.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per network")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.timeout)
        return
    names = args.models
    if not names:
        _, gluoncv = _setup()
        names = list(gluoncv.model_zoo.get_model_list())
    print(f"{'model':<48} {'built':<5} {'fwd':<5} {'sec':>6}  output shapes or first error line")
    rows = run(names, args.timeout)
    built, ran = sum(r["built"] for r in rows), sum(r["forward"] for r in rows)
    print(f"\n{len(rows)} networks: {built} built, {ran} ran forward")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
