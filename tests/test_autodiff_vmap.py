"""`tr.vmap` as a batching transform, against torch.func.vmap, eagerly and inside `@tr.trace`:
in_dims/out_dims, operations of every kind, per-sample gradients of an MLP, vmap of vmap, vmap
inside a traced training step, a graph that does not grow with the batch, and the functions that
run once per element instead (with the reason logged)."""
import logging

import numpy as np
import pytest
import torch
import torch.func as tf

import tracer as tr

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
MODES = pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64])
RANDOM = np.random.default_rng(11)


def _tolerance(dtype):
    return {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}


def _leaves(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    return [value.detach().numpy()]


def _tree(value, make):
    if isinstance(value, (tuple, list)):
        return type(value)(_tree(item, make) for item in value)
    if isinstance(value, dict):
        return {key: _tree(item, make) for key, item in value.items()}
    return make(value)


def compare(make, traced, arguments, dtype, **options):
    """make(lib) for lib in (tr, torch.func) applied to `arguments` (arrays, in lists, tuples or
    dicts): the same arrays, and no fallback to the per-element loop (unless `loops`)."""
    arguments = _tree(arguments, lambda a: a.astype(dtype) if a.dtype.kind == "f" else a)
    ours = make(tr)
    if traced:
        ours = tr.trace(ours)
    with _vmap_log() as fallbacks:
        result = ours(*_tree(arguments, tr.tensor))
    assert bool(fallbacks) == options.get("loops", False), fallbacks
    expected = make(tf)(*_tree(arguments, torch.tensor))
    ours_leaves, theirs = _leaves(result), _leaves(expected)
    assert len(ours_leaves) == len(theirs)
    for a, b in zip(ours_leaves, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, **_tolerance(dtype))
    return result


class _vmap_log:
    """The messages of vmap's fallback to the per-element loop."""

    def __enter__(self):
        self.messages = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        self.logger = logging.getLogger("tracer.vmap")
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        return self.messages

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


def _lib_ops(lib):
    """The library's names for what the functions below call."""
    return (tr if lib is tr else torch)


@MODES
@DTYPES
def test_in_dims_and_out_dims(traced, dtype):
    a, b = RANDOM.standard_normal((4, 3)), RANDOM.standard_normal((4, 5))
    # nonzero, negative and None in_dims; out_dims per output, negative too
    compare(lambda lib: lib.vmap(lambda x, y, z: (x * y[:, 0], (x @ y).sum(0), z.exp()),
                                 in_dims=(1, None, -1), out_dims=(0, -1, 1)),
            traced, (a, b, RANDOM.standard_normal((2, 3))), dtype)
    # nested tuples and dicts as in_dims; a dict result and an output that is no function of
    # the mapped argument (broadcast along the batch)
    compare(lambda lib: lib.vmap(
        lambda p, pair: {"u": p["w"] @ pair[0] + pair[1], "v": p["w"].sum() * 2},
        in_dims=({"w": None}, (1, 0))), traced,
        ({"w": b.T}, (a, RANDOM.standard_normal((3, 5)))), dtype)


@MODES
@DTYPES
def test_operations_of_every_kind_through_vmap(traced, dtype):
    def body(lib):
        ops = _lib_ops(lib)

        def f(x, index, w):
            y = ops.where(x > 0, x.sin(), x.cos() * 2) - x.abs().sqrt() + x.tanh().exp().log()
            z = ops.maximum(y, x.pow(2)) / (1 + x * x) + ops.minimum(y, x * 0.5) + x % 0.7
            rows = z.t()[1:4:2]                              # transpose, strided slice
            picked = z[index] + x[index, :].sign()           # gather by an index tensor
            counts = ops.zeros(5, dtype=x.dtype).index_add(0, index.abs(), picked.sum(1))  # scatter
            padded = torch.nn.functional.pad(z, (1, 2)) if lib is not tr else \
                tr.nn.functional.pad(z, (1, 2))
            wide = z.reshape(-1).unsqueeze(0).expand(2, -1)  # reshape, broadcast
            return (rows.sum(), picked.amax(1), counts, padded.amin(0), wide @ w,
                    (z > 0.1).to(x.dtype).mean(), ops.arange(3).to(x.dtype) * z[0, 0])
        return f

    x = RANDOM.standard_normal((6, 3, 4))
    index = RANDOM.integers(-3, 3, size=(6, 2))
    w = RANDOM.standard_normal((12, 3))
    compare(lambda lib: lib.vmap(body(lib), in_dims=(0, 0, None)), traced, (x, index, w), dtype)
    compare(lambda lib: lib.vmap(body(lib), in_dims=(2, None, None)), traced,
            (RANDOM.standard_normal((3, 4, 5)), index[0], w), dtype)


def _mlp_loss(lib):
    def loss(params, x, y):
        hidden = (x @ params["w1"] + params["b1"]).tanh()
        logits = hidden @ params["w2"] + params["b2"]
        if lib is tr:
            return tr.nn.functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))
        return torch.nn.functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))
    return loss


