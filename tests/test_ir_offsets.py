"""Constant offsets moved out of kernels into their buffers' pointers (ir/offsets.py): the
kernels of an unrolled recurrent network's steps, which differed only in the time step's offset,
become one compiled module, with the values and gradients PyTorch gives."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tracer as tr
from tracer.ir.graph import Value
from tracer.ir.loops import Buffer, IndexOp, Load, Loop, LoopKernel, Store, nested_statements
from tracer.ir.memory import Location
from tracer.ir.offsets import shift_constant_offsets
from tracer.ir.types import TensorType, float32

torch = pytest.importorskip("torch")

def lstm_step(library, steps: int):
    """A traced (tracer) or eager (torch) training step of a one-layer LSTM over `steps` time
    steps, from the same weights: the gradients of its weights, and the LLVM text."""
    rng = np.random.default_rng(steps)
    x = rng.standard_normal((steps, 2, 3))
    lstm = library.nn.LSTM(3, 4, dtype=library.float64)
    with library.no_grad():
        for parameter in lstm.parameters():
            parameter.copy_(library.tensor(rng.standard_normal(tuple(parameter.shape)) * 0.5))

    def step(x):
        out, _ = lstm(x)
        (out * out).sum().backward()

    traced = tr.trace(step) if library is tr else step
    traced(library.tensor(x))
    llvm = traced.ir(library.tensor(x), stage="llvm") if library is tr else ""
    return [p.grad.numpy() for p in lstm.parameters()], llvm


def test_an_unrolled_lstm_compiles_as_many_kernels_whatever_its_length_with_torchs_gradients():
    modules = []
    for steps in (3, 6):
        ours, llvm = lstm_step(tr, steps)
        for mine, reference in zip(ours, lstm_step(torch, steps)[0]):
            np.testing.assert_allclose(mine, reference, rtol=1e-11, atol=1e-12)
        calls = re.findall(r"call void @(tracer_kernel_\w+)", llvm)
        modules.append((len(calls), len(set(calls))))
    (calls_3, distinct_3), (calls_6, distinct_6) = modules
    # the steps' kernels differed in the time step's offset alone: now one module each (a
    # kernel over all the steps' outputs is one more of another shape)
    assert calls_6 >= calls_3 + 3 * 4 and distinct_6 <= distinct_3 + 1, modules


def _kernel(buffer_accesses: list[list], extra: list | None = None) -> LoopKernel:
    """A loop kernel over %i in [0, 4) whose buffer k is loaded at each offset of
    buffer_accesses[k] (operands, after the IndexOps `extra` defines)."""
    buffers = [Buffer(f"in{k}", Value(f"x{k}", TensorType((128,), float32)),
                      Location("parameter", k)) for k in range(len(buffer_accesses))]
    result = Value("y", TensorType((4,), float32))
    buffers.append(Buffer("out0", result, Location("output", 0)))
    body = list(extra or [])
    for k, offsets in enumerate(buffer_accesses):
        body += [Load(f"%v{k}{n}", f"in{k}", offset, buffers[k].value)
                 for n, offset in enumerate(offsets)]
    body.append(Store("out0", "%i", "%v00", result))
    return LoopKernel("kernel_0", "loop", buffers, [Loop("%i", 0, 4, body)], extent=1)


def test_the_least_constant_of_every_access_moves_into_the_buffers_shift():
    kernel = _kernel([["%a", "%b", 100]],
                     [IndexOp("%a", "add", (96, "%i")), IndexOp("%m", "mul", ("%i", 2)),
                      IndexOp("%b", "add", ("%m", 98))])
    shifted = shift_constant_offsets(kernel)
    assert shifted.buffers[0].shift == 96
    loads = [s for s in nested_statements(shifted.body) if isinstance(s, Load)]
    operations = {s.target: (s.op, s.operands) for s in nested_statements(shifted.body)
                  if isinstance(s, IndexOp)}
    assert loads[0].offset == "%i"  # 96 + i - 96
    assert operations[loads[1].offset] == ("add", (2, "%s0"))  # 2 i + 98 - 96
    assert operations["%s0"] == ("mul", ("%i", 2))
    assert loads[2].offset == 4  # 100 - 96
    assert "%a" not in operations and "%b" not in operations  # the old offsets, unused, removed


@pytest.mark.parametrize("offsets, extra", [
    (["%i", "%a"], [IndexOp("%a", "add", (8, "%i"))]),  # one access at 0 + i: nothing to move
    (["%a"], [IndexOp("%a", "sub", (20, "%i"))]),  # 20 - i: a term that can be negative
    (["%a"], [IndexOp("%a", "select", (True, 8, 9))]),  # not a linear form
])
def test_a_buffer_keeps_its_pointer_where_an_offset_is_not_a_positive_constant_and_more(
        offsets, extra):
    assert shift_constant_offsets(_kernel([offsets], extra)).buffers[0].shift == 0
