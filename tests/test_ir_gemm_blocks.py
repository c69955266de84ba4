"""How a product is cut into blocks that threads share (ir/schedule_threads.py gemm_blocks): blocks
of 48k rows, or of 48k columns for a single large product of few rows; every thread count gives
the bits one thread gives, in BLAS calls and in the fallback loops, with bounds checks; the loop
interpreter computes the same blocks; and products of one row or one column compile."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tracer import ir
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loops import Gemm
from tracer.ir.types import TensorType
from tracer.runtime import native
from tracer.runtime.pipeline import compile_graph


def test_a_large_product_is_split_into_blocks_of_rows_across_threads(monkeypatch):
    """One 64-row gemm becomes blocks of rows (48 + 16) that threads take; every block's rows are
    the product's (native and loop IR, whatever the chunks), as numpy computes them."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
    f = ir.Graph("product")
    a = f.add_parameter("a", TensorType((64, 40), "f32"))
    w = f.add_parameter("w", TensorType((40, 30), "f32"))
    f.outputs = [ir.GraphBuilder(f).op("matmul", a, w)]
    compiled = compile_graph(ir.optimize(f))
    (gemm,) = [s for s in compiled.kernels[0].body if isinstance(s, Gemm)]
    assert gemm.blocks > 1 and gemm.rows * (gemm.blocks - 1) < 64 <= gemm.rows * gemm.blocks
    assert compiled.kernels[0].threads == 2 and compiled.kernels[0].extent == gemm.blocks
    rng = np.random.default_rng(0)
    arguments = [rng.standard_normal((64, 40), np.float32),
                 rng.standard_normal((40, 30), np.float32)]
    expected = arguments[0].astype(np.float64) @ arguments[1]
    np.testing.assert_allclose(compiled(arguments)[0], expected, rtol=1e-5, atol=1e-5)
    for splits in (1, 3, gemm.blocks):
        (interpreted,) = run_program(compiled.loops, arguments, splits=splits)
        np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, threads, blocks", [(300, 2, 7), (97, 3, 1), (289, 3, 2)])
def test_a_product_split_across_threads_has_the_bits_of_one_call(monkeypatch, rows, threads,
                                                                   blocks):
    """Blocks of 48k rows give every element of a product the bits one BLAS call over all rows
    gives (ir/schedule_threads.py), so the result does not depend on TRACER_NUM_THREADS; never a
    last block of one row, which OpenBLAS computes as a gemv (97 rows are not cut as 48 + 48 + 1,
    289 rows on 3 threads as 192 + 97)."""
    rng = np.random.default_rng(2)
    arguments = [rng.standard_normal((rows, 33), np.float32),
                 rng.standard_normal((33, 65), np.float32)]
    results = []
    for count, expected_blocks in ((1, 1), (threads, blocks)):
        monkeypatch.setenv("TRACER_NUM_THREADS", str(count))
        monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
        f = ir.Graph("product")
        a = f.add_parameter("a", TensorType((rows, 33), "f32"))
        w = f.add_parameter("w", TensorType((33, 65), "f32"))
        f.outputs = [ir.GraphBuilder(f).op("matmul", a, w)]
        compiled = compile_graph(ir.optimize(f))
        (gemm,) = [s for s in compiled.kernels[0].body if isinstance(s, Gemm)]
        assert gemm.blocks == expected_blocks
        results.append(compiled(arguments)[0])
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], arguments[0].astype(np.float64) @ arguments[1],
                               rtol=1e-5, atol=1e-5)


def sgd_step_with_a_gradient(batch: tuple[int, ...]) -> ir.Graph:
    """w - 0.01 * (g + a^T @ d): an SGD step where .grad was already set (the seed step after its
    first call, which zeroes .grad): the product is added to an expression of w and g."""
    f = ir.Graph("step")
    shapes = {"w": (*batch, 300, 30), "g": (*batch, 300, 30), "a": (*batch, 40, 300),
              "d": (*batch, 40, 30)}
    w, g, a, d = (f.add_parameter(name, TensorType(shape, "f32")) for name, shape in shapes.items())
    b = ir.GraphBuilder(f)
    product = b.op("matmul", b.swap_last_axes(a), d)
    f.outputs = [b.sub(w, b.mul(b.add(g, product), 0.01))]
    return f


