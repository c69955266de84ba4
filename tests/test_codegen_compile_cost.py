"""What the code generator does to keep LLVM's compile time down, checked for what it must not
change: the values (against numpy; every compiled call is also checked against the reference
interpreter by tests/conftest.py) and the vectorized loops."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tracer as tr
from tracer.ir.memory import ALIGNMENT
from tracer.codegen import module as codegen_module
from tracer.codegen.symbols import QUICK_MARK
from tracer.runtime import compile_worker, jit, kernels, native, object_code, pipeline


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def test_math_of_scalars_is_called_out_of_line_before_the_vector_loop():
    """AdamW's bias corrections: `1 - beta ** step` of 0-d tensors, used by every element. The
    pow (and the exp) are called, not inlined, and LLVM hoists the calls out of the loop, which
    still vectorizes."""
    @tr.trace
    def update(x, beta, count):
        return x * (1 - beta ** count) + tr.exp(beta)

    x = np.random.default_rng(0).normal(size=1003).astype(np.float32)  # and a scalar remainder
    beta, count = np.array(0.9, np.float32), np.array(7.0, np.float32)
    expected = x * (1 - np.float32(0.9) ** np.float32(7)) + np.exp(np.float32(0.9))
    np.testing.assert_allclose(update(x, beta, count).numpy(), expected, rtol=2e-7, atol=0)
    text = update.ir(x, beta, count, stage="llvm")
    kernel = text[text.index("define internal"):]
    calls = [kernel.index(f"@tracer.{name}.f32(float") for name in ("pow", "exp")]
    assert max(calls) < kernel.index("vector.body:")
    vector_body = kernel[kernel.index("vector.body:"):]
    assert re.search(r"<\d+ x float>", vector_body[:vector_body.index("\n\n")])


def test_math_called_only_out_of_line_is_left_unoptimized_and_the_loop_still_vectorizes():
    """A pow of scalars (AdamW's `beta ** step`, float64) next to an exp of each element: the pow,
    called only out of line, is left to LLVM's quick code generator (optnone); the exp, also
    inlined into the loop, is optimized; the loop vectorizes with the pow's call before it, and
    the results are numpy's."""
    @tr.trace
    def update(x, beta, count):
        return x * (1 - beta ** count).float() + tr.exp(x)

    x = np.random.default_rng(9).normal(size=1003).astype(np.float32)
    beta, count = np.array(0.999), np.array(12.0)
    expected = x * np.float32(1 - 0.999 ** 12.0) + np.exp(x)
    np.testing.assert_allclose(update(x, beta, count).numpy(), expected, rtol=3e-7, atol=0)
    (entry,) = update._signatures.entries.values()
    (module,) = [m for m in entry.executable.back_end.code.kernels if "@tracer.pow.f64(" in m.text]
    definitions = dict(re.findall(r"^define internal [^@\n]*@(tracer\.[\w.]+)\(.*\) (#\d) \{$",
                                  module.text, re.MULTILINE))
    assert definitions["tracer.pow.f64"] == codegen_module.OUT_OF_LINE_ONLY
    assert definitions["tracer.exp.f32"] == "#0"
    text = update.ir(x, beta, count, stage="llvm")
    kernel = text[text.index("define internal fastcc void @kernel"):]
    assert kernel.index("@tracer.pow.f64(double") < kernel.index("vector.body:")
    assert re.search(r"<\d+ x float>", kernel)


def test_math_of_elements_is_inlined_and_vectorized():
    """The same functions of each element stay inline: the loop vectorizes through them."""
    @tr.trace
    def update(x, beta):
        return beta ** x + tr.exp(x)

    x = np.random.default_rng(1).normal(size=1003).astype(np.float32)
    beta = np.array(0.9, np.float32)
    expected = np.float32(0.9) ** x + np.exp(x)
    np.testing.assert_allclose(update(x, beta).numpy(), expected, rtol=3e-7, atol=0)
    text = update.ir(x, beta, stage="llvm")
    kernel = text[text.index("define internal"):]
    assert "call fastcc float @tracer." not in kernel and "call float @tracer." not in kernel
    assert re.search(r"<\d+ x float>", kernel)


@pytest.mark.parametrize("blas", [True, False], ids=["blas", "loop-nest"])
def test_kernels_that_only_call_blas_are_compiled_as_the_entry(monkeypatch, blas):
    """A matmul kernel whose product is one BLAS gemm call per matrix is compiled without LLVM's
    optimizer, as the entry is; the same product as a loop nest (no BLAS) and the elementwise
    kernel after it are optimized."""
    if blas and not native.blas_available():
        pytest.skip("no BLAS gemm found")
    monkeypatch.setattr(native, "blas_available", lambda: blas)

    @tr.trace
    def attention_scores(q, k):
        return (q @ k.transpose(-1, -2)).tanh()

    rng = np.random.default_rng(2)
    q, k = (rng.normal(size=(3, 20, 8)).astype(np.float32) for _ in range(2))
    expected = np.tanh(q @ k.transpose(0, 2, 1))
    np.testing.assert_allclose(attention_scores(q, k).numpy(), expected, rtol=2e-6, atol=2e-6)
    (entry,) = attention_scores._signatures.entries.values()
    modules = entry.executable.back_end.code.kernels
    calling_blas = ["call void @tracer_sgemm(" in module.text for module in modules]
    assert any(calling_blas) == blas and not all(calling_blas)
    for module, calls_blas in zip(modules, calling_blas):
        assert (kernels.kernel_options(module.text) == kernels.ENTRY_OPTIONS) == calls_blas


def test_an_arena_made_ahead_holds_the_temporaries(monkeypatch):
    """The arena made (and its pages touched) in a thread while the program compiles, as a large
    one is (runtime/arena.py; every one here), is the one the calls run on: aligned, of the
    plan's size, and the results are numpy's, call after call."""
    monkeypatch.setattr(pipeline, "AHEAD_BYTES", 0)

    @tr.trace
    def layers(x, w):
        hidden = (x @ w).tanh()
        return (hidden @ w.T).exp().sum(1), hidden.max()

    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(64, 48)), rng.normal(size=(48, 96)) / 8
    hidden = np.tanh(x @ w)
    for _ in range(2):
        total, largest = layers(x, w)
        np.testing.assert_allclose(total.numpy(), np.exp(hidden @ w.T).sum(1), rtol=1e-12)
        assert largest.item() == hidden.max()
    (entry,) = layers._signatures.entries.values()
    compiled = entry.executable
    assert compiled.plan.arena_size > 0
    storage = compiled._arena
    address = compiled._free_arena[0]
    assert address % ALIGNMENT == 0
    assert storage.ctypes.data <= address
    assert address + compiled._arena_size <= storage.ctypes.data + storage.nbytes


