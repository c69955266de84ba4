"""The project's own float32 gemm (codegen/templates/sgemm.ll.j2, runtime/own_gemm.py): its results
against a float64 reference within the error bound of its sums, on every x86-64 host (LLVM
compiles its <16 x float> vectors for whatever the CPU has); blocks of rows or columns computed
by separate calls give the bits of one call; which products call it and on which CPUs."""
from __future__ import annotations

import ctypes
import math
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from tracer import ir
from tracer.codegen.gemm_symbols import GEMM_SYMBOLS, LARGE_SGEMM, gemm_symbol
from tracer.ir.loops import Gemm
from tracer.ir.schedule_threads import LARGE_SGEMM_VECTOR, LARGE_SGEMM_WORK, OWN_GEMM_PANEL
from tracer.ir.types import TensorType, float32, float64
from tracer.runtime import loader, native, own_gemm
from tracer.runtime.pipeline import compile_graph

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 kernel")
NO_TRANSPOSE, TRANSPOSE = 111, 112
UNIT_ROUNDOFF = 2.0 ** -24
L, F, P = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, L, L, L, F, P, L, P,
                             L, F, P, L)


@pytest.fixture(scope="module")
def gemm():
    """The own gemm as runtime/own_gemm.py makes it for AVX-512 hosts, on this host."""
    module = own_gemm.load_or_compile(native.host(), own_gemm.AVX512)
    yield SIGNATURE(module.address(own_gemm.FUNCTION))
    del module


def call(gemm, a, b, c, transpose_a, transpose_b, alpha=1.0, beta=0.0, rows=None, columns=None):
    """c[rows, columns] = alpha * op(a) @ op(b) + beta * c there, as cblas_sgemm takes it
    (row-major; a block of rows or columns is a pointer into the whole with its leading
    dimensions)."""
    m, n = c.shape
    rows, columns = rows or slice(0, m), columns or slice(0, n)
    k = a.shape[0] if transpose_a else a.shape[1]
    a_first = a.ctypes.data + 4 * rows.start * (1 if transpose_a else a.shape[1])
    b_first = b.ctypes.data + 4 * columns.start * (b.shape[1] if transpose_b else 1)
    c_first = c.ctypes.data + 4 * (rows.start * n + columns.start)
    gemm(101, TRANSPOSE if transpose_a else NO_TRANSPOSE,
         TRANSPOSE if transpose_b else NO_TRANSPOSE, rows.stop - rows.start,
         columns.stop - columns.start, k, alpha, a_first, a.shape[1], b_first, b.shape[1], beta,
         c_first, n)


def operands(rng, m, k, n, transpose_a, transpose_b):
    a = rng.standard_normal((k, m) if transpose_a else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n), dtype=np.float32)
    return a, b


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (16, 1, 96), (8, 384, 48), (37, 53, 41), (100, 1000, 150),
                                     (16, 5, 1000), (300, 33, 97), (9, 800, 49), (0, 5, 7),
                                     (5, 0, 7)])
@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (False, True),
                                                      (True, False), (True, True)])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25)])
def test_the_own_gemm_is_within_its_sums_error_bound_of_a_float64_reference(
        gemm, m, k, n, transpose_a, transpose_b, alpha, beta):
    """Every element: alpha times a sum of k products (fused multiply-adds in blocks of kc
    steps, each block's sum added to C) plus beta C; its error is at most (k + 2 blocks + 3) u
    times |alpha| |A||B| + |beta| |C| (one rounding per step, two per block, three to scale and
    add). Tiles at the bottom and right edges, k past one block (800, 1000), k = 0 (C = beta C),
    empty products."""
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = operands(rng, m, k, n, transpose_a, transpose_b)
    before = rng.standard_normal((m, n), dtype=np.float32)
    c = before.copy()
    call(gemm, a, b, c, transpose_a, transpose_b, alpha, beta)
    left = (a.T if transpose_a else a).astype(np.float64)
    right = (b.T if transpose_b else b).astype(np.float64)
    expected = alpha * (left @ right) + beta * before
    blocks = math.ceil(k / own_gemm.AVX512["kc"])
    bound = (k + 2 * blocks + 3) * UNIT_ROUNDOFF * (
        abs(alpha) * (np.abs(left) @ np.abs(right)) + abs(beta) * np.abs(before))
    assert np.all(np.abs(c - expected) <= bound)


