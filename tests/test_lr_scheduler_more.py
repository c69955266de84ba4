"""The schedulers of tr.optim.lr_scheduler beyond LambdaLR, StepLR, CosineAnnealingLR and
OneCycleLR, against torch.optim.lr_scheduler: the learning rates (and cycled momenta) over 40
steps, equal to the last bit, state_dict round trips that resume the schedule as PyTorch's does,
step(epoch), the argument checks, and schedules driving a traced training step that compiles once
with the parameters PyTorch's loop gives."""
import inspect
import warnings

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import paired_mlps


def _optimizers(name: str, options: dict):
    """The same two parameter groups in tracer and torch."""
    ours = [tr.zeros(2, requires_grad=True), tr.zeros(3, requires_grad=True)]
    theirs = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    make = lambda module, tensors: getattr(module, name)(  # noqa: E731
        [{"params": [tensors[0]]}, {"params": [tensors[1]], "lr": options["lr"] / 2}], **options)
    return make(tr.optim, ours), make(torch.optim, theirs)


class Halving:
    """A callable object: its state goes into the state_dict (a function's does not)."""

    def __init__(self, every):
        self.every = every

    def __call__(self, epoch):
        return 0.5 if epoch % self.every == 0 else 1.0


# (id, make(lr_scheduler module, optimizer)): the same call makes ours and PyTorch's
SCHEDULERS = [
    ("MultiplicativeLR", lambda s, o: s.MultiplicativeLR(o, lambda epoch: 0.97)),
    ("MultiplicativeLR-per-group", lambda s, o: s.MultiplicativeLR(
        o, [Halving(4), lambda epoch: 1.0 - epoch / 100]), ),
    ("MultiStepLR", lambda s, o: s.MultiStepLR(o, milestones=[3, 9, 9, 20], gamma=0.5)),
    ("MultiStepLR-default", lambda s, o: s.MultiStepLR(o, milestones=(5, 15))),
    ("ConstantLR", lambda s, o: s.ConstantLR(o)),
    ("ConstantLR-factor", lambda s, o: s.ConstantLR(o, factor=0.7, total_iters=12)),
    ("LinearLR", lambda s, o: s.LinearLR(o)),
    ("LinearLR-decay", lambda s, o: s.LinearLR(o, start_factor=1.0, end_factor=0.05,
                                               total_iters=30)),
    ("ExponentialLR", lambda s, o: s.ExponentialLR(o, gamma=0.93)),
    ("PolynomialLR", lambda s, o: s.PolynomialLR(o)),
    ("PolynomialLR-power", lambda s, o: s.PolynomialLR(o, total_iters=25, power=2.5)),
    ("CosineAnnealingWarmRestarts", lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=7)),
    ("CosineAnnealingWarmRestarts-mult", lambda s, o: s.CosineAnnealingWarmRestarts(
        o, T_0=3, T_mult=2, eta_min=0.001)),
    ("SequentialLR", lambda s, o: s.SequentialLR(
        o, [s.LinearLR(o, start_factor=0.1, total_iters=5), s.CosineAnnealingLR(o, T_max=12),
            s.ExponentialLR(o, gamma=0.9)], milestones=[5, 17])),
    ("ChainedScheduler", lambda s, o: s.ChainedScheduler(
        [s.ConstantLR(o, factor=0.5, total_iters=4), s.ExponentialLR(o, gamma=0.95),
         s.MultiStepLR(o, milestones=[10, 30])])),
    ("ChainedScheduler-sequential", lambda s, o: s.ChainedScheduler([
        s.SequentialLR(o, [s.ConstantLR(o, factor=0.2, total_iters=3),
                           s.PolynomialLR(o, total_iters=30)], milestones=[3]),
        s.MultiplicativeLR(o, lambda epoch: 0.99)], optimizer=o)),
    ("CyclicLR", lambda s, o: s.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4)),
    ("CyclicLR-triangular2", lambda s, o: s.CyclicLR(
        o, base_lr=[0.01, 0.005], max_lr=[0.2, 0.1], step_size_up=3, step_size_down=5,
        mode="triangular2", base_momentum=0.7, max_momentum=0.95)),
    ("CyclicLR-exp_range", lambda s, o: s.CyclicLR(
        o, base_lr=0.001, max_lr=0.05, step_size_up=5, mode="exp_range", gamma=0.97)),
    ("CyclicLR-scale_fn", lambda s, o: s.CyclicLR(
        o, base_lr=0.001, max_lr=0.05, step_size_up=2, scale_fn=lambda x: 1 / (1 + x),
        scale_mode="iterations", cycle_momentum=False)),
]
OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9)), ("AdamW", dict(lr=0.01)),
              ("RMSprop", dict(lr=0.01, momentum=0.9))]
