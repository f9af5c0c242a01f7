"""The seeds' SimpleCNN for 28x28 MNIST digits. Layer: models; imports dnnbind.gluon and dnnbind.nd only.

conv 1->32 3x3 pad 1, relu, max-pool 2 -> conv 32->64 3x3 pad 1, relu, max-pool 2 -> dense 3136->128, relu
-> dense 128->10 (logits). Written exactly as the MXNet seed writes it (name_scope, deferred in_channels /
in_units), so the seed's code runs unchanged with ``import dnnbind as mx``.
"""

from __future__ import annotations

from dnnbind import gluon, nd
from dnnbind.gluon import nn


class SimpleCNN(gluon.Block):
    """``fuse_relu=True`` gives the convolutions ``activation="relu"``: the same function and parameters, but
    each conv+bias+ReLU is one cudnnConvolutionBiasActivationForward on the GPU (scripts/train.py, bench.py)."""

    def __init__(self, prefix=None, params=None, fuse_relu: bool = False):
        super().__init__(prefix=prefix, params=params)
        self.fuse_relu = fuse_relu
        act = "relu" if fuse_relu else None
        with self.name_scope():
            self.conv1 = nn.Conv2D(32, kernel_size=3, strides=1, padding=1, activation=act)
            self.conv2 = nn.Conv2D(64, kernel_size=3, strides=1, padding=1, activation=act)
            self.fc1 = nn.Dense(128)
            self.fc2 = nn.Dense(10)

    def forward(self, x):
        x = self.conv1(x) if self.fuse_relu else nd.relu(self.conv1(x))
        x = nd.Pooling(x, pool_type="max", kernel=(2, 2), stride=(2, 2))
        x = self.conv2(x) if self.fuse_relu else nd.relu(self.conv2(x))
        x = nd.Pooling(x, pool_type="max", kernel=(2, 2), stride=(2, 2))
        x = x.reshape((0, -1))  # flatten: (N, 64, 7, 7) -> (N, 3136)
        x = nd.relu(self.fc1(x))
        return self.fc2(x)


def to_torch(net: SimpleCNN, device: str = "cuda"):
    """The same network in PyTorch, holding a copy of ``net``'s weights (parity tests, benchmarks).

    PyTorch's Conv2d/Linear weights have dnnbind's layouts ((K, C, R, S) and (units, in)), so the copy is 1:1.
    """
    import torch
    tnet = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, 1, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, 1, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(3136, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    # By path (save_parameters' names): collect_params() keys are full names that count up per process (MXNet's).
    params = net._collect_params_with_prefix()
    names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight",
             "fc2.bias"]
    with torch.no_grad():
        for p, name in zip(tnet.parameters(), names):
            p.copy_(torch.from_numpy(params[name].data().numpy()))
    return tnet
