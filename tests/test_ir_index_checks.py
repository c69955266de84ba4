"""Which indices are known in range before a program runs (ir/index_checks.py): the windows of a
convolution or pooling, built from iotas, need no run-time check; an index that may leave its
dimension is still checked, and fails as it must."""
import numpy as np
import pytest
import torch

import tracer as tr
import tracer.nn.functional as F
from tracer import ir
from tracer.ir.builder import GraphBuilder
from tracer.ir.index_checks import checks_an_index, value_range
from tracer.ir.types import TensorType


def window_rows(length: int, kernel: int, stride: int, offset: int = 0):
    """A function gathering x[i * stride + h + offset] for i < length, h < kernel from an x of 10
    elements, and the index value."""
    function = ir.Graph("windows")
    x = function.add_parameter("x", TensorType((10,), "f64"))
    builder = GraphBuilder(function)
    rows = builder.op("iota", shape=(length, 1), dimension=0, dtype=np.dtype("int64"))
    offsets = builder.op("iota", shape=(1, kernel), dimension=1, dtype=np.dtype("int64"))
    scaled = builder.op("mul", rows, builder.broadcast(
        builder.constant(stride, "int64"), (length, 1)))
    index = builder.op("add", builder.op("broadcast", scaled, shape=(length, kernel)),
                       builder.op("broadcast", offsets, shape=(length, kernel)))
    if offset:
        index = builder.op("add", index, builder.broadcast(builder.constant(offset, "int64"),
                                                           (length, kernel)))
    function.outputs = [builder.op("gather", x, index, axes=(0,))]
    return function, index


@pytest.mark.parametrize("length, kernel, stride, offset, bounds", [
    (4, 3, 2, 0, (0, 8)), (4, 3, 2, 1, (1, 9)), (5, 3, 2, 0, (0, 10)), (3, 2, 3, -1, (-1, 6))])
def test_iota_arithmetic_has_exact_bounds_and_is_checked_only_when_they_leave_the_dimension(
        length, kernel, stride, offset, bounds):
    function, index = window_rows(length, kernel, stride, offset)
    value = function.outputs[0].producer.inputs[1]
    assert value_range(value) == bounds == (offset, (length - 1) * stride + kernel - 1 + offset)
    in_range = bounds[0] >= 0 and bounds[1] < 10
    assert checks_an_index(function.outputs[0].producer) == (not in_range)
    x = np.arange(10.0)
    rows = np.arange(length)[:, None] * stride + np.arange(kernel)[None, :] + offset
    compiled = tr.runtime.pipeline.compile_graph(ir.optimize(function))
    if bounds[1] < 10:  # (the check wraps a negative index, as numpy and PyTorch do)
        np.testing.assert_array_equal(compiled([x])[0], x[rows])
    else:
        with pytest.raises(tr.IndexOutOfRangeError):
            compiled([x])


def test_a_user_index_is_still_checked():
    function = ir.Graph("lookup")
    x = function.add_parameter("x", TensorType((10,), "f64"))
    index = function.add_parameter("index", TensorType((3,), "i64"))
    builder = GraphBuilder(function)
    function.outputs = [builder.op("gather", x, index, axes=(0,))]
    assert value_range(index) is None and checks_an_index(function.outputs[0].producer)


def test_convolution_windows_are_copied_rows_without_checks():
    """conv2d's windows gather from the padded input, stored once: each window row is a straight
    copy (no check, no padding select per load), and the step equals PyTorch's."""
    generator = np.random.default_rng(0)
    x = generator.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = generator.standard_normal((4, 3, 3, 3)).astype(np.float32)

    @tr.trace
    def step(x, w):
        y = F.conv2d(x, w, padding=1, stride=2)
        (y * y).sum().backward()
        return y

    x_tr, w_tr = tr.tensor(x), tr.tensor(w, requires_grad=True)
    y = step(x_tr, w_tr)
    loops = step.ir(x_tr, w_tr, stage="loops")
    assert "checked_index" not in loops and "check_index" not in step.ir(x_tr, w_tr,
                                                                            stage="optimized")
    w_torch = torch.tensor(w, requires_grad=True)
    expected = torch.nn.functional.conv2d(torch.tensor(x), w_torch, padding=1, stride=2)
    (expected * expected).sum().backward()
    np.testing.assert_allclose(y.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w_tr.grad.numpy(), w_torch.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_bounds_that_overflow_the_index_type_are_not_bounds():
    """int64 arithmetic wraps: iota * 2**62 over 4 elements reaches 3 * 2**62, beyond int64, and
    wraps to -2**62, so nothing is known of it (and a gather reading it is checked)."""
    function = ir.Graph("wrapping")
    x = function.add_parameter("x", TensorType((10,), "f64"))
    builder = GraphBuilder(function)
    rows = builder.op("iota", shape=(4,), dimension=0, dtype=np.dtype("int64"))
    scaled = builder.op("mul", rows, builder.broadcast(builder.constant(2 ** 62, "int64"), (4,)))
    function.outputs = [builder.op("gather", x, scaled, axes=(0,))]
    assert value_range(rows) == (0, 3) and value_range(scaled) is None
    assert checks_an_index(function.outputs[0].producer)
    with pytest.raises(tr.IndexOutOfRangeError):
        tr.runtime.pipeline.compile_graph(ir.optimize(function))([np.arange(10.0)])
