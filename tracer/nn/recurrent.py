"""`tr.nn`'s recurrent layers: RNN, LSTM, GRU and the cells RNNCell, LSTMCell, GRUCell, with
PyTorch's arguments, parameter names and shapes (weight_ih_l0, ..., weight_hh_l1_reverse, so
that a torch model's state_dict loads), initialization (every parameter uniform in
+-1/sqrt(hidden_size)), gate order (LSTM i, f, g, o; GRU r, z, n) and results.

They are compositions of linear, sigmoid, tanh, chunk and stack, unrolled over the time steps
when traced. As PyTorch's CPU kernels do, each layer projects the input of all its time steps in
one product before the loop, leaving one (batch, hidden) product per step, and a step adds its
terms in PyTorch's order (the hidden product, then the projected input), so float64 results
agree to a few ulp."""
from __future__ import annotations

import builtins
import math

from tracer.creation import zeros
from tracer.errors import ArgumentError, ShapeMismatchError, warn_at_user_line
from tracer.functional import cat, stack
from tracer.nn import functional as F
from tracer.nn.modules import Module, Parameter, _uniform
from tracer.tensor import Tensor


def _tanh_step(projected: Tensor, state: tuple, weight_hh, bias_hh, weight_hr) -> tuple:
    return ((F.linear(state[0], weight_hh, bias_hh) + projected).tanh(),)


def _relu_step(projected: Tensor, state: tuple, weight_hh, bias_hh, weight_hr) -> tuple:
    return ((F.linear(state[0], weight_hh, bias_hh) + projected).relu(),)


def _lstm_step(projected: Tensor, state: tuple, weight_hh, bias_hh, weight_hr) -> tuple:
    """c' = f c + i g, h' = o tanh(c'), projected by weight_hr when the LSTM has a proj_size."""
    hidden, cell = state
    gates = F.linear(hidden, weight_hh, bias_hh) + projected
    input_gate, forget_gate, cell_gate, output_gate = gates.chunk(4, -1)
    cell = forget_gate.sigmoid() * cell + input_gate.sigmoid() * cell_gate.tanh()
    hidden = output_gate.sigmoid() * cell.tanh()
    return (hidden if weight_hr is None else hidden.matmul(weight_hr.t())), cell


def _gru_step(projected: Tensor, state: tuple, weight_hh, bias_hh, weight_hr) -> tuple:
    """n = tanh(W_in x + b_in + r (W_hn h + b_hn)): the hidden part of the new gate (with its
    bias) is scaled by the reset gate, so the hidden product cannot be merged with the input's;
    h' = n + z (h - n), as PyTorch computes (1 - z) n + z h."""
    hidden = state[0]
    input_reset, input_update, input_new = projected.chunk(3, -1)
    hidden_reset, hidden_update, hidden_new = F.linear(hidden, weight_hh, bias_hh).chunk(3, -1)
    reset = (hidden_reset + input_reset).sigmoid()
    update = (hidden_update + input_update).sigmoid()
    new = (input_new + hidden_new * reset).tanh()
    return ((hidden - new) * update + new,)


# mode -> (gates stacked in the weights, the step, the states: 2 for LSTM's (h, c))
_MODES = {"RNN_TANH": (1, _tanh_step, 1), "RNN_RELU": (1, _relu_step, 1),
          "LSTM": (4, _lstm_step, 2), "GRU": (3, _gru_step, 1)}
_NONLINEARITIES = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}


def _project(input: Tensor, weight_ih: Tensor, bias_ih: Tensor | None) -> Tensor:
    """The input projection of every time step of (length, batch, features) in one product."""
    length, batch, features = input.shape
    flat = F.linear(input.reshape(length * batch, features), weight_ih, bias_ih)
    return flat.reshape(length, batch, flat.shape[-1])


def _run_direction(step, projected: Tensor, state: tuple, hidden_weights: tuple,
                   reverse: builtins.bool) -> tuple[Tensor, tuple]:
    """The hidden states of every time step (in time order) and the last state."""
    length = projected.shape[0]
    outputs: list = [None] * length
    for time in (range(length - 1, -1, -1) if reverse else range(length)):
        state = step(projected[time], state, *hidden_weights)
        outputs[time] = state[0]
    return stack(outputs), state


