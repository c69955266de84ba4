"""torch's functional spellings and cat/stack, against numpy and finite differences."""
import numpy as np
import pytest

import tracer as tr


def test_functional_spellings_equal_methods():
    x = tr.tensor([[0.5, -1.0], [2.0, 3.0]])
    for name in ("abs", "exp", "tanh", "sigmoid", "relu", "sin", "cos"):
        np.testing.assert_array_equal(getattr(tr, name)(x).numpy(), getattr(x, name)().numpy())
    np.testing.assert_array_equal(tr.sum(x, dim=1).numpy(), [-0.5, 5.0])
    np.testing.assert_array_equal(tr.matmul(x, x).numpy(), x.numpy() @ x.numpy())
    np.testing.assert_array_equal(tr.maximum(x, 1.0).numpy(), np.maximum(x.numpy(), 1.0))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack_values(dim):
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(6.0, 12.0).reshape(2, 3)
    np.testing.assert_array_equal(tr.cat([tr.tensor(a), tr.tensor(b)], dim).numpy(),
                                  np.concatenate([a, b], dim))
    np.testing.assert_array_equal(tr.stack([tr.tensor(a), tr.tensor(b)], dim).numpy(),
                                  np.stack([a, b], dim))


def test_cat_of_bool_and_mixed_dtypes():
    mask = tr.tensor([True, False])
    np.testing.assert_array_equal(tr.cat([mask, ~mask]).numpy(), [True, False, False, True])
    mixed = tr.cat([tr.tensor([1, 2]), tr.tensor([0.5])])
    assert mixed.dtype == tr.float32
    np.testing.assert_array_equal(mixed.numpy(), [1.0, 2.0, 0.5])


def test_cat_shape_mismatch_is_a_clear_error():
    with pytest.raises(tr.ShapeMismatchError, match="test_api_functional.py"):
        tr.cat([tr.ones(2, 3), tr.ones(3, 3)], dim=1)


@pytest.mark.parametrize("traced", [False, True])
def test_cat_and_stack_gradients(traced):
    def f(a, b):
        return tr.cat([a * 2, tr.stack([b, b.tanh()], dim=1).reshape(4, 3)], dim=0).sin()

    generator = np.random.default_rng(0)
    a = tr.tensor(generator.standard_normal((3, 3)), requires_grad=True)
    b = tr.tensor(generator.standard_normal((2, 3)), requires_grad=True)
    assert tr.gradcheck(tr.trace(f) if traced else f, (a, b))
