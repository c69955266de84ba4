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
from tracer.runtime.entry import stage_text

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
    return Case(run, lambda dtype: [extreme_values(dtype)])


def binary(run):
    return Case(run, lambda dtype: list(pairs(dtype)))


def ternary(run):
    # the pairs, and a third operand cycling through the extreme values
    return Case(run, lambda dtype: [*pairs(dtype), np.resize(extreme_values(dtype),
                                                              pairs(dtype)[0].shape)])


def row(run):
    return Case(run, lambda dtype: [rows(dtype)])


def labels(count: int, classes: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64) % classes


def cross_entropy_labels(lib, x, **options):
    return lib.nn.functional.cross_entropy(x, lib.tensor(labels(x.shape[0], x.shape[1])),
                                           reduction="none", **options)


def scaled(dtype):
    """±1e4 logits (as in a saturated classifier) next to ordinary ones, and the extreme rows."""
    x = rows(dtype)
    return [np.concatenate([x, np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4]], dtype)])]


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
    "Tensor.remainder": binary(lambda lib, x, y: x % y),
    "Tensor.floor_divide": Case(lambda lib, x, y: x // y, lambda dtype: list(pairs(dtype)),
                                gradients=False),
    "tr.where": binary(lambda lib, x, y: lib.where(x > y, x, y)),
    "Tensor.masked_fill": unary(lambda lib, x: x.masked_fill(x > 1, 2.0)),
    "Tensor.lerp": ternary(lambda lib, x, y, w: (x.lerp(y, w), x.lerp(y, 0.25),
                                                 x.lerp(y, 0.75))),
    "Tensor.addcmul": ternary(lambda lib, x, y, z: x.addcmul(y, z, value=0.5)),
    "Tensor.addcdiv": ternary(lambda lib, x, y, z: x.addcdiv(y, z, value=0.5)),
    "Tensor.to": unary(lambda lib, x: (x.to(lib.float64), x.to(lib.float32))),
    # reductions
    "Tensor.sum": row(lambda lib, x: (x.sum(), x.sum(1))),
    "Tensor.mean": row(lambda lib, x: (x.mean(), x.mean(1))),
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
                   lambda dtype: [extreme_values(dtype)],
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
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_extreme_inputs_eager(name, dtype):
    compare(CASES[name], dtype, "eager")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_extreme_inputs_traced(name, dtype):
    compare(CASES[name], dtype, "traced")


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
    # given what a call passes to the compiled code (runtime/trace.py).
    fresh = ([tr.tensor(a, requires_grad=case.gradients) for a in arrays],
             [tr.tensor(w) for w in weights])
    entry, leaves, _ = step._lookup(fresh, {}, count=False)
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


def assert_close(actual, expected: np.ndarray, exact: np.ndarray | None, what: str,
                 arrays=()) -> None:
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
    tolerance = 3e-5 if expected.dtype == np.float32 else 1e-11
    magnitude = np.where(finite, np.abs(expected), 0.0)
    scale = np.maximum(magnitude, magnitude.max(axis=-1, keepdims=True) if actual.ndim > 1 else 0)
    gap = _distance(actual, expected)
    close = gap <= tolerance * scale + np.finfo(expected.dtype).tiny
    rows = [a for a in arrays if actual.ndim > 1 and a.ndim > 1 and a.shape[0] == actual.shape[0]]
    if rows and expected.dtype == np.float64:
        # the rounding of terms of the inputs' magnitude in a row's cancelling sum
        terms = np.where(np.isfinite(rows[0]), np.abs(rows[0]), 0.0).max(axis=1, keepdims=True)
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


def compare(case: Case, dtype, mode: str) -> None:
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
                         f"interpreted output {index}", arrays)
        for index, grad in enumerate(interpreted_grads):
            assert_close(grad, expected_grads[index], exact_grads[index],
                         f"interpreted gradient of input {index}", arrays)
    for index, (value, expected) in enumerate(zip(values, expected_values)):
        assert_close(value, expected, exact_values[index], f"{mode} output {index}", arrays)
    for index, (grad, expected) in enumerate(zip(grads, expected_grads)):
        assert_close(grad, expected, exact_grads[index], f"{mode} gradient of input {index}",
                     arrays)
