"""A compiled function's backward runs on what its forward saved (AOTAutograd's scheme,
ir/partition.py, runtime/split_code.py): a grad-enabled call runs a forward that also returns its
residuals, and the backward reads them instead of running the function again (the first
backward compiles it). Checked against PyTorch over several steps."""
import numpy as np
import pytest

import tracer as tr
from tracer.ir.interpreter import interpret as run_function
from tracer.ir.partition import split
from tracer import ir

torch = pytest.importorskip("torch")


def _entry(traced):
    return list(traced._signatures.entries.values())[-1]


def _pair(build, seed=0):
    """The same model in tracer and torch (torch's built by `build(torch)`, weights copied)."""
    tr.manual_seed(seed)
    ours = build(tr)
    theirs = build(torch).double()
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    return ours, theirs


MODELS = {
    "mlp": lambda m: m.nn.Sequential(m.nn.Linear(6, 12, dtype=m.float64), m.nn.GELU(),
                                     m.nn.Linear(12, 5, dtype=m.float64), m.nn.Tanh()),
    "layer norm": lambda m: m.nn.Sequential(m.nn.Linear(6, 8, dtype=m.float64),
                                            m.nn.LayerNorm(8, dtype=m.float64), m.nn.Sigmoid(),
                                            m.nn.Linear(8, 3, dtype=m.float64)),
    "softmax attention": lambda m: m.nn.MultiheadAttention(6, 2, batch_first=True,
                                                           dtype=m.float64),
    "batch norm": lambda m: m.nn.Sequential(m.nn.Linear(6, 4, dtype=m.float64),
                                            m.nn.BatchNorm1d(4, dtype=m.float64), m.nn.ReLU()),
}


def _call(model, x, name):
    if name == "softmax attention":
        return model(x, x, x, need_weights=False)[0]
    return model(x)


@pytest.mark.parametrize("name", MODELS)
def test_steps_of_a_compiled_model_give_pytorchs_gradients(name):
    ours, theirs = _pair(MODELS[name])
    compiled = tr.trace(ours)
    rng = np.random.default_rng(1)
    shape = (4, 3, 6) if name == "softmax attention" else (5, 6)
    for step in range(4):
        x_values, weights = rng.standard_normal(shape), rng.standard_normal()
        x = tr.tensor(x_values, requires_grad=True)
        x_theirs = torch.tensor(x_values, requires_grad=True)
        y = _call(compiled, x, name)
        y_theirs = _call(theirs, x_theirs, name)
        np.testing.assert_allclose(y.detach().numpy(), y_theirs.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
        ((y * weights) ** 2).sum().backward()
        ((y_theirs * weights) ** 2).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), x_theirs.grad.numpy(), rtol=1e-9, atol=1e-11)
        for (label, p), q in zip(ours.named_parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-11,
                                       err_msg=f"step {step}: {label}")
        for b, c in zip(ours.buffers(), theirs.buffers()):
            np.testing.assert_allclose(b.numpy(), c.numpy(), rtol=1e-12)
    assert _entry(compiled).split, "the later steps ran the split forward and backward"


