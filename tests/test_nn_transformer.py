"""tr.nn's TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder and Transformer (tracer/nn/transformer.py) against torch.nn's with the same
state_dict: outputs and the gradients of the inputs and of every parameter, float64 and float32,
eager and traced, over their options (norm_first, activation 'relu', 'gelu' or a callable,
batch_first, bias=False, masks and key padding masks, is_causal); state_dict keys; the layer
copies; a traced training step in train mode (dropout 0) that compiles once; errors."""
import math

import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import _limits, assert_trained_like_torch, key_biases

rng = np.random.default_rng(13)


def paired(name, *args, dtype=np.float64, **kwargs):
    """torch's module `name` (its parameters drawn anew, LayerNorms' too) and tracer's with
    torch's state_dict; a `make(lib)` in kwargs["make"] builds them instead."""
    make = kwargs.pop("make", None) or (lambda lib: getattr(lib.nn, name)(*args, **kwargs))
    theirs = make(torch).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.copy_(torch.tensor(rng.standard_normal(tuple(parameter.shape)) * 0.4))
    ours = make(tr).to(np.dtype(dtype).name)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tr.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    return ours, theirs


def assert_close(actual, expected, what=""):
    np.testing.assert_allclose(actual, expected, **_limits(expected, None), err_msg=what)


def run_both(ours, theirs, arrays, masks, options=None, traced=False):
    """Forward (arrays, then the masks by keyword) and backward of both; compares the outputs
    and the gradients of the float inputs and of the parameters."""
    options = options or {}
    tensors = {library: ([library.tensor(a, requires_grad=True) for a in arrays],
                         {k: None if m is None else library.tensor(m) for k, m in masks.items()})
               for library in (tr, torch)}

    def forward(*inputs, **masks):
        return ours(*inputs, **masks, **options)

    mine = (tr.trace(forward) if traced else forward)(*tensors[tr][0], **tensors[tr][1])
    reference = theirs(*tensors[torch][0], **tensors[torch][1], **options)
    assert_close(mine.detach().numpy(), reference.detach().numpy(), "output")
    weights = rng.standard_normal(tuple(reference.shape)).astype(arrays[0].dtype)
    (mine * tr.tensor(weights)).sum().backward()
    (reference * torch.tensor(weights)).sum().backward()
    for index, (a, b) in enumerate(zip(tensors[tr][0], tensors[torch][0])):
        assert_close(a.grad.numpy(), b.grad.numpy(), f"gradient of input {index}")
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert_close(a.grad.numpy(), b.grad.numpy(), name)


def sequence(length, batch=3, features=8, batch_first=False):
    return rng.standard_normal((batch, length, features) if batch_first else
                               (length, batch, features))


PADDING = np.array([[False, False, True, False, True],
                    [False, False, False, False, False],
                    [True, False, False, False, False]])
CAUSAL = np.triu(np.ones((5, 5), dtype=bool), 1)
FLOAT_CAUSAL = np.where(CAUSAL, -np.inf, 0.0)

ENCODER_LAYERS = {
    "post-norm, relu": ({}, {}, {}),
    "norm_first, gelu": (dict(norm_first=True, activation="gelu"), {}, {}),
    "batch_first, no bias": (dict(batch_first=True, bias=False), {}, {}),
    "padding": ({}, dict(src_key_padding_mask=PADDING), {}),
    "bool mask and padding": ({}, dict(src_mask=CAUSAL, src_key_padding_mask=PADDING), {}),
    "float causal mask, hint": ({}, dict(src_mask=FLOAT_CAUSAL), dict(is_causal=True)),
    "layer_norm_eps": (dict(layer_norm_eps=0.1), dict(src_mask=FLOAT_CAUSAL), {}),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(ENCODER_LAYERS))
def test_encoder_layer_matches_torch(name, traced):
    kwargs, masks, options = ENCODER_LAYERS[name]
    ours, theirs = paired("TransformerEncoderLayer", 8, 2, 16, **kwargs)
    ours.eval(), theirs.eval()
    run_both(ours, theirs, [sequence(5, batch_first=kwargs.get("batch_first", False))], masks,
             options, traced)


def test_encoder_layer_with_a_callable_activation():
    ours, theirs = paired("", make=lambda lib: lib.nn.TransformerEncoderLayer(
        8, 2, 16, activation=lib.nn.functional.silu))
    ours.eval(), theirs.eval()
    run_both(ours, theirs, [sequence(5)], {})
    ours, theirs = paired("", make=lambda lib: lib.nn.TransformerEncoderLayer(
        8, 2, 16, activation=lib.nn.GELU(approximate="tanh")))
    ours.eval(), theirs.eval()
    run_both(ours, theirs, [sequence(5)], {})


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("norm", [False, True], ids=["no norm", "final norm"])
def test_encoder_matches_torch_in_train_mode_without_dropout(norm, traced):
    def make(lib):
        layer = lib.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return lib.nn.TransformerEncoder(layer, 3, lib.nn.LayerNorm(8) if norm else None,
                                         enable_nested_tensor=False)
    ours, theirs = paired("", make=make)
    run_both(ours, theirs, [sequence(5, batch_first=True)],
             dict(mask=FLOAT_CAUSAL, src_key_padding_mask=PADDING), traced=traced)


def test_encoder_float32():
    def make(lib):
        layer = lib.nn.TransformerEncoderLayer(8, 2, 16, norm_first=True)
        return lib.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    ours, theirs = paired("", make=make, dtype=np.float32)
    ours.eval(), theirs.eval()
    run_both(ours, theirs, [sequence(5).astype(np.float32)], dict(mask=CAUSAL),
             dict(is_causal=True), traced=True)


