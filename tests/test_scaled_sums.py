"""Sums of elements scaled by a value computed from another sum (k = 1 / x.sum(), a mean, a
layer norm's 1 / std) keep PyTorch's results where k is not finite or there is nothing to sum.

Found by the long differential run (2026-11-27): a traced layer_norm over an empty normalized
shape, summed, gave nan where PyTorch gives 0. An optimizer pass (ir/sum_terms.py, removed) rewrote
sum(k * b) as k * sum(b): over nothing that is nan * 0 = nan, not 0; with k infinite, ±inf where
the products' sum is nan (b with a 0, or of both signs) -- and made exact for those, nan where
PyTorch's is ±inf (b of one sign): no form of it was exact, and it saved nothing measurable (layer
norm and cross-entropy fwd+bwd, 4096 rows, one and two threads, interleaved). Through the public
API, float32 and float64, against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tracer as tr

NON_FINITE = {
    "layer norm over an empty shape": (
        lambda F, x: F.layer_norm(x, tuple(x.shape)).sum(), [np.zeros((2, 0))]),
    "a sum scaled by the mean of nothing": (
        lambda F, x: (x * (x.sum() / 0)).sum(), [np.zeros((3, 0))]),
    "an infinite scale, some elements 0": (
        lambda F, x: (x * (1 / (x.sum(-1, keepdim=True) - x.sum(-1, keepdim=True)))).sum(-1),
        [np.array([[0.0, 1.0, 2.0], [0.0, -2.0, 3.0]])]),
    "an infinite scale, elements of one sign": (
        lambda F, x: (x * (1 / (x.sum(-1, keepdim=True) * 0))).sum(-1),
        [np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]])]),
    "an infinite scale, elements of both signs": (
        lambda F, x: (x * (1 / (x.sum(-1, keepdim=True) * 0))).sum(-1),
        [np.array([[-1.0, 1.0, 2.0], [1.0, -2.0, 3.0]])]),
    "a nan scale": (
        lambda F, x: (x * (x.sum(-1, keepdim=True) * np.inf * 0)).sum(-1),
        [np.array([[1.0, 2.0], [3.0, 4.0]])]),
    "a finite scale in one row, an infinite one in the other": (
        lambda F, x: ((x + 1) * (1 / x.sum(-1, keepdim=True))).sum(-1),
        [np.array([[1.0, -1.0, 0.0], [1.0, 2.0, 3.0]])]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(NON_FINITE))
def test_sums_scaled_by_non_finite_factors_or_of_nothing_are_pytorchs(name, dtype):
    function, inputs = NON_FINITE[name]
    expected = function(torch.nn.functional, *(torch.tensor(a.astype(dtype)) for a in inputs))
    with np.errstate(all="ignore"):
        actual = tr.trace(lambda *xs: function(tr.nn.functional, *xs))(
            *(tr.tensor(a.astype(dtype)) for a in inputs))
    np.testing.assert_array_equal(actual.numpy(), expected.numpy())
