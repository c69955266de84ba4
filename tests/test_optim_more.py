"""Adamax, NAdam, RAdam, Adadelta, Rprop and ASGD against torch.optim step by step (float64, the
same initial weights and data, to 1e-12), float32, their arguments and errors, state_dicts in
PyTorch's layout loading both ways, and traced steps with a new learning rate each call compiling
once (the model: tests/test_optim.py)."""
import inspect

import numpy as np
import pytest
import torch

import tracer as tr
from test_optim import WEIGHTS, _assert_parameters_equal, _assert_state_equals_torch, _loss, _steps

NAMES = ["Adamax", "NAdam", "RAdam", "Adadelta", "Rprop", "ASGD"]

CONFIGURATIONS = [
    ("Adamax", dict()),
    ("Adamax", dict(lr=0.01, betas=(0.8, 0.95), eps=1e-4, weight_decay=0.05)),
    ("Adamax", dict(lr=0.02, maximize=True)),
    ("NAdam", dict()),
    ("NAdam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05,
                   momentum_decay=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    # RAdam rectifies from the sixth step with beta2 = 0.999, from the third with 0.9
    ("RAdam", dict()),
    ("RAdam", dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1, decoupled_weight_decay=True,
                   maximize=True)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.05)),
    ("Adadelta", dict(lr=2.0, rho=0.95, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.02, etas=(0.3, 1.5), step_sizes=(1e-3, 0.05))),
    ("Rprop", dict(lr=0.005, maximize=True)),
    ("ASGD", dict()),
    ("ASGD", dict(lr=0.05, lambd=0.01, alpha=0.5, t0=4, weight_decay=0.05)),
    ("ASGD", dict(lr=0.1, lambd=0.1, t0=0, maximize=True)),
]
STEPS = 10


def _pair(name, options, groups=True):
    """Our optimizer and PyTorch's over the same float64 weights (in two groups, the second with
    its own learning rate, where `groups`)."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    if groups:
        make = lambda module, tensors: getattr(module, name)(  # noqa: E731
            [{"params": tensors[:2]}, {"params": tensors[2:], "lr": 0.03}], **options)
    else:
        make = lambda module, tensors: getattr(module, name)(tensors, **options)  # noqa: E731
    return ours, theirs, make(tr.optim, ours), make(torch.optim, theirs)


@pytest.mark.parametrize("name, options", CONFIGURATIONS,
                         ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CONFIGURATIONS])
def test_steps_equal_torch_optim(name, options):
    ours, theirs, ours_optimizer, theirs_optimizer = _pair(name, options)
    for step in range(STEPS):
        _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=STEPS)
    start = [tr.tensor(w) for w in WEIGHTS]
    assert not all(np.array_equal(p.detach().numpy(), s.numpy()) for p, s in zip(ours, start))


@pytest.mark.parametrize("name, options", [
    ("Adamax", dict(lr=0.01)), ("NAdam", dict(lr=0.01, weight_decay=0.01)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9))), ("Adadelta", dict(lr=0.5)),
    ("Rprop", dict(lr=0.01)), ("ASGD", dict(lr=0.05, lambd=0.01, t0=3)),
], ids=NAMES)
def test_float32_parameters_follow_torch(name, options):
    ours = [tr.tensor(w.astype(np.float32), requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, **options)
    theirs_optimizer = getattr(torch.optim, name)(theirs, **options)
    _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)], STEPS, widen=True)
    for mine, reference in zip(ours, theirs):
        assert mine.dtype == tr.float32
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_arguments_are_pytorchs_in_its_order_with_its_defaults(name):
    """PyTorch's arguments (its implementation choices too), its positional ones in its order,
    the same defaults; and the same hyperparameters in each parameter group."""
    ours = inspect.signature(getattr(tr.optim, name)).parameters
    theirs = inspect.signature(getattr(torch.optim, name)).parameters
    assert list(ours) == list(theirs)
    for argument, parameter in ours.items():
        assert parameter.default == theirs[argument].default, argument
        assert parameter.kind == theirs[argument].kind, argument
    ours_group = getattr(tr.optim, name)([tr.zeros(1, requires_grad=True)]).param_groups[0]
    theirs_group = getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)]).param_groups[0]
    assert set(ours_group) == set(theirs_group)


def test_every_optimizer_is_exported():
    for name in NAMES:
        assert name in tr.optim.__all__ and getattr(tr.optim, name).__name__ == name


@pytest.mark.parametrize("name, options, message", [
    ("Adamax", dict(lr=-0.1), "lr must not be negative"),
    ("Adamax", dict(betas=(1.0, 0.9)), r"betas\[0\] must be in \[0, 1\)"),
    ("NAdam", dict(betas=(0.9, -0.1)), r"betas\[1\]"),
    ("NAdam", dict(momentum_decay=-1e-3), "momentum_decay must not be negative"),
    ("NAdam", dict(eps=-1.0), "eps must not be negative"),
    ("RAdam", dict(weight_decay=-0.1), "weight_decay must not be negative"),
    ("Adadelta", dict(rho=1.5), r"rho must be in \[0, 1\]"),
    ("Adadelta", dict(lr=-1.0), "lr must not be negative"),
    ("Rprop", dict(etas=(1.2, 0.5)), "etas"),
    ("Rprop", dict(etas=(0.5, 1.0)), "etas"),
    ("ASGD", dict(weight_decay=-0.5), "weight_decay must not be negative"),
])
def test_bad_arguments_are_clear_errors_where_torch_refuses_them(name, options, message):
    with pytest.raises(ValueError):
        getattr(torch.optim, name)([torch.ones(1, requires_grad=True)], **options)
    with pytest.raises(tr.ArgumentError, match=f"test_optim_more.py:.*{message}"):
        getattr(tr.optim, name)([tr.ones(1, requires_grad=True)], **options)


TRACED_CONFIGURATIONS = [
    ("Adamax", dict(lr=0.01, weight_decay=0.1)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("NAdam", dict(lr=0.01, momentum_decay=0.01, maximize=True)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.05)),
    ("RAdam", dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1)),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.05)),
    ("Rprop", dict(lr=0.01, etas=(0.4, 1.3))),
    ("ASGD", dict(lr=0.05, lambd=0.01, alpha=0.6, t0=3, weight_decay=0.05)),
]


@pytest.mark.parametrize("name, options", TRACED_CONFIGURATIONS,
                         ids=[f"{n}-{'-'.join(o)}" for n, o in TRACED_CONFIGURATIONS])
def test_traced_steps_with_a_new_learning_rate_each_call_equal_torch_and_compile_once(name,
                                                                                      options):
    """The learning rate is written into param_groups between calls, as a user or a scheduler
    writes it (before the first step too: Rprop and ASGD take the first step's): each compiled
    call takes the new one, PyTorch's optimizer the same."""
    ours, theirs, ours_optimizer, theirs_optimizer = _pair(name, options, groups=False)

    @tr.trace
    def step():
        ours_optimizer.zero_grad()
        loss = _loss(tr, ours)
        loss.backward()
        ours_optimizer.step()
        return loss

    for number in range(STEPS):
        lr = options["lr"] * (1 + (number + 1) % 3)
        ours_optimizer.param_groups[0]["lr"] = theirs_optimizer.param_groups[0]["lr"] = lr
        loss = step()
        theirs_optimizer.zero_grad()
        expected = _loss(torch, theirs)
        expected.backward()
        theirs_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
        _assert_parameters_equal(ours, theirs, f" after step {number + 1}")
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=STEPS)
    assert step.cache_info().misses == 1


