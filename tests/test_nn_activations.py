"""tracer/nn/activations.py and activation_modules.py against torch: values and gradients of every
function and option, float64 (to 1e-12) and float32, eagerly and traced, at the kinks (0, ±3, the
threshold) and at values either side of them; the modules' parameters, in-place forms, reprs,
errors, and a traced training step through them that compiles once."""
import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import compare_with_torch

rng = np.random.default_rng(5)
# ordinary values and the kinks: 0, ±3 (hardswish, hardsigmoid), the thresholds below
KINKS = np.array([0.0, -0.0, 3.0, -3.0, 0.1, -2.0, 1e-300, -1e-300, 40.0, -40.0])
VALUES = np.concatenate([rng.standard_normal(30) * 3, KINKS]).reshape(5, 8)
TIGHT = {np.float64: dict(rtol=1e-12, atol=1e-15), np.float32: None}

# name -> function of (library, x), the same in tracer and torch
FUNCTIONS = {
    "leaky_relu": lambda lib, x: lib.nn.functional.leaky_relu(x),
    "leaky_relu slope": lambda lib, x: lib.nn.functional.leaky_relu(x, negative_slope=-0.3),
    "elu": lambda lib, x: lib.nn.functional.elu(x),
    "elu alpha": lambda lib, x: lib.nn.functional.elu(x, alpha=0.4),
    "selu": lambda lib, x: lib.nn.functional.selu(x),
    "celu": lambda lib, x: lib.nn.functional.celu(x),
    "celu alpha": lambda lib, x: lib.nn.functional.celu(x, alpha=2.5),
    "mish": lambda lib, x: lib.nn.functional.mish(x),
    "hardswish": lambda lib, x: lib.nn.functional.hardswish(x),
    "hardsigmoid": lambda lib, x: lib.nn.functional.hardsigmoid(x),
    "logsigmoid": lambda lib, x: lib.nn.functional.logsigmoid(x),
    "softsign": lambda lib, x: lib.nn.functional.softsign(x),
    "tanhshrink": lambda lib, x: lib.nn.functional.tanhshrink(x),
    "threshold": lambda lib, x: lib.nn.functional.threshold(x, 0.1, 20.0),
    "sigmoid": lambda lib, x: lib.nn.functional.sigmoid(x),
    "glu": lambda lib, x: lib.nn.functional.glu(x),
    "glu dim": lambda lib, x: lib.nn.functional.glu(x[1:], 0),
    "softmin": lambda lib, x: lib.nn.functional.softmin(x, dim=1),
    "softmin dim 0": lambda lib, x: lib.nn.functional.softmin(x, 0),
    "softmin implicit": lambda lib, x: lib.nn.functional.softmin(x[0]),
}


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")  # (torch's, for softmin)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_matches_torch(name, dtype, traced):
    function = FUNCTIONS[name]
    compare_with_torch(lambda x: function(tr, x), lambda x: function(torch, x),
                       [VALUES.astype(dtype)], traced=traced, tolerance=TIGHT[dtype])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("shape, dim", [((0,), 0), ((3, 0), 1), ((0, 4), 1)])
def test_glu_of_zero_size_halves_is_empty_as_torchs(shape, dim, traced):
    """A dimension of size 0 halves into two empty ones (found by the long differential run:
    chunk gave one chunk and glu failed with a Python ValueError)."""
    compare_with_torch(lambda x: tr.nn.functional.glu(x, dim),
                       lambda x: torch.nn.functional.glu(x, dim), [np.zeros(shape)],
                       traced=traced, tolerance=TIGHT[np.float64])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape, weights", [((5, 8), 1), ((5, 8), 8), ((2, 3, 4), 3), ((7,), 1)])
def test_prelu_matches_torch(shape, weights, dtype, traced):
    inputs = VALUES.reshape(-1)[:int(np.prod(shape))].reshape(shape).astype(dtype)
    weight = rng.uniform(-0.5, 0.5, weights).astype(dtype)
    compare_with_torch(tr.nn.functional.prelu, torch.nn.functional.prelu, [inputs, weight],
                       traced=traced, tolerance=TIGHT[dtype])


def test_second_derivatives_match_torch():
    """PyTorch's double backward formulas: elu's is 0 at x = 0 (its backward's x < 0), hardswish's
    1/3 strictly between -3 and 3."""
    # (PyTorch has no second derivative of hardsigmoid)
    names = ["elu alpha", "selu", "celu alpha", "mish", "hardswish", "logsigmoid",
             "leaky_relu", "softsign", "tanhshrink", "glu"]
    for name in names:
        function = FUNCTIONS[name]
        grads = []
        for lib in (tr, torch):
            x = lib.tensor(VALUES, requires_grad=True)
            (first,) = (torch.autograd.grad if lib is torch else tr.autograd.grad)(
                function(lib, x).sum(), x, create_graph=True)
            if not first.requires_grad:  # (tracer's gradient of a piecewise-linear function
                grads.append(np.zeros_like(VALUES))  # is constant: no graph, as for relu)
                continue
            (second,) = (torch.autograd.grad if lib is torch else tr.autograd.grad)(
                (first * first).sum(), x)
            grads.append(second.detach().numpy())
        np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15, err_msg=name)


def test_gradients_at_the_kinks_are_pytorchs():
    x = tr.tensor([0.0, -3.0, 3.0, float("nan")], dtype=tr.float64, requires_grad=True)
    tr.nn.functional.leaky_relu(x, 0.2).sum().backward()
    assert x.grad.tolist() == [0.2, 0.2, 1.0, 0.2]
    x.grad = None
    tr.nn.functional.hardswish(x).sum().backward()
    assert x.grad.tolist() == [0.5, 0.0, 1.0, 1.0]  # 0 at -3, 1 at 3 and at nan, as PyTorch's


