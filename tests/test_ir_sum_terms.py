"""Sums scaled by other sums split into the sums of their terms (ir/sum_terms.py): sum(a + k * b)
with k from another reduction becomes sum(a) + k * sum(b), added in float64, so that the terms'
sums need not wait for k. Checked on graphs (which sums remain, values against numpy float64)
and on layer norm's backward, whose row kernel then reads each row 4 times instead of 5."""
from __future__ import annotations

import numpy as np

from tracer import ir
from tracer.ir.types import TensorType
from tracer.runtime.pipeline import compile_graph

from test_ir_rows import (assert_close_to_torch, compiled, layer_norm_arrays, layer_norm_step,
                          torch_results)
from test_ir_loop_fusion import loops_per_depth

ROWS, COLUMNS = 6, 40


def row_graph(scaled: str) -> ir.Graph:
    """out = sum over each row of a + k * b (or of a + s * b, s an argument; or of a - k),
    k = sum(c) per row broadcast along it."""
    function = ir.Graph("rows")
    a, b, c = (function.add_parameter(name, TensorType((ROWS, COLUMNS), "f32"))
               for name in "abc")
    s = function.add_parameter("s", TensorType((ROWS, 1), "f32"))
    builder = ir.GraphBuilder(function)
    k = builder.broadcast_reduced(builder.reduce_sum(c, (1,)), (ROWS, COLUMNS), (1,))
    operand = {"by a sum": builder.add(a, builder.mul(k, b)),
               "by an argument": builder.add(a, builder.mul(s, b)),
               "by a sum alone": builder.sub(a, k)}[scaled]
    function.outputs = [builder.reduce_sum(operand, (1,))]
    return function


def sums(function: ir.Graph) -> list[str]:
    """What each sum of `function` adds up: the primitive making its operand."""
    return [i.inputs[0].producer.primitive if i.inputs[0].producer else i.inputs[0].name
            for i in function.instructions if i.primitive == "reduce_sum"]


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((ROWS, COLUMNS)).astype(np.float32) for _ in range(3)] + [
        rng.standard_normal((ROWS, 1)).astype(np.float32)]


def test_a_sum_scaled_by_a_sum_is_split_and_adds_in_float64():
    a, b, c, s = arrays()
    optimized = ir.optimize(row_graph("by a sum"))
    # the sums of c, of a and of b (each a cast to float64), none of an expression holding k
    assert sums(optimized) == ["c", "cast", "cast"]
    wide = [x.astype(np.float64) for x in (a, b, c)]
    k = c.sum(axis=1, dtype=np.float64).astype(np.float32).astype(np.float64)
    exact = wide[0].sum(axis=1) + k * wide[1].sum(axis=1)
    (actual,) = compile_graph(optimized)([a, b, c, s])
    np.testing.assert_allclose(actual, exact, rtol=2e-7, atol=1e-6)


def test_a_cancelling_sum_is_as_accurate_as_before():
    """a = -k * b + tiny: the terms' sums cancel, and their float64 sum keeps the tiny part
    (unsplit, float32 rounds each a + k * b before summing)."""
    _, b, c, s = arrays(1)
    k = c.sum(axis=1, dtype=np.float64).astype(np.float32)[:, None]
    a = (-(k * b) + np.float32(1e-3)).astype(np.float32)
    exact = (a.astype(np.float64) + k.astype(np.float64) * b).sum(axis=1)
    (actual,) = compile_graph(ir.optimize(row_graph("by a sum")))([a, b, c, s])
    (unsplit,) = compile_graph(row_graph("by a sum"))([a, b, c, s])
    assert np.all(np.abs(actual - exact) <= np.abs(unsplit - exact) + 1e-6)


def test_sums_scaled_by_an_argument_or_of_a_factor_alone_stay_whole():
    # k * b with k an argument: the sum can run as early as it is; a - k would become sum(a) -
    # n * k, which cancels
    assert sums(ir.optimize(row_graph("by an argument"))) == ["add"]
    assert sums(ir.optimize(row_graph("by a sum alone"))) == ["c", "sub"]


def test_layer_norms_backward_reads_each_row_four_times():
    x = layer_norm_arrays((37, 24), np.float32)
    function = compiled(layer_norm_step, x)
    # the chunk's zero fills; per row the mean, the variance, one loop for the output, the
    # weight's and bias's sums and the three row sums of the backward, one for the gradient
    assert loops_per_depth(function.loops) == [1, 2, 4]
    assert_close_to_torch(function(x), torch_results(layer_norm_step, x), np.float32)
