"""`tr.einsum`, lowered to the operations it stands for: a label repeated within an operand takes
a diagonal (a mask and a sum), a label that only one operand has and the output lacks is summed at
once, and operands are contracted left to right, each pair as one batched matrix product (the
shared labels the output or a later operand keeps are the batch, the other shared labels the
contraction) -- so the gradient is that of reshape, transpose, sum and matmul."""
from __future__ import annotations

import math
import string
from typing import Sequence

from tracer.ir import types as irtypes
from tracer.creation import iota
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.layout import fresh
from tracer.tensor import Tensor


def _terms(equation: str, operands: Sequence[Tensor]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels and the output's, with '...' spelled out as labels of their own
    ('.0', '.1', ...: the broadcast dimensions, aligned at the right as numpy aligns them)."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ArgumentError(f"einsum: the equation {equation!r} names {len(terms)} operands, "
                            f"{len(operands)} were given")
    for term in terms + [output]:
        letters = term.replace("...", "")
        if any(c not in string.ascii_letters for c in letters) or term.count("...") > 1:
            raise ArgumentError(f"einsum: invalid term {term!r} in {equation!r} (letters and at "
                                f"most one '...')")
    spans = []
    for term, operand in zip(terms, operands):
        named = len(term.replace("...", ""))
        span = operand.ndim - named
        if span < 0 or ("..." not in term and span != 0):
            raise ShapeMismatchError(f"einsum: the term {term!r} does not fit an operand of "
                                     f"{operand.ndim} dimensions")
        spans.append(span)
    width = max(spans, default=0)
    ellipsis = [f".{k}" for k in range(width)]

    def labels(term: str, span: int) -> list[str]:
        before, dots, after = term.partition("...")
        return list(before) + (ellipsis[width - span:] if dots else []) + list(after)

    operand_labels = [labels(term, span) for term, span in zip(terms, spans)]
    if arrow:
        output_labels = labels(output, width)
        if len(set(output_labels)) != len(output_labels):
            raise ArgumentError(f"einsum: the output {output!r} names a label twice")
        known = {label for labels_ in operand_labels for label in labels_}
        missing = [label for label in output_labels if label not in known and label[0] != "."]
        if missing:
            raise ArgumentError(f"einsum: output labels {missing} appear in no operand")
    else:  # implicit: the broadcast dimensions, then the labels that appear once, in order
        counts: dict[str, int] = {}
        for label in (label for labels_ in operand_labels for label in labels_):
            counts[label] = counts.get(label, 0) + 1
        output_labels = ellipsis + sorted(label for label, count in counts.items()
                                          if count == 1 and label[0] != ".")
    return operand_labels, output_labels


def _diagonals(x: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
    """x with each repeated label reduced to its diagonal: `ii` -> `i`."""
    while len(set(labels)) != len(labels):
        label = next(label for label in labels if labels.count(label) > 1)
        first = labels.index(label)
        second = labels.index(label, first + 1)
        if x.shape[first] != x.shape[second]:
            raise ShapeMismatchError(f"einsum: label {label!r} has sizes {x.shape[first]} and "
                                     f"{x.shape[second]} in one operand")
        on_diagonal = iota(x.shape, first) == iota(x.shape, second)
        x = (x * on_diagonal.to(x.dtype)).sum(second)
        labels = labels[:second] + labels[second + 1:]
    return x, labels


def _arranged(x: Tensor, labels: list[str], groups: list[list[str]],
              sizes: dict[str, int]) -> Tensor:
    """x permuted to the labels of `groups` in order, broadcast to their sizes, each group one
    dimension."""
    order = [label for group in groups for label in group]
    x = x.permute(*[labels.index(label) for label in order]) if order != labels else x
    x = x.expand(*[sizes[label] for label in order])
    return x.reshape(*[math.prod(sizes[label] for label in group) for group in groups])


def _contract(a: Tensor, a_labels: list[str], b: Tensor, b_labels: list[str], keep: set[str],
              sizes: dict[str, int]) -> tuple[Tensor, list[str]]:
    """The product of a and b summed over the labels they share that `keep` lacks."""
    batch = [label for label in a_labels if label in b_labels and label in keep]
    summed = [label for label in a_labels if label in b_labels and label not in keep]
    left = [label for label in a_labels if label not in b_labels]
    right = [label for label in b_labels if label not in a_labels]
    if irtypes.is_float(a.dtype):
        product = _arranged(a, a_labels, [batch, left, summed], sizes).matmul(
            _arranged(b, b_labels, [batch, summed, right], sizes))
    else:  # (no integer matrix product: a broadcast product and a sum)
        product = (_arranged(a, a_labels, [batch, left, summed, []], sizes)
                   * _arranged(b, b_labels, [batch, [], summed, right], sizes)).sum(2)
    labels = batch + left + right
    return product.reshape(*[sizes[label] for label in labels]), labels


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation, as torch.einsum: `tr.einsum("bij,bjk->bik", x, y)`; the operands may
    also come as one list. Labels are letters; '...' stands for broadcast dimensions."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(x, Tensor) for x in operands):
        raise ArgumentError("einsum takes an equation and one or more tensors")
    if len({x.dtype for x in operands}) > 1:
        # (PyTorch's einsum refuses them too, except where its sizes let it multiply
        # elementwise, which promotes)
        dtypes = sorted({str(x.dtype) for x in operands})
        raise ArgumentError(f"einsum operands have dtypes {dtypes}; convert them to one "
                            f"(.to(...)), as PyTorch requires")
    operand_labels, output_labels = _terms(equation, operands)
    sizes: dict[str, int] = {}
    for x, labels in zip(operands, operand_labels):
        for label, size in zip(labels, x.shape):
            known = sizes.get(label, 1)
            if size != 1 and known != 1 and size != known:
                raise ShapeMismatchError(f"einsum: label {label!r} has sizes {known} and {size}")
            sizes[label] = max(known, size) if size and known else 0
    pending = [_diagonals(x, list(labels)) for x, labels in zip(operands, operand_labels)]
    result, labels = None, []
    for position, (x, x_labels) in enumerate(pending):
        later = {label for _, rest in pending[position + 1:] for label in rest}
        keep = later | set(output_labels)
        # a label of this operand alone that nothing after needs: summed now
        alone = [d for d, label in enumerate(x_labels) if label not in keep and label not in labels]
        if alone:
            x = x.sum(alone)
            x_labels = [label for d, label in enumerate(x_labels) if d not in alone]
        if result is None:
            result, labels = x, x_labels
        else:
            result, labels = _contract(result, labels, x, x_labels, keep, sizes)
    result = _arranged(result, labels, [[label] for label in output_labels], sizes)
    return fresh(result.clone() if result is operands[0] else result)
