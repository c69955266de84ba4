"""tr.nn.RNN, LSTM, GRU and their cells (tracer/nn/recurrent.py) against torch.nn's with the same
weights (loaded from the torch module's state_dict): outputs, final states and the gradients of
every parameter, the input and the initial states, float64 (to 1e-12) and float32, eagerly and
traced, for every constructor option; a traced training step that compiles once; parameter
names, shapes and initialization; and the errors PyTorch raises, as tr.TracerError."""
import math

import numpy as np
import pytest
import torch

import tracer as tr

rng = np.random.default_rng(11)
LENGTH, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
TOLERANCES = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-6)}

# name -> (class name, constructor options)
MODULES = {
    "rnn tanh": ("RNN", {}),
    "rnn relu two layers no bias": ("RNN", dict(nonlinearity="relu", num_layers=2, bias=False)),
    "rnn bidirectional batch_first": ("RNN", dict(bidirectional=True, batch_first=True)),
    "lstm": ("LSTM", {}),
    "lstm two layers bidirectional batch_first": ("LSTM", dict(num_layers=2, bidirectional=True,
                                                               batch_first=True)),
    "lstm no bias": ("LSTM", dict(bias=False)),
    "lstm proj_size two layers bidirectional": ("LSTM", dict(proj_size=2, num_layers=2,
                                                             bidirectional=True)),
    "gru": ("GRU", {}),
    "gru three layers batch_first": ("GRU", dict(num_layers=3, batch_first=True)),
    "gru bidirectional no bias": ("GRU", dict(bidirectional=True, bias=False)),
}


def _pair(kind: str, options: dict, dtype, input_size: int = INPUT, hidden: int = HIDDEN):
    """A torch module and a tracer module with the torch module's weights."""
    torch.manual_seed(len(kind) + len(options))
    theirs = getattr(torch.nn, kind)(input_size, hidden, **options).to(
        torch.float64 if dtype == np.float64 else torch.float32)
    ours = getattr(tr.nn, kind)(input_size, hidden, **options, dtype=tr.float64 if dtype == np.float64
                                else tr.float32)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _state_shapes(kind: str, options: dict, batch: int | None) -> list[tuple[int, ...]]:
    layers = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    batch_shape = () if batch is None else (batch,)
    shapes = [(layers, *batch_shape, options.get("proj_size") or HIDDEN)]
    return shapes + [(layers, *batch_shape, HIDDEN)] if kind == "LSTM" else shapes


def _flat(result) -> list:
    """(output, h) or (output, (h, c)) as a list of tensors."""
    output, final = result
    return [output, *final] if isinstance(final, tuple) else [output, final]


def _apply(kind, module, library, input, states, cotangents):
    """The module's results, and the backward of sum(results * cotangents) run."""
    if not states:
        result = module(input)
    else:
        result = module(input, tuple(states) if kind == "LSTM" else states[0])
    results = _flat(result)
    total = sum((r * library.tensor(c)).sum() for r, c in zip(results, cotangents))
    total.backward()
    return results


