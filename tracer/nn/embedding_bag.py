"""`tr.nn.functional.embedding_bag`: PyTorch's sums, means and maxima of bags of embedding rows,
for bags of equal length (a 2-D input) or given by `offsets` into a 1-D input.

Sums and means of bags of equal length reduce the gathered rows (bags, length, dim) along the
length. Bags given by offsets stay in one flat list of rows, each marked with its bag (a
cumulative sum of marks at the offsets, so that the offsets can be runtime values of a traced
function): sums and means add each row into its bag with index_add, O(rows) whatever the number
of bags. Maxima (of bags of equal length too) take a running maximum along the rows that
restarts at each bag's first row (the scan of tracer/cumulative.py) and read it at each bag's
last row: PyTorch's maximum, which takes ties and nans in its own way (see _bag_maxima). Rows
at `padding_idx` are left out of their bag (of its mean's count too) and empty bags give zeros,
as in PyTorch."""
from __future__ import annotations

import builtins

from tracer.arithmetic import where
from tracer.context import state
from tracer.creation import full, iota, ones, zeros
from tracer.cumulative import _scan as scan
from tracer.dimensions import normalize_dim
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError, IndexOutOfRangeError, ShapeMismatchError
from tracer.functional import cat
from tracer.ir import types as irtypes
from tracer.layout import fresh
from tracer.nn.embedding_rows import check_sparse, renormalize, scaled_by_frequency
from tracer.tensor import Tensor

_MODES = ("sum", "mean", "max")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None,
                  max_norm: float | None = None, norm_type: float = 2.0,
                  scale_grad_by_freq: builtins.bool = False, mode: str = "mean",
                  sparse: builtins.bool = False, per_sample_weights: Tensor | None = None,
                  include_last_offset: builtins.bool = False,
                  padding_idx: int | None = None) -> Tensor:
    """The `mode` ('sum', 'mean' or 'max') of each bag of rows of `weight` (num, dim): the rows
    of a 2-D `input` (bags, length), or of a 1-D `input` cut at `offsets` (each bag's first
    position; with `include_last_offset`, one more: the end of the last bag). `per_sample_weights`
    (input's shape, mode 'sum') scales each row. Returns (bags, dim)."""
    check_options(mode, scale_grad_by_freq, sparse)
    input = as_tensor(input)
    if weight.ndim != 2:
        raise ShapeMismatchError(f"embedding_bag: weight has to be 2-D (num_embeddings, "
                                 f"embedding_dim), got shape {list(weight.shape)}")
    if input.dtype != irtypes.int64:
        raise ArgumentError(f"embedding_bag needs int64 indices, got {input.dtype}")
    if per_sample_weights is not None:
        per_sample_weights = _checked_sample_weights(per_sample_weights, input, weight, mode)
    if padding_idx is not None:
        padding_idx = normalize_dim(padding_idx, weight.shape[0])
    if input.ndim == 2:
        if offsets is not None:
            raise ArgumentError("embedding_bag: a 2-D input is a batch of bags of its length; "
                                "offsets has to be None")
    elif input.ndim != 1:
        raise ShapeMismatchError(f"embedding_bag: input has to be 1-D or 2-D, got shape "
                                 f"{list(input.shape)}")
    elif offsets is None or as_tensor(offsets).ndim != 1:
        raise ArgumentError("embedding_bag: a 1-D input needs offsets, a 1-D tensor of each "
                            "bag's first position")
    else:
        offsets = as_tensor(offsets)
        _check_offsets(offsets, input.shape[0], include_last_offset)
    if max_norm is not None:
        renormalize(weight, input.reshape(-1), max_norm, norm_type)
    if input.ndim == 2 and mode != "max":
        return _equal_bags(input, weight, mode, per_sample_weights, padding_idx,
                           scale_grad_by_freq)
    if input.ndim == 2:  # as bags at offsets, for PyTorch's maxima (_bag_maxima), not a reduction's
        bags, length = input.shape
        input, offsets, include_last_offset = input.reshape(-1), iota((bags,), 0) * length, False
    # (a new tensor, as PyTorch's: not the view-copy of the slice that drops the extra bag)
    return fresh(_offset_bags(input, weight, offsets, mode, per_sample_weights,
                              include_last_offset, padding_idx, scale_grad_by_freq))


