"""The reductions of PyTorch's losses ('none', 'mean', 'sum'), shared by tr.nn.functional's
losses and tracer/nn/loss_functions.py (which tr.nn.functional imports: it cannot import it back)."""
from __future__ import annotations

from tracer.errors import ArgumentError
from tracer.symbolic_zeros import zeros_made
from tracer.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


def reduce(losses: Tensor, reduction: str, denominator=None) -> Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "sum":
        return total
    # (PyTorch's mean_backward and the losses' own backwards make zeros of a symbolic zero)
    return zeros_made(total / (losses.numel() if denominator is None else denominator))


def check_reduction(reduction: str, size_average=None, reduce=None) -> None:
    # PyTorch's losses keep the deprecated size_average and reduce in their positions: a
    # positional reduction or ignore_index lands there in PyTorch, so tracer refuses it there
    # rather than honour what PyTorch would not.
    if size_average is not None or reduce is not None:
        raise ArgumentError("size_average and reduce are deprecated in PyTorch; pass "
                            "reduction='mean', 'sum' or 'none' (and ignore_index) by keyword")
    if reduction not in REDUCTIONS:
        raise ArgumentError(f"reduction is one of {list(REDUCTIONS)}, got {reduction!r}")
