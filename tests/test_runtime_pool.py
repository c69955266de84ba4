"""The thread pool (runtime/pool.py, codegen/templates/pool.ll.j2): kernels split across threads
give the bits of one thread whatever the thread count, launch after launch, from several Python
threads at once, in the child of a fork and up to a clean exit; and a launch creates no thread.
Every kernel here is forced onto threads (PARALLEL_WORK_PER_THREAD = 1); conftest also checks
every compiled call against the reference interpreter."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.ir import schedule_threads
from tracer.runtime import pool

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def forced_parallel(monkeypatch, tmp_path):
    """Every splittable kernel on as many threads as it may have; a cache of its own, so nothing
    compiled under another threshold is reused."""
    monkeypatch.setattr(schedule_threads, "PARALLEL_WORK_PER_THREAD", 1)
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Gelu(tr.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1 + ((x + 0.044715 * x ** 3) * 0.7978845608).tanh())

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        t = ((x + 0.044715 * x ** 3) * 0.7978845608).tanh()
        return grad_output * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608
                              * (1 + 3 * 0.044715 * x ** 2))


def gelu_rows(x):
    """GELU forward and backward with a row sum: an elementwise kernel and a reduction per row."""
    y = Gelu.apply(x)
    loss = (y * y).sum()
    loss.backward()
    return y.sum(dim=1), x.grad


def torch_gelu_rows(x_array: np.ndarray) -> list[np.ndarray]:
    x = torch.tensor(x_array, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.gelu(x, approximate="tanh")
    (y * y).sum().backward()
    return [y.sum(dim=1).detach().numpy(), x.grad.numpy()]


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (257, 129)])
def test_one_two_and_four_threads_give_the_same_bits(forced_parallel, monkeypatch, shape):
    x_array = np.random.default_rng(1).normal(0, 2, shape).astype(np.float32)
    results = {}
    for threads in ("1", "2", "4"):
        monkeypatch.setenv("TRACER_NUM_THREADS", threads)
        traced = tr.trace(gelu_rows)
        x = tr.tensor(x_array, requires_grad=True)
        if threads != "1" and x_array.size > 1:
            assert f", {threads} threads:" in traced.ir(x, stage="loops")
        results[threads] = [r.numpy() for r in traced(x)]
    for threads in ("2", "4"):
        for one, several in zip(results["1"], results[threads]):
            assert one.tobytes() == several.tobytes()
    for actual, expected in zip(results["1"], torch_gelu_rows(x_array)):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * shape[1])


def test_a_whole_training_step_has_the_same_bits_on_one_two_and_three_threads(
        forced_parallel, monkeypatch):
    """Every kind of kernel a real step has -- gemm blocks (odd row counts), row kernels (layer
    norm, softmax, cross-entropy), reductions, the embedding's scatter, AdamW's update -- split
    across 2 and 3 threads gives the parameters one thread gives, to the bit, after two steps
    (70 rows: products cut 48 + 22)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import transformer

    config = transformer.Config(vocab_size=11, block_size=7, n_layer=1, n_head=2, n_embd=16)
    rng = np.random.default_rng(4)
    batches = [(rng.integers(0, 11, (10, 7)), rng.integers(0, 11, (10, 7))) for _ in range(2)]
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("TRACER_NUM_THREADS", threads)
        tr.manual_seed(0)
        model = transformer.GPT(config)
        step = tr.trace(transformer.make_step(model, tr.optim.AdamW(model.parameters(), lr=1e-2)))
        losses = [step(tr.tensor(x), tr.tensor(y)).item() for x, y in batches]
        if threads != "1":
            assert f", {threads} threads:" in step.ir(tr.tensor(batches[0][0]),
                                                     tr.tensor(batches[0][1]), stage="loops")
        results[threads] = [np.float32(losses).tobytes(),
                            *(p.detach().numpy().tobytes() for p in model.parameters())]
    assert results["2"] == results["1"] and results["3"] == results["1"]


