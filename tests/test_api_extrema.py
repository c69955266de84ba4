"""Maxima, minima and max pooling as PyTorch gives them: the selected element itself (-0.0, nan
and ±inf as they are), its position (the first of tied maxima, the last nan; a window of -inf only
beside its padding points at its first element inside the input), the gradient to it alone; bool
and extreme int64 inputs; windows of one element and windows too large to unroll one by one. Each
against PyTorch, eagerly and traced."""
import numpy as np
import pytest
import torch

import tracer as tr


SELECTING = {  # the values of these are one element of each row, as PyTorch copies it
    "max(dim)": lambda m, x: x.max(1).values,
    "min(dim)": lambda m, x: x.min(1).values,
    "max_pool2d": lambda m, x: m.nn.functional.max_pool2d(x.reshape(1, 2, 2, 3), (2, 1)),
}


@pytest.mark.parametrize("name", SELECTING)
def test_max_min_and_max_pooling_copy_the_selected_element(name):
    # Their values were a sum of the row with the other elements set to 0: -0.0 + 0.0 = +0.0
    # where PyTorch gives -0.0. Every row here has -0.0 where it is selected, with nan and ±inf
    # elsewhere; the gradient goes to the selected element alone.
    inf, nan = float("inf"), float("nan")
    values = [[-0.0, -1.0, -inf], [-inf, -0.0, -5.0], [-0.0, 0.0, -inf], [1.0, nan, -0.0]]
    if name == "min(dim)":
        values = [[-0.0, 1.0, inf], [inf, -0.0, 5.0], [-0.0, 0.0, inf], [1.0, nan, -0.0]]
    expected_x = torch.tensor(values, requires_grad=True)
    expected = SELECTING[name](torch, expected_x)
    expected.backward(torch.arange(1.0, expected.numel() + 1).reshape(expected.shape))

    def step(x, weights):
        result = SELECTING[name](tr, x)
        result.backward(weights)
        return result.detach()

    weights = tr.arange(1.0, expected.numel() + 1).reshape(tuple(expected.shape))
    for runner in (step, tr.trace(step)):
        x = tr.tensor(values, requires_grad=True)
        result = runner(x, weights)
        assert result.numpy().tobytes() == expected.detach().numpy().tobytes()
        np.testing.assert_array_equal(x.grad.numpy(), expected_x.grad.numpy())


EXTREMA = {
    "max()": lambda x: x.max(), "min()": lambda x: x.min(), "amax(1)": lambda x: x.amax(1),
    "amin(0, keepdim)": lambda x: x.amin(0, keepdim=True),
    "max(1)": lambda x: tuple(x.max(1)), "min(0)": lambda x: tuple(x.min(0)),
}


@pytest.mark.parametrize("values", [[[True, False, True], [False, False, False]],
                                    [[-2**63, 0, 5], [2**63 - 1, -2**63, -1]]],
                         ids=["bool", "int64 extremes"])
@pytest.mark.parametrize("name", EXTREMA)
def test_maxima_and_minima_of_bools_and_extreme_integers(name, values):
    # bool tensors were refused (PyTorch reduces them); amin was -amax(-x), and -x wraps at
    # int64's lowest value, whose minimum came out as the largest of the rest
    expected = EXTREMA[name](torch.tensor(values))
    expected = expected if isinstance(expected, tuple) else (expected,)
    for runner in (EXTREMA[name], tr.trace(EXTREMA[name])):
        result = runner(tr.tensor(values))
        result = result if isinstance(result, tuple) else (result,)
        for ours, theirs in zip(result, expected, strict=True):
            assert str(ours.dtype) == str(theirs.dtype).replace("torch.", "")
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 1), (2, 1, 1), (3, 2, 1)])
def test_a_window_of_minus_infinity_beside_padding_points_inside_the_input(kernel, stride,
                                                                           padding):
    # PyTorch starts each window's scan at its first element inside the input: the padding,
    # also -inf, never takes the position (nor the gradient, which would be lost there)
    values = np.full((1, 1, 4, 4), -np.inf, np.float32)
    values[0, 0, 2, 2] = 1.0
    weights = np.arange(1.0, 65.0, dtype=np.float32).reshape(1, 1, 8, 8)

    def step(m, functional, x):
        result, indices = functional.max_pool2d(x, kernel, stride, padding, return_indices=True)
        (result * m.tensor(weights[..., :result.shape[2], :result.shape[3]])).sum().backward()
        return result.detach(), indices

    expected_x = torch.tensor(values, requires_grad=True)
    expected = step(torch, torch.nn.functional, expected_x)
    for runner in (step, tr.trace(step, static_argnums=(0, 1))):
        x = tr.tensor(values, requires_grad=True)
        result, indices = runner(tr, tr.nn.functional, x)
        np.testing.assert_array_equal(result.numpy(), expected[0].numpy())
        np.testing.assert_array_equal(indices.numpy(), expected[1].numpy())
        np.testing.assert_array_equal(x.grad.numpy(), expected_x.grad.numpy())


@pytest.mark.parametrize("kernel", [1, 16])
def test_max_pooling_windows_of_one_element_and_of_a_whole_feature_map(kernel):
    # one element: a new tensor that takes in-place changes (it was a view-copy that refused
    # them); 16 x 16 = 256 elements compared pairwise in 8 steps (one by one, the chain of 255
    # selects was too deep for the scheduler's recursion)
    values = np.random.default_rng(7).standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected = torch.nn.functional.max_pool2d(torch.tensor(values), kernel) + 1
    for runner in (lambda x: tr.nn.functional.max_pool2d(x, kernel).add_(1),
                   tr.trace(lambda x: tr.nn.functional.max_pool2d(x, kernel).add_(1))):
        np.testing.assert_array_equal(runner(tr.tensor(values)).numpy(), expected.numpy())


def test_max_of_a_0d_tensor_is_a_new_tensor():
    x = tr.tensor(3.0)
    x.max(0).values.add_(1)
    assert x.item() == 3.0  # PyTorch's too
