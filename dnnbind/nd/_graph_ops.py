"""Layer nd: the operators about the autograd graph rather than values: ``BlockGrad``/``stop_gradient`` and
``identity``/``_copy``, one registry entry each. Imports nd._registry and autograd."""

from __future__ import annotations

from .. import autograd
from ..runtime.array import NDArray
from ._registry import as_array, composite


def block_grad(data) -> NDArray:
    """MXNet's BlockGrad: a new array (a detached view would let a write into it change ``data``), untaped; still
    in the graph while recording when ``data`` is (writes into it are refused, as in MXNet)."""
    data = data if type(data) is NDArray else as_array("BlockGrad", "data", data)
    out = data.detach().copy()
    if autograd.is_recording():
        autograd.hold(out, (data,))
    return out


def identity(data) -> NDArray:
    """MXNet's identity (``_copy``): a copy, taped (its gradient passes through)."""
    data = data if type(data) is NDArray else as_array("identity", "data", data)
    return data.copy()


composite("BlockGrad", block_grad, nd=("BlockGrad", "stop_gradient"))
composite("_copy", identity, nd=("identity", "_copy"))
