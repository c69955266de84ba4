"""Weak scaling of data-parallel training on MPI: the median time of a traced step at a fixed batch
per rank, on 1 rank and on 2 (`mpiexec -n R`), each rank on its share of the cores
(tracer.distributed sets TRACER_NUM_THREADS; OpenBLAS on one thread per rank).

    python -m benchmarks.distributed            (the rows of `make bench`, printed)

The seed step (examples/distributed_two_layer.py: the all-reduce of each gradient inside the
compiled step) and a GPT step (examples/transformer.py's model under DistributedDataParallel,
AdamW). Efficiency = time on 1 rank / time on 2 ranks (1.0: perfect weak scaling). The ranks'
results are checked by tests/test_distributed.py, not here: both runs train on their own data.
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


def _seed_step():
    sys.path.insert(0, str(ROOT / "examples"))
    from distributed_two_layer import make_data, step
    x, y, w1, w2 = make_data()
    return lambda: step(x, y, w1, w2, 1e-6)


def _gpt_step():
    import tracer as tr
    import tracer.distributed as dist
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer import GPT, Config, make_step
    tr.manual_seed(0)
    model = GPT(Config(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=128))
    ddp = tr.nn.parallel.DistributedDataParallel(model)
    optimizer = tr.optim.AdamW(ddp.parameters(), lr=1e-3)
    step = tr.trace(make_step(ddp, optimizer))
    tr.manual_seed(1 + dist.get_rank())
    x, y = tr.randint(0, 96, (8, 64)), tr.randint(0, 96, (8, 64))
    return lambda: step(x, y)


def worker(name: str, steps: int) -> None:
    """Run under mpiexec: time `steps` steps after warming up; rank 0 prints the median of the
    slowest rank's time per step."""
    import tracer.distributed as dist
    from mpi4py import MPI
    dist.init_process_group(backend="mpi")
    step = {"seed": _seed_step, "gpt": _gpt_step}[name]()
    for _ in range(3):  # compiles, then reaches the steady state
        step()
    communicator = MPI.COMM_WORLD
    times = []
    for _ in range(steps):
        communicator.Barrier()
        started = time.perf_counter()
        step()
        times.append(communicator.allreduce(time.perf_counter() - started, op=MPI.MAX))
    if dist.get_rank() == 0:
        print(json.dumps({"median": statistics.median(times)}))


def seconds(name: str, ranks: int, steps: int) -> float:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m",
                             "benchmarks.distributed", "--worker", name, str(steps)], cwd=ROOT,
                            env=environment, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])["median"]


def rows(quick: bool) -> list[Row]:
    """One row per workload: the tracer column is the time per step on 2 ranks, the floor the
    time on 1 rank (so tracer / floor is 1 / efficiency)."""
    result = []
    for name, size in WORKLOADS.items():
        row = Row("data-parallel step on 2 ranks (weak scaling)", size)
        try:
            steps = 10 if quick else 40
            one, two = seconds(name, 1, steps), seconds(name, 2, steps)
            row.seconds["tracer"], row.floors["1 rank"] = two, one
            row.size += f" (efficiency {one / two:.2f})"
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as error:
            row.failures["tracer"] = str(error)[:300]
        result.append(row)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        for row in rows(quick="--quick" in sys.argv):
            print(row)
