"""`tr.nn.functional`: PyTorch's functional layers and losses, as compositions of primitives.

Integer labels and embedding indices pick their entries with the gather primitive (its gradient
is a scatter-add). Out-of-range labels and indices raise `tr.IndexOutOfRangeError`, eagerly and
from compiled code (whose index checks are always on); negative ones too, as in PyTorch (gather
and index_select refuse them, where indexing `x[i]` counts them from the end).
"""
from __future__ import annotations

import builtins
import warnings

from tracer.ir import types as irtypes
from tracer.context import state
from tracer.errors import (ArgumentError, IndexOutOfRangeError, ShapeMismatchError, TracerWarning,
                           TracingError)
from tracer import derivatives
from tracer.variance import row_mean
from tracer.ops import logsumexp as _logsumexp
from tracer.arithmetic import where
from tracer.creation import iota
from tracer.dimensions import normalize_dim as _normalize_dim
from tracer.dispatch import as_tensor
from tracer.layout import fresh as _fresh
from tracer.layout import reshaped as _reshaped
from tracer.symbolic_zeros import zeros_made as _zeros_made
from tracer.tensor import Tensor
from tracer.nn import attention as _attention
from tracer.nn import convolution as _convolution
from tracer.nn import dropout as _dropout
from tracer.nn import embedding_bag as _embedding_bag
from tracer.nn import embedding_rows as _embedding_rows
from tracer.nn import normalization as _normalization
from tracer.nn import norms as _norms
from tracer.nn import pooling as _pooling
from tracer.nn import pooling1d as _pooling1d
from tracer.nn import interpolation as _interpolation
from tracer.nn import rearrangement as _rearrangement
from tracer.nn import channel_dropout as _channel_dropout
from tracer.nn import activations as _activations
from tracer.nn.loss_reduction import check_reduction as _check_reduction
from tracer.nn.loss_reduction import reduce as _reduce
from tracer.nn import loss_functions as _loss_functions
from tracer.nn import fused_losses as _fused
from tracer.nn import distances as _distances


def relu(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return input.relu_() if inplace else input.relu()


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x): with `approximate="none"` through erfc (written x/2 * erfc(-x/sqrt 2), which
    stays accurate where 1 + erf(x/sqrt 2) would cancel), with "tanh" PyTorch's tanh form; the
    gradient is PyTorch's (tracer/derivatives.py)."""
    if approximate not in ("none", "tanh"):
        raise ArgumentError(f"gelu: approximate is 'none' or 'tanh', got {approximate!r}")
    return derivatives.gelu(input, approximate)


