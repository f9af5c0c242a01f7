"""Training steps of GluonCV 0.10.5's SSD (ssd_512_mobilenet1.0_voc) and YOLOv3 (yolo3_mobilenet1.0_voc), run unchanged
through dnnbind's mxnet alias with GluonCV's own target generators (SSDTargetGenerator, YOLOV3PrefetchTargetGenerator),
losses (SSDMultiBoxLoss, YOLOv3's training-mode forward) and an SGD Trainer, give the real MXNet 1.9.1's targets,
losses, gradients and updated parameters (fixtures/mxnet_gluoncv_train/, written by make_mxnet_gluoncv_train.py: the
test runs that file's very step functions, so both sides run the same procedure on the same parameter values from
tests/gluoncv_values.py). Each in float64 (the network; GluonCV's losses stay float32), where everything is
compared closely, and in float32, where only what float32 determines is (see TOL).

Skipped where gluoncv is not installed (``pip install --no-deps gluoncv==0.10.5.post0`` and its imports: scipy,
tqdm, portalocker, yacs, autocfg; the ``gluoncv`` extra of pyproject.toml).
"""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import gluoncv_values
from _helpers import assert_close, gluoncv_through_alias

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
HERE = FIXTURES / "mxnet_gluoncv_train"
# float64: the whole step is compared; only the losses run in float32 (GluonCV's losses are float32-only), so the
# gradients agree to ~1e-6 of their largest magnitude, the losses to ~1e-5 (the second step's after the update).
# float32: these randomly initialized 30-layer BatchNorm networks amplify rounding exponentially with depth (the
# batch statistics couple every sample): MXNet itself, given an input changed by 1e-6 relative, changes its backbone
# gradients by 2-30% of their maximum, and its float32 losses differ from its float64 ones by up to 8e-4 (YOLOv3's
# scale loss). So float32 checks the targets, the first losses, and the heads' gradients and updates (one layer
# from the loss: well conditioned) closely, and the rest only coarsely, to half their largest magnitude (a zero,
# negated or doubled gradient still fails). A gradient or a parameter is compared to a fraction of its largest
# magnitude (of its absolute sum for its sum).
TOL = {
    "float64": {"loss": 5e-5, "grad": 1e-5, "deep": 1e-5, "step2": True},
    "float32": {"loss": 3e-3, "grad": 1e-3, "deep": 0.5, "step2": False},
}
HEADS = ("convpredictor", "yolooutput")  # the predictor layers: SSD's class and box heads, YOLOv3's outputs


def _load_steps():
    spec = importlib.util.spec_from_file_location("make_mxnet_gluoncv_train",
                                                  FIXTURES / "make_mxnet_gluoncv_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gcv():
    with gluoncv_through_alias() as (mx, model_zoo):
        yield mx, model_zoo, _load_steps()


def _compare(got: dict, want, name: str, dtype: str) -> None:
    tol = TOL[dtype]
    assert sorted(got) == sorted(want.files), f"{name}: recorded arrays differ from the fixture's"
    for k in want.files:
        g, w = np.asarray(got[k]), want[k]
        what = f"{name} {dtype} {k}"
        assert g.shape == w.shape, f"{what}: shape {g.shape} != MXNet's {w.shape}"
        if ":" not in k and not k.startswith("step"):  # the input's shape and the targets
            assert_close(g, w, rtol=1e-5, atol=1e-5, name=what)
            continue
        if k.startswith("step"):  # losses per sample
            if k.startswith("step2") and not tol["step2"]:
                continue
            assert_close(g, w, rtol=tol["loss"], atol=tol["loss"] * float(np.abs(w).max()), name=what)
            continue
        param = k.split(":", 1)[1]
        rel = tol["grad"] if param.startswith(HEADS) else tol["deep"]
        if k.endswith(("_sum", "_abssum")):  # a sum over many terms: to a fraction of its absolute sum
            scale = float(want[k[:k.rindex("_")] + "_abssum"])
        else:  # the whole array, its sample or its largest magnitude: to a fraction of that magnitude
            base = k[:-len("_sample")] if k.endswith("_sample") else k[:-len("_absmax")] if k.endswith(
                "_absmax") else k
            scale = float(want[base + "_absmax"])
        assert_close(g, w, rtol=0.0, atol=rel * scale + 1e-30, name=what)


def _check(mx, model_zoo, steps, key: str, dtype: str, ctx) -> None:
    name, fn = steps.STEPS[key]
    want = np.load(HERE / f"{name}_{dtype}.npz")
    with ctx:  # GluonCV makes some arrays (arange, zeros) on the default device
        got = fn(mx, model_zoo, gluoncv_values, ctx, dtype)
    _compare(got, want, name, dtype)


CASES = [(k, d) for k in ("ssd", "yolo3") for d in ("float64", "float32")]


@pytest.mark.parametrize("key,dtype", CASES)
def test_train_step_matches_mxnet(gcv, key, dtype):
    mx, model_zoo, steps = gcv
    _check(mx, model_zoo, steps, key, dtype, mx.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("key,dtype", CASES)
def test_gpu_train_step_matches_mxnet(gcv, gpu, key, dtype):
    """The same steps on cuDNN/cuBLAS and the NVRTC kernels, in strict float32 (TF32 off) or float64."""
    import dnnbind
    mx, model_zoo, steps = gcv
    with dnnbind.math_scope("fp32"):
        _check(mx, model_zoo, steps, key, dtype, gpu)
