"""Run every benchmark and write benchmarks/results.md and benchmarks/results.png.

    python -m benchmarks.run [--quick]     (from the repository root; `make bench`)
    python -m benchmarks.run --only cnn transformer    (those workloads' rows, printed only)

User programs through the public API only, each run by the tracer and, in the same process, by
numpy written by hand, PyTorch eager, torch.compile and jax.jit where installed; every result is
checked against a float64 reference before it is timed; the machine's floors (memory
streaming, BLAS sgemm) are timed in the same rounds. `--quick` (about 5 minutes on the loaded
2-core machine, 2.5 of them the transformer's row, mostly torch.compile compiling): one size per
workload, fewer repeats, no torch in the fresh-process rows.
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one size per workload and fewer repeats, for daily use")
    parser.add_argument("--output", type=Path, default=HERE,
                        help="folder for results.md and results.png (default: benchmarks/)")
    parser.add_argument("--only", nargs="+", metavar="WORKLOAD", choices=WORKLOADS,
                        help="print the rows of these workloads (modules of benchmarks/), at "
                             "every size unless --quick, and write nothing")
    options = parser.parse_args()
    # torch keeps its default OMP_WAIT_POLICY, as its users do: benchmarks/harness.py's rounds
    # let its spinning threads settle before another peer's timed call.
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as directory:
        # Compilers start from empty disk caches, so that compile times are cold every run.
        os.environ["TRACER_CACHE_DIR"] = f"{directory}/tracer"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{directory}/inductor"
        if options.only:
            run_only(options.only, options.quick)
        else:
            run(options.quick, options.output)


# The modules of benchmarks/ whose rows make the table, in its order.
WORKLOADS = ("two_layer", "mlp", "transformer", "cnn", "higher_order", "gelu", "layer_norm",
             "cross_entropy", "dispatch")


def timing_for(quick: bool):
    from benchmarks.harness import Timing
    return Timing(repeats=15, budget=0.5) if quick else Timing(repeats=200, budget=10.0)


def run_only(workloads: list[str], quick: bool) -> None:
    """The rows of `workloads` alone, as the whole run measures them, printed as its table."""
    from benchmarks import report
    rows = [row for name in workloads
            for row in importlib.import_module(f"benchmarks.{name}").rows(quick, timing_for(quick))]
    print(report.table(rows, [f"{'quick' if quick else 'full'} rows of {', '.join(workloads)}, "
                              f"{time.strftime('%Y-%m-%d')}"]))


def run(quick: bool, output: Path) -> None:
    from benchmarks import (bounds_cost, capture_cost, compile_time, distributed, first_result,
                            gather_cost, launch_cost, mlp, peers, per_sample_gradients,
                            readme_table, report, threads, transformer)
    from benchmarks.harness import PEERS

    timing = timing_for(quick)
    started = time.perf_counter()
    rows = []
    for name in WORKLOADS:
        rows += importlib.import_module(f"benchmarks.{name}").rows(quick, timing)
        print(f"{time.perf_counter() - started:6.1f}s  {rows[-1].workload}", flush=True)
    # --quick leaves torch out: it takes seconds to import, torch.compile tens of seconds to compile
    rows += first_result.rows([peer for peer in PEERS if peers.available(peer)
                               and not (quick and peer.startswith("torch"))])
    print(f"{time.perf_counter() - started:6.1f}s  {rows[-1].workload}", flush=True)
    rows += compile_time.rows(quick)
    print(f"{time.perf_counter() - started:6.1f}s  {rows[-1].workload}", flush=True)
    rows += distributed.rows(quick)
    print(f"{time.perf_counter() - started:6.1f}s  {rows[-1].workload}", flush=True)
    notes = [f"{'quick' if quick else 'full'} run, {time.strftime('%Y-%m-%d')}, "
             f"{platform.machine()}, {peers.THREADS} cores; "
             f"medians of up to {timing.repeats} calls per program, timed in interleaved rounds in shuffled order",
             f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset (torch default)')}",
             *peers.notes()]
    if quick:
        notes.append("time to first result: torch left out of --quick (its import takes seconds, "
                     "torch.compile tens of seconds)")
    # where the model steps' time goes, kernel by kernel (TRACER_PROFILE=1)
    profiles = [*mlp.profiles(quick), *transformer.profiles(quick)]
    print(f"{time.perf_counter() - started:6.1f}s  kernel profiles", flush=True)
    # what the index and bounds checks, the guards of captured state and a parallel launch cost
    costs = [line for probe in (bounds_cost, gather_cost, capture_cost, launch_cost)
             for line in (probe.lines(budget=3.0) if quick else probe.lines())]
    print(f"{time.perf_counter() - started:6.1f}s  costs of checks, guards and launches", flush=True)
    per_sample = per_sample_gradients.lines(quick)
    print(f"{time.perf_counter() - started:6.1f}s  per-sample gradients", flush=True)
    thread_policy = threads.lines(quick)
    print(f"{time.perf_counter() - started:6.1f}s  threads: default against one", flush=True)
    text = report.table(rows, notes)
    text += ("\n## Where the tracer's model steps spend their time (TRACER_PROFILE=1)\n\n```\n"
             + "\n\n".join(profiles) + "\n```\n")
    text += ("\n## What checks, guards and parallel launches cost\n\n```\n" + "\n".join(costs)
             + "\n```\n")
    text += ("\n## Per-sample gradients: tr.vmap batched, unrolled, torch.func\n\n```\n"
             + "\n".join(per_sample) + "\n```\n")
    text += ("\n## Threads: default settings against one thread, idle and beside a busy core\n\n"
             "```\n" + "\n".join(thread_policy) + "\n```\n")
    (output / "results.md").write_text(text)
    report.chart(rows, notes[0], output / "results.png")
    if output == HERE:
        readme_table.update()
    print(text)


if __name__ == "__main__":
    main()
