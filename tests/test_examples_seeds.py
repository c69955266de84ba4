"""The seed programs in examples/, run as tests and checked against independent numbers."""
import os
import sys

import numpy as np
import pytest

import tracer as tr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import course_functions  # noqa: E402
import linear as linear_example  # noqa: E402
import mul_constant as mul_constant_example  # noqa: E402
import two_layer_net  # noqa: E402


# mul_constant --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("traced", [False, True])
def test_mul_constant_grad_is_two(traced):
    def run(x):
        mul_constant_example.mul_constant(x, 2.0).sum().backward()
        return x * 1

    x = tr.tensor([1.0], requires_grad=True)            # the seed: torch_tensor(1, requires_grad)
    (tr.trace(run) if traced else run)(x)
    assert x.grad.shape == (1,) and x.grad.dtype == tr.float32
    assert x.grad.item() == 2.0
    out = mul_constant_example.mul_constant(tr.tensor([1.0, 3.0]), 2.0)
    np.testing.assert_array_equal(out.numpy(), [2.0, 6.0])


def test_mul_constant_main_prints_twos(capsys):
    mul_constant_example.main()
    assert "x.grad" in capsys.readouterr().out


# KillHead and |uv| -----------------------------------------------------------------------------------------
def killhead_numpy(x, y, steps, eta, n=2):
    """The course's loop in plain numpy (float32): r = x with the first n columns zeroed,
    loss = mean((r - y)^2), x -= eta * d loss / dx."""
    x, y = x.astype(np.float32).copy(), y.astype(np.float32)
    losses = []
    for _ in range(steps):
        r = x.copy()
        r[:, :n] = 0
        losses.append(float(((r - y) ** 2).mean()))
        grad = (2 * (r - y) / r.size).astype(np.float32)
        grad[:, :n] = 0
        x = x - np.float32(eta) * grad
    return losses


def test_killhead_training_matches_numpy_and_decreases():
    reported = []
    losses = course_functions.killhead_training(steps=5, eta=1.0, report=lambda k, loss: reported.append(loss))
    assert reported == losses
    # the same data as killhead_training: tr.manual_seed(0), then y, then x
    tr.manual_seed(0)
    y = tr.randn(3, 8).numpy().copy()
    x = tr.randn(3, 8).numpy().copy()
    expected = killhead_numpy(x, y, 5, 1.0)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:]))
    # as in the seed: each step multiplies the reducible part of the loss by (1 - 2/24)^2
    floor = float((y[:, :2] ** 2).sum() / 24)
    ratios = [(b - floor) / (a - floor) for a, b in zip(expected, expected[1:])]
    np.testing.assert_allclose(ratios, (1 - 2 / 24) ** 2, rtol=1e-4)


def test_killhead_training_traced_step_matches_eager():
    rng = np.random.default_rng(11)
    y0, x0 = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)

    def step(x, y, eta):
        r = course_functions.killhead(x, 2)
        loss = course_functions.mse_loss(r, y)
        loss.backward()
        with tr.no_grad():
            x.sub_(eta * x.grad)
            x.grad.zero_()
        return loss

    traced = tr.trace(step)
    x, y = tr.tensor(x0, requires_grad=True), tr.tensor(y0)
    losses = [traced(x, y, 1.0).item() for _ in range(5)]
    np.testing.assert_allclose(losses, killhead_numpy(x0, y0, 5, 1.0), rtol=1e-5)


@pytest.mark.parametrize("traced", [False, True])
def test_killhead_gradcheck(traced):
    x = (tr.rand(10, 20, dtype=tr.float64) * 2 - 1).requires_grad_()
    # n is a Python int used in a slice: static under @trace
    f = tr.trace(course_functions.killhead, static_argnums=1) if traced else course_functions.killhead
    assert tr.gradcheck(f, (x, 4), eps=1e-6, atol=1e-4)


@pytest.mark.parametrize("traced", [False, True])
def test_something_abs_uv_gradcheck_and_values(traced):
    tr.manual_seed(3)
    u = tr.randn(4, 5, dtype=tr.float64, requires_grad=True)
    v = tr.randn(4, 5, dtype=tr.float64, requires_grad=True)
    f = tr.trace(course_functions.something) if traced else course_functions.something
    assert tr.gradcheck(f, (u, v))
    out = f(u, v)
    np.testing.assert_allclose(out.detach().numpy(), np.abs(u.detach().numpy() * v.detach().numpy()))


def test_course_main_runs(capsys):
    course_functions.main()
    out = capsys.readouterr().out
    assert "All good captain." in out
    assert "|uv| gradcheck: True traced: True" in out


# linear -------------------------------------------------------------------------------------------------------
STYLES = {"autograd_function": linear_example.linear, "Function": linear_example.LinearFunction.apply}


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("traced", [False, True])
def test_linear_gradcheck_both_styles(style, bias, traced):
    tr.manual_seed(0)
    x = tr.randn(5, 3, dtype=tr.float64, requires_grad=True)
    w = tr.randn(4, 3, dtype=tr.float64, requires_grad=True)
    b = tr.randn(4, dtype=tr.float64, requires_grad=True)
    f = tr.trace(STYLES[style]) if traced else STYLES[style]
    inputs = (x, w, b) if bias else (x, w)
    assert tr.gradcheck(f, inputs)
    expected = x.detach().numpy() @ w.detach().numpy().T + (b.detach().numpy() if bias else 0)
    np.testing.assert_allclose(f(*inputs).detach().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("style", list(STYLES))
def test_linear_only_weight_needs_grad(style):
    rng = np.random.default_rng(4)
    x, w, b, g = (rng.standard_normal(s) for s in ((5, 3), (4, 3), (4,), (5, 4)))
    for run in (lambda f: f, tr.trace):
        xt, wt, bt = tr.tensor(x), tr.tensor(w, requires_grad=True), tr.tensor(b)

        def step(x, w, b):
            STYLES[style](x, w, b).backward(tr.tensor(g))
            return x * 1

        run(step)(xt, wt, bt)
        np.testing.assert_allclose(wt.grad.numpy(), g.T @ x, rtol=1e-12)
        assert xt.grad is None and bt.grad is None


def test_linear_main_runs(capsys):
    linear_example.main()
    out = capsys.readouterr().out
    assert out.count("with bias: True without bias: True traced: True") == 2


# The two-layer network -------------------------------------------------------------------------------------
def test_two_layer_net_500_steps_traced():
    traced = tr.trace(two_layer_net.step)
    lines = []
    losses = two_layer_net.train(traced, steps=500, report=lines.append)
    assert [line.split(":")[1].strip() for line in lines] == ["1", "100", "200", "300", "400", "500"]
    # the seed: from about 3e7 down to about 5e-5
    assert 1e6 < losses[0] < 1e9
    assert losses[-1] < losses[0] * 1e-6, (losses[0], losses[-1])
    assert all(np.isfinite(losses))
    assert traced.cache_info().misses == 2     # step 1 (no .grad yet) and every later step
    assert traced.cache_info().hits == 498


def test_two_layer_net_first_steps_match_eager():
    # the example's own make_data and step, eager vs traced, a few steps at the real sizes
    eager = two_layer_net.train(two_layer_net.step, steps=5, report=lambda line: None)
    traced = two_layer_net.train(tr.trace(two_layer_net.step), steps=5, report=lambda line: None)
    np.testing.assert_allclose(traced, eager, rtol=1e-4)
