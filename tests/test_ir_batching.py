"""The batching pass (ir/batching.py), one primitive at a time: a Function of one instruction,
traced on one element's shapes, batched over every choice of batched and unbatched operands, equals
the reference interpreter run once per element (the independent oracle), as arrays (ArrayBuilder)
and as a graph that type-checks and verifies (GraphBuilder)."""
import itertools

import numpy as np
import pytest

from tracer import ir
from tracer.ir.batching import BATCHING_RULES, CannotBatch, batch_function, prepare
from tracer.ir.builder import ArrayBuilder, GraphBuilder
from tracer.ir.primitives import BINARY, COMPARE, LOGICAL, PRIMITIVES, SOURCES, UNARY
from tracer.ir.vjp import CustomRule

SIZE = 3
RANDOM = np.random.default_rng(17)


def _floats(shape, dtype, low=-2.0, high=2.0):
    return lambda: RANDOM.uniform(low, high, size=shape).astype(dtype)


def _ints(shape, low, high):
    return lambda: RANDOM.integers(low, high, size=shape).astype(np.int64)


def _bools(shape):
    return lambda: RANDOM.random(shape) < 0.5


def _case(primitive, dtype):
    """(a maker of each operand of one element, the attributes) for one instruction."""
    if primitive in UNARY:
        if primitive == "logical_not":
            return [_bools((2, 3))], {}
        low = 0.1 if primitive in ("log", "sqrt") else -2.0
        return [_floats((2, 3), dtype, low)], {}
    if primitive in LOGICAL:  # (operands of different ranks: the batch dimension stays first)
        return [_bools((2, 3)), _bools((3,))], {}
    if primitive in BINARY:
        low = 0.1 if primitive == "pow" else -2.0
        makers = [_floats((2, 3), dtype, low), _floats((3,), dtype, low)]
        if primitive in COMPARE:  # some equal elements
            makers = [lambda: RANDOM.integers(0, 3, (2, 3)).astype(dtype),
                      lambda: RANDOM.integers(0, 3, (3,)).astype(dtype)]
        return makers, {}
    return {
        "select": ([_bools((3,)), _floats((2, 3), dtype), _floats((), dtype)], {}),
        "cast": ([_floats((2, 3), dtype)], {"dtype": np.dtype(np.int64)}),
        "stop_gradient": ([_floats((2, 3), dtype)], {}),
        "all_reduce": ([_floats((2, 3), dtype)], {"op": "sum"}),
        "check_index": ([_ints((4,), -5, 5)], {"size": 5, "axis": 0, "wrap": True}),
        "broadcast": ([_floats((3, 1), dtype)], {"shape": (2, 3, 4)}),
        "reshape": ([_floats((2, 3), dtype)], {"shape": (3, 1, 2)}),
        "transpose": ([_floats((2, 3, 4), dtype)], {"permutation": (2, 0, 1)}),
        "slice": ([_floats((5, 4), dtype)], {"starts": (1, 0), "stops": (5, 3), "steps": (2, 1)}),
        "pad": ([_floats((2, 3), dtype)], {"low": (1, 0), "high": (0, 2), "interior": (1, 0)}),
        "reduce_sum": ([_floats((2, 3, 4), dtype)], {"axes": (0, 2)}),
        "reduce_max": ([_floats((2, 3, 4), dtype)], {"axes": (1,)}),
        "reduce_min": ([_floats((2, 3, 4), dtype)], {"axes": (0, 1, 2)}),
        "matmul": ([_floats((2, 3, 4), dtype), _floats((2, 4, 5), dtype)], {}),
        "gather": ([_floats((4, 5, 6), dtype), _ints((2, 1), -4, 4), _ints((3,), 0, 6)],
                   {"axes": (0, 2)}),
        # (repeated indices: accumulated, or the last write stays)
        "scatter": ([_floats((4, 3), dtype), _floats((5, 3), dtype), _ints((5,), -4, 4)],
                    {"axes": (0,), "accumulate": True}),
        "constant": ([], {"value": 1.5, "dtype": np.dtype(dtype)}),
        "iota": ([], {"shape": (2, 3), "dimension": 1, "dtype": np.dtype(np.int64)}),
    }[primitive]


