"""Time to the first result in a fresh process: the seed step (benchmarks/two_layer.py) run once
by `python -m benchmarks.first_result PEER`, timed from the outside, with each compiler's disk cache
in a fresh directory (cold) or one that a previous process filled (warm).

Every process finds Python's bytecode of this checkout compiled, and its Jinja2 templates', as a
package installed by pip has it (the peers' are, in site-packages): without it, where
PYTHONDONTWRITEBYTECODE is set, each process compiled the tracer's ~80 modules from source again
(~0.2 s of CPU) and a cold one its templates (~0.15 s)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import two_layer
from benchmarks.harness import PEERS, Row, check, failure, to_numpy

ROOT = Path(__file__).resolve().parent.parent
SIZE = "64×1000→100→10"
FLOOR = "python + import numpy"


def program_lists(peer: str):
    """The function that makes the seed step's programs for `peer`, without importing what the
    others need."""
    if peer == "tracer":
        return lambda inputs, rate: [two_layer.tracer_program(inputs, rate)]
    if peer == "numpy":
        return lambda inputs, rate: [two_layer.numpy_program(inputs, rate)]
    if peer.startswith("torch"):
        return two_layer.torch_step_programs
    return two_layer.jax_step_programs


def run_once(peer: str) -> None:
    """In the fresh process: one step of `peer` from the seed's data; prints the loss (last), and
    for the tracer first the milliseconds from after `import tracer` to it."""
    sizes, learning_rate = two_layer.SIZES[SIZE]
    inputs = two_layer.make_inputs(sizes)
    if peer == "tracer":
        import tracer  # noqa: F401 - the time after it is the tracer's own (see `after_import`)
    started, cpu = time.perf_counter(), time.thread_time()
    program = next(p for p in program_lists(peer)(inputs, learning_rate) if p.peer == peer)
    with program.setting():
        loss = float(to_numpy(program.build()()[0]))
    if peer == "tracer":
        print(f"after import: {1e3 * (time.perf_counter() - started):.2f} ms, "
              f"{1e3 * (time.thread_time() - cpu):.2f} ms")
    print(loss)


def after_import(rounds: int) -> None:
    """The tracer's time from after `import tracer` to the seed step's first result (the example
    loaded, its tensors made, tr.trace, the first call), measured inside `rounds` fresh processes
    with a warm cache and `rounds` with a cold one, interleaved: wall time and the CPU time of the
    main thread (on a busy machine, steadier), medians and minimums. (The whole process's time,
    `rows`, adds Python's start and the imports, ~10x more, and its noise.)"""
    command = [sys.executable, "-m", "benchmarks.first_result", "tracer"]
    times: dict[str, list[tuple[float, float]]] = {"warm": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as directory:
        warm = cache_environment(directory)
        timed_process(command, warm)  # (fills the warm cache)
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="bench-cache-") as empty:
                for kind, environment in (("warm", warm), ("cold", cache_environment(empty))):
                    output = timed_process(command, environment)[1].splitlines()
                    check([float(output[-1])], [np.asarray(expected_loss())], two_layer.TOLERANCE)
                    wall, cpu = output[-2].split()[2], output[-2].split()[4]
                    times[kind].append((float(wall), float(cpu)))
    for kind, values in times.items():
        wall, cpu = np.array(values).T
        print(f"{kind} cache: from after import tracer to the first result: median "
              f"{np.median(wall):.2f} ms ({np.median(cpu):.2f} ms CPU of the main thread), min "
              f"{wall.min():.2f} ms ({cpu.min():.2f} ms CPU) over {rounds} processes")


def expected_loss() -> float:
    sizes, learning_rate = two_layer.SIZES[SIZE]
    x, y, w1, w2 = (a.astype(np.float64) for a in two_layer.make_inputs(sizes))
    return float(two_layer.numpy_step(x, y, w1, w2, learning_rate))


# This checkout's bytecode, compiled once per run of the benchmarks (see `compiled_bytecode`).
BYTECODE = Path(tempfile.gettempdir()) / f"bench-bytecode-{os.getuid()}"
PACKAGES = ("tracer", "ir", "codegen", "runtime", "benchmarks")


def compiled_bytecode() -> dict[str, str]:
    """The environment in which Python reads this checkout's bytecode from BYTECODE, compiled
    there first."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment["PYTHONPYCACHEPREFIX"] = str(BYTECODE)
    folders = [str(ROOT / package) for package in PACKAGES]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], env=environment,
                   check=True, capture_output=True)
    # and the code generator's Jinja2 templates, kept beside them as their bytecode is
    # (runtime/template_cache.py)
    subprocess.run([sys.executable, "-c", "from tracer.runtime import template_cache; "
                    "template_cache.compile_all()"], env={**environment, "PYTHONPATH": str(ROOT)},
                   check=True, capture_output=True)
    return environment


def cache_environment(directory: str) -> dict[str, str]:
    """Every compiler's disk cache in `directory`; jax caches even its quickest compilations."""
    return {**compiled_bytecode(),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TRACER_CACHE_DIR": f"{directory}/tracer",
            "TORCHINDUCTOR_CACHE_DIR": f"{directory}/inductor",
            "JAX_COMPILATION_CACHE_DIR": f"{directory}/jax",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def timed_process(command: list[str], environment: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    finished = subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if finished.returncode != 0:
        last = (finished.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit status {finished.returncode}: {last}")
    return seconds, finished.stdout


def first_result_seconds(peer: str, warm: bool) -> float:
    """One fresh process running one step; for `warm`, a previous process filled the cache."""
    command = [sys.executable, "-m", "benchmarks.first_result", peer]
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as directory:
        environment = cache_environment(directory)
        if warm:
            timed_process(command, environment)
        seconds, output = timed_process(command, environment)
    check([float(output.split()[-1])], [np.asarray(expected_loss())], two_layer.TOLERANCE)
    return seconds


def rows(peers: list[str]) -> list[Row]:
    """Cold and warm rows for `peers` (those installed), with the floor: a fresh Python that
    imports numpy."""
    floor = timed_process([sys.executable, "-c", "import numpy"], dict(os.environ))[0]
    result = []
    for warm in (False, True):
        row = Row("time to first result (seed step, fresh process)",
                  "warm cache" if warm else "cold cache")
        for peer in peers:
            try:
                row.seconds[peer] = first_result_seconds(peer, warm)
            except Exception as error:  # noqa: BLE001 - any failure is a result to report
                row.failures[peer] = failure(error)
        row.floors[FLOOR] = floor
        result.append(row)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--after-import":
        after_import(int(sys.argv[2]))
    elif len(sys.argv) != 2 or sys.argv[1] not in PEERS:
        sys.exit(f"usage: python -m benchmarks.first_result PEER (one of {', '.join(PEERS)}), "
                 f"or --after-import ROUNDS")
    else:
        run_once(sys.argv[1])
