"""Fused recurrent layers ``RNN``, ``LSTM``, ``GRU`` (``mxnet.gluon.rnn``, MXNet 1.9.1): a whole sequence, all
layers and both directions in one ``nd.RNN`` call (cuDNN's RNN on the GPU). Layer: gluon; imports nd, gluon.block.

Parameters keep MXNet's names and order: per layer ``i``, per direction (``l`` forward, ``r`` reverse)
``{d}{i}_i2h_weight`` (gates*hidden, input), ``{d}{i}_h2h_weight`` (gates*hidden, hidden or projection),
``{d}{i}_i2h_bias``, ``{d}{i}_h2h_bias`` and with ``projection_size`` ``{d}{i}_h2r_weight`` (projection, hidden).
``save_parameters`` writes them under MXNet's keys for the unfused cell stack (``_unfused.0.i2h_weight``,
``_unfused.0.l_cell.i2h_weight`` when bidirectional), so the files go both ways with MXNet.

Each call flattens the Parameters into the one vector the RNN operator takes, in MXNet's (and cuDNN's canonical)
order: every weight (layer by layer, direction by direction, i2h, h2h[, h2r]) then every bias. The flattening is
``reshape`` + ``concat``, recorded by autograd, so each Parameter gets its slice of the vector's gradient.
"""

from __future__ import annotations

import numbers
import re
from collections import OrderedDict

from ... import nd
from ..._lib.errors import DnnbindValueError
from ...runtime.array import NDArray
from .._param_ctx import copy_device, multi_ctx, using_device
from ..block import Block
from .rnn_cell import RecurrentArgumentError

__all__ = ["GRU", "LSTM", "RNN"]

_GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
_PARAM_KEY = re.compile(r"(l|r)(\d+)_(i2h|h2h|h2r)_(weight|bias)\Z")


def _positive_int(who: str, what: str, v, minimum: int = 1) -> int:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < minimum:
        raise DnnbindValueError(f"{who}: {what} must be an int >= {minimum}, got {v!r}")
    return int(v)


