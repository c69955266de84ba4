"""Where the second core's time goes (issue 15): a step compiled for one thread and for two, with
TRACER_PROFILE=1, called alternately in one process; per kernel the minimum time over the calls
(a call the machine descheduled only adds time), summed by kind, and the kernels that lose most
against a perfect halving. Needs a quiet machine: on a loaded one the pool's stall back-off runs
the two-thread launches on their caller alone and the two columns come out equal (the launches'
counts, shared or backed off, say how many did).

    python -m benchmarks.thread_scaling [--workload gpt|mlp|seed] [--calls N] [--top N]

Reads the per-kernel times from the traced function's compiled signature, as
benchmarks/kernel_profile.py does (internal: the public API shows them in `f.report(path)`)."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from benchmarks.kernel_profile import profiled
from tracer.runtime import pool


def builders(workload: str) -> Callable[[], Callable]:
    """The build function of the tracer's program of `workload` at its issue shape."""
    if workload == "seed":
        from benchmarks import two_layer
        sizes, rate = two_layer.SIZES["64×1000→100→10"]
        return two_layer.tracer_program(two_layer.make_inputs(sizes), rate).build
    if workload == "mlp":
        from benchmarks import mlp
        return mlp.tracer_program(mlp.make_inputs(mlp.SIZES["256×784→512→10"])).build
    from benchmarks import transformer
    label = "16×128 tokens, 4 layers × 192 (6 heads of 32)"
    return transformer.tracer_program(transformer.make_inputs(transformer.SIZES[label])).build


def lines(build: Callable[[], Callable], calls: int = 15, top: int = 15) -> list[str]:
    runs = {threads: profiled(build, TRACER_NUM_THREADS=str(threads)) for threads in (1, 2)}
    minima: dict[int, list[float]] = {}
    walls: dict[int, list[float]] = {threads: [] for threads in runs}
    launches = dict.fromkeys(pool.COUNTS, 0)  # of the two-thread calls
    for _ in range(calls):
        for threads, (run, executable) in runs.items():
            before = [seconds for _, _, seconds in executable.kernel_times()]
            counts = pool.counts() if threads == 2 else {}
            start = time.perf_counter()
            run()
            walls[threads].append(time.perf_counter() - start)
            after = pool.counts() if counts else {}
            for name, count in counts.items():
                launches[name] += after[name] - count
            spent = [seconds - old for (_, _, seconds), old in
                     zip(executable.kernel_times(), before)]
            minima[threads] = [min(pair) for pair in zip(minima.get(threads, spent), spent)]
    result = [f"{threads} thread{'s' if threads > 1 else ''}: median call "
              f"{1e3 * statistics.median(walls[threads]):.1f} ms, kernels' minima "
              f"{1e3 * sum(minima[threads]):.1f} ms" for threads in runs]
    result.append("  two-thread launches a call: " + ", ".join(
        f"{name.replace('_', ' ')} {count / calls:.1f}" for name, count in launches.items()))
    kernels = runs[2][1].fused.kernels
    kinds: dict[str, list[float]] = {}
    for number, kernel in enumerate(kernels):
        totals = kinds.setdefault(kernel.kind, [0.0, 0.0, 0])
        totals[0] += minima[1][number]
        totals[1] += minima[2][number]
        totals[2] += 1
    for kind, (one, two, count) in sorted(kinds.items(), key=lambda item: -item[1][0]):
        result.append(f"  {kind:10} ({count:3}): 1 thread {1e3 * one:8.2f} ms, 2 threads "
                      f"{1e3 * two:8.2f} ms, speedup {one / two if two else 0:.2f}")
    losing = sorted(range(len(kernels)), key=lambda n: -(minima[2][n] - minima[1][n] / 2))
    for number in losing[:top]:
        one, two = minima[1][number], minima[2][number]
        result.append(f"  kernel_{number:<4} {kernels[number].kind:10} 1 thread {1e3 * one:7.3f}"
                      f" ms, 2 threads {1e3 * two:7.3f} ms, speedup {one / two if two else 0:.2f}"
                      f" -> {kernels[number].results[0].type}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("gpt", "mlp", "seed"), default="gpt")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args()
    print("\n".join(lines(builders(options.workload), options.calls, options.top)))


if __name__ == "__main__":
    main()
