"""The classes of silently wrong or refused results that issue 8 reported, one test per class.

Each program is written once against a module `m` (tracer or torch, which share these names) and
run eagerly, traced (first and cached call) and, where installed, in PyTorch, the oracle: values,
dtypes, `.grad` None-or-tensor and in-place updates must agree. Without torch the expectations are
the hand-computed values written beside each case."""
import numpy as np
import pytest

import tracer as tr

try:
    import torch
except ImportError:  # the eager/traced comparison and the hand-computed values still run
    torch = None


def function_base(m):
    return m.Function if m is tr else m.autograd.Function


def as_numpy(value):
    if value is None:
        return None
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    return value.detach().numpy().copy()


def run(program, m, traced=False, calls=1):
    """Run `program(m)` -> (step, tensors, extra); call the step `calls` times; return the
    results of the last call, then every tensor's value and `.grad` (None stays None)."""
    step, tensors, extra = program(m)
    runner = tr.trace(step) if traced else step
    for _ in range(calls):
        result = runner(*tensors, *extra)
    results = result if isinstance(result, tuple) else (result,)
    return ([as_numpy(r) for r in results if r is not None],
            [(as_numpy(t), as_numpy(t.grad)) for t in tensors])


def assert_agree(expected, actual, rtol=1e-6):
    (expected_results, expected_tensors), (results, tensors) = expected, actual
    assert len(expected_results) == len(results)
    for e, a in zip(expected_results, results):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol)
    for (e_value, e_grad), (value, grad) in zip(expected_tensors, tensors):
        np.testing.assert_allclose(value, e_value, rtol=rtol, atol=rtol)
        assert (e_grad is None) == (grad is None), (e_grad, grad)
        if e_grad is not None:
            np.testing.assert_allclose(grad, e_grad, rtol=rtol, atol=rtol)


def check(program, calls=1, expected_tensors=None):
    """Eager, traced (every call up to `calls`, the last one cached) and torch agree."""
    eager = run(program, tr, calls=calls)
    for count in range(1, calls + 1):
        assert_agree(run(program, tr, calls=count), run(program, tr, traced=True, calls=count))
    if torch is not None:
        assert_agree(run(program, torch, calls=calls), eager)
    if expected_tensors is not None:
        for (value, grad), (expected_value, expected_grad) in zip(eager[1], expected_tensors):
            np.testing.assert_allclose(value, expected_value, rtol=1e-6)
            assert (grad is None) == (expected_grad is None)
            if grad is not None:
                np.testing.assert_allclose(grad, expected_grad, rtol=1e-6)
    return eager


# 1. A training step whose parameters already have a .grad (accumulation over calls) ------------
LOSSES = {
    "sign": lambda w: w.sign().sum(),
    "square": lambda w: (w * w).sum(),
    "exp": lambda w: w.exp().sum(),
}
UPDATES = {
    "sub_": lambda w, lr: w.sub_(lr * w.grad),
    "add_alpha": lambda w, lr: w.add_(w.grad, alpha=-lr),
    "sub_alpha": lambda w, lr: w.sub_(w.grad, alpha=lr),
    "mul_then_sub_": lambda w, lr: w.sub_(w.grad * lr),
}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("update", UPDATES)
@pytest.mark.parametrize("existing_grad", [False, True])
@pytest.mark.parametrize("zero_grad", [False, True])
def test_training_step_with_and_without_existing_grad(loss, update, existing_grad, zero_grad):
    def program(m):
        w = m.tensor([2.0, -0.5, 1.5], requires_grad=True)
        if existing_grad:
            w.grad = m.tensor([10.0, -3.0, 0.25])

        def step(w, lr):
            LOSSES[loss](w).backward()
            with m.no_grad():
                UPDATES[update](w, lr)
                if zero_grad:
                    w.grad.zero_()
        return step, [w], [0.1]
    check(program, calls=3)


def test_the_reported_step_leaves_w_at_one():
    def program(m):
        w = m.tensor([2.0], requires_grad=True)
        w.grad = m.tensor([10.0])

        def step(w, lr):
            loss = w.sign().sum()
            loss.backward()
            with m.no_grad():
                w.sub_(lr * w.grad)
                w.grad.zero_()
        return step, [w], [0.1]
    check(program, expected_tensors=[([1.0], [0.0])])


# 2. Python numbers passed to a traced function stay weak scalars --------------------------------
SCALAR_EXPRESSIONS = {
    "clamp(-s, s)": lambda x, s: x.clamp(min=-s, max=s),
    "x * -s": lambda x, s: x * -s,
    "x + abs(s)": lambda x, s: x + abs(s),
    "x - (+s)": lambda x, s: x - (+s),
    "x / (2 * -s)": lambda x, s: x / (2 * -s),
    "x.add(x, alpha=s)": lambda x, s: x.add(x, alpha=s),
    "x.sub(x, alpha=-s)": lambda x, s: x.sub(x, alpha=-s),
}