class _RNNLayer(Block):
    """The fused layers' common part: Parameters, begin_state, the call."""

    _array_input = True

    def __init__(self, hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                 mode, projection_size, h2r_weight_initializer, lstm_state_clip_min, lstm_state_clip_max,
                 lstm_state_clip_nan, dtype, use_sequence_length=False, prefix=None, params=None):
        who = type(self).__name__
        if layout not in ("TNC", "NTC"):
            raise RecurrentArgumentError(f"{who}: invalid layout {layout!r}; must be one of ['TNC' or 'NTC']")
        hidden_size = _positive_int(who, "hidden_size", hidden_size)
        num_layers = _positive_int(who, "num_layers", num_layers)
        input_size = _positive_int(who, "input_size", input_size, 0)
        if not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
            raise DnnbindValueError(f"{who}: dropout must be a number in [0, 1), got {dropout!r}")
        if projection_size:
            projection_size = _positive_int(who, "projection_size", projection_size)
        super().__init__(prefix=prefix, params=params)
        self._hidden_size = hidden_size
        self._projection_size = projection_size if projection_size else None
        self._num_layers = num_layers
        self._mode = mode
        self._layout = layout
        self._dropout = dropout
        self._dir = 2 if bidirectional else 1
        self._input_size = input_size
        self._i2h_weight_initializer = i2h_weight_initializer
        self._h2h_weight_initializer = h2h_weight_initializer
        self._i2h_bias_initializer = i2h_bias_initializer
        self._h2h_bias_initializer = h2h_bias_initializer
        self._h2r_weight_initializer = h2r_weight_initializer
        self._lstm_state_clip_min = lstm_state_clip_min
        self._lstm_state_clip_max = lstm_state_clip_max
        self._lstm_state_clip_nan = lstm_state_clip_nan
        self._dtype = dtype
        self._use_sequence_length = use_sequence_length
        self.skip_states = None
        self._gates = _GATES[mode]

        ng, ni, nh = self._gates, input_size, hidden_size
        nr = self._projection_size or nh  # what h2h reads: the (projected) recurrent state
        for i in range(num_layers):
            for j in ["l", "r"][:self._dir]:
                self._register_param(f"{j}{i}_i2h_weight", (ng * nh, ni), i2h_weight_initializer, dtype)
                self._register_param(f"{j}{i}_h2h_weight", (ng * nh, nr), h2h_weight_initializer, dtype)
                self._register_param(f"{j}{i}_i2h_bias", (ng * nh,), i2h_bias_initializer, dtype)
                self._register_param(f"{j}{i}_h2h_bias", (ng * nh,), h2h_bias_initializer, dtype)
                if self._projection_size:
                    self._register_param(f"{j}{i}_h2r_weight", (nr, nh), h2r_weight_initializer, dtype)
            ni = nr * self._dir

    def _register_param(self, name, shape, init, dtype):
        p = self.params.get(name, shape=shape, init=init, allow_deferred_init=True, dtype=dtype)
        setattr(self, name, p)
        return p

    def __repr__(self) -> str:
        s = f"{type(self).__name__}({{mapping}}, {self._layout}"
        if self._num_layers != 1:
            s += f", num_layers={self._num_layers}"
        if self._dropout != 0:
            s += f", dropout={self._dropout}"
        if self._dir == 2:
            s += ", bidirectional"
        shape = self.l0_i2h_weight.shape
        return s.format(mapping=f"{shape[1] if shape[1] else None} -> {shape[0] // self._gates}") + ")"

    def _collect_params_with_prefix(self, prefix: str = "", out=None, seen=None, dedupe: bool = True):
        """save_parameters' keys: MXNet's for the unfused stack of cells (``_unfused.0.i2h_weight``, or
        ``_unfused.0.l_cell.i2h_weight`` when bidirectional), which MXNet 1.9.1 writes and reads."""
        out = OrderedDict() if out is None else out
        seen = set() if seen is None else seen
        for key, p in self._reg_params.items():
            if p is None or (dedupe and id(p) in seen):
                continue
            seen.add(id(p))
            m = _PARAM_KEY.match(key)
            if m is None:  # a Parameter a subclass added: its own name
                out[prefix + key] = p
                continue
            d, layer, g, t = m.groups()
            cell = f"{d}_cell." if self._dir == 2 else ""
            out[f"{prefix}_unfused.{layer}.{cell}{g}_{t}"] = p
        for name, child in self._children.items():
            child._collect_params_with_prefix(prefix + name + ".", out, seen, dedupe)
        return out

    def state_info(self, batch_size: int = 0) -> list:
        raise NotImplementedError

    def cast(self, dtype) -> None:
        super().cast(dtype)
        self._dtype = dtype

    def begin_state(self, batch_size: int = 0, func=nd.zeros, **kwargs) -> list:
        """The initial states (``nd.zeros`` by default), shaped (num_layers * directions, batch_size, units)."""
        states = []
        for i, info in enumerate(self.state_info(batch_size)):
            info = dict(info) if info is not None else {}
            info.update(kwargs)
            # NOTE: '__layout__' is a hidden attribute of MXNet's symbols; nd's creation functions refuse it.
            if not getattr(func, "__module__", "").startswith("dnnbind.symbol"):
                info = {k: v for k, v in info.items() if not k.startswith("__")}
            states.append(func(name=f"{self._prefix}h0_{i}", **info))
        return states

    def __call__(self, inputs, states=None, sequence_length=None, **kwargs):
        """``layer(inputs)`` -> output; ``layer(inputs, states)`` -> (output, new_states). ``states``: one array
        or a list (LSTM: [h, c]); zeros when None. ``sequence_length`` (batch,) with use_sequence_length=True."""
        self.skip_states = states is None
        if isinstance(states, NDArray):
            states = [states]
        # The states travel as separate array arguments (no list), and are left out when not given, so that a
        # hybridized layer records the common ``layer(x)`` call and keys its recordings by what was passed.
        args = [] if states is None else list(states)
        if self._use_sequence_length:
            if sequence_length is None:
                raise RecurrentArgumentError(f"{self.name} ({type(self).__name__}): use_sequence_length=True needs "
                                             "sequence_length, the (batch,) array of valid lengths")
            args.append(sequence_length)
        if multi_ctx[0] and isinstance(inputs, NDArray) and copy_device() is None:
            # Block.__call__ would select the Parameters' copies by calling self(*args) again, which here would
            # read the separated states as (states, sequence_length): select them first, then call.
            with using_device(inputs.device):
                return super().__call__(inputs, *args, **kwargs)
        return super().__call__(inputs, *args, **kwargs)

    def forward(self, inputs, *args):
        if not isinstance(inputs, NDArray):
            self._refuse_input(inputs)
        self._infer_shapes(inputs)
        params = {name: p.data() for name, p in self._reg_params.items() if p is not None}
        return self.hybrid_forward(nd, inputs, *args, **params)

    def _infer_shapes(self, inputs) -> None:
        who = f"{self.name} ({type(self).__name__})"
        if inputs.ndim != 3:
            raise RecurrentArgumentError(f"{who}: inputs must be 3-D in layout {self._layout!r} (T: steps, N: batch, "
                                         f"C: features), got shape {tuple(inputs.shape)}")
        features = inputs.shape[2]
        for d in ["l", "r"][:self._dir]:
            w = self._reg_params[f"{d}0_i2h_weight"]
            if w._data is None and not w._shape_known():
                w.shape = (w.shape[0], features)
            elif w.shape[1] != features:
                raise RecurrentArgumentError(f"{who}: inputs of shape {tuple(inputs.shape)} have {features} features "
                                             f"(layout {self._layout!r}), but the layer takes input_size "
                                             f"{w.shape[1]}")

    def hybrid_forward(self, F, inputs, *args, **params):
        args = list(args)
        sequence_length = args.pop() if self._use_sequence_length else None
        skip_states = not args
        if F is not nd:  # traced with symbols (export): MXNet's symbolic begin state is zeros of batch size 0
            states = args or self.begin_state(0, func=F.zeros)
        elif skip_states:
            batch_size = inputs.shape[self._layout.find("N")]
            states = self.begin_state(batch_size, ctx=inputs.context, dtype=inputs.dtype)
        else:
            states = args
            self._check_states(states, self.state_info(inputs.shape[self._layout.find("N")]))
        out = self._forward_kernel(F, inputs, states, sequence_length, **params)
        return out[0] if skip_states else out

    def _check_states(self, states, info) -> None:
        who = f"{self.name} ({type(self).__name__})"
        names = "[h, c]" if self._mode == "lstm" else "[h]"
        if len(states) != len(info):
            raise RecurrentArgumentError(f"{who}: expected {len(info)} state(s) {names}, got {len(states)}")
        for k, (state, i) in enumerate(zip(states, info)):
            if not isinstance(state, NDArray):
                raise RecurrentArgumentError(f"{who}: states[{k}] must be an NDArray, got {type(state).__name__}")
            if tuple(state.shape) != tuple(i["shape"]):
                raise RecurrentArgumentError(
                    f"{who}: Invalid recurrent state shape. Expecting {tuple(i['shape'])}, got {tuple(state.shape)} "
                    f"(states[{k}] of {names}: (num_layers * directions, batch_size, units))")

    def _flat_params(self, F, params):
        """All Parameters as one vector in MXNet's order: weights (layer, direction, i2h, h2h[, h2r]), then
        biases (layer, direction, i2h, h2h)."""
        gates = ["i2h", "h2h", "h2r"] if self._projection_size else ["i2h", "h2h"]
        parts = [params[f"{d}{layer}_{g}_{t}"].reshape(-1)
                 for t in ["weight", "bias"]
                 for layer in range(self._num_layers)
                 for d in ["l", "r"][:self._dir]
                 for g in gates
                 if g != "h2r" or t != "bias"]
        return F.concat(*parts, dim=0)

    def _forward_kernel(self, F, inputs, states, sequence_length, **params):
        if self._layout == "NTC":  # the operator takes TNC
            inputs = F.swapaxes(inputs, dim1=0, dim2=1)
        kwargs = dict(state_size=self._hidden_size, num_layers=self._num_layers, bidirectional=self._dir == 2,
                      p=self._dropout, state_outputs=True, mode=self._mode,
                      use_sequence_length=self._use_sequence_length)
        if self._projection_size is not None:
            kwargs["projection_size"] = self._projection_size
        if self._lstm_state_clip_min is not None or self._lstm_state_clip_max is not None:
            kwargs.update(lstm_state_clip_min=self._lstm_state_clip_min,
                          lstm_state_clip_max=self._lstm_state_clip_max,
                          lstm_state_clip_nan=self._lstm_state_clip_nan)
        if self._mode == "lstm":
            kwargs["state_cell"] = states[1]
        if self._use_sequence_length:
            kwargs["sequence_length"] = sequence_length
        rnn = F.RNN(inputs, self._flat_params(F, params), states[0], **kwargs)
        if self._mode == "lstm":
            outputs, states = rnn[0], [rnn[1], rnn[2]]
        else:
            outputs, states = rnn[0], [rnn[1]]
        if self._layout == "NTC":
            outputs = F.swapaxes(outputs, dim1=0, dim2=1)
        return outputs, states


