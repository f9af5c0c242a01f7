"""Dive into Deep Learning (d2l-zh v1.0.0, MXNet edition) chapter 5, "convolutional-neural-networks": each model
the chapter trains, built with dnnbind's Gluon API (through the `mxnet` alias) and with PyTorch, started from the
same weights and trained on the same batches in the same order; epoch time and test accuracy side by side.

    python scripts/d2l_compare.py --device gpu --json runs/d2l_compare.json
    python scripts/d2l_compare.py --device cpu --limit-batches 2 --models lenet batch-norm resnet   # smoke run

Layer: script (outside the package); imports dnnbind (as `mxnet`) and numpy, and PyTorch on first use.

Each architecture is written once, as its notebook builds it, over a set of layer constructors: GLUON's are the
book's own calls (nn.Conv2D(c, kernel_size=k, ..., activation=...), nn.Dense, nn.BatchNorm, ...); TORCH's are the
same layers in torch.nn with MXNet's semantics (lazy layers infer input sizes as deferred init does, Dense flattens
its input, BatchNorm momentum 0.9 is torch's 0.1, eps 1e-5). Both models so register their parameters in the same
order: the dnnbind model is initialized with init.Xavier() (as every chapter-5 notebook) on the chosen device, run
once to finish deferred init, and its parameters (BatchNorm's running statistics too) are copied into the torch
model in order, each shape checked.

Training is the book's train_ch5: plain SGD at the notebook's lr; softmax cross entropy summed over the batch, the
update divided by the nominal batch size (`trainer.step(batch_size)`), also for the last, partial batch, which the
book's DataLoader keeps. Images go through load_data_fashion_mnist's Resize (where the notebook resizes) and
ToTensor, dnnbind's transforms on the host, untimed; both frameworks get the same float32 numpy batches.

Data: MNIST digits stand in for Fashion-MNIST, which cannot be fetched offline (same shapes and files), so the
accuracies are not the book's. dnnbind.gluon.data.vision.MNIST finds them ($DNNBIND_MNIST or .data/mnist).

Built-in check: before training, both models score the first training batch in predict mode; from the same weights
the losses agree to ~1e-6. The first training step's loss is printed too; it agrees except where Dropout draws
different masks (alexnet, vgg, nin). Differences that remain: Dropout masks; BatchNorm's running variance averages
the biased batch variance in dnnbind (as MXNet), the unbiased one in torch (a factor m/(m-1), 256/255 at worst
here); FP32 rounding of different algorithms. Epoch times include each batch's host-to-device copy (the book's
`as_in_context`) and, in the first epoch, each framework's algorithm search; `--epochs 2` shows a steady state.
Both sides run strict FP32.

--float64 also trains a float64 copy of each model in each framework, from the same weights on the same batches.
The models whose first epoch sits on the loss plateau at the book's learning rate (NiN and GoogLeNet at lr 0.1) are
chaotic there: FP32 rounding differences, the size of a conv algorithm's, grow until the two runs are unrelated,
whichever frameworks run them. The float64 runs start from differences ~1e9 times smaller, so whether dnnbind's and
torch's float64 runs end alike tells an implementation difference from rounding.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import sys
import time
import types
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind  # noqa: E402

mx = dnnbind.install_mxnet_alias()
from mxnet import autograd, gluon, init, nd  # noqa: E402
from mxnet.gluon import data as gdata  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

SEED = 0
BOOK = "d2l-zh v1.0.0 (MXNet edition), chapter_convolutional-neural-networks"
DATA_NOTE = "MNIST digits stand in for Fashion-MNIST (not available offline): accuracies are not the book's"
CHECK_RTOL = 1e-4  # the predict-mode first-batch losses of the two frameworks must agree to this


# ---- layer constructors: the book's Gluon calls, and the same layers in torch.nn ----------------------------------

def _gluon_seq(*blocks):
    net = nn.Sequential()
    net.add(*blocks)
    return net


GLUON = types.SimpleNamespace(
    Block=nn.Block, seq=_gluon_seq, cat=lambda xs: nd.concat(*xs, dim=1), relu=nd.relu,
    conv=lambda c, k, s=1, p=0, act=None, bias=True: nn.Conv2D(c, kernel_size=k, strides=s, padding=p,
                                                               activation=act, use_bias=bias),
    dense=lambda units, act=None: nn.Dense(units, activation=act),
    maxpool=lambda k, s, p=0: nn.MaxPool2D(pool_size=k, strides=s, padding=p),
    avgpool=lambda k, s: nn.AvgPool2D(pool_size=k, strides=s),
    gap=nn.GlobalAvgPool2D, flatten=nn.Flatten, dropout=nn.Dropout, act=nn.Activation,
    bn=lambda ndim=4: nn.BatchNorm())  # ndim: torch needs BatchNorm1d/2d, Gluon infers it


@functools.cache
def _torch() -> types.SimpleNamespace:
    """torch and the TORCH layer set, on first use (the rest of the script runs without torch)."""
    try:
        import torch
    except ImportError:
        raise SystemExit("d2l_compare.py: the PyTorch side needs torch, which is not installed "
                         "(pip install torch)") from None
    warnings.filterwarnings("ignore", message="Lazy modules are a new feature")
    tnn = torch.nn
    acts = {"relu": tnn.ReLU, "sigmoid": tnn.Sigmoid}

    def conv(c, k, s=1, p=0, act=None, bias=True):
        layer = tnn.LazyConv2d(c, k, s, p, bias=bias)
        return tnn.Sequential(layer, acts[act]()) if act else layer

    def dense(units, act=None):  # Gluon's Dense flattens its input
        return tnn.Sequential(tnn.Flatten(), tnn.LazyLinear(units), *([acts[act]()] if act else []))

    def bn(ndim=4):  # MXNet's momentum 0.9 weighs the old running value; torch's 0.1 weighs the new one
        return (tnn.LazyBatchNorm2d if ndim == 4 else tnn.LazyBatchNorm1d)(eps=1e-5, momentum=0.1)

    layers = types.SimpleNamespace(
        Block=tnn.Module, seq=tnn.Sequential, cat=lambda xs: torch.cat(xs, 1), relu=torch.relu,
        conv=conv, dense=dense, maxpool=tnn.MaxPool2d, avgpool=tnn.AvgPool2d,
        gap=lambda: tnn.AdaptiveAvgPool2d(1), flatten=tnn.Flatten, dropout=tnn.Dropout,
        act=lambda name: acts[name](), bn=bn)
    return types.SimpleNamespace(torch=torch, layers=with_blocks(layers))


def with_blocks(L):
    """Add the chapter's composite blocks to layer set L; children are assigned in the book's order."""

    class Inception(L.Block):  # googlenet.md: four paths joined on the channel axis
        def __init__(self, c1, c2, c3, c4):
            super().__init__()
            self.p1_1 = L.conv(c1, 1, act="relu")
            self.p2_1, self.p2_2 = L.conv(c2[0], 1, act="relu"), L.conv(c2[1], 3, p=1, act="relu")
            self.p3_1, self.p3_2 = L.conv(c3[0], 1, act="relu"), L.conv(c3[1], 5, p=2, act="relu")
            self.p4_1, self.p4_2 = L.maxpool(3, 1, 1), L.conv(c4, 1, act="relu")

        def forward(self, x):
            return L.cat([self.p1_1(x), self.p2_2(self.p2_1(x)), self.p3_2(self.p3_1(x)), self.p4_2(self.p4_1(x))])

    class Residual(L.Block):  # resnet.md (and d2lzh.Residual)
        def __init__(self, channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = L.conv(channels, 3, strides, 1)
            self.conv2 = L.conv(channels, 3, 1, 1)
            self.conv3 = L.conv(channels, 1, strides) if use_1x1conv else None
            self.bn1, self.bn2 = L.bn(), L.bn()

        def forward(self, x):
            y = self.bn2(self.conv2(L.relu(self.bn1(self.conv1(x)))))
            return L.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    class DenseBlock(L.Block):  # densenet.md: each conv_block's output joins its input on the channel axis
        def __init__(self, num_convs, channels):
            super().__init__()
            self.net = L.seq(*[L.seq(L.bn(), L.act("relu"), L.conv(channels, 3, 1, 1)) for _ in range(num_convs)])

        def forward(self, x):
            for blk in self.net:
                x = L.cat([x, blk(x)])
            return x

    class Bottleneck(L.Block):  # ResNet-50 v1.5's (see resnet50 below): 1x1 -> 3x3 (the stride) -> 1x1, x4 out
        def __init__(self, channels, strides=1, downsample=False):
            super().__init__()
            mid = channels // 4
            self.conv1, self.bn1 = L.conv(mid, 1, bias=False), L.bn()
            self.conv2, self.bn2 = L.conv(mid, 3, strides, 1, bias=False), L.bn()
            self.conv3, self.bn3 = L.conv(channels, 1, bias=False), L.bn()
            self.downsample = L.seq(L.conv(channels, 1, strides, bias=False), L.bn()) if downsample else None

        def forward(self, x):
            y = L.relu(self.bn1(self.conv1(x)))
            y = self.bn3(self.conv3(L.relu(self.bn2(self.conv2(y)))))
            return L.relu(y + (self.downsample(x) if self.downsample is not None else x))

    L.Inception, L.Residual, L.DenseBlock, L.Bottleneck = Inception, Residual, DenseBlock, Bottleneck
    return L


with_blocks(GLUON)


# ---- the chapter's models, each written once over a layer set L ---------------------------------------------------

def lenet(L):
    return L.seq(L.conv(6, 5, act="sigmoid"), L.maxpool(2, 2), L.conv(16, 5, act="sigmoid"), L.maxpool(2, 2),
                 L.dense(120, "sigmoid"), L.dense(84, "sigmoid"), L.dense(10))


def _classifier(L):  # alexnet.md and vgg.md end alike
    return [L.dense(4096, "relu"), L.dropout(0.5), L.dense(4096, "relu"), L.dropout(0.5), L.dense(10)]


def alexnet(L):
    return L.seq(L.conv(96, 11, 4, act="relu"), L.maxpool(3, 2), L.conv(256, 5, 1, 2, "relu"), L.maxpool(3, 2),
                 L.conv(384, 3, 1, 1, "relu"), L.conv(384, 3, 1, 1, "relu"), L.conv(256, 3, 1, 1, "relu"),
                 L.maxpool(3, 2), *_classifier(L))


VGG_SMALL_ARCH = [(n, c // 4) for n, c in ((1, 64), (1, 128), (2, 256), (2, 512), (2, 512))]  # ratio = 4


def vgg(L):
    blocks = [L.seq(*[L.conv(c, 3, 1, 1, "relu") for _ in range(n)], L.maxpool(2, 2)) for n, c in VGG_SMALL_ARCH]
    return L.seq(*blocks, *_classifier(L))


def nin(L):
    def block(c, k, s, p):
        return L.seq(L.conv(c, k, s, p, "relu"), L.conv(c, 1, act="relu"), L.conv(c, 1, act="relu"))
    return L.seq(block(96, 11, 4, 0), L.maxpool(3, 2), block(256, 5, 1, 2), L.maxpool(3, 2), block(384, 3, 1, 1),
                 L.maxpool(3, 2), L.dropout(0.5), block(10, 3, 1, 1), L.gap(), L.flatten())


INCEPTIONS = {"b3": [(64, (96, 128), (16, 32), 32), (128, (128, 192), (32, 96), 64)],
              "b4": [(192, (96, 208), (16, 48), 64), (160, (112, 224), (24, 64), 64), (128, (128, 256), (24, 64), 64),
                     (112, (144, 288), (32, 64), 64), (256, (160, 320), (32, 128), 128)],
              "b5": [(256, (160, 320), (32, 128), 128), (384, (192, 384), (48, 128), 128)]}


def googlenet(L):
    b1 = L.seq(L.conv(64, 7, 2, 3, "relu"), L.maxpool(3, 2, 1))
    b2 = L.seq(L.conv(64, 1, act="relu"), L.conv(192, 3, 1, 1, "relu"), L.maxpool(3, 2, 1))
    b3 = L.seq(*[L.Inception(*a) for a in INCEPTIONS["b3"]], L.maxpool(3, 2, 1))
    b4 = L.seq(*[L.Inception(*a) for a in INCEPTIONS["b4"]], L.maxpool(3, 2, 1))
    b5 = L.seq(*[L.Inception(*a) for a in INCEPTIONS["b5"]], L.gap())
    return L.seq(b1, b2, b3, b4, b5, L.dense(10))


def _stem(L):  # resnet.md and densenet.md start alike
    return [L.conv(64, 7, 2, 3), L.bn(), L.act("relu"), L.maxpool(3, 2, 1)]


def resnet(L):  # the section's ResNet-18 (7x7 stem), not d2lzh.resnet18 (3x3 stem, used in later chapters)
    def resnet_block(channels, first_block=False):  # two residuals each
        return L.seq(L.Residual(channels, use_1x1conv=not first_block, strides=1 if first_block else 2),
                     L.Residual(channels))
    return L.seq(*_stem(L), resnet_block(64, first_block=True), resnet_block(128), resnet_block(256),
                 resnet_block(512), L.gap(), L.dense(10))


def densenet(L):
    body, channels, growth_rate, convs = [], 64, 32, [4, 4, 4, 4]
    for i, num_convs in enumerate(convs):
        body.append(L.DenseBlock(num_convs, growth_rate))
        channels += num_convs * growth_rate
        if i != len(convs) - 1:  # transition_block halves the channels
            channels //= 2
            body.append(L.seq(L.bn(), L.act("relu"), L.conv(channels, 1), L.avgpool(2, 2)))
    return L.seq(*_stem(L), *body, L.bn(), L.act("relu"), L.gap(), L.dense(10))


def batch_norm_lenet(L):  # batch-norm.md's concise model (nn.BatchNorm); its from-scratch twin trains the same way
    return L.seq(L.conv(6, 5), L.bn(), L.act("sigmoid"), L.maxpool(2, 2),
                 L.conv(16, 5), L.bn(), L.act("sigmoid"), L.maxpool(2, 2),
                 L.dense(120), L.bn(2), L.act("sigmoid"), L.dense(84), L.bn(2), L.act("sigmoid"), L.dense(10))


# ---- beyond the chapter: the ImageNet ResNet-50 of scripts/bench_models.py --------------------------------------

RESNET50_STAGES = [(3, 256, 1), (4, 512, 2), (6, 1024, 2), (3, 2048, 2)]  # (bottlenecks, channels out, stride)
TORCHVISION_RESNET50_PARAMS = 25_557_032  # torchvision.models.resnet50(): the count resnet50 below must have


def resnet50(L):
    """ResNet-50 v1.5: MXNet model zoo's resnet50_v1 layout (BottleneckV1, stages [3, 4, 6, 3], 7x7/2 stem without
    bias, 3x3/2 max pool, global average pool, Dense 1000) with the stride on the 3x3 conv instead of the first 1x1,
    as NVIDIA's and torchvision's resnet50 (and GluonCV's resnet50_v1b). NOTE: MXNet zoo's BottleneckV1 leaves
    use_bias at its default (True) on the two 1x1 convs of the body, 18,880 biases a BatchNorm cancels; they are
    left out here, as in torchvision, so the model has torchvision's 25,557,032 parameters."""
    stem = [L.conv(64, 7, 2, 3, bias=False), L.bn(), L.act("relu"), L.maxpool(3, 2, 1)]
    stages = [L.seq(L.Bottleneck(channels, strides, downsample=True),  # the first block of each stage projects
                    *[L.Bottleneck(channels) for _ in range(n - 1)]) for n, channels, strides in RESNET50_STAGES]
    return L.seq(*stem, *stages, L.gap(), L.dense(1000))


# ---- the spec table: one row per notebook, the values its .md file sets ------------------------------------------

@dataclass(frozen=True)
class Spec:
    notebook: str          # chapter_convolutional-neural-networks/<notebook>
    arch: Callable         # layer set -> model
    size: int              # input height = width: load_data_fashion_mnist(resize=...); 28 is no resize
    lr: float
    batch_size: int
    channels: int = 1      # input channels (MNIST's 1; ImageNet's 3 for ZOO_SPECS)
    classes: int = 10

    def build_mx(self):  # dnnbind Gluon (through the mxnet alias), not yet initialized
        return self.arch(GLUON)

    def build_torch(self):  # torch.nn with lazy layers, not yet materialized
        return self.arch(_torch().layers)


INIT = init.Xavier  # every chapter-5 notebook: net.initialize(..., init=init.Xavier())
SPECS = {
    "lenet": Spec("lenet.md", lenet, 28, 0.9, 256),
    "alexnet": Spec("alexnet.md", alexnet, 224, 0.01, 128),
    "vgg": Spec("vgg.md", vgg, 224, 0.05, 128),
    "nin": Spec("nin.md", nin, 224, 0.1, 128),
    "googlenet": Spec("googlenet.md", googlenet, 96, 0.1, 128),
    "resnet": Spec("resnet.md", resnet, 96, 0.05, 256),
    "densenet": Spec("densenet.md", densenet, 96, 0.1, 256),
    "batch-norm": Spec("batch-norm.md", batch_norm_lenet, 28, 1.0, 256),
}
# Models outside the chapter (not trained by this script): benchmarked by bench_models.py on random ImageNet-shaped
# batches; "notebook" names the model's source. SGD lr 0.1 momentum 0.9 at batch 256: torchvision's ImageNet recipe
# (0.1 per 256 images, Goyal et al.), without its warm-up and schedule.
ZOO_SPECS = {
    "resnet50": Spec("MXNet model zoo resnet50_v1, stride on the 3x3 (v1.5)", resnet50, 224, 0.1, 256, 3, 1000),
}


def num_trainable(net) -> int:
    """The Gluon model's parameter count as torch counts it: weights, biases, BatchNorm's gamma and beta; not
    BatchNorm's running statistics (grad_req 'null')."""
    return int(sum(p.data().size for p in net.collect_params().values() if p.grad_req != "null"))


def build_pair(spec: Spec, ctx, seed: int = SEED):
    """(dnnbind model initialized on ctx, torch model on the host holding the same values, paired_params)."""
    torch = _torch().torch
    mx.random.seed(seed)  # also seeds numpy's global generator, which dnnbind's initializers draw from
    torch.manual_seed(seed)  # torch's Dropout masks
    net = spec.build_mx()
    net.initialize(INIT(), ctx=ctx)
    net(nd.zeros((2, spec.channels, spec.size, spec.size), ctx=ctx))  # predict mode: finishes deferred init
    tnet = spec.build_torch().eval()
    pairs = paired_params(net, tnet, spec.size, spec.channels)
    with torch.no_grad():
        for name, p, tname, t in pairs:
            value = p.data().asnumpy()
            if value.shape != tuple(t.shape):
                raise ValueError(f"{name} {value.shape} does not fit torch's {tname} {tuple(t.shape)}")
            t.copy_(torch.from_numpy(value))
    return net, tnet.train(), pairs


def paired_params(net, tnet, size: int, channels: int = 1) -> list:
    """[(Gluon name, Parameter, torch name, tensor)] in registration order, after one forward of the torch model
    (which materializes its lazy layers). The tensors come from state_dict: parameters and BatchNorm's running
    buffers, sharing storage with the model."""
    torch = _torch().torch
    with torch.no_grad():
        tnet(torch.zeros(2, channels, size, size))
    src = list(net.collect_params().items())
    dst = [(k, v) for k, v in tnet.state_dict().items() if not k.endswith("num_batches_tracked")]
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} Gluon parameters but {len(dst)} torch tensors:\n"
                         f"  gluon: {[k for k, _ in src]}\n  torch: {[k for k, _ in dst]}")
    return [(k, p, tk, t) for (k, p), (tk, t) in zip(src, dst, strict=True)]


