"""Compile once in an ordinary training loop: the .grad a step is called with, when the step does
not read it, and the floats it reads from outside (an optimizer's param_groups, a module's or a
closure's numbers) are no part of its signature; recompile storms are warned about by name."""
import math
import warnings

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import paired_mlps

rng = np.random.default_rng(16)
X = rng.standard_normal((12, 5)).astype(np.float32)
LABELS = rng.integers(0, 3, 12)
STEPS = 20


def _models():
    return paired_mlps(16, 5, 7, 3, "Tanh")


def _cosine(step: int, base: float) -> float:
    return 0.5 * base * (1 + math.cos(math.pi * step / STEPS))


OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
              ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
              ("Adam", dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.05)),
              ("AdamW", dict(lr=0.01, weight_decay=0.1))]


def _assert_same_parameters(ours, theirs):
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, options", OPTIMIZERS,
                         ids=[f"{n}-{'-'.join(o)}" for n, o in OPTIMIZERS])
def test_loop_with_a_cosine_schedule_in_param_groups_compiles_once(name, options):
    model, reference = _models()
    optimizer = getattr(tr.optim, name)(model.parameters(), **options)
    torch_optimizer = getattr(torch.optim, name)(reference.parameters(), **options)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        return loss

    for number in range(STEPS):
        for group in (*optimizer.param_groups, *torch_optimizer.param_groups):
            group["lr"] = _cosine(number, options["lr"])
        loss = step(X, LABELS)
        torch_optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(reference(torch.tensor(X)),
                                                       torch.tensor(LABELS))
        torch_loss.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
    _assert_same_parameters(model, reference)
    assert step.cache_info() == (STEPS - 1, 1, 1)


def test_hyperparameters_changed_between_steps_reach_the_step_without_recompiling():
    model, reference = _models()
    optimizer = tr.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01, weight_decay=0.01)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()

    settings = [dict(lr=0.02, betas=(0.85, 0.995), eps=1e-6, weight_decay=0.2),
                dict(lr=0.005, betas=(0.7, 0.9), eps=1e-3, weight_decay=0.05),
                dict(lr=0.03, betas=(0.9, 0.999), eps=1e-8, weight_decay=1.5)]
    for setting in settings * 2:
        optimizer.param_groups[0].update(setting)
        torch_optimizer.param_groups[0].update(setting)
        step(X, LABELS)
        torch_optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.tensor(X)),
                                          torch.tensor(LABELS)).backward()
        torch_optimizer.step()
    _assert_same_parameters(model, reference)
    assert step.cache_info().misses == 1


def test_a_float_the_trace_branches_on_is_guarded_on_the_branch(caplog):
    model, reference = _models()
    optimizer = tr.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, weight_decay=0.1)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()

    with caplog.at_level("INFO", logger="tracer.trace"):
        # `if weight_decay != 0` in the update: 0.1 and 0.3 take one branch, 0.0 the other
        for weight_decay in (0.1, 0.3, 0.0, 0.0, 0.2, 0.0):
            optimizer.param_groups[0]["weight_decay"] = weight_decay
            torch_optimizer.param_groups[0]["weight_decay"] = weight_decay
            step(X, LABELS)
            torch_optimizer.zero_grad()
            torch.nn.functional.cross_entropy(reference(torch.tensor(X)),
                                              torch.tensor(LABELS)).backward()
            torch_optimizer.step()
    _assert_same_parameters(model, reference)
    assert step.cache_info() == (4, 2, 2)  # one signature per outcome, both kept
    assert ("closure variable optimizer.param_groups[0]['weight_decay']: 0.1 -> 0.0 (the traced "
            "code branched on whether it is != 0.0)") in caplog.text


SCALE = 0.5


