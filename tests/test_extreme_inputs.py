"""Every differentiable function of the public API at extreme inputs (issue 14): values and
gradients against PyTorch, eagerly, traced (conftest.py checks every compiled call against the
reference interpreter) and in the reference interpreter running the traced gradient graph itself.

The extreme values -- ±0, subnormals, ±1, ±20, ±88.7, ±89, ±100, ±1e4, ±inf, nan, and in float64
also the edges of its exp (±709.7, ±710, ±745) -- go into one tensor per function and dtype (all
pairs of them for binary functions, rows of them for reductions), so each function compiles once
per dtype. A formula that overflows where PyTorch's does not (1 / (1 + exp(-x)) differentiated
through exp gives 0 * inf = nan at x = -100) shows as a NaN where PyTorch has a number.

Compared: NaN where PyTorch gives NaN and only there, infinities of the same sign, finite values
to a few ulp of float32 or float64 relative to PyTorch's (sums and rows relative to their largest
term). The sign of a zero is not compared.

COVERAGE lists how each public name is covered: by a case here, as an alias or in-place form of
a covered name, or as not differentiable (with the reason); test_every_public_function_is_covered
fails for a new public function that is in none of them.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import ir
from tracer.runtime.arguments import parameter_arrays
from tracer.runtime.pipeline import stage_text

DTYPES = [np.float32, np.float64]
SUBNORMAL = {np.float32: (1e-45, 1e-40), np.float64: (5e-324, 1e-310)}


def extreme_values(dtype) -> np.ndarray:
    magnitudes = [0.0, *SUBNORMAL[dtype], 0.5, 1.0, 2.5, 20.0, 88.7, 89.0, 100.0, 1e4, np.inf]
    if dtype == np.float64:
        magnitudes += [709.7, 710.0, 745.0]
    values = [m for m in magnitudes] + [-m for m in magnitudes] + [np.nan]
    return np.array(values, dtype)


def pairs(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every extreme value against every other one, as two flat arrays."""
    values = extreme_values(dtype)
    x, y = np.meshgrid(values, values, indexing="ij")
    return x.reshape(-1), y.reshape(-1)


def rows(dtype) -> np.ndarray:
    """Rows of three: each pair of extreme values with an ordinary 0.5, and constant rows."""
    values = extreme_values(dtype)
    x, y = pairs(dtype)
    mixed = np.stack([x, y, np.full_like(x, 0.5)], axis=1)
    constant = np.repeat(values[:, None], 3, axis=1)
    return np.concatenate([mixed, constant])


def moderate(dtype, shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


@dataclasses.dataclass
class Case:
    """`run(lib, *tensors)` with lib the tracer or the torch module (their APIs have the same
    names); `inputs(dtype)` the arrays, each differentiated."""
    run: Callable
    inputs: Callable[[type], list[np.ndarray]]
    gradients: bool = True  # False: PyTorch does not differentiate it (values only)
    torch_run: Callable | None = None  # PyTorch's side, where it is not `run`


def unary(run):
    return Case(run, extreme_values_list)


def extreme_values_list(dtype) -> list[np.ndarray]:
    return [extreme_values(dtype)]


def sweep(dtype) -> list[np.ndarray]:
    """The slow run's inputs: a dense logarithmic sweep over the whole range of the dtype, both
    signs (where a formula starts to overflow or underflow between the extreme values)."""
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):
        magnitudes = np.geomspace(float(info.smallest_subnormal), float(info.max), 20000)
    return [np.concatenate([magnitudes, -magnitudes, extreme_values(dtype)]).astype(dtype)]


def below_hyperbolic_overflow(dtype) -> np.ndarray:
    """The extreme values but 89 (float32) and 710 (float64), where sinh and cosh are finite
    (tracer's, within 4 ulp: tests/test_api_names.py) and PyTorch's overflow for +x, not -x."""
    values = extreme_values(dtype)
    return values[~np.isin(np.abs(values), [89.0, 710.0])]


def binary(run):
    return Case(run, lambda dtype: list(pairs(dtype)))


def ternary(run):
    # the pairs, and a third operand cycling through the extreme values
    return Case(run, lambda dtype: [*pairs(dtype), np.resize(extreme_values(dtype),
                                                              pairs(dtype)[0].shape)])


def row(run):
    return Case(run, lambda dtype: [rows(dtype)])


def permuted_columns(shape) -> np.ndarray:
    """An int64 index of `shape` whose rows are rotations of 0, 1, ..., shape[1] - 1."""
    rows, columns = shape
    return (np.arange(columns)[None, :] + np.arange(rows)[:, None]) % columns


def labels(count: int, classes: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64) % classes


def cross_entropy_labels(lib, x, **options):
    return lib.nn.functional.cross_entropy(x, lib.tensor(labels(x.shape[0], x.shape[1])),
                                           reduction="none", **options)


def scaled(dtype):
    """±1e4 logits (as in a saturated classifier) next to ordinary ones, and the extreme rows."""
    x = rows(dtype)
    return [np.concatenate([x, np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4]], dtype)])]


RECURRENT = ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell")


def _recurrent_modules(lib, dtype) -> list:
    """Each recurrent module of `lib` (1 input, 2 hidden) with the same weights, powers of two
    (so that the input's products are exact and its sum with the bias rounds once, the same in
    both libraries, where a sum of products of the extreme values would cancel and round
    differently), made before any trace (a module's parameters are made outside traced
    functions), leaving the library's random generator as it was for the other tests."""
    modules, generator_state = [], lib.get_rng_state()
    for seed, kind in enumerate(RECURRENT):
        module = getattr(lib.nn, kind)(1, 2, dtype=getattr(lib, np.dtype(dtype).name))
        module.load_state_dict({name: lib.tensor(np.sign(weights) * 2.0 ** np.round(np.log2(
            np.abs(weights)))) for name, p in module.named_parameters()
            for weights in [moderate(dtype, tuple(p.shape), seed)]})
        modules.append(module)
    lib.set_rng_state(generator_state)
    return modules


RECURRENT_MODULES = {(lib, dtype): _recurrent_modules(lib, dtype) for lib in (tr, torch)
                     for dtype in DTYPES}


def recurrent(lib, x):
    """Each extreme value, then the one as far from the end, as a sequence of two steps (one
    sequence per value) for the modules; each value one step for the cells."""
    x, results = x.reshape(-1, 1), []
    dtype = np.dtype(str(x.dtype).removeprefix("torch.")).type
    for kind, module in zip(RECURRENT, RECURRENT_MODULES[lib, dtype]):
        if kind.endswith("Cell"):
            state = module(x)
            results += list(state) if isinstance(state, tuple) else [state]
        else:
            output, state = module(lib.stack([x, x.flip(0)]))
            results += [output[-1], *(state if isinstance(state, tuple) else (state,))]
    return tuple(result[-1] if result.ndim == 3 else result for result in results)


def paired_modules(name: str, *args, **kwargs) -> Callable:
    """`module(lib, x)`: torch's module `name` in eval mode, or tracer's with torch's parameters,
    of x's dtype; made here, as a traced function cannot make a Parameter."""
    made = {}
    for dtype in map(np.dtype, DTYPES):
        torch.manual_seed(0)
        theirs = getattr(torch.nn, name)(*args, **kwargs).to(getattr(torch, dtype.name)).eval()
        ours = getattr(tr.nn, name)(*args, **kwargs).to(dtype.name).eval()
        ours.load_state_dict({key: tr.tensor(value.detach().numpy())
                              for key, value in theirs.state_dict().items()})
        made["torch", dtype.name], made["tracer", dtype.name] = theirs, ours
    return lambda lib, x: made[lib.__name__, str(x.dtype).removeprefix("torch.")]