# ---- data: MNIST through d2l's transforms, the same numpy batches for both frameworks -----------------------------

def _chunked(fn, src: np.ndarray, out: np.ndarray, chunk: int = 512) -> np.ndarray:
    """out[i:i+chunk] = fn(src[i:i+chunk]) on a thread pool (numpy releases the GIL in the heavy parts)."""
    def work(i):
        out[i:i + chunk] = fn(src[i:i + chunk])
    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(work, range(0, len(src), chunk)))
    return out


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, 28, 28, 1) -> uint8 (N, size, size, 1): gdata.vision.transforms.Resize(size); none at 28."""
    if size == images.shape[1]:
        return images
    return _chunked(gdata.vision.transforms.Resize(size), images, np.empty((len(images), size, size, 1), np.uint8))


def to_tensor(images: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W, C) -> float32 (N, C, H, W) in [0, 1]: gdata.vision.transforms.ToTensor()."""
    n, h, w, c = images.shape
    return _chunked(gdata.vision.transforms.ToTensor(), images, np.empty((n, c, h, w), np.float32))


@functools.lru_cache(maxsize=1)
def train_raw():
    ds = gdata.vision.MNIST(train=True)
    return ds.data, np.asarray(ds.label)


@functools.lru_cache(maxsize=1)
def train_resized(size: int) -> np.ndarray:  # once per input size: alexnet, vgg and nin share 224
    return resize(train_raw()[0], size)