def test_floats_in_globals_closures_and_attributes_are_runtime_inputs():
    class Gate:
        def __init__(self):
            self.weight = tr.tensor([1.0, -2.0, 3.0])
            self.bias = 0.25

    gate = Gate()
    offset = 1.0

    @tr.trace
    def f(x):
        return x * gate.weight * SCALE + gate.bias - offset

    global SCALE
    x = tr.tensor([1.0, 2.0, 4.0])
    for scale, bias, shift in [(0.5, 0.25, 1.0), (2.0, -1.5, 0.125), (-3.0, 0.0, 7.0)]:
        SCALE, gate.bias, offset = scale, bias, shift
        np.testing.assert_allclose(f(x).numpy(), np.array([1.0, -4.0, 12.0]) * scale + bias
                                   - shift, rtol=1e-6)
    assert f.cache_info() == (2, 1, 1)
    SCALE = 0.5


def test_a_runtime_float_written_into_a_tensor_and_read_by_nothing_else_reaches_it():
    """`s.fill_(config.value)` of a 0-d tensor argument, the float read by no instruction: its
    parameter is the value written back. The compile dropped it as unread before the write-backs
    were known (KeyError in the pipeline, found by the long differential run) until 2026-11-28."""
    class Config:
        value = -1.5

    config = Config()

    @tr.trace
    def f(s, x):
        s.fill_(config.value)
        return x * 2

    for value in (-1.5, 3.0):
        config.value = value
        s = tr.tensor(2.0, dtype=tr.float64)
        np.testing.assert_array_equal(f(s, tr.ones(2)).numpy(), [2.0, 2.0])
        assert s.item() == value
    assert f.cache_info() == (1, 1, 1)


def test_a_float_whose_python_value_the_trace_needs_is_compiled_in_and_guarded(caplog):
    class Repeat:
        def __init__(self):
            self.fraction = 0.5

    repeat = Repeat()

    @tr.trace
    def f(x):
        return x[: int(repeat.fraction * 4)].sum() * repeat.fraction

    x = tr.tensor([1.0, 2.0, 4.0, 8.0])
    with caplog.at_level("INFO", logger="tracer.trace"):
        assert f(x).item() == 1.5
        repeat.fraction = 0.75
        assert f(x).item() == 5.25
        assert f(x).item() == 5.25
    assert f.cache_info() == (1, 2, 1)  # the stale signature replaced
    assert ("floats closure variable repeat.fraction are compiled in from now on (the trace "
            "needs their Python values)") in caplog.text
    assert "compiling (closure variable repeat.fraction: 0.5 -> 0.75)" in caplog.text


def test_a_recompile_storm_warns_naming_the_attribute_and_the_fix():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))

    model = Model()
    step = tr.trace(lambda x: model.blocks(x).sum())
    x = tr.ones(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(7):  # a new weight tensor every call, not an update in place
            model.blocks[0].weight = nn.Parameter(tr.randn(3, 3))
            step(x)
    storms = [w for w in caught if issubclass(w.category, tr.RecompileWarning)]
    assert len(storms) == 1  # once per function
    message = str(storms[0].message)
    assert "model.blocks[0].weight: rebound" in message
    assert "update it in place" in message
    assert step.cache_info().misses == 7


def test_a_float_the_traced_function_changes_is_compiled_in_as_an_int_would_be():
    class Counter:
        def __init__(self):
            self.total = 0.0

        @tr.trace
        def count(self, x):
            self.total += 0.5  # Python state: changes only while tracing
            return x * self.total

    counter = Counter()
    results = [counter.count(tr.tensor([1.0])).item() for _ in range(3)]
    assert results == [0.5, 1.0, 1.5] and counter.total == 1.5  # as eager mode, tracing each time
    assert Counter.count.cache_info().misses == 3


def test_a_float_exponent_is_compiled_in_as_a_constant_power():
    exponent = 0.5
    f = tr.trace(lambda x: x ** exponent)
    x = tr.tensor([4.0, 9.0, -1.0])
    np.testing.assert_array_equal(f(x).numpy(), [2.0, 3.0, np.nan])
    assert " sqrt " in f.ir(x, stage="optimized")  # a constant power: a square root
    exponent = 2.0
    np.testing.assert_array_equal(f(x).numpy(), [16.0, 81.0, 1.0])
    assert f.cache_info().misses == 2
