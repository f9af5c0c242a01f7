"""``VariationalDropoutCell`` and ``LSTMPCell`` (``mxnet.gluon.contrib.rnn``, MXNet 1.9.1).
Layer: gluon; imports nd and gluon.rnn.
"""

from __future__ import annotations

from ...rnn.rnn_cell import (
    TENSOR_TYPES,
    BidirectionalCell,
    GatedCell,
    ModifierCell,
    RecurrentArgumentError,
    format_sequence,
    get_begin_state,
    mask_sequence_variable_length,
)

__all__ = ["LSTMPCell", "VariationalDropoutCell"]


class VariationalDropoutCell(ModifierCell):
    """Variational dropout (Gal & Ghahramani, https://arxiv.org/pdf/1512.05287.pdf): one dropout mask per
    sequence for the inputs, one for the first state (h) and one for the outputs, drawn at the first step and kept
    until ``reset()`` (which ``unroll`` calls). Stepping by hand: call ``reset()`` between sequences."""

    def __init__(self, base_cell, drop_inputs=0., drop_states=0., drop_outputs=0.):
        if drop_states and isinstance(base_cell, BidirectionalCell):
            raise RecurrentArgumentError("BidirectionalCell doesn't support variational state dropout. Please add "
                                         "VariationalDropoutCell to the cells underneath instead.")
        super().__init__(base_cell)
        self.drop_inputs, self.drop_states, self.drop_outputs = drop_inputs, drop_states, drop_outputs
        self.drop_inputs_mask = self.drop_states_mask = self.drop_outputs_mask = None

    def _alias(self):
        return "vardrop"

    def reset(self) -> None:
        super().reset()
        self.drop_inputs_mask = self.drop_states_mask = self.drop_outputs_mask = None

    def _initialize_input_masks(self, F, inputs, states) -> None:
        if self.drop_states and self.drop_states_mask is None:
            self.drop_states_mask = F.Dropout(F.ones_like(states[0]), p=self.drop_states)
        if self.drop_inputs and self.drop_inputs_mask is None:
            self.drop_inputs_mask = F.Dropout(F.ones_like(inputs), p=self.drop_inputs)

    def _initialize_output_mask(self, F, output) -> None:
        if self.drop_outputs and self.drop_outputs_mask is None:
            self.drop_outputs_mask = F.Dropout(F.ones_like(output), p=self.drop_outputs)

    def hybrid_forward(self, F, inputs, states):
        self._initialize_input_masks(F, inputs, states)
        if self.drop_states:  # only h, the first state, is dropped
            states = list(states)
            states[0] = states[0] * self.drop_states_mask
        if self.drop_inputs:
            inputs = inputs * self.drop_inputs_mask
        next_output, next_states = self.base_cell(inputs, states)
        self._initialize_output_mask(F, next_output)
        if self.drop_outputs:
            next_output = next_output * self.drop_outputs_mask
        return next_output, next_states

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p_out = {self.drop_outputs}, p_state = {self.drop_states})"

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        # Without state dropout, the input and output masks can be applied to the whole sequence at once (a
        # dropout mask shared along the time axis), and the base cell unrolled as it is.
        if self.drop_states:
            return super().unroll(length, inputs, begin_state, layout, merge_outputs, valid_length=valid_length)
        self.reset()
        inputs, axis, F, batch_size = format_sequence(length, inputs, layout, True)
        states = get_begin_state(self, F, begin_state, inputs, batch_size)
        if self.drop_inputs:
            inputs = F.Dropout(inputs, p=self.drop_inputs, axes=(axis,))
        outputs, states = self.base_cell.unroll(length, inputs, states, layout, merge_outputs=True,
                                                valid_length=valid_length)
        if self.drop_outputs:
            outputs = F.Dropout(outputs, p=self.drop_outputs, axes=(axis,))
        merge_outputs = isinstance(outputs, TENSOR_TYPES) if merge_outputs is None else merge_outputs
        outputs, _, _, _ = format_sequence(length, outputs, layout, merge_outputs)
        if valid_length is not None:
            outputs = mask_sequence_variable_length(F, outputs, length, valid_length, axis, merge_outputs)
        return outputs, states


class LSTMPCell(GatedCell):
    """LSTM with a projected recurrent state (https://arxiv.org/abs/1402.1128): the LSTMCell's gates computed
    from r_(t-1) instead of h_(t-1), and r_t = W_hr h_t (``h2r_weight`` (projection_size, hidden_size), no bias).
    States: [r (batch, projection_size), c (batch, hidden_size)]; the output is r_t."""

    _gates = 4

    def __init__(self, hidden_size, projection_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 h2r_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 input_size=0, prefix=None, params=None):
        self._projection_size = projection_size
        self._h2r_weight_initializer = h2r_weight_initializer
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params, recurrent_size=projection_size)

    def _extra_params(self) -> None:
        self.h2r_weight = self.params.get("h2r_weight", shape=(self._projection_size, self._hidden_size),
                                          init=self._h2r_weight_initializer, allow_deferred_init=True)

    def _alias(self):
        return "lstmp"

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._projection_size), "__layout__": "NC"},
                {"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def __repr__(self) -> str:
        shape, proj = self.i2h_weight.shape, self.h2r_weight.shape
        return f"{type(self).__name__}({shape[1] if shape[1] else None} -> {shape[0]} -> {proj[0]})"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, h2r_weight, i2h_bias, h2h_bias):
        i2h, h2h = self._fc_pair(F, inputs, states[0], i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        gates = F.SliceChannel(i2h + h2h, num_outputs=4)
        in_gate = F.Activation(gates[0], act_type="sigmoid")
        forget_gate = F.Activation(gates[1], act_type="sigmoid")
        in_transform = F.Activation(gates[2], act_type="tanh")
        out_gate = F.Activation(gates[3], act_type="sigmoid")
        next_c = forget_gate * states[1] + in_gate * in_transform
        hidden = out_gate * F.Activation(next_c, act_type="tanh")
        next_r = F.FullyConnected(hidden, h2r_weight, num_hidden=self._projection_size, no_bias=True)
        return next_r, [next_r, next_c]