DECODER_LAYERS = {
    "post-norm": ({}, {}),
    "norm_first, gelu, batch_first": (dict(norm_first=True, activation="gelu",
                                           batch_first=True), {}),
    "masks": ({}, dict(tgt_mask=CAUSAL[:4, :4], memory_mask=np.zeros((4, 5)),
                       tgt_key_padding_mask=PADDING[:, :4], memory_key_padding_mask=PADDING)),
    "causal hint": ({}, dict(tgt_mask=FLOAT_CAUSAL[:4, :4])),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(DECODER_LAYERS))
def test_decoder_layer_and_decoder_match_torch(name, traced):
    kwargs, masks = DECODER_LAYERS[name]
    batch_first = kwargs.get("batch_first", False)
    arrays = [sequence(4, batch_first=batch_first), sequence(5, batch_first=batch_first)]
    options = dict(tgt_is_causal=True) if name == "causal hint" else {}
    ours, theirs = paired("TransformerDecoderLayer", 8, 2, 16, **kwargs)
    ours.eval(), theirs.eval()
    run_both(ours, theirs, arrays, masks, options, traced)
    ours, theirs = paired("", make=lambda lib: lib.nn.TransformerDecoder(
        lib.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, **kwargs), 2, lib.nn.LayerNorm(8)))
    run_both(ours, theirs, arrays, masks, options, traced)


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_matches_torch(batch_first):
    ours, theirs = paired("Transformer", 8, 2, 2, 1, 16, dropout=0.0, batch_first=batch_first)
    tgt_mask = tr.nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(
        tgt_mask.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    run_both(ours, theirs, [sequence(5, batch_first=batch_first),
                            sequence(4, batch_first=batch_first)],
             dict(tgt_mask=tgt_mask.numpy(), src_key_padding_mask=PADDING,
                  memory_key_padding_mask=PADDING), traced=True)


def test_transformer_initializes_weight_matrices_by_xavier_uniform():
    tr.manual_seed(0)
    model = tr.nn.Transformer(16, 2, 1, 1, 32)
    for name, parameter in model.named_parameters():
        values = parameter.detach().numpy()
        if values.ndim > 1:
            bound = math.sqrt(6 / sum(values.shape))
            assert np.abs(values).max() <= bound, name
            assert np.abs(values).max() > 0.8 * bound, name


def test_encoder_layers_are_independent_copies():
    layer = tr.nn.TransformerEncoderLayer(8, 2, 16)
    encoder = tr.nn.TransformerEncoder(layer, 2)
    first, second = encoder.layers[0].linear1.weight, encoder.layers[1].linear1.weight
    assert first is not second and first is not layer.linear1.weight
    np.testing.assert_array_equal(first.detach().numpy(), second.detach().numpy())
    assert len(encoder.state_dict()) == 2 * len(layer.state_dict())
    with tr.no_grad():
        first.add_(1.0)
    assert not np.allclose(first.detach().numpy(), second.detach().numpy())


def test_traced_training_step_compiles_once_and_follows_torch():
    def make(lib):
        layer = lib.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return lib.nn.Sequential(lib.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                 lib.nn.Linear(8, 3))
    ours, theirs = paired("", make=make)
    optimizer = tr.optim.AdamW(ours.parameters(), lr=0.01)
    reference_optimizer = torch.optim.AdamW(theirs.parameters(), lr=0.01)

    @tr.trace
    def step(x, padding, labels):
        optimizer.zero_grad()
        features = ours[0](x, mask=tr.nn.Transformer.generate_square_subsequent_mask(
            5, dtype=tr.float64), src_key_padding_mask=padding)
        loss = tr.nn.functional.cross_entropy(ours[1](features[:, -1]), labels)
        loss.backward()
        optimizer.step()
        return loss

    generator = np.random.default_rng(4)
    before = key_biases(ours)
    for _ in range(4):
        x, labels = generator.standard_normal((3, 5, 8)), generator.integers(0, 3, 3)
        loss = step(tr.tensor(x), tr.tensor(PADDING), tr.tensor(labels))
        reference_optimizer.zero_grad()
        features = theirs[0](torch.tensor(x), mask=torch.tensor(FLOAT_CAUSAL),
                             src_key_padding_mask=torch.tensor(PADDING))
        expected = torch.nn.functional.cross_entropy(theirs[1](features[:, -1]),
                                                     torch.tensor(labels))
        expected.backward()
        reference_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-10)
    assert_trained_like_torch(ours, theirs, before, steps=4, lr=0.01, decoupled_weight_decay=0.01)
    assert step.cache_info() == (3, 1, 1)


@pytest.mark.parametrize("call, message", [
    (lambda: tr.nn.TransformerEncoderLayer(8, 2, activation="tanh"), "relu/gelu, not tanh"),
    (lambda: tr.nn.TransformerEncoderLayer(8, 3), "divisible by num_heads"),
    (lambda: tr.nn.TransformerEncoder(tr.nn.TransformerEncoderLayer(8, 2, 16), 1)(
        tr.ones(5, 3, 8), is_causal=True), "needs it"),
    (lambda: tr.nn.Transformer(8, 2, 1, 1, 16)(tr.ones(5, 3, 8), tr.ones(4, 2, 8)),
     "batch number"),
    (lambda: tr.nn.Transformer(8, 2, 1, 1, 16)(tr.ones(5, 3, 8), tr.ones(4, 3, 6)),
     "feature number"),
])
def test_errors(call, message):
    with pytest.raises(tr.TracerError, match=message):
        call()
