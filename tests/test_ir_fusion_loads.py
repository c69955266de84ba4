"""Fusion stores a shared value whose inline expression streams several stored tensors of its
size (ir/fusion.py, MAX_SHARED_LOADS): a residual stream summed from several blocks' outputs is
read by each layer norm from memory once, not summed again from every output in each reader.
Values against PyTorch; every compiled call is also checked against the reference interpreter
(tests/conftest.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import ir
from tracer.ir.fusion import MAX_SHARED_LOADS
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph

SHAPE = (64, 48)


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def normalized_residuals(*branches):
    """The sum of the branches, normalized over its rows twice (two layer norms without weights,
    as two blocks of a transformer read the same residual stream)."""
    stream = branches[0]
    for branch in branches[1:]:
        stream = stream + branch
    first = (stream - stream.mean(-1, keepdim=True)) / (stream.var(-1, keepdim=True) + 1e-5).sqrt()
    second = stream / (stream.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    return first, second


def arrays(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(count)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def stored_intermediates(function: CompiledFunction) -> int:
    """The values of the tensors' shape that kernels store and that are not outputs."""
    outputs = {id(v) for v in function.fused.function.outputs}
    return sum(v.shape == SHAPE and id(v) not in outputs
               for kernel in function.fused.kernels for v in kernel.results)


def kernels_reading(function: CompiledFunction, parameter) -> int:
    return sum(any(v is parameter for v in kernel.inputs) for kernel in function.fused.kernels)


@pytest.mark.parametrize("count", [MAX_SHARED_LOADS - 1, MAX_SHARED_LOADS, 6])
def test_a_shared_sum_of_many_stored_tensors_is_stored_once(count):
    def step(*branches):
        return normalized_residuals(*branches)

    inputs = arrays(count)
    tensors = [tr.tensor(a) for a in inputs]
    text = tr.trace(step).ir(*tensors, stage="optimized")
    function = compile_graph(ir.parse_function(text))
    if count >= MAX_SHARED_LOADS:  # summed once, by the kernel that stores the stream
        assert stored_intermediates(function) == 1
        assert [kernels_reading(function, p) for p in function.fused.function.parameters] == [
            1] * count
    else:  # fewer tensors are cheaper to read again than the stored sum
        assert stored_intermediates(function) == 0
    expected = [t.numpy() for t in normalized_residuals(*map(torch.from_numpy, inputs))]
    for result, wanted in zip(tr.trace(step)(*tensors), expected):
        np.testing.assert_allclose(result.numpy(), wanted, rtol=1e-4, atol=1e-5)