def _check_choice(name: str, value, kind: type) -> None:
    if not isinstance(value, kind) or kind is int and isinstance(value, builtins.bool):
        raise ArgumentError(f"{name} should be of type {kind.__name__}, got "
                            f"{type(value).__name__}")


def _check_sizes(input_size: int, hidden_size: int) -> None:
    for name, size in (("input_size", input_size), ("hidden_size", hidden_size)):
        _check_choice(name, size, int)
        if size <= 0:
            raise ArgumentError(f"{name} must be greater than zero, got {size}")


class RNNBase(Module):
    """The layers' common parts: parameters in PyTorch's order, the checks of the input and the
    initial state, and the loop over layers and directions."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: builtins.bool = True, batch_first: builtins.bool = False,
                 dropout: float = 0.0, bidirectional: builtins.bool = False,
                 proj_size: int = 0, dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        _check_sizes(input_size, hidden_size)
        for option, value in (("bias", bias), ("batch_first", batch_first),
                              ("bidirectional", bidirectional)):
            _check_choice(option, value, builtins.bool)
        _check_choice("num_layers", num_layers, int)
        if num_layers <= 0:
            raise ArgumentError(f"num_layers must be greater than zero, got {num_layers}")
        if isinstance(dropout, builtins.bool) or not 0 <= dropout <= 1:
            raise ArgumentError(f"dropout should be a number in range [0, 1] representing the "
                                f"probability of an element being zeroed, got {dropout}")
        if dropout > 0 and num_layers == 1:
            warn_at_user_line(f"{name}: dropout applies between recurrent layers, so dropout="
                              f"{dropout} does nothing with num_layers=1", UserWarning)
        if not 0 <= proj_size < hidden_size:
            raise ArgumentError(f"proj_size is 0 (no projection) or a positive number smaller "
                                f"than hidden_size ({hidden_size}), got {proj_size}")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, proj_size
        self._make_parameters(dtype)

    def _make_parameters(self, dtype) -> None:
        gates = _MODES[self.mode][0] * self.hidden_size
        output_size = self.proj_size or self.hidden_size
        bound = 1.0 / math.sqrt(self.hidden_size)
        for layer in range(self.num_layers):
            inputs = self.input_size if layer == 0 else output_size * self.directions
            for suffix in self._suffixes():
                shapes = {"weight_ih": (gates, inputs), "weight_hh": (gates, output_size)}
                if self.bias:
                    shapes.update(bias_ih=(gates,), bias_hh=(gates,))
                if self.proj_size:
                    shapes["weight_hr"] = (self.proj_size, self.hidden_size)
                for name, shape in shapes.items():
                    setattr(self, f"{name}_l{layer}{suffix}",
                            Parameter(_uniform(shape, bound, dtype)))

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self) -> tuple[str, ...]:
        return ("", "_reverse") if self.bidirectional else ("",)

    def _layer_weights(self, layer: int, suffix: str) -> tuple:
        """(weight_ih, bias_ih) and (weight_hh, bias_hh, weight_hr), None where absent."""
        names = [f"{name}_l{layer}{suffix}"
                 for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh", "weight_hr")]
        parameters = [getattr(self, name) if name in self._parameters else None for name in names]
        return tuple(parameters[:2]), tuple(parameters[2:])

    def flatten_parameters(self) -> None:
        """Nothing to do: PyTorch packs the weights into one buffer for cuDNN; models call this."""

    def _state_shapes(self, batch: int) -> list[tuple[int, ...]]:
        layers = self.num_layers * self.directions
        shapes = [(layers, batch, self.proj_size or self.hidden_size)]
        return shapes + [(layers, batch, self.hidden_size)] * (_MODES[self.mode][2] - 1)

    def _check_input(self, input: Tensor) -> None:
        name = type(self).__name__
        if input.ndim not in (2, 3):
            raise ShapeMismatchError(f"{name}: expected input to be 2-D (unbatched) or 3-D, got "
                                     f"shape {list(input.shape)}")
        weight = self.weight_ih_l0
        if input.dtype != weight.dtype:
            raise ArgumentError(f"{name} input dtype ({input.dtype}) does not match weight dtype "
                                f"({weight.dtype}); convert the input with .to({weight.dtype}) "
                                f"or the model with .to({input.dtype})")
        if input.shape[-1] != self.input_size:
            raise ShapeMismatchError(f"{name}: input.size(-1) must be equal to input_size. "
                                     f"Expected {self.input_size}, got {input.shape[-1]}")
        if input.shape[0 if input.ndim == 2 or not self.batch_first else 1] == 0:
            raise ShapeMismatchError(f"{name}: expected a sequence of at least one time step, "
                                     f"got input of shape {list(input.shape)}")

    def _initial_states(self, states: tuple | None, input: Tensor,
                        unbatched: builtins.bool) -> tuple:
        """The initial states (layers * directions, batch, size) given or zeros, checked."""
        shapes = self._state_shapes(input.shape[1])
        if states is None:
            return tuple(zeros(*shape, dtype=input.dtype) for shape in shapes)
        name, dimensions = type(self).__name__, 2 if unbatched else 3
        if any(state.ndim != dimensions for state in states):
            raise ShapeMismatchError(f"{name}: for {'unbatched 2' if unbatched else 'batched 3'}"
                                     f"-D input, the initial states should also be "
                                     f"{dimensions}-D, got shapes "
                                     f"{[list(state.shape) for state in states]}")
        states = tuple(state.unsqueeze(1) if unbatched else state for state in states)
        for state, shape in zip(states, shapes):
            if state.shape != shape:
                raise ShapeMismatchError(f"{name}: expected hidden size {shape}, got "
                                         f"{list(state.shape)}")
        return states

    def _run(self, input: Tensor, states: tuple | None) -> tuple[Tensor, tuple]:
        """The output and the final states, for the input and states as the user gave them."""
        self._check_input(input)
        unbatched = input.ndim == 2
        sequence = (input.unsqueeze(1) if unbatched
                    else input.transpose(0, 1) if self.batch_first else input)
        states = self._initial_states(states, sequence, unbatched)
        output, finals = self._layers(sequence, states)
        if unbatched:
            return output.squeeze(1), tuple(final.squeeze(1) for final in finals)
        return (output.transpose(0, 1) if self.batch_first else output), finals

    def _layers(self, sequence: Tensor, states: tuple) -> tuple[Tensor, tuple]:
        """Every layer in every direction over a (length, batch, features) sequence."""
        step = _MODES[self.mode][1]
        finals: list[list[Tensor]] = [[] for _ in states]
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(self._suffixes()):
                (weight_ih, bias_ih), hidden_weights = self._layer_weights(layer, suffix)
                index = layer * self.directions + direction
                output, state = _run_direction(step, _project(sequence, weight_ih, bias_ih),
                                               tuple(s[index] for s in states), hidden_weights,
                                               reverse=direction == 1)
                outputs.append(output)
                for kept, final in zip(finals, state):
                    kept.append(final)
            sequence = cat(outputs, -1) if len(outputs) > 1 else outputs[0]
            if layer < self.num_layers - 1 and self.training and self.dropout > 0:
                sequence = F.dropout(sequence, self.dropout)
        return sequence, tuple(stack(kept) for kept in finals)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        for option, default in (("proj_size", 0), ("num_layers", 1), ("bias", True),
                                ("batch_first", False), ("dropout", 0.0),
                                ("bidirectional", False)):
            if getattr(self, option) != default:
                text += f", {option}={getattr(self, option)}"
        return text


class RNN(RNNBase):
    """The Elman RNN: h' = tanh (or relu) of W_ih x + b_ih + W_hh h + b_hh."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: builtins.bool = True,
                 batch_first: builtins.bool = False, dropout: float = 0.0,
                 bidirectional: builtins.bool = False, dtype=None) -> None:
        if nonlinearity not in _NONLINEARITIES:
            raise ArgumentError(f"RNN: nonlinearity is 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(_NONLINEARITIES[nonlinearity], input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, (hidden,) = self._run(input, None if hx is None else (hx,))
        return output, hidden


class GRU(RNNBase):
    """The gated recurrent unit, gates r, z, n stacked in that order in the weights."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: builtins.bool = True, batch_first: builtins.bool = False,
                 dropout: float = 0.0, bidirectional: builtins.bool = False, dtype=None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, (hidden,) = self._run(input, None if hx is None else (hx,))
        return output, hidden


class LSTM(RNNBase):
    """The long short-term memory, gates i, f, g, o stacked in that order in the weights; with a
    `proj_size`, the hidden state is projected by weight_hr_l* (proj_size, hidden_size)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: builtins.bool = True, batch_first: builtins.bool = False,
                 dropout: float = 0.0, bidirectional: builtins.bool = False,
                 proj_size: int = 0, dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, dtype=dtype)

    def forward(self, input: Tensor,
                hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ArgumentError("LSTM: hx is a pair (h_0, c_0) of tensors")
        output, (hidden, cell) = self._run(input, None if hx is None else tuple(hx))
        return output, (hidden, cell)


class RNNCellBase(Module):
    """One time step: weight_ih (gates * hidden, input), weight_hh (gates * hidden, hidden),
    bias_ih and bias_hh (gates * hidden), uniform in +-1/sqrt(hidden_size)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int,
                 bias: builtins.bool = True, dtype=None) -> None:
        super().__init__()
        _check_sizes(input_size, hidden_size)
        _check_choice("bias", bias, builtins.bool)
        self.mode, self.input_size, self.hidden_size, self.bias = (mode, input_size, hidden_size,
                                                                   bias)
        gates, bound = _MODES[mode][0] * hidden_size, 1.0 / math.sqrt(hidden_size)
        self.weight_ih = Parameter(_uniform((gates, input_size), bound, dtype))
        self.weight_hh = Parameter(_uniform((gates, hidden_size), bound, dtype))
        self.bias_ih = Parameter(_uniform((gates,), bound, dtype)) if bias else None
        self.bias_hh = Parameter(_uniform((gates,), bound, dtype)) if bias else None

    def _step(self, input: Tensor, states: tuple | None) -> tuple:
        """The next states, for an input (batch, input_size) or (input_size,)."""
        name = type(self).__name__
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeMismatchError(f"{name}: expected input of shape (batch, {self.input_size}) "
                                     f"or ({self.input_size},), got {list(input.shape)}")
        unbatched = input.ndim == 1
        batch = input.unsqueeze(0) if unbatched else input
        shape = (batch.shape[0], self.hidden_size)
        if states is None:
            states = (zeros(*shape, dtype=input.dtype),) * _MODES[self.mode][2]
        elif any(state.shape != shape[unbatched:] for state in states):
            raise ShapeMismatchError(f"{name}: expected hidden states of shape "
                                     f"{list(shape[unbatched:])}, got "
                                     f"{[list(state.shape) for state in states]}")
        else:
            states = tuple(state.unsqueeze(0) if unbatched else state for state in states)
        projected = F.linear(batch, self.weight_ih, self.bias_ih)
        states = _MODES[self.mode][1](projected, states, self.weight_hh, self.bias_hh, None)
        return tuple(state.squeeze(0) if unbatched else state for state in states)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: builtins.bool = True,
                 nonlinearity: str = "tanh", dtype=None) -> None:
        if nonlinearity not in _NONLINEARITIES:
            raise ArgumentError(f"RNNCell: nonlinearity is 'tanh' or 'relu', got "
                                f"{nonlinearity!r}")
        super().__init__(_NONLINEARITIES[nonlinearity], input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, None if hx is None else (hx,))[0]


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: builtins.bool = True,
                 dtype=None) -> None:
        super().__init__("GRU", input_size, hidden_size, bias, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, None if hx is None else (hx,))[0]


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: builtins.bool = True,
                 dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, bias, dtype)

    def forward(self, input: Tensor,
                hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ArgumentError("LSTMCell: hx is a pair (h_0, c_0) of tensors")
        hidden, cell = self._step(input, None if hx is None else tuple(hx))
        return hidden, cell
