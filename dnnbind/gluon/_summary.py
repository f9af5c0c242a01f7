"""``Block.summary(*inputs)``: MXNet 1.x's layer table, from forward hooks. Layer: gluon; imports gluon only.

A hook on every Block but the Sequential containers records, after each call, the output shape(s) and the
Block's own Parameters (a Parameter seen in an earlier row counts as shared). Rows come in the order the calls
finish, so a child's row precedes its parent's, and are numbered ``Dense-1``, ``Conv2D-2``, ... after the
``Input`` row, in MXNet's format. Unlike MXNet 1.9, a Block that appears twice in the tree gets one hook, not
two (MXNet prints each of its calls twice).
"""

from __future__ import annotations

from collections import OrderedDict

from ..runtime.array import NDArray

__all__ = ["summary"]

_LINE = "{:>20}  {:>42} {:>15}"


def _shapes(x):
    if isinstance(x, (list, tuple)):
        return [_shapes(v) for v in x]
    return x.shape if isinstance(x, NDArray) else x


def shape_str(x) -> str:
    """MXNet's rendering: a shape tuple, or the shapes of a (nested) list/tuple without the outer brackets."""
    shapes = _shapes(x)
    return str(shapes)[1:-1] if isinstance(shapes, list) else str(shapes)


def _own_params(block) -> list:
    """The Parameters a Block holds itself (assigned, or made with ``self.params.get``), each once."""
    out = OrderedDict()
    for p in list(block._reg_params.values()) + list(block.params.values()):
        if p is not None:
            out.setdefault(id(p), p)
    return list(out.values())


def summary(block, *inputs) -> None:
    """Print ``block``'s table for a call on ``inputs`` (see the module docstring)."""
    rows = [("Input", shape_str(inputs), 0, 0, 0)]  # (name, output shape, params, trainable, shared)
    seen: set[int] = set()

    def hook(b, _inputs, outputs):
        total = trainable = shared = 0
        for p in _own_params(b):
            size = p.data().size
            total += size
            trainable += 0 if p.grad_req == "null" else size
            if id(p) in seen:
                shared += size
            else:
                seen.add(id(p))
        rows.append((f"{type(b).__name__}-{len(rows)}", shape_str(outputs), total, trainable, shared))

    handles, hooked = [], set()

    def attach(b):
        if b._summary_row and id(b) not in hooked:  # a container (Sequential) has no row of its own
            hooked.add(id(b))
            handles.append(b.register_forward_hook(hook))

    try:
        block.apply(attach)
        block(*inputs)
    finally:
        for h in handles:
            h.detach()
    total = sum(r[2] for r in rows)
    trainable = sum(r[3] for r in rows)
    shared = sum(r[4] for r in rows)
    print("-" * 80)
    print(_LINE.format("Layer (type)", "Output Shape", "Param #"))
    print("=" * 80)
    for name, shape, n, _, _ in rows:
        print(_LINE.format(name, shape, n))
    print("=" * 80)
    print("Parameters in forward computation graph, duplicate included")
    print("   Total params: " + str(total))
    print("   Trainable params: " + str(trainable))
    print("   Non-trainable params: " + str(total - trainable))
    print("Shared params in forward computation graph: " + str(shared))
    print("Unique parameters in model: " + str(total - shared))
    print("-" * 80)