def test_launches_in_a_row_reuse_the_workers(forced_parallel, monkeypatch):
    """An elementwise kernel long enough (milliseconds a chunk) that the workers take chunks while
    the caller runs its own, and a matmul that reads its result right after: the launch must have
    waited for every chunk. No launch creates a thread."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "4")
    traced = tr.trace(lambda x, w: (x.sin() * 2).tanh().sin().exp() @ w)
    rng = np.random.default_rng(2)
    w = rng.normal(size=(1024, 2)).astype(np.float32)

    def expected(x_array):
        return np.exp(np.sin(np.tanh(np.sin(x_array.astype(np.float64)) * 2))) @ w

    x_array = rng.normal(size=(1024, 1024)).astype(np.float32)
    traced(tr.tensor(x_array), tr.tensor(w))  # the first launch starts the workers
    threads = os_threads()
    for launch in range(12):
        x_array = rng.normal(size=(1024, 1024)).astype(np.float32)
        np.testing.assert_allclose(traced(tr.tensor(x_array), tr.tensor(w)).numpy(),
                                   expected(x_array), rtol=1e-4, atol=1e-3,
                                   err_msg=f"launch {launch}")
    assert os_threads() == threads  # no thread was created (or lost) by the launches


def test_the_pool_counts_every_launch_by_how_it_ran(forced_parallel, monkeypatch):
    """pool.counts(): each launch of one kernel split into chunks, called from one Python thread,
    is counted once, as shared with the workers or as run alone after a stall (never as finding
    the pool owned: no other thread launches); a back-off follows a stall."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    traced = tr.trace(lambda x: (x * 2 + 1).sin())
    x_array = np.random.default_rng(5).normal(size=200_000).astype(np.float32)
    traced(tr.tensor(x_array))  # compiles, and starts the pool
    (compiled,) = [entry.executable for entry in traced._signatures.entries.values()]
    assert [(kernel.threads, kernel.chunks > 1) for kernel in compiled.kernels] == [(2, True)]
    before = pool.counts()
    for _ in range(40):
        np.testing.assert_allclose(traced(tr.tensor(x_array)).numpy(),
                                   np.sin(x_array.astype(np.float64) * 2 + 1), rtol=1e-6)
    counted = {name: pool.counts()[name] - before[name] for name in pool.COUNTS}
    assert counted["shared"] + counted["backed_off"] == 40
    assert counted["owned"] == 0
    assert counted["stalls"] <= counted["shared"]
    # (a back-off started before the 40 calls may run into them)
    assert counted["backed_off"] <= pool.BACKOFF_MAX * (counted["stalls"] + 1)


