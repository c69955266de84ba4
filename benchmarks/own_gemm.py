"""The own float32 gemm (runtime/own_gemm.py) against OpenBLAS's, and what it does to the GPT step.

`shapes`: every product shape of the GPT step at issue 15's size (16x128 tokens, 4 layers x 192:
x @ W.T forward, G @ W for the input's gradient, G^T @ X for the weight's), a few blocks of
them and the seed and MLP steps' products, each called through the cblas interface on one thread, the two gemms interleaved call by
call: GF/s of the median and of the fastest call (the machine's noise only adds time). The
reference for the figures: this core's float32 FMA peak (`peak`, <16 x float> FMAs in 12
independent chains), what no gemm can beat.

`step`: the GPT step traced twice in one process, linked to OpenBLAS (TRACER_OWN_GEMM=0) and to
the own gemm (each in a disk cache folder of its own, so that the second is linked after the own
gemm registers), and torch.compile's step, in interleaved rounds of shuffled order: medians and
the ratios to torch.compile.

    python -m benchmarks.own_gemm [shapes|peak|step] [--rounds N]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import tempfile
import time

import numpy as np

from tracer.runtime import native, own_gemm, pool

# (rows, k, columns, A transposed, B transposed) of the GPT step's products, then blocks of them
SHAPES = [(2048, 192, 576, False, True), (2048, 192, 192, False, True),
          (2048, 192, 768, False, True), (2048, 768, 192, False, True),
          (2048, 576, 192, False, False), (2048, 192, 768, False, False),
          (576, 2048, 192, True, False), (192, 2048, 768, True, False),
          (768, 2048, 192, True, False), (1056, 192, 768, False, True),
          (1056, 192, 192, False, True), (96, 2048, 768, True, False),
          # the seed step's (100 columns: two panels and one vector), the MLP's, 64 columns
          (64, 1000, 100, False, False), (1000, 64, 100, True, False),
          (256, 784, 512, False, False), (2048, 64, 64, False, True)]
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
                             ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                             ctypes.c_void_p, ctypes.c_int64)
GPT = "16×128 tokens, 4 layers × 192 (6 heads of 32)"


def shapes(rounds: int) -> list[str]:
    module = own_gemm.load_or_compile(native.host(), own_gemm.AVX512)
    gemms = {"own": SIGNATURE(module.address(own_gemm.FUNCTION)),
             "OpenBLAS": SIGNATURE(ctypes.cast(native.blas_library().scipy_cblas_sgemm64_,
                                               ctypes.c_void_p).value)}
    pool.hold_blas()  # OpenBLAS on this thread, as compiled code runs it
    rng = np.random.default_rng(0)
    lines = []
    for m, k, n, transpose_a, transpose_b in SHAPES:
        a = rng.standard_normal((k, m) if transpose_a else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if transpose_b else (k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        arguments = (101, 112 if transpose_a else 111, 112 if transpose_b else 111, m, n, k, 1.0,
                     a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 0.0, c.ctypes.data, n)
        times: dict[str, list[float]] = {name: [] for name in gemms}
        for _ in range(rounds):
            for name, gemm in gemms.items():
                started = time.perf_counter()
                gemm(*arguments)
                times[name].append(time.perf_counter() - started)
        flops = 2 * m * k * n
        rates = {name: (flops / statistics.median(t) / 1e9, flops / min(t) / 1e9)
                 for name, t in times.items()}
        ratio = statistics.median(times["own"]) / statistics.median(times["OpenBLAS"])
        lines.append(f"{m}x{k}x{n}{' A^T' if transpose_a else ''}{' B^T' if transpose_b else ''}: "
                     + ", ".join(f"{name} {median:.0f} GF/s (fastest {fastest:.0f})"
                                 for name, (median, fastest) in rates.items())
                     + f"; own/OpenBLAS time {ratio:.2f}")
    pool.release_blas()
    return lines


def peak() -> str:
    """This core's float32 FMA throughput: 12 chains of <16 x float> fused multiply-adds."""
    from tracer.runtime.object_code import compile_object
    chains, steps = 12, 2_000_000
    vector = "<16 x float>"
    body = "\n".join(f"  %s{c} = call {vector} @llvm.fma.v16f32({vector} %a{c}, {vector} %x, "
                     f"{vector} %y)" for c in range(chains))
    phis = "\n".join(f"  %a{c} = phi {vector} [ zeroinitializer, %entry ], [ %s{c}, %loop ]"
                     for c in range(chains))
    total = "\n".join(f"  %t{c} = fadd {vector} %t{c - 1}, %s{c}" for c in range(1, chains))
    text = f"""declare {vector} @llvm.fma.v16f32({vector}, {vector}, {vector})
define void @peak(i64 %n, float %x.0, ptr %out) {{
entry:
  %x.1 = insertelement {vector} poison, float %x.0, i64 0
  %x = shufflevector {vector} %x.1, {vector} poison, <16 x i32> zeroinitializer
  %y = fmul {vector} %x, %x
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
{phis}
{body}
  %i.next = add i64 %i, 1
  %more = icmp slt i64 %i.next, %n
  br i1 %more, label %loop, label %exit
exit:
  %t0 = fadd {vector} %s0, zeroinitializer
{total}
  store {vector} %t{chains - 1}, ptr %out, align 4
  ret void
}}"""
    module = native.JitModule.link([compile_object(text)])
    function = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p)(
        module.address("peak"))
    out = np.empty(16, np.float32)
    fastest = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        function(steps, 0.5, out.ctypes.data)
        fastest = min(fastest, time.perf_counter() - started)
    return f"float32 FMA peak of one core: {2 * 16 * chains * steps / fastest / 1e9:.0f} GF/s"


def step(rounds: int) -> list[str]:
    from benchmarks.transformer import (SIZES, make_inputs, torch_transformer_programs,
                                        tracer_program)
    calls = {}
    for name, setting in (("tracer, OpenBLAS", "0"), ("tracer, own gemm", None)):
        if setting is None:
            os.environ.pop("TRACER_OWN_GEMM", None)
        else:
            os.environ["TRACER_OWN_GEMM"] = setting
        os.environ["TRACER_CACHE_DIR"] = tempfile.mkdtemp(prefix="own-gemm-")
        calls[name] = tracer_program(make_inputs(SIZES[GPT])).build()
        calls[name]()  # compiled and linked now, with this setting
    for program in torch_transformer_programs(make_inputs(SIZES[GPT])):
        if program.peer == "torch.compile":
            calls[program.peer] = program.build()
    for call in calls.values():
        for _ in range(3):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        order = list(calls)
        random.shuffle(order)
        for name in order:
            started = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - started)
    base = statistics.median(times["torch.compile"])
    return [f"{name}: median {1e3 * statistics.median(t):.1f} ms, fastest {1e3 * min(t):.1f} ms, "
            f"{statistics.median(t) / base:.3f}x torch.compile" for name, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="shapes", choices=("shapes", "peak", "step"))
    parser.add_argument("--rounds", type=int, default=30)
    arguments = parser.parse_args()
    if arguments.what == "shapes":
        print("\n".join(shapes(arguments.rounds)))
    elif arguments.what == "peak":
        print(peak())
    else:
        print("\n".join(step(arguments.rounds)))


if __name__ == "__main__":
    main()