def _check_against_torch(kind, options, dtype, traced, with_states, unbatched):
    theirs, ours = _pair(kind, options, dtype)
    batch = None if unbatched else BATCH
    shape = ((LENGTH, INPUT) if unbatched else (BATCH, LENGTH, INPUT) if options.get("batch_first")
             else (LENGTH, BATCH, INPUT))
    arrays = [rng.standard_normal(shape).astype(dtype)]
    if with_states:
        arrays += [rng.standard_normal(s).astype(dtype) for s in _state_shapes(kind, options, batch)]
    mine = [tr.tensor(a, requires_grad=True) for a in arrays]
    reference = [torch.tensor(a, requires_grad=True) for a in arrays]
    with torch.no_grad():  # (for the results' shapes)
        shapes = [r.shape for r in _flat(theirs(reference[0], (
            tuple(reference[1:]) if kind == "LSTM" else reference[1]) if with_states else None))]
    cotangents = [rng.standard_normal(tuple(s)).astype(dtype) for s in shapes]
    expected = [r.detach().numpy() for r in _apply(kind, theirs, torch, reference[0], reference[1:],
                                                   cotangents)]

    def run(input, *states):
        return tuple(_apply(kind, ours, tr, input, states, cotangents))

    results = (tr.trace(run) if traced else run)(*mine)
    tolerance = TOLERANCES[dtype]
    for result, value in zip(results, expected, strict=True):
        assert result.shape == value.shape and result.dtype == value.dtype
        np.testing.assert_allclose(result.detach().numpy(), value, **tolerance)
    for index, (tensor, reference_tensor) in enumerate(zip(mine, reference)):
        np.testing.assert_allclose(tensor.grad.numpy(), reference_tensor.grad.numpy(), **tolerance,
                                   err_msg=f"gradient of argument {index}")
    expected_parameters = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(), expected_parameters[name].grad.numpy(),
                                   **tolerance, err_msg=f"gradient of {name}")


@pytest.mark.parametrize("with_states", [False, True], ids=["zero states", "given states"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_float64_eager_matches_torch(name, with_states):
    _check_against_torch(*MODULES[name], np.float64, False, with_states, unbatched=False)


@pytest.mark.parametrize("with_states", [False, True], ids=["zero states", "given states"])
@pytest.mark.parametrize("name", ["rnn relu two layers no bias", "lstm",
                                  "lstm proj_size two layers bidirectional", "gru"])
def test_unbatched_input_matches_torch(name, with_states):
    _check_against_torch(*MODULES[name], np.float64, False, with_states, unbatched=True)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", ["rnn bidirectional batch_first",
                                  "lstm two layers bidirectional batch_first",
                                  "gru three layers batch_first"])
def test_float32_matches_torch(name, traced):
    _check_against_torch(*MODULES[name], np.float32, traced, with_states=True, unbatched=False)


@pytest.mark.parametrize("name", ["rnn relu two layers no bias", "lstm proj_size two layers "
                                  "bidirectional", "gru bidirectional no bias"])
def test_float64_traced_matches_torch(name):
    _check_against_torch(*MODULES[name], np.float64, True, with_states=True, unbatched=False)


