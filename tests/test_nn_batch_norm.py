"""Batch norm and the convolution / pooling modules (tracer/nn/normalization.py, layers.py)
against PyTorch: F.batch_norm's values, gradients and in-place running statistics; a Conv-BN-ReLU-
Pool model trained by a traced step whose running statistics, num_batches_tracked, parameters
and eval outputs follow torch's step by step; state_dict keys; default initializations."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(5)
IMAGES = rng.standard_normal((3, 4, 5, 7)) * 2 + 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("shape", [(3, 4, 5, 7), (6, 4), (2, 4, 9)])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_against_torch(shape, training, traced, dtype):
    x = rng.standard_normal(shape) * 2 + 1
    running = [rng.standard_normal(4).astype(dtype), (rng.random(4) + 0.5).astype(dtype)]
    ours = [tr.tensor(r) for r in running]
    theirs = [torch.tensor(r) for r in running]

    def function(x, weight, bias):
        return F.batch_norm(x, *ours, weight, bias, training=training, momentum=0.3, eps=1e-3)

    def torch_function(x, weight, bias):
        return TF.batch_norm(x, *theirs, weight, bias, training=training, momentum=0.3, eps=1e-3)

    arrays = [x, rng.standard_normal(4), rng.standard_normal(4)]
    compare_with_torch(function, torch_function, [a.astype(dtype) for a in arrays], traced=traced)
    for mine, reference in zip(ours, theirs):  # updated in place in training (unbiased variance)
        np.testing.assert_allclose(mine.numpy(), reference.numpy(),
                                   rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_batch_norm_without_running_statistics_or_affine():
    compare_with_torch(lambda x: F.batch_norm(x, None, None, training=True),
                       lambda x: TF.batch_norm(x, None, None, training=True), [IMAGES])


class _Flat(tr.nn.Module):
    def forward(self, x):
        return F.flatten(x, 1)


def _models(momentum):
    """The same CNN in tracer and torch (torch's initial weights copied into ours)."""
    torch.manual_seed(0)
    layers = [("Conv2d", (3, 8, 3), dict(padding=1)),
              ("BatchNorm2d", (8,), dict(momentum=momentum)),
              ("ReLU", (), {}), ("MaxPool2d", (2,), {}),
              ("Conv2d", (8, 6, 3), dict(padding=1, bias=False)), ("BatchNorm2d", (6,), {}),
              ("ReLU", (), {}), ("AdaptiveAvgPool2d", (1,), {})]
    theirs = torch.nn.Sequential(*[getattr(torch.nn, name)(*args, **kwargs)
                                   for name, args, kwargs in layers], torch.nn.Flatten(1),
                                 torch.nn.Linear(6, 3)).double()
    ours = tr.nn.Sequential(*[getattr(tr.nn, name)(*args, **kwargs)
                              for name, args, kwargs in layers], _Flat(),
                            tr.nn.Linear(6, 3)).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tr.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("momentum", [0.1, None])
def test_traced_training_follows_torch_running_statistics(momentum):
    ours, theirs = _models(momentum)
    optimizer = tr.optim.SGD(ours.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        loss = F.cross_entropy(ours(x), labels)
        loss.backward()
        optimizer.step()
        return loss

    generator = np.random.default_rng(3)
    for _ in range(4):
        x = generator.standard_normal((5, 3, 8, 9)) * 3 + 1
        labels = generator.integers(0, 3, 5)
        loss = step(tr.tensor(x), tr.tensor(labels))
        reference_optimizer.zero_grad()
        expected = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(labels))
        expected.backward()
        reference_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-10)
        state, reference = ours.state_dict(), theirs.state_dict()
        for name, value in reference.items():
            np.testing.assert_allclose(state[name].numpy(), value.numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=name)
    assert ours[1].num_batches_tracked.item() == 4
    ours.eval(), theirs.eval()
    x = generator.standard_normal((2, 3, 8, 9))
    evaluate = tr.trace(lambda x: ours(x))
    np.testing.assert_allclose(evaluate(tr.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), rtol=1e-10)


@pytest.mark.parametrize("name, args, kwargs", [
    ("Conv1d", (4, 6, 3), dict(groups=2)), ("Conv2d", (4, 6, (3, 2)), dict(bias=False)),
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2)), ("BatchNorm1d", (5,), {}),
    ("BatchNorm2d", (5,), dict(affine=False)),
    ("BatchNorm2d", (5,), dict(track_running_stats=False)),
])
def test_module_state_dict_matches_torch(name, args, kwargs):
    ours, theirs = getattr(tr.nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    for key, value in reference.items():
        assert mine[key].shape == tuple(value.shape), key
        assert mine[key].dtype == value.numpy().dtype, key


@pytest.mark.parametrize("name, args, fan_in", [
    ("Conv2d", (6, 40, 5), 6 * 25), ("Conv2d", (6, 42, 3, 1, 0, 1, 3), 2 * 9),
    ("Conv1d", (8, 50, 7), 8 * 7), ("ConvTranspose2d", (40, 12, 3, 1, 0, 0, 2), 6 * 9)])
def test_convolution_initialization_is_torch_distribution(name, args, fan_in):
    """Uniform in +-1/sqrt(fan_in): within the bound, spread as a uniform's (std = bound/sqrt 3),
    the same bound as torch's module of the same arguments."""
    tr.manual_seed(0)
    module = getattr(tr.nn, name)(*args)
    bound = 1 / math.sqrt(fan_in)
    reference = getattr(torch.nn, name)(*args)
    assert module.weight.shape == tuple(reference.weight.shape)
    assert float(reference.weight.detach().abs().max()) <= bound
    for parameter in (module.weight, module.bias):
        values = parameter.detach().numpy()
        assert np.abs(values).max() <= bound
        assert abs(values.std() - bound / math.sqrt(3)) < 0.25 * bound / math.sqrt(3)


def test_modules_forward_match_torch():
    torch.manual_seed(1)
    x = rng.standard_normal((2, 4, 9, 8))
    for ours, theirs in [(tr.nn.MaxPool2d(3, 2, 1, return_indices=True),
                          torch.nn.MaxPool2d(3, 2, 1, return_indices=True)),
                         (tr.nn.AvgPool2d(3, 2, 1, count_include_pad=False),
                          torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
                         (tr.nn.AdaptiveAvgPool2d((2, 3)), torch.nn.AdaptiveAvgPool2d((2, 3))),
                         (tr.nn.Conv2d(4, 3, 3, padding=2, padding_mode="reflect"),
                          torch.nn.Conv2d(4, 3, 3, padding=2, padding_mode="reflect")),
                         (tr.nn.ConvTranspose2d(4, 3, 3, 2, 1, 1),
                          torch.nn.ConvTranspose2d(4, 3, 3, 2, 1, 1))]:
        theirs.double()
        if isinstance(ours, tr.nn.Module) and list(ours.state_dict()):
            ours.double().load_state_dict({k: tr.tensor(v.detach().numpy())
                                           for k, v in theirs.state_dict().items()})
        result, expected = ours(tr.tensor(x)), theirs(torch.tensor(x))
        for mine, reference in zip(result if isinstance(result, tuple) else [result],
                                   expected if isinstance(expected, tuple) else [expected]):
            np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                       rtol=1e-10, atol=1e-12)
