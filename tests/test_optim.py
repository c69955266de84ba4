"""tr.optim against torch.optim step by step (float64, the same initial weights and data), the
zero_grad modes, parameter groups, errors, and optimizer steps inside @tr.trace."""
import inspect
import pickle

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from tracer.optim.optimizer import FUSED_UPDATES

rng = np.random.default_rng(5)
X, LABELS = rng.standard_normal((10, 4)), rng.integers(0, 3, 10)
WEIGHTS = [rng.standard_normal((6, 4)) * 0.5, rng.standard_normal(6) * 0.1,
           rng.standard_normal((3, 6)) * 0.5, rng.standard_normal(3) * 0.1]

CONFIGURATIONS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.05, maximize=True)),
    ("Adam", dict()),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    ("Adam", dict(lr=0.02, amsgrad=True, maximize=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.2, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.02, weight_decay=0.3, amsgrad=True)),
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=0.005, alpha=0.9, eps=1e-4, weight_decay=0.05)),
    ("RMSprop", dict(lr=0.005, momentum=0.9)),
    ("RMSprop", dict(lr=0.005, centered=True, maximize=True)),
    ("RMSprop", dict(lr=0.002, alpha=0.95, momentum=0.5, centered=True, weight_decay=0.1)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.05, initial_accumulator_value=0.5, eps=1e-3, maximize=True)),
]


def _loss(library, parameters):
    w1, b1, w2, b2 = parameters
    functional = nn.functional if library is tr else torch.nn.functional
    make = tr.tensor if library is tr else torch.tensor
    hidden = functional.linear(make(X), w1, b1).tanh()
    return functional.cross_entropy(functional.linear(hidden, w2, b2), make(LABELS))


def _steps(runs, count=1, widen=False):
    """`count` steps of each (library, parameters, optimizer) of `runs`: zero_grad, the loss's
    backward (of the parameters in float64 where `widen`), step."""
    for _ in range(count):
        for library, parameters, optimizer in runs:
            optimizer.zero_grad()
            _loss(library, [p.double() for p in parameters] if widen else parameters).backward()
            optimizer.step()


def _assert_parameters_equal(ours, theirs, when=""):
    """Each of our parameters equal to PyTorch's to float64's rounding of a few steps."""
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-12, atol=1e-14, err_msg=f"parameter {index}{when}")


@pytest.mark.parametrize("name, options", CONFIGURATIONS,
                         ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CONFIGURATIONS])
def test_five_steps_equal_torch_optim(name, options):
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    # two groups, the second with its own learning rate, as a user would fine-tune a head
    ours_optimizer = getattr(tr.optim, name)(
        [{"params": ours[:2]}, {"params": ours[2:], "lr": 0.03}], **options)
    theirs_optimizer = getattr(torch.optim, name)(
        [{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.03}], **options)
    for step in range(5):
        _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=5)


def _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps):
    """The same state names (SGD with dampening also counts steps) and values, parameter by
    parameter, as PyTorch's optimizer after `steps` steps."""
    for state, expected in zip(ours_optimizer.state.values(), theirs_optimizer.state.values()):
        if type(ours_optimizer).__name__ != "SGD":
            assert sorted(state) == sorted(expected)
        for name in expected:
            if name == "step":
                assert state["step"].item() == expected["step"].item() == steps
            np.testing.assert_allclose(state[name].numpy(), expected[name].numpy(), rtol=1e-12,
                                       atol=1e-16, err_msg=name)


FLOAT32_CONFIGURATIONS = [
    ("Adam", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.005, momentum=0.9, centered=True, weight_decay=0.01)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
]


@pytest.mark.parametrize("name, options", FLOAT32_CONFIGURATIONS,
                         ids=[name for name, _ in FLOAT32_CONFIGURATIONS])
