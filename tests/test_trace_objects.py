"""Parameters held in objects, closures and globals; methods; pytrees in tr.grad; int arguments
used as sizes. Every traced result is compared with eager mode (and the model with PyTorch), and
conftest checks every compiled call against the interpreter."""
import numpy as np
import pytest

import tracer as tr

RNG = np.random.default_rng(11)


class Linear:
    """A layer written with plain tensors held as attributes."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        self.weight = tr.tensor(weight, dtype=tr.float32, requires_grad=True)
        self.bias = tr.tensor(bias, dtype=tr.float32, requires_grad=True)

    def __call__(self, x):
        return x.mm(self.weight) + self.bias


class TwoLayers:
    def __init__(self, arrays, learning_rate=0.1):
        self.first = Linear(arrays[0], arrays[1])
        self.second = Linear(arrays[2], arrays[3])
        self.learning_rate = learning_rate

    def parameters(self):
        return [self.first.weight, self.first.bias, self.second.weight, self.second.bias]

    def forward(self, x):
        return self.second(self.first(x).tanh())

    def step(self, x, y):
        loss = ((self.forward(x) - y) ** 2).mean()
        loss.backward()
        with tr.no_grad():
            for parameter in self.parameters():
                parameter.sub_(self.learning_rate * parameter.grad)
        return loss

    traced_step = tr.trace(step)


def model_arrays():
    return [RNG.standard_normal((4, 8)) / 2, RNG.standard_normal(8) / 10,
            RNG.standard_normal((8, 3)) / 3, RNG.standard_normal(3) / 10]


def torch_training(arrays, x, y, steps, learning_rate=0.1):
    torch = pytest.importorskip("torch")
    parameters = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in arrays]
    inputs, targets = torch.tensor(x), torch.tensor(y)
    losses = []
    for _ in range(steps):
        hidden = (inputs @ parameters[0] + parameters[1]).tanh()
        loss = ((hidden @ parameters[2] + parameters[3] - targets) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for parameter in parameters:
                parameter -= learning_rate * parameter.grad
        losses.append(loss.item())
    return losses, parameters


def test_model_in_an_object_trains_as_eagerly_and_as_in_pytorch():
    arrays = model_arrays()
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    y = RNG.standard_normal((6, 3)).astype(np.float32)
    traced, eager = TwoLayers(arrays), TwoLayers(arrays)
    torch_losses, torch_parameters = torch_training(arrays, x, y, steps=3)
    for step in range(3):
        traced_loss = traced.traced_step(tr.tensor(x), tr.tensor(y))
        eager_loss = eager.step(tr.tensor(x), tr.tensor(y))
        np.testing.assert_allclose(traced_loss.item(), eager_loss.item(), rtol=1e-6)
        np.testing.assert_allclose(traced_loss.item(), torch_losses[step], rtol=1e-5)
    for mine, theirs, reference in zip(traced.parameters(), eager.parameters(), torch_parameters):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        # .grad accumulates over the steps, as eagerly and in PyTorch (no zero_grad here)
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine.grad.numpy(), reference.grad.numpy(), rtol=1e-5,
                                   atol=1e-6)
    # the first call had no .grad, the later ones do: two signatures
    assert TwoLayers.traced_step.cache_info().misses == 2


def test_rebinding_an_attribute_tensor_traces_again():
    model = TwoLayers(model_arrays())
    forward = tr.trace(model.forward)
    x = tr.tensor(RNG.standard_normal((2, 4)), dtype=tr.float32)
    forward(x)
    model.second.weight = tr.tensor(RNG.standard_normal((8, 3)), dtype=tr.float32,
                                       requires_grad=True)
    # (float32 products summed in another order: a few ulp)
    np.testing.assert_allclose(forward(x).detach().numpy(), model.forward(x).detach().numpy(),
                               rtol=1e-5)
    assert forward.cache_info().misses == 2
    model.first = Linear(*model_arrays()[:2])  # an object on the way to a tensor
    np.testing.assert_allclose(forward(x).detach().numpy(), model.forward(x).detach().numpy(),
                               rtol=1e-5)
    assert forward.cache_info().misses == 3
    model.first.bias = tr.tensor(np.zeros(5), dtype=tr.float32, requires_grad=True)  # a new shape
    with pytest.raises(tr.ShapeMismatchError):
        forward(x)


def test_attribute_tensor_changed_in_place_outside_is_read_on_every_call():
    model = TwoLayers(model_arrays())
    forward = tr.trace(model.forward)
    x = tr.tensor(RNG.standard_normal((2, 4)), dtype=tr.float32)
    forward(x)
    with tr.no_grad():
        model.second.bias.add_(1.0)
    np.testing.assert_allclose(forward(x).detach().numpy(), model.forward(x).detach().numpy(),
                               rtol=1e-5)
    assert forward.cache_info() == (1, 1, 1)


class Scaled:
    def __init__(self):
        self.weight = tr.tensor([1.0, -2.0, 3.0])
        self.scale = 0.5
        self.activation = "relu"

    def __call__(self, x):
        y = x * self.weight * self.scale
        return y.relu() if self.activation == "relu" else y.tanh()


def test_float_attributes_are_runtime_inputs_and_strings_are_baked_in_and_guarded():
    module = Scaled()
    traced = tr.trace(module)
    x = tr.tensor([1.0, 1.0, 1.0])
    np.testing.assert_array_equal(traced(x).numpy(), [0.5, 0.0, 1.5])
    module.scale = 2.0  # read on every call: no new trace
    np.testing.assert_array_equal(traced(x).numpy(), [2.0, 0.0, 6.0])
    assert traced.cache_info() == (1, 1, 1)
    module.activation = "tanh"
    np.testing.assert_allclose(traced(x).numpy(), np.tanh([2.0, -4.0, 6.0]), rtol=1e-6)
    assert traced.cache_info().misses == 2
    module.scale = 0.25
    np.testing.assert_allclose(traced(x).numpy(), np.tanh([0.25, -0.5, 0.75]), rtol=1e-6)
    assert traced.cache_info() == (2, 2, 1)


def test_number_attribute_changed_by_the_traced_function_is_never_stale():
    class Counter:
        def __init__(self):
            self.calls = 0

        @tr.trace
        def count(self, x):
            self.calls += 1
            return x * self.calls

    counter = Counter()
    results = [counter.count(tr.tensor([1.0])).item() for _ in range(3)]
    # the Python increment runs only while tracing: each call sees a new value and traces again
    assert results == [1.0, 2.0, 3.0] and counter.calls == 3
    assert Counter.count.cache_info().misses == 3


def test_method_decorated_in_the_class_body_gives_each_instance_its_parameters():
    first, second = TwoLayers(model_arrays()), TwoLayers(model_arrays())
    x = tr.tensor(RNG.standard_normal((5, 4)), dtype=tr.float32)
    y = tr.tensor(RNG.standard_normal((5, 3)), dtype=tr.float32)
    for model in (first, second):
        expected = ((model.forward(x) - y) ** 2).mean().item()
        # the instance is a static argument; the tensors it holds are inputs
        text = model.traced_step.ir(x, y)
        assert "%self_first_weight: f32[4,8], %self_first_bias: f32[8]" in text
        np.testing.assert_allclose(model.traced_step(x, y).item(), expected, rtol=1e-6)
    np.testing.assert_raises(AssertionError, np.testing.assert_array_equal,
                             first.first.weight.detach().numpy(),
                             second.first.weight.detach().numpy())


def test_traced_result_differentiates_into_attribute_parameters_eagerly():
    model = TwoLayers(model_arrays())
    x = tr.tensor(RNG.standard_normal((3, 4)), dtype=tr.float32)
    tr.trace(model.forward)(x).sum().backward()
    traced_grads = [p.grad.numpy().copy() for p in model.parameters()]
    for parameter in model.parameters():
        parameter.grad = None
    model.forward(x).sum().backward()
    for traced, eager in zip(traced_grads, model.parameters()):
        np.testing.assert_allclose(traced, eager.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_closure_parameters_with_zero_grad_and_update():
    weight = tr.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)
    state = {"weights": [weight], "momentum": tr.zeros(2, 2)}

    def step(x):
        for w in state["weights"]:
            w.grad = None  # as optimizer.zero_grad(set_to_none=True)
        loss = (x.mm(weight) ** 2).sum()
        loss.backward()
        with tr.no_grad():
            state["momentum"].mul_(0.9).add_(weight.grad)
            weight.sub_(0.01 * state["momentum"])
        return loss

    traced = tr.trace(step)
    eager_weight = tr.tensor(weight.detach().numpy(), requires_grad=True)
    eager_momentum = tr.zeros(2, 2)
    x = tr.tensor([[1.0, 2.0], [-1.0, 0.5]])
    for _ in range(3):
        loss = traced(x)
        eager_weight.grad = None
        eager_loss = (x.mm(eager_weight) ** 2).sum()
        eager_loss.backward()
        with tr.no_grad():
            eager_momentum.mul_(0.9).add_(eager_weight.grad)
            eager_weight.sub_(0.01 * eager_momentum)
        np.testing.assert_allclose(loss.item(), eager_loss.item(), rtol=1e-6)
    np.testing.assert_allclose(weight.detach().numpy(), eager_weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(weight.grad.numpy(), eager_weight.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(state["momentum"].numpy(), eager_momentum.numpy(), rtol=1e-6)
    # one compile: the step sets .grad to None before backward(), so the .grad it is called
    # with (none on the first call, the last step's after) is no part of its signature
    assert traced.cache_info().misses == 1


OFFSET = tr.tensor([1.0, 2.0])


def add_offset(x):
    return x + OFFSET


def test_globals_of_called_functions_are_inputs_and_guarded():
    global OFFSET
    traced = tr.trace(lambda x: add_offset(x) * 2)
    np.testing.assert_array_equal(traced(tr.zeros(2)).numpy(), [2.0, 4.0])
    saved = OFFSET
    try:
        OFFSET = tr.tensor([10.0, 20.0])
        np.testing.assert_array_equal(traced(tr.zeros(2)).numpy(), [20.0, 40.0])
        OFFSET.numpy()[0] = 5.0
        np.testing.assert_array_equal(traced(tr.zeros(2)).numpy(), [10.0, 40.0])
    finally:
        OFFSET = saved
    assert traced.cache_info().misses == 2


def test_failed_trace_leaves_captured_tensors_as_they_were():
    model = TwoLayers(model_arrays())
    gradient = tr.ones(8)
    model.first.bias.grad = gradient

    def broken(x):
        model.first.bias.grad.zero_()
        return model.forward(x).item()  # not possible while tracing

    before = model.first.bias.detach().numpy().copy()
    with pytest.raises(tr.TracingError):
        tr.trace(broken)(tr.ones(2, 4))
    assert model.first.bias.grad is gradient and model.first.bias.is_leaf
    np.testing.assert_array_equal(gradient.numpy(), np.ones(8, np.float32))
    np.testing.assert_array_equal(model.first.bias.detach().numpy(), before)
    np.testing.assert_allclose(model.forward(tr.ones(2, 4)).detach().numpy(),
                               np.tanh(np.ones((2, 4)) @ model_arrays_of(model)[0]
                                       + model_arrays_of(model)[1]) @ model_arrays_of(model)[2]
                               + model_arrays_of(model)[3], rtol=1e-5)


def model_arrays_of(model):
    return [p.detach().numpy().astype(np.float64) for p in model.parameters()]


# tr.grad over pytrees ---------------------------------------------------------------------------
def pytree_loss(parameters, x):
    hidden = (x.mm(parameters["layers"][0]["w"]) + parameters["layers"][0]["b"]).tanh()
    return ((hidden.mm(parameters["out"][0]) + parameters["out"][1]) ** 2).sum()


def test_grad_over_nested_dicts_and_lists_matches_pytorch():
    torch = pytest.importorskip("torch")
    arrays = [RNG.standard_normal(s) for s in ((3, 4), (4,), (4, 2), (2,))]
    x = RNG.standard_normal((5, 3))

    def tree(make):
        return {"layers": [{"w": make(arrays[0]), "b": make(arrays[1])}],
                "out": (make(arrays[2]), make(arrays[3]))}

    reference = tree(lambda a: torch.tensor(a, requires_grad=True))
    pytree_loss(reference, torch.tensor(x)).backward()
    expected = [reference["layers"][0]["w"], reference["layers"][0]["b"], *reference["out"]]
    for grad in (tr.grad(pytree_loss), tr.trace(tr.grad(pytree_loss))):
        gradients = grad(tree(tr.tensor), tr.tensor(x))
        assert isinstance(gradients["out"], tuple) and isinstance(gradients["layers"], list)
        got = [gradients["layers"][0]["w"], gradients["layers"][0]["b"], *gradients["out"]]
        for mine, theirs in zip(got, expected):
            np.testing.assert_allclose(mine.numpy(), theirs.grad.numpy(), rtol=1e-10)
    (value, aux), gradients = tr.value_and_grad(
        lambda p, x: (pytree_loss(p, x), 7), has_aux=True)(tree(tr.tensor), tr.tensor(x))
    np.testing.assert_allclose(value.item(), pytree_loss(reference, torch.tensor(x)).item(),
                               rtol=1e-12)
    assert aux == 7 and gradients["out"][1].shape == (2,)


# int arguments used as sizes, indices and loop bounds -------------------------------------------
def column(x, t):
    return x[:, t] * 2


def repeat(x, n):
    for _ in range(n):
        x = x * 2 + 1
    return x


def flatten_rows(x, rows):
    return x.reshape(rows, -1).sum(dim=0)


@pytest.mark.parametrize("function", [column, repeat, flatten_rows])
def test_int_argument_used_as_size_index_or_bound_is_specialized(function):
    x = tr.tensor(RNG.standard_normal((4, 6)), dtype=tr.float32)
    traced = tr.trace(function)
    for value in (2, 1, 2):
        np.testing.assert_allclose(traced(x, value).numpy(), function(x, value).numpy(),
                                   rtol=1e-6)
    assert traced.cache_info() == (1, 2, 2)  # one signature per value


def test_int_argument_used_only_in_arithmetic_stays_a_runtime_input():
    traced = tr.trace(lambda x, n, scale: x * n + scale)
    x = tr.tensor([1.0, 2.0])
    np.testing.assert_array_equal(traced(x, 2, 0.5).numpy(), [2.5, 4.5])
    np.testing.assert_array_equal(traced(x, 3, 1.5).numpy(), [4.5, 7.5])
    assert traced.cache_info().misses == 1


def branch(x, n):
    if n > 2:  # Python control flow on an int argument
        return x * 2
    return x * 3


def test_int_argument_in_python_control_flow_is_specialized():
    traced = tr.trace(branch)
    x = tr.tensor([1.0, 2.0])
    np.testing.assert_array_equal(traced(x, 3).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(traced(x, 1).numpy(), [3.0, 6.0])
    assert traced.cache_info().misses == 2


def test_float_argument_used_as_a_size_or_a_branch_names_it_and_static_argnums():
    with pytest.raises(tr.TracingError, match=r"float argument rows.*static_argnums"):
        tr.trace(flatten_rows)(tr.ones(4, 6), 2.0)
    with pytest.raises(tr.TracingError, match=r"float argument n.*static_argnums"):
        tr.trace(branch)(tr.ones(2), 2.5)
    np.testing.assert_array_equal(
        tr.trace(branch, static_argnums=1)(tr.ones(2), 2.5).numpy(), [2.0, 2.0])


def test_branch_on_a_tensor_value_is_still_an_error():
    with pytest.raises(tr.TracingError, match=r"tr.where"):
        tr.trace(lambda x, n: x * 2 if (x.sum() > n) else x)(tr.ones(2), 1)


# an optimizer object with state, stepped inside a traced step -----------------------------------
class MomentumSGD:
    """SGD with momentum as torch.optim.SGD computes it, its state made up front."""

    def __init__(self, parameters, lr, momentum):
        self.parameters = list(parameters)
        self.lr, self.momentum = lr, momentum
        self.state = [{"momentum_buffer": tr.zeros(*p.shape)} for p in self.parameters]

    def zero_grad(self):
        for parameter in self.parameters:
            parameter.grad = None

    def step(self):
        with tr.no_grad():
            for parameter, state in zip(self.parameters, self.state):
                buffer = state["momentum_buffer"]
                buffer.mul_(self.momentum).add_(parameter.grad)
                parameter.sub_(self.lr * buffer)


def test_optimizer_object_stepped_inside_a_traced_step_matches_pytorch():
    torch = pytest.importorskip("torch")
    arrays = model_arrays()
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    y = RNG.standard_normal((6, 3)).astype(np.float32)
    model = TwoLayers(arrays)
    optimizer = MomentumSGD(model.parameters(), lr=0.1, momentum=0.9)

    @tr.trace
    def train_step(x, y):
        optimizer.zero_grad()
        loss = ((model.forward(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss

    reference = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in arrays]
    torch_optimizer = torch.optim.SGD(reference, lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = train_step(tr.tensor(x), tr.tensor(y))
        torch_optimizer.zero_grad()
        hidden = (torch.tensor(x) @ reference[0] + reference[1]).tanh()
        torch_loss = ((hidden @ reference[2] + reference[3] - torch.tensor(y)) ** 2).mean()
        torch_loss.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
    for mine, theirs in zip(model.parameters(), reference):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
    for state, parameter in zip(optimizer.state, reference):
        np.testing.assert_allclose(state["momentum_buffer"].numpy(),
                                   torch_optimizer.state[parameter]["momentum_buffer"].numpy(),
                                   rtol=1e-5, atol=1e-6)
    assert train_step.cache_info().misses == 1  # zero_grad() first: any .grad on entry
    optimizer.lr = 0.01  # a float the compiled step reads on every call
    before = model.first.weight.detach().numpy().copy()
    train_step(tr.tensor(x), tr.tensor(y))
    assert train_step.cache_info().misses == 1
    buffer = optimizer.state[0]["momentum_buffer"].numpy()
    np.testing.assert_allclose(model.first.weight.detach().numpy(), before - 0.01 * buffer,
                               rtol=1e-5, atol=1e-7)


def test_state_made_while_tracing_and_kept_in_an_object_is_an_error():
    weight = tr.tensor([1.0, 2.0], requires_grad=True)
    state = {}

    def step(x):
        loss = (weight * x).sum()
        loss.backward()
        with tr.no_grad():
            if "buffer" not in state:
                state["buffer"] = weight.grad.clone()  # lazily, as PyTorch's optimizers do
            weight.sub_(0.1 * state["buffer"])
        return loss

    with pytest.raises(tr.TracingError, match=r"closure variable state\['buffer'\].*in place"):
        tr.trace(step)(tr.ones(2))
    np.testing.assert_array_equal(weight.detach().numpy(), [1.0, 2.0])
    assert weight.grad is None


def test_recompile_reasons_name_the_path(caplog):
    module = Scaled()
    traced = tr.trace(module)
    with caplog.at_level("INFO", logger="tracer.trace"):
        traced(tr.ones(3))
        module.scale = 3.0
        traced(tr.ones(3))
        module.activation = "tanh"
        traced(tr.ones(3))
        module.weight.requires_grad_()
        traced(tr.ones(3))
    reasons = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert reasons == ["Scaled: compiling (first call)",
                       "Scaled: compiling (self.activation: 'relu' -> 'tanh')",
                       "Scaled: compiling (requires_grad of self.weight: False -> True)"]


GLOBAL_MODULE = Scaled()


def test_object_reached_through_a_global_of_a_called_function():
    def apply_module(x):
        return GLOBAL_MODULE(x)

    traced = tr.trace(lambda x: apply_module(x) + 1)
    x = tr.tensor([1.0, 1.0, 1.0])
    saved = GLOBAL_MODULE.weight
    try:
        np.testing.assert_array_equal(traced(x).numpy(), [1.5, 1.0, 2.5])
        GLOBAL_MODULE.weight = tr.tensor([2.0, 2.0, 2.0])
        np.testing.assert_array_equal(traced(x).numpy(), [2.0, 2.0, 2.0])
        assert traced.cache_info().misses == 2
    finally:
        GLOBAL_MODULE.weight = saved


def test_gradient_accumulation_keeps_both_grad_states_of_captured_parameters():
    # .grad is None on every fourth call and present on the others: two signatures, kept both
    model = TwoLayers(model_arrays())
    x = tr.tensor(RNG.standard_normal((3, 4)), dtype=tr.float32)
    accumulate = tr.trace(lambda x: model.forward(x).pow(2).mean().backward())
    eager = TwoLayers(model_arrays())
    for parameter, source in zip(eager.parameters(), model.parameters()):
        parameter.detach().copy_(source.detach())
    for call in range(8):
        if call % 4 == 0:
            for parameter in (*model.parameters(), *eager.parameters()):
                parameter.grad = None
        accumulate(x)
        eager.forward(x).pow(2).mean().backward()
    for mine, theirs in zip(model.parameters(), eager.parameters()):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert accumulate.cache_info().misses == 2 and accumulate.cache_info().size == 2


def test_a_container_childs_training_flag_changed_after_compiling_traces_again():
    """A Sequential's forward reaches its children by iterating, naming no '1': its guards once
    skipped the children's flags, so `model[1].eval()` after the first call left the compiled
    dropout on, without a word (PyTorch's eval output is 2 everywhere)."""
    model = tr.nn.Sequential(tr.nn.Linear(2, 2), tr.nn.Dropout(0.9))
    with tr.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.fill_(0.0)
    forward = tr.trace(lambda x: model(x))
    trained = forward(tr.ones(100, 2)).detach().numpy()
    assert set(np.unique(trained)) <= {0.0, 20.0} and (trained == 0).any()
    model[1].eval()
    evaluated = forward(tr.ones(100, 2))
    np.testing.assert_array_equal(evaluated.detach().numpy(), np.full((100, 2), 2.0))
    assert evaluated.requires_grad and forward.cache_info().misses == 2
