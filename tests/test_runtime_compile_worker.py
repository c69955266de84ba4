"""The compile worker (runtime/compile_worker.py): a second process compiles LLVM modules into the
same object code as this process, a program compiled with its help computes what numpy does, and
a worker that dies or a module that fails leaves this process to compile or to report the error."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tracer as tr
from tracer.runtime import compile_worker, kernels, object_code


pytestmark = pytest.mark.usefixtures("fresh_cache")  # (tests/conftest.py)


def kernel_jobs(count: int) -> list[compile_worker.Job]:
    """`count` distinct kernel modules (each of its own size), with their options."""
    jobs = []
    for index in range(count):
        traced = tr.trace(lambda x: (x * 3.0).tanh())
        traced(tr.tensor(np.ones(64 + index, dtype=np.float32)))
        (entry,) = traced._signatures.entries.values()
        jobs += [(k.text, kernels.kernel_options(k.text))
                 for k in entry.executable.back_end.code.kernels]
    return jobs


def test_the_worker_makes_the_object_code_this_process_makes():
    worker = compile_worker.start()
    if worker is None:
        pytest.skip("one processor: no worker is started")
    for text, options in kernel_jobs(2):
        assert worker.send((text, options))
        assert worker.receive() == object_code.compile_object(text, **options)


def test_compiled_together_each_module_gets_its_own_object_code(monkeypatch):
    monkeypatch.setattr(compile_worker, "MIN_MODULES", 2)
    jobs = kernel_jobs(6)
    assert compile_worker.compile_objects(jobs) == [object_code.compile_object(text, **options)
                                                    for text, options in jobs]


def test_a_program_compiled_with_the_worker_computes_what_numpy_does(monkeypatch):
    monkeypatch.setattr(compile_worker, "MIN_MODULES", 2)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16)), rng.standard_normal((16, 16))

    def layers(x, w):
        for scale in (0.5, 0.25, 0.125, 2.0):
            x = (x @ w).tanh() * scale + x.tanh().exp().mean(1, keepdim=True)
        return x
    expected = x
    for scale in (0.5, 0.25, 0.125, 2.0):
        expected = np.tanh(expected @ w) * scale + np.exp(np.tanh(expected)).mean(1, keepdims=True)
    result = tr.trace(layers)(tr.tensor(x), tr.tensor(w))
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12)


def test_a_dead_worker_leaves_its_modules_to_this_process(monkeypatch):
    monkeypatch.setattr(compile_worker, "MIN_MODULES", 2)
    worker = compile_worker.start()
    if worker is None:
        pytest.skip("one processor: no worker is started")
    worker.process.kill()
    worker.process.wait()
    jobs = kernel_jobs(3)
    assert compile_worker.compile_objects(jobs) == [object_code.compile_object(text, **options)
                                                    for text, options in jobs]


def test_a_module_llvm_refuses_raises_here_as_without_the_worker(monkeypatch):
    monkeypatch.setattr(compile_worker, "MIN_MODULES", 2)
    jobs = kernel_jobs(3)
    broken = ("define void @f() {\n  ret i32 0\n}\n", {"optimized": True,
                                                       "strength_reduction": True})
    with pytest.raises(RuntimeError) as without:
        object_code.compile_object(*broken[:1], **broken[1])
    with pytest.raises(RuntimeError) as together:
        compile_worker.compile_objects([*jobs, broken])
    assert str(together.value) == str(without.value)


@pytest.fixture
def fresh_worker(monkeypatch):
    """No worker running and no thread pool in this process (as in a fresh one); the worker the
    test starts is stopped after it."""
    from tracer.runtime import pool
    monkeypatch.setattr(compile_worker, "_worker", None)
    monkeypatch.setattr(pool, "_pool", [])
    yield
    if compile_worker._worker is not None:
        compile_worker._worker.close(kill=True)


def test_a_worker_started_for_a_threaded_program_compiles_the_pool_first(fresh_worker):
    from tracer.runtime import pool
    worker = compile_worker.start(threaded=True)
    if worker is None or not pool.SUPPORTED:
        pytest.skip("one processor or no thread pool here")
    assert worker.pool_sent
    # its reply comes first, kept aside: the jobs' replies are theirs
    for text, options in kernel_jobs(2):
        assert worker.send((text, options))
        assert worker.receive() == object_code.compile_object(text, **options)
    assert worker.take_pool() == object_code.compile_object(pool._text(), **pool.COMPILE_OPTIONS)


def test_the_pool_of_a_dead_worker_is_none_and_compiled_here(fresh_worker):
    from tracer.runtime import pool
    worker = compile_worker.start(threaded=True)
    if worker is None or not pool.SUPPORTED:
        pytest.skip("one processor or no thread pool here")
    worker.close(kill=True)
    assert worker.take_pool() is None


def ten_layers(x):
    for scale in range(10):
        x = (x * (scale + 0.5)).tanh() + (x * x * -1.0).exp() * 0.25
    return x


def ten_layers_expected(x):
    for scale in range(10):
        x = np.tanh(x * (scale + 0.5)) + np.exp(-(x * x)) * 0.25
    return x


def test_a_large_trace_starts_the_worker_and_its_compilation_keeps_it(fresh_worker, monkeypatch):
    from tracer.runtime import pipeline
    monkeypatch.setattr(pipeline, "EARLY_WORKER", 2)
    x = np.linspace(-1, 1, 64)
    np.testing.assert_allclose(tr.trace(ten_layers)(tr.tensor(x)).numpy(), ten_layers_expected(x),
                               rtol=1e-12)
    worker = compile_worker._worker
    if worker is None:
        pytest.skip("one processor: no worker is started")
    assert not worker.speculative  # used by the compilation, kept for the later ones
    compile_worker.stop_speculative()
    assert compile_worker._worker is worker


def test_a_disk_cache_hit_stops_the_worker_its_trace_started(fresh_worker, monkeypatch):
    """The program compiled in another process (here: with no worker, the entry then forgotten)
    is in the disk cache: the worker its large trace started is stopped unused."""
    import gc
    from tracer.runtime import pipeline
    x = np.linspace(-1, 1, 64)
    monkeypatch.setattr(pipeline, "EARLY_WORKER", 10**9)
    first = tr.trace(ten_layers)
    first(tr.tensor(x))
    assert compile_worker._worker is None
    del first
    gc.collect()  # (the in-memory table of compiled programs forgets it)
    monkeypatch.setattr(pipeline, "EARLY_WORKER", 2)
    started, original = [], compile_worker.Worker

    def recorded_worker():
        started.append(original())
        return started[-1]
    monkeypatch.setattr(compile_worker, "Worker", recorded_worker)
    np.testing.assert_allclose(tr.trace(ten_layers)(tr.tensor(x)).numpy(), ten_layers_expected(x),
                               rtol=1e-12)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one processor: no worker is started")
    assert len(started) == 1 and compile_worker._worker is None
    assert started[0].process.wait(timeout=5) is not None  # stopped