@functools.lru_cache(maxsize=1)
def test_set(size: int, n: int):
    ds = gdata.vision.MNIST(train=False)
    return to_tensor(resize(ds.data[:n], size)), np.asarray(ds.label[:n])


# ---- one epoch and the predictions, per framework -----------------------------------------------------------------

def _layout(x: np.ndarray, layout: str) -> np.ndarray:
    """A one-channel NCHW batch as the model's layout: NHWC is the same bytes, reshaped."""
    return x.reshape(x.shape[0], x.shape[2], x.shape[3], 1) if layout == "NHWC" else x


def epoch_mx(net, trainer, x, y, bs, ctx, dtype="float32", layout="NCHW"):
    """train_ch5's loop; returns (seconds, mean loss, first batch's mean loss)."""
    loss_fn, losses = gluon.loss.SoftmaxCrossEntropyLoss(), []
    mx.nd.waitall()
    t0 = time.perf_counter()
    for i in range(0, len(y), bs):
        X = nd.array(_layout(x[i:i + bs], layout), ctx=ctx, dtype=dtype)
        Y = nd.array(y[i:i + bs], ctx=ctx, dtype=dtype)
        with autograd.record():
            loss = loss_fn(net(X), Y).sum()
        loss.backward()
        trainer.step(bs)  # the nominal batch size, also for a last partial batch, as train_ch5
        losses.append(loss)
    mx.nd.waitall()
    secs = time.perf_counter() - t0
    values = [float(v.asscalar()) for v in losses]
    return secs, sum(values) / len(y), values[0] / min(bs, len(y))


