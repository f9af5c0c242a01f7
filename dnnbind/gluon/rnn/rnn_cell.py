"""Recurrent cells (``mxnet.gluon.rnn``, MXNet 1.9.1): one time step per call, ``unroll`` for a sequence.
Layer: gluon; imports nd, symbol (only to tell Symbols apart), gluon.block, gluon.nn.

A cell is ``cell(inputs, states) -> (output, new_states)`` on one step, ``inputs`` (batch, features), ``states`` the
list ``begin_state()`` makes. Cells keep MXNet's Parameter names (``lstm0_i2h_weight``, ...), weight layouts (gates
stacked along the rows: LSTM i, f, g, o; GRU r, z, n), initializer defaults (weights: the global initializer,
biases: zeros) and the deferred ``input_size=0``, so MXNet's files load here and dnnbind's load there.

``hybrid_forward(F, ...)`` holds each cell's math with F = nd (a call on arrays) or F = sym (``export`` traces a
hybrid_forward with symbols). ``unroll`` runs the steps from Python, as MXNet 1.x does; ``valid_length`` masks the
outputs past each sequence's length and takes the states at its last valid step (SequenceMask/SequenceLast).
"""

from __future__ import annotations

import numbers

import numpy as np

from ... import nd
from ..._lib.errors import DnnbindValueError
from ...runtime.array import NDArray
from ...symbol import Symbol
from ..block import Block
from ..nn import LeakyReLU

__all__ = [
    "BidirectionalCell",
    "DropoutCell",
    "GRUCell",
    "HybridRecurrentCell",
    "HybridSequentialRNNCell",
    "LSTMCell",
    "ModifierCell",
    "RNNCell",
    "RecurrentArgumentError",
    "RecurrentCell",
    "ResidualCell",
    "SequentialRNNCell",
    "ZoneoutCell",
]

TENSOR_TYPES = (NDArray, Symbol)  # what a sequence given as one array (not a list of steps) is


class RecurrentArgumentError(DnnbindValueError, AssertionError):
    """A bad argument to a recurrent cell or layer (layout, length, states). A ValueError, and an AssertionError as
    MXNet raises from its ``assert`` statements, so code written against either keeps catching it."""


# -- sequence helpers ---------------------------------------------------------------------------------------------

def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _check_layout(layout, who: str) -> None:
    if not isinstance(layout, str) or sorted(layout) != ["C", "N", "T"]:
        raise RecurrentArgumentError(f"{who}: layout must be 'NTC' or 'TNC' (a permutation of N, T and C), got "
                                     f"{layout!r}")


def _module_of(x):
    return nd if isinstance(x, NDArray) else _sym()


def _sym():
    from ... import symbol
    return symbol


def format_sequence(length, inputs, layout, merge, in_layout=None):
    """``inputs`` (one array in ``layout``, or a list of per-step arrays) as MXNet's unroll wants it: a list of
    steps (merge False), one array in ``layout`` (merge True) or as it came (merge None). Returns
    (inputs, time axis, F, batch size)."""
    if inputs is None:
        raise RecurrentArgumentError("unroll(inputs=None) has been deprecated (MXNet 1.x). Please create input "
                                     "variables outside unroll.")
    _check_layout(layout, "unroll")
    axis, batch_axis = layout.find("T"), layout.find("N")
    in_axis = in_layout.find("T") if in_layout is not None else axis
    batch_size = 0
    if isinstance(inputs, TENSOR_TYPES):
        F = _module_of(inputs)
        if isinstance(inputs, NDArray):
            if inputs.ndim < 2:
                raise RecurrentArgumentError(f"unroll: inputs must have a batch and a time axis (layout {layout!r}), "
                                             f"got shape {inputs.shape}")
            batch_size = inputs.shape[batch_axis]
            if merge is False:
                if length is not None and length != inputs.shape[in_axis]:
                    raise RecurrentArgumentError(
                        f"unroll: length={length} but inputs of shape {inputs.shape} has {inputs.shape[in_axis]} "
                        f"steps along its time axis {in_axis} (layout {layout!r})")
                inputs = _as_list(nd.split(inputs, axis=in_axis, num_outputs=inputs.shape[in_axis],
                                           squeeze_axis=1))
        elif merge is False:
            inputs = _as_list(F.split(inputs, axis=in_axis, num_outputs=length, squeeze_axis=1))
    else:
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise RecurrentArgumentError(f"unroll: inputs must be an NDArray in layout {layout!r} or a list of "
                                         f"per-step NDArrays, got {type(inputs).__name__}")
        if length is not None and len(inputs) != length:
            raise RecurrentArgumentError(f"unroll: length={length} but inputs is a list of {len(inputs)} steps")
        F = _module_of(inputs[0])
        if isinstance(inputs[0], NDArray):
            batch_size = inputs[0].shape[0]
        if merge is True:
            inputs = F.stack(*inputs, axis=axis)
            in_axis = axis
    if isinstance(inputs, TENSOR_TYPES) and axis != in_axis:
        inputs = F.swapaxes(inputs, dim1=axis, dim2=in_axis)
    return inputs, axis, F, batch_size


