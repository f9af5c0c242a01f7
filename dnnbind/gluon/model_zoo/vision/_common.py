"""What the model-zoo networks share: MXNet's ``gluon.contrib.nn`` HybridConcurrent and Identity (which dnnbind's
gluon.contrib does not offer publicly yet) and the ``pretrained=True`` loader.
Layer: gluon; imports runtime, gluon.block and gluon.model_zoo.model_store.

The two blocks keep MXNet's class names: a Block without a prefix is named after its class
(``hybridconcurrent0_``), and their counters are part of every name made after them in the same scope.
"""

from __future__ import annotations

from .... import runtime
from ...block import HybridBlock
from ..model_store import get_model_file


class HybridConcurrent(HybridBlock):
    """Runs every child on the same input and concatenates their outputs along ``axis`` (inception's and
    squeezenet's branches, densenet's x ++ f(x))."""

    def __init__(self, axis: int = -1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def add(self, *blocks) -> HybridConcurrent:
        for block in blocks:
            self.register_child(block)  # named by index, as Sequential's: save_parameters' keys are 0.weight, ...
        return self

    def hybrid_forward(self, F, x):
        # hybrid_forward (not forward): export and the symbolic shape inference trace it with F = symbol
        return F.concat(*[child(x) for child in self._children.values()], dim=self.axis)

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, i):
        return list(self._children.values())[i]


class Identity(HybridBlock):
    """Returns its input (densenet's shortcut branch)."""

    def hybrid_forward(self, F, x):
        return x


def load_pretrained(net, name: str, root, ctx):
    """``pretrained=True``: load ``<root>/<name>-<hash>.params`` (root None: ``$MXNET_HOME/models``) with
    load_parameters onto ``ctx`` (None: cpu(), MXNet's default), so MXNet's own files load."""
    net.load_parameters(get_model_file(name, root=root), ctx=ctx if ctx is not None else runtime.cpu())
    return net