def epoch_torch(tnet, opt, x, y, bs, dev, dtype="float32"):
    torch, losses = _torch().torch, []
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for i in range(0, len(y), bs):
        X = torch.from_numpy(x[i:i + bs]).to(dev, getattr(torch, dtype))
        Y = torch.from_numpy(y[i:i + bs]).to(dev).long()
        loss = torch.nn.functional.cross_entropy(tnet(X), Y, reduction="sum")
        opt.zero_grad(set_to_none=True)
        (loss / bs).backward()  # the summed loss's gradient divided by the nominal batch size, as trainer.step
        opt.step()
        losses.append(loss.detach())
    sync()
    secs = time.perf_counter() - t0
    values = [float(v) for v in losses]
    return secs, sum(values) / len(y), values[0] / min(bs, len(y))


def logits_mx(net, x, ctx, dtype="float32", layout="NCHW"):  # outside autograd.record(): predict mode, Dropout
    return net(nd.array(_layout(x, layout), ctx=ctx, dtype=dtype)).asnumpy()  # off, BN on running statistics


def logits_torch(tnet, x, dev, dtype="float32"):
    torch = _torch().torch
    tnet.eval()
    with torch.no_grad():
        out = tnet(torch.from_numpy(x).to(dev, getattr(torch, dtype))).cpu().numpy()
    tnet.train()
    return out


