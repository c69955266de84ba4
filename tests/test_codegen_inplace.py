"""In-place updates: outputs written straight into the parameter's buffer where that is safe (no
copy back), the fallbacks where it is not, and the update fused into the gemm that computes the
gradient."""
from __future__ import annotations

import numpy as np
import pytest

import ir
import tracer as tr
from ir.types import TensorType
from runtime import jit
from runtime.compiled import CompiledFunction
from two_layer_net import make_data, step


def update_function(dtype="f32", shape=(6, 5)) -> ir.Function:
    """(w - lr * g, zeros): a parameter update and a gradient reset."""
    f = ir.Function("update")
    w = f.add_parameter("w", TensorType(shape, dtype))
    g = f.add_parameter("g", TensorType(shape, dtype))
    lr = f.add_parameter("lr", TensorType((), dtype))
    b = ir.GraphBuilder(f)
    f.outputs = [b.reduce_sum(w, tuple(range(len(shape)))), b.sub(w, b.mul(lr, g)),
                 b.full(shape, 0, dtype)]
    return ir.optimize(f)


def arrays_for(function: ir.Function, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=p.shape) * 10).astype(p.dtype) for p in function.parameters]


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64"])
def test_outputs_written_into_parameters(dtype):
    function = update_function(dtype)
    compiled = CompiledFunction(function, write_into={1: 0, 2: 1})
    assert compiled.in_place == {1: 0, 2: 1}
    arguments = arrays_for(function)
    w, g = arguments[0], arguments[1]
    expected = ir.interpret(function, [a.copy() for a in arguments])
    outputs = compiled(arguments)
    assert outputs[1] is w and outputs[2] is g  # written in place: nothing to copy back
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_array_equal(actual, wanted) if dtype == "i64" else \
            np.testing.assert_allclose(actual, wanted, rtol=1e-6)
    assert not np.shares_memory(outputs[0], w)


@pytest.mark.parametrize("make", [
    lambda a: np.asfortranarray(a),                       # not C-contiguous
    lambda a: a.astype(np.float64),                       # another dtype: converted
    lambda a: np.lib.stride_tricks.as_strided(a, writeable=False),  # read-only
    lambda a: np.ascontiguousarray(np.repeat(a, 2, axis=1)[:, ::2]),  # a plain copy: fine
])
def test_unusable_argument_runs_on_a_copy(make):
    function = update_function("f32")
    compiled = CompiledFunction(function, write_into={1: 0, 2: 1})
    arguments = arrays_for(function)
    expected = ir.interpret(function, [a.copy() for a in arguments])
    arguments[0] = make(arguments[0])
    before = arguments[0].copy()
    outputs = compiled(arguments)
    usable = (arguments[0].flags.c_contiguous and arguments[0].dtype == np.float32
              and arguments[0].flags.writeable)
    assert (outputs[1] is arguments[0]) == usable
    if not usable:
        np.testing.assert_array_equal(arguments[0], before)  # untouched: the caller copies back
    np.testing.assert_allclose(outputs[1], expected[1], rtol=1e-6)
    np.testing.assert_allclose(outputs[0], expected[0], rtol=1e-5)


def test_overlapping_arguments_run_on_a_copy():
    function = update_function("f64", (4, 4))
    compiled = CompiledFunction(function, write_into={1: 0, 2: 1})
    storage = np.arange(16.0).reshape(4, 4)
    lr = np.array(0.5)
    expected = ir.interpret(function, [storage.copy(), storage.copy(), lr])
    outputs = compiled([storage, storage, lr])  # w and g are the same buffer
    assert outputs[1] is not storage and outputs[2] is not storage
    np.testing.assert_array_equal(storage, np.arange(16.0).reshape(4, 4))
    for actual, wanted in zip(outputs, expected):
        np.testing.assert_allclose(actual, wanted)


def test_refused_when_unsafe():
    f = ir.Function("unsafe")
    w = f.add_parameter("w", TensorType((5, 5), "f64"))
    v = f.add_parameter("v", TensorType((5, 5), "f64"))
    b = ir.GraphBuilder(f)
    new_w = b.add(w, b.swap_last_axes(w))          # reads w transposed while writing it
    new_v = b.mul(v, 2.0)
    later = b.op("matmul", b.swap_last_axes(v), new_v)  # reads the old v after the update
    f.outputs = [new_w, new_v, later, new_v]
    f = ir.optimize(f)
    compiled = CompiledFunction(f, write_into={0: 0, 1: 1})
    assert compiled.in_place == {}
    assert set(compiled.plan.refused) == {0, 1}
    arguments = arrays_for(f)
    expected = ir.interpret(f, [a.copy() for a in arguments])
    original = [a.copy() for a in arguments]
    for actual, wanted in zip(compiled(arguments), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-12)
    for a, o in zip(arguments, original):
        np.testing.assert_array_equal(a, o)
    # the same value written back to two parameters, or also returned: not in place
    g = ir.Function("twice")
    x = g.add_parameter("x", TensorType((3,), "f64"))
    y = g.add_parameter("y", TensorType((3,), "f64"))
    doubled = ir.GraphBuilder(g).mul(x, 2.0)
    g.outputs = [doubled, doubled]
    assert CompiledFunction(g, write_into={0: 0, 1: 1}).in_place == {}
    assert CompiledFunction(g, write_into={1: 0}).in_place == {}
    assert CompiledFunction(g, write_into={0: 1, 1: 1}).in_place == {}


def test_traced_sgd_step_updates_the_users_buffers():
    x, y, w1, w2 = make_data(N=8, D_in=12, H=6, D_out=3)
    traced = tr.trace(step)
    reference = [t.detach().clone().requires_grad_() for t in (w1, w2)]
    for _ in range(3):
        buffers = (w1._handle, w2._handle, None if w1.grad is None else w1.grad._handle)
        traced(x, y, w1, w2, 1e-3)
        assert w1._handle is buffers[0] and w2._handle is buffers[1]
        if buffers[2] is not None:
            assert w1.grad._handle is buffers[2]
    for _ in range(3):
        step(x, y, *reference, 1e-3)
    np.testing.assert_allclose(w1.detach().numpy(), reference[0].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w2.detach().numpy(), reference[1].detach().numpy(), rtol=1e-5, atol=1e-6)
    entry = traced._cache[next(reversed(traced._cache))]
    # w1, w1.grad, w2, w2.grad all written in place
    assert len(entry.executable.in_place) == 4


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_traced_in_place_on_numpy_arguments(dtype):
    @tr.trace
    def bump(a, b):
        a.add_(b * 2)
        return a.sum()

    a = np.arange(6, dtype=dtype).reshape(2, 3)
    b = np.ones((2, 3), dtype)
    view = a
    total = bump(a, b)
    assert view is a and np.array_equal(a, np.arange(6).reshape(2, 3) + 2)
    assert total.item() == a.sum()
    # a Fortran-ordered argument (another signature): copied back, same result
    f = np.asfortranarray(np.arange(6, dtype=dtype).reshape(2, 3))
    bump(f, b)
    assert np.array_equal(f, np.arange(6).reshape(2, 3) + 2) and f.flags.f_contiguous
    # the same buffer passed twice through two views: no in-place write may disturb the read
    c = np.arange(6, dtype=dtype).reshape(2, 3)
    bump(c, c[:])
    assert np.array_equal(c, np.arange(6).reshape(2, 3) * 3)
