"""GluonCV 0.10.5's networks, run unchanged through dnnbind's mxnet alias, give the real MXNet 1.9.1's outputs on the
same parameters and input (fixtures/mxnet_gluoncv/, written by make_mxnet_gluoncv.py; the parameter values and the
input come from tests/gluoncv_values.py on both sides). Classification, detection (SSD, YOLOv3, Faster R-CNN,
CenterNet with and without deformable convolutions), segmentation (FCN, PSPNet, DeepLab) and pose.

Skipped where gluoncv is not installed (``pip install --no-deps gluoncv==0.10.5.post0`` and its imports: scipy,
tqdm, portalocker, yacs, autocfg; the ``gluoncv`` extra of pyproject.toml).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import gluoncv_values
from _helpers import assert_close, gluoncv_through_alias

HERE = pathlib.Path(__file__).resolve().parent / "fixtures" / "mxnet_gluoncv"
NAMES = sorted(p.stem for p in HERE.glob("*.npz"))
# the detection outputs' class ids are exact; scores and boxes carry float32 rounding through 50+ layers
TOL = {"default": (2e-3, 2e-4)}


@pytest.fixture(scope="module")
def gcv():
    with gluoncv_through_alias() as (mx, model_zoo):
        yield mx, model_zoo


def _outputs(out) -> list:
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in _outputs(o)]
    return [out.asnumpy()]


def _check(mx, model_zoo, name, ctx):
    f = np.load(HERE / f"{name}.npz")
    with mx.name.NameManager():
        net = gluoncv_values.get_model(model_zoo, name)
    net.initialize(ctx=ctx)
    # GluonCV's segmentation and CenterNet builders initialize their heads on ctx=cpu() themselves (initialize then
    # skips them, as MXNet does): its scripts move everything with reset_ctx, so does this
    net.collect_params().reset_ctx(ctx)
    x = mx.nd.array(gluoncv_values.image(f["x_shape"]), ctx=ctx)
    with ctx:  # GluonCV's decoders make F.arange(...) on the default device: the GPU here, as MXNet users do
        net(x)  # deferred shapes
        shapes = gluoncv_values.fill(net, lambda a: mx.nd.array(a, ctx=ctx))
        want = json.loads(str(f["params"]))
        assert list(shapes) == [k for k, _ in want], "parameter names or their order differ from MXNet's"
        assert [list(v) for v in shapes.values()] == [v for _, v in want], "parameter shapes differ from MXNet's"
        outs = _outputs(net(x))
    rtol, atol = TOL.get(name, TOL["default"])
    for i, y in enumerate(outs):
        if f"y{i}" in f.files:
            assert_close(y, f[f"y{i}"], rtol=rtol, atol=atol, name=f"{name} output {i}")
        else:
            sample = y[..., ::16, ::16]
            assert_close(sample, f[f"y{i}_sample"], rtol=rtol, atol=atol, name=f"{name} output {i} (sampled)")
            sums = y.astype(np.float64).sum(axis=(-2, -1))
            assert_close(sums, f[f"y{i}_sums"], rtol=1e-3, atol=1e-2 * np.sqrt(y.shape[-1] * y.shape[-2]),
                         name=f"{name} output {i} (sums)")
    assert len(outs) == len([k for k in f.files if k.startswith("y") and not k.endswith("_sums")])


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_mxnet(gcv, name):
    mx, model_zoo = gcv
    _check(mx, model_zoo, name, mx.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_forward_matches_mxnet(gcv, gpu, name):
    """The same networks on cuDNN/cuBLAS and the NVRTC kernels, in strict float32 (TF32 off)."""
    import dnnbind
    mx, model_zoo = gcv
    with dnnbind.math_scope("fp32"):
        _check(mx, model_zoo, name, gpu)