def test_float32_parameters_follow_torch(name, options):
    ours = [tr.tensor(w.astype(np.float32), requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, **options)
    theirs_optimizer = getattr(torch.optim, name)(theirs, **options)
    _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)], 5, widen=True)
    for mine, reference in zip(ours, theirs):
        assert mine.dtype == tr.float32
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_arguments_are_pytorchs_in_its_order_with_its_defaults(name):
    """PyTorch's arguments (its implementation choices foreach, fused, capturable and
    differentiable too), its positional ones in its order, the same defaults; and the same
    hyperparameters in each parameter group."""
    ours = inspect.signature(getattr(tr.optim, name)).parameters
    theirs = inspect.signature(getattr(torch.optim, name)).parameters
    assert set(ours) == set(theirs)
    positional = [a for a, p in theirs.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert list(ours)[:len(positional)] == positional
    for argument, parameter in ours.items():
        assert parameter.default == theirs[argument].default, argument
    ours_group = getattr(tr.optim, name)([tr.zeros(1, requires_grad=True)]).param_groups[0]
    theirs_group = getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)]).param_groups[0]
    assert set(ours_group) == set(theirs_group)


@pytest.mark.parametrize("name, options", [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("Adam", dict(lr=0.02, amsgrad=True, weight_decay=0.05)),
    ("AdamW", dict(lr=0.01, weight_decay=0.3)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05)),
])
def test_a_fused_eager_step_is_one_compiled_call_equal_to_torchs_fused(name, options):
    """fused=True: an eager step() (the model alone traced, or nothing) runs the update traced
    once, its learning rate a runtime input: a schedule changing it compiles nothing more."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, fused=True, **options)
    theirs_optimizer = getattr(torch.optim, name)(theirs, fused=True, **options)
    for step in range(5):
        for optimizer in (ours_optimizer, theirs_optimizer):
            optimizer.param_groups[0]["lr"] = options["lr"] / (1 + step)
        _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=5)
    assert FUSED_UPDATES[ours_optimizer].cache_info().misses == 1
    restored = pickle.loads(pickle.dumps(ours_optimizer))  # without its compiled update
    assert restored not in FUSED_UPDATES and restored.param_groups[0]["fused"] is True


@pytest.mark.parametrize("fused", [None, False])
def test_eager_steps_are_compiled_from_the_third_unless_fused_is_false(fused):
    """By default the first two eager steps run eagerly and the rest are one compiled call, which
    a learning rate changed each step does not compile again; fused=False never compiles. Each
    step equals PyTorch's to float64's rounding."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = tr.optim.Adam(ours, lr=0.02, weight_decay=0.05, fused=fused)
    theirs_optimizer = torch.optim.Adam(theirs, lr=0.02, weight_decay=0.05)
    for step in range(6):
        for optimizer in (ours_optimizer, theirs_optimizer):
            optimizer.param_groups[0]["lr"] = 0.02 / (1 + step)
        _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")
        compiled = FUSED_UPDATES.get(ours_optimizer)
        if fused is False or step < 2:
            assert not isinstance(compiled, tr.TracedFunction)
        else:
            assert compiled.cache_info().misses == 1
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=6)


@pytest.mark.parametrize("name, changed", [("SGD", {"momentum": 0.9}),
                                           ("SGD", {"momentum": 0.8, "dampening": 0.3})])
def test_state_a_hyperparameter_changed_later_calls_for_is_made_as_pytorch_makes_it(name,
                                                                                     changed):
    """(PyTorch's RMSprop and Adam raise KeyError where momentum, centered or amsgrad is set
    later; tracer's make zeros for them too.)"""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, lr=0.05)
    theirs_optimizer = getattr(torch.optim, name)(theirs, lr=0.05)
    for step in range(5):
        if step == 3:  # after the update is compiled: it is traced again with the new state
            for optimizer in (ours_optimizer, theirs_optimizer):
                optimizer.param_groups[0].update(changed)
        _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")


def test_state_a_hyperparameter_changed_later_calls_for_inside_a_traced_step_is_explained():
    parameter = tr.ones(3, requires_grad=True)
    optimizer = tr.optim.SGD([parameter], lr=0.1)
    optimizer.param_groups[0]["momentum"] = 0.9

    @tr.trace
    def step():
        optimizer.zero_grad()
        (parameter * parameter).sum().backward()
        optimizer.step()

    with pytest.raises(tr.TracingError, match="momentum_buffer.*run one step"):
        step()
    np.testing.assert_array_equal(parameter.detach().numpy(), [1.0, 1.0, 1.0])