def get_begin_state(cell, F, begin_state, inputs, batch_size):
    if begin_state is None:
        if F is nd:  # on the inputs' device, as MXNet's ``with ctx:``
            ctx = inputs.context if isinstance(inputs, NDArray) else inputs[0].context
            with ctx:
                begin_state = cell.begin_state(func=F.zeros, batch_size=batch_size)
        else:
            begin_state = cell.begin_state(func=F.zeros, batch_size=batch_size)
    return begin_state


# MXNet's unroll calls SequenceMask/SequenceLast/SequenceReverse. When nd lacks them (they are built beside this
# package), the same results come from where/broadcast ops: the selection is by ``where``, so values pass exactly
# and gradients flow to the kept positions only, as MXNet's kernels do. Tests set _SEQUENCE_OPS False to check both.
_SEQUENCE_OPS = True


def _op(F, name):
    return getattr(F, name, None) if (_SEQUENCE_OPS or F is not nd) else None


def _step_index(valid_length, length: int):
    """(length, 1) float steps 0..length-1 and (1, N) lengths, in valid_length's dtype and device."""
    steps = nd.arange(length, ctx=valid_length.context, dtype=valid_length.dtype).reshape((length, 1))
    return steps, valid_length.reshape((1, -1))


def _time_major_mask(cond, data, axis: int):
    """A (T, N) condition laid over ``data`` whose time axis is ``axis`` (0 or 1): broadcast to data's shape."""
    if axis == 1:
        cond = nd.swapaxes(cond, dim1=0, dim2=1)
    cond = cond.reshape(cond.shape + (1,) * (data.ndim - 2))
    return nd.broadcast_to(cond, data.shape)


def _sequence_mask(F, data, valid_length, axis: int):
    op = _op(F, "SequenceMask")
    if op is not None:
        return op(data, sequence_length=valid_length, use_sequence_length=True, axis=axis)
    steps, lengths = _step_index(valid_length, data.shape[axis])
    keep = _time_major_mask(nd.broadcast_lesser(steps, lengths), data, axis)
    return nd.where(keep, data, nd.zeros_like(data))


def _sequence_last(F, data, valid_length):
    """data (T, N, ...) -> (N, ...): each sequence's step valid_length - 1."""
    op = _op(F, "SequenceLast")
    if op is not None:
        return op(data, sequence_length=valid_length, use_sequence_length=True, axis=0)
    steps, lengths = _step_index(valid_length, data.shape[0])
    pick = _time_major_mask(nd.broadcast_equal(steps, lengths - 1), data, 0)
    return nd.sum(nd.where(pick, data, nd.zeros_like(data)), axis=0)


