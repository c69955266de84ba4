"""Every differentiable primitive's VJP rule against float64 central differences.

For each case a tiny ir.Graph applies the primitive to its parameters; a `gradient %out, %seed,
%wrt...` directive (as the tracer records it) asks for the vector-Jacobian product with a random
cotangent `seed`. The autodiff pass expands it, the verifier checks the result, the interpreter runs
it, and the numbers are compared with central differences of <seed, f(x)> computed by interpreting
the forward graph alone. The same rule applied eagerly (ArrayBuilder) must give the same numbers.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from tracer import ir
from conftest import roundtrip
from tracer.ir.builder import ArrayBuilder, GraphBuilder
from tracer.ir.graph import Graph
from tracer.ir.reference import evaluate_primitive
from tracer.ir.types import TensorType, float32, float64, is_float
from tracer.ir.vjp import CustomRule

EPS = 1e-6
RTOL = 1e-6
ATOL = 1e-8


def build(body, arrays, name="f"):
    """A Function whose parameters have the types of `arrays` and whose output is body(b, *params)."""
    function = Graph(name)
    params = [function.add_parameter(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    builder = GraphBuilder(function)
    out = body(builder, *params)
    function.outputs = [out]
    return function, builder, params, out


def objective(forward: Graph, arrays, seed) -> float:
    (out,) = ir.interpret(forward, arrays)
    return float(np.sum(seed.astype(np.float64) * out.astype(np.float64)))


def finite_differences(forward: Graph, arrays, seed, index: int, eps=EPS) -> np.ndarray:
    """d<seed, f(x)>/d x_index by central differences (the step actually taken, after rounding to
    the parameter's dtype, is the denominator)."""
    x = arrays[index]
    gradient = np.zeros(x.shape, np.float64)
    for position in np.ndindex(x.shape):
        plus = [a.copy() for a in arrays]
        minus = [a.copy() for a in arrays]
        plus[index][position] = x[position] + eps
        minus[index][position] = x[position] - eps
        step = float(plus[index][position]) - float(minus[index][position])
        gradient[position] = (objective(forward, plus, seed) - objective(forward, minus, seed)) / step
    return gradient


def graph_gradients(body, arrays, seed):
    """(gradient Function after expansion, its outputs [out, *grads] from the interpreter)."""
    function, builder, params, out = build(body, arrays, "grad")
    seed_param = function.add_parameter("seed", out.type)
    wrt = [p for p in params if is_float(p.dtype)]
    gradients = builder.emit("gradient", [out, seed_param, *wrt], {})
    assert [g.type for g in gradients] == [p.type for p in wrt]
    function.outputs = [out, *gradients]
    roundtrip(function)  # with the directive
    ir.expand_gradients(function)
    assert all(i.primitive != "gradient" for i in function.instructions)
    roundtrip(function)
    results = ir.interpret(function, [*arrays, seed])
    optimized = ir.optimize(function)
    roundtrip(optimized)
    for plain, fast in zip(results, ir.interpret(optimized, [*arrays, seed])):
        assert plain.dtype == fast.dtype and plain.shape == fast.shape
        np.testing.assert_allclose(fast, plain, rtol=1e-12, atol=0)
    return function, results


def check(body, arrays, eps=EPS, rtol=RTOL, atol=ATOL, seed_rng=None):
    """The full check for one case: FD vs graph autodiff; returns (forward, gradients)."""
    rng = seed_rng or np.random.default_rng(12345)
    arrays = [np.asarray(a) for a in arrays]
    forward, _, _, out = build(body, arrays)
    roundtrip(forward)
    seed = rng.standard_normal(out.shape).astype(out.dtype)
    _, (value, *gradients) = graph_gradients(body, arrays, seed)
    np.testing.assert_array_equal(value, ir.interpret(forward, arrays)[0])
    float_indices = [i for i, a in enumerate(arrays) if is_float(a.dtype)]
    assert len(gradients) == len(float_indices)
    for index, gradient in zip(float_indices, gradients):
        assert gradient.shape == arrays[index].shape
        assert gradient.dtype == arrays[index].dtype
        expected = finite_differences(forward, arrays, seed, index, eps)
        np.testing.assert_allclose(gradient, expected, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of operand {index}")
    return seed, gradients


# ---------------------------------------------------------------------------------------------
# Input generators that keep away from points of non-differentiability.

def rng_for(*key) -> np.random.Generator:
    # crc32, not hash(): str hashes change from process to process
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def normal(rng, shape):
    return rng.standard_normal(shape)


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def away_from_zero(rng, shape):
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 2.0, shape)


def distinct(rng, shape):
    """Values at least 0.3 apart from each other (no ties for max)."""
    size = int(np.prod(shape, dtype=np.int64))
    return (rng.permutation(size) * 0.5 + rng.uniform(-0.1, 0.1, size)).reshape(shape) - size / 4


UNARY_CASES = {
    "neg": normal, "abs": away_from_zero, "exp": normal, "log": positive, "sqrt": positive,
    "tanh": normal, "sin": normal, "cos": normal,
}
UNARY_SHAPES = [(), (1,), (4,), (2, 1, 3), (1, 4)]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("primitive", sorted(UNARY_CASES))
def test_unary(primitive, shape):
    rng = rng_for(primitive, shape)
    x = UNARY_CASES[primitive](rng, shape)
    check(lambda b, x: b.op(primitive, x), [x], seed_rng=rng)


BINARY_SHAPES = [((), ()), ((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 4)), ((1,), (2, 3)),
                 ((), (2, 2)), ((2, 1, 3), (4, 1)), ((3, 1), (3, 1)), ((1, 1), (2, 1, 3))]


def gapped_pair(rng, shape_x, shape_y):
    """x near even integers, y near odd integers: |x - y| >= 0.6 everywhere, whatever broadcasts."""
    x = 2.0 * rng.integers(-2, 3, shape_x) + rng.uniform(-0.2, 0.2, shape_x)
    y = 2.0 * rng.integers(-2, 3, shape_y) + 1.0 + rng.uniform(-0.2, 0.2, shape_y)
    return x, y


BINARY_CASES = {
    "add": lambda rng, sx, sy: (normal(rng, sx), normal(rng, sy)),
    "sub": lambda rng, sx, sy: (normal(rng, sx), normal(rng, sy)),
    "mul": lambda rng, sx, sy: (normal(rng, sx), normal(rng, sy)),
    "div": lambda rng, sx, sy: (normal(rng, sx), away_from_zero(rng, sy)),
    "pow": lambda rng, sx, sy: (positive(rng, sx), rng.uniform(-2.0, 2.0, sy)),
    "maximum": gapped_pair,
    "minimum": gapped_pair,
    # x / y between two integers (fmod jumps where it is one): x near k + 1/2, |y| near 1
    "fmod": lambda rng, sx, sy: (rng.integers(-2, 3, sx) + 0.5 + rng.uniform(-0.2, 0.2, sx),
                                 rng.choice([-1.0, 1.0], sy) * rng.uniform(0.95, 1.05, sy)),
}


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("primitive", sorted(BINARY_CASES))
def test_binary(primitive, shapes):
    rng = rng_for(primitive, shapes)
    x, y = BINARY_CASES[primitive](rng, *shapes)
    if primitive in ("maximum", "minimum") and rng.random() < 0.5:
        x, y = y, x
    check(lambda b, x, y: b.op(primitive, x, y), [x, y], seed_rng=rng)


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0])
def test_pow_negative_base_integer_exponent(exponent):
    # d/dx x**n = n x**(n-1) also for x < 0 (the exponent is a constant: no log(x) needed).
    rng = rng_for("pow-negative", exponent)
    x = away_from_zero(rng, (2, 3))
    seed, (gradient,) = check(lambda b, x: b.pow(x, exponent), [x], seed_rng=rng)
    np.testing.assert_allclose(gradient, seed * exponent * x ** (exponent - 1), rtol=1e-12)