def loop_hints(traced) -> list[set[str]]:
    """For each loop of the traced function's one kernel, outermost first, the names of the
    llvm.loop properties its latch carries (llvm.loop.unroll.disable, ...)."""
    (entry,) = traced._signatures.entries.values()
    (module,) = entry.executable.back_end.code.kernels
    text = module.text
    properties = dict(re.findall(r'^!(\d+) = !{!"([\w.]+)"', text, re.M))
    loops = {number: {properties[item] for item in re.findall(r"!(\d+)", items)[1:]}
             for number, items in re.findall(r"^!(\d+) = distinct !{(.*)}$", text, re.M)}
    latches = dict(re.findall(r"br label %(L\d+)\.head(?:, !llvm.loop !(\d+))?", text))
    heads = re.findall(r"^(L\d+)\.head:", text, re.M)
    return [loops.get(latches[head], set()) for head in heads]


def loops_not_unrolled(traced) -> list[bool]:
    """For each loop of the traced function's one kernel, outermost first, whether its latch
    carries LLVM's llvm.loop.unroll.disable."""
    return ["llvm.loop.unroll.disable" in hints for hints in loop_hints(traced)]


def test_loops_around_long_loops_are_not_unrolled():
    """Splitting heads (a transpose of rows of 32 floats, in loops of 6 x 20 rows), as the GPT
    step does: LLVM is told not to unroll the loops around the rows, nor the rows themselves (of
    fixed length) before vectorizing them, and the copy is right."""
    @tr.trace
    def split_heads(x):
        return x.reshape(2, 20, 6, 32).transpose(1, 2).contiguous() * 2.0

    x = np.random.default_rng(5).normal(size=(2, 20, 192)).astype(np.float32)
    expected = x.reshape(2, 20, 6, 32).transpose(0, 2, 1, 3) * np.float32(2.0)
    np.testing.assert_array_equal(split_heads(x).numpy(), expected)
    assert loops_not_unrolled(split_heads) == [True, True, True, True]