@pytest.mark.parametrize("batch, checked", [((), "0"), ((3,), "0"), ((2,), "1")])
def test_a_product_added_to_an_expression_runs_its_blocks_on_threads(monkeypatch, batch, checked):
    """Each task of the update first stores the rest (w - 0.01 g) on its own rows, then adds its
    block of the product, so threads split it as any product (the whole kernel ran on one thread
    before); every thread count gives one thread's bits, with bounds checks too, and the loop
    interpreter computes the same at any split. (Updates are fused into BLAS's gemm only.)"""
    if not native.blas_available():
        pytest.skip("no BLAS")
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", checked)
    rng = np.random.default_rng(4)
    arguments = [rng.standard_normal(p.shape, np.float32) for p in
                 sgd_step_with_a_gradient(batch).parameters]
    w, g, a, d = (x.astype(np.float64) for x in arguments)
    expected = w - 0.01 * (g + np.swapaxes(a, -1, -2) @ d)
    results = []
    for threads in (1, 2):
        monkeypatch.setenv("TRACER_NUM_THREADS", str(threads))
        compiled = compile_graph(ir.optimize(sgd_step_with_a_gradient(batch)))
        (kernel,) = compiled.kernels
        (gemm,) = [s for s in kernel.body if isinstance(s, Gemm)]
        assert gemm.accumulate and gemm.rows * (gemm.blocks - 1) < 300 <= gemm.rows * gemm.blocks
        assert (gemm.blocks > 1) == (threads > 1) and kernel.threads == threads
        assert kernel.extent == gemm.blocks * math.prod(batch)
        results.append(compiled(arguments)[0])
        for splits in (1, 3, kernel.extent):
            (interpreted,) = run_program(compiled.loops, arguments, splits=splits)
            np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[1], expected, rtol=1e-5, atol=1e-5)


def product_of_few_rows(rows: int, columns: int, dtype: str, transpose_b: bool) -> ir.Graph:
    f = ir.Graph("product")
    a = f.add_parameter("a", TensorType((rows, 33), dtype))
    b = ir.GraphBuilder(f)
    if transpose_b:
        w = f.add_parameter("w", TensorType((columns, 33), dtype))
        f.outputs = [b.op("matmul", a, b.op("transpose", w, permutation=(1, 0)))]
    else:
        w = f.add_parameter("w", TensorType((33, columns), dtype))
        f.outputs = [b.op("matmul", a, w)]
    return f


@pytest.mark.parametrize("dtype, blas, transpose_b, columns, blocks", [
    ("f32", True, False, 150, 4), ("f32", True, True, 145, 2), ("f32", False, False, 150, 4),
    ("f64", True, True, 150, 4), ("f64", False, True, 100, 3), ("i64", False, False, 100, 3)])
def test_a_large_product_of_few_rows_is_cut_into_blocks_of_columns_whatever_the_threads(
        monkeypatch, dtype, blas, transpose_b, columns, blocks):
    """A product of few rows and much work (COLUMN_SPLIT_WORK, lowered here) is cut into blocks
    of 48k columns (never a last one of one column: 145 as 96 + 49), the same on one thread as on
    several (OpenBLAS rounds a column by where its block starts), so every thread count gives the
    same bits; with BLAS and in the fallback loops, read straight or transposed, with bounds
    checks too; the loop interpreter computes the same blocks."""
    if blas and not native.blas_available():
        pytest.skip("no BLAS")
    monkeypatch.setattr(native, "blas_available", lambda: blas)
    monkeypatch.setattr("tracer.ir.schedule_threads.COLUMN_SPLIT_WORK", 1)
    rng = np.random.default_rng(3)
    numpy_type = {"f32": np.float32, "f64": np.float64, "i64": np.int64}[dtype]
    w_shape = (columns, 33) if transpose_b else (33, columns)
    arguments = [(rng.standard_normal((20, 33)) * 4).astype(numpy_type),
                 (rng.standard_normal(w_shape) * 4).astype(numpy_type)]
    w = arguments[1].T if transpose_b else arguments[1]
    expected = arguments[0].astype(np.float64) @ w.astype(np.float64)
    results = []
    for threads, checked in (("1", "0"), ("2", "0"), ("3", "1")):
        monkeypatch.setenv("TRACER_NUM_THREADS", threads)
        monkeypatch.setenv("TRACER_CHECK_BOUNDS", checked)
        compiled = compile_graph(ir.optimize(product_of_few_rows(20, columns, dtype, transpose_b)))
        (gemm,) = [s for s in compiled.kernels[0].body if isinstance(s, Gemm)]
        assert (gemm.blocks, gemm.rows) == (blocks, 20)
        assert gemm.columns * (blocks - 1) < columns <= gemm.columns * blocks
        assert gemm.columns % 48 == 0 and columns % gemm.columns != 1
        results.append(compiled(arguments)[0])
        for splits in (1, 2, blocks):
            (interpreted,) = run_program(compiled.loops, arguments, splits=splits)
            np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-4)
    for result in results:
        np.testing.assert_array_equal(result, results[0])
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m, k, n, threads", [(100, 40, 1, "1"), (100, 40, 1, "2"),
                                              (1, 1024, 1024, "2"), (1, 40, 1, "3")])
