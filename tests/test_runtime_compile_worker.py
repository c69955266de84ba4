"""The compile worker (runtime/compile_worker.py): a second process compiles LLVM modules into the
same object code as this process, a program compiled with its help computes what numpy does, and
a worker that dies or a module that fails leaves this process to compile or to report the error."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import tracer as tr
from tracer.runtime import compile_worker, kernels, object_code


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch, tmp_path):
    """An empty disk cache and an empty in-memory table of kernel objects."""
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_objects", OrderedDict())


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
