"""tr.nn.MultiheadAttention (tracer/nn/multihead.py) against torch.nn.MultiheadAttention with the
same state_dict: outputs, attention weights and the gradients of the inputs and of every
parameter, float64 and float32, eager and traced, over its options (self- and cross-attention,
kdim/vdim, batch_first, unbatched inputs, bool and float key padding and attention masks of 2 and
3 dimensions, need_weights, average_attn_weights, is_causal, add_zero_attn, bias=False); its
parameter names, shapes and initialization; a traced training step that compiles once; errors."""
import math

import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import _limits, assert_trained_like_torch, key_biases

rng = np.random.default_rng(7)


def assert_close(actual, expected, what=""):
    """torch_oracle's tolerances: float64 1e-10; float32's absolute part relative to the largest
    magnitude of the expected values (the gradient of the key bias, 0 exactly, is rounding)."""
    np.testing.assert_allclose(actual, expected, **_limits(expected, None), err_msg=what)


def paired(dtype=np.float64, **options):
    """The module in torch (its parameters moved away from the zero biases) and in tracer with
    torch's state_dict."""
    embed_dim, num_heads = options.pop("embed_dim", 8), options.pop("num_heads", 2)
    theirs = torch.nn.MultiheadAttention(embed_dim, num_heads, **options).to(
        torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.copy_(torch.tensor(rng.standard_normal(tuple(parameter.shape)) * 0.5))
    ours = tr.nn.MultiheadAttention(embed_dim, num_heads, **options).to(np.dtype(dtype).name)
    ours.load_state_dict({k: tr.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    return ours, theirs


def _library_tensor(library, array, requires_grad=False):
    if array is None:
        return None
    return library.tensor(array, requires_grad=requires_grad and array.dtype.kind == "f")


def run_both(ours, theirs, arrays, masks, options, traced=False, dtype=np.float64):
    """Forward and backward of both modules on the same inputs; compares outputs, weights and
    the gradients of the inputs and of the parameters. `arrays`: query, key, value (the same
    array object stands for the same tensor); `masks`: key_padding_mask, attn_mask."""
    tensors = {}
    for library in (tr, torch):
        made = {}
        inputs = [made.setdefault(id(a), _library_tensor(library, a, True)) for a in arrays]
        key_padding_mask, attn_mask = (_library_tensor(library, m) for m in masks)
        tensors[library] = inputs, key_padding_mask, attn_mask

    def forward(module, inputs, key_padding_mask, attn_mask):
        return module(*inputs, key_padding_mask=key_padding_mask, attn_mask=attn_mask, **options)

    ours_run = tr.trace(lambda *a: forward(ours, *a)) if traced else (
        lambda *a: forward(ours, *a))
    mine, reference = ours_run(*tensors[tr]), forward(theirs, *tensors[torch])
    weights = rng.standard_normal(tuple(reference[0].shape)).astype(dtype)
    assert_close(mine[0].detach().numpy(), reference[0].detach().numpy())
    if reference[1] is None:
        assert mine[1] is None
    else:
        assert_close(mine[1].detach().numpy(), reference[1].detach().numpy())
    (mine[0] * tr.tensor(weights)).sum().backward()
    (reference[0] * torch.tensor(weights)).sum().backward()
    for index, (a, b) in enumerate(zip(tensors[tr][0], tensors[torch][0])):
        assert_close(a.grad.numpy(), b.grad.numpy(), f"gradient of input {index}")
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert_close(a.grad.numpy(), b.grad.numpy(), name)
    return mine


def sequences(length, batch, features, batch_first=False):
    shape = (batch, length, features) if batch_first else (length, batch, features)
    return rng.standard_normal(shape if batch else (length, features))


PADDING = np.array([[False, False, True, False, True, False],
                    [False, False, False, False, False, True],
                    [True, False, False, False, False, False]])
CAUSAL = np.triu(np.ones((5, 5), dtype=bool), 1)  # True: may not attend (PyTorch's convention)
FLOAT_MASK = np.where(rng.random((5, 6)) < 0.3, -np.inf, rng.standard_normal((5, 6)))
FLOAT_MASK[:, 0] = 0.5  # every query keeps a key

SELF = sequences(5, 3, 8)
CASES = {
    # name: (module options, (query, key, value), (key_padding_mask, attn_mask), forward options)
    "self-attention": ({}, (SELF, SELF, SELF), (None, None), {}),
    "self-attention, weights per head": ({}, (SELF, SELF, SELF), (None, None),
                                         dict(average_attn_weights=False)),
    "self-attention, no weights": ({}, (SELF, SELF, SELF), (None, None),
                                   dict(need_weights=False)),
    "cross-attention": ({}, (sequences(5, 3, 8), sequences(6, 3, 8), sequences(6, 3, 8)),
                        (PADDING, FLOAT_MASK), {}),
    "kdim and vdim": (dict(kdim=5, vdim=3), (sequences(5, 3, 8), sequences(6, 3, 5),
                                             sequences(6, 3, 3)), (PADDING, None), {}),
    "kdim and vdim, no weights": (dict(kdim=5, vdim=3), (
        sequences(5, 3, 8), sequences(6, 3, 5), sequences(6, 3, 3)), (PADDING, FLOAT_MASK),
        dict(need_weights=False)),
    "batch_first": (dict(batch_first=True), (sequences(5, 3, 8, True),) * 3, (None, CAUSAL), {}),
    "batch_first, key is value": (
        dict(batch_first=True), (sequences(5, 3, 8, True),) + (sequences(6, 3, 8, True),) * 2,
        (PADDING, None), dict(need_weights=False)),
    "unbatched": ({}, (sequences(5, 0, 8), sequences(6, 0, 8), sequences(6, 0, 8)),
                  (PADDING[0], FLOAT_MASK), {}),
    "unbatched, 3-d mask, no weights": (
        {}, (sequences(5, 0, 8),) * 3, (None, rng.standard_normal((2, 5, 5))),
        dict(need_weights=False)),
    "float key padding mask": ({}, (SELF, SELF, SELF), (np.where(PADDING[:, :5], -1e9, 0.25),
                                                        None), {}),
    "3-d float mask": ({}, (SELF, SELF, SELF), (None, rng.standard_normal((6, 5, 5))),
                       dict(average_attn_weights=False)),
    "3-d bool mask, no weights": ({}, (SELF, SELF, SELF), (None, np.broadcast_to(
        CAUSAL, (6, 5, 5)).copy()), dict(need_weights=False)),
    "causal hint": ({}, (SELF, SELF, SELF), (None, CAUSAL),
                    dict(need_weights=False, is_causal=True)),
    "causal hint with weights": ({}, (SELF, SELF, SELF), (None, CAUSAL), dict(is_causal=True)),
    "causal hint with padding": ({}, (SELF, SELF, SELF), (PADDING[:, :5], CAUSAL),
                                 dict(need_weights=False, is_causal=True)),
    "add_zero_attn": (dict(add_zero_attn=True), (SELF, SELF, SELF), (PADDING[:, :5], CAUSAL), {}),
    "add_zero_attn, no weights": (dict(add_zero_attn=True), (SELF, SELF, SELF),
                                  (PADDING[:, :5], None), dict(need_weights=False)),
    "no bias": (dict(bias=False), (SELF, SELF, SELF), (None, None), {}),
    "four heads of 3": (dict(embed_dim=12, num_heads=4), (sequences(4, 2, 12),) * 3,
                        (None, None), {}),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch_float64(name, traced):
    module_options, arrays, masks, options = CASES[name]
    ours, theirs = paired(**module_options)
    ours.eval(), theirs.eval()
    run_both(ours, theirs, arrays, masks, options, traced)


@pytest.mark.parametrize("name", ["cross-attention", "self-attention, no weights",
                                  "kdim and vdim, no weights", "batch_first"])
def test_matches_torch_float32_in_train_mode_without_dropout(name):
    module_options, arrays, masks, options = CASES[name]
    ours, theirs = paired(np.float32, **module_options)
    run_both(ours, theirs, [a.astype(np.float32) for a in arrays],
             [m if m is None or m.dtype == bool else m.astype(np.float32) for m in masks],
             options, traced=True, dtype=np.float32)


def test_a_query_with_no_key_gives_nan_weights_or_zeros_as_torch():
    """Every key padded for one sequence: with the weights, softmax over -inf alone gives nan
    (as PyTorch's); without them, scaled_dot_product_attention's zeros (PyTorch's kernel too)."""
    padding = PADDING[:, :5].copy()
    padding[1] = True
    ours, theirs = paired()
    ours.eval(), theirs.eval()
    for options in ({}, dict(need_weights=False)):
        mine = ours(*(tr.tensor(SELF),) * 3, key_padding_mask=tr.tensor(padding), **options)
        reference = theirs(*(torch.tensor(SELF),) * 3, key_padding_mask=torch.tensor(padding),
                           **options)
        np.testing.assert_allclose(mine[0].detach().numpy(), reference[0].detach().numpy(),
                                   rtol=1e-10, atol=1e-12)
        assert np.isnan(mine[0].detach().numpy()[:, 1]).all() == bool(options == {})


def test_dropout_acts_in_training_only():
    ours = tr.nn.MultiheadAttention(8, 2, dropout=0.5)
    x = tr.tensor(SELF.astype(np.float32))
    ours.eval()
    first, second = ours(x, x, x)[1], ours(x, x, x)[1]
    np.testing.assert_array_equal(first.detach().numpy(), second.detach().numpy())
    ours.train()
    weights = ours(x, x, x, average_attn_weights=False)[1].detach().numpy()
    # dropped weights are 0, the others scaled by 2: rows no longer sum to 1
    assert (weights == 0).mean() > 0.3 and not np.allclose(weights.sum(-1), 1.0)


@pytest.mark.parametrize("options", [{}, dict(kdim=5, vdim=3), dict(bias=False)])
def test_parameters_named_shaped_and_initialized_as_torch(options):
    tr.manual_seed(0)
    ours, theirs = tr.nn.MultiheadAttention(16, 4, **options), torch.nn.MultiheadAttention(
        16, 4, **options)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    for key, value in reference.items():
        assert mine[key].shape == tuple(value.shape) and mine[key].dtype == np.float32, key
    assert repr(ours) == repr(theirs)
    for name, value in mine.items():
        values = value.numpy()
        if name.endswith("bias"):
            assert not values.any(), name  # zero biases, also the output projection's
            continue
        fan_out, fan_in = values.shape
        # xavier_uniform_ for the input projections (the packed one: fan_out 3 * 16);
        # Linear's uniform in +-1/sqrt(fan_in) for the output projection
        bound = (1 / math.sqrt(fan_in) if name.startswith("out_proj")
                 else math.sqrt(6 / (fan_in + fan_out)))
        assert np.abs(values).max() <= bound, name
        assert abs(values.std() - bound / math.sqrt(3)) < 0.2 * bound / math.sqrt(3), name


def test_traced_training_step_compiles_once_and_follows_torch():
    ours, theirs = paired(batch_first=True)
    head, reference_head = tr.nn.Linear(8, 3).double(), torch.nn.Linear(8, 3).double()
    head.load_state_dict({k: tr.tensor(v.detach().numpy())
                          for k, v in reference_head.state_dict().items()})
    parameters = [*ours.parameters(), *head.parameters()]
    optimizer = tr.optim.Adam(parameters, lr=0.01)
    reference_optimizer = torch.optim.Adam([*theirs.parameters(), *reference_head.parameters()],
                                           lr=0.01)

    @tr.trace
    def step(x, padding, labels):
        optimizer.zero_grad()
        attended, _ = ours(x, x, x, key_padding_mask=padding, need_weights=False)
        loss = tr.nn.functional.cross_entropy(head(attended.mean(1)), labels)
        loss.backward()
        optimizer.step()
        return loss

    generator = np.random.default_rng(2)
    padding = PADDING[:, :5]
    before = key_biases(ours)
    for _ in range(4):
        x, labels = generator.standard_normal((3, 5, 8)), generator.integers(0, 3, 3)
        loss = step(tr.tensor(x), tr.tensor(padding), tr.tensor(labels))
        reference_optimizer.zero_grad()
        attended, _ = theirs(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(padding),
                             need_weights=False)
        expected = torch.nn.functional.cross_entropy(reference_head(attended.mean(1)),
                                                     torch.tensor(labels))
        expected.backward()
        reference_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-10)
    assert_trained_like_torch(ours, theirs, before, steps=4, lr=0.01)
    assert step.cache_info() == (3, 1, 1)


@pytest.mark.parametrize("call, message", [
    (lambda m, x: tr.nn.MultiheadAttention(8, 2, add_bias_kv=True), "add_bias_kv=True"),
    (lambda m, x: tr.nn.MultiheadAttention(8, 3), "divisible by num_heads"),
    (lambda m, x: m(x, x, x, attn_mask=None, is_causal=True), "needs it"),
    (lambda m, x: m(x, x, x, attn_mask=tr.ones(4, 5, dtype=tr.bool)), "2-D attn_mask"),
    (lambda m, x: m(x, x, x, attn_mask=tr.ones(2, 5, 5, dtype=tr.bool)), "3-D attn_mask"),
    (lambda m, x: m(x, x, x, attn_mask=tr.ones(5, 5, dtype=tr.int64)), "bool and floating"),
    (lambda m, x: m(x, x, x, key_padding_mask=tr.ones(3, 4, dtype=tr.bool)), "key_padding_mask"),
    (lambda m, x: m(x[0, 0], x[0, 0], x[0, 0]), "unbatched 2D or batched 3D"),
    (lambda m, x: m(x, x[0], x[0]), "key and value should be 3-D"),
    (lambda m, x: m(x[..., :4], x, x), "embed_dim is 8"),
])
def test_errors(call, message):
    with pytest.raises(tr.TracerError, match=message):
        call(tr.nn.MultiheadAttention(8, 2), tr.tensor(SELF.astype(np.float32)))