def test_products_of_one_row_or_one_column_compile_on_any_threads(monkeypatch, m, k, n, threads):
    """An extent of 1 is one block: finding a block length that leaves no last block of one row
    looked forever for a 1-row product on two threads (a batch of one through a 1024 x 1024
    Linear never compiled), and for a 1-column one cut into blocks of columns."""
    monkeypatch.setenv("TRACER_NUM_THREADS", threads)
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
    monkeypatch.setattr("tracer.ir.schedule_threads.COLUMN_SPLIT_WORK", 1)
    rng = np.random.default_rng(5)
    arguments = [rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)]
    f = ir.Graph("product")
    a = f.add_parameter("a", TensorType((m, k), "f32"))
    w = f.add_parameter("w", TensorType((k, n), "f32"))
    f.outputs = [ir.GraphBuilder(f).op("matmul", a, w)]
    compiled = compile_graph(ir.optimize(f))
    np.testing.assert_allclose(compiled(arguments)[0],
                               arguments[0].astype(np.float64) @ arguments[1], rtol=1e-4,
                               atol=1e-3)


def matmul_kernel_of(m: int, k: int, n: int, transpose_a: bool):
    """The fused matmul kernel of a @ w (a stored transposed when `transpose_a`), float32."""
    from tracer.ir.fusion import fuse
    f = ir.Graph("product")
    a = f.add_parameter("a", TensorType((k, m) if transpose_a else (m, k), "f32"))
    w = f.add_parameter("w", TensorType((k, n), "f32"))
    builder = ir.GraphBuilder(f)
    f.outputs = [builder.op("matmul", builder.swap_last_axes(a) if transpose_a else a, w)]
    (kernel,) = [k for k in fuse(ir.optimize(f)).kernels if k.kind == "matmul"]
    return kernel


@pytest.mark.parametrize("m, k, n, threads, expected", [
    (64, 1000, 100, 2, (3, 64, 48)),      # the seed step's: 48 + 48 + 4 columns, not 48 + 16 rows
    (256, 784, 512, 2, (6, 256, 96)),     # the MLP's: about two blocks of whole panels a thread
    (2048, 192, 576, 2, (4, 2048, 144)),  # a GPT's qkv product
    (64, 1000, 100, 1, (1, 64, 100)),     # one thread: one call
    (20, 33, 150, 2, (1, 20, 150))])      # not a large product: OpenBLAS's rules (too little work)
def test_the_own_gemm_cuts_a_product_it_reads_in_place_into_blocks_of_panels(m, k, n, threads,
                                                                              expected):
    """Where large float32 products call the own gemm, whose bits do not depend on the blocks, a
    product whose A it reads as stored is cut into blocks of whole 48-column panels, each packing
    only its own columns of B; a transposed A (a weight's gradient, X^T @ G) keeps blocks of rows,
    and so does every product where OpenBLAS is the large gemm."""
    from tracer.ir.schedule_threads import gemm_blocks
    assert gemm_blocks(matmul_kernel_of(m, k, n, False), threads, own_gemm=True) == expected
    assert gemm_blocks(matmul_kernel_of(m, k, n, False), threads)[2] == n  # rows, OpenBLAS's
    blocks, rows, columns = gemm_blocks(matmul_kernel_of(m, k, n, True), threads, own_gemm=True)
    assert columns == n and (blocks == 1 or rows % 48 == 0)