def test_with_beta_zero_what_c_held_is_never_read(gemm):
    """cblas's contract: beta = 0 overwrites C, NaN and infinities included (0 * NaN is NaN)."""
    rng = np.random.default_rng(0)
    for k in (0, 7):  # with products, and without
        a, b = operands(rng, 20, k, 50, False, False)
        c = np.full((20, 50), np.nan, np.float32)
        c[::3] = np.inf
        call(gemm, a, b, c, False, False)
        assert np.all(np.isfinite(c))
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, True), (True, False)])
def test_blocks_of_rows_or_columns_give_the_bits_of_one_call(gemm, transpose_a, transpose_b):
    """Each element's sum runs in one order whatever rows and columns a call covers: blocks of any
    size (not only whole tiles), as threads compute them, give one call's bits, even added into
    C (beta 1) over a k of several blocks."""
    rng = np.random.default_rng(1)
    m, k, n = 203, 900, 170
    a, b = operands(rng, m, k, n, transpose_a, transpose_b)
    start = rng.standard_normal((m, n), dtype=np.float32)
    whole = start.copy()
    call(gemm, a, b, whole, transpose_a, transpose_b, 0.5, 1.0)
    for cuts in ([(slice(0, 7), None), (slice(7, 100), None), (slice(100, m), None)],
                 [(None, slice(0, 1)), (None, slice(1, 61)), (None, slice(61, n))],
                 [(slice(0, 48), slice(0, 96)), (slice(0, 48), slice(96, n)),
                  (slice(48, m), None)]):
        pieces = start.copy()
        for rows, columns in cuts:
            call(gemm, a, b, pieces, transpose_a, transpose_b, 0.5, 1.0, rows, columns)
        np.testing.assert_array_equal(pieces, whole)


def large_product(rows: int, k: int, n: int) -> ir.Graph:
    f = ir.Graph("large product")
    a = f.add_parameter("a", TensorType((rows, k), "f32"))
    w = f.add_parameter("w", TensorType((n, k), "f32"))
    builder = ir.GraphBuilder(f)
    f.outputs = [builder.op("matmul", a, builder.swap_last_axes(w))]
    return f


@pytest.mark.parametrize("rows, k, n", [(1000, 192, 96), (64, 1000, 100)])
def test_a_large_traced_product_calls_it_and_has_the_same_bits_on_any_threads(monkeypatch, rows,
                                                                                 k, n):
    """x @ w.T at 1000 x 192 x 96 (over LARGE_SGEMM_WORK, 96 columns: two whole panels) and at the
    seed step's 64 x 1000 x 100 (two panels and 4 columns) calls tracer_large_sgemm, which on an
    AVX-512 host is the own gemm (elsewhere OpenBLAS's); the pool's blocks (of columns for the own
    gemm, of rows for OpenBLAS) give the bits of one thread, on 1, 2 and 3."""
    if not native.blas_available():
        pytest.skip("no BLAS: products run as loops")
    rng = np.random.default_rng(4)
    arguments = [rng.standard_normal((rows, k), dtype=np.float32),
                 rng.standard_normal((n, k), dtype=np.float32)]
    results = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("TRACER_NUM_THREADS", threads)
        compiled = compile_graph(ir.optimize(large_product(rows, k, n)))
        (product,) = [s for s in compiled.kernels[0].body if isinstance(s, Gemm)]
        assert gemm_symbol(product) == LARGE_SGEMM
        assert f"call void @{LARGE_SGEMM}(" in compiled.llvm_ir
        results.append(compiled(arguments)[0])
    host = native.host()
    own = own_gemm.parameters(host.cpu, host.features) is not None
    registered = loader.registered_symbols()
    assert (registered[LARGE_SGEMM] != registered[GEMM_SYMBOLS[float32]]) == own
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])
    np.testing.assert_allclose(results[0], arguments[0].astype(np.float64) @ arguments[1].T,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n, dtype, expected", [
    (2048, 192, 768, float32, LARGE_SGEMM), (1024, 64, 64, float32, LARGE_SGEMM),
    (64, 1000, 100, float32, LARGE_SGEMM), (4096, 512, 10, float32, "tracer_sgemm"),
    (128, 32, 128, float32, "tracer_sgemm"), (512, 128, 128, float32, LARGE_SGEMM),
    (2048, 192, 768, float64, "tracer_dgemm")])
