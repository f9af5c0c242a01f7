"""Deterministic parameter values for a GluonCV network, the same under the real MXNet and under dnnbind (pure numpy,
imported by tests/fixtures/make_mxnet_gluoncv.py on MXNet's Python 3.8 and by tests/test_gluoncv_models.py).

Each parameter's values depend only on its name relative to the network's own prefix (``conv0_weight``, not
``resnetv1b3_conv0_weight``: the global prefix counter differs between processes) and on its shape, so the order in
which the two frameworks list parameters does not matter. Scales keep activations O(1) through 50+ layers:
weights ~ N(0, 1/fan_in), BatchNorm gamma and running_var in [0.5, 1.5), the rest small.
"""
import sys
import zlib

import numpy as np


def import_model_zoo():
    """``gluoncv.model_zoo``. GluonCV 0.10.5's own import check raises RuntimeError when torch >= 2 is installed
    (gluoncv/check.py _require_pytorch_version), whatever the MXNet: torch is hidden while it loads (its MXNet half
    never uses torch), as scripts/bench_ssd.py does."""
    if "gluoncv" in sys.modules:
        from gluoncv import model_zoo
        return model_zoo
    missing = object()
    saved = sys.modules.get("torch", missing)
    sys.modules["torch"] = None  # `import torch` raises ImportError: GluonCV takes it as absent
    try:
        from gluoncv import model_zoo
    finally:
        if saved is missing:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return model_zoo


def relative_name(net_prefix: str, name: str) -> str:
    return name[len(net_prefix):] if net_prefix and name.startswith(net_prefix) else name


def value(rel_name: str, shape) -> np.ndarray:
    rs = np.random.RandomState(zlib.crc32(rel_name.encode()) & 0x7FFFFFFF)
    shape = tuple(int(s) for s in shape)
    if rel_name.endswith(("gamma", "running_var", "moving_var")):  # moving_*: a symbol-built BatchNorm's statistics
        return rs.uniform(0.5, 1.5, shape).astype(np.float32)
    if rel_name.endswith(("beta", "running_mean", "moving_mean", "bias")):
        return (rs.standard_normal(shape) * 0.1).astype(np.float32)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(int(shape[0]), 1)
    return (rs.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)


def image(shape) -> np.ndarray:
    """The input both frameworks run (not stored in the fixtures: random pixels do not compress)."""
    return np.random.RandomState(7).uniform(-1, 1, tuple(int(s) for s in shape)).astype(np.float32)


def get_model(model_zoo, name: str):
    """``get_model(name, pretrained=False)``, with ``pretrained_base=False`` for the networks built on a backbone
    (detection, segmentation, pose; the classification builders refuse the argument)."""
    try:
        return model_zoo.get_model(name, pretrained=False, pretrained_base=False)
    except TypeError as exc:
        if "pretrained_base" not in str(exc):
            raise
        return model_zoo.get_model(name, pretrained=False)


def fill(net, nd_array) -> dict:
    """Set every parameter of ``net`` but its Constants (anchors and the like, which the network computes);
    returns {relative name: shape} of all of them. ``nd_array`` makes an array."""
    shapes = {}
    for name, p in net.collect_params().items():
        rel = relative_name(net.prefix, name)
        if type(p).__name__ == "Constant":  # what GluonCV computes itself (SSD's anchors, YOLOv3's offsets)
            shapes[rel] = tuple(p.shape)
            continue
        v = value(rel, p.shape)
        p.set_data(nd_array(v))
        shapes[rel] = tuple(p.shape)
    return shapes
