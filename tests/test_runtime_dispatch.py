"""A call of a compiled signature (runtime/traced_function.py, runtime/compiled.py): what it
precomputes per signature -- the read-only zeros passed for a `.grad` that is None, the results
that are an argument's own tensor or `.grad`, the quick key of a call of tensors and numbers --
leaves every value and every guard as the general path has them. The oracles are hand-computed
values and the cache's counters."""
from __future__ import annotations

import numpy as np

import tracer as tr


def _gradient_of_affine_sum(x):
    (x * 2 + 1).sum().backward()
    return x.grad


def test_a_grad_made_from_none_is_a_fresh_array_each_call_whatever_the_caller_did_to_the_last():
    step = tr.trace(_gradient_of_affine_sum)
    x = tr.tensor(np.ones(16, np.float32), requires_grad=True)
    grads = []
    for _ in range(3):
        x.grad = None
        grad = step(x)
        assert grad is x.grad  # the result is the tensor's own .grad
        np.testing.assert_array_equal(grad.numpy(), np.full(16, 2, np.float32))
        grad.numpy()[:] = 100  # the caller's array: writeable, and no other call's zeros
        grads.append(grad.numpy())
    assert len({id(array) for array in grads}) == 3
    x.grad = tr.tensor(np.full(16, 5, np.float32))  # accumulation into an existing .grad
    np.testing.assert_array_equal(step(x).numpy(), np.full(16, 7, np.float32))
    x.grad = None
    np.testing.assert_array_equal(step(x).numpy(), np.full(16, 2, np.float32))
    assert step.cache_info().misses == 2  # .grad None and set: the trace reads it


def test_two_tensors_without_grad_each_get_zeros_of_their_own_shape():
    @tr.trace
    def step(a, b):
        ((a * 3).sum() + (b * b).sum()).backward()
        return a.grad, b.grad

    a = tr.tensor(np.ones(3, np.float32), requires_grad=True)
    b = tr.tensor(np.arange(4, dtype=np.float32), requires_grad=True)
    for _ in range(2):
        a.grad = b.grad = None
        grad_a, grad_b = step(a, b)
        np.testing.assert_array_equal(grad_a.numpy(), [3, 3, 3])
        np.testing.assert_array_equal(grad_b.numpy(), [0, 2, 4, 6])
    b.grad = tr.tensor(np.ones(4, np.float32))  # one with a .grad, one without
    a.grad = None
    grad_a, grad_b = step(a, b)
    np.testing.assert_array_equal(grad_a.numpy(), [3, 3, 3])
    np.testing.assert_array_equal(grad_b.numpy(), [1, 3, 5, 7])


def test_a_changed_global_is_seen_after_many_quick_calls():
    namespace = {"weight": tr.tensor(np.full(4, 2, np.float32))}
    exec("def scaled(x):\n    return (x * weight).sum()\n", namespace)
    step = tr.trace(namespace["scaled"])
    x = tr.tensor(np.arange(4, dtype=np.float32))
    for _ in range(5):
        assert float(step(x)) == 12.0
    assert step.cache_info()[:2] == (4, 1)
    namespace["weight"] = tr.tensor(np.full(4, 3, np.float32))  # rebound: traced again
    assert float(step(x)) == 18.0
    assert step.cache_info()[:2] == (4, 2)
    namespace["weight"].requires_grad_()  # the captured tensor's state changed: a variant
    assert float(step(x).detach()) == 18.0
    assert step.cache_info()[:2] == (4, 3)


def test_an_int_used_as_a_size_takes_the_general_path_from_then_on():
    @tr.trace
    def rows(x, n):
        return x.reshape(n, -1).sum(1)

    x = tr.tensor(np.arange(12, dtype=np.float32))
    np.testing.assert_array_equal(rows(x, 2).numpy(), [15, 51])
    np.testing.assert_array_equal(rows(x, 3).numpy(), [6, 22, 38])
    np.testing.assert_array_equal(rows(x, 2).numpy(), [15, 51])
    np.testing.assert_array_equal(rows(x, 4).numpy(), [3, 12, 21, 30])


