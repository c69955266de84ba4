"""Where a step's time goes: the tracer's program compiled again with TRACER_PROFILE=1 (which
times every kernel), run a few times, and its costliest kernels printed with the bytes each moves
(what it reads and writes of memory at least) and its time against the machine's streaming floor
for those bytes (one thread's bandwidth, numpy's c = a + b, measured here).

Reads the per-kernel times from the traced function's compiled signature (internal: the public API
shows them in the HTML report, `f.report(path)`).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import numpy as np

STREAM_ELEMENTS = 1 << 23  # 96 MB moved by c = a + b: well beyond the caches


def stream_bandwidth(repeats: int = 7) -> float:
    """Bytes per second one thread streams (median of `repeats`)."""
    a, b = np.ones(STREAM_ELEMENTS, np.float32), np.ones(STREAM_ELEMENTS, np.float32)
    c = np.empty_like(a)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(a, b, out=c)
        seconds.append(time.perf_counter() - start)
    return 12 * STREAM_ELEMENTS / statistics.median(seconds)


def profiled(build: Callable[[], Callable], **environment: str):
    """The call `build` makes, compiled with TRACER_PROFILE=1 (and the other environment variables
    given, read at compile time too: TRACER_NUM_THREADS) and called twice, and its executable."""
    environment = {"TRACER_PROFILE": "1", **environment}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        run = build()
        for _ in range(2):
            run()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return run, list(run.traced._signatures.entries.values())[-1].executable


def profiled_run(build: Callable[[], Callable], calls: int):
    """The traced function of the program `build` makes, compiled with TRACER_PROFILE=1 (in a
    cache folder of its own setting) and called `calls` times after its first two."""
    run, executable = profiled(build)
    before = [(t.calls, t.seconds) for t in executable.kernel_times()]
    started = time.perf_counter()
    for _ in range(calls):
        run()
    wall = (time.perf_counter() - started) / calls
    after = executable.kernel_times()
    per_call = [(seconds - old_seconds) / calls for (_, old_seconds), (_, _, seconds)
                in zip(before, after)]
    return executable, per_call, wall


def profile_text(label: str, build: Callable[[], Callable], calls: int = 5, top: int = 10) -> str:
    """A few lines: the step's time by kind of kernel, then its `top` costliest kernels."""
    executable, per_call, wall = profiled_run(build, calls)
    bandwidth = stream_bandwidth()
    kernels = executable.fused.kernels
    lines = [f"{label}: {1e3 * wall:.1f} ms a step profiled ({1e3 * sum(per_call):.1f} ms in "
             f"kernels); streaming floor {bandwidth / 1e9:.1f} GB/s (one thread)"]
    kinds: dict[str, list[float]] = {}
    for kernel, seconds in zip(kernels, per_call):
        kinds.setdefault(kernel.kind, []).append(seconds)
    lines.append("  by kind: " + ", ".join(
        f"{kind} {1e3 * sum(times):.1f} ms ({len(times)})"
        for kind, times in sorted(kinds.items(), key=lambda item: -sum(item[1]))))
    ranked = sorted(range(len(kernels)), key=lambda n: -per_call[n])[:top]
    for number in ranked:
        kernel, seconds = kernels[number], per_call[number]
        moved = sum(v.type.size * v.dtype.itemsize for v in (*kernel.inputs, *kernel.results))
        floor = moved / bandwidth
        shapes = ", ".join(str(v.type) for v in kernel.results[:2])
        lines.append(f"  kernel_{number:<4} {kernel.kind:10} {1e3 * seconds:8.3f} ms "
                     f"{moved / 1e6:8.2f} MB  {seconds / floor if floor else 0:6.1f}x floor  "
                     f"-> {shapes}")
    return "\n".join(lines)
