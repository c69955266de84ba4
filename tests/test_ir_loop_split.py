"""ir/loop_split.py: an innermost loop that divides its counter by a constant becomes a loop over
the quotients around a unit-stride loop over the remainders, with the same results (PyTorch's
gradient of attention's head split, the loop interpreter on loops it must leave alone)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loop_split import split_divided_loops
from tracer.ir.loops import (Buffer, IndexOp, Load, Loop, LoopKernel, LoopProgram, Store,
                             nested_statements)
from tracer.ir.memory import Location
from tracer.ir.graph import Value
from tracer.ir.types import TensorType

BATCH, TIME, HEADS, HEAD_SIZE = 2, 4, 3, 8
WIDTH = HEADS * HEAD_SIZE


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def heads_loss(x, weights, module):
    """Attention's split of q, k and v into heads, each weighted: its gradient with respect to x
    is the heads transposed back and concatenated, one kernel cut at the seams of q, k and v."""
    q, k, v = x.split(WIDTH, dim=2)
    total = 0
    for part, weight in zip((q, k, v), weights):
        heads = part.reshape(BATCH, TIME, HEADS, HEAD_SIZE).transpose(1, 2)
        total = total + (heads * weight).sum()
    return total


def test_the_head_merge_of_q_k_v_gradients_is_unit_stride_loops_and_matches_pytorch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, TIME, 3 * WIDTH))
    weights = [rng.standard_normal((BATCH, HEADS, TIME, HEAD_SIZE)) for _ in range(3)]
    traced = tr.trace(tr.grad(lambda x: heads_loss(x, [tr.tensor(w.astype(np.float32))
                                                        for w in weights], tr)))
    argument = tr.tensor(x.astype(np.float32), requires_grad=True)
    loops = traced.ir(argument, stage="loops")
    (kernel,) = [text for text in loops.split("\n  kernel_")
                 if f": f32[{BATCH},{TIME},{3 * WIDTH}] (output" in text]
    # each of q, k and v: HEADS rows of HEAD_SIZE contiguous floats, no division per element
    assert kernel.count(f".remainder in [0, {HEAD_SIZE})") == 3, kernel
    assert kernel.count(f".quotient in [0, {HEADS})") == 3, kernel
    assert " div " not in kernel and " rem " not in kernel, kernel
    reference = torch.tensor(x, requires_grad=True)
    heads_loss(reference, [torch.tensor(w) for w in weights], torch).backward()
    np.testing.assert_allclose(traced(argument).numpy(), reference.grad.numpy(), rtol=1e-6)


def divided_copy(begin: int, end: int, offset: int, divisor: int) -> LoopProgram:
    """out[i] = x[(i - offset) % divisor * 100 + (i - offset) // divisor] for i in [begin, end):
    a loop over a transposed piece of a row."""
    x = Value("x", TensorType((1000,), "f32"))
    out = Value("out", TensorType((1000,), "f32"))
    shifted = IndexOp("%s", "sub", ("%c", offset))
    body = [shifted, IndexOp("%q", "div", ("%s", divisor)), IndexOp("%r", "rem", ("%s", divisor)),
            IndexOp("%m", "mul", ("%r", 100)), IndexOp("%o", "add", ("%m", "%q")),
            Load("%v", "in0", "%o", x), Store("out0", "%c", "%v", out)]
    kernel = LoopKernel("copy", "loop", [Buffer("in0", x, Location("parameter", 0)),
                                         Buffer("out0", out, Location("output", 0))],
                        [Loop("%c", begin, end, body)], 1)
    return LoopProgram("copy", [x], [out], [Location("output", 0)], 0, [kernel])


@pytest.mark.parametrize("begin, end, offset, divisor, splits", [
    (24, 48, 24, 8, True),  # a piece of a concatenation
    (24, 48, 8, 8, True),  # its offset a multiple of the divisor before the piece
    (24, 48, 20, 8, False),  # quotients that change inside a row of the divisor
    (24, 44, 24, 8, False),  # a range not a whole number of rows
    (24, 48, 30, 8, False),  # positions below the offset (a padded element outside its operand)
])
def test_a_loop_is_split_only_where_quotient_and_remainder_are_its_counters(begin, end, offset,
                                                                          divisor, splits):
    program = split_divided_loops(divided_copy(begin, end, offset, divisor))
    (loop,) = program.kernels[0].body
    divisions = [s for s in nested_statements([loop])
                 if isinstance(s, IndexOp) and s.op in ("div", "rem")]
    assert (loop.end, isinstance(loop.body[-1], Loop)) == (
        ((end - begin) // divisor, True) if splits else (end, False))
    assert bool(divisions) != splits
    if begin < offset:  # (the unsigned offset wraps: a pad's select would discard the element)
        return
    x = np.arange(1000, dtype=np.float32) * 0.5
    (expected,) = run_program(divided_copy(begin, end, offset, divisor), [x])
    (result,) = run_program(program, [x])
    np.testing.assert_array_equal(result[begin:end], expected[begin:end])
    # (hand values: the piece's first element reads x[(begin - offset) // divisor])
    if splits:
        assert result[begin] == x[(begin - offset) // divisor]
