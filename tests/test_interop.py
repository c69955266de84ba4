"""DLPack and __array__ both ways, and foreign arrays as runtime inputs of traced functions."""
import numpy as np
import pytest

import tracer as tr

torch = pytest.importorskip("torch")


def _address(t) -> int:
    return t.data_ptr() if isinstance(t, torch.Tensor) else t.numpy().ctypes.data


def test_torch_to_tracer_and_back_without_copies():
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    mine = tr.from_dlpack(source)
    assert mine.shape == (2, 3) and mine.dtype == tr.float32
    assert _address(mine) == _address(source)
    source[0, 0] = 42.0
    assert mine.numpy()[0, 0] == 42.0
    back = torch.from_dlpack(mine)
    assert back.data_ptr() == _address(mine)
    back[1, 2] = -1.0
    assert mine.numpy()[1, 2] == -1.0 and source[1, 2] == -1.0
    assert mine.__dlpack_device__() == (1, 0)  # kDLCPU
    assert np.shares_memory(np.from_dlpack(mine), mine.numpy())


def test_dlpack_refuses_clearly():
    with pytest.raises(tr.ArgumentError, match="requires grad"):
        torch.from_dlpack(tr.ones(2, requires_grad=True))
    with pytest.raises(tr.ArgumentError, match="detach"):
        tr.from_dlpack(torch.ones(2, requires_grad=True))
    with pytest.raises(tr.ArgumentError, match="float16"):
        tr.from_dlpack(torch.ones(2, dtype=torch.float16))
    with pytest.raises(tr.ArgumentError, match="__dlpack__"):
        tr.from_dlpack([1.0, 2.0])


def test_array_protocol_both_ways():
    t = tr.tensor([1.0, 2.0, 3.0])
    assert np.shares_memory(np.asarray(t), t.numpy())
    copied = np.array(t, copy=True)
    assert not np.shares_memory(copied, t.numpy())
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy"):
        np.asarray(t, dtype=np.float64, copy=False)
    np.testing.assert_array_equal(torch.as_tensor(np.asarray(t)).numpy(), [1, 2, 3])
    np.testing.assert_array_equal(tr.tensor(torch.tensor([4.0, 5.0])).numpy(), [4, 5])


def test_torch_tensor_argument_is_a_runtime_input():
    @tr.trace
    def affine(x, w):
        return x @ w + 1

    x = torch.ones(2, 3)
    w = torch.full((3, 2), 2.0)
    np.testing.assert_array_equal(affine(x, w).numpy(), np.full((2, 2), 7.0))
    x.mul_(10)  # changed in place: the next call must see it (it was baked in as a static value)
    np.testing.assert_array_equal(affine(x, w).numpy(), np.full((2, 2), 61.0))
    assert affine.cache_info().misses == 1 and affine.cache_info().hits == 1
    affine(torch.ones(4, 3), w)  # a new shape is a new signature, as for tensors
    assert affine.cache_info().misses == 2


def test_in_place_update_reaches_the_torch_tensor_without_copy():
    @tr.trace
    def decay(weights, rate):
        weights.mul_(1 - rate)
        return weights.sum()

    weights = torch.ones(5, dtype=torch.float64)
    address = weights.data_ptr()
    total = decay(weights, 0.5)
    assert total.item() == 2.5
    np.testing.assert_array_equal(weights.numpy(), np.full(5, 0.5))
    assert weights.data_ptr() == address


def test_foreign_arrays_that_cannot_be_shared_are_refused():
    @tr.trace
    def double(x):
        return x * 2

    with pytest.raises(tr.ArgumentError, match="argument x is a Tensor that cannot be shared"):
        double(torch.ones(2, requires_grad=True))
    with pytest.raises(tr.ArgumentError, match="int32"):
        double(torch.ones(2, dtype=torch.int32))

    class OnlyArray:  # __array__ may copy: in-place changes would be lost, so they are refused
        def __init__(self):
            self.data = np.ones(3)

        def __array__(self, dtype=None, copy=None):
            return self.data.copy()

    np.testing.assert_array_equal(double(OnlyArray()).numpy(), [2, 2, 2])

    @tr.trace
    def bump(x):
        x.add_(1)
        return x.sum()

    with pytest.raises(tr.ArgumentError, match="read-only"):
        bump(OnlyArray())
