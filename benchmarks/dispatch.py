"""The cost of one call: `(x * 2 + 1).sum()` on 16 elements, and its gradient by `.backward()`,
where the work is nothing and the time is what each framework adds per call."""
from __future__ import annotations

import numpy as np

from benchmarks.harness import Program, Row, Timing, measure, with_fresh_grads
from benchmarks.peers import installed, jax_programs, torch_programs

SIZE = 16
TOLERANCE = 1e-6  # 16 additions of float32 values near 1: exact to a few ulp


def value(x):
    """The same code for tracer and torch tensors, and numpy and jax arrays."""
    return (x * 2 + 1).sum()


def gradient(x):
    """The same code for tracer and torch tensors."""
    value(x).backward()
    return x.grad


def make_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SIZE).astype(np.float32)


def tracer_and_numpy_programs(x_array) -> dict[str, list[Program]]:
    import tracer as tr

    def build(function, requires_grad):
        x = tr.tensor(x_array, requires_grad=requires_grad)
        traced = tr.trace(function)
        return with_fresh_grads(lambda x: (traced(x),), x) if requires_grad else lambda: (traced(x),)
    return {"value": [Program("tracer", lambda: build(value, False)),
                      Program("numpy", lambda: lambda: (value(x_array),))],
            "gradient": [Program("tracer", lambda: build(gradient, True)),
                         Program("numpy", lambda: lambda: (np.full_like(x_array, 2),))]}


def torch_dispatch_programs(x_array) -> dict[str, list[Program]]:
    torch = installed("torch")
    if torch is None:
        return {"value": [], "gradient": []}

    def build_value(function):
        x = torch.from_numpy(x_array.copy())
        return lambda: (function(x),)

    def build_gradient(function):
        x = torch.from_numpy(x_array.copy()).requires_grad_()
        return with_fresh_grads(lambda x: (function(x),), x)
    return {"value": torch_programs(value, build_value),
            "gradient": torch_programs(gradient, build_gradient)}


def jax_dispatch_programs(x_array) -> dict[str, list[Program]]:
    jax = installed("jax")
    if jax is None:
        return {"value": [], "gradient": []}
    x = jax.numpy.asarray(x_array)

    def build(function):
        return lambda: (jax.block_until_ready(function(x)),)
    return {"value": jax_programs(value, build), "gradient": jax_programs(jax.grad(value), build)}


def programs(x_array) -> dict[str, list[Program]]:
    own = tracer_and_numpy_programs(x_array)
    torch = torch_dispatch_programs(x_array)
    jax = jax_dispatch_programs(x_array)
    return {kind: [*own[kind], *torch[kind], *jax[kind]] for kind in ("value", "gradient")}


def reference(x_array) -> dict[str, list[np.ndarray]]:
    return {"value": [np.asarray(value(x_array.astype(np.float64)))],
            "gradient": [np.full(SIZE, 2.0)]}


def rows(quick: bool, timing: Timing) -> list[Row]:
    x_array = make_input()
    expected = reference(x_array)
    names = {"value": "dispatch: (x*2+1).sum()", "gradient": "dispatch: its gradient"}
    return [measure(Row(names[kind], f"{SIZE} float32, per call"), kind_programs,
                    expected[kind], TOLERANCE, timing)
            for kind, kind_programs in programs(x_array).items()]
