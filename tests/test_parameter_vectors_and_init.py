"""tr.nn.utils.parameters_to_vector / vector_to_parameters against torch (same weights, float64,
eager and in a traced training step), and tr.nn.init.trunc_normal_ / orthogonal_: the truncated
normal checked statistically with a fixed seed (Kolmogorov-Smirnov distance to its CDF, moments,
bounds) for both of PyTorch 2.13's sampling branches, orthogonality exactly, Q against
torch.linalg.qr's of the same draw."""
import math
import warnings

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn

rng = np.random.default_rng(5)


def _models():
    torch.manual_seed(1)
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                                 torch.nn.Linear(5, 2)).double()
    ours = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    ours.load_state_dict({name: value.numpy() for name, value in theirs.state_dict().items()})
    return ours, theirs


def test_parameters_to_vector_values_and_gradients_match_torch():
    ours, theirs = _models()
    x = rng.standard_normal((3, 4))
    losses = []
    for model, library, utils in ((ours, tr, nn.utils), (theirs, torch, torch.nn.utils)):
        vector = utils.parameters_to_vector(model.parameters())
        loss = model(library.tensor(x)).sum() + (vector ** 2).sum() * 0.5
        loss.backward()
        losses.append((vector.detach().numpy(), loss.item(),
                       [p.grad.numpy() for p in model.parameters()]))
    np.testing.assert_array_equal(losses[0][0], losses[1][0])
    np.testing.assert_allclose(losses[0][1], losses[1][1], rtol=1e-14)
    for mine, reference in zip(losses[0][2], losses[1][2]):
        np.testing.assert_allclose(mine, reference, rtol=1e-13, atol=1e-15)


def test_parameters_to_vector_in_a_traced_training_step():
    ours, theirs = _models()
    steps = []
    for model, library, utils in ((ours, tr, nn.utils), (theirs, torch, torch.nn.utils)):
        optimizer = library.optim.SGD(model.parameters(), lr=0.1)

        def step(x, target, model=model, utils=utils, optimizer=optimizer):
            optimizer.zero_grad()
            penalty = utils.parameters_to_vector(model.parameters()).abs().sum()
            loss = ((model(x) - target) ** 2).mean() + 0.01 * penalty
            loss.backward()
            optimizer.step()
            return loss
        steps.append(step)
    traced = tr.trace(steps[0])
    for _ in range(4):
        x, target = rng.standard_normal((6, 4)), rng.standard_normal((6, 2))
        np.testing.assert_allclose(traced(tr.tensor(x), tr.tensor(target)).item(),
                                   steps[1](torch.tensor(x), torch.tensor(target)).item(),
                                   rtol=1e-13)
    assert traced.cache_info().misses == 1
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-13, atol=1e-15)


def test_vector_to_parameters_matches_torch():
    ours, theirs = _models()
    vector = rng.standard_normal(37)
    nn.utils.vector_to_parameters(tr.tensor(vector), ours.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(vector), theirs.parameters())
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_array_equal(mine.detach().numpy(), reference.detach().numpy())
        assert mine.requires_grad and isinstance(mine, nn.Parameter)
    # a vector of another dtype: the parameters take its dtype, as in torch
    nn.utils.vector_to_parameters(tr.tensor(vector, dtype=tr.float32), ours.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(vector, dtype=torch.float32),
                                        theirs.parameters())
    assert [str(p.dtype) for p in ours.parameters()] == ["float32"] * 4
    assert {p.dtype for p in theirs.parameters()} == {torch.float32}
    for wrong in (vector, [1.0, 2.0]):
        with pytest.raises(TypeError) as mine:
            nn.utils.vector_to_parameters(wrong, ours.parameters())
        with pytest.raises(TypeError) as reference:
            torch.nn.utils.vector_to_parameters(wrong, theirs.parameters())
        assert str(mine.value).replace("tracer Tensor", "torch.Tensor") == str(reference.value)


def _truncated_normal_cdf(x: np.ndarray, mean: float, std: float, a: float, b: float):
    def phi(z):
        return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2)))
    low, high = phi((a - mean) / std), phi((b - mean) / std)
    return (phi((x - mean) / std) - low) / (high - low)


