"""examples/transformer.py: the same GPT written in PyTorch (benchmarks/transformer.py's torch_gpt)
from the same initial weights, trained with torch.optim.AdamW in float64, gives the same losses
and parameters step by step, eagerly and traced; and the example itself runs in a short form, its
loss going down."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tracer as tr
import transformer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.transformer import torch_gpt  # noqa: E402

# A model small enough to compile in seconds that still has every part: two layers, two heads.
CONFIG = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
STEPS = 4
# AdamW's arguments in both libraries. eps is 1e-6, not the default 1e-8: the key bias (with
# bias=True) adds q . b to a whole row of attention scores, which softmax ignores, so its gradient
# is 0, computed as rounding noise (~1e-18 here), different in each evaluation. Adam divides it by
# its own size + eps, which makes the noise a step of lr * 1e-18 / eps: 1e-12 with eps = 1e-8,
# the size of the differences compared; 1e-14 with eps = 1e-6.
ADAMW = dict(lr=1e-2, eps=1e-6)


def batches(config, count, seed=0):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, config.vocab_size, 200)
    result = []
    for _ in range(count):
        starts = rng.integers(0, len(text) - config.block_size, 3)[:, None]
        window = starts + np.arange(config.block_size)
        result.append((text[window], text[window + 1]))
    return result


def torch_run(model, data):
    """The losses of torch's AdamW steps and the parameters after them, by name."""
    reference = torch_gpt()(model.config).double()
    state = {name: torch.tensor(value.numpy()) for name, value in model.state_dict().items()}
    reference.load_state_dict(state)  # strict: every name matches the tracer model's
    optimizer = torch.optim.AdamW(reference.parameters(), **ADAMW)
    losses = []
    for x, y in data:
        loss = reference(torch.tensor(x), torch.tensor(y))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {name: p.detach().numpy() for name, p in reference.named_parameters()}


# flash: attention by F.scaled_dot_product_attention(is_causal=True) in both; over 64 characters
# of context, tracer's is cut into blocks of rows (tracer/nn/attention.py), here two of 36.
@pytest.mark.parametrize("traced, bias, flash, block_size", [
    (False, True, False, 8), (True, True, False, 8), (True, False, True, 8),
    (True, False, True, 72)])
def test_training_equals_torch_in_float64(traced, bias, flash, block_size):
    config = transformer.Config(**dict(CONFIG, block_size=block_size), bias=bias, flash=flash)
    tr.manual_seed(3)
    model = transformer.GPT(config).double()
    data = batches(config, STEPS)
    expected_losses, expected_parameters = torch_run(model, data)
    optimizer = tr.optim.AdamW(model.parameters(), **ADAMW)
    step = transformer.make_step(model, optimizer)
    step = tr.trace(step) if traced else step
    losses = [step(tr.tensor(x), tr.tensor(y)).item() for x, y in data]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    parameters = dict(model.named_parameters())
    assert parameters.keys() == expected_parameters.keys()
    for name, expected in expected_parameters.items():
        np.testing.assert_allclose(parameters[name].detach().numpy(), expected, rtol=0,
                                   atol=1e-12, err_msg=name)
    if traced:
        assert step.cache_info().misses == 1  # AdamW's state and .grad = None: one signature


def test_gradient_through_a_block_equals_finite_differences():
    """The loss's gradient with respect to a block's input (attention, layer norms, the GELU MLP,
    the head and cross-entropy), eagerly, against central differences (float64)."""
    config = transformer.Config(**dict(CONFIG, n_layer=1, block_size=4))
    tr.manual_seed(4)
    model = transformer.GPT(config).double()
    (_, y), = batches(config, 1)
    y = tr.tensor(y[:1])

    def loss(hidden):
        logits = model.lm_head(model.ln_f(model.h[0](hidden)))
        return tr.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    hidden = tr.randn(1, config.block_size, config.n_embd, dtype=tr.float64, requires_grad=True)
    assert tr.gradcheck(loss, (hidden,))


def test_example_runs_and_its_loss_goes_down(capsys):
    results = transformer.main(["--quick", "--steps", "25", "--eager-steps", "3"])
    compiled, compiled_speed = results["compiled"]
    eager, eager_speed = results["eager"]
    assert len(compiled) == 25 and len(eager) == 3
    # the same weights and batches: the eager steps are the compiled steps (float32 rounding)
    np.testing.assert_allclose(eager, compiled[:3], rtol=1e-5)
    assert compiled[-1] < compiled[0] - 0.5  # from ln(103) = 4.63 at first
    assert compiled_speed > 0 and eager_speed > 0
    output = capsys.readouterr().out
    assert "tokens/s" in output and "compiled / eager" in output and "continues 'The '" in output