def _sequence_reverse(F, data, valid_length):
    """data (T, N, ...): the first valid_length steps of each sequence reversed, the padding left in place."""
    op = _op(F, "SequenceReverse")
    if op is not None:
        return op(data, sequence_length=valid_length, use_sequence_length=True)
    length = data.shape[0]
    steps, lengths = _step_index(valid_length, length)
    # source step of output step t: lengths - 1 - t inside the sequence, t in the padding
    src = nd.where(nd.broadcast_lesser(steps, lengths), nd.broadcast_minus(lengths - 1, steps),
                   nd.broadcast_to(steps, (length, lengths.shape[1])))
    out = []
    for t in range(length):
        pick = _time_major_mask(nd.broadcast_equal(steps, src[t].reshape((1, -1))), data, 0)
        out.append(nd.sum(nd.where(pick, data, nd.zeros_like(data)), axis=0))
    return nd.stack(*out, axis=0)


def mask_sequence_variable_length(F, data, length, valid_length, time_axis, merge):
    if not isinstance(data, TENSOR_TYPES):
        data = F.stack(*data, axis=time_axis)
    outputs = _sequence_mask(F, data, valid_length, time_axis)
    if not merge:
        outputs = _as_list(F.split(outputs, num_outputs=length, axis=time_axis, squeeze_axis=True))
    return outputs


# MXNet's private names for the unroll helpers: MXNet's gluon.contrib.rnn (and code written against it) imports
# them from mxnet.gluon.rnn.rnn_cell by these names.
_format_sequence = format_sequence
_get_begin_state = get_begin_state
_mask_sequence_variable_length = mask_sequence_variable_length


def _reverse_sequences(sequences, unroll_step, valid_length=None):
    F = _module_of(sequences[0])
    if valid_length is None:
        return list(reversed(sequences))
    reversed_sequences = _sequence_reverse(F, F.stack(*sequences, axis=0), valid_length)
    if unroll_step > 1 or F is not nd:
        return _as_list(F.split(reversed_sequences, axis=0, num_outputs=unroll_step, squeeze_axis=True))
    return [reversed_sequences[0]]


def _cells_state_info(cells, batch_size):
    return sum([c.state_info(batch_size) for c in cells], [])


def _cells_begin_state(cells, **kwargs):
    return sum([c.begin_state(**kwargs) for c in cells], [])


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


# -- the cells ----------------------------------------------------------------------------------------------------

