"""What a parallel kernel launch costs: `x * 2 + 1` traced on 64K float32 elements (and on 64,
where the work is nothing and the time is the launch), compiled once on one thread and once with
its kernel forced onto all threads (ir/schedule_threads.py's PARALLEL_WORK_PER_THREAD set to 1 while it
compiles); the median time per call of each, from interleaved rounds, and the difference.

    python -m benchmarks.launch_cost [--repeats N]     (from the repository root)
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from benchmarks.harness import Timing, median_times

SIZES = {"64": 64, "64K": 1 << 16}


def compiled_call(x_array: np.ndarray, forced_parallel: bool):
    """A call of the traced `x * 2 + 1`, compiled (by its first call) with its kernel forced
    onto all threads or kept on the calling thread; its result checked against numpy."""
    import tracer as tr
    from tracer.ir import schedule_threads

    saved = schedule_threads.PARALLEL_WORK_PER_THREAD, os.environ.get("TRACER_CACHE_DIR")
    schedule_threads.PARALLEL_WORK_PER_THREAD = 1 if forced_parallel else 1 << 62
    # The cache keys (in memory and on disk) hold the program, not PARALLEL_WORK_PER_THREAD: a
    # cache directory of its own makes each version compile.
    os.environ["TRACER_CACHE_DIR"] = tempfile.mkdtemp(prefix="launch-cost-")
    try:
        traced = tr.trace(lambda x: x * 2 + 1)
        x = tr.tensor(x_array)
        result = traced(x)
        if forced_parallel and x_array.size > 1:
            assert " threads:" in traced.ir(x, stage="loops")
    finally:
        schedule_threads.PARALLEL_WORK_PER_THREAD = saved[0]
        os.environ.pop("TRACER_CACHE_DIR")
        if saved[1] is not None:
            os.environ["TRACER_CACHE_DIR"] = saved[1]
    np.testing.assert_array_equal(result.numpy(), x_array * 2 + 1)
    return lambda: traced(x)


def lines(repeats: int = 20_000, budget: float = 20.0) -> list[str]:
    """The figures, one line each: medians of up to `repeats` calls within `budget` seconds
    per program (`make bench` runs this with fewer)."""
    found: list[str] = []
    threads = os.environ.get("TRACER_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
    for label, size in SIZES.items():
        x_array = np.random.default_rng(0).standard_normal(size).astype(np.float32)
        calls = {parallel: compiled_call(x_array, parallel) for parallel in (False, True)}
        times = median_times(calls, Timing(repeats=repeats, budget=budget))
        found.append(f"x * 2 + 1 on {label} float32: 1 thread {times[False] * 1e6:.1f} µs, "
                     f"forced onto {threads} threads {times[True] * 1e6:.1f} µs per call, "
                     f"difference {(times[True] - times[False]) * 1e6:+.1f} µs")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20_000)
    print("\n".join(lines(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
