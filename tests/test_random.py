"""The counter-based generator (tracer/random.py): bit-exact to Squares computed in numpy's
uint64 arithmetic, exact 32-bit halves, uniform statistics, seeding and the state's advance."""
import math

import numpy as np
import pytest

import tracer as tr
from tracer.random import _KEY, _halves, _squares


def squares_reference(counters: np.ndarray) -> np.ndarray:
    """Widynski's squares32 in unsigned 64-bit arithmetic, with real shifts and ors."""
    key, shift = np.uint64(_KEY % 2 ** 64), np.uint64(32)
    counters = counters.view(np.uint64)
    with np.errstate(over="ignore"):
        y = counters * key
        z = y + key
        x = y
        for addend in (y, z, y):
            x = x * x + addend
            x = (x >> shift) | (x << shift)
        return (x * x + z) >> shift


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_squares_is_bit_exact(traced):
    counters = np.concatenate([np.arange(-300, 300), np.arange(2 ** 62, 2 ** 62 + 300),
                               [2 ** 63 - 1, -2 ** 63, 2 ** 32, -2 ** 32]]).astype(np.int64)
    run = tr.trace(_squares) if traced else _squares
    np.testing.assert_array_equal(run(tr.tensor(counters)).numpy().astype(np.uint64),
                                  squares_reference(counters))


def test_halves_are_exact_at_the_edges():
    values = np.concatenate([np.random.default_rng(1).integers(-2 ** 63, 2 ** 63 - 1, 10000),
                             [2 ** 63 - 1, -2 ** 63, -1, 0, 1, 2 ** 32 - 1, 2 ** 32, -2 ** 32,
                              2 ** 53 + 1, -(2 ** 53) - 1]]).astype(np.int64)
    high, low = _halves(tr.tensor(values))
    unsigned = values.view(np.uint64)
    np.testing.assert_array_equal(high.numpy().astype(np.uint64), unsigned >> np.uint64(32))
    np.testing.assert_array_equal(low.numpy().astype(np.uint64), unsigned & np.uint64(2 ** 32 - 1))


def test_uniform_numbers_look_uniform_and_independent():
    tr.manual_seed(0)
    count = 400_000
    numbers = tr.default_generator.uniform((count,), "test").numpy()
    assert 0.0 <= numbers.min() and numbers.max() < 1.0
    sigma = np.sqrt(1 / 12 / count)
    assert abs(numbers.mean() - 0.5) < 5 * sigma
    counts, _ = np.histogram(numbers, bins=64)
    expected = count / 64
    # chi-square with 63 degrees of freedom: mean 63, standard deviation sqrt(126)
    assert ((counts - expected) ** 2 / expected).sum() < 63 + 5 * np.sqrt(126)
    pairs, _, _ = np.histogram2d(numbers[0::2], numbers[1::2], bins=16)
    expected = count / 2 / 256
    assert ((pairs - expected) ** 2 / expected).sum() < 255 + 5 * np.sqrt(510)
    for lag in (1, 2, 7, 64):
        assert abs(np.corrcoef(numbers[:-lag], numbers[lag:])[0, 1]) < 5 / np.sqrt(count)


def test_seeds_reproduce_and_differ_and_the_state_advances():
    generator = tr.Generator(seed=1)
    start = generator.state.item()
    first = generator.uniform((2, 5), "test").numpy()
    assert generator.state.item() == start + 10
    second = generator.uniform((10,), "test").numpy()
    assert not np.array_equal(first.reshape(-1), second)
    generator.manual_seed(1)
    np.testing.assert_array_equal(generator.uniform((2, 5), "test").numpy(), first)
    other = tr.Generator(seed=2).uniform((2, 5), "test").numpy()
    assert not np.array_equal(other, first)
    tr.manual_seed(1)  # also seeds the default generator
    np.testing.assert_array_equal(tr.default_generator.uniform((2, 5), "test").numpy(), first)


@pytest.mark.parametrize("shape", [(3, 5), (1000,), ()])
def test_eager_draws_are_the_traced_draws_bit_for_bit(shape):
    """Eagerly the generator hashes in numpy's uint64 arithmetic; traced, with the primitives:
    the same numbers, and the same advance of the state."""
    generator = tr.Generator(11)
    eager = generator.uniform(shape, "test").numpy()
    eager_state = generator.state.item()
    generator.manual_seed(11)
    traced = tr.trace(lambda state: generator.uniform(shape, "test"))(generator.state).numpy()
    np.testing.assert_array_equal(eager, traced)
    assert generator.state.item() == eager_state