def test_a_numpy_argument_returned_is_a_tensor_of_its_values():
    @tr.trace
    def passed(a, x):
        return a, x * 2

    a = np.arange(3, dtype=np.float32)
    x = tr.tensor(np.ones(3, np.float32))
    for _ in range(2):
        first, second = passed(a, x)
        assert isinstance(first, tr.Tensor)
        np.testing.assert_array_equal(first.numpy(), [0, 1, 2])
        np.testing.assert_array_equal(second.numpy(), [2, 2, 2])


def _entries(traced):
    return list(traced._signatures.entries.values())


def test_a_pure_function_skips_its_empty_check_and_still_sees_every_change_of_its_argument():
    step = tr.trace(lambda x: (x * 2 + 1).sum())
    x = tr.tensor(np.arange(4, dtype=np.float32))
    assert float(step(x)) == 16.0
    (entry,) = _entries(step)
    assert entry.check is None  # nothing outside the arguments: the call checks nothing
    x.numpy()[:] = 1  # changed in place: read on the next call
    assert float(step(x)) == 12.0
    assert float(step(tr.tensor(np.ones(5, np.float32)))) == 15.0  # a new shape: a new signature
    assert float(step(tr.tensor(np.ones(4, np.float64)))) == 12.0  # a new dtype: another
    y = tr.tensor(np.ones(4, np.float32), requires_grad=True)
    result = step(y)  # requires_grad: another, whose result is differentiable
    result.backward()
    np.testing.assert_array_equal(y.grad.numpy(), np.full(4, 2, np.float32))
    assert step.cache_info()[1:] == (4, 4)


def test_a_function_that_reads_outside_its_arguments_is_checked_on_every_quick_call():
    namespace = {"scale": 2.0, "offset": tr.tensor(np.ones(4, np.float32)), "power": 1}
    exec("def floats(x):\n    return (x * scale).sum()\n"
         "def captured(x):\n    return (x + offset).sum()\n"
         "def ints(x):\n    return (x ** power).sum()\n", namespace)
    floats, captured, ints = (tr.trace(namespace[name]) for name in ("floats", "captured", "ints"))
    x = tr.tensor(np.arange(4, dtype=np.float32))
    for _ in range(3):
        assert (float(floats(x)), float(captured(x)), float(ints(x))) == (12.0, 10.0, 6.0)
    assert all(entry.check is not None for f in (floats, captured, ints) for entry in _entries(f))
    namespace["scale"] = 3.0  # a float read: a runtime input, the same code
    namespace["offset"].numpy()[:] = 2  # a captured tensor changed in place
    namespace["power"] = 2  # an int compiled in: traced again
    assert (float(floats(x)), float(captured(x)), float(ints(x))) == (18.0, 14.0, 14.0)
    namespace["offset"] = tr.tensor(np.ones(5, np.float32))  # rebound to another shape
    assert float(captured(tr.tensor(np.zeros(5, np.float32)))) == 5.0
    namespace["offset"].requires_grad_()  # its requires_grad changed: the result follows
    assert captured(tr.tensor(np.zeros(5, np.float32))).requires_grad
    assert [f.cache_info().misses for f in (floats, captured, ints)] == [1, 3, 2]


def test_a_returned_grad_is_the_tensor_s_own_grad_object_made_by_this_call():
    step = tr.trace(_gradient_of_affine_sum)
    x = tr.tensor(np.ones(3, np.float32), requires_grad=True)
    before = step(x)
    assert before is x.grad
    x.grad = None
    after = step(x)
    assert after is x.grad and after is not before
    np.testing.assert_array_equal(after.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(before.numpy(), [2, 2, 2])  # the last call's is its own
