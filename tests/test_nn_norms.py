"""Group, instance and RMS normalization (tracer/nn/norms.py, norm_layers.py) against PyTorch:
the functions' values and gradients (float64 and float32, eager and traced, every option),
instance norm's in-place running statistics, the modules' state_dict names, shapes and defaults,
their forward in train and eval mode, a traced training step that compiles once and follows
torch's parameters and running statistics step by step, and the errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(11)


def _cast(arrays, dtype):
    return [a.astype(dtype) for a in arrays]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("shape, groups", [((3, 6, 5, 4), 2), ((3, 6, 5, 4), 6),
                                           ((3, 6, 5, 4), 1), ((4, 6), 2), ((2, 6, 7), 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_against_torch(shape, groups, affine, traced, dtype):
    arrays = [rng.standard_normal(shape) * 3 + 2, rng.standard_normal(6), rng.standard_normal(6)]
    if affine:
        compare_with_torch(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-3),
                           lambda x, w, b: TF.group_norm(x, groups, w, b, eps=1e-3),
                           _cast(arrays, dtype), traced=traced)
    else:
        compare_with_torch(lambda x: F.group_norm(x, groups), lambda x: TF.group_norm(x, groups),
                           _cast(arrays[:1], dtype), traced=traced)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("shape", [(3, 4, 5, 7), (2, 4, 9)])
@pytest.mark.parametrize("use_input_stats", [True, False], ids=["input", "running"])
def test_instance_norm_against_torch_with_running_statistics(shape, use_input_stats, traced,
                                                             dtype):
    running = [rng.standard_normal(4).astype(dtype), (rng.random(4) + 0.5).astype(dtype)]
    ours, theirs = [tr.tensor(r) for r in running], [torch.tensor(r) for r in running]

    def function(x, weight, bias):
        return F.instance_norm(x, *ours, weight, bias, use_input_stats, momentum=0.3, eps=1e-3)

    def torch_function(x, weight, bias):
        return TF.instance_norm(x, *theirs, weight, bias, use_input_stats, momentum=0.3, eps=1e-3)

    arrays = [rng.standard_normal(shape) * 2 + 1, rng.standard_normal(4), rng.standard_normal(4)]
    compare_with_torch(function, torch_function, _cast(arrays, dtype), traced=traced)
    for mine, reference in zip(ours, theirs):  # the average of the samples' updates, in place
        np.testing.assert_allclose(mine.numpy(), reference.numpy(),
                                   rtol=1e-5 if dtype == np.float32 else 1e-12)
    if use_input_stats:
        assert not np.allclose(ours[0].numpy(), running[0])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_instance_norm_without_running_statistics_or_affine(traced):
    compare_with_torch(lambda x: F.instance_norm(x), lambda x: TF.instance_norm(x),
                       [rng.standard_normal((3, 4, 5)) * 4 - 1], traced=traced)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("normalized", [(7,), (5, 7), [3, 5, 7]])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_against_torch(normalized, eps, traced, dtype):
    weight_shape = tuple(normalized)
    arrays = [rng.standard_normal((3, 5, 7)) * 2 + 0.5, rng.standard_normal(weight_shape)]
    compare_with_torch(lambda x, w: F.rms_norm(x, normalized, w, eps),
                       lambda x, w: TF.rms_norm(x, normalized, w, eps),
                       _cast(arrays, dtype), traced=traced)
    compare_with_torch(lambda x: F.rms_norm(x, normalized, eps=eps),
                       lambda x: TF.rms_norm(x, normalized, eps=eps),
                       _cast(arrays[:1], dtype), traced=traced)


def test_rms_norm_default_eps_is_the_dtype_epsilon():
    """A row of zeros but a tiny value: the epsilon decides the result (float32's 1.2e-7, not a
    fixed 1e-5 or float64's 2.2e-16)."""
    x = np.zeros((2, 4))
    x[:, 0] = 1e-4
    for dtype in (np.float32, np.float64):
        result = F.rms_norm(tr.tensor(x.astype(dtype)), (4,)).numpy()
        expected = TF.rms_norm(torch.tensor(x.astype(dtype)), (4,)).numpy()
        np.testing.assert_allclose(result, expected, rtol=1e-6)
    np.testing.assert_allclose(F.rms_norm(tr.tensor(x), (4,)).numpy()[0, 0],
                               1e-4 / np.sqrt(1e-8 / 4 + np.finfo(np.float64).eps), rtol=1e-14)


def test_constant_rows_normalize_to_exact_zeros():
    """PyTorch's exact means give 0 for a constant group or channel; a mean rounded as sum / count
    would leave noise times 1 / sqrt(eps) (88.7 * 3 / 3 is not 88.7 in float32)."""
    x = np.full((2, 3, 3), 88.7, np.float32)
    assert not F.group_norm(tr.tensor(x), 3).numpy().any()
    assert not F.instance_norm(tr.tensor(x)).numpy().any()


MODULES = [
    ("GroupNorm", (3, 6), {}), ("GroupNorm", (2, 6), dict(affine=False)),
    ("GroupNorm", (2, 6), dict(bias=False, eps=1e-3)),
    ("InstanceNorm1d", (6,), {}), ("InstanceNorm1d", (6,), dict(affine=True)),
    ("InstanceNorm2d", (6,), dict(track_running_stats=True, momentum=0.2)),
    ("InstanceNorm2d", (6,), dict(affine=True, track_running_stats=True, bias=False)),
    ("InstanceNorm1d", (6,), dict(track_running_stats=True, momentum=None)),
    ("RMSNorm", (5,), {}), ("RMSNorm", ([4, 5],), dict(eps=1e-4)),
    ("RMSNorm", (5,), dict(elementwise_affine=False)),
]
INPUTS = {"GroupNorm": [(3, 6, 4, 5), (3, 6)], "InstanceNorm1d": [(3, 6, 5), (6, 5)],
          "InstanceNorm2d": [(3, 6, 4, 5), (6, 4, 5)], "RMSNorm": [(3, 4, 5), (4, 5)]}


def _pair(name, args, kwargs):
    """The module in tracer and torch (float64), torch's state copied into ours after moving it
    away from the defaults."""
    theirs = getattr(torch.nn, name)(*args, **kwargs).double()
    with torch.no_grad():
        for value in theirs.parameters():
            value.copy_(torch.tensor(rng.standard_normal(tuple(value.shape))))
        for key, value in theirs.named_buffers():
            if "running" in key:
                value.copy_(torch.tensor(rng.random(tuple(value.shape)) + 0.5))
    ours = getattr(tr.nn, name)(*args, **kwargs).double()
    ours.load_state_dict({key: tr.tensor(value.numpy()) for key, value in
                          theirs.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("name, args, kwargs", MODULES)
def test_module_state_dict_and_repr_match_torch(name, args, kwargs):
    ours, theirs = getattr(tr.nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    for key, value in reference.items():
        assert mine[key].dtype == value.numpy().dtype, key
        np.testing.assert_array_equal(mine[key].numpy(), value.numpy(), err_msg=key)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name, args, kwargs", MODULES)
def test_module_forward_matches_torch(name, args, kwargs, training):
    ours, theirs = _pair(name, args, kwargs)
    ours.train(training), theirs.train(training)
    for shape in INPUTS[name]:
        x = rng.standard_normal(shape) * 2 + 1
        mine, reference = ours(tr.tensor(x)), theirs(torch.tensor(x))
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
        for key, value in theirs.state_dict().items():
            np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(),
                                       rtol=1e-12, err_msg=key)


class _Flat(tr.nn.Module):
    def forward(self, x):
        return F.flatten(x, 1)


def _models():
    torch.manual_seed(0)
    layers = [("Conv2d", (3, 6, 3), dict(padding=1)), ("GroupNorm", (2, 6), {}),
              ("ReLU", (), {}),
              ("InstanceNorm2d", (6,), dict(affine=True, track_running_stats=True)),
              ("AdaptiveAvgPool2d", (2,), {})]
    theirs = torch.nn.Sequential(*[getattr(torch.nn, name)(*args, **kwargs)
                                   for name, args, kwargs in layers], torch.nn.Flatten(1),
                                 torch.nn.RMSNorm(24), torch.nn.Linear(24, 3)).double()
    ours = tr.nn.Sequential(*[getattr(tr.nn, name)(*args, **kwargs)
                              for name, args, kwargs in layers], _Flat(), tr.nn.RMSNorm(24),
                            tr.nn.Linear(24, 3)).double()
    ours.load_state_dict({k: tr.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    return ours, theirs


def test_traced_training_step_compiles_once_and_follows_torch():
    ours, theirs = _models()
    optimizer = tr.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)

    @tr.trace
    def step(x, labels):
        optimizer.zero_grad()
        loss = F.cross_entropy(ours(x), labels)
        loss.backward()
        optimizer.step()
        return loss

    generator = np.random.default_rng(3)
    for _ in range(4):
        x = generator.standard_normal((5, 3, 6, 7)) * 3 + 1
        labels = generator.integers(0, 3, 5)
        loss = step(tr.tensor(x), tr.tensor(labels))
        reference_optimizer.zero_grad()
        expected = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(labels))
        expected.backward()
        reference_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-10)
        state = ours.state_dict()
        for name, value in theirs.state_dict().items():
            np.testing.assert_allclose(state[name].numpy(), value.numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=name)
    assert step.cache_info() == (3, 1, 1)
    ours.eval(), theirs.eval()  # the instance norm's running statistics now normalize
    x = generator.standard_normal((2, 3, 6, 7))
    np.testing.assert_allclose(tr.trace(lambda x: ours(x))(tr.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), rtol=1e-10)


def test_instance_norm_warns_of_other_channels_where_it_has_no_weights():
    with pytest.warns(UserWarning, match="has 2 channels, not num_features=3"):
        tr.nn.InstanceNorm2d(3)(tr.ones(2, 3, 4))  # (C, H, W) = (2, 3, 4), as in PyTorch


def test_float32_modules_by_default():
    for module in (tr.nn.GroupNorm(2, 4), tr.nn.RMSNorm(3),
                   tr.nn.InstanceNorm1d(3, affine=True, track_running_stats=True)):
        assert {value.dtype for value in module.state_dict().values()} <= {
            np.dtype(np.float32), np.dtype(np.int64)}
    x = tr.tensor(rng.standard_normal((2, 4, 3)).astype(np.float32))
    assert tr.nn.GroupNorm(2, 4)(x).dtype == np.float32


@pytest.mark.parametrize("call, message", [
    (lambda: F.group_norm(tr.ones(2, 6, 3), 4), "not divisible into 4 groups"),
    (lambda: F.group_norm(tr.ones(6), 3), "at least 2 dimensions"),
    (lambda: F.group_norm(tr.ones(1, 2), 2), "more than 1 value per channel"),
    (lambda: F.group_norm(tr.ones(2, 6, 3), 3, tr.ones(5)), "weight of shape"),
    (lambda: F.group_norm(tr.ones(2, 6, dtype=tr.int64), 3), "float input"),
    (lambda: tr.nn.GroupNorm(4, 6), "divisible by num_groups"),
    (lambda: F.instance_norm(tr.ones(2, 3, 1)), "more than 1 spatial element"),
    (lambda: F.instance_norm(tr.ones(2, 3, 4), use_input_stats=False), "needs running_mean"),
    (lambda: F.instance_norm(tr.ones(2, 3, 4), tr.zeros(2), tr.ones(2)), "running_mean of shape"),
    (lambda: tr.nn.InstanceNorm2d(3)(tr.ones(3, 4)), "3 or 4 dimensions"),
    (lambda: tr.nn.InstanceNorm1d(4, affine=True)(tr.ones(2, 3, 4)), "3 channels"),
    (lambda: F.rms_norm(tr.ones(2, 3), (2,)), "last dimensions must match"),
    (lambda: F.rms_norm(tr.ones(2, 3), (3,), tr.ones(2)), "weight of shape"),
])
def test_errors(call, message):
    with pytest.raises(tr.TracerError, match=message):
        call()


@pytest.mark.parametrize("call", [
    lambda F, t: F.group_norm(t(np.ones((2, 6, 3))), 4),
    lambda F, t: F.group_norm(t(np.ones((1, 2))), 2),
    lambda F, t: F.instance_norm(t(np.ones((2, 3, 1)))),
    lambda F, t: F.rms_norm(t(np.ones((2, 3))), (2,)),
])
def test_torch_refuses_the_same(call):
    """The errors above are where PyTorch raises too."""
    with pytest.raises((RuntimeError, ValueError)):
        call(TF, torch.tensor)
