"""tracer/nn/loss_functions.py and loss_modules.py against torch: values and gradients (of the
input and, where PyTorch differentiates it, the target) for every reduction and option, float64
(to 1e-12) and float32, eagerly and traced; the modules' buffers; errors; and a traced training
step with BCEWithLogitsLoss that compiles once."""
import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import compare_with_torch

rng = np.random.default_rng(11)
LOGITS = rng.standard_normal((6, 4)) * 3
OTHER = rng.standard_normal((6, 4)) * 3
PROBABILITIES = 1 / (1 + np.exp(-LOGITS))
TARGETS = rng.uniform(0, 1, (6, 4))
TARGETS[0] = [0.0, 1.0, 0.0, 1.0]  # the logs' clamp at -100 where a probability is 0 or 1
PROBABILITIES[0] = [0.0, 1.0, 1.0, 0.0]
SIGNS = np.sign(rng.standard_normal((6, 4)))
LOG_PROBABILITIES = np.log(rng.dirichlet(np.ones(4), 6))
# differences at the kinks of huber and smooth_l1: |d| = delta (1), beta (0.5) and 0
KINKED = OTHER.copy()
KINKED[0] = LOGITS[0] + [1.0, -1.0, 0.5, 0.0]
CLASS_WEIGHT = rng.uniform(0.5, 2, 4)
PAIR_LABELS = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
TIGHT = {np.float64: dict(rtol=1e-12, atol=1e-14), np.float32: None}
REDUCTIONS = ["mean", "sum", "none"]


def _with_reductions(name, call, arrays):
    return [(f"{name} {reduction}", lambda lib, *t, r=reduction: call(lib, *t, r), arrays)
            for reduction in REDUCTIONS]


F = "nn.functional"
CASES = [
    *_with_reductions("bce", lambda lib, x, t, r: lib.nn.functional.binary_cross_entropy(
        x, t, reduction=r), [PROBABILITIES, TARGETS]),
    *_with_reductions("bce weight", lambda lib, x, t, w, r: lib.nn.functional.binary_cross_entropy(
        x, t, weight=w.detach(), reduction=r), [PROBABILITIES, TARGETS, CLASS_WEIGHT]),
    *_with_reductions("bce logits", lambda lib, x, t, r:
                      lib.nn.functional.binary_cross_entropy_with_logits(x, t, reduction=r),
                      [LOGITS * 20, TARGETS]),
    *_with_reductions("bce logits weights", lambda lib, x, t, w, p, r:
                      lib.nn.functional.binary_cross_entropy_with_logits(
                          x, t, w.detach(), reduction=r, pos_weight=p.detach()),
                      [LOGITS * 20, TARGETS, CLASS_WEIGHT, CLASS_WEIGHT[::-1]]),
    *_with_reductions("kl_div", lambda lib, x, t, r: lib.nn.functional.kl_div(x, t, reduction=r),
                      [LOG_PROBABILITIES, PROBABILITIES]),
    ("kl_div batchmean", lambda lib, x, t: lib.nn.functional.kl_div(x, t, reduction="batchmean"),
     [LOG_PROBABILITIES, PROBABILITIES]),
    ("kl_div log_target", lambda lib, x, t: lib.nn.functional.kl_div(
        x, t, reduction="batchmean", log_target=True), [LOG_PROBABILITIES, LOGITS]),
    *_with_reductions("huber", lambda lib, x, t, r: lib.nn.functional.huber_loss(
        x, t, reduction=r), [LOGITS, KINKED]),
    ("huber delta", lambda lib, x, t: lib.nn.functional.huber_loss(x, t, delta=0.5),
     [LOGITS, KINKED]),
    ("huber weight", lambda lib, x, t, w: lib.nn.functional.huber_loss(x, t, weight=w),
     [LOGITS, KINKED, TARGETS]),
    *_with_reductions("smooth_l1", lambda lib, x, t, r: lib.nn.functional.smooth_l1_loss(
        x, t, reduction=r), [LOGITS, KINKED]),
    ("smooth_l1 beta", lambda lib, x, t: lib.nn.functional.smooth_l1_loss(x, t, beta=0.5),
     [LOGITS, KINKED]),
    ("smooth_l1 beta 0", lambda lib, x, t: lib.nn.functional.smooth_l1_loss(x, t, beta=0.0),
     [LOGITS, KINKED]),
    *_with_reductions("soft_margin", lambda lib, x, t, r: lib.nn.functional.soft_margin_loss(
        x, t.detach(), reduction=r), [LOGITS, SIGNS]),
    *_with_reductions("cosine_embedding", lambda lib, x, y, t, r:
                      lib.nn.functional.cosine_embedding_loss(x, y, t.detach(), reduction=r),
                      [LOGITS, OTHER, PAIR_LABELS]),
    ("cosine_embedding margin 1-d", lambda lib, x, y: lib.nn.functional.cosine_embedding_loss(
        x[0], y[0], lib.tensor(-1.0, dtype=x.dtype), margin=-0.5), [LOGITS, OTHER]),
    *_with_reductions("margin_ranking", lambda lib, x, y, t, r:
                      lib.nn.functional.margin_ranking_loss(x, y, t, reduction=r),
                      [LOGITS, OTHER, SIGNS]),
    ("margin_ranking margin", lambda lib, x, y, t: lib.nn.functional.margin_ranking_loss(
        x, y, t, margin=0.7), [LOGITS, OTHER, SIGNS]),
]