STEPS = 40


def _hyperparameters(optimizer) -> list:
    return [(group["lr"], group.get("momentum"), group.get("betas"))
            for group in optimizer.param_groups]


def _step_both(mine, reference, theirs_optimizer):
    theirs_optimizer.step()  # (PyTorch warns if the scheduler steps before any optimizer step)
    mine.step()
    reference.step()


@pytest.mark.parametrize("optimizer_name, optimizer_options", OPTIMIZERS,
                         ids=[name for name, _ in OPTIMIZERS])
@pytest.mark.parametrize("make", [make for _, make in SCHEDULERS],
                         ids=[name for name, _ in SCHEDULERS])
def test_learning_rates_equal_torch_step_by_step(make, optimizer_name, optimizer_options):
    ours, theirs = _optimizers(optimizer_name, optimizer_options)
    mine, reference = make(tr.optim.lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    assert mine.get_last_lr() == reference.get_last_lr()
    assert _hyperparameters(ours) == _hyperparameters(theirs)
    for _ in range(STEPS):
        _step_both(mine, reference, theirs)
        assert getattr(mine, "last_epoch", None) == getattr(reference, "last_epoch", None)
        assert mine.get_last_lr() == reference.get_last_lr()
        assert _hyperparameters(ours) == _hyperparameters(theirs)


def _comparable(state):
    """A scheduler's state_dict without what holds functions (PyTorch's keeps its private
    bookkeeping too: ours has a subset of its keys)."""
    return {key: _comparable(value) if isinstance(value, dict) else
            [_comparable(item) if isinstance(item, dict) else item for item in value]
            if isinstance(value, list) else value
            for key, value in state.items() if not callable(value)}


@pytest.mark.parametrize("make", [make for _, make in SCHEDULERS],
                         ids=[name for name, _ in SCHEDULERS])
def test_state_dict_equals_torchs_and_resumes_the_schedule(make):
    ours, theirs = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    mine, reference = make(tr.optim.lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    for _ in range(11):
        _step_both(mine, reference, theirs)
    state, expected = _comparable(mine.state_dict()), _comparable(reference.state_dict())
    assert "optimizer" not in state
    _assert_subset(state, expected)
    # resume: a new optimizer with the groups' hyperparameters (from its state_dict, in a real
    # checkpoint) and a new scheduler loading the state
    resumed_optimizer, _ = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    resumed = make(tr.optim.lr_scheduler, resumed_optimizer)
    for group, saved in zip(resumed_optimizer.param_groups, ours.param_groups):
        group.update({key: value for key, value in saved.items() if key != "params"})
    resumed.load_state_dict(mine.state_dict())
    for _ in range(25):
        _step_both(resumed, reference, theirs)
        assert resumed.get_last_lr() == reference.get_last_lr()
        assert _hyperparameters(resumed_optimizer) == _hyperparameters(theirs)


def _assert_subset(state, expected, where="state_dict"):
    assert set(state) <= set(expected), (where, set(state) - set(expected))
    for key, value in state.items():
        if isinstance(value, dict):
            _assert_subset(value, expected[key], f"{where}[{key!r}]")
        elif key == "_schedulers":
            for number, (inner, inner_expected) in enumerate(zip(value, expected[key])):
                _assert_subset(inner, inner_expected, f"{where}[{key!r}][{number}]")
        else:
            assert value == expected[key], (where, key)


def test_torchs_state_dict_loads_into_ours():
    ours, theirs = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    make = dict(SCHEDULERS)["SequentialLR"]
    mine, reference = make(tr.optim.lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    for _ in range(8):  # PyTorch's alone: ours takes its state
        theirs.step()
        reference.step()
    mine.load_state_dict(reference.state_dict())
    for group, saved in zip(ours.param_groups, theirs.param_groups):
        group["lr"] = saved["lr"]
    for _ in range(20):
        _step_both(mine, reference, theirs)
        assert mine.get_last_lr() == reference.get_last_lr()


@pytest.mark.parametrize("make, epochs", [
    (lambda s, o: s.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3), [0, 3, 5, 12, 4, 1]),
    (lambda s, o: s.ConstantLR(o, factor=0.4, total_iters=6), [0, 5, 6, 20, 2]),
    (lambda s, o: s.LinearLR(o, start_factor=0.2, total_iters=8), [0, 1, 7, 8, 30, 3]),
    (lambda s, o: s.ExponentialLR(o, gamma=0.8), [0, 4, 10, 2]),
    (lambda s, o: s.PolynomialLR(o, total_iters=9, power=1.7), [0, 3, 9, 15, 6]),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=3, eta_min=0.01),
     [0, 2.5, 3.99, 4, 7.25, 15.5, 16, 40.125, 1]),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=5), [0.5, 4.75, 5, 12.2, 3]),
], ids=["MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR",
        "CosineAnnealingWarmRestarts-mult", "CosineAnnealingWarmRestarts"])