def test_two_calls_then_one_backward_each_read_their_own_residuals():
    ours, theirs = _pair(MODELS["mlp"])
    compiled = tr.trace(ours)
    rng = np.random.default_rng(2)
    compiled(tr.tensor(rng.standard_normal((5, 6)))).sum().backward()  # (compiles the backward)
    ours.zero_grad()
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    loss = compiled(tr.tensor(a)).pow(2).sum() + 3 * compiled(tr.tensor(b)).sin().sum()
    torch_loss = theirs(torch.tensor(a)).pow(2).sum() + 3 * theirs(torch.tensor(b)).sin().sum()
    loss.backward()
    torch_loss.backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_custom_functions_own_backward_is_the_one_split_out():
    """A straight-through estimator: its backward is not the derivative of its forward."""
    class StraightThrough(tr.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.round()

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    @tr.trace
    def quantized(x, w):
        return StraightThrough.apply(x * w).sum(1)

    w = tr.tensor([0.5, 1.5, -2.0], dtype=tr.float64, requires_grad=True)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal((4, 3))
        quantized(tr.tensor(x), w).pow(2).sum().backward()
        rounded = np.round(x * w.detach().numpy()).sum(1)
        np.testing.assert_allclose(w.grad.numpy(), (2 * rounded[:, None] * 2 * x).sum(0),
                                   rtol=1e-12)
        w.grad = None
    assert _entry(quantized).split


def test_a_dropout_mask_is_saved_not_drawn_again():
    """The backward of the second call (after a third call advanced the generator) uses the
    second call's mask: the gradient is zero exactly where that call's result is."""
    tr.manual_seed(7)
    model = tr.nn.Sequential(tr.nn.Linear(4, 6, dtype=tr.float64), tr.nn.Dropout(0.5))
    compiled = tr.trace(model)
    x = tr.tensor(np.random.default_rng(7).standard_normal((8, 4)))
    compiled(x).sum().backward()  # (compiles the backward)
    model.zero_grad()
    second = compiled(x)
    compiled(x)
    linear = (x @ model[0].weight.T + model[0].bias).detach().numpy()
    mask = second.detach().numpy() / linear
    np.testing.assert_allclose(np.unique(np.round(mask, 12)), [0.0, 2.0])
    second.sum().backward()
    np.testing.assert_allclose(model[0].weight.grad.numpy(), mask.T @ x.numpy(), rtol=1e-12)


@pytest.mark.parametrize("activation", ["exp", "tanh"])
def test_a_result_the_backward_reads_changed_in_place_is_an_error_as_in_pytorch(activation):
    """exp's and tanh's backwards read their result: PyTorch refuses a backward after it
    changed."""
    @tr.trace
    def layer(x, w):
        return getattr(x @ w, activation)()

    w = tr.randn(3, 2, dtype=tr.float64, requires_grad=True)
    layer(tr.randn(4, 3, dtype=tr.float64), w).sum().backward()
    y = layer(tr.randn(4, 3, dtype=tr.float64), w)
    assert _entry(layer).split.saved_results == [0]
    with tr.no_grad():
        y.mul_(2)
    with pytest.raises(tr.InplaceError, match="test_split_backward.py"):
        y.sum().backward()
    theirs = torch.randn(4, 3, dtype=torch.float64) @ torch.randn(3, 2, requires_grad=True,
                                                                     dtype=torch.float64)
    theirs = getattr(theirs, activation)()
    with torch.no_grad():
        theirs.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        theirs.sum().backward()


# A value of the function that its backward reads (a result of exp, tanh, sigmoid, softmax or
# sqrt, an operand of a product), changed in place further on inside the function, by an in-place
# operation, a masked assignment that matches nothing or a write to one element
CHANGED_INSIDE = {
    "exp add_": lambda x: x.exp().add_(1),
    "tanh masked": lambda x: _masked(x.tanh()),
    "sigmoid mul_": lambda x: x.sigmoid().mul_(2),
    "softmax masked": lambda x: _masked(x.softmax(0)),
    "sqrt element": lambda x: _element(x.abs().sqrt()),
    "operand of a product": lambda x: (lambda y: (y * y.sum(), y.add_(1))[0])(x * 3),
    "detach alias of a changed value": lambda x: _aliased(x),
}


def _aliased(x):
    h = x * 2
    product = x * h.detach()  # (mul reads the alias, which shares h's version, as in PyTorch)
    h.add_(1)
    return product


def _masked(y):
    y[y < -10] = 0.0  # (no element matches: still an in-place change, as in PyTorch)
    return y


def _element(y):
    y[0] = 2.0
    return y


@pytest.mark.parametrize("name", CHANGED_INSIDE)
def test_a_value_the_backward_reads_changed_inside_the_function_is_an_error_at_backward(name):
    """PyTorch's backward through the result raises (its saved tensor was modified by an in-place
    operation), as eager tracer's and a backward inside the traced function do; the call itself
    raises nothing. (The split backward read the values as computed and raised nothing.)"""
    function = CHANGED_INSIDE[name]
    for library, error in ((tr, tr.InplaceError), (torch, RuntimeError)):
        x = library.linspace(0.1, 0.9, 3, dtype=library.float64).requires_grad_()
        result = function(x)
        with pytest.raises(error):
            result.sum().backward()
    traced = tr.trace(function)
    x = tr.linspace(0.1, 0.9, 3, dtype=tr.float64).requires_grad_()
    result = traced(x)
    np.testing.assert_allclose(result.detach().numpy(), function(x.detach()).numpy(), rtol=1e-15)
    with pytest.raises(tr.InplaceError, match="test_split_backward.py"):
        result.sum().backward()

    @tr.trace
    def with_backward_inside(x):
        function(x).sum().backward()
        return x.grad

    with pytest.raises(tr.InplaceError, match="test_split_backward.py"):
        with_backward_inside(tr.linspace(0.1, 0.9, 3, dtype=tr.float64).requires_grad_())


def test_a_result_changed_in_place_that_the_backward_does_not_read_keeps_its_gradient():
    @tr.trace
    def layer(x, w):
        return x @ w + 1

    w = tr.randn(3, 2, dtype=tr.float64, requires_grad=True)
    layer(tr.randn(4, 3, dtype=tr.float64), w).pow(2).sum().backward()
    w.grad = None
    x = tr.randn(4, 3, dtype=tr.float64)
    y = layer(x, w)
    with tr.no_grad():
        y.mul_(2)
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ np.ones((4, 2)), rtol=1e-12)