def test_pow_zero_exponent_gradient_is_zero():
    # As PyTorch: d/dx x**0 is 0 even at x == 0 (where n * x**(n-1) would be 0 * inf).
    x = np.array([0.0, 1.5, -2.0])
    seed, (gradient,) = check(lambda b, x: b.pow(x, 0.0), [x])
    np.testing.assert_array_equal(gradient, np.zeros(3))


@pytest.mark.parametrize("primitive", ["maximum", "minimum"])
def test_max_min_ties_split_the_gradient(primitive):
    # Not differentiable at ties; the rule (as PyTorch's) gives each operand half the cotangent.
    x = np.array([[1.0, -2.0, 3.0]])
    y = np.array([[1.0], [-2.0]])
    _, (value, dx, dy) = graph_gradients(lambda b, x, y: b.op(primitive, x, y), [x, y],
                                         seed := np.arange(1.0, 7.0).reshape(2, 3))
    tie = np.equal(x, y)
    first = np.greater(x, y) if primitive == "maximum" else np.less(x, y)
    expected_dx = np.where(tie, seed / 2, np.where(first, seed, 0.0)).sum(axis=0, keepdims=True)
    expected_dy = np.where(tie, seed / 2, np.where(first, 0.0, seed)).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(dx, expected_dx)
    np.testing.assert_array_equal(dy, expected_dy)
    # Hand-computed for maximum: ties at (0,0) and (1,1).
    if primitive == "maximum":
        # seed [[1,2,3],[4,5,6]]; row 0 (y=1): tie, y, x; row 1 (y=-2): x, tie, x.
        np.testing.assert_array_equal(dx, [[0.5 + 4.0, 0.0 + 2.5, 3.0 + 6.0]])
        np.testing.assert_array_equal(dy, [[0.5 + 2.0], [2.5]])


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((2, 1), (1, 3), (2, 3)),
                                    ((), (3,), (1,)), ((3,), (2, 1), ()), ((1, 4), (4,), (3, 1))],
                         ids=str)