def test_concurrent_callers_each_get_their_own_results(forced_parallel, monkeypatch):
    """Python threads race into two parallel functions: while one launch owns the pool, the others
    run their chunks on their own thread; every result is checked."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    scaled = tr.trace(lambda x, s: (x * s).sin())
    rows = tr.trace(lambda x: (x * x).sum(dim=1))
    failures = []

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                x = rng.normal(size=(64, 300)).astype(np.float32)
                s = float(rng.uniform(0.5, 2))
                np.testing.assert_allclose(scaled(tr.tensor(x), s).numpy(),
                                           np.sin(x.astype(np.float64) * np.float32(s)),
                                           rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(rows(tr.tensor(x)).numpy(),
                                           (x.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)
        except AssertionError as error:  # reported by the test thread below
            failures.append(error)

    callers = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in callers), "a caller hung"
    assert not failures, failures[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_child_of_a_fork_runs_parallel_kernels(forced_parallel, monkeypatch):
    """The parent's workers exist before the fork and are not copied; the child's first launch
    starts its own."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    traced = tr.trace(lambda x: x.tanh() * 3)
    x_array = np.linspace(-3, 3, 50_000, dtype=np.float32)
    expected = np.tanh(x_array.astype(np.float64)) * 3
    in_parent = traced(tr.tensor(x_array)).numpy()
    np.testing.assert_allclose(in_parent, expected, rtol=1e-5, atol=1e-6)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: run, report, leave without running pytest's teardown
        try:
            same = all(traced(tr.tensor(x_array)).numpy().tobytes() == in_parent.tobytes()
                       for _ in range(20))
            os.write(write, f"{same} {os_threads()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, 9)
            os.waitpid(child, 0)
            pytest.fail("the child of the fork hung in a parallel kernel")
        time.sleep(0.01)
    with os.fdopen(read, "rb") as pipe:
        # 20 launches in the child, each the parent's bits, with a worker of its own besides the
        # thread that forked (the only one a child has)
        assert pipe.read() == b"True 2"


EXIT_PROGRAM = """
import atexit, os, threading, numpy as np, tracer as tr
from tracer.ir import schedule_threads
from tracer.runtime import pool
schedule_threads.PARALLEL_WORK_PER_THREAD = 1
traced = tr.trace(lambda x: (x * 0.5).exp())
x = np.arange(100_000, dtype=np.float32) / 100_000
total = float(traced(tr.tensor(x)).numpy().sum())  # starts the worker
launched = threading.Event()
def busy():  # still launching while the pool stops, and when the interpreter exits
    while True:
        traced(tr.tensor(x))
        launched.set()
threading.Thread(target=busy, daemon=True).start()
launched.wait()
running = len(os.listdir("/proc/self/task"))
atexit._run_exitfuncs()  # what exit runs first: the pool joins its workers
stopped = len(os.listdir("/proc/self/task"))
print(running - stopped, total, float(traced(tr.tensor(x)).numpy().sum()))
"""


def test_at_exit_the_workers_are_joined_and_the_process_exits_cleanly():
    """The exit handler joins the workers before the pool's code is released, while a daemon
    thread is still launching kernels (which then run on their caller alone)."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), TRACER_NUM_THREADS="2",
                       TRACER_DISABLE_CACHE="1", OPENBLAS_NUM_THREADS="1")
    expected = np.exp(np.arange(100_000, dtype=np.float64) / 100_000 * 0.5).sum()
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", EXIT_PROGRAM], capture_output=True, text=True,
                             env=environment, timeout=120)
        assert run.returncode == 0, run.stderr
        joined, before, after = run.stdout.split()
        assert int(joined) == 1
        assert float(before) == pytest.approx(expected, rel=1e-5)
        assert float(after) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("text", ["two", "0", "-1"])
def test_a_bad_thread_count_is_a_clear_error(monkeypatch, tmp_path, text):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACER_NUM_THREADS", text)
    traced = tr.trace(lambda x: x * 2)
    x = tr.ones(3)
    with pytest.raises(tr.SettingError, match=f"TRACER_NUM_THREADS='{text}' is not a positive "
                                              "whole number") as error:
        traced(x)
    # names the nearest line outside tracer: here conftest's wrapper of compile_function
    assert re.match(r"(conftest|test_runtime_pool)\.py:\d+: TRACER_NUM_THREADS", str(error.value))
    np.testing.assert_array_equal(x.numpy(), [1, 1, 1])
    monkeypatch.setenv("TRACER_NUM_THREADS", "3")
    np.testing.assert_array_equal(traced(x).numpy(), [2, 2, 2])


HIT_PROGRAM = """
import json, numpy as np, tracer as tr
from tracer.runtime import jit
traced = tr.trace(lambda x: (x * 0.25).tanh())
x = np.linspace(-4, 4, 1 << 20, dtype=np.float32)  # enough work to run on 2 threads
y = traced(tr.tensor(x)).numpy()
print(json.dumps(dict(jit.STATISTICS, error=float(np.abs(y - np.tanh(x * 0.25)).max()))))
"""


def test_a_disk_cache_hit_with_parallel_kernels_loads_the_pool_too(tmp_path):
    """The second process compiles nothing: the pool's object and the function's come from the disk
    cache, and the function's call to tracer_parallel resolves to the loaded pool."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), TRACER_NUM_THREADS="2",
                       TRACER_CACHE_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="1")
    runs = [subprocess.run([sys.executable, "-c", HIT_PROGRAM], capture_output=True, text=True,
                           env=environment, timeout=120) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    first, second = (json.loads(run.stdout) for run in runs)
    assert (first["compiled"], first["disk_hits"]) == (2, 0)  # the pool and the function
    assert (second["compiled"], second["disk_hits"]) == (0, 2)
    assert first["error"] < 1e-6 and second["error"] < 1e-6


COLD_PROGRAM = """
import json, numpy as np, tracer as tr
from tracer.runtime import jit, pool
compiled_alone = []
compile_alone = pool._compile
pool._compile = lambda: compiled_alone.append(1) or compile_alone()
traced = tr.trace(lambda x: (x * 0.25).tanh())
x = np.linspace(-4, 4, 1 << 20, dtype=np.float32)  # enough work to run on 2 threads
y = traced(tr.tensor(x)).numpy()
print(json.dumps(dict(jit.STATISTICS, alone=len(compiled_alone), started=len(pool._pool),
                      error=float(np.abs(y - np.tanh(x * 0.25)).max()))))
"""


def test_a_cold_process_compiles_the_pool_with_the_program_that_calls_it(tmp_path):
    """With an empty disk cache, the pool is compiled among the program's modules (not alone when
    the program is loaded), stored, and the next process loads it from the disk cache."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), TRACER_NUM_THREADS="2",
                       TRACER_CACHE_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="1")
    runs = [subprocess.run([sys.executable, "-c", COLD_PROGRAM], capture_output=True, text=True,
                           env=environment, timeout=120) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    first, second = (json.loads(run.stdout) for run in runs)
    assert (first["compiled"], first["disk_hits"], first["alone"], first["started"]) == (2, 0, 0, 1)
    assert (second["compiled"], second["disk_hits"], second["alone"], second["started"]) == (0, 2, 1, 1)
    assert first["error"] < 1e-6 and second["error"] < 1e-6