def test_rng_state_restores_every_generator_and_refuses_other_arrays():
    tr.manual_seed(5)
    tr.randn(3)
    saved = tr.get_rng_state()
    assert saved.numpy().dtype == np.uint8 and saved.shape == (45,)
    draws = lambda: (tr.randn(4).numpy(), tr.randperm(9).numpy(),  # noqa: E731
                     tr.nn.functional.dropout(tr.ones(16), 0.5).numpy())
    first = draws()
    tr.randn(50)
    tr.set_rng_state(saved)
    for expected, again in zip(first, draws()):
        np.testing.assert_array_equal(again, expected)
    with pytest.raises(tr.TracerError, match="uint8 tensor of 45 bytes"):
        tr.set_rng_state(np.zeros(45, np.int64))


# Python's and numpy's generators drawn from while tracing (runtime/random_draws.py): the numbers
# would be compiled in, the same on every call, where eager mode draws new ones; refused, with the
# generator put back as it was.
RNG = np.random.default_rng(0)

DRAWING = {
    "numpy.random's global generator": lambda x: x + tr.tensor(
        np.random.standard_normal(3).astype(np.float32)),
    "the random module's generator": lambda x: x * __import__("random").random(),
    "global RNG": lambda x: x * tr.tensor((RNG.random(3) > 0.5).astype(np.float32)),
}


def numpy_state() -> tuple:
    """All of numpy's global generator's state: its key array changes only every 624 words drawn,
    the position at each."""
    name, key, *rest = np.random.get_state()
    return (name, key.tobytes(), *rest)


@pytest.mark.parametrize("generator", sorted(DRAWING))
def test_drawing_from_python_or_numpy_generators_while_tracing_is_refused(generator):
    import random
    states = (numpy_state(), random.getstate(), RNG.bit_generator.state)
    with pytest.raises(tr.TracingError, match=f"drew random numbers from {generator}.*"
                                              "the same on every call"):
        tr.trace(DRAWING[generator])(tr.zeros(3))
    assert numpy_state() == states[0]
    assert random.getstate() == states[1]
    assert RNG.bit_generator.state == states[2]


def test_a_generator_seeded_inside_and_a_host_function_drawing_are_allowed():
    def seeded(x):  # the same numbers on every call, eager as traced
        return x + tr.tensor(np.random.default_rng(5).standard_normal(3).astype(np.float32))

    traced = tr.trace(seeded)
    np.testing.assert_array_equal(traced(tr.zeros(3)).numpy(), seeded(tr.zeros(3)).numpy())
    np.testing.assert_array_equal(traced(tr.zeros(3)).numpy(),
                                  np.random.default_rng(5).standard_normal(3).astype(np.float32))

    class Noise(tr.autograd.Function):  # reads values: runs on the host, on every call
        @staticmethod
        def forward(ctx, x):
            return tr.tensor(x.numpy() + np.random.standard_normal(x.shape).astype(np.float32))

        @staticmethod
        def backward(ctx, grad):
            return grad

    noisy = tr.trace(lambda x: Noise.apply(x))
    np.random.seed(3)
    first, second = noisy(tr.zeros(3)).numpy(), noisy(tr.zeros(3)).numpy()
    np.random.seed(3)  # the calls drew what eager calls draw, in order: the trace's run left none
    np.testing.assert_array_equal(first, np.random.standard_normal(3).astype(np.float32))
    np.testing.assert_array_equal(second, np.random.standard_normal(3).astype(np.float32))


def test_another_thread_drawing_meanwhile_is_not_the_traced_function():
    import threading
    asked, drawn = threading.Event(), threading.Event()

    def loader():  # a data loader's augmentation, drawing while the step is traced
        asked.wait()
        np.random.random_sample(4)
        drawn.set()

    def step(x):
        asked.set()
        drawn.wait()
        return x * 2

    worker = threading.Thread(target=loader)
    worker.start()
    np.random.seed(7)
    np.testing.assert_array_equal(tr.trace(step)(tr.ones(2)).numpy(), [2.0, 2.0])
    worker.join()
    after = np.random.random_sample(2)
    np.random.seed(7)
    np.random.random_sample(4)  # the loader's draw stays drawn
    np.testing.assert_array_equal(after, np.random.random_sample(2))