@pytest.mark.parametrize("expression", SCALAR_EXPRESSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_python_number_arguments_do_not_widen(expression, dtype):
    function = SCALAR_EXPRESSIONS[expression]
    x = tr.tensor([0.3, -0.7], dtype=getattr(tr, dtype))
    eager = function(x, 0.5)
    traced = tr.trace(function)(x, 0.5)
    assert eager.dtype == traced.dtype == getattr(tr, dtype)
    np.testing.assert_allclose(traced.numpy(), eager.numpy(), rtol=1e-6)
    if torch is not None:
        expected = function(torch.tensor([0.3, -0.7], dtype=getattr(torch, dtype)), 0.5)
        np.testing.assert_allclose(eager.numpy(), expected.numpy(), rtol=1e-6)


# 3. fill_/zero_/copy_ of a tensor on the gradient path cut it: zeros to the old value -----------
OVERWRITES = {
    "zero_": lambda v, m, source: v.zero_(),
    "fill_": lambda v, m, source: v.fill_(2.0),
    "copy_(leaf)": lambda v, m, source: v.copy_(source),
    "copy_(computed)": lambda v, m, source: v.copy_(source * 2),
}


@pytest.mark.parametrize("overwrite", OVERWRITES)
@pytest.mark.parametrize("reads_x_again", [False, True])
def test_overwriting_a_non_leaf_cuts_its_gradient_path(overwrite, reads_x_again):
    def program(m):
        x = m.tensor([1.0, 2.0], requires_grad=True)
        source = m.tensor([5.0, -1.0], requires_grad=True)

        def step(x, source):
            v = x * 3
            OVERWRITES[overwrite](v, m, source)
            (v * x if reads_x_again else v).sum().backward()
        return step, [x, source], []
    check(program)


def test_zero_of_a_non_leaf_gives_zero_gradient_not_the_old_path():
    def program(m):
        x = m.tensor([1.0, 2.0], requires_grad=True)

        def step(x):
            v = x * 3
            v.zero_()
            v.sum().backward()
        return step, [x], []
    check(program, expected_tensors=[([1.0, 2.0], [0.0, 0.0])])


def test_copy_of_a_leaf_into_a_plain_tensor_sends_the_gradient_to_the_leaf():
    def program(m):
        target = m.zeros(2)
        leaf = m.tensor([1.0, 2.0], requires_grad=True)

        def step(target, leaf):
            target.copy_(leaf)
            (target * target).sum().backward()
        return step, [target, leaf], []
    # traced, `target` is an argument whose new value is written back: compare eagerly with torch
    eager = run(program, tr)
    np.testing.assert_allclose(eager[1][1][1], [2.0, 4.0])
    if torch is not None:
        assert_agree(run(program, torch), eager)


# 4. 0-d float64 values used twice: gradients sum as arrays, never numpy scalars -----------------
@pytest.mark.parametrize("build", [
    lambda x, y: tr.where(x > 0, x, y),
    lambda x, y: x * y,
    lambda x, y: (x + y).exp(),
])
def test_zero_dimensional_float64_used_twice(build):
    x = tr.tensor(1.5, dtype=tr.float64, requires_grad=True)
    y = tr.tensor(-2.0, dtype=tr.float64, requires_grad=True)
    assert tr.gradcheck(lambda x, y: build(x, y) * build(x, y), (x, y))


# 5. None against zeros in .grad ----------------------------------------------------------------
class HalfNone:
    """forward a * b; backward returns None for b although b requires grad."""

    @staticmethod
    def make(m):
        class Multiply(function_base(m)):
            @staticmethod
            def forward(ctx, a, b):
                return a * b

            @staticmethod
            def backward(ctx, grad):
                return grad, None
        return Multiply


def test_custom_backward_returning_none_leaves_grad_none():
    def program(m):
        a = m.tensor([1.0, 2.0], requires_grad=True)
        b = m.tensor([3.0, 4.0], requires_grad=True)

        def step(a, b):
            HalfNone.make(m).apply(a, b).sum().backward()
        return step, [a, b], []
    check(program, expected_tensors=[([1.0, 2.0], [1.0, 1.0]), ([3.0, 4.0], None)])


def test_eager_backward_through_a_traced_result_leaves_unused_inputs_none():
    def pure(a, b):
        return a * 2
    a = tr.tensor([1.0, 2.0], requires_grad=True)
    b = tr.tensor([1.0, 2.0], requires_grad=True)
    tr.trace(pure)(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0])
    assert b.grad is None


def test_eager_backward_through_a_traced_custom_none_leaves_grad_none():
    def pure(a, b):
        return HalfNone.make(tr).apply(a, b)
    a = tr.tensor([1.0, 2.0], requires_grad=True)
    b = tr.tensor([1.0, 2.0], requires_grad=True)
    tr.trace(pure)(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [1.0, 1.0])
    assert b.grad is None


