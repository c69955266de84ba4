"""The day-two tensor methods (issue 18): `.to` with devices and `copy`, `.device`, `.cpu()`,
`flatten(start_dim, end_dim)`, `unflatten`, `repeat`, `round` -- against PyTorch, eagerly and
traced, values and gradients -- and that no internal class name reaches a user's error."""
import inspect

import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

rng = np.random.default_rng(18)
CUBE = rng.standard_normal((2, 3, 4))
# halves of both parities, both signs and either side of them, and the float64 neighbours of 0.5
HALVES = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994, -0.49999999999999994,
                   3.5000000000000004, -0.3, 1.2345, 125.0, -0.05, 0.0, 2.0 ** 52 + 1])

CASES = [
    ("flatten 1", lambda x: x.flatten(1), lambda x: x.flatten(1), [CUBE]),
    ("flatten 0 1", lambda x: x.flatten(0, 1), lambda x: x.flatten(0, 1), [CUBE]),
    ("flatten -2 -1", lambda x: x.flatten(start_dim=-2), lambda x: x.flatten(start_dim=-2),
     [CUBE]),
    ("flatten one dim", lambda x: x.flatten(1, 1) * 2, lambda x: x.flatten(1, 1) * 2, [CUBE]),
    ("tr.flatten", lambda x: tr.flatten(x, 0, -2), lambda x: torch.flatten(x, 0, -2), [CUBE]),
    ("flatten 0-d", lambda x: x.sum().flatten(), lambda x: x.sum().flatten(), [CUBE]),
    ("unflatten", lambda x: x.unflatten(2, (2, -1)), lambda x: x.unflatten(2, (2, -1)), [CUBE]),
    ("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), [CUBE]),
    ("repeat new dims", lambda x: x.repeat((3, 1, 2, 1, 1)), lambda x: x.repeat((3, 1, 2, 1, 1)),
     [CUBE]),
    ("repeat zero", lambda x: x.repeat(1, 0, 2), lambda x: x.repeat(1, 0, 2), [CUBE]),
    ("repeat 1-d", lambda x: x.repeat(3), lambda x: x.repeat(3), [CUBE[0, 0]]),
    ("round", lambda x: x.round() * x, lambda x: x.round() * x, [HALVES]),
    ("round decimals", lambda x: tr.round(x * 7.3, decimals=2),
     lambda x: torch.round(x * 7.3, decimals=2), [HALVES]),
    ("round negative decimals", lambda x: x.mul(1000).round(decimals=-2),
     lambda x: x.mul(1000).round(decimals=-2), [HALVES]),
    ("to dtype", lambda x: x.to(tr.float32) * 2, lambda x: x.to(torch.float32) * 2, [CUBE]),
    ("to device dtype", lambda x: x.to("cpu", tr.float32), lambda x: x.to("cpu", torch.float32),
     [CUBE]),
    ("to device keyword", lambda x: x.to(device=tr.device("cpu")) * 3,
     lambda x: x.to(device=torch.device("cpu")) * 3, [CUBE]),
    ("to tensor", lambda x, y: x.to(y.long()), lambda x, y: x.to(y.long()), [CUBE, CUBE]),
    ("to copy", lambda x: x.to(tr.float64, copy=True) + x.cpu(),
     lambda x: x.to(torch.float64, copy=True) + x.cpu(), [CUBE]),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,ours,theirs,inputs", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(name, ours, theirs, inputs, dtype, traced):
    compare_with_torch(ours, theirs, [a.astype(dtype) for a in inputs], traced=traced)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decimals", [0, 1, 3, -1, -2])
def test_round_is_pytorchs_bit_for_bit_with_the_sign_of_zero(dtype, decimals):
    values = np.concatenate([HALVES, rng.standard_normal(200) * 10.0 ** rng.integers(-3, 6, 200),
                             np.arange(-20, 20) / 2 + 0.05, [np.inf, -np.inf, np.nan]])
    values = values.astype(dtype)
    expected = torch.tensor(values).round(decimals=decimals).numpy()
    for got in (tr.tensor(values).round(decimals).numpy(),
                tr.trace(lambda x: x.round(decimals))(tr.tensor(values)).numpy()):
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def test_round_of_integers_is_a_copy_and_its_gradient_is_zero():
    integers = tr.tensor([1, -2, 3])
    rounded = integers.round()
    assert rounded is not integers and rounded.tolist() == [1, -2, 3]
    x = tr.tensor([0.5, 1.7], requires_grad=True)
    y = x.round()
    assert y.requires_grad  # as PyTorch's: a result on the gradient path, whose gradient is 0
    (y * 3).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]


def test_device_is_the_cpu_as_pytorch_prints_it():
    x = tr.ones(2)
    assert repr(x.device) == repr(torch.ones(2).device) == "device(type='cpu')"
    assert str(x.device) == "cpu" and x.device.type == "cpu" and x.device.index is None
    assert x.device == tr.device("cpu") and tr.device("cpu") != "cpu"  # as torch's __eq__
    assert repr(tr.device("cpu:0")) == repr(torch.device("cpu:0"))
    assert tr.device("cpu", 0) == tr.device("cpu:0") != tr.device("cpu")
    assert hash(tr.device("cpu")) == hash(x.device) and not x.is_cuda
    assert x.cpu() is x and x.to("cpu") is x and x.to(x.device) is x
    assert x.to(tr.float32, copy=True) is not x


@pytest.mark.parametrize("call", [lambda x: x.to("cuda"), lambda x: x.to(device="cuda:0"),
                                  lambda x: x.to("mps", tr.float64), lambda: tr.device("cuda"),
                                  lambda: tr.device("cpu:1")])
def test_a_device_other_than_the_cpu_is_refused_naming_it(call):
    with pytest.raises(tr.ArgumentError, match="CPU|one CPU"):
        call(*([tr.ones(2)] if inspect.signature(call).parameters else []))


def test_bad_arguments_of_the_new_methods_name_the_problem():
    x = tr.ones(2, 3, 4)
    with pytest.raises(tr.ArgumentError, match="start_dim 2 comes after end_dim 1"):
        x.flatten(2, 1)
    with pytest.raises(tr.ShapeMismatchError, match="out of range"):
        x.flatten(3)
    with pytest.raises(tr.ShapeMismatchError, match="repeat"):
        x.repeat(2, 2)
    with pytest.raises(tr.ShapeMismatchError, match="unflatten"):
        x.unflatten(1, (2, 2))
    with pytest.raises(tr.ArgumentError, match="decimals is an int"):
        x.round(1.5)
    with pytest.raises(tr.ArgumentError, match="to\\(\\) got the dtype twice"):
        x.to(tr.float64, dtype=tr.float32)


def _public_methods():
    for name, member in sorted(vars(tr.Tensor).items()):
        if name.startswith("__") and name not in ("__getitem__", "__add__", "__matmul__"):
            continue
        if name.startswith("_"):
            continue
        # (repeat and new_zeros/ones/empty take any number of sizes: twelve of them would make a
        # tensor of 10**11 elements)
        if callable(member) and not isinstance(member, type) and name not in (
                "repeat", "new_zeros", "new_ones", "new_empty"):
            yield name


@pytest.mark.parametrize("name", list(_public_methods()))
def test_a_wrong_argument_count_names_tensor_not_an_internal_class(name):
    """The TypeError of a call with too many arguments names `Tensor.<method>` (or the plain
    function a method calls), as PyTorch's names its own methods, never the class of the module
    that defines the method or a lambda; a method of any number of arguments refuses them as
    arguments (a TracerError, itself a TypeError or ValueError)."""
    method = getattr(tr.ones(2, 2), name)
    with pytest.raises((TypeError, tr.TracerError)) as error:
        method(*range(2, 14))
    message = str(error.value)
    assert "Methods" not in message and "<lambda>" not in message, message
    if "positional argument" in message:
        called = message.split("()")[0]
        assert called.startswith("Tensor.") or called.isidentifier(), message


def test_a_module_moves_to_the_cpu_and_converts_as_pytorchs():
    model = tr.nn.Linear(3, 2)
    assert model.to("cpu") is model and model.cpu() is model
    assert model.to(tr.device("cpu")).weight.dtype == tr.float32
    assert model.to("cpu", tr.float64).weight.dtype == tr.float64
    assert model.to(device="cpu", dtype=tr.float32).bias.dtype == tr.float32
    with pytest.raises(tr.ArgumentError, match="CPU"):
        model.to("cuda:0")