def test_a_fused_optimizer_inside_a_traced_step_is_part_of_that_step():
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = tr.optim.AdamW(ours, lr=0.01, fused=True)
    theirs_optimizer = torch.optim.AdamW(theirs, lr=0.01, fused=True)

    @tr.trace
    def step():
        ours_optimizer.zero_grad()
        loss = _loss(tr, ours)
        loss.backward()
        ours_optimizer.step()
        return loss

    for number in range(3):
        step()
        _steps([(torch, theirs, theirs_optimizer)])
        _assert_parameters_equal(ours, theirs, f" after step {number + 1}")
    assert step.cache_info().misses == 1 and ours_optimizer not in FUSED_UPDATES


def test_zero_grad_modes_and_parameters_without_gradients():
    used, unused = tr.ones(2, requires_grad=True), tr.ones(2, requires_grad=True)
    optimizer = tr.optim.SGD([used, unused], lr=0.5, momentum=0.9)
    (used * 3).sum().backward()
    optimizer.step()
    np.testing.assert_array_equal(used.detach().numpy(), [-0.5, -0.5])
    np.testing.assert_array_equal(unused.detach().numpy(), [1.0, 1.0])  # no .grad: skipped
    optimizer.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(used.grad.numpy(), [0.0, 0.0])
    optimizer.zero_grad()
    assert used.grad is None


