"""Every primitive has exactly one row in each table (shape rule, reference semantics, VJP rule,
batching rule).

Adding a primitive without filling a table, or leaving a stale row behind, fails here.
"""
import numpy as np
import pytest

from tracer import ir
from tracer.codegen.lowering import LOWERING
from tracer.ir.builder import ArrayBuilder
from tracer.ir.primitives import IndexRangeError
from tracer.ir.reference import evaluate_primitive
from tracer.ir.vjp import apply_vjp
from tracer.ir import primitives
from tracer.ir.primitives import ARITY, DIRECTIVES, PRIMITIVES
from tracer.ir.reference import REFERENCE
from tracer.ir.vjp import VJP_RULES
from tracer.ir.batching import BATCHING_RULES

TABLES = {"SHAPE_RULES": primitives.SHAPE_RULES, "REFERENCE": REFERENCE, "VJP_RULES": VJP_RULES,
          "BATCHING_RULES": BATCHING_RULES}


def test_primitive_set_is_the_documented_closed_set():
    # The design's closed set: elementwise unary/binary, compare, select, cast, broadcast, reshape,
    # transpose, slice, pad, reduce sum/max/min, matmul, constant/iota, gather/scatter at computed
    # indices (+ gradient markers), the one collective of data-parallel jobs (all_reduce), and
    # Python code called back on the host (host_callback).
    expected = {
        "neg", "abs", "sign", "exp", "log", "sqrt", "tanh", "sin", "cos", "logical_not",
        "add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmod",
        "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
        "select", "cast", "broadcast", "reshape", "transpose", "slice", "pad",
        "reduce_sum", "reduce_max", "reduce_min", "matmul", "constant", "iota",
        "gather", "scatter", "check_index", "stop_gradient", "custom_vjp", "all_reduce",
        "host_callback",
    }
    assert PRIMITIVES == expected
    assert DIRECTIVES == {"gradient"}
    assert not PRIMITIVES & DIRECTIVES


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("primitive", sorted(PRIMITIVES))
def test_every_primitive_has_a_row(table, primitive):
    assert primitive in TABLES[table], f"{table} has no row for primitive {primitive!r}"
    assert callable(TABLES[table][primitive])


@pytest.mark.parametrize("table", sorted(TABLES))
def test_no_table_misses_a_primitive(table):
    missing = PRIMITIVES - set(TABLES[table])
    assert not missing, f"{table} misses {sorted(missing)}"


@pytest.mark.parametrize("table", sorted(TABLES))
def test_no_table_has_extra_names(table):
    extra = set(TABLES[table]) - (PRIMITIVES | DIRECTIVES)
    assert not extra, f"{table} has rows for unknown names {sorted(extra)}"


def test_directives_have_shape_rules_only():
    # A directive is typed (the verifier checks it) but never evaluated or differentiated.
    for directive in DIRECTIVES:
        assert directive in primitives.SHAPE_RULES
        assert directive not in REFERENCE
        assert directive not in VJP_RULES
        assert directive not in BATCHING_RULES  # (expanded before batching)


def test_arity_table_covers_everything():
    assert set(ARITY) == PRIMITIVES | DIRECTIVES


def test_public_exports_are_the_same_tables():
    assert ir.SHAPE_RULES is primitives.SHAPE_RULES
    assert ir.REFERENCE is REFERENCE
    assert ir.VJP_RULES is VJP_RULES
    assert ir.PRIMITIVES is PRIMITIVES


def test_categories_partition_consistently():
    assert primitives.NON_DIFFERENTIABLE <= PRIMITIVES
    assert primitives.LINEAR <= PRIMITIVES
    assert primitives.ELEMENTWISE <= PRIMITIVES
    assert primitives.UNARY_FLOAT <= primitives.UNARY
    # A non-differentiable primitive has no gradient: its VJP row is the no-gradient rule.
    none_rule = VJP_RULES["lt"]
    for name in primitives.NON_DIFFERENTIABLE:
        assert VJP_RULES[name] is none_rule, name


def test_unknown_primitive_is_a_shape_error():
    with pytest.raises(ir.ShapeError):
        ir.infer_types("frobnicate", [], {})


# The integer-indexing rows, checked against hand-computed values ------------------------------

def _types(*arrays):
    return [ir.TensorType(np.shape(a), np.asarray(a).dtype) for a in arrays]


def test_gather_shape_rule_puts_the_index_shape_first():
    x = ir.TensorType((4, 5, 6), np.float32)
    rows, columns = ir.TensorType((2, 1), np.int64), ir.TensorType((3,), np.int64)
    assert ir.infer_types("gather", [x, rows, columns], {"axes": (0, 2)}) == [
        ir.TensorType((2, 3, 5), np.float32)]
    assert ir.infer_types("gather", [x, columns], {"axes": (1,)}) == [
        ir.TensorType((3, 4, 6), np.float32)]
    for inputs, axes in [([x, columns], (0, 1)), ([x, columns, columns], (1, 1)),
                         ([x, columns], (3,)), ([x, ir.TensorType((3,), np.float32)], (0,)),
                         ([x, rows, ir.TensorType((3, 2), np.int64)], (0, 1)), ([x], ())]:
        with pytest.raises(ir.ShapeError):
            ir.infer_types("gather", inputs, {"axes": axes})