def test_which_products_call_the_large_gemm(m, k, n, dtype, expected):
    """Large float32 products whose columns fill vectors of 16 but for at most 1/8 (100 columns:
    7 vectors, 12 columns padding; 10 columns pad one vector by 6; 128 x 32 x 128, a GPT's
    attention, is under LARGE_SGEMM_WORK); never a float64 one."""
    product = Gemm("a", "b", "c", None, m, n, k, False, False, dtype)
    assert gemm_symbol(product) == expected
    assert (m * n * k >= LARGE_SGEMM_WORK) or expected != LARGE_SGEMM


def test_which_cpus_use_it(monkeypatch):
    """AVX-512 Intel hosts; not AVX2-only ones, where it measured no faster than OpenBLAS, nor
    AMD's (not measured), nor with TRACER_OWN_GEMM=0. Its tiles are the ones codegen's choice of
    products counts on."""
    assert own_gemm.AVX512["nr"] == OWN_GEMM_PANEL
    assert own_gemm.AVX512["width"] == LARGE_SGEMM_VECTOR
    monkeypatch.delenv("TRACER_OWN_GEMM", raising=False)
    assert own_gemm.parameters("sapphirerapids", "+avx2,+fma,+avx512f") == own_gemm.AVX512
    assert own_gemm.parameters("haswell", "+avx2,+fma,-avx512f") is None
    assert own_gemm.parameters("znver4", "+avx2,+fma,+avx512f") is None
    monkeypatch.setenv("TRACER_OWN_GEMM", "0")
    assert own_gemm.parameters("sapphirerapids", "+avx2,+fma,+avx512f") is None


def test_a_cold_compile_makes_the_own_gemm_with_the_programs_kernels(monkeypatch, tmp_path):
    """In a fresh process with an empty disk cache, the first program whose kernel calls
    tracer_large_sgemm compiles the own gemm among its kernels' jobs (own_gemm.compile_job), and
    registers it before linking; the next process loads it from the disk cache."""
    script = (
        "import numpy as np, tracer as tr\n"
        "from tracer.runtime import loader, native, own_gemm\n"
        "calls = []\n"
        "compile_job = own_gemm.compile_job\n"
        "own_gemm.compile_job = lambda: calls.append(compile_job()) or calls[-1]\n"
        "a = tr.from_numpy(np.ones((1000, 192), np.float32))\n"
        "w = tr.from_numpy(np.ones((96, 192), np.float32))\n"
        "assert (tr.trace(lambda a, w: a @ w.T)(a, w).numpy() == 192).all()\n"
        "host = native.host()\n"
        "own = own_gemm.parameters(host.cpu, host.features) is not None\n"
        "registered = loader.registered_symbols()\n"
        "print(len(calls), calls[0] is not None if calls else None, own,\n"
        "      registered['tracer_large_sgemm'] != registered['tracer_sgemm'])\n")
    environment = {**os.environ, "TRACER_CACHE_DIR": str(tmp_path)}
    environment.pop("TRACER_OWN_GEMM", None)
    first, second = (subprocess.run([sys.executable, "-c", script], env=environment,
                                    capture_output=True, text=True, check=True).stdout.split()
                     for _ in range(2))
    own = first[2] == "True"
    if not native.blas_available():
        pytest.skip("no BLAS: products run as loops")
    # cold: asked once, and it had a job to give where this host uses the own gemm
    assert first == ["1", str(own), str(own), str(own)]
    # warm: the program's object code and the own gemm's come from the disk cache
    assert second == ["0", "None", str(own), str(own)]
