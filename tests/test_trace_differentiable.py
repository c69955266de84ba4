"""Results of a traced function carry a backward, as with torch.compile."""
import numpy as np
import pytest

import tracer as tr


@tr.trace
def layer(x, w, b):
    return (x @ w + b).tanh()


def _data():
    tr.manual_seed(3)
    x = tr.randn(5, 4, dtype=tr.float64)
    w = tr.randn(4, 3, dtype=tr.float64, requires_grad=True)
    b = tr.randn(3, dtype=tr.float64, requires_grad=True)
    return x, w, b


def test_backward_through_traced_result_matches_eager():
    x, w, b = _data()
    (layer(x, w, b) ** 2).sum().backward()
    traced = w.grad.numpy().copy(), b.grad.numpy().copy()
    w.grad = b.grad = None
    (layer.python_function(x, w, b) ** 2).sum().backward()
    np.testing.assert_allclose(traced[0], w.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(traced[1], b.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_hand_computed_gradient():
    x, w, b = _data()
    layer(x, w, b).sum().backward()
    pre = x.numpy() @ w.detach().numpy() + b.detach().numpy()
    expected_b = (1 - np.tanh(pre) ** 2).sum(axis=0)
    np.testing.assert_allclose(b.grad.numpy(), expected_b, rtol=1e-12)


def test_gradcheck_of_traced_layer():
    assert tr.gradcheck(layer, _data())


def test_in_place_change_before_backward_is_an_error_where_it_is_in_pytorch():
    """The backward of x @ w reads x (for w's gradient) and not w (x requires no grad): PyTorch
    refuses a change of x before it, not one of w."""
    x, w, b = _data()
    out = layer(x, w, b).sum()
    with tr.no_grad():
        x.add_(1.0)
    with pytest.raises(tr.InplaceError, match="test_trace_differentiable.py"):
        out.backward()
    assert w.grad is None
    x, w, b = _data()
    pre = x.numpy() @ w.detach().numpy() + b.detach().numpy()
    out = layer(x, w, b).sum()
    with tr.no_grad():
        w.add_(1.0)
    out.backward()
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ (1 - np.tanh(pre) ** 2), rtol=1e-12)


def test_step_with_in_place_updates_returns_detached_result():
    @tr.trace
    def step(w):
        loss = (w * w).sum()
        loss.backward()
        with tr.no_grad():
            w.sub_(0.1 * w.grad)
        return loss

    w = tr.ones(3, requires_grad=True)
    loss = step(w)
    assert not loss.requires_grad
    np.testing.assert_allclose(w.detach().numpy(), np.full(3, 0.8, np.float32))


# A traced function that changes state (BatchNorm's running statistics, a counter it is given)
# returns differentiable results where they do not depend on what it overwrites: the backward
# runs the function again and puts back what that run changes (runtime/differentiable.py).

@pytest.mark.parametrize("dimensions", [1, 2])
def test_a_compiled_batch_norm_in_training_gives_the_gradients_and_statistics_pytorch_gives(
        dimensions):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(dimensions)
    shape = (6, 3) if dimensions == 1 else (4, 3, 2, 5)
    x_values = rng.standard_normal(shape)
    mixing = rng.standard_normal(shape)

    def run(m, compiled):
        norm = getattr(m.nn, f"BatchNorm{dimensions}d")(3, dtype=m.float64)
        with m.no_grad():
            norm.weight.copy_(m.tensor(rng_weight))
        forward = (tr.trace(norm) if m is tr else torch.compile(norm)) if compiled else norm
        x = m.tensor(x_values, requires_grad=True)
        y = forward(x)
        assert y.requires_grad
        # another term besides the normalized one, so a lost gradient shows
        loss = (y * m.tensor(mixing)).pow(2).sum() + (x * x).sum()
        loss.backward()
        forward(x)  # a second call: the statistics move on from where the first left them
        return [t.detach().numpy() for t in (x.grad, norm.weight.grad, norm.bias.grad,
                                             norm.running_mean, norm.running_var)]

    rng_weight = rng.uniform(0.5, 1.5, 3)
    expected = run(torch, False)
    for actual in (run(tr, False), run(tr, True)):
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


def test_a_traced_function_that_counts_its_calls_is_differentiable_and_counts_once():
    @tr.trace
    def counted(x, calls):
        with tr.no_grad():
            calls.add_(1)
        return x.sin() * 3

    x = tr.tensor([0.5, -1.0, 2.0], dtype=tr.float64, requires_grad=True)
    calls = tr.zeros(1)
    counted(x, calls).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.cos([0.5, -1.0, 2.0]), rtol=1e-14)
    assert calls.item() == 1.0  # the backward's run of the function changed it back