def _mlp_arguments(batch, features=6, hidden=8, classes=4):
    params = {"w1": RANDOM.standard_normal((features, hidden)) * 0.5,
              "b1": RANDOM.standard_normal(hidden) * 0.1,
              "w2": RANDOM.standard_normal((hidden, classes)) * 0.5,
              "b2": RANDOM.standard_normal(classes) * 0.1}
    return (params, RANDOM.standard_normal((batch, features)),
            RANDOM.integers(0, classes, size=batch))


@MODES
@DTYPES
def test_per_sample_gradients_of_an_mlp(traced, dtype):
    per_sample = compare(lambda lib: lib.vmap(lib.grad(_mlp_loss(lib)), in_dims=(None, 0, 0)),
                         traced, _mlp_arguments(7), dtype)
    assert per_sample["w1"].shape == (7, 6, 8)


@MODES
def test_gradient_through_vmap_and_vmap_of_vmap(traced):
    dtype = np.float64
    # the gradient of a mean of vmapped losses: the outer autograd differentiates the batched graph
    compare(lambda lib: lib.grad(lambda params, x, y: lib.vmap(
        _mlp_loss(lib), in_dims=(None, 0, 0))(params, x, y).mean()), traced, _mlp_arguments(5),
        dtype)
    # vmap of vmap, with the inner one mapping a different argument
    compare(lambda lib: lib.vmap(lib.vmap(lambda x, y: (x * y).sum() + x.max(), in_dims=(0, None)),
                                 in_dims=(None, 1)), traced,
            (RANDOM.standard_normal((3, 4)), RANDOM.standard_normal((4, 5))), dtype)
    # per-sample Hessian diagonals: vmap of a second-order gradient
    compare(lambda lib: lib.vmap(lib.grad(lambda x: (lib.grad(lambda x: (x.sin() * x).sum())(x)
                                                     ).sum())), traced,
            (RANDOM.standard_normal((4, 3)),), dtype)


def test_the_traced_graph_does_not_grow_with_the_batch():
    loss = _mlp_loss(tr)

    def step(params, x, y):
        return tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))(params, x, y)

    counts = {}
    for batch in (8, 64):
        params, x, y = _tree(_mlp_arguments(batch), tr.tensor)
        text = tr.trace(step).ir(params, x, y, stage="optimized")
        counts[batch] = sum(1 for line in text.splitlines() if " = " in line)
    assert counts[8] == counts[64] > 0