def silu(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    result = derivatives.silu(input)
    return input.copy_(result) if inplace else result


def tanh(input: Tensor) -> Tensor:
    return input.tanh()


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold, as PyTorch's."""
    scaled = input * beta
    linear = scaled > threshold
    # (exp of the linear part's 0, not of beta x: its overflow would make the gradient 0 * inf)
    return where(linear, input, where(linear, 0.0, scaled).exp().log1p() / beta)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: builtins.bool = False) -> Tensor:
    """x clamped to [min_val, max_val]; as PyTorch's, the gradient passes only strictly inside
    (and at nan)."""
    if min_val > max_val:
        raise ArgumentError(f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    inside = ~((input <= min_val) | (input >= max_val))
    result = where(inside, input, input.detach().clamp(min_val, max_val))
    return input.copy_(result) if inplace else result


def relu6(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


def sigmoid(input: Tensor) -> Tensor:
    return input.sigmoid()


def _softmax_dim(input: Tensor, dim) -> int:
    # PyTorch's choice when dim is left out (it warns that the choice is implicit).
    return (0 if input.ndim in (0, 1, 3) else 1) if dim is None else dim


def softmax(input: Tensor, dim=None, dtype=None) -> Tensor:
    input = input if dtype is None else input.to(dtype)
    return input.softmax(_softmax_dim(input, dim))


def log_softmax(input: Tensor, dim=None, dtype=None) -> Tensor:
    """log(softmax): computed as x - max - log(sum(exp(x - max))), stable for large inputs."""
    input = input if dtype is None else input.to(dtype)
    return input.log_softmax(_softmax_dim(input, dim))


def softmin(input: Tensor, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """softmax(-input) along `dim`."""
    input = input if dtype is None else input.to(dtype)
    return (-input).softmax(_softmax_dim(input, dim))


def logsumexp(input: Tensor, dim, keepdim: builtins.bool = False) -> Tensor:
    return _logsumexp(input, dim, keepdim)


def _class_dim(input: Tensor) -> int:
    return 1 if input.ndim >= 2 else 0


def _check_labels(labels: Tensor, count: int, what: str, ignore_index=None) -> None:
    """Eagerly, labels outside [0, count) (other than `ignore_index`) are an error, as in PyTorch."""
    if state.trace is not None or labels._trace is not None:
        return
    values = labels._eager_array(what)
    bad = (values < 0) | (values >= count)
    if ignore_index is not None:
        bad &= values != ignore_index
    if bad.any():
        raise IndexOutOfRangeError(f"{what}: {values[bad].reshape(-1)[0]} is out of range for "
                            f"{count} classes")


def _class_weights(weight: Tensor, input: Tensor, axis: int) -> Tensor:
    """`weight`, one per class of `input`, in its dtype."""
    classes = input.shape[axis]
    if weight.shape != (classes,):
        raise ShapeMismatchError(f"weight of shape {list(weight.shape)} for {classes} classes")
    return weight.to(input.dtype)


def _along(weight: Tensor, input: Tensor, axis: int) -> Tensor:
    """The class weights shaped to broadcast along the class dimension of `input`."""
    return weight.reshape(weight.shape + (1,) * (input.ndim - axis - 1))


def _checked_labels(input: Tensor, target, ignore_index: int) -> Tensor:
    """`target` as int64 class labels, one per position of `input` outside its class dimension,
    each in range or `ignore_index` (else the error PyTorch raises)."""
    target = as_tensor(target)
    axis = _class_dim(input)
    if target.dtype != irtypes.int64:
        raise ArgumentError(f"nll_loss needs int64 class labels, got {target.dtype}; use .long()")
    if input.ndim == 0 or target.shape != input.shape[:axis] + input.shape[axis + 1:]:
        raise ShapeMismatchError(f"labels of shape {list(target.shape)} do not fit an input of "
                                 f"shape {list(input.shape)} (classes along dimension {axis})")
    _check_labels(target, input.shape[axis], "nll_loss label", ignore_index)
    return target


def _picked_losses(input: Tensor, target: Tensor, weight: Tensor | None,
                   ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per label: -weight * input at the label (0 where ignored), the label's weight (what the
    mean divides by) and whether it counts."""
    target = _checked_labels(input, target, ignore_index)
    axis = _class_dim(input)
    counted = target != ignore_index
    index = where(counted, target, 0)  # gather refuses a negative label, as PyTorch's losses
    picked = input.gather(axis, index.unsqueeze(axis)).squeeze(axis)
    weights = (counted.to(input.dtype) if weight is None
               else where(counted, _class_weights(weight, input, axis)[index], 0.0))
    losses = where(counted, -picked * weights, 0.0)
    return losses, weights, counted


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """The negative log-likelihood of integer class labels, given log-probabilities `input` of
    shape (N, C, ...) or (C,); the mean is weighted by the labels' weights."""
    _check_reduction(reduction, size_average, reduce)
    target = as_tensor(target)
    if _fused.applies(input, target, weight):
        return _fused.nll_loss(input, _checked_labels(input, target, ignore_index),
                               None if weight is None else _class_weights(weight, input, 1),
                               ignore_index, reduction)
    losses, weights, _ = _picked_losses(input, target, weight, ignore_index)
    return _reduce(losses, reduction, weights.sum())


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of logits `input` (N, C, ...) or (C,) against integer class labels
    or, with a float `target` of the input's shape, class probabilities. `label_smoothing` mixes
    the uniform distribution into the targets, as PyTorch does."""
    _check_reduction(reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentError(f"label_smoothing must be between 0 and 1, got {label_smoothing}")
    axis = _class_dim(input)
    target = as_tensor(target)
    if (not irtypes.is_float(target.dtype) and label_smoothing == 0.0
            and _fused.applies(input, target, weight)):
        return _fused.cross_entropy(
            input, _checked_labels(input, target, ignore_index),
            None if weight is None else _class_weights(weight, input, axis), ignore_index,
            reduction)
    log_probabilities = input.log_softmax(axis)
    along = (_along(_class_weights(weight, input, axis), input, axis)
             if input.ndim and weight is not None else None)
    classes = input.shape[axis] if input.ndim else 0
    if not irtypes.is_float(target.dtype):
        losses, weights, counted = _picked_losses(log_probabilities, target, weight, ignore_index)
        loss = _reduce(losses, reduction, weights.sum())
        if label_smoothing == 0.0:
            return loss
        weighted = log_probabilities if along is None else log_probabilities * along
        uniform = where(counted, -weighted.sum(axis), 0.0)
        return ((1 - label_smoothing) * loss
                + _reduce(uniform, reduction, weights.sum()) * (label_smoothing / classes))
    if target.shape != input.shape:
        raise ShapeMismatchError(f"probability targets of shape {list(target.shape)} for an input "
                                 f"of shape {list(input.shape)}; they must be equal")
    if label_smoothing != 0.0:
        target = target * (1 - label_smoothing) + label_smoothing / classes
    products = log_probabilities * target
    losses = -(products if along is None else products * along).sum(axis)
    return _reduce(losses, reduction)


def _warn_if_broadcast(input: Tensor, target: Tensor) -> None:
    """PyTorch's warning where an elementwise loss broadcasts a target of another shape (a
    model's [N, 1] output against [N] labels makes an [N, N] loss that trains on the wrong
    thing): a port must not lose it."""
    if tuple(as_tensor(target).shape) != tuple(input.shape):
        warnings.warn(f"Using a target size ({list(as_tensor(target).shape)}) that is different "
                      f"to the input size ({list(input.shape)}). This will likely lead to "
                      f"incorrect results due to broadcasting. Please ensure they have the same "
                      f"size.", TracerWarning, stacklevel=3)


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
             reduction: str = "mean") -> Tensor:
    _check_reduction(reduction, size_average, reduce)
    _warn_if_broadcast(input, target)
    difference = input - target
    losses = _reduce(difference * difference, reduction)
    # (PyTorch's mse_loss_backward makes zeros of a symbolic zero for every reduction, as the
    # mean's division does)
    return losses if reduction == "mean" else _zeros_made(losses)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
            reduction: str = "mean") -> Tensor:
    _check_reduction(reduction, size_average, reduce)
    _warn_if_broadcast(input, target)
    return _reduce((input - target).abs(), reduction)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last len(normalized_shape) dimensions (biased variance), then scale
    and shift."""
    normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                        else tuple(normalized_shape))
    count = len(normalized_shape)
    if count == 0 or input.shape[input.ndim - count:] != normalized_shape:
        raise ShapeMismatchError(f"layer_norm over {list(normalized_shape)} for an input of shape "
                                 f"{list(input.shape)}: its last dimensions must match")
    dims = tuple(range(input.ndim - count, input.ndim))
    centered = input - row_mean(input, dims)
    variance = (centered * centered).mean(dims, keepdim=True)
    result = centered * (1.0 / (variance + eps).sqrt())
    if weight is not None:
        result = result * weight
    return result if bias is None else result + bias


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """input @ weight.T + bias, weight of shape (out_features, in_features)."""
    result = input.matmul(weight.t())
    return result if bias is None else result + bias


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 indicators of shape tensor.shape + (num_classes,); -1 takes max + 1 (eager only)."""
    if tensor.dtype != irtypes.int64:
        raise ArgumentError(f"one_hot needs an int64 tensor, got {tensor.dtype}")
    if num_classes < 0:
        if state.trace is not None:
            raise TracingError("one_hot inside a traced function needs num_classes= (the largest "
                               "label is only known when the compiled function runs)")
        num_classes = int(tensor._eager_array("one_hot").max(initial=-1)) + 1
    _check_labels(tensor, num_classes, "one_hot class value")
    shape = tensor.shape + (num_classes,)
    return (tensor.unsqueeze(-1) == iota(shape, tensor.ndim)).to(irtypes.int64)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: builtins.bool = False, sparse: builtins.bool = False) -> Tensor:
    """The rows of `weight` at the int64 indices `input`; the row `padding_idx` gets no gradient.
    `max_norm` first scales down, in place, the rows indexed whose `norm_type`-norm exceeds it;
    `scale_grad_by_freq` divides each row's gradient by its index's count in `input`."""
    if input.dtype != irtypes.int64:
        raise ArgumentError(f"embedding needs int64 indices, got {input.dtype}")
    _embedding_rows.check_sparse(sparse, "embedding")
    rows = weight.shape[0]
    _check_labels(input, rows, "embedding index")
    indices = _reshaped(input, -1)
    if max_norm is not None:
        _embedding_rows.renormalize(weight, indices, max_norm, norm_type)
    if padding_idx is not None:
        padding_idx = _normalize_dim(padding_idx, rows)
        padding = iota((rows, 1), 0) == padding_idx
        weight = where(padding, weight.detach(), weight)
    # index_select refuses negative indices, as PyTorch's embedding does (weight[input] would
    # count them from the end)
    rows = weight.index_select(0, indices)
    if scale_grad_by_freq:
        rows = _embedding_rows.scaled_by_frequency(rows, indices, weight.shape[0])
    # a new tensor, as PyTorch's (not a view-copy of the reshape)
    return _fresh(_reshaped(rows, *input.shape, *weight.shape[1:]))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """The dimensions start_dim..end_dim (inclusive) merged into one."""
    if input.ndim == 0:
        return input.reshape(1)
    start, end = _normalize_dim(start_dim, input.ndim), _normalize_dim(end_dim, input.ndim)
    if start > end:
        raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return input.reshape(*input.shape[:start], -1, *input.shape[end + 1:])


# The layers defined in their own modules.
conv1d, conv2d = _convolution.conv1d, _convolution.conv2d
conv_transpose2d, pad = _convolution.conv_transpose2d, _convolution.pad
max_pool2d, avg_pool2d = _pooling.max_pool2d, _pooling.avg_pool2d
adaptive_avg_pool2d, batch_norm = _pooling.adaptive_avg_pool2d, _normalization.batch_norm
dropout, scaled_dot_product_attention = _dropout.dropout, _attention.scaled_dot_product_attention
max_pool1d, avg_pool1d = _pooling1d.max_pool1d, _pooling1d.avg_pool1d
adaptive_avg_pool1d = _pooling1d.adaptive_avg_pool1d
adaptive_max_pool1d, adaptive_max_pool2d = (_pooling1d.adaptive_max_pool1d,
                                            _pooling1d.adaptive_max_pool2d)
interpolate = _interpolation.interpolate
pixel_shuffle, pixel_unshuffle = _rearrangement.pixel_shuffle, _rearrangement.pixel_unshuffle
channel_shuffle = _rearrangement.channel_shuffle
unfold, fold = _rearrangement.unfold, _rearrangement.fold
dropout1d, dropout2d = _channel_dropout.dropout1d, _channel_dropout.dropout2d
embedding_bag = _embedding_bag.embedding_bag
group_norm, instance_norm, rms_norm = _norms.group_norm, _norms.instance_norm, _norms.rms_norm
leaky_relu, elu, selu, celu = (_activations.leaky_relu, _activations.elu, _activations.selu,
                               _activations.celu)
mish, hardswish, hardsigmoid = _activations.mish, _activations.hardswish, _activations.hardsigmoid
logsigmoid, softsign, tanhshrink = (_activations.logsigmoid, _activations.softsign,
                                    _activations.tanhshrink)
threshold, glu, prelu = _activations.threshold, _activations.glu, _activations.prelu
binary_cross_entropy = _loss_functions.binary_cross_entropy
binary_cross_entropy_with_logits = _loss_functions.binary_cross_entropy_with_logits
kl_div, huber_loss = _loss_functions.kl_div, _loss_functions.huber_loss
smooth_l1_loss, soft_margin_loss = _loss_functions.smooth_l1_loss, _loss_functions.soft_margin_loss
cosine_embedding_loss = _loss_functions.cosine_embedding_loss
margin_ranking_loss = _loss_functions.margin_ranking_loss
normalize, cosine_similarity = _distances.normalize, _distances.cosine_similarity
pairwise_distance = _distances.pairwise_distance