def accuracy(logits_fn, x, y, bs) -> float:
    return sum(int((logits_fn(x[i:i + bs]).argmax(1) == y[i:i + bs]).sum()) for i in range(0, len(y), bs)) / len(y)


def mean_xent(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits.astype(np.float64)
    z -= z.max(1, keepdims=True)
    return float((np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]).mean())


# ---- driver -------------------------------------------------------------------------------------------------------

def compare(name: str, args, ctx, dev) -> dict:
    spec, torch = SPECS[name], _torch().torch
    bs, rng = spec.batch_size, np.random.default_rng(args.seed)  # every model sees the same data order
    net, tnet, pairs = build_pair(spec, ctx, args.seed)
    tnet.to(dev)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": spec.lr})
    opt = torch.optim.SGD(tnet.parameters(), lr=spec.lr)
    labels = train_raw()[1]
    whole = args.limit_batches is None
    n_train = len(labels) if whole else min(len(labels), args.limit_batches * bs)
    tx, ty = test_set(spec.size, 10000 if whole else min(10000, args.limit_batches * bs))
    row = {"model": name, "notebook": spec.notebook, "size": spec.size, "lr": spec.lr, "batch_size": bs,
           "init": "Xavier()", "num_params": int(sum(p.data().size for _, p, _, _ in pairs)), "epochs": []}
    twins = float64_twins(spec, net, tnet, ctx) if args.float64 else None
    half = float16_twin(spec, net, ctx, args.nhwc) if args.float16 else None
    for epoch in range(args.epochs):
        perm = rng.permutation(len(labels))[:n_train]  # drawn once, used by both frameworks
        t0 = time.perf_counter()
        # whole epochs resize the training set once per input size; smoke runs resize only the images they use
        x = to_tensor(train_resized(spec.size)[perm] if whole else resize(train_raw()[0][perm], spec.size))
        y = labels[perm]
        if epoch == 0:  # the weight-copy check: same weights, same batch, predict mode
            print(f"  data ready in {time.perf_counter() - t0:.1f} s (not timed)", flush=True)
            lm, lt = logits_mx(net, x[:bs], ctx), logits_torch(tnet, x[:bs], dev)
            row["check"] = {"loss_dnnbind": mean_xent(lm, y[:bs]), "loss_torch": mean_xent(lt, y[:bs]),
                            "max_abs_logit_diff": float(np.abs(lm - lt).max())}
        s_mx, loss_mx, first_mx = epoch_mx(net, trainer, x, y, bs, ctx)
        s_t, loss_t, first_t = epoch_torch(tnet, opt, x, y, bs, dev)
        if epoch == 0:
            row["check"].update(first_step_loss_dnnbind=first_mx, first_step_loss_torch=first_t)
        acc_mx = accuracy(lambda b: logits_mx(net, b, ctx), tx, ty, bs)
        acc_t = accuracy(lambda b: logits_torch(tnet, b, dev), tx, ty, bs)
        row["epochs"].append({"epoch": epoch + 1, "seconds_dnnbind": s_mx, "seconds_torch": s_t,
                              "train_loss_dnnbind": loss_mx, "train_loss_torch": loss_t,
                              "test_acc_dnnbind": acc_mx, "test_acc_torch": acc_t})
        print(f"  epoch {epoch + 1}: dnnbind {s_mx:.2f} s, loss {loss_mx:.4f}, test acc {acc_mx:.4f} | "
              f"torch {s_t:.2f} s, loss {loss_t:.4f}, test acc {acc_t:.4f}", flush=True)
        if twins:
            row["epochs"][-1].update(train_float64(twins, x, y, bs, tx, ty, ctx, dev))
        if half:
            s16, loss16, _ = epoch_mx(half["net"], half["trainer"], x, y, bs, ctx, "float16", half["layout"])
            acc16 = accuracy(lambda b: logits_mx(half["net"], b, ctx, "float16", half["layout"]), tx, ty, bs)
            print(f"  float16 twin (net.cast, float32 master weights{half['what']}): dnnbind {s16:.2f} s, "
                  f"loss {loss16:.4f}, "
                  f"test acc {acc16:.4f}", flush=True)
            row["epochs"][-1].update(seconds_dnnbind_f16=s16, train_loss_dnnbind_f16=loss16,
                                     test_acc_dnnbind_f16=acc16)
    c = row["check"]
    c["ok"] = abs(c["loss_dnnbind"] - c["loss_torch"]) <= CHECK_RTOL * max(1.0, abs(c["loss_torch"]))
    print(f"  check, first batch from the copied weights (predict mode): loss dnnbind {c['loss_dnnbind']:.6f}, "
          f"torch {c['loss_torch']:.6f}, max |logit diff| {c['max_abs_logit_diff']:.1e} "
          f"[{'ok' if c['ok'] else 'MISMATCH'}]; first training step's loss: dnnbind "
          f"{c['first_step_loss_dnnbind']:.6f}, torch {c['first_step_loss_torch']:.6f}", flush=True)
    return row


