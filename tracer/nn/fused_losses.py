"""Eager cross_entropy and nll_loss of (N, C) inputs against integer labels, each one node of
the tape.

Composed of primitives (log_softmax, gather, where, the reduction), an eager cross_entropy ran
26 operations forward and 14 tape nodes backward, each through the dispatcher: 2.6 ms at
(256, 10) on one thread where torch takes 0.17 ms, nearly all of it per-operation overhead. Here
numpy computes the loss in one pass of each kind (max, subtract, exp, sum), and cross_entropy's
backward is one product: softmax(x) times each row's share of the loss's cotangent, minus that
share at the label (PyTorch's log_softmax_backward of nll_loss_backward, without the one-hot
gradient it passes between them). Values are the composition's to the last bit (the same
operations in the same order); gradients agree with PyTorch's to rounding. Traced code keeps the
composition (tracer/nn/functional.py), which the compiler fuses itself.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tracer.arithmetic import where
from tracer.eager_nodes import eager_float, one_node, unchanged
from tracer.tensor import Tensor


def applies(input: Tensor, labels: Tensor, weight: Tensor | None) -> bool:
    """Whether a fused eager loss computes this call: eager (2-D, float) input and labels, and no
    class weight that would want a gradient (the composition gives it one; PyTorch refuses)."""
    return (eager_float(input) and labels._trace is None and input.ndim == 2
            and (weight is None or (weight._trace is None and not weight.requires_grad)))


class _Labels:
    """What both losses read of checked labels (int64, one per row, in range or ignored) and of
    the class weights (in the input's dtype, or None): per row its label (0 where ignored),
    whether it counts and its weight (0 where ignored); the mean's denominator."""

    def __init__(self, input: Tensor, labels: Tensor, weight: Tensor | None, ignore_index: int,
                 reduction: str):
        values = labels._eager_array("loss labels")
        dtype = input.dtype
        self.rows = np.arange(values.shape[0])
        self.counted = values != ignore_index
        self.index = np.where(self.counted, values, 0)
        self.weights = (self.counted.astype(dtype) if weight is None else np.where(
            self.counted, weight._eager_array("loss weight")[self.index], 0))
        self.denominator = self.weights.sum()
        self.reduction = reduction

    def reduced(self, losses: np.ndarray) -> np.ndarray:
        """The rows' losses reduced as the composition does (tracer/nn/loss_reduction.py)."""
        if self.reduction == "none":
            return losses
        total = losses.sum()
        with np.errstate(all="ignore"):  # (0 / 0 is nan, as in PyTorch)
            return np.asarray(total / self.denominator if self.reduction == "mean" else total)

    def shares(self, cotangent, constant: Callable = np.asarray):
        """Each row's share of the loss's cotangent: its weight (0 where ignored, even if the
        mean's denominator is 0) over that denominator. Arrays, or tensors on the tape where
        `constant` makes tensors (create_graph)."""
        with np.errstate(all="ignore"):
            scaled = (cotangent / constant(self.denominator) if self.reduction == "mean"
                      else cotangent)
            if constant is np.asarray:
                return np.where(self.counted, self.weights * scaled, 0)
            return where(constant(self.counted), constant(self.weights) * scaled, 0.0)

    def at_label(self, classes: int) -> Tensor:
        return _constant(np.arange(classes) == self.index[:, None])


def _constant(array) -> Tensor:
    return Tensor._make(np.asarray(array), None, False)


def cross_entropy(input: Tensor, labels: Tensor, weight: Tensor | None, ignore_index: int,
                  reduction: str) -> Tensor:
    """cross_entropy(input, labels, weight) with `labels` and `weight` as `_Labels` takes them."""
    logits = input._eager_array("cross_entropy input")
    taken = _Labels(input, labels, weight, ignore_index, reduction)
    with np.errstate(all="ignore"):  # (nan and infinities propagate, as in PyTorch)
        exponentials = logits - logits.max(axis=1, keepdims=True)
        picked = exponentials[taken.rows, taken.index]
        np.exp(exponentials, out=exponentials)
        sums = exponentials.sum(axis=1)
        losses = np.where(taken.counted, (np.log(sums) - picked) * taken.weights, 0)

    def backward(cotangent: np.ndarray) -> np.ndarray:
        shares = taken.shares(cotangent)
        with np.errstate(all="ignore"):
            gradient = exponentials * (shares / sums)[:, None]
        gradient[taken.rows, taken.index] -= shares
        return gradient

    def recorded_backward(cotangent: Tensor) -> Tensor:
        unchanged(input, version, "cross_entropy")  # (softmax of them again, on the tape)
        shares = taken.shares(cotangent, _constant)
        probabilities = input.softmax(1)
        return (where(taken.at_label(logits.shape[1]), probabilities - 1.0, probabilities)
                * shares.unsqueeze(1))

    version = input._version
    # (PyTorch's saves log_softmax's result, not the logits)
    return one_node("cross_entropy", input, logits, taken.reduced(losses), backward,
                    recorded_backward)


def nll_loss(input: Tensor, labels: Tensor, weight: Tensor | None, ignore_index: int,
             reduction: str) -> Tensor:
    """nll_loss(input, labels, weight) with `labels` and `weight` as `_Labels` takes them."""
    log_probabilities = input._eager_array("nll_loss input")
    taken = _Labels(input, labels, weight, ignore_index, reduction)
    with np.errstate(all="ignore"):
        losses = np.where(taken.counted,
                          -log_probabilities[taken.rows, taken.index] * taken.weights, 0)

    def backward(cotangent: np.ndarray) -> np.ndarray:
        gradient = np.zeros_like(log_probabilities)
        # (0 - share: an ignored row's is +0, as PyTorch's, where -0.0 would be -0)
        gradient[taken.rows, taken.index] = 0 - taken.shares(cotangent)
        return gradient

    def recorded_backward(cotangent: Tensor) -> Tensor:
        shares = taken.shares(cotangent, _constant)
        return where(taken.at_label(log_probabilities.shape[1]), -shares.unsqueeze(1), 0.0)

    return one_node("nll_loss", input, log_probabilities, taken.reduced(losses), backward,
                    recorded_backward, saves_input=True)