def test_step_to_an_epoch_equals_torch(make, epochs):
    """step(epoch): the closed forms (deprecated in PyTorch, which warns), and the fractional
    epochs of CosineAnnealingWarmRestarts (step(epoch + batch / batches) within an epoch)."""
    ours, theirs = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    mine, reference = make(tr.optim.lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    theirs.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in epochs:
            mine.step(epoch)
            reference.step(epoch)
            assert mine.last_epoch == reference.last_epoch
            assert mine.get_last_lr() == reference.get_last_lr()
            mine.step()
            reference.step()
            assert mine.get_last_lr() == reference.get_last_lr()


PLATEAU = [dict(), dict(mode="max", factor=0.5, patience=2, threshold=0.05, cooldown=2),
           dict(factor=0.3, patience=1, threshold=0.2, threshold_mode="abs", min_lr=[0.002, 0.0]),
           dict(mode="max", threshold_mode="abs", patience=0, min_lr=0.004, eps=1e-3)]


@pytest.mark.parametrize("options", PLATEAU, ids=["default", "max-rel-cooldown", "min-abs",
                                                  "max-abs-min_lr"])
def test_reduce_lr_on_plateau_follows_torch_on_a_metric(options):
    """A metric that improves, stalls, and wobbles; given as a float and as a tensor."""
    ours, theirs = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    mine = tr.optim.lr_scheduler.ReduceLROnPlateau(ours, **options)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs, **options)
    metrics = np.concatenate([np.linspace(1.0, 0.5, 8), np.full(10, 0.5),
                              0.45 + 0.05 * np.sin(np.arange(30)), np.linspace(0.5, 2.0, 12)])
    for number, metric in enumerate(metrics):
        theirs.step()
        mine.step(tr.tensor(metric) if number % 2 else float(metric))
        reference.step(float(metric))
        assert mine.get_last_lr() == reference.get_last_lr(), number
        assert (mine.last_epoch, mine.best, mine.num_bad_epochs, mine.cooldown_counter) == (
            reference.last_epoch, reference.best, reference.num_bad_epochs,
            reference.cooldown_counter)
    assert mine.get_last_lr() != [0.1, 0.05]  # the learning rate went down on the way
    state = mine.state_dict()
    _assert_subset(state, reference.state_dict())
    other = tr.optim.lr_scheduler.ReduceLROnPlateau(ours)
    other.load_state_dict(state)
    assert (other.mode, other.threshold, other.patience) == (mine.mode, mine.threshold,
                                                             mine.patience)


