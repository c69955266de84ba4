"""Every primitive has exactly one row in each table (shape rule, reference semantics, VJP rule).

Adding a primitive without filling a table, or leaving a stale row behind, fails here.
"""
import pytest

from tracer import ir
from tracer.ir import primitives
from tracer.ir.primitives import ARITY, DIRECTIVES, PRIMITIVES
from tracer.ir.reference import REFERENCE
from tracer.ir.vjp import VJP_RULES

TABLES = {"SHAPE_RULES": primitives.SHAPE_RULES, "REFERENCE": REFERENCE, "VJP_RULES": VJP_RULES}


def test_primitive_set_is_the_documented_closed_set():
    # The design's closed set: elementwise unary/binary, compare, select, cast, broadcast, reshape,
    # transpose, slice, pad, reduce sum/max/min, matmul, constant/iota (+ gradient markers).
    expected = {
        "neg", "abs", "sign", "exp", "log", "sqrt", "tanh", "sin", "cos", "logical_not",
        "add", "sub", "mul", "div", "pow", "maximum", "minimum",
        "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
        "select", "cast", "broadcast", "reshape", "transpose", "slice", "pad",
        "reduce_sum", "reduce_max", "reduce_min", "matmul", "constant", "iota",
        "stop_gradient", "custom_vjp",
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