@pytest.mark.parametrize("name, module_arguments", [
    ("LeakyReLU", (0.2,)), ("ELU", (0.5,)), ("CELU", (2.0,)), ("SELU", ()), ("Mish", ()),
    ("Hardswish", ()), ("Hardsigmoid", ()), ("Threshold", (0.1, 20.0)), ("ReLU", ()),
    ("SiLU", ()), ("Hardtanh", (-0.5, 0.5)), ("ReLU6", ()), ("Dropout", (0.0,))])
def test_in_place_forms_change_their_input(name, module_arguments):
    ours = tr.tensor(VALUES) * 1
    theirs = torch.tensor(VALUES)
    module = getattr(nn, name)(*module_arguments, inplace=True)
    their_module = getattr(torch.nn, name)(*module_arguments, inplace=True)
    assert repr(module) == repr(their_module)
    result, expected = module(ours), their_module(theirs)
    assert result is ours
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-12, atol=1e-15)


MODULES = [("Sigmoid", {}), ("LogSigmoid", {}), ("Softsign", {}), ("Tanhshrink", {}),
           ("SELU", {}), ("Mish", {}), ("Hardswish", {}), ("Hardsigmoid", {}),
           ("LeakyReLU", dict(negative_slope=0.3)), ("ELU", dict(alpha=0.5)),
           ("CELU", dict(alpha=0.5)), ("Threshold", dict(threshold=0.5, value=-1.0)),
           ("GLU", dict(dim=0)), ("GLU", {}), ("Softmax", dict(dim=1)), ("LogSoftmax", dict(dim=0)),
           ("Softmin", dict(dim=1)), ("Softmax", {}), ("PReLU", {}),
           ("PReLU", dict(num_parameters=8, init=0.1)), ("ReLU", {}), ("SiLU", {}),
           ("Hardtanh", dict(min_val=-0.5, max_val=2.0)), ("ReLU6", {})]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, options", MODULES, ids=lambda v: str(v))
def test_module_matches_torch(name, options, traced):
    ours, theirs = getattr(nn, name)(**options), getattr(torch.nn, name)(**options)
    assert repr(ours) == repr(theirs)
    ours.load_state_dict({k: tr.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    inputs = VALUES[:4].astype(np.float32)
    compare_with_torch(ours, theirs, [inputs], traced=traced)


def test_prelu_parameters_are_pytorchs():
    ours, theirs = nn.PReLU(3, init=0.1, dtype=tr.float64), torch.nn.PReLU(3, 0.1, dtype=torch.float64)
    assert [name for name, _ in ours.named_parameters()] == ["weight"]
    assert ours.weight.shape == (3,) and ours.weight.dtype == tr.float64
    np.testing.assert_array_equal(ours.weight.detach().numpy(), theirs.weight.detach().numpy())


def test_errors():
    with pytest.raises(tr.TracerError, match="odd size"):
        tr.nn.functional.glu(tr.ones(2, 5))
    with pytest.raises(tr.TracerError, match="0-d"):
        tr.nn.functional.glu(tr.tensor(1.0))
    with pytest.raises(tr.TracerError, match="alpha cannot be 0"):
        tr.nn.functional.celu(tr.ones(2), 0.0)
    with pytest.raises(tr.TracerError, match="2 weights for an input of 3 channels"):
        tr.nn.functional.prelu(tr.ones(2, 3), tr.ones(2))
    with pytest.raises(tr.TracerError, match="3 weights for an input of 1 channels"):
        tr.nn.functional.prelu(tr.ones(3), tr.ones(3))
    with pytest.raises(tr.TracerError, match="0-d"):
        tr.nn.functional.prelu(tr.tensor(1.0), tr.ones(1))
    leaf = tr.ones(3, requires_grad=True)
    with pytest.raises(tr.TracerError):
        tr.nn.functional.elu(leaf, inplace=True)  # an in-place change of a leaf requiring grad


def _model(library, seed):
    generator = np.random.default_rng(seed)
    layers = library.nn.Sequential(
        library.nn.Linear(6, 8), library.nn.PReLU(8), library.nn.Linear(8, 8), library.nn.ELU(),
        library.nn.Linear(8, 8), library.nn.Mish(), library.nn.Linear(8, 8),
        library.nn.Hardswish(), library.nn.Linear(8, 6), library.nn.GLU(), library.nn.LogSigmoid())
    for parameter in layers.parameters():
        with library.no_grad():
            parameter.copy_(library.tensor(generator.standard_normal(tuple(parameter.shape)) * 0.5))
    return layers


def test_traced_training_step_matches_torch_and_compiles_once():
    inputs = rng.standard_normal((10, 6))
    ours, theirs = _model(tr, 1).double(), _model(torch, 1).double()
    our_optimizer = tr.optim.SGD(ours.parameters(), lr=0.1)
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1)

    @tr.trace
    def step(x):
        our_optimizer.zero_grad()
        loss = ours(x).sum()
        loss.backward()
        our_optimizer.step()
        return loss

    for _ in range(4):
        loss = step(tr.tensor(inputs))
        their_optimizer.zero_grad()
        expected = theirs(torch.tensor(inputs)).sum()
        expected.backward()
        their_optimizer.step()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(), rtol=1e-11,
                                   atol=1e-13)
    assert step.cache_info().misses <= 2  # the first call without .grad, then one signature
    assert step.cache_info().size == step.cache_info().misses
