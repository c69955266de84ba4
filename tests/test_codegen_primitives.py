"""Every primitive, compiled, against the interpreter (the numpy reference semantics).

Tolerances: float64 results match to 4 ulp (exact ops are exact; the transcendentals are within
the bounds of codegen/templates/math.ll.j2); float32 results to 4 ulp (numpy's own float32 exp/log/
tanh/sin/cos are up to ~3 ulp off; ours are within 2 ulp of the correctly rounded value: see
test_codegen_math.py); integers and bools exactly. Sums are compared relative to the sum of
magnitudes, since any summation order is as good as numpy's pairwise one.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tracer as tr
from tracer import ir
from tracer.codegen.lowering import LOWERING
from tracer.ir.loop_interpreter import run_program
from tracer.ir import primitives
from tracer.ir.primitives import GRADIENT_MARKERS, PRIMITIVES
from tracer.ir.types import TensorType
from tracer.runtime.pipeline import compile_function, compile_graph

RNG = np.random.default_rng(0)
FLOATS = ("f32", "f64")


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def random_array(shape, dtype, low=-3.0, high=3.0) -> np.ndarray:
    dtype = ir.types.as_dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if dtype == np.int64:
        return RNG.integers(-5, 6, size=shape)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def layouts(array: np.ndarray) -> list[np.ndarray]:
    """The same values as C-contiguous, Fortran-ordered and strided/offset views."""
    views = [array, np.asfortranarray(array)]
    if array.ndim:
        padded = np.zeros(tuple(2 * d + 1 for d in array.shape), array.dtype)
        view = padded[tuple(slice(1, None, 2) for _ in array.shape)]
        view[...] = array
        views.append(view)
    return views


def assert_matches(actual: np.ndarray, expected: np.ndarray, ulps: float = 4) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        eps = np.finfo(expected.dtype).eps
        tiny = np.finfo(expected.dtype).tiny
        np.testing.assert_allclose(actual, expected, rtol=ulps * eps, atol=ulps * tiny,
                                   equal_nan=True)
        # infinities and nans in the same places with the same signs
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    else:
        np.testing.assert_array_equal(actual, expected)


def run_both(function: ir.Graph, arguments, ulps: float = 4, layouts_too: bool = True):
    function = ir.optimize(function)
    ir.verify(function)
    compiled = compile_graph(function)
    expected = ir.interpret(function, arguments)
    variants = [arguments]
    if layouts_too:
        variants += [list(v) for v in zip(*(layouts(a)[1:] for a in arguments))] if all(
            a.ndim for a in arguments) and arguments else []
    for variant in variants:
        actual = compiled(variant)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_matches(a, e, ulps)
    # the loop IR the code was rendered from, run without LLVM, computes the same
    for a, e in zip(run_program(compiled.loops, arguments), expected):
        assert_matches(a, e, ulps)
    return compiled


def single(primitive: str, in_types: list[TensorType], **attributes) -> ir.Graph:
    function = ir.Graph(primitive)
    parameters = [function.add_parameter(f"x{i}", t) for i, t in enumerate(in_types)]
    builder = ir.GraphBuilder(function)
    function.outputs = [builder.op(primitive, *parameters, **attributes)]
    return function


def test_lowering_table_covers_every_primitive():
    assert set(LOWERING) == PRIMITIVES
    for marker in GRADIENT_MARKERS:
        assert LOWERING[marker].kind == "removed"


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("primitive", sorted(primitives.UNARY - {"logical_not"}))
@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (3, 4), (2, 1, 3)])
def test_unary_float(primitive, dtype, shape):
    x = random_array(shape, dtype)
    if primitive in ("log", "sqrt"):
        x = np.abs(x)
    run_both(single(primitive, [TensorType(shape, dtype)]), [x])


@pytest.mark.parametrize("primitive", ["neg", "abs", "sign"])
def test_unary_int(primitive):
    run_both(single(primitive, [TensorType((4, 5), "i64")]), [random_array((4, 5), "i64")])


def test_logical_not():
    run_both(single("logical_not", [TensorType((7,), "bool")]), [random_array((7,), "bool")])


BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)), ((2, 0), (1,)),
              ((1,), (1,)), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i64"])
@pytest.mark.parametrize("primitive", ["add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                       "fmod"])
def test_binary_arithmetic(primitive, dtype, shapes):
    if primitive in ("div", "fmod") and dtype == "i64":  # the tracer casts to float first
        with pytest.raises(ir.ShapeError, match=f"{primitive} needs float operands"):
            single(primitive, [TensorType(s, dtype) for s in shapes])
        return
    x, y = (random_array(s, dtype) for s in shapes)
    if primitive == "pow":
        x = np.abs(x) + (1 if dtype == "i64" else 0)
        y = np.abs(y)
    function = single(primitive, [TensorType(s, dtype) for s in shapes])
    # pow is exp(y log x): its float64 error grows with |y log x| (<= 5 here).
    run_both(function, [x, y], ulps=16 if primitive == "pow" else 4)


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64", "bool"])
@pytest.mark.parametrize("primitive", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_compare(primitive, dtype):
    x, y = random_array((4, 3), dtype), random_array((3,), dtype)
    if dtype.startswith("f"):
        x[0, 0], y[1] = np.nan, np.nan
        x[2] = y  # ties
    run_both(single(primitive, [TensorType((4, 3), dtype), TensorType((3,), dtype)]), [x, y])


@pytest.mark.parametrize("primitive", ["logical_and", "logical_or"])
def test_logical(primitive):
    run_both(single(primitive, [TensorType((2, 5), "bool"), TensorType((5,), "bool")]),
             [random_array((2, 5), "bool"), random_array((5,), "bool")])


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64", "bool"])
def test_select(dtype):
    types = [TensorType((3, 4), "bool"), TensorType((4,), dtype), TensorType((3, 1), dtype)]
    run_both(single("select", types), [random_array(t.shape, t.dtype) for t in types])


@pytest.mark.parametrize("source, target", list(itertools.product(["f32", "f64", "i64", "bool"],
                                                                  repeat=2)))
def test_cast(source, target):
    x = random_array((3, 5), source)
    if source.startswith("f"):
        x = x * 10
        x[0, :3] = [0.0, -0.0, 0.5]
        if target != "i64":  # numpy's nan/inf -> int64 is platform-defined
            x[1, :2] = [np.nan, np.inf]
    run_both(single("cast", [TensorType((3, 5), source)], dtype=ir.types.as_dtype(target)), [x])


POW_BASES = [-2 ** 63, -3, -2, -1, 0, 1, 2, 3, 2 ** 62, 2 ** 63 - 1]
# torch.tensor(POW_BASES) ** torch.full((10,), exponent) (PyTorch 2.x): negative exponents give 0
# except for bases 1 and -1; positive ones wrap mod 2**64, as numpy's power does.
POW_TORCH = {
    -3: [0, 0, 0, -1, 0, 1, 0, 0, 0, 0],
    -2: [0, 0, 0, 1, 0, 1, 0, 0, 0, 0],
    -1: [0, 0, 0, -1, 0, 1, 0, 0, 0, 0],
    -2 ** 63: [0, 0, 0, 1, 0, 1, 0, 0, 0, 0],
    0: [1] * 10,
    2: [0, 9, 4, 1, 0, 1, 4, 9, 0, 1],
    63: [0, 3237885987332494933, -2 ** 63, -1, 0, 1, -2 ** 63, -3237885987332494933, 0,
         2 ** 63 - 1],
    64: [0, 8733086111712066817, 0, 1, 0, 1, 0, 8733086111712066817, 0, 1],
}


@pytest.mark.parametrize("exponent", sorted(POW_TORCH))
def test_int64_pow_matches_pytorch(exponent):
    x = np.array(POW_BASES)
    y = np.full_like(x, exponent)
    expected = np.array(POW_TORCH[exponent])
    function = ir.optimize(single("pow", [TensorType(x.shape, "i64")] * 2))
    (interpreted,) = ir.interpret(function, [x, y])
    np.testing.assert_array_equal(interpreted, expected)
    np.testing.assert_array_equal(compile_graph(function)([x, y])[0], expected)
    # a constant exponent (the lowering has special cases for some) and a broadcast one
    f = ir.Graph("pow_constant")
    p = f.add_parameter("x", TensorType(x.shape, "i64"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.pow(p, exponent), b.pow(p, b.full((1,), exponent, "i64"))]
    function = ir.optimize(f)
    for result in (*ir.interpret(function, [x]), *compile_graph(function)([x])):
        np.testing.assert_array_equal(result, expected)


def test_int64_pow_negative_exponents_mixed_with_positive():
    # one array of exponents of both signs, broadcast against the bases; 0-d operands too
    x = np.arange(-4, 5).reshape(9, 1)
    y = np.arange(-5, 6).reshape(1, 11)
    function = ir.optimize(single("pow", [TensorType(x.shape, "i64"), TensorType(y.shape, "i64")]))
    (interpreted,) = ir.interpret(function, [x, y])
    for i, base in enumerate(range(-4, 5)):
        for j, exponent in enumerate(range(-5, 6)):
            if exponent >= 0:
                expected = base ** exponent
            else:
                expected = 1 if base == 1 else (-1) ** exponent if base == -1 else 0
            assert interpreted[i, j] == expected, (base, exponent)
    run_both(function, [x, y])
    scalar = ir.optimize(single("pow", [TensorType((), "i64")] * 2))
    for base, exponent, expected in [(2, -1, 0), (-1, -3, -1), (-1, -4, 1), (0, -2, 0), (5, 0, 1)]:
        arguments = [np.array(base), np.array(exponent)]
        assert ir.interpret(scalar, arguments)[0] == expected
        assert compile_graph(scalar)(arguments)[0] == expected
    # folded at compile time through the same reference
    f = ir.Graph("folded")
    p = f.add_parameter("x", TensorType((), "i64"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.add(p, b.pow(b.constant(-1, "i64"), b.constant(-3, "i64")))]
    function = ir.optimize(f)
    assert all(i.primitive != "pow" for i in function.instructions)
    assert compile_graph(function)([np.array(10)])[0] == 9


SIGN_CASES = [np.nan, -np.nan, -0.0, 0.0, -2.0, 3.5, np.inf, -np.inf, 1e-45, -1e-300, 5e-324]
# torch.sign of SIGN_CASES in float32 and float64 (PyTorch 2.x): nan -> 0, -0.0 -> +0.0; in
# float32 -1e-300 and 5e-324 round to zero
SIGN_TORCH = {"f32": [0.0, 0.0, 0.0, 0.0, -1.0, 1.0, 1.0, -1.0, 1.0, 0.0, 0.0],
              "f64": [0.0, 0.0, 0.0, 0.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]}


@pytest.mark.parametrize("dtype", FLOATS)
def test_sign_matches_pytorch_bit_for_bit(dtype):
    expected = np.array(SIGN_TORCH[dtype], ir.types.as_dtype(dtype))
    dtype = ir.types.as_dtype(dtype)
    x = np.array(SIGN_CASES, dtype)  # every zero is +0.0
    function = ir.optimize(single("sign", [TensorType(x.shape, dtype)]))
    (interpreted,) = ir.interpret(function, [x])
    (compiled,) = compile_graph(function)([x])
    assert interpreted.tobytes() == expected.tobytes()
    assert compiled.tobytes() == expected.tobytes()


def test_recorded_pytorch_values_match_pytorch():
    """The expectations above were recorded from PyTorch; re-derive them where it is installed
    (benchmark set-ups have it; `make test` does not install it)."""
    torch = pytest.importorskip("torch")
    for exponent, expected in POW_TORCH.items():
        x = torch.tensor(POW_BASES)
        np.testing.assert_array_equal((x ** torch.full_like(x, exponent)).numpy(), expected)
    for dtype, expected in SIGN_TORCH.items():
        x = torch.from_numpy(np.array(SIGN_CASES, ir.types.as_dtype(dtype)))
        assert torch.sign(x).numpy().tobytes() == np.array(
            expected, ir.types.as_dtype(dtype)).tobytes()


def test_sign_int64_extremes():
    x = np.array([-2 ** 63, -5, -1, 0, 1, 7, 2 ** 63 - 1])
    function = ir.optimize(single("sign", [TensorType(x.shape, "i64")]))
    for result in (ir.interpret(function, [x])[0], compile_graph(function)([x])[0]):
        np.testing.assert_array_equal(result, [-1, -1, -1, 0, 1, 1, 1])


def test_nan_semantics():
    f = ir.Graph("nan")
    x = f.add_parameter("x", TensorType((6,), "f64"))
    y = f.add_parameter("y", TensorType((6,), "f64"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.op("maximum", x, y), b.op("minimum", x, y), b.op("sign", x),
                 b.op("reduce_max", x, axes=(0,)), b.op("reduce_min", x, axes=(0,))]
    values = np.array([np.nan, 1.0, -np.inf, 0.0, np.inf, -2.0])
    run_both(f, [values, values[::-1].copy()])


# Layout -----------------------------------------------------------------------------------------

def layout_function(primitive, in_type: TensorType, compute: bool, **attributes) -> ir.Graph:
    """`primitive` applied to a parameter (a strided read) or to a computed value (inline)."""
    function = ir.Graph(primitive)
    x = function.add_parameter("x", in_type)
    b = ir.GraphBuilder(function)
    operand = b.op("sin", x) if compute else x
    result = b.op(primitive, operand, **attributes)
    function.outputs = [b.op("neg", result)]
    return function


LAYOUT_CASES = [
    ("broadcast", (3,), dict(shape=(2, 3))),
    ("broadcast", (3, 1), dict(shape=(2, 3, 4))),
    ("broadcast", (), dict(shape=(0, 2))),
    ("reshape", (3, 4), dict(shape=(4, 3))),
    ("reshape", (2, 3, 4), dict(shape=(6, 1, 4))),
    ("reshape", (6,), dict(shape=(1, 2, 1, 3))),
    ("reshape", (0, 3), dict(shape=(3, 0))),
    ("transpose", (2, 3, 4), dict(permutation=(2, 0, 1))),
    ("transpose", (3, 5), dict(permutation=(1, 0))),
    ("slice", (5, 6), dict(starts=(1, 0), stops=(4, 6), steps=(2, 3))),
    ("slice", (5,), dict(starts=(2,), stops=(2,), steps=(1,))),
    ("pad", (2, 3), dict(low=(1, 0), high=(0, 2), interior=(1, 2))),
    ("pad", (3,), dict(low=(2,), high=(1,), interior=(0,))),
    ("pad", (0, 2), dict(low=(1, 1), high=(1, 0), interior=(0, 0))),
]


@pytest.mark.parametrize("compute", [False, True])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c[0]}{c[1]}")
def test_layout(case, compute):
    primitive, shape, attributes = case
    function = layout_function(primitive, TensorType(shape, "f64"), compute, **attributes)
    run_both(function, [random_array(shape, "f64")])


def test_iota_and_constant():
    f = ir.Graph("sources")
    x = f.add_parameter("x", TensorType((3, 4), "f32"))
    b = ir.GraphBuilder(f)
    rows = b.op("iota", shape=(3, 4), dimension=0, dtype=np.float32)
    columns = b.op("iota", shape=(3, 4), dimension=1, dtype=np.int64)
    f.outputs = [b.add(b.mul(x, rows), 2.5), columns, b.constant(7, "i64"),
                 b.op("iota", shape=(3, 2), dimension=1, dtype=np.bool_)]
    run_both(f, [random_array((3, 4), "f32")])


# Reductions -------------------------------------------------------------------------------------

REDUCTIONS = [((5,), (0,)), ((3, 4), (0,)), ((3, 4), (1,)), ((3, 4), (0, 1)), ((2, 3, 4), (0, 2)),
              ((2, 3, 4), (1,)), ((2, 3, 4), (0, 1)), ((4, 1), (1,)), ((3, 0), (1,)), ((0, 3), (0,)),
              ((3, 4), ()), ((), ())]


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64"])
@pytest.mark.parametrize("primitive", ["reduce_sum", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("case", REDUCTIONS, ids=str)
def test_reduce(primitive, dtype, case):
    shape, axes = case
    if primitive != "reduce_sum" and any(shape[a] == 0 for a in axes):
        with pytest.raises(ir.ShapeError, match="empty dimension"):
            single(primitive, [TensorType(shape, dtype)], axes=axes)
        return
    function = single(primitive, [TensorType(shape, dtype)], axes=axes)
    run_both(function, [random_array(shape, dtype)])


@pytest.mark.parametrize("primitive", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)], ids=str)
def test_reduce_max_min_int64_extremes(primitive, axes):
    # INT64_MIN and INT64_MAX are ordinary values (the accumulators start at them), exactly.
    x = RNG.integers(-5, 6, size=(3, 4, 5))
    x[0, 1, 2], x[2, 3, 4], x[1, 0, 0] = -2 ** 63, 2 ** 63 - 1, -2 ** 63
    x[2, 2, :] = 2 ** 63 - 1  # a whole row of INT64_MAX: its min is INT64_MAX
    x[0, 0, :] = -2 ** 63  # and a row of INT64_MIN: its max is INT64_MIN
    run_both(single(primitive, [TensorType(x.shape, "i64")], axes=axes), [x])
    for reduction in (max, min):  # also inline, feeding an elementwise consumer
        f = ir.Graph("inline")
        p = f.add_parameter("x", TensorType(x.shape, "i64"))
        b = ir.GraphBuilder(f)
        r = b.op(primitive, p, axes=axes)
        f.outputs = [b.op("neg", b.op("maximum" if reduction is max else "minimum", r, r))]
        run_both(f, [x])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("primitive", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("axes", [(0,), (1,), (0, 1)], ids=str)
def test_reduce_max_min_nan_and_inf(primitive, dtype, axes):
    # as numpy: a nan anywhere in the reduced elements gives nan; +-inf are ordinary values
    x = random_array((6, 7), dtype)
    x[0, 3] = np.nan
    x[1, :] = np.inf
    x[2, :] = -np.inf
    x[3, 2], x[3, 5] = np.inf, -np.inf
    x[4, 6] = np.nan
    x[4, 0] = np.inf
    x[5, :] = np.nan
    run_both(single(primitive, [TensorType(x.shape, dtype)], axes=axes), [x])
    (expected,) = ir.interpret(ir.optimize(single(primitive, [TensorType(x.shape, dtype)],
                                                  axes=axes)), [x])
    np.testing.assert_array_equal(expected, (np.max if primitive == "reduce_max" else np.min)(
        x, axis=axes))


@pytest.mark.parametrize("dtype", FLOATS)
def test_large_sum_accuracy(dtype):
    # float32 sums accumulate in float64: at least as accurate as numpy's pairwise sum.
    x = random_array((3, 100_000), dtype, 0.0, 1.0)
    dtype = ir.types.as_dtype(dtype)
    function = single("reduce_sum", [TensorType(x.shape, dtype)], axes=(1,))
    (actual,) = compile_graph(ir.optimize(function))([x])
    exact = x.astype(np.float64).sum(axis=1)
    bound = 8 * np.finfo(dtype).eps * np.abs(x).astype(np.float64).sum(axis=1)
    assert np.all(np.abs(actual - exact) <= bound)


def test_reduction_feeding_elementwise_and_broadcast():
    # softmax: max and sum over the last axis read back at a broadcast index
    f = ir.Graph("softmax")
    x = f.add_parameter("x", TensorType((4, 7), "f64"))
    b = ir.GraphBuilder(f)
    m = b.op("reduce_max", x, axes=(1,))
    e = b.op("exp", b.sub(x, b.broadcast_reduced(m, (4, 7), (1,))))
    s = b.reduce_sum(e, (1,))
    f.outputs = [b.div(e, b.broadcast_reduced(s, (4, 7), (1,))), b.mul(s, 0.5)]
    run_both(f, [random_array((4, 7), "f64")])


# Matmul -----------------------------------------------------------------------------------------

MATMULS = [((3, 4), (4, 5)), ((1, 1), (1, 1)), ((2, 3, 4), (2, 4, 2)), ((3, 0), (0, 2)),
           ((0, 3), (3, 2)), ((4, 3), (3, 0)), ((8, 16), (16, 2))]


@pytest.mark.parametrize("dtype", ["f32", "f64", "i64"])
@pytest.mark.parametrize("shapes", MATMULS, ids=str)
def test_matmul(shapes, dtype):
    function = single("matmul", [TensorType(s, dtype) for s in shapes])
    x, y = (random_array(s, dtype) for s in shapes)
    # BLAS sums in its own order: compare relative to the magnitude of the terms
    run_both(function, [x, y], ulps=64)


@pytest.mark.parametrize("transpose", [(False, True), (True, False), (True, True)])
def test_matmul_of_transposed_operands(transpose):
    f = ir.Graph("mmt")
    a = f.add_parameter("a", TensorType((5, 3) if transpose[0] else (3, 5), "f64"))
    c = f.add_parameter("c", TensorType((4, 5) if transpose[1] else (5, 4), "f64"))
    b = ir.GraphBuilder(f)
    left = b.swap_last_axes(a) if transpose[0] else a
    right = b.swap_last_axes(c) if transpose[1] else c
    f.outputs = [b.op("matmul", left, right)]
    compiled = run_both(f, [random_array(a.shape, "f64"), random_array(c.shape, "f64")], ulps=64)
    fused = compiled.stage_text("fused")
    assert fused.count("kernel_") == 1  # the transposes are gemm flags, not kernels


def test_matmul_fallback_loop(monkeypatch):
    from tracer.codegen.render_kernel import render_kernel
    from tracer.ir.memory import plan_memory
    from tracer.ir.schedule import schedule
    f = single("matmul", [TensorType((3, 4), "f32"), TensorType((4, 5), "f32")])
    fused = ir.fusion.fuse(ir.optimize(f))
    (kernel,) = schedule(fused, plan_memory(fused)).kernels
    text = render_kernel(kernel, blas=False, sites=None, metadata=[])
    assert "tracer_sgemm" not in text and "fmul" in text


def test_gradient_markers_are_removed_before_codegen():
    f = ir.Graph("markers")
    x = f.add_parameter("x", TensorType((3,), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.op("exp", b.op("stop_gradient", x))]
    optimized = ir.optimize(f)
    assert all(i.primitive != "stop_gradient" for i in optimized.instructions)
    run_both(f, [random_array((3,), "f32")])


# Whole functions --------------------------------------------------------------------------------

def test_outputs_that_are_parameters_or_repeated():
    f = ir.Graph("passthrough")
    x = f.add_parameter("x", TensorType((2, 3), "f32"))
    b = ir.GraphBuilder(f)
    y = b.op("exp", x)
    f.outputs = [x, y, y, b.constant(1.5, "f64")]
    compiled = compile_graph(ir.optimize(f))
    value = random_array((2, 3), "f32")
    out = compiled([value])
    assert out[0] is not value and np.array_equal(out[0], value)
    assert out[1] is not out[2] and np.array_equal(out[1], out[2])
    assert out[3].shape == () and out[3] == 1.5


@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True)], ids=str)
@pytest.mark.parametrize("shapes", [((7, 1000), (1000, 300)), ((2, 5, 64), (2, 64, 3))], ids=str)
def test_float32_matmul_fallback_accumulates_in_float64(shapes, transpose, monkeypatch):
    """Without BLAS, float32 matmul sums in float64 and rounds each element once (the row is done
    in blocks of 256 columns, so n = 300 crosses a block): at least as accurate as numpy's sgemm,
    against the exact (float64) product."""
    import tracer.runtime.pipeline
    from tracer.runtime import native
    monkeypatch.setattr(native, "blas_available", lambda: False)
    a_shape, b_shape = shapes
    swap = lambda shape: (*shape[:-2], shape[-1], shape[-2])  # noqa: E731
    stored = [swap(s) if t else s for s, t in zip(shapes, transpose)]
    f = ir.Graph("mm")
    pa, pb = (f.add_parameter(n, TensorType(s, "f32")) for n, s in zip("ab", stored))
    b = ir.GraphBuilder(f)
    f.outputs = [b.op("matmul", *(b.swap_last_axes(p) if t else p
                                  for p, t in zip((pa, pb), transpose)))]
    function = ir.optimize(f)
    compiled = tracer.runtime.pipeline.compile_graph(function)
    assert "tracer_sgemm" not in compiled.llvm_ir
    rng = np.random.default_rng(11)  # not RNG: later tests' data stays as it was
    x, y = (rng.normal(0, 1, s).astype(np.float32) for s in stored)
    (actual,) = compiled([x, y])
    left, right = (np.swapaxes(v, -1, -2) if t else v for v, t in zip((x, y), transpose))
    exact = np.matmul(left.astype(np.float64), right.astype(np.float64))
    single_precision = np.matmul(left, right)
    # each element rounded once from a float64 sum (error ~k 2^-53 of the magnitudes)
    magnitude = np.matmul(np.abs(left).astype(np.float64), np.abs(right).astype(np.float64))
    assert np.all(np.abs(actual - exact) <= 0.5 * np.spacing(np.abs(exact).astype(np.float32))
                  + 1e-12 * magnitude)
    assert np.abs(actual - exact).max() <= np.abs(single_precision - exact).max()


def test_float32_matmul_fallback_accumulate_mode(monkeypatch, tmp_path):
    """The accumulate mode of the float32 loop nest (C += alpha * A @ B, summed in float64), which
    the runtime does not choose without BLAS today, against the exact update rounded once."""
    import tracer.runtime.back_end
    from tracer.runtime import native
    monkeypatch.setattr(native, "blas_available", lambda: False)
    monkeypatch.setattr(tracer.runtime.back_end, "fuse", lambda f, matmul_updates: ir.fusion.fuse(f))
    f = ir.Graph("update")
    w = f.add_parameter("w", TensorType((300, 4), "f32"))
    x = f.add_parameter("x", TensorType((50, 300), "f32"))
    g = f.add_parameter("g", TensorType((50, 4), "f32"))
    lr = f.add_parameter("lr", TensorType((), "f32"))
    b = ir.GraphBuilder(f)
    product = b.op("matmul", b.swap_last_axes(x), g)
    f.outputs = [b.sub(w, b.mul(lr, product))]
    function = ir.optimize(f)
    compiled = tracer.runtime.pipeline.compile_graph(function)
    assert "accumulate(" in compiled.stage_text("fused")
    assert "tracer_sgemm" not in compiled.llvm_ir
    rng = np.random.default_rng(12)
    arguments = [rng.normal(0, 1, p.shape).astype(np.float32) for p in function.parameters]
    arguments[3] = np.array(0.25, np.float32)
    (actual,) = compiled([a.copy() for a in arguments])
    w64, x64, g64 = (a.astype(np.float64) for a in arguments[:3])
    exact = w64 - 0.25 * (x64.T @ g64)
    assert np.all(np.abs(actual - exact) <= 0.5 * np.spacing(np.abs(exact).astype(np.float32))
                  + 1e-12 * (np.abs(w64) + 0.25 * np.abs(x64.T) @ np.abs(g64)))


def test_two_layer_net_step():
    f = ir.Graph("step")
    x = f.add_parameter("x", TensorType((8, 4), "f32"))
    w1 = f.add_parameter("w1", TensorType((4, 16), "f32"))
    w2 = f.add_parameter("w2", TensorType((16, 2), "f32"))
    t = f.add_parameter("t", TensorType((8, 2), "f32"))
    b = ir.GraphBuilder(f)
    h_pre = b.op("matmul", x, w1)
    h = b.op("maximum", h_pre, b.full((8, 16), 0.0, "f32"))
    y = b.op("matmul", h, w2)
    d = b.sub(y, t)
    loss = b.reduce_sum(b.mul(d, d), (0, 1))
    g = b.mul(d, b.full((8, 2), 2.0, "f32"))
    gw2 = b.op("matmul", b.swap_last_axes(h), g)
    gh = b.op("matmul", g, b.swap_last_axes(w2))
    gh = b.select(b.gt(h_pre, b.full((8, 16), 0.0, "f32")), gh, b.full((8, 16), 0.0, "f32"))
    gw1 = b.op("matmul", b.swap_last_axes(x), gh)
    f.outputs = [loss, b.sub(w1, b.mul(gw1, b.full((4, 16), 0.1, "f32"))),
                 b.sub(w2, b.mul(gw2, b.full((16, 2), 0.1, "f32")))]
    arguments = [random_array(v.shape, "f32") for v in f.parameters]
    run_both(f, arguments, ulps=64)


def test_in_memory_cache_returns_the_same_object():
    f = ir.optimize(single("exp", [TensorType((3,), "f32")]))
    assert compile_function(f) is compile_function(ir.optimize(single("exp",
                                                                      [TensorType((3,), "f32")])))


def test_argument_checks():
    compiled = compile_function(ir.optimize(single("exp", [TensorType((3,), "f32")])))
    with pytest.raises(ValueError):
        compiled([np.zeros(4, np.float32)])
    with pytest.raises(ValueError):
        compiled([])
    # other dtypes are converted, as ir.interpret does
    np.testing.assert_allclose(compiled([np.zeros(3, np.float64)])[0], 1.0)


def test_stage_text():
    f = ir.optimize(single("tanh", [TensorType((1024,), "f32")]))
    compiled = compile_function(f)
    fused = compiled.stage_text("fused")
    assert "kernel_0" in fused and "tanh %x0" in fused
    assert "define void @tracer_entry" in compiled.stage_text("llvm")
    assert "tracer_entry" in compiled.stage_text("asm")
    with pytest.raises(ValueError):
        compiled.stage_text("bogus")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_sum_of_negative_zeros_is_positive_zero(dtype, size):
    # Found by the differential tester: the sum's fadd carried `nsz`, which let LLVM drop the
    # +0 the sum starts from, so a sum of -0.0 entries (a cross-entropy over one class) came out
    # -0.0 where numpy and PyTorch give +0.0, and 1 / sum the opposite infinity.
    zeros = np.full((2, size), -0.0, dtype)
    expected = np.sum(zeros, axis=1)
    assert not np.signbit(expected).any()
    summed = tr.trace(lambda x: x.sum(1))(tr.from_numpy(zeros)).numpy()
    np.testing.assert_array_equal(np.signbit(summed), np.signbit(expected))
    assert (1 / summed == np.inf).all()