def test_a_numpy_argument_changed_after_the_call_is_read_as_at_the_call():
    @tr.trace
    def layer(x, w):
        return (x @ w).sin()

    w = tr.tensor(np.eye(3)[:, :2] + 0.5, requires_grad=True)
    rng = np.random.default_rng(4)
    layer(rng.standard_normal((4, 3)), w).sum().backward()
    w.grad = None
    x = rng.standard_normal((4, 3))
    expected = x.T @ np.cos(x @ w.detach().numpy())
    y = layer(x, w)
    x[:] = 0
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)


def _sine_layer_split():
    """A traced layer whose first backward has compiled its split backward, and its
    arguments."""
    @tr.trace
    def layer(x, w):
        return (x @ w).sin()

    w = tr.randn(3, 2, dtype=tr.float64, requires_grad=True)
    x = tr.randn(4, 3, dtype=tr.float64)
    layer(x, w).sum().backward()
    return layer, x, w


def test_no_grad_calls_run_the_forward_alone():
    layer, x, w = _sine_layer_split()
    # (the split forward also returns x @ w, which cos reads)
    assert len(_entry(layer).executable.function.outputs) == 2
    with tr.no_grad():
        y = layer(x, w)
    assert not y.requires_grad
    np.testing.assert_allclose(y.numpy(), np.sin(x.numpy() @ w.detach().numpy()), rtol=1e-14)
    assert _entry(layer).split is None
    assert len(_entry(layer).executable.function.outputs) == 1


