"""Layer symbol: what a symbol graph needs to know of each operator beyond its parameters: which inputs it takes
(some depend on the parameters: no bias with ``no_bias``, PReLU's gamma), which of them are auxiliary states (mutated
by the op, not learned: BatchNorm's moving mean and variance), and how many outputs it has and which are visible.

Parameters come from nd/_schema.py; this table says the rest, as MXNet 1.9.1 does (each entry was read off the real
MXNet: list_arguments, list_auxiliary_states, list_outputs and the node's output count in ``node_row_ptr``; the
count of hidden outputs is the pip wheel's, built with oneDNN, and only shows in a file's ``node_row_ptr``). An
operator not listed here takes the inputs its schema declares and has one output named ``output``.

An operator declared by an ``OpDef`` (ops/defs/, registered in nd's registry) carries all of this in its entry
(``aux``, ``optional``, ``init``, ``outputs``), which is read first; the tables below hold the rest, until their
operators become entries too.
"""

from __future__ import annotations

from .. import nd
from ..nd._schema import Schema


def opdef(op: str):
    """The OpDef of operator ``op`` (None for an operator not declared by one)."""
    entry = nd.REGISTRY.get(op)
    return entry.opdef if entry is not None else None

# operator -> its auxiliary-state inputs (mutated by the op, not learned); BatchNorm's are in its OpDef
AUX: dict[str, tuple[str, ...]] = {}

# operator -> {input: the "__init__" MXNet attaches to the variable it makes for that input}
INPUT_INIT: dict[str, dict[str, str]] = {}


# operator -> (input name -> predicate on the parsed parameters: is the input there?)
OPTIONAL_INPUTS = {
    "softmin": {"length": lambda p: bool(p.get("use_length"))},
    "RNN": {"state_cell": lambda p: p.get("mode") == "lstm",
            "sequence_length": lambda p: bool(p.get("use_sequence_length"))},
    "CTCLoss": {"data_lengths": lambda p: bool(p.get("use_data_lengths")),
                "label_lengths": lambda p: bool(p.get("use_label_lengths"))},
    **{op: {"sequence_length": lambda p: bool(p.get("use_sequence_length"))}
       for op in ("SequenceMask", "SequenceLast", "SequenceReverse")},
}


def _n(key, default=1):
    return lambda p: int(p.get(key) if p.get(key) is not None else default)


# operator -> fn(parsed params) -> (outputs the node has, names of the visible ones)
OUTPUTS = {
    "L2Normalization": lambda p: (2, ["output"]),
    "sort": lambda p: (2, ["output0"]),
    "SliceChannel": lambda p: (_n("num_outputs")(p), [f"output{i}" for i in range(_n("num_outputs")(p))]),
    "topk": lambda p: ((2, ["output0", "output1"]) if p.get("ret_typ") == "both" else (1, ["output"])),
    # an operator without output names of its own numbers them when it has several (sort's "output0")
    "CTCLoss": lambda p: (2, ["output0"]),
    "RNN": lambda p: _rnn_outputs(p),
}


def _rnn_outputs(p):
    """RNN's output, then with ``state_outputs`` its final state (and an LSTM's cell state) visible too."""
    total = 3 if p.get("mode") == "lstm" else 2
    names = ["output", "state_output", "statecell_output"][:total]
    return total, names if p.get("state_outputs") else ["output"]


def inputs(op: str, schema: Schema, params: dict, given: int) -> list[str]:
    """The input names of one node: the schema's, less the optional ones its parameters turn off. A variadic
    input (Concat's data) is ``given`` arrays, named arg0, arg1, ... as MXNet names them."""
    if schema.inputs and schema.inputs[0].variadic:
        names = [f"arg{i}" for i in range(given)]
        if op == "UpSampling" and params.get("sample_type") == "bilinear":
            names = names[:1] + ["weight"]  # bilinear upsampling is a deconvolution with a learned kernel
        return names
    d = opdef(op)
    optional = d.optional if d is not None else OPTIONAL_INPUTS.get(op, {})
    return [i.name for i in schema.inputs if i.name not in optional or optional[i.name](params)]


def outputs(op: str, params: dict) -> tuple[int, list[str]]:
    d = opdef(op)
    if d is not None:
        return d.outputs(params)
    rule = OUTPUTS.get(op)
    return (1, ["output"]) if rule is None else rule(params)


def aux_inputs(op: str) -> tuple[str, ...]:
    d = opdef(op)
    return d.aux if d is not None else AUX.get(op, ())


def input_init(op: str) -> dict[str, str]:
    d = opdef(op)
    return d.init if d is not None else INPUT_INIT.get(op, {})
