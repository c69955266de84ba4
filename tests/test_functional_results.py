"""Every layer of tr.nn.functional returns new tensors, as PyTorch's do: an in-place change of a
result is allowed and changes that result alone, eagerly and traced -- even where the layer's last
step is a view operation (found by the differential tester: max_pool2d ends with a squeeze, whose
result refused masked_fill_). flatten is a view in PyTorch too; dropout outside training returns
its input itself, in both; logsumexp's result is kept a view-copy of its saved result (F19)."""
import numpy as np
import pytest
import torch

import tracer as tr
import tracer.nn.functional as F

RNG = np.random.default_rng(0)
IMAGE = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
ROWS = RNG.standard_normal((4, 5)).astype(np.float32)
LABELS = np.array([0, 4, 2, 1])
PROBABILITIES = 1 / (1 + np.exp(-ROWS))
TRANSPOSED = RNG.standard_normal((3, 2, 2, 2)).astype(np.float32)  # conv_transpose2d's weight

# name -> (tracer call, torch call), each given the library's functional module and tensor maker
CASES = {
    "relu": lambda F, t: F.relu(t(ROWS)),
    "relu6": lambda F, t: F.relu6(t(ROWS * 4)),
    "softplus": lambda F, t: F.softplus(t(ROWS)),
    "hardtanh": lambda F, t: F.hardtanh(t(ROWS * 2)),
    "gelu": lambda F, t: F.gelu(t(ROWS)),
    "silu": lambda F, t: F.silu(t(ROWS)),
    "tanh": lambda F, t: F.tanh(t(ROWS)),
    "sigmoid": lambda F, t: F.sigmoid(t(ROWS)),
    "softmax": lambda F, t: F.softmax(t(ROWS), dim=-1),
    "log_softmax": lambda F, t: F.log_softmax(t(ROWS), dim=-1),
    "softmin": lambda F, t: F.softmin(t(ROWS), dim=-1),
    "leaky_relu": lambda F, t: F.leaky_relu(t(ROWS), 0.2),
    "elu": lambda F, t: F.elu(t(ROWS)),
    "selu": lambda F, t: F.selu(t(ROWS)),
    "celu": lambda F, t: F.celu(t(ROWS), 0.5),
    "mish": lambda F, t: F.mish(t(ROWS)),
    "hardswish": lambda F, t: F.hardswish(t(ROWS * 4)),
    "hardsigmoid": lambda F, t: F.hardsigmoid(t(ROWS * 4)),
    "logsigmoid": lambda F, t: F.logsigmoid(t(ROWS)),
    "softsign": lambda F, t: F.softsign(t(ROWS)),
    "tanhshrink": lambda F, t: F.tanhshrink(t(ROWS)),
    "threshold": lambda F, t: F.threshold(t(ROWS), 0.1, 20.0),
    "glu": lambda F, t: F.glu(t(ROWS[:, :4].copy())),
    "prelu": lambda F, t: F.prelu(t(ROWS), t(np.full(5, 0.25, np.float32))),
    "nll_loss": lambda F, t: F.nll_loss(t(ROWS), t(LABELS), reduction="none"),
    "cross_entropy": lambda F, t: F.cross_entropy(t(ROWS), t(LABELS)),
    "mse_loss": lambda F, t: F.mse_loss(t(ROWS), t(ROWS[::-1].copy())),
    "l1_loss": lambda F, t: F.l1_loss(t(ROWS), t(ROWS[::-1].copy())),
    "normalize": lambda F, t: F.normalize(t(ROWS)),
    "cosine_similarity": lambda F, t: F.cosine_similarity(t(ROWS), t(ROWS[::-1].copy())),
    "pairwise_distance": lambda F, t: F.pairwise_distance(t(ROWS), t(ROWS[::-1].copy())),
    "binary_cross_entropy": lambda F, t: F.binary_cross_entropy(t(PROBABILITIES),
                                                                t(PROBABILITIES[::-1].copy())),
    "binary_cross_entropy_with_logits": lambda F, t: F.binary_cross_entropy_with_logits(
        t(ROWS), t(PROBABILITIES), reduction="none"),
    "kl_div": lambda F, t: F.kl_div(t(ROWS), t(PROBABILITIES), reduction="batchmean"),
    "huber_loss": lambda F, t: F.huber_loss(t(ROWS), t(ROWS[::-1].copy()), reduction="none"),
    "smooth_l1_loss": lambda F, t: F.smooth_l1_loss(t(ROWS), t(ROWS[::-1].copy())),
    "soft_margin_loss": lambda F, t: F.soft_margin_loss(t(ROWS), t(np.sign(ROWS[::-1]).copy())),
    "cosine_embedding_loss": lambda F, t: F.cosine_embedding_loss(
        t(ROWS), t(ROWS[::-1].copy()), t(np.array([1.0, -1.0, 1.0, -1.0], np.float32))),
    "margin_ranking_loss": lambda F, t: F.margin_ranking_loss(
        t(ROWS), t(ROWS[::-1].copy()), t(np.sign(ROWS)), reduction="none"),
    "layer_norm": lambda F, t: F.layer_norm(t(ROWS), (5,)),
    "linear": lambda F, t: F.linear(t(ROWS), t(ROWS[:3].copy())),
    "one_hot": lambda F, t: F.one_hot(t(LABELS), 5),
    "embedding": lambda F, t: F.embedding(t(LABELS.reshape(2, 2)), t(ROWS.T.copy())),
    "embedding_bag": lambda F, t: F.embedding_bag(t(LABELS), t(ROWS.T.copy()), t(LABELS[:2] * 0 + [0, 2]),
                                                  mode="sum"),
    "dropout": lambda F, t: F.dropout(t(ROWS), 0.5, training=False) * 1,
    "conv1d": lambda F, t: F.conv1d(t(ROWS[None]), t(ROWS[:2, :4, None].copy())),
    "conv2d": lambda F, t: F.conv2d(t(IMAGE), t(IMAGE[:2, :, :3, :3].copy())),
    "conv_transpose2d": lambda F, t: F.conv_transpose2d(t(IMAGE), t(TRANSPOSED)),
    "pad": lambda F, t: F.pad(t(ROWS), (1, 0)),
    "max_pool2d": lambda F, t: F.max_pool2d(t(IMAGE), 2),
    "avg_pool2d": lambda F, t: F.avg_pool2d(t(IMAGE), 2),
    "adaptive_avg_pool2d": lambda F, t: F.adaptive_avg_pool2d(t(IMAGE), 1),
    "max_pool1d": lambda F, t: F.max_pool1d(t(ROWS[None]), 2),
    "avg_pool1d": lambda F, t: F.avg_pool1d(t(ROWS[None]), 2),
    "adaptive_avg_pool1d": lambda F, t: F.adaptive_avg_pool1d(t(ROWS[None]), 2),
    "adaptive_max_pool1d": lambda F, t: F.adaptive_max_pool1d(t(ROWS[None]), 2),
    "adaptive_max_pool2d": lambda F, t: F.adaptive_max_pool2d(t(IMAGE), 2),
    "interpolate": lambda F, t: F.interpolate(t(IMAGE), scale_factor=1.5, mode="bilinear"),
    "pixel_shuffle": lambda F, t: F.pixel_shuffle(t(IMAGE[:, :, :4].copy()), 1),
    "pixel_unshuffle": lambda F, t: F.pixel_unshuffle(t(IMAGE), 2),
    "channel_shuffle": lambda F, t: F.channel_shuffle(t(IMAGE), 3),
    "unfold": lambda F, t: F.unfold(t(IMAGE), 2),
    "fold": lambda F, t: F.fold(t(IMAGE[0]), (4, 4), (3, 2)),
    "dropout1d": lambda F, t: F.dropout1d(t(ROWS), 0.5, training=False) * 1,
    "dropout2d": lambda F, t: F.dropout2d(t(IMAGE), 0.5, training=False) * 1,
    "batch_norm": lambda F, t: F.batch_norm(t(IMAGE), None, None, training=True),
    "scaled_dot_product_attention": lambda F, t: F.scaled_dot_product_attention(
        t(IMAGE), t(IMAGE[:, :, :4].copy()), t(IMAGE[:, :, :4].copy()), is_causal=True),
    "group_norm": lambda F, t: F.group_norm(t(IMAGE), 3),
    "instance_norm": lambda F, t: F.instance_norm(t(IMAGE)),
    "rms_norm": lambda F, t: F.rms_norm(t(ROWS), (5,)),
}
# imported helpers; a view in PyTorch too; logsumexp's result refuses an in-place change (F19)
NOT_LAYERS = {"row_mean", "where", "iota", "as_tensor", "flatten", "logsumexp"}


def test_every_layer_has_a_case():
    public = {name for name, value in vars(F).items() if callable(value)
              and not name.startswith("_") and not isinstance(value, type)}
    assert public - NOT_LAYERS == set(CASES)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_result_changes_in_place_alone(name, traced):
    call = CASES[name]

    def changed():
        result = call(F, tr.tensor)
        before = result * 1
        result.mul_(2) if result.dtype != tr.int64 else result.add_(1)
        return before, result

    before, after = (tr.trace(changed) if traced else changed)()
    expected = call(torch.nn.functional, torch.tensor)
    np.testing.assert_allclose(before.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    step = 1 if expected.dtype == torch.int64 else None
    np.testing.assert_allclose(after.numpy(), before.numpy() + step if step else
                               before.numpy() * 2, rtol=1e-6)