def test_the_split_programs_compute_what_the_whole_backward_computes():
    """ir/partition.py on a traced graph, by the reference interpreter: the forward's outputs are
    the function's, and the backward on its residuals gives float64 central differences."""
    @tr.trace
    def function(x, w):
        h = (x @ w).tanh()
        return (h * h.sigmoid()).sum(1), h.max(1).values

    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    tx, tw = tr.tensor(x), tr.tensor(w, requires_grad=True)
    function(tx, tw)
    entry = _entry(function)
    grad_stage = ir.parse_function(function.ir(tx, tw, stage="grad"))
    optimized = ir.parse_function(function.ir(tx, tw, stage="optimized"))
    parts = split(grad_stage, entry.differentiable, [("parameter", 1)], ir.optimize,
                  shared=entry.result_count)
    forward = run_function(parts.forward, [x, w])
    expected = run_function(optimized, [x, w])
    for a, e in zip(forward, expected):
        np.testing.assert_array_equal(a, e)
    cotangents = [rng.standard_normal(forward[i].shape) for i in entry.differentiable]
    arguments = [cotangents[i] if kind == "cotangent" else forward[i] if kind == "output"
                 else [x, w][i] for kind, i in parts.sources]
    gradient = run_function(parts.backward, arguments)[parts.gradients[0]]

    def loss(weights):
        outputs = run_function(optimized, [x, weights])
        return sum((outputs[i] * c).sum() for i, c in zip(entry.differentiable, cotangents))

    numeric = np.zeros_like(w)
    for index in np.ndindex(w.shape):
        step = np.zeros_like(w)
        step[index] = 1e-6
        numeric[index] = (loss(w + step) - loss(w - step)) / 2e-6
    np.testing.assert_allclose(gradient, numeric, rtol=1e-6, atol=1e-8)
    assert all(kind != "cotangent" for kind, _ in parts.sources[len(cotangents):])
    assert not {id(p) for p in parts.forward.parameters} & {
        id(v) for i in parts.backward.instructions for v in i.inputs}


def test_a_calls_tape_node_and_saved_values_are_freed_without_the_cycle_collector():
    """The node holds the rule that holds what the backward reads (the forward's residuals): if
    the rule held the results, whose node it is, they would stay until the collector ran, and
    every call would allocate its outputs afresh."""
    import gc
    import weakref

    layer, x, w = _sine_layer_split()
    gc.disable()
    try:
        y = layer(x, w)
        node = weakref.ref(y._node)
        del y
        assert node() is None
    finally:
        gc.enable()


def test_a_custom_backward_reading_a_tensor_the_forward_did_not_runs_the_function_again():
    """Its backward cannot be a program of its own (the tensor is no input of the forward): the
    signature is not split, and the backward runs the function again, reading the tensor then."""
    scale = tr.tensor(3.0, dtype=tr.float64)

    class Scaled(tr.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, grad):
            return grad * scale

    @tr.trace
    def layer(x, w):
        return Scaled.apply(x @ w).sin()

    x, w = tr.randn(4, 3, dtype=tr.float64), tr.randn(3, 2, dtype=tr.float64, requires_grad=True)
    for _ in range(2):
        layer(x, w).sum().backward()
        expected = 3.0 * x.numpy().T @ np.cos(x.numpy() @ w.detach().numpy())
        np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)
        w.grad = None
    assert _entry(layer).split is None
    assert not scale.requires_grad and scale._trace is None  # (left as it was)


def test_a_function_on_the_host_is_differentiated_with_the_ctx_of_its_own_call():
    """A host Function's backward reads the ctx its forward's run filled, which lives in Python
    until the next run: two calls then the first call's backward, or a backward in another
    thread, must still see the first call's ctx (d/dx sum(x**2) = 2x)."""
    import threading

    class HostSquare(tr.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.values = x.numpy().copy()  # (reads values: the forward runs on the host)
            return tr.tensor(ctx.values ** 2)

        @staticmethod
        def backward(ctx, grad):
            return grad * tr.tensor(2 * ctx.values)

    @tr.trace
    def squares(x):
        return HostSquare.apply(x * 1.0).sum(1)

    rng = np.random.default_rng(9)
    for _ in range(2):
        a, b = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
        first, second = tr.tensor(a, requires_grad=True), tr.tensor(b, requires_grad=True)
        y = squares(first)
        squares(second)
        y.sum().backward()
        np.testing.assert_allclose(first.grad.numpy(), 2 * a, rtol=1e-15)
    y = squares(second)
    thread = threading.Thread(target=lambda: y.sum().backward())
    thread.start()
    thread.join()
    np.testing.assert_allclose(second.grad.numpy(), 2 * b, rtol=1e-15)


def test_gradient_hooks_registered_inside_the_function_change_its_gradients_as_in_pytorch():
    """The trace keeps a hook by the traced value it watches; the split differentiates a copy of
    the graph, where no hook would run: such a function keeps the backward that runs it again."""
    def layer(x, w):
        w.register_hook(lambda grad: grad * 5)
        hidden = x @ w
        hidden.register_hook(lambda grad: grad * 3)
        return hidden.tanh()

    compiled = tr.trace(layer)
    rng = np.random.default_rng(10)
    for _ in range(2):
        x_values, w_values = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
        x, w = tr.tensor(x_values, requires_grad=True), tr.tensor(w_values, requires_grad=True)
        theirs_x = torch.tensor(x_values, requires_grad=True)
        theirs_w = torch.tensor(w_values, requires_grad=True)
        compiled(x, w).pow(2).sum().backward()
        layer(theirs_x, theirs_w).pow(2).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), theirs_x.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), theirs_w.grad.numpy(), rtol=1e-12)