def _one_instruction(primitive, element_arrays, attributes):
    function = ir.Graph(primitive)
    parameters = [function.add_parameter(f"x{k}", ir.TensorType(a.shape, a.dtype))
                  for k, a in enumerate(element_arrays)]
    (result,) = GraphBuilder(function).emit(primitive, parameters, attributes)
    function.outputs = [result]
    return function


def _check_batched(function, elements, batched):
    """`function` batched (with `batched[k]`: operand k differs between elements) against the
    interpreter once per element, through both builders."""
    per_element = [[elements[i][k] if flag else elements[0][k] for k, flag in enumerate(batched)]
                    for i in range(SIZE)]
    expected = np.stack([ir.interpret(function, arguments)[0] for arguments in per_element])
    stacked = [np.stack([arguments[k] for arguments in per_element]) if flag
               else per_element[0][k] for k, flag in enumerate(batched)]
    ((array, array_batched),) = batch_function(ArrayBuilder(), function,
                                               list(zip(stacked, batched)), SIZE)
    graph = ir.Graph("batched")
    parameters = [graph.add_parameter(f"x{k}", ir.TensorType(a.shape, a.dtype))
                  for k, a in enumerate(stacked)]
    ((value, value_batched),) = batch_function(GraphBuilder(graph), function,
                                               list(zip(parameters, batched)), SIZE)
    graph.outputs = [value]
    ir.verify(graph)
    (interpreted,) = ir.interpret(graph, stacked)
    for result, flag in ((array, array_batched), (interpreted, value_batched)):
        assert flag == any(batched)
        result = result if flag else np.broadcast_to(result, expected.shape)
        assert result.shape == expected.shape and result.dtype == expected.dtype
        np.testing.assert_allclose(result, expected, rtol=1e-6 if expected.dtype == np.float32
                                   else 1e-13, atol=0)
    return graph


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# (custom_vjp and host_callback refuse: tests/test_autodiff_vmap.py runs them per element)
@pytest.mark.parametrize("primitive", sorted(PRIMITIVES - {"custom_vjp", "host_callback"} - SOURCES))
def test_every_primitive_batches_as_the_per_element_interpreter(primitive, dtype):
    makers, attributes = _case(primitive, dtype)
    elements = [[make() for make in makers] for _ in range(SIZE)]
    function = _one_instruction(primitive, elements[0], attributes)
    for batched in itertools.product([False, True], repeat=len(makers)):
        if any(batched):
            _check_batched(function, elements, batched)


@pytest.mark.parametrize("primitive", sorted(SOURCES))
def test_sources_stay_unbatched_and_their_rows_broadcast(primitive):
    # A source has no operand: its value is the same for every element (never batched); next to
    # a batched operand it broadcasts.
    _, attributes = _case(primitive, np.float64)
    function = ir.Graph(primitive)
    x = function.add_parameter("x", ir.TensorType((2, 3), np.float64))
    b = GraphBuilder(function)
    (source,) = b.emit(primitive, [], attributes)
    function.outputs = [b.add(x, b.cast(source, np.float64))]
    elements = [[RANDOM.standard_normal((2, 3))] for _ in range(SIZE)]
    graph = _check_batched(function, elements, [True])
    assert [i.primitive for i in graph.instructions].count(primitive) == 1
    (row,) = BATCHING_RULES[primitive](ArrayBuilder(), SIZE, [], [], attributes)
    (single,) = ir.interpret(_one_instruction(primitive, [], attributes), [])
    np.testing.assert_array_equal(row, np.broadcast_to(single, (SIZE, *single.shape)))


def test_scatter_keeps_each_elements_last_write():
    # Without accumulation each element's own repeated index keeps its last write; elements never
    # write into each other's copy (the batch position is an index too).
    makers, attributes = _case("scatter", np.float64)
    attributes = dict(attributes, accumulate=False)
    elements = [[make() for make in makers] for _ in range(SIZE)]
    elements[0][2] = np.array([1, 1, -3, 2, 1])
    function = _one_instruction("scatter", elements[0], attributes)
    for batched in [(False, True, True), (True, False, False), (True, True, True)]:
        _check_batched(function, elements, batched)


