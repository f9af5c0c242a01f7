"""Block.summary(*inputs) prints MXNet 1.x's table; the parameter counts are checked against a hand computation and
the whole text against what MXNet 1.9.1 prints for the same networks (CPU wheel on Python 3.8). Also the forward
hook handles summary relies on."""

from __future__ import annotations

import re

import pytest

import dnnbind
from dnnbind import nd
from dnnbind.gluon import nn

# mxnet 1.9.1: nn.Sequential of Conv2D(4, 3, in_channels=2), BatchNorm(), Activation('relu'), Dense(5), summary of
# nd.ones((2, 2, 6, 6)).
MXNET_TABLE = """\
--------------------------------------------------------------------------------
        Layer (type)                                Output Shape         Param #
================================================================================
               Input                                (2, 2, 6, 6)               0
            Conv2D-1                                (2, 4, 4, 4)              76
         BatchNorm-2                                (2, 4, 4, 4)              16
        Activation-3                                (2, 4, 4, 4)               0
             Dense-4                                      (2, 5)             325
================================================================================
Parameters in forward computation graph, duplicate included
   Total params: 417
   Trainable params: 409
   Non-trainable params: 8
Shared params in forward computation graph: 0
Unique parameters in model: 417
--------------------------------------------------------------------------------
"""

# mxnet 1.9.1: a Block with two inputs, returning (Dense(3)(x), [y, y * 2]) for x (2, 5), y (2,).
MXNET_TWO_IO = """\
               Input                                (2, 5), (2,)               0
             Dense-1                                      (2, 3)              18
               Two-2                        (2, 3), [(2,), (2,)]               0
"""


def _rows(text):
    """{layer: (output shape, params)} and the footer counts."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\S+)\s{2,}(.*?)\s+(\d+)$", line)
        if m and m.group(1) != "Layer":
            rows[m.group(1)] = (m.group(2).strip(), int(m.group(3)))
    counts = {k: int(v) for k, v in re.findall(r"(Total|Trainable|Non-trainable) params: (\d+)", text)}
    return rows, counts


def _cnn():
    net = nn.Sequential()
    net.add(nn.Conv2D(4, 3, in_channels=2), nn.BatchNorm(), nn.Activation("relu"), nn.Dense(5))
    net.initialize()
    return net


def test_counts_match_a_hand_computation_and_mxnet_text(capsys):
    net = _cnn()
    net.summary(nd.ones((2, 2, 6, 6)))
    out = capsys.readouterr().out
    rows, counts = _rows(out)
    conv = 4 * 2 * 3 * 3 + 4                    # weight (4, 2, 3, 3) + bias
    bn_trainable, bn_fixed = 2 * 4, 2 * 4       # gamma, beta | running mean, running var
    dense = (4 * 4 * 4) * 5 + 5                 # flattened (4, 4, 4) -> 5, + bias
    assert rows["Conv2D-1"] == ("(2, 4, 4, 4)", conv)
    assert rows["BatchNorm-2"] == ("(2, 4, 4, 4)", bn_trainable + bn_fixed)
    assert rows["Activation-3"] == ("(2, 4, 4, 4)", 0)
    assert rows["Dense-4"] == ("(2, 5)", dense)
    total = conv + bn_trainable + bn_fixed + dense
    assert counts == {"Total": total, "Trainable": total - bn_fixed, "Non-trainable": bn_fixed}
    assert out == MXNET_TABLE
    assert all(not b._forward_hooks for b in (net, *net._children.values()))  # hooks removed afterwards


def test_nested_blocks_multi_io_and_shared_parameters(capsys):
    class Net(nn.Block):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential()
            self.body.add(nn.Dense(3), nn.Dense(2))
            self.out = nn.Dense(1)

        def forward(self, x):
            return self.out(self.body(x))

    net = Net()
    net.initialize()
    net.summary(nd.ones((4, 7)))
    rows, counts = _rows(capsys.readouterr().out)
    # children finish first; Sequential containers are not rows; the custom Block is, with no own parameters
    assert list(rows) == ["Input", "Dense-1", "Dense-2", "Dense-3", "Net-4"]
    assert [rows[k][1] for k in rows] == [0, 7 * 3 + 3, 3 * 2 + 2, 2 * 1 + 1, 0]
    assert counts["Total"] == 35 and rows["Net-4"][0] == "(4, 1)"

    class Two(nn.Block):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(3)

        def forward(self, x, y):
            return self.a(x), [y, y * 2]

    two = Two()
    two.initialize()
    two.summary(nd.ones((2, 5)), nd.ones((2,)))
    assert MXNET_TWO_IO in capsys.readouterr().out

    shared = nn.Dense(4, in_units=4)
    seq = nn.Sequential()
    seq.add(shared, nn.Dense(4, in_units=4), shared)
    seq.initialize()
    seq.summary(nd.ones((1, 4)))
    out = capsys.readouterr().out
    rows, counts = _rows(out)
    assert list(rows) == ["Input", "Dense-1", "Dense-2", "Dense-3"]  # one row per call
    assert counts["Total"] == 60 and "Shared params in forward computation graph: 20" in out
    assert "Unique parameters in model: 40" in out


def test_summary_detaches_hooks_when_forward_fails():
    net = nn.Sequential()
    net.add(nn.Dense(3, in_units=4))
    net.initialize()
    with pytest.raises(ValueError, match=r"has 5 features \(flatten=True\) but weight \(3, 4\) expects 4"):
        net.summary(nd.ones((2, 5)))  # wrong width
    assert not net[0]._forward_hooks


def test_hook_handles_detach():
    calls = []
    d = nn.Dense(2, in_units=2)
    d.initialize()
    handle = d.register_forward_hook(lambda b, i, o: calls.append("post"))
    with d.register_forward_pre_hook(lambda b, i: calls.append("pre")):
        d(nd.ones((1, 2)))
    d(nd.ones((1, 2)))
    handle.detach()
    handle.detach()  # twice is harmless
    d(nd.ones((1, 2)))
    assert calls == ["pre", "post", "post"]
    assert dnnbind.gluon.block.HookHandle is type(handle)
