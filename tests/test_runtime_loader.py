"""runtime/loader.py links object code into memory without LLVM: the same programs give the same
results linked by it as by llvmlite's MCJIT, and both match PyTorch; what it cannot link it
refuses, naming why; its memory goes with the code; and the host that the cache keys name is
remembered, so that a process that only loads never asks LLVM."""
from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.runtime import jit, loader, native, pipeline


def step(x, w, b):
    """A matmul (the BLAS gemm), math functions (constants in read-only data), reductions and a
    gradient, on enough elements that the elementwise kernels split across the thread pool."""
    hidden = (x @ w + b).tanh()
    loss = (hidden.exp() * hidden.sigmoid()).sum() + (x * x).mean().sqrt()
    loss.backward()
    return loss, w.grad * 1, x.grad * 1


def inputs():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(shape).astype(np.float32) * 0.1
            for shape in ((512, 256), (256, 512), (512,))]


def run(arrays, linked_by_loader: bool, monkeypatch) -> list[np.ndarray]:
    """The step compiled afresh (no shared code, no disk cache) and linked one way."""
    monkeypatch.setattr(pipeline, "_compiled", {})
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    monkeypatch.setattr(loader, "supported", lambda: linked_by_loader)
    x, w, b = (tr.tensor(a, requires_grad=True) for a in arrays)
    traced = tr.trace(step)
    results = [r.detach().numpy() for r in traced(x, w, b)]
    compiled = next(iter(traced._signatures.entries.values())).executable
    kind = loader.LinkedCode if linked_by_loader else native._Engine
    assert isinstance(compiled._jit.code, kind)
    return results


def torch_step(arrays) -> list[np.ndarray]:
    x, w, b = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays)
    loss = step(x, w, b)[0]
    return [loss.detach().numpy(), w.grad.numpy(), x.grad.numpy()]


def test_the_loader_and_mcjit_give_the_same_results_as_pytorch(monkeypatch):
    arrays = inputs()
    loaded = run(arrays, True, monkeypatch)
    engine = run(arrays, False, monkeypatch)
    for ours, theirs, expected in zip(loaded, engine, torch_step(arrays)):
        np.testing.assert_array_equal(ours, theirs)  # the same object code
        np.testing.assert_allclose(ours, expected, rtol=2e-4, atol=1e-5)


def test_profile_counters_are_found_in_linked_writable_data(monkeypatch):
    """TRACER_PROFILE's counters are a global of the program's object (zeroed writable data)."""
    monkeypatch.setenv("TRACER_PROFILE", "1")
    monkeypatch.setattr(pipeline, "_compiled", {})
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    traced = tr.trace(lambda x: (x.exp() + 1).sum())
    x = tr.tensor(np.linspace(0, 1, 1000, dtype=np.float32))
    for _ in range(3):
        result = traced(x)
    np.testing.assert_allclose(result.item(), np.exp(np.linspace(0, 1, 1000)).sum() + 1000,
                               rtol=1e-5)
    compiled = next(iter(traced._signatures.entries.values())).executable
    times = compiled.kernel_times()
    assert times and all(time.calls == 3 for time in times)


def test_what_the_loader_cannot_link_it_refuses():
    with pytest.raises(loader.Unsupported, match="not an x86-64 ELF"):
        loader.LinkedCode([b"not an object"])
    object_code = jit.compile_object("define void @f() {\n  ret void\n}\n")
    as_rel = bytearray(object_code)
    as_rel[18] = 183  # e_machine: aarch64
    with pytest.raises(loader.Unsupported):
        loader.LinkedCode([bytes(as_rel)])


def test_a_missing_symbol_is_named_and_a_present_one_resolved():
    text = ("declare void @tracer_nowhere()\n"
            "define void @f() {\n  call void @tracer_nowhere()\n  ret void\n}\n")
    with pytest.raises(RuntimeError, match="tracer_nowhere"):
        loader.LinkedCode([jit.compile_object(text)])
    code = jit.compile_object("define i64 @answer() {\n  ret i64 42\n}\n")
    linked = loader.LinkedCode([code])
    assert ctypes.CFUNCTYPE(ctypes.c_int64)(linked.address("answer"))() == 42
    with pytest.raises(RuntimeError, match="no symbol g"):
        linked.address("g")


def test_linked_memory_is_unmapped_with_the_code():
    linked = loader.LinkedCode([jit.compile_object("define void @f() {\n  ret void\n}\n")])
    base = linked.base
    finalizer = linked._finalizer
    assert finalizer.alive and _mapped(base)
    del linked
    gc.collect()
    assert not finalizer.alive and not _mapped(base)


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(part, 16) for part in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


def test_the_host_is_remembered_and_equals_llvms_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)
    real, asked = jit.llvm_host, []

    def asking():
        asked.append(1)
        return real()
    monkeypatch.setattr(jit, "llvm_host", asking)
    compute = native.host.__wrapped__  # (the process's value is cached)
    first = compute()
    assert first == real() and len(asked) == 1
    assert list(tmp_path.glob("*.host"))
    assert compute() == first and len(asked) == 1  # remembered: LLVM not asked
    monkeypatch.setattr(native, "_host_identity", lambda: b"another machine")
    assert compute() == first and len(asked) == 2