def test_matmul_with_one_batched_side_is_one_larger_product():
    # x @ W with only x batched: the elements are more rows of one matmul (no batch dimension
    # and no copies of W), and the same for a batched right side (more columns).
    elements = [[RANDOM.standard_normal((2, 4)), RANDOM.standard_normal((4, 5))]
                for _ in range(SIZE)]
    function = _one_instruction("matmul", elements[0], {})
    for batched in [(True, False), (False, True)]:
        graph = _check_batched(function, elements, batched)
        (product,) = [i for i in graph.instructions if i.primitive == "matmul"]
        assert [v.type.ndim for v in product.inputs] == [2, 2]
        assert "broadcast" not in {i.primitive for i in graph.instructions}


def test_a_gradient_is_batched_after_it_is_expanded_per_element():
    # d/dx sum(sin(x) * w), traced per element (one directive), prepared and batched.
    function = ir.Graph("grad")
    x = function.add_parameter("x", ir.TensorType((4,), np.float64))
    w = function.add_parameter("w", ir.TensorType((4,), np.float64))
    b = GraphBuilder(function)
    loss = b.reduce_sum(b.mul(b.op("sin", x), w), (0,))
    seed = b.constant(1.0, np.float64)
    (gradient,) = b.emit("gradient", [loss, seed, x], {})
    function.outputs = [gradient]
    with pytest.raises(CannotBatch, match="gradient"):
        batch_function(ArrayBuilder(), function, [(None, True), (None, False)], SIZE)
    prepare(function, [])
    assert "gradient" not in {i.primitive for i in function.instructions}
    # (the expanded gradient is a constant to any later gradient, as the directive's result was)
    assert function.outputs[0].producer.primitive == "stop_gradient"
    xs, weights = RANDOM.standard_normal((SIZE, 4)), RANDOM.standard_normal(4)
    ((result, batched),) = batch_function(ArrayBuilder(), function,
                                          [(xs, True), (weights, False)], SIZE)
    assert batched
    np.testing.assert_allclose(result, np.cos(xs) * weights, rtol=1e-15)


def _with_custom_marker():
    function = ir.Graph("custom")
    x = function.add_parameter("x", ir.TensorType((3,), np.float64))
    b = GraphBuilder(function)
    cube = b.mul(b.mul(x, x), x)
    rule = CustomRule("Cube", lambda builder, cotangents, needs: [cotangents[0]])
    (marked,) = b.emit("custom_vjp", [cube, x], {"num_outputs": 1, "rule": rule})
    function.outputs = [b.op("exp", marked)]
    return function, x


def test_custom_vjp_markers_are_dropped_only_where_no_later_gradient_passes():
    function, _ = _with_custom_marker()
    prepare(function, [])
    assert "custom_vjp" not in {i.primitive for i in function.instructions}
    xs = RANDOM.standard_normal((SIZE, 3))
    ((result, _),) = batch_function(ArrayBuilder(), function, [(xs, True)], SIZE)
    np.testing.assert_allclose(result, np.exp(xs ** 3), rtol=1e-15)
    # A gradient taken later through the marker would need the user's rule batched: refused.
    function, x = _with_custom_marker()
    with pytest.raises(CannotBatch, match="custom Function"):
        prepare(function, [x])


def test_a_primitive_without_a_row_is_refused_before_anything_is_emitted():
    function = _one_instruction("exp", [np.zeros(2)], {})
    function.instructions[0].primitive = "a_primitive_without_rows"
    emitted = []

    class Recording(ArrayBuilder):
        def emit(self, primitive, inputs, attributes):
            emitted.append(primitive)
            return super().emit(primitive, inputs, attributes)

    with pytest.raises(CannotBatch, match="no batching rule for a_primitive_without_rows"):
        batch_function(Recording(), function, [(np.zeros((SIZE, 2)), True)], SIZE)
    assert emitted == []
