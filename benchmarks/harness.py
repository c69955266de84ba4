"""What every workload shares: a program per peer, the check against the float64 reference,
median timing, and the row of the results table."""
from __future__ import annotations

import contextlib
import importlib.util
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PEERS = ("tracer", "numpy", "torch eager", "torch.compile", "torch.compile fullgraph", "jax.jit")
# Each program is run this many times before its result is checked: a second call reaches the
# signature that the timed calls use (a training step's `.grad` exists from the second step on).
CALLS_BEFORE_CHECK = 2
# Seconds each program runs untimed before each timed call (median_times): longer than libgomp's
# default spin after an operation (300,000 pauses, a few milliseconds).
SETTLE = 0.02


def load_example(filename: str):
    """A program of examples/ (what users start from), loaded from its file as a module (named
    apart from any module of the file's own name; registered, as dataclasses need)."""
    if str(EXAMPLES) not in sys.path:  # examples import one another (cnn_digits reads digits)
        sys.path.insert(0, str(EXAMPLES))
    name = f"benchmarks.examples.{Path(filename).stem}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Program:
    """One peer's version of a workload: `build()` makes fresh state and returns the call that
    runs one step on it and returns the results."""
    peer: str
    build: Callable[[], Callable[[], tuple]]
    setting: Callable[[], ContextManager] = contextlib.nullcontext


@dataclass
class Row:
    workload: str
    size: str
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    """How long to time: `repeats` calls of each program, or fewer when the run takes over
    `budget` seconds (at least `minimum`)."""
    repeats: int
    budget: float
    minimum: int = 5


def median_times(calls: dict[str, Callable[[], object]], timing: Timing,
                 settings: dict[str, Callable[[], ContextManager]] | None = None) -> dict[str, float]:
    """The median time of each call, measured in rounds that run every call once, so that a
    noisy stretch of the machine's load falls on all of them alike, in a new order each round.
    Before its timed call, each call runs untimed for SETTLE seconds (once at least): the timed
    call then finds the machine as a training loop leaves it, with its own threads and caches
    warm and the previous peer's threads no longer spinning (torch's OpenMP threads spin for
    milliseconds after each operation under their default OMP_WAIT_POLICY, which a user of torch
    keeps; setting it to PASSIVE instead made torch's GPT step 1.6x slower). A call's setting (if
    any) is entered around it, outside the time measured."""
    settings = settings or {}
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    shuffle = random.Random(0).shuffle
    started = time.perf_counter()
    for round_number in range(timing.repeats):
        if round_number >= timing.minimum and time.perf_counter() - started > timing.budget:
            break
        shuffle(order)
        for name in order:
            with settings.get(name, contextlib.nullcontext)():
                settled = time.perf_counter() + SETTLE
                calls[name]()
                while time.perf_counter() < settled:
                    calls[name]()
                start = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def with_fresh_grads(function: Callable, *arguments) -> Callable[[], object]:
    """The call timed: the `.grad` of every argument that requires grad is cleared first, so that
    each call computes its gradients afresh (tracer and torch tensors alike)."""
    leaves = [a for a in arguments if getattr(a, "requires_grad", False)]

    def run():
        for leaf in leaves:
            leaf.grad = None
        return function(*arguments)
    run.traced = function  # for benchmarks/kernel_profile.py
    return run


def to_numpy(value) -> np.ndarray:
    """A tracer or torch tensor, a jax or numpy array, or a number, as a float64 array."""
    if hasattr(value, "detach"):
        value = value.detach().numpy()
    return np.asarray(value, dtype=np.float64)


class CheckError(AssertionError):
    pass


def check(results: Sequence, expected: Sequence[np.ndarray], tolerance: float,
          scales: Sequence[float] | None = None) -> None:
    """Each result is within `tolerance * scale` of the float64 reference, plus the float32
    spacing at the reference value (a float32 result cannot be closer than its rounding).
    The scale of an output is its largest magnitude unless `scales` gives it."""
    if len(results) != len(expected):
        raise CheckError(f"{len(results)} results, expected {len(expected)}")
    for index, (result, reference) in enumerate(zip(results, expected)):
        actual = to_numpy(result)
        if actual.shape != reference.shape:
            raise CheckError(f"result {index}: shape {actual.shape}, expected {reference.shape}")
        scale = scales[index] if scales else float(np.abs(reference).max(initial=0.0))
        allowed = tolerance * scale + np.spacing(np.abs(reference).astype(np.float32))
        excess = np.abs(actual - reference) - allowed
        if not np.all(excess <= 0):  # also catches nan
            worst = int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)))
            raise CheckError(
                f"result {index}: element {np.unravel_index(worst, actual.shape)} is "
                f"{actual.flat[worst]!r}, expected {reference.flat[worst]!r} "
                f"(tolerance {tolerance:g} x scale {scale:g})")


def checked_run(program: Program, expected: Sequence[np.ndarray], tolerance: float,
                scales: Sequence[float] | None = None) -> Callable[[], tuple]:
    """Build the program, run it CALLS_BEFORE_CHECK times, check the last results against the
    reference, and return its call (raises CheckError on a wrong result)."""
    with program.setting():
        run = program.build()
        for _ in range(CALLS_BEFORE_CHECK):
            results = run()
        check(results, expected, tolerance, scales)
    return run


def failure(error: Exception) -> str:
    """An error, on one line, short enough for a table cell's footnote."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]


def measure(row: Row, programs: Sequence[Program], expected: Sequence[np.ndarray],
            tolerance: float, timing: Timing, scales: Sequence[float] | None = None,
            floors: dict[str, Callable[[], object]] | None = None) -> Row:
    """Check each program against the reference, then time the programs that passed together
    with the floors; a program that raises or computes a wrong result is recorded as failing,
    with the error."""
    runs = {}
    for program in programs:
        try:
            runs[program.peer] = checked_run(program, expected, tolerance, scales)
        except Exception as error:  # noqa: BLE001 - any failure is a result to report
            row.failures[program.peer] = failure(error)
    floors = floors or {}
    settings = {program.peer: program.setting for program in programs}
    measured = median_times({**runs, **floors}, timing, settings)
    row.seconds = {peer: measured[peer] for peer in runs}
    row.floors = {name: measured[name] for name in floors}
    return row