def test_step_with_a_closure_returns_its_loss():
    w = tr.tensor([1.0, 2.0], requires_grad=True)
    optimizer = tr.optim.SGD([w], lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 5.0
    np.testing.assert_allclose(w.detach().numpy(), [0.8, 1.6])


@pytest.mark.parametrize("make, message", [
    (lambda: tr.optim.SGD([], lr=0.1), "empty parameter list"),
    (lambda: tr.optim.Adam([tr.ones(2, requires_grad=True) * 2], lr=0.1), "float leaf tensors"),
    (lambda: tr.optim.Adam([tr.ones(2, dtype=tr.int64)]), "float leaf tensors"),
    (lambda: tr.optim.SGD([tr.ones(1, requires_grad=True)], lr=0.1, nesterov=True),
     "Nesterov"),
    (lambda: tr.optim.Adam([tr.ones(1, requires_grad=True)], betas=(0.9, 1.0)), "betas"),
    (lambda: tr.optim.RMSprop([tr.ones(1, requires_grad=True)], alpha=-0.5),
     "alpha must not be negative"),
    (lambda: tr.optim.Adagrad([tr.ones(1, requires_grad=True)], lr_decay=-0.1),
     "lr_decay must not be negative"),
    # PyTorch's SGD and Adam raise on these too ("Invalid learning rate", ...)
    (lambda: tr.optim.SGD([tr.ones(1, requires_grad=True)], lr=-0.1), "lr must not be negative"),
    (lambda: tr.optim.SGD([tr.ones(1, requires_grad=True)], lr=0.1, momentum=-0.9),
     "momentum must not be negative"),
    (lambda: tr.optim.SGD([tr.ones(1, requires_grad=True)], lr=0.1, weight_decay=-1e-4),
     "weight_decay must not be negative"),
    (lambda: tr.optim.AdamW([tr.ones(1, requires_grad=True)], lr=-1e-3),
     "lr must not be negative"),
    (lambda: tr.optim.Adam([tr.ones(1, requires_grad=True)], fused=True, foreach=True),
     "cannot be `True` together"),
    (lambda: tr.optim.SGD([tr.ones(1, requires_grad=True)], lr=0.1, differentiable=True),
     "differentiable=True is not supported"),
])
def test_bad_optimizer_arguments_are_clear_errors(make, message):
    with pytest.raises(tr.ArgumentError, match=f"test_optim.py:.*{message}"):
        make()


def test_named_parameters_are_taken_as_pytorch_takes_them():
    """PyTorch 2.13 takes (name, parameter) pairs (model.named_parameters()) and keeps the names
    in each group's "param_names"."""
    ours_model, theirs_model = nn.Linear(4, 3).double(), torch.nn.Linear(4, 3).double()
    ours_model.load_state_dict({k: tr.tensor(v.detach().numpy())
                                for k, v in theirs_model.state_dict().items()})
    ours = tr.optim.SGD(ours_model.named_parameters(), lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD(theirs_model.named_parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for library, model, optimizer in ((tr, ours_model, ours), (torch, theirs_model, theirs)):
            optimizer.zero_grad()
            model(library.tensor(X[:, :4])).square().sum().backward()
            optimizer.step()
    _assert_parameters_equal(list(ours_model.parameters()), list(theirs_model.parameters()))
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]
    with pytest.raises(tr.ArgumentError, match="some param names are missing"):
        tr.optim.SGD([("weight", ours_model.weight), ours_model.bias], lr=0.1)


def test_a_parameter_in_two_groups_is_refused():
    w = tr.ones(1, requires_grad=True)
    with pytest.raises(tr.ArgumentError, match="more than one parameter group"):
        tr.optim.SGD([{"params": [w]}, {"params": [w]}], lr=0.1)


def _classifier_step(model, optimizer, x, labels):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss


def _two_models():
    tr.manual_seed(2)
    first = nn.Sequential(nn.Linear(4, 8, dtype=tr.float64), nn.ReLU(),
                          nn.Linear(8, 3, dtype=tr.float64))
    second = nn.Sequential(nn.Linear(4, 8, dtype=tr.float64), nn.ReLU(),
                           nn.Linear(8, 3, dtype=tr.float64))
    second.load_state_dict(first.state_dict())
    return first, second


def test_traced_sgd_step_with_the_parameters_as_arguments_matches_eager():
    traced_model, eager_model = _two_models()
    traced_optimizer = tr.optim.SGD(traced_model.parameters(), lr=0.2)
    eager_optimizer = tr.optim.SGD(eager_model.parameters(), lr=0.2)
    step = tr.trace(lambda x, labels, parameters: _classifier_step(traced_model, traced_optimizer,
                                                                   x, labels))
    x, labels = tr.tensor(X), tr.tensor(LABELS)
    for _ in range(5):
        loss = step(x, labels, list(traced_model.parameters()))
        expected = _classifier_step(eager_model, eager_optimizer, x, labels)
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(traced_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-11, atol=1e-14)
    # compiled once: the step starts with zero_grad(), so the .grad of the parameters it is
    # called with (none on the first call, the last step's on the others) is not in its signature
    assert step.cache_info() == (4, 1, 1)


def test_traced_adam_step_with_its_state_as_arguments_matches_eager():
    # The state tensors may also be passed as arguments (they are then not captured).
    traced_model, eager_model = _two_models()
    traced_optimizer = tr.optim.AdamW(traced_model.parameters(), lr=0.05, amsgrad=True)
    eager_optimizer = tr.optim.AdamW(eager_model.parameters(), lr=0.05, amsgrad=True)
    state = [tensor for entry in traced_optimizer.state.values() for tensor in entry.values()]
    step = tr.trace(lambda x, labels, parameters, state: _classifier_step(
        traced_model, traced_optimizer, x, labels))
    x, labels = tr.tensor(X), tr.tensor(LABELS)
    for _ in range(5):
        loss = step(x, labels, list(traced_model.parameters()), state)
        expected = _classifier_step(eager_model, eager_optimizer, x, labels)
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(traced_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-10, atol=1e-13)
    assert traced_optimizer.state[next(traced_model.parameters())]["step"].item() == 5


@pytest.mark.parametrize("make", [
    lambda parameters: tr.optim.AdamW(parameters, lr=0.05, amsgrad=True),
    lambda parameters: tr.optim.SGD(parameters, lr=0.1, momentum=0.9, nesterov=True,
                                    weight_decay=0.01),
], ids=["adamw", "sgd-nesterov"])
def test_traced_step_reading_the_model_and_optimizer_from_its_closure_matches_eager(make):
    """As PyTorch code is written: the step takes only the data; the model's parameters and the
    optimizer's state are read from objects, so they are runtime inputs updated in place."""
    traced_model, eager_model = _two_models()
    traced_optimizer, eager_optimizer = make(traced_model.parameters()), make(
        eager_model.parameters())

    @tr.trace
    def step(x, labels):
        return _classifier_step(traced_model, traced_optimizer, x, labels)

    x, labels = tr.tensor(X), tr.tensor(LABELS)
    for _ in range(5):
        loss = step(x, labels)
        expected = _classifier_step(eager_model, eager_optimizer, x, labels)
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(traced_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-11, atol=1e-14)
    for mine, reference in zip(traced_optimizer.state.values(), eager_optimizer.state.values()):
        for name in reference:
            np.testing.assert_allclose(np.asarray(mine[name].detach().numpy()),
                                       np.asarray(reference[name].detach().numpy()),
                                       rtol=1e-11, atol=1e-14)
    # compiled once: the step starts with zero_grad(), so the .grad it is called with (none on
    # the first call, the last step's on the others) is no part of its signature
    assert step.cache_info().misses == 1


def test_state_dict_round_trip_resumes_training_exactly():
    """Checkpointing: an optimizer loaded from another's state_dict after three steps continues
    exactly as the original does."""
    original = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    optimizer = tr.optim.AdamW(original, lr=0.02, amsgrad=True)
    for _ in range(3):
        optimizer.zero_grad()
        _loss(tr, original).backward()
        optimizer.step()
    checkpoint = optimizer.state_dict()
    assert checkpoint["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert checkpoint["state"][0]["step"].item() == 3
    resumed = [tr.tensor(p.detach().numpy(), requires_grad=True) for p in original]
    other = tr.optim.AdamW(resumed, lr=0.5)
    state_tensor = other.state[resumed[0]]["exp_avg"]
    other.load_state_dict(checkpoint)
    assert other.param_groups[0]["lr"] == 0.02
    assert other.state[resumed[0]]["exp_avg"] is state_tensor  # copied in place
    for _ in range(2):
        for parameters, opt in ((original, optimizer), (resumed, other)):
            opt.zero_grad()
            _loss(tr, parameters).backward()
            opt.step()
    for mine, reference in zip(resumed, original):
        np.testing.assert_array_equal(mine.detach().numpy(), reference.detach().numpy())
    with pytest.raises(tr.ArgumentError, match="state"):
        tr.optim.SGD(resumed, lr=0.1, momentum=0.9).load_state_dict(checkpoint)


TRACED_CONFIGURATIONS = [
    ("RMSprop", dict(lr=0.005, alpha=0.95, momentum=0.5, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.005, centered=True, maximize=True)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.2)),
    ("Adagrad", dict(lr=0.05, eps=1e-3, maximize=True)),
]


@pytest.mark.parametrize("name, options", TRACED_CONFIGURATIONS,
                         ids=[f"{n}-{'-'.join(o)}" for n, o in TRACED_CONFIGURATIONS])
def test_traced_steps_with_a_new_learning_rate_each_call_equal_torch_and_compile_once(name,
                                                                                      options):
    """The learning rate is written into param_groups between calls, as a user or a scheduler
    writes it: each compiled call takes the new one, PyTorch's optimizer the same."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, **options)
    theirs_optimizer = getattr(torch.optim, name)(theirs, **options)

    @tr.trace
    def step():
        ours_optimizer.zero_grad()
        loss = _loss(tr, ours)
        loss.backward()
        ours_optimizer.step()
        return loss

    for number in range(5):
        lr = options["lr"] * (1 + number % 3)
        ours_optimizer.param_groups[0]["lr"] = theirs_optimizer.param_groups[0]["lr"] = lr
        loss = step()
        theirs_optimizer.zero_grad()
        expected = _loss(torch, theirs)
        expected.backward()
        theirs_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
        _assert_parameters_equal(ours, theirs, f" after step {number + 1}")
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=5)
    assert step.cache_info().misses == 1


def test_rmsprop_momentum_and_centering_set_after_it_was_made_start_from_zero_buffers():
    """As OneCycleLR sets a momentum before the first step: PyTorch makes the state then."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer, theirs_optimizer = tr.optim.RMSprop(ours), torch.optim.RMSprop(theirs)
    for group in ours_optimizer.param_groups + theirs_optimizer.param_groups:
        group.update(momentum=0.9, centered=True)
    _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)], 3)
    _assert_parameters_equal(ours, theirs)
    _assert_state_equals_torch(ours_optimizer, theirs_optimizer, steps=3)