def test_vmap_inside_a_traced_training_step():
    params, x, y = _mlp_arguments(16)
    ours = {k: tr.tensor(v, requires_grad=True) for k, v in params.items()}
    theirs = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    optimizer = tr.optim.SGD(list(ours.values()), lr=0.1)
    reference = torch.optim.SGD(list(theirs.values()), lr=0.1)

    @tr.trace
    def step(x, y):
        optimizer.zero_grad()
        # per-sample gradient norms (a clipping statistic) and the mean loss, both batched
        grads = tr.vmap(tr.grad(_mlp_loss(tr)), in_dims=(None, 0, 0))(
            {k: v.detach() for k, v in ours.items()}, x, y)
        norms = sum(g.pow(2).sum(tuple(range(1, g.ndim))) for g in grads.values()).sqrt()
        loss = tr.vmap(_mlp_loss(tr), in_dims=(None, 0, 0))(ours, x, y).mean()
        loss.backward()
        optimizer.step()
        return loss, norms

    for _ in range(3):
        with _vmap_log() as fallbacks:
            loss, norms = step(tr.tensor(x), tr.tensor(y))
        assert not fallbacks
        reference.zero_grad()
        grads = tf.vmap(tf.grad(_mlp_loss(tf)), in_dims=(None, 0, 0))(
            {k: v.detach() for k, v in theirs.items()}, torch.tensor(x), torch.tensor(y))
        expected_norms = sum(g.pow(2).sum(tuple(range(1, g.ndim))) for g in grads.values()).sqrt()
        expected = tf.vmap(_mlp_loss(tf), in_dims=(None, 0, 0))(
            theirs, torch.tensor(x), torch.tensor(y)).mean()
        expected.backward()
        reference.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
        np.testing.assert_allclose(norms.numpy(), expected_norms.detach().numpy(), rtol=1e-12)
        for key in ours:
            np.testing.assert_allclose(ours[key].detach().numpy(), theirs[key].detach().numpy(),
                                       rtol=1e-12, atol=1e-14)


def _branchy(x):
    return x * 2 if x.sum().item() > 0 else -x


@DTYPES
def test_what_cannot_be_batched_runs_once_per_element_and_says_why(dtype):
    x = RANDOM.standard_normal((5, 3)).astype(dtype)
    # Python that needs the values (eagerly; under @tr.trace tracing refuses it as before)
    with _vmap_log() as fallbacks:
        result = tr.vmap(_branchy)(tr.tensor(x))
    assert len(fallbacks) == 1 and "runs once per element" in fallbacks[0]
    expected = np.stack([row * 2 if row.sum() > 0 else -row for row in x])
    np.testing.assert_array_equal(result.numpy(), expected)
    # an in-place change of a tensor from outside: each element sees the ones before it
    total = tr.zeros(3, dtype=x.dtype)
    with _vmap_log() as fallbacks:
        result = tr.vmap(lambda row: total.add_(row) * 1)(tr.tensor(x))
    assert len(fallbacks) == 1 and "in place" in fallbacks[0]
    np.testing.assert_allclose(result.numpy(), np.cumsum(x, axis=0), **_tolerance(dtype))
    np.testing.assert_allclose(total.numpy(), x.sum(axis=0), **_tolerance(dtype))


@MODES
def test_a_custom_function_batches_unless_differentiated_outside(traced):
    class Cube(tr.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x + 1  # deliberately not the true derivative: it must be used

    x = RANDOM.standard_normal((5, 4))
    inner = tr.vmap(tr.grad(lambda x: Cube.apply(x).sum()))
    outer = tr.grad(lambda x: tr.vmap(lambda row: Cube.apply(row).sum())(x).sum())
    for function, loops in ((inner, False), (outer, True)):
        compiled = tr.trace(function) if traced else function
        with _vmap_log() as fallbacks:
            result = compiled(tr.tensor(x))
        assert bool(fallbacks) == loops
        if loops:
            assert "custom Function" in fallbacks[0]
        np.testing.assert_allclose(result.numpy(), 3 * x * x + 1, rtol=1e-12)


def test_eager_backward_through_vmap_reaches_a_modules_parameters():
    x = RANDOM.standard_normal((5, 3)).astype(np.float32)
    ours, theirs = tr.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(ours.weight.detach().numpy()))
        theirs.bias.copy_(torch.tensor(ours.bias.detach().numpy()))

    def per_row(model):
        def f(row):
            with (tr.no_grad() if model is ours else torch.no_grad()):
                scale = model(row).sum()  # (a constant to the gradient)
            return model(row).tanh().sum() * scale
        return f

    with _vmap_log() as fallbacks:
        tr.vmap(per_row(ours))(tr.tensor(x)).pow(2).sum().backward()
    assert not fallbacks
    tf.vmap(per_row(theirs))(torch.tensor(x)).pow(2).sum().backward()
    for a, b in ((ours.weight, theirs.weight), (ours.bias, theirs.bias)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=2e-5, atol=1e-6)


