"""PyTorch's binary, divergence, robust-regression and margin losses, as compositions of tensor
operations; the reductions are tr.nn.functional's ('none', 'mean', 'sum'; kl_div also
'batchmean').

binary_cross_entropy, binary_cross_entropy_with_logits and the x log x of kl_div are
NativeFunctions: their gradients are PyTorch's formulas (BCE's divides by max(x (1 - x), 1e-12)
where the log's clamp at -100 would give no gradient; the logits form's stays finite where the
composition's exp overflows). As PyTorch, they do not differentiate a `weight` or `pos_weight`
and refuse one that requires grad.
"""
from __future__ import annotations

import warnings

import numpy as np

from tracer import derivatives
from tracer.arithmetic import where
from tracer.context import state
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.function import NativeFunction
from tracer.nn.activations import logsigmoid
# (`reduce` is also the deprecated argument of PyTorch's losses)
from tracer.nn.loss_reduction import check_reduction, reduce as _reduce
from tracer.tensor import Tensor

# PyTorch's EPSILON of BCE's backward and cosine_embedding_loss's magnitudes: a float constant,
# 1e-12 rounded to float32 also in float64 (its square root moves a float64 cosine's gradient
# by 2e-9 relative where the magnitude is about epsilon)
_EPSILON = float(np.float32(1e-12))
_LOG_FLOOR = -100.0  # PyTorch clamps BCE's logarithms here (so that 0 * log 0 is 0, not nan)


def _not_differentiated(tensor: Tensor | None, name: str, function: str) -> Tensor | None:
    if tensor is None:
        return None
    tensor = as_tensor(tensor)
    if tensor.requires_grad and state.grad_enabled:
        raise ArgumentError(f"{function} is not differentiable with respect to {name}, as in "
                            f"PyTorch: pass {name}.detach()")
    return tensor


def _same_size(input: Tensor, target: Tensor, function: str) -> None:
    if target.shape != input.shape:
        raise ShapeMismatchError(f"{function}: a target of shape {list(target.shape)} for an "
                                 f"input of shape {list(input.shape)}; they must be equal")


def _check_probabilities(tensor: Tensor, what: str) -> None:
    """Eagerly, values outside [0, 1] (or nan) are an error, as in PyTorch's kernel."""
    if state.trace is not None or tensor._trace is not None:
        return
    values = tensor._eager_array(what)
    if not ((values >= 0) & (values <= 1)).all():
        raise ArgumentError(f"binary_cross_entropy: all elements of {what} should be between 0 "
                            f"and 1")


