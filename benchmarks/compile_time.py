"""Compile time against graph size: the first call of a chain of N elementwise ops
(`x = tanh(x * 1.01 + 0.1)`, three ops per link) on 1000 floats, with no disk cache; and the
first call of examples/transformer.py's GPT training step (B=16 T=128 d=192, 4 layers of 6 heads,
AdamW), the tracer's and jax.jit's (benchmarks/transformer.py's jax GPT; torch.compile takes
minutes on it).

Wall-clock rows compare the peers; the tracer's rows "CPU of the calling thread and the compile
worker" time the same first call by `time.thread_time()` plus the CPU time of the process that
compiles kernel modules beside it (runtime/compile_worker.py, from 16 modules on) -- the tracer
traces and compiles in the calling thread, so this is its compile time with the other sessions of
a shared machine left out -- the minimum of REPEATS fresh compilations. The worker starts once per
process (~0.1 s of CPU, while the first compile fuses and schedules), so the minimum leaves its start
out. The GPT step's wall-clock row is the one its user waits: with the worker, less than its
CPU time on two processors."""
from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.harness import Row, check, failure
from benchmarks.peers import fresh_copy, installed

LINKS = (10, 100, 1000)
REPEATS = 3
GPT = {"batch": 16, "block_size": 128, "n_layer": 4, "n_head": 6, "n_embd": 192}
QUICK_LINKS = (10, 100)
SIZE = 1000
# Each link contracts errors (the chain's derivative at its fixed point is about 0.6), so the
# result keeps the few-ulp error of one link.
TOLERANCE = 1e-5


def chain_with(tanh):
    """The chain for tr.tanh, torch.tanh, jnp.tanh or np.tanh, a new function each time."""
    def chain(x, links):
        for _ in range(links):
            x = tanh(x * 1.01 + 0.1)
        return x
    return chain


def tracer_compile(x, links):
    import tracer as tr
    traced = tr.trace(chain_with(tr.tanh), static_argnums=(1,))
    return lambda: traced(tr.tensor(x), links)


def torch_compile(x, links):
    torch = installed("torch")
    compiled = torch.compile(fresh_copy(chain_with(torch.tanh)))
    return lambda: compiled(torch.from_numpy(x.copy()), links)


def jax_compile(x, links):
    jax = installed("jax")
    compiled = jax.jit(chain_with(jax.numpy.tanh), static_argnums=1)
    return lambda: jax.block_until_ready(compiled(jax.numpy.asarray(x), links))


def first_call_seconds(compiler, x: np.ndarray, links: int) -> float:
    """The time of the first call of the chain compiled by `compiler`, whose result is then
    checked against the float64 chain."""
    first_call = compiler(x, links)
    start = time.perf_counter()
    result = first_call()
    seconds = time.perf_counter() - start
    check([result], [chain_with(np.tanh)(x.astype(np.float64), links)], TOLERANCE)
    return seconds


def tracer_seconds(first_call) -> tuple[float, float]:
    """The CPU time of the calling thread and the compile worker during `first_call()`, and its
    wall-clock time."""
    from tracer.runtime.compile_worker import worker_cpu_seconds
    start, worker_start, wall_start = time.thread_time(), worker_cpu_seconds(), time.perf_counter()
    first_call()
    wall = time.perf_counter() - wall_start
    return time.thread_time() - start + max(0.0, worker_cpu_seconds() - worker_start), wall


def gpt_first_call():
    """The first call of the GPT step (traced, then compiled), from a fresh model, with none of
    its kernels compiled in this process before (runtime/kernels.py keeps them in memory: a
    repeat found every one and took a third of the time)."""
    import tracer as tr
    from benchmarks.harness import load_example
    from tracer.runtime import kernels
    kernels.forget()
    example = load_example("transformer.py")
    text = example.Characters(example.corpus()[:100_000])
    settings = {k: v for k, v in GPT.items() if k != "batch"}
    config = example.Config(len(text.alphabet), **settings)
    tr.manual_seed(0)
    x, y = text.batch(GPT["batch"], config.block_size)
    model = example.GPT(config)
    step = tr.trace(example.make_step(model, tr.optim.AdamW(model.parameters(), lr=3e-3)))
    return lambda: float(step(x, y))


def jax_gpt_first_call_seconds() -> float:
    """The wall-clock time of the first call (trace, compile, one step) of the jax GPT step of
    benchmarks/transformer.py, from a new jax.jit, at the size of GPT; the same program passes the
    float64 check in the transformer's rows."""
    from benchmarks import transformer
    inputs = transformer.make_inputs(tuple(GPT[key] for key in ("batch", "block_size", "n_layer",
                                                                 "n_head", "n_embd")))
    first_call = transformer.jax_transformer_programs(inputs)[0].build()
    start = time.perf_counter()
    first_call()
    return time.perf_counter() - start


CPU_ROW = "compile time (first call), CPU of the calling thread and the compile worker"


def thread_rows(quick: bool, x: np.ndarray) -> list[Row]:
    """The tracer's compile times as CPU time, minima of REPEATS; and the GPT step's wall clock."""
    result = []
    for links in QUICK_LINKS if quick else LINKS:
        row = Row(CPU_ROW, f"chain of {3 * links} ops")
        row.seconds["tracer"] = min(tracer_seconds(tracer_compile(x, links))[0]
                                    for _ in range(1 if quick else REPEATS))
        result.append(row)
    gpt = "GPT step, 16×128 tokens, 4 layers × 192"
    cpu_row, wall_row = Row(CPU_ROW, gpt), Row("compile time (first call), wall clock", gpt)
    try:
        times = [tracer_seconds(gpt_first_call()) for _ in range(1 if quick else REPEATS)]
        cpu_row.seconds["tracer"] = min(cpu for cpu, _ in times)
        wall_row.seconds["tracer"] = min(wall for _, wall in times)
    except Exception as error:  # noqa: BLE001 - any failure is a result to report
        cpu_row.failures["tracer"] = wall_row.failures["tracer"] = failure(error)
    if installed("jax"):
        try:
            wall_row.seconds["jax.jit"] = min(jax_gpt_first_call_seconds()
                                              for _ in range(1 if quick else REPEATS))
        except Exception as error:  # noqa: BLE001 - any failure is a result to report
            wall_row.failures["jax.jit"] = failure(error)
    return result + [cpu_row, wall_row]


def rows(quick: bool) -> list[Row]:
    x = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    compilers = {"tracer": tracer_compile}
    if installed("torch"):
        compilers["torch.compile"] = torch_compile
    if installed("jax"):
        compilers["jax.jit"] = jax_compile
    os.environ["TRACER_DISABLE_CACHE"] = "1"
    try:
        result = []
        for links in QUICK_LINKS if quick else LINKS:
            row = Row("compile time (first call) of a chain", f"{3 * links} ops")
            for peer, compiler in compilers.items():
                try:
                    row.seconds[peer] = first_call_seconds(compiler, x, links)
                except Exception as error:  # noqa: BLE001 - any failure is a result to report
                    row.failures[peer] = failure(error)
            result.append(row)
        return result + thread_rows(quick, x)
    finally:
        del os.environ["TRACER_DISABLE_CACHE"]