@pytest.mark.parametrize("name, options", [
    ("RMSprop", dict(lr=0.005, momentum=0.5, centered=True)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2)),
], ids=["RMSprop", "Adagrad"])
def test_state_dicts_have_torchs_layout_and_load_both_ways(name, options):
    """After two steps PyTorch's state_dict loads into ours and ours into PyTorch's: either
    optimizer then takes the step the other takes."""
    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    ours_optimizer = getattr(tr.optim, name)(ours, **options)
    theirs_optimizer = getattr(torch.optim, name)(theirs, **options)
    _steps([(tr, ours, ours_optimizer), (torch, theirs, theirs_optimizer)], 2)
    mine, reference = ours_optimizer.state_dict(), theirs_optimizer.state_dict()
    assert mine["state"].keys() == reference["state"].keys() == {0, 1, 2, 3}
    for index, entry in reference["state"].items():
        assert sorted(mine["state"][index]) == sorted(entry)
    assert mine["param_groups"][0]["params"] == reference["param_groups"][0]["params"]
    assert set(mine["param_groups"][0]) <= set(reference["param_groups"][0])
    loaded = [tr.tensor(w.detach().numpy(), requires_grad=True) for w in theirs]
    loaded_optimizer = getattr(tr.optim, name)(loaded, lr=0.5)
    loaded_optimizer.load_state_dict(reference)
    torch_loaded = [torch.tensor(w.detach().numpy(), requires_grad=True) for w in ours]
    torch_loaded_optimizer = getattr(torch.optim, name)(torch_loaded, lr=0.5)
    torch_loaded_optimizer.load_state_dict(
        {"state": {index: {key: torch.tensor(value.numpy()) for key, value in entry.items()}
                   for index, entry in mine["state"].items()},
         "param_groups": mine["param_groups"]})
    _steps([(tr, loaded, loaded_optimizer), (torch, theirs, theirs_optimizer),
            (tr, ours, ours_optimizer), (torch, torch_loaded, torch_loaded_optimizer)])
    _assert_parameters_equal(loaded, theirs)
    _assert_parameters_equal(torch_loaded, ours)