def test_batched_instructions_keep_the_mapped_functions_lines():
    def f(row):
        return row.sin() * 2  # the line the batched instructions name

    line = f"test_autodiff_vmap.py:{f.__code__.co_firstlineno + 1}"
    text = tr.trace(lambda x: tr.vmap(f)(x)).ir(tr.tensor(RANDOM.standard_normal((4, 3))))
    body = [text_line for text_line in text.splitlines() if " = " in text_line]
    assert body and all(text_line.endswith(line) for text_line in body), text


@MODES
def test_assignments_into_the_functions_own_tensors_sorting_and_argmax(traced):
    # (torch.func.vmap refuses `z[i] = row[:2]` with z unbatched: PyTorch's loop is the oracle)
    def body(lib):
        def f(row, index):
            y = row.clone()
            y[0] = 5.0
            y[index] = row[index] * 3
            y[1:3] = y[1:3] + 1
            z = lib.zeros(4, dtype=row.dtype)
            z[index] = row[:2]
            return y, z, row.sort()[0], row.argmax(), row.softmax(0)
        return f

    x, index = RANDOM.standard_normal((5, 4)), RANDOM.integers(0, 4, (5, 2))
    ours = tr.vmap(body(tr))
    with _vmap_log() as fallbacks:
        result = (tr.trace(ours) if traced else ours)(tr.tensor(x), tr.tensor(index))
    assert not fallbacks
    per_element = [body(torch)(torch.tensor(x[k]), torch.tensor(index[k])) for k in range(5)]
    for k, output in enumerate(result):
        expected = torch.stack([outputs[k] for outputs in per_element]).numpy()
        assert output.numpy().dtype == expected.dtype
        np.testing.assert_allclose(output.numpy(), expected, rtol=1e-12, atol=1e-15)


@MODES
def test_a_function_computing_in_numpy_runs_once_per_element(traced):
    """A host callback's numpy code is written for one element: vmap runs it per element (and
    says so), eagerly and under @tr.trace, with torch.func's values."""
    class NumpySquareCumsum(tr.Function):
        @staticmethod
        def forward(ctx, x):
            return tr.tensor(np.cumsum(x.numpy() ** 2))

        @staticmethod
        def backward(ctx, grad):
            raise AssertionError("not differentiated here")

    x = RANDOM.standard_normal((4, 5))
    mapped = tr.vmap(NumpySquareCumsum.apply)
    with _vmap_log() as fallbacks:
        result = (tr.trace(mapped) if traced else mapped)(tr.tensor(x))
    assert fallbacks and "runs once per element" in fallbacks[0]
    np.testing.assert_array_equal(result.numpy(), np.cumsum(x ** 2, axis=1))


@MODES
def test_gradient_through_vmap_of_sgn_batches(traced):
    # abs's gradient and Tensor.sgn carry PyTorch's sgn rule (a custom_vjp, F33); an outer gradient
    # through it under vmap ran once per element until the rule batched
    dtype = np.float64
    compare(lambda lib: lib.grad(lambda w, x: lib.vmap(lib.grad(
        lambda r: (r * w).abs().sum()))(x).pow(2).sum()), traced,
        (RANDOM.standard_normal(3), RANDOM.standard_normal((4, 3))), dtype)
    compare(lambda lib: lib.grad(lambda x: lib.vmap(lambda r: r.sgn() * r.exp())(x).sum()), traced,
            (RANDOM.standard_normal((4, 3)),), dtype)
