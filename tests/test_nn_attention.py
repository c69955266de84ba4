"""tr.nn.functional.scaled_dot_product_attention against torch's: values and gradients of query,
key and value, float64 and float32, eager and traced, with every kind of mask (none, causal --
whole and cut into blocks of rows --, bool, float, rows that attend to nothing), a given scale,
grouped query heads; dropout's draws; its errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from tracer.nn import attention
from torch_oracle import compare_with_torch

rng = np.random.default_rng(5)


def arrays(batch, queries, keys, features=8, values=6, key_heads=None):
    """Query, key and value of `batch` dimensions (the last the heads; `key_heads` for key and
    value where they differ)."""
    key_batch = (*batch[:-1], key_heads) if key_heads else batch
    return [rng.standard_normal((*batch, queries, features)),
            rng.standard_normal((*key_batch, keys, features)),
            rng.standard_normal((*key_batch, keys, values))]


BOOL_MASK = rng.random((5, 7)) < 0.6
BOOL_MASK[2] = False  # a query that may attend to no key: zeros and zero gradients
FLOAT_MASK = np.where(rng.random((5, 7)) < 0.4, -np.inf, rng.standard_normal((5, 7)))
FLOAT_MASK[4] = -np.inf

CASES = [
    ("plain", {}, arrays((2, 3), 5, 7)),
    ("unbatched", {}, arrays((), 5, 7)),
    ("causal, square", {"is_causal": True}, arrays((2, 3), 6, 6)),
    ("causal, more keys", {"is_causal": True}, arrays((2, 3), 5, 9)),
    ("causal, more queries", {"is_causal": True}, arrays((2, 3), 9, 5)),
    # 2 * CAUSAL_BLOCK_ROWS queries or more: cut into blocks of rows, the last one shorter
    ("causal in blocks", {"is_causal": True}, arrays((2, 2), 100, 100, 4, 3)),
    ("causal in blocks, more queries", {"is_causal": True}, arrays((1, 2), 130, 70, 4, 3)),
    ("causal in blocks, more keys", {"is_causal": True}, arrays((1, 2), 70, 130, 4, 3)),
    ("scale", {"scale": 0.3}, arrays((2, 3), 5, 7)),
    ("grouped query heads", {"enable_gqa": True}, arrays((2, 4), 5, 7, key_heads=2)),
    # no features: every score 0 whatever the scale (the default 1 / sqrt(0) divided by zero)
    ("no features", {}, arrays((2, 3), 5, 7, 0)),
]
# no keys (S = 0): zeros; the masked path took a max over the empty dimension. (Values only: which
# zero-size operands get a .grad differs from PyTorch's, docs/differences.md.)
NO_KEYS = [("no keys", {}, None), ("no keys, causal", {"is_causal": True}, None),
           ("no keys, bool mask", {}, np.ones((5, 0), dtype=bool)),
           ("no keys, float mask", {}, np.zeros((5, 0)))]
MASKED = [("bool mask", BOOL_MASK), ("float mask", FLOAT_MASK),
          ("bool mask broadcast over heads", BOOL_MASK[None, None])]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, options, inputs", CASES, ids=[case[0] for case in CASES])
def test_matches_torch(name, options, inputs, traced):
    compare_with_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options),
                       lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **options),
                       inputs, traced=traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, mask", MASKED, ids=[case[0] for case in MASKED])
def test_masks_match_torch(name, mask, traced):
    compare_with_torch(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
                       lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, m),
                       [*arrays((2, 3), 5, 7), mask], traced=traced)


@pytest.mark.parametrize("name, options, inputs", CASES[2:8], ids=[c[0] for c in CASES[2:8]])
def test_causal_matches_torch_in_float32(name, options, inputs):
    compare_with_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options),
                       lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **options),
                       [a.astype(np.float32) for a in inputs], traced=True)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, options, mask", NO_KEYS, ids=[case[0] for case in NO_KEYS])
def test_no_keys_gives_zeros_as_torch(name, options, mask, traced):
    inputs = arrays((2,), 5, 0) + ([] if mask is None else [mask])
    compare_with_torch(lambda *t: F.scaled_dot_product_attention(*t, **options),
                       lambda *t: TF.scaled_dot_product_attention(*t, **options),
                       inputs, traced=traced, gradients=False)


def test_causal_blocks_are_cut_where_documented():
    """The blocked path runs from 2 * CAUSAL_BLOCK_ROWS queries: its products are smaller than
    the whole square (10 of 16 blocks at 4 blocks), seen in the traced program's text."""
    length = 4 * attention.CAUSAL_BLOCK_ROWS
    q, k, v = (tr.tensor(a.astype(np.float32)) for a in arrays((1, 1), length, length, 4, 4))
    text = tr.trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)).ir(
        q, k, v, stage="traced")
    block = attention.CAUSAL_BLOCK_ROWS
    for blocks in range(1, 5):
        assert f"f32[1,1,{block},{blocks * block}]" in text, blocks
    assert f"f32[1,1,{length},{length}]" not in text