def test_adamw_stays_decoupled_when_it_loads_adams_state_dict_as_pytorchs_does():
    ours, theirs = tr.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    adamw, torch_adamw = tr.optim.AdamW([ours]), torch.optim.AdamW([theirs])
    adamw.load_state_dict(tr.optim.Adam([tr.ones(2, requires_grad=True)]).state_dict())
    torch_adamw.load_state_dict(torch.optim.Adam([torch.ones(2, requires_grad=True)]).state_dict())
    assert adamw.param_groups[0]["decoupled_weight_decay"] is True
    assert torch_adamw.param_groups[0]["decoupled_weight_decay"] is True
    assert adamw.param_groups[0]["weight_decay"] == torch_adamw.param_groups[0]["weight_decay"] == 0



def test_fused_step_updates_a_group_added_after_the_first_step():
    # the traced update of the first step must not stand for the new group's parameters
    results = []
    for library in (torch, tr):
        a = library.nn.Parameter(library.tensor([0.0, 1.0, 2.0, 3.0], dtype=library.float64))
        b = library.nn.Parameter(library.tensor([1.0, 1.0, 1.0], dtype=library.float64))
        optimizer = library.optim.Adam([a], lr=0.1, fused=True)
        for index in range(4):
            optimizer.zero_grad()
            ((a * a).sum() + (b * b * b).sum()).backward()
            optimizer.step()
            if index == 1:
                optimizer.add_param_group({"params": [b], "lr": 0.5})
        results.append((a.detach().numpy(), b.detach().numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-12)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-12)