def test_a_traced_training_step_compiles_once_and_follows_torch():
    """A two-layer bidirectional LSTM and a linear head, trained by SGD with momentum for three
    steps on new data each time: one compile, parameters equal to torch's after every step."""
    theirs, ours = _pair("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True),
                         np.float64)
    torch_head = torch.nn.Linear(2 * HIDDEN, 1).double()
    head = tr.nn.Linear(2 * HIDDEN, 1, dtype=tr.float64)
    head.load_state_dict(torch_head.state_dict())
    parameters = [*ours.parameters(), *head.parameters()]
    optimizer = tr.optim.SGD(parameters, lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD([*theirs.parameters(), *torch_head.parameters()], lr=0.1,
                                      momentum=0.9)

    @tr.trace
    def step(x, target):
        optimizer.zero_grad()
        output, (hidden, cell) = ours(x)
        loss = tr.nn.functional.mse_loss(head(output[:, -1]), target) + cell.square().mean()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        x, target = rng.standard_normal((BATCH, LENGTH, INPUT)), rng.standard_normal((BATCH, 1))
        torch_optimizer.zero_grad()
        output, (hidden, cell) = theirs(torch.tensor(x))
        loss = (torch.nn.functional.mse_loss(torch_head(output[:, -1]), torch.tensor(target))
                + cell.square().mean())
        loss.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(step(x, target).item(), loss.item(), rtol=1e-12)
        expected = [p.detach().numpy() for p in [*theirs.parameters(), *torch_head.parameters()]]
        for parameter, value in zip(parameters, expected, strict=True):
            np.testing.assert_allclose(parameter.detach().numpy(), value, rtol=1e-11, atol=1e-12)
    assert step.cache_info().misses == 1


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_dropout_between_layers_in_training_only(kind):
    """Dropout of probability 1 (deterministic) zeroes the second layer's input in training, as
    PyTorch's; in eval mode the layers see each other's outputs."""
    theirs, ours = _pair(kind, dict(num_layers=2, dropout=1.0), np.float64)
    x = rng.standard_normal((LENGTH, BATCH, INPUT))
    for training in (True, False):
        theirs.train(training)
        ours.train(training)
        expected = theirs(torch.tensor(x))[0].detach().numpy()
        np.testing.assert_allclose(ours(tr.tensor(x))[0].detach().numpy(), expected, rtol=1e-12,
                                   atol=1e-12)


def test_dropout_with_one_layer_warns_as_pytorch():
    with pytest.warns(UserWarning, match="num_layers=1"):
        tr.nn.GRU(INPUT, HIDDEN, dropout=0.2)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_parameter_names_shapes_and_initialization(name):
    kind, options = MODULES[name]
    theirs = getattr(torch.nn, kind)(INPUT, HIDDEN, **options)
    ours = getattr(tr.nn, kind)(INPUT, HIDDEN, **options)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [
        (n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    bound = 1 / math.sqrt(HIDDEN)
    values = np.concatenate([p.detach().numpy().reshape(-1) for p in ours.parameters()])
    assert values.dtype == np.float32 and np.abs(values).max() <= bound
    # uniform(-bound, bound): standard deviation bound / sqrt 3
    assert abs(values.std() - bound / math.sqrt(3)) < 0.1 * bound
    assert repr(ours).startswith(f"{kind}({INPUT}, {HIDDEN}")


# (class name, constructor options): one time step, PyTorch's cells
CELLS = {"rnn cell": ("RNNCell", {}), "rnn cell relu no bias": ("RNNCell", dict(
    nonlinearity="relu", bias=False)), "lstm cell": ("LSTMCell", {}), "gru cell": ("GRUCell", {}),
    "gru cell no bias": ("GRUCell", dict(bias=False))}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero state", "given state"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_cells_match_torch(name, with_state, batched, traced):
    kind, options = CELLS[name]
    theirs, ours = _pair(kind, options, np.float64)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    batch_shape = (BATCH,) if batched else ()
    arrays = [rng.standard_normal((*batch_shape, INPUT))]
    if with_state:
        arrays += [rng.standard_normal((*batch_shape, HIDDEN))
                   for _ in range(2 if kind == "LSTMCell" else 1)]
    mine = [tr.tensor(a, requires_grad=True) for a in arrays]
    reference = [torch.tensor(a, requires_grad=True) for a in arrays]
    cotangents = [rng.standard_normal((*batch_shape, HIDDEN)) for _ in range(2)]

    def step(library, module, input, *states):
        state = None if not states else tuple(states) if kind == "LSTMCell" else states[0]
        results = module(input, state)
        results = list(results) if isinstance(results, tuple) else [results]
        sum((r * library.tensor(c)).sum() for r, c in zip(results, cotangents)).backward()
        return tuple(results)

    expected = step(torch, theirs, *reference)
    results = (tr.trace(step, static_argnums=(0, 1)) if traced else step)(tr, ours, *mine)
    for result, value in zip(results, expected, strict=True):
        np.testing.assert_allclose(result.detach().numpy(), value.detach().numpy(), rtol=1e-12,
                                   atol=1e-12)
    for tensor, reference_tensor in zip(mine, reference):
        np.testing.assert_allclose(tensor.grad.numpy(), reference_tensor.grad.numpy(),
                                   rtol=1e-12, atol=1e-12)
    expected_parameters = dict(theirs.named_parameters())
    for parameter_name, parameter in ours.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(),
                                   expected_parameters[parameter_name].grad.numpy(), rtol=1e-12,
                                   atol=1e-12)


def lstm(*arguments):  # (modules made when a test runs, from the random state it finds)
    return tr.nn.LSTM(INPUT, HIDDEN, num_layers=2)(*arguments)


def gru(*arguments):
    return tr.nn.GRU(INPUT, HIDDEN, batch_first=True)(*arguments)


def lstm_cell(*arguments):
    return tr.nn.LSTMCell(INPUT, HIDDEN)(*arguments)


@pytest.mark.parametrize("call, message", [
    (lambda: lstm(tr.zeros(2, 3, 4, INPUT)), "2-D .unbatched. or 3-D"),
    (lambda: lstm(tr.zeros(LENGTH, BATCH, INPUT + 1)), "Expected 4, got 5"),
    (lambda: lstm(tr.zeros(LENGTH, BATCH, INPUT, dtype=tr.float64)), "dtype"),
    (lambda: lstm(tr.zeros(0, BATCH, INPUT)), "at least one time step"),
    (lambda: lstm(tr.zeros(LENGTH, BATCH, INPUT), tr.zeros(2, BATCH, HIDDEN)), "pair"),
    (lambda: lstm(tr.zeros(LENGTH, BATCH, INPUT), (tr.zeros(2, BATCH, HIDDEN),
                                                   tr.zeros(1, BATCH, HIDDEN))),
     r"expected hidden size \(2, 3, 6\), got \[1, 3, 6\]"),
    (lambda: lstm(tr.zeros(LENGTH, INPUT), (tr.zeros(2, 1, HIDDEN), tr.zeros(2, 1, HIDDEN))),
     "unbatched 2-D input"),
    (lambda: gru(tr.zeros(BATCH, LENGTH, INPUT), tr.zeros(1, HIDDEN)), "batched 3-D input"),
    (lambda: gru(tr.zeros(BATCH, LENGTH, INPUT), tr.zeros(1, LENGTH, HIDDEN)),
     r"expected hidden size \(1, 3, 6\)"),
    (lambda: lstm_cell(tr.zeros(BATCH, INPUT + 1)), "expected input of shape"),
    (lambda: lstm_cell(tr.zeros(BATCH, INPUT), (tr.zeros(BATCH, HIDDEN), tr.zeros(HIDDEN))),
     "expected hidden states of shape"),
    (lambda: tr.nn.RNN(INPUT, HIDDEN, nonlinearity="sigmoid"), "'tanh' or 'relu'"),
    (lambda: tr.nn.LSTM(INPUT, 0), "hidden_size must be greater than zero"),
    (lambda: tr.nn.GRU(INPUT, HIDDEN, num_layers=0), "num_layers must be greater than zero"),
    (lambda: tr.nn.LSTM(INPUT, HIDDEN, dropout=1.5), r"range \[0, 1\]"),
    (lambda: tr.nn.LSTM(INPUT, HIDDEN, proj_size=HIDDEN), "smaller than hidden_size"),
    (lambda: tr.nn.LSTM(INPUT, HIDDEN, batch_first=1), "batch_first should be of type bool"),
    (lambda: tr.nn.RNNCell(INPUT, 2.0), "hidden_size should be of type int"),
])
def test_bad_arguments_are_clear_errors(call, message):
    with pytest.raises(tr.TracerError, match=message) as caught:
        call()
    assert "test_nn_recurrent.py" in str(caught.value)  # the user's line


def test_traced_bad_shape_is_an_error_at_trace_time():
    with pytest.raises(tr.TracerError, match="input_size"):
        module = tr.nn.GRU(INPUT, HIDDEN, batch_first=True)
        tr.trace(lambda x: module(x)[0])(np.zeros((BATCH, LENGTH, INPUT + 2), np.float32))


def test_proj_size_is_not_an_argument_of_rnn_or_gru():
    with pytest.raises(TypeError, match="proj_size"):
        tr.nn.GRU(INPUT, HIDDEN, proj_size=2)