class RecurrentCell(Block):
    """Abstract base class of RNN cells: ``state_info``, ``begin_state``, one step per call, ``unroll``."""

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self._modified = False
        self.reset()

    def reset(self) -> None:
        """Reset before re-using the cell for another sequence (the step counters; modifier cells' masks)."""
        self._init_counter = -1
        self._counter = -1
        for cell in self._children.values():
            cell.reset()

    def state_info(self, batch_size: int = 0) -> list:
        """Shape and layout of each state: [{'shape': (batch_size, hidden), '__layout__': 'NC'}, ...]."""
        raise NotImplementedError()

    def _check_not_modified(self) -> None:
        if self._modified:
            raise RecurrentArgumentError(
                f"{self.name}: after applying modifier cells (e.g. ZoneoutCell) the base cell cannot be called "
                "directly. Call the modifier cell instead.")

    def begin_state(self, batch_size: int = 0, func=nd.zeros, **kwargs) -> list:
        """The initial states: ``func(name=..., shape=..., **kwargs)`` per state_info entry (``nd.zeros`` by
        default; ``dtype``, ``ctx`` and the like go through ``kwargs``)."""
        self._check_not_modified()
        states = []
        for info in self.state_info(batch_size):
            self._init_counter += 1
            info = dict(info) if info is not None else {}
            info.update(kwargs)
            # NOTE: '__layout__' is a hidden attribute MXNet's operators store on a symbol; nd's creation
            # functions refuse unknown keywords, and an array carries no layout, so only symbols get it.
            if not getattr(func, "__module__", "").startswith("dnnbind.symbol"):
                info = {k: v for k, v in info.items() if not k.startswith("__")}
            states.append(func(name=f"{self._prefix}begin_state_{self._init_counter}", **info))
        return states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        """Run the cell over ``length`` steps of ``inputs`` (one array in ``layout``, or a list of (batch, ...)
        steps). Returns (outputs, states): outputs one array in ``layout`` (merge_outputs True) or a list of steps
        (False; None: whatever the cell makes). ``valid_length`` (batch,): outputs past each length are zero and
        the states are those of each sequence's last valid step."""
        self.reset()
        inputs, axis, F, batch_size = format_sequence(length, inputs, layout, False)
        begin_state = get_begin_state(self, F, begin_state, inputs, batch_size)
        states = begin_state
        outputs, all_states = [], []
        for i in range(length):
            output, states = self(inputs[i], states)
            outputs.append(output)
            if valid_length is not None:
                all_states.append(states)
        if valid_length is not None:
            states = [_sequence_last(F, F.stack(*ele_list, axis=0), valid_length) for ele_list in zip(*all_states)]
            outputs = mask_sequence_variable_length(F, outputs, length, valid_length, axis, True)
        outputs, _, _, _ = format_sequence(length, outputs, layout, merge_outputs)
        return outputs, states

    def _get_activation(self, F, inputs, activation, **kwargs):
        """The activation by name ('tanh', 'relu', 'sigmoid', 'softsign', or any nd.Activation act_type), a
        LeakyReLU block, or a callable."""
        func = {"tanh": F.tanh, "relu": F.relu, "sigmoid": F.sigmoid, "softsign": F.softsign}.get(activation) \
            if isinstance(activation, str) else None
        if func is not None:
            return func(inputs, **kwargs)
        if isinstance(activation, str):
            return F.Activation(inputs, act_type=activation, **kwargs)
        if isinstance(activation, LeakyReLU):
            return F.LeakyReLU(inputs, act_type="leaky", slope=activation._alpha, **kwargs)
        return activation(inputs, **kwargs)

    def forward(self, inputs, states):
        """One step: (output, new_states)."""
        self._counter += 1
        return self._step(inputs, states)

    def _step(self, inputs, states):
        raise NotImplementedError(f"{type(self).__name__} must define hybrid_forward (or forward)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class HybridRecurrentCell(RecurrentCell):
    """A RecurrentCell written as ``hybrid_forward(F, inputs, states, **params)`` (F = nd or sym)."""

    _array_input = True  # MXNet's HybridBlock: the step's inputs must be an array

    def _step(self, inputs, states):
        self._infer_shapes(inputs)
        self._check_states(inputs, states)
        params = {name: p.data() for name, p in self._reg_params.items() if p is not None}
        return self.hybrid_forward(nd, inputs, states, **params)

    def _infer_shapes(self, inputs) -> None:
        """The first step: the deferred input_size of i2h_weight from the inputs (FullyConnected flattens them)."""
        w = self._reg_params.get("i2h_weight")
        if w is not None and w._data is None and not w._shape_known():
            w.shape = (w.shape[0], int(np.prod(inputs.shape[1:])))
            self._input_size = w.shape[1]

    def _check_states(self, inputs, states) -> None:
        """Gated cells: the states a list of arrays shaped as state_info says (else a named error, not a gemm
        shape error deep inside)."""
        if not self._reg_params:
            return
        if isinstance(states, TENSOR_TYPES) or not isinstance(states, (list, tuple)):
            raise RecurrentArgumentError(f"{self.name} ({type(self).__name__}): states must be a list of arrays "
                                         f"(begin_state() makes one), got {type(states).__name__}")
        info = self.state_info(inputs.shape[0])
        if len(states) != len(info):
            raise RecurrentArgumentError(f"{self.name} ({type(self).__name__}): expected {len(info)} state(s), got "
                                         f"{len(states)}")
        for k, (s, i) in enumerate(zip(states, info)):
            if isinstance(s, NDArray) and tuple(s.shape) != tuple(i["shape"]):
                raise RecurrentArgumentError(
                    f"{self.name} ({type(self).__name__}): states[{k}] has shape {tuple(s.shape)}, expected "
                    f"{tuple(i['shape'])} (batch_size {inputs.shape[0]} of inputs {tuple(inputs.shape)}, "
                    f"{i['shape'][1]} units)")

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError


def _cell_repr(cell, extra: str = "") -> str:
    shape = cell.i2h_weight.shape
    return f"{type(cell).__name__}({shape[1] if shape[1] else None} -> {shape[0]}{extra})"


class GatedCell(HybridRecurrentCell):
    """RNN/LSTM/GRU cells: i2h and h2h FullyConnected weights of ``gates * hidden_size`` rows."""

    _gates = 1

    def __init__(self, hidden_size, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, input_size, prefix, params, recurrent_size=None):
        for what, v in (("hidden_size", hidden_size), ("input_size", input_size)):
            if not isinstance(v, (numbers.Integral, np.integer)) or isinstance(v, bool) or v < (what == "hidden_size"):
                raise DnnbindValueError(f"{type(self).__name__}: {what} must be a "
                                        f"{'positive' if what == 'hidden_size' else 'non-negative'} int, got {v!r}")
        super().__init__(prefix=prefix, params=params)
        self._hidden_size, self._input_size = int(hidden_size), int(input_size)
        rows, rec = self._gates * self._hidden_size, recurrent_size or self._hidden_size
        self.i2h_weight = self.params.get("i2h_weight", shape=(rows, input_size), init=i2h_weight_initializer,
                                          allow_deferred_init=True)
        self.h2h_weight = self.params.get("h2h_weight", shape=(rows, rec), init=h2h_weight_initializer,
                                          allow_deferred_init=True)
        self._extra_params()
        self.i2h_bias = self.params.get("i2h_bias", shape=(rows,), init=i2h_bias_initializer,
                                        allow_deferred_init=True)
        self.h2h_bias = self.params.get("h2h_bias", shape=(rows,), init=h2h_bias_initializer,
                                        allow_deferred_init=True)

    def _extra_params(self) -> None:
        """Parameters registered between h2h_weight and the biases (LSTMPCell's h2r_weight), MXNet's order."""

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def _fc_pair(self, F, inputs, h, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        n = self._gates * self._hidden_size
        i2h = F.FullyConnected(inputs, i2h_weight, i2h_bias, num_hidden=n)
        h2h = F.FullyConnected(h, h2h_weight, h2h_bias, num_hidden=n)
        return i2h, h2h

    def __repr__(self) -> str:
        return _cell_repr(self)


class RNNCell(GatedCell):
    """Elman cell: h_t = activation(W_ih x_t + b_ih + W_hh h_(t-1) + b_hh); ``activation`` 'tanh' by default (a
    name, a LeakyReLU block or a callable)."""

    def __init__(self, hidden_size, activation="tanh", i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None,
                 params=None):
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)
        self._activation = activation

    def _alias(self):
        return "rnn"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        i2h, h2h = self._fc_pair(F, inputs, states[0], i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        output = self._get_activation(F, i2h + h2h, self._activation)
        return output, [output]

    def __repr__(self) -> str:
        return _cell_repr(self, f", {self._activation}")


class LSTMCell(GatedCell):
    """LSTM cell; the gate rows are ordered i, f, g (the cell input), o:
    c_t = f * c_(t-1) + i * g, h_t = o * activation(c_t); i, f, o use ``recurrent_activation``."""

    _gates = 4

    def __init__(self, hidden_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None,
                 params=None, activation="tanh", recurrent_activation="sigmoid"):
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)
        self._activation, self._recurrent_activation = activation, recurrent_activation

    def _alias(self):
        return "lstm"

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"},
                {"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        i2h, h2h = self._fc_pair(F, inputs, states[0], i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        gates = F.SliceChannel(i2h + h2h, num_outputs=4)
        in_gate = self._get_activation(F, gates[0], self._recurrent_activation)
        forget_gate = self._get_activation(F, gates[1], self._recurrent_activation)
        in_transform = self._get_activation(F, gates[2], self._activation)
        out_gate = self._get_activation(F, gates[3], self._recurrent_activation)
        next_c = forget_gate * states[1] + in_gate * in_transform
        # MXNet applies the cell activation to c_t through Activation (so it must be an act_type name)
        next_h = out_gate * F.Activation(next_c, act_type=self._activation)
        return next_h, [next_h, next_c]


class GRUCell(GatedCell):
    """GRU cell as cuDNN computes it (the reset gate applied after the h2h product); gate rows r, z, n:
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h_t = (1 - z) * n + z * h_(t-1)."""

    _gates = 3

    def __init__(self, hidden_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None,
                 params=None):
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)

    def _alias(self):
        return "gru"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prev_h = states[0]
        i2h, h2h = self._fc_pair(F, inputs, prev_h, i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        i2h_r, i2h_z, i2h_n = F.SliceChannel(i2h, num_outputs=3)
        h2h_r, h2h_z, h2h_n = F.SliceChannel(h2h, num_outputs=3)
        reset_gate = F.Activation(i2h_r + h2h_r, act_type="sigmoid")
        update_gate = F.Activation(i2h_z + h2h_z, act_type="sigmoid")
        next_h_tmp = F.Activation(i2h_n + reset_gate * h2h_n, act_type="tanh")
        next_h = (F.ones_like(update_gate) - update_gate) * next_h_tmp + update_gate * prev_h
        return next_h, [next_h]


class _SequentialMixin:
    """Stacking cells: each step runs the children in turn; unroll runs each child over the whole sequence."""

    def __repr__(self) -> str:
        body = "\n".join(f"({i}): {_indent(repr(m), 2)}" for i, m in self._children.items())
        return f"{type(self).__name__}(\n{body}\n)"

    def add(self, cell) -> None:
        """Append ``cell`` to the stack."""
        self.register_child(cell)

    def state_info(self, batch_size=0):
        return _cells_state_info(self._children.values(), batch_size)

    def begin_state(self, batch_size=0, **kwargs):
        # MXNet 1.9.1 takes keywords only here; batch_size may come first, as for every other cell
        self._check_not_modified()
        return _cells_begin_state(self._children.values(), batch_size=batch_size, **kwargs)

    def forward(self, inputs, states):
        self._counter += 1
        for cell in self._children.values():
            if isinstance(cell, BidirectionalCell):
                raise RecurrentArgumentError(f"{self.name}: a BidirectionalCell cannot be stepped; call unroll()")
        next_states, p = [], 0
        for cell in self._children.values():
            n = len(cell.state_info())
            state = states[p:p + n]
            p += n
            inputs, state = cell(inputs, state)
            next_states.append(state)
        return inputs, sum(next_states, [])

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, _, F, batch_size = format_sequence(length, inputs, layout, None)
        num_cells = len(self._children)
        begin_state = get_begin_state(self, F, begin_state, inputs, batch_size)
        p, next_states = 0, []
        for i, cell in enumerate(self._children.values()):
            n = len(cell.state_info())
            states = begin_state[p:p + n]
            p += n
            inputs, states = cell.unroll(length, inputs=inputs, begin_state=states, layout=layout,
                                         merge_outputs=None if i < num_cells - 1 else merge_outputs,
                                         valid_length=valid_length)
            next_states.extend(states)
        return inputs, next_states

    def __getitem__(self, i):
        return self._children[str(i)]

    def __len__(self) -> int:
        return len(self._children)


class SequentialRNNCell(_SequentialMixin, RecurrentCell):
    """Stacks RNN cells: the output of one is the input of the next; states are concatenated."""


class HybridSequentialRNNCell(_SequentialMixin, HybridRecurrentCell):
    """SequentialRNNCell under MXNet's hybrid name (its own name counter: ``hybridsequentialrnncell0_``)."""

    _array_input = True


class DropoutCell(HybridRecurrentCell):
    """Dropout on the inputs (rate ``rate``, mask shared along ``axes``); states pass through."""

    def __init__(self, rate, axes=(), prefix=None, params=None):
        if not isinstance(rate, numbers.Real) or isinstance(rate, bool):
            raise RecurrentArgumentError(f"DropoutCell: rate must be a number, got {type(rate).__name__} {rate!r}")
        super().__init__(prefix, params)
        self._rate, self._axes = rate, axes

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rate={self._rate}, axes={self._axes})"

    def state_info(self, batch_size=0):
        return []

    def _alias(self):
        return "dropout"

    def hybrid_forward(self, F, inputs, states):
        if self._rate > 0:
            inputs = F.Dropout(inputs, p=self._rate, axes=self._axes)
        return inputs, states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, _, F, _ = format_sequence(length, inputs, layout, merge_outputs)
        if isinstance(inputs, TENSOR_TYPES):  # one array: drop it whole
            return self.hybrid_forward(F, inputs, begin_state if begin_state else [])
        return super().unroll(length, inputs, begin_state=begin_state, layout=layout, merge_outputs=merge_outputs,
                              valid_length=None)


class ModifierCell(HybridRecurrentCell):
    """Base of cells that modify a base cell (Zoneout, Residual). The base cell is then no longer called directly;
    the modifier shares its Parameters (``params`` is the base cell's) and is named ``<base prefix><alias>``."""

    def __init__(self, base_cell):
        if base_cell._modified:
            raise RecurrentArgumentError(f"Cell {base_cell.name} is already modified. One cell cannot be modified "
                                         "twice")
        base_cell._modified = True
        super().__init__(prefix=base_cell.prefix + self._alias(), params=None)
        self.base_cell = base_cell

    @property
    def params(self):
        return self.base_cell.params

    def state_info(self, batch_size=0):
        return self.base_cell.state_info(batch_size)

    def begin_state(self, batch_size=0, func=nd.zeros, **kwargs):
        # NOTE: MXNet 1.9.1's signature here is begin_state(func=symbol.zeros, **kwargs): a Symbol per state, and
        # begin_state(2) would take 2 for func. Arrays are what a caller of an imperative cell can use, and
        # batch_size comes first as in every other cell; a function passed first is still taken as func.
        if callable(batch_size):
            batch_size, func = kwargs.pop("batch_size", 0), batch_size
        self._check_not_modified()
        self.base_cell._modified = False
        try:
            return self.base_cell.begin_state(batch_size=batch_size, func=func, **kwargs)
        finally:
            self.base_cell._modified = True

    def hybrid_forward(self, F, inputs, states):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_cell!r})"