def test_sgd_dampening_set_after_the_momentum_buffer_was_made_dampens_the_next_step():
    """PyTorch's buffer exists, so its next step is dampened (tracer's new step count must not
    take it for a first step)."""
    ours = tr.tensor([0.3, -1.2, 2.0], dtype=tr.float64, requires_grad=True)
    theirs = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    ours_optimizer = tr.optim.SGD([ours], lr=0.1, momentum=0.9)
    theirs_optimizer = torch.optim.SGD([theirs], lr=0.1, momentum=0.9)
    for step in range(6):
        for optimizer, p in ((ours_optimizer, ours), (theirs_optimizer, theirs)):
            optimizer.zero_grad()
            (p.sin() * p).sum().backward()
            if step == 4:
                optimizer.param_groups[0]["dampening"] = 0.5
            optimizer.step()
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-12)


def test_an_optimizer_whose_steps_compiled_is_freed_with_its_parameters():
    import gc
    import weakref
    parameter = tr.zeros(4, dtype=tr.float64, requires_grad=True)
    optimizer = tr.optim.Adam([parameter], lr=0.1)
    for _ in range(4):
        parameter.grad = tr.ones(4, dtype=tr.float64)
        optimizer.step()
    assert optimizer in FUSED_UPDATES
    references = weakref.ref(optimizer), weakref.ref(parameter)
    del optimizer, parameter
    gc.collect()
    assert all(reference() is None for reference in references)


def test_an_update_whose_parameters_with_a_grad_keep_changing_runs_eagerly_after_two_compiles():
    """A mixture of experts: a different subset of parameters has a .grad each step. Each subset
    is a signature of the compiled update; past two, the update runs eagerly (it equals torch's)."""
    import warnings
    pick = np.random.default_rng(0)
    ours = [tr.tensor(pick.standard_normal(3), requires_grad=True) for _ in range(6)]
    theirs = [torch.tensor(p.detach().numpy(), requires_grad=True) for p in ours]
    ours_optimizer, theirs_optimizer = tr.optim.Adam(ours, lr=0.1), torch.optim.Adam(theirs, lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no RecompileWarning)
        for _ in range(20):
            used = [i for i in range(6) if pick.random() < 0.5] or [0]
            for optimizer, parameters in ((ours_optimizer, ours), (theirs_optimizer, theirs)):
                optimizer.zero_grad()
                sum((parameters[i] ** 2).sum() for i in used).backward()
                optimizer.step()
    for a, e in zip(ours, theirs):
        np.testing.assert_allclose(a.detach().numpy(), e.detach().numpy(), rtol=1e-12)
    assert FUSED_UPDATES.get(ours_optimizer) == "eager"


def test_an_update_that_decides_from_values_runs_eagerly_with_a_warning():
    """A user's optimizer whose update reads a value (`float(...)`) cannot be compiled: the
    default step warns once and runs eagerly, with PyTorch's results; fused=True raises."""
    class Clipped(tr.optim.SGD):
        def _update(self, parameter, grad, state, group):
            if float(grad.abs().max()) > 1.0:  # (a decision on the values)
                grad = grad / float(grad.abs().max())
            parameter.add_(grad, alpha=-group["lr"])

    def clipped_sgd_step(parameters, lr=0.1):
        with torch.no_grad():
            for p in parameters:
                g = p.grad / p.grad.abs().max() if float(p.grad.abs().max()) > 1 else p.grad
                p.add_(g, alpha=-lr)

    ours = [tr.tensor(w, requires_grad=True) for w in WEIGHTS]
    theirs = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    optimizer = Clipped(ours, lr=0.1)
    for step in range(4):
        optimizer.zero_grad()
        _loss(tr, ours).backward()
        for p in theirs:
            p.grad = None
        _loss(torch, theirs).backward()
        if step == 2:
            with pytest.warns(tr.TracerWarning, match="runs eagerly.*fused=False"):
                optimizer.step()
        else:
            optimizer.step()
        clipped_sgd_step(theirs)
        _assert_parameters_equal(ours, theirs, f" after step {step + 1}")
    with pytest.raises(tr.TracingError):
        fused = Clipped(ours, lr=0.1, fused=True)
        _loss(tr, ours).backward()
        fused.step()