# 6. An in-place change of a value the backward reads: the same error eagerly and traced --------
CHANGES = {
    "non-leaf operand of mul": (lambda m, a: _mul_then_change(m, a), True),
    "leaf operand under no_grad": (lambda m, a: _leaf_changed_under_no_grad(m, a, "mul"), True),
    "leaf whose exp only reads its result": (
        lambda m, a: _leaf_changed_under_no_grad(m, a, "exp"), False),
    "y.mul_(x) reads the old y itself": (lambda m, a: _self_multiply(m, a), False),
}


def _mul_then_change(m, a):
    b = a * 2
    c = b * b
    b.mul_(3)
    c.sum().backward()


def _leaf_changed_under_no_grad(m, a, primitive):
    c = a * a if primitive == "mul" else a.exp()
    with m.no_grad():
        a.mul_(3)
    c.sum().backward()


def _self_multiply(m, a):
    y = a * 1
    y.mul_(a)
    y.sum().backward()


@pytest.mark.parametrize("case", CHANGES)
def test_in_place_change_of_a_value_the_backward_reads(case):
    body, raises = CHANGES[case]
    if torch is not None:
        a = torch.tensor([1.0, 2.0], requires_grad=True)
        if raises:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                body(torch, a)
        else:
            body(torch, a)
            expected = a.grad.numpy().copy()
    for runner in (lambda a: body(tr, a), tr.trace(lambda a: body(tr, a))):
        a = tr.tensor([1.0, 2.0], requires_grad=True)
        if raises:
            with pytest.raises(tr.InplaceError, match="changed in place"):
                runner(a)
            assert a.grad is None
        else:
            runner(a)
            if torch is not None:
                np.testing.assert_allclose(a.grad.numpy(), expected, rtol=1e-6)


# 7. Operands that PyTorch refuses -------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda x: x.mm([[1.0], [2.0]]),
    lambda x: x.matmul([[1.0], [2.0]]),
    lambda x: x @ [[1.0], [2.0]],
    lambda x: tr.matmul(x, [[1.0], [2.0]]),
    lambda x: x.expand_as([[1.0, 2.0], [3.0, 4.0]]),
    lambda x: x.type_as([1]),
    lambda x: x.clone().copy_([[1.0, 2.0]]),
    lambda x: x + [1.0, 2.0],
    lambda x: tr.where(x > 0, [[1.0, 2.0]], x),
])
def test_nested_lists_as_tensor_operands_are_refused(call):
    x = tr.tensor([[1.0, 2.0]])
    with pytest.raises(tr.TracerError, match="test_api_wrong_results.py"):
        call(x)


# 8. Arguments that share memory -------------------------------------------------------------------
def _descend(w):
    (w * w).sum().backward()
    with tr.no_grad():
        w.sub_(w.grad)


def test_grad_sharing_its_parameters_buffer_is_refused_and_nothing_changes():
    step = tr.trace(_descend)
    w = tr.tensor([1.0, 2.0], requires_grad=True)
    w.grad = tr.zeros(2)
    step(w)  # compiled, and the fast path is warm
    w.grad = w.detach()
    before = w.detach().numpy().copy()
    with pytest.raises(tr.ArgumentError, match="shares memory"):
        step(w)
    np.testing.assert_array_equal(w.detach().numpy(), before)
    np.testing.assert_array_equal(w.grad.numpy(), before)


def test_the_same_tensor_as_two_updated_arguments_is_one_argument():
    def step(a, b):
        (a * b).sum().backward()
        with tr.no_grad():
            a.sub_(a.grad)
            b.sub_(b.grad)
    results = []
    for runner in (step, tr.trace(step)):
        w = tr.tensor([1.0, 2.0], requires_grad=True)
        runner(w, w)
        results.append(w.detach().numpy())
    np.testing.assert_allclose(results[1], results[0])
    np.testing.assert_allclose(results[0], [-3.0, -6.0])  # PyTorch gives the same


@pytest.mark.parametrize("join", ["cat", "stack"])
def test_cat_and_stack_keep_the_sign_of_zero(join):
    # PyTorch copies every element; a concatenation built as a sum of zero-padded parts made
    # -0.0 + 0.0 = +0.0 (1 / x then gave inf where PyTorch gives -inf)
    if torch is None:
        pytest.skip("PyTorch, the oracle, is not installed")
    values = [[-0.0, 1.0, float("nan")], [2.0, -0.0, -float("inf")]]
    expected = getattr(torch, join)([torch.tensor(v) for v in values]).numpy()
    def function(a, b):
        return getattr(tr, join)([a, b])

    for result in (function(*map(tr.tensor, values)), tr.trace(function)(*map(tr.tensor, values))):
        assert result.numpy().tobytes() == expected.tobytes()