class ZoneoutCell(ModifierCell):
    """Zoneout: while training, each output and state unit keeps its previous value with probability
    ``zoneout_outputs`` / ``zoneout_states`` (a dropout mask of ones picks new or old)."""

    def __init__(self, base_cell, zoneout_outputs=0., zoneout_states=0.):
        if isinstance(base_cell, BidirectionalCell):
            raise RecurrentArgumentError("BidirectionalCell doesn't support zoneout since it doesn't support step. "
                                         "Please add ZoneoutCell to the cells underneath instead.")
        super().__init__(base_cell)
        self.zoneout_outputs, self.zoneout_states = zoneout_outputs, zoneout_states
        self._prev_output = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(p_out={self.zoneout_outputs}, p_state={self.zoneout_states}, "
                f"{self.base_cell!r})")

    def _alias(self):
        return "zoneout"

    def reset(self) -> None:
        super().reset()
        self._prev_output = None

    def hybrid_forward(self, F, inputs, states):
        cell, p_outputs, p_states = self.base_cell, self.zoneout_outputs, self.zoneout_states
        next_output, next_states = cell(inputs, states)

        def mask(p, like):  # nonzero where the new value is kept (all ones outside training)
            return F.Dropout(F.ones_like(like), p=p)

        prev_output = self._prev_output if self._prev_output is not None else F.zeros_like(next_output)
        output = F.where(mask(p_outputs, next_output), next_output, prev_output) if p_outputs != 0. \
            else next_output
        states = [F.where(mask(p_states, new_s), new_s, old_s) for new_s, old_s in zip(next_states, states)] \
            if p_states != 0. else next_states
        self._prev_output = output
        return output, states