def _cast_copy(spec, net, ctx, dtype: str):
    """Another dnnbind model of ``spec`` holding ``net``'s current values, cast to ``dtype`` (its deferred init
    finished by one predict-mode forward, as build_pair does)."""
    twin = spec.build_mx()
    twin.initialize(INIT(), ctx=ctx)
    twin(nd.zeros((2, spec.channels, spec.size, spec.size), ctx=ctx))
    for pt, p in zip(twin.collect_params().values(), net.collect_params().values(), strict=True):
        pt.set_data(p.data())
    twin.cast(dtype)
    return twin


def float64_twins(spec, net, tnet, ctx) -> dict:
    """float64 copies of both models from the same initial weights, each with its own SGD (--float64). FP32
    rounding differences grow in a chaotic training (see --float64 in the module docstring); in float64 they
    start 1e9 times smaller, so the two frameworks' float64 runs show whether the implementations agree over a
    whole epoch, and float64 against FP32 shows how far FP32 rounding alone moves one framework's result."""
    net64 = _cast_copy(spec, net, ctx, "float64")
    t64 = copy.deepcopy(tnet).double()
    return {"net": net64, "trainer": gluon.Trainer(net64.collect_params(), "sgd", {"learning_rate": spec.lr}),
            "tnet": t64, "opt": _torch().torch.optim.SGD(t64.parameters(), lr=spec.lr)}


