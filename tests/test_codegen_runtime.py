"""The runtime: vectorized inner loops without libm calls, the disk cache across processes (hits,
corrupt and stale entries), fusion and memory planning."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tracer as tr
import tracer.nn.functional as F
from tracer import ir
from tracer.ir.fusion import fuse
from tracer.ir.memory import plan_memory
from tracer.ir.types import TensorType
from tracer.runtime import jit
from tracer.runtime.pipeline import compile_graph
from conftest import stored_but_unread

ROOT = Path(__file__).resolve().parent.parent
LIBM = ("expf", "exp", "logf", "log", "tanhf", "tanh", "sinf", "sin", "cosf", "cos", "powf", "pow")


def gelu_forward_backward(n: int, dtype: str = "f32") -> ir.Graph:
    """y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))) and its derivative times the cotangent g."""
    f = ir.Graph("gelu")
    x = f.add_parameter("x", TensorType((n,), dtype))
    g = f.add_parameter("g", TensorType((n,), dtype))
    b = ir.GraphBuilder(f)
    c = 0.7978845608028654
    inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)), c)
    t = b.op("tanh", inner)
    y = b.mul(b.mul(x, 0.5), b.add(t, 1.0))
    d_inner = b.mul(b.add(b.mul(b.mul(x, x), 3 * 0.044715), 1.0), c)
    dy = b.add(b.mul(b.add(t, 1.0), 0.5), b.mul(b.mul(x, 0.5),
                                                b.mul(b.sub(1.0, b.mul(t, t)), d_inner)))
    f.outputs = [y, b.mul(g, dy)]
    return ir.optimize(f)


def test_gelu_inner_loop_is_vectorized_without_libm_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    function = gelu_forward_backward(1 << 16)
    compiled = compile_graph(function)
    fused = compiled.stage_text("fused")
    assert fused.count("kernel_") == 1  # forward and backward in one loop nest, tanh computed once
    llvm_text = compiled.stage_text("llvm")
    assert "vector.body" in llvm_text  # the loop vectorizer's loop
    assert re.search(r"fmul[^\n]*<\d+ x (float|double)>", llvm_text), "inner loop is not vectorized"
    called = set(re.findall(r"call [^@]*@([\w.]+)\(", llvm_text))
    assert not called & set(LIBM), called
    assert not any(name.startswith("tracer.") for name in called)  # all inlined
    x = np.random.default_rng(0).normal(0, 3, 1 << 16).astype(np.float32)
    g = np.random.default_rng(1).normal(0, 1, 1 << 16).astype(np.float32)
    # For x < -3, dy ~ (1 + tanh) * (0.5 + x c') cancels: one ulp of tanh (numpy's float32 tanh is
    # itself up to ~2 ulp off, ours <= 1) moves dy by ~8 |g| ulp(1) ~ 2e-6: compare at that scale.
    for actual, expected in zip(compiled([x, g]), ir.interpret(function, [x, g])):
        np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=1e-5)


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from tracer import ir
    from tracer.runtime import jit
    from tracer.runtime.pipeline import compile_graph
    sys.path.insert(0, {tests!r})
    from test_codegen_runtime import gelu_forward_backward
    compiled = compile_graph(gelu_forward_backward(1000))
    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    y, dy = compiled([x, np.ones_like(x)])
    print(json.dumps(dict(jit.STATISTICS, y=float(y.sum()), dy=float(dy.sum()),
                          program=compiled.disk_key.hex() + ".o")))
""")