def test_loops_around_small_loops_may_be_unrolled():
    """Maxima over windows of 2 x 2 (inner loops of 4 iterations in all): LLVM may unroll the
    loop around them (and vectorize across the copies), not the loops around that one (8 x 4
    copies of the window's body and more)."""
    @tr.trace
    def pooled(x):
        return x.reshape(16, 8, 2, 8, 2).amax(dim=(2, 4))

    x = np.random.default_rng(6).normal(size=(16, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(pooled(x).numpy(), x.reshape(16, 8, 2, 8, 2).max(axis=(2, 4)))
    assert loops_not_unrolled(pooled) == [True, True, False, False, False]


@pytest.mark.parametrize("columns", [192, 12])
def test_long_innermost_loops_are_not_unrolled_once_vectorized(columns):
    """Rows of 192 floats, as the GPT step's are: their loops tell LLVM not to unroll the loop it
    vectorizes (it copied a vector body up to 24 times, a fifth of its work on the GPT step's
    kernels, for no measured gain), and the sum's asks for 8 lanes; LLVM vectorizes both and
    still interleaves the sum's partial sums (4 vectors of them with AVX2). Rows of 12 carry no
    hint (LLVM unrolls them as it sees fit). The values are numpy's."""
    @tr.trace
    def scaled(x):
        return x * x.sum(dim=1, keepdim=True)

    x = np.random.default_rng(7).normal(size=(4, columns)).astype(np.float32)
    expected = x * x.sum(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
    np.testing.assert_allclose(scaled(x).numpy(), expected, rtol=1e-6)
    unroll, lanes = "llvm.loop.unroll.disable", "llvm.loop.vectorize.width"
    vectorized = "llvm.loop.vectorize.followup_all"
    # (the product's row, without a reduction, is not interleaved: see render_kernel.loop_hint)
    single = "llvm.loop.interleave.count"
    # (and, of fixed length, is not unrolled before it is vectorized either)
    row_loops = ([{vectorized, lanes}, {vectorized, single, unroll}] if columns == 192
                 else [set(), set()])
    assert loop_hints(scaled) == [{unroll}, {unroll}, *row_loops]
    if columns == 192:
        llvm = scaled.ir(x, stage="llvm")
        # (LLVM interleaves up to 4 vectors where the CPU has AVX, 2 on SSE alone)
        assert len(set(re.findall(r"fadd reassoc.* <8 x double> (%vec\.phi\d*)", llvm))) >= 2
        loops = re.findall(r"br i1 %\w+, label %[\w.]+, label %(vector\.body\d*), !llvm.loop !(\d+)",
                           llvm)
        assert len(loops) == 2, llvm  # both rows' loops are vectorized loops still
        hints = dict(re.findall(r'^!(\d+) = !{!"([\w.]+)"}', llvm, re.M))
        for _, number in loops:
            (node,) = re.findall(rf"^!{number} = distinct !{{(.*)}}$", llvm, re.M)
            assert unroll in {hints.get(item) for item in re.findall(r"!(\d+)", node)}


def test_a_row_that_divides_its_counter_is_split_into_runs():
    """Merging heads, as the GPT step does: each row of 192 reads 6 runs of 32 (its counter
    divided by 32); it is 6 loops of 32 (ir/loop_split.py), each vectorized whole and not
    unrolled, with no division left. The values are numpy's."""
    @tr.trace
    def merge(q):
        return q.transpose(1, 2).reshape(2, 20, 192) * 2.0

    q = np.random.default_rng(8).normal(size=(2, 6, 20, 32)).astype(np.float32)
    np.testing.assert_array_equal(merge(q).numpy(),
                                  q.transpose(0, 2, 1, 3).reshape(2, 20, 192) * np.float32(2.0))
    assert loop_hints(merge)[-2:] == [{"llvm.loop.unroll.disable"}, {
        "llvm.loop.unroll.disable", "llvm.loop.vectorize.followup_all",
        "llvm.loop.interleave.count"}]
    loops = merge.ir(q, stage="loops")
    assert ".remainder in [0, 32)" in loops and " div " not in loops and " rem " not in loops


def test_kernels_doing_a_negligible_part_of_the_work_are_compiled_quickly():
    """A step's tanh over 200,000 floats and a bias of 8: the bias's kernels (0.01% of the
    statements executed) are marked and compiled with LLVM's quick pipeline (scalar: no vector
    instruction in their code), the big one at O3 (vectorized); every result is numpy's. The
    worker makes the same object code of a quick module as this process."""
    @tr.trace
    def step(x, bias):
        return (x * 1.5).tanh(), bias.exp() * 2.0

    rng = np.random.default_rng(7)
    x, bias = rng.normal(size=200_000).astype(np.float32), rng.normal(size=8).astype(np.float32)
    big, small = step(x, bias)
    np.testing.assert_allclose(big.numpy(), np.tanh(x * np.float32(1.5)), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(small.numpy(), np.exp(bias) * 2, rtol=2e-6, atol=0)
    (entry,) = step._signatures.entries.values()
    loops = entry.executable.back_end.loops
    statements = [codegen_module.executed_statements(kernel) for kernel in loops.kernels]
    assert codegen_module.quick_kernels(loops) == {
        position for position, count in enumerate(statements) if count < max(statements)}
    modules = entry.executable.back_end.code.kernels
    quick = [module for module in modules if kernels.kernel_options(module.text)["quick"]]
    assert 1 <= len(quick) < len(modules)
    for module in modules:
        vector = re.search(r"<\d+ x float>", jit.optimized_ir(
            module.text, **kernels.kernel_options(module.text)))
        assert (vector is None) == (module in quick)
    worker = compile_worker.start()
    if worker is not None:
        for module in quick:
            options = kernels.kernel_options(module.text)
            assert worker.send((module.text, options))
            assert worker.receive() == object_code.compile_object(module.text, **options)


def test_a_program_of_kernels_of_similar_work_has_no_quick_kernel():
    """Each kernel of a small step is a real part of its work: none is compiled quickly."""
    @tr.trace
    def step(x, w):
        return (x @ w).tanh().sum(0), w * 0.5

    rng = np.random.default_rng(8)
    x, w = rng.normal(size=(16, 8)), rng.normal(size=(8, 4))
    total, half = step(x, w)
    np.testing.assert_allclose(total.numpy(), np.tanh(x @ w).sum(0), rtol=1e-12)
    np.testing.assert_array_equal(half.numpy(), w * 0.5)
    (entry,) = step._signatures.entries.values()
    assert codegen_module.quick_kernels(entry.executable.back_end.loops) == set()
    assert not any(kernels.kernel_options(module.text).get("quick")
                   for module in entry.executable.back_end.code.kernels)


@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_rendered_as_they_are_scheduled_make_the_modules_of_the_whole_program(
        monkeypatch, threads):
    """The back end renders each kernel as soon as it is scheduled and hands its module to the
    compilation once its text is certain. The two small kernels (the bias's, its sum) come first
    and are quick only by the whole program's work: each is handed over unmarked as it comes
    (its work outweighed the work so far), then marked at the end -- on two threads too, where
    they waited for the one kernel split across threads, the last, while its thread-pool wrapper
    was declared in every module's header (it is in the entry's module now). The modules and the
    entry are those rendered from the whole program at once, and the results numpy's."""
    from tracer.ir import schedule
    monkeypatch.setenv("TRACER_NUM_THREADS", str(threads))
    scheduled, handed = [], []
    original_kernels = schedule.schedule_kernels

    def counting(*arguments):
        for kernel in original_kernels(*arguments):
            scheduled.append(kernel.name)
            yield kernel
    monkeypatch.setattr(schedule, "schedule_kernels", counting)
    original_add = kernels.ProgramCompilation.add

    def recording(compilation, module):
        handed.append((module, len(scheduled)))  # (how many kernels were scheduled by then)
        original_add(compilation, module)
    monkeypatch.setattr(kernels.ProgramCompilation, "add", recording)

    @tr.trace
    def step(bias, x):
        small = bias.exp() * 2.0
        return small, (x * 1.5).tanh() + small.sum(), (x * 0.5).sin()

    rng = np.random.default_rng(9)
    bias, x = rng.normal(size=8).astype(np.float32), rng.normal(size=200_000).astype(np.float32)
    small, big, other = step(bias, x)
    np.testing.assert_allclose(small.numpy(), np.exp(bias) * 2, rtol=2e-6, atol=0)
    np.testing.assert_allclose(big.numpy(), np.tanh(x * np.float32(1.5)) + (np.exp(bias) * 2).sum(),
                               rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(other.numpy(), np.sin(x * np.float32(0.5)), rtol=2e-6, atol=1e-7)
    (entry,) = step._signatures.entries.values()
    back_end = entry.executable.back_end
    loops, code = back_end.loops, back_end.code
    assert len(scheduled) == len(loops.kernels) == 3
    settings = back_end.settings
    whole = codegen_module.generate_module(loops, back_end.plan, back_end.host.triple,
                                           settings.blas, settings.layout, settings.profile,
                                           settings.checked, back_end.error_record)
    assert whole.entry == code.entry
    assert [module.text for module in whole.kernels] == [module.text for module in code.kernels]
    first_handed = {}  # each module's symbol: how many kernels were scheduled when first handed
    for module, count in handed:
        first_handed.setdefault(module.symbol, count)
    final = {module.symbol for module in code.kernels}
    assert final <= set(first_handed)
    assert [kernel.threads for kernel in loops.kernels] == [1, 1, threads]
    assert codegen_module.quick_kernels(loops) == {0, 1}
    extra = set(first_handed) - final
    assert sorted(first_handed.values())[:2] == [1, 2]
    marked = {module.text.removeprefix(QUICK_MARK + "\n").replace(module.symbol, "symbol")
              for module in code.kernels if module.text.startswith(QUICK_MARK)}
    assert {module.text.replace(module.symbol, "symbol") for module, _ in handed
            if module.symbol in extra} == marked and len(marked) == 2
