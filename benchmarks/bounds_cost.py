"""What bounds checking costs: the GELU custom Function (fwd+bwd, 1M floats) traced twice, once
compiled with TRACER_CHECK_BOUNDS=1 and once without (the setting is read when a signature
compiles), on one thread and on all; medians from interleaved rounds, and their ratio.

    python -m benchmarks.bounds_cost [--repeats N]     (from the repository root)
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks import gelu
from benchmarks.harness import Timing, median_times


def compiled_program(inputs, checked: bool, threads: str):
    """A call of the traced GELU, compiled (by its first call) under the given settings."""
    os.environ.update(TRACER_CHECK_BOUNDS="1" if checked else "0", TRACER_NUM_THREADS=threads)
    try:
        run = gelu.tracer_program(inputs).build()
        y, x_grad = run()
    finally:
        os.environ.pop("TRACER_CHECK_BOUNDS")
        os.environ.pop("TRACER_NUM_THREADS")
    expected = gelu.reference(inputs)
    for result, reference in zip((y, x_grad), expected):
        np.testing.assert_allclose(result.numpy(), reference, rtol=gelu.TOLERANCE,
                                   atol=gelu.TOLERANCE)
    return run


def lines(repeats: int = 100, budget: float = 60.0) -> list[str]:
    """The figures, one line each: medians of up to `repeats` calls within `budget` seconds
    per program (`make bench` runs this with fewer)."""
    found: list[str] = []
    inputs = gelu.make_inputs(gelu.SIZES["1M"])
    for threads in ("1", ""):
        calls = {checked: compiled_program(inputs, checked, threads) for checked in (False, True)}
        times = median_times(calls, Timing(repeats=repeats, budget=budget))
        found.append(f"GELU fwd+bwd 1M, threads={threads or 'default'}: unchecked "
                     f"{times[False] * 1e3:.3f} ms, checked {times[True] * 1e3:.3f} ms, "
                     f"ratio {times[True] / times[False]:.2f}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    print("\n".join(lines(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