def test_a_tensor_the_backward_reads_changed_in_place_first_is_an_error_as_in_pytorch():
    """What the split backward reads of the call's tensors, it reads as they are then: changing
    one before it is PyTorch's error, also a tensor the function reads from outside that
    requires no grad (a frozen scale); changing one it does not read (the added bias) is no
    error in either."""
    rng = np.random.default_rng(11)
    x_values, scale_values = rng.standard_normal((4, 3)), rng.standard_normal(3)
    scale = tr.tensor(scale_values)
    compiled = tr.trace(lambda x, bias: (x * scale).sin() + bias)
    for _ in range(2):
        x = tr.tensor(x_values, requires_grad=True)
        bias = tr.zeros(3, dtype=tr.float64, requires_grad=True)
        y = compiled(x, bias)
        with tr.no_grad():
            scale.mul_(2)
        with pytest.raises(tr.InplaceError, match="test_split_backward.py"):
            y.sum().backward()
    theirs_x, theirs_scale = torch.tensor(x_values, requires_grad=True), torch.tensor(scale_values)
    theirs = (theirs_x * theirs_scale).sin()
    with torch.no_grad():
        theirs_scale.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        theirs.sum().backward()
    y = compiled(x, bias)
    with tr.no_grad():
        bias.add_(1)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(x_values * 4 * scale_values) * 4 *
                               scale_values, rtol=1e-12)
    np.testing.assert_allclose(bias.grad.numpy(), [4.0, 4.0, 4.0], rtol=1e-15)


def test_an_out_of_range_index_nothing_reads_raises_at_the_call_as_eagerly():
    """The split forward computes what the results need; an index check whose result nothing
    reads is still the function's: it raises at the call (as PyTorch's x[i]), not at backward."""
    @tr.trace
    def function(x, index):
        x[index]  # (read only to be checked)
        return x.sin()

    x = tr.tensor([0.0, 1.0, 2.0, 3.0], dtype=tr.float64, requires_grad=True)
    function(x, tr.tensor([1, 2])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos([0.0, 1.0, 2.0, 3.0]), rtol=1e-15)
    assert _entry(function).split
    with pytest.raises(tr.IndexOutOfRangeError, match="out of bounds"):
        function(x, tr.tensor([1, 7]))
    with pytest.raises(IndexError, match="out of bounds"):
        torch.arange(4.0)[torch.tensor([1, 7])]