DRAW = np.random.standard_normal  # an alias: the code that draws through it names no method


def test_a_draw_through_a_name_no_method_has_is_refused_with_no_other_thread():
    # With no other thread alive, a change is the traced function's: before, the name check let
    # DRAW() and RNG.bytes() through, drawn once and compiled in (the same on every call).
    states = (numpy_state(), RNG.bit_generator.state)
    with pytest.raises(tr.TracingError, match="drew random numbers from numpy.random's global"):
        tr.trace(lambda x: x + float(DRAW()))(tr.zeros(1))
    with pytest.raises(tr.TracingError, match="drew random numbers from global RNG"):
        tr.trace(lambda x: x + float(RNG.bytes(1)[0]))(tr.zeros(1))
    assert numpy_state() == states[0]
    assert RNG.bit_generator.state == states[1]


def test_a_draw_is_put_back_when_the_function_is_traced_again():
    # An int argument whose value the trace needs makes it run twice: the first run's draw was
    # left drawn (the second run's was refused and put back).
    def reshaped(x, rows):
        noise = float(np.random.standard_normal())
        return x.reshape(rows, -1) + noise

    state = numpy_state()
    with pytest.raises(tr.TracingError, match="drew random numbers from numpy.random's global"):
        tr.trace(reshaped)(tr.zeros(4), 2)
    assert numpy_state() == state


def test_randn_and_rand_inside_a_traced_function_draw_anew_on_every_call():
    """The VAE's and the diffusion step's `eps = torch.randn_like(std)` inside a compiled
    function: tr.randn, tr.rand and their _like forms draw from the counter-based generator there
    (they raised TracingError): new numbers on every call, the same after tr.manual_seed, and the
    numbers `empty_like(x).normal_()` and `uniform_()` draw from the same state; the gradient of
    the reparameterized sample is the hand-computed one."""
    @tr.trace
    def sample(mean, log_variance):
        std = (0.5 * log_variance).exp()
        z = mean + std * tr.randn_like(std)
        (z * z).sum().backward()
        return z.detach(), tr.rand(3, 2, dtype=tr.float64)

    def call():
        mean = tr.zeros(5000, dtype=tr.float64, requires_grad=True)
        log_variance = tr.full_like(mean, math.log(4.0)).detach().requires_grad_()
        z, uniform = sample(mean, log_variance)
        return z.numpy(), uniform.numpy(), mean.grad.numpy(), log_variance.grad.numpy()

    tr.manual_seed(5)
    z, uniform, grad_mean, grad_log_variance = call()
    z_next, uniform_next, _, _ = call()
    assert not np.array_equal(z, z_next) and not np.array_equal(uniform, uniform_next)
    # z = 2 eps: mean 0 and standard deviation 2 within 5 standard errors of 5000 draws
    assert abs(z.mean()) < 5 * 2 / math.sqrt(5000) and abs(z.std() - 2) < 5 * 2 / math.sqrt(10000)
    assert uniform.dtype == np.float64 and 0 <= uniform.min() and uniform.max() < 1
    # d(sum z^2)/d mean = 2 z; d/d log_variance = 2 z * std * eps / 2 = z^2 (std * eps = z - 0)
    np.testing.assert_allclose(grad_mean, 2 * z, rtol=1e-14)
    np.testing.assert_allclose(grad_log_variance, z * z, rtol=1e-12)
    tr.manual_seed(5)
    again, uniform_again, _, _ = call()
    np.testing.assert_array_equal(again, z)
    np.testing.assert_array_equal(uniform_again, uniform)
    tr.manual_seed(5)
    eps = tr.empty(5000, dtype=tr.float64).normal_().numpy()
    drawn = tr.empty(3, 2, dtype=tr.float64).uniform_().numpy()
    np.testing.assert_allclose(z, 2 * eps, rtol=1e-13, atol=1e-13)  # (log and cos: a few ulp)
    np.testing.assert_array_equal(uniform, drawn)