def test_reduce_lr_on_plateau_refuses_a_traced_metric_clearly():
    optimizer, _ = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    scheduler = tr.optim.lr_scheduler.ReduceLROnPlateau(optimizer)

    @tr.trace
    def step(x):
        loss = (x * x).sum()
        scheduler.step(loss)
        return loss

    with pytest.raises(tr.TracingError, match="return the metric from the traced function"):
        step(tr.ones(3))


SIGNATURES = ["MultiplicativeLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
              "PolynomialLR", "CosineAnnealingWarmRestarts", "SequentialLR", "ChainedScheduler",
              "ReduceLROnPlateau", "CyclicLR"]


@pytest.mark.parametrize("name", SIGNATURES)
def test_arguments_are_pytorchs_in_its_order_with_its_defaults(name):
    ours = inspect.signature(getattr(tr.optim.lr_scheduler, name)).parameters
    theirs = inspect.signature(getattr(torch.optim.lr_scheduler, name)).parameters
    assert list(ours) == list(theirs)
    for argument, parameter in ours.items():
        assert parameter.default == theirs[argument].default, argument
        assert parameter.kind == theirs[argument].kind, argument


def test_every_pytorch_scheduler_is_here():
    assert set(torch.optim.lr_scheduler.__all__) <= set(tr.optim.lr_scheduler.__all__)
    for name in tr.optim.lr_scheduler.__all__:
        assert getattr(tr.optim.lr_scheduler, name).__name__ == name