def sequence_rows(dtype) -> list[np.ndarray]:
    """The rows of three by threes, each a sequence of three tokens of three features (the last
    rows left out if their count is no multiple of 3): the gradient of a token cancels terms of
    its sequence's magnitude, which the comparison's rows then are."""
    x = rows(dtype)
    return [x[:x.shape[0] // 3 * 3].reshape(-1, 9)]


def sequences(x):
    """sequence_rows' sequences as (L, N, E)."""
    return x.reshape(-1, 3, 3).transpose(0, 1)


def moderate_keys(lib, x):
    """Keys of moderate values for the sequences of x."""
    shape = tuple(sequences(x).shape)
    return lib.tensor(moderate(str(x.dtype).removeprefix("torch."), shape, seed=2))


ATTENTION = paired_modules("MultiheadAttention", 3, 1)
# (norm_first: the attention reads normalized values, whose scores stay moderate)
ENCODER_LAYER = paired_modules("TransformerEncoderLayer", 3, 1, 4, norm_first=True)
DECODER_LAYER = paired_modules("TransformerDecoderLayer", 3, 1, 4, norm_first=True,
                               activation="gelu")

# The cases: names as in PyTorch, "Tensor.x" for methods, "F.x" for tr.nn.functional.
CASES: dict[str, Case] = {
    # elementwise
    "Tensor.abs": unary(lambda lib, x: x.abs()),
    "Tensor.sign": unary(lambda lib, x: x.sign()),
    "Tensor.exp": unary(lambda lib, x: x.exp()),
    "Tensor.log": unary(lambda lib, x: x.log()),
    "Tensor.sqrt": unary(lambda lib, x: x.sqrt()),
    "Tensor.tanh": unary(lambda lib, x: x.tanh()),
    "Tensor.sigmoid": unary(lambda lib, x: x.sigmoid()),
    "Tensor.relu": unary(lambda lib, x: x.relu()),
    "Tensor.sin": unary(lambda lib, x: x.sin()),
    "Tensor.cos": unary(lambda lib, x: x.cos()),
    "Tensor.neg": unary(lambda lib, x: -x),
    "Tensor.erf": unary(lambda lib, x: x.erf()),
    "Tensor.erfc": unary(lambda lib, x: x.erfc()),
    "Tensor.floor": unary(lambda lib, x: x.floor()),
    # issue 18's compositions (tracer/math_functions.py)
    "Tensor.trunc": unary(lambda lib, x: x.trunc()),
    "Tensor.ceil": unary(lambda lib, x: x.ceil()),
    "Tensor.reciprocal": unary(lambda lib, x: x.reciprocal()),
    "Tensor.tan": unary(lambda lib, x: x.tan()),
    "Tensor.log2": unary(lambda lib, x: x.log2()),
    "Tensor.log10": unary(lambda lib, x: x.log10()),
    "Tensor.log1p": unary(lambda lib, x: x.log1p()),
    "Tensor.expm1": unary(lambda lib, x: x.expm1()),
    "Tensor.square": unary(lambda lib, x: x.square()),
    "Tensor.rsqrt": unary(lambda lib, x: x.rsqrt()),
    "Tensor.sinh": Case(lambda lib, x: x.sinh(), lambda dtype: [below_hyperbolic_overflow(dtype)]),
    "Tensor.cosh": Case(lambda lib, x: x.cosh(), lambda dtype: [below_hyperbolic_overflow(dtype)]),
    "Tensor.nan_to_num": unary(lambda lib, x: (x.nan_to_num(), x.nan_to_num(1.0, 2.0, -3.0))),
    # tracer/arc_functions.py, cumulative.py, medians.py
    "Tensor.asin": unary(lambda lib, x: x.asin()),
    "Tensor.acos": unary(lambda lib, x: x.acos()),
    "Tensor.atan": unary(lambda lib, x: x.atan()),
    "Tensor.atan2": binary(lambda lib, x, y: lib.atan2(x, y)),
    "Tensor.cumsum": row(lambda lib, x: (x.cumsum(1), x.cumsum(0))),
    # along rows of 3, which the scan and the product combine left to right as PyTorch (longer
    # rows in blocks: their overflow and underflow can differ, docs/differences.md)
    "Tensor.cumprod": row(lambda lib, x: (x.cumprod(1), x.t().cumprod(0))),
    "Tensor.prod": row(lambda lib, x: (x.prod(1), x.t().prod(0), x[-3:].prod(), x[5:6].prod())),
    "Tensor.median": row(lambda lib, x: (x.median(1).values, x.nanmedian(1).values, x.median(),
                                         x.nanmedian(), x[-4:].median(), x[-5:-3].nanmedian())),
    "F.softplus": unary(lambda lib, x: (lib.nn.functional.softplus(x),
                                        lib.nn.functional.softplus(x, 0.5, 5.0))),
    "F.hardtanh": unary(lambda lib, x: (lib.nn.functional.hardtanh(x),
                                        lib.nn.functional.relu6(x))),
    "Tensor.clamp": unary(lambda lib, x: (x.clamp(-20.0, 88.7), x.clamp(min=1.0),
                                          x.clamp(max=-1.0))),
    "Tensor.pow": unary(lambda lib, x: tuple(x ** p for p in (0, 0.5, 1, 2, 3, -0.5, -1, -2, 1.5,
                                                              -1.5, 2.5, 0.3))),
    "Tensor.__rpow__": unary(lambda lib, x: (2.0 ** x, 0.5 ** x)),
    "Tensor.__pow__": binary(lambda lib, x, y: x ** y),
    "Tensor.__add__": binary(lambda lib, x, y: x + y),
    "Tensor.__sub__": binary(lambda lib, x, y: x - y),
    "Tensor.__mul__": binary(lambda lib, x, y: x * y),
    "Tensor.__truediv__": binary(lambda lib, x, y: x / y),
    "Tensor.maximum": binary(lambda lib, x, y: lib.maximum(x, y)),
    "Tensor.minimum": binary(lambda lib, x, y: lib.minimum(x, y)),
    # PyTorch's vectorized loop (Sleef's fmod) gives nan for 0.5 % 1e-45 in a tensor of 16 or
    # more, its scalar loop C's fmod 0 (exact, as tracer): the oracle runs it element by element.
    "Tensor.remainder": Case(lambda lib, x, y: x % y, lambda dtype: list(pairs(dtype)),
                             torch_run=lambda lib, x, y: torch.cat([
                                 x[i:i + 1] % y[i:i + 1] for i in range(x.shape[0])])),
    "Tensor.floor_divide": Case(lambda lib, x, y: x // y, lambda dtype: list(pairs(dtype)),
                                gradients=False),
    # (rounded quotients: PyTorch's gradient is zeros, also for an infinite cotangent)
    "Tensor.div": binary(lambda lib, x, y: (x.div(y), x.div(y, rounding_mode="trunc"),
                                            lib.div(x, y, rounding_mode="floor"))),
    "tr.where": binary(lambda lib, x, y: lib.where(x > y, x, y)),
    "Tensor.masked_fill": unary(lambda lib, x: x.masked_fill(x > 1, 2.0)),
    "Tensor.lerp": ternary(lambda lib, x, y, w: (x.lerp(y, w), x.lerp(y, 0.25),
                                                 x.lerp(y, 0.75))),
    "Tensor.addcmul": ternary(lambda lib, x, y, z: x.addcmul(y, z, value=0.5)),
    "Tensor.addcdiv": ternary(lambda lib, x, y, z: x.addcdiv(y, z, value=0.5)),
    "Tensor.to": unary(lambda lib, x: (x.to(lib.float64), x.to(lib.float32))),
    # reductions
    "Tensor.sum": row(lambda lib, x: (x.sum(), x.sum(1), x.sum(1, dtype=lib.float64))),
    "Tensor.mean": row(lambda lib, x: (x.mean(), x.mean(1), x.mean(0, dtype=lib.float64))),
    "Tensor.max": row(lambda lib, x: (x.max(), x.max(1).values, x.max(0).values)),
    "Tensor.min": row(lambda lib, x: (x.min(), x.min(1).values)),
    "Tensor.amax": row(lambda lib, x: (x.amax(1), x.amax())),
    "Tensor.amin": row(lambda lib, x: (x.amin(1), x.amin())),
    "Tensor.var": row(lambda lib, x: (x.var(1), x.var(1, unbiased=False))),
    "Tensor.std": row(lambda lib, x: (x.std(1), x.std(1, unbiased=False))),
    "Tensor.norm": row(lambda lib, x: tuple(x.norm(p, dim=1) for p in (
        "fro", 1, 3, 0.5, float("inf"), float("-inf"), 0))),
    "Tensor.logsumexp": row(lambda lib, x: x.logsumexp(1)),
    "Tensor.softmax": row(lambda lib, x: x.softmax(1)),
    "Tensor.log_softmax": row(lambda lib, x: x.log_softmax(1)),
    # tr.nn.functional
    "F.relu": unary(lambda lib, x: lib.nn.functional.relu(x)),
    # PyTorch's gelu, x/2 * (1 + erf(x / sqrt 2)), cancels to 0 below x = -8 in float64 (tracer's
    # erfc form keeps the tail: -5.5e-88 at x = -20): the oracle is PyTorch's erfc form.
    "F.gelu": Case(lambda lib, x: (lib.nn.functional.gelu(x),
                                   lib.nn.functional.gelu(x, approximate="tanh")),
                   extreme_values_list,
                   torch_run=lambda lib, x: (0.5 * x * torch.special.erfc(x * -0.5 ** 0.5),
                                             lib.nn.functional.gelu(x, approximate="tanh"))),
    "F.silu": unary(lambda lib, x: lib.nn.functional.silu(x)),
    "F.tanh": unary(lambda lib, x: lib.nn.functional.tanh(x)),
    "F.sigmoid": unary(lambda lib, x: lib.nn.functional.sigmoid(x)),
    "F.softmax": row(lambda lib, x: lib.nn.functional.softmax(x, dim=1)),
    "F.log_softmax": row(lambda lib, x: lib.nn.functional.log_softmax(x, dim=1)),
    "F.logsumexp": row(lambda lib, x: lib.logsumexp(x, 1)),
    "F.cross_entropy": Case(lambda lib, x: (
        cross_entropy_labels(lib, x), cross_entropy_labels(lib, x, label_smoothing=0.1),
        lib.nn.functional.cross_entropy(x, x.detach().softmax(1), reduction="none")), scaled),
    "F.nll_loss": row(lambda lib, x: lib.nn.functional.nll_loss(
        x, lib.tensor(labels(x.shape[0], 3)), reduction="none")),
    "F.mse_loss": binary(lambda lib, x, y: lib.nn.functional.mse_loss(x, y, reduction="none")),
    "F.layer_norm": Case(lambda lib, x, w, b: lib.nn.functional.layer_norm(x, (3,), w, b),
                         lambda dtype: [rows(dtype), moderate(dtype, 3), moderate(dtype, 3, 1)]),
    "F.linear": Case(lambda lib, x, w, b: lib.nn.functional.linear(x, w, b),
                     lambda dtype: [rows(dtype), moderate(dtype, (2, 3)), moderate(dtype, 2, 1)]),
    "F.embedding": Case(lambda lib, w: lib.nn.functional.embedding(
        lib.tensor(np.arange(w.shape[0] - 1, -1, -1)), w), lambda dtype: [rows(dtype)]),
    # bags of 1, 2 and 4 rows in reverse order (and one empty bag), each mode
    "F.embedding_bag": Case(lambda lib, w: tuple(lib.nn.functional.embedding_bag(
        lib.tensor(np.arange(w.shape[0] - 1, -1, -1)), w, lib.tensor([0, 1, 3, 3, 7]), mode=mode)
        for mode in ("sum", "mean", "max")), lambda dtype: [rows(dtype)]),
    "F.dropout": unary(lambda lib, x: lib.nn.functional.dropout(x, 0.5, training=False)),
    # tracer/nn/activations.py
    "F.leaky_relu": unary(lambda lib, x: (lib.nn.functional.leaky_relu(x),
                                          lib.nn.functional.leaky_relu(x, -0.5))),
    "F.elu": unary(lambda lib, x: (lib.nn.functional.elu(x), lib.nn.functional.elu(x, 0.5),
                                   lib.nn.functional.selu(x), lib.nn.functional.celu(x, 2.0))),
    "F.mish": unary(lambda lib, x: lib.nn.functional.mish(x)),
    "F.hardswish": unary(lambda lib, x: (lib.nn.functional.hardswish(x),
                                         lib.nn.functional.hardswish(x - 3.0),
                                         lib.nn.functional.hardswish(x + 3.0))),
    "F.hardsigmoid": unary(lambda lib, x: (lib.nn.functional.hardsigmoid(x),
                                           lib.nn.functional.hardsigmoid(x - 3.0),
                                           lib.nn.functional.hardsigmoid(x + 3.0))),
    "F.logsigmoid": unary(lambda lib, x: lib.nn.functional.logsigmoid(x)),
    "F.softsign": unary(lambda lib, x: lib.nn.functional.softsign(x)),
    "F.tanhshrink": unary(lambda lib, x: lib.nn.functional.tanhshrink(x)),
    "F.threshold": unary(lambda lib, x: (lib.nn.functional.threshold(x, 0.5, 2.0),
                                         lib.nn.functional.threshold(x, 0.0, -3.0))),
    "F.glu": row(lambda lib, x: (lib.nn.functional.glu(x[:, :2]),
                                 lib.nn.functional.glu(x[:, 1:].t(), 0))),
    "F.prelu": Case(lambda lib, x, w: (lib.nn.functional.prelu(x, w),
                                       lib.nn.functional.prelu(x, w[:1])),
                    lambda dtype: [rows(dtype), moderate(dtype, 3)]),
    "F.softmin": row(lambda lib, x: lib.nn.functional.softmin(x, dim=1)),
    # tracer/nn/loss_functions.py. BCE's probabilities are sigmoids of the extreme values (0 and
    # 1 among them, where its logs are clamped at -100) but nan's, which PyTorch refuses
    "F.binary_cross_entropy": Case(lambda lib, x, y: (
        lib.nn.functional.binary_cross_entropy(x.sigmoid(), y.sigmoid(), reduction="none"),
        lib.nn.functional.binary_cross_entropy(x.sigmoid(), y.detach().sigmoid(),
                                               weight=lib.ones_like(x) * 0.5, reduction="none")),
        lambda dtype: [a[~np.isnan(pairs(dtype)[0] + pairs(dtype)[1])] for a in pairs(dtype)]),
    "F.binary_cross_entropy_with_logits": binary(lambda lib, x, y: (
        lib.nn.functional.binary_cross_entropy_with_logits(x, y.sigmoid(), reduction="none"),
        lib.nn.functional.binary_cross_entropy_with_logits(
            x, y.sigmoid(), reduction="none", pos_weight=lib.ones_like(x).detach() * 3.0))),
    "F.kl_div": binary(lambda lib, x, y: (
        lib.nn.functional.kl_div(x, y, reduction="none"),
        lib.nn.functional.kl_div(x, y, reduction="none", log_target=True))),
    "F.huber_loss": binary(lambda lib, x, y: (
        lib.nn.functional.huber_loss(x, y, reduction="none"),
        lib.nn.functional.huber_loss(x, y, reduction="none", delta=2.5))),
    "F.smooth_l1_loss": binary(lambda lib, x, y: (
        lib.nn.functional.smooth_l1_loss(x, y, reduction="none"),
        lib.nn.functional.smooth_l1_loss(x, y, reduction="none", beta=0.5),
        lib.nn.functional.smooth_l1_loss(x, y, reduction="none", beta=0.0))),
    "F.soft_margin_loss": binary(lambda lib, x, y: lib.nn.functional.soft_margin_loss(
        x, y.detach().sign(), reduction="none")),
    "F.margin_ranking_loss": ternary(lambda lib, x, y, z: (
        lib.nn.functional.margin_ranking_loss(x, y, z.sign(), reduction="none"),
        lib.nn.functional.margin_ranking_loss(x, y, z.sign(), margin=0.5, reduction="none"))),
    # tracer/nn/distances.py
    "F.normalize": row(lambda lib, x: (lib.nn.functional.normalize(x),
                                       lib.nn.functional.normalize(x, p=1.0, dim=0))),
    "F.cosine_similarity": Case(lambda lib, x, y: (
        lib.nn.functional.cosine_similarity(x, y), lib.nn.functional.cosine_similarity(
            x, y[:1], eps=0.5)), lambda dtype: [rows(dtype), rows(dtype)[::-1].copy()]),
    "F.pairwise_distance": Case(lambda lib, x, y: (
        lib.nn.functional.pairwise_distance(x, y),
        lib.nn.functional.pairwise_distance(x, y, p=1.0, eps=0.0, keepdim=True)),
        lambda dtype: [rows(dtype), rows(dtype)[::-1].copy()]),
    "F.cosine_embedding_loss": Case(lambda lib, x, y: lib.nn.functional.cosine_embedding_loss(
        x, y, lib.tensor(np.resize([1.0, -1.0, 0.0], x.shape[0]), dtype=x.dtype), margin=0.25,
        reduction="none"), lambda dtype: [rows(dtype), rows(dtype)[::-1].copy()]),
    "Tensor.matmul": Case(lambda lib, x, w: (x @ w, x.mm(w), lib.bmm(x[None], w[None])),
                          lambda dtype: [rows(dtype), moderate(dtype, (3, 2))]),
    "Tensor.index_add": Case(lambda lib, x, y: x.index_add(0, lib.tensor(np.arange(
        y.shape[0]) % 5), y, alpha=0.5), lambda dtype: [rows(dtype)[:5], rows(dtype)]),
    # index rows without repeats along dimension 1 (PyTorch leaves a repeated scatter's value
    # unspecified, and the sums of a repeated scatter_add would round in another order)
    "Tensor.scatter": row(lambda lib, x: (
        x.scatter(1, lib.tensor(permuted_columns(x.shape)), x.flip(0)),
        x.scatter(1, lib.tensor(permuted_columns(x.shape)[:, :2]), 2.5),
        x.scatter(0, lib.tensor(permuted_columns(x.shape)[:1]), x[1:2]))),
    "Tensor.scatter_add": row(lambda lib, x: (
        x.scatter_add(1, lib.tensor(permuted_columns(x.shape)), x.flip(0)),
        x.scatter_add(0, lib.tensor(permuted_columns(x.shape)[:2]), x[1:3].flip(1)))),
    "F.l1_loss": binary(lambda lib, x, y: lib.nn.functional.l1_loss(x, y, reduction="none")),
    "Tensor.round": unary(lambda lib, x: x.round()),
    # stable sorts on both sides, so that tied values (the constant rows) send their gradients
    # to the same positions
    "Tensor.sort": row(lambda lib, x: (x.sort(dim=1, stable=True)[0],
                                       x.sort(dim=1, descending=True, stable=True)[0])),
    # PyTorch's topk orders ties as it likes, and sends their gradients there: values only
    "Tensor.topk": Case(lambda lib, x: x.topk(2, dim=1)[0], lambda dtype: [rows(dtype)],
                        gradients=False),
    "tr.einsum": Case(lambda lib, x, w: (lib.einsum("ij,jk->ik", x, w), lib.einsum("ij->j", x)),
                      lambda dtype: [rows(dtype), moderate(dtype, (3, 2))]),
    # The layers, on each row of extreme values as a (batch, channel, 3, 1) image.
    "F.conv1d": Case(lambda lib, x, w: lib.nn.functional.conv1d(x[:, None, :], w, padding=1),
                     lambda dtype: [rows(dtype), moderate(dtype, (2, 1, 2))]),
    "F.conv2d": Case(lambda lib, x, w: lib.nn.functional.conv2d(x[:, None, :, None], w,
                                                                padding=(1, 0)),
                     lambda dtype: [rows(dtype), moderate(dtype, (2, 1, 3, 1))]),
    "F.conv_transpose2d": Case(lambda lib, x, w: lib.nn.functional.conv_transpose2d(
        x[:, None, :, None], w), lambda dtype: [rows(dtype), moderate(dtype, (1, 2, 2, 1))]),
    "F.max_pool2d": row(lambda lib, x: lib.nn.functional.max_pool2d(x[:, None, :, None], (2, 1),
                                                                    stride=1)),
    "F.avg_pool2d": row(lambda lib, x: lib.nn.functional.avg_pool2d(x[:, None, :, None], (2, 1),
                                                                    stride=1)),
    "F.adaptive_avg_pool2d": row(lambda lib, x: lib.nn.functional.adaptive_avg_pool2d(
        x[:, None, :, None], (2, 1))),
    # 1-d pooling on each row as a (batch, channel, 3) signal
    "F.max_pool1d": row(lambda lib, x: lib.nn.functional.max_pool1d(x[:, None, :], 2, 1, 1)),
    "F.avg_pool1d": row(lambda lib, x: lib.nn.functional.avg_pool1d(x[:, None, :], 2, 1, 1)),
    "F.adaptive_avg_pool1d": row(lambda lib, x: lib.nn.functional.adaptive_avg_pool1d(
        x[:, None, :], 2)),
    "F.adaptive_max_pool1d": row(lambda lib, x: lib.nn.functional.adaptive_max_pool1d(
        x[:, None, :], 2)),
    "F.adaptive_max_pool2d": row(lambda lib, x: lib.nn.functional.adaptive_max_pool2d(
        x[:, None, :, None], (2, 1))),
    # each row as a (batch, channel, 3) signal and a (batch, channel, 3, 1) image, resampled
    "F.interpolate": row(lambda lib, x: tuple(
        lib.nn.functional.interpolate(x[:, None, :], 5, mode=mode) for mode in (
            "nearest", "nearest-exact", "linear", "area")) + tuple(
        lib.nn.functional.interpolate(x[:, None, :, None], (4, 2), mode=mode, align_corners=c)
        for mode, c in (("bilinear", False), ("bilinear", True), ("bicubic", False),
                        ("bicubic", True))) + (
        lib.nn.functional.interpolate(x[:, None, :], 3, mode="linear"),)),
    "F.pixel_shuffle": row(lambda lib, x: lib.nn.functional.pixel_shuffle(
        x[:x.shape[0] // 4 * 4].reshape(-1, 4, 3, 1), 2)),
    "F.pixel_unshuffle": row(lambda lib, x: lib.nn.functional.pixel_unshuffle(
        x[:x.shape[0] // 4 * 4].reshape(-1, 1, 2, 6), 2)),
    "F.channel_shuffle": row(lambda lib, x: lib.nn.functional.channel_shuffle(x[:, :, None], 3)),
    "F.unfold": row(lambda lib, x: lib.nn.functional.unfold(x[:, None, :, None], (2, 1),
                                                            padding=(1, 0))),
    # overlapping blocks: output row r adds x[r, 0], x[r - 1, 1] and x[r - 2, 2]
    "F.fold": row(lambda lib, x: lib.nn.functional.fold(x.t()[None], (x.shape[0] + 2, 1),
                                                        (3, 1))),
    "F.dropout1d": unary(lambda lib, x: lib.nn.functional.dropout1d(x[None], training=False)),
    "F.dropout2d": unary(lambda lib, x: lib.nn.functional.dropout2d(x[None, None, None],
                                                                    training=False)),
    # the padding modules, each row as a (batch, 3) signal and the rows as one (1, rows, 3) image
    "padding": row(lambda lib, x: (
        lib.nn.ZeroPad1d(1)(x), lib.nn.ConstantPad1d((2, 1), 3.5)(x), lib.nn.ReflectionPad1d(2)(x),
        lib.nn.ReplicationPad1d((1, 3))(x), lib.nn.CircularPad1d(2)(x),
        lib.nn.ZeroPad2d((1, 0, 0, 2))(x[None]), lib.nn.ConstantPad2d(1, -2.0)(x[None]),
        lib.nn.ReflectionPad2d((1, 2, 2, 1))(x[None]), lib.nn.ReplicationPad2d(2)(x[None]),
        lib.nn.CircularPad2d((0, 1, 2, 3))(x[None]))),
    "F.batch_norm": Case(lambda lib, x, w, b: lib.nn.functional.batch_norm(
        x, lib.tensor([0.5, -1.0, 2.0], dtype=x.dtype), lib.ones(3, dtype=x.dtype) * 2, w, b,
        training=False),
        lambda dtype: [rows(dtype), moderate(dtype, 3), moderate(dtype, 3, 1)]),
    # the recurrent modules and cells: products, sigmoid and tanh in their gates' order
    # (not in the slow sweep over the whole range, which is for elementwise functions)
    "recurrent": Case(recurrent, lambda dtype: [extreme_values(dtype)]),
    # Each row three channels of one group, or one channel of three positions. PyTorch's kernels
    # round where tracer's exact means give the exact result (tests/test_nn_norms.py): at a
    # constant row (88.7, 88.7, 88.7), whose normalized values are 0, group norm's scale-and-shift
    # x * weight / sqrt(var + eps) + (bias - mean * weight / sqrt(var + eps)) gives 1e-12 in
    # float64, instance norm's rounded mean 3e-4 in float32: only the rows that mix values.
    "F.group_norm": Case(lambda lib, x, w, b: lib.nn.functional.group_norm(
        x[:, :, None], 1, w, b), lambda dtype: [
            rows(dtype)[:pairs(dtype)[0].size], moderate(dtype, 3), moderate(dtype, 3, 1)]),
    "F.instance_norm": Case(lambda lib, x, w, b: lib.nn.functional.instance_norm(
        x[:, None, :], weight=w, bias=b), lambda dtype: [
            rows(dtype)[:pairs(dtype)[0].size], moderate(dtype, 1), moderate(dtype, 1, 1)]),
    "F.rms_norm": Case(lambda lib, x, w: lib.nn.functional.rms_norm(x, (3,), w),
                       lambda dtype: [rows(dtype), moderate(dtype, 3)]),
    # The weights and the output of attention (projections, softmax, products), then the output
    # without the weights (scaled_dot_product_attention) with a causal mask: the extreme values
    # are the queries and the values; keys of moderate values keep the scores linear in them (the
    # gradients of scores of two extreme values, 709.7 ** 2, are differences rounded at their
    # magnitude, which the products' summation order decides).
    "nn.MultiheadAttention": Case(lambda lib, x: (
        *ATTENTION(lib, x)(sequences(x), moderate_keys(lib, x), sequences(x)),
        ATTENTION(lib, x)(sequences(x), moderate_keys(lib, x), sequences(x), need_weights=False,
                          attn_mask=lib.ones(3, 3, dtype=lib.bool).triu(1), is_causal=True)[0]),
        sequence_rows),
    "nn.TransformerEncoderLayer": Case(lambda lib, x: ENCODER_LAYER(lib, x)(sequences(x)),
                                       sequence_rows),
    "nn.TransformerDecoderLayer": Case(lambda lib, x: DECODER_LAYER(lib, x)(
        sequences(x), moderate_keys(lib, x)), sequence_rows),
    # Operations that move values (their gradients move or add up the cotangents), at once.
    "layout": row(lambda lib, x: (
        x.reshape(-1), x.view(3, -1), x.t(), x.T, x.transpose(0, 1), x.permute(1, 0),
        x.unsqueeze(0), x[None].squeeze(0), x.flatten(), x[:, None].expand(-1, 2, -1),
        x[:, :1].expand_as(x), x.clone(), x.contiguous(), *x.split(2, 1), *x.chunk(2, 1),
        x[:3].tril(), x[:3].triu(), lib.cat([x, x], 1), lib.stack([x, x]), x[1::2, 1:],
        x.index_select(0, lib.tensor(np.arange(x.shape[0])[::-1].copy())),
        x.gather(1, lib.tensor(np.arange(x.shape[0] * 2).reshape(-1, 2) % 3)),
        x.take_along_dim(lib.tensor(np.arange(x.shape[0] * 2).reshape(-1, 2) % 3), 1),
        x.float(), x.double(), x.type_as(x[:1].float()), x.repeat(2, 1),
        x.unflatten(1, (3, 1)), x.flip(0), x.roll(1, 0), x.roll(-2), x.narrow(1, 1, 2),
        x.select(1, 0), *x.unbind(1), x.movedim(0, 1), x.swapaxes(0, 1), x.mT, x.view_as(x),
        x.reshape_as(x), x[:3].diagonal(), lib.diag(x[:, 0]), lib.diag(x[:3]),
        x.repeat_interleave(2, 0), lib.hstack([x, x]), lib.vstack([x, x]),
        *lib.meshgrid(x[:, 0], x[0], indexing="ij"))),
    "products": row(lambda lib, x: (lib.outer(x[:, 0], x[0]), x[:, 0].dot(x[:, 1]),
                                    lib.addmm(x[:, :1], x, x.t()[:, :2]))),
}

# Public names covered by another name's case: the method behind a `tr.` function or an in-place
# form, an alias, a module around a functional, a reflected operator.
LAYOUT = ("reshape view t T transpose permute unsqueeze squeeze flatten expand expand_as clone "
          "contiguous split chunk tril triu __getitem__ index_select gather take_along_dim float "
          "double type_as").split()
ALIASES = {
    **{f"Tensor.{name}": "layout" for name in LAYOUT}, "tr.cat": "layout", "tr.stack": "layout",
    "Tensor.clip": "Tensor.clamp", "Tensor.mul": "Tensor.__mul__", "Tensor.add": "Tensor.__add__",
    "Tensor.sub": "Tensor.__sub__", "Tensor.divide": "Tensor.div",
    "Tensor.true_divide": "Tensor.__truediv__",
    "Tensor.__abs__": "Tensor.abs", "Tensor.__neg__": "Tensor.neg", "Tensor.__pos__": "layout",
    "Tensor.__mod__": "Tensor.remainder", "Tensor.__floordiv__": "Tensor.floor_divide",
    "Tensor.__matmul__": "Tensor.matmul", "Tensor.mm": "Tensor.matmul", "Tensor.bmm": "Tensor.matmul",
    "Tensor.__setitem__": "Tensor.masked_fill",  # a select of the assigned values, as where
    "Tensor.copy_": "layout",
    "nn.Linear": "F.linear", "nn.Embedding": "F.embedding", "nn.EmbeddingBag": "F.embedding_bag", "nn.LayerNorm": "F.layer_norm",
    "nn.Dropout": "F.dropout", "nn.ReLU": "F.relu", "nn.GELU": "F.gelu", "nn.SiLU": "F.silu",
    "nn.Tanh": "F.tanh", "Tensor.repeat": "layout", "Tensor.unflatten": "layout",
    "F.flatten": "layout", "nn.Flatten": "layout", "nn.Unflatten": "layout", "nn.Identity": "layout",
    "nn.L1Loss": "F.l1_loss", "nn.MSELoss": "F.mse_loss", "nn.NLLLoss": "F.nll_loss",
    "nn.CrossEntropyLoss": "F.cross_entropy", "nn.Conv1d": "F.conv1d", "nn.Conv2d": "F.conv2d",
    "nn.ConvTranspose2d": "F.conv_transpose2d", "nn.MaxPool2d": "F.max_pool2d",
    "nn.AvgPool2d": "F.avg_pool2d", "nn.AdaptiveAvgPool2d": "F.adaptive_avg_pool2d",
    "nn.BatchNorm1d": "F.batch_norm", "nn.BatchNorm2d": "F.batch_norm",
    "nn.MaxPool1d": "F.max_pool1d", "nn.AvgPool1d": "F.avg_pool1d",
    "nn.AdaptiveAvgPool1d": "F.adaptive_avg_pool1d", "nn.AdaptiveMaxPool1d": "F.adaptive_max_pool1d",
    "nn.AdaptiveMaxPool2d": "F.adaptive_max_pool2d",
    "nn.Upsample": "F.interpolate", "nn.UpsamplingNearest2d": "F.interpolate",
    "nn.UpsamplingBilinear2d": "F.interpolate",
    "nn.PixelShuffle": "F.pixel_shuffle", "nn.PixelUnshuffle": "F.pixel_unshuffle",
    "nn.ChannelShuffle": "F.channel_shuffle", "nn.Unfold": "F.unfold", "nn.Fold": "F.fold",
    "nn.Dropout1d": "F.dropout1d", "nn.Dropout2d": "F.dropout2d",
    **{f"nn.{kind}Pad{n}d": "padding" for kind in
       ("Zero", "Constant", "Reflection", "Replication", "Circular") for n in (1, 2)},
    **{f"nn.{kind}": "recurrent" for kind in RECURRENT},
    "Tensor.fix": "Tensor.trunc", "Tensor.arcsin": "Tensor.asin", "Tensor.arccos": "Tensor.acos",
    "Tensor.arctan": "Tensor.atan", "Tensor.arctan2": "Tensor.atan2",
    "Tensor.nanmedian": "Tensor.median", "Tensor.sgn": "Tensor.sign",
    "Tensor.fmod": "Tensor.remainder",  # (the primitive behind both)
    "Tensor.clamp_min": "Tensor.clamp",
    "Tensor.clamp_max": "Tensor.clamp", "Tensor.where": "tr.where", "F.relu6": "F.hardtanh",
    "nn.Softplus": "F.softplus", "nn.Hardtanh": "F.hardtanh", "nn.ReLU6": "F.hardtanh",
    "nn.Sigmoid": "F.sigmoid", "nn.LogSigmoid": "F.logsigmoid", "nn.Softsign": "F.softsign",
    "nn.Tanhshrink": "F.tanhshrink", "nn.SELU": "F.elu", "nn.ELU": "F.elu", "nn.CELU": "F.elu",
    "nn.Mish": "F.mish", "nn.Hardswish": "F.hardswish", "nn.Hardsigmoid": "F.hardsigmoid",
    "nn.LeakyReLU": "F.leaky_relu", "nn.Threshold": "F.threshold", "nn.GLU": "F.glu",
    "nn.Softmax": "F.softmax", "nn.LogSoftmax": "F.log_softmax", "nn.Softmin": "F.softmin",
    "nn.PReLU": "F.prelu",
    "nn.BCELoss": "F.binary_cross_entropy", "nn.BCEWithLogitsLoss":
    "F.binary_cross_entropy_with_logits", "nn.KLDivLoss": "F.kl_div",
    "nn.HuberLoss": "F.huber_loss", "nn.SmoothL1Loss": "F.smooth_l1_loss",
    "nn.SoftMarginLoss": "F.soft_margin_loss", "nn.CosineEmbeddingLoss": "F.cosine_embedding_loss",
    "nn.MarginRankingLoss": "F.margin_ranking_loss",
    "nn.CosineSimilarity": "F.cosine_similarity", "nn.PairwiseDistance": "F.pairwise_distance",
    **{f"Tensor.{name}": "layout" for name in (
        "flip roll narrow select unbind movedim moveaxis swapaxes swapdims mT view_as reshape_as "
        "diagonal diag repeat_interleave").split()},
    **{f"tr.{name}": "layout" for name in "concat concatenate hstack vstack meshgrid".split()},
    "Tensor.outer": "products", "Tensor.ger": "products", "Tensor.dot": "products",
    "Tensor.addmm": "products",
    "nn.GroupNorm": "F.group_norm", "nn.InstanceNorm1d": "F.instance_norm",
    "nn.InstanceNorm2d": "F.instance_norm", "nn.RMSNorm": "F.rms_norm",
    "nn.TransformerEncoder": "nn.TransformerEncoderLayer",
    "nn.TransformerDecoder": "nn.TransformerDecoderLayer",
    "nn.Transformer": "nn.TransformerDecoderLayer",
}
# Public names with no gradient to check, and why.
NOT_DIFFERENTIABLE = {
    **dict.fromkeys("Tensor.eq Tensor.ne Tensor.lt Tensor.le Tensor.gt Tensor.ge Tensor.__and__ "
                    "Tensor.__or__ Tensor.__invert__ Tensor.logical_not Tensor.any Tensor.all "
                    "Tensor.argmax Tensor.argmin Tensor.isnan Tensor.isinf Tensor.isfinite "
                    "Tensor.isclose Tensor.allclose Tensor.equal Tensor.logical_and "
                    "Tensor.logical_or Tensor.logical_xor".split(), "a bool or an index"),
    **dict.fromkeys("Tensor.bool Tensor.long F.one_hot".split(), "an integer or bool result"),
    **dict.fromkeys("Tensor.item Tensor.tolist Tensor.numpy Tensor.size Tensor.dim Tensor.numel "
                    "Tensor.shape Tensor.dtype Tensor.ndim Tensor.grad Tensor.grad_fn "
                    "Tensor.is_leaf Tensor.requires_grad Tensor.data Tensor.backward "
                    "Tensor.requires_grad_ Tensor.detach Tensor.detach_ Tensor.to_numpy "
                    "Tensor.__array__ Tensor.__array_priority__ Tensor.__bool__ Tensor.__dlpack__ "
                    "Tensor.__dlpack_device__ Tensor.__float__ Tensor.__int__ Tensor.__index__ "
                    "Tensor.__iter__ Tensor.__len__ Tensor.__module__ Tensor.__slots__ "
                    "Tensor.__weakref__ Tensor.cpu Tensor.device Tensor.is_cuda "
                    "Tensor.register_hook Tensor.retain_grad tr.save tr.load Tensor.stride "
                    "Tensor.is_contiguous Tensor.nelement Tensor.element_size".split(),
                    "not an operation on values"),
    **dict.fromkeys("Tensor.argsort Tensor.nonzero Tensor.argwhere".split(), "an index"),
    # (values and gradient against PyTorch in tests/test_api_tensor_ops.py)
    "Tensor.masked_select": "eager only, its shape depending on the values: a boolean mask read",
    **dict.fromkeys("Tensor.normal_ Tensor.uniform_".split(), "an overwrite by random numbers"),
    **dict.fromkeys("Tensor.zero_ Tensor.fill_".split(), "an overwrite by a constant"),
    **dict.fromkeys("tr.arange tr.empty tr.eye tr.full tr.full_like tr.linspace tr.ones "
                    "tr.ones_like tr.zeros tr.zeros_like tr.rand tr.randn tr.randint tr.randperm "
                    "tr.tensor tr.from_numpy tr.as_tensor Tensor.new tr.from_dlpack tr.manual_seed "
                    "tr.get_rng_state tr.set_rng_state Tensor.new_zeros Tensor.new_ones "
                    "Tensor.new_full Tensor.new_empty Tensor.new_tensor tr.empty_like "
                    "tr.randn_like tr.rand_like".split(),
                    "makes a tensor from numbers"),
    **dict.fromkeys("tr.grad tr.value_and_grad tr.gradcheck tr.autograd_function "
                    "tr.once_differentiable tr.no_grad tr.enable_grad tr.set_grad_enabled "
                    "tr.is_grad_enabled tr.inference_mode tr.is_inference_mode_enabled tr.trace tr.vjp tr.jvp tr.jacrev tr.hessian tr.vmap "
                    "tr.gradgradcheck".split(), "a transform or a mode, not a function"),
    "tr.pure_callback": "calls the user's NumPy code, which the tests of tr.pure_callback check",
}


def public_names() -> set[str]:
    """Every public function of tracer's API: Tensor's methods and operators, `tr.`'s functions,
    `tr.nn.functional`'s and `tr.nn`'s layers."""
    names = {f"Tensor.{n}" for n in dir(tr.Tensor)
             if not n.startswith("_") or n.startswith("__") and n not in dir(object)}
    names |= {f"tr.{n}" for n in dir(tr) if not n.startswith("_") and inspect.isfunction(
        getattr(tr, n))}
    names |= {f"F.{n}" for n, v in vars(tr.nn.functional).items()
              if not n.startswith("_") and inspect.isfunction(v)
              and v.__module__ == tr.nn.functional.__name__}
    names |= {f"nn.{n}" for n in tr.nn.__all__ if isinstance(getattr(tr.nn, n), type)
              and issubclass(getattr(tr.nn, n), tr.nn.Module)
              and n not in ("Module", "Sequential", "ModuleList", "ModuleDict")}
    return names


def covering(name: str) -> str:
    """The name whose case (or reason in NOT_DIFFERENTIABLE) covers a public name."""
    if name in CASES or name in NOT_DIFFERENTIABLE:
        return name
    if name in ALIASES:
        return covering(ALIASES[name])
    kind, _, attribute = name.partition(".")
    if kind == "tr" and hasattr(tr.Tensor, attribute):
        return covering(f"Tensor.{attribute}")  # `tr.exp(x)` is `x.exp()`
    if kind == "Tensor" and attribute.endswith("_") and not attribute.startswith("__"):
        return covering(f"Tensor.{attribute[:-1]}")  # `x.exp_()` assigns `x.exp()`
    if attribute.startswith(("__r", "__i")) and attribute[3:] != "ndex__":
        return covering(f"Tensor.__{attribute[3:]}")  # reflected and augmented operators
    return name


def test_every_public_function_is_covered():
    """A new public function fails here until a case (or an alias, or a reason) covers it."""
    uncovered = sorted(name for name in public_names()
                       if covering(name) not in CASES and covering(name) not in NOT_DIFFERENTIABLE)
    assert not uncovered, f"public functions not checked at extreme inputs: {uncovered}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_extreme_inputs_eager(name, dtype):
    compare(CASES[name], dtype, "eager")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_extreme_inputs_traced(name, dtype):
    compare(CASES[name], dtype, "traced")


def _sweep_parameters():
    for name in sorted(name for name, case in CASES.items() if case.inputs is extreme_values_list):
        for mode in ("eager", "traced"):
            yield pytest.param(name, mode, id=f"{name}-{mode}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, mode", list(_sweep_parameters()))
def test_elementwise_over_the_whole_range(name, dtype, mode):
    compare(dataclasses.replace(CASES[name], inputs=sweep), dtype, mode, SWEEP_TOLERANCE)


# ---------------------------------------------------------------------------------------------

def _outputs(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _weights(shapes, dtype) -> list[np.ndarray]:
    """Cotangents: ordinary numbers, the same for tracer and torch."""
    generator = np.random.default_rng(1)
    return [generator.uniform(0.5, 1.5, shape).astype(dtype) * np.where(
        generator.random(shape) < 0.5, -1, 1).astype(dtype) for shape in shapes]


def _grads(arrays, tensors) -> list[np.ndarray]:
    """Each input's gradient; zeros for none (floor's result does not require grad here, PyTorch's
    does, with a zero gradient)."""
    return [np.zeros_like(a) if t.grad is None else t.grad.numpy() for a, t in zip(arrays, tensors)]


def torch_results(case: Case, arrays: list[np.ndarray], weights=None):
    """PyTorch's values and gradients of sum(outputs * weights), and the weights."""
    tensors = [torch.tensor(a, requires_grad=case.gradients) for a in arrays]
    outputs = _outputs((case.torch_run or case.run)(torch, *tensors))
    weights = weights or _weights([tuple(o.shape) for o in outputs], arrays[0].dtype)
    if case.gradients:
        total = sum((o * torch.tensor(w)).sum() for o, w in zip(outputs, weights))
        total.backward()
    return [o.detach().numpy() for o in outputs], _grads(arrays, tensors), weights


def _backward(outputs, weights) -> None:
    total = sum((o * w).sum() for o, w in zip(outputs, weights))
    if total.requires_grad:
        total.backward()


def tracer_eager(case: Case, arrays, weights):
    tensors = [tr.tensor(a, requires_grad=case.gradients) for a in arrays]
    outputs = _outputs(case.run(tr, *tensors))
    _backward(outputs, [tr.tensor(w) for w in weights])
    return [o.detach().numpy() for o in outputs], _grads(arrays, tensors)


def _step(case: Case):
    def step(tensors, weights):
        outputs = _outputs(case.run(tr, *tensors))
        _backward(outputs, weights)
        return tuple(o.detach() for o in outputs)
    return step


def tracer_traced(case: Case, arrays, weights):
    tensors = [tr.tensor(a, requires_grad=case.gradients) for a in arrays]
    step = tr.trace(_step(case))
    outputs = step(tensors, [tr.tensor(w) for w in weights])
    values = [o.numpy() for o in outputs]
    grads = _grads(arrays, tensors)
    # The reference interpreter on the traced graph with its gradients, before any optimization,
    # given what a call passes to the compiled code (runtime/traced_function.py).
    fresh = ([tr.tensor(a, requires_grad=case.gradients) for a in arrays],
             [tr.tensor(w) for w in weights])
    entry, leaves, _ = step._lookup(fresh, {}, False, None)
    graph = ir.parse_function(stage_text(entry, "grad"))
    parameters = parameter_arrays(entry.parameter_sources, [*leaves, *entry.captured])
    outputs = ir.interpret(graph, [np.array(p) for p in parameters])
    interpreted_grads = {index: outputs[output] for index, kind, output in entry.writebacks
                         if kind == "grad"}
    interpreted = (outputs[:len(values)],
                   [interpreted_grads.get(i, np.zeros_like(a)) for i, a in enumerate(arrays)])
    return values, grads, interpreted


def _distance(values: np.ndarray, exact: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(values.astype(np.float64) - exact.astype(np.float64))


# (relative, absolute) tolerances: a few ulp of float32 and float64; the slow sweep's, which looks
# for nan, inf and overflow between the extreme values, allow the rounding that a cancellation
# amplifies (1 - tanh(x) ** 2, whose rounding is absolute, tanh-form gelu's 1 + tanh(inner) at
# x = -4; absolute: times factors up to 10), the same in PyTorch's formulas but from a tanh rounded
# otherwise.
TOLERANCE = {np.float32: (3e-5, 0.0), np.float64: (1e-11, 0.0)}
SWEEP_TOLERANCE = {np.float32: (1e-3, 1e-5), np.float64: (1e-8, 1e-14)}


def assert_close(actual, expected: np.ndarray, exact: np.ndarray | None, what: str,
                 arrays=(), tolerances=TOLERANCE) -> None:
    """NaN exactly where PyTorch has NaN, its infinities, and finite values to a few ulp of
    PyTorch's relative to each value, or to the largest magnitude of its row for results of rows
    (where a gradient such as softmax's is a difference of larger terms). Or, in float32, at least
    about as close as PyTorch's to `exact`, PyTorch's result in float64 from the same inputs (a
    constant row's variance, which tracer's exact mean makes 0 and PyTorch's gradient of var
    rounds to 1e-5), within 4 times PyTorch's distance."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        what, actual.shape, expected.shape, actual.dtype, expected.dtype)
    wrong = np.isnan(actual) != np.isnan(expected)
    wrong |= np.isinf(expected) & (actual != expected)
    finite = np.isfinite(expected)
    tolerance, absolute = tolerances[expected.dtype.type]
    magnitude = np.where(finite, np.abs(expected), 0.0)
    scale = np.maximum(magnitude, magnitude.max(axis=-1, keepdims=True) if actual.ndim > 1 else 0)
    gap = _distance(actual, expected)
    close = gap <= tolerance * scale + max(absolute, np.finfo(expected.dtype).tiny)
    rows = [a for a in arrays if actual.ndim > 1 and a.ndim == 2 and a.shape[0] == actual.shape[0]]
    if rows and expected.dtype == np.float64:
        # the rounding of terms of the inputs' magnitude in a row's cancelling sum
        terms = np.where(np.isfinite(rows[0]), np.abs(rows[0]), 0.0).max(axis=1)
        terms = terms.reshape(terms.shape + (1,) * (actual.ndim - 1))
        close |= gap <= 1e-15 * np.maximum(terms, 1.0)
    if exact is not None:
        close |= _distance(actual, exact) <= 4 * _distance(expected, exact) + tolerance * np.abs(exact)
    wrong |= finite & ~close
    if wrong.any():
        index = np.flatnonzero(wrong.reshape(-1))
        at = index[:8]
        rows = actual.shape[0] if actual.ndim else 1
        where = [f"input {i} {a.reshape(rows, -1)[np.unravel_index(at, actual.shape)[0]].tolist()}"
                 for i, a in enumerate(arrays) if a.ndim and a.shape[0] == rows]
        raise AssertionError(f"{what}: {len(index)} of {wrong.size} differ from PyTorch, e.g. at "
                             f"{at.tolist()}: tracer {actual.reshape(-1)[at]}, PyTorch "
                             f"{expected.reshape(-1)[at]}; " + ", ".join(where))


def compare(case: Case, dtype, mode: str, tolerances=TOLERANCE) -> None:
    arrays = [np.array(a, dtype) for a in case.inputs(dtype)]
    expected_values, expected_grads, weights = torch_results(case, arrays)
    exact_values, exact_grads = [None] * len(expected_values), [None] * len(arrays)
    if dtype == np.float32:
        exact_values, exact_grads, _ = torch_results(case, [a.astype(np.float64) for a in arrays],
                                                     [w.astype(np.float64) for w in weights])
    if mode == "eager":
        values, grads = tracer_eager(case, arrays, weights)
    else:
        values, grads, (interpreted_values, interpreted_grads) = tracer_traced(case, arrays,
                                                                               weights)
        for index, value in enumerate(interpreted_values):
            assert_close(value, expected_values[index], exact_values[index],
                         f"interpreted output {index}", arrays, tolerances)
        for index, grad in enumerate(interpreted_grads):
            assert_close(grad, expected_grads[index], exact_grads[index],
                         f"interpreted gradient of input {index}", arrays, tolerances)
    for index, (value, expected) in enumerate(zip(values, expected_values)):
        assert_close(value, expected, exact_values[index], f"{mode} output {index}", arrays,
                     tolerances)
    for index, (grad, expected) in enumerate(zip(grads, expected_grads)):
        assert_close(grad, expected, exact_grads[index], f"{mode} gradient of input {index}",
                     arrays, tolerances)