@pytest.mark.filterwarnings("ignore:.*reduction.*'mean'")  # (kl_div's 'mean', in both)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name, call, arrays", CASES, ids=[c[0] for c in CASES])
def test_loss_matches_torch(name, call, arrays, dtype, traced):
    compare_with_torch(lambda *t: call(tr, *t), lambda *t: call(torch, *t),
                       [a.astype(dtype) for a in arrays], traced=traced, tolerance=TIGHT[dtype])


MODULES = [
    ("BCELoss", dict(weight=CLASS_WEIGHT), [PROBABILITIES, TARGETS]),
    ("BCELoss", dict(reduction="sum"), [PROBABILITIES, TARGETS]),
    ("BCEWithLogitsLoss", dict(weight=CLASS_WEIGHT, pos_weight=CLASS_WEIGHT[::-1].copy()),
     [LOGITS, TARGETS]),
    ("BCEWithLogitsLoss", dict(reduction="none"), [LOGITS, TARGETS]),
    ("KLDivLoss", dict(reduction="batchmean"), [LOG_PROBABILITIES, PROBABILITIES]),
    ("KLDivLoss", dict(log_target=True, reduction="sum"), [LOG_PROBABILITIES, LOGITS]),
    ("HuberLoss", dict(delta=0.5), [LOGITS, KINKED]),
    ("SmoothL1Loss", dict(beta=0.5, reduction="sum"), [LOGITS, KINKED]),
    ("SoftMarginLoss", {}, [LOGITS, SIGNS]),
    ("CosineEmbeddingLoss", dict(margin=0.2), [LOGITS, OTHER, PAIR_LABELS]),
    ("MarginRankingLoss", dict(margin=0.3, reduction="none"), [LOGITS, OTHER, SIGNS]),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, options, arrays", MODULES, ids=lambda v: str(v)[:40])
def test_module_matches_torch(name, options, arrays, traced):
    buffers = {k: v for k, v in options.items() if isinstance(v, np.ndarray)}
    ours = getattr(nn, name)(**{**options, **{k: tr.tensor(v) for k, v in buffers.items()}})
    theirs = getattr(torch.nn, name)(**{**options,
                                        **{k: torch.tensor(v) for k, v in buffers.items()}})
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    # the last input (SoftMarginLoss's and CosineEmbeddingLoss's labels) is not differentiated
    last = len(arrays) - 1 if name in ("SoftMarginLoss", "CosineEmbeddingLoss") else None

    def run(module, library):
        return lambda *t: module(*t[:last], *(s.detach() for s in t[last:] if last))
    compare_with_torch(run(ours, tr), run(theirs, torch), arrays, traced=traced,
                       tolerance=TIGHT[np.float64])


def test_bce_gradient_where_the_log_is_clamped():
    """Where a probability is 0 or 1 the clamped log has no gradient; PyTorch's backward divides
    by max(x (1 - x), 1e-12 rounded to float32) instead, and the target's gradient is -logit(x), infinite there."""
    x = tr.tensor([0.0, 1.0, 0.3], dtype=tr.float64, requires_grad=True)
    t = tr.tensor([1.0, 0.0, 0.3], dtype=tr.float64, requires_grad=True)
    loss = tr.nn.functional.binary_cross_entropy(x, t, reduction="sum")
    loss.backward()
    assert loss.item() == pytest.approx(200 + (-0.3 * np.log(0.3) - 0.7 * np.log(0.7)), rel=1e-14)
    epsilon = float(np.float32(1e-12))  # (PyTorch's float EPSILON)
    assert x.grad.tolist() == [-1 / epsilon, 1 / epsilon, 0.0]
    assert t.grad.tolist()[:2] == [np.inf, -np.inf]


def test_kl_div_warns_of_its_mean_as_pytorch():
    x = tr.tensor(LOG_PROBABILITIES)
    with pytest.warns(UserWarning, match="batchmean"):
        tr.nn.functional.kl_div(x, x.exp())


def test_errors():
    x = tr.tensor(PROBABILITIES)
    with pytest.raises(tr.TracerError, match="input should be between 0 and 1"):
        tr.nn.functional.binary_cross_entropy(x * 2, x)
    with pytest.raises(tr.TracerError, match="target should be between 0 and 1"):
        tr.nn.functional.binary_cross_entropy(x, x - 1)
    with pytest.raises(tr.TracerError, match="must be equal"):
        tr.nn.functional.binary_cross_entropy(x, x[0])
    with pytest.raises(tr.TracerError, match="must be equal"):
        tr.nn.functional.binary_cross_entropy_with_logits(x, x[:, :2])
    weight = tr.ones(4, requires_grad=True)
    with pytest.raises(tr.TracerError, match="not differentiable with respect to weight"):
        tr.nn.functional.binary_cross_entropy(x, x, weight=weight)
    with pytest.raises(tr.TracerError, match="with respect to pos_weight"):
        tr.nn.functional.binary_cross_entropy_with_logits(x, x, pos_weight=weight)
    with pytest.raises(tr.TracerError, match="with respect to target"):
        tr.nn.functional.soft_margin_loss(x, weight)
    with pytest.raises(tr.TracerError, match="reduction is one of"):
        tr.nn.functional.kl_div(x, x, reduction="average")
    with pytest.raises(tr.TracerError, match="reduction is one of"):
        nn.KLDivLoss(reduction="average")
    with pytest.raises(tr.TracerError, match="positive delta"):
        tr.nn.functional.huber_loss(x, x, delta=0.0)
    with pytest.raises(tr.TracerError, match="beta of at least 0"):
        nn.SmoothL1Loss(beta=-1.0)(x, x)
    with pytest.raises(tr.TracerError, match="same number of dimensions"):
        tr.nn.functional.margin_ranking_loss(x[0], x[1], tr.tensor(1.0))
    with pytest.raises(tr.TracerError, match="a 1-d target needs 2-d inputs"):
        tr.nn.functional.cosine_embedding_loss(x[0], x[1], tr.ones(4))
    with pytest.raises(tr.TracerError, match="0-d or 1-d target"):
        tr.nn.functional.cosine_embedding_loss(x, x, tr.ones(6, 1))
    with pytest.raises(tr.TracerError, match="deprecated"):
        nn.BCELoss(size_average=True)


def test_traced_training_step_matches_torch_and_compiles_once():
    features, labels = rng.standard_normal((16, 5)), rng.integers(0, 2, (16, 3)).astype(float)
    generator = np.random.default_rng(2)
    weights = [generator.standard_normal((3, 5)) * 0.5, generator.standard_normal(3) * 0.5]
    ours, theirs = tr.nn.Linear(5, 3, dtype=tr.float64), torch.nn.Linear(5, 3, dtype=torch.float64)
    ours.load_state_dict({"weight": weights[0], "bias": weights[1]})
    theirs.load_state_dict({"weight": torch.tensor(weights[0]), "bias": torch.tensor(weights[1])})
    pos_weight = np.array([1.0, 2.0, 0.5])
    our_loss = nn.BCEWithLogitsLoss(pos_weight=tr.tensor(pos_weight))
    their_loss = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight))
    our_optimizer = tr.optim.SGD(ours.parameters(), lr=0.5)
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.5)

    @tr.trace
    def step(x, y):
        our_optimizer.zero_grad()
        loss = our_loss(ours(x), y) + tr.nn.functional.huber_loss(ours(x), y, delta=0.5)
        loss.backward()
        our_optimizer.step()
        return loss

    for _ in range(4):
        loss = step(tr.tensor(features), tr.tensor(labels))
        their_optimizer.zero_grad()
        x, y = torch.tensor(features), torch.tensor(labels)
        expected = their_loss(theirs(x), y) + torch.nn.functional.huber_loss(theirs(x), y,
                                                                            delta=0.5)
        expected.backward()
        their_optimizer.step()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-12)
    assert step.cache_info().misses <= 2  # the first call without .grad, then one signature
    assert step.cache_info().hits >= 2