def check_options(mode: str, scale_grad_by_freq: builtins.bool, sparse: builtins.bool) -> None:
    """The mode, and a refusal of what PyTorch refuses and of sparse gradients."""
    if mode not in _MODES:
        raise ArgumentError(f"embedding_bag: mode is one of {list(_MODES)}, got {mode!r}")
    if scale_grad_by_freq and mode == "max":
        raise ArgumentError("embedding_bag: mode='max' does not scale the gradient by the "
                            "frequency (as in PyTorch); use mode 'sum' or 'mean', or leave "
                            "scale_grad_by_freq False")
    check_sparse(sparse, "embedding_bag")


def _checked_sample_weights(weights, input: Tensor, weight: Tensor, mode: str) -> Tensor:
    weights = as_tensor(weights)
    if mode != "sum":
        raise ArgumentError(f"embedding_bag: per_sample_weights is only supported for "
                            f"mode='sum' (got mode={mode!r}), as in PyTorch")
    if weights.shape != input.shape:
        raise ShapeMismatchError(f"embedding_bag: per_sample_weights of shape "
                                 f"{list(weights.shape)} for an input of shape "
                                 f"{list(input.shape)}; they must be equal")
    if weights.dtype != weight.dtype:
        raise ArgumentError(f"embedding_bag: per_sample_weights is {weights.dtype}, the weight "
                            f"{weight.dtype}; convert it with .to({weight.dtype})")
    return weights


def _check_offsets(offsets: Tensor, length: int, include_last_offset: builtins.bool) -> None:
    """PyTorch's rules for offsets, checked eagerly (a traced function's offsets are runtime
    values: there an offset out of range is an index error from the compiled code)."""
    if offsets.dtype != irtypes.int64:
        raise ArgumentError(f"embedding_bag needs int64 offsets, got {offsets.dtype}")
    if include_last_offset and offsets.shape[0] == 0:
        raise ShapeMismatchError("embedding_bag: with include_last_offset=True, offsets holds "
                                 "at least the end of the last bag")
    if state.trace is not None or offsets._trace is not None or offsets.shape[0] == 0:
        return
    values = offsets._eager_array("embedding_bag offsets")
    if values[0] != 0:
        raise IndexOutOfRangeError(f"embedding_bag: offsets[0] has to be 0 (the first bag starts "
                                   f"at the input's first position), got {values[0]}")
    if values[-1] > length:
        raise IndexOutOfRangeError(f"embedding_bag: offsets[-1] can not be greater than the "
                                   f"input's length {length}, got {values[-1]}")
    if include_last_offset and values[-1] != length:
        # (PyTorch's float kernel then ends the last bag there, its double kernel at the end)
        raise IndexOutOfRangeError(f"embedding_bag: with include_last_offset=True, offsets[-1] "
                                   f"is the input's length {length} (the CSR format), got "
                                   f"{values[-1]}")
    if (values[1:] < values[:-1]).any():
        raise IndexOutOfRangeError(f"embedding_bag: offsets must not decrease, got "
                                   f"{values.tolist()}")