def float16_twin(spec, net, ctx, nhwc: bool = False) -> dict:
    """dnnbind's model in mixed precision from the same initial weights (--float16): net.cast('float16')
    (BatchNorm stays float32) and SGD with float32 master weights (multi_precision), MXNet's recipe. With
    ``nhwc`` (--nhwc): the channels-last twin with BatchNormAddRelu (scripts/bench_nhwc.py), hybridized, the
    benchmark's fastest ResNet-18 mode."""
    if nhwc:
        import bench_nhwc
        net16 = bench_nhwc.build(spec, net, ctx)
        net16.cast("float16")
        net16.hybridize()
    else:
        net16 = _cast_copy(spec, net, ctx, "float16")
    return {"net": net16, "layout": "NHWC" if nhwc else "NCHW",
            "what": ", NHWC + BatchNormAddRelu, hybridize()" if nhwc else "",
            "trainer": gluon.Trainer(net16.collect_params(), "sgd", {"learning_rate": spec.lr,
                                                                    "multi_precision": True})}


def train_float64(twins, x, y, bs, tx, ty, ctx, dev) -> dict:
    """One epoch of both float64 twins on the same batches; their losses and test accuracies."""
    net, tnet = twins["net"], twins["tnet"]
    s_mx, loss_mx, _ = epoch_mx(net, twins["trainer"], x, y, bs, ctx, "float64")
    s_t, loss_t, _ = epoch_torch(tnet, twins["opt"], x, y, bs, dev, "float64")
    acc_mx = accuracy(lambda b: logits_mx(net, b, ctx, "float64"), tx, ty, bs)
    acc_t = accuracy(lambda b: logits_torch(tnet, b, dev, "float64"), tx, ty, bs)
    print(f"  float64 twins: dnnbind {s_mx:.2f} s, loss {loss_mx:.4f}, test acc {acc_mx:.4f} | "
          f"torch {s_t:.2f} s, loss {loss_t:.4f}, test acc {acc_t:.4f}", flush=True)
    return {"train_loss_dnnbind_f64": loss_mx, "train_loss_torch_f64": loss_t,
            "test_acc_dnnbind_f64": acc_mx, "test_acc_torch_f64": acc_t}