def _weighted(losses: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    return _reduce(losses if weight is None else losses * weight, reduction)


class _BinaryCrossEntropy(NativeFunction):
    @staticmethod
    def forward(ctx, x, target):
        ctx.save_for_backward(x, target)
        logs = x.log().clamp_min(_LOG_FLOOR)
        complements = (-x).log1p().clamp_min(_LOG_FLOOR)
        return (target - 1.0) * complements - target * logs

    @staticmethod
    def backward(ctx, grad_output):
        x, target = ctx.saved_tensors
        # binary_cross_entropy_backward and binary_cross_entropy_target_backward (-logit(x))
        grad_input = grad_output * (x - target) / ((1.0 - x) * x).clamp_min(_EPSILON)
        return grad_input, -(x / (1.0 - x)).log() * grad_output


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """-weight * (t log x + (1 - t) log(1 - x)) of probabilities x, each log at least -100."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    target = as_tensor(target)
    _same_size(input, target, "binary_cross_entropy")
    _check_probabilities(input, "input")
    _check_probabilities(target, "target")
    weight = _not_differentiated(weight, "weight", "binary_cross_entropy")
    return _weighted(_BinaryCrossEntropy.apply(input, target), weight, reduction)


class _BinaryCrossEntropyWithLogits(NativeFunction):
    @staticmethod
    def forward(ctx, x, target, pos_weight):
        ctx.save_for_backward(x, target)
        ctx.pos_weight = pos_weight
        log_sigmoid = logsigmoid(x)
        if pos_weight is not None:
            log_sigmoid = log_sigmoid * ((pos_weight - 1.0) * target + 1.0)
        return (1.0 - target) * x - log_sigmoid

    @staticmethod
    def backward(ctx, grad_output):
        x, target = ctx.saved_tensors
        pos_weight = ctx.pos_weight
        # binary_cross_entropy_with_logits_backward and its _target_backward
        if pos_weight is None:
            return (derivatives.sigmoid(x) - target) * grad_output, -x * grad_output, None
        weighted = pos_weight * target
        grad_input = (weighted + 1.0 - target) * derivatives.sigmoid(x) - weighted
        grad_target = logsigmoid(-x) - logsigmoid(x) * pos_weight
        return grad_input * grad_output, grad_target * grad_output, None


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,
                                     weight: Tensor | None = None, size_average=None,
                                     reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy of sigmoid(input), through log-sigmoid (finite for any logit);
    `pos_weight` (broadcast along the last dimension) weighs the positive term."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    target = as_tensor(target)
    _same_size(input, target, "binary_cross_entropy_with_logits")
    weight = _not_differentiated(weight, "weight", "binary_cross_entropy_with_logits")
    pos_weight = _not_differentiated(pos_weight, "pos_weight", "binary_cross_entropy_with_logits")
    losses = _BinaryCrossEntropyWithLogits.apply(input, target, pos_weight)
    return _weighted(losses, weight, reduction)


class _SelfXlogy(NativeFunction):
    """xlogy(t, t): t log t, 0 at t = 0; its gradient PyTorch's xlogy's for both arguments,
    log t (0 at t = 0) + t / t (nan at t = 0, as PyTorch's)."""

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return where(t == 0, 0.0, t * t.log())

    @staticmethod
    def backward(ctx, grad_output):
        (t,) = ctx.saved_tensors
        return grad_output * where(t != 0, t.log(), 0.0) + grad_output * t / t


_KL_REDUCTIONS = ("none", "batchmean", "sum", "mean")


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """The Kullback-Leibler divergence of `target` from log-probabilities `input`: t (log t - x),
    or with `log_target` exp(t) (t - x); 'batchmean' divides the sum by the first dimension
    (PyTorch's 'mean' divides by every element)."""
    if reduction not in _KL_REDUCTIONS:
        raise ArgumentError(f"kl_div: reduction is one of {list(_KL_REDUCTIONS)}, got "
                            f"{reduction!r}")
    _deprecated(size_average, reduce)
    if reduction == "mean":
        warnings.warn("kl_div: reduction='mean' divides by every element, as PyTorch's, not by "
                      "the batch size; 'batchmean' is the divergence's definition", stacklevel=2)
    target = as_tensor(target)
    if log_target:
        losses = target.exp() * (target - input)
    else:
        losses = _SelfXlogy.apply(target) - target * input
    if reduction != "batchmean":
        return _reduce(losses, reduction)
    total = losses.sum()
    return total / input.shape[0] if input.ndim else total


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean",
               delta: float = 1.0, weight: Tensor | None = None) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - delta / 2), d = input - target."""
    check_reduction(reduction)
    if delta <= 0:
        raise ArgumentError(f"huber_loss needs a positive delta, got {delta}")
    if weight is not None and weight.shape != input.shape:
        raise ShapeMismatchError(f"huber_loss: weights of shape {list(weight.shape)} for an input "
                                 f"of shape {list(input.shape)}; they must be equal")
    difference = input - target
    distance = difference.abs()
    # (nan takes the square's side, whose gradient PyTorch's backward gives it: grad * d)
    small = ~(distance >= delta)
    # (the square of the linear side's 0, not of d: its gradient 0 * inf would be nan at d = inf)
    inside = where(small, difference, 0.0)
    losses = where(small, 0.5 * inside * inside, delta * (distance - 0.5 * delta))
    return _weighted(losses, weight, reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (l1_loss for beta = 0)."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    if beta < 0:
        raise ArgumentError(f"smooth_l1_loss needs a beta of at least 0, got {beta}")
    if beta == 0:  # (l1_loss)
        return _reduce((input - target).abs(), reduction)
    difference = input - target
    distance = difference.abs()
    small = ~(distance >= beta)  # (nan on the square's side, as huber_loss)
    inside = where(small, difference, 0.0)
    losses = where(small, 0.5 * inside * inside / beta, distance - 0.5 * beta)
    return _reduce(losses, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                     reduction: str = "mean") -> Tensor:
    """log(1 + exp(-y x)) for labels y of ±1 (PyTorch's formula, which overflows to inf beyond
    -y x = 88.7 in float32; not differentiable with respect to the target)."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    target = _not_differentiated(target, "target", "soft_margin_loss")
    return _reduce((-input * target).exp().log1p(), reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """1 - cos(x1, x2) for target 1, max(0, cos - margin) for target -1 (0 for other targets),
    along the last dimension of 2-d inputs with a 1-d target (1-d inputs with a 0-d target)."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    target = as_tensor(target)
    if target.ndim > 1:
        raise ShapeMismatchError("cosine_embedding_loss: a 0-d or 1-d target expected, got "
                                 f"shape {list(target.shape)}")
    rank = target.ndim + 1
    if input1.ndim != rank or input2.ndim != rank:
        raise ShapeMismatchError(f"cosine_embedding_loss: a {target.ndim}-d target needs "
                                 f"{rank}-d inputs, got shapes {list(input1.shape)} and "
                                 f"{list(input2.shape)}")
    dim = target.ndim
    products = (input1 * input2).sum(dim)
    squares1 = (input1 * input1).sum(dim) + _EPSILON
    squares2 = (input2 * input2).sum(dim) + _EPSILON
    cosine = products / (squares1 * squares2).sqrt()
    positive = where(target == 1, 1.0 - cosine, 0.0)
    negative = where(target == -1, (cosine - margin).clamp_min(0.0), 0.0)
    return _reduce(positive + negative, reduction)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """max(0, -y (x1 - x2) + margin): y = 1 ranks x1 above x2, y = -1 below."""
    check_reduction(reduction)
    _deprecated(size_average, reduce)
    target = as_tensor(target)
    if not input1.ndim == input2.ndim == target.ndim:
        raise ShapeMismatchError(
            f"margin_ranking_loss: all inputs need the same number of dimensions, got shapes "
            f"{list(input1.shape)}, {list(input2.shape)} and target {list(target.shape)}")
    return _reduce((-target * (input1 - input2) + margin).clamp_min(0.0), reduction)


def _deprecated(size_average, reduce) -> None:
    if size_average is not None or reduce is not None:
        raise ArgumentError("size_average and reduce are deprecated in PyTorch; pass "
                            "reduction='mean', 'sum' or 'none'")
