"""Weak scaling of data-parallel training on MPI: the median time of a traced step at a fixed batch
per rank, on 1 rank and on 2 (`mpiexec -n R`), each rank on one core: the 2 ranks started as a
user starts them (tracer.distributed gives each its share of the cores; the compiled step runs
OpenBLAS on one thread), the 1 rank told to use one (TRACER_NUM_THREADS=1).

    python -m benchmarks.distributed [--quick]   (the rows of `make bench`, printed)

The seed step (examples/distributed_two_layer.py: the all-reduce of each gradient inside the
compiled step) and a GPT step (examples/transformer.py's model under DistributedDataParallel,
AdamW). Three runs of each, interleaved so that the machine's load falls on all alike:

- 1 rank: the baseline, on one core (TRACER_NUM_THREADS=1), as each of the 2 ranks runs;
- 2 ranks: the data-parallel step;
- 2 ranks without communication: the same step without its all-reduces (the plain model), so the
  ranks compute independently. Its time over the baseline's is what sharing the machine costs
  before any communication (other processes, memory bandwidth): 1-rank / this is the ceiling of
  the efficiency on this machine.

- 2 ranks profiled (TRACER_PROFILE=1): the time each rank's step spends in its all-reduce
  kernels. On the rank that arrives last that is the all-reduce itself as the step sees it; the
  other rank's is longer by its wait for the slower rank.

Efficiency = time on 1 rank / time on 2 ranks (1.0: perfect weak scaling). The all-reduce is timed
alone too (mpi4py's Allreduce of the same elements, the ranks lined up by a barrier); "hidden" is
the share of it the step did not wait for, 1 - (time in the all-reduce on the last rank) / (the
all-reduce alone), within [0, 1]. The ranks' results are checked by tests/test_distributed.py,
not here: the runs train on their own data.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import Row

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
WORKLOADS = {"seed": "64×1000→100→10, 64 rows per rank",
             "gpt": "GPT 2 layers × 128, 4 heads, 8×64 tokens per rank, AdamW"}
# (ranks, whether the step communicates, environment): the three runs of each workload
RUNS = {"1 rank": (1, True, {"TRACER_NUM_THREADS": "1"}),
        "2 ranks": (2, True, {}),
        "2 ranks, no communication": (2, False, {}),
        "2 ranks profiled": (2, True, {"TRACER_PROFILE": "1"})}


def _seed_step(communicate: bool):
    """The step and the element counts of its all-reduces."""
    import tracer as tr
    sys.path.insert(0, str(ROOT / "examples"))
    from distributed_two_layer import make_data, step
    from two_layer_net import step as step_alone
    x, y, w1, w2 = make_data()
    traced = step if communicate else tr.trace(step_alone)
    return (lambda: traced(x, y, w1, w2, 1e-6)), [w1.numel(), w2.numel(), 1], traced


def _gpt_step(communicate: bool):
    import tracer as tr
    import tracer.distributed as dist
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer import GPT, Config, make_step
    tr.manual_seed(0)
    model = GPT(Config(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=128))
    wrapped = tr.nn.parallel.DistributedDataParallel(model) if communicate else model
    optimizer = tr.optim.AdamW(wrapped.parameters(), lr=1e-3)
    step = tr.trace(make_step(wrapped, optimizer))
    tr.manual_seed(1 + dist.get_rank())
    x, y = tr.randint(0, 96, (8, 64)), tr.randint(0, 96, (8, 64))
    return (lambda: step(x, y)), [sum(p.numel() for p in model.parameters())], step


def _median_all_reduce(communicator, counts: list[int], repeats: int) -> float:
    """The median time of all-reducing float32 buffers of `counts` elements, the ranks lined up by
    a barrier first (the slowest rank's time)."""
    import numpy as np
    from mpi4py import MPI
    buffers = [(np.ones(n, np.float32), np.empty(n, np.float32)) for n in counts]
    times = []
    for _ in range(repeats):
        communicator.Barrier()
        started = time.perf_counter()
        for source, target in buffers:
            communicator.Allreduce(source, target, op=MPI.SUM)
        times.append(communicator.allreduce(time.perf_counter() - started, op=MPI.MAX))
    return statistics.median(times)


def worker(name: str, communicate: bool, steps: int) -> None:
    """Run under mpiexec: time `steps` steps after warming up; rank 0 prints the median of the
    slowest rank's time per step and that of the all-reduce alone."""
    import tracer.distributed as dist
    from mpi4py import MPI
    dist.init_process_group(backend="mpi")
    step, counts, traced = {"seed": _seed_step, "gpt": _gpt_step}[name](communicate)
    for _ in range(3):  # compiles, then reaches the steady state
        step()
    communicator = MPI.COMM_WORLD
    executable = list(traced._signatures.entries.values())[-1].executable
    reducing = [k.kind == "all_reduce" for k in executable.kernels]
    times, inside = [], []
    for _ in range(steps):
        communicator.Barrier()
        before = executable.kernel_times()  # (empty unless profiled)
        started = time.perf_counter()
        step()
        times.append(communicator.allreduce(time.perf_counter() - started, op=MPI.MAX))
        mine = sum(a.seconds - b.seconds for a, b, r in
                   zip(executable.kernel_times(), before, reducing) if r)
        inside.append([communicator.allreduce(mine, op=op) for op in (MPI.MIN, MPI.MAX)])
    all_reduce = _median_all_reduce(communicator, counts, steps) if communicate else 0.0
    if dist.get_rank() == 0:
        print(json.dumps({"median": statistics.median(times), "all_reduce": all_reduce,
                          "inside_last": statistics.median(i[0] for i in inside),
                          "inside_first": statistics.median(i[1] for i in inside),
                          "threads": os.environ.get("TRACER_NUM_THREADS")}))


def measure(name: str, run: str, steps: int) -> dict:
    ranks, communicate, settings = RUNS[run]
    # as a user starts them: 2 ranks choose their threads (tracer.distributed shares the cores)
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("TRACER_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    environment.update(PYTHONPATH=str(ROOT), **settings)
    result = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m",
                             "benchmarks.distributed", "--worker", name, str(int(communicate)),
                             str(steps)], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    if measured["threads"] != "1":  # each rank on one core, as the figures say
        raise RuntimeError(f"{run}: TRACER_NUM_THREADS={measured['threads']} per rank, not 1")
    return measured


def rows(quick: bool) -> list[Row]:
    """One row per workload: the tracer column is the time per step on 2 ranks, the floors the
    time on 1 rank (so tracer / floor is 1 / efficiency) and on 2 ranks without communication."""
    result = []
    for name, size in WORKLOADS.items():
        row = Row("data-parallel step on 2 ranks (weak scaling)", size)
        try:
            steps, rounds = (10, 1) if quick else (30, 3)
            measured: dict[str, list[dict]] = {run: [] for run in RUNS}
            for _ in range(rounds):
                for run in RUNS:
                    measured[run].append(measure(name, run, steps))
            median = {run: statistics.median(m["median"] for m in values)
                      for run, values in measured.items()}
            all_reduce = statistics.median(m["all_reduce"] for m in measured["2 ranks"])
            last, first = (statistics.median(m[key] for m in measured["2 ranks profiled"])
                           for key in ("inside_last", "inside_first"))
            one, two, alone = median["1 rank"], median["2 ranks"], median["2 ranks, no communication"]
            hidden = min(1.0, max(0.0, 1 - last / all_reduce))
            row.seconds["tracer"] = two
            row.floors.update({"1 rank": one, "2 ranks, no communication": alone})
            row.size += (f" (efficiency {one / two:.2f}, without communication {one / alone:.2f}; "
                         f"all-reduce alone {all_reduce * 1e3:.2f} ms, in the step "
                         f"{last * 1e3:.2f} ms + {(first - last) * 1e3:.2f} ms waiting for the "
                         f"slower rank, hidden {hidden:.0%})")
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as error:
            row.failures["tracer"] = str(error)[:300]
        result.append(row)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]))
    else:
        for row in rows(quick="--quick" in sys.argv):
            print(row)
