"""What a traced function reads besides its arguments, and arguments that share memory: the
compiled call gives eager mode's answer, or a clear error, never a stale or mixed-up one."""
import numpy as np
import pytest

import tracer as tr

W = tr.tensor([1.0, 2.0])
SCALE = 2.0


def scaled(x):
    return x * W * SCALE


def test_rebinding_a_global_tensor_or_number_traces_again():
    global W, SCALE
    f = tr.trace(scaled)
    np.testing.assert_array_equal(f(tr.tensor([1.0, 1.0])).numpy(), [2.0, 4.0])
    saved = W, SCALE
    try:
        W, SCALE = tr.tensor([10.0, 20.0]), 3.0
        np.testing.assert_array_equal(f(tr.tensor([1.0, 1.0])).numpy(), [30.0, 60.0])
        assert f.cache_info().misses == 2 and f.cache_info().size == 1
    finally:
        W, SCALE = saved


def test_closure_number_is_guarded():
    factor = 2.0
    f = tr.trace(lambda x: x * factor)
    assert f(tr.tensor([1.0])).item() == 2.0
    factor = 5.0  # noqa: F841 (read by the lambda)
    assert f(tr.tensor([1.0])).item() == 5.0


def test_argument_also_reached_through_a_global_name():
    def bump(x):
        x.add_(10)
        return W * 1

    original = W.numpy().copy()
    try:
        result = tr.trace(bump)(W)
        np.testing.assert_array_equal(result.numpy(), original + 10)
        np.testing.assert_array_equal(W.numpy(), original + 10)
    finally:
        W.numpy()[...] = original


def test_written_argument_sharing_memory_with_another_is_refused():
    buffer = np.arange(6, dtype=np.float32)

    def two(x, y):
        x.mul_(2)
        y.add_(1)
        return x + y

    with pytest.raises(tr.ArgumentError, match="shares memory"):
        tr.trace(two)(buffer[0:4], buffer[2:6])
    np.testing.assert_array_equal(buffer, np.arange(6, dtype=np.float32))


def test_read_only_tensor_argument_changes_nothing():
    writable = np.ones(3, np.float32)
    read_only = np.ones(3, np.float32)
    read_only.flags.writeable = False

    def update(x, y):
        x.add_(1)
        y.add_(1)
        return x + y

    with pytest.raises(tr.ArgumentError, match="read-only"):
        tr.trace(update)(tr.from_numpy(writable), tr.from_numpy(read_only))
    np.testing.assert_array_equal(writable, [1.0, 1.0, 1.0])


def test_numpy_argument_changed_before_backward_does_not_change_the_gradient():
    model = tr.trace(lambda x, w: (x * w).sum())
    w = tr.tensor([1.0, 1.0], requires_grad=True)
    x = np.array([1.0, 2.0], np.float32)
    y = model(x, w)
    x[:] = 100
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_static_arguments_of_different_types_are_different_signatures():
    f = tr.trace(lambda x, n: x * (2 if isinstance(n, int) else 3), static_argnums=-1)
    assert f(tr.tensor([1.0]), 2).item() == 2.0
    assert f(tr.tensor([1.0]), 2.0).item() == 3.0
    assert f.cache_info().misses == 2
