"""Kernels are compiled once per distinct text (runtime/kernels.py): a repeated kernel within a
program, and a kernel another signature or program already compiled, are reused; any change of a
kernel's text compiles it again."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import tracer as tr
from tracer.runtime import jit, kernels


pytestmark = pytest.mark.usefixtures("fresh_cache")  # (tests/conftest.py)


def executables(traced) -> list:
    """The CompiledFunction of each signature `traced` compiled."""
    return [entry.executable for entry in traced._signatures.entries.values()]


def counted(call):
    """`call()`'s result and how many kernels it compiled and found compiled."""
    before = dict(jit.STATISTICS)
    result = call()
    return result, {name: jit.STATISTICS[name] - before[name]
                    for name in ("compiled", "kernels_compiled", "kernel_hits")}


def two_layers(x, w1, w2):
    """The same layer twice (same shapes): its kernels have one text."""
    for w in (w1, w2):
        x = (x @ w).tanh() * 0.5 + x
    return x


def two_layers_numpy(x, w1, w2):
    for w in (w1, w2):
        x = np.tanh(x @ w) * 0.5 + x
    return x


def test_a_repeated_layer_compiles_its_kernels_once():
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(shape) for shape in ((8, 16), (16, 16), (16, 16)))
    traced = tr.trace(two_layers)
    result, counts = counted(lambda: traced(*(tr.tensor(a) for a in (x, w1, w2))))
    np.testing.assert_allclose(result.numpy(), two_layers_numpy(x, w1, w2), rtol=1e-12)
    (compiled,) = executables(traced)
    kernels = len(compiled.kernels)
    distinct = len(compiled.back_end.code.kernels)
    assert counts["compiled"] == 1
    assert distinct < kernels  # the second layer's kernels are the first's
    assert counts["kernels_compiled"] + counts["kernel_hits"] == distinct
    # every call of the entry names one of the distinct kernel modules' symbols
    symbols = {kernel.symbol for kernel in compiled.back_end.code.kernels}
    calls = [line for line in compiled.back_end.code.entry.splitlines()
             if line.strip().startswith("call void @tracer_kernel_")]
    assert len(calls) == kernels
    assert {call.split("@")[1].split("(")[0] for call in calls} == symbols


def weights_then_batch(x, w):
    """A kernel of `w` alone (its text does not change with the batch) and one of `x`'s batch."""
    return (x @ (w * 3 - 1).exp()).sum(1)


def test_a_new_batch_size_compiles_only_the_kernels_it_changes():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 5))
    traced = tr.trace(weights_then_batch)
    results = {}
    for batch in (4, 7):
        x = rng.standard_normal((batch, 6))
        result, results[batch] = counted(lambda x=x: traced(tr.tensor(x), tr.tensor(w)))
        np.testing.assert_allclose(result.numpy(), (x @ np.exp(w * 3 - 1)).sum(1), rtol=1e-12)
    assert results[4]["compiled"] == results[7]["compiled"] == 1
    # the second signature finds the kernel of `w` compiled, and compiles the rest
    assert results[7]["kernel_hits"] >= 1
    assert results[7]["kernels_compiled"] >= 1


def test_kernels_split_across_threads_alike_but_for_their_extent_are_one_module(monkeypatch):
    """The same update of tensors of different sizes, each large enough to be split across
    threads, into different numbers of chunks: one kernel module, which the entry calls through
    its thread-pool wrappers, one for each number of chunks, with each extent (AdamW's update of
    parameters of several sizes). The module's exported function is the kernel itself, on a
    chunk's range: no wrapper of its own, which LLVM's code generator would take about a
    millisecond for."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(size) for size in (600_000, 900_000, 200_000))
    traced = tr.trace(lambda a, b, c: tuple((x * 2 + 1).sin() for x in (a, b, c)))
    results, counts = counted(lambda: traced(tr.tensor(a), tr.tensor(b), tr.tensor(c)))
    for result, x in zip(results, (a, b, c)):
        np.testing.assert_allclose(result.numpy(), np.sin(x * 2 + 1), rtol=1e-12)
    (compiled,) = executables(traced)
    assert [(kernel.threads, kernel.chunks) for kernel in compiled.kernels] == [(2, 8), (2, 8),
                                                                                 (2, 7)]
    (module,) = compiled.back_end.code.kernels
    assert counts["kernels_compiled"] == 1
    (kernel,) = [line for line in module.text.splitlines()
                 if line.startswith("define") and "@tracer." not in line]  # (math functions)
    assert kernel.startswith(f"define void @{module.symbol}(")
    assert kernel.endswith("i64 %begin, i64 %end) #2 {")
    entry = compiled.back_end.code.entry
    body = entry.split("define void @tracer_entry(")[1].split("\n}\n")[0]
    calls = [line.strip() for line in body.splitlines() if line.strip().startswith("call void @")]
    assert [call.split("(")[0] for call in calls] == [
        f"call void @split.{wrapper}.parallel" for wrapper in (0, 0, 1)]
    assert [call.rsplit("i64 ", 1)[1] for call in calls] == ["600000)", "900000)", "200000)"]
    for wrapper, chunks in enumerate((8, 7)):
        task = entry.split(f"define internal void @split.{wrapper}.task(")[1].split("}")[0]
        assert f"udiv i64 %low, {chunks}\n" in task
        assert f"call void @{module.symbol}(ptr %b0, ptr %b1, i64 %begin, i64 %end)" in task


def test_a_changed_constant_compiles_its_kernel_again():
    """Kernels equal but for a constant have different texts and symbols: neither is reused."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(33)
    symbols = set()
    # (a float read from a closure is a runtime input: the constants are written in the code)
    for factor, function in ((2.0, lambda x: (x * 2.0).sin()), (3.0, lambda x: (x * 3.0).sin())):
        traced = tr.trace(function)
        result, counts = counted(lambda traced=traced: traced(tr.tensor(x)))
        np.testing.assert_allclose(result.numpy(), np.sin(x * factor), rtol=1e-12)
        assert (counts["kernels_compiled"], counts["kernel_hits"]) == (1, 0)
        (compiled,) = executables(traced)
        symbols |= {kernel.symbol for kernel in compiled.back_end.code.kernels}
    assert len(symbols) == 2


def test_forgotten_kernels_are_compiled_again(monkeypatch):
    """kernels.forget (what the compile-time benchmark calls before each fresh compile): the same
    program traced anew finds its kernels in this process's memory, and after forget compiles
    every one of them again (the disk cache off), to the same results."""
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(shape) for shape in ((8, 16), (16, 16), (16, 16))]
    expected = two_layers_numpy(*arrays)
    counts = []
    for forget in (False, False, True):
        if forget:
            kernels.forget()
        traced = tr.trace(two_layers)  # a new function: not the in-memory program of the last
        result, count = counted(lambda traced=traced: traced(*(tr.tensor(a) for a in arrays)))
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12)
        counts.append(count)
        del traced, result
        gc.collect()  # and its program, shared in memory while alive (pipeline._compiled)
    distinct = counts[0]["kernels_compiled"]
    assert distinct > 0 and counts[0]["kernel_hits"] == 0
    assert (counts[1]["kernels_compiled"], counts[1]["kernel_hits"]) == (0, distinct)
    assert (counts[2]["kernels_compiled"], counts[2]["kernel_hits"]) == (distinct, 0)
