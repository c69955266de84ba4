"""The differential tester's random programs through `tr.vmap`: a program of the "value" kind (its
results), the "grad" kind (the gradient of a weighted sum of its results: per-sample gradients) or
the "grad2" kind (second order, by autograd.grad with create_graph inside the mapped function)
mapped over a batch of inputs -- each input mapped along a drawn dimension or not mapped -- eagerly
and under `@tr.trace`, against the same program run once per element on its own tensors (the
independent oracle of the batching pass: no vmap, no batching rule). A program the pass cannot
batch may only fall back to the per-element loop because tracing one element needs its values, or
because a custom Function computes on the host."""
import dataclasses
import logging

import numpy as np
import pytest
from hypothesis import assume, event, given, settings, strategies as st

import tracer as tr
from test_differential import (Backend, SETTINGS, _changed, _flatten, _program_function,
                               make_array, programs)

SIZE = 3
RTOL = {"float64": 1e-10, "float32": 1e-5}  # of the largest magnitude, at least 1 (sums may add otherwise)


@st.composite
def mapped_programs(draw):
    program = draw(programs(kinds=["value", "grad"]))
    # second order inside vmap; not through a Function whose backward computes in numpy, which
    # has no second derivative (tracer refuses it, as test_differential_second_order.py says)
    if (program.kind == "grad" and draw(st.booleans())
            and not any(op[:2] == ("unary", "numpy_tanh_fn") for op in program.ops)):
        program = dataclasses.replace(program, kind="grad2")
    arguments = {k for k, op in enumerate(program.ops) if op[0] == "arg"}
    # (a mapped argument's element is a slice of it: tracer refuses in-place changes of slices)
    assume(not any(_changed(op) in arguments for op in program.ops))
    dims = [draw(st.one_of(st.none(), st.integers(-len(spec.shape) - 1, len(spec.shape))))
            for spec in program.inputs]
    assume(any(d is not None for d in dims))
    return program, dims


def _elements(program, dims, dtype=None):
    """Per element, its arrays; the mapped inputs differ between elements (their seeds). With
    `dtype` (the float64 evaluation), the same values in it."""
    return [[make_array(dataclasses.replace(spec, seed=spec.seed + 1000 * element * (d is not None)),
                        dtype)
             for spec, d in zip(program.inputs, dims)] for element in range(SIZE)]


def _run_once_per_element(program, elements):
    results = []
    for arrays in elements:
        function = _program_function(Backend(tr), program)
        try:  # (reading a result may be refused too: a stale view-copy, F3)
            outputs = _flatten(list(_as_list(function(*(tr.tensor(a) for a in arrays)))))
            results.append([o.detach().numpy() for o in outputs])
        except tr.TracerError:
            return None
    if any(r.shape != first.shape for per in results for r, first in zip(per, results[0])):
        return None
    return [np.stack([per[k] for per in results]) for k in range(len(results[0]))]


def _as_list(value):
    return value if isinstance(value, (list, tuple)) else [value]


def _batched_arguments(elements, dims):
    arguments = []
    for k, d in enumerate(dims):
        if d is None:
            arguments.append(tr.tensor(elements[0][k]))
        else:
            stacked = np.stack([arrays[k] for arrays in elements])
            arguments.append(tr.tensor(np.moveaxis(stacked, 0, d % stacked.ndim)))
    return arguments


class _Fallbacks(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_mapped(mapped):
    program, dims = mapped
    elements = _elements(program, dims)
    expected = _run_once_per_element(program, elements)
    assume(expected is not None)
    exact = _run_once_per_element(program, _elements(program, dims, "float64"))
    dims = [None if d is None else d % (len(spec.shape) + 1)
            for spec, d in zip(program.inputs, dims)]
    logger, fallbacks = logging.getLogger("tracer.vmap"), _Fallbacks()
    logger.addHandler(fallbacks)
    level, logger.level = logger.level, logging.INFO
    try:
        for traced in (False, True):
            mapped = tr.vmap(_program_function(Backend(tr), program), in_dims=tuple(dims))
            if traced:
                mapped = tr.trace(mapped)
            outputs = _flatten(list(_as_list(mapped(*_batched_arguments(elements, dims)))))
            assert len(outputs) == len(expected)
            for k, (actual, reference) in enumerate(zip(outputs, expected)):
                actual = actual.detach().numpy()
                assert actual.shape == reference.shape and actual.dtype == reference.dtype
                if reference.dtype.kind != "f":
                    np.testing.assert_array_equal(actual, reference)
                    continue
                # of at least 1, as test_differential.py's: a result that is only rounding noise
                # (a batch norm's gradient over 2 elements: exactly 0, computed as 2e-6 from
                # terms near 1) has no smaller scale to be judged by
                scale = float(np.nanmax(np.abs(reference), initial=0.0)) \
                    if np.isfinite(reference).any() else 0.0
                # judged in the lowest precision the program computes in, as test_differential.py
                # judges it: a float64 result of float32 inputs (cumsum(dtype=float64) of a
                # cross-entropy) carries the float32 roundings of a batched evaluation order
                precision = min([reference.dtype.name, *(spec.dtype for spec in program.inputs
                                                         if spec.dtype != "int64")],
                                key=lambda d: np.dtype(d).itemsize)
                tolerance = RTOL[precision] * max(scale, 1.0)
                a, r = actual.astype(np.float64), reference.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    ok = (a == r) | (np.isnan(a) & np.isnan(r)) | (np.abs(a - r) <= tolerance)
                    # or as test_differential.py judges: no more than 8 times as far from the
                    # float64 evaluation as the per-element result (both are float32 evaluations:
                    # a float32 fmod of a cosh near 100 keeps cosh's last ulp, 7.6e-6, and the
                    # compiled and eager exp may round it apart)
                    if exact is not None and exact[k].shape == actual.shape:
                        x = exact[k].astype(np.float64)
                        ok |= np.abs(a - x) <= 8 * np.abs(r - x) + tolerance
                assert ok.all(), (f"result {k}: {int((~ok).sum())} of {ok.size} elements differ, "
                                  f"e.g. {a[~ok][:3]} against {r[~ok][:3]} (tolerance "
                                  f"{tolerance:.3g})")
    finally:
        logger.removeHandler(fallbacks)
        logger.level = level
    event(f"{program.kind}: {'loop' if fallbacks.messages else 'batched'}")
    # the two documented reasons (README, tr.vmap): tracing one element needs its values, or
    # a custom Function computes on the host (its numpy code is written for one element)
    assert all("needs its values" in message or "computes on the host" in message
               for message in fallbacks.messages), fallbacks.messages


# `make test`: 60 programs, the same on every run (about 20 s on the busy 2-core machine,
# compiling each; 120 took 42 s)
@settings(max_examples=60, derandomize=True, **SETTINGS)
@given(mapped_programs())
def test_random_programs_through_vmap_agree_with_one_run_per_element(mapped):
    check_mapped(mapped)


# `make test-slow`: 2,000 programs.
@pytest.mark.slow
@settings(max_examples=2_000, **SETTINGS)
@given(mapped_programs())
def test_random_programs_through_vmap_long(mapped):
    check_mapped(mapped)