def test_scatter_shape_rule_takes_updates_in_the_gathered_shape():
    target, index = ir.TensorType((4, 3), np.float64), ir.TensorType((5,), np.int64)
    updates = ir.TensorType((5, 3), np.float64)
    attributes = {"axes": (0,), "accumulate": True}
    assert ir.infer_types("scatter", [target, updates, index], attributes) == [target]
    for bad in [ir.TensorType((5, 4), np.float64), ir.TensorType((5, 3), np.float32)]:
        with pytest.raises(ir.ShapeError):
            ir.infer_types("scatter", [target, bad, index], attributes)
    flags = ir.TensorType((4, 3), np.bool_)
    with pytest.raises(ir.ShapeError):  # bool cannot accumulate
        ir.infer_types("scatter", [flags, ir.TensorType((5, 3), np.bool_), index], attributes)


def test_gather_reference_wraps_negative_indices_and_refuses_out_of_range():
    x = np.arange(12.0).reshape(3, 4)
    (result,) = evaluate_primitive("gather", [x, np.array([2, -3]), np.array([[0], [-1]])],
                                   {"axes": (0, 1)})
    assert result.tolist() == [[8.0, 0.0], [11.0, 3.0]]
    (columns,) = evaluate_primitive("gather", [x, np.array([3, 3, 0])], {"axes": (1,)})
    assert columns.tolist() == [[3.0, 7.0, 11.0], [3.0, 7.0, 11.0], [0.0, 4.0, 8.0]]
    for bad in (3, -4):
        with pytest.raises(IndexRangeError, match=f"index {bad} is out of bounds for dimension 0"):
            evaluate_primitive("gather", [x, np.array([0, bad])], {"axes": (0,)})


def test_scatter_reference_accumulates_repeats_or_keeps_the_last():
    target = np.zeros(4)
    updates, index = np.array([1.0, 2.0, 4.0, 8.0]), np.array([1, -3, 3, 0])
    (added,) = evaluate_primitive("scatter", [target, updates, index],
                                  {"axes": (0,), "accumulate": True})
    assert added.tolist() == [8.0, 3.0, 0.0, 4.0]
    (written,) = evaluate_primitive("scatter", [target + 5, updates, index],
                                    {"axes": (0,), "accumulate": False})
    assert written.tolist() == [8.0, 2.0, 5.0, 4.0]  # index 1 twice: the last write stays
    assert target.tolist() == [0.0] * 4  # operands are not changed


def test_gather_and_scatter_vjp_rules_by_hand():
    b = ArrayBuilder()
    x, index = np.arange(6.0).reshape(3, 2), np.array([2, 0, 2])
    g = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    z = evaluate_primitive("gather", [x, index], {"axes": (0,)})[0]
    dx, dindex = apply_vjp(b, "gather", {"axes": (0,)}, [x, index], [z], [g], [True, True])
    assert dindex is None and dx.tolist() == [[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]]
    updates = np.ones((3, 2))
    for accumulate, expected_target in [(True, g), (False, [[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])]:
        attributes = {"axes": (0,), "accumulate": accumulate}
        result = evaluate_primitive("scatter", [x, updates, index], attributes)[0]
        d_target, d_updates, _ = apply_vjp(b, "scatter", attributes, [x, updates, index],
                                           [result], [g], [True, True, True])
        assert np.asarray(d_target).tolist() == np.asarray(expected_target).tolist()
        assert d_updates.tolist() == [[5.0, 6.0], [1.0, 2.0], [5.0, 6.0]]


def test_gather_and_scatter_lowering_rows():
    assert LOWERING["gather"].kind == "gather" and LOWERING["scatter"].kind == "scatter"


def test_fusion_cost_and_values_read_have_a_row_per_primitive():
    from tracer.ir.costs import CODE_COST, EXPENSIVE
    from tracer.ir.vjp import VALUES_READ

    assert set(CODE_COST) == PRIMITIVES and set(VALUES_READ) == PRIMITIVES
    assert all(isinstance(cost, int) and cost >= 1 for cost in CODE_COST.values())
    assert {"exp", "log", "tanh", "pow", "reduce_sum"} <= EXPENSIVE and "add" not in EXPENSIVE
    for primitive in PRIMITIVES:  # each row answers for operands of its arity
        arity = ARITY[primitive] or 3
        reads, result = VALUES_READ[primitive]([True] * arity)
        assert len(reads) == arity and isinstance(result, bool), primitive


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_function_a_scalar_lowering_calls_is_defined(dtype):
    # A math function's row in the lowering table calls @tracer.<name>.<suffix> (or an LLVM
    # intrinsic): each must be defined by templates/math.ll.j2 or declared by the module.
    import pathlib
    import re

    from tracer.codegen.lowering import Writer
    from tracer.codegen.template_environment import render
    from tracer.ir.primitives import COMPARE, ELEMENTWISE, LOGICAL

    templates = pathlib.Path(LOWERING["exp"].emit.__code__.co_filename).parent / "templates"
    declared = "".join(path.read_text() for path in templates.glob("*.ll.j2"))
    known = set(re.findall(r"(?:define|declare)[^@]*@([\w.]+)\(", declared + render("math.ll.j2")))
    calls = set()
    for primitive in sorted(ELEMENTWISE - LOGICAL - {"logical_not", "select", "cast"}):
        writer = Writer()
        in_dtypes = [np.dtype(dtype)] * (ARITY[primitive])
        out_dtype = np.dtype(bool) if primitive in COMPARE else np.dtype(dtype)
        LOWERING[primitive].emit(writer, in_dtypes, out_dtype, ["%a", "%b"][:ARITY[primitive]], {})
        for called in re.findall(r"call [^@]*@([\w.]+)\(", "\n".join(writer.lines)):
            assert called in known, f"{primitive} calls @{called}, which no template defines"
            calls.add(called.split(".")[1])
    assert {"exp", "log", "tanh", "sin", "cos", "pow", "sqrt"} <= calls  # the test saw them