def print_table(rows, title):
    cols = (f"{'model':<11}{'s dnnbind':>10}{'s torch':>9}{'acc dnnbind':>13}{'acc torch':>11}{'diff pp':>9}"
            f"{'loss0 dnnbind':>15}{'loss0 torch':>13}  check")
    print(f"\n{title}\n{cols}\n{'-' * len(cols)}")
    for r in rows:
        e, c = r["epochs"][-1], r["check"]
        print(f"{r['model']:<11}{e['seconds_dnnbind']:>10.2f}{e['seconds_torch']:>9.2f}"
              f"{100 * e['test_acc_dnnbind']:>12.2f}%{100 * e['test_acc_torch']:>10.2f}%"
              f"{100 * (e['test_acc_dnnbind'] - e['test_acc_torch']):>+9.2f}"
              f"{c['loss_dnnbind']:>15.6f}{c['loss_torch']:>13.6f}  {'ok' if c['ok'] else 'MISMATCH'}")
    print("s, acc: the last epoch; diff pp: dnnbind - torch, percentage points; loss0: the first training batch "
          "scored in predict mode before training (the weight-copy check)")
    f16 = [r for r in rows if "test_acc_dnnbind_f16" in r["epochs"][-1]]
    if f16:
        print(f"\nmixed precision (dnnbind, net.cast('float16')) against FP32, test accuracy\n"
              f"{'model':<11}{'fp32 dnnbind':>14}{'fp16 dnnbind':>14}{'diff pp':>9}{'fp32 torch':>12}")
        for r in f16:
            e = r["epochs"][-1]
            print(f"{r['model']:<11}{100 * e['test_acc_dnnbind']:>13.2f}%{100 * e['test_acc_dnnbind_f16']:>13.2f}%"
                  f"{100 * (e['test_acc_dnnbind_f16'] - e['test_acc_dnnbind']):>+9.2f}"
                  f"{100 * e['test_acc_torch']:>11.2f}%")
    f64 = [r for r in rows if "test_acc_torch_f64" in r["epochs"][-1]]
    if f64:
        cols = f"{'model':<11}{'fp32 dnnbind':>14}{'fp32 torch':>12}{'fp64 dnnbind':>14}{'fp64 torch':>12}"
        print(f"\nfloat64 twins (same weights, same batches), test accuracy\n{cols}\n{'-' * len(cols)}")
        for r in f64:
            e = r["epochs"][-1]
            print(f"{r['model']:<11}" + "".join(f"{100 * e[k]:>{w - 1}.2f}%" for k, w in (
                ("test_acc_dnnbind", 14), ("test_acc_torch", 12), ("test_acc_dnnbind_f64", 14),
                ("test_acc_torch_f64", 12))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(SPECS), default=list(SPECS), metavar="MODEL",
                   help=f"any of: {' '.join(SPECS)} (default: all)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-batches", type=int, default=None, metavar="K",
                   help="train on the first K batches, test on the first K test batches (smoke runs)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--bn-mode", choices=("persistent", "spatial"), default="persistent",
                   help="dnnbind's training BatchNorm algorithm (dnnbind.set_batchnorm_mode)")
    p.add_argument("--nhwc", action="store_true",
                   help="with --float16: the float16 model channels-last with BatchNormAddRelu, hybridized (ResNet)")
    p.add_argument("--float16", action="store_true",
                   help="also train dnnbind's model in mixed precision (net.cast('float16'), float32 master weights)")
    p.add_argument("--float64", action="store_true",
                   help="also train float64 copies of both models from the same weights on the same batches")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    dnnbind.set_batchnorm_mode(args.bn_mode)
    torch = _torch().torch
    ctx = mx.gpu(0) if args.device == "gpu" else mx.cpu()
    dev = torch.device("cuda" if args.device == "gpu" else "cpu")
    if args.device == "gpu":  # strict FP32, as dnnbind by default; cuDNN autotunes its algorithms
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    limit = "" if args.limit_batches is None else f", first {args.limit_batches} batches only"
    print(f"{BOOK}\n{DATA_NOTE}\ndevice {args.device}, {args.epochs} epoch(s){limit}, seed {args.seed}, "
          f"torch {torch.__version__}", flush=True)
    rows = []
    for name in args.models:
        s = SPECS[name]
        print(f"{name}: {s.notebook}, {s.size}x{s.size}, lr {s.lr}, batch {s.batch_size}, init Xavier()", flush=True)
        rows.append(compare(name, args, ctx, dev))
    print_table(rows, f"{BOOK}: dnnbind vs PyTorch, {args.device}, {args.epochs} epoch(s){limit}\n{DATA_NOTE}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        config = {"book": BOOK, "data": DATA_NOTE, "device": args.device, "epochs": args.epochs,
                  "limit_batches": args.limit_batches, "seed": args.seed, "torch": torch.__version__,
                  "bn_mode": args.bn_mode,
                  "numpy": np.__version__, "python": platform.python_version(),
                  "gpu": torch.cuda.get_device_name(0) if args.device == "gpu" else None,
                  "math": "strict FP32 (dnnbind's default; torch with TF32 off)"}
        with open(args.json, "w") as f:
            json.dump({"config": config, "models": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
