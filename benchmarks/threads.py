"""The thread policy of a whole step (issue 15): the tracer's default settings (its pool on every
core, OpenBLAS's threads held to one inside compiled code) against one thread
(`TRACER_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`), on an idle machine and while another process keeps
one core busy (a Python busy loop), for the seed step, the MLP step and the GPT step.

    python -m benchmarks.threads [--quick]

Each setting runs in a fresh process (`python -m benchmarks.threads --run WORKLOAD`), which times
the median of the step's calls over a few seconds after compiling and warming up; the busy process
starts before and ends after it. The ratio default / one thread is what the issue's targets read:
below 1 on an idle machine (the second core helps), at most 1.15 under one busy core (workers that
wait for a descheduled peer lose nothing)."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_THREAD = {"TRACER_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
BUSY_LOOP = "while True: pass"


def build(workload: str):
    """The tracer's program of `workload` (the seed, MLP or GPT step of benchmarks/), built."""
    if workload == "seed":
        from benchmarks import two_layer
        sizes, rate = two_layer.SIZES["64×1000→100→10"]
        return two_layer.tracer_program(two_layer.make_inputs(sizes), rate).build()
    if workload == "MLP":
        from benchmarks import mlp
        return mlp.tracer_program(mlp.make_inputs(mlp.SIZES["256×784→512→10"])).build()
    from benchmarks import transformer
    label = "16×128 tokens, 4 layers × 192 (6 heads of 32)"
    return transformer.tracer_program(transformer.make_inputs(transformer.SIZES[label])).build()


def run(workload: str, seconds: float) -> None:
    """In the fresh process: compile, warm up, then print the median seconds of a call."""
    call = build(workload)
    for _ in range(3):
        call()
    samples = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(samples) < 5:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    print(statistics.median(samples))


def measure(workload: str, one_thread: bool, busy: bool, seconds: float) -> float:
    environment = dict(os.environ, **(ONE_THREAD if one_thread else {}))
    command = [sys.executable, "-m", "benchmarks.threads", "--run", workload, str(seconds)]
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        output = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True,
                                text=True, check=True).stdout
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return float(output.split()[-1])


def lines(quick: bool) -> list[str]:
    """One line per workload and machine state: default and one-thread medians, their ratio."""
    seconds = 2.0 if quick else 6.0
    result = [f"{os.cpu_count()} cores; default settings against TRACER_NUM_THREADS=1 "
              f"OPENBLAS_NUM_THREADS=1, each a fresh process; 'busy': another process runs "
              f"`{BUSY_LOOP}` meanwhile"]
    for workload in ("seed", "MLP") if quick else ("seed", "MLP", "GPT"):
        for busy in (False, True):
            default = measure(workload, False, busy, seconds)
            single = measure(workload, True, busy, seconds)
            result.append(f"  {workload:5} {'busy core' if busy else 'idle':9}  default "
                          f"{default * 1e3:8.2f} ms  one thread {single * 1e3:8.2f} ms  "
                          f"default / one thread {default / single:.2f}")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run(sys.argv[2], float(sys.argv[3]))
    else:
        print("\n".join(lines("--quick" in sys.argv)))