class ResidualCell(ModifierCell):
    """Adds the input to the base cell's output (Wu et al. 2016)."""

    def __init__(self, base_cell):
        super().__init__(base_cell)

    def hybrid_forward(self, F, inputs, states):
        output, states = self.base_cell(inputs, states)
        return output + inputs, states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        self.base_cell._modified = False
        try:
            outputs, states = self.base_cell.unroll(length, inputs=inputs, begin_state=begin_state, layout=layout,
                                                    merge_outputs=merge_outputs, valid_length=valid_length)
        finally:
            self.base_cell._modified = True
        merge_outputs = isinstance(outputs, TENSOR_TYPES) if merge_outputs is None else merge_outputs
        inputs, axis, F, _ = format_sequence(length, inputs, layout, merge_outputs)
        if valid_length is not None:  # the padding adds nothing: mask the inputs too
            inputs = mask_sequence_variable_length(F, inputs, length, valid_length, axis, merge_outputs)
        if merge_outputs:
            outputs = outputs + inputs
        else:
            outputs = [i + j for i, j in zip(outputs, inputs)]
        return outputs, states


class BidirectionalCell(HybridRecurrentCell):
    """Runs ``l_cell`` forward and ``r_cell`` backward over the sequence and concatenates their outputs
    (features: l then r). Unroll only; its states are l_cell's then r_cell's."""

    _array_input = False

    def __init__(self, l_cell, r_cell, output_prefix="bi_"):
        super().__init__(prefix="", params=None)
        self.register_child(l_cell, "l_cell")
        self.register_child(r_cell, "r_cell")
        self._output_prefix = output_prefix

    def __call__(self, inputs, states):
        raise NotImplementedError("Bidirectional cannot be stepped. Please use unroll")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(forward={self._children['l_cell']!r}, "
                f"backward={self._children['r_cell']!r})")

    def state_info(self, batch_size=0):
        return _cells_state_info(self._children.values(), batch_size)

    def begin_state(self, batch_size=0, **kwargs):
        # MXNet 1.9.1 takes keywords only here; batch_size may come first, as for every other cell
        self._check_not_modified()
        return _cells_begin_state(self._children.values(), batch_size=batch_size, **kwargs)

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, axis, F, batch_size = format_sequence(length, inputs, layout, False)
        reversed_inputs = list(_reverse_sequences(inputs, length, valid_length))
        begin_state = get_begin_state(self, F, begin_state, inputs, batch_size)
        states = begin_state
        l_cell, r_cell = self._children.values()
        n_l = len(l_cell.state_info(batch_size))
        l_outputs, l_states = l_cell.unroll(length, inputs=inputs, begin_state=states[:n_l], layout=layout,
                                            merge_outputs=merge_outputs, valid_length=valid_length)
        r_outputs, r_states = r_cell.unroll(length, inputs=reversed_inputs, begin_state=states[n_l:],
                                            layout=layout, merge_outputs=False, valid_length=valid_length)
        reversed_r_outputs = _reverse_sequences(r_outputs, length, valid_length)
        if merge_outputs is None:
            merge_outputs = isinstance(l_outputs, TENSOR_TYPES)
            l_outputs, _, _, _ = format_sequence(None, l_outputs, layout, merge_outputs)
            reversed_r_outputs, _, _, _ = format_sequence(None, reversed_r_outputs, layout, merge_outputs)
        if merge_outputs:
            if not isinstance(reversed_r_outputs, TENSOR_TYPES):
                reversed_r_outputs = F.stack(*reversed_r_outputs, axis=axis)
            outputs = F.concat(l_outputs, reversed_r_outputs, dim=2)
        else:
            outputs = [F.concat(l_o, r_o, dim=1) for l_o, r_o in zip(l_outputs, reversed_r_outputs)]
        if valid_length is not None:
            outputs = mask_sequence_variable_length(F, outputs, length, valid_length, axis, merge_outputs)
        return outputs, l_states + r_states
