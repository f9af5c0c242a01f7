"""``gluon.SymbolBlock``: a Block whose forward is a symbol graph, MXNet 1.x's way to run (and fine-tune) a model
exported to ``-symbol.json`` + ``.params`` files (``HybridBlock.export``, ``Module.save_checkpoint``).

    net = gluon.SymbolBlock.imports("resnet18-symbol.json", ["data"], "resnet18-0000.params", ctx=mx.gpu())
    out = net(x)

Layer: gluon; imports dnnbind.symbol (a layer below gluon: it needs only nd) and runs the graph with
``symbol._exec.evaluate``: each node is the nd call an eager program would make, so the same cuDNN/cuBLAS calls run,
autograd records them (the loaded model trains like any Block) and ``hybridize()`` records and replays them.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError
from ..symbol import Group, Symbol, load, var
from ..symbol._exec import check, evaluate
from . import _export
from .block import Block
from .parameter import DeferredInitializationError
from .parameter_dict import ParameterDict

__all__ = ["SymbolBlock"]


class SymbolBlock(Block):
    """``SymbolBlock(outputs, inputs, params=None)``: ``outputs`` a Symbol (or a list: their Group), ``inputs``
    the variable Symbols the call's arguments feed, in order. Every other argument of the graph is a Parameter
    named as in the graph (learned, grad_req 'write'), every auxiliary state one with grad_req 'null'; ``params``
    (a ParameterDict) gives Parameters to share by name."""

    def __init__(self, outputs, inputs, params: ParameterDict | None = None):
        super().__init__(prefix=None, params=None)
        # As MXNet's: the Parameters are named exactly as the graph's variables wherever the block is made (GluonCV's
        # FeatureExpander is made inside SSD's name_scope, and its new variables are "expand_trans_conv0_weight")
        self._prefix = ""
        self._params = ParameterDict("")
        if isinstance(outputs, (list, tuple)):
            outputs = Group(list(outputs))
        if not isinstance(outputs, Symbol):
            raise DnnbindTypeError(f"SymbolBlock: outputs must be a Symbol or a list of Symbols, got "
                                   f"{type(outputs).__name__}")
        inputs = [inputs] if isinstance(inputs, Symbol) else list(inputs)
        names = []
        for i in inputs:
            if not isinstance(i, Symbol) or len(i) != 1 or i._outputs[0][0].op is not None:
                raise DnnbindTypeError("SymbolBlock: inputs must be variables (mx.sym.var('data')), got "
                                       f"{i!r}")
            names.append(i.name)
        graph_inputs = set(outputs.list_inputs())
        unknown = [n for n in names if n not in graph_inputs]
        if unknown:
            raise DnnbindValueError(f"SymbolBlock: input {unknown[0]!r} is not an input of the graph (its inputs: "
                                    f"{', '.join(sorted(graph_inputs))})")
        check(outputs)  # every operator must be one dnnbind runs: said now, not at the first call
        self._symbol, self._input_names = outputs, names
        shared = params if params is not None else ParameterDict("")
        for name in outputs.list_arguments():
            if name not in names:
                self._own(shared, name, "write")
        for name in outputs.list_auxiliary_states():
            self._own(shared, name, "null")

    def _own(self, shared: ParameterDict, name: str, grad_req: str) -> None:
        p = shared._params.get(name)
        if p is None:
            p = self.params.get(name, grad_req=grad_req, allow_deferred_init=True)
        else:
            self.params._params[name] = p

    @staticmethod
    def imports(symbol_file, input_names, param_file=None, ctx=None, allow_missing: bool = False,
                ignore_extra: bool = False) -> SymbolBlock:
        """The model in ``symbol_file`` with its Parameters from ``param_file`` (MXNet's ``arg:``/``aux:`` keys or
        plain names), on ``ctx`` (a device or a list)."""
        symbol = load(symbol_file)
        if isinstance(input_names, str):
            input_names = [input_names]
        block = SymbolBlock(symbol, [var(n) for n in input_names])
        if param_file is not None:
            block.collect_params().load(param_file, ctx=ctx, allow_missing=allow_missing, ignore_extra=ignore_extra,
                                        cast_dtype=True, dtype_source="saved")
        return block

    def forward(self, x, *args):
        given = (x, *args)
        if len(given) != len(self._input_names):
            raise DnnbindValueError(f"SymbolBlock: {len(self._input_names)} input(s) expected "
                                    f"({', '.join(self._input_names)}), got {len(given)}")
        values = dict(zip(self._input_names, given))
        if any(p._deferred_init for p in self.params.values()):
            self._finish_deferred_init(values)
        for name, p in self.params.items():
            values[name] = p.data()
        out = evaluate(self._symbol, values)
        return out[0] if len(out) == 1 else out

    def _finish_deferred_init(self, values: dict) -> None:
        """Parameters initialized without a shape (``initialize()`` before any data) get the shapes the graph
        infers from this call's inputs, then their initializer runs, as in MXNet."""
        known = {k: tuple(v.shape) for k, v in values.items()}
        args, _, auxs = self._symbol.infer_shape_partial(**known)
        shapes = dict(zip(self._symbol.list_arguments(), args)) | dict(
            zip(self._symbol.list_auxiliary_states(), auxs))
        for name, p in self.params.items():
            if p._deferred_init:
                shape = shapes.get(name)
                if not shape:
                    raise DeferredInitializationError(
                        f"SymbolBlock: the shape of Parameter `{name}` cannot be inferred from inputs "
                        f"{known}; load it from a file or give its variable a shape")
                p.shape = shape
                p._finish_deferred_init()

    def __repr__(self) -> str:
        return f"SymbolBlock({', '.join(self._input_names)} -> {', '.join(self._symbol.list_outputs())})"


_export.register(SymbolBlock, _export.symbol_block)  # export() composes its graph with the inputs given
