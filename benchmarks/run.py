"""Benchmarks of the compiled kernels against numpy (and PyTorch when it is installed).

    python benchmarks/run.py [--quick] [--overhead] [--compile] [--bounds]

Each case is an IR function (what `@trace` hands to the back end) run three ways: compiled
(`tracer.runtime.compiled.CompiledFunction`), the same computation written directly in numpy, and the
IR interpreter (numpy through the reference semantics). Reports medians over repeated runs and the
ratio numpy / compiled.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracer import ir  # noqa: E402
from tracer.ir.types import TensorType  # noqa: E402
from tracer.runtime.compiled import CompiledFunction  # noqa: E402

C = 0.7978845608028654


def gelu_function(n: int) -> ir.Function:
    f = ir.Function("gelu")
    x = f.add_parameter("x", TensorType((n,), "f32"))
    g = f.add_parameter("g", TensorType((n,), "f32"))
    b = ir.GraphBuilder(f)
    t = b.op("tanh", b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)), C))
    y = b.mul(b.mul(x, 0.5), b.add(t, 1.0))
    d_inner = b.mul(b.add(b.mul(b.mul(x, x), 3 * 0.044715), 1.0), C)
    dy = b.add(b.mul(b.add(t, 1.0), 0.5), b.mul(b.mul(x, 0.5), b.mul(b.sub(1.0, b.mul(t, t)),
                                                                     d_inner)))
    f.outputs = [y, b.mul(g, dy)]
    return ir.optimize(f)


def gelu_numpy(x, g):
    t = np.tanh((x + 0.044715 * x * x * x) * np.float32(C))
    y = 0.5 * x * (1 + t)
    d_inner = (1 + 3 * 0.044715 * x * x) * np.float32(C)
    return y, g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)


def two_layer_function(batch: int, inputs: int, hidden: int, outputs: int) -> ir.Function:
    """relu(x @ w1) @ w2, squared loss, backward, SGD update: returns loss, new w1, new w2."""
    f = ir.Function("step")
    x = f.add_parameter("x", TensorType((batch, inputs), "f32"))
    w1 = f.add_parameter("w1", TensorType((inputs, hidden), "f32"))
    w2 = f.add_parameter("w2", TensorType((hidden, outputs), "f32"))
    t = f.add_parameter("t", TensorType((batch, outputs), "f32"))
    b = ir.GraphBuilder(f)
    h_pre = b.op("matmul", x, w1)
    h = b.op("maximum", h_pre, b.full(h_pre.shape, 0.0, "f32"))
    d = b.sub(b.op("matmul", h, w2), t)
    loss = b.reduce_sum(b.mul(d, d), (0, 1))
    g = b.mul(d, 2.0)
    gw2 = b.op("matmul", b.swap_last_axes(h), g)
    gh = b.select(b.gt(h_pre, b.full(h_pre.shape, 0.0, "f32")),
                  b.op("matmul", g, b.swap_last_axes(w2)), b.full(h_pre.shape, 0.0, "f32"))
    gw1 = b.op("matmul", b.swap_last_axes(x), gh)
    f.outputs = [loss, b.sub(w1, b.mul(gw1, 1e-3)), b.sub(w2, b.mul(gw2, 1e-3))]
    return ir.optimize(f)


def two_layer_numpy(x, w1, w2, t):
    h_pre = x @ w1
    h = np.maximum(h_pre, 0)
    d = h @ w2 - t
    loss = np.sum(d * d)
    g = 2 * d
    gh = np.where(h_pre > 0, g @ w2.T, 0)
    return loss, w1 - (x.T @ gh) * np.float32(1e-3), w2 - (h.T @ g) * np.float32(1e-3)


def median_time(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_version(case: str, arrays):
    try:
        import torch
    except ImportError:
        return None
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    if case.startswith("gelu"):
        x, g = tensors

        def run():
            x_ = x.detach().requires_grad_()
            y = torch.nn.functional.gelu(x_, approximate="tanh")
            y.backward(g)
            return y, x_.grad
        return run
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--overhead", action="store_true", help="only the per-call overhead")
    parser.add_argument("--compile", action="store_true",
                        help="only the compile time against graph size")
    parser.add_argument("--bounds", action="store_true",
                        help="only the cost of TRACER_CHECK_BOUNDS=1 (GELU on 1M floats)")
    options = parser.parse_args()
    if options.bounds:
        print_bounds_cost(5 if options.quick else 100)
        return
    if options.overhead:
        print_traced_overhead()
        return
    if options.compile:
        print_compile_times([100, 300, 1000] if options.quick else [100, 300, 1000, 3000])
        return
    repeats = 5 if options.quick else 30
    rng = np.random.default_rng(0)
    cases = []
    for n in ([1 << 16] if options.quick else [1 << 16, 1 << 20]):
        x = rng.normal(0, 2, n).astype(np.float32)
        g = rng.normal(0, 1, n).astype(np.float32)
        cases.append((f"gelu fwd+bwd n={n}", gelu_function(n), gelu_numpy, [x, g]))
    shapes = [(64, 784, 128, 10)] if options.quick else [(64, 784, 128, 10), (256, 1024, 1024, 10)]
    for batch, inputs, hidden, outputs in shapes:
        arrays = [rng.normal(0, 0.1, s).astype(np.float32) for s in
                  [(batch, inputs), (inputs, hidden), (hidden, outputs), (batch, outputs)]]
        cases.append((f"two-layer step {batch}x{inputs}x{hidden}x{outputs}",
                      two_layer_function(batch, inputs, hidden, outputs), two_layer_numpy, arrays))

    print(f"{'case':<40} {'compiled':>12} {'numpy':>12} {'interpreter':>12} {'numpy/compiled':>15}"
          f" {'torch':>12}")
    for name, function, numpy_version, arrays in cases:
        start = time.perf_counter()
        compiled = CompiledFunction(function)
        compile_time = time.perf_counter() - start
        compiled_time = median_time(lambda: compiled(arrays), repeats)
        numpy_time = median_time(lambda: numpy_version(*arrays), repeats)
        interpreter_time = median_time(lambda: ir.interpret(function, arrays), max(3, repeats // 5))
        torch_run = torch_version(name, arrays)
        torch_text = f"{median_time(torch_run, repeats) * 1e3:10.3f}ms" if torch_run else "-"
        print(f"{name:<40} {compiled_time * 1e3:10.3f}ms {numpy_time * 1e3:10.3f}ms "
              f"{interpreter_time * 1e3:10.3f}ms {numpy_time / compiled_time:14.1f}x "
              f"{torch_text:>12}   (compile {compile_time:.2f}s)")

    tiny = CompiledFunction(gelu_function(4))
    arrays = [np.ones(4, np.float32), np.ones(4, np.float32)]
    overhead = median_time(lambda: tiny(arrays), 2000)
    print(f"per-call overhead (n=4 GELU fwd+bwd): {overhead * 1e6:.2f} us")
    print_traced_overhead()
    print_compile_times([100, 300, 1000])


def print_bounds_cost(repeats: int) -> None:
    """GELU forward+backward on 1M floats, unchecked and bounds-checked (TRACER_CHECK_BOUNDS=1),
    on one thread and on the default number: medians, interleaved so that machine noise hits
    both alike, and their ratio."""
    n = 1 << 20
    rng = np.random.default_rng(0)
    arrays = [rng.normal(0, 2, n).astype(np.float32), rng.normal(0, 1, n).astype(np.float32)]
    function = gelu_function(n)
    for threads in ("1", ""):
        variants = {}
        for checked in ("0", "1"):
            os.environ.update(TRACER_CHECK_BOUNDS=checked, TRACER_NUM_THREADS=threads)
            variants[checked] = CompiledFunction(function)
        times = {checked: [] for checked in variants}
        for _ in range(repeats):
            for checked, compiled in variants.items():
                times[checked].append(median_time(lambda: compiled(arrays), 1))
        plain, checked = (statistics.median(times[c]) for c in ("0", "1"))
        print(f"GELU fwd+bwd n={n}, threads={threads or 'default'}: unchecked "
              f"{plain * 1e3:.3f} ms, checked {checked * 1e3:.3f} ms, ratio {checked / plain:.2f}")
    os.environ.pop("TRACER_CHECK_BOUNDS")
    os.environ.pop("TRACER_NUM_THREADS")


def chain_function(length: int, size: int = 1000) -> ir.Function:
    """x = tanh(x) * 1.01 + 0.1, `length` times: 3 * length elementwise ops."""
    f = ir.Function("chain")
    x = f.add_parameter("x", TensorType((size,), "f32"))
    b = ir.GraphBuilder(f)
    for _ in range(length):
        x = b.add(b.mul(b.op("tanh", x), 1.01), 0.1)
    f.outputs = [x]
    return f


def print_compile_times(lengths: list[int]) -> None:
    """Compile time (optimize + fuse + codegen + LLVM, no disk cache) of a chain of elementwise
    ops against its length: it should grow linearly."""
    import os

    os.environ["TRACER_DISABLE_CACHE"] = "1"
    for length in lengths:
        function = chain_function(length)
        start = time.perf_counter()
        compiled = CompiledFunction(ir.optimize(function))
        seconds = time.perf_counter() - start
        print(f"compile time, chain of {3 * length} elementwise ops: {seconds:.2f}s "
              f"({seconds / (3 * length) * 1e3:.2f} ms/op, {len(compiled.fused.kernels)} kernels)")


def print_traced_overhead(calls: int = 20000) -> None:
    """Per-call time of a tiny traced function, of its CompiledFunction, and of the bare native
    entry (ctypes call with a prepared pointer array): what Python adds on top of the kernels."""
    import timeit

    import tracer as tr

    @tr.trace
    def f(x, w, lr):
        return (x * w).sum() * lr

    x, w = tr.tensor(np.ones(4, np.float32)), tr.tensor(np.ones(4, np.float32))
    f(x, w, 0.1)
    compiled = next(iter(f._signatures.entries.values())).executable
    arrays = [x._handle, w._handle, np.array(0.1)]
    outputs = [np.empty(shape, dtype) for shape, dtype in compiled._outputs]
    pointers = np.array([a.ctypes.data for a in arrays + outputs] + [compiled._arena_address],
                        np.uintp)
    address = pointers.ctypes.data

    def per_call(call) -> float:
        return min(timeit.repeat(call, number=calls, repeat=5)) / calls

    print(f"per-call time of @trace f(x, w, lr) = (x*w).sum()*lr on 4 elements: "
          f"traced {per_call(lambda: f(x, w, 0.1)) * 1e6:.2f} us, "
          f"CompiledFunction {per_call(lambda: compiled(arrays)) * 1e6:.2f} us, "
          f"bare ctypes entry {per_call(lambda: compiled._entry(address)) * 1e6:.2f} us")


if __name__ == "__main__":
    main()