def _rows_and_scales(input: Tensor, weight: Tensor, per_sample_weights: Tensor | None,
                     padding_idx: int | None, by_frequency: builtins.bool
                     ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The rows of `weight` at the flattened `input` (their gradients divided by their indices'
    counts if `by_frequency`), each row's scale (None: all 1) and whether it counts (None: all
    do), for rows at padding_idx 0 and False."""
    indices = input.reshape(-1)
    rows = weight.index_select(0, indices)  # (which refuses negative indices)
    if by_frequency:
        rows = scaled_by_frequency(rows, indices, weight.shape[0])
    kept = None if padding_idx is None else (input != padding_idx).reshape(-1)
    scales = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    if kept is not None:
        counted = kept.to(weight.dtype)
        scales = counted if scales is None else where(kept, scales, 0.0)
    return rows, scales, kept


def _equal_bags(input: Tensor, weight: Tensor, mode: str, per_sample_weights: Tensor | None,
                padding_idx: int | None, by_frequency: builtins.bool) -> Tensor:
    bags, length = input.shape
    rows, scales, kept = _rows_and_scales(input, weight, per_sample_weights, padding_idx,
                                          by_frequency)
    rows = rows.reshape(bags, length, weight.shape[1])
    if kept is not None:
        kept = kept.reshape(bags, length, 1)
    total = (rows if scales is None else rows * scales.reshape(bags, length, 1)).sum(1)
    if mode == "sum":
        return total
    counts = (kept.to(weight.dtype).sum(1) if kept is not None
              else ones(bags, 1, dtype=weight.dtype) * length)
    return total / counts.clamp(min=1)  # (an empty bag's mean is 0, as in PyTorch)


def _bag_of_each_row(offsets: Tensor, length: int) -> Tensor:
    """Each position's bag: the number of offsets at or before it, less one (positions after
    an include_last_offset end fall in one more bag, which the caller drops)."""
    marks = zeros(length + 1, dtype=irtypes.int64).index_add(
        0, offsets, ones(offsets.shape[0], dtype=irtypes.int64))
    return marks[:length].cumsum(0) - 1


def _offset_bags(input: Tensor, weight: Tensor, offsets: Tensor, mode: str,
                 per_sample_weights: Tensor | None, include_last_offset: builtins.bool,
                 padding_idx: int | None, by_frequency: builtins.bool) -> Tensor:
    length, dimension = input.shape[0], weight.shape[1]
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    rows, scales, kept = _rows_and_scales(input, weight, per_sample_weights, padding_idx,
                                          by_frequency)
    bag = _bag_of_each_row(offsets, length)
    counted = ones(length, dtype=weight.dtype) if kept is None else kept.to(weight.dtype)
    counts = zeros(bags + 1, dtype=weight.dtype).index_add(0, bag, counted)[:bags, None]
    if mode == "max":
        ends = (offsets[1:] if include_last_offset
                else cat([offsets[1:], full((1,), length, dtype=irtypes.int64)]))
        return where(counts > 0, _bag_maxima(rows, kept, bag, ends), 0.0)
    sources = rows if scales is None else rows * scales[:, None]
    totals = zeros(bags + 1, dimension, dtype=weight.dtype).index_add(0, bag, sources)[:bags]
    return totals if mode == "sum" else totals / counts.clamp(min=1)


def _segment_maximum(earlier: tuple, later: tuple) -> tuple:
    """PyTorch's running maximum of a bag, over (starts a bag, has a counted row, the first
    counted row's value, the largest value other than nan): the later part alone where a bag
    starts in it; on ties the earlier row, which then gets the gradient, as PyTorch's."""
    (earlier_start, earlier_counted, earlier_first, earlier_maximum) = earlier
    (later_start, later_counted, later_first, later_maximum) = later
    return (earlier_start | later_start,
            where(later_start, later_counted, earlier_counted | later_counted),
            where(later_start | ~earlier_counted, later_first, earlier_first),
            where(later_start | (later_maximum > earlier_maximum), later_maximum,
                  earlier_maximum))


def _bag_maxima(rows: Tensor, kept: Tensor | None, bag: Tensor, ends: Tensor) -> Tensor:
    """Each bag's maximum as PyTorch's kernel takes it: its first counted row, replaced by each
    later row greater than it. So a nan there is the result, and a later nan is passed over
    (nan > x is false). Read at `ends` less one (each bag's last position; any value for a bag
    without counted rows: the caller puts zeros)."""
    length, dimension = rows.shape
    if length == 0:
        return zeros(ends.shape[0], dimension, dtype=rows.dtype)
    shape = (length, dimension)
    counted = (ones(*shape, dtype=irtypes.bool_) if kept is None
               else kept[:, None].expand(*shape))
    ignored = rows.isnan() if kept is None else rows.isnan() | ~counted
    starts = (bag != cat([bag[:1] - 1, bag[:-1]]))[:, None].expand(*shape)
    summaries = (starts, counted, rows, where(ignored, float("-inf"), rows))
    identity = (False, False, float("-inf"), float("-inf"))
    _, _, first, maximum = (summary.index_select(0, (ends - 1).clamp(min=0)) for summary in
                            scan(summaries, 0, _segment_maximum, identity))
    return where(first.isnan(), first, maximum)