@pytest.mark.parametrize("make, message", [
    (lambda s, o: s.ConstantLR(o, factor=1.5), "between 0 and 1"),
    (lambda s, o: s.LinearLR(o, start_factor=0), "Starting multiplicative factor"),
    (lambda s, o: s.LinearLR(o, end_factor=1.2), "Ending multiplicative factor"),
    (lambda s, o: s.MultiplicativeLR(o, 0.9), "lr_lambda should be a function"),
    (lambda s, o: s.MultiplicativeLR(o, [lambda epoch: 1.0]), "lr_lambda"),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=0), "positive integer T_0"),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=1.5), "T_mult >= 1"),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=2, eta_min="0"), "eta_min"),
    (lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=2).step(-1), "non-negative epoch"),
    (lambda s, o: s.SequentialLR(o, [], milestones=[]), "at least one scheduler"),
    (lambda s, o: s.SequentialLR(o, [s.ExponentialLR(o, 0.9), s.ExponentialLR(o, 0.8)],
                                 milestones=[]), "milestone"),
    (lambda s, o: s.SequentialLR(o, [s.ReduceLROnPlateau(o)], milestones=[]),
     "ReduceLROnPlateau"),
    (lambda s, o: s.ChainedScheduler([]), "at least one scheduler"),
    (lambda s, o: s.ReduceLROnPlateau(o, factor=1.0), "Factor should be < 1.0"),
    (lambda s, o: s.ReduceLROnPlateau(o, mode="maximum"), "mode maximum is unknown"),
    (lambda s, o: s.ReduceLROnPlateau(o, threshold_mode="relative"), "threshold mode"),
    (lambda s, o: s.ReduceLROnPlateau(o, min_lr=[0.1]), "min_lr"),
    (lambda s, o: s.CyclicLR(o, 0.01, 0.1, mode="sawtooth"), "scale_fn is None"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_bad_arguments_are_refused_where_torch_refuses_them(make, message):
    ours, theirs = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    with pytest.raises((ValueError, TypeError, KeyError)):
        make(torch.optim.lr_scheduler, theirs)
    with pytest.raises(tr.ArgumentError, match=message):
        make(tr.optim.lr_scheduler, ours)


def test_another_optimizers_scheduler_is_refused():
    first, _ = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    second, _ = _optimizers("SGD", dict(lr=0.1, momentum=0.9))
    schedule = tr.optim.lr_scheduler
    with pytest.raises(tr.ArgumentError, match="same optimizer"):
        schedule.ChainedScheduler([schedule.ExponentialLR(first, 0.9),
                                   schedule.ExponentialLR(second, 0.9)])
    with pytest.raises(tr.ArgumentError, match="optimizer must support momentum"):
        schedule.CyclicLR(tr.optim.Adagrad([tr.zeros(1, requires_grad=True)]), 0.01, 0.1)


TRAINING = [
    ("SGD", dict(lr=0.1, momentum=0.9), lambda s, o: s.SequentialLR(
        o, [s.LinearLR(o, start_factor=0.1, total_iters=4), s.CosineAnnealingWarmRestarts(
            o, T_0=5, T_mult=2)], milestones=[4])),
    ("Adam", dict(lr=0.01), lambda s, o: s.ChainedScheduler(
        [s.ExponentialLR(o, gamma=0.95), s.MultiStepLR(o, milestones=[6, 12])])),
    ("SGD", dict(lr=0.1, momentum=0.9), lambda s, o: s.CyclicLR(
        o, base_lr=0.01, max_lr=0.2, step_size_up=3, mode="triangular2")),
    ("AdamW", dict(lr=0.01, weight_decay=0.05), lambda s, o: s.CyclicLR(
        o, base_lr=0.001, max_lr=0.02, step_size_up=4, mode="exp_range", gamma=0.95)),
    ("RMSprop", dict(lr=0.01), lambda s, o: s.PolynomialLR(o, total_iters=15, power=2.0)),
    ("Adagrad", dict(lr=0.1), lambda s, o: s.MultiplicativeLR(o, lambda epoch: 0.9)),
    ("SGD", dict(lr=0.2), lambda s, o: s.ReduceLROnPlateau(o, patience=1, threshold=0.05)),
    ("NAdam", dict(lr=0.01), lambda s, o: s.CyclicLR(  # beta1 cycles too
        o, base_lr=0.001, max_lr=0.01, step_size_up=3, base_momentum=0.85, max_momentum=0.95)),
    ("Rprop", dict(lr=0.01), lambda s, o: s.LinearLR(o, start_factor=0.5, total_iters=10)),
]


@pytest.mark.parametrize("optimizer_name, optimizer_options, make", TRAINING,
                         ids=["SGD-SequentialLR", "Adam-ChainedScheduler", "SGD-CyclicLR",
                              "AdamW-CyclicLR", "RMSprop-PolynomialLR", "Adagrad-MultiplicativeLR",
                              "SGD-ReduceLROnPlateau", "NAdam-CyclicLR", "Rprop-LinearLR"])
def test_a_scheduled_traced_loop_compiles_once_and_matches_torch(optimizer_name,
                                                                 optimizer_options, make):
    rng = np.random.default_rng(18)
    x, labels = rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    model, reference = paired_mlps(18, 6, 8, 3, "ReLU")
    optimizer = getattr(tr.optim, optimizer_name)(model.parameters(), **optimizer_options)
    torch_optimizer = getattr(torch.optim, optimizer_name)(reference.parameters(),
                                                           **optimizer_options)
    scheduler = make(tr.optim.lr_scheduler, optimizer)
    torch_scheduler = make(torch.optim.lr_scheduler, torch_optimizer)
    on_plateau = isinstance(scheduler, tr.optim.lr_scheduler.ReduceLROnPlateau)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        return loss

    learning_rates = set()
    for _ in range(20):
        loss = step(x, labels)
        torch_optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(reference(torch.tensor(x)),
                                                       torch.tensor(labels))
        torch_loss.backward()
        torch_optimizer.step()
        # ReduceLROnPlateau: a stalled metric (float32 losses would differ in their last bits)
        scheduler.step(loss * 0 + 1) if on_plateau else scheduler.step()
        torch_scheduler.step(1.0) if on_plateau else torch_scheduler.step()
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
        assert scheduler.get_last_lr() == torch_scheduler.get_last_lr()
        learning_rates.add(optimizer.param_groups[0]["lr"])
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    assert len(learning_rates) > 3
    assert step.cache_info() == (19, 1, 1)