def test_select(shapes):
    rng = rng_for("select", shapes)
    condition = rng.random(shapes[0]) < 0.5
    a, c = normal(rng, shapes[1]), normal(rng, shapes[2])
    check(lambda b, cond, a, c: b.op("select", cond, a, c), [condition, a, c], seed_rng=rng)


@pytest.mark.parametrize("source,target", [(float32, float64), (float64, float32)], ids=str)
@pytest.mark.parametrize("shape", [(), (3,), (2, 1, 2)], ids=str)
def test_cast(source, target, shape):
    rng = rng_for("cast", str(source), shape)
    x = normal(rng, shape).astype(source)
    # A float32 value rounds the step: FD divides by the step actually taken, and float32's
    # relative spacing (6e-8) over a 2e-3 step bounds the FD error by ~1e-4 relative.
    check(lambda b, x: b.cast(x, target), [x], eps=1e-3, rtol=1e-4, atol=1e-6, seed_rng=rng)


@pytest.mark.parametrize("source,target", [((3, 1), (2, 3, 4)), ((), (2, 2)), ((1,), (3,)),
                                           ((2, 1, 1), (2, 3, 1)), ((4,), (1, 4)), ((1, 1), (0, 2, 1))],
                         ids=str)
def test_broadcast(source, target):
    rng = rng_for("broadcast", source, target)
    x = normal(rng, source)
    seed, (gradient,) = check(lambda b, x: b.op("broadcast", x, shape=target), [x], seed_rng=rng)
    if 0 in target:
        np.testing.assert_array_equal(gradient, np.zeros(source))


@pytest.mark.parametrize("source,target", [((2, 3), (3, 2)), ((2, 3, 1), (6,)), ((1,), ()),
                                           ((), (1, 1)), ((4,), (2, 1, 2))], ids=str)
def test_reshape(source, target):
    rng = rng_for("reshape", source, target)
    check(lambda b, x: b.op("reshape", x, shape=target), [normal(rng, source)], seed_rng=rng)


@pytest.mark.parametrize("shape,permutation", [((2, 3, 4), (2, 0, 1)), ((1, 3), (1, 0)),
                                               ((2, 1, 3, 1), (3, 1, 0, 2)), ((2, 3), (0, 1))],
                         ids=str)
def test_transpose(shape, permutation):
    rng = rng_for("transpose", shape, permutation)
    check(lambda b, x: b.op("transpose", x, permutation=permutation), [normal(rng, shape)],
          seed_rng=rng)


