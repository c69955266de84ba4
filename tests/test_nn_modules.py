"""tr.nn modules against torch.nn with the same weights: outputs and parameter gradients,
registration and traversal, state_dict round trips, train/eval, initialization, and traced
modules with their parameters passed as arguments."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn

rng = np.random.default_rng(3)


class Block(nn.Module):
    """A small model using every layer, written as a PyTorch user would."""

    def __init__(self, library, dtype):
        super().__init__() if library is nn else torch.nn.Module.__init__(self)
        self.embed = library.Embedding(7, 6, padding_idx=0, dtype=dtype)
        self.body = library.Sequential(library.Linear(6, 8, dtype=dtype), library.GELU(),
                                       library.LayerNorm(8, dtype=dtype), library.Dropout(0.2),
                                       library.Linear(8, 8, bias=False, dtype=dtype),
                                       library.SiLU(), library.Tanh(),
                                       library.Linear(8, 5, dtype=dtype), library.ReLU())

    def forward(self, tokens):
        return self.body(self.embed(tokens)).sum(1)


class TorchBlock(torch.nn.Module):
    __init__ = Block.__init__
    forward = Block.forward


def _pair(dtype=np.float64):
    ours = Block(nn, tr.float64 if dtype == np.float64 else tr.float32)
    theirs = TorchBlock(torch.nn, torch.float64 if dtype == np.float64 else torch.float32)
    ours.load_state_dict({name: value.detach().numpy() for name, value in
                          theirs.state_dict().items()})
    return ours, theirs


TOKENS = np.array([[1, 0, 3, 6], [2, 2, 5, 0], [4, 1, 1, 3]])


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, dict(rtol=1e-10, atol=1e-12)),
                                              (np.float32, dict(rtol=1e-5, atol=1e-5))])
def test_model_output_and_gradients_equal_torch(dtype, tolerance):
    ours, theirs = _pair(dtype)
    ours.eval(), theirs.eval()
    output, expected = ours(tr.tensor(TOKENS)), theirs(torch.tensor(TOKENS))
    np.testing.assert_allclose(output.detach().numpy(), expected.detach().numpy(), **tolerance)
    weights = rng.standard_normal(expected.shape).astype(dtype)
    (output * tr.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    reference = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(), reference[name].grad.numpy(),
                                   **tolerance, err_msg=name)
    np.testing.assert_array_equal(ours.embed.weight.grad.numpy()[0], 0)  # the padding row


def test_traversal_names_and_order_match_torch():
    ours, theirs = _pair()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [type(m).__name__ for m in ours.modules()][1:] == [type(m).__name__
                                                              for m in theirs.modules()][1:]
    assert [type(m).__name__ for m in ours.children()] == ["Embedding", "Sequential"]
    assert len(ours.body) == 9 and isinstance(ours.body[1], nn.GELU)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in ours.parameters())


def test_registration_rules():
    model = nn.Module()
    model.weight = nn.Parameter(tr.ones(2))
    model.inner = nn.Linear(2, 2)
    model.note = "not registered"
    model.register_buffer("running", tr.zeros(2))
    assert [n for n, _ in model.named_parameters()] == ["weight", "inner.weight", "inner.bias"]
    assert list(model.state_dict()) == ["weight", "running", "inner.weight", "inner.bias"]
    model.weight = None  # a parameter slot may be emptied
    assert [n for n, _ in model.named_parameters()] == ["inner.weight", "inner.bias"]
    with pytest.raises(tr.ArgumentError, match="test_nn_modules.py.*Parameter"):
        model.inner = tr.ones(2)
    shared = nn.Linear(2, 2)
    twice = nn.Sequential(shared, shared)
    assert len(list(twice.parameters())) == 2  # shared parameters are listed once, as in torch
    del model.inner
    assert not hasattr(model, "inner")


def test_missing_super_init_is_a_clear_error():
    class Forgetful(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(tr.ones(1))

    with pytest.raises(tr.ArgumentError, match="super\\(\\).__init__"):
        Forgetful()


def test_parameter_shares_the_buffer_of_its_data():
    data = tr.ones(3)
    parameter = nn.Parameter(data)
    assert isinstance(parameter, tr.Tensor) and parameter.requires_grad and parameter.is_leaf
    with tr.no_grad():
        parameter.mul_(2)
    np.testing.assert_array_equal(data.numpy(), [2.0, 2.0, 2.0])
    assert not nn.Parameter(tr.ones(1), requires_grad=False).requires_grad
    assert repr(parameter).startswith("Parameter containing:")


def test_state_dict_round_trip_and_errors():
    ours, _ = _pair()
    copy = Block(nn, tr.float64)
    missing, unexpected = copy.load_state_dict(ours.state_dict())
    assert missing == [] and unexpected == []
    ours.eval(), copy.eval()
    np.testing.assert_array_equal(copy(tr.tensor(TOKENS)).detach().numpy(),
                                  ours(tr.tensor(TOKENS)).detach().numpy())
    state = ours.state_dict()
    assert not state["body.0.weight"].requires_grad
    with tr.no_grad():
        ours.body[0].weight.add_(1)  # the state dict shares the parameters' buffers, as in torch
    np.testing.assert_array_equal(state["body.0.weight"].numpy(), ours.body[0].weight.detach().numpy())
    partial = OrderedDict(list(state.items())[:2])
    with pytest.raises(tr.ArgumentError, match="missing keys"):
        copy.load_state_dict(partial)
    assert copy.load_state_dict(partial, strict=False)[0] == list(state)[2:]
    wrong = dict(state, **{"body.0.weight": tr.zeros(3, 3, dtype=tr.float64)})
    with pytest.raises(tr.ShapeMismatchError, match="body.0.weight"):
        copy.load_state_dict(wrong)
    with pytest.raises(tr.ArgumentError, match="unexpected keys \\['extra'\\]"):
        copy.load_state_dict(dict(state, extra=tr.zeros(1)))


def test_train_eval_and_dropout():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert model.training and model[1].training
    x = tr.ones(64, 4)
    tr.manual_seed(0)
    trained = model(x).detach().numpy()
    assert (trained == 0).any()
    model.eval()
    assert not model.training and not model[1].training
    np.testing.assert_array_equal(model(x).detach().numpy(), model[0](x).detach().numpy())
    assert model.train() is model and model[1].training


def test_zero_grad_and_requires_grad():
    model = nn.Linear(3, 2)
    model(tr.ones(1, 3)).sum().backward()
    model.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(model.weight.grad.numpy(), np.zeros((2, 3)))
    model.zero_grad()
    assert model.weight.grad is None and model.bias.grad is None
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


def test_default_initialization_follows_torch():
    tr.manual_seed(1)
    layer = nn.Linear(50, 400)
    bound = 1 / np.sqrt(50)
    weights = layer.weight.detach().numpy()
    # kaiming_uniform(a=sqrt 5): uniform in +-1/sqrt(fan_in), for the weight and for the bias
    assert np.abs(weights).max() <= bound and np.abs(layer.bias.detach().numpy()).max() <= bound
    assert np.abs(weights).max() > 0.99 * bound
    # 20,000 uniform draws: the variance bound**2 / 3 within 3%
    np.testing.assert_allclose(weights.var(), bound ** 2 / 3, rtol=0.03)
    assert layer.weight.dtype == tr.float32 and layer.weight.shape == (400, 50)
    tr.manual_seed(1)
    np.testing.assert_array_equal(nn.Linear(50, 400).weight.detach().numpy(), weights)
    embedding = nn.Embedding(1000, 20, padding_idx=3).weight.detach().numpy()
    np.testing.assert_array_equal(embedding[3], 0)
    np.testing.assert_allclose([embedding.mean(), embedding.std()], [0, 1], atol=0.03)
    norm = nn.LayerNorm((2, 3))
    np.testing.assert_array_equal(norm.weight.detach().numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(norm.bias.detach().numpy(), np.zeros((2, 3)))


def test_module_to_double():
    model = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2)).double()
    assert all(p.dtype == tr.float64 and p.requires_grad for p in model.parameters())
    assert model(tr.ones(1, 3, dtype=tr.float64)).dtype == tr.float64


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_module_to_keeps_the_parameters_and_integer_buffers(library):
    """As PyTorch's: an optimizer made before model.double() still trains the model (tracer's
    once made new Parameters, so the optimizer stepped orphans and the model never changed), the
    gradient is converted with its parameter, num_batches_tracked stays int64, and an integer
    dtype is refused."""
    lib = tr if library == "tracer" else torch
    model = lib.nn.Sequential(lib.nn.Linear(2, 1), lib.nn.BatchNorm1d(1))
    with lib.no_grad():
        model[0].weight.copy_(lib.tensor([[0.5, -1.0]]))
        model[0].bias.fill_(0.25)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.1)
    weight = model[0].weight
    model[0](lib.ones(3, 2)).sum().backward()
    assert model.double() is model and model[0].weight is weight
    assert weight.dtype == weight.grad.dtype == lib.float64 and weight.requires_grad
    np.testing.assert_array_equal(weight.grad.numpy(), [[3.0, 3.0]])
    assert model[1].running_mean.dtype == lib.float64
    assert model[1].num_batches_tracked.dtype == lib.int64
    optimizer.step()
    np.testing.assert_allclose(weight.detach().numpy(), [[0.2, -1.3]], rtol=1e-15)
    with pytest.raises((TypeError, tr.TracerError)):
        model.to(lib.int64)
    parameter = lib.nn.Parameter(lib.ones(2))
    parameter.data = parameter.detach().double()  # `.data =` of another dtype: not a copy into
    assert parameter.dtype == lib.float64 and parameter.requires_grad and parameter.is_leaf


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_load_state_dict_returns_the_named_missing_and_unexpected_keys(library):
    lib = tr if library == "tracer" else torch
    model = lib.nn.Linear(2, 2)
    result = model.load_state_dict(model.state_dict())
    assert tuple(result) == ([], []) and repr(result) == "<All keys matched successfully>"
    result = model.load_state_dict({"weight": lib.ones(2, 2), "extra": lib.ones(1)}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    assert repr(result) == "_IncompatibleKeys(missing_keys=['bias'], unexpected_keys=['extra'])"
    np.testing.assert_array_equal(model.weight.detach().numpy(), np.ones((2, 2)))


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_reassigning_a_parameter_keeps_its_place(library):
    """Tying `b.weight = a.weight` keeps b's order weight, bias (tracer's moved the reassigned
    name last, so parameters() and state_dict() came in another order than PyTorch's, and an
    optimizer state loaded by position went to the wrong parameters)."""
    lib = tr if library == "tracer" else torch
    first, second = lib.nn.Linear(2, 2), lib.nn.Linear(2, 2)
    second.weight = first.weight
    second.bias = lib.nn.Parameter(lib.zeros(2))
    assert [name for name, _ in second.named_parameters()] == ["weight", "bias"]
    model = lib.nn.Sequential(first, second)
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.bias"]


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_named_modules_takes_memo_then_prefix(library):
    lib = tr if library == "tracer" else torch
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.ReLU())
    assert [name for name, _ in model.named_modules(None, "model")] == ["model", "model.0",
                                                                         "model.1"]
    assert [name for name, _ in model.named_modules(prefix="m")] == ["m", "m.0", "m.1"]
    assert [name for name, _ in model.named_parameters("m")] == ["m.0.weight", "m.0.bias"]


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_embedding_keeps_a_negative_padding_idx_as_its_row(library):
    lib = tr if library == "tracer" else torch
    embedding = lib.nn.Embedding(5, 2, padding_idx=-1)
    assert embedding.padding_idx == 4 and repr(embedding) == "Embedding(5, 2, padding_idx=4)"
    np.testing.assert_array_equal(embedding.weight.detach().numpy()[4], [0.0, 0.0])
    embedding(lib.tensor([4, 1, 4])).sum().backward()
    np.testing.assert_array_equal(embedding.weight.grad.numpy()[[1, 4]], [[1.0, 1.0], [0.0, 0.0]])


def test_repr_reads_like_torch():
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    assert repr(model) == ("Sequential(\n  (0): Linear(in_features=3, out_features=2, bias=True)\n"
                           "  (1): ReLU()\n)")


def test_traced_training_step_with_the_parameters_as_arguments():
    """A module called inside @tr.trace, its parameters passed to the traced function (they are
    then runtime inputs, found by identity), against the same eager steps."""
    tr.manual_seed(4)
    traced_model = nn.Sequential(nn.Linear(5, 16, dtype=tr.float64), nn.GELU(), nn.Dropout(0.2),
                                 nn.Linear(16, 3, dtype=tr.float64))
    eager_model = nn.Sequential(nn.Linear(5, 16, dtype=tr.float64), nn.GELU(), nn.Dropout(0.2),
                                nn.Linear(16, 3, dtype=tr.float64))
    eager_model.load_state_dict(traced_model.state_dict())
    x, labels = tr.tensor(rng.standard_normal((8, 5))), tr.tensor(rng.integers(0, 3, 8))

    def step(model, x, labels, parameters):
        loss = nn.functional.cross_entropy(model(x), labels)
        model.zero_grad()
        loss.backward()
        with tr.no_grad():
            for parameter in model.parameters():
                parameter.sub_(0.1 * parameter.grad)
        return loss

    # dropout's generator state is an argument too, so that it advances on every call
    traced = tr.trace(lambda x, labels, parameters, generator_state: step(
        traced_model, x, labels, parameters))
    for seed in range(3):
        tr.manual_seed(seed)
        loss = traced(x, labels, list(traced_model.parameters()), tr.default_generator.state)
        tr.manual_seed(seed)  # the same dropout masks
        expected = step(eager_model, x, labels, None)
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(traced_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(), rtol=1e-11)
        np.testing.assert_allclose(mine.grad.numpy(), reference.grad.numpy(), rtol=1e-10,
                                   atol=1e-14)


def test_traced_module_reading_parameters_only_as_attributes():
    """A module's parameters read as attributes are runtime inputs: their .grad is filled."""
    model = nn.Linear(3, 1)

    @tr.trace
    def loss(x):
        return model(x).sum()

    loss(tr.ones(2, 3)).backward()
    np.testing.assert_array_equal(model.weight.grad.numpy(), np.full((1, 3), 2.0, np.float32))
    np.testing.assert_array_equal(model.bias.grad.numpy(), [2.0])

    with tr.no_grad():
        frozen = loss(tr.ones(2, 3))  # without gradients, the weights are runtime inputs
    expected = (tr.ones(2, 3) @ model.weight.detach().t() + model.bias.detach()).sum()
    np.testing.assert_allclose(frozen.item(), expected.item(), rtol=1e-6)