class RNN(_RNNLayer):
    """Multi-layer Elman RNN: h_t = activation(W_ih x_t + b_ih + W_hh h_(t-1) + b_hh), ``activation`` 'relu'
    (MXNet's default) or 'tanh'. Inputs (T, N, C) in layout 'TNC' (or (N, T, C) with 'NTC'); states one array
    (num_layers * directions, N, hidden_size)."""

    def __init__(self, hidden_size, num_layers=1, activation="relu", layout="TNC", dropout=0, bidirectional=False,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", input_size=0, dtype="float32", **kwargs):
        if activation not in ("relu", "tanh"):
            raise DnnbindValueError(f"RNN: activation must be 'relu' or 'tanh', got {activation!r}")
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                         "rnn_" + activation, None, None, None, None, False, dtype, **kwargs)

    def state_info(self, batch_size=0):
        return [{"shape": (self._num_layers * self._dir, batch_size, self._hidden_size), "__layout__": "LNC",
                 "dtype": self._dtype}]


class LSTM(_RNNLayer):
    """Multi-layer LSTM (gate rows i, f, g, o). States [h, c], each (num_layers * directions, N, hidden_size);
    with ``projection_size`` h is (num_layers * directions, N, projection_size) and each layer has h2r_weight.
    ``state_clip_min``/``state_clip_max`` clip c at every step (``state_clip_nan``: NaN becomes a bound)."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0, bidirectional=False, input_size=0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", projection_size=None, h2r_weight_initializer=None,
                 state_clip_min=None, state_clip_max=None, state_clip_nan=False, dtype="float32", **kwargs):
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                         "lstm", projection_size, h2r_weight_initializer, state_clip_min, state_clip_max,
                         state_clip_nan, dtype, **kwargs)

    def state_info(self, batch_size=0):
        h = self._projection_size or self._hidden_size
        return [{"shape": (self._num_layers * self._dir, batch_size, h), "__layout__": "LNC",
                 "dtype": self._dtype},
                {"shape": (self._num_layers * self._dir, batch_size, self._hidden_size), "__layout__": "LNC",
                 "dtype": self._dtype}]


class GRU(_RNNLayer):
    """Multi-layer GRU as cuDNN computes it (gate rows r, z, n; the reset gate applied after the h2h product).
    States one array (num_layers * directions, N, hidden_size)."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0, bidirectional=False, input_size=0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", dtype="float32", **kwargs):
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                         "gru", None, None, None, None, False, dtype, **kwargs)

    def state_info(self, batch_size=0):
        return [{"shape": (self._num_layers * self._dir, batch_size, self._hidden_size), "__layout__": "LNC",
                 "dtype": self._dtype}]