SLICES = [
    ((7,), (1,), (6,), (2,)),
    ((7,), (0,), (7,), (3,)),
    ((5, 4), (0, 1), (5, 4), (3, 2)),
    ((6, 5, 1), (1, 0, 0), (6, 5, 1), (2, 4, 1)),
    ((4, 3), (2, 0), (2, 3), (1, 1)),   # an empty slice: the gradient is zero
    ((4, 3), (1, 1), (3, 2), (5, 7)),   # a step longer than the dimension
    ((3, 3), (0, 0), (3, 3), (1, 1)),
]


@pytest.mark.parametrize("shape,starts,stops,steps", SLICES, ids=str)
def test_slice(shape, starts, stops, steps):
    rng = rng_for("slice", shape, starts, stops, steps)
    x = normal(rng, shape)
    seed, (gradient,) = check(
        lambda b, x: b.op("slice", x, starts=starts, stops=stops, steps=steps), [x], seed_rng=rng)
    # The independent oracle: scatter the seed into zeros with numpy.
    expected = np.zeros(shape)
    expected[tuple(map(slice, starts, stops, steps))] = seed
    np.testing.assert_array_equal(gradient, expected)


PADS = [
    ((3,), (1,), (2,), (1,)),
    ((2, 3), (0, 2), (1, 0), (2, 0)),
    ((1, 4), (1, 0), (0, 1), (0, 3)),
    ((2, 2, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
    ((3, 2), (2, 1), (1, 2), (1, 2)),
    ((0, 2), (1, 0), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("shape,low,high,interior", PADS, ids=str)
def test_pad(shape, low, high, interior):
    rng = rng_for("pad", shape, low, high, interior)
    x = normal(rng, shape)
    seed, (gradient,) = check(
        lambda b, x: b.op("pad", x, low=low, high=high, interior=interior), [x], seed_rng=rng)
    region = tuple(slice(lo, lo + n * (gap + 1), gap + 1) for n, lo, gap in zip(shape, low, interior))
    np.testing.assert_array_equal(gradient, seed[region])


REDUCTIONS = [((2, 3, 4), (0,)), ((2, 3, 4), (1, 2)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (0, 1, 2)),
              ((3, 1), (1,)), ((5,), (0,)), ((1, 1, 3), (0, 1)), ((2, 3), ())]


@pytest.mark.parametrize("shape,axes", REDUCTIONS, ids=str)
def test_reduce_sum(shape, axes):
    rng = rng_for("reduce_sum", shape, axes)
    check(lambda b, x: b.op("reduce_sum", x, axes=axes), [normal(rng, shape)], seed_rng=rng)


@pytest.mark.parametrize("shape,axes", REDUCTIONS, ids=str)
def test_reduce_max(shape, axes):
    rng = rng_for("reduce_max", shape, axes)
    check(lambda b, x: b.op("reduce_max", x, axes=axes), [distinct(rng, shape)], seed_rng=rng)


@pytest.mark.parametrize("shape,axes", REDUCTIONS, ids=str)
def test_reduce_min(shape, axes):
    rng = rng_for("reduce_min", shape, axes)
    check(lambda b, x: b.op("reduce_min", x, axes=axes), [distinct(rng, shape)], seed_rng=rng)


def test_reduce_min_ties_share_the_gradient():
    x = np.array([[1.0, -3.0, -3.0], [2.0, 2.0, 2.0], [0.0, 5.0, 7.0]])
    _, (value, gradient) = graph_gradients(lambda b, x: b.op("reduce_min", x, axes=(1,)), [x],
                                           np.array([6.0, 9.0, 1.0]))
    np.testing.assert_array_equal(value, [-3.0, 2.0, 0.0])
    np.testing.assert_array_equal(gradient, [[0.0, 3.0, 3.0], [3.0, 3.0, 3.0], [1.0, 0.0, 0.0]])
    _, (value, gradient) = graph_gradients(lambda b, x: b.op("reduce_min", x, axes=(0, 1)), [x],
                                           np.array(8.0))
    np.testing.assert_array_equal(gradient, [[0.0, 4.0, 4.0], [0.0] * 3, [0.0] * 3])


def test_reduce_max_ties_share_the_gradient():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    _, (_, gradient) = graph_gradients(lambda b, x: b.op("reduce_max", x, axes=(1,)), [x],
                                       np.array([6.0, 9.0]))
    np.testing.assert_array_equal(gradient, [[0.0, 3.0, 3.0], [3.0, 3.0, 3.0]])


def test_reduce_sum_of_empty_dimension():
    x = np.zeros((0, 3))
    _, (value, gradient) = graph_gradients(lambda b, x: b.op("reduce_sum", x, axes=(0,)), [x],
                                           np.ones(3))
    np.testing.assert_array_equal(value, np.zeros(3))
    assert gradient.shape == (0, 3)


MATMULS = [((2, 3), (3, 4)), ((1, 3), (3, 1)), ((3, 1), (1, 2)), ((2, 2, 3), (2, 3, 4)),
           ((1, 3, 2), (1, 2, 2)), ((2, 3, 1, 2), (2, 3, 2, 3))]


@pytest.mark.parametrize("shapes", MATMULS, ids=str)
def test_matmul(shapes):
    rng = rng_for("matmul", shapes)
    check(lambda b, x, y: b.op("matmul", x, y), [normal(rng, shapes[0]), normal(rng, shapes[1])],
          seed_rng=rng)


# ---------------------------------------------------------------------------------------------
# Non-differentiable primitives and gradient markers: hand-computed gradients.

def test_non_differentiable_primitives_give_zero_gradients():
    x = np.array([[-1.5, 2.0], [0.5, -0.25]])

    def body(b, x):
        s = b.op("sign", x)                                 # no gradient through sign
        mask = b.cast(b.op("lt", x, b.zeros_like(x)), x.dtype)  # nor through a comparison
        return b.add(b.mul(s, mask), b.op("stop_gradient", b.mul(x, x)))

    _, (value, gradient) = graph_gradients(body, [x], np.ones((2, 2)))
    np.testing.assert_array_equal(value, np.sign(x) * (x < 0) + x * x)
    np.testing.assert_array_equal(gradient, np.zeros((2, 2)))


def test_custom_vjp_uses_the_rule_not_the_body():
    # Forward body exp(x); the attached rule claims the gradient is 3 * g. Only the rule counts.
    x = np.array([0.5, -1.0, 2.0])

    def body(b, x):
        z = b.op("exp", x)
        rule = CustomRule("Triple", lambda builder, cotangents, needs: [builder.mul(cotangents[0], 3.0)])
        (out,) = b.emit("custom_vjp", [z, x], {"num_outputs": 1, "rule": rule})
        return out

    seed = np.array([1.0, 2.0, -1.0])
    _, (value, gradient) = graph_gradients(body, [x], seed)
    np.testing.assert_array_equal(value, np.exp(x))
    np.testing.assert_array_equal(gradient, 3.0 * seed)


def test_gradient_with_respect_to_an_unused_parameter_is_zero():
    x, y = np.array([1.0, 2.0]), np.array([[3.0], [4.0]])
    _, (value, dx, dy) = graph_gradients(lambda b, x, y: b.op("exp", x), [x, y], np.ones(2))
    np.testing.assert_array_equal(dx, np.exp(x))
    np.testing.assert_array_equal(dy, np.zeros((2, 1)))


# ---------------------------------------------------------------------------------------------
# Composite programs: fan-out accumulates, chains compose.

def test_fan_out_accumulates():
    rng = rng_for("fan-out")
    x = normal(rng, (3, 2))
    w = normal(rng, (2, 2))

    def body(b, x, w):
        h = b.op("tanh", b.op("matmul", x, w))
        return b.op("reduce_sum", b.add(b.mul(h, x), b.op("sin", b.mul(x, x))), axes=(1,))

    check(body, [x, w], seed_rng=rng)


def test_two_layer_step():
    rng = rng_for("two-layer")
    x, w1, w2, y = normal(rng, (4, 3)), normal(rng, (3, 5)), normal(rng, (5, 2)), normal(rng, (4, 2))
    while np.min(np.abs(x @ w1)) <= 1e-3:  # keep away from relu's kink
        x = normal(rng, (4, 3))

    def body(b, x, w1, w2, y):
        h = b.op("matmul", x, w1)
        relu = b.op("maximum", h, b.zeros_like(h))
        diff = b.sub(b.op("matmul", relu, w2), y)
        return b.op("reduce_sum", b.mul(diff, diff), axes=(0, 1))

    check(body, [x, w1, w2, y], seed_rng=rng)


def test_float32_program_gradient_dtype():
    rng = rng_for("f32")
    x = normal(rng, (2, 3)).astype(np.float32)
    seed, (gradient,) = check(lambda b, x: b.mul(b.op("exp", x), 2.0), [x], eps=1e-2, rtol=1e-3,
                              atol=1e-5, seed_rng=rng)
    assert gradient.dtype == np.float32
    np.testing.assert_allclose(gradient, seed * 2 * np.exp(x), rtol=1e-6)


def test_two_directives_in_one_function():
    # The second directive differentiates through the first's expansion (a second derivative).
    x = np.array([0.3, -0.7, 1.1])
    function = Graph("second")
    p = function.add_parameter("x", TensorType.of(x))
    b = GraphBuilder(function)
    y = b.op("reduce_sum", b.op("sin", p), axes=(0,))
    (dy,) = b.emit("gradient", [y, b.constant(1.0, float64), p], {})   # cos(x)
    z = b.op("reduce_sum", dy, axes=(0,))
    (ddy,) = b.emit("gradient", [z, b.constant(1.0, float64), p], {})  # -sin(x)
    function.outputs = [dy, ddy]
    roundtrip(function)
    ir.expand_gradients(function)
    roundtrip(function)
    first, second = ir.interpret(function, [x])
    np.testing.assert_allclose(first, np.cos(x), rtol=1e-15)
    np.testing.assert_allclose(second, -np.sin(x), rtol=1e-15)
    optimized = ir.optimize(function)
    roundtrip(optimized)
    for a, c in zip(ir.interpret(optimized, [x]), (first, second)):
        np.testing.assert_array_equal(a, c)


# ---------------------------------------------------------------------------------------------
# apply_vjp on the ArrayBuilder (eager backward) gives the graph path's numbers.

EAGER_CASES = [
    ("neg", [normal], {}, [(2, 3)]),
    ("abs", [away_from_zero], {}, [(2, 3)]),
    ("exp", [normal], {}, [(1, 3)]),
    ("log", [positive], {}, [(4,)]),
    ("sqrt", [positive], {}, [(2, 2)]),
    ("tanh", [normal], {}, [()]),
    ("sin", [normal], {}, [(3,)]),
    ("cos", [normal], {}, [(3, 1)]),
    ("add", [normal, normal], {}, [(2, 1), (1, 3)]),
    ("sub", [normal, normal], {}, [(3,), (2, 3)]),
    ("mul", [normal, normal], {}, [(2, 3), ()]),
    ("div", [normal, away_from_zero], {}, [(2, 3), (3,)]),
    ("pow", [positive, normal], {}, [(2, 1), (2, 3)]),
    ("maximum", [normal, normal], {}, [(2, 3), (1, 3)]),
    ("minimum", [normal, normal], {}, [(3, 1), (3, 2)]),
    ("fmod", [normal, away_from_zero], {}, [(2, 3), (3,)]),
    ("broadcast", [normal], {"shape": (2, 3, 4)}, [(3, 1)]),
    ("reshape", [normal], {"shape": (3, 2)}, [(2, 3)]),
    ("transpose", [normal], {"permutation": (2, 0, 1)}, [(2, 3, 4)]),
    ("slice", [normal], {"starts": (1, 0), "stops": (5, 3), "steps": (2, 2)}, [(5, 3)]),
    ("pad", [normal], {"low": (1, 0), "high": (0, 2), "interior": (1, 2)}, [(3, 2)]),
    ("reduce_sum", [normal], {"axes": (0, 2)}, [(2, 3, 4)]),
    ("reduce_max", [distinct], {"axes": (1,)}, [(2, 3, 4)]),
    ("reduce_min", [distinct], {"axes": (0, 2)}, [(2, 3, 4)]),
    ("matmul", [normal, normal], {}, [(2, 2, 3), (2, 3, 4)]),
]


@pytest.mark.parametrize("primitive,generators,attributes,shapes", EAGER_CASES,
                         ids=[c[0] for c in EAGER_CASES])
def test_apply_vjp_eager_matches_graph(primitive, generators, attributes, shapes):
    rng = rng_for("eager", primitive)
    arrays = [g(rng, s) for g, s in zip(generators, shapes)]
    eager = ArrayBuilder()
    (out,) = evaluate_primitive(primitive, arrays, attributes)
    seed = normal(rng, out.shape)
    gradients = ir.apply_vjp(eager, primitive, attributes, arrays, [out], [seed], [True] * len(arrays))
    _, (value, *graph) = graph_gradients(lambda b, *xs: b.op(primitive, *xs, **attributes),
                                         arrays, seed)
    np.testing.assert_array_equal(value, out)
    for eager_gradient, graph_gradient in zip(gradients, graph):
        assert eager_gradient.shape == graph_gradient.shape
        np.testing.assert_allclose(eager_gradient, graph_gradient, rtol=1e-14, atol=0)
    # Asking for fewer gradients gives None for the others.
    if len(arrays) == 2:
        partial = ir.apply_vjp(eager, primitive, attributes, arrays, [out], [seed], [False, True])
        assert partial[0] is None
        np.testing.assert_allclose(partial[1], gradients[1], rtol=1e-14, atol=0)


def test_apply_vjp_skips_non_float_operands_and_missing_cotangents():
    eager = ArrayBuilder()
    condition = np.array([True, False])
    a, c = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    out = np.where(condition, a, c)
    grads = ir.apply_vjp(eager, "select", {}, [condition, a, c], [out], [np.array([5.0, 7.0])],
                         [True, True, True])
    assert grads[0] is None
    np.testing.assert_array_equal(grads[1], [5.0, 0.0])
    np.testing.assert_array_equal(grads[2], [0.0, 7.0])
    assert ir.apply_vjp(eager, "exp", {}, [a], [np.exp(a)], [None], [True]) == [None]


# ---------------------------------------------------------------------------------------------
# What the directive differentiates with respect to.

def test_gradient_with_respect_to_an_intermediate_value_stops_there():
    # The values a directive differentiates with respect to are independent variables (as the
    # arguments of tr.grad(f, argnums=(0, 1))(h, x) are): the graph is cut at each of them.
    # With h = x * x and y = sin(h): dy/dh = cos(h); x reaches y only through h, so dy/dx = 0;
    # y itself is a variable, so dy/dy = 1 and nothing flows past it.
    x = np.array([0.5, -1.25, 2.0])
    s = np.array([1.0, -2.0, 0.5])

    def run(*which):
        function = Graph("intermediate")
        p = function.add_parameter("x", TensorType.of(x))
        b = GraphBuilder(function)
        h = b.mul(p, p)
        y = b.op("sin", h)
        seed = function.add_parameter("seed", y.type)
        names = {"h": h, "x": p, "y": y}
        function.outputs = b.emit("gradient", [y, seed, *(names[w] for w in which)], {})
        ir.expand_gradients(function)
        roundtrip(function)
        return ir.interpret(function, [x, s])

    (dx_alone,) = run("x")
    np.testing.assert_allclose(dx_alone, np.cos(x * x) * s * 2 * x, rtol=1e-15)
    (dh_alone,) = run("h")
    np.testing.assert_allclose(dh_alone, np.cos(x * x) * s, rtol=1e-15)
    dh, dx, dh_again = run("h", "x", "h")
    np.testing.assert_array_equal(dh, dh_alone)
    np.testing.assert_array_equal(dh_again, dh_alone)
    np.testing.assert_array_equal(dx, np.zeros(3))
    dy, dh = run("y", "h")
    np.testing.assert_array_equal(dy, s)
    np.testing.assert_array_equal(dh, np.zeros(3))


def test_no_gradient_through_an_integer_cast():
    x = np.array([1.7, -2.2, 3.9])
    seed, (gradient,) = check(lambda b, x: b.mul(b.cast(b.cast(x, np.int64), np.float64), x), [x])
    # d/dx (trunc(x) * x) = trunc(x) away from integers: the truncation itself has no gradient.
    np.testing.assert_array_equal(gradient, seed * np.trunc(x))
