"""The ordinary training loop's first 20 steps, as a new user writes it: a tr.nn MLP (784-256-256-10,
batch 128), AdamW, a cosine learning-rate schedule written into `param_groups` before each step,
and `zero_grad(); loss.backward(); step()` under @tr.trace. Each run is a fresh process with an
empty compile cache; it prints the seconds from the first call to the end of step 20, the CPU
time of the process (steadier than wall time on a loaded machine) and how many signatures
compiled.

    python -m benchmarks.training_loop [--project DIR] [--runs 3]

`--project` runs another checkout's tracer (e.g. main's, for a before/after comparison).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, math, time
import numpy as np
import tracer as tr
from tracer import nn

tr.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
optimizer = tr.optim.AdamW(model.parameters(), lr=1e-3)

@tr.trace
def step(x, labels):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss

rng = np.random.default_rng(0)
x = rng.standard_normal((128, 784)).astype(np.float32)
labels = rng.integers(0, 10, 128)
started = time.perf_counter()
for number in range(20):
    optimizer.param_groups[0]["lr"] = 0.5e-3 * (1 + math.cos(math.pi * number / 20))
    step(x, labels)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "compiles": step.cache_info().misses}))
"""


def run_once(project: str) -> dict:
    """One fresh process (in an empty folder, so that `project` is the tracer imported); its
    CPU seconds (user + system, the whole process) beside the wall time of the 20 steps."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cache:
        environment = dict(os.environ, PYTHONPATH=project, TRACER_CACHE_DIR=cache)
        environment.pop("TRACER_LOG", None)
        output = subprocess.run([sys.executable, "-c", CHILD], env=environment, check=True,
                                cwd=cache, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(output.strip().splitlines()[-1])
    result["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    results = [run_once(arguments.project) for _ in range(arguments.runs)]
    seconds, cpu = [r["seconds"] for r in results], [r["cpu"] for r in results]
    print(f"{arguments.project}: first 20 steps {statistics.median(seconds):.2f} s wall, median "
          f"of {len(seconds)} ({', '.join(f'{s:.2f}' for s in seconds)}); the process's CPU "
          f"time {statistics.median(cpu):.2f} s; {results[0]['compiles']} compiles")


if __name__ == "__main__":
    main()
