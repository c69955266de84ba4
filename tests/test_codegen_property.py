"""Property test: random programs (elementwise chains, broadcasting, reductions over any axes,
transposes, slices, pads, reshapes, matmul) over random shapes including 0 and 1, compiled and
interpreted, on C-contiguous and non-contiguous inputs, agree; each is compiled twice, unchecked and
bounds-checked (TRACER_CHECK_BOUNDS=1), so the checks raise no false alarm on any of them. The loop
IR each was rendered from, run by its own interpreter (ir/loop_interpreter.py), agrees too."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer import ir
from tracer.ir.loop_interpreter import run_program
from tracer.ir.primitives import broadcast_shapes, ShapeError
from tracer.ir.types import TensorType
from tracer.runtime.pipeline import compile_graph

UNARY = ["neg", "abs", "tanh", "sin", "cos", "exp", "sign", "sqrt_abs"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "div_safe", "select_gt"]
STEPS = ["unary", "binary", "binary", "reduce", "transpose", "slice", "pad", "matmul", "broadcast",
         "reshape"]


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


dims = st.sampled_from([1, 2, 3, 4, 5, 0])
shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)


@st.composite
def programs(draw, dtype="f64"):
    function = ir.Graph("random")
    b = ir.GraphBuilder(function)
    values = [function.add_parameter(f"p{i}", TensorType(draw(shapes), dtype))
              for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(3, 16))):
        # mostly chain on recent values, so that programs are deep rather than dead code
        x = draw(st.sampled_from(values[-2:] if draw(st.integers(0, 3)) else values))
        step = draw(st.sampled_from(STEPS))
        shape = x.shape
        if step == "unary":
            name = draw(st.sampled_from(UNARY))
            if name == "sqrt_abs":
                result = b.op("sqrt", b.op("abs", x))
            elif name == "exp":
                result = b.op("exp", b.op("tanh", x))
            else:
                result = b.op(name, x)
        elif step == "binary":
            partners = [v for v in values if _broadcasts(v.shape, shape)]
            y = draw(st.sampled_from(partners))
            name = draw(st.sampled_from(BINARY))
            if name == "div_safe":
                result = b.div(x, b.add(b.op("abs", y), 1.0))
            elif name == "select_gt":
                result = b.select(b.gt(x, y), x, b.mul(y, 0.5))
            else:
                result = b.op(name, x, y)
        elif step == "reduce" and shape:
            axes = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1)))))
            empty = any(shape[a] == 0 for a in axes)
            primitive = "reduce_sum" if empty else draw(st.sampled_from(["reduce_sum",
                                                                         "reduce_max",
                                                                         "reduce_min"]))
            result = b.op(primitive, x, axes=axes)
        elif step == "transpose" and len(shape) > 1:
            result = b.op("transpose", x, permutation=draw(st.permutations(range(len(shape)))))
        elif step == "slice" and shape:
            starts, stops, steps = [], [], []
            for size in shape:
                start = draw(st.integers(0, size))
                starts.append(start)
                stops.append(draw(st.integers(start, size)))
                steps.append(draw(st.integers(1, 3)))
            result = b.op("slice", x, starts=starts, stops=stops, steps=steps)
        elif step == "pad" and shape:
            ranks = range(len(shape))
            result = b.op("pad", x, low=[draw(st.integers(0, 2)) for _ in ranks],
                          high=[draw(st.integers(0, 2)) for _ in ranks],
                          interior=[draw(st.integers(0, 1)) for _ in ranks])
        elif step == "matmul" and len(shape) >= 2:
            columns = draw(st.sampled_from([1, 2, 3, 0]))
            other = function.add_parameter(f"p{len(function.parameters)}", TensorType(
                (*shape[:-2], shape[-1], columns), dtype))
            operand = x
            if draw(st.booleans()):  # read a transposed operand
                operand = b.swap_last_axes(b.swap_last_axes(b.op("neg", x)))
            result = b.op("matmul", operand, other)
        elif step == "broadcast":
            result = b.op("broadcast", x, shape=(2, *[draw(st.sampled_from([d, 2])) if d == 1
                                                      else d for d in shape]))
        elif step == "reshape" and shape:
            result = b.op("reshape", x, shape=(int(np.prod(shape)),))
        else:
            continue
        values.append(result)
    count = draw(st.integers(1, min(3, len(values))))
    function.outputs = [values[-1]] + draw(st.lists(st.sampled_from(values), min_size=count - 1,
                                                    max_size=count - 1))
    return function


def _broadcasts(a, b) -> bool:
    try:
        broadcast_shapes(a, b)
        return True
    except ShapeError:
        return False


def non_contiguous(array: np.ndarray) -> np.ndarray:
    if array.ndim == 0:
        return array
    padded = np.zeros(tuple(2 * d for d in array.shape)[::-1], array.dtype).T
    view = padded[tuple(slice(0, None, 2) for _ in array.shape)]
    view[...] = array
    return view


def check(function: ir.Graph, seed: int) -> None:
    ir.verify(function)
    optimized = ir.optimize(function)
    ir.verify(optimized)
    rng = np.random.default_rng(seed)
    arguments = [rng.normal(size=p.shape).astype(p.dtype) for p in optimized.parameters]
    expected = ir.interpret(optimized, arguments)
    variants = (arguments, [non_contiguous(a) for a in arguments])
    for checked in ("0", "1"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRACER_CHECK_BOUNDS", checked)
            compiled = compile_graph(optimized)
        assert ("bounds-checked" in compiled.llvm_ir) == (checked == "1")
        for variant in variants:
            compare(compiled(variant), expected)
    # The loop IR, run without LLVM, agrees; cut into chunks as threads run it, bit for bit.
    whole = run_program(compiled.loops, arguments)
    compare(whole, expected)
    for a, b in zip(whole, run_program(compiled.loops, arguments, splits=3)):
        assert a.tobytes() == b.tobytes()


def compare(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        scale = 1.0 + float(np.max(np.abs(e), initial=0.0))
        # sums and BLAS add in their own orders
        np.testing.assert_allclose(a, e, rtol=1e-9, atol=1e-12 * scale)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2 ** 32 - 1))
def test_random_programs_match_the_interpreter(function, seed):
    check(function, seed)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2 ** 32 - 1))
def test_random_programs_match_the_interpreter_exhaustively(function, seed):
    check(function, seed)