def run_process(cache: Path) -> dict:
    environment = dict(os.environ, TRACER_CACHE_DIR=str(cache))
    environment.pop("TRACER_DISABLE_CACHE", None)
    script = SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    output = subprocess.run([sys.executable, "-c", script], env=environment, check=True,
                            capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def corrupt(entry: Path, content: str) -> None:
    data = entry.read_bytes()
    if content == "flipped":  # a flipped byte in the object code: the checksum no longer matches
        data = bytearray(data)
        data[-100] ^= 0xFF
        entry.write_bytes(bytes(data))
    else:
        entry.write_bytes(data[:200] if content == "truncated" else b"not an object file")


def test_second_process_compiles_nothing_and_corrupt_entries_are_recompiled(tmp_path):
    first = run_process(tmp_path)
    assert (first["compiled"], first["disk_hits"], first["kernel_hits"]) == (1, 0, 0)
    kernels = first["kernels_compiled"]
    assert kernels >= 1
    program = tmp_path / first["program"]
    entries = list(tmp_path.glob("*.o"))
    assert program in entries and len(entries) == 1 + kernels  # the program's, each kernel's
    second = run_process(tmp_path)
    assert (second["compiled"], second["disk_hits"], second["kernels_compiled"]) == (0, 1, 0)
    assert (second["y"], second["dy"]) == (first["y"], first["dy"])

    # the program's entry corrupt: compiled again from its kernels' entries
    for content in ("flipped", "truncated", "garbage"):
        corrupt(program, content)
        again = run_process(tmp_path)
        assert (again["compiled"], again["disk_hits"]) == (1, 0)
        assert (again["kernels_compiled"], again["kernel_hits"]) == (0, kernels)
        assert (again["y"], again["dy"]) == (first["y"], first["dy"])
    assert run_process(tmp_path)["compiled"] == 0  # the rewritten entry is good

    # every entry corrupt: everything compiled again
    for content in ("flipped", "truncated", "garbage"):
        for entry in entries:
            corrupt(entry, content)
        again = run_process(tmp_path)
        assert (again["compiled"], again["disk_hits"]) == (1, 0)
        assert (again["kernels_compiled"], again["kernel_hits"]) == (kernels, 0)
        assert (again["y"], again["dy"]) == (first["y"], first["dy"])
    assert run_process(tmp_path)["compiled"] == 0


def test_cache_key_covers_host_and_version():
    from tracer.runtime.cache import cache_key
    base = cache_key("ir", "triple", "cpu", "+avx", False)
    assert base != cache_key("ir ", "triple", "cpu", "+avx", False)
    assert base != cache_key("ir", "triple", "cpu2", "+avx", False)
    assert base != cache_key("ir", "triple", "cpu", "-avx", False)
    assert base != cache_key("ir", "triple", "cpu", "+avx", True)


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    before = dict(jit.STATISTICS)
    compile_graph(gelu_forward_backward(77))
    assert not list(tmp_path.iterdir())
    assert jit.STATISTICS["compiled"] == before["compiled"] + 1


def test_no_raw_addresses_in_the_module(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    f = ir.Graph("mm")
    x = f.add_parameter("x", TensorType((4, 4), "f64"))
    f.outputs = [ir.GraphBuilder(f).op("matmul", x, x)]
    compiled = compile_graph(f)
    assert "inttoptr" not in compiled.llvm_ir
    if jit.blas_available():
        assert "@tracer_dgemm" in compiled.llvm_ir


def test_memory_plan_reuses_dead_temporaries():
    f = ir.Graph("chain")
    x = f.add_parameter("x", TensorType((64, 64), "f64"))
    b = ir.GraphBuilder(f)
    value = x
    for _ in range(6):  # each matmul result is a temporary, dead after the next matmul
        value = b.op("matmul", b.op("tanh", value), x)
    f.outputs = [value]
    fused = fuse(f)
    plan = plan_memory(fused)
    one = 64 * 64 * 8
    assert plan.arena_size <= 2 * one
    compiled = compile_graph(f)
    argument = np.random.default_rng(2).normal(0, 0.1, (64, 64))
    np.testing.assert_allclose(compiled([argument])[0], ir.interpret(f, [argument])[0],
                               rtol=1e-12, atol=1e-15)


def test_reentrant_calls_from_threads():
    from concurrent.futures import ThreadPoolExecutor
    function = gelu_forward_backward(10_000, "f64")
    compiled = compile_graph(function)
    rng = np.random.default_rng(3)
    inputs = [[rng.normal(size=10_000), rng.normal(size=10_000)] for _ in range(16)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(compiled, inputs))
    for arguments, result in zip(inputs, results):
        for actual, expected in zip(result, ir.interpret(function, arguments)):
            # dy cancels terms of size up to ~10: compare absolutely at that scale
            np.testing.assert_allclose(actual, expected, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("size", [1000, 4097, 65_536 + 3])
def test_threads_give_bit_identical_results(size, monkeypatch, tmp_path):
    from tracer.ir import schedule_threads
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(schedule_threads, "PARALLEL_WORK_PER_THREAD", 64)  # split even small kernels
    f = ir.Graph("mixed")
    x = f.add_parameter("x", TensorType((size // 7 + 1, 7), "f32"))
    b = ir.GraphBuilder(f)
    t = b.op("tanh", b.op("exp", b.op("sin", x)))
    rows = b.reduce_sum(b.mul(t, x), (1,))  # an inline reduction per row
    f.outputs = [t, rows, b.op("transpose", b.mul(x, 3.0), permutation=(1, 0))]
    argument = np.random.default_rng(4).normal(0, 2, x.shape).astype(np.float32)
    results = {}
    for threads in ("1", "2", "4", "5"):
        monkeypatch.setenv("TRACER_NUM_THREADS", threads)
        compiled = compile_graph(f)
        if threads != "1":
            assert "call void @tracer_parallel" in compiled.llvm_ir
        results[threads] = compiled([argument])
    for threads in ("2", "4", "5"):
        for single, multi in zip(results["1"], results[threads]):
            assert single.tobytes() == multi.tobytes()
    for actual, expected in zip(results["1"], ir.interpret(f, [argument])):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def erf_gelu_step(x):
    y = F.gelu(x)
    y.sum().backward()
    return y


def shared_chain_step(x):
    # a Clenshaw recurrence: each term is read by the next two, so its expression tree (not its
    # graph) doubles every two terms and is stored to bound recomputation
    b1, b2 = tr.zeros_like(x), tr.zeros_like(x)
    for coefficient in (0.5, -0.25, 0.125, 0.3, -0.7, 0.9, 0.11, -0.13, 0.2, 0.4) * 3:
        b1, b2 = 2 * x * b1 - b2 + coefficient, b1
    (x * b1 - b2).sum().backward()
    return b1


@pytest.mark.parametrize("step", [erf_gelu_step, shared_chain_step])
def test_a_value_stored_to_bound_recomputation_but_read_only_in_its_kernel_is_not_stored(step):
    """A value stored only so that its readers do not recompute its expression tree is computed
    once per element in its own kernel when all its readers joined that kernel: storing it too
    would write a buffer nobody reads (exact GELU fwd+bwd wrote 12 of them)."""
    x = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    text = tr.trace(step).ir(tr.tensor(x, requires_grad=True), stage="optimized")
    compiled = compile_graph(ir.parse_function(text))
    assert stored_but_unread(compiled.fused) == []
    assert len(compiled.fused.kernels) == 1
    expected = ir.interpret(compiled.function, [x])
    for actual, wanted in zip(compiled([x]), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-5)


def test_long_elementwise_chain_is_split_into_bounded_kernels(monkeypatch, tmp_path):
    """A chain of 300 elementwise ops (100 of them tanh, inline polynomial code): fusion bounds the
    code of each loop kernel (LLVM's optimizer is superlinear in the size of one loop body) and
    the kernels are not inlined back into one function, so compile time grows linearly with the
    graph (measured by `python -m benchmarks.run`, not asserted here); the result equals the
    interpreter's."""
    from tracer.ir.fusion import MAX_EXPRESSION_COST, MAX_KERNEL_COST, code_cost
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    f = ir.Graph("chain")
    x = f.add_parameter("x", TensorType((257,), "f32"))
    y = f.add_parameter("y", TensorType((257,), "f32"))
    b = ir.GraphBuilder(f)
    for k in range(100):
        x = b.add(b.mul(b.op("tanh", x), 0.5), b.mul(y, (k % 7 - 3) / 4))
    f.outputs = [x]
    function = ir.optimize(f)
    assert len(function.instructions) >= 300
    compiled = compile_graph(function)
    kernels = compiled.fused.kernels
    assert len(kernels) > 1
    for kernel in kernels:
        assert sum(map(code_cost, kernel.instructions)) <= MAX_KERNEL_COST + MAX_EXPRESSION_COST
    assert re.search(r"attributes #2 = \{[^}]*noinline", compiled.llvm_ir)
    rng = np.random.default_rng(0)
    arguments = [rng.normal(0, 3, 257).astype(np.float32) for _ in range(2)]
    (actual,), (expected,) = compiled(arguments), ir.interpret(function, arguments)
    # Each step halves the error carried in and adds at most ~2 ulp (tanh here <= 1 ulp, numpy's
    # float32 tanh ~1 ulp, then the rounding of mul and add): a few ulp of the largest value.
    np.testing.assert_allclose(actual, expected, rtol=0,
                               atol=4 * np.spacing(np.abs(expected).max()))


def test_a_long_chain_of_cheap_ops_compiles_with_its_gradient(monkeypatch, tmp_path):
    """600 links of x * w + 0.5 and their gradient, one step: cheap ops, so fusion puts hundreds
    of them in one kernel, and the scheduler evaluates an element by recursing into its operands
    (~5 Python frames an operation): from 200 links on it raised RecursionError. It now makes room
    for the graph's depth while it schedules (and gives Python's limit back); the loss and the
    gradient are the float64 forward-mode values."""
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    links = 600

    @tr.trace
    def step(x, w):
        y = x
        for _ in range(links):
            y = y * w + 0.5
        loss = (y * y).sum()
        loss.backward()
        return loss

    x, w = np.linspace(-1, 1, 16), np.linspace(0.3, 0.6, 16)
    weight = tr.tensor(w.astype(np.float32), requires_grad=True)
    limit = sys.getrecursionlimit()
    loss = step(tr.tensor(x.astype(np.float32)), weight)
    assert sys.getrecursionlimit() == limit
    y, derivative = x.copy(), np.zeros(16)
    for _ in range(links):
        derivative, y = derivative * w + y, y * w + 0.5
    np.testing.assert_allclose(float(loss), (y * y).sum(), rtol=1e-5)
    np.testing.assert_allclose(weight.grad.numpy(), 2 * y * derivative, rtol=1e-4)