def test_a_compiled_dropout_in_training_differentiates_through_the_mask_of_its_own_call():
    """The counter of tracer's random generator is state the call advances: the backward of the
    first call's result, run after a second call, uses the first call's mask."""
    tr.manual_seed(5)
    model = tr.nn.Sequential(tr.nn.Linear(4, 6, dtype=tr.float64), tr.nn.Dropout(0.5))
    forward = tr.trace(model)
    x = tr.tensor(np.random.default_rng(5).standard_normal((8, 4)))
    first, second = forward(x), forward(x)
    assert first.requires_grad
    linear = (x @ model[0].weight.T + model[0].bias).detach().numpy()
    masks = [result.detach().numpy() / linear for result in (first, second)]
    assert not np.array_equal(masks[0], masks[1])  # each call draws its own
    np.testing.assert_allclose(np.unique(np.round(masks[0], 12)), [0.0, 2.0])
    weights = np.arange(48.0).reshape(8, 6)
    (first * tr.tensor(weights)).sum().backward()
    np.testing.assert_allclose(model[0].weight.grad.numpy(), (masks[0] * weights).T @ x.numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(model[0].bias.grad.numpy(), (masks[0] * weights).sum(0),
                               rtol=1e-12)
    third = forward(x).detach().numpy() / linear  # the backward left the generator as it was
    assert not np.array_equal(third, masks[0]) and not np.array_equal(third, masks[1])


def test_a_result_computed_from_data_the_call_overwrites_is_differentiated_on_the_old_data():
    torch = pytest.importorskip("torch")

    def shifted(m, x, w):
        y = (x + w) ** 2  # (pow saves x + w, which no one changes)
        with m.no_grad():
            w.add_(1)
        return y

    def run(m, function):
        x = m.tensor([1.0, 2.0], requires_grad=True)
        w = m.tensor([3.0, -4.0])
        function(x, w).sum().backward()
        return x.grad.numpy(), w.numpy()

    expected = run(torch, lambda x, w: shifted(torch, x, w))
    np.testing.assert_array_equal(expected[0], [8.0, -4.0])  # 2 (x + w) with w as it was
    for a, e in zip(run(tr, tr.trace(lambda x, w: shifted(tr, x, w))), expected):
        np.testing.assert_array_equal(a, e)


def test_a_backward_through_data_the_call_changed_after_reading_it_raises_as_pytorch():
    @tr.trace
    def scaled(x, w):
        y = x * w  # (mul saves w for the gradient of x, and the call changes w)
        with tr.no_grad():
            w.add_(1)
        return y

    x = tr.tensor([1.0, 2.0], requires_grad=True)
    w = tr.tensor([3.0, 4.0])
    y = scaled(x, w)
    with pytest.raises(tr.InplaceError, match="changed in place"):
        y.sum().backward()
    np.testing.assert_array_equal(w.numpy(), [4.0, 5.0])  # changed once, by the call
    assert x.grad is None


def test_a_result_computed_from_a_parameter_the_call_updates_is_detached():
    """PyTorch's backward through such a result raises (the parameter was changed in place)."""
    @tr.trace
    def updated(x, w):
        y = (x * w).sum()
        with tr.no_grad():
            w.sub_(0.5)
        return y

    x = tr.tensor([1.0, 2.0], requires_grad=True)
    w = tr.tensor([3.0, 4.0], requires_grad=True)
    assert not updated(x, w).requires_grad
    np.testing.assert_array_equal(w.detach().numpy(), [2.5, 3.5])


def test_two_calls_of_a_traced_batch_norm_in_training_then_one_backward_match_pytorch():
    """A siamese loss: the second call updates the statistics (and the count) the first read;
    its backward reads them as the first call found them, as PyTorch's (no InplaceError)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    first, second = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))

    def run(m, compiled):
        norm = m.nn.BatchNorm1d(3, dtype=m.float64)
        forward = tr.trace(norm) if compiled else norm
        x1, x2 = (m.tensor(a, requires_grad=True) for a in (first, second))
        (forward(x1).tanh() * forward(x2).tanh()).sum().backward()
        return [t.detach().numpy() for t in (x1.grad, x2.grad, norm.weight.grad,
                                                norm.running_mean, norm.num_batches_tracked)]

    for a, e in zip(run(tr, True), run(torch, False)):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


def test_a_written_argument_changed_between_the_call_and_the_backward_is_read_as_on_entry():
    torch = pytest.importorskip("torch")

    def shifted(m, x, w):
        y = (x + w) ** 2
        with m.no_grad():
            w.add_(1)
        return y

    def run(m, function, array):
        x = m.tensor([1.0, 2.0], dtype=m.float64, requires_grad=True)
        w = np.array([3.0, -4.0]) if array else m.tensor([3.0, -4.0], dtype=m.float64)
        y = function(x, w)
        w *= 10  # (in place, a tensor's or an array's)
        y.sum().backward()
        return x.grad.numpy(), np.asarray(w)

    expected = run(torch, lambda x, w: shifted(torch, x, w), False)
    np.testing.assert_array_equal(expected[0], [8.0, -4.0])
    traced = tr.trace(lambda x, w: shifted(tr, x, w))
    for array in (False, True):  # a numpy argument array the call writes too
        for a, e in zip(run(tr, traced, array), expected):
            np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("first", ["train", "eval"])
def test_a_backward_after_the_model_changed_mode_gives_the_gradient_of_the_call(first):
    """The backward runs on what the call's forward saved: after model.eval() (or .train()) it
    gives the gradient of the call, as PyTorch, which recorded the call (found by review when the
    backward ran the function again: tracer's weight gradient was [-45.7, 33.4, 23.0] where
    PyTorch's is [-0.47, -0.79, 5.96])."""
    torch = pytest.importorskip("torch")
    tr.manual_seed(0)
    model = tr.nn.Sequential(tr.nn.Linear(3, 3), tr.nn.BatchNorm1d(3))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    for m in (model, theirs):
        getattr(m, first)()
    y, y_theirs = tr.trace(model)(tr.tensor(x)), theirs(torch.tensor(x))
    for m in (model, theirs):
        m.train(first == "eval")
    (y ** 3).sum().backward()
    (y_theirs ** 3).sum().backward()
    for p, q in zip(model.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-5)


class _ScaledByAGlobal(tr.autograd.Function):
    """Its backward reads a tensor its forward does not: the compiled function cannot be split
    (runtime/split_code.py), so its backward runs it again."""
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * SCALE


SCALE = tr.tensor(3.0)


@pytest.mark.parametrize("first", ["train", "eval"])
def test_a_backward_that_runs_the_function_again_after_the_model_changed_mode_is_refused(first):
    """Run again after model.eval() (or .train()), the function would run other code and give
    another function's gradient."""
    tr.manual_seed(0)
    model = tr.nn.Sequential(tr.nn.Linear(3, 3), tr.nn.BatchNorm1d(3))
    getattr(model, first)()
    forward = tr.trace(lambda x: _ScaledByAGlobal.apply(model(x)))
    y = forward(tr.tensor(np.random.default_rng(0).standard_normal((5, 3)), dtype=tr.float32))
    assert list(forward._signatures.entries.values())[-1].split is None
    model.train(first == "eval")
    with pytest.raises(tr.FunctionBackwardError, match=r"training: .* call backward\(\) before"):
        (y ** 3).sum().backward()
    assert model[0].weight.grad is None


def test_weights_clipped_in_place_inside_the_forward_get_pytorchs_gradients():
    """A result computed from a tensor that requires grad only as the call changed it (weights
    clipped in place, then used) is differentiated as PyTorch's (found by review: tracer gave
    x.grad [1, -4] and w.grad None)."""
    torch = pytest.importorskip("torch")
    x_values, w_values = np.array([[1.0, -2.0], [0.5, 3.0]]), np.array([[0.5, -3.0], [2.0, 0.1]])

    def clipped(m, x, w):
        with m.no_grad():
            w.clamp_(-1, 1)
        return (x @ w).tanh()

    def run(m, function):
        x, w = m.tensor(x_values, requires_grad=True), m.tensor(w_values, requires_grad=True)
        (function(x, w) ** 2).sum().backward()
        return x.grad.numpy(), w.grad.numpy(), w.detach().numpy()

    expected = run(torch, lambda x, w: clipped(torch, x, w))
    for actual in (run(tr, lambda x, w: clipped(tr, x, w)),
                   run(tr, tr.trace(lambda x, w: clipped(tr, x, w)))):
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-13, atol=1e-15)