def _truncated_normal_moments(mean: float, std: float, a: float, b: float):
    alpha, beta = (a - mean) / std, (b - mean) / std
    density = [math.exp(-z * z / 2) / math.sqrt(2 * math.pi) for z in (alpha, beta)]
    mass = 0.5 * (math.erf(beta / math.sqrt(2)) - math.erf(alpha / math.sqrt(2)))
    shift = (density[0] - density[1]) / mass
    variance = 1 + (alpha * density[0] - beta * density[1]) / mass - shift ** 2
    return mean + std * shift, std * math.sqrt(variance)


# (mean, std, a, b): the normal-redraw branch (mass in [a, b] > 0.3) and the uniform-accept one
TRUNCATIONS = [(0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 1.5), (0.0, 1.0, 1.5, 3.0),
               (-1.0, 0.5, 0.0, 0.4)]


@pytest.mark.parametrize("mean, std, a, b", TRUNCATIONS)
@pytest.mark.parametrize("dtype", [tr.float64, tr.float32])
def test_trunc_normal_follows_the_truncated_distribution(mean, std, a, b, dtype):
    tr.manual_seed(12)
    samples = nn.init.trunc_normal_(tr.empty(400, 250, dtype=dtype), mean, std, a, b)
    values = np.sort(samples.numpy().astype(np.float64).ravel())
    assert values.min() >= a and values.max() <= b
    count = values.size
    cdf = _truncated_normal_cdf(values, mean, std, a, b)
    distance = max(np.max(np.arange(1, count + 1) / count - cdf),
                   np.max(cdf - np.arange(count) / count))
    assert distance < 1.63 / math.sqrt(count)  # Kolmogorov-Smirnov at the 1% level
    expected_mean, expected_std = _truncated_normal_moments(mean, std, a, b)
    assert abs(values.mean() - expected_mean) < 4 * expected_std / math.sqrt(count)
    assert abs(values.std() / expected_std - 1) < 0.01
    # torch's own samples pass the same check (the oracle agrees with torch)
    torch.manual_seed(12)
    theirs = torch.nn.init.trunc_normal_(torch.empty(400, 250, dtype=torch.float64), mean, std,
                                         a, b).numpy().ravel()
    assert abs(theirs.mean() - expected_mean) < 4 * expected_std / math.sqrt(count)


def test_trunc_normal_warns_as_torch_and_uses_the_generator():
    for library in (tr, torch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (nn if library is tr else torch.nn).init.trunc_normal_(library.empty(10), mean=5.0)
        assert "mean is more than 2 std from [a, b]" in str(caught[0].message)
    draws = [nn.init.trunc_normal_(tr.empty(50), generator=tr.Generator().manual_seed(3))
             for _ in range(2)]
    np.testing.assert_array_equal(draws[0].numpy(), draws[1].numpy())


@pytest.mark.parametrize("shape", [(3, 3), (3, 7), (7, 3), (4, 2, 3), (6, 2, 2, 2), (1, 5)])
@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_orthogonal_is_orthogonal_and_torch_s_q_of_the_draw(shape, gain):
    tr.manual_seed(7)
    weight = nn.init.orthogonal_(tr.empty(*shape, dtype=tr.float64), gain=gain)
    rows = shape[0]
    flat = weight.numpy().reshape(rows, -1)
    small = min(flat.shape)
    gram = flat.T @ flat if rows > flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(gram, gain ** 2 * np.eye(small), rtol=0, atol=1e-14 * gain ** 2)
    # the same standard normal draw, factored by torch.linalg.qr as torch's orthogonal_ does
    tr.manual_seed(7)
    drawn = torch.tensor(tr.empty(rows, flat.shape[1], dtype=tr.float64).normal_(0, 1).numpy())
    drawn = drawn.t() if rows < flat.shape[1] else drawn
    q, r = torch.linalg.qr(drawn)
    q = q * torch.diag(r, 0).sign()
    q = q.t() if rows < flat.shape[1] else q
    np.testing.assert_allclose(flat, gain * q.numpy(), rtol=0, atol=1e-13)


def test_orthogonal_float32_errors_and_empty_tensors():
    tr.manual_seed(2)
    weight = nn.init.orthogonal_(tr.empty(16, 8))
    assert weight.dtype == tr.float32
    flat = weight.numpy().astype(np.float64)
    np.testing.assert_allclose(flat.T @ flat, np.eye(8), atol=1e-6)
    for library in (nn, torch.nn):
        with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions"):
            library.init.orthogonal_((tr if library is nn else torch).empty(4))
    empty = tr.empty(0, 3)
    assert nn.init.orthogonal_(empty) is empty
