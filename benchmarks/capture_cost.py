"""What reading parameters from objects costs per call: one tiny step (x * w1 + b1, x * w2 + b2,
times a scale, summed; 16 floats) traced three ways -- its tensors as arguments, held in a model
object's attributes (a traced method, guarded paths and a guarded number), read from a global --
and the guard check of each signature alone; medians from interleaved rounds (µs per call).

    python -m benchmarks.capture_cost [--repeats N]     (from the repository root)
"""
from __future__ import annotations

import argparse
import timeit

import numpy as np

import tracer as tr
from benchmarks.harness import Timing, median_times
from tracer.runtime.guards import captured_change

CALLS_PER_SAMPLE = 200
SCALE = 2.0
WEIGHT = tr.ones(16)


def with_arguments(x, w1, b1, w2, b2, scale):
    for w, b in ((w1, b1), (w2, b2)):
        x = x * w + b
    return (x * scale).sum()


class Model:
    def __init__(self, tensors):
        self.layers = [tensors[:2], tensors[2:]]
        self.scale = SCALE

    @tr.trace
    def step(self, x):
        for w, b in self.layers:
            x = x * w + b
        return (x * self.scale).sum()


def with_a_global(x):
    return (x * WEIGHT + 1).sum()


def lines(repeats: int = 200, budget: float = 60.0) -> list[str]:
    """The figures, one line each: medians of up to `repeats` calls within `budget` seconds
    per program (`make bench` runs this with fewer)."""
    found: list[str] = []
    generator = np.random.default_rng(0)
    tensors = [tr.tensor(generator.standard_normal(16), dtype=tr.float32) for _ in range(4)]
    x = tr.tensor(generator.standard_normal(16), dtype=tr.float32)
    model = Model(tensors)
    traced = tr.trace(with_arguments)
    global_traced = tr.trace(with_a_global)
    calls = {"arguments": lambda: traced(x, *tensors, SCALE),
             "model object": lambda: model.step(x),
             "global tensor": lambda: global_traced(x)}
    # float64 reference: x * w + b twice, scaled, summed
    values = [t.numpy().astype(np.float64) for t in (x, *tensors)]
    expected = ((values[0] * values[1] + values[2]) * values[3] + values[4]) * SCALE
    for name in ("arguments", "model object"):
        np.testing.assert_allclose(calls[name]().item(), expected.sum(), rtol=1e-5)
    np.testing.assert_allclose(calls["global tensor"]().item(), (values[0] + 1).sum(), rtol=1e-5)

    def repeated(call):
        def run():
            for _ in range(CALLS_PER_SAMPLE):
                call()
        return run

    times = median_times({name: repeated(call) for name, call in calls.items()},
                         Timing(repeats=repeats, minimum=20, budget=budget))
    for name, (function, arguments) in {"arguments": (traced, (x, *tensors, SCALE)),
                                        "model object": (Model.step, (model, x)),
                                        "global tensor": (global_traced, (x,))}.items():
        entry, _, _ = function._lookup(arguments, {}, False, None)
        check = min(timeit.repeat(lambda entry=entry: captured_change(entry), number=10000, repeat=5)) / 10000
        found.append(f"{name}: {times[name] / CALLS_PER_SAMPLE * 1e6:.1f} µs per call, "
                     f"guard check {check * 1e6:.2f} µs ({len(entry.guards)} paths, "
                     f"{len(entry.captured)} captured tensors)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    print("\n".join(lines(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