def test_dropout_draws_anew_on_every_call_and_keeps_the_expectation():
    q, k, v = (tr.tensor(a) for a in arrays((1, 1), 4, 6, 3, 2))
    step = tr.trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    tr.manual_seed(0)
    draws = np.stack([step(q, k, v).numpy() for _ in range(2000)])
    assert not np.array_equal(draws[0], draws[1])
    expected = TF.scaled_dot_product_attention(*(torch.tensor(t.numpy()) for t in (q, k, v)))
    # each output is a sum of 6 weighted values kept with probability 1/2 and doubled: its
    # standard deviation over draws is below 2 * max |v|; the mean of 2000 within 5 sigma.
    limit = 5 * 2 * np.abs(v.numpy()).max() / np.sqrt(len(draws))
    np.testing.assert_allclose(draws.mean(0), expected.numpy(), atol=limit)
    everything = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    np.testing.assert_array_equal(everything.numpy(), np.zeros((1, 1, 4, 2)))


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, tr.ones(5, 7, dtype=tr.bool),
                                                    is_causal=True), "not both"),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=1.5), "between 0 and 1"),
    (lambda q, k, v: F.scaled_dot_product_attention(q[:, 0, 0, 0], k, v), "at least 2"),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], enable_gqa=True),
     "not a multiple"),
])
def test_bad_input_is_a_clear_error_naming_the_line(call, message):
    q, k, v = (tr.tensor(a) for a in arrays((2, 3), 5, 7))
    with pytest.raises(tr.TracerError, match=f"test_nn_attention.py:.*{message}"):
        call(q, k, v)


@pytest.mark.parametrize("mask, message", [
    (np.ones((5, 7), dtype=np.int64), "bool or float"),  # PyTorch refuses an int64 mask too
    (np.zeros((5, 7)), "bool or float"),  # float64 on a float32 query: PyTorch refuses it
    (np.zeros((3, 2, 5, 7), dtype=np.float32), "does not broadcast"),  # would widen the output
    (np.ones((3, 2, 5, 7), dtype=bool), "does not broadcast"),
])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_a_mask_pytorch_refuses_is_a_clear_error(mask, message, traced):
    q, k, v = (tr.tensor(a.astype(np.float32)) for a in arrays((2,), 5, 7))

    def call(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, m)

    with pytest.raises(tr.TracerError, match=f"attn_mask.*{message}"):
        (tr.trace(call) if traced else call)(q, k, v, tr.tensor(mask))
    with pytest.raises(RuntimeError):  # (the oracle: PyTorch refuses each of them)
        TF.scaled_dot_product_attention(*(torch.tensor(t.numpy()) for t in (q, k, v)),
                                        torch.tensor(mask))


def test_a_float32_mask_on_a_float64_query_is_promoted_as_in_pytorch():
    compare_with_torch(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
                       lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, m),
                       [*arrays((2, 3), 5, 7), FLOAT_MASK.astype(np.float32)])