@pytest.mark.parametrize("name, options", [
    ("Adamax", dict(lr=0.01, weight_decay=0.1)),
    ("NAdam", dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9))),
    ("Adadelta", dict(lr=0.5, rho=0.8)),
    ("Rprop", dict(lr=0.01)),
    ("ASGD", dict(lr=0.05, lambd=0.01, t0=1)),
], ids=NAMES)
def test_state_dicts_have_torchs_layout_and_load_both_ways(name, options):
    """After three steps PyTorch's state_dict loads into ours and ours into PyTorch's."""
    ours, theirs, ours_optimizer, theirs_optimizer = _pair(name, options, groups=False)
    _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)], 3)
    mine, reference = ours_optimizer.state_dict(), theirs_optimizer.state_dict()
    assert mine["state"].keys() == reference["state"].keys() == {0, 1, 2, 3}
    for index, entry in reference["state"].items():
        assert sorted(mine["state"][index]) == sorted(entry)
        for key, value in entry.items():
            if key != "step":  # (ours counts in float64, exact either way)
                assert str(mine["state"][index][key].dtype) == str(value.dtype).split(".")[1]
    assert mine["param_groups"][0]["params"] == reference["param_groups"][0]["params"]
    assert set(mine["param_groups"][0]) <= set(reference["param_groups"][0])
    # each state_dict loads into a new optimizer of each library, over the weights it was saved
    # with: the two then take the same steps. (PyTorch's load_state_dict casts the state but the
    # step to the parameter's dtype, NAdam's mu_product and ASGD's eta and mu to float64 here:
    # ours too.)
    as_torch = {"state": {index: {key: torch.tensor(value.numpy()) for key, value in entry.items()}
                          for index, entry in mine["state"].items()},
                "param_groups": mine["param_groups"]}
    for saved, weights in ((reference, theirs), (as_torch, ours)):
        runs = []
        for library, make in ((tr, tr.tensor), (torch, torch.tensor)):
            parameters = [make(w.detach().numpy(), requires_grad=True) for w in weights]
            optimizer = getattr(library.optim, name)(parameters, lr=0.5)
            optimizer.load_state_dict(saved)
            runs.append((library, parameters, optimizer))
        _steps(runs, 3)
        (_, loaded, loaded_optimizer), (_, torch_loaded, torch_loaded_optimizer) = runs
        _assert_parameters_equal(loaded, torch_loaded)
        for state, expected in zip(loaded_optimizer.state.values(),
                                   torch_loaded_optimizer.state.values()):
            assert {key: str(value.dtype) for key, value in state.items() if key != "step"} == {
                key: str(value.dtype).split(".")[1] for key, value in expected.items()
                if key != "step"}


def test_rprop_keeps_parameters_whose_gradient_changed_sign_and_nan_spreads_as_torchs():
    """A gradient sign flip shrinks the step size and skips the move; a nan gradient makes the
    step size nan, as in PyTorch."""
    ours, theirs = tr.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor(
        [1.0, 2.0, 3.0], requires_grad=True, dtype=torch.float32)
    ours_optimizer, theirs_optimizer = tr.optim.Rprop([ours]), torch.optim.Rprop([theirs])
    for gradient in ([1.0, -1.0, 0.0], [-1.0, -2.0, 1.0], [-1.0, float("nan"), 1.0],
                     [2.0, 1.0, 1.0]):
        ours.grad, theirs.grad = tr.tensor(gradient), torch.tensor(gradient)
        ours_optimizer.step()
        theirs_optimizer.step()
        np.testing.assert_array_equal(ours.detach().numpy(), theirs.detach().numpy())
        for name in ("prev", "step_size"):
            np.testing.assert_array_equal(ours_optimizer.state[ours][name].numpy(),
                                          theirs_optimizer.state[theirs][name].numpy())