def test_a_function_whose_forward_takes_a_gradient_that_its_backward_reads_is_differentiated():
    """The Function's forward saves d/dz sum(z sin z), taken by tr.autograd.grad: the autodiff
    pass replaced that value, so its backward cannot be cut from the traced one (it crashed the
    call): it runs the function again, and gives PyTorch's gradient."""
    def make(module):
        class InnerGradient(module.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                with module.enable_grad():
                    z = x.detach().requires_grad_(True)
                    energy = (z.sin() * z).sum()
                    gradient, = module.autograd.grad(energy, [z])
                ctx.save_for_backward(gradient)
                return energy.detach()

            @staticmethod
            def backward(ctx, grad):
                gradient, = ctx.saved_tensors
                return grad * gradient
        return InnerGradient

    ours, theirs = make(tr), make(torch)
    compiled = tr.trace(lambda x: ours.apply(x * 2).exp())
    for values in np.random.default_rng(12).standard_normal((2, 3)):
        x, theirs_x = tr.tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
        compiled(x).backward()
        theirs.apply(theirs_x * 2).exp().backward()
        np.testing.assert_allclose(x.grad.numpy(), theirs_x.grad.numpy(), rtol=1e-12)


def test_a_calls_tape_node_keeps_only_the_forward_outputs_its_backward_reads():
    """A result the user dropped, that the backward does not read (here one computed from x
    alone), is freed: four calls waiting for their backward hold less than two of them."""
    import tracemalloc

    w = tr.randn(64, 64, dtype=tr.float64, requires_grad=True)

    @tr.trace
    def function(x):
        return (x @ w).sum(), x * 2 + 1

    x = tr.randn(4096, 64, dtype=tr.float64)
    function(x)[0].backward()
    size = 4096 * 64 * 8
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pending = [function(x)[0] for _ in range(4)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * size, f"{held / size:.1f} dropped results held"
    sum(pending).backward()
    np.testing.assert_allclose(w.grad.numpy(), 5 * x.numpy().sum(0)[:, None] * np.ones((1, 64)),
                               rtol=1e-12)


def test_a_custom_backward_that_raises_raises_at_backward_not_at_the_call():
    """A Function written for inference only: PyTorch runs its forward and raises at
    backward(); the split traces that backward at the first call, which must not fail."""
    class InferenceOnly(tr.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("inference only")

    compiled = tr.trace(lambda x: InferenceOnly.apply(x).sin())
    x = tr.tensor([0.5, 1.0], dtype=tr.float64, requires_grad=True)
    y = compiled(x)
    np.testing.assert_allclose(y.detach().numpy(), np.sin([1.0, 2.0]), rtol=1e-15)
    with pytest.raises(NotImplementedError, match="inference only"):
        y.sum().backward()


def test_a_tensor_read_from_outside_changed_before_a_backward_that_runs_the_function_again():
    """A function that keeps the replay (here: it registers a hook) reads its captured tensors
    again at backward: one that requires no grad, changed in place first, silently gave the
    gradient of its new value; it is PyTorch's error, as for a saved tensor."""
    scale = tr.tensor([1.0, 2.0, 3.0], dtype=tr.float64)

    @tr.trace
    def function(x):
        scaled = x * scale
        scaled.register_hook(lambda grad: grad * 2)
        return scaled.sin()

    x = tr.tensor([0.5, -1.0, 2.0], dtype=tr.float64, requires_grad=True)
    y = function(x)
    with tr.no_grad():
        scale.mul_(2)
    with pytest.raises(tr.InplaceError, match="test_split_backward.py"):
        y.sum().backward()
    y = function(x)
    y.sum().backward()
    values, factors = np.array([0.5, -1.0, 2.0]), np.array([2.0, 4.0, 6.0])
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.cos(values * factors) * factors, rtol=1e-14)
    assert _entry(function).split is None


def _two_heads(m):
    class TwoHeads(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = m.nn.Linear(4, 6, dtype=m.float64)
            self.first = m.nn.Linear(6, 3, dtype=m.float64)
            self.second = m.nn.Linear(6, 2, dtype=m.float64)

        def forward(self, x, hooked=False):
            hidden = self.body(x).tanh()
            if hooked:  # (a function with a hook keeps the backward that runs it again)
                hidden.register_hook(lambda grad: grad * 2)
            return {"first": self.first(hidden), "second": self.second(hidden)}
    return TwoHeads()


@pytest.mark.parametrize("hooked", [False, True])
def test_parameters_only_an_unused_result_reads_keep_no_gradient_as_in_pytorch(hooked):
    """A loss of one head of a two-headed compiled model: PyTorch never runs the other head's
    nodes, so its parameters' .grad stay None and SGD's momentum and weight decay leave them as
    they are; the compiled backward gave them zeros (its cotangent), and the optimizer moved them
    (measured: 0.004 after one step, 0.02 after three)."""
    ours, theirs = _pair(_two_heads)
    compiled = tr.trace(ours)
    ours_optimizer = tr.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    theirs_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9,
                                       weight_decay=0.1)
    rng = np.random.default_rng(12)
    for step in range(3):
        x_values = rng.standard_normal((5, 4))
        ours_optimizer.zero_grad()
        theirs_optimizer.zero_grad()
        compiled(tr.tensor(x_values), hooked)["first"].pow(2).sum().backward()
        theirs(torch.tensor(x_values), hooked)["first"].pow(2).sum().backward()
        for (label, p), q in zip(ours.named_parameters(), theirs.parameters()):
            assert (p.grad is None) == (q.grad is None), f"step {step}: {label}"
            if q.grad is not None:
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12)
        ours_optimizer.step()
        theirs_optimizer.step()
        for (label, p), q in zip(ours.named_parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12,
                                       err_msg=f"step {step}: {label}")
    assert (_entry(compiled).split is None) == hooked


def _convolution_with_batch_norm(m):
    class Network(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.convolution = m.nn.Conv2d(2, 3, 3, dtype=m.float64)
            self.norm = m.nn.BatchNorm2d(3, dtype=m.float64)
            self.head = m.nn.Linear(12, 2, dtype=m.float64)

        def forward(self, x):
            return self.head(self.norm(self.convolution(x)).relu().flatten(1))
    return Network()


def test_a_batch_norm_submodule_frozen_with_eval_between_steps_matches_pytorch():
    """The fine-tuning idiom `for m in model.modules(): if isinstance(m, BatchNorm2d): m.eval()`
    on a model of the user's own class: the submodule's `training` (self.norm.training) was not
    guarded (its path runs through `_modules`), so the compiled model kept normalizing with the
    batch's statistics and updating the running ones (measured on a Dropout submodule: 1.25 off
    eager's output)."""
    ours, theirs = _pair(_convolution_with_batch_norm)
    compiled = tr.trace(ours)
    ours_optimizer = tr.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    theirs_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(13)
    for step in range(4):
        if step == 2:
            for model, kind in ((ours, tr.nn.BatchNorm2d), (theirs, torch.nn.BatchNorm2d)):
                for module in model.modules():
                    if isinstance(module, kind):
                        module.eval()
        x_values = rng.standard_normal((3, 2, 4, 4))
        ours_optimizer.zero_grad()
        theirs_optimizer.zero_grad()
        ours_loss = compiled(tr.tensor(x_values)).pow(2).mean()
        theirs_loss = theirs(torch.tensor(x_values)).pow(2).mean()
        np.testing.assert_allclose(ours_loss.item(), theirs_loss.item(), rtol=1e-12)
        ours_loss.backward()
        theirs_loss.backward()
        ours_optimizer.step()
        theirs_optimizer.step()
        for (label, p), q in zip(ours.state_dict().items(), theirs.state_dict().values()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-11, atol=1e-13,
                                       err_msg=f"step {step}: {label}")


def test_a_tensor_only_detached_or_compared_in_the_used_result_keeps_no_gradient():
    """The used result reads w only through w.detach() and w > 0, the unused one through w * 3:
    PyTorch never reaches w from the used result, so w.grad stays None (it was zeros: the
    dependence went through the detach and the comparison)."""
    def function(m):
        def body(x, w):
            return x * 2 + w.detach() + (w > 0).to(x.dtype), w * 3
        return body

    compiled = tr.trace(function(tr))
    for _ in range(2):
        x, w = (tr.tensor([1.0, 2.0], dtype=tr.float64, requires_grad=True),
                tr.tensor([0.5, -1.0], dtype=tr.float64, requires_grad=True))
        theirs_x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
        theirs_w = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
        compiled(x, w)[0].sum().backward()
        function(torch)(theirs_x, theirs_w)[0].sum().backward()
        assert w.grad is None and theirs_w.grad is None
        np.testing.assert_array_equal(x.grad.numpy(), theirs_x.grad.numpy())
